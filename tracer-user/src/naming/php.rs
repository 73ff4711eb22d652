//! `--php`: where thread-safe PHP keeps its state in the target. The module
//! holding PHP's engine (`libphp.so`, or the executable of a static build),
//! its version, the offsets of the structures the BPF side reads (from the
//! module's DWARF, else locktrace's table for that PHP version), and the
//! runtime addresses of PHP's thread table and globals offsets.
use std::path::Path;

use tracer_common::php::PhpOffsets;

use super::{dwarf, elf::ModuleSymbols, region::load_biases};
use crate::{
    model::LayoutSource,
    probe::{
        memory::{ProcessMemory, TargetMemory},
        php::ThreadTable,
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
    /// Everything but `task_fsbase` (the kernel's, filled by the caller).
    pub offsets: PhpOffsets,
    pub threads: ThreadTable,
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
            PhpUnavailable::UnknownLayout { module, version } => write!(
                f,
                "--php: {module} has no DWARF and locktrace has no table for PHP {}; build PHP with -g or install its debug symbols",
                version.as_deref().unwrap_or("(version unknown)")
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
/// Defined by every PHP build, thread-safe or not.
const ENGINE: &str = "php_request_startup";

/// Finds PHP in `target` and what the BPF side needs to read it.
pub fn resolve(target: &Target) -> Result<PhpRuntime, PhpUnavailable> {
    let root = target.host_path("/");
    let (module, symbols, bytes) = php_module(target, &root)?;
    let bias = load_biases(&target.maps, &module, &symbols)
        .first()
        .copied()
        .ok_or(PhpUnavailable::Unreadable {
            what: "the PHP module's mapping",
        })?;
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
    let table = address(THREAD_TABLE)?;
    let size = address(THREAD_TABLE_SIZE)?;
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
    Ok(PhpRuntime {
        module,
        version,
        layout,
        offsets,
        threads: ThreadTable {
            table,
            size,
            thread_id: entry.0,
            next: entry.1,
        },
    })
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

/// The offsets of PHP 8.2 on x86-64, as its DWARF gives them (a unit test
/// and the FrankenPHP tests check them against the kit's build).
pub const PHP_8_2: (PhpOffsets, (u64, u64)) = (
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
    },
    (16, 24),
);

/// PHP 8.4 on x86-64: 8.2's offsets but `zend_op_array.filename`, which
/// moved (the FrankenPHP tests check both tables against PHP's headers,
/// Debian's php8.2-dev and php8.4-dev, with `fixtures/php/offsets.c`).
/// `_tsrm_tls_entry` is private to TSRM.c and unchanged since PHP 7.
pub const PHP_8_4: (PhpOffsets, (u64, u64)) = (
    PhpOffsets {
        op_array_filename: 168,
        ..PHP_8_2.0
    },
    PHP_8_2.1,
);

/// The table's layout for `version` (major.minor), if locktrace has one:
/// 8.2 and 8.4, the versions whose headers could be checked here (8.3 and
/// 8.5 are not packaged by Debian).
pub fn table_layout(version: Option<&str>) -> Option<(PhpOffsets, (u64, u64))> {
    let mut parts = version?.split('.');
    match (parts.next()?, parts.next()?) {
        ("8", "2") => Some(PHP_8_2),
        ("8", "4") => Some(PHP_8_4),
        _ => None,
    }
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
    fn tables_for_8_2_and_8_4_only() {
        assert_eq!(table_layout(Some("8.2.32")), Some(PHP_8_2));
        assert_eq!(table_layout(Some("8.4.11")), Some(PHP_8_4));
        assert_eq!(PHP_8_4.0.op_array_filename, 168);
        assert!(table_layout(Some("8.3.1")).is_none());
        assert!(table_layout(Some("8.5.0")).is_none());
        assert!(table_layout(None).is_none());
    }
}
