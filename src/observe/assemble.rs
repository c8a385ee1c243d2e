//! Event assembly: an ended action becomes one [`Event`], or a count when no honest event can
//! be made.
//!
//! Owns what an event carries besides its outcome: `dest.host` (the upstream, or `mcp://` and
//! the server's name), the session facts of each scope (id, protocol, client), the tool name,
//! the captured arguments (the capture policy decides), `onBehalfOf`, timings and sizes. Every
//! string it puts in is short, single-line and holds nothing the L4 scrubber removes
//! ([`clean`]), so its events pass the L3 filter unchanged. Must never put a request or response
//! value in an event except allow-listed scalar arguments, and never make an event for a call
//! whose answer may have been dropped on the way to the observer (DESIGN §2 invariant 10): that
//! call is counted as unobserved instead.
//!
//! It also builds the `drift` events ([`Observer::emit_drift`]): a tool's name and definition
//! hashes, never its description; and gives every error its fingerprint (`err.fp`, see
//! [`super::fingerprint`]).

use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::event::call::{CallFacts, TraceContext, MAX_REQUEST_ID};
use crate::event::filter::REDACTED;
use crate::event::privacy::{Capture, Memo, MAX_FIELDS};
use crate::event::EventClass;
use crate::event::{
    new_event_id, Actor, ByteSizes, Dest, Event, EventSink, Rec, Session, SharedStr, SENSOR_GRADE,
    SENSOR_KIND, SENSOR_METHOD, SENSOR_RAIL,
};

use super::catalog::Drift;

use super::correlate::{ActionState, CallExtra, Key};
use super::observer::Observer;
use super::outcome::Outcome;
use super::peek::{lenient_str, Args, Meta, Peek, RpcId};
use super::{ObserverConfig, StreamId, Transport};

/// Longest tool name accepted (the MCP spec recommends at most 128 characters).
pub const MAX_TOOL_NAME: usize = 128;

/// Longest server name, client name or protocol string kept.
pub(super) const MAX_INFO_LEN: usize = 128;

/// Per-scope session facts.
#[derive(Debug, Clone, Default)]
pub(super) struct ScopeInfo {
    pub(super) session_id: Option<SharedStr>,
    /// From the `initialize` result (negotiated).
    pub(super) protocol_negotiated: Option<SharedStr>,
    /// From the `initialize` request or a 2026-07-28 request's `_meta`.
    pub(super) protocol_requested: Option<SharedStr>,
    pub(super) client: Option<SharedStr>,
    /// HTTP: when the scope got its session id (for `mcp.server.session.duration`).
    pub(super) opened: Option<Instant>,
}

/// `dest.host`: the upstream (HTTP), or `mcp://` and the server's name (stdio): `--name`, else
/// the `serverInfo.name` learned (`learned`), else the default. A host that holds a value L4
/// removes (an upstream at a public IP address) is sent as [`REDACTED`], which the filter keeps.
pub(super) fn dest_host(cfg: &ObserverConfig, learned: Option<&str>) -> SharedStr {
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

/// A short single-line string with nothing the value scrubber would remove, or nothing: what
/// the builder puts in names, session facts and `onBehalfOf`, so its events pass the L3 filter
/// unchanged.
pub(super) fn clean(s: &str, max: usize) -> Option<String> {
    let ok = !s.is_empty()
        && s.len() <= max
        && !s.chars().any(char::is_control)
        && !crate::event::privacy::contains_sensitive(s);
    ok.then(|| s.to_string())
}

/// A random stdio session id that L4 does not read as a card number or IBAN (random hex can
/// hold a Luhn-valid digit run now and then): such an id would get every event rejected.
pub(super) fn clear_session_id() -> String {
    loop {
        let id = new_event_id();
        if !crate::event::privacy::contains_sensitive(&id) {
            return id.to_string();
        }
    }
}

/// A session's id, protocol and client, borrowed from the observer (`session_strings`).
type SessionStrings<'s> = (&'s SharedStr, Option<&'s SharedStr>, Option<&'s SharedStr>);

/// The names a call's event carries for its tool: `rec.action` and `dest.pathTemplate`.
#[derive(Debug, Clone)]
pub struct ToolName {
    /// The name as the request gave it, or [`REDACTED`] for one that holds a value L4 removes
    /// (the call is still reported, and counted).
    pub action: SharedStr,
    /// `/` and [`Self::action`].
    pub path: SharedStr,
    pub redacted: bool,
}

impl ToolName {
    /// `None` for a name the envelope cannot hold (empty, too long, control characters: the
    /// request is malformed).
    fn of(s: &SharedStr) -> Option<ToolName> {
        if s.is_empty() || s.len() > MAX_TOOL_NAME || s.chars().any(char::is_control) {
            return None;
        }
        // Recalled: the filter checks the name again.
        let redacted = crate::event::privacy::contains_sensitive_recalled(s);
        let action = if redacted {
            SharedStr::from(REDACTED)
        } else {
            s.clone()
        };
        Some(ToolName {
            path: SharedStr::from(format!("/{action}")),
            action,
            redacted,
        })
    }
}

/// How many tool names [`ToolNames`] holds.
const TOOL_NAME_SLOTS: usize = 16;

/// The tool names calls were made with lately, each with its [`ToolName`]: a session calls a
/// few tools many times, and an event then shares its tool's two strings instead of allocating
/// and freeing them (two allocations of a call's dozen; bench/README.md). The verdict on a name
/// depends on the name alone, so a remembered one is the same as one worked out again. Bounded:
/// past [`TOOL_NAME_SLOTS`] names the oldest entry is replaced, so a client inventing a name per
/// call costs what it cost before: the kept name is the event's `rec.action` unless redacted.
#[derive(Debug, Default)]
pub(super) struct ToolNames(Memo<Option<ToolName>, TOOL_NAME_SLOTS>);

impl ToolNames {
    pub(super) fn get(&mut self, raw: &str) -> Option<ToolName> {
        if let Some(name) = self.0.get(raw, |_| true) {
            return name;
        }
        let raw = SharedStr::from(raw);
        let name = ToolName::of(&raw);
        self.0.put_shared(raw, name.clone());
        name
    }
}

/// How far (in relay time) a stamp may lie from where [`WallClock`] last read both clocks before
/// it reads them again. The system clock may be slewed by up to 500 ppm, 50 µs over this span,
/// well under the millisecond events are stamped to; a clock that is set anew shows within it.
const WALL_ANCHOR_SPAN: Duration = Duration::from_millis(100);

/// Wall-clock times of the relay's monotonic stamps. Reading both clocks took about 50 ns,
/// once per request; their difference holds still between settings of the system clock, so it
/// is read again only for a stamp more than [`WALL_ANCHOR_SPAN`] from where it was last read
/// (`bench/README.md`, "Clock reads per call").
#[derive(Debug, Default)]
pub(super) struct WallClock(Option<(Instant, SystemTime)>);

impl WallClock {
    /// The wall-clock time of `seen`, a stamp from the recent past.
    pub(super) fn at(&mut self, seen: Instant) -> SystemTime {
        // How far `seen` lies from an anchor, and its wall-clock time by that anchor. The usual
        // stamp lies just after the anchor: one subtraction of the two `Instant`s decides and
        // measures it (each took ~50 instructions, and the two-sided test took four of them a
        // call, `bench/README.md`).
        let by = |(at, wall): (Instant, SystemTime)| match seen.checked_duration_since(at) {
            Some(later) => (later, wall.checked_add(later).unwrap_or(wall)),
            None => {
                let earlier = at.saturating_duration_since(seen);
                (earlier, wall.checked_sub(earlier).unwrap_or(wall))
            }
        };
        if let Some(anchor) = self.0 {
            let (away, time) = by(anchor);
            if away <= WALL_ANCHOR_SPAN {
                return time;
            }
        }
        by(*self.0.insert((Instant::now(), SystemTime::now()))).1
    }
}

impl<S: EventSink> Observer<S> {
    /// The allow-listed scalar arguments of a call, as the capture policy decides (at most
    /// [`MAX_FIELDS`], keys unique as in `args`); string values withheld as prose are counted.
    pub(super) fn capture(&mut self, args: &Args<'_>) -> Vec<(SharedStr, Value)> {
        let mut prose = 0u64;
        let mut m = Vec::new();
        for (k, v) in &args.0 {
            if m.len() >= MAX_FIELDS {
                break;
            }
            match v.as_scalar().map(|s| self.policy.decide_keyed(k, s)) {
                Some(Capture::Kept(kv)) => {
                    // Room for all the arguments: when all are kept (the usual case), the box the
                    // call holds them in needs no shrinking copy.
                    if m.capacity() == 0 {
                        m.reserve_exact(args.0.len().min(MAX_FIELDS));
                    }
                    m.push(kv)
                }
                Some(Capture::Prose) => prose += 1,
                Some(Capture::Dropped) | None => {}
            }
        }
        self.stats.prose_withheld += prose;
        m
    }

    /// The sensor's own actor: the agent it observes, attested by its key.
    fn actor(&self) -> Actor {
        Actor {
            id: self.actor.clone(),
            kind: SENSOR_KIND.into(),
            grade: SENSOR_GRADE.into(),
        }
    }

    /// `onBehalfOf`: the call's `_meta` value, else `--on-behalf-of`, if the envelope can carry it.
    pub(super) fn on_behalf_of(&self, meta: Option<&Meta<'_>>) -> Option<String> {
        meta.and_then(|m| lenient_str(&m.on_behalf_of))
            .and_then(|s| clean(s, MAX_INFO_LEN))
            .or_else(|| {
                self.cfg
                    .on_behalf_of
                    .as_deref()
                    .and_then(|s| clean(s, MAX_INFO_LEN))
            })
    }

    /// 2026-07-28 requests carry the protocol version and client identity in `_meta`.
    pub(super) fn note_client_meta(&mut self, scope: StreamId, p: &Peek<'_>) {
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

    pub(super) fn session_for(&self, scope: StreamId) -> Option<Session> {
        self.session_strings(self.scopes.get(&scope))
            .map(|strings| self.session_of(strings))
    }

    /// The strings of [`Self::session_for`] for a scope's facts (none: the scope is not
    /// known), borrowed: its id (none, no session), protocol and client.
    fn session_strings<'s>(&'s self, info: Option<&'s ScopeInfo>) -> Option<SessionStrings<'s>> {
        let id = match self.cfg.transport {
            Transport::Stdio => Some(&self.stdio_session),
            Transport::Http { .. } => info.and_then(|i| i.session_id.as_ref()),
        }?;
        let protocol = info.and_then(|i| {
            i.protocol_negotiated
                .as_ref()
                .or(i.protocol_requested.as_ref())
        });
        Some((id, protocol, info.and_then(|i| i.client.as_ref())))
    }

    /// The event's session of [`Self::session_strings`]: each string cloned.
    fn session_of(&self, (id, protocol, client): SessionStrings<'_>) -> Session {
        Session {
            id: id.clone(),
            protocol: protocol.cloned(),
            client: client.cloned(),
            catalog: self.catalog.size(),
        }
    }

    /// What [`Self::session_for`] says now, or else `snapshot`, when the scope is still open;
    /// `snapshot` when it is gone. A snapshot that says what `session_for` would is returned
    /// as it is: a new one would clone its strings again, and each clone and its drop are two
    /// atomic operations (bench/README.md, "Atomic reference counts").
    fn refresh_session(&self, scope: StreamId, snapshot: Option<Session>) -> Option<Session> {
        let Some(info) = self.scopes.get(&scope) else {
            return snapshot;
        };
        let Some((id, protocol, client)) = self.session_strings(Some(info)) else {
            return snapshot;
        };
        match snapshot {
            Some(s)
                if s.id == *id
                    && s.protocol.as_ref() == protocol
                    && s.client.as_ref() == client
                    && s.catalog == self.catalog.size() =>
            {
                Some(s)
            }
            _ => Some(self.session_of((id, protocol, client))),
        }
    }

    /// The id and trace context of a call's first round, for a sink that wants call facts:
    /// `_meta.traceparent` first (SEP-414), else the HTTP request's `traceparent` header. An id
    /// is exported only as the event's own strings are (short, single line, nothing L4 removes).
    pub(super) fn call_extra(&self, id: &RpcId, meta: Option<&Meta<'_>>) -> CallExtra {
        let text = match id {
            RpcId::Num(n) => n.to_string(),
            RpcId::Dec(d) => d.clone(),
            RpcId::Str(s) => s.clone(),
        };
        let trace = meta
            .and_then(|m| {
                let parent = lenient_str(&m.traceparent)?;
                TraceContext::parse(parent, lenient_str(&m.tracestate))
            })
            .or_else(|| self.header_trace.clone());
        CallExtra {
            request_id: clean(&text, MAX_REQUEST_ID),
            trace,
        }
    }

    /// The server's name was learned: `dest.host` and the facts' name follow it.
    pub(super) fn refresh_host(&mut self) {
        self.host = dest_host(&self.cfg, self.server_name.as_deref());
        self.named = self
            .cfg
            .server_name
            .as_deref()
            .or(self.server_name.as_deref())
            .map(SharedStr::from);
    }

    pub(super) fn finish_action(&mut self, aid: u64, outcome: Outcome, end: Instant) {
        self.finish_action_answered(aid, outcome, end, None);
    }

    /// [`Self::finish_action`] when the pending entry of `answered` is already gone (the
    /// response path removed it): saves hashing the key again.
    pub(super) fn finish_action_answered(
        &mut self,
        aid: u64,
        outcome: Outcome,
        end: Instant,
        answered: Option<&Key>,
    ) {
        let Some(mut a) = self.actions.remove(&aid) else {
            return;
        };
        if let ActionState::InFlight(key) = &a.state {
            if answered != Some(key) {
                self.pending.remove(key);
            }
        }
        let unanswered = matches!(outcome, Outcome::Timeout | Outcome::Transport);
        if unanswered && self.last_gap.is_some_and(|g| a.started < g) {
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
        let err = outcome.err().map(|mut e| {
            // An error with no text to read (a timeout, a transport failure) is fingerprinted
            // over its empty shape: grouped by tool, kind and code.
            e.fp = a.err_fp.take().or_else(|| {
                Some(super::fingerprint::error_fp(
                    &a.tool.action,
                    e.kind,
                    e.code,
                    "",
                ))
            });
            e
        });
        let event = Event {
            v: crate::event::EVENT_SCHEMA_VERSION,
            id: new_event_id(),
            ts: self.stamps.at(a.started_wall),
            class: outcome.class(),
            rec: Rec {
                rail: SENSOR_RAIL.into(),
                action: a.tool.action,
                registry_version: a.registry_version,
                fields: a.fields.map(|f| f.into_vec().into_iter().collect()),
                tool_def: a.facts.tool_def,
                listed: a.facts.listed,
                hints: a.facts.hints,
                change: None,
                prev_tool_def: None,
            },
            dest: Dest {
                host,
                path_template: a.tool.path,
                method: SENSOR_METHOD.into(),
            },
            actor: self.actor(),
            on_behalf_of: a.on_behalf_of,
            status: outcome.status(),
            dur_ms,
            bytes: ByteSizes {
                req: a.bytes_req,
                resp: a.bytes_resp,
            },
            session,
            err,
        };
        self.stats.events += 1;
        if self.sink.wants_call_facts() {
            let start = a.started_wall;
            let (request_id, trace) = a.extra.map_or((None, None), |e| (e.request_id, e.trace));
            let facts = CallFacts {
                start,
                end: start.checked_add(dur).unwrap_or(start),
                request_id,
                trace,
                listed: self.catalog.listed(&event.rec.action),
                server_version: self.server_version.clone(),
                server_name: self.named.clone(),
            };
            self.sink.emit_call(event, facts);
        } else {
            self.sink.emit(event);
        }
    }
    /// One `drift` event: a listed tool added, removed or redefined since the previous complete
    /// list, seen at `seen` in `scope`. Never carries a description or schema: names and hashes.
    pub(super) fn emit_drift(&mut self, scope: StreamId, seen: Instant, d: Drift) {
        let Some(tool) = self.tool_names.get(&d.name) else {
            return;
        };
        let event = Event {
            v: crate::event::EVENT_SCHEMA_VERSION,
            id: new_event_id(),
            ts: self.stamps.at(self.wall.at(seen)),
            class: EventClass::Drift,
            rec: Rec {
                rail: SENSOR_RAIL.into(),
                action: tool.action,
                registry_version: self.registry_version.clone(),
                fields: None,
                tool_def: d.tool_def,
                listed: None,
                hints: Vec::new(),
                change: Some(d.change),
                prev_tool_def: d.prev_tool_def,
            },
            dest: Dest {
                host: self.host.clone(),
                path_template: tool.path,
                method: SENSOR_METHOD.into(),
            },
            actor: self.actor(),
            on_behalf_of: self
                .cfg
                .on_behalf_of
                .as_deref()
                .and_then(|s| clean(s, MAX_INFO_LEN)),
            status: 200,
            dur_ms: 0.0,
            bytes: ByteSizes { req: 0, resp: 0 },
            session: self.session_for(scope),
            err: None,
        };
        self.stats.events += 1;
        self.sink.emit(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stamps near where the clocks were read are converted by the same difference, exactly;
    /// a stamp further away reads them anew, so a system clock that was set shows there.
    #[test]
    fn wall_clock_times_keep_their_distances_and_follow_a_clock_set_anew() {
        let mut clock = WallClock::default();
        let base = Instant::now();
        let ms = Duration::from_millis;
        let at_base = clock.at(base);
        let now = SystemTime::now();
        let off = now.duration_since(at_base).unwrap_or_else(|e| e.duration());
        assert!(off < Duration::from_secs(1), "{at_base:?} against {now:?}");
        let earlier = base.checked_sub(ms(60)).expect("an uptime over 60 ms");
        assert_eq!(clock.at(earlier), at_base - ms(60));
        assert_eq!(clock.at(base + ms(60)), at_base + ms(60));

        // The system clock set to 1970 at `base`: stamps within the span keep the difference
        // read before, the first one past it reads the clocks again.
        let set = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        clock.0 = Some((base, set));
        assert_eq!(clock.at(base + ms(10)), set + ms(10));
        assert_eq!(clock.at(earlier), set - ms(60));
        let later = base + WALL_ANCHOR_SPAN + ms(1);
        let fresh = clock.at(later);
        assert!(fresh > now, "{fresh:?} read anew");
        assert_ne!(clock.0.map(|a| a.0), Some(base));

        // A stamp further back than the span: the clocks are read anew, and its distance from
        // them is kept, not dropped (a dropped one reads as `after`; the second of slack is for
        // a loaded machine between the reads).
        let long_ago = Instant::now()
            .checked_sub(ms(500))
            .expect("an uptime over 500 ms");
        let before = SystemTime::now();
        let wall = clock.at(long_ago);
        let after = SystemTime::now();
        assert!(
            wall <= after - ms(500) && wall + ms(1_500) >= before,
            "{wall:?} is 500 ms before {before:?}–{after:?}"
        );
    }
}
