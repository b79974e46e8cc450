#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Test harness: mock upstreams and condenser itself, in-process on port 0, over real HTTP.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use condenser::body::{full, ProxyBody};
use condenser::{AppState, Config, Server};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path_and_query: String,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

pub type Handler = Arc<
    dyn Fn(Recorded) -> Pin<Box<dyn Future<Output = Response<ProxyBody>> + Send>> + Send + Sync,
>;

pub struct MockUpstream {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
}

impl MockUpstream {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    pub async fn start(handler: Handler) -> MockUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let handler = handler.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let handler = handler.clone();
                        let seen = seen.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let recorded = Recorded {
                                method: parts.method.to_string(),
                                path_and_query: parts
                                    .uri
                                    .path_and_query()
                                    .map(|p| p.to_string())
                                    .unwrap_or_default(),
                                headers: parts.headers,
                                body,
                            };
                            seen.lock().unwrap().push(recorded.clone());
                            Ok::<_, Infallible>(handler(recorded).await)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        MockUpstream { addr, requests }
    }
}

pub fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(Recorded) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    Arc::new(move |r| Box::pin(f(r)))
}

pub fn json_response(status: u16, body: &Value) -> Response<ProxyBody> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(full(Bytes::from(body.to_string())))
        .unwrap()
}

/// A chat completion answering `text`, with usage.
pub fn completion(text: &str, prompt_tokens: u64, completion_tokens: u64) -> Value {
    json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
    })
}

pub struct Proxy {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    shutdown: Option<oneshot::Sender<()>>,
    pub served: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(mut config: Config) -> Proxy {
        config.server.listen = "127.0.0.1:0".into();
        let server = Server::bind(config).await.unwrap();
        let addr = server.local_addr().unwrap();
        let state = server.state();
        let (tx, rx) = oneshot::channel();
        let served = tokio::spawn(server.serve(async {
            let _ = rx.await;
        }));
        Proxy {
            addr,
            state,
            shutdown: Some(tx),
            served,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(self.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

pub fn config_for(upstream: &str) -> Config {
    let mut config = Config::default();
    config.upstream.base_url = upstream.to_string();
    config
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Fails the test instead of hanging when `f` does not finish in time.
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// The value of a metric series, e.g. `condenser_requests_total{route="chat_completions",status="200"}`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.trim().parse().ok())
    })
}
