//! Test harness: builds the C fixtures, starts them, attaches a real
//! `locktrace record` (real BPF, needs root) and reads its JSON report.
#![allow(dead_code)]

pub mod frankenphp;
pub mod live_views;
pub mod modphp;
pub mod php_pages;

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use locktrace::model::Report;
use serde_json::Value;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Builds `source` (a fixture's C file) with gcc and `-I` each of
/// `includes`, runs it, and returns what it printed (a header checker:
/// `fixtures/php/offsets.c`, `fixtures/python/gil_offsets.c`).
pub fn built_and_run(source: &Path, includes: &[PathBuf]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("built");
    let mut gcc = Command::new("gcc");
    for include in includes {
        gcc.arg("-I").arg(include);
    }
    let built = gcc
        .arg("-o")
        .arg(&binary)
        .arg(repo_root().join(source))
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let printed = Command::new(&binary).output().unwrap();
    assert!(
        printed.status.success(),
        "{}: {}",
        source.display(),
        printed.status
    );
    String::from_utf8(printed.stdout).unwrap()
}

pub fn locktrace() -> Command {
    Command::new(env!("CARGO_BIN_EXE_locktrace"))
}

/// How a C fixture is compiled and linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Glibc,
    GlibcStatic,
    Musl,
    MuslStatic,
}

impl Flavor {
    pub const ALL: [Flavor; 4] = [
        Flavor::Glibc,
        Flavor::GlibcStatic,
        Flavor::Musl,
        Flavor::MuslStatic,
    ];

    fn suffix(self) -> &'static str {
        match self {
            Flavor::Glibc => "glibc",
            Flavor::GlibcStatic => "glibc-static",
            Flavor::Musl => "musl",
            Flavor::MuslStatic => "musl-static",
        }
    }
}

static BUILD_LOCK: Mutex<()> = Mutex::new(());

/// `fixtures/rust_mutex.rs` (a Rust `std::sync::Mutex`, futex only), built
/// once per test run with DWARF and frame pointers.
pub fn rust_mutex_fixture() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out_dir = repo_root().join("target").join("fixtures");
            std::fs::create_dir_all(&out_dir).unwrap();
            let binary = out_dir.join("rust_mutex");
            let compiled = Command::new("rustc")
                .args(["-O", "-g", "-C", "force-frame-pointers=yes", "-o"])
                .arg(&binary)
                .arg(repo_root().join("fixtures/rust_mutex.rs"))
                .status()
                .unwrap();
            assert!(compiled.success(), "rustc fixtures/rust_mutex.rs");
            binary
        })
        .clone()
}

/// Compiles `fixtures/NAME.c` (once per flavor and source change) and returns the binary.
pub fn fixture(name: &str, flavor: Flavor) -> PathBuf {
    fixture_with(name, flavor, &[])
}

/// Like [`fixture`], with extra compiler flags (which become part of the binary's name).
pub fn fixture_with(name: &str, flavor: Flavor, extra_flags: &[&str]) -> PathBuf {
    let _guard = BUILD_LOCK
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    let source = repo_root().join("fixtures").join(format!("{name}.c"));
    let out_dir = repo_root().join("target").join("fixtures");
    std::fs::create_dir_all(&out_dir).unwrap();
    let tag: String = extra_flags
        .iter()
        .map(|flag| flag.replace(['-', '='], ""))
        .collect::<Vec<_>>()
        .join("_");
    let binary = out_dir.join(format!(
        "{name}-{}{}{}",
        flavor.suffix(),
        if tag.is_empty() { "" } else { "-" },
        tag
    ));
    // The source and the fixtures it includes (`#include "inproc.c"`).
    let included = std::fs::read_to_string(&source)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            line.strip_prefix("#include \"")?
                .strip_suffix('"')
                .map(str::to_string)
        })
        .map(|name| repo_root().join("fixtures").join(name))
        .collect::<Vec<_>>();
    let fresh = |path: &Path| {
        let built = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        std::iter::once(&source).chain(&included).all(|input| {
            let changed = std::fs::metadata(input).and_then(|m| m.modified()).ok();
            matches!((built, changed), (Some(b), Some(c)) if b >= c)
        })
    };
    if fresh(&binary) {
        return binary;
    }
    let compiler = match flavor {
        Flavor::Glibc | Flavor::GlibcStatic => "gcc",
        Flavor::Musl | Flavor::MuslStatic => "musl-gcc",
    };
    let mut command = Command::new(compiler);
    command
        .args(["-O2", "-g", "-pthread", "-o"])
        .arg(&binary)
        .arg(&source)
        .args(extra_flags);
    if matches!(flavor, Flavor::GlibcStatic | Flavor::MuslStatic) {
        command.arg("-static");
    }
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("running {compiler}: {e} (scripts/setup.sh installs it)"));
    assert!(
        output.status.success(),
        "compiling {name} ({flavor:?}) failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    binary
}

/// A running fixture: it printed `NAME 0xADDR` lines and `ready`, and waits
/// for a line on stdin before it works.
pub struct Fixture {
    pub child: Child,
    stdin: Option<ChildStdin>,
    /// Addresses the fixture printed, by name, in order.
    pub addresses: HashMap<String, Vec<u64>>,
    /// Other lines printed before `ready`.
    pub lines: Vec<String>,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Fixture {
    pub fn spawn(binary: &Path, args: &[&str]) -> Fixture {
        Self::spawn_command(Command::new(binary).args(args))
    }

    pub fn spawn_command(command: &mut Command) -> Fixture {
        let child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting fixture");
        Fixture::adopt(child)
    }

    /// A fixture started with piped stdin and stdout: reads its addresses
    /// up to its ready line.
    pub fn adopt(mut child: Child) -> Fixture {
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut addresses: HashMap<String, Vec<u64>> = HashMap::new();
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            if stdout.read_line(&mut line).unwrap() == 0 {
                panic!("fixture exited before printing ready; printed {lines:?}");
            }
            let line = line.trim().to_string();
            if line == "ready" {
                break;
            }
            match line.split_once(' ') {
                Some((name, value)) if value.starts_with("0x") => {
                    let address = u64::from_str_radix(&value[2..], 16).unwrap();
                    addresses.entry(name.to_string()).or_default().push(address);
                }
                _ => lines.push(line),
            }
        }
        Fixture {
            child,
            stdin,
            addresses,
            lines,
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn address(&self, name: &str) -> u64 {
        self.addresses
            .get(name)
            .and_then(|a| a.first().copied())
            .unwrap_or_else(|| panic!("fixture printed no {name} address"))
    }

    /// The port a server fixture printed (`port N`).
    pub fn port(&self) -> u16 {
        self.lines
            .iter()
            .find_map(|line| line.strip_prefix("port ")?.parse().ok())
            .expect("fixture printed its port")
    }

    /// Lets the fixture start its work.
    pub fn start(&mut self) {
        let mut stdin = self.stdin.take().expect("fixture already started");
        stdin.write_all(b"go\n").unwrap();
    }

    /// Writes a line to the fixture's stdin, keeping it open (the first
    /// one starts a fixture that waits for a line).
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("fixture stdin is open");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Reads the next line the fixture prints (None at its end).
    pub fn read_line(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(n) if n > 0 => Some(line.trim_end().to_string()),
            _ => None,
        }
    }

    /// Waits for the fixture to exit; returns the rest of its stdout.
    pub fn wait(mut self) -> String {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "fixture failed: {status}");
        rest
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Only the process this test started, by its pid.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// How long [`Trace::stop_after_load`] waits after an outside load's last
/// response: ten times locktrace's own wait after its load driver's
/// (`AFTER_THE_LAST_RESPONSE`), for what a server does after a response
/// (a worker's call back in for its next request, closing a connection).
pub const AFTER_OUTSIDE_LOAD: Duration = Duration::from_millis(500);

/// A cap for recordings that [`Trace::stop_after_load`] ends: long past
/// any load's end, only so a locktrace whose test failed ends by itself.
pub const OUTSIDE_LOAD_CAP: &str = "120";

/// A running `locktrace record` whose probes are live.
pub struct Trace {
    pub child: Child,
    pub json: PathBuf,
    /// Created by locktrace once its probes are live.
    ready: PathBuf,
    /// What locktrace printed on stderr until its probes were live.
    pub stderr_lines: Vec<String>,
    /// locktrace's stderr goes to a file: everything it printed before
    /// creating the ready file is there once that file exists.
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl Trace {
    /// Starts `locktrace record --pid PID --json FILE --ready-file FILE EXTRA…`
    /// and waits for the ready file, which it creates once its probes are live.
    pub fn attach(pid: u32, extra: &[&str]) -> Trace {
        Trace::attach_env(pid, extra, &[])
    }

    /// [`Trace::attach`] with `env` set for locktrace.
    pub fn attach_env(pid: u32, extra: &[&str], env: &[(&str, &str)]) -> Trace {
        let mut trace = Trace::launch(pid, extra, env);
        trace.wait_live();
        trace
    }

    /// Starts locktrace as [`Trace::attach_env`] does, without waiting.
    pub fn launch(pid: u32, extra: &[&str], env: &[(&str, &str)]) -> Trace {
        Trace::launch_to(pid, extra, env, Stdio::piped())
    }

    /// [`Trace::launch`] with locktrace's stdout (the table) sent to `stdout`.
    pub fn launch_to(pid: u32, extra: &[&str], env: &[(&str, &str)], stdout: Stdio) -> Trace {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("report.json");
        let ready = dir.path().join("ready");
        let stderr = dir.path().join("stderr");
        let child = locktrace()
            .args(["record", "--pid", &pid.to_string(), "--json"])
            .arg(&json)
            .arg("--ready-file")
            .arg(&ready)
            .args(extra)
            .envs(env.iter().copied())
            .stdout(stdout)
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("starting locktrace");
        Trace {
            child,
            json,
            ready,
            stderr_lines: Vec::new(),
            stderr,
            _dir: dir,
        }
    }

    /// What locktrace has printed on stderr so far.
    pub fn printed(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits for the ready file, which locktrace creates once its probes are live.
    pub fn wait_live(&mut self) {
        self.wait_live_within(Duration::from_secs(30));
    }

    /// [`Trace::wait_live`], failing after `budget`.
    pub fn wait_live_within(&mut self, budget: Duration) {
        let started = Instant::now();
        let (child, ready) = (&mut self.child, &self.ready);
        let stderr = &self.stderr;
        let printed = || std::fs::read_to_string(stderr).unwrap_or_default();
        while !ready.exists() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "locktrace exited ({status}) before its probes were live: {}",
                    printed()
                );
            }
            assert!(
                started.elapsed() < budget,
                "attach took too long: {}",
                printed()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stderr_lines = printed().lines().map(str::to_string).collect();
    }

    /// Waits for locktrace to finish (duration, target exit) and returns (report, stdout table).
    pub fn finish(mut self) -> (Value, String) {
        let mut table = String::new();
        std::io::Read::read_to_string(self.child.stdout.as_mut().unwrap(), &mut table).unwrap();
        let table = unwrapped(&table);
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "locktrace failed ({status}); stdout:\n{table}\nstderr:\n{}",
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        );
        let text = std::fs::read_to_string(&self.json).expect("locktrace wrote no JSON report");
        let report: Value = serde_json::from_str(&text).expect("report is JSON");
        typed(&report);
        (report, table)
    }

    /// Like [`Trace::finish`], with the report in the library's types.
    pub fn finish_typed(self) -> (Report, String) {
        let (report, table) = self.finish();
        (typed(&report), table)
    }

    /// Like [`Trace::finish`], and keeps a copy of the JSON report at `copy`.
    pub fn finish_keep(self, copy: &Path) -> (Value, String) {
        let (report, table) = self.finish();
        std::fs::write(copy, serde_json::to_string_pretty(&report).unwrap()).unwrap();
        (report, table)
    }

    /// Waits (up to 30 s) until locktrace's stderr holds `needle`; returns it all.
    pub fn wait_for_stderr(&self, needle: &str) -> String {
        let started = Instant::now();
        loop {
            let printed = std::fs::read_to_string(&self.stderr).unwrap_or_default();
            if printed.contains(needle) {
                return printed;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "locktrace never printed {needle:?}: {printed}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Ends a recording whose outside load has had its last response, as
    /// soon as that truth is there instead of at the end of a fixed window:
    /// [`AFTER_OUTSIDE_LOAD`] for the server's work that follows its last
    /// response, then SIGINT, which still writes the report (checked:
    /// `stopped_by` is `interrupted`, so no cap cut the load short).
    pub fn stop_after_load(self) -> (Value, String) {
        std::thread::sleep(AFTER_OUTSIDE_LOAD);
        self.interrupt();
        let (report, table) = self.finish();
        assert_eq!(report["stopped_by"], "interrupted", "{table}");
        (report, table)
    }

    /// Sends SIGINT (as Ctrl-C would) to this locktrace, by its pid.
    pub fn interrupt(&self) {
        self.signal(libc::SIGINT);
    }

    /// Sends SIGTERM (as `kill` or a service manager would), by its pid.
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on the pid of the child this test started.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }
}

/// The report in the library's types: every report locktrace writes must
/// read back as one (the schema is a contract).
pub fn typed(report: &Value) -> Report {
    serde_json::from_value(report.clone()).unwrap_or_else(|error| {
        panic!("the report does not match locktrace::model::Report: {error}")
    })
}

/// The lock at `address` in a report, if present.
pub fn lock_at(report: &Value, address: u64) -> Option<&Value> {
    let wanted = format!("{address:#x}");
    report["locks"]
        .as_array()?
        .iter()
        .find(|lock| lock["address"] == wanted.as_str())
}

pub fn acquisitions(report: &Value, address: u64) -> u64 {
    lock_at(report, address)
        .unwrap_or_else(|| panic!("no lock at {address:#x} in the report"))["acquisitions"]
        .as_u64()
        .expect("acquisitions counted")
}

/// Runs a fixture under the tracer from start to exit and returns (report, fixture).
/// The contended waits of every row whose waits are lock contention: what
/// `totals.contended` must equal.
pub fn contention_in_rows(report: &Value) -> u64 {
    report["locks"]
        .as_array()
        .map(|locks| {
            locks
                .iter()
                .filter(|lock| lock["wait_class"] == "lock")
                .filter_map(|lock| lock["contended"].as_u64())
                .sum()
        })
        .unwrap_or(0)
}

/// The row named `name`.
pub fn lock_named<'a>(report: &'a Value, name: &str) -> Option<&'a Value> {
    report["locks"]
        .as_array()?
        .iter()
        .find(|lock| lock["name"] == name)
}

/// Sampled mode as the tests run it: a fifth of the time, in windows of
/// 100 ms every 0.5 s.
pub const SAMPLED: &[&str] = &[
    "--mode",
    "sampled",
    "--sample",
    "0.2",
    "--sample-period",
    "0.5",
];

/// Runs a fixture traced from its start to its exit.
pub fn trace_fixture(
    binary: &Path,
    args: &[&str],
    tracer_args: &[&str],
) -> (Value, HashMap<String, Vec<u64>>) {
    let mut fixture = Fixture::spawn(binary, args);
    let trace = Trace::attach(fixture.pid(), tracer_args);
    fixture.start();
    let addresses = fixture.addresses.clone();
    fixture.wait();
    let (report, _) = trace.finish();
    (report, addresses)
}

/// `locktrace report --format FORMAT JSON`'s output (it must succeed).
pub fn report_as(json: &Path, format: &str) -> Vec<u8> {
    let output = locktrace()
        .args(["report", "--format", format])
        .arg(json)
        .output()
        .unwrap();
    assert!(output.status.success(), "report --format {format} failed");
    output.stdout
}

/// The counts of folded stack lines ending with `suffix`, summed; `cpu`:
/// those under the `cpu samples` root, else the others.
pub fn folded_count(folded: &str, suffix: &str, cpu: bool) -> u64 {
    folded
        .lines()
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(stack, _)| stack.ends_with(suffix) && stack.starts_with("cpu samples;") == cpu)
        .map(|(_, n)| n.parse::<u64>().unwrap())
        .sum()
}

/// True for a stack of CPU samples (`stacks[].source`), whose count is
/// samples, not lock calls or waits.
pub fn is_cpu_stack(stack: &Value) -> bool {
    stack["source"] == "cpu_samples"
}

/// The function names of a stack's frames (`stacks[]`), innermost first
/// ("?" where unknown).
pub fn frame_functions(stack: &Value) -> Vec<String> {
    stack["frames"]
        .as_array()
        .map(|frames| {
            frames
                .iter()
                .map(|frame| frame["function"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The functions that called a lock (`callers[].function`), sorted, once each.
pub fn caller_functions(lock: &Value) -> Vec<String> {
    let mut functions: Vec<String> = lock["callers"]
        .as_array()
        .map(|callers| {
            callers
                .iter()
                .filter_map(|c| c["function"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    functions.sort();
    functions.dedup();
    functions
}

/// Locks one of whose callers is `function`.
pub fn locks_called_by<'a>(report: &'a Value, function: &str) -> Vec<&'a Value> {
    report["locks"]
        .as_array()
        .map(|locks| {
            locks
                .iter()
                .filter(|lock| caller_functions(lock).iter().any(|f| f == function))
                .collect()
        })
        .unwrap_or_default()
}

/// The error is one line that starts with `locktrace:`, exit 1 or 2 (a usage
/// error), and no panic.
pub fn assert_one_line_error(output: &std::process::Output, wanted: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        matches!(output.status.code(), Some(1) | Some(2)),
        "exit {:?}: {stderr}",
        output.status
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {stderr}");
    assert!(lines[0].starts_with("locktrace: "), "{stderr}");
    assert!(stderr.contains(wanted), "wanted {wanted:?} in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Runs `command` (a locktrace) and checks it fails with one line containing `expected`.
pub fn fails_with(command: &mut Command, expected: &str) {
    let output = command.output().expect("running locktrace");
    assert_one_line_error(&output, expected);
}

/// Runs a `locktrace record` that writes `json`, asserts it succeeded, and
/// returns the report (read back as the model too) and the printed table.
pub fn run_record(command: &mut Command, json: &std::path::Path) -> (Value, String) {
    let output = command.output().expect("running locktrace");
    let table = unwrapped(&String::from_utf8_lossy(&output.stdout));
    assert!(
        output.status.success(),
        "record failed: {}\n{table}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    typed(&report);
    (report, table)
}

/// Printed text with the lines locktrace wrapped to its width joined again
/// (a continuation line starts with two spaces, then text), so phrases can
/// be looked for whatever the width.
pub fn unwrapped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let continued = line.starts_with("  ") && !line[2..].starts_with(' ') && !out.is_empty();
        if continued {
            out.pop();
            out.push(' ');
            out.push_str(&line[2..]);
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// Spawns `command` traced by this thread (`PTRACE_TRACEME`): it stops at
/// its exec, with only the executable and its loader mapped, and waits
/// there for this test.
pub fn spawn_stopped_at_exec(command: &mut Command) -> Child {
    use std::os::unix::process::CommandExt;
    // SAFETY: ptrace(PTRACE_TRACEME) is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0);
            Ok(())
        });
    }
    let child = command.spawn().unwrap();
    let pid = child.id() as i32;
    let mut status = 0;
    // SAFETY: waits for this test's own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFSTOPPED(status), "{status:#x}");
    child
}

/// `go tool pprof -top` of a profile for one sample type, with every node shown.
pub fn pprof_top(profile: &Path, sample_index: &str) -> String {
    pprof_top_unit(profile, sample_index, "minimum")
}

/// Like [`pprof_top`], with values in `unit` (`ns`: plain nanoseconds).
pub fn pprof_top_unit(profile: &Path, sample_index: &str, unit: &str) -> String {
    let output = Command::new("go")
        .args([
            "tool",
            "pprof",
            "-top",
            "-nodefraction=0",
            "-edgefraction=0",
            &format!("-unit={unit}"),
            &format!("-sample_index={sample_index}"),
        ])
        .arg(profile)
        // go wants a writable home for its caches.
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("running go tool pprof (scripts/setup.sh installs golang-go)");
    assert!(
        output.status.success(),
        "go tool pprof failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// (flat, cum) of the node named `name` in `go tool pprof -top` output.
pub fn flat_and_cum(top: &str, name: &str) -> (u64, u64) {
    for line in top.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // flat flat% sum% cum cum% name…
        if fields.len() >= 6 && fields[5..].join(" ") == name {
            let number = |text: &str| {
                text.trim_end_matches("ns")
                    .parse::<u64>()
                    .unwrap_or_else(|_| panic!("{text:?} in {line:?} is not a plain count"))
            };
            return (number(fields[0]), number(fields[3]));
        }
    }
    panic!("no node {name:?} in pprof -top:\n{top}");
}
