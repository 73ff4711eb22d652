//! `--php`: the per-route section. The BPF side counts requests, lock calls
//! and contended waits per route key (a hash of method and path); here the
//! keys get their names, `--route-pattern` rules collapse ids, routes past
//! `--max-routes` fold into `other`, and every figure is divided by its
//! route's own requests.
use std::collections::HashMap;

use anyhow::{Context, Result, bail};
use regex::Regex;
use tracer_common::php::{NO_REQUEST, UNREADABLE_ROUTE};

use crate::model::{PhpCollected, Report, Route, RouteKind, RouteLock, Routes};

/// Routes kept apart by default.
pub const DEFAULT_MAX_ROUTES: usize = 20;

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
    pub fn parse(text: &str) -> Result<RoutePattern> {
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
    pub fn name(&self, method: &str, path: &str) -> String {
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
    /// lock → (acquisitions, contended, wait ns)
    locks: HashMap<u64, (u64, u64, u64)>,
}

impl Tally {
    fn absorb(&mut self, other: Tally) {
        self.requests += other.requests;
        for (lock, (calls, waits, wait_ns)) in other.locks {
            let into = self.locks.entry(lock).or_default();
            into.0 += calls;
            into.1 += waits;
            into.2 += wait_ns;
        }
    }
}

/// The route key's row: its kind and name.
fn row_of(key: u64, php: &PhpCollected, rules: &RouteRules) -> (RouteKind, String) {
    match key {
        NO_REQUEST => (RouteKind::OutsideRequests, "(outside requests)".into()),
        UNREADABLE_ROUTE => (RouteKind::Unreadable, "(unreadable)".into()),
        _ => match php.routes.get(&key) {
            Some((method, path)) => (RouteKind::Route, rules.name(method, path)),
            None => (RouteKind::Unreadable, "(unreadable)".into()),
        },
    }
}

/// The per-route section (lock names are filled by [`name_locks`] once the
/// locks are named).
pub fn build(php: &PhpCollected, rules: &RouteRules) -> Routes {
    let mut rows: HashMap<(RouteKind, String), Tally> = HashMap::new();
    for (&key, &requests) in &php.requests {
        rows.entry(row_of(key, php, rules)).or_default().requests += requests;
    }
    for (key, counts) in &php.locks {
        let row = rows.entry(row_of(key.route, php, rules)).or_default();
        let into = row.locks.entry(key.lock).or_default();
        into.0 += counts.calls;
        into.1 += counts.waits;
        into.2 += counts.wait_ns;
    }
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
        .map(|((kind, name), tally)| route(kind, name, tally))
        .collect();
    if folded {
        routes.push(route(RouteKind::Other, "(other routes)".into(), other));
    }
    rest.sort_by_key(|((kind, _), _)| *kind as u8);
    routes.extend(
        rest.into_iter()
            .map(|((kind, name), tally)| route(kind, name, tally)),
    );
    Routes {
        routes,
        distinct,
        max_routes: rules.max_routes as u64,
        patterns: rules.patterns.iter().map(|p| p.text.clone()).collect(),
    }
}

fn route(kind: RouteKind, name: String, tally: Tally) -> Route {
    let per = |value: f64| (tally.requests > 0).then(|| value / tally.requests as f64);
    let mut locks: Vec<RouteLock> = tally
        .locks
        .iter()
        .map(
            |(&address, &(acquisitions, contended, wait_ns))| RouteLock {
                address,
                name: None,
                acquisitions,
                contended,
                wait_ns,
                acquisitions_per_request: per(acquisitions as f64),
                contended_per_request: per(contended as f64),
                wait_us_per_request: per(wait_ns as f64 / 1000.0),
            },
        )
        .collect();
    locks.sort_by(|a, b| {
        (b.acquisitions, b.contended, a.address).cmp(&(a.acquisitions, a.contended, b.address))
    });
    let all: u64 = locks.iter().map(|lock| lock.acquisitions).sum();
    Route {
        name,
        kind,
        requests: tally.requests,
        acquisitions_per_request: per(all as f64),
        locks,
    }
}

/// Gives each route's locks the names of their rows.
pub fn name_locks(report: &mut Report) {
    let names: HashMap<u64, Option<String>> = report
        .locks
        .iter()
        .map(|lock| (lock.address, lock.name.clone()))
        .collect();
    if let Some(routes) = &mut report.routes {
        for lock in routes.routes.iter_mut().flat_map(|r| r.locks.iter_mut()) {
            lock.name = names.get(&lock.address).cloned().flatten();
        }
    }
}
