//! The kernel's process events connector (netlink `NETLINK_CONNECTOR`,
//! group `CN_IDX_PROC`): an event as each process forks, execs or exits.
//! `record` watches its target's exec and forks with it
//! (in proc_events.rs); the agent judges each new process as it
//! execs instead of at its next /proc scan. Messages can be lost
//! ([`Events::Lost`]: the socket overflowed), and the connector needs
//! CAP_NET_ADMIN in the host's network namespace: each user keeps a poll
//! of /proc as its safety net and fallback.
//!
//! The parser reads byte buffers only (tested without a socket); the
//! socket is a few libc calls.
use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

/// `CN_IDX_PROC` and `CN_VAL_PROC` (linux/connector.h).
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
/// `PROC_CN_MCAST_LISTEN` (linux/cn_proc.h).
const PROC_CN_MCAST_LISTEN: u32 = 1;
/// `enum what` values of `struct proc_event` (linux/cn_proc.h).
const PROC_EVENT_FORK: u32 = 0x0000_0001;
const PROC_EVENT_EXEC: u32 = 0x0000_0002;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
/// `struct nlmsghdr` and `struct cn_msg` sizes.
const NLMSG_HEADER: usize = 16;
const CN_MSG_HEADER: usize = 20;
/// `struct proc_event` up to its `event_data`: what, cpu, timestamp_ns.
const PROC_EVENT_HEADER: usize = 16;
/// Room for bursts of fork/exec/exit events between two reads (the kernel
/// doubles it); beyond it messages are lost and a scan catches up.
const RECEIVE_BUFFER: libc::c_int = 4 << 20;

/// What a task did (`tgid`: its process's id, `pid`: the task's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    Exec {
        tgid: u32,
    },
    /// A new thread (`child_pid != child_tgid`) or process.
    Fork {
        parent_tgid: u32,
        child_pid: u32,
        child_tgid: u32,
    },
    /// A task ended: its process ended when `pid == tgid` (its leader).
    /// `exit_code`: the task's wait status (`task->exit_code`).
    Exit {
        pid: u32,
        tgid: u32,
        exit_code: u32,
    },
}

/// What one read of the socket brought.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Events {
    Some(Vec<Event>),
    /// The kernel dropped messages (`ENOBUFS`): scan /proc now.
    Lost,
}

/// The events in one datagram: every netlink message in it that is a
/// proc connector message; other messages and event kinds are skipped.
/// Truncated messages end the parse (no panic on any input).
pub(crate) fn parse(mut datagram: &[u8]) -> Vec<Event> {
    let mut events = Vec::new();
    while datagram.len() >= NLMSG_HEADER {
        let length = u32_at(datagram, 0).unwrap_or(0) as usize;
        if length < NLMSG_HEADER || length > datagram.len() {
            break;
        }
        if let Some(event) = connector_event(&datagram[NLMSG_HEADER..length]) {
            events.push(event);
        }
        // Messages are aligned to 4 bytes (NLMSG_ALIGN).
        let next = (length + 3) & !3;
        datagram = datagram.get(next..).unwrap_or(&[]);
    }
    events
}

/// The fork, exec or exit event in a `cn_msg` (after the netlink header).
fn connector_event(message: &[u8]) -> Option<Event> {
    let (index, value) = (u32_at(message, 0)?, u32_at(message, 4)?);
    if (index, value) != (CN_IDX_PROC, CN_VAL_PROC) {
        return None;
    }
    let length = usize::from(u16::from_ne_bytes(message.get(16..18)?.try_into().ok()?));
    let event = message.get(CN_MSG_HEADER..CN_MSG_HEADER + length)?;
    // The event's data: exec's and exit's begin with process_pid and
    // process_tgid (exit's then exit_code); fork's are parent_pid,
    // parent_tgid, child_pid, child_tgid.
    let field = |i: usize| u32_at(event, PROC_EVENT_HEADER + 4 * i);
    match u32_at(event, 0)? {
        PROC_EVENT_EXEC => Some(Event::Exec { tgid: field(1)? }),
        PROC_EVENT_EXIT => Some(Event::Exit {
            pid: field(0)?,
            tgid: field(1)?,
            exit_code: field(2)?,
        }),
        PROC_EVENT_FORK => Some(Event::Fork {
            parent_tgid: field(1)?,
            child_pid: field(2)?,
            child_tgid: field(3)?,
        }),
        _ => None,
    }
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// Accepts a message whose event is an exec, or an exit whose task is its
/// process's leader (`process_pid == process_tgid`); drops the rest.
/// Absolute loads read big-endian: the constants are compared as such.
fn exec_and_exit_filter() -> [libc::sock_filter; 9] {
    let what = (NLMSG_HEADER + CN_MSG_HEADER) as u32;
    let data = what + PROC_EVENT_HEADER as u32;
    let as_loaded = |value: u32| u32::from_be_bytes(value.to_ne_bytes());
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    // BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K or |BPF_X, BPF_MISC|BPF_TAX, BPF_RET|BPF_K.
    let (load, equal_k, equal_x, to_x, ret) = (0x20, 0x15, 0x1d, 0x07, 0x06);
    [
        op(load, 0, 0, what),
        op(equal_k, 5, 0, as_loaded(PROC_EVENT_EXEC)),
        op(equal_k, 0, 5, as_loaded(PROC_EVENT_EXIT)),
        op(load, 0, 0, data),
        op(to_x, 0, 0, 0),
        op(load, 0, 0, data + 4),
        op(equal_x, 0, 1, 0),
        op(ret, 0, 0, u32::MAX),
        op(ret, 0, 0, 0),
    ]
}

/// The `PROC_CN_MCAST_LISTEN` request: netlink header, `cn_msg`, the op.
fn listen_request(port: u32) -> Vec<u8> {
    let length = (NLMSG_HEADER + CN_MSG_HEADER + 4) as u32;
    let mut request = Vec::with_capacity(length as usize);
    request.extend(length.to_ne_bytes());
    request.extend((libc::NLMSG_DONE as u16).to_ne_bytes());
    request.extend(0u16.to_ne_bytes()); // flags
    request.extend(0u32.to_ne_bytes()); // seq
    request.extend(port.to_ne_bytes());
    request.extend(CN_IDX_PROC.to_ne_bytes());
    request.extend(CN_VAL_PROC.to_ne_bytes());
    request.extend(0u32.to_ne_bytes()); // seq
    request.extend(0u32.to_ne_bytes()); // ack
    request.extend(4u16.to_ne_bytes()); // len
    request.extend(0u16.to_ne_bytes()); // flags
    request.extend(PROC_CN_MCAST_LISTEN.to_ne_bytes());
    request
}

/// A socket subscribed to the process events connector.
pub(crate) struct Connector {
    socket: OwnedFd,
    buffer: Vec<u8>,
}

impl Connector {
    /// Subscribes; the error says why not (the caller falls back to scanning).
    pub(crate) fn open() -> io::Result<Connector> {
        // SAFETY: plain socket(2); the fd is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_CONNECTOR,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by socket(2) and is owned by nothing else.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // A failure here only means a smaller buffer: more rescans.
        let size = RECEIVE_BUFFER;
        // SAFETY: setsockopt with a c_int option value of the right size.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&raw const size).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        // SAFETY: an all-zero sockaddr_nl is valid; the fields are set next.
        let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        address.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        address.nl_groups = CN_IDX_PROC;
        // SAFETY: bind with a sockaddr_nl of its own size.
        let bound = unsafe {
            libc::bind(
                fd,
                (&raw const address).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if bound < 0 {
            return Err(io::Error::last_os_error());
        }
        let request = listen_request(std::process::id());
        // SAFETY: send of a buffer with its length.
        let sent = unsafe { libc::send(fd, request.as_ptr().cast(), request.len(), 0) };
        if sent != request.len() as isize {
            return Err(io::Error::last_os_error());
        }
        Ok(Connector {
            socket,
            buffer: vec![0; 64 * 1024],
        })
    }

    /// From now on only exec events and processes' ends (a leader's exit)
    /// reach the socket: a classic BPF filter drops the rest in the
    /// kernel, so a machine busy starting threads does not wake the reader.
    pub(crate) fn only_execs_and_process_exits(&self) -> io::Result<()> {
        let program = exec_and_exit_filter();
        let fprog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_ptr().cast_mut(),
        };
        // SAFETY: setsockopt with a sock_fprog whose program outlives the call
        // (the kernel copies it).
        let set = unsafe {
            libc::setsockopt(
                self.socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                (&raw const fprog).cast(),
                size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        match set {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// The events that came within `wait` (none when it passed quietly).
    pub(crate) fn wait(&mut self, wait: Duration) -> io::Result<Events> {
        let fd = self.socket.as_raw_fd();
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = wait.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one pollfd, its count, a timeout.
        if unsafe { libc::poll(&raw mut poll, 1, millis) } < 0 {
            let error = io::Error::last_os_error();
            return match error.kind() {
                io::ErrorKind::Interrupted => Ok(Events::Some(Vec::new())),
                _ => Err(error),
            };
        }
        let mut events = Vec::new();
        loop {
            // SAFETY: an all-zero sockaddr_nl is valid; recvfrom fills it.
            let mut from: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            let mut from_length = size_of::<libc::sockaddr_nl>() as libc::socklen_t;
            // SAFETY: recvfrom into our buffer with its length, and the sender's address.
            let read = unsafe {
                libc::recvfrom(
                    fd,
                    self.buffer.as_mut_ptr().cast(),
                    self.buffer.len(),
                    0,
                    (&raw mut from).cast(),
                    &raw mut from_length,
                )
            };
            if read < 0 {
                let error = io::Error::last_os_error();
                return match error.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(Events::Some(events)),
                    Some(libc::EINTR) => Ok(Events::Some(events)),
                    Some(libc::ENOBUFS) => Ok(Events::Lost),
                    _ => Err(error),
                };
            }
            // Only the kernel (port 0) speaks for processes.
            if from.nl_pid == 0 {
                events.extend(parse(&self.buffer[..read as usize]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A netlink message holding a proc connector event.
    fn message(what: u32, fields: &[u32]) -> Vec<u8> {
        let mut event = Vec::new();
        event.extend(what.to_ne_bytes());
        event.extend(1u32.to_ne_bytes()); // cpu
        event.extend(123u64.to_ne_bytes()); // timestamp_ns
        for field in fields {
            event.extend(field.to_ne_bytes());
        }
        let mut message = Vec::new();
        let length = (NLMSG_HEADER + CN_MSG_HEADER + event.len()) as u32;
        message.extend(length.to_ne_bytes());
        message.extend((libc::NLMSG_DONE as u16).to_ne_bytes());
        message.extend([0u8; 2 + 4 + 4]);
        message.extend(CN_IDX_PROC.to_ne_bytes());
        message.extend(CN_VAL_PROC.to_ne_bytes());
        message.extend([0u8; 8]);
        message.extend((event.len() as u16).to_ne_bytes());
        message.extend([0u8; 2]);
        message.extend(event);
        message
    }

    #[test]
    fn fork_exec_and_exit_events_are_read() {
        assert_eq!(
            parse(&message(PROC_EVENT_EXEC, &[41, 40])),
            [Event::Exec { tgid: 40 }]
        );
        // exit_code, exit_signal, parent_pid, parent_tgid follow.
        assert_eq!(
            parse(&message(PROC_EVENT_EXIT, &[41, 40, 11 | 0x80, 17, 1, 1])),
            [Event::Exit {
                pid: 41,
                tgid: 40,
                exit_code: 11 | 0x80
            }]
        );
        assert_eq!(
            parse(&message(PROC_EVENT_FORK, &[40, 40, 52, 52])),
            [Event::Fork {
                parent_tgid: 40,
                child_pid: 52,
                child_tgid: 52
            }]
        );
        // Other kinds (uid changes: 0x4) are not events here.
        assert_eq!(parse(&message(0x4, &[50, 50, 0, 0])), []);
        let mut two = message(PROC_EVENT_EXEC, &[7, 7]);
        two.extend(message(PROC_EVENT_EXIT, &[8, 8, 0, 0, 1, 1]));
        assert_eq!(
            parse(&two),
            [
                Event::Exec { tgid: 7 },
                Event::Exit {
                    pid: 8,
                    tgid: 8,
                    exit_code: 0
                }
            ]
        );
    }

    #[test]
    fn other_connectors_and_cut_messages_are_skipped() {
        let mut other = message(PROC_EVENT_EXEC, &[7, 7]);
        other[NLMSG_HEADER..NLMSG_HEADER + 4].copy_from_slice(&2u32.to_ne_bytes());
        assert_eq!(parse(&other), []);
        let whole = message(PROC_EVENT_EXEC, &[7, 7]);
        for cut in 0..whole.len() {
            assert_eq!(parse(&whole[..cut]), [], "cut at {cut}");
        }
        // A length field longer than the data, or shorter than a header.
        let mut lying = whole.clone();
        lying[0..4].copy_from_slice(&4u32.to_ne_bytes());
        assert_eq!(parse(&lying), []);
        let mut short = whole;
        short[NLMSG_HEADER + 16..NLMSG_HEADER + 18].copy_from_slice(&200u16.to_ne_bytes());
        assert_eq!(parse(&short), []);
    }

    #[test]
    fn the_listen_request_is_a_connector_message_with_the_op() {
        let request = listen_request(99);
        assert_eq!(request.len(), 40);
        assert_eq!(u32_at(&request, 0), Some(40));
        assert_eq!(u32_at(&request, 12), Some(99));
        assert_eq!(u32_at(&request, 16), Some(CN_IDX_PROC));
        assert_eq!(&request[32..34], 4u16.to_ne_bytes());
        assert_eq!(u32_at(&request, 36), Some(PROC_CN_MCAST_LISTEN));
    }
}
