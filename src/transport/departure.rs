//! Telling a client that half-closed from one that left. Both send a FIN; they differ only in
//! when: a client that half-closes does so once its request is sent, and waits for the reply;
//! one that leaves does so later, while it waits or mid-reply. So hyper serves HTTP/1.1 with
//! `half_close` on (a FIN does not end the exchange), and each request watches its client's
//! socket from the moment its body has been read: a FIN there by then (or within
//! `HALF_CLOSE_GRACE`, while the reply has not started) is a half-close, and the client is
//! answered; a FIN that comes later, or a reset at any time, is a departure. A departure while the request waits on upstream
//! (or on the summarizer) drops the request's work, which closes its upstream request at
//! once; one mid-reply ends the reply, which does the same.

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::Request;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::transport::body::{BodyReadTimeout, BoxError, MIN_BODY_RATE};

/// A client connection shared by hyper, which reads and writes it, and the replies that
/// watch it.
#[derive(Clone)]
pub struct ClientSocket(Arc<TcpStream>);

impl ClientSocket {
    pub fn new(stream: TcpStream) -> ClientSocket {
        ClientSocket(Arc::new(stream))
    }

    /// Whether the client has sent its FIN, once the socket is readable: `None` while it is
    /// not, and `Some(false)` when what is there to read is data.
    fn poll_fin(&self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            let mut byte = [MaybeUninit::uninit()];
            let peeked = self.0.try_io(Interest::READABLE, || {
                socket2::SockRef::from(&*self.0).peek(&mut byte)
            });
            match peeked {
                Ok(read) => return Poll::Ready(Ok(read == 0)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncRead for ClientSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            // Into the unfilled part as it is: zeroing it first cost hyper's whole read buffer
            // on every read.
            match self.0.try_read_buf(buf) {
                Ok(_) => return Poll::Ready(Ok(())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for ClientSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                written => return Poll::Ready(written),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                written => return Poll::Ready(written),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(socket2::SockRef::from(&*self.0).shutdown(std::net::Shutdown::Write))
    }
}

/// How long after its request was read a client's FIN still counts as its half-close, unless
/// the reply has started: the shutdown is a system call of its own after the request's last
/// write, and its FIN may reach condenser a moment after the request.
const HALF_CLOSE_GRACE: Duration = Duration::from_millis(50);

/// The client's request body, which tells its request's [`Departure`] once it has been read
/// to its end (or dropped unread: nothing more of it will be read).
/// It fails with [`BodyReadTimeout`] once it is late (`Deadline`).
pub struct ClientBody {
    inner: Incoming,
    read: Option<oneshot::Sender<()>>,
    deadline: Deadline,
}

/// When a request's body must have arrived: `timeout` after it was first waited for (as its
/// head was read), plus a second for each `MIN_BODY_RATE` bytes received. The clock is read
/// and the timer made only when the body is waited for: a small body arrives with its head
/// and never needs either.
struct Deadline {
    timeout: Duration,
    started: Option<Instant>,
    received: u64,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Deadline {
    /// Ready with the error once the body is late.
    fn poll_late(&mut self, cx: &mut Context<'_>) -> Poll<BodyReadTimeout> {
        let started = *self.started.get_or_insert_with(Instant::now);
        let due = started + self.timeout + Duration::from_secs(self.received / MIN_BODY_RATE);
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if timer.deadline() != due {
            timer.as_mut().reset(due);
        }
        ready!(timer.as_mut().poll(cx));
        Poll::Ready(BodyReadTimeout {
            received: self.received,
            secs: started.elapsed().as_secs(),
            timeout: self.timeout.as_secs(),
        })
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) else {
            let late = ready!(this.deadline.poll_late(cx));
            return Poll::Ready(Some(Err(late.into())));
        };
        if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
            this.deadline.received += data.map_or(0, |data| data.len() as u64);
        }
        if frame.is_none() || this.inner.is_end_stream() {
            if let Some(read) = this.read.take() {
                let _ = read.send(());
            }
        }
        Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// One request's watch on its client's connection: whether the client has left.
pub struct Departure {
    socket: Option<ClientSocket>,
    watch: Watch,
    /// Whether the reply has started: from then on, a FIN is a departure at once.
    replying: bool,
}

enum Watch {
    /// The request is being read; it ends when its body tells it has been.
    Reading(oneshot::Receiver<()>),
    /// The request was read at this instant: a FIN after the grace is a departure.
    Watching(Instant),
    /// Nothing to watch: HTTP/2 (whose clients reset their streams themselves), a client
    /// that half-closed, or one that sent more to read.
    Off,
    Left,
}

impl Departure {
    /// `request` with a body that tells when it has been read, and the watch on its client's
    /// `socket` (None over HTTP/2).
    /// Its body must be read whole within `body_read_timeout` (`Deadline`).
    pub fn watch(
        request: Request<Incoming>,
        socket: Option<ClientSocket>,
        body_read_timeout: Duration,
    ) -> (Request<ClientBody>, Departure) {
        // A request without a body has been read with its head.
        let (read, watch) = match socket {
            Some(_) if request.body().is_end_stream() => (None, Watch::Watching(Instant::now())),
            Some(_) => {
                let (read, request_read) = oneshot::channel();
                (Some(read), Watch::Reading(request_read))
            }
            None => (None, Watch::Off),
        };
        let deadline = Deadline {
            timeout: body_read_timeout,
            started: None,
            received: 0,
            timer: None,
        };
        let request = request.map(|inner| ClientBody {
            inner,
            read,
            deadline,
        });
        let departure = Departure {
            socket,
            watch,
            replying: false,
        };
        (request, departure)
    }

    /// Ready once the client has left; never for one that half-closed with its request.
    pub fn poll_left(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            self.watch = match &mut self.watch {
                Watch::Reading(request_read) => {
                    // Sent, or its sender dropped with the body: read either way.
                    let _ = ready!(Pin::new(request_read).poll(cx));
                    Watch::Watching(Instant::now())
                }
                Watch::Watching(read_at) => {
                    let Some(socket) = &self.socket else {
                        return Poll::Pending;
                    };
                    let half_close_over = self.replying || read_at.elapsed() >= HALF_CLOSE_GRACE;
                    match ready!(socket.poll_fin(cx)) {
                        Ok(true) if half_close_over => Watch::Left,
                        // A reset is never a half-close: hyper, not reading while it waits
                        // for the reply, would only meet it at its first write.
                        Err(_) => Watch::Left,
                        // Half-closed with the request, or more data: no FIN to wait for.
                        Ok(_) => Watch::Off,
                    }
                }
                Watch::Off => return Poll::Pending,
                Watch::Left => return Poll::Ready(()),
            };
        }
    }

    /// Resolves once the client has left.
    pub async fn left(&mut self) {
        std::future::poll_fn(|cx| self.poll_left(cx)).await;
    }

    fn has_left(&self) -> bool {
        matches!(self.watch, Watch::Left)
    }
}

/// The client left before or during its reply: nobody to write it to.
#[derive(Debug, thiserror::Error)]
#[error("the client closed its connection")]
pub struct ClientLeft;

/// A reply's body that ends with [`ClientLeft`] once its client has left: at once for a
/// client that left before the reply, or when it leaves while the body waits for upstream.
pub struct WatchDeparture<B> {
    inner: B,
    departure: Departure,
}

impl<B> WatchDeparture<B> {
    pub fn new(inner: B, mut departure: Departure) -> WatchDeparture<B> {
        departure.replying = true;
        WatchDeparture { inner, departure }
    }
}

impl<B> Body for WatchDeparture<B>
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
        // Nobody to write the reply to: the connection is closed instead.
        if this.departure.has_left() {
            return Poll::Ready(Some(Err(ClientLeft.into())));
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        ready!(this.departure.poll_left(cx));
        Poll::Ready(Some(Err(ClientLeft.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
