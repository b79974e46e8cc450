//! The one body type the server and the upstream client speak, and ways to make it.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Body, Frame, SizeHint};
use hyper::{header, HeaderMap, Response, StatusCode};
use tokio::time::{Instant, Sleep};

use crate::error::ProxyError;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// The length a message's `Content-Length` declares, when it declares one that parses.
pub fn declared_length(headers: &hyper::HeaderMap) -> Option<u64> {
    headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// A JSON reply with `status`: how condenser writes the errors it answers itself.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<ProxyBody> {
    let mut response = Response::new(full(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The most a joined body's buffer reserves on its declared length alone, before the bytes
/// come: four times an agent's largest request measured (826 KB), far under the default
/// `max_body_bytes` (32 MiB).
const RESERVED_AHEAD: usize = 4 << 20;

/// Chunks gathered into one body. Most bodies come in one chunk, which is kept as it came;
/// only several are joined.
#[derive(Default)]
pub enum Gathered {
    #[default]
    Empty,
    One(Bytes),
    Joined(BytesMut),
}

impl Gathered {
    pub fn push(&mut self, chunk: &Bytes) {
        self.push_toward(chunk, 0);
    }

    /// `push`, a joined body's buffer made `total` bytes long at once when that is how long the
    /// body says it is: an agent request's 826 KB came in ten frames, and its buffer grew five
    /// times, 1.0M of its 13.9M instructions (`bench/instruction_budget.sh`, callgrind). At most
    /// `RESERVED_AHEAD` is taken on the body's word: a client that declares the whole
    /// `max_body_bytes` and sends two small frames gets no more than that held for it.
    pub fn push_toward(&mut self, chunk: &Bytes, total: usize) {
        match self {
            _ if chunk.is_empty() => {}
            Gathered::Empty => *self = Gathered::One(chunk.clone()),
            Gathered::One(first) => {
                let ahead = total.min(RESERVED_AHEAD);
                let mut joined = BytesMut::with_capacity(ahead.max(first.len() + chunk.len()));
                joined.extend_from_slice(first);
                joined.extend_from_slice(chunk);
                *self = Gathered::Joined(joined);
            }
            Gathered::Joined(joined) => joined.extend_from_slice(chunk),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            Gathered::Empty => &[],
            Gathered::One(body) => body,
            Gathered::Joined(body) => body,
        }
    }

    pub fn into_bytes(self) -> Bytes {
        match self {
            Gathered::Empty => Bytes::new(),
            Gathered::One(body) => body,
            Gathered::Joined(body) => body.freeze(),
        }
    }
}

/// A request body grew past `max_body_bytes` while it was being relayed.
#[derive(Debug, thiserror::Error)]
#[error("request body exceeds the limit of {0} bytes")]
pub struct BodyLimitExceeded(pub usize);

/// The client's body, relayed frame by frame, failing once more than `limit` bytes have
/// passed. A declared length within the limit stays in the size hint, so it is forwarded as
/// such.
pub fn limited<B>(body: B, limit: usize) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    // `Limited`'s own error does not say what the limit was; the client's 413 does.
    Limited::new(body, limit)
        .map_err(move |error| {
            if error.is::<LengthLimitError>() {
                BodyLimitExceeded(limit).into()
            } else {
                error
            }
        })
        .boxed_unsync()
}

/// The least rate a large body must keep up: each `MIN_BODY_RATE` bytes received earns a
/// second past `server.body_read_timeout_secs`, so a body that arrives at least this fast is
/// never cut, and one that stalls is, whatever it declared.
pub const MIN_BODY_RATE: u64 = 64 * 1024;

/// A request body not received whole in time: answered 408, and its connection closed, with
/// what was held of it.
#[derive(Debug, thiserror::Error)]
#[error("the request body was not received in time: {received} bytes in {secs} s, under {MIN_BODY_RATE} bytes a second past the first {timeout} s")]
pub struct BodyReadTimeout {
    pub received: u64,
    pub secs: u64,
    pub timeout: u64,
}

/// Upstream sent nothing for longer than its timeout in the middle of a body.
#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0} s")]
pub struct UpstreamSilent(pub u64);

/// `body`, failing once it has been waiting on upstream for `timeout` without a frame.
pub fn with_idle_timeout<B>(body: B, timeout: Duration) -> IdleTimeout<B> {
    IdleTimeout {
        inner: body,
        timeout,
        silence: None,
        armed: false,
    }
}

/// Hand-written, not tower-http's `TimeoutBody` (tried in round nine): that one passes on
/// neither `is_end_stream` nor `size_hint`, so hyper could no longer send a chunked reply's
/// last chunk with its end, and it arms a timer for every frame; this one touches the timer
/// only while upstream is silent.
pub struct IdleTimeout<B> {
    inner: B,
    timeout: Duration,
    /// Made the first time a poll finds nothing to read, then re-armed: a body that is
    /// always ready never touches the timer, and a stream does not allocate per pause.
    silence: Option<Pin<Box<Sleep>>>,
    /// Whether `silence` counts from the current pause; a frame ends the pause.
    armed: bool,
}

impl<B> Body for IdleTimeout<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.armed = false;
            return Poll::Ready(frame);
        }
        let timeout = this.timeout;
        let silence = match &mut this.silence {
            Some(silence) if this.armed => silence,
            Some(silence) => {
                silence.as_mut().reset(Instant::now() + timeout);
                silence
            }
            None => this.silence.insert(Box::pin(tokio::time::sleep(timeout))),
        };
        this.armed = true;
        ready!(silence.as_mut().poll(cx));
        this.armed = false;
        Poll::Ready(Some(Err(UpstreamSilent(this.timeout.as_secs()).into())))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The body as one `Bytes`. A small body with a Content-Length arrives as one frame and is
/// returned as it came, with no copy or buffer list; only a body in several frames is joined.
/// Reading stops once the body says it has ended, without waiting for its channel to close.
pub async fn read_body<B>(body: B, headers: &HeaderMap, limit: usize) -> Result<Bytes, ProxyError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let declared = declared_length(headers);
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    // Within the limit, so no larger than a body that may come.
    let total = declared.map_or(0, |len| len as usize);
    let mut body = Limited::new(body, limit);
    let mut gathered = Gathered::Empty;
    while !body.is_end_stream() {
        let Some(frame) = body.frame().await else {
            break;
        };
        let frame = frame.map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                ProxyError::BodyTooLarge { limit }
            } else if e.is::<BodyReadTimeout>() {
                ProxyError::BodyReadTimeout(e.to_string())
            } else {
                ProxyError::ClientBody(e.to_string())
            }
        })?;
        // Trailers are not part of the body.
        if let Some(data) = frame.data_ref() {
            gathered.push_toward(data, total);
        }
    }
    Ok(gathered.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body_util::StreamBody;
    use hyper::header::HeaderValue;

    #[test]
    fn the_end_and_the_size_of_the_body_within_pass_through() {
        let body = with_idle_timeout(
            Full::new(Bytes::from_static(b"0123456789"))
                .map_err(|never| match never {})
                .boxed_unsync(),
            Duration::from_secs(10),
        );
        assert_eq!(body.size_hint().exact(), Some(10));
        assert!(!body.is_end_stream());
        let empty = with_idle_timeout(
            Full::new(Bytes::new())
                .map_err(|never| match never {})
                .boxed_unsync(),
            Duration::from_secs(10),
        );
        assert!(empty.is_end_stream());
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_fails_after_a_silence_and_not_after_a_slow_stream() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let mut body =
            with_idle_timeout(StreamBody::new(Box::pin(stream)), Duration::from_secs(10));
        let started = Instant::now();
        // Frames every 6 s: each pause is shorter than the timeout, their sum is not.
        for i in 0..4u8 {
            let tx = tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(6)).await;
                let _ = tx.send(Ok(Frame::data(Bytes::from(vec![i])))).await;
            });
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), Bytes::from(vec![i]));
        }
        assert_eq!(started.elapsed().as_secs(), 24);
        // Then silence: the body fails 10 s later.
        let error = body.frame().await.unwrap().unwrap_err();
        assert!(error.is::<UpstreamSilent>(), "{error}");
        assert_eq!(started.elapsed().as_secs(), 34);
    }

    type Frames = Vec<Result<Frame<Bytes>, std::io::Error>>;

    fn frames(parts: &[&'static str]) -> Frames {
        parts
            .iter()
            .map(|part| Ok(Frame::data(Bytes::from_static(part.as_bytes()))))
            .collect()
    }

    async fn read(frames: Frames, limit: usize) -> Result<Bytes, ProxyError> {
        let body = StreamBody::new(stream::iter(frames));
        read_body(body, &HeaderMap::new(), limit).await
    }

    #[tokio::test]
    async fn one_frame_is_returned_as_it_came() {
        let sent = Bytes::from(r#"{"model":"gpt-4o"}"#.to_string());
        let got = read_body(Full::new(sent.clone()), &HeaderMap::new(), 100)
            .await
            .unwrap();
        assert_eq!(got, sent);
        assert_eq!(got.as_ptr(), sent.as_ptr(), "copied");
    }

    #[tokio::test]
    async fn frames_are_joined_in_order_and_trailers_left_out() {
        let mut sent = frames(&["", "{\"a\":", "", "1", "}"]);
        sent.push(Ok(Frame::trailers(HeaderMap::new())));
        assert_eq!(read(sent, 100).await.unwrap(), "{\"a\":1}");
        assert_eq!(read(frames(&["", "x"]), 100).await.unwrap(), "x");
        assert_eq!(read(Vec::new(), 100).await.unwrap(), "");
    }

    #[test]
    fn a_body_of_the_length_it_declares_is_joined_in_one_buffer() {
        let mut gathered = Gathered::Empty;
        for chunk in ["{\"a\":", "1"] {
            gathered.push_toward(&Bytes::from_static(chunk.as_bytes()), 7);
        }
        let Gathered::Joined(joined) = &gathered else {
            panic!("not joined");
        };
        assert!(joined.capacity() >= 7, "{}", joined.capacity());
        let buffer = joined.as_ptr();
        gathered.push_toward(&Bytes::from_static(b"}"), 7);
        assert_eq!(gathered.bytes().as_ptr(), buffer, "grown");
        assert_eq!(gathered.into_bytes(), "{\"a\":1}");
    }

    #[test]
    fn a_declared_length_reserves_no_more_than_its_bound_before_the_bytes_come() {
        let mut gathered = Gathered::Empty;
        for chunk in ["{", "}"] {
            gathered.push_toward(&Bytes::from_static(chunk.as_bytes()), 1 << 30);
        }
        let Gathered::Joined(joined) = &gathered else {
            panic!("not joined");
        };
        assert!(joined.capacity() <= RESERVED_AHEAD, "{}", joined.capacity());
        assert_eq!(gathered.into_bytes(), "{}");
    }

    #[tokio::test]
    async fn the_limit_holds_for_declared_and_for_grown_bodies() {
        let too_large = |result: Result<Bytes, ProxyError>| {
            matches!(result, Err(ProxyError::BodyTooLarge { limit: 8 }))
        };
        assert_eq!(
            read(frames(&["1234", "5678"]), 8).await.unwrap(),
            "12345678"
        );
        assert!(too_large(read(frames(&["1234", "5678", "9"]), 8).await));
        assert!(too_large(read(frames(&["123456789"]), 8).await));
        let mut declared = HeaderMap::new();
        declared.insert(header::CONTENT_LENGTH, HeaderValue::from_static("9"));
        let small = Full::new(Bytes::from_static(b"1"));
        assert!(too_large(read_body(small, &declared, 8).await));
    }

    #[tokio::test]
    async fn client_body_errors_are_reported_as_such() {
        let mut sent = frames(&["12"]);
        sent.push(Err(std::io::Error::other("connection reset")));
        match read(sent, 100).await {
            Err(ProxyError::ClientBody(message)) => assert_eq!(message, "connection reset"),
            other => panic!("{other:?}"),
        }
    }
}
