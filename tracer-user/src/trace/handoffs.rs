//! The handoff maps: the CPUs' places in the cache topology, written at
//! load (`CPU_PLACES`), and the counts per lock, read with the others.

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{Array, MapData},
};
use tracer_common::{CpuPlace, MAX_CPUS, names};

use super::maps::map_mut;
use crate::probe::topology::Topology;

/// [`store_places`] of this machine's topology, when `flags` (bits of
/// `tracer_common::flags`) count handoffs.
pub(crate) fn store_places_if(ebpf: &mut Ebpf, flags: u32) -> Result<()> {
    if flags & tracer_common::flags::HANDOFFS == 0 {
        return Ok(());
    }
    store_places(ebpf, &crate::probe::topology::read())
}

/// Writes each CPU's place (CPUs beyond `MAX_CPUS` stay unknown: their
/// moves count as another L3's).
pub(crate) fn store_places(ebpf: &mut Ebpf, topology: &Topology) -> Result<()> {
    let mut places: Array<&mut MapData, CpuPlace> =
        Array::try_from(map_mut(ebpf, names::MAP_CPU_PLACES)?)?;
    for (cpu, place) in topology.places().filter(|(cpu, _)| *cpu < MAX_CPUS) {
        places
            .set(cpu, place, 0)
            .with_context(|| format!("writing CPU {cpu}'s place to {}", names::MAP_CPU_PLACES))?;
    }
    Ok(())
}
