//! `--mode inproc` lines: what counted each lock function, what was not
//! covered, and whether the GOT entries were put back.
use std::fmt::Write;

use crate::model::{CountedBy, Report, Restore};

pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let Some(inproc) = &report.inproc else {
        return out;
    };
    for function in &inproc.functions {
        match function.counted_by {
            CountedBy::GotStubs => {
                let modules: Vec<String> = function
                    .modules
                    .iter()
                    .map(|m| {
                        let name = m.module.rsplit('/').next().unwrap_or(&m.module);
                        let binding = if m.bind_now { ", -z now" } else { "" };
                        format!("{name} ({} entries{binding})", m.entries)
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "inproc: {} counted by stubs behind the GOT entries of {}",
                    function.function,
                    modules.join(", ")
                );
            }
            CountedBy::Uprobe
                if report
                    .locks
                    .iter()
                    .any(|l| l.calls.contains_key(&function.function)) =>
            {
                let _ = writeln!(
                    out,
                    "inproc: {} counted by uprobes (no GOT entry leads to it)",
                    function.function
                );
            }
            CountedBy::Uprobe | CountedBy::NotCounted => {}
        }
        if function.counted_by != CountedBy::Uprobe {
            for line in &function.not_covered {
                let _ = writeln!(out, "inproc: not counted for {}: {line}", function.function);
            }
        }
    }
    if inproc.table_overflow > 0 {
        let _ = writeln!(
            out,
            "lost: {} lock calls (the stubs' tables were full)",
            inproc.table_overflow
        );
    }
    if inproc.restored_at_start > 0 {
        let _ = writeln!(
            out,
            "inproc: {} GOT entries an earlier, killed locktrace left switched were restored first",
            inproc.restored_at_start
        );
    }
    let restore = match &inproc.restore {
        Restore::Restored { entries } => format!("all {entries} GOT entries restored"),
        Restore::TargetExited => "the target exited; nothing to restore".to_string(),
        Restore::Overwritten {
            restored,
            overwritten,
        } => format!(
            "{restored} GOT entries restored; {overwritten} had been overwritten by the lazy binder (their later calls went uncounted)"
        ),
        Restore::Failed { reason } => format!("GOT entries NOT restored: {reason}"),
        Restore::NothingSwitched => "nothing was switched".to_string(),
    };
    let mapping = inproc
        .mapping
        .as_deref()
        .map(|at| format!("; the stubs stay mapped at {at}"))
        .unwrap_or_default();
    let _ = writeln!(out, "inproc: {restore}{mapping}");
    out
}
