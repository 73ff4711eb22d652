//! `--mode inproc` lines: what counted each lock function, what was not
//! covered, and whether the GOT entries were put back.
use std::fmt::Write;

use crate::model::{CountedBy, Inproc, Report, RestoreOutcome};

pub(crate) fn render(report: &Report) -> String {
    let mut out = String::new();
    let Some(inproc) = &report.inproc else {
        return out;
    };
    function_lines(report, inproc, &mut out);
    sample_line(inproc, &mut out);
    notes(report, inproc, &mut out);
    let _ = writeln!(out, "inproc: {}", restore_line(inproc));
    out
}

/// A line per function the stubs count (and per uprobed function that
/// was called), one for those not counted at all.
fn function_lines(report: &Report, inproc: &Inproc, out: &mut String) {
    let module_name = |path: &str| path.rsplit('/').next().unwrap_or(path).to_string();
    let mut not_counted = Vec::new();
    for function in &inproc.functions {
        match function.counted_by {
            CountedBy::GotStubs => {
                let modules: Vec<String> = function
                    .modules
                    .iter()
                    .map(|m| {
                        let binding = if m.bind_now { ", -z now" } else { "" };
                        format!("{} ({}{binding})", module_name(&m.module), m.entries)
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "inproc: {} counted by stubs behind the GOT entries of {}; not counted: {}",
                    function.function,
                    modules.join(", "),
                    function.not_covered.join("; ")
                );
            }
            CountedBy::Uprobe => {
                let called = report
                    .locks
                    .iter()
                    .any(|l| l.calls.contains_key(&function.function));
                if called {
                    let _ = writeln!(
                        out,
                        "inproc: {} counted by uprobes (no GOT entry leads to it)",
                        function.function
                    );
                }
            }
            CountedBy::NotCounted => not_counted.push(function.function.as_str()),
        }
    }
    if !not_counted.is_empty() {
        let _ = writeln!(
            out,
            "inproc: not counted: calls of {} from inside libc (no module calls them through a GOT, and a uprobe would count again the calls the stubs count)",
            not_counted.join(", ")
        );
    }
}

/// `--stacks`: the bound of the stubs' sampled stacks, or why there are none.
fn sample_line(inproc: &Inproc, out: &mut String) {
    if let Some(every) = inproc.stack_sample_every {
        let _ = writeln!(
            out,
            "inproc: stacks sampled: one acquisition in {every} per lock, call site and CPU; their counts are samples (the lock counts are exact)"
        );
    }
    if let Some(off) = &inproc.stack_samples_off {
        let _ = writeln!(
            out,
            "inproc: no stack samples: {off} (counts are exact; --mode all records stacks)"
        );
    }
}

/// Forked children, table overflow, and entries restored at the start.
fn notes(report: &Report, inproc: &Inproc, out: &mut String) {
    let forked = report
        .coverage
        .as_ref()
        .and_then(|c| c.children_forked)
        .unwrap_or(0);
    if forked > 0 {
        let _ = writeln!(
            out,
            "inproc: {forked} children forked while recording inherited the stubs: their lock calls made before they exec are counted in with this process's, and their GOT entries stay switched (they work on; `locktrace restore --pid CHILD` switches them back)"
        );
    }
    if inproc.restored_at_start > 0 {
        let _ = writeln!(
            out,
            "inproc: {} GOT entries an earlier, killed locktrace left switched were restored first",
            inproc.restored_at_start
        );
    }
}

/// How the entries were put back, and where the stubs stay.
fn restore_line(inproc: &Inproc) -> String {
    let restore = &inproc.restore;
    let restore = match restore.outcome {
        RestoreOutcome::Restored => format!("all {} GOT entries restored", restore.entries),
        RestoreOutcome::TargetExited => "the target exited; nothing to restore".to_string(),
        RestoreOutcome::Overwritten => format!(
            "{} GOT entries restored; {} had been overwritten by the lazy binder (their later calls went uncounted)",
            restore.entries, restore.overwritten
        ),
        RestoreOutcome::Failed => format!(
            "GOT entries NOT restored: {}",
            restore.reason.as_deref().unwrap_or("unknown")
        ),
        RestoreOutcome::NothingSwitched => "nothing was switched".to_string(),
        RestoreOutcome::ProgramReplaced => {
            "the process ran another program (exec): the switched entries went with the old one; nothing to restore".to_string()
        }
    };
    let restore = if inproc.restore.unloaded > 0 {
        format!(
            "{restore}; {} entries' library was unloaded (dlclose) meanwhile: nothing to restore there",
            inproc.restore.unloaded
        )
    } else {
        restore
    };
    let mapping = inproc
        .mapping
        .as_deref()
        .map(|at| format!("; the stubs stay mapped at {at}"))
        .unwrap_or_default();
    let tables = if inproc.per_cpu_tables {
        "counted per CPU (rdpid)"
    } else {
        "counted in one shared table (no rdpid on this CPU)"
    };
    format!("{tables}; {restore}{mapping}")
}
