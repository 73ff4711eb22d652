//! Issue 9: FrankenPHP's shape. A Go net/http server runs C through cgo
//! (fixtures/goserver), built dynamic glibc and static musl (as FrankenPHP's
//! Docker images and release binaries are), in two shapes: handlers call C
//! directly, or hand each request to a C pthread pool over condvars.
//! On each: the statistics mutex is taken exactly K times per request and
//! named by its pointer chain, the Go runtime's and the idle pool's waits
//! are classified apart from lock contention, and a request probe on the
//! per-request C function counts the requests. Real BPF: root.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
};

use crate::common::*;
use serde_json::Value;

/// Statistics mutex acquisitions per request in the fixture.
const K: u64 = 8;
const REQUESTS: u64 = 1000;

#[derive(Debug, Clone, Copy)]
enum GoBuild {
    /// Like FrankenPHP's Docker images.
    GlibcDynamic,
    /// Like FrankenPHP's release binaries: `CC=musl-gcc`, external linking, `-static`.
    MuslStatic,
}

static GO_BUILD_LOCK: Mutex<()> = Mutex::new(());

/// Builds fixtures/goserver (stdlib only, nothing downloaded) once per
/// source change; the Go build cache lives under target/.
fn goserver(build: GoBuild) -> PathBuf {
    let _guard = GO_BUILD_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let source = repo_root().join("fixtures").join("goserver");
    let target = repo_root().join("target");
    // LOCKTRACE_TEST_GO=/path/to/go builds with another Go than Debian's
    // (Go 1.26 and later put the heap at a random address).
    let go = std::env::var_os("LOCKTRACE_TEST_GO");
    let folder = match &go {
        Some(go) => format!("go-{}", go.to_string_lossy().replace('/', "_")),
        None => "debian-go".into(),
    };
    let binary = target.join("fixtures").join(folder).join(match build {
        GoBuild::GlibcDynamic => "goserver-glibc",
        GoBuild::MuslStatic => "goserver-musl-static",
    });
    let newest_source = std::fs::read_dir(&source)
        .unwrap()
        .filter_map(|entry| entry.ok()?.metadata().ok()?.modified().ok())
        .max();
    let built = std::fs::metadata(&binary).and_then(|m| m.modified()).ok();
    if matches!((built, newest_source), (Some(b), Some(s)) if b >= s) {
        return binary;
    }
    std::fs::create_dir_all(binary.parent().unwrap()).unwrap();
    let mut command = Command::new(go.unwrap_or_else(|| "go".into()));
    command
        .current_dir(&source)
        .env("GOTOOLCHAIN", "local")
        .env("GOCACHE", target.join("go-cache"))
        .env("GOPATH", target.join("go-path"))
        .env("GOFLAGS", "-buildvcs=false")
        .env("GOPROXY", "off")
        .env("CGO_ENABLED", "1")
        .arg("build")
        .arg("-o")
        .arg(&binary);
    if let GoBuild::MuslStatic = build {
        command
            .env("CC", "musl-gcc")
            .args(["-ldflags", "-linkmode external -extldflags -static"]);
    }
    let output = command
        .arg(".")
        .output()
        .expect("running go (scripts/setup.sh installs golang-go)");
    assert!(
        output.status.success(),
        "building goserver ({build:?}) failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    binary
}

fn start(binary: &Path, shape: &str) -> (Fixture, u16) {
    let server = Fixture::spawn(binary, &[shape, &K.to_string(), "4"]);
    let port = server.port();
    (server, port)
}

/// `locktrace record` under the load driver, requests counted by the probe.
fn record(server: &Fixture, port: u16, probe: &str, extra: &[&str]) -> (Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let url = format!("http://127.0.0.1:{port}/");
    let n = REQUESTS.to_string();
    run_record(
        locktrace()
            .args(["record", "--pid", &server.pid().to_string(), "--json"])
            .arg(&json)
            .args(["--load", &url, "-n", &n, "-c", "4", "--warmup", "100"])
            .args(["--expect-body", "hello", "--request-probe", probe])
            .args(extra),
        &json,
    )
}

fn rows<'a>(report: &'a Value, class: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(move |lock| lock["wait_class"] == class)
}

/// What every build and shape must show.
fn assert_frankenphp_truths(report: &Value, table: &str, stats_lock: u64, what: &str) {
    assert_eq!(report["requests"]["source"], "probe", "{what}");
    assert_eq!(report["requests"]["count"], REQUESTS, "{what}: probe hits");
    assert_eq!(report["requests"]["statuses"]["200"], REQUESTS, "{what}");

    let stats = lock_at(report, stats_lock)
        .unwrap_or_else(|| panic!("{what}: stats mutex missing:\n{table}"));
    assert_eq!(stats["acquisitions"], K * REQUESTS, "{what}");
    assert_eq!(
        stats["per_request"]["acquisitions"].as_f64(),
        Some(K as f64),
        "{what}"
    );
    // Named by its field (DWARF of the cgo-compiled C), and in offsets for tools.
    assert_eq!(stats["name"], "*g_stats->lock", "{what}: {table}");
    assert_eq!(stats["offset_name"], "*g_stats->+0x200", "{what}");
    assert_eq!(stats["wait_class"], "lock", "{what}");
    let region = stats["region"].as_str().unwrap();
    assert!(
        region.starts_with("heap") || region == "[heap]",
        "{what}: stats mutex region {region}"
    );
    assert_eq!(caller_functions(stats), ["stats_add"], "{what}");

    // The Go scheduler parks and wakes threads under load: those waits are
    // the runtime's, named as such, and none of them is lock contention.
    let go_waits = report["totals"]["by_wait_class"]["go_runtime"]["waits"]
        .as_u64()
        .unwrap();
    assert!(go_waits > 0, "{what}: no Go runtime waits:\n{table}");
    assert!(
        rows(report, "go_runtime").all(|row| row["region"] == "Go heap"
            || row["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("runtime."))),
        "{what}: a Go runtime word outside the Go heap and runtime.* globals:\n{table}"
    );
    for row in rows(report, "lock") {
        assert!(
            matches!(row["kind"].as_str(), Some("mutex" | "rwlock")),
            "{what}: a lock-class row that is no pthread lock: {row}"
        );
        assert_ne!(row["region"], "Go heap", "{what}: {row}");
    }
    let lock_waits: u64 = rows(report, "lock")
        .map(|row| row["contended"].as_u64().unwrap())
        .sum();
    assert_eq!(report["totals"]["contended"], lock_waits, "{what}");
    assert!(
        table.contains("go_runtime") && table.contains("not contention:"),
        "{what}: no runtime section:\n{table}"
    );
}

/// Shape a, recorded with `extra` arguments: the report and the stats
/// mutex's address.
fn shape_a_handlers_call_c(build: GoBuild, extra: &[&str]) -> (Value, u64) {
    let binary = goserver(build);
    let name = binary.file_name().unwrap().to_str().unwrap().to_string();
    let (server, port) = start(&binary, "direct");
    let (report, table) = record(&server, port, &format!("{name}:handle_request"), extra);
    let what = format!("{build:?} direct");
    let stats = server.address("stats_lock");
    assert_frankenphp_truths(&report, &table, stats, &what);
    (report, stats)
}

/// With `--stacks`: the stats mutex's lock calls reach the cgo call
/// (`handle_request` called from Go through `runtime.asmcgocall`) and
/// stop there, saying so: the Go frames are on the goroutine's stack.
fn assert_stacks_end_at_the_cgo_boundary(report: &Value, stats: u64) {
    let stats = format!("{stats:#x}");
    let stacks: Vec<&Value> = report["stacks"]
        .as_array()
        .expect("stacks recorded")
        .iter()
        .filter(|stack| stack["lock"] == stats.as_str() && stack["source"] == "lock_calls")
        .collect();
    let functions = |stack: &Value| -> Vec<String> {
        stack["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|frame| frame["function"].as_str().unwrap_or("?").to_string())
            .collect()
    };
    let counted: u64 = stacks.iter().map(|s| s["count"].as_u64().unwrap()).sum();
    assert_eq!(counted, K * REQUESTS, "{stacks:#?}");
    for stack in stacks {
        let frames = functions(stack);
        assert_eq!(
            frames[1..],
            [
                "stats_add",
                "handle_request",
                "runtime.asmcgocall.abi0",
                "[cgo boundary]"
            ],
            "{stack:#}"
        );
    }
}

fn shape_b_c_pool_fed_by_go(build: GoBuild) {
    let binary = goserver(build);
    let name = binary.file_name().unwrap().to_str().unwrap().to_string();
    let (server, port) = start(&binary, "pool");
    let (report, table) = record(&server, port, &format!("{name}:run_request"), &[]);
    let what = format!("{build:?} pool");
    assert_frankenphp_truths(&report, &table, server.address("stats_lock"), &what);
    let pool = server.address("pool");
    // The pool mutex: taken by the submitter and by the worker, twice each
    // per request (hand-over, hand-back); musl's condvar wait relocks it
    // through pthread_mutex_lock, glibc's through an internal function.
    let pool_lock = lock_at(&report, pool).expect("pool mutex");
    assert_eq!(pool_lock["wait_class"], "lock", "{what}");
    assert_eq!(pool_lock["name"], "g_pool->lock", "{what}: {table}");
    assert_eq!(pool_lock["offset_name"], "*g_pool", "{what}");
    // Workers wait for work on `work`, submitters for answers on `done`:
    // condvar waits, named by the pointer chain, never contention.
    for (offset, field) in [(0x28, "work"), (0x58, "done")] {
        let cond = lock_at(&report, pool + offset)
            .unwrap_or_else(|| panic!("{what}: no row for the {field} condvar:\n{table}"));
        assert_eq!(cond["kind"], "condvar", "{what} {field}");
        assert_eq!(cond["wait_class"], "condvar", "{what} {field}");
        assert_eq!(
            cond["name"],
            format!("g_pool->{field}").as_str(),
            "{what} {field}: {table}"
        );
        assert_eq!(
            cond["offset_name"],
            format!("g_pool->+{offset:#x}").as_str(),
            "{what} {field}"
        );
        assert!(cond["contended"].as_u64().unwrap() > 0, "{what} {field}");
    }
    let condvar_waits: u64 = rows(&report, "condvar")
        .map(|row| row["contended"].as_u64().unwrap())
        .sum();
    assert_eq!(
        report["totals"]["by_wait_class"]["condvar"]["waits"], condvar_waits,
        "{what}"
    );
}

#[test]
fn shape_a_glibc_dynamic() {
    shape_a_handlers_call_c(GoBuild::GlibcDynamic, &[]);
}

#[test]
fn shape_a_musl_static() {
    let (report, stats) = shape_a_handlers_call_c(GoBuild::MuslStatic, &["--stacks", "3"]);
    assert_stacks_end_at_the_cgo_boundary(&report, stats);
}

#[test]
fn shape_b_glibc_dynamic() {
    shape_b_c_pool_fed_by_go(GoBuild::GlibcDynamic);
}

#[test]
fn shape_b_musl_static() {
    shape_b_c_pool_fed_by_go(GoBuild::MuslStatic);
}
