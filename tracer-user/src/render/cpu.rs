//! The CPU figures in text: the header line (the target's CPU time, its lock
//! code, the tracer's share) and the table's CPU cell per lock.
use super::format::duration;
use crate::model::{Lock, Report};

/// The line under the table's header: `cpu: target … (… per request); lock
/// code … ±… (…%) from N samples at H Hz; tracer ≈ …`. Empty without a `cpu` block.
pub(crate) fn summary(report: &Report) -> String {
    let Some(cpu) = &report.cpu else {
        return String::new();
    };
    let Some(target_ns) = cpu.target_ns else {
        return "cpu: the target's CPU time could not be read\n".into();
    };
    let per_request = report
        .totals
        .per_request
        .as_ref()
        .and_then(|per| per.cpu_ns)
        .map(|ns| format!(" ({} per request)", duration(ns.round() as u64)))
        .unwrap_or_default();
    let lock_code = match (cpu.lock_code_ns, cpu.lock_code_error_ns) {
        (Some(lock_ns), Some(error_ns)) => format!(
            "; lock code {} ±{} ({:.1}%) from {} samples at {} Hz",
            duration(lock_ns),
            duration(error_ns),
            share(lock_ns, target_ns),
            cpu.samples,
            cpu.sample_hz
        ),
        _ => match &cpu.sampler_off {
            Some(reason) => format!("; lock code not sampled: the CPU sampler is off ({reason})"),
            None => "; lock code not sampled (--no-cpu)".into(),
        },
    };
    format!(
        "cpu: target {}{per_request}{lock_code}; tracer ≈ {} of it ({} samples in its probe traps, {} unseen while its BPF programs ran)\n",
        duration(target_ns),
        duration(cpu.tracer_ns),
        cpu.tracer_samples,
        duration(cpu.unsampled_ns.unwrap_or(0))
    )
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// The title of the table's CPU column, None when CPU was not sampled.
pub(crate) fn column_title(report: &Report) -> Option<&'static str> {
    let sampled = report.cpu.as_ref().is_some_and(|cpu| cpu.sample_hz > 0);
    match (sampled, report.totals.per_request.is_some()) {
        (false, _) => None,
        (true, true) => Some("cpu/req"),
        (true, false) => Some("cpu ±err"),
    }
}

/// A lock's CPU cell: per request when requests are known, else total ± bound.
pub(crate) fn cell(lock: &Lock) -> String {
    match (&lock.per_request, lock.cpu_ns, lock.cpu_error_ns) {
        (Some(per), _, _) if per.cpu_ns.is_some() => {
            duration(per.cpu_ns.unwrap_or(0.0).round() as u64)
        }
        (_, Some(ns), Some(error)) => format!("{} ±{}", duration(ns), duration(error)),
        (_, Some(ns), None) => duration(ns),
        _ => "-".into(),
    }
}

/// Whether the table sorts by CPU: some lock burned sampled CPU.
pub(crate) fn sorts_by_cpu(report: &Report) -> bool {
    report.locks.iter().any(|lock| lock.cpu_ns.unwrap_or(0) > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LockKind, PerRequest, WaitClass};

    #[test]
    fn cell_is_per_request_when_requests_are_known() {
        let mut lock = Lock::empty(0x1000, LockKind::Mutex, WaitClass::Lock);
        assert_eq!(cell(&lock), "-");
        lock.cpu_ns = Some(42_000_000);
        lock.cpu_error_ns = Some(13_961_481);
        assert_eq!(cell(&lock), "42.0 ms ±14.0 ms");
        lock.per_request = Some(PerRequest {
            cpu_ns: Some(2_100.0),
            handoffs: None,
            ..PerRequest::default()
        });
        assert_eq!(cell(&lock), "2.1 µs");
    }
}
