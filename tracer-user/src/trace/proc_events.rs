//! Watches the target for exec and fork while it is traced, through the
//! kernel's process events connector (netlink, root): an exec replaces the
//! program the probes were placed in, and forked children are not traced,
//! so the report must say both. Without the connector, an exec is still
//! noticed by polling the target's executable (a short-lived exec'ed
//! program may then be missed; forks are then unknown).
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
pub struct Exec {
    pub at: Instant,
    /// The new program, when /proc still showed it.
    pub exe: Option<String>,
    /// Probed modules (target paths) the new program was seen mapping.
    pub still_probed: Vec<String>,
}

/// What the watcher saw.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub exec: Option<Exec>,
    /// Processes the target forked (None without the connector).
    pub forks: Option<u64>,
}

pub struct ProcWatch {
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
    pub fn start(pid: u32, probed: &[(String, std::path::PathBuf)]) -> ProcWatch {
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
    pub fn finish(mut self) -> Seen {
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
    let connector = Connector::open();
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
        match &connector {
            Some(connector) => {
                for event in connector.receive() {
                    match event {
                        Event::Exec { tgid } if tgid == pid => exec_now = true,
                        Event::Fork {
                            parent_tgid,
                            child_pid,
                            child_tgid,
                        } if parent_tgid == pid && child_pid == child_tgid => {
                            *seen.forks.get_or_insert(0) += 1;
                        }
                        _ => {}
                    }
                }
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
    seen
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

enum Event {
    Exec {
        tgid: u32,
    },
    Fork {
        parent_tgid: u32,
        child_pid: u32,
        child_tgid: u32,
    },
}

/// A netlink socket subscribed to the process events connector.
struct Connector {
    fd: std::os::fd::OwnedFd,
}

// linux/connector.h and linux/cn_proc.h
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_FORK: u32 = 1;
const PROC_EVENT_EXEC: u32 = 2;
const NLMSG_HEADER: usize = 16;
const CN_MSG_HEADER: usize = 20;

impl Connector {
    fn open() -> Option<Connector> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket(2); the descriptor is owned from here on.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_CONNECTOR,
            )
        };
        if raw < 0 {
            return None;
        }
        // SAFETY: raw is a fresh descriptor nobody else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let connector = Connector { fd };
        connector.subscribe().then_some(connector)
    }

    fn raw(&self) -> libc::c_int {
        use std::os::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    fn subscribe(&self) -> bool {
        // SAFETY: a zeroed sockaddr_nl is valid; the calls get correct sizes.
        unsafe {
            let mut address: libc::sockaddr_nl = std::mem::zeroed();
            address.nl_family = libc::AF_NETLINK as u16;
            address.nl_groups = CN_IDX_PROC;
            if libc::bind(
                self.raw(),
                &address as *const libc::sockaddr_nl as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            ) != 0
            {
                return false;
            }
            let timeout = libc::timeval {
                tv_sec: 0,
                tv_usec: TICK.as_micros() as libc::suseconds_t,
            };
            libc::setsockopt(
                self.raw(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &timeout as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            );
        }
        let mut message = Vec::with_capacity(NLMSG_HEADER + CN_MSG_HEADER + 4);
        let length = (NLMSG_HEADER + CN_MSG_HEADER + 4) as u32;
        message.extend(length.to_ne_bytes());
        message.extend((libc::NLMSG_DONE as u16).to_ne_bytes());
        message.extend(0u16.to_ne_bytes()); // flags
        message.extend(0u32.to_ne_bytes()); // seq
        message.extend(std::process::id().to_ne_bytes());
        message.extend(CN_IDX_PROC.to_ne_bytes());
        message.extend(CN_VAL_PROC.to_ne_bytes());
        message.extend(0u32.to_ne_bytes()); // seq
        message.extend(0u32.to_ne_bytes()); // ack
        message.extend(4u16.to_ne_bytes()); // len
        message.extend(0u16.to_ne_bytes()); // flags
        message.extend(PROC_CN_MCAST_LISTEN.to_ne_bytes());
        // SAFETY: the buffer is valid for its length.
        let sent = unsafe {
            libc::send(
                self.raw(),
                message.as_ptr() as *const libc::c_void,
                message.len(),
                0,
            )
        };
        sent == message.len() as isize
    }

    /// The events of one datagram (none after the receive timeout).
    fn receive(&self) -> Vec<Event> {
        let mut buffer = [0u8; 8192];
        // SAFETY: the buffer is valid for its length.
        let n = unsafe {
            libc::recv(
                self.raw(),
                buffer.as_mut_ptr() as *mut libc::c_void,
                buffer.len(),
                0,
            )
        };
        let Ok(n) = usize::try_from(n) else {
            return Vec::new();
        };
        parse(&buffer[..n])
    }
}

/// The exec and fork events in a datagram of netlink messages.
fn parse(mut data: &[u8]) -> Vec<Event> {
    let u32_at = |bytes: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let mut events = Vec::new();
    while let Some(length) = u32_at(data, 0) {
        let length = length as usize;
        if length < NLMSG_HEADER || length > data.len() {
            break;
        }
        let message = &data[..length];
        // proc_event: what, cpu, timestamp_ns, then the event's data.
        let event = NLMSG_HEADER + CN_MSG_HEADER;
        let field = |i: usize| u32_at(message, event + 16 + 4 * i);
        match u32_at(message, event) {
            Some(PROC_EVENT_EXEC) => {
                if let Some(tgid) = field(1) {
                    events.push(Event::Exec { tgid });
                }
            }
            Some(PROC_EVENT_FORK) => {
                if let (Some(parent_tgid), Some(child_pid), Some(child_tgid)) =
                    (field(1), field(2), field(3))
                {
                    events.push(Event::Fork {
                        parent_tgid,
                        child_pid,
                        child_tgid,
                    });
                }
            }
            _ => {}
        }
        data = data.get((length + 3) & !3..).unwrap_or_default();
    }
    events
}
