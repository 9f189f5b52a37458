//! The accept loop: how long a connection may take to say what it wants, how many may be open
//! at once, and how long a request body may take to arrive.
//!
//! Design: hyper's HTTP/1 connection builder with a tokio timer, so its header-read timeout is
//! live (axum's own `serve` builds hyper without a timer, which silently disables it). The
//! timer starts whenever the connection waits for a request head, so the same limit bounds a
//! kept-alive connection's idle time between requests. Open connections are registered in
//! [`Conns`] before a connection is served, and marked busy from a request's head until its
//! answer's body is done or dropped: at the cap the oldest connection that has not sent a
//! request head (else the oldest idle kept-alive one) is closed for the new one, so half-open
//! or idling sockets cannot lock out clients or probes; only when every open connection is
//! being answered does a new one get an immediate `503` with `Retry-After` and is closed,
//! never read. Writes go through [`WriteStall`], so an answer
//! the client stops reading is dropped after `write_timeout`. A request
//! body is wrapped in [`Deadline`], which fails the body's read once the whole body has taken
//! longer than the body timeout since its head arrived.
//!
//! Cost: one timer per connection waiting for a head, one per body being read, one per write
//! the kernel cannot take; one registry insert and remove per connection.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::Router;
use http_body::{Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::conns::{Conns, Refusal, State};
use crate::stall::WriteStall;

/// The transport's limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A request head must arrive within this, counted from when the connection starts
    /// waiting for it (a new connection, or a kept-alive one after its last answer).
    pub header_timeout: Duration,
    /// A request body must arrive whole within this, counted from when its head arrived.
    pub body_timeout: Duration,
    /// Connections open at once; past it, the oldest that has not sent a request head is
    /// closed for the new one, or if there is none, 503 and close.
    pub max_connections: usize,
    /// Connections one non-loopback address may hold at once.
    pub max_connections_per_peer: usize,
    /// An answer's write must make progress within this, or the connection is closed.
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 256,
            max_connections_per_peer: 32,
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// What a connection past the cap is sent before it is closed: a 503 in OpenAI's error shape.
fn overloaded(why: Refusal) -> Vec<u8> {
    let what = match why {
        Refusal::Full => "this server has as many connections open as it allows (--max-connections), each answering a request",
        Refusal::PeerFull => "this address has as many connections open as one remote address may (--max-connections-per-peer)",
    };
    let body = format!("{{\"error\":{{\"message\":\"{what}: retry shortly\",\"type\":\"server_error\",\"param\":null,\"code\":\"too_many_connections\"}}}}");
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// What the accept loop counts: connections refused at the cap, and fresh ones evicted there.
#[derive(Clone, Default)]
pub struct Counts {
    pub refused: prometheus_client::metrics::counter::Counter,
    pub evicted: prometheus_client::metrics::counter::Counter,
}

/// A connection's service: `app`, noting on the connection's registry entry that a request
/// head arrived (it is not evicted for a newer connection while it is answered) and, through
/// [`Answered`], when its answer is done.
#[derive(Clone)]
struct Marked {
    inner: TowerToHyperService<Router>,
    state: Arc<State>,
}

type Inner = TowerToHyperService<Router>;
type Req = hyper::Request<hyper::body::Incoming>;

impl hyper::service::Service<Req> for Marked {
    type Response = hyper::Response<Body>;
    type Error = <Inner as hyper::service::Service<Req>>::Error;
    type Future = futures_util::future::MapOk<
        <Inner as hyper::service::Service<Req>>::Future,
        Box<dyn FnOnce(hyper::Response<Body>) -> hyper::Response<Body> + Send>,
    >;

    fn call(&self, req: Req) -> Self::Future {
        use futures_util::TryFutureExt;
        self.state.busy();
        let state = self.state.clone();
        let answered: Box<dyn FnOnce(hyper::Response<Body>) -> hyper::Response<Body> + Send> =
            Box::new(move |r| r.map(|inner| Body::new(Answered { inner, state })));
        hyper::service::Service::call(&self.inner, req).map_ok(answered)
    }
}

/// An answer's body that marks its connection idle when hyper is done with it (sent whole, or
/// dropped when the client went away).
struct Answered {
    inner: Body,
    state: Arc<State>,
}

impl Drop for Answered {
    fn drop(&mut self) {
        self.state.idle();
    }
}

impl http_body::Body for Answered {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `app` on `listener` within `limits` until `stop` resolves; then stops accepting,
/// lets each open connection finish the request it is answering, and returns.
pub async fn serve(
    listener: &TcpListener,
    app: Router,
    limits: Limits,
    counts: Counts,
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let conns = Conns::new(limits.max_connections, limits.max_connections_per_peer);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    let builder = Arc::new(builder);
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut stop => break,
            got = listener.accept() => match got {
                Ok(c) => c,
                // Out of fds or a connection reset before accept: wait a moment so a full fd
                // table does not spin this loop, then go on serving the open connections.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let held = match conns.admit(peer.ip()) {
            Ok(h) => h,
            Err(why) => {
                counts.refused.inc();
                tokio::spawn(async move {
                    let (mut stream, answer) = (stream, overloaded(why));
                    let write = stream.write_all(&answer);
                    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
                });
                continue;
            }
        };
        if held.evicted_one {
            counts.evicted.inc();
        }
        let _ = stream.set_nodelay(true);
        let svc =
            Marked { inner: TowerToHyperService::new(app.clone()), state: held.state.clone() };
        let (builder, mut stop_rx) = (builder.clone(), stop_rx.clone());
        let io = TokioIo::new(WriteStall::new(stream, limits.write_timeout));
        tokio::spawn(async move {
            let conn = builder.serve_connection(io, svc);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                // A newer connection took this one's place while it waited for a request head.
                // One that never asked is closed at once; an idle one may still be flushing
                // its last answer, so it is closed as hyper closes an idle connection, boundedly.
                _ = held.evict.notified() => {
                    if !held.state.is_fresh() {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(EVICT_FLUSH, conn).await;
                    }
                }
                _ = async { stop_rx.wait_for(|s| *s).await.is_ok() } => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(held);
        });
    }
    let _ = stop_tx.send(true);
    // Wait (boundedly) for the connections answering a request to finish.
    let _ = tokio::time::timeout(Duration::from_secs(5), conns.all_closed()).await;
    Ok(())
}

/// How long an evicted connection may take to flush what it had sent (its place is already
/// the new connection's).
const EVICT_FLUSH: Duration = Duration::from_secs(1);

/// Seconds a refused request's body is read for at most, before the refusal is sent.
pub const DRAIN_WITHIN: Duration = Duration::from_secs(5);
/// A refused request's body is read up to this many times `--max-body` (8 MiB at the default).
pub const DRAIN_BODIES: usize = 8;

/// Reads and discards `body` (at most [`DRAIN_BODIES`] × `max_body`, within `within` and at
/// most [`DRAIN_WITHIN`]) before a refusal is sent: most clients (Python's `urllib`, curl) send
/// a whole body before they read the answer, so closing on an unread body gives them a broken
/// pipe instead of the refusal (a 413 for a few MiB too many included). A longer body is not
/// read on: the refusal is sent and the connection closed. Costs time and bandwidth, no
/// memory, and is bounded like any body.
pub async fn drain(body: Body, within: Duration, max_body: usize) {
    let max = max_body.saturating_mul(DRAIN_BODIES);
    use futures_util::StreamExt;
    let mut data = body.into_data_stream();
    let read = async {
        let mut n = 0usize;
        while let Some(Ok(chunk)) = data.next().await {
            n += chunk.len();
            if n > max {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(within.min(DRAIN_WITHIN), read).await;
}

/// A request body that fails once it has taken longer than its deadline to arrive.
pub struct Deadline {
    inner: Body,
    sleep: Pin<Box<tokio::time::Sleep>>,
    after: Duration,
}

impl Deadline {
    /// `inner`, to be read whole within `after` from now.
    pub fn wrap(inner: Body, after: Duration) -> Body {
        let sleep = Box::pin(tokio::time::sleep(after));
        Body::new(Deadline { inner, sleep, after })
    }
}

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            let msg = format!(
                "the request body did not arrive within {} s (--body-timeout)",
                self.after.as_secs_f32()
            );
            return Poll::Ready(Some(Err(axum::Error::new(msg))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
