//! Issue 5: auto probe placement counts exactly what entry placement counts,
//! on every libc flavor and every probed lock function, and falls back to
//! the entry (saying why) on a function it cannot analyse. Real BPF: root.

use crate::common::*;
use serde_json::Value;

fn calls(report: &Value, address: u64) -> Value {
    lock_at(report, address).unwrap_or_else(|| panic!("no lock at {address:#x}"))["calls"].clone()
}

/// The truth of fixtures/locks.c and fixtures/lockops.c, checked for both placements.
fn check_flavor(flavor: Flavor) {
    let locks = fixture("locks", flavor);
    let lockops = fixture("lockops", flavor);
    let mut reports = Vec::new();
    for placement in ["entry", "auto"] {
        let (report, addresses) =
            trace_fixture(&locks, &["3", "2000", "700"], &["--placement", placement]);
        assert_eq!(report["placement"], placement);
        assert_eq!(
            report.get("placement_fallbacks"),
            None,
            "{flavor:?} {placement}: {}",
            report["placement_fallbacks"]
        );
        assert_eq!(
            acquisitions(&report, addresses["global"][0]),
            3 * 2000,
            "{flavor:?} {placement}"
        );
        for &heap in &addresses["heap"] {
            assert_eq!(acquisitions(&report, heap), 700, "{flavor:?} {placement}");
        }

        let mut fixture = Fixture::spawn(&lockops, &["2", "1500"]);
        let trace = Trace::attach(fixture.pid(), &["--placement", placement]);
        fixture.start();
        let addresses = fixture.addresses.clone();
        let printed = fixture.wait();
        let (ops, _) = trace.finish();
        let failed: u64 = printed
            .lines()
            .find_map(|line| line.strip_prefix("failed_trylocks ")?.parse().ok())
            .expect("the fixture prints its failed trylocks");
        let n = 2 * 1500;
        // A trylock that found the mutex busy took nothing: counted apart.
        assert_eq!(
            calls(&ops, addresses["mutex"][0]),
            serde_json::json!({"pthread_mutex_lock": n, "pthread_mutex_trylock": n - failed, "pthread_mutex_timedlock": n}),
            "{flavor:?} {placement}"
        );
        let mutex = lock_at(&ops, addresses["mutex"][0]).unwrap();
        assert_eq!(
            mutex["failed_tries"].as_u64().unwrap_or(0),
            failed,
            "{flavor:?} {placement}"
        );
        assert_eq!(
            calls(&ops, addresses["rwlock"][0]),
            serde_json::json!({"pthread_rwlock_rdlock": n, "pthread_rwlock_wrlock": n}),
            "{flavor:?} {placement}"
        );
        reports.push((report, ops));
    }
    // Identical per-lock calls (every lock, also libc's internal ones; the
    // two runs are separate processes, so compare without addresses). How
    // many trylocks found the mutex busy differs between runs: compared are
    // the functions called and all calls, failed ones included.
    let per_lock = |report: &Value| -> Vec<String> {
        let mut locks: Vec<String> = report["locks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|lock| lock["acquisitions"].is_u64())
            .map(|lock| {
                let functions: Vec<&String> = lock["calls"].as_object().unwrap().keys().collect();
                let all = lock["acquisitions"].as_u64().unwrap()
                    + lock["failed_tries"].as_u64().unwrap_or(0);
                format!("{functions:?} {all}")
            })
            .collect();
        locks.sort();
        locks
    };
    assert_eq!(
        per_lock(&reports[0].0),
        per_lock(&reports[1].0),
        "{flavor:?}: locks entry vs auto"
    );
    assert_eq!(
        per_lock(&reports[0].1),
        per_lock(&reports[1].1),
        "{flavor:?}: lockops entry vs auto"
    );
}

#[test]
fn auto_equals_entry_glibc() {
    check_flavor(Flavor::Glibc);
}

#[test]
fn auto_equals_entry_glibc_static() {
    check_flavor(Flavor::GlibcStatic);
}

#[test]
fn auto_equals_entry_musl() {
    check_flavor(Flavor::Musl);
}

#[test]
fn auto_equals_entry_musl_static() {
    check_flavor(Flavor::MuslStatic);
}

/// fixtures/handmade_lock.c defines pthread_mutex_lock itself and writes rdi first.
#[test]
fn auto_falls_back_to_entry_on_a_function_it_cannot_analyse() {
    let binary = fixture("handmade_lock", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["5000"]);
    let trace = Trace::attach(fixture.pid(), &["--placement", "auto"]);
    let said = trace
        .stderr_lines
        .iter()
        .find(|line| line.contains("auto placement fell back to the entry of pthread_mutex_lock"))
        .unwrap_or_else(|| panic!("no fallback line on stderr: {:?}", trace.stderr_lines))
        .clone();
    assert!(said.contains("writes rdi"), "{said}");
    let mutex = fixture.address("mutex");
    fixture.start();
    fixture.wait();
    let (report, table) = trace.finish();
    assert_eq!(acquisitions(&report, mutex), 5000);
    assert_eq!(calls(&report, mutex)["pthread_mutex_lock"], 5000);
    let fallbacks = report["placement_fallbacks"]
        .as_array()
        .expect("placement_fallbacks in the JSON");
    assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    assert_eq!(fallbacks[0]["function"], "pthread_mutex_lock");
    assert_eq!(fallbacks[0]["module"].as_str(), binary.to_str());
    assert!(
        fallbacks[0]["reason"]
            .as_str()
            .unwrap()
            .contains("writes rdi")
    );
    assert!(
        table.contains("fell back"),
        "table footer should name the fallback:\n{table}"
    );
}
