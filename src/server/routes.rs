//! Which handler serves a request, and the per-request count of what was served.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use hyper::{header, Method, Request, Response, StatusCode};

use crate::dialect::openai;
use crate::dialect::stages::Dialect;
use crate::dialect::{self, with_dialect, WithDialect};
use crate::error::ProxyError;
use crate::observe::metrics::Route;
use crate::pipeline;
use crate::pipeline::state::{AppState, Worker};
use crate::server::clean_path::unclean;
use crate::server::passthrough;
use crate::transport::body::{full, ProxyBody};
use crate::transport::departure::{ClientBody, Departure};

/// `departure` watches the client while its request waits: one that leaves has the request's
/// work dropped (its upstream request with it) and is counted as 499.
pub async fn handle(
    worker: Arc<Worker>,
    request: Request<ClientBody>,
    departure: &mut Departure,
) -> Response<ProxyBody> {
    let state = &worker.state;
    let received = Instant::now();
    let method = request.method().clone();
    // A Uri clone shares its bytes: no copy for the log line.
    let uri = request.uri().clone();
    let path = uri.path();
    // Only what a dialect compacts: `/v1/responses/compact`, `/v1/messages/count_tokens`,
    // Gemini's `:countTokens` and the rest pass through.
    let compacting = (method == Method::POST)
        .then(|| dialect::compacting(path))
        .flatten();
    let mut unanswered = Unanswered { state, route: None };
    let (route, result) = if let Some(why) = unclean(path) {
        let refused = ProxyError::invalid(format!("the request path is refused: {why}"), None);
        (Route::OTHER, Err(refused))
    } else if let Some(wire) = compacting {
        let compact = Compact {
            worker: &worker,
            request,
            received,
        };
        let handled = pin!(with_dialect(wire.api, compact));
        unanswered.route = Some(wire.route);
        (wire.route, unless_left(departure, handled).await)
    } else {
        match (&method, path) {
            (&Method::GET, "/healthz") => (Route::HEALTHZ, Ok(text(StatusCode::OK, "ok\n"))),
            (&Method::GET, "/readyz") => (Route::READYZ, Ok(readiness(state))),
            (&Method::GET, "/metrics") => (Route::METRICS, Ok(metrics(state))),
            (_, p) if p.starts_with("/v1/") || dialect::for_path(p).is_some() => {
                let handled = pin!(passthrough::handle(state, request));
                unanswered.route = Some(Route::PASSTHROUGH);
                (Route::PASSTHROUGH, unless_left(departure, handled).await)
            }
            _ => (Route::OTHER, Err(ProxyError::NotFound(path.to_string()))),
        }
    };
    unanswered.route = None;
    // A relayed reply of the pipeline logs its own line when its body ends, with its usage.
    let logged_by_pipeline = compacting.is_some() && result.is_ok();
    let route_name = route.name();
    let response = result.unwrap_or_else(|error| {
        if error.status().is_server_error() {
            tracing::warn!(route = route_name, %error, "request failed");
        } else if matches!(error, ProxyError::ClientLeft) {
            tracing::info!(route = route_name, %error, "request cancelled");
        }
        error_for(path, &error)
    });
    if !logged_by_pipeline {
        let status = response.status().as_u16();
        // Read in the log call, so only when that line is written: a clock read per request.
        let elapsed_ms = || received.elapsed().as_secs_f64() * 1e3;
        if [Route::HEALTHZ, Route::READYZ, Route::METRICS].contains(&route) {
            tracing::debug!(method = %method, path = %path, route = route_name, status, elapsed_ms = elapsed_ms(), "request");
        } else {
            tracing::info!(method = %method, path = %path, route = route_name, status, elapsed_ms = elapsed_ms(), "request");
        }
    }
    state.metrics.count_request(route, response.status());
    response
}

/// What `handled` answers, unless the client leaves first: then it is dropped, and with it
/// any upstream request or summarizer wait of its. Pinned where it was made: a request's
/// future is kilobytes, and moving it in cost ~3,000 instructions per chat request.
async fn unless_left<T>(
    departure: &mut Departure,
    handled: Pin<&mut impl Future<Output = Result<T, ProxyError>>>,
) -> Result<T, ProxyError> {
    tokio::select! {
        biased;
        answered = handled => answered,
        () = departure.left() => Err(ProxyError::ClientLeft),
    }
}

/// A request on `route` whose work was dropped before it answered: hyper drops it when an
/// HTTP/2 client resets its stream (an HTTP/1 client's departure is seen by `departure`, and
/// answered as `ClientLeft`). Counted as 499 all the same.
struct Unanswered<'a> {
    state: &'a AppState,
    route: Option<Route>,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(route) = self.route {
            let left = ProxyError::ClientLeft;
            tracing::info!(route = route.name(), error = %left, "request cancelled");
            self.state.metrics.count_request(route, left.status());
        }
    }
}

/// A request to a dialect's own path, handed to the pipeline in that dialect.
struct Compact<'a> {
    worker: &'a Arc<Worker>,
    request: Request<ClientBody>,
    received: Instant,
}

impl WithDialect for Compact<'_> {
    type Output = Result<Response<ProxyBody>, ProxyError>;

    fn with<D: Dialect + 'static>(self) -> impl Future<Output = Self::Output> {
        pipeline::handle::<D>(self.worker, self.request, self.received)
    }
}

/// An error condenser writes, in the shape of the API whose path was asked (that path or
/// one above it), OpenAI's on paths no dialect serves. Each dialect's clients read errors in
/// their own shape.
pub fn error_for(path: &str, error: &ProxyError) -> Response<ProxyBody> {
    let mut response = match dialect::for_path(path) {
        Some(wire) => (wire.error_response)(error),
        None => openai::error_response(error),
    };
    if let Some(kept) = error.kept_headers() {
        response.headers_mut().extend(kept.clone());
    }
    // What was read of a late body is dropped with its connection: a client that stalled
    // holds nothing more.
    if matches!(error, ProxyError::BodyReadTimeout(_)) {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

fn text(status: StatusCode, body: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(full(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn readiness(state: &AppState) -> Response<ProxyBody> {
    if state.ready.load(Ordering::Relaxed) {
        text(StatusCode::OK, "ready\n")
    } else {
        text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    }
}

fn metrics(state: &AppState) -> Response<ProxyBody> {
    state
        .metrics
        .summary_cache_entries
        .set(i64::try_from(state.compactor.cached_entries()).unwrap_or(i64::MAX));
    let mut response = Response::new(full(state.metrics.render()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
