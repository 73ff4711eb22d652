//! Issue 32: what removing a lock would save, predicted by locktrace, against
//! what the change saved. Three pairs of versions:
//!
//! - lockcost (fixtures/cpucost.c): 4 threads sharing one mutex vs each its own;
//! - the demo's server (fixtures/httpd.c): the stats mutex vs relaxed atomics;
//! - the real FrankenPHP: stock libphp vs the mysqlnd atomic-statistics patch.
//!
//! Each round records each version once, before then after, in contention
//! mode with the CPU sampler at 999 Hz (no lock probes: the contention is
//! the untraced program's). Measured: the target's CPU per operation or
//! request in that recording (`cpu.target_ns` less the tracer's own share,
//! `cpu.tracer_ns`); the saving is the difference of the two medians over
//! the rounds, its spread the range of the rounds' own differences.
//! Predicted: the fall of the locks' removal price (`compare`'s "predicted
//! saving"), before minus after, the median over the rounds, with the bound
//! locktrace states.
use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use locktrace::model::Report;

use crate::{Bench, franken_bench, tracers};

/// One pair's figures, per operation or request, in ns.
struct Pair {
    name: &'static str,
    unit: &'static str,
    measured: Vec<(f64, f64)>,
    predicted: Vec<(f64, f64)>,
}

/// Recording flags of the predictions.
const RECORD: [&str; 4] = ["--mode", "contention", "--cpu-hz", "999"];
/// A prediction passes when within this share of the measured saving.
const TOLERANCE: f64 = 0.25;

pub fn run(bench: &Bench) -> Result<String> {
    let mut text = String::from(
        "\n### What removing a lock saves: predicted vs measured (issue 32)\n\n\
         | pair | unit | measured saving (median before - median after) | rounds' differences | predicted (median) | stated bound | off by | within ±25% |\n\
         |---|---|---:|---|---:|---:|---:|---|\n",
    );
    let rounds = bench.runs.max(5);
    let mut pairs = vec![lockcost(bench, rounds)?, demo(bench, rounds)?];
    if Path::new(franken_bench::BINARY).exists() {
        pairs.push(franken(bench, rounds)?);
    } else {
        text.push_str("| FrankenPHP | - | not run: the kit is not built | | | | | |\n");
    }
    for pair in &pairs {
        let line = row(pair);
        eprint!("{line}");
        text.push_str(&line);
    }
    text.push_str(
        "\nThe prediction is each recording's sum of `locks[].removal.saving_ns` (lock code = calls × the \
         calibrated pair cost, handoffs × the calibrated transfer cost, the sampled kernel futex time) per \
         operation or request, before minus after.\n",
    );
    Ok(text)
}

fn row(pair: &Pair) -> String {
    let median_of = |values: Vec<f64>| {
        let mut values = values;
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let measured = median_of(pair.measured.iter().map(|m| m.0).collect())
        - median_of(pair.measured.iter().map(|m| m.1).collect());
    let differences: Vec<f64> = pair.measured.iter().map(|(b, a)| b - a).collect();
    let low = differences.iter().copied().fold(f64::INFINITY, f64::min);
    let high = differences
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max);
    let predicted = median_of(pair.predicted.iter().map(|p| p.0).collect());
    let bound = median_of(pair.predicted.iter().map(|p| p.1).collect());
    let off = (predicted - measured) / measured;
    format!(
        "| {} | {} | {} | {} .. {} | {} | ±{} | {:+.0}% | {} |\n",
        pair.name,
        pair.unit,
        ns(measured),
        ns(low),
        ns(high),
        ns(predicted),
        ns(bound),
        off * 100.0,
        if off.abs() <= TOLERANCE { "yes" } else { "NO" }
    )
}

fn ns(value: f64) -> String {
    if value.abs() >= 1000.0 {
        format!("{:.2} µs", value / 1000.0)
    } else {
        format!("{value:.1} ns")
    }
}

/// What one recording of one version gave, per operation or request.
#[derive(Debug, Clone, Copy)]
struct Recorded {
    /// The target's CPU less the tracer's share.
    cpu_ns: f64,
    /// The lock rows' removal price and its bound.
    price_ns: f64,
    bound_ns: f64,
}

fn recorded(report: &Report, divisor: f64) -> Result<Recorded> {
    let rows = report.locks.iter().filter(|lock| lock.is_contention());
    let (saving, error) = rows
        .filter_map(|lock| lock.removal.as_ref())
        .fold((0.0, 0.0), |(s, e), r| (s + r.saving_ns, e + r.error_ns));
    let cpu = report.cpu.as_ref().context("the report has no cpu block")?;
    let target = cpu
        .target_ns
        .context("the target's CPU time was not read")?;
    Ok(Recorded {
        cpu_ns: target.saturating_sub(cpu.tracer_ns) as f64 / divisor,
        price_ns: saving / divisor,
        bound_ns: error / divisor,
    })
}

impl Pair {
    fn new(name: &'static str, unit: &'static str) -> Pair {
        Pair {
            name,
            unit,
            measured: Vec::new(),
            predicted: Vec::new(),
        }
    }

    fn add(&mut self, before: Recorded, after: Recorded) {
        eprintln!("savings {}: before {before:?}, after {after:?}", self.name);
        self.measured.push((before.cpu_ns, after.cpu_ns));
        self.predicted.push((
            before.price_ns - after.price_ns,
            before.bound_ns + after.bound_ns,
        ));
    }
}

fn compile(bench: &Bench, source: &str, name: &str) -> Result<PathBuf> {
    let binary = bench.out.join(name);
    let output = Command::new("gcc")
        .args(["-O2", "-g", "-pthread", "-o"])
        .arg(&binary)
        .arg(bench.root.join(source))
        .output()
        .context("running gcc")?;
    if !output.status.success() {
        bail!(
            "compiling {source}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(binary)
}

/// A fixture that printed `ready` and waits for a line on stdin.
struct Started {
    child: Child,
    stdout: BufReader<ChildStdout>,
    /// What it printed before `ready`.
    lines: Vec<String>,
}

impl Started {
    fn spawn(binary: &Path, args: &[&str]) -> Result<Started> {
        let mut child = Command::new(binary)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut stdout = BufReader::new(child.stdout.take().context("piped stdout")?);
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            if stdout.read_line(&mut line)? == 0 {
                bail!("{} ended before `ready`", binary.display());
            }
            match line.trim() {
                "ready" => break,
                other => lines.push(other.to_string()),
            }
        }
        Ok(Started {
            child,
            stdout,
            lines,
        })
    }

    /// The port a server printed (`port N`).
    fn port(&self) -> Result<u16> {
        self.lines
            .iter()
            .find_map(|line| line.strip_prefix("port ")?.parse().ok())
            .context("the server printed no port")
    }

    /// A `NAME VALUE` line's value.
    fn figure(&mut self, name: &str) -> Result<f64> {
        let line = crate::fixtures::read_until(&mut self.stdout, "fixture", |line| {
            line.starts_with(name)
        })?;
        line[name.len()..]
            .trim()
            .parse()
            .with_context(|| format!("{name} in {line:?}"))
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        // Only the process this bench started, by its pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// lockcost: `cpucost 4 200000 300 300 MODE`, recorded from before its
/// work starts until after it ends; per operation.
fn lockcost(bench: &Bench, rounds: usize) -> Result<Pair> {
    let binary = compile(bench, "fixtures/cpucost.c", "cpucost")?;
    let run = |mode: &str| -> Result<Recorded> {
        let mut fixture = Started::spawn(&binary, &["4", "200000", "300", "300", mode])?;
        let running = tracers::start(
            &tracers::locktrace(&RECORD),
            fixture.child.id(),
            &bench.locktrace,
        )?
        .context("locktrace did not start")?;
        writeln!(fixture.child.stdin.as_mut().context("stdin")?, "go")?;
        fixture.figure("cpu_ns")?;
        let ops = fixture.figure("ops")?;
        std::thread::sleep(Duration::from_millis(300));
        running.interrupt();
        let report = running
            .finish()?
            .report
            .context("locktrace wrote no report")?;
        recorded(&report, ops)
    };
    let mut pair = Pair::new("lockcost: shared mutex -> own mutex", "CPU per operation");
    for _ in 0..rounds {
        let before = run("shared")?;
        let after = run("own")?;
        pair.add(before, after);
    }
    Ok(pair)
}

/// `record --pid PID` while wrk loads `url`, per request (the request
/// probe's count, or the recognised server's).
fn record_server(
    bench: &Bench,
    pid: u32,
    url: &str,
    seconds: f64,
    extra: &[&str],
) -> Result<Recorded> {
    let mut args: Vec<&str> = RECORD.to_vec();
    args.extend_from_slice(extra);
    let running = tracers::start(&tracers::locktrace(&args), pid, &bench.locktrace)?
        .context("locktrace did not start")?;
    let wrk = crate::http_bench::wrk(url, seconds)?;
    running.interrupt();
    let report = running
        .finish()?
        .report
        .context("locktrace wrote no report")?;
    let requests = match report.requests.as_ref() {
        Some(requests) if requests.count > 0 => requests.count as f64,
        _ => bail!(
            "the recording counted no requests: {}",
            String::from_utf8_lossy(&wrk.stdout)
        ),
    };
    recorded(&report, requests)
}

/// Statistics updates per request in the demo's server for this pair: as
/// many as mysqlnd's global statistics per query page (408), so that the
/// lock's price is well above the noise of a request's CPU.
const DEMO_UPDATES: &str = "408";

/// The demo's server (fixtures/httpd.c), 4 threads, mutex vs atomic.
fn demo(bench: &Bench, rounds: usize) -> Result<Pair> {
    let binary = compile(bench, "fixtures/httpd.c", "httpd-savings")?;
    let seconds = bench.seconds.max(3.0);
    let probe = format!("{}:handle_request", binary.display());
    let run = |mode: &str| -> Result<Recorded> {
        let server = Started::spawn(&binary, &["0", mode, DEMO_UPDATES, "4"])?;
        let url = format!("http://127.0.0.1:{}/", server.port()?);
        record_server(
            bench,
            server.child.id(),
            &url,
            seconds,
            &["--request-probe", &probe],
        )
    };
    let mut pair = Pair::new(
        "demo server (K = 408): stats mutex -> atomics",
        "CPU per request",
    );
    for _ in 0..rounds {
        let before = run("mutex")?;
        let after = run("atomic")?;
        pair.add(before, after);
    }
    Ok(pair)
}

/// The real FrankenPHP in classic mode, stock vs patched libphp.
fn franken(bench: &Bench, rounds: usize) -> Result<Pair> {
    let kit = franken_bench::kit_dir(bench);
    let _lock = franken_bench::ExclusiveLock::take(franken_bench::LOCK_FILE)?;
    let seconds = bench.seconds.max(8.0);
    let mut pair = Pair::new(
        "FrankenPHP: stock -> mysqlnd atomic statistics",
        "CPU per request",
    );
    let run = |version: &str| -> Result<Recorded> {
        franken_bench::script(&kit, &format!("use-{version}.sh"), &[])?;
        franken_bench::script(&kit, "start.sh", &["classic"])?;
        let pid = franken_bench::server_pid()?;
        // Warm: opcache-less PHP compiles, MariaDB's caches fill.
        Command::new("wrk")
            .args(["-t1", "-c4", "-d2s", franken_bench::URL])
            .output()
            .context("running wrk")?;
        record_server(bench, pid, franken_bench::URL, seconds, &[])
    };
    let result = (|| -> Result<()> {
        for _ in 0..rounds {
            let before = run("stock")?;
            let after = run("patched")?;
            pair.add(before, after);
        }
        Ok(())
    })();
    let _ = franken_bench::script(&kit, "use-stock.sh", &[]);
    let _ = franken_bench::script(&kit, "stop.sh", &[]);
    result.map(|()| pair)
}
