//! `locktrace agent`: every PHP server on the machine (or the processes
//! `--exe`/`--cgroup` select), found as it execs (the kernel's proc
//! connector) and by a /proc scan every 500 ms (the safety net, and all
//! there is where the connector cannot be opened), attached in a live
//! session each, released when it exits (a restart is a new pid, found
//! again as it execs), on one Prometheus `/metrics` with serve's metric
//! names plus labels saying which process and container.
//!
//! One thread owns the sessions (scan, attach, read, release); the HTTP
//! side only encodes the registries it is handed. The agent measures its own
//! CPU: above `--max-cpu` it reads the maps less often (the counts stay
//! exact: they are totals in the maps) and says so in one line.
pub mod discover;
pub(crate) mod labels;
pub mod push;

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    net::SocketAddr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use anyhow::Result;
use prometheus_client::{metrics::gauge::Gauge, registry::Registry};

use crate::{
    live::{self, LiveOptions, LiveSession},
    model::{Mode, Placement, Report},
    probe::request_auto::RequestProbeSpec,
    render::output::note,
    serve::{self, LabelledSeries, MetricsSource, Page, PageError, PageSource, Site},
    trace::proc_connector::{Connector, Event, Events},
};

use discover::{Discovery, Found, Selectors};
use push::{PushCounters, Pusher, Upload};

/// How often /proc is scanned for new and exited processes.
pub(crate) const SCAN_EVERY: Duration = Duration::from_millis(500);
/// The watcher's pause between looks at its exec events and `?seconds=`
/// requests while a process starts or exits (an event ends a pause at
/// once whatever its length).
const PAUSE: Duration = Duration::from_millis(20);
/// The pause otherwise: each wakeup costs, and only a `?seconds=` request
/// waits for it.
const IDLE_PAUSE: Duration = Duration::from_millis(100);
/// After a watched process's exit event, how long each pause checks for it
/// to be gone.
const EXITING_CHECKS: Duration = Duration::from_millis(300);
/// The maps are read this often, and at most [`SLOWEST_READ`] apart when shedding.
const READ_EVERY: Duration = Duration::from_secs(1);
const SLOWEST_READ: Duration = Duration::from_secs(8);
/// A failed attach is tried again after this, then twice as long each
/// time, [`ATTACH_TRIES`] tries in all (1 + 2 + 4 + 8 + 16 s of pauses).
const FIRST_RETRY: Duration = Duration::from_secs(1);
const ATTACH_TRIES: u32 = 6;
/// At the stop, the last profiles get this long to be posted.
const DRAIN_WITHIN: Duration = Duration::from_secs(5);
/// The agent's CPU is compared with `--max-cpu` over this window.
const CPU_WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub(crate) struct AgentOptions {
    pub listen: SocketAddr,
    pub selectors: Selectors,
    pub mode: Mode,
    pub placement: Placement,
    /// Kernel lock contention traced (not with `--no-kernel-locks`).
    pub kernel_locks: bool,
    /// Lock series per process at most (plus `lock="other"`).
    pub max_locks: usize,
    /// Locks quiet this long are forgotten (as serve's `--expire-after`).
    pub expire_after: Duration,
    /// An exited process's series stay this long (the last counts get scraped).
    pub forget_exited: Duration,
    /// The agent's CPU budget, in percent of one core.
    pub max_cpu_percent: f64,
    /// Created (empty) once the listener is up and the first scan is done.
    pub ready_file: Option<std::path::PathBuf>,
    /// `--push URL`: each process's profile of each interval, to `URL/ingest`.
    pub push: Option<String>,
    /// `--push-every`: the interval.
    pub push_every: Duration,
}

/// The label names of a process's series, in order.
pub(crate) const LABELS: [&str; 6] = ["container_id", "runtime", "pod_uid", "pid", "exe", "server"];

/// A process's constant labels (empty values where unknown).
pub(crate) fn process_labels(found: &Found) -> Vec<(String, String)> {
    let container = labels::container(&found.cgroup);
    let values = [
        container.as_ref().map(|c| c.id.clone()).unwrap_or_default(),
        container
            .as_ref()
            .map(|c| c.runtime.to_string())
            .unwrap_or_default(),
        labels::pod_uid(&found.cgroup).unwrap_or_default(),
        found.pid.to_string(),
        discover::exe_name(&found.exe).to_string(),
        found.server.map(|s| s.to_string()).unwrap_or_default(),
    ];
    LABELS
        .iter()
        .map(|name| name.to_string())
        .zip(values)
        .collect()
}

/// What the HTTP side encodes: each process's registry (live or recently
/// exited) and the agent's own.
#[derive(Default)]
struct Shared {
    processes: BTreeMap<u32, Arc<Registry>>,
    /// Each process's counts since attach, for its pprof profile.
    reports: BTreeMap<u32, Kept>,
    /// Reads so far (of any process): a report kept later is fresher.
    reads: u64,
    /// Processes a `?seconds=` window wants read now (as it opens and closes).
    read_now: BTreeSet<u32>,
}

/// A process's counts since attach, and which read they are from.
#[derive(Clone)]
struct Kept {
    report: Arc<Report>,
    read: u64,
}

/// The agent's own gauges.
#[derive(Clone, Default)]
struct AgentGauges {
    cpu_seconds: Gauge<f64, AtomicU64>,
    watched: Gauge,
    read_interval_seconds: Gauge<f64, AtomicU64>,
}

impl AgentGauges {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "locktrace_agent_cpu_seconds",
            "The agent's own CPU time (user + system) since start",
            self.cpu_seconds.clone(),
        );
        registry.register(
            "locktrace_agent_watched_processes",
            "Processes the agent has attached to now",
            self.watched.clone(),
        );
        registry.register(
            "locktrace_agent_read_interval_seconds",
            "How often the maps are read now (above 1 s: shedding work over --max-cpu)",
            self.read_interval_seconds.clone(),
        );
    }
}

/// The process's CPU time (user + system) in seconds, from /proc/self/stat.
pub(crate) fn own_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks as f64 / per_second as f64)
}

pub(crate) async fn run(options: &AgentOptions) -> Result<std::process::ExitCode> {
    let stop_signal = live::stop_requested();
    tokio::pin!(stop_signal);
    let listener = serve::listen(options.listen).await?;
    let shared = Arc::new(Mutex::new(Shared::default()));
    let gauges = AgentGauges::default();
    let mut own = Registry::default();
    gauges.register(&mut own);
    let pusher = match &options.push {
        Some(url) => {
            let counters = PushCounters::default();
            counters.register(&mut own);
            Some(Pusher::start(url, counters)?)
        }
        None => None,
    };
    let source = Site {
        metrics: metrics_source(shared.clone(), Arc::new(own)),
        pages: Some(pprof_pages(shared.clone())),
    };
    let events = match Connector::open() {
        Ok(events) => {
            // Unfiltered, every thread's start and end would wake the watcher.
            if let Err(error) = events.only_execs_and_process_exits() {
                note(format_args!(
                    "locktrace: agent: the proc connector's events are not filtered in the kernel ({error}): more wakeups on a busy machine"
                ));
            }
            Some(events)
        }
        Err(error) => {
            note(format_args!(
                "locktrace: agent: no exec events from the kernel's proc connector ({error}): new processes are found by the /proc scan alone, up to {} ms late (the connector needs CAP_NET_ADMIN in the host's network namespace)",
                SCAN_EVERY.as_millis()
            ));
            None
        }
    };
    note(format_args!(
        "locktrace: agent serving http://{}/metrics, finding {} {}and scanning /proc every {} ms; Ctrl-C to stop",
        listener.local_addr()?,
        describe(&options.selectors),
        match events {
            Some(_) => "as they exec ",
            None => "",
        },
        SCAN_EVERY.as_millis(),
    ));
    if let Some(url) = &options.push {
        note(format_args!(
            "locktrace: agent: posting each process's mutex profile every {} s to {}",
            options.push_every.as_secs(),
            push::ingest_url(url)
        ));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (options, shared, stop) = (options.clone(), shared.clone(), stop.clone());
        std::thread::Builder::new()
            .name("locktrace-agent".into())
            .spawn(move || Watcher::new(options, shared, gauges, pusher, events).run(&stop))?
    };
    let connections = Arc::new(tokio::sync::Semaphore::new(serve::MAX_CONNECTIONS));
    let result = loop {
        tokio::select! {
            result = &mut stop_signal => break result,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    if let Ok(slot) = connections.clone().try_acquire_owned() {
                        tokio::spawn(serve::answer(stream, source.clone(), slot));
                    }
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
        }
    };
    stop.store(true, Ordering::Relaxed);
    // The sessions detach (and inproc's GOT entries switch back) as the thread ends.
    let _ = tokio::task::spawn_blocking(move || watcher.join()).await;
    result.map(|()| std::process::ExitCode::SUCCESS)
}

fn describe(selectors: &Selectors) -> String {
    let mut parts: Vec<String> = selectors.exe.iter().map(|e| format!("--exe {e}")).collect();
    parts.extend(selectors.cgroup.iter().map(|c| format!("--cgroup {c}")));
    let found = if parts.is_empty() {
        "FrankenPHP and thread-safe PHP".into()
    } else {
        parts.join(", ")
    };
    match selectors.within.is_empty() {
        true => found,
        false => format!("{found} in cgroups with {}", selectors.within.join(" or ")),
    }
}

/// `/metrics`: every registry encoded, the families merged.
fn metrics_source(shared: Arc<Mutex<Shared>>, own: Arc<Registry>) -> MetricsSource {
    Arc::new(move || {
        let registries: Vec<Arc<Registry>> = {
            let shared = shared.lock().unwrap_or_else(PoisonError::into_inner);
            shared.processes.values().cloned().collect()
        };
        let mut texts = Vec::with_capacity(registries.len() + 1);
        for registry in registries.iter().chain([&own]) {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).ok()?;
            texts.push(text);
        }
        Some(serve::merge_families(&texts))
    })
}

/// `/debug/pprof/mutex?pid=PID`: the process's mutex profile since attach
/// (gzipped pprof, as `record --pprof` writes it); with `&seconds=S`, the
/// profile of the next S seconds (as Go's `?seconds=` delta profiles).
fn pprof_pages(shared: Arc<Mutex<Shared>>) -> PageSource {
    Arc::new(move |path, query| {
        if path != PPROF_PATH {
            return None;
        }
        let (shared, query) = (shared.clone(), query.to_string());
        Some(Box::pin(async move { pprof_page(&shared, &query).await }))
    })
}

/// What `?pid=PID[&seconds=S]` asks for.
fn pprof_query(query: &str) -> Result<(u32, Option<Duration>), PageError> {
    let value = |name: &str| {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
    };
    let pid = value("pid")
        .and_then(|pid| pid.parse::<u32>().ok())
        .ok_or_else(|| {
            PageError::BadRequest(format!(
                "give the process's pid: {PPROF_PATH}?pid=PID (the pids are on /metrics)"
            ))
        })?;
    let longest = serve::LONGEST_PAGE.as_secs();
    let seconds = match value("seconds") {
        None => None,
        Some(text) => match text.parse::<u64>() {
            Ok(seconds @ 1..) if seconds <= longest => Some(Duration::from_secs(seconds)),
            _ => {
                return Err(PageError::BadRequest(format!(
                    "seconds={text}: give whole seconds from 1 to {longest}, e.g. {PPROF_PATH}?pid={pid}&seconds=10"
                )));
            }
        },
    };
    Ok((pid, seconds))
}

async fn pprof_page(shared: &Arc<Mutex<Shared>>, query: &str) -> Result<Page, PageError> {
    let (pid, seconds) = pprof_query(query)?;
    let report = match seconds {
        None => latest(shared, pid).ok_or(PageError::NotFound)?.report,
        Some(seconds) => {
            let before = fresh(shared, pid).await.ok_or(PageError::NotFound)?;
            tokio::time::sleep(seconds).await;
            // An exited process keeps its last counts: the window ends there.
            let after = fresh(shared, pid).await.unwrap_or_else(|| before.clone());
            Arc::new(crate::analysis::window::since(
                &before.report,
                &after.report,
            ))
        }
    };
    let mut body = Vec::new();
    crate::render::pprof::write(&report, &mut body)
        .map_err(|error| PageError::Failed(format!("{error:#}")))?;
    Ok(("application/octet-stream", body))
}

fn latest(shared: &Mutex<Shared>, pid: u32) -> Option<Kept> {
    let shared = shared.lock().unwrap_or_else(PoisonError::into_inner);
    shared.reports.get(&pid).cloned()
}

/// The process's counts from a read made now (the watcher reads it within
/// its pause, 100 ms at most); the last ones when no read comes (it exited). A
/// process attached a moment ago has no read yet: this one is its first.
async fn fresh(shared: &Mutex<Shared>, pid: u32) -> Option<Kept> {
    let asked = {
        let mut shared = shared.lock().unwrap_or_else(PoisonError::into_inner);
        if !shared.processes.contains_key(&pid) && !shared.reports.contains_key(&pid) {
            return None;
        }
        shared.read_now.insert(pid);
        shared.reads
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if let Some(kept) = latest(shared, pid).filter(|kept| kept.read > asked) {
            return Some(kept);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    latest(shared, pid)
}

/// Where each process's pprof profile is served (`?pid=PID`).
pub(crate) const PPROF_PATH: &str = "/debug/pprof/mutex";

struct Watched {
    session: LiveSession,
    series: LabelledSeries,
    found: Found,
    labels: Vec<(String, String)>,
    /// Its counts since attach at the last read.
    latest: Option<Arc<Report>>,
    /// Its counts at the last push, and when that was (attach before the first).
    pushed: Option<Arc<Report>>,
    pushed_at: SystemTime,
}

/// A process whose attach failed.
struct Retry {
    found: Found,
    /// Attaches tried so far.
    tries: u32,
    next: Instant,
}

/// The thread that owns the sessions.
struct Watcher {
    options: AgentOptions,
    shared: Arc<Mutex<Shared>>,
    gauges: AgentGauges,
    discovery: Discovery,
    watched: BTreeMap<u32, Watched>,
    /// Exited processes whose series are still exported, and since when.
    exited: Vec<(u32, Instant)>,
    read_every: Duration,
    pusher: Option<Pusher>,
    next_push: Instant,
    /// Processes whose attach failed: tried again when due.
    failed: BTreeMap<u32, Retry>,
    /// CPU seconds and time at the start of the current budget window.
    window: (f64, Instant),
    started: (f64, Instant),
    /// The proc connector's exec and exit events (`None`: the scan alone).
    events: Option<Connector>,
    /// A watched process's leader exited: until then, each pause checks
    /// which watched processes are gone (the event comes before the
    /// process is a zombie).
    exiting_until: Option<Instant>,
    /// DWARF files parsed so far that the agent has said.
    dwarf_said: usize,
}

impl Watcher {
    fn new(
        options: AgentOptions,
        shared: Arc<Mutex<Shared>>,
        gauges: AgentGauges,
        pusher: Option<Pusher>,
        events: Option<Connector>,
    ) -> Watcher {
        let cpu = own_cpu_seconds().unwrap_or(0.0);
        Watcher {
            next_push: Instant::now() + options.push_every,
            pusher,
            failed: BTreeMap::new(),
            discovery: Discovery::new(options.selectors.clone()),
            options,
            shared,
            gauges,
            watched: BTreeMap::new(),
            exited: Vec::new(),
            read_every: READ_EVERY,
            window: (cpu, Instant::now()),
            started: (cpu, Instant::now()),
            events,
            exiting_until: None,
            dwarf_said: 0,
        }
    }

    fn run(mut self, stop: &AtomicBool) {
        let mut next_read = Instant::now() + self.read_every;
        let mut first = true;
        while !stop.load(Ordering::Relaxed) {
            let scan_start = Instant::now();
            self.release_exited();
            // Execs already told are judged as they start, not by the scan.
            self.events(Duration::ZERO);
            let watched: HashSet<u32> = self.watched.keys().copied().collect();
            for found in self.discovery.scan(&watched) {
                self.attach(found, None);
            }
            // Judged by this scan: from now on the events tell what changes.
            self.discovery.told(self.events.is_some());
            self.retry_failed();
            if first {
                first = false;
                if let Some(path) = &self.options.ready_file
                    && let Err(error) = crate::record::signal_ready(path)
                {
                    note(format_args!("locktrace: agent: {error}"));
                }
            }
            let push_due = self.pusher.is_some() && Instant::now() >= self.next_push;
            if push_due || Instant::now() >= next_read {
                self.read_all();
                next_read = Instant::now() + self.read_every;
            }
            if push_due {
                self.push_all();
                self.next_push = Instant::now() + self.options.push_every;
            }
            self.forget_exited();
            self.budget();
            let next = scan_start + SCAN_EVERY;
            while !stop.load(Ordering::Relaxed) && Instant::now() < next {
                self.read_requested();
                let busy = self.exiting_until.is_some() || self.discovery.any_starting();
                let pause = if busy { PAUSE } else { IDLE_PAUSE };
                let pause = pause.min(next.saturating_duration_since(Instant::now()));
                if !self.events(pause) {
                    break;
                }
            }
        }
        // The last partial interval: each process's counts since its last push.
        if self.pusher.is_some() {
            self.read_all();
            self.push_all();
        }
        let (cpu, since) = self.started;
        let used = own_cpu_seconds().unwrap_or(cpu) - cpu;
        let wall = since.elapsed().as_secs_f64();
        note(format_args!(
            "locktrace: agent used {used:.2} s of CPU in {wall:.1} s ({:.2}% of one core); detaching from {} processes",
            100.0 * used / wall.max(1e-3),
            self.watched.len()
        ));
        if let Some(pusher) = self.pusher.take() {
            pusher.finish(DRAIN_WITHIN);
        }
    }

    /// Waits up to `wait` for exec and exit events and acts on them: a
    /// process that exec'd is judged (and attached) as soon as its
    /// libraries are mapped, a watched one that exited is released. False
    /// when events were lost: the caller scans /proc now.
    fn events(&mut self, wait: Duration) -> bool {
        let Some(events) = &mut self.events else {
            std::thread::sleep(wait);
            return true;
        };
        let mut complete = true;
        let mut exited = false;
        match events.wait(wait) {
            Ok(Events::Some(events)) => {
                for event in events {
                    match event {
                        Event::Exec { tgid } => self.discovery.exec(tgid),
                        // A process ends with its leader (then checked gone).
                        Event::Exit { pid, tgid, .. } if pid == tgid => {
                            self.discovery.exit(pid);
                            exited |= self.watched.contains_key(&pid);
                        }
                        _ => {}
                    }
                }
            }
            Ok(Events::Lost) => {
                complete = false;
                // The next scan looks at every process again.
                self.discovery.told(false);
            }
            Err(error) => {
                note(format_args!(
                    "locktrace: agent: reading the proc connector's events failed ({error}); finding new processes by the /proc scan alone from now on"
                ));
                self.events = None;
                self.discovery.told(false);
            }
        }
        if exited {
            self.exiting_until = Some(Instant::now() + EXITING_CHECKS);
        }
        if let Some(until) = self.exiting_until {
            self.release_exited();
            if Instant::now() >= until {
                self.exiting_until = None;
            }
        }
        if self.discovery.any_starting() {
            let watched: HashSet<u32> = self.watched.keys().copied().collect();
            for (found, exec) in self.discovery.starting(&watched) {
                self.attach(found, Some(exec));
            }
        }
        complete
    }

    /// Attaches `found` (which exec'd at `exec`, when the event said so).
    fn attach(&mut self, found: Found, exec: Option<Instant>) {
        let options = LiveOptions {
            pid: found.pid,
            mode: self.options.mode,
            placement: self.options.placement,
            // Requests are counted where locktrace knows the server.
            request_probe: match found.server {
                Some(_) => RequestProbeSpec::Default,
                None => RequestProbeSpec::Off,
            },
            expire_after: self.options.expire_after,
            ready_file: None,
            // The CPU sampler's perf events per CPU per process cost more
            // than the counting: off in the always-on agent.
            cpu_hz: None,
            stacks: false,
            php: None,
            kernel_locks: self.options.kernel_locks,
        };
        let labels = process_labels(&found);
        let shown = labels
            .iter()
            .filter(|(_, value)| !value.is_empty())
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join(" ");
        let attaching = Instant::now();
        match LiveSession::attach(&options) {
            Ok(mut session) => {
                self.failed.remove(&found.pid);
                session.keep_reports = true;
                // Where the time between a start and its counting goes.
                let timing = match exec {
                    Some(exec) => format!(
                        "; judged {} ms after its exec, attached in {} ms",
                        attaching.duration_since(exec).as_millis(),
                        attaching.elapsed().as_millis()
                    ),
                    None => format!("; attached in {} ms", attaching.elapsed().as_millis()),
                };
                note(format_args!(
                    "locktrace: agent: watching pid {} ({shown}) in {} mode: {} probes live after {} ms{timing}",
                    found.pid, self.options.mode, session.probe_count, session.attach_ms
                ));
                let series = LabelledSeries::new(
                    labels.clone(),
                    self.options.max_locks,
                    self.options.expire_after,
                    session.has_request_probe(),
                );
                self.publish(found.pid, Some(series.registry()));
                // Attaching is setup, not the steady cost the budget bounds
                // (reading less often would not make it cheaper).
                self.window = (own_cpu_seconds().unwrap_or(0.0), Instant::now());
                self.watched.insert(
                    found.pid,
                    Watched {
                        session,
                        series,
                        found,
                        labels,
                        latest: None,
                        pushed: None,
                        pushed_at: SystemTime::now(),
                    },
                );
            }
            Err(error) => {
                let tries = self.failed.get(&found.pid).map_or(1, |r| r.tries + 1);
                let wait = FIRST_RETRY * 2u32.pow(tries - 1);
                let then = match tries < ATTACH_TRIES {
                    true => format!("trying again in {} s", wait.as_secs()),
                    false => "not tried again until it execs".into(),
                };
                note(format_args!(
                    "locktrace: agent: not watching pid {} ({shown}): {error:#}; {then}",
                    found.pid
                ));
                if tries < ATTACH_TRIES {
                    let next = Instant::now() + wait;
                    self.failed.insert(found.pid, Retry { found, tries, next });
                } else {
                    self.failed.remove(&found.pid);
                }
            }
        }
        self.gauges.watched.set(self.watched.len() as i64);
    }

    /// Attaches again the processes whose attach failed, when due, if
    /// they still run the same executable (a new one is judged afresh).
    fn retry_failed(&mut self) {
        let now = Instant::now();
        let due: Vec<u32> = self
            .failed
            .iter()
            .filter(|(_, retry)| retry.next <= now)
            .map(|(pid, _)| *pid)
            .collect();
        for pid in due {
            let Some(retry) = self.failed.get(&pid) else {
                continue;
            };
            let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
            if self.watched.contains_key(&pid)
                || !exe.is_ok_and(|exe| exe.to_string_lossy() == retry.found.exe)
            {
                self.failed.remove(&pid);
                continue;
            }
            self.attach(retry.found.clone(), None);
        }
    }

    fn publish(&self, pid: u32, registry: Option<Arc<Registry>>) {
        let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        match registry {
            Some(registry) => shared.processes.insert(pid, registry),
            None => {
                shared.reports.remove(&pid);
                shared.processes.remove(&pid)
            }
        };
    }

    /// Releases the processes that exited, after reading their last counts.
    fn release_exited(&mut self) {
        let gone: Vec<u32> = self
            .watched
            .iter()
            .filter(|(_, w)| !w.session.target.is_alive())
            .map(|(pid, _)| *pid)
            .collect();
        for pid in gone {
            let Some(mut watched) = self.watched.remove(&pid) else {
                continue;
            };
            // The maps outlive the process: its last counts are still there.
            if let Ok(interval) = watched.session.tick() {
                watched.series.apply(&interval);
                self.keep_report(pid, &mut watched);
                self.push(&mut watched);
            }
            note(format_args!(
                "locktrace: agent: pid {pid} ({}) exited: released; its series go in {} s",
                discover::exe_name(&watched.found.exe),
                self.options.forget_exited.as_secs()
            ));
            self.exited.push((pid, Instant::now()));
            // Detaching takes seconds under load: off the scanning thread,
            // so a restart is found and attached meanwhile.
            let session = watched.session;
            let _ = std::thread::Builder::new()
                .name("locktrace-release".into())
                .spawn(move || drop(session));
        }
        self.gauges.watched.set(self.watched.len() as i64);
    }

    fn forget_exited(&mut self) {
        let forget_exited = self.options.forget_exited;
        let (old, kept): (Vec<_>, Vec<_>) = self
            .exited
            .drain(..)
            .partition(|(_, at)| at.elapsed() >= forget_exited);
        self.exited = kept;
        for (pid, _) in old {
            // A new process with the same pid has its own registry by now.
            if !self.watched.contains_key(&pid) {
                self.publish(pid, None);
            }
        }
    }

    fn keep_report(&self, pid: u32, watched: &mut Watched) {
        if let Some(report) = watched.session.take_report() {
            let report = Arc::new(report);
            watched.latest = Some(report.clone());
            let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
            shared.reads += 1;
            let read = shared.reads;
            shared.reports.insert(pid, Kept { report, read });
        }
    }

    fn read(&self, pid: u32, watched: &mut Watched) {
        match watched.session.tick() {
            Ok(interval) => {
                watched.series.apply(&interval);
                self.keep_report(pid, watched);
            }
            Err(error) => note(format_args!(
                "locktrace: agent: reading pid {pid}'s counts failed: {error:#}"
            )),
        }
    }

    fn read_all(&mut self) {
        let mut watched = std::mem::take(&mut self.watched);
        for (pid, watched) in watched.iter_mut() {
            self.read(*pid, watched);
        }
        self.watched = watched;
        if let Some(cpu) = own_cpu_seconds() {
            self.gauges.cpu_seconds.set(cpu - self.started.0);
        }
        self.say_dwarf_parsed();
    }

    /// Says each module whose DWARF a read parsed to name locks: the
    /// agent's one-off cost (once per file for its life, tens to hundreds
    /// of ms), told apart from the steady cost of the reads.
    fn say_dwarf_parsed(&mut self) {
        let parsed = crate::naming::dwarf::parsed();
        for (file, took) in parsed.iter().skip(self.dwarf_said) {
            note(format_args!(
                "locktrace: agent: read the DWARF of {file} in {} ms to name its locks (once for the agent's life)",
                took.as_millis()
            ));
        }
        self.dwarf_said = self.dwarf_said.max(parsed.len());
    }

    /// Reads the processes a `?seconds=` window asked for.
    fn read_requested(&mut self) {
        let pids = std::mem::take(
            &mut self
                .shared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .read_now,
        );
        for pid in pids {
            if let Some(mut watched) = self.watched.remove(&pid) {
                self.read(pid, &mut watched);
                self.watched.insert(pid, watched);
                self.say_dwarf_parsed();
            }
        }
    }

    fn push_all(&mut self) {
        let mut watched = std::mem::take(&mut self.watched);
        for watched in watched.values_mut() {
            self.push(watched);
        }
        self.watched = watched;
    }

    /// Hands the process's profile since its last push to the pusher (a
    /// window with no lock activity is not sent).
    fn push(&self, watched: &mut Watched) {
        let (Some(pusher), Some(latest)) = (&self.pusher, watched.latest.clone()) else {
            return;
        };
        let window = match &watched.pushed {
            Some(before) => crate::analysis::window::since(before, &latest),
            None => (*latest).clone(),
        };
        let until = SystemTime::now();
        let from = std::mem::replace(&mut watched.pushed_at, until);
        watched.pushed = Some(latest);
        let quiet = window
            .kernel_locks
            .as_ref()
            .is_none_or(|section| section.locks.is_empty());
        if window.locks.is_empty() && quiet {
            return;
        }
        let mut body = Vec::new();
        if let Err(error) = crate::render::pprof::write(&window, &mut body) {
            note(format_args!("locktrace: agent: {error:#}"));
            return;
        }
        let app = discover::exe_name(&watched.found.exe);
        pusher.send(Upload {
            name: push::series_name(app, &watched.labels),
            from,
            until,
            body,
        });
    }

    /// Over `--max-cpu` in the last window: read the maps half as often
    /// (down to every [`SLOWEST_READ`]); well under it: back towards 1 s.
    fn budget(&mut self) {
        let (cpu_then, then) = self.window;
        if then.elapsed() < CPU_WINDOW {
            return;
        }
        let Some(cpu) = own_cpu_seconds() else { return };
        let percent = 100.0 * (cpu - cpu_then) / then.elapsed().as_secs_f64();
        self.window = (cpu, Instant::now());
        let before = self.read_every;
        if percent > self.options.max_cpu_percent && self.read_every < SLOWEST_READ {
            self.read_every *= 2;
        } else if percent < self.options.max_cpu_percent / 4.0 && self.read_every > READ_EVERY {
            self.read_every /= 2;
        }
        if self.read_every != before {
            note(format_args!(
                "locktrace: agent: {percent:.1}% of a core over {} s (--max-cpu {}): reading the maps every {} s instead of {} s; counts stay exact, series move less often",
                CPU_WINDOW.as_secs(),
                self.options.max_cpu_percent,
                self.read_every.as_secs(),
                before.as_secs()
            ));
        }
        self.gauges
            .read_interval_seconds
            .set(self.read_every.as_secs_f64());
    }
}
