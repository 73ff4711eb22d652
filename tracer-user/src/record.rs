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
    tracefs,
};

#[derive(Debug, Clone)]
pub struct RecordOptions {
    pub pid: u32,
    pub duration: Option<Duration>,
    pub placement: Placement,
}

pub async fn record(options: &RecordOptions) -> Result<Report> {
    tracefs::check_privileges()?;
    let target = Target::open(options.pid)?;
    tracefs::check_uprobes()?;
    tracefs::ensure_tracefs()?;
    let functions = lockfuncs::find(&target)?;
    let placed = placement::place_all(&functions, options.placement, |module| target.host_path(module));
    let placement_fallbacks = placement::fallbacks(&placed);
    for fallback in &placement_fallbacks {
        eprintln!(
            "locktrace: auto placement fell back to the entry of {} in {}: {}",
            fallback.function, fallback.module, fallback.reason
        );
    }
    let plan = loader::LoadPlan {
        target: &target,
        functions: &placed,
        flags: flags::FUTEX | flags::CALLERS,
        lock_probes: true,
        request_probe: None,
    };
    let loaded = loader::load(&plan)?;
    let modules: std::collections::BTreeSet<&str> = functions.iter().map(|f| f.module.as_str()).collect();
    eprintln!(
        "locktrace: tracing pid {} ({}): {} probes in {} live after {} ms; Ctrl-C to stop",
        target.pid,
        target.exe,
        loaded.probe_count,
        modules.into_iter().collect::<Vec<_>>().join(", "),
        loaded.attach_time.as_millis()
    );
    let started = Instant::now();
    let stopped_by = wait_for_end(&target, options.duration).await?;
    let duration_s = started.elapsed().as_secs_f64();
    let collected = collect::collect(&loaded.ebpf)?;
    drop(loaded);
    let info = RecordInfo {
        target: TargetInfo { pid: target.pid, exe: target.exe.clone(), cmdline: target.cmdline.clone() },
        duration_s,
        mode: "all".into(),
        placement: Some(format!("{:?}", options.placement).to_lowercase()),
        stopped_by: stopped_by.into(),
        counted_acquisitions: true,
    };
    let mut report = report::build(info, &collected, &functions);
    report.placement_fallbacks = placement_fallbacks;
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
