//! Issue 32: how close a lock is to saturation. fixtures/saturation.c holds
//! g_busy a fixed time at a fixed rate (and g_idle a tenth of it):
//! locktrace's utilization must be the truth within ±10%. Real BPF: root.
mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const PERIOD_US: f64 = 1000.0;
const HOLD_US: f64 = 400.0;

fn saturation<'a>(report: &'a Value, name: &str) -> &'a Value {
    let lock = lock_named(report, name).unwrap_or_else(|| panic!("no {name} in {report}"));
    &lock["saturation"]
}

fn within(measured: f64, truth: f64, tolerance: f64) -> bool {
    (measured - truth).abs() <= tolerance * truth
}

/// The fixture runs at its pace before locktrace attaches and after it
/// stops (`--duration`): the whole window is steady.
#[test]
fn utilization_of_a_paced_lock_is_its_hold_share() {
    let binary = fixture("saturation", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["1000", "400"]);
    fixture.start();
    std::thread::sleep(Duration::from_millis(300));
    let probe = format!("{}:tick", binary.display());
    let trace = Trace::attach(
        fixture.pid(),
        &["--hold-times", "--duration", "3", "--request-probe", &probe],
    );
    let (report, table) = trace.finish();
    let context = format!("{table}\n{}", report["locks"]);

    let busy = saturation(&report, "g_busy");
    let truth = HOLD_US / PERIOD_US;
    let utilization = busy["utilization"].as_f64().unwrap();
    assert!(
        within(utilization, truth, 0.10),
        "{utilization} vs {truth}: {context}"
    );
    assert_eq!(busy["model"], "M/D/1", "{context}");
    let mean_hold = busy["mean_hold_ns"].as_f64().unwrap();
    assert!(
        within(mean_hold, HOLD_US * 1e3, 0.10),
        "{mean_hold}: {context}"
    );
    // Requests come at 1000/s: held all the time at 1000 / 0.4 = 2500/s.
    let requests_at_saturation = busy["saturating_requests_per_s"].as_f64().unwrap();
    assert!(
        within(requests_at_saturation, 1e6 / PERIOD_US / truth, 0.10),
        "{requests_at_saturation}: {context}"
    );
    // M/D/1 at ρ = 0.4: ρS / 2(1-ρ) = S/3.
    let predicted = busy["predicted_wait_ns"].as_f64().unwrap();
    assert!(
        within(predicted, mean_hold / 3.0, 0.30),
        "{predicted}: {context}"
    );
    assert!(
        table.contains("saturation: g_busy held 4"),
        "no saturation line for g_busy: {table}"
    );

    let idle = saturation(&report, "g_idle");
    let utilization = idle["utilization"].as_f64().unwrap();
    assert!(
        within(utilization, truth / 10.0, 0.10),
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
