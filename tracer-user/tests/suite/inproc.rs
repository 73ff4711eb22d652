//! `--mode inproc` on real processes: the GOT entries of a program and of
//! a library it loaded are switched to counting stubs, lock calls are
//! counted exactly without a trap, and every entry is put back (at the
//! end, or by the next run after a SIGKILL). Needs root.

use std::{os::unix::fs::FileExt, path::PathBuf, process::Command, time::Duration};

use crate::common::{
    Fixture, Flavor, Trace, acquisitions, fails_with, fixture, fixture_with, locktrace,
};
use locktrace::probe::{got, lockfuncs, target::Target};
use serde_json::Value;
use tracer_common::LockOp;

const N: u64 = 50_000;
const TRIES: u64 = 1_000;

/// `fixtures/liblock.c` as a shared library linked with `flags`, built
/// once per test run (tests share it: a rebuild while another test's
/// target loads it would hand that target a half-written file).
fn library(tag: &str, flags: &[&str]) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|poison| poison.into_inner());
    let out = crate::common::repo_root().join("target/fixtures");
    let path = out.join(format!("liblock-inproc-{tag}.so"));
    if built.iter().any(|done| done == tag) {
        return path;
    }
    std::fs::create_dir_all(&out).unwrap();
    let partial = out.join(format!("liblock-inproc-{tag}.so.{}", std::process::id()));
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-shared", "-fPIC", "-pthread", "-o"])
        .arg(&partial)
        .arg(crate::common::repo_root().join("fixtures/liblock.c"))
        .args(flags)
        .status()
        .expect("gcc (scripts/setup.sh installs it)");
    assert!(status.success());
    std::fs::rename(&partial, &path).unwrap();
    built.push(tag.to_string());
    path
}

/// The inproc fixture with liblock loaded, both linked with `flags`.
fn target_with_library(tag: &str, flags: &[&str]) -> Fixture {
    let library = library(tag, flags);
    Fixture::spawn(
        &fixture_with("inproc", Flavor::Glibc, flags),
        &[library.to_str().unwrap()],
    )
}

/// Sends `command` and returns the fixture's answer.
fn ask(target: &mut Fixture, command: &str) -> String {
    target.send(command);
    target.read_line().expect("the fixture answers")
}

/// Where each GOT entry of the lock functions points now: the real
/// function, the module's own lazy PLT, or elsewhere (a stub).
#[derive(Debug, PartialEq, Eq)]
enum Points {
    Original,
    Elsewhere(u64),
}

fn got_entries(pid: u32) -> Vec<(String, Points)> {
    let target = Target::open(pid).unwrap();
    let functions = lockfuncs::find(&target).unwrap();
    let (modules, _) = got::find(&target, &[LockOp::MutexLock, LockOp::MutexTrylock]);
    // Through a live thread: a main thread that left has no memory.
    let task = locktrace::probe::target::proc_task(pid);
    let memory = std::fs::File::open(format!("/proc/{task}/mem")).unwrap();
    let mut found = Vec::new();
    for module in modules {
        for slot in module.slots {
            let mut word = [0u8; 8];
            memory.read_exact_at(&mut word, slot.address).unwrap();
            let value = u64::from_le_bytes(word);
            let real = functions
                .iter()
                .find(|f| f.op == slot.op)
                .unwrap()
                .runtime_start;
            let lazy = slot.is_lazy(value);
            let points = if value == real || lazy {
                Points::Original
            } else {
                Points::Elsewhere(value)
            };
            found.push((format!("{} {:?}", slot.module, slot.op), points));
        }
    }
    assert!(!found.is_empty(), "no GOT entries found in {pid}");
    found
}

fn assert_restored(pid: u32) {
    for (entry, points) in got_entries(pid) {
        assert_eq!(points, Points::Original, "{entry} not restored");
    }
}

fn function<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["inproc"]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function"] == name)
        .unwrap_or_else(|| panic!("no {name} in {:#}", report["inproc"]))
}

fn lock_named<'a>(report: &'a Value, name: &str) -> &'a Value {
    crate::common::lock_named(report, name).unwrap_or_else(|| panic!("no lock {name}"))
}

/// Two modules (the program and liblock) calling through their own GOTs,
/// lazily bound and with `-z now`: every acquisition exact, trylock
/// successes and failures apart, counted by the stubs; every entry back
/// at its original value after the recording.
#[test]
fn two_modules_counted_exactly_lazy_and_bind_now() {
    for (tag, flags) in [("lazy", &[][..]), ("now", &["-Wl,-z,now"][..])] {
        let mut target = target_with_library(tag, flags);
        let pid = target.pid();
        let trace = Trace::attach(pid, &["--mode", "inproc"]);
        assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
        assert_eq!(
            ask(&mut target, &format!("try {TRIES}")),
            format!("tried {TRIES} {TRIES}")
        );
        trace.interrupt();
        let (report, table) = trace.finish();
        let g_lock = lock_named(&report, "g_lock");
        // The work loop, its read of the count, and the try round's lock.
        assert_eq!(g_lock["calls"]["pthread_mutex_lock"], N + 2, "{tag}");
        assert_eq!(g_lock["calls"]["pthread_mutex_trylock"], TRIES, "{tag}");
        assert_eq!(g_lock["failed_tries"], TRIES, "{tag}");
        assert_eq!(
            acquisitions(&report, target.address("global")),
            N + 2 + TRIES
        );
        assert_eq!(lock_named(&report, "lib_lock")["acquisitions"], N, "{tag}");
        for lock in ["g_lock", "lib_lock"] {
            assert_eq!(
                lock_named(&report, lock)["counted_by"],
                serde_json::json!(["got_stubs"])
            );
        }
        let lock = function(&report, "pthread_mutex_lock");
        assert_eq!(lock["counted_by"], "got_stubs");
        let modules = lock["modules"].as_array().unwrap();
        assert_eq!(modules.len(), 2, "{lock:#}");
        for module in modules {
            assert_eq!(module["bind_now"], tag == "now", "{module:#}");
        }
        // The program had not called pthread_mutex_lock before: its entry
        // still led to the lazy binder (with -z now, bound at start).
        let program = modules
            .iter()
            .find(|m| m["module"].as_str().unwrap().contains("inproc-"))
            .unwrap();
        assert_eq!(
            program["unresolved"],
            u64::from(tag == "lazy"),
            "{program:#}"
        );
        assert_eq!(report["inproc"]["restore"]["outcome"], "restored");
        assert_eq!(
            report["inproc"]["restore"]["entries"], 3,
            "{:#}",
            report["inproc"]
        );
        assert!(table.contains("all 3 GOT entries restored"), "{table}");
        assert_eq!(
            report["inproc"]["per_cpu_tables"], true,
            "this CPU has rdpid"
        );
        assert_eq!(report["overhead"]["probe_hits"], 0, "no lock call trapped");
        assert_restored(pid);
        // The target goes on, its own count right.
        assert_eq!(
            ask(&mut target, &format!("work {N}")),
            format!("done {}", 2 * N)
        );
    }
}

/// A static binary has no GOT entry for the lock functions: uprobes count
/// them, exactly, and the report says so.
#[test]
fn a_static_binary_falls_back_to_uprobes() {
    let mut target = Fixture::spawn(&fixture("inproc", Flavor::GlibcStatic), &[]);
    let trace = Trace::attach(target.pid(), &["--mode", "inproc"]);
    assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
    trace.interrupt();
    let (report, table) = trace.finish();
    assert_eq!(acquisitions(&report, target.address("global")), N + 1);
    assert_eq!(
        lock_named(&report, "g_lock")["counted_by"],
        serde_json::json!(["uprobe"])
    );
    assert_eq!(
        function(&report, "pthread_mutex_lock")["counted_by"],
        "uprobe"
    );
    assert_eq!(report["inproc"]["restore"]["outcome"], "nothing_switched");
    assert!(
        table.contains("inproc: pthread_mutex_lock counted by uprobes"),
        "{table}"
    );
}

/// musl's pthread_mutex_lock calls its timed variant inside libc: the
/// stubs count the call once, and no uprobe on the timed variant counts
/// it again.
#[test]
fn musl_lock_calls_are_counted_once() {
    let mut target = Fixture::spawn(&fixture("inproc", Flavor::Musl), &[]);
    let trace = Trace::attach(target.pid(), &["--mode", "inproc"]);
    assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
    trace.interrupt();
    let (report, _) = trace.finish();
    assert_eq!(acquisitions(&report, target.address("global")), N + 1);
    assert_eq!(
        function(&report, "pthread_mutex_lock")["counted_by"],
        "got_stubs"
    );
    assert_eq!(
        function(&report, "pthread_mutex_timedlock")["counted_by"],
        "not_counted"
    );
}

/// The stubs' mappings in the target (`/dev/zero (deleted)`, shared).
fn stub_mappings(pid: u32) -> usize {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .filter(|line| line.contains("r-xs") && line.ends_with("/dev/zero (deleted)"))
        .count()
}

fn kill(trace: Trace) {
    let mut child = trace.child;
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A recording killed with SIGKILL leaves the entries switched: the target
/// serves on with its own count exact; the next run restores them first
/// (reusing the mapping), and `locktrace restore` does it too.
#[test]
fn a_killed_recording_is_restored_by_the_next_run() {
    let mut target = target_with_library("lazy", &[]);
    let pid = target.pid();
    let trace = Trace::attach(pid, &["--mode", "inproc"]);
    assert_eq!(ask(&mut target, "spin"), "spinning");
    std::thread::sleep(Duration::from_millis(300));
    kill(trace);
    let switched = got_entries(pid)
        .into_iter()
        .filter(|(_, points)| matches!(points, Points::Elsewhere(_)))
        .count();
    assert_eq!(switched, 3, "the killed run's entries are still switched");
    let spun: u64 = ask(&mut target, "stop")
        .strip_prefix("spun ")
        .unwrap()
        .parse()
        .unwrap();
    assert!(spun > 0);
    assert_eq!(
        ask(&mut target, &format!("work {N}")),
        format!("done {}", spun + N)
    );

    let trace = Trace::attach(pid, &["--mode", "inproc"]);
    assert!(
        trace
            .stderr_lines
            .iter()
            .any(|l| l.contains("restored 3 GOT entries an earlier locktrace left switched")),
        "{:?}",
        trace.stderr_lines
    );
    assert_eq!(
        ask(&mut target, &format!("work {N}")),
        format!("done {}", spun + 2 * N)
    );
    trace.interrupt();
    let (report, _) = trace.finish();
    assert_eq!(report["inproc"]["restored_at_start"], 3);
    assert_eq!(lock_named(&report, "g_lock")["acquisitions"], N + 1);
    assert_eq!(lock_named(&report, "lib_lock")["acquisitions"], N);
    assert_eq!(stub_mappings(pid), 1, "the mapping was reused");
    assert_restored(pid);

    let trace = Trace::attach(pid, &["--mode", "inproc"]);
    kill(trace);
    let restore = |expected: &str| {
        let output = locktrace()
            .args(["restore", "--pid", &pid.to_string()])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        assert!(
            String::from_utf8_lossy(&output.stdout).contains(expected),
            "{output:?}"
        );
    };
    restore("restored 3 GOT entries");
    restore("nothing to restore");
    assert_restored(pid);
    assert_eq!(
        ask(&mut target, &format!("work {N}")),
        format!("done {}", spun + 3 * N)
    );
}

/// A second `--mode inproc` on a pid another one counts in is refused in
/// one line; the first counts on, exactly. A target another tracer holds
/// is refused too.
#[test]
fn a_second_recording_and_a_traced_target_are_refused() {
    let mut target = target_with_library("lazy", &[]);
    let pid = target.pid();
    let trace = Trace::attach(pid, &["--mode", "inproc"]);
    fails_with(
        locktrace().args([
            "record",
            "--pid",
            &pid.to_string(),
            "--mode",
            "inproc",
            "--duration",
            "1",
        ]),
        &format!(
            "another locktrace (pid {}) is counting in process {pid}",
            trace.child.id()
        ),
    );
    assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
    trace.interrupt();
    let (report, _) = trace.finish();
    assert_eq!(lock_named(&report, "g_lock")["acquisitions"], N + 1);
    assert_restored(pid);

    // SAFETY: ptrace on the fixture this test started; detached below.
    let seized = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid as i32, 0, 0) };
    assert_eq!(seized, 0, "{}", std::io::Error::last_os_error());
    fails_with(
        locktrace().args([
            "record",
            "--pid",
            &pid.to_string(),
            "--mode",
            "inproc",
            "--duration",
            "1",
        ]),
        // TracerPid names the tracing thread: this test's.
        &format!("is traced by process {}", unsafe { libc::gettid() }),
    );
    // A seized, running tracee detaches only from a stop.
    unsafe {
        libc::ptrace(libc::PTRACE_INTERRUPT, pid as i32, 0, 0);
        let mut status = 0;
        libc::waitpid(pid as i32, &mut status, libc::__WALL);
        libc::ptrace(libc::PTRACE_DETACH, pid as i32, 0, 0);
    }
    assert_eq!(
        ask(&mut target, &format!("work {N}")),
        format!("done {}", 2 * N)
    );
}

/// What the stubs cannot do is refused in one line.
#[test]
fn flags_that_need_lock_probes_are_refused() {
    let target = Fixture::spawn(&fixture("inproc", Flavor::Glibc), &[]);
    let pid = target.pid().to_string();
    for (flag, wanted) in [
        (
            &["--stack-sample-every", "64"][..],
            "--stack-sample-every applies only with --mode inproc --stacks N",
        ),
        (
            &["--handoffs"][..],
            "--handoffs is counted at the lock probes",
        ),
    ] {
        fails_with(
            locktrace()
                .args([
                    "record",
                    "--pid",
                    &pid,
                    "--mode",
                    "inproc",
                    "--duration",
                    "1",
                ])
                .args(flag),
            wanted,
        );
    }
    assert_eq!(stub_mappings(target.pid()), 0, "nothing was written");
}

/// `--stacks` with inproc: the stubs sample one acquisition in N per
/// lock, call site and CPU and the getppid tracepoint takes its stack. A
/// thread pinned to one CPU takes s_lock K times from one call site: the
/// count is exactly K, the sampled stacks hold exactly K / N samples (as
/// many getppid calls as a second tracer sees), each stack names the
/// calling function. Without `--stacks` the stubs make no call at all.
#[test]
fn stacks_are_sampled_one_in_n_and_counts_stay_exact() {
    const EVERY: u64 = 64;
    const K: u64 = EVERY * 100 + 37;
    let mut target = Fixture::spawn(&fixture("inproc", Flavor::Glibc), &[]);
    let pid = target.pid();
    for stacks in [false, true] {
        let getppids = Getppids::count(pid);
        let mut args = vec!["--mode", "inproc"];
        let every = EVERY.to_string();
        if stacks {
            args.extend(["--stacks", "4", "--stack-sample-every", &every]);
        }
        let trace = Trace::attach(pid, &args);
        assert_eq!(
            ask(&mut target, &format!("pinned {K}")),
            format!("pinned {K}")
        );
        trace.interrupt();
        let (report, table) = trace.finish();
        let calls = getppids.finish();
        let s_lock = lock_named(&report, "s_lock");
        assert_eq!(s_lock["acquisitions"], K, "{stacks}");
        let sampled: Vec<&Value> = report["stacks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|stack| stack["source"] == "sampled_lock_calls")
            .collect();
        if !stacks {
            assert!(sampled.is_empty(), "{sampled:#?}");
            assert_eq!(calls, 0, "no sample call without --stacks");
            assert!(report["inproc"].get("stack_sample_every").is_none());
            continue;
        }
        assert_eq!(report["inproc"]["stack_sample_every"], EVERY);
        assert!(
            table.contains(&format!(
                "one acquisition in {EVERY} per lock, call site and CPU"
            )),
            "{table}"
        );
        let of_s_lock: Vec<&&Value> = sampled
            .iter()
            .filter(|stack| stack["lock"] == s_lock["address"])
            .collect();
        let samples: u64 = of_s_lock
            .iter()
            .map(|stack| stack["count"].as_u64().unwrap())
            .sum();
        assert_eq!(samples, K / EVERY, "{of_s_lock:#?}");
        assert_eq!(calls, K / EVERY, "the stubs' getppid calls");
        for stack in &of_s_lock {
            let frames = stack["frames"].as_array().unwrap();
            assert_eq!(frames[0]["function"], "pthread_mutex_lock", "{stack:#}");
            assert_eq!(frames[1]["function"], "sampled_caller", "{stack:#}");
        }
        assert_restored(pid);
    }
}

/// The target's `getppid` calls, counted by bpftrace from its attach to
/// `finish`.
struct Getppids(std::process::Child);

impl Getppids {
    fn count(pid: u32) -> Getppids {
        use std::io::BufRead;
        let script =
            format!("tracepoint:syscalls:sys_enter_getppid /pid == {pid}/ {{ @n = count(); }}");
        let mut child = Command::new("bpftrace")
            // Line-buffered: its "Attaching" line says the probe is in.
            .args(["-B", "line", "-e", &script])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("bpftrace (scripts/setup.sh installs it)");
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while out.read_line(&mut line).unwrap() > 0 && !line.contains("Attaching") {
            line.clear();
        }
        assert!(line.contains("Attaching"), "bpftrace did not attach");
        child.stdout = Some(out.into_inner());
        Getppids(child)
    }

    fn finish(mut self) -> u64 {
        // Again each second: a SIGINT that came before bpftrace's handler
        // was in place left it running once (it prints on its way out).
        let started = std::time::Instant::now();
        while self.0.try_wait().unwrap().is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "bpftrace runs on"
            );
            signal(self.0.id(), libc::SIGINT);
            std::thread::sleep(Duration::from_secs(1));
        }
        let out = self.0.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|line| line.trim().strip_prefix("@n: "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no count from bpftrace: {text}"))
    }
}

/// `serve --mode inproc`: the stubs' counts in the live series, exact;
/// the entries are switched back when serve stops.
#[test]
fn serve_counts_through_the_stubs_and_restores_at_its_end() {
    use crate::common::live_views::{free_port, start_live, wait_for_sample};
    let mut target = target_with_library("lazy", &[]);
    let pid = target.pid();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (serve, _stderr) = start_live(
        &[
            "serve",
            "--pid",
            &pid.to_string(),
            "--listen",
            &listen,
            "--mode",
            "inproc",
        ],
        std::process::Stdio::null(),
    );
    assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
    for (lock, truth) in [("g_lock", N + 1), ("lib_lock", N)] {
        wait_for_sample(
            port,
            "locktrace_lock_acquisitions_total",
            &format!(r#"lock="{lock}""#),
            |n| n == Some(truth as f64),
        );
    }
    let mut serve = serve;
    // SAFETY: kill(2) on the serve this test started.
    unsafe { libc::kill(serve.0.id() as i32, libc::SIGINT) };
    assert!(serve.0.wait().unwrap().success());
    assert_restored(pid);
}

/// Every way out switches the entries back: the duration, SIGTERM, and the
/// target's exit (nothing left to restore then, and the report says so).
#[test]
fn every_way_out_restores() {
    let mut target = target_with_library("lazy", &[]);
    let pid = target.pid();
    let trace = Trace::attach(pid, &["--mode", "inproc", "--duration", "2"]);
    assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
    let (report, _) = trace.finish();
    assert_eq!(report["stopped_by"], "duration");
    assert_eq!(report["inproc"]["restore"]["outcome"], "restored");
    assert_eq!(lock_named(&report, "lib_lock")["acquisitions"], N);
    assert_restored(pid);

    let trace = Trace::attach(pid, &["--mode", "inproc"]);
    assert_eq!(
        ask(&mut target, &format!("work {N}")),
        format!("done {}", 2 * N)
    );
    // SAFETY: kill(2) on the locktrace this test started.
    unsafe { libc::kill(trace.child.id() as i32, libc::SIGTERM) };
    let (report, _) = trace.finish();
    assert_eq!(report["stopped_by"], "interrupted");
    assert_eq!(report["inproc"]["restore"]["outcome"], "restored");
    assert_eq!(lock_named(&report, "g_lock")["acquisitions"], N + 1);
    assert_restored(pid);

    let trace = Trace::attach(pid, &["--mode", "inproc"]);
    assert_eq!(
        ask(&mut target, &format!("work {N}")),
        format!("done {}", 3 * N)
    );
    target.send("quit");
    let (report, table) = trace.finish();
    assert_eq!(report["stopped_by"], "target_exited");
    assert_eq!(
        report["inproc"]["restore"]["outcome"], "target_exited",
        "{table}"
    );
    assert_eq!(lock_named(&report, "lib_lock")["acquisitions"], N);
}

/// A child forked while recording inherits the stubs: its calls are
/// counted in (the report says so), it works on, and `locktrace restore`
/// switches its entries back though no header names them any more.
#[test]
fn a_forked_child_is_said_and_restored() {
    let mut target = target_with_library("lazy", &[]);
    let pid = target.pid();
    let trace = Trace::attach(pid, &["--mode", "inproc"]);
    let child: u32 = ask(&mut target, &format!("fork {N}"))
        .strip_prefix("forked ")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
    trace.interrupt();
    let (report, table) = trace.finish();
    // The parent's work and read, and the child's N through the inherited stubs.
    assert_eq!(lock_named(&report, "g_lock")["acquisitions"], 2 * N + 1);
    assert_eq!(report["coverage"]["children_forked"], 1, "{table}");
    assert!(
        table.contains("1 children forked while recording inherited the stubs"),
        "{table}"
    );
    assert_restored(pid);
    let stubbed = got_entries(child)
        .into_iter()
        .filter(|(_, points)| matches!(points, Points::Elsewhere(_)))
        .count();
    assert_eq!(stubbed, 3, "the child's entries still lead to the stubs");
    let output = locktrace()
        .args(["restore", "--pid", &child.to_string()])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("restored 3 GOT entries"),
        "{output:?}"
    );
    assert_restored(child);
    // SAFETY: kill(2) on the fixture's child, which this test made it fork.
    unsafe { libc::kill(child as i32, libc::SIGKILL) };
}

/// Starts `locktrace ARGS` with `env`, its stderr in a temporary file
/// (removed when the returned handle drops).
fn start_locktrace(
    args: &[String],
    env: &[(&str, String)],
) -> (std::process::Child, tempfile::NamedTempFile) {
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let child = locktrace()
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(stderr.reopen().unwrap())
        .spawn()
        .unwrap();
    (child, stderr)
}

static KILLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Where a kill lands: stopped for good at instant N (the test-only pause
/// point), or N's line seen and `delay` later, racing with the writing.
#[derive(Debug, Clone, Copy)]
enum KillAt {
    Paused(u64),
    After(u64, Duration),
}

/// Runs `locktrace ARGS` and SIGKILLs it at `at`; false when it ended
/// before reaching that instant.
fn kill_at(args: &[String], at: KillAt) -> bool {
    let (n, env) = match at {
        KillAt::Paused(n) => (n, ("LOCKTRACE_TEST_PAUSE_AT", n.to_string())),
        KillAt::After(n, _) => (n, ("LOCKTRACE_TEST_INSTANTS", "1".to_string())),
    };
    let (mut child, stderr) = start_locktrace(args, &[env]);
    let needle = match at {
        KillAt::Paused(n) => format!("paused at instant {n}:"),
        KillAt::After(n, _) => format!("instant {n}:"),
    };
    let started = std::time::Instant::now();
    let reached = loop {
        if std::fs::read_to_string(stderr.path())
            .unwrap_or_default()
            .contains(&needle)
        {
            break true;
        }
        if child.try_wait().unwrap().is_some() {
            break false;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "instant {n} never came"
        );
        std::thread::sleep(Duration::from_micros(200));
    };
    if let KillAt::After(_, delay) = at {
        std::thread::sleep(delay);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    KILLS.fetch_add(u64::from(reached), std::sync::atomic::Ordering::SeqCst);
    reached
}

/// How many instants `locktrace ARGS` has on a target in this state:
/// before its probes are live (the attach), and in all.
fn instants(args: &[String]) -> (u64, u64) {
    let output = locktrace()
        .args(args)
        .env("LOCKTRACE_TEST_INSTANTS", "1")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let instant = |l: &&str| l.starts_with("locktrace: instant ");
    let before_live = stderr
        .lines()
        .take_while(|l| !l.contains(" live after "))
        .filter(instant)
        .count() as u64;
    (before_live, stderr.lines().filter(instant).count() as u64)
}

/// A target the kill test checks: spinning through the stubs, then
/// stopped; its own count must be exact and every entry restorable.
fn check_survived(target: &mut Fixture, at: KillAt, phase: &str) {
    let pid = target.pid();
    let spun: u64 = ask(target, "stop")
        .strip_prefix("spun ")
        .unwrap_or_else(|| panic!("target died after a kill at {at:?} ({phase})"))
        .parse()
        .unwrap();
    let restore = locktrace()
        .args(["restore", "--pid", &pid.to_string()])
        .output()
        .unwrap();
    assert!(restore.status.success(), "{phase} {at:?}: {restore:?}");
    assert_restored(pid);
    assert_eq!(
        ask(target, "work 1000"),
        format!("done {}", spun + 1000),
        "{phase} {at:?}"
    );
    target.send("quit");
    let status = target.child.wait().unwrap();
    assert!(
        status.success(),
        "{phase} {at:?}: the target ended {status}"
    );
}

fn record_args(pid: u32) -> Vec<String> {
    [
        "record",
        "--pid",
        &pid.to_string(),
        "--mode",
        "inproc",
        "--duration",
        "0.3",
    ]
    .map(String::from)
    .to_vec()
}

fn restore_args(pid: u32) -> Vec<String> {
    ["restore", "--pid", &pid.to_string()]
        .map(String::from)
        .to_vec()
}

/// SIGKILL of locktrace at every instant of its writing into the target,
/// at attach (`record`) and at the restore (`restore --pid` after a run
/// killed with its entries switched), lazily bound and with `-z now`,
/// each instant paused at and raced past: the target never dies, its own
/// count stays exact, and every entry is restorable after.
#[test]
fn sigkill_at_any_instant_leaves_the_target_running() {
    let delays = [
        Duration::ZERO,
        Duration::from_micros(100),
        Duration::from_millis(1),
    ];
    for (tag, flags) in [("lazy", &[][..]), ("now", &["-Wl,-z,now"][..])] {
        let spinning = || {
            let mut target = target_with_library(tag, flags);
            assert_eq!(ask(&mut target, "spin"), "spinning");
            target
        };
        // A whole attach counts its instants up to the probes going live.
        let mut probe = spinning();
        let (attach, _) = instants(&record_args(probe.pid()));
        check_survived(&mut probe, KillAt::Paused(0), "count");
        let switched = |target: &Fixture| {
            assert!(kill_at(&record_args(target.pid()), KillAt::Paused(attach)));
        };
        let mut probe = spinning();
        switched(&probe);
        let (_, restoring) = instants(&restore_args(probe.pid()));
        check_survived(&mut probe, KillAt::Paused(0), "count");
        assert!(attach >= 10 && restoring >= 6, "{attach} {restoring}");
        for n in 1..=attach {
            for at in [KillAt::Paused(n)]
                .into_iter()
                .chain(delays.map(|d| KillAt::After(n, d)))
            {
                let mut target = spinning();
                assert!(kill_at(&record_args(target.pid()), at), "{at:?}");
                check_survived(&mut target, at, "attach");
            }
        }
        for n in 1..=restoring {
            for at in [KillAt::Paused(n), KillAt::After(n, delays[1])] {
                let mut target = spinning();
                switched(&target);
                assert!(kill_at(&restore_args(target.pid()), at), "{at:?}");
                check_survived(&mut target, at, "restore");
            }
        }
    }
    let kills = KILLS.load(std::sync::atomic::Ordering::SeqCst);
    assert!(kills >= 200, "only {kills} kills");
}

/// Every thread of the target waits in a call a stop cuts short with
/// EINTR (epoll_wait, accept with a timeout): the recording stops one,
/// twice, and neither call ever returns EINTR to the target.
#[test]
fn stopped_calls_restart_instead_of_failing_with_eintr() {
    let mut target = Fixture::spawn(&fixture("eintr", Flavor::Glibc), &[]);
    std::thread::sleep(Duration::from_millis(200));
    let trace = Trace::attach(target.pid(), &["--mode", "inproc"]);
    assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
    trace.interrupt();
    let (report, _) = trace.finish();
    assert_eq!(acquisitions(&report, target.address("global")), N);
    assert_eq!(report["inproc"]["restore"]["outcome"], "restored");
    assert_eq!(ask(&mut target, "eintr"), "eintr 0 0");
}

/// Real-time signals sent to the thread locktrace writes through, while
/// it does: every one is received (none lost, none handled inside
/// locktrace's code), and the recording ends restored.
#[test]
fn real_time_signals_during_the_writing_all_arrive() {
    let mut target = Fixture::spawn(&fixture("eintr", Flavor::Glibc), &[]);
    assert_eq!(ask(&mut target, "signal"), "sending");
    for round in 1..=3 {
        let trace = Trace::attach(target.pid(), &["--mode", "inproc"]);
        assert_eq!(
            ask(&mut target, "work 100"),
            format!("done {}", 100 * round)
        );
        trace.interrupt();
        let (report, _) = trace.finish();
        assert_eq!(report["inproc"]["restore"]["outcome"], "restored");
    }
    let counts = ask(&mut target, "count");
    let (sent, received) = counts
        .strip_prefix("signals ")
        .and_then(|s| s.split_once(' '))
        .unwrap();
    assert_eq!(sent, received, "{counts}");
    assert!(sent.parse::<u64>().unwrap() > 100, "{counts}");
}

/// A thread made by a raw clone() with a TLS block of its own (what the
/// thread pointer leads to ends 0x800 bytes on, where glibc's rseq area
/// would be): the stubs never read through the thread pointer, so its
/// lock calls are counted and it lives.
#[test]
fn a_thread_with_a_tls_block_of_its_own_is_counted_and_lives() {
    let mut target = Fixture::spawn(&fixture("inproc", Flavor::Glibc), &[]);
    let trace = Trace::attach(target.pid(), &["--mode", "inproc"]);
    assert_eq!(
        ask(&mut target, &format!("clone {N}")),
        format!("cloned {N}")
    );
    trace.interrupt();
    let (report, _) = trace.finish();
    assert_eq!(acquisitions(&report, target.address("global")), N + 1);
    assert_eq!(
        lock_named(&report, "g_lock")["counted_by"],
        serde_json::json!(["got_stubs"])
    );
    assert_eq!(report["inproc"]["restore"]["outcome"], "restored");
}

/// A program that points its own GOT entry at a hook of its own (built
/// `-fno-plt`, every call goes through that entry): the entry is left
/// alone and said, the hook sees every call, and the calls are counted
/// by a uprobe (no entry of that function was switched). Before, any
/// address in the module's code passed for a lazy PLT stub: the stub
/// then called glibc directly and the hook saw nothing.
#[test]
fn a_programs_own_got_hook_is_left_alone() {
    let binary = fixture_with("inproc", Flavor::Glibc, &["-fno-plt", "-DHOOK"]);
    let mut target = Fixture::spawn(&binary, &[]);
    assert_eq!(ask(&mut target, "hook"), "hooked");
    let trace = Trace::attach(target.pid(), &["--mode", "inproc"]);
    assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
    assert_eq!(ask(&mut target, "hooks"), format!("hooks {}", N + 1));
    trace.interrupt();
    let (report, _) = trace.finish();
    let lock = function(&report, "pthread_mutex_lock");
    assert!(
        lock["not_covered"]
            .as_array()
            .unwrap()
            .iter()
            .any(|line| line.as_str().unwrap().contains("left alone")),
        "{lock:#}"
    );
    assert_eq!(acquisitions(&report, target.address("global")), N + 1);
}

/// The library whose GOT entry is switched is unloaded (dlclose) during
/// the recording, and after a killed run: the restore touches nothing
/// where it was (before, the patcher's write there killed the target
/// with SIGSEGV while locktrace exited 0), restores the rest, says so.
#[test]
fn an_unloaded_library_is_left_out_of_the_restore() {
    let mut target = target_with_library("lazy", &[]);
    let pid = target.pid();
    let trace = Trace::attach(pid, &["--mode", "inproc"]);
    assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
    assert_eq!(ask(&mut target, "close"), "closed");
    trace.interrupt();
    let (report, table) = trace.finish();
    let restore = &report["inproc"]["restore"];
    assert_eq!(restore["outcome"], "restored", "{restore:#}");
    assert_eq!(restore["entries"], 2, "{restore:#}");
    assert_eq!(restore["unloaded"], 1, "{restore:#}");
    assert!(table.contains("library was unloaded"), "{table}");
    assert_eq!(lock_named(&report, "lib_lock")["acquisitions"], N);
    assert_restored(pid);
    assert_eq!(ask(&mut target, "work 10"), format!("done {}", N + 10));

    // The same after a killed run, by `locktrace restore`.
    let mut target = target_with_library("lazy", &[]);
    let pid = target.pid();
    kill(Trace::attach(pid, &["--mode", "inproc"]));
    assert_eq!(ask(&mut target, "close"), "closed");
    let output = locktrace()
        .args(["restore", "--pid", &pid.to_string()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("restored 2 GOT entries"),
        "{output:?}"
    );
    assert_restored(pid);
    assert_eq!(ask(&mut target, "work 10"), "done 10");
}

/// The target runs another program (exec) while its entries are
/// switched: the old patcher is gone with the old program and is never
/// run; the report says so, and the new program runs on.
#[test]
fn an_exec_during_the_recording_is_said_and_the_new_program_runs() {
    let mut target = target_with_library("lazy", &[]);
    let pid = target.pid();
    let trace = Trace::attach(pid, &["--mode", "inproc"]);
    assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
    target.send("exec");
    while target.read_line().as_deref() != Some("ready") {}
    trace.interrupt();
    let (report, table) = trace.finish();
    assert_eq!(
        report["inproc"]["restore"]["outcome"], "program_replaced",
        "{:#}",
        report["inproc"]
    );
    assert!(table.contains("ran another program"), "{table}");
    assert_eq!(ask(&mut target, "work 10"), "done 10");
}

/// A library loaded while recording calls the lock functions through its
/// own GOT, which was not switched: the report names it as not counted
/// (never `lost: nothing`), and counts the program's own calls exactly.
#[test]
fn a_library_loaded_while_recording_is_said_not_counted() {
    let mut target = Fixture::spawn(&fixture("inproc", Flavor::Glibc), &[]);
    let library = library("lazy", &[]);
    let trace = Trace::attach(target.pid(), &["--mode", "inproc"]);
    let opened = ask(&mut target, &format!("open {}", library.display()));
    assert_eq!(opened, "opened");
    assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
    trace.interrupt();
    let (report, table) = trace.finish();
    assert_eq!(acquisitions(&report, target.address("global")), N + 1);
    assert_eq!(
        report["inproc"]["loaded_while_recording"],
        serde_json::json!([library.to_str().unwrap()])
    );
    assert!(!table.contains("lost: nothing"), "{table}");
    assert!(table.contains("loaded while recording"), "{table}");
    assert!(
        table.contains("lost: lock calls that do not go through a switched GOT entry"),
        "{table}"
    );
}

/// A child forked during one recording keeps taking the lock through the
/// stubs it inherited, in the mapping it shares with the parent: a later
/// recording on the parent makes a mapping of its own (the shared one is
/// never counted in again) and counts the parent's calls only.
#[test]
fn a_child_forked_earlier_adds_nothing_to_a_later_recording() {
    let mut target = Fixture::spawn(&fixture("inproc", Flavor::Glibc), &[]);
    let trace = Trace::attach(target.pid(), &["--mode", "inproc"]);
    let child: i32 = ask(&mut target, "forkspin")
        .strip_prefix("forked ")
        .unwrap()
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    trace.interrupt();
    let _ = trace.finish();
    let trace = Trace::attach(target.pid(), &["--mode", "inproc"]);
    assert_eq!(ask(&mut target, &format!("work {N}")), format!("done {N}"));
    std::thread::sleep(Duration::from_millis(200));
    trace.interrupt();
    let (report, _) = trace.finish();
    // SAFETY: kill(2) on the child this test's fixture forked, by its pid.
    unsafe { libc::kill(child, libc::SIGKILL) };
    assert_eq!(acquisitions(&report, target.address("global")), N + 1);
    assert_eq!(
        stub_mappings(target.pid()),
        2,
        "the shared mapping was reused"
    );
}

/// Issue 52 (medium): more distinct locks than the stubs' tables hold.
/// The calls that did not fit are `dropped.inproc_table_full`, one lost
/// line says so (never also `lost: nothing`), and the counted calls and
/// the dropped ones add up to the fixture's exactly.
#[test]
fn a_full_stub_table_is_one_lost_line_and_dropped_exactly() {
    const LOCKS: u64 = 40_000;
    let mut target = Fixture::spawn(&fixture("manylocks", Flavor::Glibc), &[&LOCKS.to_string()]);
    let trace = Trace::attach(target.pid(), &["--mode", "inproc"]);
    target.start();
    target.wait();
    let (report, table) = trace.finish();
    let dropped = report["dropped"]["inproc_table_full"].as_u64().unwrap_or(0);
    assert!(dropped > 0, "{table}");
    let counted: u64 = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["acquisitions"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(counted + dropped, LOCKS, "{table}");
    let lines: Vec<&str> = table
        .lines()
        .filter(|line| line.contains("inproc stubs' tables were full"))
        .collect();
    assert_eq!(
        lines,
        [format!("lost: {dropped} lock calls (the inproc stubs' tables were full; missing from every count)").as_str()],
        "{table}"
    );
    assert!(!table.contains("lost: nothing"), "{table}");
}

/// The fixture with liblock, recorded with `--mode inproc`, after a
/// `work N` it counted.
fn recording_after_work() -> (Fixture, Trace) {
    let mut target = target_with_library("lazy", &[]);
    let trace = Trace::attach(target.pid(), &["--mode", "inproc"]);
    assert_eq!(work(&mut target, N), N);
    (target, trace)
}

/// Waits (up to 10 s) until `done` holds.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let started = std::time::Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `work N` in the fixture: the count of g_lock's critical
/// sections it then prints.
fn work(target: &mut Fixture, n: u64) -> u64 {
    let done = ask(target, &format!("work {n}"));
    done.strip_prefix("done ")
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("{done}"))
}

/// `locktrace restore --pid PID`, run to its end.
fn restore_pid(pid: u32) -> std::process::Output {
    locktrace()
        .args(["restore", "--pid", &pid.to_string()])
        .output()
        .unwrap()
}

/// Waits (up to 10 s) until `/proc/PID/task/TID/FILE` of every thread
/// satisfies `wanted`.
fn wait_for_threads(pid: u32, file: &str, wanted: impl Fn(&str) -> bool) {
    wait_until(&format!("{pid} {file}"), || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .all(|task| {
                std::fs::read_to_string(task.path().join(file)).is_ok_and(|text| wanted(&text))
            })
    });
}

/// Job control stopped every thread of `pid` (state T).
fn wait_stopped(pid: u32) {
    wait_for_threads(pid, "stat", |stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    });
}

/// Sends `signal` to the fixture `pid` this test started.
fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) on the pid of a fixture this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
}

/// Waits for a locktrace expected to fail: its exit status, report and
/// stderr.
fn finish_failing(trace: Trace) -> (std::process::ExitStatus, Value, String) {
    let mut trace = trace;
    let mut table = String::new();
    std::io::Read::read_to_string(trace.child.stdout.as_mut().unwrap(), &mut table).unwrap();
    let status = trace.child.wait().unwrap();
    let report = serde_json::from_str(&std::fs::read_to_string(&trace.json).unwrap()).unwrap();
    (status, report, trace.printed())
}

/// The target is stopped (SIGSTOP) when the recording ends: no thread
/// can run the restore, so locktrace exits non-zero, its last line
/// saying the entries are still switched and how to finish, in the
/// restore's words (before: exit 0, the attach's wording). `restore`
/// says the same while it is stopped, and restores all 3 once continued.
#[test]
fn a_stopped_target_is_left_switched_and_said_how_to_finish() {
    let (mut target, trace) = recording_after_work();
    let pid = target.pid();
    signal(pid, libc::SIGSTOP);
    wait_stopped(pid);
    trace.interrupt();
    let (status, report, stderr) = finish_failing(trace);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(report["inproc"]["restore"]["outcome"], "failed");
    assert_eq!(lock_named(&report, "lib_lock")["acquisitions"], N);
    let left = format!(
        "process {pid} is stopped (SIGSTOP or job control), so no thread of it can run the restore: its 3 GOT entries are still switched to locktrace's stubs (they call the real functions: the program works on); continue it (kill -CONT {pid}), then run `locktrace restore --pid {pid}`"
    );
    assert_eq!(
        stderr.lines().last(),
        Some(format!("locktrace: GOT entries not restored: {left}").as_str()),
        "{stderr}"
    );
    assert!(!stderr.contains("nothing was written"), "{stderr}");
    assert!(!stderr.contains("before --mode inproc"), "{stderr}");
    crate::common::assert_one_line_error(&restore_pid(pid), &left);
    signal(pid, libc::SIGCONT);
    let output = restore_pid(pid);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("restored 3 GOT entries in process {pid}\n")
    );
    assert_restored(pid);
    assert_eq!(work(&mut target, N), 2 * N);
}

/// The main thread waits in `vfork` (no stop reaches it) while another
/// thread runs: the restore runs in that other thread, all 3 entries
/// back, and both threads go on with their own counts exact.
#[test]
fn the_restore_runs_in_another_thread_while_the_main_one_waits_in_vfork() {
    let (mut target, trace) = recording_after_work();
    let pid = target.pid();
    assert_eq!(ask(&mut target, "spin"), "spinning");
    // Long enough for any finish under load; its child is killed after.
    target.send("vfork 60000");
    let in_vfork = || {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/syscall"))
            .is_ok_and(|line| line.starts_with("58 "))
    };
    wait_until("the main thread in vfork", in_vfork);
    trace.interrupt();
    let (report, table) = trace.finish();
    assert!(in_vfork(), "the restore ended while the main thread waited");
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let child: u32 = children.split_whitespace().next().unwrap().parse().unwrap();
    signal(child, libc::SIGKILL);
    let restore = &report["inproc"]["restore"];
    assert_eq!(restore["outcome"], "restored", "{table}");
    assert_eq!(restore["entries"], 3, "{restore:#}");
    assert_eq!(lock_named(&report, "lib_lock")["acquisitions"], N);
    assert_restored(pid);
    assert_eq!(target.read_line().as_deref(), Some("vforked"));
    let spun: u64 = ask(&mut target, "stop")
        .strip_prefix("spun ")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        ask(&mut target, "work 10"),
        format!("done {}", N + spun + 10)
    );
}

/// The only thread waits in `vfork`: nothing can run the restore, so
/// locktrace exits non-zero saying the entries are still switched and how
/// to finish (never "nothing was written"); once the child has exited,
/// `locktrace restore` puts all 3 back.
#[test]
fn a_target_stuck_in_vfork_is_left_switched_and_said_how_to_finish() {
    let (mut target, trace) = recording_after_work();
    let pid = target.pid();
    target.send("vfork 6000");
    wait_for_threads(pid, "syscall", |line| line.starts_with("58 "));
    trace.interrupt();
    let (status, report, stderr) = finish_failing(trace);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(report["inproc"]["restore"]["outcome"], "failed");
    assert_eq!(
        stderr.lines().last(),
        Some(format!(
            "locktrace: GOT entries not restored: no thread of process {pid} can run the restore now without disturbing it (each is in a call a stop would cut short, or waits where no stop reaches it, as a vfork's parent does): its 3 GOT entries are still switched to locktrace's stubs (they call the real functions: the program works on); run `locktrace restore --pid {pid}` once it runs on (after kill -CONT {pid} if it is stopped)"
        ).as_str()),
        "{stderr}"
    );
    assert!(!stderr.contains("nothing was written"), "{stderr}");
    assert_eq!(target.read_line().as_deref(), Some("vforked"));
    let output = restore_pid(pid);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("restored 3 GOT entries in process {pid}\n"),
        "{output:?}"
    );
    assert_restored(pid);
    assert_eq!(ask(&mut target, "work 10"), format!("done {}", N + 10));
}

/// The main thread leaves with pthread_exit (a zombie leader) while the
/// process runs on: the recording counting then goes on and restores all
/// 3 entries (before: its mapping read as gone, "ran another program",
/// nothing restored), and a new `--pid` on the process is traced (before:
/// "process N exited"), its counts exact.
#[test]
fn a_process_whose_main_thread_left_is_traced() {
    let (mut target, trace) = recording_after_work();
    let pid = target.pid();
    assert_eq!(ask(&mut target, "leave"), "leaving");
    let leader_gone = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .unwrap()
                .1
                .trim_start()
                .starts_with('Z')
        })
    };
    wait_until("the main thread a zombie", leader_gone);
    assert_eq!(work(&mut target, N), 2 * N);
    trace.interrupt();
    let (report, table) = trace.finish();
    assert_eq!(report["stopped_by"], "interrupted", "{table}");
    let restore = &report["inproc"]["restore"];
    assert_eq!(restore["outcome"], "restored", "{table}");
    assert_eq!(restore["entries"], 3, "{restore:#}");
    assert_eq!(lock_named(&report, "g_lock")["acquisitions"], 2 * N + 2);
    assert_eq!(lock_named(&report, "lib_lock")["acquisitions"], 2 * N);
    assert_restored(pid);

    let trace = Trace::attach(pid, &["--mode", "inproc"]);
    assert_eq!(work(&mut target, N), 3 * N);
    trace.interrupt();
    let stderr = trace.printed();
    let (report, table) = trace.finish();
    assert!(!stderr.contains("exited"), "{stderr}");
    assert_eq!(
        report["inproc"]["restore"]["outcome"], "restored",
        "{table}"
    );
    // pthread_exit loaded libgcc_s (to unwind), which has an entry too.
    assert_eq!(
        report["inproc"]["restore"]["entries"], 4,
        "{:#}",
        report["inproc"]
    );
    assert_eq!(lock_named(&report, "g_lock")["acquisitions"], N + 1);
    assert_eq!(lock_named(&report, "lib_lock")["acquisitions"], N);
    assert_restored(pid);
    assert_eq!(ask(&mut target, "work 10"), format!("done {}", 3 * N + 10));
}

/// CPUs the kernel may number (`/sys/devices/system/cpu/possible`), as
/// locktrace sizes its mapping.
fn possible_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let last: usize = text
        .trim()
        .rsplit(['-', ','])
        .next()
        .unwrap()
        .parse()
        .unwrap();
    last + 1
}

/// Mappings that start like locktrace's (its magic) with fields no run of
/// it writes: shorter than the header says (before: SIGBUS), a size that
/// is not a mapping's (before: a panic, rc 101), a record whose stub is
/// not in its code, shorter than a header. Each is said in one line and
/// left as it is; the recording counts exactly and restores, and
/// `restore` finds nothing to restore.
#[test]
fn a_forged_leftover_header_is_said_and_left_alone() {
    use locktrace::trace::inproc::layout;
    let cpus = possible_cpus();
    let real = layout::mapping_bytes(cpus);
    let version = layout::VERSION;
    for (bytes, size, records, why) in [
        (
            8192,
            real,
            0,
            format!("its header says {real} bytes, the memory behind it holds 8192"),
        ),
        (
            real,
            0x100,
            0,
            format!("its header's size (256) is not that of a mapping with {cpus} CPU tables"),
        ),
        (
            real,
            real,
            5,
            "a GOT entry record's stub 0x4141414141414141 is outside its code".to_string(),
        ),
        (
            4096,
            real,
            0,
            "4096 bytes, shorter than locktrace's header (8192)".to_string(),
        ),
    ] {
        let mut target = Fixture::spawn(&fixture("inproc", Flavor::Glibc), &[]);
        let pid = target.pid();
        let forged = ask(
            &mut target,
            &format!("forge {bytes} {version} {size} {cpus} {records}"),
        );
        let at = u64::from_str_radix(forged.strip_prefix("forged 0x").unwrap(), 16).unwrap();
        let header = |pid: u32| {
            let mut page = vec![0u8; 4096];
            let memory = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
            memory.read_exact_at(&mut page, at).unwrap();
            page
        };
        let before = header(pid);
        let line = format!(
            "locktrace: a mapping at {at:#x} in process {pid} starts like locktrace's but is not one it made ({why}): left as it is"
        );
        let trace = Trace::attach(pid, &["--mode", "inproc"]);
        assert!(
            trace.stderr_lines.contains(&line),
            "{line}\n{:?}",
            trace.stderr_lines
        );
        assert_eq!(work(&mut target, N), N);
        trace.interrupt();
        let (report, table) = trace.finish();
        assert_eq!(acquisitions(&report, target.address("global")), N + 1);
        assert_eq!(
            report["inproc"]["restore"]["outcome"], "restored",
            "{table}"
        );
        assert_eq!(report["inproc"]["restored_at_start"], 0);
        let output = restore_pid(pid);
        assert!(output.status.success(), "{output:?}");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!("nothing to restore in process {pid}: no GOT entry is left switched\n")
        );
        assert_eq!(String::from_utf8_lossy(&output.stderr), format!("{line}\n"));
        assert_eq!(header(pid), before, "the forged mapping was written");
        assert_restored(pid);
    }
}

/// The program's GOT is sealed (mseal; built `-z now`, its GOT is in
/// the sealed RELRO pages): the switch's mprotect is refused after
/// locktrace's mapping was made. The attach is refused in one line, and
/// the process's maps are exactly as before (before: the 1 MiB mapping
/// stayed); the program counts on.
#[test]
fn a_refused_attach_leaves_nothing_in_the_target() {
    let binary = fixture_with("inproc", Flavor::Glibc, &["-Wl,-z,now"]);
    let mut target = Fixture::spawn(&binary, &[]);
    let pid = target.pid();
    assert_eq!(ask(&mut target, "seal"), "sealed");
    let maps = || std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let before = maps();
    let output = locktrace().args(record_args(pid)).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let refusal = stderr.lines().last().unwrap();
    assert!(
        refusal.starts_with("locktrace: mprotect of the GOT page ")
            && refusal.ends_with(
                " in the target failed: Operation not permitted (os error 1) (a sealed page?); use --mode all"
            ),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().filter(|l| l.contains("GOT")).count(),
        1,
        "{stderr}"
    );
    assert_eq!(maps(), before);
    assert_eq!(stub_mappings(pid), 0);
    assert_eq!(work(&mut target, N), N);
}

/// Runs this test's traced child `pid` (stopped) to the entry of its
/// `openat` of a path ending in `name`, and leaves it stopped there.
fn run_to_openat(pid: i32, name: &str) {
    let memory = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut entering = true;
    loop {
        // SAFETY: ptrace on this test's own traced, stopped child.
        assert_eq!(unsafe { libc::ptrace(libc::PTRACE_SYSCALL, pid, 0, 0) }, 0);
        let mut status = 0;
        // SAFETY: waits for this test's own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFSTOPPED(status), "{status:#x}");
        if libc::WSTOPSIG(status) != libc::SIGTRAP {
            continue;
        }
        // SAFETY: a plain C struct of integers, filled by PTRACE_GETREGS.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: PTRACE_GETREGS writes one user_regs_struct.
        unsafe { libc::ptrace(libc::PTRACE_GETREGS, pid, 0, &mut regs) };
        let entry = entering;
        entering = !entering;
        if !entry || regs.orig_rax != libc::SYS_openat as u64 {
            continue;
        }
        let mut path = vec![0u8; 256];
        let read = memory.read_at(&mut path, regs.rsi).unwrap_or(0);
        let path = &path[..read];
        let path = &path[..path.iter().position(|&b| b == 0).unwrap_or(path.len())];
        if String::from_utf8_lossy(path).ends_with(name) {
            return;
        }
    }
}

/// Attached while the dynamic loader is between libraries (the preloaded
/// liblock mapped, libc.so.6 not yet): "still starting", naming the
/// library it waits for (before: "does not use pthread mutexes"); once
/// the loader runs on, locktrace attaches and counts exactly.
#[test]
fn a_target_caught_between_its_libraries_is_waited_for() {
    let child = crate::common::spawn_stopped_at_exec(
        Command::new(fixture("inproc", Flavor::Glibc))
            .env("LD_PRELOAD", library("lazy", &[]))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped()),
    );
    let pid = child.id() as i32;
    run_to_openat(pid, "libc.so.6");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.contains("liblock-inproc-lazy.so"), "{maps}");
    assert!(!maps.contains("libc.so.6"), "{maps}");
    let mut trace = Trace::launch(pid as u32, &[], &[]);
    let waiting = trace.wait_for_stderr("is still starting");
    assert!(
        waiting.contains(&format!(
            "process {pid} is still starting (in its dynamic loader)"
        )),
        "{waiting}"
    );
    // SAFETY: detaches this test's own stopped child, which then runs on.
    assert_eq!(unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) }, 0);
    let mut target = Fixture::adopt(child);
    trace.wait_live();
    assert_eq!(work(&mut target, N), N);
    trace.interrupt();
    let printed = trace.printed();
    let (report, table) = trace.finish();
    assert!(
        !printed.contains("does not use pthread mutexes"),
        "{printed}"
    );
    assert_eq!(
        acquisitions(&report, target.address("global")),
        N + 1,
        "{table}"
    );
}

/// Stopped (SIGINT) while attaching, before the probes are live: the
/// stubs' counts fall inside the window the report gives (before: a
/// "0.00 s" window held what the stubs counted through the whole attach).
/// The spinner's own rate, measured without locktrace (which only slows
/// it), bounds what a window of that length can hold.
#[test]
fn a_stop_during_the_attach_keeps_the_counts_inside_the_window() {
    let mut target = Fixture::spawn(&fixture("inproc", Flavor::Glibc), &[]);
    let pid = target.pid();
    let spun_for = |target: &mut Fixture, time: Duration| {
        assert_eq!(ask(target, "spin"), "spinning");
        std::thread::sleep(time);
        ask(target, "stop")
            .strip_prefix("spun ")
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let alone = spun_for(&mut target, Duration::from_millis(500));
    // The pipe's round trips make the time a little longer: the rate a
    // little lower than the truth, never higher.
    let rate = alone as f64 / 0.5;
    assert_eq!(ask(&mut target, "spin"), "spinning");
    let trace = Trace::launch(pid, &["--mode", "inproc"], &[]);
    trace.wait_for_stderr("GOT entries switched to counting stubs");
    trace.interrupt();
    let (report, table) = trace.finish();
    let window = report["duration_s"].as_f64().unwrap();
    // No row, or a row with null acquisitions (its waits seen, its calls
    // not counted: stopped before the counting began), is 0 counted.
    let counted = crate::common::lock_named(&report, "g_lock")
        .and_then(|lock| lock["acquisitions"].as_u64())
        .unwrap_or(0);
    assert!(
        counted as f64 <= 2.0 * rate * window + 10_000.0,
        "{counted} acquisitions in a {window} s window, at most {rate:.0}/s alone\n{table}"
    );
    assert_eq!(report["inproc"]["restore"]["outcome"], "restored");
    let spun: u64 = ask(&mut target, "stop")
        .strip_prefix("spun ")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(ask(&mut target, "work 10"), format!("done {}", spun + 10));
}

/// Stop 57's FrankenPHP crash ("unknown caller pc" in Go's garbage
/// collector): the first injected mmap's return frame goes on the stack of
/// the thread it stops, and a Go thread in a syscall has its stack pointer
/// on a goroutine's stack inside Go's heap, which a `---p` reservation
/// sits under like a guard page. The frame overwrote what lay below. Here
/// a thread waits in futex (the first kind of thread picked) with its
/// stack pointer in the middle of such a mapping, filled with a pattern:
/// `record --mode inproc` picks another thread, every byte stays, and the
/// counts are exact.
#[test]
fn no_return_frame_goes_on_a_stack_inside_a_heap() {
    let mut target = target_with_library("lazy", &[]);
    let pid = target.pid();
    assert_eq!(ask(&mut target, "park"), "parked");
    let trace = Trace::attach(pid, &["--mode", "inproc"]);
    assert_eq!(ask(&mut target, "work 1000"), "done 1000");
    trace.interrupt();
    let (report, table) = trace.finish();
    assert_eq!(ask(&mut target, "unpark"), "intact", "{table}");
    assert_eq!(acquisitions(&report, target.address("global")), 1001);
    assert_restored(pid);
}
