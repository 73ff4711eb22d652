//! Two lifetimes of one address (`tracer_common::lifetime`): the BPF side
//! keys every lock and futex word by address and generation; here the
//! generations of an address that no unmap covered in between merge back
//! into one key, so that a lock's row splits only where its memory went
//! away (a library unloaded and another loaded at its address, an exec).
//!
//! After the merge the key of an address's current lifetime is the plain
//! address; an earlier lifetime's key carries, above the address bits, how
//! many lifetimes ago it ended (1: the one just before the current one).
use std::{collections::HashMap, hash::Hash};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracer_common::{
    CallerKey, CpuSamples, FutexCounts, HoldCounts, HolderHolds, HolderKey, LockCounts, StackKey,
    Unmapped, WaitHolderKey, WaitTime, lifetime, php::RouteLockKey,
};

use super::{Collected, UnwoundStack};

/// The generation at the read and the unmaps that started each one.
#[derive(Debug, Clone, Default)]
pub(crate) struct Lifetimes {
    generation: u64,
    /// Oldest first.
    unmapped: Vec<Unmapped>,
}

/// A lock row of memory that went away during the recording (absent for
/// memory that is still there).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub struct EndedLifetime {
    /// How many times the memory at the address went away since this
    /// lifetime began (1: once, at its end); tells the rows of one address apart.
    pub earlier: u64,
    /// Whether an exec replaced the whole program (else an unmap, e.g. `dlclose`).
    pub by_exec: bool,
    /// The module that held it was loaded and unloaded between two of
    /// locktrace's reads of the target's maps: its symbols were never
    /// read, so the row is counted but not named (issue 52 D11).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub module_unseen: bool,
}

impl Lifetimes {
    pub(crate) fn new(generation: u64, mut unmapped: Vec<Unmapped>) -> Lifetimes {
        unmapped.sort_by_key(|u| u.generation);
        Lifetimes {
            generation,
            unmapped,
        }
    }

    /// True when no watched memory went away: every key is its address.
    pub(crate) fn is_trivial(&self) -> bool {
        self.generation == 0
    }

    /// The generation that began the lifetime holding `address` in `generation`.
    fn began(&self, address: u64, generation: u64) -> u64 {
        self.unmapped
            .iter()
            .filter(|u| u.generation <= generation && u.start <= address && address < u.end)
            .map(|u| u.generation)
            .max()
            .unwrap_or(0)
    }

    /// The merged key of a BPF key (see the module's comment).
    pub(crate) fn merged(&self, key: u64) -> u64 {
        let (address, generation) = lifetime::split(key);
        let began = self.began(address, generation);
        let later = self
            .unmapped
            .iter()
            .filter(|u| u.generation > began && u.generation <= self.generation)
            .filter(|u| u.start <= address && address < u.end)
            .map(|u| u.generation)
            .collect::<std::collections::BTreeSet<_>>()
            .len() as u64;
        lifetime::tag(address, later)
    }

    /// What ended the lifetime of a merged key, if it ended.
    pub(crate) fn ended(&self, merged: u64) -> Option<EndedLifetime> {
        let (address, earlier) = lifetime::split(merged);
        if earlier == 0 {
            return None;
        }
        // The unmap right after that lifetime: the `earlier`-th from the end.
        let mut covering: Vec<&Unmapped> = self
            .unmapped
            .iter()
            .filter(|u| u.generation <= self.generation)
            .filter(|u| u.start <= address && address < u.end)
            .collect();
        covering.dedup_by_key(|u| u.generation);
        let ender = covering.len().checked_sub(earlier as usize)?;
        Some(EndedLifetime {
            earlier,
            by_exec: (covering[ender].start, covering[ender].end) == lifetime::EVERYTHING,
            module_unseen: false,
        })
    }
}

/// A map value that two keys merging into one add up.
trait Merge {
    fn merge(&mut self, other: &Self);
}

impl Merge for u64 {
    fn merge(&mut self, other: &Self) {
        *self = self.saturating_add(*other);
    }
}

fn add_all(into: &mut [u64], from: &[u64]) {
    for (into, from) in into.iter_mut().zip(from) {
        *into = into.saturating_add(*from);
    }
}

impl Merge for LockCounts {
    fn merge(&mut self, other: &Self) {
        add_all(&mut self.calls, &other.calls);
    }
}

impl Merge for FutexCounts {
    fn merge(&mut self, other: &Self) {
        self.waits.merge(&other.waits);
        self.wait_ns.merge(&other.wait_ns);
        self.wakes.merge(&other.wakes);
        self.max_wait_ns = self.max_wait_ns.max(other.max_wait_ns);
        add_all(&mut self.wait_histogram, &other.wait_histogram);
    }
}

impl Merge for tracer_common::HandoffCounts {
    fn merge(&mut self, other: &Self) {
        add_all(&mut self.counts, &other.counts);
    }
}

impl Merge for HoldCounts {
    fn merge(&mut self, other: &Self) {
        self.holds.merge(&other.holds);
        self.hold_ns.merge(&other.hold_ns);
        self.max_hold_ns = self.max_hold_ns.max(other.max_hold_ns);
        add_all(&mut self.hold_histogram, &other.hold_histogram);
    }
}

impl Merge for HolderHolds {
    fn merge(&mut self, other: &Self) {
        self.holds.merge(&other.holds);
        self.hold_ns.merge(&other.hold_ns);
    }
}

impl Merge for WaitTime {
    fn merge(&mut self, other: &Self) {
        self.waits.merge(&other.waits);
        self.wait_ns.merge(&other.wait_ns);
    }
}

impl Merge for CpuSamples {
    fn merge(&mut self, other: &Self) {
        self.user.merge(&other.user);
        self.kernel.merge(&other.kernel);
    }
}

/// `map` with each key rewritten by `rekey`, values of keys that meet added up.
fn rekey<K: Eq + Hash, V: Merge>(map: &mut HashMap<K, V>, rekey: impl Fn(&K) -> K) {
    let mut merged: HashMap<K, V> = HashMap::with_capacity(map.len());
    for (key, value) in map.drain() {
        match merged.entry(rekey(&key)) {
            std::collections::hash_map::Entry::Occupied(mut slot) => slot.get_mut().merge(&value),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(value);
            }
        }
    }
    *map = merged;
}

impl Collected {
    /// Rewrites every key to its merged one (see the module's comment).
    pub(crate) fn merge_lifetimes(&mut self, lifetimes: Lifetimes) {
        if !lifetimes.is_trivial() {
            self.rekey_lifetimes(&lifetimes);
        }
        self.lifetimes = lifetimes;
    }

    fn rekey_lifetimes(&mut self, lifetimes: &Lifetimes) {
        let key = |k: &u64| lifetimes.merged(*k);
        rekey(&mut self.locks, key);
        rekey(&mut self.futexes, key);
        rekey(&mut self.condvars, key);
        rekey(&mut self.go_futexes, key);
        rekey(&mut self.holds, key);
        rekey(&mut self.handoffs, key);
        rekey(&mut self.cpu_locks, key);
        let caller = |k: &CallerKey| CallerKey {
            lock: lifetimes.merged(k.lock),
            ..*k
        };
        rekey(&mut self.callers, caller);
        rekey(&mut self.failed_tries, caller);
        rekey(&mut self.holders, |k: &HolderKey| HolderKey {
            lock: lifetimes.merged(k.lock),
            ..*k
        });
        rekey(&mut self.wait_holders, |k: &WaitHolderKey| WaitHolderKey {
            uaddr: lifetimes.merged(k.uaddr),
            ..*k
        });
        self.merge_stacks(lifetimes);
        if let Some(php) = &mut self.php {
            let locks = std::mem::take(&mut php.locks);
            for (key, counts) in locks {
                let merged = RouteLockKey {
                    lock: lifetimes.merged(key.lock),
                    ..key
                };
                let into = php.locks.entry(merged).or_default();
                into.calls += counts.calls;
                into.waits += counts.waits;
                into.wait_ns += counts.wait_ns;
            }
        }
        for wait in self.in_flight.waits.values_mut() {
            wait.uaddr = lifetimes.merged(wait.uaddr);
        }
        self.in_flight.held = self
            .in_flight
            .held
            .drain()
            .map(|(mut key, held)| {
                key.lock = lifetimes.merged(key.lock);
                (key, held)
            })
            .collect();
    }

    /// Stack counts add up; a merged key's unwound stacks follow each other,
    /// the later key's counted on from the earlier key's total (each stands
    /// for the calls up to the next one's `count_at`).
    fn merge_stacks(&mut self, lifetimes: &Lifetimes) {
        // Kernel lock keys hold a kernel address, in no generation.
        let stack_key = |k: &StackKey| StackKey {
            lock: if tracer_common::stack_kind::is_kernel_lock(k.stack_id) {
                k.lock
            } else {
                lifetimes.merged(k.lock)
            },
            ..*k
        };
        let mut by_generation: Vec<(StackKey, u64)> =
            self.stacks.iter().map(|(k, &n)| (*k, n)).collect();
        by_generation.sort_by_key(|(k, _)| lifetime::split(k.lock).1);
        let mut unwound: HashMap<StackKey, Vec<UnwoundStack>> = HashMap::new();
        let mut counted: HashMap<StackKey, u64> = HashMap::new();
        for (key, count) in by_generation {
            let merged = stack_key(&key);
            let before = counted.entry(merged).or_insert(0);
            if let Some(stacks) = self.unwound.remove(&key) {
                unwound
                    .entry(merged)
                    .or_default()
                    .extend(stacks.into_iter().map(|stack| UnwoundStack {
                        count_at: stack.count_at + *before,
                        ..stack
                    }));
            }
            *before += count;
        }
        self.stacks = counted;
        self.unwound = unwound;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: (u64, u64) = (0x7f00_0000_0000, 0x7f00_0001_0000);
    const LOCK: u64 = 0x7f00_0000_4040;
    const HEAP_LOCK: u64 = 0x5555_0000_1000;

    fn unmapped(start: u64, end: u64, generation: u64) -> Unmapped {
        Unmapped {
            start,
            end,
            generation,
        }
    }

    #[test]
    fn an_address_no_unmap_covered_keeps_one_key_across_generations() {
        // Another module went away at generation 1: the heap lock is one lock.
        let lifetimes = Lifetimes::new(1, vec![unmapped(LIB.0, LIB.1, 1)]);
        assert_eq!(lifetimes.merged(lifetime::tag(HEAP_LOCK, 0)), HEAP_LOCK);
        assert_eq!(lifetimes.merged(lifetime::tag(HEAP_LOCK, 1)), HEAP_LOCK);
        assert_eq!(lifetimes.ended(HEAP_LOCK), None);
    }

    #[test]
    fn a_dlclose_then_dlopen_at_the_same_address_splits_the_lock() {
        // dlclose (1), then the new library's MAP_FIXED segments (2, 3).
        let lifetimes = Lifetimes::new(
            3,
            vec![
                unmapped(LIB.0, LIB.1, 1),
                unmapped(LIB.0, LIB.0 + 0x1000, 2),
                unmapped(LIB.0 + 0x3000, LIB.1, 3),
            ],
        );
        let old = lifetimes.merged(lifetime::tag(LOCK, 0));
        let new = lifetimes.merged(lifetime::tag(LOCK, 3));
        assert_eq!(new, LOCK);
        assert_eq!(old, lifetime::tag(LOCK, 2));
        assert_eq!(
            lifetimes.ended(old),
            Some(EndedLifetime {
                earlier: 2,
                by_exec: false,
                module_unseen: false,
            })
        );
    }

    #[test]
    fn an_exec_ends_every_lifetime() {
        let (start, end) = lifetime::EVERYTHING;
        let lifetimes = Lifetimes::new(1, vec![unmapped(start, end, 1)]);
        let old = lifetimes.merged(lifetime::tag(HEAP_LOCK, 0));
        assert_eq!(old, lifetime::tag(HEAP_LOCK, 1));
        assert!(lifetimes.ended(old).is_some_and(|ended| ended.by_exec));
        assert_eq!(lifetimes.merged(lifetime::tag(HEAP_LOCK, 1)), HEAP_LOCK);
    }

    #[test]
    fn counts_of_merged_keys_add_up_and_stacks_follow_each_other() {
        let lifetimes = Lifetimes::new(1, vec![unmapped(LIB.0, LIB.1, 1)]);
        let mut collected = Collected::default();
        let mut counts = LockCounts::default();
        counts.calls[0] = 3;
        collected.locks.insert(lifetime::tag(HEAP_LOCK, 0), counts);
        collected.locks.insert(lifetime::tag(HEAP_LOCK, 1), counts);
        let key = |generation| StackKey {
            lock: lifetime::tag(HEAP_LOCK, generation),
            stack_id: 0,
            return_ip: 0x1234,
            php_site: 0,
        };
        collected.stacks.insert(key(0), 3);
        collected.stacks.insert(key(1), 3);
        let stack = |count_at| UnwoundStack {
            count_at,
            frames: vec![count_at],
            php: Vec::new(),
            route: 0,
            ended_by: None,
        };
        collected.unwound.insert(key(0), vec![stack(1)]);
        collected.unwound.insert(key(1), vec![stack(1), stack(2)]);
        collected.merge_lifetimes(lifetimes);
        assert_eq!(collected.locks[&HEAP_LOCK].calls[0], 6);
        assert_eq!(collected.stacks[&key(0)], 6);
        let counts_at: Vec<u64> = collected.unwound[&key(0)]
            .iter()
            .map(|s| s.count_at)
            .collect();
        assert_eq!(counts_at, [1, 4, 5]);
    }
}
