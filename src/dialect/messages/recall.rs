//! The recall tool in Anthropic's Messages format: a `tools` entry with an `input_schema`,
//! called by `tool_use` content blocks, answered by `tool_result` blocks in a user turn. A
//! streamed call is a `content_block_start` of a `tool_use` block, its `input_json_delta`s
//! and its `content_block_stop`; those never reach the client, and the blocks after them are
//! renumbered so the client's indices have no gap.

use std::borrow::Cow;
use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::dialect::recall::{
    parameters, Answered, RecallCall, RecallStream, RecallWire, RoundCalls, TOOL_DESCRIPTION,
    TOOL_NAME,
};
use crate::transport::usage::event_data;

/// The recall tool as Anthropic's Messages API writes it.
pub struct MessagesRecall;

impl RecallWire for MessagesRecall {
    /// Not with extended thinking: Anthropic takes a continued assistant turn only when it
    /// opens with the round's signed thinking blocks, which the continuation does not carry.
    fn serves(&self, request: &Map<String, Value>) -> bool {
        let thinking = request
            .get("thinking")
            .and_then(|thinking| thinking.get("type"))
            .and_then(Value::as_str);
        matches!(thinking, None | Some("disabled"))
    }

    fn offer(&self, request: &mut Map<String, Value>) {
        let tools = request
            .entry("tools")
            .or_insert_with(|| Value::Array(Vec::new()));
        let Value::Array(tools) = tools else {
            return;
        };
        let offered = tools
            .iter()
            .any(|tool| tool.get("name").and_then(Value::as_str) == Some(TOOL_NAME));
        if !offered {
            tools.push(json!({
                "name": TOOL_NAME,
                "description": TOOL_DESCRIPTION,
                "input_schema": parameters(),
            }));
        }
    }

    fn calls(&self, reply: &Value) -> RoundCalls {
        let mut calls = RoundCalls::default();
        for block in content(reply) {
            if is_recall(block) {
                calls.recall.push(RecallCall {
                    id: text_field(block, "id"),
                    arguments: block
                        .get("input")
                        .map_or_else(|| "{}".to_owned(), Value::to_string),
                });
            } else if is_tool_use(block) {
                calls.client_calls = true;
            }
        }
        calls
    }

    fn continue_with(&self, request: &mut Map<String, Value>, answered: &[Answered], last: bool) {
        let uses: Vec<Value> = answered
            .iter()
            .map(|answer| {
                json!({
                    "type": "tool_use",
                    "id": answer.call.id,
                    "name": TOOL_NAME,
                    "input": input_of(&answer.call.arguments),
                })
            })
            .collect();
        let results: Vec<Value> = answered
            .iter()
            .map(|answer| {
                let mut result = json!({
                    "type": "tool_result",
                    "tool_use_id": answer.call.id,
                    "content": answer.text,
                });
                if answer.is_error {
                    result["is_error"] = Value::Bool(true);
                }
                result
            })
            .collect();
        if let Some(Value::Array(messages)) = request.get_mut("messages") {
            messages.push(json!({"role": "assistant", "content": uses}));
            messages.push(json!({"role": "user", "content": results}));
        }
        if last {
            request.insert("tool_choice".into(), json!({"type": "none"}));
        }
    }

    /// A reply without a `content` array (an error) is left as it is.
    fn merge(&self, earlier: Option<Value>, reply: Value) -> Value {
        let Value::Object(mut reply) = reply else {
            return reply;
        };
        let Some(Value::Array(own)) = reply.remove("content") else {
            return Value::Object(reply);
        };
        let own: Vec<Value> = own.into_iter().filter(|block| !is_recall(block)).collect();
        let client_calls = own.iter().any(is_tool_use);
        let mut merged = Vec::new();
        if let Some(Value::Object(mut earlier)) = earlier {
            if let Some(Value::Array(blocks)) = earlier.remove("content") {
                merged = blocks;
            }
            let counts = usage_counts(earlier.get("usage")).plus(usage_counts(reply.get("usage")));
            if let Some(usage) = usage_map(&mut reply) {
                counts.write(usage);
            }
            if let Some(id) = earlier.remove("id") {
                reply.insert("id".into(), id);
            }
        }
        merged.extend(own);
        reply.insert("content".into(), Value::Array(merged));
        if reply.get("stop_reason").and_then(Value::as_str) == Some(TOOL_USE) && !client_calls {
            reply.insert("stop_reason".into(), Value::from(END_TURN));
        }
        Value::Object(reply)
    }

    fn stream(&self) -> Box<dyn RecallStream> {
        Box::<MessagesRecallStream>::default()
    }
}

const TOOL_USE: &str = "tool_use";
const END_TURN: &str = "end_turn";

fn content(reply: &Value) -> impl Iterator<Item = &Value> {
    reply
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// A client tool call; server tools (`server_tool_use`) are the provider's own.
fn is_tool_use(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some(TOOL_USE)
}

fn is_recall(block: &Value) -> bool {
    is_tool_use(block) && block.get("name").and_then(Value::as_str) == Some(TOOL_NAME)
}

fn text_field(value: &Value, field: &str) -> String {
    value
        .get(field)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// A call's arguments as a `tool_use` input, which must be an object: `{}` when they are not.
fn input_of(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(input @ Value::Object(_)) => input,
        _ => json!({}),
    }
}

/// The counts Anthropic's `usage` carries that a reply over several rounds sums.
const COUNTED: [&str; 4] = [
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
];

/// `usage`'s counts, by `COUNTED` name, each absent where upstream did not write it.
#[derive(Default, Clone, Copy, Debug, PartialEq)]
struct Counts([Option<u64>; 4]);

impl Counts {
    fn read(usage: &Map<String, Value>) -> Counts {
        Counts(COUNTED.map(|name| usage.get(name).and_then(Value::as_u64)))
    }

    /// Both rounds' counts; a count neither wrote stays absent.
    fn plus(self, other: Counts) -> Counts {
        let mut sum = self;
        for (mine, theirs) in sum.0.iter_mut().zip(other.0) {
            if let Some(theirs) = theirs {
                *mine = Some(mine.unwrap_or(0) + theirs);
            }
        }
        sum
    }

    /// The round's counts as a later event of it says them (they are the round's totals).
    fn updated(self, later: Counts) -> Counts {
        let mut updated = self;
        for (mine, later) in updated.0.iter_mut().zip(later.0) {
            *mine = later.or(*mine);
        }
        updated
    }

    fn write(&self, usage: &mut Map<String, Value>) {
        for (name, count) in COUNTED.iter().zip(self.0) {
            if let Some(count) = count {
                usage.insert((*name).into(), count.into());
            }
        }
    }
}

fn usage_counts(usage: Option<&Value>) -> Counts {
    usage
        .and_then(Value::as_object)
        .map(Counts::read)
        .unwrap_or_default()
}

/// `object.usage`, made an object when absent.
fn usage_map(object: &mut Map<String, Value>) -> Option<&mut Map<String, Value>> {
    object
        .entry("usage")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
}

/// The fields of a stream event's data that recall reads; text is skipped unread.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    index: Option<usize>,
    #[serde(borrow)]
    content_block: Option<Block<'a>>,
    #[serde(borrow)]
    delta: Option<Delta<'a>>,
    usage: Option<Map<String, Value>>,
    message: Option<Started>,
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    id: Option<String>,
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    partial_json: Option<String>,
    #[serde(borrow)]
    stop_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Started {
    usage: Option<Map<String, Value>>,
}

/// One streamed reply across its rounds. Holds only the arguments of the recall calls being
/// made and the closing events.
#[derive(Default)]
struct MessagesRecallStream {
    /// The index the client sees for the next block passed, continued across rounds.
    next_index: usize,
    /// This round's passed blocks: upstream's index, and the client's.
    indices: HashMap<usize, usize>,
    /// This round's recall calls still streaming, by upstream's index: their arguments so far.
    open: HashMap<usize, RecallCall>,
    /// This round's recall calls, whole.
    calls: Vec<RecallCall>,
    /// This round passed a client `tool_use` block.
    client_calls: bool,
    /// A continuation is streaming: its opening is dropped and usage is summed at the close.
    continued: bool,
    /// The usage of the rounds before this one, summed.
    earlier: Counts,
    /// This round's usage so far.
    round: Counts,
    /// This round's `message_delta` (and whether it stopped for tool use), and `message_stop`.
    closing_delta: Option<(Bytes, bool)>,
    closing_stop: Option<Bytes>,
}

impl RecallStream for MessagesRecallStream {
    fn event(&mut self, event: &[u8]) -> Option<Bytes> {
        let passed = || Some(Bytes::copy_from_slice(event));
        let Some(data) = data_of(event) else {
            return passed();
        };
        let Ok(parsed) = serde_json::from_str::<Event>(&data) else {
            return passed();
        };
        match parsed.kind.as_ref() {
            "message_start" => {
                let usage = parsed.message.and_then(|message| message.usage);
                self.round = usage.as_ref().map(Counts::read).unwrap_or_default();
                if self.continued {
                    None
                } else {
                    passed()
                }
            }
            "content_block_start" => self.block_start(&parsed, event, &data),
            "content_block_delta" => match parsed.index.and_then(|i| self.open.get_mut(&i)) {
                Some(call) => {
                    let partial = parsed.delta.and_then(|delta| delta.partial_json);
                    call.arguments
                        .push_str(partial.as_deref().unwrap_or_default());
                    None
                }
                None => self.renumbered(parsed.index, event, &data),
            },
            "content_block_stop" => match parsed.index.and_then(|i| self.open.remove(&i)) {
                Some(mut call) => {
                    if call.arguments.trim().is_empty() {
                        call.arguments = "{}".into();
                    }
                    self.calls.push(call);
                    None
                }
                None => self.renumbered(parsed.index, event, &data),
            },
            "message_delta" => {
                let usage = parsed.usage.as_ref().map(Counts::read).unwrap_or_default();
                self.round = self.round.updated(usage);
                let stop_reason = parsed.delta.and_then(|delta| delta.stop_reason);
                let for_tools = stop_reason.as_deref() == Some(TOOL_USE);
                self.closing_delta = Some((Bytes::copy_from_slice(event), for_tools));
                None
            }
            "message_stop" => {
                self.closing_stop = Some(Bytes::copy_from_slice(event));
                None
            }
            _ => passed(),
        }
    }

    fn round_end(&mut self) -> RoundCalls {
        RoundCalls {
            recall: std::mem::take(&mut self.calls),
            client_calls: self.client_calls,
        }
    }

    fn next_round(&mut self) {
        self.continued = true;
        self.earlier = self.earlier.plus(std::mem::take(&mut self.round));
        self.indices.clear();
        self.open.clear();
        self.calls.clear();
        self.client_calls = false;
        self.closing_delta = None;
        self.closing_stop = None;
    }

    /// Anthropic's `error` event, which its SDKs raise.
    fn failed(&mut self, message: &str) -> Bytes {
        let error = json!({"type": "error", "error": {"type": "api_error", "message": message}});
        Bytes::from(format!("event: error\ndata: {error}\n\n"))
    }

    fn close(&mut self) -> Bytes {
        let mut closing = BytesMut::new();
        if let Some((delta, for_tools)) = self.closing_delta.take() {
            // Stopped for tool use with no client call passed: only recall calls were made.
            let ended = for_tools && !self.client_calls;
            if self.continued || ended {
                closing.extend_from_slice(&self.closing_delta_rewritten(&delta, ended));
            } else {
                closing.extend_from_slice(&delta);
            }
        }
        if let Some(stop) = self.closing_stop.take() {
            closing.extend_from_slice(&stop);
        }
        closing.freeze()
    }
}

impl MessagesRecallStream {
    fn block_start(&mut self, parsed: &Event, event: &[u8], data: &str) -> Option<Bytes> {
        let (Some(index), Some(block)) = (parsed.index, parsed.content_block.as_ref()) else {
            return Some(Bytes::copy_from_slice(event));
        };
        let tool_use = block.kind == TOOL_USE;
        if tool_use && block.name.as_deref() == Some(TOOL_NAME) {
            let id = block.id.clone().unwrap_or_default();
            let arguments = String::new();
            self.open.insert(index, RecallCall { id, arguments });
            return None;
        }
        self.client_calls |= tool_use;
        self.indices.insert(index, self.next_index);
        self.next_index += 1;
        self.renumbered(Some(index), event, data)
    }

    /// A passed block's event with the client's index, rewritten only when it differs.
    fn renumbered(&self, index: Option<usize>, event: &[u8], data: &str) -> Option<Bytes> {
        let client = index.and_then(|index| self.indices.get(&index).copied());
        match (index, client) {
            (Some(upstream), Some(client)) if upstream != client => rewritten(data, |object| {
                object.insert("index".into(), client.into());
            }),
            _ => None,
        }
        .or_else(|| Some(Bytes::copy_from_slice(event)))
    }

    /// The last round's `message_delta` with usage summed over every round (output always;
    /// the prompt counts where upstream's event carries them), and `end_turn` when `ended`.
    fn closing_delta_rewritten(&self, delta: &Bytes, ended: bool) -> Bytes {
        let total = self.earlier.plus(self.round);
        let data = data_of(delta).unwrap_or_default();
        let summed = self.continued;
        rewritten(&data, |object| {
            if summed {
                if let Some(usage) = usage_map(object) {
                    let mut carried = total;
                    for (name, count) in COUNTED.iter().zip(carried.0.iter_mut()) {
                        if *name != "output_tokens" && !usage.contains_key(*name) {
                            *count = None;
                        }
                    }
                    carried.write(usage);
                }
            }
            if ended {
                if let Some(Value::Object(delta)) = object.get_mut("delta") {
                    delta.insert("stop_reason".into(), Value::from(END_TURN));
                }
            }
        })
        .unwrap_or_else(|| delta.clone())
    }
}

/// The data of an SSE event, its `data:` lines joined.
fn data_of(event: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(event).ok()?;
    let lines: Vec<&str> = event_data(text).collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// The event `data` describes, changed by `change`, written anew; `None` if it is no object.
fn rewritten(data: &str, change: impl FnOnce(&mut Map<String, Value>)) -> Option<Bytes> {
    let mut object = serde_json::from_str::<Map<String, Value>>(data).ok()?;
    change(&mut object);
    let kind = object
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let data = Value::Object(object);
    Some(Bytes::from(format!("event: {kind}\ndata: {data}\n\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(object) => object,
            other => panic!("not an object: {other}"),
        }
    }

    fn call(id: &str, arguments: &str) -> RecallCall {
        RecallCall {
            id: id.into(),
            arguments: arguments.into(),
        }
    }

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
            MessagesRecall.calls(&recall_only),
            RoundCalls {
                recall: vec![call("toolu_1", r#"{"refs":["ctx:1"]}"#)],
                client_calls: false,
            }
        );

        let mixed = json!({"content": [
            {"type": "tool_use", "id": "toolu_1", "name": TOOL_NAME, "input": {"query": "port"}},
            {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"command": "ls"}},
        ]});
        let calls = MessagesRecall.calls(&mixed);
        assert_eq!(calls.recall, vec![call("toolu_1", r#"{"query":"port"}"#)]);
        assert!(calls.client_calls);

        let server = json!({"content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            {"type": "text", "text": "Found it."},
        ]});
        assert_eq!(MessagesRecall.calls(&server), RoundCalls::default());
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
        MessagesRecall.continue_with(&mut request, &answered, false);
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

        MessagesRecall.continue_with(&mut request, &answered[..1], true);
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
    fn feed(stream: &mut dyn RecallStream, events: &[String]) -> Vec<(String, Option<Bytes>)> {
        events
            .iter()
            .map(|event| (event.clone(), stream.event(event.as_bytes())))
            .collect()
    }

    fn passed(fed: &[(String, Option<Bytes>)]) -> Vec<Value> {
        fed.iter()
            .filter_map(|(_, out)| out.as_ref().map(data))
            .collect()
    }

    #[test]
    fn a_recall_call_streamed_is_held_and_the_continuation_stitched_in() {
        let mut stream = MessagesRecall.stream();
        let mut round_one = vec![message_start(100)];
        round_one.extend(text_block(0, "Let me look."));
        round_one.extend(tool_block(
            1,
            "toolu_1",
            TOOL_NAME,
            &["{\"refs\":", " [\"ctx:1\"]}"],
        ));
        round_one.extend(closing("tool_use", 20));
        let fed = feed(stream.as_mut(), &round_one);

        // message_start and the text block pass unchanged, as they come; nothing else does.
        for (input, output) in &fed[..4] {
            assert_eq!(output.as_deref(), Some(input.as_bytes()));
        }
        assert!(fed[4..].iter().all(|(_, output)| output.is_none()));
        assert_eq!(
            stream.round_end(),
            RoundCalls {
                recall: vec![call("toolu_1", r#"{"refs": ["ctx:1"]}"#)],
                client_calls: false,
            }
        );

        stream.next_round();
        let mut round_two = vec![message_start(150)];
        round_two.extend(text_block(0, "Port 23456."));
        round_two.extend(closing("end_turn", 7));
        let fed = feed(stream.as_mut(), &round_two);
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
        assert_eq!(stream.round_end(), RoundCalls::default());

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
        let mut stream = MessagesRecall.stream();
        let mut round_one = vec![message_start(100)];
        round_one.extend(tool_block(0, "toolu_1", TOOL_NAME, &[]));
        round_one.extend(closing("tool_use", 20));
        feed(stream.as_mut(), &round_one);
        assert_eq!(stream.round_end().recall, vec![call("toolu_1", "{}")]);
        stream.next_round();
        let round_two = [
            message_start(150),
            sse(
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                "usage": {"input_tokens": 150, "output_tokens": 7}}),
            ),
        ];
        feed(stream.as_mut(), &round_two);
        let closed = stream.close();
        assert_eq!(
            data(&closed)["usage"],
            json!({"input_tokens": 250, "output_tokens": 27})
        );
    }

    #[test]
    fn a_mixed_round_passes_the_client_call_without_a_gap_and_says_so() {
        let mut stream = MessagesRecall.stream();
        let mut events = vec![message_start(100)];
        events.extend(tool_block(0, "toolu_1", TOOL_NAME, &["{}"]));
        events.extend(tool_block(1, "toolu_2", "bash", &["{\"command\":\"ls\"}"]));
        events.extend(closing("tool_use", 30));
        let fed = feed(stream.as_mut(), &events);
        let seen = passed(&fed);
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[1]["content_block"]["name"], "bash");
        assert!(seen[1..].iter().all(|event| event["index"] == 0));
        let calls = stream.round_end();
        assert!(calls.client_calls);
        assert_eq!(calls.recall, vec![call("toolu_1", "{}")]);

        // One round only, and it stopped for the client's call: the closing events unchanged.
        let closed = stream.close();
        assert_eq!(closed, closing("tool_use", 30).concat().as_bytes());
    }

    #[test]
    fn a_round_that_ends_on_recall_alone_closes_as_end_turn() {
        let mut stream = MessagesRecall.stream();
        let mut events = vec![message_start(100)];
        events.extend(tool_block(0, "toolu_1", TOOL_NAME, &["{}"]));
        events.extend(closing("tool_use", 30));
        feed(stream.as_mut(), &events);
        stream.round_end();
        let closed = stream.close();
        assert_eq!(data(&closed)["delta"]["stop_reason"], "end_turn");
        assert_eq!(data(&closed)["usage"]["output_tokens"], 30);
    }

    #[test]
    fn pings_errors_and_server_tools_pass_through() {
        let mut stream = MessagesRecall.stream();
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
        let fed = feed(stream.as_mut(), &events);
        for (input, output) in &fed {
            assert_eq!(output.as_deref(), Some(input.as_bytes()));
        }
        assert!(!stream.round_end().client_calls);
    }
}
