//! Issue 9: waiting for work is not lock contention. Idle pool workers
//! waiting on a condition variable are classified `condvar`, kept out of the
//! contention totals, and shown in their own section. Real BPF: root.

use crate::common::*;
use serde_json::Value;

/// The fixture's own count of busy pool mutexes (`busy M`) and of timed-out
/// condvar waits (`timeouts N`), from its last line.
fn fixture_truth(rest: &str) -> (u64, u64) {
    let line = rest
        .lines()
        .find(|line| line.starts_with("timeouts "))
        .unwrap_or_else(|| panic!("fixture printed no counts: {rest}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[1].parse().unwrap(), fields[3].parse().unwrap())
}

fn class_totals<'a>(report: &'a Value, class: &str) -> &'a Value {
    &report["totals"]["by_wait_class"][class]
}

/// Four workers idle for 3 s, waking every 60 ms (15 ms apart, so a late
/// wake-up on a busy machine does not collide with the next): about 200 condvar waits,
/// none of them contention. The contention totals hold no more waits than
/// the fixture saw its mutex busy (zero in practice), and the condvar waits
/// are all in the condvar row, named by its symbol.
#[test]
fn idle_pool_workers_are_not_lock_contention() {
    for flavor in [Flavor::Glibc, Flavor::MuslStatic] {
        let binary = fixture("threadpool", flavor);
        let mut pool = Fixture::spawn(&binary, &["4", "3000", "60"]);
        let (lock_address, work_address) = (pool.address("pool_lock"), pool.address("pool_work"));
        let trace = Trace::attach(pool.pid(), &[]);
        pool.start();
        let (timeouts, busy) = fixture_truth(&pool.wait());
        let (report, table) = trace.finish();

        assert!(timeouts >= 150, "{flavor:?}: only {timeouts} timeouts");
        let contended = report["totals"]["contended"].as_u64().unwrap();
        assert!(
            contended <= busy,
            "{flavor:?}: {contended} contended waits in the totals, but the pool mutex was busy only {busy} times:\n{table}"
        );
        let lock_rows = contention_in_rows(&report);
        assert_eq!(
            lock_rows, contended,
            "{flavor:?}: totals are the lock rows'"
        );

        let work = lock_at(&report, work_address).unwrap_or_else(|| {
            panic!("{flavor:?}: no condvar row at the pool's condvar:\n{table}")
        });
        assert_eq!(work["kind"], "condvar", "{flavor:?}");
        assert_eq!(work["wait_class"], "condvar", "{flavor:?}");
        // The condvar field of the global pool struct, from DWARF.
        assert_eq!(work["name"], "g_pool.work", "{flavor:?}");
        let waits = work["contended"].as_u64().unwrap();
        // Every timed-out wait slept in the kernel at least once.
        assert!(
            waits >= timeouts,
            "{flavor:?}: {waits} condvar waits < {timeouts} timeouts"
        );
        assert_eq!(
            class_totals(&report, "condvar")["waits"],
            waits,
            "{flavor:?}"
        );
        assert_eq!(
            lock_at(&report, lock_address).map(|lock| lock["wait_class"].clone()),
            Some(Value::from("lock")),
            "{flavor:?}: the pool mutex is a lock"
        );
        assert!(
            table.contains("waiting for work / runtime") && table.contains("g_pool.work"),
            "{flavor:?}: no waiting section:\n{table}"
        );
    }
}
