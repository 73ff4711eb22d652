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
    pin::Pin,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::Result;
use aya::Ebpf;
use tracer_common::{counting, names};

use super::{
    attach::{self, AttachError, Placed, RequestProbePoint},
    collect,
};
use crate::{model::StopReason, probe::target::Target};

#[derive(Debug, Clone, Copy)]
pub struct SampleOptions {
    /// Fraction of the time the lock probes count (0 < rate <= 1).
    pub rate: f64,
    /// One window per period.
    pub period: Duration,
}

/// One counting window: when it began, how long it counted, the lock calls in it.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// When counting began, from the start of the recording.
    pub start: Duration,
    pub counted: Duration,
    pub calls: u64,
}

/// What a sampled run measured: its windows and its whole length.
#[derive(Debug, Clone)]
pub struct SampledRun {
    pub windows: Vec<Window>,
    pub total: Duration,
}

/// Runs the duty cycle until `end` resolves. The request-boundary probe, if
/// any, is attached in the same windows, so requests and locks are counted
/// over the same time (and it costs nothing outside them).
pub async fn run<F>(
    ebpf: &mut Ebpf,
    target: &Target,
    functions: &[Placed],
    request_probe: Option<&RequestProbePoint>,
    options: SampleOptions,
    mut end: Pin<&mut F>,
) -> Result<(StopReason, SampledRun)>
where
    F: Future<Output = Result<StopReason>>,
{
    let started = Instant::now();
    let on = options.period.mul_f64(options.rate);
    let mut jitter = Jitter::new();
    let mut windows: Vec<Window> = Vec::new();
    let mut previous_calls = 0u64;
    let mut detaching: Vec<JoinHandle<()>> = Vec::new();
    let stopped_by = 'periods: loop {
        let period_start = Instant::now();
        let offset = (options.period - on).mul_f64(jitter.next());
        tokio::select! {
            stopped = &mut end => break 'periods stopped?,
            _ = tokio::time::sleep(offset) => {}
        }
        // A probe of the last window that is still detaching would fire
        // alongside its new twin and count twice: wait until all are gone.
        while detaching.iter().any(|detach| !detach.is_finished()) {
            tokio::select! {
                stopped = &mut end => break 'periods stopped?,
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
        let links = match attach_window(ebpf, target, functions, request_probe) {
            Ok(links) => links,
            // The target exited between windows: the recording ends.
            Err(AttachError::TargetExited) => break 'periods StopReason::TargetExited,
            Err(AttachError::Failed(error)) => return Err(error),
        };
        set_counting(ebpf, true)?;
        let counting_since = Instant::now();
        let stopped = tokio::select! {
            stopped = &mut end => Some(stopped),
            _ = tokio::time::sleep(on) => None,
        };
        // Timed at the switch, not after the wait for running programs inside it.
        let counted = counting_since.elapsed();
        set_counting(ebpf, false)?;
        let calls = collect::total_lock_calls(ebpf)?;
        windows.push(Window {
            start: counting_since - started,
            counted,
            calls: calls - previous_calls,
        });
        previous_calls = calls;
        log::debug!(
            "sampling window {}: counted {counted:?} ({} calls)",
            windows.len(),
            calls
        );
        // Detach in the background: each detach waits ~110 ms in the kernel
        // (probes stop firing at once), and the end must be noticed on time.
        let owned = links.take(ebpf)?;
        detaching.push(std::thread::spawn(move || drop(owned)));
        if let Some(stopped) = stopped {
            break 'periods stopped?;
        }
        let rest = options.period.saturating_sub(period_start.elapsed());
        tokio::select! {
            stopped = &mut end => break 'periods stopped?,
            _ = tokio::time::sleep(rest) => {}
        }
    };
    let total = started.elapsed();
    for detach in detaching {
        let _ = detach.join();
    }
    Ok((stopped_by, SampledRun { windows, total }))
}

/// The links of one window's probes.
struct WindowLinks {
    locks: Vec<aya::programs::uprobe::UProbeLinkId>,
    request: Option<aya::programs::uprobe::UProbeLinkId>,
}

impl WindowLinks {
    /// Takes the links out of the programs, so dropping them detaches.
    fn take(self, ebpf: &mut Ebpf) -> Result<Vec<aya::programs::uprobe::UProbeLink>> {
        let mut owned = attach::take_links(ebpf, names::PROGRAM_LOCK_CALL, self.locks)?;
        owned.extend(attach::take_links(
            ebpf,
            names::PROGRAM_REQUEST_BOUNDARY,
            self.request.into_iter().collect(),
        )?);
        Ok(owned)
    }
}

fn attach_window(
    ebpf: &mut Ebpf,
    target: &Target,
    functions: &[Placed],
    request_probe: Option<&RequestProbePoint>,
) -> Result<WindowLinks, AttachError> {
    let locks = attach::attach_lock_probes(ebpf, target, functions)?;
    let request = request_probe
        .map(|point| attach::attach_request_probe(ebpf, target, point))
        .transpose()?;
    Ok(WindowLinks { locks, request })
}

/// Opens or closes a window: futex waits count all along, lock calls inside
/// windows. No wait for runs in progress: an increment landing just after the
/// close still counts in the totals (only the window's own tally, used for
/// the error bound, may miss it), and the windows stay on time.
fn set_counting(ebpf: &mut Ebpf, on: bool) -> Result<()> {
    let lock_calls = if on { counting::LOCK_CALLS } else { 0 };
    collect::switch_counting(ebpf, counting::WAITS | lock_calls).map(|_| ())
}

/// Small xorshift for window jitter (no need for a crate).
struct Jitter(u64);

impl Jitter {
    fn new() -> Jitter {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Jitter(seed | 1)
    }

    /// Uniform in [0, 1).
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}
