//! Where locks were created: the stack of the lock's init call
//! (`pthread_mutex_init`, `pthread_rwlock_init`, `pthread_spin_init`,
//! snapshotted by `record`'s counting modes with or without `--stacks`),
//! or, with `--stacks`, of its first use after attach when no init call was
//! seen (a static initializer, a zeroed allocation, or a lock created
//! before attach).
//! A lock that no symbol or pointer chain names (a heap object's) is named
//! by it: `mutex created in conn_create <- serve_request <- worker`, so
//! `compare` matches such locks across runs by where they were created.
//! By default ([`GroupBy::Site`]) the locks of one such name are one row.
use std::collections::{BTreeMap, HashMap};

use tracer_common::{StackKey, drop_reason, stack_kind};

use super::{AddressSpace, resolve_code, resolve_frames};
use crate::{
    analysis::{build::sort_locks, estimate, group, per_request},
    model::{Collected, CreatedBy, Creation, DropReason, Frame, Lock, LockKind, Report, WaitClass},
};

/// How the locks named by their creation site are shown (`--group-by`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GroupBy {
    /// One row per creation site: its locks at every address, summed.
    #[default]
    Site,
    /// One row per lock address.
    Address,
}

/// Functions of the site a name shows.
const NAMED_FRAMES: usize = 3;

/// Sets `created` on every lock whose creation or first use was
/// snapshotted, and names the unnamed ones by it. With the lock calls'
/// stacks (`uses_recorded`), an unnamed lock with no stack key while the
/// stack count map was full gets a site "not recorded" (one row under
/// `--group-by site`), its acquisitions counted in
/// `dropped.sites_not_recorded`; without them, a lock with no key was
/// simply not created while recording.
pub fn apply(
    report: &mut Report,
    space: &AddressSpace,
    collected: &Collected,
    uses_recorded: bool,
) {
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
    for lock in &mut report.locks {
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
            lock.name = Some(site_name(lock.kind, &created));
        }
        lock.created = Some(created);
    }
    if not_recorded > 0 {
        report
            .dropped
            .insert(DropReason::SitesNotRecorded, not_recorded);
    }
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

/// True for a lock named by where it was created (no symbol or pointer
/// chain named it).
pub fn named_by_site(lock: &Lock) -> bool {
    match (&lock.name, &lock.created) {
        (Some(name), Some(created)) => *name == site_name(lock.kind, created),
        _ => false,
    }
}

/// Merges the rows of locks named by one creation site (same kind, same
/// name, same wait class) into one row. Symbol- and chain-named rows stay
/// one per address, and so do locks whose init call was not seen: where
/// they were first used says nothing of which object they are (two
/// globals taken by one helper). Re-sorts the rows, moves the merged rows'
/// stacks under the row, and divides the new sums by the request count again.
pub fn group_by_site(report: &mut Report) {
    let created_here = |lock: &Lock| {
        named_by_site(lock)
            && lock
                .created
                .as_ref()
                .is_some_and(|c| matches!(c.by, CreatedBy::Init | CreatedBy::NotRecorded))
    };
    let (by_site, mut rows): (Vec<Lock>, Vec<Lock>) = std::mem::take(&mut report.locks)
        .into_iter()
        .partition(created_here);
    let mut sites: BTreeMap<(String, LockKind, WaitClass), Vec<Lock>> = BTreeMap::new();
    for lock in by_site {
        let key = (
            lock.name.clone().unwrap_or_default(),
            lock.kind,
            lock.wait_class,
        );
        sites.entry(key).or_default().push(lock);
    }
    let mut moved: BTreeMap<u64, u64> = BTreeMap::new();
    // In report order: each site's busiest lock first.
    for locks in sites.into_values() {
        let addresses: Vec<u64> = locks.iter().map(|lock| lock.address).collect();
        let Some(row) = group::merge(locks) else {
            continue;
        };
        moved.extend(addresses.into_iter().map(|address| (address, row.address)));
        rows.push(row);
    }
    sort_locks(&mut rows);
    report.locks = rows;
    report.stacks = group::merge_stacks(std::mem::take(&mut report.stacks), &moved);
    if let Some(requests) = report.requests.clone() {
        per_request::apply(report, requests);
    }
    estimate::bound(report);
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
        CreatedBy::NotRecorded => {
            return format!("{kind} created at a site not recorded (stack count map full)");
        }
    };
    let functions: Vec<String> = created
        .site
        .iter()
        .take(NAMED_FRAMES)
        .map(Frame::code_label)
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
            php: None,
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
                frame("tsrm_mutex_alloc"),
                frame("mysqlnd_stats_init"),
                unnamed,
            ],
            inits: 300,
        };
        assert_eq!(
            site_name(LockKind::Mutex, &created),
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

    /// A lock created at `site` (named by it unless `name` is given).
    fn lock(address: u64, acquisitions: u64, site: &str, name: Option<&str>) -> Lock {
        let mut lock = Lock::empty(address, LockKind::Mutex, WaitClass::Lock);
        lock.acquisitions = Some(acquisitions);
        let created = Creation {
            by: CreatedBy::Init,
            site: vec![frame(site), frame("serve")],
            inits: 1,
        };
        lock.name = Some(name.map_or_else(|| site_name(lock.kind, &created), str::to_string));
        lock.created = Some(created);
        lock
    }

    /// A lock first used in `take` (no init seen): named by it, never grouped.
    fn first_use(address: u64, acquisitions: u64) -> Lock {
        let mut lock = lock(address, acquisitions, "take", None);
        if let Some(created) = &mut lock.created {
            created.by = CreatedBy::FirstUse;
            created.inits = 0;
            lock.name = Some(site_name(lock.kind, created));
        }
        lock
    }

    fn report(locks: Vec<Lock>) -> Report {
        let text = format!(
            r#"{{"schema": "{}", "target": {{"pid": 1, "exe": "x", "cmdline": []}},
            "duration_s": 1.0, "mode": "all", "locks": [], "dropped": {{}},
            "totals": {{"acquisitions": 0, "contended": 0, "wakes": 0, "wait_ns": 0}},
            "requests": {{"source": "given", "count": 10}}}}"#,
            crate::model::SCHEMA
        );
        let mut report = Report::from_json(&text, "test").unwrap();
        report.locks = locks;
        report
    }

    /// Rows named by one site become one, divided by the requests again
    /// from the sums (171.1 + 211.9 is exactly 383.0 per request); a lock
    /// named by a symbol keeps its row although created at the same site,
    /// and locks first used at one site (no init seen) keep theirs.
    #[test]
    fn rows_of_one_site_are_one_row() {
        let mut report = report(vec![
            lock(0x1000, 2119, "conn_create", None),
            lock(0x5000, 1800, "conn_create", Some("g_conn")),
            lock(0x2000, 1711, "conn_create", None),
            lock(0x3000, 40, "cache_create", None),
            first_use(0x8000, 5),
            first_use(0x9000, 4),
        ]);
        group_by_site(&mut report);
        let rows: Vec<(u64, Option<u64>, u64)> = report
            .locks
            .iter()
            .map(|l| {
                let addresses = l.group.as_ref().map_or(0, |g| g.addresses);
                (l.address, l.acquisitions, addresses)
            })
            .collect();
        assert_eq!(
            rows,
            [
                (0x1000, Some(3830), 2),
                (0x5000, Some(1800), 0),
                (0x3000, Some(40), 1),
                (0x8000, Some(5), 0),
                (0x9000, Some(4), 0),
            ]
        );
        let per_request = report.locks[0].per_request.as_ref().unwrap();
        assert_eq!(per_request.acquisitions, Some(383.0));
        assert!(named_by_site(&report.locks[0]));
        assert!(!named_by_site(&report.locks[1]));
        assert!(named_by_site(&report.locks[3]));
        // Grouping again changes nothing.
        let grouped = report.clone();
        group_by_site(&mut report);
        assert_eq!(report, grouped);
    }
}
