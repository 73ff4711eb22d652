//! Attaching on a loaded machine. The kernel shares a CPU among runnable
//! threads, so with thousands of them in locktrace's own session (where
//! autogroup does not shield it) attaching took over 30 s (issue 36).
//! From the start of a command until its probes are live, locktrace's
//! threads run real-time (SCHED_FIFO, the lowest priority): that setup
//! takes well under a second of CPU, and the kernel's real-time throttling
//! leaves 5% to everything else even then. Once live they drop back, so
//! counting never outranks the target; so does the load driver's warmup
//! (`--load`), which runs between two setup steps. A stop signal raises
//! them again until exit ([`begin_teardown`]): nothing is counted any more,
//! and under 200 spinning threads the report came 1.4-3.1 s after SIGTERM
//! at normal priority (0.1-1.2 s raised), the probes' detach took 12-18 s
//! (5 s raised).
use std::sync::{
    Mutex,
    atomic::{AtomicBool, Ordering},
};

/// The policy the threads had before [`begin_setup`], while they are raised.
static RAISED_FROM: Mutex<Option<(libc::c_int, libc::sched_param)>> = Mutex::new(None);

/// Set by [`begin_teardown`]: the threads stay raised until exit.
static TEARING_DOWN: AtomicBool = AtomicBool::new(false);

/// A stop signal came: raises every thread as [`begin_setup`] does, for
/// good (a setup step that ends later leaves them raised).
pub(crate) fn begin_teardown() {
    TEARING_DOWN.store(true, Ordering::Relaxed);
    begin_setup();
}

/// Raises every thread of this process to real-time (nothing happens
/// where the kernel refuses it: without CAP_SYS_NICE, or in a cgroup
/// without real-time budget).
pub(crate) fn begin_setup() {
    let Ok(mut raised) = RAISED_FROM.lock() else {
        return;
    };
    if raised.is_some() {
        return;
    }
    // SAFETY: pid 0 is the calling thread; the calls only read its policy
    // through a valid pointer.
    let previous = unsafe {
        let policy = libc::sched_getscheduler(0);
        let mut param: libc::sched_param = std::mem::zeroed();
        if policy < 0 || libc::sched_getparam(0, &mut param) != 0 {
            return;
        }
        (policy, param)
    };
    if previous.0 == libc::SCHED_FIFO || previous.0 == libc::SCHED_RR {
        return;
    }
    let urgent = libc::sched_param { sched_priority: 1 };
    if set_every_thread(libc::SCHED_FIFO, &urgent) {
        *raised = Some(previous);
    }
}

/// Puts every thread back (also those started during the setup, which
/// inherited real-time): the probes are live.
pub(crate) fn end_setup() {
    if TEARING_DOWN.load(Ordering::Relaxed) {
        return;
    }
    let Ok(mut raised) = RAISED_FROM.lock() else {
        return;
    };
    if let Some((policy, param)) = raised.take() {
        set_every_thread(policy, &param);
    }
}

/// Sets `policy` on each thread of this process; true when the kernel
/// allowed it for the calling thread.
fn set_every_thread(policy: libc::c_int, param: &libc::sched_param) -> bool {
    // SAFETY: as in `begin_setup`: a valid param, the calling thread.
    if unsafe { libc::sched_setscheduler(0, policy, param) } != 0 {
        return false;
    }
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return true;
    };
    for task in tasks.flatten() {
        if let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) {
            // SAFETY: `tid` is a thread of this process (or one that just
            // exited: the call then fails harmlessly).
            unsafe { libc::sched_setscheduler(tid, policy, param) };
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real-time during the setup (as root), the old policy after it.
    #[test]
    fn the_setup_runs_real_time_and_ends_as_before() {
        // SAFETY: reads the calling thread's policy.
        let policy = || unsafe { libc::sched_getscheduler(0) };
        let before = policy();
        begin_setup();
        let raised = RAISED_FROM.lock().unwrap().is_some();
        assert_eq!(policy(), if raised { libc::SCHED_FIFO } else { before });
        end_setup();
        assert_eq!(policy(), before);
        assert!(RAISED_FROM.lock().unwrap().is_none());
    }
}
