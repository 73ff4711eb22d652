//! `--mode sampled`: the lock probes are attached only in windows covering a
//! fraction RATE of the time (the futex tracepoints stay on all the time);
//! `analysis::estimate` scales the counts up by total time / counted time.
//!
//! Attaching a uprobe takes ~8 ms and detaching ~110 ms here, so a window's
//! probes are not all live at one instant. The BPF program therefore counts
//! only while `COUNTING[0]` has its lock-call bit set: userspace sets it after the last attach
//! and clears it before the first detach, and times exactly that interval.
//! Window starts are jittered inside each period so that a periodic workload
//! cannot alias with the sampling.
use std::{
    future::Future,
    os::fd::OwnedFd,
    pin::Pin,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow};
use aya::Ebpf;
use tracer_common::{counting, names};

use cycle::{Counts, Jitter, WindowProbes};

use super::{
    attach::{self, AttachError, Placed, RequestProbePoint},
    collect,
    multi::MultiPrograms,
};
use crate::{
    model::{SampledRun, StopReason, WindowLinkKind},
    probe::target::Target,
};

mod cycle;

#[derive(Debug, Clone, Copy)]
pub(crate) struct SampleOptions {
    /// Fraction of the time the lock probes are in, warm-up included (0 < rate <= 1).
    pub rate: f64,
    /// One window per period (`--sample-period`); None: the mechanism's
    /// default ([`DEFAULT_PERIOD_MULTI`], [`DEFAULT_PERIOD_PER_POINT`]).
    pub period: Option<Duration>,
    /// How a window's probes are attached and detached.
    pub links: WindowLinkChoice,
}

/// How long a window's probes are live before it counts. The probes slow
/// lock-heavy parts of a request, so once they are live the requests in
/// flight drift towards those parts; a window that counted from the attach
/// would begin with fewer lock calls still to come than it ends with, and
/// overstate calls per request (FrankenPHP, 100 ms windows of ~115
/// requests: 796 lock calls per request against the true 792, +0.5 %,
/// beyond the stated ±0.5 %). A few requests' time lets that settle.
pub(crate) const WARMUP: Duration = Duration::from_millis(20);

/// The default period with uprobe-multi links: a window opens in ~1-4 ms
/// and closes in ~35 ms here (docs/benchmarks.md), so 30 windows in 30 s
/// cost little, and the bound shrinks with the square root of the windows.
pub(crate) const DEFAULT_PERIOD_MULTI: Duration = Duration::from_secs(1);
/// With a perf-event uprobe per point, whose windows take ~0.5 s to close
/// (seconds on a loaded machine).
pub(crate) const DEFAULT_PERIOD_PER_POINT: Duration = Duration::from_secs(5);

/// `--window-links`: uprobe-multi links where the kernel takes them, or a
/// perf-event uprobe per point (to compare; the mechanism before 2026-12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum WindowLinkChoice {
    #[default]
    Auto,
    PerfEvent,
}

/// The first window's probes, attached (not counting) before the recording
/// says its probes are live: the first attach of a probe point creates
/// the kernel's uprobe, which takes seconds on a loaded machine, and that
/// time must not be an unsampled start of the recording.
pub(crate) struct Armed {
    links: WindowLinks,
    canary: Option<Detach>,
    attacher: Attacher,
    fallback: Option<String>,
}

/// How a window's probes go in and out.
enum Attacher {
    /// One uprobe-multi link per module: closing it waits for the uprobe
    /// grace periods once for all points.
    Multi(MultiPrograms),
    /// aya's perf-event uprobe per point, each waiting on its own.
    PerPoint,
}

impl Attacher {
    fn kind(&self) -> WindowLinkKind {
        match self {
            Attacher::Multi(_) => WindowLinkKind::UprobeMulti,
            Attacher::PerPoint => WindowLinkKind::PerfEvent,
        }
    }

    fn default_period(&self) -> Duration {
        match self {
            Attacher::Multi(_) => DEFAULT_PERIOD_MULTI,
            Attacher::PerPoint => DEFAULT_PERIOD_PER_POINT,
        }
    }
}

/// Attaches the first window's probes and the first canary, with
/// uprobe-multi links unless `options` asks for per-point links or the
/// kernel refuses them (the reason goes into the report).
pub(crate) fn arm(
    ebpf: &mut Ebpf,
    target: &Target,
    functions: &[Placed],
    request_probe: Option<&RequestProbePoint>,
    options: &SampleOptions,
) -> Result<Armed> {
    let exited = |error| match error {
        AttachError::TargetExited => anyhow!("process {} exited", target.pid),
        AttachError::Failed(error) => error,
    };
    let (mut attacher, mut fallback) = match options.links {
        WindowLinkChoice::PerfEvent => (Attacher::PerPoint, None),
        WindowLinkChoice::Auto => match attach::load_multi(ebpf) {
            Ok(programs) => (Attacher::Multi(programs), None),
            Err(error) => (Attacher::PerPoint, Some(format!("{error:#}"))),
        },
    };
    let links = match attach_window(ebpf, &attacher, target, functions) {
        Err(AttachError::Failed(error)) if matches!(attacher, Attacher::Multi(_)) => {
            fallback = Some(format!("{error:#}"));
            attacher = Attacher::PerPoint;
            attach_window(ebpf, &attacher, target, functions).map_err(exited)?
        }
        attached => attached.map_err(exited)?,
    };
    // The request probe stays in all along (one hit a request): requests
    // count inside the windows, beside the locks, and over the whole
    // recording, which the windows' counts are scaled to.
    if let Some(point) = request_probe {
        attach::attach_request_probe(ebpf, target, point).map_err(exited)?;
    }
    if let Some(reason) = &fallback {
        log::warn!("sampling windows use a perf-event uprobe per point: {reason}");
    }
    let canary = attach_canary(ebpf, &attacher, target, functions)?;
    Ok(Armed {
        links,
        canary,
        attacher,
        fallback,
    })
}

/// A probe in locktrace's own process, attached the way the window's are
/// (see [`attach::attach_canary`]).
fn attach_canary(
    ebpf: &mut Ebpf,
    attacher: &Attacher,
    target: &Target,
    functions: &[Placed],
) -> Result<Option<Detach>> {
    match attacher {
        Attacher::PerPoint => Ok(
            attach::attach_canary(ebpf, target, functions)?.map(|link| Box::new(link) as Detach)
        ),
        Attacher::Multi(programs) => {
            let Some(first) = first_point(functions) else {
                return Ok(None);
            };
            let links =
                attach::attach_lock_probes_multi(programs, target, &first, std::process::id())
                    .map_err(|error| anyhow!("{error}"))?;
            Ok(links
                .into_iter()
                .next()
                .map(|link| Box::new(link) as Detach))
        }
    }
}

/// The first probe point of the first function that has one.
fn first_point(functions: &[Placed]) -> Option<Vec<Placed>> {
    functions.iter().find_map(|(function, placed)| {
        let point = *placed.points.first()?;
        let mut one = placed.clone();
        one.points = vec![point];
        Some(vec![(function.clone(), one)])
    })
}

/// Runs the duty cycle ([`cycle::run`]) until `end` resolves. The
/// request-boundary probe, if any, stays in from [`arm`] on: it counts
/// requests inside the windows, so requests and locks are counted over the
/// same time, and over the whole recording. `between_windows` runs before
/// each window opens and says whether the probes moved to another thread
/// (`trace::follow`): probes kept from the last window are then attached afresh.
pub(crate) async fn run<F>(
    ebpf: &mut Ebpf,
    target: &Target,
    functions: &[Placed],
    options: SampleOptions,
    armed: Armed,
    end: Pin<&mut F>,
    between_windows: &mut dyn FnMut(&mut Ebpf) -> bool,
) -> Result<(StopReason, SampledRun)>
where
    F: Future<Output = Result<StopReason>>,
{
    let started = tokio::time::Instant::now();
    let period = options.period.unwrap_or(armed.attacher.default_period());
    let mut jitter = Jitter::new();
    let run = new_run(&armed.attacher, armed.fallback, period);
    let mut probes = KernelProbes {
        ebpf,
        between_windows,
        target,
        functions,
        detacher: Detacher {
            links_per_window: armed.links.len(),
            ..Detacher::default()
        },
        attacher: armed.attacher,
        open: None,
        kept: Some(armed.links),
    };
    if let Some(canary) = armed.canary {
        probes.detacher.time(canary);
    }
    let mut jitter = || jitter.next();
    cycle::run(&mut probes, options.rate, run, &mut jitter, started, end).await
}

/// The windows' probes in the kernel: where they attach, the links of the
/// open window, those kept from the last window, and the detaches in flight.
struct KernelProbes<'a> {
    ebpf: &'a mut Ebpf,
    between_windows: &'a mut dyn FnMut(&mut Ebpf) -> bool,
    target: &'a Target,
    functions: &'a [Placed],
    attacher: Attacher,
    detacher: Detacher,
    /// The open window's links.
    open: Option<WindowLinks>,
    /// Links kept from the last window because detaching is too slow (at
    /// first, those [`arm`] attached for the first window).
    kept: Option<WindowLinks>,
}

impl WindowProbes for KernelProbes<'_> {
    fn open(&mut self) -> Result<bool> {
        self.open = match self.kept.take() {
            Some(links) => Some(links),
            None => open_window(self.ebpf, &self.attacher, self.target, self.functions)?,
        };
        Ok(self.open.is_some())
    }

    fn follow(&mut self) -> Result<bool> {
        let moved = (self.between_windows)(self.ebpf);
        if moved && let Some(links) = self.kept.take() {
            self.detacher.start(links.take(self.ebpf)?);
        }
        Ok(moved)
    }

    fn set_counting(&mut self, on: bool) -> Result<()> {
        set_counting(self.ebpf, on)
    }

    fn read_counts(&self) -> Result<Counts> {
        Ok(Counts {
            calls: collect::total_lock_calls(self.ebpf)?,
            requests: collect::request_probe_hits(self.ebpf).unwrap_or(0),
        })
    }

    fn detaching(&mut self) -> bool {
        self.detacher.busy()
    }

    fn too_slow_to_close(&mut self, gap: Duration) -> bool {
        self.detacher.too_slow_for(gap)
    }

    fn close(&mut self, keep: bool) -> Result<()> {
        let Some(links) = self.open.take() else {
            return Ok(());
        };
        if keep {
            self.kept = Some(links);
        } else {
            self.detacher.start(links.take(self.ebpf)?);
        }
        Ok(())
    }

    fn time_detach(&mut self) -> Result<()> {
        if self.detacher.wants_canary()
            && let Some(canary) =
                attach_canary(self.ebpf, &self.attacher, self.target, self.functions)?
        {
            self.detacher.time(canary);
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        for links in [self.open.take(), self.kept.take()].into_iter().flatten() {
            self.detacher.start(links.take(self.ebpf)?);
        }
        std::mem::take(&mut self.detacher).finish();
        Ok(())
    }
}

/// The run before its first window: how its windows are attached, and why
/// not as a uprobe-multi link if so.
fn new_run(attacher: &Attacher, fallback: Option<String>, period: Duration) -> SampledRun {
    SampledRun {
        window_links: attacher.kind(),
        window_links_fallback: fallback,
        period,
        ..SampledRun::default()
    }
}

/// Attaches a window's probes; None when the target exited between windows
/// (the recording ends).
fn open_window(
    ebpf: &mut Ebpf,
    attacher: &Attacher,
    target: &Target,
    functions: &[Placed],
) -> Result<Option<WindowLinks>> {
    match attach_window(ebpf, attacher, target, functions) {
        Ok(links) => Ok(Some(links)),
        Err(AttachError::TargetExited) => Ok(None),
        Err(AttachError::Failed(error)) => Err(error),
    }
}

/// Detaches links in the background, each on its own thread: a detach
/// waits for RCU grace periods in the kernel (a perf-event uprobe ~100 ms
/// on an idle machine, seconds on a loaded one; the program stops running
/// at once), and one after another they would take the next windows' time. Remembers how long
/// detaching took: the window links' own detaches, or, while links are kept
/// attached, a canary link's (see [`attach::attach_canary`]) times the
/// links in a window: the kernel detaches them one after another, even
/// from their own threads (6 perf-event links: done at 137, 217, 305, 377,
/// 477 and 569 ms, against a canary's 98 ms, on an idle machine).
#[derive(Default)]
struct Detacher {
    running: Vec<JoinHandle<Duration>>,
    canary: Option<JoinHandle<Duration>>,
    /// Links in one window (a canary's time is scaled by it).
    links_per_window: usize,
    /// How long detaching a window took, or is predicted to take.
    last: Option<Duration>,
    /// Windows kept attached since the last measurement.
    kept_since: u32,
}

impl Detacher {
    fn start(&mut self, links: Vec<Detach>) {
        for link in links {
            self.running.push(timed_drop(link));
        }
    }

    /// Whether to time a canary now: nothing measured yet, or links kept
    /// for a few windows (the load may have eased), and none in flight.
    fn wants_canary(&self) -> bool {
        self.canary.is_none() && (self.last.is_none() || self.kept_since >= 4)
    }

    fn time(&mut self, canary: Detach) {
        self.canary = Some(timed_drop(canary));
        self.kept_since = 0;
    }

    /// Whether the canary is done (or none runs); takes its time.
    fn canary_done(&mut self) -> bool {
        match self.canary.take() {
            Some(canary) if !canary.is_finished() => {
                self.canary = Some(canary);
                false
            }
            Some(canary) => {
                let links = u32::try_from(self.links_per_window.max(1)).unwrap_or(u32::MAX);
                self.last = canary
                    .join()
                    .ok()
                    .map(|one| one.saturating_mul(links))
                    .or(self.last);
                true
            }
            None => true,
        }
    }

    /// Whether one of the window links is still detaching; when all are
    /// done, takes the longest time.
    fn busy(&mut self) -> bool {
        if self.running.iter().any(|detach| !detach.is_finished()) {
            return true;
        }
        let longest = self
            .running
            .drain(..)
            .filter_map(|detach| detach.join().ok())
            .max();
        self.last = longest.or(self.last);
        false
    }

    /// Whether detaching now could delay the next window, `gap` away: the
    /// canary is still detaching, or the last detach took more than half
    /// of that (the load changes between one detach and the next). Counts the
    /// window as kept if so.
    fn too_slow_for(&mut self, gap: Duration) -> bool {
        let slow = !self.canary_done() || self.last.is_some_and(|last| last > gap / 2);
        if slow {
            self.kept_since += 1;
        }
        slow
    }

    fn finish(self) {
        for detach in self.running.into_iter().chain(self.canary) {
            let _ = detach.join();
        }
    }
}

/// A link that detaches its probes when dropped (a perf-event uprobe link
/// or a uprobe-multi link's fd).
type Detach = Box<dyn Send>;

fn timed_drop(link: Detach) -> JoinHandle<Duration> {
    std::thread::spawn(move || {
        let started = Instant::now();
        drop(link);
        let took = started.elapsed();
        log::debug!("a link detached in {took:?}");
        took
    })
}

/// The links of one window's lock probes.
enum WindowLinks {
    /// One uprobe-multi link per module.
    Multi(Vec<OwnedFd>),
    PerPoint(Vec<aya::programs::uprobe::UProbeLinkId>),
}

impl WindowLinks {
    fn len(&self) -> usize {
        match self {
            WindowLinks::Multi(links) => links.len(),
            WindowLinks::PerPoint(locks) => locks.len(),
        }
    }

    /// Takes the links out of the programs, so dropping them detaches.
    fn take(self, ebpf: &mut Ebpf) -> Result<Vec<Detach>> {
        Ok(match self {
            WindowLinks::Multi(links) => links
                .into_iter()
                .map(|link| Box::new(link) as Detach)
                .collect(),
            WindowLinks::PerPoint(locks) => {
                attach::take_links(ebpf, names::PROGRAM_LOCK_CALL, locks)?
                    .into_iter()
                    .map(|link| Box::new(link) as Detach)
                    .collect()
            }
        })
    }
}

fn attach_window(
    ebpf: &mut Ebpf,
    attacher: &Attacher,
    target: &Target,
    functions: &[Placed],
) -> Result<WindowLinks, AttachError> {
    match attacher {
        // A uprobe-multi link scoped to a process whose main thread exited
        // installs no breakpoints (the kernel's filter reads the exited
        // task's memory): then per point, bound to the live probe task.
        Attacher::Multi(programs) if target.probe_task() == target.pid => Ok(WindowLinks::Multi(
            attach::attach_lock_probes_multi(programs, target, functions, target.pid)?,
        )),
        Attacher::Multi(_) | Attacher::PerPoint => Ok(WindowLinks::PerPoint(
            attach::attach_lock_probes(ebpf, target, functions)?,
        )),
    }
}

/// Opens or closes a window: futex waits count all along, lock calls inside
/// windows. No wait for runs in progress: an increment landing just after the
/// close still counts in the totals (only the window's own tally, used for
/// the error bound, may miss it), and the windows stay on time.
fn set_counting(ebpf: &mut Ebpf, on: bool) -> Result<()> {
    let lock_calls = if on { counting::LOCK_CALLS } else { 0 };
    collect::switch_counting(ebpf, counting::WAITS | lock_calls).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A canary's detach time stands for one link; a window's links detach
    /// one after another, so the window is predicted to take that many times
    /// longer (idle: a canary 98 ms, a window's 6 links 569 ms; under load
    /// one such window's detach took a 4 s recording's other windows).
    #[test]
    fn a_window_of_many_links_is_predicted_from_the_canary_times_its_links() {
        let gap = Duration::from_millis(400);
        let canary_took = |one: Duration| std::thread::spawn(move || one);
        for (links, slow) in [(1, false), (6, true)] {
            let mut detacher = Detacher {
                links_per_window: links,
                ..Detacher::default()
            };
            detacher.canary = Some(canary_took(Duration::from_millis(98)));
            while !detacher
                .canary
                .as_ref()
                .is_some_and(JoinHandle::is_finished)
            {
                std::thread::yield_now();
            }
            assert_eq!(detacher.too_slow_for(gap), slow, "{links} links");
            assert_eq!(
                detacher.last,
                Some(Duration::from_millis(98 * links as u64))
            );
        }
    }
}
