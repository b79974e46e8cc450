//! The recall tool as a dialect writes it: offered on a compacted request, its calls found in
//! upstream's reply (whole or streamed), the request continued with condenser's answers, and
//! the reply the client gets with no trace of the tool. Each dialect implements `RecallWire`
//! in its folder (`recall.rs`); the loop that serves the calls is the pipeline's.

use bytes::Bytes;
use serde_json::{Map, Value};

pub use crate::compaction::recall::{parameters, TOOL_DESCRIPTION, TOOL_NAME};

/// One call of the tool in upstream's reply: its id, and its arguments as their JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecallCall {
    pub id: String,
    pub arguments: String,
}

/// What one round's reply asks: its recall calls, and whether it also calls the client's own
/// tools (then its recall calls are not served: the client's calls go back to the client).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RoundCalls {
    pub recall: Vec<RecallCall>,
    pub client_calls: bool,
}

/// condenser's answer to one recall call.
pub struct Answered<'a> {
    pub call: &'a RecallCall,
    pub text: &'a str,
    pub is_error: bool,
}

/// The recall tool in one API's wire format.
pub trait RecallWire: Sync {
    /// Whether recall can be served for this request: a continuation of it would be taken.
    fn serves(&self, _request: &Map<String, Value>) -> bool {
        true
    }

    /// Adds the tool to a compacted request's tools, always last, so the tools read the same
    /// on every compacted turn.
    fn offer(&self, request: &mut Map<String, Value>);

    /// The recall calls in a whole (not streamed) reply.
    fn calls(&self, reply: &Value) -> RoundCalls;

    /// `request` continued: the assistant turn that made `answered`'s calls, then their
    /// answers. On the `last` round the model is told not to call tools (`tool_choice`
    /// none), so the round limit holds and the client still gets an answer.
    fn continue_with(&self, request: &mut Map<String, Value>, answered: &[Answered], last: bool);

    /// Takes out what a reply echoes of the request's tools (the Responses API writes the
    /// request's `tools` into every response object); true when it changed anything.
    fn scrub(&self, _reply: &mut Value) -> bool {
        false
    }

    /// A whole reply as the client gets it: its recall calls taken out, the content of the
    /// `earlier` rounds (already merged) in front of its own, and usage summed over them.
    fn merge(&self, earlier: Option<Value>, reply: Value) -> Value;

    /// The state of one streamed reply, across its rounds.
    fn stream(&self) -> Box<dyn RecallStream>;
}

/// One streamed reply, seen event by event across its rounds (the first upstream stream,
/// then each continuation's).
pub trait RecallStream: Send {
    /// One whole SSE event of the current round (its lines and the blank line that ends
    /// it): what the client gets of it now, rewritten when it must be (indices continued
    /// after the earlier rounds'), or `None` when it is held back or dropped: every event of
    /// a recall call, a continuation's opening events, and the closing events (kept to
    /// close the stream once no round follows, with usage summed).
    fn event(&mut self, event: &[u8]) -> Option<Bytes>;

    /// The current round's stream has ended: the recall calls it made, whole, and whether
    /// it also called the client's tools.
    fn round_end(&mut self) -> RoundCalls;

    /// A continuation's stream follows: its opening is not repeated to the client, its
    /// indices go on after this round's, and its usage is added to this round's.
    fn next_round(&mut self);

    /// No round follows: the events that close the client's stream (the held closing
    /// events, usage summed over every round, nothing of the tool in them).
    fn close(&mut self) -> Bytes;

    /// The continuation could not be had: the event that ends the client's stream with
    /// `message` as an error, in the API's own stream format, so that a reply whose only
    /// content was held back never ends as an empty success.
    fn failed(&mut self, message: &str) -> Bytes;
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

/// An answer as a tool result's text, in APIs without an error flag.
pub fn answer_text(answered: &Answered) -> String {
    if answered.is_error {
        format!("Error: {}", answered.text)
    } else {
        answered.text.to_string()
    }
}
