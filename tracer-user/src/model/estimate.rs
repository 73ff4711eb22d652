//! What a sampled recording's report says about its estimates.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the JSON report says about a sampled run (`estimate`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Estimate {
    /// Which numbers are estimates: lock acquisitions and calls.
    pub estimated: Vec<String>,
    pub sample_rate: f64,
    /// One window per this many seconds (`--sample-period`, else the
    /// mechanism's default). Null in reports from before 2026-12.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_period_s: Option<f64>,
    pub windows: u32,
    /// Time the lock probes counted, and the whole recording.
    pub counted_s: f64,
    pub total_s: f64,
    /// Counts were multiplied by this (total_s / counted_s).
    pub scale: f64,
    /// Time before the first and after the last window: no rate was seen
    /// there, the estimate assumes the mean one.
    pub unsampled_edges_s: f64,
    /// Relative error bound of the total: 3 standard errors of the per-window
    /// rates and of the counts, plus the edges' share of the time (their rate
    /// could be anywhere from 0 to twice the mean). Each lock's
    /// `acquisitions_error` adds its own counting noise.
    pub relative_error: f64,
    /// Share of the counted windows' time the probe hits cost (hits × cost
    /// per hit / window time, for one thread). When large, the target ran
    /// slower while counted (a CPU-bound loop, not a paced server), so the
    /// estimate is low by up to that share, beyond `relative_error`.
    pub probe_time_share: f64,
    /// Relative error bound of the per-request figures (`--request-probe`):
    /// lock calls and requests are counted over the same windows, so their
    /// ratio needs no scaling and its bound is its own (a ratio estimator:
    /// 3 standard errors of the per-window residuals, and the counting noise
    /// of the requests), not that of the totals. Null without requests in
    /// the windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_request_relative_error: Option<f64>,
    /// Windows after which the lock probes stayed attached, not counting,
    /// because detaching them took longer than the gap to the next window
    /// (a loaded machine): calls between those windows cost their probe hit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub windows_kept_attached: u32,
    /// Windows skipped because the kernel refused to attach their probes
    /// (the estimate rests on the windows that counted), and its last reason.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub windows_not_attached: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_attach_failure: Option<String>,
    /// How the windows' probes went in and out: `uprobe_multi` (one link
    /// per module, one grace-period wait to detach them all) or
    /// `perf_event` (a uprobe per point). Null in reports from before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_links: Option<WindowLinkKind>,
    /// Why uprobe-multi links were not used, when the kernel refused them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_links_fallback: Option<String>,
    /// What the windows' counts were scaled by (`scale`). Reports from
    /// before 2026-12-02 were all scaled by time.
    #[serde(default)]
    pub scaled_by: ScaleBasis,
}

/// What a sampled run's counts are scaled by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScaleBasis {
    /// The recording's time over the windows' counting time. The bound
    /// covers the unsampled edges and the probes' slowdown.
    #[default]
    Time,
    /// The requests of the whole recording (the request probe stays in all
    /// along) over those counted in the windows: a ratio estimate, exact in
    /// its requests, whose bound is the per-request figures' (the probes'
    /// slowdown and the edges cancel).
    Requests,
}

/// The kernel mechanism that opened and closed the sampling windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WindowLinkKind {
    /// `BPF_LINK_CREATE` with `BPF_TRACE_UPROBE_MULTI`.
    UprobeMulti,
    /// A `perf_event_open` uprobe per probe point.
    #[default]
    PerfEvent,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Estimate {
    /// No window counted anything (the recording ended before the first
    /// window opened): there is no estimate, not an estimate of 0.
    pub(crate) fn has_windows(&self) -> bool {
        self.windows > 0 && self.counted_s > 0.0
    }
}
