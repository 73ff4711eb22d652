//! `--php` tests (issue 31): pages of known truths, a mixed load over them,
//! and what the report must show on every server (FrankenPHP classic and
//! worker, mod_php under Apache).
//!
//! - `/q.php`: the kit's page, 408 calls of mysqlnd's global statistics lock
//!   per request (the kit's bpftrace truth);
//! - `/two.php`: a connection and two queries, in the PHP functions
//!   `load_posts` and `load_titles` (`fixtures/php/two.php`);
//! - `/hello.php`: no database work, so no call of that lock;
//! - `/hello.php/N`: the same page under ids, one route once
//!   `--route-pattern '/\d+$=/:id'` collapses them.
use std::{
    path::{Path, PathBuf},
    thread,
};

use serde_json::Value;

use super::{
    OUTSIDE_LOAD_CAP, Trace, frankenphp::GLOBAL_LOCK, live_views::try_http_get, repo_root,
};

/// The pattern the tests collapse ids with, and the route it gives.
pub const ID_PATTERN: &str = "/\\d+$=/:id";
pub const ID_ROUTE: &str = "GET /hello.php/:id";

/// What the report names differently from build to build: the global
/// lock's row and where PHP's structure offsets came from; and the PHP
/// version with its truth for `/q.php` (the global lock's calls per request).
#[derive(Debug, Clone, Copy)]
pub struct Build {
    pub global_lock: &'static str,
    pub layout: &'static str,
    pub version: &'static str,
    pub q_per_request: f64,
}

/// The kit's builds, compiled with `-g`: the lock named through DWARF.
pub const DEBUG_BUILD: Build = Build {
    global_lock: GLOBAL_LOCK,
    layout: "dwarf",
    version: "8.2.32",
    q_per_request: super::frankenphp::GLOBAL_PER_REQUEST,
};

/// Requests per page of the mixed load.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    pub q: u64,
    pub two: u64,
    pub hello: u64,
    pub ids: u64,
}

pub const MIX: Mix = Mix {
    q: 60,
    two: 30,
    hello: 40,
    ids: 20,
};

/// A few requests of every page, to warm a server up. Enough of `/q.php`
/// that every PHP thread has served it before a count (a restarted server
/// once showed 61 lock calls in 60 `/q.php` requests after 8 of them).
pub const WARM_UP: Mix = Mix {
    q: 24,
    two: 8,
    hello: 8,
    ids: 0,
};

/// Where PHP's thread table is stripped, locktrace takes the TLS slot of
/// each thread's globals from what `.dynsym` keeps: on a build that has the
/// table too, the ways it finds there (`found`, best first) each give every
/// thread's globals as the table lists them (more than php-main's: the
/// server has started its threads).
pub fn assert_tls_slots_hold_every_threads_globals(
    pid: u32,
    found: &[locktrace::model::TlsSlotFrom],
) {
    use locktrace::{
        naming::php,
        probe::{memory::ProcessMemory, target::Target},
    };
    let target = Target::open(pid).unwrap();
    let runtime = php::resolve(&target).unwrap();
    let memory = ProcessMemory::new(pid);
    let threads = runtime.threads.threads(&memory);
    assert!(threads.len() > 2, "{threads:?}");
    let slots = php::tls_slots_without_thread_table(&target).unwrap();
    let ways: Vec<_> = slots.iter().map(|(_, from)| *from).collect();
    assert_eq!(ways, found, "{slots:?}");
    for (slot, _) in slots {
        assert!(
            slot.holds(&memory, &threads),
            "slot {slot:?} vs threads {threads:x?}"
        );
    }
}

/// A temp docroot with the pages (world-readable: Apache's workers run as
/// www-data).
pub struct Pages {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
}

impl Pages {
    pub fn new(kit: &Path) -> Pages {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("www");
        std::fs::create_dir(&root).unwrap();
        std::fs::copy(kit.join("www/q.php"), root.join("q.php")).unwrap();
        for page in ["two.php", "hello.php", "worker.php", "env.php"] {
            std::fs::copy(fixture(page), root.join(page)).unwrap();
        }
        for path in [dir.path(), root.as_path()] {
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        Pages { _dir: dir, root }
    }
}

pub fn fixture(page: &str) -> PathBuf {
    repo_root().join("fixtures/php").join(page)
}

/// The 1-based line of `needle` in `file`.
pub fn line_of(file: &Path, needle: &str) -> u32 {
    let text = std::fs::read_to_string(file).unwrap();
    let index = text
        .lines()
        .position(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in {}", file.display()));
    index as u32 + 1
}

/// `n` requests of `path` (with `{i}` replaced by the request's number),
/// each answered 200 with `body` in it.
pub fn requests(port: u16, path: &str, n: u64, body: &str) {
    for i in 0..n {
        let path = path.replace("{i}", &(i + 1).to_string());
        let answer = try_http_get(port, &path).unwrap_or_else(|| panic!("GET {path} failed"));
        assert!(answer.contains(body), "GET {path}: {answer}");
    }
}

/// The mix, its pages interleaved from three clients at once; `/two.php`
/// carries a query string, which routes leave out.
pub fn send_mix(port: u16, mix: Mix) {
    thread::scope(|scope| {
        scope.spawn(|| requests(port, "/q.php", mix.q, "\"count\":20"));
        scope.spawn(|| requests(port, "/two.php?page={i}", mix.two, "\"titles\":20"));
        scope.spawn(|| {
            requests(port, "/hello.php", mix.hello, "hello");
            requests(port, "/hello.php/{i}", mix.ids, "hello");
        });
    });
}

/// Requests of `/two.php` alone in [`two_truth`].
pub const TWO_ALONE: u64 = 20;

/// The global lock's calls per request of `/two.php` alone: a plain
/// recording of `pid` (no `--php`) while only that page is requested on
/// `port`, the requests counted by the server's request probe.
pub fn two_truth(pid: u32, port: u16) -> f64 {
    let trace = Trace::attach(pid, &["--duration", OUTSIDE_LOAD_CAP]);
    send_mix(
        port,
        Mix {
            q: 0,
            two: TWO_ALONE,
            hello: 0,
            ids: 0,
        },
    );
    let (report, table) = trace.stop_after_load();
    assert_eq!(report["requests"]["count"], TWO_ALONE, "{table}");
    let calls = super::frankenphp::lock_named(&report, GLOBAL_LOCK)["acquisitions"]
        .as_u64()
        .unwrap();
    calls as f64 / TWO_ALONE as f64
}

/// `record --php --stacks 10000 --route-pattern ID_PATTERN` of `pid` under
/// [`MIX`] on `port`, stopped once the mix has had its responses.
pub fn record_mix(pid: u32, port: u16) -> (Value, String) {
    record_mix_in(pid, port, &[])
}

/// [`record_mix`] with `extra` flags (`--mode inproc`).
pub fn record_mix_in(pid: u32, port: u16, extra: &[&str]) -> (Value, String) {
    let mut args = extra.to_vec();
    args.extend([
        "--duration",
        OUTSIDE_LOAD_CAP,
        "--php",
        // Every stack of the global lock kept: the top 16 could leave
        // out a rarer PHP call line (seen on the static build), and
        // the global lock has more than 200 (228 in a 15 s run of
        // two.php and q.php): load_titles' line was missing about one
        // run in seven.
        "--stacks",
        "10000",
        "--route-pattern",
        ID_PATTERN,
    ]);
    let trace = Trace::attach(pid, &args);
    send_mix(port, MIX);
    trace.stop_after_load()
}

/// `--mode inproc --php --stacks` under [`MIX`] (issue 49): the stubs
/// count the global lock exactly (`two_truth` per `/two.php` request) and
/// sample its calls into stacks that carry the pages' PHP frames at the
/// lines that took it and the routes of their requests, as the lock
/// probes' stacks do, with the C functions PHP called (q.php fetches its
/// rows with `fetchAll`). Requests per route stay exact; no route's
/// acquisitions are counted (the stubs do not know the route), and the
/// report says so, never 0.
pub fn assert_inproc_mix(report: &Value, table: &str, two_truth: f64, root: &Path) {
    let global = super::frankenphp::lock_named(report, GLOBAL_LOCK);
    let truth = DEBUG_BUILD.q_per_request * MIX.q as f64 + two_truth * MIX.two as f64;
    assert_eq!(global["acquisitions"].as_f64(), Some(truth), "{table}");
    for (name, requests) in [
        ("GET /q.php", MIX.q),
        ("GET /two.php", MIX.two),
        ("GET /hello.php", MIX.hello),
        (ID_ROUTE, MIX.ids),
    ] {
        let row = route(report, name);
        assert_eq!(row["requests"], requests, "{row:#}");
        assert!(row["acquisitions_per_request"].is_null(), "{row:#}");
        let calls: u64 = row["locks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|lock| lock["acquisitions"].as_u64().unwrap())
            .sum();
        assert_eq!(calls, 0, "a part must not read as the whole: {row:#}");
    }
    assert_eq!(report["routes"]["acquisitions_not_counted"], "inproc_stubs");
    assert!(
        table.contains("acquisitions per route: not counted (--mode inproc's stubs"),
        "{table}"
    );
    // The stubs' samples alone (the lock's CPU-sample and wait stacks out).
    let mut sampled = report.clone();
    sampled["stacks"]
        .as_array_mut()
        .unwrap()
        .retain(|stack| stack["source"] == "sampled_lock_calls");
    let frames = assert_classic_page_frames(&sampled, root);
    for function in ["PDOStatement::execute", "PDOStatement::fetchAll"] {
        assert!(
            frames.contains(&(function.into(), String::new(), 0)),
            "{function}: {frames:#?}"
        );
    }
    let q = root.join("q.php");
    let fetch_line = u64::from(line_of(&q, "$rows = $st->fetchAll("));
    assert!(
        frames.contains(&("{main}".into(), "q.php".into(), fetch_line)),
        "q.php:{fetch_line}: {frames:#?}"
    );
}

/// The route row named `name`.
pub fn route<'a>(report: &'a Value, name: &str) -> &'a Value {
    let routes = report["routes"]["routes"]
        .as_array()
        .expect("a routes block");
    routes
        .iter()
        .find(|route| route["name"] == name)
        .unwrap_or_else(|| panic!("no route {name}: {:#}", report["routes"]))
}

/// The route's acquisitions of `lock` per request (0 when it took none).
pub fn lock_per_request(route: &Value, lock: &str) -> f64 {
    route["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == lock)
        .map_or(0.0, |row| row["acquisitions_per_request"].as_f64().unwrap())
}

/// What every server shows under the mix: each route's exact request count,
/// the global lock's exact calls per request on each page (`two_truth` for
/// `/two.php`, measured apart), ids collapsed, and every acquisition in
/// exactly one route.
/// CPU per route: every CPU sample of the target under exactly one route,
/// and the global lock's samples over the routes add up to its row's.
fn assert_route_cpu(report: &Value, what: &str, build: Build) {
    let routes = report["routes"]["routes"].as_array().unwrap();
    let samples = |value: &Value| value["cpu_samples"].as_u64().unwrap();
    let in_routes: u64 = routes.iter().map(samples).sum();
    assert_eq!(
        Some(in_routes),
        report["cpu"]["samples"].as_u64(),
        "{what}: every CPU sample in one route: {:#}",
        report["cpu"]
    );
    let period = report["routes"]["cpu_sample_period_ns"]
        .as_u64()
        .expect("the CPU sampler ran");
    let lock_samples: u64 = routes
        .iter()
        .flat_map(|r| r["locks"].as_array().unwrap())
        .filter(|lock| lock["name"] == build.global_lock)
        .map(samples)
        .sum();
    let row = super::frankenphp::lock_named(report, build.global_lock);
    assert_eq!(
        Some(lock_samples * period),
        row["cpu_ns"].as_u64(),
        "{what}: the global lock's CPU over routes"
    );
    let q = route(report, "GET /q.php");
    assert!(
        q["cpu_us_per_request"].as_f64().unwrap() > 0.0,
        "{what}: {q:#}"
    );
}

pub fn assert_routes(report: &Value, mix: Mix, two_truth: f64, what: &str) {
    assert_routes_in(report, mix, two_truth, what, DEBUG_BUILD);
}

/// [`assert_routes`] on `build`.
pub fn assert_routes_in(report: &Value, mix: Mix, two_truth: f64, what: &str, build: Build) {
    let global_lock = build.global_lock;
    let q = route(report, "GET /q.php");
    assert_eq!(q["requests"], mix.q, "{what}: {q:#}");
    assert_eq!(
        lock_per_request(q, global_lock),
        build.q_per_request,
        "{what}: {q:#}"
    );
    let two = route(report, "GET /two.php");
    assert_eq!(two["requests"], mix.two, "{what}: {two:#}");
    assert_eq!(
        lock_per_request(two, global_lock),
        two_truth,
        "{what}: {two:#}"
    );
    let hello = route(report, "GET /hello.php");
    assert_eq!(hello["requests"], mix.hello, "{what}: {hello:#}");
    assert_eq!(
        lock_per_request(hello, global_lock),
        0.0,
        "{what}: {hello:#}"
    );
    let ids = route(report, ID_ROUTE);
    assert_eq!(ids["requests"], mix.ids, "{what}: {ids:#}");
    assert_eq!(lock_per_request(ids, global_lock), 0.0, "{what}: {ids:#}");
    let routes = report["routes"]["routes"].as_array().unwrap();
    assert!(
        !routes
            .iter()
            .any(|r| r["name"].as_str().unwrap().contains("/hello.php/1")),
        "{what}: ids not collapsed: {:#}",
        report["routes"]
    );
    let in_routes: u64 = routes
        .iter()
        .flat_map(|r| r["locks"].as_array().unwrap())
        .map(|lock| lock["acquisitions"].as_u64().unwrap())
        .sum();
    assert_eq!(
        Some(in_routes),
        report["totals"]["acquisitions"].as_u64(),
        "{what}: every acquisition in one route"
    );
    assert_route_cpu(report, what, build);
    assert_eq!(
        report["php"]["layout"], build.layout,
        "{what}: {:#}",
        report["php"]
    );
    assert_eq!(report["php"]["version"], build.version, "{what}");
    // Every thread's block from its TLS: a thread's first request too.
    assert_eq!(
        report["php"]["thread_blocks"], "tls",
        "{what}: {:#}",
        report["php"]
    );
    assert!(
        !report["routes"]["routes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["kind"] == "unreadable"),
        "{what}: {:#}",
        report["routes"]
    );
}

/// `(function, file name, line)` of every PHP frame in the global lock's
/// stacks.
pub fn php_frames(report: &Value) -> Vec<(String, String, u64)> {
    php_frames_in(report, DEBUG_BUILD)
}

/// [`php_frames`] on `build`.
pub fn php_frames_in(report: &Value, build: Build) -> Vec<(String, String, u64)> {
    let lock = super::frankenphp::lock_named(report, build.global_lock);
    let address = lock["address"].as_str().unwrap();
    let mut frames = Vec::new();
    for stack in report["stacks"].as_array().unwrap() {
        if stack["lock"] != address {
            continue;
        }
        for frame in stack["frames"].as_array().unwrap() {
            let Some(php) = frame.get("php") else {
                continue;
            };
            let file = php["file"].as_str().unwrap();
            let name = file.rsplit('/').next().unwrap().to_string();
            frames.push((
                frame["function"].as_str().unwrap().to_string(),
                name,
                php["line"].as_u64().unwrap(),
            ));
        }
    }
    frames.sort();
    frames.dedup();
    frames
}

/// The PHP frames of the classic pages (two.php's functions and top level,
/// q.php's top level) at the lines that took the global lock; returns every
/// frame found.
pub fn assert_classic_page_frames(report: &Value, root: &Path) -> Vec<(String, String, u64)> {
    assert_classic_page_frames_in(report, root, DEBUG_BUILD)
}

/// [`assert_classic_page_frames`] on `build`.
pub fn assert_classic_page_frames_in(
    report: &Value,
    root: &Path,
    build: Build,
) -> Vec<(String, String, u64)> {
    let frames = php_frames_in(report, build);
    // A stack key whose every snapshot was lost (the ring buffer full under
    // load; the report counts them in `dropped.snapshots_lost`) has no PHP
    // frames: then each function must still show, at a line of its own.
    // Since later snapshots give way to first ones, the dynamic builds lose
    // none in this mix; the static ones still lost 95 and 648 here.
    let lost = report["dropped"]["snapshots_lost"].as_u64().unwrap_or(0);
    eprintln!("PHP frames checked with {lost} snapshots lost");
    let check = |file: &Path, function: &str, needles: &[&str]| {
        if lost == 0 {
            assert_frame(&frames, file, function, needles);
        } else {
            assert_function_in(&frames, file, function, lost);
        }
    };
    let two = root.join("two.php");
    check(&two, "load_posts", &["$st->execute([1, 1]);"]);
    check(&two, "load_titles", &["$st->execute([21, 21]);"]);
    check(
        &two,
        "{main}",
        &["$posts = load_posts($pdo);", "$titles = load_titles($pdo);"],
    );
    let q = root.join("q.php");
    check(&q, "{main}", &["$st->execute([$start, $start]);"]);
    assert_stack_routes(report, build);
    frames
}

/// `function` has a frame in `file` (some line of it), where `lost`
/// snapshots may have taken the frames of the very line asked for.
fn assert_function_in(frames: &[(String, String, u64)], file: &Path, function: &str, lost: u64) {
    let name = file.file_name().unwrap().to_str().unwrap();
    assert!(
        frames
            .iter()
            .any(|(f, n, line)| f == function && n == name && *line > 0),
        "no PHP frame of {function} in {name} in the global lock's stacks ({lost} snapshots lost): {frames:#?}"
    );
}

/// Each stack of the global lock with PHP frames is labelled with the route
/// of the page its frames are in (`route`, also pprof's label), and both
/// database pages have such stacks.
pub fn assert_stack_routes(report: &Value, build: Build) {
    let lock = super::frankenphp::lock_named(report, build.global_lock);
    let mut seen = Vec::new();
    for stack in report["stacks"].as_array().unwrap() {
        if stack["lock"] != lock["address"] {
            continue;
        }
        let page = stack["frames"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|frame| frame.get("php")?["file"].as_str())
            .find_map(|file| ["q.php", "two.php"].into_iter().find(|p| file.ends_with(p)));
        let Some(page) = page else {
            continue;
        };
        let wanted = format!("GET /{page}");
        assert_eq!(stack["route"], wanted.as_str(), "{stack:#}");
        seen.push(page);
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen, ["q.php", "two.php"], "stacks of both database pages");
}

/// The global lock's stacks hold `function` in `file` at the line of each
/// of `needles` in that file (the calls that took the lock).
pub fn assert_frame(
    frames: &[(String, String, u64)],
    file: &Path,
    function: &str,
    needles: &[&str],
) {
    let name = file.file_name().unwrap().to_str().unwrap();
    for needle in needles {
        let line = u64::from(line_of(file, needle));
        let wanted = (function.to_string(), name.to_string(), line);
        assert!(
            frames.contains(&wanted),
            "no PHP frame {wanted:?} in the global lock's stacks: {frames:#?}"
        );
    }
}
