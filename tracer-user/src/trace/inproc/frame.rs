//! The way back that needs no tracer: an `rt_sigreturn` frame holding a
//! stopped thread's own state. Every piece of code locktrace makes a
//! target thread run ends in `rt_sigreturn` on such a frame, so a thread
//! whose tracer dies (SIGKILL, OOM) at any instant runs on to the end of
//! that code and is put back by the kernel exactly where it was, an
//! interrupted syscall set to run again. Pure byte layout, no syscalls.
//!
//! The layout is the kernel's x86-64 `struct rt_sigframe`: the return
//! address slot, `struct ucontext` (flags, link, `stack_t`, `struct
//! sigcontext`, the signal mask), `siginfo`, then the FPU state (the
//! thread's own xsave image, as ptrace's `NT_X86_XSTATE` gives it, with
//! the sigframe's closing magic).

/// A user_regs_struct-shaped copy of the registers a frame restores.
pub(crate) type Registers = libc::user_regs_struct;

/// `struct rt_sigframe` up to the FPU state: return slot, ucontext, siginfo.
const FRAME_BYTES: u64 = 8 + UCONTEXT_BYTES + 128;
const UCONTEXT_BYTES: u64 = 8 + 8 + 24 + SIGCONTEXT_BYTES + 8;
const SIGCONTEXT_BYTES: u64 = 256;
/// Offsets inside the frame.
const UCONTEXT: usize = 8;
const UC_FLAGS: usize = UCONTEXT;
const UC_STACK_FLAGS: usize = UCONTEXT + 16 + 8;
const SIGCONTEXT: usize = UCONTEXT + 40;
const UC_SIGMASK: usize = SIGCONTEXT + SIGCONTEXT_BYTES as usize;
/// `uc_flags`: the frame's `ss` is restored as it is (no fix-up).
const UC_FP_XSTATE: u64 = 0x1;
const UC_SIGCONTEXT_SS: u64 = 0x2;
const UC_STRICT_RESTORE_SS: u64 = 0x4;
/// Neither 0, `SS_ONSTACK` nor `SS_DISABLE`: the kernel's restore of the
/// alternate signal stack fails on it and leaves the thread's own as it
/// is (the failure is not reported).
const STACK_FLAGS_KEEP: u32 = 3;
/// The FPU state's software bytes (inside the fxsave area) and magics.
const SW_BYTES: usize = 464;
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;

/// Kernel error codes of a syscall interrupted to be restarted.
const ERESTARTSYS: i64 = 512;
const ERESTARTNOINTR: i64 = 513;
pub(crate) const ERESTARTNOHAND: i64 = 514;
const ERESTART_RESTARTBLOCK: i64 = 516;
const EINTR: i64 = 4;

/// A frame to write into the target: `bytes` go at `at` (the return
/// address slot), and the thread runs `rt_sigreturn` with `rsp = at + 8`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReturnFrame {
    pub at: u64,
    pub bytes: Vec<u8>,
}

impl ReturnFrame {
    /// Bytes a frame needs below `top` for an FPU image of `fpu_bytes`.
    pub(crate) fn size(fpu_bytes: usize) -> u64 {
        fpu_bytes as u64 + 4 + 64 + FRAME_BYTES + 32
    }
}

/// Syscalls that, interrupted with EINTR, did nothing and may simply run
/// again: a stop locktrace caused is turned into a restart for them (a
/// signal with a handler still gets EINTR, as without locktrace).
pub(crate) fn retry_safe(number: u64) -> bool {
    const READ: u64 = 0;
    const WRITE: u64 = 1;
    const READV: u64 = 19;
    const WRITEV: u64 = 20;
    const SEMOP: u64 = 65;
    const MSGSND: u64 = 69;
    const MSGRCV: u64 = 70;
    const ACCEPT: u64 = 43;
    const SENDTO: u64 = 44;
    const RECVFROM: u64 = 45;
    const SENDMSG: u64 = 46;
    const RECVMSG: u64 = 47;
    const RT_SIGTIMEDWAIT: u64 = 128;
    const SEMTIMEDOP: u64 = 220;
    const EPOLL_WAIT: u64 = 232;
    const EPOLL_PWAIT: u64 = 281;
    const ACCEPT4: u64 = 288;
    const RECVMMSG: u64 = 299;
    const EPOLL_PWAIT2: u64 = 441;
    matches!(
        number,
        READ | WRITE
            | READV
            | WRITEV
            | SEMOP
            | MSGSND
            | MSGRCV
            | ACCEPT
            | SENDTO
            | RECVFROM
            | SENDMSG
            | RECVMSG
            | RT_SIGTIMEDWAIT
            | SEMTIMEDOP
            | EPOLL_WAIT
            | EPOLL_PWAIT
            | ACCEPT4
            | RECVMMSG
            | EPOLL_PWAIT2
    )
}

/// Whether the thread stopped in a syscall that returned EINTR only
/// because of the stop, and that may run again.
pub(crate) fn interrupted_by_the_stop(regs: &Registers) -> bool {
    (regs.orig_rax as i64) >= 0 && regs.rax as i64 == -EINTR && retry_safe(regs.orig_rax)
}

/// The registers a thread stopped at `regs` resumes with when the kernel
/// restarts its interrupted syscall as it would after a signal with no
/// handler: back at the `syscall` instruction with the call's number. A
/// call with a restart block runs again from its start (rt_sigreturn
/// drops restart blocks: `restart_syscall` would return EINTR).
pub(crate) fn resume_registers(regs: &Registers) -> Registers {
    let mut resume = *regs;
    if (regs.orig_rax as i64) >= 0 {
        let error = -(regs.rax as i64);
        if matches!(
            error,
            ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND | ERESTART_RESTARTBLOCK
        ) {
            resume.rip = regs.rip.wrapping_sub(2);
            resume.rax = regs.orig_rax;
        }
    }
    resume
}

fn put64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

fn put32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// The frame that restores `resume`, signal `mask` and the FPU image
/// `fpu` (an xsave image from ptrace, or a bare fxsave one), laid out
/// below `top`; its return slot holds `pretcode` (where a `ret` goes).
pub(crate) fn return_frame(
    resume: &Registers,
    mask: u64,
    fpu: &[u8],
    top: u64,
    pretcode: u64,
) -> ReturnFrame {
    let mut fpu = fpu.to_vec();
    let xstate_size = xstate_size(&fpu);
    if xstate_size.is_none() && fpu.len() > SW_BYTES {
        // Not an xsave image: the kernel restores it as fxsave only.
        fpu[SW_BYTES..SW_BYTES + 4].fill(0);
    }
    let fpu_at = (top - fpu.len() as u64 - 4) & !63;
    let at = ((fpu_at - FRAME_BYTES) & !15) - 8;
    let mut bytes = vec![0u8; (top - at) as usize];
    let fpu_offset = (fpu_at - at) as usize;
    bytes[fpu_offset..fpu_offset + fpu.len()].copy_from_slice(&fpu);
    if let Some(size) = xstate_size {
        put32(&mut bytes, fpu_offset + size, FP_XSTATE_MAGIC2);
    }
    put64(&mut bytes, 0, pretcode);
    let fp_flag = if xstate_size.is_some() {
        UC_FP_XSTATE
    } else {
        0
    };
    put64(
        &mut bytes,
        UC_FLAGS,
        UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS | fp_flag,
    );
    put32(&mut bytes, UC_STACK_FLAGS, STACK_FLAGS_KEEP);
    write_sigcontext(&mut bytes[SIGCONTEXT..UC_SIGMASK], resume, mask, fpu_at);
    put64(&mut bytes, UC_SIGMASK, mask);
    ReturnFrame { at, bytes }
}

/// `struct sigcontext` (x86-64) from registers.
fn write_sigcontext(bytes: &mut [u8], regs: &Registers, mask: u64, fpu_at: u64) {
    let words = [
        regs.r8,
        regs.r9,
        regs.r10,
        regs.r11,
        regs.r12,
        regs.r13,
        regs.r14,
        regs.r15,
        regs.rdi,
        regs.rsi,
        regs.rbp,
        regs.rbx,
        regs.rdx,
        regs.rax,
        regs.rcx,
        regs.rsp,
        regs.rip,
        regs.eflags,
    ];
    for (i, word) in words.iter().enumerate() {
        put64(bytes, i * 8, *word);
    }
    // cs, gs, fs, ss as u16 at 144..152 (gs and fs are not restored).
    bytes[144..146].copy_from_slice(&(regs.cs as u16).to_le_bytes());
    bytes[150..152].copy_from_slice(&(regs.ss as u16).to_le_bytes());
    put64(bytes, 168, mask);
    put64(bytes, 184, fpu_at);
}

/// The xsave image's size from its software bytes, when it is one (magic
/// present and the size within the image).
fn xstate_size(fpu: &[u8]) -> Option<usize> {
    let word = |at: usize| Some(u32::from_le_bytes(fpu.get(at..at + 4)?.try_into().ok()?));
    if word(SW_BYTES)? != FP_XSTATE_MAGIC1 {
        return None;
    }
    let size = word(SW_BYTES + 16)? as usize;
    (size >= 512 + 64 && size <= fpu.len()).then_some(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registers() -> Registers {
        // SAFETY: a plain C struct of integers; zero is valid.
        let mut regs: Registers = unsafe { std::mem::zeroed() };
        regs.rip = 0x7f00_0000_1002;
        regs.rsp = 0x7ffc_0000_8000;
        regs.rax = (-ERESTARTSYS) as u64;
        regs.orig_rax = 202;
        regs.rdi = 0x1234;
        regs.eflags = 0x246;
        regs.cs = 0x33;
        regs.ss = 0x2b;
        regs
    }

    #[test]
    fn an_interrupted_syscall_resumes_at_its_instruction() {
        let regs = registers();
        let resume = resume_registers(&regs);
        assert_eq!(resume.rip, regs.rip - 2);
        assert_eq!(resume.rax, 202);
        let mut done = regs;
        done.rax = 0;
        assert_eq!(resume_registers(&done).rip, regs.rip);
        let mut user = regs;
        user.orig_rax = u64::MAX;
        assert_eq!(resume_registers(&user).rip, regs.rip);
    }

    #[test]
    fn eintr_of_a_retry_safe_call_counts_as_caused_by_the_stop() {
        let mut regs = registers();
        regs.rax = (-EINTR) as u64;
        regs.orig_rax = 232;
        assert!(interrupted_by_the_stop(&regs));
        regs.orig_rax = 3; // close: the descriptor is gone even on EINTR
        assert!(!interrupted_by_the_stop(&regs));
    }

    #[test]
    fn the_frame_holds_the_registers_mask_and_fpu_image() {
        let regs = registers();
        let mut fpu = vec![0u8; 832];
        fpu[SW_BYTES..SW_BYTES + 4].copy_from_slice(&FP_XSTATE_MAGIC1.to_le_bytes());
        fpu[SW_BYTES + 16..SW_BYTES + 20].copy_from_slice(&832u32.to_le_bytes());
        let top = 0x7ffc_0000_7f80;
        let frame = return_frame(&regs, 0x4000, &fpu, top, 0xdead);
        assert_eq!(frame.at + frame.bytes.len() as u64, top);
        assert_eq!(
            (frame.at + 8) % 16,
            0,
            "rsp after the return slot is aligned"
        );
        assert!(frame.bytes.len() as u64 <= ReturnFrame::size(fpu.len()));
        let word = |at: usize| u64::from_le_bytes(frame.bytes[at..at + 8].try_into().unwrap());
        assert_eq!(word(0), 0xdead);
        assert_eq!(word(SIGCONTEXT + 8 * 8), 0x1234, "rdi");
        assert_eq!(word(SIGCONTEXT + 16 * 8), regs.rip, "rip");
        assert_eq!(word(SIGCONTEXT + 15 * 8), regs.rsp, "rsp");
        assert_eq!(word(UC_SIGMASK), 0x4000);
        assert_eq!(word(UC_FLAGS), 0x7);
        let fpu_at = word(SIGCONTEXT + 184);
        assert_eq!(fpu_at % 64, 0);
        let offset = (fpu_at - frame.at) as usize;
        let magic2 =
            u32::from_le_bytes(frame.bytes[offset + 832..offset + 836].try_into().unwrap());
        assert_eq!(magic2, FP_XSTATE_MAGIC2);
        assert_eq!(
            u32::from_le_bytes(
                frame.bytes[UC_STACK_FLAGS..UC_STACK_FLAGS + 4]
                    .try_into()
                    .unwrap()
            ),
            STACK_FLAGS_KEEP
        );
    }

    #[test]
    fn a_bare_fxsave_image_is_marked_as_one() {
        let fpu = vec![0xffu8; 512];
        let frame = return_frame(&registers(), 0, &fpu, 0x10_0000, 0);
        let fpu_at = u64::from_le_bytes(
            frame.bytes[SIGCONTEXT + 184..SIGCONTEXT + 192]
                .try_into()
                .unwrap(),
        );
        let offset = (fpu_at - frame.at) as usize;
        assert_eq!(
            &frame.bytes[offset + SW_BYTES..offset + SW_BYTES + 4],
            &[0; 4]
        );
        assert_eq!(frame.bytes[UC_FLAGS] & 1, 0);
    }
}
