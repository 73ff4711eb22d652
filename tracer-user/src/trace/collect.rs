//! Map reading: copies the BPF maps into plain Rust data after tracing stops,
//! and the switch that stops (or pauses) counting first, so that every map
//! read describes the same interval.
use std::collections::HashMap;

use super::{
    inflight::{self, WaitsBeforeAttach},
    lifetimes,
    maps::{map, per_cpu_sum, read_hash, read_per_cpu_hash},
};
use crate::model::Collected;
use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData},
};
use tracer_common::{CallerKey, LockCounts, counting, names, requests};

/// Reads every map. Stop counting first ([`set_counting`] with 0) when the
/// figures must describe one interval.
/// Everything a report is built from, for `record` and the live views:
/// the maps, what `add` puts in (unwound stacks), the waits in progress
/// (those older than the probes matched with `before`), every key merged
/// across the generations of its address, last; and the CPU sampler's rate.
pub fn read_for_report(
    ebpf: &Ebpf,
    pid: u32,
    before: &WaitsBeforeAttach,
    cpu_hz: u64,
    add: impl FnOnce(&mut Collected),
) -> Result<Collected> {
    let mut collected = collect(ebpf)?;
    add(&mut collected);
    collected.in_flight = inflight::read(ebpf, pid, before.attached_ns, before.blocked.clone());
    // Last: every key above, unwound stacks and waits in progress included,
    // is merged across the generations of its address.
    collected.merge_lifetimes(lifetimes::read(ebpf)?);
    collected.cpu_hz = cpu_hz;
    Ok(collected)
}

pub fn collect(ebpf: &Ebpf) -> Result<Collected> {
    let callers = read_per_cpu_hash(ebpf, names::MAP_CALLERS)?;
    let mut locks: HashMap<u64, LockCounts> = read_hash(ebpf, names::MAP_LOCKS)?;
    // Failed calls (busy, timed out) are counted apart, never in the two above.
    let failed_tries = read_hash(ebpf, names::MAP_FAILED_TRIES)?;
    // The BPF side counts a call under its caller, or in LOCKS when the
    // caller is unknown: a lock's calls are the sum of both.
    fold_callers(&mut locks, &callers);
    let mut collected = Collected {
        locks,
        futexes: read_hash(ebpf, names::MAP_FUTEXES)?,
        condvars: read_hash(ebpf, names::MAP_CONDVARS)?,
        go_futexes: read_hash(ebpf, names::MAP_GO_FUTEXES)?,
        callers,
        failed_tries,
        stacks: read_hash(ebpf, names::MAP_STACK_COUNTS)?,
        wait_holders: read_hash(ebpf, names::MAP_WAIT_HOLDERS)?,
        holds: read_hash(ebpf, names::MAP_HOLDS)?,
        holders: read_hash(ebpf, names::MAP_HOLDERS)?,
        cpu_locks: read_hash(ebpf, names::MAP_CPU_LOCKS)?,
        handoffs: super::handoffs::read(ebpf)?,
        ..Collected::default()
    };
    collected.unlock_hits = per_cpu_sum(ebpf, names::MAP_UNLOCK_HITS, 0)?;
    let cpu_counts: Array<&MapData, u64> = Array::try_from(map(ebpf, names::MAP_CPU_COUNTS)?)?;
    for (index, slot) in collected.cpu_counts.iter_mut().enumerate() {
        *slot = cpu_counts.get(&(index as u32), 0).unwrap_or(0);
    }
    for (index, slot) in collected.drops.iter_mut().enumerate() {
        *slot = per_cpu_sum(ebpf, names::MAP_DROPS, index as u32)?;
    }
    collected.requests = per_cpu_sum(ebpf, names::MAP_REQUESTS, requests::WHILE_COUNTING)?;
    collected.requests_whole_recording =
        per_cpu_sum(ebpf, names::MAP_REQUESTS, requests::WHOLE_RECORDING)?;
    collected.cond_wait_calls = per_cpu_sum(ebpf, names::MAP_COND_CALLS, 0)?;
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
pub fn switch_counting(ebpf: &mut Ebpf, bits: u32) -> Result<u32> {
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
pub fn while_paused(ebpf: &mut Ebpf, work: impl FnOnce(&mut Ebpf) -> Result<()>) -> Result<()> {
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
pub fn request_probe_hits(ebpf: &Ebpf) -> Option<u64> {
    per_cpu_sum(ebpf, names::MAP_REQUESTS, requests::WHILE_COUNTING).ok()
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
    let callers: HashMap<CallerKey, u64> = read_per_cpu_hash(ebpf, names::MAP_CALLERS)?;
    Ok(total + callers.values().sum::<u64>())
}
