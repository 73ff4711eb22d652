//! Reading the target's memory, behind one trait: the pointer-chain search
//! runs on the live process through [`ProcessMemory`] and, in unit tests,
//! on a hand-built address space through `FakeMemory`, without root.
#[cfg(test)]
use std::collections::BTreeMap;

/// Reads of another process's memory.
pub trait TargetMemory {
    /// Reads up to `buffer.len()` bytes at `address`; returns how many were
    /// read (0 when nothing is mapped there).
    fn read(&self, address: u64, buffer: &mut [u8]) -> usize;
}

/// The live target (process_vm_readv: no ptrace stop needed).
pub struct ProcessMemory {
    pid: i32,
}

impl ProcessMemory {
    /// Through a live thread when the main one left (its memory is gone
    /// from its pid: process_vm_readv fails there).
    pub fn new(pid: u32) -> ProcessMemory {
        ProcessMemory {
            pid: super::target::proc_task(pid) as i32,
        }
    }
}

impl TargetMemory for ProcessMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> usize {
        let local = libc::iovec {
            iov_base: buffer.as_mut_ptr().cast(),
            iov_len: buffer.len(),
        };
        let remote = libc::iovec {
            iov_base: address as *mut libc::c_void,
            iov_len: buffer.len(),
        };
        // SAFETY: the local iovec covers exactly `buffer`; the remote one is only read by the kernel.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        n.max(0) as usize
    }
}

#[cfg(test)]
/// Memory made of byte regions at given addresses; a read stops where its
/// region ends, as process_vm_readv stops at an unmapped page.
#[derive(Debug, Default)]
pub(crate) struct FakeMemory {
    regions: BTreeMap<u64, Vec<u8>>,
}

#[cfg(test)]
impl FakeMemory {
    /// Adds a region of `bytes` at `address` (regions must not overlap).
    pub(crate) fn map(&mut self, address: u64, bytes: Vec<u8>) {
        self.regions.insert(address, bytes);
    }

    /// Writes the little-endian word `value` at `address`, inside a region.
    pub(crate) fn put_u64(&mut self, address: u64, value: u64) {
        let Some((&start, bytes)) = self.regions.range_mut(..=address).next_back() else {
            return;
        };
        let at = (address - start) as usize;
        if let Some(slot) = bytes.get_mut(at..at + 8) {
            slot.copy_from_slice(&value.to_le_bytes());
        }
    }
}

#[cfg(test)]
impl TargetMemory for FakeMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> usize {
        let Some((&start, bytes)) = self.regions.range(..=address).next_back() else {
            return 0;
        };
        let at = (address - start) as usize;
        let Some(available) = bytes.get(at..) else {
            return 0;
        };
        let n = available.len().min(buffer.len());
        buffer[..n].copy_from_slice(&available[..n]);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_reads_stop_at_the_end_of_a_region() {
        let mut memory = FakeMemory::default();
        memory.map(0x1000, vec![0; 16]);
        memory.put_u64(0x1008, 0x1122_3344_5566_7788);
        let mut buffer = [0u8; 32];
        assert_eq!(memory.read(0x1008, &mut buffer), 8);
        assert_eq!(
            u64::from_le_bytes(buffer[..8].try_into().unwrap()),
            0x1122_3344_5566_7788
        );
        assert_eq!(memory.read(0x0fff, &mut buffer), 0);
        assert_eq!(memory.read(0x1010, &mut buffer), 0);
    }

    /// The real reader reads this process's own memory.
    #[test]
    fn process_memory_reads_this_process() {
        let value: u64 = 0x0123_4567_89ab_cdef;
        let mut buffer = [0u8; 8];
        let memory = ProcessMemory::new(std::process::id());
        assert_eq!(memory.read(&value as *const u64 as u64, &mut buffer), 8);
        assert_eq!(u64::from_le_bytes(buffer), value);
        assert_eq!(memory.read(8, &mut buffer), 0);
    }
}
