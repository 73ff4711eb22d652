//! Why a lock is contended: wait-time histograms (always), hold times
//! (`record --hold-times`: the unlock functions are probed too), and who held
//! the lock during each contended wait.
//!
//! The BPF side keeps the state (see `tracer-ebpf`, "holds"); this module
//! finds and attaches the unlock probes, turns the maps into the report's
//! `wait_histogram`, `holds` and `holders`, and renders them.
//!
//! Hold semantics (no return probes, so a lock call's outcome is unknown):
//! - a hold runs from the lock call, or from the end of the thread's last
//!   futex wait on the lock (it had not got it before), to the unlock call;
//! - a trylock is a hold only if an unlock follows: a failed one leaves a
//!   tentative hold that the thread's next lock call on the lock restarts;
//! - recursive mutexes and re-entered read locks: the outermost hold counts;
//! - rwlock readers hold per thread: an rwlock's hold time sums the readers'
//!   (possibly overlapping) holds;
//! - `pthread_cond_wait` releases and retakes the mutex inside glibc/musl
//!   without the public functions, so a hold spans the condition wait.
use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write,
};

use anyhow::{Result, anyhow};
use aya::{
    Ebpf,
    programs::{UProbe, uprobe::UProbeScope},
};
use serde::{Deserialize, Serialize};
use tracer_common::{LockOp, histogram};

use crate::{
    collect::Collected,
    lockfuncs::LockFunction,
    placement::PlacedFunction,
    report::{Frame, Report},
    symbolize::region::AddressSpace,
    target::Target,
};

/// `locks[].holds`: completed holds of a lock (`--hold-times`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Holds {
    pub holds: u64,
    pub hold_ns: u64,
    pub max_hold_ns: u64,
    /// `[upper_bound_ns, count]`, log2 buckets; counts add up to `holds`.
    pub histogram: Vec<(u64, u64)>,
    /// Hold time per holder function (the caller of the acquisition), most first.
    pub by_function: Vec<HoldSite>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HoldSite {
    pub function: Option<String>,
    pub module: Option<String>,
    pub holds: u64,
    pub hold_ns: u64,
}

/// `locks[].holders[]`: who held the lock while others waited on it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WaitHolder {
    /// The function that took the lock (null without lock probes: see `tid`).
    pub function: Option<String>,
    pub module: Option<String>,
    /// The holding thread and its name, where known (from glibc's mutex
    /// owner field; without `--hold-times` the only holder information).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    pub waits: u64,
    pub wait_ns: u64,
}

/// Adds log2 bucket counts to a sparse `[upper_bound_ns, count]` list (kept sorted).
pub fn add_histogram(into: &mut Vec<(u64, u64)>, buckets: &[u64]) {
    let mut merged: BTreeMap<u64, u64> = into.iter().copied().collect();
    for (bucket, &count) in buckets.iter().enumerate() {
        if count > 0 {
            *merged.entry(histogram::upper_bound_ns(bucket)).or_insert(0) += count;
        }
    }
    *into = merged.into_iter().collect();
}

/// The upper bound of the bucket holding the `quantile` (0..1) of a histogram.
pub fn quantile(histogram: &[(u64, u64)], quantile: f64) -> Option<u64> {
    let total: u64 = histogram.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64 * quantile).ceil() as u64).max(1);
    let mut seen = 0;
    histogram.iter().find_map(|&(bound, n)| {
        seen += n;
        (seen >= rank).then_some(bound)
    })
}

// ---- finding and attaching the unlock probes ----

/// The unlock functions, from the modules the lock functions came from
/// (the executable first, as for the lock functions).
pub fn find_unlocks(target: &Target) -> Result<Vec<LockFunction>> {
    let (found, _) = crate::lockfuncs::find_ops(target, &LockOp::UNLOCKS)?;
    if !found.iter().any(|f| f.op == LockOp::MutexUnlock) {
        anyhow::bail!(
            "--hold-times: no pthread_mutex_unlock symbol in process {}; record without --hold-times",
            target.pid
        );
    }
    Ok(found)
}

/// Runtime range spanning the lock functions: a lock call returning into it
/// came from another lock function (musl nests them).
pub fn lock_code_range(functions: &[LockFunction]) -> (u64, u64) {
    let start = functions.iter().map(|f| f.runtime_start).min();
    let end = functions.iter().map(|f| f.runtime_end).max();
    (start.unwrap_or(0), end.unwrap_or(0))
}

/// Attaches `unlock_call` at every probe point of the unlock functions;
/// returns the number of probes. Called before the lock probes go in, so no
/// hold is begun whose unlock could be missed.
pub fn attach_unlocks(
    ebpf: &mut Ebpf,
    target: &Target,
    unlocks: &[(LockFunction, PlacedFunction)],
    scope: UProbeScope,
) -> Result<usize> {
    if unlocks.is_empty() {
        return Ok(0);
    }
    let program: &mut UProbe = ebpf
        .program_mut("unlock_call")
        .ok_or_else(|| anyhow!("BPF object lacks program unlock_call (build is broken)"))?
        .try_into()?;
    program
        .load()
        .map_err(|error| anyhow!("loading the unlock probe: {error}"))?;
    crate::loader::attach_functions(program, target, unlocks, scope)
}

/// Adds the unlock probes' points, hits and estimated cost (same
/// calibration as the lock probes) to the overhead.
pub fn add_unlock_overhead(
    overhead: &mut crate::overhead::Overhead,
    hits: u64,
    unlocks: &[(LockFunction, PlacedFunction)],
) {
    let points = unlocks.iter().flat_map(|(_, placed)| &placed.points);
    for point in points.clone() {
        if point.emulated {
            overhead.emulated_points += 1;
        } else {
            overhead.stepped_points += 1;
        }
    }
    let all_emulated = points.clone().all(|p| p.emulated);
    overhead.unlock_probe_hits = hits;
    overhead.estimated_added_ns += hits
        * if all_emulated {
            overhead.cost_ns_per_emulated_hit
        } else {
            overhead.cost_ns_per_stepped_hit
        };
}

// ---- report ----

/// Hold counts per lock (unnamed holder functions; see [`name`]) and totals.
pub fn apply(report: &mut Report, collected: &Collected) {
    if !collected.hold_times {
        return;
    }
    for lock in &mut report.locks {
        let Some(address) = parse_address(&lock.address) else {
            continue;
        };
        if lock.acquisitions.is_none() {
            continue;
        }
        let mut holds = Holds::default();
        if let Some(counts) = collected.holds.get(&address) {
            holds.holds = counts.holds;
            holds.hold_ns = counts.hold_ns;
            holds.max_hold_ns = counts.max_hold_ns;
            add_histogram(&mut holds.histogram, &counts.hold_histogram);
        }
        lock.holds = Some(holds);
    }
    report.totals.hold_ns = Some(
        report
            .locks
            .iter()
            .filter_map(|lock| lock.holds.as_ref().map(|h| h.hold_ns))
            .sum(),
    );
}

/// (function, module) of a call site.
type FunctionId = (Option<String>, Option<String>);

/// Names holder functions and threads: `holds.by_function` and `holders`.
/// `resolve` turns a return address into the calling function.
pub fn name(
    report: &mut Report,
    space: &AddressSpace,
    collected: &Collected,
    thread_names: &BTreeMap<u32, String>,
    resolve: impl Fn(&AddressSpace, u64) -> Frame,
) {
    let index: BTreeMap<u64, (usize, u64)> = report
        .locks
        .iter()
        .enumerate()
        .filter_map(|(i, lock)| {
            Some((
                parse_address(&lock.address)?,
                (i, crate::report::lock_span(&lock.kind)),
            ))
        })
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
        if let Some(holds) = report.locks[i].holds.as_mut() {
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

    type HolderId = (Option<String>, Option<String>, Option<u32>);
    let mut holders: BTreeMap<usize, BTreeMap<HolderId, (u64, u64)>> = BTreeMap::new();
    for (key, time) in &collected.wait_holders {
        let Some(i) = lock_of(key.uaddr) else {
            continue;
        };
        // A tid read from the owner field is only trusted if it is a thread of the target.
        let tid = (key.tid != 0 && (key.return_ip != 0 || thread_names.contains_key(&key.tid)))
            .then_some(key.tid);
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
        report.locks[i].holders = list;
    }
}

/// Adds the target's threads and their names (`/proc/PID/task/TID/comm`).
pub fn note_threads(pid: u32, names: &mut BTreeMap<u32, String>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        if let Ok(comm) = std::fs::read_to_string(task.path().join("comm")) {
            names.insert(tid, comm.trim_end().to_string());
        }
    }
}

fn parse_address(text: &str) -> Option<u64> {
    u64::from_str_radix(text.strip_prefix("0x")?, 16).ok()
}

// ---- rendering ----

/// `p50/p99` of the waits, as bucket upper bounds (`-` without waits).
pub fn wait_percentiles(lock: &crate::report::Lock) -> String {
    match (
        quantile(&lock.wait_histogram, 0.5),
        quantile(&lock.wait_histogram, 0.99),
    ) {
        (Some(p50), Some(p99)) => format!("{}/{}", bound(p50), bound(p99)),
        _ => "-".into(),
    }
}

/// Total and maximum hold time (`-` where not recorded).
pub fn hold_cell(lock: &crate::report::Lock) -> String {
    match &lock.holds {
        Some(holds) if holds.holds > 0 => format!(
            "{} / {}",
            crate::table::duration(holds.hold_ns),
            crate::table::duration(holds.max_hold_ns)
        ),
        _ => "-".into(),
    }
}

/// The holder most waited on.
pub fn top_holder(lock: &crate::report::Lock) -> String {
    let Some(holder) = lock.holders.first() else {
        return String::new();
    };
    let who = match (&holder.function, &holder.thread, holder.tid) {
        (Some(function), _, _) => function.clone(),
        (None, Some(thread), Some(tid)) => format!("thread {tid} ({thread})"),
        (None, None, Some(tid)) => format!("thread {tid}"),
        _ => format!("{}+?", holder.module.as_deref().unwrap_or("?")),
    };
    let total: u64 = lock.holders.iter().map(|h| h.waits).sum();
    if lock.holders.len() > 1 {
        format!("{who} ({}/{} waits)", holder.waits, total)
    } else {
        who
    }
}

/// A bucket bound for display (`≤1.0 ms`; the open last bucket as `>…`).
fn bound(ns: u64) -> String {
    if ns == u64::MAX {
        format!(
            ">{}",
            crate::table::duration(histogram::upper_bound_ns(histogram::BUCKETS - 2))
        )
    } else {
        format!("≤{}", crate::table::duration(ns))
    }
}

/// `report --histograms`: every lock's wait (and hold) histogram in full.
pub fn render_histograms(report: &Report, limit: Option<usize>) -> String {
    let mut out = String::new();
    for lock in report.locks.iter().take(limit.unwrap_or(usize::MAX)) {
        let label = crate::stacks::label(lock);
        let mut sections: Vec<(&str, &[(u64, u64)])> = Vec::new();
        if !lock.wait_histogram.is_empty() {
            sections.push(("waits", &lock.wait_histogram));
        }
        if let Some(holds) = lock.holds.as_ref().filter(|h| !h.histogram.is_empty()) {
            sections.push(("holds", &holds.histogram));
        }
        for (what, histogram) in sections {
            let total: u64 = histogram.iter().map(|(_, n)| n).sum();
            let peak = histogram.iter().map(|(_, n)| *n).max().unwrap_or(1).max(1);
            let _ = writeln!(out, "\n{label}: {what} ({total})");
            let mut lower = 0u64;
            for &(upper, count) in histogram {
                let bar = "█".repeat(((count * 40).div_ceil(peak)) as usize);
                let range = if upper == u64::MAX {
                    format!("{:>9} and up", crate::table::duration(lower.max(1)))
                } else {
                    format!(
                        "{:>9} .. {:<9}",
                        crate::table::duration(lower_bound(upper)),
                        crate::table::duration(upper)
                    )
                };
                let _ = writeln!(out, "  {range} {count:>9} {bar}");
                lower = upper;
            }
        }
        for holder in &lock.holders {
            let _ = writeln!(
                out,
                "  held by {}: {} waits, {} waiting",
                top_holder(&crate::report::Lock {
                    holders: vec![holder.clone()],
                    ..lock.clone()
                }),
                holder.waits,
                crate::table::duration(holder.wait_ns)
            );
        }
        if let Some(holds) = &lock.holds {
            for site in &holds.by_function {
                let _ = writeln!(
                    out,
                    "  held in {}: {} holds, {} held",
                    site.function
                        .as_deref()
                        .or(site.module.as_deref())
                        .unwrap_or("?"),
                    site.holds,
                    crate::table::duration(site.hold_ns)
                );
            }
        }
    }
    if out.is_empty() {
        out.push_str("no waits or holds recorded\n");
    }
    out
}

/// The lower bound of the bucket whose upper bound is `upper`.
fn lower_bound(upper: u64) -> u64 {
    if upper <= histogram::upper_bound_ns(0) {
        0
    } else {
        upper / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_duration_once() {
        assert_eq!(histogram::bucket(0), 0);
        assert_eq!(histogram::bucket(255), 0);
        assert_eq!(histogram::bucket(256), 1);
        assert_eq!(histogram::bucket(511), 1);
        assert_eq!(histogram::bucket(512), 2);
        assert_eq!(histogram::bucket(u64::MAX), histogram::BUCKETS - 1);
        for ns in [1u64, 300, 4096, 2_000_000, 1 << 37] {
            let b = histogram::bucket(ns);
            assert!(ns < histogram::upper_bound_ns(b), "{ns}");
            assert!(b == 0 || ns >= histogram::upper_bound_ns(b - 1), "{ns}");
        }
    }

    #[test]
    fn merged_histograms_keep_every_count() {
        let mut merged = Vec::new();
        let mut a = [0u64; histogram::BUCKETS];
        a[3] = 5;
        a[10] = 2;
        let mut b = [0u64; histogram::BUCKETS];
        b[3] = 1;
        b[31] = 4;
        add_histogram(&mut merged, &a);
        add_histogram(&mut merged, &b);
        assert_eq!(merged, vec![(2048, 6), (1 << 18, 2), (u64::MAX, 4)]);
        assert_eq!(quantile(&merged, 0.5), Some(2048));
        assert_eq!(quantile(&merged, 0.99), Some(u64::MAX));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
