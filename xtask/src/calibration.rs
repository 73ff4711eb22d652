//! Calibration: the cost of one uprobe hit per instruction class on the
//! running kernel (fixtures/bench/calib.c: a pthread_mutex_lock whose first
//! instruction is of that class, probed at the entry), and the cost of one
//! handoff (fixtures/bench/handoff.c: a cache line bounced between CPUs 0
//! and 1), saved where locktrace's `overhead` and `handoffs` read them.
use std::path::Path;

use anyhow::{Context, Result, bail};
use locktrace::{analysis::cost::CALIBRATION_FILE, model::Calibration};

use crate::{
    Bench,
    fixtures::compile,
    loop_bench::{median, run_loop},
    tracers::{self, Tracer},
};

/// Instruction classes measured, with the fixture's define for each.
const CLASSES: &[(&str, &str)] = &[
    ("mov %rdi,%rax", "CLASS_MOV"),
    ("nopl 0(%rax)", "CLASS_NOPL"),
    ("nop", "CLASS_NOP"),
    ("push %rbx", "CLASS_PUSH"),
    ("jmp rel8", "CLASS_JMP"),
    ("jne rel8", "CLASS_JCC"),
    ("call rel32", "CLASS_CALL"),
];

/// Measures every class, saves the calibration; returns the results section.
pub fn run(bench: &Bench) -> Result<String> {
    let mut text = String::from(
        "\n### Uprobe cost per hit, by instruction class (fixtures/bench/calib.c)\n\n\
         | first instruction | untraced ns/call | traced ns/call | cost per hit |\n|---|---:|---:|---:|\n",
    );
    let (mut emulated_costs, mut stepped_cost) = (Vec::new(), f64::NAN);
    let seconds = bench.seconds.min(2.0);
    for &(class, define) in CLASSES {
        let binary = compile(&bench.root, &bench.out, "calib", &[define])?;
        let measure = |tracer: &Tracer| {
            median(bench.runs, || {
                run_loop(&binary, seconds, tracer, &bench.locktrace)
            })
        };
        let untraced = measure(&Tracer::None)?;
        let traced = measure(&tracers::locktrace(&["--placement", "entry"]))?;
        let cost = traced.ns_per_lock - untraced.ns_per_lock;
        let line = format!(
            "| `{class}` | {:.1} | {:.1} | **{cost:.0} ns** |\n",
            untraced.ns_per_lock, traced.ns_per_lock,
        );
        eprint!("{line}");
        text.push_str(&line);
        if define == "CLASS_MOV" {
            stepped_cost = cost;
        } else {
            emulated_costs.push(cost);
        }
        if define == "CLASS_NOPL" {
            // The kernel's floor: the same probe with an empty BPF program.
            let floor = measure(&Tracer::Bpftrace {
                probe: format!("uprobe:{}:pthread_mutex_lock", binary.display()),
                action: "/pid == {pid}/ { }".into(),
            })?;
            let line = format!(
                "| `{class}`, empty bpftrace program (kernel floor) | {:.1} | {:.1} | **{:.0} ns** |\n",
                untraced.ns_per_lock,
                floor.ns_per_lock,
                floor.ns_per_lock - untraced.ns_per_lock
            );
            eprint!("{line}");
            text.push_str(&line);
        }
    }
    emulated_costs.sort_by(f64::total_cmp);
    let emulated_cost = emulated_costs[emulated_costs.len() / 2];
    let handoff_ns = handoff_cost(bench)?;
    let line = format!(
        "\n### Cost of one handoff (fixtures/bench/handoff.c)\n\nOne cache line bounced between CPUs 0 and 1 by two pinned threads: **{handoff_ns:.1} ns** per transfer (best of five runs, median of {} such).\n",
        bench.runs.max(1)
    );
    eprint!("{line}");
    text.push_str(&line);
    let lock_pair_ns = fixture_figure(bench, "pair", "20000000", "ns_per_pair")?;
    let line = format!(
        "\n### Cost of one uncontended lock + unlock pair (fixtures/bench/pair.c)\n\n**{lock_pair_ns:.2} ns** per pair with its calls (best of five runs, median of {} such).\n",
        bench.runs.max(1)
    );
    eprint!("{line}");
    text.push_str(&line);
    text.push_str(&save(
        emulated_cost,
        stepped_cost,
        handoff_ns,
        lock_pair_ns,
    )?);
    Ok(text)
}

/// ns per transfer of a cache line between CPUs 0 and 1: the median of
/// `bench.runs` runs of the fixture (each the best of five).
fn handoff_cost(bench: &Bench) -> Result<f64> {
    fixture_figure(bench, "handoff", "2000000", "ns_per_handoff")
}

/// The median over `bench.runs` runs of what fixtures/bench/NAME.c prints
/// after `KEY ` when run with `ARG`.
fn fixture_figure(bench: &Bench, name: &str, arg: &str, key: &str) -> Result<f64> {
    let binary = compile(&bench.root, &bench.out, name, &[])?;
    let mut costs = Vec::new();
    for _ in 0..bench.runs.max(1) {
        let output = std::process::Command::new(&binary)
            .arg(arg)
            .output()
            .with_context(|| format!("running {}", binary.display()))?;
        let text = String::from_utf8_lossy(&output.stdout);
        let Some(ns) = text
            .lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(' '))
            .and_then(|ns| ns.trim().parse::<f64>().ok())
        else {
            bail!(
                "{} printed no {key} (the handoff fixture needs CPUs 0 and 1): {}",
                binary.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        };
        costs.push(ns);
    }
    costs.sort_by(f64::total_cmp);
    Ok(costs[costs.len() / 2])
}

/// Writes the calibration locktrace's report footer uses (hits × cost per hit)
/// and returns a line for the results.
fn save(emulated_ns: f64, stepped_ns: f64, handoff_ns: f64, lock_pair_ns: f64) -> Result<String> {
    let path = Path::new(CALIBRATION_FILE);
    let calibration = Calibration {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")?
            .trim()
            .to_string(),
        emulated_ns: emulated_ns.round().max(0.0) as u64,
        stepped_ns: stepped_ns.round().max(0.0) as u64,
        handoff_ns: handoff_ns.round().max(1.0) as u64,
        lock_pair_ns,
    };
    std::fs::create_dir_all(path.parent().expect("has a parent"))?;
    std::fs::write(path, serde_json::to_string_pretty(&calibration)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(format!(
        "\nCalibration saved to {} (median emulated class {emulated_ns:.0} ns, single-stepped {stepped_ns:.0} ns per hit, {handoff_ns:.0} ns per handoff, {lock_pair_ns:.2} ns per lock pair); locktrace's `overhead`, `handoffs` and `removal` use it on this kernel.\n",
        path.display()
    ))
}
