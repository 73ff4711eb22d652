//! PHP's table of thread blocks (TSRM's `tsrm_tls_table`), read from the
//! target's memory: which block of PHP globals belongs to which thread.
//!
//! Thread-safe PHP keeps one `tsrm_tls_entry` per thread, chained in a hash
//! table by `pthread_self()`; a thread's `_tsrm_ls_cache` points to its
//! entry, and its globals sit at fixed offsets from there. On x86-64 glibc
//! and musl, `pthread_self()` is the thread pointer (the `fs` base), which
//! the BPF side reads from the kernel's task: so the table gives it, per
//! thread, where PHP's globals are.
//!
//! The table is static (in `.symtab` only): where it is stripped, the
//! offset of `_tsrm_ls_cache` from the thread pointer comes from what
//! `.dynsym` keeps, PHP's `tsrm_get_ls_cache_tcb_offset` or, on musl where
//! that returns 0, the pthread key `tsrm_get_ls_cache` reads.
use super::memory::TargetMemory;

/// Where the table is and how its entries are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ThreadTable {
    /// Runtime addresses of `tsrm_tls_table` (a pointer to the bucket
    /// array) and `tsrm_tls_table_size` (an int).
    pub table: u64,
    pub size: u64,
    /// Offsets of `thread_id` and `next` in `tsrm_tls_entry`.
    pub thread_id: u64,
    pub next: u64,
}

/// Buckets read at most (PHP sizes the table at startup: 1 in FrankenPHP
/// and mod_php, a few hundred at most elsewhere).
const MAX_BUCKETS: u64 = 65_536;
/// Entries read at most, over all chains (a chain looping back on itself in
/// a torn read ends here).
const MAX_ENTRIES: usize = 4096;

fn read_u64(memory: &dyn TargetMemory, address: u64) -> Option<u64> {
    let mut bytes = [0u8; 8];
    (memory.read(address, &mut bytes) == 8).then(|| u64::from_le_bytes(bytes))
}

fn read_i32(memory: &dyn TargetMemory, address: u64) -> Option<i32> {
    let mut bytes = [0u8; 4];
    (memory.read(address, &mut bytes) == 4).then(|| i32::from_le_bytes(bytes))
}

impl ThreadTable {
    /// (thread pointer, block address) of every thread PHP knows; empty
    /// before PHP started its threads or when the table cannot be read. The
    /// process keeps running meanwhile: a chain changed under the read ends
    /// early, and the next read gets it right.
    pub fn threads(&self, memory: &dyn TargetMemory) -> Vec<(u64, u64)> {
        let mut found = Vec::new();
        let Some(buckets) = read_u64(memory, self.table).filter(|&b| b != 0) else {
            return found;
        };
        let Some(size) = read_i32(memory, self.size).and_then(|s| u64::try_from(s).ok()) else {
            return found;
        };
        let mut steps = 0;
        for bucket in 0..size.min(MAX_BUCKETS) {
            let Some(mut entry) = read_u64(memory, buckets + bucket * 8) else {
                break;
            };
            while entry != 0 && steps < MAX_ENTRIES {
                steps += 1;
                let Some(thread) = read_u64(memory, entry + self.thread_id) else {
                    break;
                };
                if thread != 0 && !found.iter().any(|&(_, block)| block == entry) {
                    found.push((thread, entry));
                }
                entry = read_u64(memory, entry + self.next).unwrap_or(0);
            }
        }
        found
    }
}

/// How far below the thread pointer a thread's static TLS is searched for
/// PHP's `_tsrm_ls_cache` (x86-64 puts static TLS right below it).
pub(crate) const TLS_SEARCH_BYTES: u64 = 64 * 1024;

/// The offset from the thread pointer of a TLS slot holding each known
/// thread's block (PHP's `_tsrm_ls_cache`): the BPF side then reads any
/// thread's block there, also before PHP's table is read again (a thread's
/// first request). Found by search, so it needs no relocation or TLS model:
/// the offsets where the first thread's block appears below its thread
/// pointer, kept where every other known thread's block is found too.
/// None when no thread is known or no offset holds for all.
pub(crate) fn tls_offset(memory: &dyn TargetMemory, threads: &[(u64, u64)]) -> Option<i64> {
    let &(first_tp, first_block) = threads.first()?;
    let start = first_tp.checked_sub(TLS_SEARCH_BYTES)?;
    let mut window = vec![0u8; TLS_SEARCH_BYTES as usize];
    if memory.read(start, &mut window) != window.len() {
        return None;
    }
    let mut candidates: Vec<i64> = window
        .chunks_exact(8)
        .enumerate()
        .filter(|(_, word)| u64::from_le_bytes((*word).try_into().unwrap_or([0; 8])) == first_block)
        .map(|(index, _)| index as i64 * 8 - TLS_SEARCH_BYTES as i64)
        .collect();
    for &(tp, block) in &threads[1..] {
        candidates
            .retain(|&offset| read_u64(memory, tp.wrapping_add_signed(offset)) == Some(block));
    }
    // Several slots may hold it (each module built with PHP's static cache
    // has its own): any that holds for every thread will do.
    candidates.last().copied()
}

/// True when `offset` gives every thread's block.
pub(crate) fn tls_offset_holds(
    memory: &dyn TargetMemory,
    threads: &[(u64, u64)],
    offset: i64,
) -> bool {
    threads
        .iter()
        .all(|&(tp, block)| read_u64(memory, tp.wrapping_add_signed(offset)) == Some(block))
}

/// What the code of PHP's `tsrm_get_ls_cache_tcb_offset` says about
/// where `_tsrm_ls_cache` sits (PHP's own answer, for its JIT, to "how far
/// from the thread pointer is the slot"; exported in `.dynsym`, so it
/// survives `strip --strip-all`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TcbOffsetCode {
    /// `movq _tsrm_ls_cache@gottpoff(%rip), %reg`: the offset is the value
    /// of the GOT slot at this link address, set by the loader (a shared
    /// libphp on glibc).
    GotSlot(u64),
    /// The same relaxed by the linker in an executable (`movq $off, %reg`):
    /// the offset itself.
    Offset(i64),
    /// `return 0`: PHP gives no offset on this platform (musl).
    Zero,
}

/// Decodes the code of `tsrm_get_ls_cache_tcb_offset`, which starts at
/// link address `address`: its first instruction after an `endbr64` must
/// be one of the three forms above, else None.
pub(crate) fn decode_tcb_offset(code: &[u8], address: u64) -> Option<TcbOffsetCode> {
    use iced_x86::{Code, Decoder, DecoderOptions, OpKind, Register};
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut instruction = decoder.decode();
    if instruction.code() == Code::Endbr64 {
        instruction = decoder.decode();
    }
    let register_64 =
        instruction.op0_kind() == OpKind::Register && instruction.op0_register().is_gpr64();
    match instruction.code() {
        Code::Mov_r64_rm64
            if register_64
                && instruction.op1_kind() == OpKind::Memory
                && instruction.is_ip_rel_memory_operand() =>
        {
            Some(TcbOffsetCode::GotSlot(instruction.ip_rel_memory_address()))
        }
        Code::Mov_rm64_imm32 if register_64 => {
            Some(TcbOffsetCode::Offset(instruction.immediate32to64()))
        }
        Code::Xor_r32_rm32 | Code::Xor_rm32_r32
            if instruction.op0_register() == Register::EAX
                && instruction.op1_kind() == OpKind::Register
                && instruction.op1_register() == Register::EAX =>
        {
            Some(TcbOffsetCode::Zero)
        }
        _ => None,
    }
}

/// Where `tsrm_get_ls_cache` (exported) finds a thread's block on a libc
/// whose `pthread_getspecific` is a plain array read (musl):
/// `mov tls_key(%rip), %edi; jmp pthread_getspecific`. The link addresses
/// of PHP's `tls_key` and of `pthread_getspecific`.
pub(crate) fn decode_ls_cache(code: &[u8], address: u64) -> Option<(u64, u64)> {
    use iced_x86::{Code, Decoder, DecoderOptions, OpKind, Register};
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut load = decoder.decode();
    if load.code() == Code::Endbr64 {
        load = decoder.decode();
    }
    let jump = decoder.decode();
    let loads_key = load.code() == Code::Mov_r32_rm32
        && load.op0_register() == Register::EDI
        && load.op1_kind() == OpKind::Memory
        && load.is_ip_rel_memory_operand();
    let tail_calls = matches!(jump.code(), Code::Jmp_rel32_64 | Code::Jmp_rel8_64);
    (loads_key && tail_calls).then(|| (load.ip_rel_memory_address(), jump.near_branch_target()))
}

/// The offset in musl's thread (what the thread pointer points to) of its
/// array of pthread-specific values, from `pthread_getspecific`'s code:
/// `mov %fs:0, %rax; mov D(%rax), %rax; [mov %edi, %edi;] mov (%rax,%rdi,8), %rax`.
pub(crate) fn decode_getspecific(code: &[u8], address: u64) -> Option<u64> {
    use iced_x86::{Code, Decoder, DecoderOptions, OpKind, Register};
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut self_load = decoder.decode();
    if self_load.code() == Code::Endbr64 {
        self_load = decoder.decode();
    }
    let thread = self_load.op0_register();
    let reads_self = self_load.code() == Code::Mov_r64_rm64
        && self_load.segment_prefix() == Register::FS
        && self_load.memory_base() == Register::None
        && self_load.memory_index() == Register::None
        && self_load.memory_displacement64() == 0;
    let array_load = decoder.decode();
    let array = array_load.op0_register();
    let reads_array = array_load.code() == Code::Mov_r64_rm64
        && array_load.op1_kind() == OpKind::Memory
        && array_load.memory_base() == thread
        && array_load.memory_index() == Register::None;
    let mut index = decoder.decode();
    if matches!(index.code(), Code::Mov_r32_rm32 | Code::Mov_rm32_r32)
        && index.op0_register() == Register::EDI
    {
        index = decoder.decode();
    }
    let reads_value = index.code() == Code::Mov_r64_rm64
        && index.memory_base() == array
        && index.memory_index() == Register::RDI
        && index.memory_index_scale() == 8
        && index.memory_displacement64() == 0;
    (reads_self && reads_array && reads_value).then(|| array_load.memory_displacement64())
}

/// Where a thread's block is read from its thread pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsSlot {
    /// From the thread pointer.
    pub offset: i64,
    /// Some: the pointer there is an array, the block at this byte offset
    /// in it (musl's pthread-specific values).
    pub index: Option<u64>,
}

impl TlsSlot {
    /// The block of the thread whose thread pointer is `tp`.
    pub(crate) fn block(&self, memory: &dyn TargetMemory, tp: u64) -> Option<u64> {
        let slot = tp.wrapping_add_signed(self.offset);
        match self.index {
            None => read_u64(memory, slot),
            Some(index) => read_u64(memory, read_u64(memory, slot)?.wrapping_add(index)),
        }
    }

    /// True when it gives every thread's block.
    pub fn holds(&self, memory: &dyn TargetMemory, threads: &[(u64, u64)]) -> bool {
        threads
            .iter()
            .all(|&(tp, block)| self.block(memory, tp) == Some(block))
    }
}

/// Whether `offset` can be a pointer's slot in static TLS: below the thread
/// pointer, aligned, within the TLS search's reach (an offset read from a
/// wrong place is refused, not used).
pub(crate) fn plausible_tls_offset(offset: i64) -> bool {
    offset < 0 && offset % 8 == 0 && offset >= -(TLS_SEARCH_BYTES as i64) * 16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::memory::FakeMemory;

    const TABLE: ThreadTable = ThreadTable {
        table: 0x1000,
        size: 0x1008,
        thread_id: 16,
        next: 24,
    };

    fn entry(memory: &mut FakeMemory, at: u64, thread: u64, next: u64) {
        let mut bytes = vec![0u8; 32];
        bytes[16..24].copy_from_slice(&thread.to_le_bytes());
        bytes[24..32].copy_from_slice(&next.to_le_bytes());
        memory.map(at, bytes);
    }

    #[test]
    fn every_chain_of_every_bucket() {
        let mut memory = FakeMemory::default();
        let mut globals = vec![0u8; 12];
        globals[..8].copy_from_slice(&0x2000u64.to_le_bytes());
        globals[8..12].copy_from_slice(&2i32.to_le_bytes());
        memory.map(0x1000, globals);
        let mut buckets = vec![0u8; 16];
        buckets[..8].copy_from_slice(&0x3000u64.to_le_bytes());
        buckets[8..].copy_from_slice(&0x5000u64.to_le_bytes());
        memory.map(0x2000, buckets);
        entry(&mut memory, 0x3000, 0x7f00, 0x4000);
        entry(&mut memory, 0x4000, 0x7f10, 0);
        entry(&mut memory, 0x5000, 0x7f20, 0);
        assert_eq!(
            TABLE.threads(&memory),
            vec![(0x7f00, 0x3000), (0x7f10, 0x4000), (0x7f20, 0x5000)]
        );
    }

    /// Two threads whose TLS holds their blocks 0x40 below the thread
    /// pointer; the first also has the block elsewhere by chance.
    #[test]
    fn the_tls_offset_is_the_one_every_thread_agrees_on() {
        let mut memory = FakeMemory::default();
        let threads = [(0x10_0000u64, 0xaaaa_0000u64), (0x20_0000, 0xbbbb_0000)];
        for (n, &(tp, block)) in threads.iter().enumerate() {
            let mut tls = vec![0u8; TLS_SEARCH_BYTES as usize];
            let at = tls.len() - 0x40;
            tls[at..at + 8].copy_from_slice(&block.to_le_bytes());
            if n == 0 {
                tls[0x100..0x108].copy_from_slice(&block.to_le_bytes());
            }
            memory.map(tp - TLS_SEARCH_BYTES, tls);
        }
        assert_eq!(tls_offset(&memory, &threads), Some(-0x40));
        assert!(tls_offset_holds(&memory, &threads, -0x40));
        assert!(!tls_offset_holds(&memory, &threads, -0x48));
        assert_eq!(tls_offset(&memory, &[]), None);
    }

    #[test]
    fn a_loop_or_an_unreadable_table_ends_the_read() {
        let mut memory = FakeMemory::default();
        assert!(TABLE.threads(&memory).is_empty());
        let mut globals = vec![0u8; 12];
        globals[..8].copy_from_slice(&0x2000u64.to_le_bytes());
        globals[8..12].copy_from_slice(&1i32.to_le_bytes());
        memory.map(0x1000, globals);
        memory.map(0x2000, 0x3000u64.to_le_bytes().to_vec());
        // An entry whose next is itself (a torn read).
        entry(&mut memory, 0x3000, 0x7f00, 0x3000);
        assert_eq!(TABLE.threads(&memory), vec![(0x7f00, 0x3000)]);
    }

    /// The forms gcc and ld give `tsrm_get_ls_cache_tcb_offset`, as seen in
    /// a shared object (with and without `-fcf-protection`), a static glibc
    /// executable (the GOT load relaxed to an immediate) and musl.
    #[test]
    fn tcb_offset_code_in_each_form() {
        let got = [0x48, 0x8b, 0x05, 0x81, 0x20, 0x00, 0x00, 0xc3];
        assert_eq!(
            decode_tcb_offset(&got, 0x1f30),
            Some(TcbOffsetCode::GotSlot(0x3fb8))
        );
        let endbr = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x4c, 0x8b, 0x05, 0xf0, 0xff, 0xff, 0xff, 0xc3,
        ];
        assert_eq!(
            decode_tcb_offset(&endbr, 0x1000),
            Some(TcbOffsetCode::GotSlot(0x1000 + 11 - 0x10))
        );
        let relaxed = [0x48, 0xc7, 0xc0, 0xb0, 0xff, 0xff, 0xff, 0xc3];
        assert_eq!(
            decode_tcb_offset(&relaxed, 0x401660),
            Some(TcbOffsetCode::Offset(-80))
        );
        assert_eq!(
            decode_tcb_offset(&[0x31, 0xc0, 0xc3], 0),
            Some(TcbOffsetCode::Zero)
        );
        // A call, a truncated load, nothing.
        assert_eq!(decode_tcb_offset(&[0xe8, 0, 0, 0, 0], 0), None);
        assert_eq!(decode_tcb_offset(&[0x48, 0x8b, 0x05, 0x81], 0), None);
        assert_eq!(decode_tcb_offset(&[], 0), None);
    }

    /// musl's (1.2.3, static) and PHP's code built with musl-gcc.
    #[test]
    fn musl_pthread_key_code() {
        let ls_cache = [
            0x8b, 0x3d, 0x9a, 0xe2, 0x35, 0x00, 0xe9, 0x05, 0xe8, 0xdf, 0xff,
        ];
        assert_eq!(
            decode_ls_cache(&ls_cache, 0x2ef6a0),
            Some((0x64d940, 0xedeb0))
        );
        let getspecific = [
            0x64, 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0, 0x48, 0x8b, 0x80, 0x80, 0, 0, 0, 0x89, 0xff,
            0x48, 0x8b, 0x04, 0xf8, 0xc3,
        ];
        assert_eq!(decode_getspecific(&getspecific, 0x1000), Some(0x80));
        // glibc's pthread_getspecific checks the key and a sequence number:
        // not a plain array read.
        assert_eq!(decode_getspecific(&[0x83, 0xff, 0x1f, 0x77, 0x10], 0), None);
        assert_eq!(decode_ls_cache(&[0x31, 0xc0, 0xc3], 0), None);
    }

    /// A slot holding the block, and one holding musl's array with the
    /// block at key 3.
    #[test]
    fn a_slot_gives_each_threads_block_directly_or_through_an_array() {
        let mut memory = FakeMemory::default();
        memory.map(0x10_0000 - 0x40, 0xaaaa_0000u64.to_le_bytes().to_vec());
        let direct = TlsSlot {
            offset: -0x40,
            index: None,
        };
        assert!(direct.holds(&memory, &[(0x10_0000, 0xaaaa_0000)]));
        memory.map(0x20_0080, 0x30_0000u64.to_le_bytes().to_vec());
        memory.map(0x30_0018, 0xbbbb_0000u64.to_le_bytes().to_vec());
        let array = TlsSlot {
            offset: 0x80,
            index: Some(3 * 8),
        };
        assert_eq!(array.block(&memory, 0x20_0000), Some(0xbbbb_0000));
        assert!(!array.holds(&memory, &[(0x20_0000, 0xaaaa_0000)]));
    }
}
