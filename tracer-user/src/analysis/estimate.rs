//! Sampled mode's arithmetic: from the counting windows to the scale factor
//! and an error bound, and the scaling of the counts.
use std::time::Duration;

use crate::model::{
    Collected, CountingWindow, Estimate, PerRequest, Report, SampledRun, ScaleBasis,
};

/// The estimate of a sampled run. `probe_time_share` says how much of the
/// counted time the probe hits cost one thread: when large, a CPU-bound
/// target ran slower while counted and the estimate is low.
/// `cost_per_hit` is the lock probes' cost per hit, weighted by where the
/// hits were ([`super::cost::lock_cost_per_hit`]).
pub(crate) fn of_run(run: &SampledRun, rate: f64, cost_per_hit: u64) -> Estimate {
    let mut estimate = estimate(&run.windows, run.total, rate);
    estimate.windows_kept_attached = run.windows_kept_attached;
    estimate.windows_not_attached = run.windows_not_attached;
    estimate.window_attach_failure = run.window_attach_failure.clone();
    estimate.window_links = Some(run.window_links);
    estimate.sample_period_s = Some(run.period.as_secs_f64());
    estimate.window_links_fallback = run.window_links_fallback.clone();
    let hits: u64 = run.windows.iter().map(|w| w.calls).sum();
    estimate.probe_time_share =
        hits as f64 * cost_per_hit as f64 / (estimate.counted_s * 1e9).max(1.0);
    estimate.relative_error = widened(estimate.relative_error, estimate.probe_time_share);
    estimate
}

/// Scales by requests instead of time when the request probe counted
/// requests over the whole recording and in the windows: total calls =
/// calls per request (windows) × requests (whole recording), the ratio
/// estimator of survey sampling. The request count is then exact, totals
/// and per-request figures agree, and the probes' slowdown and the
/// unsampled edges cancel (a server slowed by its probes serves fewer
/// requests while counted, not fewer calls per request); the time scale
/// has to allow for both, which on a lock-heavy server means a bound of
/// hundreds of percent. Always so when requests were counted, even where
/// the time bound would be tighter (a paced loop), so that a report with
/// a request probe is read one way.
pub(crate) fn scale_by_requests(estimate: &mut Estimate, in_windows: u64, whole_recording: u64) {
    let Some(ratio_error) = estimate.per_request_relative_error else {
        return;
    };
    if in_windows == 0 || whole_recording < in_windows {
        return;
    }
    estimate.scale = whole_recording as f64 / in_windows as f64;
    estimate.relative_error = ratio_error;
    estimate.scaled_by = ScaleBasis::Requests;
    // The request count is the probe's own, not scaled.
    estimate.estimated.retain(|what| what != ESTIMATED_REQUESTS);
}

/// The `estimated` entry for a request count scaled by time (not there when
/// the request probe's own count is used).
const ESTIMATED_REQUESTS: &str = "requests (counted over the same windows)";

/// Largest relative error a report states (×100): beyond it the estimate says nothing.
pub(crate) const MAX_RELATIVE_ERROR: f64 = 100.0;

/// The error bound with the probes' slowdown in it. A CPU-bound target
/// that spent share `s` of its counted time in probes ran `1 - s` as fast
/// while counted, so the truth may be up to `1 / (1 - s)` times the
/// estimate: the bound grows by `s / (1 - s)` (a paced server does not slow
/// down, but the tracer cannot tell which it traced).
fn widened(statistical: f64, probe_time_share: f64) -> f64 {
    let share = probe_time_share.clamp(0.0, 1.0);
    let slowdown = if share < 1.0 {
        share / (1.0 - share)
    } else {
        MAX_RELATIVE_ERROR
    };
    (statistical + slowdown).min(MAX_RELATIVE_ERROR)
}

fn estimate(windows: &[CountingWindow], total: Duration, rate: f64) -> Estimate {
    let counted: f64 = windows.iter().map(|w| w.counted.as_secs_f64()).sum();
    let total_s = total.as_secs_f64();
    let edges = match (windows.first(), windows.last()) {
        (Some(first), Some(last)) => {
            (first.start + total.saturating_sub(last.start + last.counted)).as_secs_f64()
        }
        _ => total_s,
    };
    let scale = if counted > 0.0 {
        total_s / counted
    } else {
        0.0
    };
    Estimate {
        estimated: vec![
            "locks[].acquisitions".into(),
            "locks[].calls".into(),
            "totals.acquisitions".into(),
            ESTIMATED_REQUESTS.into(),
        ],
        sample_rate: rate,
        sample_period_s: None,
        windows: windows.len() as u32,
        counted_s: counted,
        total_s,
        scale,
        unsampled_edges_s: edges,
        probe_time_share: 0.0,
        relative_error: (relative_error(windows, counted, total_s) + edges / total_s.max(1e-9))
            .min(1.0),
        per_request_relative_error: ratio_relative_error(windows, counted, total_s),
        windows_kept_attached: 0,
        windows_not_attached: 0,
        window_attach_failure: None,
        window_links: None,
        window_links_fallback: None,
        scaled_by: ScaleBasis::Time,
    }
}

/// The bound of calls per request, R = Σcalls / Σrequests over the windows
/// (a ratio estimator: the scale cancels, and so do the edges and a
/// slowdown that hits calls and requests alike). 3 standard errors by the
/// delta method, sqrt((1 - f) Σ(calls_i - R requests_i)² / (n (n - 1))) /
/// mean requests, with the finite population correction. With fewer than
/// [`MIN_WINDOWS_FOR_SPREAD`] windows their spread says too little, so the
/// bound is then never better than the requests' counting noise
/// (3/sqrt(requests)); with more, the spread already holds every way the
/// windows' ratios differ, edges included, and that floor would only hide
/// the windows the uprobe-multi links added (±7.6 % against ±1.7 % on the
/// real FrankenPHP in 30 s). None without requests, 1.0 (±100 %) with
/// fewer than 2 windows.
fn ratio_relative_error(windows: &[CountingWindow], counted: f64, total: f64) -> Option<f64> {
    let requests: u64 = windows.iter().map(|w| w.requests).sum();
    let calls: u64 = windows.iter().map(|w| w.calls).sum();
    if requests == 0 {
        return None;
    }
    let n = windows.len() as f64;
    if windows.len() < 2 || calls == 0 {
        return Some(1.0);
    }
    let ratio = calls as f64 / requests as f64;
    let squares: f64 = windows
        .iter()
        .map(|w| (w.calls as f64 - ratio * w.requests as f64).powi(2))
        .sum();
    let coverage = (counted / total).clamp(0.0, 1.0);
    let mean_requests = requests as f64 / n;
    let standard_error = ((1.0 - coverage) * squares / (n * (n - 1.0))).sqrt() / mean_requests;
    let spread_term = 3.0 * standard_error / ratio;
    let bound = if windows.len() < MIN_WINDOWS_FOR_SPREAD {
        spread_term.hypot(3.0 / (requests as f64).sqrt())
    } else {
        spread_term
    };
    Some(bound.min(1.0))
}

/// Windows needed before the per-request bound rests on their spread alone.
const MIN_WINDOWS_FOR_SPREAD: usize = 10;

/// Puts the bounds into a built report with its per-request figures: each
/// lock's `acquisitions_error`, and the per-request figures' own bound. A
/// run in which no window opened estimates nothing: its acquisitions are
/// null (not counted), never `~0`.
pub(crate) fn bound(report: &mut Report) {
    let Some(estimate) = report.estimate.clone() else {
        return;
    };
    if !estimate.has_windows() {
        for lock in &mut report.locks {
            lock.acquisitions = None;
            lock.acquisitions_error = None;
            if let Some(per) = &mut lock.per_request {
                per.acquisitions = None;
            }
        }
        report.totals.acquisitions = None;
        if let Some(per) = &mut report.totals.per_request {
            per.acquisitions = None;
        }
        return;
    }
    let counted = |n: u64| (n as f64 / estimate.scale).round() as u64;
    for lock in &mut report.locks {
        let Some(acquisitions) = lock.acquisitions else {
            continue;
        };
        lock.acquisitions_error = Some(lock_error(&estimate, counted(acquisitions)));
        per_request_error(&estimate, lock.per_request.as_mut(), counted(acquisitions));
    }
    if let Some(acquisitions) = report.totals.acquisitions {
        per_request_error(
            &estimate,
            report.totals.per_request.as_mut(),
            counted(acquisitions),
        );
    }
}

/// The bound of one per-request figure: the ratio's, with the counting
/// noise of the figure's own calls.
fn per_request_error(estimate: &Estimate, per: Option<&mut PerRequest>, counted_calls: u64) {
    let (Some(per), Some(ratio_error)) = (per, estimate.per_request_relative_error) else {
        return;
    };
    let Some(value) = per.acquisitions else {
        return;
    };
    let relative = ratio_error
        .hypot(3.0 / (counted_calls.max(1) as f64).sqrt())
        .min(MAX_RELATIVE_ERROR);
    per.acquisitions_error = Some(value * relative);
}

/// 3 standard errors of the mean per-window rate, relative, with the finite
/// population correction; 1.0 (no better than ±100 %) with fewer than 2 windows.
fn relative_error(windows: &[CountingWindow], counted: f64, total: f64) -> f64 {
    let rates: Vec<f64> = windows
        .iter()
        .filter(|w| !w.counted.is_zero())
        .map(|w| w.calls as f64 / w.counted.as_secs_f64())
        .collect();
    let n = rates.len() as f64;
    let calls: u64 = windows.iter().map(|w| w.calls).sum();
    if rates.len() < 2 || calls == 0 {
        return 1.0;
    }
    let mean = calls as f64 / counted;
    let variance = rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let coverage = (counted / total).clamp(0.0, 1.0);
    let window_term = 3.0 * variance.sqrt() / mean / n.sqrt() * (1.0 - coverage).sqrt();
    // Never claim better than the counting noise of the total.
    let counting_term = 3.0 / (calls as f64).sqrt();
    window_term.hypot(counting_term).min(1.0)
}

/// Per-lock absolute error bound for a scaled count `calls_counted`.
pub(crate) fn lock_error(estimate: &Estimate, counted_calls: u64) -> u64 {
    let relative = estimate
        .relative_error
        .hypot(3.0 / (counted_calls.max(1) as f64).sqrt())
        .min(MAX_RELATIVE_ERROR);
    (counted_calls as f64 * estimate.scale * relative).ceil() as u64
}

/// Scales the counted lock calls (and callers) of a sampled run to the whole recording.
pub(crate) fn scale(collected: &mut Collected, estimate: &Estimate) {
    let scaled = |n: u64| (n as f64 * estimate.scale).round() as u64;
    for counts in collected.locks.values_mut() {
        for calls in &mut counts.calls {
            *calls = scaled(*calls);
        }
    }
    for count in collected.callers.values_mut() {
        *count = scaled(*count);
    }
    // Moves between CPUs are counted at the acquisitions: scaled alike.
    for counts in collected.handoffs.values_mut() {
        for count in &mut counts.counts {
            *count = scaled(*count);
        }
    }
    collected.requests = match estimate.scaled_by {
        ScaleBasis::Time => scaled(collected.requests),
        ScaleBasis::Requests => collected.requests_whole_recording,
    };
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The run `trace::sampled::cycle`'s fake gives for a steady target (1 M
    /// lock calls and 1000 requests a second, 3.8 s: four 80 ms windows),
    /// scaled back to what the target made.
    #[test]
    fn four_cycle_windows_scale_back_to_the_truth() {
        use crate::model::{Collected, ScaleBasis};
        use tracer_common::LockCounts;
        let run = SampledRun {
            windows: [20, 1470, 2470, 3470]
                .map(|start| CountingWindow {
                    start: Duration::from_millis(start),
                    counted: Duration::from_millis(80),
                    calls: 80_000,
                    requests: 80,
                })
                .to_vec(),
            total: Duration::from_millis(3800),
            period: Duration::from_millis(1000),
            ..SampledRun::default()
        };
        let mut estimate = of_run(&run, 0.1, 0);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert_eq!(estimate.windows, 4);
        assert_eq!(estimate.sample_period_s, Some(1.0));
        assert!(close(estimate.counted_s, 0.32), "{}", estimate.counted_s);
        assert!(close(estimate.total_s, 3.8));
        assert!(close(estimate.scale, 3.8 / 0.32), "{}", estimate.scale);
        // 20 ms before the first window, 250 ms after the last.
        assert!(close(estimate.unsampled_edges_s, 0.27));
        // Equal windows: only the counting noise and the edges.
        let bound = 3.0 / 320_000f64.sqrt() + 0.27 / 3.8;
        assert!(
            close(estimate.relative_error, bound),
            "{}",
            estimate.relative_error
        );
        let ratio_bound = estimate.per_request_relative_error.unwrap();
        assert!(close(ratio_bound, 3.0 / 320f64.sqrt()), "{ratio_bound}");

        // Scaled by time: 320,000 calls counted, 3.8 M made.
        let mut collected = Collected {
            requests: 320,
            requests_whole_recording: 3800,
            ..Collected::default()
        };
        let calls = |collected: &Collected| collected.locks[&0x1000].calls[0];
        let mut lock = LockCounts::default();
        lock.calls[0] = 320_000;
        collected.locks.insert(0x1000, lock);
        let mut by_time = collected.clone();
        scale(&mut by_time, &estimate);
        assert_eq!((calls(&by_time), by_time.requests), (3_800_000, 3800));

        // Scaled by requests (the request probe's): the same, the bound the ratio's.
        scale_by_requests(&mut estimate, 320, 3800);
        assert_eq!(estimate.scaled_by, ScaleBasis::Requests);
        assert!(close(estimate.relative_error, ratio_bound));
        scale(&mut collected, &estimate);
        assert_eq!((calls(&collected), collected.requests), (3_800_000, 3800));
    }

    /// Ten 100 ms windows, one a second, ~1 M calls/s each.
    fn steady_windows() -> Vec<CountingWindow> {
        (0..10)
            .map(|i| CountingWindow {
                start: Duration::from_millis(i * 1000),
                counted: Duration::from_millis(100),
                calls: 100_000 + i * 100,
                requests: 0,
            })
            .collect()
    }

    /// A run of `windows` over 9.1 s.
    fn run_of(windows: Vec<CountingWindow>) -> SampledRun {
        SampledRun {
            windows,
            total: Duration::from_millis(9100),
            ..SampledRun::default()
        }
    }

    #[test]
    fn steady_windows_give_a_tight_bound() {
        let windows = steady_windows();
        let estimate = estimate(&windows, Duration::from_millis(9100), 0.1);
        assert!((estimate.scale - 9.1).abs() < 1e-9);
        assert!(
            estimate.relative_error < 0.01,
            "{}",
            estimate.relative_error
        );
        assert_eq!(estimate.windows, 10);
    }

    #[test]
    fn probes_that_slowed_the_target_widen_the_bound() {
        let run = run_of(steady_windows());
        // ~1,004,500 hits × 990 ns in 1 s counted: the probes took ~99% of it,
        // so a CPU-bound target ran at ~1% speed and the truth may be ~100×.
        let estimate = of_run(&run, 0.1, 990);
        assert!(estimate.probe_time_share > 0.99, "{estimate:?}");
        assert!(estimate.relative_error >= 99.0, "{estimate:?}");
        // A share of zero leaves the statistical bound alone.
        assert_eq!(widened(0.01, 0.0), 0.01);
        assert!((widened(0.0, 0.5) - 1.0).abs() < 1e-12);
    }

    /// The same slowed run with a request probe counting all along: 1000
    /// requests in the windows (100 calls each), 20,000 in the recording.
    /// Totals come out as 100 calls × 20,000 requests, with the ratio's bound
    /// instead of the slowdown's; the request count is the probe's own.
    #[test]
    fn a_request_count_of_the_whole_recording_scales_the_windows() {
        let windows: Vec<CountingWindow> = steady_windows()
            .into_iter()
            .map(|window| CountingWindow {
                requests: window.calls / 100,
                ..window
            })
            .collect();
        let run = run_of(windows);
        let mut estimate = of_run(&run, 0.1, 990);
        assert!(estimate.relative_error >= 99.0, "{estimate:?}");
        let in_windows = run.windows.iter().map(|w| w.requests).sum::<u64>();
        scale_by_requests(&mut estimate, in_windows, 20_000);
        assert_eq!(estimate.scaled_by, ScaleBasis::Requests);
        assert!((estimate.scale - 20_000.0 / in_windows as f64).abs() < 1e-9);
        assert_eq!(
            Some(estimate.relative_error),
            estimate.per_request_relative_error
        );
        assert!(estimate.relative_error < 0.01, "{estimate:?}");
        assert!(
            !estimate
                .estimated
                .iter()
                .any(|what| what == ESTIMATED_REQUESTS)
        );
        let mut collected = Collected {
            requests: in_windows,
            requests_whole_recording: 20_000,
            ..Collected::default()
        };
        collected.callers.insert(
            tracer_common::CallerKey::default(),
            run.windows.iter().map(|w| w.calls).sum(),
        );
        scale(&mut collected, &estimate);
        assert_eq!(collected.requests, 20_000);
        let calls = collected.callers.values().sum::<u64>();
        assert!(calls.abs_diff(2_000_000) < 2_000_000 / 100, "{calls}");
    }

    /// No requests in the windows: the time scale stays.
    #[test]
    fn without_requests_in_the_windows_time_scales() {
        let mut estimate = of_run(&run_of(steady_windows()), 0.1, 1);
        scale_by_requests(&mut estimate, 0, 500);
        assert_eq!(estimate.scaled_by, ScaleBasis::Time);
        assert!((estimate.scale - 9.1).abs() < 1e-9);
    }

    /// 30 windows of ~100 requests each taking 408 locks, a window edge
    /// splitting a request now and then: with 10 windows or more the bound
    /// rests on their spread, below the 3/sqrt(3000) = 5.5 % counting floor
    /// that fewer windows keep, and the true 408 stays inside it.
    #[test]
    fn many_windows_bound_the_ratio_by_their_spread() {
        let windows = |count: u64| -> Vec<CountingWindow> {
            (0..count)
                .map(|i| {
                    let requests = 90 + (i * 7) % 21;
                    let edge = [0, 408, 0, 204, 0][(i % 5) as usize];
                    CountingWindow {
                        start: Duration::from_secs(i),
                        counted: Duration::from_millis(100),
                        calls: requests * 408 + edge - if i % 4 == 0 { 300 } else { 0 },
                        requests,
                    }
                })
                .collect()
        };
        let many = windows(30);
        let bound = estimate(&many, Duration::from_secs(30), 0.1)
            .per_request_relative_error
            .unwrap();
        let requests: u64 = many.iter().map(|w| w.requests).sum();
        let calls: u64 = many.iter().map(|w| w.calls).sum();
        let ratio = calls as f64 / requests as f64;
        assert!(bound < 3.0 / (requests as f64).sqrt(), "{bound}");
        assert!((ratio - 408.0).abs() <= bound * ratio, "{ratio} ±{bound}");
        let few = windows(9);
        let few_requests: u64 = few.iter().map(|w| w.requests).sum();
        let few_bound = estimate(&few, Duration::from_secs(30), 0.1)
            .per_request_relative_error
            .unwrap();
        assert!(
            few_bound >= 3.0 / (few_requests as f64).sqrt(),
            "{few_bound}"
        );
    }

    #[test]
    fn one_window_claims_nothing() {
        let windows = [CountingWindow {
            start: Duration::ZERO,
            counted: Duration::from_millis(100),
            calls: 5,
            requests: 0,
        }];
        assert_eq!(
            estimate(&windows, Duration::from_secs(1), 0.1).relative_error,
            1.0
        );
    }

    /// FrankenPHP-like: the request rate swings 4x between windows (so the
    /// totals are uncertain), but every request takes the lock ~410 times
    /// (a window edge splits one request). The ratio keeps a tight bound.
    #[test]
    fn per_request_figures_get_their_own_ratio_bound() {
        let windows: Vec<CountingWindow> = (0..14)
            .map(|i| {
                let requests = if i % 2 == 0 { 200 } else { 800 };
                CountingWindow {
                    start: Duration::from_secs(i * 5),
                    counted: Duration::from_millis(500),
                    calls: requests * 410 + (i % 3) * 200,
                    requests,
                }
            })
            .collect();
        let estimate = estimate(&windows, Duration::from_secs(70), 0.1);
        assert!(estimate.relative_error > 0.5, "{estimate:?}");
        let ratio = estimate.per_request_relative_error.unwrap();
        assert!(ratio < 0.05, "{estimate:?}");
        // No requests in the windows: no per-request bound.
        let silent: Vec<CountingWindow> = windows
            .iter()
            .map(|w| CountingWindow { requests: 0, ..*w })
            .collect();
        assert_eq!(estimate_of(&silent).per_request_relative_error, None);
    }

    fn estimate_of(windows: &[CountingWindow]) -> Estimate {
        estimate(windows, Duration::from_secs(70), 0.1)
    }

    /// A sampled report through `bound`: `windows` windows counting
    /// `counted_s` in all of 10 s, `acquisitions` and `requests` scaled.
    pub(crate) fn sampled_report(
        windows: u32,
        counted_s: f64,
        acquisitions: u64,
        requests: u64,
    ) -> Report {
        let mut report: Report = serde_json::from_value(serde_json::json!({
            "schema": crate::model::SCHEMA,
            "target": {"pid": 1, "exe": "/x", "cmdline": []},
            "duration_s": 0.3, "mode": "sampled", "stopped_by": "target_exited",
            "locks": [{
                "address": "0x1000", "kind": "mutex", "acquisitions": acquisitions,
                "contended": 0, "wakes": 0, "wait_ns": 0, "max_wait_ns": 0, "name": "g_lock",
            }],
            "dropped": {},
            "totals": {"acquisitions": acquisitions, "contended": 0, "wakes": 0, "wait_ns": 0},
        }))
        .unwrap();
        let windows: Vec<CountingWindow> = (0..windows)
            .map(|i| CountingWindow {
                start: Duration::from_secs(u64::from(i)),
                counted: Duration::from_secs_f64(counted_s / 10.0),
                calls: acquisitions / 100,
                requests: requests / 100,
            })
            .collect();
        report.estimate = Some(estimate(&windows, Duration::from_secs(10), 0.1));
        if requests > 0 {
            crate::analysis::per_request::apply(
                &mut report,
                crate::model::Requests {
                    source: crate::model::RequestSource::Probe,
                    count: requests,
                    ..Default::default()
                },
            );
        }
        bound(&mut report);
        report
    }

    #[test]
    fn a_run_without_a_window_estimates_nothing() {
        let report = sampled_report(0, 0.0, 0, 0);
        assert_eq!(report.locks[0].acquisitions, None);
        assert_eq!(report.locks[0].acquisitions_error, None);
        assert_eq!(report.totals.acquisitions, None);
    }

    #[test]
    fn per_request_figures_carry_their_bound() {
        let report = sampled_report(10, 1.0, 4_100_000, 10_000);
        let per = report.locks[0].per_request.as_ref().unwrap();
        assert_eq!(per.acquisitions, Some(410.0));
        let error = per.acquisitions_error.unwrap();
        assert!(error > 0.0 && error < 410.0 * 0.5, "{error}");
    }
}
