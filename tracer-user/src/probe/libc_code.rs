//! Lock and wait functions in an executable without a symbol table (a
//! stripped static build): found by their code. A static link copies each
//! libc function's bytes from the libc archive verbatim, filling in only
//! the fields its relocations name; so a function's bytes from the archive
//! the distribution ships, with those fields masked, occur in the binary
//! exactly where the function is. A match counts only when it is unique.
//!
//! Chosen over instruction-level heuristics (recognising a `lock cmpxchg`
//! on the mutex word, as a human would) because a byte match either holds
//! or does not: it cannot mistake a similar function for the lock, and it
//! says which archive it matched. The price: a binary built against a libc
//! this machine does not have is not matched (said, with what would fix it).
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use object::{
    Object, ObjectSection, ObjectSegment, ObjectSymbol, SegmentFlags, read::archive::ArchiveFile,
};

/// The libc archives the distribution ships, musl's first (static release
/// builds are musl), then glibc's; absent ones are passed over.
pub(crate) const LIBC_ARCHIVES: [&str; 4] = [
    "/usr/lib/x86_64-linux-musl/libc.a",
    "/usr/lib/musl/lib/libc.a",
    "/usr/lib/x86_64-linux-gnu/libc.a",
    "/usr/lib64/libc.a",
];

/// Fewer fixed bytes than this could occur by chance in a large binary.
const MIN_FIXED_BYTES: usize = 16;

/// One function's code from an archive: its bytes, and which of them are
/// fixed (not filled in by a relocation at link time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CodePattern {
    pub symbol: String,
    pub bytes: Vec<u8>,
    pub fixed: Vec<bool>,
}

/// Where a pattern occurs in a module's executable segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Occurrence {
    /// Exactly once, at this file offset.
    Unique(u64),
    Absent,
    /// More than once: no place can be told.
    Ambiguous,
}

/// One libc archive, read once.
pub(crate) struct LibcArchive {
    pub path: PathBuf,
    data: memmap2::Mmap,
}

impl LibcArchive {
    /// The archives of [`LIBC_ARCHIVES`] that exist here.
    pub(crate) fn installed() -> Vec<LibcArchive> {
        LIBC_ARCHIVES
            .iter()
            .filter_map(|path| LibcArchive::open(Path::new(path)).ok())
            .collect()
    }

    pub(crate) fn open(path: &Path) -> Result<LibcArchive> {
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        // SAFETY: read-only private mapping of a system library archive;
        // only read through `object`, which bounds-checks every access.
        let data = unsafe { memmap2::Mmap::map(&file) }
            .with_context(|| format!("cannot map {}", path.display()))?;
        Ok(LibcArchive {
            path: path.to_path_buf(),
            data,
        })
    }

    /// Where `symbol`'s code occurs exactly once in `module` (file offset),
    /// with its bytes.
    pub(crate) fn unique_in(
        &self,
        module: &object::File,
        bytes: &[u8],
        symbol: &str,
    ) -> Option<(u64, Vec<u8>)> {
        let pattern = self.pattern(symbol)?;
        match occurrence(module, bytes, &pattern) {
            Occurrence::Unique(offset) => Some((offset, pattern.bytes)),
            Occurrence::Absent | Occurrence::Ambiguous => None,
        }
    }

    /// The code of the function `symbol` (any of its names: musl defines
    /// `pthread_mutex_lock` as a weak alias of `__pthread_mutex_lock`).
    pub(crate) fn pattern(&self, symbol: &str) -> Option<CodePattern> {
        let data = &*self.data;
        let archive = ArchiveFile::parse(data).ok()?;
        // The archive's symbol index names the member; every member is
        // parsed only when an archive has no index.
        let indexed = archive.symbols().ok().flatten().and_then(|mut index| {
            let entry =
                index.find(|entry| entry.as_ref().is_ok_and(|e| e.name() == symbol.as_bytes()))?;
            archive.member(entry.ok()?.offset()).ok()
        });
        let mut members = indexed.into_iter().chain(archive.members().flatten());
        members.find_map(|member| {
            let object = object::File::parse(member.data(data).ok()?).ok()?;
            pattern_of(&object, symbol)
        })
    }
}

/// The defined text symbol `name` of a relocatable object.
fn defining<'data, 'file>(
    object: &'file object::File<'data>,
    name: &str,
) -> Option<object::Symbol<'data, 'file>> {
    object.symbols().find(|symbol| {
        symbol.kind() == object::SymbolKind::Text
            && symbol.is_definition()
            && symbol.name() == Ok(name)
            && symbol.size() > 0
    })
}

/// The function's bytes in its section, the relocated fields masked.
fn pattern_of(object: &object::File, name: &str) -> Option<CodePattern> {
    let symbol = defining(object, name)?;
    let section = object.section_by_index(symbol.section_index()?).ok()?;
    let start = symbol.address();
    let end = start.checked_add(symbol.size())?;
    let data = section.data().ok()?;
    let bytes = data.get(usize::try_from(start).ok()?..usize::try_from(end).ok()?)?;
    let mut fixed = vec![true; bytes.len()];
    for (offset, relocation) in section.relocations() {
        let width = u64::from(relocation.size().max(8) / 8);
        for at in offset..offset.saturating_add(width) {
            if at >= start && at < end {
                fixed[(at - start) as usize] = false;
            }
        }
    }
    Some(CodePattern {
        symbol: name.to_string(),
        bytes: bytes.to_vec(),
        fixed,
    })
}

impl CodePattern {
    fn fixed_bytes(&self) -> usize {
        self.fixed.iter().filter(|&&fixed| fixed).count()
    }

    /// The longest run of fixed bytes: searched for first, the rest checked
    /// at each place it occurs.
    fn anchor(&self) -> (usize, usize) {
        let (mut best, mut run_start) = ((0, 0), 0);
        for (index, &fixed) in self.fixed.iter().enumerate() {
            if !fixed {
                run_start = index + 1;
            } else if index + 1 - run_start > best.1 {
                best = (run_start, index + 1 - run_start);
            }
        }
        best
    }

    fn matches_at(&self, code: &[u8], start: usize) -> bool {
        code.get(start..start + self.bytes.len())
            .is_some_and(|window| {
                window
                    .iter()
                    .zip(&self.bytes)
                    .zip(&self.fixed)
                    .all(|((have, want), fixed)| !fixed || have == want)
            })
    }

    /// Where the pattern occurs in `code` (starting at file offset `base`).
    pub(crate) fn find_in(&self, code: &[u8], base: u64, found: &mut Vec<u64>) {
        let (anchor_at, anchor_len) = self.anchor();
        if anchor_len == 0 || self.fixed_bytes() < MIN_FIXED_BYTES {
            return;
        }
        let needle = &self.bytes[anchor_at..anchor_at + anchor_len];
        for hit in memchr::memmem::find_iter(code, needle) {
            let Some(start) = hit.checked_sub(anchor_at) else {
                continue;
            };
            if self.matches_at(code, start) {
                found.push(base + start as u64);
                if found.len() > 1 {
                    return;
                }
            }
        }
    }
}

/// Where `pattern` occurs in the executable segments of the ELF `module`.
pub(crate) fn occurrence(module: &object::File, bytes: &[u8], pattern: &CodePattern) -> Occurrence {
    if pattern.fixed_bytes() < MIN_FIXED_BYTES {
        return Occurrence::Absent;
    }
    let mut found = Vec::new();
    for segment in module.segments() {
        let executable = matches!(segment.flags(), SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0);
        if !executable {
            continue;
        }
        let (offset, size) = segment.file_range();
        let Some(code) = usize::try_from(offset)
            .ok()
            .zip(usize::try_from(size).ok())
            .and_then(|(offset, size)| bytes.get(offset..offset.checked_add(size)?))
        else {
            continue;
        };
        pattern.find_in(code, offset, &mut found);
        if found.len() > 1 {
            return Occurrence::Ambiguous;
        }
    }
    match found.as_slice() {
        [] => Occurrence::Absent,
        [offset] => Occurrence::Unique(*offset),
        _ => Occurrence::Ambiguous,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(bytes: &[u8], fixed: &[bool]) -> CodePattern {
        CodePattern {
            symbol: "f".into(),
            bytes: bytes.to_vec(),
            fixed: fixed.to_vec(),
        }
    }

    #[test]
    fn a_pattern_matches_with_its_relocated_bytes_different() {
        let mut bytes: Vec<u8> = (1..=24).collect();
        let mut fixed = vec![true; 24];
        fixed[4..8].iter_mut().for_each(|f| *f = false);
        let wanted = pattern(&bytes, &fixed);
        assert_eq!(wanted.anchor(), (8, 16));
        bytes[4..8].copy_from_slice(&[0xaa; 4]);
        let mut code = vec![0u8; 100];
        code[40..64].copy_from_slice(&bytes);
        let mut found = Vec::new();
        wanted.find_in(&code, 1000, &mut found);
        assert_eq!(found, vec![1040]);
        // A changed fixed byte is no match.
        code[41] ^= 1;
        found.clear();
        wanted.find_in(&code, 1000, &mut found);
        assert!(found.is_empty());
    }

    #[test]
    fn two_places_are_reported_and_too_short_a_pattern_never_matches() {
        let bytes: Vec<u8> = (1..=20).collect();
        let wanted = pattern(&bytes, &[true; 20]);
        let mut code = vec![0u8; 100];
        code[0..20].copy_from_slice(&bytes);
        code[50..70].copy_from_slice(&bytes);
        let mut found = Vec::new();
        wanted.find_in(&code, 0, &mut found);
        assert_eq!(found, vec![0, 50]);
        let short = pattern(&bytes[..10], &[true; 10]);
        found.clear();
        short.find_in(&code, 0, &mut found);
        assert!(found.is_empty());
    }

    /// musl's archive, if installed (setup installs musl-tools): its
    /// pthread_mutex_lock has the tail call into timedlock masked.
    #[test]
    fn musls_mutex_lock_comes_with_its_call_masked() {
        let Ok(archive) = LibcArchive::open(Path::new(LIBC_ARCHIVES[0])) else {
            panic!(
                "{} is missing: scripts/setup.sh installs musl-tools",
                LIBC_ARCHIVES[0]
            );
        };
        let lock = archive
            .pattern("pthread_mutex_lock")
            .expect("musl defines it");
        assert!(lock.bytes.len() >= 16, "{lock:?}");
        assert!(
            lock.fixed.iter().any(|fixed| !fixed),
            "the jmp's target is relocated"
        );
        assert!(lock.fixed_bytes() >= MIN_FIXED_BYTES);
    }
}
