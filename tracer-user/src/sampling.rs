//! `--mode sampled`: the lock probes are attached only in windows covering a
//! fraction RATE of the time (the futex tracepoints stay on all the time),
//! and lock counts are scaled up by total time / counted time.
//!
//! Attaching a uprobe takes ~8 ms and detaching ~110 ms here, so a window's
//! probes are not all live at one instant. The BPF program therefore counts
//! only while `SAMPLING[0]` is set: userspace sets it after the last attach
//! and clears it before the first detach, and times exactly that interval.
//! Window starts are jittered inside each period so that a periodic workload
//! cannot alias with the sampling.
use std::{
    future::Future,
    pin::Pin,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow};
use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData},
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use serde::{Deserialize, Serialize};
use tracer_common::{LockCounts, cookie};

use crate::{lockfuncs::LockFunction, placement::PlacedFunction, target::Target};

#[derive(Debug, Clone, Copy)]
pub struct SampleOptions {
    /// Fraction of the time the lock probes count (0 < rate <= 1).
    pub rate: f64,
    /// One window per period.
    pub period: Duration,
}

/// What the JSON report says about a sampled run (`estimate`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Estimate {
    /// Which numbers are estimates: lock acquisitions and calls.
    pub estimated: Vec<String>,
    pub sample_rate: f64,
    pub windows: u32,
    /// Time the lock probes counted, and the whole recording.
    pub counted_s: f64,
    pub total_s: f64,
    /// Counts were multiplied by this (total_s / counted_s).
    pub scale: f64,
    /// Time before the first and after the last window: no rate was seen
    /// there, the estimate assumes the mean one.
    pub unsampled_edges_s: f64,
    /// Relative error bound of the total: 3 standard errors of the per-window
    /// rates and of the counts, plus the edges' share of the time (their rate
    /// could be anywhere from 0 to twice the mean). Each lock's
    /// `acquisitions_error` adds its own counting noise.
    pub relative_error: f64,
    /// Share of the counted windows' time the probe hits cost (hits × cost
    /// per hit / window time, for one thread). When large, the target ran
    /// slower while counted (a CPU-bound loop, not a paced server), so the
    /// estimate is low by up to that share, beyond `relative_error`.
    pub probe_time_share: f64,
}

/// One counting window: its length and the lock calls counted in it.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// When counting began, from the start of the recording.
    start: Duration,
    counted: Duration,
    calls: u64,
}

/// Runs the duty cycle until `end` resolves; returns its output and the estimate basis.
/// The request-boundary probe (module, file offset), if any, is attached in
/// the same windows, so it costs nothing outside them.
pub async fn run<F>(
    ebpf: &mut Ebpf,
    target: &Target,
    functions: &[(LockFunction, PlacedFunction)],
    request_probe: Option<&(String, u64)>,
    options: SampleOptions,
    mut end: Pin<&mut F>,
) -> Result<(&'static str, Estimate)>
where
    F: Future<Output = Result<&'static str>>,
{
    let started = Instant::now();
    let program: &mut UProbe = ebpf
        .program_mut("lock_call")
        .ok_or_else(|| anyhow!("BPF object lacks program lock_call (build is broken)"))?
        .try_into()?;
    program.load().context("loading the lock probe")?;
    if request_probe.is_some() {
        let program: &mut UProbe = ebpf
            .program_mut("request_boundary")
            .ok_or_else(|| anyhow!("BPF object lacks program request_boundary (build is broken)"))?
            .try_into()?;
        program.load().context("loading the request probe")?;
    }
    let scope = UProbeScope::OneProcess(
        std::num::NonZeroU32::new(target.pid).ok_or_else(|| anyhow!("pid 0 is not a process"))?,
    );
    let on = options.period.mul_f64(options.rate);
    let mut jitter = Jitter::new();
    let mut windows: Vec<Window> = Vec::new();
    let mut previous_calls = 0u64;
    let mut detaching = Vec::new();
    let stopped_by = 'periods: loop {
        let period_start = Instant::now();
        let offset = (options.period - on).mul_f64(jitter.next());
        tokio::select! {
            stopped = &mut end => break 'periods stopped?,
            _ = tokio::time::sleep(offset) => {}
        }
        // A probe of the last window that is still detaching would fire
        // alongside its new twin and count twice: wait until all are gone.
        while detaching
            .iter()
            .any(|detach: &std::thread::JoinHandle<()>| !detach.is_finished())
        {
            tokio::select! {
                stopped = &mut end => break 'periods stopped?,
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
        let program: &mut UProbe = ebpf
            .program_mut("lock_call")
            .expect("loaded above")
            .try_into()?;
        let mut links = Vec::new();
        for (function, placed) in functions {
            let module = target.host_path(&function.module);
            for point in &placed.points {
                let attach_point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(point.file_offset),
                    cookie: Some(cookie::encode(function.op, point.return_address_sp_offset)),
                };
                match program.attach(attach_point, &module, scope) {
                    Ok(link) => links.push(link),
                    // The target exited between windows: the recording ends.
                    Err(_) if !target.is_alive() => break 'periods "target_exited",
                    Err(error) => {
                        return Err(error).with_context(|| {
                            format!("attaching {} in {}", function.op.symbol(), function.module)
                        });
                    }
                }
            }
        }
        let mut request_links = Vec::new();
        if let Some((module, offset)) = request_probe {
            let program: &mut UProbe = ebpf
                .program_mut("request_boundary")
                .expect("loaded above")
                .try_into()?;
            match program.attach(
                UProbeAttachLocation::AbsoluteOffset(*offset),
                target.host_path(module),
                scope,
            ) {
                Ok(link) => request_links.push(link),
                Err(_) if !target.is_alive() => break 'periods "target_exited",
                Err(error) => {
                    return Err(error)
                        .with_context(|| format!("attaching the request probe in {module}"));
                }
            }
        }
        let attached = Instant::now();
        set_counting(ebpf, true)?;
        let counting_since = Instant::now();
        let stopped = tokio::select! {
            stopped = &mut end => Some(stopped),
            _ = tokio::time::sleep(on) => None,
        };
        set_counting(ebpf, false)?;
        let counted = counting_since.elapsed();
        let calls = total_calls(ebpf)?;
        windows.push(Window {
            start: counting_since - started,
            counted,
            calls: calls - previous_calls,
        });
        previous_calls = calls;
        // Detach in the background: each detach waits ~110 ms in the kernel
        // (probes stop firing at once), and the end must be noticed on time.
        let program: &mut UProbe = ebpf
            .program_mut("lock_call")
            .expect("loaded above")
            .try_into()?;
        let owned: Vec<_> = links
            .into_iter()
            .filter_map(|id| program.take_link(id).ok())
            .collect();
        let mut owned_requests = Vec::new();
        if !request_links.is_empty() {
            let program: &mut UProbe = ebpf
                .program_mut("request_boundary")
                .expect("loaded above")
                .try_into()?;
            owned_requests.extend(
                request_links
                    .into_iter()
                    .filter_map(|id| program.take_link(id).ok()),
            );
        }
        detaching.push(std::thread::spawn(move || drop((owned_requests, owned))));
        if std::env::var_os("LOCKTRACE_DEBUG_SAMPLING").is_some() {
            eprintln!(
                "sampling: window {}: attach {:?}, counted {:?} ({} calls), detach {:?}",
                windows.len(),
                attached - period_start - offset,
                counted,
                windows.last().map_or(0, |w| w.calls),
                attached.elapsed().saturating_sub(counted)
            );
        }
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
    let (calibration, _) = crate::overhead::calibration();
    let cost_per_hit = if functions
        .iter()
        .all(|(_, placed)| placed.points.iter().all(|p| p.emulated))
    {
        calibration.emulated_ns
    } else {
        calibration.stepped_ns
    };
    let mut estimate = estimate(&windows, total, options.rate);
    let hits: u64 = windows.iter().map(|w| w.calls).sum();
    estimate.probe_time_share =
        hits as f64 * cost_per_hit as f64 / (estimate.counted_s * 1e9).max(1.0);
    Ok((stopped_by, estimate))
}

fn set_counting(ebpf: &mut Ebpf, on: bool) -> Result<()> {
    let mut flag: Array<&mut MapData, u32> = Array::try_from(
        ebpf.map_mut("SAMPLING")
            .ok_or_else(|| anyhow!("BPF object lacks map SAMPLING"))?,
    )?;
    flag.set(0, u32::from(on), 0)
        .context("switching sampling")?;
    Ok(())
}

fn total_calls(ebpf: &Ebpf) -> Result<u64> {
    let locks: BpfHashMap<&MapData, u64, LockCounts> = BpfHashMap::try_from(
        ebpf.map("LOCKS")
            .ok_or_else(|| anyhow!("BPF object lacks map LOCKS"))?,
    )?;
    let mut total = 0u64;
    for entry in locks.iter() {
        let (_, counts) = entry.context("reading map LOCKS")?;
        total += counts.calls.iter().sum::<u64>();
    }
    Ok(total)
}

fn estimate(windows: &[Window], total: Duration, rate: f64) -> Estimate {
    let counted: f64 = windows.iter().map(|w| w.counted.as_secs_f64()).sum();
    let total_s = total.as_secs_f64();
    let edges = match (windows.first(), windows.last()) {
        (Some(first), Some(last)) => {
            (first.start + total.saturating_sub(last.start + last.counted)).as_secs_f64()
        }
        _ => total_s,
    };
    let scale = if counted > 0.0 {
        total_s / counted
    } else {
        0.0
    };
    Estimate {
        estimated: vec![
            "locks[].acquisitions".into(),
            "locks[].calls".into(),
            "totals.acquisitions".into(),
            "requests (counted over the same windows)".into(),
        ],
        sample_rate: rate,
        windows: windows.len() as u32,
        counted_s: counted,
        total_s,
        scale,
        unsampled_edges_s: edges,
        probe_time_share: 0.0,
        relative_error: (relative_error(windows, counted, total_s) + edges / total_s.max(1e-9))
            .min(1.0),
    }
}

/// 3 standard errors of the mean per-window rate, relative, with the finite
/// population correction; 1.0 (no better than ±100 %) with fewer than 2 windows.
fn relative_error(windows: &[Window], counted: f64, total: f64) -> f64 {
    let rates: Vec<f64> = windows
        .iter()
        .filter(|w| !w.counted.is_zero())
        .map(|w| w.calls as f64 / w.counted.as_secs_f64())
        .collect();
    let n = rates.len() as f64;
    let calls: u64 = windows.iter().map(|w| w.calls).sum();
    if rates.len() < 2 || calls == 0 {
        return 1.0;
    }
    let mean = calls as f64 / counted;
    let variance = rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let coverage = (counted / total).clamp(0.0, 1.0);
    let window_term = 3.0 * variance.sqrt() / mean / n.sqrt() * (1.0 - coverage).sqrt();
    // Never claim better than the counting noise of the total.
    let counting_term = 3.0 / (calls as f64).sqrt();
    window_term.hypot(counting_term).min(1.0)
}

/// Per-lock absolute error bound for a scaled count `calls_counted`.
pub fn lock_error(estimate: &Estimate, counted_calls: u64) -> u64 {
    let relative = estimate
        .relative_error
        .hypot(3.0 / (counted_calls.max(1) as f64).sqrt())
        .min(1.0);
    (counted_calls as f64 * estimate.scale * relative).ceil() as u64
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

/// Scales the counted lock calls (and callers) of a sampled run to the whole recording.
pub fn scale(collected: &mut crate::collect::Collected, estimate: &Estimate) {
    let scaled = |n: u64| (n as f64 * estimate.scale).round() as u64;
    for counts in collected.locks.values_mut() {
        for calls in &mut counts.calls {
            *calls = scaled(*calls);
        }
    }
    for count in collected.callers.values_mut() {
        *count = scaled(*count);
    }
    collected.requests = scaled(collected.requests);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_windows_give_a_tight_bound() {
        let windows: Vec<Window> = (0..10)
            .map(|i| Window {
                start: Duration::from_millis(i * 1000),
                counted: Duration::from_millis(100),
                calls: 100_000 + i * 100,
            })
            .collect();
        let estimate = estimate(&windows, Duration::from_millis(9100), 0.1);
        assert!((estimate.scale - 9.1).abs() < 1e-9);
        assert!(
            estimate.relative_error < 0.01,
            "{}",
            estimate.relative_error
        );
        assert_eq!(estimate.windows, 10);
    }

    #[test]
    fn one_window_claims_nothing() {
        let windows = [Window {
            start: Duration::ZERO,
            counted: Duration::from_millis(100),
            calls: 5,
        }];
        assert_eq!(
            estimate(&windows, Duration::from_secs(1), 0.1).relative_error,
            1.0
        );
    }
}
