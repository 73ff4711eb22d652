//! Why a lock is contended, as the report records it: hold times
//! (`--hold-times`), who held the lock during waits, and log2 histograms
//! (`[upper_bound_ns, count]` lists; bound exclusive, the last open bucket's
//! bound is 2^64-1).
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracer_common::histogram;

/// `locks[].holds`: completed holds of a lock (`--hold-times`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Holds {
    pub holds: u64,
    pub hold_ns: u64,
    pub max_hold_ns: u64,
    /// `[upper_bound_ns, count]`, log2 buckets; counts add up to `holds`.
    pub histogram: Vec<(u64, u64)>,
    /// Hold time per holder function (the caller of the acquisition), most first.
    pub by_function: Vec<HoldSite>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct HoldSite {
    pub function: Option<String>,
    pub module: Option<String>,
    pub holds: u64,
    pub hold_ns: u64,
}

/// `locks[].holders[]`: who held the lock while others waited on it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct WaitHolder {
    /// The function that took the lock (null without lock probes: see `tid`).
    pub function: Option<String>,
    pub module: Option<String>,
    /// The holding thread and its name, where known (from glibc's mutex
    /// owner field; without `--hold-times` the only holder information).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    pub waits: u64,
    pub wait_ns: u64,
}

/// Adds log2 bucket counts to a sparse `[upper_bound_ns, count]` list (kept sorted).
pub(crate) fn add_histogram(into: &mut Vec<(u64, u64)>, buckets: &[u64]) {
    let mut merged: BTreeMap<u64, u64> = into.iter().copied().collect();
    for (bucket, &count) in buckets.iter().enumerate() {
        if count > 0 {
            *merged.entry(histogram::upper_bound_ns(bucket)).or_insert(0) += count;
        }
    }
    *into = merged.into_iter().collect();
}

/// Adds one sparse `[upper_bound_ns, count]` list to another, bucket by
/// bucket (kept sorted).
pub(crate) fn merge_histogram(into: &mut Vec<(u64, u64)>, other: &[(u64, u64)]) {
    let mut merged: BTreeMap<u64, u64> = into.iter().copied().collect();
    for &(bound, count) in other {
        let total = merged.entry(bound).or_insert(0);
        *total = total.saturating_add(count);
    }
    *into = merged.into_iter().collect();
}

/// The upper bound of the bucket holding the `quantile` (0..1) of a histogram.
pub(crate) fn quantile(histogram: &[(u64, u64)], quantile: f64) -> Option<u64> {
    let total: u64 = histogram.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64 * quantile).ceil() as u64).max(1);
    let mut seen = 0;
    histogram.iter().find_map(|&(bound, n)| {
        seen += n;
        (seen >= rank).then_some(bound)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn buckets_cover_every_duration_once() {
        assert_eq!(histogram::bucket(0), 0);
        assert_eq!(histogram::bucket(255), 0);
        assert_eq!(histogram::bucket(256), 1);
        assert_eq!(histogram::bucket(511), 1);
        assert_eq!(histogram::bucket(512), 2);
        assert_eq!(histogram::bucket(u64::MAX), histogram::BUCKETS - 1);
        for ns in [1u64, 300, 4096, 2_000_000, 1 << 37] {
            let b = histogram::bucket(ns);
            assert!(ns < histogram::upper_bound_ns(b), "{ns}");
            assert!(b == 0 || ns >= histogram::upper_bound_ns(b - 1), "{ns}");
        }
    }

    #[test]
    fn merged_histograms_keep_every_count() {
        let mut merged = Vec::new();
        let mut a = [0u64; histogram::BUCKETS];
        a[3] = 5;
        a[10] = 2;
        let mut b = [0u64; histogram::BUCKETS];
        b[3] = 1;
        b[31] = 4;
        add_histogram(&mut merged, &a);
        add_histogram(&mut merged, &b);
        assert_eq!(merged, vec![(2048, 6), (1 << 18, 2), (u64::MAX, 4)]);
        assert_eq!(quantile(&merged, 0.5), Some(2048));
        assert_eq!(quantile(&merged, 0.99), Some(u64::MAX));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
