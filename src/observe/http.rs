//! HTTP observation: turns the relay's hand-off of forwarded exchanges into observer calls.
//!
//! Owns the per-exchange state the [`Observer`] needs: which correlation scope an exchange
//! belongs to (one per `Mcp-Session-Id`, named by a keyed hash, [`SessionNamer`]; or one per
//! POST when there is no session), the request body until it is complete, and the response body
//! as JSON or as SSE events ([`super::sse`]). Bodies and events are kept as stdio lines are
//! ([`MessageBuf`]): a JSON object over [`super::frame::WHOLE_FRAME_BYTES`] only by its first
//! and last bytes, read as a skeleton, so a 20 MB tool result costs what a small one does and
//! its size is still exact. Goes in: [`ExchangeMsg`]s from the hand-off
//! ([`crate::tap::http`]). Comes out: `on_request_body`, `on_split`, `on_http_failure`,
//! `end_unobserved`, `set_scope_session`, `end_scope` calls on the observer, which correlates
//! and builds events as it does for stdio. It never touches the bytes the client or upstream
//! see, never holds a raw session id past hashing it, and bounds every buffer it keeps.
//!
//! An answer it cannot read is never reported as a failure (DESIGN §2 invariant 10): when a 2xx
//! response to a POST has no or another content type, is compressed, holds a message that cannot
//! be read (not a JSON object and over [`MAX_OBSERVED_BODY`], or an object whose ends do not
//! join), or lost messages on the channel, the calls of that POST still waiting
//! when the exchange ends make no event and count as unobserved (`--debug` totals), as in stdio.
//! A drop anywhere on the channel marks every exchange open at that moment, since the watcher
//! cannot tell whose message was lost. A POST whose request body (or its end, or its head) was
//! lost counts as one unobserved call: the server got it, the observer never read it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;

use super::frame::{Message, MessageBuf, SUMMARIZE};
use super::peek::RpcId;
use super::sse::SseParser;
use super::{EndCause, Observer, StreamId, TICK};
use crate::event::EventSink;
use crate::tap::http::{BodyEnd, BodyKind, ExchangeMsg, ExchangeReceiver, ExchangeStats, ReqKind};
use crate::tap::{Direction, Drained};

/// Largest JSON body (request, or `application/json` response) held whole for parsing when it
/// is not a JSON object (a batch): a larger one is relayed and counted, not parsed. A JSON
/// object of any size is read from its ends ([`MessageBuf`]). Also bounds the answers held for
/// a request not yet handed to the observer.
pub const MAX_OBSERVED_BODY: usize = 32 * 1024 * 1024;

/// Exchanges tracked at once. If an end message was dropped (full channel), the oldest
/// exchange is forgotten rather than kept for ever.
const MAX_EXCHANGES: usize = 4096;

/// Sessions remembered at once (hash → scope); the oldest is forgotten past this.
const MAX_SESSIONS: usize = 4096;

/// Hex characters of the HMAC-SHA-256 of `Mcp-Session-Id` that name a session in events:
/// 64 bits, enough to tell sessions apart, too short to be mistaken for the id itself.
const SESSION_HASH_HEX: usize = 16;

/// How long the observation task lets messages gather before reading them again while answers
/// come densely. Short against any call's duration (timings are stamped on the relay, not
/// here), long enough to batch a burst; at [`crate::tap::http::EXCHANGE_CAPACITY`] messages per
/// window the queue cannot fill on loopback speeds of small messages, and large bodies arrive in
/// large chunks.
const BATCH_WINDOW: Duration = Duration::from_millis(1);

/// A look that ends at most this many answers, after a sleep or a linger of at least
/// [`BATCH_WINDOW`], does not linger: answers come a call at a time, and a linger would cost a
/// second wake-up per call (the stdio observer's rule, `super::stdio::SPARSE_LOOK`). The
/// sender wakes the task for an answer's end, so a call made alone is one look.
const SPARSE_ANSWERS: usize = 1;

/// Names sessions in events: HMAC-SHA-256 of the raw `Mcp-Session-Id` under a key drawn at
/// random when the process starts and never stored or sent, short lower-case hex. Unkeyed, a
/// low-entropy session id could be recovered by hashing guesses, and the same session would
/// carry the same name at every sensor that saw it; keyed per process, a name means nothing
/// outside the process that made it. The raw value never leaves here. A name whose digits L4
/// would read as a card number or an IBAN would get every event of its session rejected by the
/// filter: it is signed again until clear (deterministic, so a session keeps one name).
pub struct SessionNamer {
    key: ring::hmac::Key,
}

impl SessionNamer {
    /// `None` if the system has no randomness to offer.
    pub fn new() -> Option<SessionNamer> {
        crate::random::hmac_key()
            .ok()
            .map(|key| SessionNamer { key })
    }

    pub fn name(&self, raw: &[u8]) -> String {
        let tag = ring::hmac::sign(&self.key, raw);
        let mut name = crate::event::hex_lower(&tag.as_ref()[..SESSION_HASH_HEX / 2]);
        while crate::event::privacy::contains_sensitive(&name) {
            let tag = ring::hmac::sign(&self.key, name.as_bytes());
            name = crate::event::hex_lower(&tag.as_ref()[..SESSION_HASH_HEX / 2]);
        }
        name
    }
}

/// How a response body is read for observation.
enum RespBody {
    Json {
        body: MessageBuf,
        usable: bool,
    },
    Sse(SseParser),
    /// Not JSON-RPC (another content type) or not readable (compressed): relayed, not parsed.
    Ignored,
}

struct Exchange {
    kind: ReqKind,
    req_session: Option<HeaderValue>,
    /// The request's `traceparent` header (see [`crate::tap::http::HEADER_TRACEPARENT`]).
    traceparent: Option<HeaderValue>,
    /// Known once the response head (or the failure) is.
    scope: Option<StreamId>,
    /// The scope lives only as long as this exchange (no session).
    own_scope: bool,
    /// The request body so far, as the observer will read it.
    req: MessageBuf,
    req_usable: bool,
    /// The request body once complete, until it is handed to the observer.
    req_msg: Option<Message>,
    req_done: Option<Instant>,
    /// The request frame has been handed to the observer (or given up on).
    req_fed: bool,
    status: Option<u16>,
    resp: Option<RespBody>,
    /// Response messages parsed before the request was fed; replayed right after it, so the
    /// observer always sees a request before its response.
    pending: Vec<(Instant, Message)>,
    pending_bytes: usize,
    /// The ids of the `tools/call` requests the request body started.
    calls: Vec<RpcId>,
    /// Some of the answer cannot be read (see the module docs): calls still waiting when the
    /// exchange ends are unobserved, not failed.
    answers_lost: bool,
    /// Part of the request body was dropped: whatever it carried is never observed.
    req_lost: bool,
}

/// Counters for `--debug`.
#[derive(Debug, Default, Clone)]
pub struct HttpTotals {
    pub exchanges: u64,
    pub unparsed_bodies: u64,
    pub compressed_bodies: u64,
    /// Exchanges forgotten to make room (`MAX_EXCHANGES` open at once): an end message was lost.
    pub evicted: u64,
    /// SSE events whose data could not be read (see [`super::sse::SseStats::oversized`]).
    pub oversized_events: u64,
}

struct Watcher<S: EventSink> {
    observer: Observer<S>,
    exchanges: BTreeMap<u64, Exchange>,
    /// Session name → (scope, order of first sight).
    sessions: HashMap<String, (StreamId, u64)>,
    next_scope: u64,
    totals: HttpTotals,
    /// `None`: no randomness for a key; sessions are then told apart but not named in events.
    namer: Option<SessionNamer>,
    /// The channel's counters, and how many drops have been accounted for.
    stats: Arc<ExchangeStats>,
    drops_seen: u64,
    /// The channel's count of dropped POST heads already counted as unobserved calls.
    posts_seen: u64,
}

impl<S: EventSink> Watcher<S> {
    fn new(observer: Observer<S>, stats: Arc<ExchangeStats>) -> Self {
        let namer = SessionNamer::new();
        if namer.is_none() {
            tracing::warn!("No randomness for a session key: events carry no session.id");
        }
        Watcher {
            observer,
            exchanges: BTreeMap::new(),
            sessions: HashMap::new(),
            next_scope: 1,
            totals: HttpTotals::default(),
            namer,
            stats,
            drops_seen: 0,
            posts_seen: 0,
        }
    }

    /// Before each message and each timeout check: if the channel dropped messages since the
    /// last look, any exchange open now may have lost some (its answer, its end), and so may
    /// any call the observer holds. A drop is counted before the next message of its sender is
    /// sent, so the message that would have completed a truncated answer never comes first.
    fn account_drops(&mut self) {
        let dropped = self.stats.dropped.load(Ordering::Relaxed);
        if dropped == self.drops_seen {
            return;
        }
        self.drops_seen = dropped;
        // A POST whose head was dropped is never heard of: counted here, once.
        let posts = self.stats.dropped_posts.load(Ordering::Relaxed);
        self.observer.stats.unobserved += posts.saturating_sub(self.posts_seen);
        self.posts_seen = posts;
        for x in self.exchanges.values_mut() {
            x.answers_lost = true;
        }
        self.observer.on_gap(Instant::now());
    }
}

/// Runs until every sender is gone, then returns the observer for `finish`.
pub async fn run<S: EventSink>(
    mut rx: ExchangeReceiver,
    observer: Observer<S>,
) -> (Observer<S>, HttpTotals) {
    let mut w = Watcher::new(observer, rx.stats());
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch = VecDeque::new();
    'run: loop {
        let asleep = Instant::now();
        let mut found = tokio::select! {
            found = rx.recv_many(&mut batch) => found,
            _ = tick.tick() => {
                w.account_drops();
                w.observer.on_tick(Instant::now());
                w.observer.sync_health(w.stats.dropped_bytes.load(Ordering::Relaxed));
                // What queued without waking the task (a stream's events, open requests).
                rx.drain(&mut batch)
            }
        };
        let slept = asleep.elapsed();
        let mut lingered = false;
        loop {
            match found {
                Drained::Closed => break 'run,
                Drained::Empty => break,
                Drained::Some => {}
            }
            let mut answers = 0;
            for m in batch.drain(..) {
                answers += usize::from(m.ends_an_answer());
                w.handle(m);
            }
            if answers <= SPARSE_ANSWERS && (lingered || slept >= BATCH_WINDOW) {
                break;
            }
            // Pause without waiting on the queue: offers made meanwhile wake no one, so while
            // answers come densely the relay pays about one cross-thread wake-up per batch.
            tokio::time::sleep(BATCH_WINDOW).await;
            lingered = true;
            found = rx.drain(&mut batch);
        }
    }
    w.account_drops();
    // Whatever is still open ended with the process.
    let now = Instant::now();
    let open: Vec<u64> = w.exchanges.keys().copied().collect();
    for ex in open {
        w.finish_exchange(ex, now, EndCause::SessionEnd);
    }
    w.observer
        .sync_health(w.stats.dropped_bytes.load(Ordering::Relaxed));
    (w.observer, w.totals)
}

fn is_2xx(status: u16) -> bool {
    (200..300).contains(&status)
}

impl<S: EventSink> Watcher<S> {
    fn handle(&mut self, msg: ExchangeMsg) {
        self.account_drops();
        match msg {
            ExchangeMsg::Request {
                ex,
                kind,
                session,
                traceparent,
            } => {
                self.totals.exchanges += 1;
                if self.exchanges.len() >= MAX_EXCHANGES {
                    if let Some((&old, x)) = self.exchanges.iter_mut().next() {
                        // No longer watched: whatever answer it gets goes unseen.
                        x.answers_lost = true;
                        self.totals.evicted += 1;
                        self.finish_exchange(old, Instant::now(), EndCause::SessionEnd);
                    }
                }
                self.exchanges.insert(
                    ex,
                    Exchange {
                        kind,
                        req_session: session,
                        traceparent,
                        scope: None,
                        own_scope: false,
                        req: MessageBuf::new(MAX_OBSERVED_BODY, SUMMARIZE),
                        req_usable: kind == ReqKind::Post,
                        req_msg: None,
                        req_done: None,
                        req_fed: kind != ReqKind::Post,
                        status: None,
                        resp: None,
                        pending: Vec::new(),
                        pending_bytes: 0,
                        calls: Vec::new(),
                        answers_lost: false,
                        req_lost: false,
                    },
                );
            }
            ExchangeMsg::Response {
                ex,
                status,
                session,
                content_type,
                content_encoding,
                seen,
            } => self.on_response(ex, status, session, content_type, content_encoding, seen),
            ExchangeMsg::Chunk {
                ex,
                dir,
                seen,
                bytes,
                after_gap,
            } => self.on_chunk(ex, dir, seen, &bytes, after_gap),
            ExchangeMsg::End { ex, dir, seen, how } => self.on_end(ex, dir, seen, how),
            ExchangeMsg::Unreachable { ex, seen } => {
                let Some(x) = self.exchanges.get_mut(&ex) else {
                    return;
                };
                x.status = Some(502);
                if x.scope.is_none() {
                    self.assign_scope(ex, None);
                }
                self.feed_request(ex);
                self.finish_exchange(ex, seen, EndCause::Transport);
            }
        }
    }

    fn scope_for_session(&mut self, raw: &HeaderValue) -> StreamId {
        // Without a key, a plain digest still tells sessions apart here; it never leaves.
        let (hash, named) = match &self.namer {
            Some(n) => (n.name(raw.as_bytes()), true),
            None => {
                let d = ring::digest::digest(&ring::digest::SHA256, raw.as_bytes());
                (crate::event::hex_lower(d.as_ref()), false)
            }
        };
        if let Some((scope, _)) = self.sessions.get(&hash) {
            return *scope;
        }
        if self.sessions.len() >= MAX_SESSIONS {
            if let Some(oldest) = self
                .sessions
                .iter()
                .min_by_key(|(_, (_, order))| *order)
                .map(|(h, _)| h.clone())
            {
                if let Some((scope, _)) = self.sessions.remove(&oldest) {
                    self.observer
                        .end_scope(scope, Instant::now(), EndCause::SessionEnd);
                }
            }
        }
        let scope = StreamId(self.next_scope);
        self.next_scope += 1;
        self.sessions.insert(hash.clone(), (scope, scope.0));
        if named {
            self.observer.set_scope_session(scope, hash);
        }
        scope
    }

    fn assign_scope(&mut self, ex: u64, resp_session: Option<&HeaderValue>) {
        let Some(x) = self.exchanges.get(&ex) else {
            return;
        };
        let session = x.req_session.clone().or_else(|| resp_session.cloned());
        let (scope, own) = match session {
            Some(s) => (self.scope_for_session(&s), false),
            None => {
                let scope = StreamId(self.next_scope);
                self.next_scope += 1;
                (scope, true)
            }
        };
        if let Some(x) = self.exchanges.get_mut(&ex) {
            x.scope = Some(scope);
            x.own_scope = own;
        }
    }

    fn on_response(
        &mut self,
        ex: u64,
        status: u16,
        session: Option<HeaderValue>,
        content_type: Option<HeaderValue>,
        content_encoding: Option<HeaderValue>,
        seen: Instant,
    ) {
        if !self.exchanges.contains_key(&ex) {
            return;
        }
        self.assign_scope(ex, session.as_ref());
        // The relay copied this body's chunks only if it is `Json` or `Sse`, by the same rule.
        let body = match BodyKind::of(content_type.as_ref(), content_encoding.as_ref()) {
            BodyKind::Json => RespBody::Json {
                body: MessageBuf::new(MAX_OBSERVED_BODY, SUMMARIZE),
                usable: true,
            },
            BodyKind::Sse => RespBody::Sse(SseParser::new()),
            BodyKind::Compressed => {
                if self.totals.compressed_bodies == 0 {
                    let encoding = content_encoding
                        .as_ref()
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                        .unwrap_or_default();
                    tracing::warn!(
                        encoding,
                        "The upstream compresses MCP responses: they are relayed as sent, and \
                         the calls they answer are not observed"
                    );
                }
                self.totals.compressed_bodies += 1;
                RespBody::Ignored
            }
            BodyKind::Untyped | BodyKind::Other => RespBody::Ignored,
        };
        let readable = matches!(body, RespBody::Json { .. } | RespBody::Sse(_));
        let Some(x) = self.exchanges.get_mut(&ex) else {
            return;
        };
        if !readable && is_2xx(status) && x.kind == ReqKind::Post {
            // The calls succeeded as far as anyone can tell; their answers cannot be read.
            x.answers_lost = true;
        }
        x.status = Some(status);
        x.resp = Some(body);
        let kind = x.kind;
        let scope = x.scope;
        let req_session = x.req_session.is_some();
        if x.req_done.is_some() {
            self.feed_request(ex);
        }
        if let Some(scope) = scope {
            // The session is over: DELETE accepted, or the upstream no longer knows it.
            let session_over =
                req_session && ((kind == ReqKind::Delete && is_2xx(status)) || status == 404);
            if session_over {
                self.observer.end_scope(scope, seen, EndCause::SessionEnd);
                self.sessions.retain(|_, (s, _)| *s != scope);
            }
        }
    }

    /// Hands the complete request body to the observer once its scope is known; then any
    /// response messages that arrived first; then, for a non-2xx answer, the failure.
    fn feed_request(&mut self, ex: u64) {
        let Some(x) = self.exchanges.get_mut(&ex) else {
            return;
        };
        if x.req_fed {
            return;
        }
        let (Some(scope), Some(seen)) = (x.scope, x.req_done) else {
            return;
        };
        x.req_fed = true;
        // What is read of the request: the body whole, or the skeleton of a large object.
        let req = match x.req_msg.take() {
            Some(Message::Frame(b)) if x.req_usable => Some(Message::Frame(b)),
            Some(m @ Message::Summary { .. }) if x.req_usable => Some(m),
            _ => None,
        };
        let pending = std::mem::take(&mut x.pending);
        x.pending_bytes = 0;
        let status = x.status;
        let kind = x.kind;
        if let Some(req) = &req {
            let traceparent = x.traceparent.take();
            let traceparent = traceparent.as_ref().and_then(|v| v.to_str().ok());
            let calls =
                self.observer
                    .on_request_body_traced(scope, seen, req.as_split(), traceparent);
            if let Some(x) = self.exchanges.get_mut(&ex) {
                x.calls = calls;
            }
        } else if kind == ReqKind::Post {
            self.totals.unparsed_bodies += 1;
        }
        for (t, m) in pending {
            self.observer
                .on_split(scope, Direction::ServerToClient, t, m.as_split());
        }
        if let Some(status) = status.filter(|s| !is_2xx(*s)) {
            let read = match &req {
                Some(Message::Frame(b)) => Some(&b[..]),
                Some(Message::Summary { skeleton, .. }) => Some(&skeleton[..]),
                _ => None,
            };
            if let Some(read) = read {
                self.observer.on_http_failure(scope, read, status, seen);
            }
        }
    }

    fn on_chunk(&mut self, ex: u64, dir: Direction, seen: Instant, bytes: &[u8], gap: bool) {
        let Some(x) = self.exchanges.get_mut(&ex) else {
            return;
        };
        match dir {
            Direction::ClientToServer => {
                if !x.req_usable || x.req_fed {
                    return;
                }
                if gap {
                    x.req_usable = false;
                    x.req_lost = true;
                    x.req.discard();
                } else {
                    x.req.push(bytes);
                }
            }
            Direction::ServerToClient => {
                let mut msgs: Vec<Message> = Vec::new();
                match &mut x.resp {
                    None => {
                        // A body without a head: the head was dropped.
                        x.answers_lost = true;
                        return;
                    }
                    Some(RespBody::Ignored) => return,
                    Some(RespBody::Json { body, usable }) => {
                        if !*usable {
                            return;
                        }
                        if gap {
                            *usable = false;
                            body.discard();
                            x.answers_lost = true;
                        } else {
                            body.push(bytes);
                        }
                        return;
                    }
                    Some(RespBody::Sse(p)) => {
                        if gap {
                            p.lost_bytes();
                            x.answers_lost = true;
                        }
                        let oversized = p.stats.oversized;
                        // Owned: an event may wait for its request (see `s2c_message`); of a
                        // large one only its skeleton is kept.
                        p.feed(bytes, &mut |s| msgs.push(s.to_message()));
                        self.totals.oversized_events += p.stats.oversized - oversized;
                    }
                }
                for m in msgs {
                    self.s2c_message(ex, seen, m);
                }
            }
        }
    }

    /// One server→client message (a JSON body, an SSE event's data), as [`MessageBuf`] kept it.
    fn s2c_message(&mut self, ex: u64, seen: Instant, msg: Message) {
        let Some(x) = self.exchanges.get_mut(&ex) else {
            return;
        };
        if matches!(msg, Message::Oversize(_)) {
            // It may have been the answer: calls still waiting at the end are unobserved.
            x.answers_lost = true;
        }
        match x.scope {
            Some(scope) if x.req_fed => {
                self.observer
                    .on_split(scope, Direction::ServerToClient, seen, msg.as_split());
            }
            _ => {
                // Bounded: a request that never completes cannot make us hold its stream.
                let n = msg.held_bytes();
                if x.pending_bytes + n <= MAX_OBSERVED_BODY {
                    x.pending_bytes += n;
                    x.pending.push((seen, msg));
                } else {
                    x.answers_lost = true;
                    self.totals.unparsed_bodies += 1;
                }
            }
        }
    }

    fn on_end(&mut self, ex: u64, dir: Direction, seen: Instant, how: BodyEnd) {
        let complete = how == BodyEnd::Complete;
        let Some(x) = self.exchanges.get_mut(&ex) else {
            return;
        };
        match dir {
            Direction::ClientToServer => {
                if !complete {
                    x.req_usable = false;
                }
                x.req_msg = if x.req_usable { x.req.take() } else { None };
                x.req_done = Some(seen);
                if x.scope.is_some() {
                    self.feed_request(ex);
                }
            }
            Direction::ServerToClient => {
                if x.resp.is_none() && how != BodyEnd::ReaderGone {
                    // A body ended whose head never came: the head was dropped.
                    x.answers_lost = true;
                }
                if let Some(RespBody::Json { mut body, usable }) = x.resp.take() {
                    let read = if usable && complete {
                        body.take()
                    } else {
                        None
                    };
                    match read {
                        Some(m) => {
                            if matches!(m, Message::Oversize(_)) {
                                self.totals.unparsed_bodies += 1;
                            }
                            self.s2c_message(ex, seen, m);
                        }
                        None => self.totals.unparsed_bodies += 1,
                    }
                }
                // A client that went away cancelled what it was waiting for; an upstream that
                // failed mid-body is a transport end.
                let cause = match how {
                    BodyEnd::Complete => EndCause::SessionEnd,
                    BodyEnd::ReaderGone => EndCause::ClientClosed,
                    BodyEnd::SourceFailed => EndCause::Transport,
                };
                self.finish_exchange(ex, seen, cause);
            }
        }
    }

    /// Forgets an exchange; a per-exchange scope ends with it.
    fn finish_exchange(&mut self, ex: u64, seen: Instant, cause: EndCause) {
        // Ended before any response head (the client gave up while waiting): the request is
        // still reported, in its session or in a scope of its own that ends right here.
        if self
            .exchanges
            .get(&ex)
            .is_some_and(|x| x.scope.is_none() && x.req_done.is_some())
        {
            self.assign_scope(ex, None);
        }
        self.feed_request(ex);
        let Some(x) = self.exchanges.remove(&ex) else {
            return;
        };
        // A request body lost to a drop, or never ended because its end was: one message the
        // server got and the observer did not read, counted as an unobserved call as in stdio
        // (`super::stdio`, `LostRequests`). A body its client abandoned is not: the server got
        // no whole request either.
        if x.kind == ReqKind::Post && (x.req_lost || !x.req_fed) {
            self.observer.requests_lost(1);
        }
        if let (Some(scope), true) = (x.scope, x.answers_lost) {
            self.observer.end_unobserved(scope, &x.calls);
        }
        if let (Some(scope), true) = (x.scope, x.own_scope) {
            self.observer.end_scope(scope, seen, cause);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;
    use crate::observe::{ObserverConfig, ObserverStats, Transport};
    use crate::tap::http::tests::{end, post, request};
    use bytes::Bytes;

    #[test]
    fn session_name_is_short_stable_hex_keyed_per_namer() {
        let namer = SessionNamer::new().expect("randomness");
        let h = namer.name(b"secret-session-123");
        assert_eq!(h.len(), SESSION_HASH_HEX);
        assert!(h.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(h, namer.name(b"secret-session-123"));
        assert_ne!(h, namer.name(b"secret-session-124"));
        assert!(!h.contains("secret"));
        let other = SessionNamer::new().expect("randomness");
        assert_ne!(
            h,
            other.name(b"secret-session-123"),
            "another key, another name"
        );
        let plain = ring::digest::digest(&ring::digest::SHA256, b"secret-session-123");
        assert_ne!(
            h,
            crate::event::hex_lower(&plain.as_ref()[..SESSION_HASH_HEX / 2])
        );
    }

    const CALL: &[u8] =
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#;
    const ANSWER: &[u8] = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#;

    fn watcher() -> Watcher<Vec<Event>> {
        let cfg = ObserverConfig {
            transport: Transport::Http {
                host: "127.0.0.1:9".into(),
            },
            server_name: None,
            actor: "mcp:k1".into(),
            on_behalf_of: None,
            capture: vec![],
            capture_text: vec![],
            call_timeout: Duration::from_secs(30),
        };
        Watcher::new(Observer::new(cfg, Vec::new()), Arc::default())
    }

    fn chunk(dir: Direction, bytes: &'static [u8], after_gap: bool) -> ExchangeMsg {
        ExchangeMsg::Chunk {
            ex: 1,
            dir,
            seen: Instant::now(),
            bytes: Bytes::from_static(bytes),
            after_gap,
        }
    }

    /// The head of `ex`'s answer, with no session.
    fn answer_head(ex: u64, status: u16, content_type: &'static str) -> ExchangeMsg {
        ExchangeMsg::Response {
            ex,
            status,
            session: None,
            content_type: Some(HeaderValue::from_static(content_type)),
            content_encoding: None,
            seen: Instant::now(),
        }
    }

    /// One POST carrying [`CALL`], answered 200 with `content_type`; `answer` are the response
    /// body's messages as the watcher gets them.
    fn exchange(
        content_type: &'static str,
        answer: Vec<ExchangeMsg>,
    ) -> (ObserverStats, Vec<Event>) {
        let mut w = watcher();
        w.handle(post(1));
        w.handle(chunk(Direction::ClientToServer, CALL, false));
        w.handle(end(Direction::ClientToServer));
        w.handle(answer_head(1, 200, content_type));
        for m in answer {
            w.handle(m);
        }
        w.handle(end(Direction::ServerToClient));
        w.observer.finish(Instant::now(), EndCause::SessionEnd)
    }

    #[test]
    fn a_read_answer_is_reported() {
        let s2c = Direction::ServerToClient;
        let (stats, events) = exchange("application/json", vec![chunk(s2c, ANSWER, false)]);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].status, 200);
        assert_eq!(stats.unobserved, 0);
    }

    /// A chunk of the answer was dropped (full channel): the call succeeded for the client, so
    /// it makes no event rather than a false 504, and is counted as unobserved.
    #[test]
    fn dropped_chunk_makes_the_call_unobserved_not_a_timeout() {
        let s2c = Direction::ServerToClient;
        let (head, tail) = ANSWER.split_at(20);
        let (_, tail) = tail.split_at(5);
        for ct in ["application/json", "text/event-stream"] {
            let (head, tail): (&'static [u8], &'static [u8]) = if ct == "application/json" {
                (head, tail)
            } else {
                (b"event: message\ndata: ", b"\n\n")
            };
            let (stats, events) =
                exchange(ct, vec![chunk(s2c, head, false), chunk(s2c, tail, true)]);
            assert!(events.is_empty(), "{ct}: {events:?}");
            assert_eq!(stats.unobserved, 1, "{ct}");
        }
    }

    /// The request body, or its end, was dropped: the server got a call the observer never
    /// read. It makes no event (its answer matches no request, and is not an orphan the server
    /// sent) and is counted as unobserved, as in stdio. A body its client abandoned is not
    /// counted: the server got no whole request.
    #[test]
    fn a_request_lost_to_a_drop_is_an_unobserved_call() {
        let (c2s, s2c) = (Direction::ClientToServer, Direction::ServerToClient);
        let head = |w: &mut Watcher<Vec<Event>>| w.handle(post(1));
        let answer = |w: &mut Watcher<Vec<Event>>| {
            w.handle(answer_head(1, 200, "application/json"));
            w.handle(chunk(s2c, ANSWER, false));
            w.handle(end(s2c));
        };
        let (head_of_call, rest) = CALL.split_at(30);
        let (_, tail) = rest.split_at(5);
        // The body's middle dropped: its last chunk comes after a gap.
        let mut w = watcher();
        head(&mut w);
        w.handle(chunk(c2s, head_of_call, false));
        w.handle(chunk(c2s, tail, true));
        w.handle(end(c2s));
        answer(&mut w);
        let (stats, events) = w.observer.finish(Instant::now(), EndCause::SessionEnd);
        assert!(events.is_empty(), "{events:?}");
        // Its answer is put down to the lost request, not counted as the server's orphan.
        assert_eq!((stats.unobserved, stats.orphan_responses), (1, 0));
        // The body's end dropped: the exchange ends with the request never complete.
        let mut w = watcher();
        head(&mut w);
        w.handle(chunk(c2s, CALL, false));
        answer(&mut w);
        let (stats, events) = w.observer.finish(Instant::now(), EndCause::SessionEnd);
        assert!(events.is_empty(), "{events:?}");
        assert_eq!(stats.unobserved, 1);
        // The client abandoned its body: nothing the server executed, nothing counted.
        let mut w = watcher();
        head(&mut w);
        w.handle(chunk(c2s, head_of_call, false));
        w.handle(ExchangeMsg::End {
            ex: 1,
            dir: c2s,
            seen: Instant::now(),
            how: BodyEnd::SourceFailed,
        });
        answer(&mut w);
        let (stats, events) = w.observer.finish(Instant::now(), EndCause::SessionEnd);
        assert!(events.is_empty(), "{events:?}");
        assert_eq!(stats.unobserved, 0);
    }

    /// A POST whose head the channel dropped is never heard of: counted once, when the watcher
    /// learns of the drop.
    #[test]
    fn a_dropped_request_head_is_an_unobserved_call() {
        let (tx, rx) = crate::tap::http::channel();
        let mut w = watcher();
        w.stats = rx.stats();
        let mut offered = 0;
        while tx.offer(request(offered, ReqKind::Get)) {
            offered += 1;
        }
        for kind in [ReqKind::Post, ReqKind::Post, ReqKind::Delete] {
            assert!(!tx.offer(request(offered, kind)));
        }
        w.account_drops();
        w.account_drops();
        assert_eq!(w.observer.stats.unobserved, 2, "the two POSTs, once");
    }

    /// A `tools/call` result with `n` bytes of text, in the TypeScript SDK's field order (`id`
    /// last, after `isError`).
    fn big_answer(n: usize, is_error: bool) -> Vec<u8> {
        format!(
            r#"{{"result":{{"content":[{{"type":"text","text":"{}"}}],"isError":{is_error}}},"jsonrpc":"2.0","id":1}}"#,
            "r".repeat(n)
        )
        .into_bytes()
    }

    /// `message` as the body of a `content_type` answer: itself, or one SSE event.
    fn as_body(content_type: &str, message: &[u8]) -> Vec<u8> {
        if content_type == "application/json" {
            return message.to_vec();
        }
        let mut sse = b": ping\r\n\r\nevent: message\r\ndata: ".to_vec();
        sse.extend_from_slice(message);
        sse.extend_from_slice(b"\r\n\r\n");
        sse
    }

    const CONTENT_TYPES: [&str; 2] = ["application/json", "text/event-stream"];

    /// Bytes the watcher holds for exchange `ex`'s request and response bodies.
    fn held(w: &Watcher<Vec<Event>>, ex: u64) -> usize {
        let Some(x) = w.exchanges.get(&ex) else {
            return 0;
        };
        x.req.buffered_capacity()
            + match x.resp.as_ref() {
                Some(RespBody::Json { body, .. }) => body.buffered_capacity(),
                Some(RespBody::Sse(p)) => p.buffered_capacity(),
                _ => 0,
            }
    }

    /// Most the watcher may hold of an exchange's bodies: a buffer grown to the summary
    /// threshold (twice, at worst, by doubling), then the head and tail.
    const HELD: usize = 2 * super::super::frame::WHOLE_FRAME_BYTES + 64 * 1024;

    /// One POST exchange `ex`: `request`, answered `status` with `content_type` and `answer`,
    /// both bodies cut in 64 KiB chunks; checks after each that the watcher holds at most
    /// `bound` bytes of them.
    fn round(
        w: &mut Watcher<Vec<Event>>,
        ex: u64,
        request: &[u8],
        (status, content_type): (u16, &'static str),
        answer: &[u8],
        bound: usize,
    ) {
        let chunks = |dir, body: &[u8]| -> Vec<ExchangeMsg> {
            body.chunks(64 * 1024)
                .map(|c| ExchangeMsg::Chunk {
                    ex,
                    dir,
                    seen: Instant::now(),
                    bytes: Bytes::copy_from_slice(c),
                    after_gap: false,
                })
                .collect()
        };
        let end = |dir| ExchangeMsg::End {
            ex,
            dir,
            seen: Instant::now(),
            how: BodyEnd::Complete,
        };
        w.handle(post(ex));
        for m in chunks(Direction::ClientToServer, request) {
            w.handle(m);
            assert!(held(w, ex) <= bound);
        }
        w.handle(end(Direction::ClientToServer));
        w.handle(answer_head(ex, status, content_type));
        for m in chunks(Direction::ServerToClient, answer) {
            w.handle(m);
            assert!(held(w, ex) <= bound, "{content_type}");
        }
        w.handle(end(Direction::ServerToClient));
    }

    /// A 4 MB result, as a JSON body and as one SSE event, is read from its ends: its
    /// `isError` (in its last bytes) gives the status, its size is exact, and the watcher never
    /// holds more than the summary threshold of it.
    #[test]
    fn a_large_answer_is_read_from_its_ends() {
        let answer = big_answer(4_000_000, true);
        for ct in CONTENT_TYPES {
            let mut w = watcher();
            round(&mut w, 1, CALL, (200, ct), &as_body(ct, &answer), HELD);
            let (stats, events) = w.observer.finish(Instant::now(), EndCause::SessionEnd);
            assert_eq!(events.len(), 1, "{ct}");
            assert_eq!(events[0].status, 500, "{ct}");
            assert_eq!(events[0].bytes.resp, answer.len() as u64, "{ct}");
            assert_eq!(events[0].bytes.req, CALL.len() as u64, "{ct}");
            assert_eq!((stats.summarized, stats.unobserved), (1, 0), "{ct}");
        }
    }

    /// A large request (an upload in the arguments, `id` last) is read from its ends too: the
    /// call is known, and a failed POST ends it with the upstream's status.
    #[test]
    fn a_large_request_is_read_from_its_ends() {
        let call = format!(
            r#"{{"method":"tools/call","params":{{"name":"upload","arguments":{{"blob":"{}"}}}},"jsonrpc":"2.0","id":1}}"#,
            "b".repeat(1_000_000)
        );
        for (status, answer) in [(200, ANSWER), (503, &b""[..])] {
            let mut w = watcher();
            let head = (status, "application/json");
            round(&mut w, 1, call.as_bytes(), head, answer, HELD);
            let (_, events) = w.observer.finish(Instant::now(), EndCause::SessionEnd);
            assert_eq!(events.len(), 1, "{status}");
            assert_eq!(events[0].rec.action, "upload");
            assert_eq!(events[0].status, status);
            assert_eq!(events[0].bytes.req, call.len() as u64);
        }
    }

    /// As in stdio, a `tools/list` answer over the summary threshold is read whole up to the
    /// catalog limit, so the calls after it carry the catalog's version; a larger one is read
    /// from its ends, and the calls after it carry none.
    #[test]
    fn a_catalog_is_read_whole_up_to_the_catalog_limit() {
        use super::super::frame::{CATALOG_FRAME_BYTES, WHOLE_FRAME_BYTES};
        let list = |id: u64, desc: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[{{"name":"echo","description":"{desc}","inputSchema":{{"type":"object"}}}}]}}}}"#
            )
        };
        for ct in CONTENT_TYPES {
            let mut w = watcher();
            let pages = [
                "c".repeat(WHOLE_FRAME_BYTES + 10),
                "d".repeat(CATALOG_FRAME_BYTES + 10),
            ];
            for (i, desc) in (0u64..).zip(&pages) {
                let ask = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
                let page = list(1, desc);
                let page = as_body(ct, page.as_bytes());
                round(
                    &mut w,
                    2 * i + 1,
                    ask,
                    (200, ct),
                    &page,
                    2 * CATALOG_FRAME_BYTES,
                );
                round(
                    &mut w,
                    2 * i + 2,
                    CALL,
                    (200, ct),
                    &as_body(ct, ANSWER),
                    HELD,
                );
            }
            let (stats, events) = w.observer.finish(Instant::now(), EndCause::SessionEnd);
            assert_eq!(
                stats.summarized, 1,
                "{ct}: only the page over the catalog limit"
            );
            let versions: Vec<_> = events.iter().map(|e| &e.rec.registry_version).collect();
            assert!(versions[0].is_some(), "{ct}: the page was read whole");
            assert_eq!(
                versions[1], &None,
                "{ct}: a catalog seen in part has no version"
            );
        }
    }

    /// An answer whose ends do not join into JSON cannot be read: the call it answers makes no
    /// event (a 504 would be false) and is counted as unobserved, as JSON and as SSE.
    #[test]
    fn an_unreadable_large_answer_makes_the_call_unobserved() {
        let broken = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":"{}"#,
            "u".repeat(400_000)
        );
        for ct in CONTENT_TYPES {
            let mut w = watcher();
            round(
                &mut w,
                1,
                CALL,
                (200, ct),
                &as_body(ct, broken.as_bytes()),
                HELD,
            );
            let (stats, events) = w.observer.finish(Instant::now(), EndCause::SessionEnd);
            assert!(events.is_empty(), "{ct}: {events:?}");
            assert_eq!((stats.unobserved, stats.oversize), (1, 1), "{ct}");
        }
    }

    /// A watcher that has seen a whole `tools/call` POST in session `s-1` and the head of its
    /// JSON answer, and no answer body yet.
    fn call_answered_with_json_head() -> Watcher<Vec<Event>> {
        let mut w = watcher();
        w.handle(ExchangeMsg::Request {
            ex: 1,
            kind: ReqKind::Post,
            session: Some(HeaderValue::from_static("s-1")),
            traceparent: None,
        });
        w.handle(chunk(Direction::ClientToServer, CALL, false));
        w.handle(end(Direction::ClientToServer));
        w.handle(answer_head(1, 200, "application/json"));
        w
    }

    /// The last chunk of an answer was dropped: no later chunk carries the gap, but the
    /// channel's drop counter, bumped before the end was sent, does.
    #[test]
    fn dropped_last_chunk_is_known_from_the_drop_counter() {
        let mut w = call_answered_with_json_head();
        w.handle(chunk(Direction::ServerToClient, &ANSWER[..20], false));
        w.stats.dropped.fetch_add(1, Ordering::Relaxed);
        w.handle(end(Direction::ServerToClient));
        let (stats, events) = w.observer.finish(Instant::now(), EndCause::SessionEnd);
        assert!(events.is_empty(), "{events:?}");
        assert_eq!(stats.unobserved, 1);
    }

    /// A call whose exchange end was dropped stays open in its session until the call timeout:
    /// then too it is unobserved, not a 504.
    #[test]
    fn call_open_across_a_drop_times_out_unobserved() {
        let mut w = call_answered_with_json_head();
        // The body's chunks and its end were all dropped; the next message is another POST's.
        w.stats.dropped.fetch_add(2, Ordering::Relaxed);
        w.handle(post(2));
        w.observer.on_tick(Instant::now() + Duration::from_secs(31));
        assert_eq!(w.observer.open_actions(), 0);
        let (stats, events) = w.observer.finish(Instant::now(), EndCause::SessionEnd);
        assert!(events.is_empty(), "{events:?}");
        assert_eq!(stats.unobserved, 1);
    }
}
