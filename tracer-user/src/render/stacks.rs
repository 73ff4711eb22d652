//! Stack output of a saved report: folded stacks (`frame;frame;lock count`,
//! what flame graph tools read) and an SVG flame graph (inferno).
use std::io::Write;

use anyhow::{Context, Result, bail};

use super::format::{frame_label, label};
use crate::model::Report;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Folded,
    Svg,
    /// Gzipped pprof protobuf (`go tool pprof`, Pyroscope, Parca).
    Pprof,
}

/// Writes the report's stacks in `format` (folded or svg).
pub fn write(report: &Report, format: Format, out: &mut dyn Write) -> Result<()> {
    if format == Format::Pprof {
        return super::pprof::write(report, out);
    }
    let lines = folded_lines(report);
    if lines.is_empty() {
        bail!("the report has no stacks or callers to show; record with --stacks N");
    }
    match format {
        Format::Folded | Format::Table | Format::Pprof => {
            for line in &lines {
                writeln!(out, "{line}")?;
            }
        }
        Format::Svg => {
            let mut options = inferno::flamegraph::Options::default();
            options.title = format!(
                "locktrace: lock calls of pid {} ({})",
                report.target.pid, report.target.exe
            );
            options.count_name = "lock calls".into();
            inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
                .context("cannot draw the flame graph")?;
        }
    }
    Ok(())
}

/// One line per stack, outermost frame first, the lock as the leaf. Reports
/// recorded without `--stacks` give one frame per caller instead.
pub fn folded_lines(report: &Report) -> Vec<String> {
    let lock_label = |address: u64| {
        let lock = report.locks.iter().find(|lock| lock.address == address);
        format!(
            "lock {}",
            lock.map_or_else(|| format!("{address:#x}"), label)
        )
    };
    let mut lines = Vec::new();
    if !report.stacks.is_empty() {
        // Stacks that differ only in offsets inside a function read the
        // same folded: one line, counts summed, in the report's order.
        let mut merged: Vec<(String, u64)> = Vec::new();
        let mut at: std::collections::HashMap<String, usize> = Default::default();
        for stack in &report.stacks {
            let mut parts: Vec<String> = stack.frames.iter().rev().map(frame_label).collect();
            parts.push(lock_label(stack.lock));
            let key = parts.join(";");
            match at.get(&key) {
                Some(&index) => merged[index].1 += stack.count,
                None => {
                    at.insert(key.clone(), merged.len());
                    merged.push((key, stack.count));
                }
            }
        }
        lines.extend(
            merged
                .into_iter()
                .map(|(key, count)| format!("{key} {count}")),
        );
    } else {
        for lock in &report.locks {
            for caller in &lock.callers {
                lines.push(format!(
                    "{};lock {} {}",
                    frame_label(&caller.frame()),
                    label(lock),
                    caller.count
                ));
            }
        }
    }
    lines
}

/// The top stacks of the first `limit` locks, as text under the table:
/// innermost frame first, like a debugger's backtrace.
pub fn render_text(report: &Report, limit: usize) -> String {
    let mut out = String::new();
    for lock in report.locks.iter().take(limit) {
        let stacks: Vec<_> = report
            .stacks
            .iter()
            .filter(|stack| stack.lock == lock.address)
            .collect();
        if stacks.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "stacks of {} ({:#x}):\n",
            label(lock),
            lock.address
        ));
        for stack in stacks {
            let frames: Vec<String> = stack.frames.iter().map(frame_label).collect();
            out.push_str(&format!("  {:>10}  {}\n", stack.count, frames.join(" <- ")));
        }
    }
    out
}
