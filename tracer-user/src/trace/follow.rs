//! A main thread that leaves with `pthread_exit` while its threads run on.
//! The uprobes are bound to one task, the main thread: the kernel counts
//! the hits of every thread sharing that task's memory, and none once the
//! task has exited. At each tick this notices the exit and attaches the
//! probes again, bound to a live thread; the old ones never fire again, so
//! nothing is counted twice.
//!
//! Where the kernel has uprobe-multi links (Linux 6.6+), the lock-call
//! probes move to one scoped to the whole process instead: it keeps
//! counting whichever threads exit later (the other probes stay bound to
//! one thread and move again if it exits). Such a link's kernel filter
//! reads the exited main thread's memory and so claims no process: empty
//! anchor probes bound to the live thread hold the breakpoints in place,
//! or the next detach of any probe at those points (another tracer's)
//! removes them from the target.
use std::{io::Write, os::fd::OwnedFd, time::Instant};

use aya::Ebpf;

use super::{
    attach::{self, LoadPlan},
    multi::MultiPrograms,
};
use crate::model::MainThreadExit;

pub(crate) struct MainThreadWatch {
    started: Instant,
    last_running: Instant,
    exit: Option<MainThreadExit>,
    /// Moves after the first (the thread moved to exited too).
    later_moves: u32,
    /// The uprobe-multi links counting the lock calls since the move.
    lock_call_links: Option<(MultiPrograms, Vec<OwnedFd>)>,
}

impl MainThreadWatch {
    pub(crate) fn new(started: Instant) -> MainThreadWatch {
        MainThreadWatch {
            started,
            last_running: started,
            exit: None,
            later_moves: 0,
            lock_call_links: None,
        }
    }

    /// When the bound task has exited, binds `plan`'s uprobes to a live
    /// thread and says so on stderr. Returns whether they moved.
    pub(crate) fn tick(&mut self, ebpf: &mut Ebpf, plan: &LoadPlan) -> bool {
        if self
            .exit
            .as_ref()
            .is_some_and(|exit| exit.not_moved.is_some())
        {
            return false;
        }
        let Some(thread) = plan.target.rebind_probes() else {
            self.last_running = Instant::now();
            return false;
        };
        let noticed_at_s = self.seconds(Instant::now());
        if plan.lock_probes && self.lock_call_links.is_none() {
            self.lock_call_links = process_wide_lock_calls(ebpf, plan);
        }
        let moved = attach::attach_user_probes_but(ebpf, plan, self.lock_call_links.is_some());
        let moved_at_s = self.seconds(Instant::now());
        if self.exit.is_some() {
            self.later_moves += 1;
            return moved.is_ok();
        }
        let running_at_s = self.seconds(self.last_running);
        let mut exit = MainThreadExit {
            running_at_s,
            noticed_at_s,
            probes_moved_at_s: None,
            moved_to_thread: None,
            not_moved: None,
            later_moves: 0,
        };
        let ok = moved.is_ok();
        match moved {
            Ok(_) => {
                exit.probes_moved_at_s = Some(moved_at_s);
                exit.moved_to_thread = Some(thread);
                note(format_args!(
                    "locktrace: the main thread exited (pthread_exit) {running_at_s:.2}-{noticed_at_s:.2} s in; its threads run on and the probes now count from thread {thread} ({moved_at_s:.2} s in; lock calls in between are not counted)"
                ));
            }
            Err(error) => {
                exit.not_moved = Some(format!("{error:#}"));
                note(format_args!(
                    "locktrace: the main thread exited (pthread_exit) {running_at_s:.2}-{noticed_at_s:.2} s in and the probes could not follow its threads ({error:#}); lock calls from then on are not counted"
                ));
            }
        }
        self.exit = Some(exit);
        ok
    }

    pub(crate) fn finish(self) -> Option<MainThreadExit> {
        let later_moves = self.later_moves;
        self.exit.map(|exit| MainThreadExit {
            later_moves,
            ..exit
        })
    }

    fn seconds(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.started).as_secs_f64()
    }
}

/// The lock-call probes on uprobe-multi links scoped to the target's
/// process; None where the kernel has no such links (or refuses them).
fn process_wide_lock_calls(ebpf: &Ebpf, plan: &LoadPlan) -> Option<(MultiPrograms, Vec<OwnedFd>)> {
    let programs = attach::load_multi(ebpf).ok()?;
    let links =
        attach::attach_lock_probes_multi(&programs, plan.target, plan.functions, plan.target.pid)
            .ok()?;
    Some((programs, links))
}

/// A line on stderr; a closed stderr loses only the line.
fn note(line: std::fmt::Arguments) {
    let _ = writeln!(std::io::stderr(), "{line}");
}
