//! Server-sent events out of a body as it arrives, each as upstream wrote it: the one reader of
//! every stream condenser looks into (the usage tap, recall's stream, the key scrub).
//!
//! Linear: each byte is scanned for an event's end once, however the event is chunked (a
//! scan resumes where the last one stopped, less the three bytes a split terminator may have
//! begun in). Bounded: an event that grows past `EventBound::max_bytes` before it ends is
//! relayed as it arrives, uninspected, and counted; memory stays at the bound for an event
//! that never ends.
//!
//! Hand-written rather than an SSE codec crate's: `eventsource-stream`, the well-kept one,
//! yields parsed events (`data` joined into a `String`, comments dropped), and condenser
//! relays each event's bytes as upstream sent them; writing events out again from their
//! fields would change what the client receives.

use bytes::{Bytes, BytesMut};
use prometheus::IntCounter;

/// The longest terminator, `\r\n\r\n`, less one: how far back a scan resumes.
const SPLIT_TERMINATOR: usize = 3;

/// The most an event may hold before it is relayed uninspected, and the count of those
/// (`condenser_uninspected_events_total`; none for the summarizer's own connections' tests).
#[derive(Clone)]
pub struct EventBound {
    pub max_bytes: usize,
    pub uninspected: Option<IntCounter>,
}

/// What the reader hands on.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// One whole event, its terminator included.
    Event(Bytes),
    /// Bytes of an event over the bound, to relay untouched.
    Uninspected(Bytes),
}

pub struct EventReader {
    pending: BytesMut,
    /// `pending[..scanned]` holds no terminator's start.
    scanned: usize,
    /// Within an event over the bound: its bytes pass uninspected until its end.
    over_bound: bool,
    bound: EventBound,
}

/// Where the first event of `buf` ends, terminator included, looking from `from` on: the
/// earliest end of `\n\n`, `\r\n\r\n` or `\r\r` (an earlier start always ends earlier here).
fn event_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(found) = buf
        .get(at..)
        .and_then(|rest| memchr::memchr2(b'\n', b'\r', rest))
    {
        let i = at + found;
        match &buf[i..] {
            [b'\n', b'\n', ..] | [b'\r', b'\r', ..] => return Some(i + 2),
            [b'\r', b'\n', b'\r', b'\n', ..] => return Some(i + 4),
            _ => at = i + 1,
        }
    }
    None
}

impl EventReader {
    pub fn new(bound: EventBound) -> EventReader {
        EventReader {
            pending: BytesMut::new(),
            scanned: 0,
            over_bound: false,
            bound,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.pending.extend_from_slice(chunk);
    }

    /// The next whole event, or the next bytes of one over the bound; `None` until more
    /// arrives.
    pub fn next_piece(&mut self) -> Option<Piece> {
        if let Some(end) = event_end(&self.pending, self.scanned) {
            self.scanned = 0;
            if end > self.bound.max_bytes {
                self.outgrown();
            }
            let bytes = self.pending.split_to(end).freeze();
            return Some(if std::mem::take(&mut self.over_bound) {
                Piece::Uninspected(bytes)
            } else {
                Piece::Event(bytes)
            });
        }
        let kept = SPLIT_TERMINATOR.min(self.pending.len());
        self.scanned = self.pending.len() - kept;
        if self.pending.len() > self.bound.max_bytes {
            self.outgrown();
        }
        if self.over_bound && self.scanned > 0 {
            let bytes = self.pending.split_to(self.scanned).freeze();
            self.scanned = 0;
            return Some(Piece::Uninspected(bytes));
        }
        None
    }

    /// The event read is over the bound: counted once, and passed uninspected.
    fn outgrown(&mut self) {
        if self.over_bound {
            return;
        }
        self.over_bound = true;
        if let Some(counter) = &self.bound.uninspected {
            counter.inc();
        }
        tracing::warn!(
            max_event_bytes = self.bound.max_bytes,
            "a stream event outgrew the bound; relayed uninspected"
        );
    }

    /// At the end of the stream: what is left, an unterminated last event (or the rest of
    /// one over the bound).
    pub fn rest(&mut self) -> Option<Piece> {
        self.scanned = 0;
        if self.pending.is_empty() {
            return None;
        }
        let bytes = self.pending.split().freeze();
        Some(if std::mem::take(&mut self.over_bound) {
            Piece::Uninspected(bytes)
        } else {
            Piece::Event(bytes)
        })
    }
}

#[cfg(test)]
pub fn test_bound(max_bytes: usize) -> EventBound {
    EventBound {
        max_bytes,
        uninspected: IntCounter::new("uninspected", "test").ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every piece of `stream` fed in chunks of `size`.
    fn pieces(stream: &[u8], size: usize, max_bytes: usize) -> (Vec<Piece>, u64) {
        let bound = test_bound(max_bytes);
        let mut reader = EventReader::new(bound.clone());
        let mut out = Vec::new();
        for chunk in stream.chunks(size) {
            reader.push(chunk);
            while let Some(piece) = reader.next_piece() {
                out.push(piece);
            }
        }
        out.extend(reader.rest());
        (out, bound.uninspected.as_ref().map_or(0, IntCounter::get))
    }

    fn event(text: &str) -> Piece {
        Piece::Event(Bytes::copy_from_slice(text.as_bytes()))
    }

    #[test]
    fn events_end_at_any_terminator_however_the_stream_is_chunked() {
        let stream = "data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d\r\n\ndata: tail";
        for size in 1..stream.len() {
            let (got, uninspected) = pieces(stream.as_bytes(), size, 1024);
            assert_eq!(
                got,
                [
                    event("data: a\n\n"),
                    event("data: b\r\n\r\n"),
                    event("data: c\r\r"),
                    event("data: d\r\n\n"),
                    event("data: tail"),
                ],
                "chunks of {size}"
            );
            assert_eq!(uninspected, 0);
        }
    }

    #[test]
    fn an_event_over_the_bound_passes_whole_and_uninspected_and_the_next_is_read_again() {
        let big = format!("data: {}\r\n\r\n", "x".repeat(100));
        let stream = format!("data: a\n\n{big}data: b\n\n");
        for size in [1, 7, 16, 64, 200] {
            let (got, uninspected) = pieces(stream.as_bytes(), size, 32);
            assert_eq!(uninspected, 1, "chunks of {size}");
            assert_eq!(got.first(), Some(&event("data: a\n\n")));
            assert_eq!(got.last(), Some(&event("data: b\n\n")));
            let passed: Vec<u8> = got[1..got.len() - 1]
                .iter()
                .flat_map(|piece| match piece {
                    Piece::Uninspected(bytes) => bytes.to_vec(),
                    Piece::Event(_) => panic!("{piece:?} inspected"),
                })
                .collect();
            assert_eq!(passed, big.as_bytes(), "chunks of {size}");
        }
    }

    #[test]
    fn an_event_that_never_ends_holds_no_more_than_the_bound() {
        let bound = test_bound(1024);
        let mut reader = EventReader::new(bound.clone());
        let mut relayed = 0;
        for _ in 0..10_000 {
            reader.push(&[b'x'; 1000]);
            while let Some(Piece::Uninspected(bytes)) = reader.next_piece() {
                relayed += bytes.len();
            }
            assert!(reader.pending.len() <= 1024 + 1000);
        }
        assert_eq!(relayed + reader.pending.len(), 10_000_000);
        assert_eq!(bound.uninspected.as_ref().map_or(0, IntCounter::get), 1);
    }
}
