//! Issue 47: FrankenPHP as users run it, stripped: the kit's dynamic host
//! `strip --strip-all`ed (what `-ldflags "-w -s"` leaves for us: no
//! `.symtab`, no DWARF, `.gopclntab` kept) on a `strip --strip-all`ed copy
//! of its libphp, and the static musl binary `strip --strip-unneeded`ed (as
//! the release binary is). Go's function table (`.gopclntab`) names the Go
//! code: `runtime.futex` (Go's parking is not contention), FrankenPHP's Go
//! functions (the server recognised, its requests counted), Go frames.
//!
//! Truths (the kit's README, bpftrace): q.php takes mysqlnd's global
//! statistics mutex 408 times per request, 792 mutex calls in all, in
//! classic mode. Copies are made in a temp folder; /tmp/e2e is only read.
//! One FrankenPHP server runs at a time (`/tmp/franken.lock`).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use crate::common::{Trace, frame_functions, frankenphp::*, is_cpu_stack};
use locktrace::probe::gopclntab;
use object::{Object, ObjectSymbol, SymbolKind};
use serde_json::Value;

const HOST: &str = "/tmp/e2e/frankenphp-e2e";
const LIBPHP: &str = "/tmp/e2e/libphp-franken-stock.so";
const STATIC: &str = "/tmp/e2e/static/frankenphp-static-stock";
/// The global lock's row: named through libphp's `.dynsym` (its field
/// named by the layout table or by offset, whichever this build has).
const GLOBAL_LOCK_PREFIX: &str = "*mysqlnd_global_stats->";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    /// The kit's host and its libphp, both `strip --strip-all`ed.
    Dynamic,
    /// The static musl binary, `strip --strip-unneeded`ed.
    Static,
}

/// `strip ARGS SOURCE -o TARGET`.
fn strip(how: &str, source: &str, target: &Path) {
    assert!(
        Path::new(source).exists(),
        "{source} is missing: run scripts/setup.sh --frankenphp"
    );
    let output = Command::new("strip")
        .args([how, source, "-o"])
        .arg(target)
        .output()
        .expect("running strip (binutils)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Stripped copies of one shape's files: (the executable, a folder for
/// `LD_LIBRARY_PATH` holding the stripped libphp, for the dynamic host).
fn stripped_copies(shape: Shape, dir: &Path) -> (PathBuf, Option<PathBuf>) {
    match shape {
        Shape::Dynamic => {
            let exe = dir.join("frankenphp-e2e");
            strip("--strip-all", HOST, &exe);
            let libs = dir.join("lib");
            std::fs::create_dir_all(&libs).unwrap();
            strip("--strip-all", LIBPHP, &libs.join("libphp.so"));
            (exe, Some(libs))
        }
        Shape::Static => {
            let exe = dir.join("frankenphp");
            strip("--strip-unneeded", STATIC, &exe);
            (exe, None)
        }
    }
}

/// A stripped server in classic mode on the kit's www, while this lives.
struct StrippedServer {
    server: SpawnedServer,
    /// The stripped executable.
    exe: PathBuf,
    /// Holds the stripped copies; after `server` so the files outlive it.
    _dir: tempfile::TempDir,
}

impl StrippedServer {
    fn start(shape: Shape) -> StrippedServer {
        StrippedServer::start_in(shape, Mode::Classic)
    }

    /// In `mode` (worker: the kit's worker.php, 16 workers, as start.sh worker).
    fn start_in(shape: Shape, mode: Mode) -> StrippedServer {
        let dir = tempfile::tempdir().unwrap();
        let (exe, libs) = stripped_copies(shape, dir.path());
        let root = kit().join("www");
        // LD_LIBRARY_PATH comes before the host's RUNPATH (the kit's unstripped libphp).
        let env: Vec<(&str, &Path)> = libs
            .iter()
            .map(|libs| ("LD_LIBRARY_PATH", libs.as_path()))
            .collect();
        let args = server_args(mode, &root);
        let server = SpawnedServer::start(&exe, &args, &env, "franken-stripped.log");
        if let Some(libs) = &libs {
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", server.pid())).unwrap();
            assert!(
                maps.contains(libs.join("libphp.so").to_str().unwrap()),
                "the stripped libphp is not the one loaded"
            );
        }
        StrippedServer {
            server,
            exe,
            _dir: dir,
        }
    }

    fn pid(&self) -> u32 {
        self.server.pid()
    }
}

/// Stripping keeps `.gopclntab` and drops `.symtab`; the table read from
/// the stripped copy lists exactly the Go functions of the unstripped
/// file's symbol table (those in Go's text, by address), under the same
/// names (less the `.abi0` of assembly functions, with `·` for the
/// symbol's `.`), 14,080 in both builds.
#[test]
fn stripping_keeps_gopclntab_which_names_every_go_function() {
    let dir = tempfile::tempdir().unwrap();
    for (shape, unstripped) in [(Shape::Dynamic, HOST), (Shape::Static, STATIC)] {
        let (exe, _) = stripped_copies(shape, dir.path());
        let bytes = std::fs::read(&exe).unwrap();
        let elf = object::File::parse(&*bytes).unwrap();
        assert!(elf.symbols().next().is_none(), "{shape:?}: a .symtab left");
        assert!(elf.section_by_name(".gopclntab").is_some(), "{shape:?}");
        let go = gopclntab::read(&elf).unwrap_or_else(|e| panic!("{shape:?}: {e}"));
        let functions: Vec<_> = go.functions().collect();
        assert_eq!(functions.len(), 14_080, "{shape:?}");
        let go_end = functions.last().unwrap().end;

        let original = std::fs::read(unstripped).unwrap();
        let elf = object::File::parse(&*original).unwrap();
        let mut symbols: Vec<(u64, String)> = elf
            .symbols()
            .filter(|symbol| symbol.kind() == SymbolKind::Text)
            .filter(|symbol| (go.text_start()..go_end).contains(&symbol.address()))
            // The marker of Go's text start, not a function.
            .filter(|symbol| symbol.name() != Ok("runtime.text"))
            .map(|symbol| {
                let name = symbol.name().unwrap();
                let name = name.strip_suffix(".abi0").unwrap_or(name);
                (symbol.address(), name.to_string())
            })
            .collect();
        symbols.sort();
        symbols.dedup();
        let mut listed: Vec<(u64, String)> = functions
            .iter()
            // The ELF symbol spells Go's `·` as `.`.
            .map(|function| (function.entry, function.name.replace('·', ".")))
            .collect();
        listed.sort();
        let only_listed: Vec<_> = listed.iter().filter(|f| !symbols.contains(f)).collect();
        let only_symbols: Vec<_> = symbols.iter().filter(|f| !listed.contains(f)).collect();
        assert_eq!(
            (only_listed.len(), only_symbols.len()),
            (0, 0),
            "{shape:?}: only in .gopclntab {:?}; only in .symtab {:?}",
            &only_listed[..only_listed.len().min(8)],
            &only_symbols[..only_symbols.len().min(8)]
        );
        let futex = go.named("runtime.futex").unwrap();
        let symbol = elf
            .symbols()
            .find(|symbol| symbol.name() == Ok("runtime.futex.abi0"))
            .unwrap();
        assert_eq!(futex.entry, symbol.address(), "{shape:?}");
        assert_eq!(go.at(symbol.address() + 1), Some(futex), "{shape:?}");
    }
}

/// Contention waits of the `lock` class (the only contention).
fn lock_class_waits(report: &Value) -> u64 {
    report["totals"]["by_wait_class"]["lock"]["waits"]
        .as_u64()
        .unwrap()
}

/// A mostly idle server: one request every quarter second, one at a time,
/// so no two PHP requests overlap and no lock can be contended; between
/// them the PHP threads wait for work, parked in Go, and Go's runtime parks
/// and wakes its threads (with nothing sent at all, nothing waits or wakes
/// in a 5 s window: the failure needs threads that do go idle).
fn trickle(requests: u64) {
    for _ in 0..requests {
        let body = get_page().expect("a request of the trickle failed");
        assert!(body.contains(BODY), "{body}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Idle, stripped: no contended wait in the lock class, in `--mode
/// contention` and in the default mode; Go's parking (and the idle PHP
/// threads, parked in Go waiting for a request) is `go_runtime`. Before
/// `.gopclntab` was read, contention mode filed Go's parking as lock
/// contention (129 waits on the static binary, 141 on the dynamic one).
fn assert_idle_is_not_contention(shape: Shape) {
    let server = StrippedServer::start(shape);
    for mode in [&["--mode", "contention"][..], &[]] {
        let mut args = vec!["--duration", "6"];
        args.extend(mode);
        let trace = Trace::attach(server.pid(), &args);
        trickle(16);
        let (report, table) = trace.finish();
        let what = format!("{shape:?} idle {mode:?}");
        assert_eq!(lock_class_waits(&report), 0, "{what}:\n{table}");
        assert_eq!(report["totals"]["contended"], 0, "{what}:\n{table}");
        let go_waits = report["totals"]["by_wait_class"]["go_runtime"]["waits"]
            .as_u64()
            .unwrap();
        assert!(go_waits > 0, "{what}: Go's parking not seen:\n{table}");
    }
}

#[test]
fn idle_stripped_static_server_is_not_contention() {
    assert_idle_is_not_contention(Shape::Static);
}

#[test]
fn idle_stripped_dynamic_server_is_not_contention() {
    assert_idle_is_not_contention(Shape::Dynamic);
}

/// The row whose name starts with `*mysqlnd_global_stats->`.
fn global_lock_row(report: &Value) -> &Value {
    let rows = rows_named_starting(report, GLOBAL_LOCK_PREFIX);
    assert_eq!(rows.len(), 1, "{}", naming_summary(report));
    rows[0]
}

/// Go's code range of the stripped executable, at link time.
fn go_text(exe: &Path) -> (u64, u64) {
    let bytes = std::fs::read(exe).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    let go = gopclntab::read(&elf).unwrap();
    (go.text_start(), go.functions().last().unwrap().end)
}

/// Every frame in Go's code is named (a frame left unnamed carries its
/// link address as offset); some stack has a `runtime.` or FrankenPHP Go
/// frame.
fn assert_go_frames_named(report: &Value, exe: &Path, what: &str) {
    let (start, end) = go_text(exe);
    let exe = exe.to_str().unwrap();
    let stacks = report["stacks"].as_array().unwrap();
    let mut go_frames = 0;
    for stack in stacks.iter().filter(|stack| !is_cpu_stack(stack)) {
        for frame in stack["frames"].as_array().unwrap() {
            let unnamed_go = frame["function"].is_null()
                && frame["module"] == exe
                && frame["offset"]
                    .as_u64()
                    .is_some_and(|at| (start..end).contains(&at));
            assert!(!unnamed_go, "{what}: a Go frame left unnamed: {frame}");
        }
        go_frames += frame_functions(stack)
            .iter()
            .filter(|f| {
                f.starts_with("runtime.") || f.starts_with("github.com/dunglas/frankenphp.")
            })
            .count();
    }
    assert!(
        go_frames > 0,
        "{what}: no Go frame in {} stacks",
        stacks.len()
    );
}

/// A lock of the dynamic loader (`_rtld_global._dl_load_lock`,
/// `_dl_load_tls_lock`, …), taken at thread starts and `dlopen`s.
fn is_loader_lock(lock: &Value) -> bool {
    lock["name"]
        .as_str()
        .is_some_and(|name| name.starts_with("_rtld_global."))
}

/// Classic mode on a stripped shape: an outside client's 100 requests
/// counted exactly by the function chosen with no flag, 792 mutex calls per
/// request, Go's waits apart; then Go frames named in contention mode's
/// `--stacks` (Go's parking has stacks there). Returns the first report.
fn assert_counts_and_go_frames(server: &StrippedServer, what: &str) -> (Value, String) {
    let (report, table, stderr) = record_outside_load(server.pid(), 100);
    let requests = &report["requests"];
    assert_eq!(requests["source"], "probe", "{what}: {stderr:?}");
    assert_eq!(requests["count"], 100, "{what}:\n{table}");
    assert_eq!(requests["auto_probe"]["server"], "frankenphp", "{requests}");
    let mutexes: u64 = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        // The dynamic loader's locks are the runtime's, not the requests':
        // a thread the Go runtime starts during the window takes
        // `_dl_load_tls_lock` once (seen once in a fresh-machine run of
        // the suite: 79,201).
        .filter(|lock| lock["kind"] == "mutex" && !is_loader_lock(lock))
        .map(|lock| lock["acquisitions"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(mutexes, 792 * 100, "{what}:\n{table}");
    assert_go_runtime_apart(&report, &table);

    let trace = Trace::attach(
        server.pid(),
        &["--mode", "contention", "--duration", "5", "--stacks", "200"],
    );
    trickle(8);
    let (stacks, _) = trace.finish();
    assert_go_frames_named(&stacks, &server.exe, what);
    (report, table)
}

/// Dynamic host and libphp both stripped: FrankenPHP recognised (its cgo
/// exports stay in the host's `.dynsym`), `sapi_activate` counting; the
/// global lock, named through libphp's `.dynsym`, at 408.0 per request.
#[test]
fn stripped_dynamic_counts_requests_and_names_go_frames() {
    let server = StrippedServer::start(Shape::Dynamic);
    let (report, table) = assert_counts_and_go_frames(&server, "stripped dynamic");
    assert_eq!(
        report["requests"]["auto_probe"]["function"],
        "sapi_activate"
    );
    let global = global_lock_row(&report);
    assert_eq!(global["acquisitions"], 408 * 100, "{table}");
    assert_eq!(global["per_request"]["acquisitions"], 408.0, "{table}");
}

/// The static binary stripped (no symbol at all): FrankenPHP recognised
/// from `.gopclntab`, its requests counted by the Go body of
/// `go_update_request_info`; the global lock's 408.0 calls per request in
/// one row (unnamed: nothing names PHP's globals in this binary).
#[test]
fn stripped_static_counts_requests_and_names_go_frames() {
    let server = StrippedServer::start(Shape::Static);
    let (report, table) = assert_counts_and_go_frames(&server, "stripped static");
    let auto = &report["requests"]["auto_probe"];
    assert_eq!(
        auto["function"],
        "github.com/dunglas/frankenphp.go_update_request_info"
    );
    assert_eq!(auto["module"], server.exe.to_str().unwrap());
    assert_eq!(
        auto["recognised_by"],
        "github.com/dunglas/frankenphp.go_frankenphp_finish_worker_request (.gopclntab) in frankenphp"
    );
    assert_eq!(rows_at_per_request(&report, 408.0), 1, "{table}");
}

/// Worker mode on the stripped static binary: `go_update_request_info`
/// runs once per request there too (`frankenphp_worker_request_startup`
/// calls it before `sapi_activate`): 100 requests sent, 100 counted, the
/// global lock's 408.0 per request in one row.
#[test]
fn stripped_static_worker_mode_counts_requests() {
    let server = StrippedServer::start_in(Shape::Static, Mode::Worker);
    let (report, table, stderr) = record_outside_load(server.pid(), 100);
    let requests = &report["requests"];
    assert_eq!(requests["source"], "probe", "{stderr:?}");
    assert_eq!(requests["count"], 100, "{table}");
    assert_eq!(
        requests["auto_probe"]["function"],
        "github.com/dunglas/frankenphp.go_update_request_info"
    );
    assert_eq!(rows_at_per_request(&report, 408.0), 1, "{table}");
}
