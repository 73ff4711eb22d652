//! Naming: turns the addresses of a report into names. Each lock gets its
//! region (which memory holds it), its module and symbol (`g_lock`,
//! `g_struct+0x40`), or for heap locks a pointer chain from a global
//! (`*g_stats->+0x20`); each lock's callers and stacks become functions.
//!
//! Fields come from DWARF where the module has it (`dwarf.rs`, `names.rs`:
//! `g_registry.locks[2]`, `g_stats->LOCK_access`).
//!
//! Runs once after collect. What needs the target (its maps, its module
//! files) is snapshotted at attach time, so names from ELF still work when
//! the target has exited; pointer chains need it alive, so they are also
//! searched during the recording (`ongoing.rs`).
pub(crate) mod chain;
pub mod cpython;
pub(crate) mod creation;
pub(crate) mod debuginfod;
pub(crate) mod declared;
pub mod dwarf;
pub mod elf;
pub(crate) mod frame_rules;
pub(crate) mod holders;
pub(crate) mod in_progress;
mod kernel_locks;
pub(crate) mod lock_code;
pub mod mysqlnd;
pub(crate) mod names;
pub(crate) mod ongoing;
pub mod php;
pub mod region;
pub(crate) mod unwind;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::Instant,
};

use region::AddressSpace;
use tracer_common::{LockOp, stack_kind};

use crate::{
    model::{
        CallSites, ChainSearch, Collected, DropReason, Frame, Lock, LockKind, LockStack, Naming,
        PhpLocation, PointerChains, Report, SkipReason, SkippedFile, StackEnd, StackOrigin,
        StackSource, StrippedModule, UnwoundStack, sorted_callers,
    },
    probe::{
        lockfuncs::{LockFunction, is_nested_call},
        modules::{ModuleFile, ModuleStore},
        target::{self, Mapping, Target},
    },
};

/// Heap locks (in report order) whose pointer chains are searched.
pub(crate) const CHAIN_SEARCH_LOCKS: usize = 20;

/// What naming needs from the target, taken while it is alive.
pub(crate) struct Snapshot {
    pid: u32,
    /// The target's start time (pid reuse is not the target).
    start_time: u64,
    maps: Vec<Mapping>,
    /// Every mapped ELF module, from the recording's store (opened through
    /// map_files or /proc/PID/root): mappings stay readable after the target exits.
    files: BTreeMap<String, Arc<ModuleFile>>,
    /// Mapped files that are not ELF or cannot be opened: not tried again.
    skipped: BTreeSet<String>,
    store: ModuleStore,
    /// Start addresses of mappings seen holding a thread's stack pointer.
    thread_stacks: BTreeMap<u64, u64>,
    /// The target's threads seen, their names and namespace tids (for lock holders).
    pub threads: holders::Threads,
    /// Heap locks' pointer chains, searched during the recording.
    ongoing: ongoing::OngoingNames,
    /// The target's shape at the last refresh, and when that was (see `tick`).
    refreshed: Option<(target::Shape, Instant)>,
    /// Mappings that others replaced since attach (a library unloaded and
    /// another loaded at its address, an exec), oldest first: what locks
    /// whose memory went away are named from.
    replaced: Vec<Mapping>,
    /// Each module file's symbols, parsed once for all the namings of a
    /// live session (a file replaced is parsed again).
    symbols: region::SymbolCache,
}

/// Replaced mappings kept at most (an exec replaces a few hundred).
const MAX_REPLACED: usize = 16_384;

/// A tick re-reads the maps and thread stacks at least this often, even
/// when the target's shape looks the same.
const FULL_REFRESH_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

impl Snapshot {
    pub(crate) fn take(target: &Target) -> Snapshot {
        let mut snapshot = Snapshot {
            pid: target.pid,
            start_time: target.start_time,
            maps: target.maps.clone(),
            files: BTreeMap::new(),
            skipped: BTreeSet::new(),
            store: target.modules.clone(),
            thread_stacks: BTreeMap::new(),
            threads: holders::Threads::default(),
            ongoing: ongoing::OngoingNames::default(),
            refreshed: None,
            replaced: Vec::new(),
            symbols: region::SymbolCache::new(),
        };
        snapshot.note_thread_stacks();
        snapshot.open_files();
        snapshot
    }

    /// Re-reads the maps of a live target (threads started, modules loaded,
    /// heap grown since attach); called while tracing and before naming.
    /// Mappings gone since (a finished thread's stack) are kept where nothing
    /// new overlaps them, so addresses in them still get a region.
    pub(crate) fn refresh(&mut self) {
        let Ok(fresh) = target::read_maps(self.pid) else {
            return;
        };
        if fresh.is_empty() {
            return;
        }
        let (gone, overlapped): (Vec<Mapping>, Vec<Mapping>) =
            self.maps.drain(..).partition(|old| {
                !fresh
                    .iter()
                    .any(|new| new.start < old.end && old.start < new.end)
            });
        let replaced = overlapped.into_iter().filter(|old| {
            old.is_file()
                && !fresh.iter().any(|new| {
                    (new.start, new.end, new.offset, &new.path)
                        == (old.start, old.end, old.offset, &old.path)
                })
        });
        self.replaced.extend(replaced);
        if self.replaced.len() > MAX_REPLACED {
            let excess = self.replaced.len() - MAX_REPLACED;
            self.replaced.drain(..excess);
        }
        self.maps = fresh;
        self.maps.extend(gone);
        self.maps.sort_by_key(|mapping| mapping.start);
        self.note_thread_stacks();
        self.open_files();
    }

    /// The mappings as they were before others replaced them: the replaced
    /// ones (the latest of each place), and the current ones elsewhere.
    fn past_maps(&self) -> Vec<Mapping> {
        let mut past: Vec<Mapping> = Vec::new();
        for old in self.replaced.iter().rev() {
            if !past.iter().any(|p| p.start < old.end && old.start < p.end) {
                past.push(old.clone());
            }
        }
        let now = self
            .maps
            .iter()
            .filter(|m| !past.iter().any(|p| p.start < m.end && m.start < p.end))
            .cloned()
            .collect::<Vec<_>>();
        past.extend(now);
        past.sort_by_key(|m| m.start);
        past
    }

    /// Whether the memory at `address` went away unseen: no replaced
    /// mapping covers it, and a module mapped there now does (the one
    /// that came after).
    fn module_unseen(&self, address: u64) -> bool {
        let covers = |m: &Mapping| m.start <= address && address < m.end;
        !self.replaced.iter().any(covers) && self.maps.iter().any(|m| m.is_file() && covers(m))
    }

    /// The target's mappings as last read (those gone since kept where
    /// nothing new overlaps them).
    pub(crate) fn maps(&self) -> &[Mapping] {
        &self.maps
    }

    /// Searches heap locks' chains during the recording (see [`live`]).
    pub(crate) fn watch(&mut self, ebpf: &aya::Ebpf) {
        self.ongoing = ongoing::OngoingNames::watch(ebpf);
        self.ongoing.prepare(self.pid, &self.maps, &self.files);
    }

    /// The recording's tick: fresh maps when the target's shape changed
    /// (re-reading a server's maps and every thread's stat each tick cost
    /// the tracer ~1 % of a CPU under load), then chains for new heap locks.
    pub(crate) fn tick(&mut self) {
        let shape = target::Shape::read(self.pid);
        let unchanged = self
            .refreshed
            .is_some_and(|(last, at)| Some(last) == shape && at.elapsed() < FULL_REFRESH_EVERY);
        if !unchanged {
            self.refresh();
            self.refreshed = shape.map(|shape| (shape, Instant::now()));
        }
        self.ongoing
            .tick(self.pid, &self.maps, &self.files, &self.thread_stacks);
    }

    /// Remembers which mappings hold a thread's stack pointer now.
    fn note_thread_stacks(&mut self) {
        holders::note_threads(self.pid, &mut self.threads);
        for sp in region::thread_stack_pointers(self.pid) {
            if let Some(mapping) = self.maps.iter().find(|m| m.contains(sp)) {
                let highest = self.thread_stacks.entry(mapping.start).or_insert(sp);
                *highest = (*highest).max(sp);
            }
        }
    }

    fn open_files(&mut self) {
        for mapping in self.maps.iter().filter(|m| m.is_file()) {
            if self.files.contains_key(&mapping.path) || self.skipped.contains(&mapping.path) {
                continue;
            }
            // map_files first: the mapped inode, whatever the path reads like from here.
            let by_map_file = self.store.open(
                format!(
                    "/proc/{}/map_files/{:x}-{:x}",
                    self.pid, mapping.start, mapping.end
                )
                .as_ref(),
            );
            let by_root = || self.store.open(&target::host_path(self.pid, &mapping.path));
            match by_map_file.or_else(|_| by_root()) {
                Ok(file) => {
                    self.files.insert(mapping.path.clone(), file);
                }
                Err(_) => {
                    self.skipped.insert(mapping.path.clone());
                }
            }
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct NamingOptions {
    /// Stacks kept per lock (0: none).
    pub stacks_per_lock: usize,
    /// `--php`: each route key's name as in the report's `routes`, for the
    /// stacks' `route`.
    pub route_names: Option<HashMap<u64, String>>,
}

/// Names every lock of the report, resolves callers and stacks.
pub(crate) fn annotate(
    report: &mut Report,
    snapshot: &mut Snapshot,
    collected: &Collected,
    functions: &[LockFunction],
    options: NamingOptions,
) {
    let started = Instant::now();
    let waits = in_progress::Waits {
        in_progress: &mut report.in_progress,
        deadlocks: &mut report.deadlocks,
    };
    let named = name_rows(
        &mut report.locks,
        waits,
        snapshot,
        (collected, functions),
        &options,
    );
    let space = named.space;
    if let Some(stacks) = named.stacks {
        report.stacks = stacks;
    }
    if named.sites_not_recorded > 0 {
        report
            .dropped
            .insert(DropReason::SitesNotRecorded, named.sites_not_recorded);
    }
    kernel_locks::name(report, &space, collected);
    let stripped = stripped_modules(report, &space);
    let stripped_lookups = stripped_lookups(&stripped, &space);
    let skipped_files = skipped_files(&space, &snapshot.files);
    report.naming = Some(Naming {
        elapsed_ms: started.elapsed().as_secs_f64() * 1e3,
        modules: space.modules.len(),
        debug_files: space
            .modules
            .iter()
            .filter_map(|m| {
                m.symbols
                    .debug_file
                    .as_ref()
                    .map(|d| format!("{} <- {d}", m.path))
            })
            .collect(),
        pointer_chains: named.pointer_chains,
        stripped,
        stripped_lookups,
        debug_info: named.debug_info,
        live: (snapshot.ongoing.stats.searches > 0).then(|| snapshot.ongoing.stats.clone()),
        skipped_files,
    });
}

/// Names `locks` as [`annotate`] names a report's rows (region, module,
/// symbol, pointer chain or creation site, callers, holders) and returns
/// their stacks (none without `stacks_per_lock`). For `live`, which names
/// a few locks per interval apart from its report's rows.
pub(crate) fn name_locks(
    locks: &mut [Lock],
    snapshot: &mut Snapshot,
    collected: &Collected,
    functions: &[LockFunction],
    options: &NamingOptions,
) -> Vec<LockStack> {
    let waits = in_progress::Waits::default();
    let named = name_rows(locks, waits, snapshot, (collected, functions), options);
    named.stacks.unwrap_or_default()
}

/// What naming a set of locks found besides their own fields.
struct RowsNamed {
    /// The target's address space they were named in.
    space: AddressSpace,
    /// With `stacks_per_lock`: the locks' stacks.
    stacks: Option<Vec<LockStack>>,
    /// Acquisitions of unnamed locks whose creation site did not fit the
    /// map (the report's `dropped.sites_not_recorded`).
    sites_not_recorded: u64,
    pointer_chains: PointerChains,
    /// DWARF read to name them (`naming.debug_info`).
    debug_info: Vec<String>,
}

/// Names `locks` and, as their rows call them, the locks of `waits`: the
/// part of [`annotate`] that fills in each lock, in its order.
fn name_rows(
    locks: &mut [Lock],
    waits: in_progress::Waits<'_>,
    snapshot: &mut Snapshot,
    (collected, functions): (&Collected, &[LockFunction]),
    options: &NamingOptions,
) -> RowsNamed {
    // A new process that got the target's pid is not read.
    let alive = target::is_running(snapshot.pid, snapshot.start_time);
    if alive {
        snapshot.refresh();
    }
    let mut space = address_space(snapshot, alive);
    debuginfod_files(&mut space, snapshot, locks, collected, alive);
    let callers = callers_by_lock(&space, collected, functions);

    let mut namer = names::Namer::new(&space, &snapshot.files);
    name_globals(locks, &space, &mut namer, callers, |lock| {
        lock.lifetime.is_none()
    });
    let heap_locks = heap_locks_to_chain(locks);
    let (found, pointer_chains) = heap_chains(&space, snapshot, &heap_locks, alive);
    name_by_chains(locks, &found, &mut namer);
    declared::mark_contention(locks);
    in_progress::name(locks, waits, &space, &mut namer, &snapshot.threads.names);
    let debug_info = namer.debug_info_used();
    drop(namer);

    name_ended_lifetimes(locks, snapshot, collected, functions);
    let stacks = (options.stacks_per_lock > 0).then(|| {
        let rows: BTreeMap<u64, u64> = locks
            .iter()
            .map(|lock| (lock.address, lock.kind.span()))
            .collect();
        let routes = options.route_names.as_ref();
        let stacks = resolve_stacks(
            &space,
            collected,
            functions,
            &rows,
            (options.stacks_per_lock, routes),
        );
        attribute_futex_waits(locks, &space, collected);
        stacks
    });
    // Init calls are snapshotted with or without the stacks (`record`).
    let sites_not_recorded = creation::apply(locks, &space, collected, options.stacks_per_lock > 0);
    holders::name(locks, &space, collected, &snapshot.threads, |space, ip| {
        resolve_code(space, ip, true)
    });
    RowsNamed {
        space,
        stacks,
        sites_not_recorded,
        pointer_chains,
        debug_info,
    }
}

/// Every file naming did not read fully, once each: corrupt headers, DWARF
/// over the caps, files that shrank under their mapping.
fn skipped_files(
    space: &AddressSpace,
    files: &BTreeMap<String, Arc<ModuleFile>>,
) -> Vec<SkippedFile> {
    let shrunk = files
        .iter()
        .filter(|(_, file)| file.shrank())
        .map(|(path, _)| SkippedFile {
            file: path.clone(),
            reason: SkipReason::ShrankWhileRead,
            detail: "truncated or rewritten in place during the recording".into(),
        });
    // DWARF is read from the file as opened (a map_files link): say the
    // module's path instead.
    let module_path = |opened: &str| {
        files
            .iter()
            .find(|(_, file)| file.shown() == opened)
            .map(|(path, _)| path.clone())
    };
    let dwarf = dwarf::skipped().into_iter().map(|mut skipped| {
        if let Some(path) = module_path(&skipped.file) {
            skipped.file = path;
        }
        skipped
    });
    let mut all: Vec<SkippedFile> = space
        .skipped
        .iter()
        .cloned()
        .chain(dwarf)
        .chain(shrunk)
        .collect();
    all.sort_by(|a, b| (&a.file, a.reason as u8).cmp(&(&b.file, b.reason as u8)));
    all.dedup_by(|a, b| a.file == b.file && a.reason == b.reason);
    all
}

/// The target's address space: the one built during the recording when no
/// module came since, else built now from the snapshot.
fn address_space(snapshot: &mut Snapshot, alive: bool) -> AddressSpace {
    let root = alive.then(|| target::proc_root(snapshot.pid));
    let mut space = match snapshot.ongoing.take_space(snapshot.files.len()) {
        Some(mut space) => {
            space.maps = snapshot.maps.clone();
            space
        }
        None => AddressSpace::build_cached(
            snapshot.maps.clone(),
            &snapshot.files,
            root.as_deref(),
            &mut snapshot.symbols,
        ),
    };
    space.thread_stacks = snapshot.thread_stacks.clone();
    space
}

/// With `$DEBUGINFOD_URLS` set, debug files from its servers for the
/// stripped modules without a local one that hold a lock or a caller.
fn debuginfod_files(
    space: &mut AddressSpace,
    snapshot: &Snapshot,
    locks: &[Lock],
    collected: &Collected,
    alive: bool,
) {
    let Some(mut client) = debuginfod::Client::from_env() else {
        return;
    };
    let root = alive.then(|| target::proc_root(snapshot.pid));
    let addresses: Vec<u64> = locks
        .iter()
        .map(|lock| lock.address)
        .chain(
            collected
                .callers
                .keys()
                .map(|key| key.return_ip.wrapping_sub(1)),
        )
        .collect();
    debuginfod::add_debug_files(
        space,
        &snapshot.files,
        root.as_deref(),
        &addresses,
        &mut client,
    );
}

/// Each lock's call sites, resolved to functions; calls made by a lock
/// function itself are not callers.
fn callers_by_lock(
    space: &AddressSpace,
    collected: &Collected,
    functions: &[LockFunction],
) -> HashMap<u64, CallSites> {
    let mut callers: HashMap<u64, CallSites> = HashMap::new();
    for (key, &count) in &collected.callers {
        if is_nested_call(key, collected, functions) {
            continue;
        }
        let frame = resolve_code(space, key.return_ip, true);
        *callers
            .entry(key.lock)
            .or_default()
            .entry((frame.function, frame.module, frame.offset))
            .or_insert(0) += count;
    }
    callers
}

/// Region, module and symbol of every lock `which` selects, and its callers.
fn name_globals(
    locks: &mut [Lock],
    space: &AddressSpace,
    namer: &mut names::Namer,
    mut callers: HashMap<u64, CallSites>,
    which: impl Fn(&Lock) -> bool,
) {
    for lock in locks.iter_mut().filter(|lock| which(lock)) {
        let address = lock.shown_address();
        lock.region = space.region_of(address);
        if let Some(module) = space.module_of(address) {
            lock.module = Some(module.path.clone());
            if let Some(named) = namer.global(module, module.link_address(address), lock.kind) {
                lock.name = Some(named.name);
                lock.offset_name = Some(named.offset_name);
                lock.chain = Some(named.chain);
                lock.declared = named.declared;
            }
        }
        lock.callers = sorted_callers(callers.remove(&lock.address).unwrap_or_default());
    }
}

/// Locks whose memory went away during the recording (a library unloaded,
/// an exec) are named from the mappings that were there before.
fn name_ended_lifetimes(
    locks: &mut [Lock],
    snapshot: &Snapshot,
    collected: &Collected,
    functions: &[LockFunction],
) {
    if locks.iter().all(|lock| lock.lifetime.is_none()) {
        return;
    }
    // A module that held a lock but was never seen (loaded and unloaded
    // between two reads of the maps): what is mapped there now is another.
    for lock in locks.iter_mut() {
        if let Some(ended) = &mut lock.lifetime
            && !ended.by_exec
        {
            ended.module_unseen =
                snapshot.module_unseen(tracer_common::lifetime::split(lock.address).0);
        }
    }
    let past = AddressSpace::build(snapshot.past_maps(), &snapshot.files, None);
    let callers = callers_by_lock(&past, collected, functions);
    let mut namer = names::Namer::new(&past, &snapshot.files);
    name_globals(locks, &past, &mut namer, callers, |lock| {
        lock.lifetime.is_some_and(|ended| !ended.module_unseen)
    });
}

/// The top unnamed locks in heap-like memory: those a pointer chain from a
/// global may name.
fn heap_locks_to_chain(locks: &[Lock]) -> Vec<u64> {
    locks
        .iter()
        .filter(|lock| lock.lifetime.is_none())
        .filter(|lock| lock.name.is_none() && lock.region.is_heap())
        .take(CHAIN_SEARCH_LOCKS)
        .map(|lock| lock.address)
        .collect()
}

/// Pointer chains to the heap locks (searched now if the target is alive,
/// plus those found during the recording), and a line saying how it went.
fn heap_chains(
    space: &AddressSpace,
    snapshot: &Snapshot,
    heap_locks: &[u64],
    alive: bool,
) -> (BTreeMap<u64, Vec<chain::RawChain>>, PointerChains) {
    let ongoing = &snapshot.ongoing;
    if heap_locks.is_empty() {
        return (BTreeMap::new(), PointerChains::NoHeapLocks);
    }
    if !alive {
        let named_during_recording = heap_locks
            .iter()
            .filter(|lock| ongoing.found.contains_key(lock))
            .count();
        let of = heap_locks.len();
        let message = if named_during_recording > 0 {
            PointerChains::NamedBeforeExit {
                named: named_during_recording,
                of,
            }
        } else {
            PointerChains::TargetExited { of }
        };
        return (ongoing.found.clone(), message);
    }
    let outcome = chain::search(
        space,
        &crate::probe::memory::ProcessMemory::new(snapshot.pid),
        heap_locks,
    );
    let mut found = ongoing.found.clone();
    let named_now = outcome.chains.len();
    // Routes read now are the current ones; those from the recording fill in.
    found.extend(outcome.chains);
    let named = heap_locks.iter().filter(|l| found.contains_key(l)).count();
    let message = PointerChains::Searched(ChainSearch {
        named,
        of: heap_locks.len(),
        named_now,
        pointers_followed: outcome.pointers_followed,
        elapsed_ms: u64::try_from(outcome.elapsed.as_millis()).unwrap_or(u64::MAX),
        complete: outcome.complete,
        max_hops: chain::MAX_HOPS,
        max_field_offset: chain::MAX_FIELD_OFFSET,
    });
    (found, message)
}

/// Names still-unnamed locks by the best of their pointer chains.
fn name_by_chains(
    locks: &mut [Lock],
    found: &BTreeMap<u64, Vec<chain::RawChain>>,
    namer: &mut names::Namer,
) {
    for lock in locks {
        let Some(candidates) = found.get(&lock.address) else {
            continue;
        };
        if lock.name.is_some() {
            continue;
        }
        if let Some((best, runner_up)) = namer.choose(candidates, lock.kind) {
            lock.alternatives = runner_up.iter().map(names::Named::alternative).collect();
            lock.name = Some(best.name);
            lock.offset_name = Some(best.offset_name);
            lock.chain = Some(best.chain);
            lock.declared = best.declared;
        }
    }
}

/// Stripped modules that left a lock, a caller or a frame (of a stack or a
/// creation site) in the report unnamed.
fn stripped_modules(report: &Report, space: &AddressSpace) -> Vec<String> {
    let unnamed_frame = |frames: &[Frame], path: &str| {
        frames
            .iter()
            .any(|f| f.function.is_none() && f.module.as_deref() == Some(path))
    };
    let unnamed_in = |path: &str| {
        report.locks.iter().any(|lock| {
            (lock.name.is_none() && lock.module.as_deref() == Some(path))
                || lock
                    .callers
                    .iter()
                    .any(|c| c.function.is_none() && c.module.as_deref() == Some(path))
                || lock
                    .created
                    .as_ref()
                    .is_some_and(|created| unnamed_frame(&created.site, path))
        }) || report
            .stacks
            .iter()
            .any(|stack| unnamed_frame(&stack.frames, path))
    };
    space
        .modules
        .iter()
        .filter(|m| !m.symbols.has_symtab && unnamed_in(&m.path))
        .map(|m| m.path.clone())
        .collect()
}

/// What each stripped module's debug file is found by, for the footer's
/// line on what would name its frames.
fn stripped_lookups(stripped: &[String], space: &AddressSpace) -> Vec<StrippedModule> {
    let debuginfod = debuginfod::Client::from_env().is_some();
    stripped
        .iter()
        .filter_map(|path| space.modules.iter().find(|m| &m.path == path))
        .map(|module| StrippedModule {
            module: module.path.clone(),
            build_id: module.symbols.build_id.as_deref().map(elf::hex),
            debug_link: module.symbols.debug_link.clone(),
            debuginfod,
        })
        .collect()
}

/// The function holding a code address. A return address points after
/// its call, so the call site is looked up one byte before it.
fn resolve_code(space: &AddressSpace, ip: u64, is_return_address: bool) -> Frame {
    let lookup = if is_return_address {
        ip.wrapping_sub(1)
    } else {
        ip
    };
    let Some(module) = space.module_of(lookup) else {
        return Frame {
            function: None,
            module: None,
            offset: ip,
            php: None,
        };
    };
    match module.symbols.function_at(module.link_address(lookup)) {
        Some((symbol, _)) => Frame {
            function: Some(symbol.readable_name()),
            module: Some(module.path.clone()),
            offset: module.link_address(ip) - symbol.address,
            php: None,
        },
        None => Frame {
            function: None,
            module: Some(module.path.clone()),
            offset: module.link_address(ip),
            php: None,
        },
    }
}

/// Frames of lock implementations, skipped to find who wanted the lock.
const LOCK_MACHINERY: &[&str] = &[
    "syscall",
    "__lll_",
    "__futex",
    "futex",
    "pthread_",
    "std::sys::",
    "std::sync::",
    "core::",
    "parking_lot",
    "lock_api::",
    "runtime.",
];

/// Locks seen only as futex words (Rust's std Mutex, Go, parking_lot) have
/// no lock-function callers: their callers are the first frames outside the
/// lock machinery in the stacks of their futex waits (so they count
/// contended waits, not acquisitions).
fn attribute_futex_waits(locks: &mut [Lock], space: &AddressSpace, collected: &Collected) {
    let mut by_lock: HashMap<u64, CallSites> = HashMap::new();
    let waits = collected
        .stacks
        .iter()
        .filter(|(key, _)| key.return_ip == 0 && key.stack_id == stack_kind::USE);
    for (key, &count) in waits {
        let Some(unwound) = collected.unwound.get(key) else {
            continue;
        };
        for (stack, share) in weigh_snapshots(unwound, count) {
            let caller = stack
                .frames
                .iter()
                .skip(1)
                .map(|&ip| resolve_code(space, ip, true))
                .find(|frame| {
                    frame.function.as_deref().is_some_and(|f| {
                        // `<std::sys::…::Mutex>::lock_contended`: a
                        // method's type comes first, in angle brackets.
                        let f = f.trim_start_matches('<');
                        !LOCK_MACHINERY.iter().any(|prefix| f.starts_with(prefix))
                    })
                });
            if let Some(frame) = caller {
                *by_lock
                    .entry(key.lock)
                    .or_default()
                    .entry((frame.function, frame.module, frame.offset))
                    .or_insert(0) += share;
            }
        }
    }
    for lock in locks
        .iter_mut()
        .filter(|lock| lock.kind == LockKind::Futex && lock.callers.is_empty())
    {
        let Some(callers) = by_lock.remove(&lock.address) else {
            continue;
        };
        lock.callers = sorted_callers(callers);
    }
}

/// The outermost frame of a stack that ends where Go called C: the C code
/// runs on the thread's system stack (`runtime.asmcgocall` switched to
/// it), and the Go frames that called it are on the goroutine's stack,
/// which the unwinding does not follow.
pub(crate) const CGO_BOUNDARY_FRAME: &str = "[cgo boundary]";

/// Ends `frames` with [`CGO_BOUNDARY_FRAME`] when its outermost frame is
/// Go's switch to the system stack for a cgo call, so the stack says why
/// it stops there.
fn mark_cgo_boundary(frames: &mut Vec<Frame>) {
    let at_boundary = frames
        .last()
        .and_then(|frame| frame.function.as_deref())
        .is_some_and(|function| function.starts_with("runtime.asmcgocall"));
    if at_boundary {
        frames.push(Frame {
            function: Some(CGO_BOUNDARY_FRAME.into()),
            module: None,
            offset: 0,
            php: None,
        });
    }
}

/// Resolved frames of one unwound stack: the first is the probed (or
/// interrupted) instruction, the rest return addresses, up to the first
/// that is not code (a frame-pointer fallback through code without them),
/// marked where a cgo call's stack ends ([`CGO_BOUNDARY_FRAME`]).
fn resolve_frames(space: &AddressSpace, ips: &[u64]) -> Vec<Frame> {
    let mut frames = Vec::with_capacity(ips.len());
    for (index, &ip) in ips.iter().enumerate() {
        let is_code = space
            .maps
            .iter()
            .any(|m| m.contains(ip) && m.is_executable());
        if index > 0 && !is_code {
            break;
        }
        frames.push(resolve_code(space, ip, index > 0));
    }
    mark_cgo_boundary(&mut frames);
    frames
}

/// The executor's loop: PHP frames run inside the innermost of these.
const PHP_EXECUTOR: [&str; 3] = ["execute_ex", "zend_execute", "dtrace_execute_ex"];

/// An unwound stack's frames, resolved, with its PHP frames (`--php`)
/// where they run: inside the innermost executor frame, so the stack reads
/// root first as native frames down to the executor, the PHP frames, then
/// the C code PHP called down to the lock. Without an executor frame (a
/// stack cut short) they go at the outer end.
fn resolve_stack(space: &AddressSpace, stack: &UnwoundStack) -> Vec<Frame> {
    let mut frames = resolve_frames(space, &stack.frames);
    if stack.php.is_empty() {
        return frames;
    }
    let executor = frames
        .iter()
        .position(|frame| {
            frame
                .function
                .as_deref()
                .is_some_and(|name| PHP_EXECUTOR.contains(&name))
        })
        .unwrap_or(frames.len());
    let php = stack.php.iter().map(|frame| Frame {
        function: Some(frame.function.clone()),
        module: None,
        offset: 0,
        php: Some(PhpLocation {
            file: frame.file.clone(),
            line: frame.line,
        }),
    });
    frames.splice(executor..executor, php);
    frames
}

/// The unwound stacks of one stack key with their share of its exact
/// `count`: a snapshot taken at the key's n-th count stands for the calls
/// up to the next snapshot's (the first also for any before it, whose
/// snapshots were lost), so the shares add up to `count`.
fn weigh_snapshots(unwound: &[UnwoundStack], count: u64) -> Vec<(&UnwoundStack, u64)> {
    let mut sorted: Vec<&UnwoundStack> = unwound.iter().collect();
    sorted.sort_by_key(|stack| stack.count_at);
    let mut shares = Vec::with_capacity(sorted.len());
    for (index, stack) in sorted.iter().enumerate() {
        let from = if index == 0 { 1 } else { stack.count_at };
        let until = sorted
            .get(index + 1)
            .map_or(count.saturating_add(1), |next| next.count_at);
        let share = until.saturating_sub(from);
        if share > 0 {
            shares.push((*stack, share));
        }
    }
    shares
}

/// Acquisitions per (lock, call site), nested calls left out as in the
/// lock's row.
fn acquisitions_by_call_site(
    collected: &Collected,
    functions: &[LockFunction],
) -> HashMap<(u64, u64), u64> {
    let mut acquired = HashMap::new();
    for (key, &count) in &collected.callers {
        if !is_nested_call(key, collected, functions) {
            *acquired.entry((key.lock, key.return_ip)).or_insert(0) += count;
        }
    }
    acquired
}

/// `acquired × hits / all_hits`: one key's part of its call site's
/// acquisitions (all of them when the site has one key and no nested calls).
fn share_of(acquired: u64, hits: u64, all_hits: u64) -> u64 {
    if all_hits == 0 || acquired == all_hits {
        return hits.min(acquired);
    }
    (u128::from(acquired) * u128::from(hits) / u128::from(all_hits)) as u64
}

/// `shares` (adding up to some total) scaled to add up to `target`
/// exactly: largest remainders get the units left over.
fn scale_shares<T: Copy>(shares: Vec<(T, u64)>, target: u64) -> Vec<(T, u64)> {
    let total: u64 = shares.iter().map(|(_, share)| share).sum();
    if total == target || total == 0 {
        return shares;
    }
    let exact: Vec<(u64, u128)> = shares
        .iter()
        .map(|(_, share)| {
            let product = u128::from(*share) * u128::from(target);
            (
                (product / u128::from(total)) as u64,
                product % u128::from(total),
            )
        })
        .collect();
    let mut left = target.saturating_sub(exact.iter().map(|(whole, _)| whole).sum::<u64>());
    let mut order: Vec<usize> = (0..exact.len()).collect();
    order.sort_by_key(|&index| std::cmp::Reverse(exact[index].1));
    let mut scaled: Vec<(T, u64)> = shares
        .iter()
        .zip(&exact)
        .map(|((frames, _), (whole, _))| (*frames, *whole))
        .collect();
    for index in order {
        if left == 0 {
            break;
        }
        scaled[index].1 += 1;
        left -= 1;
    }
    scaled.retain(|(_, share)| *share > 0);
    scaled
}

/// The top stacks of each lock, innermost frame first, frames resolved:
/// the top `per_lock` of its lock calls and waits, and as many of its CPU
/// samples (`rows`: the report's rows, address to span, which the
/// sampler's addresses fold into as its samples do); with `--php`, each
/// split by the route its snapshots were taken in (`routes`: key to name).
fn resolve_stacks(
    space: &AddressSpace,
    collected: &Collected,
    functions: &[LockFunction],
    rows: &BTreeMap<u64, u64>,
    (per_lock, routes): (usize, Option<&HashMap<u64, String>>),
) -> Vec<LockStack> {
    let route_of = |stack: &UnwoundStack| routes.and_then(|names| names.get(&stack.route)).cloned();
    let mut by_lock: BTreeMap<u64, Vec<LockStack>> = BTreeMap::new();
    let acquired = acquisitions_by_call_site(collected, functions);
    let uses = collected
        .stacks
        .iter()
        .filter(|(key, _)| key.stack_id == stack_kind::USE);
    // A call site's keys (one per PHP call site with `--php`) share its hits.
    let mut site_hits: HashMap<(u64, u64), u64> = HashMap::new();
    for (key, &hits) in uses.clone() {
        *site_hits.entry((key.lock, key.return_ip)).or_insert(0) += hits;
    }
    for (key, &hits) in uses {
        // A call site's probe hits include lock functions tail-called or
        // called by the one it called (musl's lock jumps to timedlock):
        // its stacks share its acquisitions, as the lock's row counts them.
        let count = match key.return_ip {
            0 => hits,
            return_ip => {
                let acquired = acquired.get(&(key.lock, return_ip)).copied().unwrap_or(0);
                let all_hits = site_hits.get(&(key.lock, return_ip)).copied().unwrap_or(0);
                share_of(acquired, hits, all_hits)
            }
        };
        if count == 0 {
            continue;
        }
        let stacks = by_lock.entry(key.lock).or_default();
        // A lock call's first frame is the probe point in the lock
        // function: which of its points fired says nothing to a reader,
        // and stacks that differ only there are one.
        let lock_call = key.return_ip != 0;
        let source = if lock_call {
            StackOrigin::LockCalls
        } else {
            StackOrigin::Waits
        };
        let mut push = |mut frames: Vec<Frame>, count, unwound_by, stack: Option<&UnwoundStack>| {
            if let (true, Some(first)) = (lock_call, frames.first_mut()) {
                first.offset = 0;
            }
            stacks.push(LockStack {
                lock: key.lock,
                count,
                frames,
                unwound_by,
                source: Some(source),
                route: stack.and_then(route_of),
                ended_by: stack.and_then(|stack| stack.ended_by),
            });
        };
        match collected.unwound.get(key) {
            Some(unwound) => {
                let shares = scale_shares(weigh_snapshots(unwound, hits), count);
                for (stack, share) in shares {
                    push(
                        resolve_stack(space, stack),
                        share,
                        StackSource::CallFrameInfo,
                        Some(stack),
                    );
                }
            }
            // Every snapshot of the key was lost (ring buffer full): the
            // immediate caller is still known, and exact.
            None if lock_call => push(
                vec![resolve_code(space, key.return_ip, true)],
                count,
                StackSource::CallerOnly,
                None,
            ),
            None => {}
        }
    }
    for stack in cpu_stacks(space, collected, rows, &route_of)
        .into_iter()
        .chain(sampled_stacks(space, collected, &route_of))
    {
        by_lock.entry(stack.lock).or_default().push(stack);
    }
    top_of_each_kind(by_lock, per_lock)
}

/// Each lock's top `per_lock` stacks of lock calls and waits, then of the
/// stubs' samples, then of CPU samples: each its own top N (their counts
/// are of different things).
fn top_of_each_kind(by_lock: BTreeMap<u64, Vec<LockStack>>, per_lock: usize) -> Vec<LockStack> {
    let mut out = Vec::new();
    for (_, stacks) in by_lock {
        let (cpu, rest): (Vec<LockStack>, Vec<LockStack>) =
            stacks.into_iter().partition(LockStack::is_cpu);
        let (sampled, uses): (Vec<LockStack>, Vec<LockStack>) = rest
            .into_iter()
            .partition(|stack| stack.source == Some(StackOrigin::SampledLockCalls));
        for stacks in [uses, sampled, cpu] {
            out.extend(top_stacks(stacks, per_lock));
        }
    }
    out
}

/// Stacks of the inproc stubs' sampled acquisitions
/// (`stack_kind::INPROC_SAMPLE`): each key's samples, never scaled to
/// the call site's acquisitions (its row has them exactly), split among
/// its snapshots' stacks. The first frame is the lock function called
/// (the op the stub passed), then its caller: the sample's stack is the
/// one right after the call returned.
fn sampled_stacks(
    space: &AddressSpace,
    collected: &Collected,
    route_of: &dyn Fn(&UnwoundStack) -> Option<String>,
) -> Vec<LockStack> {
    let mut stacks = Vec::new();
    let sampled = collected
        .stacks
        .iter()
        .filter(|(key, _)| stack_kind::is_inproc_sample(key.stack_id));
    for (key, &samples) in sampled {
        let op = u32::try_from(key.stack_id - stack_kind::INPROC_SAMPLE)
            .ok()
            .and_then(LockOp::from_index);
        let called = Frame {
            function: op.map(|op| op.symbol().to_string()),
            module: None,
            offset: 0,
            php: None,
        };
        let mut push = |stack: Option<&UnwoundStack>, count, unwound_by| {
            let mut frames = vec![called.clone()];
            match stack {
                Some(stack) => {
                    let mut resolved = resolve_stack(space, stack);
                    // The first address is a return address, not the ip
                    // of an instruction that ran.
                    if let (Some(first), Some(&ip)) = (resolved.first_mut(), stack.frames.first())
                        && first.php.is_none()
                    {
                        *first = resolve_code(space, ip, true);
                    }
                    frames.extend(resolved);
                }
                None => frames.push(resolve_code(space, key.return_ip, true)),
            }
            stacks.push(LockStack {
                lock: key.lock,
                count,
                frames,
                unwound_by,
                source: Some(StackOrigin::SampledLockCalls),
                route: stack.and_then(route_of),
                ended_by: stack.and_then(|stack| stack.ended_by),
            });
        };
        match collected.unwound.get(key) {
            Some(unwound) => {
                for (stack, share) in weigh_snapshots(unwound, samples) {
                    push(Some(stack), share, StackSource::CallFrameInfo);
                }
            }
            None => push(None, samples, StackSource::CallerOnly),
        }
    }
    stacks
}

/// The `per_lock` stacks of most counts, the same resolved stack from
/// several raw ones added up. Stacks split by route count together in the
/// ranking (the same stacks are kept as without routes), each route's part
/// kept apart, most first.
fn top_stacks(mut stacks: Vec<LockStack>, per_lock: usize) -> Vec<LockStack> {
    /// A stack whatever its route: what it counts and its frames.
    type Whole = (Option<StackOrigin>, Vec<Frame>);
    let key = |stack: &LockStack| -> Whole { (stack.source, stack.frames.clone()) };
    /// What tells two stacks apart (their count aside).
    fn identity(stack: &LockStack) -> StackIdentity<'_> {
        (
            stack.source,
            &stack.frames,
            stack.route.as_deref(),
            stack.ended_by,
        )
    }
    type StackIdentity<'a> = (
        Option<StackOrigin>,
        &'a [Frame],
        Option<&'a str>,
        Option<StackEnd>,
    );
    stacks.sort_by(|a, b| identity(a).cmp(&identity(b)));
    stacks.dedup_by(|later, earlier| {
        let same = identity(later) == identity(earlier);
        if same {
            earlier.count += later.count;
        }
        same
    });
    let mut totals: BTreeMap<Whole, u64> = BTreeMap::new();
    for stack in &stacks {
        *totals.entry(key(stack)).or_insert(0) += stack.count;
    }
    let mut ranked: Vec<(&Whole, &u64)> = totals.iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    let rank: BTreeMap<&Whole, usize> = ranked
        .iter()
        .enumerate()
        .map(|(index, (key, _))| (*key, index))
        .collect();
    let mut kept: Vec<(usize, LockStack)> = stacks
        .iter()
        .filter_map(|stack| {
            let index = rank[&key(stack)];
            (index < per_lock).then(|| (index, stack.clone()))
        })
        .collect();
    kept.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.count.cmp(&a.1.count)));
    kept.into_iter().map(|(_, stack)| stack).collect()
}

/// The frame that stands for the kernel's futex code at the top of a
/// stack of CPU samples taken inside a futex syscall.
pub(crate) const KERNEL_FUTEX_FRAME: &str = "[kernel] futex";

/// Stacks of the CPU sampler's lock-code samples (`stack_kind::CPU_USER`,
/// `CPU_KERNEL`), under the row each sample counts in: the samples of a
/// key share its exact count, so a row's CPU stacks add up to its samples.
/// The interrupted instruction's offset is dropped (stacks that differ
/// only there are one); a sample inside a futex syscall gets
/// [`KERNEL_FUTEX_FRAME`] on top of the user frames.
fn cpu_stacks(
    space: &AddressSpace,
    collected: &Collected,
    rows: &BTreeMap<u64, u64>,
    route_of: &dyn Fn(&UnwoundStack) -> Option<String>,
) -> Vec<LockStack> {
    let mut stacks = Vec::new();
    let samples = collected.stacks.iter().filter(|(key, _)| {
        key.stack_id == stack_kind::CPU_USER || key.stack_id == stack_kind::CPU_KERNEL
    });
    for (key, &count) in samples {
        let Some(lock) = crate::model::address::row_holding(rows, key.lock, |&span| span) else {
            continue;
        };
        let in_kernel = key.stack_id == stack_kind::CPU_KERNEL;
        let mut push = |stack: Option<&UnwoundStack>, count, unwound_by| {
            let mut frames = Vec::new();
            if in_kernel {
                frames.push(Frame {
                    function: Some(KERNEL_FUTEX_FRAME.into()),
                    module: None,
                    offset: 0,
                    php: None,
                });
            }
            if let Some(stack) = stack {
                frames.extend(resolve_stack(space, stack));
            }
            if let Some(first) = frames.first_mut() {
                first.offset = 0;
            }
            stacks.push(LockStack {
                lock,
                count,
                frames,
                unwound_by,
                source: Some(StackOrigin::CpuSamples),
                route: stack.and_then(route_of),
                ended_by: stack.and_then(|stack| stack.ended_by),
            });
        };
        match collected.unwound.get(key) {
            Some(unwound) => {
                for (stack, share) in weigh_snapshots(unwound, count) {
                    push(Some(stack), share, StackSource::CallFrameInfo);
                }
            }
            None => push(None, count, StackSource::NoSnapshot),
        }
    }
    stacks
}

#[cfg(test)]
mod stack_share_tests {
    use super::*;

    /// A stack whose outermost frame is Go's cgo switch ends in the
    /// marker; one that ends elsewhere (or already past it) does not.
    #[test]
    fn a_stack_ending_in_a_cgo_call_is_marked() {
        let names = |frames: &[Frame]| -> Vec<String> {
            frames.iter().filter_map(|f| f.function.clone()).collect()
        };
        let mut frames = vec![
            Frame::named("pthread_mutex_lock"),
            Frame::named("stats_add"),
            Frame::named("runtime.asmcgocall.abi0"),
        ];
        mark_cgo_boundary(&mut frames);
        assert_eq!(
            names(&frames),
            [
                "pthread_mutex_lock",
                "stats_add",
                "runtime.asmcgocall.abi0",
                CGO_BOUNDARY_FRAME
            ]
        );
        let mut go = vec![
            Frame::named("runtime.asmcgocall"),
            Frame::named("main.main"),
        ];
        mark_cgo_boundary(&mut go);
        assert_eq!(names(&go), ["runtime.asmcgocall", "main.main"]);
        let mut empty = Vec::new();
        mark_cgo_boundary(&mut empty);
        assert!(empty.is_empty());
    }

    fn at(count_at: u64, frame: u64) -> UnwoundStack {
        UnwoundStack {
            count_at,
            frames: vec![frame],
            php: Vec::new(),
            route: 0,
            ended_by: None,
        }
    }

    /// Each snapshot stands for the calls up to the next one; the shares add
    /// up to the exact count even when early snapshots were lost.
    #[test]
    fn snapshot_shares_add_up_to_the_exact_count() {
        let unwound = [at(4, 2), at(1, 1), at(40, 3)];
        let shares: Vec<(u64, u64)> = weigh_snapshots(&unwound, 100)
            .into_iter()
            .map(|(stack, share)| (stack.frames[0], share))
            .collect();
        assert_eq!(shares, [(1, 3), (2, 36), (3, 61)]);
        let lost_first = [at(8, 1), at(16, 2)];
        let shares: Vec<u64> = weigh_snapshots(&lost_first, 20)
            .into_iter()
            .map(|(_, share)| share)
            .collect();
        assert_eq!(shares, [15, 5]);
        // Two CPUs read the same count: one snapshot stands for it.
        let same = [at(1, 1), at(1, 2), at(2, 3)];
        let total: u64 = weigh_snapshots(&same, 9).iter().map(|(_, s)| s).sum();
        assert_eq!(total, 9);
    }

    /// Scaled to a smaller exact total (a call site's acquisitions, its
    /// probe hits counting tail-called lock functions too), still exact.
    #[test]
    fn shares_scale_to_the_acquisitions_exactly() {
        let (a, b, c) = ([1u64], [2u64], [3u64]);
        let shares = vec![(&a[..], 5), (&b[..], 3), (&c[..], 2)];
        let scaled: Vec<u64> = scale_shares(shares, 7)
            .into_iter()
            .map(|(_, share)| share)
            .collect();
        assert_eq!(scaled.iter().sum::<u64>(), 7);
        assert_eq!(scaled, [4, 2, 1]);
    }
}
