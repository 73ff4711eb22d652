//! What the BPF side counted, copied out of its maps (`trace::collect`,
//! `trace::inflight`): plain data that `analysis` and `naming` read, so they
//! need not depend on the root-only `trace` layer.
use std::collections::{BTreeSet, HashMap};

use tracer_common::{
    CallerKey, CpuSamples, FutexCounts, FutexWait, HandoffCounts, Held, HeldKey, HoldCounts,
    HolderHolds, HolderKey, KernelLockCounts, KernelLockKey, LockCounts, StackKey, WaitHolderKey,
    WaitTime, cpu_sample, drop_reason,
    php::{self, RouteLockCounts, RouteLockKey},
};

/// One stack snapshot, unwound: it stands for its key's calls from
/// `count_at` up to the next snapshot's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnwoundStack {
    pub count_at: u64,
    /// Instruction pointer, then return addresses, innermost first.
    pub frames: Vec<u64>,
    /// `--php`: the thread's PHP frames at the snapshot, innermost first.
    pub php: Vec<PhpFrameRead>,
    /// `--php`: the thread's route key at the snapshot (`NO_REQUEST`
    /// before its first request, and without `--php`).
    pub route: u64,
    /// Why the unwinder stopped short, when a frame's rule could not be
    /// evaluated.
    pub ended_by: Option<super::StackEnd>,
}

/// `--php`: what a snapshot read of the thread's PHP state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PhpSnapshot {
    /// Innermost first.
    pub frames: Vec<PhpFrameRead>,
    /// The thread's route key (`NO_REQUEST` before its first request).
    pub route: u64,
}

/// One PHP frame as the BPF side read it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PhpFrameRead {
    /// `Class::method`, a function's name, or empty for a file's top level.
    pub function: String,
    /// The end of the file's path (empty for a function written in C).
    pub file: String,
    /// The line running in the frame (0 for a function written in C).
    pub line: u32,
}

/// `--php`: what the route maps and PHP's thread table held.
#[derive(Debug, Default, Clone)]
pub(crate) struct PhpCollected {
    /// Route key → (method, path).
    pub routes: HashMap<u64, (String, String)>,
    /// Requests per route key.
    pub requests: HashMap<u64, u64>,
    /// Per (route key, lock): acquisitions, contended waits and CPU samples
    /// in the lock's code.
    pub locks: HashMap<RouteLockKey, RouteLockCounts>,
    /// The CPU sampler's samples of the target per route key.
    pub cpu: HashMap<u64, u64>,
    /// Events whose PHP context could not be read, by `php::miss` index.
    pub misses: [u64; php::miss::COUNT as usize],
    /// Threads in PHP's thread table at the last read.
    pub threads: u64,
    /// Whether the BPF side found threads' blocks through their TLS.
    pub tls: bool,
}

/// Everything the BPF side counted, keyed as in the maps.
#[derive(Debug, Default, Clone)]
pub(crate) struct Collected {
    pub locks: HashMap<u64, LockCounts>,
    pub futexes: HashMap<u64, FutexCounts>,
    /// Waits inside the condvar wait functions, keyed by the condvar.
    pub condvars: HashMap<u64, FutexCounts>,
    /// Futex calls of the Go runtime, keyed by the futex word.
    pub go_futexes: HashMap<u64, FutexCounts>,
    pub callers: HashMap<CallerKey, u64>,
    /// Calls of lock functions that failed (busy, timed out), keyed like
    /// `callers`; not in `callers` or `locks`, which count acquisitions.
    pub failed_tries: HashMap<CallerKey, u64>,
    pub stacks: HashMap<StackKey, u64>,
    /// Whole stacks unwound from snapshots (`--stacks`), per stack key.
    pub unwound: HashMap<StackKey, Vec<UnwoundStack>>,
    pub drops: [u64; drop_reason::COUNT as usize],
    /// Request-boundary calls while lock calls counted (sampled mode: in the windows).
    pub requests: u64,
    /// Request-boundary calls over the whole recording.
    pub requests_whole_recording: u64,
    /// Calls of the condvar wait functions (each one an entry and a return probe hit).
    pub cond_wait_calls: u64,
    /// Futex waits per (futex word, holder when the wait began).
    pub wait_holders: HashMap<WaitHolderKey, WaitTime>,
    /// `--hold-times`: whether holds were recorded, and what.
    pub hold_times: bool,
    pub holds: HashMap<u64, HoldCounts>,
    pub holders: HashMap<HolderKey, HolderHolds>,
    pub unlock_hits: u64,
    /// Whether handoffs were counted, and per lock what (`HANDOFFS`).
    pub handoffs_counted: bool,
    pub handoffs: HashMap<u64, HandoffCounts>,
    /// Waits and holds in progress when read (filled by the caller that
    /// knows when the probes went in; see [`super::inflight`]).
    pub in_flight: InFlight,
    /// CPU samples per second the sampler ran at (0: not sampled).
    pub cpu_hz: u64,
    /// Lock-code samples per attributed address (lock or futex word).
    pub cpu_locks: HashMap<u64, CpuSamples>,
    /// The target's samples by class (`tracer_common::cpu_sample`).
    pub cpu_counts: [u64; cpu_sample::COUNT as usize],
    /// The unmaps that split the keys above (after `merge_lifetimes`).
    pub lifetimes: super::Lifetimes,
    /// `--php`: routes and what could not be read.
    pub php: Option<PhpCollected>,
    /// Kernel lock contention, when it was traced for.
    pub kernel_locks: Option<KernelLocksCollected>,
}

/// Kernel lock contention as the maps held it (`trace::kernel_locks`).
#[derive(Debug, Default, Clone)]
pub(crate) struct KernelLocksCollected {
    /// Why it was not traced (one line), when not.
    pub unavailable: Option<String>,
    pub counts: HashMap<KernelLockKey, KernelLockCounts>,
    /// Kernel stack id → its frames' addresses, innermost first.
    pub stacks: HashMap<i64, Vec<u64>>,
    /// The programs' events by `tracer_common::kernel_lock::event` index.
    pub events: [u64; tracer_common::kernel_lock::event::COUNT as usize],
}

/// A thread blocked in a futex wait, as `/proc` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Blocked {
    pub tid: u32,
    /// The futex word (the call's first argument).
    pub uaddr: u64,
}

/// The in-flight state of one read (all times on `bpf_ktime_get_ns`'s
/// clock, CLOCK_MONOTONIC).
#[derive(Debug, Default, Clone)]
pub(crate) struct InFlight {
    pub now_ns: u64,
    /// When the probes went in.
    pub attached_ns: u64,
    /// Futex waits begun under the probes and not over, by thread.
    pub waits: HashMap<u32, FutexWait>,
    /// `--hold-times`: holds taken and not released.
    pub held: HashMap<HeldKey, Held>,
    /// Threads blocked in a futex wait right after the probes went in.
    pub blocked_at_attach: Vec<Blocked>,
    /// Threads blocked in a futex wait now.
    pub blocked_now: Vec<Blocked>,
    /// Per futex word waited on now: the glibc owner tid at `word + 8`,
    /// kept only where it is another thread of the target.
    pub owners: HashMap<u64, u32>,
    /// The target's threads now.
    pub threads: BTreeSet<u32>,
}
