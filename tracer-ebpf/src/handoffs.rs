//! Handoffs: per lock, the acquisitions made on another CPU than the one
//! before (the lock's cache line had to move there), by how far it moved in
//! the cache topology (`CPU_PLACES`, filled by userspace from sysfs).

use aya_ebpf::helpers::bpf_get_smp_processor_id;
use tracer_common::{drop_reason, handoff_class};

use crate::{
    counters::{add, entry},
    maps::{CPU_PLACES, HANDOFFS},
};

/// Counts an acquisition of `lock` on this CPU: a handoff when the lock's
/// last acquisition was on another CPU. The last CPU is a plain load and
/// store: two acquisitions racing on two CPUs (only possible for read
/// locks) may count one move too few, never one too many.
#[inline(always)]
pub(crate) fn count_handoff(lock: u64) {
    // SAFETY: the helper takes no argument.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(counts) = entry(&HANDOFFS, &lock, drop_reason::HANDOFFS_FULL) else {
        return;
    };
    // SAFETY: `counts` is the map value just looked up, alive until return.
    let last = unsafe { core::ptr::read_volatile(&(*counts).last_cpu) };
    let now = cpu.wrapping_add(1);
    if last == now {
        return;
    }
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(&mut (*counts).last_cpu, now) };
    if last == 0 {
        return;
    }
    let from = CPU_PLACES.get(last - 1).copied().unwrap_or_default();
    let to = CPU_PLACES.get(cpu).copied().unwrap_or_default();
    let class = handoff_class::of(from, to);
    // Read back through memory: the bound checked is then on the register
    // used as the index (see `count_call`).
    // SAFETY: a read of a local.
    let class = unsafe { core::ptr::read_volatile(&class) };
    if class >= handoff_class::COUNT {
        return;
    }
    // SAFETY: as above; `class < COUNT`.
    add(unsafe { &mut (*counts).counts[class] }, 1);
}
