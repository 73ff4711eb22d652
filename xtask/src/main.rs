//! Developer tasks: `cargo xtask bench` (results and method: docs/benchmarks.md).
//!
//! The bench runs real processes under real tracers, side by side in one run:
//! 1. calibration: the cost of one uprobe hit per instruction class on the
//!    running kernel (fixtures/bench/calib.c: a pthread_mutex_lock whose first
//!    instruction is of that class, probed at the entry by locktrace);
//! 2. ns added per lock on an uncontended one-thread loop
//!    (fixtures/bench/loop.c): untraced, locktrace entry / auto placement,
//!    `--hold-times` (unlock probes too), contention mode, sampled mode, and Debian's bpftrace with the
//!    equivalent one-liner;
//! 3. locktrace's attach time, CPU time and peak RSS (from wait4's rusage,
//!    the same way for bpftrace).
//!
//! Needs root (BPF). Run: `cargo xtask bench [--seconds S] [--runs N] [--only loop]`
//! (`--only loop`: part 2 and 3 on the loop only, a quick look at one change).
use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("bench") => {
            let mut seconds = 3.0;
            let mut runs = 3;
            let mut only_loop = false;
            let mut rest = args[1..].iter();
            while let Some(arg) = rest.next() {
                let value = rest
                    .next()
                    .with_context(|| format!("{arg} needs a value"))?;
                match arg.as_str() {
                    "--seconds" => seconds = value.parse().context("--seconds")?,
                    "--only" if value == "loop" => only_loop = true,
                    "--runs" => runs = value.parse().context("--runs")?,
                    other => bail!(
                        "unknown option {other} (usage: cargo xtask bench [--seconds S] [--runs N] [--only loop])"
                    ),
                }
            }
            bench(seconds, runs, only_loop)
        }
        _ => bail!("usage: cargo xtask bench [--seconds S] [--runs N] [--only loop]"),
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// A tracer configuration under test.
#[derive(Clone)]
enum Tracer {
    None,
    Locktrace(Vec<String>),
    /// bpftrace with this probe (`uprobe:FILE:SYMBOL`) and action; `{pid}` in
    /// the action is replaced by the fixture's pid.
    Bpftrace {
        probe: String,
        action: String,
    },
}

/// The equivalent bpftrace one-liner.
fn bpftrace_one_liner() -> Tracer {
    Tracer::Bpftrace {
        probe: "uprobe:/lib/x86_64-linux-gnu/libc.so.6:pthread_mutex_lock".into(),
        action: "/pid == {pid}/ { @[arg0] = count(); }".into(),
    }
}

/// One measured run of a loop fixture.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    ns_per_lock: f64,
    attach_ms: f64,
    tracer_cpu_s: f64,
    tracer_rss_mib: f64,
}

/// `only_loop`: just the uncontended loop (no calibration, no HTTP server).
fn bench(seconds: f64, runs: usize, only_loop: bool) -> Result<()> {
    if unsafe { libc::geteuid() } != 0 {
        bail!("cargo xtask bench needs root (it attaches BPF programs)");
    }
    let root = repo_root();
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "tracer-user"])
        .current_dir(&root)
        .status()
        .context("building locktrace")?;
    if !status.success() {
        bail!("building locktrace (release) failed");
    }
    let locktrace = root.join("target/release/locktrace");
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    let loop_bin = compile(&root, &out, "loop", &[])?;

    let mut report = String::new();
    report.push_str(&machine()?);
    report.push_str(&format!(
        "\nCommand: `cargo xtask bench --seconds {seconds} --runs {runs}{}` (median of {runs} runs); load average at start: {}\n",
        if only_loop { " --only loop" } else { "" },
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    ));

    if !only_loop {
        // 1. Calibration.
        report.push_str(
            "\n### Uprobe cost per hit, by instruction class (fixtures/bench/calib.c)\n\n",
        );
        report.push_str("| first instruction | untraced ns/call | traced ns/call | cost per hit |\n|---|---:|---:|---:|\n");
        let (mut emulated_costs, mut stepped_cost) = (Vec::new(), f64::NAN);
        for (class, define) in [
            ("mov %rdi,%rax", "CLASS_MOV"),
            ("nopl 0(%rax)", "CLASS_NOPL"),
            ("nop", "CLASS_NOP"),
            ("push %rbx", "CLASS_PUSH"),
            ("jmp rel8", "CLASS_JMP"),
            ("jne rel8", "CLASS_JCC"),
            ("call rel32", "CLASS_CALL"),
        ] {
            let binary = compile(&root, &out, "calib", &[define])?;
            let seconds = seconds.min(2.0);
            let untraced = median(runs, || {
                run_loop(&binary, seconds, &Tracer::None, &locktrace)
            })?;
            let traced = median(runs, || {
                run_loop(
                    &binary,
                    seconds,
                    &Tracer::Locktrace(vec!["--placement".into(), "entry".into()]),
                    &locktrace,
                )
            })?;
            let line = format!(
                "| `{class}` | {:.1} | {:.1} | **{:.0} ns** |\n",
                untraced.ns_per_lock,
                traced.ns_per_lock,
                traced.ns_per_lock - untraced.ns_per_lock
            );
            eprint!("{line}");
            report.push_str(&line);
            let cost = traced.ns_per_lock - untraced.ns_per_lock;
            if define == "CLASS_MOV" {
                stepped_cost = cost;
            } else {
                emulated_costs.push(cost);
            }
            if define == "CLASS_NOPL" {
                // The kernel's floor: the same probe with an empty BPF program.
                let empty = Tracer::Bpftrace {
                    probe: format!("uprobe:{}:pthread_mutex_lock", binary.display()),
                    action: "/pid == {pid}/ { }".into(),
                };
                let floor = median(runs, || run_loop(&binary, seconds, &empty, &locktrace))?;
                let line = format!(
                    "| `{class}`, empty bpftrace program (kernel floor) | {:.1} | {:.1} | **{:.0} ns** |\n",
                    untraced.ns_per_lock,
                    floor.ns_per_lock,
                    floor.ns_per_lock - untraced.ns_per_lock
                );
                eprint!("{line}");
                report.push_str(&line);
            }
        }

        emulated_costs.sort_by(f64::total_cmp);
        let emulated_cost = emulated_costs[emulated_costs.len() / 2];
        report.push_str(&save_calibration(emulated_cost, stepped_cost)?);
    }

    // 2 + 3. The uncontended loop under each tracer.
    let configs: Vec<(&str, Tracer)> = vec![
        ("untraced", Tracer::None),
        (
            "locktrace --placement entry",
            Tracer::Locktrace(strings(&["--placement", "entry"])),
        ),
        (
            "locktrace --placement auto",
            Tracer::Locktrace(strings(&["--placement", "auto"])),
        ),
        (
            "locktrace --hold-times (lock + unlock probes)",
            Tracer::Locktrace(strings(&["--hold-times"])),
        ),
        (
            "locktrace --mode contention",
            Tracer::Locktrace(strings(&["--mode", "contention"])),
        ),
        (
            "locktrace --mode sampled --sample 0.1",
            Tracer::Locktrace(strings(&[
                "--mode",
                "sampled",
                "--sample",
                "0.1",
                "--sample-period",
                "2",
            ])),
        ),
        ("bpftrace uprobe one-liner", bpftrace_one_liner()),
    ];
    // Interleaved (one run of every config per round), so that load from
    // other processes drifting over time hits all configs alike.
    let mut all: Vec<Vec<Sample>> = vec![Vec::new(); configs.len()];
    for round in 0..runs.max(1) {
        for ((name, tracer), samples) in configs.iter().zip(&mut all) {
            let sample = run_loop(&loop_bin, seconds, tracer, &locktrace)?;
            eprintln!("round {round}: {name}: {sample:?}");
            samples.push(sample);
        }
    }
    let results: Vec<(&str, Sample)> = configs
        .iter()
        .zip(all)
        .map(|((name, _), samples)| (*name, median_of(samples)))
        .collect();
    let base = results[0].1.ns_per_lock;
    let bpftrace_added = results
        .last()
        .map_or(f64::NAN, |(_, s)| s.ns_per_lock - base);
    report.push_str("\n### Uncontended one-thread lock loop (fixtures/bench/loop.c)\n\n");
    report.push_str("| tracer | ns/lock | added ns/lock | added vs bpftrace | attach | tracer CPU | tracer peak RSS |\n");
    report.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
    for (name, sample) in &results {
        let added = sample.ns_per_lock - base;
        let tracer = !matches!(name, &"untraced");
        report.push_str(&format!(
            "| {name} | {:.1} | {} | {} | {} | {} | {} |\n",
            sample.ns_per_lock,
            if tracer {
                format!("{added:.1}")
            } else {
                "-".into()
            },
            if tracer {
                format!("{:.3}x", added / bpftrace_added)
            } else {
                "-".into()
            },
            if tracer {
                format!("{:.0} ms", sample.attach_ms)
            } else {
                "-".into()
            },
            if tracer {
                format!("{:.2} s", sample.tracer_cpu_s)
            } else {
                "-".into()
            },
            if tracer {
                format!("{:.1} MiB", sample.tracer_rss_mib)
            } else {
                "-".into()
            },
        ));
    }
    if !only_loop {
        report.push_str(&http_throughput(seconds, runs, &locktrace, &root, &out)?);
    }
    let path = out.join("results.md");
    std::fs::write(&path, &report)?;
    println!("{report}");
    eprintln!("(also written to {})", path.display());
    Ok(())
}

/// Statistics updates per request in the HTTP fixture: each takes the global
/// stats mutex and the connection's own, so 2 x 200 = 400 lock acquisitions
/// per request, about mysqlnd's count.
const HTTP_K: u64 = 200;

/// One measured run of the HTTP fixture under load.
#[derive(Debug, Clone, Copy, Default)]
struct HttpSample {
    requests_per_s: f64,
    /// The stats mutex's acquisitions per request, as locktrace reported them.
    stats_per_request: Option<f64>,
}

/// Part 2: throughput of the fixture HTTP server (fixtures/httpd.c, mutex
/// mode, 400 locks per request) under wrk, untraced / each locktrace mode /
/// bpftrace. The server runs on CPU 0 and wrk on CPU 1, so the load does not
/// compete with the target; the tracers are not pinned.
fn http_throughput(
    seconds: f64,
    runs: usize,
    locktrace: &Path,
    root: &Path,
    out: &Path,
) -> Result<String> {
    ensure_wrk()?;
    // At least two windows of sampled mode's default 5 s period.
    let seconds = seconds.max(12.0);
    let httpd = out.join("httpd");
    let status = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&httpd)
        .arg(root.join("fixtures/httpd.c"))
        .status()
        .context("running gcc")?;
    if !status.success() {
        bail!("compiling fixtures/httpd.c failed");
    }
    let probe = ["--request-probe", "httpd:handle_request"];
    let with_probe = |args: &[&str]| strings(&[args, &probe[..]].concat());
    let configs: Vec<(&str, Tracer)> = vec![
        ("untraced", Tracer::None),
        (
            "locktrace --placement entry",
            Tracer::Locktrace(with_probe(&["--placement", "entry"])),
        ),
        (
            "locktrace --placement auto (default)",
            Tracer::Locktrace(with_probe(&["--placement", "auto"])),
        ),
        (
            "locktrace --mode contention",
            // No request probe: contention mode's own cost (no per-request column).
            Tracer::Locktrace(strings(&["--mode", "contention"])),
        ),
        (
            "locktrace --mode sampled --sample 0.1",
            Tracer::Locktrace(with_probe(&["--mode", "sampled", "--sample", "0.1"])),
        ),
        ("bpftrace uprobe one-liner", bpftrace_one_liner()),
    ];
    let mut all: Vec<Vec<HttpSample>> = vec![Vec::new(); configs.len()];
    for round in 0..runs.max(1) {
        for ((name, tracer), samples) in configs.iter().zip(&mut all) {
            let sample = run_http(&httpd, seconds, tracer, locktrace)?;
            eprintln!("http round {round}: {name}: {sample:?}");
            samples.push(sample);
        }
    }
    let mut text = format!(
        "\n### HTTP server throughput (fixtures/httpd.c, mutex mode, K={HTTP_K}: {} lock acquisitions per request)\n\n\
         wrk -t1 -c4 -d{seconds}s on CPU 1, the server's 4 worker threads on CPU 0; locktrace counts requests with \
         `--request-probe httpd:handle_request` (all but contention mode, to show that mode's own cost). Median of {runs} runs.\n\n\
         | tracer | requests/s | vs untraced | vs bpftrace | stats mutex per request (truth {HTTP_K}) |\n|---|---:|---:|---:|---:|\n",
        2 * HTTP_K
    );
    let medians: Vec<HttpSample> = all
        .into_iter()
        .map(|mut samples| {
            samples.sort_by(|a, b| a.requests_per_s.total_cmp(&b.requests_per_s));
            samples[samples.len() / 2]
        })
        .collect();
    let untraced = medians[0].requests_per_s;
    let bpftrace = medians[medians.len() - 1].requests_per_s;
    for ((name, _), sample) in configs.iter().zip(&medians) {
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
    Ok(text)
}

fn ensure_wrk() -> Result<()> {
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
    read_until(&mut server_out, "httpd", |line| line == "ready")?;
    std::thread::spawn(move || for _ in server_out.lines() {});

    let json = std::env::temp_dir().join(format!("locktrace-bench-http-{pid}.json"));
    let tracer_child = start_tracer(tracer, pid, &json, locktrace)?.map(|(child, _)| child);
    let wrk = Command::new("taskset")
        .args(["-c", "1", "wrk", "-t1", "-c4"])
        .arg(format!("-d{}s", seconds.max(1.0).round()))
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .context("running wrk")?;
    let wrk_text = String::from_utf8_lossy(&wrk.stdout);
    let requests_per_s = wrk_text
        .lines()
        .find_map(|line| line.trim().strip_prefix("Requests/sec:"))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .with_context(|| format!("wrk printed no Requests/sec: {wrk_text}"))?;
    let mut sample = HttpSample {
        requests_per_s,
        stats_per_request: None,
    };
    if let Some(child) = tracer_child {
        // Both tracers stop on SIGINT and write what they have; only our child, by pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        wait_with_usage(child, Duration::from_secs(60))?;
    }
    if let Ok(text) = std::fs::read_to_string(&json) {
        let report: serde_json::Value = serde_json::from_str(&text)?;
        sample.stats_per_request = report["locks"].as_array().and_then(|locks| {
            locks
                .iter()
                .find(|lock| lock["address"] == stats_lock.as_str())
                .and_then(|lock| lock["per_request"]["acquisitions"].as_f64())
        });
    }
    let _ = std::fs::remove_file(&json);
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    server.wait()?;
    Ok(sample)
}

/// Starts `tracer` on `pid` and returns once its probes are live, with the
/// attach time in ms (locktrace's own figure; for bpftrace until `BEGIN` runs).
fn start_tracer(
    tracer: &Tracer,
    pid: u32,
    json: &Path,
    locktrace: &Path,
) -> Result<Option<(Child, f64)>> {
    let started = Instant::now();
    Ok(match tracer {
        Tracer::None => None,
        Tracer::Locktrace(args) => {
            let mut child = Command::new(locktrace)
                .args(["record", "--pid", &pid.to_string(), "--json"])
                .arg(json)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()?;
            let mut stderr = BufReader::new(child.stderr.take().expect("piped"));
            let live = read_until(&mut stderr, "locktrace", |line| {
                line.contains(" live after ")
            })?;
            // "... live after N ms; ..."
            let attach_ms = live
                .split(" live after ")
                .nth(1)
                .and_then(|rest| rest.split(" ms").next())
                .and_then(|ms| ms.parse().ok())
                .unwrap_or(f64::NAN);
            std::thread::spawn(move || for _ in stderr.lines() {});
            Some((child, attach_ms))
        }
        Tracer::Bpftrace { probe, action } => {
            let program = format!(
                "{probe} {} BEGIN {{ printf(\"ready\\n\"); }}",
                action.replace("{pid}", &pid.to_string())
            );
            let mut child = Command::new("bpftrace")
                .args(["-e", &program])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("starting bpftrace (scripts/setup.sh installs it)")?;
            let mut stdout: BufReader<ChildStdout> =
                BufReader::new(child.stdout.take().expect("piped"));
            read_until(&mut stdout, "bpftrace", |line| line == "ready")?;
            std::thread::spawn(move || for _ in stdout.lines() {});
            Some((child, started.elapsed().as_secs_f64() * 1e3))
        }
    })
}

/// Writes the calibration locktrace's report footer uses (hits × cost per hit)
/// and returns a line for the results.
fn save_calibration(emulated_ns: f64, stepped_ns: f64) -> Result<String> {
    let path = Path::new("/var/cache/locktrace/calibration.json");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")?
        .trim()
        .to_string();
    let json = serde_json::json!({
        "kernel": kernel,
        "emulated_ns": emulated_ns.round().max(0.0) as u64,
        "stepped_ns": stepped_ns.round().max(0.0) as u64,
    });
    std::fs::create_dir_all(path.parent().expect("has a parent"))?;
    std::fs::write(path, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(format!(
        "\nCalibration saved to {} (median emulated class {emulated_ns:.0} ns, single-stepped {stepped_ns:.0} ns per hit); locktrace's `overhead` uses it on this kernel.\n",
        path.display()
    ))
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn median(runs: usize, mut one: impl FnMut() -> Result<Sample>) -> Result<Sample> {
    let mut samples = Vec::new();
    for _ in 0..runs.max(1) {
        samples.push(one()?);
    }
    Ok(median_of(samples))
}

/// The run with the median ns/lock.
fn median_of(mut samples: Vec<Sample>) -> Sample {
    samples.sort_by(|a, b| a.ns_per_lock.total_cmp(&b.ns_per_lock));
    samples[samples.len() / 2]
}

fn compile(root: &Path, out: &Path, name: &str, defines: &[&str]) -> Result<PathBuf> {
    let source = root.join("fixtures/bench").join(format!("{name}.c"));
    let binary = out.join(format!(
        "{name}{}",
        defines.iter().map(|d| format!("-{d}")).collect::<String>()
    ));
    let mut command = Command::new("gcc");
    command
        .args(["-O2", "-pthread", "-o"])
        .arg(&binary)
        .arg(&source);
    for define in defines {
        command.arg(format!("-D{define}"));
    }
    let output = command.output().context("running gcc")?;
    if !output.status.success() {
        bail!(
            "compiling {}: {}",
            source.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(binary)
}

/// Reads lines until one satisfies `done`; returns that line.
fn read_until(
    reader: &mut impl BufRead,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> Result<String> {
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            bail!("{what} ended early");
        }
        if done(line.trim()) {
            return Ok(line.trim().to_string());
        }
    }
}

fn run_loop(binary: &Path, seconds: f64, tracer: &Tracer, locktrace: &Path) -> Result<Sample> {
    let mut fixture = Command::new(binary)
        .arg(seconds.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let pid = fixture.id();
    let mut fixture_out = BufReader::new(fixture.stdout.take().expect("piped"));
    read_until(&mut fixture_out, "fixture", |line| line == "ready")?;

    let mut sample = Sample::default();
    let json = std::env::temp_dir().join(format!("locktrace-bench-{pid}.json"));
    let mut tracer_child = match start_tracer(tracer, pid, &json, locktrace)? {
        Some((child, attach_ms)) => {
            sample.attach_ms = attach_ms;
            Some(child)
        }
        None => None,
    };
    fixture.stdin.take().expect("piped").write_all(b"go\n")?;
    let line = read_until(&mut fixture_out, "fixture", |line| {
        line.starts_with("ns_per_lock ")
    })?;
    sample.ns_per_lock = line["ns_per_lock ".len()..]
        .parse()
        .context("fixture output")?;
    fixture.wait()?;
    if let Some(child) = tracer_child.take() {
        if matches!(tracer, Tracer::Bpftrace { .. }) {
            // bpftrace runs until interrupted; only the child we started, by pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        }
        let (cpu, rss) = wait_with_usage(child, Duration::from_secs(60))?;
        sample.tracer_cpu_s = cpu;
        sample.tracer_rss_mib = rss;
    }
    let _ = std::fs::remove_file(&json);
    Ok(sample)
}

/// Waits for a child and returns its (user + system CPU seconds, peak RSS MiB).
fn wait_with_usage(child: Child, _limit: Duration) -> Result<(f64, f64)> {
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child's pid, filling structs we own.
    let waited = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    if waited < 0 {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((
        seconds(usage.ru_utime) + seconds(usage.ru_stime),
        usage.ru_maxrss as f64 / 1024.0,
    ))
}

fn machine() -> Result<String> {
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
    let libc = Command::new("ldd").arg("--version").output().ok().map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    });
    let bpftrace = Command::new("bpftrace")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    Ok(format!(
        "Machine: {cpus} CPUs ({}), {memory} RAM, {os}, Linux {}, {}, {}\n",
        model.trim(),
        kernel.trim(),
        libc.unwrap_or_default(),
        bpftrace.unwrap_or_default()
    ))
}
