//! A hostile but fair user (issue 13): closed or full stdout, bad ports and
//! numbers, stop signals in every phase, an unwritable --json, exec and
//! fork in the target, a process root may not trace, a capable non-root
//! user; a module whose call-frame information loops (issue 52 J). Real
//! BPF as root, real processes.

use std::{
    net::TcpListener,
    os::fd::{FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use crate::common::{
    Fixture, Flavor, acquisitions, assert_one_line_error, fixture, frame_functions, is_cpu_stack,
    locktrace,
};
use serde_json::Value;

/// How long a stopped recording may take to write its report: naming in a
/// debug build on a loaded machine takes seconds; a stop that is not
/// honoured runs on for minutes (the duration given is 600 s, or none).
const STOPPED_WITHIN: Duration = Duration::from_secs(20);

fn steady() -> PathBuf {
    fixture("steady", Flavor::Glibc)
}

/// Waits for `child` at most `limit`; kills it (by its pid) and fails if it takes longer.
fn wait_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let started = Instant::now();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return child.wait_with_output().unwrap();
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "{what}: still running after {limit:?}; stderr: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (30 s at most) until `reached` says the phase under test was reached.
fn wait_until(what: &str, mut reached: impl FnMut() -> bool) {
    let started = Instant::now();
    while !reached() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never reached: {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A `u64` of the target's memory (through /proc/PID/mem).
fn read_u64(pid: u32, address: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let memory = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut bytes = [0u8; 8];
    memory.read_exact_at(&mut bytes, address).unwrap();
    u64::from_ne_bytes(bytes)
}

/// Bytes a process has written so far (sockets included), from /proc/PID/io.
fn bytes_written(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("wchar: ")?.parse().ok())
        .unwrap()
}

/// Sockets of the machine in SYN_SENT to `port` on 127.0.0.1 (/proc/net/tcp).
fn connects_in_flight(port: u16) -> usize {
    let remote = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(2) == Some(&remote.as_str()) && fields.get(3) == Some(&"02")
        })
        .count()
}

fn wait_for_file(path: &Path, limit: Duration) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < limit,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, signal: i32) {
    // Only the locktrace this test started, by its pid.
    unsafe { libc::kill(child.id() as i32, signal) };
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("JSON report written"))
        .expect("JSON report parses")
}

/// A pipe whose reader is already closed (`| head` that has exited).
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    unsafe { libc::close(fds[0]) };
    Stdio::from(unsafe { OwnedFd::from_raw_fd(fds[1]) })
}

fn dev_full() -> Stdio {
    Stdio::from(
        std::fs::File::options()
            .write(true)
            .open("/dev/full")
            .unwrap(),
    )
}

/// `locktrace record` on a steady fixture (started once the probes are live),
/// with stdout as given; returns its output and the JSON path.
fn record_steady(stdout: Stdio, dir: &Path) -> (Output, PathBuf) {
    let json = dir.join("r.json");
    let ready = dir.join("ready");
    let mut target = Fixture::spawn(&steady(), &["20", "200"]);
    let tracer = locktrace()
        .args(["record", "--pid", &target.pid().to_string(), "--json"])
        .arg(&json)
        .arg("--ready-file")
        .arg(&ready)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&ready, Duration::from_secs(30));
    target.start();
    target.wait();
    (wait_within(tracer, Duration::from_secs(20), "record"), json)
}

#[test]
fn a_closed_or_full_stdout_keeps_the_json_and_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    // `record --json F | head` with head gone: a normal end.
    let (output, json) = record_steady(closed_pipe(), dir.path());
    assert!(output.status.success(), "{}", stderr_of(&output));
    let report = read_json(&json);
    assert_eq!(report["stopped_by"], "target_exited");
    // `> /dev/full`: the JSON is still written, the error is one line.
    std::fs::remove_file(&json).unwrap();
    std::fs::remove_file(dir.path().join("ready")).unwrap();
    let (output, json) = record_steady(dev_full(), dir.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr_of(&output));
    let stderr = stderr_of(&output);
    assert!(
        stderr
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("locktrace: cannot write to stdout: ")),
        "{stderr}"
    );
    assert_eq!(read_json(&json)["stopped_by"], "target_exited");
    // `report` and `compare` the same way.
    let mut with_requests = read_json(&json);
    with_requests["requests"] = serde_json::json!({"source": "given", "count": 10});
    let saved = dir.path().join("given.json");
    std::fs::write(&saved, with_requests.to_string()).unwrap();
    let commands: [Vec<&Path>; 2] = [vec![&json], vec![&saved, &saved]];
    for files in commands {
        let subcommand = if files.len() == 1 {
            "report"
        } else {
            "compare"
        };
        for (stdout, ok) in [(closed_pipe(), true), (dev_full(), false)] {
            let output = locktrace()
                .arg(subcommand)
                .args(&files)
                .stdout(stdout)
                .output()
                .unwrap();
            if ok {
                assert!(
                    output.status.success(),
                    "{subcommand}: {}",
                    stderr_of(&output)
                );
            } else {
                assert_one_line_error(&output, "cannot write to stdout");
            }
        }
    }
}

/// Starts `record` with a ready file; returns it once the probes are live.
fn start_record(pid: u32, dir: &Path, extra: &[&str]) -> Child {
    let ready = dir.join("ready");
    let child = locktrace()
        .args(["record", "--pid", &pid.to_string(), "--json"])
        .arg(dir.join("r.json"))
        .arg("--ready-file")
        .arg(&ready)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&ready, Duration::from_secs(30));
    child
}

#[test]
fn sighup_stops_a_recording_with_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut target = Fixture::spawn(&steady(), &["1", "100000"]);
    let tracer = start_record(target.pid(), dir.path(), &[]);
    target.start();
    // Tracing (the ready file) and the target taking its lock under the probes.
    let counter = target.address("counter");
    wait_until("steady's first lock calls", || {
        read_u64(target.pid(), counter) > 0
    });
    signal(&tracer, libc::SIGHUP);
    let output = wait_within(tracer, STOPPED_WITHIN, "record after SIGHUP");
    assert!(output.status.success(), "{}", stderr_of(&output));
    let report = read_json(&dir.path().join("r.json"));
    assert_eq!(report["stopped_by"], "interrupted");
    assert!(report["duration_s"].as_f64().unwrap() > 0.0, "{report}");
    assert!(acquisitions(&report, target.address("global")) > 0);
}

/// Updates of the stats lock per request in the httpd fixture (`K`).
const K: u64 = 8;

#[test]
fn sigterm_stops_a_long_load_and_keeps_exact_counts() {
    let dir = tempfile::tempdir().unwrap();
    let server = Fixture::spawn(&fixture("httpd", Flavor::Glibc), &["0", "mutex", "8", "4"]);
    let port: u16 = server
        .lines
        .iter()
        .find_map(|line| line.strip_prefix("port ")?.parse().ok())
        .expect("fixture printed its port");
    let url = format!("http://127.0.0.1:{port}/");
    let tracer = start_record(
        server.pid(),
        dir.path(),
        &["--load", &url, "--duration", "600"],
    );
    // The load is on once the server writes responses after the probes are live.
    let before = bytes_written(server.pid());
    wait_until("the server answering the load", || {
        bytes_written(server.pid()) > before
    });
    signal(&tracer, libc::SIGTERM);
    let output = wait_within(tracer, STOPPED_WITHIN, "record --load after SIGTERM");
    assert!(output.status.success(), "{}", stderr_of(&output));
    let report = read_json(&dir.path().join("r.json"));
    assert_eq!(report["stopped_by"], "interrupted");
    assert!(report["duration_s"].as_f64().unwrap() > 0.0, "{report}");
    let requests = report["requests"]["count"].as_u64().unwrap();
    assert!(requests > 0);
    assert_eq!(
        acquisitions(&report, server.address("stats_lock")),
        K * requests,
        "every counted request's stats updates, no more"
    );
}

/// The target's exit ends `--load` at once (it used to send the rest of
/// the load into refused connections for the whole duration).
#[test]
fn the_targets_exit_ends_the_load() {
    let dir = tempfile::tempdir().unwrap();
    let server = Fixture::spawn(&fixture("httpd", Flavor::Glibc), &["0", "mutex", "8", "4"]);
    let url = format!("http://127.0.0.1:{}/", server.port());
    let tracer = start_record(
        server.pid(),
        dir.path(),
        &["--load", &url, "--duration", "600", "--allow-errors"],
    );
    // Whenever it exits after the probes are live (during the load, or
    // before it started), the recording ends at once. The server this test
    // started, by its pid.
    unsafe { libc::kill(server.pid() as i32, libc::SIGKILL) };
    let output = wait_within(
        tracer,
        Duration::from_secs(60),
        "record --load after the target exited",
    );
    let report = read_json(&dir.path().join("r.json"));
    assert_eq!(
        report["stopped_by"],
        "target_exited",
        "{}",
        stderr_of(&output)
    );
    // Not the 600 s asked for: the recording ended with the target (a
    // loaded machine may take seconds to notice and write the report).
    let duration = report["duration_s"].as_f64().unwrap();
    assert!(duration < 15.0, "{duration} s");
}

/// A server that accepts connections, reads what comes and never answers;
/// the receiver gets a message per connection whose request has arrived.
fn silent_server() -> (u16, std::sync::mpsc::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (requested, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let requested = requested.clone();
            std::thread::spawn(move || {
                let mut request = [0u8; 4];
                if std::io::Read::read_exact(&mut stream, &mut request).is_ok()
                    && &request == b"GET "
                {
                    let _ = requested.send(());
                }
                // Held open, unanswered, until the client goes.
                let _ = std::io::Read::read_to_end(&mut stream, &mut Vec::new());
            });
        }
    });
    (port, seen)
}

/// `record --load` that is stopped by `signal_number` before tracing starts:
/// a report anyway, within seconds.
fn stopped_before_tracing(url: &str, extra: &[&str], settle: impl FnOnce(), signal_number: i32) {
    let dir = tempfile::tempdir().unwrap();
    let target = Fixture::spawn(&steady(), &["1", "1"]);
    let json = dir.path().join("r.json");
    let tracer = locktrace()
        .args([
            "record",
            "--pid",
            &target.pid().to_string(),
            "--load",
            url,
            "--json",
        ])
        .arg(&json)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    settle();
    signal(&tracer, signal_number);
    let output = wait_within(tracer, STOPPED_WITHIN, "record stopped before tracing");
    assert!(output.status.success(), "{}", stderr_of(&output));
    let report = read_json(&json);
    assert_eq!(report["stopped_by"], "interrupted");
    assert_eq!(report["duration_s"], 0.0);
    assert!(
        stderr_of(&output).contains("stopped by a signal before tracing started"),
        "{}",
        stderr_of(&output)
    );
}

#[test]
fn sigint_stops_the_warmup() {
    let (port, accepted) = silent_server();
    let url = format!("http://127.0.0.1:{port}/");
    stopped_before_tracing(
        &url,
        &["--warmup", "1000", "-n", "10", "-c", "2"],
        || {
            // The warmup's first requests arrived (the connects are done):
            // in flight and unanswered.
            for _ in 0..2 {
                accepted.recv_timeout(Duration::from_secs(20)).unwrap();
            }
        },
        libc::SIGINT,
    );
}

#[test]
fn sigterm_stops_connects_to_a_full_backlog() {
    // Listening with a backlog of 0 and never accepting: the kernel drops
    // further SYNs, and connects retry for minutes.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    assert!(fd >= 0);
    let _socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut address: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    address.sin_family = libc::AF_INET as u16;
    address.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
    let size = std::mem::size_of::<libc::sockaddr_in>() as u32;
    assert_eq!(
        unsafe { libc::bind(fd, &address as *const _ as *const libc::sockaddr, size) },
        0
    );
    assert_eq!(unsafe { libc::listen(fd, 0) }, 0);
    let mut bound: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut length = size;
    unsafe { libc::getsockname(fd, &mut bound as *mut _ as *mut libc::sockaddr, &mut length) };
    let url = format!("http://127.0.0.1:{}/", u16::from_be(bound.sin_port));
    stopped_before_tracing(
        &url,
        &["-c", "200", "-n", "10"],
        || {
            let port = u16::from_be(bound.sin_port);
            wait_until("connects waiting on the full backlog", || {
                connects_in_flight(port) > 0
            });
        },
        libc::SIGTERM,
    );
}

fn lifecycle(flavor: Flavor) -> PathBuf {
    fixture("lifecycle", flavor)
}

/// Records the lifecycle fixture (dynamic glibc) with `args` from start to
/// exit; returns the JSON report, the table and g_lock's address.
fn record_lifecycle(args: &[&str]) -> (Value, String, u64) {
    let mut target = Fixture::spawn(&lifecycle(Flavor::Glibc), args);
    let dir = tempfile::tempdir().unwrap();
    let tracer = start_record(target.pid(), dir.path(), &[]);
    target.start();
    let global = target.address("global");
    target.wait();
    let output = wait_within(
        tracer,
        Duration::from_secs(20),
        "record of the lifecycle fixture",
    );
    assert!(output.status.success(), "{}", stderr_of(&output));
    let table = crate::common::unwrapped(&String::from_utf8_lossy(&output.stdout));
    (read_json(&dir.path().join("r.json")), table, global)
}

#[test]
fn an_exec_into_a_static_binary_is_reported_not_hidden() {
    let static_binary = lifecycle(Flavor::GlibcStatic);
    let static_path = static_binary.to_str().unwrap();
    let (report, table, global) = record_lifecycle(&["exec", "100000", static_path, "200000"]);
    // Before the exec: exact. After it: said to be missing, not silently.
    assert_eq!(acquisitions(&report, global), 100_000);
    let exec = &report["coverage"]["exec"];
    assert_eq!(exec["not_counted"], "all_lock_calls", "{report:#}");
    assert!(!table.contains("whole traced life"), "{table}");
    assert!(!table.contains("lost: nothing"), "{table}");
    assert!(
        table.contains("lost: the target ran exec (")
            && table.contains("every lock call of the new program"),
        "{table}"
    );
}

#[test]
fn forked_children_are_said_not_followed() {
    let (report, table, global) = record_lifecycle(&["fork", "1000", "2000"]);
    assert_eq!(acquisitions(&report, global), 1000, "the parent's only");
    assert_eq!(report["coverage"]["children_followed"], false);
    assert_eq!(report["coverage"]["children_forked"], 1);
    assert!(
        table.contains("children: 1 processes forked by the target were not followed"),
        "{table}"
    );
}

#[test]
fn root_refused_by_the_ptrace_check_is_told_so() {
    // As pid 1 does here: the target holds a capability this locktrace lacks.
    let target = Fixture::spawn(&steady(), &["1", "1"]);
    let output = Command::new("setpriv")
        .args(["--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace", "--"])
        .arg(env!("CARGO_BIN_EXE_locktrace"))
        .args(["record", "--pid", &target.pid().to_string()])
        .output()
        .unwrap();
    assert_one_line_error(&output, "even as root");
    let stderr = stderr_of(&output);
    assert!(stderr.contains("ptrace access check"), "{stderr}");
    assert!(!stderr.contains("not root?"), "{stderr}");
}

#[test]
fn a_capable_user_is_told_tracefs_is_closed_not_missing() {
    // tracefs is mounted mode 0700 (its default); a non-root user with
    // CAP_BPF and CAP_PERFMON traces its own process.
    let mode = std::fs::metadata("/sys/kernel/tracing")
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .unwrap();
    assert_eq!(
        mode, 0o700,
        "this test needs tracefs at its default mode 0700"
    );
    let user = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    let caps = ["--inh-caps=+bpf,+perfmon", "--ambient-caps=+bpf,+perfmon"];
    let target = Fixture::spawn_command(
        Command::new("setpriv")
            .args(user)
            .arg("--")
            .arg(steady())
            .args(["1", "1"]),
    );
    let output = Command::new("setpriv")
        .args(user)
        .args(caps)
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_locktrace"))
        .args(["record", "--pid", &target.pid().to_string()])
        .output()
        .unwrap();
    assert_one_line_error(
        &output,
        "tracefs is mounted at /sys/kernel/tracing but this user cannot read it (mode 700",
    );
    assert!(!stderr_of(&output).contains("not mounted"));
}

/// The `--duration` of the recording through the looping rule.
const RECORDED_FOR: Duration = Duration::from_secs(3);

/// Lock calls `fixtures/loop_cfi.c` makes from inside `poisoned`, whose CFA
/// rule is a DWARF expression that loops (`DW_OP_skip -3`).
const POISONED_CALLS: u64 = 1000;

/// Starts `loop_cfi` (`flavor`) under `record --stacks 10 EXTRA`, has it
/// take its mutex [`POISONED_CALLS`] times from inside `poisoned`, and
/// returns once it has: every lock call's stack must be unwound through
/// the looping rule.
fn record_through_a_looping_rule(flavor: Flavor, dir: &Path, extra: &[&str]) -> (Fixture, Child) {
    let mut target = Fixture::spawn(&fixture("loop_cfi", flavor), &[&POISONED_CALLS.to_string()]);
    let args = [&["--stacks", "10"][..], extra].concat();
    let tracer = start_record(target.pid(), dir, &args);
    // stdin stays open: the fixture lives until the recording ends.
    target.send("go");
    let done = target.read_line();
    assert_eq!(done, Some(format!("done {POISONED_CALLS}")));
    (target, tracer)
}

/// The report of a recording through the looping rule: the fixture's mutex
/// counted exactly, and every stack of it stops at `poisoned` with the
/// typed reason (its lock calls' stacks adding up to the exact count).
fn assert_stacks_end_at_the_looping_rule(report: &Value, lock: u64, what: &str) {
    assert_eq!(acquisitions(report, lock), POISONED_CALLS, "{what}");
    let lock = format!("{lock:#x}");
    let stacks: Vec<&Value> = report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|stack| stack["lock"] == lock.as_str())
        .collect();
    assert!(!stacks.is_empty(), "{what}: no stacks of the mutex");
    for stack in &stacks {
        let frames = frame_functions(stack);
        assert_eq!(
            frames.last().map(String::as_str),
            Some("poisoned"),
            "{what}: {frames:?}"
        );
        assert_eq!(stack["ended_by"], "expression_budget", "{what}: {stack}");
    }
    let calls: u64 = stacks
        .iter()
        .filter(|stack| !is_cpu_stack(stack))
        .map(|stack| {
            assert_eq!(
                frame_functions(stack),
                ["pthread_mutex_lock", "poisoned"],
                "{what}"
            );
            stack["count"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(calls, POISONED_CALLS, "{what}");
}

/// Issue 52 J: a looping expression in a module's `.eh_frame` hung the
/// unwinder (675 s at 100% CPU, no report). Now each stack through it ends
/// there, with its reason, and `--duration 3` ends on time with the report.
#[test]
fn a_looping_call_frame_rule_ends_its_stacks_not_the_recording() {
    for flavor in [Flavor::Glibc, Flavor::MuslStatic] {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let duration = RECORDED_FOR.as_secs().to_string();
        let (target, tracer) =
            record_through_a_looping_rule(flavor, dir.path(), &["--duration", &duration]);
        // The duration, then the usual stop (detaching the probes alone
        // takes seconds on this kernel); without the bound it never ends.
        let output = wait_within(
            tracer,
            RECORDED_FOR + STOPPED_WITHIN,
            "record --duration 3 through a looping rule",
        );
        let took = started.elapsed();
        assert!(
            output.status.success(),
            "{flavor:?}: {}",
            stderr_of(&output)
        );
        eprintln!("{flavor:?}: record --duration 3 took {took:?}");
        let report = read_json(&dir.path().join("r.json"));
        assert_eq!(report["stopped_by"], "duration", "{flavor:?}");
        assert_stacks_end_at_the_looping_rule(
            &report,
            target.address("lock"),
            &format!("{flavor:?}"),
        );
    }
}

/// SIGTERM during a recording through the looping rule ends it promptly,
/// with its report.
#[test]
fn sigterm_ends_a_recording_through_a_looping_call_frame_rule() {
    let dir = tempfile::tempdir().unwrap();
    let (target, tracer) = record_through_a_looping_rule(Flavor::Glibc, dir.path(), &[]);
    let signalled = Instant::now();
    signal(&tracer, libc::SIGTERM);
    let output = wait_within(
        tracer,
        STOPPED_WITHIN,
        "record through a looping rule after SIGTERM",
    );
    eprintln!("stopped {:?} after SIGTERM", signalled.elapsed());
    assert!(output.status.success(), "{}", stderr_of(&output));
    let report = read_json(&dir.path().join("r.json"));
    assert_eq!(report["stopped_by"], "interrupted");
    assert_stacks_end_at_the_looping_rule(&report, target.address("lock"), "SIGTERM");
}
