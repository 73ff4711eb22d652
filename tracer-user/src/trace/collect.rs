//! Map reading: copies the BPF maps into plain Rust data after tracing stops.
use std::collections::HashMap;

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData, StackTraceMap},
};
use tracer_common::{
    CallerKey, FutexCounts, HoldCounts, HolderHolds, HolderKey, LockCounts, StackKey,
    WaitHolderKey, WaitTime, drop_reason, names,
};

/// Everything the BPF side counted, keyed as in the maps.
#[derive(Debug, Default, Clone)]
pub struct Collected {
    pub locks: HashMap<u64, LockCounts>,
    pub futexes: HashMap<u64, FutexCounts>,
    /// Waits inside the condvar wait functions, keyed by the condvar.
    pub condvars: HashMap<u64, FutexCounts>,
    /// Futex calls of the Go runtime, keyed by the futex word.
    pub go_futexes: HashMap<u64, FutexCounts>,
    pub callers: HashMap<CallerKey, u64>,
    pub stacks: HashMap<StackKey, u64>,
    /// User stack frames (instruction pointers, innermost first) per stack id.
    pub stack_frames: HashMap<i64, Vec<u64>>,
    pub drops: [u64; drop_reason::COUNT as usize],
    pub requests: u64,
    /// Calls of the condvar wait functions (each one an entry and a return probe hit).
    pub cond_wait_calls: u64,
    /// Futex waits per (futex word, holder when the wait began).
    pub wait_holders: HashMap<WaitHolderKey, WaitTime>,
    /// `--hold-times`: whether holds were recorded, and what.
    pub hold_times: bool,
    pub holds: HashMap<u64, HoldCounts>,
    pub holders: HashMap<HolderKey, HolderHolds>,
    pub unlock_hits: u64,
    /// Waits and holds in progress when read (filled by the caller that
    /// knows when the probes went in; see [`super::inflight`]).
    pub in_flight: super::inflight::InFlight,
}

pub fn collect(ebpf: &Ebpf) -> Result<Collected> {
    let mut collected = Collected {
        locks: read_hash(ebpf, names::MAP_LOCKS)?,
        futexes: read_hash(ebpf, names::MAP_FUTEXES)?,
        condvars: read_hash(ebpf, names::MAP_CONDVARS)?,
        go_futexes: read_hash(ebpf, names::MAP_GO_FUTEXES)?,
        callers: read_hash(ebpf, names::MAP_CALLERS)?,
        stacks: read_hash(ebpf, names::MAP_STACK_COUNTS)?,
        wait_holders: read_hash(ebpf, names::MAP_WAIT_HOLDERS)?,
        holds: read_hash(ebpf, names::MAP_HOLDS)?,
        holders: read_hash(ebpf, names::MAP_HOLDERS)?,
        ..Collected::default()
    };
    let unlock_hits: Array<&MapData, u64> = Array::try_from(map(ebpf, names::MAP_UNLOCK_HITS)?)?;
    collected.unlock_hits = unlock_hits.get(&0, 0).unwrap_or(0);
    let drops: Array<&MapData, u64> = Array::try_from(map(ebpf, names::MAP_DROPS)?)?;
    for (index, slot) in collected.drops.iter_mut().enumerate() {
        *slot = drops.get(&(index as u32), 0).unwrap_or(0);
    }
    let requests: Array<&MapData, u64> = Array::try_from(map(ebpf, names::MAP_REQUESTS)?)?;
    collected.requests = requests.get(&0, 0).unwrap_or(0);
    let cond_calls: Array<&MapData, u64> = Array::try_from(map(ebpf, names::MAP_COND_CALLS)?)?;
    collected.cond_wait_calls = cond_calls.get(&0, 0).unwrap_or(0);
    if !collected.stacks.is_empty() {
        let traces = StackTraceMap::try_from(map(ebpf, names::MAP_STACKS)?)?;
        for key in collected.stacks.keys() {
            if let Ok(trace) = traces.get(&(key.stack_id as u32), 0) {
                let frames = trace.frames().iter().map(|frame| frame.ip).collect();
                collected.stack_frames.insert(key.stack_id, frames);
            }
        }
    }
    Ok(collected)
}

/// Calls of the request-boundary function so far (None without the map).
pub fn request_probe_hits(ebpf: &Ebpf) -> Option<u64> {
    let array: Array<&MapData, u64> = Array::try_from(ebpf.map(names::MAP_REQUESTS)?).ok()?;
    array.get(&0, 0).ok()
}

/// Lock calls counted so far, over all locks.
pub fn total_lock_calls(ebpf: &Ebpf) -> Result<u64> {
    let locks: BpfHashMap<&MapData, u64, LockCounts> =
        BpfHashMap::try_from(map(ebpf, names::MAP_LOCKS)?)?;
    let mut total = 0u64;
    for entry in locks.iter() {
        let (_, counts) = entry.context("reading map LOCKS")?;
        total += counts.calls.iter().sum::<u64>();
    }
    Ok(total)
}

fn map<'a>(ebpf: &'a Ebpf, name: &str) -> Result<&'a aya::maps::Map> {
    ebpf.map(name)
        .with_context(|| format!("BPF object lacks map {name}"))
}

fn read_hash<K, V>(ebpf: &Ebpf, name: &str) -> Result<HashMap<K, V>>
where
    K: aya::Pod + Eq + std::hash::Hash,
    V: aya::Pod,
{
    let table: BpfHashMap<&MapData, K, V> = BpfHashMap::try_from(map(ebpf, name)?)?;
    let mut out = HashMap::new();
    for entry in table.iter() {
        let (key, value) = entry.with_context(|| format!("reading map {name}"))?;
        out.insert(key, value);
    }
    Ok(out)
}
