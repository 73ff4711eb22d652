//! Kernel lock contention (`lock:contention_begin`/`contention_end`, Linux
//! 5.19+): attached when the kernel has the tracepoints, else the reason in
//! one line and the recording goes on without them; read into
//! [`KernelLocksCollected`] at the end.
use std::{collections::HashMap, path::Path};

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, StackTraceMap},
    programs::TracePoint,
};
use tracer_common::{KernelLockCounts, KernelLockKey, kernel_lock, names};

use super::{features::WITHOUT_FOR_A_TEST, maps};
use crate::model::KernelLocksCollected;

/// Where tracefs may be (see `preflight::ensure_tracefs`, which mounts it).
const TRACEFS_DIRS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Attaches both programs; the error is the one line saying why the
/// kernel-locks section is unavailable (the programs are then left out).
pub fn attach(ebpf: &mut Ebpf) -> Result<(), String> {
    let forced_off = std::env::var(WITHOUT_FOR_A_TEST)
        .unwrap_or_default()
        .split(',')
        .any(|item| item.trim() == "lock_events");
    let present = TRACEFS_DIRS
        .iter()
        .any(|dir| Path::new(dir).join("events/lock/contention_begin").is_dir());
    if forced_off || !present {
        return Err(String::from(
            "this kernel has no lock:contention_begin tracepoint (Linux 5.19+ has it)",
        ));
    }
    for (name, event) in [
        (names::PROGRAM_KERNEL_LOCK_END, "contention_end"),
        (names::PROGRAM_KERNEL_LOCK_BEGIN, "contention_begin"),
    ] {
        attach_one(ebpf, name, event)
            .map_err(|error| format!("attaching to lock:{event} failed: {error:#}"))?;
    }
    Ok(())
}

/// The end program first: every contention begun is then seen to end.
fn attach_one(ebpf: &mut Ebpf, name: &str, event: &str) -> Result<()> {
    let program: &mut TracePoint = ebpf
        .program_mut(name)
        .with_context(|| format!("BPF object lacks program {name}"))?
        .try_into()?;
    program.load()?;
    program.attach("lock", event)?;
    Ok(())
}

/// The counts, the kernel stacks they name and the programs' events; or
/// only the reason when the programs were not attached.
pub fn read(ebpf: &Ebpf, unavailable: Option<String>) -> Result<KernelLocksCollected> {
    if unavailable.is_some() {
        return Ok(KernelLocksCollected {
            unavailable,
            ..KernelLocksCollected::default()
        });
    }
    let table: BpfHashMap<&MapData, KernelLockKey, KernelLockCounts> =
        BpfHashMap::try_from(maps::map(ebpf, names::MAP_KERNEL_LOCKS)?)?;
    let mut counts = HashMap::new();
    for entry in table.iter() {
        let (key, value) = entry.context("reading map KERNEL_LOCKS")?;
        counts.insert(key, value);
    }
    let stack_map: StackTraceMap<&MapData> =
        StackTraceMap::try_from(maps::map(ebpf, names::MAP_KERNEL_LOCK_STACKS)?)?;
    let mut stacks = HashMap::new();
    for key in counts.keys() {
        let Ok(id) = u32::try_from(key.stack_id) else {
            continue;
        };
        if let Ok(stack) = stack_map.get(&id, 0) {
            let frames = stack.frames().iter().map(|frame| frame.ip).collect();
            stacks.insert(key.stack_id, frames);
        }
    }
    let mut events = [0; kernel_lock::event::COUNT as usize];
    for (index, slot) in events.iter_mut().enumerate() {
        *slot = maps::per_cpu_sum(ebpf, names::MAP_KERNEL_LOCK_EVENTS, index as u32)?;
    }
    Ok(KernelLocksCollected {
        unavailable: None,
        counts,
        stacks,
        events,
    })
}
