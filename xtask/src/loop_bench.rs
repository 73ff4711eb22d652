//! The uncontended one-thread lock loop (fixtures/bench/loop.c) under each
//! tracer: ns added per lock, attach time, tracer CPU and memory.
use std::{io::Write, path::Path};

use anyhow::{Context, Result};

use crate::{
    Bench,
    fixtures::{compile, read_until, start_loop},
    results::{self, Sample},
    tracers::{self, Tracer},
};

pub fn run(bench: &Bench) -> Result<String> {
    let loop_bin = compile(&bench.root, &bench.out, "loop", &[])?;
    let configs: Vec<(&str, Tracer)> = vec![
        ("untraced", Tracer::None),
        (
            "locktrace --placement entry",
            tracers::locktrace(&["--placement", "entry"]),
        ),
        (
            "locktrace --placement auto",
            tracers::locktrace(&["--placement", "auto"]),
        ),
        (
            "locktrace --mode inproc (stubs behind the GOT entries, no trap)",
            tracers::locktrace(&["--mode", "inproc"]),
        ),
        (
            "locktrace --placement auto --handoffs (acquisitions on another CPU counted)",
            tracers::locktrace(&["--placement", "auto", "--handoffs"]),
        ),
        (
            "locktrace --placement auto --stacks 8 (whole stacks from snapshots)",
            tracers::locktrace(&["--placement", "auto", "--stacks", "8"]),
        ),
        (
            "locktrace --hold-times (lock + unlock probes)",
            tracers::locktrace(&["--hold-times"]),
        ),
        // No lock probes here: the three differ only in the CPU sampler,
        // whose cost to the target's throughput is the ratio to untraced.
        (
            "locktrace --mode contention --no-cpu",
            tracers::locktrace(&["--mode", "contention", "--no-cpu"]),
        ),
        (
            "locktrace --mode contention (CPU sampled at 99 Hz, default)",
            tracers::locktrace(&["--mode", "contention"]),
        ),
        (
            "locktrace --mode contention --cpu-hz 999",
            tracers::locktrace(&["--mode", "contention", "--cpu-hz", "999"]),
        ),
        (
            "locktrace --mode contention --cpu-hz 4999",
            tracers::locktrace(&["--mode", "contention", "--cpu-hz", "4999"]),
        ),
        (
            "locktrace --mode sampled --sample 0.1",
            tracers::locktrace(&[
                "--mode",
                "sampled",
                "--sample",
                "0.1",
                "--sample-period",
                "2",
            ]),
        ),
        ("bpftrace uprobe one-liner", tracers::bpftrace_one_liner()),
    ];
    // Interleaved (one run of every config per round), so that load from
    // other processes drifting over time hits all configs alike.
    let mut all: Vec<Vec<Sample>> = vec![Vec::new(); configs.len()];
    for round in 0..bench.runs {
        for ((name, tracer), samples) in configs.iter().zip(&mut all) {
            let sample = run_loop(&loop_bin, bench.seconds, tracer, &bench.locktrace)?;
            eprintln!("round {round}: {name}: {sample:?}");
            samples.push(sample);
        }
    }
    let medians: Vec<(&str, Sample)> = configs
        .iter()
        .zip(all)
        .map(|((name, _), samples)| (*name, median_of(samples)))
        .collect();
    Ok(results::loop_table(&medians))
}

/// Runs `one` `runs` times and keeps the median run.
pub fn median(runs: usize, mut one: impl FnMut() -> Result<Sample>) -> Result<Sample> {
    let mut samples = Vec::new();
    for _ in 0..runs.max(1) {
        samples.push(one()?);
    }
    Ok(median_of(samples))
}

/// The run with the median ns/lock.
pub fn median_of(mut samples: Vec<Sample>) -> Sample {
    samples.sort_by(|a, b| a.ns_per_lock.total_cmp(&b.ns_per_lock));
    samples[samples.len() / 2]
}

/// One run of a loop fixture: it waits for "go" on stdin (sent once the
/// tracer is live), locks for `seconds` and prints its ns per lock.
pub fn run_loop(binary: &Path, seconds: f64, tracer: &Tracer, locktrace: &Path) -> Result<Sample> {
    let (mut fixture, mut fixture_out) = start_loop(binary, seconds)?;
    let pid = fixture.id();

    let running = tracers::start(tracer, pid, locktrace)?;
    fixture.stdin.take().expect("piped").write_all(b"go\n")?;
    let line = read_until(&mut fixture_out, "fixture", |line| {
        line.starts_with("ns_per_lock ")
    })?;
    let mut sample = Sample {
        ns_per_lock: line["ns_per_lock ".len()..]
            .parse()
            .context("fixture output")?,
        ..Sample::default()
    };
    fixture.wait()?;
    if let Some(running) = running {
        let finished = running.finish()?;
        sample.attach_ms = finished.attach_ms;
        sample.tracer_cpu_s = finished.cpu_s;
        sample.tracer_rss_mib = finished.rss_mib;
        sample.snapshots_lost = finished
            .report
            .as_ref()
            .and_then(|report| {
                report
                    .dropped
                    .get(&locktrace::model::DropReason::SnapshotsLost)
                    .copied()
            })
            .unwrap_or(0);
    }
    Ok(sample)
}
