//! Upstreams: one pooled client each, model-based routing, and relaying requests and
//! responses without collecting their bodies.

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Response, StatusCode};
use wildmatch::WildMatch;

use crate::body::{streaming, ProxyBody};
use crate::config::{Config, ConfigError};
use crate::error::ProxyError;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Upstream {
    base_url: String,
    client: reqwest::Client,
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

impl Upstream {
    pub fn new(
        base_url: &str,
        api_key_env: &str,
        timeout: Duration,
    ) -> Result<Upstream, ConfigError> {
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| {
                ConfigError::Invalid(format!("cannot build a client for {base_url}: {e}"))
            })?;
        Ok(Upstream {
            base_url: base_url.trim_end_matches('/').to_string(),
            client,
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
        match (
            self.base_url.strip_suffix("/v1"),
            path_and_query.starts_with("/v1/"),
        ) {
            (Some(base), true) => format!("{base}{path_and_query}"),
            _ => format!("{}{path_and_query}", self.base_url),
        }
    }

    /// Sends and waits for the response head, never for its body.
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        client_headers: &HeaderMap,
        body: reqwest::Body,
    ) -> Result<reqwest::Response, ProxyError> {
        let mut headers = forwardable_headers(client_headers);
        if !headers.contains_key(header::AUTHORIZATION) {
            if let Some(key) = &self.api_key {
                headers.insert(header::AUTHORIZATION, key.clone());
            }
        }
        let request = self
            .client
            .request(method, self.url(path_and_query))
            .headers(headers)
            .body(body);
        match tokio::time::timeout(self.timeout, request.send()).await {
            Err(_) => Err(ProxyError::UpstreamTimeout(self.timeout.as_secs())),
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(self.classify(&e)),
        }
    }

    fn classify(&self, error: &reqwest::Error) -> ProxyError {
        let mut source = error.source();
        while let Some(cause) = source {
            if let Some(limit) = cause.downcast_ref::<crate::body::BodyLimitExceeded>() {
                return ProxyError::BodyTooLarge { limit: limit.0 };
            }
            source = cause.source();
        }
        if error.is_timeout() && !error.is_connect() {
            ProxyError::UpstreamTimeout(self.timeout.as_secs())
        } else {
            ProxyError::UpstreamUnreachable(format!("{}: {}", self.base_url, root_cause(error)))
        }
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

fn is_hop_by_hop(name: &HeaderName, connection_listed: &[String]) -> bool {
    HOP_BY_HOP.contains(&name.as_str()) || connection_listed.iter().any(|c| c == name.as_str())
}

fn connection_listed(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_ascii_lowercase())
        .collect()
}

/// The client's headers minus hop-by-hop ones and Host (the upstream's own is set).
pub fn forwardable_headers(headers: &HeaderMap) -> HeaderMap {
    let listed = connection_listed(headers);
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if name != header::HOST && !is_hop_by_hop(name, &listed) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// The upstream's response, head copied and body relayed as it arrives.
pub fn relay_response(response: reqwest::Response) -> Response<ProxyBody> {
    let (head, body) = response_head(&response);
    let mut out = Response::new(streaming(response.bytes_stream()));
    *out.status_mut() = head;
    *out.headers_mut() = body;
    out
}

/// Status and forwardable headers of an upstream response.
pub fn response_head(response: &reqwest::Response) -> (StatusCode, HeaderMap) {
    let listed = connection_listed(response.headers());
    let mut headers = HeaderMap::with_capacity(response.headers().len());
    for (name, value) in response.headers() {
        if !is_hop_by_hop(name, &listed) {
            headers.append(name.clone(), value.clone());
        }
    }
    (response.status(), headers)
}

/// The configured upstreams and which model goes where.
pub struct Upstreams {
    default: Arc<Upstream>,
    routes: Vec<(Vec<WildMatch>, Arc<Upstream>)>,
}

impl Upstreams {
    pub fn from_config(config: &Config) -> Result<Upstreams, ConfigError> {
        let timeout = Duration::from_secs(config.upstream.timeout_secs);
        let default = Arc::new(Upstream::new(
            &config.upstream.base_url,
            &config.upstream.api_key_env,
            timeout,
        )?);
        let routes = config
            .routes
            .iter()
            .map(|route| {
                let patterns = route.models.iter().map(|m| WildMatch::new(m)).collect();
                Upstream::new(&route.base_url, &route.api_key_env, timeout)
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
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert(header::HOST, HeaderValue::from_static("proxy"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        let out = forwardable_headers(&h);
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out.contains_key("x-kept"));
    }

    #[test]
    fn base_with_v1_is_not_doubled() {
        let u = Upstream::new("http://h:1/v1/", "", Duration::from_secs(1)).unwrap();
        assert_eq!(u.url("/v1/models?x=1"), "http://h:1/v1/models?x=1");
        let u = Upstream::new("http://h:1/proxy", "", Duration::from_secs(1)).unwrap();
        assert_eq!(u.url("/v1/models"), "http://h:1/proxy/v1/models");
    }
}
