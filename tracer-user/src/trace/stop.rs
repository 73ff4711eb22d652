//! When a recording ends: the duration, a stop signal, or the target's exit.
//! Signals are caught from the start of the recording, so one that comes
//! while attaching (or during the load's warmup) still ends in a report.
use std::time::Duration;

use anyhow::Result;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::{model::StopReason, probe::target::Target};

/// SIGINT (Ctrl-C), SIGTERM and SIGHUP: each one stops the recording the same
/// way, with a report.
pub struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl StopSignals {
    pub fn install() -> Result<StopSignals> {
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// Resolves at the next stop signal.
    pub async fn recv(&mut self) -> StopReason {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
            _ = self.hangup.recv() => {}
        }
        StopReason::Interrupted
    }
}

/// How often the target is checked for exit.
const EXIT_POLL: Duration = Duration::from_millis(20);
/// `on_tick` runs every this many exit polls (200 ms).
const POLLS_PER_TICK: u32 = 10;

/// Waits until the duration ends, a stop signal comes, or the target exits.
/// `on_tick` runs every 200 ms meanwhile.
pub async fn wait_for_end(
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
    let exited = async {
        let mut tick = tokio::time::interval(EXIT_POLL);
        let mut polls = 0u32;
        while target.is_alive() {
            tick.tick().await;
            polls += 1;
            if polls.is_multiple_of(POLLS_PER_TICK) {
                on_tick();
            }
        }
    };
    tokio::select! {
        _ = deadline => StopReason::Duration,
        reason = signals.recv() => reason,
        _ = exited => StopReason::TargetExited,
    }
}
