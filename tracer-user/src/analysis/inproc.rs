//! `--mode inproc`: each lock row says which mechanism counted its calls.
use crate::model::{DropReason, Inproc, Report};

/// Sets `counted_by` on every lock with calls: the mechanisms of the
/// functions it was taken with.
pub(crate) fn mark_locks(report: &mut Report, inproc: &Inproc) {
    if inproc.table_overflow > 0 {
        report
            .dropped
            .insert(DropReason::InprocTableFull, inproc.table_overflow);
    }
    for lock in &mut report.locks {
        let mut by: Vec<_> = lock
            .calls
            .keys()
            .filter_map(|function| {
                inproc
                    .functions
                    .iter()
                    .find(|f| &f.function == function)
                    .map(|f| f.counted_by)
            })
            .collect();
        by.sort();
        by.dedup();
        lock.counted_by = by;
    }
}
