//! The recall tool in the Responses API: a `function` tool, called by a `function_call`
//! output item and answered by a `function_call_output` input item; streamed as that item's
//! `response.output_item.*` and `response.function_call_arguments.*` events.
//!
//! A client call is an output item the client must answer: a `…_call` with a `call_id`
//! (`function_call`, `custom_tool_call`, `computer_call`, `local_shell_call`, …), as the
//! dialect's view reads tool calls. Calls upstream ran itself (`web_search_call`,
//! `mcp_call`, …) carry no `call_id` and need nothing of the client.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::view::{is_tool_call, item_type};
use crate::dialect::recall::{
    add_usage, answer_text, event_json, parameters, rewrite_event, Answered, RecallCall,
    RecallStream, RecallWire, RoundCalls, TOOL_DESCRIPTION, TOOL_NAME,
};

pub struct ResponsesRecall;

fn is_recall_call(item: &Value) -> bool {
    item.get("type").and_then(Value::as_str) == Some("function_call")
        && item.get("name").and_then(Value::as_str) == Some(TOOL_NAME)
}

fn is_client_call(item: &Value) -> bool {
    is_tool_call(item_type(item), item) && !is_recall_call(item)
}

fn text(value: &Value, field: &str) -> String {
    match value.get(field) {
        Some(Value::String(text)) => text.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => other.to_string(),
    }
}

fn recall_call(item: &Value) -> RecallCall {
    RecallCall {
        id: text(item, "call_id"),
        arguments: text(item, "arguments"),
    }
}

impl RecallWire for ResponsesRecall {
    fn offer(&self, request: &mut Map<String, Value>) {
        let tools = request
            .entry("tools")
            .or_insert_with(|| Value::Array(Vec::new()));
        if tools.is_null() {
            *tools = Value::Array(Vec::new());
        }
        if let Some(tools) = tools.as_array_mut() {
            let offered = tools.iter().any(|tool| {
                tool.get("type").and_then(Value::as_str) == Some("function")
                    && tool.get("name").and_then(Value::as_str) == Some(TOOL_NAME)
            });
            if !offered {
                tools.push(json!({
                    "type": "function",
                    "name": TOOL_NAME,
                    "description": TOOL_DESCRIPTION,
                    "parameters": parameters(),
                }));
            }
        }
    }

    fn calls(&self, reply: &Value) -> RoundCalls {
        let mut round = RoundCalls::default();
        let output = reply.get("output").and_then(Value::as_array);
        for item in output.into_iter().flatten() {
            if is_recall_call(item) {
                round.recall.push(recall_call(item));
            } else if is_client_call(item) {
                round.client_calls = true;
            }
        }
        round
    }

    fn continue_with(&self, request: &mut Map<String, Value>, answered: &[Answered], last: bool) {
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
            items.extend(answered.iter().map(|a| {
                json!({
                    "type": "function_call",
                    "call_id": a.call.id,
                    "name": TOOL_NAME,
                    "arguments": a.call.arguments,
                })
            }));
            items.extend(answered.iter().map(|a| {
                json!({
                    "type": "function_call_output",
                    "call_id": a.call.id,
                    "output": answer_text(a),
                })
            }));
        }
        if last {
            request.insert("tool_choice".into(), json!("none"));
        }
    }

    fn scrub(&self, reply: &mut Value) -> bool {
        without_the_tool(reply)
    }

    fn merge(&self, earlier: Option<Value>, mut reply: Value) -> Value {
        without_the_tool(&mut reply);
        let mut output = Vec::new();
        let mut usage = None;
        if let Some(earlier) = &earlier {
            gather(earlier, &mut output, &mut usage);
        }
        gather(&reply, &mut output, &mut usage);
        let first = earlier.as_ref().and_then(|earlier| {
            let field = |name: &str| earlier.get(name).cloned();
            Some((field("id")?, field("created_at")))
        });
        if let Some(response) = reply.as_object_mut() {
            finish(response, output, usage, first);
        }
        reply
    }

    fn stream(&self) -> Box<dyn RecallStream> {
        Box::new(ResponsesStream::default())
    }
}

/// A response object without the recall tool among the `tools` it echoes; true when it was
/// there.
fn without_the_tool(response: &mut Value) -> bool {
    let Some(tools) = response.get_mut("tools").and_then(Value::as_array_mut) else {
        return false;
    };
    let before = tools.len();
    tools.retain(|tool| tool.get("name").and_then(Value::as_str) != Some(TOOL_NAME));
    tools.len() != before
}

/// Adds a response's client-visible output items to `output` and its usage to `usage`.
fn gather(response: &Value, output: &mut Vec<Value>, usage: &mut Option<Value>) {
    let items = response.get("output").and_then(Value::as_array);
    output.extend(
        items
            .into_iter()
            .flatten()
            .filter(|item| !is_recall_call(item))
            .cloned(),
    );
    if let Some(add) = response.get("usage").filter(|u| u.is_object()) {
        match usage {
            Some(total) => add_usage(total, add),
            None => *usage = Some(add.clone()),
        }
    }
}

/// A response as the client gets it: `output` and `usage` of every round, the first round's
/// `id` and `created_at`, and `output_text`, where upstream wrote one, read again from the
/// messages.
fn finish(
    response: &mut Map<String, Value>,
    output: Vec<Value>,
    usage: Option<Value>,
    first: Option<(Value, Option<Value>)>,
) {
    if response.contains_key("output_text") {
        response.insert("output_text".into(), json!(output_text(&output)));
    }
    response.insert("output".into(), Value::Array(output));
    if let Some(usage) = usage {
        response.insert("usage".into(), usage);
    }
    if let Some((id, created_at)) = first {
        response.insert("id".into(), id);
        if let Some(created_at) = created_at {
            response.insert("created_at".into(), created_at);
        }
    }
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

/// A streamed response across its rounds.
#[derive(Default)]
struct ResponsesStream {
    /// The first round's response `id` and `created_at`, which every response object the
    /// client gets carries.
    first: Option<(Value, Option<Value>)>,
    /// Later rounds: their opening is dropped and their response objects take the first id.
    continued: bool,
    /// The `sequence_number` the client's next event gets: its events are numbered without
    /// gaps across the dropped ones and the rounds.
    sequence: u64,
    /// Output items the client got in earlier rounds: this round's are numbered after them.
    items_before: u64,
    /// This round's output items as upstream numbers them: recall calls (with the call as
    /// gathered so far) and the others, each in order.
    recall: Vec<(u64, RecallCall)>,
    shown: Vec<u64>,
    client_calls: bool,
    /// Client-visible output items and usage of the earlier rounds' closing events.
    output: Vec<Value>,
    usage: Option<Value>,
    /// The last closing event held, and whether its items and usage are already in
    /// `output` and `usage`.
    closing: Option<(Bytes, Value)>,
    closing_gathered: bool,
}

impl ResponsesStream {
    /// A new output item: a recall call is taken aside, any other gets the next index the
    /// client sees.
    fn added(&mut self, index: u64, item: &Value) {
        if is_recall_call(item) {
            self.recall.push((index, recall_call(item)));
        } else {
            self.client_calls |= is_client_call(item);
            self.shown.push(index);
        }
    }

    /// Gathers what a recall call's event says of it; `false` when the event is not a
    /// recall call's.
    fn recall_event(&mut self, index: u64, data: &Value) -> bool {
        let Some((_, call)) = self.recall.iter_mut().find(|(i, _)| *i == index) else {
            return false;
        };
        match data.get("type").and_then(Value::as_str) {
            Some("response.function_call_arguments.delta") => {
                call.arguments.push_str(&text(data, "delta"));
            }
            Some("response.function_call_arguments.done") => {
                call.arguments = text(data, "arguments");
            }
            Some("response.output_item.done") => {
                // The whole item: its fields win over what the earlier events gathered.
                if let Some(done) = data.get("item").map(recall_call) {
                    if !done.id.is_empty() {
                        call.id = done.id;
                    }
                    if !done.arguments.is_empty() {
                        call.arguments = done.arguments;
                    }
                }
            }
            _ => {}
        }
        true
    }

    /// The index the client sees for upstream's `index`, if the item is one it sees.
    fn shown_index(&self, index: u64) -> Option<u64> {
        let position = self.shown.iter().position(|&i| i == index)?;
        Some(self.items_before + position as u64)
    }

    /// Adds the held closing event's items and usage to the earlier rounds', once.
    fn gather_closing(&mut self) {
        if let (Some((_, data)), false) = (&self.closing, self.closing_gathered) {
            if let Some(response) = data.get("response") {
                gather(response, &mut self.output, &mut self.usage);
            }
            self.closing_gathered = true;
        }
    }

    /// The next sequence number the client sees.
    fn next_sequence(&mut self) -> u64 {
        let sequence = self.sequence;
        self.sequence += 1;
        sequence
    }
}

impl RecallStream for ResponsesStream {
    fn event(&mut self, event: &[u8]) -> Option<Bytes> {
        // Only an object is an event of the API; anything else goes by untouched.
        let Some(mut data) = event_json(event).filter(Value::is_object) else {
            return Some(Bytes::copy_from_slice(event));
        };
        let kind = data.get("type").and_then(Value::as_str).unwrap_or_default();
        if self.continued && OPENING.contains(&kind) {
            return None;
        }
        if self.first.is_none() {
            if let Some(response) = data.get("response") {
                let id = response.get("id").cloned().unwrap_or(Value::Null);
                self.first = Some((id, response.get("created_at").cloned()));
            }
        }
        if let Some(index) = data.get("output_index").and_then(Value::as_u64) {
            if kind == "response.output_item.added" {
                if let Some(item) = data.get("item") {
                    self.added(index, item);
                }
            }
            if self.recall_event(index, &data) {
                return None;
            }
        }
        if CLOSING.contains(&kind) {
            self.closing = Some((Bytes::copy_from_slice(event), data));
            self.closing_gathered = false;
            return None;
        }
        let mut changed = false;
        if let Some(index) = data.get("output_index").and_then(Value::as_u64) {
            if let Some(shown) = self.shown_index(index).filter(|&shown| shown != index) {
                data["output_index"] = json!(shown);
                changed = true;
            }
        }
        let sequence = self.next_sequence();
        if data.get("sequence_number").and_then(Value::as_u64) != Some(sequence) {
            data["sequence_number"] = json!(sequence);
            changed = true;
        }
        if let Some(response) = data.get_mut("response") {
            changed |= without_the_tool(response);
        }
        if self.continued {
            let response = data.get_mut("response").and_then(Value::as_object_mut);
            if let (Some(response), Some((id, _))) = (response, &self.first) {
                response.insert("id".into(), id.clone());
                changed = true;
            }
        }
        Some(if changed {
            rewrite_event(event, &data)
        } else {
            Bytes::copy_from_slice(event)
        })
    }

    fn round_end(&mut self) -> RoundCalls {
        RoundCalls {
            recall: self.recall.iter().map(|(_, call)| call.clone()).collect(),
            client_calls: self.client_calls,
        }
    }

    fn next_round(&mut self) {
        self.gather_closing();
        self.continued = true;
        self.items_before += self.shown.len() as u64;
        self.shown.clear();
        self.recall.clear();
        self.client_calls = false;
    }

    /// The Responses API's `error` event, numbered after the events the client got.
    fn failed(&mut self, message: &str) -> Bytes {
        let error = json!({"type": "error", "code": "server_error", "message": message,
            "param": null, "sequence_number": self.next_sequence()});
        Bytes::from(format!("event: error\ndata: {error}\n\n"))
    }

    fn close(&mut self) -> Bytes {
        self.gather_closing();
        let Some((event, mut data)) = self.closing.take() else {
            return Bytes::new();
        };
        let output = std::mem::take(&mut self.output);
        let usage = self.usage.take();
        if let Some(response) = data.get_mut("response") {
            without_the_tool(response);
        }
        if let Some(response) = data.get_mut("response").and_then(Value::as_object_mut) {
            finish(response, output, usage, self.first.clone());
        }
        if let Some(fields) = data.as_object_mut() {
            fields.insert("sequence_number".into(), json!(self.next_sequence()));
        }
        rewrite_event(&event, &data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recall_item(call_id: &str, arguments: &str) -> Value {
        json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
            "name": TOOL_NAME, "arguments": arguments, "status": "completed"})
    }

    fn message(text: &str) -> Value {
        json!({"type": "message", "id": "msg", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]})
    }

    fn call(id: &str, arguments: &str) -> RecallCall {
        RecallCall {
            id: id.into(),
            arguments: arguments.into(),
        }
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
        let round = ResponsesRecall.calls(&reply);
        assert_eq!(round.recall, [call("r1", "{\"refs\":[\"ctx:1\"]}")]);
        assert!(!round.client_calls, "upstream ran its own search");
        for client in [
            json!({"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"}),
            json!({"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": "x"}),
            json!({"type": "local_shell_call", "call_id": "c3", "action": {}}),
        ] {
            let mixed = json!({"output": [recall_item("r1", "{}"), client]});
            let round = ResponsesRecall.calls(&mixed);
            assert_eq!(round.recall, [call("r1", "{}")]);
            assert!(round.client_calls, "{client}");
        }
        let plain = ResponsesRecall.calls(&json!({"output": [message("hi")]}));
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
        ResponsesRecall.continue_with(body, &answered, false);
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
        ResponsesRecall.continue_with(body, &answered[..1], true);
        assert_eq!(body["tool_choice"], "none");
        assert_eq!(body["input"].as_array().unwrap().len(), 7);
    }

    #[test]
    fn the_merged_reply_has_no_recall_the_first_id_and_summed_usage() {
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
        assert_eq!(merged["id"], "resp_1");
        assert_eq!(merged["created_at"], 100);
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
    fn relay(stream: &mut dyn RecallStream, events: Vec<Vec<u8>>) -> Vec<Value> {
        events
            .iter()
            .filter_map(|event| stream.event(event))
            .map(|out| event_json(&out).unwrap())
            .collect()
    }

    fn field(events: &[Value], name: &str) -> Vec<Value> {
        events.iter().map(|event| event[name].clone()).collect()
    }

    #[test]
    fn a_streamed_recall_is_held_and_the_continuation_stitched_on() {
        let mut stream = ResponsesRecall.stream();
        let mut one = Upstream::new("resp_1");
        let mut events = one.opening();
        events.extend(one.text_item(0, "Looking. "));
        let arguments = ["{\"refs\":", "[\"ctx:7f3a\"]}"];
        let recall = recall_item("r1", &arguments.concat());
        for event in &events {
            let out = stream.event(event);
            assert_eq!(
                out.as_deref(),
                Some(&event[..]),
                "passed as upstream wrote it"
            );
        }
        let recall_events = one.call_item(1, &recall, &arguments);
        assert!(relay(stream.as_mut(), recall_events).is_empty());
        let closing = one.completed(json!([message("Looking. "), recall]), usage(10, 2, 0));
        assert!(stream.event(&closing).is_none(), "held");
        let round = stream.round_end();
        assert_eq!(round.recall, [call("r1", "{\"refs\":[\"ctx:7f3a\"]}")]);
        assert!(!round.client_calls);

        stream.next_round();
        let mut two = Upstream::new("resp_2");
        let mut events = two.opening();
        events.extend(two.text_item(0, "Port 23456."));
        let passed = relay(stream.as_mut(), events);
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
        assert!(stream.event(&closing).is_none());
        assert_eq!(stream.round_end(), RoundCalls::default());

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
        assert_eq!(response["id"], "resp_1");
        assert_eq!(
            response["output"],
            json!([message("Looking. "), message("Port 23456.")])
        );
        assert_eq!(response["usage"], usage(40, 5, 0));
    }

    #[test]
    fn a_mixed_round_passes_the_clients_call_and_drops_the_recall() {
        let mut stream = ResponsesRecall.stream();
        let mut one = Upstream::new("resp_1");
        let opening = relay(stream.as_mut(), one.opening());
        assert_eq!(opening.len(), 2);
        let recall = recall_item("r1", "{}");
        let recall_events = one.call_item(0, &recall, &["{}"]);
        assert!(relay(stream.as_mut(), recall_events).is_empty());
        let bash = json!({"type": "function_call", "id": "fc_c1", "call_id": "c1", "name": "bash",
            "arguments": "{\"cmd\":\"ls\"}", "status": "completed"});
        let client_events = one.call_item(1, &bash, &["{\"cmd\":", "\"ls\"}"]);
        let passed = relay(stream.as_mut(), client_events);
        assert_eq!(passed.len(), 5);
        assert!(passed.iter().all(|event| event["output_index"] == 0));
        assert_eq!(field(&passed, "sequence_number"), [2, 3, 4, 5, 6]);
        assert_eq!(passed[4]["item"], bash);
        let closing = one.completed(json!([recall, bash]), usage(10, 4, 0));
        assert!(stream.event(&closing).is_none());
        let round = stream.round_end();
        assert!(round.client_calls);
        assert_eq!(round.recall, [call("r1", "{}")]);
        let completed = event_json(&stream.close()).unwrap();
        assert_eq!(completed["response"]["output"], json!([bash]));
        assert_eq!(completed["response"]["usage"], usage(10, 4, 0));
        assert_eq!(completed["sequence_number"], 7);
    }

    #[test]
    fn data_that_is_no_event_object_goes_by_without_harm() {
        let mut stream = ResponsesRecall.stream();
        for data in ["1", "\"x\"", "[]"] {
            let event = format!("event: response.output_text.delta\ndata: {data}\n\n");
            assert_eq!(
                stream.event(event.as_bytes()).as_deref(),
                Some(event.as_bytes())
            );
        }
        // A continuation's closing event whose `response` is no object: held, then closed
        // as it came but for its number.
        stream.next_round();
        let odd = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":1}\n\n";
        assert_eq!(stream.event(odd.as_bytes()), None);
        let closed = String::from_utf8(stream.close().to_vec()).unwrap();
        assert!(closed.contains("\"response\":1"), "{closed}");
        assert!(closed.contains("\"sequence_number\":0"), "{closed}");
    }

    #[test]
    fn a_stream_that_never_closed_has_nothing_to_close() {
        let mut stream = ResponsesRecall.stream();
        let mut one = Upstream::new("resp_1");
        assert_eq!(relay(stream.as_mut(), one.opening()).len(), 2);
        assert!(stream.close().is_empty());
    }
}
