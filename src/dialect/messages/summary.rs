//! A summary asked of Anthropic's Messages API, and read from its reply.

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Value};

use crate::compaction::summary_api::{
    with_turn_appended, SummaryApi, SummaryAsk, REASONING_ALLOWANCE_TOKENS,
};
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

    fn cut_off(&self, reply: &Value) -> bool {
        reply.get("stop_reason").and_then(Value::as_str) == Some("max_tokens")
    }

    /// Thinking stays as the session asked it (a changed setting would drop the cached
    /// messages), so the cap leaves its budget room besides the summary's.
    fn session_body(&self, forwarded: Value, instruction: &str, max_tokens: u32) -> Option<Value> {
        // A request that must call a tool (`any`, or one named) can give no summary in text.
        let forced = forwarded
            .pointer("/tool_choice/type")
            .and_then(Value::as_str)
            .is_some_and(|kind| matches!(kind, "any" | "tool"));
        if forced {
            return None;
        }
        let thinking = forwarded.get("thinking");
        let room = match thinking.and_then(|t| t.get("type")).and_then(Value::as_str) {
            Some("enabled") => thinking
                .and_then(|t| t.get("budget_tokens"))
                .and_then(Value::as_u64)
                .and_then(|budget| u32::try_from(budget).ok())?,
            Some("adaptive") => REASONING_ALLOWANCE_TOKENS,
            _ => 0,
        };
        let turn = json!({"role": "user", "content": [{"type": "text", "text": instruction}]});
        let mut body = with_turn_appended(forwarded, "messages", turn)?;
        body.insert("max_tokens".into(), json!(max_tokens.saturating_add(room)));
        Some(Value::Object(body))
    }

    fn calls_a_tool(&self, reply: &Value) -> bool {
        reply
            .get("content")
            .and_then(Value::as_array)
            .is_some_and(|content| {
                content.iter().any(|block| {
                    matches!(
                        block.get("type").and_then(Value::as_str),
                        Some("tool_use" | "server_tool_use")
                    )
                })
            })
    }

    /// The beta features the session's body may use: a summary asked through it names them
    /// too.
    fn session_headers(&self) -> &'static [&'static str] {
        &["anthropic-beta"]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_through_the_session_keeps_its_thinking_and_leaves_it_room() {
        let forwarded = json!({"model": "claude-sonnet-4-5", "stream": true, "max_tokens": 32000,
            "thinking": {"type": "enabled", "budget_tokens": 4000},
            "tool_choice": {"type": "auto"}, "system": [{"type": "text", "text": "you code"}],
            "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]});
        let body = MessagesSummary
            .session_body(forwarded.clone(), "summarize", 1024)
            .unwrap();
        assert_eq!(body["thinking"], forwarded["thinking"]);
        assert_eq!(body["tool_choice"], forwarded["tool_choice"]);
        assert_eq!(body["max_tokens"], 4000 + 1024);
        assert_eq!(body["messages"][1]["content"][0]["text"], "summarize");
        assert!(body.get("stream").is_none());
        let forced =
            json!({"model": "claude-haiku-4-5", "tool_choice": {"type": "any"}, "messages": []});
        assert!(MessagesSummary
            .session_body(forced, "summarize", 1024)
            .is_none());
        let plain = json!({"model": "claude-haiku-4-5", "max_tokens": 8000, "messages": []});
        let body = MessagesSummary
            .session_body(plain, "summarize", 1024)
            .unwrap();
        assert_eq!(body["max_tokens"], 1024);
        let called = json!({"content": [{"type": "text", "text": "I'll look"}, {"type": "tool_use", "id": "t2"}]});
        assert!(MessagesSummary.calls_a_tool(&called));
        assert!(!MessagesSummary
            .calls_a_tool(&json!({"content": [{"type": "text", "text": "## Goal"}]})));
    }
}
