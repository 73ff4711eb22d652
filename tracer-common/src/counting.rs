//! Bits of `COUNTING[0]`, the switch userspace flips while the programs run:
//! a program counts only while its bit is set. Cleared at the end of a
//! recording before the maps are read, so every figure covers one interval.

/// Lock calls and request-boundary calls count (in sampled mode: only
/// inside a window).
pub const LOCK_CALLS: u32 = 1;
/// Futex waits and wakes, condvar waits and unlock calls count.
pub const WAITS: u32 = 2;
/// Counting is paused while entries are deleted (`serve`/`top` expiry):
/// what comes meanwhile is counted as `paused_for_expiry`.
pub const PAUSED: u32 = 4;
