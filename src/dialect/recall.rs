//! Recall in every dialect, written once: the reply model and the codec an API's recall is
//! (`wire`: a reply read and written part by part, and its stream's events), the policy over
//! it (`policy`: which parts of a reply are recall calls, the continuation that carries the
//! round's own reply whole (text, thinking with its signature, reasoning items), the client's
//! one reply merged from every round's), and here a stream's rounds stitched into one (held
//! parts, indices continued, openings dropped, closings held, the first round's id kept,
//! usage summed). The loop that serves the calls is the pipeline's.

mod policy;
mod wire;

use bytes::{Bytes, BytesMut};
use serde_json::{Map, Value};

use crate::transport::events;

pub use policy::RecallPolicy;
pub use wire::{
    append_text, names_the_tool, parameters, slot, text_of, unflagged_result, Answered, ClientView,
    Fields, Kind, Part, RecallCall, RecallWire, Relayed, Round, RoundCalls, StopReason, StreamWire,
    TOOL_DESCRIPTION, TOOL_NAME,
};

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
    pub fn event(&mut self, event: Bytes) -> Option<Bytes> {
        let Some(mut data) = event_json(&event).filter(Value::is_object) else {
            if self.events.is_end(&event) {
                self.closing.push((event, None));
                return None;
            }
            return Some(event);
        };
        self.events.gather(&mut self.round, &data);
        match self.events.kind(&data) {
            Kind::Opening if self.view.continued => None,
            Kind::Closing => {
                self.closing.push((event, Some(data)));
                None
            }
            Kind::Opening | Kind::Body => {
                let pinned = self.pin(&mut data);
                match self.events.relay(&mut data, &mut self.view) {
                    Relayed::Dropped => None,
                    Relayed::AsItCame if !pinned => Some(event),
                    Relayed::AsItCame | Relayed::Changed => Some(rewrite_event(&event, &data)),
                }
            }
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
            let pinned = self.pin(&mut data);
            match self.events.unsent(&mut data, &mut self.view) {
                Relayed::Dropped => {}
                Relayed::AsItCame if !pinned => out.extend_from_slice(&event),
                Relayed::AsItCame | Relayed::Changed => {
                    out.extend_from_slice(&rewrite_event(&event, &data));
                }
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
        for event in &mut data {
            self.pin(event);
        }
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

    /// The first round's id on `event`, where the API repeats it on every event; whether
    /// the event was written anew.
    fn pin(&mut self, event: &mut Value) -> bool {
        self.view.pin(event, self.wire.fields().id)
    }

    /// The continuation could not be had: the client's stream ends with `message` as an
    /// error.
    pub fn failed(&mut self, message: &str) -> Bytes {
        self.events.failed(message, &mut self.view)
    }
}

/// The message a client's stream ends with when its continuation failed.
pub fn continuation_failed(reason: &str) -> String {
    format!("upstream failed while condenser continued the reply: {reason}")
}

/// The JSON an SSE event carries: its `data:` lines joined as the spec joins them, parsed.
/// `None` for an event without JSON data (a comment, `[DONE]`).
pub fn event_json(event: &[u8]) -> Option<Value> {
    serde_json::from_slice(&events::data(event)?).ok()
}

/// `event` with its data replaced by `data`: its other fields (`event:`, `id:`) and comments
/// as upstream wrote them, each line ended by LF.
pub fn rewrite_event(event: &[u8], data: &Value) -> Bytes {
    let mut out = Vec::with_capacity(event.len() + 16);
    for line in events::lines(event).filter(|line| {
        !line.is_empty() && events::field(line).is_none_or(|(name, _)| name != b"data")
    }) {
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    // Writing a Value into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut out, data);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// What the dialects' recall tests build their cases from.
#[cfg(test)]
pub mod testing {
    use serde_json::{Map, Value};

    use crate::dialect::recall::RecallCall;

    pub fn call(id: &str, arguments: &str) -> RecallCall {
        RecallCall {
            id: id.into(),
            arguments: arguments.into(),
        }
    }

    pub fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(object) => object,
            other => panic!("not an object: {other}"),
        }
    }
}
