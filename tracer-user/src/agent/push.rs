//! `--push URL`: each interval, every watched process's mutex profile of
//! that interval, POSTed as gzipped pprof to `URL/ingest` the way
//! Pyroscope's ingest API takes it: `format=pprof`, the application and
//! its labels in `name` (`frankenphp{container_id=…,pid=…}`), the
//! interval in `from`/`until` (UNIX seconds). Pyroscope files the
//! profile as `mutex` by its `contentions` sample type.
//!
//! A thread of its own posts them, so a slow receiver never holds up the
//! scans. A refused or failing post is retried a few times with a growing
//! pause, then counted and dropped (the next interval's profile is sent
//! anyway): never fatal. Failures are said in one line when they start and
//! when posting works again, not once per profile. At the agent's stop the
//! queue is drained for a bounded time ([`Pusher::finish`]).
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc::{Receiver, SyncSender, TrySendError},
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use prometheus_client::{metrics::counter::Counter, registry::Registry};

use crate::render::output::note;

/// Tries per profile (the first post and the retries).
const ATTEMPTS: u32 = 3;
/// The pause before the first retry; doubled before each next one.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// A post gets this long to be answered.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// Profiles waiting to be posted at most; more are dropped (and counted).
const QUEUE: usize = 256;

/// One process's profile of one interval.
pub(crate) struct Upload {
    /// `name=` as Pyroscope reads it: `app{label=value,…}`.
    pub name: String,
    pub from: SystemTime,
    pub until: SystemTime,
    /// Gzipped pprof.
    pub body: Vec<u8>,
}

/// The agent's push counters, on its /metrics.
#[derive(Clone, Default)]
pub(crate) struct PushCounters {
    pub posted: Counter<u64, AtomicU64>,
    pub failed: Counter<u64, AtomicU64>,
}

impl PushCounters {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "locktrace_agent_push_posts",
            "Profiles posted to --push's ingest URL",
            self.posted.clone(),
        );
        registry.register(
            "locktrace_agent_push_failures",
            "Profiles not posted to --push's ingest URL (after the retries, or the queue full)",
            self.failed.clone(),
        );
    }
}

/// `URL/ingest` from `--push URL` (a trailing `/` or `/ingest` is taken as given).
pub(crate) fn ingest_url(url: &str) -> String {
    let base = url.trim_end_matches('/');
    let base = base.strip_suffix("/ingest").unwrap_or(base);
    format!("{base}/ingest")
}

/// `app{name=value,…}` with the labels that have a value; characters
/// Pyroscope's name parser treats as syntax become `_`.
pub(crate) fn series_name(app: &str, labels: &[(String, String)]) -> String {
    let clean = |text: &str| -> String {
        text.chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' | ':' | '/' => c,
                _ => '_',
            })
            .collect()
    };
    let set: Vec<String> = labels
        .iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, value)| format!("{name}={}", clean(value)))
        .collect();
    format!("{}{{{}}}", clean(app), set.join(","))
}

/// The query string of an upload.
pub(crate) fn query(upload: &Upload) -> String {
    let seconds = |at: SystemTime| at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!(
        "name={}&from={}&until={}&format=pprof&spyName=locktrace",
        percent_encode(&upload.name),
        seconds(upload.from),
        // At least a second after `from`: an empty range is no interval.
        seconds(upload.until).max(seconds(upload.from) + 1)
    )
}

/// `text` as a URL query value: RFC 3986's unreserved bytes as they are,
/// every other byte `%XX`.
pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Hands the uploads to the posting thread.
pub(crate) struct Pusher {
    queue: SyncSender<Upload>,
    counters: PushCounters,
    /// Uploads queued or being posted.
    waiting: Arc<AtomicUsize>,
    poster: JoinHandle<()>,
    url: String,
}

impl Pusher {
    /// Starts the posting thread for `url` (`--push`).
    pub(crate) fn start(url: &str, counters: PushCounters) -> std::io::Result<Pusher> {
        let (queue, uploads) = std::sync::mpsc::sync_channel(QUEUE);
        let waiting = Arc::new(AtomicUsize::new(0));
        let poster = Poster {
            url: ingest_url(url),
            counters: counters.clone(),
            failures: 0,
            waiting: waiting.clone(),
        };
        let poster = std::thread::Builder::new()
            .name("locktrace-push".into())
            .spawn(move || poster.run(uploads))?;
        Ok(Pusher {
            queue,
            counters,
            waiting,
            poster,
            url: ingest_url(url),
        })
    }

    /// Queues an upload; a full queue (the receiver far behind) drops it, counted.
    pub(crate) fn send(&self, upload: Upload) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.queue.try_send(upload)
        {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            self.counters.failed.inc();
        }
    }

    /// Posts what is queued, waiting at most `within`; says in one line
    /// how many were left unposted (a slow or silent receiver).
    pub(crate) fn finish(self, within: Duration) {
        let Pusher {
            queue,
            waiting,
            poster,
            url,
            ..
        } = self;
        // The posting thread ends once the queue is empty.
        drop(queue);
        let deadline = Instant::now() + within;
        while !poster.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let left = waiting.load(Ordering::Relaxed);
        if left > 0 {
            note(format_args!(
                "locktrace: agent: {left} profiles not posted to {url}: not answered within {} s of the stop",
                within.as_secs()
            ));
        }
    }
}

struct Poster {
    url: String,
    counters: PushCounters,
    /// Profiles not posted since posting last worked.
    failures: u64,
    waiting: Arc<AtomicUsize>,
}

impl Poster {
    fn run(mut self, uploads: Receiver<Upload>) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(POST_TIMEOUT))
            .http_status_as_error(false)
            .user_agent(concat!("locktrace/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        // Ends when the agent drops its Pusher.
        for upload in uploads {
            let posted = self.post(&agent, &upload);
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            match posted {
                Ok(()) => {
                    self.counters.posted.inc();
                    if self.failures > 0 {
                        note(format_args!(
                            "locktrace: agent: posting to {} works again ({} profiles were not posted)",
                            self.url, self.failures
                        ));
                        self.failures = 0;
                    }
                }
                Err(cause) => {
                    self.counters.failed.inc();
                    self.failures += 1;
                    if self.failures == 1 {
                        note(format_args!(
                            "locktrace: agent: posting a profile to {} failed {ATTEMPTS} times ({cause}); the agent goes on, and says when posting works again",
                            self.url
                        ));
                    }
                }
            }
        }
    }

    /// Posts with retries; the last failure's cause.
    fn post(&self, agent: &ureq::Agent, upload: &Upload) -> Result<(), String> {
        let address = format!("{}?{}", self.url, query(upload));
        let mut pause = FIRST_BACKOFF;
        let mut cause = String::new();
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(pause);
                pause *= 2;
            }
            match agent
                .post(&address)
                .header("Content-Type", "application/octet-stream")
                .send(&upload.body[..])
            {
                Ok(response) if response.status().is_success() => return Ok(()),
                Ok(response) => cause = format!("HTTP {}", response.status()),
                Err(error) => cause = error.to_string(),
            }
        }
        Err(cause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_carries_the_labels_with_values() {
        let labels = vec![
            ("container_id".to_string(), "abc123".to_string()),
            ("pod_uid".to_string(), String::new()),
            ("pid".to_string(), "42".to_string()),
            ("exe".to_string(), "php zts{x}".to_string()),
        ];
        assert_eq!(
            series_name("frankenphp", &labels),
            "frankenphp{container_id=abc123,pid=42,exe=php_zts_x_}"
        );
        assert_eq!(ingest_url("http://h:4040/"), "http://h:4040/ingest");
        assert_eq!(ingest_url("http://h:4040/ingest"), "http://h:4040/ingest");
        let upload = Upload {
            name: "a{pid=1}".into(),
            from: UNIX_EPOCH + Duration::from_secs(100),
            until: UNIX_EPOCH + Duration::from_secs(100),
            body: Vec::new(),
        };
        assert_eq!(
            query(&upload),
            "name=a%7Bpid%3D1%7D&from=100&until=101&format=pprof&spyName=locktrace"
        );
    }
}
