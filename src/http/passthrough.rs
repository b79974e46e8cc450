//! Every `/v1/` path but chat completions: relayed as is, both bodies streaming.

use hyper::body::Incoming;
use hyper::{header, Request, Response};

use crate::app::AppState;
use crate::error::ProxyError;
use crate::http::body::{full, limited, ProxyBody};

pub async fn handle(
    state: &AppState,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let limit = state.config.server.max_body_bytes;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let (parts, body) = request.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |pq| pq.as_str());
    // Pass-through requests carry no model in a place worth parsing; they use the default
    // upstream.
    let upstream = state.upstreams.default_upstream();
    // An absent body stays absent rather than becoming an empty chunked one.
    let body = if hyper::body::Body::is_end_stream(&body) {
        full(bytes::Bytes::new())
    } else {
        limited(body, limit)
    };
    upstream
        .send(parts.method.clone(), path_and_query, parts.headers, body)
        .await
}
