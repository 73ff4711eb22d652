//! Where `--mode inproc`'s time goes on the real FrankenPHP (issue 49,
//! item 3), without throughput ratios: the kernel's run-time statistics of
//! every BPF program locktrace loaded (`BPF_ENABLE_STATS`), read before and
//! after one wrk run while `record --mode inproc` traces the server, then
//! again with attribution (`--stacks 8 --php`). Per program: its runs and BPF time per request, and that
//! time against the server's CPU per request (the report's). A uprobe's
//! trap (about 1 µs a hit here, `--only calibration`) comes on top of its
//! program's run time; the stubs' own instructions are not BPF and are not
//! in the table (the `franken-inproc-parts` rows price them with the futex
//! tracepoints: 0.98x).
//!
//! Throughput ratios on this VM move by ±4 % from round to round, more
//! than any one part costs; run counts are exact and run times are the
//! kernel's own clock, so this splits what the ratios cannot.
use std::collections::{BTreeMap, HashSet};

use anyhow::{Context, Result};
use aya::{
    programs::loaded_programs,
    sys::{Stats, enable_stats},
};

use crate::{
    Bench,
    franken_bench::{self, REQUEST_PROBE},
    tracers,
};

const TITLE: &str = "### Where inproc's time goes: each BPF program's runs and time per request";

/// The traced configurations: inproc, and inproc with attribution.
const CONFIGS: [&[&str]; 2] = [
    &["--mode", "inproc"],
    &["--mode", "inproc", "--stacks", "8", "--php"],
];

/// One program's counters at one instant.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    runs: u64,
    run_ns: u64,
}

/// A program locktrace loaded: its name, type and counters.
type Programs = BTreeMap<u32, (String, String, Counters)>;

/// Runs the part when the kit is built; otherwise says how to build it.
pub fn run(bench: &Bench) -> Result<String> {
    franken_bench::with_classic_server(bench, TITLE, |pid| {
        let mut text = format!("\n{TITLE}\n");
        for args in CONFIGS {
            text.push_str(&measure(bench, pid, args)?);
        }
        Ok(text)
    })
}

fn measure(bench: &Bench, pid: u32, args: &[&str]) -> Result<String> {
    // Programs loaded before locktrace (another tool's) are not its.
    let others: HashSet<u32> = programs(&HashSet::new())?.into_keys().collect();
    let tracer = tracers::locktrace(&[args, &["--request-probe", REQUEST_PROBE]].concat());
    let running =
        tracers::start(&tracer, pid, &bench.locktrace)?.context("locktrace did not start")?;
    // Statistics are kept while this descriptor is open.
    let stats = enable_stats(Stats::RunTime).context("BPF_ENABLE_STATS (needs Linux 5.8)")?;
    let before = programs(&others)?;
    let wrk = crate::http_bench::wrk(franken_bench::URL, bench.seconds)?;
    let after = programs(&others)?;
    drop(stats);
    running.interrupt();
    let report = running
        .finish()?
        .report
        .context("locktrace wrote no report")?;
    let requests = wrk_requests(&wrk.stdout)?;
    // Over the whole recording, as its request count.
    let target_ns = report.cpu.as_ref().and_then(|cpu| cpu.target_ns);
    let recorded = report.requests.as_ref().map(|requests| requests.count);
    let cpu_us_per_request = match (target_ns, recorded) {
        (Some(ns), Some(count)) if count > 0 => ns as f64 / count as f64 / 1000.0,
        _ => f64::NAN,
    };
    let figures = Figures {
        requests,
        cpu_us_per_request,
        seconds: bench.seconds,
    };
    Ok(table(args, &before, &after, figures))
}

/// Every loaded program not in `others`, by id.
fn programs(others: &HashSet<u32>) -> Result<Programs> {
    let mut found = Programs::new();
    for info in loaded_programs() {
        let info = info.context("reading a loaded program's info")?;
        if others.contains(&info.id()) {
            continue;
        }
        let name = info.name_as_str().unwrap_or("?").to_string();
        let kind = format!("{:?}", info.program_type());
        let counters = Counters {
            runs: info.run_count(),
            run_ns: info.run_time().as_nanos() as u64,
        };
        found.insert(info.id(), (name, kind, counters));
    }
    Ok(found)
}

/// wrk's `N requests in Xs` figure.
fn wrk_requests(stdout: &[u8]) -> Result<u64> {
    let text = String::from_utf8_lossy(stdout);
    text.lines()
        .find_map(|line| {
            let (count, _) = line.trim().split_once(" requests in ")?;
            count.parse().ok()
        })
        .with_context(|| format!("wrk printed no request count: {text}"))
}

/// What a table's figures are per.
struct Figures {
    requests: u64,
    cpu_us_per_request: f64,
    seconds: f64,
}

fn table(args: &[&str], before: &Programs, after: &Programs, figures: Figures) -> String {
    let Figures {
        requests,
        cpu_us_per_request,
        seconds,
    } = figures;
    let mut rows: Vec<(String, String, Counters)> = Vec::new();
    for (id, (name, kind, end)) in after {
        let start = before.get(id).map(|(_, _, c)| *c).unwrap_or_default();
        let delta = Counters {
            runs: end.runs.saturating_sub(start.runs),
            run_ns: end.run_ns.saturating_sub(start.run_ns),
        };
        if delta.runs > 0 {
            rows.push((name.clone(), kind.clone(), delta));
        }
    }
    rows.sort_by(|a, b| b.2.run_ns.cmp(&a.2.run_ns).then(a.0.cmp(&b.0)));
    let per = |value: u64| value as f64 / requests.max(1) as f64;
    let mut text = format!(
        "\n`locktrace record {} --request-probe {REQUEST_PROBE}` on the kit's FrankenPHP \
         (classic, stock), wrk -t1 -c4 for {} s on `{}`: {requests} requests; the server's CPU \
         {cpu_us_per_request:.0} µs per request (the report's). BPF time is the kernel's own \
         (`BPF_ENABLE_STATS`); a uprobe's trap (kprobe-type programs on user code) is on top.\n\n\
         | program | type | runs per request | ns per run | BPF µs per request | of the CPU per request |\n\
         |---|---|---:|---:|---:|---:|\n",
        args.join(" "),
        seconds,
        franken_bench::URL,
    );
    let mut total_us = 0.0;
    for (name, kind, delta) in &rows {
        let us = per(delta.run_ns) / 1000.0;
        total_us += us;
        text.push_str(&format!(
            "| {name} | {kind} | {:.2} | {:.0} | {us:.2} | {:.2} % |\n",
            per(delta.runs),
            delta.run_ns as f64 / delta.runs as f64,
            100.0 * us / cpu_us_per_request,
        ));
    }
    text.push_str(&format!(
        "| all | | | | {total_us:.2} | {:.2} % |\n",
        100.0 * total_us / cpu_us_per_request
    ));
    text
}
