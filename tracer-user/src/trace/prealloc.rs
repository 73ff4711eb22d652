//! Hash maps allocated at run time (`BPF_F_NO_PREALLOC`) on kernels that
//! refuse or warn about them in tracing programs. Linux before 6.1 refuses
//! them in perf-event programs and, in uprobe and tracepoint programs,
//! logs a WARNING and taints the kernel (a host with `panic_on_warn`
//! panics). There the object's maps are preallocated instead: more kernel
//! memory (tens of MB at their sizes), no warning.
use anyhow::{Result, anyhow};
use object::{Object, ObjectSection, ObjectSymbol};

use super::sys::{BPF_MAP_CREATE, bpf, load_probe_program};

const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_F_NO_PREALLOC: u32 = 1;
const BPF_PROG_TYPE_PERF_EVENT: u32 = 7;
/// Size of a map definition in the `maps` section (`bpf_map_def`: type,
/// key size, value size, max entries, flags, id, pinning) and its flags' offset.
const MAP_DEF_SIZE: u64 = 28;
const MAP_FLAGS_AT: usize = 16;

/// Set in the environment, the maps are preallocated whatever the kernel
/// allows (the tests' stand-in for a kernel before 6.1).
pub(crate) const FORCE_FOR_A_TEST: &str = "LOCKTRACE_TEST_PREALLOCATE";

#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// Whether tracing programs may use hash maps allocated at run time: a
/// perf-event program that references one loads (Linux 6.1+) or is
/// refused. The probe itself never warns: the kernel refuses perf-event
/// programs before it gets to the warning.
pub(crate) fn run_time_allocation_allowed() -> bool {
    if std::env::var_os(FORCE_FOR_A_TEST).is_some() {
        return false;
    }
    let mut map = MapCreateAttr {
        map_type: BPF_MAP_TYPE_HASH,
        key_size: 8,
        value_size: 8,
        max_entries: 1,
        map_flags: BPF_F_NO_PREALLOC,
    };
    // A kernel without BPF fails later, with the loader's own message.
    let Ok(map_fd) = bpf(BPF_MAP_CREATE, &mut map) else {
        return true;
    };
    use std::os::fd::AsRawFd;
    // r1 = the map (ld_imm64 with BPF_PSEUDO_MAP_FD); r0 = 0; exit.
    let instructions: [u64; 4] = [
        0x18 | (1 << 8) | (1 << 12) | ((map_fd.as_raw_fd() as u32 as u64) << 32),
        0,
        0xb7,
        0x95,
    ];
    load_probe_program(BPF_PROG_TYPE_PERF_EVENT, &instructions).is_ok()
}

/// `object` with `BPF_F_NO_PREALLOC` cleared on every map it defines.
pub(crate) fn preallocated(object: &[u8]) -> Result<Vec<u8>> {
    let file = object::File::parse(object).map_err(|error| anyhow!("the BPF object: {error}"))?;
    let section = file
        .section_by_name("maps")
        .ok_or_else(|| anyhow!("the BPF object has no maps section"))?;
    let (section_at, _) = section
        .file_range()
        .ok_or_else(|| anyhow!("the BPF object's maps section has no bytes"))?;
    let mut bytes = object.to_vec();
    let maps = file
        .symbols()
        .filter(|symbol| symbol.section_index() == Some(section.index()))
        .filter(|symbol| symbol.size() == MAP_DEF_SIZE);
    for symbol in maps {
        let at = usize::try_from(section_at + symbol.address())? + MAP_FLAGS_AT;
        let flags = bytes
            .get_mut(at..at + 4)
            .ok_or_else(|| anyhow!("map {:?} lies past the object's end", symbol.name()))?;
        let cleared = u32::from_le_bytes(flags.try_into()?) & !BPF_F_NO_PREALLOC;
        flags.copy_from_slice(&cleared.to_le_bytes());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real object: its run-time allocated maps come out preallocated,
    /// and nothing else changes.
    #[test]
    fn clears_no_prealloc_on_the_objects_maps_only() {
        let object = super::super::attach::bpf_object();
        let patched = preallocated(object).unwrap();
        let before = aya_obj::Object::parse(object).unwrap();
        let after = aya_obj::Object::parse(&patched).unwrap();
        let mut cleared = 0;
        for (name, map) in &before.maps {
            let flags = after.maps[name].map_flags();
            assert_eq!(flags, map.map_flags() & !BPF_F_NO_PREALLOC, "{name}");
            cleared += usize::from(map.map_flags() & BPF_F_NO_PREALLOC != 0);
        }
        assert!(cleared >= 4, "{cleared} maps were allocated at run time");
        let differing = object.iter().zip(&patched).filter(|(a, b)| a != b).count();
        assert_eq!(differing, cleared, "one byte per map's flags");
    }
}
