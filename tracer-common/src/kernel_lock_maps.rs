//! Kernel lock contention (`lock:contention_begin/end`): the maps' keys and values.

/// Key of `KERNEL_LOCKS`: contentions of one kernel lock, with one set of
/// flags, from one kernel stack, while one user futex call (or none) was
/// in progress, from one user instruction, under one route (`--php`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KernelLockKey {
    /// The kernel lock's address.
    pub lock: u64,
    /// The futex word of the futex syscall the thread was in (keyed as
    /// `FUTEXES`: `lifetime::tag`ged), 0 outside one.
    pub user_lock: u64,
    /// The user instruction pointer saved at the kernel entry (syscall,
    /// fault or interrupt): the user side's innermost frame.
    pub user_ip: u64,
    /// Id in `KERNEL_LOCK_STACKS`, -1 when lost.
    pub stack_id: i64,
    /// `kernel_lock::SPIN` … `MUTEX` bits.
    pub flags: u32,
    pub _pad: u32,
    /// `--php`: the route key of the request the thread was serving
    /// (`THREAD_ROUTES`; `php::NO_REQUEST` outside one, and without `--php`).
    pub route: u64,
}

/// Value of `KERNEL_LOCKS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLockCounts {
    pub contentions: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
}

/// Value of `KERNEL_LOCK_SITES` (keyed by a `KernelLockKey` whose
/// `stack_id` is 0): the site's contentions begun, and the last kernel
/// stack taken for it (see `kernel_lock::STACKS_EXACT_FIRST`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLockSite {
    pub begun: u64,
    pub stack_id: i64,
}

/// Value of the per-thread `KERNEL_LOCK_BEGINS`: a contention in progress.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelLockBegin {
    pub key: KernelLockKey,
    pub start_ns: u64,
}
