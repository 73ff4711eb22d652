//! The lock functions locktrace probes, by the index both sides count them under.

/// The lock functions we probe. The discriminant indexes [`LockCounts::calls`](crate::LockCounts::calls).
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
    /// counted in [`LockCounts::calls`](crate::LockCounts::calls).
    MutexUnlock = 14,
    RwlockUnlock = 15,
    SpinUnlock = 16,
}

/// Number of [`LockOp`](crate::LockOp) variants that take a lock (the unlocks follow them).
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
