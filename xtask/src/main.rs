//! Developer tasks: `cargo xtask bench` (results and method:
//! docs/benchmarks.md) and `cargo xtask dist` (the release tarball, `dist.rs`).
//!
//! The bench runs real processes under real tracers, side by side in one run:
//! 1. calibration: the cost of one uprobe hit per instruction class on the
//!    running kernel (fixtures/bench/calib.c: a pthread_mutex_lock whose first
//!    instruction is of that class, probed at the entry by locktrace);
//! 2. ns added per lock on an uncontended one-thread loop
//!    (fixtures/bench/loop.c): untraced, locktrace entry / auto placement,
//!    `--hold-times` (unlock probes too), contention mode, sampled mode, and
//!    Debian's bpftrace with the equivalent one-liner;
//! 3. locktrace's attach time, CPU time and peak RSS (from wait4's rusage,
//!    the same way for bpftrace);
//! 4. the HTTP fixture's throughput under wrk with each tracer;
//! 5. the real FrankenPHP's throughput, when the kit in ../shared/frankenphp
//!    is built (under `flock /tmp/franken.lock`);
//! 6. what opening and closing a sampled window costs, by mechanism;
//! 7. what a stack snapshot costs the target (`--stacks`).
//!
//! Needs root (BPF). Run: `cargo xtask bench [--seconds S] [--runs N] [--only loop]`
//! (`--only loop`: part 2 and 3 on the loop only, a quick look at one change;
//! `--only calibration`: part 1; `--only franken`: part 5; `--only windows`: part 6;
//! `--only franken-contention`: part 5's contention-mode rows alone;
//! `--only franken-stacks`: part 5's all-locks rows with and without `--stacks`;
//! `--only franken-php`: part 5's all-locks rows with and without `--php`;
//! `--only franken-inproc`: part 5's `--mode inproc` row, all-locks and the floor,
//! both also without the init probes (what creation sites cost);
//! `--only franken-inproc-parts`: inproc with each part beside its stubs left out;
//! `--only franken-inproc-costs`: each BPF program's runs and time per request under inproc;
//! `--only snapshots`: part 7; `--only kernel-locks`: what the kernel lock
//! tracepoints cost an uncontended workload and the real FrankenPHP under
//! load, untraced, without and with them, and the kernel locks listed under
//! that load; `--only agent`: `locktrace agent`'s own CPU and the real
//! FrankenPHP's throughput with the agent on against off; `--only agent-age`:
//! one agent's CPU in `--runs` slices of `--seconds`, by its age).
mod agent_bench;
mod calibration;
mod dist;
mod fixtures;
mod franken_bench;
mod http_bench;
mod inproc_costs;
mod kernel_floor;
mod kernel_locks_bench;
mod kernel_locks_franken;
mod loop_bench;
mod results;
mod savings_bench;
mod snapshot_bench;
mod tracers;
mod window_bench;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "locktrace developer tasks"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Measure locktrace's overhead against bpftrace and save the per-hit
    /// calibration (needs root; see docs/benchmarks.md).
    Bench(BenchArgs),
    /// Build the release tarball: a static locktrace, man pages,
    /// completions, licences (target/dist/locktrace-VERSION-x86_64-linux.tar.gz).
    Dist,
}

#[derive(clap::Args, Debug, Clone, Copy)]
pub struct BenchArgs {
    /// Seconds per measured run (the HTTP part runs at least 12).
    #[arg(long, default_value_t = 3.0, value_parser = positive_seconds)]
    pub seconds: f64,
    /// Runs per configuration; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Run one part only (`loop`: the uncontended loop; `calibration`: the
    /// cost per hit by instruction class; `franken`: the real FrankenPHP;
    /// `franken-contention`: its contention-mode rows only, for many rounds;
    /// `franken-stacks`: its all-locks rows with and without `--stacks`;
    /// `franken-php`: its all-locks rows with and without `--php`;
    /// `franken-inproc`: `--mode inproc` beside all-locks mode and the floor;
    /// `franken-inproc-parts`: `--mode inproc` with each part beside its stubs left out;
    /// `franken-inproc-costs`: each BPF program's runs and time per request under inproc;
    /// `windows`: attaching and detaching a sampled window, by mechanism;
    /// `snapshots`: the cost of one stack snapshot and of `--stacks` per call;
    /// `kernel-locks`: the kernel lock tracepoints on an uncontended workload
    /// and on the real FrankenPHP under load;
    /// `agent`: the agent's own CPU and FrankenPHP's throughput with it;
    /// `agent-age`: one agent's CPU in `--runs` slices of `--seconds`, by its age).
    #[arg(long, value_enum)]
    pub only: Option<Part>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Loop,
    Calibration,
    Franken,
    /// The FrankenPHP part's contention-mode rows only (and one at 999 Hz):
    /// a few percent is below one round's noise on this VM, so it takes many rounds.
    FrankenContention,
    /// The FrankenPHP part's all-locks rows with and without `--stacks`
    /// (whole stacks from snapshots: what they cost the real server).
    FrankenStacks,
    /// The FrankenPHP part's all-locks rows with and without `--php`
    /// (routes, and PHP frames with `--stacks`: what reading PHP costs).
    FrankenPhp,
    /// The FrankenPHP part's `--mode inproc` row beside all-locks mode and
    /// the kernel's floor.
    FrankenInproc,
    /// The FrankenPHP part's `--mode inproc` row with each part beside its
    /// stubs left out in turn: what the rest of inproc's cost is made of.
    FrankenInprocParts,
    /// Each BPF program's runs and run time per request under `--mode
    /// inproc --stacks 8 --php` (the kernel's statistics): what the parts
    /// cost, without throughput ratios.
    FrankenInprocCosts,
    Windows,
    /// What one stack snapshot costs the target, and `--stacks` per lock call.
    Snapshots,
    /// What removing a lock saves: locktrace's prediction against the
    /// measured saving, on lockcost, the demo's server and FrankenPHP.
    Savings,
    /// What the kernel lock tracepoints cost an uncontended workload
    /// (fixtures/map_worker.c, one mapper) and the real FrankenPHP under
    /// load, as ratios to untraced; the kernel locks listed under that load.
    KernelLocks,
    /// `locktrace agent` watching the real FrankenPHP under load: the
    /// throughput with it on against off, and its own CPU.
    Agent,
    /// One `locktrace agent` watching the real FrankenPHP under load for
    /// `--runs` slices of `--seconds`: its CPU by its age.
    AgentAge,
}

fn positive_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && seconds > 0.0 => Ok(seconds),
        _ => Err(format!("{text:?} is not a positive number of seconds")),
    }
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Bench(args) => bench(args),
        Task::Dist => dist::run(&repo_root()).map(drop),
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn bench(args: BenchArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("cargo xtask bench needs root (it attaches BPF programs)");
    }
    let root = repo_root();
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "tracer-user"])
        .current_dir(&root)
        .status()
        .context("building locktrace")?;
    if !status.success() {
        bail!("building locktrace (release) failed");
    }
    let bench = Bench {
        locktrace: root.join("target/release/locktrace"),
        out: root.join("target/bench"),
        root,
        seconds: args.seconds,
        runs: args.runs as usize,
    };
    std::fs::create_dir_all(&bench.out)?;

    let runs = |part: Part| args.only.is_none_or(|only| only == part);
    let mut report = results::header(&args)?;
    if runs(Part::Calibration) {
        report.push_str(&calibration::run(&bench)?);
    }
    if runs(Part::Loop) {
        report.push_str(&loop_bench::run(&bench)?);
    }
    if args.only.is_none() {
        report.push_str(&http_bench::run(&bench)?);
    }
    if runs(Part::Franken) {
        report.push_str(&franken_bench::run(&bench, franken_bench::Rows::All)?);
    }
    if args.only == Some(Part::FrankenContention) {
        report.push_str(&franken_bench::run(
            &bench,
            franken_bench::Rows::Contention,
        )?);
    }
    if args.only == Some(Part::FrankenStacks) {
        report.push_str(&franken_bench::run(&bench, franken_bench::Rows::Stacks)?);
    }
    if args.only == Some(Part::FrankenInproc) {
        report.push_str(&franken_bench::run(&bench, franken_bench::Rows::Inproc)?);
    }
    if args.only == Some(Part::FrankenInprocParts) {
        report.push_str(&franken_bench::run(
            &bench,
            franken_bench::Rows::InprocParts,
        )?);
    }
    if args.only == Some(Part::FrankenInprocCosts) {
        report.push_str(&inproc_costs::run(&bench)?);
    }
    if args.only == Some(Part::FrankenPhp) {
        report.push_str(&franken_bench::run(&bench, franken_bench::Rows::Php)?);
    }
    if runs(Part::Windows) {
        report.push_str(&window_bench::run(&bench)?);
    }
    if runs(Part::Snapshots) {
        report.push_str(&snapshot_bench::run(&bench)?);
    }
    if runs(Part::Savings) {
        report.push_str(&savings_bench::run(&bench)?);
    }
    if runs(Part::KernelLocks) {
        report.push_str(&kernel_locks_bench::run(&bench)?);
        report.push_str(&kernel_locks_franken::run(&bench)?);
    }
    if runs(Part::Agent) {
        report.push_str(&agent_bench::run(&bench)?);
    }
    if args.only == Some(Part::AgentAge) {
        report.push_str(&agent_bench::run_age(&bench)?);
    }
    results::write(&bench.out, &report)
}

/// What every part of the bench needs.
pub struct Bench {
    pub root: PathBuf,
    /// Where fixtures are compiled and results written.
    pub out: PathBuf,
    /// The release binary under test.
    pub locktrace: PathBuf,
    pub seconds: f64,
    pub runs: usize,
}
