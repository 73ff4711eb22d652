//! Issue 33: reports of real recordings are valid against the checked-in
//! JSON Schema, docs/schema/report.schema.json (generated from the model
//! types; a unit test fails when it is stale, and
//! `LOCKTRACE_BLESS=1 cargo test -p tracer-user --lib model::schema`
//! rewrites it). Real BPF: root.

use crate::common::*;
use serde_json::Value;

/// The schema file as checked in, which must be the one the model types
/// generate.
fn checked_in_schema() -> Value {
    let path = repo_root().join("docs/schema/report.schema.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        schema,
        *locktrace::model::report_schema().as_value(),
        "docs/schema/report.schema.json is stale: LOCKTRACE_BLESS=1 cargo test -p tracer-user --lib model::schema rewrites it"
    );
    schema
}

/// Fails with every violation, one line each, when `report` (the JSON
/// locktrace wrote, as written) is not valid against the schema.
fn assert_valid(report: &Value, what: &str) {
    let validator = jsonschema::validator_for(&checked_in_schema()).expect("the schema compiles");
    let violations: Vec<String> = validator
        .iter_errors(report)
        .map(|error| format!("{}: {error}", error.instance_path()))
        .collect();
    assert!(
        violations.is_empty(),
        "{what}: the report breaks docs/schema/report.schema.json:\n{}\nreport: {report}",
        violations.join("\n")
    );
}

/// fixtures/locks.c with its global lock contended, recorded with stacks,
/// hold times and a request count: the lock rows carry holds, holders,
/// histograms, per-request figures and creation sites.
#[test]
fn a_recording_with_stacks_and_hold_times_matches_the_schema() {
    let binary = fixture("locks", Flavor::Glibc);
    let (report, _) = trace_fixture(
        &binary,
        &["4", "300", "2000", "20000"],
        &["--stacks", "4", "--hold-times", "--requests", "100"],
    );
    assert_valid(&report, "--stacks 4 --hold-times --requests 100");
    // The parts checked are there, not left out as empty.
    assert_eq!(report["mode"], "all");
    assert!(report["locks"].as_array().is_some_and(|l| !l.is_empty()));
    assert!(report["stacks"].as_array().is_some_and(|s| !s.is_empty()));
    assert!(report["requests"].is_object());
    assert!(report["naming"].is_object());
    let contended = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|lock| lock["contended"].as_u64() > Some(0))
        .expect("a contended lock");
    assert!(contended["holds"].is_object(), "{contended}");
    assert!(contended["per_request"].is_object(), "{contended}");
}

/// Contention mode: no lock probes, so no placement and no acquisitions
/// (nulls the schema must allow).
#[test]
fn a_contention_mode_recording_matches_the_schema() {
    let binary = fixture("locks", Flavor::Glibc);
    let (report, _) = trace_fixture(
        &binary,
        &["4", "300", "0", "20000"],
        &["--mode", "contention"],
    );
    assert_valid(&report, "--mode contention");
    assert_eq!(report["mode"], "contention");
    assert!(report["placement"].is_null());
    assert!(report["totals"]["acquisitions"].is_null());
}

/// Sampled mode: the counts are estimates, described by `estimate`.
#[test]
fn a_sampled_recording_matches_the_schema() {
    let binary = fixture("steady", Flavor::Glibc);
    let (report, _) = trace_fixture(&binary, &["20", "2500"], SAMPLED);
    assert_valid(&report, "--mode sampled");
    assert_eq!(report["mode"], "sampled");
    assert!(report["estimate"].is_object(), "{}", report["estimate"]);
}
