//! Why `--placement auto` kept a lock function's probe at its entry: a
//! report's `placement_fallbacks[].reason`, one sentence.
use std::borrow::Cow;

use super::word::{Worded, worded};

/// An instruction on a path from the entry: its mnemonic (lowercase) and
/// offset from the function's start, written `mov at +0x3`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    pub mnemonic: String,
    pub offset: u64,
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at +{:#x}", self.mnemonic, self.offset)
    }
}

/// Where a branch into the probed prologue comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elsewhere {
    Function,
    Module,
}

/// Why auto placement could not prove a placement after the entry exact.
/// Offsets are from the function's start.
#[derive(Debug, Clone)]
pub enum PlacementRefusal {
    /// The symbol has no size, so its code is unknown.
    NoCode,
    /// More probe points than the limit would be needed.
    TooManyPoints {
        needed: usize,
        limit: usize,
    },
    /// An instruction between the entry and a probe point is also reached
    /// by a branch from elsewhere (that path would skip the probe).
    BranchTarget {
        offset: u64,
        from: Elsewhere,
    },
    /// A path leaves the function before a cheap instruction.
    LeavesFunction {
        offset: u64,
    },
    /// A path loops back before a cheap instruction.
    Loop {
        offset: u64,
    },
    /// No cheap instruction within this many instructions on a path.
    TooLong {
        limit: usize,
    },
    /// Paths join with different stack depths.
    DepthMismatch {
        offset: u64,
    },
    Undecodable {
        offset: u64,
    },
    /// A path returns before a cheap instruction.
    Returns(At),
    /// A path calls before a cheap instruction.
    Calls(At),
    IndirectBranch(At),
    UnsupportedFlow(At),
    /// An instruction writes rdi, the lock argument the probe reads.
    WritesRdi(At),
    /// An instruction moves the stack pointer (pushes excepted).
    MovesStackPointer(At),
    /// An instruction stores on the stack (it could hit the return address).
    StoresOnStack(At),
    /// A reason this version does not know (a report from another version).
    Other(String),
}

const LEAVES: (&str, &str) = (
    "a path leaves the function (to ",
    ") before a cheap instruction",
);
const LOOP: (&str, &str) = ("a loop back to ", " before a cheap instruction");
const TOO_LONG: (&str, &str) = ("no cheap instruction within ", " instructions");
const DEPTHS: (&str, &str) = ("paths join at ", " with different stack depths");
const UNDECODABLE: (&str, &str) = ("undecodable bytes at ", "");
const RETURNS: (&str, &str) = ("a path returns (", ") before a cheap instruction");
const CALLS: (&str, &str) = ("a path calls (", ") before a cheap instruction");
const INDIRECT: (&str, &str) = ("indirect jump or call (", ")");
const UNSUPPORTED: (&str, &str) = ("unsupported control flow (", ")");
const WRITES_RDI: (&str, &str) = ("", " writes rdi (the lock argument)");
const MOVES_SP: (&str, &str) = ("", " moves the stack pointer");
const STORES: (&str, &str) = ("", " stores on the stack");
const NO_CODE: &str = "the symbol has no size, so its code is unknown";
const BRANCH_TARGET: (&str, &str) = (
    " (between the entry and a probe point) is also a branch target from elsewhere in the ",
    "",
);

/// Reads one form of sentence.
type Parser = dyn Fn(&str) -> Option<PlacementRefusal>;

/// `+0x1f` as 0x1f.
fn offset(text: &str) -> Option<u64> {
    u64::from_str_radix(text.strip_prefix("+0x")?, 16).ok()
}

/// `mov at +0x3` as an [`At`].
fn at(text: &str) -> Option<At> {
    let (mnemonic, offset_text) = text.rsplit_once(" at ")?;
    Some(At {
        mnemonic: mnemonic.to_string(),
        offset: offset(offset_text)?,
    })
}

/// What is between `prefix` and `suffix` in `word`.
fn between<'a>(word: &'a str, (prefix, suffix): (&str, &str)) -> Option<&'a str> {
    word.strip_prefix(prefix)?.strip_suffix(suffix)
}

impl PlacementRefusal {
    /// The refusal a sentence of this version's words says, if any.
    fn parse(word: &str) -> Option<PlacementRefusal> {
        use PlacementRefusal as R;
        if word == NO_CODE {
            return Some(R::NoCode);
        }
        let parsers: [&Parser; 14] = [
            &|w| {
                Some(R::LeavesFunction {
                    offset: offset(between(w, LEAVES)?)?,
                })
            },
            &|w| {
                Some(R::Loop {
                    offset: offset(between(w, LOOP)?)?,
                })
            },
            &|w| {
                Some(R::TooLong {
                    limit: between(w, TOO_LONG)?.parse().ok()?,
                })
            },
            &|w| {
                Some(R::DepthMismatch {
                    offset: offset(between(w, DEPTHS)?)?,
                })
            },
            &|w| {
                Some(R::Undecodable {
                    offset: offset(between(w, UNDECODABLE)?)?,
                })
            },
            &|w| Some(R::Returns(at(between(w, RETURNS)?)?)),
            &|w| Some(R::Calls(at(between(w, CALLS)?)?)),
            &|w| Some(R::IndirectBranch(at(between(w, INDIRECT)?)?)),
            &|w| Some(R::UnsupportedFlow(at(between(w, UNSUPPORTED)?)?)),
            &|w| Some(R::WritesRdi(at(between(w, WRITES_RDI)?)?)),
            &|w| Some(R::MovesStackPointer(at(between(w, MOVES_SP)?)?)),
            &|w| Some(R::StoresOnStack(at(between(w, STORES)?)?)),
            &|w| {
                let (needed, limit) = w
                    .strip_suffix(')')?
                    .split_once(" probe points needed (limit ")?;
                Some(R::TooManyPoints {
                    needed: needed.parse().ok()?,
                    limit: limit.parse().ok()?,
                })
            },
            &|w| {
                let (at_offset, from) = w.split_once(BRANCH_TARGET.0)?;
                let from = match from {
                    "function" => Elsewhere::Function,
                    "module" => Elsewhere::Module,
                    _ => return None,
                };
                Some(R::BranchTarget {
                    offset: offset(at_offset)?,
                    from,
                })
            },
        ];
        let parsed = parsers.iter().find_map(|parse| parse(word))?;
        // Only a sentence this version would write back the same.
        (parsed.word() == word).then_some(parsed)
    }
}

/// `prefix`, `middle`, `suffix`.
fn wrap((prefix, suffix): (&str, &str), middle: impl std::fmt::Display) -> Cow<'static, str> {
    format!("{prefix}{middle}{suffix}").into()
}

impl Worded for PlacementRefusal {
    fn word(&self) -> Cow<'_, str> {
        use PlacementRefusal as R;
        let hex = |offset: &u64| format!("+{offset:#x}");
        match self {
            R::NoCode => NO_CODE.into(),
            R::TooManyPoints { needed, limit } => {
                format!("{needed} probe points needed (limit {limit})").into()
            }
            R::BranchTarget { offset, from } => {
                let from = match from {
                    Elsewhere::Function => "function",
                    Elsewhere::Module => "module",
                };
                format!("{}{}{from}", hex(offset), BRANCH_TARGET.0).into()
            }
            R::LeavesFunction { offset } => wrap(LEAVES, hex(offset)),
            R::Loop { offset } => wrap(LOOP, hex(offset)),
            R::TooLong { limit } => wrap(TOO_LONG, limit),
            R::DepthMismatch { offset } => wrap(DEPTHS, hex(offset)),
            R::Undecodable { offset } => wrap(UNDECODABLE, hex(offset)),
            R::Returns(at) => wrap(RETURNS, at),
            R::Calls(at) => wrap(CALLS, at),
            R::IndirectBranch(at) => wrap(INDIRECT, at),
            R::UnsupportedFlow(at) => wrap(UNSUPPORTED, at),
            R::WritesRdi(at) => wrap(WRITES_RDI, at),
            R::MovesStackPointer(at) => wrap(MOVES_SP, at),
            R::StoresOnStack(at) => wrap(STORES, at),
            R::Other(word) => word.as_str().into(),
        }
    }

    fn from_word(word: &str) -> PlacementRefusal {
        PlacementRefusal::parse(word).unwrap_or_else(|| PlacementRefusal::Other(word.to_string()))
    }
}

worded!(
    PlacementRefusal,
    sentence "PlacementRefusal",
    "Why auto placement kept the probe at the function's entry, one sentence (`mov at +0x3 writes rdi (the lock argument)`); offsets are from the function's start."
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::word::assert_round_trips;

    fn every_refusal() -> Vec<PlacementRefusal> {
        use PlacementRefusal as R;
        let at = || At {
            mnemonic: "mov".into(),
            offset: 0x3,
        };
        vec![
            R::NoCode,
            R::TooManyPoints {
                needed: 40,
                limit: 32,
            },
            R::BranchTarget {
                offset: 0x12,
                from: Elsewhere::Function,
            },
            R::BranchTarget {
                offset: 0x12,
                from: Elsewhere::Module,
            },
            R::LeavesFunction { offset: 0x40 },
            R::Loop { offset: 0x2 },
            R::TooLong { limit: 64 },
            R::DepthMismatch { offset: 0x9 },
            R::Undecodable { offset: 0x1 },
            R::Returns(At {
                mnemonic: "ret".into(),
                offset: 0x2,
            }),
            R::Calls(At {
                mnemonic: "call".into(),
                offset: 0x5,
            }),
            R::IndirectBranch(At {
                mnemonic: "jmp".into(),
                offset: 0,
            }),
            R::UnsupportedFlow(At {
                mnemonic: "syscall".into(),
                offset: 0x7,
            }),
            R::WritesRdi(at()),
            R::MovesStackPointer(At {
                mnemonic: "sub".into(),
                offset: 0,
            }),
            R::StoresOnStack(at()),
        ]
    }

    /// Each refusal reads back from its sentence as the same variant.
    #[test]
    fn every_refusal_round_trips() {
        for refusal in every_refusal() {
            let word = refusal.word().into_owned();
            assert_round_trips::<PlacementRefusal>(&word);
            let read = PlacementRefusal::from_word(&word);
            assert_eq!(
                std::mem::discriminant(&read),
                std::mem::discriminant(&refusal),
                "{word}"
            );
        }
    }

    #[test]
    fn the_sentences_are_the_ones_reports_have() {
        let at = At {
            mnemonic: "mov".into(),
            offset: 0x0,
        };
        assert_eq!(
            PlacementRefusal::WritesRdi(at).to_string(),
            "mov at +0x0 writes rdi (the lock argument)"
        );
        assert_eq!(
            PlacementRefusal::BranchTarget {
                offset: 0x2,
                from: Elsewhere::Function
            }
            .to_string(),
            "+0x2 (between the entry and a probe point) is also a branch target from elsewhere in the function"
        );
    }

    #[test]
    fn an_unknown_sentence_is_kept() {
        for word in ["x", "a path returns (ret at 12) before a cheap instruction"] {
            assert!(matches!(
                PlacementRefusal::from_word(word),
                PlacementRefusal::Other(_)
            ));
            assert_round_trips::<PlacementRefusal>(word);
        }
    }
}
