//! Bits of the `KERNEL_CAPS` global: BPF helpers the running kernel has.
//! The global is read-only, so the verifier drops the branches for a
//! missing helper instead of refusing the program (Linux 5.10).

/// `bpf_get_attach_cookie` (Linux 5.15); without it the lock program
/// looks its cookie up in `PROBE_COOKIES` by the probe's address.
pub const ATTACH_COOKIE: u32 = 1;
/// `bpf_get_current_task_btf` and `bpf_task_pt_regs` (Linux 5.15): the
/// user registers of a thread inside the kernel (wait stacks, Go
/// runtime waits, CPU samples in futex calls).
pub const TASK_REGS: u32 = 2;
