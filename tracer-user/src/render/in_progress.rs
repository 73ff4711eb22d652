//! The "in progress when the recording stopped" section: lock waits and
//! holds not over yet, one line for the waits that are not contention, and
//! a `deadlock:` line per cycle.
use std::fmt::Write;

use super::{
    fit::{Column, Width, fit},
    format::duration,
};
use crate::model::{Activity, Deadlock, InProgress, Report, ThreadRef, WaitClass};

/// `name (tid)`, or the tid alone.
pub(crate) fn thread(tid: u32, name: Option<&str>) -> String {
    match name {
        Some(name) => format!("{name} ({tid})"),
        None => tid.to_string(),
    }
}

/// The lock's name, else its address.
fn lock_label(name: Option<&str>, address: u64) -> String {
    name.map_or_else(|| format!("{address:#x}"), str::to_string)
}

/// One line per deadlock: who waits for what, held by whom.
pub(crate) fn deadlock_lines(deadlocks: &[Deadlock]) -> Vec<String> {
    deadlocks
        .iter()
        .map(|deadlock| {
            let steps: Vec<String> = deadlock
                .cycle
                .iter()
                .map(|step| {
                    let holder = deadlock
                        .cycle
                        .iter()
                        .find(|other| other.tid == step.held_by);
                    format!(
                        "{} waits for {} held by {}",
                        thread(step.tid, step.thread.as_deref()),
                        lock_label(step.name.as_deref(), step.lock),
                        thread(step.held_by, holder.and_then(|h| h.thread.as_deref()))
                    )
                })
                .collect();
            format!(
                "deadlock: {} threads can never go on: {}",
                steps.len(),
                steps.join("; ")
            )
        })
        .collect()
}

/// `thread waits for LOCK for 3.2 s, held by thread`.
pub(crate) fn wait_line(entry: &InProgress) -> String {
    let holder = entry.holder.as_ref().map_or_else(String::new, |holder| {
        format!(", held by {}", thread(holder.tid, holder.thread.as_deref()))
    });
    format!(
        "{} waits for {} for {}{holder}",
        thread(entry.tid, entry.thread.as_deref()),
        lock_label(entry.name.as_deref(), entry.lock),
        so_far(entry)
    )
}

/// How long so far, `≥` for a wait older than the probes.
pub(crate) fn so_far(entry: &InProgress) -> String {
    let at_least = if entry.since_before_attach {
        "≥ "
    } else {
        ""
    };
    format!("{at_least}{}", duration(entry.elapsed_ns))
}

/// The section, its table fitted to `width` like every table.
pub(crate) fn render(report: &Report, width: Width) -> String {
    let mut out = String::new();
    let (shown, others): (Vec<&InProgress>, Vec<&InProgress>) =
        report.in_progress.iter().partition(|entry| {
            entry.activity == Activity::Hold || entry.wait_class == Some(WaitClass::Lock)
        });
    if !shown.is_empty() {
        let _ = writeln!(out, "\nin progress when the recording stopped:");
        // The lock first and cut last, as in the lock table.
        let columns = [
            Column::name("lock"),
            Column::label("thread", 90),
            Column::label("doing", 80),
            Column::number("so far", 95),
            Column::text("held by", 50, 12),
        ];
        let rows: Vec<Vec<String>> = shown
            .iter()
            .map(|entry| {
                let doing = match (entry.activity, entry.since_before_attach) {
                    (Activity::Hold, _) => "holds",
                    (Activity::Wait, true) => "waits (since before attach)",
                    (Activity::Wait, false) => "waits",
                };
                let holder = entry.holder.as_ref().map_or_else(
                    || "-".to_string(),
                    |ThreadRef { tid, thread: name }| thread(*tid, name.as_deref()),
                );
                vec![
                    lock_label(entry.name.as_deref(), entry.lock),
                    thread(entry.tid, entry.thread.as_deref()),
                    doing.to_string(),
                    so_far(entry),
                    holder,
                ]
            })
            .collect();
        let table = fit(&columns, &rows, width);
        out.push_str(&table.text);
        out.push_str(&table.note(width).unwrap_or_default());
    }
    if !others.is_empty() {
        let mut classes: Vec<String> = Vec::new();
        for class in [WaitClass::Condvar, WaitClass::GoRuntime, WaitClass::Other] {
            let n = others
                .iter()
                .filter(|entry| entry.wait_class == Some(class))
                .count();
            if n > 0 {
                classes.push(format!("{class} {n}"));
            }
        }
        let _ = writeln!(
            out,
            "also waiting when the recording stopped (not lock contention): {} threads ({})",
            others.len(),
            classes.join(", ")
        );
    }
    for line in deadlock_lines(&report.deadlocks) {
        let _ = writeln!(out, "{line}");
    }
    out
}
