//! The recall tool in Gemini's `generateContent`: a `functionDeclarations` entry of its own
//! in `tools`, called by a `functionCall` part of the first candidate's content and answered
//! by `functionResponse` parts in a user turn. A continuation's model turn is the round's own
//! parts as the model wrote them: Gemini refuses (400) a continued step whose first call lost
//! its `thoughtSignature`.
//!
//! Streamed (`streamGenerateContent?alt=sse`), each chunk carries new whole parts and no
//! index: a chunk's recall calls are taken out of it, and the chunk with a `finishReason` is
//! held. That chunk may carry parts too: the client gets them before the next round's, or in
//! the last chunk when no round follows.

use bytes::Bytes;
use hyper::StatusCode;
use serde_json::{json, Map, Value};

use crate::dialect::gemini::error::error_body;
use crate::dialect::recall::{
    names_the_tool, parameters, Answered, ClientView, Fields, Kind, Part, RecallCall, RecallWire,
    Relayed, StopReason, StreamWire, TOOL_DESCRIPTION, TOOL_NAME,
};

pub struct GeminiRecall;

/// How Gemini streams read, for recall.
struct GeminiStream;

const FIELDS: Fields = Fields {
    id: Some("responseId"),
    usage: "usageMetadata",
    output_tokens: "/usageMetadata/candidatesTokenCount",
    stop: Some(StopReason {
        at: "/candidates/0/finishReason",
        calling: None,
        ended: "STOP",
    }),
};

fn is_call(part: &Value) -> bool {
    part.get("functionCall").is_some_and(Value::is_object)
}

fn is_recall(part: &Value) -> bool {
    part.get("functionCall").is_some_and(names_the_tool)
}

/// The first candidate's parts.
fn candidate_parts(reply: &Value) -> impl Iterator<Item = &Value> {
    reply
        .pointer("/candidates/0/content/parts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn parts_mut(reply: &mut Value) -> Option<&mut Vec<Value>> {
    reply
        .pointer_mut("/candidates/0/content/parts")
        .and_then(Value::as_array_mut)
}

/// A recall call's id: its own, else one made from its place among the round's parts
/// (Gemini's API often gives calls none; the same round always reads the same).
fn call_id(part: &Value, index: usize) -> String {
    match part.pointer("/functionCall/id").and_then(Value::as_str) {
        Some(id) => id.to_owned(),
        None => format!("recall-{index}"),
    }
}

/// Takes the recall calls out of `parts`; true when there were any. A step's signature is
/// on its first call: when that was a recall call, the client's first call takes it, or
/// Gemini refuses the client's next request.
fn without_recall(parts: &mut Vec<Value>) -> bool {
    let before = parts.len();
    let mut signature = None;
    parts.retain(|part| {
        if !is_recall(part) {
            return true;
        }
        if signature.is_none() {
            signature = part.get("thoughtSignature").cloned();
        }
        false
    });
    let first_call = parts.iter_mut().find(|part| is_call(part));
    if let (Some(signature), Some(Value::Object(call))) = (signature, first_call) {
        call.entry("thoughtSignature").or_insert(signature);
    }
    parts.len() != before
}

/// The object at `camel` of `object` (or at `snake`, when the client wrote that one), made
/// when absent.
fn object_at<'a>(
    object: &'a mut Map<String, Value>,
    camel: &str,
    snake: &str,
) -> Option<&'a mut Map<String, Value>> {
    let key = if object.contains_key(snake) {
        snake
    } else {
        camel
    };
    let value = object.entry(key).or_insert_with(|| json!({}));
    if !value.is_object() {
        *value = json!({});
    }
    value.as_object_mut()
}

impl RecallWire for GeminiRecall {
    /// Recall reads and continues the first candidate only: not for a request that asks
    /// for more.
    fn serves(&self, request: &Map<String, Value>) -> bool {
        let config = ["generationConfig", "generation_config"]
            .iter()
            .find_map(|key| request.get(*key));
        let count = ["candidateCount", "candidate_count"]
            .iter()
            .find_map(|key| config?.get(*key)?.as_u64());
        count.unwrap_or(1) <= 1
    }

    /// `parameters()` is within Gemini's schema subset (`type`, `properties`, `items`,
    /// `description`); Gemini reads its types in either case.
    fn tool(&self) -> Value {
        json!({"functionDeclarations": [{
            "name": TOOL_NAME,
            "description": TOOL_DESCRIPTION,
            "parameters": parameters(),
        }]})
    }

    /// Gemini names its functions inside a tool's `functionDeclarations`: offered once, last.
    fn offer(&self, request: &mut Map<String, Value>) {
        let tools = request.entry("tools").or_insert_with(|| json!([]));
        if tools.is_null() {
            *tools = json!([]);
        }
        let Some(tools) = tools.as_array_mut() else {
            return;
        };
        let offered = tools.iter().any(|tool| {
            ["functionDeclarations", "function_declarations"]
                .iter()
                .filter_map(|key| tool.get(key).and_then(Value::as_array))
                .flatten()
                .any(names_the_tool)
        });
        if !offered {
            tools.push(self.tool());
        }
    }

    fn fields(&self) -> &'static Fields {
        &FIELDS
    }

    fn parts_of<'a>(&self, reply: &'a Value) -> Vec<&'a Value> {
        candidate_parts(reply).collect()
    }

    fn part(&self, part: &Value, index: usize) -> Part {
        let recall = is_recall(part).then(|| {
            RecallCall::of_object(call_id(part, index), part.pointer("/functionCall/args"))
        });
        Part::of(recall, is_call(part))
    }

    /// A reply without a first candidate (a blocked prompt) has no place for parts.
    fn take_parts(&self, reply: &mut Value) -> Option<Vec<Value>> {
        let candidate = reply.pointer_mut("/candidates/0")?.as_object_mut()?;
        let content = candidate
            .entry("content")
            .or_insert_with(|| json!({"role": "model"}))
            .as_object_mut()?;
        Some(match content.get_mut("parts") {
            Some(Value::Array(parts)) => std::mem::take(parts),
            _ => Vec::new(),
        })
    }

    fn put_parts(&self, reply: &mut Value, parts: Vec<Value>) {
        let content = reply.pointer_mut("/candidates/0/content");
        if let Some(content) = content.and_then(Value::as_object_mut) {
            content.insert("parts".into(), Value::Array(parts));
        }
    }

    fn take_out_recall(&self, parts: &mut Vec<Value>) -> bool {
        without_recall(parts)
    }

    fn call(&self, call: &RecallCall) -> Value {
        let args = serde_json::from_str::<Value>(&call.arguments)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        json!({"functionCall": {"name": TOOL_NAME, "args": args}})
    }

    /// Gemini pairs a response with its call by the call's own id, where it has one.
    fn result(&self, answered: &Answered, call: &Value) -> Value {
        let key = if answered.is_error { "error" } else { "output" };
        let mut response = json!({"name": TOOL_NAME, "response": {key: answered.text}});
        if let Some(id) = call.pointer("/functionCall/id") {
            response["id"] = id.clone();
        }
        json!({"functionResponse": response})
    }

    fn append(&self, request: &mut Map<String, Value>, said: Vec<Value>, results: Vec<Value>) {
        let contents = request.entry("contents").or_insert_with(|| json!([]));
        if let Some(contents) = contents.as_array_mut() {
            contents.push(json!({"role": "model", "parts": said}));
            contents.push(json!({"role": "user", "parts": results}));
        }
    }

    fn stop_calling(&self, request: &mut Map<String, Value>) {
        let calling = object_at(request, "toolConfig", "tool_config").and_then(|config| {
            object_at(config, "functionCallingConfig", "function_calling_config")
        });
        if let Some(calling) = calling {
            calling.insert("mode".into(), json!("NONE"));
            calling.remove("allowedFunctionNames");
            calling.remove("allowed_function_names");
        }
    }

    fn stream(&self) -> &'static dyn StreamWire {
        &GeminiStream
    }
}

fn finish_reason(chunk: &Value) -> Option<&Value> {
    chunk
        .pointer("/candidates/0/finishReason")
        .filter(|f| !f.is_null())
}

impl StreamWire for GeminiStream {
    fn kind(&self, chunk: &Value) -> Kind {
        match finish_reason(chunk) {
            Some(_) => Kind::Closing,
            None => Kind::Body,
        }
    }

    /// The round as a whole reply: the chunks' parts appended as they came (signatures on
    /// the parts they came on), the latest usage and candidate fields, the first id.
    fn gather(&self, round: &mut Value, chunk: &Value) {
        let Some(round) = round.as_object_mut() else {
            return;
        };
        for key in ["responseId", "modelVersion"] {
            if let Some(value) = chunk.get(key) {
                round.entry(key).or_insert_with(|| value.clone());
            }
        }
        if let Some(usage) = chunk.get("usageMetadata").filter(|u| u.is_object()) {
            round.insert("usageMetadata".into(), usage.clone());
        }
        let Some(candidate) = chunk.pointer("/candidates/0").and_then(Value::as_object) else {
            return;
        };
        let new: Vec<Value> = candidate_parts(chunk).cloned().collect();
        let candidates = round
            .entry("candidates")
            .or_insert_with(|| json!([{"content": {"role": "model", "parts": []}}]));
        if let Some(gathered) = candidates.pointer_mut("/0").and_then(Value::as_object_mut) {
            for (key, value) in candidate.iter().filter(|(key, _)| *key != "content") {
                gathered.insert(key.clone(), value.clone());
            }
        }
        if let Some(parts) = candidates
            .pointer_mut("/0/content/parts")
            .and_then(Value::as_array_mut)
        {
            parts.extend(new);
        }
    }

    fn relay(&self, chunk: &mut Value, _view: &mut ClientView) -> Relayed {
        let Some(parts) = parts_mut(chunk) else {
            return Relayed::AsItCame;
        };
        let took = without_recall(parts);
        if took && parts.is_empty() && chunk.get("usageMetadata").is_none() {
            return Relayed::Dropped;
        }
        Relayed::changed_if(took)
    }

    /// A continued round's closing chunk: its parts (recall taken out), no longer closing.
    fn unsent(&self, chunk: &mut Value, view: &mut ClientView) -> Relayed {
        if let Some(object) = chunk.as_object_mut() {
            object.remove("usageMetadata");
        }
        if let Some(candidate) = chunk
            .pointer_mut("/candidates/0")
            .and_then(Value::as_object_mut)
        {
            candidate.remove("finishReason");
        }
        match self.relay(chunk, view) {
            Relayed::Dropped => Relayed::Dropped,
            _ if candidate_parts(chunk).next().is_none() => Relayed::Dropped,
            _ => Relayed::Changed,
        }
    }

    /// The last round's closing chunk, its own parts (recall taken out), with the merged
    /// finish reason and usage summed over the rounds.
    fn close(&self, closing: &mut [Value], merged: &Value, _view: &mut ClientView) {
        for chunk in closing {
            if let Some(usage) = merged.get("usageMetadata") {
                chunk["usageMetadata"] = usage.clone();
            }
            if let Some(parts) = parts_mut(chunk) {
                without_recall(parts);
            }
            if let (Some(candidate), Some(reason)) = (
                chunk
                    .pointer_mut("/candidates/0")
                    .and_then(Value::as_object_mut),
                merged.pointer("/candidates/0/finishReason"),
            ) {
                candidate.insert("finishReason".into(), reason.clone());
            }
        }
    }

    /// Google's error shape, as a `data:` event.
    fn failed(&self, message: &str, _view: &mut ClientView) -> Bytes {
        let error = error_body(StatusCode::INTERNAL_SERVER_ERROR, message);
        Bytes::from(format!("data: {error}\n\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::recall::testing::{call, object};
    use crate::dialect::recall::{event_json, RecallPolicy, RoundCalls, Stitched};

    fn recall_part(id: Option<&str>, args: Value, signature: Option<&str>) -> Value {
        let mut part = json!({"functionCall": {"name": TOOL_NAME, "args": args}});
        if let Some(id) = id {
            part["functionCall"]["id"] = json!(id);
        }
        if let Some(signature) = signature {
            part["thoughtSignature"] = json!(signature);
        }
        part
    }

    fn usage(prompt: u64, candidates: u64) -> Value {
        json!({"promptTokenCount": prompt, "candidatesTokenCount": candidates,
            "totalTokenCount": prompt + candidates})
    }

    fn reply(id: &str, parts: Value, finish: Option<&str>, usage: Option<Value>) -> Value {
        let mut reply = json!({"candidates": [{"content": {"role": "model", "parts": parts},
            "index": 0}], "modelVersion": "gemini-3-pro", "responseId": id});
        if let Some(finish) = finish {
            reply["candidates"][0]["finishReason"] = json!(finish);
        }
        if let Some(usage) = usage {
            reply["usageMetadata"] = usage;
        }
        reply
    }

    fn sse(data: &Value) -> Vec<u8> {
        format!("data: {data}\n\n").into_bytes()
    }

    /// Every key and type of a schema, within what Gemini's `Schema` takes.
    fn in_geminis_subset(schema: &Value) -> bool {
        let Some(schema) = schema.as_object() else {
            return false;
        };
        schema.iter().all(|(key, value)| match key.as_str() {
            "type" => ["object", "array", "string"].contains(&value.as_str().unwrap_or("")),
            "description" => value.is_string(),
            "items" => in_geminis_subset(value),
            "properties" => value
                .as_object()
                .is_some_and(|p| p.values().all(in_geminis_subset)),
            _ => false,
        })
    }

    #[test]
    fn the_tool_is_offered_last_and_once_in_geminis_schema() {
        let mut request = object(json!({
            "contents": [],
            "tools": [{"functionDeclarations": [{"name": "bash", "description": "runs"}]},
                {"googleSearch": {}}],
        }));
        GeminiRecall.offer(&mut request);
        GeminiRecall.offer(&mut request);
        let tools = request["tools"].as_array().cloned().unwrap_or_default();
        assert_eq!(tools.len(), 3);
        assert_eq!(
            tools[2],
            json!({"functionDeclarations": [{"name": TOOL_NAME, "description": TOOL_DESCRIPTION,
                "parameters": parameters()}]})
        );
        assert!(in_geminis_subset(&parameters()));
        assert!(GeminiRecall.serves(&request));
        let many = object(json!({"generationConfig": {"candidateCount": 2}}));
        assert!(!GeminiRecall.serves(&many));

        let mut bare = Map::new();
        GeminiRecall.offer(&mut bare);
        assert_eq!(
            bare["tools"][0]["functionDeclarations"][0]["name"],
            TOOL_NAME
        );
        let mut snake =
            object(json!({"tools": [{"function_declarations": [{"name": TOOL_NAME}]}]}));
        GeminiRecall.offer(&mut snake);
        assert_eq!(snake["tools"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn parts_tell_recall_from_the_clients_calls() {
        let mixed = reply(
            "r",
            json!([
                {"text": "Looking."},
                recall_part(Some("fc_1"), json!({"refs": ["ctx:1"]}), Some("c2ln")),
                {"functionCall": {"name": TOOL_NAME}},
                {"functionCall": {"name": "run_shell_command", "args": {"command": "ls"}}},
            ]),
            Some("STOP"),
            None,
        );
        let round = RoundCalls::of(GeminiRecall.parts(&mixed));
        assert_eq!(
            round.recall,
            [
                call("fc_1", r#"{"refs":["ctx:1"]}"#),
                call("recall-2", "{}")
            ]
        );
        assert!(round.client_calls);
        let plain = reply("r", json!([{"text": "hi"}]), Some("STOP"), None);
        assert_eq!(
            RoundCalls::of(GeminiRecall.parts(&plain)),
            RoundCalls::default()
        );
    }

    #[test]
    fn a_continuation_carries_the_rounds_parts_verbatim_then_the_answers() {
        let said = json!([
            {"text": "The port was set early.", "thought": true},
            {"text": "Let me look.", "thoughtSignature": "dGV4dA=="},
            recall_part(None, json!({"query": "port"}), Some("Y2FsbA==")),
            recall_part(Some("fc_2"), json!({}), None),
        ]);
        let round = reply("r", said.clone(), Some("STOP"), Some(usage(10, 4)));
        let calls = RoundCalls::of(GeminiRecall.parts(&round)).recall;
        assert_eq!(
            calls,
            [call("recall-2", r#"{"query":"port"}"#), call("fc_2", "{}")]
        );
        let answered = [
            Answered {
                call: &calls[0],
                text: "port 23456",
                is_error: false,
            },
            Answered {
                call: &calls[1],
                text: "no refs or query",
                is_error: true,
            },
        ];
        let user = json!({"role": "user", "parts": [{"text": "Which port?"}]});
        let mut request = object(json!({"contents": [user], "toolConfig":
            {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["bash"]}}}));
        GeminiRecall.continue_with(&mut request, &round, &answered, false);
        assert_eq!(
            request["toolConfig"]["functionCallingConfig"]["mode"],
            "ANY"
        );
        let contents = request["contents"].as_array().cloned().unwrap_or_default();
        assert_eq!(contents.len(), 3);
        assert_eq!(contents[1], json!({"role": "model", "parts": said}));
        assert_eq!(
            contents[2],
            json!({"role": "user", "parts": [
                {"functionResponse": {"name": TOOL_NAME, "response": {"output": "port 23456"}}},
                {"functionResponse": {"name": TOOL_NAME, "response": {"error": "no refs or query"},
                    "id": "fc_2"}},
            ]})
        );

        GeminiRecall.continue_with(&mut request, &round, &answered[..1], true);
        assert_eq!(
            request["toolConfig"],
            json!({"functionCallingConfig": {"mode": "NONE"}})
        );
        let mut snake = object(json!({"contents": [], "tool_config":
            {"function_calling_config": {"mode": "AUTO"}}}));
        GeminiRecall.continue_with(&mut snake, &round, &answered[..1], true);
        assert_eq!(
            snake["tool_config"]["function_calling_config"]["mode"],
            "NONE"
        );
        assert!(!snake.contains_key("toolConfig"));
    }

    #[test]
    fn the_merged_reply_has_no_recall_sums_usage_and_stops() {
        let first = GeminiRecall.merge(
            None,
            reply(
                "one",
                json!([{"text": "Looking. "}, recall_part(None, json!({}), Some("c2ln"))]),
                Some("MALFORMED_FUNCTION_CALL"),
                Some(usage(10, 2)),
            ),
        );
        assert_eq!(first["candidates"][0]["finishReason"], "STOP");
        assert_eq!(
            first["candidates"][0]["content"]["parts"],
            json!([{"text": "Looking. "}])
        );
        let mut second_usage = usage(30, 3);
        second_usage["thoughtsTokenCount"] = json!(7);
        let merged = GeminiRecall.merge(
            Some(first),
            reply(
                "two",
                json!([{"text": "Port 23456."}]),
                Some("STOP"),
                Some(second_usage),
            ),
        );
        assert_eq!(merged["responseId"], "one");
        assert_eq!(merged["candidates"][0]["finishReason"], "STOP");
        assert_eq!(
            merged["candidates"][0]["content"]["parts"],
            json!([{"text": "Looking. "}, {"text": "Port 23456."}])
        );
        assert_eq!(
            merged["usageMetadata"],
            json!({"promptTokenCount": 40, "candidatesTokenCount": 5, "totalTokenCount": 45,
                "thoughtsTokenCount": 7})
        );
        assert!(!merged.to_string().contains(TOOL_NAME));
    }

    /// Gemini signs a step's first call only: with the recall call gone, the client's call
    /// takes its signature, or the client's next request is refused.
    #[test]
    fn a_mixed_reply_keeps_the_clients_call_and_the_steps_signature() {
        let merged = GeminiRecall.merge(
            None,
            reply(
                "one",
                json!([
                    recall_part(None, json!({}), Some("c2ln")),
                    {"functionCall": {"name": "bash", "args": {}}},
                ]),
                Some("STOP"),
                None,
            ),
        );
        assert_eq!(
            merged["candidates"][0]["content"]["parts"],
            json!([{"functionCall": {"name": "bash", "args": {}}, "thoughtSignature": "c2ln"}])
        );
    }

    /// Feeds events one by one: what the client got of each.
    fn feed(stream: &mut Stitched, chunks: &[Value]) -> Vec<Option<Value>> {
        chunks
            .iter()
            .map(|chunk| {
                stream
                    .event(bytes::Bytes::copy_from_slice(&(sse(chunk))[..]))
                    .and_then(|out| event_json(&out))
            })
            .collect()
    }

    #[test]
    fn a_streamed_round_is_carried_whole_signatures_and_all() {
        let mut stream = Stitched::new(&GeminiRecall);
        let thought = json!({"text": "The port was set early.", "thought": true});
        let looking = json!({"text": "Let me look."});
        let recall = recall_part(None, json!({"query": "port"}), Some("Y2FsbA=="));
        let chunks = [
            reply("a", json!([thought]), None, Some(usage(10, 1))),
            reply("a", json!([looking]), None, Some(usage(10, 2))),
            reply("a", json!([recall]), Some("STOP"), Some(usage(10, 6))),
        ];
        let got = feed(&mut stream, &chunks);
        assert_eq!(got[..2], [Some(chunks[0].clone()), Some(chunks[1].clone())]);
        assert_eq!(got[2], None);
        let round = stream.round_end();
        assert_eq!(
            round.calls.recall,
            [call("recall-2", r#"{"query":"port"}"#)]
        );
        assert_eq!(
            round.reply.pointer(GeminiRecall.fields().output_tokens),
            Some(&json!(6))
        );
        let mut request = object(json!({"contents": [{"role": "user", "parts": [{"text": "?"}]}]}));
        let answered = [Answered {
            call: &round.calls.recall[0],
            text: "port 23456",
            is_error: false,
        }];
        GeminiRecall.continue_with(&mut request, &round.reply, &answered, false);
        assert_eq!(
            request["contents"][1],
            json!({"role": "model", "parts": [thought, looking, recall]})
        );
        assert_eq!(
            request["contents"][2]["parts"][0]["functionResponse"]["response"],
            json!({"output": "port 23456"})
        );
    }

    #[test]
    fn a_streamed_recall_is_held_and_the_continuation_stitched_on() {
        let mut stream = Stitched::new(&GeminiRecall);
        let round_one = [
            reply("a", json!([{"text": "Looking. "}]), None, None),
            // Recall alone in a chunk of its own: nothing left for the client.
            reply("a", json!([recall_part(None, json!({}), None)]), None, None),
            reply(
                "a",
                json!([{"text": "One moment."}, recall_part(Some("fc_1"), json!({"refs": ["ctx:1"]}), Some("c2ln"))]),
                Some("STOP"),
                Some(usage(10, 5)),
            ),
        ];
        let got = feed(&mut stream, &round_one);
        assert_eq!(got, [Some(round_one[0].clone()), None, None]);
        let calls = stream.round_end().calls;
        assert_eq!(
            calls.recall,
            [
                call("recall-1", "{}"),
                call("fc_1", r#"{"refs":["ctx:1"]}"#)
            ]
        );
        assert!(!calls.client_calls);

        // The closing chunk's text reaches the client before the next round's.
        let unsent = stream.next_round();
        let unsent = event_json(&unsent).unwrap_or_default();
        assert_eq!(
            unsent["candidates"][0]["content"]["parts"],
            json!([{"text": "One moment."}])
        );
        assert!(unsent["candidates"][0].get("finishReason").is_none());
        assert!(unsent.get("usageMetadata").is_none());
        let round_two = [
            reply(
                "b",
                json!([{"text": "Port 23456."}]),
                None,
                Some(usage(30, 2)),
            ),
            reply(
                "b",
                json!([{"text": "", "thoughtSignature": "ZW5k"}]),
                Some("STOP"),
                Some(usage(30, 3)),
            ),
        ];
        let got = feed(&mut stream, &round_two);
        let mut shown = round_two[0].clone();
        shown["responseId"] = json!("a");
        assert_eq!(got, [Some(shown), None]);
        assert_eq!(stream.round_end().calls, RoundCalls::default());

        let closed = stream.close();
        let text = String::from_utf8_lossy(&closed).into_owned();
        assert!(!text.contains(TOOL_NAME), "{text}");
        assert_eq!(text.matches("data: ").count(), 1, "{text}");
        let last = event_json(&closed).unwrap_or_default();
        assert_eq!(last["responseId"], "a");
        assert_eq!(last["candidates"][0]["finishReason"], "STOP");
        assert_eq!(
            last["candidates"][0]["content"]["parts"],
            json!([{"text": "", "thoughtSignature": "ZW5k"}])
        );
        assert_eq!(last["usageMetadata"], usage(40, 8));
    }

    #[test]
    fn a_mixed_round_passes_the_clients_call_and_closes_as_it_came() {
        let mut stream = Stitched::new(&GeminiRecall);
        let calls = reply(
            "a",
            json!([
                recall_part(None, json!({}), Some("c2ln")),
                {"functionCall": {"name": "bash", "args": {"command": "ls"}}},
            ]),
            None,
            None,
        );
        let closing = reply("a", json!([]), Some("STOP"), Some(usage(10, 9)));
        let got = feed(&mut stream, &[calls, closing.clone()]);
        assert_eq!(
            got[0]
                .as_ref()
                .map(|c| c["candidates"][0]["content"]["parts"].clone()),
            Some(
                json!([{"functionCall": {"name": "bash", "args": {"command": "ls"}},
                "thoughtSignature": "c2ln"}])
            )
        );
        assert_eq!(got[1], None);
        let round = stream.round_end().calls;
        assert!(round.client_calls);
        assert_eq!(round.recall, [call("recall-0", "{}")]);
        assert_eq!(stream.close(), sse(&closing));
    }

    #[test]
    fn a_failed_continuation_ends_the_stream_in_googles_error_shape() {
        let failed = GeminiRecall
            .stream()
            .failed("upstream failed", &mut ClientView::default());
        assert_eq!(
            event_json(&failed),
            Some(
                json!({"error": {"code": 500, "message": "upstream failed", "status": "INTERNAL"}})
            )
        );
        assert!(failed.starts_with(b"data: ") && failed.ends_with(b"\n\n"));
    }
}
