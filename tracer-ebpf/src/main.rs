//! locktrace's BPF programs: count lock calls per lock address (uprobes on the
//! pthread lock functions) and futex waits/wakes per futex address (syscall
//! tracepoints), for one target process. Userspace reads the maps at the end.
//!
//! Every counter is updated with an atomic add on a hash map entry that is
//! first created with BPF_NOEXIST, so no increment is lost when two threads
//! insert the same key at once. An insert that fails because the map is full
//! is counted in `DROPS`, never silent. Counters only ever summed (lock calls
//! per caller, hits, drops) are per CPU, so no cache line is written by every
//! CPU on the lock path. Every program first checks `COUNTING`, the switch
//! userspace clears before it reads the maps.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

use core::intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xadd};

use aya_ebpf::{
    EbpfContext, Global,
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST, pt_regs},
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
        generated::{
            bpf_get_attach_cookie, bpf_get_current_task_btf,
            bpf_probe_read_user as bpf_probe_read_user_raw, bpf_task_pt_regs,
        },
    },
    macros::{map, perf_event, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{PerfEventContext, ProbeContext, RetProbeContext, TracePointContext},
};
use tracer_common::{
    CallerKey, CodeRange, CondWait, CpuSamples, FutexCounts, FutexWait, HeldKey, HoldCounts,
    Holder, HolderHolds, HolderKey, LOCK_OPS, LockCounts, LockOp, MAX_CALLERS, MAX_CONDVARS,
    MAX_CPU_LOCK_CODE_RANGES, MAX_CPU_LOCKS, MAX_FUTEXES, MAX_HELD, MAX_HOLDERS,
    MAX_LOCK_CODE_RANGES, MAX_LOCKS, MAX_PROBE_POINTS, MAX_STACKS, MAX_WAITING_THREADS, MUTEX_SPAN,
    PendingKey, PendingTry, SNAPSHOT_RING_BYTES, STACK_WINDOW, StackKey, StackSnapshot, Unmapped,
    WaitHolderKey, WaitTime, cookie, counting, cpu_sample, drop_reason, flags, histogram,
    kernel_caps, lifetime, requests, snapshot_due, stack_kind, wait_class,
};

/// Host tgid of the target process; set by userspace before load.
#[unsafe(no_mangle)]
static TARGET_TGID: Global<u32> = Global::new(0);
/// Bits from `tracer_common::flags`; set by userspace before load.
#[unsafe(no_mangle)]
static FLAGS: Global<u32> = Global::new(0);
/// Go programs: the code range of `runtime.futex`; set by userspace before load.
#[unsafe(no_mangle)]
static GO_FUTEX_START: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
static GO_FUTEX_END: Global<u64> = Global::new(0);
/// How many entries of `LOCK_CODE` are used; set by userspace before load.
#[unsafe(no_mangle)]
static LOCK_CODE_RANGES: Global<u32> = Global::new(0);
/// Bits of `tracer_common::kernel_caps`; set by userspace before load. A
/// read-only global: the verifier resolves branches on it, so a helper the
/// kernel lacks sits in dead code and is never checked.
#[unsafe(no_mangle)]
static KERNEL_CAPS: Global<u32> = Global::new(0);

/// Kernels without attach cookies: the probe point's address in the
/// target → its cookie (userspace fills it at attach).
#[map]
static PROBE_COOKIES: HashMap<u64, u64> = HashMap::with_max_entries(MAX_PROBE_POINTS, 0);

/// Lock calls whose caller is not in `CALLERS` (not recorded, unreadable, or
/// the map was full). A lock's acquisitions are its `CALLERS` entries plus
/// its entry here: each call is counted in exactly one of the two.
#[map]
static LOCKS: HashMap<u64, LockCounts> = HashMap::with_max_entries(MAX_LOCKS, 0);
/// Runtime code range `[start, end)` of each lock function (`--hold-times`):
/// a lock call returning into one was made by another lock function (musl
/// nests them). One range per function: an interposer library between them
/// must not be inside.
#[map]
static LOCK_CODE: Array<[u64; 2]> = Array::with_max_entries(MAX_LOCK_CODE_RANGES, 0);
#[map]
static FUTEXES: HashMap<u64, FutexCounts> =
    HashMap::with_max_entries(MAX_FUTEXES, BPF_F_NO_PREALLOC);
#[map]
static WAITING: HashMap<u32, FutexWait> = HashMap::with_max_entries(MAX_WAITING_THREADS, 0);
/// Lock calls per (lock, caller, function), per CPU: the lock path's one
/// hash update, on a line no other CPU writes.
#[map]
static CALLERS: PerCpuHashMap<CallerKey, u64> = PerCpuHashMap::with_max_entries(MAX_CALLERS, 0);
/// Calls of lock functions that may fail, between entry and return, by thread.
#[map]
static PENDING_TRIES: HashMap<PendingKey, PendingTry> =
    HashMap::with_max_entries(MAX_WAITING_THREADS, 0);
/// Calls that failed (busy, timed out) per (lock, caller, function): counted
/// at the entry like any call, taken off the acquisitions by userspace.
#[map]
static FAILED_TRIES: HashMap<CallerKey, u64> = HashMap::with_max_entries(MAX_CALLERS, 0);
#[map]
static STACK_COUNTS: HashMap<StackKey, u64> = HashMap::with_max_entries(MAX_STACKS, 0);
/// Registers and user-stack copies of sampled `STACK_COUNTS` counts, for
/// the user-space unwinder (userspace sizes it down to a page without
/// `--stacks`).
#[map]
static SNAPSHOTS: RingBuf = RingBuf::with_byte_size(SNAPSHOT_RING_BYTES, 0);
/// Calls of the request-boundary function (slots: `tracer_common::requests`), when one is probed.
#[map]
static REQUESTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(requests::SLOTS, 0);
/// Index 0: bits of `tracer_common::counting`, what counts right now.
#[map]
static COUNTING: Array<u32> = Array::with_max_entries(1, 0);
/// Threads inside a condvar wait function, by thread id.
#[map]
static COND_THREADS: HashMap<u32, CondWait> = HashMap::with_max_entries(MAX_WAITING_THREADS, 0);
/// Waits for a condition, keyed by the condvar's address (musl's waiters
/// sleep on a node on their own stack, so the futex word would not say which).
#[map]
static CONDVARS: HashMap<u64, FutexCounts> = HashMap::with_max_entries(MAX_CONDVARS, 0);
/// Calls of the condvar wait functions (index 0): what their probes cost.
#[map]
static COND_CALLS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Futex calls of the Go runtime (`runtime.futex`), keyed by the futex word.
#[map]
static GO_FUTEXES: HashMap<u64, FutexCounts> = HashMap::with_max_entries(MAX_FUTEXES, 0);
/// Futex waits per (futex word, holder at the wait's start).
#[map]
static WAIT_HOLDERS: HashMap<WaitHolderKey, WaitTime> =
    HashMap::with_max_entries(MAX_HOLDERS, BPF_F_NO_PREALLOC);
/// `--hold-times` state: holds in progress per (lock, thread), the current
/// holder per lock, and completed holds per lock and per (lock, call site).
#[map]
// HELD and LOCK_HOLDER churn (an insert and a delete per hold): preallocated,
// so neither allocates on the lock path.
static HELD: HashMap<HeldKey, tracer_common::Held> = HashMap::with_max_entries(MAX_HELD, 0);
#[map]
static LOCK_HOLDER: HashMap<u64, Holder> = HashMap::with_max_entries(MAX_HELD, 0);
#[map]
static HOLDS: HashMap<u64, HoldCounts> = HashMap::with_max_entries(MAX_LOCKS, BPF_F_NO_PREALLOC);
#[map]
static HOLDERS: HashMap<HolderKey, HolderHolds> =
    HashMap::with_max_entries(MAX_HOLDERS, BPF_F_NO_PREALLOC);
/// Hits of the unlock probes (index 0), for the overhead footer.
#[map]
static UNLOCK_HITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
#[map]
static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(drop_reason::COUNT, 0);

/// The current generation of the target's memory (see `tracer_common::lifetime`).
#[map]
static GENERATION: Array<u64> = Array::with_max_entries(1, 0);
/// The log of watched memory that went away, per CPU (no atomic
/// fetch-and-add before Linux 5.12), and how much of it is filled.
#[map]
static UNMAPPED: PerCpuArray<Unmapped> = PerCpuArray::with_max_entries(lifetime::LOG_ENTRIES, 0);
#[map]
static UNMAPPED_COUNT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// The target's module mappings, `[start, end)` (unused entries are
/// `[0, 0)`): an unmap over one of them ends the lifetimes of its locks.
/// Userspace refreshes it as modules come and go.
#[map]
static WATCHED: Array<[u64; 2]> = Array::with_max_entries(lifetime::WATCHED_RANGES, 0);

/// The map key of the lock or futex word at `address`: the address in the
/// current generation of the target's memory (`tracer_common::lifetime`).
#[inline(always)]
fn key_of(address: u64) -> u64 {
    let generation = GENERATION.get(0).copied().unwrap_or(0);
    lifetime::tag(address, generation)
}

/// True when the program runs in the target process (its tgid, loaded by userspace).
#[inline(always)]
fn is_target<C: EbpfContext>(ctx: &C) -> bool {
    ctx.tgid() == TARGET_TGID.load()
}

/// `COUNTING[0]`: bits of `tracer_common::counting`.
#[inline(always)]
fn counting_state() -> u32 {
    COUNTING.get(0).copied().unwrap_or(0)
}

/// True when the events of `bit` (`tracer_common::counting`) count now. A
/// pause counts the event as dropped.
#[inline(always)]
fn counting(bit: u32) -> bool {
    let state = counting_state();
    if state & counting::PAUSED != 0 {
        count_drop(drop_reason::PAUSED_FOR_EXPIRY);
        return false;
    }
    state & bit != 0
}

/// Adds `value` to the u64 at `counter`, a pointer into a map value.
#[inline(always)]
fn add(counter: *mut u64, value: u64) {
    // Relaxed atomic add with the result unused compiles to BPF's lock xadd.
    // SAFETY: every caller passes a pointer from a map lookup made in this
    // program run: valid, aligned and alive until the program returns.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(counter, value) };
}

/// Monotonic time in ns.
#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: the helper takes no argument and only reads the clock.
    unsafe { bpf_ktime_get_ns() }
}

/// The target thread's user stack pointer at the probe.
#[inline(always)]
fn stack_pointer(ctx: &ProbeContext) -> u64 {
    // SAFETY: a uprobe's context is the pt_regs the kernel passes in, valid
    // for the whole program run.
    unsafe { (*ctx.regs).rsp }
}

#[inline(always)]
fn count_drop(reason: u32) {
    if let Some(counter) = DROPS.get_ptr_mut(reason) {
        add(counter, 1);
    }
}

/// The hash maps counters live in: shared, or one value per CPU.
trait CounterMap<K, V> {
    fn value_ptr(&self, key: &K) -> Option<*mut V>;
    fn insert_new(&self, key: &K, value: V);
}

impl<K, V> CounterMap<K, V> for HashMap<K, V> {
    #[inline(always)]
    fn value_ptr(&self, key: &K) -> Option<*mut V> {
        self.get_ptr_mut(key)
    }
    #[inline(always)]
    fn insert_new(&self, key: &K, value: V) {
        let _ = self.insert(key, value, BPF_NOEXIST as u64);
    }
}

impl<K, V> CounterMap<K, V> for PerCpuHashMap<K, V> {
    #[inline(always)]
    fn value_ptr(&self, key: &K) -> Option<*mut V> {
        self.get_ptr_mut(key)
    }
    #[inline(always)]
    fn insert_new(&self, key: &K, value: V) {
        let _ = self.insert(key, value, BPF_NOEXIST as u64);
    }
}

/// Pointer to the entry of `key`, creating a zeroed one if absent.
/// BPF_NOEXIST makes concurrent first inserts safe: the loser's insert fails
/// with EEXIST and it then finds the winner's entry.
#[inline(always)]
fn entry<K, V: Default>(map: &impl CounterMap<K, V>, key: &K, full_reason: u32) -> Option<*mut V> {
    if let Some(value) = map.value_ptr(key) {
        return Some(value);
    }
    map.insert_new(key, V::default());
    let value = map.value_ptr(key);
    if value.is_none() {
        count_drop(full_reason);
    }
    value
}

/// Atomically raise `*slot` to `value` (a few compare-exchange rounds suffice:
/// each failed round means another CPU raised it meanwhile).
#[inline(always)]
fn raise_to(slot: *mut u64, value: u64) {
    // SAFETY: `slot` points into a map value looked up in this program run.
    let mut seen = unsafe { core::ptr::read_volatile(slot) };
    for _ in 0..8 {
        if seen >= value {
            return;
        }
        // SAFETY: as above; the compare-exchange is atomic on that value.
        let (previous, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::Relaxed }, { AtomicOrdering::Relaxed }>(
                slot, seen, value,
            )
        };
        if swapped {
            return;
        }
        seen = previous;
    }
}

/// Counts nothing. After the main thread left with `pthread_exit`, the lock
/// calls count on uprobe-multi links scoped to the process, whose kernel
/// filter reads the exited main thread's (absent) memory: when any other
/// probe at the same point detaches (another tracer's), the kernel removes
/// the breakpoints from the target. This probe, bound to a live thread at
/// each lock-call point, claims them for the target.
#[uprobe]
pub fn breakpoint_anchor(_ctx: ProbeContext) -> u32 {
    0
}

/// At the entry of the lock init functions (`pthread_mutex_init`,
/// `pthread_rwlock_init`, `pthread_spin_init`; `--stacks`): counts and
/// snapshots where the lock at the first argument's address is created.
#[uprobe]
pub fn lock_init(ctx: ProbeContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::LOCK_CALLS) {
        return 0;
    }
    let Some(lock) = ctx.arg::<u64>(0).map(key_of) else {
        return 0;
    };
    let sp = stack_pointer(&ctx);
    let return_ip = read_return_ip(sp);
    // SAFETY: a uprobe's context is the pt_regs the kernel passes in.
    let regs = unsafe { ((*ctx.regs).rip, sp, (*ctx.regs).rbp) };
    record_stack_of(stack_kind::CREATION, lock, return_ip, regs, sp);
    0
}

/// Attached to every probe point of every pthread lock function. The cookie
/// says which function, and where its return address is on the stack.
#[uprobe]
pub fn lock_call(ctx: ProbeContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::LOCK_CALLS) {
        return 0;
    }
    let wanted = FLAGS.load();
    let Some(lock) = ctx.arg::<u64>(0).map(key_of) else {
        return 0;
    };
    let Some(cookie) = probe_cookie(&ctx) else {
        count_drop(drop_reason::PROBE_POINT_UNKNOWN);
        return 0;
    };
    let op = cookie::op_index(cookie) as usize;
    if op >= LOCK_OPS {
        return 0;
    }
    let slot = stack_pointer(&ctx) + cookie::return_address_sp_offset(cookie);
    let return_ip = read_return_ip(slot);
    if LockOp::index_may_fail(op as u32) {
        // Counted at the return, with its result: a failed call took nothing.
        // A retry loop that jumps back to the entry (musl's CAS loops) is the
        // same call again: its return slot now reads as the kernel's return
        // trampoline, and it must not begin a second hold.
        if !begin_try(slot, lock, op as u32) {
            return 0;
        }
    } else {
        count_call(lock, return_ip, op as u32);
    }
    if wanted & flags::STACKS != 0 {
        // SAFETY: a uprobe's context is the pt_regs the kernel passes in.
        let regs = unsafe { ((*ctx.regs).rip, (*ctx.regs).rsp, (*ctx.regs).rbp) };
        record_stack(lock, return_ip, regs, slot);
    }
    if wanted & flags::HOLDS != 0 {
        hold_begin(&ctx, lock, cookie, op as u32, return_ip);
    }
    0
}

/// The cookie of the probe point that ran this program: the link's (Linux
/// 5.15+), else the one userspace stored under the point's address (the
/// kernel sets the instruction pointer to it before running a uprobe's
/// programs).
#[inline(always)]
fn probe_cookie(ctx: &ProbeContext) -> Option<u64> {
    if KERNEL_CAPS.load() & kernel_caps::ATTACH_COOKIE != 0 {
        // SAFETY: the helper reads the cookie of the link that ran this
        // program from the context the kernel passed in.
        return Some(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) });
    }
    // SAFETY: a uprobe's context is the pt_regs the kernel passes in. The
    // key is copied to the stack first: map helpers refuse a key in the context.
    let ip: u64 = unsafe { core::ptr::read_volatile(&(*ctx.regs).rip) };
    // SAFETY: the map value is copied out at once.
    unsafe { PROBE_COOKIES.get(ip).copied() }
}

/// The return address in `slot` (at the probe point it sits at sp + 8
/// bytes per push done since the entry: right even without frame
/// pointers); 0 when unreadable.
#[inline(always)]
fn read_return_ip(slot: u64) -> u64 {
    // SAFETY: the helper checks the user address and fails (never faults)
    // when it is not readable.
    match unsafe { bpf_probe_read_user(slot as *const u64) } {
        Ok(return_ip) => return_ip,
        Err(_) => {
            count_drop(drop_reason::CALLER_UNREADABLE);
            0
        }
    }
}

/// Counts a lock call once: under its caller, else (caller unknown, or
/// CALLERS full) in LOCKS.
#[inline(always)]
fn count_call(lock: u64, return_ip: u64, op: u32) {
    // Read back through memory: the bound checked below is then on the
    // very register used as the index (the compiler otherwise re-derives
    // the index from `op`, and the verifier loses the bound).
    let index = op as usize;
    // SAFETY: a read of a local.
    let index = unsafe { core::ptr::read_volatile(&index) };
    if index >= LOCK_OPS {
        return;
    }
    if return_ip != 0 {
        let key = CallerKey {
            lock,
            return_ip,
            op,
            _pad: 0,
        };
        if let Some(count) = entry(&CALLERS, &key, drop_reason::CALLERS_FULL) {
            add(count, 1);
            return;
        }
    }
    if let Some(counts) = entry(&LOCKS, &lock, drop_reason::LOCKS_FULL) {
        // SAFETY: `counts` is the map value just looked up; `index < LOCK_OPS`.
        add(unsafe { &mut (*counts).calls[index] }, 1);
    }
}

/// The entry of a call that may fail, until its return (`try_lock_exit`).
/// Keyed by thread and return slot: musl's timed functions call the try
/// ones, and a retry loop that jumps back to the entry re-enters it with
/// the same slot.
/// Returns false for a re-entry of a call already pending.
#[inline(always)]
fn begin_try(slot: u64, lock: u64, op: u32) -> bool {
    let key = PendingKey {
        tid: bpf_get_current_pid_tgid() as u32,
        _pad: 0,
        return_slot: slot,
    };
    // SAFETY: only tested for presence, within this program run.
    if unsafe { PENDING_TRIES.get(key) }.is_some() {
        return false;
    }
    if PENDING_TRIES
        .insert(key, PendingTry { lock, op, _pad: 0 }, 0)
        .is_err()
    {
        count_drop(drop_reason::FAILED_TRIES_UNTRACKED);
    }
    true
}

/// Return of a lock function that may fail (trylock, timed and clock
/// variants): counts the call, as an acquisition when it returned 0, as a
/// failed try otherwise (EBUSY, ETIMEDOUT, …). The caller is the address
/// returned to: the entry's return slot may hold the kernel's return
/// trampoline by then (a retry loop re-entering the function).
#[uretprobe]
pub fn try_lock_exit(ctx: RetProbeContext) -> u32 {
    if !is_target(&ctx) {
        return 0;
    }
    // SAFETY: a uretprobe's context is the pt_regs the kernel passes in.
    let (sp, ip, result) = unsafe { ((*ctx.regs).rsp, (*ctx.regs).rip, (*ctx.regs).rax as u32) };
    let key = PendingKey {
        tid: bpf_get_current_pid_tgid() as u32,
        _pad: 0,
        return_slot: sp.wrapping_sub(8),
    };
    // SAFETY: the value is copied out at once, before the entry is removed.
    let Some(pending) = (unsafe { PENDING_TRIES.get(key) }).copied() else {
        return 0;
    };
    let _ = PENDING_TRIES.remove(key);
    if !counting(counting::LOCK_CALLS) {
        return 0;
    }
    if result == 0 {
        count_call(pending.lock, ip, pending.op);
        return 0;
    }
    let failed = CallerKey {
        lock: pending.lock,
        return_ip: ip,
        op: pending.op,
        _pad: 0,
    };
    if let Some(count) = entry(&FAILED_TRIES, &failed, drop_reason::FAILED_TRIES_UNTRACKED) {
        add(count, 1);
    }
    0
}

/// Counts the call (or wait) under `(lock, return_ip)` and, when the count
/// is due (`snapshot_due`), sends a snapshot of the user registers `regs`
/// (ip, sp, bp) and stack for the unwinder; `return_slot` is where the
/// return address is (0: not at a call's entry). No kernel stack walk: it
/// follows frame pointers, and through code built without them it returned
/// a new garbage stack per call (thousands of keys, each wanting its own
/// snapshots).
#[inline(always)]
fn record_stack(lock: u64, return_ip: u64, regs: (u64, u64, u64), return_slot: u64) {
    record_stack_of(stack_kind::USE, lock, return_ip, regs, return_slot);
}

/// [`record_stack`] under a key of `kind` (`stack_kind`).
#[inline(always)]
fn record_stack_of(kind: i64, lock: u64, return_ip: u64, regs: (u64, u64, u64), return_slot: u64) {
    let key = StackKey {
        lock,
        stack_id: kind,
        return_ip,
    };
    if let Some(count) = entry(&STACK_COUNTS, &key, drop_reason::STACK_COUNTS_FULL) {
        add(count, 1);
        // Read after the add, not fetched by it (fetching atomics need
        // Linux 5.12): two CPUs may read the same count, which only moves
        // the weight between their snapshots.
        // SAFETY: `count` is the map value just looked up.
        let n = unsafe { core::ptr::read_volatile(count) };
        if snapshot_due(n) {
            send_snapshot(&key, n, regs, return_slot);
        }
    }
}

/// Whole pages in a snapshot's window.
const WINDOW_PAGES: u64 = STACK_WINDOW as u64 / 4096;

/// One snapshot into `SNAPSHOTS`: the largest window of the user stack
/// that reads (a thread's stack may end closer than `STACK_WINDOW`).
#[inline(always)]
fn send_snapshot(key: &StackKey, count_at: u64, (ip, sp, bp): (u64, u64, u64), return_slot: u64) {
    let Some(mut entry) = SNAPSHOTS.reserve::<StackSnapshot>(0) else {
        count_drop(drop_reason::SNAPSHOTS_LOST);
        return;
    };
    let snapshot = entry.as_mut_ptr();
    // SAFETY: `snapshot` is the ring buffer record just reserved, of the
    // snapshot's size; the read helper checks the user address and fails
    // (never faults).
    unsafe {
        (*snapshot).header.key = *key;
        (*snapshot).header.count_at = count_at;
        (*snapshot).header.ip = ip;
        (*snapshot).header.sp = sp;
        (*snapshot).header.bp = bp;
        (*snapshot).header.return_slot = return_slot;
        (*snapshot).header.len = 0;
        let stack = (*snapshot).stack.as_mut_ptr() as *mut core::ffi::c_void;
        // The read fails as a whole at the first page that is not there
        // (a thread's stack may end a few KiB above a deep frame): then the
        // longest read that ends at a page boundary, down to the rest of
        // sp's own page, which always reads.
        let page_rest = 4096 - (sp & 4095);
        for pages in (0..=WINDOW_PAGES).rev() {
            let size = if pages == WINDOW_PAGES {
                STACK_WINDOW as u64
            } else {
                page_rest + pages * 4096
            };
            // SAFETY: a read of a local (keeps the bound below on the very
            // register passed to the helper).
            let size = core::ptr::read_volatile(&size);
            if size == 0 || size > STACK_WINDOW as u64 {
                continue;
            }
            if bpf_probe_read_user_raw(stack, size as u32, sp as *const core::ffi::c_void) == 0 {
                (*snapshot).header.len = size;
                break;
            }
        }
    }
    entry.submit(0);
}

/// Attached to the user's request-boundary function (`--request-probe`).
#[uprobe]
pub fn request_boundary(ctx: ProbeContext) -> u32 {
    if !is_target(&ctx) {
        return 0;
    }
    let state = counting_state();
    if state & counting::PAUSED != 0 {
        count_drop(drop_reason::PAUSED_FOR_EXPIRY);
        return 0;
    }
    // Sampled mode: requests count over the same windows as the locks, and
    // over the whole recording (what the windows' counts are scaled to).
    if state & counting::LOCK_CALLS != 0
        && let Some(counter) = REQUESTS.get_ptr_mut(requests::WHILE_COUNTING)
    {
        add(counter, 1);
    }
    if state & counting::WAITS != 0
        && let Some(counter) = REQUESTS.get_ptr_mut(requests::WHOLE_RECORDING)
    {
        add(counter, 1);
    }
    0
}

// Offsets in the syscalls:sys_enter_futex record
// (see /sys/kernel/tracing/events/syscalls/sys_enter_futex/format).
const ENTER_UADDR: usize = 16;
const ENTER_OP: usize = 24;

/// The u64 field at `offset` of a syscall tracepoint's record, loaded
/// directly: the verifier checks a tracepoint program's context reads
/// against the record's size when it attaches, so no helper call is needed
/// (`read_at` makes one per field).
#[inline(always)]
fn record_u64(ctx: &TracePointContext, offset: usize) -> u64 {
    // SAFETY: `offset` is a u64 field of the record (the format file above);
    // the context is the record, alive for the whole program run.
    unsafe { core::ptr::read((ctx.as_ptr() as *const u8).add(offset) as *const u64) }
}

const FUTEX_CMD_MASK: u64 = !(128 | 256); // ~(FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME)

enum FutexKind {
    Wait,
    Wake,
    Other,
}

#[inline(always)]
fn futex_kind(op: u64) -> FutexKind {
    match op & FUTEX_CMD_MASK {
        // WAIT, LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI, LOCK_PI2
        0 | 6 | 9 | 11 | 13 => FutexKind::Wait,
        // WAKE, REQUEUE, CMP_REQUEUE, WAKE_OP, UNLOCK_PI, WAKE_BITSET, CMP_REQUEUE_PI
        1 | 3 | 4 | 5 | 7 | 10 | 12 => FutexKind::Wake,
        _ => FutexKind::Other,
    }
}

/// Entry of `pthread_cond_wait`, `_timedwait`, `_clockwait` (cond, mutex, …):
/// the thread's futex waits until the return are waits for the condition.
#[uprobe]
pub fn cond_wait_enter(ctx: ProbeContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::WAITS) {
        return 0;
    }
    let (Some(cond), Some(mutex)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) else {
        return 0;
    };
    let (cond, mutex) = (key_of(cond), key_of(mutex));
    if let Some(calls) = COND_CALLS.get_ptr_mut(0) {
        add(calls, 1);
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    if COND_THREADS
        .insert(tid, CondWait { cond, mutex }, 0)
        .is_err()
    {
        count_drop(drop_reason::COND_WAITS_UNTRACKED);
    }
    0
}

/// Return of the condvar wait functions.
#[uretprobe]
pub fn cond_wait_exit(ctx: RetProbeContext) -> u32 {
    if is_target(&ctx) {
        let _ = COND_THREADS.remove(bpf_get_current_pid_tgid() as u32);
    }
    0
}

/// The user registers the kernel saved when the current thread entered it
/// (syscall, interrupt or trap); `None` when the helper gives none.
#[inline(always)]
fn saved_user_regs() -> Option<*const pt_regs> {
    if KERNEL_CAPS.load() & kernel_caps::TASK_REGS == 0 {
        return None;
    }
    // SAFETY: both helpers take the current task, which lives for this run.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs };
    (!regs.is_null()).then_some(regs)
}

/// True when the futex call was made from the Go runtime's `runtime.futex`:
/// the syscall returns into it. The return address is the user `rip` the
/// kernel saved at the syscall entry: one read, where a one-frame
/// `bpf_get_stack` went through the perf callchain code on every call.
#[inline(always)]
fn from_go_runtime() -> bool {
    if FLAGS.load() & flags::GO_RUNTIME == 0 {
        return false;
    }
    let Some(regs) = saved_user_regs() else {
        return false;
    };
    // SAFETY: `regs` is the helper's typed (BTF) pointer to the current
    // task's saved registers: the verifier makes the load a checked one
    // (a fault reads 0), so no read helper is needed.
    let user_ip = unsafe { core::ptr::read_volatile(&(*regs).rip) };
    user_ip >= GO_FUTEX_START.load() && user_ip < GO_FUTEX_END.load()
}

/// Where a wait of this thread on `uaddr` is counted: (class, key).
#[inline(always)]
fn classify_wait(tid: u32, uaddr: u64) -> (u32, u64) {
    if from_go_runtime() {
        return (wait_class::GO_RUNTIME, uaddr);
    }
    // SAFETY: the reference is used at once, within this program run.
    if let Some(cond) = unsafe { COND_THREADS.get(tid) } {
        // Re-acquiring the mutex after the wake is lock contention.
        // Compared without generations: one may have begun since the enter.
        let (word, mutex) = (lifetime::split(uaddr).0, lifetime::split(cond.mutex).0);
        let on_mutex = word >= mutex && word < mutex + MUTEX_SPAN;
        if !on_mutex {
            return (wait_class::CONDVAR, cond.cond);
        }
    }
    (wait_class::FUTEX, uaddr)
}

/// The map a wait of `class` is counted in, and the drop reason when it is full.
#[inline(always)]
fn futex_map(class: u32) -> (&'static HashMap<u64, FutexCounts>, u32) {
    match class {
        wait_class::CONDVAR => (&CONDVARS, drop_reason::CONDVARS_FULL),
        wait_class::GO_RUNTIME => (&GO_FUTEXES, drop_reason::GO_FUTEXES_FULL),
        _ => (&FUTEXES, drop_reason::FUTEXES_FULL),
    }
}

#[tracepoint]
pub fn futex_enter(ctx: TracePointContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::WAITS) {
        return 0;
    }
    let uaddr = key_of(record_u64(&ctx, ENTER_UADDR));
    let op = record_u64(&ctx, ENTER_OP);
    match futex_kind(op) {
        FutexKind::Wait => begin_wait(uaddr),
        FutexKind::Wake => {
            let class = if from_go_runtime() {
                wait_class::GO_RUNTIME
            } else {
                wait_class::FUTEX
            };
            let (map, full_reason) = futex_map(class);
            if let Some(counts) = entry(map, &uaddr, full_reason) {
                // SAFETY: `counts` is the map value just looked up.
                add(unsafe { &mut (*counts).wakes }, 1);
            }
        }
        FutexKind::Other => {}
    }
    0
}

/// The calling thread starts a futex wait on `uaddr`.
#[inline(always)]
fn begin_wait(uaddr: u64) {
    let tid = bpf_get_current_pid_tgid() as u32;
    let (class, key) = classify_wait(tid, uaddr);
    // Holders only mean something for a lock's own futex words.
    let (holder_ip, holder_tid) = if class == wait_class::FUTEX {
        holder_at_wait(uaddr, tid)
    } else {
        (0, 0)
    };
    let wait = FutexWait {
        uaddr: key,
        start_ns: now_ns(),
        class,
        holder_ip,
        holder_tid,
    };
    if WAITING.insert(tid, wait, 0).is_err() {
        count_drop(drop_reason::WAITS_UNTRACKED);
    }
    if FLAGS.load() & flags::STACKS != 0 {
        // SAFETY: the helper's typed (BTF) pointer to the saved registers;
        // the verifier checks these loads (a fault reads 0).
        let regs = saved_user_regs().map_or((0, 0, 0), |regs| unsafe {
            (
                core::ptr::read_volatile(&(*regs).rip),
                core::ptr::read_volatile(&(*regs).rsp),
                core::ptr::read_volatile(&(*regs).rbp),
            )
        });
        record_stack(key, 0, regs, 0);
    }
}

/// `futex_waitv(waiters, nr_futexes, …)` (Linux 5.16+): a wait on several
/// futex words at once, counted on the first (`struct futex_waitv` is
/// `{ u64 val; u64 uaddr; u32 flags; u32 reserved }`).
#[tracepoint]
pub fn futex_waitv_enter(ctx: TracePointContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::WAITS) {
        return 0;
    }
    let waiters = record_u64(&ctx, ENTER_UADDR);
    // SAFETY: the helper checks the user address and fails, never faults.
    if let Ok(uaddr) = unsafe { bpf_probe_read_user((waiters + 8) as *const u64) } {
        begin_wait(key_of(uaddr));
    }
    0
}

/// The return of `futex_waitv`: the end of its wait.
#[tracepoint]
pub fn futex_waitv_exit(ctx: TracePointContext) -> u32 {
    end_wait(&ctx)
}

#[tracepoint]
pub fn futex_exit(ctx: TracePointContext) -> u32 {
    end_wait(&ctx)
}

/// The return of a futex wait syscall: the wait begun at its entry ends.
#[inline(always)]
fn end_wait(ctx: &TracePointContext) -> u32 {
    if !is_target(ctx) {
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: the value is copied out at once, before the entry is removed.
    let Some(wait) = (unsafe { WAITING.get(tid) }).copied() else {
        return 0;
    };
    // After the stop the wait stays in WAITING: it was in progress at the
    // stop, and the end report lists it so (it is not counted as a wait).
    let state = counting_state();
    if state & counting::PAUSED == 0 && state & counting::WAITS == 0 {
        return 0;
    }
    let _ = WAITING.remove(tid);
    if !counting(counting::WAITS) {
        return 0;
    }
    let waited = now_ns().saturating_sub(wait.start_ns);
    let (map, full_reason) = futex_map(wait.class);
    if let Some(counts) = entry(map, &wait.uaddr, full_reason) {
        // SAFETY: `counts` is the map value just looked up; the bucket index
        // is below BUCKETS.
        unsafe {
            add(&mut (*counts).waits, 1);
            add(&mut (*counts).wait_ns, waited);
            raise_to(&mut (*counts).max_wait_ns, waited);
            add(&mut (*counts).wait_histogram[histogram::bucket(waited)], 1);
        }
    }
    count_wait_holder(&wait, waited);
    if FLAGS.load() & flags::HOLDS != 0 && wait.class == wait_class::FUTEX {
        hold_after_wait(wait.uaddr, tid);
    }
    0
}

// ---- holds (`--hold-times`) and holders of contended locks ----
//
// A hold is timed from the thread's lock call (or the end of its last futex
// wait on the lock: it waited, so it had not got it) to its unlock call.
// Without return probes a failed trylock is not seen: its entry is marked
// tentative and restarted by the thread's next lock call on the lock, and it
// only counts as a hold if an unlock comes. Recursive locks and re-entered
// read locks nest (depth): the outermost hold is timed. Read locks are held
// per thread, so an rwlock's hold time sums its readers' holds.

/// Futex words sit at these offsets in the locks (glibc mutex 0, musl mutex
/// 4, glibc rwlock 8 and 12, musl rwlock 0).
const FUTEX_WORD_OFFSETS: [u64; 4] = [0, 4, 8, 12];
/// glibc's pthread_mutex_t keeps the owner's tid at byte 8 (`__data.__owner`).
const GLIBC_MUTEX_OWNER_OFFSET: u64 = 8;

#[inline(always)]
fn hold_begin(ctx: &ProbeContext, lock: u64, cookie: u64, op: u32, return_ip: u64) {
    let tid = bpf_get_current_pid_tgid() as u32;
    let key = HeldKey { lock, tid, _pad: 0 };
    // A trylock may fail and a timed lock time out: without return probes
    // their hold is tentative until an unlock confirms it.
    let tentative = u32::from(LockOp::index_may_fail(op));
    let call_slot = stack_pointer(ctx) + cookie::return_address_sp_offset(cookie);
    let now = now_ns();
    if let Some(held) = HELD.get_ptr_mut(key) {
        let called_by_lock_function = in_lock_code(return_ip);
        // SAFETY: `held` is this thread's HELD value, looked up just now; only
        // this thread writes it.
        // The return address may read as the kernel's return trampoline at a
        // function with a return probe: the slot alone tells a tail call.
        let tail_called = unsafe { (*held).call_slot == call_slot } && LockOp::index_may_fail(op);
        if called_by_lock_function || tail_called {
            return;
        }
        // SAFETY: as above.
        unsafe {
            (*held).call_slot = call_slot;
            (*held).call_ip = return_ip;
            if (*held).tentative != 0 {
                // The earlier trylock may have failed: this call starts the hold.
                (*held).start_ns = now;
                (*held).return_ip = return_ip;
                (*held).depth = 1;
                (*held).tentative = tentative;
            } else {
                (*held).depth += 1;
            }
        }
        return;
    }
    let held = tracer_common::Held {
        start_ns: now,
        return_ip,
        depth: 1,
        tentative,
        call_slot,
        call_ip: return_ip,
    };
    if HELD.insert(key, held, 0).is_err() {
        count_drop(drop_reason::HOLDS_UNTRACKED);
        return;
    }
    // Only a free lock gets a new holder: a thread that will wait for it
    // must not replace the one holding it.
    let holder = Holder {
        return_ip,
        tid,
        _pad: 0,
    };
    let _ = LOCK_HOLDER.insert(lock, holder, BPF_NOEXIST as u64);
}

/// True when `ip` lies inside one of the lock functions.
#[inline(always)]
fn in_lock_code(ip: u64) -> bool {
    let ranges = LOCK_CODE_RANGES.load();
    for index in 0..MAX_LOCK_CODE_RANGES {
        if index >= ranges {
            return false;
        }
        if let Some([start, end]) = LOCK_CODE.get(index)
            && (*start..*end).contains(&ip)
        {
            return true;
        }
    }
    false
}

/// A thread's futex wait on a lock it is acquiring ended: its hold (if it
/// gets the lock now) starts here, and it becomes the holder if none is known.
#[inline(always)]
fn hold_after_wait(uaddr: u64, tid: u32) {
    for offset in FUTEX_WORD_OFFSETS {
        let lock = uaddr.wrapping_sub(offset);
        let key = HeldKey { lock, tid, _pad: 0 };
        if let Some(held) = HELD.get_ptr_mut(key) {
            // SAFETY: this thread's HELD value, looked up just now.
            let return_ip = unsafe {
                (*held).start_ns = now_ns();
                (*held).return_ip
            };
            let holder = Holder {
                return_ip,
                tid,
                _pad: 0,
            };
            let _ = LOCK_HOLDER.insert(lock, holder, BPF_NOEXIST as u64);
            return;
        }
    }
}

/// Who holds the lock of futex word `uaddr` as thread `waiter` starts waiting:
/// (call site, tid), 0 where unknown. The owner field of a glibc mutex is
/// exact; otherwise the holder recorded at its acquisition (`--hold-times`).
#[inline(always)]
fn holder_at_wait(uaddr: u64, waiter: u32) -> (u64, u32) {
    // SAFETY: the helper fails (never faults) on an unreadable user address.
    let word = lifetime::split(uaddr).0;
    let owner = unsafe {
        bpf_probe_read_user((word + GLIBC_MUTEX_OWNER_OFFSET) as *const u32).unwrap_or(0)
    };
    if FLAGS.load() & flags::HOLDS == 0 {
        return (0, owner);
    }
    let key = HeldKey {
        lock: uaddr,
        tid: owner,
        _pad: 0,
    };
    if owner != 0
        && owner != waiter
        // SAFETY: the reference is read at once, within this program run.
        && let Some(held) = unsafe { HELD.get(key) }
    {
        return (held.return_ip, owner);
    }
    for offset in FUTEX_WORD_OFFSETS {
        // SAFETY: the reference is read at once, within this program run.
        if let Some(holder) = unsafe { LOCK_HOLDER.get(uaddr.wrapping_sub(offset)) }
            && holder.tid != waiter
        {
            return (holder.return_ip, holder.tid);
        }
    }
    (0, owner)
}

#[inline(always)]
fn count_wait_holder(wait: &FutexWait, waited: u64) {
    if wait.holder_ip == 0 && wait.holder_tid == 0 {
        return;
    }
    let key = WaitHolderKey {
        uaddr: wait.uaddr,
        return_ip: wait.holder_ip,
        tid: wait.holder_tid,
        _pad: 0,
    };
    if let Some(time) = entry(&WAIT_HOLDERS, &key, drop_reason::WAIT_HOLDERS_FULL) {
        // SAFETY: `time` is the map value just looked up.
        unsafe {
            add(&mut (*time).waits, 1);
            add(&mut (*time).wait_ns, waited);
        }
    }
}

/// Attached (`--hold-times`) to every probe point of pthread_mutex_unlock
/// and pthread_rwlock_unlock: ends the outermost hold of the lock.
#[uprobe]
pub fn unlock_call(ctx: ProbeContext) -> u32 {
    if !is_target(&ctx) || !counting(counting::WAITS) {
        return 0;
    }
    if let Some(hits) = UNLOCK_HITS.get_ptr_mut(0) {
        add(hits, 1);
    }
    let Some(lock) = ctx.arg::<u64>(0).map(key_of) else {
        return 0;
    };
    let tid = bpf_get_current_pid_tgid() as u32;
    let key = HeldKey { lock, tid, _pad: 0 };
    // No entry: the lock was taken before tracing began.
    let Some(held) = HELD.get_ptr_mut(key) else {
        return 0;
    };
    // SAFETY: this thread's HELD value, looked up just now; only this thread
    // writes it.
    let (start_ns, return_ip) = unsafe {
        if (*held).depth > 1 {
            (*held).depth -= 1;
            return 0;
        }
        ((*held).start_ns, (*held).return_ip)
    };
    let _ = HELD.remove(key);
    // SAFETY: the reference is read at once, within this program run.
    if unsafe { LOCK_HOLDER.get(lock) }.is_some_and(|holder| holder.tid == tid) {
        let _ = LOCK_HOLDER.remove(lock);
    }
    let held_ns = now_ns().saturating_sub(start_ns);
    if let Some(counts) = entry(&HOLDS, &lock, drop_reason::HOLDS_MAP_FULL) {
        // SAFETY: `counts` is the map value just looked up; the bucket index
        // is below BUCKETS.
        unsafe {
            add(&mut (*counts).holds, 1);
            add(&mut (*counts).hold_ns, held_ns);
            raise_to(&mut (*counts).max_hold_ns, held_ns);
            add(&mut (*counts).hold_histogram[histogram::bucket(held_ns)], 1);
        }
    }
    let site = HolderKey { lock, return_ip };
    if let Some(holds) = entry(&HOLDERS, &site, drop_reason::HOLDERS_MAP_FULL) {
        // SAFETY: `holds` is the map value just looked up.
        unsafe {
            add(&mut (*holds).holds, 1);
            add(&mut (*holds).hold_ns, held_ns);
        }
    }
    0
}

// ---- CPU sampling: what the target's lock code costs in CPU ----
//
// `cpu_sample` runs on a software cpu-clock perf event on every CPU. A
// sample of a target thread is lock code when the thread is in a lock
// function or libc lock slow path (user mode; attributed to the lock in its
// first argument, `rdi`, which those functions keep), or in the kernel inside
// a futex syscall (attributed to the futex word, the syscall's first
// argument, read from the user registers saved at syscall entry). With
// `--stacks` each attributed sample also counts under a stack key of its
// lock and sends snapshots on the lock calls' schedule (`record_stack_of`).

/// Number of filled entries of `CPU_LOCK_CODE`; set by userspace before load.
#[unsafe(no_mangle)]
static CPU_LOCK_CODE_RANGES: Global<u32> = Global::new(0);

/// The lock functions' and slow paths' runtime code ranges, one per function.
#[map]
static CPU_LOCK_CODE: Array<CodeRange> = Array::with_max_entries(MAX_CPU_LOCK_CODE_RANGES, 0);
/// Lock-code samples per attributed address (mutex argument or futex word).
/// Preallocated: Linux before 6.1 refuses run-time allocation here.
#[map]
static CPU_LOCKS: HashMap<u64, CpuSamples> = HashMap::with_max_entries(MAX_CPU_LOCKS, 0);
/// The target's samples by class (see `tracer_common::cpu_sample`).
#[map]
static CPU_COUNTS: Array<u64> = Array::with_max_entries(cpu_sample::COUNT, 0);

const SYS_FUTEX: u64 = 202;
/// `orig_ax` of a kernel entry that is not a syscall (an exception or trap).
const NOT_A_SYSCALL: u64 = u64::MAX;

#[inline(always)]
fn count_sample(class: u32) {
    if let Some(counter) = CPU_COUNTS.get_ptr_mut(class) {
        add(counter, 1);
    }
}

/// True when `ip` lies in one of the lock-code ranges.
#[inline(always)]
fn in_sampled_lock_code(ip: u64) -> bool {
    let ranges = CPU_LOCK_CODE_RANGES.load().min(MAX_CPU_LOCK_CODE_RANGES);
    for index in 0..MAX_CPU_LOCK_CODE_RANGES {
        if index >= ranges {
            return false;
        }
        if let Some(range) = CPU_LOCK_CODE.get(index)
            && ip >= range.start
            && ip < range.end
        {
            return true;
        }
    }
    false
}

/// Counts a lock-code sample under `address`; with `--stacks`, also
/// under its stack key (`stack_kind::CPU_USER` or `CPU_KERNEL`), with a
/// snapshot of the user registers `regs` (ip, sp, bp) when one is due, so
/// a lock's CPU stacks add up to its samples.
#[inline(always)]
fn attribute_sample(address: u64, kernel: bool, regs: (u64, u64, u64)) {
    let Some(samples) = entry(&CPU_LOCKS, &address, drop_reason::CPU_LOCKS_FULL) else {
        return;
    };
    // SAFETY: `samples` is the map value just looked up.
    unsafe {
        if kernel {
            add(&mut (*samples).kernel, 1);
        } else {
            add(&mut (*samples).user, 1);
        }
    }
    if FLAGS.load() & flags::STACKS != 0 {
        let kind = if kernel {
            stack_kind::CPU_KERNEL
        } else {
            stack_kind::CPU_USER
        };
        record_stack_of(kind, address, 0, regs, 0);
    }
}

#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    if !is_target(&ctx) {
        return 0;
    }
    count_sample(cpu_sample::TARGET);
    let regs = unsafe { &(*ctx.ctx).regs };
    // The interrupted context was user mode: these are the user registers.
    if regs.cs & 3 == 3 {
        if in_sampled_lock_code(regs.rip) {
            count_sample(cpu_sample::LOCK_USER);
            attribute_sample(key_of(regs.rdi), false, (regs.rip, regs.rsp, regs.rbp));
        }
        return 0;
    }
    // Kernel mode: the user registers saved when the thread entered the kernel.
    let Some(user) = saved_user_regs() else {
        return 0;
    };
    // SAFETY: as in `from_go_runtime`: the helper's typed pointer, whose
    // loads the verifier makes checked ones (a fault reads 0: no syscall
    // of interest, no lock code).
    let (syscall, first_arg, user_ip) = unsafe {
        (
            core::ptr::read_volatile(&(*user).orig_rax),
            core::ptr::read_volatile(&(*user).rdi),
            core::ptr::read_volatile(&(*user).rip),
        )
    };
    if syscall == SYS_FUTEX {
        // SAFETY: as above.
        let user_regs = unsafe {
            (
                user_ip,
                core::ptr::read_volatile(&(*user).rsp),
                core::ptr::read_volatile(&(*user).rbp),
            )
        };
        classify_futex_sample(first_arg, user_regs);
    } else if syscall == NOT_A_SYSCALL && in_sampled_lock_code(user_ip) {
        // A trap from lock code that is no syscall: the uprobe breakpoint.
        count_sample(cpu_sample::TRACER);
    }
    0
}

/// A kernel sample inside a futex syscall on `uaddr`: a lock's, unless the
/// thread's wait in progress is a condvar's or the Go runtime's. `regs`:
/// the user registers saved at the syscall's entry (ip, sp, bp).
#[inline(always)]
fn classify_futex_sample(uaddr: u64, regs: (u64, u64, u64)) {
    let tid = bpf_get_current_pid_tgid() as u32;
    let not_lock = unsafe { WAITING.get(tid) }.is_some_and(|wait| wait.class != wait_class::FUTEX);
    if not_lock {
        count_sample(cpu_sample::FUTEX_NOT_LOCK);
        return;
    }
    count_sample(cpu_sample::LOCK_KERNEL);
    attribute_sample(key_of(uaddr), true, regs);
}

// ---- lifetimes: memory that went away (see `tracer_common::lifetime`) ----

// Offsets in the syscalls:sys_enter_munmap/mremap/mmap records (their
// format files): addr, then len (mremap: old_len), then mmap's flags.
const ENTER_ADDR: usize = 16;
const ENTER_LEN: usize = 24;
const MMAP_ENTER_FLAGS: usize = 40;
const MAP_FIXED: u64 = 0x10;

#[tracepoint]
pub fn munmap_enter(ctx: TracePointContext) -> u32 {
    unmapping(&ctx)
}

#[tracepoint]
pub fn mremap_enter(ctx: TracePointContext) -> u32 {
    unmapping(&ctx)
}

/// `mmap` with `MAP_FIXED` replaces what was mapped there.
#[tracepoint]
pub fn mmap_enter(ctx: TracePointContext) -> u32 {
    if record_u64(&ctx, MMAP_ENTER_FLAGS) & MAP_FIXED == 0 {
        return 0;
    }
    unmapping(&ctx)
}

/// sched:sched_process_exec: the whole address space is replaced.
#[tracepoint]
pub fn process_exec(ctx: TracePointContext) -> u32 {
    if is_target(&ctx) {
        let (start, end) = lifetime::EVERYTHING;
        new_generation(start, end);
    }
    0
}

/// At the entry of a syscall that unmaps `[addr, addr + len)`: a new
/// generation when that overlaps a watched module. Counted at the entry,
/// before the memory goes: no lock call on what replaces it can come first.
#[inline(always)]
fn unmapping(ctx: &TracePointContext) -> u32 {
    if !is_target(ctx) {
        return 0;
    }
    let start = record_u64(ctx, ENTER_ADDR);
    let end = start.saturating_add(record_u64(ctx, ENTER_LEN));
    for index in 0..lifetime::WATCHED_RANGES {
        if let Some(range) = WATCHED.get(index)
            && start < range[1]
            && range[0] < end
        {
            new_generation(start, end);
            return 0;
        }
    }
    0
}

/// Starts a new generation for the memory `[start, end)` that goes away,
/// and logs it. Two CPUs doing so at once may both log the later number
/// (no fetch-and-add before 5.12): the window is the two increments.
#[inline(always)]
fn new_generation(start: u64, end: u64) {
    let (Some(generation), Some(filled)) =
        (GENERATION.get_ptr_mut(0), UNMAPPED_COUNT.get_ptr_mut(0))
    else {
        return;
    };
    // SAFETY: both point into map values looked up in this program run;
    // `filled` is this CPU's own slot.
    unsafe {
        let index = *filled;
        if core::ptr::read_volatile(generation) >= lifetime::MAX_GENERATION
            || index >= lifetime::LOG_ENTRIES as u64
        {
            count_drop(drop_reason::LIFETIMES_MERGED);
            return;
        }
        add(generation, 1);
        let now = core::ptr::read_volatile(generation);
        if let Some(slot) = UNMAPPED.get_ptr_mut(index as u32) {
            *slot = Unmapped {
                start,
                end,
                generation: now,
            };
            *filled = index + 1;
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// The kernel lets only GPL-compatible programs call the helpers we use
// (bpf_probe_read_user, perf events); "Dual MIT/GPL" is one it accepts,
// and matches this crate's MIT OR GPL-2.0.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
