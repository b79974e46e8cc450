//! Keys kept out of what upstream answers: the one rule for every reply condenser relays.
//! Each key a request carried upstream (the caller's, or the one condenser injected) is
//! blanked from the reply's headers and trailers, whatever its status, and from its body,
//! wherever it stands: raw, or written as JSON escapes it.
//!
//! A body is scrubbed as the client will read it. An error body (status 400 and up), and any
//! body in a `Content-Encoding` (condenser asks for `identity` whenever a key goes upstream,
//! so only an upstream that compresses unasked sends one), is read whole first, whatever its
//! framing, and decoded; one too large to read, or in a coding that does not decode, is
//! withheld rather than relayed unscanned. Any other body streams through as it comes, with
//! each key blanked as it passes and only the bytes that may begin one held back, whatever
//! its `Content-Type` says (a client reads a mislabelled body all the same): so an SSE stream
//! has every event scanned, however its lines end and however its data is split over lines,
//! and errors inside 2xx replies (Anthropic's `event: error`, OpenAI's `data: {"error": …}`,
//! Responses' `response.failed`, an error object in Gemini's JSON array) need no telling
//! apart. There a key is masked at its own length, so a body keeps its declared length; a body
//! without a key passes byte for byte.

use std::borrow::Cow;
use std::io::Read;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};
use memchr::memmem::Finder;

use crate::error::ProxyError;
use crate::transport::body::{full, read_body, BoxError, ProxyBody};
use crate::transport::headers::content_coded;

/// The most of an error body read to scan it, before and after decoding. Errors are small
/// JSON; a body larger than this is withheld, never relayed unscanned.
const MAX_SCANNED_ERROR_BYTES: usize = 256 * 1024;

/// A key shorter than this is no real API key, and blanking it would cut ordinary words out
/// of every reply (a key `test` would blank `text/event-stream`).
const MIN_KEY_BYTES: usize = 8;

/// The largest zstd window decoded, as RFC 8878 asks of HTTP (§3.1.1.1.2): a frame that
/// declares more would make the decoder allocate it.
const MAX_ZSTD_WINDOW_BYTES: u64 = 8 * 1024 * 1024;

const REDACTED: &[u8] = b"[redacted]";

/// A key looked for: its bytes (`needle()`), and a searcher for it written raw, built once for
/// every header, chunk and event of a reply.
type Key = Finder<'static>;

/// What is looked for of each credential header's value: what follows its scheme
/// (`Bearer sk-…`, `Basic …`), or the whole value (a bare key, as `x-api-key` carries it),
/// when it is long enough to be a key.
fn keys(credentials: &[HeaderValue]) -> Vec<Key> {
    credentials
        .iter()
        .map(|value| {
            let value = value.as_bytes();
            match value.iter().position(|byte| *byte == b' ') {
                Some(space) => value[space + 1..].trim_ascii_start(),
                None => value,
            }
        })
        .filter(|key| key.len() >= MIN_KEY_BYTES)
        .map(|key| Finder::new(key).into_owned())
        .collect()
}

/// `text` with each of `credentials`' keys replaced by `[redacted]`, wherever it is written
/// raw or JSON-escaped; borrowed back when it holds none.
pub fn blank_credentials<'t>(text: &'t [u8], credentials: &[HeaderValue]) -> Cow<'t, [u8]> {
    let keys = keys(credentials);
    match blank_keys(text, &keys) {
        Some(blanked) => Cow::Owned(blanked),
        None => Cow::Borrowed(text),
    }
}

/// How a key found is written over: as `[redacted]`, or (in a body that keeps its length)
/// as as many `*` as it took.
#[derive(Clone, Copy)]
enum Mask {
    Redacted,
    SameLength,
}

impl Mask {
    fn write(self, out: &mut Vec<u8>, length: usize) {
        match self {
            Mask::Redacted => out.extend_from_slice(REDACTED),
            Mask::SameLength => out.resize(out.len() + length, b'*'),
        }
    }
}

/// `text` with each of `keys` replaced, or None when it holds none.
fn blank_keys(text: &[u8], keys: &[Key]) -> Option<Vec<u8>> {
    blank_keys_with(text, keys, Mask::Redacted)
}

fn blank_keys_with(text: &[u8], keys: &[Key], mask: Mask) -> Option<Vec<u8>> {
    let mut blanked: Option<Vec<u8>> = None;
    for key in keys {
        if let Some(again) = blank_key(blanked.as_deref().unwrap_or(text), key, mask) {
            blanked = Some(again);
        }
    }
    blanked
}

/// `text` with every occurrence of `key` replaced, or None when it has none.
fn blank_key(text: &[u8], finder: &Key, mask: Mask) -> Option<Vec<u8>> {
    let key = finder.needle();
    // Escapes only lengthen a key: most header values are shorter than any real key.
    if text.len() < key.len() || key.is_empty() {
        return None;
    }
    // Every writing of the key starts with its first byte as it stands or with a backslash:
    // a text with neither (most header values) is not searched for either writing. Saves
    // about 160 instructions per chat request (bench/instructions.sh).
    memchr::memchr2(key[0], b'\\', text)?;
    let mut blanked: Option<Vec<u8>> = None;
    // `text[copied..]` is not yet in `blanked`; a key is looked for from `from` on.
    let (mut copied, mut from) = (0, 0);
    while let Some(at) = next_place(text, from, finder) {
        match key_written(text, at, key) {
            Written::Whole(end) => {
                let out = blanked.get_or_insert_with(|| Vec::with_capacity(text.len()));
                out.extend_from_slice(&text[copied..at]);
                mask.write(out, end - at);
                (copied, from) = (end, end);
            }
            Written::CutShort | Written::No => from = at + 1,
        }
    }
    let mut out = blanked?;
    out.extend_from_slice(&text[copied..]);
    Some(out)
}

/// The first place from `from` on where `key` may be written whole: where it stands raw, or
/// where an escaped writing of it may begin. One with an escape has a backslash, and before
/// its first backslash nothing but the key's first characters as they stand: so of the
/// first backslash `b` from `from` on, the earliest start `s` with `text[s..b]` a prefix of
/// the key (`b` itself at the latest). No writing starts earlier than the nearer of the two:
/// one whose first backslash is a later one starts after `b`.
fn next_place(text: &[u8], from: usize, finder: &Key) -> Option<usize> {
    let rest = text.get(from..)?;
    let key = finder.needle();
    let raw = finder.find(rest);
    let escaped = memchr::memchr(b'\\', rest).map(|backslash| {
        let earliest = (backslash + 1).saturating_sub(key.len());
        (earliest..backslash)
            .find(|&start| rest[start..backslash] == key[..backslash - start])
            .unwrap_or(backslash)
    });
    let place = match (raw, escaped) {
        (Some(raw), Some(escaped)) => raw.min(escaped),
        (place, None) | (None, place) => place?,
    };
    Some(from + place)
}

/// Whether `key` is written from `at` on, and where it ends.
enum Written {
    Whole(usize),
    /// `text` ends before it could tell: what is there may begin the key.
    CutShort,
    No,
}

/// Whether `key` is written from `at` on: as it stands, or each of its characters as it is or
/// as JSON may escape it (`\u` and four hex digits of either case, for any character; `\/`,
/// `\\`, `\"`), in any mix. There an escape is tried first: in JSON a backslash always starts
/// one. The key as it stands is tried before: read as escapes, a backslash of its own (`\\`,
/// `\u005c`) would be taken with the bytes after it, and the key written raw missed.
fn key_written(text: &[u8], mut at: usize, key: &[u8]) -> Written {
    let rest = text.get(at..).unwrap_or_default();
    // Compared whole only where its first byte is: this runs at every byte a streamed body
    // may hold back.
    if rest.first() == key.first() {
        if rest.starts_with(key) {
            return Written::Whole(at + key.len());
        }
        if key.starts_with(rest) {
            return Written::CutShort;
        }
    }
    for (i, &wanted) in key.iter().enumerate() {
        // The rest of the key as it stands ends it here: so the arms below, which hold back
        // a backslash that may begin an escape, never miss a key whose own backslash is its
        // last byte, written at the text's end.
        if text
            .get(at..)
            .is_some_and(|rest| rest.starts_with(&key[i..]))
        {
            return Written::Whole(at + key.len() - i);
        }
        match text.get(at..).unwrap_or_default() {
            [] => return Written::CutShort,
            [b'\\', b'u', a, b, c, d, ..] if escaped_byte([*a, *b, *c, *d]) == Some(wanted) => {
                at += 6;
            }
            [b'\\', escaped, ..] if *escaped == wanted && matches!(wanted, b'/' | b'\\' | b'"') => {
                at += 2;
            }
            // An escape that the text's end cut short: a backslash, or `\u` and fewer than
            // four hex digits. (`\"` and the like are whole, so no key's.) Before the key's
            // own bytes: for a key with a backslash, `\u00` at a chunk's end would be read
            // as that backslash, then fail at `u`, and the key escaped across two chunks
            // go out (found by the scrubber fuzz target).
            [b'\\'] => return Written::CutShort,
            [b'\\', b'u', digits @ ..]
                if digits.len() < 4 && digits.iter().all(u8::is_ascii_hexdigit) =>
            {
                return Written::CutShort
            }
            [byte, ..] if *byte == wanted => at += 1,
            _ => return Written::No,
        }
    }
    Written::Whole(at)
}

/// The character a `\uXXXX` escape stands for, when it is one byte.
fn escaped_byte(hex: [u8; 4]) -> Option<u8> {
    let code = hex.iter().try_fold(0u32, |code, digit| {
        char::from(*digit)
            .to_digit(16)
            .map(|digit| code * 16 + digit)
    })?;
    u8::try_from(code).ok()
}

/// Every header with each key blanked out of its value; a header whose name holds a key
/// is dropped (names are case-insensitive, so it is looked for in any case).
fn blank_headers(headers: &mut HeaderMap, keys: &[Key]) {
    let mut named_by_a_key = Vec::new();
    for (name, value) in headers.iter_mut() {
        if keys
            .iter()
            .any(|key| holds_in_any_case(name.as_str().as_bytes(), key.needle()))
        {
            named_by_a_key.push(name.clone());
            continue;
        }
        let Some(blanked) = blank_keys(value.as_bytes(), keys) else {
            continue;
        };
        // `[redacted]` is allowed wherever the key stood; a value that still will not do
        // goes.
        match HeaderValue::from_bytes(&blanked) {
            Ok(blanked) => *value = blanked,
            Err(_) => named_by_a_key.push(name.clone()),
        }
    }
    for name in named_by_a_key {
        headers.remove(name);
    }
}

/// Whether `name`, in lower case as hyper keeps header names, holds `key` in any case; only
/// where `key`'s first character stands is the rest compared.
fn holds_in_any_case(name: &[u8], key: &[u8]) -> bool {
    let (Some(first), Some(last_start)) = (key.first(), name.len().checked_sub(key.len())) else {
        return false;
    };
    memchr::memchr_iter(first.to_ascii_lowercase(), &name[..=last_start])
        .any(|at| name[at..at + key.len()].eq_ignore_ascii_case(key))
}

/// The reply with every key of `credentials` blanked from its headers and its body. An error
/// body, or one in a content coding, is read whole and relayed decoded with its length; one
/// that cannot be scanned whole (larger than `MAX_SCANNED_ERROR_BYTES`, or encoded in a way
/// that does not decode) is withheld: an error's status is then upstream's, for the client's
/// dialect to shape, and a success's is a broken reply. Any other body is scrubbed as it
/// passes. A request that carried no key has its reply as it came.
pub async fn without_credentials(
    response: Response<ProxyBody>,
    credentials: &[HeaderValue],
) -> Result<Response<ProxyBody>, ProxyError> {
    let keys = keys(credentials);
    if keys.is_empty() {
        return Ok(response);
    }
    let (mut head, body) = response.into_parts();
    blank_headers(&mut head.headers, &keys);
    if body.is_end_stream() {
        return Ok(Response::from_parts(head, body));
    }
    if head.status.as_u16() < 400 && !content_coded(&head.headers) {
        let scrubbed = Scrubbed::new(body, keys);
        return Ok(Response::from_parts(head, scrubbed.boxed_unsync()));
    }
    let raw = match read_body(body, &head.headers, MAX_SCANNED_ERROR_BYTES).await {
        Ok(raw) => raw,
        Err(ProxyError::BodyTooLarge { .. }) => {
            let why = format!("its body is larger than {MAX_SCANNED_ERROR_BYTES} bytes");
            return Err(withheld(head.status, why, &head.headers));
        }
        // Upstream's reply broke off: its fault, not the client's.
        Err(e) => return Err(ProxyError::UpstreamBroken(e.to_string())),
    };
    let decoded =
        decoded(raw, &head.headers).map_err(|why| withheld(head.status, why, &head.headers))?;
    let body = blank_keys(&decoded, &keys).map_or(decoded, Bytes::from);
    head.headers.remove(header::CONTENT_ENCODING);
    head.headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    Ok(Response::from_parts(head, full(body)))
}

/// How a success body is read for keys.
enum Reading {
    /// All of it as it passes, bytes that may begin a key held back.
    Text(BytesMut),
    /// Read to its end: the trailers that go once what was held has gone.
    Trailers(Option<HeaderMap>),
}

/// A success body with keys blanked from its bytes and trailers as it passes (the module's
/// comment).
struct Scrubbed {
    inner: ProxyBody,
    keys: Vec<Key>,
    reading: Reading,
    ended: bool,
}

impl Scrubbed {
    fn new(inner: ProxyBody, keys: Vec<Key>) -> Scrubbed {
        Scrubbed {
            inner,
            keys,
            reading: Reading::Text(BytesMut::new()),
            ended: false,
        }
    }

    /// What of `chunk` (and what was held) can go now; at the stream's `end`, all of it. A
    /// chunk with nothing held before it and no key in it goes as it came, uncopied.
    fn pass(&mut self, chunk: Bytes, end: bool) -> Result<Bytes, BoxError> {
        match &mut self.reading {
            Reading::Trailers(_) => Ok(chunk),
            Reading::Text(held) if held.is_empty() => {
                let text = blank_keys_with(&chunk, &self.keys, Mask::SameLength)
                    .map_or(chunk, Bytes::from);
                let keep = if end {
                    text.len()
                } else {
                    may_begin_a_key(&text, &self.keys)
                };
                held.extend_from_slice(&text[keep..]);
                Ok(text.slice(..keep))
            }
            Reading::Text(held) => {
                held.extend_from_slice(&chunk);
                if let Some(blanked) = blank_keys_with(held, &self.keys, Mask::SameLength) {
                    *held = BytesMut::from(&blanked[..]);
                }
                let keep = if end {
                    held.len()
                } else {
                    may_begin_a_key(held, &self.keys)
                };
                Ok(held.split_to(keep).freeze())
            }
        }
    }
}

/// Where the bytes that may begin a key start: what goes before them can go now. A key
/// begins with its first character or with a backslash (an escape of it), so only those
/// places are tried.
fn may_begin_a_key(text: &[u8], keys: &[Key]) -> usize {
    // A key's longest writing: every character a six-byte escape.
    let longest = keys
        .iter()
        .map(|key| key.needle().len() * 6)
        .max()
        .unwrap_or(0);
    let from = text.len().saturating_sub(longest);
    keys.iter()
        .filter_map(|key| {
            let key = key.needle();
            let first = *key.first()?;
            memchr::memchr2_iter(first, b'\\', &text[from..])
                .map(|found| from + found)
                .find(|&at| matches!(key_written(text, at, key), Written::CutShort))
        })
        .min()
        .unwrap_or(text.len())
}

impl Body for Scrubbed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        while !this.ended {
            let next = ready!(Pin::new(&mut this.inner).poll_frame(cx));
            let (chunk, end) = match next {
                Some(Ok(frame)) => match frame.into_data() {
                    // A body that knows it has ended (its declared length read) is not
                    // polled again: what is held goes with its last chunk.
                    Ok(chunk) => (chunk, this.inner.is_end_stream()),
                    Err(frame) => {
                        let Ok(mut trailers) = frame.into_trailers() else {
                            continue;
                        };
                        blank_headers(&mut trailers, &this.keys);
                        // What was held goes before the trailers.
                        let held = this.pass(Bytes::new(), true)?;
                        this.ended = true;
                        if held.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                        }
                        // Trailers end a body: they go once what was held has gone.
                        this.reading = Reading::Trailers(Some(trailers));
                        return Poll::Ready(Some(Ok(Frame::data(held))));
                    }
                },
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => (Bytes::new(), true),
            };
            let out = match this.pass(chunk, end) {
                Ok(out) => out,
                Err(error) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(error)));
                }
            };
            this.ended = end;
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
        }
        match &mut this.reading {
            Reading::Trailers(trailers) => {
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t))))
            }
            _ => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.reading {
            Reading::Trailers(trailers) => trailers.is_none(),
            Reading::Text(held) => held.is_empty() && self.inner.is_end_stream(),
        }
    }

    /// A key is masked at its own length: the body's size stands.
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A withheld reply: a success is a broken reply (its status would say all went well); an
/// error keeps its status, with the headers (keys already blanked from them) that tell a
/// client when to try again: `Retry-After` and the rate limits (OpenAI's `x-ratelimit-*`,
/// Anthropic's `anthropic-ratelimit-*`, the IETF draft's `ratelimit*`).
fn withheld(status: StatusCode, why: String, headers: &HeaderMap) -> ProxyError {
    tracing::warn!(status = status.as_u16(), %why, "upstream reply withheld");
    if status.as_u16() < 400 {
        return ProxyError::UpstreamBroken(format!(
            "upstream answered {status} in a content coding it was not asked for, and its body was withheld, as {why}"
        ));
    }
    let mut kept = HeaderMap::new();
    for (name, value) in headers {
        let name_text = name.as_str();
        if name_text.starts_with("retry-after")
            || name_text.starts_with("x-ratelimit-")
            || name_text.starts_with("anthropic-ratelimit-")
            || name_text.starts_with("ratelimit")
        {
            kept.append(name.clone(), value.clone());
        }
    }
    ProxyError::UpstreamReplyWithheld {
        status,
        why,
        kept: Box::new(kept),
    }
}

/// `body` with its content codings undone, the last applied first, and no larger than
/// `MAX_SCANNED_ERROR_BYTES` once decoded; why not, when it cannot be.
fn decoded(mut body: Bytes, headers: &HeaderMap) -> Result<Bytes, String> {
    let mut codings = Vec::new();
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let value = value
            .to_str()
            .map_err(|_| "its Content-Encoding is not text".to_string())?;
        codings.extend(
            value
                .split(',')
                .map(|coding| coding.trim().to_ascii_lowercase())
                .filter(|coding| !coding.is_empty() && coding != "identity"),
        );
    }
    for coding in codings.iter().rev() {
        let source = &body[..];
        let decoder: Box<dyn Read + '_> = match coding.as_str() {
            "gzip" | "x-gzip" => Box::new(flate2::read::MultiGzDecoder::new(source)),
            "deflate" => Box::new(flate2::read::ZlibDecoder::new(source)),
            "br" => Box::new(brotli_decompressor::Decompressor::new(source, 4096)),
            "zstd" => Box::new(
                ruzstd::decoding::StreamingDecoder::new_with_max_window_size(
                    source,
                    MAX_ZSTD_WINDOW_BYTES,
                )
                .map_err(|e| format!("its zstd encoding does not decode: {e}"))?,
            ),
            other => {
                return Err(format!(
                    "it is encoded as {other:?}, which condenser does not decode"
                ))
            }
        };
        let mut out = Vec::new();
        decoder
            .take(MAX_SCANNED_ERROR_BYTES as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| format!("its {coding} encoding does not decode: {e}"))?;
        if out.len() > MAX_SCANNED_ERROR_BYTES {
            return Err(format!(
                "its body is larger than {MAX_SCANNED_ERROR_BYTES} bytes once decoded"
            ));
        }
        body = Bytes::from(out);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const KEY: &str = "sk-FIXTURE-KEY-123";

    /// What `blank_key` must find: the key tried at every byte, left to right.
    fn blank_key_everywhere(text: &[u8], key: &[u8]) -> Option<Vec<u8>> {
        let (mut out, mut copied, mut at, mut found) = (Vec::new(), 0, 0, false);
        while at < text.len() {
            match key_written(text, at, key) {
                Written::Whole(end) => {
                    out.extend_from_slice(&text[copied..at]);
                    out.extend_from_slice(REDACTED);
                    (copied, at, found) = (end, end, true);
                }
                Written::CutShort | Written::No => at += 1,
            }
        }
        out.extend_from_slice(&text[copied..]);
        found.then_some(out)
    }

    proptest::proptest! {
        /// Only the places `next_place` offers are tried: it finds what trying every byte
        /// finds, in texts made of the key's own bytes, backslashes and escapes.
        #[test]
        fn the_places_tried_miss_no_key(
            key in proptest::collection::vec(proptest::sample::select(b"ab\\\"u0".to_vec()), 8..12),
            pieces in proptest::collection::vec(0usize..6, 0..60),
        ) {
            let mut text = Vec::new();
            for (i, piece) in pieces.iter().enumerate() {
                match piece {
                    0 => text.extend_from_slice(&key),
                    1 => text.extend_from_slice(&key[..i % key.len()]),
                    2 => text.push(b'\\'),
                    3 => text.extend_from_slice(format!("\\u{:04x}", key[i % key.len()]).as_bytes()),
                    4 => text.push(key[i % key.len()]),
                    _ => text.extend_from_slice(b"\\/"),
                }
            }
            let finder = Finder::new(&key).into_owned();
            proptest::prop_assert_eq!(
                blank_key(&text, &finder, Mask::Redacted),
                blank_key_everywhere(&text, &key)
            );
        }
    }

    fn bearer() -> [HeaderValue; 1] {
        [HeaderValue::from_static("Bearer sk-FIXTURE-KEY-123")]
    }

    fn blanked(text: &str) -> String {
        String::from_utf8(blank_credentials(text.as_bytes(), &bearer()).into_owned()).unwrap()
    }

    /// `text` with every character written as `\uXXXX`, in upper-case hex when `upper`.
    fn escaped(text: &str, upper: bool) -> String {
        text.chars()
            .map(|c| match upper {
                true => format!("\\u{:04X}", c as u32),
                false => format!("\\u{:04x}", c as u32),
            })
            .collect()
    }

    #[test]
    fn a_key_is_blanked_raw_and_in_every_json_escape() {
        let mixed = format!("sk-FIX{}URE-KEY-12\\u0033", escaped("T", true));
        for written in [
            KEY.to_string(),
            escaped(KEY, false),
            escaped(KEY, true),
            mixed,
        ] {
            assert_eq!(
                blanked(&format!(
                    r#"{{"message":"Incorrect key {written}, and again {written}."}}"#
                )),
                r#"{"message":"Incorrect key [redacted], and again [redacted]."}"#,
                "{written}"
            );
        }
        // Written wholly in escapes, in a text without the key's first byte as it stands.
        assert_eq!(blanked(&escaped(KEY, false)), "[redacted]");
        // `\/` and the other one-character escapes a key's characters may take.
        let key = HeaderValue::from_static("abc/def\\ghi\"jk");
        let text = r#"key abc\/def\\ghi\"jk end"#;
        assert_eq!(
            blank_credentials(text.as_bytes(), &[key]).as_ref(),
            b"key [redacted] end"
        );
    }

    /// Found by fuzz/fuzz_targets/scrubber.rs (issue 37): a key's own `\\` was read as one
    /// escaped backslash, and the key written raw passed, whole or split across chunks.
    #[test]
    fn a_key_with_backslashes_of_its_own_is_blanked_as_it_stands() {
        let key = r"sk-FIXTURE\\KEY";
        let sent = [HeaderValue::from_static(key)];
        for written in [key, r"sk-FIXTURE\\\\KEY"] {
            assert_eq!(
                blank_credentials(format!("key {written} end").as_bytes(), &sent).as_ref(),
                b"key [redacted] end",
                "{written}"
            );
        }
        let cut = r"key sk-FIXTURE\\K";
        assert_eq!(
            may_begin_a_key(cut.as_bytes(), &[Finder::new(key.as_bytes()).into_owned()]),
            "key ".len()
        );
        // Found by the same target (issue 55): the key written wholly in escapes, a chunk
        // ending inside the escape of its backslash (`\u00`), is held back, not read as the
        // key's own backslash and let go.
        // A key ending in its own backslash, its other bytes escaped, at the text's end.
        let ends = HeaderValue::from_static(r"sk-FIXTURE-KEY\");
        let written = format!("{}\\", escaped("sk-FIXTURE-KEY", false));
        assert_eq!(
            blank_credentials(written.as_bytes(), &[ends]).as_ref(),
            b"[redacted]"
        );
        let finder = [Finder::new(key.as_bytes()).into_owned()];
        let escaped_key = escaped(key, false);
        let backslash = escaped_key.find(r"\u005c").unwrap();
        for end in backslash + 1..backslash + 6 {
            let cut = format!("key {}", &escaped_key[..end]);
            assert_eq!(
                may_begin_a_key(cut.as_bytes(), &finder),
                "key ".len(),
                "{cut}"
            );
        }
    }

    #[test]
    fn text_without_a_key_is_borrowed_back_and_short_values_are_no_keys() {
        for text in ["", "\\", "\\u00", "sk-FIXTURE-KEY-12", "\\u0073k-FIXTURE"] {
            assert!(matches!(
                blank_credentials(text.as_bytes(), &bearer()),
                Cow::Borrowed(_)
            ));
        }
        let short = [HeaderValue::from_static("Bearer test")];
        assert!(matches!(
            blank_credentials(b"text/event-stream test", &short),
            Cow::Borrowed(_)
        ));
        // A bare key, as `x-api-key` carries it, is looked for whole; after any scheme, the
        // credentials alone.
        for sent in [
            KEY.to_string(),
            format!("Basic {KEY}"),
            format!("bearer  {KEY}"),
        ] {
            let sent = [HeaderValue::from_str(&sent).unwrap()];
            assert_eq!(
                blank_credentials(format!("[{KEY}]").as_bytes(), &sent).as_ref(),
                b"[[redacted]]"
            );
        }
    }

    #[test]
    fn headers_lose_the_key_in_their_values_and_the_headers_named_by_one() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_str(&format!("Bearer realm=\"{KEY}\"")).unwrap(),
        );
        headers.insert("x-echo-key", HeaderValue::from_static(KEY));
        headers.insert(
            header::HeaderName::from_bytes(KEY.to_ascii_lowercase().as_bytes()).unwrap(),
            HeaderValue::from_static("1"),
        );
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        blank_headers(&mut headers, &[Finder::new(KEY.as_bytes()).into_owned()]);
        assert_eq!(headers.len(), 3, "{headers:?}");
        assert_eq!(
            headers[header::WWW_AUTHENTICATE],
            "Bearer realm=\"[redacted]\""
        );
        assert_eq!(headers["x-echo-key"], "[redacted]");
        assert_eq!(headers[header::CONTENT_TYPE], "text/plain");
    }

    fn encoded(coding: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_str(coding).unwrap(),
        );
        headers
    }

    const MESSAGE: &[u8] =
        br#"{"error":{"message":"Incorrect API key provided: sk-FIXTURE-KEY-123"}}"#;

    /// `MESSAGE` as `brotli` (Python's module) and `zstd -19` (the command) wrote it.
    const MESSAGE_BR: &[u8] = &[
        0x1b, 0x45, 0x00, 0xf8, 0x8d, 0xd4, 0x4e, 0x77, 0xe2, 0x50, 0xa4, 0x6e, 0x4b, 0xf5, 0xac,
        0x3f, 0xa8, 0xed, 0xcd, 0x70, 0xe1, 0x58, 0x44, 0x14, 0xb4, 0x14, 0x8b, 0x49, 0x8e, 0x55,
        0xb6, 0x06, 0x1b, 0x70, 0x22, 0x10, 0x70, 0x18, 0xe8, 0x20, 0x70, 0x8f, 0x30, 0xc3, 0x15,
        0x30, 0xc1, 0xa1, 0x10, 0x07, 0x41, 0x60, 0xa7, 0xa5, 0xdc, 0x8c, 0x7a, 0x74, 0x62, 0x4e,
        0xba, 0xb9, 0xd8, 0x1a, 0xb3, 0x2b, 0x57, 0xdd, 0x1c, 0x62, 0xc2, 0xff,
    ];
    const MESSAGE_ZSTD: &[u8] = &[
        0x28, 0xb5, 0x2f, 0xfd, 0x04, 0x68, 0x31, 0x02, 0x00, 0x7b, 0x22, 0x65, 0x72, 0x72, 0x6f,
        0x72, 0x22, 0x3a, 0x7b, 0x22, 0x6d, 0x65, 0x73, 0x73, 0x61, 0x67, 0x65, 0x22, 0x3a, 0x22,
        0x49, 0x6e, 0x63, 0x6f, 0x72, 0x72, 0x65, 0x63, 0x74, 0x20, 0x41, 0x50, 0x49, 0x20, 0x6b,
        0x65, 0x79, 0x20, 0x70, 0x72, 0x6f, 0x76, 0x69, 0x64, 0x65, 0x64, 0x3a, 0x20, 0x73, 0x6b,
        0x2d, 0x46, 0x49, 0x58, 0x54, 0x55, 0x52, 0x45, 0x2d, 0x4b, 0x45, 0x59, 0x2d, 0x31, 0x32,
        0x33, 0x22, 0x7d, 0x7d, 0x00, 0x19, 0xef, 0x41,
    ];

    fn gzip(body: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(body).unwrap();
        encoder.finish().unwrap()
    }

    fn zlib(body: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(body).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn each_content_coding_is_undone_before_the_scan() {
        for (coding, body) in [
            ("gzip", gzip(MESSAGE)),
            ("x-gzip", gzip(MESSAGE)),
            ("deflate", zlib(MESSAGE)),
            ("br", MESSAGE_BR.to_vec()),
            ("zstd", MESSAGE_ZSTD.to_vec()),
            ("identity", MESSAGE.to_vec()),
            // Applied in the order listed, undone in the reverse.
            ("deflate, GZIP", gzip(&zlib(MESSAGE))),
        ] {
            let headers = encoded(coding);
            let decoded = decoded(Bytes::from(body), &headers).unwrap();
            assert_eq!(decoded, MESSAGE, "{coding}");
        }
    }

    #[test]
    fn a_body_that_cannot_be_decoded_or_decodes_too_large_cannot_be_scanned() {
        let bomb = gzip(&vec![b'a'; MAX_SCANNED_ERROR_BYTES + 1]);
        assert!(bomb.len() < 4096);
        for (coding, body, why) in [
            ("gzip", bomb, "larger than"),
            ("gzip", MESSAGE.to_vec(), "does not decode"),
            ("br", b"\xff\xff\xff".to_vec(), "does not decode"),
            ("zstd", MESSAGE.to_vec(), "does not decode"),
            ("compress", MESSAGE.to_vec(), "\"compress\""),
        ] {
            let headers = encoded(coding);
            let error = decoded(Bytes::from(body), &headers).unwrap_err();
            assert!(error.contains(why), "{coding}: {error}");
        }
    }
}
