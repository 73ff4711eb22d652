//! Kernel lock contention of the target's threads: `lock:contention_begin`
//! and `contention_end` (Linux 5.19+), which fire only when a kernel lock
//! is contended. The begin notes the thread's contention (the lock, its
//! flags, the kernel stack, the futex word of a futex syscall in progress
//! and the user instruction the thread entered the kernel from); the end
//! of the same lock counts it in `KERNEL_LOCKS` with the time between,
//! under the route of the thread's request with `--php`.
//! A begin while the thread already waits is nested (a spinlock inside a
//! rwsem's slow path, a mutex's spin before it sleeps) and only counted
//! apart, as `perf lock contention` leaves it out.
//! `thread_exit` and `thread_free` tell userspace when the threads of a
//! target that exited are gone: the last thread's `release_task` announces
//! the exit (pidfd, parent) and only then flushes /proc's dentries, which
//! takes contended spinlocks.

use aya_ebpf::{
    EbpfContext,
    helpers::bpf_get_current_pid_tgid,
    macros::tracepoint,
    programs::{TracePointContext, tracing::StackIdContext},
};
use tracer_common::{
    KernelLockBegin, KernelLockCounts, KernelLockKey, KernelLockSite, counting, flags,
    kernel_lock::{STACK_SAMPLE_EVERY, STACKS_EXACT_FIRST, event},
    php::NO_REQUEST,
    stack_kind, wait_class,
};

use crate::{
    counters::{CounterMap, add, counting, is_target, key_of, now_ns, raise_to},
    cpu::SYS_FUTEX,
    futex::saved_user_regs,
    maps::{
        EXITING, FLAGS, FREE_PID_OFFSET, KERNEL_LOCK_BEGINS, KERNEL_LOCK_EVENTS, KERNEL_LOCK_SITES,
        KERNEL_LOCK_STACKS, KERNEL_LOCKS, TARGET_TGID, WAITING,
    },
    php::current_route,
    stacks::record_stack_of,
};

// Offsets in the lock:contention_begin and contention_end records (see
// /sys/kernel/tracing/events/lock/contention_begin/format).
const LOCK_ADDR: usize = 8;
const BEGIN_FLAGS: usize = 16;

#[inline(always)]
fn count_event(slot: u32) {
    if let Some(counter) = KERNEL_LOCK_EVENTS.get_ptr_mut(slot) {
        add(counter, 1);
    }
}

/// The field of `T` at `offset` of the tracepoint's record.
#[inline(always)]
fn field<T: Copy>(ctx: &TracePointContext, offset: usize) -> T {
    // SAFETY: the offsets are fields of both records (the format files);
    // the verifier checks context reads against the record's size.
    unsafe { core::ptr::read((ctx.as_ptr() as *const u8).add(offset) as *const T) }
}

/// The user side of the thread's contention: the futex word of the futex
/// syscall it is in (0 outside one, and in a condvar's or the Go
/// runtime's wait, which are no lock's), and the user registers (ip, sp,
/// bp) saved when it entered the kernel.
#[inline(always)]
fn user_side(tid: u32) -> (u64, (u64, u64, u64)) {
    let Some(regs) = saved_user_regs() else {
        return (0, (0, 0, 0));
    };
    // SAFETY: the helper's typed (BTF) pointer to the saved registers;
    // the verifier makes these loads checked ones (a fault reads 0).
    let (syscall, word, ip, sp, bp) = unsafe {
        (
            core::ptr::read_volatile(&(*regs).orig_rax),
            core::ptr::read_volatile(&(*regs).rdi),
            core::ptr::read_volatile(&(*regs).rip),
            core::ptr::read_volatile(&(*regs).rsp),
            core::ptr::read_volatile(&(*regs).rbp),
        )
    };
    // SAFETY: the reference is used at once, within this program run.
    let not_lock = unsafe { WAITING.get(tid) }.is_some_and(|wait| wait.class != wait_class::FUTEX);
    let user_lock = if syscall == SYS_FUTEX && !not_lock {
        key_of(word)
    } else {
        0
    };
    (user_lock, (ip, sp, bp))
}

/// The kernel stack id for a contention at `site` (its key, stack id 0):
/// a stack taken now for the site's first `STACKS_EXACT_FIRST` contentions
/// and one in `STACK_SAMPLE_EVERY` after, else the site's last one. -1
/// when a stack could not be stored.
#[inline(always)]
fn kernel_stack_of(ctx: &TracePointContext, site: &KernelLockKey) -> i64 {
    let Some(known) = KERNEL_LOCK_SITES.get_ptr_mut(site) else {
        let id = take_kernel_stack(ctx);
        // A full map: every contention of new sites takes its stack.
        let _ = KERNEL_LOCK_SITES.insert(
            site,
            KernelLockSite {
                begun: 1,
                stack_id: id,
            },
            0,
        );
        return id;
    };
    // SAFETY: `known` is the map value just looked up; two CPUs may read
    // the same count (a stack more or less) or write the last id (either
    // is the site's).
    unsafe {
        add(&mut (*known).begun, 1);
        let begun = core::ptr::read_volatile(&(*known).begun);
        let last = core::ptr::read_volatile(&(*known).stack_id);
        if begun > STACKS_EXACT_FIRST && begun & (STACK_SAMPLE_EVERY - 1) != 0 && last >= 0 {
            return last;
        }
        let id = take_kernel_stack(ctx);
        if id >= 0 {
            core::ptr::write_volatile(&mut (*known).stack_id, id);
        }
        id
    }
}

/// The current kernel stack's id in `KERNEL_LOCK_STACKS`, -1 when lost.
#[inline(always)]
fn take_kernel_stack(ctx: &TracePointContext) -> i64 {
    match ctx.get_stackid(&KERNEL_LOCK_STACKS, 0) {
        Ok(id) => id,
        Err(_) => {
            count_event(event::STACK_LOST);
            -1
        }
    }
}

#[tracepoint]
pub fn kernel_lock_begin(ctx: TracePointContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::WAITS) {
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: only tested for presence.
    if unsafe { KERNEL_LOCK_BEGINS.get(tid) }.is_some() {
        count_event(event::NESTED);
        return 0;
    }
    let lock: u64 = field(&ctx, LOCK_ADDR);
    let lock_flags: u32 = field(&ctx, BEGIN_FLAGS);
    let (user_lock, regs) = user_side(tid);
    // The route splits the lock's waits by request (`--php`); 0 without it
    // keeps the keys as few as before.
    let php = FLAGS.load() & flags::PHP != 0;
    let mut key = KernelLockKey {
        lock,
        user_lock,
        user_ip: regs.0,
        stack_id: 0,
        flags: lock_flags,
        _pad: 0,
        route: if php { current_route() } else { NO_REQUEST },
    };
    key.stack_id = kernel_stack_of(&ctx, &key);
    let begin = KernelLockBegin {
        key,
        start_ns: now_ns(),
    };
    if KERNEL_LOCK_BEGINS.insert(tid, begin, 0).is_err() {
        count_event(event::UNTRACKED);
        return 0;
    }
    if FLAGS.load() & flags::STACKS != 0 {
        // The flags (below 64) keep the read and write sides' stacks apart.
        let kind = stack_kind::KERNEL_LOCK + i64::from(lock_flags & 63);
        record_stack_of(kind, lock, regs.0, regs, 0);
    }
    0
}

#[tracepoint]
pub fn kernel_lock_end(ctx: TracePointContext) -> u32 {
    if !is_target(&ctx) {
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: the value is copied out at once, before the entry is removed.
    let Some(begin) = (unsafe { KERNEL_LOCK_BEGINS.get(tid) }).copied() else {
        if counting(counting::WAITS) {
            count_event(event::UNMATCHED_END);
        }
        return 0;
    };
    // The end of a nested contention: the outer one goes on.
    if begin.key.lock != field::<u64>(&ctx, LOCK_ADDR) {
        return 0;
    }
    let _ = KERNEL_LOCK_BEGINS.remove(tid);
    if !counting(counting::WAITS) {
        return 0;
    }
    let waited = now_ns().saturating_sub(begin.start_ns);
    let counts = KERNEL_LOCKS.value_ptr(&begin.key).or_else(|| {
        KERNEL_LOCKS.insert_new(&begin.key, KernelLockCounts::default());
        KERNEL_LOCKS.value_ptr(&begin.key)
    });
    if counts.is_none() {
        count_event(event::KEYS_FULL);
    }
    if let Some(counts) = counts {
        // SAFETY: `counts` is the map value just looked up.
        unsafe {
            add(&mut (*counts).contentions, 1);
            add(&mut (*counts).wait_ns, waited);
            raise_to(&mut (*counts).max_wait_ns, waited);
        }
    }
    0
}

/// sched:sched_process_exit in a thread of the target: noted in `EXITING`
/// until the thread is freed. Not the main thread: it is freed only once
/// its parent reaps it, which may be never, or after the recording.
#[tracepoint]
pub fn thread_exit(_ctx: TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((id >> 32) as u32, id as u32);
    if tgid == TARGET_TGID.load() && tid != tgid {
        let _ = EXITING.insert(tid, 0, 0);
    }
    0
}

/// sched:sched_process_free: the task's last reference went, which comes
/// only after its last switch off the CPU (`finish_task_switch` drops one
/// of the two `rcu_users`, `release_task` the other) and a grace period:
/// no contention of that thread can follow. Runs in whichever task frees
/// it, so the thread is the record's `pid`, not the current task.
#[tracepoint]
pub fn thread_free(ctx: TracePointContext) -> u32 {
    // SAFETY: a probe read of the record (the offset is the format file's,
    // set before load); a failed read leaves 0, no thread's id.
    let tid: u32 = unsafe { ctx.read_at(FREE_PID_OFFSET.load() as usize) }.unwrap_or(0);
    let _ = EXITING.remove(tid);
    0
}
