//! Stack output of a saved report: folded stacks (`frame;frame;lock count`,
//! what flame graph tools read) and an SVG flame graph (inferno).
use std::io::Write;

use anyhow::{Context, Result, bail};

use super::format::{frame_label, label};
use crate::model::{LockStack, Report};

/// The folded stacks, a line each (what flame graph tools read).
pub(crate) fn folded(report: &Report) -> Result<String> {
    let mut text = String::new();
    for line in lines_to_show(report)? {
        text.push_str(&line);
        text.push('\n');
    }
    Ok(text)
}

/// Draws the report's stacks as an SVG flame graph.
pub(crate) fn write_svg(report: &Report, out: &mut dyn Write) -> Result<()> {
    let lines = lines_to_show(report)?;
    let mut options = inferno::flamegraph::Options::default();
    options.title = format!(
        "locktrace: lock calls of pid {} ({})",
        report.target.pid, report.target.exe
    );
    options.count_name = "lock calls".into();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
        .context("cannot draw the flame graph")
}

/// The folded lines, refused when there are none.
fn lines_to_show(report: &Report) -> Result<Vec<String>> {
    let lines = folded_lines(report);
    if lines.is_empty() {
        bail!("the report has no stacks or callers to show; record with --stacks N");
    }
    Ok(lines)
}

/// The outermost frame of the folded lines of CPU-sample stacks (their
/// counts are samples of `1 / cpu.sample_hz` s each, not lock calls).
pub(crate) const CPU_SAMPLES_FRAME: &str = "cpu samples";

/// The outermost frame of the folded lines of the inproc stubs' sampled
/// stacks (their counts are samples, one in `inproc.stack_sample_every`
/// acquisitions, not lock calls).
pub(crate) const SAMPLED_CALLS_FRAME: &str = "sampled lock calls";

/// One line per stack, outermost frame first, the lock as the leaf; stacks
/// of CPU samples start with [`CPU_SAMPLES_FRAME`], the stubs' samples
/// with [`SAMPLED_CALLS_FRAME`]. Reports recorded
/// without `--stacks` give one frame per caller instead.
pub(crate) fn folded_lines(report: &Report) -> Vec<String> {
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
            // CPU samples count samples, not calls: their own root frame,
            // so a flame graph shows them as a tree of their own.
            let root = if stack.is_cpu() {
                Some(CPU_SAMPLES_FRAME.to_string())
            } else {
                stack.is_sampled().then(|| SAMPLED_CALLS_FRAME.to_string())
            };
            let mut parts: Vec<String> = root.into_iter().collect();
            parts.push(folded_path(stack));
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

/// A stack's frames folded, outermost first, `;` between them (no lock
/// frame): stacks that differ only in offsets inside a function fold alike.
pub(crate) fn folded_path(stack: &LockStack) -> String {
    let frames: Vec<String> = stack.frames.iter().rev().map(frame_label).collect();
    frames.join(";")
}

/// The top stacks of the first `limit` locks, as text under the table:
/// innermost frame first, like a debugger's backtrace, after the route
/// (`--php`) in brackets.
pub(crate) fn render_text(report: &Report, limit: usize) -> String {
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
            let mut frames: Vec<String> = stack.frames.iter().map(frame_label).collect();
            // Where the unwinder gave up, so a short stack says why.
            frames.extend(stack.ended_by.map(|end| format!("[{}]", end.describe())));
            let what = if stack.is_cpu() {
                "cpu samples: "
            } else if stack.is_sampled() {
                "sampled calls: "
            } else {
                ""
            };
            let route = stack
                .route
                .as_deref()
                .map(|route| format!("[{}] ", super::format::printable(route)))
                .unwrap_or_default();
            out.push_str(&format!(
                "  {:>10}  {what}{route}{}\n",
                stack.count,
                frames.join(" <- ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Frame, Lock, LockKind, StackOrigin, StackSource, WaitClass};

    /// Stacks of CPU samples fold under a root frame of their own, apart
    /// from the lock calls of the same frames; the text marks them.
    #[test]
    fn cpu_sample_stacks_fold_under_their_own_root() {
        let mut report = Report::empty_for_tests("all");
        let mut lock = Lock::empty(0x1000, LockKind::Mutex, WaitClass::Lock);
        lock.name = Some("g_lock".into());
        report.locks.push(lock);
        let stack = |count, source| LockStack {
            lock: 0x1000,
            count,
            frames: vec![Frame::named("pthread_mutex_lock"), Frame::named("take")],
            unwound_by: StackSource::CallFrameInfo,
            source: Some(source),
            route: None,
            ended_by: None,
        };
        report.stacks = vec![
            stack(7, StackOrigin::LockCalls),
            stack(2, StackOrigin::CpuSamples),
        ];
        assert_eq!(
            folded_lines(&report),
            [
                "take;pthread_mutex_lock;lock g_lock 7",
                "cpu samples;take;pthread_mutex_lock;lock g_lock 2"
            ]
        );
        let text = render_text(&report, 1);
        assert!(
            text.contains("         2  cpu samples: pthread_mutex_lock <- take"),
            "{text}"
        );
    }
}
