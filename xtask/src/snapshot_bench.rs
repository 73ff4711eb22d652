//! What a stack snapshot costs the target (`--stacks`, issue 30), on two
//! one-thread loops, each untraced, traced without and with `--stacks 8`:
//! - fixtures/bench/loop.c: one lock, one call site, so one stack key
//!   whose snapshots (about 4·log2(N) of N calls) are too few to show:
//!   what `--stacks` adds per lock call is counting the call under its key;
//! - fixtures/bench/keys.c: every call one of a new key's first 8 counts,
//!   each of which sends a snapshot (32 KiB of stack copied).
//!
//! One snapshot costs what `--stacks` adds per call on the keys loop, less
//! what it adds per call on the one-key loop, spread over the snapshots
//! sent (calls less the `snapshots_lost` of the report).
use anyhow::Result;

use crate::{
    Bench,
    fixtures::compile,
    loop_bench::{median_of, run_loop},
    results::Sample,
    tracers::{self, Tracer},
};

/// Calls of the keys loop: 8192 locks, 8 counts each (fixtures/bench/keys.c).
const KEYS_CALLS: f64 = 8192.0 * 8.0;

pub fn run(bench: &Bench) -> Result<String> {
    let loops = [
        (
            "loop.c (one key)",
            compile(&bench.root, &bench.out, "loop", &[])?,
        ),
        (
            "keys.c (a new key per call)",
            compile(&bench.root, &bench.out, "keys", &[])?,
        ),
    ];
    let configs: [(&str, Tracer); 3] = [
        ("untraced", Tracer::None),
        (
            "locktrace --placement auto",
            tracers::locktrace(&["--placement", "auto"]),
        ),
        (
            "locktrace --placement auto --stacks 8",
            tracers::locktrace(&["--placement", "auto", "--stacks", "8"]),
        ),
    ];
    // Interleaved rounds, as in the loop part.
    let mut all: Vec<Vec<Sample>> = vec![Vec::new(); loops.len() * configs.len()];
    for round in 0..bench.runs {
        for (index, samples) in all.iter_mut().enumerate() {
            let (fixture, binary) = &loops[index / configs.len()];
            let (name, tracer) = &configs[index % configs.len()];
            let sample = run_loop(binary, bench.seconds, tracer, &bench.locktrace)?;
            eprintln!("round {round}: {fixture}: {name}: {sample:?}");
            samples.push(sample);
        }
    }
    let medians: Vec<Sample> = all.into_iter().map(median_of).collect();
    let mut text = String::from(
        "\n### Stack snapshots (fixtures/bench/loop.c, fixtures/bench/keys.c)\n\n\
         | loop | tracer | ns/lock | added ns/lock | snapshots lost |\n|---|---|---:|---:|---:|\n",
    );
    for (index, sample) in medians.iter().enumerate() {
        let (fixture, _) = &loops[index / configs.len()];
        let (name, _) = &configs[index % configs.len()];
        let base = medians[index - index % configs.len()].ns_per_lock;
        text.push_str(&format!(
            "| {fixture} | {name} | {:.2} | {:.2} | {} |\n",
            sample.ns_per_lock,
            sample.ns_per_lock - base,
            sample.snapshots_lost
        ));
    }
    let per_call = medians[2].ns_per_lock - medians[1].ns_per_lock;
    let keys_per_call = medians[5].ns_per_lock - medians[4].ns_per_lock;
    let sent = KEYS_CALLS - medians[5].snapshots_lost as f64;
    let per_snapshot = (keys_per_call - per_call) * KEYS_CALLS / sent.max(1.0);
    text.push_str(&format!(
        "\n`--stacks` against without: {per_call:.0} ns per lock call (one key); \
         {keys_per_call:.0} ns per call when every call sends a snapshot; \
         so one snapshot (32 KiB window) costs the target {per_snapshot:.0} ns \
         ({sent:.0} of {KEYS_CALLS:.0} sent).\n"
    ));
    Ok(text)
}
