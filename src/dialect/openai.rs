//! What OpenAI's two APIs, Chat Completions and Responses, share on the wire: how a key
//! comes, and the shape of an error. Paths no dialect serves (`/v1/models`, `/v1/files`) are
//! answered this way too.

use hyper::Response;
use serde_json::json;

use crate::error::ProxyError;
use crate::transport::body::{json_response, ProxyBody};
use crate::transport::upstream::KeyStyle;

/// A bearer token in `authorization`, or Azure OpenAI's bare `api-key`.
pub const KEY_STYLE: KeyStyle = KeyStyle {
    header: "authorization",
    also_in: &["api-key"],
    query: None,
};

/// An error in OpenAI's shape, `{"error":{"message","type","param","code"}}`.
pub fn error_response(error: &ProxyError) -> Response<ProxyBody> {
    json_response(
        error.status(),
        &json!({
            "error": {
                "message": error.to_string(),
                "type": error.error_type(),
                "param": error.param(),
                "code": error.code(),
            }
        }),
    )
}
