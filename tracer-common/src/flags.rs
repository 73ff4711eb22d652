//! Bits of the `FLAGS` global, set by userspace before load. Callers of
//! lock calls and futex syscalls are always recorded: no bit for them
//! (1 and 4 were those bits; they stay unused).

/// Record user stacks (frame-pointer walk) of every lock call.
pub const STACKS: u32 = 2;
/// Sampled mode: lock calls count only inside windows
/// ([`counting::LOCK_CALLS`](crate::counting::LOCK_CALLS) is set once a window's probes are all
/// attached, and cleared before detaching them, so the counted time is exact).
pub const SAMPLED: u32 = 8;
/// The target is a Go program: futex calls whose user instruction pointer
/// lies in `runtime.futex` (`GO_FUTEX_START..GO_FUTEX_END`) are the runtime's.
pub const GO_RUNTIME: u32 = 16;
/// `--hold-times`: keep per-thread hold state at lock calls, unlock probes attached.
pub const HOLDS: u32 = 32;
/// Count each lock's moves between CPUs (`HANDOFFS`) at its acquisitions.
pub const HANDOFFS: u32 = 64;
/// `--php`: label lock calls and waits with the thread's route
/// (`php::ROUTE_LOCKS`) and read the PHP stack into each snapshot.
pub const PHP: u32 = 128;
