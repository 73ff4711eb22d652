//! Finds the pthread lock functions the target actually calls: in its
//! dynamically linked libc (glibc's libc.so.6 or libpthread, musl's
//! ld-musl-*.so.1) or in the executable itself when it is statically linked.
use std::collections::BTreeSet;

use anyhow::{Context, Result, bail};
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
use tracer_common::LockOp;

use super::target::Target;

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
}

/// Every lock function, per op, from the module that defines it first in
/// symbol lookup order (the executable, then libraries in load order).
pub fn find(target: &Target) -> Result<Vec<LockFunction>> {
    let (found, stripped) = find_ops(target, &LockOp::ALL)?;
    if !found.iter().any(|f| f.op == LockOp::MutexLock) {
        if !stripped.is_empty() {
            bail!(
                "no pthread_mutex_lock symbol in process {}: {} has no symbol table (stripped); trace an unstripped build or install its debug symbols",
                target.pid,
                stripped.join(", ")
            );
        }
        bail!(
            "no libc with pthread lock functions found in process {} ({}); it does not use pthread mutexes (try --mode contention for futex-only locks)",
            target.pid,
            target.exe
        );
    }
    Ok(found)
}

/// The functions of `ops` found, each from the first module in lookup order
/// that defines it, and the stripped modules passed over.
pub fn find_ops(target: &Target, ops: &[LockOp]) -> Result<(Vec<LockFunction>, Vec<String>)> {
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
    let mut found: Vec<LockFunction> = Vec::new();
    let mut stripped = Vec::new();
    for module in &modules {
        let missing: Vec<LockOp> = ops
            .iter()
            .copied()
            .filter(|op| !found.iter().any(|f| f.op == *op))
            .collect();
        if missing.is_empty() {
            break;
        }
        let Ok(file) = target.module_file(module) else {
            continue;
        };
        let Ok(elf) = file.elf() else {
            continue;
        };
        if elf.symbols().next().is_none() && elf.dynamic_symbols().next().is_none() {
            stripped.push(module.clone());
            continue;
        }
        for op in missing {
            if let Some(function) = lookup(&elf, file.bytes(), op, module, target)? {
                found.push(function);
            }
        }
    }
    Ok((found, stripped))
}

fn lookup(
    elf: &object::File,
    data: &[u8],
    op: LockOp,
    module: &str,
    target: &Target,
) -> Result<Option<LockFunction>> {
    let name = op.symbol();
    let symbol = elf.symbols().chain(elf.dynamic_symbols()).find(|symbol| {
        symbol.kind() == SymbolKind::Text
            && symbol.is_definition()
            && symbol.name().is_ok_and(|n| {
                n == name || n.strip_prefix(name).is_some_and(|v| v.starts_with('@'))
            })
    });
    let Some(symbol) = symbol else {
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
    }))
}

/// File offset of an ELF virtual address, through the segment that maps it.
pub fn file_offset_of(elf: &object::File, address: u64) -> Option<u64> {
    elf.segments().find_map(|segment| {
        let (file_start, file_size) = segment.file_range();
        let start = segment.address();
        (address >= start && address < start + file_size).then(|| address - start + file_start)
    })
}

/// Runtime address in the target of a file offset in `module`.
pub fn runtime_address(target: &Target, module: &str, file_offset: u64) -> Option<u64> {
    target.maps.iter().find_map(|mapping| {
        let end_offset = mapping.offset + (mapping.end - mapping.start);
        (mapping.path == module && file_offset >= mapping.offset && file_offset < end_offset)
            .then(|| mapping.start + file_offset - mapping.offset)
    })
}

/// The unlock functions, from the modules the lock functions came from
/// (the executable first, as for the lock functions).
pub fn find_unlocks(target: &Target) -> Result<Vec<LockFunction>> {
    let (found, _) = find_ops(target, &LockOp::UNLOCKS)?;
    if !found.iter().any(|f| f.op == LockOp::MutexUnlock) {
        anyhow::bail!(
            "--hold-times: no pthread_mutex_unlock symbol in process {}; record without --hold-times",
            target.pid
        );
    }
    Ok(found)
}

/// Runtime code range `[start, end)` of each lock function: a lock call
/// returning into one came from another lock function (musl nests them).
/// One range per function, not one spanning them all: an interposer library
/// loaded between two modules' lock functions must not fall inside.
pub fn lock_code_ranges(functions: &[LockFunction]) -> Vec<[u64; 2]> {
    let mut ranges: Vec<[u64; 2]> = functions
        .iter()
        .filter(|f| f.runtime_start < f.runtime_end)
        .map(|f| [f.runtime_start, f.runtime_end])
        .collect();
    ranges.sort_unstable();
    ranges.dedup();
    ranges
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
        let ranges = lock_code_ranges(&functions);
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
