//! Rows of several lock addresses merged into one (`--group-by site`):
//! counts summed, maxima kept, histograms merged bucket by bucket, callers,
//! holders and stacks summed by frame, each address's figures kept in
//! `group.by_address`. Which rows belong together is `naming`'s call
//! (their creation site); this only adds them up.
use std::collections::BTreeMap;

use crate::model::{
    AddressFigures, CallSites, Caller, Frame, Holds, Lock, LockStack, SiteGroup, StackEnd,
    StackOrigin, WaitHolder, merge_histogram, sorted_callers,
};

/// One row for `rows` (at least one; the first, the busiest, gives the
/// address, the creation site and whatever is not summed).
pub(crate) fn merge(rows: Vec<Lock>) -> Option<Lock> {
    let mut rows = rows.into_iter();
    let mut merged = rows.next()?;
    let mut group = group_of(&merged);
    for row in rows {
        add_group(&mut group, group_of(&row));
        add_counts(&mut merged, &row);
        add_details(&mut merged, row);
    }
    if let Some(created) = &mut merged.created {
        created.inits = group.by_address.iter().map(|a| a.inits).sum();
    }
    group
        .by_address
        .sort_by_key(|a| std::cmp::Reverse(a.acquisitions));
    merged.group = Some(group);
    Some(merged)
}

/// The group a row stands for: its own, or its one address.
fn group_of(lock: &Lock) -> SiteGroup {
    if let Some(group) = &lock.group {
        return group.clone();
    }
    let inits = lock.created.as_ref().map_or(0, |created| created.inits);
    SiteGroup {
        addresses: 1,
        objects: inits.max(1),
        by_address: vec![AddressFigures {
            address: lock.address,
            acquisitions: lock.acquisitions,
            failed_tries: lock.failed_tries,
            contended: lock.contended,
            wakes: lock.wakes,
            wait_ns: lock.wait_ns,
            max_wait_ns: lock.max_wait_ns,
            cpu_ns: lock.cpu_ns,
            inits,
            region: lock.region.clone(),
        }],
    }
}

fn add_group(into: &mut SiteGroup, other: SiteGroup) {
    into.addresses = into.addresses.saturating_add(other.addresses);
    into.objects = into.objects.saturating_add(other.objects);
    into.by_address.extend(other.by_address);
}

/// Sum of two optional counts: absent only when both are.
fn add_optional(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
    }
}

/// The counts and figures: summed, maxima kept. Per-request figures are
/// left to the caller (they divide the sums).
fn add_counts(into: &mut Lock, row: &Lock) {
    into.acquisitions = add_optional(into.acquisitions, row.acquisitions);
    into.acquisitions_error = add_optional(into.acquisitions_error, row.acquisitions_error);
    into.failed_tries = add_optional(into.failed_tries, row.failed_tries);
    for (function, &calls) in &row.calls {
        let total = into.calls.entry(function.clone()).or_insert(0);
        *total = total.saturating_add(calls);
    }
    into.contended = into.contended.saturating_add(row.contended);
    into.wakes = into.wakes.saturating_add(row.wakes);
    into.wait_ns = into.wait_ns.saturating_add(row.wait_ns);
    into.max_wait_ns = into.max_wait_ns.max(row.max_wait_ns);
    merge_histogram(&mut into.wait_histogram, &row.wait_histogram);
    into.cpu_ns = add_optional(into.cpu_ns, row.cpu_ns);
    // Each bound is the row's own: their sum never understates.
    into.cpu_error_ns = add_optional(into.cpu_error_ns, row.cpu_error_ns);
}

/// Callers, holders, holds; where the rows differ, what they share.
fn add_details(into: &mut Lock, row: Lock) {
    into.callers = merge_callers(std::mem::take(&mut into.callers), row.callers);
    into.holders = merge_holders(std::mem::take(&mut into.holders), row.holders);
    into.holds = match (into.holds.take(), row.holds) {
        (Some(a), Some(b)) => Some(merge_holds(a, b)),
        (a, b) => a.or(b),
    };
    into.handoffs = match (into.handoffs.take(), row.handoffs) {
        (Some(mut a), Some(b)) => {
            a.merge(&b);
            Some(a)
        }
        (a, b) => a.or(b),
    };
    if into.region != row.region {
        into.region = into.region.merged(&row.region);
    }
    if into.module != row.module {
        into.module = None;
    }
    if into.declared != row.declared {
        into.declared = None;
    }
    into.removal = match (into.removal.take(), row.removal) {
        (Some(a), Some(b)) => Some(super::removal::merge(a, b)),
        (a, b) => a.or(b),
    };
    // A group is many locks, each its own queue: the busiest one's.
    if row.saturation.as_ref().map(|s| s.utilization)
        > into.saturation.as_ref().map(|s| s.utilization)
    {
        into.saturation = row.saturation;
    }
    into.cpu_kernel_ns = add_optional(into.cpu_kernel_ns, row.cpu_kernel_ns);
    into.kernel_contentions = add_optional(into.kernel_contentions, row.kernel_contentions);
    into.kernel_wait_ns = add_optional(into.kernel_wait_ns, row.kernel_wait_ns);
}

/// Callers by call site, counts summed, most frequent first.
fn merge_callers(a: Vec<Caller>, b: Vec<Caller>) -> Vec<Caller> {
    let mut sites = CallSites::new();
    for caller in a.into_iter().chain(b) {
        let count = sites
            .entry((caller.function, caller.module, caller.offset))
            .or_insert(0);
        *count = count.saturating_add(caller.count);
    }
    sorted_callers(sites)
}

/// Holders by function and thread, waits summed, most waits first.
fn merge_holders(a: Vec<WaitHolder>, b: Vec<WaitHolder>) -> Vec<WaitHolder> {
    let mut merged: Vec<WaitHolder> = Vec::new();
    for holder in a.into_iter().chain(b) {
        let same = merged.iter_mut().find(|seen| {
            (&seen.function, &seen.module, seen.tid, &seen.thread)
                == (&holder.function, &holder.module, holder.tid, &holder.thread)
        });
        match same {
            Some(seen) => {
                seen.waits = seen.waits.saturating_add(holder.waits);
                seen.wait_ns = seen.wait_ns.saturating_add(holder.wait_ns);
            }
            None => merged.push(holder),
        }
    }
    merged.sort_by_key(|holder| std::cmp::Reverse((holder.waits, holder.wait_ns)));
    merged
}

/// Two locks' holds as one's: counts summed, the longest kept.
fn merge_holds(mut a: Holds, b: Holds) -> Holds {
    a.holds = a.holds.saturating_add(b.holds);
    a.hold_ns = a.hold_ns.saturating_add(b.hold_ns);
    a.max_hold_ns = a.max_hold_ns.max(b.max_hold_ns);
    merge_histogram(&mut a.histogram, &b.histogram);
    for site in b.by_function {
        match a
            .by_function
            .iter_mut()
            .find(|seen| (&seen.function, &seen.module) == (&site.function, &site.module))
        {
            Some(seen) => {
                seen.holds = seen.holds.saturating_add(site.holds);
                seen.hold_ns = seen.hold_ns.saturating_add(site.hold_ns);
            }
            None => a.by_function.push(site),
        }
    }
    a.by_function
        .sort_by_key(|site| std::cmp::Reverse(site.hold_ns));
    a
}

/// The stacks of merged rows under their row's address: `moved` maps each
/// merged address to it. Equal stacks add up (so their counts still add
/// up to the row's), most frequent first, where the row's first stack was.
pub(crate) fn merge_stacks(stacks: Vec<LockStack>, moved: &BTreeMap<u64, u64>) -> Vec<LockStack> {
    type Key = (Vec<Frame>, u8, Option<StackOrigin>, Option<StackEnd>);
    let mut by_row: BTreeMap<u64, BTreeMap<Key, LockStack>> = BTreeMap::new();
    // A stack of a row not merged, or the place of a merged row's stacks.
    let mut order: Vec<Result<LockStack, u64>> = Vec::with_capacity(stacks.len());
    for mut stack in stacks {
        let Some(&row) = moved.get(&stack.lock) else {
            order.push(Ok(stack));
            continue;
        };
        stack.lock = row;
        let row_stacks = by_row.entry(row).or_insert_with(|| {
            order.push(Err(row));
            BTreeMap::new()
        });
        let key = (
            stack.frames.clone(),
            stack.unwound_by as u8,
            stack.source,
            stack.ended_by,
        );
        match row_stacks.get_mut(&key) {
            Some(seen) => seen.count = seen.count.saturating_add(stack.count),
            None => {
                row_stacks.insert(key, stack);
            }
        }
    }
    let mut merged = Vec::with_capacity(order.len());
    for slot in order {
        match slot {
            Ok(stack) => merged.push(stack),
            Err(row) => {
                let mut row: Vec<LockStack> = by_row
                    .remove(&row)
                    .map(|stacks| stacks.into_values().collect())
                    .unwrap_or_default();
                row.sort_by_key(|stack| std::cmp::Reverse(stack.count));
                merged.extend(row);
            }
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        CreatedBy, Creation, HoldSite, LockKind, StackOrigin, StackSource, WaitClass,
    };

    fn caller(function: &str, count: u64) -> Caller {
        Caller {
            function: Some(function.to_string()),
            module: None,
            offset: 4,
            count,
        }
    }

    fn row(address: u64, acquisitions: u64, contended: u64, inits: u64) -> Lock {
        let mut lock = Lock::empty(address, LockKind::Mutex, WaitClass::Lock);
        lock.acquisitions = Some(acquisitions);
        lock.calls.insert("pthread_mutex_lock".into(), acquisitions);
        lock.contended = contended;
        lock.wakes = contended;
        lock.wait_ns = contended * 1000;
        lock.region = crate::model::Region::ThreadArena;
        lock.created = Some(Creation {
            by: CreatedBy::Init,
            site: vec![Frame::named("conn_create")],
            inits,
        });
        lock
    }

    #[test]
    fn counts_add_up_and_each_address_is_kept() {
        let mut a = row(0x1000, 60, 3, 20);
        a.max_wait_ns = 9000;
        a.wait_histogram = vec![(512, 1), (2048, 2)];
        a.callers = vec![caller("take", 50), caller("other", 10)];
        a.cpu_ns = Some(100);
        let mut b = row(0x2000, 30, 2, 10);
        b.max_wait_ns = 4000;
        b.wait_histogram = vec![(2048, 1), (8192, 1)];
        b.callers = vec![caller("take", 30)];
        b.failed_tries = Some(4);
        b.region = crate::model::Region::Heap;
        let c = row(0x3000, 9, 0, 0);
        let merged = merge(vec![a, b, c]).unwrap();
        assert_eq!(merged.address, 0x1000);
        assert_eq!(merged.acquisitions, Some(99));
        assert_eq!(merged.calls["pthread_mutex_lock"], 99);
        assert_eq!(
            (merged.contended, merged.wakes, merged.wait_ns),
            (5, 5, 5000)
        );
        assert_eq!(merged.max_wait_ns, 9000);
        assert_eq!(merged.failed_tries, Some(4));
        assert_eq!(merged.cpu_ns, Some(100));
        // Bucket by bucket; the counts still add up to `contended`.
        assert_eq!(merged.wait_histogram, vec![(512, 1), (2048, 3), (8192, 1)]);
        assert_eq!(
            merged.callers,
            vec![caller("take", 80), caller("other", 10)]
        );
        assert_eq!(merged.region.to_string(), "[heap], heap (thread arena)");
        assert_eq!(merged.created.as_ref().unwrap().inits, 30);
        let group = merged.group.unwrap();
        // 20 + 10 objects created at two addresses, one first used at the third.
        assert_eq!((group.addresses, group.objects), (3, 31));
        let addresses: Vec<(u64, Option<u64>)> = group
            .by_address
            .iter()
            .map(|a| (a.address, a.acquisitions))
            .collect();
        assert_eq!(
            addresses,
            [(0x1000, Some(60)), (0x2000, Some(30)), (0x3000, Some(9))]
        );
        assert_eq!(group.by_address[1].failed_tries, Some(4));
        assert!(merge(Vec::new()).is_none());
    }

    #[test]
    fn holds_and_holders_add_up_by_site() {
        let holds = |n: u64, max: u64, function: &str| Holds {
            holds: n,
            hold_ns: n * 10,
            max_hold_ns: max,
            histogram: vec![(256, n)],
            by_function: vec![HoldSite {
                function: Some(function.into()),
                module: None,
                holds: n,
                hold_ns: n * 10,
            }],
        };
        let holder = |waits: u64| WaitHolder {
            function: Some("take".into()),
            waits,
            wait_ns: waits * 5,
            ..WaitHolder::default()
        };
        let mut a = row(0x1000, 5, 1, 1);
        a.holds = Some(holds(5, 70, "take"));
        a.holders = vec![holder(1)];
        let mut b = row(0x2000, 3, 2, 1);
        b.holds = Some(holds(3, 90, "flush"));
        b.holders = vec![holder(2)];
        let merged = merge(vec![a, b]).unwrap();
        let held = merged.holds.unwrap();
        assert_eq!((held.holds, held.hold_ns, held.max_hold_ns), (8, 80, 90));
        assert_eq!(held.histogram, vec![(256, 8)]);
        let sites: Vec<(Option<String>, u64)> = held
            .by_function
            .into_iter()
            .map(|site| (site.function, site.holds))
            .collect();
        assert_eq!(sites, [(Some("take".into()), 5), (Some("flush".into()), 3)]);
        assert_eq!(merged.holders, vec![holder(3)]);
    }

    #[test]
    fn histograms_merge_bucket_by_bucket() {
        let mut into = vec![(256, 2), (4096, 1)];
        merge_histogram(&mut into, &[(512, 3), (4096, 4), (u64::MAX, 1)]);
        assert_eq!(into, vec![(256, 2), (512, 3), (4096, 5), (u64::MAX, 1)]);
        merge_histogram(&mut into, &[]);
        assert_eq!(into.iter().map(|(_, n)| n).sum::<u64>(), 11);
    }

    #[test]
    fn stacks_move_under_their_row_and_add_up() {
        let stack = |lock: u64, count: u64, top: &str| LockStack {
            lock,
            count,
            frames: vec![Frame::named(top), Frame::named("worker")],
            unwound_by: StackSource::CallFrameInfo,
            source: Some(StackOrigin::LockCalls),
            route: None,
            ended_by: None,
        };
        let stacks = vec![
            stack(0x9000, 7, "global"),
            stack(0x1000, 5, "take"),
            stack(0x2000, 4, "take"),
            stack(0x2000, 6, "flush"),
            stack(0x9000, 1, "global2"),
        ];
        let moved = BTreeMap::from([(0x1000, 0x1000), (0x2000, 0x1000)]);
        let merged = merge_stacks(stacks, &moved);
        assert_eq!(
            merged,
            vec![
                stack(0x9000, 7, "global"),
                stack(0x1000, 9, "take"),
                stack(0x1000, 6, "flush"),
                stack(0x9000, 1, "global2"),
            ]
        );
    }
}
