//! Stripped binaries named from a real debuginfod server (issue 33 item 3):
//! `fixtures/locks.c` built, its debug file split out and served by
//! elfutils' `debuginfod` (scripts/setup.sh installs it), the binary
//! stripped of every symbol. Real BPF as root; counts are the fixture's
//! exact truth.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::common::{Fixture, Flavor, Trace, acquisitions, fixture, lock_at};
use serde_json::Value;

const THREADS: u64 = 4;
const ITERS: u64 = 5_000;

/// Runs `program args`, which must succeed.
fn run(program: &str, args: &[&std::ffi::OsStr]) {
    let status = Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("{program}: {e} (scripts/setup.sh installs it)"));
    assert!(status.success(), "{program} {args:?}");
}

/// The locks fixture, stripped of every symbol, in `dir`, and its debug
/// file in `dir/served`; with the binary's build-id in hex.
fn stripped_locks(dir: &Path) -> (PathBuf, PathBuf, String) {
    let binary = dir.join("locks-stripped");
    std::fs::copy(fixture("locks", Flavor::Glibc), &binary).unwrap();
    let served = dir.join("served");
    std::fs::create_dir_all(&served).unwrap();
    let debug = served.join("locks.debug");
    run(
        "objcopy",
        &[
            "--only-keep-debug".as_ref(),
            binary.as_os_str(),
            debug.as_os_str(),
        ],
    );
    run("strip", &["--strip-all".as_ref(), binary.as_os_str()]);
    let bytes = std::fs::read(&binary).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    assert!(
        object::Object::symbols(&elf).next().is_none(),
        "strip left a symbol table"
    );
    let build_id = object::Object::build_id(&elf)
        .unwrap()
        .expect("gcc gives a build-id");
    let hex = build_id.iter().map(|b| format!("{b:02x}")).collect();
    (binary, served, hex)
}

/// A port nothing listens on (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The HTTP status of `GET path` on 127.0.0.1:`port`, None if no answer.
fn status_of(port: u16, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// A `debuginfod` serving `dir`, stopped (by its pid) when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    /// Starts it and waits until it serves the debug file of `hex`.
    fn start(dir: &Path, hex: &str, scratch: &Path) -> Server {
        let port = free_port();
        let child = Command::new("debuginfod")
            .arg("-F")
            .arg(dir)
            .arg("-p")
            .arg(port.to_string())
            .arg("-d")
            .arg(scratch.join("debuginfod.sqlite"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(scratch.join("debuginfod.log")).unwrap())
            .spawn()
            .expect("debuginfod (scripts/setup.sh installs it)");
        let server = Server { child, port };
        let started = Instant::now();
        let path = format!("/buildid/{hex}/debuginfo");
        while status_of(port, &path) != Some(200) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "debuginfod never served {path} (metrics: {:?}); log: {}",
                status_of(port, "/metrics"),
                std::fs::read_to_string(scratch.join("debuginfod.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only the process this test started, by its pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Records the stripped fixture from its start to its exit with `env`;
/// returns the report and g_lock's address.
fn record(binary: &Path, env: &[(&str, &str)]) -> (Value, u64) {
    let args = [THREADS.to_string(), ITERS.to_string(), "0".to_string()];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut target = Fixture::spawn(binary, &args);
    let trace = Trace::attach_env(target.pid(), &[], env);
    target.start();
    let global = target.address("global");
    target.wait();
    let (report, _) = trace.finish();
    (report, global)
}

fn skipped_for(report: &Value, reason: &str) -> Vec<Value> {
    report["naming"]["skipped_files"]
        .as_array()
        .map(|files| {
            files
                .iter()
                .filter(|file| file["reason"] == reason)
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_stripped_binary_is_named_from_debuginfod_then_from_its_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (binary, served, hex) = stripped_locks(dir.path());
    let cache = dir.path().join("cache");
    let cache_env = cache.to_str().unwrap();
    let server = Server::start(&served, &hex, dir.path());
    let url = server.url();
    let env = [
        ("DEBUGINFOD_URLS", url.as_str()),
        ("DEBUGINFOD_CACHE_PATH", cache_env),
    ];

    let (report, global) = record(&binary, &env);
    let lock = lock_at(&report, global).expect("g_lock in the report");
    assert_eq!(lock["name"], "g_lock", "{lock:#}");
    assert_eq!(acquisitions(&report, global), THREADS * ITERS);
    let cached = cache.join(&hex).join("debuginfo");
    assert!(cached.is_file(), "no {}", cached.display());
    let debug_files = report["naming"]["debug_files"].to_string();
    assert!(
        debug_files.contains(&format!("{hex}/debuginfo")),
        "{debug_files}"
    );
    assert!(skipped_for(&report, "debuginfod_failed").is_empty());

    // The server gone: named from the cache, without a request.
    drop(server);
    let (report, global) = record(&binary, &env);
    let lock = lock_at(&report, global).expect("g_lock in the report");
    assert_eq!(lock["name"], "g_lock", "{lock:#}");
    assert_eq!(acquisitions(&report, global), THREADS * ITERS);
    assert!(skipped_for(&report, "debuginfod_failed").is_empty());
}

#[test]
fn an_unreachable_server_costs_the_names_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let (binary, _, hex) = stripped_locks(dir.path());
    let cache = dir.path().join("cache");
    let url = format!("http://127.0.0.1:{}", free_port());
    let env = [
        ("DEBUGINFOD_URLS", url.as_str()),
        ("DEBUGINFOD_CACHE_PATH", cache.to_str().unwrap()),
    ];
    let started = Instant::now();
    let (report, global) = record(&binary, &env);
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(acquisitions(&report, global), THREADS * ITERS);
    let lock = lock_at(&report, global).unwrap();
    assert!(lock["name"].is_null(), "{lock:#}");
    let failed = skipped_for(&report, "debuginfod_failed");
    assert_eq!(failed.len(), 1, "{:#}", report["naming"]);
    assert!(
        failed[0]["file"]
            .as_str()
            .is_some_and(|file| file.ends_with("locks-stripped")),
        "{:#}",
        failed[0]
    );
    let detail = failed[0]["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(&format!("{url}/buildid/{hex}/debuginfo: ")),
        "{detail}"
    );
    assert!(!cache.join(&hex).join("debuginfo").exists());
}
