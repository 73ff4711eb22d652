//! `--mode inproc --stacks`: the sample call the stubs make and the BPF
//! side takes a stack at.
//!
//! One acquisition in `mask + 1` per (lock, caller, op) slot of a CPU's
//! table makes `getppid` (the cheapest syscall every seccomp profile
//! allows) with `r10` = [`MAGIC`], `rdi` = the lock and `r8` = the op; the
//! `sys_enter_getppid` tracepoint takes the stack there.

/// x86-64 `getppid`.
pub const SYSCALL_NR: u64 = 110;
/// In `r10` at a stub's `getppid` ("LOCKSMPL"; below 2^63 so the
/// assembler takes it as a plain immediate): a `getppid` of the program's
/// own says nothing in `r10` (the call takes no argument).
pub const MAGIC: u64 = 0x4C4F_434B_534D_504C;
/// The default of `--stack-sample-every`: one acquisition in 256 per
/// lock, call site and CPU.
pub const DEFAULT_EVERY: u64 = 256;
