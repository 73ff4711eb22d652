//! Futex waits and wakes (syscall tracepoints) and condition-variable
//! waits, per futex word.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{bpf_get_current_task_btf, bpf_task_pt_regs},
    },
    macros::{tracepoint, uprobe, uretprobe},
    maps::HashMap,
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use tracer_common::{
    CondWait, FutexCounts, FutexWait, MUTEX_SPAN, counting, drop_reason, flags, histogram,
    kernel_caps, lifetime, wait_class,
};

use crate::{
    counters::{
        add, count_drop, counting, counting_state, entry, is_target, key_of, now_ns, raise_to,
        record_u64,
    },
    holds::{count_wait_holder, hold_after_wait, holder_at_wait},
    maps::{
        COND_CALLS, COND_THREADS, CONDVARS, FLAGS, FUTEXES, GO_FUTEX_END, GO_FUTEX_START,
        GO_FUTEXES, KERNEL_CAPS, WAITING,
    },
    php::count_route_wait,
    stacks::record_stack,
};

// Offsets in the syscalls:sys_enter_futex record
// (see /sys/kernel/tracing/events/syscalls/sys_enter_futex/format).
pub(crate) const ENTER_UADDR: usize = 16;
pub(crate) const ENTER_OP: usize = 24;

pub(crate) const FUTEX_CMD_MASK: u64 = !(128 | 256); // ~(FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME)

pub(crate) enum FutexKind {
    Wait,
    Wake,
    Other,
}

#[inline(always)]
pub(crate) fn futex_kind(op: u64) -> FutexKind {
    match op & FUTEX_CMD_MASK {
        // WAIT, LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI, LOCK_PI2
        0 | 6 | 9 | 11 | 13 => FutexKind::Wait,
        // WAKE, REQUEUE, CMP_REQUEUE, WAKE_OP, UNLOCK_PI, WAKE_BITSET, CMP_REQUEUE_PI
        1 | 3 | 4 | 5 | 7 | 10 | 12 => FutexKind::Wake,
        _ => FutexKind::Other,
    }
}

/// Entry of `pthread_cond_wait`, `_timedwait`, `_clockwait` (cond, mutex, …):
/// the thread's futex waits until the return are waits for the condition.
#[uprobe]
pub fn cond_wait_enter(ctx: ProbeContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::WAITS) {
        return 0;
    }
    let (Some(cond), Some(mutex)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) else {
        return 0;
    };
    let (cond, mutex) = (key_of(cond), key_of(mutex));
    if let Some(calls) = COND_CALLS.get_ptr_mut(0) {
        add(calls, 1);
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    if COND_THREADS
        .insert(tid, CondWait { cond, mutex }, 0)
        .is_err()
    {
        count_drop(drop_reason::COND_WAITS_UNTRACKED);
    }
    0
}

/// Return of the condvar wait functions.
#[uretprobe]
pub fn cond_wait_exit(ctx: RetProbeContext) -> u32 {
    if is_target(&ctx) {
        let _ = COND_THREADS.remove(bpf_get_current_pid_tgid() as u32);
    }
    0
}

/// The user registers the kernel saved when the current thread entered it
/// (syscall, interrupt or trap); `None` when the helper gives none.
#[inline(always)]
pub(crate) fn saved_user_regs() -> Option<*const pt_regs> {
    if KERNEL_CAPS.load() & kernel_caps::TASK_REGS == 0 {
        return None;
    }
    // SAFETY: both helpers take the current task, which lives for this run.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs };
    (!regs.is_null()).then_some(regs)
}

/// True when the futex call was made from the Go runtime's `runtime.futex`:
/// the syscall returns into it. The return address is the user `rip` the
/// kernel saved at the syscall entry: one read, where a one-frame
/// `bpf_get_stack` went through the perf callchain code on every call.
#[inline(always)]
pub(crate) fn from_go_runtime() -> bool {
    if FLAGS.load() & flags::GO_RUNTIME == 0 {
        return false;
    }
    let Some(regs) = saved_user_regs() else {
        return false;
    };
    // SAFETY: `regs` is the helper's typed (BTF) pointer to the current
    // task's saved registers: the verifier makes the load a checked one
    // (a fault reads 0), so no read helper is needed.
    let user_ip = unsafe { core::ptr::read_volatile(&(*regs).rip) };
    user_ip >= GO_FUTEX_START.load() && user_ip < GO_FUTEX_END.load()
}

/// Where a wait of this thread on `uaddr` is counted: (class, key).
#[inline(always)]
pub(crate) fn classify_wait(tid: u32, uaddr: u64) -> (u32, u64) {
    if from_go_runtime() {
        return (wait_class::GO_RUNTIME, uaddr);
    }
    // SAFETY: the reference is used at once, within this program run.
    if let Some(cond) = unsafe { COND_THREADS.get(tid) } {
        // Re-acquiring the mutex after the wake is lock contention.
        // Compared without generations: one may have begun since the enter.
        let (word, mutex) = (lifetime::split(uaddr).0, lifetime::split(cond.mutex).0);
        let on_mutex = word >= mutex && word < mutex + MUTEX_SPAN;
        if !on_mutex {
            return (wait_class::CONDVAR, cond.cond);
        }
    }
    (wait_class::FUTEX, uaddr)
}

/// The map a wait of `class` is counted in, and the drop reason when it is full.
#[inline(always)]
pub(crate) fn futex_map(class: u32) -> (&'static HashMap<u64, FutexCounts>, u32) {
    match class {
        wait_class::CONDVAR => (&CONDVARS, drop_reason::CONDVARS_FULL),
        wait_class::GO_RUNTIME => (&GO_FUTEXES, drop_reason::GO_FUTEXES_FULL),
        _ => (&FUTEXES, drop_reason::FUTEXES_FULL),
    }
}

#[tracepoint]
pub fn futex_enter(ctx: TracePointContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::WAITS) {
        return 0;
    }
    let uaddr = key_of(record_u64(&ctx, ENTER_UADDR));
    let op = record_u64(&ctx, ENTER_OP);
    match futex_kind(op) {
        FutexKind::Wait => begin_wait(uaddr),
        FutexKind::Wake => {
            let class = if from_go_runtime() {
                wait_class::GO_RUNTIME
            } else {
                wait_class::FUTEX
            };
            let (map, full_reason) = futex_map(class);
            if let Some(counts) = entry(map, &uaddr, full_reason) {
                // SAFETY: `counts` is the map value just looked up.
                add(unsafe { &mut (*counts).wakes }, 1);
            }
        }
        FutexKind::Other => {}
    }
    0
}

/// The calling thread starts a futex wait on `uaddr`.
#[inline(always)]
pub(crate) fn begin_wait(uaddr: u64) {
    let tid = bpf_get_current_pid_tgid() as u32;
    let (class, key) = classify_wait(tid, uaddr);
    // Holders only mean something for a lock's own futex words.
    let (holder_ip, holder_tid) = if class == wait_class::FUTEX {
        holder_at_wait(uaddr, tid)
    } else {
        (0, 0)
    };
    let wait = FutexWait {
        uaddr: key,
        start_ns: now_ns(),
        class,
        holder_ip,
        holder_tid,
    };
    if WAITING.insert(tid, wait, 0).is_err() {
        count_drop(drop_reason::WAITS_UNTRACKED);
    }
    if FLAGS.load() & flags::STACKS != 0 {
        // SAFETY: the helper's typed (BTF) pointer to the saved registers;
        // the verifier checks these loads (a fault reads 0).
        let regs = saved_user_regs().map_or((0, 0, 0), |regs| unsafe {
            (
                core::ptr::read_volatile(&(*regs).rip),
                core::ptr::read_volatile(&(*regs).rsp),
                core::ptr::read_volatile(&(*regs).rbp),
            )
        });
        record_stack(key, 0, regs, 0);
    }
}

/// `futex_waitv(waiters, nr_futexes, …)` (Linux 5.16+): a wait on several
/// futex words at once, counted on the first (`struct futex_waitv` is
/// `{ u64 val; u64 uaddr; u32 flags; u32 reserved }`).
#[tracepoint]
pub fn futex_waitv_enter(ctx: TracePointContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::WAITS) {
        return 0;
    }
    let waiters = record_u64(&ctx, ENTER_UADDR);
    // SAFETY: the helper checks the user address and fails, never faults.
    if let Ok(uaddr) = unsafe { bpf_probe_read_user((waiters + 8) as *const u64) } {
        begin_wait(key_of(uaddr));
    }
    0
}

/// The return of `futex_waitv`: the end of its wait.
#[tracepoint]
pub fn futex_waitv_exit(ctx: TracePointContext) -> u32 {
    end_wait(&ctx)
}

#[tracepoint]
pub fn futex_exit(ctx: TracePointContext) -> u32 {
    end_wait(&ctx)
}

/// The return of a futex wait syscall: the wait begun at its entry ends.
#[inline(always)]
pub(crate) fn end_wait(ctx: &TracePointContext) -> u32 {
    if !is_target(ctx) {
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: the value is copied out at once, before the entry is removed.
    let Some(wait) = (unsafe { WAITING.get(tid) }).copied() else {
        return 0;
    };
    // After the stop the wait stays in WAITING: it was in progress at the
    // stop, and the end report lists it so (it is not counted as a wait).
    let state = counting_state();
    if state & counting::PAUSED == 0 && state & counting::WAITS == 0 {
        return 0;
    }
    let _ = WAITING.remove(tid);
    if !counting(counting::WAITS) {
        return 0;
    }
    let waited = now_ns().saturating_sub(wait.start_ns);
    let (map, full_reason) = futex_map(wait.class);
    if let Some(counts) = entry(map, &wait.uaddr, full_reason) {
        // SAFETY: `counts` is the map value just looked up; the bucket index
        // is below BUCKETS.
        unsafe {
            add(&mut (*counts).waits, 1);
            add(&mut (*counts).wait_ns, waited);
            raise_to(&mut (*counts).max_wait_ns, waited);
            add(&mut (*counts).wait_histogram[histogram::bucket(waited)], 1);
        }
    }
    count_wait_holder(&wait, waited);
    if FLAGS.load() & flags::PHP != 0 && wait.class == wait_class::FUTEX {
        count_route_wait(wait.uaddr, waited);
    }
    if FLAGS.load() & flags::HOLDS != 0 && wait.class == wait_class::FUTEX {
        hold_after_wait(wait.uaddr, tid);
    }
    0
}
