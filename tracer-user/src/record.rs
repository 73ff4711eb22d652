//! `locktrace record`: find the lock functions, place and attach the probes,
//! wait for the end (duration, Ctrl-C, target exit), then collect and report.
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracer_common::flags;

use crate::{
    collect, loader, lockfuncs,
    placement::{self, Placement},
    report::{self, RecordInfo, Report, TargetInfo},
    symbolize,
    target::Target,
    tracefs, window,
};

#[derive(Debug, Clone)]
pub struct RecordOptions {
    pub pid: u32,
    pub duration: Option<Duration>,
    pub placement: Placement,
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
    let functions = lockfuncs::find(&target)?;
    let placed: Vec<_> = functions
        .iter()
        .map(|function| {
            (
                function.clone(),
                placement::place(function, options.placement),
            )
        })
        .collect();
    for (function, placed) in &placed {
        if let Some(reason) = &placed.fallback_reason {
            eprintln!(
                "locktrace: {}: probe at the entry ({reason})",
                function.op.symbol()
            );
        }
    }
    // Load driver connections and warmup happen before the probes go in.
    let mut window = window::Window::prepare(&options.requests, &target).await?;
    let plan = loader::LoadPlan {
        target: &target,
        functions: &placed,
        flags: flags::FUTEX | flags::CALLERS | if options.stacks > 0 { flags::STACKS } else { 0 },
        lock_probes: true,
        request_probe: window.request_probe(),
    };
    let loaded = loader::load(&plan)?;
    // Maps and module files, kept so names resolve even after the target exits.
    let mut snapshot = symbolize::Snapshot::take(&target);
    let modules: std::collections::BTreeSet<&str> =
        functions.iter().map(|f| f.module.as_str()).collect();
    eprintln!(
        "locktrace: tracing pid {} ({}): {} probes in {} live after {} ms; {}",
        target.pid,
        target.exe,
        loaded.probe_count,
        modules.into_iter().collect::<Vec<_>>().join(", "),
        loaded.attach_time.as_millis(),
        if window.has_load() {
            "sending load"
        } else {
            "Ctrl-C to stop"
        }
    );
    let started = Instant::now();
    let stopped_by = window
        .run(
            &target,
            options.duration,
            &loaded.ebpf,
            &mut stop_signals,
            &mut || snapshot.refresh(),
        )
        .await?;
    let duration_s = started.elapsed().as_secs_f64();
    // Right after the last response: the counts cover exactly the load window.
    let collected = collect::collect(&loaded.ebpf)?;
    drop(loaded);
    let info = RecordInfo {
        target: TargetInfo {
            pid: target.pid,
            exe: target.exe.clone(),
            cmdline: target.cmdline.clone(),
        },
        duration_s,
        mode: "all".into(),
        placement: Some(format!("{:?}", options.placement).to_lowercase()),
        stopped_by: stopped_by.into(),
        counted_acquisitions: true,
    };
    let mut report = report::build(info, &collected, &functions);
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
