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
