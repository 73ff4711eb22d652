//! CPU sampling: what the target's lock code costs in CPU.
//!
//! `cpu_sample` runs on a software cpu-clock perf event on every CPU. A
//! sample of a target thread is lock code when the thread is in a lock
//! function or libc lock slow path (user mode; attributed to the lock in its
//! first argument, `rdi`, which those functions keep), or in the kernel inside
//! a futex syscall (attributed to the futex word, the syscall's first
//! argument, read from the user registers saved at syscall entry). With
//! `--stacks` each attributed sample also counts under a stack key of its
//! lock and sends snapshots on the lock calls' schedule (`record_stack_of`).

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::perf_event, programs::PerfEventContext};
use tracer_common::{
    MAX_CPU_LOCK_CODE_RANGES, counting, cpu_sample, drop_reason, flags, stack_kind, wait_class,
};

use crate::{
    counters::{add, counting_state, entry, is_target, key_of},
    futex::saved_user_regs,
    maps::{CPU_COUNTS, CPU_LOCK_CODE, CPU_LOCK_CODE_RANGES, CPU_LOCKS, FLAGS, WAITING},
    php::{count_route_lock_sample, count_route_sample},
    stacks::record_stack_of,
};

pub(crate) const SYS_FUTEX: u64 = 202;
/// `orig_ax` of a kernel entry that is not a syscall (an exception or trap).
pub(crate) const NOT_A_SYSCALL: u64 = u64::MAX;

#[inline(always)]
pub(crate) fn count_sample(class: u32) {
    if let Some(counter) = CPU_COUNTS.get_ptr_mut(class) {
        add(counter, 1);
    }
}

/// True when `ip` lies in one of the lock-code ranges.
#[inline(always)]
pub(crate) fn in_sampled_lock_code(ip: u64) -> bool {
    let ranges = CPU_LOCK_CODE_RANGES.load().min(MAX_CPU_LOCK_CODE_RANGES);
    for index in 0..MAX_CPU_LOCK_CODE_RANGES {
        if index >= ranges {
            return false;
        }
        if let Some(range) = CPU_LOCK_CODE.get(index)
            && ip >= range.start
            && ip < range.end
        {
            return true;
        }
    }
    false
}

/// Counts a lock-code sample under `address`; with `--stacks`, also
/// under its stack key (`stack_kind::CPU_USER` or `CPU_KERNEL`), with a
/// snapshot of the user registers `regs` (ip, sp, bp) when one is due, so
/// a lock's CPU stacks add up to its samples.
#[inline(always)]
pub(crate) fn attribute_sample(address: u64, kernel: bool, regs: (u64, u64, u64)) {
    let Some(samples) = entry(&CPU_LOCKS, &address, drop_reason::CPU_LOCKS_FULL) else {
        return;
    };
    // SAFETY: `samples` is the map value just looked up.
    unsafe {
        if kernel {
            add(&mut (*samples).kernel, 1);
        } else {
            add(&mut (*samples).user, 1);
        }
    }
    if FLAGS.load() & flags::PHP != 0 {
        count_route_lock_sample(address);
    }
    if FLAGS.load() & flags::STACKS != 0 {
        let kind = if kernel {
            stack_kind::CPU_KERNEL
        } else {
            stack_kind::CPU_USER
        };
        record_stack_of(kind, address, 0, regs, 0);
    }
}

#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    // Once counting stops (the recording's end) no sample counts either:
    // the totals, per lock and per route, are read after and agree.
    if !is_target(&ctx) || counting_state() & counting::WAITS == 0 {
        return 0;
    }
    count_sample(cpu_sample::TARGET);
    if FLAGS.load() & flags::PHP != 0 {
        count_route_sample();
    }
    let regs = unsafe { &(*ctx.ctx).regs };
    // The interrupted context was user mode: these are the user registers.
    if regs.cs & 3 == 3 {
        if in_sampled_lock_code(regs.rip) {
            count_sample(cpu_sample::LOCK_USER);
            attribute_sample(key_of(regs.rdi), false, (regs.rip, regs.rsp, regs.rbp));
        }
        return 0;
    }
    // Kernel mode: the user registers saved when the thread entered the kernel.
    let Some(user) = saved_user_regs() else {
        return 0;
    };
    // SAFETY: as in `from_go_runtime`: the helper's typed pointer, whose
    // loads the verifier makes checked ones (a fault reads 0: no syscall
    // of interest, no lock code).
    let (syscall, first_arg, user_ip) = unsafe {
        (
            core::ptr::read_volatile(&(*user).orig_rax),
            core::ptr::read_volatile(&(*user).rdi),
            core::ptr::read_volatile(&(*user).rip),
        )
    };
    if syscall == SYS_FUTEX {
        // SAFETY: as above.
        let user_regs = unsafe {
            (
                user_ip,
                core::ptr::read_volatile(&(*user).rsp),
                core::ptr::read_volatile(&(*user).rbp),
            )
        };
        classify_futex_sample(first_arg, user_regs);
    } else if syscall == NOT_A_SYSCALL && in_sampled_lock_code(user_ip) {
        // A trap from lock code that is no syscall: the uprobe breakpoint.
        count_sample(cpu_sample::TRACER);
    } else if syscall == NOT_A_SYSCALL {
        count_sample(cpu_sample::INTERRUPTED);
    }
    0
}

/// A kernel sample inside a futex syscall on `uaddr`: a lock's, unless the
/// thread's wait in progress is a condvar's or the Go runtime's. `regs`:
/// the user registers saved at the syscall's entry (ip, sp, bp).
#[inline(always)]
pub(crate) fn classify_futex_sample(uaddr: u64, regs: (u64, u64, u64)) {
    let tid = bpf_get_current_pid_tgid() as u32;
    let not_lock = unsafe { WAITING.get(tid) }.is_some_and(|wait| wait.class != wait_class::FUTEX);
    if not_lock {
        count_sample(cpu_sample::FUTEX_NOT_LOCK);
        return;
    }
    count_sample(cpu_sample::LOCK_KERNEL);
    attribute_sample(key_of(uaddr), true, regs);
}
