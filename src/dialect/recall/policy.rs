//! Recall's policy, written once over any API's codec (`RecallWire`): which parts of a reply
//! are recall calls, the continuation that carries the round's own reply (every part as the
//! model produced it) then condenser's answers, and the one reply the client gets from every
//! round's: recall taken out, the earlier rounds' content in front, the stop reason no longer
//! asking for tools, usage summed, the first round's id.

use serde_json::{Map, Value};

use super::wire::{Answered, Part, RecallWire};

/// What recall does with a reply, the same in every API: each method reads and writes the
/// reply only through the codec. Implemented for every codec and only here, so no API keeps
/// a policy of its own.
pub trait RecallPolicy: RecallWire {
    /// A whole reply's parts, in order, as recall reads them.
    fn parts(&self, reply: &Value) -> Vec<Part> {
        let parts = self.parts_of(reply).into_iter().enumerate();
        parts.map(|(index, part)| self.part(part, index)).collect()
    }

    /// `request` continued: the round's own reply, every part as the model produced it (its
    /// text, its signed thinking, its reasoning items, its recall calls; a call it lacks is
    /// made), then condenser's answers. On the `last` round the model is told not to call
    /// tools, so the round limit holds and the client still gets an answer.
    fn continue_with(
        &self,
        request: &mut Map<String, Value>,
        round: &Value,
        answered: &[Answered],
        last: bool,
    ) {
        let mut said = self.carried(request, round);
        let mut results = Vec::with_capacity(answered.len());
        for answer in answered {
            let answers = |(index, part)| match self.part(part, index) {
                Part::Recall(call) => call.id == answer.call.id,
                _ => false,
            };
            let at = match said.iter().enumerate().position(answers) {
                Some(at) => at,
                None => {
                    said.push(self.call(answer.call));
                    said.len() - 1
                }
            };
            results.push(self.result(answer, &said[at]));
        }
        self.append(request, said, results);
        if last {
            self.stop_calling(request);
        }
    }

    /// A whole reply as the client gets it: its recall calls taken out, the parts of the
    /// `earlier` rounds (already merged) in front of its own, its stop reason no longer
    /// asking for tools when none of the client's are called, usage summed and the first
    /// round's id (where the API keeps one).
    fn merge(&self, earlier: Option<Value>, mut reply: Value) -> Value {
        self.scrub(&mut reply);
        let Some(mut own) = self.take_parts(&mut reply) else {
            return reply;
        };
        let took = self.take_out_recall(&mut own);
        let client_calls = own
            .iter()
            .enumerate()
            .any(|(index, part)| self.part(part, index) == Part::ClientCall);
        let mut earlier = earlier;
        let mut parts = earlier
            .as_mut()
            .and_then(|earlier| self.take_parts(earlier))
            .unwrap_or_default();
        parts.extend(own);
        self.put_parts(&mut reply, parts);
        let fields = self.fields();
        if let (Some(stop), false) = (&fields.stop, client_calls) {
            let ended = match stop.calling {
                Some(calling) => reply.pointer(stop.at).and_then(Value::as_str) == Some(calling),
                None => took,
            };
            if ended {
                set(&mut reply, stop.at, Value::from(stop.ended));
            }
        }
        if let (Some(earlier), Some(object)) = (earlier, reply.as_object_mut()) {
            sum_usage(&earlier, object, fields.usage);
            if let Some(id) = fields
                .id
                .and_then(|field| Some((field, earlier.get(field)?)))
            {
                object.insert(id.0.into(), id.1.clone());
            }
        }
        reply
    }
}

impl<W: RecallWire + ?Sized> RecallPolicy for W {}

/// `value` at `pointer` set, the last field made when its object lacks it.
fn set(value: &mut Value, pointer: &str, to: Value) {
    let Some((parent, field)) = pointer.rsplit_once('/') else {
        return;
    };
    if let Some(object) = value.pointer_mut(parent).and_then(Value::as_object_mut) {
        object.insert(field.into(), to);
    }
}

/// Adds every number in `add` to the same field of `into`, nested objects included (usage
/// and its `*_details`); a field only `add` has is taken as it is.
fn add_usage(into: &mut Value, add: &Value) {
    let (Some(into), Some(add)) = (into.as_object_mut(), add.as_object()) else {
        return;
    };
    for (key, value) in add {
        match (into.get_mut(key), value) {
            (Some(Value::Number(a)), Value::Number(b)) => {
                if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
                    *a = (x + y).into();
                }
            }
            (Some(existing @ Value::Object(_)), Value::Object(_)) => add_usage(existing, value),
            (None, _) => {
                into.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
}

/// `earlier`'s usage (at `field`) added to `reply`'s, in `reply`: the usage of every round so
/// far.
fn sum_usage(earlier: &Value, reply: &mut Map<String, Value>, field: &str) {
    let Some(earlier) = earlier.get(field).filter(|u| u.is_object()) else {
        return;
    };
    let mut total = earlier.clone();
    if let Some(own) = reply.get(field) {
        add_usage(&mut total, own);
    }
    reply.insert(field.into(), total);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::dialect::chat::recall::ChatRecall;
    use crate::dialect::gemini::recall::GeminiRecall;
    use crate::dialect::messages::recall::MessagesRecall;
    use crate::dialect::recall::wire::{RecallCall, TOOL_NAME};
    use crate::dialect::responses::recall::ResponsesRecall;

    /// Two rounds of one reply in an API: the first says something and calls recall (its
    /// stop reason asking for tools), the second answers; their usage says 2 and 3 tokens
    /// written. With the number of content parts the merged reply holds.
    fn two_rounds() -> [(&'static dyn RecallWire, Value, Value, usize); 3] {
        [
            (
                &ChatRecall,
                json!({"id": "first", "choices": [{"message": {"content": "Looking. ",
                    "tool_calls": [{"id": "r1", "type": "function",
                        "function": {"name": TOOL_NAME, "arguments": "{}"}}]},
                    "finish_reason": "tool_calls"}],
                    "usage": {"completion_tokens": 2}}),
                json!({"id": "second", "choices": [{"message": {"content": "Port 23456."},
                    "finish_reason": "tool_calls"}], "usage": {"completion_tokens": 3}}),
                // Chat's text is one string: the rounds' joined.
                1,
            ),
            (
                &MessagesRecall,
                json!({"id": "first", "content": [{"type": "text", "text": "Looking. "},
                    {"type": "tool_use", "id": "r1", "name": TOOL_NAME, "input": {}}],
                    "stop_reason": "tool_use", "usage": {"output_tokens": 2}}),
                json!({"id": "second", "content": [{"type": "text", "text": "Port 23456."}],
                    "stop_reason": "tool_use", "usage": {"output_tokens": 3}}),
                2,
            ),
            (
                &GeminiRecall,
                json!({"responseId": "first", "candidates": [{"content": {"role": "model",
                    "parts": [{"text": "Looking. "}, {"functionCall": {"name": TOOL_NAME}}]},
                    "finishReason": "MALFORMED_FUNCTION_CALL"}],
                    "usageMetadata": {"candidatesTokenCount": 2}}),
                // Recall called again past the last round: taken out all the same.
                json!({"responseId": "second", "candidates": [{"content": {"role": "model",
                    "parts": [{"text": "Port 23456."}, {"functionCall": {"name": TOOL_NAME}}]},
                    "finishReason": "MALFORMED_FUNCTION_CALL"}],
                    "usageMetadata": {"candidatesTokenCount": 3}}),
                2,
            ),
        ]
    }

    #[test]
    fn a_merged_reply_has_no_recall_ends_as_an_answer_keeps_the_first_id_and_sums_usage() {
        for (wire, first, second, content) in two_rounds() {
            let merged = wire.merge(Some(wire.merge(None, first)), second);
            let parts = wire.parts(&merged);
            assert_eq!(parts, vec![Part::Content; content], "{merged}");
            let fields = wire.fields();
            let stop = fields.stop.as_ref().expect("these APIs name a stop reason");
            assert_eq!(
                merged.pointer(stop.at),
                Some(&json!(stop.ended)),
                "{merged}"
            );
            assert_eq!(merged[fields.id.unwrap_or_default()], "first", "{merged}");
            assert_eq!(merged.pointer(fields.output_tokens), Some(&json!(5)));
            assert!(!merged.to_string().contains(TOOL_NAME), "{merged}");
        }
    }

    /// The client's own call goes back to the client: its reply still asks for tools.
    #[test]
    fn a_reply_that_calls_the_clients_tools_keeps_its_stop_reason() {
        let cases: [(&dyn RecallWire, Value); 2] = [
            (
                &ChatRecall,
                json!({"choices": [{"message": {"tool_calls": [
                    {"id": "r1", "type": "function", "function": {"name": TOOL_NAME}},
                    {"id": "c1", "type": "function", "function": {"name": "bash"}}]},
                    "finish_reason": "tool_calls"}]}),
            ),
            (
                &MessagesRecall,
                json!({"content": [{"type": "tool_use", "id": "r1", "name": TOOL_NAME},
                    {"type": "tool_use", "id": "c1", "name": "bash"}],
                    "stop_reason": "tool_use"}),
            ),
        ];
        for (wire, reply) in cases {
            let merged = wire.merge(None, reply);
            assert_eq!(wire.parts(&merged), [Part::ClientCall], "{merged}");
            let stop = wire.fields().stop.as_ref().expect("a stop reason");
            assert_eq!(merged.pointer(stop.at), Some(&json!(stop.calling)));
        }
    }

    /// An API, a request in it, a round that carries one of its recall calls and lacks the
    /// other, and where the continuation's model turn stands in the request.
    type Continued = (&'static dyn RecallWire, Value, Value, fn(&Value) -> Value);

    fn continued() -> [Continued; 3] {
        [
            (
                &MessagesRecall,
                json!({"messages": [{"role": "user", "content": "?"}]}),
                json!({"content": [{"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "r1", "name": TOOL_NAME, "input": {}}]}),
                |request| request["messages"][1]["content"].clone(),
            ),
            (
                &ResponsesRecall,
                json!({"input": "?"}),
                json!({"output": [{"type": "reasoning", "id": "rs_1", "summary": []},
                    {"type": "function_call", "call_id": "r1", "name": TOOL_NAME,
                        "arguments": "{}"}]}),
                // The user's message, then the model's items; the answers after them.
                |request| json!(request["input"].as_array().unwrap()[1..4]),
            ),
            (
                &GeminiRecall,
                json!({"contents": [{"role": "user", "parts": [{"text": "?"}]}]}),
                json!({"candidates": [{"content": {"parts": [{"text": "Looking."},
                    {"functionCall": {"name": TOOL_NAME, "id": "r1", "args": {}}}]}}]}),
                |request| request["contents"][1]["parts"].clone(),
            ),
        ]
    }

    #[test]
    fn a_continuation_carries_the_round_makes_the_call_it_lacks_and_stops_tools_when_last() {
        let (r1, r2) = (
            RecallCall {
                id: "r1".into(),
                arguments: "{}".into(),
            },
            RecallCall {
                id: "r2".into(),
                arguments: "{\"query\":\"port\"}".into(),
            },
        );
        let answered = [
            Answered {
                call: &r1,
                text: "port 23456",
                is_error: false,
            },
            Answered {
                call: &r2,
                text: "nothing found",
                is_error: true,
            },
        ];
        for (wire, request, round, model_turn) in continued() {
            let Value::Object(mut going_on) = request else {
                panic!("a request is an object");
            };
            let mut last = going_on.clone();
            wire.continue_with(&mut going_on, &round, &answered, false);
            let said = model_turn(&Value::Object(going_on.clone()));
            // By their arguments: Gemini gives a call it made no id but its place.
            let said: Vec<Option<String>> = said
                .as_array()
                .expect("a model turn")
                .iter()
                .enumerate()
                .map(|(index, part)| match wire.part(part, index) {
                    Part::Recall(call) => Some(call.arguments),
                    _ => None,
                })
                .collect();
            let arguments = |call: &RecallCall| Some(call.arguments.clone());
            assert_eq!(said, [None, arguments(&r1), arguments(&r2)], "{going_on:?}");
            let text = Value::Object(going_on.clone()).to_string();
            let (found, missing) = (text.find("port 23456"), text.find("nothing found"));
            assert!(found.is_some() && found < missing, "{text}");
            wire.continue_with(&mut last, &round, &answered, true);
            assert_ne!(last, going_on, "the last round tells the model not to call");
        }
    }
}
