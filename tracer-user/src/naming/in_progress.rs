//! Names in the in-progress waits and holds and the deadlocks: each lock as
//! the report's row for it calls it (else its global's name, found the same
//! way), and every thread by its name (`/proc/PID/task/TID/comm`).
use std::collections::BTreeMap;

use super::{names::Namer, region::AddressSpace};
use crate::model::{Deadlock, InProgress, Lock, LockKind};

/// The waits and holds in progress and the deadlocks that naming names
/// with the lock rows (none when `live` names the locks it picks).
#[derive(Default)]
pub(super) struct Waits<'a> {
    pub(super) in_progress: &'a mut [InProgress],
    pub(super) deadlocks: &'a mut [Deadlock],
}

pub(super) fn name(
    locks: &[Lock],
    waits: Waits<'_>,
    space: &AddressSpace,
    namer: &mut Namer,
    thread_names: &BTreeMap<u32, String>,
) {
    if waits.in_progress.is_empty() {
        return;
    }
    let rows: BTreeMap<u64, (Option<String>, crate::model::Region)> = locks
        .iter()
        .map(|lock| (lock.address, (lock.name.clone(), lock.region.clone())))
        .collect();
    let mut known: BTreeMap<u64, (Option<String>, crate::model::Region)> = BTreeMap::new();
    let mut name_of = |address: u64| {
        known
            .entry(address)
            .or_insert_with(|| {
                rows.get(&address).cloned().unwrap_or_else(|| {
                    let name = space.module_of(address).and_then(|module| {
                        namer
                            .global(module, module.link_address(address), LockKind::Mutex)
                            .map(|named| named.name)
                    });
                    (name, space.region_of(address))
                })
            })
            .clone()
    };
    let thread = |tid: u32| thread_names.get(&tid).cloned();
    for entry in waits.in_progress {
        (entry.name, entry.region) = name_of(entry.lock);
        entry.thread = thread(entry.tid);
        if let Some(holder) = &mut entry.holder {
            holder.thread = thread(holder.tid);
        }
    }
    for deadlock in waits.deadlocks {
        for step in &mut deadlock.cycle {
            step.name = name_of(step.lock).0;
            step.thread = thread(step.tid);
        }
    }
}
