//! Kernel lock contention (`lock:contention_begin`/`contention_end`,
//! Linux 5.19+) of the target's threads. The tracepoints fire only when a
//! kernel lock is contended, so an uncontended target costs nothing.

/// Bits of the tracepoints' `flags` (the kernel's `LCB_F_*`).
pub const SPIN: u32 = 1 << 0;
pub const READ: u32 = 1 << 1;
pub const WRITE: u32 = 1 << 2;
pub const RT: u32 = 1 << 3;
pub const PERCPU: u32 = 1 << 4;
pub const MUTEX: u32 = 1 << 5;
/// (lock, flags, kernel stack, user lock, user site) keys `KERNEL_LOCKS` holds.
pub const MAX_KEYS: u32 = 16_384;
/// Kernel stacks `KERNEL_LOCK_STACKS` holds.
pub const MAX_STACKS: u32 = 4_096;
/// Frames of a kernel stack (the kernel's `PERF_MAX_STACK_DEPTH`).
pub const STACK_DEPTH: usize = 127;
/// A site's (a key without its kernel stack: lock, flags, user lock, user
/// instruction, route) first contentions each take their kernel stack;
/// after them one in [`STACK_SAMPLE_EVERY`] does, and those between count
/// under the site's last stack taken. The kernel's stack walk was most of
/// a begin's cost (7-11 µs a run against 0.6 µs for an end on the kit's
/// FrankenPHP, 3-4 % of its CPU: docs/benchmarks.md); a site nearly
/// always enters one kernel path, so its split between paths is sampled
/// while every count stays exact.
pub const STACKS_EXACT_FIRST: u64 = 8;
/// See [`STACKS_EXACT_FIRST`]; a power of two.
pub const STACK_SAMPLE_EVERY: u64 = 16;
/// Slots of the per-CPU `KERNEL_LOCK_EVENTS` array.
pub mod event {
    /// A `contention_begin` while the thread already waited for a
    /// kernel lock (a spinlock inside a rwsem's slow path, a mutex's
    /// spin before it sleeps): not a contention of its own, as in
    /// `perf lock contention`.
    pub const NESTED: u32 = 0;
    /// A `contention_end` with no begin of the thread (it began before
    /// the attach or while counting was off).
    pub const UNMATCHED_END: u32 = 1;
    /// A begin whose thread state did not fit in `KERNEL_LOCK_BEGINS`.
    pub const UNTRACKED: u32 = 2;
    /// A kernel stack that could not be stored (`stack_id` -1).
    pub const STACK_LOST: u32 = 3;
    /// A contention whose key did not fit in `KERNEL_LOCKS`: not counted.
    pub const KEYS_FULL: u32 = 4;
    pub const COUNT: u32 = 5;
}
