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
