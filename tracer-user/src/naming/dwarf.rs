//! Variables and types from a module's DWARF (`.debug_info`, in the module
//! or its separate debug file), to name a lock by the fields that hold it:
//! `g_registry.locks[2]`, `g_global_stats->LOCK_access`.
//!
//! One pass over the DIEs keeps only the variables that have a static
//! address (with their unit and type reference); types are read on demand,
//! a few DIEs per name. Parsed modules are cached in-process by file
//! identity, so naming during the recording does not read them again.
//! Hostile input never panics: every read is a `Result`, type walks are
//! bounded in steps, and the first pass in DIEs.
use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use gimli::{AttributeValue, Reader as _, UnitOffset, constants as dw};

use crate::model::{SkipReason, SkippedFile};
use crate::probe::modules::{FileIdentity, ModuleFile};
use object::{Object, ObjectSection};

type Reader = gimli::EndianArcSlice<gimli::RunTimeEndian>;

/// DIEs read by the first pass at most (a hostile or gigantic file stops here).
const MAX_ENTRIES: usize = 50_000_000;
/// Steps through one type (typedefs, members, array levels) at most.
const MAX_TYPE_STEPS: usize = 64;
/// Members of one struct or union read at most.
const MAX_MEMBERS: usize = 4096;

/// A type DIE: the unit it is in and its offset there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TypeRef {
    unit: usize,
    offset: UnitOffset<usize>,
}

/// A variable with a static address.
#[derive(Debug, Clone)]
pub(crate) struct Variable {
    /// Link-time address.
    pub address: u64,
    pub name: String,
    pub type_ref: Option<TypeRef>,
}

/// A variable whose type reference may point into a unit not read yet.
struct PendingVariable {
    address: u64,
    name: String,
    unit: usize,
    type_value: Option<AttributeValue<Reader>>,
}

/// The DWARF of one module, ready for lookups.
pub struct DebugInfo {
    dwarf: gimli::Dwarf<Reader>,
    units: Vec<gimli::Unit<Reader>>,
    /// Skeleton units of split DWARF (their DIEs are in .dwo files).
    split_units: usize,
    /// .debug_info offset of each unit (ascending), to resolve cross-unit references.
    unit_starts: Vec<usize>,
    /// Sorted by address.
    variables: Vec<Variable>,
    /// How long the first pass took.
    pub parse_time: Duration,
}

/// What a described position should end on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// A pointer slot (an intermediate hop of a chain): descend to the pointer member.
    Pointer,
    /// A lock of `span` bytes: stop at the member that is the lock.
    Lock { span: u64 },
}

/// A position inside a typed object, as fields: `.plugin_header.plugin_stats`, `[2]`, `+0x4`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldPath {
    /// `.a.b[2]`, possibly ending in `+0xN` when the offset is inside no field.
    pub text: String,
    /// Components named (fields and indices).
    pub fields: usize,
    /// For [`Want::Pointer`]: the type the pointer slot points to, when known.
    pub pointee: Option<TypeRef>,
    /// Whether the slot is typed as a pointer.
    pub is_pointer: bool,
    /// The type of each level walked, outermost first, the position's own
    /// last (`_gil_runtime_state`, `pthread_cond_t`); None for unnamed ones.
    pub types: Vec<Option<String>>,
}

/// The concrete shape of a type after typedefs and qualifiers.
enum Shape {
    Pointer(Option<TypeRef>),
    Aggregate {
        members: Vec<Member>,
        union: bool,
    },
    Array {
        element: TypeRef,
        count: Option<u64>,
    },
    Other,
}

struct Member {
    name: Option<String>,
    offset: u64,
    type_ref: TypeRef,
}

struct TypeView {
    shape: Shape,
    size: Option<u64>,
    /// Typedef, struct and base names met on the way (`pthread_mutex_t`).
    names: Vec<String>,
}

/// Parsed modules by file identity (device, inode, size, mtime).
type CacheKey = FileIdentity;
static CACHE: OnceLock<Mutex<HashMap<CacheKey, Option<Arc<DebugInfo>>>>> = OnceLock::new();

/// The DWARF of the file at `path`, parsed once per process; None when it
/// has no `.debug_info` or cannot be read.
pub(crate) fn load_cached(path: &Path) -> Option<Arc<DebugInfo>> {
    let file = ModuleFile::open(path).ok()?;
    load_module(&file)
}

/// One DWARF section decompressed at most (a 1 MB zlib section may claim 1 GiB).
pub(crate) const MAX_SECTION_BYTES: u64 = 512 << 20;
/// All DWARF sections of one file at most, decompressed.
pub(crate) const MAX_DWARF_BYTES: u64 = 1 << 30;

/// Why a file's DWARF was not read, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DwarfSkip {
    /// A section would decompress past [`MAX_SECTION_BYTES`].
    SectionTooLarge { section: String, bytes: u64 },
    /// All sections together would pass [`MAX_DWARF_BYTES`].
    TooLarge { bytes: u64 },
    /// A compressed section did not decompress to its stated size.
    Corrupt { section: String },
}

impl std::fmt::Display for DwarfSkip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const MIB: u64 = 1 << 20;
        match self {
            DwarfSkip::SectionTooLarge { section, bytes } => write!(
                f,
                "{section} decompresses to {} MiB, over the {} MiB cap",
                bytes / MIB,
                MAX_SECTION_BYTES / MIB
            ),
            DwarfSkip::TooLarge { bytes } => write!(
                f,
                "its DWARF decompresses to {} MiB, over the {} MiB cap",
                bytes / MIB,
                MAX_DWARF_BYTES / MIB
            ),
            DwarfSkip::Corrupt { section } => write!(f, "{section} does not decompress"),
        }
    }
}

impl DwarfSkip {
    fn reason(&self) -> SkipReason {
        match self {
            DwarfSkip::Corrupt { .. } => SkipReason::DwarfCorrupt,
            _ => SkipReason::DwarfTooLarge,
        }
    }
}

/// Files whose DWARF was skipped or only partly read, this process.
static SKIPPED: Mutex<Vec<SkippedFile>> = Mutex::new(Vec::new());

/// Every file whose DWARF was skipped so far, with why.
pub(crate) fn skipped() -> Vec<SkippedFile> {
    SKIPPED.lock().map(|s| s.clone()).unwrap_or_default()
}

fn note_skipped(file: &ModuleFile, reason: SkipReason, detail: String) {
    if let Ok(mut skipped) = SKIPPED.lock() {
        skipped.push(SkippedFile {
            file: file.shown().to_string(),
            reason,
            detail,
        });
    }
}

/// Files whose DWARF was parsed so far, this process, and how long each
/// parse took: a one-off per file, which the agent says as it comes.
static PARSED: Mutex<Vec<(String, Duration)>> = Mutex::new(Vec::new());

/// Every file whose DWARF was parsed so far (or tried), in order, with the
/// time it took.
pub(crate) fn parsed() -> Vec<(String, Duration)> {
    PARSED.lock().map(|p| p.clone()).unwrap_or_default()
}

/// The file behind a /proc/PID/map_files/ path (the path itself where the
/// link cannot be read), for messages.
fn real_path(shown: &str) -> String {
    match shown.contains("/map_files/") {
        true => std::fs::read_link(shown)
            .map(|path| path.display().to_string())
            .unwrap_or_else(|_| shown.to_string()),
        false => shown.to_string(),
    }
}

/// The DWARF of a mapped module file, parsed once per process.
pub fn load_module(file: &ModuleFile) -> Option<Arc<DebugInfo>> {
    let key = file.identity();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(found) = cache.lock().ok()?.get(&key) {
        return found.clone();
    }
    let started = Instant::now();
    let parsed = DebugInfo::parse_bounded(file.bytes());
    // A file without DWARF costs nothing to look at: not said.
    if let (Ok(Some(_)) | Err(_), Ok(mut done)) = (&parsed, PARSED.lock()) {
        done.push((real_path(file.shown()), started.elapsed()));
    }
    let parsed = match parsed {
        Ok(parsed) => parsed.map(Arc::new),
        Err(skip) => {
            note_skipped(file, skip.reason(), skip.to_string());
            None
        }
    };
    if let Some(info) = parsed.as_ref().filter(|info| info.split_units > 0) {
        let detail = format!(
            "{} units keep their DWARF in .dwo files; build without -gsplit-dwarf to name their fields",
            info.split_units
        );
        note_skipped(file, SkipReason::SplitDwarf, detail);
    }
    cache.lock().ok()?.insert(key, parsed.clone());
    parsed
}

/// The DWARF sections of `elf`, each decompressed once into the buffer the
/// reader keeps (no second copy), within the caps.
fn dwarf_sections(elf: &object::File) -> Result<HashMap<gimli::SectionId, Arc<[u8]>>, DwarfSkip> {
    use gimli::SectionId::*;
    let ids = [
        DebugAbbrev,
        DebugAddr,
        DebugAranges,
        DebugInfo,
        DebugLine,
        DebugLineStr,
        DebugLoc,
        DebugLocLists,
        DebugRanges,
        DebugRngLists,
        DebugStr,
        DebugStrOffsets,
        DebugTypes,
    ];
    let mut total = 0u64;
    let mut sections = HashMap::new();
    for id in ids {
        let Some(section) = elf.section_by_name(id.name()) else {
            continue;
        };
        let name = id.name().to_string();
        let Ok(range) = section.compressed_file_range() else {
            return Err(DwarfSkip::Corrupt { section: name });
        };
        let bytes = range.uncompressed_size;
        if bytes > MAX_SECTION_BYTES {
            return Err(DwarfSkip::SectionTooLarge {
                section: name,
                bytes,
            });
        }
        total += bytes;
        if total > MAX_DWARF_BYTES {
            return Err(DwarfSkip::TooLarge { bytes: total });
        }
        let data = match range.format {
            object::CompressionFormat::Zlib => {
                let compressed = section.compressed_data().ok().map(|c| c.data);
                compressed.and_then(|input| inflate_into_arc(input, bytes as usize))
            }
            _ => section
                .uncompressed_data()
                .ok()
                .map(|data| Arc::from(&*data)),
        };
        let Some(data) = data else {
            return Err(DwarfSkip::Corrupt { section: name });
        };
        sections.insert(id, data);
    }
    Ok(sections)
}

/// zlib `input` inflated straight into a shared buffer of `size` bytes;
/// None unless it fills it exactly.
fn inflate_into_arc(input: &[u8], size: usize) -> Option<Arc<[u8]>> {
    // SAFETY: zeroed bytes are valid u8s (the allocation is lazily zeroed).
    let mut buffer: Arc<[u8]> = unsafe { Arc::<[u8]>::new_zeroed_slice(size).assume_init() };
    let mut inflater = flate2::Decompress::new(true);
    let status = inflater
        .decompress(
            input,
            Arc::get_mut(&mut buffer)?,
            flate2::FlushDecompress::Finish,
        )
        .ok()?;
    (status == flate2::Status::StreamEnd && inflater.total_out() == size as u64).then_some(buffer)
}

impl DebugInfo {
    #[cfg(test)]
    /// Parses the DWARF of an ELF file's bytes; None without `.debug_info`
    /// or when it is over the caps (see [`DebugInfo::parse_bounded`]).
    pub(crate) fn parse(data: &[u8]) -> Option<DebugInfo> {
        DebugInfo::parse_bounded(data).ok().flatten()
    }

    /// Parses the DWARF of an ELF file's bytes: Ok(None) without
    /// `.debug_info`, Err with the reason when it is skipped.
    pub(crate) fn parse_bounded(data: &[u8]) -> Result<Option<DebugInfo>, DwarfSkip> {
        let started = Instant::now();
        let Ok(elf) = object::File::parse(data) else {
            return Ok(None);
        };
        if elf.section_by_name(".debug_info").is_none() {
            return Ok(None);
        }
        let endian = if elf.is_little_endian() {
            gimli::RunTimeEndian::Little
        } else {
            gimli::RunTimeEndian::Big
        };
        let mut sections = dwarf_sections(&elf)?;
        let load = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
            let bytes = sections.remove(&id).unwrap_or_else(|| Arc::from(&[][..]));
            Ok(Reader::new(bytes, endian))
        };
        let Ok(dwarf) = gimli::Dwarf::load(load) else {
            return Ok(None);
        };
        let mut info = DebugInfo {
            dwarf,
            units: Vec::new(),
            unit_starts: Vec::new(),
            variables: Vec::new(),
            parse_time: Duration::ZERO,
            split_units: 0,
        };
        let mut headers = info.dwarf.units();
        let mut entries = 0usize;
        let mut pending = Vec::new();
        while let Ok(Some(header)) = headers.next() {
            let start = header.offset().0;
            let Ok(unit) = info.dwarf.unit(header) else {
                continue;
            };
            // A skeleton unit: its variables are in a .dwo file not read here.
            if unit.dwo_id.is_some() {
                info.split_units += 1;
            }
            let index = info.units.len();
            entries += collect_variables(&info.dwarf, &unit, index, &mut pending);
            info.units.push(unit);
            info.unit_starts.push(start);
            if entries > MAX_ENTRIES {
                break;
            }
        }
        info.variables = pending
            .into_iter()
            .map(|variable| Variable {
                address: variable.address,
                type_ref: variable
                    .type_value
                    .and_then(|value| info.reference(variable.unit, value)),
                name: variable.name,
            })
            .collect();
        info.variables.sort_by_key(|v| v.address);
        info.parse_time = started.elapsed();
        Ok(Some(info))
    }

    pub(crate) fn variable_count(&self) -> usize {
        self.variables.len()
    }

    /// The variable whose bytes hold the link-time `address`, and the offset into it.
    pub(crate) fn variable_at(&self, address: u64) -> Option<(&Variable, u64)> {
        let end = self.variables.partition_point(|v| v.address <= address);
        self.variables[..end]
            .iter()
            .rev()
            .take(8)
            .find_map(|variable| {
                let offset = address - variable.address;
                let size = variable.type_ref.and_then(|t| self.size_of(t));
                let inside = match size {
                    Some(size) => offset < size,
                    None => offset == 0,
                };
                inside.then_some((variable, offset))
            })
    }

    /// Whether a variable's whole value is a pointer.
    pub(crate) fn is_pointer(&self, type_ref: Option<TypeRef>) -> bool {
        type_ref
            .and_then(|t| self.view(t))
            .is_some_and(|view| matches!(view.shape, Shape::Pointer(_)))
    }

    /// Names the position `offset` inside an object of type `type_ref`.
    pub(crate) fn describe(&self, type_ref: TypeRef, offset: u64, want: Want) -> FieldPath {
        let mut path = FieldPath::default();
        let mut current = type_ref;
        let mut offset = offset;
        for _ in 0..MAX_TYPE_STEPS {
            let Some(view) = self.view(current) else {
                break;
            };
            path.types.push(view.names.first().cloned());
            let lock_like = view.names.iter().any(|name| looks_like_lock(name));
            match want {
                Want::Pointer if offset == 0 => {
                    if let Shape::Pointer(pointee) = view.shape {
                        path.pointee = pointee;
                        path.is_pointer = true;
                        return path;
                    }
                }
                Want::Lock { span } => {
                    if lock_like || (offset == 0 && view.size.is_some_and(|size| size <= span)) {
                        break;
                    }
                }
                Want::Pointer => {}
            }
            match view.shape {
                Shape::Aggregate { members, union } => {
                    let Some(member) = self.member_at(&members, offset, union, want) else {
                        break;
                    };
                    if let Some(name) = &member.name {
                        path.text.push('.');
                        path.text.push_str(name);
                        path.fields += 1;
                    }
                    offset -= member.offset;
                    current = member.type_ref;
                }
                Shape::Array { element, count } => {
                    let Some(size) = self.size_of(element).filter(|&s| s > 0) else {
                        break;
                    };
                    let index = offset / size;
                    if count.is_some_and(|count| index >= count) {
                        break;
                    }
                    path.text.push_str(&format!("[{index}]"));
                    path.fields += 1;
                    offset -= index * size;
                    current = element;
                }
                Shape::Pointer(_) | Shape::Other => break,
            }
        }
        if offset != 0 {
            path.text.push_str(&format!("+{offset:#x}"));
        }
        path
    }

    /// The member holding `offset`: in a union, a pointer member for a
    /// pointer slot and a lock-like one for a lock, else the first that fits.
    fn member_at<'m>(
        &self,
        members: &'m [Member],
        offset: u64,
        union: bool,
        want: Want,
    ) -> Option<&'m Member> {
        let fits = |member: &&Member| {
            offset >= member.offset
                && match self.size_of(member.type_ref) {
                    Some(size) => offset - member.offset < size,
                    None => offset == member.offset,
                }
        };
        let candidates: Vec<&Member> = members.iter().filter(fits).collect();
        if union {
            let preferred = candidates.iter().find(|member| {
                let Some(view) = self.view(member.type_ref) else {
                    return false;
                };
                match want {
                    Want::Pointer => matches!(view.shape, Shape::Pointer(_)),
                    Want::Lock { .. } => view.names.iter().any(|n| looks_like_lock(n)),
                }
            });
            if let Some(member) = preferred {
                return Some(member);
            }
        }
        // In a struct, the last that fits (zero-sized members come before real ones).
        if union {
            candidates.first().copied()
        } else {
            candidates.last().copied()
        }
    }

    /// The first complete struct or union named `name` (a declaration
    /// only is skipped), searched unit by unit.
    pub(crate) fn aggregate_named(&self, name: &str) -> Option<TypeRef> {
        for (index, unit) in self.units.iter().enumerate() {
            let mut entries = unit.entries();
            while let Ok(Some(entry)) = entries.next_dfs() {
                let aggregate = matches!(
                    entry.tag(),
                    dw::DW_TAG_structure_type | dw::DW_TAG_union_type
                );
                if aggregate
                    && entry.attr(dw::DW_AT_declaration).is_none()
                    && self.name_of(unit, entry).as_deref() == Some(name)
                {
                    return Some(TypeRef {
                        unit: index,
                        offset: entry.offset(),
                    });
                }
            }
        }
        None
    }

    /// The byte offset of the member at `path` (`["request_info",
    /// "request_uri"]`) in `type_ref`, through typedefs and into anonymous
    /// members; None when a name is not found.
    pub(crate) fn member_offset(&self, type_ref: TypeRef, path: &[&str]) -> Option<u64> {
        let mut current = type_ref;
        let mut offset = 0u64;
        for name in path {
            let (member_offset, member_type) = self.find_member(current, name, 0)?;
            offset = offset.checked_add(member_offset)?;
            current = member_type;
        }
        Some(offset)
    }

    /// A member named `name` of an aggregate, looking into its anonymous
    /// members (a few levels deep) when it is not a direct one.
    fn find_member(&self, type_ref: TypeRef, name: &str, depth: usize) -> Option<(u64, TypeRef)> {
        let Shape::Aggregate { members, .. } = self.view(type_ref)?.shape else {
            return None;
        };
        if let Some(member) = members.iter().find(|m| m.name.as_deref() == Some(name)) {
            return Some((member.offset, member.type_ref));
        }
        if depth >= 4 {
            return None;
        }
        members
            .iter()
            .filter(|member| member.name.is_none())
            .find_map(|member| {
                let (inner, found) = self.find_member(member.type_ref, name, depth + 1)?;
                Some((member.offset.checked_add(inner)?, found))
            })
    }

    /// Bytes of a type, when known.
    pub(crate) fn size_of(&self, type_ref: TypeRef) -> Option<u64> {
        let mut current = type_ref;
        let mut multiplier = 1u64;
        for _ in 0..MAX_TYPE_STEPS {
            let (unit, entry) = self.entry(current)?;
            if let Some(size) = entry
                .attr_value(dw::DW_AT_byte_size)
                .and_then(|v| v.udata_value())
            {
                return multiplier.checked_mul(size);
            }
            match entry.tag() {
                dw::DW_TAG_array_type => {
                    let (_, count) = self.array_bounds(current)?;
                    multiplier = multiplier.checked_mul(count?)?;
                }
                dw::DW_TAG_pointer_type
                | dw::DW_TAG_reference_type
                | dw::DW_TAG_rvalue_reference_type => {
                    return multiplier.checked_mul(u64::from(unit.encoding().address_size));
                }
                _ => {}
            }
            current = self.type_of(current.unit, &entry)?;
        }
        None
    }

    /// Follows typedefs and qualifiers to the concrete type.
    fn view(&self, type_ref: TypeRef) -> Option<TypeView> {
        let mut current = type_ref;
        let mut names = Vec::new();
        for _ in 0..MAX_TYPE_STEPS {
            let (unit, entry) = self.entry(current)?;
            if let Some(name) = self.name_of(unit, &entry) {
                names.push(name);
            }
            let shape = match entry.tag() {
                dw::DW_TAG_typedef
                | dw::DW_TAG_const_type
                | dw::DW_TAG_volatile_type
                | dw::DW_TAG_restrict_type
                | dw::DW_TAG_atomic_type
                | dw::DW_TAG_immutable_type
                | dw::DW_TAG_packed_type => {
                    current = self.type_of(current.unit, &entry)?;
                    continue;
                }
                dw::DW_TAG_pointer_type
                | dw::DW_TAG_reference_type
                | dw::DW_TAG_rvalue_reference_type => {
                    Shape::Pointer(self.type_of(current.unit, &entry))
                }
                dw::DW_TAG_structure_type | dw::DW_TAG_class_type | dw::DW_TAG_union_type => {
                    Shape::Aggregate {
                        members: self.members(current),
                        union: entry.tag() == dw::DW_TAG_union_type,
                    }
                }
                dw::DW_TAG_array_type => match self.array_bounds(current) {
                    Some((element, count)) => Shape::Array { element, count },
                    None => Shape::Other,
                },
                _ => Shape::Other,
            };
            return Some(TypeView {
                shape,
                size: self.size_of(current),
                names,
            });
        }
        None
    }

    /// Data members (and base classes, unnamed) of a struct, class or union.
    fn members(&self, type_ref: TypeRef) -> Vec<Member> {
        let mut members = Vec::new();
        let Some(unit) = self.units.get(type_ref.unit) else {
            return members;
        };
        let Ok(mut tree) = unit.entries_tree(Some(type_ref.offset)) else {
            return members;
        };
        let Ok(root) = tree.root() else {
            return members;
        };
        let mut children = root.children();
        while let Ok(Some(child)) = children.next() {
            if members.len() >= MAX_MEMBERS {
                break;
            }
            let entry = child.entry();
            if !matches!(entry.tag(), dw::DW_TAG_member | dw::DW_TAG_inheritance)
                || entry.attr(dw::DW_AT_declaration).is_some()
                || entry.attr(dw::DW_AT_external).is_some()
            {
                continue;
            }
            let Some(member_type) = self.type_of(type_ref.unit, entry) else {
                continue;
            };
            let offset = match entry.attr_value(dw::DW_AT_data_member_location) {
                None => 0, // union members
                Some(AttributeValue::Exprloc(expression)) => {
                    match plus_uconst(expression, unit.encoding()) {
                        Some(offset) => offset,
                        None => continue,
                    }
                }
                Some(value) => match value.udata_value() {
                    Some(offset) => offset,
                    None => continue,
                },
            };
            members.push(Member {
                name: (entry.tag() == dw::DW_TAG_member)
                    .then(|| self.name_of(unit, entry))
                    .flatten(),
                offset,
                type_ref: member_type,
            });
        }
        members
    }

    /// Element type and element count (None when unbounded) of an array type;
    /// several dimensions are flattened into one count.
    fn array_bounds(&self, type_ref: TypeRef) -> Option<(TypeRef, Option<u64>)> {
        let unit = self.units.get(type_ref.unit)?;
        let mut tree = unit.entries_tree(Some(type_ref.offset)).ok()?;
        let root = tree.root().ok()?;
        let element = self.type_of(type_ref.unit, root.entry())?;
        let mut count: Option<u64> = Some(1);
        let mut dimensions = 0;
        let mut children = root.children();
        while let Ok(Some(child)) = children.next() {
            let entry = child.entry();
            if entry.tag() != dw::DW_TAG_subrange_type {
                continue;
            }
            dimensions += 1;
            let this = entry
                .attr_value(dw::DW_AT_count)
                .and_then(|v| v.udata_value())
                .or_else(|| {
                    let upper = entry.attr_value(dw::DW_AT_upper_bound)?.udata_value()?;
                    let lower = entry
                        .attr_value(dw::DW_AT_lower_bound)
                        .and_then(|v| v.udata_value())
                        .unwrap_or(0);
                    upper.checked_sub(lower)?.checked_add(1)
                });
            count = count.zip(this).and_then(|(a, b)| a.checked_mul(b));
            if dimensions > 16 {
                return None;
            }
        }
        Some((element, if dimensions == 0 { None } else { count }))
    }

    fn entry(
        &self,
        type_ref: TypeRef,
    ) -> Option<(
        &gimli::Unit<Reader>,
        gimli::DebuggingInformationEntry<Reader>,
    )> {
        let unit = self.units.get(type_ref.unit)?;
        let entry = unit.entry(type_ref.offset).ok()?;
        Some((unit, entry))
    }

    /// The DIE a `DW_AT_type` of `entry` (in unit `unit`) refers to.
    fn type_of(
        &self,
        unit: usize,
        entry: &gimli::DebuggingInformationEntry<Reader>,
    ) -> Option<TypeRef> {
        self.reference(unit, entry.attr_value(dw::DW_AT_type)?)
    }

    fn reference(&self, unit: usize, value: AttributeValue<Reader>) -> Option<TypeRef> {
        match value {
            AttributeValue::UnitRef(offset) => Some(TypeRef { unit, offset }),
            AttributeValue::DebugInfoRef(offset) => {
                let index = self
                    .unit_starts
                    .partition_point(|&start| start <= offset.0)
                    .checked_sub(1)?;
                let header = &self.units.get(index)?.header;
                Some(TypeRef {
                    unit: index,
                    offset: offset.to_unit_offset(header)?,
                })
            }
            _ => None,
        }
    }

    fn name_of(
        &self,
        unit: &gimli::Unit<Reader>,
        entry: &gimli::DebuggingInformationEntry<Reader>,
    ) -> Option<String> {
        let value = entry.attr_value(dw::DW_AT_name)?;
        let name = self.dwarf.attr_string(unit, value).ok()?;
        Some(name.to_string_lossy().ok()?.into_owned())
    }
}

/// First pass over one unit: variables with a static address. Returns the
/// number of DIEs read.
fn collect_variables(
    dwarf: &gimli::Dwarf<Reader>,
    unit: &gimli::Unit<Reader>,
    index: usize,
    out: &mut Vec<PendingVariable>,
) -> usize {
    let Ok(mut raw) = unit.entries_raw(None) else {
        return 0;
    };
    let mut count = 0;
    while !raw.is_empty() {
        let Ok(abbreviation) = raw.read_abbreviation() else {
            break;
        };
        let Some(abbreviation) = abbreviation else {
            continue; // end of a sibling list
        };
        count += 1;
        if count > MAX_ENTRIES {
            break;
        }
        if abbreviation.tag() != dw::DW_TAG_variable {
            if raw.skip_attributes(abbreviation.attributes()).is_err() {
                break;
            }
            continue;
        }
        let mut location = None;
        let mut name = None;
        let mut type_value = None;
        let mut specification = None;
        let mut failed = false;
        for spec in abbreviation.attributes() {
            let Ok(attribute) = raw.read_attribute(*spec) else {
                failed = true;
                break;
            };
            match attribute.name() {
                dw::DW_AT_location => location = Some(attribute.value()),
                dw::DW_AT_name => name = Some(attribute.value()),
                dw::DW_AT_type => type_value = Some(attribute.value()),
                dw::DW_AT_specification | dw::DW_AT_abstract_origin => {
                    specification = Some(attribute.value())
                }
                _ => {}
            }
        }
        if failed {
            break;
        }
        let Some(AttributeValue::Exprloc(expression)) = location else {
            continue;
        };
        let Some(address) = static_address(dwarf, unit, expression) else {
            continue;
        };
        // A definition outside its class (C++ statics) or an inlined copy:
        // the name and type are on the declaration it refers to.
        if let Some(AttributeValue::UnitRef(declaration)) = specification
            && let Ok(declared) = unit.entry(declaration)
        {
            name = name.or_else(|| declared.attr_value(dw::DW_AT_name));
            type_value = type_value.or_else(|| declared.attr_value(dw::DW_AT_type));
        }
        let Some(name) = name
            .and_then(|value| dwarf.attr_string(unit, value).ok())
            .and_then(|text| text.to_string_lossy().ok().map(|t| t.into_owned()))
        else {
            continue;
        };
        out.push(PendingVariable {
            address,
            name,
            unit: index,
            type_value,
        });
    }
    count
}

/// The address of a location that is exactly `DW_OP_addr A` (or `addrx`):
/// a variable with static storage.
fn static_address(
    dwarf: &gimli::Dwarf<Reader>,
    unit: &gimli::Unit<Reader>,
    expression: gimli::Expression<Reader>,
) -> Option<u64> {
    let mut operations = expression.operations(unit.encoding());
    let address = match operations.next().ok()?? {
        gimli::Operation::Address { address } => address,
        gimli::Operation::AddressIndex { index } => dwarf.address(unit, index).ok()?,
        _ => return None,
    };
    // `DW_OP_addr; DW_OP_GNU_push_tls_address` and the like are not static.
    match operations.next() {
        Ok(None) => Some(address),
        _ => None,
    }
}

/// A member location given as `DW_OP_plus_uconst N`.
fn plus_uconst(expression: gimli::Expression<Reader>, encoding: gimli::Encoding) -> Option<u64> {
    let mut operations = expression.operations(encoding);
    match operations.next().ok()?? {
        gimli::Operation::PlusConstant { value } => Some(value),
        _ => None,
    }
}

/// Types a lock is, where naming stops descending: pthread's (mutex,
/// rwlock, cond, barrier, …), semaphores, C11's `mtx_t`, a Rust or C++
/// `Mutex`/`Condvar`, a `*_lock_t`.
pub(crate) fn looks_like_lock(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    [
        "mutex",
        "rwlock",
        "spinlock",
        "futex",
        "condvar",
        "condition",
        "semaphore",
    ]
    .iter()
    .any(|word| lower.contains(word))
        || lower.starts_with("pthread_")
        || ["lock", "sem_t", "mtx_t", "cnd_t"].contains(&lower.as_str())
        || lower.ends_with("_lock_t")
        || lower.starts_with("lock<")
}

#[cfg(test)]
pub(crate) mod tests {
    use object::ObjectSymbol;

    use super::*;

    const SOURCE: &str = r#"
#include <pthread.h>
struct inner { int a; pthread_mutex_t m; };
struct outer {
    char pad[8];
    union { long x; struct inner *p; } u;
    struct inner arr[2];
    pthread_mutex_t *lp;
};
struct outer g_outer;
struct outer *g_ptr;
int main(void) { return g_outer.arr[1].a + (g_ptr != 0); }
"#;

    fn compiled() -> Vec<u8> {
        compile_c(SOURCE)
    }

    /// A small executable with DWARF, compiled by gcc from `source`.
    pub(crate) fn compile_c(source: &str) -> Vec<u8> {
        compile_c_with(source, &[])
    }

    /// As [`compile_c`], with more gcc arguments (`-gz=zlib`).
    pub(crate) fn compile_c_with(source: &str, extra: &[&str]) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.c");
        std::fs::write(&path, source).unwrap();
        let binary = dir.path().join("t");
        let status = std::process::Command::new("gcc")
            .args(["-g", "-O0", "-pthread"])
            .args(extra)
            .arg("-o")
            .arg(&binary)
            .arg(&path)
            .status()
            .expect("gcc (scripts/setup.sh installs it)");
        assert!(status.success());
        std::fs::read(binary).unwrap()
    }

    pub(crate) fn symbol_address(data: &[u8], name: &str) -> u64 {
        let elf = object::File::parse(data).unwrap();
        elf.symbols()
            .find(|s| s.name() == Ok(name))
            .map(|s| s.address())
            .unwrap()
    }

    #[test]
    fn names_fields_array_elements_union_members_and_pointers() {
        let data = compiled();
        let info = DebugInfo::parse(&data).expect("DWARF");
        let outer = symbol_address(&data, "g_outer");
        let (variable, offset) = info.variable_at(outer + 72).unwrap();
        assert_eq!((variable.name.as_str(), offset), ("g_outer", 72));
        let outer_type = variable.type_ref.unwrap();
        assert_eq!(info.size_of(outer_type), Some(120));
        let lock = Want::Lock { span: 40 };
        assert_eq!(info.describe(outer_type, 72, lock).text, ".arr[1].m");
        assert_eq!(info.describe(outer_type, 72, lock).fields, 3);
        assert_eq!(info.describe(outer_type, 24, lock).text, ".arr[0].m");
        // Inside no field: the rest in offsets.
        assert_eq!(info.describe(outer_type, 3, lock).text, ".pad[3]");
        assert_eq!(info.describe(outer_type, 20, lock).text, ".arr[0]+0x4");
        // A union: its pointer member for a pointer slot, with its pointee.
        let slot = info.describe(outer_type, 8, Want::Pointer);
        assert_eq!(slot.text, ".u.p");
        assert!(slot.is_pointer);
        let inner = slot.pointee.unwrap();
        assert_eq!(info.describe(inner, 8, lock).text, ".m");
        let pointer = info.describe(outer_type, 112, Want::Pointer);
        assert_eq!(pointer.text, ".lp");
        assert!(pointer.pointee.is_some());

        let ptr = symbol_address(&data, "g_ptr");
        let (variable, offset) = info.variable_at(ptr).unwrap();
        assert_eq!((variable.name.as_str(), offset), ("g_ptr", 0));
        assert!(info.is_pointer(variable.type_ref));
        assert!(
            info.variable_at(ptr + 8)
                .is_none_or(|(v, _)| v.name != "g_ptr")
        );
    }

    /// Corrupted and truncated files: no panic, and lookups stay bounded.
    #[test]
    fn hostile_files_never_panic() {
        let data = compiled();
        let elf = object::File::parse(&*data).unwrap();
        let ranges: Vec<(usize, usize)> = [".debug_info", ".debug_abbrev", ".debug_str"]
            .iter()
            .filter_map(|name| elf.section_by_name(name)?.file_range())
            .map(|(start, size)| (start as usize, size as usize))
            .collect();
        let outer = symbol_address(&data, "g_outer");
        let exercise = |bytes: &[u8]| {
            if let Some(info) = DebugInfo::parse(bytes) {
                for variable in info.variables.clone() {
                    let Some(type_ref) = variable.type_ref else {
                        continue;
                    };
                    for offset in [0, 8, 72, 1 << 40] {
                        info.describe(type_ref, offset, Want::Pointer);
                        info.describe(type_ref, offset, Want::Lock { span: 40 });
                    }
                    info.is_pointer(Some(type_ref));
                }
                info.variable_at(outer + 72);
            }
        };
        // A cheap deterministic generator (xorshift).
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..200 {
            let mut bytes = data.clone();
            for _ in 0..16 {
                let (start, size) = ranges[next() as usize % ranges.len()];
                let at = start + next() as usize % size.max(1);
                bytes[at] = next() as u8;
            }
            exercise(&bytes);
        }
        for cut in [0, 16, 64, data.len() / 3, data.len() / 2, data.len() - 1] {
            exercise(&data[..cut]);
        }
        exercise(b"\x7fELF garbage");
    }

    /// zlib-compressed DWARF is read (inflated once, in place); a section
    /// header claiming 1 GiB or 4 GiB (a compression bomb) is skipped with
    /// its reason before anything is inflated.
    #[test]
    fn compressed_dwarf_is_read_and_a_bomb_is_skipped_unread() {
        let data = compile_c_with(SOURCE, &["-gz=zlib"]);
        let elf = object::File::parse(&*data).unwrap();
        let section = elf.section_by_name(".debug_info").unwrap();
        let range = section.compressed_file_range().unwrap();
        assert_eq!(range.format, object::CompressionFormat::Zlib);
        let header_at = range.offset as usize - 24;
        let info = DebugInfo::parse(&data).expect("compressed DWARF parses");
        let outer = symbol_address(&data, "g_outer");
        assert_eq!(info.variable_at(outer + 72).unwrap().0.name, "g_outer");
        for claimed in [1u64 << 30, 4 << 30] {
            let mut bomb = data.clone();
            // Elf64_Chdr: ch_type, ch_reserved, then ch_size.
            bomb[header_at + 8..header_at + 16].copy_from_slice(&claimed.to_le_bytes());
            let skip = DebugInfo::parse_bounded(&bomb).err().expect("skipped");
            assert_eq!(
                skip,
                DwarfSkip::SectionTooLarge {
                    section: ".debug_info".into(),
                    bytes: claimed
                }
            );
            assert_eq!(
                skip.to_string(),
                format!(
                    ".debug_info decompresses to {} MiB, over the 512 MiB cap",
                    claimed >> 20
                )
            );
        }
        // A stated size the stream does not fill: corrupt, not read.
        let mut short = data.clone();
        let actual = range.uncompressed_size + 1;
        short[header_at + 8..header_at + 16].copy_from_slice(&actual.to_le_bytes());
        assert!(matches!(
            DebugInfo::parse_bounded(&short),
            Err(DwarfSkip::Corrupt { .. })
        ));
    }

    #[test]
    fn tells_lock_types() {
        for name in [
            "pthread_mutex_t",
            "Mutex<u64>",
            "mysql_mutex_t",
            "pthread_rwlock_t",
            "spinlock_t",
            "mtx_t",
        ] {
            assert!(looks_like_lock(name), "{name}");
        }
        for name in ["clock_t", "block", "stats", "int", "seconds"] {
            assert!(!looks_like_lock(name), "{name}");
        }
    }
}
