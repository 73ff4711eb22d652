//! The GOT entries through which the target's modules call the lock
//! functions (`--mode inproc`): read from each module's dynamic
//! relocations, placed at their addresses in the target. Pure: files and
//! maps in, addresses out.
use std::collections::BTreeSet;

use object::{Object, ObjectSegment, ObjectSymbol, ObjectSymbolTable, RelocationTarget};
use tracer_common::LockOp;

use super::target::{Mapping, Target};

/// `R_X86_64_GLOB_DAT`: a GOT entry loaded by `call *foo@GOTPCREL(%rip)`
/// (`-fno-plt`) or when the address is taken.
const R_X86_64_GLOB_DAT: u32 = 6;
/// `R_X86_64_JUMP_SLOT`: a PLT's GOT entry.
const R_X86_64_JUMP_SLOT: u32 = 7;
/// `DT_FLAGS` bit `DF_BIND_NOW`, `DT_FLAGS_1` bit `DF_1_NOW`.
const DF_BIND_NOW: u64 = 0x8;
const DF_1_NOW: u64 = 0x1;

/// One GOT entry of one loaded copy of a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GotSlot {
    pub op: LockOp,
    /// Module path as the target sees it.
    pub module: String,
    /// The entry's address in the target.
    pub address: u64,
    /// Where the module's code lies in the target (the lazy binder's PLT
    /// address an unresolved entry holds is in it).
    pub module_code: (u64, u64),
}

/// A module's relocations against the lock functions, and how it binds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleGot {
    pub module: String,
    pub slots: Vec<GotSlot>,
    /// Linked with `-z now` (its GOT is read-only once started).
    pub bind_now: bool,
}

/// Every module of the target with GOT entries for the `ops`, in the
/// order of the maps; modules that could not be read are returned apart
/// with why.
pub fn find(target: &Target, ops: &[LockOp]) -> (Vec<ModuleGot>, Vec<(String, String)>) {
    let paths: BTreeSet<&str> = target
        .maps
        .iter()
        .filter(|m| m.is_file() && m.is_executable())
        .map(|m| m.path.as_str())
        .collect();
    let mut found = Vec::new();
    let mut unreadable = Vec::new();
    for path in paths {
        let file = match target.module_file(path) {
            Ok(file) => file,
            Err(error) => {
                unreadable.push((path.to_string(), format!("{error:#}")));
                continue;
            }
        };
        let Ok(elf) = file.elf() else {
            continue;
        };
        let got = module_got(&elf, path, &target.maps, ops);
        if !got.slots.is_empty() {
            found.push(got);
        }
    }
    (found, unreadable)
}

/// One module's GOT entries for `ops`, at every loaded copy of it.
pub fn module_got(
    elf: &object::File<'_>,
    path: &str,
    maps: &[Mapping],
    ops: &[LockOp],
) -> ModuleGot {
    let mut got = ModuleGot {
        module: path.to_string(),
        bind_now: binds_now(elf),
        slots: Vec::new(),
    };
    let (Some(symbols), Some(relocations)) =
        (elf.dynamic_symbol_table(), elf.dynamic_relocations())
    else {
        return got;
    };
    let code = code_ranges(maps, path);
    for (offset, relocation) in relocations {
        let object::RelocationFlags::Elf { r_type } = relocation.flags() else {
            continue;
        };
        if r_type != R_X86_64_GLOB_DAT && r_type != R_X86_64_JUMP_SLOT {
            continue;
        }
        let RelocationTarget::Symbol(index) = relocation.target() else {
            continue;
        };
        let Some(name) = symbols
            .symbol_by_index(index)
            .ok()
            .and_then(|symbol| symbol.name().ok())
        else {
            continue;
        };
        let name = name.split('@').next().unwrap_or(name);
        let Some(&op) = ops.iter().find(|op| op.symbol() == name) else {
            continue;
        };
        let Some(file_offset) = file_offset_of(elf, offset) else {
            continue;
        };
        for (address, module_code) in addresses_of(maps, path, file_offset, &code) {
            got.slots.push(GotSlot {
                op,
                module: path.to_string(),
                address,
                module_code,
            });
        }
    }
    got.slots.sort_by_key(|slot| slot.address);
    got.slots.dedup_by_key(|slot| slot.address);
    got
}

/// Where the symbol `name` (a data or function symbol, dynamic or not)
/// of the module at `path` lies in the target, per loaded copy.
pub fn symbol_addresses(
    elf: &object::File<'_>,
    path: &str,
    maps: &[Mapping],
    name: &str,
) -> Vec<u64> {
    let Some(symbol) = elf
        .dynamic_symbols()
        .chain(elf.symbols())
        .find(|symbol| symbol.is_definition() && symbol.name().is_ok_and(|n| n == name))
    else {
        return Vec::new();
    };
    let Some(file_offset) = file_offset_of(elf, symbol.address()) else {
        return Vec::new();
    };
    addresses_of(maps, path, file_offset, &[])
        .into_iter()
        .map(|(address, _)| address)
        .collect()
}

/// `-z now`: `DF_BIND_NOW`, `DF_1_NOW` or a `DT_BIND_NOW` entry.
fn binds_now(elf: &object::File<'_>) -> bool {
    let object::File::Elf64(elf) = elf else {
        return false;
    };
    let endian = elf.endian();
    let Ok(Some((entries, _))) = elf.elf_section_table().dynamic(endian, elf.data()) else {
        return false;
    };
    entries.iter().any(|entry| {
        let tag = entry.d_tag.get(endian) as u32;
        let value = entry.d_val.get(endian);
        match tag {
            object::elf::DT_BIND_NOW => true,
            object::elf::DT_FLAGS => value & DF_BIND_NOW != 0,
            object::elf::DT_FLAGS_1 => value & DF_1_NOW != 0,
            _ => false,
        }
    })
}

/// The file offset of the virtual address `address` of `elf`.
fn file_offset_of(elf: &object::File<'_>, address: u64) -> Option<u64> {
    elf.segments().find_map(|segment| {
        let (file_start, file_size) = segment.file_range();
        let start = segment.address();
        (start..start + file_size)
            .contains(&address)
            .then(|| file_start + (address - start))
    })
}

/// Each loaded copy's code range: a copy starts at a mapping of file
/// offset 0 (the executable mappings that follow it belong to it).
fn code_ranges(maps: &[Mapping], path: &str) -> Vec<(u64, u64)> {
    maps.iter()
        .filter(|m| m.path == path && m.is_executable())
        .map(|m| (m.start, m.end))
        .collect()
}

/// The address of `file_offset` in every mapping of `path` that covers
/// it, with the code range of the same copy (the executable mapping just
/// before it).
fn addresses_of(
    maps: &[Mapping],
    path: &str,
    file_offset: u64,
    code: &[(u64, u64)],
) -> Vec<(u64, (u64, u64))> {
    maps.iter()
        .filter(|m| m.path == path)
        .filter(|m| (m.offset..m.offset + (m.end - m.start)).contains(&file_offset))
        .map(|m| {
            let address = m.start + (file_offset - m.offset);
            let copy_code = code
                .iter()
                .rev()
                .find(|(start, _)| *start <= address)
                .copied()
                .unwrap_or((0, 0));
            (address, copy_code)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, end: u64, perms: &str, offset: u64) -> Mapping {
        Mapping {
            start,
            end,
            perms: perms.into(),
            offset,
            path: "/lib/x.so".into(),
        }
    }

    #[test]
    fn a_file_offset_lands_in_each_copy_with_its_code() {
        let maps = [
            mapping(0x10000, 0x11000, "r--p", 0),
            mapping(0x11000, 0x13000, "r-xp", 0x1000),
            mapping(0x13000, 0x14000, "r--p", 0x3000),
            mapping(0x14000, 0x15000, "rw-p", 0x4000),
            mapping(0x90000, 0x91000, "r--p", 0),
            mapping(0x91000, 0x93000, "r-xp", 0x1000),
            mapping(0x93000, 0x94000, "r--p", 0x3000),
            mapping(0x94000, 0x95000, "rw-p", 0x4000),
        ];
        let code = code_ranges(&maps, "/lib/x.so");
        assert_eq!(
            addresses_of(&maps, "/lib/x.so", 0x4010, &code),
            vec![(0x14010, (0x11000, 0x13000)), (0x94010, (0x91000, 0x93000))]
        );
    }
}
