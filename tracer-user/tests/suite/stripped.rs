//! Issue 47: the builds users run are stripped. A static executable without
//! a symbol table still has its lock functions found, by their code matched
//! against the distribution's libc archive, and counted exactly, in every
//! mode that counts acquisitions. Real processes, real BPF, as root.

use crate::common::{Flavor, acquisitions, fixture_with, trace_fixture};

/// `locks 3 700 300` takes g_lock 2100 times and each thread's heap mutex
/// 300 times; every lock call of the stripped binary is counted as
/// the same in the unstripped twin.
fn assert_counts_exact(flavor: Flavor, mode: &[&str]) {
    let binary = fixture_with("locks", flavor, &["-s"]);
    let symbols = std::process::Command::new("readelf")
        .arg("-SW")
        .arg(&binary)
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&symbols.stdout).contains(".symtab"),
        "{flavor:?}: the fixture is not stripped"
    );
    let (report, addresses) = trace_fixture(&binary, &["3", "700", "300"], mode);
    let what = format!("{flavor:?} {mode:?}");
    assert_eq!(
        acquisitions(&report, addresses["global"][0]),
        2100,
        "{what}"
    );
    assert_eq!(addresses["heap"].len(), 3, "{what}");
    for &heap in &addresses["heap"] {
        assert_eq!(acquisitions(&report, heap), 300, "{what}");
    }
    // Every lock call counted as in the unstripped twin (a static glibc
    // takes a few locks of its own at exit: the same few).
    let twin = fixture_with("locks", flavor, &[]);
    let (unstripped, _) = trace_fixture(&twin, &["3", "700", "300"], mode);
    assert_eq!(
        report["totals"]["acquisitions"], unstripped["totals"]["acquisitions"],
        "{what}"
    );
    let found = &report["coverage"]["found_by_code"];
    assert_eq!(
        found["module"],
        binary.display().to_string(),
        "{what}: {found}"
    );
    let archive = found["archive"].as_str().unwrap_or_default();
    let expected = match flavor {
        Flavor::MuslStatic => "x86_64-linux-musl/libc.a",
        _ => "x86_64-linux-gnu/libc.a",
    };
    assert!(archive.ends_with(expected), "{what}: {found}");
    let functions: Vec<&str> = found["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    assert!(functions.contains(&"pthread_mutex_lock"), "{what}: {found}");
}

#[test]
fn a_stripped_static_musl_binary_is_counted_exactly() {
    assert_counts_exact(Flavor::MuslStatic, &[]);
    assert_counts_exact(Flavor::MuslStatic, &["--mode", "inproc"]);
}

#[test]
fn a_stripped_static_glibc_binary_is_counted_exactly() {
    assert_counts_exact(Flavor::GlibcStatic, &[]);
}
