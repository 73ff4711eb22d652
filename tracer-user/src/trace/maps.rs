//! Typed reads of the BPF object's maps by name, for every module that
//! collects from them (one place, below collect and the readers it calls).
//! [`MapReads`] is the seam: the loaded object reads the kernel's maps, and
//! unit tests give [`FakeMaps`] instead (as aya tests its map types with
//! `override_syscall`), so what is built from the maps needs no root.
use std::{collections::HashMap, hash::Hash, mem::size_of};

use anyhow::{Context, Result};
use aya::{
    Ebpf, Pod,
    maps::{Array, HashMap as BpfHashMap, IterableMap, MapData, PerCpuArray, PerCpuHashMap},
};

/// What a collection reads from the maps.
pub(crate) trait MapReads {
    /// A hash map, whole.
    fn hash<K: Pod + Eq + Hash, V: Pod>(&self, name: &str) -> Result<HashMap<K, V>>;
    /// A per-CPU hash map of counters, each key's values summed over the CPUs.
    fn per_cpu_hash<K: Pod + Eq + Hash>(&self, name: &str) -> Result<HashMap<K, u64>>;
    /// Index `index` of a per-CPU array of counters, summed over the CPUs.
    fn per_cpu_sum(&self, name: &str, index: u32) -> Result<u64>;
    /// Index `index` of an array of counters (0 where unreadable).
    fn array_word(&self, name: &str, index: u32) -> Result<u64>;
}

impl MapReads for Ebpf {
    fn hash<K: Pod + Eq + Hash, V: Pod>(&self, name: &str) -> Result<HashMap<K, V>> {
        read_hash(self, name)
    }

    fn per_cpu_hash<K: Pod + Eq + Hash>(&self, name: &str) -> Result<HashMap<K, u64>> {
        read_per_cpu_hash(self, name)
    }

    fn per_cpu_sum(&self, name: &str, index: u32) -> Result<u64> {
        per_cpu_sum(self, name, index)
    }

    fn array_word(&self, name: &str, index: u32) -> Result<u64> {
        let array: Array<&MapData, u64> = Array::try_from(map(self, name)?)?;
        Ok(array.get(&index, 0).unwrap_or(0))
    }
}

/// Maps held in memory, for unit tests: each map is what the kernel's would
/// read as, by name; a map not given reads as missing, as from a broken build.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct FakeMaps {
    maps: HashMap<String, Box<dyn std::any::Any>>,
    /// Per-CPU arrays: (name, index) → each CPU's value.
    per_cpu: HashMap<(String, u32), Vec<u64>>,
}

#[cfg(test)]
impl FakeMaps {
    /// A hash map (or a per-CPU hash map, given as each CPU's values).
    pub(crate) fn with<K: 'static, V: 'static>(
        mut self,
        name: &str,
        map: HashMap<K, V>,
    ) -> FakeMaps {
        self.maps.insert(name.to_string(), Box::new(map));
        self
    }

    /// Every map `collect` reads, empty, as a freshly loaded object's.
    /// Every map `collect` reads, empty, as a freshly loaded object's.
    pub(crate) fn loaded() -> FakeMaps {
        use tracer_common::{
            CallerKey, CpuSamples, FutexCounts, HandoffCounts, HoldCounts, HolderHolds, HolderKey,
            LockCounts, StackKey, WaitHolderKey, WaitTime, names,
        };
        FakeMaps::default()
            .with(names::MAP_CALLERS, HashMap::<CallerKey, Vec<u64>>::new())
            .with(names::MAP_LOCKS, HashMap::<u64, LockCounts>::new())
            .with(names::MAP_FAILED_TRIES, HashMap::<CallerKey, u64>::new())
            .with(names::MAP_FUTEXES, HashMap::<u64, FutexCounts>::new())
            .with(names::MAP_CONDVARS, HashMap::<u64, FutexCounts>::new())
            .with(names::MAP_GO_FUTEXES, HashMap::<u64, FutexCounts>::new())
            .with(names::MAP_STACK_COUNTS, HashMap::<StackKey, u64>::new())
            .with(
                names::MAP_WAIT_HOLDERS,
                HashMap::<WaitHolderKey, WaitTime>::new(),
            )
            .with(names::MAP_HOLDS, HashMap::<u64, HoldCounts>::new())
            .with(names::MAP_HOLDERS, HashMap::<HolderKey, HolderHolds>::new())
            .with(names::MAP_CPU_LOCKS, HashMap::<u64, CpuSamples>::new())
            .with(names::MAP_HANDOFFS, HashMap::<u64, HandoffCounts>::new())
    }

    /// Index `index` of a per-CPU array, each CPU's value.
    pub(crate) fn with_per_cpu(mut self, name: &str, index: u32, values: Vec<u64>) -> FakeMaps {
        self.per_cpu.insert((name.to_string(), index), values);
        self
    }

    fn get<T: 'static>(&self, name: &str) -> Result<&T> {
        self.maps
            .get(name)
            .with_context(|| format!("BPF object lacks map {name}"))?
            .downcast_ref::<T>()
            .with_context(|| format!("map {name} holds other types"))
    }
}

#[cfg(test)]
impl MapReads for FakeMaps {
    fn hash<K: Pod + Eq + Hash, V: Pod>(&self, name: &str) -> Result<HashMap<K, V>> {
        self.get::<HashMap<K, V>>(name).cloned()
    }

    fn per_cpu_hash<K: Pod + Eq + Hash>(&self, name: &str) -> Result<HashMap<K, u64>> {
        let per_cpu = self.get::<HashMap<K, Vec<u64>>>(name)?;
        Ok(per_cpu
            .iter()
            .map(|(key, values)| (*key, values.iter().sum()))
            .collect())
    }

    fn per_cpu_sum(&self, name: &str, index: u32) -> Result<u64> {
        Ok(self
            .per_cpu
            .get(&(name.to_string(), index))
            .map_or(0, |values| values.iter().sum()))
    }

    fn array_word(&self, name: &str, index: u32) -> Result<u64> {
        Ok(self
            .get::<HashMap<u32, u64>>(name)
            .ok()
            .and_then(|array| array.get(&index).copied())
            .unwrap_or(0))
    }
}

/// The BPF object's map `name` (its absence means a broken build).
pub(crate) fn map<'a>(ebpf: &'a Ebpf, name: &str) -> Result<&'a aya::maps::Map> {
    ebpf.map(name)
        .with_context(|| format!("BPF object lacks map {name}"))
}

/// [`map`], writable.
pub(crate) fn map_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::maps::Map> {
    ebpf.map_mut(name)
        .with_context(|| format!("BPF object lacks map {name}"))
}

pub(crate) fn read_hash<K, V>(ebpf: &Ebpf, name: &str) -> Result<HashMap<K, V>>
where
    K: aya::Pod + Eq + std::hash::Hash,
    V: aya::Pod,
{
    let table: BpfHashMap<&MapData, K, V> = BpfHashMap::try_from(map(ebpf, name)?)?;
    let mut out = HashMap::new();
    let batched = super::batch::lookup_all(table.map(), size_of::<V>(), |key, value| {
        // SAFETY: V is Pod and the kernel wrote size_of::<V>() bytes (aya
        // checked the map's value size against V).
        out.insert(key, unsafe {
            std::ptr::read_unaligned(value.as_ptr().cast::<V>())
        });
    });
    if batched.is_ok() {
        return Ok(out);
    }
    out.clear();
    for entry in table.iter() {
        let (key, value) = entry.with_context(|| format!("reading map {name}"))?;
        out.insert(key, value);
    }
    Ok(out)
}

/// A per-CPU hash map of counters, each key's values summed over the CPUs.
pub(crate) fn read_per_cpu_hash<K>(ebpf: &Ebpf, name: &str) -> Result<HashMap<K, u64>>
where
    K: aya::Pod + Eq + std::hash::Hash,
{
    let table: PerCpuHashMap<&MapData, K, u64> = PerCpuHashMap::try_from(map(ebpf, name)?)?;
    let mut out = HashMap::new();
    // Each possible CPU's counter, 8 bytes each, as the kernel lays them out.
    if let Ok(cpus) = aya::util::nr_cpus() {
        let batched = super::batch::lookup_all(table.map(), 8 * cpus, |key, values| {
            let sum = values
                .chunks_exact(8)
                .filter_map(|bytes| bytes.try_into().ok())
                .map(u64::from_ne_bytes)
                .fold(0u64, u64::wrapping_add);
            out.insert(key, sum);
        });
        if batched.is_ok() {
            return Ok(out);
        }
        out.clear();
    }
    for entry in table.iter() {
        let (key, values) = entry.with_context(|| format!("reading map {name}"))?;
        out.insert(key, values.iter().sum());
    }
    Ok(out)
}

/// Index `index` of a per-CPU array of counters, summed over the CPUs.
pub(crate) fn per_cpu_sum(ebpf: &Ebpf, name: &str, index: u32) -> Result<u64> {
    let array: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map(ebpf, name)?)?;
    let values = array
        .get(&index, 0)
        .with_context(|| format!("reading map {name}"))?;
    Ok(values.iter().sum())
}
