//! The stream event reader on any bytes in any chunking: what it hands on is the stream
//! itself, every event ends at its terminator, none is held past the bound, and an event over
//! the bound passes uninspected.
#![no_main]

use bytes::Bytes;
use condenser::transport::events::{EventBound, EventReader, Piece};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sizes, stream)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(sizes & 0x0f) + 1;
    let max_bytes = usize::from(sizes >> 4) * 8 + 4;
    let mut reader = EventReader::new(EventBound {
        max_bytes,
        uninspected: None,
    });
    let mut out: Vec<Piece> = Vec::new();
    for piece in stream.chunks(chunk) {
        reader.push(piece);
        while let Some(next) = reader.next_piece() {
            out.push(next);
        }
    }
    let rest = reader.rest();
    let mut whole = Vec::new();
    for piece in &out {
        let bytes: &Bytes = match piece {
            Piece::Event(event) => {
                assert!(
                    event.ends_with(b"\n\n")
                        || event.ends_with(b"\r\r")
                        || event.ends_with(b"\r\n\r\n"),
                    "an event without its end: {event:?}"
                );
                event
            }
            Piece::Uninspected(bytes) => bytes,
        };
        whole.extend_from_slice(bytes);
    }
    if let Some(Piece::Event(bytes) | Piece::Uninspected(bytes)) = &rest {
        whole.extend_from_slice(bytes);
    }
    for piece in out.iter().chain(&rest) {
        if let Piece::Event(event) = piece {
            assert!(
                event.len() <= max_bytes,
                "an event over the bound of {max_bytes} inspected: {event:?}"
            );
        }
    }
    assert_eq!(whole, stream, "the stream changed");
});
