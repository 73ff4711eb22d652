//! One `--mode inproc` recording's life in the target: the mapping made
//! (or an earlier run's reused), the GOT entries switched to the stubs,
//! the counts read from the shared memory, and every entry put back.
//!
//! What is written into the target, and when:
//! - at start: one shared anonymous mapping (`/dev/zero (deleted)` in its
//!   maps; the header and code read-only and executable, the tables
//!   read-write), made by an injected `mmap`, unless an earlier run's is
//!   there to reuse; and the GOT entries of the lock functions, switched
//!   one 8-byte `lock cmpxchg` each by the patcher running in a target
//!   thread (a `-z now` GOT is made writable around it with `mprotect`);
//! - at the end (duration, signal, tracer error): the entries switched
//!   back the same way. The mapping stays: a thread may still be in a stub.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fs::OpenOptions,
};

use anyhow::{Context, Result, anyhow, bail};
use memmap2::MmapMut;
use tracer_common::LockOp;

use super::{
    inject::{self, Site, StoppedThread},
    layout::{self, Counted, Header, PatchRecord, Swap},
    seccomp, stubs,
};
use crate::{
    model::{CountedBy, Inproc, InprocFunction, InprocModule, Restore, RestoreOutcome},
    probe::{
        got::{self, GotSlot},
        lockfuncs::LockFunction,
        memory::{ProcessMemory, TargetMemory},
        target::{self, Mapping, Target},
    },
};

/// A GOT entry as found before the switch.
#[derive(Debug, Clone)]
struct Planned {
    slot: GotSlot,
    original: u64,
    /// What the entry holds now (a stray stub of an earlier run, or the original).
    current: u64,
    /// Not bound yet by the lazy binder (holds its PLT address).
    unresolved: bool,
}

/// Entries left alone, with why (one line each).
type Skipped = Vec<(LockOp, String)>;

/// What the plan leaves alone, and why (one line each).
#[derive(Debug, Default)]
struct Plan {
    switch: Vec<Planned>,
    skipped: Vec<(LockOp, String)>,
    bind_now: BTreeMap<String, bool>,
}

/// An earlier run's mapping found in the target.
struct Leftover {
    start: u64,
    header: Header,
    /// Another process maps it too (a child forked while it counted):
    /// never counted in again, or the child's calls would be counted in.
    shared: bool,
}

/// A recording's switched entries and the shared memory the stubs count in.
pub struct Session {
    pid: u32,
    start_time: u64,
    base: u64,
    shared: MmapMut,
    cpu_tables: usize,
    records: Vec<PatchRecord>,
    per_cpu: bool,
    ops: Vec<LockOp>,
    /// The target's code modules when the entries were switched.
    modules_at_start: BTreeSet<String>,
    /// Entries (or modules) found and not switched.
    not_switched: u64,
    /// Per function: mechanism and coverage, for the report.
    pub functions: Vec<InprocFunction>,
    pub restored_at_start: u64,
    /// `--stacks`: one sample in this many acquisitions, or why none.
    stack_sample: Option<Result<u64, String>>,
    finished: bool,
}

/// The ops that uprobes must count (no module calls them through a GOT),
/// and the session, when any entry was switched.
pub(crate) struct Started {
    pub session: Option<Session>,
    pub uprobe_ops: Vec<LockOp>,
    pub functions: Vec<InprocFunction>,
    pub restored_at_start: u64,
    /// Mappings that start like locktrace's but are not: one line each.
    pub ignored: Vec<String>,
}

/// Switches every GOT entry of the lock functions in `functions` to a
/// counting stub. Functions no module calls through a GOT are left to
/// uprobes (returned in `uprobe_ops`). `sample_every` (`--stacks`; a
/// power of two): the stubs sample one acquisition in that many per
/// slot, once every thread's seccomp filter lets their call through.
pub(crate) fn start(
    target: &Target,
    functions: &[LockFunction],
    sample_every: Option<u64>,
) -> Result<Started> {
    let pid = target.pid;
    check_alone(target)?;
    let (leftovers, ignored) = leftovers(pid, &target.maps)?;
    let real: HashMap<LockOp, u64> = functions
        .iter()
        .map(|f| (f.op, f.runtime_start))
        .rev()
        .collect();
    let ops: Vec<LockOp> = LockOp::ALL
        .into_iter()
        .filter(|op| real.contains_key(op))
        .collect();
    let plan = plan(target, &ops, &real, &leftovers);
    let uprobe_ops = left_to_uprobes(&ops, &plan.switch);
    // Nothing switched: every function is counted by uprobes or said not counted.
    let without_session = |restored_at_start| Started {
        session: None,
        functions: describe(&ops, &plan, &uprobe_ops, functions),
        uprobe_ops: uprobe_ops.clone(),
        restored_at_start,
        ignored: ignored.clone(),
    };
    if plan.switch.is_empty() && leftovers.is_empty() {
        return Ok(without_session(0));
    }
    let cpu_tables = possible_cpus();
    let mut thread = stop_for(pid, &target.maps, &leftovers, cpu_tables)?;
    let source = source(pid, &target.maps, &leftovers, cpu_tables)?;
    check_seccomp(pid, &thread, &source, cpu_tables)?;
    let stack_sample =
        sample_every.map(|every| seccomp::check_sample_call(pid, thread.tid()).map(|()| every));
    let made = match &source {
        Source::New(gadgets) => Some(*gadgets),
        Source::Reuse(_) => None,
    };
    let (base, mut shared) = open_mapping(&mut thread, target, source, cpu_tables)?;
    let per_cpu = write_code(&mut shared, base, cpu_tables, &real);
    if let Some(Ok(every)) = stack_sample {
        let mask = every.saturating_sub(1);
        let at = layout::CODE + stubs::SAMPLE_MASK;
        shared[at..at + 8].copy_from_slice(&mask.to_le_bytes());
    }
    let mut session = Session {
        pid,
        start_time: target.start_time,
        base,
        shared,
        cpu_tables,
        records: Vec::new(),
        per_cpu,
        ops: ops.clone(),
        modules_at_start: code_modules(&target.maps),
        not_switched: 0,
        functions: Vec::new(),
        restored_at_start: 0,
        stack_sample,
        finished: plan.switch.is_empty(),
    };
    let switched = session.write_in(&mut thread, &leftovers, &plan.switch);
    if let Err(error) = &switched
        && Said::is(error, Written::Nothing)
    {
        // Nothing leads to the stubs: the run leaves nothing behind.
        session.finished = true;
        session.records.clear();
        session.write_header();
        if let Some(gadgets) = made {
            let size = layout::mapping_bytes(cpu_tables) as u64;
            unmap(&mut thread, &target.maps, &gadgets, base, size)?;
        }
    }
    thread.release()?;
    let switched = switched?;
    if plan.switch.is_empty() {
        return Ok(without_session(session.restored_at_start));
    }
    let mut plan = plan;
    plan.skipped.extend(switched.1);
    let uprobe_ops = left_to_uprobes(&ops, &switched.0);
    plan.switch = switched.0;
    session.not_switched = plan.skipped.len() as u64;
    session.functions = describe(&ops, &plan, &uprobe_ops, functions);
    Ok(Started {
        functions: session.functions.clone(),
        restored_at_start: session.restored_at_start,
        session: Some(session),
        uprobe_ops,
        ignored,
    })
}

/// Refuses a target another tracer holds, or another locktrace counts in
/// with `--mode inproc` (one line each, before anything is written).
pub(crate) fn check_alone(target: &Target) -> Result<()> {
    let pid = target.pid;
    if let Some((tid, tracer)) = inject::traced_threads(pid).first() {
        bail!(
            "thread {tid} of process {pid} is traced by process {tracer} (a debugger or another tool); --mode inproc writes into the process and needs it alone: detach that tracer or use --mode all"
        );
    }
    leftovers(pid, &target.maps).map(|_| ())
}

/// The ops uprobes count: those no switched entry leads to, except those
/// a switched op may tail-call inside libc (musl's lock calls its timed
/// variant): a uprobe there would count the stub's calls a second time.
fn left_to_uprobes(ops: &[LockOp], switched: &[Planned]) -> Vec<LockOp> {
    let stubbed = |op: LockOp| switched.iter().any(|p| p.slot.op == op);
    ops.iter()
        .copied()
        .filter(|&op| !stubbed(op))
        .filter(|&op| {
            !ops.iter().any(|&outer| {
                stubbed(outer) && LockOp::index_tail_called_by(op as u32, outer as u32)
            })
        })
        .collect()
}

/// Every GOT entry of `ops`, with its current value checked: the real
/// function (bound), the module's own PLT (not bound yet), or an earlier
/// run's stub (restored first); anything else is left alone and said.
fn plan(
    target: &Target,
    ops: &[LockOp],
    real: &HashMap<LockOp, u64>,
    leftovers: &[Leftover],
) -> Plan {
    let (modules, unreadable) = got::find(target, ops);
    let found = FoundEntries {
        modules,
        unreadable,
    };
    plan_entries(&ProcessMemory::new(target.pid), found, ops, real, leftovers)
}

/// The GOT entries of the lock functions, by module, and the modules that
/// could not be read, with why.
struct FoundEntries {
    modules: Vec<got::ModuleGot>,
    unreadable: Vec<(String, String)>,
}

/// [`plan`] over the entries found and the target's memory as `memory`
/// reads it: no side effect, so every case is unit-tested on a fake.
fn plan_entries(
    memory: &dyn TargetMemory,
    found: FoundEntries,
    ops: &[LockOp],
    real: &HashMap<LockOp, u64>,
    leftovers: &[Leftover],
) -> Plan {
    let FoundEntries {
        modules,
        unreadable,
    } = found;
    let mut plan = Plan::default();
    for (module, why) in unreadable {
        for &op in ops {
            plan.skipped.push((op, format!("{module} not read: {why}")));
        }
    }
    let left_switched: HashMap<u64, u64> = leftovers
        .iter()
        .flat_map(|l| l.header.patches.iter().map(|p| (p.got, p.original)))
        .collect();
    let strays = stray_stubs(leftovers);
    for module in modules {
        plan.bind_now.insert(module.module.clone(), module.bind_now);
        for slot in module.slots {
            let mut word = [0u8; 8];
            if memory.read(slot.address, &mut word) != 8 {
                plan.skipped.push((
                    slot.op,
                    format!("{} entry at {:#x} not readable", slot.module, slot.address),
                ));
                continue;
            }
            let mut value = u64::from_le_bytes(word);
            if let Some(&original) = left_switched.get(&slot.address) {
                value = original;
            }
            let Some(&function) = real.get(&slot.op) else {
                // Not one of the functions found: nothing to compare with.
                plan.skipped.push((
                    slot.op,
                    format!("{} not found in the target", slot.op.symbol()),
                ));
                continue;
            };
            let unresolved = slot.is_lazy(value);
            if strays.get(&value) == Some(&slot.op) {
                // An earlier run's stub no header names (a child forked
                // while it counted shares its header): ours to switch.
                plan.switch.push(Planned {
                    slot,
                    original: function,
                    current: value,
                    unresolved: false,
                });
            } else if value == function || unresolved {
                plan.switch.push(Planned {
                    slot,
                    original: value,
                    current: value,
                    unresolved,
                });
            } else {
                plan.skipped.push((
                    slot.op,
                    format!(
                        "{} entry at {:#x} holds {value:#x}, not {} at {function:#x}: left alone (another copy of the library, or another tool redirected it)",
                        slot.module,
                        slot.address,
                        slot.op.symbol()
                    ),
                ));
            }
        }
    }
    if plan.switch.len() > layout::MAX_PATCHES {
        for extra in plan.switch.split_off(layout::MAX_PATCHES) {
            plan.skipped.push((
                extra.slot.op,
                format!(
                    "{} entry at {:#x}: more than {} entries",
                    extra.slot.module,
                    extra.slot.address,
                    layout::MAX_PATCHES
                ),
            ));
        }
    }
    plan
}

/// The stubs of earlier runs' mappings, by address: what op each counts.
fn stray_stubs(leftovers: &[Leftover]) -> HashMap<u64, LockOp> {
    leftovers
        .iter()
        .flat_map(|l| {
            LockOp::ALL
                .into_iter()
                .map(|op| (stub_address(l.start, op), op))
        })
        .collect()
}

/// The stub of `op` in the mapping at `base`.
fn stub_address(base: u64, op: LockOp) -> u64 {
    base + (layout::CODE + stubs::STUBS + stubs::STUB_STRIDE * op as usize) as u64
}

/// The report's lines per function: how it is counted, and what not.
fn describe(
    ops: &[LockOp],
    plan: &Plan,
    uprobe_ops: &[LockOp],
    functions: &[LockFunction],
) -> Vec<InprocFunction> {
    ops.iter()
        .map(|&op| {
            let defined_in = functions
                .iter()
                .find(|f| f.op == op)
                .map(|f| f.module.clone())
                .unwrap_or_default();
            let mut modules: BTreeMap<String, InprocModule> = BTreeMap::new();
            for planned in plan.switch.iter().filter(|p| p.slot.op == op) {
                let module = modules
                    .entry(planned.slot.module.clone())
                    .or_insert_with(|| InprocModule {
                        module: planned.slot.module.clone(),
                        entries: 0,
                        bind_now: plan.bind_now.get(&planned.slot.module).copied().unwrap_or(false),
                        unresolved: 0,
                    });
                module.entries += 1;
                module.unresolved += u64::from(planned.unresolved);
            }
            let mut not_covered: Vec<String> = plan
                .skipped
                .iter()
                .filter(|(skipped, _)| *skipped == op)
                .map(|(_, why)| why.clone())
                .collect();
            let stubbed = !modules.is_empty();
            let counted_by = if uprobe_ops.contains(&op) {
                not_covered.push("no module calls it through a GOT entry locktrace could switch (a static binary, or only its own library calls it): counted by uprobes".into());
                CountedBy::Uprobe
            } else if !stubbed {
                not_covered.push(format!(
                    "no module calls it through a GOT; calls from inside {defined_in} are not counted (a function the stubs count may call it there: a uprobe would count those calls twice)"
                ));
                CountedBy::NotCounted
            } else {
                not_covered.push(format!(
                    "calls from inside {} itself (they do not go through a GOT)",
                    defined_in.rsplit('/').next().unwrap_or(&defined_in)
                ));
                CountedBy::GotStubs
            };
            InprocFunction {
                function: op.symbol().to_string(),
                counted_by,
                modules: modules.into_values().collect(),
                not_covered,
            }
        })
        .collect()
}

impl Session {
    /// Restores what earlier runs left, then switches `planned` (when
    /// there is any) as [`Session::switch`] does.
    fn write_in(
        &mut self,
        thread: &mut StoppedThread,
        leftovers: &[Leftover],
        planned: &[Planned],
    ) -> Result<(Vec<Planned>, Skipped)> {
        self.restored_at_start = restore_leftovers(thread, self.base, &mut self.shared, leftovers)?;
        if planned.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        self.write_header();
        self.switch(thread, planned)
    }

    fn write_header(&mut self) {
        let me = std::process::id();
        let header = Header {
            version: layout::VERSION,
            owner_pid: if self.records.is_empty() { 0 } else { me },
            owner_start: target::start_time(me).unwrap_or(0),
            size: layout::mapping_bytes(self.cpu_tables) as u64,
            cpu_tables: self.cpu_tables as u64,
            patches: self.records.clone(),
        };
        header.write(&mut self.shared[..layout::CODE]);
    }

    fn stub_of(&self, op: LockOp) -> u64 {
        stub_address(self.base, op)
    }

    /// Switches the planned entries; returns those switched, and why the
    /// others were not. The header names them all before the first switch.
    fn switch(
        &mut self,
        thread: &mut StoppedThread,
        planned: &[Planned],
    ) -> Result<(Vec<Planned>, Skipped)> {
        self.records = planned
            .iter()
            .map(|p| PatchRecord {
                got: p.slot.address,
                original: p.original,
                stub: self.stub_of(p.slot.op),
            })
            .collect();
        self.write_header();
        let swaps: Vec<Swap> = self
            .records
            .iter()
            .zip(planned)
            .map(|(r, p)| Swap {
                got: r.got,
                expected: p.current,
                new: r.stub,
            })
            .collect();
        let found = run_patcher(thread, self.base, &mut self.shared, &swaps)?;
        let mut switched = Vec::new();
        let mut skipped = Vec::new();
        let mut kept = Vec::new();
        for ((planned, record), value) in planned.iter().zip(&self.records).zip(found) {
            let value = value.unwrap_or(0);
            if value == planned.current {
                switched.push(planned.clone());
                kept.push(*record);
            } else {
                skipped.push((
                    planned.slot.op,
                    format!(
                        "{} entry at {:#x} changed to {value:#x} while it was switched: left alone",
                        planned.slot.module, planned.slot.address
                    ),
                ));
            }
        }
        self.records = kept;
        self.write_header();
        Ok((switched, skipped))
    }

    /// Opens or closes the stubs' gate (nothing counted while closed).
    pub(crate) fn set_counting(&self, on: bool) {
        // SAFETY: GATE is an aligned word inside the shared mapping, which
        // lives as long as `self`; the stubs only read it.
        let gate = unsafe {
            &*(self.shared.as_ptr().add(layout::GATE) as *const std::sync::atomic::AtomicU64)
        };
        gate.store(u64::from(on), std::sync::atomic::Ordering::SeqCst);
    }

    /// What the stubs counted so far.
    pub(crate) fn read(&self) -> Counted {
        layout::read_counts(&self.shared, self.cpu_tables)
    }

    /// Switches every entry back (the mapping stays) and says how, with
    /// what the stubs did not count (`overflow`, read with the counts).
    pub(crate) fn finish(mut self, overflow: u64) -> Inproc {
        let loaded_while_recording = self.loaded_while_recording();
        let restore = self.restore();
        Inproc {
            functions: self.functions.clone(),
            mapping: Some(format!("{:#x}", self.base)),
            per_cpu_tables: self.per_cpu,
            table_overflow: overflow,
            entries_not_switched: self.not_switched,
            loaded_while_recording,
            restored_at_start: self.restored_at_start,
            restore,
            stack_sample_every: self.stack_sample.clone().and_then(Result::ok),
            stack_samples_off: self.stack_sample.clone().and_then(Result::err),
        }
    }

    /// `--stacks`: why the stubs take no samples (None: they do, or
    /// were not asked to).
    pub(crate) fn stack_samples_off(&self) -> Option<&str> {
        self.stack_sample
            .as_ref()?
            .as_ref()
            .err()
            .map(String::as_str)
    }

    /// Modules with GOT entries for the lock functions that the target
    /// loaded after the switch (their calls went past the stubs).
    fn loaded_while_recording(&self) -> Vec<String> {
        let Ok(target) = Target::open(self.pid) else {
            return Vec::new();
        };
        code_modules(&target.maps)
            .difference(&self.modules_at_start)
            .filter(|path| {
                target.module_file(path).is_ok_and(|file| {
                    file.elf().is_ok_and(|elf| {
                        !got::module_got(&elf, path, &target.maps, &self.ops)
                            .slots
                            .is_empty()
                    })
                })
            })
            .cloned()
            .collect()
    }

    fn restore(&mut self) -> Restore {
        self.finished = true;
        if !target::is_running(self.pid, self.start_time) {
            return Restore::outcome(RestoreOutcome::TargetExited);
        }
        match self.switch_back() {
            Ok(restore) => restore,
            Err(_) if !target::is_running(self.pid, self.start_time) => {
                Restore::outcome(RestoreOutcome::TargetExited)
            }
            Err(error) if Said::is(&error, Written::LeftSwitched) => Restore {
                reason: Some(error.to_string()),
                ..Restore::outcome(RestoreOutcome::Failed)
            },
            Err(error) => Restore {
                reason: Some(format!(
                    "{error:#}; run `locktrace restore --pid {}` to put the GOT entries back",
                    self.pid
                )),
                ..Restore::outcome(RestoreOutcome::Failed)
            },
        }
    }

    fn switch_back(&mut self) -> Result<Restore> {
        if !mapping_in_place(self.pid, self.base) {
            self.records.clear();
            return Ok(Restore::outcome(RestoreOutcome::ProgramReplaced));
        }
        let mut thread = inject::stop_a_thread(self.pid, None)
            .map_err(|error| in_restore_words(error, self.pid, &self.records, 0))?;
        let calls = seccomp::injected_calls(None, None);
        seccomp::check(self.pid, thread.tid(), &calls)?;
        let swaps = restoring(&self.records);
        let found = run_patcher(&mut thread, self.base, &mut self.shared, &swaps);
        thread.release()?;
        let found = found?;
        let restored = found
            .iter()
            .zip(&self.records)
            .filter(|(value, record)| **value == Some(record.stub))
            .count() as u64;
        let unloaded = found.iter().filter(|value| value.is_none()).count() as u64;
        let overwritten = self.records.len() as u64 - restored - unloaded;
        self.records.clear();
        self.write_header();
        let outcome = if overwritten == 0 {
            RestoreOutcome::Restored
        } else {
            RestoreOutcome::Overwritten
        };
        Ok(Restore {
            entries: restored,
            overwritten,
            unloaded,
            ..Restore::outcome(outcome)
        })
    }
}

impl Drop for Session {
    /// Every way out that did not finish (a tracer error) restores too.
    fn drop(&mut self) {
        if !self.finished
            && let Some(reason) = self.restore().reason
        {
            crate::model::diagnostics::note(format_args!(
                "locktrace: GOT entries not restored: {reason}"
            ));
        }
    }
}

/// The paths of the code modules (executable file mappings) in `maps`.
fn code_modules(maps: &[Mapping]) -> BTreeSet<String> {
    maps.iter()
        .filter(|m| m.is_file() && m.is_executable())
        .map(|m| m.path.clone())
        .collect()
}

/// Whether another process maps the pages of the mapping at `start` too
/// (a forked child's copy).
fn mapped_elsewhere(pid: u32, start: u64) -> bool {
    let task = target::proc_task(pid);
    std::fs::read_to_string(format!("/proc/{task}/smaps"))
        .is_ok_and(|smaps| shared_pages(&smaps, start))
}

/// Whether smaps' block of the mapping at `start` has pages mapped by
/// more than one process (`Shared_Clean`/`Shared_Dirty` above 0).
fn shared_pages(smaps: &str, start: u64) -> bool {
    let header = format!("{start:08x}-");
    // A mapping's block runs up to the next `START-END perms …` line.
    let is_header = |line: &str| {
        line.split_whitespace().next().is_some_and(|range| {
            range.contains('-') && range.chars().all(|c| c == '-' || c.is_ascii_hexdigit())
        })
    };
    smaps
        .lines()
        .skip_while(|line| !line.starts_with(&header))
        .skip(1)
        .take_while(|line| !is_header(line))
        .filter_map(|line| {
            let value = line
                .strip_prefix("Shared_Clean:")
                .or_else(|| line.strip_prefix("Shared_Dirty:"))?;
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .any(|kilobytes| kilobytes > 0)
}

/// Whether locktrace's mapping is still at `base` in the process, its
/// code executable: not after an exec, or an munmap by the program.
fn mapping_in_place(pid: u32, base: u64) -> bool {
    let code = base + layout::CODE as u64;
    let Ok(maps) = target::read_maps(pid) else {
        return false;
    };
    let mut magic = [0u8; 16];
    maps.iter()
        .any(|m| m.contains(code) && m.perms.starts_with("r-x") && m.path.starts_with("/dev/zero"))
        && ProcessMemory::new(pid).read(base, &mut magic) == magic.len()
        && magic == layout::MAGIC
}

/// A line that says all (no "run restore" advice added), and what it
/// means for what was written.
#[derive(Debug)]
struct Said(Written, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// A refusal met while writing, at a ptrace stop, before the patcher
    /// ran: no GOT entry leads to the stubs, and the thread is out of
    /// locktrace's code, so a mapping made for this run can go again.
    Nothing,
    /// A restore that no thread could run: the entries stay switched.
    LeftSwitched,
}

impl Said {
    fn nothing(line: String) -> anyhow::Error {
        Said(Written::Nothing, line).into()
    }

    /// Whether `error` is a line of this kind.
    fn is(error: &anyhow::Error, written: Written) -> bool {
        error
            .downcast_ref::<Said>()
            .is_some_and(|said| said.0 == written)
    }
}

impl std::fmt::Display for Said {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.1)
    }
}

impl std::error::Error for Said {}

/// A restore's failure to stop a thread, in the restore's words: the
/// entries are still switched (`records` still holding their stub, and
/// `strays` more), and what to do. Other errors pass unchanged.
fn in_restore_words(
    error: anyhow::Error,
    pid: u32,
    records: &[PatchRecord],
    strays: usize,
) -> anyhow::Error {
    let Some(no_thread) = error.downcast_ref::<inject::NoThread>() else {
        return error;
    };
    let memory = ProcessMemory::new(pid);
    let holding_stub = |record: &&PatchRecord| {
        let mut word = [0u8; 8];
        memory.read(record.got, &mut word) == 8 && u64::from_le_bytes(word) == record.stub
    };
    let entries = records.iter().filter(holding_stub).count() + strays;
    let (why, then) = match no_thread.why {
        inject::Unavailable::Exited => return error,
        inject::Unavailable::Stopped => (
            format!(
                "process {pid} is stopped (SIGSTOP or job control), so no thread of it can run the restore"
            ),
            format!("continue it (kill -CONT {pid}), then run `locktrace restore --pid {pid}`"),
        ),
        inject::Unavailable::Busy => (
            format!(
                "no thread of process {pid} can run the restore now without disturbing it (each is in a call a stop would cut short, or waits where no stop reaches it, as a vfork's parent does)"
            ),
            format!(
                "run `locktrace restore --pid {pid}` once it runs on (after kill -CONT {pid} if it is stopped)"
            ),
        ),
    };
    Said(Written::LeftSwitched, format!(
        "{why}: its {entries} GOT entries are still switched to locktrace's stubs (they call the real functions: the program works on); {then}"
    ))
    .into()
}

/// Stops a thread of `pid` to write through; when no earlier mapping can
/// be reused, one with room on its own stack for the first mmap's frame.
fn stop_for(
    pid: u32,
    maps: &[Mapping],
    leftovers: &[Leftover],
    cpu_tables: usize,
) -> Result<StoppedThread> {
    let reusable = reusable(leftovers, cpu_tables).is_some();
    inject::stop_a_thread(pid, (!reusable).then_some(maps))
}

/// Refuses, before anything is injected, when a seccomp filter of the
/// stopped thread could stop a call locktrace is about to make in it.
fn check_seccomp(
    pid: u32,
    thread: &StoppedThread,
    source: &Source,
    cpu_tables: usize,
) -> Result<()> {
    let (first_site, bytes) = match source {
        Source::Reuse(_) => (None, None),
        Source::New(gadgets) => (
            Some(gadgets.syscall_ret),
            Some(layout::mapping_bytes(cpu_tables) as u64),
        ),
    };
    seccomp::check(
        pid,
        thread.tid(),
        &seccomp::injected_calls(first_site, bytes),
    )?;
    Ok(())
}

/// Where the mapping injected code runs from comes from: an earlier
/// run's, reused, or a new one made at the target's own gadgets (found
/// once: the seccomp check and the `mmap` both need them).
enum Source<'a> {
    Reuse(&'a Leftover),
    New(Gadgets),
}

fn source<'a>(
    pid: u32,
    maps: &[Mapping],
    leftovers: &'a [Leftover],
    cpu_tables: usize,
) -> Result<Source<'a>> {
    Ok(match reusable(leftovers, cpu_tables) {
        Some(leftover) => Source::Reuse(leftover),
        None => Source::New(find_gadgets(pid, maps)?),
    })
}

/// An earlier run's mapping of this version and size, to count in again.
fn reusable(leftovers: &[Leftover], cpu_tables: usize) -> Option<&Leftover> {
    leftovers.iter().find(|l| {
        !l.shared && l.header.version == layout::VERSION && l.header.cpu_tables == cpu_tables as u64
    })
}

/// The mapping injected code runs from, reused or made.
fn open_mapping(
    thread: &mut StoppedThread,
    target: &Target,
    source: Source,
    cpu_tables: usize,
) -> Result<(u64, MmapMut)> {
    match source {
        Source::Reuse(leftover) => Ok((leftover.start, reuse_mapping(target.pid, leftover)?)),
        Source::New(gadgets) => new_mapping(thread, &target.maps, target.pid, cpu_tables, &gadgets),
    }
}

/// Copies the stub code into the mapping and fills its data words;
/// returns whether each CPU counts in its own table (rseq found).
fn write_code(
    shared: &mut [u8],
    base: u64,
    cpu_tables: usize,
    real: &HashMap<LockOp, u64>,
) -> bool {
    let block = stubs::block();
    let code = &mut shared[layout::CODE..layout::CODE + block.len()];
    code.copy_from_slice(block);
    let mut put = |at: usize, value: u64| {
        code[at..at + 8].copy_from_slice(&value.to_le_bytes());
    };
    put(stubs::TABLES_BASE, base + layout::TABLES as u64);
    // A bench knob (`cargo xtask bench --only franken-inproc`): the
    // alternative of one table all threads count in.
    let one_table = std::env::var_os("LOCKTRACE_INPROC_SHARED_TABLE").is_some();
    let per_cpu = !one_table && has_rdpid();
    put(stubs::USE_RDPID, u64::from(per_cpu));
    put(stubs::CPU_TABLES, cpu_tables as u64);
    put(stubs::OVERFLOW_BASE, base + layout::CONTROL as u64);
    for (&op, &function) in real {
        put(stubs::REAL_FUNCTIONS + 8 * op as usize, function);
    }
    per_cpu
}

/// Whether this CPU has `rdpid` (CPUID leaf 7, ECX bit 22); the target
/// runs on the same CPUs, and Linux keeps the CPU number in TSC_AUX.
fn has_rdpid() -> bool {
    // Leaf 7 exists when leaf 0 reports it.
    core::arch::x86_64::__cpuid(0).eax >= 7
        && core::arch::x86_64::__cpuid_count(7, 0).ecx & (1 << 22) != 0
}

/// Writes the stopped thread's return frame at the top of the mapping's
/// frame region; returns the stack pointer code in the mapping runs with.
fn frame_in_mapping(thread: &StoppedThread, base: u64, shared: &mut [u8]) -> Result<u64> {
    let frame = thread.return_frame(base + layout::FRAME_TOP as u64, 0);
    let offset = (frame.at - base) as usize;
    // Room below the frame for a signal's frame, should one be delivered
    // in this code after locktrace died.
    if offset < layout::FRAMES + 8192 {
        return Err(Said::nothing(format!(
            "thread {}'s FPU state ({} bytes) does not fit locktrace's frame region; use --mode all",
            thread.tid(),
            frame.bytes.len()
        )));
    }
    shared[offset..offset + frame.bytes.len()].copy_from_slice(&frame.bytes);
    Ok(frame.at + 8)
}

/// The `syscall; rt_sigreturn` site of the mapping at `base`.
fn syscall_site(base: u64, rsp: u64) -> Site {
    Site {
        rip: base + (layout::CODE + stubs::SYSCALL_SITE) as u64,
        rsp,
    }
}

/// Runs the patcher over `swaps` in the stopped thread, making read-only
/// GOT pages writable around it; returns the value found in each entry
/// (None: its page is no longer mapped, a library unloaded: not touched).
fn run_patcher(
    thread: &mut StoppedThread,
    base: u64,
    shared: &mut [u8],
    swaps: &[Swap],
) -> Result<Vec<Option<u64>>> {
    let pid = thread.tid();
    let maps = target::read_maps(pid)?;
    let memory = ProcessMemory::new(pid);
    let mapped = |address: u64| {
        let mut word = [0u8; 8];
        maps.iter()
            .any(|m| m.contains(address) && m.perms.starts_with('r'))
            && memory.read(address, &mut word) == 8
    };
    let present: Vec<Swap> = swaps.iter().filter(|s| mapped(s.got)).copied().collect();
    let count = layout::write_list(shared, &present);
    let pages: BTreeMap<u64, i32> = present
        .iter()
        .filter_map(|swap| {
            let page = swap.got & !0xfff;
            let mapping = maps.iter().find(|m| m.contains(swap.got))?;
            (mapping.perms.as_bytes().get(1) != Some(&b'w'))
                .then(|| (page, protection(&mapping.perms)))
        })
        .collect();
    let rsp = frame_in_mapping(thread, base, shared)?;
    for (done, &page) in pages.keys().enumerate() {
        let writable = mprotect(
            thread,
            syscall_site(base, rsp),
            page,
            libc::PROT_READ | libc::PROT_WRITE,
        );
        if let Err(error) = writable {
            // The pages before it get their protection back.
            for (&page, &protection) in pages.iter().take(done) {
                mprotect(thread, syscall_site(base, rsp), page, protection)?;
            }
            return Err(error);
        }
    }
    let entry = syscall_site(base, rsp);
    let patcher = Site {
        rip: base + (layout::CODE + stubs::PATCHER) as u64,
        ..entry
    };
    let end = base + (layout::CODE + stubs::block().len()) as u64;
    let ran = thread.run(patcher, end, base + layout::PATCH_LIST as u64, count as u64);
    for (&page, &protection) in &pages {
        mprotect(thread, entry, page, protection)?;
    }
    ran?;
    let mut results = layout::list_results(shared, count).into_iter();
    Ok(swaps
        .iter()
        .map(|swap| {
            if present.iter().any(|p| p.got == swap.got) {
                results.next()
            } else {
                None
            }
        })
        .collect())
}

fn protection(perms: &str) -> i32 {
    let bytes = perms.as_bytes();
    let mut protection = libc::PROT_NONE;
    for (at, bit) in [
        (0, libc::PROT_READ),
        (1, libc::PROT_WRITE),
        (2, libc::PROT_EXEC),
    ] {
        if bytes.get(at).is_some_and(|&c| c != b'-') {
            protection |= bit;
        }
    }
    protection
}

fn mprotect(thread: &mut StoppedThread, site: Site, page: u64, protection: i32) -> Result<()> {
    let result = thread.syscall(
        site,
        libc::SYS_mprotect as u64,
        [page, 4096, protection as u64, 0, 0, 0],
    )?;
    if result < 0 {
        return Err(Said::nothing(format!(
            "mprotect of the GOT page {page:#x} in the target failed: {} (a sealed page?); use --mode all",
            std::io::Error::from_raw_os_error(-result as i32)
        )));
    }
    Ok(())
}

/// Code in the target that a first mmap can run at, before locktrace's
/// own mapping exists: a `syscall; ret` and the `rt_sigreturn` sequence
/// every libc has (`__restore_rt`).
#[derive(Debug, Clone, Copy)]
struct Gadgets {
    syscall_ret: u64,
    sigreturn: u64,
}

fn find_gadgets(pid: u32, maps: &[Mapping]) -> Result<Gadgets> {
    let memory = ProcessMemory::new(pid);
    let mut order: Vec<&Mapping> = maps
        .iter()
        .filter(|m| m.is_executable() && m.path != "[vsyscall]" && !m.path.starts_with("/dev/zero"))
        .collect();
    // libc first: it surely has both.
    order.sort_by_key(|m| !m.path.contains("libc"));
    let (mut syscall_ret, mut sigreturn) = (None, None);
    for mapping in order {
        let length = ((mapping.end - mapping.start) as usize).min(8 << 20);
        let mut code = vec![0u8; length];
        let read = memory.read(mapping.start, &mut code);
        let code = &code[..read];
        let find = |pattern: &[u8]| {
            code.windows(pattern.len())
                .position(|w| w == pattern)
                .map(|at| mapping.start + at as u64)
        };
        syscall_ret = syscall_ret.or_else(|| find(&[0x0f, 0x05, 0xc3]));
        sigreturn = sigreturn
            .or_else(|| find(&[0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05]))
            .or_else(|| find(&[0xb8, 0x0f, 0, 0, 0, 0x0f, 0x05]));
        if let (Some(syscall_ret), Some(sigreturn)) = (syscall_ret, sigreturn) {
            return Ok(Gadgets {
                syscall_ret,
                sigreturn,
            });
        }
    }
    bail!(
        "process {pid}'s code has no rt_sigreturn sequence locktrace can return through (no libc?); nothing was written; use --mode all"
    )
}

/// A fresh shared mapping in the target, mapped here too. Made from the
/// target's own code, the way back on the thread's stack; taken out again
/// if it cannot be used.
fn new_mapping(
    thread: &mut StoppedThread,
    maps: &[Mapping],
    pid: u32,
    cpu_tables: usize,
    gadgets: &Gadgets,
) -> Result<(u64, MmapMut)> {
    let site = stack_site(thread, maps, gadgets)?;
    let size = layout::mapping_bytes(cpu_tables) as u64;
    let result = thread.syscall(
        site,
        libc::SYS_mmap as u64,
        [
            0,
            size,
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            (libc::MAP_SHARED | libc::MAP_ANONYMOUS) as u64,
            u64::MAX,
            0,
        ],
    )?;
    if (-4095..0).contains(&result) {
        bail!("mmap in the target failed: errno {}", -result);
    }
    let base = result as u64;
    let made = map_here(pid, base, base + size, size as usize).and_then(|shared| {
        let protected = thread.syscall(
            site,
            libc::SYS_mprotect as u64,
            [
                base,
                layout::READ_ONLY_BYTES as u64,
                (libc::PROT_READ | libc::PROT_EXEC) as u64,
                0,
                0,
                0,
            ],
        )?;
        if protected < 0 {
            return Err(Said::nothing(format!(
                "mprotect of locktrace's mapping in the target failed: errno {}",
                -protected
            )));
        }
        Ok(shared)
    });
    match made {
        Ok(shared) => Ok((base, shared)),
        Err(error) => {
            unmap(thread, maps, gadgets, base, size)?;
            Err(error)
        }
    }
}

/// Where a syscall runs from the target's own code (`syscall; ret`), the
/// way back a return frame on the thread's own stack.
fn stack_site(thread: &StoppedThread, maps: &[Mapping], gadgets: &Gadgets) -> Result<Site> {
    let top = thread.stack_top(maps).ok_or_else(|| {
        anyhow!(
            "thread {}'s stack has no room for locktrace's return frame; use --mode all",
            thread.tid()
        )
    })?;
    let frame = thread.return_frame(top, gadgets.sigreturn);
    thread.write(frame.at, &frame.bytes)?;
    Ok(Site {
        rip: gadgets.syscall_ret,
        rsp: frame.at,
    })
}

/// Takes this run's mapping out of the target again (a refusal after it
/// was made). Run from the target's own code: the thread must not come
/// back through code in the mapping it unmaps.
fn unmap(
    thread: &mut StoppedThread,
    maps: &[Mapping],
    gadgets: &Gadgets,
    base: u64,
    size: u64,
) -> Result<()> {
    let site = stack_site(thread, maps, gadgets)?;
    let result = thread.syscall(site, libc::SYS_munmap as u64, [base, size, 0, 0, 0, 0])?;
    if result < 0 {
        bail!(
            "munmap of locktrace's unused mapping at {base:#x} failed: errno {}; it stays in the process, unused",
            -result
        );
    }
    Ok(())
}

/// Maps the target's shared mapping (its first VMA `start..end`) here.
fn map_here(pid: u32, start: u64, end: u64, size: usize) -> Result<MmapMut> {
    let task = target::proc_task(pid);
    let path = format!("/proc/{task}/map_files/{start:x}-{end:x}");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {path}"))?;
    // SAFETY: a shared mapping of the target's shmem; the target writes
    // its counters concurrently, which `read_counts` reads as plain words.
    unsafe { memmap2::MmapOptions::new().len(size).map_mut(&file) }
        .with_context(|| format!("mapping {path}"))
}

/// An earlier run's mapping, reused: its tables emptied.
fn reuse_mapping(pid: u32, leftover: &Leftover) -> Result<MmapMut> {
    let mut shared = map_leftover(pid, &target::read_maps(pid)?, leftover)?;
    shared[layout::CONTROL..].fill(0);
    Ok(shared)
}

/// An earlier run's mapping, mapped here (through its first VMA, the
/// header and code).
fn map_leftover(pid: u32, maps: &[Mapping], leftover: &Leftover) -> Result<MmapMut> {
    let first = maps
        .iter()
        .find(|m| m.start == leftover.start)
        .ok_or_else(|| {
            anyhow!(
                "locktrace's earlier mapping at {:#x} went away",
                leftover.start
            )
        })?;
    map_here(pid, first.start, first.end, leftover.header.size as usize)
}

/// The swaps that put recorded entries back: from the stub to the original.
fn restoring(records: &[PatchRecord]) -> Vec<Swap> {
    records
        .iter()
        .map(|record| Swap {
            got: record.got,
            expected: record.stub,
            new: record.original,
        })
        .collect()
}

/// Mappings of earlier runs (their header's magic), and one line for
/// each mapping with the magic that is not one (left as it is, never
/// read past its end); refuses when the run that owns one is still going.
fn leftovers(pid: u32, maps: &[Mapping]) -> Result<(Vec<Leftover>, Vec<String>)> {
    let memory = ProcessMemory::new(pid);
    let mut found = Vec::new();
    let mut ignored = Vec::new();
    for mapping in maps
        .iter()
        .filter(|m| m.path.starts_with("/dev/zero") && m.perms.ends_with('s'))
    {
        // Within this mapping only: the read would run on into the next.
        let length = (mapping.end - mapping.start).min(layout::CODE as u64) as usize;
        let mut page = vec![0u8; length];
        let read = memory.read(mapping.start, &mut page);
        page.truncate(read);
        if !layout::has_magic(&page) {
            continue;
        }
        let header = match Header::garbled(&page).or_else(|| object_mismatch(pid, mapping, &page)) {
            Some(why) => {
                ignored.push(format!(
                    "a mapping at {:#x} in process {pid} starts like locktrace's but is not one it made ({why}): left as it is",
                    mapping.start
                ));
                continue;
            }
            None => {
                Header::parse(&page).ok_or_else(|| anyhow!("header at {:#x}", mapping.start))?
            }
        };
        if header.owner_pid != 0
            && header.owner_pid != std::process::id()
            && target::is_running(header.owner_pid, header.owner_start)
        {
            bail!(
                "another locktrace (pid {}) is counting in process {pid} with --mode inproc; wait for it to end, or use --mode all",
                header.owner_pid
            );
        }
        found.push(Leftover {
            start: mapping.start,
            header,
            shared: mapped_elsewhere(pid, mapping.start),
        });
    }
    Ok((found, ignored))
}

/// What makes a well-formed header (`page`) at `mapping` not locktrace's:
/// the shared memory behind it is not the size the header says (touching
/// it past its end would be SIGBUS), or a record's stub is not in its code.
fn object_mismatch(pid: u32, mapping: &Mapping, page: &[u8]) -> Option<String> {
    let header = Header::parse(page)?;
    let task = target::proc_task(pid);
    let path = format!(
        "/proc/{task}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    );
    let object = match std::fs::metadata(&path) {
        Ok(metadata) => metadata.len(),
        Err(error) => return Some(format!("its memory cannot be sized: {error}")),
    };
    if object != header.size {
        return Some(format!(
            "its header says {} bytes, the memory behind it holds {object}",
            header.size
        ));
    }
    let code = mapping.start + layout::CODE as u64..mapping.start + layout::CONTROL as u64;
    header
        .patches
        .iter()
        .find(|record| !code.contains(&record.stub))
        .map(|record| {
            format!(
                "a GOT entry record's stub {:#x} is outside its code",
                record.stub
            )
        })
}

/// Switches earlier runs' entries back (with the patcher of the mapping
/// at `base`), and clears their headers; returns how many were restored.
fn restore_leftovers(
    thread: &mut StoppedThread,
    base: u64,
    shared: &mut [u8],
    leftovers: &[Leftover],
) -> Result<u64> {
    let pid = thread.tid();
    let mut restored = 0;
    for leftover in leftovers.iter().filter(|l| !l.header.patches.is_empty()) {
        let swaps = restoring(&leftover.header.patches);
        let found = run_patcher(thread, base, shared, &swaps)?;
        restored += found
            .iter()
            .zip(&leftover.header.patches)
            .filter(|(value, record)| **value == Some(record.stub))
            .count() as u64;
        let mut header = leftover.header.clone();
        header.patches.clear();
        header.owner_pid = 0;
        if leftover.start == base {
            header.write(&mut shared[..layout::CODE]);
        } else {
            let mut theirs = map_leftover(pid, &target::read_maps(pid)?, leftover)?;
            header.write(&mut theirs[..layout::CODE]);
        }
    }
    Ok(restored)
}

/// CPUs the kernel may ever number (`/sys/devices/system/cpu/possible`).
fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|text| {
            text.trim()
                .split(',')
                .filter_map(|range| range.rsplit('-').next()?.parse::<usize>().ok())
                .max()
        })
        .map(|last| last + 1)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// What `locktrace restore --pid` did: entries switched back, and the
/// mappings it left alone (one line each).
pub(crate) struct Restored {
    pub entries: u64,
    pub ignored: Vec<String>,
}

/// `locktrace restore --pid`: switches back what a killed run left.
pub(crate) fn restore_pid(pid: u32) -> Result<Restored> {
    let target = Target::open(pid)?;
    let (leftovers, ignored) = leftovers(pid, &target.maps)?;
    let entries = restore_leftovers_of(&target, &leftovers)?;
    Ok(Restored { entries, ignored })
}

/// Switches back the entries `leftovers` name, and stray stubs.
fn restore_leftovers_of(target: &Target, leftovers: &[Leftover]) -> Result<u64> {
    let pid = target.pid;
    if leftovers.is_empty() {
        return Ok(0);
    }
    let functions = crate::probe::lockfuncs::find(target)?;
    let real: HashMap<LockOp, u64> = functions
        .iter()
        .map(|f| (f.op, f.runtime_start))
        .rev()
        .collect();
    let ops: Vec<LockOp> = real.keys().copied().collect();
    // Entries a header names, and stray stubs (a forked child's) alike.
    let strays: Vec<Swap> = plan(target, &ops, &real, leftovers)
        .switch
        .iter()
        .filter(|p| p.current != p.original)
        .map(|p| Swap {
            got: p.slot.address,
            expected: p.current,
            new: p.original,
        })
        .collect();
    let recorded = leftovers.iter().any(|l| !l.header.patches.is_empty());
    if !recorded && strays.is_empty() {
        return Ok(0);
    }
    let cpu_tables = possible_cpus();
    let records: Vec<PatchRecord> = leftovers
        .iter()
        .flat_map(|l| l.header.patches.iter().copied())
        .collect();
    let mut thread = stop_for(pid, &target.maps, leftovers, cpu_tables)
        .map_err(|error| in_restore_words(error, pid, &records, strays.len()))?;
    let source = source(pid, &target.maps, leftovers, cpu_tables)?;
    check_seccomp(pid, &thread, &source, cpu_tables)?;
    let restored = (|| {
        let (base, mut shared) = open_mapping(&mut thread, target, source, cpu_tables)?;
        write_code(&mut shared, base, cpu_tables, &real);
        let restored = restore_leftovers(&mut thread, base, &mut shared, leftovers)?;
        Ok::<_, anyhow::Error>(restored + restore_strays(&mut thread, base, &mut shared, &strays)?)
    })();
    thread.release()?;
    restored
}

/// Switches stray stub entries back to the real functions, with the
/// patcher of the mapping at `base`.
fn restore_strays(
    thread: &mut StoppedThread,
    base: u64,
    shared: &mut [u8],
    swaps: &[Swap],
) -> Result<u64> {
    // Recorded entries were restored first: the rest still hold stubs.
    let memory = ProcessMemory::new(thread.tid());
    let still: Vec<Swap> = swaps
        .iter()
        .filter(|swap| {
            let mut word = [0u8; 8];
            memory.read(swap.got, &mut word) == 8 && u64::from_le_bytes(word) == swap.expected
        })
        .copied()
        .collect();
    if still.is_empty() {
        return Ok(0);
    }
    let found = run_patcher(thread, base, shared, &still)?;
    Ok(found
        .iter()
        .zip(&still)
        .filter(|(value, swap)| **value == Some(swap.expected))
        .count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::{got::GotSlot, memory::FakeMemory};

    const LOCK: u64 = 0x7f00_0000_1000;
    const PLT: (u64, u64) = (0x5000_1000, 0x5000_2000);
    const GOT: u64 = 0x5000_8000;

    fn slot(address: u64) -> GotSlot {
        GotSlot {
            op: LockOp::MutexLock,
            module: "/srv/app".into(),
            address,
            module_code: (0x5000_0000, 0x5000_4000),
            plt: PLT,
        }
    }

    /// The program's GOT at `GOT` holding `value`, one entry per value.
    fn planned(values: &[u64], bind_now: bool, leftovers: &[Leftover]) -> Plan {
        let mut memory = FakeMemory::default();
        memory.map(GOT, vec![0; 8 * values.len()]);
        for (index, value) in values.iter().enumerate() {
            memory.put_u64(GOT + 8 * index as u64, *value);
        }
        let slots = (0..values.len() as u64)
            .map(|i| slot(GOT + 8 * i))
            .collect();
        let found = FoundEntries {
            modules: vec![got::ModuleGot {
                module: "/srv/app".into(),
                slots,
                bind_now,
            }],
            unreadable: vec![("/srv/gone.so".into(), "deleted".into())],
        };
        let real = HashMap::from([(LockOp::MutexLock, LOCK)]);
        plan_entries(&memory, found, &[LockOp::MutexLock], &real, leftovers)
    }

    /// An earlier run's mapping at `base` whose header records `GOT`
    /// switched from `LOCK`.
    fn leftover(base: u64, recorded: bool) -> Leftover {
        let patches = recorded
            .then(|| layout::PatchRecord {
                got: GOT,
                original: LOCK,
                stub: stub_address(base, LockOp::MutexLock),
            })
            .into_iter()
            .collect();
        Leftover {
            start: base,
            header: layout::Header {
                version: 1,
                owner_pid: 1,
                owner_start: 1,
                size: 4096,
                cpu_tables: 1,
                patches,
            },
            shared: false,
        }
    }

    #[test]
    fn a_bound_entry_is_switched_from_the_real_function() {
        let plan = planned(&[LOCK], true, &[]);
        assert_eq!(plan.switch.len(), 1);
        let entry = &plan.switch[0];
        assert_eq!(
            (entry.original, entry.current, entry.unresolved),
            (LOCK, LOCK, false)
        );
        assert!(plan.bind_now["/srv/app"]);
        assert_eq!(
            plan.skipped,
            [(
                LockOp::MutexLock,
                "/srv/gone.so not read: deleted".to_string()
            )]
        );
    }

    #[test]
    fn a_lazy_entry_is_switched_from_its_plt_and_said_unresolved() {
        let plan = planned(&[PLT.0 + 0x30], false, &[]);
        let entry = &plan.switch[0];
        assert_eq!((entry.original, entry.unresolved), (PLT.0 + 0x30, true));
        assert!(!plan.bind_now["/srv/app"]);
    }

    #[test]
    fn a_foreign_value_is_left_alone_with_why() {
        // The module's own code, outside its PLT: the program's own hook.
        let plan = planned(&[0x5000_3000], true, &[]);
        assert!(plan.switch.is_empty());
        assert!(
            plan.skipped[1]
                .1
                .contains("holds 0x50003000, not pthread_mutex_lock at 0x7f0000001000: left alone"),
            "{:?}",
            plan.skipped
        );
    }

    #[test]
    fn an_earlier_runs_stub_is_switched_back_to_what_it_replaced() {
        let base = 0x7e00_0000_0000;
        let stub = stub_address(base, LockOp::MutexLock);
        // Recorded in the earlier run's header: the original comes from it.
        let plan = planned(&[stub], true, &[leftover(base, true)]);
        let entry = &plan.switch[0];
        assert_eq!((entry.original, entry.current), (LOCK, LOCK));
        // Not recorded (a forked child's copy): a stray stub, still ours.
        let plan = planned(&[stub], true, &[leftover(base, false)]);
        let entry = &plan.switch[0];
        assert_eq!(
            (entry.original, entry.current, entry.unresolved),
            (LOCK, stub, false)
        );
    }

    #[test]
    fn an_unreadable_entry_and_entries_past_the_table_are_skipped() {
        let mut values = vec![LOCK; layout::MAX_PATCHES + 2];
        values.push(LOCK);
        let plan = planned(&values, true, &[]);
        assert_eq!(plan.switch.len(), layout::MAX_PATCHES);
        let past = plan
            .skipped
            .iter()
            .filter(|(_, why)| why.contains(&format!("more than {} entries", layout::MAX_PATCHES)))
            .count();
        assert_eq!(past, 3);
        let mut memory = FakeMemory::default();
        memory.map(GOT, vec![0; 8]);
        let found = FoundEntries {
            modules: vec![got::ModuleGot {
                module: "/srv/app".into(),
                slots: vec![slot(GOT + 0x1000)],
                bind_now: true,
            }],
            unreadable: Vec::new(),
        };
        let real = HashMap::from([(LockOp::MutexLock, LOCK)]);
        let plan = plan_entries(&memory, found, &[LockOp::MutexLock], &real, &[]);
        assert_eq!(
            plan.skipped,
            [(
                LockOp::MutexLock,
                "/srv/app entry at 0x50009000 not readable".to_string()
            )]
        );
    }

    #[test]
    fn shared_pages_are_read_from_the_mappings_own_block() {
        let smaps = "\
7f0000000000-7f0000003000 r-xs 00000000 00:01 1345 /dev/zero (deleted)
Rss:                   4 kB
Shared_Clean:          0 kB
Shared_Dirty:          0 kB
Private_Dirty:         4 kB
7f0000010000-7f0000020000 r-xp 00000000 08:01 99 /usr/lib/libc.so.6
Shared_Clean:        400 kB
";
        assert!(!shared_pages(smaps, 0x7f00_0000_0000));
        assert!(shared_pages(smaps, 0x7f00_0001_0000));
        let forked = smaps.replace("Shared_Dirty:          0 kB", "Shared_Dirty:          4 kB");
        assert!(shared_pages(&forked, 0x7f00_0000_0000));
        assert!(!shared_pages(smaps, 0x1000));
    }
}
