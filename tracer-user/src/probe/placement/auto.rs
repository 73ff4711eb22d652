//! Auto probe placement: decode a lock function from its entry (x86-64, with
//! iced-x86) and find, on every path, the first instruction the kernel
//! *emulates* when a uprobe hits it, instead of single-stepping it out of line
//! (the single step is what makes a uprobe on glibc's first `mov` cost ~9.5 µs
//! against ~0.8 µs on an emulated `jne`/`push`).
//!
//! Which instructions are emulated: arch/x86/kernel/uprobes.c,
//! `branch_setup_xol_ops` (jmp rel8/rel32, call rel32, jcc rel8/rel32, nop
//! 0x90 with 0x66 prefixes; any other prefix on a branch is refused) and
//! `push_setup_xol_ops` (push r64, optionally with REX.B). `cargo xtask bench`
//! measures each class on the running kernel (docs/benchmarks.md).
//!
//! The placement must keep counts exact, so it is rejected (and the caller
//! falls back to the entry) unless:
//! - every path from the entry reaches a cheap instruction within a few
//!   instructions, through nothing but straight-line code and, when branches
//!   are not cheap, direct branches inside the function (no loops, no
//!   ret/call/indirect jump, no leaving the function);
//! - nothing on the way writes rdi (the lock argument the BPF program reads)
//!   or the stack pointer, except counted pushes (the return address is then
//!   at sp + 8 × pushes, which the probe cookie carries);
//! - no instruction between the entry and a probe point (the points included)
//!   is the target of a branch from anywhere else in the function or module:
//!   such a branch could pass a probe point a second time in one call, or
//!   reach code behind the entry without passing a probe at all.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, OpAccess, Register,
};

use super::ProbePoint;
use crate::model::{At, Elsewhere, PlacementRefusal};

/// Instructions a uprobe can sit on without a single step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum CheapClass {
    /// jcc rel8 / rel32.
    Jcc,
    /// jmp rel8 / rel32.
    Jmp,
    /// call rel32.
    Call,
    /// push r64 (also r8-r15 with REX.B).
    Push,
    /// nop (0x90, optionally with 0x66 prefixes).
    Nop,
    /// Multi-byte nop (0x0f 0x1f /0, optionally with 0x66 prefixes): emulated
    /// since Linux 6.1x (`cargo xtask bench` measures it cheap on 6.18).
    NopMulti,
}

/// What the kernel emulates according to its source (x86 uprobes, 4.x to 6.x;
/// multi-byte nops only in recent kernels: on older ones a probe there is
/// still exact, just single-stepped).
pub(crate) const KERNEL_EMULATED: &[CheapClass] = &[
    CheapClass::NopMulti,
    CheapClass::Jcc,
    CheapClass::Jmp,
    CheapClass::Call,
    CheapClass::Push,
    CheapClass::Nop,
];

/// Most instructions followed on one path before giving up.
const MAX_PATH_INSTRUCTIONS: usize = 48;
/// Most probe points per function.
const MAX_POINTS: usize = 16;

/// The emulated class of an instruction, by its bytes as the kernel decodes them.
pub(crate) fn classify(bytes: &[u8]) -> Option<CheapClass> {
    match bytes {
        [0x70..=0x7f, _] | [0x0f, 0x80..=0x8f, _, _, _, _] => Some(CheapClass::Jcc),
        [0xeb, _] | [0xe9, _, _, _, _] => Some(CheapClass::Jmp),
        [0xe8, _, _, _, _] => Some(CheapClass::Call),
        [0x50..=0x57] | [0x41, 0x50..=0x57] => Some(CheapClass::Push),
        [prefixes @ .., 0x90] if prefixes.iter().all(|&b| b == 0x66) => Some(CheapClass::Nop),
        _ if multi_byte_nop(bytes) => Some(CheapClass::NopMulti),
        _ => None,
    }
}

/// `0f 1f /0` (`nopl`/`nopw`), optionally after 0x66 prefixes.
fn multi_byte_nop(bytes: &[u8]) -> bool {
    let opcode = &bytes[bytes.iter().take_while(|&&b| b == 0x66).count()..];
    matches!(opcode, [0x0f, 0x1f, modrm, ..] if (modrm >> 3) & 7 == 0)
}

/// How many direct branches (jcc/jmp/call) in a module target each file
/// offset. Computed once per module by a linear sweep of its executable
/// segments, with file offsets as instruction pointers (relative branches
/// inside one segment come out the same).
#[derive(Debug, Default)]
pub(crate) struct BranchTargets {
    counts: HashMap<u64, u32>,
}

impl BranchTargets {
    /// Sweeps `ranges` (file offset, length) of `data`.
    pub(crate) fn scan(data: &[u8], ranges: &[(u64, u64)]) -> BranchTargets {
        let mut targets = BranchTargets::default();
        for &(start, len) in ranges {
            let Some(bytes) = data.get(start as usize..(start + len) as usize) else {
                continue;
            };
            targets.add_sweep(bytes, start, None);
        }
        targets
    }

    /// Sweeps an ELF file's executable segments.
    pub(crate) fn of_elf(data: &[u8]) -> Option<BranchTargets> {
        use object::{Object, ObjectSegment, SegmentFlags};
        let elf = object::File::parse(data).ok()?;
        let ranges: Vec<(u64, u64)> = elf
            .segments()
            .filter(|segment| matches!(segment.flags(), SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
            .map(|segment| segment.file_range())
            .collect();
        Some(BranchTargets::scan(data, &ranges))
    }

    fn add_sweep(&mut self, bytes: &[u8], start: u64, skip: Option<(u64, u64)>) {
        let mut decoder = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
        let mut instruction = Instruction::default();
        while decoder.can_decode() {
            decoder.decode_out(&mut instruction);
            if skip.is_some_and(|(from, to)| (from..to).contains(&instruction.ip())) {
                continue;
            }
            if let Some(target) = direct_target(&instruction) {
                *self.counts.entry(target).or_insert(0) += 1;
            }
        }
    }

    fn count(&self, target: u64) -> u32 {
        self.counts.get(&target).copied().unwrap_or(0)
    }
}

fn direct_target(instruction: &Instruction) -> Option<u64> {
    match instruction.flow_control() {
        FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
            if instruction.op0_kind() != iced_x86::OpKind::Register
                && instruction.op0_kind() != iced_x86::OpKind::Memory =>
        {
            Some(instruction.near_branch_target())
        }
        _ => None,
    }
}

/// Probe points for the function whose bytes are `code`, starting at
/// `file_offset`; `Err(reason)` if the placement is not provably exact.
/// `module` holds the branch targets of the whole module, if it could be read
/// (without it only branches inside the function are checked).
pub(crate) fn analyse(
    code: &[u8],
    file_offset: u64,
    cheap: &[CheapClass],
    module: Option<&BranchTargets>,
) -> Result<Vec<ProbePoint>, PlacementRefusal> {
    if code.is_empty() {
        return Err(PlacementRefusal::NoCode);
    }
    let mut walk = Walk {
        code,
        start: file_offset,
        cheap,
        factory: InstructionInfoFactory::new(),
        depth_at: BTreeMap::new(),
        points: BTreeMap::new(),
        on_path: BTreeSet::new(),
        internal_edges: HashMap::new(),
    };
    walk.visit(file_offset, 0, 0)?;
    if walk.points.len() > MAX_POINTS {
        return Err(PlacementRefusal::TooManyPoints {
            needed: walk.points.len(),
            limit: MAX_POINTS,
        });
    }

    // Branches into the region from outside the analysed paths.
    let mut inside = BranchTargets::default();
    inside.add_sweep(code, file_offset, None);
    let function_end = file_offset + code.len() as u64;
    for &offset in walk
        .depth_at
        .keys()
        .filter(|&&offset| offset != file_offset)
    {
        let internal = walk.internal_edges.get(&offset).copied().unwrap_or(0);
        let from_function = inside.count(offset).saturating_sub(internal);
        // The module count includes this function's own branches.
        let from_module =
            module.map_or(0, |m| m.count(offset).saturating_sub(inside.count(offset)));
        if from_function + from_module > 0 {
            return Err(PlacementRefusal::BranchTarget {
                offset: offset - file_offset,
                from: if from_function > 0 {
                    Elsewhere::Function
                } else {
                    Elsewhere::Module
                },
            });
        }
    }
    debug_assert!(walk.depth_at.keys().all(|&o| o < function_end));
    Ok(walk
        .points
        .into_iter()
        .map(|(offset, pushes)| ProbePoint {
            file_offset: offset,
            return_address_sp_offset: pushes * 8,
            emulated: true,
        })
        .collect())
}

/// Whether a branch inside `code` (starting at `file_offset`) jumps back
/// to its entry: a retry loop (glibc's pthread_spin_lock), which passes
/// the entry and every point after it once per retry.
pub(crate) fn loops_to_entry(code: &[u8], file_offset: u64) -> bool {
    let mut inside = BranchTargets::default();
    inside.add_sweep(code, file_offset, None);
    inside.count(file_offset) > 0
}

/// Probe points on the `ret` instructions of a function whose entry is a
/// retry loop's target: each call leaves through exactly one of them, once,
/// however often it retried. Refused unless every instruction reachable
/// from the entry stays in the function, calls nothing, jumps only
/// directly and leaves rdi (the lock argument) alone, and no branch from
/// elsewhere in the module reaches a `ret` (at a `ret` the return address
/// is at sp whatever happened before).
pub(crate) fn exits(
    code: &[u8],
    file_offset: u64,
    module: Option<&BranchTargets>,
) -> Result<Vec<ProbePoint>, PlacementRefusal> {
    if code.is_empty() {
        return Err(PlacementRefusal::NoCode);
    }
    let mut factory = InstructionInfoFactory::new();
    let mut seen = BTreeSet::new();
    let mut returns = Vec::new();
    let mut pending = vec![file_offset];
    while let Some(offset) = pending.pop() {
        let relative = offset.wrapping_sub(file_offset);
        if offset < file_offset || relative >= code.len() as u64 {
            return Err(PlacementRefusal::LeavesFunction { offset: relative });
        }
        if !seen.insert(offset) {
            continue;
        }
        let bytes = &code[relative as usize..];
        let instruction = Decoder::with_ip(64, bytes, offset, DecoderOptions::NONE).decode();
        if instruction.is_invalid() {
            return Err(PlacementRefusal::Undecodable { offset: relative });
        }
        let what = || At {
            mnemonic: format!("{:?}", instruction.mnemonic()).to_lowercase(),
            offset: relative,
        };
        let writes_rdi = factory
            .info(&instruction)
            .used_registers()
            .iter()
            .any(|used| {
                used.register().full_register() == Register::RDI
                    && !matches!(used.access(), OpAccess::Read | OpAccess::CondRead)
            });
        if writes_rdi {
            return Err(PlacementRefusal::WritesRdi(what()));
        }
        let next = offset + instruction.len() as u64;
        match instruction.flow_control() {
            FlowControl::Next => pending.push(next),
            FlowControl::ConditionalBranch if direct_target(&instruction).is_some() => {
                pending.extend([instruction.near_branch_target(), next]);
            }
            FlowControl::UnconditionalBranch if direct_target(&instruction).is_some() => {
                pending.push(instruction.near_branch_target());
            }
            FlowControl::Return => returns.push(offset),
            FlowControl::Call => return Err(PlacementRefusal::Calls(what())),
            FlowControl::IndirectBranch | FlowControl::IndirectCall => {
                return Err(PlacementRefusal::IndirectBranch(what()));
            }
            _ => return Err(PlacementRefusal::UnsupportedFlow(what())),
        }
    }
    let mut inside = BranchTargets::default();
    inside.add_sweep(code, file_offset, None);
    for &offset in &returns {
        let from_module =
            module.map_or(0, |m| m.count(offset).saturating_sub(inside.count(offset)));
        if from_module > 0 {
            return Err(PlacementRefusal::BranchTarget {
                offset: offset - file_offset,
                from: Elsewhere::Module,
            });
        }
    }
    if returns.len() > MAX_POINTS {
        return Err(PlacementRefusal::TooManyPoints {
            needed: returns.len(),
            limit: MAX_POINTS,
        });
    }
    returns.sort_unstable();
    Ok(returns
        .into_iter()
        .map(|offset| ProbePoint {
            file_offset: offset,
            return_address_sp_offset: 0,
            emulated: false,
        })
        .collect())
}

struct Walk<'a> {
    code: &'a [u8],
    start: u64,
    cheap: &'a [CheapClass],
    factory: InstructionInfoFactory,
    /// Every instruction visited (points included), with its push count.
    depth_at: BTreeMap<u64, u32>,
    /// Chosen probe points, with the pushes done before them.
    points: BTreeMap<u64, u32>,
    /// Instructions on the current path (loop detection).
    on_path: BTreeSet<u64>,
    /// Branches taken by the analysed paths, per target.
    internal_edges: HashMap<u64, u32>,
}

impl Walk<'_> {
    fn visit(&mut self, offset: u64, pushes: u32, length: usize) -> Result<(), PlacementRefusal> {
        let relative = offset.wrapping_sub(self.start);
        if offset < self.start || relative >= self.code.len() as u64 {
            return Err(PlacementRefusal::LeavesFunction { offset: relative });
        }
        if self.on_path.contains(&offset) {
            return Err(PlacementRefusal::Loop { offset: relative });
        }
        if length >= MAX_PATH_INSTRUCTIONS {
            return Err(PlacementRefusal::TooLong {
                limit: MAX_PATH_INSTRUCTIONS,
            });
        }
        match self.depth_at.get(&offset) {
            Some(&seen) if seen == pushes => return Ok(()), // a join already analysed
            Some(_) => {
                return Err(PlacementRefusal::DepthMismatch { offset: relative });
            }
            None => {}
        }
        self.depth_at.insert(offset, pushes);
        let bytes = &self.code[relative as usize..];
        let mut decoder = Decoder::with_ip(64, bytes, offset, DecoderOptions::NONE);
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            return Err(PlacementRefusal::Undecodable { offset: relative });
        }
        let raw = &bytes[..instruction.len()];
        if classify(raw).is_some_and(|class| self.cheap.contains(&class)) {
            self.points.insert(offset, pushes);
            return Ok(());
        }
        let what = At {
            mnemonic: format!("{:?}", instruction.mnemonic()).to_lowercase(),
            offset: relative,
        };
        let is_push = instruction.mnemonic() == iced_x86::Mnemonic::Push
            && instruction.op0_kind() == iced_x86::OpKind::Register;
        let flow = instruction.flow_control();
        if matches!(
            flow,
            FlowControl::Next | FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
        ) {
            self.check_writes(&instruction, is_push, &what)?;
        }
        let next = offset + instruction.len() as u64;
        self.on_path.insert(offset);
        let result = match flow {
            FlowControl::Next => self.visit(next, pushes + u32::from(is_push), length + 1),
            FlowControl::ConditionalBranch if direct_target(&instruction).is_some() => {
                let target = instruction.near_branch_target();
                *self.internal_edges.entry(target).or_insert(0) += 1;
                self.visit(target, pushes, length + 1)
                    .and_then(|()| self.visit(next, pushes, length + 1))
            }
            FlowControl::UnconditionalBranch if direct_target(&instruction).is_some() => {
                let target = instruction.near_branch_target();
                *self.internal_edges.entry(target).or_insert(0) += 1;
                self.visit(target, pushes, length + 1)
            }
            FlowControl::Return => Err(PlacementRefusal::Returns(what)),
            FlowControl::Call => Err(PlacementRefusal::Calls(what)),
            FlowControl::IndirectBranch | FlowControl::IndirectCall => {
                Err(PlacementRefusal::IndirectBranch(what))
            }
            _ => Err(PlacementRefusal::UnsupportedFlow(what)),
        };
        self.on_path.remove(&offset);
        result
    }

    /// Refuses writes to rdi or the stack pointer (pushes excepted) and
    /// stores through the stack pointer (they could hit the return address).
    fn check_writes(
        &mut self,
        instruction: &Instruction,
        is_push: bool,
        what: &At,
    ) -> Result<(), PlacementRefusal> {
        let info = self.factory.info(instruction);
        let writes = |access: OpAccess| {
            matches!(
                access,
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            )
        };
        for used in info.used_registers() {
            if !writes(used.access()) {
                continue;
            }
            match used.register().full_register() {
                Register::RDI => return Err(PlacementRefusal::WritesRdi(what.clone())),
                Register::RSP if !is_push => {
                    return Err(PlacementRefusal::MovesStackPointer(what.clone()));
                }
                _ => {}
            }
        }
        if !is_push {
            for memory in info.used_memory() {
                if writes(memory.access()) && memory.base().full_register() == Register::RSP {
                    return Err(PlacementRefusal::StoresOnStack(what.clone()));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[CheapClass] = KERNEL_EMULATED;

    fn points(code: &[u8], cheap: &[CheapClass]) -> Result<Vec<(u64, u32)>, PlacementRefusal> {
        analyse(code, 0x1000, cheap, None).map(|points| {
            points
                .iter()
                .map(|p| (p.file_offset - 0x1000, p.return_address_sp_offset))
                .collect()
        })
    }

    /// glibc 2.36 pthread_mutex_lock's first bytes: mov/mov/and/and, then jne.
    const GLIBC_MUTEX_LOCK: &[u8] = &[
        0x8b, 0x47, 0x10, // mov eax,[rdi+0x10]
        0x89, 0xc2, // mov edx,eax
        0x81, 0xe2, 0x7f, 0x01, 0x00, 0x00, // and edx,0x17f
        0x83, 0xe0, 0x7c, // and eax,0x7c
        0x75, 0x05, // jne +5
        0x53, // push rbx
        0x31, 0xc0, // xor eax,eax
        0xc3, // ret
        0x90, // nop
        0xc3, // ret
    ];

    #[test]
    fn first_cheap_instruction_on_the_only_path() {
        assert_eq!(points(GLIBC_MUTEX_LOCK, ALL), Ok(vec![(14, 0)]));
    }

    #[test]
    fn pushes_before_the_point_are_counted() {
        // Only nop cheap: push rbx, push r12 are stepped over, then nop.
        let code = [0x53, 0x41, 0x54, 0x90, 0xc3];
        assert_eq!(points(&code, &[CheapClass::Nop]), Ok(vec![(3, 16)]));
    }

    #[test]
    fn branches_are_followed_when_not_cheap() {
        // test edi,edi; je +2; push rbx; ret; push rbp; ret
        let code = [0x85, 0xff, 0x74, 0x02, 0x53, 0xc3, 0x55, 0xc3];
        assert_eq!(points(&code, &[CheapClass::Push]), Ok(vec![(4, 0), (6, 0)]));
    }

    #[test]
    fn unsafe_prologues_fall_back() {
        let writes_rdi = [0x48, 0x89, 0xc7, 0x53, 0xc3]; // mov rdi,rax; push rbx
        let refusal = |code: &[u8], cheap| points(code, cheap).unwrap_err();
        assert!(matches!(
            refusal(&writes_rdi, ALL),
            PlacementRefusal::WritesRdi(At { offset: 0, .. })
        ));
        let moves_sp = [0x48, 0x83, 0xec, 0x08, 0x53, 0xc3]; // sub rsp,8; push rbx
        assert!(matches!(
            refusal(&moves_sp, ALL),
            PlacementRefusal::MovesStackPointer(_)
        ));
        let indirect = [0xff, 0xe0, 0x53, 0xc3]; // jmp rax
        assert!(matches!(
            refusal(&indirect, ALL),
            PlacementRefusal::IndirectBranch(_)
        ));
        let returns = [0x31, 0xc0, 0xc3]; // xor eax,eax; ret
        assert_eq!(
            refusal(&returns, ALL).to_string(),
            "a path returns (ret at +0x2) before a cheap instruction"
        );
        // test edi,edi; je -4 (back to itself's start): loop when jcc is not cheap
        let looping = [0x85, 0xff, 0x74, 0xfc, 0x53, 0xc3];
        assert!(matches!(
            refusal(&looping, &[CheapClass::Push]),
            PlacementRefusal::Loop { offset: 0 }
        ));
    }

    #[test]
    fn a_point_reachable_from_elsewhere_is_refused() {
        // mov eax,[rdi]; push rbx; ...; jne back to the push (+2)
        let code = [0x8b, 0x07, 0x53, 0x85, 0xc0, 0x75, 0xfb, 0x5b, 0xc3];
        assert!(matches!(
            points(&code, ALL).unwrap_err(),
            PlacementRefusal::BranchTarget {
                offset: 2,
                from: Elsewhere::Function
            }
        ));
    }

    /// glibc 2.36+ pthread_spin_lock: `lock decl` at the entry, a retry
    /// loop (`pause; cmpl; jg`) back to it, one `ret`.
    const GLIBC_SPIN_LOCK: &[u8] = &[
        0xf0, 0xff, 0x0f, // lock decl [rdi]
        0x75, 0x0b, // jne +0x10
        0x31, 0xc0, // xor eax,eax
        0xc3, // ret
        0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00, // nopl
        0xf3, 0x90, // pause
        0x83, 0x3f, 0x00, // cmp dword [rdi],0
        0x7f, 0xe9, // jg entry
        0xeb, 0xf7, // jmp pause
    ];

    #[test]
    fn a_retry_loop_to_the_entry_is_probed_at_its_ret() {
        assert!(loops_to_entry(GLIBC_SPIN_LOCK, 0x1000));
        assert!(!loops_to_entry(GLIBC_MUTEX_LOCK, 0x1000));
        let at: Vec<(u64, u32)> = exits(GLIBC_SPIN_LOCK, 0x1000, None)
            .unwrap()
            .iter()
            .map(|p| (p.file_offset - 0x1000, p.return_address_sp_offset))
            .collect();
        assert_eq!(at, vec![(7, 0)]);
        // From the entry, auto placement would pick the jne the retries pass.
        assert_eq!(points(GLIBC_SPIN_LOCK, ALL), Ok(vec![(3, 0)]));
        // A loop that writes rdi (the lock argument) before its ret is refused.
        let writes_rdi = [0x48, 0xff, 0xc7, 0x75, 0xfb, 0xc3]; // inc rdi; jne entry; ret
        assert!(matches!(
            exits(&writes_rdi, 0x1000, None),
            Err(PlacementRefusal::WritesRdi(At { offset: 0, .. }))
        ));
    }

    #[test]
    fn classes() {
        assert_eq!(classify(&[0x41, 0x56]), Some(CheapClass::Push));
        assert_eq!(classify(&[0x66, 0x90]), Some(CheapClass::Nop));
        assert_eq!(
            classify(&[0x0f, 0x1f, 0x40, 0x00]),
            Some(CheapClass::NopMulti)
        );
        assert_eq!(
            classify(&[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00]),
            Some(CheapClass::NopMulti)
        );
        assert_eq!(classify(&[0x0f, 0x85, 0, 0, 0, 0]), Some(CheapClass::Jcc));
        assert_eq!(classify(&[0x48, 0x89, 0xc7]), None);
        assert_eq!(classify(&[0x66, 0xe8, 0, 0]), None);
    }
}
