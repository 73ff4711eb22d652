//! Two lifetimes of one address (issue 35 item 11): a lock whose memory
//! went away during the recording (a library unloaded, an exec) is its own
//! row, named from the mappings it lived in, and the lock later at its
//! address counts only its own calls. Real BPF as root, real processes,
//! the fixture's exact truths.

use std::{path::Path, process::Command};

use crate::common::{Fixture, Flavor, Trace, fixture, fixture_with};
use serde_json::Value;

const N: u64 = 1_000;
const M: u64 = 3_000;

/// `fixtures/liblock.c` built as a shared library at `path`, with `defines`.
fn build_library(path: &Path, defines: &[&str]) {
    let source = crate::common::repo_root().join("fixtures/liblock.c");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-shared", "-fPIC", "-pthread", "-o"])
        .arg(path)
        .arg(source)
        .args(defines)
        .status()
        .expect("gcc (scripts/setup.sh installs it)");
    assert!(status.success());
}

/// The one lock row named `name`.
fn named<'a>(report: &'a Value, name: &str) -> &'a Value {
    let rows: Vec<&Value> = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|lock| lock["name"] == name)
        .collect();
    assert_eq!(rows.len(), 1, "rows named {name}: {:#}", report["locks"]);
    rows[0]
}

/// Runs the lifetimes fixture in `mode` (`dl`, `dl-late`) with two
/// libraries built to land at one address; returns (report, table).
fn two_libraries_at_one_address(mode: &str) -> (Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("liba.so"), dir.path().join("libb.so"));
    build_library(&first, &[]);
    build_library(&second, &["-Dlib_lock=other_lock"]);
    let mut target = Fixture::spawn(
        &fixture("lifetimes", Flavor::Glibc),
        &[
            mode,
            first.to_str().unwrap(),
            second.to_str().unwrap(),
            &N.to_string(),
            &M.to_string(),
        ],
    );
    let trace = Trace::attach(target.pid(), &[]);
    target.start();
    let mut lines = Vec::new();
    while let Some(line) = target.read_line() {
        let done = line == "done";
        lines.push(line);
        if done {
            break;
        }
    }
    // Otherwise the test would not test two lifetimes of one address.
    assert!(lines.contains(&"same 1".to_string()), "{lines:?}");
    target.wait();
    trace.finish()
}

#[test]
fn a_library_unloaded_and_another_loaded_at_its_address_are_two_locks() {
    let (report, table) = two_libraries_at_one_address("dl");
    let before = named(&report, "lib_lock");
    let after = named(&report, "other_lock");
    assert_eq!(before["acquisitions"], N, "{before:#}");
    assert_eq!(after["acquisitions"], M, "{after:#}");
    assert_eq!(before["address"], after["address"]);
    assert_eq!(before["lifetime"]["by_exec"], false, "{before:#}");
    assert!(after.get("lifetime").is_none(), "{after:#}");
    assert!(
        before["module"]
            .as_str()
            .is_some_and(|m| m.ends_with("liba.so")),
        "{before:#}"
    );
    assert!(table.contains("lib_lock (unmapped)"), "{table}");
}

/// Both libraries loaded after attach, the first unloaded before
/// locktrace read the maps again (issue 52 D11: one row, other_lock
/// N + M, "lost: nothing"). The first library's calls are their own row,
/// exactly, said to be of a module that came and went unseen; the second
/// library's lock counts only its own.
#[test]
fn a_library_loaded_and_unloaded_unseen_is_its_own_row() {
    let (report, table) = two_libraries_at_one_address("dl-late");
    let after = named(&report, "other_lock");
    assert_eq!(after["acquisitions"], M, "{table}");
    assert!(after.get("lifetime").is_none(), "{after:#}");
    let before: Vec<&Value> = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|lock| lock["address"] == after["address"] && lock.get("lifetime").is_some())
        .collect();
    assert_eq!(before.len(), 1, "{table}");
    let before = before[0];
    assert_eq!(before["acquisitions"], N, "{before:#}");
    assert_eq!(before["lifetime"]["by_exec"], false, "{before:#}");
    // A read of the maps (every 200 ms) falls inside the first library's
    // few milliseconds now and then: it is then named.
    if before["name"] == "lib_lock" {
        return;
    }
    assert_eq!(before["lifetime"]["module_unseen"], true, "{before:#}");
    assert!(before["name"].is_null(), "{before:#}");
    assert!(
        table.contains("its module came and went between two reads of the maps: not named"),
        "{table}"
    );
}

#[test]
fn a_lock_before_an_exec_and_one_after_it_at_the_same_address_are_two_locks() {
    let program = |lock: &str| {
        fixture_with(
            "lifetimes",
            Flavor::Glibc,
            &["-no-pie", &format!("-DLOCK={lock}")],
        )
    };
    let (first, second) = (program("a_lock"), program("b_other"));
    let mut target = Fixture::spawn(
        &first,
        &[
            "exec",
            &N.to_string(),
            second.to_str().unwrap(),
            &M.to_string(),
        ],
    );
    let address = target.address("lock");
    let trace = Trace::attach(target.pid(), &[]);
    target.start();
    target.wait();
    let (report, table) = trace.finish();
    let before = named(&report, "a_lock");
    let after = named(&report, "b_other");
    assert_eq!(before["acquisitions"], N, "{before:#}");
    assert_eq!(after["acquisitions"], M, "{after:#}");
    let shown = format!("{address:#x}");
    assert_eq!(before["address"], shown.as_str());
    assert_eq!(after["address"], shown.as_str());
    assert_eq!(before["lifetime"]["by_exec"], true, "{before:#}");
    assert!(after.get("lifetime").is_none(), "{after:#}");
    assert!(table.contains("a_lock (before exec)"), "{table}");
    // The report reads back with the two rows apart.
    let typed = locktrace::model::Report::from_json(&report.to_string(), "the report").unwrap();
    let keys: std::collections::BTreeSet<u64> = typed.locks.iter().map(|l| l.address).collect();
    assert_eq!(keys.len(), typed.locks.len());
}
