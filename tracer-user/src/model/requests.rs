//! The request count of a recording (from the load driver, the
//! request-boundary probe, or the user) and figures divided by it.
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{RequestSource, ServerKind};

/// The `requests` block of a report.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Requests {
    /// Where `count` comes from; with `probe`, the function is in `probe`.
    pub source: RequestSource,
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
    /// How the request probe was chosen when no function was named
    /// (`--request-probe auto`, or no request flag on a recognised server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_probe: Option<AutoProbe>,
    /// Why per-request figures are absent although requests were counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl Requests {
    /// The count figures are divided by for per-request figures, unless
    /// refused or zero.
    pub(crate) fn divisor(&self) -> Option<f64> {
        (self.refused.is_none() && self.count > 0).then_some(self.count as f64)
    }
}

/// The request-boundary function locktrace chose from the target's own
/// modules and symbols.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct AutoProbe {
    /// The server recognised; it decides the function.
    pub server: ServerKind,
    /// The module probed (path as the target sees it).
    pub module: String,
    /// The function probed: it runs exactly once per request on that server.
    pub function: String,
    /// What recognised the server: a symbol and its module, or the executable's name.
    pub recognised_by: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Figures per request, for one lock or for all of them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct PerRequest {
    /// Null where acquisitions were not counted.
    pub acquisitions: Option<f64>,
    /// Sampled mode: `acquisitions` is an estimate within ± this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquisitions_error: Option<f64>,
    pub contended: f64,
    pub wait_ns: f64,
    /// `--hold-times`: hold time per request; null where not recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ns: Option<f64>,
    /// CPU time per request: for a lock its sampled `cpu_ns`, for the totals
    /// the target's `cpu.target_ns`; null where not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ns: Option<f64>,
    /// A lock's handoffs per request (`handoffs.total`); null where not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoffs: Option<f64>,
}
