//! `--php`: PHP's state read from outside, on thread-safe (ZTS) PHP.
//!
//! Each PHP thread's globals live in one block (TSRM's `tsrm_tls_entry`,
//! what the thread's `_tsrm_ls_cache` points to), the executor's at
//! `executor_globals_offset` and the SAPI's at `sapi_globals_offset`.
//! Userspace walks PHP's table of those blocks and loads `PHP_THREADS`
//! (thread pointer → block); the BPF side finds the current thread's block
//! through its thread pointer (`task_struct.thread.fsbase`).
//!
//! Routes: at each request start (the request probe) the BPF side reads
//! `SG(request_info)`'s method and URI (the script path when there is no
//! URI), keys them by a hash ([`route_hash`]) and labels the thread with
//! it; lock calls and waits then count per (route, lock) until the
//! thread's next request.

/// PHP frames read per snapshot, innermost first.
pub const MAX_FRAMES: usize = 16;
/// Bytes kept of a function's and a class's name.
pub const NAME_BYTES: usize = 48;
/// Bytes kept of a file's path: its end (the file name and the folders
/// nearest it).
pub const FILE_BYTES: usize = 96;
/// Bytes kept of a request's method and of its path.
pub const METHOD_BYTES: usize = 16;
pub const PATH_BYTES: usize = 112;
/// PHP threads and routes the maps hold.
pub const MAX_THREADS: u32 = 4096;
pub const MAX_ROUTES: u32 = 4096;
/// Keys of the maps per route: every route, and the three below.
pub const MAX_ROUTE_KEYS: u32 = MAX_ROUTES + 3;
pub const MAX_ROUTE_LOCKS: u32 = 65_536;

/// The route of events outside any request (threads that never started
/// one: Go's, Apache's listener, …).
pub const NO_REQUEST: u64 = 0;
/// The route of requests whose method and URI could not be read.
pub const UNREADABLE_ROUTE: u64 = 1;
/// The route of requests whose route was new when `MAX_ROUTES` routes
/// were already known: counted together, never as unreadable.
pub const PAST_CAP_ROUTE: u64 = 2;

/// Indexes of `PHP_MISSES`: why a PHP context was not read.
pub mod miss {
    /// The thread is not in PHP's thread table as last loaded (a
    /// thread of the server's own, or a PHP thread started since).
    pub const THREAD_UNKNOWN: u32 = 0;
    /// No PHP code was running on the thread (between requests, or
    /// inside the engine before the script).
    pub const NO_PHP_CODE: u32 = 1;
    /// A read of the target's memory failed.
    pub const READ_FAILED: u32 = 2;
    /// The kernel's thread pointer could not be read.
    pub const NO_THREAD_POINTER: u32 = 3;
    pub const COUNT: u32 = 4;
    pub const NAMES: [&str; COUNT as usize] = [
        "not_php_thread",
        "no_php_code",
        "read_failed",
        "no_thread_pointer",
    ];
}

/// Offsets the BPF side reads PHP's structures with (bytes; from the
/// module's DWARF or a table per PHP version), and the kernel's
/// `task_struct.thread.fsbase`. Userspace fills `PHP_OFFSETS[0]` at
/// attach; `enabled` 0 leaves every PHP read out.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhpOffsets {
    pub enabled: u64,
    pub task_fsbase: u64,
    /// The values of `executor_globals_offset` and `sapi_globals_offset`.
    pub executor_globals: u64,
    pub sapi_globals: u64,
    /// `zend_executor_globals.current_execute_data`.
    pub current_execute_data: u64,
    /// `zend_execute_data`'s `opline`, `func` and `prev_execute_data`.
    pub execute_data_opline: u64,
    pub execute_data_func: u64,
    pub execute_data_prev: u64,
    /// `zend_function`'s `type`, `common.function_name`, `common.scope`
    /// and `op_array.filename`.
    pub function_type: u64,
    pub function_name: u64,
    pub function_scope: u64,
    pub op_array_filename: u64,
    /// `zend_op.lineno`, `zend_class_entry.name`, `zend_string`'s `len`
    /// and `val`.
    pub op_lineno: u64,
    pub class_name: u64,
    pub string_len: u64,
    pub string_val: u64,
    /// `sapi_globals_struct.request_info`'s `request_method`,
    /// `request_uri` and `path_translated`.
    pub request_method: u64,
    pub request_uri: u64,
    pub path_translated: u64,
    /// 1 when `tls_offset` is known: a thread's block is the pointer at
    /// its thread pointer plus `tls_offset` (PHP's `_tsrm_ls_cache`),
    /// found by userspace; else `PHP_THREADS` alone.
    pub tls_known: u64,
    /// A signed offset, as two's complement.
    pub tls_offset: u64,
    /// 1 when the pointer at `tls_offset` is an array (musl's
    /// pthread-specific values, where a stripped static build keeps
    /// PHP's `tls_key`): the block is the pointer `tls_index_offset`
    /// bytes into it.
    pub tls_indirect: u64,
    pub tls_index_offset: u64,
}

/// `zend_function.type` of a function written in PHP.
pub const USER_FUNCTION: u8 = 2;

/// One PHP frame: function (empty for a file's top level), class (empty
/// for a plain function), the end of the file's path, and the line
/// running in it (0 for a function written in C).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PhpFrame {
    pub line: u32,
    /// `zend_function.type`: [`USER_FUNCTION`], or 1 for one in C.
    pub kind: u32,
    pub function: [u8; NAME_BYTES],
    pub class: [u8; NAME_BYTES],
    pub file: [u8; FILE_BYTES],
}

/// The PHP stack read at a snapshot: `depth` frames, innermost first;
/// `miss` is a [`miss`] reason plus one when none could be read (0: read).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PhpStack {
    pub depth: u32,
    pub miss: u32,
    /// The thread's route at the snapshot.
    pub route: u64,
    pub frames: [PhpFrame; MAX_FRAMES],
}

/// A route as read: method and path (up to the query string), each
/// NUL-padded.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RouteText {
    pub method: [u8; METHOD_BYTES],
    pub path: [u8; PATH_BYTES],
}

/// Key of `ROUTE_LOCKS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RouteLockKey {
    pub route: u64,
    pub lock: u64,
}

/// Per (route, lock): acquisitions, contended waits and their time,
/// and the CPU sampler's samples in the lock's code.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteLockCounts {
    pub calls: u64,
    pub waits: u64,
    pub wait_ns: u64,
    pub cpu_samples: u64,
}

/// FNV-1a of a route's bytes, never [`NO_REQUEST`],
/// [`UNREADABLE_ROUTE`] or [`PAST_CAP_ROUTE`]. The same function on
/// both sides, so tests can compute a route's key.
#[inline(always)]
pub fn route_hash(text: &RouteText) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut index = 0;
    while index < METHOD_BYTES {
        hash = (hash ^ u64::from(text.method[index])).wrapping_mul(0x100_0000_01b3);
        index += 1;
    }
    index = 0;
    while index < PATH_BYTES {
        hash = (hash ^ u64::from(text.path[index])).wrapping_mul(0x100_0000_01b3);
        index += 1;
    }
    if hash <= PAST_CAP_ROUTE {
        hash + 3
    } else {
        hash
    }
}
