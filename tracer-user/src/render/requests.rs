//! The request lines of a report: count, source, statuses; per-request cells.
use super::format::{duration, ratio};
use crate::model::{AutoProbe, PerRequest, RequestSource, Requests, ServerKind};

/// The header line of a report with requests: count, source, statuses.
/// `estimated`: the count was scaled from sampling windows (`~`).
pub(crate) fn describe(requests: &Requests, estimated: bool) -> String {
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
    if let Some(auto) = &requests.auto_probe {
        line.push_str(&format!("{}\n", why_probe(auto)));
    }
    if let Some(reason) = &requests.refused {
        line.push_str(&format!("no per-request figures: {reason}\n"));
    }
    line
}

/// Why the request probe locktrace chose counts requests on that server.
pub(crate) fn why_probe(auto: &AutoProbe) -> String {
    let (server, why) = match auto.server {
        ServerKind::Frankenphp => (
            "FrankenPHP",
            "starts every PHP request once, in classic and in worker mode",
        ),
        ServerKind::ApacheModPhp => ("Apache with mod_php", "starts every PHP request once"),
        ServerKind::Php => ("PHP", "starts every PHP request once"),
    };
    let module = auto.module.rsplit('/').next().unwrap_or(&auto.module);
    format!(
        "request probe chosen: {server} (recognised by {}): {module}:{} {why}",
        auto.recognised_by, auto.function
    )
}

/// Per-request cells for the table: acquisitions, contended, wait.
pub(crate) fn cells(per: Option<&PerRequest>) -> [String; 3] {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_which_function_counts_requests_and_why() {
        let requests = Requests {
            source: RequestSource::Probe,
            count: 200,
            probe: Some("libphp-franken-stock.so:sapi_activate".into()),
            probe_hits: Some(200),
            auto_probe: Some(AutoProbe {
                server: ServerKind::Frankenphp,
                module: "/tmp/e2e/libphp-franken-stock.so".into(),
                function: "sapi_activate".into(),
                recognised_by: "go_frankenphp_finish_worker_request in frankenphp-e2e".into(),
            }),
            ..Requests::default()
        };
        assert_eq!(
            describe(&requests, false),
            "requests: 200 (calls of libphp-franken-stock.so:sapi_activate)\n\
             request probe chosen: FrankenPHP (recognised by go_frankenphp_finish_worker_request in frankenphp-e2e): \
             libphp-franken-stock.so:sapi_activate starts every PHP request once, in classic and in worker mode\n"
        );
    }
}
