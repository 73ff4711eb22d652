//! `--php`: the per-route section. The BPF side counts requests, lock calls
//! and contended waits per route key (a hash of method and path); here the
//! keys get their names, `--route-pattern` rules collapse ids, routes past
//! `--max-routes` fold into `other`, and every figure is divided by its
//! route's own requests. CPU comes from the CPU sampler: its samples of the
//! target per route, and per (route, lock) in the lock's code.
use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, Result, bail};
use regex::Regex;
use tracer_common::php::{NO_REQUEST, PAST_CAP_ROUTE, RouteLockCounts, UNREADABLE_ROUTE};

use super::build::lock_holding;
use crate::model::{
    Mode, PhpCollected, Report, Route, RouteCallsUncounted, RouteKind, RouteLock, Routes,
    sample_period_ns,
};

/// Routes kept apart by default.
pub(crate) const DEFAULT_MAX_ROUTES: usize = 20;

/// One `--route-pattern REGEX=NAME`: every match of REGEX in a request's
/// path is replaced by NAME (`/posts/\d+=/posts/:id`).
#[derive(Debug, Clone)]
pub struct RoutePattern {
    pub regex: Regex,
    pub name: String,
    /// As given, for the report.
    pub text: String,
}

impl RoutePattern {
    pub(crate) fn parse(text: &str) -> Result<RoutePattern> {
        let Some((regex, name)) = text.rsplit_once('=') else {
            bail!("--route-pattern {text:?}: write REGEX=NAME, e.g. '/posts/\\d+=/posts/:id'");
        };
        if regex.is_empty() {
            bail!("--route-pattern {text:?}: the regex before '=' is empty");
        }
        let regex = Regex::new(regex)
            .with_context(|| format!("--route-pattern {text:?}: not a valid regex"))?;
        Ok(RoutePattern {
            regex,
            name: name.to_string(),
            text: text.to_string(),
        })
    }
}

/// How routes are named and how many are kept apart.
#[derive(Debug, Clone)]
pub struct RouteRules {
    pub patterns: Vec<RoutePattern>,
    pub max_routes: usize,
}

impl Default for RouteRules {
    fn default() -> Self {
        RouteRules {
            patterns: Vec::new(),
            max_routes: DEFAULT_MAX_ROUTES,
        }
    }
}

impl RouteRules {
    /// `GET /posts/:id`: the method, and the path with every pattern applied.
    pub(crate) fn name(&self, method: &str, path: &str) -> String {
        let mut path = path.to_string();
        for pattern in &self.patterns {
            path = pattern
                .regex
                .replace_all(&path, pattern.name.as_str())
                .into_owned();
        }
        if method.is_empty() {
            path
        } else {
            format!("{method} {path}")
        }
    }
}

/// Counts of one route row while it is built.
#[derive(Default)]
struct Tally {
    requests: u64,
    /// The target's CPU samples under the route.
    cpu_samples: u64,
    locks: HashMap<u64, RouteLockCounts>,
}

fn add_counts(into: &mut RouteLockCounts, counts: &RouteLockCounts) {
    into.calls += counts.calls;
    into.waits += counts.waits;
    into.wait_ns += counts.wait_ns;
    into.cpu_samples += counts.cpu_samples;
}

impl Tally {
    fn absorb(&mut self, other: Tally) {
        self.requests += other.requests;
        self.cpu_samples += other.cpu_samples;
        for (lock, counts) in other.locks {
            add_counts(self.locks.entry(lock).or_default(), &counts);
        }
    }
}

/// The route key's row: its kind and name.
fn row_of(key: u64, php: &PhpCollected, rules: &RouteRules) -> (RouteKind, String) {
    match key {
        NO_REQUEST => (RouteKind::OutsideRequests, "(outside requests)".into()),
        UNREADABLE_ROUTE => (RouteKind::Unreadable, "(unreadable)".into()),
        PAST_CAP_ROUTE => (RouteKind::PastCap, RouteKind::PAST_CAP_NAME.into()),
        _ => match php.routes.get(&key) {
            Some((method, path)) => (RouteKind::Route, rules.name(method, path)),
            None => (RouteKind::Unreadable, "(unreadable)".into()),
        },
    }
}

/// The per-route section (folded into the report's rows, with their names,
/// by [`fold_into_rows`] once the rows are final). `cpu_hz`: the CPU
/// sampler's rate, 0 when it was off; in `mode` contention no lock call is
/// counted, so acquisitions per request are null.
pub(crate) fn build(php: &PhpCollected, rules: &RouteRules, cpu_hz: u64, mode: Mode) -> Routes {
    let mut rows: HashMap<(RouteKind, String), Tally> = HashMap::new();
    for (&key, &requests) in &php.requests {
        rows.entry(row_of(key, php, rules)).or_default().requests += requests;
    }
    for (&key, &samples) in &php.cpu {
        rows.entry(row_of(key, php, rules)).or_default().cpu_samples += samples;
    }
    for (key, counts) in &php.locks {
        let row = rows.entry(row_of(key.route, php, rules)).or_default();
        add_counts(row.locks.entry(key.lock).or_default(), counts);
    }
    let period = (cpu_hz > 0).then(|| sample_period_ns(cpu_hz));
    let figures = Figures {
        period,
        acquisitions: mode.counts_acquisitions_per_route(),
    };
    let distinct = rows
        .keys()
        .filter(|(kind, _)| *kind == RouteKind::Route)
        .count() as u64;
    let mut named: Vec<((RouteKind, String), Tally)> = Vec::new();
    let mut rest: Vec<((RouteKind, String), Tally)> = Vec::new();
    for row in rows {
        if row.0.0 == RouteKind::Route {
            named.push(row);
        } else {
            rest.push(row);
        }
    }
    named.sort_by(|a, b| b.1.requests.cmp(&a.1.requests).then(a.0.1.cmp(&b.0.1)));
    let mut other = Tally::default();
    let mut folded = false;
    for (_, tally) in named.drain(rules.max_routes.min(named.len())..) {
        other.absorb(tally);
        folded = true;
    }
    let mut routes: Vec<Route> = named
        .into_iter()
        .map(|((kind, name), tally)| route(kind, name, tally, figures))
        .collect();
    if folded {
        routes.push(route(
            RouteKind::Other,
            "(other routes)".into(),
            other,
            figures,
        ));
    }
    rest.sort_by_key(|((kind, _), _)| *kind as u8);
    routes.extend(
        rest.into_iter()
            .map(|((kind, name), tally)| route(kind, name, tally, figures)),
    );
    Routes {
        routes,
        distinct,
        max_routes: rules.max_routes as u64,
        patterns: rules.patterns.iter().map(|p| p.text.clone()).collect(),
        cpu_sample_period_ns: period,
        acquisitions_not_counted: RouteCallsUncounted::of(mode),
    }
}

/// Each route key's name as its row in `routes` has it (stacks are labelled
/// with it): a key of a route past `--max-routes` names the
/// `(other routes)` row.
pub(crate) fn stack_labels(
    php: &PhpCollected,
    rules: &RouteRules,
    routes: &Routes,
) -> HashMap<u64, String> {
    let kept: std::collections::HashSet<&str> = routes
        .routes
        .iter()
        .filter(|route| route.kind == RouteKind::Route)
        .map(|route| route.name.as_str())
        .collect();
    php.routes
        .keys()
        .copied()
        .chain([NO_REQUEST, UNREADABLE_ROUTE, PAST_CAP_ROUTE])
        .map(|key| {
            let (kind, name) = row_of(key, php, rules);
            let folded = kind == RouteKind::Route && !kept.contains(name.as_str());
            (
                key,
                if folded {
                    "(other routes)".into()
                } else {
                    name
                },
            )
        })
        .collect()
}

/// What a route's figures per request can say.
#[derive(Clone, Copy)]
struct Figures {
    /// ns per CPU sample, None without the sampler.
    period: Option<u64>,
    /// Whether lock calls were counted (not in contention mode).
    acquisitions: bool,
}

/// A route row from its tally.
fn route(kind: RouteKind, name: String, tally: Tally, figures: Figures) -> Route {
    let per = |value: f64| (tally.requests > 0).then(|| value / tally.requests as f64);
    let cpu_per = |samples: u64| {
        figures
            .period
            .and_then(|period| per(samples as f64 * period as f64 / 1000.0))
    };
    let calls_per = |calls: u64| per(calls as f64).filter(|_| figures.acquisitions);
    let mut locks: Vec<RouteLock> = tally
        .locks
        .iter()
        .map(|(&address, counts)| RouteLock {
            address,
            name: None,
            // Where routes' calls are not counted, an inproc recording's
            // unstubbed functions still count some at their probes: a part
            // that must not read as the whole.
            acquisitions: if figures.acquisitions {
                counts.calls
            } else {
                0
            },
            contended: counts.waits,
            wait_ns: counts.wait_ns,
            acquisitions_per_request: calls_per(counts.calls),
            contended_per_request: per(counts.waits as f64),
            wait_us_per_request: per(counts.wait_ns as f64 / 1000.0),
            cpu_samples: counts.cpu_samples,
            cpu_us_per_request: cpu_per(counts.cpu_samples),
        })
        .collect();
    locks.sort_by(|a, b| {
        (b.acquisitions, b.contended, b.cpu_samples, a.address).cmp(&(
            a.acquisitions,
            a.contended,
            a.cpu_samples,
            b.address,
        ))
    });
    let all: u64 = locks.iter().map(|lock| lock.acquisitions).sum();
    Route {
        name,
        kind,
        requests: tally.requests,
        acquisitions_per_request: calls_per(all),
        cpu_samples: tally.cpu_samples,
        cpu_us_per_request: cpu_per(tally.cpu_samples),
        locks,
    }
}

/// Folds each route's locks into the report's rows, once the rows are
/// final (named, grouped by creation site): a futex word inside a lock
/// (musl's mutex waits on its second word) and each member of a grouped
/// row count under that row, with its name.
pub(crate) fn fold_into_rows(report: &mut Report) {
    let mut rows: BTreeMap<u64, (u64, Option<String>)> = BTreeMap::new();
    let mut members: HashMap<u64, u64> = HashMap::new();
    for lock in &report.locks {
        rows.insert(lock.address, (lock.kind.span(), lock.name.clone()));
        for member in lock.group.iter().flat_map(|group| &group.by_address) {
            members.insert(member.address, lock.address);
        }
    }
    let row_of = |address: u64| {
        if rows.contains_key(&address) {
            return address;
        }
        if let Some(&row) = members.get(&address) {
            return row;
        }
        let owner = lock_holding(&rows, address, |(span, _)| *span);
        owner
            .map(|owner| members.get(&owner).copied().unwrap_or(owner))
            .unwrap_or(address)
    };
    let Some(routes) = &mut report.routes else {
        return;
    };
    let figures = Figures {
        period: routes.cpu_sample_period_ns,
        acquisitions: report.mode.counts_acquisitions_per_route(),
    };
    for route in &mut routes.routes {
        let mut folded: BTreeMap<u64, RouteLockCounts> = BTreeMap::new();
        for lock in route.locks.drain(..) {
            let row = row_of(lock.address);
            // CPU samples on an address that is no lock (a null or tiny
            // argument) stay in the route's CPU, in no lock's, as in the rows.
            if !rows.contains_key(&row) && lock.acquisitions == 0 && lock.contended == 0 {
                continue;
            }
            let counts = RouteLockCounts {
                calls: lock.acquisitions,
                waits: lock.contended,
                wait_ns: lock.wait_ns,
                cpu_samples: lock.cpu_samples,
            };
            add_counts(folded.entry(row).or_default(), &counts);
        }
        let tally = Tally {
            requests: route.requests,
            cpu_samples: route.cpu_samples,
            locks: folded.into_iter().collect(),
        };
        let names: HashMap<u64, Option<String>> = tally
            .locks
            .keys()
            .map(|&address| (address, rows.get(&address).and_then(|(_, n)| n.clone())))
            .collect();
        *route = self::route(route.kind, std::mem::take(&mut route.name), tally, figures);
        for lock in &mut route.locks {
            lock.name = names.get(&lock.address).cloned().flatten();
        }
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::php::{RouteLockCounts, RouteLockKey};

    use super::*;
    use crate::model::{AddressFigures, Lock, LockKind, SiteGroup, WaitClass};

    const MUTEX: u64 = 0x1000;
    const GROUP: u64 = 0x2000;
    const MEMBER: u64 = 0x3000;

    fn counts(calls: u64, waits: u64) -> RouteLockCounts {
        RouteLockCounts {
            calls,
            waits,
            wait_ns: waits * 1000,
            cpu_samples: 0,
        }
    }

    /// Two routes of one path under ids, the query string already cut by
    /// the BPF side, and a thread outside requests.
    fn collected() -> PhpCollected {
        let mut php = PhpCollected::default();
        php.routes.insert(7, ("GET".into(), "/posts/1".into()));
        php.routes.insert(8, ("GET".into(), "/posts/22".into()));
        php.requests.insert(7, 1);
        php.requests.insert(8, 3);
        let mut add = |route, lock, value| {
            php.locks.insert(RouteLockKey { route, lock }, value);
        };
        add(7, MUTEX, counts(4, 0));
        add(8, MUTEX, counts(12, 0));
        // musl's mutex waits on its second word.
        add(8, MUTEX + 4, counts(0, 2));
        add(8, MEMBER, counts(8, 0));
        add(NO_REQUEST, GROUP, counts(5, 0));
        php
    }

    fn rules() -> RouteRules {
        RouteRules {
            patterns: vec![RoutePattern::parse("/\\d+$=/:id").unwrap()],
            max_routes: 20,
        }
    }

    #[test]
    fn patterns_collapse_ids_and_figures_are_per_route_request() {
        let routes = build(&collected(), &rules(), 0, Mode::All);
        assert_eq!(routes.distinct, 1);
        let posts = &routes.routes[0];
        assert_eq!((posts.name.as_str(), posts.requests), ("GET /posts/:id", 4));
        let mutex = posts.locks.iter().find(|l| l.address == MUTEX).unwrap();
        assert_eq!(mutex.acquisitions_per_request, Some(4.0));
        let outside = routes.routes.last().unwrap();
        assert_eq!(outside.kind, RouteKind::OutsideRequests);
        assert_eq!(outside.acquisitions_per_request, None);
    }

    #[test]
    fn futex_words_and_group_members_fold_into_their_rows() {
        let mut report = Report::empty_for_tests("all");
        let mut mutex = Lock::empty(MUTEX, LockKind::Mutex, WaitClass::Lock);
        mutex.name = Some("g_lock".into());
        let mut group = Lock::empty(GROUP, LockKind::Mutex, WaitClass::Lock);
        group.name = Some("mutex created in f".into());
        group.group = Some(SiteGroup {
            addresses: 2,
            objects: 2,
            by_address: [GROUP, MEMBER]
                .map(|address| AddressFigures {
                    address,
                    ..AddressFigures::default()
                })
                .to_vec(),
        });
        report.locks = vec![mutex, group];
        report.routes = Some(build(&collected(), &rules(), 0, Mode::All));
        fold_into_rows(&mut report);
        let posts = &report.routes.as_ref().unwrap().routes[0];
        let row = |address| posts.locks.iter().find(|l| l.address == address).unwrap();
        assert_eq!(posts.locks.len(), 2, "{posts:#?}");
        assert_eq!((row(MUTEX).acquisitions, row(MUTEX).contended), (16, 2));
        assert_eq!(row(MUTEX).name.as_deref(), Some("g_lock"));
        assert_eq!(row(MUTEX).contended_per_request, Some(0.5));
        assert_eq!(row(GROUP).acquisitions, 8);
        assert_eq!(row(GROUP).name.as_deref(), Some("mutex created in f"));
    }

    /// At 1000 Hz a sample is 1 ms: each route's CPU is its samples per
    /// request; a lock's CPU samples fold into its row like its calls, and
    /// samples on an address that is no lock stay in the route's CPU alone.
    #[test]
    fn cpu_per_route_and_lock_is_samples_per_request() {
        let mut php = collected();
        php.cpu.insert(7, 2);
        php.cpu.insert(8, 6);
        php.locks
            .get_mut(&RouteLockKey {
                route: 8,
                lock: MUTEX + 4,
            })
            .unwrap()
            .cpu_samples = 2;
        php.locks.insert(
            RouteLockKey {
                route: 8,
                lock: 0x10,
            },
            RouteLockCounts {
                cpu_samples: 1,
                ..RouteLockCounts::default()
            },
        );
        let mut report = Report::empty_for_tests("all");
        report.locks = vec![Lock::empty(MUTEX, LockKind::Mutex, WaitClass::Lock)];
        report.routes = Some(build(&php, &rules(), 1000, Mode::All));
        fold_into_rows(&mut report);
        let routes = report.routes.as_ref().unwrap();
        assert_eq!(routes.cpu_sample_period_ns, Some(1_000_000));
        let posts = &routes.routes[0];
        assert_eq!(
            (posts.cpu_samples, posts.cpu_us_per_request),
            (8, Some(2000.0))
        );
        let mutex = posts.locks.iter().find(|l| l.address == MUTEX).unwrap();
        assert_eq!(
            (mutex.cpu_samples, mutex.cpu_us_per_request),
            (2, Some(500.0))
        );
        assert!(posts.locks.iter().all(|l| l.address != 0x10), "{posts:#?}");
        let without_sampler = build(&php, &rules(), 0, Mode::All);
        assert_eq!(without_sampler.routes[0].cpu_us_per_request, None);
    }

    #[test]
    fn routes_past_the_limit_fold_into_other() {
        let mut php = collected();
        php.routes.insert(9, ("POST".into(), "/login".into()));
        php.requests.insert(9, 1);
        let routes = build(
            &php,
            &RouteRules {
                max_routes: 1,
                ..rules()
            },
            0,
            Mode::All,
        );
        let names: Vec<&str> = routes.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            ["GET /posts/:id", "(other routes)", "(outside requests)"]
        );
        assert_eq!(routes.distinct, 2);
        let rules = RouteRules {
            max_routes: 1,
            ..rules()
        };
        let labels = stack_labels(&php, &rules, &routes);
        assert_eq!(labels[&7], "GET /posts/:id");
        assert_eq!(labels[&8], "GET /posts/:id");
        assert_eq!(labels[&9], "(other routes)");
        assert_eq!(labels[&NO_REQUEST], "(outside requests)");
    }

    /// Issue 52 K: requests of routes past the BPF side's route map count
    /// in a row of their own, with their lock calls, never as unreadable;
    /// and the routes kept apart are the named ones alone.
    #[test]
    fn routes_past_the_maps_capacity_are_a_row_of_their_own() {
        let mut php = collected();
        php.requests.insert(PAST_CAP_ROUTE, 5);
        php.locks.insert(
            RouteLockKey {
                route: PAST_CAP_ROUTE,
                lock: MUTEX,
            },
            counts(15, 1),
        );
        let routes = build(&php, &rules(), 0, Mode::All);
        let rows: Vec<(&str, RouteKind, u64)> = routes
            .routes
            .iter()
            .map(|r| (r.name.as_str(), r.kind, r.requests))
            .collect();
        assert_eq!(
            rows,
            [
                ("GET /posts/:id", RouteKind::Route, 4),
                ("(routes past the cap)", RouteKind::PastCap, 5),
                ("(outside requests)", RouteKind::OutsideRequests, 0),
            ]
        );
        assert_eq!(routes.distinct, 1);
        let past = &routes.routes[1];
        assert_eq!(past.acquisitions_per_request, Some(3.0));
        assert_eq!(
            (past.locks[0].acquisitions, past.locks[0].contended),
            (15, 1)
        );
        let labels = stack_labels(&php, &rules(), &routes);
        assert_eq!(labels[&PAST_CAP_ROUTE], "(routes past the cap)");
    }

    #[test]
    fn a_pattern_without_a_name_part_is_a_one_line_error() {
        let error = RoutePattern::parse("/posts/\\d+").unwrap_err().to_string();
        assert!(error.contains("REGEX=NAME"), "{error}");
        let error = RoutePattern::parse("/posts/(=x").unwrap_err();
        assert!(
            format!("{error:#}").contains("not a valid regex"),
            "{error:#}"
        );
    }
}
