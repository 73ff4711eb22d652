//! mod_php under Apache: Debian's apache2 with the event MPM (threaded) and
//! the thread-safe PHP 8.2.32 module that `scripts/build-modphp.sh` builds
//! (`scripts/setup.sh --frankenphp`) at [`MODULE`]. One apache2 parent with
//! exactly one worker child of a few threads, on a free loopback port, with
//! its own config in a temp dir (nothing of the system's Apache config is
//! read), serving a docroot the test wrote. Stopped by its pid on drop.
use std::{
    net::TcpStream,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use super::{frankenphp::kit, live_views::free_port, live_views::try_http_get};

/// The Apache module (libs/libphp.so of PHP's apache2handler SAPI).
pub const MODULE: &str = "/tmp/e2e/modphp/libphp.so";
/// Threads of the one worker child.
pub const THREADS: u32 = 4;

/// A running apache2 with mod_php, started by this test.
pub struct ModPhp {
    parent: Child,
    port: u16,
    child: u32,
    dir: tempfile::TempDir,
}

impl ModPhp {
    /// Starts apache2 serving `docroot` (`.php` files run by PHP). The worker
    /// runs as www-data: `docroot`'s files are made world-readable here, and
    /// its parent directories must let www-data through.
    pub fn start(docroot: &Path) -> ModPhp {
        assert!(
            Path::new(MODULE).exists(),
            "{MODULE} is missing: run scripts/setup.sh --frankenphp (it runs scripts/build-modphp.sh)"
        );
        readable_by_all(docroot);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        set_mode(root, 0o755);
        let port = free_port();
        let root_s = root.display();
        let docroot_s = docroot.display();
        // The kit's php.ini (mysqlnd statistics on, as in FrankenPHP), with
        // PHP's error log in this temp dir, writable by the worker.
        let php_errors = root.join("php_errors.log");
        std::fs::write(&php_errors, "").unwrap();
        set_mode(&php_errors, 0o666);
        let kit_ini = std::fs::read_to_string(kit().join("php.ini")).expect("the kit's php.ini");
        let ini: String = kit_ini
            .lines()
            .map(|line| {
                if line.starts_with("error_log") {
                    format!("error_log={}\n", php_errors.display())
                } else {
                    format!("{line}\n")
                }
            })
            .collect();
        assert!(
            ini.contains("mysqlnd.collect_statistics=1"),
            "the kit's php.ini no longer turns mysqlnd statistics on:\n{ini}"
        );
        std::fs::write(root.join("php.ini"), ini).unwrap();
        set_mode(&root.join("php.ini"), 0o644);
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
LoadModule php_module {MODULE}
PHPIniDir "{root_s}"
User www-data
Group www-data
DocumentRoot "{docroot_s}"
<Directory "{docroot_s}">
    Require all granted
</Directory>
<FilesMatch \.php$>
    SetHandler application/x-httpd-php
</FilesMatch>
StartServers 1
ServerLimit 1
ThreadLimit {THREADS}
ThreadsPerChild {THREADS}
MaxRequestWorkers {THREADS}
MinSpareThreads 1
MaxSpareThreads {spare}
MaxConnectionsPerChild 0
KeepAlive On
MaxKeepAliveRequests 0
KeepAliveTimeout 30
"#,
            spare = THREADS * 2,
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
        let mut server = ModPhp {
            parent,
            port,
            child: 0,
            dir,
        };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = server.parent.try_wait() {
                panic!(
                    "apache2 exited ({status}); error.log:\n{}",
                    server.error_log()
                );
            }
            let children = server.children();
            if TcpStream::connect(("127.0.0.1", port)).is_ok()
                && children.len() == 1
                && maps_module(children[0])
            {
                server.child = children[0];
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "apache2 with mod_php did not come up (children {children:?}); error.log:\n{}",
                server.error_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The worker child: the one process that serves requests (libphp mapped).
    pub fn child_pid(&self) -> u32 {
        let children = self.children();
        assert_eq!(
            children,
            vec![self.child],
            "the worker child changed; error.log:\n{}",
            self.error_log()
        );
        self.child
    }

    pub fn parent_pid(&self) -> u32 {
        self.parent.id()
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The body of a 200 answer to `GET path` (one connection).
    pub fn get(&self, path: &str) -> Option<String> {
        try_http_get(self.port, path)
    }

    /// Apache's error log and PHP's, for failure messages.
    pub fn error_log(&self) -> String {
        let read = |name: &str| std::fs::read_to_string(self.dir.path().join(name));
        format!(
            "{}{}",
            read("error.log").unwrap_or_default(),
            read("php_errors.log").unwrap_or_default()
        )
    }

    /// The config directory (httpd.conf, php.ini, logs).
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
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
}

impl Drop for ModPhp {
    fn drop(&mut self) {
        // Graceful stop of the apache2 this test started, by its pid; it stops its child.
        let pid = self.parent.id() as i32;
        // SAFETY: kill(2) on the pid of the child process this test started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.parent.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let children = self.children();
        let _ = self.parent.kill();
        let _ = self.parent.wait();
        for child in children {
            // SAFETY: kill(2) on the worker this test's apache2 forked.
            unsafe { libc::kill(child as i32, libc::SIGKILL) };
        }
    }
}

/// True when `pid` has [`MODULE`] mapped.
fn maps_module(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|maps| maps.contains(MODULE))
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `dir` and everything in it readable (directories searchable) by all.
fn readable_by_all(dir: &Path) {
    set_mode(dir, 0o755);
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            readable_by_all(&path);
        } else {
            set_mode(&path, 0o644);
        }
    }
}
