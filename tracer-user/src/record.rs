//! `locktrace record`: find the lock functions, place and attach the probes,
//! wait for the end (duration, Ctrl-C, target exit), then collect and report.
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::signal::unix::{SignalKind, signal};
use tracer_common::flags;

use crate::{
    collect, loader, lockfuncs,
    placement::{self, Placement},
    report::{self, RecordInfo, Report, TargetInfo},
    target::Target,
    sampling, tracefs,
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
}

pub async fn record(options: &RecordOptions) -> Result<Report> {
    tracefs::check_privileges()?;
    let target = Target::open(options.pid)?;
    tracefs::check_uprobes()?;
    tracefs::ensure_tracefs()?;
    let functions = match lockfuncs::find(&target) {
        // Contention mode needs no lock functions (futex-only programs too).
        Err(_) if options.mode == Mode::Contention => Vec::new(),
        found => found?,
    };
    let placed = placement::place_all(&functions, options.placement, |module| target.host_path(module));
    let placement_fallbacks = if options.mode == Mode::Contention { Vec::new() } else { placement::fallbacks(&placed) };
    for fallback in &placement_fallbacks {
        eprintln!(
            "locktrace: auto placement fell back to the entry of {} in {}: {}",
            fallback.function, fallback.module, fallback.reason
        );
    }
    let plan = loader::LoadPlan {
        target: &target,
        functions: &placed,
        flags: flags::FUTEX | flags::CALLERS | if options.mode == Mode::Sampled { flags::SAMPLED } else { 0 },
        lock_probes: options.mode == Mode::All,
        request_probe: None,
    };
    let mut loaded = loader::load(&plan)?;
    let modules: std::collections::BTreeSet<&str> = functions.iter().map(|f| f.module.as_str()).collect();
    eprintln!(
        "locktrace: tracing pid {} ({}): {} probes in {} live after {} ms; Ctrl-C to stop",
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
        loaded.attach_time.as_millis()
    );
    let started = Instant::now();
    let end = wait_for_end(&target, options.duration);
    tokio::pin!(end);
    let (stopped_by, estimate) = match options.mode {
        Mode::Sampled => {
            let (stopped_by, estimate) = sampling::run(&mut loaded.ebpf, &target, &placed, options.sample, end).await?;
            (stopped_by, Some(estimate))
        }
        _ => (end.await?, None),
    };
    let duration_s = started.elapsed().as_secs_f64();
    let mut collected = collect::collect(&loaded.ebpf)?;
    let attach_ms = loaded.attach_time.as_millis() as u64;
    drop(loaded);
    let overhead = crate::overhead::measure(&collected, if options.mode == Mode::Contention { &[] } else { &placed }, attach_ms);
    if let Some(estimate) = &estimate {
        sampling::scale(&mut collected, estimate);
    }
    let info = RecordInfo {
        target: TargetInfo { pid: target.pid, exe: target.exe.clone(), cmdline: target.cmdline.clone() },
        duration_s,
        mode: format!("{:?}", options.mode).to_lowercase(),
        placement: (options.mode != Mode::Contention).then(|| format!("{:?}", options.placement).to_lowercase()),
        stopped_by: stopped_by.into(),
        counted_acquisitions: options.mode != Mode::Contention,
    };
    let mut report = report::build(info, &collected, &functions);
    report.placement_fallbacks = placement_fallbacks;
    if let Some(estimate) = &estimate {
        for lock in &mut report.locks {
            let counted = lock.acquisitions.map(|n| (n as f64 / estimate.scale).round() as u64);
            lock.acquisitions_error = counted.map(|counted| sampling::lock_error(estimate, counted));
        }
    }
    report.estimate = estimate;
    report.overhead = Some(overhead);
    Ok(report)
}

/// Waits until the duration ends, the user interrupts, or the target exits.
async fn wait_for_end(target: &Target, duration: Option<Duration>) -> Result<&'static str> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let deadline = async {
        match duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    let exited = async {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        while target.is_alive() {
            tick.tick().await;
        }
    };
    Ok(tokio::select! {
        _ = deadline => "duration",
        _ = interrupt.recv() => "interrupted",
        _ = terminate.recv() => "interrupted",
        _ = exited => "target_exited",
    })
}
