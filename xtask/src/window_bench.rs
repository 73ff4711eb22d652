//! What opening and closing a sampled window costs (issue 20 item 3): the
//! loop fixture (fixtures/bench/loop.c) runs while locktrace's lock probes
//! are attached and detached over and over, not counting (as between
//! windows), by each mechanism the kernel offers:
//!
//! - a perf-event uprobe per probe point (aya 0.14), detached one after
//!   another, and each on its own thread (locktrace until 2026-12);
//! - one uprobe-multi link per module (`BPF_TRACE_UPROBE_MULTI`);
//! - attached once and never detached: what `PERF_EVENT_IOC_DISABLE` would
//!   leave (the int3 stays in the target's text, so every call still traps).
//!
//! Per mechanism: wall time to attach and to detach a window (medians), the
//! loop's ns per lock meanwhile against untraced, and that added time per
//! window (what the target paid while the probes were in its text).
use std::{
    io::{BufRead, Write},
    path::Path,
    process::Child,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use aya::Ebpf;
use locktrace::{
    model::{Mode, Placement},
    session::{self, Prepared},
    trace::{attach, multi::MultiPrograms},
};
use tracer_common::names;

use crate::{
    Bench,
    fixtures::{compile, read_until, start_loop},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mechanism {
    Untraced,
    PerPointSequential,
    PerPointThreads,
    UprobeMulti,
    AttachedNotCounting,
}

impl Mechanism {
    const ALL: [Mechanism; 5] = [
        Mechanism::Untraced,
        Mechanism::PerPointSequential,
        Mechanism::PerPointThreads,
        Mechanism::UprobeMulti,
        Mechanism::AttachedNotCounting,
    ];

    fn label(self) -> &'static str {
        match self {
            Mechanism::Untraced => "untraced",
            Mechanism::PerPointSequential => "perf-event uprobe per point, detached in turn",
            Mechanism::PerPointThreads => "perf-event uprobe per point, a thread per detach",
            Mechanism::UprobeMulti => "uprobe-multi link per module",
            Mechanism::AttachedNotCounting => {
                "attached, never detached (what PERF_EVENT_IOC_DISABLE leaves)"
            }
        }
    }
}

/// One mechanism's run.
#[derive(Debug, Default)]
struct Cycles {
    windows: usize,
    attach_ms: Vec<f64>,
    detach_ms: Vec<f64>,
    ns_per_lock: f64,
    probe_points: usize,
}

pub fn run(bench: &Bench) -> Result<String> {
    let loop_bin = compile(&bench.root, &bench.out, "loop", &[])?;
    let seconds = bench.seconds.max(5.0);
    let mut rows = Vec::new();
    for mechanism in Mechanism::ALL {
        let mut runs = Vec::new();
        for round in 0..bench.runs {
            let cycles = cycle(&loop_bin, seconds, mechanism)?;
            eprintln!("round {round}: {}: {cycles:?}", mechanism.label());
            runs.push(cycles);
        }
        runs.sort_by(|a, b| a.ns_per_lock.total_cmp(&b.ns_per_lock));
        rows.push((mechanism, runs.swap_remove(runs.len() / 2)));
    }
    Ok(table(seconds, bench.runs, &rows))
}

/// Starts the loop, attaches and detaches by `mechanism` until it is done.
fn cycle(loop_bin: &Path, seconds: f64, mechanism: Mechanism) -> Result<Cycles> {
    let (mut fixture, mut out) = start_loop(loop_bin, seconds)?;
    let mut cycles = Cycles::default();
    let result = if mechanism == Mechanism::Untraced {
        go(&mut fixture)?;
        finish_loop(&mut fixture, &mut out)
    } else {
        let prepared = session::prepare(fixture.id(), Mode::Sampled, Placement::Auto, false)?;
        cycles.probe_points = prepared.placed.iter().map(|(_, p)| p.points.len()).sum();
        let mut loaded = load(&prepared)?;
        let multi = match mechanism {
            Mechanism::UprobeMulti => Some(attach::load_multi(&loaded.ebpf)?),
            _ => None,
        };
        let target = &prepared.target;
        // Kept for the whole run: the trap without the program's work.
        let _kept = if mechanism == Mechanism::AttachedNotCounting {
            attach::attach_lock_probes(&mut loaded.ebpf, target, &prepared.placed)?
        } else {
            Vec::new()
        };
        go(&mut fixture)?;
        let done = std::thread::spawn(move || {
            let result = finish_loop(&mut fixture, &mut out);
            (fixture, result)
        });
        while !done.is_finished() {
            if mechanism == Mechanism::AttachedNotCounting {
                std::thread::sleep(Duration::from_millis(50));
            } else if let Err(error) = one_window(
                &mut loaded.ebpf,
                &prepared,
                multi.as_ref(),
                mechanism,
                &mut cycles,
            ) {
                // The loop may have exited during the attach: that ends the run.
                std::thread::sleep(Duration::from_millis(500));
                if !done.is_finished() {
                    return Err(error);
                }
            }
        }
        let (_fixture, result) = done.join().expect("the reader does not panic");
        result
    };
    cycles.ns_per_lock = result?;
    Ok(cycles)
}

/// Attaches a window's lock probes, keeps them 50 ms (not counting),
/// detaches them; times both ends.
fn one_window(
    ebpf: &mut Ebpf,
    prepared: &Prepared,
    multi: Option<&MultiPrograms>,
    mechanism: Mechanism,
    cycles: &mut Cycles,
) -> Result<()> {
    let target = &prepared.target;
    let attaching = Instant::now();
    let links: Vec<Box<dyn Send>> = match multi {
        Some(programs) => {
            attach::attach_lock_probes_multi(programs, target, &prepared.placed, target.pid)?
                .into_iter()
                .map(|link| Box::new(link) as Box<dyn Send>)
                .collect()
        }
        None => {
            let ids = attach::attach_lock_probes(ebpf, target, &prepared.placed)?;
            attach::take_links(ebpf, names::PROGRAM_LOCK_CALL, ids)?
                .into_iter()
                .map(|link| Box::new(link) as Box<dyn Send>)
                .collect()
        }
    };
    cycles
        .attach_ms
        .push(attaching.elapsed().as_secs_f64() * 1e3);
    std::thread::sleep(Duration::from_millis(50));
    let detaching = Instant::now();
    if mechanism == Mechanism::PerPointThreads {
        let threads: Vec<_> = links
            .into_iter()
            .map(|link| std::thread::spawn(move || drop(link)))
            .collect();
        for thread in threads {
            let _ = thread.join();
        }
    } else {
        // Dropped in turn: a perf event's close waits for its grace periods.
        for link in links {
            drop(link);
        }
    }
    cycles
        .detach_ms
        .push(detaching.elapsed().as_secs_f64() * 1e3);
    cycles.windows += 1;
    Ok(())
}

/// Loads the BPF programs as sampled mode does: lock calls not counted
/// (windows here only open and close), no lock probe attached yet.
fn load(prepared: &Prepared) -> Result<attach::Loaded> {
    attach::load(&session::bench_load_plan(
        prepared,
        session::BenchProbes::BeforeTheFirstWindow,
    ))
}

fn go(fixture: &mut Child) -> Result<()> {
    fixture
        .stdin
        .as_mut()
        .expect("piped")
        .write_all(b"go\n")
        .context("starting the loop")
}

/// The loop's ns per lock, once it has run.
fn finish_loop(fixture: &mut Child, out: &mut impl BufRead) -> Result<f64> {
    let line = read_until(out, "fixture", |line| line.starts_with("ns_per_lock "))?;
    fixture.wait()?;
    line["ns_per_lock ".len()..]
        .parse()
        .context("the loop's output")
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

fn table(seconds: f64, runs: usize, rows: &[(Mechanism, Cycles)]) -> String {
    let base = rows[0].1.ns_per_lock;
    let mut text = format!(
        "\n## Opening and closing a sampled window\n\nThe loop fixture for {seconds} s while its {} lock probe points are attached, kept 50 ms (not counting), detached, again and again (median of {runs} runs by ns/lock; attach and detach: medians over that run's windows):\n\n| mechanism | windows | attach ms | detach ms | ns/lock | added ns/lock | target ms per window |\n|---|---|---|---|---|---|---|\n",
        rows.iter().map(|(_, c)| c.probe_points).max().unwrap_or(0)
    );
    for (mechanism, cycles) in rows {
        let cell = |values: &[f64]| {
            if values.is_empty() {
                "-".to_string()
            } else {
                format!("{:.1}", median(values))
            }
        };
        // The loop's added time over its run, per window: the hits while
        // the probes were in its text (the 50 ms held and the detach).
        let locks = seconds * 1e9 / cycles.ns_per_lock;
        let per_window = if cycles.windows > 0 {
            format!(
                "{:.1}",
                (cycles.ns_per_lock - base) * locks / cycles.windows as f64 / 1e6
            )
        } else {
            "-".to_string()
        };
        text.push_str(&format!(
            "| {} | {} | {} | {} | {:.1} | {:+.1} | {per_window} |\n",
            mechanism.label(),
            cycles.windows,
            cell(&cycles.attach_ms),
            cell(&cycles.detach_ms),
            cycles.ns_per_lock,
            cycles.ns_per_lock - base
        ));
    }
    text
}
