//! What memory holds a lock: a report's `region` word.
use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator};

use super::word::{Worded, worded};

/// The memory holding a lock, as `naming` finds it in the target's maps
/// and modules. Written as one word: a section name, a mapping's bracketed
/// name, `file PATH`, or one of the fixed words; several regions (a group
/// of locks) are written joined by `, `.
#[derive(Debug, Clone, Default)]
pub enum Region {
    /// Not looked up (no address space to look in).
    #[default]
    Unset,
    /// A section of an ELF module (`.data`, `.bss`, `.tbss`…).
    Section(String),
    /// A module's bytes outside any section (no section headers: the
    /// program headers' file bytes).
    Module,
    /// The unused tail of a module's last data page, which musl's dynamic
    /// linker gives to malloc.
    SpareHeap,
    /// `[heap]`: the brk heap.
    Heap,
    /// `[stack]`: the main thread's stack.
    Stack,
    /// Another mapping the kernel names in brackets (`[anon:…]`, `[vvar]`).
    Bracketed(String),
    /// A file mapping that is not a module (`file PATH`).
    File(String),
    /// The Go runtime's heap arenas, goroutine stacks and `m` structures included.
    GoHeap,
    /// Memory seen holding a thread's stack pointer, or above a guard page.
    ThreadStack,
    /// glibc's per-thread malloc arenas.
    ThreadArena,
    /// Other writable anonymous memory: mmap'ed C heaps (musl's malloc,
    /// large glibc allocations) and whatever else a program maps.
    MmapHeap,
    /// Anonymous memory that is not writable.
    Anonymous,
    /// Not mapped when the maps were read.
    Unmapped,
    /// The regions of a group's locks, sorted by word, each once.
    Several(Vec<Region>),
    /// A word this version does not know.
    Other(String),
}

/// The fixed words, with their regions.
const FIXED: [(&str, Region); 10] = [
    ("module", Region::Module),
    ("heap (module page tail)", Region::SpareHeap),
    ("[heap]", Region::Heap),
    ("[stack]", Region::Stack),
    ("Go heap", Region::GoHeap),
    ("thread stack", Region::ThreadStack),
    ("heap (thread arena)", Region::ThreadArena),
    ("heap (mmap)", Region::MmapHeap),
    ("anonymous", Region::Anonymous),
    ("unknown", Region::Unmapped),
];

/// Between the regions of a group.
const SEPARATOR: &str = ", ";

impl Region {
    /// Memory malloc hands out: its locks only a pointer chain from a
    /// global can name. One list for the searches during the recording and
    /// the one at the end (musl's heap is `heap (mmap)`: a list without it
    /// left a static musl program's heap locks unsearched until the end).
    pub(crate) fn is_heap(&self) -> bool {
        matches!(
            self,
            Region::Heap
                | Region::Anonymous
                | Region::SpareHeap
                | Region::MmapHeap
                | Region::ThreadArena
        )
    }

    /// This region and `other` as one group's region: each distinct
    /// region once, sorted by word.
    pub(crate) fn merged(&self, other: &Region) -> Region {
        let mut parts: Vec<Region> = Vec::new();
        for part in [self, other].into_iter().flat_map(Region::parts) {
            if !parts.contains(part) {
                parts.push(part.clone());
            }
        }
        parts.sort_unstable();
        match <[Region; 1]>::try_from(parts) {
            Ok([one]) => one,
            Err(parts) => Region::Several(parts),
        }
    }

    fn parts(&self) -> &[Region] {
        match self {
            Region::Several(parts) => parts,
            one => std::slice::from_ref(one),
        }
    }
}

impl Worded for Region {
    fn word(&self) -> Cow<'_, str> {
        match self {
            Region::Unset => "".into(),
            Region::Section(name) | Region::Bracketed(name) | Region::Other(name) => {
                name.as_str().into()
            }
            Region::File(path) => format!("file {path}").into(),
            Region::Several(parts) => {
                let words: Vec<Cow<'_, str>> = parts.iter().map(Worded::word).collect();
                words.join(SEPARATOR).into()
            }
            fixed => FIXED
                .iter()
                .find(|(_, region)| std::mem::discriminant(region) == std::mem::discriminant(fixed))
                .map_or("".into(), |(word, _)| (*word).into()),
        }
    }

    fn from_word(word: &str) -> Region {
        if let Some((_, region)) = FIXED.iter().find(|(fixed, _)| *fixed == word) {
            return region.clone();
        }
        if word.contains(SEPARATOR) {
            return Region::Several(word.split(SEPARATOR).map(Region::from_word).collect());
        }
        if word.is_empty() {
            Region::Unset
        } else if word.starts_with('.') {
            Region::Section(word.to_string())
        } else if word.starts_with('[') {
            Region::Bracketed(word.to_string())
        } else if let Some(path) = word.strip_prefix("file ") {
            Region::File(path.to_string())
        } else {
            Region::Other(word.to_string())
        }
    }
}

worded!(Region);

impl JsonSchema for Region {
    fn schema_name() -> Cow<'static, str> {
        "Region".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let words: Vec<&str> = FIXED.iter().map(|(word, _)| *word).collect();
        super::word::schema(
            "Memory holding a lock: one of these words, a module section (`.data`, `.bss`), a mapping the kernel names in brackets (`[anon:…]`), `file PATH`, empty when not looked up; a group's regions joined by `, `.",
            &words,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::word::assert_round_trips;

    #[test]
    fn every_word_round_trips() {
        for (word, region) in &FIXED {
            assert_eq!(region.word(), *word);
            assert_round_trips::<Region>(word);
        }
        for word in [
            "",
            ".data",
            ".bss",
            ".tbss",
            "[anon:glibc]",
            "file /dev/shm/x",
            "[heap], heap (thread arena)",
        ] {
            assert_round_trips::<Region>(word);
        }
    }

    #[test]
    fn open_ended_words_are_their_kind() {
        assert!(matches!(Region::from_word(".data"), Region::Section(s) if s == ".data"));
        assert!(matches!(Region::from_word("[heap]"), Region::Heap));
        assert!(matches!(Region::from_word("[vvar]"), Region::Bracketed(_)));
        assert!(matches!(Region::from_word("file /a b"), Region::File(p) if p == "/a b"));
        assert!(matches!(Region::from_word(""), Region::Unset));
        assert!(Region::from_word("heap (mmap)").is_heap());
        assert!(!Region::from_word(".bss").is_heap());
    }

    #[test]
    fn an_unknown_word_is_kept() {
        assert!(matches!(Region::from_word("heap"), Region::Other(w) if w == "heap"));
        assert_round_trips::<Region>("persistent memory");
    }

    #[test]
    fn a_group_lists_each_region_once_in_word_order() {
        let arena = Region::ThreadArena;
        let merged = arena.merged(&Region::Heap).merged(&Region::Heap);
        assert_eq!(merged.to_string(), "[heap], heap (thread arena)");
        assert!(matches!(&merged, Region::Several(parts) if parts.len() == 2));
        assert_eq!(Region::Heap.merged(&Region::Heap), Region::Heap);
    }
}
