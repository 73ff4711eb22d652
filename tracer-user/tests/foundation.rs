//! Issue 2: exact per-lock counts and contention on a live pid, and bad input.
//! Real BPF: run as root.
mod common;

use common::*;

/// N threads × M global locks and K locks of each thread's own heap mutex.
#[test]
fn counts_are_exact_global_and_heap() {
    let binary = fixture("locks", Flavor::Glibc);
    for _ in 0..3 {
        let (report, addresses) = trace_fixture(&binary, &["4", "2500", "1000"], &[]);
        assert_eq!(acquisitions(&report, addresses["global"][0]), 4 * 2500);
        assert_eq!(addresses["heap"].len(), 4);
        for &heap in &addresses["heap"] {
            assert_eq!(acquisitions(&report, heap), 1000);
            let lock = lock_at(&report, heap).unwrap();
            assert_eq!(lock["kind"], "mutex");
        }
        assert_eq!(report["schema"], "locktrace.report/1");
        assert_eq!(report["stopped_by"], "target_exited");
        assert_eq!(report["dropped"], serde_json::json!({}));
    }
}
