//! A summary asked of Google's Gemini API (`generateContent`), and read from its reply.

use serde_json::{json, Value};

use crate::compaction::summary_api::{SummaryApi, SummaryAsk, REASONING_ALLOWANCE_TOKENS};
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
}
