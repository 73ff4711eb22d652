//! Pointer-chain naming for locks on the heap: which global variable's
//! pointers lead to the lock (`g_stats->+0x148->`), found by reading the
//! live target's memory breadth-first from its modules' data, with bounded
//! hops, field offsets, reads and time.
use std::{
    collections::{BTreeMap, BTreeSet, HashSet, VecDeque},
    time::{Duration, Instant},
};

use super::region::AddressSpace;

/// Pointer dereferences from the global to the lock.
pub const MAX_HOPS: usize = 3;
/// Largest field offset followed inside a pointed-to object.
pub const MAX_FIELD_OFFSET: u64 = 0x400;
pub const TIME_BUDGET: Duration = Duration::from_secs(2);
const MAX_READS: usize = 200_000;

/// How the search went, for the report.
#[derive(Debug, Default, Clone)]
pub struct SearchOutcome {
    pub chains: BTreeMap<u64, String>,
    pub pointers_followed: usize,
    /// False when the time or read budget ran out first.
    pub complete: bool,
    pub elapsed: Duration,
}

/// Reads the target's memory (process_vm_readv: no ptrace stop needed).
pub struct Memory {
    pid: i32,
}

impl Memory {
    pub fn new(pid: u32) -> Memory {
        Memory { pid: pid as i32 }
    }

    /// Reads up to `buffer.len()` bytes at `address`; returns how many were read.
    pub fn read(&self, address: u64, buffer: &mut [u8]) -> usize {
        let local = libc::iovec {
            iov_base: buffer.as_mut_ptr().cast(),
            iov_len: buffer.len(),
        };
        let remote = libc::iovec {
            iov_base: address as *mut libc::c_void,
            iov_len: buffer.len(),
        };
        // SAFETY: the local iovec covers exactly `buffer`; the remote one is only read by the kernel.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        n.max(0) as usize
    }
}

/// (ends inside an object, hops, origin class, final offset): lower is better.
type ChainRank = (bool, usize, u8, u64);

struct Node {
    /// Address the last pointer points to (start of the pointed-to object).
    object: u64,
    /// Rendered chain up to and including the dereference that reached `object`.
    path: String,
    hops: usize,
    /// Where the chain starts: 0 the executable, 1 a library.
    origin_class: u8,
}

/// Searches chains to each of `locks` (heap addresses), breadth-first from
/// the pointers held in named globals. A chain ending in a pointer to the
/// lock itself wins over one ending inside a larger object, then fewer hops,
/// then a start in the executable over one in a library.
pub fn search(space: &AddressSpace, memory: &Memory, locks: &[u64]) -> SearchOutcome {
    let started = Instant::now();
    let mut outcome = SearchOutcome {
        complete: true,
        ..SearchOutcome::default()
    };
    let wanted: BTreeSet<u64> = locks.iter().copied().collect();
    if wanted.is_empty() {
        return outcome;
    }
    let heap_ranges = space.heap_ranges();
    let tcache_key = read_tcache_key(space, memory);
    // Under glibc's malloc every object starts a chunk with a size word; a
    // pointer without one points into the middle of something (an arena
    // block, a string), and locks merely near it are not inside it.
    let glibc_malloc = space
        .modules
        .iter()
        .any(|m| m.symbols.functions.iter().any(|f| f.name == "malloc_trim"));
    let is_heap = |value: u64| {
        heap_ranges
            .iter()
            .any(|&(start, end)| value >= start && value < end)
    };
    // Best chain so far per lock: (ends inside an object, hops, origin, offset), text.
    let mut best: BTreeMap<u64, (ChainRank, String)> = BTreeMap::new();
    let executable = space
        .maps
        .iter()
        .find(|m| m.is_file())
        .map(|m| m.path.as_str());

    let mut queue = VecDeque::new();
    let mut visited = HashSet::new();
    let mut reads = 0usize;
    // Hop 1: pointers stored in named globals.
    // Executable first, so breadth-first order is also origin order.
    let mut modules: Vec<_> = space.modules.iter().collect();
    modules.sort_by_key(|module| Some(module.path.as_str()) != executable);
    for module in modules {
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
        let origin_class = if is_executable { 0 } else { 1 };
        for section in module
            .symbols
            .sections
            .iter()
            .filter(|s| is_global_data(&s.name))
        {
            let start = section.address.wrapping_add(module.bias);
            let mut bytes = vec![0u8; section.size.min(64 << 20) as usize];
            let read = memory.read(start, &mut bytes);
            reads += 1;
            for (index, word) in bytes[..read].chunks_exact(8).enumerate() {
                let value = u64::from_le_bytes(word.try_into().unwrap_or_default());
                if !is_heap(value) {
                    continue;
                }
                let slot = start + index as u64 * 8;
                let Some((symbol, offset)) = module.symbols.object_at(module.link_address(slot))
                else {
                    continue;
                };
                if is_runtime_internal(&symbol.name) {
                    continue;
                }
                let origin = symbol.with_offset(offset);
                if visited.insert(value) {
                    queue.push_back(Node {
                        object: value,
                        path: format!("{origin}->"),
                        hops: 1,
                        origin_class,
                    });
                }
            }
        }
    }
    // The word before the object too: glibc malloc's chunk size bounds the object.
    let mut buffer = vec![0u8; 8 + MAX_FIELD_OFFSET as usize];
    while let Some(node) = queue.pop_front() {
        // Done when every lock has a chain that points right at it.
        if wanted
            .iter()
            .all(|lock| best.get(lock).is_some_and(|((inside, _, _, _), _)| !inside))
        {
            break;
        }
        if started.elapsed() > TIME_BUDGET || reads > MAX_READS {
            outcome.complete = false;
            break;
        }
        outcome.pointers_followed += 1;
        // An object at the start of a mapping has no readable word before it.
        let read = if is_heap(node.object.wrapping_sub(8)) {
            memory.read(node.object - 8, &mut buffer)
        } else {
            buffer[..8].fill(0);
            8 + memory.read(node.object, &mut buffer[8..])
        };
        reads += 1;
        if read < 16 {
            continue;
        }
        let header = u64::from_le_bytes(buffer[..8].try_into().unwrap_or_default());
        if is_freed_chunk(&buffer[..read], header, tcache_key) {
            continue; // a stale pointer to freed memory names nothing
        }
        let object_size = malloc_usable_size(header)
            .unwrap_or(MAX_FIELD_OFFSET)
            .min(read as u64 - 8);
        let match_size = match malloc_usable_size(header) {
            None if glibc_malloc => 1,
            _ => object_size,
        };
        for &lock in wanted.range(node.object..node.object + match_size) {
            let offset = lock - node.object;
            let rank = (offset != 0, node.hops, node.origin_class, offset);
            if best.get(&lock).is_none_or(|(known, _)| rank < *known) {
                best.insert(lock, (rank, render(&node.path, offset)));
            }
        }
        if node.hops >= MAX_HOPS {
            continue;
        }
        for (index, word) in buffer[8..8 + object_size as usize]
            .chunks_exact(8)
            .enumerate()
        {
            let value = u64::from_le_bytes(word.try_into().unwrap_or_default());
            if is_heap(value) && visited.insert(value) {
                let field = render(&node.path, index as u64 * 8);
                queue.push_back(Node {
                    object: value,
                    path: format!("{field}->"),
                    hops: node.hops + 1,
                    origin_class: node.origin_class,
                });
            }
        }
    }
    outcome.chains = best
        .into_iter()
        .map(|(lock, (_, chain))| (lock, chain))
        .collect();
    outcome.elapsed = started.elapsed();
    outcome
}

/// glibc marks a freed tcache chunk with the process's random `tcache_key`
/// in its second word; the key is read when a symbol table names it
/// (libc's debug file, or a static executable).
fn read_tcache_key(space: &AddressSpace, memory: &Memory) -> Option<u64> {
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
    fn renders_offsets() {
        assert_eq!(super::render("g_stats->", 0x148), "g_stats->+0x148");
        assert_eq!(super::render("g_stats->+0x148->", 0), "g_stats->+0x148->");
    }
}
