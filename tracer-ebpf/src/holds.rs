//! Holds (`--hold-times`) and holders of contended locks.
//!
//! A hold is timed from the thread's lock call (or the end of its last futex
//! wait on the lock: it waited, so it had not got it) to its unlock call.
//! Without return probes a failed trylock is not seen: its entry is marked
//! tentative and restarted by the thread's next lock call on the lock, and it
//! only counts as a hold if an unlock comes. Recursive locks and re-entered
//! read locks nest (depth): the outermost hold is timed. Read locks are held
//! per thread, so an rwlock's hold time sums its readers' holds.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::uprobe,
    programs::ProbeContext,
};
use tracer_common::{
    FutexWait, HeldKey, Holder, HolderKey, LockOp, MAX_LOCK_CODE_RANGES, WaitHolderKey, cookie,
    counting, drop_reason, flags, histogram, lifetime,
};

use crate::{
    counters::{
        add, count_drop, counting, entry, is_target, key_of, now_ns, raise_to, stack_pointer,
    },
    maps::{
        FLAGS, HELD, HOLDERS, HOLDS, LOCK_CODE, LOCK_CODE_RANGES, LOCK_HOLDER, UNLOCK_HITS,
        WAIT_HOLDERS,
    },
};

/// Futex words sit at these offsets in the locks (glibc mutex 0, musl mutex
/// 4, glibc rwlock 8 and 12, musl rwlock 0).
pub(crate) const FUTEX_WORD_OFFSETS: [u64; 4] = [0, 4, 8, 12];
/// glibc's pthread_mutex_t keeps the owner's tid at byte 8 (`__data.__owner`).
pub(crate) const GLIBC_MUTEX_OWNER_OFFSET: u64 = 8;

#[inline(always)]
pub(crate) fn hold_begin(ctx: &ProbeContext, lock: u64, cookie: u64, op: u32, return_ip: u64) {
    let tid = bpf_get_current_pid_tgid() as u32;
    let key = HeldKey { lock, tid, _pad: 0 };
    // A trylock may fail and a timed lock time out: without return probes
    // their hold is tentative until an unlock confirms it.
    let tentative = u32::from(LockOp::index_may_fail(op));
    let call_slot = stack_pointer(ctx) + cookie::return_address_sp_offset(cookie);
    let now = now_ns();
    if let Some(held) = HELD.get_ptr_mut(key) {
        let called_by_lock_function = in_lock_code(return_ip);
        // SAFETY: `held` is this thread's HELD value, looked up just now; only
        // this thread writes it.
        // The return address may read as the kernel's return trampoline at a
        // function with a return probe: the slot alone tells a tail call.
        let tail_called = unsafe { (*held).call_slot == call_slot } && LockOp::index_may_fail(op);
        if called_by_lock_function || tail_called {
            return;
        }
        // SAFETY: as above.
        unsafe {
            (*held).call_slot = call_slot;
            (*held).call_ip = return_ip;
            if (*held).tentative != 0 {
                // The earlier trylock may have failed: this call starts the hold.
                (*held).start_ns = now;
                (*held).return_ip = return_ip;
                (*held).depth = 1;
                (*held).tentative = tentative;
            } else {
                (*held).depth += 1;
            }
        }
        return;
    }
    let held = tracer_common::Held {
        start_ns: now,
        return_ip,
        depth: 1,
        tentative,
        call_slot,
        call_ip: return_ip,
    };
    if HELD.insert(key, held, 0).is_err() {
        count_drop(drop_reason::HOLDS_UNTRACKED);
        return;
    }
    // Only a free lock gets a new holder: a thread that will wait for it
    // must not replace the one holding it.
    let holder = Holder {
        return_ip,
        tid,
        _pad: 0,
    };
    let _ = LOCK_HOLDER.insert(lock, holder, BPF_NOEXIST as u64);
}

/// True when `ip` lies inside one of the lock functions.
#[inline(always)]
pub(crate) fn in_lock_code(ip: u64) -> bool {
    let ranges = LOCK_CODE_RANGES.load();
    for index in 0..MAX_LOCK_CODE_RANGES {
        if index >= ranges {
            return false;
        }
        if let Some([start, end]) = LOCK_CODE.get(index)
            && (*start..*end).contains(&ip)
        {
            return true;
        }
    }
    false
}

/// A thread's futex wait on a lock it is acquiring ended: its hold (if it
/// gets the lock now) starts here, and it becomes the holder if none is known.
#[inline(always)]
pub(crate) fn hold_after_wait(uaddr: u64, tid: u32) {
    for offset in FUTEX_WORD_OFFSETS {
        let lock = uaddr.wrapping_sub(offset);
        let key = HeldKey { lock, tid, _pad: 0 };
        if let Some(held) = HELD.get_ptr_mut(key) {
            // SAFETY: this thread's HELD value, looked up just now.
            let return_ip = unsafe {
                (*held).start_ns = now_ns();
                (*held).return_ip
            };
            let holder = Holder {
                return_ip,
                tid,
                _pad: 0,
            };
            let _ = LOCK_HOLDER.insert(lock, holder, BPF_NOEXIST as u64);
            return;
        }
    }
}

/// Who holds the lock of futex word `uaddr` as thread `waiter` starts waiting:
/// (call site, tid), 0 where unknown. The owner field of a glibc mutex is
/// exact; otherwise the holder recorded at its acquisition (`--hold-times`).
#[inline(always)]
pub(crate) fn holder_at_wait(uaddr: u64, waiter: u32) -> (u64, u32) {
    // SAFETY: the helper fails (never faults) on an unreadable user address.
    let word = lifetime::split(uaddr).0;
    let owner = unsafe {
        bpf_probe_read_user((word + GLIBC_MUTEX_OWNER_OFFSET) as *const u32).unwrap_or(0)
    };
    if FLAGS.load() & flags::HOLDS == 0 {
        return (0, owner);
    }
    let key = HeldKey {
        lock: uaddr,
        tid: owner,
        _pad: 0,
    };
    if owner != 0
        && owner != waiter
        // SAFETY: the reference is read at once, within this program run.
        && let Some(held) = unsafe { HELD.get(key) }
    {
        return (held.return_ip, owner);
    }
    for offset in FUTEX_WORD_OFFSETS {
        // SAFETY: the reference is read at once, within this program run.
        if let Some(holder) = unsafe { LOCK_HOLDER.get(uaddr.wrapping_sub(offset)) }
            && holder.tid != waiter
        {
            return (holder.return_ip, holder.tid);
        }
    }
    (0, owner)
}

#[inline(always)]
pub(crate) fn count_wait_holder(wait: &FutexWait, waited: u64) {
    if wait.holder_ip == 0 && wait.holder_tid == 0 {
        return;
    }
    let key = WaitHolderKey {
        uaddr: wait.uaddr,
        return_ip: wait.holder_ip,
        tid: wait.holder_tid,
        _pad: 0,
    };
    if let Some(time) = entry(&WAIT_HOLDERS, &key, drop_reason::WAIT_HOLDERS_FULL) {
        // SAFETY: `time` is the map value just looked up.
        unsafe {
            add(&mut (*time).waits, 1);
            add(&mut (*time).wait_ns, waited);
        }
    }
}

/// Attached (`--hold-times`) to every probe point of pthread_mutex_unlock
/// and pthread_rwlock_unlock: ends the outermost hold of the lock.
#[uprobe]
pub fn unlock_call(ctx: ProbeContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::WAITS) {
        return 0;
    }
    if let Some(hits) = UNLOCK_HITS.get_ptr_mut(0) {
        add(hits, 1);
    }
    let Some(lock) = ctx.arg::<u64>(0).map(key_of) else {
        return 0;
    };
    let tid = bpf_get_current_pid_tgid() as u32;
    let key = HeldKey { lock, tid, _pad: 0 };
    // No entry: the lock was taken before tracing began.
    let Some(held) = HELD.get_ptr_mut(key) else {
        return 0;
    };
    // SAFETY: this thread's HELD value, looked up just now; only this thread
    // writes it.
    let (start_ns, return_ip) = unsafe {
        if (*held).depth > 1 {
            (*held).depth -= 1;
            return 0;
        }
        ((*held).start_ns, (*held).return_ip)
    };
    let _ = HELD.remove(key);
    // SAFETY: the reference is read at once, within this program run.
    if unsafe { LOCK_HOLDER.get(lock) }.is_some_and(|holder| holder.tid == tid) {
        let _ = LOCK_HOLDER.remove(lock);
    }
    let held_ns = now_ns().saturating_sub(start_ns);
    if let Some(counts) = entry(&HOLDS, &lock, drop_reason::HOLDS_MAP_FULL) {
        // SAFETY: `counts` is the map value just looked up; the bucket index
        // is below BUCKETS.
        unsafe {
            add(&mut (*counts).holds, 1);
            add(&mut (*counts).hold_ns, held_ns);
            raise_to(&mut (*counts).max_hold_ns, held_ns);
            add(&mut (*counts).hold_histogram[histogram::bucket(held_ns)], 1);
        }
    }
    let site = HolderKey { lock, return_ip };
    if let Some(holds) = entry(&HOLDERS, &site, drop_reason::HOLDERS_MAP_FULL) {
        // SAFETY: `holds` is the map value just looked up.
        unsafe {
            add(&mut (*holds).holds, 1);
            add(&mut (*holds).hold_ns, held_ns);
        }
    }
    0
}
