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
/// `--mode inproc --stacks`: the stubs' sampled acquisitions, keyed by
/// the caller's return address; this plus the op (`LockOp`, below 16) as
/// `stack_id`. The count is samples, not calls.
pub const INPROC_SAMPLE: i64 = 128;
/// One past the last `INPROC_SAMPLE` kind.
pub const INPROC_SAMPLE_END: i64 = INPROC_SAMPLE + 16;
/// Kernel lock contentions (`KERNEL_LOCKS`): keyed by the kernel lock,
/// the user instruction pointer as `return_ip`, and this plus the
/// contention's flags (`kernel_lock` bits, below 64) as `stack_id`.
pub const KERNEL_LOCK: i64 = 16;

/// True for a `KERNEL_LOCK` kind (its flags below 64).
pub const fn is_kernel_lock(kind: i64) -> bool {
    kind >= KERNEL_LOCK && kind < KERNEL_LOCK + 64
}

/// True for an `INPROC_SAMPLE` kind.
pub const fn is_inproc_sample(kind: i64) -> bool {
    kind >= INPROC_SAMPLE && kind < INPROC_SAMPLE_END
}
