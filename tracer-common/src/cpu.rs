//! The CPU sampler's lock-code ranges and sample counts.

/// A runtime code range `[start, end)` of one lock function or libc lock
/// slow path (`CPU_LOCK_CODE` map, filled by userspace before the sampler runs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CodeRange {
    pub start: u64,
    pub end: u64,
}

/// Value of the `CPU_LOCKS` map, keyed by the address a lock-code sample was
/// attributed to (the mutex argument in user lock code, the futex word in
/// the kernel): CPU samples of the target there.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSamples {
    /// In the lock functions and libc's lock slow paths (user mode).
    pub user: u64,
    /// In the kernel, inside a futex syscall on the word.
    pub kernel: u64,
}
