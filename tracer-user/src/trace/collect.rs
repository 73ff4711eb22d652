//! Map reading: copies the BPF maps into plain Rust data after tracing stops,
//! and the switch that stops (or pauses) counting first, so that every map
//! read describes the same interval.
use std::collections::HashMap;

use super::maps::{MapReads, map, per_cpu_sum, read_per_cpu_hash};
use crate::model::Collected;
use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData},
};
use tracer_common::{CallerKey, LockCounts, counting, names, requests};

/// Reads every counter map (see `session::Reader` for the whole snapshot).
/// Stop counting first ([`set_counting`] with 0) when the figures must
/// describe one interval.
pub(crate) fn collect(maps: &impl MapReads) -> Result<Collected> {
    let callers = maps.per_cpu_hash(names::MAP_CALLERS)?;
    let mut locks: HashMap<u64, LockCounts> = maps.hash(names::MAP_LOCKS)?;
    // Failed calls (busy, timed out) are counted apart, never in the two above.
    let failed_tries = maps.hash(names::MAP_FAILED_TRIES)?;
    // The BPF side counts a call under its caller, or in LOCKS when the
    // caller is unknown: a lock's calls are the sum of both.
    fold_callers(&mut locks, &callers);
    let mut collected = Collected {
        locks,
        futexes: maps.hash(names::MAP_FUTEXES)?,
        condvars: maps.hash(names::MAP_CONDVARS)?,
        go_futexes: maps.hash(names::MAP_GO_FUTEXES)?,
        callers,
        failed_tries,
        stacks: maps.hash(names::MAP_STACK_COUNTS)?,
        wait_holders: maps.hash(names::MAP_WAIT_HOLDERS)?,
        holds: maps.hash(names::MAP_HOLDS)?,
        holders: maps.hash(names::MAP_HOLDERS)?,
        cpu_locks: maps.hash(names::MAP_CPU_LOCKS)?,
        handoffs: maps.hash(names::MAP_HANDOFFS)?,
        ..Collected::default()
    };
    collected.unlock_hits = maps.per_cpu_sum(names::MAP_UNLOCK_HITS, 0)?;
    for (index, slot) in collected.cpu_counts.iter_mut().enumerate() {
        *slot = maps.array_word(names::MAP_CPU_COUNTS, index as u32)?;
    }
    for (index, slot) in collected.drops.iter_mut().enumerate() {
        *slot = maps.per_cpu_sum(names::MAP_DROPS, index as u32)?;
    }
    collected.requests = maps.per_cpu_sum(names::MAP_REQUESTS, requests::WHILE_COUNTING)?;
    collected.requests_whole_recording =
        maps.per_cpu_sum(names::MAP_REQUESTS, requests::WHOLE_RECORDING)?;
    collected.cond_wait_calls = maps.per_cpu_sum(names::MAP_COND_CALLS, 0)?;
    Ok(collected)
}

/// Adds the per-caller counts to their locks' calls.
fn fold_callers(locks: &mut HashMap<u64, LockCounts>, callers: &HashMap<CallerKey, u64>) {
    for (key, &count) in callers {
        let counts = locks.entry(key.lock).or_default();
        if let Some(calls) = counts.calls.get_mut(key.op as usize) {
            *calls += count;
        }
    }
}

/// Sets what the BPF programs count (bits of `tracer_common::counting`).
/// Turning a bit off returns only once every program run that may have
/// seen it on has finished, so a read that follows misses no increment.
pub fn set_counting(ebpf: &mut Ebpf, bits: u32) -> Result<()> {
    let before = switch_counting(ebpf, bits)?;
    let stopped = before & !bits & (counting::LOCK_CALLS | counting::WAITS) != 0;
    let paused = bits & !before & counting::PAUSED != 0;
    if stopped || paused {
        wait_for_running_programs()?;
    }
    Ok(())
}

/// Sets what the BPF programs count without waiting for the runs in
/// progress (sampled windows: a late increment still lands in the totals).
/// Returns the bits before.
pub(crate) fn switch_counting(ebpf: &mut Ebpf, bits: u32) -> Result<u32> {
    let mut switch: Array<&mut MapData, u32> = Array::try_from(
        ebpf.map_mut(names::MAP_COUNTING)
            .with_context(|| format!("BPF object lacks map {}", names::MAP_COUNTING))?,
    )?;
    let before = switch.get(&0, 0).unwrap_or(0);
    switch
        .set(0, bits, 0)
        .context("switching the BPF programs' counting")?;
    Ok(before)
}

/// Runs `work` (deleting map entries) while counting is paused: no BPF
/// program holds a pointer to a map value meanwhile, so an entry deleted and
/// reused for another key cannot receive a late increment. What comes during
/// the pause is counted as dropped (`paused_for_expiry`).
pub(crate) fn while_paused(
    ebpf: &mut Ebpf,
    work: impl FnOnce(&mut Ebpf) -> Result<()>,
) -> Result<()> {
    let before = {
        let switch: Array<&MapData, u32> = Array::try_from(map(ebpf, names::MAP_COUNTING)?)?;
        switch.get(&0, 0).unwrap_or(0)
    };
    set_counting(ebpf, before | counting::PAUSED)?;
    let done = work(ebpf);
    set_counting(ebpf, before)?;
    done
}

/// Returns once every BPF program run in progress has finished. Uprobe and
/// tracepoint programs run inside an RCU read-side section; the global
/// membarrier command is one RCU grace period (`synchronize_rcu`) in the kernel.
fn wait_for_running_programs() -> Result<()> {
    const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
    // SAFETY: membarrier takes two integers and touches no memory of ours.
    let result = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
    if result != 0 {
        let error = std::io::Error::last_os_error();
        anyhow::bail!(
            "membarrier(MEMBARRIER_CMD_GLOBAL) failed ({error}); locktrace needs it to stop counting cleanly (Linux 4.3 or newer, not nohz_full)"
        );
    }
    Ok(())
}

/// Calls of the request-boundary function so far (None without the map).
pub(crate) fn request_probe_hits(ebpf: &Ebpf) -> Option<u64> {
    per_cpu_sum(ebpf, names::MAP_REQUESTS, requests::WHILE_COUNTING).ok()
}

/// Lock calls counted so far, over all locks.
pub(crate) fn total_lock_calls(ebpf: &Ebpf) -> Result<u64> {
    let locks: BpfHashMap<&MapData, u64, LockCounts> =
        BpfHashMap::try_from(map(ebpf, names::MAP_LOCKS)?)?;
    let mut total = 0u64;
    for entry in locks.iter() {
        let (_, counts) = entry.context("reading map LOCKS")?;
        total += counts.calls.iter().sum::<u64>();
    }
    let callers: HashMap<CallerKey, u64> = read_per_cpu_hash(ebpf, names::MAP_CALLERS)?;
    Ok(total + callers.values().sum::<u64>())
}

#[cfg(test)]
mod tests {
    use tracer_common::{LockOp, drop_reason};

    use super::*;
    use crate::trace::maps::FakeMaps;

    const LOCK: u64 = 0x1000;

    fn key(op: LockOp, return_ip: u64) -> CallerKey {
        CallerKey {
            lock: LOCK,
            return_ip,
            op: op as u32,
            _pad: 0,
        }
    }

    fn loaded() -> FakeMaps {
        FakeMaps::loaded()
    }

    /// A lock's calls are those with an unknown caller (LOCKS) plus those
    /// under each caller, summed over the CPUs; failed tries stay apart.
    #[test]
    fn callers_fold_into_their_locks_calls_over_every_cpu() {
        let mut in_locks = LockCounts::default();
        in_locks.calls[LockOp::MutexLock as usize] = 7;
        let maps = loaded()
            .with(names::MAP_LOCKS, HashMap::from([(LOCK, in_locks)]))
            .with(
                names::MAP_CALLERS,
                HashMap::from([
                    (key(LockOp::MutexLock, 0x10), vec![100u64, 200]),
                    (key(LockOp::MutexLock, 0x20), vec![0, 3]),
                    (key(LockOp::MutexTrylock, 0x30), vec![5, 0]),
                ]),
            )
            .with(
                names::MAP_FAILED_TRIES,
                HashMap::from([(key(LockOp::MutexTrylock, 0x30), 9u64)]),
            );
        let collected = collect(&maps).unwrap();
        let calls = collected.locks[&LOCK].calls;
        assert_eq!(calls[LockOp::MutexLock as usize], 7 + 300 + 3);
        assert_eq!(calls[LockOp::MutexTrylock as usize], 5);
        assert_eq!(collected.callers[&key(LockOp::MutexLock, 0x10)], 300);
        assert_eq!(collected.failed_tries[&key(LockOp::MutexTrylock, 0x30)], 9);
    }

    /// Drops, requests and the condvar calls are per-CPU counters, summed.
    #[test]
    fn counters_are_summed_over_the_cpus_at_their_index() {
        let maps = loaded()
            .with_per_cpu(names::MAP_DROPS, drop_reason::CALLERS_FULL, vec![2, 5])
            .with_per_cpu(names::MAP_REQUESTS, requests::WHILE_COUNTING, vec![40, 2])
            .with_per_cpu(names::MAP_REQUESTS, requests::WHOLE_RECORDING, vec![50, 3])
            .with_per_cpu(names::MAP_COND_CALLS, 0, vec![1, 1])
            .with(names::MAP_CPU_COUNTS, HashMap::from([(1u32, 12u64)]));
        let collected = collect(&maps).unwrap();
        assert_eq!(collected.drops[drop_reason::CALLERS_FULL as usize], 7);
        assert_eq!(collected.drops.iter().sum::<u64>(), 7);
        assert_eq!(collected.requests, 42);
        assert_eq!(collected.requests_whole_recording, 53);
        assert_eq!(collected.cond_wait_calls, 2);
        assert_eq!(collected.cpu_counts[1], 12);
    }

    #[test]
    fn a_missing_map_is_a_broken_build_said_by_name() {
        let maps = FakeMaps::default();
        let error = collect(&maps).unwrap_err();
        assert_eq!(error.to_string(), "BPF object lacks map CALLERS");
    }
}
