//! SSE keep-alive: a streamed answer that has nothing to send for [`EVERY`] sends an SSE
//! comment (`: keep-alive`), which every SSE client skips.
//!
//! Design: the first event of a streamed answer comes only after its prompt is read, and an
//! agent's 16k-token prompt takes minutes on 2 vCPUs; clients with a read timeout (the OpenAI
//! and Anthropic SDKs, proxies, gateways) give up on a silent connection well before that,
//! and the work is wasted. The wrapper re-arms one timer whenever the answer yields a frame,
//! so an answer that streams steadily never carries a comment. NDJSON answers (Ollama's) have
//! no comment syntax and are not wrapped.
//!
//! Cost: one timer per streamed answer, reset per frame; one 14-byte frame per silent
//! [`EVERY`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use http_body::{Frame, SizeHint};

/// How long a streamed answer may be silent before a comment is sent.
pub const EVERY: Duration = Duration::from_secs(10);

/// The comment sent.
pub const COMMENT: &[u8] = b": keep-alive\n\n";

/// An SSE body that sends [`COMMENT`] after every `every` without a frame.
pub struct KeepAlive {
    inner: Body,
    every: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    done: bool,
}

impl KeepAlive {
    /// `inner` with a comment after each silence of `every`.
    pub fn wrap(inner: Body, every: Duration) -> Body {
        let sleep = Box::pin(tokio::time::sleep(every));
        Body::new(KeepAlive { inner, every, sleep, done: false })
    }

    fn rearm(&mut self) {
        let at = tokio::time::Instant::now() + self.every;
        self.sleep.as_mut().reset(at);
    }
}

impl http_body::Body for KeepAlive {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            self.done = frame.is_none();
            self.rearm();
            return Poll::Ready(frame);
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            self.rearm();
            // Registers the new deadline's waker before the frame goes out.
            let _ = self.sleep.as_mut().poll(cx);
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(COMMENT)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    /// A silent answer gets a comment per period; a frame re-arms the timer; the end passes.
    #[tokio::test(start_paused = true)]
    async fn silence_gets_comments_and_frames_pass() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
        let inner = Body::from_stream(tokio_stream_from(rx));
        let mut body = KeepAlive::wrap(inner, Duration::from_secs(10)).into_data_stream();
        let t0 = tokio::time::Instant::now();
        let f = body.next().await.unwrap().unwrap();
        assert_eq!(&f[..], COMMENT);
        assert_eq!(t0.elapsed(), Duration::from_secs(10));
        tokio::time::sleep(Duration::from_secs(7)).await;
        tx.send(Ok(Bytes::from_static(b"data: 1\n\n"))).await.unwrap();
        let f = body.next().await.unwrap().unwrap();
        assert_eq!(&f[..], b"data: 1\n\n");
        // The next comment comes a full period after the frame, not after the last comment.
        let t1 = tokio::time::Instant::now();
        let f = body.next().await.unwrap().unwrap();
        assert_eq!(&f[..], COMMENT);
        assert_eq!(t1.elapsed(), Duration::from_secs(10));
        drop(tx);
        assert!(body.next().await.is_none());
    }

    fn tokio_stream_from(
        mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    ) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
