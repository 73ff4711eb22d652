//! The `SNAPSHOTS` ring buffer: stack snapshots (registers and a copy of
//! the user stack) that the BPF side takes for `--stacks`, drained at each
//! tick and handed to whoever unwinds them.
use anyhow::{Context, Result, anyhow};
use aya::{Ebpf, maps::RingBuf};
use tracer_common::{StackSnapshot, names};

/// Hands every snapshot waiting in the ring buffer to `each`. Returns how
/// many there were.
pub fn drain(ebpf: &Ebpf, mut each: impl FnMut(&StackSnapshot)) -> Result<usize> {
    let map = ebpf
        .map(names::MAP_SNAPSHOTS)
        .ok_or_else(|| anyhow!("BPF object lacks map {}", names::MAP_SNAPSHOTS))?;
    let mut ring = RingBuf::try_from(map).context("opening the stack snapshot ring buffer")?;
    let mut drained = 0;
    while let Some(item) = ring.next() {
        if item.len() < std::mem::size_of::<StackSnapshot>() {
            continue;
        }
        // SAFETY: the record holds a whole `StackSnapshot` (checked above),
        // written by the BPF side with the same repr(C) layout; any bytes
        // are a valid value of it.
        let snapshot = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const StackSnapshot) };
        each(&snapshot);
        drained += 1;
    }
    Ok(drained)
}
