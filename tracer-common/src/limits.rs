//! Map sizes both sides agree on.

/// Most lock functions whose code ranges the BPF side checks (`LOCK_CODE`):
/// five lock functions in a few modules (the executable, libc, an interposer).
pub const MAX_LOCK_CODE_RANGES: u32 = 32;

/// Map sizes, shared so userspace can say "map full at N entries".
pub const MAX_LOCKS: u32 = 65_536;
/// Probe points `PROBE_COOKIES` holds (tens per lock function and module).
pub const MAX_PROBE_POINTS: u32 = 8_192;
pub const MAX_FUTEXES: u32 = 65_536;
/// Locks the CPU sampler attributes samples to. Preallocated (~1.2 MB):
/// kernels before 6.1 refuse a map allocated at run time in a perf-event
/// program, and at 99 Hz a recording samples far fewer distinct locks.
pub const MAX_CPU_LOCKS: u32 = 16_384;
pub const MAX_CALLERS: u32 = 65_536;
pub const MAX_STACKS: u32 = 16_384;
pub const MAX_WAITING_THREADS: u32 = 16_384;
pub const MAX_CONDVARS: u32 = 16_384;

/// At most this many lock-code ranges (one per function) are given to the sampler.
pub const MAX_CPU_LOCK_CODE_RANGES: u32 = 64;

/// Map sizes of the hold state.
pub const MAX_HELD: u32 = 65_536;
pub const MAX_HOLDERS: u32 = 65_536;
