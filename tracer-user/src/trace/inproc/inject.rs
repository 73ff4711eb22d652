//! Running a few instructions inside the target, through ptrace: one of
//! its threads is stopped, made to execute a syscall (mmap, mprotect) or
//! the patcher, and put back exactly as it was. The one place that
//! ptraces.
//!
//! Never harm the target, whatever happens to locktrace:
//! - **A dead tracer leaves nothing half done.** Every piece of code the
//!   thread is given ends in `rt_sigreturn` on a frame holding the
//!   thread's own state ([`super::frame`]): if locktrace is killed at any
//!   instant, the kernel lets the thread run on, it finishes that code and
//!   is put back where it was. No stop locktrace uses is one the kernel
//!   turns into a signal when the tracer dies: no single-step, no `int3`
//!   (only event stops and syscall stops).
//! - **Signals.** While the thread is ours, every signal but the
//!   synchronous ones is blocked in it (`PTRACE_SETSIGMASK`), so none is
//!   lost or handled in injected code; they are delivered when the thread
//!   goes back. A fault of locktrace's own code is caught here and never
//!   reaches the target.
//! - **Syscalls the stop interrupted** restart as after a signal without
//!   a handler: the saved registers are put back at a stop inside the
//!   signal path. A call that returned EINTR only because of the stop and
//!   may simply run again (`epoll_wait`, `accept`…) is made to restart too;
//!   threads whose call restarts by itself are chosen first.
use std::{
    os::unix::fs::FileExt,
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};

use super::frame::{self, ReturnFrame};
use crate::probe::target::Mapping;

/// How long a thread may take to stop, or to run what it was given.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// How long to wait for a thread that can be stopped safely.
const PICK_WAIT: Duration = Duration::from_secs(2);

const PTRACE_GETSIGMASK: libc::c_uint = 0x420a;
const PTRACE_SETSIGMASK: libc::c_uint = 0x420b;
const NT_X86_XSTATE: libc::c_int = 0x202;
const NT_PRFPREG: libc::c_int = 2;
const SYS_GETPID: u64 = 39;
/// Signals a fault raises: never blocked (a blocked one is forced, and
/// the kernel then resets the target's handler).
const SYNCHRONOUS: [i32; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGFPE,
    libc::SIGSYS,
];

/// Where injected code starts: its first instruction and the stack
/// pointer it runs with (pointing at, or just above, a return frame).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Site {
    pub rip: u64,
    pub rsp: u64,
}

/// How a thread came to a stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// PTRACE_EVENT_STOP (our interrupt) or another event: in the signal path.
    Event,
    /// Syscall entry or exit.
    Syscall,
    /// Signal-delivery stop.
    Signal(i32),
}

/// A thread of the target, stopped under ptrace.
pub(crate) struct StoppedThread {
    tid: i32,
    saved: libc::user_regs_struct,
    mask: u64,
    /// The thread's FPU state, for its return frame.
    fpu: Vec<u8>,
    /// A signal that stopped the thread meanwhile, delivered at the end.
    pending: i32,
    last: Stop,
    /// Registers were changed to run injected code.
    injected: bool,
    /// Where the thread is when injected code finished.
    injected_at: Option<u64>,
    released: bool,
}

impl StoppedThread {
    /// Seizes and stops thread `tid` in the signal path.
    pub(crate) fn stop(tid: u32) -> Result<StoppedThread> {
        let pid = tid as i32;
        // SAFETY: plain ptrace requests on a thread id; no memory is passed.
        let seized = unsafe {
            libc::ptrace(
                libc::PTRACE_SEIZE,
                pid,
                0,
                libc::PTRACE_O_TRACESYSGOOD as libc::c_ulong,
            )
        };
        if seized != 0 {
            let errno = std::io::Error::last_os_error();
            return Err(match errno.raw_os_error() {
                Some(libc::EPERM) => anyhow!(
                    "cannot ptrace thread {tid}: another tracer holds it or ptrace is restricted (kernel.yama.ptrace_scope); detach the other tool or use --mode all"
                ),
                _ => anyhow!("cannot ptrace thread {tid}: {errno}; use --mode all"),
            });
        }
        let mut thread = StoppedThread {
            tid: pid,
            // SAFETY: a plain C struct of integers; zero is a valid value.
            saved: unsafe { std::mem::zeroed() },
            mask: 0,
            fpu: Vec::new(),
            pending: 0,
            last: Stop::Event,
            injected: false,
            injected_at: None,
            released: false,
        };
        instant("seized");
        request(libc::PTRACE_INTERRUPT, pid, 0, 0).context("stopping the thread")?;
        thread.until_event_stop()?;
        instant("stopped");
        thread.saved = thread.registers()?;
        thread.mask = thread.signal_mask()?;
        thread.fpu = thread.fpu_state();
        if frame::interrupted_by_the_stop(&thread.saved) {
            // EINTR that only the stop caused: the call restarts instead.
            thread.saved.rax = (-frame::ERESTARTNOHAND) as u64;
            thread.set_registers(&thread.saved)?;
        }
        Ok(thread)
    }

    pub(crate) fn tid(&self) -> u32 {
        self.tid as u32
    }

    /// The frame that puts this thread back as it was, laid out below
    /// `top`, with `pretcode` in its return slot.
    pub(crate) fn return_frame(&self, top: u64, pretcode: u64) -> ReturnFrame {
        frame::return_frame(
            &frame::resume_registers(&self.saved),
            self.mask,
            &self.fpu,
            top,
            pretcode,
        )
    }

    /// Where on its own stack a return frame fits (below the red zone),
    /// when the stack is a thread stack with room (see [`frame_top`]).
    pub(crate) fn stack_top(&self, maps: &[Mapping]) -> Option<u64> {
        frame_top(self.saved.rsp, ReturnFrame::size(self.fpu.len()), maps)
    }

    /// Writes `bytes` into the target at `address`.
    pub(crate) fn write(&self, address: u64, bytes: &[u8]) -> Result<()> {
        let memory = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{}/mem", self.tid))
            .context("opening the target's memory")?;
        memory
            .write_all_at(bytes, address)
            .with_context(|| format!("writing {} bytes at {address:#x}", bytes.len()))
    }

    /// Executes the syscall `number` with `args` at `site` (a `syscall`
    /// instruction followed by the way back: `ret` to `rt_sigreturn`, or
    /// `rt_sigreturn` itself); returns its result (negative: an errno).
    pub(crate) fn syscall(&mut self, site: Site, number: u64, args: [u64; 6]) -> Result<i64> {
        let mut regs = self.saved;
        regs.rip = site.rip;
        regs.rsp = site.rsp;
        regs.rax = number;
        regs.orig_rax = u64::MAX;
        regs.rdi = args[0];
        regs.rsi = args[1];
        regs.rdx = args[2];
        regs.r10 = args[3];
        regs.r8 = args[4];
        regs.r9 = args[5];
        self.enter(&regs)?;
        let entered = self.until_syscall_stop(site.rip..=site.rip + 2)?;
        if entered.orig_rax != number {
            bail!(
                "the injected syscall did not run (thread {} at {:#x})",
                self.tid,
                entered.rip
            );
        }
        let exited = self.until_syscall_stop(site.rip..=site.rip + 2)?;
        self.injected_at = Some(exited.rip);
        Ok(exited.rax as i64)
    }

    /// Runs the code at `site` with `rdi`/`rsi` until it makes its
    /// closing `getpid` (the stop that says it is done), between
    /// `site.rip` and `end`. The code uses no stack.
    pub(crate) fn run(&mut self, site: Site, end: u64, rdi: u64, rsi: u64) -> Result<()> {
        let mut regs = self.saved;
        regs.rip = site.rip;
        regs.rsp = site.rsp;
        regs.orig_rax = u64::MAX;
        regs.rdi = rdi;
        regs.rsi = rsi;
        self.enter(&regs)?;
        let entered = self.until_syscall_stop(site.rip..=end)?;
        if entered.orig_rax != SYS_GETPID {
            bail!(
                "the patcher did not finish (thread {} at {:#x})",
                self.tid,
                entered.rip
            );
        }
        let exited = self.until_syscall_stop(site.rip..=end)?;
        self.injected_at = Some(exited.rip);
        Ok(())
    }

    /// Puts the thread's registers and mask back and lets it go, with any
    /// signal that stopped it meanwhile.
    pub(crate) fn release(mut self) -> Result<()> {
        self.put_back()
    }

    fn put_back(&mut self) -> Result<()> {
        self.released = true;
        if self.last == Stop::Syscall {
            // Back into the signal path, where the saved registers let an
            // interrupted syscall restart.
            request(libc::PTRACE_INTERRUPT, self.tid, 0, 0)?;
            request(libc::PTRACE_CONT, self.tid, 0, 0)?;
            self.until_event_stop()?;
            instant("back in the signal path");
            let now = self.registers()?;
            if self.injected_at.is_some_and(|at| at != now.rip) {
                // It ran on and put itself back (rt_sigreturn): leave it.
                return self.detach();
            }
        }
        self.set_signal_mask(self.mask)?;
        instant("mask restored");
        self.set_registers(&self.saved)?;
        instant("registers restored");
        self.detach()
    }

    fn detach(&mut self) -> Result<()> {
        request(libc::PTRACE_DETACH, self.tid, 0, self.pending as u64)
            .context("detaching from the thread")
    }

    /// Gives the thread `regs`, then blocks its signals: a tracer that
    /// dies between the two leaves code that ends in rt_sigreturn, which
    /// restores the mask too.
    fn enter(&mut self, regs: &libc::user_regs_struct) -> Result<()> {
        self.injected = true;
        self.injected_at = None;
        self.set_registers(regs)?;
        instant("registers set");
        let mut blocked = !0u64;
        for signal in SYNCHRONOUS {
            blocked &= !(1u64 << (signal - 1));
        }
        self.set_signal_mask(blocked)?;
        instant("signals blocked");
        Ok(())
    }

    /// Resumes until the next syscall stop; a fault of the injected code
    /// (its instruction pointer in `code`) is kept from the target.
    fn until_syscall_stop(
        &mut self,
        code: std::ops::RangeInclusive<u64>,
    ) -> Result<libc::user_regs_struct> {
        let deadline = Instant::now() + STOP_WAIT;
        loop {
            request(libc::PTRACE_SYSCALL, self.tid, 0, 0).context("running injected code")?;
            let stop = self.wait()?;
            let regs = self.registers()?;
            match stop {
                Stop::Syscall => {
                    instant("syscall stop");
                    return Ok(regs);
                }
                Stop::Signal(signal) if SYNCHRONOUS.contains(&signal) => bail!(
                    "locktrace's code in the target faulted (signal {signal} at {:#x}{}); it was kept from the target",
                    regs.rip,
                    if code.contains(&regs.rip) {
                        ""
                    } else {
                        ", outside that code"
                    }
                ),
                Stop::Signal(signal) => self.pending = signal,
                Stop::Event => {}
            }
            if Instant::now() > deadline {
                bail!(
                    "injected code did not finish (thread {} at {:#x})",
                    self.tid,
                    regs.rip
                );
            }
        }
    }

    /// Waits for the event stop an interrupt brings; a signal-delivery
    /// stop before it delivers its signal as usual.
    fn until_event_stop(&mut self) -> Result<()> {
        loop {
            match self.wait()? {
                Stop::Event => return Ok(()),
                Stop::Signal(signal) if !self.injected => {
                    request(libc::PTRACE_CONT, self.tid, 0, signal as u64)?;
                }
                Stop::Signal(signal) => {
                    self.pending = signal;
                    request(libc::PTRACE_CONT, self.tid, 0, 0)?;
                }
                Stop::Syscall => request(libc::PTRACE_CONT, self.tid, 0, 0)?,
            }
        }
    }

    /// Waits for the thread's next stop (raw status: real-time signals too).
    fn wait(&mut self) -> Result<Stop> {
        let deadline = Instant::now() + STOP_WAIT;
        let mut pause = Duration::from_micros(20);
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes one int, `status`.
            let found =
                unsafe { libc::waitpid(self.tid, &mut status, libc::__WALL | libc::WNOHANG) };
            if found < 0 {
                bail!(
                    "waiting for thread {}: {}",
                    self.tid,
                    std::io::Error::last_os_error()
                );
            }
            if found == 0 {
                if Instant::now() > deadline {
                    bail!(
                        "thread {} did not stop within {} s (stuck in the kernel?)",
                        self.tid,
                        STOP_WAIT.as_secs()
                    );
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
                continue;
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                self.released = true;
                bail!(
                    "thread {} exited while locktrace was writing into the process",
                    self.tid
                );
            }
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            let signal = libc::WSTOPSIG(status);
            self.last = if signal == libc::SIGTRAP | 0x80 {
                Stop::Syscall
            } else if status >> 16 != 0 {
                // PTRACE_EVENT_STOP: the only event asked for.
                Stop::Event
            } else {
                Stop::Signal(signal)
            };
            return Ok(self.last);
        }
    }

    fn registers(&self) -> Result<libc::user_regs_struct> {
        // SAFETY: a plain C struct of integers; zero is a valid value.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: PTRACE_GETREGS writes one user_regs_struct into `regs`.
        let result = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGS,
                self.tid,
                0,
                &mut regs as *mut libc::user_regs_struct,
            )
        };
        check(result, "reading the thread's registers")?;
        Ok(regs)
    }

    fn set_registers(&self, regs: &libc::user_regs_struct) -> Result<()> {
        // SAFETY: PTRACE_SETREGS reads one user_regs_struct from `regs`.
        let result = unsafe {
            libc::ptrace(
                libc::PTRACE_SETREGS,
                self.tid,
                0,
                regs as *const libc::user_regs_struct,
            )
        };
        check(result, "setting the thread's registers")
    }

    fn signal_mask(&self) -> Result<u64> {
        let mut mask = 0u64;
        // SAFETY: PTRACE_GETSIGMASK writes 8 bytes (the size passed) into `mask`.
        let result =
            unsafe { libc::ptrace(PTRACE_GETSIGMASK, self.tid, 8usize, &mut mask as *mut u64) };
        check(result, "reading the thread's signal mask")?;
        Ok(mask)
    }

    fn set_signal_mask(&self, mask: u64) -> Result<()> {
        // SAFETY: PTRACE_SETSIGMASK reads 8 bytes (the size passed) from `mask`.
        let result =
            unsafe { libc::ptrace(PTRACE_SETSIGMASK, self.tid, 8usize, &mask as *const u64) };
        check(result, "setting the thread's signal mask")
    }

    /// The thread's xsave image (empty when neither it nor the bare
    /// fxsave image can be read: the frame then resets the FPU state).
    fn fpu_state(&self) -> Vec<u8> {
        for (note, size) in [(NT_X86_XSTATE, 64 * 1024), (NT_PRFPREG, 512)] {
            let mut buffer = vec![0u8; size];
            let mut vector = libc::iovec {
                iov_base: buffer.as_mut_ptr().cast(),
                iov_len: buffer.len(),
            };
            // SAFETY: the kernel writes at most `iov_len` bytes into
            // `buffer` and shortens `iov_len` to what it wrote.
            let result = unsafe {
                libc::ptrace(
                    libc::PTRACE_GETREGSET,
                    self.tid,
                    note as usize,
                    &mut vector as *mut libc::iovec,
                )
            };
            if result == 0 {
                buffer.truncate(vector.iov_len);
                return buffer;
            }
        }
        Vec::new()
    }
}

impl Drop for StoppedThread {
    /// On an error path: the thread goes back as it was.
    fn drop(&mut self) {
        if !self.released {
            let _ = self.put_back();
        }
    }
}

fn request(request: libc::c_uint, tid: i32, address: u64, data: u64) -> Result<()> {
    // SAFETY: requests that take integers only (no memory is passed).
    let result = unsafe { libc::ptrace(request, tid, address, data) };
    check(result, "ptrace")
}

fn check(result: libc::c_long, what: &str) -> Result<()> {
    if result < 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// A test-only pause point: with `LOCKTRACE_TEST_PAUSE_AT=N` locktrace
/// stops for good at the Nth instant of its writing into a target (a
/// test then kills it there); with `LOCKTRACE_TEST_INSTANTS=1` it prints
/// each instant. Neither is set outside tests.
fn instant(what: &str) {
    static SETTINGS: OnceLock<(Option<u64>, bool)> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let (pause_at, print) = *SETTINGS.get_or_init(|| {
        (
            std::env::var("LOCKTRACE_TEST_PAUSE_AT")
                .ok()
                .and_then(|v| v.parse().ok()),
            std::env::var_os("LOCKTRACE_TEST_INSTANTS").is_some(),
        )
    });
    if pause_at.is_none() && !print {
        return;
    }
    let number = COUNT.fetch_add(1, Ordering::SeqCst) + 1;
    if print {
        crate::model::diagnostics::note(format_args!("locktrace: instant {number}: {what}"));
    }
    if pause_at == Some(number) {
        crate::model::diagnostics::note(format_args!(
            "locktrace: paused at instant {number}: {what}"
        ));
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

/// The target's threads that another tracer holds (`TracerPid`).
pub(crate) fn traced_threads(pid: u32) -> Vec<(u32, u32)> {
    threads(pid)
        .into_iter()
        .filter_map(|tid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
            let tracer: u32 = status
                .lines()
                .find_map(|line| line.strip_prefix("TracerPid:"))?
                .trim()
                .parse()
                .ok()?;
            (tracer != 0).then_some((tid, tracer))
        })
        .collect()
}

pub(crate) fn threads(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| task.file_name().to_str()?.parse().ok())
        .collect()
}

/// How stopping a thread where it is now would look to it, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Fit {
    /// Blocked in a call the kernel restarts by itself after a stop.
    Restarts,
    /// Running its own code (stopped between two instructions).
    Running,
    /// Blocked in a call that returns EINTR on a stop, and that locktrace
    /// makes restart (its timeout starts again).
    RetrySafe,
    /// Anything else (`close`, `connect`…): not stopped.
    Unsafe,
}

/// A thread's place from `/proc/PID/task/TID/syscall`.
pub(crate) fn fit(syscall_line: &str) -> Fit {
    const FUTEX: u64 = 202;
    let mut fields = syscall_line.split_whitespace();
    let Some(first) = fields.next() else {
        return Fit::Unsafe;
    };
    if first == "running" || first == "-1" {
        return Fit::Running;
    }
    let Ok(number) = first.parse::<u64>() else {
        return Fit::Unsafe;
    };
    let argument = |fields: &mut std::str::SplitWhitespace, index: usize| {
        fields
            .clone()
            .nth(index)
            .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
    };
    // nanosleep, clock_nanosleep, poll, ppoll, select, pselect6, pause,
    // rt_sigsuspend, wait4, waitid, futex_waitv, restart_syscall.
    const RESTARTING: [u64; 12] = [35, 230, 7, 271, 23, 270, 34, 130, 61, 247, 449, 219];
    if RESTARTING.contains(&number) {
        return Fit::Restarts;
    }
    if number == FUTEX {
        // FUTEX_WAIT, FUTEX_LOCK_PI, FUTEX_WAIT_BITSET, FUTEX_LOCK_PI2.
        return match argument(&mut fields, 1).map(|op| op & 0x7f) {
            Some(0 | 6 | 9 | 13) => Fit::Restarts,
            _ => Fit::Unsafe,
        };
    }
    if frame::retry_safe(number) {
        return Fit::RetrySafe;
    }
    Fit::Unsafe
}

/// Why no thread of a process could be stopped to write through. Shown
/// in the attach's words; the restore says it in its own (the entries
/// are switched by then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NoThread {
    pub pid: u32,
    pub why: Unavailable,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unavailable {
    /// Job control stopped it (SIGSTOP, SIGTSTP): no thread runs.
    Stopped,
    /// Each thread is in a call a stop would cut short, waits where no
    /// stop reaches it (a `vfork` parent waits for its child), or has no
    /// room on its stack.
    Busy,
    Exited,
}

impl std::fmt::Display for NoThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pid = self.pid;
        match self.why {
            Unavailable::Stopped => write!(
                f,
                "process {pid} is stopped (SIGSTOP); continue it (kill -CONT {pid}) before --mode inproc"
            ),
            Unavailable::Busy => write!(
                f,
                "no thread of process {pid} can be stopped without disturbing it (each is in a call a stop would cut short, or on a stack without room); nothing was written; try again, or use --mode all"
            ),
            Unavailable::Exited => write!(f, "process {pid} exited"),
        }
    }
}

impl std::error::Error for NoThread {}

/// The target's threads that can be stopped without changing what they
/// see, best first (the main thread first among equals).
pub(crate) fn candidates(pid: u32) -> Result<Vec<u32>, NoThread> {
    let state = |tid: u32| -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
        stat.rsplit_once(')')?.1.trim_start().chars().next()
    };
    let tids = threads(pid);
    // A job-control stop holds every thread (the main thread may have
    // left with pthread_exit: any thread tells).
    if tids.iter().any(|&tid| state(tid) == Some('T')) {
        return Err(NoThread {
            pid,
            why: Unavailable::Stopped,
        });
    }
    let mut found: Vec<(Fit, bool, u32)> = tids
        .into_iter()
        .filter(|&tid| matches!(state(tid), Some('R' | 'S' | 'D')))
        .filter_map(|tid| {
            let line = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
            let fit = fit(&line);
            (fit != Fit::Unsafe).then_some((fit, tid != pid, tid))
        })
        .collect();
    found.sort();
    Ok(found.into_iter().map(|(_, _, tid)| tid).collect())
}

/// The largest guard page (`---p` right below a stack) a thread stack is
/// taken to have: glibc's and musl's are one page, a runtime's own guard
/// zones a few. Go reserves its heap arenas `---p` in 4 MiB chunks and up,
/// and runs goroutines on stacks carved out of them.
const MAX_GUARD: u64 = 1 << 20;

/// Where a return frame of `frame_len` bytes goes below `rsp` (past the
/// red zone), when `rsp` is on a thread stack with room for it: the main
/// stack, or an anonymous mapping right above a small guard page (a
/// pthread's, a fiber's). Everything below the stack pointer of such a
/// stack down to its guard is free. Not a goroutine's stack in Go's heap,
/// whose neighbours below are live stacks and objects (a frame written
/// there crashed FrankenPHP's garbage collector seconds later).
pub(crate) fn frame_top(rsp: u64, frame_len: u64, maps: &[Mapping]) -> Option<u64> {
    let top = rsp.checked_sub(128)?;
    let need = frame_len + 4096;
    let index = maps.iter().position(|m| m.contains(rsp))?;
    let mapping = &maps[index];
    let guarded = mapping.path == "[stack]"
        || (mapping.path.is_empty()
            && index
                .checked_sub(1)
                .and_then(|below| maps.get(below))
                .is_some_and(|below| {
                    below.end == mapping.start
                        && below.perms.starts_with("---")
                        && below.end - below.start <= MAX_GUARD
                }));
    (guarded && top.checked_sub(need)? >= mapping.start).then_some(top)
}

/// Stops a thread of `pid` that can be stopped safely; with `maps`, one
/// whose own stack has room for a return frame (the first mmap has no
/// other memory to put it in). Waits a moment for one if none is.
pub(crate) fn stop_a_thread(pid: u32, maps: Option<&[Mapping]>) -> Result<StoppedThread> {
    let deadline = Instant::now() + PICK_WAIT;
    loop {
        for tid in candidates(pid)? {
            let thread = match StoppedThread::stop(tid) {
                Ok(thread) => thread,
                Err(error) if Instant::now() > deadline => return Err(error),
                Err(_) => continue,
            };
            if maps.is_none_or(|maps| thread.stack_top(maps).is_some()) {
                return Ok(thread);
            }
            thread.release()?;
        }
        if !crate::probe::target::is_alive(pid) {
            return Err(NoThread {
                pid,
                why: Unavailable::Exited,
            }
            .into());
        }
        if Instant::now() > deadline {
            return Err(NoThread {
                pid,
                why: Unavailable::Busy,
            }
            .into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_ranked_by_what_a_stop_does_to_them() {
        assert_eq!(fit("running"), Fit::Running);
        assert_eq!(fit("-1 0x7ffd 0x7f00"), Fit::Running);
        assert_eq!(
            fit("202 0x7f00 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f00"),
            Fit::Restarts,
            "FUTEX_WAIT_PRIVATE"
        );
        assert_eq!(
            fit("202 0x7f00 0x189 0x0 0x0 0x0 0x0 0x7ffd 0x7f00"),
            Fit::Restarts,
            "FUTEX_WAIT_BITSET_PRIVATE|CLOCK_REALTIME"
        );
        assert_eq!(
            fit("202 0x7f00 0x81 0x0 0x0 0x0 0x0 0x7ffd 0x7f00"),
            Fit::Unsafe
        );
        assert_eq!(
            fit("232 0x4 0x7ffd 0x1 0x2710 0x0 0x0 0x7ffd 0x7f00"),
            Fit::RetrySafe
        );
        assert_eq!(fit("0 0x0 0x7ffd 0x80 0 0 0 0x7ffd 0x7f00"), Fit::RetrySafe);
        assert_eq!(fit("3 0x5 0 0 0 0 0 0x7ffd 0x7f00"), Fit::Unsafe, "close");
        assert_eq!(fit("35 0x7ffd 0 0 0 0 0 0x7ffd 0x7f00"), Fit::Restarts);
        assert!(Fit::Restarts < Fit::Running && Fit::Running < Fit::RetrySafe);
    }

    fn mapping(start: u64, end: u64, perms: &str, path: &str) -> Mapping {
        Mapping::made_up(start, end, perms, path)
    }

    /// FrankenPHP's maps (6.18, Go 1.25): a goroutine stack in Go's heap
    /// arena (40 MiB reserved `---p` below its `rw-p` part) is no place for
    /// a frame; a pthread's stack (one guard page below) and the main
    /// stack are.
    #[test]
    fn frames_go_only_on_thread_stacks_never_in_gos_heap() {
        let maps = [
            mapping(0x334b_1400_0000, 0x334b_1680_0000, "---p", ""),
            mapping(0x334b_1680_0000, 0x334b_1700_0000, "rw-p", ""),
            mapping(0x7fc7_ae7f_5000, 0x7fc7_ae7f_6000, "---p", ""),
            mapping(0x7fc7_ae7f_6000, 0x7fc7_aeff_6000, "rw-p", ""),
            mapping(0x7fc7_b000_0000, 0x7fc7_b001_0000, "---p", ""),
            mapping(
                0x7fc7_b001_0000,
                0x7fc7_b002_0000,
                "rw-p",
                "/memfd:x (deleted)",
            ),
            mapping(0x7ffd_0000_0000, 0x7ffd_0080_0000, "rw-p", "[stack]"),
        ];
        let frame = 3000;
        // A goroutine in a syscall: its stack pointer in the Go heap.
        assert_eq!(frame_top(0x334b_16a0_1f00, frame, &maps), None);
        // A pthread, well inside its 8 MiB stack.
        assert_eq!(
            frame_top(0x7fc7_aeff_0000, frame, &maps),
            Some(0x7fc7_aeff_0000 - 128)
        );
        // The same, too near its guard for the frame.
        assert_eq!(frame_top(0x7fc7_ae7f_6800, frame, &maps), None);
        // A file mapping above a guard is not a stack.
        assert_eq!(frame_top(0x7fc7_b001_8000, frame, &maps), None);
        assert_eq!(
            frame_top(0x7ffd_0070_0000, frame, &maps),
            Some(0x7ffd_0070_0000 - 128)
        );
    }
}
