//! The recording window when requests are counted: before the probes go in,
//! open the load driver's connections and send the warmup; while tracing,
//! send the counted load (or wait) and show progress; after, turn what was
//! counted into the report's `requests` block.
use std::{
    io::{IsTerminal, Write},
    time::Duration,
};

use anyhow::Result;
use aya::Ebpf;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{
    attach::RequestProbePoint,
    collect,
    stop::{self, StopSignals},
};
use crate::{
    loadgen::{Amount, LoadDriver, LoadOptions, Tally},
    model::{Collected, RequestSource, Requests, StopReason},
    probe::{
        request_auto::{self, Chosen, RequestProbeSpec, Resolution},
        target::Target,
    },
};

/// How long counting goes on after the load's last response: a server's
/// work that follows its response (FrankenPHP's worker calls into Go for
/// its next request, taking musl's thread-creation rwlock) races the stop
/// otherwise, and the last request would lose it.
const AFTER_THE_LAST_RESPONSE: Duration = Duration::from_millis(50);

/// How requests are counted (all optional).
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestOptions {
    pub load: Option<LoadOptions>,
    /// `--request-probe`: a function run once per request, `auto`, `none`,
    /// or (no flag) chosen automatically when nothing else counts requests.
    pub probe: RequestProbeSpec,
    /// `--requests N`: counted by the user elsewhere.
    pub given: Option<u64>,
    /// Report per-request figures even when some responses were unexpected.
    pub allow_errors: bool,
}

pub(crate) struct RequestWindow {
    options: RequestOptions,
    driver: Option<LoadDriver>,
    probe: Option<Chosen>,
    tally: Option<Tally>,
    /// A stop signal came during the connects or the warmup: nothing is traced.
    stopped_early: Option<StopReason>,
}

impl RequestWindow {
    /// Resolves the request probe, connects the load driver and sends the
    /// warmup, all before any probe is attached (so none of it is counted).
    /// A stop signal meanwhile ends both at once (see [`RequestWindow::stopped_early`]).
    pub(crate) async fn prepare(
        options: &RequestOptions,
        target: &Target,
        signals: &mut StopSignals,
    ) -> Result<RequestWindow> {
        let counted_otherwise = options.load.is_some() || options.given.is_some();
        let probe = request_probe(target, &options.probe, counted_otherwise)?;
        let mut window = RequestWindow {
            options: options.clone(),
            driver: None,
            probe,
            tally: None,
            stopped_early: None,
        };
        let Some(load) = &options.load else {
            return Ok(window);
        };
        // Dropping the connect or warmup future (and the driver) abandons
        // their connections: a full backlog must not hold the tracer.
        let driver = tokio::select! {
            driver = LoadDriver::connect(load) => driver?,
            reason = signals.recv() => {
                window.stopped_early = Some(reason);
                return Ok(window);
            }
        };
        if load.warmup > 0 {
            let warmup = tokio::select! {
                warmup = driver.run(Amount::Requests(load.warmup)) => warmup?,
                reason = signals.recv() => {
                    driver.stop();
                    window.stopped_early = Some(reason);
                    return Ok(window);
                }
            };
            let _ = writeln!(
                std::io::stderr(),
                "locktrace: warmup: {} responses in {} ms (not counted)",
                warmup.responses(),
                warmup.elapsed.as_millis()
            );
        }
        window.driver = Some(driver);
        Ok(window)
    }

    /// The stop signal that came before tracing started, if one did.
    pub(crate) fn stopped_early(&self) -> Option<StopReason> {
        self.stopped_early
    }

    /// The request-boundary probe point for the loader.
    pub(crate) fn request_probe(&self) -> Option<RequestProbePoint> {
        self.probe
            .as_ref()
            .map(|chosen| RequestProbePoint::from(&chosen.probe))
    }

    /// Whether the request probe sits on an instruction the kernel emulates
    /// (None without a request probe); for the overhead estimate.
    pub(crate) fn request_probe_emulated(&self) -> Option<bool> {
        self.probe.as_ref().map(|chosen| chosen.probe.emulated)
    }

    pub(crate) fn has_load(&self) -> bool {
        self.driver.is_some()
    }

    /// Sends the counted load (returns right after the last response) or, without
    /// load, waits like a plain recording; shows progress on a terminal.
    pub(crate) async fn run(
        &mut self,
        target: &Target,
        duration: Option<Duration>,
        ebpf: &mut Ebpf,
        signals: &mut StopSignals,
        on_tick: &mut dyn FnMut(&mut Ebpf),
    ) -> Result<StopReason> {
        let mut progress = Progress::start(self.driver.is_some(), self.probe.is_some());
        let tick_every = Duration::from_millis(100);
        let mut tick = tokio::time::interval(tick_every);
        let outcome = match &self.driver {
            Some(driver) => {
                let amount = driver.options().amount;
                let load = driver.run(amount);
                tokio::pin!(load);
                let mut stopped_by = StopReason::LoadDone;
                let tally = loop {
                    tokio::select! {
                        tally = &mut load => break tally?,
                        reason = signals.recv() => { driver.stop(); stopped_by = reason; }
                        _ = tick.tick() => {
                            progress.update(ebpf, Some(driver.done()));
                            on_tick(ebpf);
                            // Load at a process that is gone would only
                            // collect connection errors.
                            if stopped_by == StopReason::LoadDone && !target.is_alive() {
                                driver.stop();
                                stopped_by = StopReason::TargetExited;
                            }
                        }
                    }
                };
                self.tally = Some(tally);
                if stopped_by == StopReason::LoadDone {
                    // What a server does right after its last response
                    // (a worker's call back in for the next request,
                    // logging) belongs to the requests counted.
                    tokio::time::sleep(AFTER_THE_LAST_RESPONSE).await;
                }
                stopped_by
            }
            None => {
                let mut each_tick = || {
                    on_tick(ebpf);
                    progress.update(ebpf, None);
                };
                stop::wait_for_end(target, duration, signals, &mut each_tick).await
            }
        };
        progress.finish();
        Ok(outcome)
    }

    /// The report's `requests` block: the count, its source, and why
    /// per-request figures are refused if they are; None without a count.
    pub(crate) fn finish(self, collected: &Collected) -> Option<Requests> {
        let probe_hits = self.probe.as_ref().map(|_| collected.requests);
        let (source, count) = if let Some(given) = self.options.given {
            (RequestSource::Given, given)
        } else if let Some(hits) = probe_hits {
            (RequestSource::Probe, hits)
        } else if let Some(tally) = &self.tally {
            (RequestSource::Load, tally.responses())
        } else {
            return None;
        };
        let mut block = Requests {
            source,
            count,
            probe: self.probe.as_ref().map(|chosen| chosen.probe.describe()),
            probe_hits,
            auto_probe: self.probe.as_ref().and_then(Chosen::auto_probe),
            ..Requests::default()
        };
        if let (Some(tally), Some(load)) = (&self.tally, &self.options.load) {
            block.statuses = tally
                .statuses
                .iter()
                .map(|(status, n)| (status.to_string(), *n))
                .collect();
            block.unexpected = tally.unexpected(load.expect_status);
            block.errors = block.unexpected.values().sum();
            block.retries = tally.retries;
            if block.errors > 0 && !self.options.allow_errors {
                let kinds: Vec<String> = block
                    .unexpected
                    .iter()
                    .map(|(kind, n)| format!("{kind}: {n}"))
                    .collect();
                let first = tally
                    .first_error
                    .as_deref()
                    .map(|e| format!("; first error: {e}"))
                    .unwrap_or_default();
                block.refused = Some(format!(
                    "{} of {} requests got an unexpected response ({}){first}; per-request figures refused (--allow-errors reports them anyway)",
                    block.errors,
                    tally.responses() + tally.connection_errors,
                    kinds.join(", ")
                ));
            }
        }
        if block.refused.is_none() && count == 0 {
            block.refused = Some(match source {
                RequestSource::Probe => format!(
                    "the request probe {} never ran; no per-request figures",
                    block.probe.as_deref().unwrap_or("?")
                ),
                _ => "no request was counted; no per-request figures".into(),
            });
        }
        Some(block)
    }
}

/// The request probe `spec` asks for on `target`; an unrecognised target
/// without a request flag gets its one-line hint on stderr.
pub(crate) fn request_probe(
    target: &Target,
    spec: &RequestProbeSpec,
    counted_otherwise: bool,
) -> Result<Option<Chosen>> {
    Ok(
        match request_auto::resolve(target, spec, counted_otherwise)? {
            Resolution::Probe(chosen) => Some(chosen),
            Resolution::None => None,
            Resolution::Hint(line) => {
                let _ = writeln!(std::io::stderr(), "{line}");
                None
            }
        },
    )
}

/// A pre-forked server's parent serves no requests: say which pids do.
pub(crate) fn hint_children(pid: u32, requests: u64) {
    let mut children = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            children.extend(list.split_whitespace().map(str::to_string));
        }
    }
    if !children.is_empty() {
        let _ = writeln!(
            std::io::stderr(),
            "locktrace: note: pid {pid} took no lock during {requests} requests; its child processes ({}) may be the ones serving them (e.g. Apache's worker): trace one of those",
            children.join(", ")
        );
    }
}

/// A live line on stderr (elapsed, probe hits, requests), only when stdout
/// and stderr are both terminals (quiet in scripts and pipes).
struct Progress {
    bar: ProgressBar,
    load: bool,
    probe: bool,
    ticks: u64,
    lock_hits: Option<u64>,
}

impl Progress {
    fn start(load: bool, probe: bool) -> Progress {
        let target = if std::io::stderr().is_terminal() && std::io::stdout().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(None, target);
        if let Ok(style) = ProgressStyle::with_template("{spinner} {elapsed} {msg}") {
            bar.set_style(style);
        }
        Progress {
            bar,
            load,
            probe,
            ticks: 0,
            lock_hits: None,
        }
    }

    fn update(&mut self, ebpf: &Ebpf, responses: Option<u64>) {
        if self.bar.is_hidden() {
            return;
        }
        // Summing the lock map costs a lookup per lock: once a second is enough.
        if self.ticks.is_multiple_of(10) {
            self.lock_hits = collect::total_lock_calls(ebpf).ok();
        }
        self.ticks += 1;
        let mut parts = Vec::new();
        if let Some(hits) = self.lock_hits {
            parts.push(format!("probe hits {hits}"));
        }
        if self.load {
            parts.push(format!("requests {} (load)", responses.unwrap_or(0)));
        }
        if self.probe {
            parts.push(format!(
                "requests {} (probe)",
                collect::request_probe_hits(ebpf).unwrap_or(0)
            ));
        }
        parts.push("Ctrl-C to stop".into());
        self.bar.set_message(parts.join(" · "));
        self.bar.tick();
    }

    fn finish(self) {
        self.bar.finish_and_clear();
    }
}
