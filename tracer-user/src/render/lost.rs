//! The footer's `lost:` lines: per reason, what is missing and from which
//! figures (a lost stack leaves the counts exact; a full lock map does not),
//! plus what an exec of the target or its forked children left uncounted.
use std::fmt::Write;

use crate::model::{DropReason, ExecLoss, MainThreadExit, Report};

/// What one drop reason of `report` leaves out, by the schema's reason
/// word. Lost callers may hide nested calls (musl), so the acquisitions
/// are not exact then.
fn missing(reason: &DropReason, n: u64, report: &Report) -> String {
    use DropReason as R;
    let nesting_unknown = report.dropped.contains_key(&DropReason::NestedCallsUnknown);
    match reason {
        R::LocksMapFull => {
            format!("{n} lock calls on locks beyond the map's capacity (missing from acquisitions)")
        }
        R::FutexMapFull => format!(
            "{n} futex waits or wakes on words beyond the map's capacity (missing from contended, wakes and wait times)"
        ),
        R::WaitsUntracked => {
            format!("{n} futex waits not tracked (missing from contended and wait times)")
        }
        R::CallersMapFull | R::CallerUnreadable if nesting_unknown => format!(
            "{n} callers ({reason}; callers incomplete, and acquisitions may include nested lock-function calls)"
        ),
        R::CallersMapFull | R::CallerUnreadable => {
            format!("{n} callers ({reason}; counts exact, callers incomplete)")
        }
        R::NestedCallsUnknown => format!(
            "up to {n} acquisitions may be counted twice: their callers were lost, and these lock functions call each other (musl), so nested calls could not be told apart"
        ),
        R::SitesNotRecorded => format!(
            "{n} acquisitions of {} locks whose creation site did not fit the stack count map (counted, named 'created at a site not recorded', not by their site)",
            not_recorded_objects(report)
        ),
        R::StacksLost => format!("{n} stacks (counts exact, stacks incomplete)"),
        R::InprocTableFull => {
            format!("{n} lock calls (the inproc stubs' tables were full; missing from every count)")
        }
        R::SnapshotsLost => format!(
            "{n} stack snapshots (ring buffer full; counts exact, their calls count under the stack of an earlier snapshot)"
        ),
        R::SnapshotsSkipped => format!(
            "{n} later stack snapshots of call sites already snapshotted (ring buffer busy; counts exact, their calls count under the site's previous snapshot)"
        ),
        R::StackCountsFull => {
            format!("{n} stacks (stack count map full; counts exact, stacks incomplete)")
        }
        R::CondvarMapFull => format!(
            "{n} condvar waits on condvars beyond the map's capacity (missing from the condvar rows)"
        ),
        R::GoFutexMapFull => format!(
            "{n} Go runtime futex waits or wakes beyond the map's capacity (missing from the go_runtime rows)"
        ),
        R::HoldsUntracked => {
            format!("{n} holds not tracked (HELD map full; missing from hold times)")
        }
        R::HoldsMapFull => format!(
            "{n} completed holds on locks beyond the hold map's capacity (missing from hold times)"
        ),
        R::HoldersMapFull => format!(
            "{n} completed holds whose call site did not fit (missing from hold time per function)"
        ),
        R::PausedForExpiry => format!(
            "{n} events while counting paused to delete expired locks (missing from every count)"
        ),
        R::ProbePointUnknown => format!(
            "{n} lock calls at probe points this kernel (no attach cookies, before Linux 5.15) could not identify (missing from acquisitions)"
        ),
        R::LifetimesMerged => format!(
            "{n} unmaps or execs past the log's capacity (counts exact; a lock unloaded after them may share a row with the lock later at its address)"
        ),
        R::HandoffsMapFull => format!(
            "{n} acquisitions on locks beyond the handoff map's capacity (counts exact, missing from handoffs)"
        ),
        R::RoutesMapFull => format!(
            "{n} lock calls, waits or requests beyond the route maps' capacity (in the totals, in no route)"
        ),
        R::RoutesPastCap => format!(
            "{n} requests of routes past the route map's capacity ({} routes; in the '{}' row, not apart)",
            tracer_common::php::MAX_ROUTES,
            crate::model::RouteKind::PAST_CAP_NAME
        ),
        R::CpuLocksFull => format!(
            "{n} CPU samples of lock code on locks beyond the sampler's map (in the lock-code total, in no lock's CPU)"
        ),
        R::WaitHoldersFull => format!(
            "{n} contended waits whose holder did not fit (counts exact, holders incomplete)"
        ),
        R::CondWaitsUntracked => {
            format!("{n} condvar waits not tracked (their futex waits count as plain futex waits)")
        }
        R::FailedTriesUntracked => format!(
            "{n} trylock or timed lock calls not tracked (missing from failed tries, and from acquisitions when the call was not tracked at entry)"
        ),
        R::Other(other) => format!("{other}={n}"),
    }
}

/// Locks (objects) whose creation site was not recorded: their rows, or
/// the objects of the row they were grouped into.
fn not_recorded_objects(report: &Report) -> u64 {
    report
        .locks
        .iter()
        .filter(|lock| {
            lock.created
                .as_ref()
                .is_some_and(|c| c.by == crate::model::CreatedBy::NotRecorded)
        })
        .map(|lock| lock.group.as_ref().map_or(1, |group| group.objects))
        .sum()
}

/// True when nothing the counts cover was lost (drops, exec).
pub(crate) fn counts_whole(report: &Report) -> bool {
    report
        .coverage
        .as_ref()
        .is_none_or(|c| c.exec.is_none() && c.main_thread_exit.is_none())
}

/// What `--mode inproc`'s stubs did not see (number unknown): calls not
/// through a switched GOT entry, entries left as they were, libraries
/// loaded while recording.
fn inproc_gaps(report: &Report) -> Vec<String> {
    let Some(inproc) = report.inproc.as_ref().filter(|i| i.mapping.is_some()) else {
        return Vec::new();
    };
    let mut gaps = vec![
        "lock calls that do not go through a switched GOT entry (from inside libc, through a function pointer the program took before the switch): not counted, number unknown (--mode all counts them)".to_string(),
    ];
    if inproc.entries_not_switched > 0 {
        gaps.push(format!(
            "calls through {} GOT entries or modules left as they were (the inproc lines say why): not counted",
            inproc.entries_not_switched
        ));
    }
    if !inproc.loaded_while_recording.is_empty() {
        gaps.push(format!(
            "lock calls of {}, loaded while recording (their GOT entries were not switched): not counted",
            inproc.loaded_while_recording.join(", ")
        ));
    }
    gaps
}

/// `lost:` lines (`lost: nothing` when nothing was), then a line on
/// children that were forked and not followed.
pub(crate) fn render(report: &Report) -> String {
    let mut out = String::new();
    let coverage = report.coverage.as_ref();
    let exec = coverage.and_then(|c| c.exec.as_ref());
    let main_thread_exit = coverage.and_then(|c| c.main_thread_exit.as_ref());
    let inproc = inproc_gaps(report);
    if report.dropped.is_empty()
        && exec.is_none()
        && main_thread_exit.is_none()
        && inproc.is_empty()
    {
        out.push_str("lost: nothing\n");
    }
    for gap in inproc {
        let _ = writeln!(out, "lost: {gap}");
    }
    for (reason, &n) in &report.dropped {
        let _ = writeln!(out, "lost: {}", missing(reason, n, report));
    }
    if let Some(exec) = exec {
        let program = exec.exe.as_deref().unwrap_or("a program not read in time");
        let what = match exec.not_counted {
            ExecLoss::AllLockCalls => {
                "every lock call of the new program (its futex waits are counted, named from the old program's map)".to_string()
            }
            ExecLoss::LockCallsOutsideProbedModules => format!(
                "the new program's lock calls outside {} (futex waits counted)",
                exec.still_probed.join(", ")
            ),
            ExecLoss::Nothing => "no count (contention mode); names after it come from the old program's map".to_string(),
        };
        let _ = writeln!(
            out,
            "lost: the target ran exec ({program}) {:.2} s into the recording; from then on: {what}",
            exec.after_s
        );
    }
    if let Some(exit) = main_thread_exit {
        out.push_str(&main_thread_exit_line(exit));
    }
    if let Some(forked) = coverage.and_then(|c| c.children_forked).filter(|&n| n > 0) {
        let _ = writeln!(
            out,
            "children: {forked} processes forked by the target were not followed; their locks are not counted (trace their pids)"
        );
    }
    out
}

/// The uprobe hits lost between the main thread's exit and the probes'
/// move to a live thread (`trace::follow`).
fn main_thread_exit_line(exit: &MainThreadExit) -> String {
    let from = exit.running_at_s;
    let mut line = match (exit.probes_moved_at_s, exit.moved_to_thread) {
        (Some(to), Some(thread)) => format!(
            "lost: lock calls between {from:.2} and {to:.2} s: the main thread left (pthread_exit) and the probes, bound to it, were moved to thread {thread} (futex waits counted)"
        ),
        _ => format!(
            "lost: every lock call after {from:.2} s: the main thread left (pthread_exit) and the probes could not be moved ({}); futex waits counted",
            exit.not_moved.as_deref().unwrap_or("no live thread")
        ),
    };
    if exit.later_moves > 0 {
        let _ = write!(
            line,
            "; {} more moves, each losing up to a tick and an attach",
            exit.later_moves
        );
    }
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::{Coverage, ExecSeen, StopReason},
        render::table,
    };

    fn report() -> Report {
        serde_json::from_value(serde_json::json!({
            "schema": crate::model::SCHEMA,
            "target": {"pid": 1, "exe": "/x", "cmdline": []},
            "duration_s": 1.0, "mode": "all", "stopped_by": "target_exited",
            "locks": [], "dropped": {},
            "totals": {"acquisitions": 0, "contended": 0, "wakes": 0, "wait_ns": 0},
        }))
        .unwrap()
    }

    /// Every reason the BPF side can drop for says in words what it leaves
    /// out (the bare `reason=N` fallback is for reports from newer versions).
    #[test]
    fn every_drop_reason_has_its_words() {
        for reason in DropReason::known() {
            let words = missing(&reason, 7, &report());
            assert_ne!(words, format!("{reason}=7"), "no words for {reason}");
            assert!(words.starts_with("7 ") || words.contains(" 7 "), "{words}");
        }
    }

    /// musl: a lost caller may hide a nested call, so the footer must not
    /// call the counts exact.
    #[test]
    fn lost_callers_on_nesting_lock_functions_are_not_exact() {
        let mut report = report();
        report.dropped.insert(DropReason::CallersMapFull, 5);
        let exact = table::render(&report, None, crate::render::fit::Width::Unlimited);
        assert!(
            exact.contains("lost: 5 callers (callers_map_full; counts exact"),
            "{exact}"
        );
        report.dropped.insert(DropReason::NestedCallsUnknown, 5);
        let text = table::render(&report, None, crate::render::fit::Width::Unlimited);
        assert!(!text.contains("counts exact"), "{text}");
        assert!(
            text.contains("lost: up to 5 acquisitions may be counted twice"),
            "{text}"
        );
    }

    #[test]
    fn lost_stacks_leave_the_counts_exact() {
        let mut report = report();
        report.dropped.insert(DropReason::StacksLost, 7);
        report.dropped.insert(DropReason::LocksMapFull, 3);
        let text = table::render(&report, None, crate::render::fit::Width::Unlimited);
        assert!(!text.contains("missing from the counts"), "{text}");
        assert!(
            text.contains("lost: 7 stacks (counts exact, stacks incomplete)"),
            "{text}"
        );
        assert!(text.contains("lost: 3 lock calls"), "{text}");
        assert!(text.contains("(missing from acquisitions)"), "{text}");
    }

    #[test]
    fn an_exec_is_never_a_whole_life_with_nothing_lost() {
        let mut report = report();
        assert!(
            table::render(&report, None, crate::render::fit::Width::Unlimited)
                .contains("counts cover its whole traced life")
        );
        report.stopped_by = StopReason::TargetExited;
        report.coverage = Some(Coverage {
            children_followed: false,
            children_forked: Some(2),
            exec: Some(ExecSeen {
                after_s: 0.5,
                exe: Some("/bin/static".into()),
                not_counted: ExecLoss::AllLockCalls,
                still_probed: Vec::new(),
            }),
            main_thread_exit: None,
            found_by_code: None,
            target_exit: Some(crate::model::TargetExit::from_wait_status(2 << 8)),
        });
        let text = table::render(&report, None, crate::render::fit::Width::Unlimited);
        assert!(!text.contains("whole traced life"), "{text}");
        assert!(
            text.contains("stopped: the target exited (exit status 2)\n"),
            "{text}"
        );
        assert!(!text.contains("lost: nothing"), "{text}");
        assert!(
            text.contains("lost: the target ran exec (/bin/static) 0.50 s into the recording; from then on: every lock call of the new program"),
            "{text}"
        );
        assert!(
            text.contains("children: 2 processes forked by the target were not followed"),
            "{text}"
        );
    }

    #[test]
    fn a_main_thread_exit_says_what_was_not_counted() {
        let mut report = report();
        report.coverage = Some(Coverage {
            main_thread_exit: Some(MainThreadExit {
                running_at_s: 1.2,
                noticed_at_s: 1.4,
                probes_moved_at_s: Some(1.41),
                moved_to_thread: Some(77),
                not_moved: None,
                later_moves: 0,
            }),
            ..Coverage::default()
        });
        let text = table::render(&report, None, crate::render::fit::Width::Unlimited);
        assert!(!text.contains("whole traced life"), "{text}");
        assert!(!text.contains("lost: nothing"), "{text}");
        assert!(
            text.contains("lost: lock calls between 1.20 and 1.41 s: the main thread left (pthread_exit) and the probes, bound to it, were moved to thread 77"),
            "{text}"
        );
        let coverage = report.coverage.as_mut().unwrap();
        let exit = coverage.main_thread_exit.as_mut().unwrap();
        (exit.probes_moved_at_s, exit.moved_to_thread) = (None, None);
        exit.not_moved = Some("no live thread".into());
        let text = table::render(&report, None, crate::render::fit::Width::Unlimited);
        assert!(
            text.contains("lost: every lock call after 1.20 s: the main thread left (pthread_exit) and the probes could not be moved (no live thread)"),
            "{text}"
        );
    }
}
