//! Small helpers every program uses: the target check, the counting switch,
//! atomic adds, entries created with BPF_NOEXIST, tracepoint record reads.

use core::intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xadd};

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::bpf_ktime_get_ns,
    maps::{HashMap, PerCpuHashMap},
    programs::{ProbeContext, TracePointContext},
};
use tracer_common::{counting, drop_reason, lifetime};

use crate::maps::{COUNTING, DROPS, GENERATION, TARGET_TGID};

/// The map key of the lock or futex word at `address`: the address in the
/// current generation of the target's memory (`tracer_common::lifetime`).
#[inline(always)]
pub(crate) fn key_of(address: u64) -> u64 {
    let generation = GENERATION.get(0).copied().unwrap_or(0);
    lifetime::tag(address, generation)
}

/// True when the program runs in the target process (its tgid, loaded by userspace).
#[inline(always)]
pub(crate) fn is_target<C: EbpfContext>(ctx: &C) -> bool {
    ctx.tgid() == TARGET_TGID.load()
}

/// `COUNTING[0]`: bits of `tracer_common::counting`.
#[inline(always)]
pub(crate) fn counting_state() -> u32 {
    COUNTING.get(0).copied().unwrap_or(0)
}

/// True when the events of `bit` (`tracer_common::counting`) count now. A
/// pause counts the event as dropped.
#[inline(always)]
pub(crate) fn counting(bit: u32) -> bool {
    let state = counting_state();
    if state & counting::PAUSED != 0 {
        count_drop(drop_reason::PAUSED_FOR_EXPIRY);
        return false;
    }
    state & bit != 0
}

/// Adds `value` to the u64 at `counter`, a pointer into a map value.
#[inline(always)]
pub(crate) fn add(counter: *mut u64, value: u64) {
    // Relaxed atomic add with the result unused compiles to BPF's lock xadd.
    // SAFETY: every caller passes a pointer from a map lookup made in this
    // program run: valid, aligned and alive until the program returns.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(counter, value) };
}

/// Monotonic time in ns.
#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    // SAFETY: the helper takes no argument and only reads the clock.
    unsafe { bpf_ktime_get_ns() }
}

/// The target thread's user stack pointer at the probe.
#[inline(always)]
pub(crate) fn stack_pointer(ctx: &ProbeContext) -> u64 {
    // SAFETY: a uprobe's context is the pt_regs the kernel passes in, valid
    // for the whole program run.
    unsafe { (*ctx.regs).rsp }
}

#[inline(always)]
pub(crate) fn count_drop(reason: u32) {
    if let Some(counter) = DROPS.get_ptr_mut(reason) {
        add(counter, 1);
    }
}

/// The hash maps counters live in: shared, or one value per CPU.
pub(crate) trait CounterMap<K, V> {
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
pub(crate) fn entry<K, V: Default>(
    map: &impl CounterMap<K, V>,
    key: &K,
    full_reason: u32,
) -> Option<*mut V> {
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
pub(crate) fn raise_to(slot: *mut u64, value: u64) {
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

/// The u64 field at `offset` of a syscall tracepoint's record, loaded
/// directly: the verifier checks a tracepoint program's context reads
/// against the record's size when it attaches, so no helper call is needed
/// (`read_at` makes one per field).
#[inline(always)]
pub(crate) fn record_u64(ctx: &TracePointContext, offset: usize) -> u64 {
    // SAFETY: `offset` is a u64 field of the record (the format file above);
    // the context is the record, alive for the whole program run.
    unsafe { core::ptr::read((ctx.as_ptr() as *const u8).add(offset) as *const u64) }
}
