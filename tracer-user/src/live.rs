//! A live session for the views that stay attached (`serve`, `top`): attach
//! once as `record` does, then every interval read the maps, build the report
//! model from the running totals, name the locks that newly became active,
//! and hand out what changed since the previous interval.
//!
//! Memory stays bounded for days: locks quiet for `expire_after` are deleted
//! from the BPF maps and forgotten here. The deletes happen while counting is
//! paused (`collect::while_paused`), so no increment lands on a deleted entry
//! reused for another key; calls during the pause count as dropped. What
//! expired locks cost is kept in running totals so the tracer-cost figures
//! never go backwards.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::{
    analysis::{
        self,
        build::{RecordInfo, lock_holding},
        builder::{Probes, ReportBuilder},
        routes::RouteRules,
    },
    model::{
        Activity, Collected, Deadlock, InProgress, KernelLocks, Lock, LockKind, LockStack, Mode,
        Placement, Report, Routes, StackSource, StopReason, WaitClass,
        plan::{Feature, Plan, View},
    },
    naming::{
        self,
        unwind::{SharedUnwinder, StackUnwinder},
    },
    probe::{
        kallsyms::Kallsyms,
        lockfuncs::LockFunction,
        request_auto::{Chosen, RequestProbeSpec},
        target::Target,
        waitfuncs::WaitFunctions,
    },
    record,
    render::{format, requests},
    session::{self, Prepared, Probed, Session},
    trace::expire::ExpiredKeys,
    trace::{
        attach::{Placed, RequestProbePoint},
        collect,
        follow::MainThreadWatch,
        inproc,
        snapshots::{self, SnapshotReader},
        window,
    },
};

mod kernel;

pub(crate) use kernel::KernelLockActivity;

/// Locks named per interval at most (the most active unnamed ones first):
/// naming reads every module's symbols, so a server creating many heap locks
/// must not make every interval pay for all of them.
const NAMED_PER_INTERVAL: usize = 64;

#[derive(Debug, Clone)]
pub struct LiveOptions {
    pub pid: u32,
    pub mode: Mode,
    pub placement: Placement,
    /// `--request-probe`: `MODULE:SYMBOL`, `auto`, `none`, or (no flag)
    /// chosen automatically for a recognised server.
    pub request_probe: RequestProbeSpec,
    /// Locks with no activity for this long are dropped from the maps.
    pub expire_after: Duration,
    /// Created (empty) once the probes are live, for scripts and tests.
    pub ready_file: Option<std::path::PathBuf>,
    /// CPU samples per CPU second for the CPU per lock (None: `--no-cpu`).
    pub cpu_hz: Option<u64>,
    /// Stack snapshots, unwound as `record --stacks` does: each lock's
    /// top stack (`top --stacks`).
    pub stacks: bool,
    /// `--php`: routes (cumulative, in each interval) and PHP frames in
    /// the stacks, with these rules for naming routes.
    pub php: Option<RouteRules>,
    /// Kernel lock contention traced (not with `--no-kernel-locks`).
    pub kernel_locks: bool,
}

/// What one lock did in an interval, with its name as far as known. Not a
/// [`Lock`]: its counts are the change since the previous interval (a
/// row's are since attach), and its name, caller and stack are the labels
/// the session resolved once and keeps, not the row's naming detail.
#[derive(Debug, Clone, PartialEq)]
pub struct LockActivity {
    pub address: u64,
    /// Name, else region and address (see `format::label`).
    pub label: String,
    pub kind: LockKind,
    /// Lock contention, or waiting for work / the runtime (as `record` classifies it).
    pub wait_class: WaitClass,
    pub module: Option<String>,
    /// The most frequent caller's function (or module+offset).
    pub top_caller: Option<String>,
    /// Null where acquisitions are not counted (contention mode).
    pub acquisitions: Option<u64>,
    pub contended: u64,
    pub wait_ns: u64,
    /// Sampled CPU time in lock code on the lock (0 with `--no-cpu`).
    pub cpu_ns: u64,
    /// With stacks: the lock's most frequent stack since it was first
    /// named (of its calls, else its waits), outermost frame first.
    pub top_stack: Option<Vec<String>>,
    /// Kernel lock contentions its futex calls met, and their wait (0
    /// where the kernel has no lock tracepoints).
    pub kernel_contentions: u64,
    pub kernel_wait_ns: u64,
}

impl LockActivity {
    pub(crate) fn is_active(&self) -> bool {
        self.acquisitions.unwrap_or(0) + self.contended + self.wait_ns + self.cpu_ns > 0
            || self.kernel_contentions > 0
    }
}

/// What happened since the previous interval.
#[derive(Debug, Clone)]
pub struct Interval {
    pub elapsed: Duration,
    /// Active locks only (lock contention and acquisitions), most acquisitions first.
    pub locks: Vec<LockActivity>,
    /// Active futex words that are not lock contention (condvar, Go
    /// runtime, other waits): never counted as contention.
    pub other_waits: Vec<LockActivity>,
    /// Events the BPF side could not count since attach, by reason (the
    /// report's `dropped`; empty when nothing was lost).
    pub dropped: BTreeMap<crate::model::DropReason, u64>,
    /// Request probe hits in the interval (None without a request probe).
    pub requests: Option<u64>,
    /// Since attach: probe hits, estimated time added, tracer CPU and RSS.
    pub cost: Cost,
    /// Locks tracked now (in the BPF maps and here).
    pub tracked_locks: usize,
    /// Lock waits going on for at least [`LONG_WAIT`], the longest first.
    pub long_waits: Vec<InProgress>,
    /// Threads waiting for each other's locks now.
    pub deadlocks: Vec<Deadlock>,
    /// `--php`: each route's requests and locks since attach.
    pub routes: Option<Routes>,
    /// The kernel locks section since attach (user side unnamed); None
    /// before the first interval with kernel lock contention, or without
    /// the kernel's lock tracepoints. Rows quiet for the expiry period
    /// leave it (their map keys are deleted).
    pub kernel_locks: Option<KernelLocks>,
    /// What each kernel lock row did in the interval, most wait first
    /// (active rows only).
    pub kernel_activity: Vec<KernelLockActivity>,
}

#[cfg(test)]
impl Interval {
    /// An interval of `elapsed` in which nothing happened (the views' tests).
    pub(crate) fn empty(elapsed: Duration) -> Interval {
        Interval {
            elapsed,
            locks: Vec::new(),
            other_waits: Vec::new(),
            dropped: BTreeMap::new(),
            requests: None,
            cost: Cost::default(),
            tracked_locks: 0,
            long_waits: Vec::new(),
            deadlocks: Vec::new(),
            routes: None,
            kernel_locks: None,
            kernel_activity: Vec::new(),
        }
    }
}

/// A lock wait in progress this long is shown by the live views.
pub(crate) const LONG_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Default)]
pub struct Cost {
    pub probe_hits: u64,
    pub estimated_added_ns: u64,
    pub tracer_cpu_s: f64,
    pub tracer_peak_rss_kib: u64,
}

/// A lock's name, region, module and top caller, resolved once.
#[derive(Debug, Clone)]
struct Named {
    label: String,
    module: Option<String>,
    top_caller: Option<String>,
    /// Distinct call sites seen when named: more later means re-naming the callers.
    call_sites: usize,
    /// With stacks: its top stack, outermost first (see [`LockActivity`]).
    top_stack: Option<Vec<String>>,
    /// Namings that found no stack yet (a lock is named again for its
    /// stack at most [`STACK_TRIES`] times).
    stack_tries: u32,
    /// Its declared type makes its waits lock contention (a Rust `Mutex`'s
    /// futex word, `locks[].declared.contention` in a report).
    declared_contention: bool,
}

/// How many times a lock is named again for a stack it lacks: its first
/// snapshots are unwound on the reader's thread, a tick or so behind.
const STACK_TRIES: u32 = 5;

/// The snapshot reader of a live session with `stacks`, and the unwinder
/// it feeds.
struct LiveStacks {
    unwinder: SharedUnwinder,
    /// Kept to the end of the session: the reader thread stops with it.
    _reader: SnapshotReader<SharedUnwinder>,
}

/// A lock's running totals as of the previous interval.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    acquisitions: u64,
    contended: u64,
    wait_ns: u64,
    cpu_ns: u64,
    kernel_contentions: u64,
    kernel_wait_ns: u64,
    last_active: Option<Instant>,
}

/// `--mode inproc`: switches the GOT entries to the stubs; the lock probes
/// left are those of the functions no stub counts.
fn start_inproc(
    options: &LiveOptions,
    prepared: Prepared,
) -> Result<(Prepared, Option<inproc::session::Session>)> {
    if options.mode != Mode::Inproc {
        return Ok((prepared, None));
    }
    let sample_every = options
        .stacks
        .then_some(tracer_common::inproc_sample::DEFAULT_EVERY);
    let started = inproc::session::start(&prepared.target, &prepared.functions, sample_every)?;
    if let Some(off) = started.session.as_ref().and_then(|s| s.stack_samples_off()) {
        crate::model::diagnostics::note(format_args!("locktrace: no stack samples: {off}"));
    }
    Ok((prepared.probing_only(&started.uprobe_ops), started.session))
}

pub struct LiveSession {
    pub target: Target,
    pub mode: Mode,
    pub probe_count: usize,
    pub attach_ms: u64,
    functions: Vec<LockFunction>,
    placed: Vec<Placed>,
    waits: WaitFunctions,
    request_probe: Option<Chosen>,
    /// The probes, the reads, PHP's threads and the inproc stubs.
    session: Session,
    /// Moves the probes to a live thread when the main thread leaves with
    /// `pthread_exit` (as `record` does).
    main_thread: MainThreadWatch,
    snapshot: naming::Snapshot,
    names: HashMap<u64, Named>,
    previous: HashMap<u64, Totals>,
    previous_requests: u64,
    /// Cost of the locks already expired from the maps.
    expired_cost: Cost,
    last_tick: Instant,
    expire_after: Duration,
    stacks: Option<LiveStacks>,
    /// `--php`: the rules for naming routes (PHP's threads are the session's).
    route_rules: Option<RouteRules>,
    /// The kernel's symbols, read at the first kernel lock contention.
    kernel_symbols: Option<Kallsyms>,
    /// The kernel lock stacks named by earlier ticks (with `kernel_symbols`).
    kernel_stacks_named: analysis::kernel_locks::NamedStacks,
    /// The kernel lock rows' totals between intervals, for their activity and expiry.
    kernel_aging: kernel::KernelAging,
    /// Keep each tick's report (since attach, names as known) for
    /// [`LiveSession::take_report`] (the agent's pprof); off for serve and top.
    pub keep_reports: bool,
    last_report: Option<Report>,
}

impl LiveSession {
    /// Finds the lock functions, places and attaches the probes (as `record` does).
    pub fn attach(options: &LiveOptions) -> Result<LiveSession> {
        let plan = Plan::new(
            View::Live,
            options.mode,
            &[
                (Feature::Stacks, options.stacks),
                (Feature::Php, options.php.is_some()),
                (Feature::KernelLocks, options.kernel_locks),
            ],
        )?;
        // Setup must not wait behind a loaded machine (see trace::priority).
        crate::trace::priority::begin_setup();
        let session = LiveSession::attach_now(options, &plan);
        crate::trace::priority::end_setup();
        session
    }

    fn attach_now(options: &LiveOptions, plan: &Plan) -> Result<LiveSession> {
        let started = Instant::now();
        let prepared = session::prepare(options.pid, options.mode, options.placement, false)?;
        let prepare_ms = started.elapsed().as_millis();
        let (prepared, stubs) = start_inproc(options, prepared)?;
        let inproc_ms = started.elapsed().as_millis();
        let request_probe = window::request_probe(&prepared.target, &options.request_probe, false)?;
        let request_probe_ms = started.elapsed().as_millis();
        let runtime = match &options.php {
            Some(_) => Some(session::php_runtime(&prepared.target)?),
            None => None,
        };
        let session = Session::attach(session::Attach {
            plan,
            probed: prepared.probed(),
            request_probe: request_probe
                .as_ref()
                .map(|chosen| RequestProbePoint::from(&chosen.probe)),
            cpu_hz: options.cpu_hz,
            php: runtime.as_ref(),
            inproc: stubs,
        })?;
        let Prepared {
            target,
            functions,
            placed,
            waits,
            ..
        } = prepared;
        let session_ms = started.elapsed().as_millis();
        let snapshot = naming::Snapshot::take(&target);
        // Where an attach's time goes (`RUST_LOG=debug`).
        log::debug!(
            "pid {}: prepared after {prepare_ms} ms, inproc stubs after {inproc_ms} ms, request probe after {request_probe_ms} ms, probes live after {session_ms} ms, names after {} ms",
            options.pid,
            started.elapsed().as_millis()
        );
        let stacks = match options.stacks {
            true => Some(live_stacks(&session.loaded.ebpf, &target)?),
            false => None,
        };
        if let Some(path) = &options.ready_file {
            record::signal_ready(path)?;
        }
        Ok(LiveSession {
            mode: options.mode,
            probe_count: session.loaded.probe_count,
            attach_ms: session.loaded.attach_time.as_millis() as u64,
            target,
            functions,
            placed,
            waits,
            request_probe,
            session,
            main_thread: MainThreadWatch::new(Instant::now()),
            snapshot,
            names: HashMap::new(),
            previous: HashMap::new(),
            previous_requests: 0,
            expired_cost: Cost::default(),
            last_tick: Instant::now(),
            expire_after: options.expire_after,
            stacks,
            route_rules: options.php.clone(),
            kernel_symbols: None,
            kernel_stacks_named: Default::default(),
            kernel_aging: kernel::KernelAging::default(),
            keep_reports: false,
            last_report: None,
        })
    }

    /// The report of the last tick: every lock's counts since attach, named
    /// as the intervals name them (with `keep_reports`).
    pub(crate) fn take_report(&mut self) -> Option<Report> {
        self.last_report.take()
    }

    /// After a `pthread_exit` of the main thread, binds the probes to a
    /// live thread (the old ones, bound to it, count nothing more).
    fn follow_main_thread_exit(&mut self) {
        let probed = Probed {
            target: &self.target,
            placed: &self.placed,
            waits: &self.waits,
            unlocks: &[],
            lock_code: &[],
        };
        let plan = self.session.follow_plan(probed);
        self.main_thread.tick(&mut self.session.loaded.ebpf, &plan);
    }

    pub(crate) fn has_request_probe(&self) -> bool {
        self.request_probe.is_some()
    }

    /// What counts requests, for the start-up line: the probe and, when
    /// locktrace chose it, why (empty without a request probe).
    pub(crate) fn request_probe_note(&self) -> String {
        match &self.request_probe {
            Some(chosen) => match chosen.auto_probe() {
                Some(auto) => format!("; {}", requests::why_probe(&auto)),
                None => format!("; requests: calls of {}", chosen.probe.describe()),
            },
            None => String::new(),
        }
    }

    /// Reads the maps and returns what changed since the previous call.
    pub fn tick(&mut self) -> Result<Interval> {
        let now = Instant::now();
        let elapsed = now - self.last_tick;
        self.last_tick = now;
        self.follow_main_thread_exit();
        // One row per lock across unmaps elsewhere (expiry then misses the
        // keys of a lock whose address changed generation: they stay, bounded).
        let mut collected = self.session.read(|_| {})?;
        let routes = self.routes(&mut collected)?;
        let mut report = self.builder().counts(&collected);
        self.add_kernel_locks(&mut report, &collected);
        if let (Some(routes), Some(read), Some(rules)) =
            (&routes, &collected.php, &self.route_rules)
        {
            let labels = analysis::routes::stack_labels(read, rules, routes);
            analysis::kernel_locks::split_by_route(&mut report, &collected, &labels);
        }
        report.routes = routes;
        analysis::routes::fold_into_rows(&mut report);
        let (long_waits, deadlocks, waited_on) = self.long_waits(&mut report);
        self.name_new_locks(&report, &waited_on, &mut collected);
        let (long_waits, deadlocks) = self.name_long_waits(long_waits, deadlocks);
        self.count_declared_contention(&mut report);
        self.keep_report(&report);

        // Locks waited on now keep their names, rows or not.
        let waited_on = long_waits.iter().map(|entry| entry.lock);
        let (locks, other_waits) = self.lock_activities(&report, waited_on, now);

        let requests = self.request_probe.as_ref().map(|_| {
            let delta = collected.requests.saturating_sub(self.previous_requests);
            self.previous_requests = collected.requests;
            delta
        });
        let cost = self.cost(&collected);
        let kernel_activity = match &report.kernel_locks {
            Some(section) => self.kernel_aging.activity(section, now),
            None => Vec::new(),
        };
        self.expire(&report, &collected, now)?;
        self.expire_kernel_locks(&report, &collected, now)?;
        Ok(Interval {
            elapsed,
            locks,
            other_waits,
            dropped: report.dropped.clone(),
            requests,
            cost,
            tracked_locks: self.previous.len(),
            long_waits,
            deadlocks,
            routes: self.named_routes(report.routes.take()),
            kernel_locks: report.kernel_locks.take(),
            kernel_activity,
        })
    }

    /// Each row's change since the previous tick, split into lock
    /// contention and other waits (only rows active in the interval); the
    /// previous counts and names of locks no longer seen (merged into
    /// another row) are dropped, those in `waited_on` kept.
    fn lock_activities(
        &mut self,
        report: &Report,
        waited_on: impl Iterator<Item = u64>,
        now: Instant,
    ) -> (Vec<LockActivity>, Vec<LockActivity>) {
        let mut locks = Vec::new();
        let mut other_waits = Vec::new();
        let mut seen: HashSet<u64> = waited_on.collect();
        for lock in &report.locks {
            let address = lock.address;
            seen.insert(address);
            let before = self.previous.entry(address).or_default();
            // A count below the previous one means the lock was expired and came back.
            let delta = |now: u64, then: u64| now.checked_sub(then).unwrap_or(now);
            let activity = LockActivity {
                address,
                label: String::new(),
                kind: lock.kind,
                wait_class: lock.wait_class,
                module: None,
                top_caller: None,
                acquisitions: lock.acquisitions.map(|n| delta(n, before.acquisitions)),
                contended: delta(lock.contended, before.contended),
                wait_ns: delta(lock.wait_ns, before.wait_ns),
                cpu_ns: delta(lock.cpu_ns.unwrap_or(0), before.cpu_ns),
                top_stack: None,
                kernel_contentions: delta(
                    lock.kernel_contentions.unwrap_or(0),
                    before.kernel_contentions,
                ),
                kernel_wait_ns: delta(lock.kernel_wait_ns.unwrap_or(0), before.kernel_wait_ns),
            };
            before.acquisitions = lock.acquisitions.unwrap_or(0);
            before.contended = lock.contended;
            before.wait_ns = lock.wait_ns;
            before.cpu_ns = lock.cpu_ns.unwrap_or(0);
            before.kernel_contentions = lock.kernel_contentions.unwrap_or(0);
            before.kernel_wait_ns = lock.kernel_wait_ns.unwrap_or(0);
            if activity.is_active() || before.last_active.is_none() {
                before.last_active = Some(now);
            }
            if activity.is_active() {
                let named = self.names.get(&address);
                let list = if lock.is_contention() {
                    &mut locks
                } else {
                    &mut other_waits
                };
                list.push(LockActivity {
                    label: named.map_or_else(|| format::label(lock), |n| n.label.clone()),
                    module: named.and_then(|n| n.module.clone()),
                    top_caller: named.and_then(|n| n.top_caller.clone()),
                    top_stack: named.and_then(|n| n.top_stack.clone()),
                    ..activity
                });
            }
        }
        // Entries merged into another lock (a futex word found to be inside a lock).
        self.previous.retain(|address, _| seen.contains(address));
        self.names.retain(|address, _| seen.contains(address));
        (locks, other_waits)
    }

    /// Deletes the map keys of kernel lock rows quiet for `expire_after`
    /// (with the kernel stacks only they used). The user lock rows whose
    /// futex calls met them lose those counts from their totals here too,
    /// so their next interval counts only what is new.
    fn expire_kernel_locks(
        &mut self,
        report: &Report,
        collected: &Collected,
        now: Instant,
    ) -> Result<()> {
        let quiet = self.kernel_aging.expire(now, self.expire_after);
        let Some(traced) = collected
            .kernel_locks
            .as_ref()
            .filter(|_| !quiet.is_empty())
        else {
            return Ok(());
        };
        let (gone, stacks) = kernel::keys_of(&traced.counts, &quiet);
        let rows = analysis::kernel_locks::user_rows(report);
        for (key, counts) in &gone {
            let row = analysis::kernel_locks::user_row(&rows, key.user_lock);
            if let Some(totals) = row.and_then(|address| self.previous.get_mut(&address)) {
                totals.kernel_contentions =
                    totals.kernel_contentions.saturating_sub(counts.contentions);
                totals.kernel_wait_ns = totals.kernel_wait_ns.saturating_sub(counts.wait_ns);
            }
        }
        let keys = gone.into_iter().map(|(key, _)| key).collect();
        self.session.kernel_stacks.forget(&stacks);
        collect::while_paused(&mut self.session.loaded.ebpf, |ebpf| {
            crate::trace::expire::remove_kernel_locks(ebpf, keys, &stacks)
        })
    }

    /// With `keep_reports`, the tick's report under the names known so far.
    fn keep_report(&mut self, report: &Report) {
        if !self.keep_reports {
            return;
        }
        let mut kept = report.clone();
        for lock in &mut kept.locks {
            if let Some(named) = self.names.get(&lock.address) {
                lock.name = Some(named.label.clone());
            }
        }
        self.last_report = Some(kept);
    }

    /// The kernel locks section since attach and each row's part of it
    /// (the kernel's symbols read once, at the first contention).
    fn add_kernel_locks(&mut self, report: &mut Report, collected: &Collected) {
        let contended = collected
            .kernel_locks
            .as_ref()
            .is_some_and(|traced| !traced.counts.is_empty());
        if contended && self.kernel_symbols.is_none() {
            self.kernel_symbols = Some(Kallsyms::read());
        }
        let none = Kallsyms::default();
        let symbols = self.kernel_symbols.as_ref().unwrap_or(&none);
        let named = &mut self.kernel_stacks_named;
        analysis::kernel_locks::apply_cached(report, collected, symbols, named);
    }

    /// `--php`: PHP's new threads loaded, and the routes since attach, their
    /// locks named as the rows are.
    fn routes(&mut self, collected: &mut Collected) -> Result<Option<Routes>> {
        let (Some(threads), Some(rules)) = (&mut self.session.php, &self.route_rules) else {
            return Ok(None);
        };
        threads.refresh(&mut self.session.loaded.ebpf)?;
        let read = crate::trace::php::read(&self.session.loaded.ebpf, threads)?;
        let routes = analysis::routes::build(&read, rules, collected.cpu_hz, self.mode);
        collected.php = Some(read);
        Ok(Some(routes))
    }

    /// The routes' locks under the names of their rows, as far as named.
    fn named_routes(&self, mut routes: Option<Routes>) -> Option<Routes> {
        for route in routes
            .iter_mut()
            .flat_map(|routes| routes.routes.iter_mut())
        {
            for lock in &mut route.locks {
                lock.name = self.names.get(&lock.address).map(|n| n.label.clone());
            }
        }
        routes
    }

    /// The rows whose declared type makes their waits lock contention,
    /// counted as contention as `record` counts them: naming marks its own
    /// copies, so the marks live in [`Named`].
    fn count_declared_contention(&self, report: &mut Report) {
        let declared: BTreeSet<u64> = report
            .locks
            .iter()
            .filter(|lock| {
                self.names
                    .get(&lock.address)
                    .is_some_and(|named| named.declared_contention)
            })
            .map(|lock| lock.address)
            .collect();
        if !declared.is_empty() {
            analysis::waits::count_as_contention(report, &declared);
        }
    }

    /// The lock waits going on for [`LONG_WAIT`] or more, deadlocks, and
    /// the unnamed locks waited on that have no row (to be named after the
    /// rows: no counts, not tracked).
    fn long_waits(&self, report: &mut Report) -> (Vec<InProgress>, Vec<Deadlock>, Vec<Lock>) {
        let long_waits: Vec<InProgress> = std::mem::take(&mut report.in_progress)
            .into_iter()
            .filter(|entry| {
                entry.activity == Activity::Wait
                    && entry.wait_class == Some(WaitClass::Lock)
                    && entry.elapsed_ns >= LONG_WAIT.as_nanos() as u64
            })
            .collect();
        let rows: HashSet<u64> = report.locks.iter().map(|lock| lock.address).collect();
        let waited_on = long_waits
            .iter()
            .filter(|entry| !rows.contains(&entry.lock) && !self.names.contains_key(&entry.lock))
            .map(|entry| Lock::empty(entry.lock, LockKind::Mutex, WaitClass::Lock))
            .collect();
        (long_waits, std::mem::take(&mut report.deadlocks), waited_on)
    }

    /// Lock and thread names in the long waits and deadlocks.
    fn name_long_waits(
        &self,
        mut long_waits: Vec<InProgress>,
        mut deadlocks: Vec<Deadlock>,
    ) -> (Vec<InProgress>, Vec<Deadlock>) {
        if long_waits.is_empty() {
            return (long_waits, deadlocks);
        }
        let mut noted = naming::holders::Threads::default();
        naming::holders::note_threads(self.target.pid, &mut noted);
        let threads = noted.names;
        let label = |lock: u64| self.names.get(&lock).map(|named| named.label.clone());
        for entry in &mut long_waits {
            entry.name = label(entry.lock);
            entry.thread = threads.get(&entry.tid).cloned();
            if let Some(holder) = &mut entry.holder {
                holder.thread = threads.get(&holder.tid).cloned();
            }
        }
        for step in deadlocks.iter_mut().flat_map(|d| d.cycle.iter_mut()) {
            step.name = label(step.lock);
            step.thread = threads.get(&step.tid).cloned();
        }
        (long_waits, deadlocks)
    }

    /// The report builder of every interval: a header with no duration,
    /// placement or stop yet.
    fn builder(&self) -> ReportBuilder<'_> {
        ReportBuilder {
            info: RecordInfo::of(&self.target, self.mode, None, 0.0, StopReason::Duration),
            functions: &self.functions,
        }
    }

    /// Names the locks not named yet and those with new call sites, most
    /// active first (the rows, then the locks `waited_on` without one), at
    /// most [`NAMED_PER_INTERVAL`] per interval.
    fn name_new_locks(&mut self, report: &Report, waited_on: &[Lock], collected: &mut Collected) {
        let mut call_sites: HashMap<u64, usize> = HashMap::new();
        for key in collected.callers.keys() {
            *call_sites.entry(key.lock).or_default() += 1;
        }
        let stacks = self.stacks.is_some();
        let mut named: Vec<Lock> = report
            .locks
            .iter()
            .chain(waited_on)
            .filter(|lock| {
                let address = lock.address;
                let sites = call_sites.get(&address).copied().unwrap_or(0);
                self.names.get(&address).is_none_or(|named| {
                    named.call_sites < sites
                        || (stacks && named.top_stack.is_none() && named.stack_tries < STACK_TRIES)
                })
            })
            .take(NAMED_PER_INTERVAL)
            .cloned()
            .collect();
        if named.is_empty() {
            return;
        }
        if let Some(stacks) = &self.stacks {
            collected.unwound = stacks
                .unwinder
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .stacks();
        }
        let naming_started = Instant::now();
        let renamed = named
            .iter()
            .filter(|lock| self.names.contains_key(&lock.address))
            .count();
        let options = naming::NamingOptions {
            stacks_per_lock: usize::from(stacks),
            route_names: None,
        };
        let stacks = naming::name_locks(
            &mut named,
            &mut self.snapshot,
            collected,
            &self.functions,
            &options,
        );
        // Where naming's time goes (`RUST_LOG=locktrace=debug`): the first
        // lock of each module reads its DWARF.
        log::debug!(
            "pid {}: named {} locks ({renamed} again, for new call sites or stacks) in {} ms: {}",
            self.target.pid,
            named.len(),
            naming_started.elapsed().as_millis(),
            named
                .iter()
                .map(format::label)
                .collect::<Vec<_>>()
                .join(", ")
        );
        for lock in &named {
            let address = lock.address;
            let top_caller = lock
                .callers
                .first()
                .map(|caller| format::frame_label(&caller.frame()));
            let top_stack = top_stack(&stacks, address);
            let stack_tries = match (&top_stack, self.names.get(&address)) {
                (Some(_), _) => 0,
                (None, Some(before)) => before.stack_tries + 1,
                (None, None) => 1,
            };
            self.names.insert(
                address,
                Named {
                    label: format::label(lock),
                    module: lock.module.clone(),
                    top_caller,
                    call_sites: call_sites.get(&address).copied().unwrap_or(0),
                    top_stack,
                    stack_tries,
                    declared_contention: lock
                        .declared
                        .as_ref()
                        .is_some_and(|declared| declared.contention.is_some()),
                },
            );
        }
    }

    /// Cost since attach: what the maps hold now plus what expired locks had.
    fn cost(&self, collected: &Collected) -> Cost {
        let now = self.probes().overhead(collected);
        Cost {
            probe_hits: now.probe_hits + self.expired_cost.probe_hits,
            estimated_added_ns: now.estimated_added_ns + self.expired_cost.estimated_added_ns,
            tracer_cpu_s: now.tracer_cpu_s,
            tracer_peak_rss_kib: now.tracer_peak_rss_kib,
        }
    }

    /// The probes whose hits cost the target time.
    fn probes(&self) -> Probes<'_> {
        Probes {
            mode: self.mode,
            placed: &self.placed,
            request_probe_emulated: self
                .request_probe
                .as_ref()
                .map(|chosen| chosen.probe.emulated),
            attach_ms: self.attach_ms,
        }
    }

    /// Deletes locks quiet for `expire_after` from the BPF maps (with their
    /// futex words and call sites) and forgets them here.
    fn expire(&mut self, report: &Report, collected: &Collected, now: Instant) -> Result<()> {
        let quiet: Vec<u64> = self
            .previous
            .iter()
            .filter(|(_, totals)| {
                totals
                    .last_active
                    .is_some_and(|at| now.duration_since(at) >= self.expire_after)
            })
            .map(|(&address, _)| address)
            .collect();
        if quiet.is_empty() {
            return Ok(());
        }
        let gone = Collected {
            locks: collected
                .locks
                .iter()
                .filter(|(address, _)| quiet.contains(address))
                .map(|(&address, &counts)| (address, counts))
                .collect(),
            ..Collected::default()
        };
        let expired = analysis::cost::measure(&gone, self.probes().counted(), None, 0);
        self.expired_cost.probe_hits += expired.probe_hits;
        self.expired_cost.estimated_added_ns += expired.estimated_added_ns;

        // A futex word belongs to the lock whose bytes hold it (as report::build
        // decides), else it is a lock of its own.
        let kinds: BTreeMap<u64, LockKind> = report
            .locks
            .iter()
            .filter(|lock| lock.kind != LockKind::Futex)
            .map(|lock| (lock.address, lock.kind))
            .collect();
        let owner = |word: u64| lock_holding(&kinds, word, |kind| kind.span()).unwrap_or(word);
        let expired_word = |word: &u64| quiet.contains(&owner(*word));
        let keys = ExpiredKeys {
            locks: quiet.clone(),
            futexes: collected
                .futexes
                .keys()
                .copied()
                .filter(expired_word)
                .collect(),
            condvars: collected
                .condvars
                .keys()
                .copied()
                .filter(expired_word)
                .collect(),
            go_futexes: collected
                .go_futexes
                .keys()
                .copied()
                .filter(expired_word)
                .collect(),
            cpu_locks: collected
                .cpu_locks
                .keys()
                .copied()
                .filter(expired_word)
                .collect(),
            callers: collected
                .callers
                .keys()
                .copied()
                .filter(|k| quiet.contains(&k.lock))
                .collect(),
            stacks: collected
                .stacks
                .keys()
                .copied()
                .filter(|k| quiet.contains(&owner(k.lock)))
                .collect(),
            wait_holders: collected
                .wait_holders
                .keys()
                .copied()
                .filter(|k| expired_word(&k.uaddr))
                .collect(),
        };
        if let Some(stacks) = &self.stacks {
            stacks
                .unwinder
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .forget(&keys.stacks);
        }
        collect::while_paused(&mut self.session.loaded.ebpf, |ebpf| keys.remove(ebpf))?;
        for address in &quiet {
            // The stubs' counts never expire: their totals stay, or the
            // next tick would show a quiet lock's whole count as new.
            if self.session.inproc.is_none() {
                self.previous.remove(address);
            }
            self.names.remove(address);
        }
        Ok(())
    }
}

/// Starts the snapshot reader of a live session, feeding a shared unwinder.
fn live_stacks(ebpf: &aya::Ebpf, target: &Target) -> Result<LiveStacks> {
    let unwinder: SharedUnwinder = Arc::new(Mutex::new(StackUnwinder::new(target)));
    let reader = snapshots::spawn(ebpf, Arc::clone(&unwinder))?;
    Ok(LiveStacks {
        unwinder,
        _reader: reader,
    })
}

/// The top stack of the lock at `address` among `stacks` (the most
/// frequent first), as frame labels, outermost first; None without a
/// whole stack (only the immediate caller known).
fn top_stack(stacks: &[LockStack], address: u64) -> Option<Vec<String>> {
    let stack = stacks
        .iter()
        .find(|stack| stack.lock == address && stack.unwound_by == StackSource::CallFrameInfo)?;
    Some(stack.frames.iter().rev().map(format::frame_label).collect())
}

/// Waits for a stop signal (SIGINT, SIGTERM or SIGHUP).
pub(crate) async fn stop_requested() -> Result<()> {
    let mut signals = crate::trace::stop::StopSignals::install()?;
    signals.recv().await;
    Ok(())
}

/// The one line said when the target exits under a live view (the caller exits non-zero).
pub(crate) fn target_exited(pid: u32) -> String {
    format!("locktrace: pid {pid} exited; nothing left to trace (restart with the new pid)")
}
