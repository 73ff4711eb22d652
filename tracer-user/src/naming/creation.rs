//! Where locks were created: the stack of the lock's init call
//! (`pthread_mutex_init`, `pthread_rwlock_init`, `pthread_spin_init`,
//! snapshotted by `record`'s counting modes with or without `--stacks`),
//! or, with `--stacks`, of its first use after attach when no init call was
//! seen (a static initializer, a zeroed allocation, or a lock created
//! before attach).
//! A lock that no symbol or pointer chain names (a heap object's) is named
//! by it: `mutex created in conn_create <- serve_request <- worker`, so
//! `compare` matches such locks across runs by where they were created.
//! By default (analysis's `sites::GroupBy::Site`) the locks of one such
//! name are one row.
use std::collections::HashMap;

use tracer_common::{StackKey, drop_reason, stack_kind};

use super::{AddressSpace, resolve_code, resolve_frames};
use crate::model::{Collected, CreatedBy, Creation, Frame, Lock};

/// Sets `created` on every lock whose creation or first use was
/// snapshotted, and names the unnamed ones by it. With the lock calls'
/// stacks (`uses_recorded`), an unnamed lock with no stack key while the
/// stack count map was full gets a site "not recorded" (one row under
/// `--group-by site`), its acquisitions counted in the sum returned (the
/// report's `dropped.sites_not_recorded`); without them, a lock with no
/// key was simply not created while recording.
pub(crate) fn apply(
    locks: &mut [Lock],
    space: &AddressSpace,
    collected: &Collected,
    uses_recorded: bool,
) -> u64 {
    let keys = site_keys(collected);
    let map_full = uses_recorded && collected.drops[drop_reason::STACK_COUNTS_FULL as usize] > 0;
    // With the lock calls' stacks, a lost snapshot shows as it is (the
    // caller only, as the stacks do); without them, the one site seen at
    // the same init call names the locks whose snapshot was lost.
    let by_call = if uses_recorded {
        HashMap::new()
    } else {
        sites_by_call(collected)
    };
    let sites = Sites {
        space,
        collected,
        by_call: &by_call,
    };
    let mut not_recorded: u64 = 0;
    for lock in locks {
        let created = match keys.get(&lock.address) {
            Some(keys) => creation_of(keys, &sites),
            // Its keys did not fit: whatever site it has is not known.
            None if map_full && lock.name.is_none() && lock.acquisitions.is_some() => {
                not_recorded = not_recorded.saturating_add(lock.acquisitions.unwrap_or(0));
                Some(Creation {
                    by: CreatedBy::NotRecorded,
                    site: Vec::new(),
                    inits: 0,
                })
            }
            None => None,
        };
        let Some(created) = created else {
            continue;
        };
        // Whatever has no name (no symbol, no pointer chain): heap objects,
        // and locks of a target gone before its regions were read.
        if lock.name.is_none() && (!created.site.is_empty() || created.by == CreatedBy::NotRecorded)
        {
            lock.name = Some(created.site_name(lock.kind));
        }
        lock.created = Some(created);
    }
    not_recorded
}

/// The creation and first-use keys of each lock with any, with their
/// counts (one pass: a search of every key per lock took minutes with
/// 100,000 locks).
fn site_keys(collected: &Collected) -> HashMap<u64, Vec<(&StackKey, u64)>> {
    let mut keys: HashMap<u64, Vec<(&StackKey, u64)>> = HashMap::new();
    for (key, &count) in &collected.stacks {
        if key.stack_id == stack_kind::CREATION
            || (key.stack_id == stack_kind::USE && key.return_ip != 0)
        {
            keys.entry(key.lock).or_default().push((key, count));
        }
    }
    keys
}

/// The lock's creation from its keys: its init calls' latest snapshot
/// (the call site with most inits), else its first use's.
fn creation_of(keys: &[(&StackKey, u64)], sites: &Sites) -> Option<Creation> {
    let of_kind = |kind: i64| keys.iter().filter(move |(key, _)| key.stack_id == kind);
    let inits: u64 = of_kind(stack_kind::CREATION).map(|(_, count)| count).sum();
    let busiest = |kind: i64| {
        of_kind(kind)
            // Ties to the lowest call site: the same on every run.
            .max_by_key(|(key, count)| (*count, std::cmp::Reverse((key.return_ip, key.php_site))))
            .map(|(key, _)| *key)
    };
    let (by, key, latest) = match busiest(stack_kind::CREATION) {
        Some(key) => (CreatedBy::Init, key, true),
        None => (CreatedBy::FirstUse, busiest(stack_kind::USE)?, false),
    };
    Some(Creation {
        by,
        site: site_frames(sites, key, latest),
        inits,
    })
}

/// The frames of one key's latest (or first) snapshot, from the caller of
/// the init or lock function out.
fn site_frames(sites: &Sites, key: &StackKey, latest: bool) -> Vec<Frame> {
    let Sites {
        space,
        collected,
        by_call,
    } = *sites;
    let unwound = collected.unwound.get(key).map_or(&[][..], Vec::as_slice);
    let chosen = if latest {
        unwound.iter().max_by_key(|stack| stack.count_at)
    } else {
        unwound.iter().min_by_key(|stack| stack.count_at)
    };
    match chosen {
        Some(stack) => resolve_frames(space, &stack.frames)
            .into_iter()
            .skip(1)
            .collect(),
        // No snapshot (the ring buffer was full, `snapshots_lost`): the
        // one site every snapshot of the same init call showed, else the
        // key's own call site, its one frame known.
        None if key.return_ip != 0 => match by_call.get(&key.return_ip) {
            Some(Some(frames)) if key.stack_id == stack_kind::CREATION => {
                resolve_frames(space, frames).into_iter().skip(1).collect()
            }
            _ => vec![resolve_code(space, key.return_ip, true)],
        },
        None => Vec::new(),
    }
}

/// What the sites are resolved from.
#[derive(Clone, Copy)]
struct Sites<'a> {
    space: &'a AddressSpace,
    collected: &'a Collected,
    /// Init call site (return address) -> the one stack its snapshots
    /// showed (None where they showed more than one).
    by_call: &'a HashMap<u64, Option<&'a [u64]>>,
}

/// Each init call site's stack, where every snapshot of it (of any lock)
/// showed the same frames: a burst of new objects at new addresses loses
/// snapshots (the ring buffer is full), and their locks are then named by
/// the one path that call was seen on, as their siblings are.
fn sites_by_call(collected: &Collected) -> HashMap<u64, Option<&[u64]>> {
    let mut by_call: HashMap<u64, Option<&[u64]>> = HashMap::new();
    for (key, stacks) in &collected.unwound {
        if key.stack_id != stack_kind::CREATION || key.return_ip == 0 {
            continue;
        }
        for stack in stacks {
            let frames = stack.frames.as_slice();
            let seen = by_call.entry(key.return_ip).or_insert(Some(frames));
            if seen.is_some_and(|one| one != frames) {
                *seen = None;
            }
        }
    }
    by_call
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LockKind;

    #[test]
    fn names_say_how_the_site_is_known() {
        let created = Creation {
            by: CreatedBy::Init,
            site: ["conn_create", "serve_request", "worker", "start_thread"]
                .map(Frame::named)
                .to_vec(),
            inits: 2,
        };
        assert_eq!(
            created.site_name(LockKind::Mutex),
            "mutex created in conn_create <- serve_request <- worker"
        );
        let first_use = Creation {
            by: CreatedBy::FirstUse,
            site: vec![Frame::named("take")],
            inits: 0,
        };
        assert_eq!(
            first_use.site_name(LockKind::Rwlock),
            "rwlock first used in take"
        );
    }

    /// A frame of a stripped module's own function (no symbol left): its
    /// module's file name and offset, as stacks show it, so the sites of a
    /// stripped libphp group one row as a `-g` build's do.
    #[test]
    fn an_unnamed_frame_is_its_module_and_offset() {
        let unnamed = Frame {
            function: None,
            module: Some("/usr/local/lib/libphp.so".into()),
            offset: 0x2e38d9,
            php: None,
        };
        let created = Creation {
            by: CreatedBy::Init,
            site: vec![
                Frame::named("tsrm_mutex_alloc"),
                Frame::named("mysqlnd_stats_init"),
                unnamed,
            ],
            inits: 300,
        };
        assert_eq!(
            created.site_name(LockKind::Mutex),
            "mutex created in tsrm_mutex_alloc <- mysqlnd_stats_init <- libphp.so+0x2e38d9"
        );
    }

    /// One init call seen on one path gives that path to every lock it
    /// created (those whose snapshot was lost too); seen on two paths, none.
    #[test]
    fn an_init_call_seen_on_one_path_names_its_lost_snapshots() {
        use crate::model::UnwoundStack;
        let key = |lock: u64, return_ip: u64| StackKey {
            lock,
            stack_id: stack_kind::CREATION,
            return_ip,
            php_site: 0,
        };
        let stack = |frames: &[u64]| UnwoundStack {
            count_at: 1,
            frames: frames.to_vec(),
            php: Vec::new(),
            route: 0,
            ended_by: None,
        };
        let mut collected = Collected::default();
        collected
            .unwound
            .insert(key(1, 0x10), vec![stack(&[1, 0x10, 0x20])]);
        collected
            .unwound
            .insert(key(2, 0x10), vec![stack(&[1, 0x10, 0x20])]);
        collected
            .unwound
            .insert(key(3, 0x30), vec![stack(&[1, 0x30, 0x40])]);
        collected
            .unwound
            .insert(key(4, 0x30), vec![stack(&[1, 0x30, 0x50])]);
        let mut lock_call = key(5, 0x60);
        lock_call.stack_id = stack_kind::USE;
        collected.unwound.insert(lock_call, vec![stack(&[1, 0x60])]);
        let by_call = sites_by_call(&collected);
        assert_eq!(by_call.get(&0x10), Some(&Some(&[1, 0x10, 0x20][..])));
        assert_eq!(by_call.get(&0x30), Some(&None));
        assert_eq!(by_call.get(&0x60), None);
    }
}
