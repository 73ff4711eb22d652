//! Types shared by the BPF programs (`tracer-ebpf`) and userspace (`tracer-user`):
//! map keys and values, the probe cookie layout, and the failure counters.
//! Every type is `#[repr(C)]` and plain data so both sides agree on its bytes.
#![no_std]

/// The lock functions we probe. The discriminant indexes [`LockCounts::calls`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockOp {
    MutexLock = 0,
    MutexTrylock = 1,
    MutexTimedlock = 2,
    RwlockRdlock = 3,
    RwlockWrlock = 4,
    MutexClocklock = 5,
    RwlockTryrdlock = 6,
    RwlockTrywrlock = 7,
    RwlockTimedrdlock = 8,
    RwlockTimedwrlock = 9,
    RwlockClockrdlock = 10,
    RwlockClockwrlock = 11,
    SpinLock = 12,
    SpinTrylock = 13,
    /// Unlock functions (`--hold-times`): probed by their own program, never
    /// counted in [`LockCounts::calls`].
    MutexUnlock = 14,
    RwlockUnlock = 15,
    SpinUnlock = 16,
}

/// Number of [`LockOp`] variants that take a lock (the unlocks follow them).
pub const LOCK_OPS: usize = 14;

impl LockOp {
    /// The unlock functions probed with `--hold-times`.
    pub const UNLOCKS: [LockOp; 3] = [
        LockOp::MutexUnlock,
        LockOp::RwlockUnlock,
        LockOp::SpinUnlock,
    ];

    pub const ALL: [LockOp; LOCK_OPS] = [
        LockOp::MutexLock,
        LockOp::MutexTrylock,
        LockOp::MutexTimedlock,
        LockOp::RwlockRdlock,
        LockOp::RwlockWrlock,
        LockOp::MutexClocklock,
        LockOp::RwlockTryrdlock,
        LockOp::RwlockTrywrlock,
        LockOp::RwlockTimedrdlock,
        LockOp::RwlockTimedwrlock,
        LockOp::RwlockClockrdlock,
        LockOp::RwlockClockwrlock,
        LockOp::SpinLock,
        LockOp::SpinTrylock,
    ];

    /// True when the function of `op` may be tail-called by the one of
    /// `outer` (musl: the plain lock jumps to the timed one, which calls
    /// the try one). A try call after a try call is a retry, not nested.
    pub const fn index_tail_called_by(op: u32, outer: u32) -> bool {
        use LockOp::*;
        let (Some(op), Some(outer)) = (LockOp::from_index(op), LockOp::from_index(outer)) else {
            return false;
        };
        matches!(
            (op, outer),
            (MutexTimedlock | MutexClocklock, MutexLock)
                | (MutexTrylock, MutexLock | MutexTimedlock)
                | (RwlockTimedrdlock, RwlockRdlock)
                | (RwlockTryrdlock, RwlockRdlock | RwlockTimedrdlock)
                | (RwlockTimedwrlock, RwlockWrlock)
                | (RwlockTrywrlock, RwlockWrlock | RwlockTimedwrlock)
        )
    }

    /// The libc symbol of this operation.
    pub const fn symbol(self) -> &'static str {
        match self {
            LockOp::MutexLock => "pthread_mutex_lock",
            LockOp::MutexTrylock => "pthread_mutex_trylock",
            LockOp::MutexTimedlock => "pthread_mutex_timedlock",
            LockOp::RwlockRdlock => "pthread_rwlock_rdlock",
            LockOp::RwlockWrlock => "pthread_rwlock_wrlock",
            LockOp::MutexClocklock => "pthread_mutex_clocklock",
            LockOp::RwlockTryrdlock => "pthread_rwlock_tryrdlock",
            LockOp::RwlockTrywrlock => "pthread_rwlock_trywrlock",
            LockOp::RwlockTimedrdlock => "pthread_rwlock_timedrdlock",
            LockOp::RwlockTimedwrlock => "pthread_rwlock_timedwrlock",
            LockOp::RwlockClockrdlock => "pthread_rwlock_clockrdlock",
            LockOp::RwlockClockwrlock => "pthread_rwlock_clockwrlock",
            LockOp::SpinLock => "pthread_spin_lock",
            LockOp::SpinTrylock => "pthread_spin_trylock",
            LockOp::MutexUnlock => "pthread_mutex_unlock",
            LockOp::RwlockUnlock => "pthread_rwlock_unlock",
            LockOp::SpinUnlock => "pthread_spin_unlock",
        }
    }

    /// A call that may return without the lock (busy, timed out): its
    /// return value is read, and only a success is an acquisition.
    pub const fn may_fail(self) -> bool {
        !matches!(
            self,
            LockOp::MutexLock
                | LockOp::RwlockRdlock
                | LockOp::RwlockWrlock
                | LockOp::SpinLock
                | LockOp::MutexUnlock
                | LockOp::RwlockUnlock
                | LockOp::SpinUnlock
        )
    }

    /// A spinlock (`pthread_spinlock_t`): it spins, never waits on a futex.
    pub const fn is_spin(self) -> bool {
        matches!(
            self,
            LockOp::SpinLock | LockOp::SpinTrylock | LockOp::SpinUnlock
        )
    }

    /// The op index may fail (see [`LockOp::may_fail`]); for BPF, which has the index.
    pub const fn index_may_fail(index: u32) -> bool {
        match LockOp::from_index(index) {
            Some(op) => op.may_fail(),
            None => false,
        }
    }

    pub const fn is_rwlock(self) -> bool {
        matches!(
            self,
            LockOp::RwlockRdlock
                | LockOp::RwlockWrlock
                | LockOp::RwlockTryrdlock
                | LockOp::RwlockTrywrlock
                | LockOp::RwlockTimedrdlock
                | LockOp::RwlockTimedwrlock
                | LockOp::RwlockClockrdlock
                | LockOp::RwlockClockwrlock
                | LockOp::RwlockUnlock
        )
    }

    pub const fn from_index(index: u32) -> Option<LockOp> {
        match index {
            0 => Some(LockOp::MutexLock),
            1 => Some(LockOp::MutexTrylock),
            2 => Some(LockOp::MutexTimedlock),
            3 => Some(LockOp::RwlockRdlock),
            4 => Some(LockOp::RwlockWrlock),
            5 => Some(LockOp::MutexClocklock),
            6 => Some(LockOp::RwlockTryrdlock),
            7 => Some(LockOp::RwlockTrywrlock),
            8 => Some(LockOp::RwlockTimedrdlock),
            9 => Some(LockOp::RwlockTimedwrlock),
            10 => Some(LockOp::RwlockClockrdlock),
            11 => Some(LockOp::RwlockClockwrlock),
            12 => Some(LockOp::SpinLock),
            13 => Some(LockOp::SpinTrylock),
            14 => Some(LockOp::MutexUnlock),
            15 => Some(LockOp::RwlockUnlock),
            16 => Some(LockOp::SpinUnlock),
            _ => None,
        }
    }
}

/// Key of `PENDING_TRIES`: a call of a lock function that may fail, from
/// its entry to its return, by thread and the stack slot of its return
/// address (right after the return the stack pointer is 8 bytes above it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PendingKey {
    pub tid: u32,
    pub _pad: u32,
    pub return_slot: u64,
}

/// Value of `PENDING_TRIES`: what the return probe counts the call on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingTry {
    pub lock: u64,
    pub op: u32,
    /// 1 when the call was tail-called by another lock function (musl's
    /// lock jumps to its timed variant): not a second acquisition.
    pub nested: u32,
}

/// Value of the `LOCKS` map, keyed by the lock's address in the target:
/// how many times each lock function was called on it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LockCounts {
    pub calls: [u64; LOCK_OPS],
}

/// Value of the `HANDOFFS` map, keyed by lock (like `LOCKS`): the CPU of
/// the lock's last acquisition, and how many acquisitions happened on
/// another CPU than the one before (the lock's cache line had to move), by
/// [`handoff_class`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HandoffCounts {
    /// The CPU of the last acquisition, plus one (0: none seen yet).
    pub last_cpu: u32,
    pub _pad: u32,
    pub counts: [u64; handoff_class::COUNT],
}

/// Value of the `CPU_PLACES` array, indexed by CPU number: where the CPU
/// sits in the cache topology (userspace fills it from sysfs at attach).
/// Ids are plus one; 0 means unknown, which matches no other CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuPlace {
    /// The core (its SMT siblings share it).
    pub core: u32,
    /// The last-level (L3) cache; without cache information, the package.
    pub l3: u32,
}

/// CPUs `CPU_PLACES` covers; a CPU beyond is classified as another L3.
pub const MAX_CPUS: u32 = 4096;

/// Indexes of [`HandoffCounts::counts`]: how far the lock's cache line moved.
pub mod handoff_class {
    /// To an SMT sibling of the previous CPU (same core).
    pub const SAME_CORE: usize = 0;
    /// To another core sharing the previous CPU's last-level cache.
    pub const SAME_L3: usize = 1;
    /// To a core on another L3 cache or another socket (or a CPU of unknown place).
    pub const OTHER_L3: usize = 2;
    pub const COUNT: usize = 3;

    /// The class of a move between two CPUs' places (never called for the same CPU).
    #[inline(always)]
    pub const fn of(from: super::CpuPlace, to: super::CpuPlace) -> usize {
        if from.core != 0 && from.core == to.core {
            SAME_CORE
        } else if from.l3 != 0 && from.l3 == to.l3 {
            SAME_L3
        } else {
            OTHER_L3
        }
    }
}

/// Value of the `FUTEXES` map, keyed by the futex word's address in the target.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FutexCounts {
    /// futex calls that wait (WAIT, WAIT_BITSET, LOCK_PI, LOCK_PI2, WAIT_REQUEUE_PI).
    pub waits: u64,
    /// Total time spent inside those calls.
    pub wait_ns: u64,
    /// Longest single wait.
    pub max_wait_ns: u64,
    /// futex calls that wake (WAKE, WAKE_BITSET, UNLOCK_PI, WAKE_OP, REQUEUE, CMP_REQUEUE).
    pub wakes: u64,
    /// The waits by duration, log2 buckets (see [`histogram`]); they add up to `waits`.
    pub wait_histogram: [u64; histogram::BUCKETS],
}

/// Value of the per-thread `WAITING` map, keyed by thread id: a futex wait in progress.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FutexWait {
    /// The futex word, or for a condition-variable wait the condvar's address.
    pub uaddr: u64,
    pub start_ns: u64,
    /// [`wait_class`] of the wait: which map its counts go to.
    pub class: u32,
    /// Who held the lock when the wait began (see [`WaitHolderKey`]).
    pub holder_tid: u32,
    pub holder_ip: u64,
}

/// Value of the per-thread `COND_THREADS` map: the thread is inside
/// `pthread_cond_wait`/`_timedwait`/`_clockwait` on `cond` with `mutex`.
/// Its futex waits there are waits for the condition, except those on the
/// mutex's own bytes (re-acquiring it after the wake), which stay lock waits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CondWait {
    pub cond: u64,
    pub mutex: u64,
}

/// Where a futex wait or wake is counted, decided in the BPF program.
pub mod wait_class {
    /// Any futex word: `FUTEXES`, keyed by the word (userspace joins it to a lock).
    pub const FUTEX: u32 = 0;
    /// A wait inside a condvar wait function: `CONDVARS`, keyed by the condvar.
    pub const CONDVAR: u32 = 1;
    /// A futex call made by the Go runtime's `runtime.futex`: `GO_FUTEXES`.
    pub const GO_RUNTIME: u32 = 2;
}

/// Bytes of a pthread mutex (glibc and musl, x86-64): a futex word inside
/// them is the mutex's.
pub const MUTEX_SPAN: u64 = 40;

/// Key of the `CALLERS` map: which code address called which lock function on which lock.
/// Userspace also uses it to drop nested calls (musl's `pthread_mutex_lock`
/// calls `pthread_mutex_timedlock`, whose caller is then a lock function).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CallerKey {
    pub lock: u64,
    /// Return address of the lock call (the instruction after the `call`).
    pub return_ip: u64,
    /// [`LockOp`] index.
    pub op: u32,
    pub _pad: u32,
}

/// Value of `THREAD_ROUTES` (`--php`), per thread: the route of its
/// current request, and its last lock call's entry. A call of a function
/// another lock function may tail-call, entered with the same return slot
/// and address, was tail-called by that one (the jump leaves the stack as
/// it was): one acquisition, not two.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ThreadRoute {
    pub route: u64,
    /// Where the last call's return address is on the stack, and that address.
    pub return_slot: u64,
    pub return_ip: u64,
    /// Its [`LockOp`] index.
    pub op: u64,
}

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

/// Values of `StackKey::stack_id`: what a stack key counts.
pub mod stack_kind {
    /// Lock calls (return address set) and futex waits (return address 0).
    pub const USE: i64 = 0;
    /// Calls of the lock init functions (`pthread_mutex_init`, …): where
    /// the lock at that address was created.
    pub const CREATION: i64 = 1;
    /// CPU samples in lock code, user mode (`--stacks` with the sampler):
    /// the interrupted registers, keyed by the lock the sampler attributed
    /// the sample to (return address 0).
    pub const CPU_USER: i64 = 2;
    /// CPU samples inside a futex syscall on a lock's word: the user
    /// registers saved at the syscall's entry (kernels with task registers).
    pub const CPU_KERNEL: i64 = 3;
    /// Kernel lock contentions (`KERNEL_LOCKS`): keyed by the kernel lock,
    /// the user instruction pointer as `return_ip`, and this plus the
    /// contention's flags (`kernel_lock` bits, below 64) as `stack_id`.
    pub const KERNEL_LOCK: i64 = 16;
}

/// Indexes of the `DROPS` counters: events that could not be counted.
pub mod drop_reason {
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
}

/// Two lifetimes of one address: a lock in a library unloaded with
/// `dlclose` and one in the library loaded at the same address later, or a
/// lock of the program before an `exec` and one of the program after it.
///
/// The BPF side counts which watched memory was unmapped (`GENERATION`: one
/// more at each `munmap`, `mremap` or `MAP_FIXED` `mmap` over a module
/// mapping userspace lists in `WATCHED`, and at each `exec`) and keys every
/// lock and futex word as `address | generation << SHIFT`. Userspace reads
/// the log of unmapped ranges (`UNMAPPED`) and merges the generations of an
/// address that no unmapped range covered in between, so a lock's row only
/// splits when its memory really went away.
pub mod lifetime {
    /// User addresses on x86-64 (4-level paging) are below 2^47.
    pub const SHIFT: u32 = 47;
    pub const ADDRESS_MASK: u64 = (1 << SHIFT) - 1;
    /// Generations that fit above the address bits.
    pub const MAX_GENERATION: u64 = (1 << (64 - SHIFT)) - 1;
    /// Entries of the per-CPU `UNMAPPED` log (per CPU).
    pub const LOG_ENTRIES: u32 = 4096;
    /// Module ranges userspace lists in `WATCHED`.
    pub const WATCHED_RANGES: u32 = 256;
    /// Code the target's loader mapped lately (`RECENT`), noted by the BPF
    /// side itself: a library loaded and unloaded between two of
    /// userspace's reads of the maps is watched too.
    pub const RECENT_RANGES: u32 = 128;
    /// The whole user address space: what an `exec` replaces.
    pub const EVERYTHING: (u64, u64) = (0, 1 << SHIFT);

    /// The key of `address` in `generation`.
    #[inline(always)]
    pub const fn tag(address: u64, generation: u64) -> u64 {
        (address & ADDRESS_MASK) | (generation << SHIFT)
    }

    /// (address, generation) of a key.
    #[inline(always)]
    pub const fn split(key: u64) -> (u64, u64) {
        (key & ADDRESS_MASK, key >> SHIFT)
    }
}

/// An entry of the `UNMAPPED` log: memory `[start, end)` went away, and
/// keys from `generation` on are of what comes after it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unmapped {
    pub start: u64,
    pub end: u64,
    pub generation: u64,
}

/// Bits of the `KERNEL_CAPS` global: BPF helpers the running kernel has.
/// The global is read-only, so the verifier drops the branches for a
/// missing helper instead of refusing the program (Linux 5.10).
pub mod kernel_caps {
    /// `bpf_get_attach_cookie` (Linux 5.15); without it the lock program
    /// looks its cookie up in `PROBE_COOKIES` by the probe's address.
    pub const ATTACH_COOKIE: u32 = 1;
    /// `bpf_get_current_task_btf` and `bpf_task_pt_regs` (Linux 5.15): the
    /// user registers of a thread inside the kernel (wait stacks, Go
    /// runtime waits, CPU samples in futex calls).
    pub const TASK_REGS: u32 = 2;
}

/// Slots of the `REQUESTS` per-CPU array (calls of the request-boundary function).
pub mod requests {
    /// While lock calls count: in sampled mode only inside the windows.
    pub const WHILE_COUNTING: u32 = 0;
    /// While the recording counts at all: sampled mode keeps its request
    /// probe in all along, so its estimates can be scaled by the requests.
    pub const WHOLE_RECORDING: u32 = 1;
    pub const SLOTS: u32 = 2;
}

/// Bits of `COUNTING[0]`, the switch userspace flips while the programs run:
/// a program counts only while its bit is set. Cleared at the end of a
/// recording before the maps are read, so every figure covers one interval.
pub mod counting {
    /// Lock calls and request-boundary calls count (in sampled mode: only
    /// inside a window).
    pub const LOCK_CALLS: u32 = 1;
    /// Futex waits and wakes, condvar waits and unlock calls count.
    pub const WAITS: u32 = 2;
    /// Counting is paused while entries are deleted (`serve`/`top` expiry):
    /// what comes meanwhile is counted as `paused_for_expiry`.
    pub const PAUSED: u32 = 4;
}

/// Most lock functions whose code ranges the BPF side checks (`LOCK_CODE`):
/// five lock functions in a few modules (the executable, libc, an interposer).
pub const MAX_LOCK_CODE_RANGES: u32 = 32;

/// Bits of the `FLAGS` global, set by userspace before load. Callers of
/// lock calls and futex syscalls are always recorded: no bit for them
/// (1 and 4 were those bits; they stay unused).
pub mod flags {
    /// Record user stacks (frame-pointer walk) of every lock call.
    pub const STACKS: u32 = 2;
    /// Sampled mode: lock calls count only inside windows
    /// ([`counting::LOCK_CALLS`] is set once a window's probes are all
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
}

/// Names of the BPF programs and maps, as userspace looks them up. The BPF
/// side declares items of exactly these names (a mismatch fails every
/// attach in the integration tests).
pub mod names {
    /// Uprobe on every lock function's probe points.
    pub const PROGRAM_LOCK_CALL: &str = "lock_call";
    /// Uprobe on the user's once-per-request function.
    pub const PROGRAM_REQUEST_BOUNDARY: &str = "request_boundary";
    /// Tracepoints syscalls:sys_enter_futex and sys_exit_futex.
    pub const PROGRAM_FUTEX_ENTER: &str = "futex_enter";
    pub const PROGRAM_FUTEX_EXIT: &str = "futex_exit";
    pub const PROGRAM_TRY_LOCK_EXIT: &str = "try_lock_exit";
    pub const MAP_FAILED_TRIES: &str = "FAILED_TRIES";
    pub const PROGRAM_FUTEX_WAITV_ENTER: &str = "futex_waitv_enter";
    pub const PROGRAM_FUTEX_WAITV_EXIT: &str = "futex_waitv_exit";
    /// Uprobe and uretprobe on the condvar wait functions.
    pub const PROGRAM_COND_WAIT_ENTER: &str = "cond_wait_enter";
    pub const PROGRAM_COND_WAIT_EXIT: &str = "cond_wait_exit";
    /// Uprobe on the unlock functions' probe points (`--hold-times`).
    pub const PROGRAM_UNLOCK_CALL: &str = "unlock_call";
    /// An empty uprobe that keeps the kernel's breakpoints in the target
    /// (see `trace/follow.rs`).
    pub const PROGRAM_BREAKPOINT_ANCHOR: &str = "breakpoint_anchor";
    /// Uprobe on the lock init functions (`--stacks`: creation sites).
    pub const PROGRAM_LOCK_INIT: &str = "lock_init";

    /// Tracepoints on munmap, mremap, mmap and exec (see [`super::lifetime`]).
    pub const PROGRAM_MUNMAP_ENTER: &str = "munmap_enter";
    pub const PROGRAM_MREMAP_ENTER: &str = "mremap_enter";
    pub const PROGRAM_MMAP_ENTER: &str = "mmap_enter";
    pub const PROGRAM_PROCESS_EXEC: &str = "process_exec";
    pub const MAP_GENERATION: &str = "GENERATION";
    pub const MAP_UNMAPPED: &str = "UNMAPPED";
    pub const MAP_UNMAPPED_COUNT: &str = "UNMAPPED_COUNT";
    pub const MAP_WATCHED: &str = "WATCHED";
    pub const PROGRAM_MMAP_EXIT: &str = "mmap_exit";

    pub const MAP_LOCKS: &str = "LOCKS";
    pub const MAP_FUTEXES: &str = "FUTEXES";
    pub const MAP_CALLERS: &str = "CALLERS";
    pub const MAP_STACK_COUNTS: &str = "STACK_COUNTS";
    pub const MAP_SNAPSHOTS: &str = "SNAPSHOTS";
    pub const MAP_REQUESTS: &str = "REQUESTS";
    pub const MAP_COUNTING: &str = "COUNTING";
    /// Code ranges of the lock functions (`--hold-times`), `[start, end)` each.
    pub const MAP_LOCK_CODE: &str = "LOCK_CODE";
    pub const MAP_DROPS: &str = "DROPS";
    pub const MAP_CONDVARS: &str = "CONDVARS";
    pub const MAP_COND_CALLS: &str = "COND_CALLS";
    pub const MAP_GO_FUTEXES: &str = "GO_FUTEXES";
    pub const MAP_WAIT_HOLDERS: &str = "WAIT_HOLDERS";
    pub const MAP_HOLDS: &str = "HOLDS";
    pub const MAP_HOLDERS: &str = "HOLDERS";
    pub const MAP_UNLOCK_HITS: &str = "UNLOCK_HITS";
    /// In-flight state, read at the end for what is still going on.
    pub const MAP_WAITING: &str = "WAITING";
    pub const MAP_HELD: &str = "HELD";
    /// The CPU sampler (`cpu_sample`, a perf event program on cpu-clock).
    pub const PROGRAM_CPU_SAMPLE: &str = "cpu_sample";
    /// Tracepoints lock:contention_begin and contention_end (Linux 5.19+).
    pub const PROGRAM_KERNEL_LOCK_BEGIN: &str = "kernel_lock_begin";
    pub const PROGRAM_KERNEL_LOCK_END: &str = "kernel_lock_end";
    pub const MAP_KERNEL_LOCKS: &str = "KERNEL_LOCKS";
    pub const MAP_KERNEL_LOCK_STACKS: &str = "KERNEL_LOCK_STACKS";
    pub const MAP_KERNEL_LOCK_EVENTS: &str = "KERNEL_LOCK_EVENTS";
    pub const MAP_CPU_LOCK_CODE: &str = "CPU_LOCK_CODE";
    pub const MAP_CPU_LOCKS: &str = "CPU_LOCKS";
    pub const MAP_CPU_COUNTS: &str = "CPU_COUNTS";

    /// Globals set by userspace before load.
    pub const GLOBAL_TARGET_TGID: &str = "TARGET_TGID";
    pub const GLOBAL_FLAGS: &str = "FLAGS";
    pub const GLOBAL_GO_FUTEX_START: &str = "GO_FUTEX_START";
    pub const GLOBAL_GO_FUTEX_END: &str = "GO_FUTEX_END";
    pub const GLOBAL_LOCK_CODE_RANGES: &str = "LOCK_CODE_RANGES";
    /// Number of filled entries of `CPU_LOCK_CODE`.
    pub const GLOBAL_CPU_LOCK_CODE_RANGES: &str = "CPU_LOCK_CODE_RANGES";
    /// Bits of [`kernel_caps`](super::kernel_caps): what the kernel's BPF offers.
    pub const GLOBAL_KERNEL_CAPS: &str = "KERNEL_CAPS";
    /// Probe point's address in the target → its cookie, where the kernel
    /// has no attach cookies (before Linux 5.15).
    pub const MAP_PROBE_COOKIES: &str = "PROBE_COOKIES";
    /// Per lock: the CPU of its last acquisition and its moves between CPUs.
    pub const MAP_HANDOFFS: &str = "HANDOFFS";
    /// CPU number → its core and L3 cache (filled at attach from sysfs).
    pub const MAP_CPU_PLACES: &str = "CPU_PLACES";
    /// `--php` (see [`super::php`]): PHP's threads, the route of each
    /// request, and the counts per route.
    pub const MAP_PHP_THREADS: &str = "PHP_THREADS";
    pub const MAP_ROUTE_TEXTS: &str = "ROUTE_TEXTS";
    pub const MAP_ROUTE_REQUESTS: &str = "ROUTE_REQUESTS";
    pub const MAP_ROUTE_LOCKS: &str = "ROUTE_LOCKS";
    /// The CPU sampler's samples of the target per route.
    pub const MAP_ROUTE_CPU: &str = "ROUTE_CPU";
    pub const MAP_PHP_MISSES: &str = "PHP_MISSES";
    /// Offsets into PHP's and the kernel's structures, set before load.
    pub const MAP_PHP_OFFSETS: &str = "PHP_OFFSETS";

    /// Every program, map and global above: a unit test checks them against
    /// the embedded object, both ways.
    pub const PROGRAMS: &[&str] = &[
        PROGRAM_LOCK_CALL,
        PROGRAM_REQUEST_BOUNDARY,
        PROGRAM_FUTEX_ENTER,
        PROGRAM_FUTEX_EXIT,
        PROGRAM_TRY_LOCK_EXIT,
        PROGRAM_FUTEX_WAITV_ENTER,
        PROGRAM_FUTEX_WAITV_EXIT,
        PROGRAM_COND_WAIT_ENTER,
        PROGRAM_COND_WAIT_EXIT,
        PROGRAM_UNLOCK_CALL,
        PROGRAM_BREAKPOINT_ANCHOR,
        PROGRAM_LOCK_INIT,
        PROGRAM_MUNMAP_ENTER,
        PROGRAM_MREMAP_ENTER,
        PROGRAM_MMAP_ENTER,
        PROGRAM_MMAP_EXIT,
        PROGRAM_PROCESS_EXEC,
        PROGRAM_CPU_SAMPLE,
        PROGRAM_KERNEL_LOCK_BEGIN,
        PROGRAM_KERNEL_LOCK_END,
    ];
    pub const MAPS: &[&str] = &[
        MAP_FAILED_TRIES,
        MAP_GENERATION,
        MAP_UNMAPPED,
        MAP_UNMAPPED_COUNT,
        MAP_WATCHED,
        MAP_LOCKS,
        MAP_FUTEXES,
        MAP_CALLERS,
        MAP_STACK_COUNTS,
        MAP_SNAPSHOTS,
        MAP_REQUESTS,
        MAP_COUNTING,
        MAP_LOCK_CODE,
        MAP_DROPS,
        MAP_CONDVARS,
        MAP_COND_CALLS,
        MAP_GO_FUTEXES,
        MAP_WAIT_HOLDERS,
        MAP_HOLDS,
        MAP_HOLDERS,
        MAP_UNLOCK_HITS,
        MAP_WAITING,
        MAP_HELD,
        MAP_CPU_LOCK_CODE,
        MAP_CPU_LOCKS,
        MAP_CPU_COUNTS,
        MAP_PROBE_COOKIES,
        MAP_HANDOFFS,
        MAP_CPU_PLACES,
        MAP_PHP_THREADS,
        MAP_ROUTE_TEXTS,
        MAP_ROUTE_REQUESTS,
        MAP_ROUTE_LOCKS,
        MAP_ROUTE_CPU,
        MAP_PHP_MISSES,
        MAP_PHP_OFFSETS,
        MAP_KERNEL_LOCKS,
        MAP_KERNEL_LOCK_STACKS,
        MAP_KERNEL_LOCK_EVENTS,
    ];
    /// Maps only the BPF side uses (per-thread state between its programs).
    pub const BPF_ONLY_MAPS: &[&str] = &[
        "PENDING_TRIES",
        "COND_THREADS",
        "LOCK_HOLDER",
        "THREAD_ROUTES",
        "RECENT",
        "RECENT_NEXT",
        "MAPPING",
        "KERNEL_LOCK_BEGINS",
    ];
    pub const GLOBALS: &[&str] = &[
        GLOBAL_TARGET_TGID,
        GLOBAL_FLAGS,
        GLOBAL_GO_FUTEX_START,
        GLOBAL_GO_FUTEX_END,
        GLOBAL_LOCK_CODE_RANGES,
        GLOBAL_CPU_LOCK_CODE_RANGES,
        GLOBAL_KERNEL_CAPS,
    ];
}

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

/// The uprobe cookie says which lock function a probe is in and where the
/// return address is on the stack at that probe (8 bytes per push done
/// before the probe point, 0 at the entry).
pub mod cookie {
    use super::LockOp;

    pub const fn encode(op: LockOp, return_address_sp_offset: u32) -> u64 {
        ((return_address_sp_offset as u64) << 8) | op as u64
    }

    pub const fn op_index(cookie: u64) -> u32 {
        (cookie & 0xff) as u32
    }

    pub const fn return_address_sp_offset(cookie: u64) -> u64 {
        cookie >> 8
    }
}

/// Log2 buckets of durations, shared by the wait and hold histograms.
/// Bucket 0 holds durations under 256 ns, bucket `b` in 1..BUCKETS-1 holds
/// [2^(7+b), 2^(8+b)) ns, and the last one everything from 2^38 ns (~275 s) up.
pub mod histogram {
    pub const BUCKETS: usize = 32;
    /// log2 of bucket 0's (exclusive) upper bound.
    pub const FIRST_BITS: u32 = 8;

    /// The bucket of a duration; branchy binary search, as BPF has no clz.
    #[inline(always)]
    pub fn bucket(ns: u64) -> usize {
        // bits = number of significant bits of ns (0 for 0).
        let mut value = ns;
        let mut bits = 0u32;
        if value >= 1 << 32 {
            value >>= 32;
            bits += 32;
        }
        if value >= 1 << 16 {
            value >>= 16;
            bits += 16;
        }
        if value >= 1 << 8 {
            value >>= 8;
            bits += 8;
        }
        if value >= 1 << 4 {
            value >>= 4;
            bits += 4;
        }
        if value >= 1 << 2 {
            value >>= 2;
            bits += 2;
        }
        if value >= 1 << 1 {
            value >>= 1;
            bits += 1;
        }
        bits += value as u32;
        let bucket = bits.saturating_sub(FIRST_BITS) as usize;
        if bucket >= BUCKETS {
            BUCKETS - 1
        } else {
            bucket
        }
    }

    /// Exclusive upper bound of a bucket in ns (u64::MAX for the last).
    pub const fn upper_bound_ns(bucket: usize) -> u64 {
        if bucket + 1 >= BUCKETS {
            u64::MAX
        } else {
            1 << (FIRST_BITS as usize + bucket)
        }
    }
}

/// Key of the `HELD` map (`--hold-times`): a thread's hold, or attempt, of a lock.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HeldKey {
    pub lock: u64,
    pub tid: u32,
    pub _pad: u32,
}

/// Value of the `HELD` map: when the hold began and who took it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Held {
    /// The lock call, or the end of the thread's last futex wait on the lock.
    pub start_ns: u64,
    /// Return address of the outermost lock call (the holder's call site).
    pub return_ip: u64,
    /// Lock calls not yet matched by unlocks (recursive mutexes, re-entered read locks).
    pub depth: u32,
    /// 1 when taken by a trylock: it may have failed, so the next lock call restarts it.
    pub tentative: u32,
    /// Where the return address of the last lock call counted in `depth` was
    /// on the stack, and its value: a lock function tail-called by another
    /// (musl) sees both the same, so it is not counted again.
    pub call_slot: u64,
    pub call_ip: u64,
}

/// Value of the `LOCK_HOLDER` map (`--hold-times`), keyed by lock: the thread
/// believed to hold it now, and its call site.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Holder {
    pub return_ip: u64,
    pub tid: u32,
    pub _pad: u32,
}

/// Value of the `HOLDS` map (`--hold-times`), keyed by lock: completed holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HoldCounts {
    pub holds: u64,
    pub hold_ns: u64,
    pub max_hold_ns: u64,
    pub hold_histogram: [u64; histogram::BUCKETS],
}

/// Key of the `HOLDERS` map: holds of a lock taken at one call site.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HolderKey {
    pub lock: u64,
    pub return_ip: u64,
}

/// Value of the `HOLDERS` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HolderHolds {
    pub holds: u64,
    pub hold_ns: u64,
}

/// Key of the `WAIT_HOLDERS` map: futex waits on `uaddr` while the lock was
/// held by the call site `return_ip` (0: unknown, no lock probes) in thread
/// `tid` (0: unknown; in contention mode read from glibc's mutex owner field,
/// so userspace checks it is a thread of the target).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WaitHolderKey {
    pub uaddr: u64,
    pub return_ip: u64,
    pub tid: u32,
    pub _pad: u32,
}

/// Value of the `WAIT_HOLDERS` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WaitTime {
    pub waits: u64,
    pub wait_ns: u64,
}

/// A runtime code range `[start, end)` of one lock function or libc lock
/// slow path (`CPU_LOCK_CODE` map, filled by userspace before the sampler runs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CodeRange {
    pub start: u64,
    pub end: u64,
}

/// At most this many lock-code ranges (one per function) are given to the sampler.
pub const MAX_CPU_LOCK_CODE_RANGES: u32 = 64;

/// Value of the `CPU_LOCKS` map, keyed by the address a lock-code sample was
/// attributed to (the mutex argument in user lock code, the futex word in
/// the kernel): CPU samples of the target there.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSamples {
    /// In the lock functions and libc's lock slow paths (user mode).
    pub user: u64,
    /// In the kernel, inside a futex syscall on the word.
    pub kernel: u64,
}

/// Indexes of the `CPU_COUNTS` array: how the sampler classified the
/// target's CPU samples.
pub mod cpu_sample {
    /// Every sample taken while a thread of the target was on the CPU.
    pub const TARGET: u32 = 0;
    /// In user lock code (attributed in `CPU_LOCKS`).
    pub const LOCK_USER: u32 = 1;
    /// In the kernel inside a futex syscall on a lock word (in `CPU_LOCKS`).
    pub const LOCK_KERNEL: u32 = 2;
    /// In the kernel on a trap from a lock function that is no syscall: the
    /// uprobe's breakpoint handling, the tracer's cost.
    pub const TRACER: u32 = 3;
    /// In a futex syscall of a condvar wait or of the Go runtime: not a lock's.
    pub const FUTEX_NOT_LOCK: u32 = 4;
    /// In the kernel on an interrupt or exception from user code outside
    /// lock code: mostly the scheduler's work after a wake-up (the
    /// reschedule interrupt, the preempted thread's switch back), also
    /// page faults and timer ticks.
    pub const INTERRUPTED: u32 = 5;
    pub const COUNT: u32 = 6;
}

/// Kernel lock contention (`lock:contention_begin`/`contention_end`,
/// Linux 5.19+) of the target's threads. The tracepoints fire only when a
/// kernel lock is contended, so an uncontended target costs nothing.
pub mod kernel_lock {
    /// Bits of the tracepoints' `flags` (the kernel's `LCB_F_*`).
    pub const SPIN: u32 = 1 << 0;
    pub const READ: u32 = 1 << 1;
    pub const WRITE: u32 = 1 << 2;
    pub const RT: u32 = 1 << 3;
    pub const PERCPU: u32 = 1 << 4;
    pub const MUTEX: u32 = 1 << 5;
    /// (lock, flags, kernel stack, user lock, user site) keys `KERNEL_LOCKS` holds.
    pub const MAX_KEYS: u32 = 16_384;
    /// Kernel stacks `KERNEL_LOCK_STACKS` holds.
    pub const MAX_STACKS: u32 = 4_096;
    /// Frames of a kernel stack (the kernel's `PERF_MAX_STACK_DEPTH`).
    pub const STACK_DEPTH: usize = 127;
    /// Slots of the per-CPU `KERNEL_LOCK_EVENTS` array.
    pub mod event {
        /// A `contention_begin` while the thread already waited for a
        /// kernel lock (a spinlock inside a rwsem's slow path, a mutex's
        /// spin before it sleeps): not a contention of its own, as in
        /// `perf lock contention`.
        pub const NESTED: u32 = 0;
        /// A `contention_end` with no begin of the thread (it began before
        /// the attach or while counting was off).
        pub const UNMATCHED_END: u32 = 1;
        /// A begin whose thread state did not fit in `KERNEL_LOCK_BEGINS`.
        pub const UNTRACKED: u32 = 2;
        /// A kernel stack that could not be stored (`stack_id` -1).
        pub const STACK_LOST: u32 = 3;
        /// A contention whose key did not fit in `KERNEL_LOCKS`: not counted.
        pub const KEYS_FULL: u32 = 4;
        pub const COUNT: u32 = 5;
    }
}

/// Key of `KERNEL_LOCKS`: contentions of one kernel lock, with one set of
/// flags, from one kernel stack, while one user futex call (or none) was
/// in progress, from one user instruction, under one route (`--php`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KernelLockKey {
    /// The kernel lock's address.
    pub lock: u64,
    /// The futex word of the futex syscall the thread was in (keyed as
    /// `FUTEXES`: `lifetime::tag`ged), 0 outside one.
    pub user_lock: u64,
    /// The user instruction pointer saved at the kernel entry (syscall,
    /// fault or interrupt): the user side's innermost frame.
    pub user_ip: u64,
    /// Id in `KERNEL_LOCK_STACKS`, -1 when lost.
    pub stack_id: i64,
    /// `kernel_lock::SPIN` … `MUTEX` bits.
    pub flags: u32,
    pub _pad: u32,
    /// `--php`: the route key of the request the thread was serving
    /// (`THREAD_ROUTES`; `php::NO_REQUEST` outside one, and without `--php`).
    pub route: u64,
}

/// Value of `KERNEL_LOCKS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLockCounts {
    pub contentions: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
}

/// Value of the per-thread `KERNEL_LOCK_BEGINS`: a contention in progress.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelLockBegin {
    pub key: KernelLockKey,
    pub start_ns: u64,
}

/// Map sizes of the hold state.
pub const MAX_HELD: u32 = 65_536;
pub const MAX_HOLDERS: u32 = 65_536;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are repr(C) plain integers without padding.
    unsafe impl aya::Pod for super::LockCounts {}
    unsafe impl aya::Pod for super::Unmapped {}
    unsafe impl aya::Pod for super::FutexCounts {}
    unsafe impl aya::Pod for super::FutexWait {}
    unsafe impl aya::Pod for super::CondWait {}
    unsafe impl aya::Pod for super::CallerKey {}
    unsafe impl aya::Pod for super::StackKey {}
    unsafe impl aya::Pod for super::HeldKey {}
    unsafe impl aya::Pod for super::Held {}
    unsafe impl aya::Pod for super::Holder {}
    unsafe impl aya::Pod for super::HoldCounts {}
    unsafe impl aya::Pod for super::HolderKey {}
    unsafe impl aya::Pod for super::HolderHolds {}
    unsafe impl aya::Pod for super::WaitHolderKey {}
    unsafe impl aya::Pod for super::WaitTime {}
    unsafe impl aya::Pod for super::CodeRange {}
    unsafe impl aya::Pod for super::CpuSamples {}
    unsafe impl aya::Pod for super::HandoffCounts {}
    unsafe impl aya::Pod for super::CpuPlace {}
    unsafe impl aya::Pod for super::KernelLockKey {}
    unsafe impl aya::Pod for super::KernelLockCounts {}
    unsafe impl aya::Pod for super::php::PhpOffsets {}
    unsafe impl aya::Pod for super::php::RouteText {}
    unsafe impl aya::Pod for super::php::RouteLockKey {}
    unsafe impl aya::Pod for super::php::RouteLockCounts {}
}

/// `--php`: PHP's state read from outside, on thread-safe (ZTS) PHP.
///
/// Each PHP thread's globals live in one block (TSRM's `tsrm_tls_entry`,
/// what the thread's `_tsrm_ls_cache` points to), the executor's at
/// `executor_globals_offset` and the SAPI's at `sapi_globals_offset`.
/// Userspace walks PHP's table of those blocks and loads `PHP_THREADS`
/// (thread pointer → block); the BPF side finds the current thread's block
/// through its thread pointer (`task_struct.thread.fsbase`).
///
/// Routes: at each request start (the request probe) the BPF side reads
/// `SG(request_info)`'s method and URI (the script path when there is no
/// URI), keys them by a hash ([`route_hash`]) and labels the thread with
/// it; lock calls and waits then count per (route, lock) until the
/// thread's next request.
pub mod php {
    /// PHP frames read per snapshot, innermost first.
    pub const MAX_FRAMES: usize = 16;
    /// Bytes kept of a function's and a class's name.
    pub const NAME_BYTES: usize = 48;
    /// Bytes kept of a file's path: its end (the file name and the folders
    /// nearest it).
    pub const FILE_BYTES: usize = 96;
    /// Bytes kept of a request's method and of its path.
    pub const METHOD_BYTES: usize = 16;
    pub const PATH_BYTES: usize = 112;
    /// PHP threads and routes the maps hold.
    pub const MAX_THREADS: u32 = 4096;
    pub const MAX_ROUTES: u32 = 4096;
    /// Keys of the maps per route: every route, and the three below.
    pub const MAX_ROUTE_KEYS: u32 = MAX_ROUTES + 3;
    pub const MAX_ROUTE_LOCKS: u32 = 65_536;

    /// The route of events outside any request (threads that never started
    /// one: Go's, Apache's listener, …).
    pub const NO_REQUEST: u64 = 0;
    /// The route of requests whose method and URI could not be read.
    pub const UNREADABLE_ROUTE: u64 = 1;
    /// The route of requests whose route was new when `MAX_ROUTES` routes
    /// were already known: counted together, never as unreadable.
    pub const PAST_CAP_ROUTE: u64 = 2;

    /// Indexes of `PHP_MISSES`: why a PHP context was not read.
    pub mod miss {
        /// The thread is not in PHP's thread table as last loaded (a
        /// thread of the server's own, or a PHP thread started since).
        pub const THREAD_UNKNOWN: u32 = 0;
        /// No PHP code was running on the thread (between requests, or
        /// inside the engine before the script).
        pub const NO_PHP_CODE: u32 = 1;
        /// A read of the target's memory failed.
        pub const READ_FAILED: u32 = 2;
        /// The kernel's thread pointer could not be read.
        pub const NO_THREAD_POINTER: u32 = 3;
        pub const COUNT: u32 = 4;
        pub const NAMES: [&str; COUNT as usize] = [
            "not_php_thread",
            "no_php_code",
            "read_failed",
            "no_thread_pointer",
        ];
    }

    /// Offsets the BPF side reads PHP's structures with (bytes; from the
    /// module's DWARF or a table per PHP version), and the kernel's
    /// `task_struct.thread.fsbase`. Userspace fills `PHP_OFFSETS[0]` at
    /// attach; `enabled` 0 leaves every PHP read out.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct PhpOffsets {
        pub enabled: u64,
        pub task_fsbase: u64,
        /// The values of `executor_globals_offset` and `sapi_globals_offset`.
        pub executor_globals: u64,
        pub sapi_globals: u64,
        /// `zend_executor_globals.current_execute_data`.
        pub current_execute_data: u64,
        /// `zend_execute_data`'s `opline`, `func` and `prev_execute_data`.
        pub execute_data_opline: u64,
        pub execute_data_func: u64,
        pub execute_data_prev: u64,
        /// `zend_function`'s `type`, `common.function_name`, `common.scope`
        /// and `op_array.filename`.
        pub function_type: u64,
        pub function_name: u64,
        pub function_scope: u64,
        pub op_array_filename: u64,
        /// `zend_op.lineno`, `zend_class_entry.name`, `zend_string`'s `len`
        /// and `val`.
        pub op_lineno: u64,
        pub class_name: u64,
        pub string_len: u64,
        pub string_val: u64,
        /// `sapi_globals_struct.request_info`'s `request_method`,
        /// `request_uri` and `path_translated`.
        pub request_method: u64,
        pub request_uri: u64,
        pub path_translated: u64,
        /// 1 when `tls_offset` is known: a thread's block is the pointer at
        /// its thread pointer plus `tls_offset` (PHP's `_tsrm_ls_cache`),
        /// found by userspace; else `PHP_THREADS` alone.
        pub tls_known: u64,
        /// A signed offset, as two's complement.
        pub tls_offset: u64,
        /// 1 when the pointer at `tls_offset` is an array (musl's
        /// pthread-specific values, where a stripped static build keeps
        /// PHP's `tls_key`): the block is the pointer `tls_index_offset`
        /// bytes into it.
        pub tls_indirect: u64,
        pub tls_index_offset: u64,
    }

    /// `zend_function.type` of a function written in PHP.
    pub const USER_FUNCTION: u8 = 2;

    /// One PHP frame: function (empty for a file's top level), class (empty
    /// for a plain function), the end of the file's path, and the line
    /// running in it (0 for a function written in C).
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct PhpFrame {
        pub line: u32,
        /// `zend_function.type`: [`USER_FUNCTION`], or 1 for one in C.
        pub kind: u32,
        pub function: [u8; NAME_BYTES],
        pub class: [u8; NAME_BYTES],
        pub file: [u8; FILE_BYTES],
    }

    /// The PHP stack read at a snapshot: `depth` frames, innermost first;
    /// `miss` is a [`miss`] reason plus one when none could be read (0: read).
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct PhpStack {
        pub depth: u32,
        pub miss: u32,
        /// The thread's route at the snapshot.
        pub route: u64,
        pub frames: [PhpFrame; MAX_FRAMES],
    }

    /// A route as read: method and path (up to the query string), each
    /// NUL-padded.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct RouteText {
        pub method: [u8; METHOD_BYTES],
        pub path: [u8; PATH_BYTES],
    }

    /// Key of `ROUTE_LOCKS`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct RouteLockKey {
        pub route: u64,
        pub lock: u64,
    }

    /// Per (route, lock): acquisitions, contended waits and their time,
    /// and the CPU sampler's samples in the lock's code.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct RouteLockCounts {
        pub calls: u64,
        pub waits: u64,
        pub wait_ns: u64,
        pub cpu_samples: u64,
    }

    /// FNV-1a of a route's bytes, never [`NO_REQUEST`],
    /// [`UNREADABLE_ROUTE`] or [`PAST_CAP_ROUTE`]. The same function on
    /// both sides, so tests can compute a route's key.
    #[inline(always)]
    pub fn route_hash(text: &RouteText) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut index = 0;
        while index < METHOD_BYTES {
            hash = (hash ^ u64::from(text.method[index])).wrapping_mul(0x100_0000_01b3);
            index += 1;
        }
        index = 0;
        while index < PATH_BYTES {
            hash = (hash ^ u64::from(text.path[index])).wrapping_mul(0x100_0000_01b3);
            index += 1;
        }
        if hash <= PAST_CAP_ROUTE {
            hash + 3
        } else {
            hash
        }
    }
}
