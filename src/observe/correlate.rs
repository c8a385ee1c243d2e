//! Correlation: which requests are waiting for which answers, and which action an answer ends.
//!
//! Owns the key requests are matched by — (scope, direction the request travelled, id), never the
//! id alone, because a server→client request may reuse an id the client used (DESIGN §2a, §9);
//! ids compare as servers compare them, equal numbers equal however written ([`RpcId`]) — the
//! pending requests, the early responses, and the [`Action`] record of one `tools/call` from its
//! first request to its final result. Server→client requests (sampling, roots, elicitation) are
//! matched in their own direction, so neither they nor the client's answers to them are ever
//! taken for a tool result. Holds metadata only (tool name, timings, sizes, already-filtered
//! captured fields), plus copies of responses that came before their request, for at most
//! [`EARLY_RESPONSE_GRACE`] and [`EARLY_RESPONSE_BYTES`] in all. What an answer means is
//! [`super::outcome`]'s.
//!
//! * **Open requests are capped**, so memory is bounded whatever a peer sends: past
//!   [`MAX_OPEN_PER_SCOPE`] in one scope the oldest is dropped from tracking, past
//!   [`MAX_PENDING`] in all scopes a new one is not tracked. Such a `tools/call` makes no event
//!   (its answer may still come: a status would be a guess) and is counted in
//!   [`super::ObserverStats::unobserved`]; a late answer is an orphan response.
//!
//! * **Call timeout** (`--call-timeout-ms`, default [`crate::config::DEFAULT_CALL_TIMEOUT`]): a
//!   `tools/call` with no answer that long after its latest request round ends as 504 `timeout`,
//!   checked by [`Observer::on_tick`] about once a second. A call still open when the session
//!   ends is 504 too ([`super::EndCause::SessionEnd`]), or 502 `transport` when the server went
//!   away.
//! * **2026-07-28 multi round-trip**: a result with `resultType` `"input_required"` (or the
//!   draft's `"incomplete"`) does not end the action. The client's retry (a new id) joins it when
//!   it echoes the `requestState` the server sent (matched by digest, in any scope), or else, when
//!   it carries `requestState`/`inputResponses`, when it calls the same tool as an action waiting
//!   for input in the same scope (oldest first) or in a scope that has ended (stateless HTTP,
//!   where every POST is its own scope). A `tools/call` with neither field is always a new action.
//!   The one event spans the first request to the final result; `bytes` sums every round.
//!   An action whose retry never comes ends as 504 after the call timeout.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::event::{EventSink, Session, SharedStr};
use crate::tap::Direction;

use super::assemble::{clean, ToolName, MAX_INFO_LEN};
use super::observer::{CounterMap, Observer, Size};
use super::outcome::{Answer, Outcome};
use super::peek::{lenient_str, peek, Lenient, Peek, RpcId};
use super::StreamId;

/// Most requests open at once in one scope (a stdio session, an HTTP session); past it the
/// scope's oldest open request is dropped from tracking. Agents keep a handful of calls in
/// flight. A client that pipelines holds open what it writes ahead of the answers: about a
/// thousand small calls fill the pipe and read buffers of a server that answers in turn, and a
/// server that reads everything first holds the whole burst. Thousands open is a flood, not an
/// agent. A full scope holds under 4 MiB (about 700 bytes per open call, 950 once a flood churns
/// through it and the tables grow).
pub const MAX_OPEN_PER_SCOPE: usize = 4096;

/// Most requests open at once in all scopes together (HTTP holds one scope per session, up to
/// thousands); past it a new request in a scope below [`MAX_OPEN_PER_SCOPE`] is not tracked.
/// Two full scopes: under 8 MiB.
pub const MAX_PENDING: usize = 2 * MAX_OPEN_PER_SCOPE;

/// Stale keys (answered since they were queued) an open-request queue may hold beyond twice its
/// open ones before it is swept: a sweep costs one lookup per key, paid for by the pushes since.
const SWEEP_SLACK: usize = 32;

/// How long a response whose request has not been observed yet is kept. The relay hands each
/// direction to the tap *after* forwarding it, so on a loaded machine a response can reach the
/// observer just before its request (the client→server thread was preempted between its write
/// and its hand-off). Timestamps are taken at read time and stay right; only arrival order flips.
pub const EARLY_RESPONSE_GRACE: Duration = Duration::from_secs(2);

/// Most bytes held for such early responses; beyond it they are counted as orphans at once.
pub const EARLY_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// A request's identity: the scope it was seen in, the direction it travelled, its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub scope: StreamId,
    pub dir: Direction,
    pub id: RpcId,
}

/// How the open requests' keys are hashed: foldhash, seeded at random once per process. The ids
/// come from the client and the server, so the seed must stay unknown to them (a fixed hash would
/// let them put thousands of open requests in one probe sequence); SipHash, std's default, cost
/// 476 instructions of a small call's ~25,300 for its hashes, and foldhash took ~490 off the
/// whole process's count (`bench/README.md`, "The whole process, counted"). A scope holds at
/// most [`MAX_OPEN_PER_SCOPE`] open requests either way.
type OpenHasher = foldhash::fast::RandomState;

/// Two writes instead of the derive's four (scope, direction tag, id tag, id): every call hashes
/// its key three times (duplicate check, insert, response), and the hasher pays per write. Equal
/// keys still hash equally; which id variant it is need not go in, `Eq` tells them apart.
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let dir = match self.dir {
            Direction::ClientToServer => 0,
            Direction::ServerToClient => 1,
        };
        state.write_u64(self.scope.0.rotate_left(1) ^ dir);
        match &self.id {
            RpcId::Num(n) => state.write_i128(*n),
            RpcId::Str(s) | RpcId::Dec(s) => state.write(s.as_bytes()),
        }
    }
}

/// What a pending request was, so its response is read the right way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingKind {
    /// A `tools/call` round of the action with this number.
    ToolCall(u64),
    /// `tools/list`; `first_page`: sent without a cursor.
    ToolsList {
        first_page: bool,
    },
    Initialize,
    Discover,
    /// Anything else (including server→client sampling, roots, elicitation): matched so its
    /// response is never mistaken for something else, and otherwise ignored.
    Other,
}

#[derive(Debug, Clone)]
pub struct Pending {
    pub kind: PendingKind,
    pub seen: Instant,
    /// When it was tracked, in [`OpenRequests`]' count: tells its queue entry from the entry of
    /// an earlier request with the same key, answered since.
    seq: u64,
}

/// The requests waiting for an answer, and in each scope the order they came in, so that a full
/// scope drops its oldest in amortised O(1): a queue of keys beside the map. A key answered
/// since it was queued leaves at once when it was the oldest; otherwise it stays in the queue
/// until met at its front or swept out (once stale keys are half the queue).
#[derive(Debug)]
pub(super) struct OpenRequests {
    map: HashMap<Key, Pending, OpenHasher>,
    order: CounterMap<StreamId, Order>,
    next_seq: u64,
    /// Most open per scope: [`MAX_OPEN_PER_SCOPE`], smaller in tests that fill a scope.
    cap: usize,
}

impl Default for OpenRequests {
    fn default() -> Self {
        OpenRequests {
            map: HashMap::default(),
            order: CounterMap::default(),
            next_seq: 0,
            cap: MAX_OPEN_PER_SCOPE,
        }
    }
}

/// One scope's open requests, oldest first.
#[derive(Debug, Default)]
struct Order {
    queue: VecDeque<(Key, u64)>,
    /// How many entries of `queue` are still open.
    open: usize,
}

impl OpenRequests {
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    pub(super) fn contains(&self, key: &Key) -> bool {
        self.map.contains_key(key)
    }

    /// Requests open in `scope`.
    pub(super) fn open_in(&self, scope: StreamId) -> usize {
        self.order.get(&scope).map_or(0, |o| o.open)
    }

    pub(super) fn remove(&mut self, key: &Key) -> Option<Pending> {
        let p = self.map.remove(key)?;
        if let Some(o) = self.order.get_mut(&key.scope) {
            o.open = o.open.saturating_sub(1);
            if o.open == 0 {
                // Every key left is stale; the queue keeps its buffer for the next request.
                o.queue.clear();
            } else if o.queue.front().is_some_and(|(_, seq)| *seq == p.seq) {
                // Answered oldest first, as most servers answer: its entry leaves now, by a
                // comparison, instead of at a sweep that looks every stale key up again.
                o.queue.pop_front();
            }
        }
        Some(p)
    }

    /// Tracks a request whose key is not open. When its scope already held
    /// [`MAX_OPEN_PER_SCOPE`], the scope's oldest open request is dropped and returned.
    pub(super) fn insert(
        &mut self,
        key: Key,
        kind: PendingKind,
        seen: Instant,
    ) -> Option<(Key, Pending)> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let order = self.order.entry(key.scope).or_default();
        order.queue.push_back((key.clone(), seq));
        order.open += 1;
        if self.map.insert(key, Pending { kind, seen, seq }).is_some() {
            // Replaced (callers check first): the old entry's queue key no longer matches.
            order.open -= 1;
        }
        let map = &mut self.map;
        let is_open = |map: &HashMap<Key, Pending, OpenHasher>, (k, s): &(Key, u64)| {
            map.get(k).is_some_and(|p| p.seq == *s)
        };
        let mut evicted = None;
        if order.open > self.cap {
            while let Some(entry) = order.queue.pop_front() {
                if is_open(map, &entry) {
                    evicted = map.remove_entry(&entry.0);
                    order.open -= 1;
                    break;
                }
            }
        }
        if order.queue.len() > 2 * order.open + SWEEP_SLACK {
            order.queue.retain(|e| is_open(map, e));
        }
        evicted
    }

    /// Keeps the requests `keep` says yes to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Key, &Pending) -> bool) {
        let order = &mut self.order;
        self.map.retain(|k, p| {
            let kept = keep(k, p);
            if !kept {
                if let Some(o) = order.get_mut(&k.scope) {
                    o.open = o.open.saturating_sub(1);
                }
            }
            kept
        });
        // A scope with nothing open needs no queue.
        order.retain(|_, o| o.open > 0);
    }

    /// Forgets every request of `scope`.
    pub(super) fn end_scope(&mut self, scope: StreamId) {
        self.order.remove(&scope);
        self.map.retain(|k, _| k.scope != scope);
    }
}

/// Where an action stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionState {
    /// A request round is on the wire, waiting for the response to this key.
    InFlight(Key),
    /// The server answered `input_required`; waiting for the client's retry with a new id.
    /// `state`: SHA-256 of the `requestState` to be echoed, if the server sent one (kept as a
    /// digest: the observer has no business holding the server's state).
    AwaitingInput { state: Option<[u8; 32]> },
}

/// One `tools/call` as an action: from the first request to the final result.
#[derive(Debug, Clone)]
pub struct Action {
    /// The scope of the latest round.
    pub scope: StreamId,
    /// False once that scope ended (HTTP): a retry may then come in any scope.
    pub scope_open: bool,
    pub tool: ToolName,
    pub started: Instant,
    pub started_wall: SystemTime,
    /// When the latest round started or ended: the call timeout runs from here.
    pub last_activity: Instant,
    /// The captured arguments, keys unique, in argument order. A boxed slice, not the event's
    /// `Map`: every tree node of a `Map` reserves room for eleven entries, and a call held open
    /// usually has one to three.
    pub fields: Option<Box<[(SharedStr, Value)]>>,
    pub on_behalf_of: Option<String>,
    /// Shared with the observer's current version: a pointer per call, not a copy.
    pub registry_version: Option<SharedStr>,
    pub session: Option<Session>,
    pub bytes_req: u64,
    pub bytes_resp: u64,
    pub rounds: u32,
    pub state: ActionState,
    /// What the latest list says of the tool (`toolDef`, `listed`, `hints`).
    pub facts: super::catalog::CallFacts,
    /// `err.fp` of an answered error, computed when the answer is read (its text is not kept).
    pub err_fp: Option<String>,
    /// What only a sink that wants call facts needs (OTLP): `None` for any other sink.
    pub extra: Option<Box<CallExtra>>,
}

/// Per call, for [`crate::event::call::CallFacts`]: taken from the first round.
#[derive(Debug, Clone)]
pub struct CallExtra {
    pub request_id: Option<String>,
    pub trace: Option<crate::event::call::TraceContext>,
}

/// SHA-256 of an echoed `requestState`.
pub fn state_digest(state: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, state.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// A response kept until its request is observed (see [`EARLY_RESPONSE_GRACE`]).
pub(super) struct Early {
    /// A copy of the message (of its skeleton, for a summarised frame).
    pub(super) msg: Vec<u8>,
    pub(super) seen: Instant,
    pub(super) size: Size,
}

pub(super) fn opposite(d: Direction) -> Direction {
    match d {
        Direction::ClientToServer => Direction::ServerToClient,
        Direction::ServerToClient => Direction::ClientToServer,
    }
}

impl<S: EventSink> Observer<S> {
    /// Early responses whose request never came are orphans (all of them when `now` is None).
    pub(super) fn expire_early(&mut self, now: Option<Instant>) {
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
        if request_dir == Direction::ClientToServer && self.answers_owed > 0 {
            // The answer to a request the observer lost (see `Observer::requests_lost`).
            self.answers_owed -= 1;
            return;
        }
        self.stats.orphan_responses += 1;
        if !self.warned.orphan {
            self.warned.orphan = true;
            tracing::warn!(
                direction = opposite(request_dir).label(),
                "A response matches no pending request (unknown or repeated id)"
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_request(
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
        if self.pending.contains(&key) {
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
                    Some(aid) => PendingKind::ToolCall(aid),
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
        // A scope at its own cap makes room by dropping its oldest: the total does not grow.
        let full =
            self.pending.len() >= MAX_PENDING && self.pending.open_in(scope) < MAX_OPEN_PER_SCOPE;
        if full {
            self.drop_untracked(kind);
            return;
        }
        if let (PendingKind::ToolCall(_), Some(calls)) = (kind, &mut self.started_calls) {
            calls.push(key.id.clone());
        }
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
            self.track(key.clone(), kind, seen);
            if let Ok(p) = peek(&e.msg) {
                if let Lenient::Ok(id) = p.id.clone() {
                    self.on_response(scope, opposite(dir), e.seen, id, &p, &e.msg, e.size);
                }
            }
        } else {
            self.track(key, kind, seen);
        }
    }

    /// Starts waiting for the answer to `key`; a scope past [`MAX_OPEN_PER_SCOPE`] drops its
    /// oldest open request.
    fn track(&mut self, key: Key, kind: PendingKind, seen: Instant) {
        if let Some((_, oldest)) = self.pending.insert(key, kind, seen) {
            self.drop_untracked(oldest.kind);
        }
    }

    /// A request dropped from tracking at a cap (see the module docs): its action, if it is a
    /// `tools/call`, ends with no event. Counted, with one warning.
    fn drop_untracked(&mut self, kind: PendingKind) {
        self.stats.evicted += 1;
        if let PendingKind::ToolCall(aid) = kind {
            if self.actions.remove(&aid).is_some() {
                self.stats.unobserved += 1;
            }
        }
        if !self.warned.open_cap {
            self.warned.open_cap = true;
            tracing::warn!(
                per_scope = MAX_OPEN_PER_SCOPE,
                in_all = MAX_PENDING,
                "More requests await an answer than the observer tracks: the excess is \
                 relayed unchanged, not observed"
            );
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
        let raw_name = lenient_str(&params.name)?;
        let tool = self.tool_names.get(raw_name)?;
        let meta = params.meta.ok();
        let echoed_state = lenient_str(&params.request_state)
            .or_else(|| meta.and_then(|m| lenient_str(&m.request_state)));
        let is_retry = echoed_state.is_some() || params.input_responses.is_some();
        if is_retry {
            if let Some(aid) = self.find_waiting(scope, &tool.action, echoed_state) {
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

        if tool.redacted {
            self.stats.redacted_tools += 1;
        }
        let fields = params.arguments.ok().map(|args| self.capture(args));
        let on_behalf_of = self.on_behalf_of(meta);
        let aid = self.next_action;
        self.next_action += 1;
        let action = Action {
            scope,
            scope_open: true,
            tool,
            started: seen,
            started_wall: self.wall.at(seen),
            last_activity: seen,
            fields: fields.filter(|f| !f.is_empty()).map(Vec::into_boxed_slice),
            on_behalf_of,
            registry_version: self.registry_version.clone(),
            session: self.session_for(scope),
            bytes_req: len,
            bytes_resp: 0,
            rounds: 1,
            state: ActionState::InFlight(key.clone()),
            facts: self.catalog.call_facts(raw_name),
            err_fp: None,
            extra: self
                .sink
                .wants_call_facts()
                .then(|| Box::new(self.call_extra(&key.id, meta))),
        };
        self.actions.insert(aid, Box::new(action));
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
                .filter(|(_, a)| *a.tool.action == *tool)
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

    pub(super) fn on_notification(
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
    pub(super) fn on_response(
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
            PendingKind::ToolsList { first_page } if size.partial => {
                // Only part of the catalog was seen: no version is better than a wrong one.
                self.catalog.invalidate();
                self.catalog.on_partial_page(size.len, first_page);
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
                    self.catalog.on_list_response(msg, first_page);
                    if self.catalog.version() != self.registry_version.as_deref() {
                        self.catalog_changed(seen);
                    }
                    for d in self.catalog.take_drift() {
                        self.emit_drift(scope, seen, d);
                    }
                }
            }
            PendingKind::Initialize | PendingKind::Discover => {
                let Some(r) = p.result.ok() else { return };
                let info = r
                    .server_info
                    .ok()
                    .or_else(|| r.meta.ok().and_then(|m| m.server_info.ok()));
                if let Some(v) = info.and_then(|i| lenient_str(&i.version)) {
                    self.server_version = clean(v, MAX_INFO_LEN).map(SharedStr::from);
                }
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
        let v = self.catalog.version().map(SharedStr::from);
        self.registry_version = v.clone();
        for a in self
            .actions
            .values_mut()
            .filter(|a| a.started >= seen && a.rounds == 1)
        {
            a.registry_version = v.clone();
            a.facts = self.catalog.call_facts(&a.tool.action);
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
        let outcome = match Answer::of(p) {
            Answer::Final(outcome) => {
                // The error's text is read here, shaped and hashed, and dropped at once.
                let text = match outcome {
                    Outcome::JsonRpc(_) => p
                        .error
                        .ok()
                        .and_then(|e| lenient_str(&e.message))
                        .map(str::to_owned),
                    Outcome::ToolError => p.result.ok().and_then(|r| r.content.first_text()),
                    _ => None,
                };
                if let (Some(text), Some(err)) = (text, outcome.err()) {
                    a.err_fp = Some(super::fingerprint::error_fp(
                        &a.tool.action,
                        err.kind,
                        err.code,
                        &text,
                    ));
                }
                outcome
            }
            Answer::InputRequired { request_state } => {
                a.state = ActionState::AwaitingInput {
                    state: request_state.map(state_digest),
                };
                a.last_activity = seen;
                return;
            }
            Answer::Unreadable => {
                // The server did answer, so the call is over; the oddity is counted.
                self.count_malformed();
                Outcome::Success
            }
        };
        self.finish_action_answered(aid, outcome, seen, Some(answered));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(scope: u64, id: i128) -> Key {
        Key {
            scope: StreamId(scope),
            dir: Direction::ClientToServer,
            id: RpcId::Num(id),
        }
    }

    #[test]
    fn a_queue_answered_oldest_first_holds_only_what_is_open() {
        let mut open = OpenRequests::default();
        let now = Instant::now();
        for id in 0..3 {
            open.insert(key(1, id), PendingKind::Other, now);
        }
        for id in 3..10_000 {
            open.insert(key(1, id), PendingKind::Other, now);
            assert!(open.remove(&key(1, id - 3)).is_some());
            let order = &open.order[&StreamId(1)];
            assert_eq!((order.open, order.queue.len()), (3, 3));
        }
    }

    proptest! {
        /// Against a model (a list of open keys, oldest first): whatever order requests are
        /// answered in and whichever ids come back, the queue evicts exactly the oldest open
        /// request of a full scope, and counts what is open.
        #[test]
        fn the_oldest_open_request_is_the_one_evicted(
            ops in proptest::collection::vec((0u64..2, 0i128..24, any::<bool>()), 1..600)
        ) {
            let cap = 16;
            let mut open = OpenRequests { cap, ..OpenRequests::default() };
            let mut model: Vec<Key> = Vec::new();
            let now = Instant::now();
            for (i, (scope, id, insert)) in ops.into_iter().enumerate() {
                // Every third insert is a fresh id, never answered: the scopes fill up.
                let k = if insert && i % 3 == 0 {
                    key(scope, 1_000 + i as i128)
                } else {
                    key(scope, id)
                };
                if insert && !open.contains(&k) {
                    let evicted = open.insert(k.clone(), PendingKind::Other, now);
                    model.push(k.clone());
                    let in_scope: Vec<usize> = model
                        .iter()
                        .enumerate()
                        .filter(|(_, m)| m.scope == k.scope)
                        .map(|(j, _)| j)
                        .collect();
                    if in_scope.len() > cap {
                        let oldest = model.remove(in_scope[0]);
                        prop_assert_eq!(evicted.map(|(e, _)| e), Some(oldest));
                    } else {
                        prop_assert!(evicted.is_none());
                    }
                } else if !insert {
                    let was = model.iter().position(|m| *m == k);
                    prop_assert_eq!(open.remove(&k).is_some(), was.is_some());
                    if let Some(j) = was {
                        model.remove(j);
                    }
                }
                prop_assert_eq!(open.len(), model.len());
                for s in 0..2 {
                    let n = model.iter().filter(|m| m.scope == StreamId(s)).count();
                    prop_assert_eq!(open.open_in(StreamId(s)), n);
                }
            }
        }
    }
}
