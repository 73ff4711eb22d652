//! `locktrace serve`: a Prometheus endpoint on a live session. Every second
//! the session's interval is added to counters labelled `lock`, `kind` and
//! `module`; `/metrics` answers in the OpenMetrics text format.
//!
//! Bounded: at most `max_locks` lock series, chosen by recent activity (a
//! decaying average; a newcomer replaces the weakest series only when twice as
//! active, so series do not flap); the rest add to `lock="other"`. Series and
//! map entries of locks quiet for `expire_after` are dropped. When the target
//! exits, serve says so in one line and exits non-zero (a supervisor restarts
//! it on the new pid).
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, atomic::AtomicU64},
    time::{Duration, Instant},
};

use anyhow::Result;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::live::{self, Interval, LiveOptions, LiveSession, LockActivity};

pub(crate) const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub(crate) const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Weight of the newest interval in a series' activity average.
const ACTIVITY_WEIGHT: f64 = 0.3;

#[derive(Debug, Clone)]
pub(crate) struct ServeOptions {
    pub live: LiveOptions,
    pub listen: SocketAddr,
    /// Lock series exported at most (plus `lock="other"`).
    pub max_locks: usize,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LockLabels {
    lock: String,
    kind: String,
    module: String,
}

impl LockLabels {
    fn of(lock: &LockActivity) -> LockLabels {
        LockLabels {
            lock: label_value(&lock.label),
            kind: lock.kind.to_string(),
            module: label_value(lock.module.as_deref().unwrap_or("")),
        }
    }

    fn other() -> LockLabels {
        LockLabels {
            lock: "other".into(),
            kind: "other".into(),
            module: String::new(),
        }
    }
}

/// The encoder writes label values as given: keep them valid, and control
/// characters from the target's names out (`\x1b` reads `/x1b`).
fn label_value(text: &str) -> String {
    crate::render::format::printable(&text.replace('\n', " "))
        .replace('\\', "/")
        .replace('"', "'")
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WaitClassLabels {
    wait_class: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// `--php`: a route (bounded: `--max-routes` of them, plus the `other`,
/// `unreadable` and `outside requests` rows).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

/// A lock under a route: its [`ROUTE_LOCKS`] busiest locks, the rest as `other`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLockLabels {
    route: String,
    lock: String,
}

/// A kernel lock by name (unnamed ones add up in `lock="other"`) and how
/// it was taken (`KernelLockKind`, from the tracepoint's flags).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KernelLockLabels {
    lock: String,
    kind: String,
}

/// The kind as JSON spells it (`rwsem_write`).
fn kernel_kind_label(kind: crate::model::KernelLockKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|value| value.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Locks exported per route; the rest add up in `lock="other"`.
const ROUTE_LOCKS: usize = 10;

/// Raises a cumulative counter to `total` (it never goes down).
fn raise_counter(counter: &Counter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

/// The metrics, registered once; `/metrics` encodes the registry.
struct Metrics {
    acquisitions: Family<LockLabels, Counter>,
    contended: Family<LockLabels, Counter>,
    wait_seconds: Family<LockLabels, Counter<f64, AtomicU64>>,
    /// Futex waits that are not lock contention, by wait class.
    other_waits: Family<WaitClassLabels, Counter>,
    other_wait_seconds: Family<WaitClassLabels, Counter<f64, AtomicU64>>,
    /// Events the BPF side could not count, by the report's drop reason.
    lost: Family<ReasonLabels, Counter>,
    cpu_seconds: Family<LockLabels, Counter<f64, AtomicU64>>,
    /// Kernel lock contention the lock's futex calls met.
    kernel_contentions: Family<LockLabels, Counter>,
    kernel_wait_seconds: Family<LockLabels, Counter<f64, AtomicU64>>,
    /// The kernel locks section: contentions and wait per kernel lock.
    kernel_lock_contentions: Family<KernelLockLabels, Counter>,
    kernel_lock_wait_seconds: Family<KernelLockLabels, Counter<f64, AtomicU64>>,
    /// `--php`: requests per route, and acquisitions and contended waits
    /// per route and lock, since attach.
    route_requests: Family<RouteLabels, Counter>,
    route_acquisitions: Family<RouteLockLabels, Counter>,
    route_contended: Family<RouteLockLabels, Counter>,
    /// The target's sampled CPU per route (with the CPU sampler).
    route_cpu_seconds: Family<RouteLabels, Counter<f64, AtomicU64>>,
    requests: Option<Counter>,
    probe_hits: Gauge,
    estimated_added_seconds: Gauge<f64, AtomicU64>,
    tracer_cpu_seconds: Gauge<f64, AtomicU64>,
    tracer_peak_rss_bytes: Gauge,
    tracked_locks: Gauge,
    exported_series: Gauge,
    longest_lock_wait_seconds: Gauge<f64, AtomicU64>,
    deadlocked_threads: Gauge,
}

impl Metrics {
    fn register(registry: &mut Registry, with_requests: bool) -> Metrics {
        let metrics = Metrics {
            acquisitions: Family::default(),
            contended: Family::default(),
            wait_seconds: Family::default(),
            other_waits: Family::default(),
            other_wait_seconds: Family::default(),
            lost: Family::default(),
            cpu_seconds: Family::default(),
            kernel_contentions: Family::default(),
            kernel_wait_seconds: Family::default(),
            kernel_lock_contentions: Family::default(),
            kernel_lock_wait_seconds: Family::default(),
            route_requests: Family::default(),
            route_acquisitions: Family::default(),
            route_contended: Family::default(),
            route_cpu_seconds: Family::default(),
            requests: with_requests.then(Counter::default),
            probe_hits: Gauge::default(),
            estimated_added_seconds: Gauge::default(),
            tracer_cpu_seconds: Gauge::default(),
            tracer_peak_rss_bytes: Gauge::default(),
            tracked_locks: Gauge::default(),
            exported_series: Gauge::default(),
            longest_lock_wait_seconds: Gauge::default(),
            deadlocked_threads: Gauge::default(),
        };
        metrics.register_lock_families(registry);
        metrics.register_totals(registry);
        metrics
    }

    /// The per-lock and per-class series, in the order they are exported.
    fn register_lock_families(&self, registry: &mut Registry) {
        registry.register(
            "locktrace_lock_acquisitions",
            "Lock calls (pthread mutex/rwlock) on the lock",
            self.acquisitions.clone(),
        );
        registry.register(
            "locktrace_lock_contended",
            "Futex waits on the lock (contended acquisitions)",
            self.contended.clone(),
        );
        registry.register(
            "locktrace_lock_wait_seconds",
            "Time threads spent waiting for the lock in futex calls",
            self.wait_seconds.clone(),
        );
        registry.register(
            "locktrace_lock_cpu_seconds",
            "Sampled CPU time in lock code on the lock (lock functions, libc slow paths, the kernel's futex code)",
            self.cpu_seconds.clone(),
        );
        registry.register(
            "locktrace_lock_kernel_contentions",
            "Kernel lock contentions (lock:contention_begin/end, Linux 5.19+) met inside the lock's futex calls",
            self.kernel_contentions.clone(),
        );
        registry.register(
            "locktrace_lock_kernel_wait_seconds",
            "Time the lock's futex calls waited for kernel locks",
            self.kernel_wait_seconds.clone(),
        );
        registry.register(
            "locktrace_kernel_lock_contentions",
            "Kernel lock contentions of the target's threads, by kernel lock name (unnamed ones as lock=other) and kind (spinlock, rwsem_read, rwsem_write, mutex, ...)",
            self.kernel_lock_contentions.clone(),
        );
        registry.register(
            "locktrace_kernel_lock_wait_seconds",
            "Time the target's threads waited for kernel locks, by kernel lock name and kind",
            self.kernel_lock_wait_seconds.clone(),
        );
        registry.register(
            "locktrace_futex_waits",
            "Futex waits that are not lock contention, by wait_class (condvar: waiting for work; go_runtime; other), as record classifies them",
            self.other_waits.clone(),
        );
        registry.register(
            "locktrace_futex_wait_seconds",
            "Time spent in futex waits that are not lock contention, by wait_class",
            self.other_wait_seconds.clone(),
        );
        registry.register(
            "locktrace_route_requests",
            "--php: requests per route (method and path, ids collapsed by --route-pattern)",
            self.route_requests.clone(),
        );
        registry.register(
            "locktrace_route_lock_acquisitions",
            "--php: lock calls per route and lock (a route's 10 busiest locks, the rest as lock=other; none in --mode contention and --mode inproc, which count no route's calls)",
            self.route_acquisitions.clone(),
        );
        registry.register(
            "locktrace_route_lock_contended",
            "--php: futex waits per route and lock",
            self.route_contended.clone(),
        );
        registry.register(
            "locktrace_route_cpu_seconds",
            "--php: the target's CPU per route, sampled (from a request's start to the thread's next request)",
            self.route_cpu_seconds.clone(),
        );
        registry.register(
            "locktrace_lost",
            "Events the tracer could not count, by reason (the report's dropped): the lock figures miss them",
            self.lost.clone(),
        );
        // Every reason from the start, so an alert on a rise sees a series at 0.
        for reason in crate::model::DropReason::known() {
            drop(self.lost.get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            }));
        }
    }

    /// The requests counter and the tracer's own gauges, after the lock series.
    fn register_totals(&self, registry: &mut Registry) {
        if let Some(requests) = &self.requests {
            registry.register(
                "locktrace_requests",
                "Hits of the request probe (--request-probe)",
                requests.clone(),
            );
        }
        registry.register(
            "locktrace_probe_hits",
            "Tracer cost: lock probe hits since attach",
            self.probe_hits.clone(),
        );
        registry.register(
            "locktrace_estimated_added_seconds",
            "Tracer cost: estimated time the probes added to the target since attach (hits x calibrated cost per hit)",
            self.estimated_added_seconds.clone(),
        );
        registry.register(
            "locktrace_tracer_cpu_seconds",
            "Tracer cost: locktrace's own CPU time (user + system) since start",
            self.tracer_cpu_seconds.clone(),
        );
        registry.register(
            "locktrace_tracer_peak_rss_bytes",
            "Tracer cost: locktrace's peak resident memory",
            self.tracer_peak_rss_bytes.clone(),
        );
        registry.register(
            "locktrace_tracked_locks",
            "Locks held in the tracer's maps now (quiet ones age out)",
            self.tracked_locks.clone(),
        );
        registry.register(
            "locktrace_exported_lock_series",
            "Lock label sets exported now (at most --max-locks, plus other)",
            self.exported_series.clone(),
        );
        registry.register(
            "locktrace_longest_lock_wait_seconds",
            "The longest lock wait going on now (0 when none has lasted a second)",
            self.longest_lock_wait_seconds.clone(),
        );
        registry.register(
            "locktrace_deadlocked_threads",
            "Threads waiting in a cycle for each other's locks now (deadlocked)",
            self.deadlocked_threads.clone(),
        );
    }

    fn add(&self, labels: &LockLabels, lock: &LockActivity) {
        if let Some(n) = lock.acquisitions {
            self.acquisitions.get_or_create(labels).inc_by(n);
        }
        self.contended.get_or_create(labels).inc_by(lock.contended);
        self.wait_seconds
            .get_or_create(labels)
            .inc_by(lock.wait_ns as f64 / 1e9);
        self.cpu_seconds
            .get_or_create(labels)
            .inc_by(lock.cpu_ns as f64 / 1e9);
        self.kernel_contentions
            .get_or_create(labels)
            .inc_by(lock.kernel_contentions);
        self.kernel_wait_seconds
            .get_or_create(labels)
            .inc_by(lock.kernel_wait_ns as f64 / 1e9);
    }

    /// Everything of an interval but the lock series: requests, waits that
    /// are not contention, losses, long waits and deadlocks, the tracer's cost.
    fn update(&self, interval: &Interval) {
        if let (Some(counter), Some(n)) = (&self.requests, interval.requests) {
            counter.inc_by(n);
        }
        for wait in &interval.other_waits {
            self.add_other_wait(wait);
        }
        self.set_lost(&interval.dropped);
        if let Some(routes) = &interval.routes {
            self.set_routes(routes);
        }
        self.add_kernel_locks(&interval.kernel_activity);
        let cost = &interval.cost;
        self.probe_hits.set(cost.probe_hits as i64);
        self.estimated_added_seconds
            .set(cost.estimated_added_ns as f64 / 1e9);
        self.tracer_cpu_seconds.set(cost.tracer_cpu_s);
        self.tracer_peak_rss_bytes
            .set(cost.tracer_peak_rss_kib as i64 * 1024);
        self.tracked_locks.set(interval.tracked_locks as i64);
        let longest = interval
            .long_waits
            .first()
            .map_or(0, |wait| wait.elapsed_ns);
        self.longest_lock_wait_seconds.set(longest as f64 / 1e9);
        let deadlocked: usize = interval.deadlocks.iter().map(|d| d.cycle.len()).sum();
        self.deadlocked_threads.set(deadlocked as i64);
    }

    /// Adds waits that are not lock contention to their class's counters.
    fn add_other_wait(&self, wait: &LockActivity) {
        let labels = WaitClassLabels {
            wait_class: wait.wait_class.to_string(),
        };
        self.other_waits
            .get_or_create(&labels)
            .inc_by(wait.contended);
        self.other_wait_seconds
            .get_or_create(&labels)
            .inc_by(wait.wait_ns as f64 / 1e9);
    }

    /// Raises each route's counters to their totals since attach.
    fn set_routes(&self, routes: &crate::model::Routes) {
        // No series where routes' calls are not counted (contention and
        // inproc modes): a 0 would read as "this route takes no lock".
        let calls_counted = routes.acquisitions_not_counted.is_none();
        for route in &routes.routes {
            let name = label_value(&route.name);
            let labels = RouteLabels {
                route: name.clone(),
            };
            raise_counter(&self.route_requests.get_or_create(&labels), route.requests);
            if let Some(period) = routes.cpu_sample_period_ns {
                let cpu = self.route_cpu_seconds.get_or_create(&labels);
                let total = (route.cpu_samples * period) as f64 / 1e9;
                cpu.inc_by((total - cpu.get()).max(0.0));
            }
            let mut other = (0u64, 0u64);
            for (index, lock) in route.locks.iter().enumerate() {
                if index >= ROUTE_LOCKS {
                    other.0 += lock.acquisitions;
                    other.1 += lock.contended;
                    continue;
                }
                let lock_name = lock
                    .name
                    .clone()
                    .unwrap_or_else(|| format!("{:#x}", lock.address));
                let labels = RouteLockLabels {
                    route: name.clone(),
                    lock: label_value(&lock_name),
                };
                if calls_counted {
                    raise_counter(
                        &self.route_acquisitions.get_or_create(&labels),
                        lock.acquisitions,
                    );
                }
                raise_counter(&self.route_contended.get_or_create(&labels), lock.contended);
            }
            if route.locks.len() > ROUTE_LOCKS {
                let labels = RouteLockLabels {
                    route: name,
                    lock: "other".into(),
                };
                if calls_counted {
                    raise_counter(&self.route_acquisitions.get_or_create(&labels), other.0);
                }
                raise_counter(&self.route_contended.get_or_create(&labels), other.1);
            }
        }
    }

    /// Adds each kernel lock row's interval to its counters: rows of one
    /// name and kind (a runqueue lock per CPU) add up. Per interval, not
    /// raised to the section's totals: a quiet row's keys expire and leave
    /// the section, which would hold the counter back when it came back.
    fn add_kernel_locks(&self, activity: &[crate::live::KernelLockActivity]) {
        for lock in activity {
            let labels = KernelLockLabels {
                lock: label_value(lock.name.as_deref().unwrap_or("other")),
                kind: kernel_kind_label(lock.kind),
            };
            self.kernel_lock_contentions
                .get_or_create(&labels)
                .inc_by(lock.contentions);
            self.kernel_lock_wait_seconds
                .get_or_create(&labels)
                .inc_by(lock.wait_ns as f64 / 1e9);
        }
    }

    /// Raises each reason's counter to the total lost since attach.
    fn set_lost(&self, dropped: &std::collections::BTreeMap<crate::model::DropReason, u64>) {
        for (reason, &total) in dropped {
            let counter = self.lost.get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            });
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    fn remove(&self, labels: &LockLabels) {
        self.acquisitions.remove(labels);
        self.contended.remove(labels);
        self.wait_seconds.remove(labels);
        self.cpu_seconds.remove(labels);
        self.kernel_contentions.remove(labels);
        self.kernel_wait_seconds.remove(labels);
    }
}

/// Which lock label sets have a series of their own.
struct SeriesSet {
    max: usize,
    expire_after: Duration,
    /// Activity average and last activity of every label set seen recently.
    activity: HashMap<LockLabels, (f64, Instant)>,
    exported: std::collections::HashSet<LockLabels>,
}

impl SeriesSet {
    /// Adds an interval to the metrics: each lock to its series or to `other`.
    fn apply(&mut self, metrics: &Metrics, interval: &Interval, now: Instant) {
        let mut this_interval: HashMap<LockLabels, f64> = HashMap::new();
        for lock in &interval.locks {
            *this_interval.entry(LockLabels::of(lock)).or_default() +=
                (lock.acquisitions.unwrap_or(0) + lock.contended) as f64;
        }
        for (labels, (average, _)) in self.activity.iter_mut() {
            let n = this_interval.get(labels).copied().unwrap_or(0.0);
            *average = (1.0 - ACTIVITY_WEIGHT) * *average + ACTIVITY_WEIGHT * n;
        }
        for (labels, n) in &this_interval {
            let entry = self
                .activity
                .entry(labels.clone())
                .or_insert((ACTIVITY_WEIGHT * n, now));
            entry.1 = now;
        }
        // Quiet series age out.
        let expire_after = self.expire_after;
        let quiet: Vec<LockLabels> = self
            .activity
            .iter()
            .filter(|(_, (_, last))| now.duration_since(*last) >= expire_after)
            .map(|(labels, _)| labels.clone())
            .collect();
        for labels in quiet {
            self.activity.remove(&labels);
            if self.exported.remove(&labels) {
                metrics.remove(&labels);
            }
        }
        // Newcomers, most active first, take free slots or replace a weaker series.
        let mut newcomers: Vec<(&LockLabels, f64)> = this_interval
            .keys()
            .filter(|labels| !self.exported.contains(*labels))
            .map(|labels| (labels, self.activity[labels].0))
            .collect();
        newcomers.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (labels, score) in newcomers {
            if self.exported.len() >= self.max {
                let weakest = self
                    .exported
                    .iter()
                    .map(|l| (l, self.activity.get(l).map_or(0.0, |a| a.0)))
                    .min_by(|a, b| a.1.total_cmp(&b.1))
                    .map(|(l, s)| (l.clone(), s));
                match weakest {
                    Some((weakest, weakest_score)) if score > 2.0 * weakest_score => {
                        self.exported.remove(&weakest);
                        metrics.remove(&weakest);
                    }
                    _ => continue,
                }
            }
            self.exported.insert(labels.clone());
        }
        let other = LockLabels::other();
        for lock in &interval.locks {
            let labels = LockLabels::of(lock);
            if self.exported.contains(&labels) {
                metrics.add(&labels, lock);
            } else {
                metrics.add(&other, lock);
            }
        }
        metrics
            .exported_series
            .set(self.exported.len() as i64 + metrics.contended.get(&other).is_some() as i64);
    }
}

/// One process's series under constant labels (the agent's `container_id`,
/// `pid`, …): serve's metrics, names and bounds, in a registry of its own so
/// that a process's series go away with it.
pub(crate) struct LabelledSeries {
    registry: Arc<Registry>,
    metrics: Metrics,
    series: SeriesSet,
}

impl LabelledSeries {
    pub(crate) fn new(
        labels: Vec<(String, String)>,
        max_locks: usize,
        expire_after: Duration,
        with_requests: bool,
    ) -> LabelledSeries {
        let mut registry = Registry::default();
        let labelled = registry.sub_registry_with_labels(
            labels
                .into_iter()
                .map(|(name, value)| (name.into(), label_value(&value).into())),
        );
        let metrics = Metrics::register(labelled, with_requests);
        LabelledSeries {
            registry: Arc::new(registry),
            metrics,
            series: SeriesSet {
                max: max_locks,
                expire_after,
                activity: HashMap::new(),
                exported: Default::default(),
            },
        }
    }

    /// Adds an interval, as serve does each second.
    pub(crate) fn apply(&mut self, interval: &Interval) {
        self.series.apply(&self.metrics, interval, Instant::now());
        self.metrics.update(interval);
    }

    /// The registry to encode (its counters move as intervals are applied).
    pub(crate) fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }
}

/// OpenMetrics texts of several registries as one: each family's `HELP`,
/// `TYPE` and `UNIT` once, then the samples of every text, one `# EOF`.
pub(crate) fn merge_families(texts: &[String]) -> String {
    let mut families: Vec<(String, Vec<&str>, Vec<&str>)> = Vec::new();
    for text in texts {
        let mut current: Option<usize> = None;
        let mut fresh = false;
        for line in text.lines() {
            if line == "# EOF" {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap_or(rest);
                let found = families.iter().position(|(n, ..)| n == name);
                fresh = found.is_none();
                let index = found.unwrap_or_else(|| {
                    families.push((name.to_string(), Vec::new(), Vec::new()));
                    families.len() - 1
                });
                current = Some(index);
                if fresh {
                    families[index].1.push(line);
                }
                continue;
            }
            let Some(index) = current else { continue };
            if line.starts_with("# ") {
                if fresh {
                    families[index].1.push(line);
                }
            } else {
                families[index].2.push(line);
            }
        }
    }
    let mut out = String::new();
    for (_, header, samples) in &families {
        for line in header.iter().chain(samples) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("# EOF\n");
    out
}

/// What to do when the listening address is refused.
fn listen_hint(kind: std::io::ErrorKind) -> &'static str {
    use std::io::ErrorKind;
    match kind {
        ErrorKind::AddrInUse => "in use: try another port",
        ErrorKind::AddrNotAvailable => {
            "not an address of this machine: give one of its addresses, 127.0.0.1 or 0.0.0.0"
        }
        ErrorKind::PermissionDenied => "refused: try a port above 1023",
        _ => "try another address or port",
    }
}

/// Listens on `address`, or one line saying what to try instead.
pub(crate) async fn listen(address: std::net::SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|error| {
            anyhow::anyhow!(
                "cannot listen on {address} ({}): {error}",
                listen_hint(error.kind())
            )
        })
}

pub(crate) async fn serve(options: &ServeOptions) -> Result<std::process::ExitCode> {
    let stop = live::stop_requested();
    tokio::pin!(stop);
    let listener = listen(options.listen).await?;
    let mut session = LiveSession::attach(&options.live)?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry, session.has_request_probe());
    let registry = Arc::new(registry);
    let encoded = registry.clone();
    let source = Site {
        metrics: Arc::new(move || encode(&encoded)),
        pages: None,
    };
    crate::render::output::note(format_args!(
        "locktrace: serving metrics of pid {} ({}) on http://{}/metrics: {} probes live after {} ms; Ctrl-C to stop{}",
        session.target.pid,
        session.target.exe,
        listener.local_addr()?,
        session.probe_count,
        session.attach_ms,
        session.request_probe_note()
    ));
    let mut series = SeriesSet {
        max: options.max_locks,
        expire_after: options.live.expire_after,
        activity: HashMap::new(),
        exported: Default::default(),
    };
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            result = &mut stop => {
                result?;
                return Ok(std::process::ExitCode::SUCCESS);
            }
            accepted = listener.accept() => match accepted {
                // At most MAX_CONNECTIONS at once: more (idle clients piling
                // up) are closed at once, and the fds stay ours.
                Ok((stream, _)) => {
                    if let Ok(slot) = connections.clone().try_acquire_owned() {
                        tokio::spawn(answer(stream, source.clone(), slot));
                    }
                }
                // A failed accept (peer gone, fd limit) only loses that
                // scrape; it is not the target's exit. Pause so a lasting
                // EMFILE does not spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            _ = tick.tick() => {
                if !session.target.is_alive() {
                    crate::render::output::note(format_args!("{}", live::target_exited(session.target.pid)));
                    return Ok(std::process::ExitCode::FAILURE);
                }
                let interval = session.tick()?;
                series.apply(&metrics, &interval, Instant::now());
                metrics.update(&interval);
            }
        }
    }
}

/// Scrape connections served at once.
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// A client must start sending within this, and send a request's headers
/// within this.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest a connection stays open, idle or slow (a scrape takes
/// milliseconds; Prometheus reconnects).
pub(crate) const CONNECTION_LIFETIME: Duration = Duration::from_secs(10);

/// What `/metrics` answers: the OpenMetrics text now, None when encoding failed.
pub(crate) type MetricsSource = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Other pages (the agent's pprof): (path, query) to the page's answer,
/// which may take a while (a profile over the next seconds); None: 404.
pub(crate) type PageSource = Arc<dyn Fn(&str, &str) -> Option<PageFuture> + Send + Sync>;

/// A page's answer: (content type, body), or why not.
pub(crate) type PageFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Page, PageError>> + Send>>;

pub(crate) type Page = (&'static str, Vec<u8>);

/// Why a page has no answer.
#[derive(Debug)]
pub(crate) enum PageError {
    /// 404 (no such process).
    NotFound,
    /// 400, with the one line that says what to send instead.
    BadRequest(String),
    /// 500: the page could not be made.
    Failed(String),
}

/// How long a page may take to answer (`?seconds=` at most this).
pub(crate) const LONGEST_PAGE: Duration = Duration::from_secs(60);

/// What a connection is answered from.
#[derive(Clone)]
pub(crate) struct Site {
    pub metrics: MetricsSource,
    pub pages: Option<PageSource>,
}

/// A registry's OpenMetrics text.
fn encode(registry: &Registry) -> Option<String> {
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, registry).ok()?;
    Some(body)
}

/// Serves one connection: `/metrics`, else 404; holds its slot until closed.
pub(crate) async fn answer(
    stream: tokio::net::TcpStream,
    source: Site,
    _slot: tokio::sync::OwnedSemaphorePermit,
) {
    // A page that waits (`?seconds=`) keeps its connection open that much longer.
    let lifetime = match source.pages {
        Some(_) => CONNECTION_LIFETIME + LONGEST_PAGE,
        None => CONNECTION_LIFETIME,
    };
    let service = service_fn(move |request: Request<Incoming>| {
        let source = source.clone();
        async move { Ok::<_, std::convert::Infallible>(respond(&request, &source).await) }
    });
    // An idle client (connected, sending nothing) is closed soon.
    if tokio::time::timeout(HEADER_TIMEOUT, stream.readable())
        .await
        .is_err()
    {
        return;
    }
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(lifetime, connection).await;
}

async fn respond(request: &Request<Incoming>, source: &Site) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: Vec<u8>| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(value) = content_type.parse() {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, value);
        }
        response
    };
    let uri = request.uri();
    if uri.path() != "/metrics" {
        let page = source
            .pages
            .as_ref()
            .and_then(|pages| pages(uri.path(), uri.query().unwrap_or("")));
        let answer = match page {
            Some(future) => future.await,
            None => Err(PageError::NotFound),
        };
        return match answer {
            Ok((content_type, body)) => reply(StatusCode::OK, content_type, body),
            Err(PageError::BadRequest(line)) => reply(
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!("{line}\n").into(),
            ),
            Err(PageError::Failed(line)) => reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("{line}\n").into(),
            ),
            Err(PageError::NotFound) if source.pages.is_some() => reply(
                StatusCode::NOT_FOUND,
                "text/plain",
                b"locktrace serves /metrics and /debug/pprof/mutex?pid=PID[&seconds=S]\n".to_vec(),
            ),
            Err(PageError::NotFound) => reply(
                StatusCode::NOT_FOUND,
                "text/plain",
                b"locktrace serves /metrics\n".to_vec(),
            ),
        };
    }
    // Prometheus asks for OpenMetrics; other readers (curl, promtool) get the classic text format.
    let openmetrics = request
        .headers()
        .get_all(hyper::header::ACCEPT)
        .iter()
        .any(|value| {
            value
                .to_str()
                .is_ok_and(|v| v.contains("application/openmetrics-text"))
        });
    match (source.metrics)() {
        Some(body) if openmetrics => reply(StatusCode::OK, OPENMETRICS_CONTENT_TYPE, body.into()),
        Some(body) => reply(
            StatusCode::OK,
            CLASSIC_CONTENT_TYPE,
            classic_text(&body).into(),
        ),
        None => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            b"encoding the metrics failed\n".to_vec(),
        ),
    }
}

/// The classic Prometheus text format (0.0.4) of OpenMetrics text: a
/// counter family is named with its `_total` suffix, and there is no `# EOF`.
fn classic_text(openmetrics: &str) -> String {
    let lines: Vec<&str> = openmetrics.lines().collect();
    let counters: std::collections::HashSet<&str> = lines
        .iter()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in lines {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(label: &str, acquisitions: u64) -> LockActivity {
        LockActivity {
            address: 0,
            label: label.into(),
            kind: crate::model::LockKind::Mutex,
            wait_class: crate::model::WaitClass::Lock,
            module: Some("/bin/x".into()),
            top_caller: None,
            acquisitions: Some(acquisitions),
            contended: 0,
            wait_ns: 0,
            cpu_ns: 0,
            top_stack: None,
            kernel_contentions: 0,
            kernel_wait_ns: 0,
        }
    }

    fn interval(locks: Vec<LockActivity>) -> Interval {
        Interval {
            locks,
            ..Interval::empty(Duration::from_secs(1))
        }
    }

    /// A route's ten busiest locks get series of their own, the rest add
    /// up in `lock="other"`; counters follow the totals and never go down.
    #[test]
    fn route_series_are_bounded_and_follow_the_totals() {
        use crate::model::{Route, RouteKind, RouteLock, Routes};
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry, true);
        let lock = |n: u64| RouteLock {
            address: 0x1000 + n,
            name: Some(format!("lock{n}")),
            acquisitions: 100 - n,
            contended: 1,
            wait_ns: 0,
            acquisitions_per_request: None,
            contended_per_request: None,
            wait_us_per_request: None,
            cpu_samples: 0,
            cpu_us_per_request: None,
        };
        let routes = |requests: u64| Routes {
            routes: vec![Route {
                name: "GET /q.php".into(),
                kind: RouteKind::Route,
                requests,
                acquisitions_per_request: None,
                cpu_samples: requests * 2,
                cpu_us_per_request: None,
                locks: (0..12).map(lock).collect(),
            }],
            distinct: 1,
            max_routes: 20,
            patterns: Vec::new(),
            cpu_sample_period_ns: Some(1_000_000),
            acquisitions_not_counted: None,
        };
        metrics.set_routes(&routes(7));
        metrics.set_routes(&routes(9));
        let requests = metrics
            .route_requests
            .get_or_create(&RouteLabels {
                route: "GET /q.php".into(),
            })
            .get();
        assert_eq!(requests, 9);
        let cpu = metrics
            .route_cpu_seconds
            .get_or_create(&RouteLabels {
                route: "GET /q.php".into(),
            })
            .get();
        assert!((cpu - 0.018).abs() < 1e-9, "{cpu}");
        let of = |lock: &str| {
            metrics
                .route_acquisitions
                .get_or_create(&RouteLockLabels {
                    route: "GET /q.php".into(),
                    lock: lock.into(),
                })
                .get()
        };
        assert_eq!(of("lock0"), 100);
        assert_eq!(of("lock9"), 91);
        // lock10 (90) and lock11 (89) together.
        assert_eq!(of("other"), 179);
        // Where routes' calls are not counted, no route gets a calls series
        // (a 0 would say the route takes no lock); its waits still do.
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry, true);
        let mut uncounted = routes(3);
        uncounted.acquisitions_not_counted = Some(crate::model::RouteCallsUncounted::InprocStubs);
        metrics.set_routes(&uncounted);
        let text = encode(&registry).unwrap();
        assert!(
            !text.contains("locktrace_route_lock_acquisitions_total{"),
            "{text}"
        );
        assert!(
            text.contains("locktrace_route_lock_contended_total{"),
            "{text}"
        );
    }

    fn acquisitions(metrics: &Metrics, lock: &str) -> Option<u64> {
        let labels = if lock == "other" {
            LockLabels::other()
        } else {
            LockLabels::of(&self::lock(lock, 0))
        };
        metrics.acquisitions.get(&labels).map(|c| c.get())
    }

    /// At most `max` series, expiring after 10 s.
    fn series_set(max: usize) -> SeriesSet {
        SeriesSet {
            max,
            expire_after: Duration::from_secs(10),
            activity: HashMap::new(),
            exported: Default::default(),
        }
    }

    #[test]
    fn series_are_bounded_and_the_rest_goes_to_other_then_quiet_ones_age_out() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry, false);
        let mut series = series_set(2);
        let start = Instant::now();
        series.apply(
            &metrics,
            &interval(vec![lock("a", 100), lock("b", 50), lock("c", 10)]),
            start,
        );
        assert_eq!(acquisitions(&metrics, "a"), Some(100));
        assert_eq!(acquisitions(&metrics, "b"), Some(50));
        assert_eq!(acquisitions(&metrics, "c"), None);
        assert_eq!(acquisitions(&metrics, "other"), Some(10));
        // b goes quiet; c becomes far more active and takes b's place.
        for second in 1..=3 {
            series.apply(
                &metrics,
                &interval(vec![lock("a", 100), lock("c", 1000)]),
                start + Duration::from_secs(second),
            );
        }
        assert_eq!(acquisitions(&metrics, "b"), None);
        assert!(acquisitions(&metrics, "c").is_some());
        // All quiet past the expiry: nothing but other is left.
        series.apply(&metrics, &interval(vec![]), start + Duration::from_secs(20));
        assert!(series.exported.is_empty() && series.activity.is_empty());
        assert_eq!(acquisitions(&metrics, "a"), None);
        assert!(acquisitions(&metrics, "other").unwrap() >= 10);
    }

    fn kernel_lock(
        name: Option<&str>,
        flags: u32,
        contentions: u64,
    ) -> crate::live::KernelLockActivity {
        crate::live::KernelLockActivity {
            address: 0xffff_0000 + u64::from(flags) + contentions,
            name: name.map(str::to_string),
            kind: crate::model::KernelLockKind::of_flags(flags),
            flags,
            contentions,
            wait_ns: contentions * 1_000_000,
            kernel_site: None,
        }
    }

    /// Kernel locks: one series per name and kind (a runqueue lock per CPU
    /// adds up, unnamed ones go to `other`), each interval's rows added;
    /// a user lock's kernel contention adds per interval.
    #[test]
    fn kernel_lock_series_follow_the_section_and_the_rows() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry, false);
        let mut tick = interval(vec![LockActivity {
            kernel_contentions: 7,
            kernel_wait_ns: 3_500_000_000,
            ..lock("g_lock", 5)
        }]);
        let first = vec![
            kernel_lock(Some("mmap_lock"), 4, 100),
            kernel_lock(Some("mmap_lock"), 2, 30),
            kernel_lock(Some("runqueue"), 1, 5),
            kernel_lock(Some("runqueue"), 1, 6),
            kernel_lock(None, 1, 2),
        ];
        for activity in [first, vec![kernel_lock(Some("mmap_lock"), 4, 150)]] {
            tick.kernel_activity = activity;
            series_set(10).apply(&metrics, &tick, Instant::now());
            metrics.update(&tick);
        }
        let of = |lock: &str, kind: &str| {
            let labels = KernelLockLabels {
                lock: lock.into(),
                kind: kind.into(),
            };
            (
                metrics.kernel_lock_contentions.get_or_create(&labels).get(),
                metrics
                    .kernel_lock_wait_seconds
                    .get_or_create(&labels)
                    .get(),
            )
        };
        assert_eq!(of("mmap_lock", "rwsem_write"), (250, 0.25));
        assert_eq!(of("mmap_lock", "rwsem_read"), (30, 0.03));
        assert_eq!(of("runqueue", "spinlock").0, 11);
        assert_eq!(of("other", "spinlock").0, 2);
        let labels = LockLabels::of(&lock("g_lock", 0));
        assert_eq!(metrics.kernel_contentions.get_or_create(&labels).get(), 14);
        assert_eq!(
            metrics.kernel_wait_seconds.get_or_create(&labels).get(),
            7.0
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                "locktrace_kernel_lock_contentions_total{lock=\"mmap_lock\",kind=\"rwsem_write\"} 250"
            ),
            "{text}"
        );
    }

    #[test]
    fn lost_counters_follow_the_totals_since_attach_without_adding_twice() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry, false);
        let lost = |reason: &str| {
            metrics
                .lost
                .get(&ReasonLabels {
                    reason: reason.into(),
                })
                .map(|c| c.get())
        };
        assert_eq!(lost("locks_map_full"), Some(0));
        let full = crate::model::DropReason::LocksMapFull;
        let mut dropped = std::collections::BTreeMap::from([(full.clone(), 10)]);
        metrics.set_lost(&dropped);
        metrics.set_lost(&dropped);
        assert_eq!(lost("locks_map_full"), Some(10));
        dropped.insert(full, 15);
        metrics.set_lost(&dropped);
        assert_eq!(lost("locks_map_full"), Some(15));
    }

    #[test]
    fn waits_that_are_not_contention_stay_out_of_the_lock_series() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry, false);
        let mut series = series_set(10);
        let mut condvar = lock("g_pool.work", 0);
        condvar.acquisitions = None;
        condvar.kind = crate::model::LockKind::Condvar;
        condvar.wait_class = crate::model::WaitClass::Condvar;
        condvar.contended = 7;
        let mut tick = interval(vec![lock("g_lock", 5)]);
        tick.other_waits = vec![condvar.clone()];
        series.apply(&metrics, &tick, Instant::now());
        metrics.update(&tick);
        assert!(metrics.contended.get(&LockLabels::of(&condvar)).is_none());
        let class = WaitClassLabels {
            wait_class: "condvar".into(),
        };
        assert_eq!(metrics.other_waits.get(&class).map(|c| c.get()), Some(7));
    }

    #[test]
    fn classic_text_names_counter_families_with_total() {
        let openmetrics = "# HELP a_b Help.\n# TYPE a_b counter\na_b_total{x=\"1\"} 2\n# HELP g Gauge.\n# TYPE g gauge\ng 1\n# EOF\n";
        assert_eq!(
            classic_text(openmetrics),
            "# HELP a_b_total Help.\n# TYPE a_b_total counter\na_b_total{x=\"1\"} 2\n# HELP g Gauge.\n# TYPE g gauge\ng 1\n"
        );
    }

    #[test]
    fn every_metric_the_shipped_rules_use_is_exported() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry, true);
        let mut tick = interval(vec![lock("g_lock", 5)]);
        tick.requests = Some(1);
        series_set(10).apply(&metrics, &tick, Instant::now());
        metrics.update(&tick);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let exported = classic_text(&text);
        let rules = include_str!("../../docs/prometheus/locktrace-rules.yml");
        let used: std::collections::BTreeSet<&str> = rules
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("locktrace_"))
            .collect();
        assert!(used.len() >= 6, "{used:?}");
        for name in used {
            assert!(
                exported.contains(&format!("\n{name}")),
                "{name} is not exported:\n{exported}"
            );
        }
    }

    /// Two processes' registries under their own labels: each family once,
    /// with both processes' samples, and the classic text still parses.
    #[test]
    fn labelled_series_of_several_processes_merge_into_one_exposition() {
        let texts: Vec<String> = [("1", 5), ("2", 7)]
            .into_iter()
            .map(|(pid, n)| {
                let labels = vec![("pid".to_string(), pid.to_string())];
                let mut series = LabelledSeries::new(labels, 10, Duration::from_secs(10), false);
                series.apply(&interval(vec![lock("g_lock", n)]));
                encode(&series.registry()).unwrap()
            })
            .collect();
        let merged = merge_families(&texts);
        let family = "# TYPE locktrace_lock_acquisitions counter";
        assert_eq!(merged.matches(family).count(), 1, "{merged}");
        assert_eq!(merged.matches("# EOF").count(), 1);
        for (pid, n) in [("1", 5), ("2", 7)] {
            let sample = format!(
                "locktrace_lock_acquisitions_total{{pid=\"{pid}\",lock=\"g_lock\",kind=\"mutex\",module=\"/bin/x\"}} {n}"
            );
            assert!(merged.contains(&sample), "{sample} missing:\n{merged}");
        }
        // The samples of a family follow its header, not another's.
        let header = merged.find(family).unwrap();
        let next_header = merged[header + family.len()..].find("# HELP").unwrap() + header;
        let first = merged.find("locktrace_lock_acquisitions_total{").unwrap();
        let last = merged.rfind("locktrace_lock_acquisitions_total{").unwrap();
        assert!(
            header < first && last < next_header + family.len(),
            "{merged}"
        );
    }

    #[test]
    fn label_values_stay_valid() {
        assert_eq!(label_value("a\"b\\c\nd"), "a'b/c d");
        assert_eq!(label_value("x\x1b]0;t\x07"), "x/x1b]0;t/x07");
    }
}
