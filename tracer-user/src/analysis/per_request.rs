//! Per-request figures: every lock's and the totals' figures divided by the
//! request count, unless the count was refused or is zero.
use crate::model::{PerRequest, Report, Requests};

/// Adds the request block to the report and, unless refused or zero, the
/// per-request figures of every lock and of the totals.
pub(crate) fn apply(report: &mut Report, requests: Requests) {
    let divisor = requests.divisor();
    for lock in &mut report.locks {
        lock.per_request = divisor.map(|n| PerRequest {
            acquisitions: lock.acquisitions.map(|a| a as f64 / n),
            acquisitions_error: None,
            contended: lock.contended as f64 / n,
            wait_ns: lock.wait_ns as f64 / n,
            hold_ns: lock.holds.as_ref().map(|h| h.hold_ns as f64 / n),
            cpu_ns: lock.cpu_ns.map(|cpu| cpu as f64 / n),
            handoffs: lock.handoffs.as_ref().map(|h| h.total as f64 / n),
        });
    }
    let target_cpu_ns = report.cpu.as_ref().and_then(|cpu| cpu.target_ns);
    let totals = &mut report.totals;
    totals.per_request = divisor.map(|n| PerRequest {
        acquisitions: totals.acquisitions.map(|a| a as f64 / n),
        acquisitions_error: None,
        contended: totals.contended as f64 / n,
        wait_ns: totals.wait_ns as f64 / n,
        hold_ns: totals.hold_ns.map(|h| h as f64 / n),
        cpu_ns: target_cpu_ns.map(|cpu| cpu as f64 / n),
        handoffs: None,
    });
    super::waits::apply_per_request(totals, divisor);
    report.requests = Some(requests);
}
