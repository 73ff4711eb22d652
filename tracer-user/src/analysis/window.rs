//! A report of a window: what happened between two reports of one live
//! session (the counts are totals since attach), for the agent's pprof
//! deltas (`?seconds=`, the push). Only the figures pprof shows are taken
//! apart (calls, waits, wait time, CPU, callers, stacks, kernel locks);
//! what has no window (holders, hold times, per-request figures) is left
//! out. A count below the earlier one means the lock was expired and came
//! back (as the live intervals read it): the window then has the new count.
use std::collections::HashMap;

use crate::model::{KernelLock, Lock, LockStack, Report};

/// `after` minus `before`, keeping the locks active in between.
pub(crate) fn since(before: &Report, after: &Report) -> Report {
    let mut window = after.clone();
    window.duration_s = (after.duration_s - before.duration_s).max(0.0);
    // By key, not by a search per row: a process can have thousands.
    let earlier_locks: HashMap<u64, &Lock> = before.locks.iter().map(|l| (l.address, l)).collect();
    window.locks = after
        .locks
        .iter()
        .filter_map(|lock| lock_since(earlier_locks.get(&lock.address).copied(), lock))
        .collect();
    // Per lock, the few stacks kept for it are compared in turn.
    let mut earlier_stacks: HashMap<u64, Vec<&LockStack>> = HashMap::new();
    for stack in &before.stacks {
        earlier_stacks.entry(stack.lock).or_default().push(stack);
    }
    window.stacks = after
        .stacks
        .iter()
        .filter_map(|stack| {
            let earlier = earlier_stacks
                .get(&stack.lock)
                .and_then(|stacks| stacks.iter().find(|s| same_stack(s, stack)));
            let count = delta(stack.count, earlier.map_or(0, |s| s.count));
            (count > 0).then(|| LockStack {
                count,
                ..stack.clone()
            })
        })
        .collect();
    if let (Some(section), Some(earlier)) = (&mut window.kernel_locks, &before.kernel_locks) {
        section.locks = section
            .locks
            .iter()
            .filter_map(|lock| {
                let then = earlier
                    .locks
                    .iter()
                    .find(|l| l.address == lock.address && l.kind == lock.kind);
                kernel_lock_since(then, lock)
            })
            .collect();
        section.contentions = delta(section.contentions, earlier.contentions);
        section.wait_ns = delta(section.wait_ns, earlier.wait_ns);
    }
    if let (Some(requests), Some(earlier)) = (&mut window.requests, &before.requests) {
        requests.count = delta(requests.count, earlier.count);
    }
    window
}

/// A count over the window: the difference, or all of `now` when it is
/// below `then` (expired and back).
fn delta(now: u64, then: u64) -> u64 {
    now.checked_sub(then).unwrap_or(now)
}

fn same_stack(a: &LockStack, b: &LockStack) -> bool {
    a.lock == b.lock && a.source == b.source && a.route == b.route && a.frames == b.frames
}

/// The lock's figures over the window; None when it did nothing in it.
fn lock_since(before: Option<&Lock>, lock: &Lock) -> Option<Lock> {
    let Some(before) = before else {
        return Some(lock.clone());
    };
    let mut window = lock.clone();
    window.acquisitions = lock
        .acquisitions
        .map(|n| delta(n, before.acquisitions.unwrap_or(0)));
    for (function, count) in &mut window.calls {
        *count = delta(*count, before.calls.get(function).copied().unwrap_or(0));
    }
    window.calls.retain(|_, count| *count > 0);
    window.failed_tries = lock
        .failed_tries
        .map(|n| delta(n, before.failed_tries.unwrap_or(0)));
    window.contended = delta(lock.contended, before.contended);
    window.wakes = delta(lock.wakes, before.wakes);
    window.wait_ns = delta(lock.wait_ns, before.wait_ns);
    window.cpu_ns = lock.cpu_ns.map(|n| delta(n, before.cpu_ns.unwrap_or(0)));
    for caller in &mut window.callers {
        let then = before
            .callers
            .iter()
            .find(|c| {
                (&c.function, &c.module, c.offset)
                    == (&caller.function, &caller.module, caller.offset)
            })
            .map_or(0, |c| c.count);
        caller.count = delta(caller.count, then);
    }
    window.callers.retain(|caller| caller.count > 0);
    for (bound, count) in &mut window.wait_histogram {
        let then = before
            .wait_histogram
            .iter()
            .find(|(b, _)| b == bound)
            .map_or(0, |(_, n)| *n);
        *count = delta(*count, then);
    }
    window.wait_histogram.retain(|(_, count)| *count > 0);
    window.kernel_contentions = lock
        .kernel_contentions
        .map(|n| delta(n, before.kernel_contentions.unwrap_or(0)));
    window.kernel_wait_ns = lock
        .kernel_wait_ns
        .map(|n| delta(n, before.kernel_wait_ns.unwrap_or(0)));
    // No window of these: left out rather than shown as totals.
    window.holders.clear();
    window.holds = None;
    window.handoffs = None;
    window.per_request = None;
    window.saturation = None;
    window.removal = None;
    let active = window.acquisitions.unwrap_or(0) > 0
        || window.contended > 0
        || window.cpu_ns.unwrap_or(0) > 0
        || window.kernel_contentions.unwrap_or(0) > 0;
    active.then_some(window)
}

fn kernel_lock_since(before: Option<&KernelLock>, lock: &KernelLock) -> Option<KernelLock> {
    let Some(before) = before else {
        return Some(lock.clone());
    };
    let mut window = lock.clone();
    window.contentions = delta(lock.contentions, before.contentions);
    window.wait_ns = delta(lock.wait_ns, before.wait_ns);
    for stack in &mut window.kernel_stacks {
        let then = before
            .kernel_stacks
            .iter()
            .find(|s| s.functions == stack.functions && s.user_ip == stack.user_ip)
            .map_or((0, 0), |s| (s.contentions, s.wait_ns));
        stack.contentions = delta(stack.contentions, then.0);
        stack.wait_ns = delta(stack.wait_ns, then.1);
    }
    window.kernel_stacks.retain(|stack| stack.contentions > 0);
    (window.contentions > 0).then_some(window)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Caller, LockKind, WaitClass};

    fn lock(address: u64, acquisitions: u64, callers: &[(&str, u64)]) -> Lock {
        let mut lock = Lock::empty(address, LockKind::Mutex, WaitClass::Lock);
        lock.acquisitions = Some(acquisitions);
        lock.callers = callers
            .iter()
            .map(|(function, count)| Caller {
                function: Some(function.to_string()),
                module: None,
                offset: 0,
                count: *count,
            })
            .collect();
        lock
    }

    fn report(locks: Vec<Lock>, duration_s: f64) -> Report {
        let mut report = Report::empty_for_tests("inproc");
        report.locks = locks;
        report.duration_s = duration_s;
        report
    }

    /// 100 then 130 calls (a caller's 10 to 25, a new caller's 15): the
    /// window has 30, the callers 15 and 15; a quiet lock is left out; an
    /// expired lock back with 4 has 4.
    #[test]
    fn the_window_holds_what_happened_in_between() {
        let before = report(
            vec![
                lock(1, 100, &[("a", 10), ("b", 90)]),
                lock(2, 50, &[]),
                lock(3, 70, &[]),
            ],
            10.0,
        );
        let after = report(
            vec![
                lock(1, 130, &[("a", 25), ("b", 90), ("c", 15)]),
                lock(2, 50, &[]),
                lock(3, 4, &[]),
                lock(4, 9, &[]),
            ],
            14.5,
        );
        let window = since(&before, &after);
        assert_eq!(window.duration_s, 4.5);
        type Figures = (u64, Option<u64>, Vec<(String, u64)>);
        let figures: Vec<Figures> = window
            .locks
            .iter()
            .map(|l| {
                let callers = l
                    .callers
                    .iter()
                    .map(|c| (c.function.clone().unwrap_or_default(), c.count))
                    .collect();
                (l.address, l.acquisitions, callers)
            })
            .collect();
        assert_eq!(
            figures,
            vec![
                (1, Some(30), vec![("a".into(), 15), ("c".into(), 15)]),
                (3, Some(4), vec![]),
                (4, Some(9), vec![]),
            ]
        );
    }
}
