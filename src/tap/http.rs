//! The HTTP hand-off: how forwarded exchanges reach the HTTP observer without slowing the relay.
//!
//! Owns the bounded channel between the forwarding path and the observation task
//! ([`ExchangeSender`], [`ExchangeReceiver`]), what travels on it ([`ExchangeMsg`]: heads' metadata,
//! body chunks, ends, each stamped on the relay), and the one classification of a body by its
//! `Content-Type` and `Content-Encoding` ([`BodyKind`]) that both sides use, so the relay copies
//! exactly the bodies the observer reads. The stdio relay's counterpart is the tap itself
//! ([`super`]); a message-based channel here, because an exchange has heads and ends to report.
//! Must never block (a full channel is a counted drop, the next chunk marked `after_gap`), never
//! parse a body, and never import the observer, events or the reporter: the relay stays free of
//! them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderMap, CONTENT_ENCODING, CONTENT_TYPE};

/// The W3C trace context request header, handed on for observation only.
pub const HEADER_TRACEPARENT: &str = "traceparent";
use http::HeaderValue;
use tokio::sync::mpsc;

use super::Direction;

/// Messages in flight between the forwarding path and the observation task. A body chunk is one
/// read, and holds the buffer it was read into until observed: an answer's at most 64 KiB (the
/// upstream connections' exact read size, `crate::proxy::http`), a request's at most hyper's
/// ~400 KiB. So a lagging observer holds at most 16 MiB of answers (up to ~100 MiB only while
/// large uploads stream in); past that the forwarding path drops and counts.
pub const EXCHANGE_CAPACITY: usize = 256;

/// The HTTP method of an exchange, as far as observation cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqKind {
    Post,
    Get,
    Delete,
    Other,
}

/// What the forwarding path reports. Header values are `Bytes`-backed: cloning one is cheap.
#[derive(Debug)]
pub enum ExchangeMsg {
    /// A request arrived and is being forwarded.
    Request {
        ex: u64,
        kind: ReqKind,
        session: Option<HeaderValue>,
        /// The W3C `traceparent` header, if any: the trace calls in the body join when their
        /// `_meta` names none.
        traceparent: Option<HeaderValue>,
    },
    /// The upstream answered with this head.
    Response {
        ex: u64,
        status: u16,
        session: Option<HeaderValue>,
        content_type: Option<HeaderValue>,
        content_encoding: Option<HeaderValue>,
        seen: Instant,
    },
    /// Bytes forwarded in one direction.
    Chunk {
        ex: u64,
        dir: Direction,
        seen: Instant,
        bytes: Bytes,
        after_gap: bool,
    },
    /// A body ended, or (for `ServerToClient`) the exchange ended before a response body began.
    End {
        ex: u64,
        dir: Direction,
        seen: Instant,
        how: BodyEnd,
    },
    /// The upstream could not be reached or failed before answering: the client got a 502.
    Unreachable { ex: u64, seen: Instant },
}

/// How a forwarded body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// It reached its end.
    Complete,
    /// Its source failed mid-body (the upstream or the client dropped the connection).
    SourceFailed,
    /// Its reader went away first: the client disconnected (the cancellation in 2026-07-28).
    ReaderGone,
}

/// Counters shared by the forwarding path and the observation task.
#[derive(Debug, Default)]
pub struct ExchangeStats {
    pub sent: AtomicU64,
    pub dropped: AtomicU64,
    pub dropped_bytes: AtomicU64,
    /// Heads of POST requests dropped: requests the observer never hears of.
    pub dropped_posts: AtomicU64,
}

/// The forwarding path's handle: cheap to clone, never blocks.
#[derive(Clone)]
pub struct ExchangeSender {
    tx: mpsc::Sender<ExchangeMsg>,
    pub stats: Arc<ExchangeStats>,
}

impl ExchangeSender {
    /// Offers a message; a full channel is counted, never waited on. Returns whether it went.
    pub fn offer(&self, msg: ExchangeMsg) -> bool {
        let len = match &msg {
            ExchangeMsg::Chunk { bytes, .. } => bytes.len() as u64,
            _ => 0,
        };
        match self.tx.try_send(msg) {
            Ok(()) => {
                self.stats.sent.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                if let ExchangeMsg::Request {
                    kind: ReqKind::Post,
                    ..
                } = e.into_inner()
                {
                    self.stats.dropped_posts.fetch_add(1, Ordering::Relaxed);
                }
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                self.stats.dropped_bytes.fetch_add(len, Ordering::Relaxed);
                false
            }
        }
    }
}

/// The observation task's end of the channel; shares the drop counter, so the task knows when
/// a message it was owed never came.
pub struct ExchangeReceiver {
    rx: mpsc::Receiver<ExchangeMsg>,
    stats: Arc<ExchangeStats>,
}

impl ExchangeReceiver {
    /// The next message; `None` once every sender is gone and the channel is empty.
    pub async fn recv(&mut self) -> Option<ExchangeMsg> {
        self.rx.recv().await
    }

    /// A message already queued, without waiting.
    pub fn try_recv(&mut self) -> Result<ExchangeMsg, mpsc::error::TryRecvError> {
        self.rx.try_recv()
    }

    /// The channel's counters, as the senders update them.
    pub fn stats(&self) -> Arc<ExchangeStats> {
        self.stats.clone()
    }
}

/// A hand-off holding at most [`EXCHANGE_CAPACITY`] messages.
pub fn channel() -> (ExchangeSender, ExchangeReceiver) {
    let (tx, rx) = mpsc::channel(EXCHANGE_CAPACITY);
    let stats = Arc::new(ExchangeStats::default());
    (
        ExchangeSender {
            tx,
            stats: stats.clone(),
        },
        ExchangeReceiver { rx, stats },
    )
}

/// What a body is, for observation, from its `Content-Type` and `Content-Encoding`. The media
/// type's essence (parameters dropped) is matched exactly, in any case: `application/json`, any
/// `+json` type, or `text/event-stream`; `application/jsonl` is none of them. The relay copies a
/// body only when the observer will read it, and both decide by this one function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// JSON, identity-encoded: read whole.
    Json,
    /// An event stream, identity-encoded: read event by event.
    Sse,
    /// JSON or an event stream under a content encoding: relayed as sent, never read (the
    /// observer does not decompress).
    Compressed,
    /// No content type, identity-encoded: may still be JSON (a request is given the benefit of
    /// the doubt).
    Untyped,
    /// Anything else (a download, a compressed body of another type): nothing to read.
    Other,
}

impl BodyKind {
    pub fn of(
        content_type: Option<&HeaderValue>,
        content_encoding: Option<&HeaderValue>,
    ) -> BodyKind {
        let compressed =
            content_encoding.is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
        let Some(ct) = content_type else {
            return if compressed {
                BodyKind::Other
            } else {
                BodyKind::Untyped
            };
        };
        let essence = essence(ct);
        let readable = if is_json(essence) {
            BodyKind::Json
        } else if essence.eq_ignore_ascii_case(b"text/event-stream") {
            BodyKind::Sse
        } else {
            return BodyKind::Other;
        };
        if compressed {
            BodyKind::Compressed
        } else {
            readable
        }
    }

    /// [`BodyKind::of`] a message's headers.
    pub fn of_headers(headers: &HeaderMap) -> BodyKind {
        BodyKind::of(headers.get(CONTENT_TYPE), headers.get(CONTENT_ENCODING))
    }
}

/// Whether a response is an event stream, however it is encoded (a GET's is the session's
/// server→client channel, which the relay ends at shutdown).
pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|ct| essence(ct).eq_ignore_ascii_case(b"text/event-stream"))
}

/// The media type without its parameters or surrounding blanks.
fn essence(ct: &HeaderValue) -> &[u8] {
    let ct = ct.as_bytes();
    ct.split(|&b| b == b';').next().unwrap_or(ct).trim_ascii()
}

fn is_json(essence: &[u8]) -> bool {
    const SUFFIX: &[u8] = b"+json";
    essence.eq_ignore_ascii_case(b"application/json")
        || essence.len() > SUFFIX.len()
            && essence[essence.len() - SUFFIX.len()..].eq_ignore_ascii_case(SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(content_type: Option<&'static str>, encoding: Option<&'static str>) -> BodyKind {
        BodyKind::of(
            content_type.map(HeaderValue::from_static).as_ref(),
            encoding.map(HeaderValue::from_static).as_ref(),
        )
    }

    #[test]
    fn body_kind_matches_the_essence_exactly_in_any_case() {
        assert_eq!(kind(Some("application/jsonl"), None), BodyKind::Other);
        assert_eq!(kind(Some("application/json-seq"), None), BodyKind::Other);
        assert_eq!(
            kind(Some("Application/JSON; charset=utf-8"), None),
            BodyKind::Json
        );
        assert_eq!(kind(Some("application/vnd.x+json"), None), BodyKind::Json);
        assert_eq!(kind(Some("text/event-stream;x=1"), None), BodyKind::Sse);
        assert_eq!(kind(Some("TEXT/EVENT-STREAM"), None), BodyKind::Sse);
        assert_eq!(kind(Some("text/event-streams"), None), BodyKind::Other);
        assert_eq!(kind(Some("text/plain"), None), BodyKind::Other);
    }

    #[test]
    fn body_kind_of_an_encoded_body() {
        assert_eq!(
            kind(Some("application/json"), Some("gzip")),
            BodyKind::Compressed
        );
        assert_eq!(
            kind(Some("text/event-stream"), Some("br")),
            BodyKind::Compressed
        );
        assert_eq!(
            kind(Some("application/json"), Some("Identity")),
            BodyKind::Json
        );
        assert_eq!(kind(Some("text/plain"), Some("gzip")), BodyKind::Other);
        assert_eq!(kind(None, Some("gzip")), BodyKind::Other);
        assert_eq!(kind(None, None), BodyKind::Untyped);
    }

    #[test]
    fn an_event_stream_is_one_whatever_its_encoding() {
        let mut h = HeaderMap::new();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        h.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(is_event_stream(&h));
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/jsonl"));
        assert!(!is_event_stream(&h));
    }
}
