//! Finds what tells waiting for work apart from lock contention: the
//! condition-variable wait functions (glibc's and musl's, in the executable
//! first for static builds, as for the lock functions) and, in a Go program,
//! the Go runtime's `runtime.futex`, the one function that makes its futex
//! calls. `trace::attach` attaches the condvar probes.
use std::collections::BTreeSet;

use object::{Object, ObjectSymbol};

use super::{
    lockfuncs::{file_offset_of, runtime_address},
    modules::{function_range, functions_named},
    target::Target,
};

/// The condvar wait functions; all take (cond, mutex, …).
pub(crate) const COND_WAIT_SYMBOLS: [&str; 3] = [
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "pthread_cond_clockwait",
];

/// One condvar wait function (one symbol version) in one module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CondWaitFunction {
    pub symbol: String,
    /// Module path as the target sees it.
    pub module: String,
    pub file_offset: u64,
}

/// The lock init functions, probed for where locks are created (`--stacks`).
pub(crate) const LOCK_INIT_SYMBOLS: [&str; 3] = [
    "pthread_mutex_init",
    "pthread_rwlock_init",
    "pthread_spin_init",
];

#[derive(Debug, Clone, Default)]
pub struct WaitFunctions {
    pub cond_waits: Vec<CondWaitFunction>,
    /// The lock init functions (same shape: symbol, module, entry), found
    /// like the condvar waits.
    pub lock_inits: Vec<CondWaitFunction>,
    /// Runtime address range of `runtime.futex` when the target is a Go program.
    pub go_futex: Option<(u64, u64)>,
}

/// Looks in the executable first, then the libraries in load order; each
/// symbol is taken from the first module defining it, every version of it
/// (glibc keeps an old `pthread_cond_wait@GLIBC_2.2.5` beside the current one).
pub(crate) fn find(target: &Target) -> WaitFunctions {
    let mut modules: Vec<String> = Vec::new();
    for mapping in target
        .maps
        .iter()
        .filter(|m| m.is_file() && m.is_executable())
    {
        if modules.contains(&mapping.path) {
            continue;
        }
        if mapping.path == target.exe {
            modules.insert(0, mapping.path.clone());
        } else {
            modules.push(mapping.path.clone());
        }
    }
    let mut found = WaitFunctions::default();
    let mut pending: Vec<&str> = COND_WAIT_SYMBOLS.to_vec();
    pending.extend(LOCK_INIT_SYMBOLS);
    for (index, module) in modules.iter().enumerate() {
        let Ok(file) = target.module_file(module) else {
            continue;
        };
        let Ok(elf) = file.elf() else {
            continue;
        };
        if index == 0 && module == &target.exe {
            found.go_futex = go_futex(&elf, module, target);
        }
        let stripped_static = module == &target.exe
            && elf.symbols().next().is_none()
            && super::lockfuncs::is_static(file.bytes());
        let by_code = if stripped_static {
            by_libc_code(&elf, file.bytes(), &pending)
        } else {
            Vec::new()
        };
        pending.retain(|name| {
            let offsets = if stripped_static {
                by_code
                    .iter()
                    .filter(|(symbol, _)| symbol == name)
                    .map(|&(_, offset)| offset)
                    .collect()
            } else {
                definitions(&elf, name)
            };
            let list = if LOCK_INIT_SYMBOLS.contains(name) {
                &mut found.lock_inits
            } else {
                &mut found.cond_waits
            };
            for &file_offset in &offsets {
                list.push(CondWaitFunction {
                    symbol: name.to_string(),
                    module: module.clone(),
                    file_offset,
                });
            }
            offsets.is_empty()
        });
        if pending.is_empty() {
            break;
        }
    }
    found
}

/// A stripped static executable has no symbols for libc's functions: each
/// of `names` found by its code in the libc archive the executable was
/// linked with (the one whose mutex lock occurs in it exactly once, as
/// `lockfuncs` finds the lock functions), where it occurs exactly once.
/// musl's `pthread_cond_wait` is a bare jump, too short to match: its
/// callers are caught by `pthread_cond_timedwait`, which it jumps to.
fn by_libc_code(elf: &object::File, bytes: &[u8], names: &[&str]) -> Vec<(String, u64)> {
    let Some(archive) = super::libc_code::LibcArchive::installed()
        .into_iter()
        .find(|archive| {
            archive
                .unique_in(elf, bytes, "pthread_mutex_lock")
                .is_some()
        })
    else {
        return Vec::new();
    };
    names
        .iter()
        .filter_map(|name| {
            let (offset, _) = archive.unique_in(elf, bytes, name)?;
            Some((name.to_string(), offset))
        })
        .collect()
}

/// File offsets of every text definition of `name` (any version), distinct.
fn definitions(elf: &object::File, name: &str) -> BTreeSet<u64> {
    functions_named(elf, name)
        .filter_map(|symbol| file_offset_of(elf, symbol.address()))
        .collect()
}

/// `runtime.futex` of a Go executable, as a runtime address range. It is
/// written in assembly, so its ELF symbol carries the ABI0 suffix; a
/// stripped Go binary has it in `.gopclntab` only (`function_range`).
fn go_futex(elf: &object::File, module: &str, target: &Target) -> Option<(u64, u64)> {
    let (address, size) = function_range(elf, "runtime.futex.abi0")
        .or_else(|| function_range(elf, "runtime.futex"))?;
    let start = runtime_address(target, module, file_offset_of(elf, address)?)?;
    Some((start, start + size.max(1)))
}
