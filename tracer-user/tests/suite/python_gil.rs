//! CPython's GIL without debug info (issue 52 D12): Debian's stripped
//! python3.11 under GIL contention, its GIL named and counted as the DWARF
//! of an unstripped build does, from locktrace's table for the version.

use std::{path::Path, process::Command};

use crate::common::{Fixture, Trace, contention_in_rows, lock_at, repo_root};
use locktrace::naming::cpython;
use serde_json::Value;

/// Debian's CPython 3.11 (scripts/setup.sh installs python3 and
/// python3.11-dev): stripped, no debug file installed.
const DEBIAN_PYTHON: &str = "/usr/bin/python3.11";

/// A GIL lock's row as expected: name, offset in `_PyRuntime`, kind, type.
type GilRow = (&'static str, u64, &'static str, &'static str);

/// The GIL's four locks in 3.11, as the DWARF of pyenv's unstripped 3.11.7
/// names them.
const GIL_3_11: [GilRow; 4] = [
    (
        "_PyRuntime.ceval.gil.cond",
        392,
        "condvar",
        "pthread_cond_t",
    ),
    (
        "_PyRuntime.ceval.gil.mutex",
        440,
        "mutex",
        "pthread_mutex_t",
    ),
    (
        "_PyRuntime.ceval.gil.switch_cond",
        480,
        "condvar",
        "pthread_cond_t",
    ),
    (
        "_PyRuntime.ceval.gil.switch_mutex",
        528,
        "mutex",
        "pthread_mutex_t",
    ),
];

/// `fixtures/python/gil_offsets.c` built against `include` (a CPython's
/// headers): `VERSION PATH OFFSET` per GIL lock.
fn offsets_from_headers(include: &Path) -> Vec<(String, String, u64)> {
    let source = Path::new("fixtures/python/gil_offsets.c");
    crate::common::built_and_run(source, &[include.to_path_buf()])
        .lines()
        .map(|line| {
            let mut words = line.split(' ');
            let (version, path, offset) = (words.next(), words.next(), words.next());
            (
                version.unwrap().to_string(),
                format!("_PyRuntime.{}", path.unwrap()),
                offset.unwrap().parse().unwrap(),
            )
        })
        .collect()
}

/// The table's (version, name, offset) for `version`.
fn offsets_from_table(version: (u8, u8)) -> Vec<(String, String, u64)> {
    cpython::table_layout(version)
        .expect("a table")
        .locks
        .iter()
        .map(|lock| {
            (
                format!("{}.{}", version.0, version.1),
                format!("_PyRuntime{}", lock.path),
                lock.offset,
            )
        })
        .collect()
}

/// The 3.11 table against the headers of the CPython it describes,
/// Debian's python3.11-dev: what a fresh CI machine has (pyenv's
/// unstripped builds are not in its set-up).
#[test]
fn the_cpython_3_11_table_matches_python3_11_dev_headers() {
    let include = Path::new("/usr/include/python3.11");
    assert!(
        include.join("internal/pycore_gil.h").exists(),
        "CPython 3.11's internal headers (scripts/setup.sh installs python3.11-dev)"
    );
    assert_eq!(offsets_from_headers(include), offsets_from_table((3, 11)));
    let from_test: Vec<u64> = GIL_3_11.iter().map(|lock| lock.1).collect();
    let from_table: Vec<u64> = offsets_from_table((3, 11)).iter().map(|l| l.2).collect();
    assert_eq!(from_test, from_table);
}

/// Starts `python` (with `env`) on the contention fixture, 4 threads for
/// 2 s, and records it until it exits, without debuginfod; (report, table,
/// `_PyRuntime`'s address).
fn record_gil_contention(python: &Path, env: &[(&str, &Path)]) -> (Value, String, u64) {
    let script = repo_root().join("fixtures/python/gil_contention.py");
    let mut command = Command::new(python);
    command
        .arg(&script)
        .args(["4", "2"])
        .envs(env.iter().copied());
    let mut target = Fixture::spawn_command(&mut command);
    let runtime = target.address("runtime");
    let trace = Trace::attach_env(
        target.pid(),
        &["--duration", "60"],
        &[("DEBUGINFOD_URLS", "")],
    );
    target.start();
    assert_eq!(target.wait().trim(), "done");
    let (report, table) = trace.finish();
    (report, table, runtime)
}

/// The rows of the GIL's locks: name, kind, declared type, and that the
/// GIL's waits are lock contention (condvar waits included), exactly the
/// rows' sum in the totals.
fn assert_gil_rows(report: &Value, table: &str, runtime: u64, layout: &str, gil: &[GilRow]) {
    for &(name, offset, kind, type_name) in gil {
        let row = lock_at(report, runtime + offset)
            .unwrap_or_else(|| panic!("no {name} row at {:#x}: {table}", runtime + offset));
        assert_eq!(row["name"], name, "{table}");
        assert_eq!(row["kind"], kind, "{row:#}");
        assert_eq!(row["wait_class"], "lock", "{row:#}");
        assert_eq!(
            row["offset_name"],
            format!("_PyRuntime+{offset:#x}"),
            "{row:#}"
        );
        let declared = &row["declared"];
        assert_eq!(declared["type"], type_name, "{row:#}");
        assert_eq!(declared["inside"], "_gil_runtime_state", "{row:#}");
        assert_eq!(declared["layout"], layout, "{row:#}");
        let by_type = (kind == "condvar").then_some("condvar_of_lock");
        assert_eq!(declared["contention"].as_str(), by_type, "{row:#}");
    }
    let row = |n: usize| &lock_at(report, runtime + gil[n].1).unwrap()["contended"];
    let cond_waits = row(0).as_u64().unwrap();
    assert!(cond_waits > 0, "no thread waited for the GIL: {table}");
    assert!(row(1).as_u64().unwrap() > 0, "{table}");
    let totals = &report["totals"];
    // Every wait on the GIL is lock contention: none is left as "waiting
    // for work", and the totals are the rows' sum.
    assert_eq!(totals["by_wait_class"]["condvar"]["waits"], 0, "{totals:#}");
    assert_eq!(
        totals["contended"],
        contention_in_rows(report),
        "{totals:#}"
    );
    assert_eq!(
        totals["by_wait_class"]["lock"]["waits"], totals["contended"],
        "{totals:#}"
    );
    let from = if layout == "table" {
        " by locktrace's table"
    } else {
        ""
    };
    let said = format!(
        "contention by declared type: {} (pthread_cond_t{from}: waiting for the lock in _gil_runtime_state)",
        gil[0].0
    );
    assert!(table.contains(&said), "{table}");
}

/// Debian's stripped python3.11 (no DWARF, no debug file: only `.dynsym`'s
/// `_PyRuntime` and `Py_Version`): its GIL named from the table, its waits
/// contention, as the DWARF path gives them for an unstripped 3.11.
#[test]
fn a_stripped_python3_11_gil_is_named_and_counted_as_contention() {
    let python = Path::new(DEBIAN_PYTHON);
    let (report, table, runtime) = record_gil_contention(python, &[]);
    // Named without DWARF: the module is reported stripped, no debug file.
    let naming = &report["naming"];
    let listed = |field: &str| naming[field].as_array().cloned().unwrap_or_default();
    assert!(
        listed("stripped").contains(&DEBIAN_PYTHON.into()),
        "{naming:#}"
    );
    assert!(
        !listed("debug_files")
            .iter()
            .any(|file| file.as_str().unwrap().starts_with(DEBIAN_PYTHON)),
        "{naming:#}"
    );
    assert_gil_rows(&report, &table, runtime, "table", &GIL_3_11);
}

/// The table's rows for `version`, as [`GilRow`]s.
fn gil_rows_of_table(version: (u8, u8)) -> Vec<GilRow> {
    let layout = cpython::table_layout(version).expect("a table");
    let name = |path: &str| &*format!("_PyRuntime{path}").leak();
    layout
        .locks
        .iter()
        .map(|lock| {
            let kind = match lock.kind {
                locktrace::model::LockKind::Condvar => "condvar",
                _ => "mutex",
            };
            (name(lock.path), lock.offset, kind, lock.type_name)
        })
        .collect()
}

/// pyenv's build of CPython 3.`minor` (with its DWARF and headers).
fn pyenv_build(minor: u8) -> std::path::PathBuf {
    let root = std::env::var_os("PYENV_ROOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(&std::env::var_os("HOME").unwrap()).join(".pyenv"));
    let versions = root.join("versions");
    std::fs::read_dir(&versions)
        .unwrap_or_else(|error| panic!("{}: {error}", versions.display()))
        .flatten()
        .map(|entry| entry.path())
        .find(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            name.strip_prefix(&format!("3.{minor}."))
                .is_some_and(|patch| patch.chars().all(|c| c.is_ascii_digit()))
        })
        .unwrap_or_else(|| panic!("no pyenv build of 3.{minor} in {}", versions.display()))
}

/// The unstripped twins, pyenv's 3.11, 3.12 and 3.13 (built with symbols
/// and DWARF, their `libpython3.X.so` holding `_PyRuntime`): each table
/// against the build's headers, then the GIL's rows from a stripped copy of
/// its libpython (named by the table) against those from the build itself
/// (named by its DWARF). Not in CI: scripts/setup.sh installs Debian's
/// packages only, and Debian 12 has no 3.12 or 3.13.
#[test]
#[ignore = "needs pyenv's CPython 3.11, 3.12 and 3.13 builds (not installed by scripts/setup.sh)"]
fn the_tables_match_pyenvs_unstripped_twins() {
    for minor in [11u8, 12, 13] {
        let build = pyenv_build(minor);
        let include = build.join(format!("include/python3.{minor}"));
        assert_eq!(
            offsets_from_headers(&include),
            offsets_from_table((3, minor))
        );
        let python = build.join(format!("bin/python3.{minor}"));
        let library = format!("libpython3.{minor}.so.1.0");
        let stripped = tempfile::tempdir().unwrap();
        let copy = stripped.path().join(&library);
        let status = Command::new("strip")
            .arg("--strip-all")
            .arg("-o")
            .arg(&copy)
            .arg(build.join("lib").join(&library))
            .status()
            .unwrap();
        assert!(status.success(), "strip {library}");
        let gil = gil_rows_of_table((3, minor));
        if minor == 11 {
            assert_eq!(gil, GIL_3_11);
        }
        let (report, table, runtime) = record_gil_contention(&python, &[]);
        assert_gil_rows(&report, &table, runtime, "dwarf", &gil);
        // The runpath points at pyenv's libpython; LD_LIBRARY_PATH wins.
        let env = [("LD_LIBRARY_PATH", stripped.path())];
        let (report, table, runtime) = record_gil_contention(&python, &env);
        let module = copy.to_string_lossy().into_owned();
        let row = lock_at(&report, runtime + gil[0].1).unwrap();
        assert_eq!(row["module"], module.as_str(), "{table}");
        assert_gil_rows(&report, &table, runtime, "table", &gil);
    }
}
