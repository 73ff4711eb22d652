//! CPython's GIL without debug info (issue 52 D12). A stripped CPython
//! still exports `_PyRuntime` (the runtime state) and `Py_Version` (its
//! `PY_VERSION_HEX`, since 3.11), and the GIL sits at a fixed offset inside
//! `_PyRuntime` for each minor version: so its locks get the names and the
//! declared type the DWARF of an unstripped build gives them
//! (`_PyRuntime.ceval.gil.cond` inside `_gil_runtime_state`), and its
//! condvar's waits count as contention as they do with DWARF.
use super::elf::ModuleSymbols;
use crate::model::{DeclaredType, LayoutSource, LockKind};

/// The symbol holding CPython's runtime state.
pub(crate) const RUNTIME: &str = "_PyRuntime";
/// `const unsigned long Py_Version = PY_VERSION_HEX`, exported since 3.11.
const VERSION: &str = "Py_Version";
/// The type holding the GIL's locks, as DWARF names it.
const GIL_TYPE: &str = "_gil_runtime_state";

/// One lock of the GIL: its path from `_PyRuntime`, offset there, kind and
/// type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GilLock {
    pub path: &'static str,
    pub offset: u64,
    pub kind: LockKind,
    pub type_name: &'static str,
}

/// Where the GIL's locks are inside `_PyRuntime` in one CPython version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GilLayout {
    pub version: (u8, u8),
    /// The size of `_PyRuntime` the offsets hold for, when they lie behind
    /// fields whose layout may change between patch releases or builds.
    pub runtime_size: Option<u64>,
    pub locks: [GilLock; 4],
}

const fn gil(
    version: (u8, u8),
    runtime_size: Option<u64>,
    paths: [&'static str; 4],
    cond: u64,
) -> GilLayout {
    // `struct _gil_runtime_state` on x86-64 (3.11-3.13, GIL builds):
    // interval, last_holder, locked, switch_number, then these four.
    const fn lock(path: &'static str, offset: u64, kind: LockKind) -> GilLock {
        let type_name = match kind {
            LockKind::Condvar => "pthread_cond_t",
            _ => "pthread_mutex_t",
        };
        GilLock {
            path,
            offset,
            kind,
            type_name,
        }
    }
    GilLayout {
        version,
        runtime_size,
        locks: [
            lock(paths[0], cond, LockKind::Condvar),
            lock(paths[1], cond + 48, LockKind::Mutex),
            lock(paths[2], cond + 88, LockKind::Condvar),
            lock(paths[3], cond + 136, LockKind::Mutex),
        ],
    }
}

/// 3.11: the GIL is `_PyRuntime.ceval.gil`, behind fields that no build
/// option changes (Debian's python3.11-dev headers give these offsets:
/// tests/suite/python_gil.rs checks them), so any size of `_PyRuntime` will do.
pub(crate) const CPYTHON_3_11: GilLayout = gil(
    (3, 11),
    None,
    [
        ".ceval.gil.cond",
        ".ceval.gil.mutex",
        ".ceval.gil.switch_cond",
        ".ceval.gil.switch_mutex",
    ],
    392,
);

/// 3.12 moved the GIL into the interpreter: the main one's is
/// `_PyRuntime._main_interpreter._gil`, 75 KiB in, behind much that a
/// patch release or a build option may change: so only for the size of
/// `_PyRuntime` checked, pyenv's unstripped 3.12.1 (Debian 12 packages no
/// 3.12; tests/suite/python_gil.rs checks it where pyenv's builds are).
pub(crate) const CPYTHON_3_12: GilLayout = gil((3, 12), Some(0x704a8), MAIN_INTERPRETER, 77_464);

/// 3.13, as 3.12 (pyenv's unstripped 3.13.0). A free-threaded build has
/// another `_PyRuntime` size, and stays unnamed.
pub(crate) const CPYTHON_3_13: GilLayout = gil((3, 13), Some(0x452b8), MAIN_INTERPRETER, 96_136);

const MAIN_INTERPRETER: [&str; 4] = [
    "._main_interpreter._gil.cond",
    "._main_interpreter._gil.mutex",
    "._main_interpreter._gil.switch_cond",
    "._main_interpreter._gil.switch_mutex",
];

/// The table's layout for a CPython version, if locktrace has one.
pub fn table_layout(version: (u8, u8)) -> Option<&'static GilLayout> {
    [&CPYTHON_3_11, &CPYTHON_3_12, &CPYTHON_3_13]
        .into_iter()
        .find(|layout| layout.version == version)
}

/// (major, minor) from the module's `Py_Version`, read from its file; None
/// for a module that is not CPython 3.11 or later.
pub(crate) fn python_version(symbols: &ModuleSymbols, bytes: &[u8]) -> Option<(u8, u8)> {
    let symbol = symbols.objects.iter().find(|s| s.name == VERSION)?;
    let segment = symbols.segments.iter().find(|segment| {
        symbol.address >= segment.address
            && symbol.address.saturating_add(8) <= segment.address.saturating_add(segment.file_size)
    })?;
    let at = usize::try_from(segment.offset + (symbol.address - segment.address)).ok()?;
    let word: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
    let hex = u64::from_le_bytes(word);
    let (major, minor) = ((hex >> 24) as u8, (hex >> 16) as u8);
    (major == 3).then_some((major, minor))
}

/// The GIL lock at `offset` inside a `_PyRuntime` of `runtime_size`
/// bytes, named from there, if the row's kind is the one the table has
/// there (a guard against a layout the table does not describe: its
/// offsets then hold no lock of that kind).
pub(crate) fn gil_lock(
    layout: &GilLayout,
    runtime_size: u64,
    offset: u64,
    kind: LockKind,
) -> Option<(String, DeclaredType)> {
    if layout.runtime_size.is_some_and(|size| size != runtime_size) {
        return None;
    }
    // A mutex seen only by its futex waits (`--mode contention`) is a
    // futex row at the mutex's first word, named as the mutex as DWARF does.
    let same_kind = |lock: &GilLock| {
        lock.kind == kind || (lock.kind == LockKind::Mutex && kind == LockKind::Futex)
    };
    let lock = layout
        .locks
        .iter()
        .find(|lock| lock.offset == offset && same_kind(lock))?;
    Some((
        format!("{RUNTIME}{}", lock.path),
        DeclaredType {
            type_name: lock.type_name.to_string(),
            inside: Some(GIL_TYPE.to_string()),
            contention: None,
            layout: LayoutSource::Table,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::naming::elf::{Segment, Symbol};

    #[test]
    fn the_gil_of_each_version() {
        let (name, declared) = gil_lock(&CPYTHON_3_11, 0x28b20, 440, LockKind::Mutex).unwrap();
        assert_eq!(name, "_PyRuntime.ceval.gil.mutex");
        assert_eq!(declared.type_name, "pthread_mutex_t");
        assert_eq!(declared.inside.as_deref(), Some("_gil_runtime_state"));
        // 3.11's offsets hold whatever the size (an earlier field's).
        let (name, _) = gil_lock(&CPYTHON_3_11, 0x1000, 392, LockKind::Condvar).unwrap();
        assert_eq!(name, "_PyRuntime.ceval.gil.cond");
        let (name, _) = gil_lock(&CPYTHON_3_12, 0x704a8, 77_600, LockKind::Mutex).unwrap();
        assert_eq!(name, "_PyRuntime._main_interpreter._gil.switch_mutex");
        // 3.12's only for the size checked.
        assert!(gil_lock(&CPYTHON_3_12, 0x704b0, 77_600, LockKind::Mutex).is_none());
        // A futex row at a mutex (contention mode), named as the mutex.
        let (name, declared) = gil_lock(&CPYTHON_3_11, 0x28b20, 528, LockKind::Futex).unwrap();
        assert_eq!(name, "_PyRuntime.ceval.gil.switch_mutex");
        assert_eq!(declared.type_name, "pthread_mutex_t");
        assert!(gil_lock(&CPYTHON_3_11, 0x28b20, 392, LockKind::Futex).is_none());
        // The wrong kind at a lock's offset, or an offset inside one: no GIL.
        assert!(gil_lock(&CPYTHON_3_11, 0x28b20, 392, LockKind::Mutex).is_none());
        assert!(gil_lock(&CPYTHON_3_11, 0x28b20, 400, LockKind::Condvar).is_none());
        assert_eq!(table_layout((3, 13)), Some(&CPYTHON_3_13));
        assert!(table_layout((3, 10)).is_none());
        assert!(table_layout((3, 14)).is_none());
    }

    #[test]
    fn the_version_from_py_version() {
        let mut symbols = ModuleSymbols {
            segments: vec![Segment {
                address: 0x1000,
                memory_size: 0x100,
                offset: 0x10,
                file_size: 0x20,
            }],
            objects: vec![Symbol {
                address: 0x1008,
                size: 8,
                name: VERSION.into(),
            }],
            ..ModuleSymbols::default()
        };
        let mut bytes = vec![0u8; 0x30];
        bytes[0x18..0x20].copy_from_slice(&0x030b_02f0u64.to_le_bytes());
        assert_eq!(python_version(&symbols, &bytes), Some((3, 11)));
        // Past the file's bytes (in .bss), or no symbol: unknown.
        symbols.objects[0].address = 0x1020;
        assert_eq!(python_version(&symbols, &bytes), None);
        symbols.objects.clear();
        assert_eq!(python_version(&symbols, &bytes), None);
    }
}
