//! Surviving a module file that shrinks while it is mapped. Module and debug
//! files are read through `mmap`; when one is truncated or rewritten in
//! place during a recording (an upgrade that does not rename, a hostile
//! user), touching a page past its new end raises SIGBUS, which would kill
//! the tracer and lose the recording. The handler here replaces the missing
//! page with a zero page, so the read sees zeros (parsers then find nothing
//! or garbage, never a crash), and counts it, so the report can say which
//! file's names are not to be trusted. A SIGBUS outside a registered
//! mapping is not ours: the default action is restored and the fault
//! repeats.
use std::sync::{
    Once,
    atomic::{AtomicUsize, Ordering},
};

/// Mapped module files watched at once; more are mapped unwatched.
const SLOTS: usize = 4096;

/// `(start, end)` of each watched mapping; 0 when the slot is free.
static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static ENDS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
/// Faults survived, per slot (read when the mapping is released).
static FAULTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();

/// A watched mapping; releasing it stops the watch.
#[derive(Debug)]
pub(crate) struct Watch {
    slot: Option<usize>,
}

impl Watch {
    /// Watches `[start, start + len)`.
    pub(crate) fn new(start: usize, len: usize) -> Watch {
        INSTALL.call_once(install);
        if len == 0 {
            return Watch { slot: None };
        }
        for slot in 0..SLOTS {
            if STARTS[slot]
                .compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                FAULTS[slot].store(0, Ordering::Relaxed);
                ENDS[slot].store(start + len, Ordering::Release);
                return Watch { slot: Some(slot) };
            }
        }
        Watch { slot: None }
    }

    /// Pages of this mapping that were past the file's end when read.
    pub(crate) fn faults(&self) -> usize {
        self.slot
            .map_or(0, |slot| FAULTS[slot].load(Ordering::Relaxed))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            ENDS[slot].store(0, Ordering::Release);
            STARTS[slot].store(0, Ordering::Release);
        }
    }
}

fn install() {
    // SAFETY: sysconf and sigaction with a handler that only uses
    // async-signal-safe calls (atomics, mmap, signal).
    unsafe {
        let page = libc::sysconf(libc::_SC_PAGESIZE);
        if page > 0 {
            PAGE_SIZE.store(page as usize, Ordering::Relaxed);
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
    }
}

extern "C" fn on_sigbus(_signal: i32, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let address = unsafe { (*info).si_addr() } as usize;
    for slot in 0..SLOTS {
        let start = STARTS[slot].load(Ordering::Acquire);
        let end = ENDS[slot].load(Ordering::Acquire);
        if start != 0 && (start..end).contains(&address) {
            let page = address & !(PAGE_SIZE.load(Ordering::Relaxed) - 1);
            // SAFETY: the page lies inside our own read-only file mapping;
            // an anonymous zero page replaces the part the file lost.
            let mapped = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    PAGE_SIZE.load(Ordering::Relaxed),
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if mapped != libc::MAP_FAILED {
                FAULTS[slot].fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    // Not a module file's page: the default action (the fault repeats).
    unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_truncated_under_its_mapping_reads_as_zeros() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![0xAB; 64 * 1024]).unwrap();
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let watch = Watch::new(map.as_ptr() as usize, map.len());
        file.set_len(4096).unwrap();
        // Past the new end: SIGBUS without the guard.
        let tail = std::hint::black_box(&map[40 * 1024..40 * 1024 + 16]);
        assert_eq!(tail, &[0u8; 16]);
        assert_eq!(map[0], 0xAB);
        assert_eq!(watch.faults(), 1);
    }
}
