//! Watches the target for exec and fork while it is traced, through the
//! kernel's process events connector (netlink, root): an exec replaces the
//! program the probes were placed in, and forked children are not traced,
//! so the report must say both. Without the connector, an exec is still
//! noticed by polling the target's executable (a short-lived exec'ed
//! program may then be missed; forks are then unknown).
use super::proc_connector::{Connector, Event, Events};
use crate::model::TargetExit;
use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// The first exec of the target seen while watching.
#[derive(Debug, Clone)]
pub(crate) struct Exec {
    pub at: Instant,
    /// The new program, when /proc still showed it.
    pub exe: Option<String>,
    /// Probed modules (target paths) the new program was seen mapping.
    pub still_probed: Vec<String>,
}

/// What the watcher saw.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    pub exec: Option<Exec>,
    /// Processes the target forked (None without the connector).
    pub forks: Option<u64>,
    /// How the target ended, when it ended while watched (connector only).
    pub exit: Option<TargetExit>,
}

pub(crate) struct ProcWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Seen>>,
}

/// How often the watcher wakes up without events (to check the stop flag and poll).
const TICK: Duration = Duration::from_millis(50);
/// How often the executable is polled while the connector reports execs (it
/// only covers a socket overflow); 100 stat calls a second cost ~0.2 % of a CPU.
const EXE_POLL_WITH_CONNECTOR: Duration = Duration::from_millis(500);

impl ProcWatch {
    /// Starts watching `pid`; `probed` are the target paths and host paths of
    /// the modules holding the probed lock functions.
    pub(crate) fn start(pid: u32, probed: &[(String, std::path::PathBuf)]) -> ProcWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let inodes: BTreeMap<u64, String> = probed
            .iter()
            .filter_map(|(module, host)| {
                Some((std::fs::metadata(host).ok()?.ino(), module.clone()))
            })
            .collect();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("locktrace-procwatch".into())
            .spawn(move || watch(pid, &inodes, &flag))
            .ok();
        ProcWatch { stop, thread }
    }

    /// Stops watching and returns what was seen.
    pub(crate) fn finish(mut self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for ProcWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn watch(pid: u32, probed: &BTreeMap<u64, String>, stop: &AtomicBool) -> Seen {
    let exe_inode = || {
        std::fs::metadata(format!(
            "/proc/{}/exe",
            crate::probe::target::proc_task(pid)
        ))
        .ok()
        .map(|m| (m.dev(), m.ino()))
    };
    let first_exe = exe_inode();
    let mut connector = Connector::open().ok();
    let mut seen = Seen {
        forks: connector.as_ref().map(|_| 0),
        ..Seen::default()
    };
    let mut last_poll = Instant::now();
    let exe_poll = if connector.is_some() {
        EXE_POLL_WITH_CONNECTOR
    } else {
        TICK
    };
    while !stop.load(Ordering::Relaxed) {
        let mut exec_now = false;
        match &mut connector {
            Some(connector) => {
                // Lost events (a socket overflow) are the poll's below.
                let events = match connector.wait(TICK) {
                    Ok(Events::Some(events)) => events,
                    Ok(Events::Lost) => Vec::new(),
                    Err(_) => {
                        std::thread::sleep(TICK);
                        Vec::new()
                    }
                };
                exec_now |= note_events(pid, events, &mut seen);
            }
            None => std::thread::sleep(TICK),
        }
        // Also without the connector, or when its socket overflowed
        // (ENOBUFS under a storm of events elsewhere): the executable changed.
        if last_poll.elapsed() >= exe_poll {
            last_poll = Instant::now();
            let now = exe_inode();
            // Unknown at the start (or gone at the exit) proves nothing.
            exec_now |= first_exe.is_some() && now.is_some() && now != first_exe;
        }
        if exec_now && seen.exec.is_none() {
            seen.exec = Some(Exec {
                at: Instant::now(),
                exe: std::fs::read_link(format!(
                    "/proc/{}/exe",
                    crate::probe::target::proc_task(pid)
                ))
                .ok()
                .map(|p| p.to_string_lossy().into_owned()),
                still_probed: Vec::new(),
            });
        }
        // The new program maps its libraries after the exec: keep looking.
        if let Some(exec) = seen.exec.as_mut() {
            for module in mapped_probed_modules(pid, probed) {
                if !exec.still_probed.contains(&module) {
                    exec.still_probed.push(module);
                }
            }
        }
    }
    // The exit event is queued before the target's pidfd tells the
    // recording it ended: read what came since the last wait.
    if let Some(Ok(Events::Some(events))) = connector.as_mut().map(|c| c.wait(Duration::ZERO)) {
        note_events(pid, events, &mut seen);
    }
    seen
}

/// Counts the target's forks and keeps how it ended; true when it ran exec.
fn note_events(pid: u32, events: Vec<Event>, seen: &mut Seen) -> bool {
    let mut exec = false;
    for event in events {
        match event {
            Event::Exec { tgid } if tgid == pid => exec = true,
            Event::Fork {
                parent_tgid,
                child_pid,
                child_tgid,
            } if parent_tgid == pid && child_pid == child_tgid => {
                *seen.forks.get_or_insert(0) += 1;
            }
            // The leader's exit carries the process's status (a group exit
            // gives every thread the group's code).
            Event::Exit {
                pid: task,
                tgid,
                exit_code,
            } if task == pid && tgid == pid => {
                seen.exit = Some(TargetExit::from_wait_status(exit_code));
            }
            _ => {}
        }
    }
    exec
}

/// Probed modules (by inode) the target maps now.
fn mapped_probed_modules(pid: u32, probed: &BTreeMap<u64, String>) -> Vec<String> {
    // Bytes, not text: one non-UTF-8 path must not hide every module.
    let Ok(maps) = std::fs::read(format!(
        "/proc/{}/maps",
        crate::probe::target::proc_task(pid)
    )) else {
        return Vec::new();
    };
    let maps = String::from_utf8_lossy(&maps);
    let mut found = Vec::new();
    for line in maps.lines() {
        let inode = line
            .split_whitespace()
            .nth(4)
            .and_then(|field| field.parse::<u64>().ok());
        if let Some(module) = inode.filter(|&i| i != 0).and_then(|i| probed.get(&i))
            && !found.contains(module)
        {
            found.push(module.clone());
        }
    }
    found
}
