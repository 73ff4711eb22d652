//! Stack keys and the snapshots the BPF side copies for userspace to unwind.

use crate::php;

/// Key of the `STACK_COUNTS` map: lock calls by (lock, immediate caller),
/// futex waits by word (`return_ip` 0). Their stacks come from the
/// key's snapshots.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub lock: u64,
    /// What the key counts (`stack_kind`; it held the kernel's
    /// frame-pointer stack id once).
    pub stack_id: i64,
    /// Return address read at the probe (0 where none): the kernel's unwinder
    /// starts at the probed instruction and misses the immediate caller.
    pub return_ip: u64,
    /// `--php`: the line running in the innermost frame written in PHP,
    /// plus one, so that each PHP line calling one native call site gets
    /// snapshots of its own; 0 otherwise (and outside PHP code).
    pub php_site: u64,
}

/// Bytes of user stack a snapshot copies, from the stack pointer up (the
/// default window of `perf --call-graph dwarf` is 8 KiB; PHP's stacks from
/// a mysqlnd lock call to the thread's start are up to ~20 KiB).
pub const STACK_WINDOW: usize = 32 * 1024;
/// Bytes of the `SNAPSHOTS` ring buffer when stacks are recorded (a page
/// otherwise): room for 1,000 snapshots, the burst of a server's first
/// requests under load while the reader thread waits for a CPU.
pub const SNAPSHOT_RING_BYTES: u32 = 32 << 20;
/// Bytes of the `SNAPSHOTS` ring buffer when only lock init calls are
/// snapshotted (creation sites without `--stacks`): room for about 250,
/// a burst of new locks; init calls are rare (about one per request on
/// FrankenPHP, against 792 lock calls).
pub const INIT_SNAPSHOT_RING_BYTES: u32 = 8 << 20;

/// True when the `n`th count of a stack key takes a snapshot: the first 8,
/// then 4 per doubling (`n` has at most three significant bits). A key
/// counted N times gets about 4·log2(N) snapshots, and each stands for
/// the calls up to the next one, so the counts per unwound stack add up
/// to the key's exact count.
pub fn snapshot_due(n: u64) -> bool {
    n != 0 && n < ((n & n.wrapping_neg()) << 3)
}

/// A copy of a thread's registers and user stack, sent through the
/// `SNAPSHOTS` ring buffer and unwound in user space with the modules'
/// call-frame information (whole stacks through code without frame
/// pointers).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StackSnapshot {
    pub header: SnapshotHeader,
    /// The thread's PHP stack at the snapshot (`flags::PHP`; depth 0 otherwise).
    pub php: php::PhpStack,
    /// `header.len` bytes from `header.sp` up.
    pub stack: [u8; STACK_WINDOW],
}

/// What a snapshot holds besides the stack bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SnapshotHeader {
    /// The `STACK_COUNTS` key the snapshot was taken for.
    pub key: StackKey,
    /// That key's count when it was taken.
    pub count_at: u64,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Where the return address is on the stack, for a probe in a lock
    /// function (0 otherwise): the unwinder starts at the caller, so lock
    /// functions without call-frame information (musl's) still unwind.
    pub return_slot: u64,
    /// Bytes of the stack read from `sp` up (0: none were readable).
    pub len: u64,
}
