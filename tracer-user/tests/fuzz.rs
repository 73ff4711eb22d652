//! Fuzz targets (proptest) for the readers of untrusted input: the report
//! parser (`report`, `compare` read files anyone may hand them), `compare`'s
//! selectors, and the ELF readers (they read the files a traced process maps).
//!
//! Each target runs 256 cases per round, at least one round; set
//! FUZZ_SECONDS to keep it going that long, e.g. for 10 minutes each:
//!
//!     FUZZ_SECONDS=600 cargo test -p tracer-user --test fuzz -- --nocapture --test-threads 1
//!
//! Debug builds (the test profile) check integer overflow, so an overflow on
//! hostile sizes is a finding too. A finding fails the test with the shrunk input.
use std::{
    fmt::Debug,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use locktrace::{
    compare,
    model::Report,
    naming::{elf::ModuleSymbols, region::AddressSpace},
    probe::target::Mapping,
    render::{self, OutputFormat, Sink, TableOptions, fit::Width, table},
};
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use serde_json::{Value, json};

/// Runs `test` on cases from `strategy` in rounds until FUZZ_SECONDS pass (one round at least).
fn fuzz<S>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: Debug,
{
    let seconds: u64 = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut cases = 0u64;
    loop {
        let mut runner = TestRunner::new(Config {
            cases: 256,
            failure_persistence: None,
            ..Config::default()
        });
        if let Err(failure) = runner.run(&strategy, &test) {
            panic!("fuzz {name}: finding after {cases} cases: {failure}");
        }
        cases += 256;
        if Instant::now() >= deadline {
            break;
        }
    }
    eprintln!("fuzz {name}: {cases} cases, no finding");
}

/// A report using every field the schema has, as `record` writes it.
fn full_report() -> Value {
    json!({
        "schema": "locktrace.report/1",
        "target": {"pid": 42, "exe": "/usr/bin/httpd", "cmdline": ["httpd", "-X"]},
        "duration_s": 2.5,
        "mode": "sampled",
        "placement": "auto",
        "stopped_by": "load_done",
        "locks": [
            {"address": "0x5555aaaa1000", "kind": "mutex", "acquisitions": 4000,
             "calls": {"pthread_mutex_lock": 3990, "pthread_mutex_trylock": 10},
             "contended": 12, "wakes": 11, "wait_ns": 900000, "max_wait_ns": 120000,
             "per_request": {"acquisitions": 4.0, "contended": 0.012, "wait_ns": 900.0},
             "name": "g_stats->lock", "region": ".bss", "module": "/usr/bin/httpd",
             "callers": [{"function": "global_stats_add", "module": "/usr/bin/httpd", "offset": 16, "count": 4000},
                         {"function": null, "module": null, "offset": 77, "count": 1}],
             "acquisitions_error": 40},
            {"address": "0x7f0000001000", "kind": "rwlock", "acquisitions": 10,
             "calls": {"pthread_rwlock_rdlock": 10}, "contended": 0, "wakes": 0,
             "wait_ns": 0, "max_wait_ns": 0, "per_request": null, "name": null,
             "region": "[heap]", "module": null,
             "callers": [{"function": "conn_counter_add", "module": "httpd", "offset": 9, "count": 10}]},
            {"address": "0x7f0000002000", "kind": "futex", "acquisitions": null,
             "contended": 3, "wakes": 3, "wait_ns": 30, "max_wait_ns": 20,
             "region": "anonymous"}
        ],
        "stacks": [
            {"lock": "0x5555aaaa1000", "count": 4000, "frames": [
                {"function": "global_stats_add", "module": "/usr/bin/httpd", "offset": 16},
                {"function": null, "module": null, "offset": 140_737_488_355_328u64}]}
        ],
        "naming": {"elapsed_ms": 3.5, "modules": 3, "debug_files": ["libc <- /usr/lib/debug/x"],
                   "pointer_chains": "1 named", "stripped": ["libz.so"]},
        "dropped": {"stacks_lost": 2, "locks_map_full": 1},
        "totals": {"acquisitions": 4010, "contended": 15, "wakes": 14, "wait_ns": 900030,
                   "per_request": {"acquisitions": 4.01, "contended": 0.015, "wait_ns": 900.03}},
        "requests": {"source": "load", "count": 1000, "statuses": {"200": 1000},
                     "unexpected": {}, "errors": 0, "retries": 0},
        "placement_fallbacks": [{"function": "pthread_mutex_lock", "module": "libc.so.6", "reason": "x"}],
        "estimate": {"estimated": ["locks[].acquisitions"], "sample_rate": 0.1, "windows": 5,
                     "counted_s": 0.5, "total_s": 2.5, "scale": 5.0, "unsampled_edges_s": 0.1,
                     "relative_error": 0.14, "probe_time_share": 0.9},
        "overhead": {"probe_hits": 400, "request_probe_hits": 0, "emulated_points": 3,
                     "stepped_points": 1, "estimated_added_ns": 4000, "cost_ns_per_emulated_hit": 1000,
                     "cost_ns_per_stepped_hit": 10000, "cost_source": "x", "attach_ms": 12,
                     "tracer_cpu_s": 0.1, "tracer_peak_rss_kib": 20000},
        "coverage": {"children_followed": false,
                     "exec": {"after_s": 1.0, "exe": "/bin/static", "not_counted": "all_lock_calls"}}
    })
}

/// JSON values of every type, including the awkward numbers.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN", |f| f.is_finite())
            .prop_map(Value::from),
        prop_oneof![
            Just("0x".to_string()),
            Just("0xffffffffffffffffffff".to_string()),
            Just("-0x1".to_string()),
            Just("locktrace.report/1".to_string()),
            Just(String::new()),
            ".{0,12}",
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{0,10}", inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Every path (object keys, array indices) to a value in `value`.
fn paths(value: &Value, prefix: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    out.push(prefix.clone());
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                prefix.push(Value::from(key.as_str()));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                prefix.push(Value::from(index));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn at_path<'a>(value: &'a mut Value, path: &[Value]) -> Option<&'a mut Value> {
    path.iter().try_fold(value, |value, step| match step {
        Value::String(key) => value.get_mut(key.as_str()),
        Value::Number(index) => value.get_mut(index.as_u64()? as usize),
        _ => None,
    })
}

/// One change to a report: a value replaced or removed, or raw bytes edited.
#[derive(Debug, Clone)]
enum Mutation {
    Replace(prop::sample::Index, Value),
    Remove(prop::sample::Index),
    Bytes(prop::sample::Index, Vec<u8>, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<prop::sample::Index>(), any_json()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        1 => any::<prop::sample::Index>().prop_map(Mutation::Remove),
        2 => (any::<prop::sample::Index>(), prop::collection::vec(any::<u8>(), 0..8), 0usize..8)
            .prop_map(|(i, bytes, cut)| Mutation::Bytes(i, bytes, cut)),
    ]
}

fn mutate(mut report: Value, mutations: &[Mutation]) -> Vec<u8> {
    let mut raw: Option<Vec<u8>> = None;
    for mutation in mutations {
        if let Some(bytes) = raw.as_mut() {
            if let Mutation::Bytes(at, insert, cut) = mutation {
                let start = at.index(bytes.len() + 1);
                let end = (start + cut).min(bytes.len());
                bytes.splice(start..end, insert.iter().copied());
            }
            continue;
        }
        let mut all = Vec::new();
        paths(&report, &mut Vec::new(), &mut all);
        match mutation {
            Mutation::Replace(at, value) => {
                if let Some(slot) = at_path(&mut report, &all[at.index(all.len())]) {
                    *slot = value.clone();
                }
            }
            Mutation::Remove(at) => {
                let path = &all[at.index(all.len())];
                if let Some((last, parent)) = path.split_last()
                    && let Some(parent) = at_path(&mut report, parent)
                {
                    match (parent, last) {
                        (Value::Object(map), Value::String(key)) => {
                            map.remove(key);
                        }
                        (Value::Array(items), Value::Number(index)) => {
                            let index = index.as_u64().unwrap_or(0) as usize;
                            if index < items.len() {
                                items.remove(index);
                            }
                        }
                        _ => {}
                    }
                }
            }
            Mutation::Bytes(..) => {
                let mut bytes = serde_json::to_vec_pretty(&report).unwrap();
                if let Mutation::Bytes(at, insert, cut) = mutation {
                    let start = at.index(bytes.len() + 1);
                    let end = (start + cut).min(bytes.len());
                    bytes.splice(start..end, insert.iter().copied());
                }
                raw = Some(bytes);
            }
        }
    }
    raw.unwrap_or_else(|| serde_json::to_vec_pretty(&report).unwrap())
}

/// Everything a parsed report goes through: the table, folded stacks, the
/// flame graph and a comparison with itself.
fn exercise(report: &Report, dir: &Path, selectors: &[String]) {
    let _ = table::render(report, None, Width::Unlimited);
    let _ = table::render(report, Some(1), Width::Columns(80));
    let _ = table::render(report, None, Width::Columns(0));
    for format in [OutputFormat::Folded, OutputFormat::Svg] {
        let _ = format.render(report, &TableOptions::FULL);
    }
    let path = dir.join("parsed.json");
    let json = render::write(
        report,
        OutputFormat::Json,
        &TableOptions::FULL,
        Sink::File(&path),
    );
    if json.is_ok() {
        let max: Vec<String> = selectors.iter().map(|s| format!("{s}=1")).collect();
        let _ = compare::evaluate(&path, &path, selectors, &max, Width::Columns(80));
    }
}

#[test]
fn fuzz_report_parser() {
    let dir = tempfile::tempdir().unwrap();
    let base = full_report();
    // The base must parse, or the mutations test only the error path.
    let text = serde_json::to_string(&base).unwrap();
    let parsed = Report::from_json(&text, "base").expect("base report parses");
    exercise(&parsed, dir.path(), &["g_stats".into()]);
    let strategy = prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..256).prop_map(|b| (b, Vec::new())),
        6 => prop::collection::vec(mutation(), 1..6)
            .prop_map(move |m| (Vec::new(), m)),
    ];
    fuzz("report_parser", strategy, |(raw, mutations)| {
        let bytes = if mutations.is_empty() {
            raw
        } else {
            mutate(full_report(), &mutations)
        };
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(report) = Report::from_json(&text, "fuzzed") {
            exercise(&report, dir.path(), &["g_stats".into(), "".into()]);
        }
        // The file path too: bytes that are not UTF-8 are an error, not a panic.
        let path = dir.path().join("raw.json");
        std::fs::write(&path, &bytes).unwrap();
        let _ = Report::load(&path);
        Ok(())
    });
}

/// A report with requests whose locks carry the given names and callers.
fn report_with(names: &[String], callers: &[String], requests: u64) -> Value {
    let mut report = full_report();
    report["requests"]["count"] = json!(requests);
    let locks: Vec<Value> = names
        .iter()
        .zip(callers.iter().chain(std::iter::repeat(&String::new())))
        .enumerate()
        .map(|(i, (name, caller))| {
            json!({"address": format!("{:#x}", 0x1000 + i * 64), "kind": "mutex",
                   "acquisitions": i as u64 * 7, "contended": i as u64 % 3, "wakes": 0,
                   "wait_ns": 0, "max_wait_ns": 0,
                   "name": if name.is_empty() { Value::Null } else { json!(name) },
                   "callers": [{"function": caller, "module": "m", "offset": 1, "count": 1}]})
        })
        .collect();
    report["locks"] = Value::from(locks);
    report
}

fn write(dir: &Path, file: &str, report: &Value) -> PathBuf {
    let path = dir.join(file);
    std::fs::write(&path, serde_json::to_vec(report).unwrap()).unwrap();
    path
}

#[test]
fn fuzz_compare_selectors() {
    let dir = tempfile::tempdir().unwrap();
    let text = prop_oneof!["[a-z_>+-]{0,8}", ".{0,10}", Just("0x1000".to_string())];
    let strategy = (
        prop::collection::vec(text.clone(), 0..6),
        prop::collection::vec(text.clone(), 0..6),
        prop::collection::vec(text.clone(), 0..4),
        prop::collection::vec((text, prop_oneof!["[0-9.e+-]{0,6}", ".{0,4}"]), 0..4),
        0u64..3,
    );
    fuzz(
        "compare_selectors",
        strategy,
        |(names, callers, gone, max, requests)| {
            let before = write(
                dir.path(),
                "before.json",
                &report_with(&names, &callers, requests),
            );
            let after = write(
                dir.path(),
                "after.json",
                &report_with(&callers, &names, requests + 1),
            );
            let max: Vec<String> = max.iter().map(|(s, n)| format!("{s}={n}")).collect();
            let Ok(outcome) = compare::evaluate(&before, &after, &gone, &max, Width::Unlimited)
            else {
                return Ok(());
            };
            // A selector that names no lock on either side never passes.
            let labels: Vec<&String> = names.iter().chain(&callers).collect();
            for selector in &gone {
                if !labels.iter().any(|label| label.contains(selector.as_str())) {
                    prop_assert!(
                        outcome
                            .failures
                            .iter()
                            .any(|f| f.contains(&format!("{selector:?} matches no lock"))),
                        "--assert-gone {selector:?} passed: {outcome:?}"
                    );
                }
            }
            Ok(())
        },
    );
}

/// Small real ELF files of different kinds: an executable, a shared library,
/// and the test fixtures when built (static, with debug info).
fn real_elf_files() -> Vec<Vec<u8>> {
    let mut files = Vec::new();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fixtures");
    let candidates = ["/bin/true", "/usr/lib/x86_64-linux-gnu/libpthread.so.0"]
        .into_iter()
        .map(PathBuf::from)
        .chain(
            std::fs::read_dir(fixtures)
                .into_iter()
                .flatten()
                .flatten()
                .map(|entry| entry.path())
                .take(4),
        );
    for path in candidates {
        if let Ok(data) = std::fs::read(&path)
            && data.starts_with(b"\x7fELF")
            && data.len() < 4 << 20
        {
            files.push(data);
        }
    }
    assert!(!files.is_empty(), "no ELF file to mutate");
    files
}

#[test]
fn fuzz_elf_readers() {
    let root = tempfile::tempdir().unwrap();
    let files = real_elf_files();
    let count = files.len();
    let strategy = (
        0..count,
        // Byte edits: anywhere, and in the headers, where they do the most.
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..24),
        prop::collection::vec((0usize..256, any::<u8>()), 0..8),
        prop::option::of(any::<prop::sample::Index>()),
        prop::collection::vec(any::<u64>(), 0..8),
        any::<u64>(),
    );
    fuzz(
        "elf_readers",
        strategy,
        |(which, edits, header_edits, truncate, probes, offset)| {
            let mut data = files[which].clone();
            for (at, byte) in edits {
                let i = at.index(data.len());
                data[i] = byte;
            }
            for (i, byte) in header_edits {
                if i < data.len() {
                    data[i] = byte;
                }
            }
            if let Some(at) = truncate {
                data.truncate(at.index(data.len() + 1));
            }
            let Ok(symbols) = ModuleSymbols::parse(&data, "/lib/fuzzed.so", Some(root.path()))
            else {
                return Ok(());
            };
            let mut addresses = probes;
            for symbol in symbols.functions.iter().chain(&symbols.objects).take(64) {
                addresses.extend([
                    symbol.address,
                    symbol.address.wrapping_add(symbol.size),
                    symbol.address.wrapping_sub(1),
                ]);
            }
            for &address in &addresses {
                let _ = symbols.object_at(address).map(|(s, o)| s.with_offset(o));
                let _ = symbols.function_at(address).map(|(s, _)| s.readable_name());
                let _ = symbols.section_at(address);
            }
            // As the namer loads it: mapped at a hostile offset and address.
            let path = root.path().join("module");
            std::fs::write(&path, &data).unwrap();
            let mut files = std::collections::BTreeMap::new();
            // A mutation that broke the magic is refused before mapping, as designed.
            if let Ok(file) = locktrace::probe::modules::ModuleFile::open(&path) {
                files.insert("/lib/fuzzed.so".to_string(), std::sync::Arc::new(file));
            }
            let maps = vec![Mapping {
                start: 0x7f00_0000_0000 & !0xfff,
                end: (0x7f00_0000_0000u64 & !0xfff).wrapping_add(0x10000),
                perms: "r-xp".into(),
                offset: offset & 0xffff_f000,
                path: "/lib/fuzzed.so".into(),
            }];
            let space = AddressSpace::build(maps, &files, Some(root.path()));
            for module in &space.modules {
                let _ = module.spare_start();
                for &address in &addresses {
                    let _ = module.link_address(address);
                }
            }
            for &address in &addresses {
                let _ = space.region_of(address);
                let _ = space.module_of(address);
            }
            let _ = space.heap_ranges();
            Ok(())
        },
    );
}
