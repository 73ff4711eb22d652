//! Typed reads of the BPF object's maps by name, for every module that
//! collects from them (one place, below collect and the readers it calls).
use std::collections::HashMap;

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap},
};

/// The BPF object's map `name` (its absence means a broken build).
pub fn map<'a>(ebpf: &'a Ebpf, name: &str) -> Result<&'a aya::maps::Map> {
    ebpf.map(name)
        .with_context(|| format!("BPF object lacks map {name}"))
}

/// [`map`], writable.
pub fn map_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::maps::Map> {
    ebpf.map_mut(name)
        .with_context(|| format!("BPF object lacks map {name}"))
}

pub fn read_hash<K, V>(ebpf: &Ebpf, name: &str) -> Result<HashMap<K, V>>
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

/// A per-CPU hash map of counters, each key's values summed over the CPUs.
pub fn read_per_cpu_hash<K>(ebpf: &Ebpf, name: &str) -> Result<HashMap<K, u64>>
where
    K: aya::Pod + Eq + std::hash::Hash,
{
    let table: PerCpuHashMap<&MapData, K, u64> = PerCpuHashMap::try_from(map(ebpf, name)?)?;
    let mut out = HashMap::new();
    for entry in table.iter() {
        let (key, values) = entry.with_context(|| format!("reading map {name}"))?;
        out.insert(key, values.iter().sum());
    }
    Ok(out)
}

/// Index `index` of a per-CPU array of counters, summed over the CPUs.
pub fn per_cpu_sum(ebpf: &Ebpf, name: &str, index: u32) -> Result<u64> {
    let array: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map(ebpf, name)?)?;
    let values = array
        .get(&index, 0)
        .with_context(|| format!("reading map {name}"))?;
    Ok(values.iter().sum())
}
