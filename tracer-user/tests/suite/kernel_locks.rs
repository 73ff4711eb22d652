//! Issue 50: kernel lock contention (`lock:contention_begin`/`end`) of the
//! target, joined to the user side. fixtures/map_worker.c contends for its
//! process's mmap_lock (mmap and munmap write, first-touch faults read);
//! fixtures/hot_mutex.c drives futex-bucket and runqueue spinlock
//! contention from one hot user mutex. The figures are checked against a
//! second, independent BPF count: bpftrace on the same tracepoints over
//! the same window (both attached before the fixture works and stopped
//! after it is done; its threads are idle in between). Real BPF: run as root.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::common::*;
use serde_json::Value;

/// bpftrace's own count of the target's contentions: every begin by
/// flags, and the wait of the outermost ones, with the same nesting rule
/// as locktrace (a begin while the thread waits is nested; only the end
/// of the lock it waits for ends it).
fn bpftrace_script(pid: u32) -> String {
    format!(
        r#"BEGIN {{ printf("attached\n"); }}
tracepoint:lock:contention_begin /pid == {pid}/ {{
  @begins[args->flags] = count();
  if (@start[tid] == 0) {{ @start[tid] = nsecs; @lock[tid] = (uint64)args->lock_addr; }}
}}
tracepoint:lock:contention_end /pid == {pid} && @start[tid] != 0 && @lock[tid] == (uint64)args->lock_addr/ {{
  @wait_ns = sum(nsecs - @start[tid]);
  @ends = count();
  delete(@start[tid]);
  delete(@lock[tid]);
}}
END {{ clear(@start); clear(@lock); }}"#
    )
}

/// A running bpftrace, attached.
struct Bpftrace {
    child: Child,
}

/// What bpftrace counted: begins by flags, outermost contentions and their wait.
#[derive(Debug, Default)]
struct Counted {
    begins: Vec<(u32, u64)>,
    ends: u64,
    wait_ns: u64,
}

impl Bpftrace {
    fn attach(pid: u32) -> Bpftrace {
        Bpftrace::run(&bpftrace_script(pid))
    }

    /// Starts bpftrace on `script` (whose BEGIN prints `attached`) and
    /// returns once it is attached.
    fn run(script: &str) -> Bpftrace {
        let mut child = Command::new("bpftrace")
            .args(["-e", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("bpftrace (scripts/setup.sh installs it)");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.contains("attached") {
            line.clear();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "bpftrace exited before attaching"
            );
        }
        child.stdout = Some(stdout.into_inner());
        Bpftrace { child }
    }

    /// Stops bpftrace (SIGINT, by its pid); what it printed of its maps.
    fn stop(mut self) -> String {
        // SAFETY: kill(2) on the pid of the child this test started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let mut text = String::new();
        std::io::Read::read_to_string(self.child.stdout.as_mut().unwrap(), &mut text).unwrap();
        self.child.wait().unwrap();
        text
    }

    /// Stops bpftrace and reads its maps.
    fn finish(self) -> Counted {
        let text = self.stop();
        let mut counted = Counted::default();
        for line in text.lines() {
            let Some((name, value)) = line.split_once(": ") else {
                continue;
            };
            let value: u64 = value.trim().parse().unwrap_or(0);
            if let Some(flags) = name
                .strip_prefix("@begins[")
                .and_then(|r| r.strip_suffix(']'))
            {
                counted.begins.push((flags.parse().unwrap(), value));
            } else if name == "@ends" {
                counted.ends = value;
            } else if name == "@wait_ns" {
                counted.wait_ns = value;
            }
        }
        counted
    }
}

/// Runs `fixture ARGS` under `record EXTRA…` and bpftrace; starts its work
/// once both are attached and stops both once it is done.
fn record_with_bpftrace(
    name: &str,
    args: &[&str],
    extra: &[&str],
) -> (Value, String, Counted, Fixture) {
    let binary = fixture(name, Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, args);
    let trace = Trace::attach(fixture.pid(), extra);
    let bpftrace = Bpftrace::attach(fixture.pid());
    // bpftrace prints from BEGIN once its probes are in; a moment more.
    std::thread::sleep(Duration::from_millis(200));
    fixture.send("go");
    while fixture.read_line().as_deref() != Some("done") {}
    let counted = bpftrace.finish();
    trace.interrupt();
    let (report, table) = trace.finish();
    (report, table, counted, fixture)
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a count: {value}"))
}

fn kernel_rows<'a>(report: &'a Value, name: &str, kind: &str) -> Vec<&'a Value> {
    report["kernel_locks"]["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|lock| lock["name"] == name && lock["kind"] == kind)
        .collect()
}

/// Within one row: its sites add up to its contentions, and each site's
/// stacks to the site's.
fn assert_rows_add_up(report: &Value) {
    for lock in report["kernel_locks"]["locks"].as_array().unwrap() {
        let contentions = u(&lock["contentions"]);
        let sum = |list: &Value| -> u64 {
            list.as_array()
                .unwrap()
                .iter()
                .map(|x| u(&x["contentions"]))
                .sum()
        };
        assert_eq!(sum(&lock["kernel_sites"]), contentions, "{lock}");
        assert_eq!(sum(&lock["user_sites"]), contentions, "{lock}");
    }
}

/// The contentions of a row's user stacks through `caller`, and in all.
fn through(row: &Value, caller: &str) -> (u64, u64) {
    let (mut hit, mut all) = (0, 0);
    for site in row["user_sites"].as_array().unwrap() {
        for stack in site["stacks"].as_array().unwrap() {
            let n = u(&stack["contentions"]);
            all += n;
            if frame_functions(stack).iter().any(|f| f == caller) {
                hit += n;
            }
        }
    }
    (hit, all)
}

/// The begins bpftrace saw with `flags`.
fn begins(counted: &Counted, flags: u32) -> u64 {
    counted
        .begins
        .iter()
        .filter(|(f, _)| *f == flags)
        .map(|(_, n)| n)
        .sum()
}

/// mmap_lock: write side in munmap and mmap, read side in page faults, as
/// rows of their own, attributed to map_worker's call sites; every count
/// equal to bpftrace's, the wait within the bound below.
#[test]
fn mmap_lock_contention_by_side_matches_an_independent_count() {
    let dir = tempfile::tempdir().unwrap();
    let pprof = dir.path().join("profile.pb.gz");
    let (report, table, counted, _fixture) = record_with_bpftrace(
        "map_worker",
        &["3000"],
        &["--stacks", "4", "--pprof", pprof.to_str().unwrap()],
    );
    let section = &report["kernel_locks"];
    assert!(section["unavailable"].is_null(), "{section}");
    // Every begin bpftrace saw is a contention or a nested begin here.
    let all_begins: u64 = counted.begins.iter().map(|(_, n)| n).sum();
    assert_eq!(
        u(&section["contentions"]) + u(&section["nested"]),
        all_begins,
        "{counted:?}"
    );
    assert_eq!(u(&section["contentions"]), counted.ends, "{counted:?}");
    assert_eq!(u(&section["lost"]), 0);
    // The two programs read the clock one after the other at each end of
    // a contention: the same wait but for the time between their reads,
    // a few µs, unless the host preempts this VM's CPU in between (a
    // shared 2-CPU VM: up to ms). Within 10 µs a contention and 3 %.
    let (ours, theirs) = (u(&section["wait_ns"]), counted.wait_ns);
    assert!(
        ours.abs_diff(theirs) <= 10_000 * counted.ends + theirs * 3 / 100,
        "wait {ours} ns here, {theirs} ns by bpftrace, {} contentions",
        counted.ends
    );
    // The sides apart: rwsems are never nested (no sleeping under a
    // spinlock), so each side's count is bpftrace's begins of its flags.
    let write = kernel_rows(&report, "mmap_lock", "rwsem_write");
    let read = kernel_rows(&report, "mmap_lock", "rwsem_read");
    assert_eq!((write.len(), read.len()), (1, 1), "{section}");
    let (write, read) = (write[0], read[0]);
    assert_eq!(write["address"], read["address"]);
    assert_eq!(u(&write["contentions"]), begins(&counted, 4), "{counted:?}");
    assert_eq!(u(&read["contentions"]), begins(&counted, 2), "{counted:?}");
    assert!(u(&write["contentions"]) > 0 && u(&read["contentions"]) > 0);
    let sites = |row: &Value| -> Vec<String> {
        row["kernel_sites"]
            .as_array()
            .unwrap()
            .iter()
            .map(|site| site["function"].as_str().unwrap().to_string())
            .collect()
    };
    let side_by = |row: &Value, functions: &[&str]| -> u64 {
        row["kernel_sites"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|site| functions.contains(&site["function"].as_str().unwrap()))
            .map(|site| u(&site["contentions"]))
            .sum()
    };
    // Other writers of the mm (glibc growing an arena with mprotect) meet
    // a reader now and then: nine in ten at least are munmap and mmap.
    let munmap_and_mmap = side_by(write, &["__vm_munmap", "vm_mmap_pgoff"]);
    assert!(
        munmap_and_mmap * 10 >= u(&write["contentions"]) * 9,
        "{munmap_and_mmap} of the write side's waits in munmap and mmap: {write}"
    );
    assert!(sites(write).contains(&"__vm_munmap".to_string()), "{write}");
    // The read side: fault_worker's page faults, and its madvise
    // (MADV_DONTNEED) that drops the pages again, when they meet a writer.
    // Other readers of the mm (a futex call faulting its word in, glibc
    // trimming an arena) meet a writer now and then: nine in ten at least.
    let faults_and_madvise = side_by(read, &["lock_mm_and_find_vma", "madvise_do_behavior"]);
    assert!(
        faults_and_madvise * 10 >= u(&read["contentions"]) * 9,
        "{faults_and_madvise} of the read side's waits in faults and madvise: {read}"
    );
    assert!(
        sites(read).contains(&"lock_mm_and_find_vma".to_string()),
        "{read}"
    );
    assert_rows_add_up(&report);
    // The user side: the stacks stand for every contention, and those of
    // munmap and of the faults all come from map_worker's code (the
    // fault_worker's one munmap and the threads' stacks aside).
    let (by_worker, all) = through(write, "map_worker");
    assert_eq!(all, u(&write["contentions"]), "{write}");
    assert!(by_worker * 10 >= all * 9, "{by_worker} of {all}: {write}");
    let (touch, all) = through(read, "touch");
    let (madvise, _) = through(read, "madvise");
    // A worker thread's exit takes the read side too (`do_exit`, from
    // `start_thread`): counted since the threads' exits are waited for
    // (issue 50), it meets a writer now and then on a loaded machine.
    let exits = side_by(read, &["do_exit"]);
    // Other faults of its threads (libc's code touching a new page) meet
    // a writer now and then on a loaded machine (one of 345 read-side
    // contentions, at an ip in libc, once): nine in ten at least are the
    // fixture's, and the stacks stand for every contention exactly.
    let fixtures = touch + madvise + exits;
    assert!(fixtures <= all && fixtures * 10 >= all * 9, "{read}");
    assert_eq!(all, u(&read["contentions"]), "{read}");
    assert!(table.contains("mmap_lock (rwsem write"), "{table}");
    assert!(table.contains("mmap_lock (rwsem read"), "{table}");
    assert_pprof_has_the_sides(&pprof, &counted, write);
}

/// pprof: each mmap_lock side's samples (leaf `kernel lock mmap_lock
/// (KIND)`) add up to bpftrace's begins of its flags, and the write
/// side's samples through `__vm_munmap` to that kernel site's count.
fn assert_pprof_has_the_sides(path: &std::path::Path, counted: &Counted, write: &Value) {
    use prost::Message;
    let mut bytes = Vec::new();
    let file = std::fs::File::open(path).unwrap();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(file), &mut bytes).unwrap();
    let profile = locktrace::render::pprof::Profile::decode(bytes.as_slice()).unwrap();
    let name = |id: u64| {
        let function = &profile.function[id as usize - 1];
        profile.string_table[function.name as usize].clone()
    };
    // sample_type: acquisitions, contentions, delay, cpu.
    let sum = |leaf: &str, through: Option<&str>| -> u64 {
        let mut total = 0;
        for sample in &profile.sample {
            let frames: Vec<String> = sample.location_id.iter().map(|&id| name(id)).collect();
            if frames[0] == leaf && through.is_none_or(|f| frames.iter().any(|x| x == f)) {
                total += sample.value[1] as u64;
            }
        }
        total
    };
    let write_leaf = "kernel lock mmap_lock (rwsem write)";
    assert_eq!(sum(write_leaf, None), begins(counted, 4), "{counted:?}");
    let read_leaf = "kernel lock mmap_lock (rwsem read)";
    assert_eq!(sum(read_leaf, None), begins(counted, 2), "{counted:?}");
    let munmap = write["kernel_sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|site| site["function"] == "__vm_munmap")
        .map(|site| u(&site["contentions"]))
        .unwrap();
    assert_eq!(sum(write_leaf, Some("__vm_munmap")), munmap, "{write}");
}

/// A hot mutex: its futex calls' kernel contention (futex hash bucket,
/// runqueue) is on its row, exactly what the kernel rows say of it.
#[test]
fn a_hot_mutex_row_carries_the_kernel_contention_of_its_futex_calls() {
    let (report, table, counted, fixture) = record_with_bpftrace("hot_mutex", &["200000"], &[]);
    let address = fixture.address("g_lock");
    let row = lock_at(&report, address).unwrap_or_else(|| panic!("no g_lock: {report}"));
    let section = &report["kernel_locks"];
    let all_begins: u64 = counted.begins.iter().map(|(_, n)| n).sum();
    assert_eq!(
        u(&section["contentions"]) + u(&section["nested"]),
        all_begins,
        "{counted:?}"
    );
    let mut joined = 0;
    let mut spin_ns = 0;
    let mut kinds = Vec::new();
    for lock in section["locks"].as_array().unwrap() {
        for user in lock["user_locks"].as_array().into_iter().flatten() {
            if user["address"] == row["address"] {
                joined += u(&user["contentions"]);
                kinds.push(lock["name"].as_str().unwrap_or("?").to_string());
                if ["spinlock", "rwlock_read", "rwlock_write"]
                    .contains(&lock["kind"].as_str().unwrap())
                {
                    spin_ns += u(&user["wait_ns"]);
                }
            }
        }
    }
    // The removal price's kernel locks part: exactly those spins.
    assert!(spin_ns > 0, "{section}");
    let part = &row["removal"]["kernel_locks"];
    assert_eq!(part["ns"].as_f64(), Some(spin_ns as f64), "{row}");
    assert_eq!(part["basis"], "traced", "{row}");
    assert!(joined > 0, "no kernel contention under g_lock: {section}");
    assert_eq!(u(&row["kernel_contentions"]), joined, "{row}");
    assert!(
        kinds
            .iter()
            .any(|k| k == "futex hash bucket" || k == "runqueue"),
        "{kinds:?}"
    );
    assert_eq!(u(&row["acquisitions"]), 4 * 200_000);
    assert!(table.contains("kernel locks"), "{table}");
}

/// A kernel without the lock tracepoints (5.10; here the stand-in switch):
/// one line says so, the section says why, everything else is counted.
#[test]
fn without_the_lock_tracepoints_one_line_says_why() {
    let binary = fixture("hot_mutex", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["1000", "2"]);
    let trace = Trace::attach_env(
        fixture.pid(),
        &[],
        &[("LOCKTRACE_TEST_KERNEL_WITHOUT", "lock_events")],
    );
    let said = trace.printed();
    fixture.send("go");
    while fixture.read_line().as_deref() != Some("done") {}
    trace.interrupt();
    let (report, table) = trace.finish();
    let line = "kernel locks section unavailable: this kernel has no lock:contention_begin tracepoint (Linux 5.19+ has it)";
    assert_eq!(said.matches(line).count(), 1, "{said}");
    assert_eq!(
        report["kernel_locks"]["unavailable"],
        "this kernel has no lock:contention_begin tracepoint (Linux 5.19+ has it)"
    );
    assert_eq!(report["kernel_locks"]["locks"], serde_json::json!([]));
    let g_lock = lock_at(&report, fixture.address("g_lock")).expect("g_lock counted");
    assert_eq!(u(&g_lock["acquisitions"]), 2 * 1000);
    assert!(
        table.contains("kernel locks: unavailable: this kernel has no lock:contention_begin"),
        "{table}"
    );
}

/// `--no-kernel-locks` (their kernel stacks are the largest part of an
/// always-on recording's cost, docs/benchmarks.md): the programs stay out,
/// the section says why, the user locks are counted exactly, in the
/// always-on mode.
#[test]
fn no_kernel_locks_leaves_them_out_and_says_so() {
    let binary = fixture("hot_mutex", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["1000", "2"]);
    let trace = Trace::attach(fixture.pid(), &["--mode", "inproc", "--no-kernel-locks"]);
    fixture.send("go");
    while fixture.read_line().as_deref() != Some("done") {}
    trace.interrupt();
    let (report, table) = trace.finish();
    let why = "not traced (--no-kernel-locks); drop it to see what the target waits for inside the kernel";
    assert_eq!(report["kernel_locks"]["unavailable"], why, "{table}");
    assert_eq!(report["kernel_locks"]["locks"], serde_json::json!([]));
    assert_eq!(report["kernel_locks"]["contentions"], 0);
    let g_lock = lock_at(&report, fixture.address("g_lock")).expect("g_lock counted");
    assert_eq!(u(&g_lock["acquisitions"]), 2 * 1000);
    assert!(
        table.contains(&format!("kernel locks: unavailable: {why}")),
        "{table}"
    );
}

/// serve (`/metrics`): the kernel lock series of mmap_lock's two sides
/// equal bpftrace's begins of their flags once the fixture is done.
#[test]
fn serve_exports_the_kernel_lock_series_of_an_independent_count() {
    use crate::common::live_views::{free_port, start_live, wait_for_sample};
    let binary = fixture("map_worker", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["3000"]);
    let (port, pid) = (free_port(), fixture.pid().to_string());
    let listen = format!("127.0.0.1:{port}");
    let (_serve, said) = start_live(
        &["serve", "--pid", &pid, "--listen", &listen, "--no-cpu"],
        Stdio::null(),
    );
    let bpftrace = Bpftrace::attach(fixture.pid());
    std::thread::sleep(Duration::from_millis(200));
    fixture.send("go");
    while fixture.read_line().as_deref() != Some("done") {}
    let counted = bpftrace.finish();
    let (write, read) = (begins(&counted, 4), begins(&counted, 2));
    assert!(write > 0 && read > 0, "{counted:?}");
    let name = "locktrace_kernel_lock_contentions_total";
    for (kind, count) in [("rwsem_write", write), ("rwsem_read", read)] {
        let label = format!(r#"lock="mmap_lock",kind="{kind}""#);
        wait_for_sample(port, name, &label, |total| total == Some(count as f64));
    }
    let said = said.lock().unwrap();
    assert!(
        !said.iter().any(|line| line.contains("kernel locks")),
        "{said:?}"
    );
}

/// bpftrace's count of the target's outermost contentions (the nesting
/// rule above) by thread, and whether the thread had started a request
/// (called `php_request_startup` in `binary`) when it waited.
fn bpftrace_by_thread_script(pid: u32, binary: &std::path::Path) -> String {
    format!(
        r#"BEGIN {{ printf("attached\n"); }}
uprobe:{binary}:php_request_startup /pid == {pid}/ {{ @request[tid] = 1; }}
tracepoint:lock:contention_begin /pid == {pid}/ {{ @begins = count(); }}
tracepoint:lock:contention_begin /pid == {pid} && @start[tid] == 0/ {{
  @start[tid] = nsecs; @lock[tid] = (uint64)args->lock_addr;
}}
tracepoint:lock:contention_end /pid == {pid} && @start[tid] != 0 && @lock[tid] == (uint64)args->lock_addr/ {{
  @ends[tid, @request[tid]] = count();
  delete(@start[tid]);
  delete(@lock[tid]);
}}
END {{ clear(@start); clear(@lock); clear(@request); }}"#,
        binary = binary.display()
    )
}

/// `@ends[TID, IN_REQUEST]: N` lines: the counts of the threads that had
/// started a request (one per thread, highest first), and of the others.
fn ends_by_thread(text: &str) -> (Vec<u64>, u64) {
    let (mut in_requests, mut outside) = (Vec::new(), 0);
    for line in text.lines() {
        let Some((key, value)) = line
            .strip_prefix("@ends[")
            .and_then(|rest| rest.split_once("]: "))
        else {
            continue;
        };
        let n: u64 = value.trim().parse().unwrap();
        match key.split_once(", ").map(|(_, flag)| flag.trim()) {
            Some("1") => in_requests.push(n),
            Some("0") => outside += n,
            other => panic!("bpftrace key {key:?}: {other:?}"),
        }
    }
    in_requests.sort_unstable_by(|a, b| b.cmp(a));
    (in_requests, outside)
}

/// `--php`: each kernel lock row split by the route of the request its
/// waiting thread was serving. fixtures/fakephp.c with one route per
/// thread (thread t serves `GET /r/t` only) makes a thread's contentions
/// its route's: the routes' counts are bpftrace's per thread that had
/// started a request, the rest `(outside requests)` (the threads before
/// their first request, and the main thread), within the bounds below.
/// Every row's split adds up to the row exactly, and names only the
/// routes requested.
#[test]
fn php_routes_split_each_kernel_lock_as_an_independent_count_by_thread() {
    const THREADS: usize = 4;
    let binary = fixture("fakephp", Flavor::Glibc);
    // THREADS threads, THREADS routes, 20 requests each of 5000 g_lock uses:
    // the hot g_lock's futex calls meet the futex buckets' and runqueues' locks.
    let mut target = Fixture::spawn(&binary, &["4", "4", "20", "5000"]);
    let trace = Trace::attach(target.pid(), &["--php"]);
    let bpftrace = Bpftrace::run(&bpftrace_by_thread_script(target.pid(), &binary));
    std::thread::sleep(Duration::from_millis(200));
    target.start();
    assert_eq!(target.wait().trim(), "done 400000");
    let text = bpftrace.stop();
    let (report, table) = trace.finish();
    let (mut by_thread, outside) = ends_by_thread(&text);
    assert!(by_thread.len() <= THREADS, "{text}");
    by_thread.resize(THREADS, 0);
    let section = &report["kernel_locks"];
    assert_eq!(u(&section["lost"]), 0, "{section}");
    let requested: Vec<String> = (0..THREADS).map(|r| format!("GET /r/{r}")).collect();
    let mut by_route: std::collections::BTreeMap<String, u64> = Default::default();
    for lock in section["locks"].as_array().unwrap() {
        let routes = lock["routes"].as_array().expect("routes on every row");
        let sum = |field: &str| routes.iter().map(|r| u(&r[field])).sum::<u64>();
        assert_eq!(sum("contentions"), u(&lock["contentions"]), "{lock}");
        assert_eq!(sum("wait_ns"), u(&lock["wait_ns"]), "{lock}");
        for route in routes {
            let name = route["route"].as_str().unwrap().to_string();
            assert!(
                requested.contains(&name) || name == "(outside requests)",
                "{name}: {lock}"
            );
            *by_route.entry(name).or_default() += u(&route["contentions"]);
        }
    }
    let outside_here = by_route.remove("(outside requests)").unwrap_or(0);
    let mut here: Vec<u64> = by_route.values().copied().collect();
    here.resize(THREADS, 0);
    here.sort_unstable_by(|a, b| b.cmp(a));
    // Against bpftrace's count per thread: all of them, exactly. The last
    // thread's release_task announces the exit and then flushes /proc's
    // dentries, under contended spinlocks: locktrace waits for the exited
    // threads to be freed before it stops counting (it once stopped at the
    // announcement and missed those, 2 or 3 in about one run in eight).
    let (all_here, all_theirs) = (here.iter().sum::<u64>(), by_thread.iter().sum::<u64>());
    let said = format!(
        "{by_route:?}, outside {outside_here}: {section} {} against bpftrace's {text}",
        report["dropped"]
    );
    assert_eq!(all_here + outside_here, all_theirs + outside, "{said}");
    // A thread's first request is marked at each tracer's own uprobe hit:
    // a contention between the two may fall on either side of it, one
    // per thread at most.
    assert!(outside_here <= outside + THREADS as u64, "{said}");
    for (ours, theirs) in here.iter().zip(&by_thread) {
        assert!(*ours <= *theirs + 1, "{said}");
    }
    assert!(
        here.iter().sum::<u64>() > 0,
        "no kernel contention in requests: {section}"
    );
    assert!(table.contains("    routes: GET /r/"), "{table}");
}

/// `top` through a pipe lists the kernel locks under its lock rows: the
/// section's titles, then map_worker's mmap_lock write side with the
/// kernel function that took it (munmap's or mmap's).
#[test]
fn top_lists_the_kernel_locks_under_its_lock_rows() {
    use crate::common::live_views::{start_live, wait_for_top_line};
    let binary = fixture("map_worker", Flavor::Glibc);
    // Work for many seconds: top is stopped as soon as the row shows.
    let mut fixture = Fixture::spawn(&binary, &["100000"]);
    let pid = fixture.pid().to_string();
    let (mut top, _) = start_live(&["top", "--pid", &pid, "--no-cpu"], Stdio::piped());
    fixture.send("go");
    let mut stdout = BufReader::new(top.0.stdout.take().unwrap());
    let title = wait_for_top_line(&mut stdout, |line| line.starts_with("kernel lock "));
    assert!(
        title.contains("cont/s") && title.contains("wait ms/s") && title.contains("kernel site"),
        "{title}"
    );
    let row = wait_for_top_line(&mut stdout, |line| {
        line.starts_with("mmap_lock ") && line.contains("rwsem write")
    });
    let site = row.split_whitespace().last().unwrap_or_default();
    assert!(site == "__vm_munmap" || site == "vm_mmap_pgoff", "{row}");
    // SAFETY: kill(2) on the pid of the child this test started.
    unsafe { libc::kill(top.0.id() as i32, libc::SIGINT) };
    assert!(top.0.wait().unwrap().success());
}

/// A live session ages kernel locks out: once map_worker's work is done
/// and its mmap_lock rows are quiet for `expire_after`, their keys are
/// deleted from the kernel lock map (the section, read from the map,
/// lists them no more), while the interval that saw the work had them.
#[test]
fn a_live_session_deletes_the_keys_of_quiet_kernel_locks() {
    use locktrace::{
        live::{LiveOptions, LiveSession},
        model::{Mode, Placement},
        probe::request_auto::RequestProbeSpec,
    };
    let binary = fixture("map_worker", Flavor::Glibc);
    let mut fixture = Fixture::spawn(&binary, &["3000"]);
    let expire_after = Duration::from_secs(1);
    let mut session = LiveSession::attach(&LiveOptions {
        pid: fixture.pid(),
        mode: Mode::Contention,
        placement: Placement::Auto,
        request_probe: RequestProbeSpec::Off,
        expire_after,
        ready_file: None,
        cpu_hz: None,
        stacks: false,
        php: None,
        kernel_locks: true,
    })
    .expect("attached");
    fixture.send("go");
    while fixture.read_line().as_deref() != Some("done") {}
    let mmap_rows = |interval: &locktrace::live::Interval| -> usize {
        interval.kernel_locks.as_ref().map_or(0, |section| {
            section
                .locks
                .iter()
                .filter(|lock| lock.name.as_deref() == Some("mmap_lock"))
                .count()
        })
    };
    let worked = session.tick().expect("a tick");
    assert_eq!(mmap_rows(&worked), 2, "{:?}", worked.kernel_locks);
    let active = worked
        .kernel_activity
        .iter()
        .filter(|row| row.name.as_deref() == Some("mmap_lock"))
        .count();
    assert_eq!(active, 2, "{:?}", worked.kernel_activity);
    // Quiet past the expiry: this tick deletes the keys, the next reads without them.
    std::thread::sleep(expire_after + Duration::from_millis(200));
    let quiet = session.tick().expect("a tick");
    assert!(
        quiet
            .kernel_activity
            .iter()
            .all(|row| row.name.as_deref() != Some("mmap_lock"))
    );
    let after = session.tick().expect("a tick");
    assert_eq!(mmap_rows(&after), 0, "{:?}", after.kernel_locks);
}
