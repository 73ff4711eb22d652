//! Who held a lock: the holder functions of `--hold-times` and the holders
//! seen at each contended wait (functions, or threads and their names).
use std::collections::{BTreeMap, HashMap};

use super::region::AddressSpace;
use crate::model::{Collected, Frame, HoldSite, Lock, WaitHolder};

/// (function, module) of a call site.
type FunctionId = (Option<String>, Option<String>);

/// Names holder functions and threads: `holds.by_function` and `holders`.
/// `resolve` turns a return address into the calling function.
pub(crate) fn name(
    locks: &mut [Lock],
    space: &AddressSpace,
    collected: &Collected,
    threads: &Threads,
    resolve: impl Fn(&AddressSpace, u64) -> Frame,
) {
    let index: BTreeMap<u64, (usize, u64)> = locks
        .iter()
        .enumerate()
        .map(|(i, lock)| (lock.address, (i, lock.kind.span())))
        .collect();
    let lock_of = |word: u64| {
        index
            .range(..=word)
            .next_back()
            .filter(|(start, (_, span))| word < **start + span)
            .map(|(_, (i, _))| *i)
    };
    let mut frames: HashMap<u64, Frame> = HashMap::new();
    let mut frame_of = |ip: u64| {
        frames
            .entry(ip)
            .or_insert_with(|| resolve(space, ip))
            .clone()
    };
    name_hold_sites(locks, collected, &index, &mut frame_of);
    name_wait_holders(locks, collected, threads, lock_of, &mut frame_of);
}

/// `holds.by_function`: the functions that held each lock, longest first.
fn name_hold_sites(
    locks: &mut [Lock],
    collected: &Collected,
    index: &BTreeMap<u64, (usize, u64)>,
    frame_of: &mut impl FnMut(u64) -> Frame,
) {
    let mut sites: BTreeMap<usize, BTreeMap<FunctionId, (u64, u64)>> = BTreeMap::new();
    for (key, value) in &collected.holders {
        let Some(i) = index.get(&key.lock).map(|(i, _)| *i) else {
            continue;
        };
        let frame = frame_of(key.return_ip);
        let slot = sites
            .entry(i)
            .or_default()
            .entry((frame.function, frame.module))
            .or_insert((0, 0));
        slot.0 += value.holds;
        slot.1 += value.hold_ns;
    }
    for (i, by_site) in sites {
        if let Some(holds) = locks[i].holds.as_mut() {
            holds.by_function = by_site
                .into_iter()
                .map(|((function, module), (holds, hold_ns))| HoldSite {
                    function,
                    module,
                    holds,
                    hold_ns,
                })
                .collect();
            holds
                .by_function
                .sort_by_key(|site| std::cmp::Reverse((site.hold_ns, site.holds)));
        }
    }
}

/// `holders`: who held each lock while a thread waited for it, by function
/// where known, else by thread; the most waits first.
fn name_wait_holders(
    locks: &mut [Lock],
    collected: &Collected,
    threads: &Threads,
    lock_of: impl Fn(u64) -> Option<usize>,
    frame_of: &mut impl FnMut(u64) -> Frame,
) {
    let thread_names = &threads.names;
    type HolderId = (Option<String>, Option<String>, Option<u32>);
    let mut holders: BTreeMap<usize, BTreeMap<HolderId, (u64, u64)>> = BTreeMap::new();
    for (key, time) in &collected.wait_holders {
        let Some(i) = lock_of(key.uaddr) else {
            continue;
        };
        // A tid read from the owner field is only trusted if it is a thread
        // of the target; in a pid namespace of its own the owner field holds
        // the namespace's tid, translated to the host's.
        let tid = match key.tid {
            0 => None,
            tid if key.return_ip != 0 || thread_names.contains_key(&tid) => Some(tid),
            tid => threads.host_tid.get(&tid).copied(),
        };
        let (function, module) = if key.return_ip != 0 {
            let frame = frame_of(key.return_ip);
            (frame.function, frame.module)
        } else {
            (None, None)
        };
        if function.is_none() && module.is_none() && tid.is_none() {
            continue;
        }
        // With a known function the thread is secondary: group by function.
        let id = if key.return_ip != 0 {
            (function, module, None)
        } else {
            (None, None, tid)
        };
        let slot = holders.entry(i).or_default().entry(id).or_insert((0, 0));
        slot.0 += time.waits;
        slot.1 += time.wait_ns;
    }
    for (i, by_holder) in holders {
        let mut list: Vec<WaitHolder> = by_holder
            .into_iter()
            .map(|((function, module, tid), (waits, wait_ns))| WaitHolder {
                function,
                module,
                tid,
                thread: tid.and_then(|tid| thread_names.get(&tid).cloned()),
                waits,
                wait_ns,
            })
            .collect();
        list.sort_by_key(|holder| std::cmp::Reverse((holder.waits, holder.wait_ns)));
        locks[i].holders = list;
    }
}

/// The target's threads: names by (host) tid, and the host tid of each
/// tid in the target's own pid namespace when it has one (`NSpid`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Threads {
    pub names: BTreeMap<u32, String>,
    pub host_tid: BTreeMap<u32, u32>,
}

/// Adds the target's threads, their names (`/proc/PID/task/TID/comm`) and
/// namespace tids (the last `NSpid` of `/proc/PID/task/TID/status`).
pub(crate) fn note_threads(pid: u32, threads: &mut Threads) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        if let Ok(comm) = std::fs::read_to_string(task.path().join("comm")) {
            threads.names.insert(tid, comm.trim_end().to_string());
        }
        if let Some(inner) = std::fs::read_to_string(task.path().join("status"))
            .ok()
            .and_then(|status| namespace_tid(&status))
            .filter(|&inner| inner != tid)
        {
            threads.host_tid.insert(inner, tid);
        }
    }
}

/// The tid in the innermost pid namespace (the last `NSpid` field).
fn namespace_tid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_innermost_namespace_tid() {
        assert_eq!(super::namespace_tid("Name:\tx\nNSpid:\t4242\t7\n"), Some(7));
        assert_eq!(super::namespace_tid("NSpid:\t4242\n"), Some(4242));
        assert_eq!(super::namespace_tid("Name:\tx\n"), None);
    }
}
