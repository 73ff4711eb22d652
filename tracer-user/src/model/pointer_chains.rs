//! Why heap locks are named or stay unnamed: a report's
//! `naming.pointer_chains` sentence.
use std::borrow::Cow;

use super::word::{Worded, fields, worded};

/// What the pointer-chain search for the unnamed heap locks found, or why
/// it did not run.
#[derive(Debug, Clone)]
pub enum PointerChains {
    /// No unnamed lock in heap memory.
    NoHeapLocks,
    /// The target exited before naming; chains found during the recording
    /// named `named` of the `of` heap locks (at least one).
    NamedBeforeExit { named: usize, of: usize },
    /// The target exited before naming and no chain was found during the
    /// recording: the `of` heap locks stay unnamed.
    TargetExited { of: usize },
    /// The search at the end ran.
    Searched(ChainSearch),
    /// A sentence this version does not write.
    Other(String),
}

/// The search at the end, over the target's live memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSearch {
    /// Heap locks named in all, of `of`.
    pub named: usize,
    pub of: usize,
    /// Named by this search (the rest by the searches during the recording).
    pub named_now: usize,
    pub pointers_followed: usize,
    pub elapsed_ms: u64,
    /// False when the search's budget ran out.
    pub complete: bool,
    pub max_hops: usize,
    pub max_field_offset: u64,
}

const NO_HEAP_LOCKS: &str = "no heap locks to name";
const BEFORE_EXIT: [&str; 3] = [
    "",
    " of ",
    " heap locks named by pointer chains found during the recording (the target exited before naming)",
];
const EXITED: [&str; 2] = [
    "",
    " heap locks not named: the target exited before naming and no chain was found during the recording (pointer chains are read from its live memory)",
];
const SEARCHED: [&str; 10] = [
    "",
    " of ",
    " heap locks named by a pointer chain from a global (",
    " by the search now: ",
    " pointers followed in ",
    " ms",
    "; at most ",
    " hops, fields up to 0x",
    "; ",
    " only by the searches during the recording)",
];
const BUDGET_RAN_OUT: &str = ", budget ran out";

impl ChainSearch {
    fn sentence(&self) -> String {
        let budget = if self.complete { "" } else { BUDGET_RAN_OUT };
        format!(
            "{} of {} heap locks named by a pointer chain from a global ({} by the search now: {} pointers followed in {} ms{budget}; at most {} hops, fields up to {:#x}; {} only by the searches during the recording)",
            self.named,
            self.of,
            self.named_now,
            self.pointers_followed,
            self.elapsed_ms,
            self.max_hops,
            self.max_field_offset,
            self.named.saturating_sub(self.named_now),
        )
    }

    fn parse(word: &str) -> Option<ChainSearch> {
        let values = fields(word, &SEARCHED)?;
        let complete = match values[5] {
            "" => true,
            BUDGET_RAN_OUT => false,
            _ => return None,
        };
        Some(ChainSearch {
            named: values[0].parse().ok()?,
            of: values[1].parse().ok()?,
            named_now: values[2].parse().ok()?,
            pointers_followed: values[3].parse().ok()?,
            elapsed_ms: values[4].parse().ok()?,
            complete,
            max_hops: values[6].parse().ok()?,
            max_field_offset: u64::from_str_radix(values[7], 16).ok()?,
        })
    }
}

impl PointerChains {
    fn parse(word: &str) -> Option<PointerChains> {
        if word == NO_HEAP_LOCKS {
            return Some(PointerChains::NoHeapLocks);
        }
        let parsed = if let Some(values) = fields(word, &BEFORE_EXIT) {
            PointerChains::NamedBeforeExit {
                named: values[0].parse().ok()?,
                of: values[1].parse().ok()?,
            }
        } else if let Some(values) = fields(word, &EXITED) {
            PointerChains::TargetExited {
                of: values[0].parse().ok()?,
            }
        } else {
            PointerChains::Searched(ChainSearch::parse(word)?)
        };
        // Only a sentence this version would write back the same.
        (parsed.word() == word).then_some(parsed)
    }
}

impl Worded for PointerChains {
    fn word(&self) -> Cow<'_, str> {
        match self {
            PointerChains::NoHeapLocks => NO_HEAP_LOCKS.into(),
            PointerChains::NamedBeforeExit { named, of } => {
                format!("{named}{}{of}{}", BEFORE_EXIT[1], BEFORE_EXIT[2]).into()
            }
            PointerChains::TargetExited { of } => format!("{of}{}", EXITED[1]).into(),
            PointerChains::Searched(search) => search.sentence().into(),
            PointerChains::Other(word) => word.as_str().into(),
        }
    }

    fn from_word(word: &str) -> PointerChains {
        PointerChains::parse(word).unwrap_or_else(|| PointerChains::Other(word.to_string()))
    }
}

worded!(
    PointerChains,
    sentence "PointerChains",
    "What the pointer-chain search for the unnamed heap locks found, or why it did not run, one sentence (`no heap locks to name`, `N of M heap locks named by a pointer chain from a global (…)`, `M heap locks not named: the target exited before naming …`)."
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::word::assert_round_trips;

    fn search(complete: bool) -> ChainSearch {
        ChainSearch {
            named: 3,
            of: 5,
            named_now: 2,
            pointers_followed: 81234,
            elapsed_ms: 17,
            complete,
            max_hops: 3,
            max_field_offset: 0x400,
        }
    }

    #[test]
    fn every_outcome_round_trips() {
        for outcome in [
            PointerChains::NoHeapLocks,
            PointerChains::NamedBeforeExit { named: 1, of: 4 },
            PointerChains::TargetExited { of: 4 },
            PointerChains::Searched(search(true)),
            PointerChains::Searched(search(false)),
        ] {
            let word = outcome.word().into_owned();
            assert_round_trips::<PointerChains>(&word);
            let read = PointerChains::from_word(&word);
            assert_eq!(
                std::mem::discriminant(&read),
                std::mem::discriminant(&outcome),
                "{word}"
            );
        }
    }

    /// The sentences reports have had (tests/suite/naming.rs reads their starts).
    #[test]
    fn the_sentences_are_the_ones_reports_have() {
        assert_eq!(
            PointerChains::Searched(search(false)).to_string(),
            "3 of 5 heap locks named by a pointer chain from a global (2 by the search now: 81234 pointers followed in 17 ms, budget ran out; at most 3 hops, fields up to 0x400; 1 only by the searches during the recording)"
        );
        assert!(
            PointerChains::NamedBeforeExit { named: 1, of: 1 }
                .to_string()
                .starts_with(
                    "1 of 1 heap locks named by pointer chains found during the recording"
                )
        );
        let read = PointerChains::from_word(&PointerChains::Searched(search(true)).to_string());
        assert!(matches!(read, PointerChains::Searched(s) if s == search(true)));
    }

    #[test]
    fn an_unknown_sentence_is_kept() {
        for word in [
            "1 named",
            "",
            "2 of 3 heap locks named by pointer chains found",
        ] {
            assert!(matches!(
                PointerChains::from_word(word),
                PointerChains::Other(_)
            ));
            assert_round_trips::<PointerChains>(word);
        }
    }
}
