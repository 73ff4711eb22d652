//! Footer lines under the table: how naming went, placement, estimates and
//! what tracing cost.
use std::fmt::Write;

use super::format::duration;
use crate::model::{DeclaredContention, Estimate, LayoutSource, Mode, Naming, Report, ScaleBasis};

/// One or two lines under the table: how naming went, and what to do for
/// modules without symbols.
pub(crate) fn naming(report: &Report) -> String {
    let Some(naming) = &report.naming else {
        return String::new();
    };
    let mut out = format!(
        "names: {} modules in {:.0} ms; pointer chains: {}\n",
        naming.modules, naming.elapsed_ms, naming.pointer_chains
    );
    if !naming.stripped.is_empty() {
        out.push_str(&stripped(naming));
    }
    if let Some(found) = report
        .coverage
        .as_ref()
        .and_then(|c| c.found_by_code.as_ref())
    {
        let _ = writeln!(
            out,
            "lock functions of {} (no symbol table) found by their code, matched once each against {}: {}",
            found.module,
            found.archive,
            found.functions.join(", ")
        );
    }
    out.push_str(&contention_by_type(report));
    for skipped in &naming.skipped_files {
        let _ = writeln!(
            out,
            "not read: {}: {}; {}",
            skipped.file,
            skipped.reason.describe(),
            skipped.detail
        );
    }
    out
}

/// One line for every stripped module that left a lock, caller or frame
/// unnamed: why (no symbol table or DWARF, no debug file where it was looked
/// for) and what would name them. Said once, not at each frame.
fn stripped(naming: &Naming) -> String {
    let why: Vec<String> = naming
        .stripped
        .iter()
        .map(|module| {
            let lookup = naming.stripped_lookups.iter().find(|l| &l.module == module);
            let mut tried = Vec::new();
            if let Some(id) = lookup
                .and_then(|l| l.build_id.as_deref())
                .filter(|id| id.len() > 2)
            {
                tried.push(format!(
                    "no /usr/lib/debug/.build-id/{}/{}.debug",
                    &id[..2],
                    &id[2..]
                ));
            }
            if let Some(link) = lookup.and_then(|l| l.debug_link.as_deref()) {
                tried.push(format!("no {link} (its debuglink)"));
            }
            if lookup.is_some_and(|l| !l.debuginfod) {
                tried.push("DEBUGINFOD_URLS not set".to_string());
            }
            match tried.is_empty() {
                true => module.clone(),
                false => format!("{module} ({})", tried.join(", ")),
            }
        })
        .collect();
    format!(
        "unnamed frames: stripped, exported symbols only: {}; their own functions show as module+offset: to name them trace the -debug build, install the -debuginfo/-dbgsym package, or set DEBUGINFOD_URLS to a debuginfod server\n",
        why.join("; ")
    )
}

/// What the rows grouped by creation site stand for (empty without any).
pub(crate) fn grouped_by_site(report: &Report) -> String {
    let groups: Vec<_> = report
        .locks
        .iter()
        .filter_map(|l| l.group.as_ref())
        .collect();
    if groups.is_empty() {
        return String::new();
    }
    let objects: u64 = groups.iter().map(|g| g.objects).sum();
    let addresses: u64 = groups.iter().map(|g| g.addresses).sum();
    let rows = match groups.len() {
        1 => "1 row named by its creation site stands".to_string(),
        n => format!("{n} rows named by their creation site stand"),
    };
    format!(
        "grouped: {rows} for {objects} objects at {addresses} addresses (--group-by address: a row per address)\n"
    )
}

/// The rows that count as contention only because of their declared type
/// (from DWARF, or locktrace's table for a stripped CPython's GIL).
fn contention_by_type(report: &Report) -> String {
    const SHOWN: usize = 3;
    let rows: Vec<String> = report
        .locks
        .iter()
        .filter_map(|lock| {
            let declared = lock.declared.as_ref()?;
            let why = match declared.contention? {
                DeclaredContention::FutexLock => "a futex lock".to_string(),
                DeclaredContention::CondvarOfLock => format!(
                    "waiting for the lock in {}",
                    declared.inside.as_deref().unwrap_or("?")
                ),
            };
            let name = lock.name.as_deref().unwrap_or("-");
            let from = match declared.layout {
                LayoutSource::Dwarf => "",
                LayoutSource::Table => " by locktrace's table",
            };
            Some(format!("{name} ({}{from}: {why})", declared.type_name))
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let more = match rows.len().saturating_sub(SHOWN) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let shown = rows[..rows.len().min(SHOWN)].join(", ");
    format!("contention by declared type: {shown}{more}\n")
}

/// Footer lines about placement, estimates and cost (empty when there is nothing to say).
pub(crate) fn cost(report: &Report) -> String {
    let mut out = String::new();
    let failed: u64 = report
        .locks
        .iter()
        .filter_map(|lock| lock.failed_tries)
        .sum();
    if failed > 0 {
        let _ = writeln!(
            out,
            "failed tries: {failed} calls returned without the lock (busy trylocks, timed-out locks); not counted as acquisitions"
        );
    }
    for fallback in &report.placement_fallbacks {
        let _ = writeln!(
            out,
            "placement: auto fell back to the entry of {} in {}: {}",
            fallback.function, fallback.module, fallback.reason
        );
    }
    if let Some(estimate) = &report.estimate {
        out.push_str(&estimate_lines(estimate));
    }
    if report.mode == Mode::Contention {
        out.push_str("contention mode: lock functions not probed; acquisitions unknown (-), contention exact\n");
    }
    if let Some(overhead) = &report.overhead {
        let _ = writeln!(
            out,
            "overhead: {} probe hits{} on {} cheap + {} single-stepped points{}{}{} ≈ {} added to the target; attach {} ms; tracer CPU {:.2} s, peak RSS {:.1} MiB",
            overhead.probe_hits,
            if overhead.unlock_probe_hits > 0 {
                format!(
                    " + {} unlock probe hits (--hold-times; its hold bookkeeping, ~25 % more, is not in the estimate)",
                    overhead.unlock_probe_hits
                )
            } else {
                String::new()
            },
            overhead.emulated_points,
            overhead.stepped_points,
            if overhead.request_probe_hits > 0 {
                format!(", {} request probe hits", overhead.request_probe_hits)
            } else {
                String::new()
            },
            if overhead.cond_wait_probe_hits > 0 {
                format!(", {} condvar probe hits", overhead.cond_wait_probe_hits)
            } else {
                String::new()
            },
            if overhead.init_probe_hits > 0 {
                format!(", {} lock init probe hits", overhead.init_probe_hits)
            } else {
                String::new()
            },
            duration(overhead.estimated_added_ns),
            overhead.attach_ms,
            overhead.tracer_cpu_s,
            overhead.tracer_peak_rss_kib as f64 / 1024.0
        );
    }
    out
}

/// What a sampled run's estimates rest on, and how far they can be off.
fn estimate_lines(estimate: &Estimate) -> String {
    if !estimate.has_windows() {
        return format!(
            "sampled: no sampling window opened in the {:.2} s recorded: acquisitions not estimated (-); record longer than --sample-period, or use --mode all\n",
            estimate.total_s
        );
    }
    let basis = match estimate.scaled_by {
        ScaleBasis::Time => "",
        ScaleBasis::Requests => {
            " by the requests (all counted; calls per request from the windows)"
        }
    };
    let mut out = format!(
        "sampled: acquisitions are ESTIMATES (~), counted {:.2} s of {:.2} s in {} windows, scaled ×{:.2}{basis}, total within ±{:.1}%",
        estimate.counted_s,
        estimate.total_s,
        estimate.windows,
        estimate.scale,
        estimate.relative_error * 100.0
    );
    if let Some(per_request) = estimate.per_request_relative_error {
        let _ = write!(
            out,
            "; per request within ±{:.1}% (locks and requests counted in the same windows)",
            per_request * 100.0
        );
    }
    out.push('\n');
    if estimate.windows_kept_attached > 0 {
        let _ = writeln!(
            out,
            "sampled: detaching the probes took longer than the gap between windows (a loaded machine), so they stayed attached, not counting, after {} of {} windows: calls there cost their probe hit",
            estimate.windows_kept_attached, estimate.windows
        );
    }
    if let Some(reason) = &estimate.window_attach_failure {
        let _ = writeln!(
            out,
            "sampled: {} windows skipped (the estimate rests on the {} that counted): {reason}",
            estimate.windows_not_attached, estimate.windows
        );
    }
    if let Some(reason) = &estimate.window_links_fallback {
        let _ = writeln!(
            out,
            "sampled: windows used a perf-event uprobe per probe point (slower to close, so fewer windows) because the kernel refused a uprobe-multi link: {reason}"
        );
    }
    // Scaled by requests, the slowdown cancels (see `ScaleBasis::Requests`).
    if estimate.probe_time_share > 0.25 && estimate.scaled_by == ScaleBasis::Time {
        let _ = writeln!(
            out,
            "sampled: the probes took ~{:.0}% of a thread's counted time: a CPU-bound target runs slower while counted, so the totals' bound includes up to {:.0}% more (a paced server is not slowed); per-request figures are not affected",
            (estimate.probe_time_share * 100.0).min(100.0),
            (estimate.probe_time_share / (1.0 - estimate.probe_time_share).max(0.01) * 100.0)
                .min(10_000.0)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stripped libphp with a build-id and a debuglink, nothing found:
    /// one line says why and what would name its frames.
    #[test]
    fn a_stripped_module_is_said_once_with_what_would_name_it() {
        let naming: Naming = serde_json::from_value(serde_json::json!({
            "elapsed_ms": 1.0, "modules": 2, "debug_files": [],
            "pointer_chains": "no_heap_locks",
            "stripped": ["/srv/libphp.so", "/srv/app"],
            "stripped_lookups": [
                {"module": "/srv/libphp.so", "build_id": "ab12cd", "debug_link": "libphp.so.debug",
                 "debuginfod": false},
                {"module": "/srv/app", "debuginfod": true},
            ],
        }))
        .unwrap();
        assert_eq!(
            stripped(&naming),
            "unnamed frames: stripped, exported symbols only: /srv/libphp.so (no \
             /usr/lib/debug/.build-id/ab/12cd.debug, no libphp.so.debug (its debuglink), \
             DEBUGINFOD_URLS not set); /srv/app; their own functions show as module+offset: to \
             name them trace the -debug build, install the -debuginfo/-dbgsym package, or set \
             DEBUGINFOD_URLS to a debuginfod server\n"
        );
    }

    /// The kernel refused the uprobe-multi link: the footer says so, with
    /// the kernel's reason, and what it cost (slower windows).
    #[test]
    fn a_refused_uprobe_multi_link_is_said_with_its_reason() {
        let reason = "a uprobe-multi link on 5 points in /usr/lib/x86_64-linux-gnu/libc.so.6 failed: Invalid argument (os error 22)";
        let estimate: Estimate = serde_json::from_value(serde_json::json!({
            "estimated": ["locks[].acquisitions"],
            "sample_rate": 0.1,
            "sample_period_s": 5.0,
            "windows": 6,
            "counted_s": 3.0,
            "total_s": 30.0,
            "scale": 10.0,
            "unsampled_edges_s": 1.0,
            "relative_error": 0.5,
            "probe_time_share": 0.0,
            "window_links": "perf_event",
            "window_links_fallback": reason,
        }))
        .unwrap();
        let text = estimate_lines(&estimate);
        let expected = format!(
            "sampled: windows used a perf-event uprobe per probe point (slower to close, so fewer windows) because the kernel refused a uprobe-multi link: {reason}"
        );
        assert_eq!(
            text.lines().filter(|line| *line == expected).count(),
            1,
            "{text}"
        );
        // Without a refusal, no such line.
        let mut plain = estimate.clone();
        plain.window_links_fallback = None;
        plain.window_links = Some(crate::model::WindowLinkKind::UprobeMulti);
        assert!(!estimate_lines(&plain).contains("refused"));
    }
}
