//! How close a lock is to being held all the time (`locks[].saturation`,
//! with `--hold-times`), and what a queueing model predicts from that.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The queueing model a lock's predictions come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum QueueModel {
    /// One server (the lock), Poisson arrivals (acquisitions), a constant
    /// service time (the mean hold), first come first served.
    #[serde(rename = "M/D/1")]
    MD1,
    /// As M/D/1 with exponentially distributed holds: twice the wait.
    #[serde(rename = "M/M/1")]
    MM1,
}

impl QueueModel {
    /// The mean wait before service at `utilization` with mean service time
    /// `mean_hold_ns` (Pollaczek-Khinchine); none at or above saturation.
    pub(crate) fn wait_ns(self, utilization: f64, mean_hold_ns: f64) -> Option<f64> {
        if utilization >= 1.0 {
            return None;
        }
        let exponential = utilization * mean_hold_ns / (1.0 - utilization);
        Some(match self {
            QueueModel::MD1 => exponential / 2.0,
            QueueModel::MM1 => exponential,
        })
    }
}

impl std::fmt::Display for QueueModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QueueModel::MD1 => "M/D/1",
            QueueModel::MM1 => "M/M/1",
        })
    }
}

/// `locks[].saturation`: the share of the recording a lock was held, and
/// what that implies at the current rate and at higher ones.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Saturation {
    /// Holds per second × mean hold time: the share of the recording the
    /// lock was held (0..1; a read lock held by several readers at once
    /// sums their holds and may exceed 1).
    pub utilization: f64,
    /// Completed holds per second of the recording.
    pub holds_per_s: f64,
    pub mean_hold_ns: f64,
    pub model: QueueModel,
    /// The model's mean wait per acquisition at the current rate; null at
    /// or above saturation (the queue grows without bound).
    pub predicted_wait_ns: Option<f64>,
    /// The measured mean futex wait per acquisition, to set beside it.
    pub measured_wait_ns: f64,
    /// The acquisition rate at which the lock would be held all the time
    /// (1 / mean hold).
    pub saturating_holds_per_s: f64,
    /// The request rate at which it would be, the work per request staying
    /// the same; null without a request count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saturating_requests_per_s: Option<f64>,
}

/// Above this utilization the table says how close a lock is to saturation.
pub(crate) const SATURATION_NOTE_AT: f64 = 0.30;
