//! Lock calls: the uprobes on the pthread lock functions count calls per
//! lock and caller, and tell failed trylocks apart.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    CallerKey, LOCK_OPS, LockOp, PendingKey, PendingTry, cookie, counting, drop_reason, flags,
    kernel_caps, stack_kind,
};

use crate::{
    counters::{add, count_drop, counting, entry, is_target, key_of, stack_pointer},
    handoffs::count_handoff,
    holds::hold_begin,
    maps::{CALLERS, FAILED_TRIES, FLAGS, KERNEL_CAPS, LOCKS, PENDING_TRIES, PROBE_COOKIES},
    php::{count_route_call, current_route, route_call},
    stacks::{record_stack, record_stack_of},
};

/// Counts nothing. After the main thread left with `pthread_exit`, the lock
/// calls count on uprobe-multi links scoped to the process, whose kernel
/// filter reads the exited main thread's (absent) memory: when any other
/// probe at the same point detaches (another tracer's), the kernel removes
/// the breakpoints from the target. This probe, bound to a live thread at
/// each lock-call point, claims them for the target.
#[uprobe]
pub fn breakpoint_anchor(_ctx: ProbeContext) -> u32 {
    0
}

/// At the entry of the lock init functions (`pthread_mutex_init`,
/// `pthread_rwlock_init`, `pthread_spin_init`; `record` with or without
/// `--stacks`): counts and snapshots where the lock at the first
/// argument's address is created.
#[uprobe]
pub fn lock_init(ctx: ProbeContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::LOCK_CALLS) {
        return 0;
    }
    let Some(lock) = ctx.arg::<u64>(0).map(key_of) else {
        return 0;
    };
    let sp = stack_pointer(&ctx);
    let return_ip = read_return_ip(sp);
    // SAFETY: a uprobe's context is the pt_regs the kernel passes in.
    let regs = unsafe { ((*ctx.regs).rip, sp, (*ctx.regs).rbp) };
    record_stack_of(stack_kind::CREATION, lock, return_ip, regs, sp);
    0
}

/// Attached to every probe point of every pthread lock function. The cookie
/// says which function, and where its return address is on the stack.
#[uprobe]
pub fn lock_call(ctx: ProbeContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::LOCK_CALLS) {
        return 0;
    }
    let wanted = FLAGS.load();
    let Some(lock) = ctx.arg::<u64>(0).map(key_of) else {
        return 0;
    };
    let Some(cookie) = probe_cookie(&ctx) else {
        count_drop(drop_reason::PROBE_POINT_UNKNOWN);
        return 0;
    };
    let op = cookie::op_index(cookie) as usize;
    if op >= LOCK_OPS {
        return 0;
    }
    let slot = stack_pointer(&ctx) + cookie::return_address_sp_offset(cookie);
    let return_ip = read_return_ip(slot);
    // A call from inside another lock function, or tail-called by one (musl
    // nests them), is the same acquisition: the lock's row leaves it out,
    // so do routes.
    let may_fail = LockOp::index_may_fail(op as u32);
    let nested =
        wanted & flags::PHP != 0 && route_call(lock, op as u32, slot, return_ip, !may_fail);
    if may_fail {
        // Counted at the return, with its result: a failed call took nothing.
        // A retry loop that jumps back to the entry (musl's CAS loops) is the
        // same call again: its return slot now reads as the kernel's return
        // trampoline, and it must not begin a second hold.
        if !begin_try(slot, lock, op as u32, nested) {
            return 0;
        }
    } else {
        count_call(lock, return_ip, op as u32);
        if wanted & flags::HANDOFFS != 0 {
            count_handoff(lock);
        }
    }
    if wanted & flags::STACKS != 0 {
        // SAFETY: a uprobe's context is the pt_regs the kernel passes in.
        let regs = unsafe { ((*ctx.regs).rip, (*ctx.regs).rsp, (*ctx.regs).rbp) };
        record_stack(lock, return_ip, regs, slot);
    }
    if wanted & flags::HOLDS != 0 {
        hold_begin(&ctx, lock, cookie, op as u32, return_ip);
    }
    0
}

/// The cookie of the probe point that ran this program: the link's (Linux
/// 5.15+), else the one userspace stored under the point's address (the
/// kernel sets the instruction pointer to it before running a uprobe's
/// programs).
#[inline(always)]
pub(crate) fn probe_cookie(ctx: &ProbeContext) -> Option<u64> {
    if KERNEL_CAPS.load() & kernel_caps::ATTACH_COOKIE != 0 {
        // SAFETY: the helper reads the cookie of the link that ran this
        // program from the context the kernel passed in.
        return Some(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) });
    }
    // SAFETY: a uprobe's context is the pt_regs the kernel passes in. The
    // key is copied to the stack first: map helpers refuse a key in the context.
    let ip: u64 = unsafe { core::ptr::read_volatile(&(*ctx.regs).rip) };
    // SAFETY: the map value is copied out at once.
    unsafe { PROBE_COOKIES.get(ip).copied() }
}

/// The return address in `slot` (at the probe point it sits at sp + 8
/// bytes per push done since the entry: right even without frame
/// pointers); 0 when unreadable.
#[inline(always)]
pub(crate) fn read_return_ip(slot: u64) -> u64 {
    // SAFETY: the helper checks the user address and fails (never faults)
    // when it is not readable.
    match unsafe { bpf_probe_read_user(slot as *const u64) } {
        Ok(return_ip) => return_ip,
        Err(_) => {
            count_drop(drop_reason::CALLER_UNREADABLE);
            0
        }
    }
}

/// Counts a lock call once: under its caller, else (caller unknown, or
/// CALLERS full) in LOCKS.
#[inline(always)]
pub(crate) fn count_call(lock: u64, return_ip: u64, op: u32) {
    // Read back through memory: the bound checked below is then on the
    // very register used as the index (the compiler otherwise re-derives
    // the index from `op`, and the verifier loses the bound).
    let index = op as usize;
    // SAFETY: a read of a local.
    let index = unsafe { core::ptr::read_volatile(&index) };
    if index >= LOCK_OPS {
        return;
    }
    if return_ip != 0 {
        let key = CallerKey {
            lock,
            return_ip,
            op,
            _pad: 0,
        };
        if let Some(count) = entry(&CALLERS, &key, drop_reason::CALLERS_FULL) {
            add(count, 1);
            return;
        }
    }
    if let Some(counts) = entry(&LOCKS, &lock, drop_reason::LOCKS_FULL) {
        // SAFETY: `counts` is the map value just looked up; `index < LOCK_OPS`.
        add(unsafe { &mut (*counts).calls[index] }, 1);
    }
}

/// The entry of a call that may fail, until its return (`try_lock_exit`).
/// Keyed by thread and return slot: musl's timed functions call the try
/// ones, and a retry loop that jumps back to the entry re-enters it with
/// the same slot.
/// Returns false for a re-entry of a call already pending.
#[inline(always)]
pub(crate) fn begin_try(slot: u64, lock: u64, op: u32, nested: bool) -> bool {
    let key = PendingKey {
        tid: bpf_get_current_pid_tgid() as u32,
        _pad: 0,
        return_slot: slot,
    };
    // SAFETY: only tested for presence, within this program run.
    if unsafe { PENDING_TRIES.get(key) }.is_some() {
        return false;
    }
    if PENDING_TRIES
        .insert(
            key,
            PendingTry {
                lock,
                op,
                nested: u32::from(nested),
            },
            0,
        )
        .is_err()
    {
        count_drop(drop_reason::FAILED_TRIES_UNTRACKED);
    }
    true
}

/// Return of a lock function that may fail (trylock, timed and clock
/// variants): counts the call, as an acquisition when it returned 0, as a
/// failed try otherwise (EBUSY, ETIMEDOUT, …). The caller is the address
/// returned to: the entry's return slot may hold the kernel's return
/// trampoline by then (a retry loop re-entering the function).
#[uretprobe]
pub fn try_lock_exit(ctx: RetProbeContext) -> u32 {
    if !is_target(&ctx) {
        return 0;
    }
    // SAFETY: a uretprobe's context is the pt_regs the kernel passes in.
    let (sp, ip, result) = unsafe { ((*ctx.regs).rsp, (*ctx.regs).rip, (*ctx.regs).rax as u32) };
    let key = PendingKey {
        tid: bpf_get_current_pid_tgid() as u32,
        _pad: 0,
        return_slot: sp.wrapping_sub(8),
    };
    // SAFETY: the value is copied out at once, before the entry is removed.
    let Some(pending) = (unsafe { PENDING_TRIES.get(key) }).copied() else {
        return 0;
    };
    let _ = PENDING_TRIES.remove(key);
    if !counting(counting::LOCK_CALLS) {
        return 0;
    }
    if result == 0 {
        count_call(pending.lock, ip, pending.op);
        let wanted = FLAGS.load();
        if wanted & flags::HANDOFFS != 0 {
            count_handoff(pending.lock);
        }
        if wanted & flags::PHP != 0 && pending.nested == 0 {
            count_route_call(current_route(), pending.lock);
        }
        return 0;
    }
    let failed = CallerKey {
        lock: pending.lock,
        return_ip: ip,
        op: pending.op,
        _pad: 0,
    };
    if let Some(count) = entry(&FAILED_TRIES, &failed, drop_reason::FAILED_TRIES_UNTRACKED) {
        add(count, 1);
    }
    0
}
