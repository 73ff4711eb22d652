//! locktrace: per-lock acquisition and contention counts for a live process.
mod collect;
mod compare;
mod holds;
mod loader;
mod loadgen;
mod lockfuncs;
mod overhead;
mod placement;
mod record;
mod report;
mod request_probe;
mod requests;
mod sampling;
mod stacks;
mod symbolize;
mod table;
mod target;
mod tracefs;
mod window;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "locktrace",
    version,
    about = "Count pthread lock acquisitions and futex contention per lock in a running process"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Per-request figures: how requests are counted.
#[derive(clap::Args)]
struct RequestArgs {
    /// Drive HTTP/1.1 keep-alive GET load at this URL over the traced window; counts responses.
    #[arg(long, value_name = "URL")]
    load: Option<String>,
    /// Requests to send with --load (default 1000; or give --duration).
    #[arg(
        short = 'n',
        long = "load-requests",
        value_name = "REQUESTS",
        requires = "load",
        conflicts_with = "duration"
    )]
    load_requests: Option<u64>,
    /// Connections (each keep-alive, one request in flight) for --load.
    #[arg(short = 'c', long, default_value_t = 4, requires = "load")]
    concurrency: usize,
    /// The status every response must have.
    #[arg(long, default_value_t = 200, requires = "load")]
    expect_status: u16,
    /// Text every response body must contain.
    #[arg(long, value_name = "TEXT", requires = "load")]
    expect_body: Option<String>,
    /// Give per-request figures even when some responses were unexpected.
    #[arg(long, requires = "load")]
    allow_errors: bool,
    /// Requests sent before tracing starts (not counted).
    #[arg(long, default_value_t = 0, value_name = "N", requires = "load")]
    warmup: u64,
    /// CPUs for the load driver's threads, e.g. 1 or 0,2-3 (keep them off the target's).
    #[arg(long, value_name = "LIST", requires = "load")]
    load_cpus: Option<String>,
    /// Count calls of a function that runs once per request, e.g. libphp.so:php_request_startup.
    #[arg(long, value_name = "MODULE:SYMBOL")]
    request_probe: Option<String>,
    /// Requests served in the window, counted elsewhere (wrk, an access log).
    #[arg(long, value_name = "N")]
    requests: Option<u64>,
}

impl RequestArgs {
    fn options(self, duration: Option<Duration>) -> Result<window::RequestOptions> {
        let load = match self.load {
            Some(url) => Some(loadgen::LoadOptions {
                url,
                amount: match (self.load_requests, duration) {
                    (Some(0), _) => anyhow::bail!("-n must be at least 1"),
                    (Some(n), _) => loadgen::Amount::Requests(n),
                    (None, Some(duration)) => loadgen::Amount::Duration(duration),
                    (None, None) => loadgen::Amount::Requests(1000),
                },
                concurrency: self.concurrency,
                expect_status: self.expect_status,
                expect_body: self.expect_body,
                warmup: self.warmup,
                cpus: self
                    .load_cpus
                    .as_deref()
                    .map(loadgen::parse_cpu_list)
                    .transpose()?,
            }),
            None => None,
        };
        Ok(window::RequestOptions {
            load,
            probe: self.request_probe,
            given: self.requests,
            allow_errors: self.allow_errors,
        })
    }
}

#[derive(Subcommand)]
enum Command {
    /// Attach to a running process and count its lock acquisitions and contention.
    Record {
        /// Process to trace (the host's pid, also for a process in a container).
        #[arg(long, short)]
        pid: u32,
        /// Stop after this many seconds (default: until Ctrl-C or the target exits); with --load, send load this long.
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
        #[command(flatten)]
        requests: RequestArgs,
        /// Record user stacks and keep the top N per lock (names resolved).
        #[arg(long, value_name = "N", default_value_t = 0)]
        stacks: usize,
        /// Also probe the unlock functions: hold time per lock and per holder function (about doubles the probe hits).
        #[arg(long)]
        hold_times: bool,
    },
    /// Compare two reports per request: which locks appeared, disappeared or changed.
    Compare(compare::CompareArgs),
    /// Print a saved JSON report again.
    Report {
        file: PathBuf,
        #[arg(long)]
        top: Option<usize>,
        /// `table`, `folded` (stacks for flame graph tools) or `svg` (a flame graph).
        #[arg(long, value_enum, default_value = "table")]
        format: stacks::Format,
        /// With the table: print every lock's wait (and hold) histogram in full.
        #[arg(long)]
        histograms: bool,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            use clap::error::ErrorKind;
            if matches!(
                error.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = error.print();
                return ExitCode::SUCCESS;
            }
            // One line, not clap's multi-line usage block.
            let rendered = error.render().to_string();
            // The message may continue on indented lines (e.g. the missing arguments) before the usage.
            let message: Vec<&str> = rendered
                .lines()
                .take_while(|line| !line.starts_with("Usage:"))
                .map(str::trim)
                .filter(|line| !line.is_empty())
                .collect();
            let joined = message.join(" ");
            let first = if joined.is_empty() {
                "invalid arguments"
            } else {
                joined.trim_start_matches("error: ")
            };
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
        Command::Record {
            pid,
            duration,
            json,
            placement,
            mode,
            sample,
            sample_period,
            top,
            requests,
            stacks,
            hold_times,
        } => {
            let duration = match duration {
                Some(seconds) if seconds.is_finite() && seconds > 0.0 => {
                    Some(Duration::from_secs_f64(seconds))
                }
                Some(seconds) => {
                    anyhow::bail!("--duration must be a positive number of seconds, not {seconds}")
                }
                None => None,
            };
            if !(sample > 0.0 && sample <= 1.0) {
                anyhow::bail!("--sample must be a fraction in (0, 1], not {sample}");
            }
            if !(sample_period.is_finite() && sample_period >= 0.1) {
                anyhow::bail!("--sample-period must be at least 0.1 seconds, not {sample_period}");
            }
            let sample = sampling::SampleOptions {
                rate: sample,
                period: Duration::from_secs_f64(sample_period),
            };
            let requests = requests.options(duration)?;
            // With --load, --duration is the load's length, not a tracing limit.
            let duration = if requests.load.is_some() {
                None
            } else {
                duration
            };
            let options = record::RecordOptions {
                pid,
                duration,
                placement,
                mode,
                sample,
                requests,
                stacks,
                hold_times,
            };
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()?;
            let report = runtime.block_on(record::record(&options))?;
            print!("{}", table::render(&report, top));
            if let Some(path) = json {
                report.save(&path)?;
            }
            if let Some(reason) = report.requests.as_ref().and_then(|r| r.refused.as_ref()) {
                eprintln!("locktrace: {reason}");
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Compare(args) => compare::run(&args),
        Command::Report {
            file,
            top,
            format,
            histograms,
        } => {
            let report = report::Report::load(&file)?;
            match format {
                stacks::Format::Table => {
                    print!("{}", table::render(&report, top));
                    if histograms {
                        print!("{}", holds::render_histograms(&report, top));
                    }
                }
                other => stacks::write(&report, other, &mut std::io::stdout().lock())?,
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
