//! Telling a client that half-closed from one that left. Both send a FIN; they differ only in
//! when: a client that half-closes does so once its request is sent, before the reply starts,
//! and waits for it; one that leaves mid-reply has stopped reading. So hyper serves HTTP/1.1
//! with `half_close` on (a FIN before the reply does not end the exchange), and a streamed
//! reply's body watches the socket: a FIN that comes while it waits on upstream ends the
//! reply, which closes the upstream request at once.
//!
//! A client that leaves before the reply starts cannot be told from one that half-closed;
//! the upstream request then runs until its reply's first write to the client fails.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

use crate::transport::body::BoxError;

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

/// The client left while its reply waited on upstream.
#[derive(Debug, thiserror::Error)]
#[error("the client closed its connection mid-reply")]
pub struct ClientLeft;

/// A reply's body that ends with [`ClientLeft`] once its client sends a FIN while the body
/// waits for upstream; a client that had half-closed before is not watched.
pub struct WatchDeparture<B> {
    inner: B,
    /// `None` once there is nothing to watch: HTTP/2, a half-closed client, or data to read.
    socket: Option<ClientSocket>,
    /// Whether the reply has waited once: its first wait tells a half-close that came before.
    waited: bool,
}

impl<B> WatchDeparture<B> {
    pub fn new(inner: B, socket: Option<ClientSocket>) -> WatchDeparture<B> {
        WatchDeparture {
            inner,
            socket,
            waited: false,
        }
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
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        let Some(socket) = &this.socket else {
            return Poll::Pending;
        };
        let first_wait = !std::mem::replace(&mut this.waited, true);
        match socket.poll_fin(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(true)) if !first_wait => Poll::Ready(Some(Err(ClientLeft.into()))),
            // A reset is never a half-close: hyper, not reading mid-reply, would only meet it
            // at its next write, while upstream went on generating.
            Poll::Ready(Err(_)) => Poll::Ready(Some(Err(ClientLeft.into()))),
            // Half-closed before the reply started, or data.
            Poll::Ready(_) => {
                this.socket = None;
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
