//! Hostile input, round 3 (issue 35): lock APIs that were missed or
//! miscounted. Real BPF as root, real processes; each count is the
//! fixture's exact truth.
mod common;

use common::{Fixture, Flavor, Trace, fixture, lock_at};

#[test]
fn futex_waitv_waits_are_counted_on_their_word() {
    const K: u64 = 847;
    let mut target = Fixture::spawn(&fixture("waitv", Flavor::Glibc), &[&K.to_string()]);
    let trace = Trace::attach(target.pid(), &[]);
    target.start();
    let word = target.address("word");
    target.wait();
    let (report, _table) = trace.finish();
    let row = lock_at(&report, word).unwrap_or_else(|| panic!("no row for the word: {report:#}"));
    assert_eq!(row["contended"], K, "{row:#}");
}

#[test]
fn failed_trylocks_are_not_acquisitions_and_clock_and_rwlock_variants_count() {
    const N: u64 = 10_000;
    let mut target = Fixture::spawn(&fixture("trylocks", Flavor::Glibc), &[&N.to_string()]);
    let trace = Trace::attach(target.pid(), &[]);
    target.start();
    let at = |name: &str| target.address(name);
    let (busy, clocked, waited, rw) = (at("busy"), at("clocked"), at("waited"), at("rw"));
    target.wait();
    let (report, table) = trace.finish();
    let row = |address: u64| {
        lock_at(&report, address).unwrap_or_else(|| panic!("no row {address:#x}: {report:#}"))
    };
    // 10,000 busy trylocks and 5 timed-out timedlocks took nothing.
    assert_eq!(row(busy)["acquisitions"], 1, "{:#}", row(busy));
    assert_eq!(row(busy)["failed_tries"], N + 5);
    assert_eq!(row(busy)["calls"]["pthread_mutex_lock"], 1);
    assert_eq!(row(clocked)["acquisitions"], N);
    assert_eq!(row(clocked)["calls"]["pthread_mutex_clocklock"], N);
    assert_eq!(row(rw)["acquisitions"], 6 * N);
    assert_eq!(row(rw)["kind"], "rwlock");
    for function in [
        "pthread_rwlock_tryrdlock",
        "pthread_rwlock_trywrlock",
        "pthread_rwlock_timedrdlock",
        "pthread_rwlock_timedwrlock",
        "pthread_rwlock_clockrdlock",
        "pthread_rwlock_clockwrlock",
    ] {
        assert_eq!(row(rw)["calls"][function], N, "{function}: {:#}", row(rw));
    }
    // The wait in pthread_mutex_clocklock is the lock's contention, not "other".
    assert_eq!(row(waited)["acquisitions"], 2);
    assert_eq!(row(waited)["wait_class"], "lock");
    assert!(
        row(waited)["contended"].as_u64().unwrap() >= 1,
        "{:#}",
        row(waited)
    );
    assert!(
        table.contains(&format!(
            "failed tries: {} calls returned without the lock",
            N + 5
        )),
        "{table}"
    );
}
