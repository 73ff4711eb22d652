//! What is still going on when the maps are read: the futex waits and
//! holds the BPF side began and has not seen end (`WAITING`, `HELD`), the
//! threads the kernel shows blocked in a futex call
//! (`/proc/PID/task/TID/syscall`, which also shows waits that began before
//! attach), and who owns the glibc mutexes they wait on (`__owner`, read
//! from the target's memory: it works in contention mode and for waits
//! older than the probes).
use std::{
    collections::{BTreeSet, HashMap},
    os::unix::fs::FileExt,
};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, IterableMap, MapData},
};
use tracer_common::{FutexWait, names};

use crate::model::{Blocked, InFlight};

/// x86-64 `futex` syscall number.
const SYS_FUTEX: u64 = 202;
/// Byte offset of glibc's `pthread_mutex_t.__owner` (the holder's tid).
const GLIBC_MUTEX_OWNER_OFFSET: u64 = 8;

/// CLOCK_MONOTONIC in nanoseconds (the clock of `bpf_ktime_get_ns`).
pub(crate) fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// The target's threads (empty once it is gone).
pub(crate) fn threads(pid: u32) -> BTreeSet<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|task| task.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Threads of `pid` blocked in a futex wait now.
pub(crate) fn blocked_threads(pid: u32) -> Vec<Blocked> {
    threads(pid)
        .into_iter()
        .filter_map(|tid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
            let uaddr = futex_wait_address(&text)?;
            Some(Blocked { tid, uaddr })
        })
        .collect()
}

/// The futex word of a `/proc/…/syscall` line that shows a futex wait
/// (`202 UADDR OP …`), else None (`running`, another call, a wake).
fn futex_wait_address(line: &str) -> Option<u64> {
    let mut fields = line.split_whitespace();
    let number: u64 = fields.next()?.parse().ok()?;
    let hex = |text: &str| u64::from_str_radix(text.strip_prefix("0x")?, 16).ok();
    let uaddr = hex(fields.next()?)?;
    // FUTEX_CMD_MASK: the op without FUTEX_PRIVATE_FLAG and FUTEX_CLOCK_REALTIME.
    let op = hex(fields.next()?)? & 0x7f;
    // WAIT, LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI, LOCK_PI2: as the BPF side counts waits.
    (number == SYS_FUTEX && matches!(op, 0 | 6 | 9 | 11 | 13)).then_some(uaddr)
}

/// Waits older than the probes: only the kernel knows of them, so they are
/// taken from /proc at attach time and matched when the maps are read.
#[derive(Debug, Clone)]
pub(crate) struct WaitsBeforeAttach {
    pub attached_ns: u64,
    pub blocked: Vec<Blocked>,
}

impl WaitsBeforeAttach {
    pub(crate) fn now(pid: u32) -> WaitsBeforeAttach {
        WaitsBeforeAttach {
            attached_ns: monotonic_ns(),
            blocked: blocked_threads(pid),
        }
    }
}

/// Reads the in-flight maps and the target's blocked threads now.
pub(crate) fn read(
    ebpf: &Ebpf,
    pid: u32,
    attached_ns: u64,
    blocked_at_attach: Vec<Blocked>,
) -> InFlight {
    let now_ns = monotonic_ns();
    let waits: HashMap<u32, FutexWait> = read_map(ebpf, names::MAP_WAITING);
    let held = read_map(ebpf, names::MAP_HELD);
    let threads = threads(pid);
    let blocked_now = blocked_threads(pid);
    let words: BTreeSet<u64> = waits
        .values()
        .filter(|wait| wait.class == tracer_common::wait_class::FUTEX)
        .map(|wait| wait.uaddr)
        .chain(blocked_now.iter().map(|blocked| blocked.uaddr))
        .collect();
    let owners = glibc_owners(pid, &words, &threads);
    InFlight {
        now_ns,
        attached_ns,
        waits,
        held,
        blocked_at_attach,
        blocked_now,
        owners,
        threads,
    }
}

/// The glibc `__owner` of each word that looks like a locked glibc mutex
/// (the word is non-zero and the owner is a thread of the target).
fn glibc_owners(pid: u32, words: &BTreeSet<u64>, threads: &BTreeSet<u32>) -> HashMap<u64, u32> {
    let task = crate::probe::target::proc_task(pid);
    let Ok(memory) = std::fs::File::open(format!("/proc/{task}/mem")) else {
        return HashMap::new();
    };
    let read_u32 = |address: u64| {
        let mut bytes = [0u8; 4];
        memory
            .read_exact_at(&mut bytes, address)
            .ok()
            .map(|()| u32::from_ne_bytes(bytes))
    };
    words
        .iter()
        .filter_map(|&word| {
            let locked = read_u32(word)? != 0;
            let owner = read_u32(word.checked_add(GLIBC_MUTEX_OWNER_OFFSET)?)?;
            (locked && threads.contains(&owner)).then_some((word, owner))
        })
        .collect()
}

/// A hash map's entries; empty if it cannot be read (the report then
/// simply has nothing in progress from it).
fn read_map<K, V>(ebpf: &Ebpf, name: &str) -> HashMap<K, V>
where
    K: aya::Pod + Eq + std::hash::Hash,
    V: aya::Pod,
{
    let Some(Ok(table)) = ebpf.map(name).map(BpfHashMap::<&MapData, K, V>::try_from) else {
        return HashMap::new();
    };
    let mut out = HashMap::new();
    let batched = super::batch::lookup_all(table.map(), std::mem::size_of::<V>(), |key, value| {
        // SAFETY: V is Pod and the kernel wrote size_of::<V>() bytes (aya
        // checked the map's value size against V).
        out.insert(key, unsafe {
            std::ptr::read_unaligned(value.as_ptr().cast::<V>())
        });
    });
    if batched.is_ok() {
        return out;
    }
    // Key by key, an entry deleted meanwhile (its wait ended) is skipped.
    table.iter().filter_map(Result::ok).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_futex_wait_of_a_syscall_line() {
        let waiting = "202 0x55d0c0a0e040 0x80 0x2 0x0 0x0 0x0 0x7ffd2c1c0b28 0x7f3a1c09e5e6\n";
        assert_eq!(futex_wait_address(waiting), Some(0x55d0c0a0e040));
        let wake = "202 0x55d0c0a0e040 0x81 0x1 0x0 0x0 0x0 0x7ffd2c1c0b28 0x7f3a1c09e5e6\n";
        assert_eq!(futex_wait_address(wake), None);
        assert_eq!(futex_wait_address("running\n"), None);
        assert_eq!(
            futex_wait_address("7 0x1 0x0 0x0 0x0 0x0 0x0 0x7ff 0x7f\n"),
            None
        );
        assert_eq!(
            futex_wait_address("-1 0x7ffd2c1c0b28 0x7f3a1c09e5e6\n"),
            None
        );
    }
}
