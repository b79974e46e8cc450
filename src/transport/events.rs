//! Server-sent events out of a body as it arrives, each as upstream wrote it: the one reader of
//! every stream condenser looks into (the usage tap, recall's stream), and the one reading of
//! an event's fields (`lines`, `field`, `data`).
//!
//! Read as the SSE spec reads a stream (WHATWG HTML §9.2.6): a line ends at CRLF, LF or a
//! bare CR, and an event at a blank line, whatever mix of those ends it; its `data` fields'
//! values are joined by LF. A client's parser reads events so, so condenser reads them so too:
//! an event it split or joined differently would be one it read and the client did not.
//!
//! Linear: each byte is scanned for an event's end once, however the event is chunked (a
//! scan resumes at the line end it could not yet settle). Bounded: an event that grows past
//! `EventBound::max_bytes` before it ends is relayed as it arrives, uninspected, and counted;
//! memory stays at the bound for an event that never ends. One copy: a chunk that holds whole
//! events hands them on as slices of itself, so a reader behind another reader (the usage tap
//! behind recall's stream, which hands on whole events) holds nothing of its own, and its
//! buffer grows by doubling only up to the bound.
//!
//! Hand-written rather than an SSE codec crate's: `eventsource-stream`, the well-kept one,
//! yields parsed events (`data` joined into a `String`, comments dropped), and condenser
//! relays each event's bytes as upstream sent them; writing events out again from their
//! fields would change what the client receives.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use prometheus::IntCounter;

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
    pending: Pending,
    /// Where a scan of `pending` resumes: no event ends before a line end from here on.
    scanned: usize,
    /// Within an event over the bound: its bytes pass uninspected until its end.
    over_bound: bool,
    bound: EventBound,
}

/// The bytes read and not yet handed on: a chunk as it came, while nothing was left before it
/// (the events it holds are handed on as slices of it), else the chunks joined.
enum Pending {
    One(Bytes),
    Joined(BytesMut),
}

impl Pending {
    fn bytes(&self) -> &[u8] {
        match self {
            Pending::One(bytes) => bytes,
            Pending::Joined(joined) => joined,
        }
    }

    /// `chunk` after what is pending. A joined buffer grows by doubling, but not past
    /// `bound` unless one chunk takes it there: what a reader holds stays near its bound.
    fn push(&mut self, chunk: Bytes, bound: usize) {
        match self {
            _ if chunk.is_empty() => {}
            Pending::One(first) if first.is_empty() => *first = chunk,
            Pending::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + chunk.len());
                joined.extend_from_slice(first);
                joined.extend_from_slice(&chunk);
                *self = Pending::Joined(joined);
            }
            Pending::Joined(joined) => {
                let needed = joined.len() + chunk.len();
                if needed > joined.capacity() {
                    let capacity = needed.max((joined.capacity() * 2).min(bound));
                    let mut grown = BytesMut::with_capacity(capacity);
                    grown.extend_from_slice(joined);
                    *joined = grown;
                }
                joined.extend_from_slice(&chunk);
            }
        }
    }

    /// The first `at` bytes, handed on without a copy.
    fn split_to(&mut self, at: usize) -> Bytes {
        match self {
            Pending::One(bytes) => bytes.split_to(at),
            Pending::Joined(joined) => {
                let bytes = joined.split_to(at).freeze();
                // Emptied, it takes the next chunk as it comes.
                if joined.is_empty() {
                    *self = Pending::One(Bytes::new());
                }
                bytes
            }
        }
    }

    fn take(&mut self) -> Bytes {
        let len = self.bytes().len();
        self.split_to(len)
    }
}

/// Where the first event of `buf` ends, blank line included, looking from `from` (the start
/// of a line end, or of a line): `Ok` with its end, or `Err` with where to look again once
/// more has come (a line end that what follows may make a blank line, or the end of `buf`).
/// A CR that ends `buf` may be the first half of a CRLF, so it settles nothing yet: an event
/// is cut in the same place however its stream is chunked.
fn event_end(buf: &[u8], from: usize) -> Result<usize, usize> {
    let mut at = from;
    while let Some(found) = buf
        .get(at..)
        .and_then(|rest| memchr::memchr2(b'\n', b'\r', rest))
    {
        let line_end = at + found;
        let next_line = match (buf[line_end], buf.get(line_end + 1)) {
            (b'\r', None) => return Err(line_end),
            (b'\r', Some(b'\n')) => line_end + 2,
            _ => line_end + 1,
        };
        match buf.get(next_line) {
            None => return Err(line_end),
            Some(b'\n') => return Ok(next_line + 1),
            Some(b'\r') => match buf.get(next_line + 1) {
                None => return Err(line_end),
                Some(b'\n') => return Ok(next_line + 2),
                Some(_) => return Ok(next_line + 1),
            },
            Some(_) => at = next_line,
        }
    }
    Err(buf.len())
}

impl EventReader {
    pub fn new(bound: EventBound) -> EventReader {
        EventReader {
            pending: Pending::One(Bytes::new()),
            scanned: 0,
            over_bound: false,
            bound,
        }
    }

    pub fn push(&mut self, chunk: Bytes) {
        self.pending.push(chunk, self.bound.max_bytes);
    }

    /// The next whole event, or the next bytes of one over the bound; `None` until more
    /// arrives.
    pub fn next_piece(&mut self) -> Option<Piece> {
        match event_end(self.pending.bytes(), self.scanned) {
            Ok(end) => {
                self.scanned = 0;
                if end > self.bound.max_bytes {
                    self.outgrown();
                }
                let bytes = self.pending.split_to(end);
                Some(if std::mem::take(&mut self.over_bound) {
                    Piece::Uninspected(bytes)
                } else {
                    Piece::Event(bytes)
                })
            }
            Err(resume) => {
                self.scanned = resume;
                if self.pending.bytes().len() > self.bound.max_bytes {
                    self.outgrown();
                }
                if !self.over_bound || resume == 0 {
                    return None;
                }
                self.scanned = 0;
                Some(Piece::Uninspected(self.pending.split_to(resume)))
            }
        }
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
        let bytes = self.pending.take();
        if bytes.is_empty() {
            return None;
        }
        Some(if std::mem::take(&mut self.over_bound) {
            Piece::Uninspected(bytes)
        } else {
            Piece::Event(bytes)
        })
    }
}

/// An event's lines as the spec reads them, each without its end (CRLF, LF or CR).
pub fn lines(event: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = event;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let Some(end) = memchr::memchr2(b'\n', b'\r', rest) else {
            return Some(std::mem::take(&mut rest));
        };
        let line = &rest[..end];
        let crlf = rest[end] == b'\r' && rest.get(end + 1) == Some(&b'\n');
        rest = &rest[end + 1 + usize::from(crlf)..];
        Some(line)
    })
}

/// A line's field: its name (what stands before its first colon, or the whole line) and its
/// value (what follows the colon, less one leading space). A comment (a line that starts with
/// a colon) and a blank line are none.
pub fn field(line: &[u8]) -> Option<(&[u8], &[u8])> {
    match memchr::memchr(b':', line) {
        Some(0) => None,
        Some(colon) => {
            let value = &line[colon + 1..];
            Some((&line[..colon], value.strip_prefix(b" ").unwrap_or(value)))
        }
        None => (!line.is_empty()).then_some((line, &b""[..])),
    }
}

/// An event's data as a client reads it: its `data` fields' values joined by LF (borrowed
/// when there is one); `None` when it has none.
pub fn data(event: &[u8]) -> Option<Cow<'_, [u8]>> {
    let mut values = lines(event)
        .filter_map(field)
        .filter(|(name, _)| *name == b"data")
        .map(|(_, value)| value);
    let first = values.next()?;
    let Some(second) = values.next() else {
        return Some(Cow::Borrowed(first));
    };
    let mut joined = [first, second].join(&b'\n');
    for value in values {
        joined.push(b'\n');
        joined.extend_from_slice(value);
    }
    Some(Cow::Owned(joined))
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
            reader.push(Bytes::copy_from_slice(chunk));
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

    /// Issue 55: an event whose lines end in a bare CR, or in an LF then a CR, was read on
    /// into the next one. Every mix of CR, LF and CRLF that makes a blank line ends one, in the
    /// same place however the stream is chunked.
    #[test]
    fn events_end_at_any_blank_line_the_spec_reads_however_the_stream_is_chunked() {
        let stream = "data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d\r\n\ndata: e\n\r\ndata: f\n\rdata: g\r\n\rdata: h\r\n\r\nx\ndata: tail";
        for size in 1..stream.len() {
            let (got, uninspected) = pieces(stream.as_bytes(), size, 1024);
            assert_eq!(
                got,
                [
                    event("data: a\n\n"),
                    event("data: b\r\n\r\n"),
                    event("data: c\r\r"),
                    event("data: d\r\n\n"),
                    event("data: e\n\r\n"),
                    event("data: f\n\r"),
                    event("data: g\r\n\r"),
                    event("data: h\r\n\r\n"),
                    event("x\ndata: tail"),
                ],
                "chunks of {size}"
            );
            assert_eq!(uninspected, 0);
        }
    }

    #[test]
    fn a_crlf_is_one_line_end_not_a_blank_line() {
        let stream = "data: a\r\ndata: b\r\n\r\n";
        for size in 1..stream.len() {
            assert_eq!(
                pieces(stream.as_bytes(), size, 1024).0,
                [event(stream)],
                "chunks of {size}"
            );
        }
    }

    /// Issue 55: each `data:` line was read alone, so an object split over two was no JSON.
    #[test]
    fn an_events_data_is_its_data_lines_joined_as_the_spec_reads_them() {
        for (event, expected) in [
            ("data: {\"a\":\ndata: 1}\n\n", Some("{\"a\":\n1}")),
            ("data:{\"a\":\rdata:  1}\r\r", Some("{\"a\":\n 1}")),
            (
                "event: error\r\n: a comment\r\ndata\r\ndata: x\r\n\r\n",
                Some("\nx"),
            ),
            ("event: ping\n\n", None),
            ("data: [DONE]", Some("[DONE]")),
        ] {
            let got = data(event.as_bytes());
            assert_eq!(got.as_deref(), expected.map(str::as_bytes), "{event:?}");
        }
        let fields: Vec<_> = lines(b"event: error\r\nid\r: c\n")
            .filter_map(field)
            .collect();
        assert_eq!(fields, [(&b"event"[..], &b"error"[..]), (b"id", b"")]);
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

    /// Issue 55: a stream's memory was several times one event. The reader's buffer grows to
    /// the bound and no further, however long the event.
    #[test]
    fn an_event_that_never_ends_holds_no_more_than_the_bound() {
        let bound = test_bound(1024 * 1024);
        let mut reader = EventReader::new(bound.clone());
        let mut relayed = 0;
        let mut most_held = 0;
        for _ in 0..10_000 {
            reader.push(Bytes::from_static(&[b'x'; 1000]));
            while let Some(Piece::Uninspected(bytes)) = reader.next_piece() {
                relayed += bytes.len();
            }
            if let Pending::Joined(joined) = &reader.pending {
                most_held = most_held.max(joined.capacity());
            }
        }
        assert!(most_held <= 1024 * 1024 + 1000, "{most_held}");
        assert!(most_held > 512 * 1024, "{most_held}");
        let rest = reader.rest().map_or(0, |piece| match piece {
            Piece::Uninspected(bytes) | Piece::Event(bytes) => bytes.len(),
        });
        assert_eq!(relayed + rest, 10_000_000);
        assert_eq!(bound.uninspected.as_ref().map_or(0, IntCounter::get), 1);
    }

    /// A chunk of whole events (what recall's stream hands the usage tap) is handed on as
    /// slices of itself: the reader copies nothing of it.
    #[test]
    fn whole_events_in_a_chunk_are_handed_on_without_a_copy() {
        let chunk = Bytes::from_static(b"data: a\n\ndata: b\r\n\r\n");
        let mut reader = EventReader::new(test_bound(1024));
        reader.push(chunk.clone());
        let mut at = chunk.as_ptr() as usize;
        for _ in 0..2 {
            let Some(Piece::Event(event)) = reader.next_piece() else {
                panic!("no event");
            };
            assert_eq!(event.as_ptr() as usize, at);
            at += event.len();
        }
        assert_eq!(reader.next_piece(), None);
        assert!(reader.rest().is_none());
    }
}
