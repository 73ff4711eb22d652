//! Indexes of [`HandoffCounts::counts`](crate::HandoffCounts::counts): how far the lock's cache line moved.

/// To an SMT sibling of the previous CPU (same core).
pub const SAME_CORE: usize = 0;
/// To another core sharing the previous CPU's last-level cache.
pub const SAME_L3: usize = 1;
/// To a core on another L3 cache or another socket (or a CPU of unknown place).
pub const OTHER_L3: usize = 2;
pub const COUNT: usize = 3;

/// The class of a move between two CPUs' places (never called for the same CPU).
#[inline(always)]
pub const fn of(from: super::CpuPlace, to: super::CpuPlace) -> usize {
    if from.core != 0 && from.core == to.core {
        SAME_CORE
    } else if from.l3 != 0 && from.l3 == to.l3 {
        SAME_L3
    } else {
        OTHER_L3
    }
}
