//! The CPU side of the report: the sampler's lock-code samples joined to the
//! lock rows (a lock that burns CPU but never waits still gets a row), and
//! the `cpu` block (the target's CPU time, lock code, the tracer's share).
use std::collections::{BTreeMap, BTreeSet};

use tracer_common::{CpuSamples, cpu_sample};

use crate::model::{
    Collected, CpuReport, Lock, LockKind, WaitClass,
    address::{LOWEST_LOCK_ADDRESS, row_holding},
    cpu_error_ns, sample_period_ns,
};

/// Adds every lock-code sample to the row of the lock it worked on: the row
/// at that address or whose bytes hold it, else a new row. Returns the rows
/// that got user-mode samples (lock functions work on them: they are locks)
/// and the samples no row could take.
pub(crate) fn attribute(
    locks: &mut BTreeMap<u64, Lock>,
    collected: &Collected,
) -> (BTreeSet<u64>, u64) {
    let mut in_lock_functions = BTreeSet::new();
    let mut unattributed = 0;
    if collected.cpu_hz == 0 {
        return (in_lock_functions, unattributed);
    }
    let mut samples: BTreeMap<u64, CpuSamples> = BTreeMap::new();
    // User samples first: they carry the lock's base address, the kernel's
    // the futex word inside it, which then folds into that row.
    let mut ordered: Vec<(&u64, &CpuSamples)> = collected.cpu_locks.iter().collect();
    ordered.sort_by_key(|(address, counts)| (counts.user == 0, **address));
    for (&address, counts) in ordered {
        if address < LOWEST_LOCK_ADDRESS {
            unattributed += counts.user + counts.kernel;
            continue;
        }
        let row = row_holding(locks, address, |lock| lock.kind.span()).unwrap_or(address);
        let lock = locks
            .entry(row)
            .or_insert_with(|| Lock::empty(address, LockKind::Futex, WaitClass::Other));
        let total = samples.entry(lock.address).or_default();
        total.user += counts.user;
        total.kernel += counts.kernel;
        if counts.user > 0 {
            in_lock_functions.insert(lock.address);
        }
    }
    let period = sample_period_ns(collected.cpu_hz);
    for lock in locks.values_mut() {
        let counts = samples.get(&lock.address).copied().unwrap_or_default();
        let n = counts.user + counts.kernel;
        lock.cpu_ns = Some(n * period);
        lock.cpu_error_ns = Some(cpu_error_ns(n, period));
        lock.cpu_kernel_ns = Some(counts.kernel * period);
    }
    (in_lock_functions, unattributed)
}

/// Rows that lock functions worked on are locks, whatever their futex words say.
pub(crate) fn mark_locks(locks: &mut BTreeMap<u64, Lock>, in_lock_functions: &BTreeSet<u64>) {
    for address in in_lock_functions {
        if let Some(lock) = locks.get_mut(address)
            && lock.wait_class == WaitClass::Other
        {
            lock.wait_class = WaitClass::Lock;
        }
    }
}

/// The `cpu` block. `target_ns`: the target's CPU time over the window;
/// `tracer_ns`: what the probes added to it (the overhead estimate).
pub(crate) fn report(
    collected: &Collected,
    locks: &[Lock],
    target_ns: Option<u64>,
    tracer_ns: u64,
    unattributed: u64,
) -> CpuReport {
    let hz = collected.cpu_hz;
    let count = |class: u32| collected.cpu_counts[class as usize];
    let mut block = CpuReport {
        target_ns,
        samples: count(cpu_sample::TARGET),
        sample_hz: hz,
        tracer_ns,
        tracer_samples: count(cpu_sample::TRACER),
        futex_not_lock_samples: count(cpu_sample::FUTEX_NOT_LOCK),
        unattributed_samples: unattributed,
        interrupted_samples: count(cpu_sample::INTERRUPTED),
        ..CpuReport::default()
    };
    if hz > 0 {
        let period = sample_period_ns(hz);
        // Lock rows only: CPU in futex calls on words of other classes is not a lock's.
        let on_locks: u64 = locks
            .iter()
            .filter(|lock| lock.is_contention())
            .filter_map(|lock| lock.cpu_ns)
            .sum::<u64>()
            / period;
        let lock_samples = on_locks + unattributed;
        block.lock_code_ns = Some(lock_samples * period);
        block.lock_code_error_ns = Some(cpu_error_ns(lock_samples, period));
    }
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collected(hz: u64, samples: &[(u64, u64, u64)]) -> Collected {
        let mut collected = Collected {
            cpu_hz: hz,
            ..Collected::default()
        };
        for &(address, user, kernel) in samples {
            collected
                .cpu_locks
                .insert(address, CpuSamples { user, kernel });
        }
        collected
    }

    #[test]
    fn samples_fold_into_the_lock_holding_them() {
        let mut locks = BTreeMap::new();
        locks.insert(
            0x1000_0000,
            Lock::empty(0x1000_0000, LockKind::Mutex, WaitClass::Lock),
        );
        // The mutex itself, its futex word 4 bytes in (musl), a lock nobody
        // waited on, and a null argument.
        let collected = collected(
            1000,
            &[
                (0x1000_0000, 30, 0),
                (0x1000_0004, 0, 12),
                (0x2000_0000, 5, 0),
                (0, 2, 0),
            ],
        );
        let (in_functions, unattributed) = attribute(&mut locks, &collected);
        assert_eq!(unattributed, 2);
        assert_eq!(locks.len(), 2);
        assert_eq!(locks[&0x1000_0000].cpu_ns, Some(42_000_000));
        assert_eq!(locks[&0x2000_0000].cpu_ns, Some(5_000_000));
        mark_locks(&mut locks, &in_functions);
        assert_eq!(locks[&0x2000_0000].wait_class, WaitClass::Lock);
        // 42 samples of 1 ms: ±(2×sqrt(42) + 1) ms.
        assert_eq!(locks[&0x1000_0000].cpu_error_ns, Some(13_961_481));
        let rows: Vec<Lock> = locks.into_values().collect();
        let block = report(&collected, &rows, Some(9_000_000_000), 1_000, unattributed);
        assert_eq!(block.lock_code_ns, Some(49_000_000));
        assert_eq!(block.lock_code_error_ns, Some(15_000_000));
        assert_eq!(block.sample_hz, 1000);
    }

    #[test]
    fn without_sampling_nothing_is_attributed() {
        let mut locks = BTreeMap::new();
        locks.insert(
            0x5000,
            Lock::empty(0x5000, LockKind::Mutex, WaitClass::Lock),
        );
        let collected = collected(0, &[(0x5000, 10, 10)]);
        attribute(&mut locks, &collected);
        assert_eq!(locks[&0x5000].cpu_ns, None);
        let rows: Vec<Lock> = locks.into_values().collect();
        let block = report(&collected, &rows, Some(1), 0, 0);
        assert_eq!(block.lock_code_ns, None);
    }
}
