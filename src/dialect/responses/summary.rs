//! A summary asked of the Responses API, and read from its reply.

use serde_json::{json, Value};

use crate::compaction::summary_api::{
    reasoning_for, with_turn_appended, SummaryApi, SummaryAsk, REASONING_ALLOWANCE_TOKENS,
};
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

    fn cut_off(&self, reply: &Value) -> bool {
        reply.get("status").and_then(Value::as_str) == Some("incomplete")
            && reply
                .pointer("/incomplete_details/reason")
                .and_then(Value::as_str)
                == Some("max_output_tokens")
    }

    /// A request chained on a stored response (`previous_response_id`) does not carry its
    /// conversation, so it cannot carry the question either; one that forces a tool call gets
    /// no summary in text. A request that reasons keeps its
    /// `reasoning`, and gets room for it.
    fn session_body(&self, forwarded: Value, instruction: &str, max_tokens: u32) -> Option<Value> {
        let chained = forwarded
            .get("previous_response_id")
            .is_some_and(|id| !id.is_null());
        // A request that must call a tool can give no summary in text.
        let forced = forwarded
            .get("tool_choice")
            .is_some_and(|choice| choice != "auto" && choice != "none");
        if chained || forced {
            return None;
        }
        let model = forwarded.get("model")?.as_str()?.to_string();
        let reasons = forwarded.get("reasoning").is_some_and(|r| !r.is_null())
            || reasoning_for(&model, max_tokens).is_some();
        let turn = json!({"role": "user", "content": instruction});
        let mut body = with_turn_appended(forwarded, "input", turn)?;
        let cap = if reasons {
            max_tokens + REASONING_ALLOWANCE_TOKENS
        } else {
            max_tokens
        };
        body.insert("max_output_tokens".into(), json!(cap));
        Some(Value::Object(body))
    }

    /// Any output item that is a call: `function_call`, `custom_tool_call`, a hosted tool's.
    fn calls_a_tool(&self, reply: &Value) -> bool {
        reply
            .get("output")
            .and_then(Value::as_array)
            .is_some_and(|output| {
                output.iter().any(|item| {
                    item.get("type")
                        .and_then(Value::as_str)
                        .is_some_and(|kind| kind.ends_with("_call"))
                })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_through_the_session_appends_a_turn_and_never_chains() {
        let forwarded = json!({"model": "gpt-5-codex", "stream": true, "reasoning": {"effort": "high"},
            "instructions": "you code", "input": [{"role": "user", "content": "go"}]});
        let body = ResponsesSummary
            .session_body(forwarded, "summarize", 1024)
            .unwrap();
        assert_eq!(
            body["input"][1],
            json!({"role": "user", "content": "summarize"})
        );
        assert_eq!(body["reasoning"], json!({"effort": "high"}));
        assert_eq!(body["max_output_tokens"], 1024 + REASONING_ALLOWANCE_TOKENS);
        assert!(body.get("stream").is_none());
        // A chained request does not carry its conversation; a string input has no turns.
        let chained = json!({"model": "gpt-4o", "previous_response_id": "resp_1", "input": []});
        assert!(ResponsesSummary
            .session_body(chained, "summarize", 1024)
            .is_none());
        let forced = json!({"model": "gpt-4o", "tool_choice": {"type": "function", "name": "shell"}, "input": []});
        assert!(ResponsesSummary
            .session_body(forced, "summarize", 1024)
            .is_none());
        let plain = json!({"model": "gpt-4o", "input": "hello"});
        assert!(ResponsesSummary
            .session_body(plain, "summarize", 1024)
            .is_none());
        let called =
            json!({"output": [{"type": "reasoning"}, {"type": "function_call", "name": "shell"}]});
        assert!(ResponsesSummary.calls_a_tool(&called));
        assert!(!ResponsesSummary.calls_a_tool(&json!({"output": [{"type": "message"}]})));
    }
}
