//! What tracing cost, for JSON `overhead`: probe hits, the time they added
//! to the target (hits × calibrated cost per hit), the tracer's own CPU time
//! and peak memory; plus how the probes were placed.
use tracer_common::LockOp;

use crate::{
    model::{Calibration, Collected, HandoffCostSource, Overhead},
    probe::placement::Placed,
};

/// Cost of one uprobe hit on an instruction the kernel emulates, and on one it
/// single-steps, on the reference machine when quiet (2-core VM, Linux 6.18;
/// the BPF program's own work included). Used when no calibration file
/// matches the running kernel.
pub(crate) const EMULATED_NS_PER_HIT: u64 = 800;
pub(crate) const STEPPED_NS_PER_HIT: u64 = 9_500;

/// One cache line's transfer between two cores sharing the L3 on the
/// reference machine (CPUs 0 and 1 of the 2-core VM, Linux 6.18: 26.1 ns,
/// fixtures/bench/handoff.c, two pinned threads passing a token through
/// one atomic). Used when no calibration file with a handoff figure
/// matches the running kernel.
pub(crate) const HANDOFF_NS: u64 = 26;

/// One uncontended pthread_mutex_lock + unlock pair with their calls on the
/// reference machine (fixtures/bench/pair.c: 5.7-6.0 ns).
pub(crate) const LOCK_PAIR_NS: f64 = 6.0;

/// The costs a lock's removal is priced with (see `analysis::removal`).
pub(crate) fn unit_costs() -> super::removal::UnitCosts {
    let measured = measured_calibration()
        .map(|calibration| calibration.lock_pair_ns)
        .filter(|&ns| ns > 0.0);
    super::removal::UnitCosts {
        lock_pair_ns: measured.unwrap_or(LOCK_PAIR_NS),
    }
}

/// Written by `cargo xtask bench` (its calibration step) on this machine.
pub const CALIBRATION_FILE: &str = "/var/cache/locktrace/calibration.json";

/// The calibration measured on the running kernel if there is one, else the
/// built-in reference figures; plus a description of the source.
pub(crate) fn calibration() -> (Calibration, String) {
    match measured_calibration() {
        Some(calibration) => (
            calibration,
            format!("measured on this kernel ({CALIBRATION_FILE})"),
        ),
        None => (
            Calibration {
                kernel: running_kernel(),
                emulated_ns: EMULATED_NS_PER_HIT,
                stepped_ns: STEPPED_NS_PER_HIT,
                handoff_ns: HANDOFF_NS,
                lock_pair_ns: LOCK_PAIR_NS,
            },
            "built-in reference figures (run `cargo xtask bench` to measure this machine)".into(),
        ),
    }
}

/// The cost of one handoff (a lock's cache line moving to another core),
/// ns, and where it comes from: the calibration measured on this kernel
/// when it has the figure, else [`HANDOFF_NS`]. A lock's handoffs × this
/// is the CPU time the moves cost (`locks[].handoffs.cost_ns`).
pub(crate) fn handoff_cost_ns() -> (u64, HandoffCostSource) {
    handoff_cost_of(measured_calibration().as_ref())
}

/// The handoff figure of a calibration file's contents, if any.
fn handoff_cost_of(measured: Option<&Calibration>) -> (u64, HandoffCostSource) {
    match measured {
        Some(calibration) if calibration.handoff_ns > 0 => {
            (calibration.handoff_ns, HandoffCostSource::Calibrated)
        }
        _ => (HANDOFF_NS, HandoffCostSource::BuiltIn),
    }
}

/// `uname -r`.
fn running_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The calibration file, when it was measured on the running kernel.
fn measured_calibration() -> Option<Calibration> {
    let kernel = running_kernel();
    std::fs::read_to_string(CALIBRATION_FILE)
        .ok()
        .and_then(|text| serde_json::from_str::<Calibration>(&text).ok())
        .filter(|calibration| calibration.kernel == kernel)
}

/// The lock probes' cost per hit, weighted by the hits of each function:
/// a stepped entry on a function that was never called costs nothing.
pub(crate) fn lock_cost_per_hit(collected: &Collected, placed: &[Placed]) -> u64 {
    let (calibration, _) = calibration();
    let hits = hits_per_op(collected);
    let (mut cost, mut total) = (0u64, 0u64);
    for (function, placement) in placed {
        let emulated = placement.points.iter().all(|point| point.emulated);
        let per_hit = if emulated {
            calibration.emulated_ns
        } else {
            calibration.stepped_ns
        };
        let n = hits[function.op as usize];
        cost = cost.saturating_add(n.saturating_mul(per_hit));
        total = total.saturating_add(n);
    }
    cost.checked_div(total).unwrap_or(calibration.emulated_ns)
}

/// Lock probe hits per op: every counted call, failed ones included.
fn hits_per_op(collected: &Collected) -> [u64; tracer_common::LOCK_OPS] {
    let mut hits_per_op = [0u64; tracer_common::LOCK_OPS];
    for counts in collected.locks.values() {
        for (slot, calls) in hits_per_op.iter_mut().zip(counts.calls) {
            *slot += calls;
        }
    }
    // A failed call hit the probe too (and its return probe).
    for (key, &count) in &collected.failed_tries {
        if let Some(slot) = hits_per_op.get_mut(key.op as usize) {
            *slot += count;
        }
    }
    hits_per_op
}

pub(crate) fn measure(
    collected: &Collected,
    placed: &[Placed],
    request_probe_emulated: Option<bool>,
    attach_ms: u64,
) -> Overhead {
    let hits_per_op = hits_per_op(collected);
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
    // Sampled mode's request probe is in all along; its lock probes are not.
    let request_probe_hits = request_probe_emulated.map_or(0, |_| {
        collected.requests_whole_recording.max(collected.requests)
    });
    added += request_probe_hits
        * match request_probe_emulated {
            Some(true) => calibration.emulated_ns,
            _ => calibration.stepped_ns,
        };
    added += collected.cond_wait_calls * (calibration.stepped_ns + calibration.emulated_ns);
    let init_probe_hits = init_calls(collected);
    added += init_probe_hits * calibration.stepped_ns;
    let (cpu, rss) = own_usage();
    // Hits of the probed functions only: in `--mode inproc` stubs count
    // the others, without a trap.
    let probed: std::collections::BTreeSet<usize> = placed
        .iter()
        .map(|(function, _)| function.op as usize)
        .collect();
    Overhead {
        probe_hits: probed.iter().map(|&op| hits_per_op[op]).sum(),
        request_probe_hits,
        cond_wait_probe_hits: 2 * collected.cond_wait_calls,
        unlock_probe_hits: 0,
        init_probe_hits,
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

/// Lock init calls counted (the creation keys' counts).
fn init_calls(collected: &Collected) -> u64 {
    collected
        .stacks
        .iter()
        .filter(|(key, _)| key.stack_id == tracer_common::stack_kind::CREATION)
        .map(|(_, &count)| count)
        .sum()
}

/// (user + system CPU seconds, peak RSS in KiB) of this process.
fn own_usage() -> (f64, u64) {
    use nix::sys::{
        resource::{UsageWho, getrusage},
        time::TimeValLike,
    };
    let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) else {
        return (0.0, 0);
    };
    let cpu_us = usage.user_time().num_microseconds() + usage.system_time().num_microseconds();
    let peak = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| vm_hwm_kib(&status))
        .unwrap_or(usage.max_rss().max(0) as u64);
    (cpu_us as f64 / 1e6, peak)
}

/// The peak RSS of this program's own memory (`VmHWM` in KiB) from
/// /proc/self/status. Not getrusage's `ru_maxrss`: the kernel keeps in it
/// the peak of the memory the process had before its exec (the parent's
/// forked copy), so a locktrace started by a large process (a 1.8 GiB test
/// harness, a fleet agent's launcher) reported its parent's size.
fn vm_hwm_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

/// Unused op index guard: LockOp discriminants index `calls`.
const _: () = assert!(LockOp::SpinTrylock as usize + 1 == tracer_common::LOCK_OPS);

/// Adds the unlock probes' points, hits and estimated cost (same
/// calibration as the lock probes) to the overhead.
pub(crate) fn add_unlock_overhead(overhead: &mut Overhead, hits: u64, unlocks: &[Placed]) {
    let points = unlocks.iter().flat_map(|(_, placed)| &placed.points);
    for point in points.clone() {
        if point.emulated {
            overhead.emulated_points += 1;
        } else {
            overhead.stepped_points += 1;
        }
    }
    let all_emulated = points.clone().all(|p| p.emulated);
    overhead.unlock_probe_hits = hits;
    overhead.estimated_added_ns += hits
        * if all_emulated {
            overhead.cost_ns_per_emulated_hit
        } else {
            overhead.cost_ns_per_stepped_hit
        };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_old_calibration_file_loads_and_prices_handoffs_built_in() {
        let old = r#"{"kernel": "6.18.0", "emulated_ns": 700, "stepped_ns": 9000}"#;
        let calibration: Calibration = serde_json::from_str(old).expect("old files load");
        assert_eq!(calibration.handoff_ns, 0);
        assert_eq!(
            handoff_cost_of(Some(&calibration)),
            (HANDOFF_NS, HandoffCostSource::BuiltIn)
        );
        let new = Calibration {
            handoff_ns: 75,
            ..calibration
        };
        assert_eq!(
            handoff_cost_of(Some(&new)),
            (75, HandoffCostSource::Calibrated)
        );
        assert_eq!(
            handoff_cost_of(None),
            (HANDOFF_NS, HandoffCostSource::BuiltIn)
        );
    }

    /// The init calls (creation keys' counts) are hits of their own, each
    /// priced as a single-stepped hit; lock calls' keys are not init calls.
    #[test]
    fn init_probe_hits_are_counted_and_priced() {
        let mut collected = Collected::default();
        let key = |lock: u64, stack_id: i64| tracer_common::StackKey {
            lock,
            stack_id,
            return_ip: 0x1000,
            php_site: 0,
        };
        collected
            .stacks
            .insert(key(0x10, tracer_common::stack_kind::CREATION), 3);
        collected
            .stacks
            .insert(key(0x20, tracer_common::stack_kind::CREATION), 2);
        collected
            .stacks
            .insert(key(0x10, tracer_common::stack_kind::USE), 40);
        let overhead = measure(&collected, &[], None, 0);
        assert_eq!(overhead.init_probe_hits, 5);
        assert_eq!(overhead.probe_hits, 0);
        assert_eq!(
            overhead.estimated_added_ns,
            5 * overhead.cost_ns_per_stepped_hit
        );
    }

    /// `VmHWM` as /proc/self/status writes it; None without the line.
    #[test]
    fn the_peak_rss_is_read_from_vm_hwm() {
        let status =
            "Name:\tlocktrace\nVmPeak:\t  312000 kB\nVmHWM:\t   21344 kB\nVmRSS:\t   20100 kB\n";
        assert_eq!(vm_hwm_kib(status), Some(21_344));
        assert_eq!(vm_hwm_kib("Name:\tx\nVmRSS:\t 1 kB\n"), None);
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(vm_hwm_kib(&own).is_some_and(|kib| kib > 0), "{own}");
    }
}
