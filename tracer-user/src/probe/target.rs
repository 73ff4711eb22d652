//! Target discovery: check the pid, read what the target is (exe, cmdline)
//! and its memory map from /proc. Files of the target are opened through
//! /proc/PID/root so a process in another mount namespace (a container) is
//! seen with its own paths.
use std::{
    fs,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context, Result, bail};

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
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        if pid == 0 || !proc_dir.exists() {
            bail!("no process with pid {pid}; give the pid of a running process (see ps or pgrep)");
        }
        if is_kernel_thread(pid)? {
            bail!("pid {pid} is a kernel thread; locktrace traces user processes");
        }
        let cmdline = fs::read(proc_dir.join("cmdline"))
            .with_context(|| format!("process {pid} exited or cannot be read"))?;
        let cmdline: Vec<String> = cmdline
            .split(|&b| b == 0)
            .filter(|part| !part.is_empty())
            .map(|part| String::from_utf8_lossy(part).into_owned())
            .collect();
        let exe = fs::read_link(proc_dir.join("exe"))
            .map(|path| path.to_string_lossy().into_owned())
            .with_context(|| {
                format!("cannot read /proc/{pid}/exe (process exited, or not root?)")
            })?;
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

pub fn host_path(pid: u32, target_path: &str) -> PathBuf {
    Path::new(&format!("/proc/{pid}/root")).join(target_path.trim_start_matches('/'))
}

/// True while the process exists and is not a zombie.
pub fn is_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => process_state(&stat).is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

fn process_state(stat: &str) -> Option<char> {
    // The command name is in parentheses and may contain spaces or ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().next()?.chars().next()
}

fn is_kernel_thread(pid: u32) -> Result<bool> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("no process with pid {pid}"))?;
    const PF_KTHREAD: u64 = 0x0020_0000;
    // Field 9 (1-based) is the flags word; fields after the name start at 3.
    let after_name = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
    let flags = after_name
        .split_whitespace()
        .nth(6)
        .and_then(|field| field.parse::<u64>().ok())
        .unwrap_or(0);
    Ok(flags & PF_KTHREAD != 0)
}

fn read_maps(pid: u32) -> Result<Vec<Mapping>> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("cannot read /proc/{pid}/maps (process exited?)"))?;
    Ok(parse_maps(&text))
}

pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_maps_line).collect()
}

fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, char::is_whitespace);
    let range = fields.next()?;
    let perms = fields.next()?.to_string();
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let _device = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.next().unwrap_or("").trim().to_string();
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms,
        offset,
        path,
    })
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
    fn reads_state_after_odd_names() {
        assert_eq!(process_state("12 (a) b) S 1 2"), Some('S'));
        assert_eq!(process_state("12 (x) Z 1"), Some('Z'));
    }
}
