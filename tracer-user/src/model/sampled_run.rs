//! What a `--mode sampled` recording measured (`trace::sampled` runs it,
//! `analysis::estimate` scales the counts up from it).
use std::time::Duration;

use super::WindowLinkKind;

/// One counting window: when it began, how long it counted, the lock calls
/// and the requests (`--request-probe`) in it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CountingWindow {
    /// When counting began, from the start of the recording.
    pub start: Duration,
    pub counted: Duration,
    pub calls: u64,
    pub requests: u64,
}

/// What a sampled run measured: its windows and its whole length.
#[derive(Debug, Clone, Default)]
pub(crate) struct SampledRun {
    pub windows: Vec<CountingWindow>,
    pub total: Duration,
    /// Windows after which the probes stayed attached (not counting),
    /// because detaching took longer than the gap to the next window.
    pub windows_kept_attached: u32,
    /// Windows skipped because the kernel refused to attach their probes,
    /// and the last refusal.
    pub windows_not_attached: u32,
    pub window_attach_failure: Option<String>,
    /// One window per this long.
    pub period: Duration,
    /// How the windows' probes were attached and detached.
    pub window_links: WindowLinkKind,
    /// Why uprobe-multi links were not used, when the kernel refused them.
    pub window_links_fallback: Option<String>,
}
