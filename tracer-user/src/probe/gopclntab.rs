//! Go's function table, `.gopclntab`: the runtime's own list of every Go
//! function (name, entry, end), which survives `-ldflags "-w -s"` and
//! `strip` because the Go runtime needs it for tracebacks. It names Go code
//! where a stripped binary has no `.symtab`: `runtime.futex` for the wait
//! classification, FrankenPHP's Go functions for recognising the server and
//! counting its requests, Go frames in stacks.
//!
//! Layout (Go 1.18 and later; `runtime/symtab.go`, `pcHeader` and `_func`):
//! a header (magic, pointer size, function count, then offsets of the name
//! table and of the function table from the header), the function table
//! (`nfunc + 1` pairs `{entry offset, _func offset}`, sorted, the last entry
//! offset being the end of the last function), each `_func` starting with
//! `{entry offset u32, name offset i32}`. Entry offsets count from the
//! start of Go's text (`runtime.text`), which since Go 1.22 is no longer in
//! the header (it needed a relocation): it is read from the module data
//! (`runtime.firstmoduledata`), the one structure whose first word points at
//! the header, as the runtime itself reads it. In a cgo program linked by
//! the C linker Go's text does not start the `.text` section (C startup
//! code comes first), so the section's address would be wrong.
//!
//! [`GoTable::parse`] reads bytes only (no file, no syscall); [`read`]
//! finds the section by name in an ELF file, and says so, without guessing,
//! when the file has no section headers.
use object::{Object, ObjectSection, SectionFlags, elf};

/// Go 1.18 and 1.19's header magic; the fields read here are the same.
const MAGIC_GO118: u32 = 0xffff_fff0;
/// Go 1.20 and later.
const MAGIC_GO120: u32 = 0xffff_fff1;
/// Header bytes before the pointer-sized fields.
const HEADER_FIXED: usize = 8;
/// Pointer-sized words in the header: nfunc, nfiles, (textStart), then the
/// name, cu, file, pc and function table offsets.
const HEADER_WORDS: usize = 8;
/// The module data's word holding `text`: after `pcHeader`, six slices
/// (three words each), `findfunctab`, `minpc` and `maxpc`.
const MODULEDATA_TEXT_WORD: usize = 1 + 6 * 3 + 3;

/// Why a file's Go functions cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoTableError {
    #[error(
        "it has no section headers (sstrip, or a packer): Go's function table (.gopclntab) cannot be found"
    )]
    NoSectionHeaders,
    #[error("it has no .gopclntab section (not a Go program)")]
    NotGo,
    #[error(".gopclntab has magic {0:#x}, of a Go version before 1.18 (not read)")]
    Unsupported(u32),
    #[error(".gopclntab is malformed ({0})")]
    Malformed(&'static str),
    #[error("no Go module data points at its .gopclntab: where Go's functions start is unknown")]
    NoModuleData,
}

/// One Go function: its name and its link-time range `[entry, end)` (the
/// end is the next function's entry: it includes the alignment padding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoFunction<'data> {
    pub name: &'data str,
    pub entry: u64,
    pub end: u64,
}

/// A parsed `.gopclntab`, borrowing its bytes.
#[derive(Debug, Clone)]
pub struct GoTable<'data> {
    data: &'data [u8],
    little_endian: bool,
    text_start: u64,
    nfunc: usize,
    /// Offset of the name table in `data`.
    names: usize,
    /// Offset of the function table in `data`.
    functab: usize,
}

/// The header fields this module uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub pointer_size: usize,
    pub nfunc: usize,
    pub names: usize,
    pub functab: usize,
}

impl Header {
    /// Reads and checks the header at the start of `data`.
    pub(crate) fn parse(data: &[u8], little_endian: bool) -> Result<Header, GoTableError> {
        let magic = read_u32(data, 0, little_endian).ok_or(GoTableError::Malformed("too short"))?;
        if magic != MAGIC_GO118 && magic != MAGIC_GO120 {
            return Err(GoTableError::Unsupported(magic));
        }
        let pointer_size = *data.get(7).ok_or(GoTableError::Malformed("too short"))? as usize;
        if pointer_size != 4 && pointer_size != 8 {
            return Err(GoTableError::Malformed("pointer size not 4 or 8"));
        }
        let word = |index: usize| {
            read_word(
                data,
                HEADER_FIXED + index * pointer_size,
                pointer_size,
                little_endian,
            )
            .and_then(|value| usize::try_from(value).ok())
            .ok_or(GoTableError::Malformed("header cut short"))
        };
        let header = Header {
            pointer_size,
            nfunc: word(0)?,
            names: word(3)?,
            functab: word(7)?,
        };
        // The function table's nfunc + 1 pairs must fit in the section.
        let table_bytes = header.nfunc.checked_add(1).and_then(|n| n.checked_mul(8));
        let fits = table_bytes
            .and_then(|bytes| header.functab.checked_add(bytes))
            .is_some_and(|end| end <= data.len());
        if !fits || header.names >= data.len() {
            return Err(GoTableError::Malformed("tables past the section's end"));
        }
        Ok(header)
    }

    /// Bytes the header takes.
    fn size(&self) -> usize {
        HEADER_FIXED + HEADER_WORDS * self.pointer_size
    }
}

impl<'data> GoTable<'data> {
    /// Parses `data` (the section's bytes); `text_start` is where Go's
    /// text starts (the module data's `text`), at link time.
    pub(crate) fn parse(
        data: &'data [u8],
        little_endian: bool,
        text_start: u64,
    ) -> Result<GoTable<'data>, GoTableError> {
        let header = Header::parse(data, little_endian)?;
        if header.functab < header.size() {
            return Err(GoTableError::Malformed("function table inside the header"));
        }
        Ok(GoTable {
            data,
            little_endian,
            text_start,
            nfunc: header.nfunc,
            names: header.names,
            functab: header.functab,
        })
    }

    /// How many functions the table lists.
    pub(crate) fn len(&self) -> usize {
        self.nfunc
    }

    /// Where Go's text starts, at link time.
    pub fn text_start(&self) -> u64 {
        self.text_start
    }

    /// The `(entry offset, _func offset)` pair `index` of the function table.
    fn pair(&self, index: usize) -> Option<(u32, u32)> {
        let at = self.functab.checked_add(index.checked_mul(8)?)?;
        Some((
            read_u32(self.data, at, self.little_endian)?,
            read_u32(self.data, at + 4, self.little_endian)?,
        ))
    }

    /// Function `index`; None where the table is malformed there.
    pub(crate) fn function(&self, index: usize) -> Option<GoFunction<'data>> {
        if index >= self.nfunc {
            return None;
        }
        let (entry, func) = self.pair(index)?;
        let (end, _) = self.pair(index + 1)?;
        let func = self.functab.checked_add(func as usize)?;
        let name_offset = read_u32(self.data, func + 4, self.little_endian)?;
        let name_at = self.names.checked_add(name_offset as usize)?;
        let rest = self.data.get(name_at..)?;
        let length = memchr::memchr(0, rest)?;
        let name = std::str::from_utf8(&rest[..length]).ok()?;
        Some(GoFunction {
            name,
            entry: self.text_start + u64::from(entry),
            end: self.text_start + u64::from(end.max(entry)),
        })
    }

    /// Every readable function, in address order.
    pub fn functions(&self) -> impl Iterator<Item = GoFunction<'data>> + '_ {
        (0..self.nfunc).filter_map(|index| self.function(index))
    }

    /// The function containing the link-time `address`.
    pub fn at(&self, address: u64) -> Option<GoFunction<'data>> {
        let offset = u32::try_from(address.checked_sub(self.text_start)?).ok()?;
        // The first pair whose entry is past `offset`; the one before holds it.
        let (mut low, mut high) = (0, self.nfunc);
        while low < high {
            let middle = low + (high - low) / 2;
            if self.pair(middle)?.0 <= offset {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        let found = self.function(low.checked_sub(1)?)?;
        (address < found.end).then_some(found)
    }

    /// The function named `name` (Go's name: `runtime.futex`,
    /// `github.com/dunglas/frankenphp.go_update_request_info`).
    pub fn named(&self, name: &str) -> Option<GoFunction<'data>> {
        self.functions().find(|function| function.name == name)
    }
}

/// The Go function table of an ELF file, its text start read from the
/// module data. Errors say why there is none.
pub fn read<'data>(file: &object::File<'data>) -> Result<GoTable<'data>, GoTableError> {
    // Section 0 is the null section: a file with headers has more.
    if file.sections().nth(1).is_none() {
        return Err(GoTableError::NoSectionHeaders);
    }
    // PIE binaries put it in a writable section (it holds relocated words).
    let section = file
        .section_by_name(".gopclntab")
        .or_else(|| file.section_by_name(".data.rel.ro.gopclntab"))
        .ok_or(GoTableError::NotGo)?;
    let data = section
        .data()
        .map_err(|_| GoTableError::Malformed("section data unreadable"))?;
    let little_endian = file.is_little_endian();
    let header = Header::parse(data, little_endian)?;
    let text_start = text_start(file, section.address(), &header)?;
    GoTable::parse(data, little_endian, text_start)
}

/// `text` of the module data whose `pcHeader` is `table_address` and whose
/// `funcnametab` starts where the header says: Go 1.26 puts it in
/// `.go.module`, earlier versions in `.noptrdata`; every writable section
/// is searched. A position-independent executable has those words as
/// relocations (their addends) rather than in the file.
fn text_start(
    file: &object::File,
    table_address: u64,
    header: &Header,
) -> Result<u64, GoTableError> {
    let size = header.pointer_size;
    let little = file.is_little_endian();
    let names_address = table_address + header.names as u64;
    let relocated = relocated_words(file);
    for section in file.sections() {
        let writable = match section.flags() {
            SectionFlags::Elf { sh_flags } => sh_flags & u64::from(elf::SHF_WRITE) != 0,
            _ => false,
        };
        let Ok(data) = section.data() else { continue };
        if !writable || data.is_empty() {
            continue;
        }
        let base = section.address();
        let word_at = |offset: usize| -> Option<u64> {
            let address = base + offset as u64;
            relocated
                .get(&address)
                .copied()
                .or_else(|| read_word(data, offset, size, little).filter(|&value| value != 0))
        };
        for offset in (0..data.len().saturating_sub(size)).step_by(size) {
            if word_at(offset) == Some(table_address)
                && word_at(offset + size) == Some(names_address)
                && let Some(text) = word_at(offset + MODULEDATA_TEXT_WORD * size)
            {
                return Ok(text);
            }
        }
    }
    Err(GoTableError::NoModuleData)
}

/// The addends of a PIE's relative relocations, by the address they fill
/// (empty for a fixed-address executable).
fn relocated_words(file: &object::File) -> std::collections::HashMap<u64, u64> {
    if file.kind() != object::ObjectKind::Dynamic {
        return std::collections::HashMap::new();
    }
    file.dynamic_relocations()
        .into_iter()
        .flatten()
        .filter(|(_, relocation)| matches!(relocation.target(), object::RelocationTarget::Absolute))
        .filter_map(|(address, relocation)| {
            Some((address, u64::try_from(relocation.addend()).ok()?))
        })
        .collect()
}

fn read_u32(data: &[u8], at: usize, little_endian: bool) -> Option<u32> {
    let bytes: [u8; 4] = data.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(if little_endian {
        u32::from_le_bytes(bytes)
    } else {
        u32::from_be_bytes(bytes)
    })
}

fn read_word(data: &[u8], at: usize, size: usize, little_endian: bool) -> Option<u64> {
    if size == 4 {
        return read_u32(data, at, little_endian).map(u64::from);
    }
    let bytes: [u8; 8] = data.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(if little_endian {
        u64::from_le_bytes(bytes)
    } else {
        u64::from_be_bytes(bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table as Go's linker lays it out (64-bit, little-endian): header,
    /// name table, function table, then the `_func` records.
    fn table(functions: &[(&str, u32)], end: u32, magic: u32) -> Vec<u8> {
        let mut names = Vec::new();
        let mut name_offsets = Vec::new();
        for (name, _) in functions {
            name_offsets.push(names.len() as u32);
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        let header_size = HEADER_FIXED + HEADER_WORDS * 8;
        let names_at = header_size;
        let functab_at = names_at + names.len();
        let mut data = Vec::new();
        data.extend_from_slice(&magic.to_le_bytes());
        data.extend_from_slice(&[0, 0, 1, 8]);
        let words = [functions.len(), 1, 0, names_at, 0, 0, 0, functab_at];
        for word in words {
            data.extend_from_slice(&(word as u64).to_le_bytes());
        }
        data.extend_from_slice(&names);
        // _func records follow the nfunc + 1 pairs.
        let records_at = (functions.len() + 1) * 8;
        for (index, (_, entry)) in functions.iter().enumerate() {
            data.extend_from_slice(&entry.to_le_bytes());
            data.extend_from_slice(&((records_at + index * 8) as u32).to_le_bytes());
        }
        data.extend_from_slice(&end.to_le_bytes());
        data.extend_from_slice(&0u32.to_le_bytes());
        for (index, (_, entry)) in functions.iter().enumerate() {
            data.extend_from_slice(&entry.to_le_bytes());
            data.extend_from_slice(&name_offsets[index].to_le_bytes());
        }
        data
    }

    const FUNCTIONS: [(&str, u32); 3] = [
        ("internal/abi.(*RegArgs).Dump", 0),
        ("runtime.futex", 0x2a0),
        (
            "github.com/dunglas/frankenphp.go_update_request_info",
            0x300,
        ),
    ];

    #[test]
    fn names_addresses_and_finds_names() {
        let data = table(&FUNCTIONS, 0x480, MAGIC_GO120);
        let go = GoTable::parse(&data, true, 0x404d80).unwrap();
        assert_eq!(go.len(), 3);
        let futex = GoFunction {
            name: "runtime.futex",
            entry: 0x404d80 + 0x2a0,
            end: 0x404d80 + 0x300,
        };
        assert_eq!(go.named("runtime.futex"), Some(futex));
        assert_eq!(go.at(0x404d80 + 0x2a0), Some(futex));
        assert_eq!(go.at(0x404d80 + 0x2ff), Some(futex));
        let last = go.at(0x404d80 + 0x47f).unwrap();
        assert_eq!(
            (last.name, last.entry, last.end),
            (FUNCTIONS[2].0, 0x404d80 + 0x300, 0x404d80 + 0x480)
        );
        assert_eq!(go.at(0x404d80).unwrap().name, FUNCTIONS[0].0);
        // Before Go's text (C startup code) and past its end: no Go function.
        assert_eq!(go.at(0x404d7f), None);
        assert_eq!(go.at(0x404d80 + 0x480), None);
        assert_eq!(go.named("runtime.futex.abi0"), None);
        let names: Vec<&str> = go.functions().map(|f| f.name).collect();
        assert_eq!(names, FUNCTIONS.map(|(name, _)| name));
        // Go 1.18's magic: the same fields.
        let data = table(&FUNCTIONS, 0x480, MAGIC_GO118);
        assert_eq!(GoTable::parse(&data, true, 0).unwrap().len(), 3);
    }

    #[test]
    fn old_and_broken_tables_are_errors_not_panics() {
        let data = table(&FUNCTIONS, 0x480, 0xffff_fffb);
        assert_eq!(
            GoTable::parse(&data, true, 0).unwrap_err(),
            GoTableError::Unsupported(0xffff_fffb)
        );
        let data = table(&FUNCTIONS, 0x480, MAGIC_GO120);
        for cut in [0, 3, 20, 90, data.len() - 1] {
            match GoTable::parse(&data[..cut], true, 0) {
                Err(GoTableError::Malformed(_)) => {}
                Ok(go) => {
                    // Whatever the table still lists is read without panicking.
                    let _ = go.functions().count();
                    let _ = go.at(0x2a0);
                }
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        // A function count far past the section's end.
        let mut huge = data.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            GoTable::parse(&huge, true, 0),
            Err(GoTableError::Malformed(_))
        ));
        // A name offset past the end: that function is skipped, not a panic.
        let mut bad_name = data;
        let last_record = bad_name.len() - 4;
        bad_name[last_record..].copy_from_slice(&u32::MAX.to_le_bytes());
        let go = GoTable::parse(&bad_name, true, 0).unwrap();
        assert_eq!(go.functions().count(), 2);
        assert_eq!(go.function(2), None);
    }

    #[test]
    fn errors_say_why_in_one_line() {
        for error in [
            GoTableError::NoSectionHeaders,
            GoTableError::NotGo,
            GoTableError::Unsupported(0xffff_fffa),
            GoTableError::NoModuleData,
        ] {
            assert!(!error.to_string().contains('\n'));
        }
        // This test binary is Rust: its section headers are there, no table.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let elf = object::File::parse(&*me).unwrap();
        assert_eq!(read(&elf).unwrap_err(), GoTableError::NotGo);
        // The same file with its section headers gone (as sstrip leaves
        // it): said so, not guessed from the bytes.
        let mut headless = me.clone();
        headless[0x28..0x30].fill(0); // e_shoff
        headless[0x3c..0x40].fill(0); // e_shnum, e_shstrndx
        let elf = object::File::parse(&*headless).unwrap();
        assert_eq!(read(&elf).unwrap_err(), GoTableError::NoSectionHeaders);
    }
}
