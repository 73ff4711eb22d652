//! Issue 4: per-request locks of a real threaded HTTP server nobody here
//! wrote: Debian's apache2 with the event MPM, one worker child with a few
//! threads on a loopback port, serving a static file under the load driver.
//! The test starts Apache with its own config in a temp dir and stops it by
//! its pid. Real BPF: run as root.
//!
//! What the worker process shows per request (Apache 2.4, glibc, observed
//! over many runs with -c 1..4 on this machine):
//! - `r->invoke_mtx`: ap_process_async_request creates a mutex in every
//!   request's pool and locks it once before running the handler, so before
//!   the response: exactly 1.0 per request, spread over a few addresses as
//!   request pools are reused (callers: ap_process_async_request).
//! - the worker queue mutex (fd_queue.c; callers ap_queue_push_socket and
//!   ap_queue_pop_something): the listener pushes a readable connection and
//!   a worker pops it, 2 per request; fewer when a worker finds the next
//!   request already read and serves it without the queue, a few more when a
//!   worker wakes without work. Observed 1.87-2.2 per request.
//! - the idle-workers / timeout-queue mutex of mod_mpm_event (static
//!   functions, so callers are shown as mod_mpm_event.so+offset): ~1.9.
//! - idle workers wait on the worker queue's condition variable (through
//!   apr_thread_cond_wait): about one wait per request, seconds in total,
//!   classified `condvar` and kept out of the contention totals.

use std::{
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::common::*;
use serde_json::Value;

const BODY: &str = "hello apache\n";

/// A running apache2 (event MPM, one child) started by this test.
struct Apache {
    parent: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Apache {
    fn start(threads: u32) -> Apache {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let docs = root.join("htdocs");
        std::fs::create_dir(&docs).unwrap();
        std::fs::write(docs.join("index.html"), BODY).unwrap();
        // The worker runs as www-data: it must be able to read the file.
        set_mode(root, 0o755);
        set_mode(&docs, 0o755);
        set_mode(&docs.join("index.html"), 0o644);
        let port = free_port();
        let root_s = root.display();
        let config = format!(
            r#"ServerRoot "{root_s}"
DefaultRuntimeDir "{root_s}"
PidFile "{root_s}/apache2.pid"
ErrorLog "{root_s}/error.log"
LogLevel warn
Listen 127.0.0.1:{port}
ServerName localhost
LoadModule mpm_event_module /usr/lib/apache2/modules/mod_mpm_event.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
User www-data
Group www-data
DocumentRoot "{root_s}/htdocs"
<Directory "{root_s}/htdocs">
    Require all granted
</Directory>
StartServers 1
ServerLimit 1
ThreadLimit {threads}
ThreadsPerChild {threads}
MaxRequestWorkers {threads}
MinSpareThreads 1
MaxSpareThreads {spare}
KeepAlive On
MaxKeepAliveRequests 0
KeepAliveTimeout 30
"#,
            spare = threads * 2,
        );
        let config_path = root.join("httpd.conf");
        std::fs::write(&config_path, config).unwrap();
        let parent = Command::new("/usr/sbin/apache2")
            .arg("-f")
            .arg(&config_path)
            .arg("-DFOREGROUND")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting apache2 (scripts/setup.sh installs it)");
        let apache = Apache { parent, port, dir };
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() || apache.children().len() != 1 {
            let log =
                std::fs::read_to_string(apache.dir.path().join("error.log")).unwrap_or_default();
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "apache2 did not come up; error.log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        apache
    }

    /// Child processes of the apache2 parent (the event MPM's worker processes).
    fn children(&self) -> Vec<u32> {
        let pid = self.parent.id();
        let mut children = Vec::new();
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                let list =
                    std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
                children.extend(
                    list.split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
        children
    }

    fn worker(&self) -> u32 {
        let children = self.children();
        assert_eq!(
            children.len(),
            1,
            "expected one worker child, found {children:?}"
        );
        children[0]
    }
}

impl Drop for Apache {
    fn drop(&mut self) {
        // Graceful stop of the apache2 this test started, by its pid; it stops its child.
        let pid = self.parent.id() as i32;
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.parent.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.parent.kill();
        let _ = self.parent.wait();
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn apache_event_mpm_per_request_locks() {
    let apache = Apache::start(4);
    let worker = apache.worker();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("apache.json");
    let url = format!("http://127.0.0.1:{}/index.html", apache.port);
    const REQUESTS: u64 = 2000;
    let output = locktrace()
        .args(["record", "--pid", &worker.to_string(), "--json"])
        .arg(&json)
        .args([
            "--load",
            &url,
            "-n",
            &REQUESTS.to_string(),
            "-c",
            "2",
            "--warmup",
            "200",
            "--expect-body",
            BODY.trim(),
        ])
        .output()
        .unwrap();
    let table = crate::common::unwrapped(&String::from_utf8_lossy(&output.stdout));
    assert!(
        output.status.success(),
        "record failed: {}\n{table}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The per-request report, for the record of what Apache does.
    eprintln!("{table}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["requests"]["source"], "load");
    assert_eq!(report["requests"]["count"], REQUESTS);
    assert_eq!(
        report["requests"]["statuses"],
        serde_json::json!({"200": REQUESTS})
    );
    assert_eq!(report["requests"]["errors"], 0);
    assert_eq!(report["dropped"], serde_json::json!({}));

    // r->invoke_mtx: locked once per request, before the response.
    let invoke: Vec<&Value> = locks_called_by(&report, "ap_process_async_request");
    assert!(
        !invoke.is_empty(),
        "no per-request mutex from ap_process_async_request:\n{table}"
    );
    let taken: u64 = invoke
        .iter()
        .map(|lock| lock["acquisitions"].as_u64().unwrap())
        .sum();
    assert_eq!(
        taken, REQUESTS,
        "r->invoke_mtx is locked exactly once per request"
    );

    // The worker queue mutex: one lock that both push and pop take, once or twice per request.
    let queue = locks_called_by(&report, "ap_queue_push_socket");
    assert_eq!(queue.len(), 1, "one worker queue mutex:\n{table}");
    let callers = caller_functions(queue[0]);
    assert!(
        callers.iter().any(|f| f == "ap_queue_pop_something"),
        "{callers:?}"
    );
    let per_request = queue[0]["per_request"]["acquisitions"].as_f64().unwrap();
    assert!(
        (1.0..=2.5).contains(&per_request),
        "worker queue mutex {per_request} per request"
    );

    assert_idle_waits_are_condvar_rows(&report, &table);
    drop(apache);
}

fn assert_idle_waits_are_condvar_rows(report: &Value, table: &str) {
    // Idle workers wait on the worker queue's condition variable for the
    // next connection: the longest waits of all, and none of them lock
    // contention. They are condvar rows, outside the contention totals.
    let locks = report["locks"].as_array().unwrap();
    let longest = locks
        .iter()
        .max_by_key(|lock| lock["wait_ns"].as_u64().unwrap())
        .unwrap();
    assert_eq!(longest["wait_class"], "condvar", "{table}");
    assert_eq!(longest["kind"], "condvar", "{table}");
    let sum = |class: &str, field: &str| -> u64 {
        locks
            .iter()
            .filter(|lock| lock["wait_class"] == class)
            .map(|lock| lock[field].as_u64().unwrap())
            .sum()
    };
    let totals = &report["totals"];
    assert_eq!(totals["contended"], sum("lock", "contended"));
    assert_eq!(totals["wait_ns"], sum("lock", "wait_ns"));
    assert_eq!(
        totals["by_wait_class"]["condvar"]["waits"],
        sum("condvar", "contended")
    );
    assert!(
        totals["wait_ns"].as_u64().unwrap() < longest["wait_ns"].as_u64().unwrap(),
        "the idle workers' wait is not in the totals:\n{table}"
    );
}
