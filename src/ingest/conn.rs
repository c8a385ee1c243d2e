//! The ingest's connections: accept under a cap, serve HTTP/1.1, close the ones that stall.
//!
//! Goes in: the bound listener (plain TCP, or TLS: see [`super::tls`]), the router and the
//! [`Limits`]. Comes out: served connections,
//! until the stop signal; then no new connection is accepted, idle ones close, requests in
//! flight finish, and [`serve`] returns once every connection is gone.
//!
//! What it never lets a client do:
//! * hold more than [`Limits::max_connections`] connections open: one past the cap is closed as
//!   soon as it is accepted (its client sees the connection close), the others keep working;
//! * take longer than [`Limits::header_read_timeout`] to send a request head, counted from its
//!   first byte (Slowloris);
//! * keep a connection with no request in progress and nothing moving for longer than
//!   [`Limits::idle_timeout`] (idle keep-alive, or a response the client does not read).
//!
//! Both timers are kept here, per connection, rather than with hyper's `header_read_timeout`:
//! hyper (1.x) starts that timer as soon as a connection waits for a request, so an idle
//! keep-alive connection would get the header timeout instead of the idle one. A request in
//! progress is bounded by the handlers (body read timeout, store), not by these timers. With TLS
//! the timers see the decrypted bytes; the handshake has its own timeout
//! ([`super::tls::HANDSHAKE_TIMEOUT`]).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::tls::{IngestListener, IngestStream};
use super::Limits;
use crate::lock::lock;

/// The client address of a request's connection, in its extensions (the live view's sign-in
/// back-off counts failures per address).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub SocketAddr);

/// Accepts and serves connections on `listener` until `stop` resolves, then drains them.
pub(crate) async fn serve(
    mut listener: IngestListener,
    app: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) -> io::Result<()> {
    let cap = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (stopping_tx, stopping) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut at_cap = false;
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            // Accept errors (out of descriptors and the like) are retried, with a pause, inside.
            (stream, peer) = axum::serve::Listener::accept(&mut listener) => {
                match cap.clone().try_acquire_owned() {
                    Ok(permit) => {
                        at_cap = false;
                        conns.spawn(connection(stream, peer, app.clone(), limits, stopping.clone(), permit));
                    }
                    Err(_) => {
                        if !at_cap {
                            tracing::warn!(
                                max_connections = limits.max_connections,
                                "Connection cap reached; closing new connections until one ends"
                            );
                        }
                        at_cap = true;
                        // Closed before any TLS handshake: no work spent on it.
                        drop(stream);
                    }
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stopping_tx.send(true);
    while conns.join_next().await.is_some() {}
    Ok(())
}

/// Serves one connection until it closes, stalls past a timer, or shutdown lets it finish.
async fn connection(
    stream: IngestStream,
    peer: SocketAddr,
    app: Router,
    limits: Limits,
    mut stopping: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let clock = Arc::new(Clock::new());
    let io = TokioIo::new(Watched {
        inner: stream,
        clock: clock.clone(),
    });
    let svc_clock = clock.clone();
    let service = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
        req.extensions_mut().insert(Peer(peer));
        let in_flight = svc_clock.begin();
        let mut app = app.clone();
        let answer = tower_service::Service::call(&mut app, req);
        async move {
            let r = answer.await;
            drop(in_flight);
            r
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        // Timed by the `Clock` instead (module docs).
        .header_read_timeout(None)
        .serve_connection(io, service);
    tokio::pin!(conn);
    let expired = tokio::select! {
        served = conn.as_mut() => {
            if let Err(e) = served {
                tracing::debug!(error = %e, "Connection ended with an error");
            }
            return;
        }
        why = clock.expiry(&limits) => why,
        () = async {
            // Also when the sender is gone (the accept loop aborted): stop either way.
            let _ = stopping.wait_for(|s| *s).await;
        } => {
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = clock.expiry(&limits) => {}
            }
            return;
        }
    };
    // Dropping the connection closes the socket; no request is in progress.
    tracing::debug!(reason = expired.as_str(), "Connection closed");
}

/// Why a connection was closed by its clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// A request head was started and not finished in time.
    Header,
    /// Nothing in progress and nothing moving.
    Idle,
}

impl Expiry {
    fn as_str(self) -> &'static str {
        match self {
            Expiry::Header => "request head not received in time",
            Expiry::Idle => "idle",
        }
    }
}

struct ClockState {
    /// Requests handed to the router and not yet answered.
    in_flight: usize,
    /// Last byte read or written (or request answered).
    last_io: Instant,
    /// First byte read while no request was in progress: a request head has started.
    head_from: Option<Instant>,
}

/// What one connection is doing, as seen by its socket and its service.
struct Clock {
    state: Mutex<ClockState>,
    /// Woken when a deadline may have moved earlier (a head started, a request ended).
    changed: Notify,
}

/// A request in progress; ends (and restarts the idle timer) when dropped.
struct InFlight(Arc<Clock>);

impl Drop for InFlight {
    fn drop(&mut self) {
        {
            let mut st = self.0.lock();
            st.in_flight = st.in_flight.saturating_sub(1);
            st.last_io = Instant::now();
        }
        self.0.changed.notify_one();
    }
}

impl Clock {
    fn new() -> Self {
        Clock {
            state: Mutex::new(ClockState {
                in_flight: 0,
                last_io: Instant::now(),
                head_from: None,
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClockState> {
        lock(&self.state)
    }

    fn read(&self, n: usize) {
        if n == 0 {
            return;
        }
        let now = Instant::now();
        let started = {
            let mut st = self.lock();
            st.last_io = now;
            let starts = st.in_flight == 0 && st.head_from.is_none();
            if starts {
                st.head_from = Some(now);
            }
            starts
        };
        if started {
            self.changed.notify_one();
        }
    }

    fn wrote(&self, n: usize) {
        if n > 0 {
            self.lock().last_io = Instant::now();
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        let mut st = self.lock();
        st.in_flight += 1;
        st.head_from = None;
        InFlight(self.clone())
    }

    /// When this connection expires if nothing changes; `None` while a request is in progress.
    fn deadline(&self, limits: &Limits) -> Option<(Instant, Expiry)> {
        let st = self.lock();
        if st.in_flight > 0 {
            return None;
        }
        Some(match st.head_from {
            Some(t) => (t + limits.header_read_timeout, Expiry::Header),
            None => (st.last_io + limits.idle_timeout, Expiry::Idle),
        })
    }

    /// Resolves when a deadline passes with nothing having moved it.
    async fn expiry(&self, limits: &Limits) -> Expiry {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the state is read, so a change in between is not missed.
            changed.as_mut().enable();
            match self.deadline(limits) {
                None => changed.await,
                Some((at, why)) => {
                    if Instant::now() >= at {
                        return why;
                    }
                    tokio::select! {
                        () = tokio::time::sleep_until(at.into()) => {}
                        () = changed => {}
                    }
                }
            }
        }
    }
}

/// The connection's stream (plain or TLS), reporting every byte it carries to the connection's
/// [`Clock`].
struct Watched<S> {
    inner: S,
    clock: Arc<Clock>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            self.clock.read(buf.filled().len() - before);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = r {
            self.clock.wrote(n);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.clock.wrote(n);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
