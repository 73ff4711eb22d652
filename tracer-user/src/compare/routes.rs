//! `compare` per route (reports recorded with `--php` on both sides): each
//! route's acquisitions per request and its named locks', before and after.
use std::{
    collections::{BTreeSet, HashMap},
    fmt::Write,
};

use crate::{
    model::{Route, RouteKind, Routes},
    render::format::{printable, ratio},
};

/// Named locks shown per route at most (the biggest change first).
const LOCKS_SHOWN: usize = 3;

/// The section, or nothing when either side has no routes.
pub(crate) fn render(before: Option<&Routes>, after: Option<&Routes>) -> String {
    let (Some(before), Some(after)) = (before, after) else {
        return String::new();
    };
    let named = |routes: &Routes| -> BTreeSet<String> {
        routes
            .routes
            .iter()
            .filter(|route| route.kind == RouteKind::Route)
            .map(|route| route.name.clone())
            .collect()
    };
    let names: BTreeSet<String> = named(before).union(&named(after)).cloned().collect();
    let (before, after) = (by_name(before), by_name(after));
    let mut out = String::from("routes (per request, before -> after):\n");
    for name in names {
        let old = before.get(name.as_str()).copied();
        let new = after.get(name.as_str()).copied();
        let _ = writeln!(out, "  {}", line(&name, old, new));
    }
    out
}

/// Each route by its name, the first of a name (a search per name was
/// quadratic: 84 s for 100,000 routes a side).
fn by_name(routes: &Routes) -> HashMap<&str, &Route> {
    let mut found = HashMap::with_capacity(routes.routes.len());
    for route in &routes.routes {
        found.entry(route.name.as_str()).or_insert(route);
    }
    found
}

fn per_request(route: Option<&Route>, lock: Option<&str>) -> Option<f64> {
    let route = route.filter(|route| route.requests > 0)?;
    match lock {
        None => route.acquisitions_per_request,
        Some(name) => Some(
            route
                .locks
                .iter()
                .filter(|row| row.name.as_deref() == Some(name))
                .filter_map(|row| row.acquisitions_per_request)
                .sum(),
        ),
    }
}

fn shown(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(0.0) => "gone".into(),
        Some(value) => ratio(value),
    }
}

/// `GET /q.php: 792 -> 1.0 acquisitions; *lock 408 -> gone, …`.
fn line(name: &str, old: Option<&Route>, new: Option<&Route>) -> String {
    let mut locks: Vec<(String, Option<f64>, Option<f64>)> = old
        .into_iter()
        .chain(new)
        .flat_map(|route| route.locks.iter().filter_map(|row| row.name.clone()))
        .collect::<BTreeSet<String>>()
        .into_iter()
        .map(|lock| {
            let before = per_request(old, Some(&lock));
            let after = per_request(new, Some(&lock));
            (lock, before, after)
        })
        .collect();
    let change = |(_, b, a): &(String, Option<f64>, Option<f64>)| {
        (a.unwrap_or(0.0) - b.unwrap_or(0.0)).abs()
    };
    locks.sort_by(|x, y| change(y).total_cmp(&change(x)).then(x.0.cmp(&y.0)));
    let mut text = format!(
        "{}: {} -> {} acquisitions",
        printable(name),
        shown(per_request(old, None)),
        shown(per_request(new, None))
    );
    for (lock, before, after) in locks.iter().take(LOCKS_SHOWN) {
        let _ = write!(
            text,
            "; {} {} -> {}",
            printable(lock),
            shown(*before),
            shown(*after)
        );
    }
    text
}
