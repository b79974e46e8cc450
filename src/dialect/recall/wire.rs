//! The codec one API's recall is: its tool, and its replies read and written part by part
//! (`RecallWire`), and its stream's events (`StreamWire`). Nothing here decides: the policy
//! (`RecallPolicy`) and the stitching of a stream's rounds (`Stitched`) are written
//! once over these, so a new API's recall is its two codecs and nothing else.

use bytes::Bytes;
use serde_json::{json, Map, Value};

pub use crate::compaction::recall::{parameters, TOOL_DESCRIPTION, TOOL_NAME};

/// One call of the tool in upstream's reply: its id, and its arguments as their JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecallCall {
    pub id: String,
    pub arguments: String,
}

impl RecallCall {
    /// A call whose API gives its arguments as a JSON object, not as their text: `{}` when
    /// it gives none.
    pub fn of_object(id: String, arguments: Option<&Value>) -> RecallCall {
        RecallCall {
            id,
            arguments: arguments.map_or_else(|| "{}".to_owned(), Value::to_string),
        }
    }
}

/// What a part of a reply is to recall: a call of the tool, a call of the client's own
/// tools, or content (text, thinking, reasoning) that is relayed and carried as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Content,
    Recall(RecallCall),
    ClientCall,
}

impl Part {
    /// A part as an API's predicates read it: a call of recall when `recall` is one, else a
    /// call of the client's tools when `client_call`, else content.
    pub fn of(recall: Option<RecallCall>, client_call: bool) -> Part {
        match recall {
            Some(call) => Part::Recall(call),
            None if client_call => Part::ClientCall,
            None => Part::Content,
        }
    }
}

/// What one round's reply asks: its recall calls, and whether it also calls the client's own
/// tools (then its recall calls are not served: the client's calls go back to the client).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RoundCalls {
    pub recall: Vec<RecallCall>,
    pub client_calls: bool,
}

impl RoundCalls {
    pub fn of(parts: Vec<Part>) -> RoundCalls {
        let mut round = RoundCalls::default();
        for part in parts {
            match part {
                Part::Recall(call) => round.recall.push(call),
                Part::ClientCall => round.client_calls = true,
                Part::Content => {}
            }
        }
        round
    }
}

/// One round of a reply, whole: its calls, and the reply itself (as upstream wrote it, or
/// gathered from its stream), whose parts a continuation carries.
pub struct Round {
    pub calls: RoundCalls,
    pub reply: Value,
}

/// condenser's answer to one recall call.
pub struct Answered<'a> {
    pub call: &'a RecallCall,
    pub text: &'a str,
    pub is_error: bool,
}

/// Where a reply keeps what recall's policy reads and writes beside its parts.
pub struct Fields {
    /// The reply's id: the client sees the first round's, on the merged reply and on each
    /// streamed event that repeats it. `None`: the reply keeps the last round's.
    pub id: Option<&'static str>,
    /// The usage object, summed over the rounds.
    pub usage: &'static str,
    /// How many tokens a whole reply wrote (a JSON pointer): what carrying the round into a
    /// continuation costs its window.
    pub output_tokens: &'static str,
    /// `None` for an API whose replies say how they ended only in fields recall leaves alone.
    pub stop: Option<StopReason>,
}

/// A reply's stop reason: a reply whose only calls were recall's must not tell the client to
/// run tools.
pub struct StopReason {
    /// Where it stands (a JSON pointer).
    pub at: &'static str,
    /// The reason the API gives for calling tools, which reads `ended` once no call of the
    /// client's is left. `None` for an API without one (Gemini ends a calling step as any
    /// other): then any reason of a reply that recall calls were taken out of reads `ended`.
    pub calling: Option<&'static str>,
    pub ended: &'static str,
}

/// The recall tool, and a whole reply, in one API's wire format: read and written part by
/// part. A part is what the API lists in a reply (a content block, an output item, a
/// candidate's part); the recall tool's calls are among them.
pub trait RecallWire: Sync {
    /// Whether recall can be served for this request: a continuation of it would be taken.
    fn serves(&self, _request: &Map<String, Value>) -> bool {
        true
    }

    /// The tool's definition in this API.
    fn tool(&self) -> Value;

    /// Adds the tool to a compacted request's tools, always last and once, so the tools read
    /// the same on every compacted turn.
    fn offer(&self, request: &mut Map<String, Value>) {
        let tools = request
            .entry("tools")
            .or_insert_with(|| Value::Array(Vec::new()));
        if tools.is_null() {
            *tools = Value::Array(Vec::new());
        }
        if let Some(tools) = tools.as_array_mut() {
            if !tools.iter().any(names_the_tool) {
                tools.push(self.tool());
            }
        }
    }

    /// Where its replies keep their id, usage and stop reason.
    fn fields(&self) -> &'static Fields;

    /// A whole reply's parts, in order.
    fn parts_of<'a>(&self, reply: &'a Value) -> Vec<&'a Value>;

    /// What `part` is; `index` is its place among the reply's parts (an API that gives calls
    /// no id has one made from it).
    fn part(&self, part: &Value, index: usize) -> Part;

    /// A reply's parts taken out, for `put_parts` to write back; `None` when the reply has no
    /// place for them (an error, a blocked prompt), which is then left as it is.
    fn take_parts(&self, reply: &mut Value) -> Option<Vec<Value>>;

    /// `parts` written into a reply where `take_parts` took them from.
    fn put_parts(&self, reply: &mut Value, parts: Vec<Value>);

    /// Takes the recall calls out of a reply's parts; true when there were any.
    fn take_out_recall(&self, parts: &mut Vec<Value>) -> bool {
        let before = parts.len();
        let mut index = 0;
        parts.retain(|part| {
            index += 1;
            !matches!(self.part(part, index - 1), Part::Recall(_))
        });
        parts.len() != before
    }

    /// The round's parts as a continuation of `request` carries them: as the model wrote
    /// them, unless the API wants them otherwise.
    fn carried(&self, _request: &Map<String, Value>, round: &Value) -> Vec<Value> {
        self.parts_of(round).into_iter().cloned().collect()
    }

    /// A recall call as a part, for a continuation whose round lacks it.
    fn call(&self, call: &RecallCall) -> Value;

    /// condenser's answer as a tool result; `call` is the part of the continuation it answers.
    fn result(&self, answered: &Answered, call: &Value) -> Value;

    /// Appends a continuation's two turns to the request: the model's (`said`, its parts) and
    /// the tool results.
    fn append(&self, request: &mut Map<String, Value>, said: Vec<Value>, results: Vec<Value>);

    /// Tells the model not to call tools (`tool_choice` none), for the last round: so the
    /// round limit holds and the client still gets an answer.
    fn stop_calling(&self, request: &mut Map<String, Value>);

    /// Takes out what a reply echoes of the request's tools (the Responses API writes the
    /// request's `tools` into every response object); true when it changed anything.
    fn scrub(&self, _reply: &mut Value) -> bool {
        false
    }

    /// How its streams' events read.
    fn stream(&self) -> &'static dyn StreamWire;
}

/// Where an event stands in a stream, to recall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The reply's opening: a continuation's is not repeated to the client.
    Opening,
    /// The reply's closing: held until no round follows, then written with every round's
    /// reply merged.
    Closing,
    /// Anything else: relayed, less its recall parts.
    Body,
}

/// The client's view of a streamed reply across its rounds: which of this round's parts (by
/// upstream's index) are recall calls held back, which are shown and at which index (after
/// the earlier rounds'), and what the client's events carry from the first round.
#[derive(Default)]
pub struct ClientView {
    /// A continuation's round is streaming.
    pub continued: bool,
    /// Parts the client got in earlier rounds.
    before: u64,
    shown: Vec<u64>,
    held: Vec<u64>,
    /// The first round's reply id, for APIs whose every event carries one.
    id: Option<Value>,
    /// The next event's number, for APIs that number their events.
    sequence: u64,
}

impl ClientView {
    /// A part starts at upstream's `index` (once, however often an API names it).
    pub fn start(&mut self, index: u64, recall: bool) {
        let list = if recall {
            &mut self.held
        } else {
            &mut self.shown
        };
        if !list.contains(&index) {
            list.push(index);
        }
    }

    pub fn held(&self, index: u64) -> bool {
        self.held.contains(&index)
    }

    /// The index the client sees for upstream's `index`, when the part is shown.
    pub fn shown(&self, index: u64) -> Option<u64> {
        let position = self.shown.iter().position(|&i| i == index)?;
        Some(self.before + position as u64)
    }

    pub fn next_sequence(&mut self) -> u64 {
        let sequence = self.sequence;
        self.sequence += 1;
        sequence
    }

    /// The first round's id (at `field` of an event, where the API repeats it on every
    /// event) noted, and written over a later round's own: the client's stream is one reply.
    /// Whether the event was written anew.
    pub(super) fn pin(&mut self, event: &mut Value, field: Option<&str>) -> bool {
        let Some(field) = field else {
            return false;
        };
        if self.id.is_none() {
            self.id = event.get(field).cloned();
        }
        match (self.continued, &self.id, event.as_object_mut()) {
            (true, Some(id), Some(event)) => {
                event.insert(field.into(), id.clone());
                true
            }
            _ => false,
        }
    }

    pub(super) fn next_round(&mut self) {
        self.continued = true;
        self.before += self.shown.len() as u64;
        self.shown.clear();
        self.held.clear();
    }
}

/// What relaying did to an event: it says nothing for the client, it goes as upstream wrote
/// it (byte for byte), or it was written anew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relayed {
    Dropped,
    AsItCame,
    Changed,
}

impl Relayed {
    /// `AsItCame`, or `Changed` when `changed`.
    pub fn changed_if(changed: bool) -> Relayed {
        if changed {
            Relayed::Changed
        } else {
            Relayed::AsItCame
        }
    }
}

/// How one API's stream events read and are written for the client.
pub trait StreamWire: Sync {
    fn kind(&self, data: &Value) -> Kind;

    /// Folds an event into the round's reply, so that a stream's round reads as the same
    /// whole reply upstream would have written.
    fn gather(&self, round: &mut Value, data: &Value);

    /// The event as the client gets it: recall parts taken out, the others numbered as the
    /// client sees them; what became of it.
    fn relay(&self, data: &mut Value, view: &mut ClientView) -> Relayed;

    /// A held closing event of a round that a continuation follows: what of it the client
    /// has yet to get (content an API streams in its closing event: Gemini's last parts,
    /// chat's last delta), as a body event without what closes. Most APIs close with nothing
    /// to show.
    fn unsent(&self, _closing: &mut Value, _view: &mut ClientView) -> Relayed {
        Relayed::Dropped
    }

    /// Whether a non-JSON event ends the stream (chat's `[DONE]`).
    fn is_end(&self, _event: &[u8]) -> bool {
        false
    }

    /// The held closing events, written from `merged`: every round's reply as the client
    /// gets it whole.
    fn close(&self, closing: &mut [Value], merged: &Value, view: &mut ClientView);

    /// The event that ends the client's stream with `message` as an error, in the API's own
    /// stream format, so that a reply whose only content was held back never ends as an
    /// empty success.
    fn failed(&self, message: &str, view: &mut ClientView) -> Bytes;
}

/// Whether a tool definition or call names the recall tool, as every API names a function:
/// at `name`, or at `function.name` (chat).
pub fn names_the_tool(value: &Value) -> bool {
    let name = value
        .get("name")
        .or_else(|| value.pointer("/function/name"));
    name.and_then(Value::as_str) == Some(TOOL_NAME)
}

/// How far past the parts gathered so far a stream may number a new one: a part numbered
/// further is not gathered, so that no index upstream writes sizes condenser's memory.
const MAX_INDEX_GAP: usize = 64;

/// The place of a streamed part in its round's list, by the index its stream gave it, the
/// list grown to hold it; `None` for an index far past the parts gathered so far.
pub fn slot(list: &mut Vec<Value>, index: usize) -> Option<&mut Value> {
    if index > list.len() + MAX_INDEX_GAP {
        return None;
    }
    if list.len() <= index {
        list.resize(index + 1, Value::Null);
    }
    list.get_mut(index)
}

/// Appends `text` to the string at `field` of `object` (made one when absent).
pub fn append_text(object: &mut Map<String, Value>, field: &str, text: &str) {
    match object.get_mut(field) {
        Some(Value::String(own)) => own.push_str(text),
        _ => {
            object.insert(field.into(), Value::String(text.into()));
        }
    }
}

/// The string at `field` of `value`, empty when there is none.
pub fn text_of(value: &Value, field: &str) -> String {
    match value.get(field) {
        Some(Value::String(text)) => text.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => other.to_string(),
    }
}

/// condenser's answer as the tool result of an API without an error flag, so an error's text
/// says it is one: an object that `tag` (a field and its value) names a result, the call's
/// id at `id_field` and the text at `text_field`.
pub fn unflagged_result(
    answered: &Answered,
    tag: (&str, &str),
    id_field: &str,
    text_field: &str,
) -> Value {
    let text = if answered.is_error {
        format!("Error: {}", answered.text)
    } else {
        answered.text.to_string()
    };
    json!({tag.0: tag.1, id_field: answered.call.id, text_field: text})
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_part_is_gathered_at_its_index_but_never_one_numbered_far_past_the_rest() {
        let mut list = vec![json!("a")];
        assert!(slot(&mut list, 2).is_some());
        assert_eq!(list, [json!("a"), Value::Null, Value::Null]);
        assert!(slot(&mut list, 1_000_000_000_000).is_none());
        assert!(slot(&mut list, 3 + MAX_INDEX_GAP + 1).is_none());
        assert_eq!(list.len(), 3);
    }

    #[test]
    fn a_tool_is_named_as_every_api_writes_it() {
        for tool in [
            json!({"name": TOOL_NAME}),
            json!({"type": "function", "function": {"name": TOOL_NAME}}),
        ] {
            assert!(names_the_tool(&tool), "{tool}");
        }
        assert!(!names_the_tool(&json!({"name": "bash"})));
        assert!(!names_the_tool(
            &json!({"type": "function", "function": {"name": "bash"}})
        ));
    }

    #[test]
    fn a_recall_call_outranks_the_client_call_it_also_is() {
        let call = RecallCall::of_object("c1".into(), Some(&json!({"ref": "ctx:a.1"})));
        assert_eq!(call.arguments, r#"{"ref":"ctx:a.1"}"#);
        assert_eq!(Part::of(Some(call.clone()), true), Part::Recall(call));
        assert_eq!(Part::of(None, true), Part::ClientCall);
        assert_eq!(Part::of(None, false), Part::Content);
        assert_eq!(RecallCall::of_object("c2".into(), None).arguments, "{}");
    }

    #[test]
    fn an_unflagged_result_says_an_error_in_its_text_its_fields_in_order() {
        let call = RecallCall {
            id: "call_1".into(),
            arguments: "{}".into(),
        };
        let answered = |is_error| Answered {
            call: &call,
            text: "not found",
            is_error,
        };
        let result = |is_error| {
            unflagged_result(
                &answered(is_error),
                ("role", "tool"),
                "tool_call_id",
                "content",
            )
            .to_string()
        };
        assert_eq!(
            result(false),
            r#"{"role":"tool","tool_call_id":"call_1","content":"not found"}"#
        );
        assert_eq!(
            result(true),
            r#"{"role":"tool","tool_call_id":"call_1","content":"Error: not found"}"#
        );
    }
}
