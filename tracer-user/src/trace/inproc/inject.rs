//! Running a few instructions inside the target, through ptrace: one of
//! its threads is stopped, made to execute a syscall (mmap, mprotect) or
//! the patcher, and put back exactly as it was. The one place that
//! ptraces.
//!
//! A thread stopped inside a syscall (a futex wait, epoll) resumes it as
//! if nothing happened: the injected registers carry `orig_rax = -1`, so
//! the kernel does not restart anything at our instruction, and the saved
//! registers, set back at a stop inside the signal path, let the kernel
//! restart the interrupted syscall as it would after a signal. Signals
//! that arrive meanwhile are kept and delivered when the thread is let go.
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use nix::{
    errno::Errno,
    sys::{
        ptrace,
        signal::Signal,
        wait::{WaitPidFlag, WaitStatus, waitpid},
    },
    unistd::Pid,
};

/// How long a thread may take to stop, or to run what it was given.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// A thread of the target, stopped under ptrace.
pub struct StoppedThread {
    tid: Pid,
    saved: libc::user_regs_struct,
    /// A signal that arrived while the thread was ours, delivered at the end.
    pending: Option<Signal>,
    released: bool,
}

/// How a thread came to a stop.
enum Stop {
    Trap,
    Other,
}

impl StoppedThread {
    /// Seizes and stops thread `tid`.
    pub fn stop(tid: u32) -> Result<StoppedThread> {
        let pid = Pid::from_raw(tid as i32);
        ptrace::seize(pid, ptrace::Options::empty()).map_err(|errno| match errno {
            Errno::EPERM => anyhow!(
                "cannot ptrace thread {tid}: another tracer holds it or ptrace is restricted (kernel.yama.ptrace_scope); detach the other tool or use --mode all"
            ),
            other => anyhow!("cannot ptrace thread {tid}: {other}; use --mode all"),
        })?;
        let mut thread = StoppedThread {
            tid: pid,
            // SAFETY: a plain C struct of integers; zero is a valid value.
            saved: unsafe { std::mem::zeroed() },
            pending: None,
            released: false,
        };
        ptrace::interrupt(pid).with_context(|| format!("stopping thread {tid}"))?;
        thread.wait()?;
        thread.saved =
            ptrace::getregs(pid).with_context(|| format!("reading thread {tid}'s registers"))?;
        Ok(thread)
    }

    /// Executes the syscall `number` with `args` at `instruction` (the
    /// address of a `syscall` instruction in the target); returns its
    /// result (a negative errno on failure).
    pub fn syscall(&mut self, instruction: u64, number: u64, args: [u64; 6]) -> Result<i64> {
        let mut regs = self.saved;
        regs.rip = instruction;
        regs.rax = number;
        regs.orig_rax = u64::MAX;
        regs.rdi = args[0];
        regs.rsi = args[1];
        regs.rdx = args[2];
        regs.r10 = args[3];
        regs.r8 = args[4];
        regs.r9 = args[5];
        ptrace::setregs(self.tid, regs).context("setting registers for a syscall")?;
        let deadline = Instant::now() + STOP_WAIT;
        loop {
            ptrace::step(self.tid, None).context("stepping the injected syscall")?;
            self.wait()?;
            let now = ptrace::getregs(self.tid).context("reading registers")?;
            if now.rip == instruction + 2 {
                return Ok(now.rax as i64);
            }
            if now.rip != instruction || Instant::now() > deadline {
                bail!(
                    "the injected syscall did not run (thread {} at {:#x})",
                    self.tid,
                    now.rip
                );
            }
        }
    }

    /// Runs the code at `entry` with `rdi`/`rsi` until it traps (`int3`)
    /// between `entry` and `end`. The code uses no stack.
    pub fn run(&mut self, entry: u64, end: u64, rdi: u64, rsi: u64) -> Result<()> {
        let mut regs = self.saved;
        regs.rip = entry;
        regs.orig_rax = u64::MAX;
        regs.rdi = rdi;
        regs.rsi = rsi;
        // Below the red zone, aligned, though nothing is pushed.
        regs.rsp = (self.saved.rsp - 1024) & !15;
        ptrace::setregs(self.tid, regs).context("setting registers for the patcher")?;
        let deadline = Instant::now() + STOP_WAIT;
        loop {
            ptrace::cont(self.tid, None).context("running the patcher")?;
            let stop = self.wait()?;
            let now = ptrace::getregs(self.tid).context("reading registers")?;
            if matches!(stop, Stop::Trap) && (entry..=end).contains(&now.rip) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the patcher did not finish (thread {} at {:#x})",
                    self.tid,
                    now.rip
                );
            }
        }
    }

    /// Puts the thread's registers back and lets it go, with any signal
    /// that came meanwhile.
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        ptrace::setregs(self.tid, self.saved).context("restoring the thread's registers")?;
        ptrace::detach(self.tid, self.pending).context("detaching from the thread")
    }

    /// Waits for the thread's next stop; a signal stop keeps the signal
    /// for the end.
    fn wait(&mut self) -> Result<Stop> {
        let deadline = Instant::now() + STOP_WAIT;
        loop {
            let status = waitpid(self.tid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG))
                .with_context(|| format!("waiting for thread {}", self.tid))?;
            match status {
                WaitStatus::StillAlive => {
                    if Instant::now() > deadline {
                        bail!(
                            "thread {} did not stop within {} s (stuck in the kernel?); nothing was written into the target",
                            self.tid,
                            STOP_WAIT.as_secs()
                        );
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                WaitStatus::Stopped(_, Signal::SIGTRAP) => return Ok(Stop::Trap),
                WaitStatus::Stopped(_, signal) => {
                    self.pending = Some(signal);
                    return Ok(Stop::Other);
                }
                WaitStatus::PtraceEvent(..) | WaitStatus::PtraceSyscall(_) => {
                    return Ok(Stop::Other);
                }
                WaitStatus::Exited(..) | WaitStatus::Signaled(..) => {
                    self.released = true;
                    bail!(
                        "thread {} exited while locktrace was writing into the process",
                        self.tid
                    )
                }
                WaitStatus::Continued(_) => {}
            }
        }
    }
}

impl Drop for StoppedThread {
    /// On an error path: the thread goes back as it was.
    fn drop(&mut self) {
        if !self.released {
            let _ = ptrace::setregs(self.tid, self.saved);
            let _ = ptrace::detach(self.tid, self.pending);
        }
    }
}

/// The target's threads that another tracer holds (`TracerPid`).
pub fn traced_threads(pid: u32) -> Vec<(u32, u32)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let tid: u32 = task.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
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

/// A live thread of the target to run injected code in (the main thread
/// when it runs), and whether the process is stopped (`T`).
pub fn pick_thread(pid: u32) -> Result<u32> {
    let state = |tid: u32| -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
        stat.rsplit_once(')')?.1.trim_start().chars().next()
    };
    if state(pid) == Some('T') {
        bail!(
            "process {pid} is stopped (SIGSTOP); continue it (kill -CONT {pid}) before --mode inproc"
        );
    }
    if matches!(state(pid), Some(c) if c != 'Z' && c != 'X') {
        return Ok(pid);
    }
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("listing process {pid}'s threads"))?;
    tasks
        .flatten()
        .filter_map(|task| task.file_name().to_str()?.parse::<u32>().ok())
        .find(|&tid| matches!(state(tid), Some(c) if c != 'Z' && c != 'X'))
        .ok_or_else(|| anyhow!("process {pid} has no live thread to write through"))
}
