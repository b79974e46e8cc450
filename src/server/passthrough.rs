//! Every `/v1/` path, and every path of a dialect's API, that no dialect intercepts: relayed as
//! is, both bodies streaming.

use std::borrow::Cow;

use hyper::{Method, Request, Response};
use serde::Deserialize;

use crate::dialect::PassThroughApi;
use crate::error::ProxyError;
use crate::pipeline::state::AppState;
use crate::transport::body::{declared_length, full, limited, read_body, ProxyBody};
use crate::transport::departure::ClientBody;

/// The one field read of a body routed by its model.
#[derive(Deserialize)]
struct Model<'a> {
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
}

/// A request to a path under a dialect's (`/v1/messages/count_tokens`,
/// `/v1/responses/compact`, …) names its model as the dialect's requests do, and must reach
/// the same upstream, the caller's key with it: a Claude client's key never goes to the
/// default upstream. Its small JSON body is read for that.
fn routed_by_model(method: &Method, path: &str) -> bool {
    method == Method::POST
        && (path.starts_with("/v1/messages/") || path.starts_with("/v1/responses/"))
}

pub async fn handle(
    state: &AppState,
    request: Request<ClientBody>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let limit = state.config.server.max_body_bytes;
    let (parts, body) = request.into_parts();
    let path = parts.uri.path();
    let path_and_query = parts.uri.path_and_query().map_or(path, |pq| pq.as_str());
    let api = PassThroughApi::of(path, &parts.headers, parts.uri.query());
    if let Some(why) = api.refused_query(parts.uri.query()) {
        return Err(ProxyError::invalid(why, None));
    }
    let upstream_for =
        |model: Option<&str>| state.upstreams.for_api(|name| api.spoken_by(name), model);
    if routed_by_model(&parts.method, path) {
        let bytes = read_body(body, &parts.headers, limit).await?;
        let model = serde_json::from_slice::<Model>(&bytes)
            .ok()
            .and_then(|body| body.model);
        let Some(upstream) = upstream_for(model.as_deref()) else {
            return Ok(api.unspoken());
        };
        return upstream
            .send(
                parts.method.clone(),
                path_and_query,
                api.key_style(),
                parts.headers,
                full(bytes),
            )
            .await;
    }
    if declared_length(&parts.headers).is_some_and(|len| len > limit as u64) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    // A model the path names (Gemini's `models/{model}:countTokens`, `/v1/models/{model}`)
    // routes the request, its body unread; other pass-through requests go to their API's
    // upstream.
    let Some(upstream) = upstream_for(api.model_in_path(path)) else {
        return Ok(api.unspoken());
    };
    // An absent body stays absent rather than becoming an empty chunked one.
    let body = if hyper::body::Body::is_end_stream(&body) {
        full(bytes::Bytes::new())
    } else {
        limited(body, limit)
    };
    upstream
        .send(
            parts.method.clone(),
            path_and_query,
            api.key_style(),
            parts.headers,
            body,
        )
        .await
}
