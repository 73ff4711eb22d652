//! Probe placement: where in each lock function the uprobe(s) go.
//!
//! `Entry` puts one probe on the function's first instruction. The kernel
//! single-steps most first instructions out of line, which is the dominant
//! cost of a uprobe; `Auto` (see `placement::auto`) looks for instructions the
//! kernel emulates instead, on every path from the entry.
use super::lockfuncs::LockFunction;
pub(crate) use crate::model::Placement;
use crate::model::{PlacementFallback, PlacementRefusal};

pub(crate) mod auto;

/// Where one probe goes, and what the BPF program needs to know there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbePoint {
    /// Offset in the module file.
    pub file_offset: u64,
    /// Where the return address is at this point: sp + this many bytes.
    pub return_address_sp_offset: u32,
    /// The kernel emulates the instruction here (cheap) rather than single-stepping it.
    pub emulated: bool,
}

/// A lock function with its probe points (plain data: `analysis` reads it too).
pub(crate) type Placed = (LockFunction, PlacedFunction);

/// The probe points of one function and, when auto placement fell back to
/// the entry, why.
#[derive(Debug, Clone)]
pub struct PlacedFunction {
    pub points: Vec<ProbePoint>,
    pub fallback_reason: Option<PlacementRefusal>,
}

/// Places every function; for auto placement each module (from `module_file`,
/// the recording's store) is swept once so branches from anywhere in it into
/// a prologue are seen.
pub(crate) fn place_all(
    functions: &[LockFunction],
    placement: Placement,
    module_file: impl Fn(&str) -> Option<std::sync::Arc<super::modules::ModuleFile>>,
) -> Vec<(LockFunction, PlacedFunction)> {
    let mut modules: std::collections::HashMap<&str, Option<auto::BranchTargets>> =
        std::collections::HashMap::new();
    functions
        .iter()
        .map(|function| {
            let targets = match placement {
                Placement::Entry => None,
                Placement::Auto => modules
                    .entry(function.module.as_str())
                    .or_insert_with(|| {
                        auto::BranchTargets::of_elf(module_file(&function.module)?.bytes())
                    })
                    .as_ref(),
            };
            (
                function.clone(),
                place_in_module(function, placement, targets),
            )
        })
        .collect()
}

fn place_in_module(
    function: &LockFunction,
    placement: Placement,
    module: Option<&auto::BranchTargets>,
) -> PlacedFunction {
    let entry = PlacedFunction {
        points: vec![ProbePoint {
            file_offset: function.file_offset,
            return_address_sp_offset: 0,
            emulated: first_instruction_is_emulated(&function.code),
        }],
        fallback_reason: None,
    };
    // A function that may fail has a return probe at its entry, which
    // replaces the return address on the stack: a probe placed after the
    // entry would read the kernel's trampoline as the caller. At the entry
    // the lock probe runs first, on the same uprobe, and reads the real one.
    if function.op.may_fail() {
        return entry;
    }
    // A retry loop back to the entry (glibc's pthread_spin_lock) passes the
    // entry, and any point after it, once per retry: each call leaves
    // through one `ret`, once.
    if auto::loops_to_entry(&function.code, function.file_offset)
        && let Ok(points) = auto::exits(&function.code, function.file_offset, module)
    {
        return PlacedFunction {
            points,
            fallback_reason: None,
        };
    }
    // The kernel refuses a uprobe on a LOCK-prefixed instruction
    // (pthread_spin_lock starts with `lock decl`): such an entry is placed
    // as auto would place it, whatever `--placement` says.
    let placement = if first_instruction_is_locked(&function.code) {
        Placement::Auto
    } else {
        placement
    };
    match placement {
        Placement::Entry => entry,
        Placement::Auto => match auto::analyse(
            &function.code,
            function.file_offset,
            auto::KERNEL_EMULATED,
            module,
        ) {
            Ok(points) => PlacedFunction {
                points,
                fallback_reason: None,
            },
            Err(reason) => PlacedFunction {
                fallback_reason: Some(reason),
                ..entry
            },
        },
    }
}

fn first_instruction_is_locked(code: &[u8]) -> bool {
    let instruction = iced_x86::Decoder::new(64, code, iced_x86::DecoderOptions::NONE).decode();
    !instruction.is_invalid() && instruction.has_lock_prefix()
}

pub(crate) fn first_instruction_is_emulated(code: &[u8]) -> bool {
    let instruction = iced_x86::Decoder::new(64, code, iced_x86::DecoderOptions::NONE).decode();
    !instruction.is_invalid()
        && code
            .get(..instruction.len())
            .and_then(auto::classify)
            .is_some()
}

/// Functions where auto placement fell back to the entry, and why.
pub(crate) fn fallbacks(placed: &[(LockFunction, PlacedFunction)]) -> Vec<PlacementFallback> {
    placed
        .iter()
        .filter_map(|(function, placed)| {
            Some(PlacementFallback {
                function: function.op.symbol().to_string(),
                module: function.module.clone(),
                reason: placed.fallback_reason.clone()?,
            })
        })
        .collect()
}
