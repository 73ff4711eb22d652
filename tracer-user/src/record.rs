//! `locktrace record`: find the lock functions, place and attach the probes,
//! wait for the end (duration, Ctrl-C, target exit), then collect and report.
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracer_common::flags;

use crate::{
    collect, loader, lockfuncs,
    placement::{self, Placement},
    report::{self, RecordInfo, Report, TargetInfo},
    sampling, symbolize,
    target::Target,
    tracefs, window,
};

/// What the lock probes do (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Every acquisition counted, exact.
    All,
    /// No lock probes: futex tracepoints only (contention exact, acquisitions unknown).
    Contention,
    /// Lock probes attached a fraction of the time (`--sample`); counts scaled, marked as estimates.
    Sampled,
}

#[derive(Debug, Clone)]
pub struct RecordOptions {
    pub pid: u32,
    pub duration: Option<Duration>,
    pub placement: Placement,
    pub mode: Mode,
    pub sample: sampling::SampleOptions,
    /// Request counting (load driver, request probe, given count).
    pub requests: window::RequestOptions,
    /// Top user stacks kept per lock (0: none recorded).
    pub stacks: usize,
}

pub async fn record(options: &RecordOptions) -> Result<Report> {
    // Handle Ctrl-C from the start, so one that comes right after the probes
    // are announced still ends in a report.
    let mut stop_signals = StopSignals::install()?;
    tracefs::check_privileges()?;
    let target = Target::open(options.pid)?;
    tracefs::check_uprobes()?;
    tracefs::ensure_tracefs()?;
    if options.mode == Mode::Sampled && options.requests.load.is_some() {
        bail!(
            "--mode sampled cannot drive --load; count requests with --request-probe or --requests, or use --mode all"
        );
    }
    let functions = match lockfuncs::find(&target) {
        // Contention mode needs no lock functions (futex-only programs too).
        Err(_) if options.mode == Mode::Contention => Vec::new(),
        found => found?,
    };
    let placed = placement::place_all(&functions, options.placement, |module| {
        target.host_path(module)
    });
    let placement_fallbacks = if options.mode == Mode::Contention {
        Vec::new()
    } else {
        placement::fallbacks(&placed)
    };
    for fallback in &placement_fallbacks {
        eprintln!(
            "locktrace: auto placement fell back to the entry of {} in {}: {}",
            fallback.function, fallback.module, fallback.reason
        );
    }
    // Load driver connections and warmup happen before the probes go in.
    let mut window = window::Window::prepare(&options.requests, &target).await?;
    let mut flags = flags::FUTEX | flags::CALLERS;
    if options.stacks > 0 {
        flags |= flags::STACKS;
    }
    if options.mode == Mode::Sampled {
        flags |= flags::SAMPLED;
    }
    let plan = loader::LoadPlan {
        target: &target,
        functions: &placed,
        flags,
        lock_probes: options.mode == Mode::All,
        // In sampled mode the sampler attaches the request probe in its windows.
        request_probe: if options.mode == Mode::Sampled {
            None
        } else {
            window.request_probe()
        },
    };
    let mut loaded = loader::load(&plan)?;
    // Maps and module files, kept so names resolve even after the target exits.
    let mut snapshot = symbolize::Snapshot::take(&target);
    snapshot.watch(&loaded.ebpf);
    let modules: std::collections::BTreeSet<&str> =
        functions.iter().map(|f| f.module.as_str()).collect();
    eprintln!(
        "locktrace: tracing pid {} ({}): {} probes in {} live after {} ms; {}",
        target.pid,
        target.exe,
        match options.mode {
            Mode::Sampled => format!(
                "{} (in sampling windows, {:.0}% of the time)",
                placed.iter().map(|(_, p)| p.points.len()).sum::<usize>(),
                options.sample.rate * 100.0
            ),
            _ => loaded.probe_count.to_string(),
        },
        modules.into_iter().collect::<Vec<_>>().join(", "),
        loaded.attach_time.as_millis(),
        if window.has_load() {
            "sending load"
        } else {
            "Ctrl-C to stop"
        }
    );
    let started = Instant::now();
    let mut refresh = || snapshot.tick();
    let (stopped_by, estimate) = match options.mode {
        Mode::Sampled => {
            // The sampler attaches and detaches the lock probes itself, so it
            // owns the BPF object; no load driver runs in this mode.
            let end = async {
                Ok(wait_for_end(&target, options.duration, &mut stop_signals, &mut refresh).await)
            };
            tokio::pin!(end);
            let request_probe = window.request_probe();
            let (stopped_by, estimate) = sampling::run(
                &mut loaded.ebpf,
                &target,
                &placed,
                request_probe.as_ref(),
                options.sample,
                end,
            )
            .await?;
            (stopped_by, Some(estimate))
        }
        _ => {
            let stopped_by = window
                .run(
                    &target,
                    options.duration,
                    &loaded.ebpf,
                    &mut stop_signals,
                    &mut refresh,
                )
                .await?;
            (stopped_by, None)
        }
    };
    let duration_s = started.elapsed().as_secs_f64();
    // Right after the last response: the counts cover exactly the load window.
    let mut collected = collect::collect(&loaded.ebpf)?;
    let attach_ms = loaded.attach_time.as_millis() as u64;
    drop(loaded);
    let overhead = crate::overhead::measure(
        &collected,
        if options.mode == Mode::Contention {
            &[]
        } else {
            &placed
        },
        window.request_probe_emulated(),
        attach_ms,
    );
    if let Some(estimate) = &estimate {
        sampling::scale(&mut collected, estimate);
    }
    let info = RecordInfo {
        target: TargetInfo {
            pid: target.pid,
            exe: target.exe.clone(),
            cmdline: target.cmdline.clone(),
        },
        duration_s,
        mode: format!("{:?}", options.mode).to_lowercase(),
        placement: (options.mode != Mode::Contention)
            .then(|| format!("{:?}", options.placement).to_lowercase()),
        stopped_by: stopped_by.into(),
        counted_acquisitions: options.mode != Mode::Contention,
    };
    let mut report = report::build(info, &collected, &functions);
    report.placement_fallbacks = placement_fallbacks;
    if let Some(estimate) = &estimate {
        for lock in &mut report.locks {
            let counted = lock
                .acquisitions
                .map(|n| (n as f64 / estimate.scale).round() as u64);
            lock.acquisitions_error =
                counted.map(|counted| sampling::lock_error(estimate, counted));
        }
    }
    report.estimate = estimate;
    report.overhead = Some(overhead);
    window.finish(&mut report, &collected);
    let naming = symbolize::NamingOptions {
        stacks_per_lock: options.stacks,
    };
    symbolize::annotate(&mut report, &mut snapshot, &collected, &functions, naming);
    Ok(report)
}

/// Ctrl-C and SIGTERM, caught from the start of the recording.
pub struct StopSignals {
    pub interrupt: Signal,
    terminate: Signal,
}

impl StopSignals {
    fn install() -> Result<StopSignals> {
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }
}

/// Waits until the duration ends, the user interrupts, or the target exits.
/// `on_tick` runs every 200 ms meanwhile.
pub async fn wait_for_end(
    target: &Target,
    duration: Option<Duration>,
    signals: &mut StopSignals,
    on_tick: &mut dyn FnMut(),
) -> &'static str {
    let deadline = async {
        match duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    let exited = async {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        let mut ticks = 0u32;
        while target.is_alive() {
            tick.tick().await;
            ticks += 1;
            if ticks.is_multiple_of(10) {
                on_tick();
            }
        }
    };
    tokio::select! {
        _ = deadline => "duration",
        _ = signals.interrupt.recv() => "interrupted",
        _ = signals.terminate.recv() => "interrupted",
        _ = exited => "target_exited",
    }
}
