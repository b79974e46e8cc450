//! A summary asked of Anthropic's Messages API, and read from its reply.

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Value};

use crate::compaction::summary_api::{SummaryApi, SummaryAsk};
use crate::dialect::request::text_of;
use crate::error::SummarizeError;

/// The API version Anthropic's requests must name.
const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");

pub struct MessagesSummary;

impl SummaryApi for MessagesSummary {
    fn add_headers(&self, headers: &mut HeaderMap) {
        headers.insert(ANTHROPIC_VERSION, HeaderValue::from_static("2023-06-01"));
    }

    /// Reasoning or not, asked the same way: thinking is off unless asked for.
    fn request_body(&self, ask: &SummaryAsk) -> Value {
        json!({
            "model": ask.model,
            "system": ask.instructions,
            "messages": [{"role": "user", "content": ask.user}],
            "max_tokens": ask.max_tokens,
            "temperature": 0,
            "stream": false,
        })
    }

    fn reply_text(&self, reply: &Value) -> Result<String, SummarizeError> {
        if reply.get("stop_reason").and_then(Value::as_str) == Some("refusal") {
            return Err(SummarizeError::Rejected("refused".into()));
        }
        let content = reply
            .get("content")
            .and_then(Value::as_array)
            .ok_or_else(|| SummarizeError::Malformed("no content".into()))?;
        Ok(text_of(content, "text"))
    }
}
