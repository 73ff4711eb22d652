//! `--php`: where thread-safe PHP keeps its state in the target. The module
//! holding PHP's engine (`libphp.so`, or the executable of a static build),
//! its version, the offsets of the structures the BPF side reads (from the
//! module's DWARF, else locktrace's table for that PHP version), and the
//! runtime addresses of PHP's thread table and globals offsets; where the
//! table is stripped, the TLS slot of each thread's globals instead.
use std::path::Path;

use tracer_common::php::PhpOffsets;

use super::{dwarf, elf::ModuleSymbols, region::load_biases};
use crate::{
    model::{LayoutSource, TlsSlotFrom},
    probe::{
        memory::{ProcessMemory, TargetMemory},
        php::{
            TcbOffsetCode, ThreadTable, TlsSlot, decode_getspecific, decode_ls_cache,
            decode_tcb_offset, plausible_tls_offset,
        },
        request_probe,
        target::Target,
    },
};

/// What the BPF side needs to read PHP's state in the target.
#[derive(Debug, Clone)]
pub struct PhpRuntime {
    /// The module, as the target sees it.
    pub module: String,
    pub version: Option<String>,
    pub layout: LayoutSource,
    /// Everything but `task_fsbase` (the kernel's, filled by the caller);
    /// with the TLS slot set where PHP's thread table is stripped.
    pub offsets: PhpOffsets,
    /// PHP's thread table (all zero where it is stripped: then no thread
    /// is read from it).
    pub threads: ThreadTable,
    /// How the TLS slot was found without the table; None with it.
    pub tls_slot: Option<TlsSlotFrom>,
}

/// Why PHP's state cannot be read: one line that says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PhpUnavailable {
    /// No module defines PHP's engine.
    NoPhp { exe: String },
    /// PHP without thread safety (no TSRM): one request per process.
    NotThreadSafe { module: String },
    /// A symbol PHP's state is found by is missing (a stripped build).
    NoSymbol {
        module: String,
        symbol: &'static str,
    },
    /// No thread table (stripped), and nothing in `.dynsym` gives the TLS
    /// slot of the threads' globals.
    NoThreadBlocks { module: String },
    /// No DWARF, and no table for this PHP version.
    UnknownLayout {
        module: String,
        version: Option<String>,
    },
    /// The target's memory could not be read.
    Unreadable { what: &'static str },
}

impl std::fmt::Display for PhpUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PhpUnavailable::NoPhp { exe } => write!(
                f,
                "--php: {exe} runs no PHP engine (no libphp, no PHP symbols); leave out --php"
            ),
            PhpUnavailable::NotThreadSafe { module } => write!(
                f,
                "--php: {module} is PHP without thread safety (no ZTS); --php reads thread-safe PHP (FrankenPHP, mod_php with a threaded MPM)"
            ),
            PhpUnavailable::NoSymbol { module, symbol } => write!(
                f,
                "--php: {module} has no symbol {symbol} (stripped?); use an unstripped build or install its debug symbols"
            ),
            PhpUnavailable::NoThreadBlocks { module } => write!(
                f,
                "--php: {module} has no symbol {THREAD_TABLE} (stripped), and neither {TCB_OFFSET_FUNCTION} nor {LS_CACHE_FUNCTION} gives where its threads keep their PHP globals; use an unstripped build or install its debug symbols"
            ),
            PhpUnavailable::UnknownLayout { module, version } => write!(
                f,
                "--php: {module} has no DWARF and locktrace has no table for PHP {} (tables: {}); build PHP with -g or install its debug symbols",
                version.as_deref().unwrap_or("(version unknown)"),
                table_versions()
            ),
            PhpUnavailable::Unreadable { what } => write!(
                f,
                "--php: could not read {what} in the target's memory; is the process still running?"
            ),
        }
    }
}

impl std::error::Error for PhpUnavailable {}

/// Symbols PHP's state is found by.
const EXECUTOR_GLOBALS_OFFSET: &str = "executor_globals_offset";
const SAPI_GLOBALS_OFFSET: &str = "sapi_globals_offset";
const THREAD_TABLE: &str = "tsrm_tls_table";
const THREAD_TABLE_SIZE: &str = "tsrm_tls_table_size";
/// Exported by TSRM: where `_tsrm_ls_cache` is from the thread pointer.
const TCB_OFFSET_FUNCTION: &str = "tsrm_get_ls_cache_tcb_offset";
/// Exported by TSRM: the thread's block, through its pthread key.
const LS_CACHE_FUNCTION: &str = "tsrm_get_ls_cache";
/// Defined by every PHP build, thread-safe or not.
const ENGINE: &str = "php_request_startup";

/// Finds PHP in `target` and what the BPF side needs to read it.
pub fn resolve(target: &Target) -> Result<PhpRuntime, PhpUnavailable> {
    let root = target.host_path("/");
    let (module, symbols, bytes) = php_module(target, &root)?;
    let bias = module_bias(target, &module, &symbols)?;
    let address = |symbol: &'static str| {
        symbols
            .objects
            .iter()
            .find(|object| object.name == symbol)
            .map(|object| bias.wrapping_add(object.address))
            .ok_or(PhpUnavailable::NoSymbol {
                module: module.clone(),
                symbol,
            })
    };
    let executor_at =
        address(EXECUTOR_GLOBALS_OFFSET).map_err(|_| PhpUnavailable::NotThreadSafe {
            module: module.clone(),
        })?;
    let sapi_at = address(SAPI_GLOBALS_OFFSET)?;
    let table = address(THREAD_TABLE)
        .and_then(|table| address(THREAD_TABLE_SIZE).map(|size| (table, size)));
    let memory = ProcessMemory::new(target.pid);
    let read = |at: u64, what: &'static str| {
        let mut value = [0u8; 8];
        (memory.read(at, &mut value) == 8)
            .then(|| u64::from_le_bytes(value))
            .ok_or(PhpUnavailable::Unreadable { what })
    };
    let version = php_version(&bytes);
    let (layout, mut offsets, entry) = layout(target, &module, version.as_deref())?;
    offsets.executor_globals = read(executor_at, EXECUTOR_GLOBALS_OFFSET)?;
    offsets.sapi_globals = read(sapi_at, SAPI_GLOBALS_OFFSET)?;
    let (threads, tls_slot) = match table {
        Ok((table, size)) => {
            let threads = ThreadTable {
                table,
                size,
                thread_id: entry.0,
                next: entry.1,
            };
            (threads, None)
        }
        Err(_) => {
            let found = PhpModule {
                symbols: &symbols,
                bytes: &bytes,
                bias,
            };
            let found = tls_slots_without_table(&found, &memory);
            let (slot, from) =
                found
                    .first()
                    .copied()
                    .ok_or_else(|| PhpUnavailable::NoThreadBlocks {
                        module: module.clone(),
                    })?;
            offsets.tls_known = 1;
            offsets.tls_offset = slot.offset as u64;
            offsets.tls_indirect = u64::from(slot.index.is_some());
            offsets.tls_index_offset = slot.index.unwrap_or(0);
            (ThreadTable::default(), Some(from))
        }
    };
    Ok(PhpRuntime {
        module,
        version,
        layout,
        offsets,
        threads,
        tls_slot,
    })
}

/// The module's load bias in the target.
fn module_bias(
    target: &Target,
    module: &str,
    symbols: &ModuleSymbols,
) -> Result<u64, PhpUnavailable> {
    load_biases(&target.maps, module, symbols)
        .first()
        .copied()
        .ok_or(PhpUnavailable::Unreadable {
            what: "the PHP module's mapping",
        })
}

/// The TLS slots `resolve` can take where PHP's thread table is stripped,
/// the one it takes first, also for a module that has the table (the tests
/// compare them with the table).
pub fn tls_slots_without_thread_table(
    target: &Target,
) -> Result<Vec<(TlsSlot, TlsSlotFrom)>, PhpUnavailable> {
    let (module, symbols, bytes) = php_module(target, &target.host_path("/"))?;
    let found = PhpModule {
        symbols: &symbols,
        bytes: &bytes,
        bias: module_bias(target, &module, &symbols)?,
    };
    Ok(tls_slots_without_table(
        &found,
        &ProcessMemory::new(target.pid),
    ))
}

/// The module found to hold PHP's engine, as read from its file.
struct PhpModule<'a> {
    symbols: &'a ModuleSymbols,
    bytes: &'a [u8],
    /// Its load bias in the target.
    bias: u64,
}

/// Where each thread's block can be found where PHP's thread table is
/// stripped, from what `.dynsym` keeps, best first: PHP's own
/// `tsrm_get_ls_cache_tcb_offset` (glibc: the offset of `_tsrm_ls_cache`,
/// in its GOT slot or, in an executable, its code; it returns 0 where PHP's
/// configure found musl), then the pthread key `tsrm_get_ls_cache` reads,
/// in musl's array of pthread-specific values (a static build, where
/// `pthread_getspecific`'s code is in the module). What is not plausible
/// is left out.
fn tls_slots_without_table(
    module: &PhpModule,
    memory: &dyn TargetMemory,
) -> Vec<(TlsSlot, TlsSlotFrom)> {
    let read = |link: u64| {
        let mut value = [0u8; 8];
        (memory.read(module.bias.wrapping_add(link), &mut value) == 8)
            .then(|| u64::from_le_bytes(value))
    };
    let from_code = code_of(module, TCB_OFFSET_FUNCTION)
        .and_then(|(code, address)| decode_tcb_offset(code, address))
        .and_then(|code| match code {
            TcbOffsetCode::GotSlot(link) => read(link).map(|value| value as i64),
            TcbOffsetCode::Offset(offset) => Some(offset),
            TcbOffsetCode::Zero => None,
        })
        .filter(|&offset| plausible_tls_offset(offset))
        .map(|offset| {
            let slot = TlsSlot {
                offset,
                index: None,
            };
            (slot, TlsSlotFrom::TcbOffsetFunction)
        });
    let from_key = code_of(module, LS_CACHE_FUNCTION)
        .and_then(|(code, address)| decode_ls_cache(code, address))
        .and_then(|(key_at, getspecific)| {
            let array = file_bytes(module.symbols, module.bytes, getspecific, 32)
                .and_then(|code| decode_getspecific(code, getspecific))?;
            // pthread_key_t is an unsigned int; musl has 128 keys.
            let key = read(key_at)? & 0xffff_ffff;
            let slot = TlsSlot {
                offset: i64::try_from(array).ok()?,
                index: Some(key * 8),
            };
            (key < 128 && array < 4096).then_some((slot, TlsSlotFrom::PthreadKey))
        });
    from_code.into_iter().chain(from_key).collect()
}

/// The first bytes of the module's function `name`, and its link address.
fn code_of<'a>(module: &PhpModule<'a>, name: &str) -> Option<(&'a [u8], u64)> {
    let function = module.symbols.functions.iter().find(|f| f.name == name)?;
    let code = file_bytes(module.symbols, module.bytes, function.address, 32)?;
    Some((code, function.address))
}

/// `len` bytes of the file at link address `address`, through the loaded
/// segment holding it.
fn file_bytes<'a>(
    symbols: &ModuleSymbols,
    bytes: &'a [u8],
    address: u64,
    len: u64,
) -> Option<&'a [u8]> {
    let segment = symbols.segments.iter().find(|segment| {
        (segment.address..segment.address.saturating_add(segment.file_size)).contains(&address)
    })?;
    let start = segment.offset.checked_add(address - segment.address)?;
    let end = start
        .checked_add(len)?
        .min(segment.offset.saturating_add(segment.file_size));
    bytes.get(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
}

/// The module defining PHP's engine, its symbols and bytes: the executable
/// (a static build) or a `libphp` library.
fn php_module(
    target: &Target,
    root: &Path,
) -> Result<(String, ModuleSymbols, Vec<u8>), PhpUnavailable> {
    for module in request_probe::modules(target) {
        let is_libphp = module.file_name().starts_with("libphp")
            || module
                .soname
                .as_deref()
                .is_some_and(|soname| soname.starts_with("libphp"));
        if module.path != target.exe && !is_libphp {
            continue;
        }
        let Ok(file) = target.module_file(&module.path) else {
            continue;
        };
        let Ok(symbols) = ModuleSymbols::parse(file.bytes(), &module.path, Some(root)) else {
            continue;
        };
        if symbols.functions.iter().any(|f| f.name == ENGINE) {
            return Ok((module.path.clone(), symbols, file.bytes().to_vec()));
        }
    }
    Err(PhpUnavailable::NoPhp {
        exe: target.exe.clone(),
    })
}

/// `8.2.32`, from the `X-Powered-By` header PHP's engine sends (a string
/// every build has).
pub fn php_version(bytes: &[u8]) -> Option<String> {
    const MARK: &[u8] = b"X-Powered-By: PHP/";
    let at = bytes.windows(MARK.len()).position(|w| w == MARK)? + MARK.len();
    let version: String = bytes[at..]
        .iter()
        .take(32)
        .take_while(|&&b| b.is_ascii_digit() || b == b'.')
        .map(|&b| char::from(b))
        .collect();
    (!version.is_empty()).then_some(version)
}

/// The structure offsets, and `tsrm_tls_entry`'s `thread_id` and `next`.
fn layout(
    target: &Target,
    module: &str,
    version: Option<&str>,
) -> Result<(LayoutSource, PhpOffsets, (u64, u64)), PhpUnavailable> {
    let from_dwarf = target
        .module_file(module)
        .ok()
        .and_then(|file| dwarf::load_module(&file))
        .and_then(|info| dwarf_layout(&info));
    if let Some((offsets, entry)) = from_dwarf {
        return Ok((LayoutSource::Dwarf, offsets, entry));
    }
    table_layout(version)
        .map(|(offsets, entry)| (LayoutSource::Table, offsets, entry))
        .ok_or_else(|| PhpUnavailable::UnknownLayout {
            module: module.to_string(),
            version: version.map(str::to_string),
        })
}

/// The offsets from the module's DWARF; None when a structure or member is
/// missing there.
pub fn dwarf_layout(info: &dwarf::DebugInfo) -> Option<(PhpOffsets, (u64, u64))> {
    let member = |aggregate: &str, path: &[&str]| {
        let type_ref = info.aggregate_named(aggregate)?;
        info.member_offset(type_ref, path)
    };
    let offsets = PhpOffsets {
        current_execute_data: member("_zend_executor_globals", &["current_execute_data"])?,
        execute_data_opline: member("_zend_execute_data", &["opline"])?,
        execute_data_func: member("_zend_execute_data", &["func"])?,
        execute_data_prev: member("_zend_execute_data", &["prev_execute_data"])?,
        function_type: member("_zend_function", &["type"])?,
        function_name: member("_zend_function", &["common", "function_name"])?,
        function_scope: member("_zend_function", &["common", "scope"])?,
        op_array_filename: member("_zend_function", &["op_array", "filename"])?,
        op_lineno: member("_zend_op", &["lineno"])?,
        class_name: member("_zend_class_entry", &["name"])?,
        string_len: member("_zend_string", &["len"])?,
        string_val: member("_zend_string", &["val"])?,
        request_method: member("_sapi_globals_struct", &["request_info", "request_method"])?,
        request_uri: member("_sapi_globals_struct", &["request_info", "request_uri"])?,
        path_translated: member("_sapi_globals_struct", &["request_info", "path_translated"])?,
        ..PhpOffsets::default()
    };
    let entry = (
        member("_tsrm_tls_entry", &["thread_id"])?,
        member("_tsrm_tls_entry", &["next"])?,
    );
    Some((offsets, entry))
}

/// A table: the structure offsets, and `tsrm_tls_entry`'s `thread_id` and
/// `next`.
pub(crate) type Table = (PhpOffsets, (u64, u64));

/// The offsets of PHP 8.2 on x86-64, as its DWARF gives them (a unit test
/// and the FrankenPHP tests check them against the kit's build).
pub(crate) const PHP_8_2: (PhpOffsets, (u64, u64)) = (
    PhpOffsets {
        enabled: 0,
        task_fsbase: 0,
        executor_globals: 0,
        sapi_globals: 0,
        current_execute_data: 488,
        execute_data_opline: 0,
        execute_data_func: 24,
        execute_data_prev: 48,
        function_type: 0,
        function_name: 8,
        function_scope: 16,
        op_array_filename: 152,
        op_lineno: 24,
        class_name: 8,
        string_len: 16,
        string_val: 24,
        request_method: 8,
        request_uri: 48,
        path_translated: 40,
        tls_known: 0,
        tls_offset: 0,
        tls_indirect: 0,
        tls_index_offset: 0,
    },
    (16, 24),
);

/// PHP 8.4 on x86-64: 8.2's offsets but `zend_op_array.filename`, which
/// moved (the FrankenPHP tests check both tables against PHP's headers,
/// Debian's php8.2-dev and php8.4-dev, with `fixtures/php/offsets.c`).
/// `_tsrm_tls_entry` is private to TSRM.c and unchanged since PHP 7.
pub(crate) const PHP_8_4: (PhpOffsets, (u64, u64)) = (
    PhpOffsets {
        op_array_filename: 168,
        ..PHP_8_2.0
    },
    PHP_8_2.1,
);

/// PHP 8.5 on x86-64: 8.4's offsets but `current_execute_data`, pushed
/// 24 bytes down by the executor globals' new `fatal_error_backtrace_on`
/// and `last_fatal_error_backtrace` (checked against Debian's php8.5-dev
/// like the others). `_tsrm_tls_entry` is as in 8.2.
pub(crate) const PHP_8_5: Table = (
    PhpOffsets {
        current_execute_data: 512,
        ..PHP_8_4.0
    },
    PHP_8_4.1,
);

/// The tables, by PHP version (major.minor).
const TABLES: [(&str, Table); 3] = [("8.2", PHP_8_2), ("8.4", PHP_8_4), ("8.5", PHP_8_5)];

/// The table's layout for `version`, if locktrace has one: 8.2, 8.4 and
/// 8.5, the versions whose headers could be checked here (Debian never
/// released 8.3: no suite has its headers).
pub fn table_layout(version: Option<&str>) -> Option<Table> {
    let mut parts = version?.split('.');
    let minor = format!("{}.{}", parts.next()?, parts.next()?);
    TABLES
        .iter()
        .find(|(known, _)| *known == minor)
        .map(|(_, table)| *table)
}

/// `8.2, 8.4, 8.5`: the versions with a table, for `--php`'s refusal.
fn table_versions() -> String {
    TABLES.map(|(version, _)| version).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_from_the_powered_by_header() {
        let bytes = b"\0junk X-Powered-By: PHP/8.2.32\0more";
        assert_eq!(php_version(bytes).as_deref(), Some("8.2.32"));
        assert_eq!(php_version(b"no php here"), None);
    }

    #[test]
    fn tables_for_8_2_8_4_and_8_5_only() {
        assert_eq!(table_layout(Some("8.2.32")), Some(PHP_8_2));
        assert_eq!(table_layout(Some("8.4.11")), Some(PHP_8_4));
        assert_eq!(table_layout(Some("8.5.7")), Some(PHP_8_5));
        assert_eq!(PHP_8_4.0.op_array_filename, 168);
        assert_eq!(PHP_8_5.0.op_array_filename, 168);
        assert_eq!(PHP_8_5.0.current_execute_data, 512);
        assert!(table_layout(Some("8.3.1")).is_none());
        assert!(table_layout(Some("8.6.0")).is_none());
        assert!(table_layout(None).is_none());
    }

    #[test]
    fn an_unknown_version_is_refused_in_one_line_naming_the_tables() {
        let refusal = PhpUnavailable::UnknownLayout {
            module: "/usr/lib/libphp.so".into(),
            version: Some("8.3.6".into()),
        }
        .to_string();
        assert_eq!(
            refusal,
            "--php: /usr/lib/libphp.so has no DWARF and locktrace has no table for PHP 8.3.6 \
             (tables: 8.2, 8.4, 8.5); build PHP with -g or install its debug symbols"
        );
    }

    #[test]
    fn no_thread_table_and_no_tls_slot_is_one_line() {
        let refusal = PhpUnavailable::NoThreadBlocks {
            module: "/usr/lib/libphp.so".into(),
        }
        .to_string();
        assert_eq!(
            refusal,
            "--php: /usr/lib/libphp.so has no symbol tsrm_tls_table (stripped), and neither \
             tsrm_get_ls_cache_tcb_offset nor tsrm_get_ls_cache gives where its threads keep their \
             PHP globals; use an unstripped build or install its debug symbols"
        );
        assert!(!refusal.contains('\n'));
    }
}
