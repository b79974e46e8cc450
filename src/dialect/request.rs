//! What every dialect checks of a request body first (a JSON object that names its model),
//! and how the ones whose conversation is one array of the body write a compaction into it.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::ProxyError;

/// The body as a JSON object with a string `model`; `missing_model` is the dialect's words
/// for a body without one.
pub fn object_with_model(
    bytes: &[u8],
    missing_model: &str,
) -> Result<Map<String, Value>, ProxyError> {
    let value: Value = serde_json::from_slice(bytes).map_err(ProxyError::InvalidJson)?;
    let Value::Object(body) = value else {
        return Err(ProxyError::invalid(
            "request body must be a JSON object",
            None,
        ));
    };
    match body.get("model") {
        Some(Value::String(_)) => Ok(body),
        None => Err(ProxyError::invalid(missing_model, Some("model"))),
        Some(_) => Err(ProxyError::invalid("model must be a string", Some("model"))),
    }
}

/// The body's `field`, which must be an array; `missing` is the dialect's words for a body
/// without it.
pub fn array<'a>(
    body: &'a Map<String, Value>,
    field: &'static str,
    missing: &str,
) -> Result<&'a Vec<Value>, ProxyError> {
    match body.get(field) {
        Some(Value::Array(items)) => Ok(items),
        None => Err(ProxyError::invalid(missing, Some(field))),
        Some(_) => Err(ProxyError::invalid(
            format!("{field} must be an array"),
            Some(field),
        )),
    }
}

/// Writes `compact`'s conversation in place of the array at `field`. The sent items are
/// taken out of the body first, so that the kept ones are moved, not copied, and `compact`
/// may write the body's other fields (a summary that goes into the head).
pub fn rewrite_conversation(
    body: &mut Map<String, Value>,
    field: &str,
    compact: impl FnOnce(&mut Map<String, Value>, Vec<Value>) -> Vec<Value>,
) {
    let sent = match body.get_mut(field) {
        Some(Value::Array(items)) => std::mem::take(items),
        _ => Vec::new(),
    };
    let compacted = compact(body, sent);
    body.insert(field.into(), Value::Array(compacted));
}

/// For a raw stage's optional field: present, even as `null`, which a plain `Option` would
/// read as absent.
pub fn present<'de, D: serde::Deserializer<'de>>(
    value: D,
) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(value).map(Some)
}

/// Where the body's opening brace is, when it opens a JSON object (after any whitespace):
/// serde's derived readers would take an array for a struct too.
pub fn object_start(bytes: &[u8]) -> Option<usize> {
    bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .filter(|&at| bytes[at] == b'{')
}

/// The text of the content parts of type `kind`, joined.
pub fn text_of(parts: &[Value], kind: &str) -> String {
    parts
        .iter()
        .filter(|part| part.get("type").and_then(Value::as_str) == Some(kind))
        .filter_map(|part| part.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("")
}
