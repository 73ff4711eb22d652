//! The table's route lines (`--php`): per route, its requests and, per
//! request, its acquisitions, its CPU (sampled) and the locks that take
//! the most.
use std::fmt::Write;

use super::{
    fit::Width,
    format::{cut, printable},
};
use crate::model::{Report, Route, RouteKind, RouteLock};

/// Locks named per route at most.
const LOCKS_SHOWN: usize = 2;
/// Longest route name and lock name shown (the JSON has them whole).
const NAME_WIDTH: usize = 60;
const LOCK_WIDTH: usize = 36;
/// Before each route's line.
const INDENT: &str = "  ";

/// `routes:` then one line per route, and where PHP's state was found.
pub(crate) fn render(report: &Report, width: Width) -> String {
    let mut out = String::new();
    if let Some(php) = &report.php {
        let unread: Vec<String> = php
            .unread
            .iter()
            .map(|(reason, count)| format!("{count} {reason}"))
            .collect();
        let threads = threads_found(php);
        let _ = writeln!(
            out,
            "php: {} {} ({} layout), {threads}{}",
            printable(&php.module),
            php.version.as_deref().unwrap_or("(version unknown)"),
            serde_plain(&php.layout),
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
    let past_cap: Vec<&Route> = routes
        .routes
        .iter()
        .filter(|route| route.kind == RouteKind::PastCap)
        .collect();
    let _ = writeln!(
        out,
        "routes ({} seen{}{}):",
        routes.distinct,
        if past_cap.is_empty() {
            String::new()
        } else {
            let requests: u64 = past_cap.iter().map(|route| route.requests).sum();
            format!(", more past the map's capacity: {requests} requests not apart")
        },
        if routes.distinct > routes.max_routes {
            format!(", top {} apart", routes.max_routes)
        } else {
            String::new()
        }
    );
    for route in &routes.routes {
        let _ = writeln!(out, "{INDENT}{}", line(route, width));
    }
    if let Some(why) = routes.acquisitions_not_counted {
        let _ = writeln!(out, "{INDENT}{}", why.line());
    }
    out
}

fn serde_plain(layout: &crate::model::LayoutSource) -> &'static str {
    match layout {
        crate::model::LayoutSource::Dwarf => "DWARF",
        crate::model::LayoutSource::Table => "version table",
    }
}

/// `16 threads (globals found through their TLS)`: how PHP's threads and
/// their globals were found.
fn threads_found(php: &crate::model::PhpContext) -> String {
    use crate::model::{ThreadBlocks, TlsSlotFrom};
    let slot_from = match php.tls_slot_from {
        Some(TlsSlotFrom::TcbOffsetFunction) => "tsrm_get_ls_cache_tcb_offset",
        Some(TlsSlotFrom::PthreadKey) => "tsrm_get_ls_cache's pthread key",
        _ => {
            let blocks = match php.thread_blocks {
                ThreadBlocks::Tls => "globals found through their TLS",
                ThreadBlocks::Table => "globals found in PHP's thread table",
            };
            return format!("{} threads ({blocks})", php.threads);
        }
    };
    format!(
        "threads not counted (PHP's thread table stripped), globals found through their TLS (slot from {slot_from})"
    )
}

/// `GET /q.php: 2000 requests, 792.0 acquisitions/request, 840 µs CPU/request; *lock 408.0, …`:
/// as many of the route's top locks as fit `width` (less the line's indent).
pub(crate) fn line(route: &Route, width: Width) -> String {
    let name = match width {
        Width::Unlimited => printable(&route.name).into_owned(),
        Width::Columns(_) => cut(&printable(&route.name), NAME_WIDTH),
    };
    let head = format!("{name}: {}", figures(route));
    let locks: Vec<String> = route
        .locks
        .iter()
        .filter(|lock| lock.acquisitions > 0 || lock.contended > 0)
        .take(LOCKS_SHOWN)
        .map(|lock| lock_text(lock, width))
        .collect();
    let with = |shown: &[String]| match shown {
        [] => head.clone(),
        _ => format!("{head}; {}", shown.join(", ")),
    };
    let Width::Columns(columns) = width else {
        return with(&locks);
    };
    let room = columns.saturating_sub(INDENT.len());
    (0..=locks.len())
        .rev()
        .map(|shown| with(&locks[..shown]))
        .find(|text| text.chars().count() <= room)
        .unwrap_or(head)
}

/// Requests and, per request, acquisitions (when lock calls were counted)
/// and CPU; a row without requests gives its totals.
fn figures(route: &Route) -> String {
    let acquisitions: u64 = route.locks.iter().map(|lock| lock.acquisitions).sum();
    let contended: u64 = route.locks.iter().map(|lock| lock.contended).sum();
    let mut figures = if route.requests > 0 {
        let mut text = format!("{} requests", route.requests);
        if let Some(per) = route.acquisitions_per_request {
            let _ = write!(text, ", {per:.1} acquisitions/request");
        }
        text
    } else {
        // A row without requests (`(outside requests)`): what it does hold.
        let parts: Vec<String> = [
            (acquisitions, "acquisitions"),
            (contended, "contended waits"),
            (route.cpu_samples, "CPU samples"),
        ]
        .into_iter()
        .filter(|(count, _)| *count > 0)
        .map(|(count, what)| format!("{count} {what}"))
        .collect();
        if parts.is_empty() {
            "nothing counted".into()
        } else {
            parts.join(", ")
        }
    };
    if let Some(cpu_us) = route.cpu_us_per_request {
        let _ = write!(figures, ", {cpu_us:.0} µs CPU/request");
    }
    figures
}

/// A lock under a route: its acquisitions per request, else (contention
/// mode) its contended waits per request; totals in a row without requests.
fn lock_text(lock: &RouteLock, width: Width) -> String {
    let label = lock
        .name
        .clone()
        .unwrap_or_else(|| format!("{:#x}", lock.address));
    let label = match width {
        Width::Unlimited => printable(&label).into_owned(),
        Width::Columns(_) => cut(&printable(&label), LOCK_WIDTH),
    };
    match (lock.acquisitions_per_request, lock.contended_per_request) {
        (Some(per), _) if lock.acquisitions > 0 => format!("{label} {per:.1}"),
        (_, Some(per)) if lock.contended > 0 => format!("{label} {per:.2} contended"),
        _ if lock.acquisitions > 0 => format!("{label} {}", lock.acquisitions),
        _ => format!("{label} {} contended", lock.contended),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RouteKind;

    fn lock(name: &str, acquisitions: u64, contended: u64, requests: u64) -> RouteLock {
        let per = |n: u64| Some(n as f64 / requests as f64);
        RouteLock {
            address: 0x1000,
            name: Some(name.into()),
            acquisitions,
            contended,
            wait_ns: 0,
            acquisitions_per_request: per(acquisitions),
            contended_per_request: per(contended),
            wait_us_per_request: Some(0.0),
            cpu_samples: 1,
            cpu_us_per_request: Some(500.0),
        }
    }

    fn q_route() -> Route {
        Route {
            name: "GET /q.php".into(),
            kind: RouteKind::Route,
            requests: 2,
            acquisitions_per_request: Some(792.0),
            cpu_samples: 3,
            cpu_us_per_request: Some(1500.0),
            locks: vec![
                lock("*stats->LOCK_access", 816, 0, 2),
                lock(
                    "mutex created in tsrm_mutex_alloc <- mysqlnd_stats_init",
                    766,
                    0,
                    2,
                ),
                // CPU samples only: not named on the line.
                lock("cpu only", 0, 0, 2),
            ],
        }
    }

    #[test]
    fn a_route_line_has_its_figures_per_request_and_the_locks_that_fit() {
        let mut route = q_route();
        let head = "GET /q.php: 2 requests, 792.0 acquisitions/request, 1500 µs CPU/request";
        assert_eq!(
            line(&route, Width::Unlimited),
            format!(
                "{head}; *stats->LOCK_access 408.0, mutex created in tsrm_mutex_alloc <- mysqlnd_stats_init 383.0"
            )
        );
        // 160 columns: the second lock's name is cut to fit.
        let fitted = line(&route, Width::Columns(160));
        assert!(fitted.chars().count() <= 158, "{fitted}");
        assert!(fitted.ends_with("383.0"), "{fitted}");
        // Narrower: only the locks that fit whole, then none.
        assert_eq!(
            line(&route, Width::Columns(110)),
            format!("{head}; *stats->LOCK_access 408.0")
        );
        assert_eq!(line(&route, Width::Columns(80)), head);
        route.cpu_us_per_request = None;
        assert!(
            line(&route, Width::Unlimited)
                .starts_with("GET /q.php: 2 requests, 792.0 acquisitions/request;")
        );
    }

    /// `(outside requests)` has no requests: its totals, CPU samples too.
    #[test]
    fn a_row_without_requests_gives_what_it_holds() {
        let mut route = q_route();
        route.kind = RouteKind::OutsideRequests;
        route.name = "(outside requests)".into();
        route.requests = 0;
        route.acquisitions_per_request = None;
        route.cpu_us_per_request = None;
        route.locks = vec![lock("cpu only", 0, 0, 1)];
        route.cpu_samples = 6;
        assert_eq!(
            line(&route, Width::Unlimited),
            "(outside requests): 6 CPU samples"
        );
        route.locks = vec![RouteLock {
            acquisitions_per_request: None,
            contended_per_request: None,
            ..lock("*m", 5, 2, 1)
        }];
        route.cpu_samples = 0;
        assert_eq!(
            line(&route, Width::Unlimited),
            "(outside requests): 5 acquisitions, 2 contended waits; *m 5"
        );
        route.locks.clear();
        assert_eq!(
            line(&route, Width::Unlimited),
            "(outside requests): nothing counted"
        );
    }

    /// Contention mode counts no lock calls: no acquisitions figure, the
    /// locks by their contended waits.
    #[test]
    fn a_contention_mode_route_line_gives_contended_waits() {
        let mut route = q_route();
        route.acquisitions_per_request = None;
        route.cpu_us_per_request = None;
        route.locks = vec![lock("*stats->LOCK_access", 0, 3, 2)];
        route.locks[0].acquisitions_per_request = None;
        assert_eq!(
            line(&route, Width::Unlimited),
            "GET /q.php: 2 requests; *stats->LOCK_access 1.50 contended"
        );
    }

    /// Where PHP's thread table was read, the threads it had; where it is
    /// stripped, how the TLS slot was found instead.
    #[test]
    fn the_php_line_says_how_the_threads_globals_were_found() {
        use crate::model::{LayoutSource, PhpContext, ThreadBlocks, TlsSlotFrom};
        let mut php = PhpContext {
            module: "/lib/libphp.so".into(),
            version: Some("8.2.32".into()),
            layout: LayoutSource::Dwarf,
            threads: 17,
            thread_blocks: ThreadBlocks::Tls,
            tls_slot_from: Some(TlsSlotFrom::ThreadTable),
            unread: Default::default(),
        };
        assert_eq!(
            threads_found(&php),
            "17 threads (globals found through their TLS)"
        );
        php.thread_blocks = ThreadBlocks::Table;
        php.tls_slot_from = None;
        assert_eq!(
            threads_found(&php),
            "17 threads (globals found in PHP's thread table)"
        );
        php.threads = 0;
        php.thread_blocks = ThreadBlocks::Tls;
        php.tls_slot_from = Some(TlsSlotFrom::TcbOffsetFunction);
        assert_eq!(
            threads_found(&php),
            "threads not counted (PHP's thread table stripped), globals found through their TLS (slot from tsrm_get_ls_cache_tcb_offset)"
        );
        php.tls_slot_from = Some(TlsSlotFrom::PthreadKey);
        assert!(
            threads_found(&php).ends_with("(slot from tsrm_get_ls_cache's pthread key)"),
            "{}",
            threads_found(&php)
        );
    }
}
