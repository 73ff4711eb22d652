//! What the target's CPU time was and what its lock code cost (`cpu` in JSON).
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The report's `cpu` block.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct CpuReport {
    /// The target's CPU time (user + system, every thread, also those that
    /// exited) over the recording window, from the kernel's scheduler
    /// accounting; null when it could not be read.
    pub target_ns: Option<u64>,
    /// Sampled CPU time in lock code (lock functions, libc lock slow paths,
    /// the kernel inside futex syscalls on lock words); null with `--no-cpu`.
    pub lock_code_ns: Option<u64>,
    /// `lock_code_ns` is within ± this (see [`cpu_error_ns`]).
    pub lock_code_error_ns: Option<u64>,
    /// CPU samples of the target's threads (all of them, lock code or not).
    pub samples: u64,
    /// Samples per second of CPU time (per CPU); 0 with `--no-cpu`.
    pub sample_hz: u64,
    /// Estimated time the tracer's probes added to the target's CPU time:
    /// the larger of the `overhead` estimate (probe hits × calibrated cost)
    /// and `unsampled_ns`. Part of `target_ns`, never of a lock's.
    pub tracer_ns: u64,
    /// Samples in the kernel on a trap from lock code that is no syscall:
    /// the uprobes' breakpoint handling (the tracer's, counted in no lock).
    #[serde(default)]
    pub tracer_samples: u64,
    /// Samples inside futex syscalls of condvar waits or the Go runtime:
    /// not lock code.
    #[serde(default)]
    pub futex_not_lock_samples: u64,
    /// Lock-code samples attributed to an address that is no lock (a null
    /// or tiny argument): in `lock_code_ns`, in no lock's `cpu_ns`.
    #[serde(default)]
    pub unattributed_samples: u64,
    /// Samples in the kernel on an interrupt or exception from the target's
    /// code outside lock code: mostly the scheduler's work after wake-ups
    /// (a lock's `removal.scheduling` takes its share by futex waits), also
    /// page faults and ticks.
    #[serde(default)]
    pub interrupted_samples: u64,
    /// `target_ns` minus what the samples account for (`samples` × the
    /// period), when positive: the target's CPU time the sampler could not
    /// see because the kernel does not run it while another BPF program runs
    /// on the CPU, i.e. mostly the tracer's own probe programs (in
    /// contention mode, the futex tracepoints). Null without both figures.
    #[serde(default)]
    pub unsampled_ns: Option<u64>,
    /// Why the sampler is off although `--no-cpu` was not given (the kernel
    /// refused it): the recording counted on without CPU per lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler_off: Option<String>,
}

/// Nanoseconds of CPU one sample stands for at `hz` samples per CPU second.
pub(crate) fn sample_period_ns(hz: u64) -> u64 {
    1_000_000_000 / hz.max(1)
}

/// The bound of a CPU time estimated from `samples` samples of period
/// `period_ns`: two standard deviations of the sample count (Poisson,
/// sqrt(n)) plus one period for where the window edges cut a period.
pub(crate) fn cpu_error_ns(samples: u64, period_ns: u64) -> u64 {
    ((2.0 * (samples as f64).sqrt() + 1.0) * period_ns as f64).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn period_and_bound() {
        assert_eq!(sample_period_ns(1000), 1_000_000);
        assert_eq!(sample_period_ns(0), 1_000_000_000);
        // 100 samples of 1 ms: ±(2×10 + 1) ms.
        assert_eq!(cpu_error_ns(100, 1_000_000), 21_000_000);
        assert_eq!(cpu_error_ns(0, 1_000_000), 1_000_000);
    }
}
