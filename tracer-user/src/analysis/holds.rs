//! Hold counts (`--hold-times`) into the report: per lock the completed holds
//! and their histogram, and the total. Holder functions are named by `naming`.
use crate::model::{Collected, Holds, Report, add_histogram};

/// Hold counts per lock (unnamed holder functions; see [`name`]) and totals.
pub(crate) fn apply(report: &mut Report, collected: &Collected) {
    if !collected.hold_times {
        return;
    }
    for lock in &mut report.locks {
        let address = lock.address;
        if lock.acquisitions.is_none() {
            continue;
        }
        let mut holds = Holds::default();
        if let Some(counts) = collected.holds.get(&address) {
            holds.holds = counts.holds;
            holds.hold_ns = counts.hold_ns;
            holds.max_hold_ns = counts.max_hold_ns;
            add_histogram(&mut holds.histogram, &counts.hold_histogram);
        }
        lock.holds = Some(holds);
    }
    report.totals.hold_ns = Some(
        report
            .locks
            .iter()
            .filter_map(|lock| lock.holds.as_ref().map(|h| h.hold_ns))
            .sum(),
    );
}
