//! Issue 17: what a lock costs in CPU. The target's CPU time against the
//! fixture's own getrusage, the sampled CPU of a shared mutex against what
//! sharing it cost the fixture, and a lock-free fixture. Real BPF: root.

use crate::common::*;
use serde_json::Value;

/// fixtures/cpucost.c: 4 threads, 200000 operations each, 300 rounds of
/// work outside and 300 inside the lock.
const THREADS: &str = "4";
const OPS: &str = "200000";
const WORK: &str = "300";
const HOLD: &str = "300";

/// One traced run: the fixture's own CPU over its work and locktrace's report.
struct Run {
    fixture_cpu_ns: f64,
    ops: f64,
    report: Value,
    table: String,
}

/// Starts cpucost in `mode`, attaches `locktrace record EXTRA…`, lets it
/// work, reads its own CPU figure, then stops locktrace with SIGINT while
/// the fixture idles: the recording window holds all of its work and only
/// idle time besides. The fixture runs at nice -20 (`nice` execs it, so the
/// pid is the fixture's): on a machine busy compiling, its threads then get
/// the CPUs together and the shared mutex is contended as on a quiet one.
fn traced_run(mode: &str, extra: &[&str]) -> Run {
    let binary = fixture("cpucost", Flavor::Glibc);
    let mut fixture = Fixture::spawn_command(
        std::process::Command::new("nice")
            .args(["-n", "-20"])
            .arg(&binary)
            .args([THREADS, OPS, WORK, HOLD, mode]),
    );
    let trace = Trace::attach(fixture.pid(), extra);
    fixture.start();
    let mut figure = |name: &str| -> f64 {
        let line = fixture.read_line().expect("cpucost printed its figures");
        line.strip_prefix(name)
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("expected `{name} N`, got {line:?}"))
    };
    let fixture_cpu_ns = figure("cpu_ns");
    let ops = figure("ops");
    // A tick of the tracer's CPU clock reading falls in the idle time.
    std::thread::sleep(std::time::Duration::from_millis(500));
    trace.interrupt();
    let (report, table) = trace.finish();
    Run {
        fixture_cpu_ns,
        ops,
        report,
        table,
    }
}

fn cpu_figure(report: &Value, field: &str) -> f64 {
    report["cpu"][field]
        .as_f64()
        .unwrap_or_else(|| panic!("cpu.{field} missing: {}", report["cpu"]))
}

/// CPU of the lock rows (contention class) of a report.
fn locks_cpu_ns(report: &Value) -> f64 {
    report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|lock| lock["wait_class"] == "lock")
        .map(|lock| lock["cpu_ns"].as_f64().expect("every lock has cpu_ns"))
        .sum()
}

fn assert_target_cpu_matches(run: &Run) {
    let target = cpu_figure(&run.report, "target_ns");
    let error = (target - run.fixture_cpu_ns).abs() / run.fixture_cpu_ns;
    assert!(
        error <= 0.05,
        "cpu.target_ns {target} vs the fixture's getrusage {} ({:.1}% apart)",
        run.fixture_cpu_ns,
        error * 100.0
    );
}

/// In contention mode (no lock probes), the CPU the shared mutex burns
/// beyond what the threads' own mutexes burn matches what sharing cost the
/// fixture, within ±35%. The fixture's cost includes the time the tracer's
/// futex tracepoint programs ran in it (the sampler cannot run meanwhile:
/// `cpu.unsampled_ns`), which is the tracer's and so no lock's: it is taken
/// out of the fixture's figure. Sharing must have cost something
/// measurable: glibc's mutex falls into a cheap pattern now and then (one
/// thread runs many operations while the others sleep), so up to five pairs
/// of runs are tried. The lock rows' removal price (issue 32) must predict
/// the sharing cost within ±25% in the same runs.
#[test]
fn shared_mutex_cpu_matches_what_sharing_costs() {
    let mut last = String::new();
    for _attempt in 0..5 {
        // The rate that gives a bound this tight in a short run (the default is 99 Hz).
        let shared = traced_run("shared", &["--mode", "contention", "--cpu-hz", "999"]);
        let own = traced_run("own", &["--mode", "contention", "--cpu-hz", "999"]);
        assert_target_cpu_matches(&shared);
        assert_target_cpu_matches(&own);
        assert_eq!(shared.ops, own.ops);
        let unsampled = |run: &Run| cpu_figure(&run.report, "unsampled_ns");
        let sharing_cost =
            (shared.fixture_cpu_ns - unsampled(&shared)) - (own.fixture_cpu_ns - unsampled(&own));
        let measured = locks_cpu_ns(&shared.report) - locks_cpu_ns(&own.report);
        last = format!(
            "fixture: shared {:.1} ms, own {:.1} ms, unsampled {:.1}/{:.1} ms; sharing costs {:.1} ns/op, locktrace says {:.1} ns/op\nshared run:\n{}",
            shared.fixture_cpu_ns / 1e6,
            own.fixture_cpu_ns / 1e6,
            unsampled(&shared) / 1e6,
            unsampled(&own) / 1e6,
            sharing_cost / shared.ops,
            measured / shared.ops,
            shared.table
        );
        eprintln!("{last}");
        if sharing_cost < 0.10 * own.fixture_cpu_ns {
            continue;
        }
        // The shared mutex is the lock that costs: it is the first row.
        let shared_lock = shared.report["locks"]
            .as_array()
            .unwrap()
            .iter()
            .max_by(|a, b| {
                a["cpu_ns"]
                    .as_f64()
                    .partial_cmp(&b["cpu_ns"].as_f64())
                    .unwrap()
            })
            .unwrap();
        assert_eq!(shared_lock["name"], "g_shared_lock", "{last}");
        let error = (measured - sharing_cost).abs() / sharing_cost;
        assert!(error <= 0.35, "{:.0}% off: {last}", error * 100.0);
        // Issue 32: the removal price (with the scheduling its waits cause)
        // predicts what sharing cost within ±25%.
        let predicted = removal_price(&shared.report) - removal_price(&own.report);
        let off = (predicted - sharing_cost).abs() / sharing_cost;
        last = format!(
            "{last}\nremoval price predicts {:.1} ns/op, {:.0}% off",
            predicted / shared.ops,
            off * 100.0
        );
        eprintln!("{last}");
        if off <= 0.25 {
            return;
        }
    }
    panic!(
        "in five tries, sharing the mutex never cost 10% of the CPU or the removal price never predicted it within 25%: {last}"
    );
}

/// The lock rows' removal price over the recording, ns.
fn removal_price(report: &Value) -> f64 {
    report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|lock| lock["wait_class"] == "lock")
        .filter_map(|lock| lock["removal"]["saving_ns"].as_f64())
        .sum()
}

/// The same work without any lock: under 1% of the CPU is attributed to locks.
#[test]
fn lock_free_fixture_has_no_lock_cpu() {
    let run = traced_run("none", &["--mode", "contention"]);
    assert_target_cpu_matches(&run);
    // The default rate (a sampler at 999 Hz cost a busy server 1-4 %).
    assert_eq!(run.report["cpu"]["sample_hz"], 99, "{}", run.report["cpu"]);
    let lock_code = cpu_figure(&run.report, "lock_code_ns");
    assert!(
        lock_code < 0.01 * run.fixture_cpu_ns,
        "{lock_code} ns of {} attributed to locks:\n{}",
        run.fixture_cpu_ns,
        run.table
    );
    assert!(cpu_figure(&run.report, "samples") > 0.0);
}

/// All mode: the target's CPU still within ±5%, and every lock probed has a
/// CPU figure; the shared mutex's lock code is seen.
#[test]
fn all_mode_reports_cpu_per_lock() {
    let run = traced_run("shared", &["--cpu-hz", "999"]);
    assert_target_cpu_matches(&run);
    let lock = shared_lock_row(&run.report);
    assert_eq!(lock["acquisitions"].as_f64(), Some(run.ops));
    assert!(lock["cpu_ns"].as_u64().unwrap() > 0, "{lock}");
    assert!(lock["cpu_error_ns"].as_u64().unwrap() > 0, "{lock}");
    assert_removal_adds_up(lock, run.ops, "calibrated");
}

/// Issue 32: a lock's removal price is the sum of its parts; the lock
/// code is priced by exact calls (all mode: calls × the calibrated pair
/// cost, a few ns each) or by samples (contention mode).
fn assert_removal_adds_up(lock: &Value, ops: f64, lock_code_basis: &str) {
    let removal = &lock["removal"];
    let part = |name: &str| removal[name]["ns"].as_f64().unwrap_or(0.0);
    let sum = part("lock_code")
        + part("handoffs")
        + part("kernel")
        + part("kernel_locks")
        + part("scheduling");
    let saving = removal["saving_ns"].as_f64().expect("a removal price");
    assert!((saving - sum).abs() <= 1e-6 * saving.max(1.0), "{removal}");
    assert_eq!(removal["lock_code"]["basis"], lock_code_basis, "{removal}");
    if lock_code_basis == "calibrated" {
        let per_call = part("lock_code") / ops;
        assert!(
            (1.0..=50.0).contains(&per_call),
            "{per_call} ns per pair: {removal}"
        );
        assert!(
            removal["unpriced"][0]
                .as_str()
                .is_some_and(|reason| reason.starts_with("handoffs")),
            "{removal}"
        );
    }
    assert!(removal["kernel"]["ns"].as_f64().is_some(), "{removal}");
}

/// Contention mode prices the lock code by its samples, and the table
/// names the costliest lock's removal.
#[test]
fn contention_mode_prices_removal_by_samples() {
    let run = traced_run("shared", &["--mode", "contention", "--cpu-hz", "999"]);
    let lock = shared_lock_row(&run.report);
    assert_removal_adds_up(lock, run.ops, "sampled");
    assert!(
        run.table
            .contains("removing g_shared_lock would save about"),
        "{}",
        run.table
    );
}

/// The shared mutex's row.
fn shared_lock_row(report: &Value) -> &Value {
    report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|lock| lock["name"] == "g_shared_lock")
        .expect("the shared lock has a row")
}
