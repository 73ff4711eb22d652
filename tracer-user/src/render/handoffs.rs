//! Handoffs as text: the table's cell (moves between CPUs, and their share
//! of the acquisitions) and a footer line with the split by cache distance
//! and what the moves cost.
use super::format::duration;
use crate::model::{HandoffCostSource, Handoffs, Lock, Report};

/// `N (P%)`: the lock's handoffs and their share of its acquisitions
/// (`~` when estimated; `-` where not counted).
pub(crate) fn cell(lock: &Lock) -> String {
    let Some(handoffs) = &lock.handoffs else {
        return "-".into();
    };
    let estimated = if lock.acquisitions_error.is_some() {
        "~"
    } else {
        ""
    };
    match lock.acquisitions.filter(|&n| n > 0) {
        Some(acquisitions) => format!(
            "{estimated}{} ({:.0}%)",
            handoffs.total,
            100.0 * handoffs.total as f64 / acquisitions as f64
        ),
        None => format!("{estimated}{}", handoffs.total),
    }
}

/// True when any lock's handoffs were counted (the column and footer show).
pub(crate) fn counted(report: &Report) -> bool {
    report.locks.iter().any(|lock| lock.handoffs.is_some())
}

/// `handoffs: …` over the contention rows: the split by cache distance and
/// the moves' cost at the cost per handoff; empty when not counted.
pub(crate) fn footer(report: &Report) -> String {
    let mut sum = Handoffs::default();
    let mut each = None;
    for handoffs in report
        .locks
        .iter()
        .filter(|lock| lock.is_contention())
        .filter_map(|lock| lock.handoffs.as_ref())
    {
        sum.merge(handoffs);
        each = each.or(handoffs.cost_source.map(|s| (handoffs.ns_per_handoff, s)));
    }
    let Some((ns, source)) = each else {
        return String::new();
    };
    let source = match source {
        HandoffCostSource::Calibrated => "calibrated on this machine",
        HandoffCostSource::BuiltIn => "built-in reference",
    };
    format!(
        "handoffs: {} acquisitions on another CPU than the lock's previous one (same core {}, same L3 {}, other L3 or socket {}); at {ns} ns each ({source}) ≈ {} CPU\n",
        sum.total,
        sum.same_core,
        sum.same_l3,
        sum.other_l3,
        duration(sum.cost_ns)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LockKind, WaitClass};

    fn lock_with(acquisitions: u64, total: u64) -> Lock {
        let mut lock = Lock::empty(0x10, LockKind::Mutex, WaitClass::Lock);
        lock.acquisitions = Some(acquisitions);
        lock.handoffs = Some(Handoffs {
            total,
            same_l3: total,
            ns_per_handoff: 50,
            cost_source: Some(HandoffCostSource::BuiltIn),
            cost_ns: total * 50,
            ..Handoffs::default()
        });
        lock
    }

    #[test]
    fn the_cell_gives_the_share_of_acquisitions() {
        assert_eq!(cell(&lock_with(400, 399)), "399 (100%)");
        assert_eq!(cell(&lock_with(400, 100)), "100 (25%)");
        let mut sampled = lock_with(400, 100);
        sampled.acquisitions_error = Some(20);
        assert_eq!(cell(&sampled), "~100 (25%)");
        assert_eq!(
            cell(&Lock::empty(0x10, LockKind::Mutex, WaitClass::Lock)),
            "-"
        );
    }

    #[test]
    fn the_footer_sums_the_classes_and_prices_them() {
        let mut report = Report::empty_for_tests("all");
        assert_eq!(footer(&report), "");
        report.locks = vec![lock_with(400, 399), lock_with(10, 1)];
        let line = footer(&report);
        assert!(line.starts_with("handoffs: 400 acquisitions"), "{line}");
        assert!(line.contains("same L3 400"), "{line}");
        assert!(
            line.contains("at 50 ns each (built-in reference)"),
            "{line}"
        );
    }
}
