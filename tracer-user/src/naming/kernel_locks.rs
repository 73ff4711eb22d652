//! The user side of the kernel locks section: the instruction each
//! contention entered the kernel from, its whole user stacks (`--stacks`:
//! the snapshots the kernel lock program sent, unwound as every other
//! stack), and the names of the user locks whose futex calls met them.
use std::collections::{BTreeMap, HashMap};

use tracer_common::stack_kind;

use super::{AddressSpace, resolve_code, resolve_stack, weigh_snapshots};
use crate::model::{Collected, Frame, KernelUserStack, Report};

/// Whole stacks kept per user site.
const STACKS_PER_SITE: usize = 5;

/// Names the user side of `report.kernel_locks` (after the rows are named
/// and grouped).
pub(super) fn name(report: &mut Report, space: &AddressSpace, collected: &Collected) {
    let mut rows: HashMap<u64, (u64, Option<String>)> = HashMap::new();
    for lock in &report.locks {
        rows.insert(lock.address, (lock.address, lock.name.clone()));
        for merged in lock.group.iter().flat_map(|group| &group.by_address) {
            rows.insert(merged.address, (lock.address, lock.name.clone()));
        }
    }
    let Some(section) = report.kernel_locks.as_mut() else {
        return;
    };
    for lock in &mut section.locks {
        for site in &mut lock.user_sites {
            if site.ip != 0 {
                site.frame = Some(resolve_code(space, site.ip, false));
            }
            site.stacks = user_stacks(space, collected, (lock.address, lock.flags), site.ip);
        }
        for user in &mut lock.user_locks {
            if let Some((row, name)) = rows.get(&user.address) {
                user.address = *row;
                user.name = name.clone();
            }
        }
    }
}

/// The unwound user stacks of a kernel lock's (address, flags)
/// contentions from user instruction `ip`, busiest first.
fn user_stacks(
    space: &AddressSpace,
    collected: &Collected,
    (lock, flags): (u64, u32),
    ip: u64,
) -> Vec<KernelUserStack> {
    let kind = stack_kind::KERNEL_LOCK + i64::from(flags & 63);
    let mut by_frames: BTreeMap<Vec<Frame>, u64> = BTreeMap::new();
    let keys = collected
        .stacks
        .iter()
        .filter(|(key, _)| key.stack_id == kind && key.lock == lock && key.return_ip == ip);
    for (key, &count) in keys {
        let Some(unwound) = collected.unwound.get(key) else {
            continue;
        };
        for (stack, share) in weigh_snapshots(unwound, count) {
            *by_frames.entry(resolve_stack(space, stack)).or_default() += share;
        }
    }
    let mut stacks: Vec<KernelUserStack> = by_frames
        .into_iter()
        .map(|(frames, contentions)| KernelUserStack {
            contentions,
            frames,
        })
        .collect();
    stacks.sort_by_key(|stack| std::cmp::Reverse(stack.contentions));
    stacks.truncate(STACKS_PER_SITE);
    stacks
}
