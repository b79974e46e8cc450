//! The accept loops: HTTP/1.1 and h2c on one port, served by one event-loop thread per
//! worker, and a shutdown that drains in-flight requests (streams included) for up to
//! `shutdown_grace_secs`.
//!
//! Each worker owns a current-thread runtime, its own registration of the listening socket
//! and its own upstream connection pools, so a request is read, handled, forwarded and
//! answered on one thread. A shared work-stealing runtime moved the client and upstream
//! halves of a request between threads, and those wake-ups cost more than the proxying
//! itself. Whichever worker is free accepts the next connection.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::{service_fn, Service};
use hyper::{Request, Response, Version};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulConnection, GracefulShutdown, Watcher};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::config::Config;
use crate::error::ProxyError;
use crate::observe::metrics::Route;
use crate::pipeline::state::{AppState, StartError, Worker};
use crate::server::admin;
use crate::server::admission::{self, Admission, Admitted};
use crate::server::routes;
use crate::transport::body::ProxyBody;
use crate::transport::departure::{ClientSocket, Departure, WatchDeparture};
use crate::transport::upstream;

const HEARTBEAT: Duration = Duration::from_secs(1);
const H2_KEEP_ALIVE: Duration = Duration::from_secs(30);
const LISTEN_BACKLOG: i32 = 1024;
/// Request header fields, names and values with their framing, in bytes. Anything over it gets
/// condenser's OpenAI-shaped 431. hyper refuses some heads before condenser sees them, and
/// gives no way to shape its answer: over HTTP/1.1 a head over its read buffer (about
/// 400 KiB) or with more than 100 fields gets a bare 431 (and conflicting `Content-Length`
/// headers a bare 400); over HTTP/2 a header list over `H2_MAX_HEADER_LIST_BYTES` ends the
/// connection.
const MAX_HEADER_BYTES: usize = 64 * 1024;
/// HTTP/2 counts 32 bytes more per field than `MAX_HEADER_BYTES` does. At hyper's default
/// (16 KiB), 100 KB of headers ended an HTTP/2 client's connection (GOAWAY) where HTTP/1.1
/// got the shaped 431, and headers HTTP/1.1 takes were refused.
const H2_MAX_HEADER_LIST_BYTES: u32 = 256 * 1024;

pub struct Server {
    /// One per worker: clones of one listening socket.
    listeners: Vec<std::net::TcpListener>,
    local_addr: SocketAddr,
    /// The admin listener (`[admin] listen`), when set, and its address.
    admin: Option<(std::net::TcpListener, SocketAddr)>,
    state: Arc<AppState>,
    /// Shared by every worker: the client connections the open-files limit allows.
    admission: Arc<Admission>,
}

impl Server {
    pub async fn bind(config: Config) -> Result<Server, StartError> {
        let addr = config.server.listen.clone();
        let workers = config.server.worker_count();
        let state = Arc::new(AppState::new(config)?);
        let (listeners, local_addr) =
            bind_listeners(&addr, workers).map_err(|source| StartError::Bind { addr, source })?;
        let admin = match state.config.admin.listen.as_str() {
            "" => None,
            admin => {
                let (mut listeners, admin_addr) =
                    bind_listeners(admin, 1).map_err(|source| StartError::Bind {
                        addr: admin.to_string(),
                        source,
                    })?;
                // Port 0 on both picks two free ports; one named that the proxy took is refused.
                if admin_addr == local_addr {
                    return Err(StartError::Bind {
                        addr: admin.to_string(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::AddrInUse,
                            "the admin listener cannot share the proxy's port",
                        ),
                    });
                }
                listeners.pop().map(|listener| (listener, admin_addr))
            }
        };
        let admission = Arc::new(Admission::from_limit());
        tracing::debug!(connections = admission.most(), "client connections allowed");
        Ok(Server {
            listeners,
            local_addr,
            admin,
            state,
            admission,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The admin listener's address, when `[admin] listen` is set.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|(_, addr)| *addr)
    }

    pub fn state(&self) -> Arc<AppState> {
        self.state.clone()
    }

    /// Serves until `shutdown` resolves, then stops accepting and drains. The first worker
    /// runs on the calling runtime, the others on threads of their own.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let Server {
            listeners,
            state,
            admission,
            admin,
            ..
        } = self;
        let (stop, stopped) = watch::channel(false);
        if let Some((listener, addr)) = admin {
            tracing::info!(%addr, "admin page listening: GET /sessions");
            tokio::spawn(admin::serve(listener, state.clone(), stopped.clone()));
        }
        let barrier = DrainBarrier::new(
            listeners.len(),
            Duration::from_secs(state.config.server.shutdown_grace_secs),
        );
        let mut listeners = listeners.into_iter();
        let first = listeners.next();
        let threads: Vec<_> = listeners
            .enumerate()
            .filter_map(|(i, listener)| {
                let worker = i + 1;
                let (state, stopped, theirs) = (state.clone(), stopped.clone(), barrier.clone());
                let admission = admission.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("condenser-worker-{worker}"))
                    .spawn(move || {
                        run_worker(worker, (listener, admission), state, stopped, theirs)
                    });
                match spawned {
                    Ok(thread) => Some(thread),
                    Err(error) => {
                        tracing::error!(%error, worker, "cannot start a worker");
                        barrier.arrive();
                        None
                    }
                }
            })
            .collect();
        let trigger = async {
            shutdown.await;
            state.ready.store(false, Ordering::Relaxed);
            tracing::info!(
                grace_secs = state.config.server.shutdown_grace_secs,
                "shutting down: draining in-flight requests"
            );
            let _ = stop.send(true);
        };
        let local = async {
            let drained = match first {
                Some(listener) => accept_loop((listener, admission), state.clone(), stopped).await,
                None => true,
            };
            barrier.arrive_and_wait().await;
            drained
        };
        let ((), local_drained) = tokio::join!(trigger, local);
        let others_drained = tokio::task::spawn_blocking(move || {
            // Every thread is joined, drained or not.
            let drained: Vec<bool> = threads
                .into_iter()
                .map(|thread| thread.join().unwrap_or(false))
                .collect();
            drained.into_iter().all(|drained| drained)
        })
        .await
        .unwrap_or(false);
        if local_drained && others_drained {
            tracing::info!("drained");
        } else {
            tracing::warn!("grace period over; closing remaining connections");
        }
    }
}

/// Workers that have finished draining. Every runtime stays up until all have (or the grace
/// period is over), so a summary job or the Redis connection that one worker started still
/// serves requests draining on the others.
#[derive(Clone)]
struct DrainBarrier {
    arrived: Arc<watch::Sender<usize>>,
    workers: usize,
    grace: Duration,
}

impl DrainBarrier {
    fn new(workers: usize, grace: Duration) -> DrainBarrier {
        DrainBarrier {
            arrived: Arc::new(watch::Sender::new(0)),
            workers,
            grace,
        }
    }

    fn arrive(&self) {
        self.arrived.send_modify(|arrived| *arrived += 1);
    }

    async fn arrive_and_wait(&self) {
        let mut arrived = self.arrived.subscribe();
        self.arrive();
        let everyone = arrived.wait_for(|arrived| *arrived >= self.workers);
        let _ = tokio::time::timeout(self.grace, everyone).await;
    }
}

/// One listening socket, shared by `count` workers; an address with port 0 gets a free port.
fn bind_listeners(
    addr: &str,
    count: usize,
) -> std::io::Result<(Vec<std::net::TcpListener>, SocketAddr)> {
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    let listener = std::net::TcpListener::from(socket);
    let local_addr = listener.local_addr()?;
    let mut listeners = Vec::with_capacity(count.max(1));
    for _ in 1..count.max(1) {
        listeners.push(listener.try_clone()?);
    }
    listeners.push(listener);
    Ok((listeners, local_addr))
}

/// A worker thread: its own runtime and pools until every worker has drained. True when its
/// own connections drained within the grace period.
fn run_worker(
    worker: usize,
    listener: (std::net::TcpListener, Arc<Admission>),
    state: Arc<AppState>,
    stopped: watch::Receiver<bool>,
    barrier: DrainBarrier,
) -> bool {
    upstream::use_pool(worker);
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(async {
            let drained = accept_loop(listener, state, stopped).await;
            barrier.arrive_and_wait().await;
            drained
        }),
        Err(error) => {
            tracing::error!(%error, worker, "cannot start a worker runtime");
            barrier.arrive();
            true
        }
    }
}

/// Accepts until told to stop, then drains this worker's connections. True when they
/// finished within the grace period.
async fn accept_loop(
    (listener, admission): (std::net::TcpListener, Arc<Admission>),
    state: Arc<AppState>,
    mut stopped: watch::Receiver<bool>,
) -> bool {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, "cannot register a listener");
            return true;
        }
    };
    let header_read_timeout = Duration::from_secs(state.config.server.header_read_timeout_secs);
    let builders = Arc::new(connection_builders(header_read_timeout));
    let graceful = GracefulShutdown::new();
    let worker = Arc::new(Worker {
        state: state.clone(),
    });
    // tokio wakes its event loop through an eventfd whenever a timer is set earlier than any
    // pending one, and hyper sets a header-read timer after every response: on a quiet worker
    // that is a system call per request. A timer always due within a second is earlier than
    // all of those, at the price of one wake-up a second.
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = heartbeat.tick() => {}
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let Some(admitted) = admission.admit() else {
                    tracing::warn!(connections = admission.most(), "at the open-files limit: a client refused with 503");
                    tokio::spawn(admission::refuse(stream, admission.most()));
                    continue;
                };
                tokio::spawn(serve_connection(
                    stream,
                    worker.clone(),
                    builders.clone(),
                    (graceful.watcher(), admitted),
                    header_read_timeout,
                ));
            }
            () = stop_requested(&mut stopped) => break,
        }
    }
    drop(listener);
    let grace = Duration::from_secs(state.config.server.shutdown_grace_secs);
    tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_ok()
}

/// How every client connection is served: HTTP/1 with its header-read timeout and
/// half-close (the same in both builders), HTTP/2 with keep-alive pings and a bound on its
/// header list. The first serves connections already known to speak HTTP/1 (`speaks_http1`),
/// the second any other, telling the version by the HTTP/2 preface.
struct Builders {
    http1: http1::Builder,
    auto: auto::Builder<TokioExecutor>,
}

fn connection_builders(header_read_timeout: Duration) -> Builders {
    let mut http1 = http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        // A client that half-closes once its request is sent still gets its answer; one that
        // leaves mid-reply is noticed by the reply's body (`transport::departure`).
        .half_close(true);
    let mut auto = auto::Builder::new(TokioExecutor::new());
    auto.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .half_close(true);
    auto.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_KEEP_ALIVE)
        .max_header_list_size(H2_MAX_HEADER_LIST_BYTES);
    Builders { http1, auto }
}

/// What an HTTP/2 client sends first, before anything else.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the first bytes of a connection already differ from the HTTP/2 preface: then it
/// speaks HTTP/1. Bytes that agree with the preface so far (or none) do not tell.
fn speaks_http1(first: &[u8]) -> bool {
    first
        .iter()
        .zip(H2_PREFACE)
        .any(|(sent, preface)| sent != preface)
}

/// One client connection, from its first byte to its end (or the drain's).
async fn serve_connection(
    stream: TcpStream,
    worker: Arc<Worker>,
    builders: Arc<Builders>,
    // Held until the connection ends, which makes room for another.
    (watcher, _admitted): (Watcher, Admitted),
    header_read_timeout: Duration,
) {
    // Until its first byte the protocol is not known, and hyper's header-read timeout, an
    // HTTP/1 one, does not run: a connection that sends nothing would hold its descriptor for
    // good. (`readable` may wake without data; a peek waits for a byte.)
    let mut first = [0u8; H2_PREFACE.len()];
    let peeked = stream.peek(&mut first);
    let first = match tokio::time::timeout(header_read_timeout, peeked).await {
        Ok(Ok(read)) => &first[..read],
        Ok(Err(_)) => &[][..],
        Err(_) => return,
    };
    let http1 = speaks_http1(first);
    let socket = ClientSocket::new(stream);
    let service = answering(worker, socket.clone());
    let io = TokioIo::new(socket);
    // Served by hyper's HTTP/1 directly when the peek already tells: the version detection
    // reads the first 24 bytes apart and hands them to hyper ahead of the rest, and hyper's
    // second read, into the 8 KiB buffer its first had begun, doubled that buffer to 16 KiB
    // for the connection's whole life (heaptrack, 300 open streams). Peak RSS with 9,000 open
    // streams 425.0 -> 391.0 MB (bench/streams.sh).
    //
    // This task lives as long as its connection, at the size of its largest state: serving
    // HTTP/1 takes 784 bytes, the version detection 1,664, so that one is boxed for the
    // connections that need it. The task went from 3,584 to 1,152 bytes (`-Zprint-type-sizes`)
    // and, with the answer boxed in the service, peak RSS with 9,000 open streams behind an
    // HTTP/2 upstream from 262 to 275 MB to 215 to 241 MB (bench/streams.sh).
    if http1 {
        watched(watcher, builders.http1.serve_connection(io, service)).await;
    } else {
        Box::pin(watched(
            watcher,
            builders.auto.serve_connection(io, service),
        ))
        .await;
    }
}

/// A connection served until it ends, or the drain ends it. Not an `async fn`: one would hold
/// the connection twice, as its argument and inside the watch it awaits.
fn watched<C>(watcher: Watcher, connection: C) -> impl Future<Output = ()>
where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    watcher.watch(connection).map(|ended| {
        if let Err(error) = ended {
            tracing::debug!(%error, "connection ended with an error");
        }
    })
}

/// The service that answers a connection's requests. Its future is boxed: hyper keeps a slot
/// for it as long as the connection lives, at the future's size (HTTP/1's `in_flight`; each
/// HTTP/2 stream's task). The answer's future, the pipeline's inside it, is 8,272 bytes: boxed,
/// it is held only while its request is answered, and an open stream holds 8 bytes in its
/// place (1,064 before).
fn answering(
    worker: Arc<Worker>,
    socket: ClientSocket,
) -> impl Service<
    Request<Incoming>,
    Response = Response<WatchDeparture<ProxyBody>>,
    Error = Infallible,
    Future: Send + 'static,
> {
    service_fn(move |request| Box::pin(answer(worker.clone(), request, socket.clone())))
}

/// The reply to one request. Over HTTP/1 its client is watched from the moment its request
/// has been read: one that leaves cancels the request while it waits, and ends its reply
/// mid-way. HTTP/2 streams are reset by the client itself.
async fn answer(
    worker: Arc<Worker>,
    request: Request<Incoming>,
    socket: ClientSocket,
) -> Result<Response<WatchDeparture<ProxyBody>>, Infallible> {
    let watched = (request.version() < Version::HTTP_2).then_some(socket);
    let body_read_timeout = Duration::from_secs(worker.state.config.server.body_read_timeout_secs);
    let (request, mut departure) = Departure::watch(request, watched, body_read_timeout);
    let response = match refuse_oversized_headers(&worker.state, &request) {
        Some(refused) => refused,
        None => routes::handle(worker, request, &mut departure).await,
    };
    Ok(response.map(|body| WatchDeparture::new(body, departure)))
}

/// A 431 in the shape of the path's API when the header fields are over `MAX_HEADER_BYTES`,
/// logged and counted as routes count theirs.
fn refuse_oversized_headers<B>(
    state: &AppState,
    request: &Request<B>,
) -> Option<Response<ProxyBody>> {
    // As written on the wire: `name: value` and a line break.
    let size: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if size <= MAX_HEADER_BYTES {
        return None;
    }
    let error = ProxyError::HeadersTooLarge {
        limit: MAX_HEADER_BYTES,
    };
    let response = routes::error_for(request.uri().path(), &error);
    let status = response.status();
    tracing::info!(
        method = %request.method(),
        path = %request.uri().path(),
        status = status.as_u16(),
        "request"
    );
    state.metrics.count_request(Route::OTHER, status);
    Some(response)
}

/// Resolves once stopping is asked for, or once the server is gone.
async fn stop_requested(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn workers_wait_for_each_other_to_drain() {
        let barrier = DrainBarrier::new(2, Duration::from_secs(3600));
        let first = tokio::spawn({
            let barrier = barrier.clone();
            async move { barrier.arrive_and_wait().await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!first.is_finished(), "one of two workers has arrived");
        barrier.arrive_and_wait().await;
        first.await.unwrap();
    }

    #[test]
    fn only_bytes_that_leave_the_http2_preface_tell_http1() {
        for first in [
            &b"POST /v1/chat/completions HTTP/1.1"[..],
            b"GET",
            b"PO",
            b"X",
        ] {
            assert!(speaks_http1(first), "{first:?}");
        }
        for first in [&b""[..], b"P", b"PRI * HTTP/2", H2_PREFACE] {
            assert!(!speaks_http1(first), "{first:?}");
        }
    }

    /// What every open connection holds for its whole life: its task, sized by its largest
    /// state. A request's future (the pipeline's, 8 KB) held in it would be held by every
    /// connection through a whole stream.
    #[tokio::test]
    async fn a_connection_holds_no_request_sized_future() {
        let config = Config::from_toml("", "t").unwrap();
        let worker = Arc::new(Worker {
            state: Arc::new(AppState::new(config).unwrap()),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let admitted = Arc::new(Admission::from_limit()).admit().unwrap();
        let timeout = Duration::from_secs(1);
        let connection = serve_connection(
            stream,
            worker.clone(),
            Arc::new(connection_builders(timeout)),
            (GracefulShutdown::new().watcher(), admitted),
            timeout,
        );
        let size = std::mem::size_of_val(&connection);
        assert!(size <= 1536, "a connection's task holds {size} bytes");
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let service = answering(worker, ClientSocket::new(stream));
        assert_eq!(
            future_size(&service),
            size_of::<usize>(),
            "a request's future is boxed"
        );
    }

    fn future_size<S: Service<Request<Incoming>>>(_: &S) -> usize {
        size_of::<S::Future>()
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_never_drains_holds_the_others_only_for_the_grace_period() {
        let barrier = DrainBarrier::new(2, Duration::from_secs(30));
        let started = tokio::time::Instant::now();
        barrier.arrive_and_wait().await;
        assert_eq!(started.elapsed().as_secs(), 30);
    }
}
