//! Deleting the keys of locks a live view (`serve`, `top`) stopped showing,
//! so the maps never fill up in a long session. The caller pauses counting
//! around it (`collect::while_paused`).
use std::collections::HashSet;

use anyhow::Result;
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap, StackTraceMap};
use tracer_common::{
    CallerKey, CpuSamples, FutexCounts, HandoffCounts, KernelLockCounts, KernelLockKey,
    KernelLockSite, LockCounts, StackKey, WaitHolderKey, WaitTime, names,
};

use super::maps::map_mut;

/// The map keys of expired locks, by map.
pub(crate) struct ExpiredKeys {
    pub locks: Vec<u64>,
    pub futexes: Vec<u64>,
    pub condvars: Vec<u64>,
    pub go_futexes: Vec<u64>,
    pub cpu_locks: Vec<u64>,
    pub callers: Vec<CallerKey>,
    pub stacks: Vec<StackKey>,
    pub wait_holders: Vec<WaitHolderKey>,
}

impl ExpiredKeys {
    /// Deletes every key from its map.
    pub(crate) fn remove(self, ebpf: &mut aya::Ebpf) -> Result<()> {
        remove_keys::<u64, HandoffCounts>(ebpf, names::MAP_HANDOFFS, self.locks.iter().copied())?;
        remove_keys::<u64, LockCounts>(ebpf, names::MAP_LOCKS, self.locks.into_iter())?;
        remove_keys::<u64, FutexCounts>(ebpf, names::MAP_FUTEXES, self.futexes.into_iter())?;
        remove_keys::<u64, FutexCounts>(ebpf, names::MAP_CONDVARS, self.condvars.into_iter())?;
        remove_keys::<u64, FutexCounts>(ebpf, names::MAP_GO_FUTEXES, self.go_futexes.into_iter())?;
        remove_keys::<u64, CpuSamples>(ebpf, names::MAP_CPU_LOCKS, self.cpu_locks.into_iter())?;
        remove_keys::<StackKey, u64>(ebpf, names::MAP_STACK_COUNTS, self.stacks.into_iter())?;
        remove_keys::<WaitHolderKey, WaitTime>(
            ebpf,
            names::MAP_WAIT_HOLDERS,
            self.wait_holders.into_iter(),
        )?;
        let mut callers: PerCpuHashMap<&mut MapData, CallerKey, u64> =
            PerCpuHashMap::try_from(map_mut(ebpf, names::MAP_CALLERS)?)?;
        for key in &self.callers {
            // A key already gone is no error here.
            let _ = callers.remove(key);
        }
        Ok(())
    }
}

/// Deletes the `KERNEL_LOCKS` keys of kernel locks a live view stopped
/// showing, their sites (whose last stacks may be among those deleted),
/// and the kernel stacks only they used.
pub(crate) fn remove_kernel_locks(
    ebpf: &mut aya::Ebpf,
    keys: Vec<KernelLockKey>,
    stacks: &[u32],
) -> Result<()> {
    let sites: HashSet<KernelLockKey> = keys
        .iter()
        .map(|key| KernelLockKey {
            stack_id: 0,
            ..*key
        })
        .collect();
    remove_keys::<KernelLockKey, KernelLockSite>(
        ebpf,
        names::MAP_KERNEL_LOCK_SITES,
        sites.into_iter(),
    )?;
    remove_keys::<KernelLockKey, KernelLockCounts>(
        ebpf,
        names::MAP_KERNEL_LOCKS,
        keys.into_iter(),
    )?;
    let mut table: StackTraceMap<&mut MapData> =
        StackTraceMap::try_from(map_mut(ebpf, names::MAP_KERNEL_LOCK_STACKS)?)?;
    for id in stacks {
        // A stack already gone is no error here.
        let _ = table.remove(id);
    }
    Ok(())
}

/// Deletes `keys` from the BPF hash map `name`.
fn remove_keys<K: aya::Pod, V: aya::Pod>(
    ebpf: &mut aya::Ebpf,
    name: &str,
    keys: impl Iterator<Item = K>,
) -> Result<()> {
    let mut table: BpfHashMap<&mut MapData, K, V> = BpfHashMap::try_from(map_mut(ebpf, name)?)?;
    for key in keys {
        // The BPF side never deletes; a key already gone is no error here.
        let _ = table.remove(&key);
    }
    Ok(())
}
