//! Each upstream's connections, a pool per server worker: idle HTTP/1.1 ones, or the HTTP/2
//! ones, kept on the worker's own event loop and closed once idle too long.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hyper::client::conn::{http1, http2};
use hyper::header::HeaderName;
use tokio::time::Instant;

use crate::config::Config;
use crate::observe::metrics::{FailureKind, UpstreamFailures};
use crate::transport::body::ProxyBody;
use crate::transport::events::EventBound;

/// Idle HTTP/1.1 connections each worker keeps per upstream.
const MAX_IDLE_PER_WORKER: usize = 256;

thread_local! {
    static POOL: Cell<usize> = const { Cell::new(0) };
}

/// Requests sent from this thread use connection pool `index` of each upstream. A server
/// worker picks its own, so its upstream connections live on its own event loop.
pub fn use_pool(index: usize) {
    POOL.with(|pool| pool.set(index));
}

/// How every upstream's connections are kept: a pool per server worker, idle connections
/// closed after `idle_timeout`, failures counted.
#[derive(Clone)]
pub struct Connections {
    pub workers: usize,
    pub idle_timeout: Duration,
    pub failures: UpstreamFailures,
    /// How much of a stream event the key scrub holds (`redact.rs`).
    pub events: EventBound,
    /// Every request header a key may come in, every API's (the dialects say which): what
    /// says a caller sent its own key, and what a reply must not echo.
    pub key_headers: &'static [HeaderName],
}

impl Connections {
    pub fn new(
        config: &Config,
        failures: UpstreamFailures,
        key_headers: &'static [HeaderName],
    ) -> Connections {
        Connections {
            key_headers,
            workers: config.server.worker_count(),
            idle_timeout: Duration::from_secs(config.upstream.idle_timeout_secs),
            failures,
            events: EventBound {
                max_bytes: config.server.max_event_bytes,
                uninspected: None,
            },
        }
    }
}

/// One server worker's connections to one upstream: idle HTTP/1.1 ones, or the HTTP/2 ones
/// that the worker's requests share once ALPN has chosen it, a second one opened when the
/// first carries as many streams as its peer allows at once. hyper drives each in a
/// task of its own on the worker's event loop, reading an idle connection too: one that
/// upstream closes is closed at once, not left in CLOSE_WAIT until reused.
///
/// Hand-written rather than hyper-util's pooled client (`client::legacy::Client`, one per
/// worker): that client, tried in its place, took 70,966 instructions per chat request
/// against 61,423 for this pool (+15.5%, `bench/instructions.sh`), and 55,866 against 42,431
/// per pass-through request (+31.7%), as it boxes each request's
/// future, races a pool checkout against a lazy connect, and spawns a task per request to
/// give the connection back once the body has been read.
pub(super) struct WorkerPool {
    idle: Mutex<Vec<IdleConnection>>,
    http2: Mutex<Vec<Http2Connection>>,
    /// Whether each request without a connection may open its own: a plain `http` upstream,
    /// or an `https` one whose ALPN chose HTTP/1.1. Until then one connects at a time, the
    /// others waiting for a shared HTTP/2 connection rather than each opening its own: 1,000
    /// streams that came at once opened 1,000 TLS connections (`UPSTREAM=h2
    /// bench/streams.sh`).
    pub(super) http1: AtomicBool,
    /// The turn to connect while `http1` is unknown, with why the last attempt failed.
    pub(super) connecting: tokio::sync::Mutex<String>,
    /// Attempts that failed: one waiting on another's turn fails with it when this moved.
    pub(super) failed_connects: AtomicU64,
    idle_timeout: Duration,
    /// Whether the task that closes connections idle past `idle_timeout` runs.
    sweeping: AtomicBool,
    pub(super) failures: FailureLog,
}

/// The streams an HTTP/2 connection's peer allows at once (its SETTINGS_MAX_CONCURRENT_STREAMS),
/// read from the connection as it is now; 0 once it has ended.
pub(super) type PeerLimit = Box<dyn Fn() -> usize + Send + Sync>;

/// A shared HTTP/2 connection: past its peer's limit, hyper keeps a request waiting for a
/// stream of it to end. At nginx's limit of 128 on each worker's one connection, 1,000
/// streams held 8 s took 40.5 s (`H2_STREAMS=128 UPSTREAM=h2 bench/streams.sh BIN 1000`).
/// Until the peer's SETTINGS come, hyper takes its limit to be 100 (RFC 9113's least
/// recommended): a lower one is found out by the streams past it waiting.
struct Http2Connection {
    sender: http2::SendRequest<ProxyBody>,
    /// The streams its peer allows at once, read from the connection: hyper reads the peer's
    /// SETTINGS on a task of its own, so the connection's task may not have run since.
    limit: PeerLimit,
    streams: Arc<Streams>,
}

/// The requests' streams open on an HTTP/2 connection, and since when it has had none.
struct Streams {
    open: AtomicUsize,
    idle_since: Mutex<Instant>,
}

/// A request's stream on an HTTP/2 connection, counted against the peer's limit until the
/// request fails or its response body is dropped.
pub(super) struct Stream(Arc<Streams>);

impl Drop for Stream {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::Relaxed) == 1 {
            if let Ok(mut since) = self.0.idle_since.lock() {
                *since = Instant::now();
            }
        }
    }
}

impl Http2Connection {
    fn open_stream(&self) -> (http2::SendRequest<ProxyBody>, Stream) {
        self.streams.open.fetch_add(1, Ordering::Relaxed);
        (self.sender.clone(), Stream(self.streams.clone()))
    }

    /// Whether it has carried no stream for `timeout`: streams are opened only under the
    /// pool's lock, so none opens while the sweep, holding it, looks.
    fn idle_for(&self, timeout: Duration) -> bool {
        self.streams.open.load(Ordering::Relaxed) == 0
            && self
                .streams
                .idle_since
                .lock()
                .is_ok_and(|since| since.elapsed() >= timeout)
    }
}

struct IdleConnection {
    sender: http1::SendRequest<ProxyBody>,
    since: Instant,
}

/// Where a request goes.
pub(super) enum Sender {
    Http1(http1::SendRequest<ProxyBody>),
    Http2(http2::SendRequest<ProxyBody>, Stream),
}

impl WorkerPool {
    /// Each server worker's pool for the upstream at `base_url`, which `plain` when its
    /// scheme is `http`.
    pub(super) fn per_worker(
        base_url: &str,
        plain: bool,
        connections: &Connections,
    ) -> Vec<Arc<WorkerPool>> {
        (0..connections.workers.max(1))
            .map(|_| {
                Arc::new(WorkerPool {
                    idle: Mutex::default(),
                    http2: Mutex::default(),
                    http1: AtomicBool::new(plain),
                    connecting: tokio::sync::Mutex::default(),
                    failed_connects: AtomicU64::default(),
                    idle_timeout: connections.idle_timeout,
                    sweeping: Default::default(),
                    failures: FailureLog {
                        upstream: base_url.to_string(),
                        counter: connections.failures.clone(),
                    },
                })
            })
            .collect()
    }

    /// The pool of the worker this thread serves (`use_pool`).
    pub(super) fn this_workers(pools: &[Arc<WorkerPool>]) -> &Arc<WorkerPool> {
        &pools[POOL.with(Cell::get) % pools.len()]
    }

    /// The most recently used idle connection that is still open and ready.
    pub(super) async fn idle_http1(&self) -> Option<http1::SendRequest<ProxyBody>> {
        loop {
            let mut sender = self.idle.lock().ok()?.pop()?.sender;
            // A connection goes back to the pool as its response ends, maybe a moment before
            // hyper has finished with it; one that closes instead is skipped.
            if !sender.is_closed() && sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    /// A stream on an open HTTP/2 connection below its peer's limit, the closed ones dropped.
    pub(super) fn live_http2(&self) -> Option<(http2::SendRequest<ProxyBody>, Stream)> {
        let mut connections = self.http2.lock().ok()?;
        connections.retain(|connection| !connection.sender.is_closed());
        connections
            .iter()
            .find(|c| c.streams.open.load(Ordering::Relaxed) < (c.limit)())
            .map(Http2Connection::open_stream)
    }

    /// Shares a new HTTP/2 connection and opens its first stream.
    pub(super) fn add_http2(
        self: &Arc<Self>,
        sender: http2::SendRequest<ProxyBody>,
        limit: PeerLimit,
    ) -> (http2::SendRequest<ProxyBody>, Stream) {
        let connection = Http2Connection {
            sender,
            limit,
            streams: Arc::new(Streams {
                open: AtomicUsize::new(0),
                idle_since: Mutex::new(Instant::now()),
            }),
        };
        let stream = connection.open_stream();
        if let Ok(mut connections) = self.http2.lock() {
            connections.push(connection);
        }
        self.sweep_from_now();
        stream
    }

    /// Keeps a connection whose exchange ended for the next request.
    pub(super) fn put(self: &Arc<Self>, sender: http1::SendRequest<ProxyBody>) {
        if self.idle_timeout.is_zero() || sender.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < MAX_IDLE_PER_WORKER {
                idle.push(IdleConnection {
                    sender,
                    since: Instant::now(),
                });
            }
        }
        self.sweep_from_now();
    }

    /// Starts the sweep of connections idle too long, the first time a connection is kept;
    /// with no idle timeout, HTTP/1.1 connections are not kept and HTTP/2 ones not swept.
    fn sweep_from_now(self: &Arc<Self>) {
        if !self.idle_timeout.is_zero() && !self.sweeping.swap(true, Ordering::Relaxed) {
            tokio::spawn(sweep(Arc::downgrade(self), self.idle_timeout));
        }
    }
}

/// Closes connections idle for `timeout`, HTTP/1.1 ones kept and HTTP/2 ones with no stream
/// open (dropping the pool's sender ends hyper's connection task once no request holds
/// another, which closes the socket), looking a few times per timeout, until the pool is
/// gone. An HTTP/2 connection opened past a peer's limit for a burst otherwise stayed open
/// for as long as its peer allowed.
async fn sweep(pool: Weak<WorkerPool>, timeout: Duration) {
    loop {
        tokio::time::sleep(timeout / 4).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        if let Ok(mut idle) = pool.idle.lock() {
            idle.retain(|connection| connection.since.elapsed() < timeout);
        };
        if let Ok(mut http2) = pool.http2.lock() {
            http2.retain(|connection| !connection.idle_for(timeout));
        };
    }
}

/// An upstream's failures, each counted and logged where it is noticed.
pub(super) struct FailureLog {
    upstream: String,
    counter: UpstreamFailures,
}

impl FailureLog {
    pub(super) fn record(&self, kind: FailureKind, error: &dyn std::fmt::Display) {
        self.counter.count(kind);
        tracing::warn!(upstream = %self.upstream, kind = kind.as_str(), %error, "upstream failure");
    }
}
