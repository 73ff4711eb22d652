//! The request lines of a report: count, source, statuses; per-request cells.
use super::format::{duration, ratio};
use crate::model::{PerRequest, RequestSource, Requests};

/// The header line of a report with requests: count, source, statuses.
/// `estimated`: the count was scaled from sampling windows (`~`).
pub fn describe(requests: &Requests, estimated: bool) -> String {
    let source = match (requests.source, &requests.probe) {
        (RequestSource::Probe, Some(probe)) => format!("calls of {probe}"),
        (RequestSource::Probe, None) => "calls of the request probe".to_string(),
        (RequestSource::Load, _) => "load driver responses".to_string(),
        (RequestSource::Given, _) => "given with --requests".to_string(),
    };
    let count = if estimated {
        format!("~{} (scaled from the sampling windows)", requests.count)
    } else {
        requests.count.to_string()
    };
    let mut line = format!("requests: {count} ({source})");
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
    if let (Some(hits), false) = (requests.probe_hits, requests.source == RequestSource::Probe) {
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
            match (per.acquisitions, per.acquisitions_error) {
                (Some(value), Some(error)) => format!("~{} ±{}", ratio(value), ratio(error)),
                (Some(value), None) => ratio(value),
                (None, _) => "-".to_string(),
            },
            ratio(per.contended),
            duration(per.wait_ns.round() as u64),
        ],
        None => ["-".into(), "-".into(), "-".into()],
    }
}
