//! Whole user stacks from stack snapshots (registers and a copy of the
//! stack the BPF side took), unwound with each module's call-frame
//! information: `.eh_frame` (with its `.eh_frame_hdr` index), or
//! `.debug_frame` from the module or its separate debug file. Code built
//! without frame pointers (most distribution builds of PHP, Apache,
//! glibc) unwinds as far as the copied window reaches; code without
//! call-frame information (Go) falls back to its frame pointers.
//!
//! Unwinding runs while the target lives (at each tick), so the modules are
//! the ones mapped when the snapshot was taken; only the frames are kept.
//! Rules given as DWARF expressions are evaluated within budgets first
//! ([`super::frame_rules`]): one that does not fit ends its stack.
use std::{
    collections::{HashMap, HashSet},
    ops::{Deref, Range},
    path::Path,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder,
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
};
use object::{Object, ObjectSection};
use tracer_common::{SnapshotHeader, StackKey};

use super::{
    dwarf::MAX_SECTION_BYTES,
    elf::Segment,
    frame_rules::{Budget, ExpressionRules, Registers, Table, TableKind},
};
use crate::{
    model::{PhpSnapshot, StackEnd, UnwoundStack},
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

/// A section's bytes: inside a mapped module file (no copy), or
/// decompressed.
#[derive(Clone)]
enum SectionBytes {
    Mapped {
        file: Arc<ModuleFile>,
        range: Range<usize>,
    },
    Owned(Arc<[u8]>),
}

impl Deref for SectionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            SectionBytes::Mapped { file, range } => file.bytes().get(range.clone()).unwrap_or(&[]),
            SectionBytes::Owned(bytes) => bytes,
        }
    }
}

pub(crate) struct StackUnwinder {
    pid: u32,
    store: ModuleStore,
    unwinder: UnwinderX86_64<SectionBytes>,
    cache: CacheX86_64,
    /// The modules' rules that are expressions, checked before framehop
    /// evaluates them.
    rules: ExpressionRules<SectionBytes>,
    /// Executable mappings given to the unwinder, by (start, end).
    added: HashSet<(u64, u64)>,
    /// Executable mappings at the last read of the maps, sorted.
    code: Vec<(u64, u64)>,
    maps_read: Option<Instant>,
    unwound: HashMap<StackKey, Vec<UnwoundStack>>,
}

impl StackUnwinder {
    pub(crate) fn new(target: &Target) -> StackUnwinder {
        let mut unwinder = StackUnwinder {
            pid: target.pid,
            store: target.modules.clone(),
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            rules: ExpressionRules::default(),
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
    pub(crate) fn add(&mut self, header: &SnapshotHeader, php: PhpSnapshot, stack: &[u8]) {
        let mut unwound = unwind_stack(
            (&self.unwinder, &mut self.cache, &mut self.rules),
            header,
            stack,
        );
        let uncovered = unwound.frames.iter().any(|&ip| !self.covers(ip));
        if uncovered && self.reread_maps() {
            unwound = unwind_stack(
                (&self.unwinder, &mut self.cache, &mut self.rules),
                header,
                stack,
            );
        }
        self.unwound
            .entry(header.key)
            .or_default()
            .push(UnwoundStack {
                count_at: header.count_at,
                frames: unwound.frames,
                php: php.frames,
                route: php.route,
                ended_by: unwound.ended_by,
            });
    }

    pub(crate) fn into_stacks(self) -> HashMap<StackKey, Vec<UnwoundStack>> {
        self.unwound
    }

    /// A copy of the stacks unwound so far (the live views, at each tick).
    pub(crate) fn stacks(&self) -> HashMap<StackKey, Vec<UnwoundStack>> {
        self.unwound.clone()
    }

    /// Drops the stacks of keys deleted from the maps (their counts start
    /// again, with snapshots of their own).
    pub(crate) fn forget(&mut self, keys: &[StackKey]) {
        for key in keys {
            self.unwound.remove(key);
        }
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
            let root = target::proc_root(self.pid);
            let Ok(file) = file else { continue };
            let modules = modules_for(mapping, file, (&self.store, &root), &mut self.rules);
            added += usize::from(!modules.is_empty());
            for module in modules {
                self.unwinder.add_module(module);
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
    fn take(&mut self, header: &SnapshotHeader, php: PhpSnapshot, stack: &[u8]) {
        self.add(header, php, stack);
    }
}

/// An unwinder the live views share with the snapshot reader: they read
/// its stacks at each tick while it goes on unwinding.
pub(crate) type SharedUnwinder = Arc<Mutex<StackUnwinder>>;

impl SnapshotSink for SharedUnwinder {
    fn take(&mut self, header: &SnapshotHeader, php: PhpSnapshot, stack: &[u8]) {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(header, php, stack);
    }
}

/// One snapshot's frames, and why they stop short when a frame's rule
/// could not be evaluated.
struct Unwound {
    frames: Vec<u64>,
    ended_by: Option<StackEnd>,
}

/// framehop's unwinder, its cache, and the rules to check before it
/// evaluates them.
type Unwinding<'a> = (
    &'a UnwinderX86_64<SectionBytes>,
    &'a mut CacheX86_64,
    &'a mut ExpressionRules<SectionBytes>,
);

/// The frames of one snapshot: its instruction pointer, then each return
/// address the unwinder finds inside the copied window. A snapshot taken
/// at a lock call's entry starts from the return address in its slot (the
/// lock function's own unwind information is not needed: musl has none).
/// A frame whose expression rules do not fit the budgets ends the stack
/// before framehop evaluates them.
fn unwind_stack(
    (unwinder, cache, rules): Unwinding,
    snapshot: &SnapshotHeader,
    stack: &[u8],
) -> Unwound {
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
    let mut budget = Budget::default();
    while frames.len() < MAX_FRAMES {
        let registers = Registers {
            ip: regs.ip(),
            sp: regs.sp(),
            bp: regs.bp(),
        };
        if let Err(end) = rules.check(address.address_for_lookup(), registers, &mut budget) {
            return Unwound {
                frames,
                ended_by: Some(end),
            };
        }
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
    Unwound {
        frames,
        ended_by: None,
    }
}

/// The unwinder's view of one executable mapping of an ELF file: where it
/// is loaded and its call-frame sections, as one module or, when part of
/// its code has CFI only in `.debug_frame`, as a few modules side by side
/// (see [`Tables`]); empty when the file has none of what is needed to
/// place it. `root` is the target's root directory, where its separate
/// debug files are looked for. The tables go to `rules` too.
fn modules_for(
    mapping: &Mapping,
    file: Arc<ModuleFile>,
    (store, root): (&ModuleStore, &Path),
    rules: &mut ExpressionRules<SectionBytes>,
) -> Vec<Module<SectionBytes>> {
    let Ok(elf) = file.elf() else {
        return Vec::new();
    };
    let Some(bias) = super::region::bias_of(mapping, &Segment::all(&elf)) else {
        return Vec::new();
    };
    let debug_file = || {
        let path = super::elf::debug_file_path(&elf, &mapping.path, Some(root))?;
        store.open(&path).ok()
    };
    let tables = Tables::of(&file, &elf, debug_file);
    let svma_of = |name: &str| {
        elf.section_by_name(name)
            .map(|section| section.address()..section.address() + section.size())
    };
    let info = |debug_frame: bool| {
        let eh_frame = if debug_frame {
            None
        } else {
            tables.eh_frame.clone()
        };
        let eh_frame_hdr = if debug_frame {
            None
        } else {
            tables.eh_frame_hdr.clone()
        };
        ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: svma_of(".text"),
            text: section_bytes(&file, &elf, ".text"),
            got_svma: svma_of(".got"),
            eh_frame_svma: eh_frame.as_ref().and_then(|_| svma_of(".eh_frame")),
            eh_frame,
            eh_frame_hdr_svma: eh_frame_hdr.as_ref().and_then(|_| svma_of(".eh_frame_hdr")),
            eh_frame_hdr,
            stubs_svma: None,
            stub_helper_svma: None,
            unwind_info: None,
            debug_frame: if debug_frame {
                tables.debug_frame.clone()
            } else {
                None
            },
            text_segment_svma: None,
            text_segment: None,
        }
    };
    let pieces = tables.pieces(mapping.start..mapping.end, bias);
    let avma = mapping.start..mapping.end;
    add_rules(rules, &elf, &tables, &pieces, (avma, bias));
    pieces
        .into_iter()
        .map(|(range, debug_frame)| {
            Module::new(mapping.path.clone(), range, bias, info(debug_frame))
        })
        .collect()
}

/// Gives `rules` the tables framehop reads for `pieces` (true: with
/// `.debug_frame`), with the base addresses it reads them with.
fn add_rules(
    rules: &mut ExpressionRules<SectionBytes>,
    elf: &object::File,
    tables: &Tables,
    pieces: &[(Range<u64>, bool)],
    (avma, bias): (Range<u64>, u64),
) {
    let given = [
        (
            TableKind::EhFrame,
            &tables.eh_frame,
            tables.eh_frame_hdr.as_deref(),
        ),
        (TableKind::DebugFrame, &tables.debug_frame, None),
    ];
    for (kind, bytes, hdr) in given {
        let debug_frame = kind == TableKind::DebugFrame;
        if let Some(bytes) = bytes.clone()
            && pieces.iter().any(|&(_, debug)| debug == debug_frame)
        {
            let bases = section_bases(elf, !debug_frame);
            rules.add(Table { bytes, kind, bases }, hdr, avma.clone(), bias);
        }
    }
}

/// The base addresses framehop reads a module's tables with: those of
/// `.text` and `.got`, and with `.eh_frame`, its own and `.eh_frame_hdr`'s.
fn section_bases(elf: &object::File, eh_frame: bool) -> gimli::BaseAddresses {
    let address = |name: &str| elf.section_by_name(name).map_or(0, |s| s.address());
    let bases = gimli::BaseAddresses::default()
        .set_text(address(".text"))
        .set_got(address(".got"));
    if eh_frame {
        bases
            .set_eh_frame(address(".eh_frame"))
            .set_eh_frame_hdr(address(".eh_frame_hdr"))
    } else {
        bases
    }
}

/// Most pieces a mapping is split into; past it, the table that covers
/// more code is used for the whole mapping.
const MAX_PIECES: usize = 64;

/// A module's call-frame tables. framehop reads one table per module
/// (`.eh_frame` when it is given), so code whose CFI is only in
/// `.debug_frame` (the module's own, or its separate debug file's: same
/// addresses, so the same load bias) is given to it as modules of its own
/// over those addresses, and the rest of the mapping as modules with
/// `.eh_frame`. A program built with `-fno-asynchronous-unwind-tables`
/// keeps only the C runtime's `_start` and PLT in `.eh_frame`, all its own
/// functions in `.debug_frame`.
struct Tables {
    eh_frame: Option<SectionBytes>,
    eh_frame_hdr: Option<SectionBytes>,
    debug_frame: Option<SectionBytes>,
    /// Link-time address ranges, sorted, that only `.debug_frame` covers.
    debug_only: Vec<Range<u64>>,
}

impl Tables {
    /// The module's tables. The debug file is looked for (and a
    /// `.gnu_debuglink` one checksummed) only when the module's own
    /// tables leave most of its `.text` uncovered. Go modules keep their
    /// frame-pointer walk: their `.debug_frame` does not say where the
    /// caller's frame pointer is.
    fn of(
        file: &Arc<ModuleFile>,
        elf: &object::File,
        debug_file: impl FnOnce() -> Option<Arc<ModuleFile>>,
    ) -> Tables {
        let eh_ranges = eh_frame_ranges(file, elf);
        let mut tables = Tables {
            eh_frame: section_bytes(file, elf, ".eh_frame"),
            eh_frame_hdr: section_bytes(file, elf, ".eh_frame_hdr"),
            debug_frame: None,
            debug_only: Vec::new(),
        };
        if elf.section_by_name(".gopclntab").is_some() {
            return tables;
        }
        let text = elf.section_by_name(".text").map_or(0, |text| text.size());
        let own =
            debug_frame_of(file, elf).map(|(bytes, ranges)| (bytes, only_in(&ranges, &eh_ranges)));
        let covered = |runs: &[Range<u64>]| runs.iter().map(|r| r.end - r.start).sum::<u64>();
        let own_covered = own.as_ref().map_or(0, |(_, runs)| covered(runs));
        let found = if covered(&eh_ranges) + own_covered < text / 2
            && let Some(debug) = debug_file()
            && let Ok(debug_elf) = debug.elf()
            && let Some((bytes, ranges)) = debug_frame_of(&debug, &debug_elf)
            && covered(&only_in(&ranges, &eh_ranges)) > own_covered
        {
            Some((bytes, only_in(&ranges, &eh_ranges)))
        } else {
            own
        };
        if let Some((bytes, runs)) = found.filter(|(_, runs)| !runs.is_empty()) {
            tables.debug_frame = Some(bytes);
            tables.debug_only = runs;
        }
        tables
    }

    /// The mapping `avma` split into address ranges, each with true when
    /// it is unwound with `.debug_frame`.
    fn pieces(&self, avma: Range<u64>, bias: u64) -> Vec<(Range<u64>, bool)> {
        if self.debug_only.is_empty() {
            return vec![(avma, false)];
        }
        if self.eh_frame.is_none() || self.debug_only.len() > MAX_PIECES {
            let debug: u64 = self.debug_only.iter().map(|r| r.end - r.start).sum();
            let whole_debug = self.eh_frame.is_none() || debug > (avma.end - avma.start) / 2;
            return vec![(avma, whole_debug)];
        }
        let mut pieces = Vec::new();
        let mut at = avma.start;
        for run in &self.debug_only {
            let start = run.start.wrapping_add(bias).clamp(avma.start, avma.end);
            let end = run.end.wrapping_add(bias).clamp(avma.start, avma.end);
            if start >= end || start < at {
                continue;
            }
            if at < start {
                pieces.push((at..start, false));
            }
            pieces.push((start..end, true));
            at = end;
        }
        if at < avma.end {
            pieces.push((at..avma.end, false));
        }
        pieces
    }
}

/// The link-time address ranges of `.eh_frame`'s FDEs, sorted (none
/// without one).
fn eh_frame_ranges(file: &Arc<ModuleFile>, elf: &object::File) -> Vec<Range<u64>> {
    let Some(bytes) = section_bytes(file, elf, ".eh_frame") else {
        return Vec::new();
    };
    let mut eh_frame = gimli::EhFrame::new(&bytes, gimli::LittleEndian);
    eh_frame.set_address_size(8);
    fde_ranges(&eh_frame, &section_bases(elf, true))
}

/// A file's `.debug_frame` and its FDEs' address ranges, sorted; None
/// without one, or when it has no FDE.
fn debug_frame_of(
    file: &Arc<ModuleFile>,
    elf: &object::File,
) -> Option<(SectionBytes, Vec<Range<u64>>)> {
    let bytes = section_bytes(file, elf, ".debug_frame")?;
    let mut debug_frame = gimli::DebugFrame::new(&bytes, gimli::LittleEndian);
    debug_frame.set_address_size(8);
    let ranges = fde_ranges(&debug_frame, &gimli::BaseAddresses::default());
    (!ranges.is_empty()).then_some((bytes, ranges))
}

/// The address ranges of a call-frame table's FDEs (those that parse),
/// sorted.
fn fde_ranges<'a, S>(section: &S, bases: &gimli::BaseAddresses) -> Vec<Range<u64>>
where
    S: gimli::UnwindSection<gimli::EndianSlice<'a, gimli::LittleEndian>>,
{
    let mut ranges = Vec::new();
    let mut entries = section.entries(bases);
    while let Ok(Some(entry)) = entries.next() {
        if let gimli::CieOrFde::Fde(partial) = entry
            && let Ok(fde) =
                partial.parse(|section, bases, offset| section.cie_from_offset(bases, offset))
            && fde.len() > 0
        {
            ranges.push(fde.initial_address()..fde.end_address());
        }
    }
    ranges.sort_unstable_by_key(|range| range.start);
    ranges
}

/// The runs of `debug` (sorted FDE ranges) that no range of `eh` (sorted)
/// overlaps, neighbours merged across the gap between them (padding) when
/// no `eh` range lies in it.
fn only_in(debug: &[Range<u64>], eh: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut merged: Vec<Range<u64>> = Vec::new();
    for range in eh {
        match merged.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => merged.push(range.clone()),
        }
    }
    // Disjoint and sorted: only the last one starting before `end` can
    // reach past `start`.
    let overlaps = |start: u64, end: u64| {
        let after = merged.partition_point(|e| e.start < end);
        after > 0 && merged[after - 1].end > start
    };
    let mut runs: Vec<Range<u64>> = Vec::new();
    for range in debug.iter().filter(|r| !overlaps(r.start, r.end)) {
        match runs.last_mut() {
            Some(run) if range.start <= run.end || !overlaps(run.end, range.start) => {
                run.end = run.end.max(range.end);
            }
            _ => runs.push(range.clone()),
        }
    }
    runs
}

/// A section's bytes: the mapped file's own when stored plainly, a
/// decompressed copy (within [`MAX_SECTION_BYTES`]) when compressed, as
/// debug files often are.
fn section_bytes(file: &Arc<ModuleFile>, elf: &object::File, name: &str) -> Option<SectionBytes> {
    let section = elf.section_by_name(name)?;
    let range = section.compressed_file_range().ok()?;
    if range.format == object::CompressionFormat::None {
        let start = usize::try_from(range.offset).ok()?;
        let end = start.checked_add(usize::try_from(range.compressed_size).ok()?)?;
        return (end <= file.bytes().len()).then(|| SectionBytes::Mapped {
            file: Arc::clone(file),
            range: start..end,
        });
    }
    if range.uncompressed_size > MAX_SECTION_BYTES {
        return None;
    }
    let data = section.uncompressed_data().ok()?;
    Some(SectionBytes::Owned(Arc::from(&*data)))
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

    use std::{
        ops::Range,
        path::Path,
        process::Command,
        sync::Arc,
        time::{Duration, Instant},
    };

    use object::{Object, ObjectSegment};

    use super::*;
    use crate::naming::dwarf::tests::{compile_c_with, symbol_address};

    const SOURCE: &str = r#"
__attribute__((noinline)) long leaf(long x) { return x * 3; }
__attribute__((noinline)) long middle(long x) { return leaf(x) + 1; }
int main(int argc, char **argv) { return (int)middle(argc); }
"#;

    /// Flags that leave the program's own functions without `.eh_frame`
    /// (their CFI goes to `.debug_frame`; the C runtime's stays).
    const NO_EH_FRAME: [&str; 3] = [
        "-fno-asynchronous-unwind-tables",
        "-fno-unwind-tables",
        "-fomit-frame-pointer",
    ];

    fn mapped(dir: &Path, name: &str, bytes: &[u8]) -> Arc<ModuleFile> {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        Arc::new(ModuleFile::open(&path).unwrap())
    }

    fn objcopy(args: &[&str], dir: &Path) {
        let status = Command::new("objcopy")
            .args(args)
            .current_dir(dir)
            .status()
            .expect("objcopy (binutils)");
        assert!(status.success(), "objcopy {args:?}");
    }

    /// What [`Tables::of`] gives `.debug_frame`: "none", "debug_frame"
    /// (mapped) or "debug_frame (decompressed)"; when it gives one, its
    /// runs must cover `leaf`, `middle` and `main` and not `_start`.
    fn chosen(file: &Arc<ModuleFile>, debug: Option<Arc<ModuleFile>>) -> &'static str {
        let elf = file.elf().unwrap();
        let tables = Tables::of(file, &elf, || debug);
        let covered = |name: &str| {
            let at = symbol_address(file.bytes(), name);
            tables.debug_only.iter().any(|run| run.contains(&at))
        };
        match &tables.debug_frame {
            None => return "none",
            Some(_) => {
                assert!(covered("leaf") && covered("middle") && covered("main"));
                assert!(!covered("_start"), "{:x?}", tables.debug_only);
            }
        }
        match tables.debug_frame {
            Some(SectionBytes::Mapped { .. }) => "debug_frame",
            _ => "debug_frame (decompressed)",
        }
    }

    /// Runs of `.debug_frame` ranges that `.eh_frame` leaves uncovered,
    /// merged across gaps without `.eh_frame` code.
    #[test]
    fn debug_only_runs_skip_what_eh_frame_covers() {
        let debug = [0..10, 12..20, 30..40, 45..50, 60..70];
        let eh = [20..30, 48..49, 100..110];
        assert_eq!(only_in(&debug, &eh), [0..20, 30..40, 60..70]);
        assert_eq!(only_in(&debug, &[]), vec![Range { start: 0, end: 70 }]);
        assert_eq!(only_in(&[], &eh), []);
    }

    /// The two mapping splits: whole, and pieces around the runs.
    #[test]
    fn mappings_split_around_debug_frame_runs() {
        let tables = |eh: bool, runs: Vec<Range<u64>>| Tables {
            eh_frame: eh.then(|| SectionBytes::Owned(Arc::from(&[][..]))),
            eh_frame_hdr: None,
            debug_frame: Some(SectionBytes::Owned(Arc::from(&[][..]))),
            debug_only: runs,
        };
        let bias = 0x1000;
        assert_eq!(
            tables(true, vec![0x100..0x200, 0x300..0x400]).pieces(0x1000..0x2000, bias),
            [
                (0x1000..0x1100, false),
                (0x1100..0x1200, true),
                (0x1200..0x1300, false),
                (0x1300..0x1400, true),
                (0x1400..0x2000, false),
            ]
        );
        assert_eq!(
            tables(true, vec![]).pieces(0x1000..0x2000, bias),
            [(0x1000..0x2000, false)]
        );
        assert_eq!(
            tables(
                false,
                vec![Range {
                    start: 0x100,
                    end: 0x200
                }]
            )
            .pieces(0x1000..0x2000, bias),
            [(0x1000..0x2000, true)]
        );
    }

    #[test]
    fn eh_frame_is_used_when_it_covers_the_code() {
        let dir = tempfile::tempdir().unwrap();
        let file = mapped(dir.path(), "t", &compile_c_with(SOURCE, &["-O1"]));
        assert_eq!(chosen(&file, None), "none");
    }

    /// `.eh_frame` holds only the C runtime's entries: the module's own
    /// `.debug_frame`, or its debug file's once stripped, is used instead,
    /// decompressed when the debug file's sections are compressed.
    #[test]
    fn debug_frame_is_used_from_the_module_or_its_debug_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut flags = vec!["-O1"];
        flags.extend(NO_EH_FRAME);
        let file = mapped(dir.path(), "t", &compile_c_with(SOURCE, &flags));
        assert_eq!(chosen(&file, None), "debug_frame");
        objcopy(&["--only-keep-debug", "t", "t.debug"], dir.path());
        objcopy(&["--strip-debug", "t", "t.stripped"], dir.path());
        objcopy(
            &["--compress-debug-sections=zlib", "t.debug", "t.debug.z"],
            dir.path(),
        );
        let open = |name: &str| Arc::new(ModuleFile::open(&dir.path().join(name)).unwrap());
        let stripped = open("t.stripped");
        assert_eq!(chosen(&stripped, None), "none");
        assert_eq!(chosen(&stripped, Some(open("t.debug"))), "debug_frame");
        assert_eq!(
            chosen(&stripped, Some(open("t.debug.z"))),
            "debug_frame (decompressed)"
        );
    }

    /// `fixtures/loop_cfi.c`'s `poisoned` gives its CFA by `DW_OP_skip -3`,
    /// a loop: a stack whose caller frame is inside it ends there with the
    /// expression budget as its reason, at once (framehop alone never
    /// returned); one whose caller is `main` unwinds as before.
    #[test]
    fn a_frame_whose_rule_loops_ends_its_stack() {
        let dir = tempfile::tempdir().unwrap();
        let source = include_str!("../../../fixtures/loop_cfi.c");
        let file = mapped(dir.path(), "t", &compile_c_with(source, &["-O2"]));
        let bias = 0x5555_0000_0000;
        let code = file
            .elf()
            .unwrap()
            .segments()
            .find(|segment| segment.flags() == object::SegmentFlags::Elf { p_flags: 5 })
            .map(|segment| segment.file_range())
            .unwrap();
        let mapping = Mapping {
            start: bias + code.0,
            end: bias + code.0 + code.1,
            perms: "r-xp".into(),
            offset: code.0,
            path: dir.path().join("t").display().to_string(),
        };
        let mut unwinder = UnwinderX86_64::new();
        let mut rules = ExpressionRules::default();
        let store = ModuleStore::default();
        let modules = modules_for(
            &mapping,
            Arc::clone(&file),
            (&store, Path::new("/")),
            &mut rules,
        );
        assert!(!modules.is_empty());
        for module in modules {
            unwinder.add_module(module);
        }
        let mut cache = CacheX86_64::new();
        let sp = 0x7ffc_0000_0000;
        let unwind_from = |caller: &str| {
            let return_ip = bias + symbol_address(file.bytes(), caller) + 0x10;
            let header = SnapshotHeader {
                ip: 0x7f00_0000_1000,
                sp,
                return_slot: sp,
                len: 64,
                ..SnapshotHeader::default()
            };
            let mut stack = return_ip.to_le_bytes().to_vec();
            stack.resize(64, 0);
            (header, stack, return_ip)
        };
        let (header, stack, return_ip) = unwind_from("poisoned");
        let started = Instant::now();
        let unwound = unwind_stack((&unwinder, &mut cache, &mut rules), &header, &stack);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(unwound.frames, [header.ip, return_ip]);
        assert_eq!(unwound.ended_by, Some(StackEnd::ExpressionBudget));
        let (header, stack, return_ip) = unwind_from("main");
        let unwound = unwind_stack((&unwinder, &mut cache, &mut rules), &header, &stack);
        assert_eq!(unwound.frames[..2], [header.ip, return_ip]);
        assert_eq!(unwound.ended_by, None);
    }
}
