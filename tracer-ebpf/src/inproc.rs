//! `--mode inproc --stacks`: the stubs' sampled acquisitions. A sampling
//! stub makes `getppid` with the sample magic in `r10`, the lock in `rdi`
//! and the op in `r8`, at its entry `rsp` (`[rsp]`: the caller's return
//! address); the stack is taken as it is right after the lock call
//! returned, so its first frame is the caller.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use tracer_common::{LOCK_OPS, counting, inproc_sample, stack_kind};

use crate::{
    counters::{counting, is_target, key_of},
    futex::saved_user_regs,
    locks::read_return_ip,
    stacks::record_stack_of,
};

/// Tracepoint syscalls:sys_enter_getppid.
#[tracepoint]
pub fn inproc_sample(ctx: TracePointContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::LOCK_CALLS) {
        return 0;
    }
    let Some(regs) = saved_user_regs() else {
        return 0;
    };
    // SAFETY: `regs` is the helper's typed (BTF) pointer to the current
    // task's saved registers: the verifier makes the loads checked ones.
    let (magic, lock, op, sp, bp) = unsafe {
        (
            core::ptr::read_volatile(&(*regs).r10),
            core::ptr::read_volatile(&(*regs).rdi),
            core::ptr::read_volatile(&(*regs).r8),
            core::ptr::read_volatile(&(*regs).rsp),
            core::ptr::read_volatile(&(*regs).rbp),
        )
    };
    if magic != inproc_sample::MAGIC || op >= LOCK_OPS as u64 {
        return 0;
    }
    let return_ip = read_return_ip(sp);
    if return_ip == 0 {
        return 0;
    }
    record_stack_of(
        stack_kind::INPROC_SAMPLE + op as i64,
        key_of(lock),
        return_ip,
        (return_ip, sp + 8, bp),
        0,
    );
    0
}
