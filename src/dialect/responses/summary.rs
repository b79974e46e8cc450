//! A summary asked of the Responses API, and read from its reply.

use serde_json::{json, Value};

use crate::compaction::summary_api::{SummaryApi, SummaryAsk};
use crate::dialect::request::text_of;
use crate::error::SummarizeError;

pub struct ResponsesSummary;

impl SummaryApi for ResponsesSummary {
    fn request_body(&self, ask: &SummaryAsk) -> Value {
        let mut body = json!({
            "model": ask.model,
            "instructions": ask.instructions,
            "input": ask.user,
            "store": false,
            "stream": false,
        });
        match ask.reasoning() {
            Some(reasoning) => {
                body["max_output_tokens"] = json!(reasoning.max_tokens);
                body["reasoning"] = json!({ "effort": reasoning.effort });
            }
            None => {
                body["max_output_tokens"] = json!(ask.max_tokens);
                body["temperature"] = json!(0);
            }
        }
        body
    }

    fn reply_text(&self, reply: &Value) -> Result<String, SummarizeError> {
        let output = reply
            .get("output")
            .and_then(Value::as_array)
            .ok_or_else(|| SummarizeError::Malformed("no output".into()))?;
        let messages = output
            .iter()
            .filter(|item| item.get("type").and_then(Value::as_str) == Some("message"));
        let mut text = String::new();
        for message in messages {
            let parts = message
                .get("content")
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice);
            if parts
                .iter()
                .any(|part| part.get("type").and_then(Value::as_str) == Some("refusal"))
            {
                return Err(SummarizeError::Rejected("refused".into()));
            }
            text.push_str(&text_of(parts, "output_text"));
        }
        Ok(text)
    }
}
