//! Helpers of the tests of the live views (`top`, `serve`): start one and
//! wait until its probes are live, read `/metrics` over plain HTTP.
use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    process::{Child, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::locktrace;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process this test started, killed by its pid when dropped.
pub struct Started(pub Child);

impl Drop for Started {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts a locktrace live command and waits until its probes are live
/// (`--ready-file`); its stderr is collected in the returned lines.
pub fn start_live(args: &[&str], stdout: Stdio) -> (Started, Arc<Mutex<Vec<String>>>) {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let mut child = locktrace()
        .args(args)
        .arg("--ready-file")
        .arg(&ready)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting locktrace");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let lines = Arc::new(Mutex::new(Vec::new()));
    let collected = lines.clone();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            collected.lock().unwrap().push(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("locktrace exited ({status}) before it was live: {lines:?}");
        }
        assert!(Instant::now() < deadline, "not live after 60 s: {lines:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    (Started(child), lines)
}

/// Body of `GET http://127.0.0.1:PORT/PATH_AND_QUERY`.
pub fn http_get(port: u16, path_and_query: &str) -> String {
    try_http_get(port, path_and_query).expect("an HTTP 200 response")
}

/// Like [`http_get`]; None when nothing answers with 200 (yet).
pub fn try_http_get(port: u16, path_and_query: &str) -> Option<String> {
    try_http_get_with(port, path_and_query, "")
}

pub fn try_http_get_with(port: u16, path_and_query: &str, headers: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET {path_and_query} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// The value of the sample whose line starts with `name{` and contains `label`.
pub fn sample(metrics: &str, name: &str, label: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|line| {
            line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} "))
        })
        .find(|line| line.contains(label))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

/// Polls `/metrics` until `wanted` holds for the value of the sample
/// `name{…label…}` (None: no such sample), within [`DEADLINE`].
pub fn wait_for_sample(
    port: u16,
    name: &str,
    label: &str,
    wanted: impl Fn(Option<f64>) -> bool,
) -> String {
    wait_for_metrics(port, &format!("{name}{{{label}}}"), |metrics| {
        wanted(sample(metrics, name, label))
    })
}

/// A deadline, not a wait: the helpers below return as soon as the wanted
/// value shows. The test build's serve and top, both reading 131,072 map
/// entries at once beside another test and two CPU hogs, took more than
/// 60 s for one interval in a loaded full-suite run (12 s of CPU each).
pub const DEADLINE: Duration = Duration::from_secs(180);

/// Polls `/metrics` until `wanted` holds for it, within [`DEADLINE`] (serve
/// answers between intervals; one over 65,536 locks on a loaded machine
/// takes seconds).
pub fn wait_for_metrics(port: u16, what: &str, wanted: impl Fn(&str) -> bool) -> String {
    let started = Instant::now();
    let mut last = String::new();
    loop {
        if let Some(metrics) = try_http_get(port, "/metrics") {
            if wanted(&metrics) {
                return metrics;
            }
            last = metrics;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{what} never got the wanted value; last /metrics:\n{last}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Reads `top`'s plain output until a line satisfies `wanted` (within [`DEADLINE`]).
pub fn wait_for_top_line(
    stdout: &mut impl BufRead,
    mut wanted: impl FnMut(&str) -> bool,
) -> String {
    let started = Instant::now();
    let mut seen = Vec::new();
    while started.elapsed() < DEADLINE {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if wanted(&line) {
            return line;
        }
        seen.push(line);
    }
    panic!(
        "top never printed the wanted line; it printed:\n{}",
        seen.concat()
    );
}
