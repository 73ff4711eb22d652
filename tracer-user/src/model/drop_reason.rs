//! Why events could not be counted: the keys of a report's `dropped`.
use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator};

use super::word::{Worded, worded};

/// One reason in a report's `dropped`. The BPF side counts the first
/// twenty-four (`tracer_common::drop_reason`, in its index order); userspace
/// adds `nested_calls_unknown`; a reason from a newer version is kept.
#[derive(Debug, Clone)]
pub enum DropReason {
    LocksMapFull,
    FutexMapFull,
    CallersMapFull,
    StacksLost,
    WaitsUntracked,
    CallerUnreadable,
    CondWaitsUntracked,
    HoldsUntracked,
    WaitHoldersFull,
    CondvarMapFull,
    GoFutexMapFull,
    StackCountsFull,
    HoldsMapFull,
    HoldersMapFull,
    PausedForExpiry,
    CpuLocksFull,
    FailedTriesUntracked,
    SnapshotsLost,
    ProbePointUnknown,
    LifetimesMerged,
    HandoffsMapFull,
    RoutesMapFull,
    RoutesPastCap,
    SnapshotsSkipped,
    /// Computed by userspace, not BPF: lock calls whose caller was lost
    /// where the lock functions call each other, so up to that many
    /// acquisitions may be nested calls counted again.
    NestedCallsUnknown,
    /// Computed by userspace: `--mode inproc` lock calls not counted
    /// because a stub's table was full.
    InprocTableFull,
    /// Computed by userspace: acquisitions (counted) of locks whose
    /// creation site was not recorded because the stack count map was full.
    SitesNotRecorded,
    /// A reason this version does not know (a report from a newer one).
    Other(String),
}

/// The BPF side's reasons, by their `DROPS` index.
const BPF: [DropReason; tracer_common::drop_reason::COUNT as usize] = [
    DropReason::LocksMapFull,
    DropReason::FutexMapFull,
    DropReason::CallersMapFull,
    DropReason::StacksLost,
    DropReason::WaitsUntracked,
    DropReason::CallerUnreadable,
    DropReason::CondWaitsUntracked,
    DropReason::HoldsUntracked,
    DropReason::WaitHoldersFull,
    DropReason::CondvarMapFull,
    DropReason::GoFutexMapFull,
    DropReason::StackCountsFull,
    DropReason::HoldsMapFull,
    DropReason::HoldersMapFull,
    DropReason::PausedForExpiry,
    DropReason::CpuLocksFull,
    DropReason::FailedTriesUntracked,
    DropReason::SnapshotsLost,
    DropReason::ProbePointUnknown,
    DropReason::LifetimesMerged,
    DropReason::HandoffsMapFull,
    DropReason::RoutesMapFull,
    DropReason::RoutesPastCap,
    DropReason::SnapshotsSkipped,
];

impl DropReason {
    /// The reason the BPF side counts at `DROPS` index `index`.
    pub(crate) fn from_index(index: usize) -> DropReason {
        BPF.get(index)
            .cloned()
            .unwrap_or_else(|| DropReason::Other(format!("drop_reason_{index}")))
    }

    /// Every reason this version can write.
    pub(crate) fn known() -> impl Iterator<Item = DropReason> {
        BPF.into_iter().chain([
            DropReason::NestedCallsUnknown,
            DropReason::InprocTableFull,
            DropReason::SitesNotRecorded,
        ])
    }
}

impl Worded for DropReason {
    fn word(&self) -> Cow<'_, str> {
        use DropReason as R;
        let index = match self {
            R::NestedCallsUnknown => return "nested_calls_unknown".into(),
            R::InprocTableFull => return "inproc_table_full".into(),
            R::SitesNotRecorded => return "sites_not_recorded".into(),
            R::Other(word) => return word.as_str().into(),
            R::LocksMapFull => 0,
            R::FutexMapFull => 1,
            R::CallersMapFull => 2,
            R::StacksLost => 3,
            R::WaitsUntracked => 4,
            R::CallerUnreadable => 5,
            R::CondWaitsUntracked => 6,
            R::HoldsUntracked => 7,
            R::WaitHoldersFull => 8,
            R::CondvarMapFull => 9,
            R::GoFutexMapFull => 10,
            R::StackCountsFull => 11,
            R::HoldsMapFull => 12,
            R::HoldersMapFull => 13,
            R::PausedForExpiry => 14,
            R::CpuLocksFull => 15,
            R::FailedTriesUntracked => 16,
            R::SnapshotsLost => 17,
            R::ProbePointUnknown => 18,
            R::LifetimesMerged => 19,
            R::HandoffsMapFull => 20,
            R::RoutesMapFull => 21,
            R::RoutesPastCap => 22,
            R::SnapshotsSkipped => 23,
        };
        tracer_common::drop_reason::NAMES[index].into()
    }

    fn from_word(word: &str) -> DropReason {
        DropReason::known()
            .find(|known| known.word() == word)
            .unwrap_or_else(|| DropReason::Other(word.to_string()))
    }
}

worded!(DropReason);

impl JsonSchema for DropReason {
    fn schema_name() -> Cow<'static, str> {
        "DropReason".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let known: Vec<DropReason> = DropReason::known().collect();
        let words: Vec<Cow<'_, str>> = known.iter().map(Worded::word).collect();
        let words: Vec<&str> = words.iter().map(|word| word.as_ref()).collect();
        super::word::schema(
            "Why events could not be counted (newer versions may add reasons).",
            &words,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::word::assert_round_trips;

    #[test]
    fn every_reason_round_trips_as_its_word() {
        for reason in DropReason::known() {
            assert!(!matches!(reason, DropReason::Other(_)));
            assert_round_trips::<DropReason>(&reason.word());
        }
        assert_round_trips::<DropReason>("nested_calls_unknown");
    }

    #[test]
    fn the_bpf_reasons_are_the_bpf_names_in_index_order() {
        for (index, name) in tracer_common::drop_reason::NAMES.iter().enumerate() {
            let reason = DropReason::from_index(index);
            assert_eq!(reason.word(), *name);
            assert!(!matches!(reason, DropReason::Other(_)), "{name}");
        }
    }

    #[test]
    fn a_reason_from_a_newer_version_is_kept() {
        let reason: DropReason = serde_json::from_str("\"ring_full\"").unwrap();
        assert!(matches!(&reason, DropReason::Other(word) if word == "ring_full"));
        assert_round_trips::<DropReason>("ring_full");
    }

    /// `dropped` keys stay in the order they had as strings.
    #[test]
    fn a_map_of_reasons_is_written_in_word_order() {
        let dropped: std::collections::BTreeMap<DropReason, u64> = [
            (DropReason::StacksLost, 1),
            (DropReason::LocksMapFull, 2),
            (DropReason::Other("a_new_one".into()), 3),
        ]
        .into();
        assert_eq!(
            serde_json::to_string(&dropped).unwrap(),
            r#"{"a_new_one":3,"locks_map_full":2,"stacks_lost":1}"#
        );
    }
}
