//! Anthropic's error shape.

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use crate::error::ProxyError;
use crate::transport::body::{json_response, ProxyBody};

/// An error in Anthropic's shape, `{"type":"error","error":{"type","message"}}`, with the
/// status condenser gives it.
pub fn error_response(error: &ProxyError) -> Response<ProxyBody> {
    let status = error.status();
    json_response(status, &error_body(status, &error.to_string()))
}

/// The body of an error in Anthropic's shape, its type read off `status`: what condenser
/// answers, and the data of the `error` event that ends a stream that failed.
pub(super) fn error_body(status: StatusCode, message: &str) -> Value {
    let kind = match status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::REQUEST_TIMEOUT => "timeout_error",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        s if s.as_u16() == 529 => "overloaded_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::error_cases::check_shape;

    #[tokio::test]
    async fn errors_take_anthropics_shape() {
        let kinds = [
            "invalid_request_error",
            "request_too_large",
            "not_found_error",
            "api_error",
            "api_error",
            "api_error",
        ];
        check_shape(error_response, kinds, |_, message, kind| {
            json!({"type": "error", "error": {"type": kind, "message": message}})
        })
        .await;
    }
}
