//! Handoff counts into the report: per lock with counted acquisitions, its
//! moves between CPUs by cache distance, priced at the cost per handoff
//! (`cost::handoff_cost_ns`).
use crate::model::{Collected, HandoffCostSource, Handoffs, Report};

/// Handoffs per lock when they were counted, at `ns_per_handoff` each.
pub(crate) fn apply(report: &mut Report, collected: &Collected, cost: (u64, HandoffCostSource)) {
    if !collected.handoffs_counted {
        return;
    }
    let (ns_per_handoff, source) = cost;
    for lock in &mut report.locks {
        if lock.acquisitions.is_none() {
            continue;
        }
        let counts = collected
            .handoffs
            .get(&lock.address)
            .copied()
            .unwrap_or_default();
        lock.handoffs = Some(Handoffs::of(&counts, ns_per_handoff, source));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Lock, LockKind, WaitClass};
    use tracer_common::HandoffCounts;

    #[test]
    fn locks_with_acquisitions_get_their_handoffs() {
        let mut report = Report::empty_for_tests("all");
        let mut counted = Lock::empty(0x10, LockKind::Mutex, WaitClass::Lock);
        counted.acquisitions = Some(10);
        let mut quiet = Lock::empty(0x20, LockKind::Mutex, WaitClass::Lock);
        quiet.acquisitions = Some(4);
        let futex_only = Lock::empty(0x30, LockKind::Futex, WaitClass::Other);
        report.locks = vec![counted, quiet, futex_only];
        let mut collected = Collected {
            handoffs_counted: true,
            ..Collected::default()
        };
        collected.handoffs.insert(
            0x10,
            HandoffCounts {
                last_cpu: 1,
                _pad: 0,
                counts: [0, 9, 0],
            },
        );
        apply(&mut report, &collected, (50, HandoffCostSource::BuiltIn));
        let first = report.locks[0].handoffs.as_ref().expect("counted");
        assert_eq!((first.total, first.same_l3, first.cost_ns), (9, 9, 450));
        let second = report.locks[1].handoffs.as_ref().expect("counted");
        assert_eq!(second.total, 0);
        assert!(report.locks[2].handoffs.is_none());
    }
}
