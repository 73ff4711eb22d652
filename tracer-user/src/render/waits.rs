//! The "waiting for work / runtime" section under the lock table: futex
//! rows that are not lock contention, and their totals per class.
use std::fmt::Write;

use super::{
    fit::{Column, Fitted, Width, fit},
    format::{duration, ratio},
    requests,
};
use crate::model::{Lock, Report, WaitClass};

/// The "waiting for work / runtime" section: the rows that are not lock
/// contention, and their totals per class.
pub(crate) fn render(report: &Report, limit: Option<usize>, width: Width) -> String {
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
    let shown = limit.unwrap_or(usize::MAX);
    let table = waits_table(&rows[..rows.len().min(shown)], per_request, width);
    out.push_str(&table.text);
    out.push_str(&table.note(width).unwrap_or_default());
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

/// The rows that are not lock contention, the name first, fitted to `width`.
fn waits_table(rows: &[&Lock], per_request: bool, width: Width) -> Fitted {
    let mut columns = vec![
        Column::name("name"),
        Column::label("class", 80),
        Column::number("waits", 90),
        Column::number("wakes", 30),
        Column::number("wait total", 70),
        Column::number("wait max", 40),
    ];
    if per_request {
        columns.push(Column::number("waits/req", 85));
        columns.push(Column::number("wait/req", 65));
    }
    columns.push(Column::text("region", 50, 12));
    columns.push(Column::label("address", 45));
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|lock| {
            let mut row = vec![
                lock.name.clone().unwrap_or_else(|| "-".into()),
                lock.wait_class.to_string(),
                lock.contended.to_string(),
                lock.wakes.to_string(),
                duration(lock.wait_ns),
                duration(lock.max_wait_ns),
            ];
            if per_request {
                let [_, waits, wait] = requests::cells(lock.per_request.as_ref());
                row.extend([waits, wait]);
            }
            row.extend([
                lock.region.to_string(),
                format!("{:#x}", lock.shown_address()),
            ]);
            row
        })
        .collect();
    fit(&columns, &cells, width)
}
