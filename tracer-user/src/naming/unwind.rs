//! Whole user stacks from stack snapshots (registers and a copy of the
//! stack the BPF side took), unwound with each module's call-frame
//! information: `.eh_frame` (with its `.eh_frame_hdr` index). Code built
//! without frame pointers (most distribution builds of PHP, Apache,
//! glibc) unwinds as far as the copied window reaches; code without
//! call-frame information (Go) falls back to its frame pointers.
//!
//! Unwinding runs while the target lives (at each tick), so the modules are
//! the ones mapped when the snapshot was taken; only the frames are kept.
use std::{
    collections::{HashMap, HashSet},
    ops::{Deref, Range},
    sync::Arc,
    time::{Duration, Instant},
};

use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder,
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
};
use object::{Object, ObjectSection};
use tracer_common::{SnapshotHeader, StackKey};

use super::elf::Segment;
use crate::{
    model::UnwoundStack,
    probe::{
        modules::{ModuleFile, ModuleStore},
        target::{self, Mapping, Target},
    },
    trace::snapshots::SnapshotSink,
};

/// Frames kept per stack.
const MAX_FRAMES: usize = 128;
/// The maps are re-read for an address no known module covers at most
/// this often.
const MAPS_REREAD_EVERY: Duration = Duration::from_millis(100);

/// A section's bytes inside a mapped module file (no copy).
struct SectionBytes {
    file: Arc<ModuleFile>,
    range: Range<usize>,
}

impl Deref for SectionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.file.bytes().get(self.range.clone()).unwrap_or(&[])
    }
}

pub struct StackUnwinder {
    pid: u32,
    store: ModuleStore,
    unwinder: UnwinderX86_64<SectionBytes>,
    cache: CacheX86_64,
    /// Executable mappings given to the unwinder, by (start, end).
    added: HashSet<(u64, u64)>,
    /// Executable mappings at the last read of the maps, sorted.
    code: Vec<(u64, u64)>,
    maps_read: Option<Instant>,
    unwound: HashMap<StackKey, Vec<UnwoundStack>>,
}

impl StackUnwinder {
    pub fn new(target: &Target) -> StackUnwinder {
        let mut unwinder = StackUnwinder {
            pid: target.pid,
            store: target.modules.clone(),
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            added: HashSet::new(),
            code: Vec::new(),
            maps_read: None,
            unwound: HashMap::new(),
        };
        unwinder.add_modules(target.maps.clone());
        unwinder
    }

    /// Unwinds one snapshot (`stack`: its bytes from `header.sp` up) and
    /// keeps its frames under its key.
    pub fn add(&mut self, header: &SnapshotHeader, stack: &[u8]) {
        let mut frames = unwind_stack(&self.unwinder, &mut self.cache, header, stack);
        let uncovered = frames.iter().any(|&ip| !self.covers(ip));
        if uncovered && self.reread_maps() {
            frames = unwind_stack(&self.unwinder, &mut self.cache, header, stack);
        }
        self.unwound
            .entry(header.key)
            .or_default()
            .push(UnwoundStack {
                count_at: header.count_at,
                frames,
            });
    }

    pub fn into_stacks(self) -> HashMap<StackKey, Vec<UnwoundStack>> {
        self.unwound
    }

    /// True when an executable mapping holds `ip` (a return address: the
    /// call before it).
    fn covers(&self, ip: u64) -> bool {
        let at = ip.wrapping_sub(1);
        let after = self.code.partition_point(|&(start, _)| start <= at);
        after > 0 && at < self.code[after - 1].1
    }

    /// Re-reads the maps (a library loaded since); false when it was done
    /// too recently or nothing new came.
    fn reread_maps(&mut self) -> bool {
        if self
            .maps_read
            .is_some_and(|at| at.elapsed() < MAPS_REREAD_EVERY)
        {
            return false;
        }
        self.maps_read = Some(Instant::now());
        let Ok(maps) = target::read_maps(self.pid) else {
            return false;
        };
        self.add_modules(maps) > 0
    }

    /// Gives the unwinder every executable file mapping not given yet.
    /// Returns how many were added.
    fn add_modules(&mut self, maps: Vec<Mapping>) -> usize {
        let mut added = 0;
        for mapping in maps.iter().filter(|m| m.is_executable() && m.is_file()) {
            if !self.added.insert((mapping.start, mapping.end)) {
                continue;
            }
            let link = format!(
                "/proc/{}/map_files/{:x}-{:x}",
                self.pid, mapping.start, mapping.end
            );
            let file = self
                .store
                .open(link.as_ref())
                .or_else(|_| self.store.open(&target::host_path(self.pid, &mapping.path)));
            if let Some(module) = file.ok().and_then(|file| module_for(mapping, file)) {
                self.unwinder.add_module(module);
                added += 1;
            }
        }
        if !maps.is_empty() {
            self.code = maps
                .iter()
                .filter(|mapping| mapping.is_executable())
                .map(|mapping| (mapping.start, mapping.end))
                .collect();
            self.code.sort_unstable();
        }
        added
    }
}

impl SnapshotSink for StackUnwinder {
    fn take(&mut self, header: &SnapshotHeader, stack: &[u8]) {
        self.add(header, stack);
    }
}

/// The frames of one snapshot: its instruction pointer, then each return
/// address the unwinder finds inside the copied window. A snapshot taken
/// at a lock call's entry starts from the return address in its slot (the
/// lock function's own unwind information is not needed: musl has none).
fn unwind_stack(
    unwinder: &UnwinderX86_64<SectionBytes>,
    cache: &mut CacheX86_64,
    snapshot: &SnapshotHeader,
    stack: &[u8],
) -> Vec<u64> {
    let sp = snapshot.sp;
    let mut read_stack = |address: u64| -> Result<u64, ()> {
        let at = usize::try_from(address.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
        let bytes = stack.get(at..at.checked_add(8).ok_or(())?).ok_or(())?;
        Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
    };
    let mut frames = vec![snapshot.ip];
    let from_caller = (snapshot.return_slot != 0)
        .then(|| read_stack(snapshot.return_slot).ok())
        .flatten()
        .and_then(|return_ip| Some((FrameAddress::from_return_address(return_ip)?, return_ip)));
    let (mut address, mut regs) = match from_caller {
        Some((address, return_ip)) => {
            frames.push(return_ip);
            let caller_sp = snapshot.return_slot.wrapping_add(8);
            (
                address,
                UnwindRegsX86_64::new(return_ip, caller_sp, snapshot.bp),
            )
        }
        None => (
            FrameAddress::from_instruction_pointer(snapshot.ip),
            UnwindRegsX86_64::new(snapshot.ip, sp, snapshot.bp),
        ),
    };
    while frames.len() < MAX_FRAMES {
        let next = unwinder.unwind_frame(address, &mut regs, cache, &mut read_stack);
        let Some(next) = next
            .ok()
            .flatten()
            .and_then(FrameAddress::from_return_address)
        else {
            break;
        };
        frames.push(next.address());
        address = next;
    }
    frames
}

/// The unwinder's view of one executable mapping of an ELF file: where it
/// is loaded and its call-frame sections; None when the file has none of
/// what is needed to place it.
fn module_for(mapping: &Mapping, file: Arc<ModuleFile>) -> Option<Module<SectionBytes>> {
    let elf = file.elf().ok()?;
    let bias = super::region::bias_of(mapping, &Segment::all(&elf))?;
    let section = |name: &str| -> (Option<Range<u64>>, Option<SectionBytes>) {
        let Some(section) = elf.section_by_name(name) else {
            return (None, None);
        };
        let svma = section.address()..section.address() + section.size();
        let bytes = section.file_range().and_then(|(offset, size)| {
            let start = usize::try_from(offset).ok()?;
            let end = start.checked_add(usize::try_from(size).ok()?)?;
            (end <= file.bytes().len()).then(|| SectionBytes {
                file: Arc::clone(&file),
                range: start..end,
            })
        });
        (Some(svma), bytes)
    };
    let (text_svma, text) = section(".text");
    let (eh_frame_svma, eh_frame) = section(".eh_frame");
    let (eh_frame_hdr_svma, eh_frame_hdr) = section(".eh_frame_hdr");
    let (got_svma, _) = section(".got");
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma,
        text,
        got_svma,
        eh_frame_svma,
        eh_frame,
        eh_frame_hdr_svma,
        eh_frame_hdr,
        stubs_svma: None,
        stub_helper_svma: None,
        unwind_info: None,
        debug_frame: None,
        text_segment_svma: None,
        text_segment: None,
    };
    Some(Module::new(
        mapping.path.clone(),
        mapping.start..mapping.end,
        bias,
        info,
    ))
}
#[cfg(test)]
mod tests {
    /// Snapshots are due at the counts with at most three significant
    /// bits: every one of the first 8, then 4 per doubling.
    #[test]
    fn snapshots_are_due_at_three_significant_bits() {
        let due: Vec<u64> = (1..=40)
            .filter(|&n| tracer_common::snapshot_due(n))
            .collect();
        assert_eq!(
            due,
            [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40]
        );
        assert!(!tracer_common::snapshot_due(0));
        // 1,000,000 counts: the first 8, 4 in each of the 16 doublings from
        // 8 to 2^19, and 3 of the next.
        let taken = (1..=1_000_000u64)
            .filter(|&n| tracer_common::snapshot_due(n))
            .count();
        assert_eq!(taken, 8 + 16 * 4 + 3);
    }
}
