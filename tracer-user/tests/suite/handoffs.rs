//! Issue 32: handoffs, a lock's acquisitions on another CPU than the one
//! before, by cache distance. fixtures/handoffs.c takes one lock in strict
//! alternation from two threads pinned to two CPUs (2N-1 handoffs, all of
//! the class of CPU 0 → CPU 1 on this machine) or to one (none). Real BPF:
//! run as root.

use crate::common::*;
use locktrace::{model::HandoffClass, probe::topology};
use serde_json::Value;

const ROUNDS: u64 = 20_000;

/// The class field of `locks[].handoffs` a move of `class` counts in.
fn field(class: HandoffClass) -> &'static str {
    match class {
        HandoffClass::SameCore => "same_core",
        HandoffClass::SameL3 => "same_l3",
        HandoffClass::OtherL3 => "other_l3",
    }
}

/// Runs the fixture (`two` or `one` CPU, `rounds` each thread) under
/// `record EXTRA…`; returns the report, its table and g_lock's row.
fn trace_handoffs(cpus: &str, rounds: u64, extra: &[&str]) -> (Value, String, Value) {
    trace_handoffs_for(&[cpus, &rounds.to_string()], extra)
}

/// [`trace_handoffs`] with the fixture's arguments as given.
fn trace_handoffs_for(args: &[&str], extra: &[&str]) -> (Value, String, Value) {
    let binary = fixture("handoffs", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, args);
    let trace = Trace::attach(fixture.pid(), extra);
    fixture.start();
    let address = fixture.address("g_lock");
    let output = fixture.wait();
    assert!(output.contains("done"), "{output}");
    let (report, table) = trace.finish();
    let lock = lock_at(&report, address)
        .unwrap_or_else(|| panic!("g_lock not in the report: {report}"))
        .clone();
    (report, table, lock)
}

fn two_cpus() -> bool {
    std::thread::available_parallelism().map_or(0, |n| n.get()) >= 2
}

#[test]
fn two_cpus_alternating_hand_the_lock_over_every_time_but_the_first() {
    assert!(two_cpus(), "the handoff fixture needs CPUs 0 and 1");
    let class = topology::read()
        .class(0, 1)
        .expect("CPU 0 and CPU 1 are two CPUs");
    let (report, table, lock) = trace_handoffs("two", ROUNDS, &["--handoffs"]);
    assert_eq!(lock["acquisitions"], 2 * ROUNDS, "{lock}");
    let handoffs = &lock["handoffs"];
    assert_eq!(handoffs["total"], 2 * ROUNDS - 1, "{lock}");
    assert_eq!(handoffs[field(class)], 2 * ROUNDS - 1, "{lock}");
    for other in HandoffClass::ALL.into_iter().filter(|c| *c != class) {
        assert_eq!(handoffs[field(other)], 0, "{other:?}: {lock}");
    }
    let ns = handoffs["ns_per_handoff"].as_u64().expect("a cost");
    assert!(ns > 0, "{lock}");
    assert_eq!(handoffs["cost_ns"], (2 * ROUNDS - 1) * ns, "{lock}");
    assert!(handoffs["cost_source"].is_string(), "{lock}");
    assert!(report["dropped"].get("handoffs_map_full").is_none());
    assert!(table.contains("handoffs"), "{table}");
}

#[test]
fn one_cpu_alternating_hands_nothing_over() {
    let (_, _, lock) = trace_handoffs("one", ROUNDS, &["--handoffs"]);
    assert_eq!(lock["acquisitions"], 2 * ROUNDS, "{lock}");
    let handoffs = &lock["handoffs"];
    for key in ["total", "same_core", "same_l3", "other_l3", "cost_ns"] {
        assert_eq!(handoffs[key], 0, "{key}: {lock}");
    }
}

#[test]
fn handoffs_are_counted_only_when_asked_for() {
    let (_, _, lock) = trace_handoffs("two", 2_000, &[]);
    assert_eq!(lock["acquisitions"], 4_000, "{lock}");
    assert!(lock.get("handoffs").is_none(), "{lock}");
}

/// Contention mode has no lock probes to count handoffs at: the flag is
/// refused in one line (it was dropped silently before), nothing recorded.
#[test]
fn contention_mode_refuses_handoffs_in_one_line() {
    let binary = fixture("handoffs", Flavor::Glibc);
    let target = Fixture::spawn(&binary, &["two", "2000"]);
    let output = locktrace()
        .args(["record", "--pid", &target.pid().to_string()])
        .args(["--mode", "contention", "--handoffs", "--duration", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(
            "--handoffs is counted at the lock probes, which --mode contention has none of"
        ),
        "{stderr}"
    );
}

/// Sampled mode counts handoffs inside its windows and scales them like the
/// acquisitions. Across a gap between windows an even number of uncounted
/// acquisitions leaves the lock on the CPU it was on: each window may miss
/// one handoff, so the scaled count lies within (windows + 1) × scale of
/// the scaled acquisitions (plus rounding), never above them. On one CPU
/// there are none at all.
#[test]
fn sampled_mode_scales_handoffs_like_acquisitions() {
    assert!(two_cpus(), "the handoff fixture needs CPUs 0 and 1");
    let sampled: Vec<&str> = SAMPLED.iter().copied().chain(["--handoffs"]).collect();
    let (report, _, lock) = trace_handoffs_for(&["two", "0", "2"], &sampled);
    let estimate = &report["estimate"];
    let windows = estimate["windows"].as_f64().expect("windows");
    assert!(windows >= 1.0, "{estimate}");
    let scale = estimate["scale"].as_f64().expect("scale");
    let acquisitions = lock["acquisitions"].as_f64().expect("estimated");
    let handoffs = lock["handoffs"]["total"].as_f64().expect("scaled handoffs");
    assert!(handoffs <= acquisitions + 1.0, "{lock}");
    assert!(
        handoffs >= acquisitions - (windows + 1.0) * scale - 2.0,
        "{lock} {estimate}"
    );
    let (_, _, lock) = trace_handoffs_for(&["one", "0", "2"], &sampled);
    assert_eq!(lock["handoffs"]["total"], 0, "{lock}");
}
