//! One fixture per dialect of condenser's registry (`condenser::dialect::DIALECTS`): its path,
//! a body builder, a scripted upstream, and the pieces of a scripted recall model (what it is
//! offered and answered, the replies it writes, what the client reads of them). A
//! cross-dialect test runs over `Fixture::all()`, which takes the dialects from the registry
//! and fails on one without a fixture here: a fifth API is tested by adding its fixture.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use condenser::dialect::{Wire, DIALECTS};
use condenser::transport::body::{BoxError, ProxyBody};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use hyper::Response;
use serde_json::{json, Value};
use tokio::sync::Notify;

use super::*;

/// The recall tool's name, as condenser offers it.
pub const RECALL_TOOL: &str = "condenser_recall";

/// The key `Fixture::post` sends as the caller's.
pub const CALLER_KEY: &str = "sk-user-1";

/// A dialect as the tests speak it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fixture {
    Chat,
    Responses,
    Messages,
    Gemini,
}

impl Fixture {
    /// The fixture of the registry's dialect named `name`, if it has one.
    fn named(name: &str) -> Option<Fixture> {
        match name {
            "chat" => Some(Fixture::Chat),
            "responses" => Some(Fixture::Responses),
            "messages" => Some(Fixture::Messages),
            "gemini" => Some(Fixture::Gemini),
            _ => None,
        }
    }

    /// A fixture per dialect of the registry, in its order. A dialect without one fails the
    /// test that asks: its fixture is what tests it.
    pub fn all() -> Vec<Fixture> {
        DIALECTS
            .iter()
            .map(|wire| {
                Fixture::named(wire.name).unwrap_or_else(|| {
                    panic!(
                        "the dialect {:?} of condenser::dialect::DIALECTS has no fixture in \
                         tests/it/common/dialects.rs: add one, and the cross-dialect tests run \
                         over it",
                        wire.name
                    )
                })
            })
            .collect()
    }

    /// Its registry entry.
    pub fn wire(self) -> Wire {
        condenser::dialect::named(self.name()).expect("a fixture of a registered dialect")
    }

    /// Its name in the registry (`summarizer.api`, `--api`).
    pub fn name(self) -> &'static str {
        match self {
            Fixture::Chat => "chat",
            Fixture::Responses => "responses",
            Fixture::Messages => "messages",
            Fixture::Gemini => "gemini",
        }
    }

    /// Its `route` label in metrics and the log.
    pub fn route(self) -> &'static str {
        match self {
            Fixture::Chat => "chat_completions",
            Fixture::Responses => "responses",
            Fixture::Messages => "messages",
            Fixture::Gemini => "gemini",
        }
    }

    /// The model its tests ask for.
    pub fn model(self) -> &'static str {
        match self {
            Fixture::Chat | Fixture::Responses => "gpt-4o",
            Fixture::Messages => "claude-sonnet-4-5",
            Fixture::Gemini => GEMINI_MODEL,
        }
    }

    /// The path a request goes to, streamed or not (Gemini names both in the path; its
    /// stream in SSE events).
    pub fn path(self, stream: bool) -> String {
        match (self, stream) {
            (Fixture::Chat, _) => "/v1/chat/completions".into(),
            (Fixture::Responses, _) => "/v1/responses".into(),
            (Fixture::Messages, _) => "/v1/messages".into(),
            (Fixture::Gemini, false) => format!("/v1beta/models/{GEMINI_MODEL}:generateContent"),
            (Fixture::Gemini, true) => {
                format!("/v1beta/models/{GEMINI_MODEL}:streamGenerateContent?alt=sse")
            }
        }
    }

    /// Whether a request upstream got asks for a stream: by its body's `stream`, or (Gemini)
    /// by its path.
    pub fn streams(self, request: &Recorded) -> bool {
        match self {
            Fixture::Gemini => request.path_and_query.contains(":streamGenerateContent"),
            _ => request.json()["stream"] == json!(true),
        }
    }

    /// A request of `SYSTEM_PROMPT` and `turns` (`user` or `assistant`, and its text), streamed
    /// or not, in this dialect.
    pub fn body(self, turns: &[(&str, String)], stream: bool) -> Value {
        let items: Vec<Value> = turns
            .iter()
            .map(|(role, text)| json!({"role": role, "content": text}))
            .collect();
        let mut body = match self {
            Fixture::Chat => {
                let mut messages = vec![json!({"role": "system", "content": SYSTEM_PROMPT})];
                messages.extend(items);
                json!({"model": self.model(), "messages": messages})
            }
            Fixture::Responses => {
                json!({"model": self.model(), "instructions": SYSTEM_PROMPT, "input": items})
            }
            Fixture::Messages => {
                json!({"model": self.model(), "max_tokens": 500, "system": SYSTEM_PROMPT, "messages": items})
            }
            Fixture::Gemini => {
                let contents: Vec<Value> = turns
                    .iter()
                    .map(|(role, text)| {
                        let role = if *role == "assistant" { "model" } else { role };
                        json!({"role": role, "parts": [{"text": text}]})
                    })
                    .collect();
                return json!({"contents": contents,
                    "systemInstruction": {"parts": [{"text": SYSTEM_PROMPT}]}});
            }
        };
        if stream {
            body["stream"] = json!(true);
        }
        body
    }

    /// A scripted upstream that answers this dialect (and the summarizer's calls) with
    /// `behaviour`: `mock_llm`, `mock_responses_llm`, `mock_claude` (its usage counted from
    /// the prompt) or `mock_gemini` (its summarizer a `mock_llm`).
    pub async fn upstream(self, behaviour: LlmBehaviour) -> MockUpstream {
        match self {
            Fixture::Chat => mock_llm(behaviour).await,
            Fixture::Responses => mock_responses_llm(behaviour, None).await,
            Fixture::Messages => {
                // Claude's prompt is counted by its usage once it reported one: the mock's
                // fixed count would make every later prompt look tiny.
                let mut behaviour = behaviour;
                behaviour
                    .prompt_cache
                    .get_or_insert_with(PromptCache::default);
                mock_claude(ClaudeBehaviour {
                    llm: behaviour,
                    ..ClaudeBehaviour::default()
                })
                .await
            }
            Fixture::Gemini => gemini_before_llm(behaviour).await,
        }
    }

    /// An agent's conversation over the trigger in this dialect, its tool calls paired:
    /// `conversation(40)`, `tool_conversation(30)`, `claude_conversation(30)` or
    /// `gemini_conversation(20)`.
    pub fn agent_conversation(self) -> Vec<Value> {
        self.agent_conversation_of(self.agent_rounds())
    }

    /// The rounds of `agent_conversation`.
    pub fn agent_rounds(self) -> usize {
        match self {
            Fixture::Chat => 40,
            Fixture::Responses | Fixture::Messages => 30,
            Fixture::Gemini => 20,
        }
    }

    /// `rounds` rounds of an agent in this dialect (a round is a user turn and an answer in
    /// chat's; a prompt, a tool call, its output and an answer in the others).
    pub fn agent_conversation_of(self, rounds: usize) -> Vec<Value> {
        match self {
            Fixture::Chat => conversation(rounds),
            Fixture::Responses => tool_conversation(rounds),
            Fixture::Messages => claude_conversation(rounds),
            Fixture::Gemini => gemini_conversation(rounds),
        }
    }

    /// A request of `items` as its tests send it: `chat_body`, `responses_body`,
    /// `messages_body` or `gemini_body`.
    pub fn agent_body(self, items: &[Value]) -> Value {
        match self {
            Fixture::Chat => chat_body(items),
            Fixture::Responses => responses_body(items),
            Fixture::Messages => messages_body(items),
            Fixture::Gemini => gemini_body(items),
        }
    }

    /// `body` streamed or not: its `stream` field, but in Gemini's API, whose path says it.
    pub fn with_stream(self, mut body: Value, stream: bool) -> Value {
        if self != Fixture::Gemini {
            body["stream"] = json!(stream);
        }
        body
    }

    /// The field a request carries its conversation in.
    fn items_field(self) -> &'static str {
        match self {
            Fixture::Chat | Fixture::Messages => "messages",
            Fixture::Responses => "input",
            Fixture::Gemini => "contents",
        }
    }

    /// The conversation a request carries: its messages, input items or contents.
    pub fn items(self, body: &Value) -> Vec<Value> {
        let field = self.items_field();
        body[field]
            .as_array()
            .unwrap_or_else(|| panic!("{self:?}: no {field} in {body}"))
            .clone()
    }

    /// `body` with `items` for its conversation.
    pub fn with_items(self, mut body: Value, items: &[Value]) -> Value {
        body[self.items_field()] = json!(items);
        body
    }

    /// How many of `agent_conversation`'s first items are its head, kept verbatim first
    /// whatever is summarized or trimmed: chat's system message, Responses' developer
    /// message.
    pub fn head(self) -> usize {
        match self {
            Fixture::Chat | Fixture::Responses => 1,
            Fixture::Messages | Fixture::Gemini => 0,
        }
    }

    /// The system prompt a request carries outside its conversation, where the API has one.
    pub fn system(self, body: &Value) -> Value {
        match self {
            Fixture::Chat => Value::Null,
            Fixture::Responses => body["instructions"].clone(),
            Fixture::Messages => body["system"].clone(),
            Fixture::Gemini => body["systemInstruction"].clone(),
        }
    }

    /// Sets the system prompt of `body` to `text`, wherever this dialect carries it.
    pub fn set_system(self, body: &mut Value, text: &str) {
        let at = match self {
            Fixture::Chat => "/messages/0/content",
            Fixture::Responses => "/instructions",
            Fixture::Messages => "/system",
            Fixture::Gemini => "/systemInstruction/parts/0/text",
        };
        *body.pointer_mut(at).expect("a system prompt") = json!(text);
    }

    /// Whether `item` is the user turn condenser opens a trimmed conversation with, in an
    /// API whose conversation must open with one, when the kept tail opens otherwise.
    pub fn is_omission_note(self, item: &Value) -> bool {
        match self {
            Fixture::Chat | Fixture::Responses => false,
            Fixture::Messages | Fixture::Gemini => {
                let text = [
                    item.pointer("/content/0/text"),
                    item.pointer("/parts/0/text"),
                ]
                .into_iter()
                .flatten()
                .find_map(Value::as_str);
                item["role"] == "user"
                    && text.is_some_and(|t| {
                        t.starts_with('[') && t.ends_with(" earlier messages omitted]")
                    })
            }
        }
    }

    /// Fails unless `sent`, forwarded for a request of `original` items, is what the API
    /// accepts: calls and their answers paired, turns in order.
    pub fn assert_valid(self, original: &[Value], sent: &Value) {
        let items = self.items(sent);
        match self {
            Fixture::Chat => {
                for (i, message) in items.iter().enumerate() {
                    if let Some(id) = message["tool_call_id"].as_str() {
                        let calls = items[..i]
                            .iter()
                            .rev()
                            .find(|m| m["role"] == "assistant")
                            .map(|m| m["tool_calls"].to_string())
                            .unwrap_or_default();
                        assert!(calls.contains(id), "orphan tool message {id}");
                    }
                }
            }
            Fixture::Responses => assert_pairs_intact(original, &items),
            Fixture::Messages => assert_valid_messages(&items),
            Fixture::Gemini => assert_valid_gemini(sent),
        }
    }

    /// `body` posted to this dialect's path (its stream's when `stream`) as the caller
    /// `CALLER_KEY` sends it, with `headers` besides; and what condenser says of it.
    pub async fn post(
        self,
        proxy: &Proxy,
        body: &Value,
        stream: bool,
        headers: &[(&str, &str)],
    ) -> (reqwest::Response, Condensed) {
        self.post_as(proxy, CALLER_KEY, body, stream, headers).await
    }

    /// `post`, as the caller whose key is `key`.
    pub async fn post_as(
        self,
        proxy: &Proxy,
        key: &str,
        body: &Value,
        stream: bool,
        headers: &[(&str, &str)],
    ) -> (reqwest::Response, Condensed) {
        let keys = self.key_headers(key);
        let mut all: Vec<(&str, &str)> = keys.iter().map(|(n, v)| (*n, v.as_str())).collect();
        all.extend_from_slice(headers);
        post(proxy, &self.path(stream), &all, body).await
    }

    /// The headers a caller sends its key `key` in, in this dialect.
    pub fn key_headers(self, key: &str) -> Vec<(&'static str, String)> {
        match self {
            Fixture::Chat | Fixture::Responses => vec![("authorization", format!("Bearer {key}"))],
            Fixture::Messages => vec![
                ("x-api-key", key.to_string()),
                ("anthropic-version", "2023-06-01".to_string()),
            ],
            Fixture::Gemini => vec![("x-goog-api-key", key.to_string())],
        }
    }

    /// The error a response of condenser's or upstream's carries, read in this dialect's
    /// shape (which it must have): its kind (OpenAI's `code`, Anthropic's `type`, Google's
    /// `status`) and message.
    pub async fn error(self, response: reqwest::Response) -> (u16, String, String) {
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        let error = &body["error"];
        let message = error["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{self:?}: {body}"));
        let kind = match self {
            Fixture::Chat | Fixture::Responses => &error["code"],
            Fixture::Messages => {
                assert_eq!(body["type"], "error", "{body}");
                &error["type"]
            }
            Fixture::Gemini => {
                assert_eq!(error["code"], status, "{body}");
                &error["status"]
            }
        };
        let kind = kind.as_str().unwrap_or_else(|| panic!("{self:?}: {body}"));
        (status, kind.to_string(), message.to_string())
    }

    /// The most output tokens `request` asks: `max_tokens`, Responses' `max_output_tokens`,
    /// Gemini's `generationConfig.maxOutputTokens`.
    pub fn max_output(self, request: &Value) -> Value {
        match self {
            Fixture::Chat | Fixture::Messages => request["max_tokens"].clone(),
            Fixture::Responses => request["max_output_tokens"].clone(),
            Fixture::Gemini => request
                .pointer("/generationConfig/maxOutputTokens")
                .cloned()
                .unwrap_or_default(),
        }
    }

    /// The prompt tokens of `request`, a request of this dialect upstream got, as `proxy`
    /// counts a request it is sent (unknown tokenizers estimated with the default margin).
    pub async fn count(self, proxy: &Proxy, request: &Recorded) -> u64 {
        let counting = Counting {
            body: &request.body,
            path: request.path_and_query.split('?').next().unwrap_or_default(),
            catalog: &proxy.state.catalog,
        };
        condenser::dialect::with_dialect(self.wire().api, counting).await
    }

    /// The tokens a summarizer call of this dialect asks for the summary's thinking on top of
    /// the summary (Gemini's, whose models think within `maxOutputTokens`).
    pub fn thinking_allowance(self) -> u64 {
        match self {
            Fixture::Gemini => {
                condenser::compaction::summary_api::REASONING_ALLOWANCE_TOKENS.into()
            }
            _ => 0,
        }
    }

    /// The upstream's answer to a prompt over its model's window, as this dialect's provider
    /// words it (condenser retries on each: `pipeline::send`): OpenAI's
    /// `context_length_exceeded` (Responses' too), Anthropic's "prompt is too long", Gemini's
    /// 400 INVALID_ARGUMENT "exceeds the maximum number of tokens allowed".
    pub fn too_long(self) -> Value {
        match self {
            Fixture::Chat | Fixture::Responses => openai_too_long(),
            Fixture::Messages => anthropic_too_long(),
            Fixture::Gemini => gemini_too_long(),
        }
    }

    /// The upstream's answer to a request it refuses for another reason than its length (a
    /// bad temperature), in this dialect's error shape; answered with the same 400 as
    /// `too_long`.
    pub fn not_about_length(self) -> Value {
        match self {
            Fixture::Chat | Fixture::Responses => {
                json!({"error": {"message": "bad temperature", "type": "invalid_request_error",
                                 "param": "temperature", "code": "invalid_value"}})
            }
            Fixture::Messages => json!({"type": "error", "error": {
                "type": "invalid_request_error", "message": "temperature: range: 0..1"}}),
            Fixture::Gemini => json!({"error": {"code": 400, "status": "INVALID_ARGUMENT",
                "message": "Invalid value at 'generation_config.temperature' (TYPE_FLOAT), 7"}}),
        }
    }

    /// A config for `upstream` where every fixture's model has an 8,000-token window;
    /// summaries by gpt-4o-mini over chat completions.
    pub fn config(upstream: &str) -> Config {
        super::gemini::with_gemini_window(claude_config(upstream))
    }

    /// Whether `request` offers the recall tool.
    pub fn offers_recall(self, request: &Value) -> bool {
        let tools = request["tools"].as_array().into_iter().flatten();
        match self {
            Fixture::Chat => tools
                .into_iter()
                .any(|tool| tool.pointer("/function/name") == Some(&json!(RECALL_TOOL))),
            Fixture::Responses | Fixture::Messages => {
                tools.into_iter().any(|tool| tool["name"] == RECALL_TOOL)
            }
            Fixture::Gemini => tools
                .flat_map(|tool| {
                    tool["functionDeclarations"]
                        .as_array()
                        .into_iter()
                        .flatten()
                })
                .any(|declared| declared["name"] == RECALL_TOOL),
        }
    }

    /// The text of the recall answers that end the request, when it ends with some (an
    /// error's text after `Error: `).
    pub fn answers(self, request: &Value) -> Option<String> {
        match self {
            Fixture::Chat => {
                let messages = request["messages"].as_array()?;
                let last = messages.last()?;
                (last["role"] == "tool" && answers_a_recall(&last["tool_call_id"]))
                    .then(|| last["content"].as_str().unwrap().to_string())
            }
            Fixture::Responses => {
                let last = request["input"].as_array()?.last()?.clone();
                (last["type"] == "function_call_output" && answers_a_recall(&last["call_id"]))
                    .then(|| last["output"].as_str().unwrap().to_string())
            }
            Fixture::Messages => {
                let last = request["messages"].as_array()?.last()?.clone();
                let block = last["content"].as_array()?.first()?.clone();
                (block["type"] == "tool_result" && answers_a_recall(&block["tool_use_id"])).then(
                    || {
                        let error = if block["is_error"] == json!(true) {
                            "Error: "
                        } else {
                            ""
                        };
                        format!("{error}{}", block["content"].as_str().unwrap())
                    },
                )
            }
            Fixture::Gemini => {
                let last = request["contents"].as_array()?.last()?.clone();
                let answer = last["parts"].as_array()?.first()?["functionResponse"].clone();
                (last["role"] == "user"
                    && answer["name"] == RECALL_TOOL
                    && answers_a_recall(&answer["id"]))
                .then(|| match answer["response"]["output"].as_str() {
                    Some(output) => output.to_string(),
                    None => format!("Error: {}", answer["response"]["error"].as_str().unwrap()),
                })
            }
        }
    }

    /// How `request` chooses its tools, where this dialect says it: `tool_choice`, or
    /// Gemini's `toolConfig.functionCallingConfig.mode`.
    pub fn tool_choice(self, request: &Value) -> Option<&Value> {
        match self {
            Fixture::Gemini => request.pointer("/toolConfig/functionCallingConfig/mode"),
            _ => request.get("tool_choice"),
        }
    }

    /// The tool choice that forbids calling any tool.
    pub fn no_tools(self) -> Value {
        match self {
            Fixture::Chat | Fixture::Responses => json!("none"),
            Fixture::Messages => json!({"type": "none"}),
            Fixture::Gemini => json!("NONE"),
        }
    }

    /// A reply saying `text`, streamed or whole; a stream's first event at once, the rest
    /// after `gate` (when given) is notified.
    pub fn text_reply(
        self,
        text: &str,
        stream: bool,
        gate: Option<Arc<Notify>>,
    ) -> Response<ProxyBody> {
        if !stream {
            let body = match self {
                Fixture::Chat => completion(text, 100, 10),
                Fixture::Responses => {
                    json!({"id": "resp_1", "tools": echoed_tools(), "object": "response", "status": "completed",
                    "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                                "content": [{"type": "output_text", "text": text, "annotations": []}]}],
                    "usage": {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}})
                }
                Fixture::Messages => {
                    json!({"id": "msg_1", "type": "message", "role": "assistant", "model": self.model(),
                    "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": null,
                    "usage": {"input_tokens": 100, "output_tokens": 10}})
                }
                Fixture::Gemini => gemini_reply(json!([{"text": text}]), gemini_usage()),
            };
            return json_response(200, &body);
        }
        let events = match self {
            Fixture::Chat => vec![
                chat_chunk(json!({"role": "assistant", "content": ""}), None),
                chat_chunk(json!({"content": text}), None),
                chat_chunk(json!({}), Some("stop")),
                chat_usage(),
                "data: [DONE]\n\n".to_string(),
            ],
            Fixture::Responses => {
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                let message = json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [part]});
                let at = json!({"output_index": 0, "item_id": "msg_1", "content_index": 0});
                let with = |kind: &str, fields: Value| {
                    let mut event = at.clone();
                    event["type"] = json!(kind);
                    event
                        .as_object_mut()
                        .unwrap()
                        .extend(fields.as_object().unwrap().clone());
                    event
                };
                responses_events(vec![
                    json!({"type": "response.created", "response": {"id": "resp_1", "tools": echoed_tools(), "status": "in_progress", "output": []}}),
                    json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}}),
                    with(
                        "response.content_part.added",
                        json!({"part": {"type": "output_text", "text": "", "annotations": []}}),
                    ),
                    with("response.output_text.delta", json!({"delta": text})),
                    with("response.output_text.done", json!({"text": text})),
                    with("response.content_part.done", json!({"part": part})),
                    json!({"type": "response.output_item.done", "output_index": 0, "item": message}),
                    json!({"type": "response.completed", "response": {"id": "resp_1", "tools": echoed_tools(), "status": "completed", "output": [message],
                        "usage": {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}}}),
                ])
            }
            Fixture::Messages => vec![
                message_start(),
                anthropic_event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
                anthropic_event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
                ),
                anthropic_event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 0}),
                ),
                message_end("end_turn"),
                anthropic_event("message_stop", json!({"type": "message_stop"})),
            ],
            Fixture::Gemini => {
                // The first word, then the rest with the finish reason and usage.
                let split = text.find(' ').map_or(text.len(), |at| at + 1);
                vec![
                    gemini_chunk(json!([{"text": &text[..split]}]), false),
                    gemini_chunk(json!([{"text": &text[split..]}]), true),
                ]
            }
        };
        sse_response(events, gate)
    }

    /// `reply` (whole) reporting the prompt of `request` as a provider does, its tokens
    /// counted, rather than the fixed count of `text_reply`'s and `call_reply`'s: for a model
    /// whose prompts condenser estimates, a fixed count would teach it a ratio no provider has.
    pub async fn reporting_usage(
        self,
        reply: Response<ProxyBody>,
        request: &Value,
    ) -> Response<ProxyBody> {
        let (parts, body) = reply.into_parts();
        let mut reply: Value =
            serde_json::from_slice(&body.collect().await.unwrap().to_bytes()).unwrap();
        let at = match self {
            Fixture::Chat => "/usage/prompt_tokens",
            Fixture::Responses | Fixture::Messages => "/usage/input_tokens",
            Fixture::Gemini => "/usageMetadata/promptTokenCount",
        };
        let tokens = PromptCache::default().prompt(request).prompt_tokens;
        *reply.pointer_mut(at).expect("a reply with usage") = json!(tokens);
        json_response(parts.status.as_u16(), &reply)
    }

    /// A reply calling `calls` (name, arguments), streamed or whole; each call's id
    /// `call_N`.
    pub fn call_reply(self, calls: &[(&str, Value)], stream: bool) -> Response<ProxyBody> {
        let id = |i: usize| format!("call_{i}");
        if !stream {
            let body = match self {
                Fixture::Chat => {
                    let calls: Vec<Value> = calls.iter().enumerate().map(|(i, (name, args))| json!({"id": id(i), "type": "function", "function": {"name": name, "arguments": args.to_string()}})).collect();
                    json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": calls}, "finish_reason": "tool_calls"}],
                        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}})
                }
                Fixture::Responses => {
                    let output: Vec<Value> = calls.iter().enumerate().map(|(i, (name, args))| json!({"type": "function_call", "id": format!("fc_{i}"), "call_id": id(i), "name": name, "arguments": args.to_string(), "status": "completed"})).collect();
                    json!({"id": "resp_1", "tools": echoed_tools(), "object": "response", "status": "completed", "output": output,
                        "usage": {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}})
                }
                Fixture::Messages => {
                    let content: Vec<Value> = calls.iter().enumerate().map(|(i, (name, args))| json!({"type": "tool_use", "id": id(i), "name": name, "input": args})).collect();
                    json!({"id": "msg_1", "type": "message", "role": "assistant", "model": self.model(), "content": content,
                        "stop_reason": "tool_use", "stop_sequence": null, "usage": {"input_tokens": 100, "output_tokens": 10}})
                }
                Fixture::Gemini => gemini_reply(gemini_calls(calls), gemini_usage()),
            };
            return json_response(200, &body);
        }
        let mut events = Vec::new();
        match self {
            Fixture::Chat => {
                events.push(chat_chunk(
                    json!({"role": "assistant", "content": null}),
                    None,
                ));
                for (i, (name, args)) in calls.iter().enumerate() {
                    events.push(chat_chunk(json!({"tool_calls": [{"index": i, "id": id(i), "type": "function", "function": {"name": name, "arguments": ""}}]}), None));
                    events.push(chat_chunk(json!({"tool_calls": [{"index": i, "function": {"arguments": args.to_string()}}]}), None));
                }
                events.push(chat_chunk(json!({}), Some("tool_calls")));
                events.push(chat_usage());
                events.push("data: [DONE]\n\n".to_string());
            }
            Fixture::Responses => {
                let mut data = vec![
                    json!({"type": "response.created", "response": {"id": "resp_1", "tools": echoed_tools(), "status": "in_progress", "output": []}}),
                ];
                let mut output = Vec::new();
                for (i, (name, args)) in calls.iter().enumerate() {
                    let item = json!({"type": "function_call", "id": format!("fc_{i}"), "call_id": id(i), "name": name, "arguments": args.to_string(), "status": "completed"});
                    let mut added = item.clone();
                    added["arguments"] = json!("");
                    data.push(json!({"type": "response.output_item.added", "output_index": i, "item": added}));
                    data.push(json!({"type": "response.function_call_arguments.delta", "output_index": i, "item_id": format!("fc_{i}"), "delta": args.to_string()}));
                    data.push(json!({"type": "response.function_call_arguments.done", "output_index": i, "item_id": format!("fc_{i}"), "arguments": args.to_string()}));
                    data.push(json!({"type": "response.output_item.done", "output_index": i, "item": item}));
                    output.push(item);
                }
                data.push(json!({"type": "response.completed", "response": {"id": "resp_1", "tools": echoed_tools(), "status": "completed", "output": output,
                    "usage": {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}}}));
                events = responses_events(data);
            }
            Fixture::Messages => {
                events.push(message_start());
                for (i, (name, args)) in calls.iter().enumerate() {
                    events.push(anthropic_event("content_block_start", json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": id(i), "name": name, "input": {}}})));
                    events.push(anthropic_event("content_block_delta", json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": args.to_string()}})));
                    events.push(anthropic_event(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": i}),
                    ));
                }
                events.push(message_end("tool_use"));
                events.push(anthropic_event(
                    "message_stop",
                    json!({"type": "message_stop"}),
                ));
            }
            Fixture::Gemini => {
                // A chunk of text, then one a call, the last with the finish reason.
                events.push(gemini_chunk(json!([{"text": "Let me look. "}]), false));
                let parts = gemini_calls(calls);
                let last = parts.as_array().unwrap().len() - 1;
                for (i, part) in parts.as_array().unwrap().iter().enumerate() {
                    events.push(gemini_chunk(json!([part]), i == last));
                }
            }
        }
        sse_response(events, None)
    }

    /// The text the client got, and the raw bytes (for what must not be there).
    pub async fn client_text(self, response: reqwest::Response, stream: bool) -> (String, String) {
        let raw = if stream {
            stream_text(response).await
        } else {
            response.text().await.unwrap()
        };
        if !stream {
            let body: Value = serde_json::from_str(&raw).unwrap();
            let text = match self {
                Fixture::Chat => body["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                Fixture::Responses => body["output"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
                    .filter_map(|c| c["text"].as_str().map(str::to_string))
                    .collect(),
                Fixture::Messages => body["content"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|c| c["text"].as_str().map(str::to_string))
                    .collect(),
                Fixture::Gemini => gemini_text(&body),
            };
            return (text, raw);
        }
        (self.streamed_text(&raw), raw)
    }

    /// The text of a streamed reply, its events' pieces together.
    pub fn streamed_text(self, raw: &str) -> String {
        let mut text = String::new();
        for data in raw.lines().filter_map(|line| line.strip_prefix("data: ")) {
            let Ok(data) = serde_json::from_str::<Value>(data.trim()) else {
                continue;
            };
            let piece = match self {
                Fixture::Chat => data.pointer("/choices/0/delta/content").cloned(),
                Fixture::Responses => {
                    (data["type"] == "response.output_text.delta").then(|| data["delta"].clone())
                }
                Fixture::Messages => data.pointer("/delta/text").cloned(),
                Fixture::Gemini => Some(json!(gemini_text(&data))),
            };
            if let Some(piece) = piece.as_ref().and_then(Value::as_str) {
                text.push_str(piece);
            }
        }
        text
    }
}

/// How a forwarded summary opens: `[Context summary: N earlier <unit>]`.
pub const SUMMARY_PREFIX: &str = "[Context summary: ";

/// Takes out of `list` the texts (blocks or parts) that are a summary, into `found`.
fn take_summaries(list: &mut Vec<Value>, found: &mut Vec<String>) {
    list.retain(|piece| match piece["text"].as_str() {
        Some(text) if text.starts_with(SUMMARY_PREFIX) => {
            found.push(text.to_string());
            false
        }
        _ => true,
    });
}

impl Fixture {
    /// The summary in a forwarded `body`, wherever this dialect puts it (a message or item of
    /// its own; a text block or part of a turn; the system prompt's end), and `body` without
    /// it: a Messages turn condenser made blocks of to prepend the summary to is its string
    /// again, a turn that was the summary alone is gone. Fails on more than one summary.
    pub fn split_summary(self, body: &Value) -> (Option<String>, Value) {
        let mut rest = body.clone();
        let mut found = Vec::new();
        match self {
            Fixture::Chat | Fixture::Responses => {
                let field = if self == Fixture::Chat {
                    "messages"
                } else {
                    "input"
                };
                if let Some(items) = rest[field].as_array_mut() {
                    items.retain(|item| match item["content"].as_str() {
                        Some(text) if text.starts_with(SUMMARY_PREFIX) => {
                            found.push(text.to_string());
                            false
                        }
                        _ => true,
                    });
                }
            }
            Fixture::Messages => {
                let separated = format!("\n\n{SUMMARY_PREFIX}");
                match rest["system"].clone() {
                    Value::String(system) if system.starts_with(SUMMARY_PREFIX) => {
                        found.push(system);
                        rest.as_object_mut().unwrap().remove("system");
                    }
                    Value::String(system) => {
                        if let Some(at) = system.find(&separated) {
                            found.push(system[at + 2..].to_string());
                            rest["system"] = json!(system[..at]);
                        }
                    }
                    _ => {}
                }
                if let Some(blocks) = rest["system"].as_array_mut() {
                    take_summaries(blocks, &mut found);
                }
                if let Some(turns) = rest["messages"].as_array_mut() {
                    for turn in turns.iter_mut() {
                        let Some(blocks) = turn["content"].as_array_mut() else {
                            continue;
                        };
                        let before = found.len();
                        take_summaries(blocks, &mut found);
                        if found.len() > before && blocks.len() == 1 && blocks[0]["type"] == "text"
                        {
                            turn["content"] = blocks[0]["text"].clone();
                        }
                    }
                    turns.retain(|turn| turn["content"] != json!([]));
                }
            }
            Fixture::Gemini => {
                if let Some(parts) = rest["systemInstruction"]["parts"].as_array_mut() {
                    take_summaries(parts, &mut found);
                }
                if let Some(turns) = rest["contents"].as_array_mut() {
                    for turn in turns.iter_mut() {
                        if let Some(parts) = turn["parts"].as_array_mut() {
                            take_summaries(parts, &mut found);
                        }
                    }
                    turns.retain(|turn| turn["parts"] != json!([]));
                }
            }
        }
        assert!(
            found.len() <= 1,
            "{self:?}: more than one summary: {found:?}"
        );
        (found.pop(), rest)
    }

    /// How many earlier messages (or items) the summary in a forwarded `body` stands for, from
    /// its first line, wherever this dialect puts it; `None` without one.
    pub fn summarized(self, body: &Value) -> Option<usize> {
        let summary = self.split_summary(body).0?;
        let unit = if self == Fixture::Responses {
            "items"
        } else {
            "messages"
        };
        let count = summary
            .strip_prefix(SUMMARY_PREFIX)?
            .split_once(&format!(" earlier {unit}]"))?
            .0;
        Some(
            count
                .parse()
                .unwrap_or_else(|_| panic!("{self:?}: {summary}")),
        )
    }

    /// How many of `items`' first items are their head, kept verbatim first: system and
    /// developer messages.
    pub fn head_of(self, items: &[Value]) -> usize {
        items
            .iter()
            .take_while(|item| matches!(item["role"].as_str(), Some("system" | "developer")))
            .count()
    }

    /// Checks the documented shape of `sent`, forwarded for the request `body`: its head
    /// verbatim, one summary where this dialect puts it (chat's a system message, Responses'
    /// a developer message, both after the head; Messages' at the system prompt's end or a
    /// user turn of its own before a kept assistant turn; Gemini's at its system
    /// instruction's end), the system prompt otherwise as sent, then the original's last
    /// items verbatim, at least `keep_recent` of them. Returns the number of summarized
    /// items.
    pub fn assert_compacted_shape(self, body: &Value, sent: &Value, keep_recent: usize) -> usize {
        let original = self.items(body);
        let (summary, rest) = self.split_summary(sent);
        let summary = summary.unwrap_or_else(|| panic!("{self:?}: no summary in {sent}"));
        let n = self
            .summarized(sent)
            .unwrap_or_else(|| panic!("{self:?}: summary prefix missing: {summary}"));
        let head = self.head_of(&original);
        let items = self.items(&rest);
        assert_eq!(
            items[..head],
            original[..head],
            "{self:?}: head kept verbatim first"
        );
        assert_eq!(
            self.system(&rest),
            self.system(body),
            "{self:?}: the system prompt as sent"
        );
        let mut tail = &items[head..];
        // A conversation that must open with a user turn opens with a note of what went, when
        // the summary is in the system prompt and the kept tail opens otherwise.
        if self.is_omission_note(&tail[0]) {
            assert_eq!(
                tail[0]
                    .to_string()
                    .matches(&format!("[{n} earlier messages omitted]"))
                    .count(),
                1,
                "{self:?}: {}",
                tail[0]
            );
            assert_ne!(
                tail[1]["role"], "user",
                "{self:?}: a note only where needed"
            );
            tail = &tail[1..];
        }
        assert!(tail.len() >= keep_recent, "{self:?}: {} kept", tail.len());
        assert_eq!(
            head + n + tail.len(),
            original.len(),
            "{self:?}: summary covers exactly what was dropped"
        );
        assert_eq!(
            tail,
            &original[original.len() - tail.len()..],
            "{self:?}: recent items verbatim"
        );
        let placed = self.items(sent);
        match self {
            Fixture::Chat | Fixture::Responses => {
                let role = if self == Fixture::Chat {
                    "system"
                } else {
                    "developer"
                };
                assert_eq!(placed[head]["role"], role, "{self:?}");
                assert_eq!(placed[head]["content"], summary, "{self:?}");
            }
            Fixture::Messages if tail[0]["role"] == "user" => assert_eq!(
                sent["system"],
                format!("{}\n\n{summary}", body["system"].as_str().unwrap()),
                "{self:?}: the summary at the system prompt's end"
            ),
            Fixture::Messages => assert_eq!(
                placed[0],
                json!({"role": "user", "content": [{"type": "text", "text": summary}]}),
                "{self:?}: the summary a user turn of its own"
            ),
            Fixture::Gemini => assert_eq!(
                sent.pointer("/systemInstruction/parts")
                    .and_then(Value::as_array)
                    .and_then(|parts| parts.last()),
                Some(&json!({"text": summary})),
                "{self:?}: the summary at the system instruction's end"
            ),
        }
        n
    }

    /// `conversation(turns)` in this dialect: the same user and assistant turns, as it writes
    /// them (chat's system message among them; the others' system prompt outside, where
    /// `agent_body` puts it).
    pub fn plain_conversation(self, turns: usize) -> Vec<Value> {
        let chat = conversation(turns);
        let pairs: Vec<(&str, String)> = chat[1..]
            .iter()
            .map(|m| {
                let role = m["role"].as_str().unwrap();
                (role, m["content"].as_str().unwrap().to_string())
            })
            .collect();
        self.plain_items(&pairs)
    }

    /// `turns` (`user` or `assistant`, and its text) as this dialect's items, chat's system
    /// message first.
    pub fn plain_items(self, turns: &[(&str, String)]) -> Vec<Value> {
        self.items(&self.body(turns, false))
    }

    /// A user's ask, one call of the tool `name` and its `output`, in this dialect: the
    /// output is the conversation's last item (Anthropic's `tool_result` in a user turn,
    /// Gemini's `functionResponse`).
    pub fn one_call(self, name: &str, output: &str) -> Vec<Value> {
        let ask = "read the log";
        match self {
            Fixture::Chat => vec![
                json!({"role": "user", "content": ask}),
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": name, "arguments": "{}"}}]}),
                json!({"role": "tool", "tool_call_id": "c1", "content": output}),
            ],
            Fixture::Responses => vec![
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": ask}]}),
                json!({"type": "function_call", "id": "fc_1", "call_id": "c1", "name": name, "arguments": "{}"}),
                json!({"type": "function_call_output", "call_id": "c1", "output": output}),
            ],
            Fixture::Messages => vec![
                json!({"role": "user", "content": ask}),
                json!({"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": name, "input": {}}]}),
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": output}]}),
            ],
            Fixture::Gemini => vec![
                json!({"role": "user", "parts": [{"text": ask}]}),
                json!({"role": "model", "parts": [{"functionCall": {"id": "call-0", "name": name, "args": {}}, "thoughtSignature": thought_signature(0)}]}),
                json!({"role": "user", "parts": [{"functionResponse": {"id": "call-0", "name": name, "response": {"output": output}}}]}),
            ],
        }
    }

    /// Round `r` of an agent: its call of the tool `name`, then the call's `output`, in this
    /// dialect (ids `round_R`, Anthropic's `toolu_R`, Gemini's `call-R`: none taken for a
    /// recall call's, `call_I`).
    pub fn tool_round(self, r: usize, name: &str, output: &str) -> Vec<Value> {
        match self {
            Fixture::Chat => vec![
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("round_{r}"), "type": "function", "function": {"name": name, "arguments": "{}"}}]}),
                json!({"role": "tool", "tool_call_id": format!("round_{r}"), "content": output}),
            ],
            Fixture::Responses => vec![
                json!({"type": "function_call", "id": format!("fc_{r}"), "call_id": format!("round_{r}"), "name": name, "arguments": "{}"}),
                json!({"type": "function_call_output", "call_id": format!("round_{r}"), "output": output}),
            ],
            Fixture::Messages => vec![
                json!({"role": "assistant", "content": [{"type": "tool_use", "id": format!("toolu_{r}"), "name": name, "input": {}}]}),
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{r}"), "content": output}]}),
            ],
            Fixture::Gemini => vec![
                json!({"role": "model", "parts": [{"functionCall": {"id": format!("call-{r}"), "name": name, "args": {}}, "thoughtSignature": thought_signature(r)}]}),
                json!({"role": "user", "parts": [{"functionResponse": {"id": format!("call-{r}"), "name": name, "response": {"output": output}}}]}),
            ],
        }
    }

    /// The round of the tool output `item` is, of `tool_round`'s: none for any other item.
    pub fn output_round(self, item: &Value) -> Option<usize> {
        let id = match self {
            Fixture::Chat => item["tool_call_id"].as_str(),
            Fixture::Responses => item["call_id"]
                .as_str()
                .filter(|_| item["type"] == "function_call_output"),
            Fixture::Messages => item
                .pointer("/content/0/tool_use_id")
                .and_then(Value::as_str),
            Fixture::Gemini => item
                .pointer("/parts/0/functionResponse/id")
                .and_then(Value::as_str),
        }?;
        id.rsplit(['_', '-']).next()?.parse().ok()
    }

    /// `rounds` rounds of a user turn, an assistant turn calling two tools at once and the
    /// two results, in this dialect (after chat's system message). Anthropic's and Gemini's
    /// alternating turns add an assistant's text after the results, and a last user turn.
    pub fn parallel_calls_conversation(self, rounds: usize) -> Vec<Value> {
        let mut items = match self {
            Fixture::Chat => vec![json!({"role": "system", "content": SYSTEM_PROMPT})],
            _ => Vec::new(),
        };
        for t in 0..rounds {
            let question = format!("msg-u{t}. {}", filler(t, 60));
            let (a, b) = (filler(t + 1, 40), filler(t + 2, 40));
            match self {
                Fixture::Chat => {
                    items.push(json!({"role": "user", "content": question}));
                    items.push(json!({"role": "assistant", "content": null, "tool_calls": [
                        {"id": format!("call_{t}a"), "type": "function", "function": {"name": "search", "arguments": "{\"q\":\"x\"}"}},
                        {"id": format!("call_{t}b"), "type": "function", "function": {"name": "fetch", "arguments": "{\"u\":\"y\"}"}}
                    ]}));
                    items.push(
                        json!({"role": "tool", "tool_call_id": format!("call_{t}a"), "content": a}),
                    );
                    items.push(
                        json!({"role": "tool", "tool_call_id": format!("call_{t}b"), "content": b}),
                    );
                }
                Fixture::Responses => {
                    items.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}));
                    items.push(json!({"type": "function_call", "id": format!("fc_{t}a"), "call_id": format!("call_{t}a"), "name": "search", "arguments": "{\"query\":\"x\"}"}));
                    items.push(json!({"type": "function_call", "id": format!("fc_{t}b"), "call_id": format!("call_{t}b"), "name": "search", "arguments": "{\"query\":\"y\"}"}));
                    items.push(json!({"type": "function_call_output", "call_id": format!("call_{t}a"), "output": a}));
                    items.push(json!({"type": "function_call_output", "call_id": format!("call_{t}b"), "output": b}));
                }
                Fixture::Messages => {
                    items.push(json!({"role": "user", "content": question}));
                    items.push(json!({"role": "assistant", "content": [
                        {"type": "tool_use", "id": format!("toolu_{t}a"), "name": "lookup", "input": {"q": "x"}},
                        {"type": "tool_use", "id": format!("toolu_{t}b"), "name": "lookup", "input": {"q": "y"}}]}));
                    items.push(json!({"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": format!("toolu_{t}a"), "content": a},
                        {"type": "tool_result", "tool_use_id": format!("toolu_{t}b"), "content": b}]}));
                    items.push(json!({"role": "assistant", "content": [{"type": "text", "text": format!("msg-a{t}. done")}]}));
                }
                Fixture::Gemini => {
                    // Ids `call-N`, as `assert_valid_gemini` reads them: two a round.
                    let (x, y) = (2 * t, 2 * t + 1);
                    items.push(json!({"role": "user", "parts": [{"text": question}]}));
                    items.push(json!({"role": "model", "parts": [
                        {"functionCall": {"id": format!("call-{x}"), "name": "lookup", "args": {"q": "x"}}, "thoughtSignature": thought_signature(x)},
                        {"functionCall": {"id": format!("call-{y}"), "name": "lookup", "args": {"q": "y"}}, "thoughtSignature": thought_signature(y)}]}));
                    items.push(json!({"role": "user", "parts": [
                        {"functionResponse": {"id": format!("call-{x}"), "name": "lookup", "response": {"output": a}}},
                        {"functionResponse": {"id": format!("call-{y}"), "name": "lookup", "response": {"output": b}}}]}));
                    items.push(
                        json!({"role": "model", "parts": [{"text": format!("msg-a{t}. done")}]}),
                    );
                }
            }
        }
        match self {
            Fixture::Messages => items.push(json!({"role": "user", "content": "what next?"})),
            Fixture::Gemini => {
                items.push(json!({"role": "user", "parts": [{"text": "what next?"}]}))
            }
            _ => {}
        }
        items
    }

    /// Fails unless every tool call `sent` forwards has all its results right after it
    /// (before the next call), and every result its call before it; besides what
    /// `assert_valid` demands.
    pub fn assert_calls_answered(self, original: &[Value], sent: &Value) {
        self.assert_valid(original, sent);
        let items = self.items(sent);
        match self {
            Fixture::Chat => {
                let mut open_calls: Vec<String> = Vec::new();
                for m in &items {
                    if let Some(calls) = m["tool_calls"].as_array() {
                        assert!(open_calls.is_empty(), "a call lost its results");
                        open_calls = calls
                            .iter()
                            .map(|c| c["id"].as_str().unwrap().to_string())
                            .collect();
                    } else if m["role"] == "tool" {
                        let id = m["tool_call_id"].as_str().unwrap();
                        assert!(
                            open_calls.iter().any(|c| c == id),
                            "tool message {id} without its call"
                        );
                        open_calls.retain(|c| c != id);
                    }
                }
                assert!(open_calls.is_empty());
            }
            Fixture::Responses => {
                let mut open_calls: Vec<&str> = Vec::new();
                for item in &items {
                    if item["type"] == "function_call" {
                        open_calls.push(item["call_id"].as_str().unwrap());
                    } else if item["type"] == "function_call_output" {
                        let id = item["call_id"].as_str().unwrap();
                        assert!(open_calls.contains(&id), "output {id} without its call");
                        open_calls.retain(|c| *c != id);
                    } else {
                        assert!(open_calls.is_empty(), "a call lost its output");
                    }
                }
                assert!(open_calls.is_empty());
            }
            Fixture::Messages => {
                for pair in items.windows(2) {
                    let calls = tool_ids(&pair[0], "tool_use", "id");
                    if !calls.is_empty() {
                        assert_eq!(
                            tool_ids(&pair[1], "tool_result", "tool_use_id"),
                            calls,
                            "a call lost its results"
                        );
                    }
                }
            }
            // `assert_valid_gemini` pairs every call turn with its answers both ways.
            Fixture::Gemini => {}
        }
    }

    /// Fails unless the streamed reply `raw` came whole: chat's `[DONE]`, Responses'
    /// `response.completed`, Anthropic's `message_stop`, Gemini's last chunk with its finish
    /// reason.
    pub fn assert_stream_ended(self, raw: &str) {
        if self == Fixture::Chat {
            assert!(raw.ends_with("data: [DONE]\n\n"), "{raw}");
            return;
        }
        let last: Value = raw
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .next_back()
            .and_then(|data| serde_json::from_str(data.trim()).ok())
            .unwrap_or_else(|| panic!("{self:?}: no last event in {raw}"));
        match self {
            Fixture::Responses => assert_eq!(last["type"], "response.completed", "{raw}"),
            Fixture::Messages => assert_eq!(last["type"], "message_stop", "{raw}"),
            _ => assert!(
                last.pointer("/candidates/0/finishReason").is_some(),
                "{raw}"
            ),
        }
    }

    /// A proxy of `config` whose token ratio for this dialect's model is learned: one short
    /// conversation sent first, so that the counts a test relies on are those of every later
    /// request (an API reporting its usage moves the ratio after its first reply).
    pub async fn warmed(self, config: Config) -> Proxy {
        let proxy = Proxy::start(config).await;
        let body = self.agent_body(&self.agent_conversation_of(2));
        let (response, condensed) = self.post(&proxy, &body, false, &[]).await;
        assert_eq!(response.status(), 200, "{self:?}");
        assert_eq!(condensed.action, "forwarded", "{self:?}");
        proxy
    }

    /// The model a request upstream got asks for: its body's, or (Gemini) its path's.
    pub fn model_of(self, request: &Recorded) -> String {
        match self {
            Fixture::Gemini => request
                .path_and_query
                .split("/models/")
                .nth(1)
                .and_then(|rest| rest.split(':').next())
                .unwrap_or_default()
                .to_string(),
            _ => request.json()["model"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        }
    }
}

/// A request counted in the dialect `with_dialect` picks (`Fixture::count`).
struct Counting<'a> {
    body: &'a [u8],
    path: &'a str,
    catalog: &'a condenser::tokens::catalog::ModelCatalog,
}

impl condenser::dialect::WithDialect for Counting<'_> {
    type Output = u64;

    async fn with<D: condenser::dialect::stages::Dialect + 'static>(self) -> u64 {
        let request = D::parse(self.body, self.path).expect("a request of its dialect");
        let margin = Config::default().tokens.unknown_model_margin;
        let counter = condenser::tokens::counter::TokenCounter::new(margin);
        D::count(&request, self.catalog, &counter).await.count.total
    }
}

// Each dialect's conversations over the trigger, and what its API demands of them.

pub const DEVELOPER_HEAD: &str = "Always answer in English.";

/// A developer message (the head), then `rounds` of: a user message (facts planted in the
/// first), a function call, its output, and an assistant message; about 300 tokens a round.
pub fn tool_conversation(rounds: usize) -> Vec<Value> {
    let mut items =
        vec![json!({"type": "message", "role": "developer", "content": DEVELOPER_HEAD})];
    for t in 0..rounds {
        let user = user_turn(t)["content"].as_str().unwrap().to_string();
        items.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": user}]}));
        items.push(json!({"type": "function_call", "id": format!("fc_{t}"), "call_id": format!("call_{t}"), "name": "search", "arguments": format!("{{\"query\":\"q{t}\"}}")}));
        items.push(json!({"type": "function_call_output", "call_id": format!("call_{t}"), "output": format!("result-{t}. {}", filler(t + 500, 90))}));
        items.push(json!({"type": "message", "role": "assistant", "id": format!("msg_{t}"), "status": "completed", "content": [{"type": "output_text", "text": format!("msg-a{t}. {}", filler(t + 1000, 90)), "annotations": []}]}));
    }
    items
}

pub fn responses_body(input: &[Value]) -> Value {
    json!({
        "model": "gpt-4o",
        "instructions": SYSTEM_PROMPT,
        "input": input,
        "max_output_tokens": 500,
        "store": false,
        "tools": [{"type": "function", "name": "search", "description": "Search the notes.", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}],
    })
}

/// No tool output without its call before it; no kept call without the output it had.
pub fn assert_pairs_intact(original: &[Value], forwarded: &[Value]) {
    let is = |item: &Value, kind: &str| item["type"] == kind;
    let mut calls = HashSet::new();
    for item in forwarded {
        if is(item, "function_call") {
            calls.insert(item["call_id"].as_str().unwrap().to_string());
        } else if is(item, "function_call_output") {
            assert!(
                calls.contains(item["call_id"].as_str().unwrap()),
                "orphan output for {}",
                item["call_id"]
            );
        }
    }
    let outputs: HashSet<&str> = forwarded
        .iter()
        .filter(|item| is(item, "function_call_output"))
        .filter_map(|item| item["call_id"].as_str())
        .collect();
    let answered: HashSet<&str> = original
        .iter()
        .filter(|item| is(item, "function_call_output"))
        .filter_map(|item| item["call_id"].as_str())
        .collect();
    for call in forwarded.iter().filter(|item| is(item, "function_call")) {
        let id = call["call_id"].as_str().unwrap();
        assert!(
            !answered.contains(id) || outputs.contains(id),
            "call {id} kept without its output"
        );
    }
}

pub fn tool_ids<'a>(message: &'a Value, kind: &str, field: &str) -> Vec<&'a str> {
    message["content"]
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter(|b| b["type"] == kind)
                .filter_map(|b| b[field].as_str())
                .collect()
        })
        .unwrap_or_default()
}

/// What Anthropic demands of `messages`: a user turn first, roles alternating, each
/// `tool_result` answering a `tool_use` of the turn just before it.
pub fn assert_valid_messages(messages: &[Value]) {
    assert_eq!(messages[0]["role"], "user", "{:#}", messages[0]);
    for pair in messages.windows(2) {
        assert_ne!(pair[0]["role"], pair[1]["role"], "roles do not alternate");
    }
    for (i, message) in messages.iter().enumerate() {
        for id in tool_ids(message, "tool_result", "tool_use_id") {
            assert!(i > 0, "the conversation opens with a tool result");
            let calls = tool_ids(&messages[i - 1], "tool_use", "id");
            assert!(calls.contains(&id), "orphan tool result {id}");
        }
    }
}

pub fn part_names(turn: &Value, kind: &str) -> Vec<String> {
    turn["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p[kind]["id"].as_str().map(String::from))
        .collect()
}

/// What Gemini demands of `contents`: a user turn first, every function response turn right
/// after the call turn it answers (ids in order), every call of a kept turn answered; and
/// each call carries the signature the model gave it, verbatim.
pub fn assert_valid_gemini(body: &Value) {
    let turns = body["contents"].as_array().unwrap();
    assert_eq!(turns[0]["role"], "user", "{:#}", turns[0]);
    for (i, turn) in turns.iter().enumerate() {
        let answered = part_names(turn, "functionResponse");
        if !answered.is_empty() {
            assert_eq!(
                part_names(&turns[i - 1], "functionCall"),
                answered,
                "turn {i}"
            );
        }
        let calls = part_names(turn, "functionCall");
        if !calls.is_empty() && i + 1 < turns.len() {
            assert_eq!(
                part_names(&turns[i + 1], "functionResponse"),
                calls,
                "turn {i}"
            );
        }
        for part in turn["parts"].as_array().unwrap() {
            if let Some(id) = part["functionCall"]["id"].as_str() {
                let t: usize = id.trim_start_matches("call-").parse().unwrap();
                assert_eq!(part["thoughtSignature"], thought_signature(t), "{id}");
            }
        }
    }
}

/// A mock Gemini (`mock_gemini`) whose summarizer is a `mock_llm` with `behaviour`: every
/// request recorded here.
async fn gemini_before_llm(behaviour: LlmBehaviour) -> MockUpstream {
    let cache = behaviour.prompt_cache.clone();
    let limit = behaviour.clone();
    let gemini = mock_gemini(GeminiBehaviour::default()).await.url();
    let llm = mock_llm(behaviour).await.url();
    let http = client();
    MockUpstream::start(handler(move |r| {
        let summarizing = is_summarizer_call(&r);
        // Over the window its behaviour gives the model, Gemini's too-long error.
        let refused = (!summarizing && limit.too_long.is_some())
            .then(|| too_long(&limit, &r.json()["contents"]).cloned())
            .flatten();
        let to = if summarizing {
            llm.clone()
        } else {
            gemini.clone()
        };
        // The prompt and its cached share as the cache counts them, when one is kept.
        let counted = cache
            .as_ref()
            .filter(|_| !summarizing)
            .map(|cache| cache.prompt(&r.json()));
        let http = http.clone();
        async move {
            if let Some(error) = refused {
                return json_response(400, &error);
            }
            let mut relayed = http
                .post(format!("{to}{}", r.path_and_query))
                .body(r.body.clone());
            for (name, value) in &r.headers {
                if name != "host" && name != "content-length" {
                    relayed = relayed.header(name, value);
                }
            }
            let answer = relayed.send().await.unwrap();
            let status = answer.status().as_u16();
            let streamed = answer
                .headers()
                .get("content-type")
                .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
            let mut bytes = answer.bytes().await.unwrap();
            if let Some(counted) = counted {
                bytes = with_cached_usage(&bytes, counted);
            }
            let mut reply = Response::builder().status(status);
            if streamed {
                reply = reply.header("content-type", "text/event-stream");
            } else {
                reply = reply.header("content-type", "application/json");
            }
            reply.body(condenser::transport::body::full(bytes)).unwrap()
        }
    }))
    .await
}

/// A Gemini reply (JSON, or SSE events) whose usage reports `counted`: the prompt, and of it
/// the share cached.
fn with_cached_usage(reply: &[u8], counted: CachedPrompt) -> Bytes {
    let usage = |value: &mut Value| {
        if let Some(usage) = value
            .get_mut("usageMetadata")
            .and_then(Value::as_object_mut)
        {
            usage.insert("promptTokenCount".into(), json!(counted.prompt_tokens));
            if usage.contains_key("cachedContentTokenCount") {
                usage.insert(
                    "cachedContentTokenCount".into(),
                    json!(counted.cached_tokens),
                );
            }
        }
    };
    let text = std::str::from_utf8(reply).unwrap();
    if let Ok(mut whole) = serde_json::from_str::<Value>(text) {
        usage(&mut whole);
        return Bytes::from(whole.to_string());
    }
    let events: String = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| {
            let mut chunk: Value = serde_json::from_str(data).unwrap();
            usage(&mut chunk);
            format!("data: {chunk}\r\n\r\n")
        })
        .collect();
    Bytes::from(events)
}

/// The texts of a Gemini reply's (or chunk's) first candidate.
fn gemini_text(reply: &Value) -> String {
    reply
        .pointer("/candidates/0/content/parts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|part| part["text"].as_str())
        .collect()
}

fn gemini_usage() -> Value {
    json!({"promptTokenCount": 100, "candidatesTokenCount": 10, "totalTokenCount": 110})
}

/// Gemini parts calling `calls`, each with its id (`call_N`).
fn gemini_calls(calls: &[(&str, Value)]) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"functionCall": {"id": format!("call_{i}"), "name": name, "args": args}})
        })
        .collect()
}

/// A Gemini SSE event of `parts`; the last of a stream with its finish reason and usage.
fn gemini_chunk(parts: Value, last: bool) -> String {
    let mut chunk = gemini_reply(parts, gemini_usage());
    if !last {
        chunk["candidates"][0]
            .as_object_mut()
            .unwrap()
            .remove("finishReason");
        chunk.as_object_mut().unwrap().remove("usageMetadata");
    }
    format!("data: {chunk}\r\n\r\n")
}

/// The tools a Responses reply echoes, as the API echoes the request's: the recall tool among
/// them, for condenser to take out.
fn echoed_tools() -> Value {
    json!([{"type": "function", "name": RECALL_TOOL, "parameters": {}}])
}

/// Whether a tool answer answers a call of the scripted model's (`call_N`), not one of the
/// client's own in the conversation it was sent.
fn answers_a_recall(call_id: &Value) -> bool {
    call_id.as_str().is_some_and(|id| id.starts_with("call_"))
}

fn chat_chunk(delta: Value, finish: Option<&str>) -> String {
    let chunk = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4o",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {chunk}\n\n")
}

fn chat_usage() -> String {
    let chunk = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}});
    format!("data: {chunk}\n\n")
}

/// Responses events as the API streams them: each named by its type and numbered in order.
fn responses_events(data: Vec<Value>) -> Vec<String> {
    data.into_iter()
        .enumerate()
        .map(|(n, mut data)| {
            data["sequence_number"] = json!(n);
            format!(
                "event: {}\ndata: {data}\n\n",
                data["type"].as_str().unwrap()
            )
        })
        .collect()
}

pub fn anthropic_event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

pub fn message_start() -> String {
    anthropic_event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "content": [], "stop_reason": null, "usage": {"input_tokens": 100, "output_tokens": 1}}}),
    )
}

pub fn message_end(stop: &str) -> String {
    anthropic_event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 10}}),
    )
}

/// A streamed reply: its first event at once, the rest after `gate` (when given) is notified.
pub fn sse_response(events: Vec<String>, gate: Option<Arc<Notify>>) -> Response<ProxyBody> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    tokio::spawn(async move {
        let mut events = events.into_iter();
        if let Some(first) = events.next() {
            if tx.send(Bytes::from(first)).await.is_err() {
                return;
            }
        }
        if let Some(gate) = gate {
            gate.notified().await;
        }
        for event in events {
            if tx.send(Bytes::from(event)).await.is_err() {
                return;
            }
        }
    });
    let frames = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
        .map(|chunk| Ok::<_, BoxError>(hyper::body::Frame::data(chunk)));
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(http_body_util::StreamBody::new(frames).boxed_unsync())
        .unwrap()
}

/// The registry and the fixtures agree: every dialect has one, named and routed as the
/// registry names and routes it.
#[test]
fn every_dialect_of_the_registry_has_a_fixture() {
    let fixtures = Fixture::all();
    assert_eq!(fixtures.len(), DIALECTS.len());
    for fixture in fixtures {
        let wire = fixture.wire();
        assert_eq!(wire.name, fixture.name());
        assert_eq!(wire.route.name(), fixture.route(), "{fixture:?}");
        assert!(
            (wire.compacts)(fixture.path(false).as_str()),
            "{fixture:?} compacts {}",
            fixture.path(false)
        );
    }
}
