//! Kernel lock contention to the report's `kernel_locks` section, and onto
//! the user lock rows whose futex calls it happened in.
//!
//! Rows are per (kernel lock, flags): a rwsem's read and write sides are
//! rows of their own. A row is named as `perf lock contention` names
//! locks when it cannot read the kernel's task structures: a lock inside a
//! global variable by that symbol (`/proc/kallsyms`); else by the type its
//! callers say, from the kernel stack of its contentions, innermost frame
//! first ([`lock_type`]). Its kernel call sites are the first frames
//! outside the kernel's lock code (the lock and scheduler text sections,
//! and the lock slow paths).
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    hash::{Hash, Hasher},
    sync::Arc,
};

use tracer_common::{KernelLockCounts, KernelLockKey, kernel_lock::event, lifetime};

use crate::{
    model::{
        Collected, KERNEL_STACKS_PER_LOCK, KernelLock, KernelLockKind, KernelLockRoute,
        KernelLocks, KernelSite, KernelStack, KernelUserLock, KernelUserSite, Report,
    },
    probe::kallsyms::Kallsyms,
};

/// Lock types told by the kernel functions on the stack: the rwsem
/// ones for sleeping read/write locks, the spinlock ones for spinlocks.
const RWSEM_TYPES: &[(&str, &[&str])] = &[(
    "mmap_lock",
    &[
        "__vm_munmap",
        "vm_munmap",
        "vm_mmap_pgoff",
        "do_mmap",
        "lock_mm_and_find_vma",
        "do_user_addr_fault",
        "exc_page_fault",
        "do_madvise",
        "do_mprotect_pkey",
        "__do_sys_brk",
        "__do_sys_mremap",
    ],
)];
const SPIN_TYPES: &[(&str, &[&str])] = &[
    (
        "runqueue",
        &[
            "raw_spin_rq_lock_nested",
            "_raw_spin_rq_lock",
            "raw_spin_rq_lock",
            "__schedule",
            "try_to_wake_up",
            "sched_tick",
            "scheduler_tick",
            "task_rq_lock",
            "__task_rq_lock",
            "ttwu_queue",
            "sched_ttwu_pending",
            "wake_up_new_task",
        ],
    ),
    (
        "futex hash bucket",
        &[
            "futex_q_lock",
            "futex_wake",
            "futex_wait",
            "futex_wait_setup",
            "futex_wait_multiple_setup",
            "futex_wake_op",
            "futex_requeue",
            "futex_lock_pi",
            "futex_unlock_pi",
            "do_futex",
        ],
    ),
    (
        "page table lock",
        &[
            "__pte_offset_map_lock",
            "pte_offset_map_lock",
            "__pte_alloc",
            "pmd_lock",
            "__pmd_trans_huge_lock",
        ],
    ),
    (
        "lruvec lock",
        &[
            "folio_lruvec_lock_irqsave",
            "folio_lruvec_lock_irq",
            "folio_lruvec_lock",
        ],
    ),
];

/// The lock type the stack's functions (innermost first) say, for a lock
/// of `kind`: the first function that names one decides.
pub(crate) fn lock_type(kind: KernelLockKind, functions: &[&str]) -> Option<&'static str> {
    let table = match kind {
        KernelLockKind::RwsemRead | KernelLockKind::RwsemWrite => RWSEM_TYPES,
        KernelLockKind::Spinlock => SPIN_TYPES,
        _ => return None,
    };
    functions.iter().find_map(|function| {
        table
            .iter()
            .find(|(_, callers)| callers.contains(function))
            .map(|(name, _)| *name)
    })
}

/// Names of the kernel's lock slow paths outside the lock text sections.
const SLOW_PATHS: &[&str] = &[
    "slowpath",
    "rwsem",
    "mutex",
    "osq_lock",
    "_spin_lock",
    "pv_wait",
];

/// The kernel function that took the lock: the first frame outside lock code.
fn kernel_site(symbols: &Kallsyms, frames: &[u64]) -> String {
    frames
        .iter()
        .filter(|&&ip| !symbols.in_lock_code(ip))
        .filter_map(|&ip| symbols.function(ip))
        .find(|name| !SLOW_PATHS.iter().any(|part| name.contains(part)))
        .map_or_else(|| String::from("[unknown]"), str::to_string)
}

/// Fills `report.kernel_locks` from what was collected (nothing when not
/// traced for), and each user lock row's kernel contention.
pub(crate) fn apply(report: &mut Report, collected: &Collected, symbols: &Kallsyms) {
    apply_cached(report, collected, symbols, &mut NamedStacks::default());
}

/// As [`apply`], the stacks named by an earlier read taken from `named`
/// (a live view's reads: the same `symbols` each time).
pub(crate) fn apply_cached(
    report: &mut Report,
    collected: &Collected,
    symbols: &Kallsyms,
    named: &mut NamedStacks,
) {
    let Some(traced) = &collected.kernel_locks else {
        return;
    };
    if let Some(reason) = &traced.unavailable {
        report.kernel_locks = Some(KernelLocks {
            unavailable: Some(reason.clone()),
            ..KernelLocks::default()
        });
        return;
    }
    let user_rows = user_rows(report);
    let mut rows: BTreeMap<(u64, u32), Row> = BTreeMap::new();
    named.begin_read();
    for (key, counts) in &traced.counts {
        let user_lock = user_row(&user_rows, key.user_lock);
        let frames = traced.stacks.get(&key.stack_id);
        let stack = named.stack(key.stack_id, frames.map_or(&[], Vec::as_slice), symbols);
        rows.entry((key.lock, key.flags))
            .or_default()
            .add(key, counts, stack, user_lock);
    }
    join_user_rows(report, &rows);
    let mut locks: Vec<KernelLock> = rows
        .into_iter()
        .map(|((address, flags), row)| row.finish(address, flags, symbols))
        .collect();
    named.end_read();
    locks.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(a.address.cmp(&b.address)));
    report.kernel_locks = Some(KernelLocks {
        unavailable: None,
        contentions: locks.iter().map(|lock| lock.contentions).sum(),
        wait_ns: locks.iter().map(|lock| lock.wait_ns).sum(),
        nested: traced.events[event::NESTED as usize],
        lost: traced.events[event::UNMATCHED_END as usize]
            + traced.events[event::UNTRACKED as usize]
            + traced.events[event::KEYS_FULL as usize],
        locks,
        stacks_exact_first: Some(tracer_common::kernel_lock::STACKS_EXACT_FIRST),
        stack_sample_every: Some(tracer_common::kernel_lock::STACK_SAMPLE_EVERY),
    });
}

/// The user lock rows by shown address: their keys and spans (for [`user_row`]).
pub(crate) fn user_rows(report: &Report) -> BTreeMap<u64, (u64, u64)> {
    report
        .locks
        .iter()
        .map(|lock| (lock.shown_address(), (lock.address, lock.kind.span())))
        .collect()
}

/// The user lock row (its key) holding the futex word `word` (0: none),
/// else the word itself.
pub(crate) fn user_row(rows: &BTreeMap<u64, (u64, u64)>, word: u64) -> Option<u64> {
    if word == 0 {
        return None;
    }
    let address = lifetime::split(word).0;
    let row = rows
        .range(..=address)
        .next_back()
        .filter(|(start, (_, span))| address - **start < *span)
        .map(|(_, (key, _))| *key);
    Some(row.unwrap_or(address))
}

/// Each user lock row gains the kernel contention its futex calls met.
fn join_user_rows(report: &mut Report, rows: &BTreeMap<(u64, u32), Row>) {
    let mut by_user: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for row in rows.values() {
        for (&address, &(contentions, wait_ns)) in &row.user_locks {
            let sum = by_user.entry(address).or_default();
            sum.0 += contentions;
            sum.1 += wait_ns;
        }
    }
    for lock in &mut report.locks {
        if let Some(&(contentions, wait_ns)) = by_user.get(&lock.address) {
            lock.kernel_contentions = Some(contentions);
            lock.kernel_wait_ns = Some(wait_ns);
        }
    }
}

/// A kernel stack as the rows take it, named once.
struct Stack {
    /// The lock type its functions say for a rwsem, and for a spinlock
    /// ([`lock_type`]).
    rwsem_type: Option<&'static str>,
    spin_type: Option<&'static str>,
    /// Each frame's function, or its address.
    named: Interned<[String]>,
    site: Interned<str>,
}

impl Stack {
    fn lock_type(&self, kind: KernelLockKind) -> Option<&'static str> {
        match kind {
            KernelLockKind::RwsemRead | KernelLockKind::RwsemWrite => self.rwsem_type,
            KernelLockKind::Spinlock => self.spin_type,
            _ => None,
        }
    }
}

/// A value shared by all its equals (see [`NamedStacks`]): hashed and
/// compared by address, so rows key by it without comparing strings.
struct Interned<T: ?Sized>(Arc<T>);

impl<T: ?Sized> Clone for Interned<T> {
    fn clone(&self) -> Self {
        Interned(self.0.clone())
    }
}

impl<T: ?Sized> PartialEq for Interned<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T: ?Sized> Eq for Interned<T> {}

impl<T: ?Sized> Hash for Interned<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.0).cast::<()>().hash(state);
    }
}

/// The kernel stacks named by the reads so far, by stack id. A stack id
/// keeps its frames until it is deleted (expiry); its frames are compared
/// with the cached ones at each read all the same, so a reused id is named
/// afresh. Ids absent from a read (expired) are dropped at its end.
#[derive(Default)]
pub(crate) struct NamedStacks {
    by_id: HashMap<i64, CachedStack>,
    /// Each distinct list of frame names and each kernel site, once.
    names: HashSet<Arc<[String]>>,
    sites: HashSet<Arc<str>>,
    /// The current read's number.
    read: u64,
    /// Stacks named so far (each a walk of the kernel's symbols).
    pub(crate) namings: u64,
}

struct CachedStack {
    frames: Vec<u64>,
    stack: Stack,
    /// The last read that used it.
    read: u64,
}

impl NamedStacks {
    fn begin_read(&mut self) {
        self.read += 1;
    }

    /// The named stack of id `id` with `frames`, named now unless cached.
    fn stack(&mut self, id: i64, frames: &[u64], symbols: &Kallsyms) -> &Stack {
        let read = self.read;
        let fresh = self
            .by_id
            .get(&id)
            .is_some_and(|cached| cached.read == read || cached.frames == frames);
        if !fresh {
            let stack = self.name(frames, symbols);
            let frames = frames.to_vec();
            self.by_id.insert(
                id,
                CachedStack {
                    frames,
                    stack,
                    read,
                },
            );
        }
        let cached = self
            .by_id
            .get_mut(&id)
            .expect("inserted above when missing");
        cached.read = read;
        &cached.stack
    }

    fn name(&mut self, frames: &[u64], symbols: &Kallsyms) -> Stack {
        self.namings += 1;
        // Each frame looked up once: the named stack keeps the unknown
        // ones as addresses, the lock type reads the known ones.
        let looked_up: Vec<Option<&str>> = frames.iter().map(|&ip| symbols.function(ip)).collect();
        let functions: Vec<&str> = looked_up.iter().flatten().copied().collect();
        let named: Arc<[String]> = frames
            .iter()
            .zip(&looked_up)
            .map(|(ip, function)| function.map_or_else(|| format!("{ip:#x}"), str::to_string))
            .collect();
        let site: Arc<str> = Arc::from(kernel_site(symbols, frames));
        Stack {
            rwsem_type: lock_type(KernelLockKind::RwsemRead, &functions),
            spin_type: lock_type(KernelLockKind::Spinlock, &functions),
            named: Interned(intern(&mut self.names, named)),
            site: Interned(intern(&mut self.sites, site)),
        }
    }

    /// Drops the stacks the read did not use (expired), and the names no
    /// stack has any more.
    fn end_read(&mut self) {
        let before = self.by_id.len();
        let read = self.read;
        self.by_id.retain(|_, cached| cached.read == read);
        if self.by_id.len() < before {
            self.names.retain(|names| Arc::strong_count(names) > 1);
            self.sites.retain(|site| Arc::strong_count(site) > 1);
        }
    }
}

/// The one shared copy of `value` in `set`.
fn intern<T: ?Sized + Eq + Hash>(set: &mut HashSet<Arc<T>>, value: Arc<T>) -> Arc<T> {
    match set.get(&value) {
        Some(shared) => shared.clone(),
        None => {
            set.insert(value.clone());
            value
        }
    }
}

/// A row as it is summed up.
#[derive(Default)]
struct Row {
    counts: KernelLockCounts,
    /// Contentions and wait per kernel site, user ip and user lock.
    sites: HashMap<Interned<str>, (u64, u64)>,
    user_sites: BTreeMap<u64, (u64, u64)>,
    user_locks: BTreeMap<u64, (u64, u64)>,
    /// Contentions per lock type the stacks say.
    types: BTreeMap<&'static str, u64>,
    /// Contentions and wait per (kernel stack's functions, user ip).
    stacks: HashMap<StackAt, (u64, u64)>,
}

/// A kernel stack's functions and the user ip it was entered from.
type StackAt = (Interned<[String]>, u64);

/// The entries of `map`, most wait time first, then most contentions, then
/// by key.
fn by_wait<K: Ord>(map: impl IntoIterator<Item = (K, (u64, u64))>) -> Vec<(K, (u64, u64))> {
    top_by_wait(map, usize::MAX)
}

/// The first `n` entries of [`by_wait`]'s order: those picked before the
/// sort (a busy lock has thousands of stacks, the report shows a few).
fn top_by_wait<K: Ord>(
    map: impl IntoIterator<Item = (K, (u64, u64))>,
    n: usize,
) -> Vec<(K, (u64, u64))> {
    let order = |a: &(K, (u64, u64)), b: &(K, (u64, u64))| {
        (b.1.1.cmp(&a.1.1))
            .then(b.1.0.cmp(&a.1.0))
            .then_with(|| a.0.cmp(&b.0))
    };
    let mut list: Vec<_> = map.into_iter().collect();
    if list.len() > n {
        list.select_nth_unstable_by(n, order);
        list.truncate(n);
    }
    list.sort_by(order);
    list
}

fn add_to(map_entry: &mut (u64, u64), counts: &KernelLockCounts) {
    map_entry.0 += counts.contentions;
    map_entry.1 += counts.wait_ns;
}

impl Row {
    fn add(
        &mut self,
        key: &KernelLockKey,
        counts: &KernelLockCounts,
        stack: &Stack,
        user_lock: Option<u64>,
    ) {
        self.counts.contentions += counts.contentions;
        self.counts.wait_ns += counts.wait_ns;
        self.counts.max_wait_ns = self.counts.max_wait_ns.max(counts.max_wait_ns);
        if let Some(name) = stack.lock_type(KernelLockKind::of_flags(key.flags)) {
            *self.types.entry(name).or_default() += counts.contentions;
        }
        add_to(
            self.stacks
                .entry((stack.named.clone(), key.user_ip))
                .or_default(),
            counts,
        );
        add_to(self.sites.entry(stack.site.clone()).or_default(), counts);
        add_to(self.user_sites.entry(key.user_ip).or_default(), counts);
        if let Some(user_lock) = user_lock {
            add_to(self.user_locks.entry(user_lock).or_default(), counts);
        }
    }

    fn finish(self, address: u64, flags: u32, symbols: &Kallsyms) -> KernelLock {
        let busiest_type = self
            .types
            .iter()
            .max_by_key(|(_, count)| **count)
            .map(|(name, _)| name.to_string());
        KernelLock {
            address,
            name: symbols.global(address).or(busiest_type),
            kind: KernelLockKind::of_flags(flags),
            flags,
            contentions: self.counts.contentions,
            wait_ns: self.counts.wait_ns,
            max_wait_ns: self.counts.max_wait_ns,
            kernel_sites: by_wait(self.sites.into_iter().map(|(site, sum)| (site.0, sum)))
                .into_iter()
                .map(|(function, (contentions, wait_ns))| KernelSite {
                    function: function.to_string(),
                    contentions,
                    wait_ns,
                })
                .collect(),
            user_sites: by_wait(self.user_sites)
                .into_iter()
                .map(|(ip, (contentions, wait_ns))| KernelUserSite {
                    ip,
                    frame: None,
                    contentions,
                    wait_ns,
                    stacks: Vec::new(),
                })
                .collect(),
            user_locks: by_wait(self.user_locks)
                .into_iter()
                .map(|(address, (contentions, wait_ns))| KernelUserLock {
                    address,
                    name: None,
                    contentions,
                    wait_ns,
                })
                .collect(),
            kernel_stacks: top_by_wait(
                self.stacks
                    .into_iter()
                    .map(|((names, user_ip), sum)| ((names.0, user_ip), sum)),
                KERNEL_STACKS_PER_LOCK,
            )
            .into_iter()
            .map(
                |((functions, user_ip), (contentions, wait_ns))| KernelStack {
                    functions: functions.to_vec(),
                    user_ip,
                    contentions,
                    wait_ns,
                },
            )
            .collect(),
            routes: Vec::new(),
        }
    }
}

/// `--php`: splits each kernel lock row by the route of the request its
/// waiting threads were serving, `labels` naming each route key as the
/// `routes` rows do (`analysis::routes::stack_labels`). The split adds up
/// to the row: both sum the same keys.
pub(crate) fn split_by_route(
    report: &mut Report,
    collected: &Collected,
    labels: &HashMap<u64, String>,
) {
    let (Some(traced), Some(section)) = (&collected.kernel_locks, report.kernel_locks.as_mut())
    else {
        return;
    };
    // Per row (lock, flags): contentions and wait per route name.
    type Split<'a> = BTreeMap<&'a str, (u64, u64)>;
    let mut split: BTreeMap<(u64, u32), Split> = BTreeMap::new();
    for (key, counts) in &traced.counts {
        // A key whose route text was never stored is what `routes` calls unreadable.
        let route = labels
            .get(&key.route)
            .map_or("(unreadable)", String::as_str);
        let row = split.entry((key.lock, key.flags)).or_default();
        add_to(row.entry(route).or_default(), counts);
    }
    for lock in &mut section.locks {
        let Some(routes) = split.remove(&(lock.address, lock.flags)) else {
            continue;
        };
        lock.routes = by_wait(routes)
            .into_iter()
            .map(|(route, (contentions, wait_ns))| KernelLockRoute {
                route: route.to_string(),
                contentions,
                wait_ns,
            })
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::KernelLocksCollected;

    #[test]
    fn lock_types_from_callers() {
        let (read, write, spin) = (
            KernelLockKind::RwsemRead,
            KernelLockKind::RwsemWrite,
            KernelLockKind::Spinlock,
        );
        let munmap = [
            "rwsem_down_write_slowpath",
            "down_write_killable",
            "__vm_munmap",
        ];
        assert_eq!(lock_type(write, &munmap), Some("mmap_lock"));
        let fault = [
            "rwsem_down_read_slowpath",
            "down_read_killable",
            "lock_mm_and_find_vma",
        ];
        assert_eq!(lock_type(read, &fault), Some("mmap_lock"));
        // A spinlock in a page fault is the page table's, not the mmap_lock.
        let pte = [
            "_raw_spin_lock",
            "__pte_offset_map_lock",
            "do_anonymous_page",
            "exc_page_fault",
        ];
        assert_eq!(lock_type(spin, &pte), Some("page table lock"));
        let bucket = [
            "_raw_spin_lock",
            "futex_q_lock",
            "futex_wait_setup",
            "do_futex",
        ];
        assert_eq!(lock_type(spin, &bucket), Some("futex hash bucket"));
        // The wake-up a futex wake makes takes the runqueue's lock.
        let wake = [
            "_raw_spin_lock",
            "try_to_wake_up",
            "wake_up_q",
            "futex_wake",
        ];
        assert_eq!(lock_type(spin, &wake), Some("runqueue"));
        assert_eq!(lock_type(spin, &["_raw_spin_lock", "some_driver"]), None);
        assert_eq!(lock_type(KernelLockKind::Mutex, &munmap), None);
    }

    /// `--php`: each row's waits by route add up to the row, keys of one
    /// route under different stacks and user sites together, an unknown
    /// route key as `(unreadable)`.
    #[test]
    fn routes_split_each_row_and_add_up_to_it() {
        let key = |lock, flags, stack_id, route| KernelLockKey {
            route,
            ..key(lock, flags, stack_id, 0)
        };
        let collected = contended(
            [
                (key(0xa0, 4, 1, 7), counts(3, 300)),
                (key(0xa0, 4, 2, 7), counts(2, 200)),
                (key(0xa0, 4, 1, 8), counts(1, 900)),
                (key(0xa0, 2, 1, 0), counts(4, 40)),
                (key(0xb0, 1, 3, 99), counts(5, 50)),
            ]
            .into(),
            &[],
        );
        let mut report = Report::empty_for_tests("all");
        apply(&mut report, &collected, &Kallsyms::default());
        let labels: HashMap<u64, String> = [
            (0, "(outside requests)".to_string()),
            (7, "GET /a".to_string()),
            (8, "GET /b".to_string()),
        ]
        .into();
        split_by_route(&mut report, &collected, &labels);
        let section = report.kernel_locks.unwrap();
        let routes = |address, flags| -> Vec<(String, u64, u64)> {
            let row = section
                .locks
                .iter()
                .find(|lock| lock.address == address && lock.flags == flags)
                .unwrap();
            let split: Vec<_> = row
                .routes
                .iter()
                .map(|r| (r.route.clone(), r.contentions, r.wait_ns))
                .collect();
            let sum = split.iter().fold((0, 0), |a, r| (a.0 + r.1, a.1 + r.2));
            assert_eq!(sum, (row.contentions, row.wait_ns));
            split
        };
        let named = |name: &str, n, ns| (name.to_string(), n, ns);
        assert_eq!(
            routes(0xa0, 4),
            [named("GET /b", 1, 900), named("GET /a", 5, 500)]
        );
        assert_eq!(routes(0xa0, 2), [named("(outside requests)", 4, 40)]);
        assert_eq!(routes(0xb0, 1), [named("(unreadable)", 5, 50)]);
    }

    const SYMBOLS: &str = "\
ffffffff82251eb0 T __lock_text_start
ffffffff822525d0 T _raw_spin_lock
ffffffff82253931 T __lock_text_end
ffffffff82300000 T futex_wait_setup
ffffffff82310000 T __pte_offset_map_lock
ffffffff82320000 T do_futex
";

    fn key(lock: u64, flags: u32, stack_id: i64, user_ip: u64) -> KernelLockKey {
        KernelLockKey {
            lock,
            flags,
            stack_id,
            user_ip,
            ..KernelLockKey::default()
        }
    }

    fn counts(contentions: u64, wait_ns: u64) -> KernelLockCounts {
        KernelLockCounts {
            contentions,
            wait_ns,
            max_wait_ns: wait_ns,
        }
    }

    /// `counts` collected, with each stack id's frames in `stacks`.
    fn contended(
        counts: HashMap<KernelLockKey, KernelLockCounts>,
        stacks: &[(i64, Vec<u64>)],
    ) -> Collected {
        let traced = KernelLocksCollected {
            counts,
            stacks: stacks.iter().cloned().collect(),
            ..KernelLocksCollected::default()
        };
        Collected {
            kernel_locks: Some(traced),
            ..Collected::default()
        }
    }

    /// Spinlock 0xa0's contention under stacks 1 and 2 from two user sites;
    /// `stacks` gives each stack id's frames.
    fn spinning(stacks: &[(i64, Vec<u64>)]) -> Collected {
        let keys = [
            (key(0xa0, 1, 1, 0x10), counts(3, 300)),
            (key(0xa0, 1, 1, 0x20), counts(2, 200)),
            (key(0xa0, 1, 2, 0x10), counts(1, 300)),
        ];
        contended(keys.into(), stacks)
    }

    fn section_json(collected: &Collected, symbols: &Kallsyms, named: &mut NamedStacks) -> String {
        let mut report = Report::empty_for_tests("all");
        apply_cached(&mut report, collected, symbols, named);
        serde_json::to_string(&report.kernel_locks).unwrap()
    }

    /// A live view's reads name each kernel stack once, and say the same
    /// as a read naming every stack afresh; an id whose frames changed
    /// (reused after its expiry) is named again.
    #[test]
    fn stacks_named_once_across_reads_and_again_when_an_id_is_reused() {
        let symbols = Kallsyms::parse(SYMBOLS);
        let (spin, bucket, pte) = (0xffffffff822525e0, 0xffffffff82300010, 0xffffffff82310010);
        let futex = 0xffffffff82320010;
        let first = spinning(&[(1, vec![spin, bucket, futex]), (2, vec![spin, pte])]);
        let mut named = NamedStacks::default();
        let cached = section_json(&first, &symbols, &mut named);
        assert_eq!(named.namings, 2);
        assert_eq!(
            cached,
            section_json(&first, &symbols, &mut NamedStacks::default())
        );
        assert_eq!(section_json(&first, &symbols, &mut named), cached);
        assert_eq!(named.namings, 2, "a second read names no stack again");
        assert!(cached.contains("futex_wait_setup") && cached.contains("futex hash bucket"));

        // Stack 2 expired and its id came back with other frames.
        let reused = spinning(&[(1, vec![spin, bucket, futex]), (2, vec![spin, bucket])]);
        let again = section_json(&reused, &symbols, &mut named);
        assert_eq!(named.namings, 3);
        assert!(!again.contains("__pte_offset_map_lock"));
        let fresh = section_json(&reused, &symbols, &mut NamedStacks::default());
        assert_eq!(again, fresh);

        // An id missing from a read (expired) is dropped, and named again
        // when it comes back.
        let one = spinning(&[(1, vec![spin, bucket, futex])]);
        section_json(&one, &symbols, &mut named);
        assert_eq!(
            named.by_id.len(),
            2,
            "stack 2's keys are still counted, without frames"
        );
        let mut only_one = one.clone();
        let traced = only_one.kernel_locks.as_mut().unwrap();
        traced.counts.retain(|key, _| key.stack_id == 1);
        section_json(&only_one, &symbols, &mut named);
        assert_eq!(named.by_id.len(), 1);
        let namings = named.namings;
        assert_eq!(section_json(&first, &symbols, &mut named), cached);
        assert_eq!(named.namings, namings + 1);
    }

    #[test]
    fn the_user_row_holding_a_futex_word() {
        let rows: BTreeMap<u64, (u64, u64)> = [(0x1000, (0x1000, 40))].into();
        assert_eq!(user_row(&rows, 0), None);
        assert_eq!(user_row(&rows, 0x1000), Some(0x1000));
        assert_eq!(user_row(&rows, 0x1008), Some(0x1000));
        assert_eq!(user_row(&rows, 0x2000), Some(0x2000));
    }
}
