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
mod common;

use std::{
    fs::File,
    io::{BufRead, BufReader},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use common::{live_views::*, *};
use serde_json::Value;

/// The global statistics mutex of mysqlnd, as locktrace names it.
const GLOBAL_LOCK: &str = "*mysqlnd_global_stats->LOCK_access";
/// Taken this often per request of q.php (measured with bpftrace, the kit's README).
const GLOBAL_PER_REQUEST: f64 = 408.0;
const URL: &str = "http://127.0.0.1:8091/q.php";
const PORT: u16 = 8091;
const PAGE: &str = "/q.php";
/// What q.php answers: 20 rows from MariaDB.
const BODY: &str = "\"count\":20";

/// The kit: `$LOCKTRACE_FRANKENPHP_KIT`, else `shared/frankenphp` beside the repository.
fn kit() -> PathBuf {
    let kit = std::env::var_os("LOCKTRACE_FRANKENPHP_KIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/frankenphp"));
    assert!(
        kit.join("build.sh").exists(),
        "the FrankenPHP kit is missing: expected at {} (set LOCKTRACE_FRANKENPHP_KIT to its folder)",
        kit.display()
    );
    assert!(
        Path::new("/tmp/e2e/frankenphp-e2e").exists(),
        "the FrankenPHP kit is not built (/tmp/e2e/frankenphp-e2e missing): run scripts/setup.sh --frankenphp"
    );
    kit
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Classic,
    Worker,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Libphp {
    Stock,
    Patched,
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
        let kit = kit();
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
        let output = Command::new("bash")
            .arg(self.kit.join(args[0]))
            .args(&args[1..])
            .output()
            .expect("running a kit script");
        assert!(
            output.status.success(),
            "{args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
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
        // use-stock.sh restarts a running server: stop it first.
        run(&["stop.sh"]);
        run(&["use-stock.sh"]);
        if !self.mariadb_was_up {
            run(&["stop.sh", "all"]);
        }
    }
}

/// flock(2) on /tmp/franken.lock, the one FrankenPHP server of this machine.
/// Rust opens files close-on-exec, so the MariaDB start.sh may start does not
/// inherit (and keep) the lock. A blocking flock waits in the kernel's queue
/// with the other waiters; after 15 minutes the test gives up, in one line.
fn take_machine_lock() -> File {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let lock = File::create("/tmp/franken.lock").expect("creating /tmp/franken.lock");
        // SAFETY: flock on a descriptor this thread owns.
        let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(locked, 0, "flock /tmp/franken.lock");
        let _ = sender.send(lock);
    });
    receiver
        .recv_timeout(Duration::from_secs(900))
        .unwrap_or_else(|_| {
            panic!(
                "/tmp/franken.lock has been held by other processes for 15 minutes (holders: /proc/locks); \
                 a process started under `flock` without -o (e.g. a MariaDB start.sh started) keeps it"
            )
        })
}

fn mariadb_up() -> bool {
    Command::new("mysqladmin")
        .args(["--socket=/run/mysqld/mysqld.sock", "ping"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The body of a 200 response to `GET /q.php`, one connection per request.
fn get_page() -> Option<String> {
    try_http_get(PORT, PAGE)
}

/// `n` requests one after another (an outside client, not locktrace's load driver).
fn sequential_requests(n: u64) {
    for i in 0..n {
        let body = get_page().unwrap_or_else(|| panic!("request {i} of {n} failed"));
        assert!(body.contains(BODY), "request {i}: {body}");
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
    run_record(
        locktrace()
            .args(["record", "--pid", &server.pid(), "--json"])
            .arg(json)
            .args(["--load", URL, "-n", "300", "-c", "2", "--warmup", "50"])
            .args(["--expect-body", BODY])
            .args(extra),
        json,
    )
}

/// `record --duration 10` with no request flag while an outside client sends
/// `n` sequential requests, all inside the window (they start once the probes
/// are live and must end before the window does): the count of the chosen
/// request function and the lock counts cover exactly the same requests.
fn record_outside_load(server: &Server, n: u64) -> (Value, String, Vec<String>) {
    let trace = Trace::attach(server.pid, &["--duration", "10"]);
    let started = Instant::now();
    sequential_requests(n);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(9),
        "{n} sequential requests took {took:?}, too long for the 10 s window on this machine"
    );
    let stderr = trace.stderr_lines.clone();
    let (report, table) = trace.finish();
    assert_eq!(report["stopped_by"], "duration");
    (report, table, stderr)
}

/// The dynamic loader's lock taken when a thread is created (its TLS):
/// the Go runtime starts a thread now and then, never per request.
const THREAD_START_LOCK: &str = "_rtld_global._dl_load_tls_lock";

/// Acquisitions per request of every lock PHP takes, i.e. all but the
/// loader's thread-start lock (whose callers are checked to be thread starts).
fn php_acquisitions_per_request(report: &Value, table: &str) -> f64 {
    let count = report["requests"]["count"].as_u64().unwrap() as f64;
    let mut total = 0;
    for lock in report["locks"].as_array().unwrap() {
        let acquisitions = lock["acquisitions"].as_u64().unwrap_or(0);
        if lock["name"] == THREAD_START_LOCK {
            let callers = caller_functions(lock);
            assert!(
                callers.iter().all(|f| f.starts_with("_dl_allocate_tls")),
                "{callers:?}:\n{table}"
            );
        } else {
            total += acquisitions;
        }
    }
    total as f64 / count
}

fn lock_named<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|lock| lock["name"] == name)
        .unwrap_or_else(|| panic!("no lock named {name}"))
}

/// The global lock exactly 408 times per request, named, a pthread mutex.
fn assert_global_lock(report: &Value, table: &str, what: &str) {
    let count = report["requests"]["count"].as_u64().unwrap();
    let lock = lock_named(report, GLOBAL_LOCK);
    assert_eq!(lock["kind"], "mutex", "{what}");
    assert_eq!(lock["wait_class"], "lock", "{what}");
    assert_eq!(
        lock["acquisitions"].as_u64(),
        Some(408 * count),
        "{what}:\n{table}"
    );
    assert_eq!(
        lock["per_request"]["acquisitions"].as_f64(),
        Some(GLOBAL_PER_REQUEST),
        "{what}:\n{table}"
    );
}

/// The request probe locktrace chose with no request flag.
fn assert_auto_probe(report: &Value, stderr: &[String], n: u64, what: &str) {
    let requests = &report["requests"];
    assert_eq!(requests["source"], "probe", "{what}");
    assert_eq!(requests["count"], n, "{what}: {requests}");
    let auto = &requests["auto_probe"];
    assert_eq!(auto["server"], "frankenphp", "{what}: {requests}");
    assert_eq!(auto["function"], "sapi_activate", "{what}");
    assert_eq!(auto["module"], "/tmp/e2e/libphp-franken-stock.so", "{what}");
    assert_eq!(
        auto["recognised_by"],
        "go_frankenphp_finish_worker_request in frankenphp-e2e"
    );
    assert!(
        !stderr.iter().any(|line| line.contains("no per-request")),
        "{what}: {stderr:?}"
    );
}

/// The live views' start-up line says which function counts requests.
fn assert_says_probe_chosen(stderr: &[String]) {
    assert!(
        stderr
            .iter()
            .any(|line| line.contains("request probe chosen: FrankenPHP")),
        "{stderr:?}"
    );
}

/// Go's scheduler parks its threads on futexes: `go_runtime` rows, never in
/// the contention totals, which add up the `lock` rows only.
fn assert_go_runtime_apart(report: &Value, table: &str) {
    let rows = report["locks"].as_array().unwrap();
    let sum = |class: &str, field: &str| -> u64 {
        rows.iter()
            .filter(|lock| lock["wait_class"] == class)
            .map(|lock| lock[field].as_u64().unwrap_or(0))
            .sum()
    };
    let go_waits = sum("go_runtime", "contended");
    assert!(go_waits > 0, "no go_runtime rows:\n{table}");
    let totals = &report["totals"];
    assert_eq!(totals["by_wait_class"]["go_runtime"]["waits"], go_waits);
    assert_eq!(totals["contended"], sum("lock", "contended"), "{table}");
    assert!(table.contains("waiting for work / runtime"), "{table}");
    assert!(table.contains("not contention: go_runtime: "), "{table}");
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
            &["--request-probe", "libphp.so:php_request_startup"],
        );
        assert_eq!(report["requests"]["statuses"]["200"], 300, "{table}");
        assert_eq!(report["requests"]["probe_hits"], 300, "{table}");
        assert_eq!(
            report["requests"]["probe"],
            "libphp-franken-stock.so:php_request_startup"
        );
        assert_global_lock(&report, &table, "classic stock, load");
        assert_eq!(
            php_acquisitions_per_request(&report, &table),
            792.0,
            "{table}"
        );
        assert_go_runtime_apart(&report, &table);

        let (report, table, stderr) = record_outside_load(&server, 100);
        assert_auto_probe(&report, &stderr, 100, "classic, outside load");
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
    let output = locktrace()
        .arg("compare")
        .args([&before, &after])
        .args(["--assert-gone", GLOBAL_LOCK])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains(&format!(
            "ok: no lock matching \"{GLOBAL_LOCK}\" is taken after"
        )),
        "{text}"
    );
    let line = text
        .lines()
        .find(|line| line.contains(GLOBAL_LOCK) && line.contains('|'))
        .unwrap_or_else(|| panic!("no compare row for the global lock: {text}"));
    assert!(
        line.contains("408.0") && line.contains("disappeared"),
        "{line}"
    );
}

/// Worker mode, stock: 408.0 per request by the load driver, and by the
/// function locktrace chose (no request flag) under an outside client.
#[test]
fn worker_mode_stock_counts_408_per_request_both_ways() {
    let server = Server::start(Mode::Worker, Libphp::Stock);
    let dir = tempfile::tempdir().unwrap();
    let (report, table) = record_with_load(&server, &dir.path().join("load.json"), &[]);
    assert_eq!(report["requests"]["source"], "load");
    assert_eq!(report["requests"]["statuses"]["200"], 300, "{table}");
    assert_global_lock(&report, &table, "worker stock, load");

    let (report, table, stderr) = record_outside_load(&server, 100);
    assert_auto_probe(&report, &stderr, 100, "worker, outside load");
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
    while started.elapsed() < Duration::from_secs(20) {
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
