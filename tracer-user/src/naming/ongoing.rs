//! Pointer chains searched during the recording, while the target is alive:
//! the heap locks the BPF maps have seen are looked for shortly after they
//! first appear (and retried about once a second), so a target that exits
//! before the recording ends keeps its heap names. Each search is bounded in
//! time and locks; the report's `naming.live` says what it cost.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use aya::Ebpf;

use super::{
    chain::{self, RawChain},
    region::AddressSpace,
};
use crate::{
    model::LiveNaming,
    probe::{modules::ModuleFile, target::Mapping},
    trace::live_keys::LiveKeys,
};

/// CPU time one search may take (the recording's tick waits for it; see
/// [`chain::TIME_BUDGET`] for why CPU time).
const SEARCH_BUDGET: Duration = Duration::from_millis(250);
/// Heap locks looked for per search.
const LOCKS_PER_SEARCH: usize = super::CHAIN_SEARCH_LOCKS;
/// Searches per lock before it is given up (its pointer may be stored after its first use).
const MAX_ATTEMPTS: u8 = 3;
const RETRY_EVERY: Duration = Duration::from_secs(1);
const MIN_KEY_READ_INTERVAL: Duration = Duration::from_millis(200);

pub(crate) struct OngoingNames {
    keys: Option<LiveKeys>,
    space: Option<AddressSpace>,
    /// Module files known when `space` was built.
    modules_seen: usize,
    attempts: HashMap<u64, u8>,
    /// Addresses seen that are not heap locks.
    ignored: HashSet<u64>,
    /// Candidate chains found per heap lock.
    pub found: BTreeMap<u64, Vec<RawChain>>,
    last_keys: Option<Instant>,
    key_interval: Duration,
    last_retry: Option<Instant>,
    pub stats: LiveNaming,
}

impl Default for OngoingNames {
    fn default() -> Self {
        OngoingNames {
            keys: None,
            space: None,
            modules_seen: 0,
            attempts: HashMap::new(),
            ignored: HashSet::new(),
            found: BTreeMap::new(),
            last_keys: None,
            key_interval: MIN_KEY_READ_INTERVAL,
            last_retry: None,
            stats: LiveNaming::default(),
        }
    }
}

impl OngoingNames {
    /// Watches the lock and futex maps of a loaded BPF object.
    pub(crate) fn watch(ebpf: &Ebpf) -> OngoingNames {
        OngoingNames {
            keys: LiveKeys::open(ebpf),
            ..OngoingNames::default()
        }
    }

    /// Reads every module's symbols once, before the target's work is
    /// traced: needed the moment a heap lock appears, and by naming at the end.
    pub(crate) fn prepare(
        &mut self,
        pid: u32,
        maps: &[Mapping],
        files: &BTreeMap<String, Arc<ModuleFile>>,
    ) {
        let started = Instant::now();
        let root = crate::probe::target::proc_root(pid);
        self.modules_seen = files.len();
        self.space = Some(AddressSpace::build(
            maps.to_vec(),
            files,
            Some(root.as_path()),
        ));
        self.stats.elapsed_ms += started.elapsed().as_secs_f64() * 1e3;
    }

    /// The address space built for the searches, if it covers `modules` module files.
    pub(crate) fn take_space(&mut self, modules: usize) -> Option<AddressSpace> {
        self.space.take().filter(|_| self.modules_seen == modules)
    }

    /// Called on every recording tick (200 ms): reads the maps' keys when
    /// due, and searches chains for heap locks not searched yet.
    pub(crate) fn tick(
        &mut self,
        pid: u32,
        maps: &[Mapping],
        files: &BTreeMap<String, Arc<ModuleFile>>,
        thread_stacks: &BTreeMap<u64, u64>,
    ) {
        if self.keys.is_none() {
            return;
        }
        let now = Instant::now();
        if self
            .last_keys
            .is_some_and(|last| now.duration_since(last) < self.key_interval)
        {
            return;
        }
        self.last_keys = Some(now);
        if self.space.is_none() {
            self.prepare(pid, maps, files);
        }
        let work_started = Instant::now();
        let mut seen = self.keys.as_ref().map(LiveKeys::read).unwrap_or_default();
        // Big maps are read less often: reading keys costs syscalls per key.
        self.key_interval = MIN_KEY_READ_INTERVAL.max(work_started.elapsed() * 20);
        let retry_due = self
            .last_retry
            .is_none_or(|last| now.duration_since(last) >= RETRY_EVERY);
        if !self.has_work(&seen, maps, retry_due) {
            return;
        }
        let mut space = self.current_space(pid, maps, files);
        space.thread_stacks = thread_stacks.clone();
        seen.sort_by(|a, b| b.cmp(a));
        let batch = self.next_batch(&space, &seen, retry_due);
        if !batch.is_empty() {
            if retry_due {
                self.last_retry = Some(now);
            }
            self.search(&space, pid, &batch, work_started);
        }
        self.space = Some(space);
    }

    /// Whether a search is due: a key never searched, or retries due.
    /// Keys that cannot be heap memory (not writable, a file) are ignored.
    fn has_work(&mut self, seen: &[(u64, u64)], maps: &[Mapping], retry_due: bool) -> bool {
        let maybe_heap = |address: u64| {
            maps.iter()
                .any(|m| m.contains(address) && m.perms.starts_with("rw") && !m.is_file())
        };
        for &(_, address) in seen {
            if !maybe_heap(address) {
                self.ignored.insert(address);
            }
        }
        let is_new =
            |address: &u64| !self.attempts.contains_key(address) && !self.ignored.contains(address);
        let has_new = seen.iter().any(|(_, address)| is_new(address));
        let has_retries = self.attempts.values().any(|&tries| tries < MAX_ATTEMPTS);
        has_new || (retry_due && has_retries)
    }

    /// The address space for a search, rebuilt when modules came (taken out of `self.space`).
    fn current_space(
        &mut self,
        pid: u32,
        maps: &[Mapping],
        files: &BTreeMap<String, Arc<ModuleFile>>,
    ) -> AddressSpace {
        match self.space.take() {
            Some(mut space) if self.modules_seen == files.len() => {
                space.maps = maps.to_vec();
                space
            }
            _ => {
                let root = crate::probe::target::proc_root(pid);
                self.modules_seen = files.len();
                AddressSpace::build(maps.to_vec(), files, Some(root.as_path()))
            }
        }
    }

    /// The heaviest heap locks due a search (new, or a retry when due).
    fn next_batch(
        &mut self,
        space: &AddressSpace,
        seen: &[(u64, u64)],
        retry_due: bool,
    ) -> Vec<u64> {
        let mut batch = Vec::new();
        for &(_, address) in seen {
            if self.found.contains_key(&address) || self.ignored.contains(&address) {
                continue;
            }
            let tries = self.attempts.get(&address).copied().unwrap_or(0);
            if tries >= MAX_ATTEMPTS || (tries > 0 && !retry_due) {
                continue;
            }
            if !is_heap_lock(space, address) {
                self.ignored.insert(address);
                continue;
            }
            if batch.len() < LOCKS_PER_SEARCH {
                batch.push(address);
            }
        }
        batch
    }

    /// Searches chains to `batch` and keeps what was found, with the cost.
    fn search(&mut self, space: &AddressSpace, pid: u32, batch: &[u64], work_started: Instant) {
        let outcome = chain::search_within(
            space,
            &crate::probe::memory::ProcessMemory::new(pid),
            batch,
            SEARCH_BUDGET,
        );
        for &address in batch {
            *self.attempts.entry(address).or_insert(0) += 1;
        }
        self.found.extend(outcome.chains);
        self.stats.searches += 1;
        self.stats.elapsed_ms += work_started.elapsed().as_secs_f64() * 1e3;
        self.stats.max_search_ms = self
            .stats
            .max_search_ms
            .max(outcome.elapsed.as_secs_f64() * 1e3);
        self.stats.heap_locks_named = self.found.len();
        self.stats.heap_locks_seen = self.attempts.len();
    }
}

/// A lock on the heap (outside every module's data), where only a pointer chain names it.
fn is_heap_lock(space: &AddressSpace, address: u64) -> bool {
    space
        .module_of(address)
        .is_none_or(|module| module.spare_start() <= address)
        && space.region_of(address).is_heap()
}
