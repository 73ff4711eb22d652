//! Hostile input, round 3 (issue 35): outputs that are devices or
//! symlinks, memory maps with `/SYSV…` and non-UTF-8 paths, a module file
//! truncated while the tracer has it mapped. Real BPF as root, real
//! processes; each count is the fixture's exact truth.

use std::{
    ffi::OsStr,
    os::unix::{
        ffi::OsStrExt,
        fs::{FileTypeExt, MetadataExt},
    },
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::common::{Fixture, Flavor, Trace, acquisitions, fixture, lock_at, locktrace};
use serde_json::Value;

const N: u64 = 20_000;

/// `fixtures/liblock.c` built as a shared library at `path`.
fn build_library(path: &Path) {
    let source = crate::common::repo_root().join("fixtures/liblock.c");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-shared", "-fPIC", "-pthread", "-o"])
        .arg(path)
        .arg(source)
        .status()
        .expect("gcc (scripts/setup.sh installs it)");
    assert!(status.success());
}

/// `naming.skipped_files` has a file ending in `file_suffix`, skipped for `reason`.
fn assert_skipped(report: &Value, reason: &str, file_suffix: &str) {
    let skipped = &report["naming"]["skipped_files"];
    assert!(
        skipped
            .as_array()
            .is_some_and(|files| files.iter().any(|file| {
                file["reason"] == reason
                    && file["file"]
                        .as_str()
                        .is_some_and(|f| f.ends_with(file_suffix))
            })),
        "no {reason} for …{file_suffix}: {skipped:#}"
    );
}

/// The lock the report names `name`.
fn named<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|lock| lock["name"] == name)
        .unwrap_or_else(|| panic!("no lock named {name}: {:#}", report["locks"]))
}

/// The lock rows of the module whose path ends with `suffix`.
fn locks_in_module<'a>(report: &'a Value, suffix: &str) -> Vec<&'a Value> {
    report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|lock| lock["module"].as_str().is_some_and(|m| m.ends_with(suffix)))
        .collect()
}

/// A file the test made, removed however the test ends.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn outputs_that_are_devices_or_stdout_are_written_through_not_replaced() {
    let null = Path::new("/dev/null");
    let before = std::fs::metadata(null).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let mut target = Fixture::spawn(&fixture("mapfiles", Flavor::Glibc), &[&N.to_string()]);
    let tracer = locktrace()
        .args(["record", "--pid", &target.pid().to_string()])
        .args(["--json", "/dev/stdout", "--pprof", "/dev/null"])
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !ready.exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "never ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    target.start();
    let global = target.address("global");
    target.wait();
    let output = tracer.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // stdout is the JSON alone (the table went to stderr), exact.
    let report: Value = serde_json::from_slice(&output.stdout).expect("stdout is the JSON");
    assert_eq!(acquisitions(&report, global), N);
    assert!(String::from_utf8_lossy(&output.stderr).contains("acquisitions"));
    let after = std::fs::metadata(null).unwrap();
    assert!(after.file_type().is_char_device(), "/dev/null was replaced");
    assert_eq!((after.ino(), after.mode()), (before.ino(), before.mode()));
    let stdout_link = std::fs::symlink_metadata("/dev/stdout").unwrap();
    assert!(
        stdout_link.file_type().is_symlink(),
        "/dev/stdout was replaced"
    );
}

#[test]
fn sysv_and_non_utf8_paths_in_the_maps_are_read_and_named() {
    // A file whose path starts with /SYSV (as a container's root may hold)
    // once panicked the tracer; a library under a non-UTF-8 directory made
    // every read of the maps fail.
    let sysv = Removed(PathBuf::from(format!("/SYSVlt{}", std::process::id())));
    std::fs::write(&sysv.0, vec![0u8; 4096]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join(OsStr::from_bytes(b"caf\xe9"));
    std::fs::create_dir(&odd).unwrap();
    let library = odd.join("liblock.so");
    build_library(&library);
    let mut lib_arg = b"lib:".to_vec();
    lib_arg.extend_from_slice(library.as_os_str().as_bytes());
    let mut target = Fixture::spawn_command(
        Command::new(fixture("mapfiles", Flavor::Glibc))
            .arg(N.to_string())
            .arg(&sysv.0)
            .arg(OsStr::from_bytes(&lib_arg)),
    );
    let trace = Trace::attach(target.pid(), &[]);
    target.start();
    let global = target.address("global");
    target.wait();
    let (report, _table) = trace.finish();
    assert_eq!(acquisitions(&report, global), N);
    let lib_lock = named(&report, "lib_lock");
    assert_eq!(lib_lock["acquisitions"], N);
    assert!(
        lib_lock["module"]
            .as_str()
            .unwrap()
            .ends_with("/caf\u{fffd}/liblock.so"),
        "{lib_lock:#}"
    );
}

#[test]
fn a_module_file_truncated_during_the_recording_costs_its_names_not_the_recording() {
    // A library holding a counted lock, copied so the test may truncate it
    // once its work is done: the tracer reads it through mmap, and pages
    // past the new end raised SIGBUS when naming read them, which killed
    // the tracer with no report and no JSON.
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim.so");
    build_library(&victim);
    let mut lib_arg = b"lib:".to_vec();
    lib_arg.extend_from_slice(victim.as_os_str().as_bytes());
    let mut target = Fixture::spawn_command(
        Command::new(fixture("mapfiles", Flavor::Glibc))
            .args(["--linger", &N.to_string()])
            .arg(OsStr::from_bytes(&lib_arg)),
    );
    let trace = Trace::attach(target.pid(), &[]);
    target.start();
    let global = target.address("global");
    assert!(target.read_line().unwrap().starts_with("done"));
    std::fs::File::options()
        .write(true)
        .open(&victim)
        .unwrap()
        .set_len(0)
        .unwrap();
    // Only the fixture this test started, by its pid.
    unsafe { libc::kill(target.pid() as i32, libc::SIGUSR1) };
    target.wait();
    let (report, table) = trace.finish();
    assert_eq!(acquisitions(&report, global), N);
    let lib_locks: u64 = locks_in_module(&report, "/victim.so")
        .iter()
        .map(|lock| lock["acquisitions"].as_u64().unwrap())
        .sum();
    assert_eq!(lib_locks, N, "{:#}", report["locks"]);
    assert_skipped(&report, "shrank_while_read", "/victim.so");
    assert!(table.contains("shrank while read"), "{table}");
}

/// dlmopen (issue 35 item 17): two copies of one library, in two link-map
/// namespaces, each with its own `lib_lock`. Both copies are named (the
/// first was unnamed: one load bias per path), and each counts N.
#[test]
fn two_copies_of_one_library_are_both_named() {
    let dir = tempfile::tempdir().unwrap();
    let library = dir.path().join("liblock.so");
    build_library(&library);
    let lib = library.display().to_string();
    let mut target = Fixture::spawn_command(
        Command::new(fixture("mapfiles", Flavor::Glibc))
            .arg(N.to_string())
            .arg(format!("lib:{lib}"))
            .arg(format!("newns:{lib}")),
    );
    let trace = Trace::attach(target.pid(), &[]);
    target.start();
    let global = target.address("global");
    target.wait();
    let (report, table) = trace.finish();
    assert_eq!(acquisitions(&report, global), N);
    let copies: Vec<&Value> = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|lock| lock["name"] == "lib_lock")
        .collect();
    assert_eq!(copies.len(), 2, "{table}");
    for copy in &copies {
        assert_eq!(copy["acquisitions"], N, "{table}");
        assert_eq!(copy["module"], lib.as_str(), "{copy:#}");
    }
    assert_ne!(copies[0]["address"], copies[1]["address"]);
}

/// Section headers that describe nothing loaded (issue 35 item 16): an
/// `sstrip`ped executable (none at all) and one whose headers were
/// rewritten to point at its ELF header. The lock counts exactly, its
/// region comes from the program headers (`.bss`, was `heap (module page
/// tail)`), and the report says why the file named nothing.
#[test]
fn section_headers_that_describe_nothing_are_said_and_bss_stays_bss() {
    let dir = tempfile::tempdir().unwrap();
    let original = std::fs::read(fixture("mapfiles", Flavor::Glibc)).unwrap();
    // e_shoff (8 bytes at 0x28), e_shnum and e_shstrndx (2 each at 0x3c, 0x3e).
    for (name, shoff, shnum, shstrndx) in
        [("sstripped", 0u64, 0u16, 0u16), ("rewritten", 64, 200, 3)]
    {
        let mut bytes = original.clone();
        bytes[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        bytes[0x3c..0x3e].copy_from_slice(&shnum.to_le_bytes());
        bytes[0x3e..0x40].copy_from_slice(&shstrndx.to_le_bytes());
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let mut target = Fixture::spawn(&path, &[&N.to_string()]);
        let trace = Trace::attach(target.pid(), &[]);
        target.start();
        let global = target.address("global");
        target.wait();
        let (report, table) = trace.finish();
        let row = lock_at(&report, global).unwrap_or_else(|| panic!("{name}: no row: {table}"));
        assert_eq!(row["acquisitions"], N, "{name}: {table}");
        assert_eq!(row["region"], ".bss", "{name}: {row:#}");
        assert_skipped(&report, "no_section_headers", name);
        assert!(
            table.contains("no usable section headers"),
            "{name}: {table}"
        );
    }
}

/// Split DWARF (issue 35 item 16: its `.dwo` was never read, silently):
/// the library's lock is still named by its symbol and counted exactly,
/// and the report says its fields could not be named and why.
#[test]
fn split_dwarf_is_said_not_silently_unread() {
    let dir = tempfile::tempdir().unwrap();
    let library = dir.path().join("libsplit.so");
    let status = Command::new("gcc")
        .args([
            "-O2",
            "-g",
            "-gsplit-dwarf",
            "-shared",
            "-fPIC",
            "-pthread",
            "-o",
        ])
        .arg(&library)
        .arg(crate::common::repo_root().join("fixtures/liblock.c"))
        .current_dir(dir.path())
        .status()
        .expect("gcc (scripts/setup.sh installs it)");
    assert!(status.success());
    let lib = format!("lib:{}", library.display());
    let mut target = Fixture::spawn(&fixture("mapfiles", Flavor::Glibc), &[&N.to_string(), &lib]);
    let trace = Trace::attach(target.pid(), &[]);
    target.start();
    target.wait();
    let (report, table) = trace.finish();
    assert_eq!(named(&report, "lib_lock")["acquisitions"], N, "{table}");
    assert_skipped(&report, "split_dwarf", "/libsplit.so");
    assert!(table.contains("split DWARF not read"), "{table}");
}

/// Symbols in [`many_symbols_library`].
const MANY_SYMBOLS: u64 = 2_000_000;

/// `fixtures/liblock.c` linked with [`MANY_SYMBOLS`] exported variables of
/// its own (in `.symtab` and `.dynsym`; an assembler file of `.bss`
/// labels, cheaper to build than C): generated once, kept under
/// target/fixtures.
fn many_symbols_library() -> PathBuf {
    use std::io::Write;
    let dir = crate::common::repo_root().join("target/fixtures");
    let library = dir.join("libmanysymbols.so");
    if library.exists() {
        return library;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let assembly = dir.join("manysymbols.s");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&assembly).unwrap());
    writeln!(out, "\t.section .note.GNU-stack,\"\",@progbits\n\t.bss").unwrap();
    for i in 0..MANY_SYMBOLS {
        writeln!(
            out,
            "\t.globl many_{i}\n\t.type many_{i}, @object\n\t.size many_{i}, 8\nmany_{i}:\n\t.zero 8"
        )
        .unwrap();
    }
    out.flush().unwrap();
    drop(out);
    let partial = dir.join("libmanysymbols.so.partial");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-shared", "-fPIC", "-pthread", "-o"])
        .arg(&partial)
        .arg(crate::common::repo_root().join("fixtures/liblock.c"))
        .arg(&assembly)
        .status()
        .expect("gcc (scripts/setup.sh installs it)");
    assert!(status.success());
    std::fs::rename(&partial, &library).unwrap();
    let _ = std::fs::remove_file(&assembly);
    library
}

/// Under `ulimit -v` 600 MB, a target with a library of 2 million symbols
/// (issue 52 D15: SIGABRT, "memory allocation failed" and a backtrace):
/// the recording ends normally, both locks counted exactly, and the
/// library's symbol table is skipped with its reason.
#[test]
fn a_module_too_large_for_ulimit_v_is_skipped_with_its_reason() {
    const LIMIT: u64 = 600 << 20;
    let library = many_symbols_library();
    let lib_arg = format!("lib:{}", library.display());
    let mapfiles = fixture("mapfiles", Flavor::Glibc);
    let mut target = Fixture::spawn(&mapfiles, &[&N.to_string(), &lib_arg]);
    let dir = tempfile::tempdir().unwrap();
    let (json, ready) = (dir.path().join("r.json"), dir.path().join("ready"));
    let mut tracer = Command::new("prlimit")
        .arg(format!("--as={LIMIT}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_locktrace"))
        .args(["record", "--pid", &target.pid().to_string(), "--json"])
        .arg(&json)
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("prlimit (util-linux)");
    let started = Instant::now();
    while !ready.exists() {
        if tracer.try_wait().unwrap().is_some() {
            let output = tracer.wait_with_output().unwrap();
            panic!(
                "locktrace ended before its probes were live: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "attach took too long"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    target.start();
    let global = target.address("global");
    target.wait();
    let output = tracer.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let table = crate::common::unwrapped(&String::from_utf8_lossy(&output.stdout));
    assert!(output.status.success(), "{}: {stderr}", output.status);
    assert!(!stderr.contains("memory allocation"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(acquisitions(&report, global), N, "{table}");
    let in_library = locks_in_module(&report, "/libmanysymbols.so");
    assert_eq!(in_library.len(), 1, "{table}");
    assert_eq!(in_library[0]["acquisitions"], N, "{table}");
    assert_skipped(&report, "too_many_symbols", "libmanysymbols.so");
    assert!(
        table.contains("symbol table too large for the memory limit"),
        "{table}"
    );
}
