//! Where the target's lock code is: the runtime range of every lock, unlock
//! and trylock function and of libc's internal lock slow paths, one range
//! per function, for the CPU sampler. Read from the symbols (with the debug
//! file, where glibc keeps `__lll_lock_wait` and friends) of the modules the
//! lock functions come from: the executable first (static builds), then libc.
use std::collections::BTreeSet;

use tracer_common::{CodeRange, MAX_CPU_LOCK_CODE_RANGES};

use super::{elf::ModuleSymbols, region::load_biases};
use crate::probe::{
    lockfuncs::{self, LockFunction},
    target::Target,
};

/// Lock code by symbol: the public functions (glibc and musl), glibc's
/// internal slow paths and aliases, musl's internal lock and wait functions.
const LOCK_CODE_SYMBOLS: &[&str] = &[
    "pthread_mutex_lock",
    "pthread_mutex_trylock",
    "pthread_mutex_timedlock",
    "pthread_mutex_clocklock",
    "pthread_mutex_unlock",
    "pthread_rwlock_rdlock",
    "pthread_rwlock_wrlock",
    "pthread_rwlock_tryrdlock",
    "pthread_rwlock_trywrlock",
    "pthread_rwlock_timedrdlock",
    "pthread_rwlock_timedwrlock",
    "pthread_rwlock_clockrdlock",
    "pthread_rwlock_clockwrlock",
    "pthread_rwlock_unlock",
    "pthread_spin_lock",
    "pthread_spin_trylock",
    "pthread_spin_unlock",
    // glibc's slow paths
    "__lll_lock_wait",
    "__lll_lock_wake",
    "__lll_lock_wait_private",
    "__lll_lock_wake_private",
    "__lll_clocklock_wait",
    "__lll_lock_elision",
    "__lll_unlock_elision",
    "__lll_trylock_elision",
    "__pthread_mutex_lock_full",
    "__pthread_mutex_unlock_full",
    "__pthread_mutex_unlock_usercnt",
    "__pthread_mutex_clocklock_common",
    "__pthread_rwlock_rdlock_full64",
    "__pthread_rwlock_wrlock_full64",
    // musl's
    "__lock",
    "__unlock",
    "__wait",
    "__timedwait",
    "__timedwait_cp",
    "__pthread_mutex_trylock_owner",
];

/// The runtime code ranges of the lock code in the modules of `functions`
/// (at most [`MAX_CPU_LOCK_CODE_RANGES`]), sorted, aliases merged (as
/// `LOCK_CODE`'s, by [`lockfuncs::code_ranges`]).
pub(crate) fn ranges(target: &Target, functions: &[LockFunction]) -> Vec<CodeRange> {
    let modules: BTreeSet<&str> = functions.iter().map(|f| f.module.as_str()).collect();
    let root = target.host_path("/");
    let mut found = Vec::new();
    for module in modules {
        let Ok(file) = target.module_file(module) else {
            continue;
        };
        let Ok(symbols) = ModuleSymbols::parse(file.bytes(), module, Some(&root)) else {
            continue;
        };
        for bias in load_biases(&target.maps, module, &symbols) {
            for function in symbols.functions.iter().filter(|f| is_lock_code(&f.name)) {
                if function.size > 0 {
                    let start = bias.wrapping_add(function.address);
                    found.push((start, start.wrapping_add(function.size)));
                }
            }
        }
    }
    lockfuncs::code_ranges(found, MAX_CPU_LOCK_CODE_RANGES)
}

/// `name` is a lock-code symbol, also as a versioned (`name@GLIBC_2.2.5`)
/// or underscored alias (`__pthread_mutex_lock`, `___pthread_mutex_lock`).
fn is_lock_code(name: &str) -> bool {
    let unversioned = name.split('@').next().unwrap_or(name);
    LOCK_CODE_SYMBOLS.iter().any(|symbol| {
        unversioned == *symbol
            || (symbol.starts_with("pthread_")
                && unversioned.trim_start_matches('_') == *symbol
                && unversioned.starts_with("__"))
    })
}

#[cfg(test)]
mod tests {
    use super::is_lock_code;

    #[test]
    fn lock_code_symbols_and_aliases() {
        for name in [
            "pthread_mutex_lock@@GLIBC_2.2.5",
            "___pthread_mutex_lock",
            "__pthread_mutex_unlock_usercnt",
            "__lll_lock_wait",
            "__lock",
            "pthread_rwlock_unlock",
        ] {
            assert!(is_lock_code(name), "{name}");
        }
        for name in [
            "pthread_mutex_init",
            "__lll_lock_waitx",
            "lock",
            "_pthread_mutex_lock",
            "malloc",
        ] {
            assert!(!is_lock_code(name), "{name}");
        }
    }
}
