//! The built-in load driver: HTTP/1.1 keep-alive GET load on a fixed set of
//! connections (hyper's client connection API on tokio), counting every
//! response by status and checking bodies. Its own runtime, so its threads
//! can be pinned to CPUs away from the target (`--load-cpus`).
use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Request, Uri, client::conn::http1::SendRequest, header};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpStream, sync::Notify};

/// How much load one phase sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Amount {
    Requests(u64),
    Duration(Duration),
}

#[derive(Debug, Clone)]
pub(crate) struct LoadOptions {
    pub url: String,
    pub amount: Amount,
    pub concurrency: usize,
    pub expect_status: u16,
    /// The body must contain this text.
    pub expect_body: Option<String>,
    pub warmup: u64,
    /// CPUs the driver's threads run on.
    pub cpus: Option<Vec<usize>>,
}

/// What one phase of load got back.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Tally {
    /// Responses by status code.
    pub statuses: BTreeMap<u16, u64>,
    /// Responses with the expected status but a body without the expected text.
    pub wrong_bodies: u64,
    /// Requests that got no response (connection refused, reset, bad HTTP).
    pub connection_errors: u64,
    /// Requests resent because the server closed an idle keep-alive connection first.
    pub retries: u64,
    pub first_error: Option<String>,
    pub elapsed: Duration,
}

impl Tally {
    pub(crate) fn responses(&self) -> u64 {
        self.statuses.values().sum()
    }

    /// Unexpected outcomes by kind (`status 500`, `wrong body`, `connection error`).
    pub(crate) fn unexpected(&self, expect_status: u16) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (&status, &n) in &self.statuses {
            if status != expect_status {
                out.insert(format!("status {status}"), n);
            }
        }
        if self.wrong_bodies > 0 {
            out.insert("wrong body".into(), self.wrong_bodies);
        }
        if self.connection_errors > 0 {
            out.insert("connection error".into(), self.connection_errors);
        }
        out
    }
}

struct Endpoint {
    host: String,
    port: u16,
    authority: String,
    path: Uri,
    /// Most bytes of one response body read (MAX_BODY_BYTES; lower in a test,
    /// where streaming 64 MiB through a debug build on a loaded machine
    /// outlasted the response timeout).
    max_body_bytes: u64,
}

type Sender = SendRequest<Empty<Bytes>>;

/// How long one request may wait for its whole response.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a response in flight may still take after a stop.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(1);

/// Open keep-alive connections to the server, ready to send load.
pub(crate) struct LoadDriver {
    runtime: BackgroundRuntime,
    endpoint: Arc<Endpoint>,
    options: LoadOptions,
    connections: Mutex<Vec<Option<Sender>>>,
    /// Responses received in the running phase (for progress).
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    /// Wakes the connections' tasks when `stop` is set, so none waits on a
    /// connect or a response after a stop signal.
    stopped: Arc<Notify>,
}

impl LoadDriver {
    /// Parses the URL and opens `concurrency` connections (fails if the server is not there).
    pub(crate) async fn connect(options: &LoadOptions) -> Result<LoadDriver> {
        LoadDriver::connect_bounded(options, MAX_BODY_BYTES).await
    }

    /// `connect`, reading at most `max_body_bytes` of a response body.
    async fn connect_bounded(options: &LoadOptions, max_body_bytes: u64) -> Result<LoadDriver> {
        let endpoint = Arc::new(Endpoint {
            max_body_bytes,
            ..parse_url(&options.url)?
        });
        if options.concurrency == 0 {
            bail!("-c (concurrency) must be at least 1");
        }
        let threads = options
            .cpus
            .as_ref()
            .map_or(options.concurrency.min(2), |cpus| cpus.len().max(1));
        let cpus = options.cpus.clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("locktrace-load")
            .enable_all()
            .on_thread_start(move || {
                if let Some(cpus) = &cpus {
                    pin_current_thread(cpus);
                }
            })
            .build()
            .context("starting the load driver's threads")?;
        let runtime = BackgroundRuntime(Some(runtime));
        let mut handles = Vec::new();
        for _ in 0..options.concurrency {
            let endpoint = endpoint.clone();
            handles.push(runtime.get()?.spawn(async move { open(&endpoint).await }));
        }
        let mut connections = Vec::new();
        for handle in handles {
            let sender = handle
                .await
                .map_err(|error| anyhow!("load driver task failed: {error}"))?
                .with_context(|| format!("cannot connect to {}", options.url))?;
            connections.push(Some(sender));
        }
        Ok(LoadDriver {
            runtime,
            endpoint,
            options: options.clone(),
            connections: Mutex::new(connections),
            done: Arc::new(AtomicU64::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
            stopped: Arc::new(Notify::new()),
        })
    }

    pub(crate) fn options(&self) -> &LoadOptions {
        &self.options
    }

    /// Responses received so far in the running phase.
    pub(crate) fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Ends the running phase: no new request or connect; a response in
    /// flight gets [`STOP_GRACE`] to arrive.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.stopped.notify_waiters();
    }

    /// Sends one phase of load on every connection and waits for all of it.
    pub(crate) async fn run(&self, amount: Amount) -> Result<Tally> {
        let runtime = self.runtime.get()?;
        self.done.store(0, Ordering::Relaxed);
        self.stop.store(false, Ordering::Relaxed);
        let phase = Arc::new(Phase {
            amount,
            issued: AtomicU64::new(0),
            started: Instant::now(),
            done: self.done.clone(),
            stop: self.stop.clone(),
            stopped: self.stopped.clone(),
            expect_status: self.options.expect_status,
            expect_body: self.options.expect_body.clone().map(Bytes::from),
            tally: Mutex::new(Tally::default()),
        });
        let senders: Vec<Option<Sender>> = std::mem::take(&mut *lock(&self.connections));
        let mut handles = Vec::new();
        for sender in senders {
            let phase = phase.clone();
            let endpoint = self.endpoint.clone();
            handles.push(runtime.spawn(async move { drive(sender, &endpoint, &phase).await }));
        }
        let mut returned = Vec::new();
        for handle in handles {
            returned.push(
                handle
                    .await
                    .map_err(|error| anyhow!("load driver task failed: {error}"))?,
            );
        }
        *lock(&self.connections) = returned;
        let mut tally = std::mem::take(&mut *lock(&phase.tally));
        tally.elapsed = phase.started.elapsed();
        Ok(tally)
    }
}

/// The driver's runtime; shut down without blocking when dropped, because
/// dropping a runtime inside another runtime's task would panic.
struct BackgroundRuntime(Option<tokio::runtime::Runtime>);

impl BackgroundRuntime {
    fn get(&self) -> Result<&tokio::runtime::Runtime> {
        self.0
            .as_ref()
            .ok_or_else(|| anyhow!("load driver is shut down"))
    }
}

impl Drop for BackgroundRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

struct Phase {
    amount: Amount,
    issued: AtomicU64,
    started: Instant,
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    stopped: Arc<Notify>,
    expect_status: u16,
    expect_body: Option<Bytes>,
    tally: Mutex<Tally>,
}

impl Phase {
    /// Claims the next request of the phase, if any is left.
    fn claim(&self) -> bool {
        if self.stop.load(Ordering::Relaxed) {
            return false;
        }
        match self.amount {
            Amount::Requests(n) => self.issued.fetch_add(1, Ordering::Relaxed) < n,
            Amount::Duration(d) => self.started.elapsed() < d,
        }
    }

    /// Resolves once the phase is stopped.
    async fn stopped(&self) {
        // Registered before the flag is read, so a stop in between still wakes it.
        let notified = self.stopped.notified();
        if self.stop.load(Ordering::SeqCst) {
            return;
        }
        notified.await;
    }

    /// `work`, unless the phase is stopped first (then None).
    async fn unless_stopped<T>(&self, work: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::select! {
            out = work => Some(out),
            () = self.stopped() => None,
        }
    }

    fn record_error(&self, error: String) {
        let mut tally = lock(&self.tally);
        tally.connection_errors += 1;
        tally.first_error.get_or_insert(error);
    }
}

/// One connection's share of a phase; returns the connection for the next phase.
async fn drive(mut sender: Option<Sender>, endpoint: &Endpoint, phase: &Phase) -> Option<Sender> {
    // Responses on the current connection, and whether the claimed request is to be resent.
    let mut served = 0u64;
    let mut resend = false;
    loop {
        if !resend && !phase.claim() {
            break;
        }
        resend = false;
        match connect(&mut sender, &mut served, endpoint, phase).await {
            Connection::Ready => {}
            Connection::Failed => continue,
            Connection::Stopped => break,
        }
        let Some(active) = sender.as_mut() else {
            continue;
        };
        let request = Request::get(endpoint.path.clone())
            .header(header::HOST, endpoint.authority.as_str())
            .body(Empty::<Bytes>::new());
        let request = match request {
            Ok(request) => request,
            Err(error) => {
                phase.record_error(error.to_string());
                continue;
            }
        };
        let Some(answered) = exchange(active, request, endpoint, phase).await else {
            break;
        };
        let Ok(outcome) = answered else {
            phase.record_error(format!(
                "no response within {} s",
                RESPONSE_TIMEOUT.as_secs()
            ));
            sender = None;
            continue;
        };
        match tally(phase, outcome, served) {
            Answered::Counted => served += 1,
            Answered::Reconnect => sender = None,
            Answered::Resend => {
                sender = None;
                resend = true;
            }
        }
    }
    sender
}

/// Whether a request can go out on the driver's connection.
enum Connection {
    Ready,
    /// No connection (the error is tallied): on to the next request.
    Failed,
    /// The phase stopped first.
    Stopped,
}

/// Keeps `sender` usable: the server may have closed the connection
/// (keep-alive limit), so a new one is opened, which is not an error
/// (`served` restarts at 0).
async fn connect(
    sender: &mut Option<Sender>,
    served: &mut u64,
    endpoint: &Endpoint,
    phase: &Phase,
) -> Connection {
    let usable = match sender.as_mut() {
        Some(s) if !s.is_closed() => match phase.unless_stopped(s.ready()).await {
            Some(ready) => ready.is_ok(),
            None => return Connection::Stopped,
        },
        _ => false,
    };
    if usable {
        return Connection::Ready;
    }
    *served = 0;
    // A server with a full backlog leaves a connect hanging for minutes.
    let Some(opened) = phase.unless_stopped(open(endpoint)).await else {
        return Connection::Stopped;
    };
    match opened {
        Ok(fresh) => {
            *sender = Some(fresh);
            Connection::Ready
        }
        Err(error) => {
            phase.record_error(format!("{error:#}"));
            *sender = None;
            // Back off briefly so a dead server does not spin the driver.
            tokio::time::sleep(Duration::from_millis(10)).await;
            Connection::Failed
        }
    }
}

/// Sends the request and reads the response, within [`RESPONSE_TIMEOUT`];
/// None when the phase stopped and the response did not come within
/// [`STOP_GRACE`] after.
async fn exchange(
    active: &mut Sender,
    request: Request<Empty<Bytes>>,
    endpoint: &Endpoint,
    phase: &Phase,
) -> Option<Result<Result<(u16, bool), ExchangeError>, tokio::time::error::Elapsed>> {
    let expect_body = phase.expect_body.as_deref();
    let exchange = async {
        let response = active.send_request(request).await?;
        let status = response.status().as_u16();
        let body_ok = read_body(response.into_body(), expect_body, endpoint.max_body_bytes).await?;
        Ok::<_, ExchangeError>((status, body_ok))
    };
    // A server that never answers (e.g. fewer server threads than
    // connections) must not hang the recording.
    let stopped_and_grace = async {
        phase.stopped().await;
        tokio::time::sleep(STOP_GRACE).await;
    };
    tokio::select! {
        answered = tokio::time::timeout(RESPONSE_TIMEOUT, exchange) => Some(answered),
        () = stopped_and_grace => None,
    }
}

/// What an answered exchange means for the connection.
enum Answered {
    /// A response, tallied.
    Counted,
    /// An error, tallied: the connection is dropped.
    Reconnect,
    /// A retry, tallied: the request goes again on a new connection.
    Resend,
}

/// Tallies a response (its status, whether its body was as expected) or
/// the error instead; `served` is the responses on this connection so far.
fn tally(phase: &Phase, outcome: Result<(u16, bool), ExchangeError>, served: u64) -> Answered {
    match outcome {
        Ok((status, body_ok)) => {
            let mut tally = lock(&phase.tally);
            *tally.statuses.entry(status).or_insert(0) += 1;
            if status == phase.expect_status && !body_ok {
                tally.wrong_bodies += 1;
            }
            drop(tally);
            phase.done.fetch_add(1, Ordering::Relaxed);
            Answered::Counted
        }
        // A reused keep-alive connection the server closed before
        // answering (its idle/limit close raced our request): the server
        // never took the request, so send it again on a new connection,
        // as HTTP clients do for idempotent requests. Counted as a retry.
        Err(ExchangeError::Http(error)) if served > 0 && error.is_incomplete_message() => {
            lock(&phase.tally).retries += 1;
            Answered::Resend
        }
        Err(error) => {
            phase.record_error(error.to_string());
            Answered::Reconnect
        }
    }
}

async fn open(endpoint: &Endpoint) -> Result<Sender> {
    let stream = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .with_context(|| format!("connecting to {}:{}", endpoint.host, endpoint.port))?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP/1.1 handshake")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Checks a `--load` URL (scheme, host, port) without connecting.
pub(crate) fn check_url(url: &str) -> Result<()> {
    parse_url(url).map(|_| ())
}

fn parse_url(url: &str) -> Result<Endpoint> {
    let uri: Uri = url
        .parse()
        .map_err(|_| anyhow!("--load {url:?} is not a URL (want http://HOST:PORT/PATH)"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => bail!("--load {url:?}: only http:// is supported, not {other}://"),
        None => bail!("--load {url:?} is not a URL (want http://HOST:PORT/PATH)"),
    }
    let host = uri
        .host()
        .ok_or_else(|| anyhow!("--load {url:?} has no host"))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = port_of(url, &uri)?;
    let authority = uri
        .authority()
        .map_or_else(|| host.clone(), |a| a.to_string());
    let path: Uri = uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()
        .map_err(|_| anyhow!("--load {url:?} has a bad path"))?;
    Ok(Endpoint {
        host,
        port,
        authority,
        path,
        max_body_bytes: MAX_BODY_BYTES,
    })
}

/// The URL's port: 80 when none is written; a written one must be 1 to
/// 65535 (`:99999`, `:abc`, `:-1` or a bare `:` must not become port 80).
fn port_of(url: &str, uri: &Uri) -> Result<u16> {
    let authority = uri.authority().map_or("", |a| a.as_str());
    // After the userinfo, and after the closing bracket of an IPv6 host.
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, rest)| rest);
    let after_host = match host_port.rfind(']') {
        Some(bracket) => &host_port[bracket + 1..],
        None => host_port,
    };
    let Some((_, written)) = after_host.rsplit_once(':') else {
        return Ok(80);
    };
    written
        .parse::<u16>()
        .ok()
        .filter(|&port| port != 0)
        .ok_or_else(|| {
            anyhow!("--load {url:?} has an invalid port {written:?}: want a number from 1 to 65535")
        })
}

/// Most bytes of one response body read before giving up on it: a body
/// that never ends must not hold a connection (or memory) forever.
pub(crate) const MAX_BODY_BYTES: u64 = 64 << 20;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
enum ExchangeError {
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("response body longer than {} MiB", .0 >> 20)]
    BodyTooLong(u64),
}

/// Reads a body to its end as it streams, keeping only what the search
/// for `expect_body` needs; whether the text was in it.
async fn read_body(
    mut body: hyper::body::Incoming,
    expect_body: Option<&[u8]>,
    max_bytes: u64,
) -> Result<bool, ExchangeError> {
    let mut search = BodySearch::new(expect_body.unwrap_or_default());
    let mut read = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            read += data.len() as u64;
            if read > max_bytes {
                return Err(ExchangeError::BodyTooLong(max_bytes));
            }
            search.feed(&data);
        }
    }
    Ok(search.found)
}

/// A search for a text in a body that arrives in pieces: keeps the last
/// `needle.len() - 1` bytes, so a match split across pieces is found.
struct BodySearch<'a> {
    needle: &'a [u8],
    tail: Vec<u8>,
    found: bool,
}

impl<'a> BodySearch<'a> {
    fn new(needle: &'a [u8]) -> BodySearch<'a> {
        BodySearch {
            needle,
            tail: Vec::new(),
            found: needle.is_empty(),
        }
    }

    fn feed(&mut self, piece: &[u8]) {
        if self.found {
            return;
        }
        self.tail.extend_from_slice(piece);
        self.found = contains(&self.tail, self.needle);
        let keep = self.needle.len().saturating_sub(1);
        let cut = self.tail.len().saturating_sub(keep);
        self.tail.drain(..cut);
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// Parses a CPU list like `0,2-3`.
pub(crate) fn parse_cpu_list(text: &str) -> Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || anyhow!("--load-cpus {text:?} is not a CPU list like 0,2-3");
        match part.split_once('-') {
            Some((from, to)) => {
                let (from, to): (usize, usize) = (
                    from.parse().map_err(|_| bad())?,
                    to.parse().map_err(|_| bad())?,
                );
                if from > to {
                    return Err(bad());
                }
                // Checked before the range is expanded: 0-18446744073709551615 is no list to build.
                let online = num_configured_cpus().max(1);
                if to >= online.max(std::thread::available_parallelism().map_or(1, |n| n.get())) {
                    bail!("--load-cpus: CPU {to} does not exist (this machine has {online})");
                }
                cpus.extend(from..=to);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    let online = num_configured_cpus().max(available);
    if cpus.is_empty() {
        bail!("--load-cpus {text:?} names no CPU");
    }
    if let Some(cpu) = cpus.iter().find(|&&cpu| cpu >= online) {
        bail!("--load-cpus: CPU {cpu} does not exist (this machine has {online})");
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

fn num_configured_cpus() -> usize {
    use nix::unistd::{SysconfVar, sysconf};
    match sysconf(SysconfVar::_NPROCESSORS_CONF) {
        Ok(Some(n)) => usize::try_from(n).unwrap_or(1),
        _ => 1,
    }
}

fn pin_current_thread(cpus: &[usize]) {
    use nix::{
        sched::{CpuSet, sched_setaffinity},
        unistd::Pid,
    };
    let mut set = CpuSet::new();
    for &cpu in cpus {
        // Beyond CpuSet's size (parse_cpu_list already checked the range): skipped.
        let _ = set.set(cpu);
    }
    // Best effort, as before: unpinned load still works.
    let _ = sched_setaffinity(Pid::from_raw(0), &set);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server whose body never ends: the driver gives up on it at its
    /// body limit (reading it as it streams), instead of collecting it
    /// until the response timeout. The limit is 4 MiB here, not the 64 MiB
    /// of MAX_BODY_BYTES: a debug build on a machine loaded by two CPU hogs
    /// read 64 MiB in more than the 10 s timeout.
    #[test]
    fn a_never_ending_body_is_bounded() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
            let chunk = [b"10000\r\n".as_slice(), &[b'x'; 0x10000], b"\r\n"].concat();
            while stream.write_all(&chunk).is_ok() {}
        });
        let options = LoadOptions {
            url: format!("http://127.0.0.1:{port}/"),
            amount: Amount::Requests(1),
            concurrency: 1,
            expect_status: 200,
            expect_body: Some("needle".into()),
            warmup: 0,
            cpus: None,
        };
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let started = Instant::now();
        let tally = runtime.block_on(async {
            let driver = LoadDriver::connect_bounded(&options, 4 << 20)
                .await
                .unwrap();
            driver.run(Amount::Requests(1)).await.unwrap()
        });
        assert_eq!(tally.connection_errors, 1, "{tally:?}");
        assert_eq!(
            tally.first_error.as_deref(),
            Some("response body longer than 4 MiB")
        );
        assert!(
            started.elapsed() < RESPONSE_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_body_is_searched_in_pieces_keeping_only_a_tail() {
        let mut search = BodySearch::new(b"hello world");
        for piece in [&b"xxxx hel"[..], b"lo", b" wor", b"ld yyy"] {
            search.feed(piece);
            assert!(search.tail.len() < 11);
        }
        assert!(search.found);
        let mut search = BodySearch::new(b"needle");
        for _ in 0..1000 {
            search.feed(&[b'x'; 4096]);
        }
        assert!(!search.found);
        assert_eq!(search.tail.len(), 5);
        assert!(BodySearch::new(b"").found);
    }

    #[test]
    fn parses_urls() {
        let endpoint = parse_url("http://127.0.0.1:8080/a?b=1").unwrap();
        assert_eq!((endpoint.host.as_str(), endpoint.port), ("127.0.0.1", 8080));
        assert_eq!(endpoint.path, "/a?b=1");
        assert_eq!(parse_url("http://localhost").unwrap().path, "/");
        assert!(parse_url("https://x/").is_err());
        assert!(parse_url("nonsense").is_err());
        assert_eq!(parse_url("http://[::1]:8080/").unwrap().port, 8080);
        assert_eq!(parse_url("http://[::1]/").unwrap().port, 80);
        for bad in [":99999", ":abc", ":-1", ":", ":459990", ":0"] {
            let url = format!("http://127.0.0.1{bad}/");
            let error = parse_url(&url).err().map(|e| e.to_string());
            assert!(
                error.as_deref().is_some_and(|e| e.contains("invalid port")),
                "{url}: {error:?}"
            );
        }
    }

    #[test]
    fn parses_cpu_lists() {
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert!(parse_cpu_list("1-0").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("100000").is_err());
        assert!(parse_cpu_list("0-18446744073709551615").is_err());
    }

    #[test]
    fn tallies_unexpected_outcomes() {
        let mut tally = Tally::default();
        tally.statuses.insert(200, 9);
        tally.statuses.insert(500, 1);
        tally.wrong_bodies = 2;
        assert_eq!(tally.responses(), 10);
        let unexpected = tally.unexpected(200);
        assert_eq!(unexpected["status 500"], 1);
        assert_eq!(unexpected["wrong body"], 2);
    }
}
