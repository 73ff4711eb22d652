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
    collections::{BTreeMap, HashMap},
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
    // Many keys share a stack (other user sites and locks): each is named once.
    let mut stacks: HashMap<i64, Stack> = HashMap::new();
    for (key, counts) in &traced.counts {
        let user_lock = user_row(&user_rows, key.user_lock);
        let stack = stacks.entry(key.stack_id).or_insert_with(|| {
            let frames = traced.stacks.get(&key.stack_id);
            Stack::of(frames.map_or(&[][..], Vec::as_slice), symbols)
        });
        rows.entry((key.lock, key.flags))
            .or_default()
            .add(key, counts, stack, user_lock);
    }
    join_user_rows(report, &rows);
    let mut locks: Vec<KernelLock> = rows
        .into_iter()
        .map(|((address, flags), row)| row.finish(address, flags, symbols))
        .collect();
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

/// A kernel stack as the rows take it.
struct Stack<'a> {
    /// Its frames' functions, where known.
    functions: Vec<&'a str>,
    /// Each frame's function, or its address.
    named: Arc<[String]>,
    site: String,
}

impl<'a> Stack<'a> {
    fn of(frames: &[u64], symbols: &'a Kallsyms) -> Stack<'a> {
        Stack {
            functions: frames
                .iter()
                .filter_map(|&ip| symbols.function(ip))
                .collect(),
            named: frames
                .iter()
                .map(|&ip| {
                    symbols
                        .function(ip)
                        .map_or_else(|| format!("{ip:#x}"), str::to_string)
                })
                .collect(),
            site: kernel_site(symbols, frames),
        }
    }
}

/// A row as it is summed up.
#[derive(Default)]
struct Row {
    counts: KernelLockCounts,
    /// Contentions and wait per kernel site, user ip and user lock.
    sites: BTreeMap<String, (u64, u64)>,
    user_sites: BTreeMap<u64, (u64, u64)>,
    user_locks: BTreeMap<u64, (u64, u64)>,
    /// Contentions per lock type the stacks say.
    types: BTreeMap<&'static str, u64>,
    /// Contentions and wait per (kernel stack's functions, user ip).
    stacks: BTreeMap<StackAt, (u64, u64)>,
}

/// A kernel stack's functions and the user ip it was entered from.
type StackAt = (Arc<[String]>, u64);

/// The entries of `map`, most wait time first.
fn by_wait<K>(map: BTreeMap<K, (u64, u64)>) -> Vec<(K, (u64, u64))> {
    let mut list: Vec<_> = map.into_iter().collect();
    list.sort_by(|a, b| b.1.1.cmp(&a.1.1).then(b.1.0.cmp(&a.1.0)));
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
        if let Some(name) = lock_type(KernelLockKind::of_flags(key.flags), &stack.functions) {
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
            kernel_sites: by_wait(self.sites)
                .into_iter()
                .map(|(function, (contentions, wait_ns))| KernelSite {
                    function,
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
            kernel_stacks: by_wait(self.stacks)
                .into_iter()
                .take(KERNEL_STACKS_PER_LOCK)
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
            lock,
            flags,
            stack_id,
            route,
            ..KernelLockKey::default()
        };
        let counts = |contentions, wait_ns| KernelLockCounts {
            contentions,
            wait_ns,
            max_wait_ns: wait_ns,
        };
        let traced = KernelLocksCollected {
            counts: [
                (key(0xa0, 4, 1, 7), counts(3, 300)),
                (key(0xa0, 4, 2, 7), counts(2, 200)),
                (key(0xa0, 4, 1, 8), counts(1, 900)),
                (key(0xa0, 2, 1, 0), counts(4, 40)),
                (key(0xb0, 1, 3, 99), counts(5, 50)),
            ]
            .into(),
            ..KernelLocksCollected::default()
        };
        let collected = Collected {
            kernel_locks: Some(traced),
            ..Collected::default()
        };
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

    #[test]
    fn the_user_row_holding_a_futex_word() {
        let rows: BTreeMap<u64, (u64, u64)> = [(0x1000, (0x1000, 40))].into();
        assert_eq!(user_row(&rows, 0), None);
        assert_eq!(user_row(&rows, 0x1000), Some(0x1000));
        assert_eq!(user_row(&rows, 0x1008), Some(0x1000));
        assert_eq!(user_row(&rows, 0x2000), Some(0x2000));
    }
}
