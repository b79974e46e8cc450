//! The admin listener (`[admin] listen`): a second port, never the proxy's, that serves
//! `GET /sessions`, the recent sessions drawn as `condenser replay --html` draws one. Its
//! page holds what the metrics and the observer's session records hold (counts, actions,
//! cache breaks, the bill), never a key, and prompt text only with `admin.prompt_text`.
//! It has no authentication of its own: docs/security.md says who should reach it.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::cli::report::{self, SessionView};
use crate::pipeline::state::AppState;
use crate::transport::body::{full, ProxyBody};

/// A client of the admin page that sends no request head this long is let go.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves the admin page until `stopped` turns true.
pub async fn serve(
    listener: std::net::TcpListener,
    state: Arc<AppState>,
    mut stopped: watch::Receiver<bool>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, "cannot register the admin listener");
            return;
        }
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let state = state.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(answer(&state, &request)) }
                    });
                    let served = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_READ_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    if let Err(error) = served {
                        tracing::debug!(%error, "admin connection ended with an error");
                    }
                });
            }
            changed = stopped.wait_for(|stop| *stop) => {
                let _ = changed;
                break;
            }
        }
    }
}

fn answer(state: &AppState, request: &Request<Incoming>) -> Response<ProxyBody> {
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/sessions") => {
            let sessions = state
                .recent
                .as_ref()
                .map(|recent| recent.snapshot())
                .unwrap_or_default();
            let views: Vec<SessionView<'_>> = sessions
                .iter()
                .map(|session| SessionView {
                    records: session
                        .records
                        .iter()
                        .enumerate()
                        .map(|(i, record)| (session.dropped + i + 1, record))
                        .collect(),
                    dropped: session.dropped,
                })
                .collect();
            let page = report::page("condenser: recent sessions", &views);
            reply(StatusCode::OK, "text/html; charset=utf-8", page)
        }
        (_, "/sessions") => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "GET /sessions only\n".to_string(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: the admin listener serves GET /sessions\n".to_string(),
        ),
    }
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<ProxyBody> {
    let mut response = Response::new(full(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    // The page is the operator's: never cached on the way, never framed by another site.
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    headers.insert(
        header::X_FRAME_OPTIONS,
        header::HeaderValue::from_static("DENY"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
    );
    response
}
