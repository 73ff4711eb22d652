//! Issue 31: `--php` on the real FrankenPHP (the kit's dynamic build, classic
//! and worker mode) serving pages of known truths (`common/php_pages.rs`):
//! each route's requests and its calls of mysqlnd's global statistics lock
//! per request, exact under a mixed load, ids collapsed by a route pattern,
//! and the PHP functions, files and lines that took the lock in its stacks;
//! PHP frames in contention mode's wait stacks, in `--mode inproc`'s sampled
//! stacks (issue 49) and in `top --stacks`.
//!
//! The truth for `/two.php` (a connection and two queries) is measured apart
//! first, by a plain recording (no `--php`) while only that page is served:
//! the lock's calls over the probe-counted requests, the figure the FrankenPHP
//! tests check exact for `/q.php`.
//!
//! The kit's server runs under `/tmp/franken.lock` as in the other
//! FrankenPHP tests; stopped (and MariaDB if the test started it) on drop.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::Command,
};

use crate::common::{OUTSIDE_LOAD_CAP, Trace, frankenphp::*, php_pages::*};
use serde_json::Value;

const PORT: u16 = 8091;

/// The kit's server on the test's pages, while this lives.
struct PhpServer {
    kit: PathBuf,
    pid: u32,
    mariadb_was_up: bool,
    pages: Pages,
    /// What the report names differently on the libphp it runs.
    build: Build,
    /// A folder that `LD_LIBRARY_PATH` puts before the binary's RUNPATH
    /// (the kit's libphp symlink, which other tests use, stays as it is).
    libs: Option<tempfile::TempDir>,
    _lock: File,
}

/// The kit's libphp `strip --strip-all`ed: no `.symtab`, no DWARF. Its
/// version's tables give the offsets and the global lock's field, reached
/// from `mysqlnd_global_stats` (a variable in `.dynsym`, without its type).
const STRIPPED: Build = Build {
    global_lock: GLOBAL_LOCK,
    layout: "table",
    ..DEBUG_BUILD
};

impl PhpServer {
    fn start(mode: Mode) -> PhpServer {
        PhpServer::start_on(mode, None, DEBUG_BUILD)
    }

    /// The kit's server on a copy of its libphp stripped as the official
    /// images ship it (`strip --strip-all`), made in a temp folder.
    fn start_stripped(mode: Mode) -> PhpServer {
        PhpServer::start_on(mode, Some(stripped_libphp(false)), STRIPPED)
    }

    fn start_on(mode: Mode, libs: Option<tempfile::TempDir>, build: Build) -> PhpServer {
        let kit = kit();
        assert!(
            Path::new("/tmp/e2e/frankenphp-e2e").exists(),
            "the FrankenPHP kit is not built: run scripts/setup.sh --frankenphp"
        );
        let lock = take_machine_lock();
        let mariadb_was_up = mariadb_up();
        let pages = Pages::new(&kit);
        let mode = match mode {
            Mode::Classic => "classic",
            Mode::Worker => "worker",
        };
        let mut server = PhpServer {
            kit,
            pid: 0,
            mariadb_was_up,
            pages,
            build,
            libs,
            _lock: lock,
        };
        server.script(&["start.sh", mode]);
        // Every count here is of a warm server: a page's first requests
        // can take a lock once (opcache compiling it; seen: 47,521 lock
        // calls in 60 `/q.php` requests, one over 792 each).
        send_mix(PORT, WARM_UP);
        server
    }

    /// Runs a kit script with the test's pages (`use-patched.sh` restarts
    /// the server on them); the server's pid afterwards.
    fn script(&mut self, args: &[&str]) {
        let output = Command::new("bash")
            .arg(self.kit.join(args[0]))
            .args(&args[1..])
            .env("FRANKEN_DOCROOT", &self.pages.root)
            .env("FRANKEN_WORKER", self.pages.root.join("worker.php"))
            .env("FRANKEN_READY", "/hello.php")
            .envs(
                self.libs
                    .as_ref()
                    .map(|libs| ("LD_LIBRARY_PATH", libs.path())),
            )
            .output()
            .expect("running a kit script");
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let pid = std::fs::read_to_string("/tmp/e2e/franken.pid").expect("start.sh wrote no pid");
        self.pid = pid.trim().parse().expect("a pid");
    }

    /// The global lock's calls per request of `/two.php` alone.
    fn two_truth(&self) -> f64 {
        let trace = Trace::attach(self.pid, &["--duration", OUTSIDE_LOAD_CAP]);
        send_mix(
            PORT,
            Mix {
                q: 0,
                two: 20,
                hello: 0,
                ids: 0,
            },
        );
        let (report, table) = trace.stop_after_load();
        assert_eq!(report["requests"]["count"], 20, "{table}");
        let calls = lock_named(&report, self.build.global_lock)["acquisitions"]
            .as_u64()
            .unwrap();
        calls as f64 / 20.0
    }

    /// `record --php` under the mixed load.
    fn record_mix(&self) -> (Value, String) {
        record_mix(self.pid, PORT)
    }
}

/// The kit's libphp stripped as the official images ship it (`strip
/// --strip-all`), as `libphp.so` in a temp folder; with `split`, its symbols
/// and DWARF kept first in `libphp.so.debug` beside it, and the stripped
/// copy linked to it by `.gnu_debuglink` (as distributions' `-dbgsym` and
/// `-debuginfo` packages split them).
fn stripped_libphp(split: bool) -> tempfile::TempDir {
    let libs = tempfile::tempdir().unwrap();
    let stock = "/tmp/e2e/libphp-franken-stock.so";
    let run = |tool: &str, args: &[&str]| {
        let output = Command::new(tool)
            .args(args)
            .current_dir(libs.path())
            .output()
            .unwrap_or_else(|e| panic!("running {tool} (binutils): {e}"));
        assert!(
            output.status.success(),
            "{tool} {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    if split {
        run("objcopy", &["--only-keep-debug", stock, "libphp.so.debug"]);
    }
    run("strip", &["--strip-all", stock, "-o", "libphp.so"]);
    if split {
        run(
            "objcopy",
            &["--add-gnu-debuglink=libphp.so.debug", "libphp.so"],
        );
    }
    libs
}

impl Drop for PhpServer {
    fn drop(&mut self) {
        let run = |args: &[&str]| {
            let _ = Command::new("bash")
                .arg(self.kit.join(args[0]))
                .args(&args[1..])
                .output();
        };
        crate::common::frankenphp::show_log_if_failing(Path::new(
            crate::common::frankenphp::KIT_LOG,
        ));
        // use-stock.sh restarts a running server: stop it first.
        run(&["stop.sh"]);
        run(&["use-stock.sh"]);
        if !self.mariadb_was_up {
            run(&["stop.sh", "all"]);
        }
    }
}

#[test]
fn classic_mode_routes_and_php_frames_are_exact() {
    let server = PhpServer::start(Mode::Classic);
    let two_truth = server.two_truth();
    assert!(
        two_truth > 408.0,
        "two queries take the lock more than one page: {two_truth}"
    );
    let (report, table) = server.record_mix();
    assert_routes(&report, MIX, two_truth, "classic");
    // Every mutex call of a /q.php request, as the kit's bpftrace truth (792).
    let q = route(&report, "GET /q.php");
    assert_eq!(q["acquisitions_per_request"], 792.0, "{q:#}");
    assert!(table.contains("routes (4 seen):"), "{table}");
    let frames = assert_classic_page_frames(&report, &server.pages.root);
    // The C functions PHP called show as PHP frames too, without a file.
    assert!(
        frames.contains(&("PDOStatement::execute".into(), String::new(), 0)),
        "{frames:#?}"
    );
    // The same mix counted inside the process (issue 49).
    let (inproc, inproc_table) = record_mix_in(server.pid, PORT, &["--mode", "inproc"]);
    assert_inproc_mix(&inproc, &inproc_table, two_truth, &server.pages.root);
    // Confirm the patch per route: compare says the lock is gone from both
    // database pages, and the page without database work is unchanged.
    let dir = tempfile::tempdir().unwrap();
    let (before, after) = (
        dir.path().join("stock.json"),
        dir.path().join("patched.json"),
    );
    std::fs::write(&before, report.to_string()).unwrap();
    let mut server = server;
    server.script(&["use-patched.sh"]);
    // The restarted server's first requests take locks once (seen: one
    // extra call in 60 requests): warm every page up before recording.
    send_mix(PORT, WARM_UP);
    let (patched, _) = server.record_mix();
    std::fs::write(&after, patched.to_string()).unwrap();
    assert_eq!(
        route(&patched, "GET /q.php")["acquisitions_per_request"],
        1.0
    );
    let output = crate::common::locktrace()
        .arg("compare")
        .args([&before, &after])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    let q_line = text
        .lines()
        .find(|l| l.contains("GET /q.php:"))
        .expect("a q.php route line");
    assert!(
        q_line.contains("792")
            && q_line.contains(&format!("{GLOBAL_LOCK} 408"))
            && q_line.contains("-> gone"),
        "{text}"
    );
    assert!(text.contains("GET /hello.php: 1"), "{text}");
}

#[test]
fn worker_mode_routes_and_php_frames_are_exact() {
    let server = PhpServer::start(Mode::Worker);
    let two_truth = server.two_truth();
    let (report, _) = server.record_mix();
    assert_routes(&report, MIX, two_truth, "worker");
    let frames = php_frames(&report);
    let worker = server.pages.root.join("worker.php");
    assert_frame(&frames, &worker, "load_posts", &["$st->execute([1, 1]);"]);
    assert_frame(
        &frames,
        &worker,
        "load_titles",
        &["$st->execute([21, 21]);"],
    );
    assert_frame(
        &frames,
        &worker,
        "query_page",
        &["$st->execute([$start, $start]);"],
    );
    assert_frame(
        &frames,
        &worker,
        "{closure}",
        &["$posts = load_posts($pdo);"],
    );
}

/// Issue 47: the kit's libphp stripped as the official images ship it
/// (`strip --strip-all`: no `.symtab`, so no PHP thread table, and no
/// DWARF). `--php` finds each thread's globals through the TLS slot PHP's
/// exported `tsrm_get_ls_cache_tcb_offset` gives and reads PHP 8.2's
/// structures by locktrace's table: every route exact under the mix, the
/// global lock's calls per request as on the unstripped build (408 for
/// `/q.php`, `/two.php`'s measured apart on this server, 0 for the pages
/// without database work), and the PHP frames at the right file:line.
#[test]
fn stripped_libphp_routes_and_php_frames_are_exact() {
    let server = PhpServer::start_stripped(Mode::Classic);
    let two_truth = server.two_truth();
    assert!(two_truth > 408.0, "{two_truth}");
    let (report, table) = server.record_mix();
    let php = &report["php"];
    let libs = server.libs.as_ref().unwrap().path();
    assert_eq!(
        php["module"].as_str(),
        libs.join("libphp.so").to_str(),
        "the stripped copy runs: {php:#}"
    );
    assert_eq!(php["tls_slot_from"], "tcb_offset_function", "{php:#}");
    assert_eq!(php["threads"], 0, "{php:#}");
    assert!(
        table.contains("globals found through their TLS (slot from tsrm_get_ls_cache_tcb_offset)"),
        "{table}"
    );
    assert_routes_in(&report, MIX, two_truth, "stripped classic", STRIPPED);
    let q = route(&report, "GET /q.php");
    assert_eq!(q["acquisitions_per_request"], 792.0, "{q:#}");
    let frames = assert_classic_page_frames_in(&report, &server.pages.root, STRIPPED);
    assert!(
        frames.contains(&("PDOStatement::execute".into(), String::new(), 0)),
        "{frames:#?}"
    );
}

/// Where a stripped libphp's own functions show in the name of the
/// per-connection mutexes' creation site: the third frame, a static
/// function of mysqlnd (`mysqlnd_mysqlnd_object_factory_get_connection_pub`
/// on the `-g` build).
const STRIPPED_SITE: &str =
    "mutex created in tsrm_mutex_alloc <- mysqlnd_stats_init <- libphp.so+0x";

/// `record --stacks` under load, as `frankenphp_real.rs` records the `-g`
/// build: 300 requests of `/q.php`.
fn record_stacks(server: &PhpServer) -> (Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    record_with_load(server.pid, &json, &["--stacks", "10000"])
}

/// Issue 47: the kit's libphp `strip --strip-all`ed, recorded with
/// `--stacks` as the `-g` build is. The global lock has the `-g` build's
/// name, from locktrace's table of `MYSQLND_STATS` for PHP 8.2
/// (`declared.layout: table`), at 408.0 per request; the per-connection
/// mutexes are one row by creation site at 383.0, its stripped frame as
/// `libphp.so+0x…`; 792.0 lock calls per request in all; and one line (not
/// one per frame) says why libphp's frames are unnamed and what would name
/// them.
#[test]
fn stripped_libphp_names_the_global_lock_and_the_connections_site() {
    let server = PhpServer::start_stripped(Mode::Classic);
    let (report, table) = record_stacks(&server);
    let what = "stripped libphp";
    assert_eq!(report["requests"]["count"], 300, "{table}");
    assert_global_lock(&report, &table, what);
    let declared = &lock_named(&report, GLOBAL_LOCK)["declared"];
    assert_eq!(
        declared,
        &serde_json::json!({"type": "pthread_mutex_t", "layout": "table"}),
        "{declared}"
    );
    assert_connection_stats_by_site(&report, &table, what);
    let site = lock_named_starting(&report, STRIPPED_SITE);
    assert_eq!(site["per_request"]["acquisitions"], 383.0, "{table}");
    assert_eq!(
        php_acquisitions_per_request(&report, &table),
        792.0,
        "{table}"
    );
    let libphp = server.libs.as_ref().unwrap().path().join("libphp.so");
    let libphp = libphp.to_str().unwrap();
    assert_eq!(report["naming"]["stripped"], serde_json::json!([libphp]));
    let text = crate::common::unwrapped(&table);
    let reasons: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("-dbgsym"))
        .collect();
    assert_eq!(reasons.len(), 1, "{table}");
    let build_id = report["naming"]["stripped_lookups"][0]["build_id"]
        .as_str()
        .expect("the build-id of the stripped libphp");
    let expected = format!(
        "unnamed frames: stripped, exported symbols only: {libphp} (no /usr/lib/debug/.build-id/{}/{}.debug, \
         DEBUGINFOD_URLS not set); their own functions show as module+offset: to name them trace the -debug \
         build, install the -debuginfo/-dbgsym package, or set DEBUGINFOD_URLS to a debuginfod server",
        &build_id[..2],
        &build_id[2..]
    );
    assert_eq!(reasons[0], expected, "{table}");
}

/// The row whose name starts with `prefix`: exactly one.
fn lock_named_starting<'a>(report: &'a Value, prefix: &str) -> &'a Value {
    let rows: Vec<&Value> = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|lock| lock["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .collect();
    assert_eq!(rows.len(), 1, "{prefix}: {}", naming_summary(report));
    rows[0]
}

/// Issue 47: the kit's libphp split as distributions ship it
/// (`objcopy --only-keep-debug`, `strip --strip-all`, `objcopy
/// --add-gnu-debuglink`). With its debug file beside it, then only under
/// `/usr/lib/debug/.build-id/xx/….debug` (removed after), names are the
/// `-g` build's: the global lock from DWARF, mysqlnd's frames in its
/// stacks named, the connections' site as the `-g` build's, and
/// no line about unnamed frames.
#[test]
fn a_debuglink_file_names_a_stripped_libphp_as_the_g_build() {
    let libs = stripped_libphp(true);
    let debug = libs.path().join("libphp.so.debug");
    let server = PhpServer::start_on(Mode::Classic, Some(libs), DEBUG_BUILD);
    let assert_named = |what: &str, shown: &str| {
        let (report, table) = record_stacks(&server);
        assert_global_lock(&report, &table, what);
        // The type the stripped copy's table gives, from DWARF here.
        let declared = &lock_named(&report, GLOBAL_LOCK)["declared"];
        assert_eq!(
            declared,
            &serde_json::json!({"type": "pthread_mutex_t", "layout": "dwarf"}),
            "{what}"
        );
        assert_global_lock_stacks(&report, &table, what);
        assert_connection_stats_by_site(&report, &table, what);
        lock_named_starting(&report, DEBUG_SITE);
        let libphp = server.libs.as_ref().unwrap().path().join("libphp.so");
        let linked = format!("{} <- {shown}", libphp.display());
        assert!(
            report["naming"]["debug_files"]
                .as_array()
                .unwrap()
                .iter()
                .any(|file| file == linked.as_str()),
            "{what}: {}",
            report["naming"]
        );
        assert!(!table.contains("unnamed frames:"), "{what}:\n{table}");
    };
    assert_named("debuglink beside", &debug.display().to_string());
    let by_id = BuildIdDebugFile::install(&debug);
    assert_named("build-id", &by_id.path.display().to_string());
}

/// The per-connection mutexes' site on the `-g` build.
const DEBUG_SITE: &str = "mutex created in tsrm_mutex_alloc <- mysqlnd_stats_init <- mysqlnd_mysqlnd_object_factory_get_connection_pub";

/// A debug file moved to `/usr/lib/debug/.build-id/xx/rest.debug` by its
/// build-id, removed (with the folder if the test made it) on drop.
struct BuildIdDebugFile {
    path: PathBuf,
    made_dir: bool,
}

impl BuildIdDebugFile {
    fn install(debug: &Path) -> BuildIdDebugFile {
        use locktrace::naming::elf::{ModuleSymbols, hex};
        let bytes = std::fs::read(debug).unwrap();
        let symbols = ModuleSymbols::parse(&bytes, &debug.display().to_string(), None).unwrap();
        let id = hex(&symbols.build_id.expect("the kit's libphp has a build-id"));
        let dir = PathBuf::from(format!("/usr/lib/debug/.build-id/{}", &id[..2]));
        let path = dir.join(format!("{}.debug", &id[2..]));
        assert!(!path.exists(), "{} is there already", path.display());
        let made_dir = !dir.exists();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::rename(debug, &path).unwrap();
        BuildIdDebugFile { path, made_dir }
    }
}

impl Drop for BuildIdDebugFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if self.made_dir {
            let _ = std::fs::remove_dir(self.path.parent().unwrap());
        }
    }
}

/// The TLS slot locktrace takes from `tsrm_get_ls_cache_tcb_offset` where
/// PHP's thread table is stripped holds every thread's globals, as PHP's
/// thread table (read on the unstripped build) lists them.
#[test]
fn the_tcb_offset_slot_holds_every_threads_globals() {
    let server = PhpServer::start(Mode::Classic);
    send_mix(PORT, WARM_UP);
    // tsrm_get_ls_cache calls glibc's pthread_getspecific through the PLT:
    // no pthread key slot from it.
    assert_tls_slots_hold_every_threads_globals(
        server.pid,
        &[locktrace::model::TlsSlotFrom::TcbOffsetFunction],
    );
}

/// The table locktrace keeps for PHP 8.2 (used where libphp has no DWARF)
/// is what the kit's libphp's DWARF says.
#[test]
fn the_php_8_2_table_matches_the_kits_dwarf() {
    use locktrace::naming::{dwarf, php};
    let file =
        locktrace::probe::modules::ModuleFile::open(Path::new("/tmp/e2e/libphp-franken-stock.so"))
            .expect("the kit's libphp (scripts/setup.sh --frankenphp)");
    let info = dwarf::load_module(&file).expect("the kit's libphp has DWARF");
    let from_dwarf = php::dwarf_layout(&info).expect("every PHP structure in the DWARF");
    assert_eq!(Some(from_dwarf), php::table_layout(Some("8.2.32")));
    assert_eq!(php::php_version(file.bytes()).as_deref(), Some("8.2.32"));
}

/// `serve --php`: a series per route and per (route, lock), exact, the ids
/// collapsed as in `record`.
#[test]
fn serve_exports_each_routes_requests_and_locks() {
    use crate::common::live_views::{free_port, start_live, wait_for_sample};
    let server = PhpServer::start(Mode::Classic);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let pid = server.pid.to_string();
    let (_serve, _) = start_live(
        &[
            "serve",
            "--pid",
            &pid,
            "--listen",
            &listen,
            "--php",
            "--route-pattern",
            ID_PATTERN,
        ],
        std::process::Stdio::null(),
    );
    let mix = Mix {
        q: 30,
        two: 0,
        hello: 10,
        ids: 12,
    };
    send_mix(PORT, mix);
    let q = "route=\"GET /q.php\"";
    wait_for_sample(port, "locktrace_route_requests_total", q, |n| {
        n == Some(30.0)
    });
    let ids = format!("route=\"{ID_ROUTE}\"");
    wait_for_sample(port, "locktrace_route_requests_total", &ids, |n| {
        n == Some(12.0)
    });
    let global = format!("{q},lock=\"{GLOBAL_LOCK}\"");
    let metrics = wait_for_sample(
        port,
        "locktrace_route_lock_acquisitions_total",
        &global,
        |n| n == Some(408.0 * 30.0),
    );
    let hello_global = format!("route=\"GET /hello.php\",lock=\"{GLOBAL_LOCK}\"");
    assert_eq!(
        crate::common::live_views::sample(
            &metrics,
            "locktrace_route_lock_acquisitions_total",
            &hello_global
        ),
        None,
        "{metrics}"
    );
}

/// `--php` on a process without PHP, and a route pattern without its name
/// part: one line each that says what to do, nothing attached.
#[test]
fn php_refusals_are_one_line() {
    use crate::common::{Fixture, Flavor, fails_with, fixture};
    let target = Fixture::spawn(&fixture("steady", Flavor::Glibc), &["1", "1"]);
    let pid = target.pid().to_string();
    fails_with(
        crate::common::locktrace().args(["record", "--pid", &pid, "--php", "--duration", "1"]),
        "runs no PHP engine",
    );
    fails_with(
        crate::common::locktrace().args([
            "record",
            "--pid",
            &pid,
            "--php",
            "--route-pattern",
            "/posts/\\d+",
        ]),
        "write REGEX=NAME",
    );
    fails_with(
        crate::common::locktrace().args(["record", "--pid", &pid, "--route-pattern", "/x=/y"]),
        "--php",
    );
    // Sampled windows would count each route's locks in part only.
    fails_with(
        crate::common::locktrace().args(["record", "--pid", &pid, "--php", "--mode", "sampled"]),
        "--mode all",
    );
}

/// Contention mode (no lock probes): the wait stacks carry PHP frames and
/// routes too. `/env.php`'s `putenv()` loop goes through FrankenPHP's Go
/// runtime, which parks the PHP thread: futex waits under that PHP line.
/// Requests per route stay exact.
#[test]
fn contention_mode_wait_stacks_carry_php_frames_and_routes() {
    let server = PhpServer::start(Mode::Classic);
    let trace = Trace::attach(
        server.pid,
        &[
            "--mode",
            "contention",
            "--duration",
            OUTSIDE_LOAD_CAP,
            "--php",
            "--stacks",
            "50",
        ],
    );
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| requests(PORT, "/env.php", 4, "env done"));
        }
    });
    let (report, table) = trace.stop_after_load();
    let env_route = route(&report, "GET /env.php");
    assert_eq!(env_route["requests"], 8, "{table}");
    // No lock probes: acquisitions unknown, not zero.
    assert!(
        env_route["acquisitions_per_request"].is_null(),
        "{env_route:#}"
    );
    assert!(
        table.contains("GET /env.php: 8 requests, ") && !table.contains("0.0 acquisitions/request"),
        "{table}"
    );
    let env = server.pages.root.join("env.php");
    let line = u64::from(line_of(&env, "putenv(\"LOCKTRACE_ENV"));
    let under_putenv = report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|stack| stack["source"] == "waits")
        .filter(|stack| {
            stack["frames"].as_array().unwrap().iter().any(|frame| {
                frame["function"] == "{main}"
                    && frame["php"]["file"]
                        .as_str()
                        .is_some_and(|f| f.ends_with("env.php"))
                    && frame["php"]["line"] == line
            })
        })
        .collect::<Vec<_>>();
    assert!(
        !under_putenv.is_empty(),
        "no wait stack under env.php:{line}: {table}"
    );
    for stack in under_putenv {
        assert_eq!(stack["route"], "GET /env.php", "{stack:#}");
    }
}

/// `top --php --stacks`: the global lock's top stack line reads down
/// through the PHP code that took it (`{main} (q.php:N)`), and the route
/// line gives the page's figures since attach, exact once its requests are
/// done (408 calls of the global lock per request).
#[test]
fn top_shows_routes_and_stack_lines_through_php_frames() {
    use crate::common::live_views::start_live;
    use std::io::BufRead;
    let server = PhpServer::start(Mode::Classic);
    let pid = server.pid.to_string();
    let (mut top, _) = start_live(
        &["top", "--pid", &pid, "--php", "--stacks"],
        std::process::Stdio::piped(),
    );
    let stdout = std::io::BufReader::new(top.0.stdout.take().unwrap());
    let load = std::thread::spawn(|| requests(PORT, "/q.php", 60, "\"count\":20"));
    let route_line = "route GET /q.php: 60 requests, 792.0 acquisitions/request";
    let (mut stack, mut route) = (None, None);
    // top prints a table a second: give up after a minute of them.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    for line in stdout.lines().map_while(Result::ok) {
        if line.starts_with("    stack ") && line.contains("(q.php:") {
            stack = Some(line);
        } else if line.starts_with(route_line) {
            route = Some(line);
        }
        if (stack.is_some() && route.is_some()) || std::time::Instant::now() > deadline {
            break;
        }
    }
    load.join().unwrap();
    unsafe { libc::kill(top.0.id() as i32, libc::SIGINT) };
    let _ = top.0.wait();
    let stack = stack.expect("a stack line through q.php");
    assert!(stack.trim_end().ends_with("pthread_mutex_lock"), "{stack}");
    let route = route.expect("the route line of q.php's 60 requests");
    assert!(route.contains(&format!("{GLOBAL_LOCK} 408.0")), "{route}");
}

/// The tables locktrace uses where libphp has no DWARF hold what PHP's own
/// headers say, for each version with a table: `fixtures/php/offsets.c`
/// compiled against Debian's php8.2-dev, php8.4-dev and php8.5-dev
/// (`scripts/fetch-php-headers.sh`, run by setup; `LOCKTRACE_PHP_HEADERS`
/// names another folder of them, as for the script).
#[test]
fn the_php_tables_match_phps_headers() {
    use locktrace::naming::php;
    for version in ["8.2", "8.4", "8.5"] {
        let text = crate::common::built_and_run(
            Path::new("fixtures/php/offsets.c"),
            &php_includes(version),
        );
        let (t, _) = php::table_layout(Some(version)).expect("a table");
        let table = [
            ("current_execute_data", t.current_execute_data),
            ("execute_data_opline", t.execute_data_opline),
            ("execute_data_func", t.execute_data_func),
            ("execute_data_prev", t.execute_data_prev),
            ("function_type", t.function_type),
            ("function_name", t.function_name),
            ("function_scope", t.function_scope),
            ("op_array_filename", t.op_array_filename),
            ("op_lineno", t.op_lineno),
            ("class_name", t.class_name),
            ("string_len", t.string_len),
            ("string_val", t.string_val),
            ("request_method", t.request_method),
            ("request_uri", t.request_uri),
            ("path_translated", t.path_translated),
        ];
        let from_headers: Vec<(String, u64)> = text
            .lines()
            .map(|line| {
                let (name, offset) = line.split_once(' ').unwrap();
                (name.to_string(), offset.parse().unwrap())
            })
            .collect();
        let from_table: Vec<(String, u64)> = table
            .iter()
            .map(|(name, offset)| (name.to_string(), *offset))
            .collect();
        assert_eq!(from_headers, from_table, "PHP {version}");
    }
}

/// The offset of `LOCK_access` in `MYSQLND_STATS` that names mysqlnd's
/// global lock where libphp has no DWARF holds what each version's headers
/// say (`fixtures/php/mysqlnd_offsets.c`, built thread-safe against
/// Debian's php8.2-dev, php8.4-dev and php8.5-dev; no 8.3: Debian never
/// released its headers).
#[test]
fn the_mysqlnd_stats_table_matches_phps_headers() {
    use locktrace::naming::mysqlnd;
    let versions: Vec<&str> = mysqlnd::LOCK_ACCESS.iter().map(|(v, _)| *v).collect();
    assert_eq!(versions, ["8.2", "8.4", "8.5"]);
    for version in versions {
        let text = crate::common::built_and_run(
            Path::new("fixtures/php/mysqlnd_offsets.c"),
            &php_includes(version),
        );
        let offset = mysqlnd::lock_access_offset(version).unwrap();
        assert_eq!(text, format!("lock_access {offset}\n"), "PHP {version}");
    }
}

/// The include folders of PHP `version`'s headers (see
/// [`the_php_tables_match_phps_headers`]).
fn php_includes(version: &str) -> Vec<PathBuf> {
    let headers = std::env::var_os("LOCKTRACE_PHP_HEADERS")
        .map_or_else(|| PathBuf::from("/tmp/e2e/php-headers"), PathBuf::from);
    let include = std::fs::read_dir(headers.join(version).join("usr/include/php"))
        .expect("PHP's headers (scripts/setup.sh --frankenphp)")
        .flatten()
        .next()
        .expect("one API directory")
        .path();
    ["", "main", "Zend", "TSRM", "sapi"]
        .iter()
        .map(|sub| include.join(sub))
        .collect()
}

/// Issue 52 K: more distinct routes than the BPF side's route map holds
/// (4096), served by `fixtures/fakephp.c` (PHP's symbols, structures and
/// thread table without a server). The first 4096 routes are apart (in
/// `--max-routes` rows and `(other routes)`); the requests of the rest and
/// their lock calls are the `(routes past the cap)` row, exactly, never
/// `(unreadable)`, and `dropped.routes_past_cap` and a lost line say how
/// many requests.
#[test]
fn routes_past_the_maps_capacity_are_counted_in_a_row_of_their_own() {
    use crate::common::{Fixture, Flavor, fixture};
    const THREADS: u64 = 2;
    const ROUTES: u64 = 10_000;
    const PER_ROUTE: u64 = 2;
    const USES: u64 = 3;
    const CAP: u64 = 4096;
    let args = [THREADS, ROUTES, PER_ROUTE, USES].map(|n| n.to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut target = Fixture::spawn(&fixture("fakephp", Flavor::Glibc), &args);
    let trace = Trace::attach(target.pid(), &["--php"]);
    target.start();
    let printed = target.wait();
    assert_eq!(
        printed.trim(),
        format!("done {}", ROUTES * PER_ROUTE * USES)
    );
    let (report, table) = trace.finish();
    let routes = &report["routes"];
    assert_eq!(routes["distinct"], CAP, "{table}");
    let rows = routes["routes"].as_array().unwrap();
    let requests = |kind: &str| -> u64 {
        rows.iter()
            .filter(|r| r["kind"] == kind)
            .map(|r| r["requests"].as_u64().unwrap())
            .sum()
    };
    let past = (ROUTES - CAP) * PER_ROUTE;
    assert_eq!(
        requests("route") + requests("other"),
        CAP * PER_ROUTE,
        "{table}"
    );
    assert_eq!(requests("past_cap"), past, "{table}");
    assert_eq!(requests("unreadable"), 0, "{table}");
    let row = rows.iter().find(|r| r["kind"] == "past_cap").unwrap();
    assert_eq!(row["name"], "(routes past the cap)");
    assert_eq!(row["acquisitions_per_request"], USES as f64, "{row:#}");
    assert_eq!(row["locks"][0]["acquisitions"], past * USES, "{row:#}");
    assert_eq!(report["dropped"]["routes_past_cap"], past, "{table}");
    for wanted in [
        format!("routes ({CAP} seen, more past the map's capacity: {past} requests not apart"),
        format!("lost: {past} requests of routes past the route map's capacity ({CAP} routes;"),
        format!("(routes past the cap): {past} requests"),
    ] {
        assert!(table.contains(&wanted), "no {wanted:?} in:\n{table}");
    }
    assert!(!table.contains("(unreadable)"), "{table}");
}

/// Issue 50: `--php` on the real FrankenPHP under the mixed load: the
/// kernel locks its threads met are listed, each row's waits split by
/// the route of the request the waiting thread was serving. Every split
/// adds up exactly to its row, names only the routes the load requested
/// (or `(outside requests)`: FrankenPHP's Go threads), and some of the
/// waits are in requests.
#[test]
fn kernel_lock_waits_split_by_the_routes_the_load_requested() {
    let server = PhpServer::start(Mode::Classic);
    let trace = Trace::attach(server.pid, &["--php", "--route-pattern", ID_PATTERN]);
    send_mix(PORT, MIX);
    trace.interrupt();
    let (report, table) = trace.finish();
    let requested = [
        "GET /q.php",
        "GET /two.php",
        "GET /hello.php",
        ID_ROUTE,
        "(outside requests)",
    ];
    let section = &report["kernel_locks"];
    let locks = section["locks"].as_array().expect("a kernel locks section");
    assert!(!locks.is_empty(), "no kernel lock under load: {table}");
    let count = |value: &Value| value.as_u64().expect("a count");
    let mut in_requests = 0;
    for lock in locks {
        let routes = lock["routes"].as_array().expect("routes on every row");
        for field in ["contentions", "wait_ns"] {
            let sum: u64 = routes.iter().map(|route| count(&route[field])).sum();
            assert_eq!(sum, count(&lock[field]), "{field}: {lock}");
        }
        for route in routes {
            let name = route["route"].as_str().unwrap_or_default();
            assert!(requested.contains(&name), "{name}: {lock}");
            if name != "(outside requests)" {
                in_requests += count(&route["contentions"]);
            }
        }
    }
    assert!(
        in_requests > 0,
        "no kernel lock wait in a request: {section}"
    );
    assert!(table.contains("    routes: "), "{table}");
}
