//! Pointer-chain naming for locks on the heap: which global variable's
//! pointers lead to the lock (`*g_stats->+0x148`), found by reading the
//! live target's memory breadth-first from its modules' data, with bounded
//! hops, field offsets, reads and time.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    time::{Duration, Instant},
};

use super::region::AddressSpace;
use crate::probe::memory::TargetMemory;

/// Pointer dereferences from the global to the lock.
pub(crate) const MAX_HOPS: usize = 3;
/// Largest field offset followed inside a pointed-to object.
pub(crate) const MAX_FIELD_OFFSET: u64 = 0x400;
/// CPU time the tracer's thread may spend on one search. CPU time, not wall
/// time: on a busy machine (the target's own threads, CI's CPU hogs) the
/// tracer waits for a core, and a wall-clock budget ran out before the
/// search had read what an idle machine reads in a few milliseconds.
pub(crate) const TIME_BUDGET: Duration = Duration::from_secs(2);
/// Wall time a search may take whatever its CPU time, as a multiple of its
/// budget, so a tracer starved of CPU still finishes its report.
const WALL_CLOCK_CEILING: u32 = 10;
const MAX_READS: usize = 200_000;

/// Routes kept per object and candidate chains kept per lock.
const MAX_ARRIVALS: usize = 4;
const MAX_CANDIDATES: usize = 8;

/// How the search went, for the report.
#[derive(Debug, Default, Clone)]
pub(crate) struct SearchOutcome {
    /// Candidate chains per lock, the structurally best first (see [`RawChain::rank`]).
    pub chains: BTreeMap<u64, Vec<RawChain>>,
    pub pointers_followed: usize,
    /// False when the time or read budget ran out first.
    pub complete: bool,
    pub elapsed: Duration,
}

/// One route from a global to a lock, in offsets: the pointer stored at
/// `offsets[0]` in the root variable points to an object, whose pointer at
/// `offsets[1]` points to the next, …; the lock is at the last offset of
/// the last object. `offsets.len() - 1` pointers are followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawChain {
    /// Path of the module holding the root variable.
    pub module: String,
    /// The root variable's symbol (as in the symbol table).
    pub root: String,
    /// Link-time address and size of the root symbol.
    pub root_address: u64,
    pub root_size: u64,
    pub offsets: Vec<u64>,
    /// 0: the root is in the executable, 1: in a library.
    pub origin_class: u8,
}

impl RawChain {
    pub(crate) fn hops(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The root variable's whole value is the first pointer (`g_stats`, not `g_core+0x30`).
    pub(crate) fn pointer_root(&self) -> bool {
        self.offsets.first() == Some(&0) && self.root_size == 8
    }

    /// Lower is better: ends right at the lock, a pointer variable as root,
    /// fewer hops, fewer non-zero offsets, the executable first.
    pub(crate) fn rank(&self) -> (bool, bool, usize, usize, u8) {
        (
            self.offsets.last().is_some_and(|&o| o != 0),
            !self.pointer_root(),
            self.hops(),
            self.offsets.iter().filter(|&&o| o != 0).count(),
            self.origin_class,
        )
    }

    /// Offset notation: `*g_stats->+0x20` (the lock the pointer at +0x20
    /// in `*g_stats` points to), `*g_core+0x30->+0x10`, `g_stats->+0x8` (a
    /// lock inside the object `g_stats` points to).
    pub(crate) fn offset_name(&self) -> String {
        let mut text = super::elf::Symbol {
            address: self.root_address,
            size: self.root_size,
            name: self.root.clone(),
        }
        .with_offset(self.offsets.first().copied().unwrap_or(0));
        for &offset in self.offsets.iter().skip(1) {
            text = render(&format!("{text}->"), offset);
        }
        c_notation(&text)
    }
}

/// How the search reached an object.
#[derive(Debug, Clone, Copy)]
enum Arrival {
    /// A pointer stored in a global: module index and link-time slot address.
    Root { module: usize, slot: u64 },
    /// A pointer at `offset` in an object already reached.
    Field { parent: usize, offset: u64 },
}

/// A pointed-to object the search reached.
struct Reached {
    address: u64,
    hops: usize,
    arrivals: Vec<Arrival>,
    /// Some route to it starts at a pointer variable.
    pointer_rooted: bool,
}

/// Searches chains to each of `locks` (heap addresses), breadth-first from
/// the pointers held in named globals; every route of the shortest length
/// (and a few longer ones) is kept, for [`RawChain::rank`] and the namer to
/// choose from.
pub(crate) fn search(
    space: &AddressSpace,
    memory: &dyn TargetMemory,
    locks: &[u64],
) -> SearchOutcome {
    search_within(space, memory, locks, TIME_BUDGET)
}

/// The breadth-first search's state: every object reached, how, and which
/// locks lie in which object.
struct Search<'a> {
    space: &'a AddressSpace,
    memory: &'a dyn TargetMemory,
    wanted: BTreeSet<u64>,
    heap_ranges: Vec<(u64, u64)>,
    reached: Vec<Reached>,
    by_address: HashMap<u64, usize>,
    queue: VecDeque<usize>,
    /// Objects holding each lock, and the lock's offset in them.
    hits: BTreeMap<u64, Vec<(usize, u64)>>,
    reads: usize,
}

impl Search<'_> {
    /// Asked for every word read (a million and more per search): a binary
    /// search over the sorted, merged ranges keeps it a few comparisons.
    fn is_heap(&self, value: u64) -> bool {
        let after = self
            .heap_ranges
            .partition_point(|&(start, _)| start <= value);
        after > 0 && value < self.heap_ranges[after - 1].1
    }

    /// Notes one more way to reach the object at `address`, queueing it
    /// when it is new (`hops` pointers from a global).
    fn enqueue(&mut self, address: u64, arrival: Arrival, hops: usize, pointer_rooted: bool) {
        match self.by_address.get(&address) {
            Some(&known) => {
                let object = &mut self.reached[known];
                if object.arrivals.len() < MAX_ARRIVALS {
                    object.arrivals.push(arrival);
                    object.pointer_rooted |= pointer_rooted;
                }
            }
            None => {
                self.by_address.insert(address, self.reached.len());
                self.queue.push_back(self.reached.len());
                self.reached.push(Reached {
                    address,
                    hops,
                    arrivals: vec![arrival],
                    pointer_rooted,
                });
            }
        }
    }

    /// Hop 1: pointers stored in named globals, the executable's first, so
    /// breadth-first order is also origin order.
    fn enqueue_roots(&mut self, executable: Option<&str>) {
        let space = self.space;
        let mut modules: Vec<(usize, &super::region::LoadedModule)> =
            space.modules.iter().enumerate().collect();
        modules.sort_by_key(|(_, module)| Some(module.path.as_str()) != executable);
        for (module_index, module) in modules {
            let is_executable = Some(module.path.as_str()) == executable;
            // The allocator's and the dynamic linker's own data (arenas, bins,
            // tcache, brk, link maps) point at chunks live or freed: chains from
            // there name nothing. Their modules are skipped (in a static
            // executable, their symbols are).
            let is_runtime = module
                .symbols
                .functions
                .iter()
                .any(|f| f.name == "malloc" || f.name == "_dl_allocate_tls");
            if is_runtime && !is_executable {
                continue;
            }
            for section in module
                .symbols
                .sections
                .iter()
                .filter(|s| is_global_data(&s.name))
            {
                let start = section.address.wrapping_add(module.bias);
                let mut bytes = vec![0u8; section.size.min(64 << 20) as usize];
                let read = self.memory.read(start, &mut bytes);
                self.reads += 1;
                for (index, word) in bytes[..read].chunks_exact(8).enumerate() {
                    let value = u64::from_le_bytes(word.try_into().unwrap_or_default());
                    if !self.is_heap(value) {
                        continue;
                    }
                    let slot = start + index as u64 * 8;
                    let Some((symbol, offset)) =
                        module.symbols.object_at(module.link_address(slot))
                    else {
                        continue;
                    };
                    if is_runtime_internal(&symbol.name) {
                        continue;
                    }
                    let arrival = Arrival::Root {
                        module: module_index,
                        slot: module.link_address(slot),
                    };
                    let pointer_rooted = offset == 0 && symbol.size == 8;
                    self.enqueue(value, arrival, 1, pointer_rooted);
                }
            }
        }
    }

    /// Every wanted lock is reached exactly (a pointer to the lock itself),
    /// by a route from a pointer variable when `pointer_rooted`.
    fn all_exact(&self, pointer_rooted: bool) -> bool {
        self.wanted.iter().all(|lock| {
            self.hits.get(lock).is_some_and(|found| {
                found.iter().any(|&(id, offset)| {
                    offset == 0 && (self.reached[id].pointer_rooted || !pointer_rooted)
                })
            })
        })
    }

    /// Reads object `id` (and the word before it) into `buffer`; the bytes
    /// of the object it may hold, or None when it names nothing.
    fn read_object(
        &mut self,
        id: usize,
        buffer: &mut [u8],
        glibc_malloc: bool,
        tcache_key: Option<u64>,
    ) -> Option<(u64, u64)> {
        let object = self.reached[id].address;
        // An object at the start of a mapping has no readable word before it.
        let read = if self.is_heap(object.wrapping_sub(8)) {
            self.memory.read(object - 8, buffer)
        } else {
            buffer[..8].fill(0);
            8 + self.memory.read(object, &mut buffer[8..])
        };
        self.reads += 1;
        if read < 16 {
            return None;
        }
        let header = u64::from_le_bytes(buffer[..8].try_into().unwrap_or_default());
        object_bounds(&buffer[..read], header, glibc_malloc, tcache_key)
    }

    /// Queues the heap pointers held in object `id` (its bytes after the header word).
    fn enqueue_fields(&mut self, id: usize, fields: &[u8]) {
        let (object, hops) = (self.reached[id].address, self.reached[id].hops);
        let pointer_rooted = self.reached[id].pointer_rooted;
        for (index, word) in fields.chunks_exact(8).enumerate() {
            let value = u64::from_le_bytes(word.try_into().unwrap_or_default());
            if !self.is_heap(value) || value == object {
                continue;
            }
            let arrival = Arrival::Field {
                parent: id,
                offset: index as u64 * 8,
            };
            self.enqueue(value, arrival, hops + 1, pointer_rooted);
        }
    }

    /// The candidate chains of every lock found, best first.
    fn chains(&self, executable: Option<&str>) -> BTreeMap<u64, Vec<RawChain>> {
        let mut out = BTreeMap::new();
        for (&lock, found) in &self.hits {
            let mut chains = Vec::new();
            for &(id, offset) in found {
                routes(
                    self.space,
                    &self.reached,
                    id,
                    vec![offset],
                    executable,
                    &mut chains,
                );
            }
            chains.sort_by(|a, b| {
                a.rank()
                    .cmp(&b.rank())
                    .then_with(|| a.offsets.cmp(&b.offsets))
            });
            chains.dedup();
            chains.truncate(MAX_CANDIDATES);
            if !chains.is_empty() {
                out.insert(lock, chains);
            }
        }
        out
    }
}

/// [`search`] with its own time budget.
pub(crate) fn search_within(
    space: &AddressSpace,
    memory: &dyn TargetMemory,
    locks: &[u64],
    budget: Duration,
) -> SearchOutcome {
    let started = Instant::now();
    let cpu_started = thread_cpu_time();
    let out_of_time = || {
        let cpu_spent = thread_cpu_time().saturating_sub(cpu_started);
        cpu_spent > budget || started.elapsed() > budget * WALL_CLOCK_CEILING
    };
    let mut outcome = SearchOutcome {
        complete: true,
        ..SearchOutcome::default()
    };
    let mut search = Search {
        space,
        memory,
        wanted: locks.iter().copied().collect(),
        heap_ranges: sorted_and_merged(space.heap_ranges()),
        reached: Vec::new(),
        by_address: HashMap::new(),
        queue: VecDeque::new(),
        hits: BTreeMap::new(),
        reads: 0,
    };
    if search.wanted.is_empty() {
        return outcome;
    }
    let tcache_key = read_tcache_key(space, memory);
    // Under glibc's malloc every object starts a chunk with a size word; a
    // pointer without one points into the middle of something (an arena
    // block, a string), and locks merely near it are not inside it.
    let glibc_malloc = space.glibc_malloc;
    let executable = space
        .maps
        .iter()
        .find(|m| m.is_file())
        .map(|m| m.path.as_str());
    search.enqueue_roots(executable);
    // Breadth-first, so every route of a given length is known before any
    // object of the next length is read. Done when each lock is reached
    // exactly (a pointer to the lock itself) by a route from a pointer
    // variable, once the level it was found at is finished; or one level
    // after each is reached exactly from any root.
    let mut settled_level: Option<usize> = None;
    // The word before the object too: glibc malloc's chunk size bounds the object.
    let mut buffer = vec![0u8; 8 + MAX_FIELD_OFFSET as usize];
    while let Some(id) = search.queue.pop_front() {
        let (object, hops) = (search.reached[id].address, search.reached[id].hops);
        if settled_level.is_some_and(|level| hops > level) {
            break;
        }
        if out_of_time() || search.reads > MAX_READS {
            outcome.complete = false;
            break;
        }
        outcome.pointers_followed += 1;
        let Some((object_size, match_size)) =
            search.read_object(id, &mut buffer, glibc_malloc, tcache_key)
        else {
            continue;
        };
        let inside: Vec<u64> = search
            .wanted
            .range(object..object + match_size)
            .copied()
            .collect();
        for lock in inside {
            let found = search.hits.entry(lock).or_default();
            if found.len() < MAX_CANDIDATES {
                found.push((id, lock - object));
            }
        }
        // A route from a pointer variable may be a level longer: one more
        // level is searched for it, not more (the cost stays near the old
        // first-exact-hit stop).
        if search.all_exact(true) {
            settled_level = Some(settled_level.map_or(hops, |level| level.min(hops)));
        } else if settled_level.is_none() && search.all_exact(false) {
            settled_level = Some(hops + 1);
        }
        if hops < MAX_HOPS {
            search.enqueue_fields(id, &buffer[8..8 + object_size as usize]);
        }
    }
    outcome.chains = search.chains(executable);
    outcome.elapsed = started.elapsed();
    outcome
}

/// CPU time this thread has used (zero if the clock cannot be read, which
/// leaves only the wall-clock ceiling).
fn thread_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// Ranges sorted by start, overlapping and adjacent ones joined.
fn sorted_and_merged(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Every route (up to [`MAX_HOPS`] pointers, at most [`MAX_CANDIDATES`]
/// per call chain) from a global to object `id`; `tail` holds the offsets
/// after it, innermost last.
fn routes(
    space: &AddressSpace,
    reached: &[Reached],
    id: usize,
    tail: Vec<u64>,
    executable: Option<&str>,
    out: &mut Vec<RawChain>,
) {
    if tail.len() > MAX_HOPS || out.len() >= MAX_CANDIDATES * 4 {
        return;
    }
    for arrival in &reached[id].arrivals {
        match *arrival {
            Arrival::Root { module, slot } => {
                let Some(loaded) = space.modules.get(module) else {
                    continue;
                };
                let Some((symbol, offset)) = loaded.symbols.object_at(slot) else {
                    continue;
                };
                let mut offsets = vec![offset];
                offsets.extend(&tail);
                out.push(RawChain {
                    module: loaded.path.clone(),
                    root: symbol.name.clone(),
                    root_address: symbol.address,
                    root_size: symbol.size,
                    offsets,
                    origin_class: u8::from(Some(loaded.path.as_str()) != executable),
                });
            }
            Arrival::Field { parent, offset } => {
                // A route through the object itself goes round in a circle.
                if parent == id {
                    continue;
                }
                let mut longer = vec![offset];
                longer.extend(&tail);
                routes(space, reached, parent, longer, executable, out);
            }
        }
    }
}

/// The bytes of an object to follow pointers in and to look for locks in,
/// from its first bytes `chunk` (the word before it first): None when it is
/// a freed glibc chunk. Only glibc's malloc puts a size word before each
/// object; elsewhere (musl's mallocng keeps a slot index and an offset there,
/// next to the tail of the slot before) that word says nothing, and reading
/// it as glibc's made live objects look freed or small at random.
fn object_bounds(
    chunk: &[u8],
    header: u64,
    glibc_malloc: bool,
    tcache_key: Option<u64>,
) -> Option<(u64, u64)> {
    let read = chunk.len() as u64;
    if !glibc_malloc {
        let size = MAX_FIELD_OFFSET.min(read - 8);
        return Some((size, size));
    }
    if is_freed_chunk(chunk, header, tcache_key) {
        return None; // a stale pointer to freed memory names nothing
    }
    let usable = malloc_usable_size(header);
    let object_size = usable.unwrap_or(MAX_FIELD_OFFSET).min(read - 8);
    // No size word: a pointer into the middle of something (an arena block,
    // a string); locks merely near it are not inside it.
    Some((object_size, if usable.is_some() { object_size } else { 1 }))
}

/// glibc marks a freed tcache chunk with the process's random `tcache_key`
/// in its second word; the key is read when a symbol table names it
/// (libc's debug file, or a static executable).
fn read_tcache_key(space: &AddressSpace, memory: &dyn TargetMemory) -> Option<u64> {
    space.modules.iter().find_map(|module| {
        let symbol = module
            .symbols
            .objects
            .iter()
            .find(|s| s.name == "tcache_key" && s.size == 8)?;
        let mut word = [0u8; 8];
        (memory.read(symbol.address.wrapping_add(module.bias), &mut word) == 8)
            .then(|| u64::from_le_bytes(word))
    })
}

/// True when `chunk` (the bytes from the size word of a glibc malloc chunk
/// on) is free: in a tcache bin (its key word), or in another bin (the next
/// chunk's PREV_INUSE bit is clear). Unknown layouts count as in use.
fn is_freed_chunk(chunk: &[u8], header: u64, tcache_key: Option<u64>) -> bool {
    let word = |at: usize| {
        chunk
            .get(at..at + 8)
            .map(|bytes| u64::from_le_bytes(bytes.try_into().unwrap_or_default()))
    };
    if malloc_usable_size(header).is_none() || header & 2 != 0 {
        return false; // not a glibc heap chunk, or mmapped
    }
    if tcache_key.is_some_and(|key| key != 0 && word(16) == Some(key)) {
        return true;
    }
    let size = (header & !7) as usize;
    word(size).is_some_and(|next_size| next_size & 1 == 0)
}

/// Usable bytes of a glibc malloc chunk from its size word (flags in the low
/// 3 bits, sizes multiples of 16), or None when the word is not one.
fn malloc_usable_size(header: u64) -> Option<u64> {
    let size = header & !7;
    (size >= 32 && size.is_multiple_of(16) && size <= 1 << 20).then(|| size - 8)
}

/// Data of libc, the allocator and the dynamic linker linked into a static
/// executable.
fn is_runtime_internal(name: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "__",
        "_dl_",
        "_rtld_",
        "_IO_",
        "main_arena",
        "tcache",
        "mp_",
        "mal.",
    ];
    PREFIXES.iter().any(|prefix| name.starts_with(prefix))
}

fn is_global_data(section: &str) -> bool {
    matches!(section, ".data" | ".bss")
        || section.starts_with(".data.")
        || section.starts_with(".bss.")
}

/// A path ending in a dereference (`g_stats->+0x20->`, the lock that
/// pointer points to) as C writes it: `*g_stats->+0x20`; others unchanged.
/// Reports before C notation spelled names the first way.
pub(crate) fn c_notation(path: &str) -> String {
    match path.strip_suffix("->") {
        Some(pointer) if !pointer.is_empty() => format!("*{pointer}"),
        _ => path.to_string(),
    }
}

/// `path` ends with `->`; a non-zero field offset follows it.
fn render(path: &str, offset: u64) -> String {
    if offset == 0 {
        path.to_string()
    } else {
        format!("{path}+{offset:#x}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tells_freed_glibc_chunks() {
        // size word 0x31 (48-byte chunk, PREV_INUSE), then 40 bytes of user
        // data, then the next chunk's size word.
        let chunk = |key: u64, next_size: u64| {
            let mut bytes = vec![0u8; 56];
            bytes[..8].copy_from_slice(&0x31u64.to_le_bytes());
            bytes[16..24].copy_from_slice(&key.to_le_bytes());
            bytes[48..56].copy_from_slice(&next_size.to_le_bytes());
            bytes
        };
        assert!(!super::is_freed_chunk(&chunk(7, 0x21), 0x31, Some(0xabcd)));
        assert!(super::is_freed_chunk(
            &chunk(0xabcd, 0x21),
            0x31,
            Some(0xabcd)
        ));
        assert!(super::is_freed_chunk(&chunk(7, 0x20), 0x31, None));
        assert!(!super::is_freed_chunk(&chunk(7, 0x20), 0, None));
        assert_eq!(super::malloc_usable_size(0x31), Some(0x28));
        assert_eq!(super::malloc_usable_size(0x2d30303000000000), None);
    }

    #[test]
    fn merges_heap_ranges() {
        let merged =
            super::sorted_and_merged(vec![(50, 60), (10, 20), (20, 30), (15, 18), (40, 45)]);
        assert_eq!(merged, [(10, 30), (40, 45), (50, 60)]);
        assert!(super::sorted_and_merged(Vec::new()).is_empty());
    }

    /// musl's word before an object is no size: never read as glibc's.
    #[test]
    fn only_glibc_objects_are_bounded_by_a_size_word() {
        // What reads as a glibc chunk of 48 bytes whose next chunk is free.
        let mut bytes = vec![0u8; 0x408];
        bytes[..8].copy_from_slice(&0x30u64.to_le_bytes());
        bytes[48..56].copy_from_slice(&0x20u64.to_le_bytes());
        assert_eq!(super::object_bounds(&bytes, 0x30, true, None), None);
        assert_eq!(
            super::object_bounds(&bytes, 0x30, false, None),
            Some((0x400, 0x400))
        );
        bytes[48..56].copy_from_slice(&0x21u64.to_le_bytes());
        assert_eq!(
            super::object_bounds(&bytes, 0x31, true, None),
            Some((0x28, 0x28))
        );
        // glibc, no size word: followed, but only a lock right at it is inside.
        let junk = 0x2d30_3030_0000_0000;
        assert_eq!(
            super::object_bounds(&bytes, junk, true, None),
            Some((0x400, 1))
        );
    }

    #[test]
    fn ranks_routes_like_a_person() {
        let chain = |root: &str, size: u64, offsets: &[u64]| super::RawChain {
            module: "/bin/x".into(),
            root: root.into(),
            root_address: 0x4000,
            root_size: size,
            offsets: offsets.to_vec(),
            origin_class: 0,
        };
        let direct = chain("g_global_stats", 8, &[0, 0x10, 0]);
        let registry = chain("g_plugin_core", 0x38, &[0x30, 0x10, 0]);
        let inside = chain("g_global_stats", 8, &[0, 0x10, 0x8]);
        assert!(direct.pointer_root() && !registry.pointer_root());
        assert!(direct.rank() < registry.rank());
        // Ending right at the lock first, whatever the root.
        assert!(registry.rank() < inside.rank());
        assert_eq!(direct.offset_name(), "*g_global_stats->+0x10");
        assert_eq!(registry.offset_name(), "*g_plugin_core+0x30->+0x10");
        assert_eq!(inside.offset_name(), "g_global_stats->+0x10->+0x8");
        assert_eq!(direct.hops(), 2);
    }

    #[test]
    fn renders_offsets() {
        assert_eq!(super::render("g_stats->", 0x148), "g_stats->+0x148");
        assert_eq!(super::render("g_stats->+0x148->", 0), "g_stats->+0x148->");
        assert_eq!(super::c_notation("g_stats->+0x148->"), "*g_stats->+0x148");
        assert_eq!(super::c_notation("tsrm_env_mutex->"), "*tsrm_env_mutex");
        assert_eq!(super::c_notation("g_stats->lock"), "g_stats->lock");
        assert_eq!(super::c_notation("->"), "->");
    }
    /// The search on a hand-built process (no root): a global pointer
    /// variable and a registry struct both lead to one lock; a second lock
    /// sits inside the first object; a third is reachable from nothing.
    mod on_fake_memory {
        use std::sync::Arc;

        use crate::{
            naming::{
                elf::{ModuleSymbols, Section, Segment, Symbol},
                region::{AddressSpace, LoadedModule},
            },
            probe::{memory::FakeMemory, target::Mapping},
        };

        const DATA: u64 = 0x60_0000;
        const HEAP: u64 = 0x100_0000;
        const G_STATS: u64 = DATA + 0x10;
        const G_CORE: u64 = DATA + 0x40;
        const OBJECT: u64 = HEAP + 0x100;
        const LOCK: u64 = HEAP + 0x2000;
        const REGISTRY: u64 = HEAP + 0x3000;
        const INSIDE: u64 = OBJECT + 0x48;
        const ORPHAN: u64 = HEAP + 0x5000;

        fn mapping(start: u64, end: u64, perms: &str, path: &str) -> Mapping {
            Mapping::made_up(start, end, perms, path)
        }

        fn space() -> AddressSpace {
            let symbol = |address, size, name: &str| Symbol {
                address,
                size,
                name: name.into(),
            };
            let symbols = ModuleSymbols {
                segments: vec![Segment {
                    address: 0x40_0000,
                    memory_size: DATA + 0x1000 - 0x40_0000,
                    offset: 0,
                    file_size: DATA + 0x1000 - 0x40_0000,
                }],
                sections: vec![Section {
                    name: ".data".into(),
                    address: DATA,
                    size: 0x100,
                }],
                objects: vec![
                    symbol(G_STATS, 8, "g_stats"),
                    symbol(G_CORE, 0x38, "g_core"),
                ],
                ..ModuleSymbols::default()
            };
            AddressSpace {
                maps: vec![
                    mapping(0x40_0000, 0x40_1000, "r-xp", "/app"),
                    mapping(DATA, DATA + 0x1000, "rw-p", "/app"),
                    mapping(HEAP, HEAP + 0x10000, "rw-p", "[heap]"),
                ],
                modules: vec![LoadedModule {
                    path: "/app".into(),
                    bias: 0,
                    start: 0x40_0000,
                    end: DATA + 0x1000,
                    symbols: Arc::new(symbols),
                }],
                ..AddressSpace::default()
            }
        }

        fn memory() -> FakeMemory {
            let mut memory = FakeMemory::default();
            memory.map(DATA, vec![0; 0x100]);
            memory.map(HEAP, vec![0; 0x10000]);
            memory.put_u64(G_STATS, OBJECT);
            memory.put_u64(OBJECT + 0x20, LOCK);
            memory.put_u64(G_CORE + 0x30, REGISTRY);
            memory.put_u64(REGISTRY + 0x10, LOCK);
            memory
        }

        #[test]
        fn names_heap_locks_by_the_best_route() {
            let outcome = super::super::search(&space(), &memory(), &[LOCK, INSIDE, ORPHAN]);
            assert!(outcome.complete);
            let names = |lock: u64| -> Vec<String> {
                outcome.chains.get(&lock).map_or_else(Vec::new, |chains| {
                    chains
                        .iter()
                        .map(super::super::RawChain::offset_name)
                        .collect()
                })
            };
            assert_eq!(names(LOCK), ["*g_stats->+0x20", "*g_core+0x30->+0x10"]);
            assert_eq!(names(INSIDE), ["g_stats->+0x48"]);
            assert!(names(ORPHAN).is_empty());
        }

        /// A pointer into memory that is not mapped leads nowhere, and the
        /// search still ends with what it found.
        #[test]
        fn survives_pointers_into_unmapped_memory() {
            let mut memory = memory();
            memory.put_u64(OBJECT + 0x8, HEAP + 0x20000);
            let mut space = space();
            space.maps[2].end = HEAP + 0x40000; // mapped per maps, unreadable
            let outcome = super::super::search(&space, &memory, &[LOCK]);
            assert_eq!(outcome.chains[&LOCK][0].offset_name(), "*g_stats->+0x20");
        }
    }
}
