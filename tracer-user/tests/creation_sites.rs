//! Issue 49, item 2: creation sites by default. A plain `record` (no
//! `--stacks`) snapshots every lock init call, so a heap mutex created per
//! request is named by where it was created and its addresses are one row,
//! in the all-locks mode and in `--mode inproc` (an init uprobe beside the
//! counting stubs). Real BPF: run as root.
mod common;

use common::*;
use serde_json::Value;

const THREADS: u64 = 2;
const REQUESTS: u64 = 1500;
const USES: u64 = 5;
const SITE: &str = "mutex created in session_open <- handle_request <- worker";

/// `record EXTRA…` over the whole run of `session_locks`: (report, table).
fn record_sessions(extra: &[&str]) -> (Value, String) {
    let binary = fixture("session_locks", Flavor::Glibc);
    let args = [THREADS, REQUESTS, USES].map(|n| n.to_string());
    let mut fixture = Fixture::spawn(&binary, &[&args[0], &args[1], &args[2]]);
    let requests = (THREADS * REQUESTS).to_string();
    let mut tracer_args = vec!["--requests", &requests];
    tracer_args.extend(extra);
    let trace = Trace::attach(fixture.pid(), &tracer_args);
    fixture.start();
    fixture.wait();
    trace.finish()
}

/// Exactly one row named by the session site, with every acquisition of
/// every session (USES per request), one object per request, and no
/// stacks recorded (none was asked for).
fn assert_one_session_row(report: &Value, table: &str, what: &str) {
    let locks = report["locks"].as_array().unwrap();
    let named: Vec<&Value> = locks
        .iter()
        .filter(|lock| {
            lock["name"]
                .as_str()
                .is_some_and(|name| name.starts_with("mutex created in session_open"))
        })
        .collect();
    assert_eq!(named.len(), 1, "{what}: not one session row:\n{table}");
    let row = named[0];
    let objects = THREADS * REQUESTS;
    assert_eq!(row["name"], SITE, "{what}:\n{table}");
    assert_eq!(row["acquisitions"], objects * USES, "{what}:\n{table}");
    assert_eq!(
        row["per_request"]["acquisitions"].as_f64(),
        Some(USES as f64),
        "{what}"
    );
    assert_eq!(row["created"]["by"], "init", "{what}: {row:#}");
    assert_eq!(row["created"]["inits"], objects, "{what}: {row:#}");
    assert_eq!(
        row["created"]["site"][0]["function"], "session_open",
        "{what}"
    );
    // One address per thread at least (each thread's arena); every object.
    let group = &row["group"];
    assert_eq!(group["objects"], objects, "{what}: {row:#}");
    let by_address = group["by_address"].as_array().unwrap();
    let acquired: u64 = by_address
        .iter()
        .map(|a| a["acquisitions"].as_u64().unwrap())
        .sum();
    assert_eq!(acquired, objects * USES, "{what}: {row:#}");
    assert!(
        report["stacks"].as_array().is_none_or(Vec::is_empty),
        "{what}: stacks without --stacks"
    );
    assert_eq!(report["dropped"]["snapshots_lost"], Value::Null, "{what}");
}

/// The default mode: every lock call probed, the init calls snapshotted.
#[test]
fn a_plain_record_names_heap_locks_by_creation_site() {
    let (report, table) = record_sessions(&[]);
    assert_one_session_row(&report, &table, "all locks");
    // The table says so too: the row, by its name.
    assert!(table.contains(SITE), "{table}");
}

/// `--mode inproc`: the stubs count the lock calls, an init uprobe names
/// the locks they counted.
#[test]
fn inproc_names_heap_locks_by_creation_site() {
    let (report, table) = record_sessions(&["--mode", "inproc"]);
    assert_eq!(report["mode"], "inproc", "{table}");
    assert_one_session_row(&report, &table, "inproc");
}
