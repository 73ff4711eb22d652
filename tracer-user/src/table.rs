//! The human-readable report: a prettytable of the locks plus a footer that
//! says how the run ended and what could not be counted.
use std::fmt::Write;

use prettytable::{Table, format, row};

use crate::report::Report;

/// Renders the report as text (table and footer).
pub fn render(report: &Report, limit: Option<usize>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "locktrace: pid {} ({}), {:.2} s, mode {}{}",
        report.target.pid,
        report.target.exe,
        report.duration_s,
        report.mode,
        report.placement.as_deref().map(|p| format!(", placement {p}")).unwrap_or_default()
    );
    let mut table = Table::new();
    table.set_format(*format::consts::FORMAT_NO_BORDER_LINE_SEPARATOR);
    table.set_titles(row!["address", "kind", r->"acquisitions", r->"contended", r->"wakes", r->"wait total", r->"wait max"]);
    let shown = limit.unwrap_or(usize::MAX);
    for lock in report.locks.iter().take(shown) {
        table.add_row(row![
            lock.address,
            lock.kind,
            r->lock.acquisitions.map_or("-".to_string(), |n| match lock.acquisitions_error {
                Some(error) => format!("~{n} ±{error}"),
                None => n.to_string(),
            }),
            r->lock.contended,
            r->lock.wakes,
            r->duration(lock.wait_ns),
            r->duration(lock.max_wait_ns),
        ]);
    }
    out.push_str(&table.to_string());
    if report.locks.len() > shown {
        let _ = writeln!(out, "({} more locks not shown)", report.locks.len() - shown);
    }
    let totals = &report.totals;
    let _ = writeln!(
        out,
        "{} locks; total: {} acquisitions, {} contended waits, {} wakes, {} waiting",
        report.locks.len(),
        totals.acquisitions.map_or("-".to_string(), |n| if report.estimate.is_some() { format!("~{n}") } else { n.to_string() }),
        totals.contended,
        totals.wakes,
        duration(totals.wait_ns)
    );
    match report.stopped_by.as_str() {
        "target_exited" => out.push_str("stopped: the target exited; counts cover its whole traced life\n"),
        "interrupted" => out.push_str("stopped: interrupted (Ctrl-C)\n"),
        _ => {}
    }
    if report.dropped.is_empty() {
        out.push_str("lost: nothing\n");
    } else {
        let lost: Vec<String> = report.dropped.iter().map(|(what, n)| format!("{what}={n}")).collect();
        let _ = writeln!(out, "lost: {} (those events are missing from the counts)", lost.join(", "));
    }
    out.push_str(&crate::overhead::footer(report));
    out
}

pub fn duration(ns: u64) -> String {
    match ns {
        0 => "0".into(),
        n if n < 10_000 => format!("{n} ns"),
        n if n < 10_000_000 => format!("{:.1} µs", n as f64 / 1e3),
        n if n < 10_000_000_000 => format!("{:.1} ms", n as f64 / 1e6),
        n => format!("{:.2} s", n as f64 / 1e9),
    }
}
