//! Google's error shape.

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use crate::error::ProxyError;
use crate::transport::body::{json_response, ProxyBody};

/// An error in Google's shape, `{"error":{"code","message","status"}}`: the HTTP status as
/// `code`, and the canonical status Google gives it.
pub fn error_response(error: &ProxyError) -> Response<ProxyBody> {
    let code = error.status();
    json_response(code, &error_body(code, &error.to_string()))
}

/// The body of an error in Google's shape: what condenser answers, and what ends a stream
/// that failed.
pub(super) fn error_body(code: StatusCode, message: &str) -> Value {
    json!({"error": {"code": code.as_u16(), "message": message, "status": canonical(code)}})
}

/// Google's canonical status for an HTTP status (google.rpc.Code, as its APIs map them).
fn canonical(code: StatusCode) -> &'static str {
    match code.as_u16() {
        400 | 413 | 431 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        502 | 503 => "UNAVAILABLE",
        408 | 504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::error_cases::check_shape;

    #[tokio::test]
    async fn errors_take_googles_shape() {
        let statuses = [
            "INVALID_ARGUMENT",
            "INVALID_ARGUMENT",
            "NOT_FOUND",
            "UNAVAILABLE",
            "DEADLINE_EXCEEDED",
            "CANCELLED",
        ];
        check_shape(error_response, statuses, |code, message, status| {
            json!({"error": {"code": code, "message": message, "status": status}})
        })
        .await;
    }
}
