//! The table's route lines (`--php`): per route, its requests and, per
//! request, its acquisitions and the locks that take the most.
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

/// `GET /q.php: 2000 requests, 792.0 acquisitions/request; *lock 408.0, …`.
fn line(route: &Route) -> String {
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
    let figures = match route.acquisitions_per_request {
        Some(per) => format!("{} requests, {per:.1} acquisitions/request", route.requests),
        None => {
            let all: u64 = route.locks.iter().map(|lock| lock.acquisitions).sum();
            format!("{all} acquisitions")
        }
    };
    if locks.is_empty() {
        format!("{name}: {figures}")
    } else {
        format!("{name}: {figures}; {}", locks.join(", "))
    }
}
