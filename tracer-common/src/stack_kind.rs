//! Values of `StackKey::stack_id`: what a stack key counts.

/// Lock calls (return address set) and futex waits (return address 0).
pub const USE: i64 = 0;
/// Calls of the lock init functions (`pthread_mutex_init`, …): where
/// the lock at that address was created.
pub const CREATION: i64 = 1;
/// CPU samples in lock code, user mode (`--stacks` with the sampler):
/// the interrupted registers, keyed by the lock the sampler attributed
/// the sample to (return address 0).
pub const CPU_USER: i64 = 2;
/// CPU samples inside a futex syscall on a lock's word: the user
/// registers saved at the syscall's entry (kernels with task registers).
pub const CPU_KERNEL: i64 = 3;
/// Kernel lock contentions (`KERNEL_LOCKS`): keyed by the kernel lock,
/// the user instruction pointer as `return_ip`, and this plus the
/// contention's flags (`kernel_lock` bits, below 64) as `stack_id`.
pub const KERNEL_LOCK: i64 = 16;
