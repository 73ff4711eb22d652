//! What removing a lock would save: its price in CPU, part by part.
//!
//! - lock code: the lock functions' own work. With call counts (all-locks
//!   and sampled mode), calls × the calibrated cost of an uncontended lock
//!   and unlock pair with its calls: exact counts, and the uprobes' traps
//!   (which land in that code) do not inflate it. Without (contention mode),
//!   the sampled user-mode CPU in the lock functions.
//! - handoffs: acquisitions on another CPU than the lock's previous one move
//!   its cache line: the row's `handoffs.cost_ns` (handoffs × the
//!   calibrated cost of one transfer, `analysis::handoffs`).
//! - kernel: the sampled CPU in the kernel's futex code on its words (the
//!   waits, the wakes, the switches inside them).
//! - kernel locks: the spin waits for kernel locks (spinlocks, rwlocks)
//!   inside its futex calls, timed by the lock tracepoints: a spinning
//!   waiter burns its CPU, a sleeping one (rwsem, mutex) does not, so only
//!   spins count. The sampled kernel part holds the same spins: it is
//!   priced less them (never below 0), so nothing counts twice.
//! - scheduling: the scheduler's work its waits cause outside its futex
//!   calls (the woken thread's reschedule interrupt, the preempted
//!   thread's switch back): the samples on interrupts from user code × the
//!   lock's share of the target's futex waits.
//!
//! The saving assumes the critical section's own work stays and nothing
//! synchronizes it in the lock's place.
use crate::model::{PriceBasis, PricePart, Removal, Report, Requests};

/// Calibrated costs the parts are priced with, in ns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct UnitCosts {
    /// One uncontended lock + unlock pair, the calls included.
    pub lock_pair_ns: f64,
}

/// A calibrated figure is trusted to within this share of itself: the
/// spread of the calibration runs and of the machine's state between runs.
const CALIBRATED_ERROR: f64 = 0.25;

/// Fills `removal` for every lock with at least one priced part.
pub(crate) fn apply(report: &mut Report, costs: UnitCosts) {
    let divisor = report.requests.as_ref().and_then(Requests::divisor);
    let target_ns = report.cpu.as_ref().and_then(|cpu| cpu.target_ns);
    let sampled = report.cpu.as_ref().is_some_and(|cpu| cpu.sample_hz > 0);
    let interrupted = report.cpu.as_ref().map_or(0, |cpu| cpu.interrupted_samples);
    let all_waits: u64 = report.totals.by_wait_class.values().map(|c| c.waits).sum();
    let spins = kernel_lock_spins(report);
    // Only locks: a condvar's or the Go runtime's futex words wait for work.
    for lock in report.locks.iter_mut().filter(|lock| lock.is_contention()) {
        let inputs = LockInputs {
            acquisitions: lock.acquisitions,
            handoffs_ns: lock.handoffs.as_ref().map(|handoffs| handoffs.cost_ns),
            cpu_ns: lock.cpu_ns.filter(|_| sampled),
            cpu_kernel_ns: lock.cpu_kernel_ns.filter(|_| sampled),
            kernel_lock_spin_ns: spins.get(&lock.address).copied(),
            interrupted_samples: (sampled && all_waits > 0)
                .then(|| interrupted as f64 * lock.contended as f64 / all_waits as f64),
            period_ns: report
                .cpu
                .as_ref()
                .map_or(0, |cpu| crate::model::sample_period_ns(cpu.sample_hz)),
        };
        lock.removal = price(&inputs, costs).map(|mut removal| {
            removal.saving_ns_per_request = divisor.map(|n| removal.saving_ns / n);
            removal.error_ns_per_request = divisor.map(|n| removal.error_ns / n);
            removal.share_of_target_cpu = target_ns
                .filter(|&ns| ns > 0)
                .map(|ns| removal.saving_ns / ns as f64);
            removal
        });
    }
}

/// Per user lock row: the spin waits for kernel locks its futex calls met.
fn kernel_lock_spins(report: &Report) -> std::collections::HashMap<u64, u64> {
    let mut spins = std::collections::HashMap::new();
    let rows = report
        .kernel_locks
        .iter()
        .flat_map(|section| &section.locks);
    for lock in rows.filter(|lock| lock.kind.spins()) {
        for user in &lock.user_locks {
            let total: &mut u64 = spins.entry(user.address).or_default();
            *total = total.saturating_add(user.wait_ns);
        }
    }
    spins
}

/// What one lock's price is made of.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LockInputs {
    pub acquisitions: Option<u64>,
    /// What its handoffs cost (`handoffs.cost_ns`), where counted.
    pub handoffs_ns: Option<u64>,
    /// Sampled CPU on the lock (user and kernel), and its kernel part.
    pub cpu_ns: Option<u64>,
    pub cpu_kernel_ns: Option<u64>,
    /// Spin waits for kernel locks in its futex calls, where traced.
    pub kernel_lock_spin_ns: Option<u64>,
    /// The lock's share of the samples on interrupts from user code.
    pub interrupted_samples: Option<f64>,
    pub period_ns: u64,
}

/// The lock's price, part by part; none when no part could be priced.
pub(crate) fn price(inputs: &LockInputs, costs: UnitCosts) -> Option<Removal> {
    let mut unpriced = Vec::new();
    let sampled_part = |ns: u64| PricePart {
        ns: ns as f64,
        error_ns: crate::model::cpu_error_ns(ns / inputs.period_ns.max(1), inputs.period_ns) as f64,
        basis: PriceBasis::Sampled,
    };
    let calibrated_part = |count: u64, unit_ns: f64| PricePart {
        ns: count as f64 * unit_ns,
        error_ns: count as f64 * unit_ns * CALIBRATED_ERROR,
        basis: PriceBasis::Calibrated,
    };
    let user_sampled = inputs
        .cpu_ns
        .map(|all| all.saturating_sub(inputs.cpu_kernel_ns.unwrap_or(0)));
    let lock_code = match (inputs.acquisitions, user_sampled) {
        (Some(calls), _) => Some(calibrated_part(calls, costs.lock_pair_ns)),
        (None, Some(user)) => Some(sampled_part(user)),
        (None, None) => {
            unpriced.push("lock code: no call counts (contention mode) and CPU not sampled".into());
            None
        }
    };
    let handoffs = match (inputs.handoffs_ns, inputs.acquisitions) {
        (Some(ns), _) => Some(calibrated_part(1, ns as f64)),
        // Contention mode's sampled lock code holds the transfers' stalls.
        (None, None) => None,
        (None, Some(_)) => {
            unpriced.push("handoffs: not counted (record --handoffs)".into());
            None
        }
    };
    let spin_ns = inputs.kernel_lock_spin_ns.filter(|&ns| ns > 0);
    let kernel_locks = spin_ns.map(|ns| PricePart {
        ns: ns as f64,
        error_ns: 0.0,
        basis: PriceBasis::Traced,
    });
    let kernel = match inputs.cpu_kernel_ns {
        Some(ns) => Some(PricePart {
            ns: ns.saturating_sub(spin_ns.unwrap_or(0)) as f64,
            ..sampled_part(ns)
        }),
        None => {
            unpriced.push("kernel: CPU not sampled (--no-cpu)".into());
            None
        }
    };
    let scheduling = inputs
        .interrupted_samples
        .filter(|&samples| samples > 0.0)
        .map(|samples| PricePart {
            ns: samples * inputs.period_ns as f64,
            error_ns: (2.0 * samples.sqrt() + 1.0) * inputs.period_ns as f64,
            basis: PriceBasis::Sampled,
        });
    let parts = [lock_code, handoffs, kernel, kernel_locks, scheduling];
    if parts.iter().all(Option::is_none) {
        return None;
    }
    let known = parts.iter().flatten();
    Some(Removal {
        saving_ns: known.clone().map(|part| part.ns).sum(),
        error_ns: known.map(|part| part.error_ns).sum(),
        saving_ns_per_request: None,
        error_ns_per_request: None,
        share_of_target_cpu: None,
        lock_code,
        handoffs,
        kernel,
        kernel_locks,
        scheduling,
        unpriced,
    })
}

/// The price of two locks removed together (a group of rows): the sums.
pub(crate) fn merge(a: Removal, b: Removal) -> Removal {
    let add = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => Some(x + y),
        (x, y) => x.or(y),
    };
    let add_part = |x: Option<PricePart>, y: Option<PricePart>| match (x, y) {
        (Some(x), Some(y)) => Some(PricePart {
            ns: x.ns + y.ns,
            error_ns: x.error_ns + y.error_ns,
            basis: x.basis,
        }),
        (x, y) => x.or(y),
    };
    let mut unpriced = a.unpriced;
    for reason in b.unpriced {
        if !unpriced.contains(&reason) {
            unpriced.push(reason);
        }
    }
    Removal {
        saving_ns: a.saving_ns + b.saving_ns,
        error_ns: a.error_ns + b.error_ns,
        saving_ns_per_request: add(a.saving_ns_per_request, b.saving_ns_per_request),
        error_ns_per_request: add(a.error_ns_per_request, b.error_ns_per_request),
        share_of_target_cpu: add(a.share_of_target_cpu, b.share_of_target_cpu),
        lock_code: add_part(a.lock_code, b.lock_code),
        handoffs: add_part(a.handoffs, b.handoffs),
        kernel: add_part(a.kernel, b.kernel),
        kernel_locks: add_part(a.kernel_locks, b.kernel_locks),
        scheduling: add_part(a.scheduling, b.scheduling),
        unpriced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COSTS: UnitCosts = UnitCosts { lock_pair_ns: 6.0 };

    #[test]
    fn counted_locks_are_priced_by_calls_handoffs_and_sampled_kernel_time() {
        let inputs = LockInputs {
            acquisitions: Some(1000),
            // 100 handoffs at 30 ns.
            handoffs_ns: Some(3000),
            cpu_ns: Some(50_000_000),
            cpu_kernel_ns: Some(40_000_000),
            kernel_lock_spin_ns: None,
            interrupted_samples: None,
            period_ns: 10_000_000,
        };
        let removal = price(&inputs, COSTS).unwrap();
        let lock_code = removal.lock_code.unwrap();
        assert_eq!(lock_code.basis, PriceBasis::Calibrated);
        assert_eq!(lock_code.ns, 6000.0);
        assert_eq!(lock_code.error_ns, 1500.0);
        assert_eq!(removal.handoffs.unwrap().ns, 3000.0);
        let kernel = removal.kernel.unwrap();
        assert_eq!(kernel.basis, PriceBasis::Sampled);
        assert_eq!(kernel.ns, 40_000_000.0);
        // 4 samples: (2·√4 + 1) periods.
        assert_eq!(kernel.error_ns, 50_000_000.0);
        assert_eq!(removal.saving_ns, 40_009_000.0);
        assert_eq!(removal.error_ns, 1500.0 + 750.0 + 50_000_000.0);
        assert!(removal.unpriced.is_empty());
    }

    #[test]
    fn contention_mode_prices_the_sampled_lock_code() {
        let inputs = LockInputs {
            acquisitions: None,
            handoffs_ns: None,
            cpu_ns: Some(30_000_000),
            cpu_kernel_ns: Some(10_000_000),
            kernel_lock_spin_ns: None,
            interrupted_samples: Some(4.0),
            period_ns: 10_000_000,
        };
        let removal = price(&inputs, COSTS).unwrap();
        let lock_code = removal.lock_code.unwrap();
        assert_eq!(lock_code.basis, PriceBasis::Sampled);
        assert_eq!(lock_code.ns, 20_000_000.0);
        assert_eq!(removal.handoffs, None);
        // The lock's share of the interrupt samples: 4 samples.
        let scheduling = removal.scheduling.unwrap();
        assert_eq!(scheduling.ns, 40_000_000.0);
        assert_eq!(scheduling.error_ns, 50_000_000.0);
        assert_eq!(removal.saving_ns, 70_000_000.0);
        assert!(removal.unpriced.is_empty(), "{:?}", removal.unpriced);
    }

    #[test]
    fn what_could_not_be_priced_is_said() {
        let inputs = LockInputs {
            acquisitions: Some(10),
            ..LockInputs::default()
        };
        let removal = price(&inputs, COSTS).unwrap();
        assert_eq!(removal.saving_ns, 60.0);
        assert_eq!(
            removal.unpriced,
            [
                "handoffs: not counted (record --handoffs)",
                "kernel: CPU not sampled (--no-cpu)"
            ]
        );
        assert_eq!(price(&LockInputs::default(), COSTS), None);
    }

    /// The spins for kernel locks in the lock's futex calls are a part of
    /// their own, taken out of the sampled kernel part (which holds them);
    /// without CPU samples they are still priced.
    #[test]
    fn kernel_lock_spins_are_a_part_of_their_own() {
        let inputs = LockInputs {
            acquisitions: Some(1000),
            handoffs_ns: Some(3000),
            cpu_ns: Some(50_000_000),
            cpu_kernel_ns: Some(40_000_000),
            kernel_lock_spin_ns: Some(10_000_000),
            interrupted_samples: None,
            period_ns: 10_000_000,
        };
        let removal = price(&inputs, COSTS).unwrap();
        let spins = removal.kernel_locks.unwrap();
        assert_eq!(
            (spins.ns, spins.error_ns, spins.basis),
            (10_000_000.0, 0.0, PriceBasis::Traced)
        );
        assert_eq!(removal.kernel.unwrap().ns, 30_000_000.0);
        // The same saving as without the section: the spins counted once.
        assert_eq!(removal.saving_ns, 40_009_000.0);
        let unsampled = LockInputs {
            cpu_ns: None,
            cpu_kernel_ns: None,
            ..inputs
        };
        let removal = price(&unsampled, COSTS).unwrap();
        assert_eq!(removal.kernel, None);
        assert_eq!(removal.kernel_locks.unwrap().ns, 10_000_000.0);
        assert_eq!(removal.saving_ns, 6000.0 + 3000.0 + 10_000_000.0);
    }

    /// On a report: a row's part is the spinlock and rwlock waits the
    /// kernel rows list under it; a rwsem's (sleeping) wait is left out,
    /// and so are other rows' waits.
    #[test]
    fn a_rows_kernel_lock_part_is_the_spin_waits_listed_under_it() {
        use crate::model::{
            KernelLock, KernelLockKind, KernelLocks, KernelUserLock, Lock, LockKind, WaitClass,
        };
        let mut report = Report::empty_for_tests("all");
        let mut lock = Lock::empty(0x1000, LockKind::Mutex, WaitClass::Lock);
        lock.acquisitions = Some(10);
        report.locks.push(lock);
        let under = |address, wait_ns| KernelUserLock {
            address,
            name: None,
            contentions: 1,
            wait_ns,
        };
        let row = |flags, user_locks| KernelLock {
            kind: KernelLockKind::of_flags(flags),
            flags,
            user_locks,
            ..KernelLock::default()
        };
        report.kernel_locks = Some(KernelLocks {
            locks: vec![
                row(1, vec![under(0x1000, 7_000), under(0x2000, 900)]),
                row(1, vec![under(0x1000, 500)]),
                row(1 | 4, vec![under(0x1000, 30)]),
                row(2, vec![under(0x1000, 5_000)]),
            ],
            ..KernelLocks::default()
        });
        apply(&mut report, COSTS);
        let removal = report.locks[0].removal.as_ref().unwrap();
        assert_eq!(removal.kernel_locks.unwrap().ns, 7_530.0);
        assert_eq!(removal.saving_ns, 60.0 + 7_530.0);
    }
}
