//! The recall tool in the Responses API: a `function` tool, called by a `function_call`
//! output item and answered by a `function_call_output` input item; streamed as that item's
//! `response.output_item.*` and `response.function_call_arguments.*` events. A continuation
//! carries the round's output items as input (its reasoning items with their encrypted
//! content among them).
//!
//! A client call is an output item the client must answer: a `…_call` with a `call_id`
//! (`function_call`, `custom_tool_call`, `computer_call`, `local_shell_call`, …), as the
//! dialect's view reads tool calls. Calls upstream ran itself (`web_search_call`,
//! `mcp_call`, …) carry no `call_id` and need nothing of the client.
//!
//! The reply the client gets carries the last round's `id`: upstream stored that response
//! with the whole continued conversation, so a later `previous_response_id` chains on a
//! conversation with every call answered (the first round's stored response ends in
//! condenser's unanswered call).

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::view::{is_tool_call, item_type};
use crate::dialect::recall::{
    names_the_tool, parameters, slot, text_of, unflagged_result, Answered, ClientView, Fields,
    Kind, Part, RecallCall, RecallWire, Relayed, StreamWire, TOOL_DESCRIPTION, TOOL_NAME,
};

pub struct ResponsesRecall;

/// How Responses streams read, for recall.
struct ResponsesStream;

const FIELDS: Fields = Fields {
    // The last round's id, as the module's note says.
    id: None,
    usage: "usage",
    output_tokens: "/usage/output_tokens",
    // A response says how it ended in its `status`: a round that called recall is as
    // `completed` as one that answered.
    stop: None,
};

fn is_recall_call(item: &Value) -> bool {
    item.get("type").and_then(Value::as_str) == Some("function_call") && names_the_tool(item)
}

fn is_client_call(item: &Value) -> bool {
    is_tool_call(item_type(item), item) && !is_recall_call(item)
}

fn output(reply: &Value) -> impl Iterator<Item = &Value> {
    let items = reply.get("output").and_then(Value::as_array);
    items.into_iter().flatten().filter(|item| is_item(item))
}

/// A streamed round's items are gathered by index: a gap is no item.
fn is_item(item: &Value) -> bool {
    item.is_object()
}

impl RecallWire for ResponsesRecall {
    fn tool(&self) -> Value {
        json!({"type": "function", "name": TOOL_NAME, "description": TOOL_DESCRIPTION,
            "parameters": parameters()})
    }

    fn fields(&self) -> &'static Fields {
        &FIELDS
    }

    fn parts_of<'a>(&self, reply: &'a Value) -> Vec<&'a Value> {
        output(reply).collect()
    }

    fn part(&self, item: &Value, _index: usize) -> Part {
        let recall = is_recall_call(item).then(|| RecallCall {
            id: text_of(item, "call_id"),
            arguments: text_of(item, "arguments"),
        });
        Part::of(recall, is_client_call(item))
    }

    fn take_parts(&self, reply: &mut Value) -> Option<Vec<Value>> {
        let response = reply.as_object_mut()?;
        Some(match response.get_mut("output") {
            Some(Value::Array(items)) => {
                std::mem::take(items).into_iter().filter(is_item).collect()
            }
            _ => Vec::new(),
        })
    }

    /// The items as the response's `output`, and its `output_text` (where it has one) read
    /// from them.
    fn put_parts(&self, reply: &mut Value, items: Vec<Value>) {
        let Some(response) = reply.as_object_mut() else {
            return;
        };
        if response.contains_key("output_text") {
            response.insert("output_text".into(), json!(output_text(&items)));
        }
        response.insert("output".into(), Value::Array(items));
    }

    /// The round's output items as input. Unstored items are no item to refer to by id:
    /// upstream refuses an id it never kept.
    fn carried(&self, request: &Map<String, Value>, round: &Value) -> Vec<Value> {
        let stored = request.get("store").and_then(Value::as_bool) != Some(false);
        output(round)
            .map(|item| {
                let mut item = item.clone();
                if let (false, Some(item)) = (stored, item.as_object_mut()) {
                    item.remove("id");
                }
                item
            })
            .collect()
    }

    fn call(&self, call: &RecallCall) -> Value {
        json!({"type": "function_call", "call_id": call.id,
            "name": TOOL_NAME, "arguments": call.arguments})
    }

    fn result(&self, answered: &Answered, _call: &Value) -> Value {
        unflagged_result(
            answered,
            ("type", "function_call_output"),
            "call_id",
            "output",
        )
    }

    /// Both turns are input items; an input given as text becomes the user's message first.
    fn append(&self, request: &mut Map<String, Value>, said: Vec<Value>, results: Vec<Value>) {
        let input = request
            .entry("input")
            .or_insert_with(|| Value::Array(Vec::new()));
        match input {
            Value::String(text) => {
                let text = std::mem::take(text);
                *input = json!([{"role": "user", "content": text}]);
            }
            Value::Null => *input = Value::Array(Vec::new()),
            _ => {}
        }
        if let Some(items) = input.as_array_mut() {
            items.extend(said);
            items.extend(results);
        }
    }

    fn stop_calling(&self, request: &mut Map<String, Value>) {
        request.insert("tool_choice".into(), json!("none"));
    }

    fn scrub(&self, reply: &mut Value) -> bool {
        without_the_tool(reply)
    }

    fn stream(&self) -> &'static dyn StreamWire {
        &ResponsesStream
    }
}

/// A response object without the recall tool among the `tools` it echoes; true when it was
/// there.
fn without_the_tool(response: &mut Value) -> bool {
    let Some(tools) = response.get_mut("tools").and_then(Value::as_array_mut) else {
        return false;
    };
    let before = tools.len();
    tools.retain(|tool| !names_the_tool(tool));
    tools.len() != before
}

/// The text of the output's messages, joined, as the SDKs' `output_text` reads it.
fn output_text(output: &[Value]) -> String {
    output
        .iter()
        .filter(|item| item.get("type").and_then(Value::as_str) == Some("message"))
        .filter_map(|item| item.get("content").and_then(Value::as_array))
        .flatten()
        .filter(|part| part.get("type").and_then(Value::as_str) == Some("output_text"))
        .filter_map(|part| part.get("text").and_then(Value::as_str))
        .collect()
}

/// The events that end a response; held until no round follows.
const CLOSING: [&str; 3] = [
    "response.completed",
    "response.incomplete",
    "response.failed",
];

/// A continuation's opening events, which the client already had from the first round.
const OPENING: [&str; 3] = [
    "response.created",
    "response.in_progress",
    "response.queued",
];

impl StreamWire for ResponsesStream {
    fn kind(&self, data: &Value) -> Kind {
        let kind = data.get("type").and_then(Value::as_str).unwrap_or_default();
        if OPENING.contains(&kind) {
            Kind::Opening
        } else if CLOSING.contains(&kind) {
            Kind::Closing
        } else {
            Kind::Body
        }
    }

    /// A round is its latest response object, with the output items streamed whole
    /// (`response.output_item.done`) where that object lists none.
    fn gather(&self, round: &mut Value, data: &Value) {
        if let Some(response) = data.get("response").filter(|r| r.is_object()) {
            let gathered = round.get_mut("output").map(Value::take);
            *round = response.clone();
            let listed = output(round).next().is_some();
            if let (false, Some(gathered)) = (listed, gathered) {
                round["output"] = gathered;
            }
            return;
        }
        if data.get("type").and_then(Value::as_str) != Some("response.output_item.done") {
            return;
        }
        let (Some(index), Some(item)) = (
            data.get("output_index")
                .and_then(Value::as_u64)
                .and_then(|i| usize::try_from(i).ok()),
            data.get("item"),
        ) else {
            return;
        };
        let Some(round) = round.as_object_mut() else {
            return;
        };
        let items = round.entry("output").or_insert_with(|| json!([]));
        if let Some(place) = items.as_array_mut().and_then(|items| slot(items, index)) {
            *place = item.clone();
        }
    }

    fn relay(&self, data: &mut Value, view: &mut ClientView) -> Relayed {
        let mut changed = false;
        if let Some(index) = data.get("output_index").and_then(Value::as_u64) {
            if data.get("type").and_then(Value::as_str) == Some("response.output_item.added") {
                if let Some(item) = data.get("item") {
                    view.start(index, is_recall_call(item));
                }
            }
            if view.held(index) {
                return Relayed::Dropped;
            }
            if let Some(shown) = view.shown(index).filter(|&shown| shown != index) {
                data["output_index"] = json!(shown);
                changed = true;
            }
        }
        // The client's events are numbered without gaps across dropped ones and rounds.
        let sequence = view.next_sequence();
        if data.get("sequence_number").and_then(Value::as_u64) != Some(sequence) {
            data["sequence_number"] = json!(sequence);
            changed = true;
        }
        if let Some(response) = data.get_mut("response") {
            changed |= without_the_tool(response);
        }
        Relayed::changed_if(changed)
    }

    fn close(&self, closing: &mut [Value], merged: &Value, view: &mut ClientView) {
        for data in closing {
            if data.get("response").is_some_and(Value::is_object) {
                data["response"] = merged.clone();
            }
            data["sequence_number"] = json!(view.next_sequence());
        }
    }

    /// The Responses API's `error` event, numbered after the events the client got.
    fn failed(&self, message: &str, view: &mut ClientView) -> Bytes {
        let error = json!({"type": "error", "code": "server_error", "message": message,
            "param": null, "sequence_number": view.next_sequence()});
        Bytes::from(format!("event: error\ndata: {error}\n\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::recall::testing::call;
    use crate::dialect::recall::{event_json, RecallPolicy, RoundCalls, Stitched};

    fn recall_item(call_id: &str, arguments: &str) -> Value {
        json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
            "name": TOOL_NAME, "arguments": arguments, "status": "completed"})
    }

    fn message(text: &str) -> Value {
        json!({"type": "message", "id": "msg", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]})
    }

    #[test]
    fn the_tool_is_offered_last_and_once() {
        let mut request = json!({"model": "m", "input": "hi",
            "tools": [{"type": "function", "name": "bash", "parameters": {}}, {"type": "web_search"}]});
        let body = request.as_object_mut().unwrap();
        ResponsesRecall.offer(body);
        ResponsesRecall.offer(body);
        let tools = body["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 3);
        assert_eq!(tools[0]["name"], "bash");
        assert_eq!(
            tools[2],
            json!({"type": "function", "name": TOOL_NAME, "description": TOOL_DESCRIPTION,
                "parameters": parameters()})
        );
        assert_eq!(body.keys().collect::<Vec<_>>(), ["model", "input", "tools"]);
        let mut bare = Map::new();
        ResponsesRecall.offer(&mut bare);
        assert_eq!(bare["tools"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn calls_tell_recall_from_the_clients_own() {
        let reply = json!({"output": [
            message("Looking."),
            recall_item("r1", "{\"refs\":[\"ctx:1\"]}"),
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        ]});
        let round = RoundCalls::of(ResponsesRecall.parts(&reply));
        assert_eq!(round.recall, [call("r1", "{\"refs\":[\"ctx:1\"]}")]);
        assert!(!round.client_calls, "upstream ran its own search");
        for client in [
            json!({"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"}),
            json!({"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": "x"}),
            json!({"type": "local_shell_call", "call_id": "c3", "action": {}}),
        ] {
            let mixed = json!({"output": [recall_item("r1", "{}"), client]});
            let round = RoundCalls::of(ResponsesRecall.parts(&mixed));
            assert_eq!(round.recall, [call("r1", "{}")]);
            assert!(round.client_calls, "{client}");
        }
        let plain = RoundCalls::of(ResponsesRecall.parts(&json!({"output": [message("hi")]})));
        assert_eq!(plain, RoundCalls::default());
    }

    #[test]
    fn a_continuation_carries_the_calls_then_their_answers() {
        let mut request = json!({"model": "m", "input": "what port?", "store": false});
        let body = request.as_object_mut().unwrap();
        let (first, second) = (call("r1", "{\"refs\":[\"ctx:1\"]}"), call("r2", "{}"));
        let answered = [
            Answered {
                call: &first,
                text: "we bind to port 23456",
                is_error: false,
            },
            Answered {
                call: &second,
                text: "no refs or query",
                is_error: true,
            },
        ];
        ResponsesRecall.continue_with(body, &json!({}), &answered, false);
        assert!(!body.contains_key("tool_choice"));
        assert_eq!(body["store"], false);
        assert_eq!(
            body["input"],
            json!([
                {"role": "user", "content": "what port?"},
                {"type": "function_call", "call_id": "r1", "name": TOOL_NAME,
                    "arguments": "{\"refs\":[\"ctx:1\"]}"},
                {"type": "function_call", "call_id": "r2", "name": TOOL_NAME, "arguments": "{}"},
                {"type": "function_call_output", "call_id": "r1", "output": "we bind to port 23456"},
                {"type": "function_call_output", "call_id": "r2", "output": "Error: no refs or query"},
            ])
        );
        ResponsesRecall.continue_with(body, &json!({}), &answered[..1], true);
        assert_eq!(body["tool_choice"], "none");
        assert_eq!(body["input"].as_array().unwrap().len(), 7);
    }

    /// A continuation carries the round's output items as input, its reasoning item with
    /// its encrypted content among them; an unstored request's items go without the ids
    /// upstream never kept.
    #[test]
    fn a_continuation_carries_the_rounds_reasoning_item_and_drops_unstored_ids() {
        let reasoning = json!({"type": "reasoning", "id": "rs_1", "summary": [],
            "encrypted_content": "gAAAAB-opaque"});
        let round = json!({"id": "resp_1", "output": [reasoning, recall_item("r1", "{\"query\":\"port\"}")]});
        let found = call("r1", "{\"query\":\"port\"}");
        let answered = [Answered {
            call: &found,
            text: "port 23456",
            is_error: false,
        }];
        for (store, id) in [(json!(false), None), (json!(true), Some("rs_1"))] {
            let mut request = json!({"model": "gpt-5", "store": store, "input": "Which port?"});
            let body = request.as_object_mut().unwrap();
            ResponsesRecall.continue_with(body, &round, &answered, false);
            let input = body["input"].as_array().unwrap();
            assert_eq!(input.len(), 4, "{input:?}");
            assert_eq!(input[1]["type"], "reasoning");
            assert_eq!(input[1]["encrypted_content"], "gAAAAB-opaque");
            assert_eq!(input[1]["id"].as_str(), id);
            assert_eq!(input[2]["call_id"], "r1");
            assert_eq!(input[2]["name"], TOOL_NAME);
            assert_eq!(
                input[3],
                json!({"type": "function_call_output", "call_id": "r1", "output": "port 23456"})
            );
        }
    }

    #[test]
    fn the_merged_reply_has_no_recall_the_last_rounds_id_and_summed_usage() {
        let first = ResponsesRecall.merge(
            None,
            json!({"id": "resp_1", "created_at": 100, "output_text": "Looking. ",
                "output": [message("Looking. "), recall_item("r1", "{}")],
                "usage": usage(10, 2, 0)}),
        );
        assert_eq!(first["output"], json!([message("Looking. ")]));
        let merged = ResponsesRecall.merge(
            Some(first),
            json!({"id": "resp_2", "created_at": 105, "status": "completed",
                "output_text": "Port 23456.",
                "output": [message("Port 23456.")], "usage": usage(30, 3, 8)}),
        );
        // The id a later `previous_response_id` chains on: the round stored with every call
        // answered.
        assert_eq!(merged["id"], "resp_2");
        assert_eq!(merged["created_at"], 105);
        assert_eq!(merged["status"], "completed");
        assert_eq!(
            merged["output"],
            json!([message("Looking. "), message("Port 23456.")])
        );
        assert_eq!(merged["output_text"], "Looking. Port 23456.");
        assert_eq!(merged["usage"], usage(40, 5, 8));
    }

    /// A stream's events as upstream writes them, numbered from `sequence`.
    struct Upstream {
        sequence: u64,
        id: &'static str,
    }

    impl Upstream {
        fn new(id: &'static str) -> Upstream {
            Upstream { sequence: 0, id }
        }

        fn event(&mut self, kind: &str, mut data: Value) -> Vec<u8> {
            data["type"] = json!(kind);
            data["sequence_number"] = json!(self.sequence);
            self.sequence += 1;
            format!("event: {kind}\ndata: {data}\n\n").into_bytes()
        }

        fn response(&self, status: &str, output: Value, usage: Value) -> Value {
            json!({"id": self.id, "object": "response", "created_at": 100, "status": status,
                "output": output, "usage": usage})
        }

        fn opening(&mut self) -> Vec<Vec<u8>> {
            let response = self.response("in_progress", json!([]), Value::Null);
            vec![
                self.event("response.created", json!({"response": response})),
                self.event("response.in_progress", json!({"response": response})),
            ]
        }

        fn text_item(&mut self, index: u64, text: &str) -> Vec<Vec<u8>> {
            let at = json!({"output_index": index, "item_id": "msg", "content_index": 0});
            let mut open = message("");
            open["status"] = json!("in_progress");
            open["content"] = json!([]);
            vec![
                self.event(
                    "response.output_item.added",
                    json!({"output_index": index, "item": open}),
                ),
                self.event("response.output_text.delta", with(&at, "delta", text)),
                self.event("response.output_text.done", with(&at, "text", text)),
                self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": message(text)}),
                ),
            ]
        }

        fn call_item(&mut self, index: u64, item: &Value, parts: &[&str]) -> Vec<Vec<u8>> {
            let mut open = item.clone();
            open["arguments"] = json!("");
            open["status"] = json!("in_progress");
            let at = json!({"output_index": index, "item_id": item["id"]});
            let mut events = vec![self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": open}),
            )];
            for part in parts {
                events.push(self.event(
                    "response.function_call_arguments.delta",
                    with(&at, "delta", part),
                ));
            }
            events.push(self.event(
                "response.function_call_arguments.done",
                with(&at, "arguments", &parts.concat()),
            ));
            events.push(self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ));
            events
        }

        fn completed(&mut self, output: Value, usage: Value) -> Vec<u8> {
            let response = self.response("completed", output, usage);
            self.event("response.completed", json!({"response": response}))
        }
    }

    /// `data` with one more string field.
    fn with(data: &Value, name: &str, text: &str) -> Value {
        let mut data = data.clone();
        data[name] = json!(text);
        data
    }

    fn usage(input: u64, output: u64, cached: u64) -> Value {
        json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input + output})
    }

    /// What the client gets of `events`, each event's data.
    fn relay(stream: &mut Stitched, events: Vec<Vec<u8>>) -> Vec<Value> {
        events
            .iter()
            .filter_map(|event| stream.event(bytes::Bytes::copy_from_slice(event)))
            .map(|out| event_json(&out).unwrap())
            .collect()
    }

    fn field(events: &[Value], name: &str) -> Vec<Value> {
        events.iter().map(|event| event[name].clone()).collect()
    }

    #[test]
    fn a_streamed_recall_is_held_and_the_continuation_stitched_on() {
        let mut stream = Stitched::new(&ResponsesRecall);
        let mut one = Upstream::new("resp_1");
        let mut events = one.opening();
        events.extend(one.text_item(0, "Looking. "));
        let arguments = ["{\"refs\":", "[\"ctx:7f3a\"]}"];
        let recall = recall_item("r1", &arguments.concat());
        for event in &events {
            let out = stream.event(bytes::Bytes::copy_from_slice(event));
            assert_eq!(
                out.as_deref(),
                Some(&event[..]),
                "passed as upstream wrote it"
            );
        }
        let recall_events = one.call_item(1, &recall, &arguments);
        assert!(relay(&mut stream, recall_events).is_empty());
        let closing = one.completed(json!([message("Looking. "), recall]), usage(10, 2, 0));
        assert!(
            stream
                .event(bytes::Bytes::copy_from_slice(&(closing)[..]))
                .is_none(),
            "held"
        );
        let round = stream.round_end().calls;
        assert_eq!(round.recall, [call("r1", "{\"refs\":[\"ctx:7f3a\"]}")]);
        assert!(!round.client_calls);

        stream.next_round();
        let mut two = Upstream::new("resp_2");
        let mut events = two.opening();
        events.extend(two.text_item(0, "Port 23456."));
        let passed = relay(&mut stream, events);
        assert_eq!(
            field(&passed, "type"),
            [
                "response.output_item.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.output_item.done"
            ],
            "no second opening"
        );
        assert!(passed.iter().all(|event| event["output_index"] == 1));
        assert_eq!(field(&passed, "sequence_number"), [6, 7, 8, 9]);
        assert_eq!(passed[1]["delta"], "Port 23456.");
        let closing = two.completed(json!([message("Port 23456.")]), usage(30, 3, 0));
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(&(closing)[..]))
            .is_none());
        assert_eq!(stream.round_end().calls, RoundCalls::default());

        let close = stream.close();
        let text = String::from_utf8(close.to_vec()).unwrap();
        assert!(
            text.starts_with("event: response.completed\ndata: "),
            "{text}"
        );
        assert_eq!(text.matches("data:").count(), 1);
        assert!(!text.contains(TOOL_NAME));
        let completed = event_json(&close).unwrap();
        assert_eq!(completed["sequence_number"], 10);
        let response = &completed["response"];
        assert_eq!(response["id"], "resp_2");
        assert_eq!(
            response["output"],
            json!([message("Looking. "), message("Port 23456.")])
        );
        assert_eq!(response["usage"], usage(40, 5, 0));
    }

    #[test]
    fn a_mixed_round_passes_the_clients_call_and_drops_the_recall() {
        let mut stream = Stitched::new(&ResponsesRecall);
        let mut one = Upstream::new("resp_1");
        let opening = relay(&mut stream, one.opening());
        assert_eq!(opening.len(), 2);
        let recall = recall_item("r1", "{}");
        let recall_events = one.call_item(0, &recall, &["{}"]);
        assert!(relay(&mut stream, recall_events).is_empty());
        let bash = json!({"type": "function_call", "id": "fc_c1", "call_id": "c1", "name": "bash",
            "arguments": "{\"cmd\":\"ls\"}", "status": "completed"});
        let client_events = one.call_item(1, &bash, &["{\"cmd\":", "\"ls\"}"]);
        let passed = relay(&mut stream, client_events);
        assert_eq!(passed.len(), 5);
        assert!(passed.iter().all(|event| event["output_index"] == 0));
        assert_eq!(field(&passed, "sequence_number"), [2, 3, 4, 5, 6]);
        assert_eq!(passed[4]["item"], bash);
        let closing = one.completed(json!([recall, bash]), usage(10, 4, 0));
        assert!(stream
            .event(bytes::Bytes::copy_from_slice(&(closing)[..]))
            .is_none());
        let round = stream.round_end().calls;
        assert!(round.client_calls);
        assert_eq!(round.recall, [call("r1", "{}")]);
        let completed = event_json(&stream.close()).unwrap();
        assert_eq!(completed["response"]["output"], json!([bash]));
        assert_eq!(completed["response"]["usage"], usage(10, 4, 0));
        assert_eq!(completed["sequence_number"], 7);
    }

    #[test]
    fn data_that_is_no_event_object_goes_by_without_harm() {
        let mut stream = Stitched::new(&ResponsesRecall);
        for data in ["1", "\"x\"", "[]"] {
            let event = format!("event: response.output_text.delta\ndata: {data}\n\n");
            assert_eq!(
                stream
                    .event(bytes::Bytes::copy_from_slice(event.as_bytes()))
                    .as_deref(),
                Some(event.as_bytes())
            );
        }
        // A continuation's closing event whose `response` is no object: held, then closed
        // as it came but for its number.
        stream.next_round();
        let odd = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":1}\n\n";
        assert_eq!(
            stream.event(bytes::Bytes::copy_from_slice(odd.as_bytes())),
            None
        );
        let closed = String::from_utf8(stream.close().to_vec()).unwrap();
        assert!(closed.contains("\"response\":1"), "{closed}");
        assert!(closed.contains("\"sequence_number\":0"), "{closed}");
    }

    #[test]
    fn a_stream_that_never_closed_has_nothing_to_close() {
        let mut stream = Stitched::new(&ResponsesRecall);
        let mut one = Upstream::new("resp_1");
        assert_eq!(relay(&mut stream, one.opening()).len(), 2);
        assert!(stream.close().is_empty());
    }
}
