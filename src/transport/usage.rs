//! Reads token usage out of responses as they pass, without delaying them: JSON bodies are
//! kept aside while relayed, SSE streams are relayed event by event. Each dialect reads
//! usage its own way (`UsageReader`), and may keep an event from the client (the usage-only
//! chunk that condenser itself asked for of a chat completion).

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use memchr::memmem;

use crate::observe::metrics::BilledTokens;
use crate::transport::body::{BoxError, Gathered};
use crate::transport::events::{self, EventBound, EventReader, Piece};

/// A JSON body larger than this is relayed without reading its usage.
const MAX_JSON_COPY: usize = 16 * 1024 * 1024;

/// What one reply says it cost, as its dialect's reader found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Of the prompt, the tokens the provider served from its prompt cache (billed at about
    /// a tenth); 0 where it reported none.
    pub cached_tokens: u64,
    /// Of the prompt, the tokens the provider wrote to its prompt cache (Anthropic bills them
    /// above the input price); 0 where it reported none.
    pub cache_write_tokens: u64,
}

/// The counts one JSON document of a reply carries, each where it was written.
#[derive(Debug, Clone, Copy, Default)]
pub struct UsageCounts {
    pub prompt: Option<u64>,
    pub completion: Option<u64>,
    pub cached: Option<u64>,
    pub cache_write: Option<u64>,
}

impl Usage {
    /// Folds counts read so far of a stream into `usage`: each count written replaces its
    /// own (Anthropic's `message_delta` counts are cumulative), and what is not written
    /// stays. Counts with none written leave it as it was.
    pub fn fold(usage: &mut Option<Usage>, counts: UsageCounts) {
        let written = [
            counts.prompt,
            counts.completion,
            counts.cached,
            counts.cache_write,
        ];
        if written.iter().all(Option::is_none) {
            return;
        }
        let current = usage.get_or_insert_with(Usage::default);
        let slots = [
            &mut current.prompt_tokens,
            &mut current.completion_tokens,
            &mut current.cached_tokens,
            &mut current.cache_write_tokens,
        ];
        for (slot, count) in slots.into_iter().zip(written) {
            if let Some(count) = count {
                *slot = count;
            }
        }
    }

    /// The reply's tokens by the tier each is billed at: what is neither read from the
    /// prompt cache nor written to it is the uncached rest of the prompt.
    pub fn billed(&self) -> BilledTokens {
        BilledTokens {
            uncached: self
                .prompt_tokens
                .saturating_sub(self.cached_tokens + self.cache_write_tokens),
            cache_read: self.cached_tokens,
            cache_write: self.cache_write_tokens,
            output: self.completion_tokens,
        }
    }
}

/// How one API's replies carry usage; each dialect supplies one.
pub trait UsageReader: Send + Sync + 'static {
    /// Folds the usage that one JSON document (a body, or an event's data) carries into
    /// `usage`.
    fn fold(&self, json: &[u8], usage: &mut Option<Usage>);

    /// The usage of a whole JSON body.
    fn body_usage(&self, body: &[u8]) -> Option<Usage> {
        let mut usage = None;
        self.fold(body, &mut usage);
        usage
    }

    /// The key whose mention makes an SSE event worth parsing for usage.
    fn usage_key(&self) -> &'static [u8] {
        b"\"usage\""
    }

    /// One SSE event as the client should see it (`None`: kept from it), recording any usage
    /// it carries. `injected`: condenser asked for usage and the client did not. Unless a
    /// dialect says otherwise, an event is relayed as it came, and only events that mention
    /// its `usage_key` are parsed.
    fn relay_event(
        &self,
        event: Bytes,
        _injected: bool,
        usage: &mut Option<Usage>,
    ) -> Option<Bytes> {
        if contains(&event, self.usage_key()) {
            if let Some(data) = events::data(&event) {
                self.fold(&data, usage);
            }
        }
        Some(event)
    }
}

pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memmem::find(haystack, needle).is_some()
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
        events: EventReader,
        injected: bool,
        usage: Option<Usage>,
    },
}

pub struct UsageTap<S, O: UsageObserver> {
    inner: S,
    reader: &'static dyn UsageReader,
    mode: Mode,
    observer: Option<O>,
    seen_bytes: bool,
    done: bool,
}

impl<S, O: UsageObserver> UsageTap<S, O> {
    pub fn json(inner: S, reader: &'static dyn UsageReader, observer: O) -> Self {
        Self::with_mode(inner, reader, observer, Mode::Json(Some(Gathered::Empty)))
    }

    /// `injected`: condenser asked upstream for usage that the client did not want.
    pub fn sse(
        inner: S,
        reader: &'static dyn UsageReader,
        observer: O,
        injected: bool,
        bound: EventBound,
    ) -> Self {
        Self::with_mode(
            inner,
            reader,
            observer,
            Mode::Sse {
                events: EventReader::new(bound),
                injected,
                usage: None,
            },
        )
    }

    fn with_mode(inner: S, reader: &'static dyn UsageReader, observer: O, mode: Mode) -> Self {
        UsageTap {
            inner,
            reader,
            mode,
            observer: Some(observer),
            seen_bytes: false,
            done: false,
        }
    }

    /// Runs at the end of the stream and again on drop; only the first reads the usage.
    fn finish(&mut self) {
        let Some(mut observer) = self.observer.take() else {
            return;
        };
        let usage = match &self.mode {
            Mode::Json(copy) => copy
                .as_ref()
                .and_then(|body| self.reader.body_usage(body.bytes())),
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

/// An event as the client should see it (`UsageReader::relay_event`); bytes of one over the
/// bound as they came. Gathered, not copied, while one piece goes: a stream holds one copy of
/// an event.
fn relay_piece(
    reader: &dyn UsageReader,
    piece: Piece,
    injected: bool,
    usage: &mut Option<Usage>,
    out: &mut Gathered,
) {
    let relayed = match piece {
        Piece::Event(event) => reader.relay_event(event, injected, usage),
        Piece::Uninspected(bytes) => Some(bytes),
    };
    if let Some(bytes) = relayed {
        out.push(&bytes);
    }
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
                    let mut out = Gathered::Empty;
                    if let Mode::Sse {
                        events,
                        injected,
                        usage,
                    } = &mut this.mode
                    {
                        if let Some(piece) = events.rest() {
                            relay_piece(this.reader, piece, *injected, usage, &mut out);
                        }
                    }
                    let out = out.into_bytes();
                    if !out.is_empty() {
                        this.note_output();
                    }
                    this.finish();
                    return Poll::Ready((!out.is_empty()).then(|| Ok(Frame::data(out))));
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
                Mode::Sse {
                    events,
                    injected,
                    usage,
                } => {
                    events.push(chunk);
                    let mut out = Gathered::Empty;
                    while let Some(piece) = events.next_piece() {
                        relay_piece(this.reader, piece, *injected, usage, &mut out);
                    }
                    let out = out.into_bytes();
                    if !out.is_empty() {
                        this.note_output();
                        return Poll::Ready(Some(Ok(Frame::data(out))));
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

    use crate::dialect::chat::usage::ChatUsage;
    use crate::dialect::messages::usage::MessagesUsage;
    use crate::dialect::responses::usage::ResponsesUsage;
    use crate::transport::events::test_bound;

    const CHAT: &dyn UsageReader = &ChatUsage;

    fn counts(usage: Usage) -> (u64, u64, u64) {
        (
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.cached_tokens,
        )
    }

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
        let tap = UsageTap::sse(
            stream_of(chunks),
            CHAT,
            seen.clone(),
            strip,
            test_bound(1 << 20),
        );
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

    async fn typed(
        reader: &'static dyn UsageReader,
        chunks: Vec<&'static str>,
        sse: bool,
    ) -> (String, Seen) {
        let seen = Seen::default();
        let chunks = chunks.into_iter().map(|c| Bytes::from_static(c.as_bytes()));
        let tap = if sse {
            UsageTap::sse(
                stream_of(chunks),
                reader,
                seen.clone(),
                false,
                test_bound(1 << 20),
            )
        } else {
            UsageTap::json(stream_of(chunks), reader, seen.clone())
        };
        (relayed(tap).await, seen)
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
        let (text, seen) = typed(&ResponsesUsage, events, true).await;
        assert_eq!(text, sent);
        let usage = seen.0.lock().unwrap().1;
        assert_eq!(
            usage,
            Some(Usage {
                prompt_tokens: 120,
                completion_tokens: 9,
                cached_tokens: 100,
                cache_write_tokens: 0,
            })
        );
        let body = r#"{"id":"r","output":[],"usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":3},"output_tokens":2,"total_tokens":7}}"#;
        let (_, seen) = typed(&ResponsesUsage, vec![body], false).await;
        assert_eq!(seen.0.lock().unwrap().1.map(counts), Some((5, 2, 3)));
        let body = r#"{"id":"r","output":[],"usage":{"input_tokens":5,"output_tokens":2}}"#;
        let (_, seen) = typed(&ResponsesUsage, vec![body], false).await;
        assert_eq!(seen.0.lock().unwrap().1.map(counts), Some((5, 2, 0)));
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
        let (text, seen) = typed(&MessagesUsage, events, true).await;
        assert_eq!(text, sent);
        assert_eq!(
            seen.0.lock().unwrap().1,
            Some(Usage {
                prompt_tokens: 18,
                completion_tokens: 7,
                cached_tokens: 5,
                cache_write_tokens: 3,
            })
        );
        // `input_tokens` leaves out both the cache's reads and its writes.
        assert_eq!(
            seen.0.lock().unwrap().1.map(|usage| usage.billed()),
            Some(BilledTokens {
                uncached: 10,
                cache_read: 5,
                cache_write: 3,
                output: 7,
            })
        );
        let body = r#"{"id":"m","content":[],"usage":{"input_tokens":4,"cache_read_input_tokens":6,"output_tokens":2}}"#;
        let (_, seen) = typed(&MessagesUsage, vec![body], false).await;
        assert_eq!(seen.0.lock().unwrap().1.map(counts), Some((10, 2, 6)));
        // The current API repeats the prompt counts, cumulative, in `message_delta`.
        let events = vec![
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":40,\"output_tokens\":7}}\n\n",
        ];
        let (_, seen) = typed(&MessagesUsage, events, true).await;
        assert_eq!(seen.0.lock().unwrap().1.map(counts), Some((50, 7, 40)));
        let (_, seen) = typed(&MessagesUsage, vec![r#"{"type":"error"}"#], false).await;
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
        let text = relayed(UsageTap::json(stream_of(chunks), CHAT, seen.clone())).await;
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
                    completion_tokens: 4,
                    cached_tokens: 0,
                    cache_write_tokens: 0,
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
        let mut tap = UsageTap::json(body, CHAT, seen.clone());
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
                completion_tokens: 4,
                cached_tokens: 0,
                cache_write_tokens: 0,
            })
        );

        let sse = UsageTap::sse(
            Full::new(Bytes::from_static(b"data: [DONE]\n\n")).map_err(BoxError::from),
            CHAT,
            Seen::default(),
            true,
            test_bound(1 << 20),
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
        let text = relayed(UsageTap::json(stream_of(chunks), CHAT, seen.clone())).await;
        assert_eq!(text.len(), MAX_JSON_COPY + COMPLETION.len());
        assert_eq!(seen.0.lock().unwrap().1, None);
    }

    #[tokio::test]
    async fn usage_chunk_is_read_and_stripped_across_split_chunks() {
        let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\n";
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
                completion_tokens: 3,
                cached_tokens: 2,
                cache_write_tokens: 0,
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
