//! The shared mapping `--mode inproc` puts into the target, byte by byte:
//! pure offsets and parsing, no syscalls (unit-tested on plain buffers).
//!
//! ```text
//! 0x0000 header (locktrace writes; read-only in the target): magic, owner,
//!        and every GOT entry patched with its original value, so that a
//!        later run can restore them after this one was killed
//! 0x2000 code: the stubs and the patcher (read-only, executable)
//! 0x3000 control (read-write): overflow counts per function, then the
//!        patcher's list (GOT entry, expected, new, value found)
//! 0x8000 the return frame of the thread running injected code, at the
//!        top (read-write; room below it for a signal's frame)
//! 0x10000 one counting table per CPU, TABLE_BYTES each (read-write)
//! ```
use std::collections::HashMap;

use tracer_common::{CallerKey, LOCK_OPS};

use super::stubs::{ENTRY_BITS, TABLE_BYTES};

pub(crate) const MAGIC: [u8; 16] = *b"locktrace-inproc";
/// Bumped when the layout or the stubs change: a mapping of another
/// version is never reused (its entries are still restored).
pub const VERSION: u64 = 3;

pub(crate) const HEADER: usize = 0x0000;
pub(crate) const CODE: usize = 0x2000;
pub(crate) const CONTROL: usize = 0x3000;
/// Nonzero while the stubs count (see `stubs`).
pub(crate) const GATE: usize = CONTROL + 0x80;
pub(crate) const PATCH_LIST: usize = CONTROL + 0x100;
pub(crate) const FRAMES: usize = 0x8000;
/// The return frame ends here (its region's top).
pub(crate) const FRAME_TOP: usize = 0x10000;
pub(crate) const TABLES: usize = 0x10000;
/// Bytes the target sees as code (header included): read-only, executable.
pub(crate) const READ_ONLY_BYTES: usize = CONTROL;

/// Header fields (u64 each, after the magic).
const VERSION_AT: usize = 16;
const OWNER_PID_AT: usize = 24;
const OWNER_START_AT: usize = 32;
const SIZE_AT: usize = 40;
const CPU_TABLES_AT: usize = 48;
const PATCHES_AT: usize = 56;
const PATCH_RECORDS: usize = 64;
/// A record: GOT entry, original value, stub.
const RECORD_BYTES: usize = 24;
pub(crate) const MAX_PATCHES: usize = (CODE - PATCH_RECORDS) / RECORD_BYTES;
/// Patcher list entries: GOT entry, expected, new, value found.
const LIST_ENTRY_BYTES: usize = 32;
pub(crate) const MAX_LIST: usize = (FRAMES - PATCH_LIST) / LIST_ENTRY_BYTES;

const _: () = assert!(PATCH_RECORDS + RECORD_BYTES * MAX_PATCHES <= CODE);
const _: () = assert!(MAX_LIST >= MAX_PATCHES);

/// Bytes of a mapping with `cpu_tables` tables.
pub fn mapping_bytes(cpu_tables: usize) -> usize {
    TABLES + cpu_tables * TABLE_BYTES
}

/// One GOT entry locktrace switched to a stub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PatchRecord {
    pub got: u64,
    pub original: u64,
    pub stub: u64,
}

/// What a mapping's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub version: u64,
    pub owner_pid: u32,
    pub owner_start: u64,
    pub size: u64,
    pub cpu_tables: u64,
    pub patches: Vec<PatchRecord>,
}

fn word(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

fn put(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// More CPUs than any machine numbers: a header claiming more is garbage.
const MAX_CPU_TABLES: u64 = 1 << 16;

/// Whether `bytes` start with locktrace's magic (a header, or a forgery).
pub(crate) fn has_magic(bytes: &[u8]) -> bool {
    bytes.get(..16) == Some(&MAGIC[..])
}

impl Header {
    /// Parses a header page; None when it is not one of locktrace's: no
    /// magic, or fields no run of locktrace writes (said in `garbled`).
    pub(crate) fn parse(bytes: &[u8]) -> Option<Header> {
        if !has_magic(bytes) {
            return None;
        }
        Self::garbled(bytes).is_none().then_some(())?;
        let count = word(bytes, PATCHES_AT)? as usize;
        let patches = (0..count)
            .map(|i| {
                let at = PATCH_RECORDS + i * RECORD_BYTES;
                Some(PatchRecord {
                    got: word(bytes, at)?,
                    original: word(bytes, at + 8)?,
                    stub: word(bytes, at + 16)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Header {
            version: word(bytes, VERSION_AT)?,
            owner_pid: word(bytes, OWNER_PID_AT)? as u32,
            owner_start: word(bytes, OWNER_START_AT)?,
            size: word(bytes, SIZE_AT)?,
            cpu_tables: word(bytes, CPU_TABLES_AT)?,
            patches,
        })
    }

    /// What is wrong with a header page that has the magic, if anything:
    /// a short page, a size that is not a mapping's, too many records.
    pub(crate) fn garbled(bytes: &[u8]) -> Option<String> {
        let field = |at: usize| word(bytes, at).unwrap_or(u64::MAX);
        if bytes.len() < CODE {
            return Some(format!(
                "{} bytes, shorter than locktrace's header ({CODE})",
                bytes.len()
            ));
        }
        let (size, cpu_tables) = (field(SIZE_AT), field(CPU_TABLES_AT));
        if !(1..=MAX_CPU_TABLES).contains(&cpu_tables) {
            return Some(format!("its header counts {cpu_tables} CPU tables"));
        }
        if size != mapping_bytes(cpu_tables as usize) as u64 {
            return Some(format!(
                "its header's size ({size}) is not that of a mapping with {cpu_tables} CPU tables"
            ));
        }
        let count = field(PATCHES_AT);
        (count > MAX_PATCHES as u64)
            .then(|| format!("its header lists {count} GOT entries (at most {MAX_PATCHES} fit)"))
    }

    /// Writes the header into the mapping's first bytes (records past
    /// [`MAX_PATCHES`] are the caller's to refuse).
    pub(crate) fn write(&self, bytes: &mut [u8]) {
        bytes[HEADER..HEADER + 16].copy_from_slice(&MAGIC);
        put(bytes, VERSION_AT, self.version);
        put(bytes, OWNER_PID_AT, self.owner_pid.into());
        put(bytes, OWNER_START_AT, self.owner_start);
        put(bytes, SIZE_AT, self.size);
        put(bytes, CPU_TABLES_AT, self.cpu_tables);
        let count = self.patches.len().min(MAX_PATCHES);
        for (i, record) in self.patches.iter().take(count).enumerate() {
            let at = PATCH_RECORDS + i * RECORD_BYTES;
            put(bytes, at, record.got);
            put(bytes, at + 8, record.original);
            put(bytes, at + 16, record.stub);
        }
        put(bytes, PATCHES_AT, count as u64);
    }
}

/// One entry of the patcher's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Swap {
    pub got: u64,
    pub expected: u64,
    pub new: u64,
}

/// Writes the patcher's list; returns how many entries it holds.
pub(crate) fn write_list(bytes: &mut [u8], swaps: &[Swap]) -> usize {
    let count = swaps.len().min(MAX_LIST);
    for (i, swap) in swaps.iter().take(count).enumerate() {
        let at = PATCH_LIST + i * LIST_ENTRY_BYTES;
        put(bytes, at, swap.got);
        put(bytes, at + 8, swap.expected);
        put(bytes, at + 16, swap.new);
        put(bytes, at + 24, 0);
    }
    count
}

/// The value the patcher found in each entry of the list (equal to
/// `expected` where the swap happened).
pub(crate) fn list_results(bytes: &[u8], count: usize) -> Vec<u64> {
    (0..count)
        .map(|i| word(bytes, PATCH_LIST + i * LIST_ENTRY_BYTES + 24).unwrap_or(0))
        .collect()
}

/// What the stubs counted, summed over the CPUs' tables.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Counted {
    /// Acquisitions per (lock, caller, op).
    pub calls: HashMap<CallerKey, u64>,
    /// Calls that returned without the lock, keyed the same way.
    pub failed: HashMap<CallerKey, u64>,
    /// Calls not counted because a table was full, per op.
    pub overflow: [u64; LOCK_OPS],
}

impl Counted {
    /// Adds the stubs' counts to what the BPF side counted: per caller,
    /// per lock and function, and the failed tries apart.
    pub(crate) fn add_to(&self, collected: &mut crate::model::Collected) {
        for (key, &count) in &self.calls {
            *collected.callers.entry(*key).or_default() += count;
            let lock = collected.locks.entry(key.lock).or_default();
            if let Some(calls) = lock.calls.get_mut(key.op as usize) {
                *calls += count;
            }
        }
        for (key, &count) in &self.failed {
            *collected.failed_tries.entry(*key).or_default() += count;
        }
    }
}

/// Reads every table of a mapping (`bytes` covers it whole). A slot
/// whose caller is not written yet has no counts (the stub writes the
/// caller before it counts); the same key in two slots is summed.
pub(crate) fn read_counts(bytes: &[u8], cpu_tables: usize) -> Counted {
    let mut counted = Counted::default();
    for (op, slot) in counted.overflow.iter_mut().enumerate() {
        *slot = word(bytes, CONTROL + op * 8).unwrap_or(0);
    }
    for table in 0..cpu_tables {
        let start = TABLES + table * TABLE_BYTES;
        for entry in 0..(1usize << ENTRY_BITS) {
            let at = start + entry * 32;
            let Some(lock) = word(bytes, at).filter(|&lock| lock != 0) else {
                continue;
            };
            let keyed = word(bytes, at + 8).unwrap_or(0);
            let key = CallerKey {
                lock,
                return_ip: keyed & ((1 << 56) - 1),
                op: (keyed >> 56) as u32,
                _pad: 0,
            };
            for (field, into) in [(16, &mut counted.calls), (24, &mut counted.failed)] {
                let count = word(bytes, at + field).unwrap_or(0);
                if count > 0 {
                    *into.entry(key).or_default() += count;
                }
            }
        }
    }
    counted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_as_written() {
        let mut bytes = vec![0; CODE];
        let header = Header {
            version: VERSION,
            owner_pid: 42,
            owner_start: 7,
            size: mapping_bytes(2) as u64,
            cpu_tables: 2,
            patches: vec![PatchRecord {
                got: 0x1000,
                original: 0x2000,
                stub: 0x3000,
            }],
        };
        header.write(&mut bytes);
        assert_eq!(Header::parse(&bytes), Some(header));
        bytes[0] = b'x';
        assert_eq!(Header::parse(&bytes), None);
    }

    /// A page with the magic and fields no locktrace writes is said, never
    /// taken: short, a size that is not a mapping's, CPUs or records out
    /// of range.
    #[test]
    fn a_forged_header_is_said_not_taken() {
        let mut bytes = vec![0; CODE];
        let mut header = Header {
            version: VERSION,
            owner_pid: 0,
            owner_start: 0,
            size: mapping_bytes(2) as u64,
            cpu_tables: 2,
            patches: Vec::new(),
        };
        header.write(&mut bytes);
        assert_eq!(Header::garbled(&bytes), None);
        assert_eq!(
            Header::garbled(&bytes[..4096]).as_deref(),
            Some("4096 bytes, shorter than locktrace's header (8192)")
        );
        header.size = 0x100;
        header.write(&mut bytes);
        assert_eq!(
            Header::garbled(&bytes).as_deref(),
            Some("its header's size (256) is not that of a mapping with 2 CPU tables")
        );
        assert_eq!(Header::parse(&bytes), None);
        header.cpu_tables = u64::MAX;
        header.write(&mut bytes);
        assert_eq!(
            Header::garbled(&bytes).as_deref(),
            Some("its header counts 18446744073709551615 CPU tables")
        );
        header.cpu_tables = 2;
        header.size = mapping_bytes(2) as u64;
        header.write(&mut bytes);
        put(&mut bytes, PATCHES_AT, 1 << 40);
        assert_eq!(
            Header::garbled(&bytes),
            Some(format!(
                "its header lists 1099511627776 GOT entries (at most {MAX_PATCHES} fit)"
            ))
        );
        assert_eq!(Header::parse(&bytes), None);
    }

    #[test]
    fn counts_sum_over_tables_and_duplicate_slots() {
        let mut bytes = vec![0; mapping_bytes(2)];
        let keyed = 0x5555 | (3u64 << 56);
        for (at, count) in [(TABLES, 5), (TABLES + 64, 2), (TABLES + TABLE_BYTES, 1)] {
            put(&mut bytes, at, 0x1000);
            put(&mut bytes, at + 8, keyed);
            put(&mut bytes, at + 16, count);
        }
        // Claimed, caller not written yet: no counts.
        put(&mut bytes, TABLES + 128, 0x2000);
        put(&mut bytes, CONTROL + 8, 9);
        let counted = read_counts(&bytes, 2);
        let key = CallerKey {
            lock: 0x1000,
            return_ip: 0x5555,
            op: 3,
            _pad: 0,
        };
        assert_eq!(counted.calls.get(&key), Some(&8));
        assert_eq!(counted.calls.len(), 1);
        assert!(counted.failed.is_empty());
        assert_eq!(counted.overflow[1], 9);
    }
}
