//! The report's JSON Schema, generated from the model types (schemars) as
//! serde writes them: `docs/schema/report.schema.json` is this, checked in
//! (a unit test fails when the file is stale; `LOCKTRACE_BLESS=1 cargo test
//! -p tracer-user --lib model::schema` rewrites it).
use schemars::{Schema, generate::SchemaSettings};

use super::Report;

/// The schema of a report as locktrace writes it (JSON Schema draft
/// 2020-12): a field is required when it is always written; fields that
/// reports of older versions lack carry the `default` they read as.
pub fn report_schema() -> Schema {
    SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator()
        .into_root_schema_for::<Report>()
}

/// [`report_schema`] as the checked-in file's text.
#[cfg(test)]
fn report_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&report_schema()).expect("a schema is JSON");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::model::{
        Activity, AddressFigures, AutoProbe, Caller, Coverage, CpuReport, CreatedBy, Creation,
        Deadlock, DeadlockStep, DeclaredContention, DeclaredType, EndedLifetime, Estimate,
        ExecLoss, ExecSeen, Frame, HoldSite, Holds, InProgress, LiveNaming, LockChain, LockKind,
        LockStack, MainThreadExit, Mode, Naming, Overhead, PerRequest, Placement,
        PlacementFallback, RequestSource, Requests, ScaleBasis, ServerKind, SiteGroup, SkipReason,
        SkippedFile, StackEnd, StackOrigin, StackSource, StopReason, ThreadRef, WaitClass,
        WaitHolder, WindowLinkKind,
    };

    fn repo_file(relative: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(relative)
    }

    fn validator() -> jsonschema::Validator {
        jsonschema::validator_for(report_schema().as_value()).expect("the schema compiles")
    }

    /// Every way `report` breaks the schema: where (a JSON pointer), and why.
    fn violations_at(report: &Value) -> Vec<(String, String)> {
        validator()
            .iter_errors(report)
            .map(|error| (error.instance_path().to_string(), error.to_string()))
            .collect()
    }

    /// [`violations_at`], one line each.
    fn violations(report: &Value) -> Vec<String> {
        violations_at(report)
            .into_iter()
            .map(|(path, why)| format!("{path}: {why}"))
            .collect()
    }

    /// `LOCKTRACE_BLESS=1 cargo test -p tracer-user --lib model::schema`
    /// rewrites docs/schema/report.schema.json from the model types.
    #[test]
    fn the_report_schema_in_docs_is_current() {
        let path = repo_file("docs/schema/report.schema.json");
        let generated = report_schema_text();
        if std::env::var_os("LOCKTRACE_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &generated).unwrap();
        }
        let saved = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            saved == generated,
            "docs/schema/report.schema.json is stale: LOCKTRACE_BLESS=1 cargo test -p tracer-user --lib model::schema rewrites it"
        );
    }

    /// The saved reports the table tests read are valid as they are on
    /// disk, and again as locktrace writes them back.
    #[test]
    fn saved_reports_match_the_schema() {
        for name in ["long_names.json", "long_names_after.json"] {
            let path = repo_file("tracer-user/tests/data").join(name);
            let text = std::fs::read_to_string(&path).unwrap();
            let raw: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(violations(&raw), Vec::<String>::new(), "{name} as saved");
            let report = Report::load(&path).unwrap();
            let written = serde_json::to_value(&report).unwrap();
            assert_eq!(violations(&written), Vec::<String>::new(), "{name} written");
        }
    }

    /// A report with every optional part filled (every struct of the model
    /// in it), as serde writes it, is valid.
    #[test]
    fn a_report_with_every_part_matches_the_schema() {
        let written = serde_json::to_value(full_report()).unwrap();
        assert_eq!(violations(&written), Vec::<String>::new());
        // Nothing was left out by being empty: every property the schema
        // knows for the report and a lock is in the instance.
        let schema = report_schema();
        let properties = |def: &Value| -> Vec<String> {
            def["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect()
        };
        let root = schema.as_value();
        for key in properties(root) {
            assert!(!written[&key].is_null(), "report.{key} is null or absent");
        }
        let lock = &written["locks"][0];
        for key in properties(&root["$defs"]["Lock"]) {
            assert!(lock.get(&key).is_some(), "locks[0].{key} is absent");
        }
        // Its rows' addresses are written without their lifetime bits,
        // and match the address pattern.
        assert_eq!(lock["address"], "0x7f3a5c000b80");
    }

    /// Each word of each enum in the schema is one serde reads and writes
    /// back unchanged (schemars reads the serde attributes; a hand-written
    /// serializer it would not see).
    #[test]
    fn enum_words_are_the_serde_words() {
        fn round_trips<T: serde::Serialize + serde::de::DeserializeOwned>(word: &Value) -> bool {
            serde_json::from_value::<T>(word.clone())
                .is_ok_and(|value| serde_json::to_value(value).ok().as_ref() == Some(word))
        }
        type Check = fn(&Value) -> bool;
        let checks: Vec<(&str, Check)> = vec![
            ("Activity", round_trips::<Activity>),
            ("CountedBy", round_trips::<crate::model::CountedBy>),
            ("CreatedBy", round_trips::<CreatedBy>),
            ("DeclaredContention", round_trips::<DeclaredContention>),
            ("ExecLoss", round_trips::<ExecLoss>),
            (
                "HandoffCostSource",
                round_trips::<crate::model::HandoffCostSource>,
            ),
            (
                "KernelLockKind",
                round_trips::<crate::model::KernelLockKind>,
            ),
            ("LayoutSource", round_trips::<crate::model::LayoutSource>),
            ("LockKind", round_trips::<LockKind>),
            ("Mode", round_trips::<Mode>),
            ("Placement", round_trips::<Placement>),
            ("PriceBasis", round_trips::<crate::model::PriceBasis>),
            ("QueueModel", round_trips::<crate::model::QueueModel>),
            ("Region", round_trips::<crate::model::Region>),
            ("RequestSource", round_trips::<RequestSource>),
            (
                "RestoreOutcome",
                round_trips::<crate::model::RestoreOutcome>,
            ),
            (
                "RouteCallsUncounted",
                round_trips::<crate::model::RouteCallsUncounted>,
            ),
            ("RouteKind", round_trips::<crate::model::RouteKind>),
            ("ScaleBasis", round_trips::<ScaleBasis>),
            ("ServerKind", round_trips::<ServerKind>),
            ("SkipReason", round_trips::<SkipReason>),
            ("StackEnd", round_trips::<StackEnd>),
            ("StackOrigin", round_trips::<StackOrigin>),
            ("StackSource", round_trips::<StackSource>),
            ("StopReason", round_trips::<StopReason>),
            ("ThreadBlocks", round_trips::<crate::model::ThreadBlocks>),
            ("TlsSlotFrom", round_trips::<crate::model::TlsSlotFrom>),
            ("WaitClass", round_trips::<WaitClass>),
            ("WindowLinkKind", round_trips::<WindowLinkKind>),
        ];
        let schema = report_schema();
        let defs = schema.as_value()["$defs"].as_object().unwrap();
        let mut enums: Vec<&str> = Vec::new();
        for (name, def) in defs {
            let words: Vec<Value> = match (def.get("enum"), def.get("oneOf")) {
                (Some(Value::Array(words)), _) => words.clone(),
                // Documented variants are a `const` each, the others an `enum`.
                (_, Some(Value::Array(variants))) => variants
                    .iter()
                    .flat_map(
                        |variant| match (variant.get("const"), variant.get("enum")) {
                            (Some(word), _) => vec![word.clone()],
                            (_, Some(Value::Array(words))) => words.clone(),
                            _ => vec![Value::Null],
                        },
                    )
                    .collect(),
                // An open-ended kind: its known words, then any string.
                _ => match def.pointer("/anyOf/0/enum") {
                    Some(Value::Array(words)) => words.clone(),
                    _ => continue,
                },
            };
            enums.push(name);
            let (_, check) = checks
                .iter()
                .find(|(listed, _)| listed == name)
                .unwrap_or_else(|| panic!("enum {name} is not checked here: add it"));
            assert!(words.len() >= 2, "{name}: {words:?}");
            for word in words {
                assert!(word.is_string() && check(&word), "{name}: {word}");
            }
        }
        let listed: Vec<&str> = checks.iter().map(|(name, _)| *name).collect();
        assert_eq!(enums, listed);
    }

    /// The words that are enums in the code (regions, drop reasons,
    /// placement refusals, the pointer-chain line) read back as written:
    /// this version's words, older ones and words it does not know.
    #[test]
    fn worded_kinds_are_written_back_as_read() {
        let mut report = serde_json::to_value(full_report()).unwrap();
        let regions = [
            ".data",
            "[heap]",
            "heap (thread arena)",
            "[heap], heap (thread arena)",
            "file /dev/shm/x",
            "[anon:glibc]",
            "",
            "heap",
        ];
        let lock = report["locks"][0].clone();
        report["locks"] = regions
            .iter()
            .map(|region| {
                let mut lock = lock.clone();
                lock["region"] = (*region).into();
                lock
            })
            .collect();
        report["in_progress"][0]["region"] = "Go heap".into();
        report["dropped"] =
            serde_json::json!({"a_newer_reason": 1, "nested_calls_unknown": 2, "stacks_lost": 3});
        report["placement_fallbacks"][0]["reason"] =
            "mov at +0x0 writes rdi (the lock argument)".into();
        report["naming"]["pointer_chains"] = "1 named".into();
        let read: Report = serde_json::from_value(report.clone()).unwrap();
        assert_eq!(serde_json::to_value(&read).unwrap(), report);
        assert_eq!(
            serde_json::to_string(&read.dropped).unwrap(),
            r#"{"a_newer_reason":1,"nested_calls_unknown":2,"stacks_lost":3}"#
        );
    }

    /// The validator is no rubber stamp: each kind of damage to a valid
    /// report is refused, at the place damaged.
    #[test]
    fn damaged_reports_are_refused() {
        let good = serde_json::to_value(full_report()).unwrap();
        assert_eq!(violations(&good), Vec::<String>::new());
        let go_runtime = good["totals"]["by_wait_class"]["go_runtime"].clone();
        assert!(go_runtime.is_object());
        // (what, JSON pointer, new value there; None removes it)
        let damaged: Vec<(&str, &str, Option<Value>)> = vec![
            ("wrong type", "/locks/0/contended", Some(json!("many"))),
            ("negative count", "/totals/wakes", Some(json!(-1))),
            ("fraction for a count", "/totals/wakes", Some(json!(1.5))),
            ("number as text", "/duration_s", Some(json!("1.0"))),
            ("missing required field", "/totals", None),
            ("missing required field of a lock", "/locks/0/wait_ns", None),
            ("missing field written as null", "/locks/0/cpu_ns", None),
            ("unknown enum word", "/mode", Some(json!("fast"))),
            (
                "unknown enum word in a lock",
                "/locks/0/kind",
                Some(json!("semaphore")),
            ),
            (
                "unknown enum word deep down",
                "/coverage/exec/not_counted",
                Some(json!("some")),
            ),
            ("null where none is written", "/locks", Some(Value::Null)),
            ("null count", "/totals/contended", Some(Value::Null)),
            ("address as a number", "/locks/0/address", Some(json!(4096))),
            ("address not in hex", "/stacks/0/lock", Some(json!("4096"))),
            (
                "address in upper case",
                "/in_progress/0/lock",
                Some(json!("0x7F3A")),
            ),
            (
                "another schema",
                "/schema",
                Some(json!("locktrace.report/2")),
            ),
            (
                "histogram bucket of three",
                "/locks/0/wait_histogram/0",
                Some(json!([1, 2, 3])),
            ),
            (
                "unknown wait class key",
                "/totals/by_wait_class/spin",
                Some(go_runtime),
            ),
            ("object for an array", "/deadlocks", Some(json!({}))),
        ];
        for (what, pointer, value) in damaged {
            let mut report = good.clone();
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            let container = report.pointer_mut(parent).unwrap();
            let expected = match (value, container) {
                (Some(value), Value::Array(items)) => {
                    items[key.parse::<usize>().unwrap()] = value;
                    pointer
                }
                (Some(value), container) => {
                    container[key] = value;
                    pointer
                }
                (None, container) => {
                    let removed = container.as_object_mut().unwrap().remove(key);
                    assert!(removed.is_some(), "{what}: {pointer} was not there");
                    parent
                }
            };
            assert_ne!(report, good, "{what}: nothing changed");
            // Refused there, or at an object holding it (an `anyOf` of an
            // optional part says so where the part starts), not the root.
            let at_damage = |path: &str| {
                path == expected || (!path.is_empty() && expected.starts_with(&format!("{path}/")))
            };
            let found = violations_at(&report);
            assert!(
                found.iter().any(|(path, _)| at_damage(path)),
                "{what}: not refused at {expected}: {found:?}"
            );
        }
    }

    fn frame(function: &str) -> Frame {
        Frame {
            function: Some(function.into()),
            module: Some("/usr/lib/libc.so.6".into()),
            offset: 0x1c,
            php: None,
        }
    }

    fn php_frame() -> Frame {
        Frame {
            function: Some("Repo::find".into()),
            module: None,
            offset: 0,
            php: Some(crate::model::PhpLocation {
                file: "/srv/src/Repo.php".into(),
                line: 42,
            }),
        }
    }

    fn per_request() -> PerRequest {
        PerRequest {
            acquisitions: Some(8.0),
            acquisitions_error: Some(0.5),
            contended: 0.25,
            wait_ns: 1200.0,
            hold_ns: Some(900.0),
            cpu_ns: Some(3000.0),
            handoffs: Some(0.5),
        }
    }

    /// A report with every optional field set (Some, non-empty), every
    /// struct of the model in it at least once.
    fn full_report() -> Report {
        let mut report = Report::empty_for_tests("sampled");
        let address = 0x7f3a_5c00_0b80;
        let chain = LockChain {
            module: "/usr/lib/libphp.so".into(),
            root: "g_stats".into(),
            offsets: vec![0x10, 0x40],
        };
        report.locks = vec![full_lock(address, &chain)];
        report.mode = Mode::Sampled;
        report.placement = Some(Placement::Auto);
        report.stopped_by = StopReason::LoadDone;
        report.stacks = vec![LockStack {
            lock: address,
            count: 400,
            frames: vec![frame("update"), php_frame(), frame("main")],
            unwound_by: StackSource::CallFrameInfo,
            source: Some(StackOrigin::LockCalls),
            route: Some("GET /posts/:id".into()),
            ended_by: Some(StackEnd::ExpressionBudget),
        }];
        report.naming = Some(Naming {
            elapsed_ms: 12.5,
            modules: 3,
            debug_files: vec!["/usr/lib/libphp.so <- /usr/lib/debug/libphp.debug".into()],
            pointer_chains: crate::model::PointerChains::NamedBeforeExit { named: 1, of: 1 },
            stripped: vec!["/usr/lib/libc.so.6".into()],
            stripped_lookups: vec![crate::model::StrippedModule {
                module: "/usr/lib/libc.so.6".into(),
                build_id: Some("ab12cd".into()),
                debug_link: Some("libc.so.6.debug".into()),
                debuginfod: false,
            }],
            debug_info: vec!["/usr/lib/libphp.so <- libphp.debug (10 variables, 2 ms)".into()],
            live: Some(LiveNaming {
                searches: 2,
                heap_locks_seen: 1,
                heap_locks_named: 1,
                elapsed_ms: 3.0,
                max_search_ms: 2.0,
            }),
            skipped_files: vec![SkippedFile {
                file: "/usr/lib/libbad.so".into(),
                reason: SkipReason::DwarfCorrupt,
                detail: ".debug_info".into(),
            }],
        });
        report
            .dropped
            .insert(crate::model::DropReason::LocksMapFull, 2);
        report.totals.acquisitions = Some(400);
        report.totals.contended = 20;
        report.totals.hold_ns = Some(80_000);
        report.totals.per_request = Some(per_request());
        report.totals.by_wait_class.insert(
            WaitClass::GoRuntime,
            crate::model::ClassTotals {
                words: 1,
                waits: 5,
                wakes: 5,
                wait_ns: 100,
                per_request: Some(per_request()),
            },
        );
        fill_the_recording_parts(&mut report, address);
        fill_php(&mut report, address);
        fill_inproc(&mut report);
        report
    }

    /// The `--mode inproc` block, every optional field set.
    fn fill_inproc(report: &mut Report) {
        report.locks[0].counted_by = vec![crate::model::CountedBy::GotStubs];
        report.inproc = Some(crate::model::Inproc {
            functions: vec![crate::model::InprocFunction {
                function: "pthread_mutex_lock".into(),
                counted_by: crate::model::CountedBy::GotStubs,
                modules: vec![crate::model::InprocModule {
                    module: "/usr/lib/libphp.so".into(),
                    entries: 1,
                    bind_now: false,
                    unresolved: 0,
                }],
                not_covered: vec!["calls from inside libc.so.6 itself".into()],
            }],
            mapping: Some("0x7f0000000000".into()),
            per_cpu_tables: true,
            table_overflow: 0,
            entries_not_switched: 1,
            loaded_while_recording: vec!["/lib/liblate.so".into()],
            restored_at_start: 0,
            stack_sample_every: Some(256),
            stack_samples_off: Some("a seccomp filter".into()),
            restore: crate::model::Restore {
                outcome: crate::model::RestoreOutcome::Failed,
                entries: 1,
                overwritten: 1,
                reason: Some("thread 12 did not stop within 5 s".into()),
                unloaded: 1,
            },
        });
    }

    /// The `--php` blocks, every optional field set.
    fn fill_php(report: &mut Report, address: u64) {
        report.php = Some(crate::model::PhpContext {
            module: "/usr/lib/libphp.so".into(),
            version: Some("8.2.32".into()),
            layout: crate::model::LayoutSource::Dwarf,
            threads: 16,
            thread_blocks: crate::model::ThreadBlocks::Tls,
            tls_slot_from: Some(crate::model::TlsSlotFrom::ThreadTable),
            unread: [("no_php_code".to_string(), 3)].into(),
        });
        report.routes = Some(crate::model::Routes {
            routes: vec![crate::model::Route {
                name: "GET /posts/:id".into(),
                kind: crate::model::RouteKind::Route,
                requests: 10,
                acquisitions_per_request: Some(40.0),
                cpu_samples: 30,
                cpu_us_per_request: Some(3000.0),
                locks: vec![crate::model::RouteLock {
                    address,
                    name: Some("g_lock".into()),
                    acquisitions: 400,
                    contended: 20,
                    wait_ns: 1000,
                    acquisitions_per_request: Some(40.0),
                    contended_per_request: Some(2.0),
                    wait_us_per_request: Some(0.1),
                    cpu_samples: 2,
                    cpu_us_per_request: Some(200.0),
                }],
            }],
            distinct: 1,
            max_routes: 20,
            patterns: vec!["/posts/\\d+=/posts/:id".into()],
            cpu_sample_period_ns: Some(1_000_000),
            acquisitions_not_counted: None,
        });
    }

    /// A lock with every optional field set.
    fn full_lock(address: u64, chain: &LockChain) -> crate::model::Lock {
        let mut lock = crate::model::Lock::empty(
            // An ended lifetime's key: lifetime bits above the address.
            tracer_common::lifetime::tag(address, 1),
            LockKind::Mutex,
            WaitClass::Lock,
        );
        lock.acquisitions = Some(400);
        lock.calls.insert("pthread_mutex_lock".into(), 400);
        lock.failed_tries = Some(3);
        lock.contended = 20;
        lock.wakes = 19;
        lock.wait_ns = 5_000_000;
        lock.max_wait_ns = 900_000;
        lock.per_request = Some(per_request());
        lock.name = Some("g_stats->lock".into());
        lock.region = crate::model::Region::MmapHeap;
        lock.module = Some("/usr/lib/libphp.so".into());
        lock.callers = vec![Caller {
            function: Some("update".into()),
            module: None,
            offset: 42,
            count: 400,
        }];
        lock.acquisitions_error = Some(12);
        lock.wait_histogram = vec![(1 << 18, 19), (u64::MAX, 1)];
        lock.holders = vec![WaitHolder {
            function: Some("update".into()),
            module: Some("/usr/lib/libphp.so".into()),
            tid: Some(4243),
            thread: Some("worker".into()),
            waits: 20,
            wait_ns: 5_000_000,
        }];
        lock.handoffs = Some(crate::model::Handoffs {
            total: 200,
            same_core: 10,
            same_l3: 150,
            other_l3: 40,
            ns_per_handoff: 60,
            cost_source: Some(crate::model::HandoffCostSource::Calibrated),
            cost_ns: 12_000,
        });
        lock.holds = Some(Holds {
            holds: 400,
            hold_ns: 80_000,
            max_hold_ns: 2_000,
            histogram: vec![(256, 400)],
            by_function: vec![HoldSite {
                function: None,
                module: None,
                holds: 400,
                hold_ns: 80_000,
            }],
        });
        lock.offset_name = Some("*g_stats->+0x40".into());
        lock.chain = Some(chain.clone());
        lock.alternatives = vec![crate::model::AlternativeName {
            name: "g_other->stats->lock".into(),
            offset_name: "*g_other->+0x8->+0x40".into(),
            chain: chain.clone(),
        }];
        lock.cpu_ns = Some(1_000_000);
        lock.cpu_error_ns = Some(300_000);
        lock.created = Some(Creation {
            by: CreatedBy::Init,
            site: vec![frame("init_stats")],
            inits: 1,
        });
        lock.declared = Some(DeclaredType {
            type_name: "pthread_mutex_t".into(),
            inside: Some("stats".into()),
            contention: Some(DeclaredContention::FutexLock),
            layout: crate::model::LayoutSource::Dwarf,
        });
        lock.lifetime = Some(EndedLifetime {
            earlier: 1,
            by_exec: false,
            module_unseen: true,
        });
        lock.group = Some(SiteGroup {
            addresses: 1,
            objects: 1,
            by_address: vec![AddressFigures {
                address,
                acquisitions: Some(400),
                failed_tries: Some(3),
                contended: 20,
                wakes: 19,
                wait_ns: 5_000_000,
                max_wait_ns: 900_000,
                cpu_ns: None,
                inits: 1,
                region: crate::model::Region::MmapHeap,
            }],
        });
        fill_the_price_parts(&mut lock);
        lock
    }

    /// Saturation, removal price and the kernel part of the CPU.
    fn fill_the_price_parts(lock: &mut crate::model::Lock) {
        lock.saturation = Some(crate::model::Saturation {
            utilization: 0.4,
            holds_per_s: 1000.0,
            mean_hold_ns: 400_000.0,
            model: crate::model::QueueModel::MD1,
            predicted_wait_ns: Some(133_333.3),
            measured_wait_ns: 0.0,
            saturating_holds_per_s: 2500.0,
            saturating_requests_per_s: Some(2500.0),
        });
        let part = |basis| crate::model::PricePart {
            ns: 2_000.0,
            error_ns: 500.0,
            basis,
        };
        lock.removal = Some(crate::model::Removal {
            saving_ns: 6_000.0,
            error_ns: 1_000.0,
            saving_ns_per_request: Some(40.0),
            error_ns_per_request: Some(10.0),
            share_of_target_cpu: Some(0.01),
            lock_code: Some(part(crate::model::PriceBasis::Calibrated)),
            handoffs: None,
            kernel: Some(part(crate::model::PriceBasis::Sampled)),
            kernel_locks: Some(part(crate::model::PriceBasis::Traced)),
            scheduling: Some(part(crate::model::PriceBasis::Sampled)),
            unpriced: vec!["handoffs: not counted (record --handoffs)".into()],
        });
        lock.cpu_kernel_ns = Some(400_000);
        lock.kernel_contentions = Some(12);
        lock.kernel_wait_ns = Some(34_000);
    }

    /// The report's parts about the recording (requests, estimate, cost,
    /// coverage, what was going on), every optional field set.
    fn fill_the_recording_parts(report: &mut Report, address: u64) {
        report.requests = Some(Requests {
            source: RequestSource::Probe,
            count: 50,
            statuses: [("200".to_string(), 49), ("500".to_string(), 1)].into(),
            errors: 1,
            unexpected: [("status 500".to_string(), 1)].into(),
            retries: 2,
            probe: Some("/usr/lib/libphp.so:php_request_startup".into()),
            probe_hits: Some(50),
            auto_probe: Some(AutoProbe {
                server: ServerKind::Frankenphp,
                module: "/usr/lib/libphp.so".into(),
                function: "php_request_startup".into(),
                recognised_by: "frankenphp".into(),
            }),
            refused: Some("too few requests".into()),
        });
        report.placement_fallbacks = vec![PlacementFallback {
            function: "pthread_mutex_lock".into(),
            module: "/usr/lib/libc.so.6".into(),
            reason: crate::model::PlacementRefusal::TooLong { limit: 64 },
        }];
        report.estimate = Some(Estimate {
            estimated: vec!["acquisitions".into(), "calls".into()],
            sample_rate: 0.1,
            sample_period_s: Some(0.1),
            windows: 10,
            counted_s: 0.1,
            total_s: 1.0,
            scale: 10.0,
            unsampled_edges_s: 0.05,
            relative_error: 0.2,
            probe_time_share: 0.01,
            per_request_relative_error: Some(0.1),
            windows_kept_attached: 1,
            windows_not_attached: 1,
            window_attach_failure: Some("attaching the uprobe failed".into()),
            window_links: Some(WindowLinkKind::UprobeMulti),
            window_links_fallback: Some("kernel refused".into()),
            scaled_by: ScaleBasis::Requests,
        });
        report.overhead = Some(Overhead {
            probe_hits: 400,
            request_probe_hits: 50,
            cond_wait_probe_hits: 2,
            unlock_probe_hits: 400,
            init_probe_hits: 3,
            emulated_points: 3,
            stepped_points: 1,
            estimated_added_ns: 40_000,
            cost_ns_per_emulated_hit: 100,
            cost_ns_per_stepped_hit: 300,
            cost_source: "calibrated".into(),
            attach_ms: 20,
            tracer_cpu_s: 0.02,
            tracer_peak_rss_kib: 20_000,
        });
        report.coverage = Some(Coverage {
            children_followed: false,
            children_forked: Some(1),
            exec: Some(ExecSeen {
                after_s: 0.5,
                exe: Some("/bin/true".into()),
                not_counted: ExecLoss::LockCallsOutsideProbedModules,
                still_probed: vec!["/usr/lib/libc.so.6".into()],
            }),
            main_thread_exit: Some(MainThreadExit {
                running_at_s: 0.2,
                noticed_at_s: 0.3,
                probes_moved_at_s: Some(0.3),
                moved_to_thread: Some(4243),
                not_moved: Some("no thread left".into()),
                later_moves: 1,
            }),
            found_by_code: Some(crate::model::FoundByCode {
                module: "/srv/frankenphp".into(),
                archive: "/usr/lib/x86_64-linux-musl/libc.a".into(),
                functions: vec!["pthread_mutex_lock".into()],
            }),
            target_exit: Some(crate::model::TargetExit::from_wait_status(11)),
        });
        fill_what_was_going_on(report, address);
    }

    /// Waits in progress, deadlocks and the CPU figures, every optional field set.
    fn fill_what_was_going_on(report: &mut Report, address: u64) {
        report.in_progress = vec![InProgress {
            activity: Activity::Wait,
            lock: address,
            name: Some("g_stats->lock".into()),
            region: crate::model::Region::MmapHeap,
            wait_class: Some(WaitClass::Lock),
            tid: 4244,
            thread: Some("worker".into()),
            elapsed_ns: 1_000_000,
            since_before_attach: true,
            holder: Some(ThreadRef {
                tid: 4243,
                thread: None,
            }),
        }];
        report.deadlocks = vec![Deadlock {
            cycle: vec![DeadlockStep {
                tid: 4244,
                thread: None,
                lock: address,
                name: None,
                held_by: 4243,
            }],
        }];
        report.cpu = Some(CpuReport {
            target_ns: Some(1_000_000_000),
            lock_code_ns: Some(1_000_000),
            lock_code_error_ns: Some(300_000),
            samples: 1000,
            sample_hz: 997,
            tracer_ns: 40_000,
            tracer_samples: 1,
            futex_not_lock_samples: 2,
            unattributed_samples: 3,
            interrupted_samples: 7,
            unsampled_ns: Some(10_000),
            sampler_off: Some("perf_event_open refused".into()),
        });
        report.kernel_limits = vec!["no wait stacks before Linux 5.15".into()];
        report.kernel_locks = Some(kernel_locks());
    }

    /// A kernel locks section with every part (`unavailable` too, which a
    /// real one never has with rows).
    fn kernel_locks() -> crate::model::KernelLocks {
        use crate::model::{
            Frame, KernelLock, KernelLockKind, KernelLockRoute, KernelLocks, KernelSite,
            KernelStack, KernelUserLock, KernelUserSite, KernelUserStack,
        };
        let frame = Frame::named("munmap");
        KernelLocks {
            unavailable: Some("this kernel has no lock:contention_begin tracepoint".into()),
            locks: vec![KernelLock {
                address: 0xffff_8881_9057_32b8,
                name: Some("mmap_lock".into()),
                kind: KernelLockKind::RwsemWrite,
                flags: 4,
                contentions: 12,
                wait_ns: 34_000,
                max_wait_ns: 9_000,
                kernel_sites: vec![KernelSite {
                    function: "__vm_munmap".into(),
                    contentions: 12,
                    wait_ns: 34_000,
                }],
                user_sites: vec![KernelUserSite {
                    ip: 0x7f00_0000_1007,
                    frame: Some(frame.clone()),
                    contentions: 12,
                    wait_ns: 34_000,
                    stacks: vec![KernelUserStack {
                        contentions: 12,
                        frames: vec![frame, Frame::named("map_worker")],
                    }],
                }],
                user_locks: vec![KernelUserLock {
                    address: 0x7f3a_5c00_0b80,
                    name: Some("g_lock".into()),
                    contentions: 12,
                    wait_ns: 34_000,
                }],
                kernel_stacks: vec![KernelStack {
                    functions: vec!["rwsem_down_write_slowpath".into(), "__vm_munmap".into()],
                    user_ip: 0x7f00_0000_1007,
                    contentions: 12,
                    wait_ns: 34_000,
                }],
                routes: vec![KernelLockRoute {
                    route: "GET /posts/:id".into(),
                    contentions: 12,
                    wait_ns: 34_000,
                }],
            }],
            contentions: 12,
            wait_ns: 34_000,
            nested: 1,
            lost: 0,
            stacks_exact_first: Some(8),
            stack_sample_every: Some(16),
        }
    }
}
