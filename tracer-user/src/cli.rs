//! The command line: clap definitions and the dispatch to the library.
use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Result;
use clap::{Parser, Subcommand};

mod limits;

use crate::{
    agent,
    analysis::{self, sites::GroupBy},
    compare, live, loadgen,
    model::{
        Mode, Placement, Report,
        plan::{Feature, Plan, View},
    },
    probe::request_auto::RequestProbeSpec,
    record,
    render::{self, OutputFormat, Sink, TableOptions, fit::Width, output},
    serve, top,
    trace::{
        cpu::DEFAULT_CPU_HZ,
        sampled::{SampleOptions, WindowLinkChoice},
        window::RequestOptions,
    },
};

/// `--mode` on the command line (the model's [`Mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ModeArg {
    /// Every acquisition counted, exact.
    All,
    /// No lock probes: futex tracepoints only (contention exact, acquisitions unknown).
    Contention,
    /// Lock probes attached a fraction of the time (`--sample`); counts scaled, marked as estimates.
    Sampled,
    /// Every acquisition counted, exact, by stubs in the target that its GOT entries lead to
    /// (no trap; writes into the process, restores at the end: see the README).
    Inproc,
}

/// `--mode` of the live views: sampled windows are for `record` only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LiveModeArg {
    /// Every acquisition counted, exact.
    All,
    /// No lock probes: futex tracepoints only (contention exact, acquisitions unknown).
    Contention,
    /// Every acquisition counted, exact, by stubs in the target behind its GOT entries (no trap).
    Inproc,
}

impl From<LiveModeArg> for Mode {
    fn from(mode: LiveModeArg) -> Mode {
        match mode {
            LiveModeArg::All => Mode::All,
            LiveModeArg::Contention => Mode::Contention,
            LiveModeArg::Inproc => Mode::Inproc,
        }
    }
}

/// `--window-links` (sampled mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum WindowLinksArg {
    /// A uprobe-multi link per module where the kernel takes it, else a perf-event uprobe per point.
    Auto,
    /// A perf-event uprobe per probe point.
    PerfEvent,
}

impl From<ModeArg> for Mode {
    fn from(mode: ModeArg) -> Mode {
        match mode {
            ModeArg::All => Mode::All,
            ModeArg::Contention => Mode::Contention,
            ModeArg::Sampled => Mode::Sampled,
            ModeArg::Inproc => Mode::Inproc,
        }
    }
}

/// `--placement` on the command line (the model's [`Placement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PlacementArg {
    /// One probe on each function's first instruction.
    Entry,
    /// Probes on the first cheap instruction of every path from the entry; falls back to Entry.
    Auto,
}

impl From<PlacementArg> for Placement {
    fn from(placement: PlacementArg) -> Placement {
        match placement {
            PlacementArg::Entry => Placement::Entry,
            PlacementArg::Auto => Placement::Auto,
        }
    }
}

/// `--group-by`: the command line's words for [`GroupBy`] (analysis knows no clap).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum GroupByArg {
    /// One row per creation site: its locks at every address, summed.
    Site,
    /// One row per lock address.
    Address,
}

impl From<GroupByArg> for GroupBy {
    fn from(group_by: GroupByArg) -> GroupBy {
        match group_by {
            GroupByArg::Site => GroupBy::Site,
            GroupByArg::Address => GroupBy::Address,
        }
    }
}

/// `report --format`: the formats a saved report is printed in (render knows no
/// clap; JSON is what `report` reads, so it is not offered).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum FormatArg {
    Table,
    Folded,
    Svg,
    /// Gzipped pprof protobuf (`go tool pprof`, Pyroscope, Parca).
    Pprof,
}

impl From<FormatArg> for OutputFormat {
    fn from(format: FormatArg) -> OutputFormat {
        match format {
            FormatArg::Table => OutputFormat::Table,
            FormatArg::Folded => OutputFormat::Folded,
            FormatArg::Svg => OutputFormat::Svg,
            FormatArg::Pprof => OutputFormat::Pprof,
        }
    }
}

/// `locktrace report`'s flags.
#[derive(clap::Args)]
struct ReportArgs {
    /// The report `record --json` wrote.
    #[arg(value_name = "FILE.json")]
    file: PathBuf,
    /// Show at most this many locks in the table (default: all).
    #[arg(long, value_name = "N", value_parser = limits::whole::<usize>("--top", 1, None))]
    top: Option<usize>,
    /// `table`, `folded` (stacks for flame graph tools), `svg` (a flame graph) or
    /// `pprof` (gzipped protobuf for go tool pprof, Pyroscope, Parca: redirect to a file).
    #[arg(long, value_enum, default_value = "table")]
    format: FormatArg,
    /// With the table: print every lock's wait (and hold) histogram in full.
    #[arg(long)]
    histograms: bool,
    /// Print every column in full (by default the table fits the terminal, or 160 columns).
    #[arg(long)]
    wide: bool,
    /// Rows of locks named by their creation site: site merges a per-address report's rows
    /// (address cannot split a grouped report: record with --group-by address); default: as recorded.
    #[arg(long, value_enum, value_name = "HOW")]
    group_by: Option<GroupByArg>,
}

/// `locktrace compare`'s flags (the command is compare::run).
#[derive(clap::Args, Debug)]
struct CompareArgs {
    /// Report recorded before the change (with a request count).
    before: PathBuf,
    /// Report recorded after the change.
    after: PathBuf,
    /// Fail (exit 1) if a lock matching SELECTOR is still taken after; repeatable.
    /// A selector matches a lock whose name or one of whose caller functions contains it.
    #[arg(long, value_name = "SELECTOR")]
    assert_gone: Vec<String>,
    /// Fail (exit 1) if a lock matching SELECTOR is taken more than N times per request after; repeatable.
    #[arg(long, value_name = "SELECTOR=N")]
    assert_max: Vec<String>,
    /// Print every column in full (by default the table fits the terminal, or 160 columns).
    #[arg(long)]
    wide: bool,
    /// Reports with `--stacks`: show the call paths of up to N locks, those
    /// whose acquisitions per request changed most (0: none).
    // At most a row per lock the lock map holds: only lock calls have paths.
    #[arg(
        long,
        value_name = "N",
        default_value_t = compare::DEFAULT_PATH_LOCKS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
            .range(0..=u64::from(tracer_common::MAX_LOCKS))
    )]
    paths_of: usize,
}

impl From<CompareArgs> for compare::CompareOptions {
    fn from(args: CompareArgs) -> compare::CompareOptions {
        compare::CompareOptions {
            before: args.before,
            after: args.after,
            assert_gone: args.assert_gone,
            assert_max: args.assert_max,
            wide: args.wide,
            paths_of: args.paths_of,
        }
    }
}

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

/// `--php`: thread-safe PHP read from outside.
#[derive(clap::Args)]
struct PhpArgs {
    /// Thread-safe PHP (FrankenPHP, mod_php): each request's route (method and path) with its locks per request, and PHP frames (Class::method file:line) in stacks.
    #[arg(long)]
    php: bool,
    /// With --php: name routes by replacing each match of REGEX in the path with NAME (repeatable, in order), e.g. '/posts/\d+=/posts/:id'.
    #[arg(long, value_name = "REGEX=NAME", requires = "php")]
    route_pattern: Vec<String>,
    /// With --php: routes kept apart (most requests first); the rest are reported together as other routes.
    #[arg(
        long,
        value_name = "N",
        default_value_t = crate::analysis::routes::DEFAULT_MAX_ROUTES,
        allow_negative_numbers = true,
        value_parser = limits::whole::<usize>("--max-routes", 1, Some(1000))
    )]
    max_routes: usize,
}

impl PhpArgs {
    /// The route rules, or None without --php.
    fn rules(&self) -> Result<Option<crate::analysis::routes::RouteRules>> {
        if !self.php {
            return Ok(None);
        }
        let patterns = self
            .route_pattern
            .iter()
            .map(|text| crate::analysis::routes::RoutePattern::parse(text))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(crate::analysis::routes::RouteRules {
            patterns,
            max_routes: self.max_routes,
        }))
    }
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
        conflicts_with = "duration",
        value_parser = limits::whole::<u64>("-n", 1, Some(limits::MAX_LOAD_REQUESTS))
    )]
    load_requests: Option<u64>,
    /// Connections (each keep-alive, one request in flight) for --load (1 to 10000).
    #[arg(
        short = 'c',
        long,
        default_value_t = 4,
        requires = "load",
        allow_negative_numbers = true,
        value_parser = limits::whole::<usize>("-c (concurrency)", 1, Some(limits::MAX_CONCURRENCY))
    )]
    concurrency: usize,
    /// The status every response must have.
    #[arg(
        long,
        default_value_t = 200,
        requires = "load",
        allow_negative_numbers = true,
        value_parser = limits::whole::<u16>("--expect-status", 100, Some(599))
    )]
    expect_status: u16,
    /// Text every response body must contain.
    #[arg(long, value_name = "TEXT", requires = "load")]
    expect_body: Option<String>,
    /// Give per-request figures even when some responses were unexpected.
    #[arg(long, requires = "load")]
    allow_errors: bool,
    /// Requests sent before tracing starts (not counted).
    #[arg(
        long,
        default_value_t = 0,
        value_name = "N",
        requires = "load",
        allow_negative_numbers = true,
        value_parser = limits::whole::<u64>("--warmup", 0, Some(limits::MAX_LOAD_REQUESTS))
    )]
    warmup: u64,
    /// CPUs for the load driver's threads, e.g. 1 or 0,2-3 (keep them off the target's).
    #[arg(long, value_name = "LIST", requires = "load")]
    load_cpus: Option<String>,
    /// Count calls of a function that runs once per request, e.g. libphp.so:php_request_startup;
    /// auto: the one for the recognised server (the default without --load/--requests); none: no probe.
    #[arg(long, value_name = "MODULE:SYMBOL|auto|none")]
    request_probe: Option<String>,
    /// Requests served in the window, counted elsewhere (wrk, an access log).
    #[arg(long, value_name = "N", value_parser = limits::whole::<u64>("--requests", 1, None))]
    requests: Option<u64>,
}

impl RequestArgs {
    fn options(self, duration: Option<Duration>) -> Result<RequestOptions> {
        let load = match self.load {
            Some(url) => Some(loadgen::LoadOptions {
                // Checked here, before anything is attached.
                url: {
                    loadgen::check_url(&url)?;
                    url
                },
                amount: match (self.load_requests, duration) {
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
        Ok(RequestOptions {
            load,
            probe: request_spec(self.request_probe.as_deref()),
            given: self.requests,
            allow_errors: self.allow_errors,
        })
    }
}

/// What the tracer costs: the CPU sampler's rate or none, kernel locks or not.
#[derive(clap::Args)]
struct CpuArgs {
    /// CPU samples per CPU second for the CPU time per lock (default 99; 999 for bounds a third as wide, at 1-4% of a busy server's throughput).
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "no_cpu",
        allow_negative_numbers = true,
        value_parser = limits::checked(limits::cpu_hz)
    )]
    cpu_hz: Option<u64>,
    /// Do not sample the CPU (no CPU per lock; the target's CPU time is still measured).
    #[arg(long)]
    no_cpu: bool,
    /// Do not trace kernel lock contention (lock:contention_begin/end): their kernel stacks are 3-4% of a busy server's CPU here (docs/benchmarks.md).
    #[arg(long)]
    no_kernel_locks: bool,
}

impl CpuArgs {
    /// The sampling rate, None with --no-cpu.
    fn hz(&self) -> Option<u64> {
        (!self.no_cpu).then(|| self.cpu_hz.unwrap_or(DEFAULT_CPU_HZ))
    }

    fn kernel_locks(&self) -> bool {
        !self.no_kernel_locks
    }
}

/// What the live views (`serve`, `top`) attach to and how.
#[derive(clap::Args)]
struct LiveArgs {
    /// Process to trace (the host's pid, also for a process in a container).
    #[arg(long, short, help_heading = "Target")]
    pid: u32,
    /// all: every acquisition; contention: futex waits/wakes only (cheapest).
    #[arg(
        long,
        value_enum,
        default_value = "all",
        help_heading = "What to count"
    )]
    mode: LiveModeArg,
    /// Count calls of a function that runs once per request, e.g. libphp.so:php_request_startup;
    /// auto (the default): the one for the recognised server (PHP); none: no probe.
    #[arg(
        long,
        value_name = "MODULE:SYMBOL|auto|none",
        help_heading = "Requests"
    )]
    request_probe: Option<String>,
    /// Create this (empty) file once the probes are live, for scripts and tests.
    #[arg(long, value_name = "PATH", help_heading = "Output")]
    ready_file: Option<PathBuf>,
    /// Where the lock probes go.
    #[arg(long, value_enum, default_value = "auto", help_heading = "Cost")]
    placement: PlacementArg,
    /// Locks quiet this many seconds are forgotten (bounded memory when running for days).
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 300,
        help_heading = "Cost",
        value_parser = limits::whole::<u64>("--expire-after", 1, Some(limits::MAX_EXPIRE_AFTER_S))
    )]
    expire_after: u64,
    #[command(flatten, next_help_heading = "Cost")]
    cpu: CpuArgs,
    #[command(flatten, next_help_heading = "PHP")]
    php: PhpArgs,
}

impl LiveArgs {
    fn options(self) -> Result<live::LiveOptions> {
        if let Some(path) = &self.ready_file {
            limits::outputs(&[("--ready-file", path)])?;
        }
        Ok(live::LiveOptions {
            pid: self.pid,
            mode: self.mode.into(),
            placement: self.placement.into(),
            request_probe: request_spec(self.request_probe.as_deref()),
            expire_after: Duration::from_secs(self.expire_after),
            ready_file: self.ready_file,
            cpu_hz: self.cpu.hz(),
            stacks: false,
            php: self.php.rules()?,
            kernel_locks: self.cpu.kernel_locks(),
        })
    }
}

/// `locktrace agent`.
#[derive(clap::Args)]
struct AgentArgs {
    /// Address to listen on, e.g. 127.0.0.1:9464 or 0.0.0.0:9464.
    #[arg(long, value_name = "ADDR", help_heading = "Output")]
    listen: std::net::SocketAddr,
    /// Watch processes whose executable has this file name (repeatable); with any
    /// selector, the selected processes instead of the PHP servers.
    #[arg(long, value_name = "NAME", help_heading = "Target")]
    exe: Vec<String>,
    /// Watch processes whose cgroup path contains PATTERN (repeatable), e.g. kubepods or docker-.
    #[arg(long, value_name = "PATTERN", help_heading = "Target")]
    cgroup: Vec<String>,
    /// Only ever watch processes whose cgroup path contains PATTERN (repeatable), whatever
    /// found them: e.g. the PHP servers in kubepods only.
    #[arg(long, value_name = "PATTERN", help_heading = "Target")]
    within_cgroup: Vec<String>,
    /// inproc (the default): exact, cheapest, writes counting stubs into each process;
    /// all: exact, uprobes only (nothing written into processes); contention: futex waits only.
    #[arg(
        long,
        value_enum,
        default_value = "inproc",
        help_heading = "What to count"
    )]
    mode: LiveModeArg,
    /// Where the lock probes go.
    #[arg(long, value_enum, default_value = "auto", help_heading = "Cost")]
    placement: PlacementArg,
    /// Lock series per process at most, the most active; the rest add up in lock="other".
    #[arg(
        long,
        value_name = "N",
        default_value_t = 20,
        help_heading = "Output",
        value_parser = limits::whole::<usize>("--max-locks", 1, None)
    )]
    max_locks: usize,
    /// Locks quiet this many seconds are forgotten.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 300,
        help_heading = "Cost",
        value_parser = limits::whole::<u64>("--expire-after", 1, Some(limits::MAX_EXPIRE_AFTER_S))
    )]
    expire_after: u64,
    /// An exited process's series stay this many seconds (its last counts get scraped), then go.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 60,
        help_heading = "Output",
        value_parser = limits::whole::<u64>("--forget-exited", 0, Some(limits::MAX_EXPIRE_AFTER_S))
    )]
    forget_exited: u64,
    /// The agent's own CPU budget in percent of one core: above it the maps are read less
    /// often (said in one line).
    #[arg(
        long,
        value_name = "PERCENT",
        default_value_t = 5.0,
        help_heading = "Cost"
    )]
    max_cpu: f64,
    /// Create this (empty) file once listening and the first scan is done.
    #[arg(long, value_name = "PATH", help_heading = "Output")]
    ready_file: Option<PathBuf>,
    /// Also POST each process's mutex profile of each interval to a Pyroscope-compatible
    /// URL/ingest (pprof, labelled by container, pid, exe), e.g. http://pyroscope:4040.
    #[arg(long, value_name = "URL", help_heading = "Output")]
    push: Option<String>,
    /// The --push interval.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 15,
        help_heading = "Output",
        value_parser = limits::whole::<u64>("--push-every", 1, Some(3600))
    )]
    push_every: u64,
    /// Do not trace kernel lock contention in the watched processes (3-4% of a busy server's CPU here).
    #[arg(long, help_heading = "Cost")]
    no_kernel_locks: bool,
}

impl AgentArgs {
    fn options(self) -> Result<agent::AgentOptions> {
        if let Some(path) = &self.ready_file {
            limits::outputs(&[("--ready-file", path)])?;
        }
        if let Some(url) = &self.push
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            anyhow::bail!(
                "--push {url}: give the receiver's http:// or https:// URL, e.g. http://pyroscope:4040 (the profiles go to URL/ingest)"
            );
        }
        if !(self.max_cpu > 0.0 && self.max_cpu <= 100.0 * 1024.0) {
            anyhow::bail!(
                "--max-cpu {}: give a percentage above 0, e.g. 5",
                self.max_cpu
            );
        }
        Ok(agent::AgentOptions {
            listen: self.listen,
            selectors: agent::discover::Selectors {
                exe: self.exe,
                cgroup: self.cgroup,
                within: self.within_cgroup,
            },
            mode: self.mode.into(),
            placement: self.placement.into(),
            kernel_locks: !self.no_kernel_locks,
            max_locks: self.max_locks,
            expire_after: Duration::from_secs(self.expire_after),
            forget_exited: Duration::from_secs(self.forget_exited),
            max_cpu_percent: self.max_cpu,
            ready_file: self.ready_file,
            push: self.push,
            push_every: Duration::from_secs(self.push_every),
        })
    }
}

/// `--request-probe`, or the default (automatic, with a hint when unrecognised).
fn request_spec(flag: Option<&str>) -> RequestProbeSpec {
    flag.map_or(RequestProbeSpec::Default, RequestProbeSpec::parse)
}

/// The runtime of the commands that attach: one worker thread is plenty.
fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?)
}

// Parsed once per run: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Attach to a running process and count its lock acquisitions and contention.
    #[command(after_help = RECORD_EXAMPLES)]
    Record {
        /// Process to trace (the host's pid, also for a process in a container).
        #[arg(long, short, help_heading = "Target")]
        pid: u32,
        /// Stop after this many seconds (default: until Ctrl-C or the target exits); with --load, send load this long.
        #[arg(
            long,
            short,
            allow_negative_numbers = true,
            help_heading = "Target",
            value_parser = limits::checked(limits::duration)
        )]
        duration: Option<Duration>,
        /// all: every acquisition, exact; contention: futex waits/wakes only (no lock probes);
        /// sampled: lock probes a fraction of the time, counts scaled (estimates); inproc: every
        /// acquisition, exact, counted in the target by stubs behind its GOT entries (no trap).
        #[arg(
            long,
            value_enum,
            default_value = "all",
            help_heading = "What to count"
        )]
        mode: ModeArg,
        /// Record user stacks and keep the top N per lock (names resolved; N at most 16384, the stacks a recording holds).
        #[arg(
            long,
            value_name = "N",
            default_value_t = 0,
            allow_negative_numbers = true,
            help_heading = "What to count",
            value_parser = limits::whole::<usize>("--stacks", 0, Some(limits::MAX_STACKS_PER_LOCK))
        )]
        stacks: usize,
        /// With --mode inproc --stacks: take the stack of one acquisition in N per lock, call site and CPU (a power of two, 2 to 1048576; default 256). Counts stay exact; stack counts are these samples.
        #[arg(
            long,
            value_name = "N",
            help_heading = "What to count",
            value_parser = limits::power_of_two("--stack-sample-every", 2, limits::MAX_STACK_SAMPLE_EVERY)
        )]
        stack_sample_every: Option<u64>,
        /// Also probe the unlock functions: hold time per lock and per holder function (about doubles the probe hits).
        #[arg(long, help_heading = "What to count")]
        hold_times: bool,
        /// Also count each lock's acquisitions on another CPU than the one before (handoffs), by cache distance (about +6% per lock call).
        #[arg(long, help_heading = "What to count")]
        handoffs: bool,
        #[command(flatten, next_help_heading = "Requests")]
        requests: RequestArgs,
        #[command(flatten, next_help_heading = "PHP")]
        php: PhpArgs,
        /// Also write the report as JSON to this file.
        #[arg(long, value_name = "FILE", help_heading = "Output")]
        json: Option<PathBuf>,
        /// Show at most this many locks in the table (default: all).
        #[arg(
            long,
            value_name = "N",
            allow_negative_numbers = true,
            help_heading = "Output",
            value_parser = limits::whole::<usize>("--top", 1, None)
        )]
        top: Option<usize>,
        /// Also write the report as a gzipped pprof profile (go tool pprof, Pyroscope, Parca).
        #[arg(long, value_name = "FILE", help_heading = "Output")]
        pprof: Option<PathBuf>,
        /// Print every column in full (by default the table fits the terminal, or 160 columns).
        #[arg(long, help_heading = "Output")]
        wide: bool,
        /// Locks named by where they were created (`mutex created in f <- g <- h`): one row per
        /// creation site, its objects at every address summed, or one row per address.
        #[arg(
            long,
            value_enum,
            value_name = "HOW",
            default_value = "site",
            help_heading = "Output"
        )]
        group_by: GroupByArg,
        /// Create this (empty) file once the probes are live, for scripts and tests.
        #[arg(long, value_name = "PATH", help_heading = "Output")]
        ready_file: Option<PathBuf>,
        /// Where the lock probes go.
        #[arg(long, value_enum, default_value = "auto", help_heading = "Cost")]
        placement: PlacementArg,
        /// Sampled mode: fraction of the time the lock probes are in, each window's 20 ms warm-up
        /// included (0 < RATE <= 1; default 0.1).
        #[arg(
            long,
            value_name = "RATE",
            allow_negative_numbers = true,
            help_heading = "Cost",
            value_parser = limits::checked(limits::sample_rate)
        )]
        sample: Option<f64>,
        /// Sampled mode: one counting window per this many seconds (default 1 with uprobe-multi
        /// links, 5 with a perf-event uprobe per point).
        #[arg(
            long,
            value_name = "SECONDS",
            allow_negative_numbers = true,
            help_heading = "Cost",
            value_parser = limits::checked(limits::sample_period)
        )]
        sample_period: Option<Duration>,
        /// Sampled mode: how windows attach and detach the lock probes: auto (uprobe-multi
        /// links, else a perf-event uprobe per point) or perf-event (to compare).
        #[arg(long, value_enum, value_name = "HOW", help_heading = "Cost")]
        window_links: Option<WindowLinksArg>,
        #[command(flatten, next_help_heading = "Cost")]
        cpu: CpuArgs,
    },
    /// Compare two reports per request: which locks appeared, disappeared or changed.
    #[command(after_help = COMPARE_EXAMPLES)]
    Compare(CompareArgs),
    /// Serve live per-lock counters on a Prometheus /metrics endpoint (OpenMetrics text).
    #[command(after_help = SERVE_EXAMPLES)]
    Serve {
        #[command(flatten)]
        live: LiveArgs,
        /// Address to listen on, e.g. 127.0.0.1:9464 or 0.0.0.0:9464.
        #[arg(long, value_name = "ADDR", help_heading = "Output")]
        listen: std::net::SocketAddr,
        /// Lock series exported at most, the most active; the rest add up in lock="other".
        #[arg(
            long,
            value_name = "N",
            default_value_t = 50,
            help_heading = "Output",
            value_parser = limits::whole::<usize>("--max-locks", 1, None)
        )]
        max_locks: usize,
    },
    /// Watch every PHP server on the machine (FrankenPHP, thread-safe PHP) or the processes
    /// --exe/--cgroup select, as they come and go; one Prometheus /metrics labelled by container.
    #[command(after_help = AGENT_EXAMPLES)]
    Agent(AgentArgs),
    /// A live full-screen table of the busiest locks, refreshed every second (s: sort, q: quit).
    #[command(after_help = TOP_EXAMPLES)]
    Top {
        #[command(flatten)]
        live: LiveArgs,
        /// Under each lock, its most frequent whole stack (outermost frame first), unwound
        /// from stack snapshots as `record --stacks` does.
        #[arg(long)]
        stacks: bool,
    },
    /// Print a saved JSON report again.
    #[command(after_help = REPORT_EXAMPLES)]
    Report(ReportArgs),
    /// Switch back the GOT entries a `record --mode inproc` that was killed (SIGKILL)
    /// left switched in a process (the next `--mode inproc` run on it does this too).
    Restore {
        /// The process the killed recording traced.
        #[arg(long, short)]
        pid: u32,
    },
}

const RECORD_EXAMPLES: &str = "Examples:
  locktrace record --pid 1234 --duration 10 --json before.json
  locktrace record --pid 1234 --load http://127.0.0.1:8080/ -n 5000 --json before.json
  locktrace record --pid 1234 --duration 10 --mode contention
  locktrace record --pid 1234 --duration 10 --stacks 5 --hold-times
  locktrace record --pid 1234 --duration 30 --php --stacks 8 --route-pattern '/posts/\\d+=/posts/:id'";
const COMPARE_EXAMPLES: &str = "Examples:
  locktrace compare before.json after.json
  locktrace compare before.json after.json --assert-gone mysqlnd_global_stats --assert-max tsrm_env_mutex=2";
const SERVE_EXAMPLES: &str = "Examples:
  locktrace serve --pid 1234 --listen 127.0.0.1:9464
  (rules and alerts for Prometheus: docs/prometheus/locktrace-rules.yml)";
const AGENT_EXAMPLES: &str = "Examples:
  locktrace agent --listen 0.0.0.0:9464
  locktrace agent --listen 127.0.0.1:9464 --exe php-zts --cgroup kubepods
  locktrace agent --listen 127.0.0.1:9464 --push http://pyroscope:4040 --push-every 15
  (systemd unit and DaemonSet: docs/locktrace-agent.service, docs/locktrace-agent-daemonset.yaml)";
const TOP_EXAMPLES: &str = "Examples:
  locktrace top --pid 1234
  locktrace top --pid 1234 --mode contention";
const REPORT_EXAMPLES: &str = "Examples:
  locktrace report before.json --top 10
  locktrace report before.json --format svg > flame.svg
  locktrace report before.json --format pprof > before.pb.gz";

/// The command line's definition (for man pages, completions and the
/// reference in docs/cli.md).
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command()
}

/// docs/cli.md: every subcommand's `--help`, generated so it cannot drift
/// (a unit test compares it with the file).
#[cfg(test)]
pub(crate) fn reference_markdown() -> String {
    let mut root = command();
    // Usage lines then read `locktrace record …`, as typed.
    root.build();
    let mut out = String::from(
        "# Command-line reference\n\nGenerated from the command's own definition \
         (`LOCKTRACE_BLESS=1 cargo test -p tracer-user --lib cli::` rewrites it; a test \
         fails when it is stale).\n\n```text\n",
    );
    out.push_str(&root.render_long_help().to_string());
    out.push_str("```\n");
    for sub in root
        .get_subcommands_mut()
        .filter(|sub| sub.get_name() != "help")
    {
        let name = sub.get_name().to_string();
        out.push_str(&format!("\n## locktrace {name}\n\n```text\n"));
        out.push_str(&sub.render_long_help().to_string());
        out.push_str("```\n");
    }
    // No trailing spaces: clap pads some lines.
    out.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Parses the command line, runs it, and turns errors into one line and an exit code.
pub fn main() -> ExitCode {
    // Diagnostics for developers: RUST_LOG=locktrace=debug.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
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
                // --help into a closed pipe is not an error either.
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
                // clap's own pointer to --help; ours ends the line.
                .filter(|line| !line.is_empty() && !line.starts_with("For more information"))
                .collect();
            let joined = message.join(" ");
            let first = if joined.is_empty() {
                "invalid arguments"
            } else {
                joined.trim_start_matches("error: ")
            };
            output::note(format_args!("locktrace: {first} (see locktrace --help)"));
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            output::note(format_args!("locktrace: {error:#}"));
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
            window_links,
            top,
            requests,
            stacks,
            stack_sample_every,
            ready_file,
            pprof,
            hold_times,
            handoffs,
            cpu,
            wide,
            group_by,
            php,
        } => {
            let cpu_hz = cpu.hz();
            let php = php.rules()?;
            let sample = sample_options(mode, sample, sample_period, window_links)?;
            let requests = requests.options(duration)?;
            limits::open_files(
                requests
                    .load
                    .as_ref()
                    .map_or(0, |load| load.concurrency as u64),
            )?;
            limits::address_space()?;
            check_outputs(&json, &pprof, &ready_file)?;
            let stack_sample_every = stack_sample_every_of(mode, stacks, stack_sample_every)?;
            // With --load, --duration is the load's length, not a tracing limit.
            let duration = if requests.load.is_some() {
                None
            } else {
                duration
            };
            let options = record::RecordOptions {
                pid,
                duration,
                placement: placement.into(),
                mode: mode.into(),
                sample,
                requests,
                stacks,
                stack_sample_every,
                ready_file,
                hold_times,
                handoffs,
                cpu_hz,
                group_by: group_by.into(),
                php,
                kernel_locks: cpu.kernel_locks(),
            };
            let recording = runtime()?.block_on(record::record(&options))?;
            let written = write_recording(&recording.report, json, pprof, top, wide);
            // The report is out: detaching takes seconds under load.
            recording.detach();
            written
        }
        Command::Compare(args) => compare::run(&args.into()),
        Command::Serve {
            live,
            listen,
            max_locks,
        } => {
            // Scrapers' connections.
            limits::open_files(64)?;
            limits::address_space()?;
            let options = serve::ServeOptions {
                live: live.options()?,
                listen,
                max_locks,
            };
            runtime()?.block_on(serve::serve(&options))
        }
        Command::Top { live, stacks } => {
            let options = live::LiveOptions {
                stacks,
                ..live.options()?
            };
            limits::open_files(0)?;
            limits::address_space()?;
            runtime()?.block_on(top::run(&options))
        }
        Command::Agent(args) => {
            limits::open_files(64)?;
            limits::address_space()?;
            runtime()?.block_on(agent::run(&args.options()?))
        }
        Command::Report(args) => report_file(args),
        Command::Restore { pid } => restore(pid),
    }
}

/// `locktrace restore`: switches back what a killed `--mode inproc` left.
fn restore(pid: u32) -> Result<ExitCode> {
    crate::trace::preflight::check_privileges()?;
    let restored = crate::trace::inproc::session::restore_pid(pid)?;
    for line in &restored.ignored {
        output::note(format_args!("locktrace: {line}"));
    }
    let restored = restored.entries;
    let said = if restored == 0 {
        format!("nothing to restore in process {pid}: no GOT entry is left switched\n")
    } else {
        format!("restored {restored} GOT entries in process {pid}\n")
    };
    // A closed stdout is a normal end: the entries are back either way.
    let _ = std::io::Write::write_all(&mut std::io::stdout(), said.as_bytes());
    Ok(ExitCode::SUCCESS)
}

/// `--sample`/`--sample-period`, which apply only in sampled mode.
/// `--stack-sample-every`, refused without `--mode inproc --stacks N`
/// (it would change nothing), else its default.
fn stack_sample_every_of(mode: ModeArg, stacks: usize, given: Option<u64>) -> Result<u64> {
    if given.is_some() && (stacks == 0 || mode != ModeArg::Inproc) {
        anyhow::bail!(
            "--stack-sample-every applies only with --mode inproc --stacks N; add them or drop --stack-sample-every"
        );
    }
    Ok(given.unwrap_or(tracer_common::inproc_sample::DEFAULT_EVERY))
}

fn sample_options(
    mode: ModeArg,
    sample: Option<f64>,
    sample_period: Option<Duration>,
    window_links: Option<WindowLinksArg>,
) -> Result<SampleOptions> {
    Plan::new(
        View::Record,
        mode.into(),
        &[
            (Feature::Sample, sample.is_some()),
            (Feature::SamplePeriod, sample_period.is_some()),
            (Feature::WindowLinks, window_links.is_some()),
        ],
    )?;
    Ok(SampleOptions {
        rate: sample.unwrap_or(0.1),
        period: sample_period,
        links: match window_links {
            None | Some(WindowLinksArg::Auto) => WindowLinkChoice::Auto,
            Some(WindowLinksArg::PerfEvent) => WindowLinkChoice::PerfEvent,
        },
    })
}

/// The record's output files can be written (checked before tracing starts).
fn check_outputs(
    json: &Option<PathBuf>,
    pprof: &Option<PathBuf>,
    ready_file: &Option<PathBuf>,
) -> Result<()> {
    let outputs: Vec<(&str, &std::path::Path)> = [
        ("--json", json),
        ("--pprof", pprof),
        ("--ready-file", ready_file),
    ]
    .into_iter()
    .filter_map(|(flag, path)| Some((flag, path.as_deref()?)))
    .collect();
    limits::outputs(&outputs)
}

/// Saves the recording's files and prints its table; fails when the
/// request load was refused.
fn write_recording(
    report: &Report,
    json: Option<PathBuf>,
    pprof: Option<PathBuf>,
    top: Option<usize>,
    wide: bool,
) -> Result<ExitCode> {
    let table = TableOptions {
        top,
        width: Width::for_stdout(wide),
        histograms: false,
    };
    let save = |format, path: &Option<PathBuf>| {
        path.as_deref()
            .map(|path| render::write(report, format, &table, Sink::File(path)))
            .transpose()
    };
    // The JSON first: it is the recording, and must not depend on stdout.
    let saved = save(OutputFormat::Json, &json);
    let pprof_saved = save(OutputFormat::Pprof, &pprof);
    let json_on_stdout = json.as_deref().map(crate::model::Destination::of)
        == Some(crate::model::Destination::Stdout);
    // `--json -` is for a pipe into jq: the table goes to stderr. A reader
    // that went away (`| head`) is a normal end.
    let sink = if json_on_stdout {
        Sink::Stderr
    } else {
        Sink::Stdout
    };
    render::write(report, OutputFormat::Table, &table, sink)?;
    saved?;
    pprof_saved?;
    if let Some(reason) = report.requests.as_ref().and_then(|r| r.refused.as_ref()) {
        output::note(format_args!("locktrace: {reason}"));
        return Ok(ExitCode::FAILURE);
    }
    // Entries left switched: the last line says how to finish, and the
    // exit says it to scripts.
    if let Some(restore) = report.inproc.as_ref().map(|inproc| &inproc.restore)
        && restore.outcome == crate::model::RestoreOutcome::Failed
    {
        output::note(format_args!(
            "locktrace: GOT entries not restored: {}",
            restore.reason.as_deref().unwrap_or("unknown")
        ));
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// `report FILE`: a saved recording as a table or stacks.
fn report_file(args: ReportArgs) -> Result<ExitCode> {
    let ReportArgs {
        file,
        top,
        format,
        histograms,
        wide,
        group_by,
    } = args;
    let format = OutputFormat::from(format);
    let group_by = group_by.map(GroupBy::from);
    let mut report = Report::load(&file)?;
    let grouped = report.locks.iter().any(|lock| lock.group.is_some());
    match group_by {
        Some(GroupBy::Site) => analysis::sites::group_by_site(&mut report),
        Some(GroupBy::Address) if grouped => anyhow::bail!(
            "{} was recorded with its rows grouped by creation site; each address's figures are in locks[].group.by_address of the JSON, or record again with --group-by address",
            file.display()
        ),
        Some(GroupBy::Address) | None => {}
    }
    let table = TableOptions {
        top,
        width: Width::for_stdout(wide),
        histograms,
    };
    render::write(&report, format, &table, Sink::Stdout)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::{Parser, error::ErrorKind};

    /// Each bounded flag: values just out of its range are a clap error
    /// (one line, before anything runs), its boundaries are taken.
    #[test]
    fn numeric_flags_refuse_values_out_of_range_and_take_their_bounds() {
        let record = &["record", "--pid", "1"][..];
        let load = &["record", "--pid", "1", "--load", "http://127.0.0.1:9/"][..];
        let sampled = &["record", "--pid", "1", "--mode", "sampled"][..];
        let serve = &["serve", "--pid", "1", "--listen", "127.0.0.1:0"][..];
        let top = &["top", "--pid", "1"][..];
        let report = &["report", "r.json"][..];
        let compare = &["compare", "a.json", "b.json"][..];
        /// A command, one of its flags, values it refuses, values it takes.
        type Case<'a> = (&'a [&'a str], &'a str, &'a [&'a str], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                record,
                "--duration",
                &["0", "-1", "31622401", "NaN", "inf"],
                &["0.001", "31622400"],
            ),
            (record, "--stacks", &["-1", "16385"], &["0", "16384"]),
            (
                record,
                "--stack-sample-every",
                &["0", "1", "3", "255", "2097152"],
                &["2", "256", "1048576"],
            ),
            (record, "--top", &["0", "-1"], &["1"]),
            (record, "--cpu-hz", &["0", "-1", "20001"], &["1", "20000"]),
            (record, "--requests", &["0"], &["1"]),
            (sampled, "--sample", &["0", "1.01", "NaN"], &["0.001", "1"]),
            (
                sampled,
                "--sample-period",
                &["0.09", "3601"],
                &["0.1", "3600"],
            ),
            (load, "-n", &["0", "1000000001"], &["1", "1000000000"]),
            (
                load,
                "-c",
                &["0", "10001", "18446744073709551615"],
                &["1", "10000"],
            ),
            (load, "--expect-status", &["99", "600"], &["100", "599"]),
            (
                load,
                "--warmup",
                &["-1", "1000000001"],
                &["0", "1000000000"],
            ),
            (serve, "--max-locks", &["0"], &["1"]),
            (
                serve,
                "--expire-after",
                &["0", "31622401"],
                &["1", "31622400"],
            ),
            (top, "--expire-after", &["0"], &["1"]),
            (top, "--cpu-hz", &["20001"], &["20000"]),
            (report, "--top", &["0"], &["1"]),
            (compare, "--paths-of", &["65537"], &["0", "65536"]),
        ];
        for (command, flag, refused, accepted) in cases {
            let parse = |value: &str| {
                let mut argv = vec!["locktrace"];
                argv.extend(*command);
                argv.extend([*flag, value]);
                super::Cli::try_parse_from(argv)
            };
            for value in *refused {
                let error = parse(value).err();
                assert_eq!(
                    error.as_ref().map(clap::Error::kind),
                    Some(ErrorKind::ValueValidation),
                    "{flag} {value} was not refused: {error:?}"
                );
            }
            for value in *accepted {
                if let Err(error) = parse(value) {
                    panic!("{flag} {value} was refused: {error}");
                }
            }
        }
    }

    #[test]
    fn the_cli_reference_in_docs_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
        let generated = super::reference_markdown();
        if std::env::var_os("LOCKTRACE_BLESS").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let saved = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            saved == generated,
            "docs/cli.md is stale: LOCKTRACE_BLESS=1 cargo test -p tracer-user --lib cli:: rewrites it"
        );
    }
}
