//! When a recording ends: the duration, a stop signal, or the target's exit.
//! Signals are caught from the start of the recording, so one that comes
//! while attaching (or during the load's warmup) still ends in a report.
use std::{sync::Arc, time::Duration};

use anyhow::Result;
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{SignalKind, signal},
    sync::Notify,
};

use super::priority;
use crate::{model::StopReason, probe::target::Target};

/// SIGINT (Ctrl-C), SIGTERM and SIGHUP: each one stops the recording the same
/// way, with a report.
pub(crate) struct StopSignals {
    /// Holds one stop not yet received, as a tokio `Signal` does.
    stop: Arc<Notify>,
}

impl StopSignals {
    /// Catches the signals on a task of the runtime, which raises the
    /// threads' priority the moment one comes (`priority::begin_teardown`):
    /// the recording's tick may be running on the main thread, and at
    /// normal priority under load it held the stop up to a second.
    pub(crate) fn install() -> Result<StopSignals> {
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        let mut hangup = signal(SignalKind::hangup())?;
        let stop = Arc::new(Notify::new());
        let notify = Arc::clone(&stop);
        tokio::spawn(async move {
            loop {
                let caught = tokio::select! {
                    caught = interrupt.recv() => caught,
                    caught = terminate.recv() => caught,
                    caught = hangup.recv() => caught,
                };
                // None: the runtime is shutting down.
                if caught.is_none() {
                    return;
                }
                priority::begin_teardown();
                notify.notify_one();
            }
        });
        Ok(StopSignals { stop })
    }

    /// Resolves at the next stop signal.
    pub(crate) async fn recv(&mut self) -> StopReason {
        self.stop.notified().await;
        StopReason::Interrupted
    }
}

/// How often the target is checked for exit when no pidfd can tell.
const EXIT_POLL: Duration = Duration::from_millis(20);
/// How often `on_tick` runs.
const TICK: Duration = Duration::from_millis(200);

/// Waits until the duration ends, a stop signal comes, or the target exits.
/// `on_tick` runs every 200 ms meanwhile.
pub(crate) async fn wait_for_end(
    target: &Target,
    duration: Option<Duration>,
    signals: &mut StopSignals,
    on_tick: &mut dyn FnMut(),
) -> StopReason {
    let deadline = async {
        match duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = deadline => StopReason::Duration,
        reason = signals.recv() => reason,
        _ = target_exit(target, on_tick) => StopReason::TargetExited,
    }
}

/// Resolves when the target exits, running `on_tick` meanwhile. A pidfd
/// wakes us at the exit; polling /proc 50 times a second cost the tracer
/// ~0.3 % of a CPU on an idle target.
async fn target_exit(target: &Target, on_tick: &mut dyn FnMut()) {
    let exit_fd = target.exit_fd().and_then(|fd| {
        // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the
        // same until the AsyncFd is dropped.
        unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.ok()
    });
    let Some(exit_fd) = exit_fd else {
        return poll_exit(target, on_tick).await;
    };
    let mut tick = tokio::time::interval(TICK);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = exit_fd.readable() => break,
            _ = tick.tick() => on_tick(),
        }
    }
    // A main thread that left with pthread_exit makes the pidfd readable
    // on some kernels while the process's other threads run on.
    if target.is_alive() {
        drop(exit_fd);
        poll_exit(target, on_tick).await;
    }
}

async fn poll_exit(target: &Target, on_tick: &mut dyn FnMut()) {
    let mut poll = tokio::time::interval(EXIT_POLL);
    let polls_per_tick = (TICK.as_millis() / EXIT_POLL.as_millis()) as u32;
    let mut polls = 0u32;
    while target.is_alive() {
        poll.tick().await;
        polls += 1;
        if polls.is_multiple_of(polls_per_tick) {
            on_tick();
        }
    }
}
