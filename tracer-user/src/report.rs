//! The report model: a plain serde structure that the table, JSON, folded
//! stacks and compare all read. Built from what was collected, in one pass.
//!
//! Schema `locktrace.report/1`: later versions add fields, never rename them.
use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tracer_common::{LockOp, drop_reason};

use crate::{collect::Collected, lockfuncs::LockFunction};

pub const SCHEMA: &str = "locktrace.report/1";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub schema: String,
    pub target: TargetInfo,
    pub duration_s: f64,
    /// `all`, `contention` or `sampled`.
    pub mode: String,
    /// `entry` or `auto`.
    #[serde(default)]
    pub placement: Option<String>,
    /// Why recording stopped: `duration`, `interrupted` or `target_exited`.
    #[serde(default)]
    pub stopped_by: String,
    /// Sorted by acquisitions, then contended waits.
    pub locks: Vec<Lock>,
    /// Top user stacks per lock (`--stacks N`), innermost frame first.
    #[serde(default)]
    pub stacks: Vec<LockStack>,
    /// How the locks were named (see symbolize).
    #[serde(default)]
    pub naming: Option<Naming>,
    /// Events that could not be counted, by reason (zero counts omitted).
    pub dropped: BTreeMap<String, u64>,
    pub totals: Totals,
    /// Request count and source, when requests were counted (`--load`, `--request-probe`, `--requests`).
    #[serde(default)]
    pub requests: Option<crate::requests::Requests>,
    /// Lock functions where `--placement auto` fell back to the entry, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement_fallbacks: Vec<PlacementFallback>,
    /// Sampled mode: how the lock counts were estimated (they are scaled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<crate::sampling::Estimate>,
    /// What tracing cost the target and the tracer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<crate::overhead::Overhead>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PlacementFallback {
    pub function: String,
    pub module: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TargetInfo {
    pub pid: u32,
    pub exe: String,
    pub cmdline: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Lock {
    /// Address in the target, `0x…`.
    pub address: String,
    /// `mutex`, `rwlock`, or `futex` (a futex word no pthread lock function was seen on).
    pub kind: String,
    /// Lock calls; null where lock functions were not probed.
    pub acquisitions: Option<u64>,
    /// Lock calls per function (`pthread_mutex_lock`: n, …).
    #[serde(default)]
    pub calls: BTreeMap<String, u64>,
    /// Futex waits on the lock (each one a contended acquisition).
    pub contended: u64,
    pub wakes: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
    /// Figures per request; null without a request count.
    #[serde(default)]
    pub per_request: Option<crate::requests::PerRequest>,
    /// Symbol (`g_lock`, `g_struct+0x40`) or pointer chain from a global
    /// (`g_stats->+0x20->`); null when neither was found.
    #[serde(default)]
    pub name: Option<String>,
    /// Memory holding the lock: a module section (`.data`, `.bss`), `[heap]`,
    /// `[stack]`, `thread stack`, `anonymous`, …
    #[serde(default)]
    pub region: String,
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
    /// The name in offsets from the symbol (`g_stats->+0x10->`), as
    /// without debug info; what older reports called the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset_name: Option<String>,
    /// The raw route to the lock, for tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<LockChain>,
    /// Other routes to the same heap lock, the runner-up first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<AlternativeName>,
}

/// A route from a global to a lock: the pointer stored at `offsets[0]` in
/// `root` points to an object whose pointer at `offsets[1]` points to the
/// next, …; the lock is at the last offset of the last object. One offset:
/// the lock is inside the global itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LockChain {
    /// Module (as the target sees it) whose data holds `root`.
    pub module: String,
    /// The root variable, as in the symbol table (or DWARF).
    pub root: String,
    pub offsets: Vec<u64>,
}

/// Another name of the same lock (a longer route to it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AlternativeName {
    pub name: String,
    pub offset_name: String,
    pub chain: LockChain,
}

/// Naming during the recording: pointer chains searched for heap locks
/// while the target is alive, so a target that exits first keeps them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
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
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Frame {
    pub function: Option<String>,
    pub module: Option<String>,
    pub offset: u64,
}

/// One caller of a lock: the call site's function and the return address's offset in it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Caller {
    pub function: Option<String>,
    pub module: Option<String>,
    pub offset: u64,
    pub count: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LockStack {
    /// Address of the lock, as in `locks[].address`.
    pub lock: String,
    pub count: u64,
    /// Innermost first.
    pub frames: Vec<Frame>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Naming {
    pub elapsed_ms: f64,
    /// ELF modules whose symbols were read.
    pub modules: usize,
    /// `module <- debug file` for modules with separate debug symbols.
    pub debug_files: Vec<String>,
    /// What the heap pointer-chain search found, or why it did not run.
    pub pointer_chains: String,
    /// Modules with only exported symbols (stripped, no debug file found)
    /// that left locks or callers of this report unnamed.
    #[serde(default)]
    pub stripped: Vec<String>,
    /// `module <- file (N variables, T ms)`: DWARF read to name fields.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub debug_info: Vec<String>,
    /// Pointer chains searched during the recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveNaming>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Totals {
    pub acquisitions: Option<u64>,
    pub contended: u64,
    pub wakes: u64,
    pub wait_ns: u64,
    /// All locks' figures per request; null without a request count.
    #[serde(default)]
    pub per_request: Option<crate::requests::PerRequest>,
}

/// Bytes a lock of each kind spans: futex words inside it belong to it.
/// glibc x86-64: pthread_mutex_t is 40 bytes, pthread_rwlock_t 56.
fn lock_span(kind: &str) -> u64 {
    match kind {
        "rwlock" => 56,
        _ => 40,
    }
}

/// How the report was recorded, for its header.
pub struct RecordInfo {
    pub target: TargetInfo,
    pub duration_s: f64,
    pub mode: String,
    pub placement: Option<String>,
    pub stopped_by: String,
    /// False in contention mode: acquisitions are then unknown (null).
    pub counted_acquisitions: bool,
}

pub fn build(info: RecordInfo, collected: &Collected, functions: &[LockFunction]) -> Report {
    let nested = nested_calls(collected, functions);
    let mut locks: BTreeMap<u64, Lock> = BTreeMap::new();
    for (&address, counts) in &collected.locks {
        let mut calls = BTreeMap::new();
        for op in LockOp::ALL {
            let n = counts.calls[op as usize]
                .saturating_sub(*nested.get(&(address, op as u32)).unwrap_or(&0));
            if n > 0 {
                calls.insert(op.symbol().to_string(), n);
            }
        }
        if calls.is_empty() {
            continue;
        }
        let is_rwlock = counts.calls[LockOp::RwlockRdlock as usize]
            + counts.calls[LockOp::RwlockWrlock as usize]
            > 0;
        locks.insert(
            address,
            Lock {
                address: format!("{address:#x}"),
                kind: if is_rwlock { "rwlock" } else { "mutex" }.into(),
                acquisitions: Some(calls.values().sum()),
                calls,
                contended: 0,
                wakes: 0,
                wait_ns: 0,
                max_wait_ns: 0,
                name: None,
                region: String::new(),
                module: None,
                callers: Vec::new(),
                per_request: None,
                acquisitions_error: None,
                offset_name: None,
                chain: None,
                alternatives: Vec::new(),
            },
        );
    }
    for (&futex, counts) in &collected.futexes {
        // The lock whose bytes contain this futex word, if any.
        let owner = locks
            .range(..=futex)
            .next_back()
            .filter(|(start, lock)| futex < **start + lock_span(&lock.kind))
            .map(|(start, _)| *start);
        let lock = locks.entry(owner.unwrap_or(futex)).or_insert_with(|| Lock {
            address: format!("{futex:#x}"),
            kind: "futex".into(),
            acquisitions: None,
            calls: BTreeMap::new(),
            contended: 0,
            wakes: 0,
            wait_ns: 0,
            max_wait_ns: 0,
            name: None,
            region: String::new(),
            module: None,
            callers: Vec::new(),
            per_request: None,
            acquisitions_error: None,
            offset_name: None,
            chain: None,
            alternatives: Vec::new(),
        });
        lock.contended += counts.waits;
        lock.wakes += counts.wakes;
        lock.wait_ns += counts.wait_ns;
        lock.max_wait_ns = lock.max_wait_ns.max(counts.max_wait_ns);
    }
    let mut locks: Vec<Lock> = locks.into_values().collect();
    locks.sort_by(|a, b| {
        (b.acquisitions.unwrap_or(0), b.contended, b.wait_ns).cmp(&(
            a.acquisitions.unwrap_or(0),
            a.contended,
            a.wait_ns,
        ))
    });
    let totals = Totals {
        acquisitions: info
            .counted_acquisitions
            .then(|| locks.iter().filter_map(|lock| lock.acquisitions).sum()),
        contended: locks.iter().map(|lock| lock.contended).sum(),
        wakes: locks.iter().map(|lock| lock.wakes).sum(),
        wait_ns: locks.iter().map(|lock| lock.wait_ns).sum(),
        per_request: None,
    };
    let dropped = drop_reason::NAMES
        .iter()
        .zip(collected.drops)
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| (name.to_string(), n))
        .collect();
    Report {
        schema: SCHEMA.into(),
        target: info.target,
        duration_s: info.duration_s,
        mode: info.mode,
        placement: info.placement,
        stopped_by: info.stopped_by,
        locks,
        stacks: Vec::new(),
        naming: None,
        dropped,
        totals,
        requests: None,
        placement_fallbacks: Vec::new(),
        estimate: None,
        overhead: None,
    }
}

/// Lock calls made from inside another lock function (musl's
/// pthread_mutex_lock calls pthread_mutex_timedlock, which calls
/// pthread_mutex_trylock): one acquisition, so only the outer call counts.
fn nested_calls(collected: &Collected, functions: &[LockFunction]) -> BTreeMap<(u64, u32), u64> {
    let mut nested = BTreeMap::new();
    for (key, &count) in &collected.callers {
        if is_nested_call(key, collected, functions) {
            *nested.entry((key.lock, key.op)).or_insert(0) += count;
        }
    }
    nested
}

/// True for a lock call made by another lock function: called from inside
/// one, or tail-called by one. One call site calls one function, so a second
/// op seen with the same return address was tail-called by the first (musl's
/// pthread_mutex_lock jumps to pthread_mutex_timedlock when contended).
pub fn is_nested_call(
    key: &tracer_common::CallerKey,
    collected: &Collected,
    functions: &[LockFunction],
) -> bool {
    let from_lock_function = functions
        .iter()
        .any(|f| (f.runtime_start..f.runtime_end).contains(&key.return_ip));
    let tail_called = tail_callers(key.op).iter().any(|&outer| {
        collected.callers.contains_key(&tracer_common::CallerKey {
            op: outer as u32,
            ..*key
        })
    });
    from_lock_function || tail_called
}

/// Lock functions that may tail-call the function of `op` (musl).
fn tail_callers(op: u32) -> &'static [LockOp] {
    match LockOp::from_index(op) {
        Some(LockOp::MutexTimedlock) => &[LockOp::MutexLock],
        Some(LockOp::MutexTrylock) => &[LockOp::MutexLock, LockOp::MutexTimedlock],
        _ => &[],
    }
}

impl Report {
    pub fn load(path: &std::path::Path) -> Result<Report> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read report {}", path.display()))?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a locktrace report (not JSON)", path.display()))?;
        match value.get("schema").and_then(|schema| schema.as_str()) {
            Some(SCHEMA) => {}
            Some(other) => bail!(
                "{} is a report of schema {other}; this locktrace reads {SCHEMA}",
                path.display()
            ),
            None => bail!(
                "{} is not a locktrace report (no \"schema\": \"{SCHEMA}\")",
                path.display()
            ),
        }
        serde_json::from_value(value)
            .with_context(|| format!("{} is a damaged locktrace report", path.display()))
    }

    pub fn save(&self, path: &std::path::Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))
    }
}
