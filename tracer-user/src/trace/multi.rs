//! Uprobe-multi links (`BPF_LINK_CREATE` with `BPF_TRACE_UPROBE_MULTI`,
//! Linux 6.6+): one link puts a program on every probe point of a module,
//! and closing it removes them all behind a single wait for the uprobe
//! grace periods, where a perf-event uprobe per point waits once per point
//! (docs/benchmarks.md, "Opening and closing a sampled window").
//!
//! aya 0.14 cannot load a program for this attach type (`UProbe::load`
//! passes no `expected_attach_type`, and the kernel refuses a uprobe-multi
//! link to a program loaded without it), so the program is loaded here a
//! second time from the same object, its maps relocated to the maps aya
//! created: both copies count into the same maps.
use std::{
    collections::HashSet,
    ffi::CString,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    path::Path,
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{Ebpf, maps::Map};

use super::sys::{BPF_PROG_LOAD, ProgLoadAttr, bpf};

const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_TRACE_UPROBE_MULTI: u32 = 48;

/// `union bpf_attr` for `BPF_LINK_CREATE` of a uprobe-multi link.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    /// Named so that it is zeroed: the kernel refuses (EINVAL) an attr
    /// with a non-zero byte past the last field it knows.
    padding: u32,
}

/// Programs of the object loaded for uprobe-multi links.
pub struct MultiPrograms {
    programs: Vec<(String, OwnedFd)>,
}

impl MultiPrograms {
    /// Loads `names` from `object`, their maps resolved to `ebpf`'s.
    pub(crate) fn load(object: &[u8], ebpf: &Ebpf, names: &[&str]) -> Result<MultiPrograms> {
        let mut obj = aya_obj::Object::parse(object).context("parsing the BPF object")?;
        if obj.has_btf_relocations() {
            bail!("the BPF object has CO-RE relocations, which this loader does not apply");
        }
        let maps = std::mem::take(&mut obj.maps);
        let mut resolved = Vec::new();
        for (name, map) in &maps {
            // Global data sections aya did not create are not referenced.
            if let Some(fd) = ebpf.map(name).map(map_fd) {
                resolved.push((name.as_str(), fd, map));
            }
        }
        let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
        obj.relocate_maps(resolved.into_iter(), &text_sections)
            .context("relocating the BPF program's maps")?;
        obj.relocate_calls(&text_sections)
            .context("relocating the BPF program's calls")?;
        let license = obj.license.clone();
        let mut programs = Vec::new();
        for name in names {
            let program = obj
                .programs
                .get(*name)
                .ok_or_else(|| anyhow!("BPF object lacks program {name} (build is broken)"))?;
            let function = &obj.functions[&program.function_key()];
            let fd = load_program(name, &function.instructions, &license)
                .with_context(|| format!("loading {name} for uprobe-multi links"))?;
            programs.push((name.to_string(), fd));
        }
        Ok(MultiPrograms { programs })
    }

    pub(crate) fn fd(&self, name: &str) -> Result<BorrowedFd<'_>> {
        self.programs
            .iter()
            .find(|(program, _)| program == name)
            .map(|(_, fd)| fd.as_fd())
            .ok_or_else(|| anyhow!("program {name} was not loaded for uprobe-multi links"))
    }
}

fn load_program(
    name: &str,
    instructions: &[aya_obj::generated::bpf_insn],
    license: &CString,
) -> std::io::Result<OwnedFd> {
    let mut attr = ProgLoadAttr::new(BPF_PROG_TYPE_KPROBE, instructions, license);
    attr.expected_attach_type = BPF_TRACE_UPROBE_MULTI;
    for (slot, byte) in attr.prog_name.iter_mut().zip(name.bytes().take(15)) {
        *slot = byte;
    }
    bpf(BPF_PROG_LOAD, &mut attr)
}

/// Attaches `program` at `offsets` (file offsets) of the file at `path`,
/// each with its cookie, firing only in process `pid`. Closing the link
/// detaches every point.
pub(crate) fn attach(
    program: BorrowedFd,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    pid: u32,
) -> Result<OwnedFd> {
    assert_eq!(offsets.len(), cookies.len(), "one cookie per offset");
    let c_path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| anyhow!("path {} holds a NUL byte", path.display()))?;
    let mut attr = LinkCreateAttr {
        prog_fd: program.as_raw_fd() as u32,
        attach_type: BPF_TRACE_UPROBE_MULTI,
        path: c_path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cookies: cookies.as_ptr() as u64,
        cnt: offsets.len() as u32,
        pid,
        ..LinkCreateAttr::default()
    };
    bpf(BPF_LINK_CREATE, &mut attr).map_err(|error| {
        anyhow!(
            "a uprobe-multi link on {} points in {} failed: {error}",
            offsets.len(),
            path.display()
        )
    })
}

/// The file descriptor of any map aya created (every variant holds one).
fn map_fd(map: &Map) -> i32 {
    let data = match map {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    };
    data.fd().as_fd().as_raw_fd()
}
