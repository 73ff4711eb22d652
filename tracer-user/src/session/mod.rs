//! One tracing session, for `record` and the live views (`top`, `serve`):
//! the probes a [`Plan`] asks for are worked out once ([`load_plan`]; with
//! [`bench_load_plan`] the only places an [`attach::LoadPlan`] is built), attached ([`Session::attach`]),
//! read as often as the caller likes ([`Session::read`]), and finished
//! ([`Session::finish`]: the last read, with what could not be counted, and
//! the probes handed back to be detached once the report is out).
//!
//! What stays with the commands: `record`'s request window, sampler and
//! report; the live views' deltas, expiry and naming cache.
mod prepare;

use anyhow::Result;
use aya::Ebpf;
use tracer_common::{CodeRange, flags};

pub(crate) use prepare::php_runtime;
pub use prepare::{Prepared, prepare};

use crate::{
    model::{
        Collected, InFlight, Lifetimes, Mode, StopReason,
        diagnostics::note,
        plan::{Feature, Plan, View},
    },
    naming::php::PhpRuntime,
    probe::{target::Target, waitfuncs::WaitFunctions},
    trace::{
        attach::{self, Loaded, Placed, RequestProbePoint},
        collect,
        cpu::CpuSampling,
        inflight::{self, WaitsBeforeAttach},
        inproc, kernel_locks, lifetimes,
        maps::MapReads,
        php::{self, PhpThreads},
    },
};

/// Set (to anything): no lock init calls probed without `--stacks`, as
/// before creation sites were recorded by default. For `cargo xtask bench`,
/// which prices the init probes against it.
pub const WITHOUT_INIT_PROBES_FOR_A_BENCH: &str = "LOCKTRACE_BENCH_NO_INIT_PROBES";

/// True in the modes that count every acquisition: they snapshot every
/// lock init call and name heap locks by where they were created. Sampled
/// windows would miss most init calls.
pub(crate) fn creation_sites(mode: Mode) -> bool {
    mode.counts_every_acquisition() && std::env::var_os(WITHOUT_INIT_PROBES_FOR_A_BENCH).is_none()
}

/// Whether lock probes go in at attach: in all-locks mode, and in inproc
/// mode for the functions no stub counts (sampled mode's windows attach
/// their own; contention mode has none).
pub(crate) fn lock_probes(mode: Mode, placed: &[Placed]) -> bool {
    mode == Mode::All || (mode == Mode::Inproc && !placed.is_empty())
}

/// What the BPF programs record besides the counts, from the plan's features.
pub(crate) fn bpf_flags(plan: &Plan) -> u32 {
    let mut bits = 0;
    if plan.has(Feature::Stacks) {
        bits |= flags::STACKS;
    }
    if plan.mode == Mode::Sampled {
        bits |= flags::SAMPLED;
    }
    if plan.has(Feature::HoldTimes) {
        bits |= flags::HOLDS;
    }
    if plan.has(Feature::Handoffs) {
        bits |= flags::HANDOFFS;
    }
    if plan.has(Feature::Php) {
        bits |= flags::PHP;
    }
    bits
}

/// Where the probes go: the target and the probe points worked out for it.
#[derive(Clone, Copy)]
pub(crate) struct Probed<'a> {
    pub target: &'a Target,
    pub placed: &'a [Placed],
    pub waits: &'a WaitFunctions,
    /// `--hold-times`: the unlock functions' probe points (else empty).
    pub unlocks: &'a [Placed],
    /// Where the lock code is, for the CPU sampler.
    pub lock_code: &'a [CodeRange],
}

impl Prepared {
    pub(crate) fn probed(&self) -> Probed<'_> {
        Probed {
            target: &self.target,
            placed: &self.placed,
            waits: &self.waits,
            unlocks: &self.unlocks,
            lock_code: &self.lock_code,
        }
    }
}

/// When a load plan is used.
pub(crate) enum Stage<'a> {
    /// The first load, with the CPU sampler (None: `--no-cpu`) and, in the
    /// live views, the inproc stubs, which start counting with the probes
    /// (`record` opens their gate with its window instead).
    Load {
        cpu: Option<&'a CpuSampling>,
        inproc: Option<&'a inproc::session::Session>,
    },
    /// Again on a live thread when the main thread leaves (see
    /// `trace::follow`): the user probes only.
    Follow,
}

/// What to load and attach for `plan` on `probed` (the only place a
/// [`attach::LoadPlan`] is built). The request probe is attached at load
/// in every mode but sampled, whose sampler attaches it once it has armed
/// its first window; kernel locks in every view; creation sites are `record`'s.
pub(crate) fn load_plan<'a>(
    plan: &Plan,
    probed: Probed<'a>,
    request_probe: Option<RequestProbePoint>,
    stage: Stage<'a>,
) -> attach::LoadPlan<'a> {
    let (cpu, inproc, request_probe) = match stage {
        Stage::Load { cpu, inproc } => (
            cpu,
            inproc.filter(|_| plan.view == View::Live),
            request_probe.filter(|_| plan.mode != Mode::Sampled),
        ),
        Stage::Follow => (None, None, request_probe),
    };
    attach::LoadPlan {
        target: probed.target,
        functions: probed.placed,
        flags: bpf_flags(plan),
        lock_probes: lock_probes(plan.mode, probed.placed),
        request_probe,
        waits: probed.waits,
        unlock_functions: probed.unlocks,
        cpu,
        inproc,
        kernel_locks: plan.has(Feature::KernelLocks),
        creation_sites: plan.view == View::Record && creation_sites(plan.mode),
        inproc_samples: plan.mode == Mode::Inproc && plan.has(Feature::Stacks),
    }
}

/// Which probes a bench's not-counting plan attaches at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchProbes {
    /// The lock probes, in place but told not to count: the floor of a
    /// uprobe hit (`cargo xtask bench`'s kernel floor).
    LocksNotCounting,
    /// No lock probe yet, as sampled mode loads before its first window
    /// (the window bench opens and closes its own).
    BeforeTheFirstWindow,
}

static NO_WAIT_FUNCTIONS: WaitFunctions = WaitFunctions {
    cond_waits: Vec::new(),
    lock_inits: Vec::new(),
    go_futex: None,
};

/// The plan `cargo xtask bench` loads to price a mechanism alone: lock
/// calls are not counted (sampled mode's flag), nothing else is recorded,
/// and no kernel-lock tracepoint goes in.
pub fn bench_load_plan(prepared: &Prepared, probes: BenchProbes) -> attach::LoadPlan<'_> {
    attach::LoadPlan {
        target: &prepared.target,
        functions: &prepared.placed,
        flags: flags::SAMPLED,
        lock_probes: probes == BenchProbes::LocksNotCounting,
        request_probe: None,
        // The floor has no condvar probe; sampled mode has them from load.
        waits: match probes {
            BenchProbes::LocksNotCounting => &NO_WAIT_FUNCTIONS,
            BenchProbes::BeforeTheFirstWindow => &prepared.waits,
        },
        unlock_functions: &[],
        cpu: None,
        inproc: None,
        kernel_locks: false,
        creation_sites: false,
        inproc_samples: false,
    }
}

/// What a read takes from the kernel besides the counters: the waits in
/// progress and the address generations. The loaded object reads them from
/// its maps and /proc; unit tests give `FakeMaps`.
pub(crate) trait Reads: MapReads {
    fn in_flight(&self, pid: u32, before: &WaitsBeforeAttach) -> InFlight;
    fn lifetimes(&self) -> Result<Lifetimes>;
}

impl Reads for Ebpf {
    fn in_flight(&self, pid: u32, before: &WaitsBeforeAttach) -> InFlight {
        inflight::read(self, pid, before.attached_ns, before.blocked.clone())
    }

    fn lifetimes(&self) -> Result<Lifetimes> {
        lifetimes::read(self)
    }
}

/// How a session's maps are read into one snapshot of counts.
#[derive(Debug, Clone)]
pub(crate) struct Reader {
    pub pid: u32,
    /// When the probes went in, and the threads blocked in a futex then.
    pub waits_before: WaitsBeforeAttach,
    /// The CPU sampler's rate (0: off, asked or not).
    pub cpu_hz: u64,
}

impl Reader {
    /// Everything a report is built from: the maps, what `add` puts in
    /// (unwound stacks, the stubs' counts), the waits in progress (those
    /// older than the probes matched with `waits_before`), every key merged
    /// across the generations of its address, last; and the sampler's rate.
    pub(crate) fn read(
        &self,
        maps: &impl Reads,
        add: impl FnOnce(&mut Collected),
    ) -> Result<Collected> {
        let mut collected = collect::collect(maps)?;
        add(&mut collected);
        collected.in_flight = maps.in_flight(self.pid, &self.waits_before);
        // Last: every key above, unwound stacks and waits in progress
        // included, is merged across the generations of its address.
        collected.merge_lifetimes(maps.lifetimes()?);
        collected.cpu_hz = self.cpu_hz;
        Ok(collected)
    }
}

/// The CPU sampler's rate for the reads: the one asked for, 0 when off
/// (`--no-cpu`, or the kernel refused it).
pub(crate) fn cpu_hz(asked: Option<u64>, cpu_off: Option<&str>) -> u64 {
    match cpu_off {
        None => asked.unwrap_or(0),
        Some(_) => 0,
    }
}

/// What a session attaches.
pub(crate) struct Attach<'a> {
    pub plan: &'a Plan,
    pub probed: Probed<'a>,
    pub request_probe: Option<RequestProbePoint>,
    /// CPU samples per CPU second (None: `--no-cpu`).
    pub cpu_hz: Option<u64>,
    /// `--php`: PHP's engine, whose threads are loaded right after the
    /// probes (requests before count as unreadable).
    pub php: Option<&'a PhpRuntime>,
    /// `--mode inproc`: the stubs, switched in already.
    pub inproc: Option<inproc::session::Session>,
}

/// An attached session.
pub(crate) struct Session {
    pub plan: Plan,
    pub loaded: Loaded,
    pub reader: Reader,
    pub request_probe: Option<RequestProbePoint>,
    /// `--php`: PHP's threads (loaded again at each tick by the caller).
    pub php: Option<PhpThreads>,
    /// `--mode inproc`: the stubs' shared counts; dropping them switches
    /// the GOT entries back.
    pub inproc: Option<inproc::session::Session>,
    /// The kernel stacks the live view's reads looked up already.
    pub kernel_stacks: kernel_locks::StackCache,
}

/// A finished session: the last read, what could not be counted, and the
/// probes, still attached (see [`attach::Attached`]).
pub(crate) struct Finished {
    pub collected: Collected,
    pub stopped_by: StopReason,
    pub attach_ms: u64,
    /// Why the CPU sampler is off although asked for (no CPU per lock).
    pub cpu_off: Option<String>,
    /// `--mode inproc`: the stubs, to be read and switched back by the caller.
    pub inproc: Option<inproc::session::Session>,
    pub probes: attach::Attached,
}

impl Session {
    /// Loads the BPF object and attaches what runs for the whole session;
    /// says on stderr what is off although asked for.
    pub(crate) fn attach(ask: Attach) -> Result<Session> {
        let sampling = ask.cpu_hz.map(|hz| CpuSampling {
            hz,
            lock_code: ask.probed.lock_code.to_vec(),
        });
        let stage = Stage::Load {
            cpu: sampling.as_ref(),
            inproc: ask.inproc.as_ref(),
        };
        let plan = load_plan(ask.plan, ask.probed, ask.request_probe.clone(), stage);
        let mut loaded = attach::load(&plan)?;
        let pid = ask.probed.target.pid;
        // PHP's state first: requests before it count as unreadable.
        let php = ask
            .php
            .map(|php| PhpThreads::start(&mut loaded.ebpf, pid, php.offsets, php.threads))
            .transpose()?;
        if let Some(reason) = &loaded.cpu_off {
            note(format_args!(
                "locktrace: CPU sampler off, counting goes on without CPU per lock: {reason}"
            ));
        }
        if let Some(reason) = &loaded.kernel_locks_off {
            note(format_args!(
                "locktrace: kernel locks section unavailable: {reason}"
            ));
        }
        let reader = Reader {
            pid,
            waits_before: WaitsBeforeAttach::now(pid),
            cpu_hz: cpu_hz(ask.cpu_hz, loaded.cpu_off.as_deref()),
        };
        Ok(Session {
            plan: ask.plan.clone(),
            loaded,
            reader,
            request_probe: ask.request_probe,
            php,
            inproc: ask.inproc,
            kernel_stacks: kernel_locks::StackCache::default(),
        })
    }

    /// The plan to bind the user probes to a live thread with (see `trace::follow`).
    pub(crate) fn follow_plan<'a>(&self, probed: Probed<'a>) -> attach::LoadPlan<'a> {
        load_plan(
            &self.plan,
            probed,
            self.request_probe.clone(),
            Stage::Follow,
        )
    }

    /// A snapshot of the counts so far, the stubs' included, kernel locks
    /// in the live views, and what `add` puts in; counting goes on.
    pub(crate) fn read(&self, add: impl FnOnce(&mut Collected)) -> Result<Collected> {
        let kernel_locks = match self.plan.view {
            View::Live => Some(kernel_locks::read_cached(
                &self.loaded.ebpf,
                self.loaded.kernel_locks_off.clone(),
                &self.kernel_stacks,
            )?),
            View::Record => None,
        };
        self.reader.read(&self.loaded.ebpf, |collected| {
            if let Some(stubs) = &self.inproc {
                stubs.read().add_to(collected);
            }
            collected.kernel_locks = kernel_locks;
            add(collected);
        })
    }

    /// Once the target has exited: waits until its last threads are gone
    /// (with the kernel lock programs; see
    /// [`kernel_locks::wait_for_exited_threads`]), so that the contentions
    /// of their last steps are counted before [`Session::stop`].
    pub(crate) fn wait_for_exited_threads(&self) -> Result<()> {
        let left = kernel_locks::wait_for_exited_threads(&self.loaded.ebpf)?;
        if left > 0 {
            note(format_args!(
                "locktrace: {left} of the target's exited threads were not freed 0.5 s after its exit: kernel lock contentions in their last steps may not be counted"
            ));
        }
        Ok(())
    }

    /// Stops the BPF programs counting; returns once no increment is in
    /// flight, so the reads that follow cover one interval.
    pub(crate) fn stop(&mut self) -> Result<()> {
        collect::set_counting(&mut self.loaded.ebpf, 0)
    }

    /// The last read, after [`Session::stop`]: the maps with what `add`
    /// puts in, kernel locks and PHP's routes. The stubs' counts
    /// are the caller's to add as it switches them back (see [`Finished`]).
    pub(crate) fn finish(
        mut self,
        stopped_by: StopReason,
        add: impl FnOnce(&mut Collected),
    ) -> Result<Finished> {
        let ebpf = &self.loaded.ebpf;
        let kernel_locks = kernel_locks::read(ebpf, self.loaded.kernel_locks_off.clone())?;
        let mut collected = self.reader.read(ebpf, |collected| {
            add(collected);
            collected.kernel_locks = Some(kernel_locks);
        })?;
        if let Some(threads) = &self.php {
            collected.php = Some(php::read(ebpf, threads)?);
        }
        Ok(Finished {
            collected,
            stopped_by,
            attach_ms: self.loaded.attach_time.as_millis() as u64,
            cpu_off: self.loaded.cpu_off.take(),
            inproc: self.inproc.take(),
            probes: attach::Attached::new(self.loaded),
        })
    }
}

#[cfg(test)]
mod tests;
