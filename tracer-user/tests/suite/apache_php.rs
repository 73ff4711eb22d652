//! Thread-safe PHP under Apache's threaded (event) MPM with mod_php: the same
//! PHP 8.2.32 ZTS as the FrankenPHP kit's libphp, built as an Apache module by
//! `scripts/build-modphp.sh` (`scripts/setup.sh --frankenphp`), serving a copy
//! of the kit's `www/q.php` (one prepared SELECT of 20 rows from MariaDB per
//! request, connect per request). mysqlnd's global statistics mutex is taken
//! exactly 408 times per request there too, as in FrankenPHP; locktrace
//! counts requests on mod_php through `php_request_startup` in libphp.so,
//! once per PHP request.
//!
//! MariaDB is the kit's (its start.sh starts it and the `bench` database):
//! the test holds `/tmp/franken.lock` as the FrankenPHP tests do, and stops
//! MariaDB again if it started it. Real BPF: run as root.

use std::path::PathBuf;

use crate::common::{OUTSIDE_LOAD_CAP, Trace, frankenphp::*, modphp::*, run_record};
use serde_json::Value;

/// MariaDB with the kit's `bench` database, up while this lives; stopped on
/// drop if it was not running before.
struct Database {
    kit: PathBuf,
    was_up: bool,
}

impl Database {
    fn up() -> Database {
        let kit = kit();
        let was_up = mariadb_up();
        // The kit's start.sh starts MariaDB and creates `bench` as the kit
        // does (and its FrankenPHP server, stopped at once).
        kit_script(&kit, &["start.sh", "classic"]);
        kit_script(&kit, &["stop.sh"]);
        assert!(mariadb_up(), "MariaDB is not up after the kit's start.sh");
        Database { kit, was_up }
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if !self.was_up {
            let _ = std::process::Command::new("bash")
                .arg(self.kit.join("stop.sh"))
                .arg("all")
                .output();
        }
    }
}

/// The auto-chosen request function on mod_php: `php_request_startup` in the
/// module, Apache recognised by its hook runner.
fn assert_mod_php_auto_probe(report: &Value, what: &str) {
    let auto = &report["requests"]["auto_probe"];
    assert_eq!(auto["server"], "apache_mod_php", "{what}: {auto}");
    assert_eq!(auto["function"], "php_request_startup", "{what}: {auto}");
    assert_eq!(auto["module"], MODULE, "{what}: {auto}");
    assert_eq!(
        auto["recognised_by"], "ap_run_handler in apache2, php_request_startup in libphp.so",
        "{what}: {auto}"
    );
}

#[test]
fn mod_php_event_mpm_takes_the_global_stats_lock_408_times_per_request() {
    let _lock = take_machine_lock();
    let _database = Database::up();
    let dir = tempfile::tempdir().unwrap();
    let docroot = dir.path().join("www");
    std::fs::create_dir(&docroot).unwrap();
    std::fs::copy(kit().join("www/q.php"), docroot.join("q.php")).unwrap();
    // The worker (www-data) must get through the temp dir to the docroot.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let server = ModPhp::start(&docroot);
    let body = server.get("/q.php");
    assert!(
        body.as_deref().is_some_and(|body| body.contains(BODY)),
        "q.php under mod_php does not answer 20 rows: {body:?}; logs:\n{}",
        server.error_log()
    );
    let worker = server.child_pid();

    // Under locktrace's load driver, with the request function chosen
    // automatically as well: it is hit exactly once per request, and the
    // report counts requests by it (the load's 300 answers agree).
    let json = dir.path().join("load.json");
    let (report, table) = run_record(
        crate::common::locktrace()
            .args(["record", "--pid", &worker.to_string(), "--json"])
            .arg(&json)
            .args(["--load", &server.url("/q.php")])
            .args(["-n", "300", "-c", "2", "--warmup", "50"])
            .args(["--expect-body", BODY, "--request-probe", "auto"]),
        &json,
    );
    eprintln!("{table}");
    let requests = &report["requests"];
    assert_eq!(requests["source"], "probe", "{requests}");
    assert_eq!(requests["count"], 300, "{requests}");
    assert_eq!(requests["statuses"]["200"], 300, "{requests}");
    assert_eq!(requests["errors"], 0, "{requests}");
    assert_eq!(requests["probe_hits"], 300, "{requests}");
    assert_mod_php_auto_probe(&report, "load");
    assert_global_lock(&report, &table, "mod_php, load");
    eprintln!(
        "{GLOBAL_LOCK}: {} per request",
        lock_named(&report, GLOBAL_LOCK)["per_request"]["acquisitions"]
    );

    // No request flag and an outside client: locktrace counts the requests
    // with php_request_startup on its own, exactly, and the figure holds.
    const N: u64 = 100;
    let trace = Trace::attach(worker, &["--duration", OUTSIDE_LOAD_CAP]);
    for i in 0..N {
        let body = server
            .get("/q.php")
            .unwrap_or_else(|| panic!("request {i} of {N} failed"));
        assert!(body.contains(BODY), "request {i}: {body}");
    }
    let stderr = trace.stderr_lines.clone();
    let (report, table) = trace.stop_after_load();
    let requests = &report["requests"];
    assert_eq!(requests["source"], "probe", "{requests}");
    assert_eq!(requests["count"], N, "{requests}");
    assert_mod_php_auto_probe(&report, "outside load");
    assert!(
        !stderr.iter().any(|line| line.contains("no per-request")),
        "{stderr:?}"
    );
    assert_global_lock(&report, &table, "mod_php, outside load");
    eprintln!(
        "outside load: {N} requests by php_request_startup, {GLOBAL_LOCK}: {} per request",
        lock_named(&report, GLOBAL_LOCK)["per_request"]["acquisitions"]
    );
    assert_eq!(server.child_pid(), worker, "the worker child changed");
}

/// Issue 31 on mod_php: `--php` on the worker child serving the pages of
/// known truths (`common/php_pages.rs`) under the mixed load: each route's
/// exact requests and calls of the global lock per request (`/two.php`'s
/// truth measured apart first), ids collapsed, and the PHP functions, files
/// and lines that took the lock in its stacks. Requests are counted by
/// `php_request_startup`; Apache's `request_uri` is the path without the
/// query. Apache's own threads may add an `(outside requests)` row.
#[test]
fn mod_php_routes_and_php_frames_are_exact() {
    use crate::common::php_pages::*;
    let _lock = take_machine_lock();
    let _database = Database::up();
    let pages = Pages::new(&kit());
    let server = ModPhp::start(&pages.root);
    let body = server.get("/two.php?page=0");
    assert!(
        body.as_deref()
            .is_some_and(|body| body.contains("\"titles\":20")),
        "two.php under mod_php does not answer: {body:?}; logs:\n{}",
        server.error_log()
    );
    let worker = server.child_pid();
    let port = server.port();

    let two = two_truth(worker, port);
    eprintln!("/two.php alone: {two} calls of {GLOBAL_LOCK} per request");
    assert!(
        two > GLOBAL_PER_REQUEST,
        "two queries take the lock more than one page: {two}"
    );
    let (report, table) = record_mix(worker, port);
    eprintln!("{table}");
    assert_mod_php_auto_probe(&report, "--php");
    assert_routes(&report, MIX, two, "mod_php");
    assert_classic_page_frames(&report, &pages.root);
    // The same mix counted inside the process (issue 49).
    let (report, table) = record_mix_in(worker, port, &["--mode", "inproc"]);
    assert_inproc_mix(&report, &table, two, &pages.root);
    assert_eq!(server.child_pid(), worker, "the worker child changed");
}
