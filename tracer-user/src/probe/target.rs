//! Target discovery: check the pid, read what the target is (exe, cmdline)
//! and its memory map from /proc. Files of the target are opened through
//! /proc/PID/root so a process in another mount namespace (a container) is
//! seen with its own paths.
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context, Result, bail};
use procfs::process::Process;

use super::modules::{ModuleFile, ModuleStore};

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    /// Offset in the mapped file.
    pub offset: u64,
    /// File path as the target sees it, or a pseudo name like `[heap]`, or empty.
    pub path: String,
}

impl Mapping {
    /// A mapping at offset 0, for unit tests' made-up maps.
    #[cfg(test)]
    pub(crate) fn made_up(start: u64, end: u64, perms: &str, path: &str) -> Mapping {
        Mapping {
            start,
            end,
            perms: perms.into(),
            offset: 0,
            path: path.into(),
        }
    }

    pub(crate) fn contains(&self, address: u64) -> bool {
        (self.start..self.end).contains(&address)
    }

    pub(crate) fn is_executable(&self) -> bool {
        self.perms.as_bytes().get(2) == Some(&b'x')
    }

    pub(crate) fn is_file(&self) -> bool {
        self.path.starts_with('/')
    }
}

#[derive(Debug, Clone)]
pub struct Target {
    pub pid: u32,
    /// The thread id given with `--pid` when it was a thread, not the process.
    pub given_thread: Option<u32>,
    /// Start time in /proc/PID/stat (clock ticks after boot): a process
    /// that later has the same pid (reuse after the target's exit) has
    /// another, and is not the target.
    pub start_time: u64,
    /// Executable path as the target sees it.
    pub exe: String,
    pub cmdline: Vec<String>,
    pub maps: Vec<Mapping>,
    /// Its module files, each mapped once and shared by every reader.
    pub modules: ModuleStore,
    /// The task the uprobes are bound to: the kernel counts the hits of
    /// every thread sharing that task's memory, until the task exits. The
    /// main thread (the pid) unless it left with `pthread_exit`.
    probe_task: Arc<std::sync::atomic::AtomicU32>,
}

impl Target {
    /// Checks that `pid` is a live user process and reads its description.
    /// A thread id is taken as its process (`given_thread` says so).
    pub fn open(pid: u32) -> Result<Target> {
        let process = i32::try_from(pid)
            .ok()
            .filter(|&pid| pid > 0)
            .and_then(|pid| Process::new(pid).ok())
            .with_context(|| {
                format!(
                    "no process with pid {pid}; give the pid of a running process (see ps or pgrep)"
                )
            })?;
        let tgid = process
            .status()
            .with_context(|| format!("no process with pid {pid}"))?
            .tgid;
        if u32::try_from(tgid).ok() != Some(pid) {
            let mut target = Target::open(u32::try_from(tgid).context("negative tgid")?)?;
            target.given_thread = Some(pid);
            return Ok(target);
        }
        let stat = process
            .stat()
            .with_context(|| format!("no process with pid {pid}"))?;
        if stat.flags & PF_KTHREAD != 0 {
            bail!("pid {pid} is a kernel thread; locktrace traces user processes");
        }
        // A main thread that left (pthread_exit) shows none of these.
        let task = proc_task(pid);
        let shown = Process::new(task as i32).unwrap_or(process);
        let cmdline = read_cmdline(task)?;
        let exe = shown
            .exe()
            .map(|path| path.to_string_lossy().into_owned())
            .map_err(|error| unreadable_exe(pid, &error))?;
        check_64_bit(task)?;
        let maps = read_maps(pid)?;
        Ok(Target {
            pid,
            given_thread: None,
            start_time: stat.starttime,
            exe,
            cmdline,
            maps,
            modules: ModuleStore::default(),
            probe_task: Arc::new(task.into()),
        })
    }

    /// Where the byte at `file_offset` of `module` (a path as the target
    /// sees it) sits in the target's memory: one address per executable
    /// mapping that covers it (a library loaded twice has two).
    pub(crate) fn code_addresses(&self, module: &str, file_offset: u64) -> Vec<u64> {
        code_addresses(&self.maps, module, file_offset)
    }

    /// The task new uprobes are bound to (see [`Target::rebind_probes`]).
    pub(crate) fn probe_task(&self) -> u32 {
        self.probe_task.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// When the task the probes are bound to has exited while the process
    /// lives on (a main thread that called `pthread_exit`), binds new probes
    /// to a live thread and returns it; None while the bound task runs.
    pub(crate) fn rebind_probes(&self) -> Option<u32> {
        let bound = self.probe_task();
        if task_runs(self.pid, bound) || !self.is_alive() {
            return None;
        }
        let live = live_threads(self.pid)
            .into_iter()
            .find(|&tid| tid != bound)?;
        self.probe_task
            .store(live, std::sync::atomic::Ordering::Relaxed);
        Some(live)
    }

    /// Path under which the tracer opens a file of the target.
    /// A mapped file is opened through /proc/PID/map_files: that link is the
    /// mapped inode itself however the path reads from here (the maps of a
    /// chroot or another mount namespace name files in a view the tracer
    /// may not share).
    pub(crate) fn host_path(&self, target_path: &str) -> PathBuf {
        let mapped = self.maps.iter().find(|mapping| mapping.path == target_path);
        if let Some(mapping) = mapped {
            // Through the bound task: an exited main thread has no files.
            let link = PathBuf::from(format!(
                "/proc/{}/map_files/{:x}-{:x}",
                self.probe_task(),
                mapping.start,
                mapping.end
            ));
            if link.exists() {
                return link;
            }
        }
        host_path(self.probe_task(), target_path)
    }

    /// The mapped ELF file of a module of the target, read once per recording.
    pub(crate) fn module_file(&self, target_path: &str) -> Result<Arc<ModuleFile>> {
        self.modules.open(&self.host_path(target_path))
    }

    /// True while the target runs: its pid exists, is no zombie, and is
    /// still the process that started at `start_time` (not a new process
    /// that got the pid after the target exited).
    pub(crate) fn is_alive(&self) -> bool {
        is_running(self.pid, self.start_time)
    }

    /// A pidfd of the target: readable once it exits (zombie or gone), so
    /// its end is noticed at once without polling /proc. `None` when the
    /// kernel has no pidfd_open or the target is already gone.
    pub(crate) fn exit_fd(&self) -> Option<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid, 0) };
        let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
        // SAFETY: the fd was just opened and is owned by nothing else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // Opened after a pid reuse, it would watch the wrong process.
        self.is_alive().then_some(fd)
    }
}

/// True while `pid` is the live process that started at `start_time`.
/// Only a sure sign ends it: the pid is gone (no fd needed to learn that),
/// a zombie, or another process. When /proc cannot be read for our own
/// reasons (out of file descriptors), it is still running.
pub(crate) fn is_running(pid: u32, start_time: u64) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    // Signal 0 checks existence only.
    let gone = unsafe { libc::kill(raw, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    if gone {
        return false;
    }
    match Process::new(raw).and_then(|process| process.stat()) {
        Ok(stat) => stat_is_live(&stat) && stat.starttime == start_time,
        Err(procfs::ProcError::NotFound(_)) => false,
        Err(_) => true,
    }
}

/// When `pid` started (/proc/PID/stat starttime), if it exists.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let process = Process::new(i32::try_from(pid).ok()?).ok()?;
    Some(process.stat().ok()?.starttime)
}

/// argv as bytes (it need not be UTF-8), shown lossily.
fn read_cmdline(pid: u32) -> Result<Vec<String>> {
    let bytes = std::fs::read(format!("/proc/{pid}/cmdline"))
        .with_context(|| format!("process {pid} exited or cannot be read"))?;
    Ok(bytes
        .split(|&byte| byte == 0)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect())
}

/// Refuses a 32-bit program: the probes read x86-64 registers and
/// structure layouts, so its counts would be garbage.
fn check_64_bit(pid: u32) -> Result<()> {
    use std::io::Read;
    let mut header = [0u8; 5];
    let read = std::fs::File::open(format!("/proc/{pid}/exe"))
        .and_then(|mut exe| exe.read_exact(&mut header));
    match read {
        // Unreadable here: the module checks that follow say why.
        Err(_) => Ok(()),
        Ok(()) => elf_class(pid, &header),
    }
}

/// Byte 4 of an ELF header (EI_CLASS): 1 is 32-bit, 2 is 64-bit.
fn elf_class(pid: u32, header: &[u8]) -> Result<()> {
    match header {
        [0x7f, b'E', b'L', b'F', 1, ..] => {
            bail!("pid {pid} is a 32-bit program; locktrace traces 64-bit (x86-64) processes only")
        }
        _ => Ok(()),
    }
}

/// Why /proc/PID/exe could not be read, precisely: the process is gone,
/// this user may not look at it, or (as root) the kernel's ptrace access
/// check refused (the target holds capabilities this process lacks, as pid 1
/// or a process of another container often does).
fn unreadable_exe(pid: u32, error: &procfs::ProcError) -> anyhow::Error {
    use procfs::ProcError;
    let root = nix::unistd::geteuid().is_root();
    match error {
        ProcError::NotFound(_) => anyhow::anyhow!("process {pid} exited"),
        ProcError::PermissionDenied(_) if root => anyhow::anyhow!(
            "cannot read /proc/{pid}/exe even as root ({error}): the kernel's ptrace access check refused, so pid {pid} cannot be traced from here; it holds capabilities this locktrace lacks (CapPrm in /proc/{pid}/status), or it is a kernel-protected process; run locktrace with those capabilities (e.g. from the host, not a container)"
        ),
        ProcError::PermissionDenied(_) => anyhow::anyhow!(
            "cannot read /proc/{pid}/exe ({error}): process {pid} belongs to another user; run locktrace as root"
        ),
        _ => anyhow::anyhow!("cannot read /proc/{pid}/exe: {error}"),
    }
}

pub(crate) fn host_path(pid: u32, target_path: &str) -> PathBuf {
    let task = proc_task(pid);
    resolve_in_root(Path::new(&format!("/proc/{task}/root")), target_path)
}

/// `path` as the process whose root directory is `root` sees it, resolved
/// without leaving `root`: component by component, an absolute symlink
/// target starts again at `root` (the kernel would resolve it against the
/// tracer's root, the host's, through /proc/PID/root), and `..` stops at
/// `root`. A component that does not exist ends the resolution there.
pub(crate) fn resolve_in_root(root: &Path, path: &str) -> PathBuf {
    use std::path::Component;
    // The path so far, relative to root, and what is left to walk.
    let mut resolved = PathBuf::new();
    let mut rest: Vec<std::ffi::OsString> = Path::new(path)
        .components()
        .rev()
        .filter_map(|component| match component {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut links_followed = 0;
    while let Some(name) = rest.pop() {
        if name == ".." {
            resolved.pop();
            continue;
        }
        resolved.push(&name);
        let Ok(target) = std::fs::read_link(root.join(&resolved)) else {
            continue;
        };
        // Linux's limit on symlinks in one lookup.
        links_followed += 1;
        if links_followed > 40 {
            break;
        }
        resolved.pop();
        if target.is_absolute() {
            resolved.clear();
        }
        for component in target.components().rev() {
            match component {
                Component::Normal(name) => rest.push(name.to_os_string()),
                Component::ParentDir => rest.push("..".into()),
                _ => {}
            }
        }
    }
    root.join(resolved)
}

/// True while the process exists and is not a zombie.
pub(crate) fn is_alive(pid: u32) -> bool {
    i32::try_from(pid)
        .ok()
        .and_then(|pid| Process::new(pid).ok()?.stat().ok())
        .is_some_and(|stat| stat_is_live(&stat))
}

/// The task whose /proc directory shows process `pid`: the pid itself,
/// or, once its main thread left with `pthread_exit` (a zombie leader,
/// whose maps, memory, exe and root read as empty or gone), a thread
/// still running. /proc/TID works for any thread, listed or not.
pub fn proc_task(pid: u32) -> u32 {
    if task_runs(pid, pid) {
        return pid;
    }
    live_threads(pid).first().copied().unwrap_or(pid)
}

/// The root directory process `pid` sees, through a thread that runs.
pub(crate) fn proc_root(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{}/root", proc_task(pid)))
}

/// The threads of `pid` that have not exited, by thread id.
fn live_threads(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&tid| task_runs(pid, tid))
        .collect()
}

fn task_runs(pid: u32, tid: u32) -> bool {
    let Ok(stat) = std::fs::read(format!("/proc/{pid}/task/{tid}/stat")) else {
        return false;
    };
    // The state follows the last ')' (the name may hold any byte).
    let state = stat
        .iter()
        .rposition(|&byte| byte == b')')
        .and_then(|end| stat.get(end + 2));
    !matches!(state, None | Some(b'Z' | b'X'))
}

/// A process lives while any of its threads does: a main thread that left
/// with `pthread_exit` is a zombie (`/proc/PID/stat` reads Z) while the
/// threads it left run on, and the zombie still counts in `num_threads`
/// until the process is reaped.
fn stat_is_live(stat: &procfs::process::Stat) -> bool {
    let leader_gone = stat.state == 'Z' || stat.state == 'X';
    !leader_gone || stat.num_threads > 1
}

/// The kernel-thread bit of the flags in /proc/PID/stat.
const PF_KTHREAD: u32 = 0x0020_0000;

/// The target's memory map (/proc/PID/maps).
/// What changes when a process maps or unmaps memory or starts or ends a
/// thread: its thread count and virtual size (one read of /proc/PID/stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub threads: i64,
    pub virtual_bytes: u64,
}

impl Shape {
    pub(crate) fn read(pid: u32) -> Option<Shape> {
        let stat = Process::new(i32::try_from(pid).ok()?).ok()?.stat().ok()?;
        Some(Shape {
            threads: stat.num_threads,
            virtual_bytes: stat.vsize,
        })
    }
}

pub(crate) fn read_maps(pid: u32) -> Result<Vec<Mapping>> {
    // Read as bytes: a path need not be UTF-8 (a library under `caf\xe9/`),
    // and any path may start with `/SYSV` (procfs-core panics on a short one).
    let task = proc_task(pid);
    let bytes = std::fs::read(format!("/proc/{task}/maps"))
        .with_context(|| format!("cannot read /proc/{task}/maps (process exited?)"))?;
    Ok(parse_maps_bytes(&bytes))
}

#[cfg(test)]
/// Parses the text of a maps file (for tests and saved maps).
pub(crate) fn parse_maps(text: &str) -> Vec<Mapping> {
    parse_maps_bytes(text.as_bytes())
}

/// Parses maps lines, `start-end perms offset dev inode [path]`; a line
/// that does not have that shape is skipped. A path that is not UTF-8 is
/// kept lossily for display: files are opened through map_files, by range.
pub(crate) fn parse_maps_bytes(bytes: &[u8]) -> Vec<Mapping> {
    bytes
        .split(|&byte| byte == b'\n')
        .filter_map(parse_maps_line)
        .collect()
}

fn parse_maps_line(line: &[u8]) -> Option<Mapping> {
    // Five fields, then the path (which may hold spaces) after the padding.
    let mut rest = line;
    let mut fields = [&b""[..]; 5];
    for field in &mut fields {
        let start = rest.iter().position(|&b| b != b' ')?;
        rest = &rest[start..];
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        *field = &rest[..end];
        rest = &rest[end..];
    }
    let [range, perms, offset, _device, _inode] = fields;
    fn text(bytes: &[u8]) -> Option<&str> {
        std::str::from_utf8(bytes).ok()
    }
    let (start, end) = text(range)?.split_once('-')?;
    let hex = |digits: &str| u64::from_str_radix(digits, 16).ok();
    let path = rest.trim_ascii_start();
    Some(Mapping {
        start: hex(start)?,
        end: hex(end)?,
        perms: text(perms)?.to_string(),
        offset: hex(text(offset)?)?,
        path: String::from_utf8_lossy(path).into_owned(),
    })
}

/// [`Target::code_addresses`] in `maps`.
pub(crate) fn code_addresses(maps: &[Mapping], module: &str, file_offset: u64) -> Vec<u64> {
    maps.iter()
        .filter(|m| m.is_executable() && m.path == module)
        .filter(|m| file_offset >= m.offset && file_offset - m.offset < m.end - m.start)
        .map(|m| m.start + (file_offset - m.offset))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_maps_lines() {
        let maps = parse_maps(
            "55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]\n\
             7f1c2a428000-7f1c2a5bd000 r-xp 00028000 fe:01 1234   /usr/lib/x86_64-linux-gnu/libc.so.6\n\
             7f1c2a600000-7f1c2a601000 rw-p 00000000 00:00 0 \n",
        );
        assert_eq!(maps.len(), 3);
        assert_eq!(maps[0].path, "[heap]");
        assert_eq!(maps[1].offset, 0x28000);
        assert!(maps[1].is_executable() && maps[1].is_file());
        assert_eq!(maps[2].path, "");
    }

    #[test]
    fn code_addresses_come_from_every_executable_mapping_of_the_module() {
        let maps = parse_maps(
            "7f0000000000-7f0000001000 r--p 00000000 fe:01 9 /lib/libc.so.6\n\
             7f0000001000-7f0000003000 r-xp 00001000 fe:01 9 /lib/libc.so.6\n\
             7f1000001000-7f1000003000 r-xp 00001000 fe:01 9 /lib/libc.so.6\n\
             7f2000001000-7f2000003000 r-xp 00001000 fe:01 10 /lib/other.so\n",
        );
        assert_eq!(
            code_addresses(&maps, "/lib/libc.so.6", 0x1234),
            [0x7f0000001234, 0x7f1000001234]
        );
        // Outside the executable mappings: nowhere.
        assert!(code_addresses(&maps, "/lib/libc.so.6", 0x3000).is_empty());
        assert!(code_addresses(&maps, "/lib/libc.so.6", 0x800).is_empty());
    }

    #[test]
    fn hostile_maps_paths_parse_without_panic() {
        // A file a container names /SYSV (short, or not hex) once panicked
        // procfs-core; a non-UTF-8 directory made every read fail.
        let maps = parse_maps_bytes(
            b"7f0000000000-7f0000001000 rw-s 00000000 00:05 7 /SYSV\n\
              7f0000001000-7f0000002000 r--p 00000000 00:05 8 /SYSVzz\n\
              7f0000002000-7f0000003000 r-xp 00001000 fe:01 9   /opt/caf\xe9/liblock.so\n\
              7f0000003000-7f0000004000 r-xp 00001000 fe:01 9   /tmp/a b.so (deleted)\n\
              garbage line\n",
        );
        let paths: Vec<&str> = maps.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/SYSV",
                "/SYSVzz",
                "/opt/caf\u{fffd}/liblock.so",
                "/tmp/a b.so (deleted)"
            ]
        );
        assert_eq!((maps[2].start, maps[2].offset), (0x7f0000002000, 0x1000));
    }

    #[test]
    fn reads_this_process() {
        let me = Target::open(std::process::id()).unwrap();
        assert!(me.is_alive());
        assert!(
            me.maps
                .iter()
                .any(|m| m.path == me.exe && m.is_executable())
        );
        assert!(Target::open(0).is_err());
        assert_eq!(me.given_thread, None);
    }

    #[test]
    fn a_thread_id_is_taken_as_its_process() {
        let (sender, receiver) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            sender.send(unsafe { libc::gettid() } as u32).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(500));
        });
        let tid = receiver.recv().unwrap();
        let target = Target::open(tid).unwrap();
        assert_eq!(target.pid, std::process::id());
        assert_eq!(target.given_thread, Some(tid));
        worker.join().unwrap();
    }

    #[test]
    fn a_non_utf8_argv_is_read_lossily() {
        use std::os::unix::ffi::OsStrExt;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5", "sh"])
            .arg(std::ffi::OsStr::from_bytes(b"caf\xe9"))
            .spawn()
            .unwrap();
        // Until its exec, the child's argv is ours.
        let cmdline = format!("/proc/{}/cmdline", child.id());
        while !std::fs::read(&cmdline)
            .unwrap_or_default()
            .starts_with(b"sh\0-c")
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let target = Target::open(child.id());
        let _ = child.kill();
        let _ = child.wait();
        let target = target.unwrap();
        assert_eq!(
            target.cmdline.last().map(String::as_str),
            Some("caf\u{fffd}")
        );
    }

    #[test]
    fn a_new_process_with_the_pid_is_not_the_target() {
        let mut me = Target::open(std::process::id()).unwrap();
        assert!(me.is_alive());
        me.start_time += 1;
        assert!(!me.is_alive());
    }

    /// A container's `/lib -> /usr/lib` stays inside its root; `..` stops there.
    #[test]
    fn paths_resolve_inside_the_target_root() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        std::fs::create_dir_all(root.join("usr/lib/x86_64")).unwrap();
        std::fs::write(root.join("usr/lib/x86_64/libonly-in-root.so"), b"x").unwrap();
        std::os::unix::fs::symlink("/usr/lib", root.join("lib")).unwrap();
        std::os::unix::fs::symlink("../lib/x86_64", root.join("usr/arch")).unwrap();
        let expected = root.join("usr/lib/x86_64/libonly-in-root.so");
        assert_eq!(
            resolve_in_root(root, "/lib/x86_64/libonly-in-root.so"),
            expected
        );
        assert_eq!(
            resolve_in_root(root, "/usr/arch/libonly-in-root.so"),
            expected
        );
        assert_eq!(
            resolve_in_root(root, "/../../lib/x86_64/libonly-in-root.so"),
            expected
        );
        // What the kernel does through the root: the host's /usr/lib.
        assert!(!root.join("lib/x86_64/libonly-in-root.so").exists());
        // A loop ends instead of spinning.
        std::os::unix::fs::symlink("/loop", root.join("loop")).unwrap();
        let _ = resolve_in_root(root, "/loop/x");
    }

    #[test]
    fn a_32_bit_program_is_refused() {
        let header = [0x7f, b'E', b'L', b'F', 1, 1, 1];
        assert_eq!(
            elf_class(7, &header).unwrap_err().to_string(),
            "pid 7 is a 32-bit program; locktrace traces 64-bit (x86-64) processes only"
        );
        assert!(elf_class(7, &[0x7f, b'E', b'L', b'F', 2]).is_ok());
    }
}
