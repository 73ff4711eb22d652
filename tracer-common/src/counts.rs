//! The counters' map keys and values: lock calls, futex waits, callers, handoffs.

use crate::{LOCK_OPS, handoff_class, histogram};

/// Key of `PENDING_TRIES`: a call of a lock function that may fail, from
/// its entry to its return, by thread and the stack slot of its return
/// address (right after the return the stack pointer is 8 bytes above it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PendingKey {
    pub tid: u32,
    pub _pad: u32,
    pub return_slot: u64,
}

/// Value of `PENDING_TRIES`: what the return probe counts the call on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingTry {
    pub lock: u64,
    pub op: u32,
    /// 1 when the call was tail-called by another lock function (musl's
    /// lock jumps to its timed variant): not a second acquisition.
    pub nested: u32,
}

/// Value of the `LOCKS` map, keyed by the lock's address in the target:
/// how many times each lock function was called on it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LockCounts {
    pub calls: [u64; LOCK_OPS],
}

/// Value of the `HANDOFFS` map, keyed by lock (like `LOCKS`): the CPU of
/// the lock's last acquisition, and how many acquisitions happened on
/// another CPU than the one before (the lock's cache line had to move), by
/// [`handoff_class`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HandoffCounts {
    /// The CPU of the last acquisition, plus one (0: none seen yet).
    pub last_cpu: u32,
    pub _pad: u32,
    pub counts: [u64; handoff_class::COUNT],
}

/// Value of the `CPU_PLACES` array, indexed by CPU number: where the CPU
/// sits in the cache topology (userspace fills it from sysfs at attach).
/// Ids are plus one; 0 means unknown, which matches no other CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuPlace {
    /// The core (its SMT siblings share it).
    pub core: u32,
    /// The last-level (L3) cache; without cache information, the package.
    pub l3: u32,
}

/// CPUs `CPU_PLACES` covers; a CPU beyond is classified as another L3.
pub const MAX_CPUS: u32 = 4096;

/// Value of the `FUTEXES` map, keyed by the futex word's address in the target.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FutexCounts {
    /// futex calls that wait (WAIT, WAIT_BITSET, LOCK_PI, LOCK_PI2, WAIT_REQUEUE_PI).
    pub waits: u64,
    /// Total time spent inside those calls.
    pub wait_ns: u64,
    /// Longest single wait.
    pub max_wait_ns: u64,
    /// futex calls that wake (WAKE, WAKE_BITSET, UNLOCK_PI, WAKE_OP, REQUEUE, CMP_REQUEUE).
    pub wakes: u64,
    /// The waits by duration, log2 buckets (see [`histogram`]); they add up to `waits`.
    pub wait_histogram: [u64; histogram::BUCKETS],
}

/// Value of the per-thread `WAITING` map, keyed by thread id: a futex wait in progress.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FutexWait {
    /// The futex word, or for a condition-variable wait the condvar's address.
    pub uaddr: u64,
    pub start_ns: u64,
    /// [`wait_class`](crate::wait_class) of the wait: which map its counts go to.
    pub class: u32,
    /// Who held the lock when the wait began (see [`WaitHolderKey`](crate::WaitHolderKey)).
    pub holder_tid: u32,
    pub holder_ip: u64,
}

/// Value of the per-thread `COND_THREADS` map: the thread is inside
/// `pthread_cond_wait`/`_timedwait`/`_clockwait` on `cond` with `mutex`.
/// Its futex waits there are waits for the condition, except those on the
/// mutex's own bytes (re-acquiring it after the wake), which stay lock waits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CondWait {
    pub cond: u64,
    pub mutex: u64,
}

/// Bytes of a pthread mutex (glibc and musl, x86-64): a futex word inside
/// them is the mutex's.
pub const MUTEX_SPAN: u64 = 40;

/// Key of the `CALLERS` map: which code address called which lock function on which lock.
/// Userspace also uses it to drop nested calls (musl's `pthread_mutex_lock`
/// calls `pthread_mutex_timedlock`, whose caller is then a lock function).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CallerKey {
    pub lock: u64,
    /// Return address of the lock call (the instruction after the `call`).
    pub return_ip: u64,
    /// [`LockOp`](crate::LockOp) index.
    pub op: u32,
    pub _pad: u32,
}

/// Value of `THREAD_ROUTES` (`--php`), per thread: the route of its
/// current request, and its last lock call's entry. A call of a function
/// another lock function may tail-call, entered with the same return slot
/// and address, was tail-called by that one (the jump leaves the stack as
/// it was): one acquisition, not two.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ThreadRoute {
    pub route: u64,
    /// Where the last call's return address is on the stack, and that address.
    pub return_slot: u64,
    pub return_ip: u64,
    /// Its [`LockOp`](crate::LockOp) index.
    pub op: u64,
}

/// An entry of the `UNMAPPED` log: memory `[start, end)` went away, and
/// keys from `generation` on are of what comes after it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unmapped {
    pub start: u64,
    pub end: u64,
    pub generation: u64,
}
