//! Issue 2: exact per-lock counts and contention on a live pid, and bad input.
//! Real BPF: run as root.

use crate::common::*;
use locktrace::model::StopReason;
use std::process::Command;

/// N threads × M global locks and K locks of each thread's own heap mutex.
#[test]
fn counts_are_exact_global_and_heap() {
    let binary = fixture("locks", Flavor::Glibc);
    for _ in 0..3 {
        let (report, addresses) = trace_fixture(&binary, &["4", "2500", "1000"], &[]);
        assert_eq!(acquisitions(&report, addresses["global"][0]), 4 * 2500);
        assert_eq!(addresses["heap"].len(), 4);
        for &heap in &addresses["heap"] {
            assert_eq!(acquisitions(&report, heap), 1000);
            let lock = lock_at(&report, heap).unwrap();
            assert_eq!(lock["kind"], "mutex");
        }
        assert_eq!(report["schema"], "locktrace.report/1");
        assert_eq!(report["stopped_by"], "target_exited");
        assert_eq!(report["dropped"], serde_json::json!({}));
    }
}

/// At least 4 threads hammer one mutex while traced: checked to the unit, several runs.
#[test]
fn exact_under_concurrency_repeatedly() {
    let binary = fixture("locks", Flavor::Glibc);
    for run in 0..4 {
        let (report, addresses) = trace_fixture(&binary, &["6", "40000", "0"], &[]);
        assert_eq!(
            acquisitions(&report, addresses["global"][0]),
            6 * 40000,
            "run {run}"
        );
    }
}

/// Holding g_lock makes the other threads wait in futex: waits and wait time
/// show on g_lock's own address; the uncontended heap mutexes show none.
#[test]
fn contention_is_attributed_to_the_contended_lock() {
    let binary = fixture("locks", Flavor::Glibc);
    let (report, addresses) = trace_fixture(&binary, &["4", "300", "2000", "20000"], &[]);
    let global = lock_at(&report, addresses["global"][0]).unwrap();
    assert_eq!(global["acquisitions"], 1200);
    assert!(global["contended"].as_u64().unwrap() > 0, "{global}");
    assert!(global["wait_ns"].as_u64().unwrap() > 0, "{global}");
    assert!(global["max_wait_ns"].as_u64().unwrap() > 0, "{global}");
    assert!(global["wakes"].as_u64().unwrap() > 0, "{global}");
    assert!(global["max_wait_ns"].as_u64() <= global["wait_ns"].as_u64());
    for &heap in &addresses["heap"] {
        let lock = lock_at(&report, heap).unwrap();
        assert_eq!(lock["acquisitions"], 2000);
        assert_eq!(
            (lock["contended"].as_u64(), lock["wait_ns"].as_u64()),
            (Some(0), Some(0)),
            "{lock}"
        );
    }
}

/// `--duration` stops the trace of a process that keeps running, and the
/// report still comes out; so does Ctrl-C.
#[test]
fn duration_and_interrupt_still_report() {
    let binary = fixture("locks", Flavor::Glibc);
    let fixture = Fixture::spawn(&binary, &["1", "1", "1"]);
    let trace = Trace::attach(fixture.pid(), &["--duration", "0.5"]);
    let (report, table) = trace.finish_typed();
    assert_eq!(report.stopped_by, StopReason::Duration);
    assert!(report.duration_s >= 0.5);
    assert!(table.contains("locks; total"), "{table}");

    let trace = Trace::attach(fixture.pid(), &[]);
    trace.interrupt();
    let (report, table) = trace.finish_typed();
    assert_eq!(report.stopped_by, StopReason::Interrupted);
    assert!(table.contains("stopped: interrupted"), "{table}");
}

/// `locktrace report FILE` prints the saved report as the same table.
#[test]
fn saved_report_prints_the_same_table() {
    let binary = fixture("locks", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["2", "10", "5"]);
    let trace = Trace::attach(fixture.pid(), &[]);
    fixture.start();
    fixture.wait();
    let (report, recorded) = trace.finish();
    let saved = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(saved.path(), report.to_string()).unwrap();
    let output = locktrace()
        .arg("report")
        .arg(saved.path())
        .output()
        .unwrap();
    assert!(output.status.success());
    // `recorded` was read with wrapped lines joined (Trace::finish).
    assert_eq!(
        unwrapped(&String::from_utf8_lossy(&output.stdout)),
        recorded
    );
}

// ---- bad input: one line on stderr, non-zero exit, no panic ----

#[test]
fn no_such_pid() {
    fails_with(
        locktrace().args(["record", "--pid", "999999999"]),
        "no process with pid 999999999",
    );
}

#[test]
fn kernel_thread() {
    // pid 2 is kthreadd on Linux.
    fails_with(
        locktrace().args(["record", "--pid", "2"]),
        "is a kernel thread",
    );
}

#[test]
fn not_root() {
    let binary = fixture("locks", Flavor::Glibc);
    let fixture = Fixture::spawn(&binary, &["1", "1", "1"]);
    fails_with(
        std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
            ])
            .arg(env!("CARGO_BIN_EXE_locktrace"))
            .args(["record", "--pid", &fixture.pid().to_string()]),
        "needs root",
    );
}

#[test]
fn no_libc_with_pthread_symbols() {
    let binary = fixture("nolocks", Flavor::MuslStatic);
    let fixture = Fixture::spawn(&binary, &[]);
    fails_with(
        locktrace().args(["record", "--pid", &fixture.pid().to_string()]),
        "no libc with pthread lock functions",
    );
}

/// Runs locktrace in a private mount namespace after `setup` (shell) hides part of /sys.
fn in_mount_namespace(setup: &str, pid: u32) -> std::process::Command {
    let mut command = std::process::Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "{setup} && exec {} record --pid {pid}",
            env!("CARGO_BIN_EXE_locktrace")
        ));
    command
}

#[test]
fn tracefs_not_mountable() {
    let binary = fixture("locks", Flavor::Glibc);
    let fixture = Fixture::spawn(&binary, &["1", "1", "1"]);
    // An empty read-only /sys/kernel: no tracefs, and nowhere to mount it.
    fails_with(
        &mut in_mount_namespace("mount -t tmpfs -o ro none /sys/kernel", fixture.pid()),
        "tracefs is not mounted and mounting it failed",
    );
}

#[test]
fn kernel_without_uprobes() {
    let binary = fixture("locks", Flavor::Glibc);
    let fixture = Fixture::spawn(&binary, &["1", "1", "1"]);
    fails_with(
        &mut in_mount_namespace(
            "mount -t tmpfs -o ro none /sys/bus/event_source/devices",
            fixture.pid(),
        ),
        "kernel lacks uprobe support",
    );
}

/// The target exiting mid-trace is not an error: the report says so.
#[test]
fn target_exit_is_reported_not_an_error() {
    let binary = fixture("locks", Flavor::Glibc);
    let (report, _) = trace_fixture(&binary, &["2", "100", "0"], &["--duration", "60"]);
    assert_eq!(report["stopped_by"], "target_exited");
    assert!(report["duration_s"].as_f64().unwrap() < 30.0);
}

/// How the target ended is in the report, from the process events
/// connector: a crash by its signal, an exit by its status; the counts up
/// to the end stay exact (2 threads x 300 on the global mutex), also when
/// the stubs of `--mode inproc` were in the process that crashed.
#[test]
fn how_the_target_ended_is_reported() {
    let binary = fixture("locks", Flavor::Glibc);
    let segv = serde_json::json!({"signal": 11, "signal_name": "SIGSEGV", "core_dumped": false});
    let killed =
        "stopped: the target exited (killed by SIGSEGV); counts cover its whole traced life";
    for (end, mode, exit, line) in [
        ("segv", "all", &segv, killed),
        ("segv", "inproc", &segv, killed),
        (
            "exit:3",
            "all",
            &serde_json::json!({"exit_code": 3, "core_dumped": false}),
            "stopped: the target exited (exit status 3); counts cover its whole traced life",
        ),
    ] {
        let mut fixture = Fixture::spawn_command(
            Command::new(&binary)
                .args(["2", "300", "0"])
                .env("LOCKS_END", end),
        );
        let global = fixture.address("global");
        let trace = Trace::attach(fixture.pid(), &["--duration", "60", "--mode", mode]);
        fixture.start();
        let _ = fixture.read_line();
        let (report, table) = trace.finish();
        assert_eq!(report["stopped_by"], "target_exited", "{end}: {table}");
        assert_eq!(&report["coverage"]["target_exit"], exit, "{end}: {table}");
        assert!(table.contains(line), "{end}: {table}");
        assert_eq!(
            lock_at(&report, global).unwrap()["acquisitions"],
            600,
            "{end} {mode}"
        );
    }
}

/// More locks than the maps hold: a call is counted under its caller
/// (CALLERS, 65,536 pairs), else in LOCKS (65,536 more locks); the overflow
/// is counted as lost, and the counted plus the lost add up to every call
/// the fixture made.
#[test]
fn full_lock_map_is_reported() {
    const LOCKS: u64 = 140_000;
    const MAP_CAPACITY: u64 = 65_536;
    let binary = fixture("manylocks", Flavor::Glibc);
    // --no-cpu: a lock outside the full map that the CPU sampler caught in
    // its lock code would get a row of its own; this counts the map's rows.
    let (report, addresses) = trace_fixture(&binary, &[&LOCKS.to_string()], &["--no-cpu"]);
    let first = addresses["first"][0];
    let fixture_range = first..first + LOCKS * 40;
    let locks = report["locks"].as_array().unwrap();
    assert_eq!(locks.len() as u64, 2 * MAP_CAPACITY, "both maps are full");
    let counted: u64 = locks
        .iter()
        .filter(|lock| {
            fixture_range.contains(
                &u64::from_str_radix(
                    lock["address"].as_str().unwrap().trim_start_matches("0x"),
                    16,
                )
                .unwrap(),
            )
        })
        .map(|lock| {
            assert_eq!(lock["acquisitions"], 1);
            1
        })
        .sum();
    let lost = report["dropped"]["locks_map_full"]
        .as_u64()
        .expect("locks_map_full reported");
    let callers_lost = report["dropped"]["callers_map_full"]
        .as_u64()
        .expect("callers_map_full reported");
    // Every slot went to a fixture lock (they come first), and each fixture
    // call is counted or lost; libc's own lock calls at exit (one on glibc
    // 2.36) come after the maps filled, so they are lost too.
    assert_eq!(counted, 2 * MAP_CAPACITY);
    assert_eq!(
        callers_lost,
        MAP_CAPACITY + lost,
        "callers unknown past CALLERS' capacity"
    );
    assert!(
        (LOCKS..=LOCKS + 4).contains(&(counted + lost)),
        "counted {counted} + lost {lost}"
    );
}
