//! The results page (target/bench/results.md, also printed): the machine,
//! the command, and one table per part.
use std::{path::Path, process::Command};

use anyhow::Result;

use crate::BenchArgs;

// The benches' measurements live here, so the benches use this module and
// not the other way round.

/// One measured run of a loop fixture.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    pub ns_per_lock: f64,
    pub attach_ms: f64,
    pub tracer_cpu_s: f64,
    pub tracer_rss_mib: f64,
    /// The report's `dropped.snapshots_lost` (0 without `--stacks`).
    pub snapshots_lost: u64,
}

/// Statistics updates per request in the HTTP fixture: each takes the global
/// stats mutex and the connection's own, so 2 x 200 = 400 lock acquisitions
/// per request, about mysqlnd's count.
pub const HTTP_K: u64 = 200;

/// One measured run of the HTTP fixture under load.
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpSample {
    pub requests_per_s: f64,
    /// The stats mutex's acquisitions per request, as locktrace reported them.
    pub stats_per_request: Option<f64>,
}

/// The machine and the command line.
pub fn header(args: &BenchArgs) -> Result<String> {
    let mut text = machine();
    text.push_str(&format!(
        "\nCommand: `cargo xtask bench --seconds {} --runs {}{}` (median of {} runs); load average at start: {}\n",
        args.seconds,
        args.runs,
        args.only
            .and_then(|part| clap::ValueEnum::to_possible_value(&part))
            // As typed: `kernel-locks`, not the variant's `kernellocks`.
            .map(|value| format!(" --only {}", value.get_name()))
            .unwrap_or_default(),
        args.runs,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    ));
    Ok(text)
}

/// The loop table; the first row is untraced, the last bpftrace.
pub fn loop_table(results: &[(&str, Sample)]) -> String {
    let base = results[0].1.ns_per_lock;
    let bpftrace_added = results
        .last()
        .map_or(f64::NAN, |(_, s)| s.ns_per_lock - base);
    let mut text = String::from(
        "\n### Uncontended one-thread lock loop (fixtures/bench/loop.c)\n\n\
         | tracer | ns/lock | added ns/lock | throughput vs untraced | added vs bpftrace | attach | tracer CPU | tracer peak RSS |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (name, sample) in results {
        let added = sample.ns_per_lock - base;
        let traced = |cell: String| {
            if *name == "untraced" {
                "-".to_string()
            } else {
                cell
            }
        };
        text.push_str(&format!(
            "| {name} | {:.2} | {} | {} | {} | {} | {} | {} |\n",
            sample.ns_per_lock,
            traced(format!("{added:.2}")),
            // Locks per second traced over untraced: the CPU sampler's cost shows here.
            traced(format!("{:.3}", base / sample.ns_per_lock)),
            traced(format!("{:.3}x", added / bpftrace_added)),
            traced(format!("{:.0} ms", sample.attach_ms)),
            traced(format!("{:.2} s", sample.tracer_cpu_s)),
            traced(format!("{:.1} MiB", sample.tracer_rss_mib)),
        ));
    }
    text
}

/// The HTTP table; the first row is untraced, the last bpftrace.
pub fn http_table(seconds: f64, runs: usize, medians: &[(&str, HttpSample)]) -> String {
    let mut text = format!(
        "\n### HTTP server throughput (fixtures/httpd.c, mutex mode, K={HTTP_K}: {} lock acquisitions per request)\n\n\
         wrk -t1 -c4 -d{seconds}s on CPU 1, the server's 4 worker threads on CPU 0; locktrace counts requests with \
         `--request-probe httpd:handle_request` (all but contention mode, to show that mode's own cost). Median of {runs} runs.\n\n\
         | tracer | requests/s | vs untraced | vs bpftrace | stats mutex per request (truth {HTTP_K}) |\n|---|---:|---:|---:|---:|\n",
        2 * HTTP_K
    );
    let untraced = medians[0].1.requests_per_s;
    let bpftrace = medians[medians.len() - 1].1.requests_per_s;
    for (name, sample) in medians {
        text.push_str(&format!(
            "| {name} | {:.0} | {:.3}x | {:.1}x | {} |\n",
            sample.requests_per_s,
            sample.requests_per_s / untraced,
            sample.requests_per_s / bpftrace,
            sample.stats_per_request.map_or("-".into(), |n| format!(
                "{n:.2} ({:+.1}%)",
                (n / HTTP_K as f64 - 1.0) * 100.0
            )),
        ));
    }
    text
}

/// Writes target/bench/results.md and prints it.
pub fn write(out: &Path, report: &str) -> Result<()> {
    let path = out.join("results.md");
    std::fs::write(&path, report)?;
    println!("{report}");
    eprintln!("(also written to {})", path.display());
    Ok(())
}

fn machine() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("?");
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let memory = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .nth(1)
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or("?".into(), |kib| {
            format!("{:.1} GiB", kib / 1024.0 / 1024.0)
        });
    let os = std::fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("PRETTY_NAME="))
        .map(|l| {
            l.trim_start_matches("PRETTY_NAME=")
                .trim_matches('"')
                .to_string()
        })
        .unwrap_or_default();
    let first_line = |program: &str| {
        Command::new(program)
            .arg("--version")
            .output()
            .ok()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string()
            })
            .unwrap_or_default()
    };
    format!(
        "Machine: {cpus} CPUs ({}), {memory} RAM, {os}, Linux {}, {}, {}\n",
        model.trim(),
        kernel.trim(),
        first_line("ldd"),
        first_line("bpftrace")
    )
}
