//! Whether a seccomp filter of the target would stop the syscalls
//! `--mode inproc` injects (issue 52 C: a target whose filter kills or
//! traps `mmap`/`mprotect` died of SIGSYS when locktrace wrote into it).
//!
//! Decided before anything is injected: the stopped thread's filters are
//! read through ptrace and run here, in an evaluator of seccomp's classic
//! BPF, on each call locktrace may make. Only ALLOW (or LOG) for every
//! call lets the injection go on; any other action refuses in one line.
//!
//! Values not known before the calls run (the address the kernel picks
//! for the mapping, the code address inside it) are unknown words: a
//! comparison on one takes both branches, so the verdict covers every
//! value they may have.
use std::fmt;

use nix::errno::Errno;

use super::{inject, layout};

/// `seccomp_data.arch` of a 64-bit x86 process (linux/audit.h).
pub(crate) const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
/// linux/ptrace.h; not in the libc crate.
const PTRACE_SECCOMP_GET_FILTER: libc::c_uint = 0x420c;
/// The kernel's bounds: instructions per filter, scratch words.
const MAX_INSNS: usize = libc::BPF_MAXINSNS as usize;
const MEMWORDS: usize = libc::BPF_MEMWORDS as usize;
/// `sizeof(struct seccomp_data)`: what `BPF_LEN` loads.
const DATA_BYTES: u32 = 64;
/// A thread's filters are limited to 32768 instructions in all, each
/// counted with 4 more: fewer than this many filters.
const MAX_FILTERS: usize = 8192;
/// Paths through one filter when unknown words fork it.
const MAX_PATHS: usize = 4096;

#[cfg(test)]
/// `struct seccomp_data`, what a filter reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SeccompData {
    pub nr: i32,
    pub arch: u32,
    pub instruction_pointer: u64,
    pub args: [u64; 6],
}

/// Why a program cannot be run: the kernel would have refused it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EvalError {
    #[error("empty program")]
    Empty,
    #[error("{0} instructions, more than the kernel's {MAX_INSNS}")]
    TooLong(usize),
    #[error("instruction {pc}: opcode {code:#06x} is not in seccomp's classic BPF")]
    Opcode { pc: usize, code: u16 },
    #[error("instruction {pc}: load at byte {offset}, outside seccomp_data or not 4-byte aligned")]
    Load { pc: usize, offset: u32 },
    #[error("instruction {pc}: jump past the end of the program")]
    Jump { pc: usize },
    #[error("instruction {pc}: scratch word M[{slot}] does not exist")]
    Scratch { pc: usize, slot: u32 },
    #[error("instruction {pc}: scratch word M[{slot}] read before it was written")]
    Unwritten { pc: usize, slot: usize },
    #[error("instruction {pc}: division by the constant 0")]
    DivideByZero { pc: usize },
    #[error("instruction {pc}: shift by {k}, more than 31")]
    Shift { pc: usize, k: u32 },
    #[error("the last instruction does not return")]
    NoReturn,
    #[error("more than {MAX_PATHS} paths through the program")]
    TooManyPaths,
}

/// Where an ALU or jump instruction takes its second operand.
#[derive(Debug, Clone, Copy)]
enum Src {
    K(u32),
    X,
}

#[derive(Debug, Clone, Copy)]
enum AluOp {
    Add,
    Sub,
    Mul,
    Div,
    Or,
    And,
    Lsh,
    Rsh,
    Mod,
    Xor,
}

#[derive(Debug, Clone, Copy)]
enum Cond {
    Eq,
    Gt,
    Ge,
    Set,
}

/// One decoded instruction; jump targets are absolute and in range.
#[derive(Debug, Clone, Copy)]
enum Insn {
    /// A = the data word at this index.
    LoadData(usize),
    LoadA(u32),
    LoadX(u32),
    LoadMemA(usize),
    LoadMemX(usize),
    StoreA(usize),
    StoreX(usize),
    Alu(AluOp, Src),
    Neg,
    Goto(usize),
    Jump {
        cond: Cond,
        src: Src,
        yes: usize,
        no: usize,
    },
    ReturnK(u32),
    ReturnA,
    Tax,
    Txa,
}

/// Opcodes as `sock_filter.code` holds them.
const fn op16(bits: u32) -> u16 {
    bits as u16
}
const LD_W_ABS: u16 = op16(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS);
const LD_W_LEN: u16 = op16(libc::BPF_LD | libc::BPF_W | libc::BPF_LEN);
const LDX_W_LEN: u16 = op16(libc::BPF_LDX | libc::BPF_W | libc::BPF_LEN);
const LD_IMM: u16 = op16(libc::BPF_LD | libc::BPF_W | libc::BPF_IMM);
const LDX_IMM: u16 = op16(libc::BPF_LDX | libc::BPF_W | libc::BPF_IMM);
const LD_MEM: u16 = op16(libc::BPF_LD | libc::BPF_W | libc::BPF_MEM);
const LDX_MEM: u16 = op16(libc::BPF_LDX | libc::BPF_W | libc::BPF_MEM);
const ST: u16 = op16(libc::BPF_ST);
const STX: u16 = op16(libc::BPF_STX);
const NEG: u16 = op16(libc::BPF_ALU | libc::BPF_NEG);
const JA: u16 = op16(libc::BPF_JMP | libc::BPF_JA);
const RET_K: u16 = op16(libc::BPF_RET | libc::BPF_K);
const RET_A: u16 = op16(libc::BPF_RET | libc::BPF_A);
const TAX: u16 = op16(libc::BPF_MISC | libc::BPF_TAX);
const TXA: u16 = op16(libc::BPF_MISC | libc::BPF_TXA);
const ALU: u16 = op16(libc::BPF_ALU);
const JMP: u16 = op16(libc::BPF_JMP);

/// Decodes `program` as the kernel checks it at attach time
/// (`bpf_check_classic`, `seccomp_check_filter`): every instruction, not
/// only those a run reaches.
fn decode(program: &[libc::sock_filter]) -> Result<Vec<Insn>, EvalError> {
    if program.is_empty() {
        return Err(EvalError::Empty);
    }
    if program.len() > MAX_INSNS {
        return Err(EvalError::TooLong(program.len()));
    }
    let decoded = program
        .iter()
        .enumerate()
        .map(|(pc, insn)| decode_one(pc, insn, program.len()))
        .collect::<Result<Vec<_>, _>>()?;
    match decoded.last() {
        Some(Insn::ReturnK(_) | Insn::ReturnA) => Ok(decoded),
        _ => Err(EvalError::NoReturn),
    }
}

fn decode_one(pc: usize, insn: &libc::sock_filter, len: usize) -> Result<Insn, EvalError> {
    let k = insn.k;
    let slot = |k: u32| {
        ((k as usize) < MEMWORDS)
            .then_some(k as usize)
            .ok_or(EvalError::Scratch { pc, slot: k })
    };
    // Classic jumps go forward only, and never past the last instruction.
    let target = |offset: u32| {
        (pc + 1)
            .checked_add(offset as usize)
            .filter(|&to| to < len)
            .ok_or(EvalError::Jump { pc })
    };
    Ok(match insn.code {
        LD_W_ABS if k < DATA_BYTES && k.is_multiple_of(4) => Insn::LoadData(k as usize / 4),
        LD_W_ABS => return Err(EvalError::Load { pc, offset: k }),
        LD_W_LEN => Insn::LoadA(DATA_BYTES),
        LDX_W_LEN => Insn::LoadX(DATA_BYTES),
        LD_IMM => Insn::LoadA(k),
        LDX_IMM => Insn::LoadX(k),
        LD_MEM => Insn::LoadMemA(slot(k)?),
        LDX_MEM => Insn::LoadMemX(slot(k)?),
        ST => Insn::StoreA(slot(k)?),
        STX => Insn::StoreX(slot(k)?),
        NEG => Insn::Neg,
        JA => Insn::Goto(target(k)?),
        RET_K => Insn::ReturnK(k),
        RET_A => Insn::ReturnA,
        TAX => Insn::Tax,
        TXA => Insn::Txa,
        code => return decode_alu_or_jump(pc, insn, code, target),
    })
}

/// `BPF_ALU` and conditional `BPF_JMP` with a K or X operand
/// (`BPF_MOD` too, which classic BPF has though seccomp refuses it).
fn decode_alu_or_jump(
    pc: usize,
    insn: &libc::sock_filter,
    code: u16,
    target: impl Fn(u32) -> Result<usize, EvalError>,
) -> Result<Insn, EvalError> {
    let bad = EvalError::Opcode { pc, code };
    let (class, op, x) = (code & 0x07, code & 0xf0, code & 0x08 != 0);
    // Nothing but class, operation and source.
    if code & !0xff != 0 || (class != ALU && class != JMP) {
        return Err(bad);
    }
    let src = if x { Src::X } else { Src::K(insn.k) };
    if class == JMP {
        let cond = match u32::from(op) {
            libc::BPF_JEQ => Cond::Eq,
            libc::BPF_JGT => Cond::Gt,
            libc::BPF_JGE => Cond::Ge,
            libc::BPF_JSET => Cond::Set,
            _ => return Err(bad),
        };
        let yes = target(u32::from(insn.jt))?;
        let no = target(u32::from(insn.jf))?;
        return Ok(Insn::Jump { cond, src, yes, no });
    }
    let alu = match u32::from(op) {
        libc::BPF_ADD => AluOp::Add,
        libc::BPF_SUB => AluOp::Sub,
        libc::BPF_MUL => AluOp::Mul,
        libc::BPF_DIV => AluOp::Div,
        libc::BPF_OR => AluOp::Or,
        libc::BPF_AND => AluOp::And,
        libc::BPF_LSH => AluOp::Lsh,
        libc::BPF_RSH => AluOp::Rsh,
        libc::BPF_MOD => AluOp::Mod,
        libc::BPF_XOR => AluOp::Xor,
        _ => return Err(bad),
    };
    match (alu, src) {
        (AluOp::Div | AluOp::Mod, Src::K(0)) => Err(EvalError::DivideByZero { pc }),
        (AluOp::Lsh | AluOp::Rsh, Src::K(k)) if k >= 32 => Err(EvalError::Shift { pc, k }),
        _ => Ok(Insn::Alu(alu, src)),
    }
}

/// A 32-bit word of the machine; None: not known before the call runs.
type Word = Option<u32>;

/// `seccomp_data` as the 16 words `BPF_LD|BPF_W|BPF_ABS` reads (x86-64
/// is little-endian: a 64-bit field's low half first).
fn data_words(nr: i32, arch: u32, ip: Option<u64>, args: &[Option<u64>; 6]) -> [Word; 16] {
    let mut words = [None; 16];
    words[0] = Some(nr as u32);
    words[1] = Some(arch);
    let mut put = |at: usize, value: Option<u64>| {
        words[at] = value.map(|v| v as u32);
        words[at + 1] = value.map(|v| (v >> 32) as u32);
    };
    put(2, ip);
    for (i, &arg) in args.iter().enumerate() {
        put(4 + 2 * i, arg);
    }
    words
}

/// One path's registers and scratch memory.
#[derive(Debug, Clone)]
struct State {
    pc: usize,
    a: Word,
    x: Word,
    memory: [Word; MEMWORDS],
    written: [bool; MEMWORDS],
}

/// What an instruction leaves to do.
enum Next {
    Continue,
    /// The other branch of a jump on an unknown word.
    Fork(State),
    /// A division by an unknown X: the program returns 0 if it is 0.
    MaybeZero,
    Return(Word),
}

/// Every value `program` may return on `data`, a path each (one when
/// every word is known).
fn run(program: &[Insn], data: &[Word; 16]) -> Result<Vec<Word>, EvalError> {
    let mut pending = vec![State {
        pc: 0,
        a: Some(0),
        x: Some(0),
        memory: [None; MEMWORDS],
        written: [false; MEMWORDS],
    }];
    let mut paths = 1;
    let mut returned = Vec::new();
    while let Some(mut state) = pending.pop() {
        loop {
            // The last instruction returns and jumps stay inside: a path
            // ends within `program.len()` steps.
            let insn = program.get(state.pc).ok_or(EvalError::NoReturn)?;
            match step(*insn, &mut state, data)? {
                Next::Continue => continue,
                Next::Fork(other) => pending.push(other),
                Next::MaybeZero => returned.push(Some(0)),
                Next::Return(value) => {
                    returned.push(value);
                    break;
                }
            }
            paths += 1;
            if paths > MAX_PATHS {
                return Err(EvalError::TooManyPaths);
            }
        }
    }
    Ok(returned)
}

fn step(insn: Insn, s: &mut State, data: &[Word; 16]) -> Result<Next, EvalError> {
    let pc = s.pc;
    s.pc += 1;
    let read = |s: &State, slot: usize| match (s.written.get(slot), s.memory.get(slot)) {
        (Some(true), Some(&value)) => Ok(value),
        _ => Err(EvalError::Unwritten { pc, slot }),
    };
    let write = |s: &mut State, slot: usize, value: Word| {
        if let (Some(cell), Some(written)) = (s.memory.get_mut(slot), s.written.get_mut(slot)) {
            *cell = value;
            *written = true;
        }
    };
    match insn {
        Insn::LoadData(at) => s.a = data.get(at).copied().flatten(),
        Insn::LoadA(k) => s.a = Some(k),
        Insn::LoadX(k) => s.x = Some(k),
        Insn::LoadMemA(slot) => s.a = read(s, slot)?,
        Insn::LoadMemX(slot) => s.x = read(s, slot)?,
        Insn::StoreA(slot) => write(s, slot, s.a),
        Insn::StoreX(slot) => write(s, slot, s.x),
        Insn::Neg => s.a = s.a.map(u32::wrapping_neg),
        Insn::Tax => s.x = s.a,
        Insn::Txa => s.a = s.x,
        Insn::Goto(to) => s.pc = to,
        Insn::ReturnK(k) => return Ok(Next::Return(Some(k))),
        Insn::ReturnA => return Ok(Next::Return(s.a)),
        Insn::Alu(op, src) => {
            let b = operand(src, s);
            if matches!(op, AluOp::Div | AluOp::Mod) {
                match b {
                    // The kernel's converted program returns 0 here.
                    Some(0) => return Ok(Next::Return(Some(0))),
                    None => {
                        s.a = None;
                        return Ok(Next::MaybeZero);
                    }
                    Some(_) => {}
                }
            }
            s.a = s.a.zip(b).map(|(a, b)| alu(op, a, b));
        }
        Insn::Jump { cond, src, yes, no } => match (s.a, operand(src, s)) {
            (Some(a), Some(b)) => s.pc = if test(cond, a, b) { yes } else { no },
            _ if yes == no => s.pc = yes,
            _ => {
                let mut other = s.clone();
                other.pc = no;
                s.pc = yes;
                return Ok(Next::Fork(other));
            }
        },
    }
    Ok(Next::Continue)
}

fn operand(src: Src, s: &State) -> Word {
    match src {
        Src::K(k) => Some(k),
        Src::X => s.x,
    }
}

/// Shifts take the count modulo 32, as the kernel's interpreter and JIT.
fn alu(op: AluOp, a: u32, b: u32) -> u32 {
    match op {
        AluOp::Add => a.wrapping_add(b),
        AluOp::Sub => a.wrapping_sub(b),
        AluOp::Mul => a.wrapping_mul(b),
        AluOp::Div => a.checked_div(b).unwrap_or(0),
        AluOp::Mod => a.checked_rem(b).unwrap_or(0),
        AluOp::Or => a | b,
        AluOp::And => a & b,
        AluOp::Xor => a ^ b,
        AluOp::Lsh => a.wrapping_shl(b),
        AluOp::Rsh => a.wrapping_shr(b),
    }
}

fn test(cond: Cond, a: u32, b: u32) -> bool {
    match cond {
        Cond::Eq => a == b,
        Cond::Gt => a > b,
        Cond::Ge => a >= b,
        Cond::Set => a & b != 0,
    }
}

#[cfg(test)]
/// Runs a seccomp program on `data`: the value it returns (action and
/// data), or why the kernel would not have taken the program.
pub(crate) fn evaluate(
    program: &[libc::sock_filter],
    data: &SeccompData,
) -> Result<u32, EvalError> {
    let program = decode(program)?;
    let args = data.args.map(Some);
    let words = data_words(data.nr, data.arch, Some(data.instruction_pointer), &args);
    // Every word known: one path.
    run(&program, &words)?
        .first()
        .copied()
        .flatten()
        .ok_or(EvalError::NoReturn)
}

/// What seccomp does with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    KillProcess,
    KillThread,
    Trap,
    Errno(u16),
    UserNotif,
    Trace,
    Log,
    Allow,
    /// An action value the kernel does not know: it kills the process.
    Unknown(u32),
}

impl Action {
    pub(crate) fn from_ret(ret: u32) -> Action {
        match ret & libc::SECCOMP_RET_ACTION_FULL {
            libc::SECCOMP_RET_KILL_PROCESS => Action::KillProcess,
            libc::SECCOMP_RET_KILL_THREAD => Action::KillThread,
            libc::SECCOMP_RET_TRAP => Action::Trap,
            libc::SECCOMP_RET_ERRNO => Action::Errno((ret & libc::SECCOMP_RET_DATA) as u16),
            libc::SECCOMP_RET_USER_NOTIF => Action::UserNotif,
            libc::SECCOMP_RET_TRACE => Action::Trace,
            libc::SECCOMP_RET_LOG => Action::Log,
            libc::SECCOMP_RET_ALLOW => Action::Allow,
            _ => Action::Unknown(ret),
        }
    }

    /// The call goes through as if there were no filter.
    pub(crate) fn lets_through(self) -> bool {
        matches!(self, Action::Allow | Action::Log)
    }
}

/// The kernel's order between filters (`seccomp_run_filters`): the
/// lowest wins, compared as a signed number (KILL_PROCESS is negative).
fn precedence(ret: u32) -> i32 {
    (ret & libc::SECCOMP_RET_ACTION_FULL) as i32
}

#[cfg(test)]
/// What the filters together do with `data`: all run, the lowest
/// precedence wins (the newest filter on a tie: `filters` newest first,
/// as `read_filters` returns them).
pub(crate) fn verdict(
    filters: &[Vec<libc::sock_filter>],
    data: &SeccompData,
) -> Result<Action, EvalError> {
    let mut ret = libc::SECCOMP_RET_ALLOW;
    for filter in filters {
        let value = evaluate(filter, data)?;
        if precedence(value) < precedence(ret) {
            ret = value;
        }
    }
    Ok(Action::from_ret(ret))
}

/// The thread's seccomp mode (`Seccomp:` in its status): 0 none, 1
/// strict, 2 filter. None: no such line (a kernel without seccomp) or no
/// such thread.
pub(crate) fn mode(pid: u32, tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    parse_mode(&status)
}

fn parse_mode(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Seccomp:"))?
        .trim()
        .parse()
        .ok()
}

/// Why a thread's filters could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReadError {
    #[error(
        "this kernel does not show seccomp filters (PTRACE_SECCOMP_GET_FILTER needs CONFIG_CHECKPOINT_RESTORE)"
    )]
    NotShown,
    #[error("reading seccomp filters needs CAP_SYS_ADMIN, and locktrace not itself under seccomp")]
    NotPermitted,
    #[error("the thread is not stopped under locktrace's ptrace")]
    NotStopped,
    #[error("a filter is not classic BPF")]
    NotClassic,
    #[error("the kernel said filter {index} has {count} instructions")]
    BadLength { index: usize, count: i64 },
    #[error("more than {MAX_FILTERS} filters")]
    TooMany,
    #[error("PTRACE_SECCOMP_GET_FILTER failed: {0}")]
    Other(Errno),
}

/// The classic BPF programs of thread `tid`'s seccomp filters, newest
/// first (the order the kernel runs them in). The caller must hold `tid`
/// ptrace-stopped: the kernel shows the filters of a stopped tracee only.
pub(crate) fn read_filters(tid: u32) -> Result<Vec<Vec<libc::sock_filter>>, ReadError> {
    let empty = libc::sock_filter {
        code: 0,
        jt: 0,
        jf: 0,
        k: 0,
    };
    let mut filters = Vec::new();
    for index in 0..MAX_FILTERS {
        // Room for the largest filter, in one call: asking the length
        // first (a NULL buffer) would race a filter another thread adds
        // meanwhile with TSYNC, which shifts the indexes, and the kernel
        // would write past a buffer of the first answer's length.
        let mut buffer = vec![empty; MAX_INSNS];
        // SAFETY: the buffer holds MAX_INSNS instructions, the most one
        // filter can have; `addr` is an index, not a pointer.
        let count = unsafe {
            libc::ptrace(
                PTRACE_SECCOMP_GET_FILTER,
                tid as libc::pid_t,
                index as *mut libc::c_void,
                buffer.as_mut_ptr() as *mut libc::c_void,
            )
        };
        if count < 0 {
            return match Errno::last() {
                Errno::ENOENT => Ok(filters),
                Errno::EINVAL => Err(ReadError::NotShown),
                Errno::EACCES | Errno::EPERM => Err(ReadError::NotPermitted),
                Errno::ESRCH => Err(ReadError::NotStopped),
                Errno::EMEDIUMTYPE => Err(ReadError::NotClassic),
                other => Err(ReadError::Other(other)),
            };
        }
        if count == 0 || count as usize > MAX_INSNS {
            return Err(ReadError::BadLength {
                index,
                count: count as i64,
            });
        }
        buffer.truncate(count as usize);
        filters.push(buffer);
    }
    Err(ReadError::TooMany)
}

/// A syscall locktrace makes the stopped thread execute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InjectedCall {
    /// Its name, for the refusal.
    pub name: &'static str,
    pub nr: i32,
    /// None: not known before it runs (an address the kernel picks).
    pub args: [Option<u64>; 6],
    /// What seccomp may see as `instruction_pointer` (the address after
    /// the `syscall` instruction); None: somewhere in locktrace's own
    /// mapping, not known in advance.
    pub instruction_pointers: Vec<Option<u64>>,
}

/// The calls `session` injects through the `syscall` instruction at
/// `syscall_at` in the target's code: with `new_mapping` (its size), the
/// `mmap` of locktrace's mapping and the `mprotect` of its code; always
/// the `mprotect` of a `-z now` GOT page to read-write and back to
/// read-only (RELRO), and what code run in the mapping may call.
pub(crate) fn injected_calls(
    syscall_at: Option<u64>,
    new_mapping: Option<u64>,
) -> Vec<InjectedCall> {
    // seccomp sees the address after the instruction.
    calls(syscall_at.map(|at| at + 2), new_mapping.map(Some))
}

/// `injected_calls` with what may not be known yet unknown: `in_code`,
/// the address after the `syscall` instruction in the target's code;
/// `new_mapping` `Some(None)`, a new mapping of a size not known.
fn calls(in_code: Option<u64>, new_mapping: Option<Option<u64>>) -> Vec<InjectedCall> {
    let call = |name, nr: libc::c_long, args, instruction_pointers| InjectedCall {
        name,
        nr: nr as i32,
        args,
        instruction_pointers,
    };
    let known = |args: [u64; 6]| args.map(Some);
    let (read, write, exec) = (
        libc::PROT_READ as u64,
        libc::PROT_WRITE as u64,
        libc::PROT_EXEC as u64,
    );
    let mut calls = Vec::new();
    if let Some(bytes) = new_mapping {
        let flags = (libc::MAP_SHARED | libc::MAP_ANONYMOUS) as u64;
        let mut mmap = known([0, 0, read | write, flags, u64::MAX, 0]);
        mmap[1] = bytes;
        calls.push(call("mmap", libc::SYS_mmap, mmap, vec![in_code]));
        let code = layout::READ_ONLY_BYTES as u64;
        let mut mprotect = known([0, code, read | exec, 0, 0, 0]);
        mprotect[0] = None;
        calls.push(call(
            "mprotect",
            libc::SYS_mprotect,
            mprotect,
            vec![in_code],
        ));
    }
    for protection in [read | write, read] {
        let mut mprotect = known([0, 4096, protection, 0, 0, 0]);
        mprotect[0] = None;
        calls.push(call(
            "mprotect",
            libc::SYS_mprotect,
            mprotect,
            vec![in_code, None],
        ));
    }
    for (name, nr) in [
        ("rt_sigreturn", libc::SYS_rt_sigreturn),
        ("getpid", libc::SYS_getpid),
    ] {
        calls.push(call(name, nr, [None; 6], vec![in_code, None]));
    }
    calls
}

/// Why `--mode inproc` will not inject into the thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Why {
    Strict,
    Unreadable(ReadError),
    Malformed {
        filter: usize,
        error: EvalError,
    },
    /// The filters' action on `call`; None: a value the filter computes
    /// from a word not known in advance. `certain`: on every path.
    Stops {
        call: &'static str,
        action: Option<Action>,
        certain: bool,
    },
}

/// A refusal, one line that says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub pid: u32,
    pub tid: u32,
    pub why: Why,
}

impl std::error::Error for Refusal {}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.why_said(f)?;
        write!(f, "; use --mode all, which writes nothing into the process")
    }
}

impl Refusal {
    /// The refusal without what to do instead.
    pub(crate) fn reason(&self) -> String {
        struct Reason<'a>(&'a Refusal);
        impl fmt::Display for Reason<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.why_said(f)
            }
        }
        Reason(self).to_string()
    }

    fn why_said(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (pid, tid) = (self.pid, self.tid);
        match &self.why {
            Why::Strict => write!(
                f,
                "thread {tid} of process {pid} is in seccomp strict mode, which kills it on any syscall but read, write, exit and sigreturn"
            ),
            Why::Unreadable(error) => write!(
                f,
                "process {pid} has a seccomp filter locktrace cannot read to check the calls it injects (thread {tid}: {error})"
            ),
            Why::Malformed { filter, error } => write!(
                f,
                "process {pid} has a seccomp filter locktrace cannot evaluate (thread {tid}, filter {filter}: {error})"
            ),
            Why::Stops {
                call,
                action,
                certain,
            } => {
                let may = if *certain { "would" } else { "could" };
                let (verb, after) = effect(*action);
                write!(
                    f,
                    "process {pid} has a seccomp filter that {may} {verb} the {call} locktrace injects{after} (thread {tid})"
                )
            }
        }
    }
}

/// The stubs' sample call (`--stacks`): `getppid`, from their code in
/// locktrace's mapping (an address not known in advance).
pub(crate) fn sample_call() -> InjectedCall {
    InjectedCall {
        name: "getppid",
        nr: tracer_common::inproc_sample::SYSCALL_NR as i32,
        args: [None; 6],
        instruction_pointers: vec![None],
    }
}

/// Whether every thread of `pid` lets the stubs' sample call through its
/// seccomp filters (`stopped`: the thread the caller holds stopped). The
/// filters of another filtered thread are read with it stopped for a
/// moment, as `session` stops one; a thread a stop would disturb is not
/// stopped, and sampling stays off. Err: why, one line.
pub(crate) fn check_sample_call(pid: u32, stopped: u32) -> Result<(), String> {
    let calls = [sample_call()];
    for tid in inject::threads(pid) {
        if matches!(mode(pid, tid), None | Some(0)) {
            continue;
        }
        let checked = if tid == stopped {
            check(pid, tid, &calls)
        } else {
            let place = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall"))
                .map(|line| inject::fit(&line))
                .unwrap_or(inject::Fit::Unsafe);
            if place == inject::Fit::Unsafe {
                return Err(format!(
                    "thread {tid} of process {pid} has a seccomp filter locktrace could not read without cutting a call of it short"
                ));
            }
            let thread = inject::StoppedThread::stop(tid).map_err(|error| format!("{error:#}"))?;
            let checked = check(pid, tid, &calls);
            thread.release().map_err(|error| format!("{error:#}"))?;
            checked
        };
        checked.map_err(|refusal| refusal.reason())?;
    }
    Ok(())
}

/// How a refusal says an action: the words before and after the call.
fn effect(action: Option<Action>) -> (&'static str, String) {
    match action {
        None => (
            "decide from a value not known in advance (an address) what to do with",
            String::new(),
        ),
        Some(Action::KillProcess | Action::Unknown(_)) => ("kill it on", String::new()),
        Some(Action::KillThread) => ("kill the thread on", String::new()),
        Some(Action::Trap) => ("send it SIGSYS on", String::new()),
        Some(Action::Errno(errno)) => (
            "fail",
            format!(
                " with errno {errno} ({}), and --mode inproc needs it",
                Errno::from_raw(i32::from(errno)).desc()
            ),
        ),
        Some(Action::UserNotif) => ("hold", " for a supervisor process to answer".into()),
        Some(Action::Trace) => (
            "fail",
            " with ENOSYS (it asks for a seccomp tracer, which locktrace is not)".into(),
        ),
        Some(Action::Log | Action::Allow) => ("let through", String::new()),
    }
}

/// The check before `record` prepares anything (its request window's
/// notes, a load's warmup), so that a refusal is its one line: stops one
/// thread for a moment when it is under seccomp, and judges the calls
/// with what only `session` knows (where its `syscall` instruction is,
/// how big the mapping) unknown. `session` checks again as it injects.
pub(crate) fn precheck(pid: u32) -> anyhow::Result<()> {
    let filtered = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| task.file_name().to_str()?.parse::<u32>().ok())
        .any(|tid| !matches!(mode(pid, tid), None | Some(0)));
    if !filtered {
        return Ok(());
    }
    let thread = inject::stop_a_thread(pid, None)?;
    let checked = check(pid, thread.tid(), &calls(None, Some(None)));
    thread.release()?;
    Ok(checked?)
}

/// Refuses when a seccomp filter of thread `tid` (ptrace-stopped by the
/// caller, who is about to inject into it) would not let every call of
/// `calls` through.
pub(crate) fn check(pid: u32, tid: u32, calls: &[InjectedCall]) -> Result<(), Refusal> {
    let refusal = |why| Refusal { pid, tid, why };
    match mode(pid, tid) {
        // No line: a kernel without seccomp.
        None | Some(0) => return Ok(()),
        Some(1) => return Err(refusal(Why::Strict)),
        Some(_) => {}
    }
    let filters = read_filters(tid).map_err(|error| refusal(Why::Unreadable(error)))?;
    judge(&filters, calls).map_err(refusal)
}

/// The filters' verdict on every call at every instruction pointer it
/// may have: the first that is not let through, and why.
fn judge(filters: &[Vec<libc::sock_filter>], calls: &[InjectedCall]) -> Result<(), Why> {
    let programs = filters
        .iter()
        .enumerate()
        .map(|(filter, program)| decode(program).map_err(|error| Why::Malformed { filter, error }))
        .collect::<Result<Vec<_>, _>>()?;
    for call in calls {
        for &ip in &call.instruction_pointers {
            let data = data_words(call.nr, AUDIT_ARCH_X86_64, ip, &call.args);
            let mut worst: (Word, bool) = (Some(libc::SECCOMP_RET_ALLOW), true);
            for (filter, program) in programs.iter().enumerate() {
                let returned =
                    run(program, &data).map_err(|error| Why::Malformed { filter, error })?;
                let Some(lowest) = returned.iter().copied().min_by_key(|&r| rank(r)) else {
                    continue;
                };
                if rank(lowest) < rank(worst.0) {
                    let certain =
                        lowest.is_some() && returned.iter().all(|&r| rank(r) == rank(lowest));
                    worst = (lowest, certain);
                }
            }
            let action = worst.0.map(Action::from_ret);
            if !action.is_some_and(Action::lets_through) {
                return Err(Why::Stops {
                    call: call.name,
                    action,
                    certain: worst.1,
                });
            }
        }
    }
    Ok(())
}

/// An unknown returned value may be anything: it ranks before all.
fn rank(ret: Word) -> i64 {
    ret.map_or(i64::MIN, |r| i64::from(precedence(r)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stmt(code: u32, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code: code as u16,
            jt: 0,
            jf: 0,
            k,
        }
    }

    fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
        libc::sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        }
    }

    const JEQ_K: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    const JSET_K: u32 = libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K;
    const RETK: u32 = libc::BPF_RET | libc::BPF_K;
    const ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    const fn arg_low(i: u32) -> u32 {
        16 + 8 * i
    }

    fn call(nr: libc::c_long, args: [u64; 6]) -> SeccompData {
        SeccompData {
            nr: nr as i32,
            arch: AUDIT_ARCH_X86_64,
            instruction_pointer: 0x7f00_0000_1002,
            args,
        }
    }

    const RX: u64 = (libc::PROT_READ | libc::PROT_EXEC) as u64;
    const RW: u64 = (libc::PROT_READ | libc::PROT_WRITE) as u64;

    /// Kills on a foreign architecture, then `body`.
    fn arch_checked(body: &[libc::sock_filter]) -> Vec<libc::sock_filter> {
        let mut program = vec![
            stmt(ABS, ARCH),
            jump(JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
            stmt(RETK, KILL),
        ];
        program.extend_from_slice(body);
        program
    }

    fn kill_mprotect() -> Vec<libc::sock_filter> {
        arch_checked(&[
            stmt(ABS, NR),
            jump(JEQ_K, libc::SYS_mprotect as u32, 0, 1),
            stmt(RETK, KILL),
            stmt(RETK, ALLOW),
        ])
    }

    /// Kills mprotect when args[2] has PROT_EXEC.
    fn kill_mprotect_exec() -> Vec<libc::sock_filter> {
        arch_checked(&[
            stmt(ABS, NR),
            jump(JEQ_K, libc::SYS_mprotect as u32, 0, 3),
            stmt(ABS, arg_low(2)),
            jump(JSET_K, libc::PROT_EXEC as u32, 0, 1),
            stmt(RETK, KILL),
            stmt(RETK, ALLOW),
        ])
    }

    /// Docker's shape: an allow list (a pair each), personality allowed
    /// for a few arguments, everything else ERRNO(EPERM).
    fn docker_like() -> Vec<libc::sock_filter> {
        let mut body = vec![stmt(ABS, NR)];
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_mmap,
            libc::SYS_mprotect,
            libc::SYS_munmap,
            libc::SYS_futex,
            libc::SYS_getpid,
            libc::SYS_rt_sigreturn,
            libc::SYS_exit_group,
        ] {
            body.push(jump(JEQ_K, nr as u32, 0, 1));
            body.push(stmt(RETK, ALLOW));
        }
        body.extend([
            jump(JEQ_K, libc::SYS_personality as u32, 0, 5),
            stmt(ABS, arg_low(0)),
            jump(JEQ_K, 0, 2, 0),
            jump(JEQ_K, 8, 1, 0),
            stmt(RETK, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
            stmt(RETK, ALLOW),
            stmt(RETK, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        ]);
        arch_checked(&body)
    }

    #[test]
    fn allow_all() {
        let program = [stmt(RETK, ALLOW)];
        assert_eq!(evaluate(&program, &call(libc::SYS_mmap, [0; 6])), Ok(ALLOW));
    }

    #[test]
    fn kill_on_mprotect() {
        let program = kill_mprotect();
        assert_eq!(
            evaluate(&program, &call(libc::SYS_mprotect, [0; 6])),
            Ok(KILL)
        );
        assert_eq!(evaluate(&program, &call(libc::SYS_mmap, [0; 6])), Ok(ALLOW));
        let foreign = SeccompData {
            arch: 0x4000_0003,
            ..call(libc::SYS_mmap, [0; 6])
        };
        assert_eq!(evaluate(&program, &foreign), Ok(KILL));
    }

    #[test]
    fn jset_on_an_argument() {
        let program = kill_mprotect_exec();
        let mprotect = |prot| call(libc::SYS_mprotect, [0x1000, 4096, prot, 0, 0, 0]);
        assert_eq!(evaluate(&program, &mprotect(RX)), Ok(KILL));
        assert_eq!(evaluate(&program, &mprotect(RW)), Ok(ALLOW));
        // The high half of the argument is not what the filter reads.
        assert_eq!(evaluate(&program, &mprotect(RW | 1 << 34)), Ok(ALLOW));
    }

    #[test]
    fn docker_like_allow_list() {
        let program = docker_like();
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        for (nr, args, expected) in [
            (libc::SYS_mmap, [0; 6], ALLOW),
            (libc::SYS_getpid, [0; 6], ALLOW),
            (libc::SYS_kexec_load, [0; 6], eperm),
            (libc::SYS_personality, [8, 0, 0, 0, 0, 0], ALLOW),
            (libc::SYS_personality, [7, 0, 0, 0, 0, 0], eperm),
            (libc::SYS_ptrace, [0; 6], eperm),
        ] {
            assert_eq!(evaluate(&program, &call(nr, args)), Ok(expected), "{nr}");
        }
    }

    #[test]
    fn scratch_memory_alu_and_x() {
        use libc::{BPF_ALU, BPF_LD, BPF_LDX, BPF_MEM, BPF_MISC, BPF_RET, BPF_X};
        // M[3] = nr * 4 + 1; X = M[3]; A = X - 1; A >>= 2; return A.
        let program = [
            stmt(ABS, NR),
            stmt(BPF_ALU | libc::BPF_MUL | libc::BPF_K, 4),
            stmt(BPF_ALU | libc::BPF_ADD | libc::BPF_K, 1),
            stmt(libc::BPF_ST, 3),
            stmt(BPF_LDX | BPF_MEM, 3),
            stmt(BPF_MISC | libc::BPF_TXA, 0),
            stmt(BPF_ALU | libc::BPF_SUB | libc::BPF_K, 1),
            stmt(BPF_ALU | libc::BPF_RSH | libc::BPF_K, 2),
            stmt(libc::BPF_MISC | libc::BPF_TAX, 0),
            stmt(BPF_LD | BPF_MEM, 3),
            stmt(BPF_ALU | libc::BPF_XOR | BPF_X, 0),
            stmt(BPF_RET | libc::BPF_A, 0),
        ];
        // (4n + 1) ^ n
        let n = libc::SYS_mprotect as u32;
        assert_eq!(
            evaluate(&program, &call(libc::SYS_mprotect, [0; 6])),
            Ok((4 * n + 1) ^ n)
        );
        // Division by X = 0 ends the program with 0 (KILL_THREAD).
        let divide = [
            stmt(libc::BPF_LDX | libc::BPF_IMM, 0),
            stmt(BPF_ALU | libc::BPF_DIV | BPF_X, 0),
            stmt(RETK, ALLOW),
        ];
        assert_eq!(evaluate(&divide, &call(0, [0; 6])), Ok(0));
        // BPF_LEN is sizeof(struct seccomp_data); NEG and MOD.
        let len = [
            stmt(BPF_LD | libc::BPF_W | libc::BPF_LEN, 0),
            stmt(BPF_ALU | libc::BPF_MOD | libc::BPF_K, 10),
            stmt(BPF_ALU | libc::BPF_NEG, 0),
            stmt(BPF_RET | libc::BPF_A, 0),
        ];
        assert_eq!(evaluate(&len, &call(0, [0; 6])), Ok(4u32.wrapping_neg()));
    }

    #[test]
    fn malformed_programs_are_errors() {
        let data = call(libc::SYS_mmap, [0; 6]);
        let ret = stmt(RETK, ALLOW);
        for (program, expected) in [
            (vec![], EvalError::Empty),
            (
                vec![stmt(ABS, 64), ret],
                EvalError::Load { pc: 0, offset: 64 },
            ),
            (
                vec![stmt(ABS, 2), ret],
                EvalError::Load { pc: 0, offset: 2 },
            ),
            (
                vec![stmt(libc::BPF_LD | libc::BPF_H | libc::BPF_ABS, 0), ret],
                EvalError::Opcode { pc: 0, code: 0x28 },
            ),
            (vec![jump(JEQ_K, 0, 0, 1), ret], EvalError::Jump { pc: 0 }),
            (
                vec![stmt(libc::BPF_JMP, u32::MAX), ret],
                EvalError::Jump { pc: 0 },
            ),
            (vec![stmt(ABS, NR)], EvalError::NoReturn),
            (
                vec![stmt(libc::BPF_ALU | libc::BPF_DIV | libc::BPF_K, 0), ret],
                EvalError::DivideByZero { pc: 0 },
            ),
            (
                vec![stmt(libc::BPF_ALU | libc::BPF_LSH | libc::BPF_K, 32), ret],
                EvalError::Shift { pc: 0, k: 32 },
            ),
            (
                vec![stmt(libc::BPF_ST, 16), ret],
                EvalError::Scratch { pc: 0, slot: 16 },
            ),
            (
                vec![stmt(libc::BPF_LD | libc::BPF_MEM, 5), ret],
                EvalError::Unwritten { pc: 0, slot: 5 },
            ),
            (
                vec![stmt(0x1234, 0), ret],
                EvalError::Opcode {
                    pc: 0,
                    code: 0x1234,
                },
            ),
            (vec![ret; MAX_INSNS + 1], EvalError::TooLong(MAX_INSNS + 1)),
        ] {
            assert_eq!(
                evaluate(&program, &data),
                Err(expected.clone()),
                "{expected}"
            );
        }
    }

    /// Random programs: an answer or an error, never a panic.
    #[test]
    fn random_programs_never_panic() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let data = call(libc::SYS_mprotect, [1, 2, 3, 4, 5, 6]);
        for _ in 0..20_000 {
            let len = (next() % 12) as usize + 1;
            let program: Vec<libc::sock_filter> = (0..len)
                .map(|_| {
                    let r = next();
                    libc::sock_filter {
                        code: (r & 0xff) as u16,
                        jt: (r >> 8 & 3) as u8,
                        jf: (r >> 10 & 3) as u8,
                        k: (r >> 32) as u32 % 80,
                    }
                })
                .collect();
            let _ = evaluate(&program, &data);
            let _ = judge(&[program], &injected_calls(Some(0x1000), Some(1 << 20)));
        }
    }

    #[test]
    fn the_lowest_action_of_all_filters_wins() {
        let ret = |value| vec![stmt(RETK, value)];
        let data = call(libc::SYS_mmap, [0; 6]);
        let errno = libc::SECCOMP_RET_ERRNO | 13;
        for (filters, expected) in [
            (vec![], Action::Allow),
            (vec![ret(ALLOW), ret(libc::SECCOMP_RET_LOG)], Action::Log),
            (
                vec![ret(ALLOW), ret(errno), ret(libc::SECCOMP_RET_TRAP)],
                Action::Trap,
            ),
            (
                vec![ret(libc::SECCOMP_RET_TRACE), ret(errno)],
                Action::Errno(13),
            ),
            (
                vec![ret(libc::SECCOMP_RET_KILL_THREAD), ret(KILL)],
                Action::KillProcess,
            ),
            (
                vec![
                    ret(libc::SECCOMP_RET_USER_NOTIF),
                    ret(libc::SECCOMP_RET_TRACE),
                ],
                Action::UserNotif,
            ),
            // An action the kernel does not know, below TRAP.
            (
                vec![ret(libc::SECCOMP_RET_TRAP), ret(0x0001_0000)],
                Action::Unknown(0x0001_0000),
            ),
            // The newest filter's data on a tie.
            (
                vec![ret(libc::SECCOMP_RET_ERRNO | 1), ret(errno)],
                Action::Errno(1),
            ),
        ] {
            assert_eq!(verdict(&filters, &data), Ok(expected));
        }
    }

    fn refused(filters: &[Vec<libc::sock_filter>], new_mapping: Option<u64>) -> Option<Why> {
        judge(
            filters,
            &injected_calls(Some(0x7f00_0000_1000), new_mapping),
        )
        .err()
    }

    #[test]
    fn judged_on_the_calls_locktrace_injects() {
        assert_eq!(refused(&[docker_like()], Some(1 << 20)), None);
        assert_eq!(
            refused(&[kill_mprotect_exec()], Some(1 << 20)),
            Some(Why::Stops {
                call: "mprotect",
                action: Some(Action::KillProcess),
                certain: true,
            })
        );
        // Without a new mapping only the GOT's mprotects: no PROT_EXEC.
        assert_eq!(refused(&[kill_mprotect_exec()], None), None);
        // The precheck's calls, the syscall instruction and size unknown.
        let early = calls(None, Some(None));
        assert_eq!(judge(&[docker_like()], &early), Ok(()));
        assert!(judge(&[kill_mprotect_exec()], &early).is_err());
        let trap_mmap = arch_checked(&[
            stmt(ABS, NR),
            jump(JEQ_K, libc::SYS_mmap as u32, 0, 1),
            stmt(RETK, libc::SECCOMP_RET_TRAP),
            stmt(RETK, ALLOW),
        ]);
        assert_eq!(
            refused(&[trap_mmap], Some(1 << 20)),
            Some(Why::Stops {
                call: "mmap",
                action: Some(Action::Trap),
                certain: true,
            })
        );
        let log = vec![stmt(RETK, libc::SECCOMP_RET_LOG)];
        assert_eq!(refused(&[log], Some(1 << 20)), None);
        let errno = vec![stmt(RETK, libc::SECCOMP_RET_ERRNO | 1)];
        assert!(refused(&[errno], None).is_some());
        let trace = vec![stmt(RETK, libc::SECCOMP_RET_TRACE)];
        assert!(refused(&[trace], None).is_some());
    }

    /// The address the kernel picks for the mapping is unknown: a filter
    /// that kills mprotect below some address could kill it.
    #[test]
    fn unknown_addresses_take_both_branches() {
        let low_mprotect = arch_checked(&[
            stmt(ABS, NR),
            jump(JEQ_K, libc::SYS_mprotect as u32, 0, 4),
            stmt(ABS, arg_low(0) + 4),
            jump(JEQ_K, 0, 0, 1),
            stmt(RETK, KILL),
            stmt(RETK, ALLOW),
            stmt(RETK, ALLOW),
        ]);
        assert_eq!(
            refused(&[low_mprotect], None),
            Some(Why::Stops {
                call: "mprotect",
                action: Some(Action::KillProcess),
                certain: false,
            })
        );
        // An action computed from the instruction pointer.
        let computed = vec![stmt(ABS, arg_low(0)), stmt(libc::BPF_RET | libc::BPF_A, 0)];
        assert_eq!(
            refused(&[computed], None),
            Some(Why::Stops {
                call: "mprotect",
                action: None,
                certain: false,
            })
        );
    }

    #[test]
    fn refusals_are_one_line_that_says_what_to_do() {
        let refusal = |why| Refusal {
            pid: 1234,
            tid: 1235,
            why,
        };
        let kill = refusal(Why::Stops {
            call: "mprotect",
            action: Some(Action::KillProcess),
            certain: true,
        });
        assert_eq!(
            kill.to_string(),
            "process 1234 has a seccomp filter that would kill it on the mprotect locktrace injects (thread 1235); use --mode all, which writes nothing into the process"
        );
        for why in [
            Why::Strict,
            Why::Unreadable(ReadError::NotShown),
            Why::Malformed {
                filter: 0,
                error: EvalError::NoReturn,
            },
            Why::Stops {
                call: "mmap",
                action: Some(Action::Errno(1)),
                certain: false,
            },
            Why::Stops {
                call: "mmap",
                action: None,
                certain: false,
            },
        ] {
            let line = refusal(why).to_string();
            assert_eq!(line.lines().count(), 1, "{line}");
            assert!(
                line.contains("seccomp") && line.contains("--mode all"),
                "{line}"
            );
        }
    }

    #[test]
    fn the_mode_from_status() {
        let status = "Name:\tcat\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n";
        assert_eq!(parse_mode(status), Some(2));
        assert_eq!(parse_mode("Name:\tcat\n"), None);
        // Whatever this test runs under (a container may filter it).
        assert!(mode(std::process::id(), std::process::id()).is_some());
    }
}
