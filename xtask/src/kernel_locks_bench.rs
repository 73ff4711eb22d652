//! What the kernel lock tracepoints (`lock:contention_begin`/`end`, issue
//! 50) cost an uncontended workload: fixtures/map_worker.c with one mapping
//! thread and no faulter (mmap, touch, munmap: its mmap_lock is never
//! contended, so the programs fire only on the machine's own contention)
//! untraced, under `record --mode contention --no-cpu` with the kernel lock
//! programs left out (`LOCKTRACE_TEST_KERNEL_WITHOUT=lock_events`) and with
//! them, in interleaved rounds. The fixture times its own work; each
//! configuration's median is given as a ratio to the untraced median of
//! the same run (scripts/kernel-locks-ab.sh is the same A/B from a shell).
use std::{
    io::{BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result};

use crate::{
    Bench,
    fixtures::{compile_source, read_until},
    tracers::{self, Tracer},
};

/// Rounds of mmap, touch and munmap per second of work (about 18 000 on
/// our 2-CPU VM).
const ROUNDS_PER_SECOND: f64 = 18_000.0;

/// One run: the work's wall time, and the kernel lock contentions counted.
#[derive(Debug, Clone, Copy)]
struct Run {
    work_ns: u64,
    contentions: u64,
}

pub fn run(bench: &Bench) -> Result<String> {
    let binary = compile(&bench.root, &bench.out)?;
    let rounds = ((bench.seconds * ROUNDS_PER_SECOND) as u64).max(1);
    let base = ["--mode", "contention", "--no-cpu"];
    let configs: [(&str, Tracer); 3] = [
        ("untraced", Tracer::None),
        (
            "locktrace --mode contention --no-cpu, kernel lock programs left out",
            tracers::locktrace_env(&base, &[("LOCKTRACE_TEST_KERNEL_WITHOUT", "lock_events")]),
        ),
        (
            "locktrace --mode contention --no-cpu (kernel lock programs attached)",
            tracers::locktrace(&base),
        ),
    ];
    let mut all: Vec<Vec<Run>> = vec![Vec::new(); configs.len()];
    for round in 0..bench.runs {
        for ((name, tracer), runs) in configs.iter().zip(&mut all) {
            let run = run_once(&binary, rounds, tracer, &bench.locktrace)?;
            eprintln!("round {round}: {name}: {run:?}");
            runs.push(run);
        }
    }
    let medians: Vec<Run> = all
        .into_iter()
        .map(|mut runs| {
            runs.sort_by_key(|run| run.work_ns);
            runs[runs.len() / 2]
        })
        .collect();
    let untraced = medians[0].work_ns.max(1) as f64;
    let mut text = format!(
        "\n### Kernel lock tracepoints on an uncontended workload (fixtures/map_worker.c, one mapper, {rounds} rounds)\n\n\
         | tracer | work ms (median) | against untraced | kernel lock contentions (median run) |\n|---|---:|---:|---:|\n"
    );
    for ((name, _), run) in configs.iter().zip(&medians) {
        text.push_str(&format!(
            "| {name} | {:.1} | {:.3} | {} |\n",
            run.work_ns as f64 / 1e6,
            run.work_ns as f64 / untraced,
            run.contentions
        ));
    }
    Ok(text)
}

/// Compiles fixtures/map_worker.c into `out`.
fn compile(root: &Path, out: &Path) -> Result<PathBuf> {
    compile_source(
        &root.join("fixtures/map_worker.c"),
        out.join("map_worker"),
        &["-g".to_string()],
    )
}

/// One run: starts the fixture, the tracer on it, then the work; closes the
/// fixture's stdin once it is done, which ends it (and the tracer with it).
fn run_once(binary: &Path, rounds: u64, tracer: &Tracer, locktrace: &Path) -> Result<Run> {
    let mut fixture = Command::new(binary)
        .args([rounds.to_string().as_str(), "1", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let mut out = BufReader::new(fixture.stdout.take().context("piped stdout")?);
    read_until(&mut out, "map_worker", |line| line == "ready")?;
    let running = tracers::start(tracer, fixture.id(), locktrace)?;
    let mut stdin = fixture.stdin.take().context("piped stdin")?;
    stdin.write_all(b"go\n")?;
    let line = read_until(&mut out, "map_worker", |line| line.starts_with("work_ns "))?;
    let work_ns = line["work_ns ".len()..]
        .parse()
        .context("map_worker's work_ns line")?;
    read_until(&mut out, "map_worker", |line| line == "done")?;
    drop(stdin);
    fixture.wait()?;
    let contentions = match running {
        Some(running) => running
            .finish()?
            .report
            .and_then(|report| report.kernel_locks)
            .map_or(0, |section| section.contentions),
        None => 0,
    };
    Ok(Run {
        work_ns,
        contentions,
    })
}
