//! Per-request figures: the request count of a recording (from the load
//! driver, the request-boundary probe, or the user) and the report's
//! per-lock and total figures divided by it.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::report::Report;

/// The `requests` block of a report.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Requests {
    /// `load` (the built-in load driver), `probe` (a request-boundary
    /// function, see `probe`), or `given` (`--requests N`).
    pub source: String,
    pub count: u64,
    /// Load driver responses by status code (empty without `--load`).
    #[serde(default)]
    pub statuses: BTreeMap<String, u64>,
    /// Unexpected responses of the load driver (status, body, connection errors).
    #[serde(default)]
    pub errors: u64,
    /// The unexpected responses by kind: `status 500`, `wrong body`, `connection error`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unexpected: BTreeMap<String, u64>,
    /// Load driver requests resent because the server had closed the idle
    /// keep-alive connection before reading them (not errors).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retries: u64,
    /// The request-boundary function (`MODULE:SYMBOL`) when one was probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
    /// Calls of the request-boundary function over the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_hits: Option<u64>,
    /// Why per-request figures are absent although requests were counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Figures per request, for one lock or for all of them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PerRequest {
    /// Null where acquisitions were not counted.
    pub acquisitions: Option<f64>,
    pub contended: f64,
    pub wait_ns: f64,
    /// `--hold-times`: hold time per request; null where not recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ns: Option<f64>,
}

/// Adds the request block to the report and, unless refused or zero, the
/// per-request figures of every lock and of the totals.
pub fn apply(report: &mut Report, requests: Requests) {
    let divisor =
        (requests.refused.is_none() && requests.count > 0).then_some(requests.count as f64);
    for lock in &mut report.locks {
        lock.per_request = divisor.map(|n| PerRequest {
            acquisitions: lock.acquisitions.map(|a| a as f64 / n),
            contended: lock.contended as f64 / n,
            wait_ns: lock.wait_ns as f64 / n,
            hold_ns: lock.holds.as_ref().map(|h| h.hold_ns as f64 / n),
        });
    }
    let totals = &mut report.totals;
    totals.per_request = divisor.map(|n| PerRequest {
        acquisitions: totals.acquisitions.map(|a| a as f64 / n),
        contended: totals.contended as f64 / n,
        wait_ns: totals.wait_ns as f64 / n,
        hold_ns: totals.hold_ns.map(|h| h as f64 / n),
    });
    report.requests = Some(requests);
}

/// The header line of a report with requests: count, source, statuses.
pub fn describe(requests: &Requests) -> String {
    let source = match (requests.source.as_str(), &requests.probe) {
        ("probe", Some(probe)) => format!("calls of {probe}"),
        ("load", _) => "load driver responses".to_string(),
        ("given", _) => "given with --requests".to_string(),
        (other, _) => other.to_string(),
    };
    let mut line = format!("requests: {} ({source})", requests.count);
    if !requests.statuses.is_empty() {
        let statuses: Vec<String> = requests
            .statuses
            .iter()
            .map(|(status, n)| format!("{status}: {n}"))
            .collect();
        line.push_str(&format!("; statuses {}", statuses.join(", ")));
    }
    if requests.retries > 0 {
        line.push_str(&format!(
            "; {} resent after a keep-alive close",
            requests.retries
        ));
    }
    if requests.errors > 0 {
        let kinds: Vec<String> = requests
            .unexpected
            .iter()
            .map(|(kind, n)| format!("{kind}: {n}"))
            .collect();
        line.push_str(&format!(
            "; {} unexpected ({})",
            requests.errors,
            kinds.join(", ")
        ));
    }
    if let (Some(hits), false) = (requests.probe_hits, requests.source == "probe") {
        line.push_str(&format!("; probe hits {hits}"));
    }
    line.push('\n');
    if let Some(reason) = &requests.refused {
        line.push_str(&format!("no per-request figures: {reason}\n"));
    }
    line
}

/// Per-request cells for the table: acquisitions, contended, wait.
pub fn cells(per: Option<&PerRequest>) -> [String; 3] {
    match per {
        Some(per) => [
            per.acquisitions.map_or("-".to_string(), ratio),
            ratio(per.contended),
            crate::table::duration(per.wait_ns.round() as u64),
        ],
        None => ["-".into(), "-".into(), "-".into()],
    }
}

/// A per-request figure: `8.0` when whole (exact), else two decimals (four below 0.1).
pub fn ratio(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.1}")
    } else if value.abs() < 0.1 {
        format!("{value:.4}")
    } else {
        format!("{value:.2}")
    }
}
