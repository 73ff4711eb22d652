//! The live views on a real target: `serve` read by promtool and a real
//! Prometheus server, `top` in a tmux pane and through a pipe.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::common::{live_views::*, *};

/// The `exit=N` line the tmux shell writes when `top` ends, within 30 s
/// (a loaded machine delays the key and the interval in progress).
fn wait_for_status(status_file: &Path, what: &str) -> String {
    let started = Instant::now();
    while !status_file.exists() {
        assert!(started.elapsed() < Duration::from_secs(30), "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::read_to_string(status_file)
        .unwrap()
        .trim()
        .to_string()
}

/// A detached 80×24 tmux session (server at `socket`) running `command`.
fn new_80x24_session(socket: &Path, command: &str) {
    tmux(
        socket,
        &[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "80",
            "-y",
            "24",
            command,
        ],
    );
}

/// `/metrics` as Prometheus asks for it: OpenMetrics.
fn openmetrics_get(port: u16) -> String {
    try_http_get_with(
        port,
        "/metrics",
        "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n",
    )
    .expect("an HTTP 200 response")
}

/// A Debian `prometheus` server scraping `target_port` every second, with its
/// storage in a temporary directory; killed (by pid) when dropped.
struct PrometheusServer {
    _process: Started,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PrometheusServer {
    fn start(target_port: u16) -> PrometheusServer {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: locktrace\n    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let process = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting prometheus (scripts/setup.sh installs it)");
        PrometheusServer {
            _process: Started(process),
            port,
            _dir: dir,
        }
    }

    /// The instant query's result vector (empty until the data is there).
    fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let path = format!(
            "/api/v1/query?query={}",
            locktrace::agent::push::percent_encode(promql)
        );
        let Some(body) = try_http_get(self.port, &path) else {
            return Vec::new(); // not up yet
        };
        let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON from prometheus");
        assert_eq!(answer["status"], "success", "{answer}");
        answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

fn promtool_check(metrics: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running promtool (scripts/setup.sh installs prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool check metrics: {}{}\n{metrics}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// fixtures/steady.c: 40 lock calls in `tick` every millisecond for 12 s,
/// then it lingers 10 s (serve's totals are read then) and exits. Truth: 480,000 acquisitions of g_lock and
/// 12,000 calls of `tick` (the request probe).
#[test]
fn serve_feeds_promtool_and_a_real_prometheus_with_exact_totals() {
    let binary = fixture("steady", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["40", "12000", "10"]);
    let port = free_port();
    let pid = fixture.pid().to_string();
    let listen = format!("127.0.0.1:{port}");
    let (mut serve, stderr) = start_live(
        &[
            "serve",
            "--pid",
            &pid,
            "--listen",
            &listen,
            "--request-probe",
            "steady:tick",
        ],
        Stdio::null(),
    );
    let prometheus = PrometheusServer::start(port);
    fixture.start();

    let promql = r#"rate(locktrace_lock_acquisitions_total{lock="g_lock",kind="mutex"}[5s]) > 0"#;
    // Wait until prometheus holds 5 scrapes of g_lock within the last 5 s:
    // the rate's window then lies within the run.
    let covered = r#"count_over_time(locktrace_lock_acquisitions_total{lock="g_lock",kind="mutex"}[5s]) >= 5"#;
    let started = Instant::now();
    while prometheus.query(covered).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "prometheus never held 5 s of g_lock samples"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // The rate is about the pace, 40,000 a second: 1 s counter updates seen
    // by 1 s scrapes put 4 to 6 updates in a 5 s window, and a loaded machine
    // delays the fixture's ticks, so only the order of magnitude is checked
    // here; the exact totals are checked below.
    let result = prometheus.query(promql);
    let rate: f64 = result[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(
        (20_000.0..60_000.0).contains(&rate),
        "rate {rate}/s, truth 40000/s"
    );
    assert!(
        result[0]["metric"]["module"]
            .as_str()
            .is_some_and(|m| m.ends_with("steady-glibc")),
        "{result:?}"
    );

    let metrics = http_get(port, "/metrics");
    promtool_check(&metrics);
    let openmetrics = openmetrics_get(port);
    assert!(
        openmetrics.ends_with("# EOF\n"),
        "not OpenMetrics: {openmetrics}"
    );

    assert_eq!(fixture.read_line().as_deref(), Some("done 480000"));
    // The first interval read after the last call has every count.
    let metrics = wait_for_sample(
        port,
        "locktrace_lock_acquisitions_total",
        r#"lock="g_lock""#,
        |n| n == Some(480_000.0),
    );
    promtool_check(&metrics);
    assert_eq!(
        sample(&metrics, "locktrace_requests_total", ""),
        Some(12_000.0),
        "{metrics}"
    );
    let hits = sample(&metrics, "locktrace_probe_hits", "").expect("probe hits gauge");
    assert_eq!(hits, 480_000.0, "{metrics}");
    // The sampled CPU of g_lock's lock code: a series of its own, a few
    // milliseconds at most for 480,000 uncontended lock/unlock pairs.
    let cpu = sample(
        &metrics,
        "locktrace_lock_cpu_seconds_total",
        r#"lock="g_lock""#,
    )
    .expect("a CPU series for g_lock");
    assert!((0.0..1.0).contains(&cpu), "{metrics}");

    // The target exits: one line, non-zero exit.
    fixture.wait();
    let status = serve.0.wait().unwrap();
    assert_eq!(status.code(), Some(1), "{:?}", stderr.lock().unwrap());
    // Its stderr reader has the last line once it has read to the end.
    let exited = format!("pid {pid} exited");
    let started = Instant::now();
    while !stderr.lock().unwrap().iter().any(|l| l.contains(&exited)) {
        assert!(started.elapsed() < Duration::from_secs(10), "{stderr:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let lines = stderr.lock().unwrap();
    let last = lines.last().unwrap();
    assert!(last.contains(&exited), "{lines:?}");
}

/// `top` with stdout a pipe: a plain table per second with g_lock, its
/// caller `tick`, and its rate (40 calls a millisecond).
#[test]
fn top_prints_plain_tables_when_not_a_terminal() {
    let binary = fixture("steady", Flavor::Glibc);
    // 30 s of work: four tables well before its end, however slow the attach.
    let mut fixture = Fixture::spawn(&binary, &["40", "30000"]);
    let pid = fixture.pid().to_string();
    let (mut top, _) = start_live(&["top", "--pid", &pid], Stdio::piped());
    fixture.start();
    let mut stdout = BufReader::new(top.0.stdout.take().unwrap());
    let mut tables = 0;
    let mut rows = Vec::new();
    let started = Instant::now();
    while tables < 4 && started.elapsed() < Duration::from_secs(15) {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if line.starts_with("# ") {
            tables += 1;
        } else if line.starts_with("g_lock ") {
            rows.push(line);
        }
    }
    assert!(tables >= 4, "top printed {tables} tables");
    // The first interval may start before the fixture does.
    let row = rows.last().expect("a g_lock row");
    let fields: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(fields[1], "mutex", "{row}");
    let rate: f64 = fields[2].parse().unwrap();
    assert!((30_000.0..50_000.0).contains(&rate), "{row}");
    assert_eq!(fields.last(), Some(&"tick"), "{row}");
    unsafe { libc::kill(top.0.id() as i32, libc::SIGINT) };
    assert!(top.0.wait().unwrap().success());
}

/// `top --stacks` through a pipe: under a lock's row, its top stack,
/// folded, is the fixture's whole chain (built without frame pointers)
/// from the thread's function to the lock call.
#[test]
fn top_shows_each_locks_top_stack() {
    let binary = fixture_with(
        "sites",
        Flavor::Glibc,
        &["-fomit-frame-pointer", "-fno-optimize-sibling-calls"],
    );
    let mut fixture = Fixture::spawn(&binary, &["1", "2000000"]);
    let pid = fixture.pid().to_string();
    let (mut top, _) = start_live(&["top", "--pid", &pid, "--stacks"], Stdio::piped());
    fixture.start();
    let mut stdout = BufReader::new(top.0.stdout.take().unwrap());
    let chain = "worker;serve_request;level1;level2;level3;level4;level5;level6;level7;level8;level9;level10;take;pthread_mutex_lock";
    let line = wait_for_top_line(&mut stdout, |line| line.starts_with("    stack "));
    let line = if line.contains(chain) {
        line
    } else {
        // The first naming may come before the first snapshots are unwound.
        wait_for_top_line(&mut stdout, |line| line.contains(chain))
    };
    assert!(line.trim_end().ends_with(chain), "{line}");
    unsafe { libc::kill(top.0.id() as i32, libc::SIGINT) };
    assert!(top.0.wait().unwrap().success());
}

fn tmux(socket: &Path, args: &[&str]) -> String {
    let output = Command::new("tmux")
        .arg("-S")
        .arg(socket)
        .args(args)
        .output()
        .expect("running tmux (scripts/setup.sh installs it)");
    assert!(
        output.status.success(),
        "tmux {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The tmux server of one test, on its own socket; killed when dropped.
struct TmuxServer<'a>(&'a Path);

impl Drop for TmuxServer<'_> {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(self.0)
            .arg("kill-server")
            .status();
    }
}

/// Polls the pane until `wanted` holds for its text.
fn wait_for_pane(socket: &Path, wanted: impl Fn(&str) -> bool, what: &str) -> String {
    let started = Instant::now();
    loop {
        let pane = tmux(socket, &["capture-pane", "-p", "-t", "top"]);
        if wanted(&pane) {
            return pane;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{what}; the pane shows:\n{pane}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `top` in an 80x24 tmux pane: the g_lock row with its caller, `s` changes
/// the sort key, `q` quits and gives the terminal back.
#[test]
fn top_full_screen_in_tmux_sorts_and_quits() {
    let binary = fixture("steady", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["40", "30000"]);
    fixture.start();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tmux.sock");
    let status_file = dir.path().join("status");
    let command = format!(
        "{} top --pid {}; echo exit=$? > {}; sleep 30",
        env!("CARGO_BIN_EXE_locktrace"),
        fixture.pid(),
        status_file.display()
    );
    new_80x24_session(&socket, &command);
    let _server = TmuxServer(&socket);

    let pane = wait_for_pane(
        &socket,
        |pane| {
            pane.lines()
                .any(|l| l.starts_with("g_lock") && l.contains("tick"))
        },
        "no g_lock row with caller tick",
    );
    assert!(pane.contains("sorted by acq/s"), "{pane}");
    for line in pane.lines() {
        assert!(line.chars().count() <= 80, "line wider than 80: {line:?}");
    }
    tmux(&socket, &["send-keys", "-t", "top", "s"]);
    wait_for_pane(
        &socket,
        |pane| pane.contains("sorted by contended/s"),
        "s did not change the sort key",
    );
    tmux(&socket, &["send-keys", "-t", "top", "q"]);
    assert_eq!(wait_for_status(&status_file, "q did not quit"), "exit=0");
    // Back on the normal screen: the table is gone.
    let pane = tmux(&socket, &["capture-pane", "-p", "-t", "top"]);
    assert!(
        !pane.contains("sorted by"),
        "terminal not restored:\n{pane}"
    );
}

/// `record` on a terminal (a tmux pane) shows a live line: elapsed, probe
/// hits and requests so far; through a pipe it shows nothing of the kind.
#[test]
fn record_shows_a_progress_line_on_a_terminal_only() {
    let binary = fixture("steady", Flavor::Glibc);
    // Works 60 s (killed when dropped): alive past the attach however slow;
    // 8 s ended before it on a machine loaded by two CPU hogs.
    let mut fixture = Fixture::spawn(&binary, &["40", "60000"]);
    fixture.start();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tmux.sock");
    let command = format!(
        "{} record --pid {} --duration 4 --request-probe steady:tick; sleep 30",
        env!("CARGO_BIN_EXE_locktrace"),
        fixture.pid()
    );
    tmux(
        &socket,
        &[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "100",
            "-y",
            "24",
            &command,
        ],
    );
    let _server = TmuxServer(&socket);
    let pane = wait_for_pane(
        &socket,
        |pane| pane.contains("probe hits") && pane.contains("(probe)"),
        "no progress line",
    );
    let line = pane.lines().find(|l| l.contains("probe hits")).unwrap();
    assert!(line.contains("requests "), "{line}");

    // Alive well past the attach, however slow (killed when dropped).
    let mut fixture = Fixture::spawn(&binary, &["40", "60000"]);
    fixture.start();
    let output = locktrace()
        .args([
            "record",
            "--pid",
            &fixture.pid().to_string(),
            "--duration",
            "1",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("probe hits"), "{stderr}");
}

/// A lock quiet for --expire-after loses its series and leaves the BPF
/// maps (bounded memory), while the cost figures keep what it cost.
/// fixtures/steady.c: 40 calls a millisecond for 1 s (40,000), then idle.
#[test]
fn serve_ages_out_quiet_locks_and_keeps_their_cost() {
    let binary = fixture("steady", Flavor::Glibc);
    // Lingers 60 s after its work (killed when dropped): the expiry is seen
    // however slow the machine.
    let mut fixture = Fixture::spawn(&binary, &["40", "1000", "60"]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let pid = fixture.pid().to_string();
    let (_serve, _) = start_live(
        &[
            "serve",
            "--pid",
            &pid,
            "--listen",
            &listen,
            "--expire-after",
            "2",
        ],
        Stdio::null(),
    );
    fixture.start();
    assert_eq!(fixture.read_line().as_deref(), Some("done 40000"));
    let done = Instant::now();
    // The interval after the last call has them all; the lock is still tracked.
    let metrics = wait_for_sample(
        port,
        "locktrace_lock_acquisitions_total",
        r#"lock="g_lock""#,
        |n| n == Some(40_000.0),
    );
    assert_eq!(
        sample(&metrics, "locktrace_tracked_locks", ""),
        Some(1.0),
        "{metrics}"
    );
    // Then, quiet for 2 s, it leaves the maps and loses its series (the
    // series may go an interval after the map entry: their clocks differ).
    let metrics = wait_for_metrics(port, "g_lock's expiry", |metrics| {
        sample(metrics, "locktrace_tracked_locks", "") == Some(0.0)
            && sample(
                metrics,
                "locktrace_lock_acquisitions_total",
                r#"lock="g_lock""#,
            )
            .is_none()
    });
    assert!(
        done.elapsed() >= Duration::from_millis(1900),
        "expired {:?} after its last call, before --expire-after 2",
        done.elapsed()
    );
    assert_eq!(
        sample(&metrics, "locktrace_probe_hits", ""),
        Some(40_000.0),
        "{metrics}"
    );
}

/// (The live views' other bad input needs no root: tests/cli.rs.)
#[test]
fn live_views_refuse_a_missing_pid_in_one_line() {
    fails_with(locktrace().args(["top", "--pid", "999999999"]), "999999999");
}

/// When the target exits under the full-screen `top`, the terminal comes
/// back, one line says so, and the exit status is 1.
#[test]
fn top_says_so_in_one_line_when_the_target_exits() {
    let binary = fixture("steady", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["40", "2500"]);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tmux.sock");
    let status_file = dir.path().join("status");
    let command = format!(
        "{} top --pid {} 2> {}; echo exit=$? > {}; sleep 30",
        env!("CARGO_BIN_EXE_locktrace"),
        fixture.pid(),
        dir.path().join("stderr").display(),
        status_file.display()
    );
    new_80x24_session(&socket, &command);
    let _server = TmuxServer(&socket);
    wait_for_pane(
        &socket,
        |pane| pane.contains("sorted by"),
        "top did not start",
    );
    let pid = fixture.pid();
    fixture.start();
    fixture.wait();
    assert_eq!(wait_for_status(&status_file, "top did not stop"), "exit=1");
    let stderr = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.contains(&format!("pid {pid} exited")), "{stderr}");
    let pane = tmux(&socket, &["capture-pane", "-p", "-t", "top"]);
    assert!(
        !pane.contains("sorted by"),
        "terminal not restored:\n{pane}"
    );
}

/// fixtures/manylocks.c takes 140,000 distinct mutexes once each: a call is
/// counted under its caller (65,536 pairs), else in the lock map (65,536
/// more), so 8,928 are lost and 74,464 lose their caller. serve exports
/// them as lost, and top says so, exactly (the fixture lingers after `done`
/// so both can be read).
#[test]
fn serve_and_top_say_what_was_lost() {
    const LOST: f64 = 140_000.0 - 2.0 * 65_536.0;
    const CALLERS_LOST: f64 = 140_000.0 - 65_536.0;
    let binary = fixture("manylocks", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["140000", "60"]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let pid = fixture.pid().to_string();
    let (_serve, _) = start_live(
        &["serve", "--pid", &pid, "--listen", &listen],
        Stdio::null(),
    );
    let (mut top, _) = start_live(&["top", "--pid", &pid], Stdio::piped());
    let metrics = http_get(port, "/metrics");
    assert_eq!(
        sample(
            &metrics,
            "locktrace_lost_total",
            r#"reason="locks_map_full""#
        ),
        Some(0.0),
        "every reason has a series from the start:\n{metrics}"
    );
    fixture.start();
    assert_eq!(fixture.read_line().as_deref(), Some("done"));
    let metrics = wait_for_sample(
        port,
        "locktrace_lost_total",
        r#"reason="locks_map_full""#,
        |value| value == Some(LOST),
    );
    promtool_check(&metrics);
    assert_eq!(
        sample(
            &metrics,
            "locktrace_lost_total",
            r#"reason="callers_map_full""#
        ),
        Some(CALLERS_LOST),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "locktrace_lost_total",
            r#"reason="futex_map_full""#
        ),
        Some(0.0),
        "{metrics}"
    );
    let mut stdout = BufReader::new(top.0.stdout.take().unwrap());
    let line = wait_for_top_line(&mut stdout, |line| {
        line.starts_with("lost since attach: ") && line.contains("locks_map_full")
    });
    assert_eq!(
        line.trim(),
        "lost since attach: callers_map_full 74464, locks_map_full 8928 (figures above incomplete)"
    );
}

/// fixtures/threadpool.c: 4 idle workers time out on the pool's condition
/// variable every 60 ms. Those waits are waiting for work: serve exports
/// them as `wait_class="condvar"`, never as the pool's lock contention, and
/// top lists them under "not contention", not as a lock row.
#[test]
fn serve_and_top_do_not_count_condvar_waits_as_contention() {
    let binary = fixture("threadpool", Flavor::Glibc);
    let mut pool = Fixture::spawn(&binary, &["4", "6000", "60"]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let pid = pool.pid().to_string();
    let (_serve, _) = start_live(
        &["serve", "--pid", &pid, "--listen", &listen],
        Stdio::null(),
    );
    let (mut top, _) = start_live(&["top", "--pid", &pid], Stdio::piped());
    pool.start();
    let metrics = wait_for_sample(
        port,
        "locktrace_futex_waits_total",
        r#"wait_class="condvar""#,
        |waits| waits.is_some_and(|n| n >= 20.0),
    );
    promtool_check(&metrics);
    assert!(
        !metrics
            .lines()
            .any(|line| line.contains(r#"kind="condvar""#)),
        "a condvar counted as a lock:\n{metrics}"
    );
    let mut stdout = BufReader::new(top.0.stdout.take().unwrap());
    let mut lock_rows = Vec::new();
    let note = wait_for_top_line(&mut stdout, |line| {
        if line.starts_with("g_pool.") {
            lock_rows.push(line.to_string());
        }
        line.starts_with("not contention: condvar ")
    });
    assert!(note.contains("waits/s"), "{note}");
    // The table shows only the pool's mutex, if it was contended at all.
    assert!(
        lock_rows.iter().all(|row| row.starts_with("g_pool.lock ")),
        "{lock_rows:?}"
    );
    let (timeouts, _busy) = {
        let line = pool.read_line().unwrap_or_default();
        let mut fields = line.split_whitespace().skip(1).step_by(2);
        let mut next = || fields.next().and_then(|n| n.parse::<u64>().ok());
        (next(), next())
    };
    assert!(timeouts.is_some_and(|n| n >= 200), "{timeouts:?}");
}

/// A Rust `std::sync::Mutex` takes no pthread lock: only its futex word is
/// seen, and its DWARF type (`Mutex<u64>`) makes its waits lock
/// contention. serve counts them as a lock under its name, as `record`
/// does (the live views kept them as futex waits of class `other`).
#[test]
fn serve_counts_a_rust_mutex_by_its_declared_type() {
    let mut target = Fixture::spawn(&rust_mutex_fixture(), &["4", "200000000"]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let pid = target.pid().to_string();
    let (_serve, _) = start_live(
        &["serve", "--pid", &pid, "--listen", &listen],
        Stdio::null(),
    );
    target.start();
    let metrics = wait_for_sample(
        port,
        "locktrace_lock_contended_total",
        r#"lock="rust_mutex::COUNTER""#,
        |contended| contended.is_some_and(|n| n >= 1.0),
    );
    promtool_check(&metrics);
    let series = metrics
        .lines()
        .find(|line| line.contains(r#"lock="rust_mutex::COUNTER""#))
        .unwrap_or_default();
    assert!(series.contains(r#"kind="futex""#), "{series}");
}

/// fixtures/stuck.c deadlocks threads ab and ba (g_a, g_b) before attach:
/// top names the cycle and the longest wait; serve counts 2 deadlocked threads.
#[test]
fn top_and_serve_show_a_deadlock_and_the_longest_wait() {
    let fixture = Fixture::spawn(&fixture("stuck", Flavor::Glibc), &["deadlock-before"]);
    let tid = |name: &str| {
        fixture
            .lines
            .iter()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .unwrap()
            .to_string()
    };
    let (ab, ba) = (tid("ab"), tid("ba"));
    let pid = fixture.pid().to_string();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (_serve, _) = start_live(
        &["serve", "--pid", &pid, "--listen", &listen],
        Stdio::null(),
    );
    let (mut top, _) = start_live(&["top", "--pid", &pid], Stdio::piped());
    let mut stdout = BufReader::new(top.0.stdout.take().unwrap());
    let line = wait_for_top_line(&mut stdout, |line| line.starts_with("deadlock: "));
    assert_eq!(
        line.trim(),
        format!(
            "deadlock: 2 threads can never go on: ab ({ab}) waits for g_b held by ba ({ba}); ba ({ba}) waits for g_a held by ab ({ab})"
        )
    );
    let line = wait_for_top_line(&mut stdout, |line| {
        line.starts_with("longest lock wait now: ")
    });
    assert!(
        line.contains(" waits for g_") && line.contains(" (1 more lock waits over 1 s)"),
        "{line}"
    );
    let metrics = wait_for_sample(port, "locktrace_deadlocked_threads", "", |n| n == Some(2.0));
    promtool_check(&metrics);
    let longest = sample(&metrics, "locktrace_longest_lock_wait_seconds", "").unwrap();
    assert!(longest >= 1.0, "{metrics}");
}

/// 300 idle connections (more than serve's open-file budget) neither make
/// serve say the target exited nor block scrapes for long: idle clients
/// are closed within seconds, and a scrape gets through.
#[test]
fn idle_clients_do_not_end_or_block_serve() {
    let binary = fixture("steady", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["1", "60000"]);
    fixture.start();
    let port = free_port();
    let (mut serve, stderr) = start_live(
        &[
            "serve",
            "--pid",
            &fixture.pid().to_string(),
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--mode",
            "contention",
        ],
        Stdio::null(),
    );
    let idle: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    assert!(idle.len() >= 64, "only {} connections", idle.len());
    // Idle clients are closed by serve within its header timeout (3 s).
    let mut first = &idle[0];
    first
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let started = Instant::now();
    let mut byte = [0u8; 1];
    assert!(matches!(first.read(&mut byte), Ok(0) | Err(_)));
    assert!(started.elapsed() < Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(20);
    let metrics = loop {
        if let Some(body) = try_http_get(port, "/metrics") {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "no scrape got through: {stderr:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(metrics.contains("locktrace_probe_hits"), "{metrics}");
    drop(idle);
    assert!(
        serve.0.try_wait().unwrap().is_none(),
        "serve exited: {stderr:?}"
    );
    let said = stderr.lock().unwrap().join("\n");
    assert!(!said.contains("exited"), "{said}");
}

/// `serve` follows a main thread that leaves with `pthread_exit` (issue
/// 35 item 5, as `record` does): the probes move to a live thread and the
/// calls of the threads it left behind are counted, exactly.
#[test]
fn serve_counts_after_the_main_thread_exits() {
    const N: u64 = 50_000;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let binary = fixture("leader_exit", Flavor::Glibc);
    let args = [N.to_string(), gate.display().to_string(), "60".to_string()];
    let mut target = Fixture::spawn(&binary, &[&args[0], &args[1], &args[2]]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let pid = target.pid().to_string();
    let (_serve, stderr) = start_live(
        &["serve", "--pid", &pid, "--listen", &listen],
        Stdio::null(),
    );
    target.start();
    let started = Instant::now();
    while !stderr
        .lock()
        .unwrap()
        .iter()
        .any(|line| line.contains("the probes now count from thread"))
    {
        assert!(
            started.elapsed() < DEADLINE,
            "the probes never moved: {stderr:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(&gate, "").unwrap();
    wait_for_sample(
        port,
        "locktrace_lock_acquisitions_total",
        r#"lock="counted""#,
        |n| n == Some((3 * N) as f64),
    );
}
