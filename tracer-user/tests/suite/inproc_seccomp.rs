//! `--mode inproc` on targets with a seccomp filter (issue 52 C): a filter
//! that would kill or trap the calls locktrace injects is refused in one
//! line before anything is written, and the target lives on; a filter
//! that lets them through (Docker's shape) is recorded exactly. Needs root.

use crate::common::{
    Fixture, Flavor, Trace, acquisitions, assert_one_line_error, fixture, locktrace,
};

const N: u64 = 20_000;

/// `fixtures/seccomp_target.c` with its filter `filter` installed.
fn target(filter: &str) -> Fixture {
    Fixture::spawn(&fixture("seccomp_target", Flavor::Glibc), &[filter])
}

/// Sends `command` and returns the fixture's answer.
fn ask(target: &mut Fixture, command: &str) -> String {
    target.send(command);
    target.read_line().expect("the fixture answers")
}

/// The permissions of the target's shared `/dev/zero` areas: what
/// `--mode inproc`'s mmap makes (its code, then its tables).
fn shared_zero_areas(pid: u32) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .filter(|line| line.contains("/dev/zero"))
        .filter_map(|line| line.split_whitespace().nth(1))
        .filter(|perms| perms.ends_with('s'))
        .map(str::to_string)
        .collect()
}

/// Every thread of the fixture is under its filter (TSYNC).
fn assert_filtered(pid: u32) {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        assert!(status.contains("Seccomp:\t2"), "{status}");
    }
}

/// A filter that kills on mprotect with PROT_EXEC, one that traps mmap:
/// `record --mode inproc` fails in one line naming seccomp, the call and
/// `--mode all`; the target answers with its count exact and has no new
/// mapping.
#[test]
fn filters_that_stop_the_injected_calls_are_refused() {
    for (filter, call, effect) in [
        ("kill-mprotect-exec", "mprotect", "kill it"),
        ("trap-mmap", "mmap", "SIGSYS"),
    ] {
        let mut target = target(filter);
        let pid = target.pid();
        assert_filtered(pid);
        let output = locktrace()
            .args(["record", "--pid", &pid.to_string()])
            .args(["--mode", "inproc", "--duration", "2"])
            .output()
            .unwrap();
        assert_one_line_error(&output, "seccomp");
        let stderr = String::from_utf8_lossy(&output.stderr);
        for wanted in [
            "--mode all",
            effect,
            &format!("the {call} locktrace injects"),
        ] {
            assert!(stderr.contains(wanted), "{filter}: {wanted:?} in {stderr}");
        }
        assert_eq!(
            ask(&mut target, &format!("work {N}")),
            format!("done {N}"),
            "{filter}"
        );
        assert!(target.child.try_wait().unwrap().is_none(), "{filter}");
        assert_eq!(
            shared_zero_areas(pid),
            Vec::<String>::new(),
            "{filter}: nothing was mapped"
        );
    }
}

/// A Docker-like filter that allows the injected calls: the recording
/// counts the fixture's lock exactly through the stubs and restores.
#[test]
fn a_filter_that_allows_them_is_recorded_exactly() {
    let mut target = target("allow");
    let pid = target.pid();
    assert_filtered(pid);
    let trace = Trace::attach(pid, &["--mode", "inproc"]);
    assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
    trace.interrupt();
    let (report, table) = trace.finish();
    // The work loop and its read of the count.
    assert_eq!(acquisitions(&report, target.address("global")), N + 1);
    let g_lock = crate::common::lock_named(&report, "g_lock").expect("g_lock in the report");
    assert_eq!(g_lock["counted_by"], serde_json::json!(["got_stubs"]));
    assert_eq!(
        report["inproc"]["restore"]["outcome"], "restored",
        "{table}"
    );
    assert_eq!(
        shared_zero_areas(pid),
        ["r-xs", "rw-s"],
        "locktrace's mapping stays"
    );
    assert_eq!(
        ask(&mut target, &format!("work {N}")),
        format!("done {}", 2 * N)
    );
}

/// `--stacks` on a target whose filter kills on `getppid` (the stubs'
/// sample call): the recording counts exactly with sampling off, says why
/// in one line, and the target lives; with Docker's shape (getppid let
/// through, both threads' filters read) the stubs sample.
#[test]
fn stack_samples_need_every_filter_to_let_getppid_through() {
    for (filter, sampled) in [("kill-getppid", false), ("allow", true)] {
        let mut target = target(filter);
        let pid = target.pid();
        assert_filtered(pid);
        let trace = Trace::attach(pid, &["--mode", "inproc", "--stacks", "4"]);
        assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
        trace.interrupt();
        let (report, table) = trace.finish();
        assert_eq!(acquisitions(&report, target.address("global")), N + 1);
        let inproc = &report["inproc"];
        let samples: u64 = report["stacks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|stack| stack["source"] == "sampled_lock_calls")
            .map(|stack| stack["count"].as_u64().unwrap())
            .sum();
        if sampled {
            assert_eq!(inproc["stack_sample_every"], 256, "{inproc:#}");
            assert!(inproc.get("stack_samples_off").is_none(), "{inproc:#}");
            // N calls over at most two CPUs' slots: N / 256 samples, one
            // fewer when the thread moved between CPUs.
            assert!((N / 256 - 1..=N / 256).contains(&samples), "{samples}");
        } else {
            assert!(inproc.get("stack_sample_every").is_none(), "{inproc:#}");
            let off = inproc["stack_samples_off"].as_str().unwrap();
            assert!(
                off.contains("seccomp filter") && off.contains("kill it on the getppid"),
                "{off}"
            );
            assert!(table.contains("inproc: no stack samples: "), "{table}");
            assert_eq!(samples, 0);
        }
        assert_eq!(
            ask(&mut target, &format!("work {N}")),
            format!("done {}", 2 * N),
            "the target lives on"
        );
    }
}
