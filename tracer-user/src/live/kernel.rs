//! The kernel locks of a live session (`serve`, `top`): what each row (a
//! kernel lock and its flags) did per interval, and the rows quiet for the
//! expiry period, whose `KERNEL_LOCKS` keys the session deletes as it
//! deletes quiet user locks' (so a long session's map holds the kernel
//! locks of now, not every one ever met).
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use tracer_common::{KernelLockCounts, KernelLockKey};

use crate::model::{KernelLockKind, KernelLocks};

/// What one kernel lock row did in an interval.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelLockActivity {
    pub address: u64,
    pub flags: u32,
    /// As the section names it (None: neither a symbol nor a type told).
    pub name: Option<String>,
    pub kind: KernelLockKind,
    pub contentions: u64,
    pub wait_ns: u64,
    /// The row's busiest kernel function since attach.
    pub kernel_site: Option<String>,
}

/// A row's totals as of the previous interval.
#[derive(Debug, Clone, Copy)]
struct Totals {
    contentions: u64,
    wait_ns: u64,
    last_active: Instant,
}

/// The rows' totals between intervals.
#[derive(Debug, Default)]
pub(crate) struct KernelAging {
    previous: HashMap<(u64, u32), Totals>,
}

impl KernelAging {
    /// Each row's activity since the previous call (active rows only, most
    /// wait first), noting when each row was last active.
    pub(crate) fn activity(
        &mut self,
        section: &KernelLocks,
        now: Instant,
    ) -> Vec<KernelLockActivity> {
        let mut active = Vec::new();
        for lock in &section.locks {
            let before = self
                .previous
                .entry((lock.address, lock.flags))
                .or_insert(Totals {
                    contentions: 0,
                    wait_ns: 0,
                    last_active: now,
                });
            // Below the previous total: the row's keys expired and it came back.
            let delta = |now: u64, then: u64| now.checked_sub(then).unwrap_or(now);
            let contentions = delta(lock.contentions, before.contentions);
            let wait_ns = delta(lock.wait_ns, before.wait_ns);
            before.contentions = lock.contentions;
            before.wait_ns = lock.wait_ns;
            if contentions == 0 {
                continue;
            }
            before.last_active = now;
            active.push(KernelLockActivity {
                address: lock.address,
                flags: lock.flags,
                name: lock.name.clone(),
                kind: lock.kind,
                contentions,
                wait_ns,
                kernel_site: lock.kernel_sites.first().map(|site| site.function.clone()),
            });
        }
        let shown: HashSet<(u64, u32)> = section
            .locks
            .iter()
            .map(|lock| (lock.address, lock.flags))
            .collect();
        self.previous.retain(|row, _| shown.contains(row));
        active.sort_by(|a, b| {
            b.wait_ns
                .cmp(&a.wait_ns)
                .then(a.address.cmp(&b.address))
                .then(a.flags.cmp(&b.flags))
        });
        active
    }

    /// The rows with no contention for `expire_after`, forgotten here (the
    /// caller deletes their keys).
    pub(crate) fn expire(&mut self, now: Instant, expire_after: Duration) -> Vec<(u64, u32)> {
        let quiet: Vec<(u64, u32)> = self
            .previous
            .iter()
            .filter(|(_, totals)| now.duration_since(totals.last_active) >= expire_after)
            .map(|(&row, _)| row)
            .collect();
        for row in &quiet {
            self.previous.remove(row);
        }
        quiet
    }
}

/// The keys of the rows `quiet` (lock, flags), with the counts they hold;
/// and the kernel stack ids only they use (the ones to delete with them).
pub(crate) fn keys_of(
    counts: &HashMap<KernelLockKey, KernelLockCounts>,
    quiet: &[(u64, u32)],
) -> (Vec<(KernelLockKey, KernelLockCounts)>, Vec<u32>) {
    let quiet: HashSet<(u64, u32)> = quiet.iter().copied().collect();
    let (gone, kept): (Vec<_>, Vec<_>) = counts
        .iter()
        .map(|(key, counts)| (*key, *counts))
        .partition(|(key, _)| quiet.contains(&(key.lock, key.flags)));
    let still_used: HashSet<i64> = kept.iter().map(|(key, _)| key.stack_id).collect();
    let mut stacks: Vec<u32> = gone
        .iter()
        .map(|(key, _)| key.stack_id)
        .filter(|id| !still_used.contains(id))
        .filter_map(|id| u32::try_from(id).ok())
        .collect();
    stacks.sort_unstable();
    stacks.dedup();
    (gone, stacks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::KernelLock;

    fn row(address: u64, flags: u32, contentions: u64) -> KernelLock {
        KernelLock {
            address,
            flags,
            kind: KernelLockKind::of_flags(flags),
            contentions,
            wait_ns: contentions * 10,
            ..KernelLock::default()
        }
    }

    fn section(locks: Vec<KernelLock>) -> KernelLocks {
        KernelLocks {
            locks,
            ..KernelLocks::default()
        }
    }

    /// Fake reads a second apart: a row quiet for the expiry period is
    /// given back once (its keys to delete), the busy one never; a row
    /// that comes back after its keys went counts from zero again.
    #[test]
    fn quiet_kernel_locks_expire_and_busy_ones_stay() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let expire_after = Duration::from_secs(3);
        let mut aging = KernelAging::default();
        let first = aging.activity(&section(vec![row(0xa, 4, 5), row(0xb, 1, 2)]), at(0));
        let counts: Vec<(u64, u64)> = first.iter().map(|a| (a.address, a.contentions)).collect();
        assert_eq!(counts, [(0xa, 5), (0xb, 2)]);
        for s in 1..=2 {
            aging.activity(&section(vec![row(0xa, 4, 5), row(0xb, 1, 2 + s)]), at(s));
            assert_eq!(aging.expire(at(s), expire_after), []);
        }
        let busy = aging.activity(&section(vec![row(0xa, 4, 5), row(0xb, 1, 9)]), at(3));
        assert_eq!(busy.len(), 1);
        assert_eq!((busy[0].address, busy[0].contentions), (0xb, 5));
        assert_eq!(aging.expire(at(3), expire_after), [(0xa, 4)]);
        assert_eq!(aging.previous.len(), 1);
        assert_eq!(aging.expire(at(4), expire_after), []);
        // Its keys deleted, 0xa comes back with 1: one new contention.
        let back = aging.activity(&section(vec![row(0xa, 4, 1), row(0xb, 1, 9)]), at(5));
        assert_eq!(
            back.iter()
                .map(|a| (a.address, a.contentions))
                .collect::<Vec<_>>(),
            [(0xa, 1)]
        );
    }

    /// The keys of a quiet row, and the stacks no other row's key uses.
    #[test]
    fn the_keys_and_stacks_of_quiet_rows() {
        let key = |lock, flags, stack_id| KernelLockKey {
            lock,
            flags,
            stack_id,
            ..KernelLockKey::default()
        };
        let one = KernelLockCounts {
            contentions: 1,
            wait_ns: 1,
            max_wait_ns: 1,
        };
        let counts: HashMap<KernelLockKey, KernelLockCounts> = [
            (key(0xa, 4, 1), one),
            (key(0xa, 4, 2), one),
            (key(0xa, 4, -1), one),
            (key(0xa, 2, 2), one),
            (key(0xb, 1, 3), one),
        ]
        .into();
        let (mut gone, stacks) = keys_of(&counts, &[(0xa, 4)]);
        gone.sort_by_key(|(key, _)| key.stack_id);
        let gone: Vec<i64> = gone.iter().map(|(key, _)| key.stack_id).collect();
        assert_eq!(gone, [-1, 1, 2]);
        // Stack 2 is the read side's too: it stays.
        assert_eq!(stacks, [1]);
    }
}
