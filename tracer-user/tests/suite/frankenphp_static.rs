//! Issue 16, item 5: FrankenPHP's release shape. The kit's host (FrankenPHP
//! v1.12.7) linked into one static musl executable with PHP 8.2 (libphp.a),
//! built by `scripts/build-frankenphp-static.sh` (`scripts/setup.sh
//! --frankenphp`), stock and patched: the lock functions, musl's malloc and
//! PHP are all in the executable. Truths measured with bpftrace on these
//! binaries (uprobes on the executable's lock functions, 300 requests after
//! 50 of warmup): classic mode 792 `pthread_mutex_lock` calls per request,
//! 408 of them on mysqlnd's global statistics mutex, and 8
//! `pthread_rwlock_rdlock` calls on musl's thread-creation lock (`lock`;
//! `pthread_create` takes it too, 2 calls per thread Go starts); patched 1
//! mutex call and the 8 rdlocks. Worker mode: 791 mutex calls and 9 rdlocks;
//! patched the 9 rdlocks.
//!
//! One FrankenPHP server runs on this machine at a time: each test holds
//! `/tmp/franken.lock` while it uses one; a guard stops the server it
//! started (by pid), and MariaDB if the test started it, also on a panic.

use std::path::{Path, PathBuf};

use crate::common::{Trace, frankenphp::*, php_pages::*};
use object::{Object, ObjectSymbol};
use serde_json::Value;

fn binary(libphp: Libphp) -> PathBuf {
    let name = match libphp {
        Libphp::Stock => "frankenphp-static-stock",
        Libphp::Patched => "frankenphp-static-patched",
    };
    let path = Path::new("/tmp/e2e/static").join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup.sh --frankenphp (it runs scripts/build-frankenphp-static.sh)",
        path.display()
    );
    path
}

/// Starts the static server (a [`SpawnedServer`]).
struct StaticServer;

impl StaticServer {
    fn start(mode: Mode, libphp: Libphp) -> SpawnedServer {
        StaticServer::start_on(mode, libphp, None)
    }

    /// [`StaticServer::start`] serving `root` (`-root`; worker mode runs
    /// its `worker.php`) instead of the kit's `www`.
    fn start_on(mode: Mode, libphp: Libphp, root: Option<&Path>) -> SpawnedServer {
        let root = root.map_or_else(|| kit().join("www"), Path::to_path_buf);
        let args = server_args(mode, &root);
        SpawnedServer::start(&binary(libphp), &args, &[], "franken-static.log")
    }
}

/// Acquisitions of the rows of one lock kind (`mutex`, `rwlock`).
fn acquisitions_of_kind(report: &Value, kind: &str) -> u64 {
    report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|lock| lock["kind"] == kind)
        .map(|lock| lock["acquisitions"].as_u64().unwrap_or(0))
        .sum()
}

/// Thread starts a test allows during a recording: musl's `pthread_create`
/// read-locks its thread-creation rwlock (`__acquire_ptc`, the row `lock`),
/// the same lock PHP's requests take; bpftrace saw 2 more calls for the one
/// thread Go started in a fresh server's first load.
const MAX_THREAD_STARTS: u64 = 8;

/// What the load driver's report shows: every request answered, exactly
/// `mutexes` mutex calls per request, `rwlocks` rwlock calls per request
/// plus those of the threads Go may start, and all of them in the total.
fn assert_load_report(report: &Value, table: &str, mutexes: u64, rwlocks: u64, what: &str) {
    assert_eq!(report["requests"]["source"], "load", "{what}");
    assert_eq!(
        report["requests"]["statuses"]["200"], 300,
        "{what}:\n{table}"
    );
    let count = report["requests"]["count"].as_u64().unwrap();
    assert_eq!(count, 300, "{what}");
    let mutex_calls = acquisitions_of_kind(report, "mutex");
    assert_eq!(mutex_calls, mutexes * count, "{what}:\n{table}");
    let rwlock_calls = acquisitions_of_kind(report, "rwlock");
    let extra = rwlock_calls.checked_sub(rwlocks * count);
    assert!(
        extra.is_some_and(|extra| extra <= 2 * MAX_THREAD_STARTS),
        "{what}: {rwlock_calls} rwlock calls for {count} requests:\n{table}"
    );
    assert_eq!(
        report["totals"]["per_request"]["acquisitions"].as_f64(),
        Some((mutex_calls + rwlock_calls) as f64 / count as f64),
        "{what}:\n{table}"
    );
}

/// Static: no program interpreter (PT_INTERP) and no shared library
/// (DT_NEEDED); PHP, the lock functions and musl's malloc are symbols of
/// the executable itself.
#[test]
fn the_binaries_are_static_with_php_inside() {
    for libphp in [Libphp::Stock, Libphp::Patched] {
        let path = binary(libphp);
        let bytes = std::fs::read(&path).unwrap();
        let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(&*bytes).unwrap();
        let what = path.display();
        let endian = elf.endian();
        use object::read::elf::ProgramHeader;
        let interpreter = elf
            .elf_program_headers()
            .iter()
            .any(|header| header.p_type(endian) == object::elf::PT_INTERP);
        assert!(!interpreter, "{what} has a program interpreter");
        let dynamic = elf
            .elf_program_headers()
            .iter()
            .any(|header| header.p_type(endian) == object::elf::PT_DYNAMIC);
        assert!(!dynamic, "{what} has a dynamic section (DT_NEEDED)");
        let names: Vec<String> = elf
            .symbols()
            .filter(|symbol| symbol.is_definition())
            .filter_map(|symbol| symbol.name().ok().map(str::to_string))
            .collect();
        for wanted in [
            "sapi_activate",
            "pthread_mutex_lock",
            "pthread_cond_wait",
            "malloc",
            "mysqlnd_global_stats",
            "go_frankenphp_finish_worker_request",
        ] {
            assert!(
                names.iter().any(|name| name == wanted),
                "{what}: no {wanted}"
            );
        }
    }
}

/// Classic mode, stock: 408.0 on the global lock, named by its pointer
/// chain through musl's heap as in the dynamic build; 792.0 mutex and 8.0
/// rwlock calls per request; Go's waits apart. With no request flag the
/// chosen function (`sapi_activate` in the executable) counts an outside
/// client's requests exactly. Patched: compare says the global lock is gone,
/// 1.0 mutex call (`*tsrm_env_mutex`) and the 8.0 rwlock calls are left.
#[test]
fn classic_mode_stock_then_patched() {
    let dir = tempfile::tempdir().unwrap();
    let before = dir.path().join("before.json");
    let after = dir.path().join("after.json");
    {
        let server = StaticServer::start(Mode::Classic, Libphp::Stock);
        let (report, table) = record_with_load(server.pid(), &before, &["--stacks", "10000"]);
        assert_load_report(&report, &table, 792, 8, "classic stock");
        assert_global_lock(&report, &table, "classic stock, load");
        assert_global_lock_stacks(&report, &table, "classic stock, load");
        assert_connection_stats_by_site(&report, &table, "classic stock, load");
        assert_eq!(lock_named(&report, GLOBAL_LOCK)["region"], "heap (mmap)");
        assert_go_runtime_apart(&report, &table);

        let (report, table, stderr) = record_outside_load(server.pid(), 100);
        let module = server.binary.to_str().unwrap();
        let name = server.binary.file_name().unwrap().to_str().unwrap();
        let what = "classic, outside load";
        assert_auto_probe(&report, &stderr, (module, name), 100, what);
        assert_global_lock(&report, &table, "classic stock, outside load");
    }
    {
        let server = StaticServer::start(Mode::Classic, Libphp::Patched);
        let (report, table) = record_with_load(server.pid(), &after, &[]);
        assert_load_report(&report, &table, 1, 8, "classic patched");
        assert!(!has_lock_named(&report, GLOBAL_LOCK), "{table}");
        let left = lock_named(&report, "*tsrm_env_mutex");
        assert_eq!(
            left["per_request"]["acquisitions"].as_f64(),
            Some(1.0),
            "{table}"
        );
    }
    assert_compare_says_gone(&before, &after);
}

/// Worker mode (the kit's worker.php, 16 workers): stock 408.0 on the named
/// global lock, 791.0 mutex and 9.0 rwlock calls per request; patched no
/// mutex at all.
#[test]
fn worker_mode_stock_then_patched() {
    let dir = tempfile::tempdir().unwrap();
    {
        let server = StaticServer::start(Mode::Worker, Libphp::Stock);
        let (report, table) = record_with_load(server.pid(), &dir.path().join("stock.json"), &[]);
        assert_load_report(&report, &table, 791, 9, "worker stock");
        assert_global_lock(&report, &table, "worker stock, load");
    }
    let server = StaticServer::start(Mode::Worker, Libphp::Patched);
    let (report, table) = record_with_load(server.pid(), &dir.path().join("patched.json"), &[]);
    assert_load_report(&report, &table, 0, 9, "worker patched");
    assert!(!has_lock_named(&report, GLOBAL_LOCK), "{table}");
}

/// The global lock keeps its name when the server exits before the
/// recording ends: musl's heap (`heap (mmap)`) is searched for pointer
/// chains during the recording too, as glibc's is.
#[test]
fn a_server_exiting_mid_recording_keeps_the_global_lock_named() {
    let mut server = StaticServer::start(Mode::Classic, Libphp::Stock);
    let trace = Trace::attach(server.pid(), &["--duration", "120"]);
    // A few seconds of requests: several searches during the recording.
    sequential_requests(200);
    server.stop();
    let (report, table) = trace.finish();
    assert_eq!(report["stopped_by"], "target_exited", "{table}");
    assert_eq!(report["requests"]["count"], 200, "{table}");
    assert_global_lock(&report, &table, "exited mid-recording");
    let naming = report["naming"]["pointer_chains"].as_str().unwrap();
    assert!(naming.contains("found during the recording"), "{naming}");
}

/// Issue 31 on the release shape: `--php` on the static executable (PHP's
/// globals, its TLS and DWARF in the executable itself) serving the pages
/// of known truths (`common/php_pages.rs`) in classic mode, as
/// `php_routes.rs` does on the kit's dynamic build: the PHP functions,
/// files and lines that took the global lock in its stacks, and each
/// route's exact requests and calls of that lock per request under the
/// mixed load (`/two.php`'s truth measured apart first), ids collapsed,
/// every acquisition in exactly one route. musl's lock functions call each
/// other (`pthread_rwlock_rdlock` -> `timedrdlock` -> `tryrdlock`;
/// `pthread_mutex_lock` -> `timedlock` -> `trylock` when the lock is taken):
/// one acquisition each, in the routes as in the lock rows.
#[test]
fn static_build_routes_and_php_frames() {
    let pages = Pages::new(&kit());
    let server = StaticServer::start_on(Mode::Classic, Libphp::Stock, Some(&pages.root));
    let port = 8091;
    let two = two_truth(server.pid(), port);
    eprintln!("/two.php alone: {two} calls of {GLOBAL_LOCK} per request");
    assert!(
        two > GLOBAL_PER_REQUEST,
        "two queries take the lock more than one page: {two}"
    );
    let (report, table) = record_mix(server.pid(), port);
    eprintln!("{table}");
    let frames = assert_classic_page_frames(&report, &pages.root);
    assert!(
        frames.contains(&("PDOStatement::execute".into(), String::new(), 0)),
        "{frames:#?}"
    );
    assert!(table.contains("routes (4 seen):"), "{table}");
    assert_routes(&report, MIX, two, "static classic");
    // musl's thread-creation rwlock (`lock`): each of its calls once per
    // route, as in its row.
    let rwlock = lock_named(&report, "lock");
    let in_routes: u64 = report["routes"]["routes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|route| route["locks"].as_array().unwrap())
        .filter(|row| row["address"] == rwlock["address"])
        .map(|row| row["acquisitions"].as_u64().unwrap())
        .sum();
    assert_eq!(
        Some(in_routes),
        rwlock["acquisitions"].as_u64(),
        "{:#}",
        report["routes"]
    );
}

/// Issue 47: where PHP's thread table is stripped (the release binaries
/// keep PHP's exported symbols in `.dynsym`), locktrace takes each thread's
/// globals from PHP's `tsrm_get_ls_cache_tcb_offset` (on this PHP 8.2 build
/// linked to an immediate, -312: its configure did not define `__MUSL__`)
/// or, where that returns 0 (PHP builds that detect musl), from the pthread
/// key PHP's `tsrm_get_ls_cache` reads in musl's array of pthread-specific
/// values (both by their code). On this build, which has the table too,
/// both give every thread's globals as PHP's thread table lists them.
#[test]
fn the_tls_slots_hold_every_threads_globals() {
    use locktrace::model::TlsSlotFrom;
    let server = StaticServer::start(Mode::Classic, Libphp::Stock);
    sequential_requests(8);
    assert_tls_slots_hold_every_threads_globals(
        server.pid(),
        &[TlsSlotFrom::TcbOffsetFunction, TlsSlotFrom::PthreadKey],
    );
}
