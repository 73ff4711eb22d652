//! Kernel lock contention the target's threads met (`kernel_locks` in
//! JSON): the kernel's `lock:contention_begin`/`contention_end`
//! tracepoints (Linux 5.19+), joined to the user side.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Frame;

/// The report's `kernel_locks` block.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct KernelLocks {
    /// Why the section is empty although traced for: the kernel has no
    /// lock tracepoints (before Linux 5.19), or refused them. Absent when traced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    /// One row per (kernel lock, flags), by wait time.
    #[serde(default)]
    pub locks: Vec<KernelLock>,
    /// Contentions over all rows.
    #[serde(default)]
    pub contentions: u64,
    #[serde(default)]
    pub wait_ns: u64,
    /// `contention_begin` events while the thread already waited for a
    /// kernel lock (a spinlock inside a rwsem's slow path, a mutex's spin
    /// before it sleeps): in no row, as `perf lock contention` leaves
    /// them out. Every begin of the target is `contentions + nested`.
    #[serde(default)]
    pub nested: u64,
    /// Contentions not counted: their ends had no begin (begun before the
    /// attach), their thread or key did not fit in the maps.
    #[serde(default)]
    pub lost: u64,
    /// How the kernel stacks were taken: each site's (lock, flags, user
    /// lock, user instruction, route) first `stacks_exact_first`
    /// contentions take their own, then one in `stack_sample_every`, the
    /// ones between counting under the site's last stack. Every count is
    /// exact; a site's split between kernel paths (`kernel_sites`,
    /// `kernel_stacks`) is sampled past the first. Absent when not traced
    /// and in older reports (every contention took its stack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacks_exact_first: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_sample_every: Option<u64>,
}

/// A kernel lock's contention with one set of flags.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct KernelLock {
    /// The lock's kernel address.
    #[serde(with = "super::address")]
    #[schemars(with = "super::address::Hex")]
    pub address: u64,
    /// A global lock's symbol (from /proc/kallsyms), else the lock type
    /// its callers say (`mmap_lock`, `futex hash bucket`, `runqueue`,
    /// `page table lock`); null when neither tells.
    pub name: Option<String>,
    pub kind: KernelLockKind,
    /// The tracepoint's flags (`LCB_F_*`: 1 spin, 2 read, 4 write, 8 rt,
    /// 16 percpu, 32 mutex).
    pub flags: u32,
    pub contentions: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
    /// The kernel functions that took the lock (the first frame outside
    /// the kernel's lock code), busiest first.
    pub kernel_sites: Vec<KernelSite>,
    /// The user code that entered the kernel (the instruction of the
    /// syscall, fault or interrupt), busiest first.
    pub user_sites: Vec<KernelUserSite>,
    /// The user locks whose futex calls the contentions happened in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_locks: Vec<KernelUserLock>,
    /// Whole kernel stacks of the contentions with the user instruction
    /// each entered the kernel from, most wait first (at most
    /// [`KERNEL_STACKS_PER_LOCK`]; pprof's stacks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel_stacks: Vec<KernelStack>,
    /// `--php` (new): the contentions by the route of the request the
    /// waiting thread was serving, named as the `routes` rows are, most
    /// wait first; they add up to the row's `contentions` and `wait_ns`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<KernelLockRoute>,
}

/// Contentions of a kernel lock under one route (`--php`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct KernelLockRoute {
    /// The route's row name in `routes` (`GET /posts/:id`, `(outside
    /// requests)`, `(other routes)`, …).
    pub route: String,
    pub contentions: u64,
    pub wait_ns: u64,
}

/// Kernel stacks kept per kernel lock row.
pub(crate) const KERNEL_STACKS_PER_LOCK: usize = 20;

/// Contentions of a kernel lock with one kernel stack, from one user instruction.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct KernelStack {
    /// The kernel functions, innermost (the lock code) first; an address
    /// where `/proc/kallsyms` names none.
    pub functions: Vec<String>,
    /// The user instruction (one of `user_sites`' `ip`s).
    #[serde(with = "super::address")]
    #[schemars(with = "super::address::Hex")]
    pub user_ip: u64,
    pub contentions: u64,
    pub wait_ns: u64,
}

/// How a kernel lock was taken, from the tracepoint's flags.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum KernelLockKind {
    Spinlock,
    RwlockRead,
    RwlockWrite,
    RwsemRead,
    RwsemWrite,
    Mutex,
    RtMutex,
    PercpuRwsemRead,
    PercpuRwsemWrite,
    #[default]
    Other,
}

/// Contentions of a kernel lock from one kernel function.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct KernelSite {
    pub function: String,
    pub contentions: u64,
    pub wait_ns: u64,
}

/// Contentions of a kernel lock from one user instruction, with the user
/// stacks unwound there (`--stacks`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct KernelUserSite {
    /// The user instruction pointer saved at the kernel entry (0x0:
    /// unknown, a kernel without `bpf_task_pt_regs`).
    #[serde(with = "super::address")]
    #[schemars(with = "super::address::Hex")]
    pub ip: u64,
    /// That instruction, named (the syscall wrapper, or the faulting code).
    pub frame: Option<Frame>,
    pub contentions: u64,
    pub wait_ns: u64,
    /// `--stacks`: whole user stacks, innermost first, each with the
    /// contentions it stands for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<KernelUserStack>,
}

/// A user stack of kernel lock contentions.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct KernelUserStack {
    pub contentions: u64,
    pub frames: Vec<Frame>,
}

/// Contentions of a kernel lock inside futex calls on one user lock.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct KernelUserLock {
    /// The user lock's address (its row's), or the futex word when no row holds it.
    #[serde(
        serialize_with = "super::address::serialize_without_lifetime",
        deserialize_with = "super::address::deserialize"
    )]
    #[schemars(with = "super::address::Hex")]
    pub address: u64,
    /// Its row's name, when named.
    pub name: Option<String>,
    pub contentions: u64,
    pub wait_ns: u64,
}

impl KernelLockKind {
    /// The kind the tracepoint's `flags` say (`LCB_F_*`).
    pub(crate) fn of_flags(flags: u32) -> KernelLockKind {
        use tracer_common::kernel_lock::{MUTEX, PERCPU, READ, RT, SPIN, WRITE};
        let (read, write) = (flags & READ != 0, flags & WRITE != 0);
        if flags & RT != 0 {
            KernelLockKind::RtMutex
        } else if flags & MUTEX != 0 {
            KernelLockKind::Mutex
        } else if flags & PERCPU != 0 {
            match (read, write) {
                (true, _) => KernelLockKind::PercpuRwsemRead,
                _ => KernelLockKind::PercpuRwsemWrite,
            }
        } else if flags & SPIN != 0 {
            match (read, write) {
                (true, _) => KernelLockKind::RwlockRead,
                (_, true) => KernelLockKind::RwlockWrite,
                _ => KernelLockKind::Spinlock,
            }
        } else if read {
            KernelLockKind::RwsemRead
        } else if write {
            KernelLockKind::RwsemWrite
        } else {
            KernelLockKind::Other
        }
    }

    /// A waiter spins (burns CPU) rather than sleeps: spinlocks and rwlocks.
    pub(crate) fn spins(self) -> bool {
        matches!(
            self,
            KernelLockKind::Spinlock | KernelLockKind::RwlockRead | KernelLockKind::RwlockWrite
        )
    }

    /// The word the table shows.
    pub fn word(self) -> &'static str {
        match self {
            KernelLockKind::Spinlock => "spinlock",
            KernelLockKind::RwlockRead => "rwlock read",
            KernelLockKind::RwlockWrite => "rwlock write",
            KernelLockKind::RwsemRead => "rwsem read",
            KernelLockKind::RwsemWrite => "rwsem write",
            KernelLockKind::Mutex => "mutex",
            KernelLockKind::RtMutex => "rt_mutex",
            KernelLockKind::PercpuRwsemRead => "percpu rwsem read",
            KernelLockKind::PercpuRwsemWrite => "percpu rwsem write",
            KernelLockKind::Other => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::KernelLockKind as K;

    /// The flags the kernel's lock code passes (kernel/locking/*.c).
    #[test]
    fn kinds_from_flags() {
        assert_eq!(K::of_flags(1), K::Spinlock);
        assert_eq!(K::of_flags(1 | 2), K::RwlockRead);
        assert_eq!(K::of_flags(1 | 4), K::RwlockWrite);
        assert_eq!(K::of_flags(2), K::RwsemRead);
        assert_eq!(K::of_flags(4), K::RwsemWrite);
        assert_eq!(K::of_flags(32), K::Mutex);
        assert_eq!(K::of_flags(32 | 1), K::Mutex);
        assert_eq!(K::of_flags(8), K::RtMutex);
        assert_eq!(K::of_flags(16 | 2), K::PercpuRwsemRead);
        assert_eq!(K::of_flags(16 | 4), K::PercpuRwsemWrite);
        assert_eq!(K::of_flags(0), K::Other);
    }
}
