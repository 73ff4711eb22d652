//! The target's address space as the namer needs it: its mappings and, for
//! each ELF module, where it was loaded (bias) and how far it extends
//! (including .bss that the kernel maps anonymously after the file).
use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    sync::Arc,
};

use super::elf::{ModuleSymbols, Segment};
use crate::{
    model::{Region, Worded},
    probe::{
        modules::{FileIdentity, ModuleFile},
        target::Mapping,
    },
};

/// Each module file's parsed symbols, by path, file identity and whether a
/// root was given (debug files are looked up under it): a live session's
/// repeated builds parse a file once, not at each naming.
pub(crate) type SymbolCache = HashMap<(String, FileIdentity, bool), Arc<ModuleSymbols>>;

/// One ELF module mapped in the target.
#[derive(Debug)]
pub struct LoadedModule {
    /// Path as the target sees it.
    pub path: String,
    /// Runtime address minus link-time address.
    pub bias: u64,
    /// Runtime extent of all its loadable segments.
    pub start: u64,
    pub end: u64,
    /// Shared by the copies of one file (dlmopen).
    pub symbols: Arc<ModuleSymbols>,
}

const ARENA_ALIGN: u64 = 64 << 20;

/// Stack pointers of the threads of `pid` that are blocked (in a syscall or
/// not): /proc/PID/task/TID/syscall ends with `sp pc`; running threads say
/// only `running`.
pub(crate) fn thread_stack_pointers(pid: u32) -> Vec<u64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("syscall")).ok())
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let sp = fields.len().checked_sub(2).and_then(|i| fields.get(i))?;
            u64::from_str_radix(sp.strip_prefix("0x")?, 16).ok()
        })
        .collect()
}

/// Where the Go runtime puts its heap on x86-64 up to Go 1.25 (its first
/// arena hint, 0x00c0 << 32, and the rest of that terabyte it grows into).
/// Go 1.26 and later start it at a random address (FrankenPHP's Go 1.27 at
/// 0x35b72a400000): see [`AddressSpace::go_heap_end`].
const GO_ARENA: std::ops::Range<u64> = 0x00c0_0000_0000..0x0100_0000_0000;
/// The Go heap grows in chunks of 4 MiB from 64 MiB-aligned arenas
/// (`pallocChunkBytes`): its writable mappings start on these boundaries.
const GO_CHUNK: u64 = 4 << 20;
/// Largest no-access mapping taken for a thread stack's guard (glibc and
/// musl use a page or two); the Go runtime's huge reservations are not guards.
const MAX_GUARD: u64 = 64 << 10;

impl LoadedModule {
    /// End of the module's last allocated section: what follows up to `end`
    /// is spare, and the dynamic linker may use it as heap.
    pub fn spare_start(&self) -> u64 {
        let last = self
            .symbols
            .sections
            .iter()
            .map(|s| s.address.saturating_add(s.size))
            .max()
            .unwrap_or(0);
        last.wrapping_add(self.bias).max(self.start)
    }

    pub(crate) fn contains(&self, address: u64) -> bool {
        (self.start..self.end).contains(&address)
    }

    /// Link-time address of a runtime address in this module.
    pub fn link_address(&self, address: u64) -> u64 {
        address.wrapping_sub(self.bias)
    }
}

#[derive(Debug, Default)]
pub struct AddressSpace {
    pub maps: Vec<Mapping>,
    pub modules: Vec<LoadedModule>,
    /// Start addresses of mappings seen holding a thread's stack pointer,
    /// with the highest stack pointer seen in each.
    pub thread_stacks: BTreeMap<u64, u64>,
    /// The target is a Go program (its runtime's symbols are present).
    pub is_go: bool,
    /// glibc's malloc is in the target (a module defines `malloc_trim`).
    pub glibc_malloc: bool,
    /// Module files whose symbols could not be read, with why.
    pub skipped: Vec<crate::model::SkippedFile>,
}

/// One copy of a module at `bias`, with the runtime extent of its segments.
fn loaded_module(path: &str, bias: u64, symbols: &Arc<ModuleSymbols>) -> LoadedModule {
    let start = symbols
        .segments
        .iter()
        .map(|s| s.address)
        .min()
        .unwrap_or(0)
        .wrapping_add(bias);
    let end = symbols
        .segments
        .iter()
        .map(|s| {
            s.address
                .saturating_add(s.memory_size)
                .saturating_add(0xfff)
                & !0xfff
        })
        .max()
        .unwrap_or(0)
        .wrapping_add(bias);
    LoadedModule {
        path: path.to_string(),
        bias,
        start,
        end,
        symbols: Arc::clone(symbols),
    }
}

impl AddressSpace {
    /// Builds the address space from a maps snapshot and open module files.
    pub fn build(
        maps: Vec<Mapping>,
        files: &BTreeMap<String, Arc<ModuleFile>>,
        root: Option<&Path>,
    ) -> AddressSpace {
        AddressSpace::build_cached(maps, files, root, &mut SymbolCache::new())
    }

    /// As [`AddressSpace::build`], with the symbols of files parsed before
    /// taken from `cache` (which keeps only the files of `files`).
    pub(crate) fn build_cached(
        maps: Vec<Mapping>,
        files: &BTreeMap<String, Arc<ModuleFile>>,
        root: Option<&Path>,
        cache: &mut SymbolCache,
    ) -> AddressSpace {
        let mut modules = Vec::new();
        let mut skipped = Vec::new();
        cache.retain(|(path, identity, _), _| {
            files
                .get(path)
                .is_some_and(|file| file.identity() == *identity)
        });
        for (path, file) in files {
            let key = (path.clone(), file.identity(), root.is_some());
            let symbols = match cache.get(&key) {
                Some(symbols) => symbols.clone(),
                None => match ModuleSymbols::parse(file.bytes(), path, root) {
                    Ok(symbols) => {
                        let symbols = Arc::new(symbols);
                        cache.insert(key, symbols.clone());
                        symbols
                    }
                    Err(error) => {
                        skipped.push(crate::model::SkippedFile {
                            file: path.clone(),
                            reason: crate::model::SkipReason::CorruptHeaders,
                            detail: format!("{:#}", error.root_cause()),
                        });
                        continue;
                    }
                },
            };
            skipped.extend(symbols.skipped.iter().cloned());
            for bias in load_biases(&maps, path, &symbols) {
                modules.push(loaded_module(path, bias, &symbols));
            }
        }
        let is_go = modules.iter().any(|module| {
            module
                .symbols
                .functions
                .iter()
                .any(|f| f.name == "runtime.main")
        });
        // Under glibc's malloc every object starts a chunk with a size word,
        // and threads get 64 MiB-aligned arenas.
        let glibc_malloc = modules
            .iter()
            .any(|m| m.symbols.functions.iter().any(|f| f.name == "malloc_trim"));
        AddressSpace {
            maps,
            modules,
            thread_stacks: Default::default(),
            is_go,
            glibc_malloc,
            skipped,
        }
    }

    pub fn module_of(&self, address: u64) -> Option<&LoadedModule> {
        self.modules.iter().find(|module| module.contains(address))
    }

    /// Memory where malloc'ed objects can be: writable anonymous mappings
    /// and [heap] outside modules, and spare tails of module pages.
    pub fn heap_ranges(&self) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = self
            .maps
            .iter()
            .enumerate()
            .filter(|(_, m)| {
                m.perms.starts_with("rw")
                    && !m.is_file()
                    && (m.path.is_empty() || m.path == "[heap]")
            })
            .filter(|(_, m)| self.module_of(m.start).is_none())
            // The Go heap has no object bounds to read: a C pointer boxed in
            // some Go object near a Go global's target would make a false
            // chain. Chains name C locks through C memory. Nor through
            // thread stacks: a frame's pointers name nothing that lasts
            // (musl's condvar waiters are nodes on their stacks).
            .map(|(index, m)| {
                let is_stack = self.thread_stacks.contains_key(&m.start) || self.above_guard(index);
                let stack_end = if is_stack {
                    self.thread_stack_end(index)
                } else {
                    m.start
                };
                (stack_end.max(self.go_heap_end(index)), m.end)
            })
            .filter(|(start, end)| start < end)
            .collect();
        ranges.extend(
            self.modules
                .iter()
                .map(|m| (m.spare_start(), m.end))
                .filter(|(start, end)| start < end),
        );
        ranges
    }

    /// Which kind of memory holds `address`: a module section (`.data`,
    /// `.bss`, …), `[heap]`, `[stack]`, `thread stack`, `anonymous`, a mapped
    /// file, or `unknown` (not mapped when the maps were read).
    pub fn region_of(&self, address: u64) -> Region {
        if let Some(module) = self.module_of(address) {
            let link_address = module.link_address(address);
            return match module.symbols.section_at(link_address) {
                Some(section) => Region::Section(section.name.clone()),
                // No section headers (sstrip): the program headers say.
                None if module.symbols.sections.is_empty() => module
                    .symbols
                    .segment_region(link_address)
                    .unwrap_or(Region::SpareHeap),
                // musl's dynamic linker gives the unused tail of a module's
                // last data page to malloc.
                None if module.spare_start() <= address => Region::SpareHeap,
                None => Region::Module,
            };
        }
        let Some(index) = self
            .maps
            .iter()
            .position(|mapping| mapping.contains(address))
        else {
            return Region::Unmapped; // not mapped when the maps were read
        };
        let mapping = &self.maps[index];
        if mapping.path.starts_with('[') {
            return Region::from_word(&mapping.path);
        }
        if mapping.is_file() {
            return Region::File(mapping.path.clone());
        }
        // Before the stack checks: goroutine stacks are in the Go heap, and
        // threads in a syscall have their stack pointer there.
        if (self.is_go && GO_ARENA.contains(&address)) || address < self.go_heap_end(index) {
            return Region::GoHeap;
        }
        let in_stack_part = address < self.thread_stack_end(index);
        if self.thread_stacks.contains_key(&mapping.start) && in_stack_part {
            return Region::ThreadStack;
        }
        if self.is_thread_arena(index) {
            return Region::ThreadArena;
        }
        // glibc and musl put a no-access guard page right below each thread
        // stack.
        if self.above_guard(index) && in_stack_part {
            return Region::ThreadStack;
        }
        if mapping.perms.starts_with("rw") {
            return Region::MmapHeap;
        }
        Region::Anonymous
    }
}

impl AddressSpace {
    /// glibc's per-thread malloc arenas: 64 MiB-aligned, the unused rest of
    /// the 64 MiB reserved (no access) right above; only where glibc's
    /// malloc is (a musl or Go heap can look the same).
    fn is_thread_arena(&self, index: usize) -> bool {
        let mapping = &self.maps[index];
        let above = self.maps.get(index + 1);
        let reserve_above =
            above.is_some_and(|next| next.start == mapping.end && next.perms.starts_with("---"));
        self.glibc_malloc && mapping.start.is_multiple_of(ARENA_ALIGN) && reserve_above
    }

    /// Where the Go runtime's heap ends in mapping `index`, from its start:
    /// all of it, none (its start), or a thread stack's extent. Go reserves
    /// its arenas (64 MiB each, aligned) with no access and makes them
    /// writable in parts, like glibc's arenas (told apart above) and unlike
    /// thread stacks (a small guard below). A thread's stack pointer in
    /// writable memory that no guard protects is on a goroutine stack (or a
    /// g0 stack of a non-cgo thread): Go allocates those in its heap too.
    /// Or it is on a C thread's stack whose guard the kernel merged into a
    /// no-access mapping right below (a Go reservation, in the static musl
    /// build), with musl's malloc memory merged above the stack: a mapping
    /// that starts off Go's chunk boundaries is then the Go heap only as far
    /// as a thread stack reaches, and what lies above is C heap.
    fn go_heap_end(&self, index: usize) -> u64 {
        let mapping = &self.maps[index];
        if !self.is_go || !mapping.perms.starts_with("rw") || !mapping.path.is_empty() {
            return mapping.start;
        }
        if GO_ARENA.contains(&mapping.start) {
            return mapping.end;
        }
        if self.above_guard(index) {
            return mapping.start;
        }
        if !self.is_thread_arena(index) && self.in_arena_reservation(index) {
            return mapping.end;
        }
        if !self.thread_stacks.contains_key(&mapping.start) {
            return mapping.start;
        }
        if mapping.start.is_multiple_of(GO_CHUNK) {
            return mapping.end;
        }
        self.thread_stack_end(index)
    }

    /// Mapping `index` is part of a run of adjacent anonymous mappings that
    /// starts and ends 64 MiB-aligned and holds a large no-access part: the
    /// shape of a Go heap arena (reserved whole, made writable in parts).
    fn in_arena_reservation(&self, index: usize) -> bool {
        let anonymous = |m: &Mapping| m.path.is_empty() && !m.perms.starts_with("r-");
        let mut first = index;
        while first > 0
            && anonymous(&self.maps[first - 1])
            && self.maps[first - 1].end == self.maps[first].start
        {
            first -= 1;
        }
        let mut last = index;
        while last + 1 < self.maps.len()
            && anonymous(&self.maps[last + 1])
            && self.maps[last].end == self.maps[last + 1].start
        {
            last += 1;
        }
        let run = &self.maps[first..=last];
        let reserved = run
            .iter()
            .any(|m| m.perms.starts_with("---") && m.end - m.start > MAX_GUARD);
        reserved
            && self.maps[first].start.is_multiple_of(ARENA_ALIGN)
            && self.maps[last].end.is_multiple_of(ARENA_ALIGN)
    }

    /// glibc and musl put a small no-access guard right below each thread stack.
    fn above_guard(&self, index: usize) -> bool {
        self.above_no_access(index)
            && self.maps[index - 1].end - self.maps[index - 1].start <= MAX_GUARD
    }

    /// Mapping `index` lies right above anonymous no-access memory.
    fn above_no_access(&self, index: usize) -> bool {
        let mapping = &self.maps[index];
        let below = index.checked_sub(1).map(|i| &self.maps[i]);
        below.is_some_and(|below| {
            below.end == mapping.start && below.perms.starts_with("---") && below.path.is_empty()
        })
    }

    /// Where the thread stack at the bottom of mapping `index` ends. Memory
    /// mapped right above a thread stack with the same permissions merges
    /// with it into one mapping (musl's mmap'ed heap above a cgo thread's
    /// stack), so the stack is taken to end at the smallest size other
    /// thread stacks have that still holds the highest stack pointer seen
    /// in it; the whole mapping when no other stack is smaller. A stack
    /// whose guard merged into a larger no-access mapping below still tells
    /// the size: it may be the only stack nothing merged with above.
    fn thread_stack_end(&self, index: usize) -> u64 {
        let mapping = &self.maps[index];
        let above_sp = self
            .thread_stacks
            .get(&mapping.start)
            .map_or(mapping.start, |&sp| (sp + 0x1000) & !0xfff);
        let unguarded_stack = |i: usize| {
            self.thread_stacks.contains_key(&self.maps[i].start) && self.above_no_access(i)
        };
        self.maps
            .iter()
            .enumerate()
            .filter(|&(i, other)| {
                i != index
                    && other.perms.starts_with("rw")
                    && (self.above_guard(i) || unguarded_stack(i))
            })
            .map(|(_, other)| mapping.start + (other.end - other.start))
            .filter(|&end| end >= above_sp && end < mapping.end)
            .min()
            .unwrap_or(mapping.end)
    }
}

/// Runtime minus link-time address of each copy of the module in the
/// target, in map order: one per executable mapping's bias (dlmopen loads a
/// library once per link-map namespace), else the first mapping's. A
/// mapping counts where its file offset lies in a loadable segment.
pub(super) fn load_biases(maps: &[Mapping], path: &str, symbols: &ModuleSymbols) -> Vec<u64> {
    // (bias, seen in an executable mapping)
    let mut biases: Vec<(u64, bool)> = Vec::new();
    for mapping in maps.iter().filter(|mapping| mapping.path == path) {
        let Some(bias) = bias_of(mapping, &symbols.segments) else {
            continue;
        };
        let executable = mapping.perms.contains('x');
        match biases.iter_mut().find(|(known, _)| *known == bias) {
            Some(entry) => entry.1 |= executable,
            None => biases.push((bias, executable)),
        }
    }
    let copies: Vec<u64> = biases
        .iter()
        .filter(|(_, executable)| *executable)
        .map(|(bias, _)| *bias)
        .collect();
    if copies.is_empty() {
        biases.first().map(|(bias, _)| *bias).into_iter().collect()
    } else {
        copies
    }
}

/// The loader maps each loadable segment from its first page: a mapping
/// that starts there is that segment's, even where the segment before it
/// ends in the same page. A mapping split off later (mprotect) starts
/// inside its segment.
pub(super) fn bias_of(mapping: &Mapping, segments: &[Segment]) -> Option<u64> {
    let starting_here = segments
        .iter()
        .find(|segment| segment.offset & !0xfff == mapping.offset);
    let segment = starting_here.or_else(|| {
        segments.iter().find(|segment| {
            let page_start = segment.offset & !0xfff;
            mapping.offset >= page_start
                && mapping.offset < segment.offset.saturating_add(segment.file_size.max(1))
        })
    })?;
    // runtime(mapping.start) = bias + link address of file offset mapping.offset
    let link = segment
        .address
        .wrapping_add(mapping.offset)
        .wrapping_sub(segment.offset);
    Some(mapping.start.wrapping_sub(link))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPARE_HEAP: Region = Region::SpareHeap;
    const THREAD_ARENA: Region = Region::ThreadArena;
    const MMAP_HEAP: Region = Region::MmapHeap;
    const GO_HEAP: Region = Region::GoHeap;

    /// A module whose read-only segment ends inside the page where its code
    /// segment starts (as rustc's executables have it), loaded twice
    /// (dlmopen): each copy's bias comes from the segment its mapping
    /// starts, one bias per executable mapping.
    #[test]
    fn one_bias_per_copy_from_the_segment_a_mapping_starts() {
        let segment = |address, offset, size| Segment {
            address,
            memory_size: size,
            offset,
            file_size: size,
        };
        let symbols = ModuleSymbols {
            segments: vec![segment(0, 0, 0x1234), segment(0x2234, 0x1234, 0x800)],
            ..ModuleSymbols::default()
        };
        let mapping = |start: u64, perms: &str, offset: u64| Mapping {
            start,
            end: start + 0x1000,
            perms: perms.into(),
            offset,
            path: "/lib/liblock.so".into(),
        };
        let maps = [
            mapping(0x7000_0000, "r--p", 0),
            mapping(0x7000_2000, "r-xp", 0x1000),
            mapping(0x7100_0000, "r--p", 0),
            mapping(0x7100_2000, "r-xp", 0x1000),
        ];
        assert_eq!(
            load_biases(&maps, "/lib/liblock.so", &symbols),
            vec![0x7000_0000, 0x7100_0000]
        );
        assert_eq!(
            load_biases(&maps[..1], "/lib/liblock.so", &symbols),
            vec![0x7000_0000]
        );
    }

    /// `start-end perms [path]` lines, as /proc/PID/maps has them.
    fn mappings(text: &str) -> Vec<Mapping> {
        text.lines()
            .map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let (start, end) = fields[0].split_once('-').unwrap();
                Mapping {
                    start: u64::from_str_radix(start, 16).unwrap(),
                    end: u64::from_str_radix(end, 16).unwrap(),
                    perms: fields[1].to_string(),
                    offset: 0,
                    path: fields.get(5).unwrap_or(&"").to_string(),
                }
            })
            .collect()
    }

    /// Anonymous mappings of the real FrankenPHP (Go 1.27, cgo, glibc) under
    /// load, from /proc/PID/maps: the Go heap at a random base between
    /// no-access reservations, glibc arenas back to back, and pthread stacks
    /// above their guard pages.
    const FRANKENPHP_MAPS: &str = "\
35b728000000-35b72a400000 ---p 00000000 00:00 0
35b72a400000-35b72b000000 rw-p 00000000 00:00 0
35b72b000000-35b72c000000 ---p 00000000 00:00 0
7ff3b0000000-7ff3b00c3000 rw-p 00000000 00:00 0
7ff3b00c3000-7ff3b4000000 ---p 00000000 00:00 0
7ff3b4000000-7ff3b40c3000 rw-p 00000000 00:00 0
7ff3b40c3000-7ff3b8000000 ---p 00000000 00:00 0
7ff3d47f9000-7ff3d47fa000 ---p 00000000 00:00 0
7ff3d47fa000-7ff3d4ffa000 rw-p 00000000 00:00 0
7ff3d4ffa000-7ff3d4ffb000 ---p 00000000 00:00 0
7ff3d4ffb000-7ff3d57fb000 rw-p 00000000 00:00 0
7ffd14194000-7ffd141b5000 rw-p 00000000 00:00 0                          [stack]
";

    fn frankenphp(is_go: bool) -> AddressSpace {
        let mut space = AddressSpace {
            maps: mappings(FRANKENPHP_MAPS),
            is_go,
            glibc_malloc: true,
            ..AddressSpace::default()
        };
        // The main thread was in futex() on a goroutine stack; a php thread
        // on its pthread stack.
        space
            .thread_stacks
            .insert(0x35b7_2a40_0000, 0x35b7_2a81_bee0);
        space
            .thread_stacks
            .insert(0x7ff3_d4ff_b000, 0x7ff3_d57f_9880);
        space
    }

    #[test]
    fn go_runtime_words_at_a_random_heap_base_are_in_the_go_heap() {
        let space = frankenphp(true);
        // An M's park note, where FrankenPHP's Go threads sleep.
        assert_eq!(space.region_of(0x35b7_2aa3_9160), GO_HEAP);
        assert_eq!(space.region_of(0x7ff3_b000_1000), THREAD_ARENA);
        // An arena right above the previous arena's reservation is still one.
        assert_eq!(space.region_of(0x7ff3_b400_1000), THREAD_ARENA);
        assert_eq!(space.region_of(0x7ff3_d57f_0000), Region::ThreadStack);
        assert_eq!(space.region_of(0x7ffd_1419_5000), Region::Stack);
        // Chains are not searched through the Go heap.
        let heap = space.heap_ranges();
        assert!(
            !heap
                .iter()
                .any(|&(start, end)| (start..end).contains(&0x35b7_2aa3_9160))
        );
        assert!(
            heap.iter()
                .any(|&(start, end)| (start..end).contains(&0x7ff3_b400_1000))
        );
        // Not a Go program: the same memory is no Go heap.
        assert_ne!(frankenphp(false).region_of(0x35b7_2aa3_9160), GO_HEAP);
    }

    #[test]
    fn heap_regions_are_what_malloc_hands_out() {
        for region in [
            Region::Heap,
            Region::Anonymous,
            SPARE_HEAP,
            MMAP_HEAP,
            THREAD_ARENA,
        ] {
            assert!(region.is_heap(), "{region}");
        }
        for region in [
            Region::Section(".bss".into()),
            Region::Section(".data".into()),
            GO_HEAP,
            Region::ThreadStack,
            Region::Stack,
            Region::Unmapped,
        ] {
            assert!(!region.is_heap(), "{region}");
        }
    }

    /// A Go program's address space, with the highest stack pointer seen in
    /// each mapping holding one.
    fn go_program(text: &str, stacks: &[(u64, u64)]) -> AddressSpace {
        let mut space = AddressSpace {
            maps: mappings(text),
            is_go: true,
            ..AddressSpace::default()
        };
        space.thread_stacks.extend(stacks.iter().copied());
        space
    }

    /// Each address's region, and chains searched through it just where
    /// the region is heap (the searches at the end go by the region, those
    /// through memory by `heap_ranges`).
    fn assert_regions(space: &AddressSpace, expected: &[(u64, Region)]) {
        let heap = space.heap_ranges();
        for (address, region) in expected {
            assert_eq!(&space.region_of(*address), region, "{address:#x}");
            let searched = heap.iter().any(|&(s, e)| (s..e).contains(address));
            assert_eq!(searched, region.is_heap(), "{address:#x} searched");
        }
    }

    /// fixtures/goserver built static with musl (Go 1.19, cgo), from
    /// /proc/PID/maps of a run where a Go reservation was mapped right below
    /// a cgo thread's stack: the kernel merged the thread's 8 KiB guard into
    /// it (4068 KiB + 8 KiB) and musl's malloc region into the 132 KiB stack
    /// above. `lock` is `g_stats->lock`, past the stack.
    #[test]
    fn malloc_memory_merged_above_an_unguarded_thread_stack_is_heap() {
        let space = go_program(
            "\
c000000000-c000400000 rw-p 0 00:00 0
c000400000-c004000000 ---p 0 00:00 0
7f29c3263000-7f29c3265000 ---p 0 00:00 0
7f29c3265000-7f29c3286000 rw-p 0 00:00 0
7f29ea207000-7f29ea602000 ---p 0 00:00 0
7f29ea602000-7f29ea644000 rw-p 0 00:00 0
7f29ea644000-7f29ea6c4000 ---p 0 00:00 0
",
            &[
                (0xc0_0000_0000, 0xc0_0012_3f00),
                (0x7f29_c326_5000, 0x7f29_c328_5d68),
                (0x7f29_ea60_2000, 0x7f29_ea62_2cf0),
            ],
        );
        let lock = 0x7f29_ea62_3230;
        // The stack part stays out of the searches, as does the real Go
        // heap, a goroutine's stack pointer in it or not.
        assert_regions(
            &space,
            &[
                (lock, MMAP_HEAP),
                (0x7f29_ea62_2000, GO_HEAP),
                (0xc0_0030_0000, GO_HEAP),
                (0x7f29_c327_0000, Region::ThreadStack),
            ],
        );
    }

    /// The same merge under another thread's stack: its 132 KiB are the
    /// only sign of the stacks' size (the others are merged with memory
    /// above them), and the lock's stack above a guard must not take them
    /// for 388 KiB.
    #[test]
    fn an_unguarded_thread_stack_still_tells_the_stack_size() {
        let space = go_program(
            "\
7ffb76769000-7ffb7676b000 ---p 0 00:00 0
7ffb7676b000-7ffb767cc000 rw-p 0 00:00 0
7ffb9d607000-7ffb9da02000 ---p 0 00:00 0
7ffb9da02000-7ffb9da23000 rw-p 0 00:00 0
7ffb9da23000-7ffb9da25000 ---p 0 00:00 0
7ffb9da25000-7ffb9db67000 rw-p 0 00:00 0
7ffb9db67000-7ffb9dbe7000 ---p 0 00:00 0
",
            &[
                (0x7ffb_7676_b000, 0x7ffb_7678_bd68),
                (0x7ffb_9da0_2000, 0x7ffb_9da2_2c20),
                (0x7ffb_9da2_5000, 0x7ffb_9da4_5cf0),
            ],
        );
        let lock = 0x7ffb_9da4_6830;
        assert_regions(
            &space,
            &[(lock, MMAP_HEAP), (0x7ffb_9da4_5000, Region::ThreadStack)],
        );
    }

    /// A Go heap at a random base (Go 1.26 and later) whose reservation run
    /// is not 64 MiB-aligned, with 8 MiB pthread stacks: the goroutine's
    /// stack pointer marks all of it, beyond a thread stack's extent, as it
    /// starts on a 4 MiB chunk boundary.
    #[test]
    fn an_unaligned_go_heap_is_go_heap_past_a_stack_extent() {
        let mut space = frankenphp(true);
        space.maps = mappings(&FRANKENPHP_MAPS.replace("35b728000000-", "35b729000000-"));
        assert_regions(&space, &[(0x35b7_2ae0_0000, GO_HEAP)]);
    }

    /// Go 1.27 built static with musl (FrankenPHP's release binaries): no
    /// glibc arenas, and the Go heap 64 MiB-aligned with its reservation above.
    #[test]
    fn an_aligned_go_heap_without_glibc_is_no_thread_arena() {
        let mut space = AddressSpace {
            maps: mappings(
                "2bbc94000000-2bbc94400000 rw-p 0 00:00 0\n2bbc94400000-2bbc98000000 ---p 0 00:00 0\n",
            ),
            is_go: true,
            ..AddressSpace::default()
        };
        assert_eq!(space.region_of(0x2bbc_9418_1160), GO_HEAP);
        assert!(space.heap_ranges().is_empty());
        // Where glibc's malloc is, the same layout is one of its arenas.
        space.glibc_malloc = true;
        assert_eq!(space.region_of(0x2bbc_9418_1160), THREAD_ARENA);
    }
}
