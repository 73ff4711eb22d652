//! Saturation of the locks with hold times: utilization (holds per second ×
//! mean hold), the M/D/1 queue's mean wait at that utilization, and the
//! rates at which the lock would be held all the time.
//!
//! M/D/1 assumes acquisitions arrive independently (Poisson), every hold
//! lasts the mean hold, and waiters are served one at a time in order.
//! Real locks deviate both ways: bursts wait longer than Poisson arrivals,
//! paced ones (a timer) far less; the measured wait is set beside the model.
use crate::model::{QueueModel, Report, Requests, Saturation};

/// Fills `saturation` for every lock with completed holds.
pub(crate) fn apply(report: &mut Report) {
    let duration_s = report.duration_s;
    let requests_per_s = report
        .requests
        .as_ref()
        .and_then(Requests::divisor)
        .map(|count| count / duration_s);
    for lock in &mut report.locks {
        let Some(holds) = &lock.holds else { continue };
        if holds.holds == 0 || duration_s <= 0.0 {
            continue;
        }
        let acquisitions = lock.acquisitions.unwrap_or(holds.holds).max(1);
        let measured_wait_ns = lock.wait_ns as f64 / acquisitions as f64;
        lock.saturation = Some(of(
            holds.holds,
            holds.hold_ns,
            duration_s,
            measured_wait_ns,
            requests_per_s,
        ));
    }
}

/// One lock's saturation from its completed holds over `duration_s`.
pub(crate) fn of(
    holds: u64,
    hold_ns: u64,
    duration_s: f64,
    measured_wait_ns: f64,
    requests_per_s: Option<f64>,
) -> Saturation {
    let holds_per_s = holds as f64 / duration_s;
    let mean_hold_ns = hold_ns as f64 / holds as f64;
    let utilization = holds_per_s * mean_hold_ns / 1e9;
    Saturation {
        utilization,
        holds_per_s,
        mean_hold_ns,
        model: QueueModel::MD1,
        predicted_wait_ns: QueueModel::MD1.wait_ns(utilization, mean_hold_ns),
        measured_wait_ns,
        saturating_holds_per_s: if mean_hold_ns > 0.0 {
            1e9 / mean_hold_ns
        } else {
            f64::INFINITY
        },
        saturating_requests_per_s: requests_per_s
            .filter(|_| utilization > 0.0)
            .map(|rate| rate / utilization),
    }
    .finite()
}

impl Saturation {
    /// JSON has no infinity: a lock whose holds took no measurable time
    /// saturates at no finite rate, which is written as 0.
    fn finite(mut self) -> Saturation {
        if !self.saturating_holds_per_s.is_finite() {
            self.saturating_holds_per_s = 0.0;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utilization_is_rate_times_mean_hold() {
        // 1000 holds a second of 400 µs each: held 40% of the time.
        let saturation = of(2000, 2000 * 400_000, 2.0, 0.0, Some(1000.0));
        assert!((saturation.utilization - 0.4).abs() < 1e-12);
        assert_eq!(saturation.holds_per_s, 1000.0);
        assert_eq!(saturation.mean_hold_ns, 400_000.0);
        assert_eq!(saturation.saturating_holds_per_s, 2500.0);
        assert_eq!(saturation.saturating_requests_per_s, Some(2500.0));
        // ρS / 2(1-ρ) = 0.4 × 400 µs / 1.2.
        let wait = saturation.predicted_wait_ns.unwrap();
        assert!((wait - 400_000.0 / 3.0).abs() < 1e-6, "{wait}");
    }

    #[test]
    fn a_saturated_lock_has_no_finite_wait() {
        assert_eq!(QueueModel::MD1.wait_ns(1.0, 100.0), None);
        assert_eq!(QueueModel::MM1.wait_ns(1.5, 100.0), None);
        assert_eq!(QueueModel::MD1.wait_ns(0.0, 100.0), Some(0.0));
        // Exponential holds wait twice as long as constant ones.
        assert_eq!(QueueModel::MM1.wait_ns(0.5, 100.0), Some(100.0));
        assert_eq!(QueueModel::MD1.wait_ns(0.5, 100.0), Some(50.0));
    }

    #[test]
    fn holds_of_no_time_saturate_at_no_rate() {
        let saturation = of(10, 0, 1.0, 0.0, Some(5.0));
        assert_eq!(saturation.utilization, 0.0);
        assert_eq!(saturation.saturating_holds_per_s, 0.0);
        assert_eq!(saturation.saturating_requests_per_s, None);
        assert!(serde_json::to_string(&saturation).is_ok());
    }
}
