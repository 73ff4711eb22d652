//! The release tarball (`cargo xtask dist`, issue 33): built here, unpacked
//! outside the build tree, its static locktrace counts a fixture exactly;
//! its man pages and completions are there. Real BPF: root.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::common::{Fixture, Flavor, acquisitions, fixture, repo_root};

const THREADS: u64 = 2;
const CALLS: u64 = 10_000;

/// Builds the tarball and unpacks it into `into`; returns the unpacked folder.
fn unpacked_dist(into: &Path) -> std::path::PathBuf {
    // Niced: the release build takes both cores for minutes, and the suite
    // runs other tests beside this one (tests/integration.rs).
    let output = Command::new("nice")
        .args(["-n", "19", env!("CARGO")])
        .args([
            "run",
            "--quiet",
            "--locked",
            "--package",
            "xtask",
            "--",
            "dist",
        ])
        .current_dir(repo_root())
        .stderr(Stdio::inherit())
        .output()
        .expect("running cargo xtask dist");
    assert!(output.status.success(), "cargo xtask dist failed");
    let tarball = String::from_utf8(output.stdout).unwrap();
    let tarball = tarball.trim();
    assert!(tarball.ends_with(".tar.gz"), "{tarball}");
    let status = Command::new("tar")
        .args(["xzf", tarball, "-C"])
        .arg(into)
        .status()
        .unwrap();
    assert!(status.success());
    let name = Path::new(tarball)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .trim_end_matches(".tar.gz");
    into.join(name)
}

#[test]
fn the_dist_tarball_runs_outside_the_tree_and_counts_exactly() {
    let outside = tempfile::tempdir().unwrap();
    let dist = unpacked_dist(outside.path());
    let locktrace = dist.join("bin/locktrace");
    // Static: no interpreter or shared library to find on the server.
    let file = Command::new("file").arg(&locktrace).output().unwrap();
    let file = String::from_utf8_lossy(&file.stdout);
    assert!(file.contains("static"), "{file}");
    for page in ["locktrace.1", "locktrace-record.1", "locktrace-compare.1"] {
        assert!(dist.join("man/man1").join(page).metadata().unwrap().len() > 500);
    }
    let bash = dist.join("completions/locktrace.bash");
    assert!(
        Command::new("bash")
            .arg("-n")
            .arg(&bash)
            .status()
            .unwrap()
            .success()
    );
    assert!(dist.join("LICENSE-GPL-2.0").exists());

    let mut target = Fixture::spawn(
        &fixture("locks", Flavor::Glibc),
        &[&THREADS.to_string(), &CALLS.to_string(), "100", "0"],
    );
    let global = target.address("global");
    let json = outside.path().join("report.json");
    let ready = outside.path().join("ready");
    let mut tracer = Command::new(&locktrace)
        .args(["record", "--pid", &target.pid().to_string(), "--json"])
        .arg(&json)
        .arg("--ready-file")
        .arg(&ready)
        .current_dir(outside.path())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !ready.exists() {
        assert!(tracer.try_wait().unwrap().is_none(), "locktrace exited");
        assert!(started.elapsed() < Duration::from_secs(60), "never live");
        std::thread::sleep(Duration::from_millis(10));
    }
    target.start();
    target.wait();
    assert!(tracer.wait().unwrap().success());
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(acquisitions(&report, global), THREADS * CALLS);
}
