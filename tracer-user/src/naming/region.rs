//! The target's address space as the namer needs it: its mappings and, for
//! each ELF module, where it was loaded (bias) and how far it extends
//! (including .bss that the kernel maps anonymously after the file).
use std::{collections::BTreeMap, fs::File, io::Read, path::Path};

use super::elf::ModuleSymbols;
use crate::probe::target::Mapping;

/// One ELF module mapped in the target.
#[derive(Debug)]
pub struct LoadedModule {
    /// Path as the target sees it.
    pub path: String,
    /// Runtime address minus link-time address.
    pub bias: u64,
    /// Runtime extent of all its loadable segments.
    pub start: u64,
    pub end: u64,
    pub symbols: ModuleSymbols,
}

const ARENA_ALIGN: u64 = 64 << 20;

/// Stack pointers of the threads of `pid` that are blocked (in a syscall or
/// not): /proc/PID/task/TID/syscall ends with `sp pc`; running threads say
/// only `running`.
pub fn thread_stack_pointers(pid: u32) -> Vec<u64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("syscall")).ok())
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let sp = fields.len().checked_sub(2).and_then(|i| fields.get(i))?;
            u64::from_str_radix(sp.strip_prefix("0x")?, 16).ok()
        })
        .collect()
}

/// Region of heap memory inside a module's mapping (see `region_of`).
pub const SPARE_HEAP: &str = "heap (module page tail)";

impl LoadedModule {
    /// End of the module's last allocated section: what follows up to `end`
    /// is spare, and the dynamic linker may use it as heap.
    pub fn spare_start(&self) -> u64 {
        let last = self
            .symbols
            .sections
            .iter()
            .map(|s| s.address.saturating_add(s.size))
            .max()
            .unwrap_or(0);
        last.wrapping_add(self.bias).max(self.start)
    }

    pub fn contains(&self, address: u64) -> bool {
        (self.start..self.end).contains(&address)
    }

    /// Link-time address of a runtime address in this module.
    pub fn link_address(&self, address: u64) -> u64 {
        address.wrapping_sub(self.bias)
    }
}

#[derive(Debug, Default)]
pub struct AddressSpace {
    pub maps: Vec<Mapping>,
    pub modules: Vec<LoadedModule>,
    /// Start addresses of mappings seen holding a thread's stack pointer.
    pub thread_stacks: std::collections::BTreeSet<u64>,
}

impl AddressSpace {
    /// Builds the address space from a maps snapshot and open module files.
    pub fn build(
        maps: Vec<Mapping>,
        files: &mut BTreeMap<String, File>,
        root: Option<&Path>,
    ) -> AddressSpace {
        let mut modules = Vec::new();
        for (path, file) in files.iter_mut() {
            let mut data = Vec::new();
            if std::io::Seek::rewind(file).is_err() || file.read_to_end(&mut data).is_err() {
                continue;
            }
            let Ok(symbols) = ModuleSymbols::parse(&data, path, root) else {
                continue;
            };
            let Some(bias) = load_bias(&maps, path, &symbols) else {
                continue;
            };
            let start = symbols
                .segments
                .iter()
                .map(|s| s.address)
                .min()
                .unwrap_or(0)
                .wrapping_add(bias);
            let end = symbols
                .segments
                .iter()
                .map(|s| {
                    s.address
                        .saturating_add(s.memory_size)
                        .saturating_add(0xfff)
                        & !0xfff
                })
                .max()
                .unwrap_or(0)
                .wrapping_add(bias);
            modules.push(LoadedModule {
                path: path.clone(),
                bias,
                start,
                end,
                symbols,
            });
        }
        AddressSpace {
            maps,
            modules,
            thread_stacks: Default::default(),
        }
    }

    pub fn module_of(&self, address: u64) -> Option<&LoadedModule> {
        self.modules.iter().find(|module| module.contains(address))
    }

    /// Memory where malloc'ed objects can be: writable anonymous mappings
    /// and [heap] outside modules, and spare tails of module pages.
    pub fn heap_ranges(&self) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = self
            .maps
            .iter()
            .filter(|m| {
                m.perms.starts_with("rw")
                    && !m.is_file()
                    && (m.path.is_empty() || m.path == "[heap]")
            })
            .filter(|m| self.module_of(m.start).is_none())
            .map(|m| (m.start, m.end))
            .collect();
        ranges.extend(
            self.modules
                .iter()
                .map(|m| (m.spare_start(), m.end))
                .filter(|(start, end)| start < end),
        );
        ranges
    }

    /// Which kind of memory holds `address`: a module section (`.data`,
    /// `.bss`, …), `[heap]`, `[stack]`, `thread stack`, `anonymous`, a mapped
    /// file, or `unknown` (not mapped when the maps were read).
    pub fn region_of(&self, address: u64) -> String {
        if let Some(module) = self.module_of(address) {
            return match module.symbols.section_at(module.link_address(address)) {
                Some(section) => section.name.clone(),
                // musl's dynamic linker gives the unused tail of a module's
                // last data page to malloc.
                None if module.spare_start() <= address => SPARE_HEAP.into(),
                None => "module".into(),
            };
        }
        let Some(index) = self
            .maps
            .iter()
            .position(|mapping| mapping.contains(address))
        else {
            return "unknown".into(); // not mapped when the maps were read
        };
        let mapping = &self.maps[index];
        if mapping.path.starts_with('[') {
            return mapping.path.clone();
        }
        if mapping.is_file() {
            return format!("file {}", mapping.path);
        }
        if self.thread_stacks.contains(&mapping.start) {
            return "thread stack".into();
        }
        // glibc's per-thread malloc arenas: 64 MiB-aligned, the unused rest
        // of the 64 MiB reserved (no access) right above.
        let above = self.maps.get(index + 1);
        let reserve_above =
            above.is_some_and(|next| next.start == mapping.end && next.perms.starts_with("---"));
        if mapping.start.is_multiple_of(ARENA_ALIGN) && reserve_above {
            return "malloc arena".into();
        }
        // glibc and musl put a no-access guard page right below each thread
        // stack.
        let below = index.checked_sub(1).map(|i| &self.maps[i]);
        if below.is_some_and(|guard| {
            guard.end == mapping.start && guard.perms.starts_with("---") && guard.path.is_empty()
        }) {
            return "thread stack".into();
        }
        "anonymous".into()
    }
}

/// Runtime minus link-time address, from the first mapping of the module
/// whose file offset lies in a loadable segment.
fn load_bias(maps: &[Mapping], path: &str, symbols: &ModuleSymbols) -> Option<u64> {
    maps.iter()
        .filter(|mapping| mapping.path == path)
        .find_map(|mapping| {
            let segment = symbols.segments.iter().find(|segment| {
                let page_start = segment.offset & !0xfff;
                mapping.offset >= page_start
                    && mapping.offset < segment.offset.saturating_add(segment.file_size.max(1))
            })?;
            // runtime(mapping.start) = bias + link address of file offset mapping.offset
            let link = segment
                .address
                .wrapping_add(mapping.offset)
                .wrapping_sub(segment.offset);
            Some(mapping.start.wrapping_sub(link))
        })
}
