//! Upstreams: hyper's HTTP/1.1 and HTTP/2 clients over a small pool per server worker
//! (`pool.rs`), model-based routing, and relaying requests and responses without collecting
//! their bodies.
//!
//! HTTP framing is hyper's (`hyper::client::conn`). What is decided here: a request is sent
//! again only when hyper hands it back unwritten (RFC 9110 §9.2.2), a reply that hyper parsed
//! but a proxy must not pass on is refused, and a reply that breaks after its first bytes went
//! out fails the client's body, so the client never sees a clean end to a truncated one.

use std::future::Future as _;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::{http1, http2};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connection as _, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tower_service::Service;
use wildmatch::WildMatch;

use crate::config::{speaks, Config, ConfigError};
use crate::error::ProxyError;
use crate::observe::metrics::FailureKind;
use crate::transport::body::{
    with_idle_timeout, BodyLimitExceeded, BodyReadTimeout, BoxError, ProxyBody,
};
use crate::transport::broken::{broken_head, failure_kind, root_cause};
use crate::transport::egress::Egress;
pub use crate::transport::headers::{bearer_from_env, KeyStyle};
use crate::transport::headers::{forwardable_headers, inject_key, strip_hop_by_hop};
pub use crate::transport::pool::{use_pool, Connections};
use crate::transport::pool::{Sender, Stream, WorkerPool};
pub use crate::transport::redact::blank_credentials;
use crate::transport::redact::without_credentials;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A response head larger than this (status line and headers, as hyper parsed it) is a
/// broken reply, however its bytes arrived.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Fields a response head may have (hyper's default: 100). hyper allocates room for this
/// many on every response it parses: at 16,384 (as many as fit `MAX_HEAD_BYTES` at their
/// shortest, `a:\r\n`), two 512 KiB buffers that cost ~4,000 instructions per chat request
/// (`bench/instructions.sh`); at 1,024, two 32 KiB ones the allocator keeps at hand.
const MAX_HEAD_FIELDS: usize = 1024;
pub struct Upstream {
    base_url: String,
    /// `base_url` without a trailing `/v1`, which request paths bring themselves.
    path_base: String,
    /// The paths of `base_url` and `path_base`, put before request paths.
    base_path: String,
    path_base_path: String,
    /// `scheme://authority/`, what the connector dials.
    origin: Uri,
    /// The `Host` upstream is sent.
    host: HeaderValue,
    connector: HttpsConnector<Egress>,
    pools: Vec<Arc<WorkerPool>>,
    api_key: Option<HeaderValue>,
    timeout: Duration,
    key_headers: &'static [HeaderName],
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// The file of extra trusted roots (PEM), for upstreams behind a private CA: the variable
/// OpenSSL, curl and Python's ssl module read too.
const EXTRA_ROOTS_ENV: &str = "SSL_CERT_FILE";

/// TLS that trusts the Mozilla root set and any roots in `extra_roots` (a PEM file), with ring
/// named as the crypto provider: rustls refuses to guess when more than one is compiled in.
fn tls_config(extra_roots: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(file) = extra_roots {
        let unreadable = |e: &dyn std::fmt::Display| format!("{}: {e}", file.display());
        let certs = CertificateDer::pem_file_iter(file)
            .map_err(|e| unreadable(&e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| unreadable(&e))?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(unreadable(&"no usable certificate"));
        }
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|config| config.with_root_certificates(roots).with_no_client_auth())
        .map_err(|e| e.to_string())
}

/// TCP connections as upstreams want them, directly or through the proxy the environment
/// names.
fn egress() -> Egress {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    Egress::new(http, Matcher::from_env())
}

impl Upstream {
    pub fn new(
        base_url: &str,
        api_key_env: &str,
        timeout: Duration,
        connections: &Connections,
    ) -> Result<Upstream, ConfigError> {
        let extra_roots = std::env::var_os(EXTRA_ROOTS_ENV).filter(|file| !file.is_empty());
        let tls = tls_config(extra_roots.as_deref().map(Path::new))
            .map_err(|e| ConfigError::Invalid(format!("cannot set up TLS for {base_url}: {e}")))?;
        Upstream::with_tls(base_url, api_key_env, timeout, connections, tls)
    }

    fn with_tls(
        base_url: &str,
        api_key_env: &str,
        timeout: Duration,
        connections: &Connections,
        tls: rustls::ClientConfig,
    ) -> Result<Upstream, ConfigError> {
        let base_url = base_url.trim_end_matches('/').to_string();
        let unusable = |why: &dyn std::fmt::Display| {
            ConfigError::Invalid(format!("{base_url}: not a usable base URL: {why}"))
        };
        let parsed = Uri::try_from(base_url.as_str()).map_err(|e| unusable(&e))?;
        let (Some(scheme), Some(authority)) = (parsed.scheme_str(), parsed.authority()) else {
            return Err(unusable(&"it needs a scheme and a host"));
        };
        if scheme != "http" && scheme != "https" {
            return Err(unusable(&"the scheme must be http or https"));
        }
        let origin = Uri::try_from(format!("{scheme}://{authority}/")).map_err(|e| unusable(&e))?;
        let host = authority.as_str().rsplit('@').next().unwrap_or_default();
        let host = HeaderValue::from_str(host).map_err(|e| unusable(&e))?;
        let base_path = parsed.path().trim_end_matches('/').to_string();
        let egress = egress();
        egress
            .check(&origin)
            .map_err(|why| ConfigError::Invalid(format!("{base_url}: {why}")))?;
        if let Some(proxy) = egress.proxy_for(&origin) {
            tracing::info!(
                upstream = %base_url,
                proxy = proxy.uri().host().unwrap_or(""),
                "upstream reached through the proxy from the environment"
            );
        }
        // TLS for `https`, speaking HTTP/1.1 or HTTP/2 as ALPN settles.
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(egress);
        let pools = WorkerPool::per_worker(&base_url, scheme == "http", connections);
        Ok(Upstream {
            path_base: base_url
                .strip_suffix("/v1")
                .unwrap_or(&base_url)
                .to_string(),
            path_base_path: base_path
                .strip_suffix("/v1")
                .unwrap_or(&base_path)
                .to_string(),
            base_path,
            base_url,
            origin,
            host,
            connector,
            pools,
            api_key: bearer_from_env(api_key_env)?,
            timeout,
            key_headers: connections.key_headers,
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `base_url` + the request's path and query; a base that already ends in `/v1` is not
    /// given a second one.
    pub fn url(&self, path_and_query: &str) -> String {
        if path_and_query.starts_with("/v1/") {
            format!("{}{path_and_query}", self.path_base)
        } else {
            format!("{}{path_and_query}", self.base_url)
        }
    }

    /// The request target sent over HTTP/1.1: [`Upstream::url`]'s path and query.
    fn target(&self, path_and_query: &str) -> Result<Uri, hyper::http::uri::InvalidUri> {
        let base = if path_and_query.starts_with("/v1/") {
            &self.path_base_path
        } else {
            &self.base_path
        };
        if base.is_empty() {
            Uri::try_from(path_and_query)
        } else {
            Uri::try_from(format!("{base}{path_and_query}"))
        }
    }

    /// Sends and waits for the response head and the first frame of its body (or its end),
    /// so that a reply broken that early is still answered as an error. The body then fails
    /// once upstream stays silent for the upstream timeout, or breaks. The response's
    /// headers are its own, minus hop-by-hop ones, and no key it was sent reaches the client
    /// in them or in an error's body (`redact.rs`).
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        key_style: KeyStyle,
        client_headers: HeaderMap,
        body: ProxyBody,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let mut headers = forwardable_headers(client_headers);
        let query = path_and_query.split_once('?').map(|(_, query)| query);
        if let Some(key) = &self.api_key {
            inject_key(&mut headers, query, key, key_style, self.key_headers);
        }
        // The body may have been rewritten: hyper frames it by its own length. An empty one
        // keeps the client's `Content-Length: 0`, which some servers want on a POST.
        if headers.remove(header::CONTENT_LENGTH).is_some() && body.size_hint().exact() == Some(0) {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        }
        // Refcounted handles, not copies: what the reply must not echo. Each name is looked
        // for by walking the few headers a request has (the first value, as `get` gives),
        // not by hashing it: saves about 230 instructions per chat request
        // (bench/instructions.sh).
        let credentials: Vec<HeaderValue> = self
            .key_headers
            .iter()
            .filter_map(|name| {
                headers
                    .iter()
                    .find(|(present, _)| *present == name)
                    .map(|(_, value)| value.clone())
            })
            .chain(key_style.query_key(query))
            .collect();
        // A reply to a request with a key is scrubbed as the client reads it, decoded: one
        // asked in no content coding streams through scrubbed as it comes; one that comes
        // encoded all the same is read whole (`redact.rs`). Without the header, any coding
        // would be acceptable (RFC 9110 §12.5.3).
        if !credentials.is_empty() {
            headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
        }
        let mut request = Request::new(body);
        *request.method_mut() = method;
        *request.headers_mut() = headers;
        let pool = WorkerPool::this_workers(&self.pools);
        // Pinned where it is made and timed through a reference: moved into the timeout, the
        // exchange's future (1,000 bytes) was copied twice more on every request, and
        // `Upstream::send` took ~420 more instructions per chat request (bench/instructions.sh).
        let exchange = std::pin::pin!(self.exchange(pool, path_and_query, request));
        let response = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(result) => result?,
            Err(_) => {
                let error = ProxyError::UpstreamTimeout(self.timeout.as_secs());
                pool.failures.record(FailureKind::Timeout, &error);
                return Err(error);
            }
        };
        without_credentials(response, &credentials).await
    }

    async fn exchange(
        &self,
        pool: &Arc<WorkerPool>,
        path_and_query: &str,
        mut request: Request<ProxyBody>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        // What the client is told names no upstream URL (the log line of the failure does).
        let unusable_target =
            |e: &dyn std::fmt::Display| ProxyError::UpstreamUnreachable(e.to_string());
        let mut reused = true;
        let (response, held) = loop {
            let sender = match pool.idle_http1().await {
                Some(sender) => Sender::Http1(sender),
                None => match pool.live_http2() {
                    Some((sender, stream)) => Sender::Http2(sender, stream),
                    None => {
                        reused = false;
                        // Boxed: connecting is kilobytes of future that the common case, an
                        // idle connection, would otherwise carry.
                        Box::pin(self.connect_in_turn(pool))
                            .await
                            .map_err(|e| self.request_failed(pool, FailureKind::Connect, &*e))?
                    }
                },
            };
            let sent = match sender {
                Sender::Http1(mut sender) => {
                    *request.uri_mut() = self
                        .target(path_and_query)
                        .map_err(|e| unusable_target(&e))?;
                    request
                        .headers_mut()
                        .insert(header::HOST, self.host.clone());
                    let sent = sender.try_send_request(request).await;
                    sent.map(|response| (response, Held::Connection(sender, pool.clone())))
                }
                Sender::Http2(mut sender, stream) => {
                    request.headers_mut().remove(header::HOST);
                    *request.uri_mut() =
                        Uri::try_from(self.url(path_and_query)).map_err(|e| unusable_target(&e))?;
                    sender
                        .try_send_request(request)
                        .await
                        .map(|response| (response, Held::Stream { _open: stream }))
                }
            };
            match sent {
                Ok(sent) => break sent,
                // hyper hands back a request it never started to write: a reused connection
                // found closed. Only such a request is sent again, and only once.
                Err(mut unsent) if reused => match unsent.take_message() {
                    Some(message) => {
                        request = message;
                        reused = false;
                    }
                    None => return Err(self.send_failed(pool, unsent.into_error())),
                },
                Err(failed) => return Err(self.send_failed(pool, failed.into_error())),
            }
        };
        self.relayable(pool, response, held).await
    }

    /// The reply as condenser relays it: refused when HTTP forbids passing it on (its head,
    /// or its first frame, broken), hop-by-hop headers gone, its connection given back to
    /// the pool once read to the end, and failing after a silence of the upstream timeout.
    async fn relayable(
        &self,
        pool: &Arc<WorkerPool>,
        response: Response<Incoming>,
        held: Held,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let (mut head, mut body) = response.into_parts();
        if let Some(why) = broken_head(&head) {
            return Err(self.broken(pool, FailureKind::Malformed, &why));
        }
        strip_hop_by_hop(&mut head.headers);
        let first = if body.is_end_stream() {
            None
        } else {
            match body.frame().await.transpose() {
                Ok(first) => first,
                Err(e) => return Err(self.broken(pool, failure_kind(&e), &root_cause(&e))),
            }
        };
        let mut body = UpstreamBody {
            first,
            rest: body,
            held,
        };
        body.give_back_when_done();
        let failures = pool.clone();
        let body = with_idle_timeout(body, self.timeout)
            .map_err(move |e| {
                failures.failures.record(failure_kind(&*e), &e);
                e
            })
            .boxed_unsync();
        Ok(Response::from_parts(head, body))
    }

    /// A connection for a request that found none: its own once the upstream is known to
    /// speak HTTP/1.1, else an HTTP/2 one with a stream to spare, which the request before it
    /// in turn may have opened, or a new one. One waiting on an attempt that failed fails
    /// with it, rather than each of a burst in turn waiting out the connect timeout.
    async fn connect_in_turn(&self, pool: &Arc<WorkerPool>) -> Result<Sender, BoxError> {
        if pool.http1.load(Ordering::Relaxed) {
            return self.connect(pool).await;
        }
        let failed = pool.failed_connects.load(Ordering::Relaxed);
        let mut turn = pool.connecting.lock().await;
        if let Some((sender, stream)) = pool.live_http2() {
            return Ok(Sender::Http2(sender, stream));
        }
        if pool.failed_connects.load(Ordering::Relaxed) != failed {
            return Err(turn.clone().into());
        }
        if pool.http1.load(Ordering::Relaxed) {
            drop(turn);
            return self.connect(pool).await;
        }
        let connected = self.connect(pool).await;
        match &connected {
            Ok(Sender::Http1(_)) => pool.http1.store(true, Ordering::Relaxed),
            Ok(Sender::Http2(..)) => {}
            Err(e) => {
                *turn = root_cause(&**e).to_string();
                pool.failed_connects.fetch_add(1, Ordering::Relaxed);
            }
        }
        connected
    }

    /// A new connection: HTTP/2 when ALPN chose it (then shared by the worker's requests),
    /// else HTTP/1.1. Its task runs on this worker's event loop.
    async fn connect(&self, pool: &Arc<WorkerPool>) -> Result<Sender, BoxError> {
        let mut connector = self.connector.clone();
        std::future::poll_fn(|cx| connector.poll_ready(cx)).await?;
        let stream = connector.call(self.origin.clone()).await?;
        if stream.connected().is_negotiated_h2() {
            let (sender, connection) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_header_list_size(MAX_HEAD_BYTES as u32)
                .handshake(stream)
                .await?;
            // Shared with the pool, which reads the peer's limit from it: it comes in the
            // peer's SETTINGS and may change. Dropped as it ends, which closes its sender.
            let connection = Arc::new(Mutex::new(Some(Box::pin(connection))));
            let driven = connection.clone();
            tokio::spawn(async move {
                let ended = std::future::poll_fn(|cx| {
                    let mut slot = driven.lock().unwrap_or_else(PoisonError::into_inner);
                    let Some(connection) = slot.as_mut() else {
                        return Poll::Ready(Ok(()));
                    };
                    let ended = ready!(connection.as_mut().poll(cx));
                    *slot = None;
                    Poll::Ready(ended)
                })
                .await;
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
                }
            });
            let limit = Box::new(move || {
                connection
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .map_or(0, |connection| connection.current_max_send_streams())
            });
            let (sender, stream) = pool.add_http2(sender, limit);
            return Ok(Sender::Http2(sender, stream));
        }
        let (sender, connection) = http1::Builder::new()
            .max_header_size(MAX_HEAD_BYTES)
            .max_headers(MAX_HEAD_FIELDS)
            .handshake(stream)
            .await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream HTTP/1.1 connection ended");
            }
        });
        Ok(Sender::Http1(sender))
    }

    /// No response head: the request's body failed (the client's fault), or upstream did.
    fn send_failed(&self, pool: &WorkerPool, error: hyper::Error) -> ProxyError {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&error);
        while let Some(e) = cause {
            if let Some(limit) = e.downcast_ref::<BodyLimitExceeded>() {
                return ProxyError::BodyTooLarge { limit: limit.0 };
            }
            if let Some(late) = e.downcast_ref::<BodyReadTimeout>() {
                return ProxyError::BodyReadTimeout(late.to_string());
            }
            cause = e.source();
        }
        if error.is_user() {
            return ProxyError::ClientBody(root_cause(&error));
        }
        match failure_kind(&error) {
            FailureKind::Malformed => {
                self.broken(pool, FailureKind::Malformed, &root_cause(&error))
            }
            kind => self.request_failed(pool, kind, &error),
        }
    }

    fn request_failed(
        &self,
        pool: &WorkerPool,
        kind: FailureKind,
        error: &(dyn std::error::Error + 'static),
    ) -> ProxyError {
        let failure = ProxyError::UpstreamUnreachable(root_cause(error).to_string());
        pool.failures.record(kind, &failure);
        failure
    }

    fn broken(&self, pool: &WorkerPool, kind: FailureKind, why: &str) -> ProxyError {
        let failure = ProxyError::UpstreamBroken(why.to_string());
        pool.failures.record(kind, &failure);
        failure
    }
}

/// A response body whose first frame was read ahead, then the rest. An HTTP/1.1 connection
/// goes back to its pool once the body has ended; one dropped earlier (a client that left
/// mid-stream) is closed, which upstream sees at once.
struct UpstreamBody {
    first: Option<Frame<Bytes>>,
    rest: Incoming,
    held: Held,
}

/// What a reply holds of its connection while its body is read.
enum Held {
    /// An HTTP/1.1 connection of its own, given back to its pool once the body has ended.
    Connection(http1::SendRequest<ProxyBody>, Arc<WorkerPool>),
    /// A stream of a shared HTTP/2 connection, counted against its peer's limit while the
    /// body lives (until dropped).
    Stream { _open: Stream },
    /// Nothing: the connection went back to its pool.
    GivenBack,
}

impl UpstreamBody {
    fn give_back_when_done(&mut self) {
        if self.rest.is_end_stream() && matches!(self.held, Held::Connection(..)) {
            if let Held::Connection(sender, pool) =
                std::mem::replace(&mut self.held, Held::GivenBack)
            {
                pool.put(sender);
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        let frame = std::task::ready!(Pin::new(&mut this.rest).poll_frame(cx));
        if !matches!(frame, Some(Err(_))) {
            this.give_back_when_done();
        }
        Poll::Ready(frame.map(|frame| frame.map_err(BoxError::from)))
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.rest.size_hint();
        let first = self
            .first
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, |data| data.len() as u64);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + first);
        }
        hint.set_lower(hint.lower() + first);
        hint
    }
}

/// An upstream and the APIs it speaks (`None`: any; `config::speaks`).
struct Speaker {
    upstream: Arc<Upstream>,
    apis: Option<Vec<String>>,
}

impl Speaker {
    fn lists(&self, wanted: impl Fn(&str) -> bool) -> bool {
        self.apis
            .as_ref()
            .is_some_and(|listed| listed.iter().any(|api| wanted(api)))
    }

    fn speaks(&self, wanted: impl Fn(&str) -> bool) -> bool {
        self.apis.is_none() || self.lists(wanted)
    }
}

/// The configured upstreams, which model goes where and which API each speaks.
pub struct Upstreams {
    default: Speaker,
    routes: Vec<(Vec<WildMatch>, Speaker)>,
}

impl Upstreams {
    pub fn from_config(
        config: &Config,
        connections: &Connections,
    ) -> Result<Upstreams, ConfigError> {
        let timeout = Duration::from_secs(config.upstream.timeout_secs);
        let speaker = |base_url: &str, api_key_env: &str, apis: &[String]| {
            Upstream::new(base_url, api_key_env, timeout, connections).map(|upstream| Speaker {
                upstream: Arc::new(upstream),
                apis: speaks(base_url, apis),
            })
        };
        let upstream = &config.upstream;
        let default = speaker(&upstream.base_url, &upstream.api_key_env, &upstream.apis)?;
        let routes = config
            .routes
            .iter()
            .map(|route| {
                let patterns = route.models.iter().map(|m| WildMatch::new(m)).collect();
                speaker(&route.base_url, &route.api_key_env, &route.apis)
                    .map(|speaker| (patterns, speaker))
            })
            .collect::<Result<_, _>>()?;
        Ok(Upstreams { default, routes })
    }

    /// The upstream for a request in an API (`wanted`: whether a dialect's name is of it), for
    /// `model` when it names one: the first route whose glob matches the model and that
    /// speaks the API; else the default upstream when it lists the API; else the first route
    /// that lists it; else the default upstream when it speaks any API. `None`: no upstream
    /// speaks it, so no key goes anywhere.
    pub fn for_api(
        &self,
        wanted: impl Fn(&str) -> bool + Copy,
        model: Option<&str>,
    ) -> Option<&Arc<Upstream>> {
        let by_model = model.and_then(|model| {
            self.routes.iter().find(|(patterns, speaker)| {
                speaker.speaks(wanted) && patterns.iter().any(|p| p.matches(model))
            })
        });
        let speaker = by_model
            .map(|(_, speaker)| speaker)
            .or_else(|| Some(&self.default).filter(|default| default.lists(wanted)))
            .or_else(|| {
                self.routes
                    .iter()
                    .map(|(_, speaker)| speaker)
                    .find(|speaker| speaker.lists(wanted))
            })
            .or_else(|| Some(&self.default).filter(|default| default.speaks(wanted)))?;
        Some(&speaker.upstream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::metrics::UpstreamFailures;
    use bytes::Bytes;

    use hyper_util::rt::TokioIo;

    /// The connections a test upstream accepted, and those of them that ended.
    #[derive(Default)]
    struct Seen {
        opened: std::sync::atomic::AtomicUsize,
        ended: std::sync::atomic::AtomicUsize,
    }

    impl Seen {
        fn opened(&self) -> usize {
            self.opened.load(std::sync::atomic::Ordering::SeqCst)
        }

        fn ended(&self) -> usize {
            self.ended.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    /// An HTTPS upstream with the test CA's certificate for localhost, offering only `alpn`;
    /// it answers with the version and path it saw, and counts connections.
    async fn tls_upstream(alpn: &[u8]) -> (String, Arc<Seen>) {
        let held = Arc::new(tokio::sync::Barrier::new(1));
        tls_upstream_holding(alpn, u32::MAX, held, Duration::from_secs(3600)).await
    }

    /// `tls_upstream`, allowing `streams` HTTP/2 streams at once on a connection, holding
    /// each request to `/v1/held` until `held` has as many as it waits for, and closing each
    /// connection `serve_for` after it opened.
    async fn tls_upstream_holding(
        alpn: &[u8],
        streams: u32,
        held: Arc<tokio::sync::Barrier>,
        serve_for: Duration,
    ) -> (String, Arc<Seen>) {
        use hyper::service::service_fn;
        use rustls::pki_types::PrivateKeyDer;
        use std::sync::atomic::Ordering;

        let certs = CertificateDer::pem_file_iter("tests/tls/localhost.pem")
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file("tests/tls/localhost.key").unwrap();
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        config.alpn_protocols = vec![alpn.to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "https://localhost:{}",
            listener.local_addr().unwrap().port()
        );
        let seen = Arc::new(Seen::default());
        let counter = seen.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                counter.opened.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                let held = held.clone();
                let counter = counter.clone();
                tokio::spawn(async move {
                    let tls = TokioIo::new(acceptor.accept(tcp).await.unwrap());
                    let echo = service_fn(|request: Request<hyper::body::Incoming>| {
                        let held = held.clone();
                        async move {
                            if request.uri().path() == "/v1/held" {
                                held.wait().await;
                            }
                            let mut seen =
                                format!("{:?} {}", request.version(), request.uri().path());
                            let (_, body) = request.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            if !body.is_empty() {
                                seen.push_str(&format!(" {}", String::from_utf8_lossy(&body)));
                            }
                            Ok::<_, std::convert::Infallible>(Response::new(
                                crate::transport::body::full(seen),
                            ))
                        }
                    });
                    let h2 = tls.inner().get_ref().1.alpn_protocol() == Some(b"h2");
                    if h2 {
                        let serving =
                            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                .max_concurrent_streams(streams)
                                .serve_connection(tls, echo);
                        let _ = tokio::time::timeout(serve_for, serving).await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(tls, echo)
                            .await;
                    }
                    counter.ended.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        (url, seen)
    }

    fn connections() -> Connections {
        Connections {
            workers: 1,
            idle_timeout: Duration::from_secs(60),
            failures: UpstreamFailures::new().unwrap(),
            events: crate::transport::events::test_bound(1024),
            key_headers: crate::dialect::key_headers(),
        }
    }

    fn test_upstream(url: &str) -> Upstream {
        let tls = tls_config(Some(Path::new("tests/tls/ca.pem"))).unwrap();
        Upstream::with_tls(url, "", Duration::from_secs(5), &connections(), tls).unwrap()
    }

    async fn get_twice(url: &str) -> Vec<String> {
        let upstream = test_upstream(url);
        let mut seen = Vec::new();
        for _ in 0..2 {
            let response = upstream
                .send(
                    Method::GET,
                    "/v1/models",
                    KeyStyle::BEARER,
                    HeaderMap::new(),
                    crate::transport::body::full(Bytes::new()),
                )
                .await
                .unwrap();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            seen.push(String::from_utf8(body.to_vec()).unwrap());
        }
        seen
    }

    #[tokio::test]
    async fn https_upstreams_speak_http2_when_alpn_picks_it_and_keep_one_connection() {
        let (url, connections) = tls_upstream(b"h2").await;
        assert_eq!(get_twice(&url).await, ["HTTP/2.0 /v1/models"; 2]);
        assert_eq!(connections.opened(), 1);
    }

    /// A client's Content-Length no longer describes a rewritten body; each hop states its own.
    #[tokio::test]
    async fn the_body_sent_is_framed_by_its_own_length_on_both_versions() {
        for (alpn, version) in [(&b"h2"[..], "HTTP/2.0"), (b"http/1.1", "HTTP/1.1")] {
            let (url, _) = tls_upstream(alpn).await;
            let upstream = test_upstream(&url);
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
            let response = upstream
                .send(
                    Method::POST,
                    "/v1/chat/completions",
                    KeyStyle::BEARER,
                    headers,
                    crate::transport::body::full(Bytes::from_static(b"{\"rewritten\":true}")),
                )
                .await
                .unwrap();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(
                body,
                format!("{version} /v1/chat/completions {{\"rewritten\":true}}").as_bytes()
            );
        }
    }

    async fn get_at_once(
        upstream: &Upstream,
        path: &str,
        count: usize,
    ) -> Vec<Result<String, String>> {
        let gets = (0..count).map(|_| async {
            let response = upstream
                .send(
                    Method::GET,
                    path,
                    KeyStyle::BEARER,
                    HeaderMap::new(),
                    crate::transport::body::full(Bytes::new()),
                )
                .await
                .map_err(|e| e.to_string())?;
            let body = response.into_body().collect().await.unwrap().to_bytes();
            Ok(String::from_utf8(body.to_vec()).unwrap())
        });
        futures_util::future::join_all(gets).await
    }

    /// Requests that come at once, before any connection is open, wait for the one HTTP/2
    /// connection the first opens; when ALPN says HTTP/1.1 instead, each then opens its own.
    #[tokio::test]
    async fn a_burst_waits_for_one_http2_connection_and_not_for_http1() {
        let (url, connections) = tls_upstream(b"h2").await;
        let upstream = test_upstream(&url);
        let seen = get_at_once(&upstream, "/v1/models", 20).await;
        assert_eq!(seen, vec![Ok("HTTP/2.0 /v1/models".to_string()); 20]);
        assert_eq!(connections.opened(), 1);

        let (url, connections) = tls_upstream(b"http/1.1").await;
        let upstream = test_upstream(&url);
        let seen = get_at_once(&upstream, "/v1/models", 20).await;
        assert_eq!(seen, vec![Ok("HTTP/1.1 /v1/models".to_string()); 20]);
        assert_eq!(connections.opened(), 20);
    }

    /// Past the streams its HTTP/2 connection's peer allows at once, a request goes on
    /// another connection rather than wait for one of them to end: here the third of three
    /// held until all three have come.
    #[tokio::test]
    async fn streams_past_the_peers_limit_go_on_another_connection() {
        let held = Arc::new(tokio::sync::Barrier::new(3));
        let serve_for = Duration::from_secs(3600);
        let (url, connections) = tls_upstream_holding(b"h2", 2, held, serve_for).await;
        let upstream = test_upstream(&url);
        // The peer's limit comes in its SETTINGS: known once it has answered.
        assert!(get_at_once(&upstream, "/v1/models", 1).await[0].is_ok());
        let seen = tokio::time::timeout(
            Duration::from_secs(5),
            get_at_once(&upstream, "/v1/held", 3),
        )
        .await
        .expect("the third request waited");
        assert_eq!(seen, vec![Ok("HTTP/2.0 /v1/held".to_string()); 3]);
        assert_eq!(connections.opened(), 2);
    }

    /// An HTTP/2 connection its peer closed is not used again.
    #[tokio::test]
    async fn a_closed_http2_connection_is_replaced() {
        let held = Arc::new(tokio::sync::Barrier::new(1));
        // Long enough for the first exchange on a loaded machine, which the close must not cut.
        let serve_for = Duration::from_secs(1);
        let (url, connections) = tls_upstream_holding(b"h2", 100, held, serve_for).await;
        let upstream = test_upstream(&url);
        for _ in 0..2 {
            let seen = get_at_once(&upstream, "/v1/models", 1).await;
            assert_eq!(seen, [Ok("HTTP/2.0 /v1/models".to_string())]);
            tokio::time::sleep(serve_for * 2).await;
        }
        assert_eq!(connections.opened(), 2);
    }

    /// An HTTP/2 connection with no stream open for the idle timeout is closed, as an idle
    /// HTTP/1.1 one is, and the next request opens another; one carrying a stream is kept
    /// however long the stream lasts.
    #[tokio::test]
    async fn an_idle_http2_connection_is_closed_and_a_busy_one_is_not() {
        let held = Arc::new(tokio::sync::Barrier::new(2));
        let serve_for = Duration::from_secs(3600);
        let (url, seen) = tls_upstream_holding(b"h2", 100, held.clone(), serve_for).await;
        let idle_timeout = Duration::from_millis(200);
        let pools = Connections {
            idle_timeout,
            ..connections()
        };
        let tls = tls_config(Some(Path::new("tests/tls/ca.pem"))).unwrap();
        let upstream = Upstream::with_tls(&url, "", Duration::from_secs(5), &pools, tls).unwrap();
        let released = async {
            tokio::time::sleep(idle_timeout * 5).await;
            held.wait().await;
        };
        let (got, ()) = tokio::join!(get_at_once(&upstream, "/v1/held", 1), released);
        assert_eq!(got, [Ok("HTTP/2.0 /v1/held".to_string())]);
        assert_eq!(
            (seen.opened(), seen.ended()),
            (1, 0),
            "held past the timeout"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while seen.ended() == 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(idle_timeout).await;
        }
        assert_eq!((seen.opened(), seen.ended()), (1, 1), "closed once idle");
        let again = get_at_once(&upstream, "/v1/models", 1).await;
        assert_eq!(again, [Ok("HTTP/2.0 /v1/models".to_string())]);
        assert_eq!(seen.opened(), 2);
    }

    /// A burst whose first connection fails fails with it, each request with the cause,
    /// rather than each trying in turn.
    #[tokio::test]
    async fn a_burst_waiting_on_a_failed_connection_fails_with_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "https://localhost:{}",
            listener.local_addr().unwrap().port()
        );
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                // Closed at once: the TLS handshake fails.
                drop(listener.accept().await.unwrap());
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let upstream = test_upstream(&url);
        let seen = get_at_once(&upstream, "/v1/models", 20).await;
        assert!(seen.iter().all(|result| result == &seen[0]), "{seen:?}");
        assert!(seen[0].as_ref().is_err_and(|e| !e.is_empty()), "{seen:?}");
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn https_upstreams_speak_http1_over_tls_and_reuse_the_connection() {
        let (url, connections) = tls_upstream(b"http/1.1").await;
        assert_eq!(get_twice(&url).await, ["HTTP/1.1 /v1/models"; 2]);
        assert_eq!(connections.opened(), 1);
    }

    #[test]
    fn extra_roots_must_hold_a_certificate() {
        let empty = tempfile::NamedTempFile::new().unwrap();
        let error = tls_config(Some(empty.path())).unwrap_err();
        assert!(
            error.contains(&empty.path().display().to_string()),
            "{error}"
        );
        assert!(tls_config(Some(Path::new("tests/tls/ca.pem"))).is_ok());
    }

    #[test]
    fn base_with_v1_is_not_doubled() {
        let u =
            Upstream::new("http://h:1/v1/", "", Duration::from_secs(1), &connections()).unwrap();
        assert_eq!(u.url("/v1/models?x=1"), "http://h:1/v1/models?x=1");
        assert_eq!(u.url("/other"), "http://h:1/v1/other");
        let u = Upstream::new(
            "http://h:1/proxy",
            "",
            Duration::from_secs(1),
            &connections(),
        )
        .unwrap();
        assert_eq!(u.url("/v1/models?x=1"), "http://h:1/proxy/v1/models?x=1");
    }
}
