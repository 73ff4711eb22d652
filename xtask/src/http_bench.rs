//! Throughput of the fixture HTTP server (fixtures/httpd.c, mutex mode, 400
//! locks per request) under wrk: untraced, each locktrace mode, bpftrace.
//! The server runs on CPU 0 and wrk on CPU 1, so the load does not compete
//! with the target; the tracers are not pinned.
use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};
use nix::{sys::signal::Signal, unistd::Pid};

use crate::{
    Bench,
    fixtures::read_until,
    results::{self, HTTP_K, HttpSample},
    tracers::{self, Tracer},
};

pub fn run(bench: &Bench) -> Result<String> {
    ensure_wrk()?;
    // At least two windows of sampled mode's default 5 s period.
    let seconds = bench.seconds.max(12.0);
    let httpd = bench.out.join("httpd");
    let status = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&httpd)
        .arg(bench.root.join("fixtures/httpd.c"))
        .status()
        .context("running gcc")?;
    if !status.success() {
        bail!("compiling fixtures/httpd.c failed");
    }
    let probe = ["--request-probe", "httpd:handle_request"];
    let with_probe = |args: &[&str]| tracers::locktrace(&[args, &probe[..]].concat());
    let configs: Vec<(&str, Tracer)> = vec![
        ("untraced", Tracer::None),
        (
            "locktrace --placement entry",
            with_probe(&["--placement", "entry"]),
        ),
        (
            "locktrace --placement auto (default)",
            with_probe(&["--placement", "auto"]),
        ),
        (
            "locktrace --mode contention",
            // No request probe: contention mode's own cost (no per-request column).
            tracers::locktrace(&["--mode", "contention"]),
        ),
        (
            "locktrace --mode contention --no-cpu",
            // The same without the CPU sampler: the difference is its cost.
            tracers::locktrace(&["--mode", "contention", "--no-cpu"]),
        ),
        (
            "locktrace --mode sampled --sample 0.1",
            with_probe(&["--mode", "sampled", "--sample", "0.1"]),
        ),
        ("bpftrace uprobe one-liner", tracers::bpftrace_one_liner()),
    ];
    let mut all: Vec<Vec<HttpSample>> = vec![Vec::new(); configs.len()];
    for round in 0..bench.runs {
        for ((name, tracer), samples) in configs.iter().zip(&mut all) {
            let sample = run_http(&httpd, seconds, tracer, &bench.locktrace)?;
            eprintln!("http round {round}: {name}: {sample:?}");
            samples.push(sample);
        }
    }
    let medians: Vec<(&str, HttpSample)> = configs
        .iter()
        .zip(all)
        .map(|((name, _), mut samples)| {
            samples.sort_by(|a, b| a.requests_per_s.total_cmp(&b.requests_per_s));
            (*name, samples[samples.len() / 2])
        })
        .collect();
    Ok(results::http_table(seconds, bench.runs, &medians))
}

pub fn ensure_wrk() -> Result<()> {
    if Command::new("wrk").arg("--version").output().is_ok() {
        return Ok(());
    }
    let status = Command::new("apt-get")
        .args(["install", "-y", "-qq", "wrk"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status();
    match status {
        Ok(status) if status.success() => Ok(()),
        _ => bail!("the bench needs wrk; install it with: apt-get update && apt-get install wrk"),
    }
}

fn run_http(httpd: &Path, seconds: f64, tracer: &Tracer, locktrace: &Path) -> Result<HttpSample> {
    let mut server = Command::new("taskset")
        .args(["-c", "0"])
        .arg(httpd)
        .args(["0", "mutex", &HTTP_K.to_string(), "4"])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the HTTP fixture")?;
    let pid = server.id();
    let mut server_out = BufReader::new(server.stdout.take().expect("piped"));
    let port_line = read_until(&mut server_out, "httpd", |line| line.starts_with("port "))?;
    let port = port_line["port ".len()..].to_string();
    let stats_line = read_until(&mut server_out, "httpd", |line| {
        line.starts_with("stats_lock ")
    })?;
    let stats_lock = stats_line["stats_lock ".len()..].to_string();
    let stats_lock = u64::from_str_radix(stats_lock.trim_start_matches("0x"), 16)
        .with_context(|| format!("httpd printed a bad stats_lock address {stats_lock:?}"))?;
    read_until(&mut server_out, "httpd", |line| line == "ready")?;
    std::thread::spawn(move || for _ in server_out.lines() {});

    let running = tracers::start(tracer, pid, locktrace)?;
    let wrk = Command::new("taskset")
        .args(["-c", "1", "wrk", "-t1", "-c4"])
        .arg(format!("-d{}s", seconds.max(1.0).round()))
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .context("running wrk")?;
    let requests_per_s = wrk_requests_per_s(&wrk.stdout)?;
    let mut sample = HttpSample {
        requests_per_s,
        stats_per_request: None,
    };
    if let Some(running) = running {
        running.interrupt();
        let report = running.finish()?.report;
        sample.stats_per_request = report.and_then(|report| {
            report
                .locks
                .iter()
                .find(|lock| lock.address == stats_lock)
                .and_then(|lock| lock.per_request.as_ref()?.acquisitions)
        });
    }
    // Only the server we started, by pid.
    let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
    server.wait()?;
    Ok(sample)
}

/// wrk on `url` for `seconds` (whole seconds, at least one), one thread
/// and four connections: every bench's load on a server.
pub fn wrk(url: &str, seconds: f64) -> Result<std::process::Output> {
    Command::new("wrk")
        .args(["-t1", "-c4"])
        .arg(format!("-d{}s", seconds.round().max(1.0)))
        .arg(url)
        .output()
        .context("running wrk")
}

/// The `Requests/sec:` figure of wrk's output.
pub fn wrk_requests_per_s(stdout: &[u8]) -> Result<f64> {
    let wrk_text = String::from_utf8_lossy(stdout);
    wrk_text
        .lines()
        .find_map(|line| line.trim().strip_prefix("Requests/sec:"))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .with_context(|| format!("wrk printed no Requests/sec: {wrk_text}"))
}
