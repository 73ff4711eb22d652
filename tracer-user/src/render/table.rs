//! The human-readable report: a prettytable of the locks plus a footer that
//! says how the run ended and what could not be counted.
use std::fmt::Write;

use prettytable::{Cell, Row, Table, format, row};

use super::{
    cpu, footer,
    format::{MAX_TABLE_WIDTH, duration, truncate, width},
    holds, in_progress, lost, requests, stacks, waits,
};
use crate::model::{Lock, Mode, Report, StopReason};

/// Widest and narrowest the name and callers columns get while fitting the
/// table into [`MAX_TABLE_WIDTH`]; full names stay in the JSON.
const NAME_WIDTH: (usize, usize) = (48, 20);
const CALLERS_WIDTH: (usize, usize) = (60, 16);
/// The top holder (`slow_path (12/40 waits)`, `thread 4711 (php-fpm)`).
const HOLDER_WIDTH: usize = 32;

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
            .map(|p| format!(", placement {p}"))
            .unwrap_or_default()
    );
    if let Some(requests) = &report.requests {
        // Requests from a probe are counted in the sampling windows and scaled.
        let estimated =
            report.estimate.is_some() && requests.source == crate::model::RequestSource::Probe;
        out.push_str(&requests::describe(requests, estimated));
    }
    out.push_str(&cpu::summary(report));
    let shown = limit.unwrap_or(usize::MAX);
    let contention = report
        .locks
        .iter()
        .filter(|lock| lock.is_contention())
        .count();
    out.push_str(&fitted_table(report, shown));
    if contention > shown {
        let _ = writeln!(out, "({} more locks not shown)", contention - shown);
    }
    out.push_str(&stacks::render_text(report, shown));
    out.push_str(&footer::naming(report));
    let totals = &report.totals;
    let _ = writeln!(
        out,
        "{} locks; total: {} acquisitions, {} contended waits, {} wakes, {} waiting",
        contention,
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
    if report.mode == Mode::Contention && report.locks.iter().any(|lock| !lock.holders.is_empty()) {
        out.push_str("holders: contention mode has no lock probes; the holder is the owner thread read from glibc's mutex (its name from /proc), no function (record --hold-times for functions)\n");
    }
    if let Some(per) = &totals.per_request {
        let cells = requests::cells(Some(per));
        let _ = writeln!(
            out,
            "per request: {} acquisitions, {} contended waits, {} waiting",
            cells[0], cells[1], cells[2]
        );
        if let Some(held) = per.hold_ns {
            let _ = writeln!(out, "per request: {} held", duration(held.round() as u64));
        }
    }
    out.push_str(&waits::render(report, limit));
    out.push_str(&in_progress::render(report));
    match report.stopped_by {
        StopReason::TargetExited if lost::counts_whole(report) => {
            out.push_str("stopped: the target exited; counts cover its whole traced life\n")
        }
        StopReason::TargetExited => out.push_str("stopped: the target exited\n"),
        StopReason::Interrupted => out.push_str("stopped: interrupted (a stop signal)\n"),
        StopReason::Duration | StopReason::LoadDone => {}
    }
    out.push_str(&lost::render(report));
    out.push_str(&footer::cost(report));
    // The header and footers quote the target's exe and names too.
    super::format::printable(&out).into_owned()
}

/// The lock table, its name and callers columns cut to fit [`MAX_TABLE_WIDTH`].
fn fitted_table(report: &Report, shown: usize) -> String {
    let (mut name_width, mut callers_width) = (NAME_WIDTH.0, CALLERS_WIDTH.0);
    loop {
        let table = lock_table(report, shown, name_width, callers_width);
        let over = width(&table).saturating_sub(MAX_TABLE_WIDTH);
        if over == 0 || (name_width, callers_width) == (NAME_WIDTH.1, CALLERS_WIDTH.1) {
            return table;
        }
        // Callers give way first: the name is what the row is about.
        let from_callers = over.min(callers_width - CALLERS_WIDTH.1);
        callers_width -= from_callers;
        name_width = name_width
            .saturating_sub(over - from_callers)
            .max(NAME_WIDTH.1);
    }
}

fn lock_table(report: &Report, shown: usize, name_width: usize, callers_width: usize) -> String {
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
    let cpu_title = cpu::column_title(report);
    if let Some(title) = cpu_title {
        titles.add_cell(Cell::new(title).style_spec("r"));
    }
    titles.add_cell(Cell::new("wait p50/p99").style_spec("r"));
    if any_holds {
        titles.add_cell(Cell::new("held total/max").style_spec("r"));
    }
    if any_holders {
        titles.add_cell(Cell::new("top holder"));
    }
    titles.add_cell(Cell::new("callers"));
    table.set_titles(titles);
    let mut rows: Vec<&Lock> = report
        .locks
        .iter()
        .filter(|lock| lock.is_contention())
        .collect();
    // The lock's cost first, when CPU was sampled (stable: ties keep the report's order).
    if cpu::sorts_by_cpu(report) {
        rows.sort_by_key(|lock| std::cmp::Reverse(lock.cpu_ns.unwrap_or(0)));
    }
    for lock in rows.into_iter().take(shown) {
        let mut row: Row = row![
            format!("{:#x}", lock.address),
            truncate(lock.name.as_deref().unwrap_or(&lock.region), name_width),
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
            for cell in requests::cells(lock.per_request.as_ref()) {
                row.add_cell(Cell::new(&cell).style_spec("r"));
            }
        }
        if cpu_title.is_some() {
            row.add_cell(Cell::new(&cpu::cell(lock)).style_spec("r"));
        }
        row.add_cell(Cell::new(&holds::wait_percentiles(lock)).style_spec("r"));
        if any_holds {
            row.add_cell(Cell::new(&holds::hold_cell(lock)).style_spec("r"));
        }
        if any_holders {
            row.add_cell(Cell::new(&truncate(&holds::top_holder(lock), HOLDER_WIDTH)));
        }
        row.add_cell(Cell::new(&truncate(&top_callers(lock), callers_width)));
        table.add_row(row);
    }
    table.to_string()
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

#[cfg(test)]
mod tests {
    use crate::model::Report;

    /// A symbol with an escape sequence (set the terminal title) and a C1
    /// control character reaches no table cell raw.
    #[test]
    fn names_from_the_target_are_escaped() {
        let hostile = "g\u{1b}]0;pwned\u{7}\u{9b}2J";
        let report: Report = serde_json::from_value(serde_json::json!({
            "schema": crate::model::SCHEMA,
            "target": {"pid": 1, "exe": format!("/bin/{hostile}"), "cmdline": [hostile]},
            "duration_s": 1.0, "mode": "all", "stopped_by": "duration",
            "locks": [{
                "address": "0x1000", "kind": "mutex", "acquisitions": 3,
                "contended": 0, "wakes": 0, "wait_ns": 0, "max_wait_ns": 0,
                "name": hostile,
                "callers": [{"function": hostile, "module": "m", "offset": 0, "count": 3}],
            }],
            "dropped": {},
            "totals": {"acquisitions": 3, "contended": 0, "wakes": 0, "wait_ns": 0},
        }))
        .unwrap();
        let text = super::render(&report, None);
        let raw = text
            .chars()
            .filter(|c| c.is_control() && *c != '\n')
            .count();
        assert_eq!(raw, 0, "{text:?}");
        assert!(text.contains("g\\x1b]0;pwned\\x07\\u{9b}2J"), "{text}");
    }

    #[test]
    fn a_sampled_run_without_a_window_says_so() {
        let report = crate::analysis::estimate::tests::sampled_report(0, 0.0, 0, 0);
        let text = super::render(&report, None);
        assert!(!text.contains("~0"), "{text}");
        assert!(
            text.contains("sampled: no sampling window opened in the 10.00 s recorded: acquisitions not estimated (-)"),
            "{text}"
        );
    }

    #[test]
    fn every_estimated_number_is_marked() {
        let report = crate::analysis::estimate::tests::sampled_report(10, 1.0, 4_100_000, 10_000);
        let error = report.locks[0]
            .per_request
            .as_ref()
            .unwrap()
            .acquisitions_error
            .unwrap();
        let text = super::render(&report, None);
        assert!(
            text.contains("requests: ~10000 (scaled from the sampling windows)"),
            "{text}"
        );
        assert!(
            text.contains(&format!("~410.0 ±{}", crate::render::format::ratio(error))),
            "{text}"
        );
        assert!(text.contains("~4100000 ±"), "{text}");
        assert!(text.contains("total: ~4100000 acquisitions"), "{text}");
        assert!(text.contains("per request: ~410.0 ±"), "{text}");
        assert!(text.contains("per request within ±"), "{text}");
    }
}
