//! Stack keys, and the snapshots of registers and stack that userspace
//! unwinds.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_RING_SIZE},
    helpers::generated::bpf_probe_read_user as bpf_probe_read_user_raw,
};
use tracer_common::{
    STACK_WINDOW, StackKey, StackSnapshot, drop_reason, flags, snapshot_due, stack_kind,
};

use crate::{
    counters::{add, count_drop, entry},
    maps::{FLAGS, SNAPSHOTS, STACK_COUNTS},
    php::{php_site, read_php_stack},
};

/// Counts the call (or wait) under `(lock, return_ip)` and, when the count
/// is due (`snapshot_due`), sends a snapshot of the user registers `regs`
/// (ip, sp, bp) and stack for the unwinder; `return_slot` is where the
/// return address is (0: not at a call's entry). No kernel stack walk: it
/// follows frame pointers, and through code built without them it returned
/// a new garbage stack per call (thousands of keys, each wanting its own
/// snapshots).
#[inline(always)]
pub(crate) fn record_stack(lock: u64, return_ip: u64, regs: (u64, u64, u64), return_slot: u64) {
    record_stack_of(stack_kind::USE, lock, return_ip, regs, return_slot);
}

/// [`record_stack`] under a key of `kind` (`stack_kind`).
#[inline(always)]
pub(crate) fn record_stack_of(
    kind: i64,
    lock: u64,
    return_ip: u64,
    regs: (u64, u64, u64),
    return_slot: u64,
) {
    let key = StackKey {
        lock,
        stack_id: kind,
        return_ip,
        php_site: if FLAGS.load() & flags::PHP != 0 {
            php_site()
        } else {
            0
        },
    };
    if let Some(count) = entry(&STACK_COUNTS, &key, drop_reason::STACK_COUNTS_FULL) {
        add(count, 1);
        // Read after the add, not fetched by it (fetching atomics need
        // Linux 5.12): two CPUs may read the same count, which only moves
        // the weight between their snapshots.
        // SAFETY: `count` is the map value just looked up.
        let n = unsafe { core::ptr::read_volatile(count) };
        if snapshot_due(n) {
            if n > 1 && ring_busy() {
                count_drop(drop_reason::SNAPSHOTS_SKIPPED);
                return;
            }
            send_snapshot(&key, n, regs, return_slot);
        }
    }
}

/// More than an eighth of `SNAPSHOTS` waits for the reader. A burst of new
/// keys (PHP's per-connection locks: hundreds a second, 8 snapshots each)
/// sent 7,800 snapshots of 36 KiB in 0.3 s, 9 times what the ring holds,
/// and lost keys' first snapshots (no stack at all): a key's later ones
/// only move weight between its stacks, so they give way, and a burst
/// shorter than the reader's wakeup still fits 7/8 of the ring of firsts.
#[inline(always)]
fn ring_busy() -> bool {
    let waiting = SNAPSHOTS.query(BPF_RB_AVAIL_DATA as u64);
    let size = SNAPSHOTS.query(BPF_RB_RING_SIZE as u64);
    waiting > size / 8
}

/// Whole pages in a snapshot's window.
pub(crate) const WINDOW_PAGES: u64 = STACK_WINDOW as u64 / 4096;

/// One snapshot into `SNAPSHOTS`: the largest window of the user stack
/// that reads (a thread's stack may end closer than `STACK_WINDOW`).
#[inline(always)]
pub(crate) fn send_snapshot(
    key: &StackKey,
    count_at: u64,
    (ip, sp, bp): (u64, u64, u64),
    return_slot: u64,
) {
    let Some(mut entry) = SNAPSHOTS.reserve::<StackSnapshot>(0) else {
        count_drop(drop_reason::SNAPSHOTS_LOST);
        return;
    };
    let snapshot = entry.as_mut_ptr();
    // SAFETY: `snapshot` is the ring buffer record just reserved, of the
    // snapshot's size; the read helper checks the user address and fails
    // (never faults).
    unsafe {
        (*snapshot).header.key = *key;
        (*snapshot).header.count_at = count_at;
        (*snapshot).header.ip = ip;
        (*snapshot).header.sp = sp;
        (*snapshot).header.bp = bp;
        (*snapshot).header.return_slot = return_slot;
        (*snapshot).header.len = 0;
        if FLAGS.load() & flags::PHP != 0 {
            read_php_stack(&mut (*snapshot).php);
        } else {
            (*snapshot).php.depth = 0;
            (*snapshot).php.miss = 0;
            (*snapshot).php.route = 0;
        }
        let stack = (*snapshot).stack.as_mut_ptr() as *mut core::ffi::c_void;
        // The read fails as a whole at the first page that is not there
        // (a thread's stack may end a few KiB above a deep frame): then the
        // longest read that ends at a page boundary, down to the rest of
        // sp's own page, which always reads.
        let page_rest = 4096 - (sp & 4095);
        for pages in (0..=WINDOW_PAGES).rev() {
            let size = if pages == WINDOW_PAGES {
                STACK_WINDOW as u64
            } else {
                page_rest + pages * 4096
            };
            // SAFETY: a read of a local (keeps the bound below on the very
            // register passed to the helper).
            let size = core::ptr::read_volatile(&size);
            if size == 0 || size > STACK_WINDOW as u64 {
                continue;
            }
            if bpf_probe_read_user_raw(stack, size as u32, sp as *const core::ffi::c_void) == 0 {
                (*snapshot).header.len = size;
                break;
            }
        }
    }
    entry.submit(0);
}
