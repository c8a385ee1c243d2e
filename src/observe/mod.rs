//! The observer: turns forwarded JSON-RPC traffic into one [`Event`] per `tools/call`.
//!
//! Goes in: copies of the bytes the relay forwarded, with the relay's timestamps — as tap chunks
//! ([`run_tap_observer`], stdio) or as whole frames ([`Observer::on_frame`], HTTP bodies and SSE
//! data). Comes out: finished events, handed to an [`EventSink`] (the reporter's queue), plus
//! [`ObserverStats`]. It runs on its own task, off the relay path, and must never block or slow
//! the relay, never panic on what it reads, and never put a request or response value into an
//! event except allow-listed scalar arguments that passed the privacy layers.
//!
//! The journey inside: [`frame`] splits chunks into frames (bounded by [`frame::DEFAULT_FRAME_CAP`]),
//! [`frame::split_batch`] splits JSON-RPC batches into elements, [`peek`] reads the few fields
//! needed with borrowed types, [`correlate`] matches responses to requests by (scope, direction,
//! id), [`catalog`] fingerprints `tools/list`, and the event is built here.
//!
//! Decisions worth knowing:
//! * **Call timeout** (`--call-timeout-ms`, default [`crate::config::DEFAULT_CALL_TIMEOUT`]): a
//!   `tools/call` with no answer that long after its latest request round ends as 504 `timeout`,
//!   checked by [`Observer::on_tick`] about once a second. A call still open when the session
//!   ends is 504 too ([`EndCause::SessionEnd`]), or 502 `transport` when the server went away.
//! * **2026-07-28 multi round-trip**: a result with `resultType` `"input_required"` (or the
//!   draft's `"incomplete"`) does not end the action. The client's retry (a new id) joins it when
//!   it echoes the `requestState` the server sent (matched by digest, in any scope), or else, when
//!   it carries `requestState`/`inputResponses`, when it calls the same tool as an action waiting
//!   for input in the same scope (oldest first) or in a scope that has ended (stateless HTTP,
//!   where every POST is its own scope). A `tools/call` with neither field is always a new action.
//!   The one event spans the first request to the final result; `bytes` sums every round.
//!   An action whose retry never comes ends as 504 after the call timeout.
//! * Server→client requests (sampling, roots, elicitation) are correlated in their own direction,
//!   so neither they nor the client's answers to them are ever taken for a tool result.
//! * Bad input (non-JSON frames, wrong field types, frames over the cap, duplicate ids, responses
//!   to unknown ids) is counted in [`ObserverStats`] with at most one warning per kind.
//! * Order: each relay thread hands its bytes to the tap after forwarding them, so the two
//!   directions can reach the observer slightly out of order. [`run_tap_observer`] merges them by
//!   relay timestamp within [`REORDER_HOLD`]; a response that still arrives before its request is
//!   held for [`EARLY_RESPONSE_GRACE`] before it counts as an orphan.
//! * Memory: the tap's byte budget ([`crate::tap::TAP_BUDGET_BYTES`]) of chunks not yet split,
//!   one frame per direction up to the cap (64 MiB), a copy of an assembled frame only while it
//!   waits in the reorder window (a frame nothing can overtake is observed in place), at most
//!   [`EARLY_RESPONSE_BYTES`] of early responses, and per open request a small record; requests
//!   other than `tools/call` are forgotten after the call timeout.
//! * Priority and tap drops: the observer's threads run in the idle class and, on a CPU shared
//!   with the relay while traffic flows, in short paced slices ([`priority`]); they fall
//!   behind the relay under sustained load on a shared CPU; if they fall more than the tap's
//!   budget behind, the tap drops. A call open during a server→client drop that then ends
//!   unanswered makes no event ([`ObserverStats::unobserved`]): its answer may have been dropped.
//! * HTTP: an answer the watcher cannot read (no or another content type, compressed, over its
//!   size cap, partly dropped) ends its calls through [`Observer::end_unobserved`]: no event,
//!   counted as unobserved, never a false 504 (DESIGN §2 invariant 10).

pub mod catalog;
pub mod correlate;
pub mod frame;
pub mod http;
pub mod peek;
pub mod priority;
pub mod sse;
pub mod summary;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Map;

use crate::event::filter::REDACTED;
use crate::event::privacy::{Capture, CapturePolicy};
use crate::event::{
    new_event_id, rfc3339_ms, Actor, ByteSizes, Dest, Event, EventSink, Rec, Session, SharedStr,
};
use crate::tap::{Direction, Drained, TapMsg, TapReceiver};
use priority::Pacer;

use catalog::Catalog;
use correlate::{state_digest, Action, ActionState, Key, Outcome, Pending, PendingKind};
use frame::{split_batch, FrameSplitter, Split};
use peek::{peek, Lenient, Peek, PeekError, RpcId};

/// A correlation scope: messages whose ids are matched together (keyed by scope, direction, id).
/// Stdio has one scope (0). HTTP: one per `Mcp-Session-Id` (all POSTs and the GET stream of that
/// session share it), or one per POST exchange when there is no session (2026-07-28, stateless).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

/// Hashes the observer's own counters (action numbers, [`StreamId`]s): one multiply instead of
/// SipHash. Only for keys this process makes up; ids a peer chooses (JSON-RPC ids in
/// [`correlate::Key`]) keep std's keyed hasher, which a peer cannot aim collisions at.
#[derive(Default, Clone, Copy)]
struct CounterHasher(u64);

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
type CounterMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<CounterHasher>>;

/// `dest.host`: the upstream (HTTP), or `mcp://` and the server's name (stdio): `--name`, else
/// the `serverInfo.name` learned (`learned`), else the default. A host that holds a value L4
/// removes (an upstream at a public IP address) is sent as [`REDACTED`], which the filter keeps.
fn dest_host(cfg: &ObserverConfig, learned: Option<&str>) -> SharedStr {
    let host = match &cfg.transport {
        Transport::Stdio => {
            let server = cfg
                .server_name
                .as_deref()
                .or(learned)
                .unwrap_or(crate::config::DEFAULT_SERVER_NAME);
            format!("mcp://{server}")
        }
        Transport::Http { host } => host.clone(),
    };
    if crate::event::privacy::contains_sensitive(&host) {
        return REDACTED.into();
    }
    host.into()
}

/// How a transport reaches the server: decides `dest.host` and `sensor.transport`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Stdio,
    /// `host[:port]` of the upstream.
    Http {
        host: String,
    },
}

/// What the observer needs to know from the configuration.
#[derive(Debug, Clone)]
pub struct ObserverConfig {
    pub transport: Transport,
    /// `--name`; overrides `serverInfo.name`.
    pub server_name: Option<String>,
    pub actor: String,
    pub on_behalf_of: Option<String>,
    /// Extra allow-listed argument keys (`--capture`).
    pub capture: Vec<String>,
    /// Keys whose string values may be prose (`--capture-text`); each is also allow-listed.
    pub capture_text: Vec<String>,
    pub call_timeout: Duration,
}

/// Why in-flight calls end without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndCause {
    /// The server went away (child exited, upstream unreachable): 502 `transport`.
    Transport,
    /// The session ended normally with the call unanswered: 504 `timeout`.
    SessionEnd,
    /// HTTP: the client closed the response stream the call was to be answered on (in
    /// 2026-07-28 that is the cancellation): 499 `cancelled`.
    ClientClosed,
}

impl EndCause {
    fn outcome(self) -> Outcome {
        match self {
            EndCause::Transport => Outcome::Transport,
            EndCause::SessionEnd => Outcome::Timeout,
            EndCause::ClientClosed => Outcome::Cancelled,
        }
    }
}

/// Counters printed at exit with `--debug`. Index 0 is client→server, 1 server→client.
#[derive(Debug, Clone, Default)]
pub struct ObserverStats {
    pub frames: [u64; 2],
    pub bytes: [u64; 2],
    pub events: u64,
    /// Frames (or batch elements) that are not JSON.
    pub non_json: u64,
    /// JSON, but not a JSON-RPC message of the expected shape (wrong field types, not an object).
    pub malformed: u64,
    /// Frames that could not be parsed (over the frame cap, or too large and not summarisable):
    /// measured, not parsed.
    pub oversize: u64,
    /// JSON object frames over `frame::WHOLE_FRAME_BYTES`, observed from their first and last
    /// bytes (see [`summary`]).
    pub summarized: u64,
    /// Requests reusing an id still pending in the same scope and direction.
    pub duplicate_ids: u64,
    /// Responses to no pending request (unknown id, or a second response).
    pub orphan_responses: u64,
    /// Chunks that arrived after the tap dropped some: the splitter resynchronised.
    pub gaps: u64,
    /// Calls that ended without an observed answer after the tap (or the HTTP watch channel)
    /// dropped server→client bytes while they were open, or (HTTP) whose answer could not be
    /// read: their answer may have been among the dropped bytes, so no event is made for them
    /// (a 504 or 502 would claim a failure the client may not have seen).
    pub unobserved: u64,
    /// Calls whose tool name held a value L4 removes: reported under the name `<redacted>`.
    pub redacted_tools: u64,
    /// String arguments under an allowed key withheld as prose (not a code, and the key not
    /// given to `--capture-text`).
    pub prose_withheld: u64,
}

/// How often [`run_tap_observer`] checks call timeouts. Timeouts are minutes; a second is plenty.
pub const TICK: Duration = Duration::from_secs(1);

/// Most requests tracked at once; beyond it new non-tool requests are not tracked (bounds memory
/// against a peer that never answers). Tool calls are always tracked.
pub const MAX_PENDING: usize = 100_000;

/// How long a response whose request has not been observed yet is kept. The relay hands each
/// direction to the tap *after* forwarding it, so on a loaded machine a response can reach the
/// observer just before its request (the client→server thread was preempted between its write
/// and its hand-off). Timestamps are taken at read time and stay right; only arrival order flips.
pub const EARLY_RESPONSE_GRACE: Duration = Duration::from_secs(2);

/// Most bytes held for such early responses; beyond it they are counted as orphans at once.
pub const EARLY_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Longest tool name accepted (the MCP spec recommends at most 128 characters).
pub const MAX_TOOL_NAME: usize = 128;

/// Longest server name, client name or protocol string kept.
const MAX_INFO_LEN: usize = 128;

/// Per-scope session facts.
#[derive(Debug, Clone, Default)]
struct ScopeInfo {
    session_id: Option<SharedStr>,
    /// From the `initialize` result (negotiated).
    protocol_negotiated: Option<SharedStr>,
    /// From the `initialize` request or a 2026-07-28 request's `_meta`.
    protocol_requested: Option<SharedStr>,
    client: Option<SharedStr>,
}

/// Which warnings were already printed (at most one each).
#[derive(Debug, Default)]
struct Warned {
    non_json: bool,
    malformed: bool,
    oversize: bool,
    duplicate: bool,
    orphan: bool,
    gap: bool,
    partial_catalog: bool,
}

/// How big a message really was, and whether the observer saw all of it.
#[derive(Debug, Clone, Copy)]
struct Size {
    /// Bytes on the wire (the message's own, not its skeleton's).
    len: u64,
    /// Seen as a skeleton of its first and last bytes (see [`summary`]).
    partial: bool,
}

impl Size {
    fn whole(len: usize) -> Size {
        Size {
            len: len as u64,
            partial: false,
        }
    }
}

/// A response kept until its request is observed (see [`EARLY_RESPONSE_GRACE`]).
struct Early {
    /// A copy of the message (of its skeleton, for a summarised frame).
    msg: Vec<u8>,
    seen: Instant,
    size: Size,
}

fn opposite(d: Direction) -> Direction {
    match d {
        Direction::ClientToServer => Direction::ServerToClient,
        Direction::ServerToClient => Direction::ClientToServer,
    }
}

/// A short single-line string with nothing the value scrubber would remove, or nothing: what
/// the builder puts in names, session facts and `onBehalfOf`, so its events pass the L3 filter
/// unchanged.
fn clean(s: &str, max: usize) -> Option<String> {
    let ok = !s.is_empty()
        && s.len() <= max
        && !s.chars().any(char::is_control)
        && !crate::event::privacy::contains_sensitive(s);
    ok.then(|| s.to_string())
}

/// A random stdio session id that L4 does not read as a card number or IBAN (random hex can
/// hold a Luhn-valid digit run now and then): such an id would get every event rejected.
fn clear_session_id() -> String {
    loop {
        let id = new_event_id();
        if !crate::event::privacy::contains_sensitive(&id) {
            return id;
        }
    }
}

/// The tool name an event carries: `None` for one the envelope cannot hold (empty, too long,
/// control characters: the request is malformed), [`REDACTED`] for one that holds a value L4
/// removes (the call is still reported, and counted).
fn tool_name(s: &str) -> Option<(String, bool)> {
    if s.is_empty() || s.len() > MAX_TOOL_NAME || s.chars().any(char::is_control) {
        return None;
    }
    if crate::event::privacy::contains_sensitive(s) {
        return Some((REDACTED.to_string(), true));
    }
    Some((s.to_string(), false))
}

fn lenient_str<'a>(l: &'a Lenient<std::borrow::Cow<'_, str>>) -> Option<&'a str> {
    l.ok().map(|c| c.as_ref())
}

pub struct Observer<S: EventSink> {
    cfg: ObserverConfig,
    sink: S,
    stats: ObserverStats,
    policy: CapturePolicy,
    catalog: Catalog,
    /// `serverInfo.name` seen in an `initialize` or `server/discover` result.
    server_name: Option<String>,
    /// `dest.host` of the next event, built when the server name is learned instead of per event.
    host: SharedStr,
    /// `actor.id`, shared by every event.
    actor: SharedStr,
    pending: HashMap<Key, Pending>,
    actions: CounterMap<u64, Action>,
    next_action: u64,
    scopes: CounterMap<StreamId, ScopeInfo>,
    /// Responses seen before their request (see [`EARLY_RESPONSE_GRACE`]).
    early: HashMap<Key, Early>,
    early_bytes: usize,
    /// Stdio: one random session id per wrapper process.
    stdio_session: SharedStr,
    /// Relay time of the first server→client chunk after the latest tap drop in that
    /// direction: a call started before it may have had its answer dropped.
    s2c_gap: Option<Instant>,
    /// While [`Observer::on_request_body`] runs: the ids of the `tools/call` requests it starts.
    started_calls: Option<Vec<RpcId>>,
    warned: Warned,
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
        Observer {
            cfg,
            sink,
            stats: ObserverStats::default(),
            policy,
            catalog: Catalog::default(),
            server_name: None,
            host,
            actor,
            pending: HashMap::new(),
            actions: CounterMap::default(),
            next_action: 0,
            scopes: CounterMap::default(),
            early: HashMap::new(),
            early_bytes: 0,
            stdio_session: clear_session_id().into(),
            s2c_gap: None,
            started_calls: None,
            warned: Warned::default(),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> &ObserverStats {
        &self.stats
    }

    /// Calls in flight or waiting for a 2026-07-28 retry.
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
                None => self.count_non_json(),
            }
        } else {
            self.on_message(stream, dir, seen, frame, Size::whole(frame.len()));
        }
    }

    /// A JSON object frame of `len` bytes, too large to hold whole, seen as the `skeleton` built
    /// from its first and last bytes (see [`summary`]).
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
    /// has no response yet ends with `status`. The body must have been passed to
    /// [`Observer::on_frame`] first (that is when the request was seen).
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
                    let outcome = if status == 502 {
                        Outcome::Transport
                    } else {
                        Outcome::HttpStatus(status)
                    };
                    self.finish_action(aid, outcome, seen);
                }
            }
        }
    }

    /// HTTP: a request body, observed as [`Observer::on_frame`] observes it; returns the ids of
    /// the `tools/call` requests in it now waiting for an answer, for
    /// [`Observer::end_unobserved`] should that answer turn out unreadable.
    pub fn on_request_body(&mut self, scope: StreamId, seen: Instant, body: &[u8]) -> Vec<RpcId> {
        self.started_calls = Some(Vec::new());
        self.on_frame(scope, Direction::ClientToServer, seen, body);
        self.started_calls.take().unwrap_or_default()
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
        self.scopes.entry(scope).or_default().session_id = Some(session_hash.into());
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
        self.pending.retain(|k, _| k.scope != scope);
        self.scopes.remove(&scope);
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

    /// Early responses whose request never came are orphans (all of them when `now` is None).
    fn expire_early(&mut self, now: Option<Instant>) {
        let stale: Vec<Key> = self
            .early
            .iter()
            .filter(|(_, e)| {
                now.is_none_or(|n| n.saturating_duration_since(e.seen) > EARLY_RESPONSE_GRACE)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            if let Some(e) = self.early.remove(&k) {
                self.early_bytes -= e.msg.len();
                self.count_orphan(k.dir);
            }
        }
    }

    fn count_orphan(&mut self, request_dir: Direction) {
        self.stats.orphan_responses += 1;
        if !self.warned.orphan {
            self.warned.orphan = true;
            tracing::warn!(
                direction = opposite(request_dir).label(),
                "A response matches no pending request (unknown or repeated id)"
            );
        }
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
        (self.stats, self.sink)
    }

    fn count_non_json(&mut self) {
        self.stats.non_json += 1;
        if !self.warned.non_json {
            self.warned.non_json = true;
            tracing::warn!("A frame is not JSON: relayed unchanged, not observed");
        }
    }

    fn count_malformed(&mut self) {
        self.stats.malformed += 1;
        if !self.warned.malformed {
            self.warned.malformed = true;
            tracing::warn!(
                "A JSON-RPC message has fields of unexpected types: relayed unchanged, not observed"
            );
        }
    }

    /// Bytes of `dir` were dropped on their way to the observer (the stdio tap, or the HTTP
    /// watch channel) before `seen`: a call started before then that ends unanswered may have
    /// had its answer among them, and makes no event ([`ObserverStats::unobserved`]).
    pub fn on_gap(&mut self, dir: Direction, seen: Instant) {
        if dir == Direction::ServerToClient {
            self.s2c_gap = Some(seen);
        }
        self.stats.gaps += 1;
        if !self.warned.gap {
            self.warned.gap = true;
            tracing::warn!(
                "The observer fell behind and skipped some traffic; some calls may be missed"
            );
        }
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
            Err(PeekError::NotJson) => return self.count_non_json(),
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

    #[allow(clippy::too_many_arguments)]
    fn on_request(
        &mut self,
        scope: StreamId,
        dir: Direction,
        seen: Instant,
        method: &str,
        id: RpcId,
        p: &Peek<'_>,
        len: u64,
    ) {
        let key = Key { scope, dir, id };
        if self.pending.contains_key(&key) {
            self.stats.duplicate_ids += 1;
            if !self.warned.duplicate {
                self.warned.duplicate = true;
                tracing::warn!(
                    direction = dir.label(),
                    "A request reuses the id of a request still pending: the first one is kept"
                );
            }
            return;
        }
        let params = p.params.ok();
        if dir == Direction::ClientToServer {
            self.note_client_meta(scope, p);
        }
        let kind = match (dir, method) {
            (Direction::ClientToServer, "tools/call") => {
                match self.start_round(scope, seen, &key, p, len) {
                    Some(aid) => {
                        if let Some(calls) = &mut self.started_calls {
                            calls.push(key.id.clone());
                        }
                        PendingKind::ToolCall(aid)
                    }
                    None => {
                        self.count_malformed();
                        PendingKind::Other
                    }
                }
            }
            (Direction::ClientToServer, "tools/list") => PendingKind::ToolsList {
                first_page: params.is_none_or(|p| matches!(p.cursor, Lenient::Absent)),
            },
            (Direction::ClientToServer, "initialize") => {
                if let Some(params) = params {
                    let info = self.scopes.entry(scope).or_default();
                    if let Some(v) = lenient_str(&params.protocol_version) {
                        info.protocol_requested = clean(v, MAX_INFO_LEN).map(SharedStr::from);
                    }
                    if let Some(n) = params.client_info.ok().and_then(|c| lenient_str(&c.name)) {
                        info.client = clean(n, MAX_INFO_LEN).map(SharedStr::from);
                    }
                }
                PendingKind::Initialize
            }
            (Direction::ClientToServer, "server/discover") => PendingKind::Discover,
            _ => PendingKind::Other,
        };
        if matches!(kind, PendingKind::ToolCall(_)) || self.pending.len() < MAX_PENDING {
            // Nearly always empty: skip hashing the key for it.
            let early = if self.early.is_empty() {
                None
            } else {
                self.early.remove(&key)
            };
            if let Some(e) = &early {
                self.early_bytes -= e.msg.len();
            }
            // Only a response read after this request was sent can answer it; an older one is a
            // stale answer to an earlier use of the id.
            let early = match early {
                Some(e) if e.seen >= seen => Some(e),
                Some(_) => {
                    self.count_orphan(dir);
                    None
                }
                None => None,
            };
            if let Some(e) = early {
                self.pending.insert(key.clone(), Pending { kind, seen });
                if let Ok(p) = peek(&e.msg) {
                    if let Lenient::Ok(id) = p.id.clone() {
                        self.on_response(scope, opposite(dir), e.seen, id, &p, &e.msg, e.size);
                    }
                }
            } else {
                self.pending.insert(key, Pending { kind, seen });
            }
        }
    }

    /// 2026-07-28 requests carry the protocol version and client identity in `_meta`.
    fn note_client_meta(&mut self, scope: StreamId, p: &Peek<'_>) {
        let Some(meta) = p.params.ok().and_then(|p| p.meta.ok()) else {
            return;
        };
        let version = lenient_str(&meta.protocol_version)
            .and_then(|v| clean(v, MAX_INFO_LEN))
            .map(SharedStr::from);
        let client = meta
            .client_info
            .ok()
            .and_then(|c| lenient_str(&c.name))
            .and_then(|n| clean(n, MAX_INFO_LEN))
            .map(SharedStr::from);
        if version.is_none() && client.is_none() {
            return;
        }
        let info = self.scopes.entry(scope).or_default();
        if version.is_some() {
            info.protocol_requested = version;
        }
        if client.is_some() {
            info.client = client;
        }
    }

    /// A `tools/call` request: a new action, or the retry round of one waiting for input.
    /// `None` if the request is malformed (no usable tool name).
    fn start_round(
        &mut self,
        scope: StreamId,
        seen: Instant,
        key: &Key,
        p: &Peek<'_>,
        len: u64,
    ) -> Option<u64> {
        let params = p.params.ok()?;
        let (tool, redacted) = tool_name(lenient_str(&params.name)?)?;
        let meta = params.meta.ok();
        let echoed_state = lenient_str(&params.request_state)
            .or_else(|| meta.and_then(|m| lenient_str(&m.request_state)));
        let is_retry = echoed_state.is_some() || params.input_responses.is_some();
        if is_retry {
            if let Some(aid) = self.find_waiting(scope, &tool, echoed_state) {
                if let Some(a) = self.actions.get_mut(&aid) {
                    a.state = ActionState::InFlight(key.clone());
                    a.scope = scope;
                    a.scope_open = true;
                    a.last_activity = seen;
                    a.bytes_req += len;
                    a.rounds += 1;
                    return Some(aid);
                }
            }
        }

        if redacted {
            self.stats.redacted_tools += 1;
        }
        let mut prose = 0u64;
        let fields = params.arguments.ok().map(|args| {
            let mut m = Map::new();
            for (k, v) in &args.0 {
                if m.len() >= crate::event::privacy::MAX_FIELDS {
                    break;
                }
                match v.as_scalar().map(|s| self.policy.decide(k, s)) {
                    Some(Capture::Kept(val)) => {
                        m.insert(k.to_string(), val);
                    }
                    Some(Capture::Prose) => prose += 1,
                    Some(Capture::Dropped) | None => {}
                }
            }
            m
        });
        self.stats.prose_withheld += prose;
        let on_behalf_of = meta
            .and_then(|m| lenient_str(&m.on_behalf_of))
            .and_then(|s| clean(s, MAX_INFO_LEN))
            .or_else(|| {
                self.cfg
                    .on_behalf_of
                    .as_deref()
                    .and_then(|s| clean(s, MAX_INFO_LEN))
            });
        let aid = self.next_action;
        self.next_action += 1;
        let action = Action {
            scope,
            scope_open: true,
            tool,
            started: seen,
            started_wall: wall_clock(seen),
            last_activity: seen,
            fields: fields.filter(|f| !f.is_empty()),
            on_behalf_of,
            registry_version: self.catalog.version().map(str::to_string),
            session: self.session_for(scope),
            bytes_req: len,
            bytes_resp: 0,
            rounds: 1,
            state: ActionState::InFlight(key.clone()),
        };
        self.actions.insert(aid, action);
        Some(aid)
    }

    /// The action a 2026-07-28 retry continues (see the module docs for the rule).
    fn find_waiting(&self, scope: StreamId, tool: &str, echoed: Option<&str>) -> Option<u64> {
        let waiting = || {
            self.actions
                .iter()
                .filter(|(_, a)| matches!(a.state, ActionState::AwaitingInput { .. }))
        };
        if let Some(state) = echoed {
            let d = state_digest(state);
            let hit = waiting()
                .find(|(_, a)| a.state == ActionState::AwaitingInput { state: Some(d) })
                .map(|(id, _)| *id);
            if hit.is_some() {
                return hit;
            }
        }
        let oldest = |same_scope: bool| {
            waiting()
                .filter(|(_, a)| a.tool == tool)
                .filter(|(_, a)| {
                    if same_scope {
                        a.scope == scope
                    } else {
                        !a.scope_open
                    }
                })
                .min_by_key(|(id, a)| (a.started, **id))
                .map(|(id, _)| *id)
        };
        oldest(true).or_else(|| oldest(false))
    }

    fn session_for(&self, scope: StreamId) -> Option<Session> {
        let info = self.scopes.get(&scope);
        let id = match self.cfg.transport {
            Transport::Stdio => Some(self.stdio_session.clone()),
            Transport::Http { .. } => info.and_then(|i| i.session_id.clone()),
        }?;
        Some(Session {
            id,
            protocol: info.and_then(|i| {
                i.protocol_negotiated
                    .clone()
                    .or_else(|| i.protocol_requested.clone())
            }),
            client: info.and_then(|i| i.client.clone()),
        })
    }

    /// What [`Self::session_for`] says now, or else `snapshot`, when the scope is still open;
    /// `snapshot` when it is gone.
    fn refresh_session(&self, scope: StreamId, snapshot: Option<Session>) -> Option<Session> {
        if self.scopes.contains_key(&scope) {
            self.session_for(scope).or(snapshot)
        } else {
            snapshot
        }
    }

    fn on_notification(
        &mut self,
        scope: StreamId,
        dir: Direction,
        seen: Instant,
        method: &str,
        p: &Peek<'_>,
    ) {
        match method {
            "notifications/cancelled" => {
                let Some(params) = p.params.ok() else {
                    return self.count_malformed();
                };
                let Lenient::Ok(id) = &params.request_id else {
                    return self.count_malformed();
                };
                // The sender of a cancellation is the sender of the request it cancels.
                let key = Key {
                    scope,
                    dir,
                    id: id.clone(),
                };
                if let Some(pending) = self.pending.remove(&key) {
                    if let PendingKind::ToolCall(aid) = pending.kind {
                        self.finish_action(aid, Outcome::Cancelled, seen);
                    }
                }
            }
            "notifications/tools/list_changed" if dir == Direction::ServerToClient => {
                self.catalog.invalidate();
                self.catalog_changed(seen);
            }
            _ => {}
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_response(
        &mut self,
        scope: StreamId,
        dir: Direction,
        seen: Instant,
        id: RpcId,
        p: &Peek<'_>,
        msg: &[u8],
        size: Size,
    ) {
        let key = Key {
            scope,
            dir: opposite(dir),
            id,
        };
        let Some(pending) = self.pending.remove(&key) else {
            let fits = self.early_bytes + msg.len() <= EARLY_RESPONSE_BYTES;
            if fits && !self.early.contains_key(&key) {
                self.early_bytes += msg.len();
                let msg = msg.to_vec();
                self.early.insert(key, Early { msg, seen, size });
            } else {
                self.count_orphan(key.dir);
            }
            return;
        };
        match pending.kind {
            PendingKind::ToolCall(aid) => self.on_tool_response(aid, seen, p, size.len, &key),
            PendingKind::ToolsList { .. } if size.partial => {
                // Only part of the catalog was seen: no version is better than a wrong one.
                self.catalog.invalidate();
                self.catalog_changed(seen);
                if !self.warned.partial_catalog {
                    self.warned.partial_catalog = true;
                    tracing::warn!(
                        len = size.len,
                        "A tools/list page is larger than the observer reads whole: \
                         registryVersion is left out until a smaller list"
                    );
                }
            }
            PendingKind::ToolsList { first_page } => {
                if matches!(p.result, Lenient::Ok(_)) {
                    let before = self.catalog.version().map(str::to_string);
                    self.catalog.on_list_response(msg, first_page);
                    if self.catalog.version().map(str::to_string) != before {
                        self.catalog_changed(seen);
                    }
                }
            }
            PendingKind::Initialize | PendingKind::Discover => {
                let Some(r) = p.result.ok() else { return };
                let info = r
                    .server_info
                    .ok()
                    .or_else(|| r.meta.ok().and_then(|m| m.server_info.ok()));
                if let Some(n) = info.and_then(|i| lenient_str(&i.name)) {
                    if let Some(n) = clean(n, MAX_INFO_LEN) {
                        self.server_name = Some(n);
                        self.refresh_host();
                    }
                }
                if pending.kind == PendingKind::Initialize {
                    if let Some(v) = lenient_str(&r.protocol_version) {
                        self.scopes.entry(scope).or_default().protocol_negotiated =
                            clean(v, MAX_INFO_LEN).map(SharedStr::from);
                    }
                }
            }
            PendingKind::Other => {}
        }
    }

    /// The catalog changed on the wire at `seen`: calls that started after that instant but were
    /// observed first (cross-direction arrival order, see [`EARLY_RESPONSE_GRACE`]) were made
    /// against the new catalog.
    fn catalog_changed(&mut self, seen: Instant) {
        let v = self.catalog.version().map(str::to_string);
        for a in self
            .actions
            .values_mut()
            .filter(|a| a.started >= seen && a.rounds == 1)
        {
            a.registry_version = v.clone();
        }
    }

    /// `answered`: the request key whose pending entry the caller already removed.
    fn on_tool_response(
        &mut self,
        aid: u64,
        seen: Instant,
        p: &Peek<'_>,
        len: u64,
        answered: &Key,
    ) {
        let Some(a) = self.actions.get_mut(&aid) else {
            return;
        };
        a.bytes_resp += len;
        let outcome = if let Lenient::Ok(e) = &p.error {
            Outcome::JsonRpc(e.code.ok().copied())
        } else if let Lenient::Ok(r) = &p.result {
            let rt = lenient_str(&r.result_type);
            if matches!(rt, Some("input_required") | Some("incomplete")) {
                a.state = ActionState::AwaitingInput {
                    state: lenient_str(&r.request_state).map(state_digest),
                };
                a.last_activity = seen;
                return;
            }
            if r.is_error == Lenient::Ok(true) {
                Outcome::ToolError
            } else {
                Outcome::Success
            }
        } else {
            // An answer without a usable result or error: the server did answer, so the call
            // is over; the oddity is counted.
            self.count_malformed();
            Outcome::Success
        };
        self.finish_action_answered(aid, outcome, seen, Some(answered));
    }

    fn refresh_host(&mut self) {
        self.host = dest_host(&self.cfg, self.server_name.as_deref());
    }

    fn finish_action(&mut self, aid: u64, outcome: Outcome, end: Instant) {
        self.finish_action_answered(aid, outcome, end, None);
    }

    /// [`Self::finish_action`] when the pending entry of `answered` is already gone (the
    /// response path removed it): saves hashing the key again.
    fn finish_action_answered(
        &mut self,
        aid: u64,
        outcome: Outcome,
        end: Instant,
        answered: Option<&Key>,
    ) {
        let Some(a) = self.actions.remove(&aid) else {
            return;
        };
        if let ActionState::InFlight(key) = &a.state {
            if answered != Some(key) {
                self.pending.remove(key);
            }
        }
        let unanswered = matches!(outcome, Outcome::Timeout | Outcome::Transport);
        if unanswered && self.s2c_gap.is_some_and(|g| a.started < g) {
            self.stats.unobserved += 1;
            return;
        }
        let host = self.host.clone();
        // The scope's facts may have been completed after the call started (HTTP learns the
        // session id from a response header); a scope already gone keeps the snapshot.
        let session = self.refresh_session(a.scope, a.session);
        let dur = end.saturating_duration_since(a.started);
        // Microsecond resolution: sub-ms precision without pretending to nanoseconds.
        let dur_ms = (dur.as_nanos() / 1_000) as f64 / 1_000.0;
        let mut path_template = String::with_capacity(1 + a.tool.len());
        path_template.push('/');
        path_template.push_str(&a.tool);
        let event = Event {
            v: crate::event::EVENT_SCHEMA_VERSION,
            id: new_event_id(),
            ts: rfc3339_ms(a.started_wall),
            class: outcome.class(),
            rec: Rec {
                rail: "mcp".into(),
                action: a.tool,
                registry_version: a.registry_version,
                fields: a.fields,
            },
            dest: Dest {
                host,
                path_template,
                method: "POST".into(),
            },
            actor: Actor {
                id: self.actor.clone(),
                kind: "agent".into(),
                grade: "attested".into(),
            },
            on_behalf_of: a.on_behalf_of,
            status: outcome.status(),
            dur_ms,
            bytes: ByteSizes {
                req: a.bytes_req,
                resp: a.bytes_resp,
            },
            session,
            err: outcome.err(),
        };
        self.stats.events += 1;
        self.sink.emit(event);
    }
}

/// The wall-clock time of a monotonic instant in the recent past.
fn wall_clock(seen: Instant) -> SystemTime {
    let age = Instant::now().saturating_duration_since(seen);
    SystemTime::now()
        .checked_sub(age)
        .unwrap_or_else(SystemTime::now)
}

/// How long a frame waits for the other direction before it is observed. Each relay thread
/// hands its bytes to the tap *after* forwarding them, so a request can reach the channel after
/// the response it caused (or a 2026-07-28 retry before the `input_required` it answers) when a
/// thread is preempted between its write and its hand-off. Frames are observed in the order of
/// their relay timestamps: a frame is released once the other direction has shown a later one,
/// or after this hold. It delays observation, never the relay.
pub const REORDER_HOLD: Duration = Duration::from_millis(25);

/// A frame waiting in the reorder window.
struct Held {
    seen: Instant,
    frame: HeldFrame,
}

enum HeldFrame {
    Bytes(bytes::Bytes),
    Summary(bytes::Bytes, u64),
    Oversize(u64),
}

/// Two per-direction queues merged by relay timestamp (see [`REORDER_HOLD`]).
#[derive(Default)]
struct Reorder {
    queues: [std::collections::VecDeque<Held>; 2],
    closed: [bool; 2],
}

impl Reorder {
    /// Takes a frame the splitter completed. When nothing is held and the other direction has
    /// settled (every byte it read is already in the observer's hands, see
    /// [`crate::tap::TapReceiver::settled`]) or closed, nothing can overtake the frame: it is
    /// observed at once, in place, without a copy. Otherwise it is held: a frame inside the tap
    /// chunk `chunk` (the common case) as a zero-copy slice of it, a frame the splitter assembled
    /// from several chunks as a copy of the splitter's buffer.
    #[allow(clippy::too_many_arguments)]
    fn push<S: EventSink>(
        &mut self,
        obs: &mut Observer<S>,
        dir: Direction,
        seen: Instant,
        chunk: &bytes::Bytes,
        s: Split<'_>,
        other_settled: bool,
    ) {
        let i = dir.index();
        let other = 1 - i;
        let clear = self.queues[i].is_empty() && self.queues[other].is_empty();
        if clear && (other_settled || self.closed[other]) {
            match s {
                Split::Frame(f) => obs.on_frame(StreamId(0), dir, seen, f),
                Split::Summary { skeleton, len } => {
                    obs.on_summary_frame(StreamId(0), dir, seen, skeleton, len)
                }
                Split::Oversize(n) => obs.on_oversize_frame(dir, n),
            }
            return;
        }
        let frame = match s {
            Split::Frame(f) => HeldFrame::Bytes(slice_or_copy(chunk, f)),
            Split::Summary { skeleton, len } => {
                HeldFrame::Summary(bytes::Bytes::copy_from_slice(skeleton), len)
            }
            Split::Oversize(n) => HeldFrame::Oversize(n),
        };
        self.queues[i].push_back(Held { seen, frame });
    }

    fn is_empty(&self) -> bool {
        self.queues.iter().all(|q| q.is_empty())
    }

    /// Observes every frame that can no longer be overtaken (`drain`: all), at most `limit` of
    /// them; true if it stopped at the limit with more releasable frames left. `settled`: per
    /// direction, whether every byte the relay read is already in the observer's hands.
    fn release<S: EventSink>(
        &mut self,
        obs: &mut Observer<S>,
        now: Instant,
        drain: bool,
        limit: usize,
        settled: [bool; 2],
        pacer: &Pacer,
    ) -> bool {
        const DIRS: [Direction; 2] = [Direction::ClientToServer, Direction::ServerToClient];
        for _ in 0..limit {
            let heads = [
                self.queues[0].front().map(|h| h.seen),
                self.queues[1].front().map(|h| h.seen),
            ];
            let pick = match heads {
                [Some(a), Some(b)] => Some(if a <= b { 0 } else { 1 }),
                [Some(a), None] => (drain
                    || self.closed[1]
                    || settled[1]
                    || now.saturating_duration_since(a) >= REORDER_HOLD)
                    .then_some(0),
                [None, Some(b)] => (drain
                    || self.closed[0]
                    || settled[0]
                    || now.saturating_duration_since(b) >= REORDER_HOLD)
                    .then_some(1),
                [None, None] => None,
            };
            let Some(i) = pick else { return false };
            let Some(h) = self.queues[i].pop_front() else {
                return false;
            };
            match h.frame {
                HeldFrame::Bytes(b) => obs.on_frame(StreamId(0), DIRS[i], h.seen, &b),
                HeldFrame::Summary(b, len) => {
                    obs.on_summary_frame(StreamId(0), DIRS[i], h.seen, &b, len)
                }
                HeldFrame::Oversize(n) => obs.on_oversize_frame(DIRS[i], n),
            }
            pacer.pace();
        }
        !self.is_empty()
    }

    /// When the oldest held frame must be released at the latest.
    fn deadline(&self) -> Option<Instant> {
        self.queues
            .iter()
            .filter_map(|q| q.front().map(|h| h.seen + REORDER_HOLD))
            .min()
    }
}

/// `f` as a zero-copy slice of `chunk` when it points into it, else a copy.
fn slice_or_copy(chunk: &bytes::Bytes, f: &[u8]) -> bytes::Bytes {
    let c = chunk.as_ptr() as usize;
    let p = f.as_ptr() as usize;
    if !f.is_empty() && p >= c && p + f.len() <= c + chunk.len() {
        chunk.slice(p - c..p - c + f.len())
    } else {
        bytes::Bytes::copy_from_slice(f)
    }
}

/// After working off what the tap held, the observer waits this long before looking again
/// instead of asking to be woken: a sender then queues with a lock and a push and no wake-up
/// syscall, and the observer runs once per linger with a batch instead of once per chunk. Only
/// when a look finds nothing does it sleep until the next offer. Delays observation by at most
/// this much (timestamps are the relay's, so `dur_ms` is unaffected), never the relay; the tap's
/// byte budget covers what arrives meanwhile.
pub const TAP_LINGER: Duration = Duration::from_millis(2);

/// Most frames observed between two yields to the runtime. The reporter runs on the same
/// worker and takes up to tokio's cooperative budget (128) of events per turn: observing at most
/// this many frames (at most one event each, bar batches) per turn keeps its queue from
/// overflowing while a backlog is worked off.
pub const FRAMES_PER_TURN: usize = 64;

/// How long the observer waits, per stall, for room in the reporter's queue before observing
/// anyway (and letting the queue count the drops). A healthy ingest answers well within it, so
/// a backlog is paced to the reporter instead of overflowing its queue; a black-hole ingest
/// cannot stall observation (and the tap) for longer than this.
pub const SINK_STALL_LIMIT: Duration = Duration::from_millis(250);

/// Room in the reporter's queue the observer waits for before it splits the next tap chunk:
/// one 64 KiB chunk of the smallest `tools/call` responses (~36 bytes) completes ~1,800 calls.
const SINK_ROOM: usize = 2_048;

/// How often the observer re-checks the reporter's queue while it waits for room.
const SINK_POLL: Duration = Duration::from_millis(1);

/// Waits (bounded, see [`SINK_STALL_LIMIT`]) until the sink can take a turn's worth of events.
async fn pace_to_sink<S: EventSink>(obs: &Observer<S>, stalled_since: &mut Option<Instant>) {
    while obs.sink.room() < SINK_ROOM {
        let now = Instant::now();
        let since = *stalled_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= SINK_STALL_LIMIT {
            return;
        }
        tokio::time::sleep(SINK_POLL).await;
    }
    *stalled_since = None;
}

/// Per direction: has every byte the relay read in it reached the splitter? `left`: chunks of
/// each direction drained from the tap but not yet split.
fn settled(rx: &TapReceiver, left: &[usize; 2]) -> [bool; 2] {
    [
        left[0] == 0 && rx.settled(Direction::ClientToServer),
        left[1] == 0 && rx.settled(Direction::ServerToClient),
    ]
}

/// How the observer keeps pace with what it shares: the reporter's queue (how long it has been
/// waiting for room, see [`pace_to_sink`]) and the CPU (see [`priority::Pacer`]).
struct Pace<'a> {
    stalled: Option<Instant>,
    pacer: &'a Pacer,
}

/// Releases what the reorder window allows, a turn at a time, yielding between turns.
async fn release_paced<S: EventSink>(
    reorder: &mut Reorder,
    obs: &mut Observer<S>,
    drain: bool,
    rx: &TapReceiver,
    left: &[usize; 2],
    pace: &mut Pace<'_>,
) {
    let pacer = pace.pacer;
    loop {
        pace_to_sink(obs, &mut pace.stalled).await;
        let settled = settled(rx, left);
        let now = Instant::now();
        if !reorder.release(obs, now, drain, FRAMES_PER_TURN, settled, pacer) {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// Drives an observer from the stdio tap until both directions close, then returns it
/// (the caller decides the [`EndCause`] for calls still in flight). Splits each direction into
/// frames, stamps each frame with the relay time of the chunk that completed it, observes the
/// frames of both directions in timestamp order (see [`REORDER_HOLD`]), and checks call
/// timeouts every [`TICK`]. Takes everything queued per look and lingers between looks (see
/// [`TAP_LINGER`]); yields every [`FRAMES_PER_TURN`] frames so the reporter keeps up. Tells
/// `pacer` whether traffic flows and lets it pace every frame (see [`priority::Pacer`]).
pub async fn run_tap_observer<S: EventSink>(
    mut rx: TapReceiver,
    mut observer: Observer<S>,
    pacer: std::sync::Arc<Pacer>,
) -> Observer<S> {
    let pacer = &*pacer;
    let mut pace = Pace {
        stalled: None,
        pacer,
    };
    // Traffic flows while the relay keeps handing the tap new chunks; not once it is closing.
    let mut offers = rx.offers();
    let mut look = |rx: &TapReceiver, closing: bool| {
        let now = rx.offers();
        if closing {
            pacer.set_closing();
        } else {
            pacer.set_live(now != offers);
        }
        offers = now;
    };
    let mut splitters = [FrameSplitter::default(), FrameSplitter::default()];
    let mut last_seen: [Option<Instant>; 2] = [None, None];
    let mut reorder = Reorder::default();
    let mut batch: VecDeque<TapMsg> = VecDeque::new();
    let mut next_tick = Instant::now() + TICK;
    let mut closing = false;
    loop {
        let got = match rx.drain(&mut batch) {
            Drained::Empty => {
                let wake_at = reorder.deadline().map_or(next_tick, |h| h.min(next_tick));
                tokio::select! {
                    got = rx.recv_many(&mut batch) => got,
                    _ = tokio::time::sleep_until(wake_at.into()) => Drained::Empty,
                }
            }
            got => got,
        };
        if got == Drained::Closed {
            break;
        }
        let worked = got == Drained::Some;
        look(&rx, closing);
        let mut left = [0usize; 2];
        for msg in &batch {
            if let TapMsg::Chunk(c) = msg {
                left[c.dir.index()] += 1;
            }
        }
        while let Some(msg) = batch.pop_front() {
            pace_to_sink(&observer, &mut pace.stalled).await;
            match msg {
                TapMsg::Chunk(c) => {
                    let i = c.dir.index();
                    left[i] -= 1;
                    if c.after_gap {
                        observer.on_gap(c.dir, c.seen);
                    }
                    last_seen[i] = Some(c.seen);
                    let other_settled = settled(&rx, &left)[1 - i];
                    let before = observer.stats.events;
                    splitters[i].push(&c.bytes, c.after_gap, c.skipped, |s| {
                        reorder.push(&mut observer, c.dir, c.seen, &c.bytes, s, other_settled);
                        pacer.pace();
                    });
                    look(&rx, closing);
                    if observer.stats.events - before >= FRAMES_PER_TURN as u64 {
                        tokio::task::yield_now().await;
                    }
                }
                TapMsg::Closed { dir, seen } => {
                    let at = last_seen[dir.index()].unwrap_or(seen);
                    let other_settled = settled(&rx, &left)[1 - dir.index()];
                    splitters[dir.index()].flush(|s| {
                        reorder.push(
                            &mut observer,
                            dir,
                            at,
                            &bytes::Bytes::new(),
                            s,
                            other_settled,
                        )
                    });
                    reorder.closed[dir.index()] = true;
                    // The session is ending: look again at once, the other side follows soon.
                    closing = true;
                }
            }
            release_paced(&mut reorder, &mut observer, false, &rx, &left, &mut pace).await;
        }
        let now = Instant::now();
        if now >= next_tick {
            observer.on_tick(now);
            next_tick = now + TICK;
        }
        release_paced(&mut reorder, &mut observer, false, &rx, &[0, 0], &mut pace).await;
        if worked && !closing {
            // Linger (see TAP_LINGER); a closing sender cuts it short.
            tokio::select! {
                _ = tokio::time::sleep(TAP_LINGER) => {}
                _ = rx.woken() => {}
            }
        }
    }
    for dir in [Direction::ClientToServer, Direction::ServerToClient] {
        let at = last_seen[dir.index()].unwrap_or_else(Instant::now);
        splitters[dir.index()]
            .flush(|s| reorder.push(&mut observer, dir, at, &bytes::Bytes::new(), s, true));
    }
    pacer.set_closing();
    release_paced(&mut reorder, &mut observer, true, &rx, &[0, 0], &mut pace).await;
    observer
}

#[cfg(test)]
mod tests;
