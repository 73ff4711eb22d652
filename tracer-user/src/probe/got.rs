//! The GOT entries through which the target's modules call the lock
//! functions (`--mode inproc`): read from each module's dynamic
//! relocations, placed at their addresses in the target. Pure: files and
//! maps in, addresses out.
use std::collections::BTreeSet;

use object::{
    Object, ObjectSection, ObjectSegment, ObjectSymbol, ObjectSymbolTable, RelocationTarget,
};
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
    /// Where the module's code lies in the target.
    pub module_code: (u64, u64),
    /// Where its PLT stubs lie (`.plt`, `.plt.sec`): an entry not bound
    /// yet holds the address of one. Any other address in the module's
    /// code is the program's own hook, never taken for the lazy binder.
    /// (0, 0) when the module has no section headers.
    pub plt: (u64, u64),
}

impl GotSlot {
    /// Whether `value` is this entry's lazy-binding address (its PLT).
    pub fn is_lazy(&self, value: u64) -> bool {
        (self.plt.0..self.plt.1).contains(&value)
    }
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
        // Not locktrace's own stub mapping (shared memory, no ELF file).
        .filter(|m| m.is_file() && m.is_executable() && !m.path.starts_with("/dev/zero"))
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
pub(crate) fn module_got(
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
        let plt = plt_range(elf);
        for (address, module_code) in addresses_of(elf, maps, path, offset) {
            let bias = address.wrapping_sub(offset);
            got.slots.push(GotSlot {
                op,
                module: path.to_string(),
                address,
                module_code,
                plt: plt.map_or((0, 0), |(start, end)| {
                    (bias.wrapping_add(start), bias.wrapping_add(end))
                }),
            });
        }
    }
    got.slots.sort_by_key(|slot| slot.address);
    got.slots.dedup_by_key(|slot| slot.address);
    got
}

/// The link-time span of the module's PLT sections (`.plt`, `.plt.sec`).
fn plt_range(elf: &object::File<'_>) -> Option<(u64, u64)> {
    elf.sections()
        .filter(|section| matches!(section.name(), Ok(".plt" | ".plt.sec")))
        .map(|section| (section.address(), section.address() + section.size()))
        .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
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

/// Each loaded copy of the module at `path`: its load bias (runtime
/// address less link-time address) and its code range. A copy starts at
/// a mapping of file offset 0; the mappings up to the next such one are
/// its own. (A file page can be mapped twice in one copy, read-only data
/// and RELRO sharing a page: addresses come from the bias, never from a
/// file offset.)
fn copies(maps: &[Mapping], path: &str, first_load: u64) -> Vec<(u64, (u64, u64))> {
    let own: Vec<&Mapping> = maps.iter().filter(|m| m.path == path).collect();
    let starts: Vec<usize> = (0..own.len()).filter(|&i| own[i].offset == 0).collect();
    starts
        .iter()
        .enumerate()
        .map(|(n, &first)| {
            let last = starts.get(n + 1).copied().unwrap_or(own.len());
            let bias = own[first].start.wrapping_sub(first_load & !0xfff);
            let code = own[first..last]
                .iter()
                .find(|m| m.is_executable())
                .map_or((0, 0), |m| (m.start, m.end));
            (bias, code)
        })
        .collect()
}

/// The link-time address of the module's first loadable segment.
fn first_load_address(elf: &object::File<'_>) -> u64 {
    elf.segments()
        .map(|segment| segment.address())
        .min()
        .unwrap_or(0)
}

/// The runtime address of link-time `address` in every loaded copy, with
/// that copy's code range.
fn addresses_of(
    elf: &object::File<'_>,
    maps: &[Mapping],
    path: &str,
    address: u64,
) -> Vec<(u64, (u64, u64))> {
    copies(maps, path, first_load_address(elf))
        .into_iter()
        .map(|(bias, code)| (bias.wrapping_add(address), code))
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
    fn each_copy_has_its_bias_and_code_even_with_a_file_page_mapped_twice() {
        let maps = [
            mapping(0x10000, 0x11000, "r--p", 0),
            mapping(0x11000, 0x12000, "r-xp", 0x1000),
            mapping(0x12000, 0x13000, "r--p", 0x2000),
            // The same file page again: RELRO, then the writable data.
            mapping(0x13000, 0x14000, "r--p", 0x2000),
            mapping(0x14000, 0x15000, "rw-p", 0x3000),
            mapping(0x90000, 0x91000, "r--p", 0),
            mapping(0x91000, 0x92000, "r-xp", 0x1000),
        ];
        assert_eq!(
            copies(&maps, "/lib/x.so", 0),
            vec![(0x10000, (0x11000, 0x12000)), (0x90000, (0x91000, 0x92000))]
        );
        // A non-PIE executable linked at 0x400000 and loaded there.
        assert_eq!(
            copies(&maps[..2], "/lib/x.so", 0x10000),
            vec![(0, (0x11000, 0x12000))]
        );
    }
}
