//! Upstreams: connection pools per server worker, model-based routing, and relaying requests
//! and responses without collecting their bodies.

use std::borrow::Cow;
use std::cell::Cell;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::client::conn::http2;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connection as _, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tower_service::Service;
use wildmatch::WildMatch;

use crate::config::{Config, ConfigError};
use crate::error::ProxyError;
use crate::http::body::{with_idle_timeout, BodyLimitExceeded, BoxError, ProxyBody};
use crate::http::egress::Egress;
use crate::http::h1::{self, strip_hop_by_hop, RequestBody};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

thread_local! {
    static POOL: Cell<usize> = const { Cell::new(0) };
}

/// Requests sent from this thread use connection pool `index` of each upstream. A server
/// worker picks its own, so its upstream connections live on its own event loop.
pub fn use_pool(index: usize) {
    POOL.with(|pool| pool.set(index));
}

/// One server worker's connections to one upstream: idle HTTP/1.1 ones, or the HTTP/2 one
/// that all of the worker's requests share once ALPN has chosen it.
#[derive(Default)]
struct WorkerPool {
    http1: Arc<h1::Pool>,
    http2: Mutex<Option<http2::SendRequest<ProxyBody>>>,
}

impl WorkerPool {
    fn live_http2(&self) -> Option<http2::SendRequest<ProxyBody>> {
        let mut slot = self.http2.lock().ok()?;
        match slot.as_ref() {
            Some(sender) if !sender.is_closed() => Some(sender.clone()),
            _ => {
                *slot = None;
                None
            }
        }
    }
}

/// Where a request goes: an HTTP/1.1 connection (idle or new), or the worker's HTTP/2 one.
enum Fresh {
    Http1(h1::Connection),
    Http2(http2::SendRequest<ProxyBody>),
}

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
    host: String,
    connector: HttpsConnector<Egress>,
    pools: Vec<WorkerPool>,
    api_key: Option<HeaderValue>,
    timeout: Duration,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// The value of an environment variable named by an `api_key_env`, as a Bearer header.
pub fn bearer_from_env(var: &str) -> Result<Option<HeaderValue>, ConfigError> {
    if var.is_empty() {
        return Ok(None);
    }
    match std::env::var(var) {
        Ok(key) if !key.is_empty() => HeaderValue::from_str(&format!("Bearer {key}"))
            .map(|mut v| {
                v.set_sensitive(true);
                Some(v)
            })
            .map_err(|_| {
                ConfigError::Invalid(format!("{var} holds characters not allowed in a header"))
            }),
        _ => {
            tracing::warn!(
                var,
                "api_key_env names an unset variable; requests go without a key"
            );
            Ok(None)
        }
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
        pools: usize,
    ) -> Result<Upstream, ConfigError> {
        let extra_roots = std::env::var_os(EXTRA_ROOTS_ENV).filter(|file| !file.is_empty());
        let tls = tls_config(extra_roots.as_deref().map(Path::new))
            .map_err(|e| ConfigError::Invalid(format!("cannot set up TLS for {base_url}: {e}")))?;
        Upstream::with_tls(base_url, api_key_env, timeout, pools, tls)
    }

    fn with_tls(
        base_url: &str,
        api_key_env: &str,
        timeout: Duration,
        pools: usize,
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
        let host = authority
            .as_str()
            .rsplit('@')
            .next()
            .unwrap_or_default()
            .to_string();
        let base_path = parsed.path().trim_end_matches('/').to_string();
        let path_base = base_url
            .strip_suffix("/v1")
            .unwrap_or(&base_url)
            .to_string();
        let egress = egress();
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
        Ok(Upstream {
            path_base_path: base_path
                .strip_suffix("/v1")
                .unwrap_or(&base_path)
                .to_string(),
            base_path,
            path_base,
            base_url,
            origin,
            host,
            connector,
            pools: (0..pools.max(1)).map(|_| WorkerPool::default()).collect(),
            api_key: bearer_from_env(api_key_env)?,
            timeout,
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

    /// The request target sent upstream: [`Upstream::url`]'s path and query.
    fn target<'a>(&self, path_and_query: &'a str) -> Cow<'a, str> {
        let base = if path_and_query.starts_with("/v1/") {
            &self.path_base_path
        } else {
            &self.base_path
        };
        if base.is_empty() {
            Cow::Borrowed(path_and_query)
        } else {
            Cow::Owned(format!("{base}{path_and_query}"))
        }
    }

    /// Sends and waits for the response head, never for its body. The body fails once
    /// upstream stays silent for the upstream timeout. The response's headers are its own:
    /// HTTP/1.1 leaves hop-by-hop ones out as it reads them, and HTTP/2 has none.
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        client_headers: HeaderMap,
        body: RequestBody,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let mut headers = forwardable_headers(client_headers);
        if !headers.contains_key(header::AUTHORIZATION) {
            if let Some(key) = &self.api_key {
                headers.insert(header::AUTHORIZATION, key.clone());
            }
        }
        let exchange = self.exchange(method, path_and_query, headers, body);
        match tokio::time::timeout(self.timeout, exchange).await {
            Err(_) => Err(ProxyError::UpstreamTimeout(self.timeout.as_secs())),
            Ok(result) => result,
        }
    }

    async fn exchange(
        &self,
        method: Method,
        path_and_query: &str,
        headers: HeaderMap,
        body: RequestBody,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let pool = &self.pools[POOL.with(Cell::get) % self.pools.len()];
        // Connecting and HTTP/2 are boxed: their futures are kilobytes, and the common case
        // (an idle HTTP/1.1 connection) would otherwise carry and copy them on every request.
        let fresh = match pool.http1.take(POOL_IDLE_TIMEOUT) {
            Some(connection) => Fresh::Http1(connection),
            None => match pool.live_http2() {
                Some(sender) => Fresh::Http2(sender),
                None => Box::pin(self.connect(pool))
                    .await
                    .map_err(|e| self.unreachable(&*e))?,
            },
        };
        let connection = match fresh {
            Fresh::Http1(connection) => connection,
            Fresh::Http2(sender) => {
                return Box::pin(self.exchange_http2(sender, method, path_and_query, headers, body))
                    .await
            }
        };
        let expects_body = method != Method::HEAD;
        let request = h1::encode_request(
            &method,
            &self.target(path_and_query),
            &self.host,
            &headers,
            body,
        );
        let reconnect = || async {
            match Box::pin(self.connect(pool)).await? {
                Fresh::Http1(connection) => Ok(connection),
                Fresh::Http2(_) => Err(BoxError::from("upstream switched to HTTP/2")),
            }
        };
        match h1::send(&pool.http1, connection, reconnect, request, expects_body).await {
            Ok(response) => {
                Ok(response.map(|body| with_idle_timeout(body, self.timeout).boxed_unsync()))
            }
            Err(h1::SendError::Connect(e)) => Err(self.unreachable(&*e)),
            Err(h1::SendError::Exchange(h1::ExchangeError::RequestBody(e))) => {
                Err(match e.downcast_ref::<BodyLimitExceeded>() {
                    Some(limit) => ProxyError::BodyTooLarge { limit: limit.0 },
                    None => ProxyError::ClientBody(e.to_string()),
                })
            }
            Err(h1::SendError::Exchange(e)) => Err(self.unreachable(&e)),
        }
    }

    async fn connect(&self, pool: &WorkerPool) -> Result<Fresh, BoxError> {
        let mut connector = self.connector.clone();
        std::future::poll_fn(|cx| connector.poll_ready(cx)).await?;
        let stream = connector.call(self.origin.clone()).await?;
        if !stream.connected().is_negotiated_h2() {
            return Ok(Fresh::Http1(h1::Connection::new(TokioIo::new(stream))));
        }
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(stream)
            .await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
            }
        });
        if let Ok(mut slot) = pool.http2.lock() {
            *slot = Some(sender.clone());
        }
        Ok(Fresh::Http2(sender))
    }

    async fn exchange_http2(
        &self,
        mut sender: http2::SendRequest<ProxyBody>,
        method: Method,
        path_and_query: &str,
        mut headers: HeaderMap,
        body: RequestBody,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        // Framing belongs to this hop, and the body may have been rewritten: hyper states the
        // length of what is sent, as `h1::encode_request` does over HTTP/1.1.
        headers.remove(header::CONTENT_LENGTH);
        let uri = Uri::try_from(self.url(path_and_query)).map_err(|e| self.unreachable(&e))?;
        let mut request = Request::new(body.into_proxy_body());
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        match sender.send_request(request).await {
            Ok(response) => Ok(response.map(|body| {
                with_idle_timeout(body.map_err(Into::into), self.timeout).boxed_unsync()
            })),
            Err(e) => {
                let mut source = std::error::Error::source(&e);
                while let Some(cause) = source {
                    if let Some(limit) = cause.downcast_ref::<BodyLimitExceeded>() {
                        return Err(ProxyError::BodyTooLarge { limit: limit.0 });
                    }
                    source = cause.source();
                }
                Err(self.unreachable(&e))
            }
        }
    }

    fn unreachable(&self, error: &dyn std::error::Error) -> ProxyError {
        ProxyError::UpstreamUnreachable(format!("{}: {}", self.base_url, root_cause(error)))
    }
}

fn root_cause(error: &dyn std::error::Error) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// The client's headers minus hop-by-hop ones and Host (the upstream's own is set).
pub fn forwardable_headers(mut headers: HeaderMap) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers
}

/// The configured upstreams and which model goes where.
pub struct Upstreams {
    default: Arc<Upstream>,
    routes: Vec<(Vec<WildMatch>, Arc<Upstream>)>,
}

impl Upstreams {
    pub fn from_config(config: &Config) -> Result<Upstreams, ConfigError> {
        let timeout = Duration::from_secs(config.upstream.timeout_secs);
        let pools = config.server.worker_count();
        let default = Arc::new(Upstream::new(
            &config.upstream.base_url,
            &config.upstream.api_key_env,
            timeout,
            pools,
        )?);
        let routes = config
            .routes
            .iter()
            .map(|route| {
                let patterns = route.models.iter().map(|m| WildMatch::new(m)).collect();
                Upstream::new(&route.base_url, &route.api_key_env, timeout, pools)
                    .map(|u| (patterns, Arc::new(u)))
            })
            .collect::<Result<_, _>>()?;
        Ok(Upstreams { default, routes })
    }

    /// The first route whose glob matches the model, else the default upstream.
    pub fn for_model(&self, model: Option<&str>) -> &Arc<Upstream> {
        model
            .and_then(|model| {
                self.routes
                    .iter()
                    .find(|(patterns, _)| patterns.iter().any(|p| p.matches(model)))
                    .map(|(_, upstream)| upstream)
            })
            .unwrap_or(&self.default)
    }

    pub fn default_upstream(&self) -> &Arc<Upstream> {
        &self.default
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::h1::HOP_BY_HOP;

    #[test]
    fn hop_by_hop_and_connection_listed_headers_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Secret-Hop,,"),
        );
        h.append(header::CONNECTION, HeaderValue::from_static("x-other-hop"));
        h.append(
            header::CONNECTION,
            HeaderValue::from_bytes(b"x-kept, caf\xe9").unwrap(),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("x-other-hop", HeaderValue::from_static("1"));
        h.insert(header::HOST, HeaderValue::from_static("proxy"));
        for name in HOP_BY_HOP {
            h.append(name, HeaderValue::from_static("1"));
        }
        h.insert("x-kept", HeaderValue::from_static("1"));
        h.append("x-kept", HeaderValue::from_static("2"));
        let out = forwardable_headers(h);
        assert_eq!(out.keys().collect::<Vec<_>>(), ["x-kept"], "{out:?}");
        assert_eq!(out.get_all("x-kept").iter().count(), 2);
    }

    /// An HTTPS upstream with the test CA's certificate for localhost, offering only `alpn`;
    /// it answers with the version and path it saw, and counts connections.
    async fn tls_upstream(alpn: &[u8]) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use hyper::service::service_fn;
        use rustls::pki_types::PrivateKeyDer;
        use std::sync::atomic::{AtomicUsize, Ordering};

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
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let tls = TokioIo::new(acceptor.accept(tcp).await.unwrap());
                    let echo = service_fn(|request: Request<hyper::body::Incoming>| async move {
                        let mut seen = format!("{:?} {}", request.version(), request.uri().path());
                        let (_, body) = request.into_parts();
                        let body = body
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        if !body.is_empty() {
                            seen.push_str(&format!(" {}", String::from_utf8_lossy(&body)));
                        }
                        Ok::<_, std::convert::Infallible>(Response::new(crate::http::body::full(
                            seen,
                        )))
                    });
                    let h2 = tls.inner().get_ref().1.alpn_protocol() == Some(b"h2");
                    if h2 {
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(tls, echo)
                            .await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(tls, echo)
                            .await;
                    }
                });
            }
        });
        (url, connections)
    }

    async fn get_twice(url: &str) -> Vec<String> {
        let tls = tls_config(Some(Path::new("tests/tls/ca.pem"))).unwrap();
        let upstream = Upstream::with_tls(url, "", Duration::from_secs(5), 1, tls).unwrap();
        let mut seen = Vec::new();
        for _ in 0..2 {
            let response = upstream
                .send(
                    Method::GET,
                    "/v1/models",
                    HeaderMap::new(),
                    RequestBody::Full(Default::default()),
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
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// A client's Content-Length no longer describes a rewritten body; each hop states its own.
    #[tokio::test]
    async fn the_body_sent_is_framed_by_its_own_length_on_both_versions() {
        for (alpn, version) in [(&b"h2"[..], "HTTP/2.0"), (b"http/1.1", "HTTP/1.1")] {
            let (url, _) = tls_upstream(alpn).await;
            let tls = tls_config(Some(Path::new("tests/tls/ca.pem"))).unwrap();
            let upstream = Upstream::with_tls(&url, "", Duration::from_secs(5), 1, tls).unwrap();
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
            let response = upstream
                .send(
                    Method::POST,
                    "/v1/chat/completions",
                    headers,
                    RequestBody::Full(bytes::Bytes::from_static(b"{\"rewritten\":true}")),
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

    #[tokio::test]
    async fn https_upstreams_speak_http1_over_tls_and_reuse_the_connection() {
        let (url, connections) = tls_upstream(b"http/1.1").await;
        assert_eq!(get_twice(&url).await, ["HTTP/1.1 /v1/models"; 2]);
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
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
        let u = Upstream::new("http://h:1/v1/", "", Duration::from_secs(1), 1).unwrap();
        assert_eq!(u.url("/v1/models?x=1"), "http://h:1/v1/models?x=1");
        let u = Upstream::new("http://h:1/proxy", "", Duration::from_secs(1), 1).unwrap();
        assert_eq!(u.url("/v1/models"), "http://h:1/proxy/v1/models");
        // What goes on the request line is the same URL's path and query.
        assert_eq!(u.target("/v1/models?x=1"), "/proxy/v1/models?x=1");
        let u = Upstream::new("http://h:1/v1/", "", Duration::from_secs(1), 1).unwrap();
        assert_eq!(u.target("/v1/models?x=1"), "/v1/models?x=1");
        assert_eq!(u.target("/other"), "/v1/other");
        assert_eq!(u.host, "h:1");
        let u = Upstream::new(
            "https://user:pw@api.example.com",
            "",
            Duration::from_secs(1),
            1,
        )
        .unwrap();
        assert_eq!(u.host, "api.example.com");
        assert_eq!(u.origin, "https://user:pw@api.example.com/");
    }
}
