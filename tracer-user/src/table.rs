//! The human-readable report: a prettytable of the locks plus a footer that
//! says how the run ended and what could not be counted.
use std::fmt::Write;

use prettytable::{Cell, Row, Table, format, row};

use crate::report::{Lock, Report};

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
        report
            .placement
            .as_deref()
            .map(|p| format!(", placement {p}"))
            .unwrap_or_default()
    );
    if let Some(requests) = &report.requests {
        out.push_str(&crate::requests::describe(requests));
    }
    let per_request = report.totals.per_request.is_some();
    let mut table = Table::new();
    table.set_format(*format::consts::FORMAT_NO_BORDER_LINE_SEPARATOR);
    let mut titles = row!["address", "name", "kind", r->"acquisitions", r->"contended", r->"wakes", r->"wait total", r->"wait max"];
    if per_request {
        for title in ["acq/req", "contended/req", "wait/req"] {
            titles.add_cell(Cell::new(title).style_spec("r"));
        }
    }
    // Wait distribution always; hold time and holders where recorded.
    let any_holds = report.locks.iter().any(|lock| lock.holds.is_some());
    let any_holders = report.locks.iter().any(|lock| !lock.holders.is_empty());
    titles.add_cell(Cell::new("wait p50/p99").style_spec("r"));
    if any_holds {
        titles.add_cell(Cell::new("held total/max").style_spec("r"));
    }
    if any_holders {
        titles.add_cell(Cell::new("top holder"));
    }
    titles.add_cell(Cell::new("callers"));
    table.set_titles(titles);
    let shown = limit.unwrap_or(usize::MAX);
    for lock in report.locks.iter().take(shown) {
        let mut row: Row = row![
            lock.address,
            crate::stacks::label(lock).trim_end_matches(lock.address.as_str()).trim_end(),
            lock.kind,
            r->lock.acquisitions.map_or("-".to_string(), |n| match lock.acquisitions_error {
                Some(error) => format!("~{n} ±{error}"),
                None => n.to_string(),
            }),
            r->lock.contended,
            r->lock.wakes,
            r->duration(lock.wait_ns),
            r->duration(lock.max_wait_ns),
        ];
        if per_request {
            for cell in crate::requests::cells(lock.per_request.as_ref()) {
                row.add_cell(Cell::new(&cell).style_spec("r"));
            }
        }
        row.add_cell(Cell::new(&crate::holds::wait_percentiles(lock)).style_spec("r"));
        if any_holds {
            row.add_cell(Cell::new(&crate::holds::hold_cell(lock)).style_spec("r"));
        }
        if any_holders {
            row.add_cell(Cell::new(&crate::holds::top_holder(lock)));
        }
        row.add_cell(Cell::new(&top_callers(lock)));
        table.add_row(row);
    }
    out.push_str(&table.to_string());
    if report.locks.len() > shown {
        let _ = writeln!(out, "({} more locks not shown)", report.locks.len() - shown);
    }
    out.push_str(&crate::stacks::render_text(report, shown));
    out.push_str(&crate::symbolize::footer(report));
    let totals = &report.totals;
    let _ = writeln!(
        out,
        "{} locks; total: {} acquisitions, {} contended waits, {} wakes, {} waiting",
        report.locks.len(),
        totals
            .acquisitions
            .map_or("-".to_string(), |n| if report.estimate.is_some() {
                format!("~{n}")
            } else {
                n.to_string()
            }),
        totals.contended,
        totals.wakes,
        duration(totals.wait_ns)
    );
    if let Some(hold_ns) = totals.hold_ns {
        let _ = writeln!(out, "held: {} in total (--hold-times)", duration(hold_ns));
    }
    if report.mode == "contention" && any_holders {
        out.push_str("holders: contention mode has no lock probes; the holder is the owner thread read from glibc's mutex (its name from /proc), no function (record --hold-times for functions)\n");
    }
    if let Some(per) = &totals.per_request {
        let cells = crate::requests::cells(Some(per));
        let _ = writeln!(
            out,
            "per request: {} acquisitions, {} contended waits, {} waiting",
            cells[0], cells[1], cells[2]
        );
        if let Some(held) = per.hold_ns {
            let _ = writeln!(out, "per request: {} held", duration(held.round() as u64));
        }
    }
    match report.stopped_by.as_str() {
        "target_exited" => {
            out.push_str("stopped: the target exited; counts cover its whole traced life\n")
        }
        "interrupted" => out.push_str("stopped: interrupted (Ctrl-C)\n"),
        _ => {}
    }
    if report.dropped.is_empty() {
        out.push_str("lost: nothing\n");
    } else {
        let lost: Vec<String> = report
            .dropped
            .iter()
            .map(|(what, n)| format!("{what}={n}"))
            .collect();
        let _ = writeln!(
            out,
            "lost: {} (those events are missing from the counts)",
            lost.join(", ")
        );
    }
    out.push_str(&crate::overhead::footer(report));
    out
}

/// The two most frequent calling functions, for the table.
fn top_callers(lock: &Lock) -> String {
    let mut names: Vec<String> = lock
        .callers
        .iter()
        .take(2)
        .map(|caller| {
            caller.function.clone().unwrap_or_else(|| {
                format!(
                    "{}+{:#x}",
                    caller.module.as_deref().unwrap_or("?"),
                    caller.offset
                )
            })
        })
        .collect();
    if lock.callers.len() > 2 {
        names.push("…".into());
    }
    names.join(", ")
}

pub fn duration(ns: u64) -> String {
    match ns {
        0 => "0".into(),
        n if n < 1_000 => format!("{n} ns"),
        n if n < 1_000_000 => format!("{:.1} µs", n as f64 / 1e3),
        n if n < 1_000_000_000 => format!("{:.1} ms", n as f64 / 1e6),
        n => format!("{:.2} s", n as f64 / 1e9),
    }
}
