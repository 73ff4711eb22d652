//! Waits still going on when the recording stops: deadlocks made under the
//! probes and before attach, and a thread blocked since before attach
//! (fixtures/stuck.c), with their exact threads, locks and holders.

use crate::common::*;
use serde_json::Value;

/// The tid a fixture printed as `NAME TID`.
fn tid(lines: &[String], name: &str) -> u64 {
    lines
        .iter()
        .find_map(|line| line.strip_prefix(&format!("{name} "))?.parse().ok())
        .unwrap_or_else(|| panic!("fixture printed no {name} tid: {lines:?}"))
}

/// One deadlock step: (tid, thread, lock address, lock name, held_by).
type Step = (u64, String, String, String, u64);

/// The report's deadlocks, each as its steps, sorted.
fn deadlock_steps(report: &Value) -> Vec<Vec<Step>> {
    report["deadlocks"]
        .as_array()
        .expect("deadlocks array")
        .iter()
        .map(|deadlock| {
            let mut steps: Vec<_> = deadlock["cycle"]
                .as_array()
                .unwrap()
                .iter()
                .map(|step| {
                    (
                        step["tid"].as_u64().unwrap(),
                        step["thread"].as_str().unwrap_or("?").to_string(),
                        step["lock"].as_str().unwrap().to_string(),
                        step["name"].as_str().unwrap_or("?").to_string(),
                        step["held_by"].as_u64().unwrap(),
                    )
                })
                .collect();
            steps.sort();
            steps
        })
        .collect()
}

/// The in-progress lock waits as (tid, thread, lock name, holder tid, since_before_attach).
fn lock_waits(report: &Value) -> Vec<(u64, String, String, Option<u64>, bool)> {
    let mut waits: Vec<_> = report["in_progress"]
        .as_array()
        .expect("in_progress array")
        .iter()
        .filter(|entry| entry["activity"] == "wait" && entry["wait_class"] == "lock")
        .map(|entry| {
            (
                entry["tid"].as_u64().unwrap(),
                entry["thread"].as_str().unwrap_or("?").to_string(),
                entry["name"].as_str().unwrap_or("?").to_string(),
                entry["holder"]["tid"].as_u64(),
                entry["since_before_attach"].as_bool().unwrap(),
            )
        })
        .collect();
    waits.sort();
    waits
}

/// The AB/BA deadlock's truth: ab waits for g_b held by ba, and back.
fn assert_ab_ba(report: &Value, table: &str, ab: u64, ba: u64, g_a: u64, g_b: u64, before: bool) {
    assert_eq!(
        deadlock_steps(report),
        vec![vec![
            (ab, "ab".into(), format!("{g_b:#x}"), "g_b".into(), ba),
            (ba, "ba".into(), format!("{g_a:#x}"), "g_a".into(), ab),
        ]],
        "{table}"
    );
    assert_eq!(
        lock_waits(report),
        vec![
            (ab, "ab".into(), "g_b".into(), Some(ba), before),
            (ba, "ba".into(), "g_a".into(), Some(ab), before),
        ],
        "{table}"
    );
    assert!(
        table.contains(&format!(
            "deadlock: 2 threads can never go on: ab ({ab}) waits for g_b held by ba ({ba}); ba ({ba}) waits for g_a held by ab ({ab})"
        )),
        "{table}"
    );
}

/// Waits of at least `seconds` (so far) for every lock wait in progress.
fn assert_waited_at_least(report: &Value, seconds: f64) {
    for entry in report["in_progress"].as_array().unwrap() {
        if entry["wait_class"] == "lock" {
            let elapsed = entry["elapsed_ns"].as_u64().unwrap() as f64 / 1e9;
            assert!(elapsed >= seconds, "{entry}: {elapsed} s < {seconds} s");
        }
    }
}

/// Deadlocked under the probes; with `--hold-times` each thread's hold of
/// its first lock is in progress too. musl keeps no owner in its mutexes:
/// there the holders (and so the cycle) come from the open holds.
#[test]
fn a_deadlock_under_the_probes_names_its_threads_and_locks() {
    for (flavor, hold_times) in [
        (Flavor::Glibc, false),
        (Flavor::Glibc, true),
        (Flavor::Musl, true),
    ] {
        let mut fixture = Fixture::spawn(&fixture("stuck", flavor), &["deadlock-after"]);
        let (g_a, g_b) = (fixture.address("g_a"), fixture.address("g_b"));
        let mut args = vec!["--duration", "3"];
        if hold_times {
            args.push("--hold-times");
        }
        let trace = Trace::attach(fixture.pid(), &args);
        fixture.start();
        let mut lines = Vec::new();
        while let Some(line) = fixture.read_line() {
            if line == "stuck" {
                break;
            }
            lines.push(line);
        }
        let (report, table) = trace.finish();
        let (ab, ba) = (tid(&lines, "ab"), tid(&lines, "ba"));
        assert_ab_ba(&report, &table, ab, ba, g_a, g_b, false);
        // Deadlocked within a second of the start, seen 3 s after it.
        assert_waited_at_least(&report, 1.0);
        let mut holds: Vec<(u64, String)> = report["in_progress"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|entry| entry["activity"] == "hold")
            .map(|entry| {
                let name = entry["name"].as_str().unwrap_or("?").to_string();
                (entry["tid"].as_u64().unwrap(), name)
            })
            .collect();
        holds.sort();
        let expected = if hold_times {
            vec![(ab, "g_a".to_string()), (ba, "g_b".to_string())]
        } else {
            Vec::new()
        };
        assert_eq!(holds, expected, "{flavor:?}: {table}");
    }
}

#[test]
fn a_deadlock_from_before_attach_is_found_in_every_mode() {
    for mode in ["all", "contention"] {
        let fixture = Fixture::spawn(&fixture("stuck", Flavor::Glibc), &["deadlock-before"]);
        let (g_a, g_b) = (fixture.address("g_a"), fixture.address("g_b"));
        let (ab, ba) = (tid(&fixture.lines, "ab"), tid(&fixture.lines, "ba"));
        let trace = Trace::attach(fixture.pid(), &["--duration", "1", "--mode", mode]);
        let (report, table) = trace.finish();
        assert_ab_ba(&report, &table, ab, ba, g_a, g_b, true);
        assert_waited_at_least(&report, 1.0);
        assert!(table.contains("waits (since before attach)"), "{table}");
    }
}

#[test]
fn a_thread_blocked_before_attach_is_in_progress_with_its_holder() {
    let fixture = Fixture::spawn(&fixture("stuck", Flavor::Glibc), &["blocked"]);
    let main = tid(&fixture.lines, "main");
    let waiter = tid(&fixture.lines, "waiter");
    let trace = Trace::attach(fixture.pid(), &["--duration", "1"]);
    let (report, table) = trace.finish();
    assert_eq!(
        lock_waits(&report),
        vec![(waiter, "waiter".into(), "g_held".into(), Some(main), true)],
        "{table}"
    );
    let entry = report["in_progress"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["tid"] == waiter)
        .unwrap();
    assert_eq!(
        entry["lock"],
        format!("{:#x}", fixture.address("g_held")),
        "{table}"
    );
    assert_eq!(entry["holder"]["thread"], "stuck-glibc", "{table}");
    assert_waited_at_least(&report, 1.0);
    assert_eq!(report["deadlocks"], serde_json::json!([]), "{table}");
    assert!(!table.contains("deadlock:"), "{table}");
}
