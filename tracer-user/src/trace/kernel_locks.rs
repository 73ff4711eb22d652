//! Kernel lock contention (`lock:contention_begin`/`contention_end`, Linux
//! 5.19+): attached when the kernel has the tracepoints, else the reason in
//! one line and the recording goes on without them; read into
//! [`KernelLocksCollected`] at the end.
use std::{
    collections::HashMap,
    path::Path,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, StackTraceMap},
    programs::TracePoint,
};
use tracer_common::{KernelLockCounts, KernelLockKey, kernel_lock, names};

use super::{features::WITHOUT_FOR_A_TEST, maps};
use crate::model::KernelLocksCollected;

/// Where tracefs may be (see `preflight::ensure_tracefs`, which mounts it).
const TRACEFS_DIRS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Why the section is empty when `--no-kernel-locks` left the programs out.
pub(crate) const NOT_ASKED: &str =
    "not traced (--no-kernel-locks); drop it to see what the target waits for inside the kernel";

/// Attaches both programs; the error is the one line saying why the
/// kernel-locks section is unavailable (the programs are then left out).
pub(crate) fn attach(ebpf: &mut Ebpf) -> Result<(), String> {
    let forced_off = std::env::var(WITHOUT_FOR_A_TEST)
        .unwrap_or_default()
        .split(',')
        .any(|item| item.trim() == "lock_events");
    let present = TRACEFS_DIRS
        .iter()
        .any(|dir| Path::new(dir).join("events/lock/contention_begin").is_dir());
    if forced_off || !present {
        return Err(String::from(
            "this kernel has no lock:contention_begin tracepoint (Linux 5.19+ has it)",
        ));
    }
    // The end program first: every contention begun is then seen to end.
    // The threads' exits before either: a thread that contends is then
    // waited for when the target exits.
    for (name, category, event) in [
        (names::PROGRAM_THREAD_FREE, "sched", "sched_process_free"),
        (names::PROGRAM_THREAD_EXIT, "sched", "sched_process_exit"),
        (names::PROGRAM_KERNEL_LOCK_END, "lock", "contention_end"),
        (names::PROGRAM_KERNEL_LOCK_BEGIN, "lock", "contention_begin"),
    ] {
        attach_one(ebpf, name, category, event)
            .map_err(|error| format!("attaching to {category}:{event} failed: {error:#}"))?;
    }
    Ok(())
}

fn attach_one(ebpf: &mut Ebpf, name: &str, category: &str, event: &str) -> Result<()> {
    let program: &mut TracePoint = ebpf
        .program_mut(name)
        .with_context(|| format!("BPF object lacks program {name}"))?
        .try_into()?;
    program.load()?;
    program.attach(category, event)?;
    Ok(())
}

/// The offset of `pid` in sched:sched_process_free's record, from its
/// format file (12 on 6.x, where `comm` is a `__data_loc`; 24 before).
/// None without tracefs: the kernel lock programs are then left out anyway.
pub(crate) fn free_pid_offset() -> Option<u32> {
    TRACEFS_DIRS.iter().find_map(|dir| {
        let format = Path::new(dir).join("events/sched/sched_process_free/format");
        let text = std::fs::read_to_string(format).ok()?;
        pid_offset_in(&text)
    })
}

/// The offset of the `pid_t pid` field in a tracepoint's format text.
fn pid_offset_in(format: &str) -> Option<u32> {
    let line = format
        .lines()
        .find(|line| line.contains("pid_t pid;") && !line.contains("common_pid"))?;
    let rest = &line[line.find("offset:")? + "offset:".len()..];
    rest[..rest.find(';')?].trim().parse().ok()
}

/// How long a recording that ends with the target's exit waits for its
/// threads to be gone (freed a grace period after their last switch; the
/// main thread, freed only when its parent reaps it, is not waited for).
const EXIT_SETTLE: Duration = Duration::from_millis(500);

/// Waits until no thread of the target (but the main one) that began to
/// exit is left: the last ones still take kernel locks after the exit is
/// announced (/proc's dentries flushed in `release_task`, the runqueue at
/// the last switch). At most [`EXIT_SETTLE`]; returns how many were left.
pub(crate) fn wait_for_exited_threads(ebpf: &Ebpf) -> Result<usize> {
    let exiting: BpfHashMap<&MapData, u32, u8> =
        BpfHashMap::try_from(maps::map(ebpf, names::MAP_EXITING)?)?;
    let started = Instant::now();
    loop {
        let left = exiting.keys().filter(Result::is_ok).count();
        if left == 0 || started.elapsed() >= EXIT_SETTLE {
            return Ok(left);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Kernel stacks read before, by id. A stack id keeps its frames until
/// locktrace deletes it (a live view's expiry, which calls
/// [`StackCache::forget`]): the bucket is not reused before, since the
/// programs ask for ids without `BPF_F_REUSE_STACKID`. So a live view's
/// reads look up each stack once, not at every tick.
#[derive(Debug, Default)]
pub(crate) struct StackCache(Mutex<HashMap<u32, Vec<u64>>>);

impl StackCache {
    /// The ids were deleted from the map: their buckets may hold other stacks next.
    pub(crate) fn forget(&self, ids: &[u32]) {
        let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for id in ids {
            cache.remove(id);
        }
    }
}

/// The counts, the kernel stacks they name and the programs' events; or
/// only the reason when the programs were not attached.
pub(crate) fn read(ebpf: &Ebpf, unavailable: Option<String>) -> Result<KernelLocksCollected> {
    read_cached(ebpf, unavailable, &StackCache::default())
}

/// As [`read`], each stack looked up only when `cache` lacks it.
pub(crate) fn read_cached(
    ebpf: &Ebpf,
    unavailable: Option<String>,
    cache: &StackCache,
) -> Result<KernelLocksCollected> {
    if unavailable.is_some() {
        return Ok(KernelLocksCollected {
            unavailable,
            ..KernelLocksCollected::default()
        });
    }
    let counts: HashMap<KernelLockKey, KernelLockCounts> =
        maps::read_hash(ebpf, names::MAP_KERNEL_LOCKS)?;
    let stack_map: StackTraceMap<&MapData> =
        StackTraceMap::try_from(maps::map(ebpf, names::MAP_KERNEL_LOCK_STACKS)?)?;
    let mut stacks = HashMap::new();
    let mut cache = cache.0.lock().unwrap_or_else(PoisonError::into_inner);
    for key in counts.keys() {
        // Many keys share a stack (other user sites and locks).
        let Ok(id) = u32::try_from(key.stack_id) else {
            continue;
        };
        if stacks.contains_key(&key.stack_id) {
            continue;
        }
        if let Some(frames) = cache.get(&id) {
            stacks.insert(key.stack_id, frames.clone());
        } else if let Ok(stack) = stack_map.get(&id, 0) {
            let frames: Vec<u64> = stack.frames().iter().map(|frame| frame.ip).collect();
            cache.insert(id, frames.clone());
            stacks.insert(key.stack_id, frames);
        }
    }
    let mut events = [0; kernel_lock::event::COUNT as usize];
    for (index, slot) in events.iter_mut().enumerate() {
        *slot = maps::per_cpu_sum(ebpf, names::MAP_KERNEL_LOCK_EVENTS, index as u32)?;
    }
    Ok(KernelLocksCollected {
        unavailable: None,
        counts,
        stacks,
        events,
    })
}

#[cfg(test)]
mod tests {
    use super::pid_offset_in;

    #[test]
    fn the_pid_offset_of_both_formats_of_sched_process_free() {
        let newer = "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\tfield:__data_loc char[] comm;\toffset:8;\tsize:4;\tsigned:0;\n\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;\n";
        assert_eq!(pid_offset_in(newer), Some(12));
        let older = "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n";
        assert_eq!(pid_offset_in(older), Some(24));
        assert_eq!(pid_offset_in("no such field"), None);
    }
}
