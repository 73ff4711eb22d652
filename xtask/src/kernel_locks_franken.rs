//! The kernel lock tracepoints on the real FrankenPHP under load (issue
//! 50): throughput untraced, under `record --mode contention --no-cpu`
//! with the kernel lock programs left out and with them, each traced
//! round between two untraced ones and compared with their mean (this
//! VM's speed drifts over minutes; see franken_bench); then the kernel
//! locks the server's threads met under that load, most wait first, each
//! with the user lock whose futex calls met it, or else the user call
//! site that entered the kernel.
use std::path::Path;

use anyhow::Result;
use locktrace::model::{KernelLock, KernelLocks, Report};

use crate::{
    Bench, franken_bench,
    tracers::{self, Tracer},
};

/// Kernel lock rows listed.
const LISTED: usize = 8;

/// One round of one configuration.
struct Round {
    requests_per_s: f64,
    report: Option<Report>,
}

/// Runs the part when the kit is built; otherwise says how to build it.
pub fn run(bench: &Bench) -> Result<String> {
    franken_bench::with_classic_server(
        bench,
        "### Kernel lock tracepoints on the real FrankenPHP",
        |pid| measure(bench, pid),
    )
}

fn measure(bench: &Bench, pid: u32) -> Result<String> {
    let base = ["--mode", "contention", "--no-cpu"];
    let configs: [(&str, Tracer); 2] = [
        (
            "locktrace --mode contention --no-cpu, kernel lock programs left out",
            tracers::locktrace_env(&base, &[("LOCKTRACE_TEST_KERNEL_WITHOUT", "lock_events")]),
        ),
        (
            "locktrace --mode contention --no-cpu (kernel lock programs attached)",
            tracers::locktrace(&base),
        ),
    ];
    let untraced_round = || round(pid, bench.seconds, &Tracer::None, &bench.locktrace);
    let mut before = untraced_round()?.requests_per_s;
    let mut untraced = vec![before];
    let mut ratios = vec![Vec::new(); configs.len()];
    let mut contentions = Vec::new();
    let mut listed = None;
    for number in 0..bench.runs {
        for (index, (name, tracer)) in configs.iter().enumerate() {
            let traced = round(pid, bench.seconds, tracer, &bench.locktrace)?;
            let after = untraced_round()?.requests_per_s;
            let ratio = 2.0 * traced.requests_per_s / (before + after);
            eprintln!(
                "frankenphp kernel locks round {number}: {name}: {:.0}/s, untraced {before:.0}/{after:.0}: {ratio:.3}x",
                traced.requests_per_s
            );
            ratios[index].push(ratio);
            untraced.push(after);
            before = after;
            // The rounds with the programs left out have a section too,
            // saying why it is empty.
            let section = traced.report.and_then(|report| report.kernel_locks);
            if let Some(section) = section.filter(|section| section.unavailable.is_none()) {
                contentions.push(section.contentions as f64 / bench.seconds);
                listed = Some(section);
            }
        }
    }
    let mut text = format!(
        "\n### Kernel lock tracepoints on the real FrankenPHP (classic mode, stock libphp, `{}`)\n\n\
         wrk -t1 -c4 for {} s a round; every traced round sits between two untraced rounds and is \
         compared with their mean; median of {} rounds, with the rounds' lowest and highest ratio.\n\n\
         | tracer | vs untraced (rounds) |\n|---|---:|\n",
        franken_bench::URL,
        bench.seconds,
        bench.runs
    );
    text.push_str(&format!(
        "| untraced | 1.000x ({:.0}-{:.0} requests/s) |\n",
        untraced.iter().copied().fold(f64::INFINITY, f64::min),
        untraced.iter().copied().fold(0.0, f64::max),
    ));
    for ((name, _), mut ratios) in configs.iter().zip(ratios) {
        ratios.sort_by(f64::total_cmp);
        text.push_str(&format!(
            "| {name} | {:.3}x ({:.3}-{:.3}) |\n",
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1]
        ));
    }
    if !contentions.is_empty() {
        contentions.sort_by(f64::total_cmp);
        text.push_str(&format!(
            "\nKernel lock contentions of the server's threads under this load: {:.0}/s (median round).\n",
            contentions[contentions.len() / 2]
        ));
    }
    if let Some(section) = listed {
        text.push_str(&listing(&section));
    }
    Ok(text)
}

fn round(pid: u32, seconds: f64, tracer: &Tracer, locktrace: &Path) -> Result<Round> {
    let running = tracers::start(tracer, pid, locktrace)?;
    let wrk = crate::http_bench::wrk(franken_bench::URL, seconds)?;
    let requests_per_s = crate::http_bench::wrk_requests_per_s(&wrk.stdout)?;
    let report = match running {
        Some(running) => {
            running.interrupt();
            running.finish()?.report
        }
        None => None,
    };
    Ok(Round {
        requests_per_s,
        report,
    })
}

/// The last traced round's kernel locks, most wait first, each with what
/// is behind it.
fn listing(section: &KernelLocks) -> String {
    let mut text = format!(
        "\nThe kernel locks of the last round with the programs attached ({} contentions, {:.1} ms of wait; \
         the top {LISTED} by wait), each with its busiest user call site (the code that entered the \
         kernel) and the busiest user lock whose futex calls met it:\n\n\
         | kernel lock | kind | contentions | wait ms | kernel site | behind it |\n|---|---|---:|---:|---|---|\n",
        section.contentions,
        section.wait_ns as f64 / 1e6
    );
    for lock in section.locks.iter().take(LISTED) {
        let name = lock
            .name
            .clone()
            .unwrap_or_else(|| format!("{:#x}", lock.address));
        let site = lock
            .kernel_sites
            .first()
            .map_or("-", |site| site.function.as_str());
        text.push_str(&format!(
            "| {name} | {} | {} | {:.2} | {site} | {} |\n",
            lock.kind.word(),
            lock.contentions,
            lock.wait_ns as f64 / 1e6,
            behind(lock)
        ));
    }
    text
}

/// The busiest user call site that entered the kernel for a kernel lock's
/// contentions (its share), and the busiest user lock whose futex calls met
/// it, if any.
fn behind(lock: &KernelLock) -> String {
    let mut parts = Vec::new();
    if let Some(site) = lock.user_sites.first() {
        let code = site
            .frame
            .as_ref()
            .map_or_else(|| format!("{:#x}", site.ip), |frame| frame.code_label());
        parts.push(format!(
            "call site {code} ({} of {})",
            site.contentions, lock.contentions
        ));
    }
    if let Some(user) = lock.user_locks.iter().max_by_key(|user| user.contentions) {
        let name = user
            .name
            .clone()
            .unwrap_or_else(|| format!("futex word {:#x}", user.address));
        parts.push(format!("user lock {name} ({})", user.contentions));
    }
    if parts.is_empty() {
        return "-".to_string();
    }
    parts.join("; ")
}
