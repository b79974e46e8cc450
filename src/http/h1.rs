//! HTTP/1.1 to upstreams, spoken in the task of the request that needs it.
//!
//! hyper's client runs each connection in a task of its own and hands requests and response
//! frames across channels; for a proxy that answers each request with one upstream call, that
//! is two task hand-offs per direction and most of the client's cost. Here the request's own
//! task writes the request, reads the response head and, through the response body, the
//! rest. A connection whose response was read to its end goes back to its worker's pool; one
//! dropped earlier (a client that left mid-stream) is closed, which upstream sees at once.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Response, StatusCode, Version};
use hyper_rustls::MaybeHttpsStream;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::http::body::{BoxError, ProxyBody};

/// A connection as the connector makes it: TCP, maybe TLS over it, maybe through a tunnel.
pub type Stream = TokioIo<MaybeHttpsStream<TokioIo<TcpStream>>>;

/// A response head larger than this is refused (hyper's client allows about as much).
const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;
/// A chunk-size line or trailer line longer than this is refused.
const MAX_LINE_BYTES: usize = 4 * 1024;
/// Bodies up to this size are copied behind the head so both leave in one write.
const COALESCE_BYTES: usize = 16 * 1024;
const READ_CHUNK: usize = 16 * 1024;
/// Idle connections each worker keeps per upstream.
const MAX_IDLE: usize = 256;
/// Room left in a response's header map for the headers the proxy adds on the way out (the
/// five `x-condenser-*` ones), so adding them does not grow and rehash it.
const ADDED_HEADERS_ROOM: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("upstream closed the connection before a response")]
    ClosedBeforeResponse,
    #[error("upstream sent a malformed response: {0}")]
    Malformed(&'static str),
    /// The client's request body failed while it was being relayed (its own error inside).
    #[error("{0}")]
    RequestBody(BoxError),
}

impl ExchangeError {
    /// Nothing of a response arrived and the request may not have reached upstream: the
    /// connection was an idle one that upstream closed as it was reused.
    fn is_stale_connection(&self) -> bool {
        match self {
            ExchangeError::ClosedBeforeResponse => true,
            ExchangeError::Io(e) => matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionAborted
            ),
            _ => false,
        }
    }
}

/// A request body: bytes in hand (which can be sent again), or a stream relayed as it comes.
pub enum RequestBody {
    Full(Bytes),
    Streaming(ProxyBody),
}

impl RequestBody {
    pub fn into_proxy_body(self) -> ProxyBody {
        match self {
            RequestBody::Full(bytes) => crate::http::body::full(bytes),
            RequestBody::Streaming(body) => body,
        }
    }
}

/// One upstream HTTP/1.1 connection and whatever it has sent that was not read yet.
pub struct Connection {
    /// Boxed: a TLS stream is over a kilobyte, and connections move in and out of the pool.
    io: Box<Stream>,
    read_buf: BytesMut,
    /// It served a request before, so upstream may have closed it while it sat idle.
    reused: bool,
    idle_since: Instant,
    names: KnownNames,
}

impl Connection {
    pub fn new(io: Stream) -> Connection {
        Connection {
            io: Box::new(io),
            read_buf: BytesMut::new(),
            reused: false,
            idle_since: Instant::now(),
            names: KnownNames::default(),
        }
    }

    fn tcp(&self) -> &TcpStream {
        match self.io.inner() {
            MaybeHttpsStream::Http(tcp) => tcp.inner(),
            MaybeHttpsStream::Https(tls) => tls.inner().get_ref().0.inner().inner(),
        }
    }

    /// An idle connection that has become readable was closed by upstream, or sent something
    /// unasked; either way it cannot carry a request. The readiness test costs no system
    /// call; only a connection reported readable is read to tell which.
    fn is_usable(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        if self.tcp().poll_read_ready(&mut cx).is_pending() {
            return true;
        }
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        Pin::new(&mut *self.io)
            .poll_read(&mut cx, &mut probe)
            .is_pending()
    }

    /// Writes the request and reads the response head; the body follows from the
    /// connection, which returns to `pool` once the body has been read to its end.
    async fn exchange(
        mut self,
        wire: &[u8],
        body: Option<RequestBody>,
        expects_body: bool,
        pool: &Arc<Pool>,
    ) -> Result<Response<ResponseBody>, ExchangeError> {
        self.write_request(wire, body).await?;
        self.read_head(expects_body, pool).await
    }

    /// `wire` first, then whatever of the body did not fit in it.
    async fn write_request(
        &mut self,
        wire: &[u8],
        body: Option<RequestBody>,
    ) -> Result<(), ExchangeError> {
        match body {
            None => self.io.write_all(wire).await?,
            Some(RequestBody::Full(bytes)) => {
                self.io.write_all(wire).await?;
                self.io.write_all(&bytes).await?;
            }
            Some(RequestBody::Streaming(mut body)) => {
                let chunked = body.size_hint().exact().is_none();
                // Head and frames go out together while more is at hand, and before any wait
                // for the client, so a small body costs one write, as the full one does.
                let mut pending = wire.to_vec();
                while let Some(frame) = body.frame().await {
                    let frame = frame.map_err(ExchangeError::RequestBody)?;
                    if let Some(data) = frame.data_ref().filter(|data| !data.is_empty()) {
                        if chunked {
                            pending.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                        }
                        if data.len() <= COALESCE_BYTES {
                            pending.extend_from_slice(data);
                        } else {
                            self.io.write_all(&pending).await?;
                            pending.clear();
                            self.io.write_all(data).await?;
                        }
                        if chunked {
                            pending.extend_from_slice(b"\r\n");
                        }
                    }
                    if !body.is_end_stream() && !pending.is_empty() {
                        self.io.write_all(&pending).await?;
                        pending.clear();
                    }
                }
                if chunked {
                    pending.extend_from_slice(b"0\r\n\r\n");
                }
                self.io.write_all(&pending).await?;
            }
        }
        self.io.flush().await?;
        Ok(())
    }

    /// Reads until a final (non-1xx) response head is complete.
    async fn read_head(
        mut self,
        expects_body: bool,
        pool: &Arc<Pool>,
    ) -> Result<Response<ResponseBody>, ExchangeError> {
        loop {
            if !self.read_buf.is_empty() {
                match parse_head(&mut self.read_buf, &mut self.names, expects_body)? {
                    Some(Parsed::Interim) => continue,
                    Some(Parsed::Final(head, framing, keep_alive)) => {
                        let mut body = ResponseBody {
                            connection: Some(self),
                            framing,
                            keep_alive,
                            pool: pool.clone(),
                        };
                        // hyper never polls a body that says it is empty, so it would be
                        // dropped, and its connection with it.
                        if body.is_end_stream() {
                            body.finish();
                        }
                        return Ok(Response::from_parts(head, body));
                    }
                    None => {}
                }
            }
            if fill(&mut self.io, &mut self.read_buf).await? == 0 {
                return Err(if self.read_buf.is_empty() {
                    ExchangeError::ClosedBeforeResponse
                } else {
                    ExchangeError::Malformed("connection closed inside the response head")
                });
            }
        }
    }
}

async fn fill(io: &mut Stream, buf: &mut BytesMut) -> io::Result<usize> {
    std::future::poll_fn(|cx| poll_fill(io, buf, cx)).await
}

fn poll_fill(io: &mut Stream, buf: &mut BytesMut, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
    buf.reserve(READ_CHUNK);
    tokio_util::io::poll_read_buf(Pin::new(io), cx, buf)
}

enum Parsed {
    /// A 1xx response (100 Continue, 103 Early Hints) was skipped.
    Interim,
    Final(hyper::http::response::Parts, Framing, bool),
}

/// Parses a response head at the front of `buf`, taking it out when complete; `None` when
/// more bytes are needed. Hop-by-hop headers, and those `Connection` names, frame the body
/// and are then left out: the head is the response's own.
fn parse_head(
    buf: &mut BytesMut,
    names: &mut KnownNames,
    expects_body: bool,
) -> Result<Option<Parsed>, ExchangeError> {
    // Uninitialised: zeroing every slot costs more than parsing a typical head.
    let mut slots = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut []);
    let config = httparse::ParserConfig::default();
    let len = match config.parse_response_with_uninit_headers(&mut parsed, buf, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => {
            return Err(ExchangeError::Malformed("response head too large"));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(ExchangeError::Malformed("too many response headers"));
        }
        Err(_) => return Err(ExchangeError::Malformed("unparsable response head")),
    };
    let code = parsed.code.unwrap_or_default();
    let status =
        StatusCode::from_u16(code).map_err(|_| ExchangeError::Malformed("bad status code"))?;
    if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
        buf.advance(len);
        return Ok(Some(Parsed::Interim));
    }
    let version = if parsed.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // Header values keep pointing into the head's bytes instead of being copied out. What
    // frames the body is read on the way, so no header is looked up twice.
    let base = buf.as_ptr() as usize;
    let mut fields = Vec::with_capacity(parsed.headers.len());
    let mut delimiters = Delimiters::default();
    for (index, field) in parsed.headers.iter().enumerate() {
        let name = names.name(index, field.name.as_bytes())?;
        delimiters.note(&name, field.value)?;
        // About this connection, not the response: read for framing, never relayed.
        if is_hop_by_hop(&name) {
            continue;
        }
        let start = field.value.as_ptr() as usize - base;
        fields.push((name, start..start + field.value.len()));
    }
    let mut headers = HeaderMap::with_capacity(fields.len() + ADDED_HEADERS_ROOM);
    let head_bytes = buf.split_to(len).freeze();
    for (name, span) in fields {
        let value = HeaderValue::from_maybe_shared(head_bytes.slice(span))
            .map_err(|_| ExchangeError::Malformed("bad header value"))?;
        headers.append(name, value);
    }

    for listed in &delimiters.listed {
        headers.remove(listed);
    }
    let framing = delimiters.framing(status, expects_body);
    if matches!(framing, Framing::Chunked(_)) {
        // It does not describe what the client will get.
        headers.remove(header::CONTENT_LENGTH);
    }
    let keep_alive =
        version == Version::HTTP_11 && !matches!(framing, Framing::UntilClose) && !delimiters.close;
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = version;
    *response.headers_mut() = headers;
    Ok(Some(Parsed::Final(
        response.into_parts().0,
        framing,
        keep_alive,
    )))
}

/// Headers that describe one HTTP/1.1 hop, not the message: dropped from requests before
/// they go upstream (`strip_hop_by_hop`), and from responses as their heads are read
/// (`parse_head`). As names, so telling a header from them is a few integer compares rather
/// than string ones.
pub const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name)
}

/// Case-insensitive, as Connection tokens are.
fn is_hop_by_hop_token(token: &str) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|hop| hop.as_str().eq_ignore_ascii_case(token))
}

/// The names the Connection header lists as hop-by-hop too, as written; a value that is not
/// text is skipped whole.
fn connection_listed(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// Drops the headers that describe one hop, not the message, removing them in the map's
/// order (which decides the order of those left). The two common shapes allocate nothing:
/// no hop-by-hop header at all, and a Connection header alone (most clients send
/// `Connection: keep-alive`) that lists no other header present.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let fixed = headers.keys().filter(|name| is_hop_by_hop(name)).count();
    if fixed == 0 {
        return;
    }
    let lone_connection = fixed == 1
        && headers.contains_key(header::CONNECTION)
        && !connection_listed(headers)
            .any(|token| !is_hop_by_hop_token(token) && headers.contains_key(token));
    if lone_connection {
        headers.remove(header::CONNECTION);
        return;
    }
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|name| {
            is_hop_by_hop(name)
                || connection_listed(headers).any(|token| token.eq_ignore_ascii_case(name.as_str()))
        })
        .cloned()
        .collect();
    for name in doomed {
        headers.remove(name);
    }
}

/// The header names of the last response on a connection, with the bytes each was read
/// from. An upstream sends the same names in the same order response after response, and
/// comparing a few bytes costs less than parsing a name.
#[derive(Default)]
struct KnownNames(Vec<(Box<[u8]>, HeaderName)>);

impl KnownNames {
    /// The name of the response's `index`th header, read from `raw`.
    fn name(&mut self, index: usize, raw: &[u8]) -> Result<HeaderName, ExchangeError> {
        if let Some((known, name)) = self.0.get(index) {
            if **known == *raw {
                return Ok(name.clone());
            }
        }
        let name =
            HeaderName::from_bytes(raw).map_err(|_| ExchangeError::Malformed("bad header name"))?;
        let entry = (raw.into(), name.clone());
        match self.0.get_mut(index) {
            Some(known) => *known = entry,
            None => self.0.push(entry),
        }
        Ok(name)
    }
}

/// The headers that say where a response ends.
#[derive(Default)]
struct Delimiters {
    content_length: Option<u64>,
    /// Some when `Transfer-Encoding` was sent: whether its last coding is chunked.
    chunked: Option<bool>,
    /// `Connection: close`.
    close: bool,
    /// Other headers that `Connection` names as hop-by-hop.
    listed: Vec<HeaderName>,
}

impl Delimiters {
    fn note(&mut self, name: &HeaderName, value: &[u8]) -> Result<(), ExchangeError> {
        if name == header::CONTENT_LENGTH {
            let length = std::str::from_utf8(value)
                .ok()
                .map(str::trim)
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse().ok())
                .ok_or(ExchangeError::Malformed("bad content-length"))?;
            if self.content_length.is_some_and(|seen| seen != length) {
                return Err(ExchangeError::Malformed("conflicting content-length"));
            }
            self.content_length = Some(length);
        } else if name == header::TRANSFER_ENCODING {
            let last = value.rsplit(|&b| b == b',').next().unwrap_or_default();
            self.chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name == header::CONNECTION {
            for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    self.close = true;
                } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                    // A token that is not a header name names nothing to remove.
                    self.listed.extend(HeaderName::from_bytes(token).ok());
                }
            }
        }
        Ok(())
    }

    /// How the body's end is found (RFC 9112 §6.3).
    fn framing(&self, status: StatusCode, expects_body: bool) -> Framing {
        if !expects_body || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            return Framing::Length(0);
        }
        match (self.chunked, self.content_length) {
            (Some(true), _) => Framing::Chunked(Chunked::Size),
            (Some(false), _) | (None, None) => Framing::UntilClose,
            (None, Some(length)) => Framing::Length(length),
        }
    }
}

enum Framing {
    /// Bytes still to come.
    Length(u64),
    Chunked(Chunked),
    UntilClose,
    Done,
}

/// Where a chunked decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunked {
    Size,
    /// Bytes left in the current chunk.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    Trailers,
}

enum Decoded {
    Data(Bytes),
    End,
    NeedMore,
}

/// Takes what it can from `buf`: chunk data as it arrives (a chunk is never waited for
/// whole, so a stream's events pass as they come), chunk framing and trailers dropped.
fn decode_chunked(state: &mut Chunked, buf: &mut BytesMut) -> Result<Decoded, ExchangeError> {
    loop {
        match *state {
            Chunked::Size => {
                let Some(line) = take_line(buf)? else {
                    return Ok(Decoded::NeedMore);
                };
                let digits = line.split(|&b| b == b';').next().unwrap_or_default();
                let digits = digits.trim_ascii();
                if digits.is_empty() || digits.len() > 16 {
                    return Err(ExchangeError::Malformed("bad chunk size"));
                }
                let size = std::str::from_utf8(digits)
                    .ok()
                    .and_then(|d| u64::from_str_radix(d, 16).ok())
                    .ok_or(ExchangeError::Malformed("bad chunk size"))?;
                *state = if size == 0 {
                    Chunked::Trailers
                } else {
                    Chunked::Data(size)
                };
            }
            Chunked::Data(left) => {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let take = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                let data = buf.split_to(take).freeze();
                let left = left - take as u64;
                *state = if left == 0 {
                    Chunked::DataEnd
                } else {
                    Chunked::Data(left)
                };
                return Ok(Decoded::Data(data));
            }
            Chunked::DataEnd => {
                let Some(line) = take_line(buf)? else {
                    return Ok(Decoded::NeedMore);
                };
                if !line.is_empty() {
                    return Err(ExchangeError::Malformed("chunk longer than its size"));
                }
                *state = Chunked::Size;
            }
            Chunked::Trailers => {
                let Some(line) = take_line(buf)? else {
                    return Ok(Decoded::NeedMore);
                };
                if line.is_empty() {
                    return Ok(Decoded::End);
                }
            }
        }
    }
}

/// The next line of `buf` without its line end, taken out of `buf`.
fn take_line(buf: &mut BytesMut) -> Result<Option<Bytes>, ExchangeError> {
    let Some(end) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > MAX_LINE_BYTES {
            return Err(ExchangeError::Malformed("chunk line too long"));
        }
        return Ok(None);
    };
    let mut line = buf.split_to(end + 1).freeze();
    line.truncate(end);
    if line.last() == Some(&b'\r') {
        line.truncate(end - 1);
    }
    Ok(Some(line))
}

/// A response body read from its connection as the client's side asks for it.
pub struct ResponseBody {
    connection: Option<Connection>,
    framing: Framing,
    keep_alive: bool,
    pool: Arc<Pool>,
}

impl ResponseBody {
    /// The body is complete: its connection can carry the next request, unless upstream
    /// said otherwise or sent more than it should have.
    fn finish(&mut self) {
        self.framing = Framing::Done;
        if let Some(connection) = self.connection.take() {
            if self.keep_alive && connection.read_buf.is_empty() {
                self.pool.put(connection);
            }
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            let Some(connection) = this.connection.as_mut() else {
                return Poll::Ready(None);
            };
            let buf = &mut connection.read_buf;
            match &mut this.framing {
                Framing::Done => return Poll::Ready(None),
                Framing::Length(0) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Framing::Length(left) if !buf.is_empty() => {
                    let take = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(take).freeze();
                    *left -= take as u64;
                    if *left == 0 {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Framing::Chunked(state) if !buf.is_empty() => match decode_chunked(state, buf) {
                    Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Ok(Decoded::End) => {
                        this.finish();
                        return Poll::Ready(None);
                    }
                    Ok(Decoded::NeedMore) => {}
                    Err(e) => {
                        this.connection = None;
                        return Poll::Ready(Some(Err(e.into())));
                    }
                },
                Framing::UntilClose if !buf.is_empty() => {
                    let data = buf.split().freeze();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                _ => {}
            }
            match ready!(poll_fill(&mut connection.io, &mut connection.read_buf, cx)) {
                Ok(0) if matches!(this.framing, Framing::UntilClose) => {
                    this.framing = Framing::Done;
                    this.connection = None;
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    this.connection = None;
                    return Poll::Ready(Some(Err(
                        "upstream closed the connection before the body's end".into(),
                    )));
                }
                Ok(_) => {}
                Err(e) => {
                    this.connection = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.framing, Framing::Done | Framing::Length(0))
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(left) => SizeHint::with_exact(left),
            Framing::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

/// One worker's idle connections to one upstream, the most recently used on top. Aligned to
/// cache lines of its own: each worker's pool is locked twice per request, and two pools
/// allocated side by side would otherwise share a line that both cores keep writing.
#[derive(Default)]
#[repr(align(128))]
pub struct Pool {
    idle: Mutex<Vec<Connection>>,
}

impl Pool {
    /// A live idle connection, if there is one. Connections idle too long, or closed by
    /// upstream meanwhile, are dropped on the way.
    pub fn take(&self, max_idle: Duration) -> Option<Connection> {
        let mut idle = self.idle.lock().ok()?;
        while let Some(mut connection) = idle.pop() {
            if connection.idle_since.elapsed() < max_idle && connection.is_usable() {
                connection.reused = true;
                return Some(connection);
            }
        }
        None
    }

    fn put(&self, mut connection: Connection) {
        connection.idle_since = Instant::now();
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < MAX_IDLE {
                idle.push(connection);
            }
        }
    }
}

/// A request as it goes on the wire: the request line and headers with the body's framing,
/// and a small whole body right behind them, so that one write sends both and a retry needs
/// nothing else. A larger or streamed body follows on its own.
pub struct EncodedRequest {
    wire: Vec<u8>,
    body: Option<RequestBody>,
}

pub fn encode_request(
    method: &Method,
    target: &str,
    host: &str,
    headers: &HeaderMap,
    body: RequestBody,
) -> EncodedRequest {
    let length = match &body {
        RequestBody::Full(bytes) => Some(bytes.len() as u64),
        RequestBody::Streaming(body) => body.size_hint().exact(),
    };
    let coalesced = match &body {
        RequestBody::Full(bytes) if bytes.len() <= COALESCE_BYTES => bytes.len(),
        _ => 0,
    };
    let mut out = Vec::with_capacity(256 + headers.len() * 48 + coalesced);
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if name == header::HOST
            || name == header::CONTENT_LENGTH
            || name == header::TRANSFER_ENCODING
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match length {
        // As hyper does: a bodyless GET or HEAD says nothing of a body.
        Some(0) if matches!(*method, Method::GET | Method::HEAD) => {}
        Some(length) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(decimal(length, &mut [0; 20]));
            out.extend_from_slice(b"\r\n");
        }
        None => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
    match body {
        RequestBody::Full(bytes) if bytes.len() <= COALESCE_BYTES => {
            out.extend_from_slice(&bytes);
            EncodedRequest {
                wire: out,
                body: None,
            }
        }
        body => EncodedRequest {
            wire: out,
            body: Some(body),
        },
    }
}

/// `n` in decimal, written into `digits`: header values and lengths without a `String`.
pub fn decimal(mut n: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &digits[start..];
        }
    }
}

/// Sends one request over `connection`. A reused connection that turns out to have been
/// closed by upstream while idle is replaced, once, by one from `reconnect` when the body can
/// be sent again: nothing came back, and an upstream closing an idle connection has not read
/// what was written into it.
pub async fn send<C, F>(
    pool: &Arc<Pool>,
    connection: Connection,
    reconnect: C,
    request: EncodedRequest,
    expects_body: bool,
) -> Result<Response<ResponseBody>, SendError>
where
    C: FnOnce() -> F,
    F: std::future::Future<Output = Result<Connection, BoxError>>,
{
    let EncodedRequest { wire, body } = request;
    let replay = match &body {
        None if connection.reused => Some(None),
        Some(RequestBody::Full(bytes)) if connection.reused => Some(Some(bytes.clone())),
        _ => None,
    };
    match connection.exchange(&wire, body, expects_body, pool).await {
        Err(e) if e.is_stale_connection() => match replay {
            // Boxed: this rare path would otherwise double the common future's size.
            Some(rest) => {
                Box::pin(async move {
                    let fresh = reconnect().await.map_err(SendError::Connect)?;
                    fresh
                        .exchange(&wire, rest.map(RequestBody::Full), expects_body, pool)
                        .await
                        .map_err(SendError::Exchange)
                })
                .await
            }
            None => Err(SendError::Exchange(e)),
        },
        result => result.map_err(SendError::Exchange),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("{0}")]
    Connect(BoxError),
    #[error(transparent)]
    Exchange(ExchangeError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    fn decode_all(pieces: &[&[u8]]) -> Result<(Vec<u8>, BytesMut), ExchangeError> {
        let mut state = Chunked::Size;
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for (at, piece) in pieces.iter().enumerate() {
            buf.extend_from_slice(piece);
            loop {
                match decode_chunked(&mut state, &mut buf)? {
                    Decoded::Data(data) => out.extend_from_slice(&data),
                    Decoded::NeedMore => break,
                    Decoded::End => {
                        pieces[at + 1..]
                            .iter()
                            .for_each(|p| buf.extend_from_slice(p));
                        return Ok((out, buf));
                    }
                }
            }
        }
        Err(ExchangeError::Malformed("no end"))
    }

    #[test]
    fn chunked_bodies_decode_however_they_are_split() {
        let wire: &[u8] =
            b"5;ext=1\r\nhello\r\n7\r\n, world\r\nA\r\n0123456789\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        let expected = b"hello, world0123456789";
        for split in 0..wire.len() {
            let (out, rest) = decode_all(&[&wire[..split], &wire[split..]]).unwrap();
            assert_eq!(out, expected, "split at {split}");
            assert_eq!(&rest[..], b"NEXT", "split at {split}");
        }
        // Bare LF line ends are taken too.
        let (out, _) = decode_all(&[b"3\nabc\n0\n\n"]).unwrap();
        assert_eq!(out, b"abc");
    }

    #[test]
    fn malformed_chunked_bodies_are_errors() {
        for wire in [
            &b"zz\r\nabc\r\n0\r\n\r\n"[..],
            b"\r\nabc\r\n0\r\n\r\n",
            b"3\r\nabcdef\r\n0\r\n\r\n",
            b"11111111111111111\r\n",
        ] {
            assert!(
                decode_all(&[wire]).is_err(),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
        let endless_line = vec![b'1'; MAX_LINE_BYTES + 1];
        assert!(decode_all(&[&endless_line]).is_err());
    }

    fn parse(wire: &[u8], expects_body: bool) -> (hyper::http::response::Parts, Framing, bool) {
        let mut buf = BytesMut::from(wire);
        loop {
            match parse_head(&mut buf, &mut KnownNames::default(), expects_body).unwrap() {
                Some(Parsed::Final(head, framing, keep_alive)) => {
                    return (head, framing, keep_alive)
                }
                Some(Parsed::Interim) => {}
                None => panic!("incomplete"),
            }
        }
    }

    #[test]
    fn response_heads_set_framing_and_reuse() {
        let (head, framing, keep_alive) = parse(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 12\r\nx-a: 1\r\nx-a: 2\r\n\r\n",
            true,
        );
        assert_eq!(head.status, StatusCode::OK);
        assert_eq!(head.headers.get_all("x-a").iter().count(), 2);
        assert!(matches!(framing, Framing::Length(12)));
        assert!(keep_alive);

        let (head, framing, _) = parse(
            b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\ntransfer-encoding: chunked\r\n\r\n",
            true,
        );
        assert!(matches!(framing, Framing::Chunked(Chunked::Size)));
        assert!(!head.headers.contains_key(header::CONTENT_LENGTH));

        let (_, framing, keep_alive) = parse(b"HTTP/1.1 200 OK\r\n\r\n", true);
        assert!(matches!(framing, Framing::UntilClose));
        assert!(!keep_alive);

        let (_, framing, keep_alive) =
            parse(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", false);
        assert!(
            matches!(framing, Framing::Length(0)),
            "a HEAD answer has no body"
        );
        assert!(keep_alive);

        let (_, framing, _) = parse(b"HTTP/1.1 204 No Content\r\n\r\n", true);
        assert!(matches!(framing, Framing::Length(0)));

        let (_, _, keep_alive) = parse(
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: Close\r\n\r\n",
            true,
        );
        assert!(!keep_alive);
        let (_, _, keep_alive) = parse(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", true);
        assert!(!keep_alive);

        let mut partial = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-le"[..]);
        let names = &mut KnownNames::default();
        assert!(parse_head(&mut partial, names, true).unwrap().is_none());
        for bad in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            b"NOT HTTP\r\n\r\n",
        ] {
            assert!(parse_head(&mut BytesMut::from(bad), names, true).is_err());
        }
    }

    #[test]
    fn response_heads_leave_out_hop_by_hop_headers_after_framing_by_them() {
        let (head, framing, keep_alive) = parse(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: keep-alive, X-Hop, close\r\n\
              Keep-Alive: timeout=5\r\nX-Hop: 1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\
              Proxy-Connection: keep-alive\r\nX-Kept: 2\r\n\r\n",
            true,
        );
        let names: Vec<_> = head.headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["content-type", "x-kept"]);
        assert!(matches!(framing, Framing::Chunked(_)));
        assert!(
            !keep_alive,
            "Connection: close was read before being dropped"
        );
    }

    #[test]
    fn header_names_are_remembered_by_position_and_reread_when_they_change() {
        let names = &mut KnownNames::default();
        let mut keys = |wire: &[u8]| match parse_head(&mut BytesMut::from(wire), names, true) {
            Ok(Some(Parsed::Final(head, _, _))) => head
                .headers
                .iter()
                .map(|(name, value)| format!("{name}={}", value.to_str().unwrap()))
                .collect::<Vec<_>>(),
            _ => panic!("not a head"),
        };
        let first = keys(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-A: 1\r\n\r\n");
        assert_eq!(first, ["content-length=0", "x-a=1"]);
        let same = keys(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-A: 2\r\n\r\n");
        assert_eq!(same, ["content-length=0", "x-a=2"]);
        let changed =
            keys(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-B: 3\r\nx-a: 4\r\nX-C: 5\r\n\r\n");
        assert_eq!(changed, ["content-length=0", "x-b=3", "x-a=4", "x-c=5"]);
        let fewer = keys(b"HTTP/1.1 200 OK\r\nX-C: 6\r\n\r\n");
        assert_eq!(fewer, ["x-c=6"]);
        assert!(
            parse_head(
                &mut BytesMut::from(&b"HTTP/1.1 200 OK\r\nX A: 1\r\n\r\n"[..]),
                names,
                true
            )
            .is_err(),
            "a name that is not a token"
        );
    }

    #[test]
    fn request_heads_frame_the_body_and_drop_hop_headers() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("client"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        headers.insert("x-kept", HeaderValue::from_static("yes"));
        let full = RequestBody::Full(Bytes::from_static(b"{}"));
        let small = encode_request(&Method::POST, "/v1/x?q=1", "up:1", &headers, full);
        assert_eq!(
            String::from_utf8(small.wire).unwrap(),
            "POST /v1/x?q=1 HTTP/1.1\r\nhost: up:1\r\nx-kept: yes\r\ncontent-length: 2\r\n\r\n{}"
        );
        assert!(
            small.body.is_none(),
            "a small body travels in the wire buffer"
        );
        let large = Bytes::from(vec![b'x'; COALESCE_BYTES + 1]);
        let large = encode_request(&Method::POST, "/", "up", &headers, RequestBody::Full(large));
        assert!(String::from_utf8(large.wire)
            .unwrap()
            .ends_with(&format!("content-length: {}\r\n\r\n", COALESCE_BYTES + 1)));
        assert!(matches!(large.body, Some(RequestBody::Full(b)) if b.len() == COALESCE_BYTES + 1));
        let empty = RequestBody::Full(Bytes::new());
        let get = encode_request(&Method::GET, "/v1/models", "up", &HeaderMap::new(), empty);
        assert_eq!(
            String::from_utf8(get.wire).unwrap(),
            "GET /v1/models HTTP/1.1\r\nhost: up\r\n\r\n"
        );
        let stream = futures_util::stream::iter([Ok::<_, BoxError>(Frame::data(Bytes::new()))]);
        let unknown =
            RequestBody::Streaming(http_body_util::StreamBody::new(stream).boxed_unsync());
        let streamed = encode_request(&Method::POST, "/", "up", &HeaderMap::new(), unknown);
        assert!(String::from_utf8(streamed.wire)
            .unwrap()
            .ends_with("transfer-encoding: chunked\r\n\r\n"));
        assert!(matches!(streamed.body, Some(RequestBody::Streaming(_))));
    }

    #[test]
    fn decimals_are_written_in_full() {
        for n in [0, 7, 10, 99, 100, 4_096, 1_000_000_007, u64::MAX] {
            assert_eq!(decimal(n, &mut [0; 20]), n.to_string().as_bytes());
        }
    }

    async fn connect(addr: std::net::SocketAddr) -> Result<Connection, BoxError> {
        let tcp = TcpStream::connect(addr).await?;
        Ok(Connection::new(TokioIo::new(MaybeHttpsStream::Http(
            TokioIo::new(tcp),
        ))))
    }

    /// Reads one request head (and no body) from `stream`.
    async fn read_request(stream: &mut TcpStream) -> Option<String> {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            if stream.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            head.push(byte[0]);
        }
        Some(String::from_utf8_lossy(&head).into_owned())
    }

    /// A bodiless GET over `connection`, reconnecting to `addr` if need be.
    async fn get(
        pool: &Arc<Pool>,
        connection: Connection,
        addr: std::net::SocketAddr,
    ) -> Result<Response<ResponseBody>, SendError> {
        let nothing = RequestBody::Full(Bytes::new());
        let request = encode_request(&Method::GET, "/", "t", &HeaderMap::new(), nothing);
        send(pool, connection, || connect(addr), request, true).await
    }

    async fn exchange_text(
        pool: &Arc<Pool>,
        connection: Connection,
        addr: std::net::SocketAddr,
    ) -> Result<String, BoxError> {
        let body = get(pool, connection, addr)
            .await?
            .into_body()
            .collect()
            .await?
            .to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// Each accepted connection answers its requests with `replies` in turn (chunked,
    /// length-delimited), then closes.
    async fn upstream(
        replies: &'static [&'static [u8]],
    ) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    for reply in replies {
                        if read_request(&mut stream).await.is_none() {
                            return;
                        }
                        stream.write_all(reply).await.unwrap();
                    }
                });
            }
        });
        (addr, accepted)
    }

    #[tokio::test]
    async fn connections_are_reused_and_replaced_once_upstream_closes_them() {
        let (addr, accepted) = upstream(&[
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\none\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\ntwo",
        ])
        .await;
        let pool = Arc::new(Pool::default());
        let first = connect(addr).await.unwrap();
        assert_eq!(exchange_text(&pool, first, addr).await.unwrap(), "one");
        let again = pool
            .take(Duration::from_secs(60))
            .expect("the connection was pooled");
        assert_eq!(exchange_text(&pool, again, addr).await.unwrap(), "two");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);

        // Upstream has closed it after its two replies: the pool notices, without a request.
        let closed = pool.idle.lock().unwrap().len();
        assert_eq!(closed, 1);
        for _ in 0..100 {
            let mut probe = pool.idle.lock().unwrap().pop().unwrap();
            if !probe.is_usable() {
                break;
            }
            pool.idle.lock().unwrap().push(probe);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(pool.take(Duration::from_secs(60)).is_none());
        // A connection that is reused and found closed only once the request is written
        // is replaced by a fresh one.
        let mut stale = connect(addr).await.unwrap();
        stale.reused = true;
        stale.io.shutdown().await.unwrap();
        assert_eq!(exchange_text(&pool, stale, addr).await.unwrap(), "one");
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_empty_response_frees_its_connection_at_once() {
        let (addr, accepted) = upstream(&[
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        ])
        .await;
        let pool = Arc::new(Pool::default());
        for _ in 0..2 {
            let connection = match pool.take(Duration::from_secs(60)) {
                Some(connection) => connection,
                None => connect(addr).await.unwrap(),
            };
            let response = get(&pool, connection, addr).await.unwrap();
            assert!(response.body().is_end_stream());
            // Dropped unread, as hyper does with a body that says it is empty.
            drop(response);
            assert_eq!(pool.idle.lock().unwrap().len(), 1);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn bodies_read_until_close_end_there_and_are_not_pooled() {
        let (addr, _) = upstream(&[b"HTTP/1.1 200 OK\r\n\r\nuntil the end"]).await;
        let pool = Arc::new(Pool::default());
        let connection = connect(addr).await.unwrap();
        assert_eq!(
            exchange_text(&pool, connection, addr).await.unwrap(),
            "until the end"
        );
        assert!(pool.idle.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error() {
        let (addr, _) = upstream(&[b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"]).await;
        let pool = Arc::new(Pool::default());
        let connection = connect(addr).await.unwrap();
        let error = exchange_text(&pool, connection, addr).await.unwrap_err();
        assert!(
            error.to_string().contains("before the body's end"),
            "{error}"
        );
        assert!(pool.idle.lock().unwrap().is_empty());
    }

    #[test]
    fn each_hop_by_hop_header_is_dropped_without_a_connection_header() {
        for name in [
            "keep-alive",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
        ] {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static("1"));
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h.keys().collect::<Vec<_>>(), ["content-type"], "{name}");
        }
    }

    #[test]
    fn a_lone_connection_header_is_dropped_and_nothing_else() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Keep-Alive"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("317"));
        h.insert("x-request-id", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-length", "x-request-id"]);

        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, not a name, X-Hop"),
        );
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("317"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().collect::<Vec<_>>(), ["content-length"]);
    }

    #[test]
    fn the_headers_left_keep_the_order_of_removing_in_map_order() {
        let mut h = HeaderMap::new();
        for name in [
            "a",
            "te",
            "b",
            "connection",
            "c",
            "x-hop",
            "d",
            "upgrade",
            "e",
        ] {
            h.insert(name, HeaderValue::from_static("x-hop"));
        }
        let mut expected = h.clone();
        for name in ["te", "connection", "x-hop", "upgrade"] {
            expected.remove(name);
        }
        strip_hop_by_hop(&mut h);
        assert!(h.iter().eq(expected.iter()), "{h:?}");
    }

    #[test]
    fn headers_without_hop_by_hop_ones_are_left_as_they_are() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("a/b"));
        h.insert("x-keep-alive-ish", HeaderValue::from_static("1"));
        h.append("x-keep-alive-ish", HeaderValue::from_static("2"));
        let before = h.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, before);
    }
}
