//! `locktrace record`, end to end, in the order the data flows: prepare
//! (probe), attach and wait (trace), build the report (analysis), name it
//! (naming). Rendering is the caller's.
use std::{
    collections::BTreeSet,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::{
    analysis::{
        build::RecordInfo,
        builder::{Measured, Probes, ReportBuilder},
        routes::{self, RouteRules},
        sites::{self, GroupBy},
        waits,
    },
    model::{
        Collected, CountedBy, Coverage, ExecLoss, ExecSeen, Inproc, MainThreadExit, Mode,
        PhpContext, Placement, Report, Restore, RestoreOutcome, SampledRun, StopReason,
        ThreadBlocks,
        plan::{Feature, Plan, View},
    },
    naming::{self, php::PhpRuntime, unwind::StackUnwinder},
    probe::{
        lockfuncs::{self, LockFunction},
        placement,
        target::Target,
    },
    render::output,
    session::{self, Prepared, Session, php_runtime, prepare},
    trace::follow::MainThreadWatch,
    trace::{
        attach::{self, Loaded},
        cpu::TargetClock,
        features::KernelFeatures,
        inproc, lifetimes,
        php::PhpThreads,
        priority,
        proc_events::{self, ProcWatch},
        sampled::{self, SampleOptions},
        snapshots,
        stop::{self, StopSignals},
        window::{self, RequestOptions, RequestWindow},
    },
};

#[derive(Debug, Clone)]
pub(crate) struct RecordOptions {
    pub pid: u32,
    pub duration: Option<Duration>,
    pub placement: Placement,
    pub mode: Mode,
    pub sample: SampleOptions,
    /// Request counting (load driver, request probe, given count).
    pub requests: RequestOptions,
    /// Top user stacks kept per lock (0: none recorded).
    pub stacks: usize,
    /// `--mode inproc --stacks`: the stubs sample one acquisition in this
    /// many per lock, call site and CPU (a power of two).
    pub stack_sample_every: u64,
    /// Written (empty) once the probes are live, for scripts and tests.
    pub ready_file: Option<PathBuf>,
    /// Also probe the unlock functions and time every hold.
    pub hold_times: bool,
    /// `--handoffs`: count each lock's acquisitions on another CPU than the
    /// one before (never in contention mode, which has no lock probes).
    pub handoffs: bool,
    /// CPU samples per CPU second for the CPU per lock (None: `--no-cpu`).
    pub cpu_hz: Option<u64>,
    /// Locks named by their creation site: one row per site or per address.
    pub group_by: GroupBy,
    /// `--php`: routes per request and PHP frames in stacks, with these
    /// rules for naming routes (None: off).
    pub php: Option<RouteRules>,
    /// Kernel lock contention traced (not with `--no-kernel-locks`).
    pub kernel_locks: bool,
}

impl RecordOptions {
    /// Each feature a mode may refuse, with whether it was asked for.
    pub(crate) fn features(&self) -> [(Feature, bool); 6] {
        [
            (Feature::Stacks, self.stacks > 0),
            (Feature::Php, self.php.is_some()),
            (Feature::Handoffs, self.handoffs),
            (Feature::HoldTimes, self.hold_times),
            (Feature::Load, self.requests.load.is_some()),
            (Feature::KernelLocks, self.kernel_locks),
        ]
    }
}

/// What the trace layer measured.
struct Traced {
    collected: Collected,
    stopped_by: StopReason,
    duration_s: f64,
    attach_ms: u64,
    sampled: Option<SampledRun>,
    /// Exec and forks of the target while traced.
    seen: proc_events::Seen,
    started: Instant,
    /// The target's CPU time over the window (its process CPU clock).
    target_cpu_ns: Option<u64>,
    main_thread_exit: Option<MainThreadExit>,
    /// Why the CPU sampler is off although asked for.
    cpu_off: Option<String>,
    /// `--mode inproc`: how each function was counted, and the restore.
    inproc: Option<Inproc>,
}

/// A recording's report, and its probes, which stay attached until
/// [`Recording::detach`]: the caller writes the report first (see
/// [`attach::Attached`]).
pub(crate) struct Recording {
    pub report: Report,
    probes: Option<attach::Attached>,
}

impl Recording {
    /// Detaches the probes (seconds under load).
    pub(crate) fn detach(self) {
        if let Some(probes) = self.probes {
            probes.detach();
        }
    }
}

pub(crate) async fn record(options: &RecordOptions) -> Result<Recording> {
    // Stop signals are caught from the start, so one that comes right after
    // the probes are announced still ends in a report.
    let mut signals = StopSignals::install()?;
    // Until the probes are live, setup must not wait behind a loaded machine.
    priority::begin_setup();
    let plan = Plan::new(View::Record, options.mode, &options.features())?;
    let prepared = prepare(
        options.pid,
        options.mode,
        options.placement,
        options.hold_times,
    )?;
    if options.mode == Mode::Inproc {
        inproc::session::check_alone(&prepared.target)?;
        inproc::seccomp::precheck(prepared.target.pid)?;
    }
    // Before the request window, whose notes would come first otherwise.
    let php = match &options.php {
        Some(_) => Some(php_runtime(&prepared.target)?),
        None => None,
    };
    for fallback in placement_fallbacks(options, &prepared) {
        output::note(format_args!(
            "locktrace: auto placement fell back to the entry of {} in {}: {}",
            fallback.function, fallback.module, fallback.reason
        ));
    }
    // Load driver connections and warmup happen before the probes go in,
    // at normal priority: a real-time load driver would starve the target
    // and skew the untraced baseline the warmup measures.
    priority::end_setup();
    let mut window =
        RequestWindow::prepare(&options.requests, &prepared.target, &mut signals).await?;
    priority::begin_setup();
    // Maps and module files, kept so names resolve even after the target exits.
    let mut snapshot = naming::Snapshot::take(&prepared.target);
    if php.is_some() && window.request_probe().is_none() {
        output::note(format_args!(
            "locktrace: --php without a request probe: PHP frames only, no routes (name one with --request-probe)"
        ));
    }
    // After the load's warmup: the entries are switched with the stubs'
    // gate closed, and the gate opens with the window (see `go_live`).
    let (prepared, inproc) = match options.mode {
        Mode::Inproc => {
            let sample_every = (options.stacks > 0).then_some(options.stack_sample_every);
            let started =
                inproc::session::start(&prepared.target, &prepared.functions, sample_every)?;
            announce_inproc(&started);
            (prepared.probing_only(&started.uprobe_ops), Some(started))
        }
        _ => (prepared, None),
    };
    let (traced, probes) = trace(
        options,
        &prepared,
        &mut window,
        &mut signals,
        &mut snapshot,
        Asked {
            plan: &plan,
            php: php.as_ref(),
            inproc,
        },
    )
    .await?;
    let report = report(
        options,
        &prepared,
        window,
        traced,
        &mut snapshot,
        php.as_ref(),
    );
    Ok(Recording { report, probes })
}

/// One line on what `--mode inproc` switched, on stderr.
fn announce_inproc(started: &inproc::session::Started) {
    let stubs: Vec<&str> = started
        .functions
        .iter()
        .filter(|f| f.counted_by == CountedBy::GotStubs)
        .map(|f| f.function.as_str())
        .collect();
    let entries: u64 = started
        .functions
        .iter()
        .flat_map(|f| f.modules.iter().map(|m| m.entries))
        .sum();
    for line in &started.ignored {
        output::note(format_args!("locktrace: {line}"));
    }
    if started.restored_at_start > 0 {
        output::note(format_args!(
            "locktrace: restored {} GOT entries an earlier locktrace left switched",
            started.restored_at_start
        ));
    }
    output::note(format_args!(
        "locktrace: --mode inproc: {entries} GOT entries switched to counting stubs ({}); uprobes for {}",
        if stubs.is_empty() {
            "none".to_string()
        } else {
            stubs.join(", ")
        },
        if started.uprobe_ops.is_empty() {
            "nothing".to_string()
        } else {
            started
                .uprobe_ops
                .iter()
                .map(|op| op.symbol())
                .collect::<Vec<_>>()
                .join(", ")
        }
    ));
}

fn placement_fallbacks(
    options: &RecordOptions,
    prepared: &Prepared,
) -> Vec<crate::model::PlacementFallback> {
    let mut fallbacks = if options.mode == Mode::Contention {
        Vec::new()
    } else {
        placement::fallbacks(&prepared.placed)
    };
    fallbacks.extend(placement::fallbacks(&prepared.unlocks));
    fallbacks
}

/// Attaches, waits for the end, and reads the maps right after it (so with
/// `--load` the counts cover exactly the load window). The probes come
/// back still attached (None if none went in).
async fn trace(
    options: &RecordOptions,
    prepared: &Prepared,
    window: &mut RequestWindow,
    signals: &mut StopSignals,
    snapshot: &mut naming::Snapshot,
    asked: Asked<'_>,
) -> Result<(Traced, Option<attach::Attached>)> {
    let target = &prepared.target;
    if let Some(stopped_by) = window.stopped_early() {
        output::note(format_args!(
            "locktrace: stopped by a signal before tracing started (connecting or warming up the load); nothing was counted"
        ));
        return Ok((nothing_traced(stopped_by), None));
    }
    let watch = ProcWatch::start(target.pid, &probed_modules(prepared));
    let (stubs, functions, restored_at_start) = match asked.inproc {
        Some(started) => (
            started.session,
            Some(started.functions),
            started.restored_at_start,
        ),
        None => (None, None, 0),
    };
    let mut session = Session::attach(session::Attach {
        plan: asked.plan,
        probed: prepared.probed(),
        request_probe: window.request_probe(),
        cpu_hz: options.cpu_hz,
        php: asked.php,
        inproc: stubs,
    })?;
    let armed = arm_sampler(options, prepared, window, &mut session.loaded)?;
    // Pointer chains of heap locks are searched while the target lives.
    snapshot.watch(&session.loaded.ebpf);
    let mut live = go_live(options, prepared, window, session)?;
    let stacks = spawn_unwinder(options, &live.session.loaded, target);
    let (stopped_by, sampled) = wait_for_stop(
        options, prepared, window, signals, snapshot, &mut live, armed,
    )
    .await?;
    // Stop counting, then read: every total and the request count cover
    // the same interval, the one timed here (the stubs' gate shut first:
    // their counts fall inside it).
    if let Some(stubs) = &live.session.inproc {
        stubs.set_counting(false);
    }
    let duration_s = live.started.elapsed().as_secs_f64();
    let cpu_at_end = live.clock.as_mut().and_then(TargetClock::latest);
    if stopped_by == StopReason::TargetExited {
        live.session.wait_for_exited_threads()?;
    }
    live.session.stop()?;
    let seen = watch.finish();
    let mut finished = live.session.finish(stopped_by, |collected| {
        if let Some(stacks) = stacks {
            match stacks.finish() {
                Ok(unwinder) => collected.unwound = unwinder.into_stacks(),
                Err(error) => output::note(format_args!(
                    "locktrace: whole stacks lost, immediate callers only: {error:#}"
                )),
            }
        }
        collected.hold_times = options.hold_times;
        collected.handoffs_counted = counts_handoffs(options);
    })?;
    let inproc = functions.map(|functions| {
        finish_inproc(
            finished.inproc.take(),
            functions,
            restored_at_start,
            &mut finished.collected,
        )
    });
    let traced = Traced {
        collected: finished.collected,
        stopped_by: finished.stopped_by,
        duration_s,
        attach_ms: finished.attach_ms,
        sampled,
        seen,
        started: live.started,
        target_cpu_ns: live
            .cpu_at_start
            .zip(cpu_at_end)
            .map(|(start, end)| end.saturating_sub(start)),
        main_thread_exit: live.main_thread.finish(),
        cpu_off: finished.cpu_off,
        inproc,
    };
    Ok((traced, Some(finished.probes)))
}

/// What `record` attaches besides the prepared probes: the plan, PHP's
/// engine (`--php`) and the switched GOT entries (`--mode inproc`).
struct Asked<'a> {
    plan: &'a Plan,
    php: Option<&'a PhpRuntime>,
    inproc: Option<inproc::session::Started>,
}

/// The stubs' counts into `collected`, then every GOT entry switched back.
fn finish_inproc(
    session: Option<inproc::session::Session>,
    functions: Vec<crate::model::InprocFunction>,
    restored_at_start: u64,
    collected: &mut Collected,
) -> Inproc {
    let Some(session) = session else {
        return Inproc {
            functions,
            mapping: None,
            per_cpu_tables: false,
            table_overflow: 0,
            entries_not_switched: 0,
            loaded_while_recording: Vec::new(),
            restored_at_start,
            restore: Restore::outcome(RestoreOutcome::NothingSwitched),
            stack_sample_every: None,
            stack_samples_off: None,
        };
    };
    let counted = session.read();
    counted.add_to(collected);
    session.finish(counted.overflow.iter().sum())
}

/// Sampled mode: the sampler's first window, armed before the probes are
/// announced (None in the other modes).
fn arm_sampler(
    options: &RecordOptions,
    prepared: &Prepared,
    window: &RequestWindow,
    loaded: &mut Loaded,
) -> Result<Option<sampled::Armed>> {
    if options.mode != Mode::Sampled {
        return Ok(None);
    }
    let request_probe = window.request_probe();
    sampled::arm(
        &mut loaded.ebpf,
        &prepared.target,
        &prepared.placed,
        request_probe.as_ref(),
        &options.sample,
    )
    .map(Some)
}

/// A recording from the moment its probes are announced live.
struct LiveRecording {
    /// The probes and PHP's threads (loaded again at each tick).
    session: Session,
    started: Instant,
    /// The target's CPU clock, and its reading when the window started.
    clock: Option<TargetClock>,
    cpu_at_start: Option<u64>,
    main_thread: MainThreadWatch,
}

/// Starts the window, says the probes are live, and creates the ready file.
fn go_live(
    options: &RecordOptions,
    prepared: &Prepared,
    window: &RequestWindow,
    session: Session,
) -> Result<LiveRecording> {
    // The window and the target's CPU clock start before anyone is told the
    // probes are live: a client that starts work at the ready file could
    // otherwise run before the first reading (seen under two CPU hogs: the
    // target's CPU read 10 % low). The stubs count from the window's start
    // (not through the attach, which a stop may cut to nothing).
    let started = Instant::now();
    if let Some(stubs) = &session.inproc {
        stubs.set_counting(true);
    }
    let mut clock = TargetClock::open(prepared.target.pid);
    let cpu_at_start = clock.as_mut().and_then(TargetClock::read);
    announce(options, prepared, &session.loaded, window);
    priority::end_setup();
    if let Some(path) = &options.ready_file {
        signal_ready(path)?;
    }
    Ok(LiveRecording {
        session,
        started,
        clock,
        cpu_at_start,
        main_thread: MainThreadWatch::new(started),
    })
}

/// With `--stacks` or creation sites, the reader that unwinds stack
/// snapshots on a thread of its own, as they come. A reader that cannot
/// start costs the whole stacks, not the recording: each call site's stack
/// is then its immediate caller (exact counts).
fn spawn_unwinder(
    options: &RecordOptions,
    loaded: &Loaded,
    target: &Target,
) -> Option<snapshots::SnapshotReader<StackUnwinder>> {
    if options.stacks == 0 && !session::creation_sites(options.mode) {
        return None;
    }
    snapshots::spawn(&loaded.ebpf, StackUnwinder::new(target))
        .map_err(|error| {
            output::note(format_args!(
                "locktrace: whole stacks off, immediate callers only: {error:#}"
            ))
        })
        .ok()
}

/// Runs until the recording's stop reason (the duration, a signal, the
/// target's exit, the load's end), keeping the snapshot, the watched
/// modules and the main thread's probes current meanwhile.
async fn wait_for_stop(
    options: &RecordOptions,
    prepared: &Prepared,
    window: &mut RequestWindow,
    signals: &mut StopSignals,
    snapshot: &mut naming::Snapshot,
    live: &mut LiveRecording,
    armed: Option<sampled::Armed>,
) -> Result<(StopReason, Option<SampledRun>)> {
    let target = &prepared.target;
    // Again on a live thread when the main thread leaves (in sampled mode
    // the windows attach the lock probes; the rest moves here).
    let plan = live.session.follow_plan(prepared.probed());
    // Modules seen by the snapshot's ticks, watched for unmaps by the
    // follow step (which holds the BPF object).
    let module_ranges = std::cell::RefCell::new(None);
    let mut watched = std::mem::take(&mut live.session.loaded.watched);
    let mut watch_modules = |ebpf: &mut aya::Ebpf| {
        if let Some(ranges) = module_ranges.borrow_mut().take()
            && let Err(error) = watched.update(ebpf, ranges)
        {
            output::note(format_args!(
                "locktrace: new modules not watched for unloading: {error:#}"
            ));
        }
    };
    let clock = &mut live.clock;
    let mut refresh = || {
        snapshot.tick();
        *module_ranges.borrow_mut() = Some(lifetimes::module_ranges(snapshot.maps()));
        // Kept up to date: the last reading counts if the target exits.
        clock.as_mut().map(TargetClock::read);
    };
    let main_thread = &mut live.main_thread;
    let php = &mut live.session.php;
    let Some(armed) = armed else {
        let mut refresh_and_follow = |ebpf: &mut aya::Ebpf| {
            refresh();
            watch_modules(ebpf);
            main_thread.tick(ebpf, &plan);
            refresh_php(php, ebpf);
        };
        let stopped_by = window
            .run(
                target,
                options.duration,
                &mut live.session.loaded.ebpf,
                signals,
                &mut refresh_and_follow,
            )
            .await?;
        return Ok((stopped_by, None));
    };
    // The sampler attaches and detaches the lock probes itself, so it
    // owns the BPF object; no load driver runs in this mode.
    let end =
        async { Ok(stop::wait_for_end(target, options.duration, signals, &mut refresh).await) };
    tokio::pin!(end);
    let mut follow = |ebpf: &mut aya::Ebpf| {
        watch_modules(ebpf);
        refresh_php(php, ebpf);
        main_thread.tick(ebpf, &plan)
    };
    let (stopped_by, run) = sampled::run(
        &mut live.session.loaded.ebpf,
        target,
        &prepared.placed,
        options.sample,
        armed,
        end,
        &mut follow,
    )
    .await?;
    Ok((stopped_by, Some(run)))
}

/// Loads threads PHP started since the last tick; a failure leaves their
/// events counted as `thread_unknown`.
fn refresh_php(php: &mut Option<PhpThreads>, ebpf: &mut aya::Ebpf) {
    if let Some(threads) = php
        && let Err(error) = threads.refresh(ebpf)
    {
        output::note(format_args!(
            "locktrace: PHP's new threads not loaded: {error:#}"
        ));
    }
}

/// A recording stopped before its probes were attached.
fn nothing_traced(stopped_by: StopReason) -> Traced {
    Traced {
        collected: Collected::default(),
        stopped_by,
        duration_s: 0.0,
        attach_ms: 0,
        sampled: None,
        seen: proc_events::Seen::default(),
        started: Instant::now(),
        target_cpu_ns: None,
        main_thread_exit: None,
        cpu_off: None,
        inproc: None,
    }
}

/// Handoffs are counted at the lock probes' acquisitions, when asked for
/// (the plan refuses them where there are none).
fn counts_handoffs(options: &RecordOptions) -> bool {
    options.handoffs
}

/// The modules holding probed lock functions, as the target and the host see them.
fn probed_modules(prepared: &Prepared) -> Vec<(String, PathBuf)> {
    prepared
        .functions
        .iter()
        .map(|f| f.module.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|module| {
            let host = prepared.target.host_path(&module);
            (module, host)
        })
        .collect()
}

/// What the recording covered: children are never followed; an exec
/// leaves the new program's lock calls out unless it maps a probed module.
fn coverage(
    mode: Mode,
    seen: proc_events::Seen,
    started: Instant,
    main_thread_exit: Option<MainThreadExit>,
    functions: &[LockFunction],
) -> Coverage {
    let exec = seen.exec.map(|exec| ExecSeen {
        after_s: exec.at.saturating_duration_since(started).as_secs_f64(),
        exe: exec.exe,
        not_counted: match mode {
            Mode::Contention => ExecLoss::Nothing,
            Mode::All | Mode::Sampled | Mode::Inproc if exec.still_probed.is_empty() => {
                ExecLoss::AllLockCalls
            }
            Mode::All | Mode::Sampled | Mode::Inproc => ExecLoss::LockCallsOutsideProbedModules,
        },
        still_probed: exec.still_probed,
    });
    Coverage {
        children_followed: false,
        children_forked: seen.forks,
        exec,
        main_thread_exit,
        found_by_code: found_by_code(functions),
        target_exit: seen.exit,
    }
}

/// The lock functions found by their code, if any were (one module: the
/// static executable).
fn found_by_code(functions: &[LockFunction]) -> Option<crate::model::FoundByCode> {
    let mut by_code = functions.iter().filter_map(|f| match &f.found_by {
        lockfuncs::FoundBy::LibcCode { archive } => Some((f, archive)),
        lockfuncs::FoundBy::Symbol => None,
    });
    let (first, archive) = by_code.next()?;
    let mut names = vec![first.op.symbol().to_string()];
    names.extend(by_code.map(|(f, _)| f.op.symbol().to_string()));
    Some(crate::model::FoundByCode {
        module: first.module.clone(),
        archive: archive.clone(),
        functions: names,
    })
}

/// The one line that says the probes are live, on stderr.
/// `N probes in MODULES`, or, with no lock functions (a Go program
/// without libc, contention mode), what is traced instead.
fn probes_where(probes: &str, modules: &BTreeSet<&str>) -> String {
    if modules.is_empty() {
        return "futex waits only (no pthread lock functions probed)".into();
    }
    format!(
        "{probes} probes in {}",
        modules.iter().copied().collect::<Vec<_>>().join(", ")
    )
}

fn announce(options: &RecordOptions, prepared: &Prepared, loaded: &Loaded, window: &RequestWindow) {
    let modules: BTreeSet<&str> = prepared
        .functions
        .iter()
        .map(|f| f.module.as_str())
        .collect();
    let probes = match options.mode {
        Mode::Sampled => format!(
            "{} (in sampling windows, {:.0}% of the time)",
            prepared
                .placed
                .iter()
                .map(|(_, p)| p.points.len())
                .sum::<usize>(),
            options.sample.rate * 100.0
        ),
        Mode::All | Mode::Contention | Mode::Inproc => loaded.probe_count.to_string(),
    };
    output::note(format_args!(
        "locktrace: tracing pid {} ({}): {} live after {} ms; {}",
        prepared.target.pid,
        prepared.target.exe,
        probes_where(&probes, &modules),
        loaded.attach_time.as_millis(),
        if window.has_load() {
            "sending load"
        } else {
            "Ctrl-C to stop"
        }
    ));
}

/// Counts to the model (analysis), then names (naming).
fn report(
    options: &RecordOptions,
    prepared: &Prepared,
    window: RequestWindow,
    traced: Traced,
    snapshot: &mut naming::Snapshot,
    php: Option<&PhpRuntime>,
) -> Report {
    let Traced {
        mut collected,
        stopped_by,
        duration_s,
        attach_ms,
        sampled,
        seen,
        started,
        target_cpu_ns,
        main_thread_exit,
        cpu_off,
        inproc,
    } = traced;
    let placement = options
        .mode
        .counts_acquisitions()
        .then_some(options.placement);
    let builder = ReportBuilder {
        info: RecordInfo::of(
            &prepared.target,
            options.mode,
            placement,
            duration_s,
            stopped_by,
        ),
        functions: &prepared.functions,
    };
    let measured = Measured {
        probes: Probes {
            mode: options.mode,
            placed: &prepared.placed,
            request_probe_emulated: window.request_probe_emulated(),
            attach_ms,
        },
        unlocks: &prepared.unlocks,
        sampled: sampled.as_ref().map(|run| (run, options.sample.rate)),
        target_cpu_ns,
        kernel_limits: KernelFeatures::get().limits(
            options.stacks > 0,
            prepared.waits.go_futex.is_some(),
            options.cpu_hz.is_some() && cpu_off.is_none(),
        ),
        cpu_off,
        placement_fallbacks: placement_fallbacks(options, prepared),
        coverage: coverage(
            options.mode,
            seen,
            started,
            main_thread_exit,
            &prepared.functions,
        ),
    };
    let mut report = builder.recording(&mut collected, measured, |report, collected| {
        let requests = window.finish(collected)?;
        if requests.count > 0 && report.totals.acquisitions == Some(0) {
            window::hint_children(report.target.pid, requests.count);
        }
        Some(requests)
    });
    if let (Some(runtime), Some(rules), Some(read)) = (php, &options.php, &collected.php) {
        report.php = Some(php_context(runtime, read));
        let routes = routes::build(read, rules, collected.cpu_hz, options.mode);
        let labels = routes::stack_labels(read, rules, &routes);
        crate::analysis::kernel_locks::split_by_route(&mut report, &collected, &labels);
        report.routes = Some(routes);
    }
    name(options, prepared, &mut report, snapshot, &collected);
    routes::fold_into_rows(&mut report);
    if let Some(inproc) = inproc {
        crate::analysis::inproc::mark_locks(&mut report, &inproc);
        report.inproc = Some(inproc);
    }
    report
}

/// The report's `php` block.
fn php_context(runtime: &PhpRuntime, read: &crate::model::PhpCollected) -> PhpContext {
    PhpContext {
        module: runtime.module.clone(),
        version: runtime.version.clone(),
        layout: runtime.layout,
        threads: read.threads,
        thread_blocks: if read.tls {
            ThreadBlocks::Tls
        } else {
            ThreadBlocks::Table
        },
        tls_slot_from: runtime
            .tls_slot
            .or(read.tls.then_some(crate::model::TlsSlotFrom::ThreadTable)),
        unread: tracer_common::php::miss::NAMES
            .iter()
            .zip(read.misses)
            .filter(|(_, count)| *count > 0)
            .map(|(name, count)| (name.to_string(), count))
            .collect(),
    }
}

/// Names the locks, their callers and stacks (naming), then groups them by
/// creation site if asked.
fn name(
    options: &RecordOptions,
    prepared: &Prepared,
    report: &mut Report,
    snapshot: &mut naming::Snapshot,
    collected: &Collected,
) {
    let route_names = match (&options.php, &collected.php, &report.routes) {
        (Some(rules), Some(read), Some(routes)) => Some(routes::stack_labels(read, rules, routes)),
        _ => None,
    };
    let naming_options = naming::NamingOptions {
        stacks_per_lock: options.stacks,
        route_names,
    };
    naming::annotate(
        report,
        snapshot,
        collected,
        &prepared.functions,
        naming_options,
    );
    waits::count_declared_contention(report);
    if options.group_by == GroupBy::Site {
        sites::group_by_site(report);
    }
}

/// Creates the (empty) `--ready-file` once the probes are live, for scripts and tests.
pub(crate) fn signal_ready(path: &std::path::Path) -> Result<()> {
    crate::model::write_output(path, b"").context("--ready-file")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_ready_line_names_what_is_traced_without_lock_functions() {
        let none = std::collections::BTreeSet::new();
        assert_eq!(
            super::probes_where("0", &none),
            "futex waits only (no pthread lock functions probed)"
        );
        let libc = std::collections::BTreeSet::from(["/lib/libc.so.6"]);
        assert_eq!(
            super::probes_where("5", &libc),
            "5 probes in /lib/libc.so.6"
        );
    }
}
