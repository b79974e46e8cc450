//! The one response body type the server speaks, and ways to make it.

use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A body relayed frame by frame as the stream yields, never collected.
pub fn streaming<S, E>(stream: S) -> ProxyBody
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    StreamBody::new(stream.map_ok(Frame::data).map_err(Into::into)).boxed_unsync()
}

/// A request body grew past `max_body_bytes` while it was being relayed.
#[derive(Debug, thiserror::Error)]
#[error("request body exceeds the limit of {0} bytes")]
pub struct BodyLimitExceeded(pub usize);

/// The client's body as a stream of data frames that fails once more than `limit` bytes
/// have passed, without holding more than one frame.
pub fn limited_stream(
    body: hyper::body::Incoming,
    limit: usize,
) -> impl Stream<Item = Result<Bytes, BoxError>> + Send + 'static {
    let mut seen = 0usize;
    http_body_util::BodyDataStream::new(body).map(move |chunk| {
        let chunk = chunk.map_err(BoxError::from)?;
        seen += chunk.len();
        if seen > limit {
            return Err(BodyLimitExceeded(limit).into());
        }
        Ok(chunk)
    })
}
