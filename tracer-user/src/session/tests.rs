use std::collections::HashMap;

use tracer_common::{LockCounts, LockOp, names};

use super::*;
use crate::trace::maps::FakeMaps;

/// No wait in progress and no unmap: what a fresh object reads as.
impl Reads for FakeMaps {
    fn in_flight(&self, _pid: u32, before: &WaitsBeforeAttach) -> InFlight {
        InFlight {
            attached_ns: before.attached_ns,
            ..InFlight::default()
        }
    }

    fn lifetimes(&self) -> Result<Lifetimes> {
        Ok(Lifetimes::default())
    }
}

const LOCK: u64 = 0x1000;

fn reader(cpu_hz: u64) -> Reader {
    Reader {
        pid: 1,
        waits_before: WaitsBeforeAttach {
            attached_ns: 42,
            blocked: Vec::new(),
        },
        cpu_hz,
    }
}

fn plan(view: View, mode: Mode, features: &[Feature]) -> Plan {
    let asked: Vec<(Feature, bool)> = features.iter().map(|f| (*f, true)).collect();
    Plan::new(view, mode, &asked).unwrap()
}

fn point() -> RequestProbePoint {
    RequestProbePoint {
        module: "/srv/app".into(),
        file_offset: 0x40,
    }
}

/// A snapshot is the maps' counts, what the caller adds, the waits in
/// progress since the probes went in, and the sampler's rate.
#[test]
fn a_read_is_the_maps_counts_plus_what_the_caller_adds() {
    let mut counts = LockCounts::default();
    counts.calls[LockOp::MutexLock as usize] = 7;
    let maps = FakeMaps::loaded()
        .with(names::MAP_LOCKS, HashMap::from([(LOCK, counts)]))
        .with_per_cpu(names::MAP_REQUESTS, 0, vec![3, 4]);
    let collected = reader(99)
        .read(&maps, |collected| {
            // The stubs' counts, as the live views add them.
            collected.locks.entry(LOCK).or_default().calls[LockOp::MutexLock as usize] += 5;
        })
        .unwrap();
    assert_eq!(collected.locks[&LOCK].calls[LockOp::MutexLock as usize], 12);
    assert_eq!(collected.locks.len(), 1);
    assert_eq!(collected.requests, 7);
    assert_eq!(collected.cpu_hz, 99);
    assert_eq!(collected.in_flight.attached_ns, 42);
}

/// A map missing from the object is said by name, not read as empty.
#[test]
fn a_read_of_a_broken_object_names_the_missing_map() {
    let error = reader(0).read(&FakeMaps::default(), |_| {}).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("BPF object lacks map {}", names::MAP_CALLERS)
    );
}

/// Reads carry the CPU rate asked for, or 0 when the sampler is off,
/// whether `--no-cpu` or the kernel refused it.
#[test]
fn the_cpu_rate_is_zero_when_the_sampler_is_off() {
    assert_eq!(cpu_hz(Some(99), None), 99);
    assert_eq!(cpu_hz(Some(99), Some("perf_event_open: ENOENT")), 0);
    assert_eq!(cpu_hz(None, None), 0);
}

/// The BPF flags follow the plan's features, one bit each.
#[test]
fn the_flags_are_the_plans_features() {
    assert_eq!(bpf_flags(&plan(View::Record, Mode::All, &[])), 0);
    assert_eq!(
        bpf_flags(&plan(
            View::Record,
            Mode::All,
            &[
                Feature::Stacks,
                Feature::HoldTimes,
                Feature::Handoffs,
                Feature::Php,
            ]
        )),
        flags::STACKS | flags::HOLDS | flags::HANDOFFS | flags::PHP
    );
    assert_eq!(
        bpf_flags(&plan(View::Record, Mode::Sampled, &[Feature::Stacks])),
        flags::SAMPLED | flags::STACKS
    );
    assert_eq!(
        bpf_flags(&plan(View::Live, Mode::All, &[Feature::Php])),
        flags::PHP
    );
}

/// Every mode under both views: whether lock probes go in at load, where
/// the request probe is attached, and what only `record` traces.
#[test]
fn the_load_plan_follows_the_mode_and_the_view() {
    let target = Target::open(std::process::id()).unwrap();
    let waits = WaitFunctions::default();
    let no_functions: Vec<Placed> = Vec::new();
    let probed = Probed {
        target: &target,
        placed: &no_functions,
        waits: &waits,
        unlocks: &[],
        lock_code: &[],
    };
    let sampling = CpuSampling {
        hz: 99,
        lock_code: Vec::new(),
    };
    // (view, mode): lock probes, request probe at load, kernel locks, creation sites.
    let table = [
        (View::Record, Mode::All, true, true, true, true),
        (View::Record, Mode::Contention, false, true, true, false),
        (View::Record, Mode::Sampled, false, false, true, false),
        (View::Record, Mode::Inproc, false, true, true, true),
        (View::Live, Mode::All, true, true, true, false),
        (View::Live, Mode::Contention, false, true, true, false),
        (View::Live, Mode::Inproc, false, true, true, false),
    ];
    for (view, mode, lock_probes, request_at_load, kernel_locks, sites) in table {
        // `--no-kernel-locks` leaves them out in every mode and view.
        let without = plan(view, mode, &[]);
        let load = Stage::Load {
            cpu: Some(&sampling),
            inproc: None,
        };
        assert!(!load_plan(&without, probed, Some(point()), load).kernel_locks);
        let plan = plan(view, mode, &[Feature::KernelLocks]);
        let load = Stage::Load {
            cpu: Some(&sampling),
            inproc: None,
        };
        let loaded = load_plan(&plan, probed, Some(point()), load);
        assert_eq!(loaded.lock_probes, lock_probes, "{view:?} {mode:?}");
        assert_eq!(
            loaded.request_probe.is_some(),
            request_at_load,
            "{view:?} {mode:?}"
        );
        assert_eq!(loaded.kernel_locks, kernel_locks, "{view:?} {mode:?}");
        assert_eq!(loaded.creation_sites, sites, "{view:?} {mode:?}");
        assert_eq!(loaded.cpu.map(|cpu| cpu.hz), Some(99));
        // Following the main thread: the user probes, the request probe
        // in every mode, never the sampler.
        let follow = load_plan(&plan, probed, Some(point()), Stage::Follow);
        assert_eq!(follow.request_probe, Some(point()), "{view:?} {mode:?}");
        assert!(follow.cpu.is_none());
        assert_eq!(follow.lock_probes, lock_probes);
    }
}

fn placed(op: LockOp) -> Placed {
    let function = crate::probe::lockfuncs::LockFunction {
        op,
        module: "/lib/libc.so.6".into(),
        file_offset: 0x100,
        code: Vec::new(),
        runtime_start: 0x7000_0100,
        runtime_end: 0x7000_0200,
        found_by: crate::probe::lockfuncs::FoundBy::Symbol,
    };
    let points = crate::probe::placement::PlacedFunction {
        points: Vec::new(),
        fallback_reason: None,
    };
    (function, points)
}

/// In inproc mode lock probes go in only for the functions no stub
/// counts: none left means none attached.
#[test]
fn inproc_probes_only_what_the_stubs_leave() {
    let prepared = Prepared {
        target: Target::open(std::process::id()).unwrap(),
        functions: Vec::new(),
        placed: vec![placed(LockOp::MutexLock), placed(LockOp::MutexTrylock)],
        waits: WaitFunctions::default(),
        unlocks: Vec::new(),
        lock_code: Vec::new(),
    };
    let left = prepared.probing_only(&[LockOp::MutexTrylock]);
    let ops: Vec<LockOp> = left.placed.iter().map(|(f, _)| f.op).collect();
    assert_eq!(ops, [LockOp::MutexTrylock]);
    assert!(lock_probes(Mode::Inproc, &left.placed));
    let none = left.probing_only(&[]);
    assert!(none.placed.is_empty());
    assert!(!lock_probes(Mode::Inproc, &none.placed));
    assert!(lock_probes(Mode::All, &none.placed));
    assert!(!lock_probes(Mode::Sampled, &none.placed));
    assert!(!lock_probes(Mode::Contention, &none.placed));
}
