//! Preconditions of the kernel side: privileges, uprobe support, and a
//! mounted tracefs (the syscall tracepoints are found there). Each failure is
//! one line that says what to do.
use std::path::Path;

use anyhow::{Result, bail};

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";
const UPROBE_PMU: &str = "/sys/bus/event_source/devices/uprobe/type";
const FUTEX_EVENT: &str = "events/syscalls/sys_enter_futex";

/// CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

pub(crate) fn check_privileges() -> Result<()> {
    let effective = procfs::process::Process::myself()
        .and_then(|me| me.status())
        .map_or(0, |status| status.capeff);
    let has = |cap: u32| effective & (1u64 << cap) != 0;
    if !(has(CAP_SYS_ADMIN) || has(CAP_BPF) && has(CAP_PERFMON)) {
        bail!(
            "locktrace needs root (or CAP_BPF and CAP_PERFMON) to load BPF programs; run it with sudo"
        );
    }
    Ok(())
}

pub(crate) fn check_uprobes() -> Result<()> {
    if !Path::new(UPROBE_PMU).exists() {
        bail!(
            "this kernel lacks uprobe support ({UPROBE_PMU} is missing); use a kernel built with CONFIG_UPROBE_EVENTS"
        );
    }
    Ok(())
}

/// Makes sure tracefs is mounted, mounting it if needed. Returns its path.
pub(crate) fn ensure_tracefs() -> Result<&'static str> {
    for dir in [TRACEFS, DEBUGFS_TRACING] {
        if Path::new(dir).join("events").is_dir() {
            return check_futex_events(dir);
        }
    }
    // Mounted but closed to this user (tracefs is mode 0700 by default): say
    // so, rather than try to mount it (which needs CAP_SYS_ADMIN) and blame
    // the mount.
    if let Some(mode) = unreadable_mount(TRACEFS) {
        bail!(
            "tracefs is mounted at {TRACEFS} but this user cannot read it (mode {mode:o}, owner uid {}); run locktrace as root, or let this user in: mount -o remount,mode=755 {TRACEFS} (or chown it to a group of this user)",
            owner(TRACEFS)
        );
    }
    let mounted = nix::mount::mount(
        Some("nodev"),
        TRACEFS,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    );
    if mounted.is_err() || !Path::new(TRACEFS).join("events").is_dir() {
        let error = mounted.err().map_or_else(
            || String::from("no events directory"),
            |e| e.desc().to_string(),
        );
        bail!(
            "tracefs is not mounted and mounting it failed ({error}); mount it with: mount -t tracefs nodev {TRACEFS}"
        );
    }
    check_futex_events(TRACEFS)
}

/// The mode of `dir` when it is a mounted tracefs whose `events` this
/// process may not read.
fn unreadable_mount(dir: &str) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let mounted = std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|line| {
            let mut fields = line.split_whitespace();
            fields.nth(1) == Some(dir) && fields.next() == Some("tracefs")
        });
    let denied = matches!(
        std::fs::read_dir(Path::new(dir).join("events")),
        Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied
    ) || matches!(
        std::fs::read_dir(dir),
        Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied
    );
    (mounted && denied)
        .then(|| std::fs::metadata(dir).ok().map(|m| m.mode() & 0o7777))
        .flatten()
}

fn owner(dir: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).map_or_else(|_| "?".into(), |m| m.uid().to_string())
}

/// Whether the kernel has the `syscalls:EVENT` tracepoint (tracefs
/// mounted by [`ensure_tracefs`] before).
pub(crate) fn has_syscall_tracepoint(event: &str) -> bool {
    [TRACEFS, DEBUGFS_TRACING]
        .iter()
        .any(|dir| Path::new(dir).join("events/syscalls").join(event).is_dir())
}

fn check_futex_events(dir: &'static str) -> Result<&'static str> {
    if !Path::new(dir).join(FUTEX_EVENT).is_dir() {
        bail!(
            "this kernel lacks the syscalls:sys_enter_futex tracepoint; use a kernel built with CONFIG_FTRACE_SYSCALLS"
        );
    }
    Ok(dir)
}
