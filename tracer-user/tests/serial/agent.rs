//! `locktrace agent` on three fixtures in three cgroups the test makes, named
//! as docker, containerd (under a Kubernetes pod slice) and cri-o name
//! theirs: found by `--exe` without pids, every series labelled with its
//! container, exact counts, one fixture restarted (attached again within
//! 2 s, counted from then on) and the exited one's series gone after
//! `--forget-exited`; `--push` posts each process's profiles to a receiver
//! the test runs (labels in `name`, pprof bodies adding up to the exact
//! counts, also for the calls after the last interval, pushed at the
//! stop; a receiver gone is one line, not the agent's end); a
//! `?seconds=` profile holds exactly the calls made in its window. Needs
//! root (BPF, cgroup v2).

use std::{
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::common::{Fixture, Flavor, fixture, flat_and_cum, locktrace, pprof_top};
use locktrace::{
    agent::discover::{Discovery, Selectors},
    model::ServerKind,
};
use std::collections::HashSet;

const POD: &str = "6c1a0f3e-2b4d-4e8f-9a1b-3c5d7e9f0a2b";
/// Seconds an exited process's series stay (`--forget-exited`).
const FORGET_EXITED_S: u64 = 2;

/// A 64-digit container ID, different per index and per run.
fn container_id(index: u32) -> String {
    format!("{:08x}{index:056x}", std::process::id())
}

/// The cgroup v2 root: /sys/fs/cgroup, or a cgroup2 mount the test makes.
fn cgroup_root() -> PathBuf {
    let root = PathBuf::from("/sys/fs/cgroup");
    if root.join("cgroup.procs").exists() && root.join("cgroup.controllers").exists() {
        return root;
    }
    // cgroup v1 or hybrid: a cgroup2 hierarchy of our own (kept mounted for
    // the next run), mounted by one test while the others wait.
    static MOUNTING: Mutex<()> = Mutex::new(());
    let _mounting = MOUNTING.lock().unwrap_or_else(|p| p.into_inner());
    let mount = PathBuf::from("/tmp/locktrace-agent-cgroup2");
    if mount.join("cgroup.procs").exists() {
        return mount;
    }
    std::fs::create_dir_all(&mount).unwrap();
    let status = Command::new("mount")
        .args(["-t", "cgroup2", "none"])
        .arg(&mount)
        .status()
        .unwrap();
    assert!(status.success(), "mounting cgroup2 failed");
    mount
}

/// The three cgroups, as the runtimes name them (relative to the root),
/// their container IDs numbered from `first`.
fn cgroups(top: &str, first: u32) -> Vec<(String, String)> {
    let pod = POD.replace('-', "_");
    let (a, b, c) = (
        container_id(first),
        container_id(first + 1),
        container_id(first + 2),
    );
    vec![
        (a.clone(), format!("{top}/docker-{a}.scope")),
        (
            b.clone(),
            format!("{top}/kubepods-burstable-pod{pod}.slice/cri-containerd-{b}.scope"),
        ),
        (c.clone(), format!("{top}/crio-{c}.scope")),
    ]
}

/// `steady PER_TICK 100 60` started in `cgroup`.
fn spawn_in(cgroup: &Path, binary: &Path, per_tick: u32) -> Fixture {
    spawn_with(cgroup, binary, &[&per_tick.to_string(), "100", "60"])
}

/// `binary ARGS` started in `cgroup` (moved there before it execs, as
/// runtimes do, so it is never seen outside it).
fn spawn_with(cgroup: &Path, binary: &Path, args: &[&str]) -> Fixture {
    let procs = cgroup.join("cgroup.procs");
    Fixture::spawn_command(
        Command::new("sh")
            .arg("-c")
            .arg("echo $$ > \"$0\" && exec \"$@\"")
            .arg(&procs)
            .arg(binary)
            .args(args),
    )
}

/// The agent's stderr lines, each with when it arrived.
type Lines = Arc<Mutex<Vec<(Instant, String)>>>;

fn collect_stderr(child: &mut Child) -> Lines {
    let lines: Lines = Arc::default();
    let stderr = child.stderr.take().unwrap();
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("agent: {line}");
            sink.lock().unwrap().push((Instant::now(), line));
        }
    });
    lines
}

fn wait_for_line(lines: &Lines, needle: &str, budget: Duration) -> (Instant, String) {
    let deadline = Instant::now() + budget;
    loop {
        if let Some(found) = lines
            .lock()
            .unwrap()
            .iter()
            .find(|(_, line)| line.contains(needle))
        {
            return found.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no agent line with {needle:?} in {budget:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn scrape(port: u16) -> String {
    get(port, "/metrics").expect("the agent answers /metrics")
}

/// A GET's body; None when nothing listens (yet) or the status is not 200.
fn get(port: u16, path: &str) -> Option<String> {
    get_raw(port, path).map(|body| String::from_utf8_lossy(&body).into_owned())
}

fn get_bytes(port: u16, path: &str) -> Vec<u8> {
    get_raw(port, path).unwrap_or_else(|| panic!("GET {path} failed"))
}

fn get_raw(port: u16, path: &str) -> Option<Vec<u8>> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let split = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&response[..split]);
    let body = &response[split + 4..];
    // Chunked (no Content-Length): one chunk, or the size lines would remain.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    head.starts_with("HTTP/1.1 200").then_some(body)
}

fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line = body.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&body[..line]).ok()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(line + 2..line + 2 + size)?);
        body = body.get(line + 4 + size..)?;
    }
}

/// The Debian package's Prometheus scraping the agent every second.
fn start_prometheus(agent_port: u16, dir: &Path) -> (Child, u16) {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: locktrace-agent\n    static_configs: [{{targets: ['127.0.0.1:{agent_port}']}}]\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus (apt-get install prometheus)");
    (child, port)
}

/// `sum by (container_id) (locktrace_lock_acquisitions_total{lock="g_lock", …})`
/// from Prometheus, once it equals `want` (it scrapes every second).
fn wait_for_promql(port: u16, selector: &str, want: &[(String, f64)]) {
    let query = format!("sum by (container_id) (locktrace_lock_acquisitions_total{{{selector}}})");
    let encoded: String = query
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Some(body) = get(port, &format!("/api/v1/query?query={encoded}")) {
            let json: serde_json::Value = serde_json::from_str(&body).unwrap();
            let mut got: Vec<(String, f64)> = json["data"]["result"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|row| {
                    let id = row["metric"]["container_id"].as_str()?.to_string();
                    Some((id, row["value"][1].as_str()?.parse().ok()?))
                })
                .collect();
            got.sort_by(|a, b| a.0.cmp(&b.0));
            if got == want {
                return;
            }
            last = body;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    panic!("PromQL {query} never gave {want:?}; last answer: {last}");
}

/// The value of `metric` on the series carrying all `labels`.
fn value(text: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(metric)?.strip_prefix('{')?;
        let (set, number) = rest.rsplit_once("} ")?;
        labels
            .iter()
            .all(|(name, value)| set.contains(&format!("{name}=\"{value}\"")))
            .then(|| number.trim().parse().ok())?
    })
}

/// Scrapes until `metric` on `labels` reads `want` (the agent reads the maps every second).
fn wait_for_value(port: u16, metric: &str, labels: &[(&str, &str)], want: f64) -> String {
    let deadline = Instant::now() + Duration::from_secs(6);
    loop {
        let text = scrape(port);
        let got = value(&text, metric, labels);
        if got == Some(want) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{metric} {labels:?} is {got:?}, not {want}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A request the receiver got: its path with the query, and its body.
type Posted = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A Pyroscope-like ingest endpoint: answers every POST 200 and keeps it.
/// Stops (the port then refuses) when `open` is set false.
fn start_receiver() -> (u16, Posted, Arc<std::sync::atomic::AtomicBool>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let posted: Posted = Arc::default();
    let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (sink, running) = (posted.clone(), open.clone());
    std::thread::spawn(move || {
        while running.load(std::sync::atomic::Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => {
                    if let Some(request) = read_post(stream) {
                        sink.lock().unwrap().push(request);
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        // The listener is dropped here: posts are refused from now on.
    });
    (port, posted, open)
}

/// Reads one POST (Content-Length body), answers 200.
fn read_post(mut stream: std::net::TcpStream) -> Option<(String, Vec<u8>)> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut data = Vec::new();
    let mut buffer = [0u8; 65536];
    let (head_end, length) = loop {
        let n = stream.read(&mut buffer).ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buffer[..n]);
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse::<usize>().ok())
                .unwrap_or(0);
            break (end + 4, length);
        }
    };
    while data.len() < head_end + length {
        let n = stream.read(&mut buffer).ok()?;
        if n == 0 {
            break;
        }
        data.extend_from_slice(&buffer[..n]);
    }
    let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
    let target = head.split_whitespace().nth(1)?.to_string();
    assert!(head.starts_with("POST "), "{head}");
    stream
        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .ok()?;
    Some((target, data[head_end..].to_vec()))
}

/// A query parameter's value, percent-decoded.
fn query_value(target: &str, name: &str) -> Option<String> {
    let query = target.split_once('?')?.1;
    let raw = query
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))?;
    let bytes = raw.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The `lock g_lock` acquisitions in a gzipped pprof body, read with the
/// project's pprof model.
fn g_lock_acquisitions(body: &[u8]) -> u64 {
    use prost::Message;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(body)
        .read_to_end(&mut bytes)
        .expect("a gzipped body");
    let profile = locktrace::render::pprof::Profile::decode(bytes.as_slice()).expect("pprof");
    let string = |id: i64| profile.string_table[id as usize].as_str();
    let acquisitions = profile
        .sample_type
        .iter()
        .position(|t| string(t.r#type) == "acquisitions")
        .expect("an acquisitions sample type");
    assert!(
        profile
            .sample_type
            .iter()
            .any(|t| string(t.r#type) == "contentions"),
        "Pyroscope files a profile with contentions as mutex"
    );
    profile
        .sample
        .iter()
        .filter(|sample| {
            sample
                .label
                .iter()
                .any(|l| string(l.key) == "lock" && string(l.str) == "g_lock")
        })
        .map(|sample| sample.value[acquisitions] as u64)
        .sum()
}

/// The posts for `pid` (by the `pid=` label in `name`) once their g_lock
/// acquisitions add up to `want`; checks each one's labels and interval.
fn wait_for_posts(posted: &Posted, exe: &str, id: &str, pid: u32, want: u64) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mine: Vec<(String, Vec<u8>)> = posted
            .lock()
            .unwrap()
            .iter()
            .filter(|(target, _)| {
                query_value(target, "name").is_some_and(|n| n.contains(&format!(",pid={pid},")))
            })
            .cloned()
            .collect();
        let sum: u64 = mine.iter().map(|(_, body)| g_lock_acquisitions(body)).sum();
        if sum == want {
            for (target, _) in &mine {
                assert!(target.starts_with("/ingest?"), "{target}");
                let name = query_value(target, "name").unwrap();
                assert!(
                    name.starts_with(&format!("{exe}{{container_id={id},")),
                    "{name}"
                );
                assert!(name.contains(&format!(",exe={exe}")), "{name}");
                assert_eq!(query_value(target, "format").as_deref(), Some("pprof"));
                let from: u64 = query_value(target, "from").unwrap().parse().unwrap();
                let until: u64 = query_value(target, "until").unwrap().parse().unwrap();
                assert!(from < until && until <= from + 5, "{target}");
            }
            return mine.len();
        }
        assert!(
            sum < want && Instant::now() < deadline,
            "pid {pid}'s posts add up to {sum} g_lock calls, not {want}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn agent_finds_labels_counts_and_follows_restarts() {
    let binary = fixture("steady", Flavor::Glibc);
    let exe = binary.file_name().unwrap().to_str().unwrap().to_string();
    let root = cgroup_root();
    let top = format!("locktrace-test-{}.slice", std::process::id());
    let groups = cgroups(&top, 1);
    let mut cleanup = make_cgroups(&root, &top, &groups);
    let per_tick = [10u32, 20, 30];
    let mut fixtures: Vec<Fixture> = groups
        .iter()
        .zip(per_tick)
        .map(|((_, path), n)| spawn_in(&root.join(path), &binary, n))
        .collect();
    cleanup.pids.extend(fixtures.iter().map(|f| f.pid()));
    let port = free_port();
    let (receiver_port, posted, receiving) = start_receiver();
    let (lines, agent_pid) = start_agent(
        port,
        &[
            "--push",
            &format!("http://127.0.0.1:{receiver_port}"),
            "--push-every",
            "1",
            "--exe",
            &exe,
            // Not other tests' steady fixtures elsewhere on the machine.
            "--within-cgroup",
            &top,
            "--forget-exited",
            &FORGET_EXITED_S.to_string(),
        ],
        &mut cleanup,
    );
    // The kernel's exec events are heard (else the scan alone finds them).
    let (_, line) = wait_for_line(&lines, "agent serving", Duration::from_secs(20));
    assert!(line.contains(" as they exec and scanning /proc"), "{line}");
    let scratch = tempfile::tempdir().unwrap();
    let (prometheus, prometheus_port) = start_prometheus(port, scratch.path());
    cleanup.prometheus = Some(prometheus);

    // Found without pids given, each in its container.
    for (fixture, (id, _)) in fixtures.iter().zip(&groups) {
        let (_, line) = wait_for_line(
            &lines,
            &format!("watching pid {} (", fixture.pid()),
            Duration::from_secs(20),
        );
        assert!(line.contains(&format!("container_id={id}")), "{line}");
    }
    for (fixture, n) in fixtures.iter_mut().zip(per_tick) {
        fixture.start();
        assert_eq!(fixture.read_line().unwrap(), format!("done {}", n * 100));
    }
    // Exact counts per container, and every process series labelled.
    let mut text = String::new();
    for ((id, _), (fixture, n)) in groups.iter().zip(fixtures.iter().zip(per_tick)) {
        let pid = fixture.pid().to_string();
        let labels = [
            ("container_id", id.as_str()),
            ("pid", &pid),
            ("lock", "g_lock"),
        ];
        text = wait_for_value(
            port,
            "locktrace_lock_acquisitions_total",
            &labels,
            f64::from(n * 100),
        );
    }
    assert!(text.contains(&format!("pod_uid=\"{POD}\"")), "{text}");
    assert!(text.contains("runtime=\"cri-o\""), "{text}");
    let ids: Vec<&str> = groups.iter().map(|(id, _)| id.as_str()).collect();
    let samples: Vec<&str> = text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.starts_with("locktrace_agent_"))
        .collect();
    assert!(samples.len() >= 3 * 10, "{text}");
    for sample in samples {
        assert!(
            ids.iter()
                .any(|id| sample.contains(&format!("container_id=\"{id}\""))),
            "a series without its container: {sample}"
        );
    }
    assert_eq!(value(&text, "locktrace_agent_watched_processes", &[]), None);
    // Each process's pprof profile, read by go tool pprof: its exact count.
    for (fixture, n) in fixtures.iter().zip(per_tick) {
        let profile = get_bytes(port, &format!("/debug/pprof/mutex?pid={}", fixture.pid()));
        let file = scratch.path().join(format!("{}.pb.gz", fixture.pid()));
        std::fs::write(&file, profile).unwrap();
        let top = pprof_top(&file, "acquisitions");
        assert_eq!(
            flat_and_cum(&top, "lock g_lock").0,
            u64::from(n * 100),
            "{top}"
        );
    }
    // Prometheus scrapes the agent: per container, the fixtures' exact counts.
    let mut want: Vec<(String, f64)> = groups
        .iter()
        .zip(per_tick)
        .map(|((id, _), n)| (id.clone(), f64::from(n * 100)))
        .collect();
    want.sort_by(|a, b| a.0.cmp(&b.0));
    let pids = fixtures
        .iter()
        .map(|f| f.pid().to_string())
        .collect::<Vec<_>>()
        .join("|");
    wait_for_promql(
        prometheus_port,
        &format!("lock=\"g_lock\",pid=~\"{pids}\""),
        &want,
    );
    assert!(
        text.contains("\nlocktrace_agent_watched_processes 3\n"),
        "{text}"
    );
    // Pushed: each process's posts carry its labels, and their bodies add
    // up to its exact count.
    for ((id, _), (fixture, n)) in groups.iter().zip(fixtures.iter().zip(per_tick)) {
        let posts = wait_for_posts(&posted, &exe, id, fixture.pid(), u64::from(n * 100));
        println!("pid {}: {posts} posts", fixture.pid());
    }
    // The receiver goes away: one line, a counted failure, the agent goes on.
    receiving.store(false, std::sync::atomic::Ordering::Relaxed);

    // Restart the second: its new process is attached within 2 s of its
    // start and counted from then on; the old one's series go.
    let alone = ALONE
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let old = fixtures.remove(1);
    let old_pid = old.pid();
    kill(old);
    let (released, _) = wait_for_line(
        &lines,
        &format!("pid {old_pid} ({exe}) exited"),
        Duration::from_secs(3),
    );
    let started = Instant::now();
    let mut restarted = spawn_in(&root.join(&groups[1].1), &binary, 7);
    cleanup.pids.push(restarted.pid());
    let (attached, line) = wait_for_line(
        &lines,
        &format!("watching pid {} (", restarted.pid()),
        Duration::from_secs(5),
    );
    let took = attached.duration_since(started);
    // Where the time went: "judged N ms after its exec, attached in M ms"
    // (a scan running in the instant between the exec and its event finds
    // it first, as fast; the line then has no exec time).
    println!("{line}");
    drop(alone);
    // The issue asks 2 s. The agent judges the new process as it execs (the
    // proc connector's event, not a /proc scan up to 500 ms later), so the
    // time is the attach's own. Its bound here is RESTART_ATTACH_BOUND.
    println!("the restarted process was attached {took:?} after its start");
    assert!(
        took <= RESTART_ATTACH_BOUND,
        "attached again after {took:?}"
    );
    // A profile of the next 3 s, asked for before the fixture starts: its
    // calls, exactly; a fixture idle in the window has none.
    let windows: Vec<_> = [restarted.pid(), fixtures[0].pid()]
        .into_iter()
        .map(|pid| {
            std::thread::spawn(move || {
                get_raw(port, &format!("/debug/pprof/mutex?pid={pid}&seconds=3"))
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    restarted.start();
    assert_eq!(restarted.read_line().unwrap(), "done 700");
    let windows: Vec<Vec<u8>> = windows
        .into_iter()
        .map(|w| w.join().unwrap().expect("a ?seconds= profile"))
        .collect();
    assert_eq!(g_lock_acquisitions(&windows[0]), 700);
    assert_eq!(g_lock_acquisitions(&windows[1]), 0);
    let (status, body) = get_status(
        port,
        &format!("/debug/pprof/mutex?pid={}&seconds=0", restarted.pid()),
    );
    assert!(status.contains(" 400 "), "{status}");
    assert!(
        body.contains("seconds=0: give whole seconds from 1 to 60"),
        "{body}"
    );
    let file = scratch.path().join("window.pb.gz");
    std::fs::write(&file, &windows[0]).unwrap();
    let top = pprof_top(&file, "acquisitions");
    assert_eq!(flat_and_cum(&top, "lock g_lock").0, 700, "{top}");
    // Its push was refused: said once, counted, and the agent serves on.
    let (_, line) = wait_for_line(&lines, "posting a profile to", Duration::from_secs(8));
    assert!(line.contains("the agent goes on"), "{line}");
    let text = scrape(port);
    let failures: Option<f64> = text.lines().find_map(|line| {
        line.strip_prefix("locktrace_agent_push_failures_total ")?
            .trim()
            .parse()
            .ok()
    });
    assert!(failures.is_some_and(|n| n >= 1.0), "{text}");
    let new_pid = restarted.pid().to_string();
    let labels = [
        ("container_id", groups[1].0.as_str()),
        ("pid", new_pid.as_str()),
        ("lock", "g_lock"),
    ];
    wait_for_value(port, "locktrace_lock_acquisitions_total", &labels, 700.0);
    let gone = format!("pid=\"{old_pid}\"");
    let deadline = released + Duration::from_secs(FORGET_EXITED_S) + Duration::from_millis(1500);
    loop {
        let text = scrape(port);
        if !text.contains(&gone) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pid {old_pid}'s series still there {:?} after its exit",
            released.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "restarted fixture attached after {} ms; exited series gone after {} ms",
        took.as_millis(),
        released.elapsed().as_millis()
    );

    // Stop (SIGINT: the GOT entries go back), then clean up.
    unsafe { libc::kill(agent_pid, libc::SIGINT) };
    let status = cleanup.agent.as_mut().unwrap().wait().unwrap();
    wait_for_line(&lines, "agent used", Duration::from_secs(5));
    assert!(status.success(), "agent: {status}");
    for fixture in fixtures.into_iter().chain([restarted]) {
        kill(fixture);
    }
    drop(cleanup);
    assert!(!root.join(&top).exists(), "cgroups left behind");
}

/// `locktrace agent --listen 127.0.0.1:PORT ARGS`, killed by the cleanup
/// if the test does not stop it: its stderr lines and pid.
fn start_agent(port: u16, args: &[&str], cleanup: &mut Cleanup) -> (Lines, i32) {
    start_agent_as(locktrace(), port, args, cleanup)
}

/// [`start_agent`] with `command` (locktrace, set up by the caller).
fn start_agent_as(
    mut command: Command,
    port: u16,
    args: &[&str],
    cleanup: &mut Cleanup,
) -> (Lines, i32) {
    let mut agent = command
        .args(["agent", "--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = collect_stderr(&mut agent);
    let pid = agent.id() as i32;
    cleanup.agent = Some(agent);
    (lines, pid)
}

/// Cgroup `top` made, and removed by the cleanup.
fn alone_in(root: &Path, top: &str) -> Cleanup {
    std::fs::create_dir_all(root.join(top)).unwrap();
    Cleanup {
        agent: None,
        prometheus: None,
        pids: Vec::new(),
        dirs: vec![root.join(top)],
    }
}

/// `steady 10 100 60` (1000 g_lock calls once started) alone in cgroup `top`.
fn steady_alone(root: &Path, top: &str, binary: &Path) -> (Cleanup, Fixture) {
    let mut cleanup = alone_in(root, top);
    let target = spawn_with(&root.join(top), binary, &["10", "100", "60"]);
    cleanup.pids.push(target.pid());
    (cleanup, target)
}

/// Starts the `steady_alone` fixture, waits for its exact 1000 g_lock calls
/// on /metrics, stops the agent (SIGINT: it must exit 0) and the fixture.
fn count_and_stop(port: u16, mut target: Fixture, agent_pid: i32, cleanup: &mut Cleanup) {
    target.start();
    assert_eq!(target.read_line().unwrap(), "done 1000");
    let pid = target.pid().to_string();
    wait_for_value(
        port,
        "locktrace_lock_acquisitions_total",
        &[("pid", &pid), ("lock", "g_lock")],
        1000.0,
    );
    unsafe { libc::kill(agent_pid, libc::SIGINT) };
    let status = cleanup.agent.as_mut().unwrap().wait().unwrap();
    assert!(status.success(), "agent: {status}");
    kill(target);
}

/// The cgroups made (deepest first in the cleanup).
fn make_cgroups(root: &Path, top: &str, groups: &[(String, String)]) -> Cleanup {
    let mut cleanup = Cleanup {
        agent: None,
        prometheus: None,
        pids: Vec::new(),
        dirs: Vec::new(),
    };
    for (_, path) in groups {
        std::fs::create_dir_all(root.join(path)).unwrap();
        cleanup.dirs.push(root.join(path));
    }
    cleanup.dirs.push(root.join(top).join(format!(
        "kubepods-burstable-pod{}.slice",
        POD.replace('-', "_")
    )));
    cleanup.dirs.push(root.join(top));
    cleanup
}

/// Held while FrankenPHP and MariaDB start, the agent attaches them and
/// FrankenPHP serves its requests (bursts of CPU), and while the retry and
/// shedding tests' agents attach: these never overlap; the rest of the
/// tests runs side by side.
static QUIET: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Written while the first test times a restart's attach (2 s at most, the
/// issue's figure); every other test reads it for its whole run, so
/// nothing else of this binary runs in that window (a neighbour's load
/// once stretched the kernel's verifying of the attach to 2.06 s).
static ALONE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// For the tests other than the restart's: see [`ALONE`].
fn beside_others() -> std::sync::RwLockReadGuard<'static, ()> {
    ALONE
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How soon a restarted process must be watched again, from its start
/// (the figure).
const RESTART_ATTACH_BOUND: Duration = Duration::from_secs(2);

/// q.php requests sent to the real FrankenPHP while the agent watches it.
const FRANKEN_REQUESTS: u64 = 20;

/// Default discovery (no selectors) on three servers in three containers:
/// the real FrankenPHP (the kit's dynamic build, stock libphp) and two
/// thread-safe PHP stand-ins (`fakephp`). Each is found and labelled with
/// its container and server kind (`--within-cgroup` keeps the agent off
/// the machine's other PHP processes); FrankenPHP's global statistics mutex is
/// counted exactly 408 times per request, and its requests exactly, on
/// /metrics and in its pprof profile; each stand-in's g_lock and requests
/// exactly. Holds the FrankenPHP machine lock while its server runs.
#[test]
fn agent_watches_the_real_frankenphp_by_default() {
    let _beside = beside_others();
    use crate::common::frankenphp::{
        GLOBAL_LOCK, GLOBAL_PER_REQUEST, Mode, SpawnedServer, kit, sequential_requests,
        server_args, take_machine_lock,
    };
    let binary = Path::new("/tmp/e2e/frankenphp-e2e");
    assert!(
        binary.exists(),
        "the FrankenPHP kit is not built ({} missing): run scripts/setup.sh --frankenphp",
        binary.display()
    );
    let root = cgroup_root();
    let top = format!("locktrace-php-{}.slice", std::process::id());
    let groups = cgroups(&top, 4);
    let mut cleanup = make_cgroups(&root, &top, &groups);
    let procs = root.join(&groups[0].1).join("cgroup.procs");
    let args = server_args(Mode::Classic, &kit().join("www"));
    let began = Instant::now();
    // The machine lock first: the other tests do not wait while it is awaited.
    let machine = take_machine_lock();
    println!(
        "machine lock taken after {} ms",
        began.elapsed().as_millis()
    );
    let quiet = QUIET.lock().unwrap_or_else(|p| p.into_inner());
    let mut server = SpawnedServer::start_in(
        binary,
        &args,
        &[],
        "franken-agent.log",
        Some(&procs),
        Some(machine),
    );
    println!(
        "FrankenPHP (and MariaDB) up after {} ms",
        began.elapsed().as_millis()
    );
    // The exact figure is the stock libphp's (the kit's resting state).
    let libphp = std::fs::read_link("/tmp/e2e/franken-lib/libphp.so").unwrap_or_default();
    assert!(
        libphp.to_string_lossy().contains("stock"),
        "/tmp/e2e/franken-lib/libphp.so points at {}, not the stock build (the kit's use-stock.sh)",
        libphp.display()
    );
    // Two stand-ins: 2 threads, 4 routes of 25 requests, 3 g_lock calls each.
    let fakephp = fixture("fakephp", Flavor::Glibc);
    let mut standins: Vec<Fixture> = groups[1..]
        .iter()
        .map(|(_, path)| spawn_with(&root.join(path), &fakephp, &["2", "4", "25", "3"]))
        .collect();
    cleanup.pids.extend(standins.iter().map(|f| f.pid()));
    let port = free_port();
    // Default discovery, kept to this test's cgroups: the other PHP
    // processes on the machine (other tests' servers) are not touched.
    let (lines, agent_pid) = start_agent(
        port,
        &["--forget-exited", "60", "--within-cgroup", &top],
        &mut cleanup,
    );
    let started = Instant::now();
    let pids: Vec<u32> = [server.pid()]
        .into_iter()
        .chain(standins.iter().map(|f| f.pid()))
        .collect();
    for ((pid, (id, _)), kind) in pids.iter().zip(&groups).zip(["frankenphp", "php", "php"]) {
        let (_, line) = wait_for_line(
            &lines,
            &format!("watching pid {pid} ("),
            Duration::from_secs(30),
        );
        assert!(line.contains(&format!("container_id={id} ")), "{line}");
        assert!(line.contains(&format!("server={kind})")), "{line}");
    }
    println!(
        "all three attached {} ms after the agent started",
        started.elapsed().as_millis()
    );
    for standin in &mut standins {
        standin.start();
        assert_eq!(standin.read_line().unwrap(), "done 300");
    }
    // Attaching FrankenPHP (its symbols) is a burst of CPU, and so are
    // its PHP requests: both off the other test's timed restart.
    sequential_requests(FRANKEN_REQUESTS);
    drop(quiet);
    let global = GLOBAL_PER_REQUEST as u64 * FRANKEN_REQUESTS;
    let franken = pids[0].to_string();
    let labels = [
        ("container_id", groups[0].0.as_str()),
        ("pid", franken.as_str()),
        ("server", "frankenphp"),
    ];
    let locked = [labels.as_slice(), &[("lock", GLOBAL_LOCK)]].concat();
    wait_for_value(
        port,
        "locktrace_lock_acquisitions_total",
        &locked,
        global as f64,
    );
    wait_for_value(
        port,
        "locktrace_requests_total",
        &labels,
        FRANKEN_REQUESTS as f64,
    );
    for (pid, (id, _)) in pids[1..].iter().zip(&groups[1..]) {
        let pid = pid.to_string();
        let labels = [
            ("container_id", id.as_str()),
            ("pid", &pid),
            ("server", "php"),
        ];
        let locked = [labels.as_slice(), &[("lock", "g_lock")]].concat();
        wait_for_value(port, "locktrace_lock_acquisitions_total", &locked, 300.0);
        wait_for_value(port, "locktrace_requests_total", &labels, 100.0);
    }
    let others: Vec<String> = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, line)| line.contains("watching pid"))
        .filter(|(_, line)| {
            !pids
                .iter()
                .any(|pid| line.contains(&format!("pid {pid} (")))
        })
        .map(|(_, line)| line.clone())
        .collect();
    assert!(
        others.is_empty(),
        "watched outside --within-cgroup: {others:?}"
    );
    println!(
        "exact counts seen {} ms after the agent started",
        started.elapsed().as_millis()
    );
    let profile = get_bytes(port, &format!("/debug/pprof/mutex?pid={franken}"));
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("frankenphp.pb.gz");
    std::fs::write(&file, profile).unwrap();
    let top = pprof_top(&file, "acquisitions");
    assert_eq!(
        flat_and_cum(&top, &format!("lock {GLOBAL_LOCK}")).0,
        global,
        "{top}"
    );

    unsafe { libc::kill(agent_pid, libc::SIGINT) };
    let status = cleanup.agent.as_mut().unwrap().wait().unwrap();
    assert!(status.success(), "agent: {status}");
    let stopping = Instant::now();
    server.stop();
    println!(
        "FrankenPHP stopped in {} ms",
        stopping.elapsed().as_millis()
    );
    for standin in standins {
        kill(standin);
    }
    let dropping = Instant::now();
    drop(server);
    drop(cleanup);
    println!(
        "server and cgroups gone in {} ms",
        dropping.elapsed().as_millis()
    );
    assert!(!root.join(&top).exists(), "cgroups left behind");
}

/// An attach that fails is tried again after a pause, and counts from
/// then on: the fixture is ptraced by the test (as by a debugger) when the
/// agent finds it, so inproc's ptrace is refused; the test lets go, and the
/// retry 1 s later attaches it; its calls are then counted exactly.
#[test]
fn a_failed_attach_is_tried_again() {
    let _beside = beside_others();
    let binary = fixture("steady", Flavor::Glibc);
    let exe = binary.file_name().unwrap().to_str().unwrap().to_string();
    let root = cgroup_root();
    let top = format!("locktrace-retry-{}.slice", std::process::id());
    let (mut cleanup, target) = steady_alone(&root, &top, &binary);
    let pid = target.pid();
    // The tracer: a thread that seizes the fixture and, when told, ends
    // (the kernel then detaches it).
    let (seized, release) = {
        let (seized_tx, seized) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let tracer = std::thread::spawn(move || {
            let done = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid as i32, 0, 0) };
            seized_tx.send(done).unwrap();
            let _ = release_rx.recv();
        });
        ((seized, tracer), release)
    };
    assert_eq!(seized.0.recv().unwrap(), 0, "PTRACE_SEIZE of the fixture");
    // Its attaches not beside the other test's timed restart.
    let quiet = QUIET.lock().unwrap_or_else(|p| p.into_inner());
    let port = free_port();
    let (lines, agent_pid) = start_agent(
        port,
        &["--exe", &exe, "--within-cgroup", &top],
        &mut cleanup,
    );
    let (failed, line) = wait_for_line(
        &lines,
        &format!("not watching pid {pid} ("),
        Duration::from_secs(20),
    );
    assert!(line.contains("trying again in 1 s"), "{line}");
    release.send(()).unwrap();
    seized.1.join().unwrap();
    let (attached, _) = wait_for_line(
        &lines,
        &format!("agent: watching pid {pid} ("),
        Duration::from_secs(10),
    );
    drop(quiet);
    assert!(attached > failed);
    println!(
        "attached {} ms after the failed attach",
        attached.duration_since(failed).as_millis()
    );
    count_and_stop(port, target, agent_pid, &mut cleanup);
}

/// Over `--max-cpu`, the agent reads the maps half as often and says so in
/// one line, with the read interval on /metrics; the counts stay exact.
#[test]
fn over_max_cpu_the_agent_sheds_reads_and_says_so() {
    let _beside = beside_others();
    let binary = fixture("steady", Flavor::Glibc);
    let exe = binary.file_name().unwrap().to_str().unwrap().to_string();
    let root = cgroup_root();
    let top = format!("locktrace-shed-{}.slice", std::process::id());
    let (mut cleanup, target) = steady_alone(&root, &top, &binary);
    let port = free_port();
    // Its attach (BPF load: a burst of CPU) not beside the timed restart.
    let quiet = QUIET.lock().unwrap_or_else(|p| p.into_inner());
    // A budget no agent keeps: the first 10 s window after the attach is over it.
    let (lines, agent_pid) = start_agent(
        port,
        &["--exe", &exe, "--within-cgroup", &top, "--max-cpu", "0.001"],
        &mut cleanup,
    );
    wait_for_line(&lines, "watching pid", Duration::from_secs(10));
    drop(quiet);
    let (_, line) = wait_for_line(&lines, "(--max-cpu 0.001)", Duration::from_secs(25));
    assert!(
        line.contains("reading the maps every 2 s instead of 1 s; counts stay exact"),
        "{line}"
    );
    let text = scrape(port);
    assert!(
        text.contains("\nlocktrace_agent_read_interval_seconds 2.0\n"),
        "{text}"
    );
    count_and_stop(port, target, agent_pid, &mut cleanup);
}

/// At the agent's stop (SIGINT) each process's counts since its last push
/// go out as one more upload: `steady 10 2500` makes its 25,000 calls over
/// 2.5 s, across at least one `--push-every 2` tick, and the agent is
/// stopped right after its last call, before the next tick. The bodies add
/// up to the exact 25,000, the last one holds the calls after the last
/// tick, and its interval starts where the previous one ended.
#[test]
fn the_last_partial_interval_is_pushed_at_the_stop() {
    let _beside = beside_others();
    let binary = fixture("steady", Flavor::Glibc);
    let exe = binary.file_name().unwrap().to_str().unwrap().to_string();
    let root = cgroup_root();
    let top = format!("locktrace-lastpush-{}.slice", std::process::id());
    let mut cleanup = alone_in(&root, &top);
    let mut target = spawn_with(&root.join(&top), &binary, &["10", "2500", "60"]);
    cleanup.pids.push(target.pid());
    let (receiver_port, posted, _receiving) = start_receiver();
    let port = free_port();
    // Its attach not beside the other test's timed restart.
    let quiet = QUIET.lock().unwrap_or_else(|p| p.into_inner());
    let (lines, agent_pid) = start_agent(
        port,
        &[
            "--exe",
            &exe,
            "--within-cgroup",
            &top,
            "--push",
            &format!("http://127.0.0.1:{receiver_port}"),
            "--push-every",
            "2",
        ],
        &mut cleanup,
    );
    wait_for_line(
        &lines,
        &format!("watching pid {} (", target.pid()),
        Duration::from_secs(20),
    );
    drop(quiet);
    target.start();
    assert_eq!(target.read_line().unwrap(), "done 25000");
    unsafe { libc::kill(agent_pid, libc::SIGINT) };
    let status = cleanup.agent.as_mut().unwrap().wait().unwrap();
    assert!(status.success(), "agent: {status}");
    let posts = posted.lock().unwrap().clone();
    let bodies: Vec<u64> = posts
        .iter()
        .map(|(_, body)| g_lock_acquisitions(body))
        .collect();
    println!("posts' g_lock calls: {bodies:?}");
    assert_eq!(bodies.iter().sum::<u64>(), 25_000, "{bodies:?}");
    // One periodic push during the calls at least, then the stop's (a
    // periodic post may still be on its way when the stop comes: the
    // intervals, not the arrival, tell them apart).
    assert!(posts.len() >= 2, "{bodies:?}");
    assert!(bodies.last().is_some_and(|n| *n > 0), "{bodies:?}");
    let interval = |(target, _): &(String, Vec<u8>)| -> (u64, u64) {
        let seconds = |name| query_value(target, name).unwrap().parse::<u64>().unwrap();
        (seconds("from"), seconds("until"))
    };
    let (last_from, _) = interval(&posts[posts.len() - 1]);
    let (_, previous_until) = interval(&posts[posts.len() - 2]);
    assert_eq!(last_from, previous_until, "{posts:?}");
    let said = lines.lock().unwrap().clone();
    assert!(
        !said.iter().any(|(_, line)| line.contains("not posted")),
        "{said:?}"
    );
    kill(target);
}

/// Without CAP_NET_ADMIN the kernel's process events connector cannot be
/// opened: the agent says so in one line and finds a process started
/// after it by its /proc scan, and counts it exactly.
#[test]
fn without_the_connector_the_scan_finds_new_processes() {
    let _beside = beside_others();
    use std::os::unix::process::CommandExt;
    let binary = fixture("steady", Flavor::Glibc);
    let exe = binary.file_name().unwrap().to_str().unwrap().to_string();
    let root = cgroup_root();
    let top = format!("locktrace-noconnector-{}.slice", std::process::id());
    let mut cleanup = alone_in(&root, &top);
    let mut command = locktrace();
    // linux/capability.h
    const CAP_NET_ADMIN: libc::c_ulong = 12;
    // SAFETY: prctl only, between fork and exec. Root's exec then gets
    // every capability of its bounding set: all but CAP_NET_ADMIN.
    unsafe {
        command.pre_exec(
            || match libc::prctl(libc::PR_CAPBSET_DROP, CAP_NET_ADMIN, 0, 0, 0) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            },
        );
    }
    let port = free_port();
    let quiet = QUIET.lock().unwrap_or_else(|p| p.into_inner());
    let (lines, agent_pid) = start_agent_as(
        command,
        port,
        &["--exe", &exe, "--within-cgroup", &top],
        &mut cleanup,
    );
    let (_, line) = wait_for_line(&lines, "proc connector", Duration::from_secs(20));
    assert!(
        line.contains("new processes are found by the /proc scan alone, up to 500 ms late (the connector needs CAP_NET_ADMIN"),
        "{line}"
    );
    let (_, line) = wait_for_line(&lines, "agent serving", Duration::from_secs(5));
    assert!(!line.contains("as they exec"), "{line}");
    let target = spawn_with(&root.join(&top), &binary, &["10", "100", "60"]);
    cleanup.pids.push(target.pid());
    let (_, line) = wait_for_line(
        &lines,
        &format!("watching pid {} (", target.pid()),
        Duration::from_secs(20),
    );
    drop(quiet);
    assert!(!line.contains("after its exec"), "{line}");
    count_and_stop(port, target, agent_pid, &mut cleanup);
}

/// `--push` without an http(s) URL and an out-of-range `--push-every` are
/// refused in one line before anything is attached.
#[test]
fn push_bad_input_is_one_line() {
    let _beside = beside_others();
    for (args, says) in [
        (
            vec!["--push", "pyroscope:4040"],
            "--push pyroscope:4040: give the receiver's http:// or https:// URL",
        ),
        (
            vec!["--push", "http://127.0.0.1:4040", "--push-every", "0"],
            "--push-every must be between 1 and 3600, not 0",
        ),
    ] {
        crate::common::fails_with(
            locktrace()
                .args(["agent", "--listen", "127.0.0.1:0"])
                .args(&args),
            says,
        );
    }
}

/// A GET's status line and body (any status).
fn get_status(port: u16, path: &str) -> (String, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.lines().next().unwrap_or("").to_string();
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// Without selectors the agent watches thread-safe PHP, recognised as
/// `record` recognises it: the fake ZTS engine is found, the plain C
/// fixture is not (the scan only reads; nothing is attached).
#[test]
fn default_discovery_finds_thread_safe_php_only() {
    let _beside = beside_others();
    let php = Fixture::spawn(&fixture("fakephp", Flavor::Glibc), &["1", "1", "1", "1"]);
    let plain = Fixture::spawn(&fixture("steady", Flavor::Glibc), &["1", "1", "0"]);
    let mut discovery = Discovery::new(Selectors::default());
    let found = discovery.scan(&HashSet::new());
    let ours: Vec<_> = found
        .iter()
        .filter(|f| [php.pid(), plain.pid()].contains(&f.pid))
        .map(|f| (f.pid, f.server))
        .collect();
    assert_eq!(ours, vec![(php.pid(), Some(ServerKind::Php))]);
    // Judged once: a second scan finds nothing new.
    assert!(
        discovery
            .scan(&HashSet::new())
            .iter()
            .all(|f| f.pid != php.pid())
    );
    kill(php);
    kill(plain);
}

/// Kills what the test started (the agent, then the fixtures, by pid) and
/// removes its cgroups, also when an assertion fails half way.
struct Cleanup {
    agent: Option<Child>,
    prometheus: Option<Child>,
    pids: Vec<u32>,
    /// Deepest first.
    dirs: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(prometheus) = &mut self.prometheus {
            let _ = prometheus.kill();
            let _ = prometheus.wait();
        }
        if let Some(agent) = &mut self.agent
            && agent.try_wait().ok().flatten().is_none()
        {
            let _ = agent.kill();
            let _ = agent.wait();
        }
        for &pid in &self.pids {
            // Ours (children of the test), if still there.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(100));
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn kill(mut fixture: Fixture) {
    let _ = fixture.child.kill();
    let _ = fixture.child.wait();
}
