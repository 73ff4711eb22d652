//! Target discovery: check the pid, read what the target is (exe, cmdline)
//! and its memory map from /proc. Files of the target are opened through
//! /proc/PID/root so a process in another mount namespace (a container) is
//! seen with its own paths.
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context, Result, bail};
use procfs::process::{MMapPath, MemoryMap, Process};

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
    pub fn contains(&self, address: u64) -> bool {
        (self.start..self.end).contains(&address)
    }

    pub fn is_executable(&self) -> bool {
        self.perms.as_bytes().get(2) == Some(&b'x')
    }

    pub fn is_file(&self) -> bool {
        self.path.starts_with('/')
    }
}

#[derive(Debug, Clone)]
pub struct Target {
    pub pid: u32,
    /// Executable path as the target sees it.
    pub exe: String,
    pub cmdline: Vec<String>,
    pub maps: Vec<Mapping>,
    /// Its module files, each mapped once and shared by every reader.
    pub modules: ModuleStore,
}

impl Target {
    /// Checks that `pid` is a live user process and reads its description.
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
        let stat = process
            .stat()
            .with_context(|| format!("no process with pid {pid}"))?;
        if stat.flags & PF_KTHREAD != 0 {
            bail!("pid {pid} is a kernel thread; locktrace traces user processes");
        }
        let cmdline = process
            .cmdline()
            .with_context(|| format!("process {pid} exited or cannot be read"))?;
        let exe = process
            .exe()
            .map(|path| path.to_string_lossy().into_owned())
            .map_err(|error| unreadable_exe(pid, &error))?;
        let maps = read_maps(pid)?;
        Ok(Target {
            pid,
            exe,
            cmdline,
            maps,
            modules: ModuleStore::default(),
        })
    }

    /// Path under which the tracer opens a file of the target.
    /// A mapped file is opened through /proc/PID/map_files: that link is the
    /// mapped inode itself however the path reads from here (the maps of a
    /// chroot or another mount namespace name files in a view the tracer
    /// may not share).
    pub fn host_path(&self, target_path: &str) -> PathBuf {
        let mapped = self.maps.iter().find(|mapping| mapping.path == target_path);
        if let Some(mapping) = mapped {
            let link = PathBuf::from(format!(
                "/proc/{}/map_files/{:x}-{:x}",
                self.pid, mapping.start, mapping.end
            ));
            if link.exists() {
                return link;
            }
        }
        host_path(self.pid, target_path)
    }

    /// The mapped ELF file of a module of the target, read once per recording.
    pub fn module_file(&self, target_path: &str) -> Result<Arc<ModuleFile>> {
        self.modules.open(&self.host_path(target_path))
    }

    pub fn is_alive(&self) -> bool {
        is_alive(self.pid)
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

pub fn host_path(pid: u32, target_path: &str) -> PathBuf {
    Path::new(&format!("/proc/{pid}/root")).join(target_path.trim_start_matches('/'))
}

/// True while the process exists and is not a zombie.
pub fn is_alive(pid: u32) -> bool {
    i32::try_from(pid)
        .ok()
        .and_then(|pid| Process::new(pid).ok()?.stat().ok())
        .is_some_and(|stat| stat.state != 'Z' && stat.state != 'X')
}

/// The kernel-thread bit of the flags in /proc/PID/stat.
const PF_KTHREAD: u32 = 0x0020_0000;

/// The target's memory map (/proc/PID/maps).
pub fn read_maps(pid: u32) -> Result<Vec<Mapping>> {
    let maps = i32::try_from(pid)
        .ok()
        .and_then(|pid| Process::new(pid).ok()?.maps().ok())
        .with_context(|| format!("cannot read /proc/{pid}/maps (process exited?)"))?;
    Ok(maps.into_iter().map(Mapping::from).collect())
}

/// Parses the text of a maps file (for tests and saved maps).
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    use procfs::FromBufRead;
    procfs::process::MemoryMaps::from_buf_read(text.as_bytes())
        .map(|maps| maps.into_iter().map(Mapping::from).collect())
        .unwrap_or_default()
}

impl From<MemoryMap> for Mapping {
    fn from(map: MemoryMap) -> Mapping {
        let path = match map.pathname {
            MMapPath::Path(path) => path.to_string_lossy().into_owned(),
            MMapPath::Heap => "[heap]".into(),
            MMapPath::Stack => "[stack]".into(),
            MMapPath::TStack(tid) => format!("[stack:{tid}]"),
            MMapPath::Vdso => "[vdso]".into(),
            MMapPath::Vvar => "[vvar]".into(),
            MMapPath::Vsyscall => "[vsyscall]".into(),
            MMapPath::Rollup => "[rollup]".into(),
            MMapPath::Anonymous => String::new(),
            MMapPath::Vsys(key) => format!("/SYSV{key:08x}"),
            // procfs strips the brackets of other pseudo paths (`[anon:name]`).
            MMapPath::Other(other) => format!("[{other}]"),
        };
        Mapping {
            start: map.address.0,
            end: map.address.1,
            perms: map.perms.as_str(),
            offset: map.offset,
            path,
        }
    }
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
    fn reads_this_process() {
        let me = Target::open(std::process::id()).unwrap();
        assert!(me.is_alive());
        assert!(
            me.maps
                .iter()
                .any(|m| m.path == me.exe && m.is_executable())
        );
        assert!(Target::open(0).is_err());
    }
}
