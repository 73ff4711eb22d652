//! Issue 49, item 2: creation sites by default. A plain `record` (no
//! `--stacks`) snapshots every lock init call, so a heap mutex created per
//! request is named by where it was created and its addresses are one row,
//! in the all-locks mode and in `--mode inproc` (an init uprobe beside the
//! counting stubs). Real BPF: run as root.

use crate::common::*;
use serde_json::Value;

const THREADS: u64 = 2;
const REQUESTS: u64 = 1500;
const USES: u64 = 5;
const SITE: &str = "mutex created in session_open <- handle_request <- worker";

/// `record EXTRA…` over the whole run of `session_locks` (`keep`: its
/// sessions kept, a new address each): (report, table).
fn record_sessions(extra: &[&str], keep: bool) -> (Value, String) {
    let binary = fixture("session_locks", Flavor::Glibc);
    let args = [THREADS, REQUESTS, USES].map(|n| n.to_string());
    let mut fixture_args = vec![args[0].as_str(), &args[1], &args[2]];
    if keep {
        fixture_args.push("keep");
    }
    let mut fixture = Fixture::spawn(&binary, &fixture_args);
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
    let named = frankenphp::rows_named_starting(report, "mutex created in session_open");
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
}

/// The default mode: every lock call probed, the init calls snapshotted.
#[test]
fn a_plain_record_names_heap_locks_by_creation_site() {
    let (report, table) = record_sessions(&[], false);
    assert_one_session_row(&report, &table, "all locks");
    assert_eq!(report["dropped"]["snapshots_lost"], Value::Null);
    // The table says so too: the row, by its name.
    assert!(table.contains(SITE), "{table}");
}

/// `--mode inproc`: the stubs count the lock calls, an init uprobe names
/// the locks they counted.
#[test]
fn inproc_names_heap_locks_by_creation_site() {
    let (report, table) = record_sessions(&["--mode", "inproc"], false);
    assert_eq!(report["mode"], "inproc", "{table}");
    assert_one_session_row(&report, &table, "inproc");
}

/// Sessions kept (a new address per request): every init is a new key's
/// first count and sends a snapshot, faster than the reader drains them on
/// this machine, so some are lost; their locks take the one path their
/// init call was seen on, and the site is still one row, exact.
#[test]
fn lost_init_snapshots_keep_one_row() {
    let (report, table) = record_sessions(&[], true);
    assert_one_session_row(&report, &table, "sessions kept");
    let by_address = report["locks"][0]["group"]["by_address"]
        .as_array()
        .map_or(0, Vec::len) as u64;
    assert_eq!(by_address, THREADS * REQUESTS, "{table}");
    assert_eq!(report["overhead"]["init_probe_hits"], THREADS * REQUESTS);
    eprintln!("snapshots lost: {}", report["dropped"]["snapshots_lost"]);
}

/// A burst of new stack keys, as a PHP server's per-connection locks make:
/// `keep` sessions (a new mutex, so new keys, per request) taken 8
/// times each, with `--stacks`. Each key's first 8 counts are due a snapshot
/// of 36 KiB: 3,600 of them (400 sessions' 8 and their 400 inits) in a few
/// ms overflowed the 32 MiB ring (about 900) and lost 53-54, a session's
/// every one among them (its calls showed `session_touch` alone).
/// Later snapshots of a key now give way to first ones: none is lost,
/// every session's calls have their whole stack and every object its site.
#[test]
fn a_burst_of_new_stack_keys_loses_no_snapshot() {
    const BURST: u64 = 200;
    const USES: u64 = 8;
    let binary = fixture("session_locks", Flavor::Glibc);
    let args = [THREADS, BURST, USES].map(|n| n.to_string());
    let mut target = Fixture::spawn(&binary, &[&args[0], &args[1], &args[2], "keep"]);
    let requests = (THREADS * BURST).to_string();
    let trace = Trace::attach(
        target.pid(),
        &["--requests", &requests, "--stacks", "10000"],
    );
    target.start();
    target.wait();
    let (report, table) = trace.finish();
    let dropped = &report["dropped"];
    eprintln!("dropped: {dropped}");
    assert_eq!(dropped["snapshots_lost"], Value::Null, "{dropped}\n{table}");
    let sessions = frankenphp::rows_named_starting(&report, "mutex created in session_open");
    assert_eq!(sessions.len(), 1, "{table}");
    assert_eq!(sessions[0]["name"], SITE, "{table}");
    assert_eq!(
        sessions[0]["acquisitions"],
        THREADS * BURST * USES,
        "{table}"
    );
    assert_eq!(sessions[0]["created"]["inits"], THREADS * BURST, "{table}");
    // One stack: every key's calls unwound through the fixture's frames.
    let touching: Vec<&Value> = report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            s["source"] == "lock_calls" && s["frames"].to_string().contains("session_touch")
        })
        .collect();
    assert_eq!(touching.len(), 1, "{table}");
    assert_eq!(touching[0]["count"], THREADS * BURST * USES, "{table}");
    let functions: Vec<&str> = touching[0]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["function"].as_str())
        .collect();
    assert_eq!(
        functions[..4],
        [
            "pthread_mutex_lock",
            "session_touch",
            "handle_request",
            "worker"
        ],
        "{table}"
    );
}
