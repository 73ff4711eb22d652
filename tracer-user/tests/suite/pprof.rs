//! pprof export, read back by the real `go tool pprof` (Debian golang-go).
use crate::common::*;

/// fixtures/steady.c: `tick` takes g_lock 40 times a millisecond for 500
/// ms: 20,000 acquisitions, all from `tick`.
#[test]
fn record_pprof_shows_the_lock_and_its_caller_with_the_exact_count() {
    let binary = fixture("steady", Flavor::Glibc);
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("steady.pb.gz");
    let mut fixture = Fixture::spawn(&binary, &["40", "500"]);
    let g_lock = fixture.address("global");
    let trace = Trace::attach(fixture.pid(), &["--pprof", profile.to_str().unwrap()]);
    fixture.start();
    fixture.wait();
    let (report, _) = trace.finish();
    assert_eq!(acquisitions(&report, g_lock), 20_000);

    let top = pprof_top(&profile, "acquisitions");
    assert!(top.contains("Type: acquisitions"), "{top}");
    assert_eq!(flat_and_cum(&top, "lock g_lock"), (20_000, 20_000));
    assert_eq!(flat_and_cum(&top, "tick"), (0, 20_000));

    // The same profile from the saved JSON report, by `report --format pprof`.
    let json = dir.path().join("steady.json");
    std::fs::write(&json, serde_json::to_string(&report).unwrap()).unwrap();
    let output = locktrace()
        .args(["report", "--format", "pprof"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(output.status.success());
    let again = dir.path().join("again.pb.gz");
    std::fs::write(&again, &output.stdout).unwrap();
    assert_eq!(
        flat_and_cum(&pprof_top(&again, "acquisitions"), "lock g_lock"),
        (20_000, 20_000)
    );
}

/// fixtures/locks.c with g_lock held 20 µs, recorded with `--stacks`:
/// per lock, the profile's acquisitions, contentions and delay are exactly
/// the report's (stacks past the top N kept go on the lock's own frame),
/// and the stacks show who took the lock.
#[test]
fn with_stacks_each_locks_totals_match_the_report() {
    let binary = fixture("locks", Flavor::Glibc);
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("locks.pb.gz");
    let mut fixture = Fixture::spawn(&binary, &["4", "3000", "0", "20000"]);
    let g_lock = fixture.address("global");
    let trace = Trace::attach(
        fixture.pid(),
        &["--stacks", "2", "--pprof", profile.to_str().unwrap()],
    );
    fixture.start();
    fixture.wait();
    let (report, _) = trace.finish();
    let lock = lock_at(&report, g_lock).expect("g_lock in the report");
    let contended = lock["contended"].as_u64().unwrap();
    assert!(contended > 0, "no contention to check: {lock}");
    assert!(!report["stacks"].as_array().unwrap().is_empty());

    let top = pprof_top(&profile, "acquisitions");
    assert_eq!(flat_and_cum(&top, "lock g_lock"), (12_000, 12_000));
    assert!(flat_and_cum(&top, "worker").1 > 0, "{top}");
    let top = pprof_top(&profile, "contentions");
    assert_eq!(flat_and_cum(&top, "lock g_lock").0, contended);
    let wait_ns = lock["wait_ns"].as_u64().unwrap();
    let top = pprof_top_unit(&profile, "delay", "ns");
    assert_eq!(flat_and_cum(&top, "lock g_lock").0, wait_ns);
}
