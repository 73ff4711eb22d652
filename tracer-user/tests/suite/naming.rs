//! Issue 3: every lock named (symbol, symbol+offset, pointer chain from a
//! global), its region and module, its callers with exact counts, stacks and
//! their folded / SVG output; for glibc and musl, dynamic and static.
//! Real BPF: run as root.

use std::path::Path;

use crate::common::*;
use serde_json::Value;

const READS: u64 = 3000;
const WRITES: u64 = 2000;

/// Runs the naming fixture under the tracer and stops tracing while the
/// fixture is still alive (pointer chains are read from its memory).
fn trace_alive(binary: &Path, tracer_args: &[&str]) -> (Value, Fixture) {
    let mut fixture = Fixture::spawn(binary, &[&READS.to_string(), &WRITES.to_string(), "60"]);
    let trace = Trace::attach(fixture.pid(), tracer_args);
    fixture.start();
    let done = fixture
        .read_line()
        .expect("fixture printed nothing after its work");
    assert!(done.starts_with("done"), "fixture said {done:?}");
    trace.interrupt();
    let (report, _table) = trace.finish();
    (report, fixture)
}

/// (function, count) of each caller, as reported.
fn callers(lock: &Value) -> Vec<(String, u64)> {
    lock["callers"]
        .as_array()
        .expect("callers array")
        .iter()
        .map(|c| {
            (
                c["function"].as_str().unwrap_or("?").to_string(),
                c["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn owned(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    pairs.iter().map(|(f, n)| (f.to_string(), *n)).collect()
}

fn check_named(report: &Value, fixture: &Fixture, binary: &Path, flavor: Flavor) {
    let module = binary.to_str().unwrap();
    let global = lock_at(report, fixture.address("global")).expect("g_lock in report");
    assert_eq!(global["name"], "g_lock", "{flavor:?}");
    assert_eq!(global["region"], ".bss", "{flavor:?}");
    assert_eq!(global["module"], module, "{flavor:?}");
    assert_eq!(global["acquisitions"], READS + WRITES, "{flavor:?}");
    assert_eq!(
        callers(global),
        owned(&[("reader", READS), ("writer", WRITES)]),
        "{flavor:?}"
    );
    for caller in global["callers"].as_array().unwrap() {
        assert_eq!(caller["module"], module);
    }

    let registry = lock_at(report, fixture.address("registry")).expect("registry lock in report");
    // Built with -g: the field, from DWARF; the offset notation alongside.
    assert_eq!(registry["name"], "g_registry.lock", "{flavor:?}");
    assert_eq!(registry["offset_name"], "g_registry+0x40", "{flavor:?}");
    assert_eq!(registry["acquisitions"], READS, "{flavor:?}");
    assert_eq!(
        callers(registry),
        owned(&[("registry_touch", READS)]),
        "{flavor:?}"
    );

    let stats = lock_at(report, fixture.address("stats")).expect("stats lock in report");
    assert_eq!(
        stats["name"], "*g_stats->LOCK_access",
        "{flavor:?}: {}",
        report["naming"]
    );
    assert_eq!(stats["offset_name"], "*g_stats->+0x20", "{flavor:?}");
    assert_eq!(stats["acquisitions"], READS, "{flavor:?}");
    assert_eq!(
        callers(stats),
        owned(&[("stats_update", READS)]),
        "{flavor:?}"
    );
    assert!(
        matches!(
            stats["region"].as_str(),
            Some("[heap]" | "heap (mmap)" | "heap (thread arena)" | "heap (module page tail)")
        ),
        "{flavor:?}: stats lock region {}",
        stats["region"]
    );

    // Every lock has a region; every lock with calls has its callers.
    for lock in report["locks"].as_array().unwrap() {
        assert!(
            !lock["region"].as_str().unwrap_or("").is_empty(),
            "no region: {lock}"
        );
        if let Some(n) = lock["acquisitions"].as_u64() {
            let total: u64 = callers(lock).iter().map(|(_, count)| count).sum();
            assert_eq!(total, n, "callers of {lock}");
        }
    }
}

#[test]
fn names_and_callers_glibc_dynamic() {
    let binary = fixture("naming", Flavor::Glibc);
    let (report, fixture) = trace_alive(&binary, &[]);
    check_named(&report, &fixture, &binary, Flavor::Glibc);
    let naming = &report["naming"];
    assert!(
        naming["pointer_chains"]
            .as_str()
            .unwrap()
            .starts_with("1 of 1 heap locks named"),
        "{naming}"
    );
    // libc6-dbg (scripts/setup.sh) gives libc's full symbol table.
    assert!(
        naming["debug_files"]
            .to_string()
            .contains("libc.so.6 <- /usr/lib/debug/.build-id/"),
        "{naming}"
    );
}

#[test]
fn names_and_callers_static_and_musl() {
    for flavor in [Flavor::GlibcStatic, Flavor::Musl, Flavor::MuslStatic] {
        let binary = fixture("naming", flavor);
        let (report, fixture) = trace_alive(&binary, &[]);
        check_named(&report, &fixture, &binary, flavor);
    }
}

/// After the target exits, ELF names still resolve (files opened at attach).
#[test]
fn names_after_target_exit() {
    let binary = fixture("naming", Flavor::Glibc);
    let (report, addresses) =
        trace_fixture(&binary, &[&READS.to_string(), &WRITES.to_string()], &[]);
    assert_eq!(report["stopped_by"], "target_exited");
    let global = lock_at(&report, addresses["global"][0]).unwrap();
    assert_eq!(global["name"], "g_lock");
    assert_eq!(
        callers(global),
        owned(&[("reader", READS), ("writer", WRITES)])
    );
    let registry = lock_at(&report, addresses["registry"][0]).unwrap();
    assert_eq!(registry["name"], "g_registry.lock");
}

/// `--stacks N`: stacks with the immediate caller, folded and SVG output.
#[test]
fn stacks_folded_and_svg() {
    let binary = fixture("naming", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &[&READS.to_string(), &WRITES.to_string(), "60"]);
    let trace = Trace::attach(fixture.pid(), &["--stacks", "8"]);
    fixture.start();
    assert!(fixture.read_line().unwrap().starts_with("done"));
    trace.interrupt();
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("report.json");
    let (report, _) = trace.finish_keep(&saved);
    let global = format!("{:#x}", fixture.address("global"));
    let stacks: Vec<&Value> = report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["lock"] == global.as_str() && !is_cpu_stack(s))
        .collect();
    let from = |caller: &str| -> u64 {
        stacks
            .iter()
            .filter(|s| {
                s["frames"][0]["function"] == "pthread_mutex_lock"
                    && s["frames"][1]["function"] == caller
            })
            .map(|s| s["count"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(from("reader"), READS);
    assert_eq!(from("writer"), WRITES);

    let folded = String::from_utf8(report_as(&saved, "folded")).unwrap();
    let folded_count = |suffix: &str| folded_count(&folded, suffix, false);
    assert_eq!(
        folded_count("reader;pthread_mutex_lock;lock g_lock"),
        READS,
        "{folded}"
    );
    assert_eq!(
        folded_count("writer;pthread_mutex_lock;lock g_lock"),
        WRITES,
        "{folded}"
    );
    assert_eq!(
        folded_count("stats_update;pthread_mutex_lock;lock *g_stats->LOCK_access"),
        READS,
        "{folded}"
    );

    let svg = locktrace()
        .args(["report", "--format", "svg"])
        .arg(&saved)
        .output()
        .unwrap();
    assert!(svg.status.success());
    let svg = String::from_utf8(svg.stdout).unwrap();
    assert!(
        svg.starts_with("<?xml") && svg.contains("<svg") && svg.contains("reader"),
        "not an SVG flame graph"
    );
}

/// A target in its own mount namespace and root: a tmpfs mounted only in
/// that namespace holds the fixture and its own copy of libc and the dynamic
/// linker, and the target runs chrooted into it, so none of its files exist
/// on the host. Lock functions and names come through /proc/PID.
#[test]
fn names_inside_a_container_root() {
    let staging = tempfile::tempdir().unwrap();
    let mount_point = tempfile::tempdir().unwrap();
    let (app_dir, lib_dir) = ("locktrace-ctr-app", "locktrace-ctr-lib");
    std::fs::create_dir_all(staging.path().join(app_dir)).unwrap();
    std::fs::create_dir_all(staging.path().join(lib_dir)).unwrap();
    for lib in ["libc.so.6", "ld-linux-x86-64.so.2"] {
        std::fs::copy(
            Path::new("/lib/x86_64-linux-gnu").join(lib),
            staging.path().join(lib_dir).join(lib),
        )
        .unwrap();
    }
    let compiled = std::process::Command::new("gcc")
        .args(["-O2", "-g", "-pthread", "-o"])
        .arg(staging.path().join(app_dir).join("naming"))
        .arg(repo_root().join("fixtures/naming.c"))
        .arg(format!(
            "-Wl,--dynamic-linker=/{lib_dir}/ld-linux-x86-64.so.2"
        ))
        .arg(format!("-Wl,-rpath=/{lib_dir}"))
        .status()
        .unwrap();
    assert!(compiled.success());

    // sh execs chroot, which execs the fixture: one pid, the host's.
    let script =
        r#"mount -t tmpfs locktrace-ctr "$1" && cp -a "$2"/. "$1"/ && shift 2 && exec chroot "$@""#;
    let mut command = std::process::Command::new("unshare");
    command
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(mount_point.path())
        .arg(staging.path())
        .arg(mount_point.path())
        .arg(format!("/{app_dir}/naming"))
        .args([&READS.to_string(), &WRITES.to_string(), "60"]);
    let mut fixture = Fixture::spawn_command(&mut command);
    drop(staging);
    let pid = fixture.pid();
    let own_namespace = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    assert_ne!(
        own_namespace,
        std::fs::read_link("/proc/self/ns/mnt").unwrap()
    );
    // The target's executable and libc, by the paths its maps give, are not on the host.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let paths: std::collections::BTreeSet<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/'))
        .collect();
    assert!(
        paths
            .iter()
            .any(|p| p.ends_with(&format!("/{lib_dir}/libc.so.6"))),
        "{paths:?}"
    );
    for path in &paths {
        assert!(!Path::new(path).exists(), "{path} exists on the host");
    }

    let trace = Trace::attach(pid, &[]);
    assert!(
        trace
            .stderr_lines
            .iter()
            .any(|line| line.contains(&format!("/{lib_dir}/libc.so.6"))),
        "{:?}",
        trace.stderr_lines
    );
    fixture.start();
    assert!(fixture.read_line().unwrap().starts_with("done"));
    trace.interrupt();
    let (report, _) = trace.finish();
    let exe = report["target"]["exe"].as_str().unwrap().to_string();
    assert!(exe.ends_with(&format!("/{app_dir}/naming")), "{exe}");
    check_named(&report, &fixture, Path::new(&exe), Flavor::Glibc);
}

/// Rust's std Mutex takes no pthread lock: its futex word is reported, named
/// by its static's (demangled) symbol, and its contended waits attributed to
/// the function that wanted the lock (from the futex-wait stacks; the
/// fixture keeps frame pointers, std's own frames are skipped).
#[test]
fn rust_std_mutex_futex_named_and_attributed() {
    let binary = rust_mutex_fixture();
    let (report, addresses) = trace_fixture(&binary, &["4", "100000"], &["--stacks", "4"]);
    let counter = addresses["counter"][0];
    let lock = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|lock| {
            let address = u64::from_str_radix(
                lock["address"].as_str().unwrap().trim_start_matches("0x"),
                16,
            )
            .unwrap();
            (counter..counter + 16).contains(&address)
        })
        .unwrap_or_else(|| panic!("no futex of COUNTER in {report}"));
    assert_eq!(lock["kind"], "futex");
    assert_eq!(lock["name"], "rust_mutex::COUNTER");
    assert_eq!(lock["region"], ".bss");
    let contended = lock["contended"].as_u64().unwrap();
    assert!(contended > 0, "the fixture did not contend: {lock}");
    assert_eq!(
        callers(lock),
        owned(&[("rust_mutex::bump_counter", contended)])
    );
    // DWARF types it `Mutex<u64>`: its waits are lock contention (issue 35
    // item 13: they were 'not lock contention'), in the totals too.
    assert_eq!(lock["wait_class"], "lock", "{lock:#}");
    assert_eq!(lock["declared"]["contention"], "futex_lock", "{lock:#}");
    let declared = lock["declared"]["type"].as_str().unwrap_or_default();
    assert!(declared.starts_with("Mutex<"), "{lock:#}");
    assert_eq!(
        report["totals"]["contended"],
        contention_in_rows(&report),
        "{}",
        report["totals"]
    );
}

const STATS: u64 = 4000;
const REGISTRY: u64 = 3000;
const SLOT: u64 = 2000;

/// Runs the mysqlnd-shaped fixture; `linger` seconds after its work it
/// exits. With `interrupt`, the recording stops while it is still alive.
fn trace_mysqlnd(binary: &Path, linger: u32, interrupt: bool) -> (Value, Fixture) {
    let mut fixture = Fixture::spawn(
        binary,
        &[
            &STATS.to_string(),
            &REGISTRY.to_string(),
            &SLOT.to_string(),
            &linger.to_string(),
        ],
    );
    let trace = Trace::attach(fixture.pid(), &["--duration", "60"]);
    fixture.start();
    let done = fixture
        .read_line()
        .expect("fixture printed nothing after its work");
    assert_eq!(done, "done");
    if interrupt {
        trace.interrupt();
    }
    let (report, _table) = trace.finish();
    (report, fixture)
}

/// The fixture's locks inside g_registry: names and exact counts.
fn assert_struct_locks(report: &Value, fixture: &Fixture, (registry, slot): (&str, &str)) {
    for (address, name, count) in [("registry", registry, REGISTRY), ("slot", slot, SLOT)] {
        let lock = lock_at(report, fixture.address(address)).expect("lock in report");
        assert_eq!(lock["name"], name);
        assert_eq!(lock["acquisitions"], count);
    }
    let registry_lock = lock_at(report, fixture.address("registry")).unwrap();
    assert_eq!(registry_lock["offset_name"], "g_registry+0x68");
    let slot_lock = lock_at(report, fixture.address("slot")).unwrap();
    assert_eq!(slot_lock["offset_name"], "g_registry+0x90");
}

/// Issue 10: built with -g, the heap statistics mutex is named by the
/// field that points to it, through the typed global pointer (the direct
/// route), with the registry route as the alternative; globals inside a
/// struct by array element and union member. Exact counts.
#[test]
fn mysqlnd_shaped_names_from_debug_info() {
    let binary = fixture("mysqlnd_stats", Flavor::Glibc);
    let (report, fixture) = trace_mysqlnd(&binary, 60, true);
    let module = binary.to_str().unwrap();
    let stats = lock_at(&report, fixture.address("stats")).expect("stats lock in report");
    assert_eq!(
        stats["name"], "*g_global_stats->LOCK_access",
        "{}",
        report["naming"]
    );
    assert_eq!(stats["offset_name"], "*g_global_stats->+0x10");
    assert_eq!(
        stats["chain"],
        serde_json::json!({"module": module, "root": "g_global_stats", "offsets": [0, 0x10, 0]})
    );
    assert_eq!(
        stats["alternatives"][0],
        serde_json::json!({
            "name": "*g_plugin_core.plugin_header.plugin_stats->LOCK_access",
            "offset_name": "*g_plugin_core+0x30->+0x10",
            "chain": {"module": module, "root": "g_plugin_core", "offsets": [0x30, 0x10, 0]},
        })
    );
    assert_eq!(stats["acquisitions"], STATS);
    assert_eq!(callers(stats), owned(&[("stats_add", STATS)]));

    assert_struct_locks(
        &report,
        &fixture,
        ("g_registry.locks[2]", "g_registry.slot.mutex"),
    );
    assert!(
        report["naming"]["debug_info"]
            .to_string()
            .contains(&format!("{module} <- {module}")),
        "{}",
        report["naming"]
    );
}

/// Without debug info the same rule picks the same root, in offsets.
#[test]
fn mysqlnd_shaped_names_without_debug_info() {
    let binary = fixture_with("mysqlnd_stats", Flavor::Glibc, &["-g0"]);
    let (report, fixture) = trace_mysqlnd(&binary, 60, true);
    let stats = lock_at(&report, fixture.address("stats")).expect("stats lock in report");
    assert_eq!(
        stats["name"], "*g_global_stats->+0x10",
        "{}",
        report["naming"]
    );
    assert_eq!(stats["offset_name"], "*g_global_stats->+0x10");
    assert_eq!(
        stats["alternatives"][0]["name"],
        "*g_plugin_core+0x30->+0x10"
    );
    assert_eq!(stats["acquisitions"], STATS);
    assert_struct_locks(&report, &fixture, ("g_registry+0x68", "g_registry+0x90"));
}

/// A target that exits one second after its work, before the recording
/// ends: its heap lock keeps the name found while it was alive.
#[test]
fn heap_names_kept_after_target_exit() {
    let binary = fixture("mysqlnd_stats", Flavor::Glibc);
    let (report, fixture) = trace_mysqlnd(&binary, 1, false);
    assert_eq!(report["stopped_by"], "target_exited");
    let stats = lock_at(&report, fixture.address("stats")).expect("stats lock in report");
    assert_eq!(
        stats["name"], "*g_global_stats->LOCK_access",
        "{}",
        report["naming"]
    );
    assert_eq!(stats["acquisitions"], STATS);
    let naming = &report["naming"];
    assert!(
        naming["pointer_chains"]
            .as_str()
            .unwrap()
            .starts_with("1 of 1 heap locks named by pointer chains found during the recording"),
        "{naming}"
    );
    let live = &naming["live"];
    assert!(live["searches"].as_u64().unwrap() >= 1, "{naming}");
    assert_eq!(live["heap_locks_named"], 1, "{naming}");
    // Bounded: each search has a 250 ms budget.
    assert!(live["max_search_ms"].as_f64().unwrap() < 1000.0, "{naming}");
}
