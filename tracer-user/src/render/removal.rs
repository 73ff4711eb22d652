//! The table's removal lines: what removing the costliest locks would save.
use std::fmt::Write;

use super::format::{self, duration};
use crate::model::{PricePart, Removal, Report};

/// Locks the lines name at most.
const SHOWN: usize = 3;
/// Locks that would save less than this share of the target's CPU get no line.
const SMALLEST_SHARE: f64 = 0.001;

/// One line per lock among the costliest, biggest saving first.
pub(crate) fn render(report: &Report) -> String {
    let mut priced: Vec<_> = report
        .locks
        .iter()
        .filter(|lock| lock.is_contention())
        .filter_map(|lock| Some((lock, lock.removal.as_ref()?)))
        .filter(|(_, removal)| removal.saving_ns > 0.0)
        .filter(|(_, removal)| {
            removal
                .share_of_target_cpu
                .is_none_or(|share| share >= SMALLEST_SHARE)
        })
        .collect();
    priced.sort_by(|a, b| b.1.saving_ns.total_cmp(&a.1.saving_ns));
    let mut out = String::new();
    for (lock, removal) in priced.into_iter().take(SHOWN) {
        let _ = writeln!(
            out,
            "removing {} would save about {}",
            format::label(lock),
            saving(removal)
        );
    }
    out
}

/// `6.1 µs CPU per request (1.8%) ±1.5 µs (lock code …, handoffs …, kernel …)`.
pub(crate) fn saving(removal: &Removal) -> String {
    let (saving, error, unit) = match (removal.saving_ns_per_request, removal.error_ns_per_request)
    {
        (Some(saving), Some(error)) => (saving, error, "CPU per request"),
        _ => (
            removal.saving_ns,
            removal.error_ns,
            "CPU over the recording",
        ),
    };
    let share = removal
        .share_of_target_cpu
        .map(|share| format!(" ({:.1}%)", share * 100.0))
        .unwrap_or_default();
    let scale = if removal.saving_ns > 0.0 {
        saving / removal.saving_ns
    } else {
        0.0
    };
    let part = |name: &str, part: &Option<PricePart>| {
        part.map(|part| format!("{name} {}", ns(part.ns * scale)))
    };
    let parts: Vec<String> = [
        part("lock code", &removal.lock_code),
        part("handoffs", &removal.handoffs),
        part("kernel", &removal.kernel),
        part("kernel locks", &removal.kernel_locks),
        part("scheduling", &removal.scheduling),
    ]
    .into_iter()
    .flatten()
    .collect();
    let unpriced = if removal.unpriced.is_empty() {
        String::new()
    } else {
        format!("; not priced: {}", removal.unpriced.join(", "))
    };
    format!(
        "{} {unit}{share} ±{} ({}{unpriced})",
        ns(saving),
        ns(error),
        parts.join(", ")
    )
}

fn ns(value: f64) -> String {
    duration(value.max(0.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PriceBasis;

    /// The kernel locks part is said apart, after the sampled kernel part.
    #[test]
    fn the_kernel_locks_part_is_said_apart() {
        let part = |ns: f64, error_ns: f64, basis| {
            Some(PricePart {
                ns,
                error_ns,
                basis,
            })
        };
        let removal = Removal {
            saving_ns: 10_009_000.0,
            error_ns: 2_250.0,
            saving_ns_per_request: None,
            error_ns_per_request: None,
            share_of_target_cpu: None,
            lock_code: part(6_000.0, 1_500.0, PriceBasis::Calibrated),
            handoffs: part(3_000.0, 750.0, PriceBasis::Calibrated),
            kernel: None,
            kernel_locks: part(10_000_000.0, 0.0, PriceBasis::Traced),
            scheduling: None,
            unpriced: vec!["kernel: CPU not sampled (--no-cpu)".into()],
        };
        assert_eq!(
            saving(&removal),
            "10.0 ms CPU over the recording ±2.2 µs (lock code 6.0 µs, handoffs 3.0 µs, \
             kernel locks 10.0 ms; not priced: kernel: CPU not sampled (--no-cpu))"
        );
    }
}
