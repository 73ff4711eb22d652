//! The tracers under test: none, locktrace with some flags, or bpftrace with
//! a one-liner; started on a pid, live when this returns, stopped and waited
//! for with their CPU time and peak memory.
use std::{
    io::{BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use locktrace::model::Report;
use nix::{sys::signal::Signal, unistd::Pid};

use crate::fixtures::read_until;

/// A tracer configuration under test.
#[derive(Clone)]
pub enum Tracer {
    None,
    /// `locktrace record` with these arguments, and these environment variables.
    Locktrace {
        args: Vec<String>,
        env: Vec<(String, String)>,
    },
    /// bpftrace with this probe (`uprobe:FILE:SYMBOL`) and action; `{pid}` in
    /// the action is replaced by the fixture's pid.
    Bpftrace {
        probe: String,
        action: String,
    },
}

/// The equivalent bpftrace one-liner.
pub fn bpftrace_one_liner() -> Tracer {
    Tracer::Bpftrace {
        probe: "uprobe:/lib/x86_64-linux-gnu/libc.so.6:pthread_mutex_lock".into(),
        action: "/pid == {pid}/ { @[arg0] = count(); }".into(),
    }
}

pub fn locktrace(args: &[&str]) -> Tracer {
    locktrace_env(args, &[])
}

/// locktrace with environment variables set (bench knobs).
pub fn locktrace_env(args: &[&str], env: &[(&str, &str)]) -> Tracer {
    Tracer::Locktrace {
        args: args.iter().map(|s| s.to_string()).collect(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// How long a tracer may take to get its probes live.
const ATTACH_LIMIT: Duration = Duration::from_secs(60);

/// A tracer whose probes are live.
pub struct Running {
    child: Child,
    is_bpftrace: bool,
    /// locktrace's JSON report and --ready-file.
    files: Option<(PathBuf, PathBuf)>,
    /// Until bpftrace's `BEGIN` ran (locktrace's own figure is in its report).
    started_ms: f64,
    /// locktrace's stderr, read in the background so it never blocks.
    stderr: Option<std::thread::JoinHandle<String>>,
}

/// What a finished tracer cost and reported.
#[derive(Debug, Clone, Default)]
pub struct Finished {
    /// Time until the probes were live.
    pub attach_ms: f64,
    /// User + system CPU seconds, peak RSS in MiB (from wait4).
    pub cpu_s: f64,
    pub rss_mib: f64,
    /// locktrace's report, typed as the library writes it.
    pub report: Option<Report>,
}

/// Starts `tracer` on `pid`; returns once its probes are live.
pub fn start(tracer: &Tracer, pid: u32, locktrace: &Path) -> Result<Option<Running>> {
    let started = Instant::now();
    Ok(match tracer {
        Tracer::None => None,
        Tracer::Locktrace { args, env } => {
            let json = std::env::temp_dir().join(format!("locktrace-bench-{pid}.json"));
            let ready = json.with_extension("ready");
            let _ = std::fs::remove_file(&ready);
            let mut child = Command::new(locktrace)
                .args(["record", "--pid", &pid.to_string(), "--json"])
                .arg(&json)
                .arg("--ready-file")
                .arg(&ready)
                .args(args)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .with_context(|| format!("starting {}", locktrace.display()))?;
            let mut stderr = child.stderr.take().expect("piped");
            let stderr = std::thread::spawn(move || {
                let mut text = String::new();
                let _ = stderr.read_to_string(&mut text);
                text
            });
            let mut running = Running {
                child,
                is_bpftrace: false,
                files: Some((json, ready.clone())),
                started_ms: 0.0,
                stderr: Some(stderr),
            };
            if let Err(error) = running.wait_for_ready(&ready) {
                let text = running.stderr.take().and_then(|h| h.join().ok());
                bail!("{error}: {}", text.unwrap_or_default().trim());
            }
            Some(running)
        }
        Tracer::Bpftrace { probe, action } => {
            let program = format!(
                "{probe} {} BEGIN {{ printf(\"ready\\n\"); }}",
                action.replace("{pid}", &pid.to_string())
            );
            let mut child = Command::new("bpftrace")
                .args(["-e", &program])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("starting bpftrace (scripts/setup.sh installs it)")?;
            let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
            read_until(&mut stdout, "bpftrace", |line| line == "ready")?;
            std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
            Some(Running {
                child,
                is_bpftrace: true,
                files: None,
                started_ms: started.elapsed().as_secs_f64() * 1e3,
                stderr: None,
            })
        }
    })
}

impl Running {
    /// locktrace creates the ready file once its probes are live.
    fn wait_for_ready(&mut self, ready: &Path) -> Result<()> {
        let started = Instant::now();
        while !ready.exists() {
            if let Some(status) = self.child.try_wait()? {
                bail!("locktrace exited ({status}) before its probes were live");
            }
            if started.elapsed() > ATTACH_LIMIT {
                self.interrupt();
                let _ = self.child.wait();
                bail!("locktrace's probes were not live after {ATTACH_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Both tracers stop on SIGINT and write what they have; only our child, by pid.
    pub fn interrupt(&self) {
        let _ = nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT);
    }

    /// Waits for the tracer (locktrace stops by itself when the target
    /// exits; bpftrace is interrupted) and reads what it cost and reported.
    pub fn finish(mut self) -> Result<Finished> {
        if self.is_bpftrace {
            self.interrupt();
        }
        let (cpu_s, rss_mib) = wait_with_usage(&self.child)?;
        let stderr = self.stderr.take().and_then(|h| h.join().ok());
        let mut finished = Finished {
            attach_ms: self.started_ms,
            cpu_s,
            rss_mib,
            report: None,
        };
        if let Some((json, ready)) = &self.files {
            let report = Report::load(json).with_context(|| {
                format!(
                    "locktrace wrote no report: {}",
                    stderr.unwrap_or_default().trim()
                )
            })?;
            finished.attach_ms = report
                .overhead
                .as_ref()
                .map_or(f64::NAN, |overhead| overhead.attach_ms as f64);
            finished.report = Some(report);
            let _ = std::fs::remove_file(json);
            let _ = std::fs::remove_file(ready);
        }
        Ok(finished)
    }
}

/// Waits for our child and returns its (user + system CPU seconds, peak RSS
/// MiB). nix has no wait4, and getrusage(RUSAGE_CHILDREN) would mix in the
/// fixtures' usage, so this stays a libc call.
fn wait_with_usage(child: &Child) -> Result<(f64, f64)> {
    let mut status = 0;
    // SAFETY: rusage is plain data; all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child's pid, filling structs we own.
    let waited = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    if waited < 0 {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((
        seconds(usage.ru_utime) + seconds(usage.ru_stime),
        usage.ru_maxrss as f64 / 1024.0,
    ))
}
