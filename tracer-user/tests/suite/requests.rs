//! Issue 4: per-request lock figures (load driver, request probe, given
//! count), the load driver's refusal on bad responses, and compare.
//! Real BPF and a real HTTP server fixture: run as root.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    process::Output,
};

use crate::common::*;
use serde_json::Value;

/// Counter updates per request in the fixture.
const K: u64 = 8;

fn httpd() -> std::path::PathBuf {
    fixture("httpd", Flavor::Glibc)
}

/// Starts the fixture server on a free port; returns it and its port.
fn start_server(mode: &str, fault: Option<&str>) -> (Fixture, u16) {
    let k = K.to_string();
    let mut args = vec!["0", mode, k.as_str(), "4"];
    args.extend(fault);
    let server = Fixture::spawn(&httpd(), &args);
    let port = server.port();
    (server, port)
}

/// `locktrace record --pid PID --json FILE ARGS…`, run to the end.
fn record(pid: u32, json: &Path, args: &[&str]) -> Output {
    locktrace()
        .args(["record", "--pid", &pid.to_string(), "--json"])
        .arg(json)
        .args(args)
        .output()
        .expect("running locktrace")
}

fn read_report(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("report written"))
        .expect("report is JSON")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `record --load http://127.0.0.1:PORT/ ARGS…` of the fixture server,
/// its report written to `json`; it must succeed.
fn record_load(pid: u32, port: u16, json: &Path, args: &[&str]) -> Output {
    let url = format!("http://127.0.0.1:{port}/");
    let mut all = vec!["--load", url.as_str()];
    all.extend(args);
    let output = record(pid, json, &all);
    assert!(
        output.status.success(),
        "record failed: {}",
        stderr(&output)
    );
    output
}

/// [`record_load`] into a report of its own: the output and the report.
fn record_load_report(pid: u32, port: u16, args: &[&str]) -> (Output, Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let output = record_load(pid, port, &json, args);
    (output, read_report(&json))
}

/// Sends `n` keep-alive GETs on one connection, reading each response fully.
fn send_requests(port: u16, n: usize) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_nodelay(true).unwrap();
    for _ in 0..n {
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
            .unwrap();
        let mut response = Vec::new();
        let mut chunk = [0u8; 512];
        loop {
            let got = stream.read(&mut chunk).unwrap();
            assert!(got > 0, "server closed the connection");
            response.extend_from_slice(&chunk[..got]);
            let text = String::from_utf8_lossy(&response);
            if let Some(end) = text.find("\r\n\r\n") {
                let length: usize = text[..end]
                    .lines()
                    .find_map(|line| line.strip_prefix("Content-Length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .expect("Content-Length");
                if response.len() >= end + 4 + length {
                    break;
                }
            }
        }
    }
}

fn lock_by_address(report: &Value, address: u64) -> &Value {
    lock_at(report, address).unwrap_or_else(|| panic!("no lock at {address:#x} in {report:#}"))
}

/// The exact truth of mutex mode, whatever counted the requests.
fn assert_exact_mutex_mode(report: &Value, stats_lock: u64, requests: u64) {
    let stats = lock_by_address(report, stats_lock);
    assert_eq!(
        stats["acquisitions"],
        K * requests,
        "stats lock acquisitions"
    );
    assert_eq!(
        stats["per_request"]["acquisitions"].as_f64(),
        Some(K as f64)
    );
    assert_eq!(caller_functions(stats), ["global_stats_add"]);
    let connection_locks = locks_called_by(report, "conn_counter_add");
    assert!(!connection_locks.is_empty());
    let per_connection: u64 = connection_locks
        .iter()
        .map(|lock| lock["acquisitions"].as_u64().unwrap())
        .sum();
    assert_eq!(
        per_connection,
        K * requests,
        "per-connection mutexes together"
    );
    // Nothing else takes a lock per request: the totals are exact too.
    assert_eq!(report["totals"]["acquisitions"], 2 * K * requests);
    assert_eq!(
        report["totals"]["per_request"]["acquisitions"].as_f64(),
        Some(2.0 * K as f64)
    );
    assert_eq!(report["requests"]["count"], requests);
    assert_eq!(report["dropped"], serde_json::json!({}));
}

#[test]
fn load_driver_gives_exact_per_request_figures() {
    let (server, port) = start_server("mutex", None);
    // The warmup is sent before the probes go in, so it is not counted.
    let (output, report) = record_load_report(
        server.pid(),
        port,
        &[
            "-n",
            "400",
            "-c",
            "4",
            "--warmup",
            "50",
            "--expect-body",
            "hello",
        ],
    );
    assert_exact_mutex_mode(&report, server.address("stats_lock"), 400);
    assert_eq!(report["requests"]["source"], "load");
    assert_eq!(
        report["requests"]["statuses"],
        serde_json::json!({"200": 400})
    );
    assert_eq!(report["requests"]["errors"], 0);
    assert_eq!(report["stopped_by"], "load_done");
    let table = crate::common::unwrapped(&String::from_utf8_lossy(&output.stdout));
    assert!(
        table.contains("acq/req") && table.contains("8.0"),
        "table lacks per-request columns:\n{table}"
    );
}

#[test]
fn off_mode_takes_no_lock_per_request() {
    let (server, port) = start_server("off", None);
    let (_, report) = record_load_report(server.pid(), port, &["-n", "300"]);
    assert_eq!(report["requests"]["count"], 300);
    assert_eq!(report["locks"], serde_json::json!([]));
    assert_eq!(
        report["totals"]["per_request"]["acquisitions"].as_f64(),
        Some(0.0)
    );
}

#[test]
fn load_for_a_duration_on_pinned_cpus() {
    let (server, port) = start_server("mutex", None);
    let last_cpu = (std::thread::available_parallelism().unwrap().get() - 1).to_string();
    let (_, report) = record_load_report(
        server.pid(),
        port,
        &["--duration", "1", "-c", "2", "--load-cpus", &last_cpu],
    );
    let count = report["requests"]["count"].as_u64().unwrap();
    assert!(count > 100, "only {count} requests in a second");
    assert_eq!(report["requests"]["statuses"]["200"], count);
    assert_exact_mutex_mode(&report, server.address("stats_lock"), count);
    let duration = report["duration_s"].as_f64().unwrap();
    assert!((1.0..3.0).contains(&duration), "load window {duration} s");
}

#[test]
fn request_probe_counts_requests_with_and_without_load() {
    let (server, port) = start_server("mutex", None);
    let (_, report) = record_load_report(
        server.pid(),
        port,
        &[
            "-n",
            "300",
            "-c",
            "2",
            "--request-probe",
            "httpd:handle_request",
        ],
    );
    assert_eq!(report["requests"]["source"], "probe");
    assert_eq!(report["requests"]["probe_hits"], 300);
    // The request probe's hits are part of what tracing cost.
    assert_eq!(report["overhead"]["request_probe_hits"], 300);
    assert_exact_mutex_mode(&report, server.address("stats_lock"), 300);

    // Without the load driver: the test sends the requests itself.
    let trace = Trace::attach(
        server.pid(),
        &["--request-probe", "httpd-glibc:handle_request"],
    );
    send_requests(port, 120);
    send_requests(port, 80);
    trace.interrupt();
    let (report, _) = trace.finish();
    assert_eq!(report["requests"]["source"], "probe");
    assert_eq!(report["requests"]["probe"], "httpd-glibc:handle_request");
    assert_exact_mutex_mode(&report, server.address("stats_lock"), 200);
}

#[test]
fn given_request_count() {
    let (server, port) = start_server("mutex", None);
    let trace = Trace::attach(server.pid(), &["--requests", "150"]);
    send_requests(port, 150);
    trace.interrupt();
    let (report, _) = trace.finish();
    assert_eq!(report["requests"]["source"], "given");
    assert_exact_mutex_mode(&report, server.address("stats_lock"), 150);
}

#[test]
fn unexpected_responses_refuse_per_request_figures() {
    for (fault, extra, kind) in [
        ("500", &[][..], "status 500"),
        ("body", &["--expect-body", "hello"][..], "wrong body"),
    ] {
        let (server, port) = start_server("mutex", Some(fault));
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("report.json");
        let url = format!("http://127.0.0.1:{port}/");
        let mut args = vec!["--load", url.as_str(), "-n", "200", "-c", "2"];
        args.extend(extra);
        let output = record(server.pid(), &json, &args);
        assert!(!output.status.success(), "record accepted {fault} faults");
        let message = stderr(&output);
        let last = message.lines().last().unwrap_or_default();
        assert!(
            last.contains("per-request figures refused") && last.contains(kind),
            "message: {message}"
        );
        // The report still shows the breakdown, without per-request figures.
        let report = read_report(&json);
        assert_eq!(report["requests"]["errors"], 20);
        assert_eq!(report["requests"]["unexpected"][kind], 20);
        assert!(report["totals"]["per_request"].is_null());
        assert!(
            report["locks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|lock| lock["per_request"].is_null())
        );

        args.push("--allow-errors");
        let output = record(server.pid(), &json, &args);
        assert!(
            output.status.success(),
            "--allow-errors still refused: {}",
            stderr(&output)
        );
        let report = read_report(&json);
        assert_eq!(report["requests"]["errors"], 20);
        assert_exact_mutex_mode(&report, server.address("stats_lock"), 200);
    }
}

#[test]
fn load_driver_bad_input_is_one_line() {
    let (server, _port) = start_server("off", None);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    for (args, wanted) in [
        (&["--load", "ftp://127.0.0.1/"][..], "only http://"),
        (&["--load", "http://127.0.0.1:1/"][..], "cannot connect"),
        (
            &["--request-probe", "nosuchmodule:f"][..],
            "no module matching",
        ),
        (
            &["--request-probe", "httpd:no_such_function"][..],
            "no function no_such_function",
        ),
        (&["-n", "5"][..], "--load"),
    ] {
        let output = record(server.pid(), &json, args);
        assert!(!output.status.success(), "{args:?} succeeded");
        let message = stderr(&output);
        assert_eq!(
            message.trim().lines().count(),
            1,
            "{args:?}: not one line: {message}"
        );
        assert!(message.contains(wanted), "{args:?}: {message}");
    }
}

/// Records one fixture run in `mode` and returns (report path, stats lock address).
fn record_mode(dir: &Path, mode: &str) -> (std::path::PathBuf, u64) {
    let (server, port) = start_server(mode, None);
    let json = dir.join(format!("{mode}.json"));
    record_load(server.pid(), port, &json, &["-n", "300", "-c", "4"]);
    (json, server.address("stats_lock"))
}

fn compare(before: &Path, after: &Path, args: &[&str]) -> Output {
    locktrace()
        .arg("compare")
        .arg(before)
        .arg(after)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn compare_confirms_the_global_mutex_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (mutex, mutex_lock) = record_mode(dir.path(), "mutex");
    let (atomic, atomic_lock) = record_mode(dir.path(), "atomic");
    // A restart moves the lock: matching must not depend on the address.
    assert_ne!(mutex_lock, atomic_lock);
    let before = read_report(&mutex);
    assert!(lock_at(&before, mutex_lock).is_some());

    let output = compare(
        &mutex,
        &atomic,
        &[
            "--assert-gone",
            "global_stats_add",
            "--assert-max",
            "conn_counter_add=8",
        ],
    );
    let text = crate::common::unwrapped(&String::from_utf8_lossy(&output.stdout));
    assert!(
        output.status.success(),
        "compare failed: {}\n{text}",
        stderr(&output)
    );
    // The stats mutex is named by its pointer chain from the global g_stats.
    let gone = text
        .lines()
        .find(|line| line.contains("g_stats->"))
        .unwrap_or_else(|| panic!("a row for the global mutex:\n{text}"));
    assert!(
        gone.contains("8.0") && gone.contains("disappeared"),
        "row: {gone}"
    );
    let kept = text
        .lines()
        .find(|line| line.contains("via conn_counter_add"))
        .expect("a row for the connection mutexes");
    assert!(kept.contains("8.0") && kept.contains("+0.0"), "row: {kept}");

    // The reverse: the global mutex is back, so the assertion fails.
    let output = compare(&atomic, &mutex, &["--assert-gone", "global_stats_add"]);
    assert_eq!(output.status.code(), Some(1));
    let message = stderr(&output);
    assert!(
        message.contains("assertion failed") && message.contains("still taken"),
        "message: {message}"
    );
    let text = crate::common::unwrapped(&String::from_utf8_lossy(&output.stdout));
    assert!(
        text.lines()
            .any(|line| line.contains("g_stats->") && line.contains("appeared")),
        "{text}"
    );

    let output = compare(&mutex, &atomic, &["--assert-max", "conn_counter_add=7"]);
    assert_eq!(output.status.code(), Some(1));
    // A selector that matches nothing before is a mistake, not a pass.
    let output = compare(&mutex, &atomic, &["--assert-gone", "no_such_function"]);
    assert_eq!(output.status.code(), Some(1));
    // A report without requests cannot be compared per request.
    let output = compare(&mutex, Path::new("/nonexistent.json"), &[]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(stderr(&output).trim().lines().count(), 1);
}
