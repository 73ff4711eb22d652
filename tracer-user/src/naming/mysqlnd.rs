//! mysqlnd's global statistics lock without debug info (issue 47). A
//! stripped libphp (or static PHP) still exports `mysqlnd_global_stats`, a
//! pointer to a `MYSQLND_STATS` whose `LOCK_access` (thread-safe builds
//! only) points to the mutex; the pointer-chain search reaches the mutex as
//! `*mysqlnd_global_stats->+0x10`. The field's offset for each PHP version,
//! checked against that version's headers, names it as an unstripped
//! build's DWARF does: `*mysqlnd_global_stats->LOCK_access`.
use crate::model::{DeclaredType, LayoutSource, LockKind};

/// The exported pointer to mysqlnd's global statistics.
pub(crate) const GLOBAL_STATS: &str = "mysqlnd_global_stats";
/// The field of `MYSQLND_STATS` pointing to its mutex.
const LOCK_FIELD: &str = "LOCK_access";
/// The lock's type, as DWARF gives it (`MUTEX_T` is `pthread_mutex_t *`).
const LOCK_TYPE: &str = "pthread_mutex_t";

/// `offsetof(MYSQLND_STATS, LOCK_access)` on x86-64 by PHP version
/// (major.minor), from each version's headers (Debian's php8.2-dev,
/// php8.4-dev, php8.5-dev; tests/suite/php_routes.rs compiles
/// `fixtures/php/mysqlnd_offsets.c` against them). 8.2 and 8.4 have
/// `values` and `count` before it; 8.5 made `values` a flexible array at
/// the end. No 8.3: Debian never released its headers.
pub const LOCK_ACCESS: [(&str, u64); 3] = [("8.2", 16), ("8.4", 16), ("8.5", 8)];

/// The table's `LOCK_access` offset for a PHP version (`8.2.32`).
pub fn lock_access_offset(version: &str) -> Option<u64> {
    let mut parts = version.split('.');
    let minor = format!("{}.{}", parts.next()?, parts.next()?);
    LOCK_ACCESS
        .iter()
        .find(|(known, _)| *known == minor)
        .map(|&(_, offset)| offset)
}

/// The global statistics mutex, named and typed as DWARF would, when a
/// chain from `root` with `offsets` is `*mysqlnd_global_stats->LOCK_access`
/// in PHP `version`: the pointer's target, the field, the mutex at its start.
/// A mutex, or its futex word (contention mode), only.
pub(crate) fn global_lock(
    version: &str,
    root: &str,
    offsets: &[u64],
    kind: LockKind,
) -> Option<(String, DeclaredType)> {
    let field = lock_access_offset(version)?;
    let is_mutex = matches!(kind, LockKind::Mutex | LockKind::Futex);
    (root == GLOBAL_STATS && offsets == [0, field, 0] && is_mutex).then(|| {
        (
            format!("*{GLOBAL_STATS}->{LOCK_FIELD}"),
            DeclaredType {
                type_name: LOCK_TYPE.to_string(),
                inside: None,
                contention: None,
                layout: LayoutSource::Table,
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_field_of_each_version() {
        assert_eq!(lock_access_offset("8.2.32"), Some(16));
        assert_eq!(lock_access_offset("8.4.27"), Some(16));
        assert_eq!(lock_access_offset("8.5.7"), Some(8));
        assert_eq!(lock_access_offset("8.3.6"), None);
        assert_eq!(lock_access_offset("8"), None);
        let (name, declared) =
            global_lock("8.2.32", GLOBAL_STATS, &[0, 16, 0], LockKind::Mutex).unwrap();
        assert_eq!(name, "*mysqlnd_global_stats->LOCK_access");
        assert_eq!(declared.type_name, "pthread_mutex_t");
        assert_eq!(declared.layout, LayoutSource::Table);
        assert!(global_lock("8.5.7", GLOBAL_STATS, &[0, 8, 0], LockKind::Futex).is_some());
        // Another version's offset, another root, inside the mutex, a
        // condvar: not this lock.
        assert!(global_lock("8.5.7", GLOBAL_STATS, &[0, 16, 0], LockKind::Mutex).is_none());
        assert!(global_lock("8.2.1", "other_stats", &[0, 16, 0], LockKind::Mutex).is_none());
        assert!(global_lock("8.2.1", GLOBAL_STATS, &[0, 16, 8], LockKind::Mutex).is_none());
        assert!(global_lock("8.2.1", GLOBAL_STATS, &[0, 16, 0], LockKind::Condvar).is_none());
    }
}
