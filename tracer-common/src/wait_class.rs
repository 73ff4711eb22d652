//! Where a futex wait or wake is counted, decided in the BPF program.

/// Any futex word: `FUTEXES`, keyed by the word (userspace joins it to a lock).
pub const FUTEX: u32 = 0;
/// A wait inside a condvar wait function: `CONDVARS`, keyed by the condvar.
pub const CONDVAR: u32 = 1;
/// A futex call made by the Go runtime's `runtime.futex`: `GO_FUTEXES`.
pub const GO_RUNTIME: u32 = 2;
