//! The recall tool in Anthropic's Messages format: a `tools` entry with an `input_schema`,
//! called by `tool_use` content blocks, answered by `tool_result` blocks in a user turn. A
//! streamed call is a `content_block_start` of a `tool_use` block, its `input_json_delta`s
//! and its `content_block_stop`; those never reach the client, and the blocks after them are
//! renumbered so the client's indices have no gap. A continuation's assistant turn is the
//! round's own content, so with extended thinking it opens with the round's signed thinking
//! blocks, as Anthropic requires.

use bytes::Bytes;
use hyper::StatusCode;
use serde_json::{json, Map, Value};

use crate::dialect::messages::error::error_body;
use crate::dialect::recall::{
    append_text, names_the_tool, parameters, slot, text_of, Answered, ClientView, Fields, Kind,
    Part, RecallCall, RecallWire, Relayed, StopReason, StreamWire, TOOL_DESCRIPTION, TOOL_NAME,
};

/// The recall tool as Anthropic's Messages API writes it.
pub struct MessagesRecall;

/// How Messages streams read, for recall.
struct MessagesStream;

const TOOL_USE: &str = "tool_use";

const FIELDS: Fields = Fields {
    id: Some("id"),
    usage: "usage",
    output_tokens: "/usage/output_tokens",
    stop: Some(StopReason {
        at: "/stop_reason",
        calling: Some(TOOL_USE),
        ended: "end_turn",
    }),
};

impl RecallWire for MessagesRecall {
    fn tool(&self) -> Value {
        json!({"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "input_schema": parameters()})
    }

    fn fields(&self) -> &'static Fields {
        &FIELDS
    }

    fn parts_of<'a>(&self, reply: &'a Value) -> Vec<&'a Value> {
        content(reply).collect()
    }

    fn part(&self, block: &Value, _index: usize) -> Part {
        let recall = is_recall(block)
            .then(|| RecallCall::of_object(text_of(block, "id"), block.get("input")));
        Part::of(recall, is_tool_use(block))
    }

    /// A reply without a `content` array (an error) has no place for parts.
    fn take_parts(&self, reply: &mut Value) -> Option<Vec<Value>> {
        let Some(Value::Array(blocks)) = reply.get_mut("content") else {
            return None;
        };
        Some(
            std::mem::take(blocks)
                .into_iter()
                .filter(is_block)
                .collect(),
        )
    }

    fn put_parts(&self, reply: &mut Value, blocks: Vec<Value>) {
        if let Some(reply) = reply.as_object_mut() {
            reply.insert("content".into(), Value::Array(blocks));
        }
    }

    fn call(&self, call: &RecallCall) -> Value {
        json!({"type": TOOL_USE, "id": call.id, "name": TOOL_NAME,
            "input": input_of(&call.arguments)})
    }

    fn result(&self, answered: &Answered, _call: &Value) -> Value {
        let mut result = json!({
            "type": "tool_result",
            "tool_use_id": answered.call.id,
            "content": answered.text,
        });
        if answered.is_error {
            result["is_error"] = Value::Bool(true);
        }
        result
    }

    fn append(&self, request: &mut Map<String, Value>, said: Vec<Value>, results: Vec<Value>) {
        if let Some(Value::Array(messages)) = request.get_mut("messages") {
            messages.push(json!({"role": "assistant", "content": said}));
            messages.push(json!({"role": "user", "content": results}));
        }
    }

    fn stop_calling(&self, request: &mut Map<String, Value>) {
        request.insert("tool_choice".into(), json!({"type": "none"}));
    }

    fn stream(&self) -> &'static dyn StreamWire {
        &MessagesStream
    }
}

fn content(reply: &Value) -> impl Iterator<Item = &Value> {
    let blocks = reply.get("content").and_then(Value::as_array);
    blocks.into_iter().flatten().filter(|block| is_block(block))
}

/// A streamed round's blocks are gathered by index: a gap left by a block never started is
/// no block.
fn is_block(block: &Value) -> bool {
    block.is_object()
}

/// A client tool call; server tools (`server_tool_use`) are the provider's own.
fn is_tool_use(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some(TOOL_USE)
}

fn is_recall(block: &Value) -> bool {
    is_tool_use(block) && names_the_tool(block)
}

/// A call's arguments as a `tool_use` input, which must be an object: `{}` when they are not.
fn input_of(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(input @ Value::Object(_)) => input,
        _ => json!({}),
    }
}

fn index_of(data: &Value) -> Option<u64> {
    data.get("index").and_then(Value::as_u64)
}

/// The field of a block each delta type appends its text to.
fn delta_field(kind: &str) -> Option<(&'static str, &'static str)> {
    match kind {
        "text_delta" => Some(("text", "text")),
        "thinking_delta" => Some(("thinking", "thinking")),
        "signature_delta" => Some(("signature", "signature")),
        // A tool's input streams as JSON text, read whole when its block stops.
        "input_json_delta" => Some(("partial_json", "input")),
        _ => None,
    }
}

impl StreamWire for MessagesStream {
    fn kind(&self, data: &Value) -> Kind {
        match data.get("type").and_then(Value::as_str) {
            Some("message_start") => Kind::Opening,
            Some("message_delta" | "message_stop") => Kind::Closing,
            _ => Kind::Body,
        }
    }

    fn gather(&self, round: &mut Value, data: &Value) {
        let kind = data.get("type").and_then(Value::as_str).unwrap_or_default();
        if kind == "message_start" {
            if let Some(message) = data.get("message") {
                *round = message.clone();
            }
            return;
        }
        let Some(round) = round.as_object_mut() else {
            return;
        };
        if kind == "message_delta" {
            if let Some(delta) = data.get("delta").and_then(Value::as_object) {
                round.extend(delta.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            // Its counts are the round's so far: each replaces the start's.
            if let Some(Value::Object(usage)) = data.get("usage") {
                let own = round.entry("usage").or_insert_with(|| json!({}));
                if let Some(own) = own.as_object_mut() {
                    own.extend(usage.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
            }
            return;
        }
        let Some(index) = index_of(data).and_then(|i| usize::try_from(i).ok()) else {
            return;
        };
        let content = round.entry("content").or_insert_with(|| json!([]));
        let Some(content) = content.as_array_mut() else {
            return;
        };
        if kind == "content_block_start" {
            let mut block = data.get("content_block").cloned().unwrap_or(Value::Null);
            if is_tool_use(&block) {
                block["input"] = json!("");
            }
            if let Some(place) = slot(content, index) {
                *place = block;
            }
            return;
        }
        let Some(block) = content.get_mut(index).and_then(Value::as_object_mut) else {
            return;
        };
        match kind {
            "content_block_delta" => {
                let Some(delta) = data.get("delta") else {
                    return;
                };
                let delta_kind = delta
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if let Some((from, to)) = delta_field(delta_kind) {
                    if let Some(text) = delta.get(from).and_then(Value::as_str) {
                        append_text(block, to, text);
                    }
                } else if let Some(citation) = delta.get("citation") {
                    let citations = block.entry("citations").or_insert_with(|| json!([]));
                    if let Some(citations) = citations.as_array_mut() {
                        citations.push(citation.clone());
                    }
                }
            }
            "content_block_stop" => {
                if let Some(Value::String(json)) = block.get("input") {
                    let input = input_of(json);
                    block.insert("input".into(), input);
                }
            }
            _ => {}
        }
    }

    fn relay(&self, data: &mut Value, view: &mut ClientView) -> Relayed {
        let Some(index) = index_of(data) else {
            return Relayed::AsItCame;
        };
        if let Some(block) = data.get("content_block") {
            view.start(index, is_recall(block));
        }
        if view.held(index) {
            return Relayed::Dropped;
        }
        match view.shown(index).filter(|&shown| shown != index) {
            Some(shown) => {
                data["index"] = shown.into();
                Relayed::Changed
            }
            None => Relayed::AsItCame,
        }
    }

    /// The last round's `message_delta` with usage summed over every round (the counts its
    /// own event carries, and output always), and the stop reason of the reply merged.
    fn close(&self, closing: &mut [Value], merged: &Value, view: &mut ClientView) {
        for data in closing {
            if data.get("type").and_then(Value::as_str) != Some("message_delta") {
                continue;
            }
            if let (Some(stop), Some(delta)) = (
                merged.get("stop_reason"),
                data.get_mut("delta").and_then(Value::as_object_mut),
            ) {
                delta.insert("stop_reason".into(), stop.clone());
            }
            let (true, Some(total)) = (view.continued, merged.get("usage")) else {
                continue;
            };
            let usage = data
                .as_object_mut()
                .map(|d| d.entry("usage").or_insert_with(|| json!({})));
            if let Some(Value::Object(usage)) = usage {
                let mut named: Vec<String> = usage.keys().cloned().collect();
                named.push("output_tokens".into());
                for name in named {
                    if let Some(count) = total.get(&name) {
                        usage.insert(name, count.clone());
                    }
                }
            }
        }
    }

    /// Anthropic's `error` event, which its SDKs raise.
    fn failed(&self, message: &str, _view: &mut ClientView) -> Bytes {
        let error = error_body(StatusCode::INTERNAL_SERVER_ERROR, message);
        Bytes::from(format!("event: error\ndata: {error}\n\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::recall::testing::{call, object};
    use crate::dialect::recall::{RecallPolicy, RoundCalls, Stitched};

    #[test]
    fn offer_appends_the_tool_last_and_only_once() {
        let mut request = object(json!({
            "model": "claude",
            "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
            "messages": [],
        }));
        MessagesRecall.offer(&mut request);
        MessagesRecall.offer(&mut request);
        let tools = request["tools"].as_array().cloned().unwrap_or_default();
        assert_eq!(tools.len(), 2);
        assert_eq!(tools[0]["name"], "bash");
        assert_eq!(
            tools[1],
            json!({"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "input_schema": parameters()})
        );
        let fields: Vec<&String> = request.keys().collect();
        assert_eq!(fields, ["model", "tools", "messages"]);

        let mut bare = object(json!({"model": "claude", "messages": []}));
        MessagesRecall.offer(&mut bare);
        assert_eq!(bare["tools"][0]["name"], TOOL_NAME);
    }

    #[test]
    fn calls_tell_recall_from_client_tools_and_ignore_server_tools() {
        let recall_only = json!({"content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": TOOL_NAME, "input": {"refs": ["ctx:1"]}},
        ]});
        assert_eq!(
            RoundCalls::of(MessagesRecall.parts(&recall_only)),
            RoundCalls {
                recall: vec![call("toolu_1", r#"{"refs":["ctx:1"]}"#)],
                client_calls: false,
            }
        );

        let mixed = json!({"content": [
            {"type": "tool_use", "id": "toolu_1", "name": TOOL_NAME, "input": {"query": "port"}},
            {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"command": "ls"}},
        ]});
        let calls = RoundCalls::of(MessagesRecall.parts(&mixed));
        assert_eq!(calls.recall, vec![call("toolu_1", r#"{"query":"port"}"#)]);
        assert!(calls.client_calls);

        let server = json!({"content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            {"type": "text", "text": "Found it."},
        ]});
        assert_eq!(
            RoundCalls::of(MessagesRecall.parts(&server)),
            RoundCalls::default()
        );
    }

    #[test]
    fn continue_with_appends_the_calls_and_their_answers_and_stops_tools_on_the_last_round() {
        let mut request = object(json!({
            "model": "claude",
            "messages": [{"role": "user", "content": "Which port?"}],
            "max_tokens": 100,
        }));
        let found = call("toolu_1", r#"{"refs":["ctx:1"]}"#);
        let broken = call("toolu_2", "{not json");
        let answered = [
            Answered {
                call: &found,
                text: "we bind the service to port 23456",
                is_error: false,
            },
            Answered {
                call: &broken,
                text: "unknown reference",
                is_error: true,
            },
        ];
        MessagesRecall.continue_with(&mut request, &json!({}), &answered, false);
        assert!(!request.contains_key("tool_choice"));
        assert_eq!(request["max_tokens"], 100);
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(messages.len(), 3);
        assert_eq!(
            messages[1],
            json!({"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": TOOL_NAME, "input": {"refs": ["ctx:1"]}},
                {"type": "tool_use", "id": "toolu_2", "name": TOOL_NAME, "input": {}},
            ]})
        );
        assert_eq!(
            messages[2],
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "we bind the service to port 23456"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "unknown reference", "is_error": true},
            ]})
        );

        MessagesRecall.continue_with(&mut request, &json!({}), &answered[..1], true);
        assert_eq!(request["tool_choice"], json!({"type": "none"}));
        assert_eq!(request["messages"].as_array().map(Vec::len), Some(5));
    }

    #[test]
    fn merge_takes_recall_out_puts_earlier_rounds_first_and_sums_usage() {
        let first = json!({
            "id": "msg_1", "type": "message", "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": TOOL_NAME, "input": {}},
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 100, "output_tokens": 10, "cache_read_input_tokens": 50},
        });
        let merged = MessagesRecall.merge(None, first);
        assert_eq!(
            merged["content"],
            json!([{"type": "text", "text": "Let me look."}])
        );
        let second = json!({
            "id": "msg_2", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": "Port 23456."}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 120, "output_tokens": 5, "cache_creation_input_tokens": 7},
        });
        let merged = MessagesRecall.merge(Some(merged), second);
        assert_eq!(merged["id"], "msg_1");
        assert_eq!(merged["stop_reason"], "end_turn");
        assert_eq!(
            merged["content"],
            json!([
                {"type": "text", "text": "Let me look."},
                {"type": "text", "text": "Port 23456."},
            ])
        );
        assert_eq!(
            merged["usage"],
            json!({
                "input_tokens": 220, "output_tokens": 15,
                "cache_creation_input_tokens": 7, "cache_read_input_tokens": 50,
            })
        );
    }

    #[test]
    fn merge_keeps_client_calls_and_their_stop_reason() {
        let reply = json!({
            "id": "msg_1",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": TOOL_NAME, "input": {}},
                {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {}},
            ],
            "stop_reason": "tool_use",
        });
        let merged = MessagesRecall.merge(None, reply);
        assert_eq!(merged["stop_reason"], "tool_use");
        assert_eq!(merged["content"].as_array().map(Vec::len), Some(1));
        assert_eq!(merged["content"][0]["name"], "bash");
    }

    fn sse(data: Value) -> String {
        let kind = data["type"].as_str().unwrap_or_default().to_owned();
        format!("event: {kind}\ndata: {data}\n\n")
    }

    fn data(event: &Bytes) -> Value {
        let text = String::from_utf8_lossy(event);
        let line = text
            .lines()
            .find_map(|line| line.strip_prefix("data: "))
            .unwrap_or_default();
        serde_json::from_str(line).unwrap_or(Value::Null)
    }

    fn message_start(input_tokens: u64) -> String {
        sse(json!({"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "content": [],
            "stop_reason": null, "usage": {"input_tokens": input_tokens, "output_tokens": 1},
        }}))
    }

    fn text_block(index: usize, text: &str) -> Vec<String> {
        vec![
            sse(json!({"type": "content_block_start", "index": index,
                "content_block": {"type": "text", "text": ""}})),
            sse(json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "text_delta", "text": text}})),
            sse(json!({"type": "content_block_stop", "index": index})),
        ]
    }

    fn tool_block(index: usize, id: &str, name: &str, parts: &[&str]) -> Vec<String> {
        let mut events = vec![sse(json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}))];
        events.extend(parts.iter().map(|part| {
            sse(json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": part}}))
        }));
        events.push(sse(json!({"type": "content_block_stop", "index": index})));
        events
    }

    fn closing(stop_reason: &str, output_tokens: u64) -> Vec<String> {
        vec![
            sse(json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                "usage": {"output_tokens": output_tokens}})),
            sse(json!({"type": "message_stop"})),
        ]
    }

    /// Feeds events one by one; what the client got of them, with each event's input kept
    /// beside its output.
    fn feed(stream: &mut Stitched, events: &[String]) -> Vec<(String, Option<Bytes>)> {
        events
            .iter()
            .map(|event| {
                (
                    event.clone(),
                    stream.event(bytes::Bytes::copy_from_slice(event.as_bytes())),
                )
            })
            .collect()
    }

    fn passed(fed: &[(String, Option<Bytes>)]) -> Vec<Value> {
        fed.iter()
            .filter_map(|(_, out)| out.as_ref().map(data))
            .collect()
    }

    fn thinking_block(index: usize, thinking: &[&str], signature: &str) -> Vec<String> {
        let mut events = vec![sse(json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""}}))];
        events.extend(thinking.iter().map(|part| {
            sse(json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "thinking_delta", "thinking": part}}))
        }));
        events.push(sse(json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "signature_delta", "signature": signature}})));
        events.push(sse(json!({"type": "content_block_stop", "index": index})));
        events
    }

    /// Anthropic takes a continued assistant turn only when it opens with the round's
    /// thinking blocks, signed, as the model wrote them: the streamed round is gathered
    /// whole, and the continuation carries it.
    #[test]
    fn a_streamed_thinking_round_is_carried_whole_signature_and_all() {
        let mut stream = Stitched::new(&MessagesRecall);
        let mut round = vec![message_start(100)];
        round.extend(thinking_block(
            0,
            &["The port was ", "set early on."],
            "c2lnbmVk",
        ));
        round.push(sse(json!({"type": "content_block_start", "index": 1,
            "content_block": {"type": "redacted_thinking", "data": "b3BhcXVl"}})));
        round.push(sse(json!({"type": "content_block_stop", "index": 1})));
        round.extend(text_block(2, "Let me look."));
        round.extend(tool_block(
            3,
            "toolu_1",
            TOOL_NAME,
            &["{\"query\":", " \"port\"}"],
        ));
        round.extend(closing("tool_use", 20));
        let fed = feed(&mut stream, &round);
        // The thinking reaches the client as it came; the call does not.
        let shown = passed(&fed);
        assert_eq!(shown[1]["content_block"]["type"], "thinking");
        assert!(!shown
            .iter()
            .any(|event| event.to_string().contains(TOOL_NAME)));

        let round = stream.round_end();
        assert_eq!(round.calls.recall, [call("toolu_1", r#"{"query":"port"}"#)]);
        let mut request = object(json!({"model": "claude", "thinking": {"type": "adaptive"},
            "messages": [{"role": "user", "content": "Which port?"}]}));
        assert!(MessagesRecall.serves(&request));
        let found = call("toolu_1", r#"{"query":"port"}"#);
        let answered = [Answered {
            call: &found,
            text: "port 23456",
            is_error: false,
        }];
        MessagesRecall.continue_with(&mut request, &round.reply, &answered, false);
        assert_eq!(
            request["messages"][1],
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "The port was set early on.", "signature": "c2lnbmVk"},
                {"type": "redacted_thinking", "data": "b3BhcXVl"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": TOOL_NAME, "input": {"query": "port"}},
            ]})
        );
        assert_eq!(
            request["messages"][2]["content"][0]["tool_use_id"],
            "toolu_1"
        );
    }

    #[test]
    fn a_recall_call_streamed_is_held_and_the_continuation_stitched_in() {
        let mut stream = Stitched::new(&MessagesRecall);
        let mut round_one = vec![message_start(100)];
        round_one.extend(text_block(0, "Let me look."));
        round_one.extend(tool_block(
            1,
            "toolu_1",
            TOOL_NAME,
            &["{\"refs\":", " [\"ctx:1\"]}"],
        ));
        round_one.extend(closing("tool_use", 20));
        let fed = feed(&mut stream, &round_one);

        // message_start and the text block pass unchanged, as they come; nothing else does.
        for (input, output) in &fed[..4] {
            assert_eq!(output.as_deref(), Some(input.as_bytes()));
        }
        assert!(fed[4..].iter().all(|(_, output)| output.is_none()));
        assert_eq!(
            stream.round_end().calls,
            RoundCalls {
                recall: vec![call("toolu_1", r#"{"refs":["ctx:1"]}"#)],
                client_calls: false,
            }
        );

        stream.next_round();
        let mut round_two = vec![message_start(150)];
        round_two.extend(text_block(0, "Port 23456."));
        round_two.extend(closing("end_turn", 7));
        let fed = feed(&mut stream, &round_two);
        let seen = passed(&fed);
        assert_eq!(
            seen.iter().map(|event| &event["type"]).collect::<Vec<_>>(),
            [
                "content_block_start",
                "content_block_delta",
                "content_block_stop"
            ]
        );
        assert!(seen.iter().all(|event| event["index"] == 1));
        assert_eq!(seen[1]["delta"]["text"], "Port 23456.");
        assert_eq!(stream.round_end().calls, RoundCalls::default());

        let closed = stream.close();
        let text = String::from_utf8_lossy(&closed).into_owned();
        let events: Vec<&str> = text.split_inclusive("\n\n").collect();
        assert_eq!(events.len(), 2);
        let delta = data(&Bytes::from(events[0].to_owned()));
        assert_eq!(delta["type"], "message_delta");
        assert_eq!(delta["delta"]["stop_reason"], "end_turn");
        assert_eq!(delta["usage"], json!({"output_tokens": 27}));
        assert_eq!(events[1], sse(json!({"type": "message_stop"})));
        assert!(stream.close().is_empty());
    }

    #[test]
    fn a_closing_delta_that_carries_prompt_counts_gets_them_summed() {
        let mut stream = Stitched::new(&MessagesRecall);
        let mut round_one = vec![message_start(100)];
        round_one.extend(tool_block(0, "toolu_1", TOOL_NAME, &[]));
        round_one.extend(closing("tool_use", 20));
        feed(&mut stream, &round_one);
        assert_eq!(stream.round_end().calls.recall, vec![call("toolu_1", "{}")]);
        stream.next_round();
        let round_two = [
            message_start(150),
            sse(
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                "usage": {"input_tokens": 150, "output_tokens": 7}}),
            ),
        ];
        feed(&mut stream, &round_two);
        let closed = stream.close();
        assert_eq!(
            data(&closed)["usage"],
            json!({"input_tokens": 250, "output_tokens": 27})
        );
    }

    #[test]
    fn a_mixed_round_passes_the_client_call_without_a_gap_and_says_so() {
        let mut stream = Stitched::new(&MessagesRecall);
        let mut events = vec![message_start(100)];
        events.extend(tool_block(0, "toolu_1", TOOL_NAME, &["{}"]));
        events.extend(tool_block(1, "toolu_2", "bash", &["{\"command\":\"ls\"}"]));
        events.extend(closing("tool_use", 30));
        let fed = feed(&mut stream, &events);
        let seen = passed(&fed);
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[1]["content_block"]["name"], "bash");
        assert!(seen[1..].iter().all(|event| event["index"] == 0));
        let calls = stream.round_end().calls;
        assert!(calls.client_calls);
        assert_eq!(calls.recall, vec![call("toolu_1", "{}")]);

        // One round only, and it stopped for the client's call: the closing events unchanged.
        let closed = stream.close();
        assert_eq!(closed, closing("tool_use", 30).concat().as_bytes());
    }

    #[test]
    fn a_round_that_ends_on_recall_alone_closes_as_end_turn() {
        let mut stream = Stitched::new(&MessagesRecall);
        let mut events = vec![message_start(100)];
        events.extend(tool_block(0, "toolu_1", TOOL_NAME, &["{}"]));
        events.extend(closing("tool_use", 30));
        feed(&mut stream, &events);
        stream.round_end();
        let closed = stream.close();
        assert_eq!(data(&closed)["delta"]["stop_reason"], "end_turn");
        assert_eq!(data(&closed)["usage"]["output_tokens"], 30);
    }

    #[test]
    fn pings_errors_and_server_tools_pass_through() {
        let mut stream = Stitched::new(&MessagesRecall);
        let events = [
            message_start(10),
            sse(json!({"type": "ping"})),
            sse(
                json!({"type": "content_block_start", "index": 0, "content_block":
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}}),
            ),
            sse(json!({"type": "content_block_stop", "index": 0})),
            sse(json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})),
        ];
        let fed = feed(&mut stream, &events);
        for (input, output) in &fed {
            assert_eq!(output.as_deref(), Some(input.as_bytes()));
        }
        assert!(!stream.round_end().calls.client_calls);
    }
}
