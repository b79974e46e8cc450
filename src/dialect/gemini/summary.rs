//! A summary asked of Google's Gemini API (`generateContent`), and read from its reply.

use serde_json::{json, Value};

use crate::compaction::summary_api::{
    with_turn_appended, SummaryApi, SummaryAsk, REASONING_ALLOWANCE_TOKENS,
};
use crate::error::SummarizeError;

pub struct GeminiSummary;

/// Why a reply holds no summary, as Gemini says it: its candidate stopped for its content.
const REFUSALS: &[&str] = &[
    "SAFETY",
    "RECITATION",
    "BLOCKLIST",
    "PROHIBITED_CONTENT",
    "SPII",
];

impl SummaryApi for GeminiSummary {
    /// Gemini's current models think before they answer, within `maxOutputTokens`: the
    /// budget has room for it, and the thoughts are not asked back.
    fn request_body(&self, ask: &SummaryAsk) -> Value {
        json!({
            "systemInstruction": {"parts": [{"text": ask.instructions}]},
            "contents": [{"role": "user", "parts": [{"text": ask.user}]}],
            "generationConfig": {
                "maxOutputTokens": ask.max_tokens + REASONING_ALLOWANCE_TOKENS,
                "temperature": 0,
                "thinkingConfig": {"includeThoughts": false},
            },
        })
    }

    fn reply_text(&self, reply: &Value) -> Result<String, SummarizeError> {
        if let Some(reason) = reply
            .pointer("/promptFeedback/blockReason")
            .and_then(Value::as_str)
        {
            return Err(SummarizeError::Rejected(format!("blocked: {reason}")));
        }
        let candidate = reply
            .pointer("/candidates/0")
            .ok_or_else(|| SummarizeError::Malformed("no candidates".into()))?;
        let finish = candidate.get("finishReason").and_then(Value::as_str);
        if let Some(reason) = finish.filter(|reason| REFUSALS.contains(reason)) {
            return Err(SummarizeError::Rejected(format!("stopped: {reason}")));
        }
        let parts = candidate
            .pointer("/content/parts")
            .and_then(Value::as_array)
            .ok_or_else(|| SummarizeError::Malformed("no content parts".into()))?;
        Ok(parts
            .iter()
            .filter(|part| part.get("thought").and_then(Value::as_bool) != Some(true))
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect())
    }

    fn cut_off(&self, reply: &Value) -> bool {
        reply
            .pointer("/candidates/0/finishReason")
            .and_then(Value::as_str)
            == Some("MAX_TOKENS")
    }

    /// The session's generation settings stay but for the cap, with room to think.
    fn session_body(&self, forwarded: Value, instruction: &str, max_tokens: u32) -> Option<Value> {
        // A request that must call a function can give no summary in text.
        let forced = forwarded
            .pointer("/toolConfig/functionCallingConfig/mode")
            .and_then(Value::as_str)
            == Some("ANY");
        if forced {
            return None;
        }
        let turn = json!({"role": "user", "parts": [{"text": instruction}]});
        let mut body = with_turn_appended(forwarded, "contents", turn)?;
        let config = body
            .entry("generationConfig")
            .or_insert_with(|| json!({}))
            .as_object_mut()?;
        config.insert(
            "maxOutputTokens".into(),
            json!(max_tokens + REASONING_ALLOWANCE_TOKENS),
        );
        Some(Value::Object(body))
    }

    fn calls_a_tool(&self, reply: &Value) -> bool {
        reply
            .pointer("/candidates/0/content/parts")
            .and_then(Value::as_array)
            .is_some_and(|parts| parts.iter().any(|part| part.get("functionCall").is_some()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_is_asked_with_room_to_think_and_read_without_the_thoughts() {
        let body = GeminiSummary.request_body(&SummaryAsk {
            model: "gemini-2.5-pro",
            instructions: "summarize",
            user: "<transcript>",
            max_tokens: 1024,
        });
        assert_eq!(body["systemInstruction"]["parts"][0]["text"], "summarize");
        assert_eq!(body["contents"][0]["parts"][0]["text"], "<transcript>");
        assert_eq!(
            body["generationConfig"]["maxOutputTokens"],
            1024 + REASONING_ALLOWANCE_TOKENS
        );
        let reply = json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": "weighing it", "thought": true}, {"text": "## Goal\n"}, {"text": "fix"}]},
            "finishReason": "STOP"}]});
        assert_eq!(GeminiSummary.reply_text(&reply).unwrap(), "## Goal\nfix");
        let refused = json!({"candidates": [{"finishReason": "SAFETY"}]});
        assert!(matches!(
            GeminiSummary.reply_text(&refused),
            Err(SummarizeError::Rejected(_))
        ));
        let blocked = json!({"promptFeedback": {"blockReason": "OTHER"}});
        assert!(matches!(
            GeminiSummary.reply_text(&blocked),
            Err(SummarizeError::Rejected(_))
        ));
        assert!(matches!(
            GeminiSummary.reply_text(&json!({})),
            Err(SummarizeError::Malformed(_))
        ));
    }

    #[test]
    fn a_summary_through_the_session_appends_a_user_turn_and_caps_the_answer() {
        let forwarded = json!({"systemInstruction": {"parts": [{"text": "you code"}]},
            "generationConfig": {"temperature": 0.2},
            "contents": [{"role": "user", "parts": [{"functionResponse": {"name": "ls"}}]}]});
        let body = GeminiSummary
            .session_body(forwarded, "summarize", 1024)
            .unwrap();
        assert_eq!(
            body["contents"][1],
            json!({"role": "user", "parts": [{"text": "summarize"}]})
        );
        assert_eq!(body["generationConfig"]["temperature"], 0.2);
        assert_eq!(
            body["generationConfig"]["maxOutputTokens"],
            1024 + REASONING_ALLOWANCE_TOKENS
        );
        let forced =
            json!({"toolConfig": {"functionCallingConfig": {"mode": "ANY"}}, "contents": []});
        assert!(GeminiSummary
            .session_body(forced, "summarize", 1024)
            .is_none());
        let called =
            json!({"candidates": [{"content": {"parts": [{"functionCall": {"name": "ls"}}]}}]});
        assert!(GeminiSummary.calls_a_tool(&called));
        assert!(!GeminiSummary
            .calls_a_tool(&json!({"candidates": [{"content": {"parts": [{"text": "## Goal"}]}}]})));
    }
}
