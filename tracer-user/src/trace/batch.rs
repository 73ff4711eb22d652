//! Whole hash maps read with `BPF_MAP_LOOKUP_BATCH`: one syscall per chunk
//! of entries, where aya's iterator makes two per key (`get_next_key`, then
//! `lookup`). Those two calls per key were a quarter of the always-on
//! agent's CPU, which reads every map each second.
//!
//! Hash maps have the command since Linux 5.6 (CI's 5.10 has it). A kernel
//! without it, or one that refuses it for a map, answers the first call
//! with an error: [`lookup_all`] then says so ([`Refused`]) and the caller
//! walks the map key by key as before; the refusal is remembered for the
//! process (the kernel does not change under it). A batch reads each
//! bucket under its lock, so an entry is never half-updated; like the walk,
//! the whole read is not one instant (the callers pause counting where
//! that matters).
use std::{
    mem::size_of,
    os::fd::{AsFd, AsRawFd},
    sync::atomic::{AtomicBool, Ordering},
};

use aya::{Pod, maps::MapData};

use super::features::WITHOUT_FOR_A_TEST;

/// `BPF_MAP_LOOKUP_BATCH` in `enum bpf_cmd` (uapi/linux/bpf.h).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries asked for by the first call; doubled when one bucket holds more.
const FIRST_CHUNK: u32 = 1024;
/// A bucket never holds more than this many entries (the map's own cap).
const LARGEST_CHUNK: u32 = 1 << 20;

/// The kernel refused the batch command: walk the map key by key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refused;

/// Set once a kernel refused the command: no later read tries it again.
static REFUSED: AtomicBool = AtomicBool::new(false);

/// `union bpf_attr`'s `batch` member (the kernel zero-fills the rest).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Calls `each` with every key of the hash map and its value's bytes
/// (`value_bytes` each: for a per-CPU map, every possible CPU's value, each
/// padded to 8 bytes, as the kernel lays them out). On [`Refused`] nothing
/// was handed to `each` unless a later chunk failed: the caller starts its
/// walk afresh either way.
pub(crate) fn lookup_all<K: Pod>(
    map: &MapData,
    value_bytes: usize,
    mut each: impl FnMut(K, &[u8]),
) -> Result<(), Refused> {
    if REFUSED.load(Ordering::Relaxed) || forced_off() {
        return Err(Refused);
    }
    let key_bytes = size_of::<K>();
    let mut chunk = FIRST_CHUNK;
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    // The hash map's batch token is a bucket index; none before the first call.
    let (mut token_in, mut token_out, mut first) = (0u32, 0u32, true);
    loop {
        keys.resize(chunk as usize * key_bytes, 0u8);
        values.resize(chunk as usize * value_bytes, 0u8);
        let mut attr = BatchAttr {
            in_batch: match first {
                true => 0,
                false => &token_in as *const u32 as u64,
            },
            out_batch: &mut token_out as *mut u32 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk,
            map_fd: map.fd().as_fd().as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: the kernel writes at most `count` keys and values into
        // the buffers sized for them, and the token into `token_out`.
        let result = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                size_of::<BatchAttr>() as u32,
            )
        };
        let error = (result < 0).then(|| std::io::Error::last_os_error().raw_os_error());
        if error == Some(Some(libc::ENOSPC)) && chunk < LARGEST_CHUNK {
            // The next bucket alone holds more than `chunk` entries.
            chunk *= 2;
            continue;
        }
        let filled = (attr.count.min(chunk)) as usize;
        if error.is_none() || error == Some(Some(libc::ENOENT)) {
            for index in 0..filled {
                let key = &keys[index * key_bytes..(index + 1) * key_bytes];
                // SAFETY: K is Pod and the slice holds size_of::<K>() bytes.
                let key: K = unsafe { std::ptr::read_unaligned(key.as_ptr().cast()) };
                each(key, &values[index * value_bytes..(index + 1) * value_bytes]);
            }
        }
        match error {
            None => (token_in, first) = (token_out, false),
            // ENOENT: past the last bucket, the entries above were the last.
            Some(Some(libc::ENOENT)) => return Ok(()),
            Some(_) => {
                if first {
                    REFUSED.store(true, Ordering::Relaxed);
                }
                return Err(Refused);
            }
        }
    }
}

/// `LOCKTRACE_TEST_KERNEL_WITHOUT=map_batch`: the per-key walk, as on a
/// kernel without the command (for tests of that path).
fn forced_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| {
        std::env::var(WITHOUT_FOR_A_TEST)
            .unwrap_or_default()
            .split(',')
            .any(|item| item.trim() == "map_batch")
    })
}

/// Real maps (root): the batch reads what the per-key walk reads, entry for
/// entry, over several chunks and with every CPU's value.
#[cfg(all(test, feature = "root-tests"))]
mod tests {
    use std::{
        collections::HashMap,
        os::fd::{FromRawFd, OwnedFd},
    };

    use aya::maps::{HashMap as BpfHashMap, IterableMap, Map, PerCpuHashMap, PerCpuValues};

    use super::*;

    /// More than two chunks' worth.
    const ENTRIES: u64 = 2_500;

    /// A new map of `kind` (`enum bpf_map_type`), u64 keys and values.
    fn new_map(kind: u32) -> MapData {
        // map_type, key_size, value_size, max_entries, map_flags (bpf_attr).
        let attr: [u32; 5] = [kind, 8, 8, 4096, 0];
        // SAFETY: BPF_MAP_CREATE reads the attr given and returns a new fd.
        let fd = unsafe { libc::syscall(libc::SYS_bpf, 0, attr.as_ptr(), 20u32) };
        assert!(
            fd >= 0,
            "BPF_MAP_CREATE: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: the kernel just gave us this fd.
        MapData::from_fd(unsafe { OwnedFd::from_raw_fd(fd as i32) }).unwrap()
    }

    #[test]
    fn a_batch_reads_what_the_walk_reads() {
        let mut map: BpfHashMap<MapData, u64, u64> =
            BpfHashMap::try_from(Map::HashMap(new_map(1))).unwrap();
        for key in 0..ENTRIES {
            map.insert(key, key * 3 + 1, 0).unwrap();
        }
        let mut batched = HashMap::new();
        lookup_all(map.map(), 8, |key: u64, value| {
            batched.insert(key, u64::from_ne_bytes(value.try_into().unwrap()));
        })
        .unwrap();
        let walked: HashMap<u64, u64> = map.iter().map(Result::unwrap).collect();
        assert_eq!(walked.len(), ENTRIES as usize);
        assert_eq!(batched, walked);
    }

    #[test]
    fn a_per_cpu_batch_has_every_cpus_value() {
        let cpus = aya::util::nr_cpus().unwrap();
        let mut map: PerCpuHashMap<MapData, u64, u64> =
            PerCpuHashMap::try_from(Map::PerCpuHashMap(new_map(5))).unwrap();
        for key in 0..ENTRIES {
            let values: Vec<u64> = (0..cpus as u64).map(|cpu| key + cpu).collect();
            map.insert(key, PerCpuValues::try_from(values).unwrap(), 0)
                .unwrap();
        }
        let mut batched = HashMap::new();
        lookup_all(map.map(), 8 * cpus, |key: u64, values| {
            let each: Vec<u64> = values
                .chunks_exact(8)
                .map(|bytes| u64::from_ne_bytes(bytes.try_into().unwrap()))
                .collect();
            batched.insert(key, each);
        })
        .unwrap();
        let walked: HashMap<u64, Vec<u64>> = map
            .iter()
            .map(|entry| {
                let (key, values) = entry.unwrap();
                (key, values.iter().copied().collect())
            })
            .collect();
        assert_eq!(walked.len(), ENTRIES as usize);
        assert_eq!(batched, walked);
    }
}
