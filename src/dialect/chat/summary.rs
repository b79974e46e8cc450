//! A summary asked of Chat Completions, and read from its reply.

use serde_json::{json, Value};

use crate::compaction::summary_api::{SummaryApi, SummaryAsk};
use crate::error::SummarizeError;

pub struct ChatSummary;

impl SummaryApi for ChatSummary {
    fn request_body(&self, ask: &SummaryAsk) -> Value {
        let mut body = json!({
            "model": ask.model,
            "messages": [
                {"role": "system", "content": ask.instructions},
                {"role": "user", "content": ask.user},
            ],
            "stream": false,
        });
        match ask.reasoning() {
            Some(reasoning) => {
                body["max_completion_tokens"] = json!(reasoning.max_tokens);
                body["reasoning_effort"] = json!(reasoning.effort);
            }
            None => {
                body["max_tokens"] = json!(ask.max_tokens);
                body["temperature"] = json!(0);
            }
        }
        body
    }

    fn reply_text(&self, reply: &Value) -> Result<String, SummarizeError> {
        let choice = reply.pointer("/choices/0");
        if choice
            .and_then(|c| c.get("finish_reason"))
            .and_then(Value::as_str)
            == Some("content_filter")
        {
            return Err(SummarizeError::Rejected("content filtered".into()));
        }
        let message = choice
            .and_then(|c| c.get("message"))
            .ok_or_else(|| SummarizeError::Malformed("no choices[0].message".into()))?;
        // A null content is well-formed (e.g. a reasoning model out of budget): no summary,
        // but no fault of the upstream either.
        Ok(message
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string())
    }
}
