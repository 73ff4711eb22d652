//! One report's side of a comparison: its locks grouped by an identity that
//! survives a restart, with their figures summed, and the names both sides
//! agree on.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
};

use anyhow::{Result, bail};

use super::identity::{Identified, LockIdentity};
use crate::{
    model::{Lock, LockKind, LockStack, Mode, Report},
    naming::chain::c_notation,
    render::{format::ratio, pprof::is_lock_call, stacks::folded_path},
};

/// Locks of one identity in one report, summed. Not a `model::Lock`:
/// `compare` matches locks across runs by identity (name, else callers),
/// never by address, so a group stands for every row of that identity,
/// with the labels and aliases selectors search and its lock calls by
/// folded call path.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Group {
    pub(super) kind: Option<LockKind>,
    pub(super) locks: usize,
    pub(super) acquisitions: u64,
    pub(super) contended: u64,
    pub(super) wait_ns: u64,
    /// `--hold-times`: time held, where recorded.
    pub(super) hold_ns: Option<u64>,
    /// Sampled CPU time in lock code, where CPU was sampled.
    pub(super) cpu_ns: Option<u64>,
    /// What removing the locks would save (`removal`): CPU ns and bound.
    pub(super) saving_ns: Option<u64>,
    pub(super) saving_error_ns: Option<u64>,
    /// What the lock's handoffs between CPUs cost (`handoffs.cost_ns`), where counted.
    pub(super) handoff_cost_ns: Option<u64>,
    /// Kernel lock wait its futex calls met (`kernel_wait_ns`), where traced.
    pub(super) kernel_wait_ns: Option<u64>,
    /// Name and caller functions: what selectors search.
    pub(super) labels: Vec<String>,
    /// Lock contention rows (not condvar, Go runtime or other futex words):
    /// the only ones assertions select.
    pub(super) is_lock: bool,
    /// Other names of the same locks (offset notation, other routes).
    pub(super) aliases: BTreeSet<String>,
    /// Sampled reports: the per-request bound of `acquisitions`, summed
    /// over the group's locks (each lock's own bound; a sum never understates).
    pub(super) per_request_error: f64,
    /// `--stacks`: lock calls by call path (folded, outermost first).
    pub(super) paths: BTreeMap<String, u64>,
}

/// Adds to an optional total, starting it at 0, never wrapping.
pub(super) fn saturating_add_to(total: &mut Option<u64>, value: u64) {
    let total = total.get_or_insert(0);
    *total = total.saturating_add(value);
}

impl Group {
    pub(super) fn absorb(&mut self, other: Group) {
        self.locks = self.locks.saturating_add(other.locks);
        self.acquisitions = self.acquisitions.saturating_add(other.acquisitions);
        self.contended = self.contended.saturating_add(other.contended);
        self.wait_ns = self.wait_ns.saturating_add(other.wait_ns);
        if let Some(held) = other.hold_ns {
            saturating_add_to(&mut self.hold_ns, held);
        }
        if let Some(cpu) = other.cpu_ns {
            saturating_add_to(&mut self.cpu_ns, cpu);
        }
        if let Some(saving) = other.saving_ns {
            saturating_add_to(&mut self.saving_ns, saving);
        }
        if let Some(error) = other.saving_error_ns {
            saturating_add_to(&mut self.saving_error_ns, error);
        }
        if let Some(cost) = other.handoff_cost_ns {
            saturating_add_to(&mut self.handoff_cost_ns, cost);
        }
        if let Some(ns) = other.kernel_wait_ns {
            saturating_add_to(&mut self.kernel_wait_ns, ns);
        }
        self.is_lock |= other.is_lock;
        self.labels.extend(other.labels);
        self.labels.sort();
        self.labels.dedup();
        self.aliases.extend(other.aliases);
        self.per_request_error += other.per_request_error;
        for (path, count) in other.paths {
            let total = self.paths.entry(path).or_default();
            *total = total.saturating_add(count);
        }
    }
}

/// The report's request count, which every per-request figure divides by.
pub(super) fn request_count(report: &Report, path: &Path) -> Result<u64> {
    match &report.requests {
        Some(r) if r.refused.is_none() && r.count > 0 => Ok(r.count),
        Some(r) if r.refused.is_some() => bail!(
            "{} has no per-request figures: {}",
            path.display(),
            r.refused.as_deref().unwrap_or_default()
        ),
        _ => bail!(
            "{} has no request count; record it with --load URL, --request-probe MODULE:SYMBOL or --requests N",
            path.display()
        ),
    }
}

/// What identifies a lock across runs, and what selectors find it by.
pub(super) struct LockNames<'r> {
    /// The name as the report spells it (never a bare address).
    pub(super) spelled: Option<&'r str>,
    /// The name in C notation.
    pub(super) name: Option<String>,
    /// Its caller functions, sorted, once each.
    pub(super) callers: Vec<String>,
}

impl<'r> LockNames<'r> {
    pub(super) fn of(lock: &'r Lock) -> LockNames<'r> {
        let spelled = lock
            .name
            .as_deref()
            // A bare address is no identity across runs.
            .filter(|n| !n.is_empty() && !n.starts_with("0x"));
        let mut callers: Vec<String> = lock
            .callers
            .iter()
            .filter_map(|c| c.function.clone())
            .collect();
        callers.sort();
        callers.dedup();
        LockNames {
            spelled,
            // Reports before C notation wrote `g_stats->+0x20->` for `*g_stats->+0x20`.
            name: spelled.map(c_notation),
            callers,
        }
    }

    /// The group's key: the name, else the callers, else the kind.
    pub(super) fn identity(&self, lock: &Lock) -> LockIdentity {
        let by = match (&self.name, self.callers.is_empty()) {
            (Some(name), _) => Identified::Name(name.clone()),
            (None, false) => Identified::Callers {
                kind: lock.kind,
                functions: self.callers.clone(),
            },
            (None, true) => Identified::Unidentified(lock.kind),
        };
        // Like with like: a condvar or runtime word never matches a lock.
        LockIdentity {
            class: lock.wait_class,
            by,
        }
    }

    /// Other names of the lock (offset notation, other routes), in C notation.
    pub(super) fn aliases(&self, lock: &Lock) -> Vec<String> {
        lock.offset_name
            .iter()
            .cloned()
            .chain(
                lock.alternatives
                    .iter()
                    .flat_map(|a| [a.name.clone(), a.offset_name.clone()]),
            )
            .map(|alias| c_notation(&alias))
            .filter(|alias| Some(alias) != self.name.as_ref())
            .collect()
    }
}

/// Adds a lock's figures, names and call paths to the group of its identity.
pub(super) fn add_to_group(
    groups: &mut BTreeMap<LockIdentity, Group>,
    lock: &Lock,
    requests: u64,
    stacks: &[&LockStack],
) {
    let names = LockNames::of(lock);
    let group = groups.entry(names.identity(lock)).or_insert_with(|| Group {
        kind: Some(lock.kind),
        is_lock: lock.is_contention(),
        ..Group::default()
    });
    add_figures(group, lock, requests);
    let aliases = names.aliases(lock);
    // Selectors find a lock by its old spelling too.
    group.labels.extend(names.spelled.map(str::to_string));
    group.labels.extend(lock.offset_name.clone());
    group.labels.extend(names.name);
    group.labels.extend(names.callers);
    group.labels.extend(aliases.iter().cloned());
    group.aliases.extend(aliases);
    for stack in stacks {
        if is_lock_call(stack, lock) {
            let total = group.paths.entry(folded_path(stack)).or_default();
            *total = total.saturating_add(stack.count);
        }
    }
    group.labels.sort();
    group.labels.dedup();
}

/// Adds a lock's counts and times to its group.
pub(super) fn add_figures(group: &mut Group, lock: &Lock, requests: u64) {
    // Saturating: a crafted report's counts near 2^64 must not wrap.
    // A row grouped by creation site stands for its addresses.
    let addresses = lock.group.as_ref().map_or(1, |g| g.addresses);
    group.locks = group
        .locks
        .saturating_add(usize::try_from(addresses).unwrap_or(usize::MAX));
    group.acquisitions = group
        .acquisitions
        .saturating_add(lock.acquisitions.unwrap_or(0));
    group.per_request_error += lock
        .per_request
        .as_ref()
        .and_then(|per| per.acquisitions_error)
        // Reports before per-request bounds: the lock's own bound.
        .or(lock.acquisitions_error.map(|e| e as f64 / requests as f64))
        .unwrap_or(0.0);
    group.contended = group.contended.saturating_add(lock.contended);
    group.wait_ns = group.wait_ns.saturating_add(lock.wait_ns);
    if let Some(holds) = &lock.holds {
        saturating_add_to(&mut group.hold_ns, holds.hold_ns);
    }
    if let Some(handoffs) = &lock.handoffs {
        saturating_add_to(&mut group.handoff_cost_ns, handoffs.cost_ns);
    }
    if let Some(cpu) = lock.cpu_ns {
        saturating_add_to(&mut group.cpu_ns, cpu);
    }
    if let Some(ns) = lock.kernel_wait_ns {
        saturating_add_to(&mut group.kernel_wait_ns, ns);
    }
    if let Some(removal) = &lock.removal {
        // Non-negative and finite by construction; `as` saturates a crafted one.
        saturating_add_to(&mut group.saving_ns, removal.saving_ns.max(0.0) as u64);
        saturating_add_to(&mut group.saving_error_ns, removal.error_ns.max(0.0) as u64);
    }
}

pub(super) struct Side {
    pub(super) path: PathBuf,
    pub(super) requests: u64,
    pub(super) mode: Mode,
    /// Sampled reports: their windows (a lock never seen may have been missed).
    pub(super) sampled_windows: Option<u32>,
    /// The target's CPU time over the window (`cpu.target_ns`), where measured.
    pub(super) target_cpu_ns: Option<u64>,
    /// The tracer's estimated share of it (`cpu.tracer_ns`).
    pub(super) tracer_cpu_ns: u64,
    pub(super) groups: BTreeMap<LockIdentity, Group>,
    /// `--php` recordings: each route's locks.
    pub(super) routes: Option<crate::model::Routes>,
    /// The kernel locks section, where traced.
    pub(super) kernel_locks: Option<KernelSide>,
}

impl Side {
    pub(super) fn load(path: &Path) -> Result<Side> {
        let report = Report::load(path)?;
        let requests = request_count(&report, path)?;
        let mut stacks: HashMap<u64, Vec<&LockStack>> = HashMap::new();
        for stack in &report.stacks {
            stacks.entry(stack.lock).or_default().push(stack);
        }
        let mut groups: BTreeMap<LockIdentity, Group> = BTreeMap::new();
        for lock in &report.locks {
            let lock_stacks = stacks.get(&lock.address).map_or(&[][..], Vec::as_slice);
            add_to_group(&mut groups, lock, requests, lock_stacks);
        }
        Ok(Side {
            path: path.to_path_buf(),
            requests,
            mode: report.mode,
            sampled_windows: report.estimate.as_ref().map(|e| e.windows),
            target_cpu_ns: report.cpu.as_ref().and_then(|cpu| cpu.target_ns),
            tracer_cpu_ns: report.cpu.as_ref().map_or(0, |cpu| cpu.tracer_ns),
            groups,
            routes: report.routes.clone(),
            kernel_locks: report.kernel_locks.as_ref().map(KernelSide::of),
        })
    }

    pub(super) fn per_request(&self, value: u64) -> f64 {
        value as f64 / self.requests as f64
    }

    /// Whether the report counted acquisitions (contention mode does not).
    pub(super) fn counts_acquisitions(&self) -> bool {
        self.mode.counts_acquisitions()
    }

    /// A group's acquisitions per request as shown: `~x ±e` when sampled.
    pub(super) fn shown(&self, group: &Group) -> String {
        let value = ratio(self.per_request(group.acquisitions));
        match self.sampled_windows {
            Some(_) => format!("~{value} ±{}", ratio(group.per_request_error)),
            None => value,
        }
    }

    /// Lock groups a selector matches: by name or caller function (substring).
    pub(super) fn matching<'a>(
        &'a self,
        selector: &'a str,
    ) -> impl Iterator<Item = (&'a LockIdentity, &'a Group)> + 'a {
        self.groups.iter().filter(move |(_, group)| {
            group.is_lock && group.labels.iter().any(|label| label.contains(selector))
        })
    }
}

/// A group of one side known on the other only by one of its aliases (an
/// older report's offset name, another route) takes the group's identity.
pub(super) fn unify(before: &mut Side, after: &mut Side) {
    adopt(before, after);
    adopt(after, before);
}

pub(super) fn adopt(named: &Side, other: &mut Side) {
    for (identity, group) in &named.groups {
        if other.groups.contains_key(identity) {
            continue;
        }
        // Known there by one of its aliases, or sharing one (the same route
        // in offsets, spelled alike in both reports); like with like only.
        let Some(alias) = other
            .groups
            .iter()
            .find(|(key, found)| {
                key.lock_name()
                    .is_some_and(|name| group.aliases.contains(name))
                    || (found.is_lock == group.is_lock
                        && !found.aliases.is_disjoint(&group.aliases))
            })
            .map(|(key, _)| key.clone())
        else {
            continue;
        };
        if let Some(found) = other.groups.remove(&alias) {
            other
                .groups
                .entry(identity.clone())
                .or_insert_with(|| Group {
                    kind: found.kind,
                    ..Group::default()
                })
                .absorb(found);
        }
    }
}

/// Contentions and wait of a kernel lock on one side.
pub(super) type Figures = (u64, u64);

/// One side's kernel locks: totals per (name, kind), or why there are none.
#[derive(Debug, Clone, Default)]
pub(super) struct KernelSide {
    /// The report's `kernel_locks.unavailable`.
    pub(super) unavailable: Option<String>,
    /// Contentions and wait per (name, kind).
    pub(super) locks: BTreeMap<(String, crate::model::KernelLockKind), Figures>,
}

impl KernelSide {
    pub(super) fn of(section: &crate::model::KernelLocks) -> KernelSide {
        let mut locks: BTreeMap<(String, crate::model::KernelLockKind), Figures> = BTreeMap::new();
        for lock in &section.locks {
            let name = lock.name.clone().unwrap_or_else(|| "unnamed".into());
            let total = locks.entry((name, lock.kind)).or_default();
            total.0 = total.0.saturating_add(lock.contentions);
            total.1 = total.1.saturating_add(lock.wait_ns);
        }
        KernelSide {
            unavailable: section.unavailable.clone(),
            locks,
        }
    }
}
