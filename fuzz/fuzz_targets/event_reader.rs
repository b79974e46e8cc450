//! The stream event reader on any bytes in any chunking: what it hands on is the stream
//! itself; every event ends where the SSE spec ends one (a blank line, its lines ended by
//! CRLF, LF or CR), in the same place however the stream is chunked; none is held past the
//! bound, and an event over the bound passes uninspected.
#![no_main]

use std::collections::HashSet;

use bytes::Bytes;
use condenser::transport::events::{EventBound, EventReader, Piece};
use libfuzzer_sys::fuzz_target;

/// Every piece of `stream` read in chunks of `chunk` bytes.
fn pieces(stream: &[u8], chunk: usize, max_bytes: usize) -> Vec<Piece> {
    let mut reader = EventReader::new(EventBound {
        max_bytes,
        uninspected: None,
    });
    let mut out = Vec::new();
    for piece in stream.chunks(chunk) {
        reader.push(Bytes::copy_from_slice(piece));
        while let Some(next) = reader.next_piece() {
            out.push(next);
        }
    }
    out.extend(reader.rest());
    out
}

/// Where the spec's reading of `stream` (written here apart from condenser's reader) is just
/// past a blank line: a line end (CRLF as one, LF, CR) right after another, or at the start.
fn blank_line_ends(stream: &[u8]) -> HashSet<usize> {
    let mut ends = HashSet::new();
    let mut line_empty = true;
    let mut at = 0;
    while at < stream.len() {
        match stream[at] {
            b'\r' | b'\n' => {
                let crlf = stream[at] == b'\r' && stream.get(at + 1) == Some(&b'\n');
                at += 1 + usize::from(crlf);
                if line_empty {
                    ends.insert(at);
                }
                line_empty = true;
            }
            _ => {
                line_empty = false;
                at += 1;
            }
        }
    }
    ends
}

fuzz_target!(|data: &[u8]| {
    let Some((&sizes, stream)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(sizes & 0x0f) + 1;
    let max_bytes = usize::from(sizes >> 4) * 8 + 4;
    let out = pieces(stream, chunk, max_bytes);
    let ends = blank_line_ends(stream);
    let mut whole = Vec::new();
    for (i, piece) in out.iter().enumerate() {
        let (Piece::Event(bytes) | Piece::Uninspected(bytes)) = piece;
        whole.extend_from_slice(bytes);
        if let Piece::Event(event) = piece {
            assert!(
                event.len() <= max_bytes,
                "an event over the bound of {max_bytes} inspected: {event:?}"
            );
            // The last piece may be what the stream's end left.
            assert!(
                i + 1 == out.len() || ends.contains(&whole.len()),
                "an event that does not end at a blank line: {event:?}"
            );
        }
    }
    assert_eq!(whole, stream, "the stream changed");
    // Within the bound, events are cut in the same places whatever the chunking.
    if stream.len() <= max_bytes {
        assert_eq!(
            out,
            pieces(stream, stream.len().max(1), max_bytes),
            "chunks of {chunk} cut the stream elsewhere"
        );
    }
});
