//! A write-progress timeout for a connection: an answer the client does not read is dropped.
//!
//! Design: hyper has no write timeout, so a client that sends a request and never reads the
//! answer holds the answer's buffers (and its connection's place) for as long as it keeps the
//! socket open. [`WriteStall`] wraps the socket: whenever a write or flush cannot go on
//! because the kernel's send buffer is full, a timer starts; any progress disarms it; if it
//! fires first, the write fails with `TimedOut`, hyper drops the connection and everything the
//! answer held is freed. Streaming answers that idle between tokens are not affected: the
//! timer only runs while bytes are waiting to be taken by the client.
//!
//! Cost: one timer, armed only while the socket's send buffer is full.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `inner` whose writes must make progress within `limit`.
pub struct WriteStall<T> {
    inner: T,
    limit: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> WriteStall<T> {
    pub fn new(inner: T, limit: Duration) -> WriteStall<T> {
        WriteStall { inner, limit, timer: None }
    }

    /// Turns a pending write into a timeout once it has been pending for `limit`.
    fn pending<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let limit = self.limit;
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_ready() {
            let msg = format!(
                "the client read nothing of the answer for {} s (--write-timeout)",
                limit.as_secs_f32()
            );
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, msg)));
        }
        Poll::Pending
    }

    fn progress<R>(&mut self, p: Poll<io::Result<R>>, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        match p {
            Poll::Pending => self.pending(cx),
            ready => {
                self.timer = None;
                ready
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteStall<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteStall<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let p = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(p, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let p = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(p, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let p = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(p, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let p = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.progress(p, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_write_the_peer_never_reads_times_out_and_progress_disarms() {
        // A 64-byte pipe whose far end reads nothing.
        let (near, mut far) = tokio::io::duplex(64);
        let mut w = WriteStall::new(near, Duration::from_secs(30));
        w.write_all(&[0u8; 64]).await.unwrap();
        // Read half, then stall: the next write waits, then fails after the limit.
        let mut half = [0u8; 32];
        tokio::io::AsyncReadExt::read_exact(&mut far, &mut half).await.unwrap();
        w.write_all(&[1u8; 32]).await.unwrap();
        let t0 = tokio::time::Instant::now();
        let err = w.write_all(&[2u8; 1]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(t0.elapsed(), Duration::from_secs(30));
    }
}
