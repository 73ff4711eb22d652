//! Two lifetimes of one address: a lock in a library unloaded with
//! `dlclose` and one in the library loaded at the same address later, or a
//! lock of the program before an `exec` and one of the program after it.
//!
//! The BPF side counts which watched memory was unmapped (`GENERATION`: one
//! more at each `munmap`, `mremap` or `MAP_FIXED` `mmap` over a module
//! mapping userspace lists in `WATCHED`, and at each `exec`) and keys every
//! lock and futex word as `address | generation << SHIFT`. Userspace reads
//! the log of unmapped ranges (`UNMAPPED`) and merges the generations of an
//! address that no unmapped range covered in between, so a lock's row only
//! splits when its memory really went away.

/// User addresses on x86-64 (4-level paging) are below 2^47.
pub const SHIFT: u32 = 47;
pub const ADDRESS_MASK: u64 = (1 << SHIFT) - 1;
/// Generations that fit above the address bits.
pub const MAX_GENERATION: u64 = (1 << (64 - SHIFT)) - 1;
/// Entries of the per-CPU `UNMAPPED` log (per CPU).
pub const LOG_ENTRIES: u32 = 4096;
/// Module ranges userspace lists in `WATCHED`.
pub const WATCHED_RANGES: u32 = 256;
/// Code the target's loader mapped lately (`RECENT`), noted by the BPF
/// side itself: a library loaded and unloaded between two of
/// userspace's reads of the maps is watched too.
pub const RECENT_RANGES: u32 = 128;
/// The whole user address space: what an `exec` replaces.
pub const EVERYTHING: (u64, u64) = (0, 1 << SHIFT);

/// The key of `address` in `generation`.
#[inline(always)]
pub const fn tag(address: u64, generation: u64) -> u64 {
    (address & ADDRESS_MASK) | (generation << SHIFT)
}

/// (address, generation) of a key.
#[inline(always)]
pub const fn split(key: u64) -> (u64, u64) {
    (key & ADDRESS_MASK, key >> SHIFT)
}
