//! Issue 47: FrankenPHP in the shapes its users download, built by
//! `scripts/build-frankenphp-shapes.sh` (`scripts/setup.sh --frankenphp`)
//! from the kit's Go host (FrankenPHP v1.12.7), each stock and with the
//! kit's patch, each traced with no flag and no debug file:
//!
//! - Docker-shaped PHP 8.4, dynamic: `-O2` (no `-g`), pdo_mysql a shared
//!   extension, libphp.so and pdo_mysql.so `strip --strip-all`ed, the Go
//!   host linked `-w -s`;
//! - static musl PHP 8.2, linked as static-php-cli links the release
//!   binaries: static-pie with PHP's globals in `.dynsym`,
//!   `strip --strip-unneeded` (a static 8.4 is built by hand with
//!   `ONLY=static84`: left out of setup and CI to keep CI under its time).
//!
//! The truths (mutex calls per request of the kit's `/q.php`) were measured
//! with bpftrace on each shape's unstripped twin (`unstripped-*`, the same
//! build before strip), classic mode, 2000 requests (`ab -n 2000 -c 4`)
//! after 50 of warmup:
//! `uprobe:LIBPHP:tsrm_mutex_lock /pid == PID/ { @[arg0] = count() }` and
//! `uprobe:LIBPHP:sapi_activate` (2000 calls), the global statistics mutex
//! told apart by its address, read from `mysqlnd_global_stats` (+0x10).
//!
//! One FrankenPHP server runs on this machine at a time: each test holds
//! `/tmp/franken.lock` while it uses one ([`SpawnedServer`]).

use std::path::{Path, PathBuf};

use crate::common::{OUTSIDE_LOAD_CAP, Trace, frankenphp::*, php_pages::*};
use serde_json::Value;

/// The global statistics mutex's row: named through `mysqlnd_global_stats`
/// (its field by DWARF where there is some, else by offset or table).
const GLOBAL_PREFIX: &str = "*mysqlnd_global_stats->";

/// One shape: a folder with `run-stock/` and `run-patched/`, each holding
/// the server (`frankenphp`) and its `php.ini`; and its measured truths.
struct Shape {
    what: &'static str,
    dir: &'static str,
    /// PHP's version, as the report gives it.
    version: &'static str,
    /// `tsrm_mutex_lock` calls per request of `/q.php`, classic mode.
    mutexes: f64,
    /// Of which on mysqlnd's global statistics mutex.
    global: f64,
    /// What `--mode inproc` did to the GOT entries: `restored` where there
    /// are some; a static executable has none (counted by uprobes).
    inproc_outcome: &'static str,
}

/// PHP 8.4.16 (the 8.4 tarball Debian's mirror serves here), as the official
/// Docker images build it. bpftrace (see the top): 792 `tsrm_mutex_lock`
/// calls per request, 408 on the global statistics mutex.
const PHP84_DOCKER: Shape = Shape {
    what: "PHP 8.4 Docker-shaped",
    dir: "/tmp/e2e/php84",
    version: "8.4.16",
    mutexes: 792.0,
    global: 408.0,
    inproc_outcome: "restored",
};

/// PHP 8.2.32's musl `libphp.a` (`scripts/build-frankenphp-static.sh`)
/// linked as static-php-cli links the release binaries: static-pie, PHP's
/// globals in `.dynsym` (`--dynamic-list`), `strip --strip-unneeded`.
/// bpftrace (see the top, uprobes on the twin executable): 792
/// `pthread_mutex_lock` calls per request (791 through `tsrm_mutex_lock`),
/// 408 on the global statistics mutex.
const STATIC82: Shape = Shape {
    what: "static musl PHP 8.2, release-linked",
    dir: "/tmp/e2e/php84/static-8.2",
    version: "8.2.32",
    mutexes: 792.0,
    global: 408.0,
    inproc_outcome: "nothing_switched",
};

impl Shape {
    fn folder(&self, libphp: Libphp) -> PathBuf {
        let flavour = match libphp {
            Libphp::Stock => "run-stock",
            Libphp::Patched => "run-patched",
        };
        Path::new(self.dir).join(flavour)
    }

    fn start(&self, libphp: Libphp, root: Option<&Path>) -> SpawnedServer {
        let folder = self.folder(libphp);
        let root = root.map_or_else(|| kit().join("www"), Path::to_path_buf);
        let php_ini = folder.join("php.ini");
        SpawnedServer::start(
            &folder.join("frankenphp"),
            &server_args(Mode::Classic, &root),
            &[("PHPRC", &php_ini)],
            "franken-own.log",
        )
    }
}

/// The one row of the global statistics mutex.
fn global_row<'a>(report: &'a Value, table: &str) -> &'a Value {
    let rows = rows_named_starting(report, GLOBAL_PREFIX);
    assert_eq!(
        rows.len(),
        1,
        "not one row named {GLOBAL_PREFIX}…; {}:\n{table}",
        naming_summary(report)
    );
    rows[0]
}

/// Mutex calls per request: every `mutex` row but the loader's thread-start
/// lock (Go starts a thread now and then, never per request).
fn mutexes_per_request(report: &Value) -> f64 {
    let calls: u64 = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|lock| lock["kind"] == "mutex" && lock["name"] != THREAD_START_LOCK)
        .map(|lock| lock["acquisitions"].as_u64().unwrap_or(0))
        .sum();
    calls as f64 / report["requests"]["count"].as_u64().unwrap() as f64
}

/// The global mutex exactly at the shape's truth per request, a mutex of
/// the lock class.
fn assert_global_at_truth(shape: &Shape, report: &Value, table: &str, what: &str) {
    let count = report["requests"]["count"].as_u64().unwrap();
    let row = global_row(report, table);
    assert_eq!(row["kind"], "mutex", "{what}");
    assert_eq!(row["wait_class"], "lock", "{what}");
    assert_eq!(
        row["acquisitions"].as_f64(),
        Some(shape.global * count as f64),
        "{what}:\n{table}"
    );
    assert_eq!(
        row["per_request"]["acquisitions"].as_f64(),
        Some(shape.global),
        "{what}:\n{table}"
    );
}

/// All locks, no flag: the load's 300 requests, the global mutex at its
/// truth, the per-connection mutexes in one row by creation site and every
/// PHP mutex call counted; then an outside client's 100
/// requests counted by the request function locktrace chose itself
/// (FrankenPHP recognised in the stripped Go binary).
fn counts_and_the_global_lock(shape: &Shape) {
    let server = shape.start(Libphp::Stock, None);
    let dir = tempfile::tempdir().unwrap();
    let (report, table) = record_with_load(server.pid(), &dir.path().join("all.json"), &[]);
    let what = format!("{}, all locks", shape.what);
    assert_eq!(report["requests"]["count"], 300, "{what}:\n{table}");
    assert_eq!(report["requests"]["statuses"]["200"], 300, "{what}");
    assert_global_at_truth(shape, &report, &table, &what);
    assert_eq!(
        mutexes_per_request(&report),
        shape.mutexes,
        "{what}:\n{table}"
    );
    // Named from `.dynsym` alone (tsrm_mutex_alloc and mysqlnd_stats_init
    // are exported): every connection's statistics mutex in one row.
    assert_connection_stats_by_site(&report, &table, &what);

    let (report, table, stderr) = record_outside_load(server.pid(), 100);
    let what = format!("{}, outside load", shape.what);
    let requests = &report["requests"];
    assert_eq!(requests["source"], "probe", "{what}: {stderr:?}\n{table}");
    assert_eq!(requests["count"], 100, "{what}: {requests}");
    assert_eq!(requests["auto_probe"]["server"], "frankenphp", "{what}");
    assert_global_at_truth(shape, &report, &table, &what);
}

/// `--mode inproc`: the same exact figures, counted by the stubs behind the
/// GOT entries (by uprobes where there are none: a static executable).
fn inproc_counts_the_same(shape: &Shape) {
    let server = shape.start(Libphp::Stock, None);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("inproc.json");
    let (report, table) = record_with_load(server.pid(), &json, &["--mode", "inproc"]);
    let what = format!("{}, inproc", shape.what);
    assert_eq!(report["requests"]["count"], 300, "{what}:\n{table}");
    assert_global_at_truth(shape, &report, &table, &what);
    assert_eq!(
        mutexes_per_request(&report),
        shape.mutexes,
        "{what}:\n{table}"
    );
    assert_connection_stats_by_site(&report, &table, &what);
    assert_eq!(
        report["inproc"]["restore"]["outcome"], shape.inproc_outcome,
        "{table}"
    );
}

/// The global mutex's calls per request of `/two.php` alone, by a plain
/// recording (no `--php`), as `php_pages::two_truth` on the debug builds.
fn two_truth_of(pid: u32) -> f64 {
    let trace = Trace::attach(pid, &["--duration", OUTSIDE_LOAD_CAP]);
    let alone = Mix {
        q: 0,
        two: TWO_ALONE,
        hello: 0,
        ids: 0,
    };
    send_mix(8091, alone);
    let (report, table) = trace.stop_after_load();
    assert_eq!(report["requests"]["count"], TWO_ALONE, "{table}");
    let calls = global_row(&report, &table)["acquisitions"]
        .as_u64()
        .unwrap();
    calls as f64 / TWO_ALONE as f64
}

/// `--php` under the mixed load of `php_pages`: each route's exact requests
/// and global mutex calls per request, and the PHP frames at the right
/// `file:line` in its stacks.
fn routes_and_php_frames(shape: &Shape) {
    let pages = Pages::new(&kit());
    let server = shape.start(Libphp::Stock, Some(&pages.root));
    let two = two_truth_of(server.pid());
    eprintln!("{}: /two.php alone: {two} per request", shape.what);
    assert!(two > shape.global, "{two}");
    let (report, table) = record_mix(server.pid(), 8091);
    let name = global_row(&report, &table)["name"].as_str().unwrap();
    let build = Build {
        // A test's lifetime: the row's name as this build gives it.
        global_lock: Box::leak(name.to_string().into_boxed_str()),
        layout: "table",
        version: shape.version,
        q_per_request: shape.global,
    };
    let what = format!("{}, --php", shape.what);
    assert_routes_in(&report, MIX, two, &what, build);
    let frames = assert_classic_page_frames_in(&report, &pages.root, build);
    assert!(
        frames.contains(&("PDOStatement::execute".into(), String::new(), 0)),
        "{frames:#?}"
    );
}

/// Stock then patched, all locks: `compare --assert-gone` passes and says
/// the global mutex disappeared from its truth per request.
fn compare_says_the_lock_is_gone(shape: &Shape) {
    let dir = tempfile::tempdir().unwrap();
    let before = dir.path().join("before.json");
    let after = dir.path().join("after.json");
    // Patched, bpftrace on the twins: 1 `pthread_mutex_lock` call per
    // request is left (`*tsrm_env_mutex`; 2000 in 2000 requests).
    for (libphp, json, mutexes) in [
        (Libphp::Stock, &before, shape.mutexes),
        (Libphp::Patched, &after, 1.0),
    ] {
        let server = shape.start(libphp, None);
        let (report, table) = record_with_load(server.pid(), json, &[]);
        assert_eq!(report["requests"]["count"], 300, "{table}");
        assert_eq!(
            mutexes_per_request(&report),
            mutexes,
            "{libphp:?}:\n{table}"
        );
    }
    assert_compare_says_gone_as(&before, &after, GLOBAL_PREFIX, shape.global);
}

#[test]
fn php84_docker_counts_and_the_global_lock_exact() {
    counts_and_the_global_lock(&PHP84_DOCKER);
}

#[test]
fn php84_docker_inproc_counts_the_same() {
    inproc_counts_the_same(&PHP84_DOCKER);
}

#[test]
fn php84_docker_routes_and_php_frames() {
    routes_and_php_frames(&PHP84_DOCKER);
}

#[test]
fn php84_docker_compare_says_the_global_lock_is_gone() {
    compare_says_the_lock_is_gone(&PHP84_DOCKER);
}

#[test]
fn static_release_linked_counts_and_the_global_lock_exact() {
    counts_and_the_global_lock(&STATIC82);
}

#[test]
fn static_release_linked_inproc_counts_the_same() {
    inproc_counts_the_same(&STATIC82);
}

#[test]
fn static_release_linked_routes_and_php_frames() {
    routes_and_php_frames(&STATIC82);
}

#[test]
fn static_release_linked_compare_says_the_global_lock_is_gone() {
    compare_says_the_lock_is_gone(&STATIC82);
}

/// The section names of the ELF file at `path`, and its `.dynsym` names.
fn sections_and_dynamic_symbols(path: &Path) -> (Vec<String>, Vec<String>) {
    use object::{Object, ObjectSection, ObjectSymbol};
    let bytes = std::fs::read(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run scripts/setup.sh --frankenphp)",
            path.display()
        )
    });
    let file = object::File::parse(&*bytes).unwrap();
    let sections = file
        .sections()
        .filter_map(|section| section.name().ok().map(str::to_string))
        .collect();
    let dynamic = file
        .dynamic_symbols()
        .filter(|symbol| symbol.is_definition())
        .filter_map(|symbol| symbol.name().ok().map(str::to_string))
        .collect();
    (sections, dynamic)
}

/// No symbol table and no debug info: what the tests trace has only what
/// users' files have.
fn assert_stripped(path: &Path) {
    let (sections, _) = sections_and_dynamic_symbols(path);
    assert!(
        !sections
            .iter()
            .any(|name| name == ".symtab" || name.starts_with(".debug_")),
        "{} is not stripped: {sections:?}",
        path.display()
    );
}

/// The shapes are what users download: the Docker shape's libphp, its
/// shared pdo_mysql and the Go host stripped, pdo_mysql outside libphp;
/// the static executable stripped, with PHP's globals in `.dynsym`.
#[test]
fn the_shapes_are_stripped_as_users_get_them() {
    for libphp in [Libphp::Stock, Libphp::Patched] {
        let folder = PHP84_DOCKER.folder(libphp);
        for file in ["libphp.so", "pdo_mysql.so", "frankenphp"] {
            assert_stripped(&folder.join(file));
        }
        let (_, exported) = sections_and_dynamic_symbols(&folder.join("libphp.so"));
        assert!(exported.iter().any(|name| name == "mysqlnd_global_stats"));
        assert!(!exported.iter().any(|name| name == "pdo_mysql_module_entry"));
        let ini = std::fs::read_to_string(folder.join("php.ini")).unwrap();
        assert!(
            ini.contains(&format!("extension={}/pdo_mysql.so", folder.display())),
            "{ini}"
        );

        let binary = STATIC82.folder(libphp).join("frankenphp");
        assert_stripped(&binary);
        let (_, exported) = sections_and_dynamic_symbols(&binary);
        for wanted in [
            "mysqlnd_global_stats",
            "sapi_activate",
            "executor_globals_offset",
        ] {
            assert!(
                exported.iter().any(|name| name == wanted),
                "{}: no {wanted}",
                binary.display()
            );
        }
    }
}
