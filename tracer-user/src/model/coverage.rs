//! What a recording covered beyond its counts: whether forked children were
//! followed, an exec of the target with what it left uncounted, and how
//! the target ended when it ended while traced.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `coverage` in JSON (absent in reports of older versions).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Coverage {
    /// Whether processes the target forked were traced too. Always false:
    /// a child is another process, its locks are not in the counts (trace
    /// its pid separately).
    pub children_followed: bool,
    /// Processes the target forked while traced (None: not watched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub children_forked: Option<u64>,
    /// The target ran exec while traced (the first exec seen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecSeen>,
    /// The main thread left (`pthread_exit`) while other threads ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_thread_exit: Option<MainThreadExit>,
    /// Lock functions of an executable without a symbol table, found by
    /// their code (a stripped static build).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found_by_code: Option<FoundByCode>,
    /// How the target ended, when it ended while traced and the process
    /// events connector told (it needs CAP_NET_ADMIN).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_exit: Option<TargetExit>,
}

/// How a process ended: its exit status, or the signal that killed it (a
/// crash shows as SIGSEGV, SIGBUS or SIGABRT; a stop as SIGTERM or SIGKILL).
/// Exactly one of `exit_code` and `signal` is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TargetExit {
    /// It called exit with this code (a Go program's fatal error exits with 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, by number and name (`SIGSEGV`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_name: Option<String>,
    /// The kernel wrote a core dump.
    #[serde(default)]
    pub core_dumped: bool,
}

impl TargetExit {
    /// From the kernel's `task->exit_code` (a wait status: the signal in
    /// the low 7 bits, 0x80 for a core dump, else the exit code << 8).
    pub fn from_wait_status(status: u32) -> TargetExit {
        let signal = (status & 0x7f) as i32;
        if signal == 0 {
            return TargetExit {
                exit_code: Some(((status >> 8) & 0xff) as i32),
                signal: None,
                signal_name: None,
                core_dumped: false,
            };
        }
        TargetExit {
            exit_code: None,
            signal: Some(signal),
            signal_name: Some(signal_name(signal)),
            core_dumped: status & 0x80 != 0,
        }
    }
}

impl std::fmt::Display for TargetExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.signal_name, self.exit_code) {
            (Some(name), _) => write!(f, "killed by {name}")?,
            (None, Some(code)) => write!(f, "exit status {code}")?,
            (None, None) => write!(f, "status unknown")?,
        }
        if self.core_dumped {
            write!(f, " (core dumped)")?;
        }
        Ok(())
    }
}

/// `SIGSEGV` for 11 (x86-64 and arm64 Linux numbers), `signal N` for any
/// other (a real-time signal).
fn signal_name(signal: i32) -> String {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    usize::try_from(signal - 1)
        .ok()
        .and_then(|at| NAMES.get(at))
        .map_or_else(|| format!("signal {signal}"), |name| name.to_string())
}

/// Lock functions found in a module by matching their code against a libc
/// archive: each occurs in the module exactly once, byte for byte apart
/// from the fields the static link fills in.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct FoundByCode {
    pub module: String,
    /// The libc archive whose code matched (the libc the module was built with).
    pub archive: String,
    /// The functions found, by name.
    pub functions: Vec<String>,
}

/// The kernel counts a uprobe's hits for the memory of the task it is
/// bound to, the main thread, and stops when that task exits. locktrace
/// notices at its next tick and binds the probes to a live thread: the
/// target's uprobe hits (lock calls, failed tries, condvar waits, request
/// boundaries) between `running_at_s` and `probes_moved_at_s` were not
/// counted. Futex waits (tracepoints) were.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct MainThreadExit {
    /// Seconds into the recording when the main thread was last seen running.
    pub running_at_s: f64,
    /// When its exit was noticed.
    pub noticed_at_s: f64,
    /// When the probes counted again, on `moved_to_thread`; None when they
    /// could not be moved (`not_moved` says why): nothing after
    /// `running_at_s` was counted then.
    #[serde(default)]
    pub probes_moved_at_s: Option<f64>,
    #[serde(default)]
    pub moved_to_thread: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_moved: Option<String>,
    /// Further moves (the thread moved to exited too), each with a gap of
    /// up to a tick and an attach.
    #[serde(default)]
    pub later_moves: u32,
}

/// An exec of the target during the recording: the probes stay on the old
/// program's lock functions, so from `after_s` on the counts miss what
/// `not_counted` says.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct ExecSeen {
    /// Seconds into the recording when the exec was seen.
    pub after_s: f64,
    /// The new program, when it could still be read.
    #[serde(default)]
    pub exe: Option<String>,
    pub not_counted: ExecLoss,
    /// Probed lock modules the new program mapped too (their lock calls were
    /// still counted after the exec).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub still_probed: Vec<String>,
}

/// What an exec left out of the counts from then on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecLoss {
    /// The new program mapped none of the probed lock modules (e.g. a static
    /// binary): none of its lock calls were counted. Its futex waits were,
    /// but their names come from the old program's memory map.
    AllLockCalls,
    /// The new program's lock calls through the probed modules were counted
    /// (`still_probed`); calls into any other lock functions were not.
    LockCallsOutsideProbedModules,
    /// No lock probes (contention mode): every futex wait was counted; only
    /// the names after the exec come from the old program's map.
    Nothing,
}

#[cfg(test)]
mod tests {
    use super::TargetExit;

    #[test]
    fn wait_statuses_read_as_exit_codes_and_signals() {
        assert_eq!(TargetExit::from_wait_status(2 << 8).exit_code, Some(2));
        assert_eq!(TargetExit::from_wait_status(0).to_string(), "exit status 0");
        assert_eq!(
            TargetExit::from_wait_status(11 | 0x80).to_string(),
            "killed by SIGSEGV (core dumped)"
        );
        assert_eq!(
            TargetExit::from_wait_status(9).to_string(),
            "killed by SIGKILL"
        );
        assert_eq!(
            TargetExit::from_wait_status(34).to_string(),
            "killed by signal 34"
        );
        assert_eq!(
            serde_json::to_value(TargetExit::from_wait_status(15)).unwrap(),
            serde_json::json!({"signal": 15, "signal_name": "SIGTERM", "core_dumped": false})
        );
    }
}
