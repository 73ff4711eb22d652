//! Handoffs: a lock's acquisitions on another CPU than its previous
//! acquisition (its cache line had to move there), by how far the line
//! moved in the machine's cache topology, and what one move costs.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracer_common::{HandoffCounts, handoff_class};

/// How far a lock's cache line moved between two acquisitions.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum HandoffClass {
    /// To an SMT sibling of the previous CPU (same core, its L1/L2).
    SameCore,
    /// To another core sharing the previous CPU's last-level (L3) cache.
    SameL3,
    /// To a core on another L3 cache or socket, or a CPU of unknown place.
    OtherL3,
}

impl HandoffClass {
    pub const ALL: [HandoffClass; handoff_class::COUNT] = [
        HandoffClass::SameCore,
        HandoffClass::SameL3,
        HandoffClass::OtherL3,
    ];

    /// The class of a `tracer_common::handoff_class` index.
    pub(crate) fn from_index(index: usize) -> Option<HandoffClass> {
        HandoffClass::ALL.get(index).copied()
    }
}

/// Where the cost per handoff comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HandoffCostSource {
    /// Measured on this machine and kernel by `cargo xtask bench` (its
    /// calibration step: one cache line bounced between CPUs 0 and 1).
    Calibrated,
    /// The reference figure measured on the development machine (2-core VM).
    BuiltIn,
}

/// `locks[].handoffs`: acquisitions of the lock on another CPU than its
/// previous acquisition (in sampled mode scaled like `acquisitions`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Handoffs {
    /// Every handoff: the sum of the three classes.
    pub total: u64,
    pub same_core: u64,
    pub same_l3: u64,
    pub other_l3: u64,
    /// Cost of one handoff, ns (the line's transfer between two cores).
    pub ns_per_handoff: u64,
    /// Where `ns_per_handoff` comes from (absent on a row without counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_source: Option<HandoffCostSource>,
    /// `total × ns_per_handoff`: the CPU time the moves cost, ns.
    pub cost_ns: u64,
}

impl Handoffs {
    /// The counts of the BPF side, priced at `ns_per_handoff`.
    pub(crate) fn of(
        counts: &HandoffCounts,
        ns_per_handoff: u64,
        source: HandoffCostSource,
    ) -> Handoffs {
        let mut handoffs = Handoffs {
            ns_per_handoff,
            cost_source: Some(source),
            ..Handoffs::default()
        };
        for (index, &count) in counts.counts.iter().enumerate() {
            if let Some(class) = HandoffClass::from_index(index) {
                *handoffs.class_mut(class) += count;
            }
        }
        handoffs.settle();
        handoffs
    }

    pub(crate) fn class(&self, class: HandoffClass) -> u64 {
        match class {
            HandoffClass::SameCore => self.same_core,
            HandoffClass::SameL3 => self.same_l3,
            HandoffClass::OtherL3 => self.other_l3,
        }
    }

    fn class_mut(&mut self, class: HandoffClass) -> &mut u64 {
        match class {
            HandoffClass::SameCore => &mut self.same_core,
            HandoffClass::SameL3 => &mut self.same_l3,
            HandoffClass::OtherL3 => &mut self.other_l3,
        }
    }

    /// Two rows' handoffs as one's (a creation-site group): counts summed.
    pub(crate) fn merge(&mut self, other: &Handoffs) {
        for class in HandoffClass::ALL {
            let sum = self.class(class).saturating_add(other.class(class));
            *self.class_mut(class) = sum;
        }
        if self.cost_source.is_none() {
            self.ns_per_handoff = other.ns_per_handoff;
            self.cost_source = other.cost_source;
        }
        self.settle();
    }

    /// `total` and `cost_ns` from the classes.
    fn settle(&mut self) {
        self.total = self
            .same_core
            .saturating_add(self.same_l3)
            .saturating_add(self.other_l3);
        self.cost_ns = self.total.saturating_mul(self.ns_per_handoff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_priced_and_summed() {
        let counts = HandoffCounts {
            last_cpu: 2,
            _pad: 0,
            counts: [1, 5, 2],
        };
        let handoffs = Handoffs::of(&counts, 60, HandoffCostSource::BuiltIn);
        assert_eq!(
            (handoffs.same_core, handoffs.same_l3, handoffs.other_l3),
            (1, 5, 2)
        );
        assert_eq!((handoffs.total, handoffs.cost_ns), (8, 480));
        let mut merged = handoffs.clone();
        merged.merge(&handoffs);
        assert_eq!(
            (merged.total, merged.cost_ns, merged.same_l3),
            (16, 960, 10)
        );
    }

    #[test]
    fn classes_follow_the_bpf_indexes() {
        assert_eq!(
            HandoffClass::from_index(handoff_class::SAME_CORE),
            Some(HandoffClass::SameCore)
        );
        assert_eq!(
            HandoffClass::from_index(handoff_class::SAME_L3),
            Some(HandoffClass::SameL3)
        );
        assert_eq!(
            HandoffClass::from_index(handoff_class::OTHER_L3),
            Some(HandoffClass::OtherL3)
        );
        assert_eq!(HandoffClass::from_index(handoff_class::COUNT), None);
    }
}
