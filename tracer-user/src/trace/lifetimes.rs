//! Two lifetimes of one address (`tracer_common::lifetime`): the module
//! ranges the BPF side watches for unmaps, and the log of what went away,
//! read back for [`crate::model::Lifetimes`].
use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{Array, MapData, PerCpuArray},
    programs::TracePoint,
};
use tracer_common::{Unmapped, lifetime, names};

use super::maps::{map, map_mut};
use crate::{model::Lifetimes, probe::target::Mapping};

/// The module ranges last written to `WATCHED`.
#[derive(Debug, Default)]
pub struct Watched {
    written: Vec<[u64; 2]>,
}

impl Watched {
    /// Writes `ranges` ([`module_ranges`]) to `WATCHED` when they changed
    /// since the last call.
    pub(crate) fn update(&mut self, ebpf: &mut Ebpf, ranges: Vec<[u64; 2]>) -> Result<()> {
        if ranges == self.written {
            return Ok(());
        }
        let mut watched: Array<&mut MapData, [u64; 2]> =
            Array::try_from(map_mut(ebpf, names::MAP_WATCHED)?)?;
        for index in 0..lifetime::WATCHED_RANGES {
            let range = ranges.get(index as usize).copied().unwrap_or([0, 0]);
            watched
                .set(index, range, 0)
                .context("writing map WATCHED")?;
        }
        self.written = ranges;
        Ok(())
    }
}

/// The file mappings of `maps`, adjacent ones of one file joined (a
/// library's text, data and bss), at most `WATCHED_RANGES`, the
/// highest-addressed dropped first (thread stacks and heaps are not
/// watched: their locks are named by creation site, not by address).
pub(crate) fn module_ranges(maps: &[Mapping]) -> Vec<[u64; 2]> {
    let mut ranges: Vec<[u64; 2]> = Vec::new();
    let mut last_path: Option<&str> = None;
    let mut sorted: Vec<&Mapping> = maps.iter().filter(|m| m.is_file()).collect();
    sorted.sort_by_key(|m| m.start);
    for mapping in sorted {
        match ranges.last_mut() {
            Some(last) if last_path == Some(mapping.path.as_str()) && last[1] >= mapping.start => {
                last[1] = last[1].max(mapping.end);
            }
            _ => ranges.push([mapping.start, mapping.end]),
        }
        last_path = Some(mapping.path.as_str());
    }
    ranges.truncate(lifetime::WATCHED_RANGES as usize);
    ranges
}

/// Attaches the programs that start a new generation: the syscalls that
/// unmap (`munmap`, `mremap`, `MAP_FIXED` `mmap`) and `exec`.
pub(crate) fn attach(ebpf: &mut Ebpf) -> Result<()> {
    for (name, category, event) in [
        (names::PROGRAM_MUNMAP_ENTER, "syscalls", "sys_enter_munmap"),
        (names::PROGRAM_MREMAP_ENTER, "syscalls", "sys_enter_mremap"),
        (names::PROGRAM_MMAP_ENTER, "syscalls", "sys_enter_mmap"),
        (names::PROGRAM_MMAP_EXIT, "syscalls", "sys_exit_mmap"),
        (names::PROGRAM_PROCESS_EXEC, "sched", "sched_process_exec"),
    ] {
        let program: &mut TracePoint = ebpf
            .program_mut(name)
            .with_context(|| format!("BPF object lacks program {name}"))?
            .try_into()?;
        program.load().with_context(|| format!("loading {name}"))?;
        program
            .attach(category, event)
            .with_context(|| format!("attaching to the {category}:{event} tracepoint"))?;
    }
    Ok(())
}

/// The generation now and every logged unmap, oldest first.
pub(crate) fn read(ebpf: &Ebpf) -> Result<Lifetimes> {
    let generation: Array<&MapData, u64> = Array::try_from(map(ebpf, names::MAP_GENERATION)?)?;
    let counts: PerCpuArray<&MapData, u64> =
        PerCpuArray::try_from(map(ebpf, names::MAP_UNMAPPED_COUNT)?)?;
    let log: PerCpuArray<&MapData, Unmapped> =
        PerCpuArray::try_from(map(ebpf, names::MAP_UNMAPPED)?)?;
    let filled = counts.get(&0, 0).context("reading map UNMAPPED_COUNT")?;
    let mut unmapped = Vec::new();
    for index in 0..filled.iter().copied().max().unwrap_or(0) {
        let entries = log
            .get(&(index as u32), 0)
            .context("reading map UNMAPPED")?;
        for (cpu, entry) in entries.iter().enumerate() {
            if index < filled.get(cpu).copied().unwrap_or(0) {
                unmapped.push(*entry);
            }
        }
    }
    Ok(Lifetimes::new(
        generation.get(&0, 0).context("reading map GENERATION")?,
        unmapped,
    ))
}
