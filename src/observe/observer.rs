//! The observer's state and its entry points: what the drivers (the stdio tap loop, the HTTP
//! watcher) call with each frame, each tick, each gap and each end of a scope or session.
//!
//! Owns [`Observer`], whose state (pending requests, open actions, per-scope session facts,
//! counters) the sibling files work on, and the first look at every frame: a batch is split
//! into elements, each one peeked and handed to correlation; what cannot be read (not JSON,
//! wrong field types, over the frame cap) is counted in [`ObserverStats`] with at most one
//! warning per kind. Must never panic on what it reads, never wait (every entry point returns
//! at once, its work done) and never log per message.

use std::collections::HashMap;
use std::time::Instant;

use crate::event::call::{SessionFacts, TraceContext};
use crate::event::health::Health;
use crate::event::privacy::CapturePolicy;
use crate::event::{EventSink, SharedStr, Stamps};
use crate::tap::Direction;

use super::assemble::{
    clean, clear_session_id, dest_host, ScopeInfo, ToolNames, WallClock, MAX_INFO_LEN,
};
use super::catalog::Catalog;
use super::correlate::{Action, ActionState, Early, Key, OpenRequests, Pending, PendingKind};
use super::frame::{split_batch, Split};
use super::outcome::Outcome;
use super::peek::{peek, Lenient, PeekError, RpcId};
use super::{EndCause, ObserverConfig, ObserverStats, StreamId};

/// Hashes the observer's own counters (action numbers, [`StreamId`]s): one multiply instead of
/// SipHash. Only for keys this process makes up; ids a peer chooses (JSON-RPC ids in
/// [`super::correlate::Key`]) keep std's keyed hasher, which a peer cannot aim collisions at.
#[derive(Default, Clone, Copy)]
pub(super) struct CounterHasher(u64);

impl std::hash::Hasher for CounterHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: spreads consecutive numbers over the high bits hashbrown's control
        // bytes use, and keeps them distinct in the low bits it picks buckets with.
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by a counter of ours (see [`CounterHasher`]).
pub(super) type CounterMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<CounterHasher>>;

/// Which warnings were already printed (at most one each).
#[derive(Debug, Default)]
pub(super) struct Warned {
    pub(super) non_json: bool,
    pub(super) malformed: bool,
    pub(super) oversize: bool,
    pub(super) duplicate: bool,
    pub(super) orphan: bool,
    pub(super) gap: bool,
    pub(super) partial_catalog: bool,
    pub(super) open_cap: bool,
}

/// How big a message really was, and whether the observer saw all of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Size {
    /// Bytes on the wire (the message's own, not its skeleton's).
    pub(super) len: u64,
    /// Seen as a skeleton of its first and last bytes (see [`super::summary`]).
    pub(super) partial: bool,
}

impl Size {
    pub(super) fn whole(len: usize) -> Size {
        Size {
            len: len as u64,
            partial: false,
        }
    }
}

/// One session's observer: takes frames in, hands events to `sink`. Driven by one task at a
/// time (the stdio tap loop or the HTTP watcher), never shared.
pub struct Observer<S: EventSink> {
    pub(super) cfg: ObserverConfig,
    pub(super) sink: S,
    pub(super) stats: ObserverStats,
    pub(super) policy: CapturePolicy,
    pub(super) catalog: Catalog,
    pub(super) tool_names: ToolNames,
    /// `serverInfo.name` seen in an `initialize` or `server/discover` result.
    pub(super) server_name: Option<String>,
    /// `--name`, else [`Observer::server_name`]: what each call's facts name the server by,
    /// built when the name is learned instead of per call.
    pub(super) named: Option<SharedStr>,
    /// The catalog's version, as a call started now carries it: shared by every open call, not
    /// copied into each.
    pub(super) registry_version: Option<SharedStr>,
    /// `dest.host` of the next event, built when the server name is learned instead of per event.
    pub(super) host: SharedStr,
    /// `actor.id`, shared by every event.
    pub(super) actor: SharedStr,
    pub(super) pending: OpenRequests,
    /// Boxed: a flood churning through a full scope grows the table to up to four slots per open
    /// call (removals leave tombstones), which is cheap only while a slot is small.
    pub(super) actions: CounterMap<u64, Box<Action>>,
    pub(super) next_action: u64,
    pub(super) scopes: CounterMap<StreamId, ScopeInfo>,
    /// Responses seen before their request (see [`super::EARLY_RESPONSE_GRACE`]).
    pub(super) early: HashMap<Key, Early>,
    pub(super) early_bytes: usize,
    /// Stdio: one random session id per wrapper process.
    pub(super) stdio_session: SharedStr,
    /// Relay time of the first chunk after the latest drop in either direction: a call
    /// started before it may have had its answer, or its cancellation, dropped.
    pub(super) last_gap: Option<Instant>,
    /// Client messages the hand-off lost whose answers may still come (see
    /// [`Observer::requests_lost`]): as many responses that match no request are theirs, not
    /// orphans.
    pub(super) answers_owed: u64,
    /// While [`Observer::on_request_body`] runs: the ids of the `tools/call` requests it starts.
    pub(super) started_calls: Option<Vec<RpcId>>,
    pub(super) warned: Warned,
    /// Bytes the driver's hand-off (stdio tap, HTTP channel) dropped so far, as it last said.
    tap_dropped_bytes: u64,
    /// The `sensor.health` totals already added to the sink's counters.
    health_sent: Health,
    /// `serverInfo.version`, for a sink that wants call facts.
    pub(super) server_version: Option<SharedStr>,
    /// HTTP: the `traceparent` header of the request body being observed (calls in it whose
    /// `_meta` carries none join this trace).
    pub(super) header_trace: Option<TraceContext>,
    /// When the observer started: a stdio session's start.
    pub(super) created: Instant,
    /// Turns relay stamps into the wall-clock times events carry.
    pub(super) wall: WallClock,
    /// The timestamp text of its events, made once a millisecond.
    pub(super) stamps: Stamps,
}

impl<S: EventSink> Observer<S> {
    pub fn new(mut cfg: ObserverConfig, sink: S) -> Self {
        let policy = CapturePolicy::with_text(&cfg.capture, &cfg.capture_text);
        // A `--name` the envelope cannot carry falls back to `serverInfo.name`.
        cfg.server_name = cfg
            .server_name
            .as_deref()
            .and_then(|n| clean(n, MAX_INFO_LEN));
        let actor = SharedStr::from(&cfg.actor);
        let host = dest_host(&cfg, None);
        let named = cfg.server_name.as_deref().map(SharedStr::from);
        Observer {
            cfg,
            sink,
            stats: ObserverStats::default(),
            policy,
            catalog: Catalog::default(),
            tool_names: ToolNames::default(),
            server_name: None,
            named,
            registry_version: None,
            host,
            actor,
            pending: OpenRequests::default(),
            actions: CounterMap::default(),
            next_action: 0,
            scopes: CounterMap::default(),
            early: HashMap::new(),
            early_bytes: 0,
            stdio_session: clear_session_id().into(),
            last_gap: None,
            answers_owed: 0,
            started_calls: None,
            warned: Warned::default(),
            server_version: None,
            header_trace: None,
            created: Instant::now(),
            wall: WallClock::default(),
            stamps: Stamps::default(),
            tap_dropped_bytes: 0,
            health_sent: Health::default(),
        }
    }

    /// Adds what went wrong since the last call to the sink's `sensor.health` counters (see
    /// [`crate::event::health`]). `tap_dropped_bytes`: the hand-off's total of dropped bytes.
    /// The drivers call it about once a [`super::TICK`] and at the end; it costs a few
    /// subtractions.
    pub fn sync_health(&mut self, tap_dropped_bytes: u64) {
        self.tap_dropped_bytes = self.tap_dropped_bytes.max(tap_dropped_bytes);
        let now = Health {
            stdout_non_json: self.stats.stdout_non_json,
            oversize_frames: self.stats.oversize,
            orphan_responses: self.stats.orphan_responses,
            unobserved: self.stats.unobserved,
            tap_dropped_bytes: self.tap_dropped_bytes,
        };
        let sent = self.health_sent;
        let delta = Health {
            stdout_non_json: now.stdout_non_json.saturating_sub(sent.stdout_non_json),
            oversize_frames: now.oversize_frames.saturating_sub(sent.oversize_frames),
            orphan_responses: now.orphan_responses.saturating_sub(sent.orphan_responses),
            unobserved: now.unobserved.saturating_sub(sent.unobserved),
            tap_dropped_bytes: now.tap_dropped_bytes.saturating_sub(sent.tap_dropped_bytes),
        };
        if delta != Health::default() {
            if let Some(h) = self.sink.health() {
                h.add(delta);
            }
            self.health_sent = now;
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> &ObserverStats {
        &self.stats
    }

    /// Calls in flight or waiting for a 2026-07-28 retry. Only tests ask: the counters in
    /// [`ObserverStats`] are what the session reports.
    #[cfg(test)]
    pub fn open_actions(&self) -> usize {
        self.actions.len()
    }

    /// One complete frame (one JSON-RPC message or batch, without its newline). `seen` is when
    /// the relay read its last byte.
    pub fn on_frame(&mut self, stream: StreamId, dir: Direction, seen: Instant, frame: &[u8]) {
        self.stats.frames[dir.index()] += 1;
        self.stats.bytes[dir.index()] += frame.len() as u64;
        let first = frame.iter().find(|b| !b.is_ascii_whitespace());
        if first.is_none() {
            // A blank line: counted as a frame, carries no message.
            return;
        }
        if first == Some(&b'[') {
            match split_batch(frame) {
                Some(elements) => {
                    for r in elements {
                        let size = Size::whole(r.len());
                        self.on_message(stream, dir, seen, &frame[r], size);
                    }
                }
                None => self.count_non_json(dir),
            }
        } else {
            self.on_message(stream, dir, seen, frame, Size::whole(frame.len()));
        }
    }

    /// What [`super::frame::MessageBuf`] kept of one message: [`Observer::on_frame`],
    /// [`Observer::on_summary_frame`] or [`Observer::on_oversize_frame`].
    pub fn on_split(&mut self, stream: StreamId, dir: Direction, seen: Instant, msg: Split<'_>) {
        match msg {
            Split::Frame(f) => self.on_frame(stream, dir, seen, f),
            Split::Summary { skeleton, len } => {
                self.on_summary_frame(stream, dir, seen, skeleton, len)
            }
            Split::Oversize(n) => self.on_oversize_frame(dir, n),
        }
    }

    /// A JSON object frame of `len` bytes, too large to hold whole, seen as the `skeleton` built
    /// from its first and last bytes (see [`super::summary`]).
    pub fn on_summary_frame(
        &mut self,
        stream: StreamId,
        dir: Direction,
        seen: Instant,
        skeleton: &[u8],
        len: u64,
    ) {
        self.stats.frames[dir.index()] += 1;
        self.stats.bytes[dir.index()] += len;
        self.stats.summarized += 1;
        let size = Size { len, partial: true };
        self.on_message(stream, dir, seen, skeleton, size);
    }

    /// A frame that could not be parsed went past (longer than the cap, or a large object whose
    /// first and last bytes do not join into a skeleton): counted and measured.
    pub fn on_oversize_frame(&mut self, dir: Direction, len: u64) {
        self.stats.frames[dir.index()] += 1;
        self.stats.bytes[dir.index()] += len;
        self.stats.oversize += 1;
        if !self.warned.oversize {
            self.warned.oversize = true;
            tracing::warn!(
                len,
                "A message is too large to observe (over the frame cap, or its ends are not \
                 JSON): relayed unchanged, not observed"
            );
        }
    }

    /// HTTP: the upstream answered the POST carrying `request_body` with a non-2xx status, or
    /// could not be reached (the proxy passes 502): every `tools/call` request in that body that
    /// has no response yet ends with `status`. The body (or the skeleton of a large one) must
    /// have been passed to [`Observer::on_request_body`] first (that is when the request was
    /// seen).
    pub fn on_http_failure(
        &mut self,
        scope: StreamId,
        request_body: &[u8],
        status: u16,
        seen: Instant,
    ) {
        let whole = std::iter::once(0..request_body.len());
        let ranges: Vec<std::ops::Range<usize>> = match split_batch(request_body) {
            Some(r) => r,
            None => whole.collect(),
        };
        for r in ranges {
            let Ok(p) = peek(&request_body[r]) else {
                continue;
            };
            let Lenient::Ok(id) = p.id else { continue };
            let key = Key {
                scope,
                dir: Direction::ClientToServer,
                id,
            };
            if let Some(pending) = self.pending.remove(&key) {
                if let PendingKind::ToolCall(aid) = pending.kind {
                    self.finish_action(aid, Outcome::http_failure(status), seen);
                }
            }
        }
    }

    /// HTTP: a request body, observed as [`Observer::on_split`] observes it; returns the ids of
    /// the `tools/call` requests in it now waiting for an answer, for
    /// [`Observer::end_unobserved`] should that answer turn out unreadable.
    pub fn on_request_body(
        &mut self,
        scope: StreamId,
        seen: Instant,
        body: Split<'_>,
    ) -> Vec<RpcId> {
        self.started_calls = Some(Vec::new());
        self.on_split(scope, Direction::ClientToServer, seen, body);
        self.started_calls.take().unwrap_or_default()
    }

    /// [`Observer::on_request_body`] for a request that carried a `traceparent` header: calls
    /// in it without one in `_meta` join that trace.
    pub fn on_request_body_traced(
        &mut self,
        scope: StreamId,
        seen: Instant,
        body: Split<'_>,
        traceparent: Option<&str>,
    ) -> Vec<RpcId> {
        self.header_trace = traceparent.and_then(|t| TraceContext::parse(t, None));
        let ids = self.on_request_body(scope, seen, body);
        self.header_trace = None;
        ids
    }

    /// HTTP: the answers to these requests (ids from [`Observer::on_request_body`]) could not be
    /// read — no or another content type, compressed, over the size cap, or partly dropped on
    /// the way to the observer. A call among them still waiting ends here with no event (it may
    /// well have succeeded: a 504 would be false) and is counted in
    /// [`ObserverStats::unobserved`].
    pub fn end_unobserved(&mut self, scope: StreamId, ids: &[RpcId]) {
        for id in ids {
            let key = Key {
                scope,
                dir: Direction::ClientToServer,
                id: id.clone(),
            };
            if let Some(Pending {
                kind: PendingKind::ToolCall(aid),
                ..
            }) = self.pending.remove(&key)
            {
                if self.actions.remove(&aid).is_some() {
                    self.stats.unobserved += 1;
                }
            }
        }
    }

    /// HTTP: events in `scope` carry `session.id = session_hash` (a hash, never the raw id).
    pub fn set_scope_session(&mut self, scope: StreamId, session_hash: String) {
        let info = self.scopes.entry(scope).or_default();
        info.session_id = Some(session_hash.into());
        info.opened.get_or_insert_with(Instant::now);
    }

    /// HTTP: the scope is over (DELETE, session gone, or a stateless POST finished, or the
    /// client disconnected): calls still in flight in it end with `cause`. Actions waiting for a
    /// 2026-07-28 retry stay open: the retry may arrive in another scope.
    pub fn end_scope(&mut self, scope: StreamId, seen: Instant, cause: EndCause) {
        let ending: Vec<u64> = self
            .actions
            .iter()
            .filter(|(_, a)| a.scope == scope)
            .filter_map(|(id, a)| matches!(a.state, ActionState::InFlight(_)).then_some(*id))
            .collect();
        for aid in ending {
            self.finish_action(aid, cause.outcome(), seen);
        }
        for a in self.actions.values_mut().filter(|a| a.scope == scope) {
            a.scope_open = false;
        }
        self.pending.end_scope(scope);
        if let Some(info) = self.scopes.remove(&scope) {
            if let (Some(opened), true) = (info.opened, self.sink.wants_call_facts()) {
                self.sink.session_ended(SessionFacts {
                    start: self.wall.at(opened),
                    end: self.wall.at(seen),
                    protocol: info.protocol_negotiated.or(info.protocol_requested),
                    transport_failed: cause == EndCause::Transport,
                });
            }
        }
    }

    /// Expires calls older than the call timeout (504), and forgets other requests that old.
    pub fn on_tick(&mut self, now: Instant) {
        let timeout = self.cfg.call_timeout;
        let expired: Vec<u64> = self
            .actions
            .iter()
            .filter(|(_, a)| now.saturating_duration_since(a.last_activity) > timeout)
            .map(|(id, _)| *id)
            .collect();
        for aid in expired {
            self.finish_action(aid, Outcome::Timeout, now);
        }
        self.pending.retain(|_, p| {
            matches!(p.kind, PendingKind::ToolCall(_))
                || now.saturating_duration_since(p.seen) <= timeout
        });
        self.expire_early(Some(now));
    }

    /// Ends every call still in flight (or waiting for a retry) with `cause`, returns the
    /// counters and the sink.
    ///
    /// An action waiting for a 2026-07-28 retry is not on the wire: the server did answer and
    /// the client never came back, so it ends as 504 `timeout` whatever the cause.
    pub fn finish(mut self, now: Instant, cause: EndCause) -> (ObserverStats, S) {
        self.expire_early(None);
        let mut open: Vec<(Instant, u64)> = self
            .actions
            .iter()
            .map(|(id, a)| (a.started, *id))
            .collect();
        open.sort();
        for (_, aid) in open {
            let waiting = self
                .actions
                .get(&aid)
                .is_some_and(|a| matches!(a.state, ActionState::AwaitingInput { .. }));
            let outcome = if waiting {
                Outcome::Timeout
            } else {
                cause.outcome()
            };
            self.finish_action(aid, outcome, now);
        }
        // HTTP sessions still open at the end end here (only a sink that wants call facts
        // hears of it).
        let open: Vec<StreamId> = self
            .scopes
            .iter()
            .filter(|(_, i)| i.opened.is_some() && self.sink.wants_call_facts())
            .map(|(s, _)| *s)
            .collect();
        for scope in open {
            self.end_scope(scope, now, cause);
        }
        if self.cfg.transport == super::Transport::Stdio && self.sink.wants_call_facts() {
            let protocol = self.session_for(StreamId(0)).and_then(|s| s.protocol);
            self.sink.session_ended(SessionFacts {
                start: self.wall.at(self.created),
                end: self.wall.at(now),
                protocol,
                transport_failed: cause == EndCause::Transport,
            });
        }
        self.sync_health(self.tap_dropped_bytes);
        (self.stats, self.sink)
    }

    /// Bytes were dropped on their way to the observer (the stdio tap, or the HTTP watch
    /// channel) before `seen`: a call started before then that ends unanswered may have had its
    /// answer among them, or its `notifications/cancelled` (a cancelled call is a 499, not the
    /// 504 or 502 it would end as), and makes no event ([`ObserverStats::unobserved`]).
    pub fn on_gap(&mut self, seen: Instant) {
        self.last_gap = Some(seen);
        self.stats.gaps += 1;
        if !self.warned.gap {
            self.warned.gap = true;
            tracing::warn!(
                "The observer fell behind and skipped some traffic; some calls may be missed"
            );
        }
    }

    /// `n` client messages were lost before the observer could read them (the tap dropped them,
    /// or a resynchronisation threw them away, or the HTTP hand-off dropped a request's body):
    /// each is counted as an unobserved call ([`ObserverStats::unobserved`]), and the server,
    /// which did get them, may still answer them. Such an answer matches no request the
    /// observer knows: up to `n` of those are put down to this loss instead of being counted
    /// (and warned of) as orphan responses, a fault of the server's they are not. A lost
    /// message that was a notification, or whose answer was lost too, leaves a later real
    /// orphan uncounted instead; the session's `unobserved` and `tapDroppedBytes` already say
    /// that its observation was incomplete.
    pub fn requests_lost(&mut self, n: u64) {
        self.stats.unobserved += n;
        self.answers_owed += n;
    }

    fn on_message(
        &mut self,
        scope: StreamId,
        dir: Direction,
        seen: Instant,
        msg: &[u8],
        size: Size,
    ) {
        let p = match peek(msg) {
            Ok(p) => p,
            Err(PeekError::NotJson) => return self.count_non_json(dir),
            Err(PeekError::NotObject) => return self.count_malformed(),
        };
        match (&p.method, &p.id) {
            (Lenient::Ok(m), Lenient::Ok(id)) => {
                let id = id.clone();
                self.on_request(scope, dir, seen, m, id, &p, size.len)
            }
            (Lenient::Ok(m), Lenient::Absent) => self.on_notification(scope, dir, seen, m, &p),
            (Lenient::Absent, Lenient::Ok(id)) => {
                let id = id.clone();
                self.on_response(scope, dir, seen, id, &p, msg, size)
            }
            // An error response with a null id (the peer could not parse a request) is valid
            // JSON-RPC and answers nothing we track.
            (Lenient::Absent, Lenient::Wrong) if !matches!(p.error, Lenient::Absent) => {}
            _ => self.count_malformed(),
        }
    }

    pub(super) fn count_non_json(&mut self, dir: Direction) {
        self.stats.non_json += 1;
        if dir == Direction::ServerToClient {
            self.stats.stdout_non_json += 1;
        }
        if !self.warned.non_json {
            self.warned.non_json = true;
            tracing::warn!("A frame is not JSON: relayed unchanged, not observed");
        }
    }

    pub(super) fn count_malformed(&mut self) {
        self.stats.malformed += 1;
        if !self.warned.malformed {
            self.warned.malformed = true;
            tracing::warn!(
                "A JSON-RPC message has fields of unexpected types: relayed unchanged, not observed"
            );
        }
    }
}
