//! The recall tool in Chat Completions: a `function` tool, called through an assistant
//! message's `tool_calls` and answered by a `tool` message; streamed as chunks whose deltas
//! carry the message's text and its `tool_calls` by index.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::dialect::recall::{
    append_text, names_the_tool, parameters, text_of, unflagged_result, Answered, ClientView,
    Fields, Kind, Part, RecallCall, RecallWire, Relayed, StopReason, StreamWire, TOOL_DESCRIPTION,
    TOOL_NAME,
};

pub struct ChatRecall;

/// How chat streams read, for recall.
struct ChatStream;

/// The text a delta carries, appended to the same field of the message: its answer, and the
/// reasoning some servers stream beside it (which a continuation carries back).
const TEXT_FIELDS: [&str; 4] = ["content", "reasoning_content", "reasoning", "refusal"];

const FIELDS: Fields = Fields {
    id: Some("id"),
    usage: "usage",
    output_tokens: "/usage/completion_tokens",
    stop: Some(StopReason {
        at: "/choices/0/finish_reason",
        calling: Some("tool_calls"),
        ended: "stop",
    }),
};

fn is_recall(call: &Value) -> bool {
    names_the_tool(call)
}

/// A chat reply's parts are its message's text (its `content`, a string) and its tool calls;
/// a continuation carries the round's text fields as one part, the assistant message they
/// make (with its role). Either is text; any other part is a call.
fn is_text(part: &Value) -> bool {
    part.is_string() || part.get("role").is_some()
}

fn message_mut(reply: &mut Value) -> Option<&mut Map<String, Value>> {
    reply
        .pointer_mut("/choices/0/message")
        .and_then(Value::as_object_mut)
}

impl RecallWire for ChatRecall {
    fn tool(&self) -> Value {
        json!({"type": "function", "function": {
            "name": TOOL_NAME,
            "description": TOOL_DESCRIPTION,
            "parameters": parameters(),
        }})
    }

    fn fields(&self) -> &'static Fields {
        &FIELDS
    }

    fn parts_of<'a>(&self, reply: &'a Value) -> Vec<&'a Value> {
        let Some(message) = reply.pointer("/choices/0/message") else {
            return Vec::new();
        };
        let text = message.get("content").filter(|text| text.is_string());
        let calls = message.get("tool_calls").and_then(Value::as_array);
        text.into_iter()
            .chain(calls.into_iter().flatten())
            .collect()
    }

    fn part(&self, part: &Value, _index: usize) -> Part {
        if is_text(part) {
            Part::Content
        } else if is_recall(part) {
            Part::Recall(RecallCall {
                id: text_of(part, "id"),
                arguments: part
                    .pointer("/function/arguments")
                    .map_or_else(String::new, |a| {
                        a.as_str().map_or_else(|| a.to_string(), str::to_owned)
                    }),
            })
        } else {
            Part::ClientCall
        }
    }

    /// A reply whose choice has no message still has a place: nothing is written, but the
    /// rounds' usage is summed and the first round's id kept.
    fn take_parts(&self, reply: &mut Value) -> Option<Vec<Value>> {
        let Some(message) = message_mut(reply) else {
            return Some(Vec::new());
        };
        let text = message
            .get("content")
            .filter(|text| text.is_string())
            .cloned();
        let calls = match message.get_mut("tool_calls") {
            Some(Value::Array(calls)) => std::mem::take(calls),
            _ => Vec::new(),
        };
        Some(text.into_iter().chain(calls).collect())
    }

    /// The texts joined as the message's `content` (left as it was when there is none), the
    /// calls as its `tool_calls` (gone with the last one).
    fn put_parts(&self, reply: &mut Value, parts: Vec<Value>) {
        let Some(message) = message_mut(reply) else {
            return;
        };
        let (texts, calls): (Vec<Value>, Vec<Value>) = parts.into_iter().partition(is_text);
        let text: String = texts.iter().filter_map(Value::as_str).collect();
        if !text.is_empty() {
            message.insert("content".into(), Value::String(text));
        }
        if !calls.is_empty() {
            message.insert("tool_calls".into(), Value::Array(calls));
        } else if message.get("tool_calls").is_some_and(Value::is_array) {
            message.remove("tool_calls");
        }
    }

    /// The round's text fields as the assistant message they make. Its calls are made anew
    /// from the answered ones (`call`): a streamed round's calls keep the `index` of their
    /// deltas, no field of a request's message.
    fn carried(&self, _request: &Map<String, Value>, round: &Value) -> Vec<Value> {
        let said = round.pointer("/choices/0/message");
        let mut assistant = Map::new();
        assistant.insert("role".into(), json!("assistant"));
        for field in TEXT_FIELDS {
            let text = said.and_then(|m| m.get(field)).filter(|t| !t.is_null());
            if let Some(text) = text {
                assistant.insert(field.into(), text.clone());
            }
        }
        vec![Value::Object(assistant)]
    }

    fn call(&self, call: &RecallCall) -> Value {
        json!({
            "id": call.id,
            "type": "function",
            "function": {"name": TOOL_NAME, "arguments": call.arguments},
        })
    }

    fn result(&self, answered: &Answered, _call: &Value) -> Value {
        unflagged_result(answered, ("role", "tool"), "tool_call_id", "content")
    }

    fn append(&self, request: &mut Map<String, Value>, said: Vec<Value>, results: Vec<Value>) {
        let (texts, calls): (Vec<Value>, Vec<Value>) = said.into_iter().partition(is_text);
        let mut assistant = Map::new();
        for text in texts {
            if let Value::Object(fields) = text {
                assistant.extend(fields);
            }
        }
        assistant.entry("content").or_insert(Value::Null);
        assistant.insert("tool_calls".into(), Value::Array(calls));
        if let Some(messages) = request.get_mut("messages").and_then(Value::as_array_mut) {
            messages.push(Value::Object(assistant));
            messages.extend(results);
        }
    }

    fn stop_calling(&self, request: &mut Map<String, Value>) {
        request.insert("tool_choice".into(), json!("none"));
    }

    fn stream(&self) -> &'static dyn StreamWire {
        &ChatStream
    }
}

/// Whether a delta says nothing: no content, no calls, at most its role.
fn says_nothing(delta: &Map<String, Value>) -> bool {
    delta.iter().all(|(key, value)| match key.as_str() {
        "role" => true,
        "content" | "refusal" => value.as_str().is_none_or(str::is_empty),
        _ => value.is_null(),
    })
}

fn finish_reason(chunk: &Value) -> Option<&Value> {
    chunk
        .pointer("/choices/0/finish_reason")
        .filter(|f| !f.is_null())
}

/// Takes the recall calls' deltas out of a chunk's and numbers the client's as it sees them;
/// whether it changed anything.
fn tool_deltas(delta: &mut Map<String, Value>, view: &mut ClientView) -> bool {
    let Some(calls) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) else {
        return false;
    };
    let mut changed = false;
    let mut kept = Vec::with_capacity(calls.len());
    for mut call in std::mem::take(calls) {
        let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
        // Some servers name the function again in every delta of a call: one call an index.
        if !view.held(index) && view.shown(index).is_none() {
            view.start(index, is_recall(&call));
        }
        match view.shown(index) {
            Some(shown) if shown != index => {
                call["index"] = json!(shown);
                changed = true;
                kept.push(call);
            }
            Some(_) => kept.push(call),
            None => changed = true,
        }
    }
    if kept.is_empty() {
        delta.remove("tool_calls");
    } else {
        *calls = kept;
    }
    changed
}

impl StreamWire for ChatStream {
    fn kind(&self, chunk: &Value) -> Kind {
        let no_choices = chunk
            .get("choices")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        let usage_only = no_choices && chunk.get("usage").is_some_and(Value::is_object);
        if usage_only || finish_reason(chunk).is_some() {
            Kind::Closing
        } else {
            Kind::Body
        }
    }

    fn gather(&self, round: &mut Value, chunk: &Value) {
        let Some(round) = round.as_object_mut() else {
            return;
        };
        if let Some(id) = chunk.get("id").filter(|_| !round.contains_key("id")) {
            round.insert("id".into(), id.clone());
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            round.insert("usage".into(), usage.clone());
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return;
        };
        let choices = round
            .entry("choices")
            .or_insert_with(|| json!([{"message": {"role": "assistant"}}]));
        let Some(gathered) = choices.pointer_mut("/0").and_then(Value::as_object_mut) else {
            return;
        };
        if let Some(reason) = choice.get("finish_reason").filter(|f| !f.is_null()) {
            gathered.insert("finish_reason".into(), reason.clone());
        }
        let (Some(delta), Some(message)) = (
            choice.get("delta").and_then(Value::as_object),
            gathered.get_mut("message").and_then(Value::as_object_mut),
        ) else {
            return;
        };
        for field in TEXT_FIELDS {
            if let Some(text) = delta.get(field).and_then(Value::as_str) {
                append_text(message, field, text);
            }
        }
        let deltas = delta.get("tool_calls").and_then(Value::as_array);
        for call in deltas.into_iter().flatten() {
            gather_call(message, call);
        }
    }

    /// The chunk's delta as the client sees it.
    fn relay(&self, chunk: &mut Value, view: &mut ClientView) -> Relayed {
        let Some(delta) = chunk
            .pointer_mut("/choices/0/delta")
            .and_then(Value::as_object_mut)
        else {
            return Relayed::AsItCame;
        };
        let changed = tool_deltas(delta, view);
        if (view.continued || changed) && says_nothing(delta) {
            return Relayed::Dropped;
        }
        Relayed::changed_if(changed)
    }

    /// A finish chunk that still carried text: that text, the chunk no longer finishing.
    fn unsent(&self, chunk: &mut Value, view: &mut ClientView) -> Relayed {
        let Some(delta) = chunk
            .pointer_mut("/choices/0/delta")
            .and_then(Value::as_object_mut)
        else {
            return Relayed::Dropped;
        };
        tool_deltas(delta, view);
        if says_nothing(delta) {
            return Relayed::Dropped;
        }
        chunk["choices"][0]["finish_reason"] = Value::Null;
        if let Some(chunk) = chunk.as_object_mut() {
            chunk.remove("usage");
        }
        Relayed::Changed
    }

    fn is_end(&self, event: &[u8]) -> bool {
        String::from_utf8_lossy(event).contains("[DONE]")
    }

    fn close(&self, closing: &mut [Value], merged: &Value, view: &mut ClientView) {
        for chunk in closing {
            if let Some(delta) = chunk
                .pointer_mut("/choices/0/delta")
                .and_then(Value::as_object_mut)
            {
                tool_deltas(delta, view);
            }
            if finish_reason(chunk).is_some() {
                if let Some(reason) = merged.pointer("/choices/0/finish_reason") {
                    chunk["choices"][0]["finish_reason"] = reason.clone();
                }
            }
            if chunk.get("usage").is_some_and(Value::is_object) {
                if let Some(usage) = merged.get("usage") {
                    chunk["usage"] = usage.clone();
                }
            }
        }
    }

    /// As OpenAI ends a stream that failed: a `data:` chunk holding an error object, no
    /// `[DONE]`.
    fn failed(&self, message: &str, _view: &mut ClientView) -> Bytes {
        let error = json!({"error": {"message": message, "type": "server_error",
            "param": null, "code": "upstream_error"}});
        Bytes::from(format!("data: {error}\n\n"))
    }
}

/// Folds one tool-call delta into the message's calls, by its index.
fn gather_call(message: &mut Map<String, Value>, delta: &Value) {
    let index = delta.get("index").and_then(Value::as_u64).unwrap_or(0);
    let calls = message
        .entry("tool_calls")
        .or_insert_with(|| Value::Array(Vec::new()));
    let Some(calls) = calls.as_array_mut() else {
        return;
    };
    let at = calls
        .iter()
        .position(|call| call.get("index").and_then(Value::as_u64) == Some(index));
    let at = at.unwrap_or_else(|| {
        calls.push(json!({"index": index, "type": "function", "function": {"arguments": ""}}));
        calls.len() - 1
    });
    let Some(call) = calls[at].as_object_mut() else {
        return;
    };
    if let Some(id) = delta.get("id").filter(|id| id.is_string()) {
        call.entry("id").or_insert_with(|| id.clone());
    }
    let Some(function) = call.get_mut("function").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(name) = delta.pointer("/function/name").filter(|n| n.is_string()) {
        function.entry("name").or_insert_with(|| name.clone());
    }
    if let Some(part) = delta.pointer("/function/arguments").and_then(Value::as_str) {
        append_text(function, "arguments", part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::recall::{event_json, RecallPolicy, RoundCalls, Stitched};

    fn sse(data: &Value) -> Vec<u8> {
        format!("data: {data}\n\n").into_bytes()
    }

    fn recall_call(id: &str, arguments: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": TOOL_NAME, "arguments": arguments}})
    }

    #[test]
    fn the_tool_is_offered_last_and_once() {
        let mut request =
            json!({"model": "m", "tools": [{"type": "function", "function": {"name": "bash"}}]});
        let body = request.as_object_mut().unwrap();
        ChatRecall.offer(body);
        ChatRecall.offer(body);
        let tools = body["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 2);
        assert_eq!(tools[1]["function"]["name"], TOOL_NAME);
        let mut bare = Map::new();
        ChatRecall.offer(&mut bare);
        assert_eq!(bare["tools"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn calls_tell_recall_from_the_clients_own() {
        let reply = json!({"choices": [{"message": {"tool_calls": [
            recall_call("r1", "{\"refs\":[\"ctx:1\"]}"),
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}},
        ]}}]});
        let round = RoundCalls::of(ChatRecall.parts(&reply));
        assert_eq!(
            round.recall,
            vec![RecallCall {
                id: "r1".into(),
                arguments: "{\"refs\":[\"ctx:1\"]}".into()
            }]
        );
        assert!(round.client_calls);
        assert_eq!(
            RoundCalls::of(ChatRecall.parts(&json!({"choices": [{"message": {"content": "hi"}}]}))),
            RoundCalls::default()
        );
    }

    #[test]
    fn a_continuation_carries_the_call_and_its_answer() {
        let mut request = json!({"messages": [{"role": "user", "content": "q"}]});
        let body = request.as_object_mut().unwrap();
        let call = RecallCall {
            id: "r1".into(),
            arguments: "{}".into(),
        };
        let answered = [Answered {
            call: &call,
            text: "no refs",
            is_error: true,
        }];
        ChatRecall.continue_with(body, &json!({}), &answered, false);
        assert!(!body.contains_key("tool_choice"));
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages[1]["tool_calls"][0]["id"], "r1");
        assert_eq!(
            messages[2],
            json!({"role": "tool", "tool_call_id": "r1", "content": "Error: no refs"})
        );
        ChatRecall.continue_with(body, &json!({}), &answered, true);
        assert_eq!(body["tool_choice"], "none");
    }

    /// Servers that stream reasoning beside the answer (`reasoning_content`) want it back in
    /// a tool loop's assistant turn: the streamed round is gathered and carried whole.
    #[test]
    fn a_streamed_rounds_text_and_reasoning_go_back_with_its_call() {
        let mut stream = Stitched::new(&ChatRecall);
        for delta in [
            json!({"role": "assistant", "reasoning_content": "The port was "}),
            json!({"reasoning_content": "set early."}),
            json!({"content": "Looking. "}),
            json!({"tool_calls": [{"index": 0, "id": "r1", "type": "function", "function": {"name": TOOL_NAME, "arguments": "{\"query\":"}}]}),
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"port\"}"}}]}),
        ] {
            stream.event(bytes::Bytes::copy_from_slice(
                &(chunk("a", delta, None))[..],
            ));
        }
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(
                &(chunk("a", json!({}), Some("tool_calls")))[..]
            ))
            .is_none());
        let round = stream.round_end();
        let call = RecallCall {
            id: "r1".into(),
            arguments: "{\"query\":\"port\"}".into(),
        };
        assert_eq!(round.calls.recall, std::slice::from_ref(&call));
        let mut request = json!({"messages": [{"role": "user", "content": "q"}]});
        let body = request.as_object_mut().unwrap();
        let answered = [Answered {
            call: &call,
            text: "port 23456",
            is_error: false,
        }];
        ChatRecall.continue_with(body, &round.reply, &answered, false);
        let assistant = &body["messages"][1];
        assert_eq!(assistant["reasoning_content"], "The port was set early.");
        assert_eq!(assistant["content"], "Looking. ");
        assert_eq!(
            assistant["tool_calls"][0]["function"]["arguments"],
            "{\"query\":\"port\"}"
        );
    }

    #[test]
    fn the_merged_reply_has_no_recall_and_sums_usage() {
        let first = ChatRecall.merge(None, json!({
            "id": "one",
            "choices": [{"message": {"content": "Looking. ", "tool_calls": [recall_call("r1", "{}")]}, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
        }));
        assert!(first.pointer("/choices/0/message/tool_calls").is_none());
        assert_eq!(first["choices"][0]["finish_reason"], "stop");
        let merged = ChatRecall.merge(
            Some(first),
            json!({
                "id": "two",
                "choices": [{"message": {"content": "Port 23456."}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 30, "completion_tokens": 3, "total_tokens": 33},
            }),
        );
        assert_eq!(merged["id"], "one");
        assert_eq!(
            merged["choices"][0]["message"]["content"],
            "Looking. Port 23456."
        );
        assert_eq!(
            merged["usage"],
            json!({"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45})
        );
    }

    fn chunk(id: &str, delta: Value, finish: Option<&str>) -> Vec<u8> {
        sse(
            &json!({"id": id, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    }

    #[test]
    fn a_call_whose_every_delta_names_the_function_is_one_call() {
        let mut stream = Stitched::new(&ChatRecall);
        for part in ["{\"query\":", "\"port\"}"] {
            let delta = json!({"tool_calls": [{"index": 0, "id": "r1", "type": "function",
                "function": {"name": TOOL_NAME, "arguments": part}}]});
            assert!(stream
                .event(bytes::Bytes::copy_from_slice(
                    &(chunk("a", delta, None))[..]
                ))
                .is_none());
        }
        let round = stream.round_end().calls;
        assert_eq!(
            round.recall,
            vec![RecallCall {
                id: "r1".into(),
                arguments: "{\"query\":\"port\"}".into()
            }]
        );
    }

    #[test]
    fn a_streamed_recall_is_held_and_the_continuation_stitched_on() {
        let mut stream = Stitched::new(&ChatRecall);
        let text = chunk(
            "a",
            json!({"role": "assistant", "content": "Looking. "}),
            None,
        );
        assert_eq!(
            stream
                .event(bytes::Bytes::copy_from_slice(&(text)[..]))
                .as_deref(),
            Some(&text[..])
        );
        let start = chunk(
            "a",
            json!({"tool_calls": [{"index": 0, "id": "r1", "type": "function", "function": {"name": TOOL_NAME, "arguments": "{\"refs\":"}}]}),
            None,
        );
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(&(start)[..]))
            .is_none());
        let more = chunk(
            "a",
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "[\"ctx:1\"]}"}}]}),
            None,
        );
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(&(more)[..]))
            .is_none());
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(
                &(chunk("a", json!({}), Some("tool_calls")))[..]
            ))
            .is_none());
        let usage = sse(
            &json!({"id": "a", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}),
        );
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(&(usage)[..]))
            .is_none());
        assert!(stream
            .event(bytes::Bytes::from_static(b"data: [DONE]\n\n"))
            .is_none());
        let round = stream.round_end().calls;
        assert_eq!(
            round.recall,
            vec![RecallCall {
                id: "r1".into(),
                arguments: "{\"refs\":[\"ctx:1\"]}".into()
            }]
        );
        assert!(!round.client_calls);

        stream.next_round();
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(
                &(chunk("b", json!({"role": "assistant", "content": ""}), None))[..]
            ))
            .is_none());
        let answer = stream
            .event(bytes::Bytes::copy_from_slice(
                &(chunk("b", json!({"content": "Port 23456."}), None))[..],
            ))
            .unwrap();
        let answer = event_json(&answer).unwrap();
        assert_eq!(answer["id"], "a");
        assert_eq!(answer["choices"][0]["delta"]["content"], "Port 23456.");
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(
                &(chunk("b", json!({}), Some("stop")))[..]
            ))
            .is_none());
        let usage = sse(
            &json!({"id": "b", "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 3, "total_tokens": 33}}),
        );
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(&(usage)[..]))
            .is_none());
        assert!(stream
            .event(bytes::Bytes::from_static(b"data: [DONE]\n\n"))
            .is_none());
        assert!(stream.round_end().calls.recall.is_empty());
        let close = String::from_utf8(stream.close().to_vec()).unwrap();
        assert!(close.contains("\"finish_reason\":\"stop\""), "{close}");
        assert!(close.contains("\"prompt_tokens\":40"), "{close}");
        assert!(close.ends_with("data: [DONE]\n\n"), "{close}");
        assert!(!close.contains(TOOL_NAME));
    }

    /// Some servers put the last text in the chunk that finishes: when a continuation
    /// follows, that text reaches the client before the next round's, not finishing.
    #[test]
    fn text_in_a_recalled_rounds_finish_chunk_reaches_the_client_before_the_next_round() {
        let mut stream = Stitched::new(&ChatRecall);
        let start = chunk(
            "a",
            json!({"tool_calls": [{"index": 0, "id": "r1", "type": "function", "function": {"name": TOOL_NAME, "arguments": "{}"}}]}),
            None,
        );
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(&(start)[..]))
            .is_none());
        let finish = chunk("a", json!({"content": "One moment. "}), Some("tool_calls"));
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(&(finish)[..]))
            .is_none());
        assert_eq!(stream.round_end().calls.recall.len(), 1);
        let unsent = event_json(&stream.next_round()).unwrap();
        assert_eq!(unsent["choices"][0]["delta"]["content"], "One moment. ");
        assert!(unsent["choices"][0]["finish_reason"].is_null());
        let empty = chunk("b", json!({}), Some("stop"));
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(&(empty)[..]))
            .is_none());
        stream.round_end();
        // A finish chunk with nothing to show gives nothing at the next round.
        assert!(stream.next_round().is_empty());
    }

    #[test]
    fn a_mixed_round_passes_the_clients_calls_renumbered_and_drops_the_recall() {
        let mut stream = Stitched::new(&ChatRecall);
        let recall = chunk(
            "a",
            json!({"tool_calls": [{"index": 0, "id": "r1", "type": "function", "function": {"name": TOOL_NAME, "arguments": "{}"}}]}),
            None,
        );
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(&(recall)[..]))
            .is_none());
        let client = chunk(
            "a",
            json!({"tool_calls": [{"index": 1, "id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}),
            None,
        );
        let passed = event_json(
            &stream
                .event(bytes::Bytes::copy_from_slice(&(client)[..]))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(passed["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
        assert_eq!(passed["choices"][0]["delta"]["tool_calls"][0]["id"], "c1");
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(
                &(chunk("a", json!({}), Some("tool_calls")))[..]
            ))
            .is_none());
        let round = stream.round_end().calls;
        assert!(round.client_calls);
        assert_eq!(round.recall.len(), 1);
        let close = String::from_utf8(stream.close().to_vec()).unwrap();
        assert!(
            close.contains("\"finish_reason\":\"tool_calls\""),
            "{close}"
        );
    }
}
