//! Indexes of the `CPU_COUNTS` array: how the sampler classified the
//! target's CPU samples.

/// Every sample taken while a thread of the target was on the CPU.
pub const TARGET: u32 = 0;
/// In user lock code (attributed in `CPU_LOCKS`).
pub const LOCK_USER: u32 = 1;
/// In the kernel inside a futex syscall on a lock word (in `CPU_LOCKS`).
pub const LOCK_KERNEL: u32 = 2;
/// In the kernel on a trap from a lock function that is no syscall: the
/// uprobe's breakpoint handling, the tracer's cost.
pub const TRACER: u32 = 3;
/// In a futex syscall of a condvar wait or of the Go runtime: not a lock's.
pub const FUTEX_NOT_LOCK: u32 = 4;
/// In the kernel on an interrupt or exception from user code outside
/// lock code: mostly the scheduler's work after a wake-up (the
/// reschedule interrupt, the preempted thread's switch back), also
/// page faults and timer ticks.
pub const INTERRUPTED: u32 = 5;
pub const COUNT: u32 = 6;
