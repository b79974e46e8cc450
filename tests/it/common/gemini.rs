//! Google's Gemini API (`/v1beta/models/{model}:generateContent`): a mock Gemini, and
//! conversations in its shape.

use bytes::Bytes;
use condenser::transport::body::{full, ProxyBody};
use hyper::Response;
use serde_json::{json, Value};

use super::{
    filler, handler, is_summarizer_call, json_response, mock_summary, summary_reply, MockUpstream,
    PLANTED,
};

/// The model the Gemini tests ask for.
pub const GEMINI_MODEL: &str = "gemini-2.5-pro";
/// Usage of every mock Gemini reply; its prompt is a third of the request's bytes, about what
/// Gemini's tokenizer makes of condenser's test conversations.
pub const GEMINI_CACHED_TOKENS: u64 = 6;
pub const GEMINI_OUTPUT_TOKENS: u64 = 4;
pub const GEMINI_THOUGHT_TOKENS: u64 = 3;

/// How the mock Gemini behaves.
#[derive(Clone, Default)]
pub struct GeminiBehaviour {
    /// Answers Gemini's 400 "input token count … exceeds" to a request of more turns than
    /// this.
    pub max_turns: Option<usize>,
}

/// A `generateContent` reply of one candidate with `parts`, and `usage` as `usageMetadata`.
pub fn gemini_reply(parts: Value, usage: Value) -> Value {
    json!({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP",
        "index": 0}], "usageMetadata": usage, "modelVersion": GEMINI_MODEL, "responseId": "resp-1"})
}

/// Gemini's answer to a prompt over the window.
pub fn gemini_too_long() -> Value {
    json!({"error": {"code": 400, "status": "INVALID_ARGUMENT",
        "message": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."}})
}

/// Events as `streamGenerateContent?alt=sse` writes them: `data:` lines ending in CRLF pairs.
pub fn gemini_sse(chunks: &[Value]) -> Response<ProxyBody> {
    let text: String = chunks
        .iter()
        .map(|chunk| format!("data: {chunk}\r\n\r\n"))
        .collect();
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(full(Bytes::from(text)))
        .unwrap()
}

fn usage(prompt: u64) -> Value {
    json!({"promptTokenCount": prompt, "cachedContentTokenCount": GEMINI_CACHED_TOKENS,
        "candidatesTokenCount": GEMINI_OUTPUT_TOKENS, "thoughtsTokenCount": GEMINI_THOUGHT_TOKENS,
        "totalTokenCount": prompt + GEMINI_OUTPUT_TOKENS + GEMINI_THOUGHT_TOKENS})
}

/// An upstream that answers Gemini's API: `generateContent` (summaries included, in its
/// shape), `streamGenerateContent` in SSE events, `countTokens`, `embedContent` and the model
/// list.
pub async fn mock_gemini(behaviour: GeminiBehaviour) -> MockUpstream {
    MockUpstream::start(handler(move |r| {
        let behaviour = behaviour.clone();
        async move {
            let path = r.path_and_query.split('?').next().unwrap_or("").to_string();
            let request: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            if is_summarizer_call(&r) {
                return json_response(200, &summary_reply(&path, &mock_summary(&request)));
            }
            if path.ends_with(":countTokens") {
                return json_response(200, &json!({"totalTokens": r.body.len() / 4}));
            }
            if path.ends_with(":embedContent") {
                return json_response(200, &json!({"embedding": {"values": [0.25, 0.5]}}));
            }
            if path == "/v1beta/models" {
                return json_response(
                    200,
                    &json!({"models": [{"name": format!("models/{GEMINI_MODEL}")}]}),
                );
            }
            let turns = request["contents"].as_array().map_or(0, Vec::len);
            if behaviour.max_turns.is_some_and(|max| turns > max) {
                return json_response(400, &gemini_too_long());
            }
            let reply = format!("reply to {turns} turns");
            let prompt = r.body.len() as u64 / 3;
            if path.ends_with(":streamGenerateContent") {
                let mut chunks: Vec<Value> = reply
                    .split(' ')
                    .map(|word| {
                        gemini_reply(
                            json!([{"text": format!("{word} ")}]),
                            json!({"promptTokenCount": prompt}),
                        )
                    })
                    .collect();
                if let Some(last) = chunks.last_mut() {
                    last["usageMetadata"] = usage(prompt);
                }
                return gemini_sse(&chunks);
            }
            json_response(200, &gemini_reply(json!([{"text": reply}]), usage(prompt)))
        }
    }))
    .await
}

/// `turns` rounds of a Gemini agent, each about 300 tokens: a user prompt, a model turn
/// calling a tool (its thought signed), the user turn answering it, and the model's reply;
/// facts planted in the first prompt. `4 * turns + 1` turns, the last a user question.
pub fn gemini_conversation(turns: usize) -> Vec<Value> {
    let mut contents = Vec::new();
    for t in 0..turns {
        let planted = if t == 0 {
            format!("{PLANTED}. ")
        } else {
            String::new()
        };
        contents.push(json!({"role": "user", "parts": [{"text": format!("msg-u{t}. {planted}{}", filler(t, 100))}]}));
        contents.push(json!({"role": "model", "parts": [
            {"text": format!("msg-c{t}. Let me look.")},
            {"functionCall": {"id": format!("call-{t}"), "name": "lookup", "args": {"q": format!("q{t}")}},
             "thoughtSignature": thought_signature(t)}]}));
        contents.push(json!({"role": "user", "parts": [
            {"functionResponse": {"id": format!("call-{t}"), "name": "lookup",
             "response": {"output": format!("msg-r{t}. {}", filler(t + 500, 100))}}}]}));
        contents.push(json!({"role": "model", "parts": [{"text": format!("msg-a{t}. {}", filler(t + 1000, 100))}]}));
    }
    contents.push(json!({"role": "user", "parts": [{"text": "what next?"}]}));
    contents
}

/// The signature the model gave its thought before call `t`: opaque bytes, base64.
pub fn thought_signature(t: usize) -> String {
    format!("CiQB{t:04}{}", "Vr0k".repeat(40))
}

/// A request of `contents` with a system instruction and one declared tool.
pub fn gemini_body(contents: &[Value]) -> Value {
    json!({
        "contents": contents,
        "systemInstruction": {"parts": [{"text": "You are careful with the Falcon project."}]},
        "tools": [{"functionDeclarations": [{"name": "lookup", "description": "Looks up a query.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]}],
        "generationConfig": {"maxOutputTokens": 500, "thinkingConfig": {"includeThoughts": true}},
        "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
    })
}

/// A config whose `GEMINI_MODEL` has an 8,000-token window; summaries asked of the request's
/// own model, in its own API.
pub fn gemini_config(upstream: &str) -> condenser::Config {
    with_gemini_window(super::config_for(upstream))
}

/// `config` with `GEMINI_MODEL`'s window set to 8,000 tokens.
pub fn with_gemini_window(mut config: condenser::Config) -> condenser::Config {
    config.models.insert(
        GEMINI_MODEL.into(),
        condenser::tokens::catalog::ModelOverride {
            context_window: Some(8_000),
            encoding: None,
            price: None,
        },
    );
    config
}
