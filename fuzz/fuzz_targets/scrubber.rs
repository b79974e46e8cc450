//! The key scrub on any text and key, and on any reply that carries the key: no key survives
//! it, whatever the framing.
//!
//! The first byte picks the case. Text: `blank_credentials` on the rest, which must leave no
//! key written raw, and text without the key as it was. Reply: the key written into the text
//! (raw, or each character a JSON escape), its line ends rewritten (LF, CR or CRLF), its SSE
//! data split over lines, compressed (gzip, deflate, or the text as a brotli body, mostly not
//! one), with a success or an error status, in chunks of any size, through
//! `without_credentials`. What the client would read of the reply, whole, per SSE event
//! (lines ended as the spec ends them, data lines joined), and every string of the JSON in
//! either, holds no key: the reply was withheld, or the key masked.
#![no_main]

use std::collections::VecDeque;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use condenser::transport::body::{BoxError, ProxyBody};
use condenser::transport::redact::without_credentials;
use condenser::transport::upstream::blank_credentials;
use hyper::body::{Body, Frame};
use hyper::header::HeaderValue;
use hyper::Response;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&case, rest)) = data.split_first() else {
        return;
    };
    let Some((&chunk, rest)) = rest.split_first() else {
        return;
    };
    let Some((&length, rest)) = rest.split_first() else {
        return;
    };
    let length = usize::from(length % 24) + 8;
    if rest.len() < length {
        return;
    }
    let (key, text) = rest.split_at(length);
    // A key is a header value's visible characters, without spaces (one would start a scheme).
    if !key.iter().all(|byte| byte.is_ascii_graphic()) {
        return;
    }
    let Ok(value) = HeaderValue::from_bytes(key) else {
        return;
    };
    if case & 1 == 0 {
        scrubbed_text(key, text, value);
    } else {
        scrubbed_reply(case, usize::from(chunk % 64) + 1, key, text, value);
    }
});

fn found(haystack: &[u8], key: &[u8]) -> bool {
    haystack.windows(key.len()).any(|window| window == key)
}

fn scrubbed_text(key: &[u8], text: &[u8], value: HeaderValue) {
    let blanked = blank_credentials(text, &[value]);
    if !found(text, key) && !text.contains(&b'\\') {
        assert_eq!(&blanked[..], text, "text without the key changed");
    }
    // What blanking leaves cannot hold the key raw, unless `[redacted]` itself made it up
    // with its neighbours.
    if found(&blanked, key) {
        assert!(
            blanked.windows(10).any(|window| window == b"[redacted]"),
            "the key survived: {key:?} in {blanked:?}"
        );
    }
}

/// A reply's body in the chunks the case cut it in.
struct Chunks(VecDeque<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.0.pop_front().map(|chunk| Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// `key` written as the case says: as it stands, or every character a `\u` escape.
fn written(key: &[u8], escaped: bool) -> Vec<u8> {
    if !escaped {
        return key.to_vec();
    }
    key.iter()
        .flat_map(|byte| format!("\\u{:04x}", byte).into_bytes())
        .collect()
}

fn scrubbed_reply(case: u8, chunk: usize, key: &[u8], text: &[u8], value: HeaderValue) {
    // The mask of a success body is `*`; a key of them would be found again in its mask.
    if key.contains(&b'*') {
        return;
    }
    let (head, tail) = text.split_at(text.len() / 2);
    let mut body = head.to_vec();
    body.extend_from_slice(&written(key, case & 0x02 != 0));
    body.extend_from_slice(tail);
    let line_end: &[u8] = match (case >> 2) & 3 {
        1 => b"\r",
        2 => b"\r\n",
        _ => b"\n",
    };
    if line_end != b"\n" {
        body = body
            .split(|byte| *byte == b'\n')
            .collect::<Vec<_>>()
            .join(line_end);
    }
    // The data of the event the key is in, split over two data lines at the key's middle.
    if case & 0x10 != 0 {
        let middle = head.len() + key.len() / 2;
        let mut split = body[..middle].to_vec();
        split.extend_from_slice(line_end);
        split.extend_from_slice(b"data: ");
        split.extend_from_slice(&body[middle..]);
        body = split;
    }
    let (coding, encoded) = match (case >> 5) & 3 {
        0 => (None, body.clone()),
        1 => {
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            let _ = encoder.write_all(&body);
            (Some("gzip"), encoder.finish().unwrap_or_default())
        }
        2 => {
            let mut encoder =
                flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            let _ = encoder.write_all(&body);
            (Some("deflate"), encoder.finish().unwrap_or_default())
        }
        _ => (Some("br"), body.clone()),
    };
    let status = if case & 0x80 != 0 { 401 } else { 200 };
    let chunks = encoded.chunks(chunk).map(Bytes::copy_from_slice).collect();
    let mut response = Response::new(ProxyBody::new(Chunks(chunks)));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
    let content_type = if case & 0x40 != 0 {
        "text/event-stream"
    } else {
        "application/json"
    };
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    if let Some(coding) = coding {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_ENCODING, HeaderValue::from_static(coding));
    }
    let credentials = [value];
    let mut cx = Context::from_waker(Waker::noop());
    let scrubbing = std::pin::pin!(without_credentials(response, &credentials));
    let Poll::Ready(scrubbed) = scrubbing.poll(&mut cx) else {
        panic!("a reply whose body is all there waited");
    };
    // Withheld: nothing of it reaches the client.
    let Ok(scrubbed) = scrubbed else {
        return;
    };
    assert!(
        !scrubbed
            .headers()
            .contains_key(hyper::header::CONTENT_ENCODING),
        "a reply relayed encoded"
    );
    let mut body = scrubbed.into_body();
    let mut out = Vec::new();
    loop {
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(&data);
                }
            }
            // A stream that fails ends what the client reads there.
            Poll::Ready(Some(Err(_))) | Poll::Ready(None) => break,
            Poll::Pending => panic!("a body that is all there waited"),
        }
    }
    assert_keyless(&out, key, "the body");
    for data in event_data(&out) {
        assert_keyless(&data, key, "an event's data");
    }
}

/// `text` as a client would read it, with what condenser writes in a key's place (`[redacted]`,
/// `*`) taken out: a key found there survived.
fn assert_keyless(text: &[u8], key: &[u8], what: &str) {
    let unmasked: Vec<u8> = String::from_utf8_lossy(text)
        .replace("[redacted]", "\0")
        .into_bytes();
    assert!(
        !found(&unmasked, key),
        "the key {key:?} survived in {what}: {text:?}"
    );
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(text) {
        let mut strings = Vec::new();
        strings_of(&json, &mut strings);
        for string in strings {
            let unmasked = string.replace("[redacted]", "\0");
            assert!(
                !found(unmasked.as_bytes(), key),
                "the key {key:?} survived in a JSON string of {what}: {string:?}"
            );
        }
    }
}

fn strings_of(json: &serde_json::Value, out: &mut Vec<String>) {
    match json {
        serde_json::Value::String(string) => out.push(string.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|item| strings_of(item, out)),
        serde_json::Value::Object(fields) => {
            for (name, value) in fields {
                out.push(name.clone());
                strings_of(value, out);
            }
        }
        _ => {}
    }
}

/// Each event's data as the SSE spec reads a stream (written here apart from condenser's
/// reader): lines ended by CRLF, LF or CR; a blank line ends an event; `data` values, less one
/// leading space, joined by LF.
fn event_data(stream: &[u8]) -> Vec<Vec<u8>> {
    let mut events = Vec::new();
    let mut values: Vec<&[u8]> = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        let end = rest
            .iter()
            .position(|byte| matches!(byte, b'\r' | b'\n'))
            .unwrap_or(rest.len());
        let line = &rest[..end];
        let crlf = rest.get(end) == Some(&b'\r') && rest.get(end + 1) == Some(&b'\n');
        rest = rest.get(end + 1 + usize::from(crlf)..).unwrap_or_default();
        if line.is_empty() {
            if !values.is_empty() {
                events.push(values.join(&b'\n'));
                values.clear();
            }
            continue;
        }
        match line.strip_prefix(b"data") {
            Some([]) => values.push(&[]),
            Some([b':', b' ', value @ ..] | [b':', value @ ..]) => values.push(value),
            _ => {}
        }
    }
    // An event the stream's end cut short: a client may read it too.
    if !values.is_empty() {
        events.push(values.join(&b'\n'));
    }
    events
}
