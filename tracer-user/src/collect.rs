//! Map reading: copies the BPF maps into plain Rust data after tracing stops.
use std::collections::HashMap;

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData, StackTraceMap},
};
use tracer_common::{
    CallerKey, FutexCounts, HoldCounts, HolderHolds, HolderKey, LockCounts, StackKey,
    WaitHolderKey, WaitTime, drop_reason,
};

/// Everything the BPF side counted, keyed as in the maps.
#[derive(Debug, Default, Clone)]
pub struct Collected {
    pub locks: HashMap<u64, LockCounts>,
    pub futexes: HashMap<u64, FutexCounts>,
    pub callers: HashMap<CallerKey, u64>,
    pub stacks: HashMap<StackKey, u64>,
    /// User stack frames (instruction pointers, innermost first) per stack id.
    pub stack_frames: HashMap<i64, Vec<u64>>,
    pub drops: [u64; drop_reason::COUNT as usize],
    pub requests: u64,
    /// Futex waits per (futex word, holder when the wait began).
    pub wait_holders: HashMap<WaitHolderKey, WaitTime>,
    /// `--hold-times`: whether holds were recorded, and what.
    pub hold_times: bool,
    pub holds: HashMap<u64, HoldCounts>,
    pub holders: HashMap<HolderKey, HolderHolds>,
    pub unlock_hits: u64,
}

pub fn collect(ebpf: &Ebpf) -> Result<Collected> {
    let mut collected = Collected {
        locks: read_hash(ebpf, "LOCKS")?,
        futexes: read_hash(ebpf, "FUTEXES")?,
        callers: read_hash(ebpf, "CALLERS")?,
        stacks: read_hash(ebpf, "STACK_COUNTS")?,
        wait_holders: read_hash(ebpf, "WAIT_HOLDERS")?,
        holds: read_hash(ebpf, "HOLDS")?,
        holders: read_hash(ebpf, "HOLDERS")?,
        ..Collected::default()
    };
    let unlock_hits: Array<&MapData, u64> = Array::try_from(map(ebpf, "UNLOCK_HITS")?)?;
    collected.unlock_hits = unlock_hits.get(&0, 0).unwrap_or(0);
    let drops: Array<&MapData, u64> = Array::try_from(map(ebpf, "DROPS")?)?;
    for (index, slot) in collected.drops.iter_mut().enumerate() {
        *slot = drops.get(&(index as u32), 0).unwrap_or(0);
    }
    let requests: Array<&MapData, u64> = Array::try_from(map(ebpf, "REQUESTS")?)?;
    collected.requests = requests.get(&0, 0).unwrap_or(0);
    if !collected.stacks.is_empty() {
        let traces = StackTraceMap::try_from(map(ebpf, "STACKS")?)?;
        for key in collected.stacks.keys() {
            if let Ok(trace) = traces.get(&(key.stack_id as u32), 0) {
                let frames = trace.frames().iter().map(|frame| frame.ip).collect();
                collected.stack_frames.insert(key.stack_id, frames);
            }
        }
    }
    Ok(collected)
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
