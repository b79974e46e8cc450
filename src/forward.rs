//! Upstreams: a pooled client per server worker each, model-based routing, and relaying
//! requests and responses without collecting their bodies.

use std::cell::Cell;
use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use wildmatch::WildMatch;

use crate::body::{with_idle_timeout, BodyLimitExceeded, ProxyBody};
use crate::config::{Config, ConfigError};
use crate::egress::Egress;
use crate::error::ProxyError;
use crate::routes::CHAT_COMPLETIONS;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

type HttpsClient = Client<hyper_rustls::HttpsConnector<Egress>, ProxyBody>;

thread_local! {
    static POOL: Cell<usize> = const { Cell::new(0) };
}

/// Requests sent from this thread use connection pool `index` of each upstream. A server
/// worker picks its own, so its upstream connections live on its own event loop.
pub fn use_pool(index: usize) {
    POOL.with(|pool| pool.set(index));
}

pub struct Upstream {
    base_url: String,
    /// `base_url` without a trailing `/v1`, which request paths bring themselves.
    path_base: String,
    /// One client (and so one connection pool) per server worker.
    clients: Vec<HttpsClient>,
    /// The chat-completions URI, parsed once: nearly every request goes there.
    chat_uri: Uri,
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

/// TLS that trusts the Mozilla root set, with ring named as the crypto provider: rustls
/// refuses to guess when more than one provider is compiled in.
fn tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth())
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

/// A pooled HTTP/1.1 and HTTP/2 (ALPN) client.
fn build_client(tls: rustls::ClientConfig, egress: Egress) -> HttpsClient {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(egress);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector)
}

impl Upstream {
    pub fn new(
        base_url: &str,
        api_key_env: &str,
        timeout: Duration,
        pools: usize,
    ) -> Result<Upstream, ConfigError> {
        let tls = tls_config()
            .map_err(|e| ConfigError::Invalid(format!("cannot set up TLS for {base_url}: {e}")))?;
        let egress = egress();
        let clients = (0..pools.max(1))
            .map(|_| build_client(tls.clone(), egress.clone()))
            .collect();
        let base_url = base_url.trim_end_matches('/').to_string();
        let mut upstream = Upstream {
            path_base: base_url
                .strip_suffix("/v1")
                .unwrap_or(&base_url)
                .to_string(),
            base_url,
            clients,
            chat_uri: Uri::default(),
            api_key: bearer_from_env(api_key_env)?,
            timeout,
        };
        upstream.chat_uri = Uri::try_from(upstream.url(CHAT_COMPLETIONS)).map_err(|e| {
            ConfigError::Invalid(format!("{}: not a usable base URL: {e}", upstream.base_url))
        })?;
        if let Some(proxy) = egress.proxy_for(&upstream.chat_uri) {
            tracing::info!(
                upstream = %upstream.base_url,
                proxy = proxy.uri().host().unwrap_or(""),
                "upstream reached through the proxy from the environment"
            );
        }
        Ok(upstream)
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

    /// Sends and waits for the response head, never for its body. The body fails once
    /// upstream stays silent for the upstream timeout.
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        client_headers: HeaderMap,
        body: ProxyBody,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let mut headers = forwardable_headers(client_headers);
        if !headers.contains_key(header::AUTHORIZATION) {
            if let Some(key) = &self.api_key {
                headers.insert(header::AUTHORIZATION, key.clone());
            }
        }
        let uri = if path_and_query == CHAT_COMPLETIONS {
            self.chat_uri.clone()
        } else {
            Uri::try_from(self.url(path_and_query)).map_err(|e| {
                ProxyError::UpstreamUnreachable(format!("{}: bad request path: {e}", self.base_url))
            })?
        };
        let mut request = Request::new(body);
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        let client = &self.clients[POOL.with(Cell::get) % self.clients.len()];
        match tokio::time::timeout(self.timeout, client.request(request)).await {
            Err(_) => Err(ProxyError::UpstreamTimeout(self.timeout.as_secs())),
            Ok(Ok(response)) => Ok(response.map(|body| {
                with_idle_timeout(body.map_err(Into::into), self.timeout).boxed_unsync()
            })),
            Ok(Err(e)) => Err(self.classify(&e)),
        }
    }

    fn classify(&self, error: &hyper_util::client::legacy::Error) -> ProxyError {
        let mut source = error.source();
        while let Some(cause) = source {
            if let Some(limit) = cause.downcast_ref::<BodyLimitExceeded>() {
                return ProxyError::BodyTooLarge { limit: limit.0 };
            }
            source = cause.source();
        }
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

/// Headers that describe one hop, not the request: never forwarded either way.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Case-insensitive, as Connection tokens are.
fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP.iter().any(|hop| hop.eq_ignore_ascii_case(name))
}

/// The names the Connection header lists as hop-by-hop too, as written; a value that is not
/// text is skipped whole.
fn connection_listed(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// The client's headers minus hop-by-hop ones and Host (the upstream's own is set).
pub fn forwardable_headers(mut headers: HeaderMap) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers
}

/// The upstream's response with its hop-by-hop headers dropped; the body is relayed as it
/// arrives.
pub fn relay_response(mut response: Response<ProxyBody>) -> Response<ProxyBody> {
    strip_hop_by_hop(response.headers_mut());
    response
}

/// Drops the headers that describe one hop, not the message, removing them in the map's
/// order (which decides the order of those left). The two common shapes allocate nothing:
/// no hop-by-hop header at all, and a Connection header alone (nginx sends
/// `Connection: keep-alive` on every response) that lists no other header present.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let fixed = headers
        .keys()
        .filter(|name| is_hop_by_hop(name.as_str()))
        .count();
    if fixed == 0 {
        return;
    }
    let lone_connection = fixed == 1
        && headers.contains_key(header::CONNECTION)
        && !connection_listed(headers)
            .any(|token| !is_hop_by_hop(token) && headers.contains_key(token));
    if lone_connection {
        headers.remove(header::CONNECTION);
        return;
    }
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|name| {
            is_hop_by_hop(name.as_str())
                || connection_listed(headers).any(|token| token.eq_ignore_ascii_case(name.as_str()))
        })
        .cloned()
        .collect();
    for name in doomed {
        headers.remove(name);
    }
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
            h.append(*name, HeaderValue::from_static("1"));
        }
        h.insert("x-kept", HeaderValue::from_static("1"));
        h.append("x-kept", HeaderValue::from_static("2"));
        let out = forwardable_headers(h);
        assert_eq!(out.keys().collect::<Vec<_>>(), ["x-kept"], "{out:?}");
        assert_eq!(out.get_all("x-kept").iter().count(), 2);
    }

    #[test]
    fn each_hop_by_hop_header_is_dropped_without_a_connection_header() {
        for name in [
            "keep-alive",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
        ] {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static("1"));
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h.keys().collect::<Vec<_>>(), ["content-type"], "{name}");
        }
    }

    #[test]
    fn a_lone_connection_header_is_dropped_and_nothing_else() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Keep-Alive"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("317"));
        h.insert("x-request-id", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-length", "x-request-id"]);

        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, not a name, X-Hop"),
        );
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("317"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().collect::<Vec<_>>(), ["content-length"]);
    }

    #[test]
    fn the_headers_left_keep_the_order_of_removing_in_map_order() {
        let mut h = HeaderMap::new();
        for name in [
            "a",
            "te",
            "b",
            "connection",
            "c",
            "x-hop",
            "d",
            "upgrade",
            "e",
        ] {
            h.insert(name, HeaderValue::from_static("x-hop"));
        }
        let mut expected = h.clone();
        for name in ["te", "connection", "x-hop", "upgrade"] {
            expected.remove(name);
        }
        strip_hop_by_hop(&mut h);
        assert!(h.iter().eq(expected.iter()), "{h:?}");
    }

    #[test]
    fn headers_without_hop_by_hop_ones_are_left_as_they_are() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("a/b"));
        h.insert("x-keep-alive-ish", HeaderValue::from_static("1"));
        h.append("x-keep-alive-ish", HeaderValue::from_static("2"));
        let before = h.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, before);
    }

    #[test]
    fn base_with_v1_is_not_doubled() {
        let u = Upstream::new("http://h:1/v1/", "", Duration::from_secs(1), 1).unwrap();
        assert_eq!(u.url("/v1/models?x=1"), "http://h:1/v1/models?x=1");
        let u = Upstream::new("http://h:1/proxy", "", Duration::from_secs(1), 1).unwrap();
        assert_eq!(u.url("/v1/models"), "http://h:1/proxy/v1/models");
    }
}
