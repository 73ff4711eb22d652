//! The real FrankenPHP kit (`../shared/frankenphp`), shared by
//! `frankenphp_real.rs` (the kit's dynamic glibc server) and
//! `frankenphp_static.rs` (the static musl one, release-shaped): the machine
//! lock, MariaDB, the page, recording under load, and what every build shows.
use std::{
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{
    OUTSIDE_LOAD_CAP, Trace, caller_functions, frame_functions, is_cpu_stack,
    live_views::try_http_get, locktrace, repo_root, run_record,
};

/// The global statistics mutex of mysqlnd, as locktrace names it.
pub const GLOBAL_LOCK: &str = "*mysqlnd_global_stats->LOCK_access";
/// Taken this often per request of q.php (measured with bpftrace, the kit's README).
pub const GLOBAL_PER_REQUEST: f64 = 408.0;
pub const URL: &str = "http://127.0.0.1:8091/q.php";
const PORT: u16 = 8091;
const PAGE: &str = "/q.php";
/// What q.php answers: 20 rows from MariaDB.
pub const BODY: &str = "\"count\":20";

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    Classic,
    Worker,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Libphp {
    Stock,
    Patched,
}

/// The kit: `$LOCKTRACE_FRANKENPHP_KIT`, else `shared/frankenphp` beside the repository.
pub fn kit() -> PathBuf {
    let kit = std::env::var_os("LOCKTRACE_FRANKENPHP_KIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/frankenphp"));
    assert!(
        kit.join("build.sh").exists(),
        "the FrankenPHP kit is missing: expected at {} (set LOCKTRACE_FRANKENPHP_KIT to its folder)",
        kit.display()
    );
    kit
}

/// Runs one of the kit's scripts (`start.sh classic`, `stop.sh`, …); panics with its output on failure.
pub fn kit_script(kit: &Path, args: &[&str]) {
    let output = Command::new("bash")
        .arg(kit.join(args[0]))
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

/// flock(2) on /tmp/franken.lock, the one FrankenPHP server of this machine.
/// Rust opens files close-on-exec, so the MariaDB start.sh may start does not
/// inherit (and keep) the lock. A blocking flock waits in the kernel's queue
/// with the other waiters; after 15 minutes the test gives up, in one line.
pub fn take_machine_lock() -> File {
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

/// A FrankenPHP binary a test starts itself (not through start.sh): the
/// static builds, stripped copies. Holds the machine lock; stops the server
/// by its pid (SIGTERM, then SIGKILL after 10 s), and MariaDB if the test
/// started it, also on a panic.
pub struct SpawnedServer {
    pub kit: PathBuf,
    pub binary: PathBuf,
    pub child: Child,
    log_path: PathBuf,
    mariadb_was_up: bool,
    /// flock(2) on /tmp/franken.lock, released when the file closes.
    _lock: File,
}

impl SpawnedServer {
    /// Starts `binary ARGS` with the kit's php.ini (or `env`'s PHPRC) and `env`, logging to
    /// /tmp/e2e/logs/`log`, once MariaDB and the bench database are up as
    /// the kit sets them up; returns once it answers q.php with 20 rows.
    pub fn start(
        binary: &Path,
        args: &[std::ffi::OsString],
        env: &[(&str, &Path)],
        log: &str,
    ) -> Self {
        Self::start_in(binary, args, env, log, None, None)
    }

    /// Like [`SpawnedServer::start`], the server moved into the cgroup
    /// whose `cgroup.procs` is `procs` before it execs (as container
    /// runtimes do), so it is never seen outside it; `lock`: the machine
    /// lock, when the caller took it already ([`take_machine_lock`]).
    pub fn start_in(
        binary: &Path,
        args: &[std::ffi::OsString],
        env: &[(&str, &Path)],
        log: &str,
        procs: Option<&Path>,
        lock: Option<File>,
    ) -> Self {
        assert!(
            binary.exists(),
            "{} is missing: run scripts/setup.sh --frankenphp",
            binary.display()
        );
        let kit = kit();
        let lock = lock.unwrap_or_else(take_machine_lock);
        let mariadb_was_up = mariadb_up();
        // start.sh starts MariaDB and the database (and its dynamic server, stopped at once).
        kit_script(&kit, &["start.sh", "classic"]);
        kit_script(&kit, &["stop.sh"]);
        let log_path = Path::new("/tmp/e2e/logs").join(log);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", log_path.display()));
        let mut command = Command::new(binary);
        if let Some(procs) = procs {
            use std::os::unix::{ffi::OsStrExt, process::CommandExt};
            let path = std::ffi::CString::new(procs.as_os_str().as_bytes()).unwrap();
            // SAFETY: only open(2), write(2) and close(2) between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
                    // "0": the writing process itself.
                    if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::close(fd);
                    Ok(())
                });
            }
        }
        let child = command
            .args(args)
            // The kit's php.ini unless `env` gives another PHPRC.
            .env("PHPRC", kit.join("php.ini"))
            .envs(env.iter().copied())
            .current_dir("/tmp/e2e")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let server = SpawnedServer {
            kit,
            binary: binary.to_path_buf(),
            child,
            log_path: log_path.clone(),
            mariadb_was_up,
            _lock: lock,
        };
        let started = Instant::now();
        while !get_page().is_some_and(|body| body.contains(BODY)) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{} does not answer {URL} with 20 rows (see {})",
                server.binary.display(),
                log_path.display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the server this test started, by its pid: SIGTERM, then SIGKILL after 10 s.
    pub fn stop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let started = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) {
            if started.elapsed() > Duration::from_secs(10) {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.wait();
    }
}

impl Drop for SpawnedServer {
    fn drop(&mut self) {
        show_log_if_failing(&self.log_path);
        self.stop();
        if !self.mariadb_was_up {
            let _ = Command::new("bash")
                .arg(self.kit.join("stop.sh"))
                .arg("all")
                .output();
        }
    }
}

/// The server's arguments for `mode` serving `root`: worker mode runs its
/// `worker.php` with 16 workers, the kit's configuration (start.sh worker).
pub fn server_args(mode: Mode, root: &Path) -> Vec<std::ffi::OsString> {
    let mut args = vec!["-root".into(), root.as_os_str().to_owned()];
    if mode == Mode::Worker {
        args.extend([
            "-worker".into(),
            root.join("worker.php").into_os_string(),
            "-workers".into(),
            "16".into(),
        ]);
    }
    args
}

/// The kit server's log (start.sh's), where a server that died says why.
pub const KIT_LOG: &str = "/tmp/e2e/logs/franken.log";

/// While a test panics, prints the last lines of the server log at `path`:
/// a server that died under a recording (a Go crash report, a signal)
/// says why there, and CI keeps only the test's output.
pub fn show_log_if_failing(path: &Path) {
    if !std::thread::panicking() {
        return;
    }
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(60)..].join("\n");
    eprintln!("--- last lines of {} ---\n{tail}\n---", path.display());
}

/// How many rows take exactly `per_request` acquisitions per request.
pub fn rows_at_per_request(report: &Value, per_request: f64) -> usize {
    report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|lock| lock["per_request"]["acquisitions"].as_f64() == Some(per_request))
        .count()
}

/// The rows whose name starts with `prefix`.
pub fn rows_named_starting<'a>(report: &'a Value, prefix: &str) -> Vec<&'a Value> {
    report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|lock| {
            lock["name"]
                .as_str()
                .is_some_and(|name| name.starts_with(prefix))
        })
        .collect()
}

pub fn mariadb_up() -> bool {
    Command::new("mysqladmin")
        .args(["--socket=/run/mysqld/mysqld.sock", "ping"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The body of a 200 response to `GET /q.php`, one connection per request.
pub fn get_page() -> Option<String> {
    try_http_get(PORT, PAGE)
}

/// `n` requests one after another (an outside client, not locktrace's load driver).
pub fn sequential_requests(n: u64) {
    for i in 0..n {
        let body = get_page().unwrap_or_else(|| panic!("request {i} of {n} failed"));
        assert!(body.contains(BODY), "request {i}: {body}");
    }
}

/// `record` under locktrace's own load driver: 300 requests after a warmup.
pub fn record_with_load(pid: u32, json: &Path, extra: &[&str]) -> (Value, String) {
    run_record(
        locktrace()
            .args(["record", "--pid", &pid.to_string(), "--json"])
            .arg(json)
            .args(["--load", URL, "-n", "300", "-c", "2", "--warmup", "50"])
            .args(["--expect-body", BODY])
            .args(extra),
        json,
    )
}

/// `record` with no request flag while an outside client sends `n`
/// sequential requests, all inside the window (they start once the probes
/// are live, and the recording stops once they are answered): the count of
/// the chosen request function and the lock counts cover exactly the same
/// requests.
pub fn record_outside_load(pid: u32, n: u64) -> (Value, String, Vec<String>) {
    let trace = Trace::attach(pid, &["--duration", OUTSIDE_LOAD_CAP]);
    sequential_requests(n);
    let stderr = trace.stderr_lines.clone();
    let (report, table) = trace.stop_after_load();
    (report, table, stderr)
}

/// The request function locktrace chose with no request flag:
/// `sapi_activate` in `module` (libphp, or the executable of a static
/// build), FrankenPHP recognised by a symbol of the executable `exe_name`;
/// it counted the `n` requests, and nothing said "no per-request".
pub fn assert_auto_probe(
    report: &Value,
    stderr: &[String],
    (module, exe_name): (&str, &str),
    n: u64,
    what: &str,
) {
    let requests = &report["requests"];
    assert_eq!(requests["source"], "probe", "{what}");
    assert_eq!(requests["count"], n, "{what}: {requests}");
    let auto = &requests["auto_probe"];
    assert_eq!(auto["server"], "frankenphp", "{what}: {requests}");
    assert_eq!(auto["function"], "sapi_activate", "{what}");
    assert_eq!(auto["module"], module, "{what}");
    assert_eq!(
        auto["recognised_by"],
        format!("go_frankenphp_finish_worker_request in {exe_name}").as_str(),
        "{what}"
    );
    assert!(
        !stderr.iter().any(|line| line.contains("no per-request")),
        "{what}: {stderr:?}"
    );
}

/// The dynamic loader's lock taken when a thread is created (its TLS):
/// the Go runtime starts a thread now and then, never per request.
pub const THREAD_START_LOCK: &str = "_rtld_global._dl_load_tls_lock";

/// Acquisitions per request of every lock PHP takes, i.e. all but the
/// loader's thread-start lock (whose callers are checked to be thread starts).
pub fn php_acquisitions_per_request(report: &Value, table: &str) -> f64 {
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

pub fn lock_named<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|lock| lock["name"] == name)
        .unwrap_or_else(|| panic!("no lock named {name}; {}", naming_summary(report)))
}

/// The report's first locks (name, region, address) and how pointer-chain
/// naming went: what a naming failure needs to be understood.
pub fn naming_summary(report: &Value) -> String {
    let locks: Vec<String> = report["locks"]
        .as_array()
        .map(|locks| {
            locks
                .iter()
                .take(8)
                .map(|lock| format!("{} ({}, {})", lock["name"], lock["region"], lock["address"]))
                .collect()
        })
        .unwrap_or_default();
    format!(
        "locks: {}; pointer chains: {}; during the recording: {}",
        locks.join(", "),
        report["naming"]["pointer_chains"],
        report["naming"]["live"]
    )
}

pub fn has_lock_named(report: &Value, name: &str) -> bool {
    report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|lock| lock["name"] == name)
}

/// The global lock exactly 408 times per request, named, a pthread mutex.
pub fn assert_global_lock(report: &Value, table: &str, what: &str) {
    let count = report["requests"]["count"].as_u64().unwrap();
    assert!(
        has_lock_named(report, GLOBAL_LOCK),
        "{what}: no lock named {GLOBAL_LOCK}; {}:\n{table}",
        naming_summary(report)
    );
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

/// Stacks of the global lock (`--stacks`): whole, through libphp built
/// without frame pointers, from the lock function through mysqlnd to PHP's
/// executor (through the PDO methods) or to the request's shutdown (the
/// connection closed); their counts add up to the lock's exact
/// acquisitions (a lock call's stacks, not its waits').
pub fn assert_global_lock_stacks(report: &Value, table: &str, what: &str) {
    let lock = lock_named(report, GLOBAL_LOCK);
    let address = lock["address"].as_str().unwrap();
    let calls: Vec<(Vec<String>, u64)> = report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|stack| stack["lock"] == address && !is_cpu_stack(stack))
        .map(|stack| (frame_functions(stack), stack["count"].as_u64().unwrap()))
        .filter(|(frames, _)| frames[0].starts_with("pthread_mutex"))
        .collect();
    assert!(
        !calls.is_empty(),
        "{what}: no stacks of the global lock:\n{table}"
    );
    let at =
        |frames: &[String], wanted: &dyn Fn(&str) -> bool| frames.iter().position(|f| wanted(f));
    for (frames, _) in &calls {
        // From PHP code (the executor) or from the request's end (the
        // connection closed by a destructor at shutdown).
        let php = at(frames, &|f| {
            f == "execute_ex" || f == "php_request_shutdown"
        });
        let mysqlnd = at(frames, &|f| f.contains("mysqlnd"));
        assert!(
            mysqlnd.is_some() && mysqlnd < php,
            "{what}: lock <- mysqlnd <- execute_ex or php_request_shutdown wanted, got {frames:?}"
        );
    }
    let through_pdo = calls.iter().any(|(frames, _)| {
        let mysqlnd = at(frames, &|f| f.contains("mysqlnd"));
        let pdo = at(frames, &|f| f.starts_with("zim_PDO"));
        let executor = at(frames, &|f| f == "execute_ex");
        mysqlnd.is_some() && mysqlnd < pdo && pdo < executor
    });
    assert!(
        through_pdo,
        "{what}: no stack lock <- mysqlnd <- PDO method <- execute_ex"
    );
    let counted: u64 = calls.iter().map(|(_, count)| count).sum();
    assert_eq!(
        Some(counted),
        lock["acquisitions"].as_u64(),
        "{what}:\n{table}"
    );
}

/// The per-connection statistics mutexes (`--stacks`): each request's
/// connection creates one in `mysqlnd_stats_init`, at a few reused heap
/// addresses; named by that creation site, they are one row (grouped by
/// site) that takes exactly 383.0 per request (792 in all, less 408 on the
/// global lock and 1 on `*tsrm_env_mutex`).
pub fn assert_connection_stats_by_site(report: &Value, table: &str, what: &str) {
    const SITE: &str = "mutex created in tsrm_mutex_alloc <- mysqlnd_stats_init";
    let count = report["requests"]["count"].as_u64().unwrap();
    let rows = rows_named_starting(report, SITE);
    // Grouped by creation site (the default): one row for every connection's.
    assert_eq!(rows.len(), 1, "{what}: not one row named {SITE}…:\n{table}");
    let row = rows[0];
    assert_eq!(row["acquisitions"], 383 * count, "{what}:\n{table}");
    assert_eq!(
        row["per_request"]["acquisitions"], 383.0,
        "{what}:\n{table}"
    );
    assert_eq!(row["created"]["by"], "init", "{what}: {row:#}");
    let objects = row["group"]["objects"].as_u64().unwrap_or(0);
    assert!(objects >= 1, "{what}: {row:#}");
}

/// Go's scheduler parks its threads on futexes: `go_runtime` rows, never in
/// the contention totals, which add up the `lock` rows only.
pub fn assert_go_runtime_apart(report: &Value, table: &str) {
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

/// `compare BEFORE AFTER --assert-gone GLOBAL_LOCK` passes, and its row says
/// 408.0 per request before and `disappeared`.
pub fn assert_compare_says_gone(before: &Path, after: &Path) {
    assert_compare_says_gone_as(before, after, GLOBAL_LOCK, GLOBAL_PER_REQUEST);
}

/// `compare BEFORE AFTER --assert-gone SELECTOR` passes, and the row it
/// matches says `per_request` before and `disappeared`.
pub fn assert_compare_says_gone_as(before: &Path, after: &Path, selector: &str, per_request: f64) {
    let output = locktrace()
        .arg("compare")
        .args([before, after])
        .args(["--assert-gone", selector])
        .output()
        .unwrap();
    let text = super::unwrapped(&String::from_utf8_lossy(&output.stdout));
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains(&format!(
            "ok: no lock matching \"{selector}\" is taken after"
        )),
        "{text}"
    );
    let line = text
        .lines()
        .find(|line| line.contains(selector) && line.contains('|'))
        .unwrap_or_else(|| panic!("no compare row for {selector}: {text}"));
    assert!(
        line.contains(&format!("{per_request:.1}")) && line.contains("disappeared"),
        "{line}"
    );
}
