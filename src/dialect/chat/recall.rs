//! The recall tool in Chat Completions: a `function` tool, called through an assistant
//! message's `tool_calls` and answered by a `tool` message; streamed as `tool_calls` deltas.

use bytes::{Bytes, BytesMut};
use serde_json::{json, Map, Value};

use crate::dialect::recall::{
    add_usage, answer_text, event_json, parameters, rewrite_event, Answered, RecallCall,
    RecallStream, RecallWire, RoundCalls, TOOL_DESCRIPTION, TOOL_NAME,
};

pub struct ChatRecall;

fn is_recall(call: &Value) -> bool {
    call.pointer("/function/name").and_then(Value::as_str) == Some(TOOL_NAME)
}

fn first_choice_mut(reply: &mut Value) -> Option<&mut Map<String, Value>> {
    reply
        .get_mut("choices")?
        .as_array_mut()?
        .first_mut()?
        .as_object_mut()
}

impl RecallWire for ChatRecall {
    fn offer(&self, request: &mut Map<String, Value>) {
        let tools = request
            .entry("tools")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Some(tools) = tools.as_array_mut() {
            if !tools.iter().any(is_recall) {
                tools.push(json!({
                    "type": "function",
                    "function": {
                        "name": TOOL_NAME,
                        "description": TOOL_DESCRIPTION,
                        "parameters": parameters(),
                    }
                }));
            }
        }
    }

    fn calls(&self, reply: &Value) -> RoundCalls {
        let mut round = RoundCalls::default();
        let calls = reply
            .pointer("/choices/0/message/tool_calls")
            .and_then(Value::as_array);
        for call in calls.into_iter().flatten() {
            if is_recall(call) {
                round.recall.push(RecallCall {
                    id: text_at(call, "/id"),
                    arguments: text_at(call, "/function/arguments"),
                });
            } else {
                round.client_calls = true;
            }
        }
        round
    }

    fn continue_with(&self, request: &mut Map<String, Value>, answered: &[Answered], last: bool) {
        let calls: Vec<Value> = answered
            .iter()
            .map(|a| {
                json!({
                    "id": a.call.id,
                    "type": "function",
                    "function": {"name": TOOL_NAME, "arguments": a.call.arguments},
                })
            })
            .collect();
        if let Some(messages) = request.get_mut("messages").and_then(Value::as_array_mut) {
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
            for a in answered {
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": a.call.id,
                    "content": answer_text(a),
                }));
            }
        }
        if last {
            request.insert("tool_choice".into(), json!("none"));
        }
    }

    fn merge(&self, earlier: Option<Value>, mut reply: Value) -> Value {
        if let Some(choice) = first_choice_mut(&mut reply) {
            without_recall_calls(choice);
        }
        let Some(mut earlier) = earlier else {
            return reply;
        };
        let earlier_text = earlier
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let message = reply
            .pointer_mut("/choices/0/message")
            .and_then(Value::as_object_mut);
        if let Some(message) = message {
            let own = message.get("content").and_then(Value::as_str);
            let joined = format!("{earlier_text}{}", own.unwrap_or_default());
            if !joined.is_empty() {
                message.insert("content".into(), Value::String(joined));
            }
        }
        if let (Some(total), Some(usage)) = (earlier.get_mut("usage"), reply.get("usage")) {
            add_usage(total, usage);
        }
        if let Some(reply) = reply.as_object_mut() {
            if let Some(usage) = earlier.get("usage") {
                reply.insert("usage".into(), usage.clone());
            }
            if let Some(id) = earlier.get("id") {
                reply.insert("id".into(), id.clone());
            }
        }
        reply
    }

    fn stream(&self) -> Box<dyn RecallStream> {
        Box::new(ChatStream::default())
    }
}

fn text_at(value: &Value, pointer: &str) -> String {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// A choice's message without its recall calls; with none of its calls left, the choice
/// finished as a plain answer.
fn without_recall_calls(choice: &mut Map<String, Value>) {
    let Some(message) = choice.get_mut("message").and_then(Value::as_object_mut) else {
        return;
    };
    let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) else {
        return;
    };
    calls.retain(|call| !is_recall(call));
    if calls.is_empty() {
        message.remove("tool_calls");
        if choice.get("finish_reason").and_then(Value::as_str) == Some("tool_calls") {
            choice.insert("finish_reason".into(), json!("stop"));
        }
    }
}

/// A streamed chat completion across its rounds.
#[derive(Default)]
struct ChatStream {
    /// The first round's completion id, which every chunk the client gets carries.
    id: Option<Value>,
    /// Later rounds: their chunks are rewritten to the first round's id.
    continued: bool,
    /// This round's tool-call indices (as upstream numbers them) that are recall calls,
    /// with the calls as gathered so far.
    recall: Vec<(u64, RecallCall)>,
    /// This round's client tool-call indices, as upstream numbers them, in order.
    client: Vec<u64>,
    /// Client tool calls the client got in earlier rounds: this round's go on after them.
    client_before: u64,
    /// The held chunk that carried `finish_reason`.
    finish: Option<Bytes>,
    /// Usage summed over every round's usage chunk, and the last such chunk.
    usage: Option<Value>,
    usage_chunk: Option<Bytes>,
    done: Option<Bytes>,
}

impl ChatStream {
    /// Takes the recall calls' deltas out of the chunk's and renumbers the client's; whether
    /// it changed anything.
    fn tool_deltas(&mut self, delta: &mut Map<String, Value>) -> bool {
        let Some(calls) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) else {
            return false;
        };
        let mut changed = false;
        let mut kept = Vec::with_capacity(calls.len());
        for mut call in std::mem::take(calls) {
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            // Some servers name the function again in every delta of a call: one call an index.
            let known = self.recall.iter().any(|(i, _)| *i == index);
            if is_recall(&call) && !known {
                let id = text_at(&call, "/id");
                let arguments = String::new();
                self.recall.push((index, RecallCall { id, arguments }));
            }
            if let Some((_, gathered)) = self.recall.iter_mut().find(|(i, _)| *i == index) {
                if let Some(part) = call.pointer("/function/arguments").and_then(Value::as_str) {
                    gathered.arguments.push_str(part);
                }
                changed = true;
                continue;
            }
            let position = self.client.iter().position(|&i| i == index);
            let position = position.unwrap_or_else(|| {
                self.client.push(index);
                self.client.len() - 1
            });
            let shown = self.client_before + position as u64;
            if shown != index {
                call["index"] = json!(shown);
                changed = true;
            }
            kept.push(call);
        }
        if kept.is_empty() {
            delta.remove("tool_calls");
        } else {
            *calls = kept;
        }
        changed
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

impl RecallStream for ChatStream {
    fn event(&mut self, event: &[u8]) -> Option<Bytes> {
        let Some(mut chunk) = event_json(event) else {
            if String::from_utf8_lossy(event).contains("[DONE]") {
                self.done = Some(Bytes::copy_from_slice(event));
                return None;
            }
            return Some(Bytes::copy_from_slice(event));
        };
        if self.id.is_none() {
            self.id = chunk.get("id").cloned();
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            match &mut self.usage {
                Some(total) => add_usage(total, usage),
                None => self.usage = Some(usage.clone()),
            }
            if chunk
                .get("choices")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
            {
                self.usage_chunk = Some(Bytes::copy_from_slice(event));
                return None;
            }
        }
        let mut changed = false;
        let mut finished = false;
        if let Some(choice) = first_choice_mut(&mut chunk) {
            finished = choice.get("finish_reason").is_some_and(|f| !f.is_null());
            if let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut) {
                changed = self.tool_deltas(delta);
                if self.continued && says_nothing(delta) && !finished {
                    return None;
                }
                if changed && says_nothing(delta) && !finished {
                    return None;
                }
            }
        }
        if self.continued {
            if let (Some(id), Some(chunk)) = (&self.id, chunk.as_object_mut()) {
                chunk.insert("id".into(), id.clone());
            }
            changed = true;
        }
        let out = if changed {
            rewrite_event(event, &chunk)
        } else {
            Bytes::copy_from_slice(event)
        };
        if finished {
            self.finish = Some(out);
            return None;
        }
        Some(out)
    }

    fn round_end(&mut self) -> RoundCalls {
        RoundCalls {
            recall: self.recall.iter().map(|(_, call)| call.clone()).collect(),
            client_calls: !self.client.is_empty(),
        }
    }

    fn next_round(&mut self) {
        self.continued = true;
        self.recall.clear();
        self.client_before += self.client.len() as u64;
        self.client.clear();
        self.finish = None;
        self.usage_chunk = None;
        self.done = None;
    }

    /// As OpenAI ends a stream that failed: a `data:` chunk holding an error object, no
    /// `[DONE]`.
    fn failed(&mut self, message: &str) -> Bytes {
        let error = json!({"error": {"message": message, "type": "server_error",
            "param": null, "code": "upstream_error"}});
        Bytes::from(format!("data: {error}\n\n"))
    }

    fn close(&mut self) -> Bytes {
        let mut out = BytesMut::new();
        if let Some(finish) = self.finish.take() {
            let recall_only = !self.recall.is_empty() && self.client.is_empty();
            match event_json(&finish) {
                Some(mut chunk) if recall_only => {
                    if let Some(choice) = first_choice_mut(&mut chunk) {
                        choice.insert("finish_reason".into(), json!("stop"));
                    }
                    out.extend_from_slice(&rewrite_event(&finish, &chunk));
                }
                _ => out.extend_from_slice(&finish),
            }
        }
        if let (Some(chunk), Some(usage)) = (self.usage_chunk.take(), &self.usage) {
            match event_json(&chunk) {
                Some(Value::Object(mut data)) => {
                    data.insert("usage".into(), usage.clone());
                    if let (Some(id), true) = (&self.id, self.continued) {
                        data.insert("id".into(), id.clone());
                    }
                    out.extend_from_slice(&rewrite_event(&chunk, &Value::Object(data)));
                }
                _ => out.extend_from_slice(&chunk),
            }
        }
        if let Some(done) = self.done.take() {
            out.extend_from_slice(&done);
        }
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let round = ChatRecall.calls(&reply);
        assert_eq!(
            round.recall,
            vec![RecallCall {
                id: "r1".into(),
                arguments: "{\"refs\":[\"ctx:1\"]}".into()
            }]
        );
        assert!(round.client_calls);
        assert_eq!(
            ChatRecall.calls(&json!({"choices": [{"message": {"content": "hi"}}]})),
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
        ChatRecall.continue_with(body, &answered, false);
        assert!(!body.contains_key("tool_choice"));
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages[1]["tool_calls"][0]["id"], "r1");
        assert_eq!(
            messages[2],
            json!({"role": "tool", "tool_call_id": "r1", "content": "Error: no refs"})
        );
        ChatRecall.continue_with(body, &answered, true);
        assert_eq!(body["tool_choice"], "none");
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
        let mut stream = ChatRecall.stream();
        for part in ["{\"query\":", "\"port\"}"] {
            let delta = json!({"tool_calls": [{"index": 0, "id": "r1", "type": "function",
                "function": {"name": TOOL_NAME, "arguments": part}}]});
            assert!(stream.event(&chunk("a", delta, None)).is_none());
        }
        let round = stream.round_end();
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
        let mut stream = ChatRecall.stream();
        let text = chunk(
            "a",
            json!({"role": "assistant", "content": "Looking. "}),
            None,
        );
        assert_eq!(stream.event(&text).as_deref(), Some(&text[..]));
        let start = chunk(
            "a",
            json!({"tool_calls": [{"index": 0, "id": "r1", "type": "function", "function": {"name": TOOL_NAME, "arguments": "{\"refs\":"}}]}),
            None,
        );
        assert!(stream.event(&start).is_none());
        let more = chunk(
            "a",
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "[\"ctx:1\"]}"}}]}),
            None,
        );
        assert!(stream.event(&more).is_none());
        assert!(stream
            .event(&chunk("a", json!({}), Some("tool_calls")))
            .is_none());
        let usage = sse(
            &json!({"id": "a", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}),
        );
        assert!(stream.event(&usage).is_none());
        assert!(stream.event(b"data: [DONE]\n\n").is_none());
        let round = stream.round_end();
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
            .event(&chunk(
                "b",
                json!({"role": "assistant", "content": ""}),
                None
            ))
            .is_none());
        let answer = stream
            .event(&chunk("b", json!({"content": "Port 23456."}), None))
            .unwrap();
        let answer = event_json(&answer).unwrap();
        assert_eq!(answer["id"], "a");
        assert_eq!(answer["choices"][0]["delta"]["content"], "Port 23456.");
        assert!(stream.event(&chunk("b", json!({}), Some("stop"))).is_none());
        let usage = sse(
            &json!({"id": "b", "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 3, "total_tokens": 33}}),
        );
        assert!(stream.event(&usage).is_none());
        assert!(stream.event(b"data: [DONE]\n\n").is_none());
        assert!(stream.round_end().recall.is_empty());
        let close = String::from_utf8(stream.close().to_vec()).unwrap();
        assert!(close.contains("\"finish_reason\":\"stop\""), "{close}");
        assert!(close.contains("\"prompt_tokens\":40"), "{close}");
        assert!(close.ends_with("data: [DONE]\n\n"), "{close}");
        assert!(!close.contains(TOOL_NAME));
    }

    #[test]
    fn a_mixed_round_passes_the_clients_calls_renumbered_and_drops_the_recall() {
        let mut stream = ChatRecall.stream();
        let recall = chunk(
            "a",
            json!({"tool_calls": [{"index": 0, "id": "r1", "type": "function", "function": {"name": TOOL_NAME, "arguments": "{}"}}]}),
            None,
        );
        assert!(stream.event(&recall).is_none());
        let client = chunk(
            "a",
            json!({"tool_calls": [{"index": 1, "id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}),
            None,
        );
        let passed = event_json(&stream.event(&client).unwrap()).unwrap();
        assert_eq!(passed["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
        assert_eq!(passed["choices"][0]["delta"]["tool_calls"][0]["id"], "c1");
        assert!(stream
            .event(&chunk("a", json!({}), Some("tool_calls")))
            .is_none());
        let round = stream.round_end();
        assert!(round.client_calls);
        assert_eq!(round.recall.len(), 1);
        let close = String::from_utf8(stream.close().to_vec()).unwrap();
        assert!(
            close.contains("\"finish_reason\":\"tool_calls\""),
            "{close}"
        );
    }
}
