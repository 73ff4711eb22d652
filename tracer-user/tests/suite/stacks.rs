//! Issue 30: whole stacks through code built without frame pointers, from
//! stack snapshots unwound with the modules' call-frame information, for
//! lock calls and contended waits, glibc and static musl. The fixture
//! takes its locks along a known chain of 13 frames.
//! Real BPF: run as root.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
};

use crate::common::*;
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

/// The stacks of lock calls and waits of `lock` (not of CPU samples).
fn stacks_of(report: &Value, lock: u64) -> Vec<&Value> {
    let lock = format!("{lock:#x}");
    report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|stack| stack["lock"] == lock.as_str() && !is_cpu_stack(stack))
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

/// Flags that leave the fixture's own functions without `.eh_frame`: their
/// call-frame information is only in `.debug_frame` (the C runtime's
/// `_start` and PLT keep theirs in `.eh_frame`).
const DEBUG_FRAME_ONLY: [&str; 4] = [
    "-fomit-frame-pointer",
    "-fno-optimize-sibling-calls",
    "-fno-asynchronous-unwind-tables",
    "-fno-unwind-tables",
];

/// The sections of an ELF file, by name.
fn section_names(binary: &Path) -> Vec<String> {
    let output = Command::new("readelf")
        .args(["-SW"])
        .arg(binary)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .filter(|word| word.starts_with('.'))
        .map(str::to_string)
        .collect()
}

/// `binary` stripped of its debug sections (`.debug_frame` with them),
/// with a `.gnu_debuglink` to a debug file next to it that keeps them.
fn with_separate_debug_file(binary: &Path) -> PathBuf {
    let stripped = binary.with_extension("stripped");
    let debug = binary.with_extension("debug");
    let objcopy = |args: &[&OsStr]| {
        let status = Command::new("objcopy").args(args).status().unwrap();
        assert!(status.success(), "objcopy {args:?}");
    };
    objcopy(&[
        "--only-keep-debug".as_ref(),
        binary.as_ref(),
        debug.as_ref(),
    ]);
    let link = format!("--add-gnu-debuglink={}", debug.display());
    objcopy(&[
        "--strip-debug".as_ref(),
        link.as_ref(),
        binary.as_ref(),
        stripped.as_ref(),
    ]);
    assert!(!section_names(&stripped).contains(&".debug_frame".to_string()));
    assert!(section_names(&debug).contains(&".debug_frame".to_string()));
    stripped
}

/// Code whose call-frame information is only in `.debug_frame`, in the
/// binary itself or in its separate debug file: every lock call of the
/// stats mutex still has the whole chain, frame by frame.
#[test]
fn lock_call_stacks_are_whole_from_debug_frame() {
    for flavor in [Flavor::Glibc, Flavor::MuslStatic] {
        let binary = fixture_with("sites", flavor, &DEBUG_FRAME_ONLY);
        assert!(section_names(&binary).contains(&".debug_frame".to_string()));
        for (how, binary) in [
            ("own .debug_frame", binary.clone()),
            (
                "debug file's .debug_frame",
                with_separate_debug_file(&binary),
            ),
        ] {
            let args = ["1".to_string(), REQUESTS.to_string()];
            let (report, addresses) =
                trace_fixture(&binary, &[&args[0], &args[1]], &["--stacks", "64"]);
            let stats = addresses["stats"][0];
            let row = lock_at(&report, stats)
                .unwrap_or_else(|| panic!("{flavor:?}, {how}: no stats row"));
            assert_eq!(
                row["acquisitions"],
                STATS_USES * REQUESTS,
                "{flavor:?}, {how}"
            );
            let stacks = stacks_of(&report, stats);
            assert!(!stacks.is_empty(), "{flavor:?}, {how}: no stacks");
            for stack in &stacks {
                let frames = frame_functions(stack);
                assert_eq!(
                    frames[0], "pthread_mutex_lock",
                    "{flavor:?}, {how}: {frames:?}"
                );
                assert_eq!(
                    frames[1..=CHAIN.len()],
                    CHAIN,
                    "{flavor:?}, {how}: {frames:?}"
                );
            }
            let counted: u64 = stacks.iter().map(|s| s["count"].as_u64().unwrap()).sum();
            assert_eq!(counted, STATS_USES * REQUESTS, "{flavor:?}, {how}");
        }
    }
}

/// The futex waits of the contended stats mutex (two threads) have the
/// whole chain under the lock function, and their stacks count every
/// contended wait of the row. Whether two threads ever contend is up to the
/// scheduler (under the probes' cost they may take turns): up to three runs.
#[test]
fn contended_wait_stacks_are_whole_without_frame_pointers() {
    let binary = sites(Flavor::Glibc);
    let mut attempts = 0;
    let (report, stats, contended) = loop {
        attempts += 1;
        let (report, addresses) = trace_fixture(&binary, &["2", "20000"], &["--stacks", "64"]);
        let stats = addresses["stats"][0];
        let row = lock_at(&report, stats).unwrap_or_else(|| panic!("no stats row"));
        assert_eq!(row["acquisitions"], 2 * STATS_USES * 20000);
        let contended = row["contended"].as_u64().unwrap();
        if contended > 0 {
            break (report, stats, contended);
        }
        assert!(
            attempts < 3,
            "two threads never contended in 3 runs: {row:#}"
        );
    };
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
/// site and, by default, are ONE row: every connection's acquisitions
/// (3 per request), one object per request, each address's figures in
/// `group.by_address`. With `--group-by address` they are a row per
/// address adding up to the same. The stats mutex (zeroed memory, no init
/// call) is created "first used" and keeps its own row. `compare` matches
/// the site's rows across runs (addresses differ), grouped or not, and
/// `report --group-by site` turns the per-address rows into the one row.
#[test]
fn locks_are_named_and_grouped_by_where_they_were_created() {
    const THREADS: u64 = 2;
    let binary = sites(Flavor::Glibc);
    let site = "mutex created in conn_create <- serve_request <- worker";
    let dir = tempfile::tempdir().unwrap();
    let requests = (THREADS * REQUESTS).to_string();
    // Each run's JSON, and the addresses its connections were at.
    let mut saved = Vec::new();
    for (run, extra) in [
        ("first", None),
        ("second", None),
        ("by_address", Some("address")),
    ] {
        let json = dir.path().join(format!("{run}.json"));
        let mut fixture = Fixture::spawn(&binary, &[&THREADS.to_string(), &REQUESTS.to_string()]);
        let mut args = vec!["--stacks", "8", "--requests", &requests];
        if let Some(how) = extra {
            args.extend(["--group-by", how]);
        }
        let trace = Trace::attach(fixture.pid(), &args);
        fixture.start();
        let stats = fixture.address("stats");
        fixture.wait();
        let (report, table) = trace.finish_keep(&json);
        let locks = report["locks"].as_array().unwrap();
        let connections: Vec<&Value> = locks.iter().filter(|l| l["name"] == site).collect();
        let addresses = if extra.is_none() {
            assert_one_row_per_site(&report, &connections, THREADS * REQUESTS, &table);
            connections[0]["group"]["addresses"].as_u64().unwrap()
        } else {
            assert_rows_per_address(&connections, THREADS * REQUESTS, &table);
            connections.len() as u64
        };
        let stats = lock_at(&report, stats).unwrap_or_else(|| panic!("{run}: no stats row"));
        assert_eq!(stats["created"]["by"], "first_use", "{run}: {stats:#}");
        assert_eq!(stats["created"]["site"][0]["function"], "take", "{run}");
        assert!(stats.get("group").is_none(), "{run}: {stats:#}");
        saved.push((json, addresses));
    }
    // Grouped on both sides, and grouped against per address: one row,
    // 3.0 per request, `locks` counting the addresses on each side.
    for (before, after) in [(&saved[0], &saved[1]), (&saved[0], &saved[2])] {
        let row = compare_row_of(&before.0, &after.0, site);
        let locks = format!("{}/{}", before.1, after.1);
        assert_eq!(row[1..4], [locks.as_str(), "3.0", "3.0"], "{row:?}");
        assert_compare_shows_call_paths(&before.0, &after.0, site);
    }
    // The per-address rows, grouped by `report`: the one row's sum.
    let regrouped = locktrace()
        .arg("report")
        .arg(&saved[2].0)
        .args(["--group-by", "site", "--wide"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&regrouped.stdout);
    let rows: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with(&format!(" {site} ")))
        .collect();
    assert_eq!(rows.len(), 1, "{text}");
    let cells: Vec<&str> = rows[0].split('|').map(str::trim).collect();
    assert_eq!(cells[2], (3 * THREADS * REQUESTS).to_string(), "{text}");
}

/// Default grouping: exactly one row for the site, with the fixture's
/// sums, its objects and its addresses' figures adding up to the row.
fn assert_one_row_per_site(report: &Value, rows: &[&Value], objects: u64, table: &str) {
    assert_eq!(rows.len(), 1, "not one row per creation site:\n{table}");
    let row = rows[0];
    assert_eq!(row["acquisitions"], 3 * objects, "{table}");
    assert_eq!(row["per_request"]["acquisitions"], 3.0, "{table}");
    assert_eq!(row["created"]["by"], "init");
    assert_eq!(row["created"]["site"][0]["function"], "conn_create");
    assert_eq!(row["created"]["inits"], objects, "{row:#}");
    let group = &row["group"];
    assert_eq!(group["objects"], objects, "{row:#}");
    let by_address = group["by_address"].as_array().unwrap();
    assert_eq!(group["addresses"], by_address.len() as u64, "{row:#}");
    let sum = |field: &str| -> u64 { by_address.iter().map(|a| a[field].as_u64().unwrap()).sum() };
    assert_eq!(sum("acquisitions"), 3 * objects, "{row:#}");
    assert_eq!(sum("inits"), objects, "{row:#}");
    assert_eq!(sum("contended"), row["contended"].as_u64().unwrap());
    // The addresses' stacks are the row's: whole chains, counting every call.
    let stacks: Vec<&Value> = report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|stack| stack["lock"] == row["address"] && !is_cpu_stack(stack))
        .collect();
    let counted: u64 = stacks.iter().map(|s| s["count"].as_u64().unwrap()).sum();
    assert_eq!(
        counted,
        3 * objects + row["contended"].as_u64().unwrap(),
        "{table}"
    );
    let covered: Vec<u64> = by_address
        .iter()
        .map(|a| {
            u64::from_str_radix(a["address"].as_str().unwrap().trim_start_matches("0x"), 16)
                .unwrap()
        })
        .collect();
    for stack in report["stacks"].as_array().unwrap() {
        let lock =
            u64::from_str_radix(stack["lock"].as_str().unwrap().trim_start_matches("0x"), 16)
                .unwrap();
        assert!(
            stack["lock"] == row["address"] || !covered.contains(&lock),
            "{stack:#}"
        );
    }
}

/// `--group-by address`: a row per address, no group, the same sums.
fn assert_rows_per_address(rows: &[&Value], objects: u64, table: &str) {
    assert!(!rows.is_empty(), "no row named by the site:\n{table}");
    let acquired: u64 = rows
        .iter()
        .map(|l| l["acquisitions"].as_u64().unwrap())
        .sum();
    assert_eq!(acquired, 3 * objects, "{table}");
    let inits: u64 = rows
        .iter()
        .map(|l| l["created"]["inits"].as_u64().unwrap())
        .sum();
    assert_eq!(inits, objects, "{table}");
    for row in rows {
        assert!(row.get("group").is_none(), "{row:#}");
        assert_eq!(row["created"]["site"][0]["function"], "conn_create");
    }
}

/// `compare BEFORE AFTER`'s stdout, with `extra` arguments.
fn compare_text(before: &Path, after: &Path, extra: &[&str]) -> String {
    let compared = locktrace()
        .arg("compare")
        .arg(before)
        .arg(after)
        .args(extra)
        .output()
        .unwrap();
    String::from_utf8_lossy(&compared.stdout).into_owned()
}

/// `compare`'s call-path section (both runs recorded with `--stacks`):
/// the connection mutexes (3 per request) and the stats and cache mutexes
/// (one identity: first used in `take`, created before attach; 5 + 2 per
/// request) each taken along the fixture's whole chain, the same per
/// request before and after.
fn assert_compare_shows_call_paths(before: &Path, after: &Path, site: &str) {
    // Every lock: the run-to-run noise of the loader's locks (a call or
    // two) would rank them above the unchanged ones.
    let text = compare_text(before, after, &["--wide", "--paths-of", "10"]);
    let section: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("call paths"))
        .collect();
    let chain: Vec<&str> = CHAIN.iter().rev().copied().collect();
    let chain = format!("{};", chain.join(";"));
    for (header, per_request) in [
        (site, "3.0"),
        ("mutex first used in take <- level10 <- level9", "7.0"),
    ] {
        let header = format!("{header}: {per_request} -> {per_request} per request");
        let at = section
            .iter()
            .position(|line| line.ends_with(&header))
            .unwrap_or_else(|| panic!("no call paths for {header}:\n{text}"));
        // The lock's paths, up to the next lock's header.
        let paths: Vec<&str> = section[at + 1..]
            .iter()
            .take_while(|line| line.starts_with(' '))
            .copied()
            .collect();
        let path = paths
            .iter()
            .find(|line| line.contains(&chain))
            .unwrap_or_else(|| panic!("no path through {chain} for {header}:\n{text}"));
        let cells: Vec<&str> = path.split_whitespace().collect();
        assert_eq!(cells[..3], [per_request, per_request, "+0.0"], "{text}");
    }
}

/// The cells of `compare BEFORE AFTER`'s row for `identity`.
fn compare_row_of(before: &Path, after: &Path, identity: &str) -> Vec<String> {
    let text = compare_text(before, after, &[]);
    let row = text
        .lines()
        .find(|line| line.contains(identity))
        .unwrap_or_else(|| panic!("compare has no row for {identity}:\n{text}"));
    row.split('|').map(|cell| cell.trim().to_string()).collect()
}

/// True for the frames a CPU sample of a mutex starts in: glibc's lock
/// functions and slow paths (the sampler's lock code), or the kernel's
/// futex path.
fn in_lock_code(function: &str) -> bool {
    function == "[kernel] futex"
        || function.contains("pthread_mutex_")
        || function.starts_with("__lll_")
}

/// CPU samples' stacks (issue 30: "where stacks are taken: … CPU
/// samples"). Two threads contend for the stats mutex with the sampler at
/// a high rate and `--stacks`: the lock gets stacks of CPU samples
/// (`source: cpu_samples`), each starting in glibc's lock code or the
/// kernel's futex path and reaching the fixture's whole chain through code
/// without frame pointers, and their counts add up exactly to the row's
/// lock-code samples (`cpu_ns` / the sampling period). The lock calls'
/// stacks still add up to the acquisitions, and the folded output keeps
/// the samples under a root frame of their own.
#[test]
fn cpu_sample_stacks_reach_the_chain_and_add_up_to_the_samples() {
    const THREADS: u64 = 2;
    const REQUESTS: u64 = 40_000;
    const HZ: u64 = 4999;
    let binary = sites(Flavor::Glibc);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("cpu.json");
    let mut fixture = Fixture::spawn(&binary, &[&THREADS.to_string(), &REQUESTS.to_string()]);
    let trace = Trace::attach(
        fixture.pid(),
        &["--stacks", "1000", "--cpu-hz", &HZ.to_string()],
    );
    fixture.start();
    let stats = fixture.address("stats");
    fixture.wait();
    let (report, table) = trace.finish_keep(&json);
    let row = lock_at(&report, stats).unwrap_or_else(|| panic!("no stats row:\n{table}"));
    assert_eq!(row["acquisitions"], THREADS * STATS_USES * REQUESTS);
    assert_eq!(report["cpu"]["sample_hz"], HZ);
    let period = 1_000_000_000 / HZ;
    let samples = row["cpu_ns"].as_u64().unwrap() / period;
    assert!(
        samples > 0,
        "no lock-code samples of the stats mutex:\n{table}"
    );
    let address = format!("{stats:#x}");
    let cpu: Vec<&Value> = report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|stack| stack["lock"] == address.as_str() && is_cpu_stack(stack))
        .collect();
    assert!(!cpu.is_empty(), "no CPU-sample stacks:\n{table}");
    let mut in_kernel = 0;
    for stack in &cpu {
        let frames = frame_functions(stack);
        assert_eq!(stack["unwound_by"], "call_frame_info", "{frames:?}");
        let take = frames
            .iter()
            .position(|f| f == "take")
            .unwrap_or_else(|| panic!("no `take` in {frames:?}"));
        assert!(take > 0, "{frames:?}");
        assert!(
            frames[..take].iter().all(|f| in_lock_code(f)),
            "not in lock code: {frames:?}"
        );
        assert_eq!(frames[take..take + CHAIN.len()], CHAIN, "{frames:?}");
        if frames[0] == "[kernel] futex" {
            in_kernel += stack["count"].as_u64().unwrap();
        }
    }
    let counted: u64 = cpu.iter().map(|s| s["count"].as_u64().unwrap()).sum();
    assert_eq!(counted, samples, "{table}");
    eprintln!("{counted} samples of the stats mutex, {in_kernel} in the kernel");
    // The lock calls' stacks are unchanged by them.
    let calls: u64 = stacks_of(&report, stats)
        .iter()
        .filter(|s| s["source"] == "lock_calls")
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    assert_eq!(calls, THREADS * STATS_USES * REQUESTS);
    // Folded: the samples under `cpu samples`, the calls without it.
    let folded = String::from_utf8(report_as(&json, "folded")).unwrap();
    let leaf = format!(";lock {}", row["name"].as_str().unwrap());
    assert_eq!(folded_count(&folded, &leaf, true), samples, "{folded}");
    let uses = THREADS * STATS_USES * REQUESTS + row["contended"].as_u64().unwrap();
    assert_eq!(folded_count(&folded, &leaf, false), uses, "{folded}");
}

/// Issue 52 K: 100,000 objects created at one site, more than the stack
/// count map holds keys for. Each object is counted once: in the site's
/// row, or in the one row of locks whose site was not recorded (no unnamed
/// row per object); `dropped.sites_not_recorded` is that row's
/// acquisitions, and its lost line says how many objects they are.
#[test]
fn objects_past_the_stack_map_are_one_row_said_not_recorded() {
    const OBJECTS: u64 = 100_000;
    let binary = fixture("siteobjects", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &[&OBJECTS.to_string()]);
    let trace = Trace::attach(fixture.pid(), &["--stacks", "4"]);
    fixture.start();
    fixture.wait();
    let (report, table) = trace.finish();
    let locks = report["locks"].as_array().unwrap();
    let by = |how: &str| -> Vec<&Value> {
        locks
            .iter()
            .filter(|l| l["created"]["by"] == how && l["kind"] == "mutex")
            .collect()
    };
    // The site's row; and, when snapshots were lost (ring buffer full),
    // one row of the objects named by their init call's site alone.
    let (sites, unrecorded) = (by("init"), by("not_recorded"));
    assert_eq!(unrecorded.len(), 1, "{table}");
    assert!(matches!(sites.len(), 1 | 2), "{table}");
    let unrecorded = unrecorded[0];
    assert_eq!(
        unrecorded["name"],
        "mutex created at a site not recorded (stack count map full)"
    );
    let objects = |row: &Value| row["group"]["objects"].as_u64().unwrap();
    let mut in_sites = 0;
    for site in &sites {
        assert_eq!(site["created"]["site"][0]["function"], "obj_create");
        assert_eq!(site["created"]["inits"], objects(site), "{site:#}");
        assert_eq!(site["acquisitions"], objects(site), "{table}");
        in_sites += objects(site);
    }
    let snapshots_lost = report["dropped"]["snapshots_lost"].as_u64().unwrap_or(0);
    assert_eq!(
        sites.len(),
        if snapshots_lost > 0 { 2 } else { 1 },
        "{table}"
    );
    let not_recorded = objects(unrecorded);
    assert_eq!(in_sites + not_recorded, OBJECTS, "{table}");
    assert!(not_recorded > 0, "{table}");
    assert_eq!(unrecorded["acquisitions"], not_recorded, "{table}");
    assert_eq!(unrecorded["group"]["addresses"], not_recorded);
    let dropped = &report["dropped"];
    assert_eq!(dropped["sites_not_recorded"], not_recorded, "{dropped}");
    assert!(
        dropped["stack_counts_full"].as_u64().unwrap() > 0,
        "{dropped}"
    );
    assert!(dropped.get("locks_map_full").is_none(), "{dropped}");
    // No row of an object goes unnamed.
    assert!(
        locks.iter().all(|l| l["name"].is_string()),
        "unnamed rows:\n{table}"
    );
    let line = format!(
        "lost: {not_recorded} acquisitions of {not_recorded} locks whose creation site did not fit the stack count map"
    );
    assert!(table.contains(&line), "no {line:?} in:\n{table}");
    assert!(!table.contains("lost: nothing"), "{table}");
}
