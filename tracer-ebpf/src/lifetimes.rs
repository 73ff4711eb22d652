//! Lifetimes: memory that went away (see `tracer_common::lifetime`).

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, maps::Array, programs::TracePointContext,
};
use tracer_common::{Unmapped, drop_reason, lifetime};

use crate::{
    counters::{add, count_drop, is_target, record_u64},
    maps::{GENERATION, MAPPING, RECENT, RECENT_NEXT, UNMAPPED, UNMAPPED_COUNT, WATCHED},
};

// Offsets in the syscalls:sys_enter_munmap/mremap/mmap records (their
// format files): addr, then len (mremap: old_len), then mmap's flags.
pub(crate) const ENTER_ADDR: usize = 16;
pub(crate) const ENTER_LEN: usize = 24;
pub(crate) const MMAP_ENTER_FLAGS: usize = 40;
pub(crate) const MAP_FIXED: u64 = 0x10;
const MMAP_ENTER_PROT: usize = 32;
const MMAP_ENTER_FD: usize = 48;
/// syscalls:sys_exit_mmap's `ret`.
const EXIT_RET: usize = 16;
const MAP_ANONYMOUS: u64 = 0x20;
/// Ignored by the kernel, still passed by glibc's loader (`MAP_COPY`).
const MAP_DENYWRITE: u64 = 0x0800;
const PROT_EXEC: u64 = 0x4;

#[tracepoint]
pub fn munmap_enter(ctx: TracePointContext) -> u32 {
    unmapping(&ctx)
}

#[tracepoint]
pub fn mremap_enter(ctx: TracePointContext) -> u32 {
    unmapping(&ctx)
}

/// `mmap` with `MAP_FIXED` replaces what was mapped there. A loader's
/// first mapping of a module (glibc's passes `MAP_DENYWRITE`; code is
/// `PROT_EXEC`) is noted for its return, which puts it in `RECENT`.
#[tracepoint]
pub fn mmap_enter(ctx: TracePointContext) -> u32 {
    let flags = record_u64(&ctx, MMAP_ENTER_FLAGS);
    if flags & MAP_FIXED != 0 {
        return unmapping(&ctx);
    }
    let loads = flags & MAP_DENYWRITE != 0 || record_u64(&ctx, MMAP_ENTER_PROT) & PROT_EXEC != 0;
    let file = flags & MAP_ANONYMOUS == 0 && (record_u64(&ctx, MMAP_ENTER_FD) as i64) >= 0;
    if loads && file && is_target(&ctx) {
        let len = record_u64(&ctx, ENTER_LEN);
        let _ = MAPPING.insert(bpf_get_current_pid_tgid(), len, 0);
    }
    0
}

/// The return of a loader's `mmap` noted at its entry: the module's range
/// goes into `RECENT`, so that its unmap starts a new generation even
/// before userspace has read the maps (a library loaded and unloaded in
/// between; issue 52 D11).
#[tracepoint]
pub fn mmap_exit(ctx: TracePointContext) -> u32 {
    if !is_target(&ctx) {
        return 0;
    }
    let thread = bpf_get_current_pid_tgid();
    // SAFETY: the value is copied out at once.
    let Some(len) = (unsafe { MAPPING.get(thread) }).copied() else {
        return 0;
    };
    let _ = MAPPING.remove(thread);
    let start = record_u64(&ctx, EXIT_RET);
    // A failed mmap returns -errno; user addresses are below 2^47.
    if start >> lifetime::SHIFT != 0 {
        return 0;
    }
    let Some(next) = RECENT_NEXT.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: `next` points into a map value looked up in this program run.
    // Two CPUs at once may read one slot (no fetch-and-add before 5.12):
    // one range is then left to userspace's next read of the maps.
    let index = unsafe {
        add(next, 1);
        core::ptr::read_volatile(next) % lifetime::RECENT_RANGES as u64
    };
    if let Some(slot) = RECENT.get_ptr_mut(index as u32) {
        // SAFETY: as above.
        unsafe { *slot = [start, start.saturating_add(len)] };
    }
    0
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
    if overlaps(&WATCHED, lifetime::WATCHED_RANGES, start, end)
        || overlaps(&RECENT, lifetime::RECENT_RANGES, start, end)
    {
        new_generation(start, end);
    }
    0
}

/// Whether one of the first `entries` ranges of `ranges` overlaps `[start, end)`.
#[inline(always)]
fn overlaps(ranges: &Array<[u64; 2]>, entries: u32, start: u64, end: u64) -> bool {
    for index in 0..entries {
        if let Some(range) = ranges.get(index)
            && start < range[1]
            && range[0] < end
        {
            return true;
        }
    }
    false
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
