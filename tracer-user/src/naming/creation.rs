//! Where locks were created (`--stacks`): the stack of the lock's init call
//! (`pthread_mutex_init`, `pthread_rwlock_init`, `pthread_spin_init`), or
//! of its first use after attach when no init call was seen (a static
//! initializer, a zeroed allocation, or a lock created before attach).
//! A lock that no symbol or pointer chain names (a heap object's) is named
//! by it: `mutex created in conn_create <- serve_request <- worker`, so
//! `compare` matches such locks across runs by where they were created.
use tracer_common::{StackKey, stack_kind};

use super::{AddressSpace, resolve_frames};
use crate::model::{Collected, CreatedBy, Creation, Frame, LockKind, Report};

/// Functions of the site a name shows.
const NAMED_FRAMES: usize = 3;

/// Sets `created` on every lock whose creation or first use was
/// snapshotted, and names the unnamed ones by it.
pub fn apply(report: &mut Report, space: &AddressSpace, collected: &Collected) {
    for lock in &mut report.locks {
        let Some(created) = creation_of(lock.address, space, collected) else {
            continue;
        };
        // Whatever has no name (no symbol, no pointer chain): heap objects,
        // and locks of a target gone before its regions were read.
        if lock.name.is_none() && !created.site.is_empty() {
            lock.name = Some(site_name(lock.kind, &created));
        }
        lock.created = Some(created);
    }
}

/// The lock's creation: its init calls' latest snapshot (the call site
/// with most inits), else its first use's.
fn creation_of(address: u64, space: &AddressSpace, collected: &Collected) -> Option<Creation> {
    let keys = |kind: i64| {
        collected
            .stacks
            .iter()
            .filter(move |(key, _)| key.lock == address && key.stack_id == kind)
    };
    let inits: u64 = keys(stack_kind::CREATION).map(|(_, &count)| count).sum();
    let (by, key, latest) = match keys(stack_kind::CREATION).max_by_key(|(_, count)| **count) {
        Some((key, _)) => (CreatedBy::Init, key, true),
        None => {
            let (key, _) = keys(stack_kind::USE)
                .filter(|(key, _)| key.return_ip != 0)
                .max_by_key(|(_, count)| **count)?;
            (CreatedBy::FirstUse, key, false)
        }
    };
    Some(Creation {
        by,
        site: site_frames(space, collected, key, latest),
        inits,
    })
}

/// The frames of one key's latest (or first) snapshot, from the caller of
/// the init or lock function out.
fn site_frames(
    space: &AddressSpace,
    collected: &Collected,
    key: &StackKey,
    latest: bool,
) -> Vec<Frame> {
    let Some(unwound) = collected.unwound.get(key) else {
        return Vec::new();
    };
    let chosen = if latest {
        unwound.iter().max_by_key(|stack| stack.count_at)
    } else {
        unwound.iter().min_by_key(|stack| stack.count_at)
    };
    chosen.map_or_else(Vec::new, |stack| {
        resolve_frames(space, &stack.frames)
            .into_iter()
            .skip(1)
            .collect()
    })
}

/// `mutex created in f <- g <- h`, `rwlock first used in f <- g <- h`.
fn site_name(kind: LockKind, created: &Creation) -> String {
    let kind = match kind {
        LockKind::Rwlock => "rwlock",
        LockKind::Spinlock => "spinlock",
        _ => "mutex",
    };
    let verb = match created.by {
        CreatedBy::Init => "created in",
        CreatedBy::FirstUse => "first used in",
    };
    let functions: Vec<String> = created
        .site
        .iter()
        .take(NAMED_FRAMES)
        .map(|frame| {
            frame
                .function
                .clone()
                .unwrap_or_else(|| format!("{:#x}", frame.offset))
        })
        .collect();
    format!("{kind} {verb} {}", functions.join(" <- "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str) -> Frame {
        Frame {
            function: Some(function.to_string()),
            module: None,
            offset: 0,
        }
    }

    #[test]
    fn names_say_how_the_site_is_known() {
        let created = Creation {
            by: CreatedBy::Init,
            site: ["conn_create", "serve_request", "worker", "start_thread"]
                .map(frame)
                .to_vec(),
            inits: 2,
        };
        assert_eq!(
            site_name(LockKind::Mutex, &created),
            "mutex created in conn_create <- serve_request <- worker"
        );
        let first_use = Creation {
            by: CreatedBy::FirstUse,
            site: vec![frame("take")],
            inits: 0,
        };
        assert_eq!(
            site_name(LockKind::Rwlock, &first_use),
            "rwlock first used in take"
        );
    }
}
