//! A summary asked of Chat Completions, and read from its reply.

use serde_json::{json, Value};

use crate::compaction::summary_api::{reasoning_for, with_turn_appended, SummaryApi, SummaryAsk};
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

    fn cut_off(&self, reply: &Value) -> bool {
        reply
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
            == Some("length")
    }

    /// The cap goes in the field the model takes: `max_completion_tokens`, with room to think,
    /// for a reasoning model. None when the request forces a tool call.
    fn session_body(&self, forwarded: Value, instruction: &str, max_tokens: u32) -> Option<Value> {
        // A request that must call a tool can give no summary in text.
        if forwarded
            .get("tool_choice")
            .is_some_and(|choice| choice != "auto" && choice != "none")
        {
            return None;
        }
        let model = forwarded.get("model")?.as_str()?.to_string();
        let turn = json!({"role": "user", "content": instruction});
        let mut body = with_turn_appended(forwarded, "messages", turn)?;
        body.remove("max_tokens");
        body.remove("max_completion_tokens");
        match reasoning_for(&model, max_tokens) {
            Some(reasoning) => {
                body.insert("max_completion_tokens".into(), json!(reasoning.max_tokens))
            }
            None => body.insert("max_tokens".into(), json!(max_tokens)),
        };
        Some(Value::Object(body))
    }

    fn calls_a_tool(&self, reply: &Value) -> bool {
        reply
            .pointer("/choices/0/message/tool_calls")
            .and_then(Value::as_array)
            .is_some_and(|calls| !calls.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_through_the_session_is_its_request_asked_whole_with_one_turn_more() {
        let forwarded = json!({"model": "gpt-4o", "stream": true,
            "stream_options": {"include_usage": true}, "max_tokens": 4096,
            "tools": [{"type": "function", "function": {"name": "bash"}}],
            "messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": "go"}]});
        let body = ChatSummary
            .session_body(forwarded.clone(), "summarize", 1024)
            .unwrap();
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages[..2], forwarded["messages"].as_array().unwrap()[..]);
        assert_eq!(
            body["messages"][2],
            json!({"role": "user", "content": "summarize"})
        );
        assert_eq!(body["tools"], forwarded["tools"]);
        assert_eq!(body["max_tokens"], 1024);
        assert!(body.get("stream").is_none() && body.get("stream_options").is_none());
        // A reasoning model's cap is its own field, with room to think.
        let reasoning = json!({"model": "o3-mini", "max_completion_tokens": 9000, "messages": []});
        let body = ChatSummary
            .session_body(reasoning, "summarize", 1024)
            .unwrap();
        assert!(body.get("max_tokens").is_none());
        assert!(body["max_completion_tokens"].as_u64().unwrap() > 1024);
        let forced = json!({"model": "gpt-4o", "tool_choice": "required", "messages": []});
        assert!(ChatSummary
            .session_body(forced, "summarize", 1024)
            .is_none());
        let called = json!({"choices": [{"message": {"tool_calls": [{"id": "call_1"}]}}]});
        assert!(ChatSummary.calls_a_tool(&called));
        assert!(
            !ChatSummary.calls_a_tool(&json!({"choices": [{"message": {"content": "## Goal"}}]}))
        );
    }
}
