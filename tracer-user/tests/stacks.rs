//! Issue 30: whole stacks through code built without frame pointers, from
//! stack snapshots unwound with the modules' call-frame information, for
//! lock calls and contended waits, glibc and static musl. The fixture
//! takes its locks along a known chain of 13 frames.
//! Real BPF: run as root.
mod common;

use std::path::PathBuf;

use common::*;
use serde_json::Value;

const REQUESTS: u64 = 2000;
const STATS_USES: u64 = 5;

/// The frames between the lock function and the thread's start, in order.
const CHAIN: [&str; 13] = [
    "take",
    "level10",
    "level9",
    "level8",
    "level7",
    "level6",
    "level5",
    "level4",
    "level3",
    "level2",
    "level1",
    "serve_request",
    "worker",
];

fn sites(flavor: Flavor) -> PathBuf {
    fixture_with(
        "sites",
        flavor,
        &["-fomit-frame-pointer", "-fno-optimize-sibling-calls"],
    )
}

fn stacks_of(report: &Value, lock: u64) -> Vec<&Value> {
    let lock = format!("{lock:#x}");
    report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|stack| stack["lock"] == lock.as_str())
        .collect()
}

/// True when `frames` holds the fixture's whole chain right after the
/// lock function.
fn has_chain_after_lock_call(frames: &[String]) -> bool {
    let Some(at) = frames
        .iter()
        .position(|f| f.contains("pthread_mutex_lock") || f.contains("pthread_mutex_timedlock"))
    else {
        return false;
    };
    frames.len() > at + CHAIN.len() && frames[at + 1..=at + CHAIN.len()] == CHAIN
}

/// Every lock call of the stats mutex has the whole chain, and the counts
/// of its stacks add up to the exact number of calls.
#[test]
fn lock_call_stacks_are_whole_without_frame_pointers() {
    for flavor in [Flavor::Glibc, Flavor::MuslStatic] {
        let binary = sites(flavor);
        let args = ["1".to_string(), REQUESTS.to_string()];
        let (report, addresses) =
            trace_fixture(&binary, &[&args[0], &args[1]], &["--stacks", "64"]);
        let stats = addresses["stats"][0];
        let row = lock_at(&report, stats).unwrap_or_else(|| panic!("{flavor:?}: no stats row"));
        assert_eq!(row["acquisitions"], STATS_USES * REQUESTS, "{flavor:?}");
        let stacks = stacks_of(&report, stats);
        assert!(!stacks.is_empty(), "{flavor:?}: no stacks");
        for stack in &stacks {
            let frames = frame_functions(stack);
            assert_eq!(frames[0], "pthread_mutex_lock", "{flavor:?}: {frames:?}");
            assert_eq!(frames[1..=CHAIN.len()], CHAIN, "{flavor:?}: {frames:?}");
            assert_eq!(stack["unwound_by"], "call_frame_info", "{flavor:?}");
        }
        let counted: u64 = stacks.iter().map(|s| s["count"].as_u64().unwrap()).sum();
        assert_eq!(counted, STATS_USES * REQUESTS, "{flavor:?}");
    }
}

/// The futex waits of the contended stats mutex (two threads) have the
/// whole chain under the lock function, and their stacks count every
/// contended wait of the row.
#[test]
fn contended_wait_stacks_are_whole_without_frame_pointers() {
    let binary = sites(Flavor::Glibc);
    let (report, addresses) = trace_fixture(&binary, &["2", "20000"], &["--stacks", "64"]);
    let stats = addresses["stats"][0];
    let row = lock_at(&report, stats).unwrap_or_else(|| panic!("no stats row"));
    assert_eq!(row["acquisitions"], 2 * STATS_USES * 20000);
    let contended = row["contended"].as_u64().unwrap();
    assert!(contended > 0, "two threads never contended: {row:#}");
    let waits: Vec<&Value> = stacks_of(&report, stats)
        .into_iter()
        .filter(|stack| !frame_functions(stack)[0].contains("pthread_mutex"))
        .collect();
    for stack in &waits {
        let frames = frame_functions(stack);
        assert!(has_chain_after_lock_call(&frames), "{frames:?}");
    }
    let counted: u64 = waits.iter().map(|s| s["count"].as_u64().unwrap()).sum();
    assert_eq!(counted, contended);
}

/// The connection mutexes (created per request in `conn_create` at a
/// reused address, one address per thread) are named by their creation
/// site, which counts every init; the stats mutex (zeroed memory, no init
/// call) is created "first used"; `compare` of two runs matches the
/// connections' rows by their site (addresses differ between runs).
#[test]
fn locks_are_named_by_where_they_were_created() {
    const THREADS: u64 = 2;
    let binary = sites(Flavor::Glibc);
    let site = "mutex created in conn_create <- serve_request <- worker";
    let dir = tempfile::tempdir().unwrap();
    let requests = (THREADS * REQUESTS).to_string();
    let mut saved = Vec::new();
    for run in ["before", "after"] {
        let json = dir.path().join(format!("{run}.json"));
        let mut fixture = Fixture::spawn(&binary, &[&THREADS.to_string(), &REQUESTS.to_string()]);
        let trace = Trace::attach(fixture.pid(), &["--stacks", "8", "--requests", &requests]);
        fixture.start();
        let stats = fixture.address("stats");
        fixture.wait();
        let (report, table) = trace.finish_keep(&json);
        let locks = report["locks"].as_array().unwrap();
        let connections: Vec<&Value> = locks.iter().filter(|l| l["name"] == site).collect();
        assert!(
            !connections.is_empty(),
            "{run}: no row named {site}:\n{table}"
        );
        let acquired: u64 = connections
            .iter()
            .map(|l| l["acquisitions"].as_u64().unwrap())
            .sum();
        assert_eq!(acquired, 3 * THREADS * REQUESTS, "{run}:\n{table}");
        let inits: u64 = connections
            .iter()
            .map(|l| l["created"]["inits"].as_u64().unwrap())
            .sum();
        assert_eq!(inits, THREADS * REQUESTS, "{run}:\n{table}");
        for connection in &connections {
            assert_eq!(connection["created"]["by"], "init");
            assert_eq!(connection["created"]["site"][0]["function"], "conn_create");
        }
        let stats = lock_at(&report, stats).unwrap_or_else(|| panic!("{run}: no stats row"));
        assert_eq!(stats["created"]["by"], "first_use", "{run}: {stats:#}");
        assert_eq!(stats["created"]["site"][0]["function"], "take", "{run}");
        saved.push(json);
    }
    let compared = locktrace().arg("compare").args(&saved).output().unwrap();
    let text = String::from_utf8_lossy(&compared.stdout);
    let row = text
        .lines()
        .find(|line| line.contains(site))
        .unwrap_or_else(|| panic!("compare has no row for {site}:\n{text}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    // One row per address on each side (a thread's connections reuse one).
    let (before, after) = cells[1].split_once('/').unwrap();
    assert!(before != "0" && after != "0", "{text}");
    assert_eq!((cells[2], cells[3]), ("3.0", "3.0"), "{text}");
}
