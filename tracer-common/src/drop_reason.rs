//! Indexes of the `DROPS` counters: events that could not be counted.

/// A new lock did not fit in the `LOCKS` map.
pub const LOCKS_FULL: u32 = 0;
/// A new futex did not fit in the `FUTEXES` map.
pub const FUTEXES_FULL: u32 = 1;
/// A new (lock, caller) pair did not fit in the `CALLERS` map (the call
/// itself is counted in `LOCKS`, its caller is not known).
pub const CALLERS_FULL: u32 = 2;
/// The kernel could not unwind or store a stack (`STACKS` map).
pub const STACKS_LOST: u32 = 3;
/// A thread's wait start did not fit in the `WAITING` map, so that wait was not timed.
pub const WAITS_UNTRACKED: u32 = 4;
/// Reading the return address from the target's stack failed.
pub const CALLER_UNREADABLE: u32 = 5;
/// A thread's condvar wait did not fit in `COND_THREADS`: its futex
/// waits there were counted as plain futex waits.
pub const COND_WAITS_UNTRACKED: u32 = 6;
/// A hold did not fit in the `HELD` map: it was not timed.
pub const HOLDS_UNTRACKED: u32 = 7;
/// A (futex, holder) pair did not fit in the `WAIT_HOLDERS` map.
pub const WAIT_HOLDERS_FULL: u32 = 8;
/// A new condvar did not fit in the `CONDVARS` map.
pub const CONDVARS_FULL: u32 = 9;
/// A new Go runtime futex word did not fit in the `GO_FUTEXES` map.
pub const GO_FUTEXES_FULL: u32 = 10;
/// A new (lock, stack) pair did not fit in the `STACK_COUNTS` map.
pub const STACK_COUNTS_FULL: u32 = 11;
/// A completed hold's lock did not fit in the `HOLDS` map.
pub const HOLDS_MAP_FULL: u32 = 12;
/// A completed hold's (lock, call site) did not fit in the `HOLDERS` map.
pub const HOLDERS_MAP_FULL: u32 = 13;
/// Events while counting was paused to expire entries (`serve`, `top`).
pub const PAUSED_FOR_EXPIRY: u32 = 14;
/// A new address did not fit in the CPU sampler's `CPU_LOCKS` map: the
/// sample counts in `lock_code_ns` but no lock's `cpu_ns`.
pub const CPU_LOCKS_FULL: u32 = 15;
/// A failed trylock or timed-out lock call did not fit in the
/// `FAILED_TRIES` map, or its call did not fit in `PENDING_TRIES` (then
/// it is missing from the acquisitions too, whatever it returned).
pub const FAILED_TRIES_UNTRACKED: u32 = 16;
/// A stack snapshot did not fit in the `SNAPSHOTS` ring buffer: its
/// calls count under the previous snapshot's stack.
pub const SNAPSHOTS_LOST: u32 = 17;
/// A lock call at a probe point missing from `PROBE_COOKIES` (kernels
/// without attach cookies: a module mapped after the attach).
pub const PROBE_POINT_UNKNOWN: u32 = 18;
/// Memory unmapped or replaced (exec) after the lifetime numbers ran
/// out or the `UNMAPPED` log filled: locks at a reused address may
/// merge with the one that was there before.
pub const LIFETIMES_MERGED: u32 = 19;
/// A new lock did not fit in the `HANDOFFS` map: its acquisitions are
/// counted, its moves between CPUs are not.
pub const HANDOFFS_FULL: u32 = 20;
/// A new (route, lock) pair or route did not fit in `ROUTE_LOCKS` or
/// `ROUTE_REQUESTS` (`--php`): counted in the totals, not per route.
pub const ROUTES_FULL: u32 = 21;
/// A request's route did not fit in `ROUTE_TEXTS` (`--php`, more
/// distinct routes than `php::MAX_ROUTES`): the request and its lock
/// calls count under `php::PAST_CAP_ROUTE`. One per request.
pub const ROUTES_PAST_CAP: u32 = 22;
/// A stack key's later snapshot (not its first) not taken while more
/// than an eighth of the `SNAPSHOTS` ring buffer waited for the reader:
/// its calls count under the key's previous snapshot's stack.
pub const SNAPSHOTS_SKIPPED: u32 = 23;
pub const COUNT: u32 = 24;
pub const NAMES: [&str; COUNT as usize] = [
    "locks_map_full",
    "futex_map_full",
    "callers_map_full",
    "stacks_lost",
    "waits_untracked",
    "caller_unreadable",
    "cond_waits_untracked",
    "holds_untracked",
    "wait_holders_full",
    "condvar_map_full",
    "go_futex_map_full",
    "stack_counts_full",
    "holds_map_full",
    "holders_map_full",
    "paused_for_expiry",
    "cpu_locks_full",
    "failed_tries_untracked",
    "snapshots_lost",
    "probe_point_unknown",
    "lifetimes_merged",
    "handoffs_map_full",
    "routes_map_full",
    "routes_past_cap",
    "snapshots_skipped",
];
