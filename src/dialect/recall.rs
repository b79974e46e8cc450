//! The reply model recall is written over, once for every dialect. A dialect decodes its
//! replies into it and encodes out of it (`RecallWire` for a whole reply and the request's
//! side, `StreamWire` for a stream's events); the rest is here: which parts of a reply are
//! recall calls, the round's own reply that a continuation carries whole (text, thinking
//! with its signature, reasoning items), a stream's rounds stitched into one (held parts,
//! indices continued, openings dropped, closings held, usage summed). The loop that serves
//! the calls is the pipeline's.

use bytes::{Bytes, BytesMut};
use serde_json::{Map, Value};

pub use crate::compaction::recall::{parameters, TOOL_DESCRIPTION, TOOL_NAME};

/// One call of the tool in upstream's reply: its id, and its arguments as their JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecallCall {
    pub id: String,
    pub arguments: String,
}

/// What a part of a reply is to recall: a call of the tool, a call of the client's own
/// tools, or content (text, thinking, reasoning) that is relayed and carried as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Content,
    Recall(RecallCall),
    ClientCall,
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

/// The recall tool, and a whole reply, in one API's wire format.
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

    /// A whole reply's parts, in order.
    fn parts(&self, reply: &Value) -> Vec<Part>;

    /// Where a whole reply says how many tokens it wrote (a JSON pointer): what carrying the
    /// round into a continuation costs its window.
    fn output_tokens(&self) -> &'static str;

    /// `request` continued: the round's own reply, every part as the model produced it (its
    /// text, its signed thinking, its reasoning items, its recall calls), then condenser's
    /// answers. On the `last` round the model is told not to call tools (`tool_choice` none),
    /// so the round limit holds and the client still gets an answer.
    fn continue_with(
        &self,
        request: &mut Map<String, Value>,
        round: &Value,
        answered: &[Answered],
        last: bool,
    );

    /// Takes out what a reply echoes of the request's tools (the Responses API writes the
    /// request's `tools` into every response object); true when it changed anything.
    fn scrub(&self, _reply: &mut Value) -> bool {
        false
    }

    /// A whole reply as the client gets it: its recall calls taken out, the content of the
    /// `earlier` rounds (already merged) in front of its own, and usage summed over them.
    fn merge(&self, earlier: Option<Value>, reply: Value) -> Value;

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
    pub id: Option<Value>,
    /// The next event's number, for APIs that number their events.
    pub sequence: u64,
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

    fn next_round(&mut self) {
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

/// One streamed reply, seen event by event across its rounds (the first upstream stream,
/// then each continuation's).
pub struct Stitched {
    wire: &'static dyn RecallWire,
    events: &'static dyn StreamWire,
    view: ClientView,
    /// This round's reply so far.
    round: Value,
    /// The earlier rounds' replies, merged.
    earlier: Option<Value>,
    /// This round's closing events: as upstream wrote them, and their data (`None` for one
    /// without JSON).
    closing: Vec<(Bytes, Option<Value>)>,
}

impl Stitched {
    pub fn new(wire: &'static dyn RecallWire) -> Stitched {
        Stitched {
            wire,
            events: wire.stream(),
            view: ClientView::default(),
            round: Value::Object(Map::new()),
            earlier: None,
            closing: Vec::new(),
        }
    }

    /// One whole SSE event of the current round (its lines and the blank line that ends
    /// it): what the client gets of it now, or `None` when it is held back or dropped.
    pub fn event(&mut self, event: &[u8]) -> Option<Bytes> {
        let Some(mut data) = event_json(event).filter(Value::is_object) else {
            if self.events.is_end(event) {
                self.closing.push((Bytes::copy_from_slice(event), None));
                return None;
            }
            return Some(Bytes::copy_from_slice(event));
        };
        self.events.gather(&mut self.round, &data);
        match self.events.kind(&data) {
            Kind::Opening if self.view.continued => None,
            Kind::Closing => {
                self.closing
                    .push((Bytes::copy_from_slice(event), Some(data)));
                None
            }
            Kind::Opening | Kind::Body => match self.events.relay(&mut data, &mut self.view) {
                Relayed::Dropped => None,
                Relayed::AsItCame => Some(Bytes::copy_from_slice(event)),
                Relayed::Changed => Some(rewrite_event(event, &data)),
            },
        }
    }

    /// The current round's stream has ended: its calls, and its reply whole.
    pub fn round_end(&mut self) -> Round {
        Round {
            calls: RoundCalls::of(self.wire.parts(&self.round)),
            reply: self.round.clone(),
        }
    }

    /// A continuation's stream follows: its opening is not repeated to the client, its
    /// indices go on after this round's, and its reply is merged after this round's. What
    /// the client has yet to get of this round's closing events, before the next round's.
    pub fn next_round(&mut self) -> Bytes {
        let round = std::mem::replace(&mut self.round, Value::Object(Map::new()));
        self.earlier = Some(self.wire.merge(self.earlier.take(), round));
        let mut out = BytesMut::new();
        for (event, data) in std::mem::take(&mut self.closing) {
            let Some(mut data) = data else {
                continue;
            };
            match self.events.unsent(&mut data, &mut self.view) {
                Relayed::Dropped => {}
                Relayed::AsItCame => out.extend_from_slice(&event),
                Relayed::Changed => out.extend_from_slice(&rewrite_event(&event, &data)),
            }
        }
        self.view.next_round();
        out.freeze()
    }

    /// No round follows: the events that close the client's stream, written from every
    /// round's reply merged (nothing of the tool in them, usage summed).
    pub fn close(&mut self) -> Bytes {
        let round = std::mem::replace(&mut self.round, Value::Object(Map::new()));
        let merged = self.wire.merge(self.earlier.take(), round);
        let closing = std::mem::take(&mut self.closing);
        let mut data: Vec<Value> = closing.iter().filter_map(|(_, d)| d.clone()).collect();
        self.events.close(&mut data, &merged, &mut self.view);
        let mut written = data.into_iter();
        let mut out = BytesMut::new();
        for (event, before) in closing {
            match before {
                Some(before) => {
                    let after = written.next().unwrap_or(Value::Null);
                    if after == before {
                        out.extend_from_slice(&event);
                    } else {
                        out.extend_from_slice(&rewrite_event(&event, &after));
                    }
                }
                None => out.extend_from_slice(&event),
            }
        }
        out.freeze()
    }

    /// The continuation could not be had: the client's stream ends with `message` as an
    /// error.
    pub fn failed(&mut self, message: &str) -> Bytes {
        self.events.failed(message, &mut self.view)
    }
}

/// Whether a tool definition or call names the recall tool, as every API names a function:
/// at `name`, or at `function.name` (chat).
pub fn names_the_tool(value: &Value) -> bool {
    let name = value
        .get("name")
        .or_else(|| value.pointer("/function/name"));
    name.and_then(Value::as_str) == Some(TOOL_NAME)
}

/// The message a client's stream ends with when its continuation failed.
pub fn continuation_failed(reason: &str) -> String {
    format!("upstream failed while condenser continued the reply: {reason}")
}

/// The JSON an SSE event carries: its `data:` lines joined, parsed. `None` for an event
/// without JSON data (a comment, `[DONE]`).
pub fn event_json(event: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(event).ok()?;
    let data: Vec<&str> = crate::transport::usage::event_data(text).collect();
    serde_json::from_str(&data.join("\n")).ok()
}

/// `event` with its data replaced by `data`: its other lines (`event:`, `id:`) as upstream
/// wrote them.
pub fn rewrite_event(event: &[u8], data: &Value) -> Bytes {
    let text = String::from_utf8_lossy(event);
    let mut out = String::with_capacity(event.len() + 16);
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with("data:"))
    {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
    Bytes::from(out)
}

/// Adds every number in `add` to the same field of `into`, nested objects included (usage
/// and its `*_details`); a field only `add` has is taken as it is.
pub fn add_usage(into: &mut Value, add: &Value) {
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

/// `earlier`'s usage (at `field`: `usage`, Gemini's `usageMetadata`) added to `reply`'s, in
/// `reply`: the usage of every round so far.
pub fn sum_usage(earlier: &Value, reply: &mut Map<String, Value>, field: &str) {
    let Some(earlier) = earlier.get(field).filter(|u| u.is_object()) else {
        return;
    };
    let mut total = earlier.clone();
    if let Some(own) = reply.get(field) {
        add_usage(&mut total, own);
    }
    reply.insert(field.into(), total);
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

/// An answer as a tool result's text, in APIs without an error flag.
pub fn answer_text(answered: &Answered) -> String {
    if answered.is_error {
        format!("Error: {}", answered.text)
    } else {
        answered.text.to_string()
    }
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
}
