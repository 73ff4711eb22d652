//! Names a person would write for a lock: the variable and the fields that
//! hold it, from the module's DWARF (`g_registry.locks[2]`,
//! `*g_global_stats->LOCK_access`), else offsets from its symbol
//! (`g_registry+0x40`, `*g_global_stats->+0x10`), in C notation; and, when several
//! pointer chains reach one heap lock, the route a person would take.
//!
//! Route choice, first difference wins: a chain ending right at the lock
//! (not inside a bigger object), a root that is itself a pointer variable,
//! fewer pointer hops, fewer fields, the executable before libraries,
//! shorter text.
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use super::{
    chain::{RawChain, c_notation},
    cpython::{self, GilLayout},
    declared,
    dwarf::{self, DebugInfo, FieldPath, Want},
    elf::Symbol,
    mysqlnd,
    region::{AddressSpace, LoadedModule},
};
use crate::{
    model::{AlternativeName, DeclaredType, LockChain, LockKind},
    probe::modules::ModuleFile,
};

/// A lock's names: for people, in offsets, and the raw chain.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Named {
    pub name: String,
    pub offset_name: String,
    pub chain: LockChain,
    /// The lock's type and the type holding it, from DWARF.
    pub declared: Option<DeclaredType>,
    rank: (bool, bool, usize, usize, u8, usize),
}

impl Named {
    pub(crate) fn alternative(&self) -> AlternativeName {
        AlternativeName {
            name: self.name.clone(),
            offset_name: self.offset_name.clone(),
            chain: self.chain.clone(),
        }
    }
}

/// Bytes a lock of `kind` spans: where naming stops descending into fields
/// (a bare futex word is one `u32`).
pub(crate) fn lock_span(kind: LockKind) -> u64 {
    match kind {
        LockKind::Futex => 4,
        other => other.span(),
    }
}

/// Reads DWARF on demand, once per module, and names with it.
pub(crate) struct Namer<'a> {
    space: &'a AddressSpace,
    files: &'a BTreeMap<String, Arc<ModuleFile>>,
    debug: HashMap<String, Option<(Arc<DebugInfo>, String)>>,
    /// Each module's CPython GIL layout, when it is a CPython locktrace has
    /// a table for.
    cpython: HashMap<String, Option<&'static GilLayout>>,
    /// Each module's PHP version, when it is PHP (for mysqlnd's table).
    php: HashMap<String, Option<String>>,
}

impl<'a> Namer<'a> {
    pub(crate) fn new(
        space: &'a AddressSpace,
        files: &'a BTreeMap<String, Arc<ModuleFile>>,
    ) -> Namer<'a> {
        Namer {
            space,
            files,
            debug: HashMap::new(),
            cpython: HashMap::new(),
            php: HashMap::new(),
        }
    }

    /// `module <- DWARF file (N variables, T ms)` for each module whose DWARF was read.
    pub(crate) fn debug_info_used(&self) -> Vec<String> {
        let mut used: Vec<String> = self
            .debug
            .iter()
            .filter_map(|(module, found)| {
                let (info, file) = found.as_ref()?;
                Some(format!(
                    "{module} <- {file} ({} variables, {:.0} ms)",
                    info.variable_count(),
                    info.parse_time.as_secs_f64() * 1e3
                ))
            })
            .collect();
        used.sort();
        used
    }

    /// The module's DWARF: in the module file, else in its separate debug file.
    fn debug_info(&mut self, module: &LoadedModule) -> Option<Arc<DebugInfo>> {
        if let Some(known) = self.debug.get(&module.path) {
            return known.as_ref().map(|(info, _)| info.clone());
        }
        let found = self
            .files
            .get(&module.path)
            .and_then(|file| dwarf::load_module(file).map(|info| (info, module.path.clone())))
            .or_else(|| {
                let path = module.symbols.debug_path.as_ref()?;
                let info = dwarf::load_cached(path)?;
                Some((info, module.symbols.debug_file.clone().unwrap_or_default()))
            });
        self.debug.insert(module.path.clone(), found.clone());
        found.map(|(info, _)| info)
    }

    /// A lock in a module's data: `g_registry.locks[2]`, else `g_registry+0x40`.
    pub(crate) fn global(
        &mut self,
        module: &LoadedModule,
        link_address: u64,
        kind: LockKind,
    ) -> Option<Named> {
        let symbol = module.symbols.object_at(link_address);
        let typed = self.debug_info(module).and_then(|info| {
            let (variable, offset) = info.variable_at(link_address)?;
            let root = root_name(&variable.name, variable.address, symbol);
            let path = match variable.type_ref {
                Some(type_ref) => info.describe(
                    type_ref,
                    offset,
                    Want::Lock {
                        span: lock_span(kind),
                    },
                ),
                None => untyped(offset),
            };
            // The chain is relative to the symbol, as heap chains are.
            let (chain_root, chain_offset) = match symbol {
                Some((symbol, symbol_offset)) => (symbol.name.clone(), symbol_offset),
                None => (variable.name.clone(), offset),
            };
            Some((
                format!("{root}{}", path.text),
                LockChain {
                    module: module.path.clone(),
                    root: chain_root,
                    offsets: vec![chain_offset],
                },
                declared::declared(&path.types),
            ))
        });
        let offset_name = symbol.map(|(s, o)| s.with_offset(o));
        let (name, chain, declared) = match (typed, symbol) {
            (Some(typed), _) => typed,
            (None, Some((symbol, offset))) => {
                let (name, declared) = self
                    .gil_lock(module, symbol, offset, kind)
                    .map_or_else(|| (symbol.with_offset(offset), None), |(n, d)| (n, Some(d)));
                let chain = LockChain {
                    module: module.path.clone(),
                    root: symbol.name.clone(),
                    offsets: vec![offset],
                };
                (name, chain, declared)
            }
            (None, None) => return None,
        };
        Some(Named {
            offset_name: offset_name.unwrap_or_else(|| name.clone()),
            name,
            chain,
            declared,
            rank: Default::default(),
        })
    }

    /// A stripped CPython's GIL lock at `offset` in `_PyRuntime`, named and
    /// typed from locktrace's table for the module's version.
    fn gil_lock(
        &mut self,
        module: &LoadedModule,
        symbol: &Symbol,
        offset: u64,
        kind: LockKind,
    ) -> Option<(String, DeclaredType)> {
        if symbol.name != cpython::RUNTIME {
            return None;
        }
        let files = self.files;
        let layout = *self.cpython.entry(module.path.clone()).or_insert_with(|| {
            let file = files.get(&module.path)?;
            cpython::table_layout(cpython::python_version(&module.symbols, file.bytes())?)
        });
        cpython::gil_lock(layout?, symbol.size, offset, kind)
    }

    /// A chain a stripped module's version table names: mysqlnd's global
    /// statistics lock in PHP.
    fn table_chain(&mut self, raw: &RawChain, kind: LockKind) -> Option<TypedChain> {
        if raw.root != mysqlnd::GLOBAL_STATS {
            return None;
        }
        let files = self.files;
        let version = self
            .php
            .entry(raw.module.clone())
            .or_insert_with(|| super::php::php_version(files.get(&raw.module)?.bytes()));
        let (name, declared) =
            mysqlnd::global_lock(version.as_deref()?, &raw.root, &raw.offsets, kind)?;
        Some(TypedChain {
            name,
            fields: 1,
            pointer_root: true,
            declared: Some(declared),
        })
    }

    /// The best of the candidate chains to one heap lock, and the runner-up.
    pub(crate) fn choose(
        &mut self,
        candidates: &[RawChain],
        kind: LockKind,
    ) -> Option<(Named, Option<Named>)> {
        let mut named: Vec<Named> = candidates.iter().map(|c| self.chain(c, kind)).collect();
        named.sort_by(|a, b| (a.rank, a.name.len(), &a.name).cmp(&(b.rank, b.name.len(), &b.name)));
        named.dedup_by(|later, earlier| later.name == earlier.name);
        let mut named = named.into_iter();
        let best = named.next()?;
        Some((best, named.next()))
    }

    /// One chain in words where the DWARF knows the types, in offsets where not.
    pub(crate) fn chain(&mut self, raw: &RawChain, kind: LockKind) -> Named {
        let offset_name = raw.offset_name();
        let module = self.space.modules.iter().find(|m| m.path == raw.module);
        let info = module.and_then(|module| self.debug_info(module));
        let typed = info
            .and_then(|info| typed_chain(&info, raw, lock_span(kind), module))
            .or_else(|| self.table_chain(raw, kind));
        let TypedChain {
            name,
            fields,
            pointer_root,
            declared,
        } = typed.unwrap_or_else(|| TypedChain {
            name: offset_name.clone(),
            fields: raw.offsets.iter().filter(|&&o| o != 0).count(),
            pointer_root: raw.pointer_root(),
            declared: None,
        });
        Named {
            rank: (
                raw.offsets.last().is_some_and(|&o| o != 0),
                !pointer_root,
                raw.hops(),
                fields,
                raw.origin_class,
                0,
            ),
            name,
            offset_name,
            chain: LockChain {
                module: raw.module.clone(),
                root: raw.root.clone(),
                offsets: raw.offsets.clone(),
            },
            declared,
        }
    }
}

/// A chain through typed memory, in words.
struct TypedChain {
    name: String,
    /// Fields and indices named.
    fields: usize,
    /// The root is a pointer variable.
    pointer_root: bool,
    /// The lock's type at the chain's end.
    declared: Option<DeclaredType>,
}

/// A chain through typed memory, named.
fn typed_chain(
    info: &DebugInfo,
    raw: &RawChain,
    span: u64,
    module: Option<&LoadedModule>,
) -> Option<TypedChain> {
    let slot = raw.root_address.checked_add(*raw.offsets.first()?)?;
    let (variable, root_offset) = info.variable_at(slot)?;
    let symbol = module.and_then(|m| m.symbols.object_at(variable.address));
    let mut text = root_name(&variable.name, variable.address, symbol);
    let pointer_root = root_offset == 0 && info.is_pointer(variable.type_ref);
    let mut fields = 0;
    let mut current = variable.type_ref;
    let mut previous_piece = String::new();
    let mut declared = None;
    let last = raw.offsets.len() - 1;
    for (index, &offset) in raw.offsets.iter().enumerate() {
        let offset = if index == 0 { root_offset } else { offset };
        let want = if index == last {
            Want::Lock { span }
        } else {
            Want::Pointer
        };
        let Some(type_ref) = current else {
            // Untyped from here on (a `void *` on the way): offsets, as without DWARF.
            for (later, &rest) in raw.offsets.iter().enumerate().skip(index) {
                let rest = if later == 0 { root_offset } else { rest };
                if later > 0 {
                    text.push_str("->");
                }
                if rest != 0 {
                    text.push_str(&format!("+{rest:#x}"));
                    fields += 1;
                }
            }
            return Some(TypedChain {
                name: c_notation(&text),
                fields,
                pointer_root,
                declared: None,
            });
        };
        let path = info.describe(type_ref, offset, want);
        fields += path.fields;
        if index == last {
            declared = declared::declared(&path.types);
        }
        if index > 0 {
            // The lock that a named field points to: `*g->LOCK_access`.
            if index == last && path.text.is_empty() && !previous_piece.is_empty() {
                text.push_str("->");
                break;
            }
            text.push_str("->");
            text.push_str(path.text.strip_prefix('.').unwrap_or(&path.text));
        } else {
            text.push_str(&path.text);
        }
        previous_piece = path.text;
        current = path.pointee;
    }
    Some(TypedChain {
        name: c_notation(&text),
        fields,
        pointer_root,
        declared,
    })
}

/// The root variable's name: its symbol (qualified, demangled) when one
/// starts there, else DWARF's (a function's `static` has `lock.0` as symbol).
fn root_name(dwarf_name: &str, address: u64, symbol: Option<(&Symbol, u64)>) -> String {
    match symbol {
        Some((symbol, 0)) if symbol.address == address && !symbol.name.contains('.') => {
            symbol.readable_name()
        }
        _ => dwarf_name.to_string(),
    }
}

fn untyped(offset: u64) -> FieldPath {
    FieldPath {
        text: if offset == 0 {
            String::new()
        } else {
            format!("+{offset:#x}")
        },
        fields: usize::from(offset != 0),
        ..FieldPath::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::naming::dwarf::tests::{compile_c, symbol_address};

    const SOURCE: &str = r#"
#include <pthread.h>
struct conn { long id; pthread_mutex_t lock; };
struct stats { long v; void *opaque; pthread_mutex_t *LOCK_access; struct conn *conn; };
struct stats *g_stats;
struct holder { long pad; struct stats *stats; } g_holder;
pthread_mutex_t *g_lockp;
int main(void) { return g_stats != 0 || g_holder.pad || g_lockp != 0; }
"#;

    #[test]
    fn renders_chains_by_fields() {
        let data = compile_c(SOURCE);
        let info = DebugInfo::parse(&data).unwrap();
        let render = |root: &str, size: u64, offsets: &[u64]| {
            let raw = RawChain {
                module: "/t".into(),
                root: root.into(),
                root_address: symbol_address(&data, root),
                root_size: size,
                offsets: offsets.to_vec(),
                origin_class: 0,
            };
            let typed = typed_chain(&info, &raw, 40, None).unwrap();
            (typed.name, typed.fields, typed.pointer_root)
        };
        assert_eq!(
            render("g_stats", 8, &[0, 0x10, 0]),
            ("*g_stats->LOCK_access".to_string(), 1, true)
        );
        // A lock inside the object reached: named in it.
        assert_eq!(
            render("g_stats", 8, &[0, 0x18, 8]),
            ("g_stats->conn->lock".to_string(), 2, true)
        );
        assert_eq!(
            render("g_holder", 16, &[8, 0x10, 0]),
            ("*g_holder.stats->LOCK_access".to_string(), 2, false)
        );
        // The variable itself points to the lock: the dereference shows.
        assert_eq!(
            render("g_lockp", 8, &[0, 0]),
            ("*g_lockp".to_string(), 0, true)
        );
        // Through a `void *`: offsets from there on.
        assert_eq!(
            render("g_stats", 8, &[0, 0x8, 0x20, 0]).0,
            "*g_stats->opaque->+0x20"
        );
        assert_eq!(lock_span(LockKind::Rwlock), 56);
    }
}
