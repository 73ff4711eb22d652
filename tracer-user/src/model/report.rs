//! The report: a plain serde structure that the table, JSON, folded stacks,
//! pprof and compare all read. Built by `analysis`, named by `naming`.
//!
//! Schema `locktrace.report/1`: later versions add fields, never rename them.
use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use super::{
    Coverage, CpuReport, Deadlock, Estimate, Holds, InProgress, LockKind, Mode, Overhead,
    PerRequest, Placement, Requests, StopReason, WaitClass, WaitHolder, address,
};

pub(crate) const SCHEMA: &str = "locktrace.report/1";

/// A locktrace report: what `record --json` writes and `report` and
/// `compare` read. Required are the fields this version always writes; a
/// field with a `default` may be absent from reports of older versions,
/// and reads as that default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Report {
    /// `locktrace.report/1`: later versions add fields, never rename them.
    #[schemars(extend("const" = SCHEMA))]
    pub schema: String,
    pub target: TargetInfo,
    pub duration_s: f64,
    pub mode: Mode,
    /// Null in contention mode (no lock probes).
    #[serde(default)]
    pub placement: Option<Placement>,
    /// Why recording stopped.
    #[serde(default)]
    pub stopped_by: StopReason,
    /// Sorted by acquisitions, then contended waits.
    pub locks: Vec<Lock>,
    /// Top user stacks per lock (`--stacks N`), innermost frame first.
    #[serde(default)]
    pub stacks: Vec<LockStack>,
    /// How the locks were named (see symbolize).
    #[serde(default)]
    pub naming: Option<Naming>,
    /// Events that could not be counted, by reason (zero counts omitted).
    pub dropped: BTreeMap<super::DropReason, u64>,
    pub totals: Totals,
    /// Request count and source, when requests were counted (`--load`, `--request-probe`, `--requests`).
    #[serde(default)]
    pub requests: Option<Requests>,
    /// Lock functions where `--placement auto` fell back to the entry, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement_fallbacks: Vec<PlacementFallback>,
    /// Sampled mode: how the lock counts were estimated (they are scaled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<Estimate>,
    /// What tracing cost the target and the tracer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<Overhead>,
    /// Whether children were followed, and an exec of the target, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Coverage>,
    /// Waits and holds still going on when the recording stopped.
    #[serde(default)]
    pub in_progress: Vec<InProgress>,
    /// Cycles among those waits: threads that can never go on.
    #[serde(default)]
    pub deadlocks: Vec<Deadlock>,
    /// The target's CPU time over the window and what its lock code cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuReport>,
    /// What this kernel's BPF could not do for the recording, one line
    /// each (Linux before 5.15: no wait stacks, no Go runtime waits).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel_limits: Vec<String>,
    /// `--php`: where PHP's state was found, and what could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub php: Option<super::PhpContext>,
    /// `--php`: each route's requests and locks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<super::Routes>,
    /// `--mode inproc`: which mechanism counted each lock function, what
    /// was written into the target, and whether it was put back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inproc: Option<super::Inproc>,
    /// Kernel lock contention of the target's threads (Linux 5.19+), or
    /// why it is unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_locks: Option<super::KernelLocks>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct PlacementFallback {
    pub function: String,
    pub module: String,
    pub reason: super::PlacementRefusal,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct TargetInfo {
    pub pid: u32,
    pub exe: String,
    pub cmdline: Vec<String>,
}

// One lock's row in a report: its counts since attach and everything
// naming and analysis found about it, the one lock type saved and read
// back; `live::LockActivity` (an interval's change) and `compare`'s
// `Group` (rows of one identity summed) are derived from it. (A plain
// comment: a doc comment here would become the schema's description.)
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Lock {
    /// Address in the target (`"0x…"` in JSON). In the code, a row of
    /// memory that went away during the recording (`lifetime`) carries
    /// above the address bits which of the address's lifetimes it is
    /// (`tracer_common::lifetime`), so that each row has its own key.
    #[serde(
        serialize_with = "address::serialize_without_lifetime",
        deserialize_with = "address::deserialize"
    )]
    #[schemars(with = "address::Hex")]
    pub address: u64,
    pub kind: LockKind,
    /// Lock calls; null where lock functions were not probed.
    pub acquisitions: Option<u64>,
    /// Lock calls per function (`pthread_mutex_lock`: n, …); for the
    /// functions that may fail (trylock, timed, clock), successful calls only.
    #[serde(default)]
    pub calls: BTreeMap<String, u64>,
    /// `--mode inproc`: what counted the lock's calls (stubs behind the
    /// GOT entries, uprobes, or both for calls of different functions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counted_by: Vec<super::CountedBy>,
    /// Calls that returned without the lock (a busy trylock, a timed-out
    /// lock): not in `acquisitions`. Absent when there were none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_tries: Option<u64>,
    /// Futex waits on the lock (each one a contended acquisition).
    pub contended: u64,
    pub wakes: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
    /// Figures per request; null without a request count.
    #[serde(default)]
    pub per_request: Option<PerRequest>,
    /// Symbol (`g_lock`, `g_struct+0x40`) or pointer chain from a global
    /// (`*g_stats->+0x20`, C notation); null when neither was found.
    #[serde(default)]
    pub name: Option<String>,
    /// Memory holding the lock: a module section (`.data`, `.bss`), `[heap]`,
    /// `[stack]`, `thread stack`, `anonymous`, …
    #[serde(default)]
    pub region: super::Region,
    /// Module (path as the target sees it) whose data holds the lock.
    #[serde(default)]
    pub module: Option<String>,
    /// Functions that called the lock functions on it, most frequent first
    /// (for a futex-only lock, with `--stacks`: who waited on it, per wait).
    #[serde(default)]
    pub callers: Vec<Caller>,
    /// Sampled mode: `acquisitions` is an estimate within ± this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquisitions_error: Option<u64>,
    /// What its futex waits are: lock contention (`lock`) or not
    /// (`condvar`, `go_runtime`, `other`); only `lock` counts in the totals.
    #[serde(default)]
    pub wait_class: WaitClass,
    /// Futex waits by duration: `[upper_bound_ns, count]`, log2 buckets
    /// (non-empty ones), counts adding up to `contended`.
    #[serde(default)]
    pub wait_histogram: Vec<(u64, u64)>,
    /// Who held the lock while others waited, most waits first.
    #[serde(default)]
    pub holders: Vec<WaitHolder>,
    /// `--hold-times`: completed holds; null where not recorded.
    #[serde(default)]
    pub holds: Option<Holds>,
    /// Acquisitions on another CPU than the lock's previous acquisition
    /// (its cache line moved), by cache distance, with their cost; null
    /// where not counted (without `--handoffs`; contention mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoffs: Option<super::Handoffs>,
    /// The name in offsets from the symbol (`*g_stats->+0x10`), as
    /// without debug info; what older reports called the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset_name: Option<String>,
    /// The raw route to the lock, for tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<LockChain>,
    /// Other routes to the same heap lock, the runner-up first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<AlternativeName>,
    /// Sampled CPU time in lock code working on this lock (its functions,
    /// libc's slow paths, the kernel's futex code on its words); null when
    /// CPU was not sampled (`--no-cpu`).
    #[serde(default)]
    pub cpu_ns: Option<u64>,
    /// `cpu_ns` is within ± this (two standard deviations of the sample
    /// count plus one sample period).
    #[serde(default)]
    pub cpu_error_ns: Option<u64>,
    /// Where the lock was created (`--stacks`): its init call's stack, or
    /// its first use when no init call was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<Creation>,
    /// What the module's DWARF declares the lock to be; absent without
    /// debug info or a typed variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<DeclaredType>,
    /// The memory holding the lock went away during the recording (an
    /// unmap such as `dlclose`, or an exec): this row counts the lock that
    /// was there, another row the one there now. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime: Option<super::EndedLifetime>,
    /// A row of the locks named by one creation site (`--group-by site`,
    /// the default; init calls seen): the addresses and objects it stands
    /// for, and each address's own figures. Absent on rows kept per
    /// address (`--group-by address`, locks named otherwise or first used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<SiteGroup>,
    /// `--hold-times`: the share of the time the lock was held and what a
    /// queueing model predicts from it; null without hold times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saturation: Option<super::Saturation>,
    /// The CPU removing the lock would save, part by part; null where no
    /// part could be priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removal: Option<super::Removal>,
    /// Sampled CPU in the kernel's futex code on the lock's words: part of
    /// `cpu_ns`; null when CPU was not sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_kernel_ns: Option<u64>,
    /// Kernel lock contentions inside the futex calls on the lock's words
    /// (the futex hash bucket's spinlock, the scheduler's runqueue locks
    /// its waits and wakes take); null where none were seen or kernel
    /// locks were not traced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_contentions: Option<u64>,
    /// Their wait time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_wait_ns: Option<u64>,
}

/// The locks one creation-site row stands for.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct SiteGroup {
    /// Addresses merged into the row.
    pub addresses: u64,
    /// Objects seen: the init calls at those addresses (an address reused
    /// by one object after another counts each), and one for each address
    /// no init call was seen at.
    pub objects: u64,
    /// Each address's own figures, most acquisitions first.
    pub by_address: Vec<AddressFigures>,
}

/// One address's figures inside a [`SiteGroup`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct AddressFigures {
    #[serde(
        serialize_with = "address::serialize_without_lifetime",
        deserialize_with = "address::deserialize"
    )]
    #[schemars(with = "address::Hex")]
    pub address: u64,
    pub acquisitions: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_tries: Option<u64>,
    pub contended: u64,
    pub wakes: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
    #[serde(default)]
    pub cpu_ns: Option<u64>,
    /// Init calls seen at this address.
    pub inits: u64,
    pub region: super::Region,
}

/// A lock's type in its module's DWARF (or, for a stripped CPython's GIL,
/// in locktrace's table for its version).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub struct DeclaredType {
    /// The lock's own type (`Mutex<u64>`, `pthread_cond_t`).
    #[serde(rename = "type")]
    pub type_name: String,
    /// The nearest named type holding it (`_gil_runtime_state`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inside: Option<String>,
    /// Why its waits count as lock contention although no lock function
    /// was seen working on it; absent when the type changed nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contention: Option<DeclaredContention>,
    /// Where the type came from: the module's DWARF, or locktrace's table
    /// (a stripped CPython's GIL, found by `_PyRuntime` and `Py_Version`).
    #[serde(default)]
    pub layout: super::LayoutSource,
}

/// Waits that only the declared type shows to be lock contention.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeclaredContention {
    /// A futex word typed as a lock (Rust's `std::sync::Mutex`, whose fast
    /// path is inlined: no lock function to probe).
    FutexLock,
    /// A condition variable inside a lock built from a mutex and a condvar
    /// (CPython's GIL, `_gil_runtime_state`): its waiters wait for the lock.
    CondvarOfLock,
}

/// Where a lock was created.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Creation {
    pub by: CreatedBy,
    /// The stack, innermost first: from the caller of the init function
    /// (`init`) or of the lock function (`first_use`).
    pub site: Vec<Frame>,
    /// Init calls seen at this address (objects created there one after
    /// another: a per-request object at a reused address).
    pub inits: u64,
}

impl Creation {
    /// Functions of the site a name shows.
    pub(crate) const NAMED_FRAMES: usize = 3;

    /// The name of a lock no symbol or pointer chain names:
    /// `mutex created in f <- g <- h`, `rwlock first used in f <- g <- h`.
    pub(crate) fn site_name(&self, kind: LockKind) -> String {
        let kind = match kind {
            LockKind::Rwlock => "rwlock",
            LockKind::Spinlock => "spinlock",
            _ => "mutex",
        };
        let verb = match self.by {
            CreatedBy::Init => "created in",
            CreatedBy::FirstUse => "first used in",
            CreatedBy::NotRecorded => {
                return format!("{kind} created at a site not recorded (stack count map full)");
            }
        };
        let functions: Vec<String> = self
            .site
            .iter()
            .take(Self::NAMED_FRAMES)
            .map(Frame::code_label)
            .collect();
        format!("{kind} {verb} {}", functions.join(" <- "))
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CreatedBy {
    /// A `pthread_*_init` call seen while tracing.
    Init,
    /// No init call seen: created before attach, or statically initialized
    /// or zeroed (`PTHREAD_MUTEX_INITIALIZER`, `calloc`); the site is its
    /// first use after attach.
    FirstUse,
    /// The lock's stacks did not fit in the stack count map
    /// (`dropped.stack_counts_full`): its site is not known. Such locks
    /// are one row under `--group-by site`, their acquisitions in
    /// `dropped.sites_not_recorded`.
    NotRecorded,
}

impl Lock {
    /// A row with no counts yet.
    pub(crate) fn empty(address: u64, kind: LockKind, wait_class: WaitClass) -> Lock {
        Lock {
            address,
            kind,
            acquisitions: None,
            calls: BTreeMap::new(),
            counted_by: Vec::new(),
            failed_tries: None,
            contended: 0,
            wakes: 0,
            wait_ns: 0,
            max_wait_ns: 0,
            per_request: None,
            name: None,
            region: super::Region::Unset,
            module: None,
            callers: Vec::new(),
            acquisitions_error: None,
            wait_class,
            wait_histogram: Vec::new(),
            holders: Vec::new(),
            holds: None,
            handoffs: None,
            offset_name: None,
            chain: None,
            alternatives: Vec::new(),
            cpu_ns: None,
            cpu_error_ns: None,
            created: None,
            declared: None,
            lifetime: None,
            group: None,
            saturation: None,
            removal: None,
            cpu_kernel_ns: None,
            kernel_contentions: None,
            kernel_wait_ns: None,
        }
    }

    /// The lock's address, without the lifetime bits of its key.
    pub(crate) fn shown_address(&self) -> u64 {
        tracer_common::lifetime::split(self.address).0
    }

    /// True for lock contention (the main table and the totals).
    pub fn is_contention(&self) -> bool {
        self.wait_class == WaitClass::Lock
    }
}

/// Futex figures of one wait class.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct ClassTotals {
    /// Rows (locks or futex words) of the class.
    pub words: usize,
    pub waits: u64,
    pub wakes: u64,
    pub wait_ns: u64,
    /// Waits and wait time per request; null without a request count.
    #[serde(default)]
    pub per_request: Option<PerRequest>,
}

/// A route from a global to a lock: the pointer stored at `offsets[0]` in
/// `root` points to an object whose pointer at `offsets[1]` points to the
/// next, …; the lock is at the last offset of the last object. One offset:
/// the lock is inside the global itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct LockChain {
    /// Module (as the target sees it) whose data holds `root`.
    pub module: String,
    /// The root variable, as in the symbol table (or DWARF).
    pub root: String,
    pub offsets: Vec<u64>,
}

/// Another name of the same lock (a longer route to it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct AlternativeName {
    pub name: String,
    pub offset_name: String,
    pub chain: LockChain,
}

/// Naming during the recording: pointer chains searched for heap locks
/// while the target is alive, so a target that exits first keeps them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct LiveNaming {
    /// Searches run (about one a second while new heap locks appear).
    pub searches: u64,
    /// Heap locks searched for, and named, during the recording.
    pub heap_locks_seen: usize,
    pub heap_locks_named: usize,
    /// Time spent (searches, and reading the modules' symbols once, which
    /// naming at the end then reuses), and the longest search (each is bounded).
    pub elapsed_ms: f64,
    pub max_search_ms: f64,
}

/// A code location: function (demangled) and module, and the offset of the
/// address in the function (in the module when the function is unknown; the
/// absolute address when the module is unknown too).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
pub struct Frame {
    pub function: Option<String>,
    pub module: Option<String>,
    pub offset: u64,
    /// A PHP frame (`--php`): its file and line; `module` is then null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub php: Option<PhpLocation>,
}

impl Frame {
    /// Its function, else `libphp.so+0x2e38d9` (the module's file name and
    /// the offset in it), else the bare address: as people read a frame.
    pub fn code_label(&self) -> String {
        match (&self.function, &self.module) {
            (Some(function), _) => function.clone(),
            (None, Some(module)) => {
                let file = module.rsplit('/').next().unwrap_or(module);
                format!("{file}+{:#x}", self.offset)
            }
            (None, None) => format!("{:#x}", self.offset),
        }
    }
}

/// Where a PHP frame runs: the file (the end of its path, empty for a
/// function written in C) and the line (0 there).
#[derive(
    Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub struct PhpLocation {
    pub file: String,
    pub line: u32,
}

/// Calls per call site: `(function, module, offset)`.
pub(crate) type CallSites = BTreeMap<(Option<String>, Option<String>, u64), u64>;

/// Call sites as report callers, most frequent first.
pub(crate) fn sorted_callers(sites: CallSites) -> Vec<Caller> {
    let mut callers: Vec<Caller> = sites
        .into_iter()
        .map(|((function, module, offset), count)| Caller {
            function,
            module,
            offset,
            count,
        })
        .collect();
    callers.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.function.cmp(&b.function))
    });
    callers
}

/// One caller of a lock: the call site's function and the return address's offset in it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Caller {
    pub function: Option<String>,
    pub module: Option<String>,
    pub offset: u64,
    pub count: u64,
}

impl Caller {
    /// The call site as a frame.
    pub(crate) fn frame(&self) -> Frame {
        Frame {
            function: self.function.clone(),
            module: self.module.clone(),
            offset: self.offset,
            php: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct LockStack {
    /// Address of the lock, as in `locks[].address`.
    #[serde(with = "address")]
    #[schemars(with = "address::Hex")]
    pub lock: u64,
    pub count: u64,
    /// Innermost first.
    pub frames: Vec<Frame>,
    /// How the frames were found (absent in reports before it was added).
    #[serde(default)]
    pub unwound_by: StackSource,
    /// What `count` counts (absent in reports before it was added, whose
    /// stacks are of lock calls or waits, told apart by their first frame).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<StackOrigin>,
    /// `--php`: the route (as in `routes`) whose requests the stack's
    /// snapshots were taken in; absent without `--php`, or for a stack
    /// without snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// Why locktrace's unwinder stopped this stack short of its outermost
    /// frame, when a frame's call-frame rule could not be evaluated (absent
    /// otherwise: a stack that ends at the thread's start, or where the
    /// copied stack or the call-frame information runs out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<StackEnd>,
}

impl LockStack {
    /// True for a stack of CPU samples (its count is samples, not calls).
    pub(crate) fn is_cpu(&self) -> bool {
        self.source == Some(StackOrigin::CpuSamples)
    }

    /// True for a stack of the inproc stubs' sampled acquisitions (its
    /// count is samples, one in `inproc.stack_sample_every` calls).
    pub(crate) fn is_sampled(&self) -> bool {
        self.source == Some(StackOrigin::SampledLockCalls)
    }
}

/// What a stack's count counts.
#[derive(
    Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum StackOrigin {
    /// Lock calls: acquisitions of the lock from this stack.
    LockCalls,
    /// Contended waits (futex waits) on the lock.
    Waits,
    /// The CPU sampler's lock-code samples of the lock (each 1/`cpu.sample_hz`
    /// s of CPU): user mode in a lock function, or in the kernel inside a
    /// futex syscall (first frame `[kernel] futex`).
    CpuSamples,
    /// `--mode inproc --stacks`: acquisitions the stubs sampled, one in
    /// `inproc.stack_sample_every` per lock, call site and CPU. The count
    /// is samples, never scaled (the lock's row counts every acquisition
    /// exactly); first frame the lock function called, then its caller.
    SampledLockCalls,
}

/// How a stack's frames were found.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StackSource {
    /// The kernel's frame-pointer walk: it stops at the first function
    /// built without frame pointers.
    #[default]
    FramePointers,
    /// locktrace's unwinder, from a stack snapshot and the modules'
    /// call-frame information (frame pointers where a module has none);
    /// the count is the snapshots' share of the exact count of their
    /// (lock, immediate caller).
    CallFrameInfo,
    /// No snapshot of it arrived (the ring buffer was full): the immediate
    /// caller only, with its exact count.
    CallerOnly,
    /// CPU samples with no snapshot unwound (the ring buffer was full):
    /// no frames, the exact sample count.
    NoSnapshot,
}

/// Why the unwinder stopped a stack at a frame whose call-frame rule (its
/// CFA, return address or frame pointer) is a DWARF expression it could not
/// evaluate within its budgets: such an expression may loop forever
/// (`DW_OP_skip` or `DW_OP_bra` backwards). The stack keeps the frames
/// before that one.
#[derive(
    Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum StackEnd {
    /// One expression ran past the steps one expression may take.
    ExpressionBudget,
    /// The stack's expressions together ran past the steps one stack may
    /// take.
    StackBudget,
}

impl StackEnd {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            StackEnd::ExpressionBudget => "unwinding stopped: a call-frame expression looped",
            StackEnd::StackBudget => "unwinding stopped: call-frame expressions too long",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Naming {
    pub elapsed_ms: f64,
    /// ELF modules whose symbols were read.
    pub modules: usize,
    /// `module <- debug file` for modules with separate debug symbols.
    pub debug_files: Vec<String>,
    /// What the heap pointer-chain search found, or why it did not run.
    pub pointer_chains: super::PointerChains,
    /// Modules with only exported symbols (stripped, no debug file found)
    /// that left locks or callers of this report unnamed.
    #[serde(default)]
    pub stripped: Vec<String>,
    /// For each of `stripped`: what its debug file is found by, and what
    /// was tried (the footer's one line on why frames are unnamed and what
    /// would name them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stripped_lookups: Vec<StrippedModule>,
    /// `module <- file (N variables, T ms)`: DWARF read to name fields.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub debug_info: Vec<String>,
    /// Pointer chains searched during the recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveNaming>,
    /// Files whose symbols or DWARF were not (fully) read, and why: the
    /// names they would give are missing or not to be trusted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_files: Vec<SkippedFile>,
}

/// A stripped module that left names missing: where its debug file was
/// looked for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct StrippedModule {
    pub module: String,
    /// Its GNU build-id in hex: its debug file is
    /// `/usr/lib/debug/.build-id/xx/rest.debug`, and debuginfod serves it by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    /// The debug file its `.gnu_debuglink` names, looked for next to it, in
    /// its `.debug` directory and under `/usr/lib/debug`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debug_link: Option<String>,
    /// Whether `$DEBUGINFOD_URLS` was set (its servers were asked).
    pub debuginfod: bool,
}

/// A module or debug file naming did not read (fully).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct SkippedFile {
    pub file: String,
    pub reason: SkipReason,
    /// The specifics, for a reader (sizes, the section).
    pub detail: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// Truncated or rewritten in place while mapped: read as zeros past its new end.
    ShrankWhileRead,
    /// Its DWARF decompresses past the caps (a compression bomb, or too big).
    DwarfTooLarge,
    /// A compressed DWARF section that does not decompress.
    DwarfCorrupt,
    /// A `.gnu_debuglink` names a file too large to checksum.
    DebugLinkTooLarge,
    /// Its section headers cannot be parsed: no symbols, no DWARF.
    CorruptHeaders,
    /// Split DWARF (`.dwo`/`.dwp`), which locktrace does not read.
    SplitDwarf,
    /// No section headers describe its loaded segments (`sstrip`, or
    /// rewritten headers): no symbols or DWARF from it; regions come from
    /// its program headers.
    NoSectionHeaders,
    /// Stripped, no local debug file, and its debug file could not be
    /// fetched from the `$DEBUGINFOD_URLS` servers (unreachable, not
    /// there, too slow, too large, another build-id): its names are missing.
    DebuginfodFailed,
    /// Its symbol table would not fit in the address space left under the
    /// process's limit (`ulimit -v`), or could not be allocated: no names
    /// from it (issue 52 D15).
    TooManySymbols,
}

impl SkipReason {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            SkipReason::ShrankWhileRead => "shrank while read (names from it may be wrong)",
            SkipReason::DwarfTooLarge => "DWARF skipped, too large",
            SkipReason::DwarfCorrupt => "DWARF skipped, corrupt",
            SkipReason::DebugLinkTooLarge => "debug link not followed, file too large",
            SkipReason::CorruptHeaders => "section headers corrupt",
            SkipReason::SplitDwarf => "split DWARF not read",
            SkipReason::NoSectionHeaders => "no usable section headers",
            SkipReason::DebuginfodFailed => "debug file not fetched from debuginfod",
            SkipReason::TooManySymbols => "symbol table too large for the memory limit",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Totals {
    pub acquisitions: Option<u64>,
    pub contended: u64,
    pub wakes: u64,
    pub wait_ns: u64,
    /// `--hold-times`: all locks' hold time; null where not recorded.
    #[serde(default)]
    pub hold_ns: Option<u64>,
    /// All locks' figures per request; null without a request count.
    #[serde(default)]
    pub per_request: Option<PerRequest>,
    /// Futex figures by wait class; `contended`, `wakes`, `wait_ns` above are
    /// those of `lock` only (absent in reports of older versions).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "by_wait_class_schema")]
    pub by_wait_class: BTreeMap<WaitClass, ClassTotals>,
}

/// `totals.by_wait_class`: an object whose keys are wait class words.
fn by_wait_class_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<BTreeMap<String, ClassTotals>>();
    let keys = generator.subschema_for::<WaitClass>();
    schema.insert("propertyNames".into(), keys.to_value());
    schema
}

impl Report {
    /// Reads a saved report; refuses more than [`MAX_REPORT_BYTES`] (`report
    /// /dev/zero` must not read until memory runs out).
    pub fn load(path: &std::path::Path) -> Result<Report> {
        use std::io::Read;
        let file = std::fs::File::open(path)
            .with_context(|| format!("cannot read report {}", path.display()))?;
        let mut bytes = Vec::new();
        file.take(MAX_REPORT_BYTES + 1)
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot read report {}", path.display()))?;
        if bytes.len() as u64 > MAX_REPORT_BYTES {
            bail!(
                "{} is larger than {} MiB: not a locktrace report; give the .json file record --json wrote",
                path.display(),
                MAX_REPORT_BYTES >> 20
            );
        }
        let text = String::from_utf8(bytes).with_context(|| {
            format!(
                "{} is not a locktrace report (not UTF-8 text)",
                path.display()
            )
        })?;
        Report::from_json(&text, &path.display().to_string())
    }

    /// Parses a report's JSON text; `source` names it in errors. Never
    /// panics, whatever the text (fuzzed in tests/fuzz.rs).
    pub fn from_json(text: &str, source: &str) -> Result<Report> {
        let value: serde_json::Value = serde_json::from_str(text)
            .with_context(|| format!("{source} is not a locktrace report (not JSON)"))?;
        match value.get("schema").and_then(|schema| schema.as_str()) {
            Some(SCHEMA) => {}
            Some(other) => {
                bail!("{source} is a report of schema {other}; this locktrace reads {SCHEMA}")
            }
            None => bail!("{source} is not a locktrace report (no \"schema\": \"{SCHEMA}\")"),
        }
        let mut report: Report = serde_json::from_value(value)
            .with_context(|| format!("{source} is a damaged locktrace report"))?;
        // Rows of one address in two lifetimes get their own keys back.
        for lock in &mut report.locks {
            if let Some(ended) = lock.lifetime {
                lock.address = tracer_common::lifetime::tag(lock.address, ended.earlier);
            }
        }
        // Numbers a recording cannot have (a crafted or edited file) are
        // refused, not printed as if measured.
        if !(report.duration_s.is_finite() && (0.0..=MAX_DURATION_S).contains(&report.duration_s)) {
            bail!(
                "{source} is a damaged locktrace report: duration_s {} is not a recording's length (0 to 10 years)",
                report.duration_s
            );
        }
        Ok(report)
    }
}

#[cfg(test)]
impl Report {
    /// A report of `mode` with nothing in it, for unit tests.
    pub(crate) fn empty_for_tests(mode: &str) -> Report {
        let text = serde_json::json!({
            "schema": SCHEMA,
            "target": {"pid": 1, "exe": "/x", "cmdline": []},
            "duration_s": 1.0, "mode": mode, "locks": [], "dropped": {},
            "totals": {"acquisitions": null, "contended": 0, "wakes": 0, "wait_ns": 0},
        });
        Report::from_json(&text.to_string(), "test").expect("an empty report loads")
    }
}

#[cfg(test)]
impl Frame {
    /// A frame of function `name`, for unit tests.
    pub(crate) fn named(name: &str) -> Frame {
        Frame {
            function: Some(name.into()),
            module: None,
            offset: 0,
            php: None,
        }
    }
}

/// Longest recording a report may say it lasted: ten years.
const MAX_DURATION_S: f64 = 10.0 * 365.25 * 86_400.0;

/// Largest report `load` reads: a report of 100,000 locks with stacks is
/// well under this.
pub(crate) const MAX_REPORT_BYTES: u64 = 256 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_durations_are_refused_with_one_line() {
        let digits_309 = format!("1{}", "0".repeat(308));
        let report = |duration: &str| {
            let text = format!(
                r#"{{"schema": "{SCHEMA}", "target": {{"pid": 1, "exe": "x", "cmdline": []}},
                "duration_s": {bad}, "mode": "all", "stopped_by": "duration", "locks": [],
                "dropped": {{}}, "totals": {{"acquisitions": 0, "contended": 0, "wakes": 0, "wait_ns": 0}}}}"#,
                bad = duration
            );
            Report::from_json(&text, "r.json")
        };
        assert_eq!(report("12.5").unwrap().duration_s, 12.5);
        for bad in ["-5.0", digits_309.as_str(), "1e300"] {
            let error = report(bad).unwrap_err();
            let line = format!("{error:#}");
            assert!(
                line.starts_with("r.json is a damaged locktrace report"),
                "{bad}: {line}"
            );
            assert!(!line.contains('\n'), "{line}");
        }
    }

    /// Stacks of reports from before `source` load without it; a CPU
    /// sample stack's source survives a save and load.
    #[test]
    fn stack_sources_are_optional_and_kept() {
        let text = format!(
            r#"{{"schema": "{SCHEMA}", "target": {{"pid": 1, "exe": "x", "cmdline": []}},
            "duration_s": 1.0, "mode": "all", "stopped_by": "duration", "locks": [],
            "stacks": [{{"lock": "0x1000", "count": 3, "frames": [], "unwound_by": "call_frame_info"}}],
            "dropped": {{}}, "totals": {{"acquisitions": 0, "contended": 0, "wakes": 0, "wait_ns": 0}}}}"#
        );
        let mut report = Report::from_json(&text, "old.json").unwrap();
        assert_eq!(report.stacks[0].source, None);
        assert!(!report.stacks[0].is_cpu());
        let saved = serde_json::to_string(&report).unwrap();
        assert!(!saved.contains("\"source\""), "{saved}");
        report.stacks[0].source = Some(StackOrigin::CpuSamples);
        report.stacks[0].unwound_by = StackSource::NoSnapshot;
        let saved = serde_json::to_string(&report).unwrap();
        assert!(saved.contains(r#""source":"cpu_samples""#), "{saved}");
        assert!(saved.contains(r#""unwound_by":"no_snapshot""#), "{saved}");
        let loaded = Report::from_json(&saved, "new.json").unwrap();
        assert!(loaded.stacks[0].is_cpu());
    }

    #[test]
    fn an_endless_input_is_refused_after_the_bound() {
        let error = Report::load(std::path::Path::new("/dev/zero")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "/dev/zero is larger than 256 MiB: not a locktrace report; give the .json file record --json wrote"
        );
    }
}
