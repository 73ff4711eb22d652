//! What a lock's DWARF type says about its futex waits. Lock functions
//! mark the words they work on as locks; two kinds of lock take none
//! that can be probed (issue 35):
//!
//! - a futex word typed as a lock: Rust's `std::sync::Mutex` and `RwLock`
//!   inline their fast paths, so only the futex waits are seen;
//! - a condition variable inside a lock built from a mutex and a condvar:
//!   CPython's GIL (`_gil_runtime_state`) makes its waiters wait on `cond`
//!   until the holder lets go, which is waiting for the lock, not for work.
//!
//! Both count as lock contention once the type says so, and the report
//! says which type did (`locks[].declared`).
use crate::model::{DeclaredContention, DeclaredType, Lock, LockKind, WaitClass};

/// The declared type of a position from the types walked down to it
/// (outermost first, its own last); None when its own type has no name.
pub(crate) fn declared(types: &[Option<String>]) -> Option<DeclaredType> {
    let (own, outer) = types.split_last()?;
    Some(DeclaredType {
        type_name: own.clone()?,
        inside: outer.iter().rev().flatten().next().cloned(),
        contention: None,
        layout: crate::model::LayoutSource::Dwarf,
    })
}

/// Marks the rows whose declared type makes their waits lock contention
/// (`declared.contention`); the pipeline then counts them as contention
/// (`analysis::waits::count_declared_contention`).
pub(crate) fn mark_contention(locks: &mut [Lock]) {
    for lock in locks {
        let Some(why) = contention_of(lock) else {
            continue;
        };
        if let Some(declared) = &mut lock.declared {
            declared.contention = Some(why);
        }
    }
}

/// Why a row that no lock function marked is contention after all.
fn contention_of(lock: &Lock) -> Option<DeclaredContention> {
    let declared = lock.declared.as_ref()?;
    match (lock.kind, lock.wait_class) {
        (LockKind::Futex, WaitClass::Other) if is_lock_type(&declared.type_name) => {
            Some(DeclaredContention::FutexLock)
        }
        (LockKind::Condvar, WaitClass::Condvar)
            if declared
                .inside
                .as_deref()
                .is_some_and(is_lock_built_on_a_condvar) =>
        {
            Some(DeclaredContention::CondvarOfLock)
        }
        _ => None,
    }
}

/// A mutual-exclusion lock's type: `Mutex<u64>`, `RwLock<T>`,
/// `std::sys::sync::mutex::futex::Mutex`; not a condvar, once or semaphore.
fn is_lock_type(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    let base = lower.split('<').next().unwrap_or(&lower);
    ["mutex", "rwlock", "spinlock"]
        .iter()
        .any(|word| base.contains(word))
        || base == "lock"
        || base.ends_with("::lock")
}

/// A type holding a condvar that is a lock itself: the GIL (`gil` as a
/// word: `_gil_runtime_state`), or a type named as a lock (`struct
/// my_rwlock { pthread_mutex_t m; pthread_cond_t readers; … }`).
fn is_lock_built_on_a_condvar(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| matches!(word, "gil" | "lock" | "mutex" | "rwlock" | "spinlock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types(names: &[Option<&str>]) -> Vec<Option<String>> {
        names.iter().map(|n| n.map(str::to_string)).collect()
    }

    #[test]
    fn the_own_type_and_the_nearest_named_one_holding_it() {
        let gil = declared(&types(&[
            Some("_PyRuntimeState"),
            Some("_gil_runtime_state"),
            None,
            Some("pthread_cond_t"),
        ]))
        .unwrap();
        assert_eq!(gil.type_name, "pthread_cond_t");
        assert_eq!(gil.inside.as_deref(), Some("_gil_runtime_state"));
        assert!(declared(&types(&[Some("outer"), None])).is_none());
        assert!(declared(&[]).is_none());
    }

    #[test]
    fn lock_types_and_lock_holders() {
        for name in [
            "Mutex<u64>",
            "RwLock<alloc::string::String>",
            "Mutex",
            "my_spinlock_t",
        ] {
            assert!(is_lock_type(name), "{name}");
        }
        for name in [
            "Condvar",
            "Once",
            "AtomicU32",
            "Semaphore",
            "pthread_cond_t",
        ] {
            assert!(!is_lock_type(name), "{name}");
        }
        for name in ["_gil_runtime_state", "my_rwlock", "struct lock"] {
            assert!(is_lock_built_on_a_condvar(name), "{name}");
        }
        for name in ["work_queue", "vigilant_pool", "blocker", "thread_pool"] {
            assert!(!is_lock_built_on_a_condvar(name), "{name}");
        }
    }
}
