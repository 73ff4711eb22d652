//! Rows of locks named by where they were created (naming's `creation`
//! names them), merged per site: a pass the pipeline runs after naming,
//! so the sums and per-request figures are analysis's, not naming's.
use std::collections::BTreeMap;

use super::{build::sort_locks, estimate, group, per_request};
use crate::model::{CreatedBy, Lock, LockKind, Report, WaitClass};

/// How the locks named by their creation site are shown (`--group-by`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum GroupBy {
    /// One row per creation site: its locks at every address, summed.
    #[default]
    Site,
    /// One row per lock address.
    Address,
}

/// True for a lock named by where it was created (no symbol or pointer
/// chain named it).
pub(crate) fn named_by_site(lock: &Lock) -> bool {
    match (&lock.name, &lock.created) {
        (Some(name), Some(created)) => *name == created.site_name(lock.kind),
        _ => false,
    }
}

/// Merges the rows of locks named by one creation site (same kind, same
/// name, same wait class) into one row. Symbol- and chain-named rows stay
/// one per address, and so do locks whose init call was not seen: where
/// they were first used says nothing of which object they are (two
/// globals taken by one helper). Re-sorts the rows, moves the merged rows'
/// stacks under the row, and divides the new sums by the request count again.
pub(crate) fn group_by_site(report: &mut Report) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Creation, Frame};

    /// A lock created at `site` (named by it unless `name` is given).
    fn lock(address: u64, acquisitions: u64, site: &str, name: Option<&str>) -> Lock {
        let mut lock = Lock::empty(address, LockKind::Mutex, WaitClass::Lock);
        lock.acquisitions = Some(acquisitions);
        let created = Creation {
            by: CreatedBy::Init,
            site: vec![Frame::named(site), Frame::named("serve")],
            inits: 1,
        };
        lock.name = Some(name.map_or_else(|| created.site_name(lock.kind), str::to_string));
        lock.created = Some(created);
        lock
    }

    /// A lock first used in `take` (no init seen): named by it, never grouped.
    fn first_use(address: u64, acquisitions: u64) -> Lock {
        let mut lock = lock(address, acquisitions, "take", None);
        if let Some(created) = &mut lock.created {
            created.by = CreatedBy::FirstUse;
            created.inits = 0;
            lock.name = Some(created.site_name(lock.kind));
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
