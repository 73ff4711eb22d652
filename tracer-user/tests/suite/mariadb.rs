//! Issue 3: a real server no one here wrote. Debian's MariaDB under a
//! sysbench load: its global `LOCK_*` mutexes are named by their exported
//! symbols (checked against `nm -D` and the load address), with demangled
//! C++ callers. The test starts its own mariadbd on a private datadir and
//! socket (no TCP), and stops it by pid. Real BPF: run as root.

use std::{
    collections::HashMap,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::common::*;

const MARIADBD: &str = "/usr/sbin/mariadbd";

/// A mariadbd started by this test; stopped (SIGTERM, then SIGKILL) by its pid on drop.
struct Server {
    child: Child,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let socket = dir.path().join("sock");
        let install = Command::new("mariadb-install-db")
            .args([
                "--no-defaults",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ])
            .arg(format!("--datadir={}", data.display()))
            .output()
            .expect("mariadb-install-db (scripts/setup.sh installs mariadb-server)");
        assert!(
            install.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&install.stderr)
        );
        let child = Command::new(MARIADBD)
            .args([
                "--no-defaults",
                "--user=root",
                "--skip-networking",
                "--innodb-buffer-pool-size=32M",
            ])
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!(
                "--log-error={}",
                dir.path().join("error.log").display()
            ))
            .arg(format!(
                "--pid-file={}",
                dir.path().join("mariadbd.pid").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting mariadbd");
        let server = Server {
            child,
            socket,
            _dir: dir,
        };
        let started = Instant::now();
        while !server.client("select 1") {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "mariadbd did not accept connections"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }

    fn client(&self, sql: &str) -> bool {
        Command::new("mariadb")
            .arg(format!("--socket={}", self.socket.display()))
            .args(["-uroot", "-e", sql])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn sysbench(&self, command: &str, extra: &[&str]) {
        let output = Command::new("sysbench")
            .arg("oltp_read_write")
            .arg(format!("--mysql-socket={}", self.socket.display()))
            .args([
                "--mysql-user=root",
                "--mysql-db=sbtest",
                "--tables=2",
                "--table-size=1000",
            ])
            .args(extra)
            .arg(command)
            .output()
            .expect("sysbench (scripts/setup.sh installs it)");
        assert!(
            output.status.success(),
            "sysbench {command}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let pid = self.child.id() as i32;
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Exported data symbols of mariadbd (name -> link-time address).
fn exported_objects() -> HashMap<String, u64> {
    let output = Command::new("nm")
        .args(["-D", "--defined-only", MARIADBD])
        .output()
        .expect("nm (binutils)");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let address = u64::from_str_radix(fields.next()?, 16).ok()?;
            let kind = fields.next()?;
            let name = fields.next()?;
            matches!(kind, "B" | "b" | "D" | "d").then(|| (name.to_string(), address))
        })
        .collect()
}

/// Load address of mariadbd in `pid` (it is a PIE whose first segment is at 0).
fn load_base(pid: u32) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let line = maps
        .lines()
        .find(|line| line.ends_with(MARIADBD) && line.split_whitespace().nth(2) == Some("00000000"))
        .unwrap();
    u64::from_str_radix(line.split('-').next().unwrap(), 16).unwrap()
}

#[test]
fn mariadb_global_locks_are_named_with_cpp_callers() {
    assert!(
        Path::new(MARIADBD).exists(),
        "{MARIADBD} missing: scripts/setup.sh installs mariadb-server"
    );
    let server = Server::start();
    assert!(server.client("create database sbtest"));
    server.sysbench("prepare", &[]);
    let pid = server.child.id();
    let trace = Trace::attach(pid, &["--stacks", "3"]);
    server.sysbench("run", &["--threads=4", "--time=3"]);
    for _ in 0..5 {
        assert!(server.client("select count(*) from sbtest.sbtest1"));
    }
    trace.interrupt();
    let (report, table) = trace.finish();
    println!("{table}");
    println!("naming: {}", report["naming"]);

    let symbols = exported_objects();
    let base = load_base(pid);
    let locks = report["locks"].as_array().unwrap();
    let named: Vec<&serde_json::Value> = locks
        .iter()
        .filter(|lock| {
            lock["name"]
                .as_str()
                .is_some_and(|name| name.starts_with("LOCK_"))
        })
        .collect();
    assert!(named.len() >= 3, "too few LOCK_* mutexes named:\n{table}");
    let mut cpp_callers = 0;
    for lock in &named {
        let name = lock["name"].as_str().unwrap();
        let symbol = name.split('+').next().unwrap();
        let offset = name
            .split_once("+0x")
            .map_or(0, |(_, off)| u64::from_str_radix(off, 16).unwrap());
        let address = u64::from_str_radix(
            lock["address"].as_str().unwrap().trim_start_matches("0x"),
            16,
        )
        .unwrap();
        assert_eq!(
            Some(address),
            symbols.get(symbol).map(|a| base + a + offset),
            "{name} at the wrong address"
        );
        assert_eq!(lock["module"], MARIADBD);
        assert!(
            matches!(lock["region"].as_str(), Some(".bss" | ".data")),
            "{lock}"
        );
        let callers = lock["callers"].as_array().unwrap();
        let total: u64 = callers.iter().map(|c| c["count"].as_u64().unwrap()).sum();
        assert_eq!(
            Some(total),
            lock["acquisitions"].as_u64(),
            "callers of {name} do not add up"
        );
        for caller in callers {
            let function = caller["function"].as_str().unwrap_or("");
            assert!(!function.starts_with("_Z"), "mangled caller {function}");
            if function.contains("::") || function.contains('(') {
                cpp_callers += 1;
            }
        }
    }
    assert!(
        cpp_callers > 0,
        "no demangled C++ caller of a LOCK_* mutex:\n{table}"
    );
    // sysbench's prepared statements are counted under this server mutex.
    let prepared = named
        .iter()
        .find(|lock| lock["name"] == "LOCK_prepared_stmt_count")
        .expect("LOCK_prepared_stmt_count taken");
    assert!(
        prepared["callers"][0]["function"]
            .as_str()
            .unwrap()
            .contains("Statement"),
        "{prepared}"
    );
    drop(server);
}
