//! Hold times and holders (`--hold-times`): the maps' keys and values.

use crate::histogram;

/// Key of the `HELD` map (`--hold-times`): a thread's hold, or attempt, of a lock.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HeldKey {
    pub lock: u64,
    pub tid: u32,
    pub _pad: u32,
}

/// Value of the `HELD` map: when the hold began and who took it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Held {
    /// The lock call, or the end of the thread's last futex wait on the lock.
    pub start_ns: u64,
    /// Return address of the outermost lock call (the holder's call site).
    pub return_ip: u64,
    /// Lock calls not yet matched by unlocks (recursive mutexes, re-entered read locks).
    pub depth: u32,
    /// 1 when taken by a trylock: it may have failed, so the next lock call restarts it.
    pub tentative: u32,
    /// Where the return address of the last lock call counted in `depth` was
    /// on the stack, and its value: a lock function tail-called by another
    /// (musl) sees both the same, so it is not counted again.
    pub call_slot: u64,
    pub call_ip: u64,
}

/// Value of the `LOCK_HOLDER` map (`--hold-times`), keyed by lock: the thread
/// believed to hold it now, and its call site.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Holder {
    pub return_ip: u64,
    pub tid: u32,
    pub _pad: u32,
}

/// Value of the `HOLDS` map (`--hold-times`), keyed by lock: completed holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HoldCounts {
    pub holds: u64,
    pub hold_ns: u64,
    pub max_hold_ns: u64,
    pub hold_histogram: [u64; histogram::BUCKETS],
}

/// Key of the `HOLDERS` map: holds of a lock taken at one call site.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HolderKey {
    pub lock: u64,
    pub return_ip: u64,
}

/// Value of the `HOLDERS` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HolderHolds {
    pub holds: u64,
    pub hold_ns: u64,
}

/// Key of the `WAIT_HOLDERS` map: futex waits on `uaddr` while the lock was
/// held by the call site `return_ip` (0: unknown, no lock probes) in thread
/// `tid` (0: unknown; in contention mode read from glibc's mutex owner field,
/// so userspace checks it is a thread of the target).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WaitHolderKey {
    pub uaddr: u64,
    pub return_ip: u64,
    pub tid: u32,
    pub _pad: u32,
}

/// Value of the `WAIT_HOLDERS` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WaitTime {
    pub waits: u64,
    pub wait_ns: u64,
}
