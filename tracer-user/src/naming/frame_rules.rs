//! Call-frame rules given as DWARF expressions, evaluated within budgets
//! before the unwinder evaluates them (issue 52 J). framehop evaluates a
//! rule's expression with gimli and no step limit, so an expression that
//! loops (`DW_OP_skip` back onto itself) hung the unwinding thread, and with
//! it the end of the recording, which waits for that thread.
//!
//! When a module is added, the FDEs whose rules can be expressions are
//! found (few: PLT entries, signal frames, realigned stacks). A frame inside
//! one has its expressions evaluated here first, with the registers
//! framehop would give them, within [`EXPRESSION_STEPS`] each and
//! [`STACK_STEPS`] for the whole stack. A frame that does not fit ends its
//! stack with a [`StackEnd`]; one that fits is left to framehop, whose
//! evaluation of the same expression on the same values is the same
//! computation and takes no more steps.
use std::{
    collections::{HashMap, HashSet},
    ops::{Deref, Range},
    sync::Arc,
};

use gimli::{
    BaseAddresses, CallFrameInstruction, CallFrameInstructionIter, CfaRule, EndianSlice,
    EvaluationResult, Expression, LittleEndian, Operation, Reader, Register, RegisterRule,
    UnwindContext, UnwindSection, X86_64,
};

use crate::model::StackEnd;

/// Steps (operations evaluated) one expression may take: those compilers
/// emit (PLT entries, signal frames, realigned stacks) take a dozen or
/// fewer.
pub(crate) const EXPRESSION_STEPS: u32 = 256;
/// Steps one stack's expressions may take together (and one for each
/// FDE looked at), so a stack of many such frames stays cheap too.
pub(crate) const STACK_STEPS: u32 = 4096;

/// The registers framehop gives an expression on x86-64: the frame's
/// return-address column (its instruction pointer), `rsp` and `rbp`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Registers {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

impl Registers {
    fn get(&self, register: Register) -> Option<u64> {
        match register {
            X86_64::RA => Some(self.ip),
            X86_64::RSP => Some(self.sp),
            X86_64::RBP => Some(self.bp),
            _ => None,
        }
    }
}

/// Why an expression gave no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// It ran past the steps it was allowed.
    OutOfSteps,
    /// It needs what framehop does not give it (memory, another register)
    /// or does not parse: framehop's evaluation stops there too.
    Unevaluable,
}

/// Evaluates `expression` with `registers`, within `steps` operations.
pub(crate) fn evaluate<R: Reader>(
    expression: Expression<R>,
    encoding: gimli::Encoding,
    registers: Registers,
    steps: u32,
) -> Result<(), Stopped> {
    let mut evaluation = expression.evaluation(encoding);
    evaluation.set_max_iterations(steps);
    // gimli counts the steps across resumptions: this loop ends too.
    let mut result = evaluation.evaluate();
    loop {
        match result {
            Ok(EvaluationResult::Complete) => return Ok(()),
            Ok(EvaluationResult::RequiresRegister { register, .. }) => {
                let value = registers.get(register).ok_or(Stopped::Unevaluable)?;
                result = evaluation.resume_with_register(gimli::Value::Generic(value));
            }
            Ok(_) => return Err(Stopped::Unevaluable),
            Err(gimli::Error::TooManyIterations) => return Err(Stopped::OutOfSteps),
            Err(_) => return Err(Stopped::Unevaluable),
        }
    }
}

/// The most steps an evaluation allowed `allowed` can have taken: without
/// a branch each operation runs once at most; with one, all it was allowed
/// (gimli does not say how many it took).
fn steps_taken<R: Reader>(
    expression: &Expression<R>,
    encoding: gimli::Encoding,
    allowed: u32,
) -> u32 {
    let mut operations = expression.clone().operations(encoding);
    let mut count = 0;
    while let Ok(Some(operation)) = operations.next() {
        if matches!(operation, Operation::Skip { .. } | Operation::Bra { .. }) {
            return allowed;
        }
        count += 1;
        if count >= allowed {
            break;
        }
    }
    count
}

/// The steps left to one stack's expressions.
#[derive(Debug)]
pub(crate) struct Budget {
    left: u32,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget { left: STACK_STEPS }
    }
}

impl Budget {
    fn charge(&mut self, steps: u32) -> Result<(), StackEnd> {
        self.left = self.left.checked_sub(steps).ok_or(StackEnd::StackBudget)?;
        Ok(())
    }

    /// Evaluates one expression within what is left; charges what it took.
    fn evaluate<R: Reader>(
        &mut self,
        expression: Expression<R>,
        encoding: gimli::Encoding,
        registers: Registers,
    ) -> Result<(), StackEnd> {
        let allowed = self.left.min(EXPRESSION_STEPS);
        if allowed == 0 {
            return Err(StackEnd::StackBudget);
        }
        let taken = steps_taken(&expression, encoding, allowed);
        match evaluate(expression, encoding, registers, allowed) {
            Err(Stopped::OutOfSteps) if allowed < EXPRESSION_STEPS => Err(StackEnd::StackBudget),
            Err(Stopped::OutOfSteps) => Err(StackEnd::ExpressionBudget),
            Ok(()) | Err(Stopped::Unevaluable) => self.charge(taken),
        }
    }
}

/// Which call-frame section a table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TableKind {
    EhFrame,
    DebugFrame,
}

/// One call-frame table of a module, as framehop is given it: its bytes
/// and the base addresses its pointers are read with.
pub(crate) struct Table<B> {
    pub bytes: B,
    pub kind: TableKind,
    pub bases: BaseAddresses,
}

/// Evaluates `$body` with `$section` bound to `$table`'s section as gimli
/// reads it (`.eh_frame` and `.debug_frame` are types of their own).
macro_rules! with_section {
    ($table:expr, |$section:ident| $body:expr) => {
        match $table.kind {
            TableKind::EhFrame => {
                let mut $section = gimli::EhFrame::new(&$table.bytes, LittleEndian);
                $section.set_address_size(8);
                $body
            }
            TableKind::DebugFrame => {
                let mut $section = gimli::DebugFrame::new(&$table.bytes, LittleEndian);
                $section.set_address_size(8);
                $body
            }
        }
    };
}

/// An FDE whose rules can be expressions, where it is loaded.
struct ExpressionFde<B> {
    avma: Range<u64>,
    /// Load address minus link-time address.
    bias: u64,
    offset: usize,
    table: Arc<Table<B>>,
}

/// The FDEs of the modules added so far whose rules can be expressions.
pub(crate) struct ExpressionRules<B> {
    /// Sorted by start.
    fdes: Vec<ExpressionFde<B>>,
    /// `reach[i]`: the greatest end of `fdes[..=i]`, where a search back
    /// from an address stops.
    reach: Vec<u64>,
    context: UnwindContext<usize>,
}

impl<B: Deref<Target = [u8]>> Default for ExpressionRules<B> {
    fn default() -> Self {
        ExpressionRules {
            fdes: Vec::new(),
            reach: Vec::new(),
            context: UnwindContext::new(),
        }
    }
}

impl<B: Deref<Target = [u8]>> ExpressionRules<B> {
    /// Adds the FDEs of `table` (with `hdr`, its `.eh_frame_hdr`, whose
    /// index framehop looks FDEs up in) whose rules can be expressions,
    /// those inside `avma` once loaded at `bias`.
    pub(crate) fn add(&mut self, table: Table<B>, hdr: Option<&[u8]>, avma: Range<u64>, bias: u64) {
        let indexed = match (table.kind, hdr) {
            (TableKind::EhFrame, Some(hdr)) => hdr_offsets(hdr, &table.bases),
            _ => Vec::new(),
        };
        let found = with_section!(table, |section| expression_fdes(
            &section,
            &table.bases,
            indexed
        ));
        if found.is_empty() {
            return;
        }
        let table = Arc::new(table);
        for (svma, offset) in found {
            let (Some(start), Some(end)) =
                (svma.start.checked_add(bias), svma.end.checked_add(bias))
            else {
                continue;
            };
            let (start, end) = (start.max(avma.start), end.min(avma.end));
            if start < end {
                self.fdes.push(ExpressionFde {
                    avma: start..end,
                    bias,
                    offset,
                    table: Arc::clone(&table),
                });
            }
        }
        self.fdes.sort_by_key(|fde| fde.avma.start);
        let mut reach = 0;
        self.reach = self
            .fdes
            .iter()
            .map(|fde| {
                reach = reach.max(fde.avma.end);
                reach
            })
            .collect();
    }

    /// Evaluates the expressions of the rules at `address` (a frame's
    /// lookup address: its instruction pointer, or its return address
    /// less one) with `registers`, within `budget`; Err when they do not
    /// fit, and the stack must end before framehop evaluates them.
    pub(crate) fn check(
        &mut self,
        address: u64,
        registers: Registers,
        budget: &mut Budget,
    ) -> Result<(), StackEnd> {
        let end = self.fdes.partition_point(|fde| fde.avma.start <= address);
        for index in (0..end).rev() {
            if self.reach[index] <= address {
                break;
            }
            let fde = &self.fdes[index];
            if fde.avma.end <= address {
                continue;
            }
            // Every FDE looked at costs a step, so a pile of overlapping
            // ones ends the stack too.
            budget.charge(1)?;
            let svma = address - fde.bias;
            let (table, context) = (&fde.table, &mut self.context);
            with_section!(table, |section| check_fde(
                &section,
                &table.bases,
                fde.offset,
                svma,
                (registers, budget, context),
            ))?;
        }
        Ok(())
    }
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// Evaluates the expressions of the CFA, frame pointer and return address
/// rules of the FDE at `offset` at `svma`, as framehop would (the same
/// FDE parse and row). An FDE or row that does not parse is framehop's
/// to give up on.
fn check_fde<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    offset: usize,
    svma: u64,
    (registers, budget, context): (Registers, &mut Budget, &mut UnwindContext<usize>),
) -> Result<(), StackEnd> {
    let Ok(fde) = section.fde_from_offset(bases, S::Offset::from(offset), S::cie_from_offset)
    else {
        return Ok(());
    };
    let Ok(row) = fde.unwind_info_for_address(section, bases, context, svma) else {
        return Ok(());
    };
    let cfa = match row.cfa() {
        CfaRule::Expression(expression) => Some(*expression),
        CfaRule::RegisterAndOffset { .. } => None,
    };
    let rule = |register| match row.register(register) {
        Some(RegisterRule::Expression(expression) | RegisterRule::ValExpression(expression)) => {
            Some(expression)
        }
        _ => None,
    };
    let expressions = [cfa, rule(X86_64::RBP), rule(X86_64::RA)];
    let encoding = fde.cie().encoding();
    for expression in expressions.into_iter().flatten() {
        if let Ok(expression) = expression.get(section) {
            budget.evaluate(expression, encoding, registers)?;
        }
    }
    Ok(())
}

/// The offsets of the FDEs an `.eh_frame_hdr` indexes (framehop looks
/// FDEs up there when a module has one, which a hostile file can point
/// past what a walk of `.eh_frame` reaches).
fn hdr_offsets(hdr: &[u8], bases: &BaseAddresses) -> Vec<usize> {
    let Ok(parsed) = gimli::EhFrameHdr::new(hdr, LittleEndian).parse(bases, 8) else {
        return Vec::new();
    };
    let Some(table) = parsed.table() else {
        return Vec::new();
    };
    let mut offsets = Vec::new();
    let mut entries = table.iter(bases);
    while let Ok(Some((_, pointer))) = entries.next() {
        if let Ok(offset) = table.pointer_to_offset(pointer) {
            offsets.push(offset.0);
        }
    }
    offsets
}

/// The link-time ranges and offsets of the FDEs of `section` (walked, and
/// at `indexed`) whose instructions, or their CIE's, give the CFA, the
/// frame pointer or the return address by an expression.
fn expression_fdes<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    indexed: Vec<usize>,
) -> Vec<(Range<u64>, usize)> {
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    let mut cies: HashMap<usize, bool> = HashMap::new();
    let mut take = |fde: gimli::FrameDescriptionEntry<Slice<'a>>| {
        let offset = fde.offset();
        if !seen.insert(offset) {
            return;
        }
        let cie = fde.cie();
        let in_cie = *cies
            .entry(cie.offset())
            .or_insert_with(|| gives_expressions(cie.instructions(section, bases)));
        if in_cie || gives_expressions(fde.instructions(section, bases)) {
            found.push((fde.initial_address()..fde.end_address(), offset));
        }
    };
    let mut entries = section.entries(bases);
    while let Ok(Some(entry)) = entries.next() {
        if let gimli::CieOrFde::Fde(partial) = entry
            && let Ok(fde) = partial.parse(S::cie_from_offset)
        {
            take(fde);
        }
    }
    for offset in indexed {
        if let Ok(fde) = section.fde_from_offset(bases, S::Offset::from(offset), S::cie_from_offset)
        {
            take(fde);
        }
    }
    found
}

/// True when the instructions set the CFA, the frame pointer or the return
/// address by an expression (the rules framehop evaluates). Instructions
/// past one that does not parse are never reached, by gimli either.
fn gives_expressions(mut instructions: CallFrameInstructionIter<Slice<'_>>) -> bool {
    let used = |register: Register| register == X86_64::RBP || register == X86_64::RA;
    while let Ok(Some(instruction)) = instructions.next() {
        match instruction {
            CallFrameInstruction::DefCfaExpression { .. } => return true,
            CallFrameInstruction::Expression { register, .. }
            | CallFrameInstruction::ValExpression { register, .. }
                if used(register) =>
            {
                return true;
            }
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use gimli::{EndianSlice, Expression, LittleEndian};

    use super::*;

    const ENCODING: gimli::Encoding = gimli::Encoding {
        format: gimli::Format::Dwarf64,
        version: 4,
        address_size: 8,
    };
    const REGISTERS: Registers = Registers {
        ip: 0x40_1000,
        sp: 0x7ffc_0000_1000,
        bp: 0,
    };
    /// How long a bounded evaluation may take here (a debug build on a
    /// loaded machine): a looping one never ends without the bound.
    const QUICKLY: Duration = Duration::from_secs(1);

    fn expression(bytes: &[u8]) -> Expression<EndianSlice<'_, LittleEndian>> {
        Expression(EndianSlice::new(bytes, LittleEndian))
    }

    /// `DW_OP_skip -3` (its target is its own first byte) and
    /// `DW_OP_lit1; DW_OP_bra -4` (back to the `lit1`, always taken) loop
    /// forever: each ends out of steps, within its budget, at once.
    #[test]
    fn looping_expressions_end_out_of_steps() {
        for bytes in [&[0x2f, 0xfd, 0xff][..], &[0x31, 0x28, 0xfc, 0xff][..]] {
            let started = Instant::now();
            let result = evaluate(expression(bytes), ENCODING, REGISTERS, EXPRESSION_STEPS);
            assert_eq!(result, Err(Stopped::OutOfSteps), "{bytes:x?}");
            assert!(
                started.elapsed() < QUICKLY,
                "{bytes:x?}: {:?}",
                started.elapsed()
            );
            // As a frame's rule: the expression's budget ends the stack.
            let mut budget = Budget::default();
            assert_eq!(
                budget.evaluate(expression(bytes), ENCODING, REGISTERS),
                Err(StackEnd::ExpressionBudget)
            );
        }
    }

    /// glibc's PLT rule (`rsp + 8`, plus 8 past the PLT entry's push)
    /// evaluates, and is charged its nine operations; a loop that ends
    /// (`DW_OP_lit3`, then subtract one until zero) evaluates within its
    /// steps; one needing memory or another register is framehop's to give
    /// up on.
    #[test]
    fn real_expressions_evaluate_and_are_charged() {
        let plt = [
            0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        let mut budget = Budget::default();
        assert_eq!(
            budget.evaluate(expression(&plt), ENCODING, REGISTERS),
            Ok(())
        );
        assert_eq!(budget.left, STACK_STEPS - 9);
        // lit3; loop: lit1; minus; dup; bra loop (-6); drop (the 0); breg7 0.
        let counted = [0x33, 0x31, 0x1c, 0x12, 0x28, 0xfa, 0xff, 0x13, 0x77, 0x00];
        assert_eq!(
            evaluate(expression(&counted), ENCODING, REGISTERS, 32),
            Ok(())
        );
        assert_eq!(
            budget.evaluate(expression(&counted), ENCODING, REGISTERS),
            Ok(())
        );
        assert_eq!(budget.left, STACK_STEPS - 9 - EXPRESSION_STEPS);
        // breg7 0; deref.
        let memory = [0x77, 0x00, 0x06];
        assert_eq!(
            evaluate(expression(&memory), ENCODING, REGISTERS, EXPRESSION_STEPS),
            Err(Stopped::Unevaluable)
        );
        // breg3 (rbx) 0.
        assert_eq!(
            evaluate(
                expression(&[0x73, 0x00]),
                ENCODING,
                REGISTERS,
                EXPRESSION_STEPS
            ),
            Err(Stopped::Unevaluable)
        );
    }

    /// A stack's expressions share its budget: once it runs low, a looping
    /// expression ends the stack for the stack's budget, and then any.
    #[test]
    fn a_stack_runs_out_of_steps_as_a_whole() {
        let skip = [0x2f, 0xfd, 0xff];
        let mut budget = Budget {
            left: EXPRESSION_STEPS / 2,
        };
        assert_eq!(
            budget.evaluate(expression(&skip), ENCODING, REGISTERS),
            Err(StackEnd::StackBudget)
        );
        let mut budget = Budget { left: 0 };
        assert_eq!(
            budget.evaluate(expression(&[0x77, 0x00]), ENCODING, REGISTERS),
            Err(StackEnd::StackBudget)
        );
        // Expressions with a branch are charged all they were allowed:
        // 16 of them fill a stack's budget.
        let counted = [0x33, 0x31, 0x1c, 0x12, 0x28, 0xfa, 0xff, 0x13, 0x77, 0x00];
        let started = Instant::now();
        let mut budget = Budget::default();
        let mut evaluated = 0;
        let end = loop {
            match budget.evaluate(expression(&counted), ENCODING, REGISTERS) {
                Ok(()) => evaluated += 1,
                Err(end) => break end,
            }
        };
        assert_eq!(end, StackEnd::StackBudget);
        assert_eq!(evaluated, STACK_STEPS / EXPRESSION_STEPS);
        assert!(started.elapsed() < QUICKLY);
    }
}
