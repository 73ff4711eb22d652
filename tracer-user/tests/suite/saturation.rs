//! Issue 32: how close a lock is to saturation. fixtures/saturation.c holds
//! g_busy a fixed time at a fixed rate (and g_idle half of it):
//! locktrace's utilization must be the truth within ±10%. Real BPF: root.

use std::time::Duration;

use crate::common::*;
use serde_json::Value;

fn saturation<'a>(report: &'a Value, name: &str) -> &'a Value {
    let lock = lock_named(report, name).unwrap_or_else(|| panic!("no {name} in {report}"));
    &lock["saturation"]
}

fn within(measured: f64, truth: f64, tolerance: f64) -> bool {
    (measured - truth).abs() <= tolerance * truth
}

/// What the fixture measured by its own clock: (now, g_busy held, ticks).
fn figures(fixture: &mut Fixture) -> (f64, f64, f64) {
    fixture.send("figures");
    let line = fixture.read_line().expect("the fixture answered");
    let numbers: Vec<f64> = line
        .strip_prefix("figures ")
        .unwrap_or_else(|| panic!("expected figures, got {line:?}"))
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (numbers[0], numbers[1], numbers[2])
}

/// The fixture runs at its pace before locktrace attaches and after it
/// stops (`--duration`): the whole window is steady. The truth is the
/// fixture's own over a span just wider than the window (a busy machine
/// that preempts a hold stretches it). Counting starts as each probe
/// attaches, up to the attach time (0.2-0.3 s) before the window the rates
/// divide by: 10 s keeps that bias under 3%.
#[test]
fn utilization_of_a_paced_lock_is_its_hold_share() {
    let binary = fixture("saturation", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["1000", "400"]);
    fixture.send("go");
    std::thread::sleep(Duration::from_millis(300));
    let probe = format!("{}:tick", binary.display());
    let (start_ns, start_held, start_ticks) = figures(&mut fixture);
    let trace = Trace::attach(
        fixture.pid(),
        &[
            "--hold-times",
            "--duration",
            "10",
            "--request-probe",
            &probe,
        ],
    );
    let (report, table) = trace.finish();
    let (end_ns, end_held, end_ticks) = figures(&mut fixture);
    let truth = (end_held - start_held) / (end_ns - start_ns);
    let mean_hold_truth = (end_held - start_held) / (end_ticks - start_ticks);
    let rate_truth = (end_ticks - start_ticks) / (end_ns - start_ns) * 1e9;
    let context = format!(
        "truth: held {truth:.3}, mean hold {mean_hold_truth:.0} ns, {rate_truth:.0} ticks/s\n{table}\n{}",
        report["locks"]
    );

    let busy = saturation(&report, "g_busy");
    let utilization = busy["utilization"].as_f64().unwrap();
    assert!(within(utilization, truth, 0.10), "{utilization}: {context}");
    assert_eq!(busy["model"], "M/D/1", "{context}");
    let mean_hold = busy["mean_hold_ns"].as_f64().unwrap();
    assert!(
        within(mean_hold, mean_hold_truth, 0.10),
        "{mean_hold}: {context}"
    );
    // Held all the time at the tick rate / utilization (2500/s when quiet).
    let requests_at_saturation = busy["saturating_requests_per_s"].as_f64().unwrap();
    assert!(
        within(requests_at_saturation, rate_truth / truth, 0.10),
        "{requests_at_saturation}: {context}"
    );
    // M/D/1 at ρ: ρS / 2(1-ρ), from locktrace's own ρ and S.
    let predicted = busy["predicted_wait_ns"].as_f64().unwrap();
    let model = utilization * mean_hold / (2.0 * (1.0 - utilization));
    assert!(within(predicted, model, 1e-9), "{predicted}: {context}");
    assert!(
        table.contains("saturation: g_busy held "),
        "no saturation line for g_busy: {table}"
    );

    // g_idle: half g_busy's hold at the same rate, below the 30% line.
    let idle = saturation(&report, "g_idle");
    let utilization = idle["utilization"].as_f64().unwrap();
    assert!(
        within(utilization, truth / 2.0, 0.15),
        "{utilization}: {context}"
    );
    assert!(!table.contains("saturation: g_idle"), "{table}");
}

/// Without hold times there is nothing to saturate: no field, no line.
#[test]
fn no_saturation_without_hold_times() {
    let binary = fixture("saturation", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["1000", "400"]);
    fixture.start();
    let trace = Trace::attach(fixture.pid(), &["--duration", "1"]);
    let (report, table) = trace.finish();
    let busy = lock_named(&report, "g_busy").expect("g_busy counted");
    assert!(busy.get("saturation").is_none(), "{busy}");
    assert!(!table.contains("saturation:"), "{table}");
}
