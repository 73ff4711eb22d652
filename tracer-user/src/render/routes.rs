//! The table's route lines (`--php`): per route, its requests and, per
//! request, its acquisitions, its CPU (sampled) and the locks that take
//! the most.
use std::fmt::Write;

use super::format::{cut, printable};
use crate::model::{Report, Route};

/// Locks named per route at most.
const LOCKS_SHOWN: usize = 2;
/// Longest route name and lock name shown (the JSON has them whole).
const NAME_WIDTH: usize = 60;
const LOCK_WIDTH: usize = 36;

/// `routes:` then one line per route, and where PHP's state was found.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    if let Some(php) = &report.php {
        let unread: Vec<String> = php
            .unread
            .iter()
            .map(|(reason, count)| format!("{count} {reason}"))
            .collect();
        let _ = writeln!(
            out,
            "php: {} {} ({} layout), {} threads ({}){}",
            printable(&php.module),
            php.version.as_deref().unwrap_or("(version unknown)"),
            serde_plain(&php.layout),
            php.threads,
            match php.thread_blocks {
                crate::model::ThreadBlocks::Tls => "globals found through their TLS",
                crate::model::ThreadBlocks::Table => "globals found in PHP's thread table",
            },
            if unread.is_empty() {
                String::new()
            } else {
                format!("; PHP context not read: {}", unread.join(", "))
            }
        );
    }
    let Some(routes) = &report.routes else {
        return out;
    };
    let _ = writeln!(
        out,
        "routes ({} seen{}):",
        routes.distinct,
        if routes.distinct > routes.max_routes {
            format!(", top {} apart", routes.max_routes)
        } else {
            String::new()
        }
    );
    for route in &routes.routes {
        let _ = writeln!(out, "  {}", line(route));
    }
    out
}

fn serde_plain(layout: &crate::model::LayoutSource) -> &'static str {
    match layout {
        crate::model::LayoutSource::Dwarf => "DWARF",
        crate::model::LayoutSource::Table => "version table",
    }
}

/// `GET /q.php: 2000 requests, 792.0 acquisitions/request, 840 µs CPU/request; *lock 408.0, …`.
pub fn line(route: &Route) -> String {
    let name = cut(&printable(&route.name), NAME_WIDTH);
    let locks: Vec<String> = route
        .locks
        .iter()
        .take(LOCKS_SHOWN)
        .map(|lock| {
            let label = lock
                .name
                .clone()
                .unwrap_or_else(|| format!("{:#x}", lock.address));
            // Short enough that a route's line fits the table's width.
            let label = cut(&printable(&label), LOCK_WIDTH);
            match lock.acquisitions_per_request {
                Some(per) => format!("{label} {per:.1}"),
                None => format!("{label} {}", lock.acquisitions),
            }
        })
        .collect();
    let mut figures = match route.acquisitions_per_request {
        Some(per) => format!("{} requests, {per:.1} acquisitions/request", route.requests),
        None => {
            let all: u64 = route.locks.iter().map(|lock| lock.acquisitions).sum();
            format!("{all} acquisitions")
        }
    };
    if let Some(cpu_us) = route.cpu_us_per_request {
        let _ = write!(figures, ", {cpu_us:.0} µs CPU/request");
    }
    if locks.is_empty() {
        format!("{name}: {figures}")
    } else {
        format!("{name}: {figures}; {}", locks.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{RouteKind, RouteLock};

    #[test]
    fn a_route_line_has_its_figures_per_request_and_its_top_locks() {
        let lock = RouteLock {
            address: 0x1000,
            name: Some("*stats->LOCK_access".into()),
            acquisitions: 816,
            contended: 0,
            wait_ns: 0,
            acquisitions_per_request: Some(408.0),
            contended_per_request: Some(0.0),
            wait_us_per_request: Some(0.0),
            cpu_samples: 1,
            cpu_us_per_request: Some(500.0),
        };
        let mut route = Route {
            name: "GET /q.php".into(),
            kind: RouteKind::Route,
            requests: 2,
            acquisitions_per_request: Some(408.0),
            cpu_samples: 3,
            cpu_us_per_request: Some(1500.0),
            locks: vec![lock],
        };
        assert_eq!(
            line(&route),
            "GET /q.php: 2 requests, 408.0 acquisitions/request, 1500 µs CPU/request; *stats->LOCK_access 408.0"
        );
        route.cpu_us_per_request = None;
        assert_eq!(
            line(&route),
            "GET /q.php: 2 requests, 408.0 acquisitions/request; *stats->LOCK_access 408.0"
        );
    }
}
