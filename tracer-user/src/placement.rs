//! Probe placement: where in each lock function the uprobe(s) go.
//!
//! `Entry` puts one probe on the function's first instruction. The kernel
//! single-steps most first instructions out of line, which is the dominant
//! cost of a uprobe; `Auto` (see `placement::auto`) looks for instructions the
//! kernel emulates instead, on every path from the entry.
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::lockfuncs::LockFunction;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// One probe on each function's first instruction.
    Entry,
    /// Probes on the first cheap instruction of every path from the entry; falls back to Entry.
    Auto,
}

/// Where one probe goes, and what the BPF program needs to know there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbePoint {
    /// Offset in the module file.
    pub file_offset: u64,
    /// Where the return address is at this point: sp + this many bytes.
    pub return_address_sp_offset: u32,
}

/// The probe points of one function and, when auto placement fell back to
/// the entry, why.
#[derive(Debug, Clone)]
pub struct PlacedFunction {
    pub points: Vec<ProbePoint>,
    pub fallback_reason: Option<String>,
}

pub fn place(function: &LockFunction, placement: Placement) -> PlacedFunction {
    let entry = PlacedFunction {
        points: vec![ProbePoint { file_offset: function.file_offset, return_address_sp_offset: 0 }],
        fallback_reason: None,
    };
    match placement {
        Placement::Entry => entry,
        Placement::Auto => PlacedFunction {
            fallback_reason: Some("auto placement is not implemented yet".into()),
            ..entry
        },
    }
}
