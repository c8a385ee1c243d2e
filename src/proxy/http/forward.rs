//! The forwarding path: one client request in, the same request to the upstream, its response
//! back — headers filtered for hop-by-hop only, bodies streamed frame by frame.
//!
//! Owns the header policy, the upstream URI mapping, the 502 for an unreachable upstream, the
//! refusal of requests [`Admission`] does not admit (before anything reaches the upstream), and
//! [`TeeBody`], the body wrapper that hands each forwarded chunk's `Bytes` copy to the
//! hand-off ([`crate::tap::http`]) after passing it on. Goes in: a hyper request. Comes out: a
//! hyper response whose body yields the upstream's frames as they arrive. It must never buffer a
//! body, add a header the upstream did not send, parse JSON, or wait on the observer.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;

use super::admit::{Admission, Refusal};
use super::{Stopping, Upstream};
use crate::tap::http::{is_event_stream, BodyEnd, BodyKind, ExchangeMsg, ExchangeSender, ReqKind};
use crate::tap::Direction;

/// `Mcp-Session-Id`: names the session the observer scopes correlation by (hashed there).
pub const HEADER_SESSION_ID: &str = "mcp-session-id";

/// Hop-by-hop headers (RFC 9110 §7.6.1) plus the `Proxy-*` family: they describe one
/// connection, so they stop here. Everything else is end-to-end and is passed on unchanged.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
];

/// Longest the proxy keeps reading a client's request body after the upstream failed, so the
/// calls in it can still be reported (as 502) — a slow client cannot hold a task for ever.
const FAILED_BODY_DRAIN: Duration = Duration::from_secs(10);

/// How upstream connections are made (TCP, then TLS for `https://`), shared by every client
/// connection's [`UpstreamClient`].
pub type UpstreamConnector = hyper_rustls::HttpsConnector<HttpConnector>;

/// The upstream client of one client connection. Bodies sent upstream are the client's own
/// body, teed.
pub type UpstreamClient = Client<UpstreamConnector, TeeBody>;

/// What the forwarding path shares across connections.
pub struct Forwarder {
    pub upstream: Upstream,
    pub connector: UpstreamConnector,
    /// `None` with the kill switch (or no observer): no observation at all.
    pub handoff: Option<ExchangeSender>,
    /// Which requests may reach the upstream (`Host`, `Origin`); kept with the kill switch.
    admission: Admission,
    /// Ends GET event streams when the listener stops.
    stopping: Stopping,
    next_exchange: AtomicU64,
}

impl Forwarder {
    pub(crate) fn new(
        upstream: Upstream,
        connector: UpstreamConnector,
        handoff: Option<ExchangeSender>,
        admission: Admission,
        stopping: Stopping,
    ) -> Self {
        Forwarder {
            upstream,
            connector,
            handoff,
            admission,
            stopping,
            next_exchange: AtomicU64::new(1),
        }
    }

    /// The listener's shutdown, as a connection waits for it.
    pub(crate) fn stopping(&self) -> Stopping {
        self.stopping.clone()
    }
}

/// Removes hop-by-hop headers, including any the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for h in HOP_BY_HOP {
        headers.remove(*h);
    }
    for h in &named {
        headers.remove(h);
    }
}

/// The response body the client reads: the upstream's (teed), or the proxy's own answer.
pub enum ProxyBody {
    Upstream(TeeBody),
    /// The upstream's answer to a GET that is an event stream: the server→client channel,
    /// open for the whole session, not a call in flight. It ends as soon as the listener stops
    /// (a clean end, as when a server closes its stream; the client may resume elsewhere with
    /// `Last-Event-ID`) rather than holding the shutdown until the drain deadline.
    Stream {
        body: TeeBody,
        stopped: Pin<Box<dyn Future<Output = ()> + Send>>,
    },
    Full(Option<Bytes>),
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        match this {
            ProxyBody::Upstream(b) => Pin::new(b).poll_frame(cx),
            ProxyBody::Stream { body, stopped } => {
                if stopped.as_mut().poll(cx).is_ready() {
                    // Dropping the upstream body closes the upstream's stream at once.
                    *this = ProxyBody::Full(None);
                    return Poll::Ready(None);
                }
                Pin::new(body).poll_frame(cx)
            }
            ProxyBody::Full(b) => Poll::Ready(b.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Upstream(b) | ProxyBody::Stream { body: b, .. } => b.is_end_stream(),
            ProxyBody::Full(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Upstream(b) | ProxyBody::Stream { body: b, .. } => b.size_hint(),
            ProxyBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }
}

/// Where a teed body sends its copies.
struct Tee {
    handoff: ExchangeSender,
    ex: u64,
    dir: Direction,
    /// A chunk of this body was dropped: the next one that gets through says so.
    gap: bool,
    /// The body can hold JSON-RPC: its chunks are copied. Otherwise only its end is reported.
    copy: bool,
}

impl Tee {
    fn chunk(&mut self, bytes: &Bytes) {
        if !self.copy {
            return;
        }
        let sent = self.handoff.offer(ExchangeMsg::Chunk {
            ex: self.ex,
            dir: self.dir,
            seen: Instant::now(),
            bytes: bytes.clone(),
            after_gap: self.gap,
        });
        self.gap = !sent;
    }

    fn end(&self, how: BodyEnd) {
        self.handoff.offer(ExchangeMsg::End {
            ex: self.ex,
            dir: self.dir,
            seen: Instant::now(),
            how,
        });
    }
}

/// A body forwarded frame by frame; each data frame's `Bytes` is cloned into the observation
/// channel after it was taken from the source (the clone is a reference count, not a copy).
/// When dropped before its end (the reader went away), the source is dropped with it, which
/// closes the other side's stream at once.
pub struct TeeBody {
    inner: Option<Incoming>,
    tee: Option<Tee>,
    done: bool,
    /// Request bodies only: where the unread rest of the body goes if the upstream request
    /// fails, so the proxy can still read the calls in it.
    give_back: Option<Arc<Mutex<Option<Incoming>>>>,
}

impl TeeBody {
    fn new(inner: Incoming, tee: Option<Tee>) -> Self {
        TeeBody {
            inner: Some(inner),
            tee,
            done: false,
            give_back: None,
        }
    }
}

impl Body for TeeBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(&mut *inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(tee), Some(data)) = (this.tee.as_mut(), frame.data_ref()) {
                    tee.chunk(data);
                }
                // hyper stops polling a body with a known length once it is complete, so the
                // end is taken from the length, not only from a final `None`.
                if inner.is_end_stream() {
                    this.done = true;
                    if let Some(tee) = &this.tee {
                        tee.end(BodyEnd::Complete);
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if !std::mem::replace(&mut this.done, true) {
                    if let Some(tee) = &this.tee {
                        tee.end(BodyEnd::SourceFailed);
                    }
                }
            }
            Poll::Ready(None) => {
                if !std::mem::replace(&mut this.done, true) {
                    if let Some(tee) = &this.tee {
                        tee.end(BodyEnd::Complete);
                    }
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

impl Drop for TeeBody {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.inner.as_ref().is_some_and(|b| b.is_end_stream()) {
            // Complete (an empty body, or hyper saw the whole length) but never polled to `None`.
            if let Some(tee) = &self.tee {
                tee.end(BodyEnd::Complete);
            }
            return;
        }
        if let Some(slot) = self.give_back.take() {
            *crate::lock::lock(&slot) = self.inner.take();
            // The caller reads the rest and ends the body itself.
            return;
        }
        if let Some(tee) = &self.tee {
            tee.end(BodyEnd::ReaderGone);
        }
    }
}

/// Ends an exchange the observer would otherwise never see end: the client went away before
/// the upstream's response head (the future was dropped), so no response body will report it.
struct ExchangeGuard<'a> {
    handoff: Option<&'a ExchangeSender>,
    ex: u64,
}

impl ExchangeGuard<'_> {
    fn answered(mut self) {
        self.handoff = None;
    }
}

impl Drop for ExchangeGuard<'_> {
    fn drop(&mut self) {
        if let Some(w) = self.handoff {
            w.offer(ExchangeMsg::End {
                ex: self.ex,
                dir: Direction::ServerToClient,
                seen: Instant::now(),
                how: BodyEnd::ReaderGone,
            });
        }
    }
}

/// Whether a body's chunks are copied to the hand-off: only when observation will read them
/// ([`BodyKind`], the rule it applies too). Anything else (a file download, a compressed body)
/// is relayed without copies, so it costs the observer nothing. A request without a content
/// type is given the benefit of the doubt.
fn may_hold_json_rpc(headers: &HeaderMap, untyped_ok: bool) -> bool {
    match BodyKind::of_headers(headers) {
        BodyKind::Json | BodyKind::Sse => true,
        BodyKind::Untyped => untyped_ok,
        BodyKind::Compressed | BodyKind::Other => false,
    }
}

fn req_kind(m: &Method) -> ReqKind {
    match *m {
        Method::POST => ReqKind::Post,
        Method::GET => ReqKind::Get,
        Method::DELETE => ReqKind::Delete,
        _ => ReqKind::Other,
    }
}

/// The local root and the upstream's own path both reach the upstream endpoint; any other path
/// goes to the same path on the upstream origin (OAuth discovery under `/.well-known/…` works).
pub fn upstream_uri(up: &Upstream, local: &Uri) -> Result<Uri, http::Error> {
    let path_and_query = match local.path() {
        "" | "/" => match (up.path_and_query.query(), local.query()) {
            (_, None) => up.path_and_query.as_str().to_string(),
            (None, Some(q)) => format!("{}?{q}", up.path_and_query.path()),
            (Some(uq), Some(q)) => format!("{}?{uq}&{q}", up.path_and_query.path()),
        },
        _ => local
            .path_and_query()
            .map_or_else(|| "/".to_string(), |pq| pq.as_str().to_string()),
    };
    Uri::builder()
        .scheme(up.scheme.clone())
        .authority(up.authority.clone())
        .path_and_query(path_and_query)
        .build()
}

fn plain(status: StatusCode, msg: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::Full(Some(Bytes::from_static(msg.as_bytes()))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// The answer to a request that is not admitted. The connection is closed after it: the
/// request's body is never read, and a refused peer gets no kept-alive connection.
fn refused(refusal: Refusal) -> Response<ProxyBody> {
    let mut resp = plain(refusal.status(), refusal.message());
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// Forwards one request. Never fails: an upstream failure is the client's 502.
pub async fn forward(
    fwd: Arc<Forwarder>,
    client: UpstreamClient,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, std::convert::Infallible> {
    let (mut parts, body) = req.into_parts();
    // First, before an exchange exists: a refused request is neither forwarded nor observed.
    if let Err(refusal) = fwd.admission.check(&parts.uri, &parts.headers) {
        return Ok(refused(refusal));
    }
    let uri = match upstream_uri(&fwd.upstream, &parts.uri) {
        Ok(u) => u,
        Err(_) => return Ok(plain(StatusCode::BAD_REQUEST, "Bad Request\n")),
    };
    let ex = fwd.next_exchange.fetch_add(1, Ordering::Relaxed);
    let kind = req_kind(&parts.method);
    if let Some(w) = &fwd.handoff {
        w.offer(ExchangeMsg::Request {
            ex,
            kind,
            session: parts.headers.get(HEADER_SESSION_ID).cloned(),
            traceparent: parts
                .headers
                .get(crate::tap::http::HEADER_TRACEPARENT)
                .cloned(),
        });
    }

    strip_hop_by_hop(&mut parts.headers);
    // The client sends our Host; the upstream gets its own (set by the client from the URI).
    parts.headers.remove(header::HOST);
    parts.uri = uri;
    parts.version = Version::HTTP_11;

    let tee = fwd.handoff.as_ref().map(|w| Tee {
        handoff: w.clone(),
        ex,
        dir: Direction::ClientToServer,
        gap: false,
        copy: kind == ReqKind::Post && may_hold_json_rpc(&parts.headers, true),
    });
    let observed = tee.is_some();
    let mut req_body = TeeBody::new(body, tee);
    let slot = Arc::new(Mutex::new(None));
    if observed {
        req_body.give_back = Some(slot.clone());
    }

    let guard = ExchangeGuard {
        handoff: fwd.handoff.as_ref(),
        ex,
    };
    let result = client.request(Request::from_parts(parts, req_body)).await;
    guard.answered();
    match result {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            if let Some(w) = &fwd.handoff {
                w.offer(ExchangeMsg::Response {
                    ex,
                    status: parts.status.as_u16(),
                    session: parts.headers.get(HEADER_SESSION_ID).cloned(),
                    content_type: parts.headers.get(header::CONTENT_TYPE).cloned(),
                    content_encoding: parts.headers.get(header::CONTENT_ENCODING).cloned(),
                    seen: Instant::now(),
                });
            }
            strip_hop_by_hop(&mut parts.headers);
            let copy = may_hold_json_rpc(&parts.headers, false);
            let tee = fwd.handoff.as_ref().map(|w| Tee {
                handoff: w.clone(),
                ex,
                dir: Direction::ServerToClient,
                gap: false,
                copy,
            });
            let body = TeeBody::new(body, tee);
            let body = if kind == ReqKind::Get && is_event_stream(&parts.headers) {
                ProxyBody::Stream {
                    body,
                    stopped: Box::pin(fwd.stopping.clone().stopped()),
                }
            } else {
                ProxyBody::Upstream(body)
            };
            Ok(Response::from_parts(parts, body))
        }
        Err(e) => {
            tracing::warn!(
                upstream = %fwd.upstream.display,
                connect = e.is_connect(),
                error = %error_chain(&e),
                "Upstream unreachable; answering 502"
            );
            if let Some(w) = &fwd.handoff {
                let rest = crate::lock::lock(&slot).take();
                drain_for_observation(w, ex, rest).await;
                w.offer(ExchangeMsg::Unreachable {
                    ex,
                    seen: Instant::now(),
                });
            }
            Ok(plain(
                StatusCode::BAD_GATEWAY,
                "Bad Gateway: upstream unreachable\n",
            ))
        }
    }
}

/// Reads what is left of a request body the upstream never took, into the observation channel
/// only, within a deadline: the calls in it become 502 events.
async fn drain_for_observation(w: &ExchangeSender, ex: u64, rest: Option<Incoming>) {
    let Some(rest) = rest else {
        return;
    };
    let mut body = TeeBody::new(
        rest,
        Some(Tee {
            handoff: w.clone(),
            ex,
            dir: Direction::ClientToServer,
            gap: false,
            copy: true,
        }),
    );
    let drained = tokio::time::timeout(FAILED_BODY_DRAIN, async {
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                break;
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::debug!("Gave up reading a failed request's body");
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(url: &str) -> Upstream {
        Upstream::parse(url).expect("valid upstream")
    }

    #[test]
    fn root_and_upstream_path_both_reach_the_endpoint() {
        let u = up("http://127.0.0.1:9/mcp");
        let root: Uri = "/".parse().expect("uri");
        let same: Uri = "/mcp".parse().expect("uri");
        let other: Uri = "/.well-known/oauth-protected-resource"
            .parse()
            .expect("uri");
        assert_eq!(
            upstream_uri(&u, &root).expect("ok").to_string(),
            "http://127.0.0.1:9/mcp"
        );
        assert_eq!(
            upstream_uri(&u, &same).expect("ok").to_string(),
            "http://127.0.0.1:9/mcp"
        );
        assert_eq!(
            upstream_uri(&u, &other).expect("ok").to_string(),
            "http://127.0.0.1:9/.well-known/oauth-protected-resource"
        );
    }

    #[test]
    fn root_query_is_merged_with_the_upstream_query() {
        let u = up("https://example.com/mcp?tenant=a");
        let root: Uri = "/?x=1".parse().expect("uri");
        assert_eq!(
            upstream_uri(&u, &root).expect("ok").to_string(),
            "https://example.com/mcp?tenant=a&x=1"
        );
    }

    #[test]
    fn only_uncompressed_json_and_sse_bodies_are_copied() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_static(v));
            }
            m
        };
        assert!(may_hold_json_rpc(
            &h(&[("content-type", "application/json; charset=utf-8")]),
            false
        ));
        assert!(may_hold_json_rpc(
            &h(&[("content-type", "Text/Event-Stream")]),
            false
        ));
        assert!(may_hold_json_rpc(
            &h(&[("content-type", "application/vnd.x+json")]),
            false
        ));
        assert!(!may_hold_json_rpc(
            &h(&[("content-type", "application/octet-stream")]),
            true
        ));
        assert!(!may_hold_json_rpc(
            &h(&[
                ("content-type", "application/json"),
                ("content-encoding", "gzip")
            ]),
            false
        ));
        assert!(may_hold_json_rpc(&h(&[]), true));
        assert!(!may_hold_json_rpc(&h(&[]), false));
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_stripped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert("proxy-authorization", HeaderValue::from_static("Basic x"));
        h.insert("mcp-session-id", HeaderValue::from_static("s"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(h.contains_key("mcp-session-id") && h.contains_key(header::AUTHORIZATION));
    }
}
