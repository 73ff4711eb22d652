//! Issue 16: the real FrankenPHP (v1.12.7's Go package and `frankenphp.c`
//! against a thread-safe PHP 8.2 with mysqlnd), built by the kit in
//! `../shared/frankenphp` (`scripts/setup.sh --frankenphp`), in classic and
//! worker mode, with stock and patched libphp. Each request of `www/q.php`
//! takes the mysqlnd statistics mutex exactly 408 times (792 mutex calls in
//! all in classic mode); the patch removes that mutex.
//!
//! One server runs on this machine at a time: every test holds
//! `/tmp/franken.lock` while it uses it, and a guard switches back to stock
//! libphp, stops the server, and stops MariaDB if the test started it, also
//! when the test panics.

use std::{
    fs::File,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::common::{frankenphp::*, live_views::*};
use serde_json::Value;

/// The kit, with its dynamic server built.
fn built_kit() -> PathBuf {
    let kit = kit();
    assert!(
        Path::new("/tmp/e2e/frankenphp-e2e").exists(),
        "the FrankenPHP kit is not built (/tmp/e2e/frankenphp-e2e missing): run scripts/setup.sh --frankenphp"
    );
    kit
}

/// The kit's server, running while this lives; holds the machine-wide lock.
struct Server {
    kit: PathBuf,
    pid: u32,
    mariadb_was_up: bool,
    /// flock(2) on /tmp/franken.lock, released when the file closes.
    _lock: File,
}

impl Server {
    fn start(mode: Mode, libphp: Libphp) -> Server {
        let kit = built_kit();
        let lock = take_machine_lock();
        let mut server = Server {
            mariadb_was_up: mariadb_up(),
            kit,
            pid: 0,
            _lock: lock,
        };
        server.switch(libphp);
        let mode = match mode {
            Mode::Classic => "classic",
            Mode::Worker => "worker",
        };
        server.script(&["start.sh", mode]);
        let pid = std::fs::read_to_string("/tmp/e2e/franken.pid").expect("start.sh wrote no pid");
        server.pid = pid.trim().parse().expect("a pid in /tmp/e2e/franken.pid");
        assert!(
            get_page().is_some_and(|body| body.contains(BODY)),
            "the {mode} server does not answer {URL} with 20 rows (see /tmp/e2e/logs/franken.log)"
        );
        server
    }

    /// Points the binary's libphp.so at the stock or the patched build.
    fn switch(&self, libphp: Libphp) {
        match libphp {
            Libphp::Stock => self.script(&["use-stock.sh"]),
            Libphp::Patched => self.script(&["use-patched.sh"]),
        }
    }

    fn script(&self, args: &[&str]) {
        kit_script(&self.kit, args);
    }

    fn pid(&self) -> String {
        self.pid.to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let run = |args: &[&str]| {
            let _ = Command::new("bash")
                .arg(self.kit.join(args[0]))
                .args(&args[1..])
                .output();
        };
        crate::common::frankenphp::show_log_if_failing(Path::new(
            crate::common::frankenphp::KIT_LOG,
        ));
        // use-stock.sh restarts a running server: stop it first.
        run(&["stop.sh"]);
        run(&["use-stock.sh"]);
        if !self.mariadb_was_up {
            run(&["stop.sh", "all"]);
        }
    }
}

/// Requests one after another until `stop`; returns how many were answered.
fn background_load(stop: Arc<AtomicBool>, done: Arc<AtomicU64>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if get_page().is_some_and(|body| body.contains(BODY)) {
                done.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

/// `record` under locktrace's own load driver: 300 requests after a warmup.
fn record_with_load(server: &Server, json: &Path, extra: &[&str]) -> (Value, String) {
    crate::common::frankenphp::record_with_load(server.pid, json, extra)
}

fn record_outside_load(server: &Server, n: u64) -> (Value, String, Vec<String>) {
    crate::common::frankenphp::record_outside_load(server.pid, n)
}

/// The dynamic server's libphp and executable, for [`assert_auto_probe`].
const DYNAMIC: (&str, &str) = ("/tmp/e2e/libphp-franken-stock.so", "frankenphp-e2e");

/// The live views' start-up line says which function counts requests.
fn assert_says_probe_chosen(stderr: &[String]) {
    assert!(
        stderr
            .iter()
            .any(|line| line.contains("request probe chosen: FrankenPHP")),
        "{stderr:?}"
    );
}

/// Classic mode, stock: 408.0 on the named global lock, 792.0 in total, Go's
/// waits apart; `--request-probe libphp.so:...` finds libphp by its SONAME
/// (mapped as libphp-franken-stock.so); with no request flag the chosen
/// function counts an outside client's requests exactly. Patched: compare
/// says the global lock is gone, 1.0 lock per request is left.
#[test]
fn classic_mode_stock_then_patched() {
    let dir = tempfile::tempdir().unwrap();
    let before = dir.path().join("before.json");
    let after = dir.path().join("after.json");
    {
        let server = Server::start(Mode::Classic, Libphp::Stock);
        let (report, table) = record_with_load(
            &server,
            &before,
            &[
                "--request-probe",
                "libphp.so:php_request_startup",
                "--stacks",
                "10000",
            ],
        );
        assert_eq!(report["requests"]["statuses"]["200"], 300, "{table}");
        assert_eq!(report["requests"]["probe_hits"], 300, "{table}");
        assert_eq!(
            report["requests"]["probe"],
            "libphp-franken-stock.so:php_request_startup"
        );
        assert_global_lock(&report, &table, "classic stock, load");
        assert_global_lock_stacks(&report, &table, "classic stock, load");
        assert_connection_stats_by_site(&report, &table, "classic stock, load");
        assert_eq!(
            php_acquisitions_per_request(&report, &table),
            792.0,
            "{table}"
        );
        assert_go_runtime_apart(&report, &table);

        let (report, table, stderr) = record_outside_load(&server, 100);
        assert_auto_probe(&report, &stderr, DYNAMIC, 100, "classic, outside load");
        assert_global_lock(&report, &table, "classic stock, outside load");
        assert!(
            table.contains("request probe chosen: FrankenPHP"),
            "{table}"
        );
    }
    {
        let server = Server::start(Mode::Classic, Libphp::Patched);
        let (report, table) = record_with_load(&server, &after, &[]);
        assert_eq!(report["requests"]["source"], "load");
        assert_eq!(report["requests"]["count"], 300);
        assert!(
            !report["locks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|lock| lock["name"] == GLOBAL_LOCK),
            "{table}"
        );
        assert_eq!(
            php_acquisitions_per_request(&report, &table),
            1.0,
            "{table}"
        );
    }
    assert_compare_says_gone(&before, &after);
}

/// Worker mode, stock: 408.0 per request by the load driver, and by the
/// function locktrace chose (no request flag) under an outside client.
#[test]
fn worker_mode_stock_counts_408_per_request_both_ways() {
    let server = Server::start(Mode::Worker, Libphp::Stock);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("load.json");
    let (report, table) = record_with_load(&server, &json, &["--stacks", "10000"]);
    assert_eq!(report["requests"]["source"], "load");
    assert_eq!(report["requests"]["statuses"]["200"], 300, "{table}");
    assert_global_lock(&report, &table, "worker stock, load");
    assert_global_lock_stacks(&report, &table, "worker stock, load");
    assert_connection_stats_by_site(&report, &table, "worker stock, load");

    let (report, table, stderr) = record_outside_load(&server, 100);
    assert_auto_probe(&report, &stderr, DYNAMIC, 100, "worker, outside load");
    assert_global_lock(&report, &table, "worker stock, outside load");
}

/// Worker mode, patched: no lock at all.
#[test]
fn worker_mode_patched_takes_no_lock() {
    let server = Server::start(Mode::Worker, Libphp::Patched);
    let dir = tempfile::tempdir().unwrap();
    let (report, table) = record_with_load(&server, &dir.path().join("load.json"), &[]);
    assert_eq!(report["requests"]["count"], 300);
    assert_eq!(
        php_acquisitions_per_request(&report, &table),
        0.0,
        "{table}"
    );
    assert!(
        report["locks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|lock| lock["wait_class"] != "lock" || lock["name"] == THREAD_START_LOCK),
        "{table}"
    );
}

/// `top` (plain tables) and `serve` on the real server under load: the
/// global lock is the busiest, named; serve's counters are exact.
#[test]
fn top_and_serve_put_the_global_lock_on_top() {
    let server = Server::start(Mode::Classic, Libphp::Stock);
    let pid = server.pid();

    let (mut top, top_stderr) = start_live(&["top", "--pid", &pid], Stdio::piped());
    let stop = Arc::new(AtomicBool::new(false));
    let load = background_load(stop.clone(), Arc::new(AtomicU64::new(0)));
    let mut stdout = BufReader::new(top.0.stdout.take().unwrap());
    let started = Instant::now();
    let mut first_row = None;
    let mut header_seen = false;
    let mut line = String::new();
    // A deadline only: the loop ends at the first table with the global lock
    // on top. Under two CPU hogs, top's attach alone took more than 20 s.
    while started.elapsed() < Duration::from_secs(90) {
        line.clear();
        if stdout.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if line.starts_with("lock ") {
            header_seen = true;
        } else if header_seen {
            header_seen = false;
            first_row = Some(line.clone());
            if line.starts_with(&format!("{GLOBAL_LOCK} ")) {
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    unsafe { libc::kill(top.0.id() as i32, libc::SIGINT) };
    assert!(top.0.wait().unwrap().success());
    let row = first_row.expect("top printed no table");
    assert!(
        row.starts_with(&format!("{GLOBAL_LOCK} mutex ")),
        "top row: {row}"
    );
    assert_says_probe_chosen(&top_stderr.lock().unwrap());

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (_serve, serve_stderr) = start_live(
        &["serve", "--pid", &pid, "--listen", &listen],
        Stdio::null(),
    );
    sequential_requests(50);
    // The counters are read once a second.
    std::thread::sleep(Duration::from_millis(2500));
    let metrics = http_get(port, "/metrics");
    let label = format!("lock=\"{GLOBAL_LOCK}\"");
    assert_eq!(
        sample(&metrics, "locktrace_lock_acquisitions_total", &label),
        Some(408.0 * 50.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "locktrace_requests_total", ""),
        Some(50.0),
        "{metrics}"
    );
    let busiest = metrics
        .lines()
        .filter(|line| line.starts_with("locktrace_lock_acquisitions_total{"))
        .max_by_key(|line| {
            line.rsplit(' ')
                .next()
                .and_then(|n| n.parse::<f64>().ok())
                .unwrap_or(0.0) as u64
        })
        .expect("acquisition series");
    assert!(busiest.contains(&label), "{busiest}");
    assert_says_probe_chosen(&serve_stderr.lock().unwrap());
}

/// Sampled mode on the real server under four concurrent clients, attached
/// while it runs: the global lock's per-request figure holds the truth (408)
/// within its stated bound, and that bound is useful (±5 % at most). Windows
/// of 50 ms (`--sample-period 0.5`) make the windows' edges count: before
/// each window waited for the target to run at its probed pace
/// (`trace::sampled::WARMUP`), they overstated calls per request by 0.4 to
/// 1.5 % (414.0 ±4.8 failed one of two runs; the bench's 1 s windows were
/// all 0.3-0.6 % high).
#[test]
fn sampled_mode_holds_the_truth_within_its_bound() {
    let server = Server::start(Mode::Classic, Libphp::Stock);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..4)
        .map(|_| background_load(stop.clone(), done.clone()))
        .collect();
    let trace = crate::common::Trace::attach(
        server.pid,
        &[
            "--mode",
            "sampled",
            "--sample",
            "0.1",
            "--sample-period",
            "0.5",
            "--duration",
            "20",
            "--request-probe",
            "libphp.so:php_request_startup",
        ],
    );
    let (report, table) = trace.finish();
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().unwrap();
    }
    assert!(done.load(Ordering::Relaxed) > 1000, "{table}");
    let per_request = &lock_named(&report, GLOBAL_LOCK)["per_request"];
    let figure = per_request["acquisitions"].as_f64().expect("a figure");
    let bound = per_request["acquisitions_error"]
        .as_f64()
        .expect("its bound");
    assert!(
        (figure - 408.0).abs() <= bound && bound <= 408.0 * 0.05,
        "~{figure} ±{bound} per request, truth 408: {}\n{table}",
        report["estimate"]
    );
    // The request probe counted all along, so the totals are scaled by the
    // requests: the lock's total is its per-request figure times the exact
    // request count, and its bound is useful too (by time it was hundreds
    // of percent: the probes slow this server while they count).
    assert_eq!(report["estimate"]["scaled_by"], "requests", "{table}");
    let requests = report["requests"]["count"].as_f64().expect("requests");
    let lock = lock_named(&report, GLOBAL_LOCK);
    let total = lock["acquisitions"].as_f64().expect("a total");
    let total_bound = lock["acquisitions_error"].as_f64().expect("its bound");
    assert!(
        (total - figure * requests).abs() <= 1.0 + total * 1e-6 && total_bound <= total * 0.05,
        "~{total} ±{total_bound} against {figure} x {requests}: {}\n{table}",
        report["estimate"]
    );
}

/// Issue 49: creation sites by default. A plain `record` (no `--stacks`)
/// snapshots the init calls, so the per-connection statistics mutexes
/// (eight `heap (thread arena)` rows before) are one row named by where
/// they were created, at exactly 383.0 per request beside the global
/// lock's 408.0; `--mode inproc` (an init uprobe beside the stubs) the same.
#[test]
fn plain_record_groups_connection_stats_by_creation_site() {
    let server = Server::start(Mode::Classic, Libphp::Stock);
    let dir = tempfile::tempdir().unwrap();
    for (what, extra) in [
        ("classic stock, plain record", &[][..]),
        ("classic stock, plain inproc", &["--mode", "inproc"][..]),
    ] {
        let json = dir.path().join("plain.json");
        let (report, table) = record_with_load(&server, &json, extra);
        assert_eq!(report["requests"]["statuses"]["200"], 300, "{table}");
        assert_global_lock(&report, &table, what);
        assert_connection_stats_by_site(&report, &table, what);
        assert!(
            report["stacks"].as_array().is_none_or(Vec::is_empty),
            "{what}: stacks without --stacks"
        );
    }
}

/// `--mode inproc` on the real server (dynamic build, classic): the global
/// lock exact at 408 per request, counted by the stubs behind the GOT
/// entries of the executable and libphp; then a recording killed with
/// SIGKILL under load: the server serves on, and `locktrace restore`
/// switches the entries back.
#[test]
fn inproc_mode_counts_408_per_request_and_survives_a_killed_tracer() {
    let server = Server::start(Mode::Classic, Libphp::Stock);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("inproc.json");
    let (report, table) = record_with_load(&server, &json, &["--mode", "inproc"]);
    assert_eq!(report["requests"]["statuses"]["200"], 300, "{table}");
    assert_global_lock(&report, &table, "classic stock, inproc");
    assert_eq!(
        php_acquisitions_per_request(&report, &table),
        792.0,
        "{table}"
    );
    assert_eq!(
        lock_named(&report, GLOBAL_LOCK)["counted_by"],
        serde_json::json!(["got_stubs"])
    );
    let mutex_lock = report["inproc"]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function"] == "pthread_mutex_lock")
        .unwrap();
    let modules: Vec<&str> = mutex_lock["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["module"].as_str().unwrap())
        .collect();
    assert!(
        modules.iter().any(|m| m.ends_with("frankenphp-e2e"))
            && modules
                .iter()
                .any(|m| m.ends_with("libphp-franken-stock.so")),
        "{modules:?}"
    );
    assert_eq!(
        report["inproc"]["restore"]["outcome"], "restored",
        "{table}"
    );
    assert_eq!(report["overhead"]["probe_hits"], 0, "{table}");

    let trace = crate::common::Trace::attach(server.pid, &["--mode", "inproc"]);
    sequential_requests(20);
    let mut child = trace.child;
    child.kill().unwrap();
    child.wait().unwrap();
    // The stubs still count and call the real lock: pages stay right.
    sequential_requests(50);
    let output = crate::common::locktrace()
        .args(["restore", "--pid", &server.pid()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(said.contains("restored 2 GOT entries"), "{said}");
    sequential_requests(20);
}
