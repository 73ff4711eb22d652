//! Waiting for a lock versus waiting for work: every futex word of a report
//! gets a wait class, and only lock contention counts in the totals.
//!
//! - `lock`: a futex word inside a pthread mutex or rwlock the lock probes
//!   saw (in contention mode, where no lock is probed, every word that is
//!   not one of the others);
//! - `condvar`: waits made inside `pthread_cond_wait`/`_timedwait`/
//!   `_clockwait` (the BPF side marks the thread between their entry and
//!   return), keyed by the condvar, plus futex words inside a condvar's bytes
//!   (glibc's signallers wake and quiesce there);
//! - `go_runtime`: futex calls made by the Go runtime's `runtime.futex`;
//! - `other`: the rest (a futex-based lock of another library, a semaphore,
//!   `pthread_join`, a musl condvar waiter's wake-up node).
use std::collections::{BTreeMap, BTreeSet};

use tracer_common::FutexCounts;

use crate::model::{
    ClassTotals, Collected, Lock, LockKind, PerRequest, Report, Requests, Totals, WaitClass,
    add_histogram,
};

/// Sets the wait class of every row, adds the condvar and Go runtime rows,
/// and joins futex words inside a condvar into it. `lock_spans_known` is
/// false in contention mode (no lock probes: a futex word cannot be told to
/// be a pthread lock's, so unknown words count as locks there).
pub(crate) fn classify(
    locks: &mut BTreeMap<u64, Lock>,
    collected: &Collected,
    lock_spans_known: bool,
) {
    for lock in locks.values_mut() {
        lock.wait_class = if lock.kind != LockKind::Futex || !lock_spans_known {
            WaitClass::Lock
        } else {
            WaitClass::Other
        };
    }
    for (&word, counts) in &collected.go_futexes {
        let row = locks
            .entry(word)
            .or_insert_with(|| Lock::empty(word, LockKind::Futex, WaitClass::GoRuntime));
        if row.kind == LockKind::Futex {
            row.wait_class = WaitClass::GoRuntime;
        }
        add(row, counts);
    }
    for (&cond, counts) in &collected.condvars {
        let row = locks
            .entry(cond)
            .or_insert_with(|| Lock::empty(cond, LockKind::Condvar, WaitClass::Condvar));
        if row.kind == LockKind::Futex {
            row.kind = LockKind::Condvar;
            row.wait_class = WaitClass::Condvar;
        }
        add(row, counts);
    }
    let conds: Vec<u64> = collected.condvars.keys().copied().collect();
    let inside_cond: Vec<(u64, u64)> = locks
        .iter()
        .filter(|(_, lock)| lock.kind == LockKind::Futex && lock.wait_class != WaitClass::GoRuntime)
        .filter_map(|(&word, _)| {
            conds
                .iter()
                .find(|&&cond| word > cond && word < cond + LockKind::Condvar.span())
                .map(|&cond| (word, cond))
        })
        .collect();
    for (word, cond) in inside_cond {
        let Some(inner) = locks.remove(&word) else {
            continue;
        };
        if let Some(row) = locks.get_mut(&cond) {
            row.contended += inner.contended;
            row.wakes += inner.wakes;
            row.wait_ns += inner.wait_ns;
            row.max_wait_ns = row.max_wait_ns.max(inner.max_wait_ns);
            for (bound, count) in inner.wait_histogram {
                add_bucket(&mut row.wait_histogram, bound, count);
            }
        }
    }
}

fn add(row: &mut Lock, counts: &FutexCounts) {
    row.contended += counts.waits;
    row.wakes += counts.wakes;
    row.wait_ns += counts.wait_ns;
    row.max_wait_ns = row.max_wait_ns.max(counts.max_wait_ns);
    add_histogram(&mut row.wait_histogram, &counts.wait_histogram);
}

/// Adds `count` waits to the bucket of upper bound `bound` (kept sorted).
fn add_bucket(histogram: &mut Vec<(u64, u64)>, bound: u64, count: u64) {
    match histogram.binary_search_by_key(&bound, |&(b, _)| b) {
        Ok(at) => histogram[at].1 += count,
        Err(at) => histogram.insert(at, (bound, count)),
    }
}

/// Totals of a report: acquisitions of every lock, futex figures of the
/// `lock` class only, and every class on its own.
pub(crate) fn totals(locks: &[Lock], counted_acquisitions: bool) -> Totals {
    let mut by_wait_class: BTreeMap<WaitClass, ClassTotals> = WaitClass::ALL
        .into_iter()
        .map(|class| (class, ClassTotals::default()))
        .collect();
    for lock in locks {
        let class = by_wait_class.entry(lock.wait_class).or_default();
        class.words += 1;
        class.waits += lock.contended;
        class.wakes += lock.wakes;
        class.wait_ns += lock.wait_ns;
    }
    let contention = by_wait_class
        .get(&WaitClass::Lock)
        .cloned()
        .unwrap_or_default();
    Totals {
        acquisitions: counted_acquisitions
            .then(|| locks.iter().filter_map(|lock| lock.acquisitions).sum()),
        contended: contention.waits,
        wakes: contention.wakes,
        wait_ns: contention.wait_ns,
        per_request: None,
        hold_ns: None,
        by_wait_class,
    }
}

/// Counts the rows naming marked as locks by their declared type
/// (`declared.contention`, see naming's `declared`) as lock contention;
/// returns how many rows moved.
pub(crate) fn count_declared_contention(report: &mut Report) -> usize {
    let marked: BTreeSet<u64> = report
        .locks
        .iter()
        .filter(|lock| {
            lock.declared
                .as_ref()
                .is_some_and(|d| d.contention.is_some())
        })
        .map(|lock| lock.address)
        .collect();
    count_as_contention(report, &marked)
}

/// Counts the rows at `addresses` as lock contention (naming found them to
/// be locks after the report was built): their class becomes `lock` and the
/// totals, per request too, are those of the new classes. Returns how many
/// rows moved.
pub(crate) fn count_as_contention(report: &mut Report, addresses: &BTreeSet<u64>) -> usize {
    let mut moved = 0;
    for lock in &mut report.locks {
        if addresses.contains(&lock.address) && lock.wait_class != WaitClass::Lock {
            lock.wait_class = WaitClass::Lock;
            moved += 1;
        }
    }
    if moved == 0 {
        return 0;
    }
    let fresh = totals(&report.locks, false);
    let divisor = report.requests.as_ref().and_then(Requests::divisor);
    let totals = &mut report.totals;
    totals.contended = fresh.contended;
    totals.wakes = fresh.wakes;
    totals.wait_ns = fresh.wait_ns;
    totals.by_wait_class = fresh.by_wait_class;
    if let (Some(per), Some(n)) = (&mut totals.per_request, divisor) {
        per.contended = totals.contended as f64 / n;
        per.wait_ns = totals.wait_ns as f64 / n;
    }
    apply_per_request(totals, divisor);
    moved
}

/// Per-request waits of each class (`divisor`: the request count, if usable).
pub(crate) fn apply_per_request(totals: &mut Totals, divisor: Option<f64>) {
    for class in totals.by_wait_class.values_mut() {
        class.per_request = divisor.map(|n| PerRequest {
            acquisitions: None,
            acquisitions_error: None,
            contended: class.waits as f64 / n,
            wait_ns: class.wait_ns as f64 / n,
            hold_ns: None,
            cpu_ns: None,
            handoffs: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(waits: u64, wakes: u64) -> FutexCounts {
        FutexCounts {
            waits,
            wait_ns: waits * 1000,
            max_wait_ns: 1000,
            wakes,
            ..FutexCounts::default()
        }
    }

    #[test]
    fn only_lock_waits_count_as_contention() {
        let mut collected = Collected::default();
        collected.futexes.insert(0x1000, counts(3, 3)); // inside the mutex below
        collected.futexes.insert(0x2028, counts(1, 5)); // inside the condvar at 0x2000
        collected.futexes.insert(0x3000, counts(2, 2)); // nobody's
        collected.condvars.insert(0x2000, counts(7, 0));
        collected.go_futexes.insert(0xc000010148, counts(4, 4));
        let mut locks = BTreeMap::new();
        let mut mutex = Lock::empty(0x1000, LockKind::Mutex, WaitClass::Lock);
        mutex.acquisitions = Some(10);
        mutex.contended = 3;
        mutex.wakes = 3;
        locks.insert(0x1000, mutex);
        for (word, c) in [(0x2028u64, counts(1, 5)), (0x3000, counts(2, 2))] {
            let mut row = Lock::empty(word, LockKind::Futex, WaitClass::Other);
            add(&mut row, &c);
            locks.insert(word, row);
        }
        classify(&mut locks, &collected, true);
        assert_eq!(locks[&0x2000].kind, LockKind::Condvar);
        assert_eq!(locks[&0x2000].contended, 8);
        assert_eq!(locks[&0x2000].wakes, 5);
        assert!(!locks.contains_key(&0x2028));
        assert_eq!(locks[&0x3000].wait_class, WaitClass::Other);
        assert_eq!(locks[&0xc000010148].wait_class, WaitClass::GoRuntime);
        let rows: Vec<Lock> = locks.into_values().collect();
        let totals = totals(&rows, true);
        assert_eq!((totals.contended, totals.wakes), (3, 3));
        assert_eq!(totals.acquisitions, Some(10));
        assert_eq!(totals.by_wait_class[&WaitClass::Condvar].waits, 8);
        assert_eq!(totals.by_wait_class[&WaitClass::GoRuntime].waits, 4);
        assert_eq!(totals.by_wait_class[&WaitClass::Other].waits, 2);
    }

    #[test]
    fn without_lock_probes_unknown_words_are_locks() {
        let mut locks = BTreeMap::new();
        let mut row = Lock::empty(0x3000, LockKind::Futex, WaitClass::Other);
        row.contended = 2;
        locks.insert(0x3000, row);
        classify(&mut locks, &Collected::default(), false);
        assert_eq!(locks[&0x3000].wait_class, WaitClass::Lock);
    }

    /// A futex word naming shows to be a lock moves into the contention
    /// totals, per request too; the other classes lose it.
    #[test]
    fn a_word_found_to_be_a_lock_moves_into_the_totals() {
        use crate::analysis::build::{RecordInfo, build};
        use crate::model::{Mode, Requests, StopReason, TargetInfo};
        let mut collected = Collected::default();
        collected.futexes.insert(0x3000, counts(6, 2)); // nobody's: other
        let info = RecordInfo {
            target: TargetInfo {
                pid: 1,
                exe: "x".into(),
                cmdline: vec![],
            },
            duration_s: 1.0,
            mode: Mode::All,
            placement: None,
            stopped_by: StopReason::Duration,
        };
        let mut report = build(info, &collected, &[]);
        let requests = Requests {
            count: 4,
            ..Requests::default()
        };
        crate::analysis::per_request::apply(&mut report, requests);
        assert_eq!(report.totals.contended, 0);
        let moved = count_as_contention(&mut report, &BTreeSet::from([0x3000, 0x9999]));
        assert_eq!(moved, 1);
        let totals = &report.totals;
        assert_eq!(
            (totals.contended, totals.wakes, totals.wait_ns),
            (6, 2, 6000)
        );
        assert_eq!(totals.per_request.as_ref().unwrap().contended, 1.5);
        assert_eq!(totals.by_wait_class[&WaitClass::Other].waits, 0);
        let lock_class = &totals.by_wait_class[&WaitClass::Lock];
        assert_eq!((lock_class.words, lock_class.waits), (1, 6));
        assert_eq!(lock_class.per_request.as_ref().unwrap().wait_ns, 1500.0);
        // Once moved, nothing moves again.
        assert_eq!(
            count_as_contention(&mut report, &BTreeSet::from([0x3000])),
            0
        );
    }
}
