//! L3: [`validate_and_filter_event`], the one schema filter both the sensor (before sending) and
//! the ingest (on receipt) run (DESIGN §4, §5).
//!
//! Goes in: any JSON value claiming to be an event. Comes out: a *new* value built only from the
//! fields the envelope defines, each type-checked and bounded, with `rec.fields` re-run through
//! L2 (PII key denylist) and L4 (value scrubber) — but not through the capture allow-set, which
//! only the sensor knows (`--capture`, `--capture-text`). Every free-form metadata string
//! (`rec.action`, `dest.host`, `dest.pathTemplate`, `actor.id`, `onBehalfOf`, `session.*`) and
//! `err.code` go through L4 too: a hit rejects the whole event. The evidence fields (`rec.toolDef`,
//! `rec.prevToolDef`, `err.fp`: hex hashes; `rec.listed`: a boolean; `rec.hints`, `rec.change`:
//! enums; `session.catalog`: counts) are checked by shape alone, which leaves no room for text. The output always validates against
//! `schema/event.v2.schema.json`; a test proves it over generated events. A v1 envelope keeps its
//! `v` and loses `rec.fields`, with no other branching. It never copies an unknown field, never
//! logs a value, and never panics on hostile input.
//!
//! The sensor runs the same rules on its typed [`Event`] ([`filter_event`]), in place: building
//! a `Value` of every event only to filter and serialise it was most of the reporter's CPU. So
//! the rules are written once, in `check`, over a `View` that either form fills: from JSON, each
//! field's type checked as it is read; from an [`Event`], with the types Rust checked. A
//! property test still holds `filter_event` to `validate_and_filter_event` over generated
//! events, results and errors alike.

use serde_json::{Map, Value};

use super::privacy;
use super::{
    DriftChange, ErrKind, Event, Fields, Hint, SharedStr, SENSOR_GRADE, SENSOR_KIND, SENSOR_METHOD,
    SENSOR_RAIL,
};
use crate::token::is_b64url;

/// The envelope version this build produces (DESIGN §4).
pub const EVENT_SCHEMA_VERSION: u32 = 2;

/// Oldest envelope still accepted; its `rec.fields` are stripped.
pub const EVENT_SCHEMA_V1: u32 = 1;

/// The event schema, compiled in so the ingest and tests need no file at run time.
pub const EVENT_SCHEMA_JSON: &str = include_str!("../../schema/event.v2.schema.json");
/// The batch schema (refers to the event schema as `event.v2.schema.json`).
pub const BATCH_SCHEMA_JSON: &str = include_str!("../../schema/batch.v2.schema.json");

/// Longest free-form metadata string (tool name, host, actor id, session fields). Matches
/// `$defs/text` in the schema.
pub const MAX_TEXT_LEN: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FilterError {
    /// The event cannot be repaired: a required field is missing or of the wrong type. The
    /// message names the field, never its value.
    #[error("event is not valid: {0}")]
    Invalid(String),
}

fn invalid(field: &str, why: &str) -> FilterError {
    FilterError::Invalid(format!("{field}: {why}"))
}

/// Why a field could not be read: its name and the reason. It becomes a [`FilterError`] only
/// when [`check`] reaches that field, so an event with several faults is refused for the first
/// in the envelope's order, whichever form it came in.
#[derive(Debug, Clone, Copy)]
struct Bad(&'static str, &'static str);

impl From<Bad> for FilterError {
    fn from(Bad(field, why): Bad) -> Self {
        invalid(field, why)
    }
}

/// `rec.fields` as read: from JSON, or the sensor's own (both in key order).
#[derive(Clone, Copy)]
enum FieldsView<'a> {
    Json(&'a Map<String, Value>),
    Typed(&'a Fields),
}

/// A field as read: its value, or why there is none of the right type.
type Read<T> = Result<T, Bad>;

/// The envelope as L3 reads it, before any rule: each field the schema defines (and only
/// those: an unknown field is never read, so it can never be copied), read with its type
/// checked, or why it could not be.
#[derive(Clone, Copy)]
struct View<'a> {
    v: Read<u64>,
    id: Read<&'a str>,
    ts: Read<&'a str>,
    /// `None`: not a string.
    class: Read<Option<&'a str>>,
    rail: Read<&'a str>,
    action: Read<&'a str>,
    registry_version: Read<Option<&'a str>>,
    fields: Read<Option<FieldsView<'a>>>,
    tool_def: Read<Option<&'a str>>,
    listed: Read<Option<bool>>,
    /// `None`: absent or empty.
    hints: Read<Option<HintList>>,
    change: Read<Option<&'a str>>,
    prev_tool_def: Read<Option<&'a str>>,
    host: Read<&'a str>,
    path_template: Read<&'a str>,
    method: Read<&'a str>,
    actor_id: Read<&'a str>,
    actor_kind: Read<&'a str>,
    actor_grade: Read<&'a str>,
    on_behalf_of: Read<Option<&'a str>>,
    status: Read<u64>,
    /// `None`: not a number (as a non-finite `f64` becomes in JSON: `null`).
    dur_ms: Read<Option<f64>>,
    bytes_req: Read<u64>,
    bytes_resp: Read<u64>,
    session: Read<Option<SessionView<'a>>>,
    err: Read<Option<ErrView<'a>>>,
    /// The shared metadata strings of a typed event already known to pass the metadata rule
    /// ([`Cleared`]); none for JSON.
    cleared: Cleared,
}

#[derive(Clone, Copy)]
struct SessionView<'a> {
    id: Read<&'a str>,
    protocol: Read<Option<&'a str>>,
    client: Read<Option<&'a str>>,
    /// `session.catalog`: (tools, bytes).
    catalog: Read<Option<(Option<u64>, u64)>>,
}

#[derive(Clone, Copy)]
struct ErrView<'a> {
    /// `None`: not a string.
    kind: Read<Option<&'a str>>,
    code: Read<Option<i64>>,
    fp: Read<Option<&'a str>>,
}

/// `m[key]`, which the envelope requires.
fn member<'a>(m: Read<&'a Map<String, Value>>, key: &str, field: &'static str) -> Read<&'a Value> {
    m?.get(key).ok_or(Bad(field, "missing"))
}

/// `m[key]`, which may be absent or null.
fn optional<'a>(m: Read<&'a Map<String, Value>>, key: &str) -> Read<Option<&'a Value>> {
    Ok(m?.get(key).filter(|x| !x.is_null()))
}

fn object<'a>(x: Read<&'a Value>, field: &'static str) -> Read<&'a Map<String, Value>> {
    x?.as_object().ok_or(Bad(field, "not an object"))
}

fn string<'a>(x: Read<&'a Value>, field: &'static str) -> Read<&'a str> {
    x?.as_str().ok_or(Bad(field, "not a string"))
}

fn uint(x: Read<&Value>, field: &'static str) -> Read<u64> {
    x?.as_u64().ok_or(Bad(field, "not a non-negative integer"))
}

/// An optional member that, when present, must be a string.
fn optional_string<'a>(
    m: Read<&'a Map<String, Value>>,
    key: &str,
    field: &'static str,
) -> Read<Option<&'a str>> {
    optional(m, key)?.map(|x| string(Ok(x), field)).transpose()
}

impl<'a> View<'a> {
    /// The ingest's side: untrusted JSON, every type checked here.
    fn of_value(event: &'a Value) -> Self {
        let e = object(Ok(event), "event");
        let rec = object(member(e, "rec", "rec"), "rec");
        let dest = object(member(e, "dest", "dest"), "dest");
        let actor = object(member(e, "actor", "actor"), "actor");
        let bytes = object(member(e, "bytes", "bytes"), "bytes");
        let session = optional(e, "session").and_then(|s| {
            s.map(|s| {
                let s = object(Ok(s), "session")?;
                Ok(SessionView {
                    id: string(member(Ok(s), "id", "session.id"), "session.id"),
                    protocol: optional_string(Ok(s), "protocol", "protocol"),
                    client: optional_string(Ok(s), "client", "client"),
                    catalog: optional(Ok(s), "catalog").and_then(|c| {
                        c.map(|c| {
                            let c = object(Ok(c), "session.catalog")?;
                            let tools = optional(Ok(c), "tools")?
                                .map(|t| uint(Ok(t), "session.catalog.tools"))
                                .transpose()?;
                            let bytes = uint(
                                member(Ok(c), "bytes", "session.catalog.bytes"),
                                "session.catalog.bytes",
                            )?;
                            Ok((tools, bytes))
                        })
                        .transpose()
                    }),
                })
            })
            .transpose()
        });
        let err = optional(e, "err").and_then(|x| {
            x.map(|x| {
                let x = object(Ok(x), "err")?;
                Ok(ErrView {
                    kind: member(Ok(x), "kind", "err.kind").map(Value::as_str),
                    code: optional(Ok(x), "code").and_then(|c| {
                        c.map(|c| c.as_i64().ok_or(Bad("err.code", "not an integer")))
                            .transpose()
                    }),
                    fp: optional_string(Ok(x), "fp", "err.fp"),
                })
            })
            .transpose()
        });
        View {
            v: uint(member(e, "v", "v"), "v"),
            id: string(member(e, "id", "id"), "id"),
            ts: string(member(e, "ts", "ts"), "ts"),
            class: member(e, "class", "class").map(Value::as_str),
            rail: string(member(rec, "rail", "rec.rail"), "rec.rail"),
            action: string(member(rec, "action", "rec.action"), "rec.action"),
            registry_version: optional_string(rec, "registryVersion", "rec.registryVersion"),
            fields: optional(rec, "fields").and_then(|f| {
                f.map(|f| object(Ok(f), "rec.fields").map(FieldsView::Json))
                    .transpose()
            }),
            tool_def: optional_string(rec, "toolDef", "rec.toolDef"),
            listed: optional(rec, "listed").and_then(|l| {
                l.map(|l| l.as_bool().ok_or(Bad("rec.listed", "not a boolean")))
                    .transpose()
            }),
            hints: optional(rec, "hints").and_then(|h| {
                let Some(h) = h else { return Ok(None) };
                let a = h.as_array().ok_or(Bad("rec.hints", "not an array"))?;
                let mut list = HintList::default();
                for x in a {
                    let i = x
                        .as_str()
                        .and_then(|n| HINTS.iter().position(|k| *k == n))
                        .ok_or(Bad("rec.hints", "unknown or repeated hint"))?;
                    list.push(i)?;
                }
                Ok(Some(list).filter(|l| l.len > 0))
            }),
            change: optional_string(rec, "change", "rec.change"),
            prev_tool_def: optional_string(rec, "prevToolDef", "rec.prevToolDef"),
            host: string(member(dest, "host", "dest.host"), "dest.host"),
            path_template: string(
                member(dest, "pathTemplate", "dest.pathTemplate"),
                "dest.pathTemplate",
            ),
            method: string(member(dest, "method", "dest.method"), "dest.method"),
            actor_id: string(member(actor, "id", "actor.id"), "actor.id"),
            actor_kind: string(member(actor, "kind", "actor.kind"), "actor.kind"),
            actor_grade: string(member(actor, "grade", "actor.grade"), "actor.grade"),
            on_behalf_of: optional_string(e, "onBehalfOf", "onBehalfOf"),
            status: uint(member(e, "status", "status"), "status"),
            dur_ms: member(e, "dur_ms", "dur_ms").map(Value::as_f64),
            bytes_req: uint(member(bytes, "req", "bytes.req"), "bytes.req"),
            bytes_resp: uint(member(bytes, "resp", "bytes.resp"), "bytes.resp"),
            session,
            err,
            cleared: Cleared::NONE,
        }
    }

    /// The sensor's side: its own event, whose types are given.
    fn of_event(e: &'a Event) -> Self {
        View {
            v: Ok(u64::from(e.v)),
            id: Ok(&e.id),
            ts: Ok(&e.ts),
            class: Ok(Some(e.class.name())),
            rail: Ok(&e.rec.rail),
            action: Ok(&e.rec.action),
            registry_version: Ok(e.rec.registry_version.as_deref()),
            fields: Ok(e.rec.fields.as_ref().map(FieldsView::Typed)),
            tool_def: Ok(e.rec.tool_def.as_deref()),
            listed: Ok(e.rec.listed),
            hints: e
                .rec
                .hints
                .iter()
                .try_fold(HintList::default(), |mut l, h| {
                    l.push(hint_index(*h))?;
                    Ok(l)
                })
                .map(|l| Some(l).filter(|l| l.len > 0)),
            change: Ok(e.rec.change.map(|c| match c {
                DriftChange::Added => "added",
                DriftChange::Removed => "removed",
                DriftChange::Changed => "changed",
            })),
            prev_tool_def: Ok(e.rec.prev_tool_def.as_deref()),
            host: Ok(&e.dest.host),
            path_template: Ok(&e.dest.path_template),
            method: Ok(&e.dest.method),
            actor_id: Ok(&e.actor.id),
            actor_kind: Ok(&e.actor.kind),
            actor_grade: Ok(&e.actor.grade),
            on_behalf_of: Ok(e.on_behalf_of.as_deref()),
            status: Ok(u64::from(e.status)),
            dur_ms: Ok(Some(e.dur_ms)),
            bytes_req: Ok(e.bytes.req),
            bytes_resp: Ok(e.bytes.resp),
            session: Ok(e.session.as_ref().map(|s| SessionView {
                id: Ok(&s.id),
                protocol: Ok(s.protocol.as_deref()),
                client: Ok(s.client.as_deref()),
                catalog: Ok(s.catalog.map(|c| (c.tools, c.bytes))),
            })),
            err: Ok(e.err.as_ref().map(|x| ErrView {
                kind: Ok(Some(match x.kind {
                    ErrKind::Jsonrpc => "jsonrpc",
                    ErrKind::Tool => "tool",
                    ErrKind::Timeout => "timeout",
                    ErrKind::Cancelled => "cancelled",
                    ErrKind::Transport => "transport",
                })),
                code: Ok(x.code),
                fp: Ok(x.fp.as_deref()),
            })),
            cleared: Cleared::of(e),
        }
    }
}

/// The rules of L3, once for both forms, in the envelope's order (the first fault found is the
/// one reported). True when `rec.fields` is to be kept (a v2 envelope that has them); what of
/// them passes is the caller's to take ([`privacy::field_passes`]), as it holds them.
fn check(e: &View<'_>) -> Result<bool, FilterError> {
    let v = e.v?;
    if v != u64::from(EVENT_SCHEMA_VERSION) && v != u64::from(EVENT_SCHEMA_V1) {
        return Err(invalid("v", "unsupported envelope version"));
    }
    check_token(e.id?, "id", 64, 8, is_b64url)?;
    check_timestamp(e.ts?)?;
    let class = e.class?;
    if !matches!(class, Some("action" | "error" | "drift")) {
        return Err(invalid("class", "not action, error or drift"));
    }

    RAIL.check(e.rail?)?;
    let action = e.action?;
    if !e.cleared.has(Cleared::ACTION) {
        check_metadata(action, "rec.action", true)?;
    }
    if let Some(r) = e.registry_version? {
        check_token(r, "rec.registryVersion", 64, 1, hex_char)?;
    }
    let keep_fields = v == u64::from(EVENT_SCHEMA_VERSION) && e.fields?.is_some();
    if let Some(d) = e.tool_def? {
        if !e.cleared.has(Cleared::TOOL_DEF) {
            check_hash(d, "rec.toolDef")?;
        }
    }
    e.listed?;
    e.hints?;
    match (e.change?, class) {
        (Some("added" | "removed" | "changed"), Some("drift"))
        | (None, Some("action" | "error")) => {}
        _ => {
            return Err(invalid(
                "rec.change",
                "required for drift, and only for drift",
            ))
        }
    }
    if let Some(d) = e.prev_tool_def? {
        check_hash(d, "rec.prevToolDef")?;
    }

    let path = e.path_template?;
    if !e.cleared.has(Cleared::PATH) {
        check_metadata(path, "dest.pathTemplate", true)?;
    }
    if !path.starts_with('/') {
        return Err(invalid("dest.pathTemplate", "must start with /"));
    }
    METHOD.check(e.method?)?;
    if !e.cleared.has(Cleared::HOST) {
        check_metadata(e.host?, "dest.host", true)?;
    }

    if !e.cleared.has(Cleared::ACTOR) {
        check_actor_id(e.actor_id?)?;
    }
    KIND.check(e.actor_kind?)?;
    GRADE.check(e.actor_grade?)?;
    // onBehalfOf names a customer by an opaque id; one that L4 removes fails the event.
    if let Some(o) = e.on_behalf_of? {
        check_metadata(o, "onBehalfOf", true)?;
    }

    if !(100..=599).contains(&e.status?) {
        return Err(invalid("status", "not an HTTP-ish status"));
    }
    if !e.dur_ms?.is_some_and(|d| d.is_finite() && d >= 0.0) {
        return Err(invalid("dur_ms", "not a non-negative number"));
    }
    // Any non-negative integer will do.
    e.bytes_req?;
    e.bytes_resp?;

    if let Some(s) = e.session? {
        if !e.cleared.has(Cleared::SESSION_ID) {
            check_metadata(s.id?, "session.id", true)?;
        }
        for (key, x, bit) in [
            ("protocol", s.protocol, Cleared::PROTOCOL),
            ("client", s.client, Cleared::CLIENT),
        ] {
            if let Some(text) = x? {
                if !e.cleared.has(bit) {
                    check_metadata(text, key, false)?;
                }
            }
        }
        if let Some((tools, bytes)) = s.catalog? {
            for n in tools.into_iter().chain([bytes]) {
                if privacy::number_is_sensitive(&serde_json::Number::from(n)) {
                    return Err(invalid(
                        "session.catalog",
                        "holds a value the L4 scrubber removes",
                    ));
                }
            }
        }
    }
    if let Some(x) = e.err? {
        let known = ["jsonrpc", "tool", "timeout", "cancelled", "transport"];
        if !x.kind?.is_some_and(|k| known.contains(&k)) {
            return Err(invalid("err.kind", "unknown kind"));
        }
        if let Some(c) = x.code? {
            check_code(c)?;
        }
        if let Some(fp) = x.fp? {
            check_hash(fp, "err.fp")?;
        }
    }
    Ok(keep_fields)
}

/// The L3 filter. See the module docs.
pub fn validate_and_filter_event(event: &Value) -> Result<Value, FilterError> {
    let view = View::of_value(event);
    let keep_fields = check(&view)?;
    rebuild(&view, keep_fields, event)
}

/// The new value of an event [`check`] passed: each member as it was read into `e` (so every
/// `?` here finds a value), `rec.fields` down to what passes, nothing else.
fn rebuild(e: &View<'_>, keep_fields: bool, event: &Value) -> Result<Value, FilterError> {
    fn text(s: &str) -> Value {
        Value::String(s.to_owned())
    }
    let mut rec = Map::new();
    rec.insert("rail".into(), text(e.rail?));
    rec.insert("action".into(), text(e.action?));
    rec.insert(
        "registryVersion".into(),
        e.registry_version?.map_or(Value::Null, text),
    );
    // Not read at all unless kept: a v1 envelope's `rec.fields` may be anything.
    if let Some(fields) = if keep_fields { e.fields? } else { None } {
        fn admitted<'b>(entries: impl Iterator<Item = (&'b str, &'b Value)>) -> Map<String, Value> {
            entries
                .filter(|(k, x)| privacy::field_passes(k, x))
                .take(privacy::MAX_FIELDS)
                .map(|(k, x)| (k.to_owned(), x.clone()))
                .collect()
        }
        let kept = match fields {
            FieldsView::Json(m) => admitted(m.iter().map(|(k, x)| (k.as_str(), x))),
            FieldsView::Typed(f) => admitted(f.iter()),
        };
        if !kept.is_empty() {
            rec.insert("fields".into(), Value::Object(kept));
        }
    }
    if let Some(d) = e.tool_def? {
        rec.insert("toolDef".into(), text(d));
    }
    if let Some(l) = e.listed? {
        rec.insert("listed".into(), Value::Bool(l));
    }
    if let Some(h) = e.hints? {
        let names = h.at[..usize::from(h.len)]
            .iter()
            .map(|i| text(HINTS[usize::from(*i)]));
        rec.insert("hints".into(), names.collect());
    }
    if let Some(c) = e.change? {
        rec.insert("change".into(), text(c));
    }
    if let Some(d) = e.prev_tool_def? {
        rec.insert("prevToolDef".into(), text(d));
    }
    let mut dest = Map::new();
    dest.insert("host".into(), text(e.host?));
    dest.insert("pathTemplate".into(), text(e.path_template?));
    dest.insert("method".into(), text(e.method?));
    let mut actor = Map::new();
    actor.insert("id".into(), text(e.actor_id?));
    actor.insert("kind".into(), text(e.actor_kind?));
    actor.insert("grade".into(), text(e.actor_grade?));
    let mut bytes = Map::new();
    bytes.insert("req".into(), Value::from(e.bytes_req?));
    bytes.insert("resp".into(), Value::from(e.bytes_resp?));

    let mut out = Map::new();
    out.insert("v".into(), Value::from(e.v?));
    out.insert("id".into(), text(e.id?));
    out.insert("ts".into(), text(e.ts?));
    out.insert("class".into(), e.class?.map_or(Value::Null, text));
    out.insert("rec".into(), Value::Object(rec));
    out.insert("dest".into(), Value::Object(dest));
    out.insert("actor".into(), Value::Object(actor));
    if let Some(o) = e.on_behalf_of? {
        out.insert("onBehalfOf".into(), text(o));
    }
    out.insert("status".into(), Value::from(e.status?));
    // As it came: an integer stays an integer.
    out.insert("dur_ms".into(), event["dur_ms"].clone());
    out.insert("bytes".into(), Value::Object(bytes));
    if let Some(s) = e.session? {
        let mut session = Map::new();
        session.insert("id".into(), text(s.id?));
        for (key, x) in [("protocol", s.protocol?), ("client", s.client?)] {
            if let Some(x) = x {
                session.insert(key.into(), text(x));
            }
        }
        if let Some((tools, bytes)) = s.catalog? {
            let mut c = Map::new();
            if let Some(t) = tools {
                c.insert("tools".into(), Value::from(t));
            }
            c.insert("bytes".into(), Value::from(bytes));
            session.insert("catalog".into(), Value::Object(c));
        }
        out.insert("session".into(), Value::Object(session));
    }
    if let Some(x) = e.err? {
        let mut err = Map::new();
        err.insert("kind".into(), x.kind?.map_or(Value::Null, text));
        if let Some(c) = x.code? {
            err.insert("code".into(), Value::from(c));
        }
        if let Some(fp) = x.fp? {
            err.insert("fp".into(), text(fp));
        }
        out.insert("err".into(), Value::Object(err));
    }
    Ok(Value::Object(out))
}

/// The sensor's side: the built [`Event`] as it will be sent, after L3.
///
/// [`check`] on the struct, then what L3 removes removed in place and everything else as it
/// was, not copied.
pub fn filter_event(mut event: Event) -> Result<Event, FilterError> {
    filter_event_in_place(&mut event)?;
    Ok(event)
}

/// [`filter_event`] on an event where it lies, so a boxed event is not moved out and back (the
/// reporter runs this on every event). On an error the event is left as it was given: the
/// caller must not send it.
pub fn filter_event_in_place(event: &mut Event) -> Result<(), FilterError> {
    let view = View::of_event(event);
    let known = view.cleared;
    let keep_fields = check(&view)?;
    remember_cleared(event, known);
    event.rec.fields = match event.rec.fields.take() {
        Some(f) if keep_fields => Some(admit_fields(f)).filter(|f| !f.is_empty()),
        _ => None,
    };
    Ok(())
}

/// Which shared strings of a typed event this thread has already seen pass their field's rule:
/// the very same allocation, not merely equal text. A session's events carry the same few (its
/// `dest.host`, `actor.id`, `session.id`, `.protocol` and `.client`; per tool called, its
/// `rec.action`, `dest.pathTemplate` and `rec.toolDef`), and the rule's verdict on a string that
/// cannot change is the same every time, so each is checked once per thread, not once per event
/// (five recalled L4 scans per event, about 750 instructions; the tool's three, with a lookup by
/// field, about 550 more: bench/README.md). Only passes are remembered, so which fault of an
/// event is reported first does not change. A string is known in the field it passed in, under
/// that field's rule (`dest.pathTemplate`'s leading `/` is checked every time): a tool name that
/// passed as `rec.action` is checked again as a `rec.toolDef`, where it must be a hash.
#[derive(Clone, Copy)]
struct Cleared(u8);

impl Cleared {
    const NONE: Cleared = Cleared(0);
    const HOST: u8 = 1;
    const ACTOR: u8 = 2;
    const SESSION_ID: u8 = 4;
    const PROTOCOL: u8 = 8;
    const CLIENT: u8 = 16;
    const ACTION: u8 = 32;
    const PATH: u8 = 64;
    const TOOL_DEF: u8 = 128;

    fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }

    /// Those of `e`'s shared strings that passed in their field before on this thread.
    fn of(e: &Event) -> Cleared {
        CLEARED.with(|c| {
            let held = &c.borrow().held;
            let mut bits = 0;
            for (i, s) in shared_strings(e).into_iter().enumerate() {
                let known = s.is_some_and(|s| held[i].iter().flatten().any(|h| h.same(s)));
                bits |= u8::from(known) << i;
            }
            Cleared(bits)
        })
    }
}

/// Fields whose shared strings are remembered: one per [`Cleared`] bit.
const SHARED_FIELDS: usize = 8;

/// The shared strings `e` carries, in the order of their [`Cleared`] bits.
fn shared_strings(e: &Event) -> [Option<&SharedStr>; SHARED_FIELDS] {
    let s = e.session.as_ref();
    [
        Some(&e.dest.host),
        Some(&e.actor.id),
        s.map(|s| &s.id),
        s.and_then(|s| s.protocol.as_ref()),
        s.and_then(|s| s.client.as_ref()),
        Some(&e.rec.action),
        Some(&e.dest.path_template),
        e.rec.tool_def.as_ref(),
    ]
}

/// Passed strings a thread keeps per field, the oldest replaced first: the few tools a session
/// calls in turn, or the sessions an HTTP proxy serves at once.
const CLEARED_WAYS: usize = 4;

/// Per field, the strings that passed in it on this thread, and the way to replace next. Each
/// is held, so no other string can take its address while it is here.
struct ClearedMemo {
    held: [[Option<SharedStr>; CLEARED_WAYS]; SHARED_FIELDS],
    next: [usize; SHARED_FIELDS],
}

thread_local! {
    static CLEARED: std::cell::RefCell<ClearedMemo> = const {
        std::cell::RefCell::new(ClearedMemo {
            held: [const { [const { None }; CLEARED_WAYS] }; SHARED_FIELDS],
            next: [0; SHARED_FIELDS],
        })
    };
}

/// After `e` passed [`check`], remembers its shared strings not `known` yet. Only non-empty
/// ones: an empty string passes only where the field may be empty.
fn remember_cleared(e: &Event, known: Cleared) {
    fn new(known: Cleared, i: usize, s: Option<&SharedStr>) -> Option<&SharedStr> {
        s.filter(|s| !known.has(1 << i) && !s.is_empty())
    }
    let strings = shared_strings(e);
    if strings
        .into_iter()
        .enumerate()
        .all(|(i, s)| new(known, i, s).is_none())
    {
        return;
    }
    CLEARED.with(|c| {
        let memo = &mut *c.borrow_mut();
        for (i, s) in strings.into_iter().enumerate() {
            if let Some(s) = new(known, i, s) {
                let way = memo.next[i];
                memo.held[i][way] = Some(s.clone());
                memo.next[i] = (way + 1) % CLEARED_WAYS;
            }
        }
    });
}

/// A short single-line string (`$defs/text`).
fn check_text(s: &str, field: &str, non_empty: bool) -> Result<(), FilterError> {
    if s.len() > MAX_TEXT_LEN {
        return Err(invalid(field, "too long"));
    }
    if non_empty && s.is_empty() {
        return Err(invalid(field, "empty"));
    }
    // Bytes, not chars: an ASCII control character is one byte, and no byte of a multi-byte
    // character is below 0x80. No early exit: the text is short, and checked many bytes at once.
    if s.bytes().fold(false, |any, b| any | b.is_ascii_control()) {
        return Err(invalid(field, "control characters"));
    }
    Ok(())
}

/// L4 on a metadata string: one that holds a value the scrubber removes (an e-mail address, a
/// phone number, …) fails the whole event. Metadata is never trimmed field by field: the sensor
/// replaces a tool name or host with [`REDACTED`] and omits any other such string while it builds
/// the event, so at the ingest a hit means a sensor that does not, and the event is rejected and
/// counted.
fn check_clear(s: &str, field: &str) -> Result<(), FilterError> {
    if privacy::contains_sensitive_recalled(s) {
        return Err(invalid(field, "holds a value the L4 scrubber removes"));
    }
    Ok(())
}

/// [`check_text`] and [`check_clear`]: the rule for every free-form metadata string.
fn check_metadata(s: &str, field: &str, non_empty: bool) -> Result<(), FilterError> {
    check_text(s, field, non_empty)?;
    check_clear(s, field)
}

/// A hash (`toolDef`, `prevToolDef`, `err.fp`): lower-case hex, and nothing L4 removes (hex can
/// spell a card number; the sensor never makes such a hash, see
/// `observe::fingerprint::clear_digest`).
fn check_hash(s: &str, field: &str) -> Result<(), FilterError> {
    check_token(s, field, 64, 1, hex_char)?;
    check_clear(s, field)
}

/// An `err.code` whose decimal text holds a card number fails the event, as a metadata string
/// would.
fn check_code(c: i64) -> Result<(), FilterError> {
    if privacy::number_is_sensitive(&serde_json::Number::from(c)) {
        return Err(invalid("err.code", "holds a value the L4 scrubber removes"));
    }
    Ok(())
}

/// The rule for `actor.id`: non-empty text of at most [`MAX_TEXT_LEN`] bytes, no control
/// characters, nothing L4 removes. Public because configuration checks `--actor` with it at
/// start-up: an actor this rejects would make every event fail the filter.
pub fn check_actor_id(id: &str) -> Result<(), FilterError> {
    check_metadata(id, "actor.id", true)
}

/// What a sensor puts in a tool name (`rec.action`, and so `dest.pathTemplate`) or `dest.host`
/// that holds a value L4 removes: the tool is still counted, under a name no MCP tool can have
/// (tool names are letters, digits, `_`, `-` and `.`), so the placeholder cannot be mistaken
/// for a real tool.
pub const REDACTED: &str = "<redacted>";

/// A field of a few characters of one class, and the value the sensor itself gives it.
struct Token {
    field: &'static str,
    max: usize,
    ok: fn(u8) -> bool,
    /// What every event the sensor makes holds here: it passes by a comparison of a few bytes
    /// instead of the scan, which cost about 55 instructions per field per event.
    /// `tokens_the_sensor_sends_pass_their_rules` holds each to its rule.
    usual: &'static str,
}

impl Token {
    const fn new(field: &'static str, max: usize, ok: fn(u8) -> bool, usual: &'static str) -> Self {
        Token {
            field,
            max,
            ok,
            usual,
        }
    }

    #[inline(always)]
    fn check(&self, s: &str) -> Result<(), FilterError> {
        if super::same_text(s, self.usual) {
            return Ok(());
        }
        check_token(s, self.field, self.max, 1, self.ok)
    }
}

const RAIL: Token = Token::new("rec.rail", 32, rail_char, SENSOR_RAIL);
const METHOD: Token = Token::new("dest.method", 16, method_char, SENSOR_METHOD);
const KIND: Token = Token::new("actor.kind", 32, word_char, SENSOR_KIND);
const GRADE: Token = Token::new("actor.grade", 32, word_char, SENSOR_GRADE);

/// A string of `min..=max` bytes all satisfying `ok`.
fn check_token(
    s: &str,
    field: &str,
    max: usize,
    min: usize,
    ok: impl Fn(u8) -> bool,
) -> Result<(), FilterError> {
    // Every `ok` accepts ASCII bytes only, and no byte of a multi-byte character is below 0x80:
    // no need to decode characters. A fold with no early exit (the length is checked first, so
    // it is short), which the compiler turns into a check of many bytes at once.
    if s.len() < min || s.len() > max || !s.bytes().fold(true, |all, b| all & ok(b)) {
        return Err(invalid(field, "bad format"));
    }
    Ok(())
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, a real instant (the schema's `ts` pattern).
fn check_timestamp(s: &str) -> Result<(), FilterError> {
    let b = s.as_bytes();
    // The sensor's own form, checked whole at once: every event it sends has it.
    if plain_utc_ms_instant(b) {
        return Ok(());
    }
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|x| x.iter().all(u8::is_ascii_digit));
    let shape = s.len() <= 40
        && digits(0..4)
        && b.get(4) == Some(&b'-')
        && digits(5..7)
        && b.get(7) == Some(&b'-')
        && digits(8..10)
        && b.get(10) == Some(&b'T')
        && digits(11..13)
        && b.get(13) == Some(&b':')
        && digits(14..16)
        && b.get(16) == Some(&b':')
        && digits(17..19);
    if !shape {
        return Err(invalid("ts", "not RFC 3339"));
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 || n > 9 {
            return Err(invalid("ts", "not RFC 3339"));
        }
        rest = &frac[n..];
    }
    let zone_ok = rest == "Z"
        || (rest.len() == 6
            && (rest.starts_with('+') || rest.starts_with('-'))
            && rest.as_bytes()[3] == b':'
            && rest[1..3].bytes().all(|c| c.is_ascii_digit())
            && rest[4..6].bytes().all(|c| c.is_ascii_digit()));
    if !zone_ok {
        return Err(invalid("ts", "not RFC 3339"));
    }
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map_err(|_| invalid("ts", "not a valid instant"))?;
    Ok(())
}

/// True when `b` is `DDDD-DD-DDTDD:DD:DD.DDDZ` (`D` a digit): the shape of the form the sensor
/// writes, which [`plain_utc_ms_instant`] then reads. One pass over a fixed pattern, where the
/// general shape check reads the text field by field.
fn sensor_form(b: &[u8]) -> bool {
    let Ok(b) = <&[u8; 24]>::try_from(b) else {
        return false;
    };
    b.iter().zip(SENSOR_FORM).fold(true, |ok, (&c, &p)| {
        ok & if p == b'D' {
            c.is_ascii_digit()
        } else {
            c == p
        }
    })
}

/// [`sensor_form`]'s pattern, byte for byte.
const SENSOR_FORM: &[u8; 24] = b"DDDD-DD-DDTDD:DD:DD.DDDZ";

/// True when `b` is the form the sensor writes (`YYYY-MM-DDTHH:MM:SS.sssZ`, [`sensor_form`])
/// and a real date and time without a leap second: then the `time` crate's RFC 3339 parser
/// accepts it too (a proptest holds the two together) and need not run on every event. False
/// decides nothing: the general check and the parser do.
fn plain_utc_ms_instant(b: &[u8]) -> bool {
    if !sensor_form(b) {
        return false;
    }
    let num = |r: std::ops::Range<usize>| {
        b[r].iter()
            .fold(0u32, |n, d| n * 10 + u32::from(d.wrapping_sub(b'0')))
    };
    let (year, month, day) = (num(0..4), num(5..7), num(8..10));
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days_in_month).contains(&day)
        && num(11..13) <= 23
        && num(14..16) <= 59
        && num(17..19) <= 59
}

/// What of `rec.fields` passes, in place: each field as it came, the first
/// [`privacy::MAX_FIELDS`] that pass in the map's order, without rebuilding the map.
fn admit_fields(mut m: Fields) -> Fields {
    let mut kept = 0usize;
    m.retain(|k, val| {
        let keep = kept < privacy::MAX_FIELDS && privacy::field_passes(k, val);
        kept += usize::from(keep);
        keep
    });
    m
}

/// `rec.hints` values, in the order the sensor writes them.
const HINTS: [&str; 4] = ["readOnly", "destructive", "idempotent", "openWorld"];

fn hint_index(h: Hint) -> usize {
    match h {
        Hint::ReadOnly => 0,
        Hint::Destructive => 1,
        Hint::Idempotent => 2,
        Hint::OpenWorld => 3,
    }
}

/// `rec.hints` as read: indices into [`HINTS`], in the order given, each at most once.
#[derive(Clone, Copy, Default)]
struct HintList {
    at: [u8; 4],
    len: u8,
}

impl HintList {
    fn push(&mut self, i: usize) -> Result<(), Bad> {
        let repeated = self.at[..usize::from(self.len)].contains(&(i as u8));
        if repeated || usize::from(self.len) >= HINTS.len() || i >= HINTS.len() {
            return Err(Bad("rec.hints", "unknown or repeated hint"));
        }
        self.at[usize::from(self.len)] = i as u8;
        self.len += 1;
        Ok(())
    }
}

// The id's alphabet, the schema's `^[A-Za-z0-9_-]{8,64}$`, is base64url: `is_b64url`.

fn rail_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
}

fn hex_char(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

fn method_char(b: u8) -> bool {
    b.is_ascii_uppercase()
}

fn word_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b == b'_' || b == b'-'
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// What [`Token::check`] passes without the scan passes the scan, and the scan still
    /// refuses the rest.
    #[test]
    fn tokens_the_sensor_sends_pass_their_rules() {
        for t in [RAIL, METHOD, KIND, GRADE] {
            assert!(
                check_token(t.usual, t.field, t.max, 1, t.ok).is_ok(),
                "{}",
                t.field
            );
            assert!(t.check(t.usual).is_ok(), "{}", t.field);
            for bad in ["", "a b", "Ünï", "x\"", &"a".repeat(t.max + 1)] {
                assert!(t.check(bad).is_err(), "{} took {bad:?}", t.field);
            }
        }
    }

    pub(crate) fn sample() -> Value {
        json!({
            "v": 2,
            "id": "0123456789abcdef0123456789abcdef",
            "ts": "2026-11-29T19:13:27.123Z",
            "class": "action",
            "rec": {"rail": "mcp", "action": "issue_refund", "registryVersion": "a1b2c3d4e5f60718",
                    "fields": {"amount_cents": 4900, "currency": "EUR"}},
            "dest": {"host": "mcp://payments", "pathTemplate": "/issue_refund", "method": "POST"},
            "actor": {"id": "mcp:k1", "kind": "agent", "grade": "attested"},
            "status": 200,
            "dur_ms": 1.25,
            "bytes": {"req": 120, "resp": 80},
            "session": {"id": "abcd", "protocol": "2025-06-18", "client": "claude"}
        })
    }

    #[test]
    fn plain_timestamp_fast_path_agrees_on_every_month_end() {
        for y in [
            0u32, 1, 4, 100, 400, 1900, 1970, 2000, 2024, 2026, 2100, 9999,
        ] {
            for mo in 1..=12u32 {
                for d in 27..=32u32 {
                    for (h, mi, sec) in [(0u32, 0u32, 0u32), (23, 59, 59), (23, 59, 60), (24, 0, 0)]
                    {
                        let ts = format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{sec:02}.999Z");
                        let parsed = time::OffsetDateTime::parse(
                            &ts,
                            &time::format_description::well_known::Rfc3339,
                        )
                        .is_ok();
                        assert_eq!(check_timestamp(&ts).is_ok(), parsed, "{ts}");
                        if plain_utc_ms_instant(ts.as_bytes()) {
                            assert!(parsed, "{ts}");
                        }
                    }
                }
            }
        }
    }

    /// The sensor's form is recognised by its pattern alone; a byte off anywhere sends the text
    /// to the general check, which still decides it.
    #[test]
    fn sensor_form_is_the_exact_pattern() {
        let good = "2026-11-29T19:13:27.123Z";
        assert!(sensor_form(good.as_bytes()));
        assert!(check_timestamp(good).is_ok());
        for i in 0..good.len() {
            let mut b = good.as_bytes().to_vec();
            b[i] = if b[i].is_ascii_digit() { b'x' } else { b'0' };
            assert!(!sensor_form(&b), "{i}");
            let bad = String::from_utf8(b).expect("ASCII");
            assert!(check_timestamp(&bad).is_err(), "{bad}");
        }
        for other in [
            "2026-11-29T19:13:27Z",
            "2026-11-29T19:13:27.1234Z",
            "2026-11-29T19:13:27.123+01:00",
        ] {
            assert!(!sensor_form(other.as_bytes()), "{other}");
            assert!(check_timestamp(other).is_ok(), "{other}");
        }
    }

    /// A session's metadata repeats, and the recalled L4 verdicts must not let a canary through
    /// on a clean string's: each canary host is rejected every time, between clean events, and
    /// after more distinct strings than the recall holds have pushed it out.
    #[test]
    fn canary_metadata_is_rejected_every_time_despite_the_recall() {
        let canaries = [
            "mcp://jane.doe@example.com",
            "mcp://4111-1111-1111-1111",
            "mcp://eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlX2hlcmU",
            "mcp://sk_live_51Hq0CanaryCanaryCanary",
        ];
        let with_host = |h: &str| {
            let mut e = sample();
            e["dest"]["host"] = json!(h);
            e
        };
        for round in 0..3 {
            for c in canaries {
                assert!(validate_and_filter_event(&with_host("mcp://payments")).is_ok());
                assert!(
                    validate_and_filter_event(&with_host(c)).is_err(),
                    "round {round}: {c}"
                );
            }
            for i in 0..(2 * privacy::RECALL_SLOTS) {
                assert!(validate_and_filter_event(&with_host(&format!("mcp://s{i}"))).is_ok());
            }
        }
    }

    /// A session's shared strings are checked once per thread: a passing one is known by its
    /// allocation afterwards, a failing one never is. A canary in any of the eight shared
    /// fields is refused every time, whether its allocation is reused or new, between clean
    /// events and after more clean strings than the thread keeps; a string pushed out is
    /// checked again, and still passes.
    #[test]
    fn shared_metadata_is_cleared_once_and_a_canary_never() {
        let mut clean: Event = serde_json::from_value(sample()).expect("event");
        clean.rec.tool_def = Some(SharedStr::from("0123456789abcdef"));
        assert_eq!(Cleared::of(&clean).0, 0);
        assert!(filter_event(clean.clone()).is_ok());
        let all = Cleared::HOST
            | Cleared::ACTOR
            | Cleared::SESSION_ID
            | Cleared::PROTOCOL
            | Cleared::CLIENT
            | Cleared::ACTION
            | Cleared::PATH
            | Cleared::TOOL_DEF;
        assert_eq!(Cleared::of(&clean).0, all);
        // Equal text in another allocation is not known: it is checked (and passes).
        let copy: Event = serde_json::from_value(sample()).expect("event");
        assert_eq!(Cleared::of(&copy).0, 0);

        let canaries = [
            "jane.doe@example.com",
            "4111-1111-1111-1111",
            // Hex too: a hash that spells a card number.
            "4111111111111111",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlX2hlcmU",
            "sk_live_51Hq0CanaryCanaryCanary",
        ];
        let planted = |field: usize, c: &str| {
            let mut e = clean.clone();
            let s = e.session.as_mut().expect("session");
            // A path must start with `/`, or it fails on that alone.
            let c = if field == 6 {
                SharedStr::from(format!("/{c}"))
            } else {
                SharedStr::from(c)
            };
            match field {
                0 => e.dest.host = c,
                1 => e.actor.id = c,
                2 => s.id = c,
                3 => s.protocol = Some(c),
                4 => s.client = Some(c),
                5 => e.rec.action = c,
                6 => e.dest.path_template = c,
                _ => e.rec.tool_def = Some(c),
            }
            e
        };
        for round in 0..3 {
            for field in 0..8 {
                for c in canaries {
                    let bad = planted(field, c);
                    for _ in 0..2 {
                        assert!(filter_event(clean.clone()).is_ok());
                        assert!(
                            filter_event(bad.clone()).is_err(),
                            "round {round}: {field} {c}"
                        );
                    }
                    assert_eq!(Cleared::of(&bad).0, all & !(1 << field), "{field} {c}");
                }
            }
            // Other sessions' strings (every one a new allocation), more than the thread keeps,
            // push this session's out.
            for _ in 0..CLEARED_WAYS {
                let mut other: Event = serde_json::from_value(sample()).expect("event");
                other.rec.tool_def = Some(SharedStr::from("0123456789abcdef"));
                assert!(filter_event(other).is_ok());
            }
            assert_eq!(Cleared::of(&clean).0, 0, "round {round}");
            assert!(filter_event(clean.clone()).is_ok());
        }
    }

    /// A string is known only in the field it passed in: a tool name passes as `rec.action`,
    /// and the very same allocation as a `toolDef` is checked as a hash, and refused (not hex);
    /// a hash that passed as a `toolDef` is checked again in a metadata field, and is then
    /// known in both.
    #[test]
    fn a_string_is_known_only_in_the_field_it_passed_in() {
        let mut e: Event = serde_json::from_value(sample()).expect("event");
        assert!(filter_event(e.clone()).is_ok());
        assert!(Cleared::of(&e).has(Cleared::ACTION));
        e.rec.tool_def = Some(e.rec.action.clone());
        for _ in 0..2 {
            assert_eq!(
                filter_event(e.clone()).map(drop),
                Err(invalid("rec.toolDef", "bad format"))
            );
            assert!(!Cleared::of(&e).has(Cleared::TOOL_DEF));
        }
        let hash = SharedStr::from("00c0ffee00c0ffee");
        e.rec.tool_def = Some(hash.clone());
        assert!(filter_event(e.clone()).is_ok());
        e.session.as_mut().expect("session").client = Some(hash);
        let known = Cleared::of(&e);
        assert!(known.has(Cleared::TOOL_DEF) && !known.has(Cleared::CLIENT));
        assert!(filter_event(e.clone()).is_ok());
        assert!(Cleared::of(&e).has(Cleared::CLIENT));
    }

    #[test]
    fn valid_event_passes_unchanged() {
        let e = sample();
        assert_eq!(validate_and_filter_event(&e), Ok(e));
    }

    /// Found by the `ingest_batch` fuzz target: a number whose text does not round-trip through
    /// an f64 by serde_json's default (approximate) float parsing was stored as text that,
    /// read back, is another number, one L4 then rejects: L3 was not a fixed point, and the
    /// stored value drifted from the sent one. JSON floats are now parsed exactly.
    #[test]
    fn filtered_numbers_read_back_as_the_same_numbers() {
        let body = sample()
            .to_string()
            .replace("4900", "1111111111111111111111111");
        let e: Value = serde_json::from_str(&body).expect("JSON");
        let stored = validate_and_filter_event(&e).expect("ok").to_string();
        let read_back: Value = serde_json::from_str(&stored).expect("JSON");
        assert_eq!(read_back.to_string(), stored);
        assert_eq!(validate_and_filter_event(&read_back), Ok(read_back));
    }

    #[test]
    fn unknown_fields_are_dropped_everywhere() {
        let mut e = sample();
        e["org"] = json!("evil");
        e["sensor"] = json!("s1");
        e["rec"]["args"] = json!({"customer_email": "jane@example.com"});
        e["dest"]["query"] = json!("?q=1");
        e["actor"]["email"] = json!("jane@example.com");
        let out = validate_and_filter_event(&e).expect("ok");
        assert_eq!(out, sample());
    }

    #[test]
    fn fields_are_rescrubbed_without_the_allow_set() {
        let mut e = sample();
        e["rec"]["fields"] = json!({
            "amount_cents": 4900,
            "sku": "A-1",
            "customer_email": "jane@example.com",
            "reason": "refund for jane@example.com",
            "card": 4111111111111111u64,
            "nested": {"a": 1},
            "list": [1],
            "nothing": null,
        });
        let out = validate_and_filter_event(&e).expect("ok");
        assert_eq!(
            out["rec"]["fields"],
            json!({"amount_cents": 4900, "sku": "A-1"})
        );
    }

    #[test]
    fn v1_envelope_loses_fields_only() {
        let mut e = sample();
        e["v"] = json!(1);
        let out = validate_and_filter_event(&e).expect("ok");
        assert_eq!(out["v"], json!(1));
        assert!(out["rec"].get("fields").is_none());
        assert_eq!(out["rec"]["action"], json!("issue_refund"));
    }

    /// A v1 envelope's `rec.fields` are dropped unread, whatever they hold.
    #[test]
    fn v1_envelope_passes_with_fields_of_any_type() {
        for fields in [json!(false), json!("x"), json!([1]), json!(null)] {
            let mut e = sample();
            e["v"] = json!(1);
            e["rec"]["fields"] = fields;
            let out = validate_and_filter_event(&e).expect("ok");
            assert!(out["rec"].get("fields").is_none());
            e["v"] = json!(2);
            assert_eq!(
                validate_and_filter_event(&e).is_ok(),
                e["rec"]["fields"].is_null()
            );
        }
    }

    #[test]
    fn wrong_types_are_rejected_naming_the_field_not_the_value() {
        for (path, bad) in [
            ("v", json!(3)),
            ("id", json!({"x": 1})),
            ("ts", json!("yesterday")),
            ("class", json!("success")),
            ("status", json!("200")),
            ("status", json!(1000)),
            ("dur_ms", json!(-1)),
        ] {
            let mut e = sample();
            e[path] = bad;
            let err = validate_and_filter_event(&e).expect_err(path);
            assert!(err.to_string().contains(path), "{err}");
        }
        let mut e = sample();
        e["rec"]["action"] = json!("a\nb");
        assert!(validate_and_filter_event(&e).is_err());
        assert!(validate_and_filter_event(&json!([1])).is_err());
    }

    #[test]
    fn sensitive_on_behalf_of_rejects_the_event() {
        let mut e = sample();
        e["onBehalfOf"] = json!("jane@example.com");
        let err = validate_and_filter_event(&e).expect_err("an e-mail in onBehalfOf");
        assert!(err.to_string().contains("onBehalfOf"), "{err}");
        e["onBehalfOf"] = json!("cust_42");
        let out = validate_and_filter_event(&e).expect("ok");
        assert_eq!(out["onBehalfOf"], json!("cust_42"));
    }

    /// Every free-form metadata string, and `err.code`, with a value L4 removes: the event is
    /// rejected, by the value filter (the ingest) and the typed one (the sensor) alike, naming
    /// the field and never the value.
    #[test]
    fn a_sensitive_value_in_any_metadata_string_rejects_the_event() {
        let hits = [
            "jane@example.com",
            "+1 (415) 555-0100",
            "078-05-1120",
            "81.2.69.160",
            "GB82WEST12345698765432",
            "4111 1111 1111 1111",
        ];
        let paths: [&[&str]; 8] = [
            &["rec", "action"],
            &["dest", "host"],
            &["dest", "pathTemplate"],
            &["actor", "id"],
            &["onBehalfOf"],
            &["session", "id"],
            &["session", "client"],
            &["session", "protocol"],
        ];
        for hit in hits {
            for path in paths {
                let mut e = sample();
                let mut slot = &mut e;
                for k in path {
                    slot = &mut slot[*k];
                }
                *slot = if path == ["dest", "pathTemplate"] {
                    json!(format!("/{hit}"))
                } else {
                    json!(format!("x {hit}"))
                };
                let err = validate_and_filter_event(&e).expect_err(hit);
                assert!(err.to_string().contains(path[path.len() - 1]), "{err}");
                assert!(!err.to_string().contains(hit), "{err}");
                let typed: crate::event::Event = serde_json::from_value(e).expect("event");
                assert!(filter_event(typed).is_err(), "{hit} in {path:?}");
            }
        }
        let mut e = sample();
        e["class"] = json!("error");
        e["err"] = json!({"kind": "jsonrpc", "code": 4111111111111111i64});
        assert!(validate_and_filter_event(&e).is_err());
        e["err"]["code"] = json!(-32601);
        assert!(validate_and_filter_event(&e).is_ok());
    }

    #[test]
    fn codes_and_dates_in_metadata_strings_pass() {
        let mut e = sample();
        e["rec"]["action"] = json!("create_order_12345678");
        e["dest"]["pathTemplate"] = json!("/create_order_12345678");
        e["dest"]["host"] = json!("127.0.0.1:8080");
        e["session"]["protocol"] = json!("2025-06-18");
        e["session"]["client"] = json!("claude-code 1.0.51");
        e["onBehalfOf"] = json!("ord_12345678");
        assert!(validate_and_filter_event(&e).is_ok());
        e["dest"]["host"] = json!("[::1]:8080");
        assert!(validate_and_filter_event(&e).is_ok());
        e["dest"]["host"] = json!("[2001:db8::7]:8080");
        assert!(validate_and_filter_event(&e).is_err());
    }

    /// The evidence fields pass as the sensor writes them, and anything else is refused: text
    /// where a hash, enum or count belongs, a hash that spells a card number, a `change`
    /// outside a drift event, a drift event without one.
    #[test]
    fn evidence_fields_are_checked_by_shape() {
        let mut e = sample();
        e["rec"]["toolDef"] = json!("0123456789abcdef");
        e["rec"]["listed"] = json!(false);
        e["rec"]["hints"] = json!(["readOnly", "openWorld"]);
        e["session"]["catalog"] = json!({"tools": 12, "bytes": 4096});
        assert_eq!(validate_and_filter_event(&e), Ok(e.clone()));
        let mut d = e.clone();
        d["class"] = json!("drift");
        assert!(
            validate_and_filter_event(&d).is_err(),
            "drift needs a change"
        );
        d["rec"]["change"] = json!("changed");
        d["rec"]["prevToolDef"] = json!("fedcba9876543210");
        assert_eq!(validate_and_filter_event(&d), Ok(d.clone()));
        let mut x = e.clone();
        x["class"] = json!("error");
        x["err"] = json!({"kind": "tool", "fp": "00ff00ff00ff00ff"});
        assert_eq!(validate_and_filter_event(&x), Ok(x.clone()));
        for (path, bad) in [
            (&["rec", "toolDef"][..], json!("jane@example.com")),
            (&["rec", "toolDef"], json!("4111111111111111")),
            (&["rec", "toolDef"], json!("ABCDEF")),
            (&["rec", "hints"], json!(["readOnly", "readOnly"])),
            (&["rec", "hints"], json!(["safe"])),
            (&["rec", "listed"], json!("no")),
            (&["rec", "change"], json!("added")),
            (&["session", "catalog"], json!({"tools": 1})),
            (
                &["session", "catalog"],
                json!({"bytes": 4111111111111111u64}),
            ),
            (&["session", "catalog"], json!({"bytes": "big"})),
        ] {
            let mut bad_event = e.clone();
            let mut slot = &mut bad_event;
            for k in path {
                slot = &mut slot[*k];
            }
            *slot = bad.clone();
            assert!(
                validate_and_filter_event(&bad_event).is_err(),
                "{path:?} = {bad}"
            );
            let typed = serde_json::from_value::<crate::event::Event>(bad_event);
            if let Ok(t) = typed {
                assert!(filter_event(t).is_err(), "{path:?} = {bad}");
            }
        }
    }

    /// The compiled event schema, the same file the ingest documents.
    pub(crate) fn event_validator() -> jsonschema::Validator {
        let schema: Value = serde_json::from_str(EVENT_SCHEMA_JSON).expect("schema parses");
        jsonschema::draft202012::new(&schema).expect("schema compiles")
    }

    /// The batch schema, with the event schema it refers to.
    pub(crate) fn batch_validator() -> jsonschema::Validator {
        let event: Value = serde_json::from_str(EVENT_SCHEMA_JSON).expect("event schema");
        let batch: Value = serde_json::from_str(BATCH_SCHEMA_JSON).expect("batch schema");
        let registry = jsonschema::Registry::new()
            .add(
                "https://schema.bounded-observe-mcp.invalid/event.v2.schema.json",
                event,
            )
            .expect("add")
            .prepare()
            .expect("registry");
        jsonschema::options()
            .with_registry(&registry)
            .build(&batch)
            .expect("batch schema compiles")
    }

    #[test]
    fn batch_schema_accepts_filtered_events_and_caps_the_count() {
        let v = batch_validator();
        let ev = validate_and_filter_event(&sample()).expect("ok");
        let ok = json!({"v": 2, "sensor": {"version": "0.1.0", "transport": "stdio"},
                        "dropped": 0, "events": [ev.clone()]});
        assert!(v.is_valid(&ok));
        let mut bad = ok.clone();
        bad["events"][0]["org"] = json!("x");
        assert!(!v.is_valid(&bad), "event schema is applied to batch items");
        let mut big = ok.clone();
        big["events"] = Value::Array(vec![ev; crate::event::MAX_BATCH_EVENTS + 1]);
        assert!(!v.is_valid(&big));
        let mut org = ok;
        org["org"] = json!("acme");
        assert!(!v.is_valid(&org), "a batch never carries org");
    }

    pub(crate) mod generated {
        use super::*;
        use proptest::prelude::*;

        fn any_text() -> impl Strategy<Value = String> {
            prop_oneof![
                4 => "[a-z_]{1,12}",
                4 => ".{0,40}",
                4 => "\\PC{0,300}",
                1 => Just("jane@example.com".to_string()),
                1 => Just("4111 1111 1111 1111".to_string()),
                1 => Just("+44 20 7946 0958".to_string()),
            ]
        }

        fn any_scalarish() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                (-1e12f64..1e12).prop_map(Value::from),
                any_text().prop_map(Value::from),
            ];
            leaf.prop_recursive(2, 8, 3, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                    prop::collection::btree_map("[a-z]{1,5}", inner, 0..3)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// Events close enough to valid that most pass, with every field sometimes wrong.
        fn any_event() -> impl Strategy<Value = Value> {
            let fields = prop::collection::btree_map(any_text(), any_scalarish(), 0..40);
            (
                (
                    prop_oneof![6 => Just(json!(2)), 2 => Just(json!(1)), 1 => any_scalarish()],
                    prop_oneof![8 => "[0-9a-f]{32}".prop_map(Value::from), 1 => any_text().prop_map(Value::from)],
                    prop_oneof![
                        4 => Just(json!("2026-11-29T19:13:27.123Z")),
                        4 => Just(json!("2026-11-29T19:13:27+02:00")),
                        1 => any_text().prop_map(Value::from)
                    ],
                    prop_oneof![4 => Just(json!("action")), 4 => Just(json!("error")), 1 => any_scalarish()],
                    prop_oneof![3 => "[a-z_]{1,12}", 1 => any_text()],
                    prop_oneof![4 => Just(Value::Null), 4 => "[0-9a-f]{16}".prop_map(Value::from), 1 => any_scalarish()],
                    fields,
                ),
                (
                    prop_oneof![3 => "[a-z_]{1,12}", 1 => any_text()],
                    prop_oneof![8 => "/[a-z_]{1,20}", 1 => any_text()],
                    prop_oneof![4 => Just(json!(200)), 4 => Just(json!(499)), 1 => any_scalarish()],
                    prop_oneof![8 => (0.0f64..1e6).prop_map(Value::from), 1 => any_scalarish()],
                    prop_oneof![Just(Value::Null), any_text().prop_map(Value::from)],
                    prop_oneof![
                        Just(Value::Null),
                        (any_text(), any_text()).prop_map(|(a, b)| json!({"id": a, "client": b, "protocol": "2025-06-18"}))
                    ],
                    prop_oneof![
                        4 => Just(Value::Null),
                        4 => Just(json!({"kind": "jsonrpc", "code": -32601})),
                        4 => Just(json!({"kind": "timeout"})),
                        1 => any_scalarish()
                    ],
                    any_scalarish(),
                ),
            )
                .prop_map(
                    |((v, id, ts, class, action, reg, fields), (host, path, status, dur, obo, session, err, junk))| {
                        let mut e = json!({
                            "v": v, "id": id, "ts": ts, "class": class,
                            "rec": {"rail": "mcp", "action": action, "registryVersion": reg,
                                    "fields": Value::Object(fields.into_iter().collect())},
                            "dest": {"host": host, "pathTemplate": path, "method": "POST"},
                            "actor": {"id": "mcp:k", "kind": "agent", "grade": "attested"},
                            "status": status, "dur_ms": dur,
                            "bytes": {"req": 1, "resp": 2},
                            "junk": junk,
                        });
                        for (k, x) in [("onBehalfOf", obo), ("session", session), ("err", err)] {
                            if !x.is_null() {
                                e[k] = x;
                            }
                        }
                        // The evidence fields, valid or not, from the junk's shape.
                        let n = e["bytes"]["req"].as_u64().unwrap_or(0) + e.to_string().len() as u64;
                        match n % 7 {
                            0 => e["rec"]["toolDef"] = json!("0123456789abcdef"),
                            1 => e["rec"]["hints"] = json!(["readOnly", "openWorld"]),
                            2 => e["rec"]["listed"] = json!(false),
                            3 => {
                                e["class"] = json!("drift");
                                e["rec"]["change"] = json!("changed");
                                e["rec"]["prevToolDef"] = json!("fedcba9876543210");
                            }
                            4 => if e["session"].is_object() {
                                e["session"]["catalog"] = json!({"tools": 3, "bytes": 1200});
                            },
                            5 => if e["err"].is_object() {
                                e["err"]["fp"] = json!("00ff00ff00ff00ff");
                            },
                            _ => e["rec"]["hints"] = json!(["readOnly", "readOnly"]),
                        }
                        e
                    },
                )
        }

        fn maybe_text() -> BoxedStrategy<String> {
            prop_oneof![
                4 => any_text(),
                1 => Just("2026-11-29T19:13:27.123Z".to_string()),
                1 => Just("0123456789abcdef0123456789abcdef".to_string()),
                1 => Just("/issue_refund".to_string()),
                1 => Just("POST".to_string()),
                1 => "[0-9a-f]{1,70}",
            ]
            .boxed()
        }

        /// A valid value most of the time, anything now and then.
        fn mostly(valid: &'static str) -> BoxedStrategy<String> {
            prop_oneof![12 => valid, 1 => maybe_text()].boxed()
        }

        /// Built events with every field sometimes invalid, for the typed filter's equivalence.
        pub(crate) fn any_built_event() -> BoxedStrategy<crate::event::Event> {
            use crate::event::{
                Actor, ByteSizes, CatalogSize, Dest, DriftChange, ErrKind, Event, EventClass,
                EventErr, Hint, Rec, Session,
            };
            let evidence = (
                prop::option::of(mostly("[0-9a-f]{16}")),
                prop::option::of(any::<bool>()),
                prop::collection::vec(
                    prop_oneof![
                        Just(Hint::ReadOnly),
                        Just(Hint::Destructive),
                        Just(Hint::Idempotent),
                        Just(Hint::OpenWorld)
                    ],
                    0..3,
                ),
                prop::option::of(prop_oneof![
                    Just(DriftChange::Added),
                    Just(DriftChange::Removed),
                    Just(DriftChange::Changed)
                ]),
                prop::option::of(mostly("[0-9a-f]{16}")),
                prop::option::of((prop::option::of(any::<u64>()), any::<u64>())),
                prop::option::of(mostly("[0-9a-f]{16}")),
                0u8..3,
            );
            let fields = prop::option::of(
                prop::collection::btree_map(any_text(), any_scalarish(), 0..40)
                    .prop_map(|m| m.into_iter().collect::<Map<String, Value>>()),
            )
            .boxed();
            let dur = prop_oneof![
                24 => 0.0f64..1e6,
                1 => Just(f64::NAN),
                1 => Just(f64::INFINITY),
                1 => Just(-0.0f64),
                1 => -1e6f64..0.0,
            ];
            let err = prop::option::of((
                prop_oneof![
                    Just(ErrKind::Jsonrpc),
                    Just(ErrKind::Tool),
                    Just(ErrKind::Timeout),
                    Just(ErrKind::Cancelled),
                    Just(ErrKind::Transport),
                ],
                prop::option::of(any::<i64>()),
            ));
            (
                (
                    prop_oneof![4 => Just(2u32), 2 => Just(1u32), 1 => any::<u32>()],
                    mostly("[0-9a-f]{32}"),
                    prop_oneof![
                        4 => Just("2026-11-29T19:13:27.123Z".to_string()),
                        1 => Just("2026-02-30T19:13:27.123Z".to_string()),
                        1 => any_text()
                    ],
                    prop::bool::ANY,
                    mostly("mcp"),
                    mostly("[a-z_]{1,12}"),
                    prop::option::of(mostly("[0-9a-f]{16}")),
                    fields,
                ),
                (
                    mostly("mcp://[a-z]{1,8}"),
                    mostly("/[a-z_]{1,20}"),
                    mostly("POST"),
                    (
                        mostly("mcp:[a-z0-9]{1,8}"),
                        mostly("agent"),
                        mostly("attested"),
                    ),
                    prop::option::of(mostly("cust_[0-9]{1,4}")),
                    (
                        prop_oneof![8 => 100u16..600, 1 => any::<u16>()],
                        dur,
                        any::<u64>(),
                        any::<u64>(),
                    ),
                    prop::option::of((
                        mostly("[a-f0-9]{8}"),
                        prop::option::of(mostly("2025-06-18")),
                        prop::option::of(mostly("[a-z]{1,8}")),
                    )),
                    err,
                ),
                evidence,
            )
                .prop_map(
                    |(
                        (v, id, ts, error, rail, action, reg, fields),
                        (
                            host,
                            path,
                            method,
                            (aid, kind, grade),
                            obo,
                            (status, dur_ms, req, resp),
                            session,
                            err,
                        ),
                        (tool_def, listed, hints, change, prev, catalog, fp, drift),
                    )| Event {
                        v,
                        id: id.into(),
                        ts: ts.into(),
                        class: if drift == 0 {
                            EventClass::Drift
                        } else if error {
                            EventClass::Error
                        } else {
                            EventClass::Action
                        },
                        rec: Rec {
                            rail: rail.into(),
                            action: action.into(),
                            registry_version: reg.map(crate::event::SharedStr::from),
                            fields: fields.map(Into::into),
                            tool_def: tool_def.map(Into::into),
                            listed,
                            hints,
                            change,
                            prev_tool_def: prev.map(Into::into),
                        },
                        dest: Dest {
                            host: host.into(),
                            path_template: path.into(),
                            method: method.into(),
                        },
                        actor: Actor {
                            id: aid.into(),
                            kind: kind.into(),
                            grade: grade.into(),
                        },
                        on_behalf_of: obo,
                        status,
                        dur_ms,
                        bytes: ByteSizes { req, resp },
                        session: session.map(|(id, protocol, client)| Session {
                            id: id.into(),
                            protocol: protocol.map(Into::into),
                            client: client.map(Into::into),
                            catalog: catalog.map(|(tools, bytes)| CatalogSize { tools, bytes }),
                        }),
                        err: err.map(|(kind, code)| EventErr { kind, code, fp }),
                    },
                )
                .boxed()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn plain_timestamps_are_what_the_time_parser_accepts(
                y in 0u32..10_000, mo in 0u32..14, d in 0u32..33, h in 0u32..25, mi in 0u32..61,
                sec in 0u32..62, ms in 0u32..1000,
            ) {
                let ts = format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{sec:02}.{ms:03}Z");
                let parsed = time::OffsetDateTime::parse(
                    &ts, &time::format_description::well_known::Rfc3339).is_ok();
                if plain_utc_ms_instant(ts.as_bytes()) {
                    prop_assert!(parsed, "{}", ts);
                }
                prop_assert_eq!(check_timestamp(&ts).is_ok(), parsed, "{}", ts);
            }

            #[test]
            fn typed_filter_equals_the_value_filter(e in any_built_event()) {
                let as_json = serde_json::to_value(&e).expect("an Event always serialises");
                let twice = e.clone();
                let typed = filter_event(e)
                    .map(|f| serde_json::to_value(f).expect("a filtered Event serialises"));
                // Again: the shared strings that passed are now known by their allocation.
                let again = filter_event(twice)
                    .map(|f| serde_json::to_value(f).expect("a filtered Event serialises"));
                prop_assert_eq!(&again, &typed);
                prop_assert_eq!(typed, validate_and_filter_event(&as_json));
            }

            #[test]
            fn filter_output_always_validates_against_the_schema(e in any_event()) {
                let validator = event_validator();
                if let Ok(out) = validate_and_filter_event(&e) {
                    let errors: Vec<String> = validator.iter_errors(&out).map(|x| x.to_string()).collect();
                    prop_assert!(errors.is_empty(), "{errors:?} in {out}");
                    // Idempotent: the ingest re-running the sensor's filter changes nothing.
                    prop_assert_eq!(validate_and_filter_event(&out), Ok(out.clone()));
                }
            }

            #[test]
            fn filter_never_panics_on_arbitrary_json(e in any_scalarish()) {
                let _ = validate_and_filter_event(&e);
            }

            /// The recall only ever answers what the scan answers, through repeats, evictions,
            /// both scans of one string and strings on both sides of its length bound.
            #[test]
            fn recalled_verdicts_are_the_scanners(
                texts in proptest::collection::vec(
                    prop_oneof![any_text(), "[0-9a-f]{16,64}", "x{120,136}"], 1..40),
                order in proptest::collection::vec(0usize..1000, 1..120),
            ) {
                for i in order {
                    let t = &texts[i % texts.len()];
                    prop_assert_eq!(
                        privacy::contains_sensitive_recalled(t), privacy::contains_sensitive(t), "{}", t);
                    prop_assert_eq!(privacy::key_denied_recalled(t), privacy::key_denied(t), "{}", t);
                }
            }
        }

        /// How many of 400 values drawn (deterministically) from `strat` pass `ok`.
        fn passing<S: Strategy>(strat: S, ok: impl Fn(S::Value) -> bool) -> usize {
            use proptest::strategy::ValueTree;
            use proptest::test_runner::TestRunner;
            let mut runner = TestRunner::deterministic();
            (0..400)
                .filter(|_| ok(strat.new_tree(&mut runner).expect("tree").current()))
                .count()
        }

        #[test]
        fn generated_built_events_pass_and_fail() {
            // Guards the equivalence above against vacuity: both outcomes must be common.
            let ok = passing(any_built_event(), |e| filter_event(e).is_ok());
            assert!(
                (20..380).contains(&ok),
                "{ok} of 400 generated events were valid"
            );
        }

        #[test]
        fn generated_events_mostly_pass() {
            // Guards the property above against vacuity: the generator must produce valid events.
            let ok = passing(any_event(), |e| validate_and_filter_event(&e).is_ok());
            assert!(ok > 20, "only {ok} of 400 generated events were valid");
        }
    }
}
