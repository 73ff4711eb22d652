//! What tracing cost, for the report footer and JSON `overhead`: probe hits,
//! the time they added to the target (hits × calibrated cost per hit), the
//! tracer's own CPU time and peak memory; plus how the probes were placed.
use std::fmt::Write;

use serde::{Deserialize, Serialize};
use tracer_common::LockOp;

use crate::{
    collect::Collected, lockfuncs::LockFunction, placement::PlacedFunction, report::Report,
};

/// Cost of one uprobe hit on an instruction the kernel emulates, and on one it
/// single-steps, on the reference machine when quiet (2-core VM, Linux 6.18;
/// the BPF program's own work included). Used when no calibration file
/// matches the running kernel.
pub const EMULATED_NS_PER_HIT: u64 = 800;
pub const STEPPED_NS_PER_HIT: u64 = 9_500;

/// Written by `cargo xtask bench` (its calibration step) on this machine.
pub const CALIBRATION_FILE: &str = "/var/cache/locktrace/calibration.json";

/// Cost per probe hit, and where the figures come from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Calibration {
    /// `uname -r` of the kernel measured.
    pub kernel: String,
    pub emulated_ns: u64,
    pub stepped_ns: u64,
}

/// The calibration measured on the running kernel if there is one, else the
/// built-in reference figures; plus a description of the source.
pub fn calibration() -> (Calibration, String) {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let measured = std::fs::read_to_string(CALIBRATION_FILE)
        .ok()
        .and_then(|text| serde_json::from_str::<Calibration>(&text).ok())
        .filter(|calibration| calibration.kernel == kernel);
    match measured {
        Some(calibration) => (
            calibration,
            format!("measured on this kernel ({CALIBRATION_FILE})"),
        ),
        None => (
            Calibration {
                kernel,
                emulated_ns: EMULATED_NS_PER_HIT,
                stepped_ns: STEPPED_NS_PER_HIT,
            },
            "built-in reference figures (run `cargo xtask bench` to measure this machine)".into(),
        ),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Overhead {
    /// Lock probe hits counted (in sampled mode: inside the counting windows).
    pub probe_hits: u64,
    /// Hits of the request-boundary probe (`--request-probe`), also in `estimated_added_ns`.
    #[serde(default)]
    pub request_probe_hits: u64,
    /// `--hold-times`: hits of the unlock probes, also in `estimated_added_ns`.
    #[serde(default)]
    pub unlock_probe_hits: u64,
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

pub fn measure(
    collected: &Collected,
    placed: &[(LockFunction, PlacedFunction)],
    request_probe_emulated: Option<bool>,
    attach_ms: u64,
) -> Overhead {
    let mut hits_per_op = [0u64; tracer_common::LOCK_OPS];
    for counts in collected.locks.values() {
        for (slot, calls) in hits_per_op.iter_mut().zip(counts.calls) {
            *slot += calls;
        }
    }
    let (calibration, cost_source) = calibration();
    let mut added = 0u64;
    let (mut emulated_points, mut stepped_points) = (0, 0);
    for (function, placement) in placed {
        let emulated = placement.points.iter().all(|point| point.emulated);
        emulated_points += placement.points.iter().filter(|p| p.emulated).count() as u32;
        stepped_points += placement.points.iter().filter(|p| !p.emulated).count() as u32;
        let cost = if emulated {
            calibration.emulated_ns
        } else {
            calibration.stepped_ns
        };
        added += hits_per_op[function.op as usize] * cost;
    }
    let request_probe_hits = request_probe_emulated.map_or(0, |_| collected.requests);
    added += request_probe_hits
        * match request_probe_emulated {
            Some(true) => calibration.emulated_ns,
            _ => calibration.stepped_ns,
        };
    let (cpu, rss) = own_usage();
    Overhead {
        probe_hits: hits_per_op.iter().sum(),
        request_probe_hits,
        unlock_probe_hits: 0,
        emulated_points,
        stepped_points,
        estimated_added_ns: added,
        cost_ns_per_emulated_hit: calibration.emulated_ns,
        cost_ns_per_stepped_hit: calibration.stepped_ns,
        cost_source,
        attach_ms,
        tracer_cpu_s: cpu,
        tracer_peak_rss_kib: rss,
    }
}

/// (user + system CPU seconds, peak RSS in KiB) of this process.
fn own_usage() -> (f64, u64) {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we own.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return (0.0, 0);
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        seconds(usage.ru_utime) + seconds(usage.ru_stime),
        usage.ru_maxrss.max(0) as u64,
    )
}

/// Footer lines about placement, estimates and cost (empty when there is nothing to say).
pub fn footer(report: &Report) -> String {
    let mut out = String::new();
    for fallback in &report.placement_fallbacks {
        let _ = writeln!(
            out,
            "placement: auto fell back to the entry of {} in {}: {}",
            fallback.function, fallback.module, fallback.reason
        );
    }
    if let Some(estimate) = &report.estimate {
        let _ = writeln!(
            out,
            "sampled: acquisitions are ESTIMATES (~), counted {:.2} s of {:.2} s in {} windows, scaled ×{:.2}, total within ±{:.1}%",
            estimate.counted_s,
            estimate.total_s,
            estimate.windows,
            estimate.scale,
            estimate.relative_error * 100.0
        );
    }
    if let Some(estimate) = report
        .estimate
        .as_ref()
        .filter(|e| e.probe_time_share > 0.25)
    {
        let _ = writeln!(
            out,
            "sampled: WARNING the probes took ~{:.0}% of a thread's counted time: if the target is CPU-bound it ran slower while counted and the estimate is low (use --mode all)",
            (estimate.probe_time_share * 100.0).min(100.0)
        );
    }
    if report.mode == "contention" {
        out.push_str("contention mode: lock functions not probed; acquisitions unknown (-), contention exact\n");
    }
    if let Some(overhead) = &report.overhead {
        let _ = writeln!(
            out,
            "overhead: {} probe hits{} on {} cheap + {} single-stepped points{} ≈ {} added to the target; attach {} ms; tracer CPU {:.2} s, peak RSS {:.1} MiB",
            overhead.probe_hits,
            if overhead.unlock_probe_hits > 0 {
                format!(
                    " + {} unlock probe hits (--hold-times; its hold bookkeeping, ~25 % more, is not in the estimate)",
                    overhead.unlock_probe_hits
                )
            } else {
                String::new()
            },
            overhead.emulated_points,
            overhead.stepped_points,
            if overhead.request_probe_hits > 0 {
                format!(", {} request probe hits", overhead.request_probe_hits)
            } else {
                String::new()
            },
            crate::table::duration(overhead.estimated_added_ns),
            overhead.attach_ms,
            overhead.tracer_cpu_s,
            overhead.tracer_peak_rss_kib as f64 / 1024.0
        );
    }
    out
}

/// Unused op index guard: LockOp discriminants index `calls`.
const _: () = assert!(LockOp::RwlockWrlock as usize + 1 == tracer_common::LOCK_OPS);
