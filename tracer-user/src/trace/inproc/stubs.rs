//! The machine code `--mode inproc` copies into the target: one counting
//! stub per lock function, and the patcher that swaps GOT entries.
//!
//! The block is position independent: it refers only to its own data words
//! (RIP-relative), which locktrace fills after copying it, so the same bytes
//! run wherever the target's mapping lands. It lives in `.rodata` here: this
//! process never runs it.
//!
//! A stub is entered instead of the lock function, from a call through a
//! GOT entry: `rdi` holds the lock, `[rsp]` the caller's return address.
//! It counts the call in the slot of (lock, caller, function) of the
//! current CPU's table (`rdpid`: the CPU number the kernel keeps in
//! TSC_AUX; table 0 on a CPU without it), then jumps
//! to the real function (entry-counted functions) or calls it and counts
//! only a success (trylock, timed and clock variants, which may fail).
//! Counts are `lock inc`: exact when a thread migrates between reading its
//! CPU and counting, and cheap because each CPU's table stays in its cache.
//! Nothing is counted while the gate word (control page + 0x80) is 0: the
//! entries are switched with the gate closed, and it opens and closes with
//! the BPF side's counting, so both cover one interval.
//! Stubs touch only the registers a call may clobber (rax, rcx, rdx,
//! r8-r11, and rsi after the real function returned).
//!
//! Sampled stacks (`--stacks`): an acquisition counted with `lock xadd`
//! whose old count has every bit of the sample mask set (one in mask + 1
//! per slot; mask 0: never) makes a `getppid` with `r10` = the sample
//! magic, `rdi` = the lock and `r8` = the op, whose tracepoint takes the
//! stack (`tracer_common::inproc_sample`). `rsp` is the stub's entry `rsp`
//! there on both paths, so `[rsp]` is the caller's return address.
use tracer_common::{LOCK_OPS, inproc_sample};

/// Offsets of the block's data words (filled by locktrace).
pub(crate) const TABLES_BASE: usize = 0x00;
/// Nonzero: the CPU has `rdpid`. The CPU is never read through the
/// thread pointer: a thread with a TLS block of its own (a raw `clone`)
/// must not fault in a stub.
pub(crate) const USE_RDPID: usize = 0x08;
pub(crate) const CPU_TABLES: usize = 0x10;
pub(crate) const OVERFLOW_BASE: usize = 0x18;
/// `LOCK_OPS` words: the real function of each op (0: not patched).
pub(crate) const REAL_FUNCTIONS: usize = 0x20;
/// Sample mask: 2^k - 1 samples one acquisition in 2^k per (lock,
/// caller, op) slot of a CPU's table; 0 (as copied) takes no sample.
pub(crate) const SAMPLE_MASK: usize = 0x90;
/// Stub of op `i` at `STUBS + i * STUB_STRIDE`.
pub(crate) const STUBS: usize = 0xC0;
pub(crate) const STUB_STRIDE: usize = 16;
/// A `syscall` followed by `rt_sigreturn`: injected syscalls run here
/// once the mapping exists (see `inject`: the way back needs no tracer).
pub(crate) const SYSCALL_SITE: usize = 0x1A0;
/// The patcher: `rdi` = patch list, `rsi` = entries; ends in `getpid`
/// (the stop that tells locktrace it is done), then `rt_sigreturn`.
pub(crate) const PATCHER: usize = 0x1C0;

/// log2 of a table's entries, and its size in bytes (32-byte entries).
pub(crate) const ENTRY_BITS: u32 = 14;
pub(crate) const TABLE_BYTES: usize = 32 << ENTRY_BITS;
/// Slots a stub looks at before it counts the call as overflow (the
/// `COUNT` macro's `mov r10d, 64`; a unit test holds the two together).
#[cfg(test)]
pub(crate) const MAX_PROBES: u32 = 64;

const _: () = assert!(REAL_FUNCTIONS + 8 * LOCK_OPS <= SAMPLE_MASK);
const _: () = assert!(SAMPLE_MASK + 8 <= STUBS);
const _: () = assert!(STUBS + STUB_STRIDE * LOCK_OPS <= SYSCALL_SITE);

// Numeric labels avoid digits 0 and 1 only: in Intel syntax `1b` reads as
// a binary number. Braces are doubled: the block is a format string (the
// sample call's numbers come from `tracer_common`).
core::arch::global_asm!(
    r#"
    .pushsection .rodata.locktrace_inproc, "a"
    .balign 4096
    .globl locktrace_inproc_block
locktrace_inproc_block:
.Ltables_base:  .quad 0
.Luse_rdpid:    .quad 0
.Lcpu_tables:   .quad 0
.Loverflow_base: .quad 0
.Lreal:         .fill 14, 8, 0
.Lsample_mask:  .quad 0

    .macro COUNT field
    mov rcx, r11
    shl rcx, 56
    or rax, rcx
    xor edx, edx
    cmp qword ptr [rip + .Luse_rdpid], 0
    je 2f
    rdpid rdx
    and edx, 0xfff
    cmp rdx, qword ptr [rip + .Lcpu_tables]
    jb 2f
    xor edx, edx
2:
    shl rdx, 19
    add rdx, qword ptr [rip + .Ltables_base]
    mov r8, rax
    rol r8, 29
    xor r8, rdi
    movabs r9, 0x9E3779B97F4A7C15
    imul r8, r9
    shr r8, 50
    shl r8, 5
    add r8, rdx
    mov r10d, 64
3:
    cmp qword ptr [r8], rdi
    jne 5f
    cmp qword ptr [r8 + 8], rax
    jne 6f
4:
    .if \field == 16
    mov ecx, 1
    lock xadd qword ptr [r8 + 16], rcx
    mov r9, qword ptr [rip + .Lsample_mask]
    test r9, r9
    jz 9f
    and rcx, r9
    cmp rcx, r9
    jne 9f
    mov r8, r11
    movabs r10, {magic}
    mov eax, {getppid}
    syscall
    mov r11, r8
    .else
    lock inc qword ptr [r8 + \field]
    .endif
    jmp 9f
5:
    cmp qword ptr [r8], 0
    jne 6f
    mov r9, rax
    xor eax, eax
    lock cmpxchg qword ptr [r8], rdi
    mov rax, r9
    jne 3b
    mov qword ptr [r8 + 8], rax
    jmp 4b
6:
    add r8, 32
    lea r9, [rdx + 0x80000]
    cmp r8, r9
    jb 7f
    mov r8, rdx
7:
    dec r10d
    jnz 3b
    mov r9, qword ptr [rip + .Loverflow_base]
    lock inc qword ptr [r9 + r11 * 8]
9:
    .endm

    .macro ENTRY_STUB op
    .org 0xC0 + \op * 16
    mov r11d, \op
    jmp .Lcount_and_jump
    .endm

    .macro TRY_STUB op
    .org 0xC0 + \op * 16
    mov r11d, \op
    jmp .Ltry_call
    .endm

    ENTRY_STUB 0
    TRY_STUB 1
    TRY_STUB 2
    ENTRY_STUB 3
    ENTRY_STUB 4
    TRY_STUB 5
    TRY_STUB 6
    TRY_STUB 7
    TRY_STUB 8
    TRY_STUB 9
    TRY_STUB 10
    TRY_STUB 11
    ENTRY_STUB 12
    TRY_STUB 13

    .org 0x1A0
.Lsyscall_site:
    syscall
    mov eax, 15
    syscall
    ud2

    .org 0x1C0
.Lpatcher:
    test rsi, rsi
    jz 8f
    mov rcx, qword ptr [rdi]
    mov rax, qword ptr [rdi + 8]
    mov rdx, qword ptr [rdi + 16]
    lock cmpxchg qword ptr [rcx], rdx
    mov qword ptr [rdi + 24], rax
    add rdi, 32
    dec rsi
    jmp .Lpatcher
8:
    mov eax, 39
    syscall
    mov eax, 15
    syscall
    ud2

.Lcount_and_jump:
    mov rax, qword ptr [rip + .Loverflow_base]
    cmp qword ptr [rax + 0x80], 0
    je .Ljump_real
    mov rax, qword ptr [rsp]
    COUNT 16
.Ljump_real:
    lea rax, [rip + .Lreal]
    jmp qword ptr [rax + r11 * 8]

.Ltry_call:
    push rdi
    push r11
    sub rsp, 8
    lea rax, [rip + .Lreal]
    call qword ptr [rax + r11 * 8]
    add rsp, 8
    pop r11
    pop rdi
    mov esi, eax
    mov rax, qword ptr [rip + .Loverflow_base]
    cmp qword ptr [rax + 0x80], 0
    je .Ltry_return
    test esi, esi
    jnz .Ltry_failed
    mov rax, qword ptr [rsp]
    COUNT 16
    jmp .Ltry_return
.Ltry_failed:
    mov rax, qword ptr [rsp]
    COUNT 24
.Ltry_return:
    mov eax, esi
    ret

    .globl locktrace_inproc_block_end
locktrace_inproc_block_end:
    .popsection
"#,
    magic = const inproc_sample::MAGIC,
    getppid = const inproc_sample::SYSCALL_NR,
);

unsafe extern "C" {
    static locktrace_inproc_block: u8;
    static locktrace_inproc_block_end: u8;
}

/// The block's bytes, data words still zero.
pub(crate) fn block() -> &'static [u8] {
    // SAFETY: both symbols are in the one section the assembler emitted
    // above, start before end; the bytes are read-only data.
    unsafe {
        let start = &raw const locktrace_inproc_block;
        let end = &raw const locktrace_inproc_block_end;
        std::slice::from_raw_parts(start, end.offset_from(start) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::LockOp;

    #[test]
    fn the_block_fits_its_page_and_stubs_match_the_ops() {
        let block = block();
        assert!(
            block.len() > PATCHER && block.len() < 4096,
            "{}",
            block.len()
        );
        for op in LockOp::ALL {
            let at = STUBS + STUB_STRIDE * op as usize;
            // mov r11d, imm32 (41 bb imm32), then jmp rel32 (e9).
            assert_eq!(&block[at..at + 2], &[0x41, 0xbb], "{op:?}");
            let imm = u32::from_le_bytes(block[at + 2..at + 6].try_into().unwrap());
            assert_eq!(imm, op as u32);
            let target = (at + 11) as i64
                + i32::from_le_bytes(block[at + 7..at + 11].try_into().unwrap()) as i64;
            let try_call = (target as usize) > PATCHER;
            assert!(try_call);
        }
        // The probe limit in the asm is MAX_PROBES (mov r10d, imm32: 41 ba).
        let limit = [&[0x41, 0xba][..], &MAX_PROBES.to_le_bytes()].concat();
        assert!(block.windows(limit.len()).any(|w| w == limit));
        // The sample call: movabs r10, MAGIC (49 ba imm64); mov eax,
        // getppid; syscall. Once for the entry-counted path, once for the
        // try path's successes (never for failures).
        let sample = [
            &[0x49, 0xba][..],
            &inproc_sample::MAGIC.to_le_bytes(),
            &[0xb8, 110, 0, 0, 0, 0x0f, 0x05],
        ]
        .concat();
        let calls = block.windows(sample.len()).filter(|w| *w == sample).count();
        assert_eq!(calls, 2);
        // The mask word is read RIP-relative at SAMPLE_MASK: mov r9,
        // [rip + disp32] (4c 8b 0d disp32) whose target is SAMPLE_MASK.
        let mask_reads = (0..block.len() - 7)
            .filter(|&at| {
                block[at..at + 3] == [0x4c, 0x8b, 0x0d]
                    && (at as i64
                        + 7
                        + i32::from_le_bytes(block[at + 3..at + 7].try_into().unwrap()) as i64)
                        == SAMPLE_MASK as i64
            })
            .count();
        assert_eq!(mask_reads, 2);
        assert_eq!(&block[SAMPLE_MASK..SAMPLE_MASK + 8], &[0; 8]);
        // Acquisitions count with lock xadd [r8 + 16], rcx (f0 49 0f c1 48
        // 10), failures with lock inc [r8 + 24] (f0 49 ff 40 18).
        let xadd = [0xf0, 0x49, 0x0f, 0xc1, 0x48, 0x10];
        assert_eq!(block.windows(6).filter(|w| *w == xadd).count(), 2);
        let failed = [0xf0, 0x49, 0xff, 0x40, 0x18];
        assert_eq!(block.windows(5).filter(|w| *w == failed).count(), 1);
        // Injected code ends in rt_sigreturn (mov eax, 15; syscall), never
        // in a trap a dead tracer would turn into a signal.
        let sigreturn = [0xb8, 0x0f, 0, 0, 0, 0x0f, 0x05];
        assert_eq!(&block[SYSCALL_SITE..SYSCALL_SITE + 2], &[0x0f, 0x05]);
        assert_eq!(&block[SYSCALL_SITE + 2..SYSCALL_SITE + 9], &sigreturn);
        let getpid_then_sigreturn = [&[0xb8, 39, 0, 0, 0, 0x0f, 0x05][..], &sigreturn].concat();
        assert!(
            block[PATCHER..]
                .windows(getpid_then_sigreturn.len())
                .any(|w| w == getpid_then_sigreturn)
        );
    }
}
