//! The Prometheus rules shipped for `serve` (docs/prometheus): valid, and
//! their unit tests pass, under the real promtool (scripts/setup.sh
//! installs it). That every metric they use is one serve exports is
//! checked in serve.rs's unit tests.
use std::{path::PathBuf, process::Command};

fn rules_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/prometheus")
}

fn promtool(args: &[&str]) -> std::process::Output {
    Command::new("promtool")
        .args(args)
        .current_dir(rules_dir())
        .output()
        .expect("promtool: scripts/setup.sh installs it (Debian package prometheus)")
}

#[test]
fn the_rules_check_and_their_unit_tests_pass() {
    for args in [
        ["check", "rules", "locktrace-rules.yml"],
        ["test", "rules", "locktrace-rules.test.yml"],
    ] {
        let output = promtool(&args);
        assert!(
            output.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
