//! compare's unit tests: reports written to a temporary folder, compared.
use super::{assertions::*, side::*, table::*, *};
use crate::model::Report;

/// The group whose identity is written `written`.
fn group_of<'s>(side: &'s Side, written: &str) -> Option<&'s Group> {
    side.groups
        .iter()
        .find(|(identity, _)| identity.to_string() == written)
        .map(|(_, group)| group)
}
use serde_json::Value;

/// A minimal report with requests; `locks` as JSON (naming's fields optional).
fn write_report(dir: &std::path::Path, file: &str, requests: u64, locks: Value) -> PathBuf {
    let report = serde_json::json!({
        "schema": crate::model::SCHEMA,
        "target": {"pid": 1, "exe": "/x", "cmdline": []},
        "duration_s": 1.0,
        "mode": "all",
        "locks": locks,
        "dropped": {},
        "totals": {"acquisitions": 0, "contended": 0, "wakes": 0, "wait_ns": 0},
        "requests": {"source": "given", "count": requests},
    });
    let path = dir.join(file);
    std::fs::write(&path, report.to_string()).unwrap();
    path
}

/// Gives a written report a `cpu` block with the target's CPU time.
fn set_target_cpu(path: &Path, target_ns: u64) {
    let mut report: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    report["cpu"] = serde_json::json!({"target_ns": target_ns, "lock_code_ns": null,
        "lock_code_error_ns": null, "samples": 0, "sample_hz": 999, "tracer_ns": 0});
    std::fs::write(path, report.to_string()).unwrap();
}

/// A report of `mode` with 10 requests and the lock `g_lock` (or none).
fn write_mode_report(
    dir: &std::path::Path,
    file: &str,
    mode: &str,
    lock: Option<Value>,
) -> PathBuf {
    let path = write_report(dir, file, 10, Value::Array(lock.into_iter().collect()));
    let mut report: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    report["mode"] = mode.into();
    if mode == "sampled" {
        report["estimate"] = serde_json::json!({
            "estimated": [], "sample_rate": 0.1, "windows": 12, "counted_s": 1.2,
            "total_s": 12.0, "scale": 10.0, "unsampled_edges_s": 0.1,
            "relative_error": 0.1, "probe_time_share": 0.0,
            "per_request_relative_error": 0.05,
        });
    }
    std::fs::write(&path, report.to_string()).unwrap();
    path
}

/// Two locks of one name whose counts sum past 2^64 (a crafted
/// report): the group saturates instead of wrapping to a small number
/// that `--assert-max` would pass.
#[test]
fn sums_near_two_to_the_64_saturate() {
    let dir = tempfile::tempdir().unwrap();
    let big = u64::MAX - 1;
    let locks = serde_json::json!([
        lock("0x1", big, serde_json::json!({"name": "g_lock"})),
        lock("0x2", big, serde_json::json!({"name": "g_lock"})),
    ]);
    let before = write_report(dir.path(), "b.json", 1, locks.clone());
    let after = write_report(dir.path(), "a.json", 1, locks);
    let outcome = evaluate(
        &before,
        &after,
        &[],
        &["g_lock=1000".into()],
        Width::Unlimited,
    )
    .unwrap();
    assert_eq!(outcome.failures.len(), 1, "{}", outcome.text);
}

#[test]
fn a_contention_report_is_not_compared_with_one_that_counted_acquisitions() {
    let dir = tempfile::tempdir().unwrap();
    let before = write_mode_report(
        dir.path(),
        "b.json",
        "all",
        Some(lock("0x1", 80, serde_json::json!({"name": "g_lock"}))),
    );
    let after = write_mode_report(dir.path(), "a.json", "contention", None);
    let error = evaluate(&before, &after, &["g_lock".into()], &[], Width::Unlimited).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{} was recorded with --mode all and {} with --mode contention, which counts no acquisitions (a lock missing there may still be taken); record both with the same --mode",
            before.display(),
            after.display()
        )
    );
    assert!(evaluate(&after, &before, &[], &[], Width::Unlimited).is_err());
}

#[test]
fn contention_reports_assert_nothing_about_acquisitions() {
    let dir = tempfile::tempdir().unwrap();
    let mut waited = lock(
        "0x1",
        0,
        serde_json::json!({"name": "g_lock", "contended": 5}),
    );
    waited["acquisitions"] = Value::Null;
    let before = write_mode_report(dir.path(), "b.json", "contention", Some(waited));
    let after = write_mode_report(dir.path(), "a.json", "contention", None);
    let outcome = evaluate(
        &before,
        &after,
        &["g_lock".into()],
        &["g_lock=1".into()],
        Width::Unlimited,
    )
    .unwrap();
    assert!(!outcome.text.contains("disappeared"), "{}", outcome.text);
    assert!(!outcome.text.contains("%"), "{}", outcome.text);
    assert!(outcome.text.contains("not counted"), "{}", outcome.text);
    assert!(outcome.text.contains("no waits after"), "{}", outcome.text);
    assert_eq!(outcome.failures.len(), 2, "{:?}", outcome.failures);
    assert!(outcome.failures[0].starts_with("--assert-gone \"g_lock\" cannot be checked"));
}

#[test]
fn sampled_reports_show_their_bounds_and_assert_within_them() {
    let dir = tempfile::tempdir().unwrap();
    let sampled = |acquisitions: u64, error: f64| {
        lock(
            "0x1",
            acquisitions,
            serde_json::json!({"name": "g_lock",
            "per_request": {"acquisitions": acquisitions as f64 / 10.0, "acquisitions_error": error, "contended": 0.0, "wait_ns": 0.0}}),
        )
    };
    let before = write_mode_report(dir.path(), "b.json", "sampled", Some(sampled(80, 0.5)));
    let after = write_mode_report(dir.path(), "a.json", "sampled", Some(sampled(78, 0.5)));
    // 7.8 ± 0.5 per request: below 8, but its bound reaches 8.3.
    let outcome = evaluate(&before, &after, &[], &["g_lock=8".into()], Width::Unlimited).unwrap();
    assert!(outcome.text.contains("~8.0 ±0.50"), "{}", outcome.text);
    assert!(outcome.text.contains("~7.80 ±0.50"), "{}", outcome.text);
    assert!(
        outcome.text.contains("within the bounds"),
        "{}",
        outcome.text
    );
    assert_eq!(outcome.failures.len(), 1, "{}", outcome.text);
    let outcome = evaluate(
        &before,
        &after,
        &[],
        &["g_lock=8.3".into()],
        Width::Unlimited,
    )
    .unwrap();
    assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
    // Not seen in a sampled report: said so, never "disappeared".
    let gone = write_mode_report(dir.path(), "g.json", "sampled", None);
    let outcome = evaluate(&before, &gone, &["g_lock".into()], &[], Width::Unlimited).unwrap();
    assert!(
        outcome.text.contains("not seen after (sampled)"),
        "{}",
        outcome.text
    );
    assert!(
        outcome.text.contains("was seen in the 12 sampling windows"),
        "{}",
        outcome.text
    );
}

fn lock(address: &str, acquisitions: u64, extra: Value) -> Value {
    let mut lock = serde_json::json!({
        "address": address, "kind": "mutex", "acquisitions": acquisitions,
        "contended": 0, "wakes": 0, "wait_ns": 0, "max_wait_ns": 0,
    });
    for (key, value) in extra.as_object().unwrap() {
        lock[key] = value.clone();
    }
    lock
}

/// A row grouped by creation site (three addresses) matches the same
/// site's per-address rows of a run recorded with `--group-by address`:
/// one identity, its addresses counted, acquisitions summed.
#[test]
fn grouped_rows_match_per_address_rows_by_creation_site() {
    let dir = tempfile::tempdir().unwrap();
    let site = "mutex created in conn_create <- serve_request <- worker";
    let grouped = serde_json::json!({"name": site, "group": {
        "addresses": 3, "objects": 40, "by_address": []}});
    let before = write_report(
        dir.path(),
        "before.json",
        10,
        serde_json::json!([lock("0x1000", 30, grouped)]),
    );
    let named = serde_json::json!({"name": site});
    let after = write_report(
        dir.path(),
        "after.json",
        10,
        serde_json::json!([lock("0x7000", 20, named.clone()), lock("0x7100", 10, named)]),
    );
    let before = Side::load(&before).unwrap();
    let after = Side::load(&after).unwrap();
    let identity = before.groups.keys().find(|id| id.to_string() == site);
    let row = compare_row(&before, &after, identity.unwrap());
    assert_eq!(row[1..4], ["3/2", "3.0", "3.0"]);
}

/// A stack of `count` `source` events on `lock`, `functions` outermost first.
fn stack(lock: &str, count: u64, source: &str, functions: &[&str]) -> Value {
    let frames: Vec<Value> = functions
        .iter()
        .rev()
        .enumerate()
        .map(|(at, f)| serde_json::json!({"function": f, "module": "/x", "offset": at}))
        .collect();
    serde_json::json!({"lock": lock, "count": count, "frames": frames,
        "unwound_by": "call_frame_info", "source": source})
}

/// Writes a report of `requests` with `locks` and `stacks`.
fn write_stacks_report(
    dir: &std::path::Path,
    file: &str,
    requests: u64,
    locks: Value,
    stacks: Value,
) -> PathBuf {
    let path = write_report(dir, file, requests, locks);
    let mut report: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    report["stacks"] = stacks;
    std::fs::write(&path, report.to_string()).unwrap();
    path
}

/// With stacks on both sides, a lock's lock-call paths per request
/// before and after (waits and CPU samples left out, paths that differ
/// only in offsets folded into one), appeared and disappeared ones
/// marked; a lock with stacks on one side only gets no section, and
/// locks past `--paths-of` are counted.
#[test]
fn shows_call_paths_per_request_when_both_sides_have_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let named = |name: &str| serde_json::json!({ "name": name });
    let handle = ["main", "handle", "take", "pthread_mutex_lock"];
    let flush = ["main", "flush", "pthread_mutex_lock"];
    let cache = ["main", "cache", "pthread_mutex_lock"];
    let before = write_stacks_report(
        dir.path(),
        "before.json",
        10,
        serde_json::json!([
            lock("0x1000", 60, named("g_lock")),
            lock("0x3000", 5, named("other")),
            lock("0x4000", 5, named("solo"))
        ]),
        serde_json::json!([
            stack("0x1000", 30, "lock_calls", &handle),
            stack("0x1000", 10, "lock_calls", &handle),
            stack("0x1000", 20, "lock_calls", &flush),
            stack("0x1000", 5, "waits", &["main", "handle", "futex_wait"]),
            stack("0x1000", 7, "cpu_samples", &cache),
            stack("0x3000", 5, "lock_calls", &flush),
            stack("0x4000", 5, "lock_calls", &flush),
        ]),
    );
    let after = write_stacks_report(
        dir.path(),
        "after.json",
        20,
        serde_json::json!([
            lock("0x2000", 50, named("g_lock")),
            lock("0x3000", 5, named("other")),
            lock("0x4000", 5, named("solo"))
        ]),
        serde_json::json!([
            stack("0x2000", 40, "lock_calls", &handle),
            stack("0x2000", 10, "lock_calls", &cache),
            stack("0x3000", 5, "lock_calls", &flush),
        ]),
    );
    let text = render_path_changes(
        &Side::load(&before).unwrap(),
        &Side::load(&after).unwrap(),
        1,
    );
    let section: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("call paths"))
        .collect();
    assert_eq!(
        section,
        [
            "call paths (lock calls per request, outermost;…;innermost):",
            "    before      after     change  path",
            "g_lock: 6.0 -> 2.50 per request",
            "       4.0        2.0       -2.0  main;handle;take;pthread_mutex_lock",
            "       2.0          -       -2.0  (disappeared) main;flush;pthread_mutex_lock",
            "         -       0.50      +0.50  (appeared) main;cache;pthread_mutex_lock",
            "… 1 more lock with stacks on both sides (--paths-of N)",
        ],
        "{text}"
    );
    // No stacks after: no section.
    let bare = write_report(
        dir.path(),
        "bare.json",
        10,
        serde_json::json!([lock("0x1000", 60, named("g_lock"))]),
    );
    let text = render_path_changes(
        &Side::load(&before).unwrap(),
        &Side::load(&bare).unwrap(),
        3,
    );
    assert_eq!(text, "");
}

#[test]
fn shows_hold_time_changes_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let holds = |ns: u64| serde_json::json!({"name": "g_lock", "holds": {"holds": 10, "hold_ns": ns, "max_hold_ns": ns, "histogram": [], "by_function": []}});
    let before = write_report(
        dir.path(),
        "before.json",
        10,
        serde_json::json!([lock("0x1000", 10, holds(4_000_000))]),
    );
    let after = write_report(
        dir.path(),
        "after.json",
        10,
        serde_json::json!([lock("0x1000", 10, holds(1_000_000))]),
    );
    let text = render(
        &Side::load(&before).unwrap(),
        &Side::load(&after).unwrap(),
        Width::Unlimited,
    );
    let row = text
        .lines()
        .skip_while(|line| !line.starts_with(" held per request"))
        .find(|line| line.starts_with(" g_lock "))
        .unwrap();
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(cells, ["g_lock", "400.0 µs", "100.0 µs", "-75%"], "{text}");
}

#[test]
fn shows_cpu_per_request_of_the_target_and_the_locks() {
    let dir = tempfile::tempdir().unwrap();
    let cpu = |ns: u64| serde_json::json!({"name": "g_lock", "cpu_ns": ns, "cpu_error_ns": 1});
    let before = write_report(
        dir.path(),
        "before.json",
        100,
        serde_json::json!([lock("0x1000", 10, cpu(30_000_000))]),
    );
    let after = write_report(
        dir.path(),
        "after.json",
        200,
        serde_json::json!([lock("0x1000", 10, cpu(0))]),
    );
    set_target_cpu(&before, 100_000_000);
    set_target_cpu(&after, 150_000_000);
    let text = render(
        &Side::load(&before).unwrap(),
        &Side::load(&after).unwrap(),
        Width::Unlimited,
    );
    // 1 ms per request before, 0.75 ms after; the lock 300 µs, then 0.
    assert!(
        text.contains("cpu per request: target 1.0 ms -> 750.0 µs (-25%)"),
        "{text}"
    );
    // The lock's row in the "cpu per request" table: before, after, change.
    let row: Vec<&str> = text
        .lines()
        .find(|line| line.trim_start().starts_with("g_lock") && line.contains("µs"))
        .unwrap_or_else(|| panic!("no cpu row for g_lock in:\n{text}"))
        .split('|')
        .map(str::trim)
        .collect();
    assert_eq!(row, ["g_lock", "300.0 µs", "0", "-100%"], "{text}");
}

/// Issue 32: the fall of the locks' removal price is the predicted
/// saving, set beside the target's measured CPU change.
#[test]
fn sets_the_predicted_saving_beside_the_measured_one() {
    let dir = tempfile::tempdir().unwrap();
    let priced = |name: &str, saving_ns: f64, error_ns: f64| {
        serde_json::json!({"name": name, "wait_class": "lock", "removal": {
            "saving_ns": saving_ns, "error_ns": error_ns,
            "lock_code": {"ns": saving_ns, "error_ns": error_ns, "basis": "calibrated"},
            "handoffs": null, "kernel": null}})
    };
    // 100 requests: g_stats costs 5 µs per request and goes; g_conn
    // costs 1 µs per request before and after.
    let before = write_report(
        dir.path(),
        "before.json",
        100,
        serde_json::json!([
            lock("0x1000", 10, priced("g_stats", 500_000.0, 100_000.0)),
            lock("0x2000", 10, priced("g_conn", 100_000.0, 20_000.0)),
        ]),
    );
    let after = write_report(
        dir.path(),
        "after.json",
        100,
        serde_json::json!([lock("0x2000", 10, priced("g_conn", 100_000.0, 20_000.0))]),
    );
    set_target_cpu(&before, 100_000_000);
    set_target_cpu(&after, 99_400_000);
    let text = render(
        &Side::load(&before).unwrap(),
        &Side::load(&after).unwrap(),
        Width::Unlimited,
    );
    assert!(
        text.contains(
            "predicted saving: the locks' price fell by 5.0 µs ±1.4 µs CPU per request; \
             measured: the target's CPU per request less the tracer's share fell by 6.0 µs"
        ),
        "{text}"
    );
    // A tracer that took a tenth of the target's CPU: no measured figure.
    let mut report: Value =
        serde_json::from_str(&std::fs::read_to_string(&after).unwrap()).unwrap();
    report["cpu"]["tracer_ns"] = 9_940_000.into();
    std::fs::write(&after, report.to_string()).unwrap();
    let text = render(
        &Side::load(&before).unwrap(),
        &Side::load(&after).unwrap(),
        Width::Unlimited,
    );
    assert!(
        text.contains("measured: not comparable, the tracer took 10% of the target's CPU"),
        "{text}"
    );
}

#[test]
fn matches_by_name_then_callers_never_address() {
    let dir = tempfile::tempdir().unwrap();
    let before = write_report(
        dir.path(),
        "before.json",
        10,
        serde_json::json!([
            lock(
                "0x1000",
                80,
                serde_json::json!({"name": "g_stats->lock", "callers": [{"function": "global_stats_add", "module": "httpd", "offset": 16, "count": 80}]})
            ),
            lock(
                "0x2000",
                30,
                serde_json::json!({"callers": [{"function": "conn_counter_add", "module": "httpd", "offset": 9, "count": 1}]})
            ),
            lock(
                "0x3000",
                50,
                serde_json::json!({"callers": [{"function": "conn_counter_add", "module": "httpd", "offset": 9, "count": 1}]})
            ),
            lock("0x4000", 5, serde_json::json!({"name": "0x4000"})),
        ]),
    );
    let after = write_report(
        dir.path(),
        "after.json",
        20,
        serde_json::json!([lock(
            "0x9000",
            160,
            serde_json::json!({"callers": [{"function": "conn_counter_add", "module": "httpd", "offset": 9, "count": 1}]})
        ),]),
    );
    let before = Side::load(&before).unwrap();
    let after = Side::load(&after).unwrap();
    assert_eq!(before.groups.len(), 3);
    assert_eq!(group_of(&before, "g_stats->lock").unwrap().acquisitions, 80);
    // Two per-connection mutexes, one identity; matched across runs whatever their addresses.
    let connections = &group_of(&before, "mutex via conn_counter_add").unwrap();
    assert_eq!((connections.locks, connections.acquisitions), (2, 80));
    assert_eq!(
        after.per_request(
            group_of(&after, "mutex via conn_counter_add")
                .unwrap()
                .acquisitions
        ),
        8.0
    );
    assert!(group_of(&before, "unidentified mutex").is_some());
    // Selectors search names and caller functions.
    assert_eq!(before.matching("global_stats").count(), 1);
    assert_eq!(before.matching("g_stats->").count(), 1);
    assert_eq!(after.matching("global_stats").count(), 0);
}

/// Reports from before field names (the lock named in offsets, by the
/// registry route) and from before C notation (`g_stats->+0x10->`,
/// `g_stats->LOCK_access` for the lock that field points to) compare
/// with one that has both: one row.
#[test]
fn matches_old_offset_names_and_spellings() {
    let dir = tempfile::tempdir().unwrap();
    let old = |file: &str, acquisitions: u64, names: Value| {
        let locks = serde_json::json!([lock("0x1000", acquisitions, names)]);
        write_report(dir.path(), file, 10, locks)
    };
    let olds = [
        (
            old(
                "registry.json",
                80,
                serde_json::json!({"name": "g_plugin_core+0x30->+0x10->"}),
            ),
            80,
        ),
        (
            old(
                "offsets.json",
                40,
                serde_json::json!({"name": "g_global_stats->+0x10->"}),
            ),
            40,
        ),
        (
            old(
                "fields.json",
                30,
                serde_json::json!({"name": "g_global_stats->LOCK_access", "offset_name": "g_global_stats->+0x10->"}),
            ),
            30,
        ),
    ];
    let new = write_report(
        dir.path(),
        "new.json",
        10,
        serde_json::json!([lock(
            "0x2000",
            20,
            serde_json::json!({
                "name": "*g_global_stats->LOCK_access",
                "offset_name": "*g_global_stats->+0x10",
                "alternatives": [{
                    "name": "*g_plugin_core.plugin_header.plugin_stats->LOCK_access",
                    "offset_name": "*g_plugin_core+0x30->+0x10",
                    "chain": {"module": "/x", "root": "g_plugin_core", "offsets": [48, 16, 0]},
                }],
            })
        )]),
    );
    for (old, acquisitions) in &olds {
        let mut before = Side::load(old).unwrap();
        let mut after = Side::load(&new).unwrap();
        unify(&mut before, &mut after);
        assert_eq!(before.groups.len(), 1, "{old:?}");
        assert_eq!(
            before.groups.keys().collect::<Vec<_>>(),
            after.groups.keys().collect::<Vec<_>>()
        );
        let group = before.groups.values().next().unwrap();
        assert_eq!(group.acquisitions, *acquisitions);
        let table = render(&before, &after, Width::Unlimited);
        assert!(!table.contains("disappeared"), "{table}");
        // Selectors find it by any of its names, old spellings included.
        assert_eq!(after.matching("*g_global_stats->+0x10").count(), 1);
        let spelled = Report::load(old).unwrap().locks[0].name.clone().unwrap();
        assert_eq!(before.matching(&spelled).count(), 1, "{spelled}");
        // Old on the after side works too.
        let mut before = Side::load(&new).unwrap();
        let mut after = Side::load(old).unwrap();
        unify(&mut before, &mut after);
        assert!(group_of(&after, "*g_global_stats->LOCK_access").is_some());
    }
}

#[test]
fn condvars_match_condvars_and_assertions_select_locks() {
    let dir = tempfile::tempdir().unwrap();
    let locks = serde_json::json!([
        lock("0x1000", 20, serde_json::json!({"name": "*g_pool"})),
        lock(
            "0x1028",
            0,
            serde_json::json!({"name": "*g_pool", "kind": "condvar", "wait_class": "condvar", "acquisitions": null, "contended": 30})
        ),
    ]);
    let side = Side::load(&write_report(dir.path(), "r.json", 10, locks)).unwrap();
    assert_eq!(group_of(&side, "*g_pool").unwrap().acquisitions, 20);
    assert_eq!(group_of(&side, "*g_pool").unwrap().contended, 0);
    assert_eq!(group_of(&side, "[condvar] *g_pool").unwrap().contended, 30);
    let selected: Vec<String> = side
        .matching("g_pool")
        .map(|(id, _)| id.to_string())
        .collect();
    assert_eq!(selected, ["*g_pool"]);
}

#[test]
fn refuses_reports_without_requests() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_report(dir.path(), "r.json", 0, serde_json::json!([]));
    let error = Side::load(&path).err().unwrap().to_string();
    assert!(error.contains("no request count"), "{error}");
}

#[test]
fn assert_max_fails_on_a_selector_that_matches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let locks = serde_json::json!([lock(
        "0x1000",
        40,
        serde_json::json!({"name": "g_stats->lock"})
    )]);
    let before = write_report(dir.path(), "before.json", 10, locks.clone());
    let after = write_report(dir.path(), "after.json", 10, locks);
    let max =
        |spec: &str| evaluate(&before, &after, &[], &[spec.to_string()], Width::Unlimited).unwrap();
    let typo = max("nosuchlock=0");
    assert_eq!(typo.failures.len(), 1, "{typo:?}");
    assert!(
        typo.failures[0].contains("\"nosuchlock\" matches no lock"),
        "{typo:?}"
    );
    // A selector that matches still passes or fails on the figure.
    assert_eq!(max("g_stats=4").failures, Vec::<String>::new());
    assert_eq!(max("g_stats=3.9").failures.len(), 1);
}

#[test]
fn parses_limits() {
    assert_eq!(
        parse_max("global_stats_add=0").unwrap(),
        ("global_stats_add".to_string(), 0.0)
    );
    assert_eq!(parse_max("a=b=2.5").unwrap(), ("a=b".to_string(), 2.5));
    assert!(parse_max("x").is_err());
    assert!(parse_max("x=-1").is_err());
    assert!(parse_max("=1").is_err());
}

/// The cells of a table line (`a | b | c`).
fn table_cells(line: &str) -> Vec<&str> {
    line.split('|').map(str::trim).collect()
}

/// Gives a written report a `kernel_locks` section of `(name, kind, flags,
/// contentions, wait_ns)` rows, or the unavailable reason.
fn set_kernel_locks(
    path: &Path,
    rows: &[(Option<&str>, &str, u32, u64, u64)],
    unavailable: Option<&str>,
) {
    let mut report: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let locks: Vec<Value> = rows
        .iter()
        .enumerate()
        .map(|(i, (name, kind, flags, contentions, wait_ns))| {
            serde_json::json!({"address": format!("{:#x}", 0xffff_0000u64 + i as u64), "name": name,
                "kind": kind, "flags": flags, "contentions": contentions, "wait_ns": wait_ns,
                "max_wait_ns": wait_ns, "kernel_sites": [], "user_sites": []})
        })
        .collect();
    report["kernel_locks"] = serde_json::json!({"locks": locks, "contentions": 0, "wait_ns": 0,
        "nested": 0, "lost": 0});
    if let Some(reason) = unavailable {
        report["kernel_locks"]["unavailable"] = reason.into();
    }
    std::fs::write(path, report.to_string()).unwrap();
}

/// Kernel locks before and after, per request: rows of one name and kind
/// add up (two runqueue locks), unnamed ones add up as `unnamed`, a lock on
/// one side only is `gone` or `new`; the user lock's kernel wait per
/// request; the exit code unchanged (no assertion asked).
#[test]
fn kernel_locks_before_and_after_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let g_lock = |kernel_wait: u64| {
        serde_json::json!([lock(
            "0x10",
            100,
            serde_json::json!({"name": "g_lock",
            "kernel_contentions": 4, "kernel_wait_ns": kernel_wait})
        )])
    };
    let before = write_report(dir.path(), "b.json", 10, g_lock(50_000));
    let after = write_report(dir.path(), "a.json", 10, g_lock(20_000));
    set_kernel_locks(
        &before,
        &[
            (Some("mmap_lock"), "rwsem_write", 4, 110, 3_000_000),
            (Some("runqueue"), "spinlock", 1, 3, 30_000),
            (Some("runqueue"), "spinlock", 1, 2, 20_000),
            (None, "spinlock", 1, 5, 10_000),
            (None, "spinlock", 1, 5, 10_000),
        ],
        None,
    );
    set_kernel_locks(
        &after,
        &[
            (Some("mmap_lock"), "rwsem_write", 4, 11, 1_500_000),
            (Some("futex hash bucket"), "spinlock", 1, 7, 7_000),
        ],
        None,
    );
    let outcome = evaluate(&before, &after, &[], &[], Width::Unlimited).unwrap();
    assert!(outcome.failures.is_empty());
    let section = outcome
        .text
        .split("kernel locks (per request, before -> after):\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{}", outcome.text));
    let lines: Vec<Vec<&str>> = section
        .lines()
        .filter(|line| !line.starts_with("---"))
        .take(5)
        .map(table_cells)
        .collect();
    assert_eq!(
        lines,
        vec![
            vec![
                "kernel lock",
                "contentions before",
                "contentions after",
                "wait before",
                "wait after",
                "change"
            ],
            vec![
                "mmap_lock (rwsem write)",
                "11.0",
                "1.10",
                "300.0 µs",
                "150.0 µs",
                "-50%"
            ],
            vec!["runqueue (spinlock)", "0.50", "-", "5.0 µs", "-", "gone"],
            vec!["unnamed (spinlock)", "1.0", "-", "2.0 µs", "-", "gone"],
            vec![
                "futex hash bucket (spinlock)",
                "-",
                "0.70",
                "-",
                "700 ns",
                "new"
            ],
        ],
        "{section}"
    );
    let kernel_wait = outcome
        .text
        .lines()
        .skip_while(|line| !line.starts_with(" kernel lock wait per request"))
        .nth(2)
        .unwrap_or_else(|| panic!("{}", outcome.text));
    assert_eq!(
        table_cells(kernel_wait),
        ["g_lock", "5.0 µs", "2.0 µs", "-60%"],
        "{}",
        outcome.text
    );
}

/// A side whose kernel had no lock tracepoints says so in one line; a
/// report from before the section says it was not traced.
#[test]
fn kernel_locks_unavailable_on_one_side_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let locks = serde_json::json!([lock("0x10", 100, serde_json::json!({"name": "g_lock"}))]);
    let before = write_report(dir.path(), "b.json", 10, locks.clone());
    let after = write_report(dir.path(), "a.json", 10, locks.clone());
    let reason = "this kernel has no lock:contention_begin tracepoint (Linux 5.19+ has it)";
    set_kernel_locks(&before, &[], Some(reason));
    set_kernel_locks(
        &after,
        &[(Some("mmap_lock"), "rwsem_read", 2, 30, 60_000)],
        None,
    );
    let outcome = evaluate(&before, &after, &[], &[], Width::Unlimited).unwrap();
    assert!(
        outcome
            .text
            .contains(&format!("  before: unavailable: {reason}\n")),
        "{}",
        outcome.text
    );
    assert!(
        outcome.text.contains("mmap_lock (rwsem read)"),
        "{}",
        outcome.text
    );
    let plain = write_report(dir.path(), "p.json", 10, locks);
    let outcome = evaluate(&plain, &after, &[], &[], Width::Unlimited).unwrap();
    assert!(
        outcome
            .text
            .contains("  before: not traced (a report from before kernel locks)\n"),
        "{}",
        outcome.text
    );
    // Neither side traced: no section.
    let outcome = evaluate(&plain, &plain, &[], &[], Width::Unlimited).unwrap();
    assert!(!outcome.text.contains("kernel locks"), "{}", outcome.text);
}
