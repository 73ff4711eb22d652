//! The duty cycle of `--mode sampled`, apart from the kernel: when a window
//! opens, warms up, counts and closes, what it counted, and when the cycle
//! ends. What it does to the kernel goes through [`WindowProbes`] (aya's
//! links in [`super::KernelProbes`], a fake in the unit tests); it reads
//! time only through `tokio::time` (the real clock, or tokio's paused one
//! in the unit tests, which makes the schedule exact and needs no root).
use std::{future::Future, pin::Pin, time::Duration};

use anyhow::Result;
use tokio::time::Instant;

use super::WARMUP;
use crate::model::{CountingWindow, SampledRun, StopReason};

/// What the duty cycle does to the kernel.
pub(crate) trait WindowProbes {
    /// Attaches the next window's lock probes, or takes those kept attached
    /// from the last window; false when the target exited.
    fn open(&mut self) -> Result<bool>;
    /// Runs the step between windows (`trace::follow`): whether the probes
    /// moved to another thread. If so, probes kept from the last window are
    /// detached (bound to a thread that left, they would not count).
    fn follow(&mut self) -> Result<bool>;
    /// Turns the counting of lock calls (and requests) on or off; futex
    /// waits count all along.
    fn set_counting(&mut self, on: bool) -> Result<()>;
    /// Lock calls and requests counted so far.
    fn read_counts(&self) -> Result<Counts>;
    /// Whether probes of an earlier window are still detaching.
    fn detaching(&mut self) -> bool;
    /// Whether detaching the window's probes now could delay the next
    /// window, `gap` away.
    fn too_slow_to_close(&mut self, gap: Duration) -> bool;
    /// Closes the open window: its probes kept attached (`keep`, not
    /// counting) or detached in the background.
    fn close(&mut self, keep: bool) -> Result<()>;
    /// Times a detach for the next window's decision, when one is wanted.
    fn time_detach(&mut self) -> Result<()>;
    /// Detaches what is still attached and waits for every detach.
    fn finish(&mut self) -> Result<()>;
}

/// Lock calls and requests counted since the probes were loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub calls: u64,
    pub requests: u64,
}

/// Runs the duty cycle until `end` resolves, a window cannot be opened
/// because the target exited, or an error: one window of `rate` a period
/// (`run.period`), the first at once, the later ones at `jitter()` (in
/// [0, 1)) of the period's free time. `run` comes with its period and
/// links; it goes back with its windows and its length from `started`.
pub(crate) async fn run<F>(
    probes: &mut impl WindowProbes,
    rate: f64,
    mut run: SampledRun,
    jitter: &mut dyn FnMut() -> f64,
    started: Instant,
    mut end: Pin<&mut F>,
) -> Result<(StopReason, SampledRun)>
where
    F: Future<Output = Result<StopReason>>,
{
    let period = run.period;
    let on = period.mul_f64(rate);
    let counting_rate = counting_rate(rate, period);
    // Lock calls and requests counted before the current window.
    let mut previous = Counts::default();
    let mut failed_in_a_row = 0;
    let stopped_by = 'periods: loop {
        let period_start = Instant::now();
        // The first window opens at once: time before it is an unsampled
        // edge that widens the bound; later ones are jittered.
        let offset = if run.windows.is_empty() {
            Duration::ZERO
        } else {
            (period - on).mul_f64(jitter())
        };
        if let Some(stopped) = wait_to_open(offset, probes, &mut end).await {
            break 'periods stopped?;
        }
        let attaching = Instant::now();
        match open(probes)? {
            Opened::Yes => failed_in_a_row = 0,
            Opened::TargetExited => break 'periods StopReason::TargetExited,
            Opened::Failed(error) => {
                failed_in_a_row += 1;
                if failed_in_a_row >= FAILED_OPENS_TO_GIVE_UP {
                    return Err(error);
                }
                log::warn!("sampling window skipped: {error:#}");
                run.windows_not_attached += 1;
                run.window_attach_failure = Some(format!("{error:#}"));
                let rest = period.saturating_sub(period_start.elapsed());
                tokio::select! {
                    stopped = &mut end => break 'periods stopped?,
                    _ = tokio::time::sleep(rest) => {}
                }
                continue;
            }
        }
        // Counting starts once the target runs at its probed pace.
        let warmed_up = tokio::select! {
            stopped = &mut end => Some(stopped),
            _ = tokio::time::sleep(WARMUP) => None,
        };
        if let Some(stopped) = warmed_up {
            break 'periods stopped?;
        }
        probes.set_counting(true)?;
        let counting_since = Instant::now();
        let length = window_length(
            counting_rate,
            period,
            counting_since - started,
            counted_so_far(&run.windows),
        );
        log::debug!(
            "sampling window {}: at {:?}, attached in {:?}, counting {length:?}",
            run.windows.len() + 1,
            counting_since - started,
            attaching.elapsed()
        );
        let stopped = tokio::select! {
            stopped = &mut end => Some(stopped),
            _ = tokio::time::sleep(length) => None,
        };
        close_window(
            probes,
            &mut run,
            &mut previous,
            counting_since - started,
            counting_since,
        )?;
        // The next window would wait for this detach: keep the probes
        // (not counting: the flag is off) and say so in the report.
        let keep = stopped.is_none() && probes.too_slow_to_close(period.saturating_sub(length));
        release(probes, keep, &mut run)?;
        if let Some(stopped) = stopped {
            break 'periods stopped?;
        }
        let rest = period.saturating_sub(period_start.elapsed());
        tokio::select! {
            stopped = &mut end => break 'periods stopped?,
            _ = tokio::time::sleep(rest) => {}
        }
    };
    run.total = started.elapsed();
    probes.finish()?;
    Ok((stopped_by, run))
}

/// Whether the next window's probes went in.
enum Opened {
    Yes,
    TargetExited,
    /// The kernel refused an attach (5.10 refused one `perf_event_open` in
    /// a few hundred windows under TCG): the window is skipped, said in the
    /// report, and the next one tried.
    Failed(anyhow::Error),
}

/// Attach failures in a row that end the recording with the last one's error.
const FAILED_OPENS_TO_GIVE_UP: u32 = 3;

/// Opens the next window. An attach that fails after the main thread left
/// (its files went with it) is tried once more, from a live thread.
fn open(probes: &mut impl WindowProbes) -> Result<Opened> {
    let attempt = |probes: &mut dyn FnMut() -> Result<bool>| match probes() {
        Ok(true) => Opened::Yes,
        Ok(false) => Opened::TargetExited,
        Err(error) => Opened::Failed(error),
    };
    match attempt(&mut || probes.open()) {
        Opened::Failed(error) => {
            if probes.follow()? {
                Ok(attempt(&mut || probes.open()))
            } else {
                Ok(Opened::Failed(error))
            }
        }
        opened => Ok(opened),
    }
}

/// After a window: its probes kept (`keep`, counted in the run) or
/// detached, the step between windows, and a detach timed when wanted.
fn release(probes: &mut impl WindowProbes, keep: bool, run: &mut SampledRun) -> Result<()> {
    if keep {
        run.windows_kept_attached += 1;
    }
    probes.close(keep)?;
    probes.follow()?;
    // Measures the detach time for the next window's decision.
    probes.time_detach()
}

/// Waits `offset`, then until the last window's probes are all detached: one
/// still detaching would fire alongside its new twin and count twice.
/// The end's outcome if it comes first.
async fn wait_to_open<F>(
    offset: Duration,
    probes: &mut impl WindowProbes,
    end: &mut Pin<&mut F>,
) -> Option<Result<StopReason>>
where
    F: Future<Output = Result<StopReason>>,
{
    tokio::select! {
        stopped = end.as_mut() => return Some(stopped),
        _ = tokio::time::sleep(offset) => {}
    }
    while probes.detaching() {
        tokio::select! {
            stopped = end.as_mut() => return Some(stopped),
            _ = tokio::time::sleep(DETACH_POLL) => {}
        }
    }
    None
}

/// How often a window waiting to open asks whether the last one detached.
const DETACH_POLL: Duration = Duration::from_millis(5);

/// Stops counting and adds the window to the run: how long it counted, and
/// the lock calls and requests since the previous window (`previous`).
fn close_window(
    probes: &mut impl WindowProbes,
    run: &mut SampledRun,
    previous: &mut Counts,
    start: Duration,
    counting_since: Instant,
) -> Result<()> {
    // Timed at the switch, not after the wait for running programs inside it.
    let counted = counting_since.elapsed();
    probes.set_counting(false)?;
    let counts = probes.read_counts()?;
    let window = CountingWindow {
        start,
        counted,
        calls: counts.calls - previous.calls,
        requests: counts.requests - previous.requests,
    };
    log::debug!(
        "sampling window closed: at {start:?}, counted {counted:?}, {} lock calls, {} requests",
        window.calls,
        window.requests
    );
    run.windows.push(window);
    *previous = counts;
    Ok(())
}

/// The share of the time a window counts. `--sample` is the share of the
/// time the probes are in, which is what the target pays, so a window's
/// warm-up comes out of it; but a window counts for at least half its
/// share (below 40 ms of probes a window, the warm-up is longer than the
/// rate asks).
fn counting_rate(rate: f64, period: Duration) -> f64 {
    if rate >= 1.0 {
        return rate;
    }
    let on = period.mul_f64(rate);
    let counting = on.saturating_sub(WARMUP).max(on / 2);
    counting.as_secs_f64() / period.as_secs_f64()
}

fn counted_so_far(windows: &[CountingWindow]) -> Duration {
    windows.iter().map(|window| window.counted).sum()
}

/// How long a window counts: its share of the period, longer when earlier
/// windows were late or lost (slow detaches on a loaded machine), so that
/// the counted time stays the sample rate of the elapsed time; at most a
/// period. `now` is the window's start from the start of the recording.
fn window_length(rate: f64, period: Duration, now: Duration, counted: Duration) -> Duration {
    let on = period.mul_f64(rate);
    if rate >= 1.0 {
        return on;
    }
    // Counting L more makes counted + L = rate × (now + L).
    let behind = (rate * now.as_secs_f64() - counted.as_secs_f64()) / (1.0 - rate);
    Duration::from_secs_f64(behind.clamp(on.as_secs_f64(), period.as_secs_f64()))
}

/// Small xorshift for window jitter (no need for a crate).
pub(crate) struct Jitter(u64);

impl Jitter {
    pub(crate) fn new() -> Jitter {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Jitter(seed | 1)
    }

    /// Uniform in [0, 1).
    pub(crate) fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use anyhow::anyhow;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// What the cycle did to the probes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Event {
        /// A window's probes in: attached afresh, or the ones kept.
        Open,
        /// An open that found the target gone.
        Exited,
        OpenFailed,
        Follow {
            moved: bool,
        },
        Counting(bool),
        Close {
            keep: bool,
        },
        Finish,
    }

    /// Probes on a steady target and tokio's clock: while counting, it makes
    /// `calls_per_s` lock calls and `requests_per_s` requests a second. The
    /// kernel's answers are scripted: each queue's front answers the next
    /// call, and an empty queue answers the usual (opens, no thread moved,
    /// detaches fast).
    struct FakeProbes {
        start: Instant,
        calls_per_s: u64,
        requests_per_s: u64,
        opens: VecDeque<Result<bool, &'static str>>,
        moves: VecDeque<bool>,
        /// How many times `detaching` says yes after a window's probes
        /// were detached (5 ms each), and how many are left.
        detach_polls: u32,
        busy_polls: u32,
        slow: VecDeque<bool>,
        /// The gaps `too_slow_to_close` was asked about.
        gaps: Vec<Duration>,
        /// Probes attached afresh (not the ones kept).
        attaches: u32,
        attached: bool,
        window_open: bool,
        counting_since: Option<Instant>,
        counted: Counts,
        events: Vec<(Duration, Event)>,
    }

    impl FakeProbes {
        fn new() -> FakeProbes {
            FakeProbes {
                start: Instant::now(),
                calls_per_s: 1_000_000,
                requests_per_s: 1_000,
                opens: VecDeque::new(),
                moves: VecDeque::new(),
                detach_polls: 0,
                busy_polls: 0,
                slow: VecDeque::new(),
                gaps: Vec::new(),
                attaches: 0,
                attached: false,
                window_open: false,
                counting_since: None,
                counted: Counts::default(),
                events: Vec::new(),
            }
        }

        fn opens(mut self, opens: &[Result<bool, &'static str>]) -> FakeProbes {
            self.opens = opens.iter().copied().collect();
            self
        }

        fn log(&mut self, event: Event) {
            self.events.push((self.start.elapsed(), event));
        }

        /// When `event` happened, from the start.
        fn at(&self, event: Event) -> Vec<Duration> {
            let times = self.events.iter().filter(|(_, e)| *e == event);
            times.map(|(at, _)| *at).collect()
        }

        /// Counts made in `time` of counting.
        fn made_in(&self, time: Duration) -> Counts {
            let made = |per_s: u64| (time.as_nanos() * u128::from(per_s) / 1_000_000_000) as u64;
            Counts {
                calls: made(self.calls_per_s),
                requests: made(self.requests_per_s),
            }
        }

        /// Nothing attached, nothing counting, and every detach waited for.
        fn closed(&self) -> bool {
            !self.attached
                && self.counting_since.is_none()
                && self.events.last().map(|(_, e)| *e) == Some(Event::Finish)
        }
    }

    impl WindowProbes for FakeProbes {
        fn open(&mut self) -> Result<bool> {
            match self.opens.pop_front().unwrap_or(Ok(true)) {
                Err(error) => {
                    self.log(Event::OpenFailed);
                    Err(anyhow!(error))
                }
                Ok(false) => {
                    self.log(Event::Exited);
                    Ok(false)
                }
                Ok(true) => {
                    if !self.attached {
                        self.attaches += 1;
                    }
                    (self.attached, self.window_open) = (true, true);
                    self.log(Event::Open);
                    Ok(true)
                }
            }
        }

        fn follow(&mut self) -> Result<bool> {
            let moved = self.moves.pop_front().unwrap_or(false);
            if moved && !self.window_open {
                self.attached = false;
            }
            self.log(Event::Follow { moved });
            Ok(moved)
        }

        fn set_counting(&mut self, on: bool) -> Result<()> {
            if let Some(since) = self.counting_since.take() {
                let made = self.made_in(since.elapsed());
                self.counted.calls += made.calls;
                self.counted.requests += made.requests;
            }
            self.counting_since = on.then(Instant::now);
            self.log(Event::Counting(on));
            Ok(())
        }

        fn read_counts(&self) -> Result<Counts> {
            let running = self.made_in(self.counting_since.map_or(Duration::ZERO, |s| s.elapsed()));
            Ok(Counts {
                calls: self.counted.calls + running.calls,
                requests: self.counted.requests + running.requests,
            })
        }

        fn detaching(&mut self) -> bool {
            let busy = self.busy_polls > 0;
            self.busy_polls = self.busy_polls.saturating_sub(1);
            busy
        }

        fn too_slow_to_close(&mut self, gap: Duration) -> bool {
            self.gaps.push(gap);
            self.slow.pop_front().unwrap_or(false)
        }

        fn close(&mut self, keep: bool) -> Result<()> {
            self.window_open = false;
            self.attached = keep;
            if !keep {
                self.busy_polls = self.detach_polls;
            }
            self.log(Event::Close { keep });
            Ok(())
        }

        fn time_detach(&mut self) -> Result<()> {
            Ok(())
        }

        fn finish(&mut self) -> Result<()> {
            (self.attached, self.window_open) = (false, false);
            self.log(Event::Finish);
            Ok(())
        }
    }

    /// Runs the cycle of `--sample rate --sample-period period` on `probes`,
    /// the later windows at `jitter` of the free time (in turn, over and
    /// over), until `stop` (when, why), if it comes.
    async fn cycle(
        probes: &mut FakeProbes,
        rate: f64,
        period: Duration,
        jitter: &[f64],
        stop: Option<(Duration, StopReason)>,
    ) -> Result<(StopReason, SampledRun)> {
        let mut fractions = jitter.iter().copied().cycle();
        let mut jitter = || fractions.next().unwrap_or(0.0);
        let end = async move {
            match stop {
                Some((at, reason)) => {
                    tokio::time::sleep(at).await;
                    Ok(reason)
                }
                None => std::future::pending().await,
            }
        };
        tokio::pin!(end);
        let run = SampledRun {
            period,
            ..SampledRun::default()
        };
        let started = probes.start;
        super::run(probes, rate, run, &mut jitter, started, end).await
    }

    /// One window a period, the first at once, each later one at its jitter
    /// of the period's free time (period − rate × period); the probes are
    /// in for rate × period, the warm-up (20 ms) then the counting, except
    /// below 40 ms, where a window counts for half its share.
    #[tokio::test(start_paused = true)]
    async fn windows_open_and_close_on_the_schedule_the_flags_ask_for() {
        // rate, period, jitter, counting, opens (ms), the exit's open (ms).
        let schedules = [
            // 100 ms in (20 warm-up, 80 counting), 900 ms free.
            (0.1, 1000, [0.5, 0.25], 80, [0, 1450, 2225], 3450),
            // 50 ms in (20 + 30), 150 ms free.
            (0.25, 200, [0.2, 0.6], 30, [0, 230, 490], 630),
            // 30 ms asked: counts 15 ms, in for 35 ms; 970 ms free.
            (0.03, 1000, [0.5, 0.2], 15, [0, 1485, 2194], 3485),
        ];
        for (rate, period, jitter, counting, opens, exit) in schedules {
            // The target exits at the fourth window's open.
            let mut probes = FakeProbes::new().opens(&[Ok(true), Ok(true), Ok(true), Ok(false)]);
            let (stopped_by, run) = cycle(&mut probes, rate, ms(period), &jitter, None)
                .await
                .unwrap();
            let what = format!("--sample {rate} --sample-period {period}ms");
            assert_eq!(stopped_by, StopReason::TargetExited, "{what}");
            assert_eq!(probes.at(Event::Open), opens.map(ms), "{what}");
            assert_eq!(probes.at(Event::Exited), [ms(exit)], "{what}");
            let counting_on = opens.map(|open| ms(open + 20));
            let closes = opens.map(|open| ms(open + 20 + counting));
            assert_eq!(probes.at(Event::Counting(true)), counting_on, "{what}");
            assert_eq!(probes.at(Event::Counting(false)), closes, "{what}");
            assert_eq!(probes.at(Event::Close { keep: false }), closes, "{what}");
            assert_eq!(probes.gaps, [ms(period - counting); 3], "{what}");
            let made = probes.made_in(ms(counting));
            let windows: Vec<_> = run.windows.iter().map(|w| (w.start, w.counted)).collect();
            assert_eq!(windows, counting_on.map(|on| (on, ms(counting))), "{what}");
            assert!(
                run.windows
                    .iter()
                    .all(|w| (w.calls, w.requests) == (made.calls, made.requests)),
                "{what}: {:?}",
                run.windows
            );
            assert_eq!(run.total, ms(exit), "{what}");
            assert_eq!(run.windows_kept_attached, 0, "{what}");
            assert_eq!(probes.attaches, 3, "{what}");
            assert!(probes.closed(), "{what}: {:?}", probes.events);
        }
    }

    /// The end that comes while a window counts closes it at once: it
    /// counts what it counted so far. One during the warm-up adds no
    /// window; one between windows leaves the last whole.
    #[tokio::test(start_paused = true)]
    async fn the_end_cuts_the_last_window_where_it_comes() {
        // The second window is in from 1450 ms, counts from 1470 to 1550.
        for (end, windows, last_counted) in [(1500, 2, 30), (1460, 1, 80), (1700, 2, 80)] {
            let mut probes = FakeProbes::new();
            let stop = Some((ms(end), StopReason::Duration));
            let (stopped_by, run) = cycle(&mut probes, 0.1, ms(1000), &[0.5], stop)
                .await
                .unwrap();
            assert_eq!(stopped_by, StopReason::Duration, "end at {end} ms");
            assert_eq!(run.total, ms(end), "end at {end} ms");
            assert_eq!(run.windows.len(), windows, "end at {end} ms");
            let last = run.windows.last().unwrap();
            assert_eq!(last.counted, ms(last_counted), "end at {end} ms");
            let made = probes.made_in(ms(last_counted));
            assert_eq!((last.calls, last.requests), (made.calls, made.requests));
            // The cut window is detached, not kept: nothing follows it.
            let cut_at = ms(end.min(1550));
            if end == 1500 {
                assert_eq!(probes.at(Event::Close { keep: false }), [ms(100), cut_at]);
                assert_eq!(probes.gaps, [ms(920)], "only the whole window asks");
            }
            assert_eq!(probes.at(Event::Finish), [ms(end)]);
            assert!(probes.closed(), "end at {end} ms: {:?}", probes.events);
        }
    }

    /// A window whose probes cannot be attached is skipped and said in the
    /// run (the next period tries again), unless the probes moved to a live
    /// thread: then the attach is tried once more from there. Three refusals
    /// in a row end the recording with the last one's error (no report, and
    /// no wait for the detaches: the error goes straight up).
    #[tokio::test(start_paused = true)]
    async fn a_window_that_cannot_be_opened_is_skipped_and_said() {
        let failed = Err("attach failed");
        // Follow runs after each window and after a failed open.
        let mut probes = FakeProbes::new().opens(&[Ok(true), failed, Ok(true), Ok(false)]);
        let (stopped_by, run) = cycle(&mut probes, 0.1, ms(1000), &[0.5], None)
            .await
            .unwrap();
        assert_eq!(stopped_by, StopReason::TargetExited);
        assert_eq!(probes.at(Event::OpenFailed), [ms(1450)]);
        // The skipped period ends at 2000 ms; the next window opens at 2450.
        assert_eq!(probes.at(Event::Open), [ms(0), ms(2450)]);
        assert_eq!(run.windows.len(), 2);
        assert_eq!(run.windows[1].start, ms(2470));
        assert_eq!(run.windows_not_attached, 1);
        assert_eq!(run.window_attach_failure.as_deref(), Some("attach failed"));

        // Three in a row: the last one's error.
        let mut probes = FakeProbes::new().opens(&[Ok(true), failed, failed, Err("third")]);
        let error = cycle(&mut probes, 0.1, ms(1000), &[0.5], None)
            .await
            .unwrap_err();
        assert_eq!(error.to_string(), "third");
        assert_eq!(probes.at(Event::OpenFailed), [ms(1450), ms(2450), ms(3450)]);
        assert!(probes.at(Event::Finish).is_empty());

        // The main thread left: tried again at once, from a live thread.
        let mut probes = FakeProbes::new().opens(&[Ok(true), failed, Ok(true), Ok(false)]);
        probes.moves = [false, true].into();
        let (stopped_by, run) = cycle(&mut probes, 0.1, ms(1000), &[0.5], None)
            .await
            .unwrap();
        assert_eq!(stopped_by, StopReason::TargetExited);
        assert_eq!(probes.at(Event::Open), [ms(0), ms(1450)]);
        assert_eq!(run.windows.len(), 2);
        assert_eq!(run.windows[1].start, ms(1470));
        assert_eq!(run.windows_not_attached, 0);
    }

    /// The duration, a stop signal and the target's exit (seen by the end,
    /// or by an open) each end the cycle with the reason they give, the
    /// probes detached and not counting, kept ones included.
    #[tokio::test(start_paused = true)]
    async fn every_stop_reason_ends_the_cycle_with_the_probes_closed() {
        // (reason, when, the window's probes kept after the first window).
        let stops = [
            (StopReason::Duration, 1500, false),
            (StopReason::Interrupted, 1700, false),
            (StopReason::TargetExited, 1460, false),
            (StopReason::Interrupted, 1200, true),
            (StopReason::TargetExited, 1300, true),
        ];
        for (reason, at, kept) in stops {
            let mut probes = FakeProbes::new();
            probes.slow = [kept].into();
            let (stopped_by, run) =
                cycle(&mut probes, 0.1, ms(1000), &[0.5], Some((ms(at), reason)))
                    .await
                    .unwrap();
            let what = format!("{reason:?} at {at} ms");
            assert_eq!(stopped_by, reason, "{what}");
            assert_eq!(run.total, ms(at), "{what}");
            assert_eq!(run.windows_kept_attached, u32::from(kept), "{what}");
            assert!(probes.closed(), "{what}: {:?}", probes.events);
        }
        // The exit seen when the second window's probes go in.
        let mut probes = FakeProbes::new().opens(&[Ok(true), Ok(false)]);
        let (stopped_by, run) = cycle(&mut probes, 0.1, ms(1000), &[0.5], None)
            .await
            .unwrap();
        assert_eq!(stopped_by, StopReason::TargetExited);
        assert_eq!(run.total, ms(1450));
        assert!(probes.closed(), "{:?}", probes.events);
    }

    /// A detach too slow for the gap to the next window keeps the probes
    /// in (counted in the report), and the next window takes them; kept
    /// probes are detached when the probes move to another thread. The
    /// next window waits for a detach still running.
    #[tokio::test(start_paused = true)]
    async fn slow_detaches_keep_the_probes_in_and_windows_wait_for_detaches() {
        let mut probes = FakeProbes::new().opens(&[Ok(true), Ok(true), Ok(true), Ok(false)]);
        probes.slow = [true, false].into();
        let (_, run) = cycle(&mut probes, 0.1, ms(1000), &[0.5], None)
            .await
            .unwrap();
        assert_eq!(run.windows_kept_attached, 1);
        assert_eq!(probes.at(Event::Close { keep: true }), [ms(100)]);
        assert_eq!(
            probes.at(Event::Close { keep: false }),
            [ms(1550), ms(2550)]
        );
        // The second window took the first's probes.
        assert_eq!(probes.at(Event::Open), [ms(0), ms(1450), ms(2450)]);
        assert_eq!(probes.attaches, 2);

        // Moved to another thread: the kept probes go, the next attaches afresh.
        let mut probes = FakeProbes::new().opens(&[Ok(true), Ok(true), Ok(false)]);
        probes.slow = [true].into();
        probes.moves = [true].into();
        cycle(&mut probes, 0.1, ms(1000), &[0.5], None)
            .await
            .unwrap();
        assert_eq!(probes.attaches, 2);

        // Three 5 ms polls before the last detach is done.
        let mut probes = FakeProbes::new().opens(&[Ok(true), Ok(true), Ok(false)]);
        probes.detach_polls = 3;
        cycle(&mut probes, 0.1, ms(1000), &[0.5], None)
            .await
            .unwrap();
        assert_eq!(probes.at(Event::Open), [ms(0), ms(1465)]);
    }

    /// A window late by a long detach counts longer, so that the counted
    /// time stays the counting rate (8 %) of the elapsed time.
    #[tokio::test(start_paused = true)]
    async fn a_late_window_counts_longer_to_keep_the_rate() {
        let mut probes = FakeProbes::new().opens(&[Ok(true), Ok(true), Ok(false)]);
        // The second window waits 565 ms for the first's detach: it counts
        // from 2035 ms, and 80 + L = 0.08 × (2035 + L) gives L = 90 ms.
        probes.detach_polls = 113;
        let (_, run) = cycle(&mut probes, 0.1, ms(1000), &[0.5], None)
            .await
            .unwrap();
        assert_eq!(run.windows[1].start, ms(2035));
        assert_eq!(run.windows[1].counted, ms(90));
        let closed = probes.at(Event::Counting(false))[1];
        assert_eq!(closed, ms(2125));
        let counted = counted_so_far(&run.windows).as_secs_f64();
        assert!((counted / closed.as_secs_f64() - 0.08).abs() < 1e-12);
        // The next period starts at once (this one is over), and its
        // window waits for this one's detach too.
        assert_eq!(probes.at(Event::Exited), [ms(2125 + 450 + 565)]);
    }

    /// What a steady target (1 M lock calls and 1000 requests a second)
    /// gives over 3.8 s: four equal windows, the run the model scales
    /// (`analysis::estimate`'s `four_cycle_windows_scale_back_to_the_truth`
    /// takes this run as its input).
    #[tokio::test(start_paused = true)]
    async fn a_steady_target_gives_four_equal_windows() {
        let mut probes = FakeProbes::new();
        let stop = Some((ms(3800), StopReason::Duration));
        let (_, run) = cycle(&mut probes, 0.1, ms(1000), &[0.5], stop)
            .await
            .unwrap();
        let starts: Vec<_> = run.windows.iter().map(|w| w.start).collect();
        assert_eq!(starts, [ms(20), ms(1470), ms(2470), ms(3470)]);
        assert!(
            run.windows
                .iter()
                .all(|w| w.counted == ms(80) && w.calls == 80_000 && w.requests == 80)
        );
        assert_eq!((run.total, run.period), (ms(3800), ms(1000)));
    }

    #[test]
    fn jitter_is_in_the_unit_interval() {
        let mut jitter = Jitter::new();
        let draws: Vec<f64> = (0..10_000).map(|_| jitter.next()).collect();
        assert!(draws.iter().all(|j| (0.0..1.0).contains(j)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }

    #[test]
    fn warm_up_comes_out_of_the_window_share() {
        let period = Duration::from_secs(1);
        // 100 ms of probes: 20 ms warm-up, 80 ms counting.
        assert!((counting_rate(0.1, period) - 0.08).abs() < 1e-9);
        // 30 ms of probes: counts 15 ms, the warm-up still 20 ms.
        assert!((counting_rate(0.03, period) - 0.015).abs() < 1e-9);
        assert_eq!(counting_rate(1.0, period), 1.0);
    }

    #[test]
    fn late_windows_count_longer_to_keep_the_rate() {
        let (rate, period) = (0.2, Duration::from_millis(500));
        let ms = Duration::from_millis;
        // On schedule: the window's share of the period.
        assert_eq!(window_length(rate, period, ms(300), ms(0)), ms(100));
        assert_eq!(window_length(rate, period, ms(1300), ms(200)), ms(100));
        // Windows lost to a 2 s detach: counted 100 ms of 2.4 s; this one
        // catches up (0.1 + L = 0.2 × (2.4 + L) gives L = 475 ms).
        let length = window_length(rate, period, ms(2400), ms(100));
        assert!(
            length.abs_diff(ms(475)) < Duration::from_micros(1),
            "{length:?}"
        );
        // Never more than a period.
        assert_eq!(window_length(rate, period, ms(60_000), ms(100)), ms(500));
    }
}
