//! `locktrace agent`'s own cost on the real FrankenPHP (the kit's stock
//! build, classic mode) under wrk: the server's throughput with the agent
//! watching it against without, in alternating rounds (each agent round
//! compared with the untraced rounds right before and after it), and the
//! agent's CPU (utime + stime from /proc/PID/stat) per watched process. The
//! agent finds the server by its default discovery (narrowed with
//! `--within-cgroup` to the server's own cgroup, so other PHP processes on
//! the machine are not watched) and is started afresh each round.
//!
//! Its cost has two parts, reported apart: the one-off (start, attach, and
//! the first names of the server's locks, which parse each module's DWARF
//! once for the agent's life) and the steady cost of the reads. The agent
//! says each DWARF parse on stderr; the warm-up under load lasts until none
//! came for [`QUIET`], and the agent's CPU from its start to there is the
//! one-off column. The measured run follows; a parse that still comes in it
//! is counted in the steady figure and the round is marked.
use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc::Receiver,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{Bench, franken_bench};

/// The warm-up lasts at least this long...
const WARM_UP_MIN: Duration = Duration::from_secs(3);
/// ...and until the agent parsed no DWARF for this long...
const QUIET: Duration = Duration::from_secs(15);
/// ...but no longer than this (then the round says so).
const WARM_UP_MAX: Duration = Duration::from_secs(40);
/// The agent's line as it parses a module's DWARF (agent.rs, `say_dwarf_parsed`).
const DWARF_PARSED: &str = "locktrace: agent: read the DWARF of ";
/// How long the agent gets to find and attach the server.
const ATTACH_WAIT: Duration = Duration::from_secs(60);

/// One agent round.
#[derive(Debug, Clone, Copy)]
struct AgentRound {
    requests_per_s: f64,
    /// Its throughput over the mean of the untraced rounds around it.
    ratio: f64,
    /// The agent's CPU over the measured run, in percent of one core.
    cpu_percent: f64,
    /// The agent's CPU seconds from its start to the end of the warm-up.
    one_off_s: f64,
    /// The warm-up's length, seconds.
    warm_up_s: f64,
    /// DWARF parses that came in the measured run (counted in `cpu_percent`).
    late_parses: usize,
}

pub fn run(bench: &Bench) -> Result<String> {
    franken_bench::with_classic_server(bench, "### The agent's own cost", |pid| measure(bench, pid))
}

/// `pid`'s cgroup v2 path.
fn cgroup_of(pid: u32) -> Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?
        .lines()
        .find_map(|line| line.strip_prefix("0::").map(str::to_string))
        .context("FrankenPHP's cgroup v2 path")
}

fn measure(bench: &Bench, pid: u32) -> Result<String> {
    let cgroup = cgroup_of(pid)?;
    let mut before = wrk(bench.seconds)?;
    let mut untraced = vec![before];
    let mut rounds = Vec::new();
    for round in 0..bench.runs {
        let measured = agent_round(bench, pid, &cgroup)?;
        let after = wrk(bench.seconds)?;
        let ratio = 2.0 * measured.requests_per_s / (before + after);
        eprintln!(
            "agent round {round}: {:.0} requests/s, untraced {before:.0}/{after:.0}: {ratio:.3}x; the agent's CPU {:.2}% of one core (one-off {:.2} s of CPU over a {:.0} s warm-up; {} DWARF parses in the measured run)",
            measured.requests_per_s,
            measured.cpu_percent,
            measured.one_off_s,
            measured.warm_up_s,
            measured.late_parses
        );
        rounds.push(AgentRound { ratio, ..measured });
        untraced.push(after);
        before = after;
    }
    Ok(table(bench, &untraced, &rounds))
}

/// Starts the agent, waits for it to watch `pid`, warms it up, runs wrk,
/// stops the agent: the round's figures (its ratio still to fill).
fn agent_round(bench: &Bench, pid: u32, cgroup: &str) -> Result<AgentRound> {
    let (mut agent, lines) = start_agent(bench, cgroup)?;
    let measured = watched_round(bench, pid, &agent, &lines);
    stop_agent(&mut agent)?;
    measured
}

/// `locktrace agent` narrowed to the server's cgroup, and its stderr's lines.
fn start_agent(bench: &Bench, cgroup: &str) -> Result<(Child, Receiver<String>)> {
    let port = free_port()?;
    let mut agent = Command::new(&bench.locktrace)
        .args(["agent", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--within-cgroup", cgroup])
        // In the root cgroup, `--within-cgroup /` narrows nothing: the
        // server's executable does, or PHP processes of tests running
        // beside the bench would be watched (and counted) too.
        .args(match cgroup {
            "/" => vec!["--exe", franken_bench::BINARY_NAME],
            _ => vec![],
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} agent", bench.locktrace.display()))?;
    let lines = stderr_lines(&mut agent);
    Ok((agent, lines))
}

fn stop_agent(agent: &mut Child) -> Result<()> {
    // SIGINT: it detaches and switches the inproc stubs back.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let status = agent.wait()?;
    if !status.success() {
        bail!("locktrace agent ended with {status}");
    }
    Ok(())
}

/// Waits until the agent says it watches `pid`.
fn wait_watching(pid: u32, lines: &Receiver<String>) -> Result<()> {
    let watching = format!("watching pid {pid} (");
    let deadline = Instant::now() + ATTACH_WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(&watching) => return Ok(()),
            Ok(_) => continue,
            Err(_) => {
                bail!("the agent did not watch FrankenPHP (pid {pid}) within {ATTACH_WAIT:?}")
            }
        }
    }
}

fn watched_round(
    bench: &Bench,
    pid: u32,
    agent: &Child,
    lines: &Receiver<String>,
) -> Result<AgentRound> {
    wait_watching(pid, lines)?;
    let warm_up_s = warm_up(lines)?;
    // From the agent's start: its CPU time is all since then.
    let (one_off_s, at) = (cpu_seconds(agent.id())?, Instant::now());
    let requests_per_s = wrk(bench.seconds)?;
    let cpu = cpu_seconds(agent.id())? - one_off_s;
    let late_parses = lines
        .try_iter()
        .filter(|line| line.contains(DWARF_PARSED))
        .inspect(|line| eprintln!("  in the measured run: {line}"))
        .count();
    Ok(AgentRound {
        requests_per_s,
        ratio: 0.0,
        // One watched process: its share is the whole agent's.
        cpu_percent: 100.0 * cpu / at.elapsed().as_secs_f64(),
        one_off_s,
        warm_up_s,
        late_parses,
    })
}

/// Load in 1 s slices until the agent has parsed no DWARF for [`QUIET`]
/// (at least [`WARM_UP_MIN`], at most [`WARM_UP_MAX`]): its length, seconds.
fn warm_up(lines: &Receiver<String>) -> Result<f64> {
    let warming = Instant::now();
    let mut last_parse = warming;
    loop {
        for line in lines.try_iter() {
            if line.contains(DWARF_PARSED) {
                eprintln!("  {line}");
                last_parse = Instant::now();
            }
        }
        let elapsed = warming.elapsed();
        if elapsed >= WARM_UP_MIN && last_parse.elapsed() >= QUIET {
            return Ok(elapsed.as_secs_f64());
        }
        if elapsed >= WARM_UP_MAX {
            eprintln!(
                "agent: still parsing DWARF after a {WARM_UP_MAX:?} warm-up: the measured run may hold more of the one-off"
            );
            return Ok(elapsed.as_secs_f64());
        }
        wrk(1.0)?;
    }
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
    let output = crate::http_bench::wrk(franken_bench::URL, seconds)?;
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
    let column = |value: fn(&AgentRound) -> f64| -> Vec<f64> { rounds.iter().map(value).collect() };
    let (ratios, cpus, rates) = (
        column(|r| r.ratio),
        column(|r| r.cpu_percent),
        column(|r| r.requests_per_s),
    );
    let (one_offs, warm_ups) = (column(|r| r.one_off_s), column(|r| r.warm_up_s));
    let (low, high) = range(untraced);
    let (ratio_low, ratio_high) = range(&ratios);
    let (cpu_low, cpu_high) = range(&cpus);
    let (one_off_low, one_off_high) = range(&one_offs);
    let (warm_low, warm_high) = range(&warm_ups);
    let late = rounds.iter().filter(|r| r.late_parses > 0).count();
    format!(
        "\n### The agent's own cost (the real FrankenPHP, classic mode, `{url}`)\n\n\
         wrk -t1 -c4 for {seconds} s a round; `locktrace agent` (default discovery, \
         `--mode inproc`, narrowed to the server's cgroup) started afresh each round; \
         each agent round sits between two untraced rounds and is compared with their mean; \
         median of {runs} rounds, with the lowest and highest. \
         The one-off: the agent's CPU seconds from its start through the attach and a warm-up \
         under load (wrk in 1 s slices) that lasts until the agent has parsed no DWARF \
         (to name locks) for {quiet} s, {min} s at least. The steady cost: its utime + stime \
         over the measured wrk run that follows, one watched process. \
         Rounds with a DWARF parse in the measured run (counted in the steady cost): {late} of {runs}.\n\n\
         | | requests/s | vs untraced (rounds) | the agent's steady CPU, % of one core per watched process (rounds) | its one-off CPU, s (rounds) | warm-up, s (rounds) |\n\
         |---|---:|---:|---:|---:|---:|\n\
         | untraced | {:.0} ({low:.0}-{high:.0}) | 1.000x | - | - | - |\n\
         | agent on | {:.0} | {:.3}x ({ratio_low:.3}-{ratio_high:.3}) | {:.2} ({cpu_low:.2}-{cpu_high:.2}) | {:.2} ({one_off_low:.2}-{one_off_high:.2}) | {:.0} ({warm_low:.0}-{warm_high:.0}) |\n",
        median(untraced.to_vec()),
        median(rates),
        median(ratios),
        median(cpus),
        median(one_offs),
        median(warm_ups),
        url = franken_bench::URL,
        quiet = QUIET.as_secs(),
        min = WARM_UP_MIN.as_secs(),
    )
}

/// `--only agent-age`: one agent watching the server under load for `runs`
/// slices of `seconds` after its warm-up, its CPU in each: whether the
/// steady cost grows with the agent's age (its maps and caches grow until
/// the keys expire).
pub fn run_age(bench: &Bench) -> Result<String> {
    franken_bench::with_classic_server(bench, "### The agent's cost by its age", |pid| {
        let cgroup = cgroup_of(pid)?;
        let (mut agent, lines) = start_agent(bench, &cgroup)?;
        let slices = age_slices(bench, pid, &agent, &lines);
        stop_agent(&mut agent)?;
        Ok(age_table(bench, &slices?))
    })
}

/// One slice of an aging agent's run.
struct AgeSlice {
    /// The agent's age at the slice's end, seconds.
    age_s: f64,
    requests_per_s: f64,
    cpu_percent: f64,
    /// DWARF parses that came in the slice.
    parses: usize,
}

fn age_slices(
    bench: &Bench,
    pid: u32,
    agent: &Child,
    lines: &Receiver<String>,
) -> Result<Vec<AgeSlice>> {
    let started = Instant::now();
    wait_watching(pid, lines)?;
    warm_up(lines)?;
    let mut slices = Vec::new();
    for slice in 0..bench.runs {
        let (cpu, at) = (cpu_seconds(agent.id())?, Instant::now());
        let requests_per_s = wrk(bench.seconds)?;
        let cpu_percent = 100.0 * (cpu_seconds(agent.id())? - cpu) / at.elapsed().as_secs_f64();
        let parses = lines
            .try_iter()
            .filter(|line| line.contains(DWARF_PARSED))
            .count();
        let age_s = started.elapsed().as_secs_f64();
        eprintln!(
            "agent age slice {slice}: {age_s:.0} s old, {requests_per_s:.0} requests/s, its CPU {cpu_percent:.2}% of one core ({parses} DWARF parses)"
        );
        slices.push(AgeSlice {
            age_s,
            requests_per_s,
            cpu_percent,
            parses,
        });
    }
    Ok(slices)
}

fn age_table(bench: &Bench, slices: &[AgeSlice]) -> String {
    let mut table = format!(
        "\n### The agent's cost by its age (the real FrankenPHP, classic mode, `{url}`)\n\n\
         One `locktrace agent` (as in the agent part) warmed up as there, then wrk -t1 -c4 \
         in {runs} slices of {seconds} s back to back; its utime + stime in each slice, \
         one watched process.\n\n\
         | the agent's age at the slice's end, s | requests/s | the agent's CPU, % of one core | DWARF parses in the slice |\n\
         |---:|---:|---:|---:|\n",
        url = franken_bench::URL,
        runs = bench.runs,
        seconds = bench.seconds,
    );
    for slice in slices {
        table.push_str(&format!(
            "| {:.0} | {:.0} | {:.2} | {} |\n",
            slice.age_s, slice.requests_per_s, slice.cpu_percent, slice.parses
        ));
    }
    table
}
