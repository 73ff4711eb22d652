//! Waits and holds in progress at the end, and deadlocks among them.
//!
//! A wait the probes saw begin (`WAITING`) lasts since its start; a thread
//! the kernel showed blocked on the same futex word right after attach, and
//! still does, has waited at least since attach. A wait is lock contention
//! when its word lies in a lock the probes saw or is a locked glibc mutex
//! owned by a thread of the target (or, in contention mode, any word that
//! is not a condvar's or the Go runtime's), as `waits::classify` decides.
//! The holder is, first, the glibc mutex's owner now; else the thread whose
//! hold (`--hold-times`) is open; else the holder seen when the wait began.
//! Threads waiting in a cycle of holders are deadlocked.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use tracer_common::wait_class;

use crate::model::{
    Activity, Deadlock, DeadlockStep, InFlight, InProgress, Lock, LockKind, ThreadRef, WaitClass,
};

/// Fills `in_progress` and `deadlocks` of a report from the in-flight state.
/// `lock_spans_known` is false in contention mode (no lock was probed).
pub(crate) fn apply(
    locks: &[Lock],
    in_flight: &InFlight,
    lock_spans_known: bool,
) -> (Vec<InProgress>, Vec<Deadlock>) {
    let spans: BTreeMap<u64, u64> = locks
        .iter()
        .filter(|lock| matches!(lock.kind, LockKind::Mutex | LockKind::Rwlock))
        .map(|lock| (lock.address, lock.address + lock.kind.span()))
        .collect();
    let mut entries = waits(in_flight, &spans, lock_spans_known);
    entries.extend(holds(in_flight, &entries));
    // Lock waits first, the longest first; then holds; then the other waits.
    entries.sort_by_key(|entry| {
        let rank = match (entry.activity, entry.wait_class) {
            (Activity::Wait, Some(WaitClass::Lock)) => 0,
            (Activity::Hold, _) => 1,
            _ => 2,
        };
        (rank, std::cmp::Reverse(entry.elapsed_ns), entry.tid)
    });
    let deadlocks = deadlocks(&entries);
    (entries, deadlocks)
}

/// The waits in progress of live threads (none once the target exited):
/// those the probes saw begin, and those older than the probes.
fn waits(
    in_flight: &InFlight,
    spans: &BTreeMap<u64, u64>,
    lock_spans_known: bool,
) -> Vec<InProgress> {
    let lock_holding = |word: u64| {
        spans
            .range(..=word)
            .next_back()
            .filter(|(_, end)| word < **end)
            .map(|(start, _)| *start)
    };
    let mut waits: Vec<(u32, u64, u64, bool, u32)> = in_flight
        .waits
        .iter()
        .filter(|(tid, _)| in_flight.threads.contains(tid))
        .map(|(&tid, wait)| {
            let elapsed = in_flight.now_ns.saturating_sub(wait.start_ns);
            (tid, wait.uaddr, elapsed, false, wait.class)
        })
        .collect();
    let attach_age = in_flight.now_ns.saturating_sub(in_flight.attached_ns);
    for blocked in &in_flight.blocked_now {
        if !in_flight.waits.contains_key(&blocked.tid)
            && in_flight.blocked_at_attach.contains(blocked)
        {
            let (tid, word) = (blocked.tid, blocked.uaddr);
            waits.push((tid, word, attach_age, true, wait_class::FUTEX));
        }
    }
    waits.sort();
    let mut entries = Vec::new();
    for (tid, word, elapsed_ns, since_before_attach, class) in waits {
        let (class, lock) = match class {
            wait_class::CONDVAR => (WaitClass::Condvar, word),
            wait_class::GO_RUNTIME => (WaitClass::GoRuntime, word),
            _ => match lock_holding(word) {
                Some(lock) => (WaitClass::Lock, lock),
                None if in_flight.owners.contains_key(&word) || !lock_spans_known => {
                    (WaitClass::Lock, word)
                }
                None => (WaitClass::Other, word),
            },
        };
        let holder = (class == WaitClass::Lock)
            .then(|| holder_of(in_flight, tid, word, lock))
            .flatten();
        entries.push(InProgress {
            activity: Activity::Wait,
            lock,
            name: None,
            region: crate::model::Region::Unset,
            wait_class: Some(class),
            tid,
            thread: None,
            elapsed_ns,
            since_before_attach,
            holder: holder.map(|tid| ThreadRef { tid, thread: None }),
        });
    }
    entries
}

/// The open holds of live threads (`--hold-times`). A lock call opens its
/// entry before it waits: a thread waiting for the lock is attempting it,
/// not holding it.
fn holds(in_flight: &InFlight, waits: &[InProgress]) -> Vec<InProgress> {
    let waiting_for: BTreeSet<(u32, u64)> =
        waits.iter().map(|entry| (entry.tid, entry.lock)).collect();
    let mut holds: Vec<(&tracer_common::HeldKey, &tracer_common::Held)> = in_flight
        .held
        .iter()
        .filter(|(key, held)| {
            held.depth > 0
                && held.tentative == 0
                && in_flight.threads.contains(&key.tid)
                && !waiting_for.contains(&(key.tid, key.lock))
        })
        .collect();
    holds.sort_by_key(|(key, _)| (key.tid, key.lock));
    holds
        .into_iter()
        .map(|(key, held)| InProgress {
            activity: Activity::Hold,
            lock: key.lock,
            name: None,
            region: crate::model::Region::Unset,
            wait_class: None,
            tid: key.tid,
            thread: None,
            elapsed_ns: in_flight.now_ns.saturating_sub(held.start_ns),
            since_before_attach: false,
            holder: None,
        })
        .collect()
}

/// Who holds `lock` (waited on through `word`) now, other than `waiter`.
fn holder_of(in_flight: &InFlight, waiter: u32, word: u64, lock: u64) -> Option<u32> {
    let other = |tid: &u32| *tid != waiter && *tid != 0 && in_flight.threads.contains(tid);
    let owner = [word, lock]
        .iter()
        .find_map(|address| in_flight.owners.get(address).copied().filter(other));
    let open_hold = || {
        in_flight
            .held
            .iter()
            .filter(|(key, held)| key.lock == lock && held.depth > 0 && held.tentative == 0)
            // Another thread waiting for this lock is attempting it, not holding it.
            .filter(|(key, _)| {
                in_flight
                    .waits
                    .get(&key.tid)
                    .is_none_or(|wait| wait.uaddr != word && wait.uaddr != lock)
            })
            .map(|(key, _)| key.tid)
            .find(other)
    };
    let at_wait_start = || {
        in_flight
            .waits
            .get(&waiter)
            .map(|wait| wait.holder_tid)
            .filter(other)
    };
    owner.or_else(open_hold).or_else(at_wait_start)
}

/// Cycles of lock waits: each thread waits for a lock the next one holds.
fn deadlocks(entries: &[InProgress]) -> Vec<Deadlock> {
    let waits_for: HashMap<u32, (u64, u32)> = entries
        .iter()
        .filter(|e| e.activity == Activity::Wait && e.wait_class == Some(WaitClass::Lock))
        .filter_map(|e| Some((e.tid, (e.lock, e.holder.as_ref()?.tid))))
        .collect();
    let mut found: BTreeSet<Vec<u32>> = BTreeSet::new();
    for &start in waits_for.keys() {
        let mut path = vec![start];
        let mut at = start;
        while let Some(&(_, holder)) = waits_for.get(&at) {
            if let Some(position) = path.iter().position(|&tid| tid == holder) {
                let mut cycle = path[position..].to_vec();
                // One spelling per cycle: start at its lowest tid.
                let lowest = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
                cycle.rotate_left(lowest);
                found.insert(cycle);
                break;
            }
            path.push(holder);
            at = holder;
        }
    }
    found
        .into_iter()
        .map(|cycle| Deadlock {
            cycle: cycle
                .iter()
                .map(|tid| {
                    let (lock, held_by) = waits_for[tid];
                    DeadlockStep {
                        tid: *tid,
                        thread: None,
                        lock,
                        name: None,
                        held_by,
                    }
                })
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Blocked;
    use tracer_common::FutexWait;

    fn wait(uaddr: u64, start_ns: u64) -> FutexWait {
        FutexWait {
            uaddr,
            start_ns,
            ..FutexWait::default()
        }
    }

    #[test]
    fn an_ab_ba_cycle_is_a_deadlock_and_a_lone_wait_is_not() {
        let mut in_flight = InFlight {
            now_ns: 10_000,
            attached_ns: 4_000,
            threads: [1, 2, 3, 4].into(),
            ..InFlight::default()
        };
        in_flight.waits.insert(1, wait(0xb0, 9_000));
        in_flight.waits.insert(2, wait(0xa0, 8_000));
        in_flight.owners.insert(0xa0, 1);
        in_flight.owners.insert(0xb0, 2);
        // Thread 3 blocked since before attach on a lock thread 4 holds.
        let old = Blocked {
            tid: 3,
            uaddr: 0xc0,
        };
        in_flight.blocked_at_attach.push(old);
        in_flight.blocked_now.push(old);
        in_flight.owners.insert(0xc0, 4);
        let (entries, deadlocks) = apply(&[], &in_flight, true);
        assert_eq!(entries.len(), 3);
        assert_eq!(
            (
                entries[0].tid,
                entries[0].elapsed_ns,
                entries[0].since_before_attach
            ),
            (3, 6_000, true)
        );
        assert_eq!(entries[0].holder.as_ref().map(|h| h.tid), Some(4));
        assert_eq!(deadlocks.len(), 1);
        let cycle: Vec<(u32, u64, u32)> = deadlocks[0]
            .cycle
            .iter()
            .map(|step| (step.tid, step.lock, step.held_by))
            .collect();
        assert_eq!(cycle, vec![(1, 0xb0, 2), (2, 0xa0, 1)]);
    }

    #[test]
    fn a_word_no_lock_owns_is_not_contention() {
        let mut in_flight = InFlight {
            now_ns: 10,
            threads: [1].into(),
            ..InFlight::default()
        };
        in_flight.waits.insert(1, wait(0xd0, 5));
        // A thread gone since (the target exiting) waits no more.
        in_flight.waits.insert(9, wait(0xd0, 5));
        let (entries, deadlocks) = apply(&[], &in_flight, true);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].wait_class, Some(WaitClass::Other));
        assert!(entries[0].holder.is_none() && deadlocks.is_empty());
        let (entries, _) = apply(&[], &in_flight, false);
        assert_eq!(entries[0].wait_class, Some(WaitClass::Lock));
    }
}
