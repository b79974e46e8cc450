//! Reads token usage out of responses as they pass, without delaying them: JSON bodies are
//! kept aside while relayed, SSE streams are relayed event by event (the usage-only chunk
//! that condenser itself asked for of a chat completion is dropped). Each dialect writes
//! usage its own way (`UsageFormat`).

use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use memchr::memmem;
use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::transport::body::{BoxError, Gathered};

/// A JSON body larger than this is relayed without reading its usage.
const MAX_JSON_COPY: usize = 16 * 1024 * 1024;

/// Both counts are required: a `"usage"` object without them is not a chat completion's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// Just the part of a response that holds usage; the rest is skipped, not built.
#[derive(Deserialize)]
struct WithUsage {
    usage: Option<UsageFields>,
    choices: Option<Vec<IgnoredAny>>,
}

#[derive(Deserialize)]
struct UsageFields {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

impl WithUsage {
    fn parse(bytes: &[u8]) -> Option<WithUsage> {
        serde_json::from_slice(bytes).ok()
    }

    fn usage(&self) -> Option<Usage> {
        self.usage.as_ref().map(|u| Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
        })
    }
}

/// The usage of a whole JSON response. Chat completions end with it, so the last `"usage"`
/// key is read first, without scanning the completion before it. Inside a string that key's
/// quotes would be escaped, so what matches is a key or the string "usage"; anything but a
/// usage object after it falls back to reading the whole body.
fn json_usage(body: &[u8]) -> Option<Usage> {
    tail_usage(body).or_else(|| WithUsage::parse(body).and_then(|r| r.usage()))
}

const USAGE_KEY: &[u8] = b"\"usage\"";

/// Built once: on a small completion, building a searcher costs as much as the search.
static USAGE_KEY_FORWARD: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(USAGE_KEY));
static USAGE_KEY_FROM_END: LazyLock<memmem::FinderRev<'static>> =
    LazyLock::new(|| memmem::FinderRev::new(USAGE_KEY));

/// How far from its end a completion's usage normally sits (a few members follow it). The
/// forward search is vectorized and the reverse one is not, so this stretch is searched
/// forward, and only a body whose usage lies further back is searched in reverse.
const USAGE_TAIL_BYTES: usize = 1024;

/// Where the last `"usage"` in `body` starts.
fn last_usage_key(body: &[u8]) -> Option<usize> {
    let tail = body.len().saturating_sub(USAGE_TAIL_BYTES);
    match USAGE_KEY_FORWARD.find_iter(&body[tail..]).last() {
        Some(at) => Some(tail + at),
        None => USAGE_KEY_FROM_END.rfind(body),
    }
}

fn tail_usage(body: &[u8]) -> Option<Usage> {
    let at = last_usage_key(body)?;
    let value = body[at + USAGE_KEY.len()..]
        .trim_ascii_start()
        .strip_prefix(b":")?;
    plain_usage(value)
        .or_else(|| Usage::deserialize(&mut serde_json::Deserializer::from_slice(value)).ok())
}

/// The usage object as upstreams write it, read without `serde`, which costs several times
/// more on a response's path: its two counts as plain integers, each once, among other
/// members that are skipped (nested objects included). Anything else is `None`, and `serde`
/// reads the object instead.
fn plain_usage(object: &[u8]) -> Option<Usage> {
    let mut prompt = None;
    let mut completion = None;
    let mut depth = 0usize;
    let mut at = 0;
    while let Some(&byte) = object.get(at) {
        at += 1;
        match byte {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(Usage {
                        prompt_tokens: prompt?,
                        completion_tokens: completion?,
                    });
                }
            }
            b'"' => {
                let start = at;
                // A string with an escape in it is left to serde, which decodes it.
                at += memchr::memchr2(b'"', b'\\', &object[at..])?;
                if object[at] == b'\\' {
                    return None;
                }
                let text = &object[start..at];
                at += 1;
                let rest = object[at..].trim_ascii_start();
                let Some(value) = rest.strip_prefix(b":") else {
                    continue;
                };
                let slot = match (depth, text) {
                    (1, b"prompt_tokens") => &mut prompt,
                    (1, b"completion_tokens") => &mut completion,
                    _ => continue,
                };
                let value = value.trim_ascii_start();
                let digits = value.iter().take_while(|b| b.is_ascii_digit()).count();
                let after = value[digits..].trim_ascii_start().first();
                let leading_zero = digits > 1 && value[0] == b'0';
                if slot.is_some()
                    || digits == 0
                    || leading_zero
                    || !matches!(after, Some(b',' | b'}'))
                {
                    return None;
                }
                *slot = Some(std::str::from_utf8(&value[..digits]).ok()?.parse().ok()?);
                at = object.len() - value.len() + digits;
            }
            _ => {}
        }
    }
    None
}

/// How a dialect's replies carry usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageFormat {
    /// `usage.prompt_tokens`/`completion_tokens`, last in a body or in a stream's final chunk.
    Chat,
    /// `usage.input_tokens`/`output_tokens` of the response, in a body or in the stream's
    /// `response.completed` event.
    Responses,
    /// Anthropic: `usage.input_tokens` (with `cache_creation_input_tokens` and
    /// `cache_read_input_tokens`, all of them prompt) and `output_tokens`, in a body, or in a
    /// stream's `message_start` and then its `message_delta` events.
    Messages,
}

/// Usage as the Responses API and Anthropic write it; every count optional, since a stream
/// gives them a few at a time.
#[derive(Deserialize)]
struct TypedUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

impl TypedUsage {
    /// Folds these counts into what was read so far: a prompt count replaces the prompt, an
    /// output count the completion (Anthropic's `message_delta` counts are cumulative).
    fn fold_into(&self, usage: &mut Option<Usage>) {
        let prompt = self.input_tokens.map(|input| {
            input
                + self.cache_creation_input_tokens.unwrap_or(0)
                + self.cache_read_input_tokens.unwrap_or(0)
        });
        if prompt.is_none() && self.output_tokens.is_none() {
            return;
        }
        let current = usage.get_or_insert_with(Usage::default);
        if let Some(prompt) = prompt {
            current.prompt_tokens = prompt;
        }
        if let Some(output) = self.output_tokens {
            current.completion_tokens = output;
        }
    }
}

/// A Responses or Anthropic body, or one of their stream events: the usage may sit at the top
/// (a body, `message_delta`), in `response` (`response.completed`) or in `message`
/// (`message_start`).
#[derive(Deserialize)]
struct TypedReply {
    usage: Option<TypedUsage>,
    response: Option<Box<TypedReply>>,
    message: Option<Box<TypedReply>>,
}

impl TypedReply {
    fn fold_into(&self, usage: &mut Option<Usage>) {
        for nested in [&self.response, &self.message].into_iter().flatten() {
            nested.fold_into(usage);
        }
        if let Some(found) = &self.usage {
            found.fold_into(usage);
        }
    }
}

fn typed_usage(bytes: &[u8], usage: &mut Option<Usage>) {
    if let Ok(reply) = serde_json::from_slice::<TypedReply>(bytes) {
        reply.fold_into(usage);
    }
}

impl UsageFormat {
    fn body_usage(self, body: &[u8]) -> Option<Usage> {
        match self {
            UsageFormat::Chat => json_usage(body),
            UsageFormat::Responses | UsageFormat::Messages => {
                let mut usage = None;
                typed_usage(body, &mut usage);
                usage
            }
        }
    }
}

/// What the relay reports, once each: the first bytes out, and the usage at the end.
pub trait UsageObserver: Send + 'static {
    fn first_bytes(&mut self);
    fn finished(&mut self, usage: Option<Usage>);
}

enum Mode {
    /// The body as relayed so far; `None` beyond `MAX_JSON_COPY`, where it is relayed
    /// without reading its usage.
    Json(Option<Gathered>),
    Sse {
        injected: bool,
        usage: Option<Usage>,
    },
}

pub struct UsageTap<S, O: UsageObserver> {
    inner: S,
    format: UsageFormat,
    pending: BytesMut,
    mode: Mode,
    observer: Option<O>,
    seen_bytes: bool,
    done: bool,
}

impl<S, O: UsageObserver> UsageTap<S, O> {
    pub fn json(inner: S, observer: O) -> Self {
        Self::with_mode(inner, observer, Mode::Json(Some(Gathered::Empty)))
    }

    /// `injected`: condenser asked upstream for usage that the client did not want.
    pub fn sse(inner: S, observer: O, injected: bool) -> Self {
        Self::with_mode(
            inner,
            observer,
            Mode::Sse {
                injected,
                usage: None,
            },
        )
    }

    fn with_mode(inner: S, observer: O, mode: Mode) -> Self {
        UsageTap {
            inner,
            format: UsageFormat::Chat,
            pending: BytesMut::new(),
            mode,
            observer: Some(observer),
            seen_bytes: false,
            done: false,
        }
    }

    /// Reads usage as `format` writes it; a chat completion's unless said.
    pub fn reading(mut self, format: UsageFormat) -> Self {
        self.format = format;
        self
    }

    /// Runs at the end of the stream and again on drop; only the first reads the usage.
    fn finish(&mut self) {
        let Some(mut observer) = self.observer.take() else {
            return;
        };
        let usage = match &self.mode {
            Mode::Json(copy) => copy
                .as_ref()
                .and_then(|body| self.format.body_usage(body.bytes())),
            Mode::Sse { usage, .. } => *usage,
        };
        observer.finished(usage);
    }

    fn note_output(&mut self) {
        if !self.seen_bytes {
            self.seen_bytes = true;
            if let Some(observer) = &mut self.observer {
                observer.first_bytes();
            }
        }
    }
}

/// hyper stops polling a body once its declared length is sent, and a client may leave early:
/// either way the relay is dropped, and reports what it saw.
impl<S, O: UsageObserver> Drop for UsageTap<S, O> {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Length of the first complete SSE event (blank-line terminated) in `buf`, terminator included.
fn complete_event_len(buf: &[u8]) -> Option<usize> {
    [&b"\n\n"[..], b"\r\n\r\n", b"\r\r"]
        .iter()
        .filter_map(|end| {
            buf.windows(end.len())
                .position(|w| w == *end)
                .map(|p| p + end.len())
        })
        .min()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memmem::find(haystack, needle).is_some()
}

/// Once usage is requested, OpenAI adds `"usage":null` to every chunk; a client that did not
/// ask for usage gets its chunks without it.
fn without_null_usage(event: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(event);
    [
        ",\"usage\":null",
        ", \"usage\": null",
        "\"usage\":null,",
        "\"usage\": null, ",
    ]
    .iter()
    .fold(text.into_owned(), |t, pattern| t.replace(pattern, ""))
    .into_bytes()
}

/// Appends the event to `out` as the client should see it, recording any usage it carries.
/// `injected`: condenser asked for usage and the client did not, so it is hidden.
fn relay_event(
    event: &[u8],
    format: UsageFormat,
    injected: bool,
    usage: &mut Option<Usage>,
    out: &mut BytesMut,
) {
    if format != UsageFormat::Chat {
        // Relayed as it came; only events that mention usage are parsed.
        if contains(event, b"\"usage\"") {
            for line in String::from_utf8_lossy(event).lines() {
                if let Some(data) = line.strip_prefix("data:") {
                    typed_usage(data.trim().as_bytes(), usage);
                }
            }
        }
        out.extend_from_slice(event);
        return;
    }
    // Only chunks mentioning usage are worth parsing.
    if !contains(event, b"\"usage\"") {
        out.extend_from_slice(event);
        return;
    }
    let cleaned;
    let event = if injected && contains(event, b"null") {
        cleaned = without_null_usage(event);
        if !contains(&cleaned, b"\"usage\"") {
            out.extend_from_slice(&cleaned);
            return;
        }
        &cleaned[..]
    } else {
        event
    };
    let text = String::from_utf8_lossy(event);
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let Some(chunk) = WithUsage::parse(data.trim().as_bytes()) else {
            continue;
        };
        if let Some(found) = chunk.usage() {
            *usage = Some(found);
            let usage_only = chunk.choices.as_ref().is_some_and(Vec::is_empty);
            if injected && usage_only {
                return;
            }
        }
    }
    out.extend_from_slice(event);
}

/// A body itself rather than a stream adapted into one: hyper polls it directly, and a JSON
/// body keeps its length and end-of-stream as upstream declared them.
impl<B, O> Body for UsageTap<B, O>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
    O: UsageObserver + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        loop {
            let next = ready!(Pin::new(&mut this.inner).poll_frame(cx));
            let chunk = match next {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(chunk) => chunk,
                    // Trailers: nothing to read in them.
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    this.done = true;
                    let rest = this.pending.split();
                    let mut out = BytesMut::new();
                    if let Mode::Sse { injected, usage } = &mut this.mode {
                        relay_event(&rest, this.format, *injected, usage, &mut out);
                    }
                    if !out.is_empty() {
                        this.note_output();
                    }
                    this.finish();
                    return Poll::Ready((!out.is_empty()).then(|| Ok(Frame::data(out.freeze()))));
                }
            };
            match &mut this.mode {
                Mode::Json(copy) => {
                    match copy {
                        Some(body) if body.bytes().len() + chunk.len() > MAX_JSON_COPY => {
                            *copy = None
                        }
                        Some(body) => body.push(&chunk),
                        None => {}
                    }
                    this.note_output();
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                Mode::Sse { injected, usage } => {
                    this.pending.extend_from_slice(&chunk);
                    let mut out = BytesMut::new();
                    while let Some(len) = complete_event_len(&this.pending) {
                        let event = this.pending.split_to(len);
                        relay_event(&event, this.format, *injected, usage, &mut out);
                    }
                    if !out.is_empty() {
                        this.note_output();
                        return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                    }
                }
            }
        }
    }

    /// Once a JSON body's declared length has passed, hyper need not poll again; dropping the
    /// tap then reads the usage.
    fn is_end_stream(&self) -> bool {
        self.done || matches!(self.mode, Mode::Json(_)) && self.inner.is_end_stream()
    }

    /// An SSE stream may lose its usage chunk on the way, so only a JSON body's size stands.
    fn size_hint(&self) -> SizeHint {
        match self.mode {
            Mode::Json(_) => self.inner.size_hint(),
            Mode::Sse { .. } => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::Stream;
    use http_body_util::{BodyExt, Full, StreamBody};
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<(u32, Option<Usage>)>>);

    impl UsageObserver for Seen {
        fn first_bytes(&mut self) {
            self.0.lock().unwrap().0 += 1;
        }
        fn finished(&mut self, usage: Option<Usage>) {
            self.0.lock().unwrap().1 = usage;
        }
    }

    async fn run(chunks: Vec<&'static str>, strip: bool) -> (String, Seen) {
        let seen = Seen::default();
        let chunks = chunks.into_iter().map(|c| Bytes::from_static(c.as_bytes()));
        let tap = UsageTap::sse(stream_of(chunks), seen.clone(), strip);
        (relayed(tap).await, seen)
    }

    fn stream_of(
        chunks: impl IntoIterator<Item = Bytes>,
    ) -> StreamBody<impl Stream<Item = Result<Frame<Bytes>, BoxError>> + Unpin> {
        StreamBody::new(futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|chunk| Ok::<_, BoxError>(Frame::data(chunk)))
                .collect::<Vec<_>>(),
        ))
    }

    async fn relayed<B>(mut tap: UsageTap<B, Seen>) -> String
    where
        B: Body<Data = Bytes, Error = BoxError> + Unpin,
    {
        let mut text = String::new();
        while let Some(frame) = tap.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            text.push_str(std::str::from_utf8(&data).unwrap());
        }
        text
    }

    async fn typed(format: UsageFormat, chunks: Vec<&'static str>, sse: bool) -> (String, Seen) {
        let seen = Seen::default();
        let chunks = chunks.into_iter().map(|c| Bytes::from_static(c.as_bytes()));
        let tap = if sse {
            UsageTap::sse(stream_of(chunks), seen.clone(), false)
        } else {
            UsageTap::json(stream_of(chunks), seen.clone())
        };
        (relayed(tap.reading(format)).await, seen)
    }

    #[tokio::test]
    async fn a_responses_stream_is_relayed_as_sent_and_its_usage_read_at_completion() {
        let events = vec![
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"usage\"}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[],",
            "\"usage\":{\"input_tokens\":120,\"input_tokens_details\":{\"cached_tokens\":100},\"output_tokens\":9}}}\n\n",
        ];
        let sent: String = events.concat();
        let (text, seen) = typed(UsageFormat::Responses, events, true).await;
        assert_eq!(text, sent);
        let usage = seen.0.lock().unwrap().1;
        assert_eq!(
            usage,
            Some(Usage {
                prompt_tokens: 120,
                completion_tokens: 9
            })
        );
        let body = r#"{"id":"r","output":[],"usage":{"input_tokens":5,"output_tokens":2,"total_tokens":7}}"#;
        let (_, seen) = typed(UsageFormat::Responses, vec![body], false).await;
        assert_eq!(
            seen.0
                .lock()
                .unwrap()
                .1
                .map(|u| (u.prompt_tokens, u.completion_tokens)),
            Some((5, 2))
        );
    }

    #[tokio::test]
    async fn an_anthropic_stream_counts_cache_tokens_as_prompt_and_the_last_delta_as_output() {
        let events = vec![
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":3,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\n\n",
            "event: ping\ndata: {\"type\":\"ping\"}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ];
        let sent: String = events.concat();
        let (text, seen) = typed(UsageFormat::Messages, events, true).await;
        assert_eq!(text, sent);
        assert_eq!(
            seen.0.lock().unwrap().1,
            Some(Usage {
                prompt_tokens: 18,
                completion_tokens: 7
            })
        );
        let body = r#"{"id":"m","content":[],"usage":{"input_tokens":4,"cache_read_input_tokens":6,"output_tokens":2}}"#;
        let (_, seen) = typed(UsageFormat::Messages, vec![body], false).await;
        assert_eq!(
            seen.0
                .lock()
                .unwrap()
                .1
                .map(|u| (u.prompt_tokens, u.completion_tokens)),
            Some((10, 2))
        );
        let (_, seen) = typed(UsageFormat::Messages, vec![r#"{"type":"error"}"#], false).await;
        assert_eq!(seen.0.lock().unwrap().1, None, "no usage, none read");
    }

    const COMPLETION: &str = r#"{"id":"c","choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}"#;

    /// Relays `body` cut at `cuts` and returns what the observer saw.
    async fn json_relay(body: &'static str, cuts: &[usize]) -> (String, Seen) {
        let seen = Seen::default();
        let mut chunks = Vec::new();
        let mut from = 0;
        for &at in cuts.iter().chain([&body.len()]) {
            chunks.push(Bytes::from_static(&body.as_bytes()[from..at]));
            from = at;
        }
        let text = relayed(UsageTap::json(stream_of(chunks), seen.clone())).await;
        (text, seen)
    }

    #[tokio::test]
    async fn json_usage_is_read_from_one_chunk_or_several() {
        let key = COMPLETION.find("\"usage\"").unwrap();
        for cuts in [
            &[][..],
            &[0],
            &[10],
            &[key + 3],
            &[5, key + 3, COMPLETION.len() - 2],
            &[COMPLETION.len()],
        ] {
            let (text, seen) = json_relay(COMPLETION, cuts).await;
            assert_eq!(text, COMPLETION, "{cuts:?}");
            let (first, usage) = *seen.0.lock().unwrap();
            assert_eq!(first, 1, "{cuts:?}");
            assert_eq!(
                usage,
                Some(Usage {
                    prompt_tokens: 3,
                    completion_tokens: 4
                }),
                "{cuts:?}"
            );
        }
        let (_, seen) = json_relay(r#"{"choices":[]}"#, &[4]).await;
        assert_eq!(seen.0.lock().unwrap().1, None);
    }

    #[tokio::test]
    async fn a_json_body_keeps_its_length_and_ends_without_another_poll() {
        let seen = Seen::default();
        let body = Full::new(Bytes::from_static(COMPLETION.as_bytes())).map_err(BoxError::from);
        let mut tap = UsageTap::json(body, seen.clone());
        assert_eq!(tap.size_hint().exact(), Some(COMPLETION.len() as u64));
        assert!(!tap.is_end_stream());
        let data = tap.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(data, COMPLETION.as_bytes());
        // hyper stops here and drops the body: that is when the usage is read.
        assert!(tap.is_end_stream());
        assert_eq!(seen.0.lock().unwrap().1, None);
        drop(tap);
        assert_eq!(
            seen.0.lock().unwrap().1,
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 4
            })
        );

        let sse = UsageTap::sse(
            Full::new(Bytes::from_static(b"data: [DONE]\n\n")).map_err(BoxError::from),
            Seen::default(),
            true,
        );
        assert_eq!(sse.size_hint().exact(), None, "an SSE body may shrink");
    }

    #[tokio::test]
    async fn json_body_beyond_the_copy_limit_is_relayed_without_usage() {
        let filler = Bytes::from(vec![b' '; MAX_JSON_COPY / 2]);
        let chunks = [
            filler.clone(),
            filler,
            Bytes::from_static(COMPLETION.as_bytes()),
        ];
        let seen = Seen::default();
        let text = relayed(UsageTap::json(stream_of(chunks), seen.clone())).await;
        assert_eq!(text.len(), MAX_JSON_COPY + COMPLETION.len());
        assert_eq!(seen.0.lock().unwrap().1, None);
    }

    #[test]
    fn json_usage_is_read_from_the_end_unless_the_end_is_a_string() {
        let plain = br#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7},"system_fingerprint":"fp"}"#;
        let found = json_usage(plain).unwrap();
        assert_eq!((found.prompt_tokens, found.completion_tokens), (3, 4));
        // The last "usage" is a string value, or a nested key of another shape: the whole
        // body is read instead.
        for tricky in [
            &br#"{"usage":{"prompt_tokens":3,"completion_tokens":4},"meta":{"kind":"usage"}}"#[..],
            br#"{"usage":{"prompt_tokens":3,"completion_tokens":4},"meta":{"usage":"n/a"}}"#,
        ] {
            let found = json_usage(tricky).unwrap();
            assert_eq!((found.prompt_tokens, found.completion_tokens), (3, 4));
        }
        assert_eq!(json_usage(br#"{"choices":[]}"#), None);
    }

    #[test]
    fn the_last_usage_key_is_found_near_the_end_or_further_back() {
        let usage = br#""usage":{"prompt_tokens":3,"completion_tokens":4}"#;
        for (before, after) in [
            (0, 0),
            (10, 10),
            (5_000, 10),
            (10, 5_000),
            (5_000, USAGE_TAIL_BYTES - 30),
        ] {
            let body = [
                &br#"{"a":""#[..],
                &vec![b'x'; before],
                br#"","usage":{"prompt_tokens":1,"completion_tokens":1},"#,
                usage,
                br#","b":""#,
                &vec![b'y'; after],
                br#""}"#,
            ]
            .concat();
            let at = last_usage_key(&body).unwrap();
            assert_eq!(&body[at..at + usage.len()], usage, "{before}/{after}");
            assert_eq!(
                json_usage(&body),
                Some(Usage {
                    prompt_tokens: 3,
                    completion_tokens: 4
                }),
                "{before}/{after}"
            );
        }
        // The key straddling the edge of the searched tail: it starts 3 bytes before it.
        let filler = USAGE_TAIL_BYTES + 4 - (1 + usage.len() + 6 + 2);
        let body = [
            &b"{"[..],
            usage,
            br#","b":""#,
            &vec![b'y'; filler],
            br#""}"#,
        ]
        .concat();
        assert_eq!(body.len() - USAGE_TAIL_BYTES, 4);
        assert_eq!(last_usage_key(&body), Some(1));
        assert_eq!(last_usage_key(br#"{"choices":[]}"#), None);
    }

    /// The plain reader against `serde` on the shapes upstreams send and on ones it must
    /// leave to `serde`: where it reads a usage, `serde` reads the same.
    #[test]
    fn plain_usage_agrees_with_serde() {
        let serde =
            |object: &str| Usage::deserialize(&mut serde_json::Deserializer::from_str(object)).ok();
        let read = [
            r#"{"prompt_tokens":120,"completion_tokens":18,"total_tokens":138}"#,
            r#"{ "completion_tokens" : 7 , "prompt_tokens" : 0 }"#,
            r#"{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"accepted_prediction_tokens":0}}"#,
            r#"{"x":{"prompt_tokens":1,"completion_tokens":2},"prompt_tokens":3,"completion_tokens":4}"#,
            r#"{"note":"a } and a { and \"quotes\"","prompt_tokens":5,"completion_tokens":6}"#,
        ];
        for object in read {
            let plain = if object.contains('\\') {
                None
            } else {
                plain_usage(object.as_bytes())
            };
            assert_eq!(plain.or_else(|| serde(object)), serde(object), "{object}");
            assert!(serde(object).is_some(), "{object}");
        }
        assert_eq!(
            plain_usage(read[3].as_bytes()),
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 4
            }),
            "nested counts are not the response's"
        );
        for object in [
            r#"{"prompt_tokens":1.5,"completion_tokens":2}"#,
            r#"{"prompt_tokens":-1,"completion_tokens":2}"#,
            r#"{"prompt_tokens":01,"completion_tokens":2}"#,
            r#"{"prompt_tokens":1,"prompt_tokens":2,"completion_tokens":2}"#,
            r#"{"prompt_tokens":1}"#,
            r#"{"prompt_tokens":"1","completion_tokens":2}"#,
            r#"{"prompt_tokens":1,"completion_tokens":99999999999999999999999}"#,
            r#"{"prompt_tokens":1,"completion_tokens":2"#,
            r#"{"pro\u006dpt_tokens":1,"completion_tokens":2}"#,
        ] {
            assert_eq!(plain_usage(object.as_bytes()), None, "{object}");
        }
        // What serde makes of those, the tap still gets: the plain reader only steps aside.
        let escaped = br#"{"pro\u006dpt_tokens":1,"completion_tokens":2}"#;
        assert_eq!(
            tail_usage(&[&b"{\"usage\":"[..], escaped, b"}"].concat()),
            serde(std::str::from_utf8(escaped).unwrap())
        );
    }

    #[tokio::test]
    async fn usage_chunk_is_read_and_stripped_across_split_chunks() {
        let usage =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\n";
        let (text, seen) = run(
            vec![
                "data: {\"choices\":[{\"delta\":{}}]}\n",
                "\ndata: {\"choi",
                &usage[12..],
                "data: [DONE]\n\n",
            ],
            true,
        )
        .await;
        assert_eq!(
            text,
            "data: {\"choices\":[{\"delta\":{}}]}\n\ndata: [DONE]\n\n"
        );
        let (first, got) = *seen.0.lock().unwrap();
        assert_eq!(first, 1);
        assert_eq!(
            got,
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 3
            })
        );
        let (text, _) = run(vec![usage, "data: [DONE]\n\n"], false).await;
        assert!(text.starts_with(usage));
    }

    #[tokio::test]
    async fn null_usage_is_hidden_only_from_clients_that_did_not_ask() {
        let chunk = "data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\r\n\r\n";
        let (text, seen) = run(vec![chunk, "data: [DONE]\r\n\r\n"], true).await;
        assert_eq!(text, "data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n");
        assert_eq!(seen.0.lock().unwrap().1, None);
        let (text, _) = run(vec![chunk], false).await;
        assert_eq!(text, chunk);
    }
}
