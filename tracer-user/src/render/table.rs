//! The human-readable report: a table of the locks fitted to a width plus a footer that
//! says how the run ended and what could not be counted.
use std::fmt::Write;

use super::{
    cpu,
    fit::{Column, Fitted, Width, fit},
    footer,
    format::duration,
    handoffs, holds, in_progress, kernel_locks, lost, removal, requests, routes, saturation,
    stacks, waits,
};
use crate::model::{Lock, Mode, Report, StopReason};

/// Narrowest the callers and top holder (`slow_path (12/40 waits)`,
/// `thread 4711 (php-fpm)`) get before they are dropped; full text stays in the JSON.
const CALLERS_MIN_WIDTH: usize = 16;
const HOLDER_MIN_WIDTH: usize = 16;

/// Renders the report as text (table and footer).
pub fn render(report: &Report, limit: Option<usize>, width: Width) -> String {
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
        // Requests from a probe are counted in the sampling windows and
        // scaled, unless the counts were scaled by the probe's own count.
        let estimated = report
            .estimate
            .as_ref()
            .is_some_and(|estimate| estimate.scaled_by == crate::model::ScaleBasis::Time)
            && requests.source == crate::model::RequestSource::Probe;
        out.push_str(&requests::describe(requests, estimated));
    }
    out.push_str(&cpu::summary(report));
    let shown = limit.unwrap_or(usize::MAX);
    let contention = report
        .locks
        .iter()
        .filter(|lock| lock.is_contention())
        .count();
    let table = lock_table(report, shown, width);
    out.push_str(&table.text);
    out.push_str(&table.note(width).unwrap_or_default());
    if contention > shown {
        let _ = writeln!(out, "({} more locks not shown)", contention - shown);
    }
    out.push_str(&stacks::render_text(report, shown));
    out.push_str(&footer::grouped_by_site(report));
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
    out.push_str(&saturation::render(report));
    out.push_str(&removal::render(report));
    out.push_str(&handoffs::footer(report));
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
    out.push_str(&routes::render(report, width));
    out.push_str(&waits::render(report, limit, width));
    out.push_str(&in_progress::render(report, width));
    out.push_str(&kernel_locks::render(report));
    out.push_str(&stopped_line(report));
    out.push_str(&lost::render(report));
    out.push_str(&super::inproc::render(report));
    for limit in &report.kernel_limits {
        let _ = writeln!(out, "kernel: {limit}");
    }
    out.push_str(&footer::cost(report));
    // The header and footers quote the target's exe and names too.
    let out = super::format::printable(&out);
    // Every line fits the width the tables use: footers wrap, indented.
    super::fit::wrap_lines(&out, width)
}

/// Why the recording stopped, when it stopped early: a target that ended
/// with how it ended (`killed by SIGSEGV`, `exit status 2`) when known.
fn stopped_line(report: &Report) -> String {
    let how = report
        .coverage
        .as_ref()
        .and_then(|coverage| coverage.target_exit.as_ref())
        .map(|exit| format!(" ({exit})"))
        .unwrap_or_default();
    match report.stopped_by {
        StopReason::TargetExited if lost::counts_whole(report) => {
            format!("stopped: the target exited{how}; counts cover its whole traced life\n")
        }
        StopReason::TargetExited => format!("stopped: the target exited{how}\n"),
        StopReason::Interrupted => "stopped: interrupted (a stop signal)\n".to_string(),
        StopReason::Duration | StopReason::LoadDone => String::new(),
    }
}

/// A column of the lock table and how each lock fills it.
type LockColumn = (Column, Box<dyn Fn(&Lock) -> String>);

/// The lock table's columns, the name first; a column's rank says how long
/// it stays when the table must fit (see [`fit`]).
fn lock_columns(report: &Report) -> Vec<LockColumn> {
    let mut columns: Vec<LockColumn> = vec![
        (
            Column::name("name"),
            Box::new(|lock| {
                let name = lock.name.clone().unwrap_or_else(|| lock.region.to_string());
                name + super::format::lifetime_note(lock)
            }),
        ),
        (
            Column::label("kind", 80),
            Box::new(|lock| lock.kind.to_string()),
        ),
        (
            Column::number("acquisitions", 100),
            Box::new(|lock| {
                lock.acquisitions
                    .map_or("-".to_string(), |n| match lock.acquisitions_error {
                        Some(error) => format!("~{n} ±{error}"),
                        None => n.to_string(),
                    })
            }),
        ),
        (
            Column::number("contended", 90),
            Box::new(|lock| lock.contended.to_string()),
        ),
        (
            Column::number("wakes", 30),
            Box::new(|lock| lock.wakes.to_string()),
        ),
        (
            Column::number("wait total", 70),
            Box::new(|lock| duration(lock.wait_ns)),
        ),
        (
            Column::number("wait max", 40),
            Box::new(|lock| duration(lock.max_wait_ns)),
        ),
    ];
    if report.totals.per_request.is_some() {
        for (at, (title, rank)) in [("acq/req", 95), ("contended/req", 85), ("wait/req", 65)]
            .into_iter()
            .enumerate()
        {
            columns.push((
                Column::number(title, rank),
                Box::new(move |lock| requests::cells(lock.per_request.as_ref())[at].clone()),
            ));
        }
    }
    // Wait distribution always; hold time and holders where recorded.
    // The lock's CPU cost, when sampled: as important as its contention.
    if let Some(title) = cpu::column_title(report) {
        columns.push((Column::number(title, 92), Box::new(cpu::cell)));
    }
    columns.push((
        Column::number("wait p50/p99", 20),
        Box::new(holds::wait_percentiles),
    ));
    if handoffs::counted(report) {
        columns.push((Column::number("handoffs", 60), Box::new(handoffs::cell)));
    }
    if kernel_locks::joined(report) {
        columns.push((
            Column::number("kernel locks", 50),
            Box::new(kernel_locks::cell),
        ));
    }
    if report.locks.iter().any(|lock| lock.holds.is_some()) {
        columns.push((
            Column::number("held total/max", 25),
            Box::new(holds::hold_cell),
        ));
    }
    if report.locks.iter().any(|lock| !lock.holders.is_empty()) {
        columns.push((
            Column::text("top holder", 15, HOLDER_MIN_WIDTH),
            Box::new(holds::top_holder),
        ));
    }
    columns.push((
        Column::text("callers", 10, CALLERS_MIN_WIDTH),
        Box::new(top_callers),
    ));
    columns.push((
        Column::label("address", 45),
        Box::new(|lock| match &lock.group {
            Some(group) if group.addresses > 1 => {
                format!("{:#x} +{} more", lock.shown_address(), group.addresses - 1)
            }
            _ => format!("{:#x}", lock.shown_address()),
        }),
    ));
    columns
}

/// The lock rows (not the waiting-for-work ones), fitted to `width`.
fn lock_table(report: &Report, shown: usize, width: Width) -> Fitted {
    let columns = lock_columns(report);
    let mut locks: Vec<&Lock> = report
        .locks
        .iter()
        .filter(|lock| lock.is_contention())
        .collect();
    // The lock's cost first, when CPU was sampled (stable: ties keep the report's order).
    if cpu::sorts_by_cpu(report) {
        locks.sort_by_key(|lock| std::cmp::Reverse(lock.cpu_ns.unwrap_or(0)));
    }
    let rows: Vec<Vec<String>> = locks
        .into_iter()
        .take(shown)
        .map(|lock| columns.iter().map(|(_, cell)| cell(lock)).collect())
        .collect();
    let titles: Vec<Column> = columns.into_iter().map(|(column, _)| column).collect();
    fit(&titles, &rows, width)
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
        let text = super::render(&report, None, super::Width::Unlimited);
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
        let text = super::render(&report, None, super::Width::Unlimited);
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
        let text = super::render(&report, None, super::Width::Unlimited);
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
