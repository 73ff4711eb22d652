//! Lifetimes: memory that went away (see `tracer_common::lifetime`).

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use tracer_common::{Unmapped, drop_reason, lifetime};

use crate::{
    counters::{add, count_drop, is_target, record_u64},
    maps::{GENERATION, UNMAPPED, UNMAPPED_COUNT, WATCHED},
};

// Offsets in the syscalls:sys_enter_munmap/mremap/mmap records (their
// format files): addr, then len (mremap: old_len), then mmap's flags.
pub(crate) const ENTER_ADDR: usize = 16;
pub(crate) const ENTER_LEN: usize = 24;
pub(crate) const MMAP_ENTER_FLAGS: usize = 40;
pub(crate) const MAP_FIXED: u64 = 0x10;

#[tracepoint]
pub fn munmap_enter(ctx: TracePointContext) -> u32 {
    unmapping(&ctx)
}

#[tracepoint]
pub fn mremap_enter(ctx: TracePointContext) -> u32 {
    unmapping(&ctx)
}

/// `mmap` with `MAP_FIXED` replaces what was mapped there.
#[tracepoint]
pub fn mmap_enter(ctx: TracePointContext) -> u32 {
    if record_u64(&ctx, MMAP_ENTER_FLAGS) & MAP_FIXED == 0 {
        return 0;
    }
    unmapping(&ctx)
}

/// sched:sched_process_exec: the whole address space is replaced.
#[tracepoint]
pub fn process_exec(ctx: TracePointContext) -> u32 {
    if is_target(&ctx) {
        let (start, end) = lifetime::EVERYTHING;
        new_generation(start, end);
    }
    0
}

/// At the entry of a syscall that unmaps `[addr, addr + len)`: a new
/// generation when that overlaps a watched module. Counted at the entry,
/// before the memory goes: no lock call on what replaces it can come first.
#[inline(always)]
pub(crate) fn unmapping(ctx: &TracePointContext) -> u32 {
    if !is_target(ctx) {
        return 0;
    }
    let start = record_u64(ctx, ENTER_ADDR);
    let end = start.saturating_add(record_u64(ctx, ENTER_LEN));
    for index in 0..lifetime::WATCHED_RANGES {
        if let Some(range) = WATCHED.get(index)
            && start < range[1]
            && range[0] < end
        {
            new_generation(start, end);
            return 0;
        }
    }
    0
}

/// Starts a new generation for the memory `[start, end)` that goes away,
/// and logs it. Two CPUs doing so at once may both log the later number
/// (no fetch-and-add before 5.12): the window is the two increments.
#[inline(always)]
pub(crate) fn new_generation(start: u64, end: u64) {
    let (Some(generation), Some(filled)) =
        (GENERATION.get_ptr_mut(0), UNMAPPED_COUNT.get_ptr_mut(0))
    else {
        return;
    };
    // SAFETY: both point into map values looked up in this program run;
    // `filled` is this CPU's own slot.
    unsafe {
        let index = *filled;
        if core::ptr::read_volatile(generation) >= lifetime::MAX_GENERATION
            || index >= lifetime::LOG_ENTRIES as u64
        {
            count_drop(drop_reason::LIFETIMES_MERGED);
            return;
        }
        add(generation, 1);
        let now = core::ptr::read_volatile(generation);
        if let Some(slot) = UNMAPPED.get_ptr_mut(index as u32) {
            *slot = Unmapped {
                start,
                end,
                generation: now,
            };
            *filled = index + 1;
        }
    }
}
