//! Collected counts to the report model, in one pass: per lock address the
//! calls of each lock function (nested calls inside lock functions dropped),
//! futex words folded into the lock whose bytes hold them, totals, drops.
use std::collections::BTreeMap;

use tracer_common::{LockCounts, LockOp, drop_reason};

use crate::{
    analysis::{cpu, in_progress, waits},
    model::{
        Collected, DropReason, Lock, LockKind, Mode, Placement, Report, SCHEMA, StopReason,
        TargetInfo, WaitClass, add_histogram,
    },
    probe::lockfuncs::{LockFunction, in_lock_function, is_nested_call},
};

/// How the report was recorded, for its header.
#[derive(Debug, Clone)]
pub(crate) struct RecordInfo {
    pub target: TargetInfo,
    pub duration_s: f64,
    pub mode: Mode,
    pub placement: Option<Placement>,
    pub stopped_by: StopReason,
}

pub(crate) fn build(info: RecordInfo, collected: &Collected, functions: &[LockFunction]) -> Report {
    let nested = nested_calls(collected, functions);
    let mut locks = lock_rows(collected, functions, &nested);
    fold_futexes(&mut locks, collected);
    let (in_lock_functions, unattributed) = cpu::attribute(&mut locks, collected);
    let counted_acquisitions = info.mode.counts_acquisitions();
    waits::classify(&mut locks, collected, counted_acquisitions);
    // With every lock call probed (all mode) each pthread lock worked on has
    // its own row; a futex word that only lock-code samples name is one the
    // libc's generic wait/wake helpers worked on (musl's condvar waiters
    // wake through `__wake` on the waiter's stack), not a lock. Sampled mode
    // misses the lock calls outside its windows: there the samples say lock.
    if info.mode == Mode::Sampled {
        cpu::mark_locks(&mut locks, &in_lock_functions);
    }
    let mut locks: Vec<Lock> = locks.into_values().collect();
    for lock in &mut locks {
        lock.lifetime = collected.lifetimes.ended(lock.address);
    }
    sort_locks(&mut locks);
    let totals = waits::totals(&locks, counted_acquisitions);
    let (in_progress, deadlocks) =
        in_progress::apply(&locks, &collected.in_flight, counted_acquisitions);
    Report {
        schema: SCHEMA.into(),
        target: info.target,
        duration_s: info.duration_s,
        mode: info.mode,
        placement: info.placement,
        stopped_by: info.stopped_by,
        stacks: Vec::new(),
        naming: None,
        dropped: dropped(collected, &nested, functions),
        totals,
        requests: None,
        placement_fallbacks: Vec::new(),
        estimate: None,
        overhead: None,
        coverage: None,
        in_progress,
        deadlocks,
        // The target's CPU time and the tracer's share are added by the caller.
        cpu: (collected.cpu_hz > 0).then(|| cpu::report(collected, &locks, None, 0, unattributed)),
        locks,
        kernel_limits: Vec::new(),
        php: None,
        routes: None,
        inproc: None,
        kernel_locks: None,
    }
}

/// One row per lock address the lock functions were called on: the calls
/// of each function (nested calls dropped) and the user's failed tries.
fn lock_rows(
    collected: &Collected,
    functions: &[LockFunction],
    nested: &BTreeMap<(u64, u32), u64>,
) -> BTreeMap<u64, Lock> {
    let mut locks: BTreeMap<u64, Lock> = BTreeMap::new();
    for (&address, counts) in &collected.locks {
        let mut calls = BTreeMap::new();
        for op in LockOp::ALL {
            let n = counts.calls[op as usize]
                .saturating_sub(*nested.get(&(address, op as u32)).unwrap_or(&0));
            if n > 0 {
                calls.insert(op.symbol().to_string(), n);
            }
        }
        // musl's lock functions try first, from inside: not the user's failures.
        let failed: u64 = collected
            .failed_tries
            .iter()
            .filter(|(key, _)| key.lock == address && !in_lock_function(key.return_ip, functions))
            .map(|(_, &count)| count)
            .sum();
        if calls.is_empty() && failed == 0 {
            continue;
        }
        let mut lock = Lock::empty(
            address,
            lock_kind(collected, address, counts),
            WaitClass::Lock,
        );
        lock.acquisitions = Some(calls.values().sum());
        lock.calls = calls;
        lock.failed_tries = (failed > 0).then_some(failed);
        locks.insert(address, lock);
    }
    locks
}

/// A lock's kind by the functions called on it, failed tries included: any
/// rwlock function makes it a rwlock, then any spinlock one a spinlock.
fn lock_kind(collected: &Collected, address: u64, counts: &LockCounts) -> LockKind {
    let called = |is: fn(LockOp) -> bool| {
        LockOp::ALL
            .iter()
            .any(|op| is(*op) && counts.calls[*op as usize] > 0)
            || collected
                .failed_tries
                .keys()
                .any(|key| key.lock == address && LockOp::from_index(key.op).is_some_and(is))
    };
    if called(LockOp::is_rwlock) {
        LockKind::Rwlock
    } else if called(LockOp::is_spin) {
        LockKind::Spinlock
    } else {
        LockKind::Mutex
    }
}

/// Futex waits and wakes, each folded into the lock whose bytes hold its
/// word, else a row of its own.
fn fold_futexes(locks: &mut BTreeMap<u64, Lock>, collected: &Collected) {
    for (&futex, counts) in &collected.futexes {
        let owner = lock_holding(locks, futex, |lock| lock.kind.span());
        let lock = locks
            .entry(owner.unwrap_or(futex))
            .or_insert_with(|| Lock::empty(futex, LockKind::Futex, WaitClass::Other));
        lock.contended += counts.waits;
        lock.wakes += counts.wakes;
        lock.wait_ns += counts.wait_ns;
        lock.max_wait_ns = lock.max_wait_ns.max(counts.max_wait_ns);
        add_histogram(&mut lock.wait_histogram, &counts.wait_histogram);
    }
}

/// The events the BPF programs dropped, by reason.
fn dropped(
    collected: &Collected,
    nested: &BTreeMap<(u64, u32), u64>,
    functions: &[LockFunction],
) -> BTreeMap<DropReason, u64> {
    let mut dropped: BTreeMap<DropReason, u64> = collected
        .drops
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(index, &n)| (DropReason::from_index(index), n))
        .collect();
    let callers_lost = collected.drops[drop_reason::CALLERS_FULL as usize]
        + collected.drops[drop_reason::CALLER_UNREADABLE as usize];
    if callers_lost > 0 && lock_functions_nest(nested, functions) {
        // A nested call whose caller was lost cannot be subtracted.
        dropped.insert(DropReason::NestedCallsUnknown, callers_lost);
    }
    dropped
}

/// The report's order of locks: most acquisitions, then contended waits,
/// then wait time first.
pub(crate) fn sort_locks(locks: &mut [Lock]) {
    locks.sort_by(|a, b| {
        (b.acquisitions.unwrap_or(0), b.contended, b.wait_ns).cmp(&(
            a.acquisitions.unwrap_or(0),
            a.contended,
            a.wait_ns,
        ))
    });
}

/// True when the lock functions call each other (musl): nested calls were
/// seen, or the lock functions come from musl.
fn lock_functions_nest(nested: &BTreeMap<(u64, u32), u64>, functions: &[LockFunction]) -> bool {
    !nested.is_empty() || functions.iter().any(|f| f.module.contains("musl"))
}

/// The address of the lock whose bytes hold futex word `word`, among
/// `locks` (by address; `span` gives each one's size in bytes), if any.
/// `build` folds the word's waits into it, the live views expire them with it.
pub(crate) fn lock_holding<V>(
    locks: &BTreeMap<u64, V>,
    word: u64,
    span: impl Fn(&V) -> u64,
) -> Option<u64> {
    locks
        .range(..=word)
        .next_back()
        .filter(|(start, value)| word < **start + span(value))
        .map(|(start, _)| *start)
}

/// Lock calls made from inside another lock function (musl's
/// pthread_mutex_lock calls pthread_mutex_timedlock, which calls
/// pthread_mutex_trylock): one acquisition, so only the outer call counts.
fn nested_calls(collected: &Collected, functions: &[LockFunction]) -> BTreeMap<(u64, u32), u64> {
    let mut nested = BTreeMap::new();
    for (key, &count) in &collected.callers {
        if is_nested_call(key, collected, functions) {
            *nested.entry((key.lock, key.op)).or_insert(0) += count;
        }
    }
    nested
}
