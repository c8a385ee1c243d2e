//! The HTTP hand-off: how forwarded exchanges reach the HTTP observer without slowing the relay.
//!
//! Owns the bounded queue between the forwarding path and the observation task
//! ([`ExchangeSender`], [`ExchangeReceiver`]), what travels on it ([`ExchangeMsg`]: heads' metadata,
//! body chunks, ends, each stamped on the relay), and the one classification of a body by its
//! `Content-Type` and `Content-Encoding` ([`BodyKind`]) that both sides use, so the relay copies
//! exactly the bodies the observer reads. The stdio relay's counterpart is the tap itself
//! ([`super`]); a queue of messages here, because an exchange has heads and ends to report.
//! As in the tap, a sender wakes the observer only when it is asleep, and then only for what
//! needs it: an answer's end, a failure, or a backlog ([`WAKE_MESSAGES`], [`WAKE_BYTES`]); a
//! request and the heads and chunks before its answer's end wait for it, so a call costs the
//! observer one wake-up, not one per message. Must never block (a full queue is a counted drop,
//! the next chunk marked `after_gap`), never parse a body, and never import the observer, events
//! or the reporter: the relay stays free of them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderMap, CONTENT_ENCODING, CONTENT_TYPE};
use http::HeaderValue;
use tokio::sync::Notify;

use super::{Direction, Drained};
use crate::lock::lock;

/// The W3C trace context request header, handed on for observation only.
pub const HEADER_TRACEPARENT: &str = "traceparent";

/// Messages in flight between the forwarding path and the observation task. A body chunk is one
/// read, and holds the buffer it was read into until observed: an answer's at most 64 KiB (the
/// upstream connections' exact read size, `crate::proxy::http`), a request's at most hyper's
/// ~400 KiB. So a lagging observer holds at most 16 MiB of answers (up to ~100 MiB only while
/// large uploads stream in); past that the forwarding path drops and counts.
pub const EXCHANGE_CAPACITY: usize = 256;

/// Messages queued that wake a sleeping observer though no answer has ended: requests the
/// upstream has not answered yet, or a long event stream, are taken in batches of about this
/// many, well before the queue is full.
pub const WAKE_MESSAGES: usize = EXCHANGE_CAPACITY / 4;

/// Body bytes queued that wake a sleeping observer though no answer has ended, as the stdio
/// tap's client chunks do (the same figure): a large upload or answer is taken as it streams,
/// not held whole in the queue.
pub const WAKE_BYTES: usize = super::CLIENT_WAKE_BYTES;

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

impl ExchangeMsg {
    /// Whether this ends an answer: its body's end, or the upstream's failure to give one. Such
    /// a message wakes a sleeping observer (see [`ExchangeSender::offer`]).
    pub fn ends_an_answer(&self) -> bool {
        matches!(
            self,
            ExchangeMsg::End {
                dir: Direction::ServerToClient,
                ..
            } | ExchangeMsg::Unreachable { .. }
        )
    }
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

/// The queue shared by the senders and the receiver.
struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the observer: only when it said it is waiting (see [`ExchangeSender::offer`]), and
    /// when the last sender goes away.
    wake: Notify,
}

struct Queue {
    msgs: VecDeque<ExchangeMsg>,
    /// Body bytes in `msgs` (see [`WAKE_BYTES`]).
    bytes: usize,
    senders: usize,
    /// The observer found the queue empty and is about to sleep until woken.
    waiting: bool,
    /// The receiver is gone: every offer is refused, and counted as a drop.
    closed: bool,
}

/// The forwarding path's handle: cheap to clone, never blocks.
pub struct ExchangeSender {
    shared: Arc<Shared>,
    pub stats: Arc<ExchangeStats>,
}

impl Clone for ExchangeSender {
    fn clone(&self) -> Self {
        lock(&self.shared.queue).senders += 1;
        ExchangeSender {
            shared: self.shared.clone(),
            stats: self.stats.clone(),
        }
    }
}

impl Drop for ExchangeSender {
    fn drop(&mut self) {
        let last = {
            let mut q = lock(&self.shared.queue);
            q.senders -= 1;
            q.senders == 0
        };
        // Only the last one: the forwarding path holds a sender per exchange, and a wake-up at
        // each one's end would be a look per request besides the one for its answer.
        if last {
            self.shared.wake.notify_one();
        }
    }
}

impl ExchangeSender {
    /// Offers a message; a full queue is counted, never waited on. Returns whether it went.
    /// Wakes a sleeping observer only for an answer's end, an unreachable upstream, or a backlog
    /// of [`WAKE_MESSAGES`] or [`WAKE_BYTES`]: what comes before an answer's end is read with it.
    pub fn offer(&self, msg: ExchangeMsg) -> bool {
        let len = match &msg {
            ExchangeMsg::Chunk { bytes, .. } => bytes.len(),
            _ => 0,
        };
        let ends_an_answer = msg.ends_an_answer();
        let refused = {
            let mut q = lock(&self.shared.queue);
            if q.closed || q.msgs.len() >= EXCHANGE_CAPACITY {
                Err(msg)
            } else {
                q.msgs.push_back(msg);
                q.bytes += len;
                let wake = q.waiting
                    && (ends_an_answer || q.msgs.len() >= WAKE_MESSAGES || q.bytes >= WAKE_BYTES);
                if wake {
                    q.waiting = false;
                }
                Ok(wake)
            }
        };
        match refused {
            Ok(wake) => {
                self.stats.sent.fetch_add(1, Ordering::Relaxed);
                if wake {
                    self.shared.wake.notify_one();
                }
                true
            }
            Err(msg) => {
                if let ExchangeMsg::Request {
                    kind: ReqKind::Post,
                    ..
                } = msg
                {
                    self.stats.dropped_posts.fetch_add(1, Ordering::Relaxed);
                }
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .dropped_bytes
                    .fetch_add(len as u64, Ordering::Relaxed);
                false
            }
        }
    }
}

/// The observation task's end of the queue; shares the drop counter, so the task knows when
/// a message it was owed never came.
pub struct ExchangeReceiver {
    shared: Arc<Shared>,
    stats: Arc<ExchangeStats>,
}

impl ExchangeReceiver {
    /// Moves everything queued into `out` (which should be empty; its allocation is reused).
    pub fn drain(&mut self, out: &mut VecDeque<ExchangeMsg>) -> Drained {
        let mut q = lock(&self.shared.queue);
        // Whoever drains is awake: a sleep that the tick ended, not an offer, leaves the flag set.
        q.waiting = false;
        Self::take(&mut q, out)
    }

    /// Like [`ExchangeReceiver::drain`], but when nothing is queued it sleeps until an offer
    /// that wakes it (see [`ExchangeSender::offer`]) or the last sender goes away. Returns
    /// [`Drained::Closed`] once every sender is gone and the queue is empty.
    pub async fn recv_many(&mut self, out: &mut VecDeque<ExchangeMsg>) -> Drained {
        loop {
            {
                let mut q = lock(&self.shared.queue);
                match Self::take(&mut q, out) {
                    Drained::Empty => q.waiting = true,
                    found => {
                        q.waiting = false;
                        return found;
                    }
                }
            }
            // A notify_one between the unlock and this await leaves a permit: nothing is missed.
            self.shared.wake.notified().await;
        }
    }

    fn take(q: &mut Queue, out: &mut VecDeque<ExchangeMsg>) -> Drained {
        if !q.msgs.is_empty() {
            std::mem::swap(&mut q.msgs, out);
            q.bytes = 0;
            Drained::Some
        } else if q.senders == 0 {
            Drained::Closed
        } else {
            Drained::Empty
        }
    }

    /// The queue's counters, as the senders update them.
    pub fn stats(&self) -> Arc<ExchangeStats> {
        self.stats.clone()
    }
}

impl Drop for ExchangeReceiver {
    fn drop(&mut self) {
        // Nobody will read what is queued: free its buffers now, and refuse what would follow.
        let mut q = lock(&self.shared.queue);
        q.closed = true;
        q.msgs.clear();
        q.bytes = 0;
    }
}

/// A hand-off holding at most [`EXCHANGE_CAPACITY`] messages.
pub fn channel() -> (ExchangeSender, ExchangeReceiver) {
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue {
            msgs: VecDeque::new(),
            bytes: 0,
            senders: 1,
            waiting: false,
            closed: false,
        }),
        wake: Notify::new(),
    });
    let stats = Arc::new(ExchangeStats::default());
    (
        ExchangeSender {
            shared: shared.clone(),
            stats: stats.clone(),
        },
        ExchangeReceiver { shared, stats },
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
pub(crate) mod tests {
    use super::*;

    /// Whether the receiver, asleep as [`ExchangeReceiver::recv_many`] leaves it, is woken soon.
    async fn woken(rx: &ExchangeReceiver) -> bool {
        let short = std::time::Duration::from_millis(50);
        tokio::time::timeout(short, rx.shared.wake.notified())
            .await
            .is_ok()
    }

    /// Finds the queue empty and goes to sleep, as the observer does.
    fn asleep(rx: &mut ExchangeReceiver) {
        assert_eq!(rx.drain(&mut VecDeque::new()), Drained::Empty);
        lock(&rx.shared.queue).waiting = true;
    }

    fn chunk(dir: Direction, n: usize) -> ExchangeMsg {
        ExchangeMsg::Chunk {
            ex: 1,
            dir,
            seen: Instant::now(),
            bytes: Bytes::from(vec![b'x'; n]),
            after_gap: false,
        }
    }

    /// Exchange 1's body in `dir` ended complete (the observer's tests use it too).
    pub(crate) fn end(dir: Direction) -> ExchangeMsg {
        ExchangeMsg::End {
            ex: 1,
            dir,
            seen: Instant::now(),
            how: BodyEnd::Complete,
        }
    }

    /// The head of request `ex` of `kind`, with no session.
    pub(crate) fn request(ex: u64, kind: ReqKind) -> ExchangeMsg {
        ExchangeMsg::Request {
            ex,
            kind,
            session: None,
            traceparent: None,
        }
    }

    /// The head of POST `ex`, with no session.
    pub(crate) fn post(ex: u64) -> ExchangeMsg {
        request(ex, ReqKind::Post)
    }

    #[tokio::test]
    async fn a_call_wakes_a_sleeping_receiver_once_at_its_answers_end() {
        let (tx, mut rx) = channel();
        asleep(&mut rx);
        let (c2s, s2c) = (Direction::ClientToServer, Direction::ServerToClient);
        let response = ExchangeMsg::Response {
            ex: 1,
            status: 200,
            session: None,
            content_type: None,
            content_encoding: None,
            seen: Instant::now(),
        };
        for msg in [
            post(1),
            chunk(c2s, 100),
            end(c2s),
            response,
            chunk(s2c, 100),
        ] {
            assert!(tx.offer(msg));
        }
        assert!(!woken(&rx).await, "a request and a partial answer wait");
        assert!(tx.offer(end(s2c)));
        assert!(woken(&rx).await, "the answer's end wakes the receiver");
        let mut out = VecDeque::new();
        assert_eq!(rx.drain(&mut out), Drained::Some);
        assert_eq!(
            out.len(),
            6,
            "everything before the end comes with it, in order"
        );
        assert!(matches!(out[0], ExchangeMsg::Request { .. }));
        assert!(out[5].ends_an_answer());

        asleep(&mut rx);
        assert!(tx.offer(ExchangeMsg::Unreachable {
            ex: 2,
            seen: Instant::now()
        }));
        assert!(
            woken(&rx).await,
            "an unreachable upstream ends the answer too"
        );
    }

    #[tokio::test]
    async fn a_receiver_that_drains_is_awake() {
        let (tx, mut rx) = channel();
        // Asleep, then woken by its timer (the tick), not by an offer: it drains.
        asleep(&mut rx);
        assert_eq!(rx.drain(&mut VecDeque::new()), Drained::Empty);
        assert!(tx.offer(end(Direction::ServerToClient)));
        assert!(!woken(&rx).await, "an awake receiver is not woken");
    }

    #[tokio::test]
    async fn a_backlog_wakes_a_sleeping_receiver() {
        let (tx, mut rx) = channel();
        let mut out = VecDeque::new();
        asleep(&mut rx);
        for _ in 1..WAKE_MESSAGES {
            assert!(tx.offer(post(1)));
        }
        assert!(!woken(&rx).await, "below the backlog: still asleep");
        assert!(tx.offer(post(1)));
        assert!(woken(&rx).await, "a backlog of messages wakes the receiver");
        assert_eq!(rx.drain(&mut out), Drained::Some);
        assert_eq!(out.len(), WAKE_MESSAGES);
        out.clear();

        asleep(&mut rx);
        let size = 64 * 1024;
        for _ in 1..WAKE_BYTES / size {
            assert!(tx.offer(chunk(Direction::ClientToServer, size)));
        }
        assert!(!woken(&rx).await, "below the byte backlog: still asleep");
        assert!(tx.offer(chunk(Direction::ClientToServer, size)));
        assert!(
            woken(&rx).await,
            "a backlog of body bytes wakes the receiver"
        );
        assert_eq!(rx.drain(&mut out), Drained::Some);
        out.clear();

        asleep(&mut rx);
        assert!(tx.offer(post(1)));
        assert!(
            !woken(&rx).await,
            "what was taken no longer counts towards the backlog"
        );
    }

    #[tokio::test]
    async fn only_the_last_sender_gone_wakes_and_closes() {
        let (tx, mut rx) = channel();
        let per_exchange = tx.clone();
        asleep(&mut rx);
        drop(per_exchange);
        assert!(!woken(&rx).await, "one exchange's sender ending is no news");
        assert_eq!(rx.drain(&mut VecDeque::new()), Drained::Empty);
        assert!(tx.offer(post(1)));
        drop(tx);
        let mut out = VecDeque::new();
        assert_eq!(rx.recv_many(&mut out).await, Drained::Some);
        assert_eq!(out.len(), 1, "what was queued is still read");
        out.clear();
        assert_eq!(rx.recv_many(&mut out).await, Drained::Closed);
    }

    #[test]
    fn a_full_or_abandoned_queue_refuses_and_counts() {
        let (tx, rx) = channel();
        let mut sent = 0;
        while tx.offer(post(1)) {
            sent += 1;
        }
        assert_eq!(sent, EXCHANGE_CAPACITY);
        assert!(!tx.offer(chunk(Direction::ServerToClient, 10)));
        let stats = rx.stats();
        assert_eq!(stats.dropped.load(Ordering::Relaxed), 2);
        assert_eq!(stats.dropped_posts.load(Ordering::Relaxed), 1);
        assert_eq!(stats.dropped_bytes.load(Ordering::Relaxed), 10);

        drop(rx);
        assert!(
            lock(&tx.shared.queue).msgs.is_empty(),
            "the receiver's end frees what it will never read"
        );
        assert!(!tx.offer(post(1)), "nobody reads past the receiver's end");
        assert_eq!(stats.dropped.load(Ordering::Relaxed), 3);
    }

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
