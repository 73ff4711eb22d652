//! Finds the pthread lock functions the target actually calls: in its
//! dynamically linked libc (glibc's libc.so.6 or libpthread, musl's
//! ld-musl-*.so.1) or in the executable itself when it is statically linked.
use std::collections::BTreeSet;

use anyhow::{Context, Result};
use object::{Object, ObjectSegment, ObjectSymbol};
use tracer_common::{CallerKey, CodeRange, LockOp, MAX_LOCK_CODE_RANGES};

use super::{modules::functions_named, target::Target};
use crate::model::Collected;

/// One lock function in one module of the target.
#[derive(Debug, Clone)]
pub struct LockFunction {
    pub op: LockOp,
    /// Module path as the target sees it.
    pub module: String,
    /// Offset of the function's first byte in the module file (what uprobes take).
    pub file_offset: u64,
    /// The function's machine code (empty if the symbol has no size).
    pub code: Vec<u8>,
    /// Runtime address range of the function in the target.
    pub runtime_start: u64,
    pub runtime_end: u64,
    /// How it was found: by its symbol, or by its code in a module without
    /// a symbol table.
    pub found_by: FoundBy,
}

/// How a lock function was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FoundBy {
    Symbol,
    /// Its code matched the function in this libc archive, once.
    LibcCode {
        archive: String,
    },
}

/// Why no `pthread_mutex_lock` was found: callers branch on
/// [`LockFunctionsMissing::StillStarting`] (wait and look again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LockFunctionsMissing {
    /// The dynamic loader has not mapped all the libraries yet (a process
    /// just started): only it and the executable are mapped, or some the
    /// executable needs (`waiting`, by name) are not yet.
    StillStarting { pid: u32, waiting: Vec<String> },
    /// Modules without a symbol table (stripped), and the libc archives
    /// whose code was looked for in them.
    Stripped {
        pid: u32,
        modules: Vec<String>,
        archives: Vec<String>,
    },
    /// Modules that could not be read, with why.
    Unreadable {
        pid: u32,
        modules: Vec<(String, String)>,
    },
    /// Every module was read: none defines the lock functions.
    NotUsed { pid: u32, exe: String },
}

impl std::fmt::Display for LockFunctionsMissing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockFunctionsMissing::StillStarting { pid, waiting } if !waiting.is_empty() => write!(
                f,
                "process {pid} is still starting: its dynamic loader has not mapped {} yet; attach again once it runs",
                waiting.join(", ")
            ),
            LockFunctionsMissing::StillStarting { pid, .. } => write!(
                f,
                "process {pid} is still starting: its dynamic loader has not mapped its libraries yet; attach again once it runs"
            ),
            LockFunctionsMissing::Stripped {
                pid,
                modules,
                archives,
            } if archives.is_empty() => write!(
                f,
                "no pthread_mutex_lock symbol in process {pid}: {} has no symbol table (stripped), and no libc archive is installed to find it by its code; install musl-dev or libc6-dev (the libc it was built with), trace an unstripped build, or install its debug symbols",
                modules.join(", ")
            ),
            LockFunctionsMissing::Stripped {
                pid,
                modules,
                archives,
            } => write!(
                f,
                "no pthread_mutex_lock symbol in process {pid}: {} has no symbol table (stripped) and its code matches pthread_mutex_lock of no libc archive here ({}); install the libc it was built with, trace an unstripped build, or install its debug symbols",
                modules.join(", "),
                archives.join(", ")
            ),
            LockFunctionsMissing::Unreadable { pid, modules } => {
                let listed: Vec<String> = modules
                    .iter()
                    .map(|(module, why)| format!("{module} ({why})"))
                    .collect();
                write!(
                    f,
                    "no pthread_mutex_lock found in process {pid}, but some of its modules could not be read: {}; check they still exist and are readable, then attach again",
                    listed.join(", ")
                )
            }
            LockFunctionsMissing::NotUsed { pid, exe } => write!(
                f,
                "no libc with pthread lock functions found in process {pid} ({exe}); it does not use pthread mutexes (try --mode contention for futex-only locks)"
            ),
        }
    }
}

impl std::error::Error for LockFunctionsMissing {}

/// Every lock function, per op, from the module that defines it first in
/// symbol lookup order (the executable, then libraries in load order).
pub fn find(target: &Target) -> Result<Vec<LockFunction>> {
    let search = find_ops(target, &LockOp::ALL)?;
    if search.found.iter().any(|f| f.op == LockOp::MutexLock) {
        return Ok(search.found);
    }
    let pid = target.pid;
    let missing = if !search.unreadable.is_empty() {
        LockFunctionsMissing::Unreadable {
            pid,
            modules: search.unreadable,
        }
    } else if !search.stripped.is_empty() {
        LockFunctionsMissing::Stripped {
            pid,
            modules: search.stripped,
            archives: search.archives_tried,
        }
    } else if only_the_loader_is_mapped(target) {
        LockFunctionsMissing::StillStarting {
            pid,
            waiting: Vec::new(),
        }
    } else if let waiting @ [_, ..] = &not_yet_mapped(target)[..] {
        LockFunctionsMissing::StillStarting {
            pid,
            waiting: waiting.to_vec(),
        }
    } else {
        LockFunctionsMissing::NotUsed {
            pid,
            exe: target.exe.clone(),
        }
    };
    Err(missing.into())
}

/// True while the process's dynamic loader has not mapped all the libraries
/// its executable needs (a process that just exec'd).
pub(crate) fn still_starting(target: &Target) -> bool {
    only_the_loader_is_mapped(target) || !not_yet_mapped(target).is_empty()
}

/// True when the executable's only mapped library is a dynamic loader
/// (`ld-linux-*.so`, `ld-musl-*.so`): the loader runs and has mapped
/// nothing yet. A static executable maps no loader at all.
fn only_the_loader_is_mapped(target: &Target) -> bool {
    let libraries: BTreeSet<&str> = target
        .maps
        .iter()
        .filter(|m| m.is_file() && m.is_executable() && m.path != target.exe)
        .map(|m| m.path.as_str())
        .collect();
    let is_loader = |path: &&str| {
        path.rsplit('/')
            .next()
            .is_some_and(|name| name.starts_with("ld-linux") || name.starts_with("ld-musl"))
    };
    libraries.len() == 1 && libraries.iter().all(is_loader)
}

/// The libraries the executable needs (`DT_NEEDED`) that no mapping is
/// yet (by file or soname): the loader is still mapping them.
fn not_yet_mapped(target: &Target) -> Vec<String> {
    let Ok(exe) = target.module_file(&target.exe) else {
        return Vec::new();
    };
    let mut mapped = BTreeSet::new();
    for path in target.maps.iter().filter(|m| m.is_file()).map(|m| &m.path) {
        if mapped.insert(path.rsplit('/').next().unwrap_or(path).to_string())
            && let Ok(file) = target.module_file(path)
            && let Some(soname) = super::modules::soname(file.bytes())
        {
            mapped.insert(soname);
        }
    }
    needed(exe.bytes())
        .into_iter()
        .filter(|name| !mapped.contains(name))
        .collect()
}

/// The `DT_NEEDED` names of a 64-bit ELF file.
fn needed(data: &[u8]) -> Vec<String> {
    use object::{
        elf,
        read::elf::{Dyn, ElfFile64},
    };
    let Ok(elf) = ElfFile64::<object::Endianness>::parse(data) else {
        return Vec::new();
    };
    let endian = elf.endian();
    let sections = elf.elf_section_table();
    let Ok(Some((entries, link))) = sections.dynamic(endian, data) else {
        return Vec::new();
    };
    let Ok(strings) = sections.strings(endian, data, link) else {
        return Vec::new();
    };
    entries
        .iter()
        .filter(|entry| entry.tag32(endian) == Some(elf::DT_NEEDED))
        .filter_map(|entry| entry.string(endian, strings).ok())
        .map(|name| String::from_utf8_lossy(name).into_owned())
        .collect()
}

/// What [`find_ops`] found, and the modules it could not search.
pub(crate) struct Search {
    pub found: Vec<LockFunction>,
    /// Modules without a symbol table.
    pub stripped: Vec<String>,
    /// Modules that could not be opened or parsed, with why.
    pub unreadable: Vec<(String, String)>,
    /// The libc archives whose code was looked for in a static executable
    /// without a symbol table.
    pub archives_tried: Vec<String>,
}

/// The functions of `ops` found, each from the first module in lookup order
/// that defines it, and the modules passed over.
pub(crate) fn find_ops(target: &Target, ops: &[LockOp]) -> Result<Search> {
    let mut modules: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    // The executable first: a static binary (or one that interposes) wins.
    for mapping in &target.maps {
        if mapping.is_file() && mapping.is_executable() && seen.insert(mapping.path.clone()) {
            if mapping.path == target.exe {
                modules.insert(0, mapping.path.clone());
            } else {
                modules.push(mapping.path.clone());
            }
        }
    }
    let mut search = Search {
        found: Vec::new(),
        stripped: Vec::new(),
        unreadable: Vec::new(),
        archives_tried: Vec::new(),
    };
    for module in &modules {
        let missing: Vec<LockOp> = ops
            .iter()
            .copied()
            .filter(|op| !search.found.iter().any(|f| f.op == *op))
            .collect();
        if missing.is_empty() {
            break;
        }
        let file = match target.module_file(module) {
            Ok(file) => file,
            Err(error) => {
                search
                    .unreadable
                    .push((module.clone(), format!("{error:#}")));
                continue;
            }
        };
        let elf = match file.elf() {
            Ok(elf) => elf,
            Err(error) => {
                search
                    .unreadable
                    .push((module.clone(), format!("{error:#}")));
                continue;
            }
        };
        let no_symbol_table = elf.symbols().next().is_none();
        if no_symbol_table && module == &target.exe && is_static(file.bytes()) {
            let by_code = by_libc_code(&elf, file.bytes(), &missing, module, target);
            search.archives_tried = by_code.archives_tried;
            if by_code.found.is_empty() {
                search.stripped.push(module.clone());
            }
            search.found.extend(by_code.found);
            continue;
        }
        if no_symbol_table && elf.dynamic_symbols().next().is_none() {
            search.stripped.push(module.clone());
            continue;
        }
        for op in missing {
            if let Some(function) = lookup(&elf, file.bytes(), op, module, target)? {
                search.found.push(function);
            }
        }
    }
    Ok(search)
}

fn lookup(
    elf: &object::File,
    data: &[u8],
    op: LockOp,
    module: &str,
    target: &Target,
) -> Result<Option<LockFunction>> {
    let Some(symbol) = functions_named(elf, op.symbol()).next() else {
        return Ok(None);
    };
    let address = symbol.address();
    let Some(file_offset) = file_offset_of(elf, address) else {
        return Ok(None);
    };
    let size = symbol.size() as usize;
    let code = data
        .get(file_offset as usize..file_offset as usize + size)
        .unwrap_or_default()
        .to_vec();
    let runtime_start = runtime_address(target, module, file_offset).with_context(|| {
        format!(
            "{module} is not mapped executable in process {}",
            target.pid
        )
    })?;
    Ok(Some(LockFunction {
        op,
        module: module.to_string(),
        file_offset,
        code,
        runtime_start,
        runtime_end: runtime_start + size.max(1) as u64,
        found_by: FoundBy::Symbol,
    }))
}

/// An executable without a program interpreter: libc is linked in.
pub(crate) fn is_static(bytes: &[u8]) -> bool {
    use object::read::elf::{FileHeader, ProgramHeader};
    let Ok(header) = object::elf::FileHeader64::<object::Endianness>::parse(bytes) else {
        return false;
    };
    let Ok(endian) = header.endian() else {
        return false;
    };
    header.program_headers(endian, bytes).is_ok_and(|headers| {
        !headers
            .iter()
            .any(|h| h.p_type(endian) == object::elf::PT_INTERP)
    })
}

/// What [`by_libc_code`] found, and the archives it tried.
pub(crate) struct ByCode {
    pub found: Vec<LockFunction>,
    pub archives_tried: Vec<String>,
}

/// The `ops` found by their code from the first libc archive whose
/// `pthread_mutex_lock` occurs exactly once in the module (the libc it was
/// linked with); the other ops from that archive, each where unique.
fn by_libc_code(
    elf: &object::File,
    bytes: &[u8],
    ops: &[LockOp],
    module: &str,
    target: &Target,
) -> ByCode {
    let mut archives_tried = Vec::new();
    for archive in super::libc_code::LibcArchive::installed() {
        let shown = archive.path.display().to_string();
        archives_tried.push(shown.clone());
        let found_at = |op: LockOp| archive.unique_in(elf, bytes, op.symbol());
        // The archive that built the module is the one whose mutex lock is
        // there; that search's result is kept for the op itself.
        let Some(mutex_lock) = found_at(LockOp::MutexLock) else {
            continue;
        };
        let mut mutex_lock = Some(mutex_lock);
        let found = ops
            .iter()
            .filter_map(|&op| {
                let (file_offset, code) = match op {
                    LockOp::MutexLock => mutex_lock.take()?,
                    _ => found_at(op)?,
                };
                let runtime_start = runtime_address(target, module, file_offset)?;
                Some(LockFunction {
                    op,
                    module: module.to_string(),
                    file_offset,
                    runtime_end: runtime_start + code.len() as u64,
                    code,
                    runtime_start,
                    found_by: FoundBy::LibcCode {
                        archive: shown.clone(),
                    },
                })
            })
            .collect();
        return ByCode {
            found,
            archives_tried,
        };
    }
    ByCode {
        found: Vec::new(),
        archives_tried,
    }
}

/// File offset of an ELF virtual address, through the segment that maps it.
pub(crate) fn file_offset_of(elf: &object::File, address: u64) -> Option<u64> {
    elf.segments().find_map(|segment| {
        let (file_start, file_size) = segment.file_range();
        let start = segment.address();
        (address >= start && address < start + file_size).then(|| address - start + file_start)
    })
}

/// Runtime address in the target of a file offset in `module`.
pub(crate) fn runtime_address(target: &Target, module: &str, file_offset: u64) -> Option<u64> {
    target.maps.iter().find_map(|mapping| {
        let end_offset = mapping.offset + (mapping.end - mapping.start);
        (mapping.path == module && file_offset >= mapping.offset && file_offset < end_offset)
            .then(|| mapping.start + file_offset - mapping.offset)
    })
}

/// The unlock functions, from the modules the lock functions came from
/// (the executable first, as for the lock functions).
pub(crate) fn find_unlocks(target: &Target) -> Result<Vec<LockFunction>> {
    let found = find_ops(target, &LockOp::UNLOCKS)?.found;
    if !found.iter().any(|f| f.op == LockOp::MutexUnlock) {
        anyhow::bail!(
            "--hold-times: no pthread_mutex_unlock symbol in process {}; record without --hold-times",
            target.pid
        );
    }
    Ok(found)
}

/// Runtime code range `[start, end)` of each lock function (at most
/// [`MAX_LOCK_CODE_RANGES`]): a lock call returning into one came from
/// another lock function (musl nests them). One range per function, not one
/// spanning them all: an interposer library loaded between two modules' lock
/// functions must not fall inside.
pub(crate) fn lock_code_ranges(functions: &[LockFunction]) -> Vec<CodeRange> {
    code_ranges(
        functions.iter().map(|f| (f.runtime_start, f.runtime_end)),
        MAX_LOCK_CODE_RANGES,
    )
}

/// Both lock-code maps' ranges, `LOCK_CODE` (the lock functions, for hold
/// times: [`lock_code_ranges`]) and `CPU_LOCK_CODE` (with libc's slow paths,
/// for the CPU sampler: `naming::lock_code`): the non-empty `[start, end)`
/// ranges, sorted, repeats (aliases) once, the first `most` of them.
pub(crate) fn code_ranges(
    ranges: impl IntoIterator<Item = (u64, u64)>,
    most: u32,
) -> Vec<CodeRange> {
    let sorted: BTreeSet<(u64, u64)> = ranges
        .into_iter()
        .filter(|(start, end)| start < end)
        .collect();
    sorted
        .into_iter()
        .take(most as usize)
        .map(|(start, end)| CodeRange { start, end })
        .collect()
}

/// True for a lock call made by another lock function: called from inside
/// one, or tail-called by one. One call site calls one function, so a second
/// op seen with the same return address was tail-called by the first (musl's
/// pthread_mutex_lock jumps to pthread_mutex_timedlock when contended).
pub(crate) fn is_nested_call(
    key: &CallerKey,
    collected: &Collected,
    functions: &[LockFunction],
) -> bool {
    let from_lock_function = in_lock_function(key.return_ip, functions);
    let tail_called = tail_callers(key.op).iter().any(|&outer| {
        collected.callers.contains_key(&CallerKey {
            op: outer as u32,
            ..*key
        })
    });
    from_lock_function || tail_called
}

/// True when `ip` is in the code of one of the lock functions.
pub(crate) fn in_lock_function(ip: u64, functions: &[LockFunction]) -> bool {
    functions
        .iter()
        .any(|f| (f.runtime_start..f.runtime_end).contains(&ip))
}

/// Lock functions that may tail-call the function of `op` (musl: the
/// plain lock jumps to the timed one, which calls the try variant).
fn tail_callers(op: u32) -> &'static [LockOp] {
    match LockOp::from_index(op) {
        Some(LockOp::MutexTimedlock | LockOp::MutexClocklock) => &[LockOp::MutexLock],
        Some(LockOp::MutexTrylock) => &[LockOp::MutexLock, LockOp::MutexTimedlock],
        Some(LockOp::RwlockTimedrdlock) => &[LockOp::RwlockRdlock],
        Some(LockOp::RwlockTryrdlock) => &[LockOp::RwlockRdlock, LockOp::RwlockTimedrdlock],
        Some(LockOp::RwlockTimedwrlock) => &[LockOp::RwlockWrlock],
        Some(LockOp::RwlockTrywrlock) => &[LockOp::RwlockWrlock, LockOp::RwlockTimedwrlock],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(op: LockOp, module: &str, start: u64, end: u64) -> LockFunction {
        LockFunction {
            op,
            module: module.into(),
            file_offset: 0,
            code: Vec::new(),
            runtime_start: start,
            runtime_end: end,
            found_by: FoundBy::Symbol,
        }
    }

    /// An interposer library between the executable's and libc's lock
    /// functions is in none of the ranges.
    #[test]
    fn one_code_range_per_function() {
        let functions = [
            function(LockOp::MutexLock, "/exe", 0x40_1000, 0x40_1080),
            function(
                LockOp::MutexTrylock,
                "libc.so.6",
                0x7f00_0000_2000,
                0x7f00_0000_2100,
            ),
            function(
                LockOp::MutexTrylock,
                "libc.so.6",
                0x7f00_0000_2000,
                0x7f00_0000_2100,
            ),
            function(LockOp::MutexTimedlock, "empty", 0x9000, 0x9000),
        ];
        let ranges: Vec<[u64; 2]> = lock_code_ranges(&functions)
            .iter()
            .map(|range| [range.start, range.end])
            .collect();
        assert_eq!(
            ranges,
            vec![[0x40_1000, 0x40_1080], [0x7f00_0000_2000, 0x7f00_0000_2100]]
        );
        let interposer = 0x7e00_0000_0000;
        assert!(
            !ranges
                .iter()
                .any(|[start, end]| (*start..*end).contains(&interposer))
        );
    }
}
