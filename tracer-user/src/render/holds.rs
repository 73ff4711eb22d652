//! Hold times, holders and histograms as text: the table's cells and
//! `report --histograms`.
use std::fmt::Write;

use tracer_common::histogram;

use super::format::{self, duration};
use crate::model::{Lock, Report, quantile};

/// `p50/p99` of the waits, as bucket upper bounds (`-` without waits).
pub(crate) fn wait_percentiles(lock: &Lock) -> String {
    match (
        quantile(&lock.wait_histogram, 0.5),
        quantile(&lock.wait_histogram, 0.99),
    ) {
        (Some(p50), Some(p99)) => format!("{}/{}", bound(p50), bound(p99)),
        _ => "-".into(),
    }
}

/// Total and maximum hold time (`-` where not recorded).
pub(crate) fn hold_cell(lock: &Lock) -> String {
    match &lock.holds {
        Some(holds) if holds.holds > 0 => format!(
            "{} / {}",
            duration(holds.hold_ns),
            duration(holds.max_hold_ns)
        ),
        _ => "-".into(),
    }
}

/// The holder most waited on.
pub(crate) fn top_holder(lock: &Lock) -> String {
    let Some(holder) = lock.holders.first() else {
        return String::new();
    };
    let who = match (&holder.function, &holder.thread, holder.tid) {
        (Some(function), _, _) => function.clone(),
        (None, Some(thread), Some(tid)) => format!("thread {tid} ({thread})"),
        (None, None, Some(tid)) => format!("thread {tid}"),
        _ => format!("{}+?", holder.module.as_deref().unwrap_or("?")),
    };
    let total: u64 = lock.holders.iter().map(|h| h.waits).sum();
    if lock.holders.len() > 1 {
        format!("{who} ({}/{} waits)", holder.waits, total)
    } else {
        who
    }
}

/// A bucket bound for display (`≤1.0 ms`; the open last bucket as `>…`).
fn bound(ns: u64) -> String {
    if ns == u64::MAX {
        format!(
            ">{}",
            duration(histogram::upper_bound_ns(histogram::BUCKETS - 2))
        )
    } else {
        format!("≤{}", duration(ns))
    }
}

/// `report --histograms`: every lock's wait (and hold) histogram in full.
pub(crate) fn render_histograms(report: &Report, limit: Option<usize>) -> String {
    let mut out = String::new();
    for lock in report.locks.iter().take(limit.unwrap_or(usize::MAX)) {
        let label = format::label(lock);
        let mut sections: Vec<(&str, &[(u64, u64)])> = Vec::new();
        if !lock.wait_histogram.is_empty() {
            sections.push(("waits", &lock.wait_histogram));
        }
        if let Some(holds) = lock.holds.as_ref().filter(|h| !h.histogram.is_empty()) {
            sections.push(("holds", &holds.histogram));
        }
        for (what, histogram) in sections {
            let total: u64 = histogram.iter().map(|(_, n)| n).sum();
            let peak = histogram.iter().map(|(_, n)| *n).max().unwrap_or(1).max(1);
            let _ = writeln!(out, "\n{label}: {what} ({total})");
            let mut lower = 0u64;
            for &(upper, count) in histogram {
                let bar = "█".repeat(((count * 40).div_ceil(peak)) as usize);
                let range = if upper == u64::MAX {
                    format!("{:>9} and up", duration(lower.max(1)))
                } else {
                    format!(
                        "{:>9} .. {:<9}",
                        duration(lower_bound(upper)),
                        duration(upper)
                    )
                };
                let _ = writeln!(out, "  {range} {count:>9} {bar}");
                lower = upper;
            }
        }
        for holder in &lock.holders {
            let _ = writeln!(
                out,
                "  held by {}: {} waits, {} waiting",
                top_holder(&Lock {
                    holders: vec![holder.clone()],
                    ..lock.clone()
                }),
                holder.waits,
                duration(holder.wait_ns)
            );
        }
        if let Some(holds) = &lock.holds {
            for site in &holds.by_function {
                let _ = writeln!(
                    out,
                    "  held in {}: {} holds, {} held",
                    site.function
                        .as_deref()
                        .or(site.module.as_deref())
                        .unwrap_or("?"),
                    site.holds,
                    duration(site.hold_ns)
                );
            }
        }
    }
    if out.is_empty() {
        out.push_str("no waits or holds recorded\n");
    }
    out
}

/// The lower bound of the bucket whose upper bound is `upper`.
fn lower_bound(upper: u64) -> u64 {
    if upper <= histogram::upper_bound_ns(0) {
        0
    } else {
        upper / 2
    }
}
