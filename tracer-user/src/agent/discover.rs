//! Finding the processes to watch: each process judged once per
//! executable, as it execs (the proc connector's events, see
//! [`crate::trace::proc_connector`]) and at each scan of /proc (the safety net).
use std::{
    collections::{HashMap, HashSet},
    io::ErrorKind,
    os::unix::fs::DirEntryExt,
    time::{Duration, Instant},
};

use crate::{
    model::ServerKind,
    probe::{lockfuncs, request_auto, target::Target},
};

/// A wanted process that just exec'd is judged once its dynamic loader
/// has mapped its libraries (attaching then needs no wait), or after this
/// long anyway.
const STARTING_WAIT: Duration = Duration::from_secs(2);
/// Without selectors, a process that does not look like PHP as it execs
/// is looked at again this long after its exec, then once more: its loader
/// may not have mapped libphp yet (a few ms; the last look's margin is for
/// a loaded machine). Not at every pause: most execs on a busy machine are
/// not PHP, and their maps are the dear read.
const LOOKS_AGAIN: [Duration; 2] = [Duration::from_millis(30), Duration::from_millis(200)];

/// `--exe` and `--cgroup`: with any, the processes they match instead of
/// the PHP servers.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    /// Executable file names (`frankenphp`, `php-fpm8.3`).
    pub exe: Vec<String>,
    /// Strings the cgroup path contains (`kubepods`, `docker-`).
    pub cgroup: Vec<String>,
    /// `--within-cgroup`: only processes whose cgroup path contains one of
    /// these, whatever found them (the PHP servers, or the selectors).
    pub within: Vec<String>,
}

impl Selectors {
    fn any(&self) -> bool {
        !self.exe.is_empty() || !self.cgroup.is_empty()
    }

    /// Inside the `--within-cgroup` patterns (any cgroup without them).
    fn within(&self, cgroup: &str) -> bool {
        self.within.is_empty() || self.within.iter().any(|pattern| cgroup.contains(pattern))
    }

    fn matches(&self, exe: &str, cgroup: &str) -> bool {
        let name = exe_name(exe);
        self.exe.iter().any(|wanted| wanted == name)
            || self.cgroup.iter().any(|pattern| cgroup.contains(pattern))
    }
}

/// The file name of `/proc/PID/exe`'s target, without ` (deleted)`.
pub(crate) fn exe_name(exe: &str) -> &str {
    let exe = exe.strip_suffix(" (deleted)").unwrap_or(exe);
    exe.rsplit('/').next().unwrap_or(exe)
}

/// A process to watch.
#[derive(Debug, Clone)]
pub struct Found {
    pub pid: u32,
    pub exe: String,
    /// Its cgroup path (v2, or the v1 hierarchy naming a container).
    pub cgroup: String,
    /// The PHP server it was recognised as, if it was.
    pub server: Option<ServerKind>,
}

/// A process that exec'd, waiting to be judged.
#[derive(Debug, Clone, Copy)]
struct Starting {
    since: Instant,
    /// Looks so far that found it not PHP-like (yet): the next is due
    /// [`LOOKS_AGAIN`]`[looks - 1]` after its exec.
    looks: usize,
}

/// A process judged already, or seen to have no executable (a kernel thread).
#[derive(Debug)]
struct Seen {
    /// The inode of its /proc entry, once a scan listed it: the process
    /// keeps it (while the entry is cached), a new process with its pid gets
    /// another. So a scan tells a pid reused without reading anything.
    ino: Option<u64>,
    /// The executable it was judged with; None for a kernel thread.
    exe: Option<String>,
}

pub struct Discovery {
    selectors: Selectors,
    /// Every process seen, with the executable it was judged with.
    judged: HashMap<u32, Seen>,
    /// The pids the last scan listed (kept for its allocation).
    present: HashSet<u32>,
    /// The executables read by the scans.
    #[cfg(test)]
    readlinks: u64,
    /// Processes that exec'd, to be judged once they are past their
    /// dynamic loader, with when their exec was seen.
    starting: HashMap<u32, Starting>,
    own_pid: u32,
    /// The proc connector tells every exec and process end (none lost since
    /// the last scan): a scan then skips the processes judged already
    /// (their exec would have made them judged afresh, their end forgotten).
    told: bool,
}

impl Discovery {
    pub fn new(selectors: Selectors) -> Discovery {
        Discovery {
            selectors,
            judged: HashMap::new(),
            present: HashSet::new(),
            #[cfg(test)]
            readlinks: 0,
            starting: HashMap::new(),
            own_pid: std::process::id(),
            told: false,
        }
    }

    /// Whether execs and process ends are all told (by [`Discovery::exec`]
    /// and [`Discovery::exit`]); false after events were lost, until the
    /// next scan has looked at every process again.
    pub(crate) fn told(&mut self, told: bool) {
        self.told = told;
    }

    /// Process `pid` ended: a new process with its pid is judged afresh.
    pub(crate) fn exit(&mut self, pid: u32) {
        self.judged.remove(&pid);
        self.starting.remove(&pid);
    }

    /// Process `pid` exec'd: it is judged afresh by [`Discovery::starting`].
    pub(crate) fn exec(&mut self, pid: u32) {
        if pid != self.own_pid {
            self.judged.remove(&pid);
            let since = Instant::now();
            self.starting.insert(pid, Starting { since, looks: 0 });
        }
    }

    /// Whether processes that exec'd wait to be judged.
    pub(crate) fn any_starting(&self) -> bool {
        !self.starting.is_empty()
    }

    /// The processes that exec'd and match, each judged as soon as its
    /// libraries are mapped; `watched` are skipped. Most execs on a
    /// machine are not wanted: they are turned down by the cheap reads
    /// (executable, maps, cgroup) before anything else.
    pub(crate) fn starting(&mut self, watched: &HashSet<u32>) -> Vec<(Found, Instant)> {
        let mut found = Vec::new();
        let pids: Vec<(u32, Starting)> = self.starting.iter().map(|(p, s)| (*p, *s)).collect();
        for (pid, Starting { since, looks }) in pids {
            let due = looks
                .checked_sub(1)
                .map_or(Duration::ZERO, |n| LOOKS_AGAIN[n]);
            if !self.selectors.any() && since.elapsed() < due {
                continue;
            }
            let exe = match watched.contains(&pid) {
                true => None,
                false => std::fs::read_link(format!("/proc/{pid}/exe")).ok(),
            };
            let Some(exe) = exe.map(|exe| exe.to_string_lossy().into_owned()) else {
                // Watched already, gone, or a kernel thread.
                self.starting.remove(&pid);
                continue;
            };
            if self.wanted(pid, &exe).is_none() {
                if !self.selectors.any() && looks < LOOKS_AGAIN.len() {
                    let looks = looks + 1;
                    self.starting.insert(pid, Starting { since, looks });
                    continue;
                }
            } else if Target::open(pid).is_ok_and(|target| lockfuncs::still_starting(&target))
                && since.elapsed() < STARTING_WAIT
            {
                continue;
            }
            self.starting.remove(&pid);
            let seen = Seen {
                ino: None,
                exe: Some(exe.clone()),
            };
            self.judged.insert(pid, seen);
            if let Some(process) = self.judge(pid, exe) {
                found.push((process, since));
            }
        }
        found
    }

    /// The processes newly matching since the previous scan (`watched` are
    /// skipped). A process is judged again only when its executable changed
    /// or its pid is another process's. Once every process was seen, and
    /// while the connector tells every exec, a scan reads the list of /proc
    /// (its `getdents`) and nothing else.
    pub fn scan(&mut self, watched: &HashSet<u32>) -> Vec<Found> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut present = std::mem::take(&mut self.present);
        present.clear();
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            present.insert(pid);
            if pid == self.own_pid || watched.contains(&pid) || self.starting.contains_key(&pid) {
                continue;
            }
            if let Some(process) = self.look_at(pid, entry.ino()) {
                found.push(process);
            }
        }
        self.judged.retain(|pid, _| present.contains(pid));
        self.starting.retain(|pid, _| present.contains(pid));
        self.present = present;
        found
    }

    /// A scan's look at `pid`, its /proc entry's inode `ino`: the process
    /// when it is new and matches.
    fn look_at(&mut self, pid: u32, ino: u64) -> Option<Found> {
        let same = self.judged.get_mut(&pid).and_then(|seen| {
            let same = seen.ino.is_none_or(|known| known == ino);
            seen.ino = Some(ino);
            same.then_some(&*seen)
        });
        // Told of every exec, the process is as judged; a kernel thread
        // does not exec. Else its executable says whether it exec'd.
        if same.is_some_and(|seen| self.told || seen.exe.is_none()) {
            return None;
        }
        #[cfg(test)]
        {
            self.readlinks += 1;
        }
        let exe = match std::fs::read_link(format!("/proc/{pid}/exe")) {
            Ok(exe) => Some(exe.to_string_lossy().into_owned()),
            // A kernel thread (or gone, and dropped by the next scan).
            Err(error) if error.kind() == ErrorKind::NotFound => None,
            // Looked at again by the next scan.
            Err(_) => return None,
        };
        let unchanged = same.is_some_and(|seen| seen.exe == exe);
        let ino = Some(ino);
        self.judged.insert(
            pid,
            Seen {
                ino,
                exe: exe.clone(),
            },
        );
        match (unchanged, exe) {
            (false, Some(exe)) => self.judge(pid, exe),
            _ => None,
        }
    }

    /// The cheap part of judging, cheapest read first: the selectors (or,
    /// without them, a name or a mapped library saying PHP), then the
    /// cgroup. The process's cgroup path when it passes.
    fn wanted(&self, pid: u32, exe: &str) -> Option<String> {
        let by_name = self.selectors.exe.iter().any(|e| e == exe_name(exe));
        if self.selectors.any() && !by_name && self.selectors.cgroup.is_empty() {
            return None;
        }
        let cgroup_of = || {
            let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            super::labels::cgroup_path(&text).unwrap_or("").to_string()
        };
        // With --within-cgroup, the cgroup (a line) turns most processes
        // down before their maps (thousands of lines) are read.
        let early = (!self.selectors.within.is_empty()).then(cgroup_of);
        if early
            .as_ref()
            .is_some_and(|cgroup| !self.selectors.within(cgroup))
        {
            return None;
        }
        if !self.selectors.any() {
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
            if !request_auto::may_be_php(exe, &maps) {
                return None;
            }
        }
        let cgroup = early.unwrap_or_else(cgroup_of);
        let selected = !self.selectors.any() || self.selectors.matches(exe, &cgroup);
        (selected && self.selectors.within(&cgroup)).then_some(cgroup)
    }

    fn judge(&self, pid: u32, exe: String) -> Option<Found> {
        let cgroup = self.wanted(pid, &exe)?;
        let server = match self.selectors.any() {
            true => None,
            false => Some(request_auto::recognise(&Target::open(pid).ok()?)?),
        };
        Some(Found {
            pid,
            exe,
            cgroup,
            server,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_match_the_file_name_or_a_cgroup_substring() {
        let selectors = Selectors {
            exe: vec!["frankenphp".into()],
            cgroup: vec!["kubepods".into()],
            within: vec!["kubepods".into()],
        };
        assert!(selectors.matches("/usr/local/bin/frankenphp", "/"));
        assert!(selectors.matches("/usr/local/bin/frankenphp (deleted)", "/"));
        assert!(!selectors.matches("/usr/local/bin/frankenphp-old", "/system.slice"));
        assert!(selectors.matches("/usr/bin/php", "/kubepods.slice/x"));
        assert!(!Selectors::default().any());
        assert!(selectors.within("/kubepods.slice/x") && !selectors.within("/system.slice"));
        assert!(Selectors::default().within("/system.slice"));
    }

    /// A scan reads a process's executable once while told of every exec,
    /// at each scan otherwise; a pid's new /proc entry is a new process,
    /// judged afresh; a kernel thread is looked at once.
    #[test]
    fn a_scan_reads_only_what_may_have_changed() {
        let me = std::process::id();
        let exe = std::env::current_exe().unwrap();
        let name = exe_name(exe.to_str().unwrap()).to_string();
        let mut discovery = Discovery::new(Selectors {
            exe: vec![name],
            ..Selectors::default()
        });
        discovery.told(true);
        assert!(
            discovery
                .look_at(me, 7)
                .is_some_and(|found| found.pid == me)
        );
        assert!(discovery.look_at(me, 7).is_none());
        assert_eq!(discovery.readlinks, 1);
        discovery.told(false);
        assert!(discovery.look_at(me, 7).is_none());
        assert_eq!(discovery.readlinks, 2);
        assert!(
            discovery.look_at(me, 8).is_some(),
            "another process, the same pid"
        );
        assert_eq!(discovery.readlinks, 3);
        // Above pid_max: no executable, as a kernel thread.
        let no_exe = 4_000_000_000;
        assert!(discovery.look_at(no_exe, 9).is_none());
        assert!(discovery.look_at(no_exe, 9).is_none());
        assert_eq!(discovery.readlinks, 4);
    }
}
