//! How connections to upstreams leave the host: directly, or for `https` upstreams through
//! the HTTP proxy that `HTTPS_PROXY`/`ALL_PROXY` name (minus `NO_PROXY`), with a CONNECT
//! tunnel that TLS then runs inside, as curl and most SDKs do.
//!
//! `http` upstreams are always reached directly: a plain-HTTP request through a forward proxy
//! needs absolute-form request lines, and upstreams reached over plain HTTP are in practice
//! local gateways. A proxy that condenser would not use is named at start-up, never skipped
//! in silence.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::Uri;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::proxy::matcher::{Intercept, Matcher};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service;

use crate::transport::body::BoxError;

/// A connector that tunnels through the configured proxy where one applies.
#[derive(Clone)]
pub struct Egress {
    direct: HttpConnector,
    proxies: Arc<Matcher>,
}

impl Egress {
    pub fn new(direct: HttpConnector, proxies: Matcher) -> Egress {
        Egress {
            direct,
            proxies: Arc::new(proxies),
        }
    }

    /// Whether the proxy the environment names for `dst`, if any, is one condenser uses. A
    /// CONNECT tunnel is opened to a plain-HTTP proxy only: an `https://` (or SOCKS) proxy
    /// URL for an `https` upstream is refused, as talking to it in plain text would fail on
    /// every request. A proxy named for an `http` upstream is reported and not used.
    pub fn check(&self, dst: &Uri) -> Result<(), String> {
        let Some(intercept) = self.proxies.intercept(dst) else {
            return Ok(());
        };
        let proxy = intercept.uri();
        // Credentials in the proxy URL stay out of messages.
        let named = format!(
            "{}://{}",
            proxy.scheme_str().unwrap_or(""),
            proxy.host().unwrap_or("")
        );
        match (dst.scheme_str(), proxy.scheme_str()) {
            (Some("https"), Some("http")) => Ok(()),
            (Some("https"), _) => Err(format!(
                "the environment (HTTPS_PROXY or ALL_PROXY) names the proxy {named}, and \
                 condenser reaches upstreams only through http:// proxies (a CONNECT tunnel \
                 with TLS inside it); name an http:// proxy, or put the host in NO_PROXY"
            )),
            _ => {
                tracing::warn!(
                    upstream = %dst,
                    proxy = %named,
                    "http upstreams are reached directly; the proxy the environment names is not used"
                );
                Ok(())
            }
        }
    }

    /// The HTTP proxy `dst` is reached through, if any.
    pub fn proxy_for(&self, dst: &Uri) -> Option<Intercept> {
        if dst.scheme_str() != Some("https") {
            return None;
        }
        self.proxies
            .intercept(dst)
            .filter(|intercept| intercept.uri().scheme_str() == Some("http"))
    }
}

type Connecting = Pin<Box<dyn Future<Output = Result<TokioIo<TcpStream>, BoxError>> + Send>>;

impl Service<Uri> for Egress {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.direct.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Connecting {
        match self.proxy_for(&dst) {
            None => {
                let connecting = self.direct.call(dst);
                Box::pin(async move { connecting.await.map_err(Into::into) })
            }
            Some(intercept) => {
                let mut tunnel = Tunnel::new(intercept.uri().clone(), self.direct.clone());
                if let Some(auth) = intercept.basic_auth() {
                    tunnel = tunnel.with_auth(auth.clone());
                }
                Box::pin(async move {
                    std::future::poll_fn(|cx| tunnel.poll_ready(cx)).await?;
                    Ok(tunnel.call(dst).await?)
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A proxy that answers one CONNECT with 200 and then echoes, recording the request.
    async fn echo_proxy() -> (String, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let served = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                stream.read_exact(&mut byte).await.unwrap();
                head.push(byte[0]);
            }
            stream
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .unwrap();
            let mut buf = [0u8; 5];
            stream.read_exact(&mut buf).await.unwrap();
            stream.write_all(&buf).await.unwrap();
            String::from_utf8(head).unwrap()
        });
        (url, served)
    }

    fn egress(matcher: Matcher) -> Egress {
        let mut direct = HttpConnector::new();
        direct.enforce_http(false);
        Egress::new(direct, matcher)
    }

    #[tokio::test]
    async fn https_upstreams_are_tunnelled_through_the_proxy_with_its_credentials() {
        let (proxy, served) = echo_proxy().await;
        let with_user = proxy.replace("http://", "http://user:secret@");
        let mut egress = egress(Matcher::builder().https(with_user).build());
        let dst: Uri = "https://api.example.test/v1".parse().unwrap();
        let mut io = egress.call(dst).await.unwrap().into_inner();
        io.write_all(b"hello").await.unwrap();
        let mut echoed = [0u8; 5];
        io.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"hello");
        let head = served.await.unwrap();
        assert!(
            head.starts_with("CONNECT api.example.test:443 HTTP/1.1\r\n"),
            "{head}"
        );
        // user:secret in base64.
        assert!(
            head.contains("Proxy-Authorization: Basic dXNlcjpzZWNyZXQ="),
            "{head}"
        );
    }

    #[test]
    fn proxies_other_than_plain_http_are_refused_for_https_upstreams() {
        let https: Uri = "https://api.openai.com".parse().unwrap();
        for proxy in [
            "https://user:secret@proxy.test:8443",
            "socks5://proxy.test:1080",
        ] {
            let refused = egress(Matcher::builder().https(proxy).build());
            let error = refused.check(&https).unwrap_err();
            assert!(error.contains("proxy.test"), "{error}");
            assert!(!error.contains("secret"), "{error}");
        }
        let tunnelled = egress(Matcher::builder().https("http://proxy.test:3128").build());
        assert_eq!(tunnelled.check(&https), Ok(()));
        // An http upstream goes direct whatever the environment names, and says so.
        let http: Uri = "http://gateway.test".parse().unwrap();
        let direct = egress(Matcher::builder().http("https://proxy.test:8443").build());
        assert_eq!(direct.check(&http), Ok(()));
        assert!(direct.proxy_for(&http).is_none());
    }

    #[test]
    fn plain_http_and_no_proxy_hosts_go_direct() {
        let egress = egress(
            Matcher::builder()
                .all("http://127.0.0.1:9")
                .no("internal.test")
                .build(),
        );
        let proxied = |url: &str| egress.proxy_for(&url.parse().unwrap()).is_some();
        assert!(proxied("https://api.openai.com"));
        assert!(!proxied("http://api.openai.com"));
        assert!(!proxied("https://internal.test"));
    }
}
