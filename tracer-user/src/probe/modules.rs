//! The module files of one recording, each read once: memory-mapped and kept
//! by (device, inode), so the lock-function search, probe placement, the
//! request probe and naming all share one copy of libc however many paths
//! (map_files links, /proc/PID/root paths) lead to it.
//!
//! Only ELF files are mapped: the magic is read first, so a mapped data
//! file (the locale archive, a database file) is never read whole.
use std::{
    collections::HashMap,
    fs::File,
    os::unix::fs::{FileExt, MetadataExt},
    path::Path,
    sync::{Arc, Mutex},
};

use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use object::{Object, ObjectSymbol, SymbolKind, read::elf::Dyn};

/// One ELF file, mapped read-only. The mapping stays valid after the target
/// exits (it holds the inode), so names resolve from it afterwards.
pub struct ModuleFile {
    /// Before `data`: the watch ends before the pages are unmapped.
    watch: super::shrink_guard::Watch,
    data: Mmap,
    identity: FileIdentity,
    shown: String,
}

/// Which file this is: (device, inode, size, mtime); what caches key on.
pub(crate) type FileIdentity = (u64, u64, u64, i64);

impl ModuleFile {
    /// Maps `file` if it starts with the ELF magic.
    pub(crate) fn map(file: &File, shown: &str) -> Result<ModuleFile> {
        let mut magic = [0u8; 4];
        file.read_exact_at(&mut magic, 0)
            .with_context(|| format!("cannot read {shown}"))?;
        if magic != *b"\x7fELF" {
            bail!("{shown} is not an ELF file");
        }
        // SAFETY: the mapping is read-only and private. Modules and debug
        // files are replaced by rename when a package is upgraded; one that
        // is truncated in place instead reads as zeros past its new end (the
        // shrink guard), never SIGBUS.
        let data = unsafe { Mmap::map(file) }.with_context(|| format!("cannot map {shown}"))?;
        let watch = super::shrink_guard::Watch::new(data.as_ptr() as usize, data.len());
        let meta = file
            .metadata()
            .with_context(|| format!("cannot stat {shown}"))?;
        let identity = (meta.dev(), meta.ino(), meta.size(), meta.mtime());
        Ok(ModuleFile {
            watch,
            data,
            identity,
            shown: shown.to_string(),
        })
    }

    /// Opens and maps a file that is not shared (a separate debug file).
    pub fn open(path: &Path) -> Result<ModuleFile> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        ModuleFile::map(&file, &path.display().to_string())
    }

    pub(crate) fn identity(&self) -> FileIdentity {
        self.identity
    }

    /// True once a read found the file shorter than when it was mapped:
    /// what was read from it past its new end was zeros.
    pub(crate) fn shrank(&self) -> bool {
        self.watch.faults() > 0
    }

    /// The path it was opened by, for messages.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// The file's ELF view. `object` decodes headers only and borrows the
    /// mapped bytes, so this is cheap to call per reader.
    pub(crate) fn elf(&self) -> Result<object::File<'_>> {
        object::File::parse(self.bytes()).context("not a valid ELF file")
    }
}

/// `symbol` defines the function `name` in its module: a text symbol,
/// defined there, named `name` unversioned or in any version
/// (`name@GLIBC_2.2.5`, `name@@GLIBC_2.34`).
pub(crate) fn defines_function(symbol: &object::Symbol, name: &str) -> bool {
    symbol.kind() == SymbolKind::Text
        && symbol.is_definition()
        && symbol
            .name()
            .is_ok_and(|n| n == name || n.strip_prefix(name).is_some_and(|v| v.starts_with('@')))
}

/// The one lookup of a function by name (the lock and unlock functions,
/// the condvar waits and lock inits, the request probe, Go's futex): every
/// definition of `name` in `elf`, the symbol table's first, then the
/// dynamic symbols'.
pub(crate) fn functions_named<'data, 'file>(
    elf: &'file object::File<'data>,
    name: &'file str,
) -> impl Iterator<Item = object::Symbol<'data, 'file>> {
    elf.symbols()
        .chain(elf.dynamic_symbols())
        .filter(move |symbol| defines_function(symbol, name))
}

/// Where the function `name` is in `elf`, as (link address, size): from
/// its symbol tables, else, for a Go function in a binary without them
/// (`-ldflags "-w -s"`, `strip`), from Go's own function table
/// (`.gopclntab`, under Go's name: `runtime.futex`, not the symbol's
/// `runtime.futex.abi0`). The size of a Go function includes its padding.
pub(crate) fn function_range(elf: &object::File, name: &str) -> Option<(u64, u64)> {
    if let Some(symbol) = functions_named(elf, name).next() {
        return Some((symbol.address(), symbol.size()));
    }
    let go_name = name.strip_suffix(".abi0").unwrap_or(name);
    let found = super::gopclntab::read(elf).ok()?.named(go_name)?;
    Some((found.entry, found.end - found.entry))
}

impl std::fmt::Debug for ModuleFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModuleFile({} bytes)", self.data.len())
    }
}

/// (device, inode): one file however it is reached.
type FileKey = (u64, u64);

/// The shared store; clones share it.
#[derive(Clone, Default)]
pub struct ModuleStore {
    /// `None` for a file that is not ELF (remembered, so it is not re-checked).
    files: Arc<Mutex<HashMap<FileKey, Option<Arc<ModuleFile>>>>>,
}

impl ModuleStore {
    /// The mapped ELF file at `path`, from the store if its inode was read
    /// before. Errors for unreadable and non-ELF files.
    pub(crate) fn open(&self, path: &Path) -> Result<Arc<ModuleFile>> {
        let shown = path.display().to_string();
        let file = File::open(path).with_context(|| format!("cannot open {shown}"))?;
        let metadata = file
            .metadata()
            .with_context(|| format!("cannot stat {shown}"))?;
        let key = (metadata.dev(), metadata.ino());
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        match files.get(&key) {
            Some(Some(module)) => return Ok(module.clone()),
            Some(None) => bail!("{shown} is not an ELF file"),
            None => {}
        }
        let mapped = ModuleFile::map(&file, &shown).map(Arc::new);
        files.insert(key, mapped.as_ref().ok().cloned());
        mapped
    }

    /// How many distinct ELF files were mapped.
    pub(crate) fn len(&self) -> usize {
        let files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        files.values().filter(|f| f.is_some()).count()
    }
}

impl std::fmt::Debug for ModuleStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModuleStore({} files)", self.len())
    }
}

/// The `DT_SONAME` of a 64-bit ELF shared library, if it has one.
pub(crate) fn soname(data: &[u8]) -> Option<String> {
    let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(data).ok()?;
    let endian = elf.endian();
    let sections = elf.elf_section_table();
    let (entries, link) = sections.dynamic(endian, data).ok()??;
    let strings = sections.strings(endian, data, link).ok()?;
    let entry = entries
        .iter()
        .find(|entry| entry.tag32(endian) == Some(object::elf::DT_SONAME))?;
    let name = entry.string(endian, strings).ok()?;
    Some(String::from_utf8_lossy(name).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_each_inode_once_and_skips_non_elf() {
        let store = ModuleStore::default();
        let exe = std::env::current_exe().unwrap();
        let first = store.open(&exe).unwrap();
        // Another path to the same inode: the same mapping.
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&exe, &link).unwrap();
        let second = store.open(&link).unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(store.len(), 1);
        assert!(first.elf().is_ok());

        let text = dir.path().join("data");
        std::fs::write(&text, b"not an ELF file, and never mapped").unwrap();
        let error = store.open(&text).unwrap_err().to_string();
        assert!(error.ends_with("is not an ELF file"), "{error}");
        assert!(store.open(&text).is_err());
        assert_eq!(store.len(), 1);
    }
}
