//! Caller functions of each lock: the symbols around the return addresses
//! the CALLERS map saw. They survive a restart (the lock address does not),
//! so `compare` can match a lock across runs by them when no name is known.
//! Minimal on purpose (ELF .symtab/.dynsym only); the naming work adds
//! richer `callers`, which compare prefers.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use object::{Object, ObjectSymbol, SymbolKind};

use crate::{collect::Collected, lockfuncs::LockFunction, report::Report, target::Target};

/// Fills `caller_functions` of every lock in the report.
pub fn annotate(
    report: &mut Report,
    target: &Target,
    collected: &Collected,
    functions: &[LockFunction],
) {
    let mut resolver = Resolver::new(target);
    let mut by_lock: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for key in collected.callers.keys() {
        // Calls made inside a lock function (musl's lock calling trylock) are not callers.
        if functions
            .iter()
            .any(|f| (f.runtime_start..f.runtime_end).contains(&key.return_ip))
        {
            continue;
        }
        // The return address may be the first byte after a function ending in a call.
        let name = resolver.function_at(key.return_ip.saturating_sub(1));
        by_lock.entry(key.lock).or_default().insert(name);
    }
    for lock in &mut report.locks {
        let Some(address) = lock
            .address
            .strip_prefix("0x")
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        else {
            continue;
        };
        if let Some(names) = by_lock.get(&address) {
            lock.caller_functions = names.iter().cloned().collect();
        }
    }
}

/// Function symbols per module file, loaded on first use.
struct Resolver<'a> {
    target: &'a Target,
    /// Per module: (start vaddr, end vaddr, name) sorted, and the PT_LOAD (file offset -> vaddr) bias list.
    modules: HashMap<String, Option<ModuleSymbols>>,
}

struct ModuleSymbols {
    functions: Vec<(u64, u64, String)>,
    /// (file start, file end, vaddr start) of each loaded segment.
    segments: Vec<(u64, u64, u64)>,
}

impl<'a> Resolver<'a> {
    fn new(target: &'a Target) -> Self {
        Resolver {
            target,
            modules: HashMap::new(),
        }
    }

    /// `function` (or `module+0xoffset` when no symbol covers the address).
    fn function_at(&mut self, address: u64) -> String {
        let Some(mapping) = self.target.mapping_of(address) else {
            return "?".into();
        };
        let file = mapping
            .path
            .rsplit('/')
            .next()
            .unwrap_or(&mapping.path)
            .to_string();
        let file_offset = address - mapping.start + mapping.offset;
        if !mapping.is_file() {
            return format!("{file}+{file_offset:#x}");
        }
        let path = mapping.path.clone();
        let target = self.target;
        let symbols = self
            .modules
            .entry(path.clone())
            .or_insert_with(|| load(target, &path));
        let name = symbols.as_ref().and_then(|symbols| {
            let vaddr = symbols
                .segments
                .iter()
                .find(|(start, end, _)| (*start..*end).contains(&file_offset))
                .map(|(start, _, vaddr)| file_offset - start + vaddr)?;
            let index = symbols
                .functions
                .partition_point(|(start, _, _)| *start <= vaddr);
            let (_, end, name) = symbols.functions.get(index.checked_sub(1)?)?;
            (vaddr < *end).then(|| name.clone())
        });
        name.unwrap_or_else(|| format!("{file}+{file_offset:#x}"))
    }
}

fn load(target: &Target, path: &str) -> Option<ModuleSymbols> {
    use object::ObjectSegment;
    let data = std::fs::read(target.host_path(path)).ok()?;
    let elf = object::File::parse(&*data).ok()?;
    let mut functions: Vec<(u64, u64, String)> = elf
        .symbols()
        .chain(elf.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.size() > 0)
        .filter_map(|s| {
            let name = s.name().ok()?;
            let name = name.split('@').next().unwrap_or(name);
            Some((s.address(), s.address() + s.size(), name.to_string()))
        })
        .collect();
    functions.sort();
    functions.dedup_by_key(|(start, _, _)| *start);
    let segments = elf
        .segments()
        .map(|segment| {
            let (file_start, file_size) = segment.file_range();
            (file_start, file_start + file_size, segment.address())
        })
        .collect();
    Some(ModuleSymbols {
        functions,
        segments,
    })
}
