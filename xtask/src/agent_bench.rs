//! `locktrace agent`'s own cost on the real FrankenPHP (the kit's stock
//! build, classic mode) under wrk: the server's throughput with the agent
//! watching it against without, in alternating rounds (each agent round
//! compared with the untraced rounds right before and after it), and the
//! agent's CPU (utime + stime from /proc/PID/stat) over the measured
//! seconds, per watched process. The agent finds the server by its default
//! discovery (narrowed with `--within-cgroup` to the server's own cgroup,
//! so other PHP processes on the machine are not watched) and is started
//! afresh each round; its attach and a warm-up under load (the first
//! reads name the server's locks) are not measured.
use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc::Receiver,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{Bench, franken_bench};

/// Seconds of load after the attach, before the measured run.
const WARM_UP_S: f64 = 3.0;
/// How long the agent gets to find and attach the server.
const ATTACH_WAIT: Duration = Duration::from_secs(60);

/// One agent round.
#[derive(Debug, Clone, Copy)]
struct AgentRound {
    requests_per_s: f64,
    /// Its throughput over the mean of the untraced rounds around it.
    ratio: f64,
    /// The agent's CPU over the round, in percent of one core.
    cpu_percent: f64,
}

pub fn run(bench: &Bench) -> Result<String> {
    franken_bench::with_classic_server(bench, "### The agent's own cost", |pid| measure(bench, pid))
}

fn measure(bench: &Bench, pid: u32) -> Result<String> {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?
        .lines()
        .find_map(|line| line.strip_prefix("0::").map(str::to_string))
        .context("FrankenPHP's cgroup v2 path")?;
    let mut before = wrk(bench.seconds)?;
    let mut untraced = vec![before];
    let mut rounds = Vec::new();
    for round in 0..bench.runs {
        let (requests_per_s, cpu_percent) = agent_round(bench, pid, &cgroup)?;
        let after = wrk(bench.seconds)?;
        let ratio = 2.0 * requests_per_s / (before + after);
        eprintln!(
            "agent round {round}: {requests_per_s:.0} requests/s, untraced {before:.0}/{after:.0}: {ratio:.3}x; the agent's CPU {cpu_percent:.2}% of one core"
        );
        rounds.push(AgentRound {
            requests_per_s,
            ratio,
            cpu_percent,
        });
        untraced.push(after);
        before = after;
    }
    Ok(table(bench, &untraced, &rounds))
}

/// Starts the agent, waits for it to watch `pid`, runs wrk, stops the
/// agent: the throughput and the agent's CPU over the wrk run.
fn agent_round(bench: &Bench, pid: u32, cgroup: &str) -> Result<(f64, f64)> {
    let port = free_port()?;
    let mut agent = Command::new(&bench.locktrace)
        .args(["agent", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--within-cgroup", cgroup])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} agent", bench.locktrace.display()))?;
    let lines = stderr_lines(&mut agent);
    let measured = watched_round(bench, pid, &agent, &lines);
    // SIGINT: it detaches and switches the inproc stubs back.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let status = agent.wait()?;
    let measured = measured?;
    if !status.success() {
        bail!("locktrace agent ended with {status}");
    }
    Ok(measured)
}

fn watched_round(
    bench: &Bench,
    pid: u32,
    agent: &Child,
    lines: &Receiver<String>,
) -> Result<(f64, f64)> {
    let watching = format!("watching pid {pid} (");
    let deadline = Instant::now() + ATTACH_WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(&watching) => break,
            Ok(_) => continue,
            Err(_) => {
                bail!("the agent did not watch FrankenPHP (pid {pid}) within {ATTACH_WAIT:?}")
            }
        }
    }
    // The first reads name the server's locks as they show up: a one-off,
    // not the steady cost measured here.
    let (cpu_attached, warming) = (cpu_seconds(agent.id())?, Instant::now());
    wrk(WARM_UP_S)?;
    let (cpu_before, at) = (cpu_seconds(agent.id())?, Instant::now());
    eprintln!(
        "agent: {:.2}% of one core during the warm-up",
        100.0 * (cpu_before - cpu_attached) / warming.elapsed().as_secs_f64()
    );
    let requests_per_s = wrk(bench.seconds)?;
    let cpu = cpu_seconds(agent.id())? - cpu_before;
    // One watched process: its share is the whole agent's.
    Ok((requests_per_s, 100.0 * cpu / at.elapsed().as_secs_f64()))
}

/// The agent's stderr, line by line (also keeps the pipe from filling).
fn stderr_lines(agent: &mut Child) -> Receiver<String> {
    let (send, lines) = std::sync::mpsc::channel();
    if let Some(stderr) = agent.stderr.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
    }
    lines
}

/// utime + stime of process `pid`, in seconds (/proc/PID/stat).
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the command name (which may hold spaces): utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let tick = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let (Some(user), Some(system)) = (tick(11), tick(12)) else {
        bail!("/proc/{pid}/stat has no utime and stime");
    };
    // SAFETY: sysconf reads a constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((user + system) as f64 / per_second)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn wrk(seconds: f64) -> Result<f64> {
    let output = Command::new("wrk")
        .args(["-t1", "-c4"])
        .arg(format!("-d{}s", seconds.round()))
        .arg(franken_bench::URL)
        .output()
        .context("running wrk")?;
    crate::http_bench::wrk_requests_per_s(&output.stdout)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn table(bench: &Bench, untraced: &[f64], rounds: &[AgentRound]) -> String {
    let (seconds, runs) = (bench.seconds, bench.runs);
    let range = |values: &[f64]| {
        (
            values.iter().copied().fold(f64::INFINITY, f64::min),
            values.iter().copied().fold(0.0, f64::max),
        )
    };
    let ratios: Vec<f64> = rounds.iter().map(|r| r.ratio).collect();
    let cpus: Vec<f64> = rounds.iter().map(|r| r.cpu_percent).collect();
    let rates: Vec<f64> = rounds.iter().map(|r| r.requests_per_s).collect();
    let (low, high) = range(untraced);
    let (ratio_low, ratio_high) = range(&ratios);
    let (cpu_low, cpu_high) = range(&cpus);
    format!(
        "\n### The agent's own cost (the real FrankenPHP, classic mode, `{url}`)\n\n\
         wrk -t1 -c4 for {seconds} s a round; `locktrace agent` (default discovery, \
         `--mode inproc`, narrowed to the server's cgroup) started afresh each round and \
         attached and warmed up ({WARM_UP_S} s of wrk, not measured: the first reads name the \
         server's locks) before the measured run; each agent round sits between two untraced rounds and \
         is compared with their mean; median of {runs} rounds, with the lowest and highest. \
         The agent's CPU: its utime + stime over the wrk run, one watched process.\n\n\
         | | requests/s | vs untraced (rounds) | the agent's CPU, % of one core per watched process (rounds) |\n\
         |---|---:|---:|---:|\n\
         | untraced | {:.0} ({low:.0}-{high:.0}) | 1.000x | - |\n\
         | agent on | {:.0} | {:.3}x ({ratio_low:.3}-{ratio_high:.3}) | {:.2} ({cpu_low:.2}-{cpu_high:.2}) |\n",
        median(untraced.to_vec()),
        median(rates),
        median(ratios),
        median(cpus),
        url = franken_bench::URL,
    )
}
