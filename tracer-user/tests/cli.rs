//! Command-line checks that need no root: bad flags, numbers and paths,
//! unreadable reports. Each fails in one line before anything is attached,
//! so this target runs in every `cargo test`, with or without root.
mod common;

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{Fixture, Flavor, assert_one_line_error, fails_with, fixture, locktrace};

/// `locktrace record --pid SELF ARGS…`.
fn record(args: &[&str]) -> Command {
    let mut command = locktrace();
    command
        .args(["record", "--pid", &std::process::id().to_string()])
        .args(args);
    command
}

#[test]
fn unknown_flag() {
    fails_with(
        locktrace().args(["record", "--pid", "1", "--bogus"]),
        "unexpected argument '--bogus'",
    );
    fails_with(locktrace().args(["frobnicate"]), "unrecognized subcommand");
}

/// A value clap refuses is one line, without clap's own "For more
/// information, try '--help'." before ours.
#[test]
fn a_refused_value_is_one_line_pointing_to_help_once() {
    let output = locktrace()
        .args(["record", "--pid", "99999999999"])
        .output()
        .unwrap();
    assert_one_line_error(&output, "99999999999 is not in 0..=4294967295");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("For more information"), "{stderr}");
    assert_eq!(stderr.matches("--help").count(), 1, "{stderr}");
}

#[test]
fn report_file_missing_or_not_a_report() {
    fails_with(
        locktrace().args(["report", "/nonexistent/report.json"]),
        "cannot read report /nonexistent/report.json",
    );
    let not_json = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_json.path(), "hello").unwrap();
    fails_with(
        locktrace().arg("report").arg(not_json.path()),
        "is not a locktrace report",
    );
    std::fs::write(not_json.path(), "{\"a\": 1}").unwrap();
    fails_with(
        locktrace().arg("report").arg(not_json.path()),
        "is not a locktrace report",
    );
}

/// `report --group-by site` merges a per-address report's rows of one
/// creation site (init calls seen) into one; a grouped report cannot be
/// split again (`--group-by address` says where the addresses' figures are).
#[test]
fn report_groups_rows_by_creation_site() {
    let site = "mutex created in conn_create <- serve_request <- worker";
    let lock = |address: &str, acquisitions: u64| {
        serde_json::json!({
            "address": address, "kind": "mutex", "acquisitions": acquisitions,
            "contended": 0, "wakes": 0, "wait_ns": 0, "max_wait_ns": 0, "name": site,
            "created": {"by": "init", "inits": 5, "site": [
                {"function": "conn_create", "module": null, "offset": 9},
                {"function": "serve_request", "module": null, "offset": 4},
                {"function": "worker", "module": null, "offset": 7}]},
        })
    };
    let report = serde_json::json!({
        "schema": "locktrace.report/1",
        "target": {"pid": 1, "exe": "/x", "cmdline": []},
        "duration_s": 1.0, "mode": "all", "dropped": {},
        "locks": [lock("0x1000", 20), lock("0x2000", 10)],
        "totals": {"acquisitions": 30, "contended": 0, "wakes": 0, "wait_ns": 0},
    });
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), report.to_string()).unwrap();
    let rows = |group_by: Option<&str>| {
        let mut command = locktrace();
        command.arg("report").arg(file.path()).arg("--wide");
        command.args(group_by.map(|how| ["--group-by", how]).iter().flatten());
        let output = command.output().unwrap();
        assert!(output.status.success(), "{output:?}");
        let text = String::from_utf8(output.stdout).unwrap();
        let rows: Vec<String> = text
            .lines()
            .filter(|line| line.starts_with(&format!(" {site} ")))
            .map(str::to_string)
            .collect();
        (rows, text)
    };
    // As recorded (per address), and the same with --group-by address.
    for how in [None, Some("address")] {
        assert_eq!(rows(how).0.len(), 2, "{}", rows(how).1);
    }
    let (grouped, text) = rows(Some("site"));
    assert_eq!(grouped.len(), 1, "{text}");
    let cells: Vec<&str> = grouped[0].split('|').map(str::trim).collect();
    assert_eq!(
        (cells[2], cells.last().copied()),
        ("30", Some("0x1000 +1 more")),
        "{text}"
    );
    assert!(
        text.contains(
            "grouped: 1 row named by its creation site stands for 10 objects at 2 addresses"
        ),
        "{text}"
    );
    // A grouped report stays grouped.
    let mut saved = report.clone();
    saved["locks"] = serde_json::json!([lock("0x1000", 30)]);
    saved["locks"][0]["group"] =
        serde_json::json!({"addresses": 2, "objects": 10, "by_address": []});
    std::fs::write(file.path(), saved.to_string()).unwrap();
    let output = locktrace()
        .arg("report")
        .arg(file.path())
        .args(["--group-by", "address"])
        .output()
        .unwrap();
    assert_one_line_error(
        &output,
        "was recorded with its rows grouped by creation site",
    );
}

/// A `--php` report of `routes` routes (`GET /r/I`, 10 requests each):
/// route I takes `g_lock` `per(I)` times a request; `extra` adds a route
/// only this side has.
fn report_with_routes(routes: u64, per: impl Fn(u64) -> u64, extra: Option<&str>) -> String {
    let route = |name: String, per: u64| {
        serde_json::json!({
            "name": name, "kind": "route", "requests": 10,
            "acquisitions_per_request": per as f64,
            "locks": [{"address": "0x1000", "name": "g_lock", "acquisitions": 10 * per,
                "contended": 0, "wait_ns": 0, "acquisitions_per_request": per as f64}],
        })
    };
    let mut rows: Vec<serde_json::Value> = (0..routes)
        .map(|i| route(format!("GET /r/{i}"), per(i)))
        .collect();
    rows.extend(extra.map(|name| route(name.to_string(), 2)));
    let acquisitions: u64 = (0..routes).map(|i| 10 * per(i)).sum();
    serde_json::json!({
        "schema": "locktrace.report/1",
        "target": {"pid": 1, "exe": "/x", "cmdline": []},
        "duration_s": 1.0, "mode": "all", "dropped": {},
        "locks": [{"address": "0x1000", "kind": "mutex", "name": "g_lock",
            "acquisitions": acquisitions, "contended": 0, "wakes": 0, "wait_ns": 0,
            "max_wait_ns": 0}],
        "totals": {"acquisitions": acquisitions, "contended": 0, "wakes": 0, "wait_ns": 0},
        "requests": {"source": "given", "count": 10 * routes},
        "routes": {"routes": rows, "distinct": routes, "max_routes": routes},
    })
    .to_string()
}

/// Issue 52 K: `compare` of two reports of 100,000 routes each finishes
/// (it searched the other side's routes per route: 84 s) and gives each
/// route's figures exactly, a route only one side has with `-`.
#[test]
fn compare_of_100000_routes_gives_each_routes_figures() {
    const ROUTES: u64 = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let before = dir.path().join("before.json");
    let after = dir.path().join("after.json");
    std::fs::write(&before, report_with_routes(ROUTES, |i| i % 7 + 1, None)).unwrap();
    let after_report = report_with_routes(ROUTES, |i| i % 5 + 1, Some("POST /new"));
    std::fs::write(&after, after_report).unwrap();
    let output = locktrace()
        .arg("compare")
        .args([&before, &after])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("  GET /r/") || line.starts_with("  POST /new"))
        .collect();
    assert_eq!(lines.len() as u64, ROUTES + 1);
    for i in [0, 1, 6, 12_345, 99_999] {
        let (old, new) = (i % 7 + 1, i % 5 + 1);
        let wanted =
            format!("  GET /r/{i}: {old}.0 -> {new}.0 acquisitions; g_lock {old}.0 -> {new}.0");
        assert!(lines.contains(&wanted.as_str()), "no {wanted:?}");
    }
    assert!(
        lines.contains(&"  POST /new: - -> 2.0 acquisitions; g_lock - -> 2.0"),
        "{:?}",
        lines.iter().find(|line| line.contains("POST"))
    );
}

#[test]
fn invalid_load_ports_are_refused() {
    for port in [":99999", ":abc", ":-1", ":", ":459990"] {
        let url = format!("http://127.0.0.1{port}/");
        fails_with(&mut record(&["--load", &url]), "invalid port");
    }
}

#[test]
fn numeric_flags_are_bounded() {
    let load = "http://127.0.0.1:9/";
    let cases: [(&[&str], &str); 7] = [
        (
            &["--duration", "1e20"],
            "--duration 100000000000000000000 is too long",
        ),
        (&["--duration", "-1"], "--duration must be positive"),
        (
            &["--mode", "sampled", "--sample-period", "1e20"],
            "--sample-period must be between",
        ),
        (
            &["--load", load, "--load-cpus", "0-18446744073709551615"],
            "--load-cpus: CPU 18446744073709551615 does not exist",
        ),
        (
            &["--load", load, "-c", "18446744073709551615"],
            "-c (concurrency) must be between 1 and 10000",
        ),
        (
            &["--sample", "0.5"],
            "--sample applies only with --mode sampled",
        ),
        (&["--top", "-1"], "--top"),
    ];
    for (args, wanted) in cases {
        fails_with(&mut record(args), wanted);
    }
}

#[test]
fn an_unwritable_json_path_fails_before_attaching() {
    let dir = tempfile::tempdir().unwrap();
    let target = Fixture::spawn(&fixture("steady", Flavor::Glibc), &["1", "1"]);
    let ready = dir.path().join("ready");
    let started = Instant::now();
    let output = locktrace()
        .args([
            "record",
            "--pid",
            &target.pid().to_string(),
            "--duration",
            "30",
        ])
        .args(["--json", "/nonexistent-dir/r.json", "--ready-file"])
        .arg(&ready)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_one_line_error(&output, "cannot write --json /nonexistent-dir/r.json");
    assert!(!ready.exists(), "probes were attached first");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// Too few open files (`ulimit -n 6`, and 10 to 16) panicked or said
/// "needs root". Where the hard limit can be raised (root with
/// CAP_SYS_RESOURCE) locktrace raises it and runs; elsewhere one line says
/// so and what to raise, for every size.
#[test]
fn too_few_open_files_is_one_true_line() {
    let target = Fixture::spawn(&fixture("steady", Flavor::Glibc), &["1", "1"]);
    let locktrace = locktrace().get_program().to_owned();
    for limit in [6, 10, 12, 16] {
        let output = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n {limit} && exec \"$0\" record --pid {} --duration 1",
                target.pid()
            ))
            .arg(&locktrace)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("too few open files") {
            assert_one_line_error(
                &output,
                &format!(
                    "too few open files allowed: ulimit -n is {limit} (hard limit {limit}) and locktrace needs 128 (else EMFILE); raise the limit: ulimit -n 128"
                ),
            );
        } else {
            // Raised (root with CAP_SYS_RESOURCE): a normal recording.
            assert!(output.status.success(), "{stderr}");
        }
    }
}

/// A memory limit (`ulimit -v` 50 MB) aborted with "memory allocation of 24
/// bytes failed" and lost the recording. Root lifts it and records; where
/// it cannot be lifted, one line says what to raise.
#[test]
fn a_low_memory_limit_is_lifted_or_one_line() {
    let target = Fixture::spawn(&fixture("steady", Flavor::Glibc), &["1", "1"]);
    let locktrace = locktrace().get_program().to_owned();
    let output = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 50000 && exec \"$0\" record --pid {} --duration 1 --requests 1",
            target.pid()
        ))
        .arg(&locktrace)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("memory allocation of"), "{stderr}");
    if stderr.contains("the memory limit") {
        assert_one_line_error(
            &output,
            "the memory limit (ulimit -v) is 48 MiB and locktrace needs at least 256 MiB; raise it: ulimit -v unlimited",
        );
    } else {
        assert!(output.status.success(), "{stderr}");
    }
}

/// Bad mode options: one clear line, non-zero exit, before touching the target.
#[test]
fn bad_mode_options_are_one_line_errors() {
    for (args, expected) in [
        (
            vec!["--mode", "sampled", "--sample", "0"],
            "--sample must be a fraction in (0, 1]",
        ),
        (
            vec!["--mode", "sampled", "--sample", "2"],
            "--sample must be a fraction in (0, 1]",
        ),
        (
            vec!["--mode", "sampled", "--sample-period", "0.01"],
            "--sample-period must be between 0.1 and 3600 seconds",
        ),
        (
            vec!["--sample-period", "1"],
            "--sample-period applies only with --mode sampled",
        ),
        (
            vec!["--window-links", "perf-event"],
            "--window-links applies only with --mode sampled",
        ),
        (
            vec!["--mode", "sampled", "--window-links", "ioctl"],
            "invalid value 'ioctl' for '--window-links",
        ),
        (
            vec!["--mode", "everything"],
            "invalid value 'everything' for '--mode",
        ),
    ] {
        fails_with(&mut record(&args), expected);
    }
}

#[test]
fn pprof_to_a_terminal_or_a_bad_file_is_a_one_line_error() {
    let output = locktrace()
        .args(["report", "--format", "pprof", "/nonexistent/report.json"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot read report"), "{stderr}");
}

#[test]
fn help_has_headings_and_examples_and_live_views_offer_only_their_modes() {
    let help = |args: &[&str]| {
        let output = locktrace().args(args).arg("--help").output().unwrap();
        assert!(output.status.success());
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let record = help(&["record"]);
    let headings: Vec<&str> = record
        .lines()
        .filter(|line| line.ends_with(':') && !line.starts_with(' '))
        .collect();
    assert_eq!(
        headings,
        [
            "Options:",
            "Target:",
            "What to count:",
            "Requests:",
            "PHP:",
            "Output:",
            "Cost:",
            "Examples:"
        ],
        "{record}"
    );
    for command in ["record", "compare", "serve", "agent", "top", "report"] {
        let text = help(&[command]);
        assert!(
            text.contains(&format!("Examples:\n  locktrace {command} ")),
            "{text}"
        );
    }
    for live in ["serve", "top"] {
        let text = help(&[live]);
        assert!(
            text.contains("contention") && !text.contains("sampled"),
            "{text}"
        );
    }
    assert!(help(&["report"]).contains("The report `record --json` wrote"));
}

#[test]
fn serve_bad_input_is_one_line() {
    let me = std::process::id().to_string();
    for (args, says) in [
        (
            vec!["--listen", "127.0.0.1:0", "--mode", "sampled"],
            "invalid value 'sampled' for '--mode <MODE>' [possible values: all, contention, inproc]",
        ),
        (vec!["--listen", "nonsense"], "invalid value 'nonsense'"),
        (
            vec!["--listen", "127.0.0.1:0", "--max-locks", "0"],
            "--max-locks must be at least 1",
        ),
        // TEST-NET-1: no machine's own address.
        (
            vec!["--listen", "192.0.2.1:9000"],
            "cannot listen on 192.0.2.1:9000 (not an address of this machine",
        ),
    ] {
        fails_with(locktrace().args(["serve", "--pid", &me]).args(&args), says);
    }
    // A port another socket listens on.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    fails_with(
        locktrace().args(["serve", "--pid", &me, "--listen", &address]),
        &format!("cannot listen on {address} (in use: try another port)"),
    );
}

#[test]
fn agent_bad_input_is_one_line() {
    for (args, says) in [
        (
            vec!["--listen", "127.0.0.1:0", "--mode", "sampled"],
            "invalid value 'sampled' for '--mode <MODE>' [possible values: all, contention, inproc]",
        ),
        (
            vec!["--listen", "127.0.0.1:0", "--max-locks", "0"],
            "--max-locks must be at least 1",
        ),
        (
            vec!["--listen", "127.0.0.1:0", "--max-cpu", "0"],
            "--max-cpu 0: give a percentage above 0, e.g. 5",
        ),
        (
            vec!["--listen", "192.0.2.1:9000"],
            "cannot listen on 192.0.2.1:9000 (not an address of this machine",
        ),
    ] {
        fails_with(locktrace().arg("agent").args(&args), says);
    }
}

/// As root, runs every test of this file again as `nobody` (what `cargo
/// test` without root does): none of them needs root.
#[test]
fn every_check_here_needs_no_root() {
    if !nix::unistd::geteuid().is_root() {
        return; // this run is the unprivileged one
    }
    // The fixture is compiled here: nobody may not write the target dir.
    fixture("steady", Flavor::Glibc);
    let output = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--test-threads=1",
            "--skip",
            "every_check_here_needs_no_root",
        ])
        .env("TMPDIR", "/tmp")
        .output()
        .expect("running setpriv (util-linux)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "as nobody:\n{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Every test of this file but this one ran, and passed.
    let tests = include_str!("cli.rs")
        .lines()
        .filter(|line| *line == "#[test]");
    let others = tests.count() - 1;
    assert!(
        stdout.contains(&format!("test result: ok. {others} passed")),
        "{stdout}"
    );
}
