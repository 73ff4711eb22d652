//! locktrace: per-lock acquisition and contention counts for a live process.
mod collect;
mod loader;
mod lockfuncs;
mod overhead;
mod placement;
mod record;
mod report;
mod sampling;
mod table;
mod target;
mod tracefs;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "locktrace", version, about = "Count pthread lock acquisitions and futex contention per lock in a running process")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Attach to a running process and count its lock acquisitions and contention.
    Record {
        /// Process to trace (the host's pid, also for a process in a container).
        #[arg(long, short)]
        pid: u32,
        /// Stop after this many seconds (default: until Ctrl-C or the target exits).
        #[arg(long, short)]
        duration: Option<f64>,
        /// Also write the report as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Where the lock probes go.
        #[arg(long, value_enum, default_value = "auto")]
        placement: placement::Placement,
        /// all: every acquisition, exact; contention: futex waits/wakes only (no lock probes);
        /// sampled: lock probes a fraction of the time, counts scaled (estimates).
        #[arg(long, value_enum, default_value = "all")]
        mode: record::Mode,
        /// Sampled mode: fraction of the time the lock probes count (0 < RATE <= 1).
        #[arg(long, default_value = "0.1")]
        sample: f64,
        /// Sampled mode: one counting window per this many seconds.
        #[arg(long, default_value = "5")]
        sample_period: f64,
        /// Show at most this many locks in the table.
        #[arg(long)]
        top: Option<usize>,
    },
    /// Print a saved JSON report again.
    Report {
        file: PathBuf,
        #[arg(long)]
        top: Option<usize>,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            use clap::error::ErrorKind;
            if matches!(error.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) {
                let _ = error.print();
                return ExitCode::SUCCESS;
            }
            // One line, not clap's multi-line usage block.
            let rendered = error.render().to_string();
            let first = rendered.lines().next().unwrap_or("invalid arguments").trim_start_matches("error: ");
            eprintln!("locktrace: {first} (see locktrace --help)");
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("locktrace: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Record { pid, duration, json, placement, mode, sample, sample_period, top } => {
            let duration = match duration {
                Some(seconds) if seconds.is_finite() && seconds > 0.0 => Some(Duration::from_secs_f64(seconds)),
                Some(seconds) => anyhow::bail!("--duration must be a positive number of seconds, not {seconds}"),
                None => None,
            };
            if !(sample > 0.0 && sample <= 1.0) {
                anyhow::bail!("--sample must be a fraction in (0, 1], not {sample}");
            }
            if !(sample_period.is_finite() && sample_period >= 0.1) {
                anyhow::bail!("--sample-period must be at least 0.1 seconds, not {sample_period}");
            }
            let sample = sampling::SampleOptions { rate: sample, period: Duration::from_secs_f64(sample_period) };
            let options = record::RecordOptions { pid, duration, placement, mode, sample };
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
            let report = runtime.block_on(record::record(&options))?;
            print!("{}", table::render(&report, top));
            if let Some(path) = json {
                report.save(&path)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Report { file, top } => {
            let report = report::Report::load(&file)?;
            print!("{}", table::render(&report, top));
            Ok(ExitCode::SUCCESS)
        }
    }
}
