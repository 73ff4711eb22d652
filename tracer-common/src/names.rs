//! Names of the BPF programs and maps, as userspace looks them up. The BPF
//! side declares items of exactly these names (a mismatch fails every
//! attach in the integration tests).

/// Uprobe on every lock function's probe points.
pub const PROGRAM_LOCK_CALL: &str = "lock_call";
/// Uprobe on the user's once-per-request function.
pub const PROGRAM_REQUEST_BOUNDARY: &str = "request_boundary";
/// Tracepoints syscalls:sys_enter_futex and sys_exit_futex.
pub const PROGRAM_FUTEX_ENTER: &str = "futex_enter";
pub const PROGRAM_FUTEX_EXIT: &str = "futex_exit";
pub const PROGRAM_TRY_LOCK_EXIT: &str = "try_lock_exit";
pub const MAP_FAILED_TRIES: &str = "FAILED_TRIES";
pub const PROGRAM_FUTEX_WAITV_ENTER: &str = "futex_waitv_enter";
pub const PROGRAM_FUTEX_WAITV_EXIT: &str = "futex_waitv_exit";
/// Uprobe and uretprobe on the condvar wait functions.
pub const PROGRAM_COND_WAIT_ENTER: &str = "cond_wait_enter";
pub const PROGRAM_COND_WAIT_EXIT: &str = "cond_wait_exit";
/// Uprobe on the unlock functions' probe points (`--hold-times`).
pub const PROGRAM_UNLOCK_CALL: &str = "unlock_call";
/// An empty uprobe that keeps the kernel's breakpoints in the target
/// (see `trace/follow.rs`).
pub const PROGRAM_BREAKPOINT_ANCHOR: &str = "breakpoint_anchor";
/// Uprobe on the lock init functions (`--stacks`: creation sites).
pub const PROGRAM_LOCK_INIT: &str = "lock_init";
/// Tracepoint syscalls:sys_enter_getppid (`--mode inproc --stacks`: the
/// stubs' samples).
pub const PROGRAM_INPROC_SAMPLE: &str = "inproc_sample";

/// Tracepoints on munmap, mremap, mmap and exec (see [`super::lifetime`]).
pub const PROGRAM_MUNMAP_ENTER: &str = "munmap_enter";
pub const PROGRAM_MREMAP_ENTER: &str = "mremap_enter";
pub const PROGRAM_MMAP_ENTER: &str = "mmap_enter";
pub const PROGRAM_PROCESS_EXEC: &str = "process_exec";
pub const MAP_GENERATION: &str = "GENERATION";
pub const MAP_UNMAPPED: &str = "UNMAPPED";
pub const MAP_UNMAPPED_COUNT: &str = "UNMAPPED_COUNT";
pub const MAP_WATCHED: &str = "WATCHED";
pub const PROGRAM_MMAP_EXIT: &str = "mmap_exit";

pub const MAP_LOCKS: &str = "LOCKS";
pub const MAP_FUTEXES: &str = "FUTEXES";
pub const MAP_CALLERS: &str = "CALLERS";
pub const MAP_STACK_COUNTS: &str = "STACK_COUNTS";
pub const MAP_SNAPSHOTS: &str = "SNAPSHOTS";
pub const MAP_REQUESTS: &str = "REQUESTS";
pub const MAP_COUNTING: &str = "COUNTING";
/// Code ranges of the lock functions (`--hold-times`), `[start, end)` each.
pub const MAP_LOCK_CODE: &str = "LOCK_CODE";
pub const MAP_DROPS: &str = "DROPS";
pub const MAP_CONDVARS: &str = "CONDVARS";
pub const MAP_COND_CALLS: &str = "COND_CALLS";
pub const MAP_GO_FUTEXES: &str = "GO_FUTEXES";
pub const MAP_WAIT_HOLDERS: &str = "WAIT_HOLDERS";
pub const MAP_HOLDS: &str = "HOLDS";
pub const MAP_HOLDERS: &str = "HOLDERS";
pub const MAP_UNLOCK_HITS: &str = "UNLOCK_HITS";
/// In-flight state, read at the end for what is still going on.
pub const MAP_WAITING: &str = "WAITING";
pub const MAP_HELD: &str = "HELD";
/// The CPU sampler (`cpu_sample`, a perf event program on cpu-clock).
pub const PROGRAM_CPU_SAMPLE: &str = "cpu_sample";
/// Tracepoints lock:contention_begin and contention_end (Linux 5.19+).
pub const PROGRAM_KERNEL_LOCK_BEGIN: &str = "kernel_lock_begin";
pub const PROGRAM_KERNEL_LOCK_END: &str = "kernel_lock_end";
pub const MAP_KERNEL_LOCKS: &str = "KERNEL_LOCKS";
pub const MAP_KERNEL_LOCK_STACKS: &str = "KERNEL_LOCK_STACKS";
pub const MAP_KERNEL_LOCK_SITES: &str = "KERNEL_LOCK_SITES";
pub const MAP_KERNEL_LOCK_EVENTS: &str = "KERNEL_LOCK_EVENTS";
/// Tracepoints sched:sched_process_exit and sched_process_free, with the
/// kernel lock ones: the target's threads exiting and not yet freed.
pub const PROGRAM_THREAD_EXIT: &str = "thread_exit";
pub const PROGRAM_THREAD_FREE: &str = "thread_free";
pub const MAP_EXITING: &str = "EXITING";
pub const GLOBAL_FREE_PID_OFFSET: &str = "FREE_PID_OFFSET";
pub const MAP_CPU_LOCK_CODE: &str = "CPU_LOCK_CODE";
pub const MAP_CPU_LOCKS: &str = "CPU_LOCKS";
pub const MAP_CPU_COUNTS: &str = "CPU_COUNTS";

/// Globals set by userspace before load.
pub const GLOBAL_TARGET_TGID: &str = "TARGET_TGID";
pub const GLOBAL_FLAGS: &str = "FLAGS";
pub const GLOBAL_GO_FUTEX_START: &str = "GO_FUTEX_START";
pub const GLOBAL_GO_FUTEX_END: &str = "GO_FUTEX_END";
pub const GLOBAL_LOCK_CODE_RANGES: &str = "LOCK_CODE_RANGES";
/// Number of filled entries of `CPU_LOCK_CODE`.
pub const GLOBAL_CPU_LOCK_CODE_RANGES: &str = "CPU_LOCK_CODE_RANGES";
/// Bits of [`kernel_caps`](super::kernel_caps): what the kernel's BPF offers.
pub const GLOBAL_KERNEL_CAPS: &str = "KERNEL_CAPS";
/// Probe point's address in the target → its cookie, where the kernel
/// has no attach cookies (before Linux 5.15).
pub const MAP_PROBE_COOKIES: &str = "PROBE_COOKIES";
/// Per lock: the CPU of its last acquisition and its moves between CPUs.
pub const MAP_HANDOFFS: &str = "HANDOFFS";
/// CPU number → its core and L3 cache (filled at attach from sysfs).
pub const MAP_CPU_PLACES: &str = "CPU_PLACES";
/// `--php` (see [`super::php`]): PHP's threads, the route of each
/// request, and the counts per route.
pub const MAP_PHP_THREADS: &str = "PHP_THREADS";
pub const MAP_ROUTE_TEXTS: &str = "ROUTE_TEXTS";
pub const MAP_ROUTE_REQUESTS: &str = "ROUTE_REQUESTS";
pub const MAP_ROUTE_LOCKS: &str = "ROUTE_LOCKS";
/// The CPU sampler's samples of the target per route.
pub const MAP_ROUTE_CPU: &str = "ROUTE_CPU";
pub const MAP_PHP_MISSES: &str = "PHP_MISSES";
/// Offsets into PHP's and the kernel's structures, set before load.
pub const MAP_PHP_OFFSETS: &str = "PHP_OFFSETS";

/// Every program, map and global above: a unit test checks them against
/// the embedded object, both ways.
pub const PROGRAMS: &[&str] = &[
    PROGRAM_LOCK_CALL,
    PROGRAM_REQUEST_BOUNDARY,
    PROGRAM_FUTEX_ENTER,
    PROGRAM_FUTEX_EXIT,
    PROGRAM_TRY_LOCK_EXIT,
    PROGRAM_FUTEX_WAITV_ENTER,
    PROGRAM_FUTEX_WAITV_EXIT,
    PROGRAM_COND_WAIT_ENTER,
    PROGRAM_COND_WAIT_EXIT,
    PROGRAM_UNLOCK_CALL,
    PROGRAM_BREAKPOINT_ANCHOR,
    PROGRAM_LOCK_INIT,
    PROGRAM_INPROC_SAMPLE,
    PROGRAM_MUNMAP_ENTER,
    PROGRAM_MREMAP_ENTER,
    PROGRAM_MMAP_ENTER,
    PROGRAM_MMAP_EXIT,
    PROGRAM_PROCESS_EXEC,
    PROGRAM_CPU_SAMPLE,
    PROGRAM_KERNEL_LOCK_BEGIN,
    PROGRAM_KERNEL_LOCK_END,
    PROGRAM_THREAD_EXIT,
    PROGRAM_THREAD_FREE,
];
pub const MAPS: &[&str] = &[
    MAP_FAILED_TRIES,
    MAP_GENERATION,
    MAP_UNMAPPED,
    MAP_UNMAPPED_COUNT,
    MAP_WATCHED,
    MAP_LOCKS,
    MAP_FUTEXES,
    MAP_CALLERS,
    MAP_STACK_COUNTS,
    MAP_SNAPSHOTS,
    MAP_REQUESTS,
    MAP_COUNTING,
    MAP_LOCK_CODE,
    MAP_DROPS,
    MAP_CONDVARS,
    MAP_COND_CALLS,
    MAP_GO_FUTEXES,
    MAP_WAIT_HOLDERS,
    MAP_HOLDS,
    MAP_HOLDERS,
    MAP_UNLOCK_HITS,
    MAP_WAITING,
    MAP_HELD,
    MAP_CPU_LOCK_CODE,
    MAP_CPU_LOCKS,
    MAP_CPU_COUNTS,
    MAP_PROBE_COOKIES,
    MAP_HANDOFFS,
    MAP_CPU_PLACES,
    MAP_PHP_THREADS,
    MAP_ROUTE_TEXTS,
    MAP_ROUTE_REQUESTS,
    MAP_ROUTE_LOCKS,
    MAP_ROUTE_CPU,
    MAP_PHP_MISSES,
    MAP_PHP_OFFSETS,
    MAP_KERNEL_LOCKS,
    MAP_KERNEL_LOCK_STACKS,
    MAP_KERNEL_LOCK_SITES,
    MAP_KERNEL_LOCK_EVENTS,
    MAP_EXITING,
];
/// Maps only the BPF side uses (per-thread state between its programs).
pub const BPF_ONLY_MAPS: &[&str] = &[
    "PENDING_TRIES",
    "COND_THREADS",
    "LOCK_HOLDER",
    "THREAD_ROUTES",
    "RECENT",
    "RECENT_NEXT",
    "MAPPING",
    "KERNEL_LOCK_BEGINS",
];
pub const GLOBALS: &[&str] = &[
    GLOBAL_TARGET_TGID,
    GLOBAL_FLAGS,
    GLOBAL_GO_FUTEX_START,
    GLOBAL_GO_FUTEX_END,
    GLOBAL_LOCK_CODE_RANGES,
    GLOBAL_CPU_LOCK_CODE_RANGES,
    GLOBAL_KERNEL_CAPS,
    GLOBAL_FREE_PID_OFFSET,
];
