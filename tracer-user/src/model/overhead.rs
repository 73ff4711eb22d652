//! What tracing cost, as the report records it.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Cost per probe hit, and where the figures come from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Calibration {
    /// `uname -r` of the kernel measured.
    pub kernel: String,
    pub emulated_ns: u64,
    pub stepped_ns: u64,
    /// One cache line's transfer between two cores (CPUs 0 and 1), ns;
    /// 0 in files written before it was measured.
    #[serde(default)]
    pub handoff_ns: u64,
    /// One uncontended lock + unlock pair with its calls, ns; 0 in files
    /// written before it was measured.
    #[serde(default)]
    pub lock_pair_ns: f64,
}

/// What tracing cost the target and the tracer (`overhead` in JSON).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Overhead {
    /// Lock probe hits counted (in sampled mode: inside the counting windows).
    pub probe_hits: u64,
    /// Hits of the request-boundary probe (`--request-probe`), also in `estimated_added_ns`.
    #[serde(default)]
    pub request_probe_hits: u64,
    /// Hits of the condvar wait probes (entry and return of each call), also
    /// in `estimated_added_ns` (counted as one single-stepped and one cheap hit).
    #[serde(default)]
    pub cond_wait_probe_hits: u64,
    /// `--hold-times`: hits of the unlock probes, also in `estimated_added_ns`.
    #[serde(default)]
    pub unlock_probe_hits: u64,
    /// Hits of the lock init probes (creation sites: `record`'s all-locks
    /// and inproc modes, and `--stacks`), also in `estimated_added_ns`
    /// (counted as single-stepped hits; their stack snapshots are not).
    #[serde(default)]
    pub init_probe_hits: u64,
    /// Probe points on emulated (cheap) and single-stepped instructions.
    pub emulated_points: u32,
    pub stepped_points: u32,
    /// Estimated time the probes added to the target (hits × cost per hit).
    pub estimated_added_ns: u64,
    pub cost_ns_per_emulated_hit: u64,
    pub cost_ns_per_stepped_hit: u64,
    /// Where the costs per hit come from.
    #[serde(default)]
    pub cost_source: String,
    /// Time until the probes were live.
    pub attach_ms: u64,
    /// locktrace's own CPU time (user + system) and peak resident memory.
    pub tracer_cpu_s: f64,
    pub tracer_peak_rss_kib: u64,
}
