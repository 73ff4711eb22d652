//! The "waiting for work / runtime" section under the lock table: futex
//! rows that are not lock contention, and their totals per class.
use std::fmt::Write;

use prettytable::{Cell, Row, Table, format, row};

use super::{
    format::{duration, ratio, truncate},
    requests,
};
use crate::model::{Lock, Report, WaitClass};

/// The "waiting for work / runtime" section: the rows that are not lock
/// contention, and their totals per class.
pub fn render(report: &Report, limit: Option<usize>) -> String {
    let rows: Vec<&Lock> = report
        .locks
        .iter()
        .filter(|lock| !lock.is_contention())
        .collect();
    let mut out = String::new();
    if rows.is_empty() {
        return out;
    }
    let per_request = report.totals.per_request.is_some();
    let _ = writeln!(
        out,
        "\nwaiting for work / runtime (not lock contention, not in the totals above):"
    );
    let mut table = Table::new();
    table.set_format(*format::consts::FORMAT_NO_BORDER_LINE_SEPARATOR);
    let mut titles =
        row!["address", "name", "class", r->"waits", r->"wakes", r->"wait total", r->"wait max"];
    if per_request {
        titles.add_cell(Cell::new("waits/req").style_spec("r"));
        titles.add_cell(Cell::new("wait/req").style_spec("r"));
    }
    titles.add_cell(Cell::new("region"));
    table.set_titles(titles);
    let shown = limit.unwrap_or(usize::MAX);
    for lock in rows.iter().take(shown) {
        let mut row: Row = row![
            format!("{:#x}", lock.address),
            truncate(lock.name.as_deref().unwrap_or("-"), 48),
            lock.wait_class,
            r->lock.contended,
            r->lock.wakes,
            r->duration(lock.wait_ns),
            r->duration(lock.max_wait_ns),
        ];
        if per_request {
            let cells = requests::cells(lock.per_request.as_ref());
            row.add_cell(Cell::new(&cells[1]).style_spec("r"));
            row.add_cell(Cell::new(&cells[2]).style_spec("r"));
        }
        row.add_cell(Cell::new(&lock.region));
        table.add_row(row);
    }
    out.push_str(&table.to_string());
    if rows.len() > shown {
        let _ = writeln!(out, "({} more not shown)", rows.len() - shown);
    }
    let classes: Vec<String> = report
        .totals
        .by_wait_class
        .iter()
        .filter(|(class, totals)| **class != WaitClass::Lock && totals.words > 0)
        .map(|(class, totals)| {
            let per = totals
                .per_request
                .as_ref()
                .map(|per| {
                    format!(
                        " ({} waits, {} per request)",
                        ratio(per.contended),
                        duration(per.wait_ns.round() as u64)
                    )
                })
                .unwrap_or_default();
            format!(
                "{}: {} waits, {} wakes, {} waiting{per}",
                class,
                totals.waits,
                totals.wakes,
                duration(totals.wait_ns)
            )
        })
        .collect();
    let _ = writeln!(out, "not contention: {}", classes.join("; "));
    out
}
