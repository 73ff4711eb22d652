//! Symbols and sections of one ELF module, merged with its separate debug
//! file (`.gnu_debuglink` or build-id under /usr/lib/debug, or one fetched
//! from a debuginfod server: naming::debuginfod) when one exists.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SectionKind, SymbolKind};

use crate::probe::modules::ModuleFile;

/// A named range of the module's link-time addresses.
#[derive(Debug, Clone)]
pub struct Symbol {
    pub address: u64,
    pub size: u64,
    /// As in the symbol table (mangled); see [`Symbol::readable_name`].
    pub name: String,
}

impl Symbol {
    /// Demangled on demand: demangling every symbol of a large C++ module
    /// up front costs seconds.
    pub fn readable_name(&self) -> String {
        demangle(&self.name)
    }

    /// `name` or `name+0xOFF`.
    pub fn with_offset(&self, offset: u64) -> String {
        if offset == 0 {
            self.readable_name()
        } else {
            format!("{}+{offset:#x}", self.readable_name())
        }
    }
}

/// A loadable segment: file bytes `offset..offset+file_size` at `address`.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub address: u64,
    pub memory_size: u64,
    pub offset: u64,
    pub file_size: u64,
}

impl Segment {
    /// The loadable segments of `elf`.
    pub(crate) fn all(elf: &object::File) -> Vec<Segment> {
        elf.segments()
            .map(|segment| {
                let (offset, file_size) = segment.file_range();
                Segment {
                    address: segment.address(),
                    memory_size: segment.size(),
                    offset,
                    file_size,
                }
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
pub struct Section {
    pub name: String,
    pub address: u64,
    pub size: u64,
}

/// What the tracer knows about one module file.
#[derive(Debug, Default)]
pub struct ModuleSymbols {
    pub segments: Vec<Segment>,
    pub sections: Vec<Section>,
    /// Data objects (variables), sorted by address.
    pub objects: Vec<Symbol>,
    /// Functions, sorted by address.
    pub functions: Vec<Symbol>,
    /// Whether a full symbol table (.symtab, here or in a debug file) was
    /// read, beyond the exported .dynsym.
    pub has_symtab: bool,
    /// The separate debug file whose symbols were merged in, if any.
    /// The separate debug file, as a path in the target's root (or the host's).
    pub debug_file: Option<String>,
    /// The same file as the tracer opens it (its DWARF is read from there).
    pub debug_path: Option<PathBuf>,
    /// Debug files not used, with why (a debug link too large to check).
    pub skipped: Vec<crate::model::SkippedFile>,
    /// The module's GNU build-id (what debuginfod serves debug files by).
    pub build_id: Option<Vec<u8>>,
    /// The debug file its `.gnu_debuglink` names.
    pub debug_link: Option<String>,
}

impl ModuleSymbols {
    /// Whether some allocated section lies inside a loaded segment, as in
    /// every file a linker wrote (a file without segments has nothing to check).
    fn sections_describe_segments(&self) -> bool {
        self.segments.is_empty()
            || self.sections.iter().any(|section| {
                self.segments.iter().any(|segment| {
                    section.address >= segment.address
                        && section.address.saturating_add(section.size)
                            <= segment.address.saturating_add(segment.memory_size)
                })
            })
    }

    /// The region of a link address from the program headers alone: the
    /// zero-filled tail of a segment is `.bss`, its file bytes `module`;
    /// None past every segment.
    pub(crate) fn segment_region(&self, link_address: u64) -> Option<crate::model::Region> {
        let segment = self.segments.iter().find(|segment| {
            (segment.address..segment.address.saturating_add(segment.memory_size))
                .contains(&link_address)
        })?;
        Some(
            if link_address >= segment.address.saturating_add(segment.file_size) {
                crate::model::Region::Section(".bss".into())
            } else {
                crate::model::Region::Module
            },
        )
    }

    /// Parses a module from its bytes; `root` is where the target's files are
    /// seen (its /proc/PID/root), used to look for debug files.
    pub fn parse(data: &[u8], module_path: &str, root: Option<&Path>) -> Result<ModuleSymbols> {
        ModuleSymbols::parse_with(data, module_path, root, |elf, skipped| {
            find_debug_file(elf, module_path, root, skipped)
        })
    }

    /// Parses a module with `debug_path` as its debug file (one fetched
    /// from a debuginfod server, its build-id checked).
    pub(crate) fn parse_with_debug_file(
        data: &[u8],
        module_path: &str,
        root: Option<&Path>,
        debug_path: &Path,
    ) -> Result<ModuleSymbols> {
        ModuleSymbols::parse_with(data, module_path, root, |_, _| {
            Some(debug_path.to_path_buf())
        })
    }

    /// Parses a module; `debug_file` finds its debug file.
    fn parse_with(
        data: &[u8],
        module_path: &str,
        root: Option<&Path>,
        debug_file: impl FnOnce(&object::File, &mut Vec<crate::model::SkippedFile>) -> Option<PathBuf>,
    ) -> Result<ModuleSymbols> {
        let elf = object::File::parse(data)
            .with_context(|| format!("{module_path} is not an ELF file"))?;
        let mut module = ModuleSymbols {
            segments: Segment::all(&elf),
            sections: elf
                .sections()
                .filter(|section| section.address() != 0 && section.kind() != SectionKind::Metadata)
                .filter_map(|section| {
                    Some(Section {
                        name: section.name().ok()?.to_string(),
                        address: section.address(),
                        size: section.size(),
                    })
                })
                .collect(),
            build_id: elf
                .build_id()
                .ok()
                .flatten()
                .filter(|id| id.len() > 1)
                .map(<[u8]>::to_vec),
            debug_link: elf
                .gnu_debuglink()
                .ok()
                .flatten()
                .map(|(link, _)| String::from_utf8_lossy(link).into_owned()),
            ..ModuleSymbols::default()
        };
        if !module.sections_describe_segments() {
            module.skipped.push(crate::model::SkippedFile {
                file: module_path.to_string(),
                reason: crate::model::SkipReason::NoSectionHeaders,
                detail: format!(
                    "none of its section headers lies inside its {} loaded segments (sstrip, or rewritten headers): no symbols from it; regions from its program headers",
                    module.segments.len()
                ),
            });
            // Headers that describe nothing loaded name nothing right.
            module.sections.clear();
            return Ok(module);
        }
        module.add_symbols(&elf, module_path, memory_room());
        if let Some(debug_path) = debug_file(&elf, &mut module.skipped)
            && let Ok(debug_file) = ModuleFile::open(&debug_path)
            && let Ok(debug_elf) = debug_file.elf()
        {
            module.add_symbols(&debug_elf, &debug_path.display().to_string(), memory_room());
            let shown = root
                .and_then(|root| debug_path.strip_prefix(root).ok())
                .map(|p| Path::new("/").join(p));
            module.debug_file = Some(shown.unwrap_or(debug_path.clone()).display().to_string());
            module.debug_path = Some(debug_path);
        }
        if !module.has_symtab {
            module.add_go_functions(&elf);
        }
        for list in [&mut module.objects, &mut module.functions] {
            // Unstable: it allocates nothing (a stable sort takes half the
            // list again); the name makes the order total.
            list.sort_unstable_by(|a, b| {
                (a.address, preference(&a.name), &a.name).cmp(&(
                    b.address,
                    preference(&b.name),
                    &b.name,
                ))
            });
            list.dedup_by(|later, earlier| {
                later.address == earlier.address && later.size == earlier.size
            });
        }
        Ok(module)
    }

    /// Adds `elf`'s function and variable symbols, unless holding them
    /// would not fit in `room` (bytes of address space left under the
    /// process's limit, `ulimit -v`; None: no limit) or the lists cannot
    /// be allocated: the file is then skipped, with why, rather than the
    /// allocation failing (which aborts).
    fn add_symbols(&mut self, elf: &object::File, file: &str, room: Option<u64>) {
        let (functions, objects, name_bytes) = symbol_counts(elf);
        let count = functions + objects;
        let need = count * BYTES_PER_SYMBOL + name_bytes;
        let fits = room.is_none_or(|room| need <= room / 2)
            && self.functions.try_reserve_exact(functions as usize).is_ok()
            && self.objects.try_reserve_exact(objects as usize).is_ok();
        if !fits {
            let left = room.map_or(String::new(), |room| {
                format!(
                    ", {} MiB of address space left under its limit (ulimit -v)",
                    room >> 20
                )
            });
            self.skipped.push(crate::model::SkippedFile {
                file: file.to_string(),
                reason: crate::model::SkipReason::TooManySymbols,
                detail: format!(
                    "{count} symbols would take about {} MiB{left}: no names from its symbol table",
                    need >> 20
                ),
            });
            return;
        }
        self.has_symtab |= elf.symbols().next().is_some();
        for symbol in elf.symbols().chain(elf.dynamic_symbols()) {
            let Some(raw) = wanted_name(&symbol) else {
                continue;
            };
            let entry = Symbol {
                address: symbol.address(),
                size: symbol.size(),
                name: raw.to_string(),
            };
            match symbol.kind() {
                SymbolKind::Text => self.functions.push(entry),
                SymbolKind::Data => self.objects.push(entry),
                _ => {}
            }
        }
    }

    /// A stripped Go binary (`-ldflags "-w -s"`, `strip`) names its Go
    /// functions in Go's own table, `.gopclntab`, which stripping keeps.
    fn add_go_functions(&mut self, elf: &object::File) {
        let Ok(go) = crate::probe::gopclntab::read(elf) else {
            return;
        };
        if self.functions.try_reserve(go.len()).is_err() {
            return;
        }
        self.functions.extend(go.functions().map(|function| Symbol {
            address: function.entry,
            size: function.end - function.entry,
            name: function.name.to_string(),
        }));
    }

    /// The variable covering a link-time address, and the offset into it.
    pub fn object_at(&self, address: u64) -> Option<(&Symbol, u64)> {
        containing(&self.objects, address, false)
    }

    /// The function containing a link-time code address.
    pub fn function_at(&self, address: u64) -> Option<(&Symbol, u64)> {
        containing(&self.functions, address, true)
    }

    pub fn section_at(&self, address: u64) -> Option<&Section> {
        self.sections
            .iter()
            .filter(|section| {
                // Subtracting, not adding: a hostile size must not overflow.
                address >= section.address && address - section.address < section.size
            })
            // .tbss overlaps the next section at link time; prefer real ones.
            .min_by_key(|section| section.name.starts_with(".t"))
    }
}

/// Bytes naming holds per symbol besides its name's: the entry, and the
/// allocator's overhead on the name.
const BYTES_PER_SYMBOL: u64 = std::mem::size_of::<Symbol>() as u64 + 16;

/// The name of a symbol [`ModuleSymbols`] keeps (a defined function or
/// variable with an address and a name).
fn wanted_name<'data>(symbol: &object::Symbol<'data, '_>) -> Option<&'data str> {
    if !symbol.is_definition()
        || symbol.address() == 0
        || !matches!(symbol.kind(), SymbolKind::Text | SymbolKind::Data)
    {
        return None;
    }
    symbol.name().ok().filter(|name| !name.is_empty())
}

/// (functions, variables, bytes of their names) in `elf`'s symbol tables,
/// counted without allocating.
fn symbol_counts(elf: &object::File) -> (u64, u64, u64) {
    let mut counts = (0, 0, 0);
    for symbol in elf.symbols().chain(elf.dynamic_symbols()) {
        let Some(name) = wanted_name(&symbol) else {
            continue;
        };
        if symbol.kind() == SymbolKind::Text {
            counts.0 += 1;
        } else {
            counts.1 += 1;
        }
        counts.2 += name.len() as u64;
    }
    counts
}

/// Bytes of address space this process may still map under its limit
/// (`ulimit -v`, RLIMIT_AS); None without a limit.
fn memory_room() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let used_kb: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmSize:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(limit.rlim_cur.saturating_sub(used_kb * 1024))
}

/// Ordering among aliases at one address: public names before `__internal` ones.
fn preference(name: &str) -> (usize, usize) {
    (name.chars().take_while(|&c| c == '_').count(), name.len())
}

/// The symbol whose range covers `address` (the smallest if several do).
/// Functions without a size (hand-written assembly) cover up to the next symbol.
fn containing(symbols: &[Symbol], address: u64, open_ended: bool) -> Option<(&Symbol, u64)> {
    let end = symbols.partition_point(|symbol| symbol.address <= address);
    let candidates = &symbols[..end];
    let sized = candidates
        .iter()
        .rev()
        .take(256)
        // `address - start`, not `start + size`: a hostile size must not overflow.
        .filter(|symbol| address - symbol.address < symbol.size)
        .min_by_key(|symbol| symbol.size);
    let found = sized.or_else(|| {
        let last = candidates.last()?;
        (last.address == address || (open_ended && last.size == 0)).then_some(last)
    })?;
    Some((found, address - found.address))
}

/// Rust (legacy and v0) and C++ (Itanium) names in readable form.
pub(crate) fn demangle(name: &str) -> String {
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return format!("{rust:#}");
    }
    if name.starts_with("_Z")
        && let Ok(symbol) = cpp_demangle::Symbol::new(name)
        && let Ok(text) = symbol.demangle()
    {
        return text;
    }
    name.to_string()
}

/// The module's separate debug file (see [`find_debug_file`]), for a
/// reader that needs only its path (the unwinder's `.debug_frame`).
pub(crate) fn debug_file_path(
    elf: &object::File,
    module_path: &str,
    root: Option<&Path>,
) -> Option<PathBuf> {
    find_debug_file(elf, module_path, root, &mut Vec::new())
}

/// A separate debug file for the module, looked up as gdb does: by build-id
/// under /usr/lib/debug/.build-id, then by .gnu_debuglink next to the module,
/// in its .debug directory and under /usr/lib/debug. Looked for in the
/// target's root first, then the host's (a debug package installed on the host).
fn find_debug_file(
    elf: &object::File,
    module_path: &str,
    root: Option<&Path>,
    skipped: &mut Vec<crate::model::SkippedFile>,
) -> Option<PathBuf> {
    // Each candidate with the CRC its contents must have (debuglink ones).
    let mut candidates: Vec<(String, Option<u32>)> = Vec::new();
    if let Ok(Some(build_id)) = elf.build_id()
        && build_id.len() > 1
    {
        let hex = hex(build_id);
        candidates.push((
            format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]),
            None,
        ));
    }
    if let Ok(Some((link, crc))) = elf.gnu_debuglink() {
        let link = String::from_utf8_lossy(link).into_owned();
        let dir = Path::new(module_path)
            .parent()
            .map(|dir| dir.to_string_lossy().into_owned())
            .unwrap_or_default();
        candidates.push((format!("{dir}/.debug/{link}"), Some(crc)));
        candidates.push((format!("/usr/lib/debug{dir}/{link}"), Some(crc)));
        if Path::new(&link).file_name() != Path::new(module_path).file_name() {
            candidates.push((format!("{dir}/{link}"), Some(crc)));
        }
    }
    let roots: Vec<PathBuf> = root
        .into_iter()
        .map(Path::to_path_buf)
        .chain([PathBuf::from("/")])
        .collect();
    roots
        .iter()
        .flat_map(|root| {
            candidates
                .iter()
                .map(move |(path, crc)| (crate::probe::target::resolve_in_root(root, path), *crc))
        })
        .find(|(path, crc)| {
            let Some(crc) = crc else {
                return path.is_file();
            };
            match std::fs::metadata(path) {
                Ok(meta) if meta.is_file() && meta.len() > MAX_DEBUG_LINK_BYTES => {
                    skipped.push(crate::model::SkippedFile {
                        file: path.display().to_string(),
                        reason: crate::model::SkipReason::DebugLinkTooLarge,
                        detail: format!(
                            "{} GiB, over the {} GiB cap; `.gnu_debuglink` of {module_path}",
                            meta.len() >> 30,
                            MAX_DEBUG_LINK_BYTES >> 30
                        ),
                    });
                    false
                }
                Ok(meta) if meta.is_file() => is_elf(path) && file_crc(path) == Some(*crc),
                _ => false,
            }
        })
        .map(|(path, _)| path)
}

/// A build-id as the paths that look files up by it spell it.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Largest debug-link file checksummed: debug files of the biggest
/// programs are a few GiB; a link to a huge (sparse) file once took 654 s.
/// Also the largest debug file fetched from a debuginfod server.
pub(crate) const MAX_DEBUG_LINK_BYTES: u64 = 4 << 30;

/// Starts with the ELF magic (checked before a checksum of the whole file).
fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

/// The CRC-32 of a whole file, as `.gnu_debuglink` records it for its debug
/// file: one whose CRC differs belongs to another build and would name
/// wrongly.
fn file_crc(path: &Path) -> Option<u32> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        match file.read(&mut buffer).ok()? {
            0 => return Some(hasher.finalize()),
            n => hasher.update(&buffer[..n]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A symbol table that would not fit under the address-space limit is
    /// skipped with its reason (issue 52 D15: the allocation aborted).
    #[test]
    fn a_symbol_table_beyond_the_memory_limit_is_skipped_with_why() {
        let exe = ModuleFile::open(&std::env::current_exe().unwrap()).unwrap();
        let elf = exe.elf().unwrap();
        let (functions, objects, name_bytes) = symbol_counts(&elf);
        let need = (functions + objects) * BYTES_PER_SYMBOL + name_bytes;
        let mut module = ModuleSymbols::default();
        module.add_symbols(&elf, "exe", Some(2 * need - 1));
        assert!(module.functions.is_empty() && module.objects.is_empty());
        assert_eq!(module.skipped.len(), 1);
        let skipped = &module.skipped[0];
        assert_eq!(skipped.reason, crate::model::SkipReason::TooManySymbols);
        let count = functions + objects;
        assert!(
            skipped
                .detail
                .starts_with(&format!("{count} symbols would take about ")),
            "{}",
            skipped.detail
        );
        let mut module = ModuleSymbols::default();
        module.add_symbols(&elf, "exe", Some(2 * need));
        assert_eq!(module.functions.len() as u64, functions);
        assert_eq!(module.objects.len() as u64, objects);
        assert!(module.skipped.is_empty());
    }

    #[test]
    fn demangles_rust_and_cpp() {
        assert_eq!(
            demangle("_ZN3std4sync5mutex14Mutex$LT$T$GT$4lock17h0123456789abcdefE"),
            "std::sync::mutex::Mutex<T>::lock"
        );
        assert_eq!(demangle("_ZN5Query7executeEv"), "Query::execute()");
        assert_eq!(demangle("g_lock"), "g_lock");
    }

    #[test]
    fn hostile_sizes_do_not_overflow() {
        // A symbol and a section at the top of the address space with sizes
        // that run past it, as a crafted ELF file can have.
        let symbols = vec![Symbol {
            address: u64::MAX - 4,
            size: u64::MAX,
            name: "top".into(),
        }];
        assert_eq!(
            containing(&symbols, u64::MAX, false).map(|(s, o)| (s.name.as_str(), o)),
            Some(("top", 4))
        );
        let module = ModuleSymbols {
            sections: vec![Section {
                name: ".data".into(),
                address: u64::MAX - 1,
                size: 16,
            }],
            ..ModuleSymbols::default()
        };
        assert!(module.section_at(u64::MAX).is_some());
        assert!(module.section_at(1).is_none());
    }

    #[test]
    fn finds_containing_symbols() {
        let symbols = vec![
            Symbol {
                address: 0x100,
                size: 0x40,
                name: "a".into(),
            },
            Symbol {
                address: 0x140,
                size: 0x100,
                name: "b".into(),
            },
            Symbol {
                address: 0x300,
                size: 0,
                name: "asm".into(),
            },
        ];
        assert_eq!(
            containing(&symbols, 0x100, false).map(|(s, o)| (s.name.as_str(), o)),
            Some(("a", 0))
        );
        assert_eq!(
            containing(&symbols, 0x188, false).map(|(s, o)| (s.name.as_str(), o)),
            Some(("b", 0x48))
        );
        assert_eq!(
            containing(&symbols, 0x250, false).map(|(s, _)| s.name.as_str()),
            None
        );
        assert_eq!(
            containing(&symbols, 0x310, true).map(|(s, o)| (s.name.as_str(), o)),
            Some(("asm", 0x10))
        );
    }

    /// A `.gnu_debuglink` file is used only when its CRC-32 matches.
    #[test]
    fn a_debuglink_file_with_another_crc_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("m.c");
        std::fs::write(
            &source,
            "int g_value = 1; int get(void) { return g_value; }\n",
        )
        .unwrap();
        let module = dir.path().join("m.so");
        let debug = dir.path().join("m.debug");
        let run = |program: &str, args: &[&std::ffi::OsStr]| {
            let status = std::process::Command::new(program)
                .args(args)
                .status()
                .unwrap();
            assert!(status.success(), "{program} {args:?}");
        };
        let os = |s: &'static str| std::ffi::OsStr::new(s);
        run(
            "gcc",
            &[
                os("-g"),
                os("-shared"),
                os("-fPIC"),
                os("-Wl,--build-id=none"),
                os("-o"),
                module.as_os_str(),
                source.as_os_str(),
            ],
        );
        run(
            "objcopy",
            &[
                os("--only-keep-debug"),
                module.as_os_str(),
                debug.as_os_str(),
            ],
        );
        let link = std::ffi::OsString::from(format!("--add-gnu-debuglink={}", debug.display()));
        run("objcopy", &[os("--strip-debug"), &link, module.as_os_str()]);
        let mut skipped = Vec::new();
        let mut find = || {
            let bytes = std::fs::read(&module).unwrap();
            let elf = object::File::parse(&*bytes).unwrap();
            find_debug_file(&elf, module.to_str().unwrap(), None, &mut skipped)
        };
        assert_eq!(find(), Some(debug.clone()));
        // Another build's debug file under the same name.
        let mut other = std::fs::read(&debug).unwrap();
        other.push(0);
        std::fs::write(&debug, other).unwrap();
        assert_eq!(find(), None);
        // A huge sparse file under that name: not checksummed (that took
        // 654 s once), and said why; found at once.
        let started = std::time::Instant::now();
        std::fs::File::create(&debug)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        assert_eq!(find(), None);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(skipped.len(), 1);
        assert_eq!(
            skipped[0].reason,
            crate::model::SkipReason::DebugLinkTooLarge
        );
        assert!(
            skipped[0]
                .detail
                .starts_with("1024 GiB, over the 4 GiB cap")
        );
    }
}
