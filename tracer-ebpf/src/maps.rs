//! Every map and global the programs share, in one place: userspace finds
//! them by these names (`tracer-user/src/trace`).

use aya_ebpf::{
    Global,
    bindings::BPF_F_NO_PREALLOC,
    macros::map,
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf, StackTrace},
};
use tracer_common::{
    CallerKey, CodeRange, CondWait, CpuPlace, CpuSamples, FutexCounts, FutexWait, HandoffCounts,
    HeldKey, HoldCounts, Holder, HolderHolds, HolderKey, KernelLockBegin, KernelLockCounts,
    KernelLockKey, KernelLockSite, LockCounts, MAX_CALLERS, MAX_CONDVARS, MAX_CPU_LOCK_CODE_RANGES,
    MAX_CPU_LOCKS, MAX_CPUS, MAX_FUTEXES, MAX_HELD, MAX_HOLDERS, MAX_LOCK_CODE_RANGES, MAX_LOCKS,
    MAX_PROBE_POINTS, MAX_STACKS, MAX_WAITING_THREADS, PendingKey, PendingTry, SNAPSHOT_RING_BYTES,
    StackKey, Unmapped, WaitHolderKey, WaitTime, cpu_sample, drop_reason, kernel_lock, lifetime,
    php::{
        MAX_ROUTE_KEYS, MAX_ROUTE_LOCKS, MAX_ROUTES, MAX_THREADS, PhpOffsets, RouteLockCounts,
        RouteLockKey, RouteText, miss,
    },
    requests,
};

/// Host tgid of the target process; set by userspace before load.
#[unsafe(no_mangle)]
pub(crate) static TARGET_TGID: Global<u32> = Global::new(0);
/// Bits from `tracer_common::flags`; set by userspace before load.
#[unsafe(no_mangle)]
pub(crate) static FLAGS: Global<u32> = Global::new(0);
/// Go programs: the code range of `runtime.futex`; set by userspace before load.
#[unsafe(no_mangle)]
pub(crate) static GO_FUTEX_START: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static GO_FUTEX_END: Global<u64> = Global::new(0);
/// How many entries of `LOCK_CODE` are used; set by userspace before load.
#[unsafe(no_mangle)]
pub(crate) static LOCK_CODE_RANGES: Global<u32> = Global::new(0);
/// Bits of `tracer_common::kernel_caps`; set by userspace before load. A
/// read-only global: the verifier resolves branches on it, so a helper the
/// kernel lacks sits in dead code and is never checked.
#[unsafe(no_mangle)]
pub(crate) static KERNEL_CAPS: Global<u32> = Global::new(0);
/// The offset of `pid` in sched:sched_process_free's record (its format
/// file: 24 with `comm` inline, 12 where `comm` is a `__data_loc`, 6.x);
/// set by userspace before load.
#[unsafe(no_mangle)]
pub(crate) static FREE_PID_OFFSET: Global<u32> = Global::new(0);

/// Kernels without attach cookies: the probe point's address in the
/// target → its cookie (userspace fills it at attach).
#[map]
pub(crate) static PROBE_COOKIES: HashMap<u64, u64> = HashMap::with_max_entries(MAX_PROBE_POINTS, 0);

/// Lock calls whose caller is not in `CALLERS` (not recorded, unreadable, or
/// the map was full). A lock's acquisitions are its `CALLERS` entries plus
/// its entry here: each call is counted in exactly one of the two.
#[map]
pub(crate) static LOCKS: HashMap<u64, LockCounts> = HashMap::with_max_entries(MAX_LOCKS, 0);
/// Per lock (keyed like `LOCKS`): the CPU of its last acquisition and its
/// acquisitions on another CPU by `tracer_common::handoff_class`.
#[map]
pub(crate) static HANDOFFS: HashMap<u64, HandoffCounts> = HashMap::with_max_entries(MAX_LOCKS, 0);
/// CPU number → its core and L3 cache (userspace fills it at attach).
#[map]
pub(crate) static CPU_PLACES: Array<CpuPlace> = Array::with_max_entries(MAX_CPUS, 0);
/// Runtime code range `[start, end)` of each lock function (`--hold-times`):
/// a lock call returning into one was made by another lock function (musl
/// nests them). One range per function: an interposer library between them
/// must not be inside.
#[map]
pub(crate) static LOCK_CODE: Array<[u64; 2]> = Array::with_max_entries(MAX_LOCK_CODE_RANGES, 0);
#[map]
pub(crate) static FUTEXES: HashMap<u64, FutexCounts> =
    HashMap::with_max_entries(MAX_FUTEXES, BPF_F_NO_PREALLOC);
#[map]
pub(crate) static WAITING: HashMap<u32, FutexWait> =
    HashMap::with_max_entries(MAX_WAITING_THREADS, 0);
/// Lock calls per (lock, caller, function), per CPU: the lock path's one
/// hash update, on a line no other CPU writes.
#[map]
pub(crate) static CALLERS: PerCpuHashMap<CallerKey, u64> =
    PerCpuHashMap::with_max_entries(MAX_CALLERS, 0);
/// Calls of lock functions that may fail, between entry and return, by thread.
#[map]
pub(crate) static PENDING_TRIES: HashMap<PendingKey, PendingTry> =
    HashMap::with_max_entries(MAX_WAITING_THREADS, 0);
/// Calls that failed (busy, timed out) per (lock, caller, function): counted
/// at the entry like any call, taken off the acquisitions by userspace.
#[map]
pub(crate) static FAILED_TRIES: HashMap<CallerKey, u64> = HashMap::with_max_entries(MAX_CALLERS, 0);
#[map]
pub(crate) static STACK_COUNTS: HashMap<StackKey, u64> = HashMap::with_max_entries(MAX_STACKS, 0);
/// Registers and user-stack copies of sampled `STACK_COUNTS` counts, for
/// the user-space unwinder (userspace sizes it down to a page without
/// `--stacks`).
#[map]
pub(crate) static SNAPSHOTS: RingBuf = RingBuf::with_byte_size(SNAPSHOT_RING_BYTES, 0);
/// Calls of the request-boundary function (slots: `tracer_common::requests`), when one is probed.
#[map]
pub(crate) static REQUESTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(requests::SLOTS, 0);
/// Index 0: bits of `tracer_common::counting`, what counts right now.
#[map]
pub(crate) static COUNTING: Array<u32> = Array::with_max_entries(1, 0);
/// Threads inside a condvar wait function, by thread id.
#[map]
pub(crate) static COND_THREADS: HashMap<u32, CondWait> =
    HashMap::with_max_entries(MAX_WAITING_THREADS, 0);
/// Waits for a condition, keyed by the condvar's address (musl's waiters
/// sleep on a node on their own stack, so the futex word would not say which).
#[map]
pub(crate) static CONDVARS: HashMap<u64, FutexCounts> = HashMap::with_max_entries(MAX_CONDVARS, 0);
/// Calls of the condvar wait functions (index 0): what their probes cost.
#[map]
pub(crate) static COND_CALLS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Futex calls of the Go runtime (`runtime.futex`), keyed by the futex word.
#[map]
pub(crate) static GO_FUTEXES: HashMap<u64, FutexCounts> = HashMap::with_max_entries(MAX_FUTEXES, 0);
/// Futex waits per (futex word, holder at the wait's start).
#[map]
pub(crate) static WAIT_HOLDERS: HashMap<WaitHolderKey, WaitTime> =
    HashMap::with_max_entries(MAX_HOLDERS, BPF_F_NO_PREALLOC);
/// `--hold-times` state: holds in progress per (lock, thread), the current
/// holder per lock, and completed holds per lock and per (lock, call site).
#[map]
// HELD and LOCK_HOLDER churn (an insert and a delete per hold): preallocated,
// so neither allocates on the lock path.
pub(crate) static HELD: HashMap<HeldKey, tracer_common::Held> =
    HashMap::with_max_entries(MAX_HELD, 0);
#[map]
pub(crate) static LOCK_HOLDER: HashMap<u64, Holder> = HashMap::with_max_entries(MAX_HELD, 0);
#[map]
pub(crate) static HOLDS: HashMap<u64, HoldCounts> =
    HashMap::with_max_entries(MAX_LOCKS, BPF_F_NO_PREALLOC);
#[map]
pub(crate) static HOLDERS: HashMap<HolderKey, HolderHolds> =
    HashMap::with_max_entries(MAX_HOLDERS, BPF_F_NO_PREALLOC);
/// Hits of the unlock probes (index 0), for the overhead footer.
#[map]
pub(crate) static UNLOCK_HITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
#[map]
pub(crate) static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(drop_reason::COUNT, 0);

/// The current generation of the target's memory (see `tracer_common::lifetime`).
#[map]
pub(crate) static GENERATION: Array<u64> = Array::with_max_entries(1, 0);
/// The log of watched memory that went away, per CPU (no atomic
/// fetch-and-add before Linux 5.12), and how much of it is filled.
#[map]
pub(crate) static UNMAPPED: PerCpuArray<Unmapped> =
    PerCpuArray::with_max_entries(lifetime::LOG_ENTRIES, 0);
#[map]
pub(crate) static UNMAPPED_COUNT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// The target's module mappings, `[start, end)` (unused entries are
/// `[0, 0)`): an unmap over one of them ends the lifetimes of its locks.
/// Userspace refreshes it as modules come and go.
#[map]
pub(crate) static WATCHED: Array<[u64; 2]> = Array::with_max_entries(lifetime::WATCHED_RANGES, 0);
/// Code mappings the target's loader made lately, `[start, end)`, written
/// at the `mmap`'s return (a ring: `RECENT_NEXT` counts the writes).
#[map]
pub(crate) static RECENT: Array<[u64; 2]> = Array::with_max_entries(lifetime::RECENT_RANGES, 0);
#[map]
pub(crate) static RECENT_NEXT: Array<u64> = Array::with_max_entries(1, 0);
/// The length of a loader's `mmap` in flight, by thread (pid_tgid).
#[map]
pub(crate) static MAPPING: HashMap<u64, u64> = HashMap::with_max_entries(1024, 0);

/// Number of filled entries of `CPU_LOCK_CODE`; set by userspace before load.
#[unsafe(no_mangle)]
pub(crate) static CPU_LOCK_CODE_RANGES: Global<u32> = Global::new(0);

/// The lock functions' and slow paths' runtime code ranges, one per function.
#[map]
pub(crate) static CPU_LOCK_CODE: Array<CodeRange> =
    Array::with_max_entries(MAX_CPU_LOCK_CODE_RANGES, 0);
/// Lock-code samples per attributed address (mutex argument or futex word).
/// Preallocated: Linux before 6.1 refuses run-time allocation here.
#[map]
pub(crate) static CPU_LOCKS: HashMap<u64, CpuSamples> = HashMap::with_max_entries(MAX_CPU_LOCKS, 0);
/// The target's samples by class (see `tracer_common::cpu_sample`).
#[map]
pub(crate) static CPU_COUNTS: Array<u64> = Array::with_max_entries(cpu_sample::COUNT, 0);

/// `--php` (see `tracer_common::php`): the offsets to read PHP's state
/// with (index 0; userspace fills it at attach).
#[map]
pub(crate) static PHP_OFFSETS: Array<PhpOffsets> = Array::with_max_entries(1, 0);
/// PHP's threads: thread pointer → the thread's block of PHP globals
/// (userspace loads it from PHP's own table, and again as threads come).
#[map]
pub(crate) static PHP_THREADS: HashMap<u64, u64> = HashMap::with_max_entries(MAX_THREADS, 0);
/// The route of each thread's current (or last) request, and its last lock
/// call, by thread id.
#[map]
pub(crate) static THREAD_ROUTES: HashMap<u32, tracer_common::ThreadRoute> =
    HashMap::with_max_entries(MAX_WAITING_THREADS, 0);
/// Each route's method and path, by its hash.
#[map]
pub(crate) static ROUTE_TEXTS: HashMap<u64, RouteText> = HashMap::with_max_entries(MAX_ROUTES, 0);
/// Requests per route (never full: `ROUTE_TEXTS` bounds the routes, and
/// the special keys have room of their own).
#[map]
pub(crate) static ROUTE_REQUESTS: HashMap<u64, u64> = HashMap::with_max_entries(MAX_ROUTE_KEYS, 0);
/// Acquisitions and contended waits per (route, lock).
#[map]
pub(crate) static ROUTE_LOCKS: HashMap<RouteLockKey, RouteLockCounts> =
    HashMap::with_max_entries(MAX_ROUTE_LOCKS, 0);
/// The CPU sampler's samples of the target's threads per route.
#[map]
pub(crate) static ROUTE_CPU: HashMap<u64, u64> = HashMap::with_max_entries(MAX_ROUTE_KEYS, 0);
/// Events whose PHP context could not be read, by `tracer_common::php::miss`.
#[map]
pub(crate) static PHP_MISSES: PerCpuArray<u64> = PerCpuArray::with_max_entries(miss::COUNT, 0);

/// Kernel lock contentions of the target (`kernlocks`), and each thread's
/// contention in progress.
#[map]
pub(crate) static KERNEL_LOCKS: HashMap<KernelLockKey, KernelLockCounts> =
    HashMap::with_max_entries(kernel_lock::MAX_KEYS, BPF_F_NO_PREALLOC);
#[map]
pub(crate) static KERNEL_LOCK_BEGINS: HashMap<u32, KernelLockBegin> =
    HashMap::with_max_entries(MAX_WAITING_THREADS, 0);
/// The target's threads that began to exit (sched_process_exit) and are
/// not freed yet: a recording that ends with the target's exit waits for
/// none to be left before it stops counting (see `kernlocks::thread_free`).
#[map]
pub(crate) static EXITING: HashMap<u32, u8> = HashMap::with_max_entries(MAX_THREADS, 0);
/// Each kernel lock site's contentions and last kernel stack taken
/// (`kernlocks::kernel_stack_of`).
#[map]
pub(crate) static KERNEL_LOCK_SITES: HashMap<KernelLockKey, KernelLockSite> =
    HashMap::with_max_entries(kernel_lock::MAX_KEYS, BPF_F_NO_PREALLOC);
/// Kernel stacks of the contentions' begins.
#[map]
pub(crate) static KERNEL_LOCK_STACKS: StackTrace =
    StackTrace::with_max_entries(kernel_lock::MAX_STACKS, 0);
/// Events of the kernel lock programs by `tracer_common::kernel_lock::event`.
#[map]
pub(crate) static KERNEL_LOCK_EVENTS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(kernel_lock::event::COUNT, 0);
