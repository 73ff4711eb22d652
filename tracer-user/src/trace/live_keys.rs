//! Reading which locks and futex words the maps hold while the recording
//! runs (the live pointer-chain search in `naming::ongoing` wants them as
//! they appear). Second handles on the loaded maps, by kernel id: readable
//! while the recording (or the sampler) owns the BPF object.
use std::collections::HashMap;

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, Map, MapData, PerCpuHashMap},
};
use tracer_common::{CallerKey, FutexCounts, LockCounts, names};

/// Read-only handles on the maps keyed by lock or futex word.
pub(crate) struct LiveKeys {
    locks: Option<BpfHashMap<MapData, u64, LockCounts>>,
    /// Most lock calls are counted per caller (LOCKS holds the rest).
    callers: Option<PerCpuHashMap<MapData, CallerKey, u64>>,
    futexes: Option<BpfHashMap<MapData, u64, FutexCounts>>,
}

impl LiveKeys {
    /// Handles on the maps of a loaded object; None when none can be opened.
    pub(crate) fn open(ebpf: &Ebpf) -> Option<LiveKeys> {
        let keys = LiveKeys {
            locks: reopen(ebpf, names::MAP_LOCKS),
            callers: reopen_per_cpu(ebpf, names::MAP_CALLERS),
            futexes: reopen(ebpf, names::MAP_FUTEXES),
        };
        let any = keys.locks.is_some() || keys.callers.is_some() || keys.futexes.is_some();
        any.then_some(keys)
    }

    /// (acquisitions or waits, address) of every lock and futex word in the
    /// maps, one entry per address (a lock has a LOCKS entry and callers).
    pub(crate) fn read(&self) -> Vec<(u64, u64)> {
        let mut seen: Vec<(u64, u64)> = Vec::new();
        if let Some(locks) = &self.locks {
            seen.extend(
                locks
                    .iter()
                    .flatten()
                    .map(|(address, counts)| (counts.calls.iter().sum::<u64>(), address)),
            );
        }
        if let Some(callers) = &self.callers {
            seen.extend(
                callers
                    .iter()
                    .flatten()
                    .map(|(key, counts)| (counts.iter().sum::<u64>(), key.lock)),
            );
        }
        if let Some(futexes) = &self.futexes {
            seen.extend(
                futexes
                    .iter()
                    .flatten()
                    .map(|(address, counts)| (counts.waits, address)),
            );
        }
        let mut by_address: HashMap<u64, u64> = HashMap::new();
        for (weight, address) in seen {
            *by_address.entry(address).or_default() += weight;
        }
        by_address
            .into_iter()
            .map(|(address, weight)| (weight, address))
            .collect()
    }
}

/// A second handle on a loaded map, by its kernel id.
fn reopen<K: aya::Pod, V: aya::Pod>(ebpf: &Ebpf, name: &str) -> Option<BpfHashMap<MapData, K, V>> {
    let Some(Map::HashMap(data)) = ebpf.map(name) else {
        return None;
    };
    let id = data.info().ok()?.id();
    BpfHashMap::try_from(Map::HashMap(MapData::from_id(id).ok()?)).ok()
}

fn reopen_per_cpu<K: aya::Pod, V: aya::Pod>(
    ebpf: &Ebpf,
    name: &str,
) -> Option<PerCpuHashMap<MapData, K, V>> {
    let Some(Map::PerCpuHashMap(data)) = ebpf.map(name) else {
        return None;
    };
    let id = data.info().ok()?.id();
    PerCpuHashMap::try_from(Map::PerCpuHashMap(MapData::from_id(id).ok()?)).ok()
}
