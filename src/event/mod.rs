//! The action-grade event (envelope v2, DESIGN §4): metadata only.
//!
//! Owns the [`Event`] type, the batch type, how an event is written into it ([`EventWriter`]),
//! and (in submodules) the privacy layers and the L3 schema filter that both the sensor and the
//! ingest run. Goes in: facts the observer measured.
//! Comes out: a struct whose every field is metadata. It must never hold request or response
//! contents: the only argument values it can carry are in `rec.fields`, and those only after
//! [`privacy`] has passed them.

pub mod call;
pub mod filter;
pub mod health;
pub mod privacy;

use std::borrow::Cow;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use filter::{
    filter_event, filter_event_in_place, validate_and_filter_event, FilterError,
    EVENT_SCHEMA_VERSION,
};

/// Most events in one batch (DESIGN §4).
pub const MAX_BATCH_EVENTS: usize = 500;

/// Largest batch body the reference ingest accepts by default: the sensor's batches stay under
/// it, and the ingest's `DEFAULT_MAX_BODY_BYTES` is it. Part of the wire contract, so it lives
/// here, where both sides read it, rather than in either. A real 500-event batch is a few hundred
/// KB; 4 MiB leaves room for events near the capture limits while bounding what one request can
/// make the ingest hold.
pub const MAX_BATCH_BODY_BYTES: usize = 4 * 1024 * 1024;

/// What the sensor puts in every event's `rec.rail`, `dest.method`, `actor.kind` and
/// `actor.grade`. The L3 filter passes exactly these values without scanning them
/// (`filter::Token`).
pub(crate) const SENSOR_RAIL: &str = "mcp";
pub(crate) const SENSOR_METHOD: &str = "POST";
pub(crate) const SENSOR_KIND: &str = "agent";
pub(crate) const SENSOR_GRADE: &str = "attested";

/// A string many events carry unchanged (`dest.host`, `actor.id`, the session's facts): every
/// event holding it shares one allocation, so building an event copies a pointer, not the text.
/// Serialises and deserialises as a plain JSON string, and compares with `str` like a `String`.
#[derive(Clone, Eq, PartialOrd, Ord)]
pub struct SharedStr(Arc<str>);

/// Equal text, as derived, but known at once for the one same allocation: `Arc`'s own shortcut
/// is for sized values only, so `Arc<str>` compared every byte (three `memcmp` calls per event
/// where the writer checks a session's strings, bench/README.md).
impl PartialEq for SharedStr {
    fn eq(&self, other: &SharedStr) -> bool {
        self.same(other) || *self.0 == *other.0
    }
}

/// The text's hash, as derived: equal text, equal hash.
impl std::hash::Hash for SharedStr {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl SharedStr {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether both hold the one same allocation (not merely equal text).
    pub(crate) fn same(&self, other: &SharedStr) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::ops::Deref for SharedStr {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SharedStr {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SharedStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::fmt::Display for SharedStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&*self.0, f)
    }
}

impl From<&str> for SharedStr {
    fn from(s: &str) -> Self {
        SharedStr(Arc::from(s))
    }
}

impl From<String> for SharedStr {
    fn from(s: String) -> Self {
        SharedStr(Arc::from(s))
    }
}

impl From<&String> for SharedStr {
    fn from(s: &String) -> Self {
        SharedStr(Arc::from(s.as_str()))
    }
}

impl PartialEq<str> for SharedStr {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for SharedStr {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for SharedStr {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl Serialize for SharedStr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SharedStr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(SharedStr::from)
    }
}

/// An event's `id`. The sensor's own are 32 hex digits of 128 random bits ([`new_event_id`]),
/// held inline: as a `String` each cost an allocation and a free per event (bench/README.md).
/// Any other text (a test's, or none when the OS had no randomness) is held as given, so that
/// L3 judges exactly what would be sent. Compares, serialises and deserialises as its text.
#[derive(Clone)]
pub struct EventId(IdText);

#[derive(Clone)]
enum IdText {
    /// Lower-case hex digits: ASCII.
    Hex([u8; 32]),
    Other(String),
}

impl EventId {
    #[inline]
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Never empty in fact: `Hex` holds only digits `hex_digits` wrote.
            IdText::Hex(h) => crate::text::utf8(h).unwrap_or_default(),
            IdText::Other(s) => s,
        }
    }
}

impl std::ops::Deref for EventId {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for EventId {
    fn eq(&self, other: &EventId) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for EventId {}

/// The text's hash: equal text, equal hash, as [`PartialEq`] compares.
impl std::hash::Hash for EventId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialEq<str> for EventId {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl std::fmt::Debug for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<String> for EventId {
    fn from(s: String) -> Self {
        EventId(IdText::Other(s))
    }
}

impl From<&str> for EventId {
    fn from(s: &str) -> Self {
        EventId(IdText::Other(s.to_owned()))
    }
}

impl Serialize for EventId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EventId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(EventId::from)
    }
}

/// `rec.fields`: captured argument values by key, the keys unique and in ascending byte order
/// (the order of a `serde_json::Map`, in which the L3 filter keeps the first fields that pass
/// and a JSON object of them is written). A sorted `Vec`: an event holds one to a few, where a
/// tree map cost a node allocation and a walk each way on every event. Serialises and
/// deserialises as a JSON object (a repeated key: the last value, as a map keeps it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fields(Vec<(SharedStr, Value)>);

/// What [`Fields::iter`] yields: the entries as a map's iterator gives them.
type FieldEntry<'a> = (&'a str, &'a Value);
type FieldIter<'a> = std::iter::Map<
    std::slice::Iter<'a, (SharedStr, Value)>,
    for<'x> fn(&'x (SharedStr, Value)) -> FieldEntry<'x>,
>;

impl Fields {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| &self.0[i].1)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// In key order.
    pub fn iter(&self) -> FieldIter<'_> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The values, in key order.
    pub fn values(&self) -> impl Iterator<Item = &Value> {
        self.0.iter().map(|(_, v)| v)
    }

    /// Keeps the entries `keep` says yes to, asked in key order.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &Value) -> bool) {
        self.0.retain(|(k, v)| keep(k, v));
    }
}

impl<K: Into<SharedStr>> FromIterator<(K, Value)> for Fields {
    fn from_iter<I: IntoIterator<Item = (K, Value)>>(entries: I) -> Self {
        let mut v: Vec<(SharedStr, Value)> =
            entries.into_iter().map(|(k, v)| (k.into(), v)).collect();
        // Stable, so of equal keys the last is last: the one a map would have kept.
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.reverse();
        v.dedup_by(|later, earlier| later.0 == earlier.0);
        v.reverse();
        Fields(v)
    }
}

impl From<Map<String, Value>> for Fields {
    fn from(m: Map<String, Value>) -> Self {
        // A map iterates in key order, with unique keys.
        Fields(m.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

impl<'a> IntoIterator for &'a Fields {
    type Item = FieldEntry<'a>;
    type IntoIter = FieldIter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl Serialize for Fields {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Map::<String, Value>::deserialize(d).map(Fields::from)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventClass {
    Action,
    Error,
    /// A listed tool was added, removed or redefined between two `tools/list` results of one
    /// session (`rec.change`); not a call.
    Drift,
}

impl EventClass {
    /// The name the envelope carries (what serde writes).
    pub fn name(self) -> &'static str {
        match self {
            EventClass::Action => "action",
            EventClass::Error => "error",
            EventClass::Drift => "drift",
        }
    }
}

/// A tool annotation the server set to `true` (`rec.hints`): the server's claim, not a fact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Hint {
    ReadOnly,
    Destructive,
    Idempotent,
    OpenWorld,
}

/// What a `drift` event says happened to a tool (`rec.change`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriftChange {
    Added,
    Removed,
    Changed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rec {
    /// Always `"mcp"`. A `Cow` so the sensor's constant costs no allocation per event.
    pub rail: Cow<'static, str>,
    /// The tool name. Shared: a session calls a few tools many times, and the observer holds
    /// each name once (`observe::assemble::ToolNames`).
    pub action: SharedStr,
    /// Short hash of the `tools/list` catalog the call was made against; null until one was seen.
    #[serde(rename = "registryVersion")]
    pub registry_version: Option<SharedStr>,
    /// Captured argument values: allow-listed keys, scalars only, after L2 and L4.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Fields>,
    /// 16 hex digits of SHA-256 over the called tool's canonical definition as last listed
    /// (`drift`: the new one); absent (null) when no catalog was seen or the tool is not in it.
    #[serde(rename = "toolDef", default, skip_serializing_if = "Option::is_none")]
    pub tool_def: Option<SharedStr>,
    /// `false` when a catalog was seen and the called tool is not in it; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listed: Option<bool>,
    /// The listed tool's annotations set to `true`, in [`Hint`] order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hints: Vec<Hint>,
    /// `drift` only: what happened to the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<DriftChange>,
    /// `drift` only: the definition hash before the change (absent for `added`).
    #[serde(
        rename = "prevToolDef",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prev_tool_def: Option<SharedStr>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dest {
    /// `mcp://<serverName>` (stdio) or the upstream's `host[:port]` (HTTP).
    pub host: SharedStr,
    /// `/` and the tool name, shared like [`Rec::action`].
    #[serde(rename = "pathTemplate")]
    pub path_template: SharedStr,
    /// Always `"POST"` from the sensor (a `Cow`, like the other constants).
    pub method: Cow<'static, str>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Actor {
    pub id: SharedStr,
    /// `"agent"` from the sensor (a `Cow`, like the other constants).
    pub kind: Cow<'static, str>,
    /// `"attested"` from the sensor.
    pub grade: Cow<'static, str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ByteSizes {
    pub req: u64,
    pub resp: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    /// Random per wrapper process (stdio), or a hash of `Mcp-Session-Id` (HTTP; never the raw value).
    pub id: SharedStr,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<SharedStr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<SharedStr>,
    /// The size of the last `tools/list` seen: the context every agent turn pays for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog: Option<CatalogSize>,
}

/// `session.catalog`: how many tools the last `tools/list` had, and its bytes on the wire (all
/// pages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogSize {
    /// Absent when a page was too large to read whole (its tools were not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<u64>,
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrKind {
    Jsonrpc,
    Tool,
    Timeout,
    Cancelled,
    Transport,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventErr {
    pub kind: ErrKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<i64>,
    /// 16 hex digits of SHA-256 over the tool, kind, code and the shape of the error text
    /// (see `observe::fingerprint`); the text itself never leaves the process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp: Option<String>,
}

/// One `tools/call`, as evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub v: u32,
    /// 128-bit random, hex; the ingest de-duplicates on it.
    pub id: EventId,
    /// RFC 3339 UTC with milliseconds, when the request was seen. Shared by the events an
    /// observer stamps in the same millisecond ([`Stamps`]).
    pub ts: SharedStr,
    pub class: EventClass,
    pub rec: Rec,
    pub dest: Dest,
    pub actor: Actor,
    #[serde(rename = "onBehalfOf", skip_serializing_if = "Option::is_none")]
    pub on_behalf_of: Option<String>,
    pub status: u16,
    pub dur_ms: f64,
    pub bytes: ByteSizes,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<Session>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub err: Option<EventErr>,
}

/// `sensor` block of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SensorInfo {
    pub version: String,
    /// `"stdio"` or `"http"`.
    pub transport: String,
    /// What the sensor saw go wrong since its previous batch (see [`health`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<health::Health>,
}

/// Version of the batch envelope (DESIGN §4).
pub const BATCH_VERSION: u32 = 2;

/// What is POSTed to `<ingest>/v1/events` (and appended to a `file:` sink), built as it fills:
/// each event is serialised into the body when it is added, and the envelope
/// (`{"v":2,"sensor":…,"dropped":N,"events":[…]}`) is written around them when the batch is
/// sent, because `dropped` is only known then. Events go in already filtered ([`filter_event`]).
#[derive(Debug, Default)]
pub struct BatchBody {
    /// [`HEAD_ROOM`] bytes kept free, then the events so far, comma-separated, without the
    /// brackets; empty before the first event.
    buf: Vec<u8>,
    count: usize,
}

/// Bytes kept free in front of a batch's events for the envelope's head, so that
/// [`BatchBody::take`] writes the head there instead of copying every event behind it. The
/// longest head the sensor writes (every health count at its cap) is under 400 bytes; a longer
/// one would be copied the old way.
const HEAD_ROOM: usize = 512;

/// What goes between the head and the events, and after the events.
const LEAD: &[u8] = b",\"events\":[";
const TAIL: &[u8] = b"]}";

/// The envelope's fields before `events`, in the order they are sent.
#[derive(Serialize)]
struct BatchHead<'a> {
    v: u32,
    sensor: &'a SensorInfo,
    dropped: u64,
}

impl BatchBody {
    /// Appends one filtered event. serde_json has no error to give for an [`Event`] (its maps
    /// have string keys); were there one, the body would be left as it was.
    pub fn push(&mut self, event: &Event) -> Result<(), serde_json::Error> {
        let mark = self.open_event();
        match write_event(&mut self.buf, event, &mut Repeats::default()) {
            Ok(()) => {
                self.count += 1;
                Ok(())
            }
            Err(e) => {
                self.buf.truncate(mark);
                Err(e)
            }
        }
    }

    /// Appends one event [`EventWriter`] wrote, unless the events' bytes would then pass
    /// `max_event_bytes` and the body already holds one: `false`, and the body is left as it
    /// was, so that the caller can send it and start the next batch with this event. An empty
    /// body always takes the event, so no event is ever refused for its size alone.
    pub fn push_written(&mut self, event: &Written, max_event_bytes: usize) -> bool {
        // With the comma before it.
        if self.count > 0 && self.events().len() + 1 + event.0.len() > max_event_bytes {
            return false;
        }
        self.open_event();
        self.buf.extend_from_slice(&event.0);
        self.count += 1;
        true
    }

    /// Makes the room for the head before the first event, or puts the comma before any other;
    /// returns where that began, to take it back if the event is not written.
    fn open_event(&mut self) -> usize {
        if self.buf.is_empty() {
            self.buf.resize(HEAD_ROOM, 0);
        }
        let mark = self.buf.len();
        if self.count > 0 {
            self.buf.push(b',');
        }
        mark
    }

    /// The events' bytes so far.
    fn events(&self) -> &[u8] {
        self.buf.get(HEAD_ROOM..).unwrap_or_default()
    }

    /// Events added since the last [`BatchBody::take`].
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Forgets the events added so far.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.count = 0;
    }

    /// The whole batch as sent (envelope version [`BATCH_VERSION`]); empties the body. The
    /// events are not copied: the head goes into the room before them and the buffer leaves
    /// with the batch. The next batch starts in a buffer a little larger than this one, so a
    /// burst's large buffer goes with the burst's last batch.
    pub fn take(&mut self, sensor: &SensorInfo, dropped: u64) -> Result<Bytes, serde_json::Error> {
        let head = serde_json::to_vec(&BatchHead {
            v: BATCH_VERSION,
            sensor,
            dropped,
        })?;
        // `head` is a JSON object: `{…}`. The events go in before its closing brace.
        let head = &head[..head.len().saturating_sub(1)];
        let room = HEAD_ROOM.checked_sub(head.len() + LEAD.len());
        let out = match room {
            Some(at) if !self.buf.is_empty() => {
                // With room for a batch a little longer, and its closing bracket: a buffer that
                // grows copies what it holds.
                let len = self.buf.len();
                let next = Vec::with_capacity(len + len / 16 + TAIL.len());
                let mut out = std::mem::replace(&mut self.buf, next);
                out[at..at + head.len()].copy_from_slice(head);
                out[at + head.len()..HEAD_ROOM].copy_from_slice(LEAD);
                out.extend_from_slice(TAIL);
                Bytes::from(out).slice(at..)
            }
            _ => {
                let events = self.events();
                let mut out =
                    Vec::with_capacity(head.len() + LEAD.len() + events.len() + TAIL.len());
                out.extend_from_slice(head);
                out.extend_from_slice(LEAD);
                out.extend_from_slice(events);
                out.extend_from_slice(TAIL);
                Bytes::from(out)
            }
        };
        self.clear();
        Ok(out)
    }
}

/// An event that passed the L3 filter, as a batch carries it. Only [`EventWriter::write`]
/// makes one, so whatever holds these holds nothing unfiltered.
#[derive(Debug, Clone)]
pub struct Written(Bytes);

impl Written {
    /// The event's JSON.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Why [`EventWriter::write`] wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Filtered(#[from] FilterError),
    /// serde_json has none to give for an [`Event`] (its maps have string keys).
    #[error("event could not be encoded: {0}")]
    Encoding(#[from] serde_json::Error),
}

/// Bytes of one block that [`EventWriter`] writes events into.
const WRITE_BLOCK: usize = 16 * 1024;

/// Filters events (L3) and writes those that pass, where they are made: the reporter's queue
/// then carries their bytes instead of the events. An event's strings are freed right after
/// they were made, so the allocator hands the same memory to the next event (its thread cache
/// holds a few blocks of each size, and a burst queued thousands of events before the batcher
/// freed them, each allocation then taking the allocator's slow path), and the queue's items
/// need no allocation of their own: events are written one after another into blocks of
/// [`WRITE_BLOCK`] bytes and handed out as slices of them (a reference, not a copy); a block
/// is freed when the last of its events has gone into a batch (bench/README.md, "… events
/// written where they are made").
#[derive(Debug, Default)]
pub struct EventWriter {
    /// Where an event is written first: a `Vec`'s appends are inlined where a block's are
    /// calls, and the one copy into the block costs less than the difference.
    scratch: Vec<u8>,
    block: BytesMut,
    repeats: Repeats,
}

/// The bytes last written for the parts of an event that all of a session's events repeat, each
/// with the values it was written from: `dest.method` and `actor`, and `session`. When an event
/// holds the same values (the same shared strings, or equal text) its part is copied from here
/// instead of being written string by string; the bytes are a function of those values alone,
/// so they are what writing them again would give. Writing these seven strings and the catalog
/// cost about 700 instructions per event (bench/README.md, "… parts every event repeats"). One
/// entry each: a stdio session's values change when its catalog or client does, and then once;
/// HTTP sessions that take turns replace the entry each time, at the cost of a copy.
#[derive(Debug, Default)]
struct Repeats {
    actor: LastWritten<(Cow<'static, str>, Actor)>,
    session: LastWritten<Session>,
}

/// What a part of an event was last written from, and the bytes written.
type LastWritten<K> = Option<(K, Vec<u8>)>;

/// Equal text, known without comparing it when both are the one same string (a constant, or a
/// shared string): a call to compare three short constants cost about 120 instructions per event.
#[inline(always)]
fn same_text(a: &str, b: &str) -> bool {
    std::ptr::eq(a, b) || a == b
}

/// The bytes `slot` holds if `same` says they were written from the values at hand; otherwise
/// `write`'s, kept in `slot` with `key` (those values).
#[inline(always)]
fn repeated<K>(
    out: &mut Vec<u8>,
    slot: &mut LastWritten<K>,
    key: impl FnOnce() -> K,
    same: impl FnOnce(&K) -> bool,
    write: impl FnOnce(&mut Vec<u8>) -> Result<(), serde_json::Error>,
) -> Result<(), serde_json::Error> {
    if let Some((k, bytes)) = slot {
        if same(k) {
            out.extend_from_slice(bytes);
            return Ok(());
        }
    }
    let start = out.len();
    write(out)?;
    *slot = Some((key(), out[start..].to_vec()));
    Ok(())
}

impl EventWriter {
    /// Filters `event` in place (see [`filter_event_in_place`]) and writes it.
    pub fn write(&mut self, event: &mut Event) -> Result<Written, WriteError> {
        filter_event_in_place(event)?;
        self.scratch.clear();
        write_event(&mut self.scratch, event, &mut self.repeats)?;
        if self.block.capacity() < self.scratch.len() {
            self.block = BytesMut::with_capacity(WRITE_BLOCK.max(self.scratch.len()));
        }
        self.block.extend_from_slice(&self.scratch);
        Ok(Written(self.block.split().freeze()))
    }
}

/// An [`Event`] as JSON: the bytes `serde_json::to_writer` writes for it (a property test
/// holds them equal over generated events), without serde's per-field dispatch, and with each
/// string that needs no escape (nearly all of them: hex ids, names, the timestamp) copied
/// whole. Values that are rare or nested (captured fields, the error, the catalog, the
/// duration's float) are still written by `serde_json`. The parts a session's events repeat
/// are copied from `repeats` when their values are those it last wrote them from. Goes with the
/// derive: a field added to [`Event`] must be added here, and the property test fails until it
/// is.
fn write_event(
    out: &mut Vec<u8>,
    e: &Event,
    repeats: &mut Repeats,
) -> Result<(), serde_json::Error> {
    type Out<'a> = &'a mut Vec<u8>;
    /// `k` (the key with the punctuation before it), then `v` as a JSON string.
    #[inline(always)]
    fn text(out: Out, k: &str, v: &str) -> Result<(), serde_json::Error> {
        out.extend_from_slice(k.as_bytes());
        // serde_json escapes exactly these bytes; anything else goes out as it is. A fold with
        // no early exit, so the compiler checks many bytes at once: these strings are short,
        // and almost never need an escape.
        let plain = v
            .bytes()
            .fold(true, |ok, b| ok & (b >= 0x20) & (b != b'"') & (b != b'\\'));
        if plain {
            out.push(b'"');
            out.extend_from_slice(v.as_bytes());
            out.push(b'"');
            Ok(())
        } else {
            serde_json::to_writer(&mut *out, v)
        }
    }
    /// [`text`] when there is a value; nothing when there is none (`skip_serializing_if`).
    #[inline(always)]
    fn opt_text(out: Out, k: &str, v: Option<&str>) -> Result<(), serde_json::Error> {
        // Not `map_or`: the compiler left that a call of its own, 100 instructions each.
        match v {
            Some(v) => text(out, k, v),
            None => Ok(()),
        }
    }
    /// `k`, then `v` as serde_json writes it.
    #[inline(always)]
    fn value<T: Serialize + ?Sized>(out: Out, k: &str, v: &T) -> Result<(), serde_json::Error> {
        out.extend_from_slice(k.as_bytes());
        serde_json::to_writer(&mut *out, v)
    }
    let r = &e.rec;
    value(out, "{\"v\":", &e.v)?;
    text(out, ",\"id\":", &e.id)?;
    text(out, ",\"ts\":", &e.ts)?;
    text(out, ",\"class\":", e.class.name())?;
    text(out, ",\"rec\":{\"rail\":", &r.rail)?;
    text(out, ",\"action\":", &r.action)?;
    match &r.registry_version {
        Some(v) => text(out, ",\"registryVersion\":", v)?,
        None => out.extend_from_slice(b",\"registryVersion\":null"),
    }
    if let Some(f) = &r.fields {
        out.extend_from_slice(b",\"fields\":{");
        for (i, (k, v)) in f.iter().enumerate() {
            text(out, if i == 0 { "" } else { "," }, k)?;
            out.push(b':');
            match v {
                Value::String(s) => text(out, "", s)?,
                v => serde_json::to_writer(&mut *out, v)?,
            }
        }
        out.push(b'}');
    }
    opt_text(out, ",\"toolDef\":", r.tool_def.as_deref())?;
    if let Some(l) = &r.listed {
        value(out, ",\"listed\":", l)?;
    }
    if !r.hints.is_empty() {
        value(out, ",\"hints\":", &r.hints)?;
    }
    if let Some(c) = &r.change {
        value(out, ",\"change\":", c)?;
    }
    opt_text(out, ",\"prevToolDef\":", r.prev_tool_def.as_deref())?;
    text(out, "},\"dest\":{\"host\":", &e.dest.host)?;
    text(out, ",\"pathTemplate\":", &e.dest.path_template)?;
    repeated(
        out,
        &mut repeats.actor,
        || (e.dest.method.clone(), e.actor.clone()),
        |(method, actor)| {
            same_text(method, &e.dest.method)
                && same_text(&actor.id, &e.actor.id)
                && same_text(&actor.kind, &e.actor.kind)
                && same_text(&actor.grade, &e.actor.grade)
        },
        |out| {
            text(out, ",\"method\":", &e.dest.method)?;
            text(out, "},\"actor\":{\"id\":", &e.actor.id)?;
            text(out, ",\"kind\":", &e.actor.kind)?;
            text(out, ",\"grade\":", &e.actor.grade)?;
            out.push(b'}');
            Ok(())
        },
    )?;
    opt_text(out, ",\"onBehalfOf\":", e.on_behalf_of.as_deref())?;
    value(out, ",\"status\":", &e.status)?;
    value(out, ",\"dur_ms\":", &e.dur_ms)?;
    value(out, ",\"bytes\":{\"req\":", &e.bytes.req)?;
    value(out, ",\"resp\":", &e.bytes.resp)?;
    out.push(b'}');
    if let Some(s) = &e.session {
        repeated(
            out,
            &mut repeats.session,
            || s.clone(),
            |k| k == s,
            |out| {
                text(out, ",\"session\":{\"id\":", &s.id)?;
                opt_text(out, ",\"protocol\":", s.protocol.as_deref())?;
                opt_text(out, ",\"client\":", s.client.as_deref())?;
                if let Some(c) = &s.catalog {
                    out.extend_from_slice(b",\"catalog\":{");
                    if let Some(t) = &c.tools {
                        value(out, "\"tools\":", t)?;
                        out.push(b',');
                    }
                    value(out, "\"bytes\":", &c.bytes)?;
                    out.push(b'}');
                }
                out.push(b'}');
                Ok(())
            },
        )?;
    }
    if let Some(err) = &e.err {
        value(out, ",\"err\":", err)?;
    }
    out.push(b'}');
    Ok(())
}

/// Where the observer puts finished events. The reporter's queue implements it; tests use a Vec.
pub trait EventSink: Send {
    fn emit(&mut self, event: Event);

    /// How many more events `emit` can take now without dropping any. A producer that can wait
    /// (the stdio observer, which works off a backlog) uses it to pace itself to the consumer.
    fn room(&self) -> usize {
        usize::MAX
    }

    /// Events `emit` took that the consumer has not taken yet (0 for a sink with no queue). A
    /// producer that can wait keeps this short, so what it wrote ahead stays in memory it reuses.
    fn queued(&self) -> usize {
        0
    }

    /// Notified each time the consumer takes events from the queue: a producer waiting for
    /// [`EventSink::queued`] to fall waits on it. `None`: it polls.
    fn taken(&self) -> Option<Arc<tokio::sync::Notify>> {
        None
    }

    /// Where the observer adds its `sensor.health` counts, if this sink sends batches.
    fn health(&self) -> Option<&health::HealthCounters> {
        None
    }

    /// Whether [`EventSink::emit_call`] uses the call's facts: the observer gathers them only
    /// for a sink that does (the OTLP export, `crate::otlp`).
    fn wants_call_facts(&self) -> bool {
        false
    }

    /// [`EventSink::emit`] with what a sink exporting more than the envelope needs; by default
    /// the facts are dropped.
    fn emit_call(&mut self, event: Event, facts: call::CallFacts) {
        let _ = facts;
        self.emit(event);
    }

    /// Whether [`EventSink::emit`] reads the event. `false` for a reporter with reporting off,
    /// which only counts it: a sink beside it (OTLP) then takes the event itself, not a copy,
    /// and tells this one with [`EventSink::count_unread`].
    fn reads_events(&self) -> bool {
        true
    }

    /// Counts one event given to another sink instead (see [`EventSink::reads_events`]).
    fn count_unread(&mut self) {}

    /// An MCP session ended (only for a sink that [`EventSink::wants_call_facts`]).
    fn session_ended(&mut self, facts: call::SessionFacts) {
        let _ = facts;
    }
}

impl EventSink for Vec<Event> {
    fn emit(&mut self, event: Event) {
        self.push(event);
    }
}

/// A fresh 128-bit random event id, lower-case hex, from `crate::random::pooled` (fetched in
/// blocks, each byte used once).
///
/// Empty when the OS generator fails, and never made up from anything else: the ingest stores
/// an id once, so an id two events could share loses one of them, and a predictable one could
/// be taken first. An empty id is no id: L3 takes 8 to 64 characters, so the reporter rejects
/// the event and counts it, and it is never sent. Failing open, never panicking: the relay
/// carries on, with one warning that events are not sent.
pub fn new_event_id() -> EventId {
    match crate::random::pooled::<16>() {
        Ok(b) => {
            let mut hex = [0u8; 32];
            for (pair, x) in hex.chunks_exact_mut(2).zip(b) {
                pair.copy_from_slice(&hex_digits(x));
            }
            EventId(IdText::Hex(hex))
        }
        Err(_) => {
            static WARNED: std::sync::atomic::AtomicBool =
                std::sync::atomic::AtomicBool::new(false);
            if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!("No randomness for event ids; events are not sent");
            }
            EventId::from(String::new())
        }
    }
}

/// The two lower-case hex digits of `x`: the crate's one hex encoding, for event ids here and
/// for [`hex_lower`].
fn hex_digits(x: u8) -> [u8; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [DIGITS[usize::from(x >> 4)], DIGITS[usize::from(x & 0x0f)]]
}

/// Lower-case hex in one allocation (one `format!` per byte cost 16 per event): catalog and
/// session hashes, key ids.
pub(crate) fn hex_lower(b: &[u8]) -> String {
    // Bytes, then one check that they are UTF-8 (they are ASCII): `String::push` encodes each
    // `char` on its own, which cost 28 instructions per input byte.
    let hex: Vec<u8> = b.iter().flat_map(|&x| hex_digits(x)).collect();
    String::from_utf8(hex).unwrap_or_default()
}

/// Event timestamps, each millisecond's text made once: the events of a burst mostly share
/// their millisecond, and then share its text too, where each made and freed its own (about
/// 200 instructions an event, `bench/README.md`).
#[derive(Debug, Default)]
pub struct Stamps(Option<(u128, SharedStr)>);

impl Stamps {
    /// [`rfc3339_ms`] of `t`, shared with the last one made if that was the same millisecond.
    pub fn at(&mut self, t: std::time::SystemTime) -> SharedStr {
        let Ok(since) = t.duration_since(std::time::UNIX_EPOCH) else {
            return rfc3339_ms(t).into();
        };
        let ms = since.as_millis();
        match &self.0 {
            Some((last, text)) if *last == ms => text.clone(),
            _ => self.0.insert((ms, rfc3339_ms(t).into())).1.clone(),
        }
    }
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-11-29T19:13:27.123Z`.
///
/// Written by hand for instants from 1970 to 9999 (every event's `ts`): the `time` crate's
/// formatter, which walks a format description per call, was a visible part of the cost of an
/// event. A test holds it to that formatter, which still writes every other instant.
pub fn rfc3339_ms(t: std::time::SystemTime) -> String {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) if d.as_secs() < SECS_TO_YEAR_10000 => rfc3339_ms_epoch(d),
        _ => rfc3339_ms_time(t),
    }
}

/// Seconds from 1970-01-01 to 10000-01-01: past it the year has five digits.
const SECS_TO_YEAR_10000: u64 = 253_402_300_800;

/// The last `width` decimal digits of `v`, into `b` from `at`.
fn put_digits(b: &mut [u8; 24], at: usize, width: usize, mut v: u64) {
    for i in (at..at + width).rev() {
        // `v % 10` is a single digit.
        b[i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

thread_local! {
    /// The second [`rfc3339_ms_epoch`] last wrote, and its text up to the milliseconds: a
    /// thread's events mostly fall in the second before, and working out the date and time
    /// of day was about half of writing a timestamp. `u64::MAX` is no second (past year 9999).
    static LAST_SECOND: std::cell::Cell<(u64, [u8; 24])> =
        const { std::cell::Cell::new((u64::MAX, [0; 24])) };
}

/// [`rfc3339_ms`] of an instant `d` after the epoch, before year 10000.
fn rfc3339_ms_epoch(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    let mut b = match LAST_SECOND.get() {
        (last, b) if last == secs => b,
        _ => {
            let b = date_and_time(secs);
            LAST_SECOND.set((secs, b));
            b
        }
    };
    put_digits(&mut b, 20, 3, u64::from(d.subsec_millis()));
    // Only ASCII digits and separators were written; the fallback keeps it panic-free.
    crate::text::utf8(&b).map_or_else(|| rfc3339_ms_time(std::time::UNIX_EPOCH + d), str::to_owned)
}

/// The timestamp of second `secs` after the epoch (before year 10000), `.000Z` for the
/// milliseconds.
fn date_and_time(secs: u64) -> [u8; 24] {
    let (days, sod) = (secs / 86_400, secs % 86_400);
    // Civil date from a day count (H. Hinnant, "chrono-Compatible Low-Level Date Algorithms"),
    // in unsigned arithmetic: the day count is never negative here.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let mut b = *b"0000-00-00T00:00:00.000Z";
    put_digits(&mut b, 0, 4, year);
    put_digits(&mut b, 5, 2, month);
    put_digits(&mut b, 8, 2, day);
    put_digits(&mut b, 11, 2, sod / 3_600);
    put_digits(&mut b, 14, 2, sod / 60 % 60);
    put_digits(&mut b, 17, 2, sod % 60);
    b
}

/// [`rfc3339_ms`] through the `time` crate, for any instant.
fn rfc3339_ms_time(t: std::time::SystemTime) -> String {
    let dt = time::OffsetDateTime::from(t);
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    dt.format(&fmt)
        .unwrap_or_else(|_| "1970-01-01T00:00:00.000Z".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// The event writer is serde's encoding, byte for byte, whatever the event holds and
        /// whatever it wrote before: one writer's memory of repeated parts ([`Repeats`]) serves
        /// a few events in turn, each written three times: as generated, again (its parts
        /// copied from the memory), and with those parts' text in new allocations.
        #[test]
        fn written_events_are_the_bytes_serde_writes(
            evs in proptest::collection::vec(
                crate::event::filter::tests::generated::any_built_event(),
                1..4,
            )
        ) {
            let mut repeats = Repeats::default();
            for ev in evs.iter().chain(&evs) {
                let serde = serde_json::to_vec(ev).expect("serialises");
                let fresh = |s: &SharedStr| SharedStr::from(s.as_str());
                let mut again = ev.clone();
                again.dest.method = Cow::Owned(ev.dest.method.to_string());
                again.actor.id = fresh(&ev.actor.id);
                again.actor.grade = Cow::Owned(ev.actor.grade.to_string());
                again.session = ev.session.as_ref().map(|s| Session {
                    id: fresh(&s.id),
                    protocol: s.protocol.as_ref().map(fresh),
                    client: s.client.as_ref().map(fresh),
                    catalog: s.catalog,
                });
                for e in [ev, ev, &again] {
                    let mut ours = Vec::new();
                    write_event(&mut ours, e, &mut repeats).expect("writes");
                    proptest::prop_assert_eq!(
                        String::from_utf8_lossy(&ours),
                        String::from_utf8_lossy(&serde)
                    );
                }
            }
        }
    }

    /// What the reporter's queue carries is the filtered event's JSON, however many events
    /// share a block and whatever their sizes (one larger than a block included); an event the
    /// filter refuses is not written and leaves the next one whole; and a batch of written
    /// events is the batch of the events.
    #[test]
    fn written_events_are_the_filtered_events_json() {
        let ev: Event =
            serde_json::from_value(filter::tests::sample()).expect("the sample is an Event");
        let mut wide = ev.clone();
        wide.rec.fields = Some(
            (0..privacy::MAX_FIELDS)
                // Six bytes each once escaped (`\u0001`): past a block in all.
                .map(|i| {
                    let value = "\u{1}".repeat(privacy::MAX_VALUE_LEN);
                    (format!("note_{i:02}"), Value::String(value))
                })
                .collect(),
        );
        let mut refused = ev.clone();
        refused.dest.path_template = "no-slash".into();
        let mut writer = EventWriter::default();
        let mut held = Vec::new();
        let mut body = BatchBody::default();
        for i in 0..200 {
            let mut e = match i % 50 {
                7 => wide.clone(),
                9 => refused.clone(),
                _ => ev.clone(),
            };
            e.id = format!("{i:032x}").into();
            let want = filter_event(e.clone());
            match (writer.write(&mut e), want) {
                (Ok(w), Ok(kept)) => {
                    let json = serde_json::to_vec(&kept).expect("serialises");
                    assert_eq!(w.as_bytes(), json, "event {i}");
                    assert!(body.push_written(&w, usize::MAX));
                    held.push((w, kept));
                }
                (Err(WriteError::Filtered(_)), Err(_)) => {}
                (got, want) => panic!("event {i}: wrote {got:?}, the filter said {want:?}"),
            }
        }
        assert!(
            wide_len(&wide) > WRITE_BLOCK,
            "one event is larger than a block"
        );
        assert_eq!(held.len(), 196);
        // Held slices keep their bytes while later events fill later blocks.
        for (w, kept) in &held {
            assert_eq!(w.as_bytes(), serde_json::to_vec(kept).expect("serialises"));
        }
        let mut direct = BatchBody::default();
        for (_, kept) in &held {
            direct.push(kept).expect("encodes");
        }
        let sensor = SensorInfo {
            version: "0.1.0".into(),
            transport: "stdio".into(),
            health: None,
        };
        assert_eq!(
            body.take(&sensor, 4).expect("encodes"),
            direct.take(&sensor, 4).expect("encodes")
        );
    }

    fn wide_len(ev: &Event) -> usize {
        serde_json::to_vec(&filter_event(ev.clone()).expect("passes")).map_or(0, |v| v.len())
    }

    /// A body past its byte bound takes no more, and is left as it was; an empty one takes any
    /// event.
    #[test]
    fn a_written_event_past_the_bound_is_left_for_the_next_batch() {
        let mut ev: Event =
            serde_json::from_value(filter::tests::sample()).expect("the sample is an Event");
        let w = EventWriter::default().write(&mut ev).expect("passes");
        let n = w.as_bytes().len();
        let mut body = BatchBody::default();
        assert!(body.push_written(&w, 1), "an empty body takes any event");
        assert!(!body.push_written(&w, 2 * n), "a comma too many");
        assert_eq!((body.len(), body.events().len()), (1, n));
        assert!(body.push_written(&w, 2 * n + 1));
        assert_eq!(body.len(), 2);
    }

    /// `rec.fields` behaves as the map it replaced: key order, the last of a repeated key, the
    /// same JSON both ways.
    #[test]
    fn fields_keep_a_maps_order_and_its_last_value() {
        let f: Fields = [
            ("currency".to_string(), json!("EUR")),
            ("amount_cents".to_string(), json!(1)),
            ("Zone".to_string(), json!(true)),
            ("amount_cents".to_string(), json!(4900)),
        ]
        .into_iter()
        .collect();
        let keys: Vec<&str> = f.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["Zone", "amount_cents", "currency"]);
        assert_eq!(f.get("amount_cents"), Some(&json!(4900)));
        assert_eq!(f.get("missing"), None);
        let as_map: Map<String, Value> =
            serde_json::from_value(json!({"currency": "EUR", "amount_cents": 4900, "Zone": true}))
                .expect("a map");
        assert_eq!(f, Fields::from(as_map.clone()));
        assert_eq!(
            serde_json::to_string(&f).expect("serialises"),
            serde_json::to_string(&as_map).expect("serialises")
        );
        let back: Fields = serde_json::from_str(r#"{"b": 1, "a": 2, "b": 3}"#).expect("an object");
        assert_eq!(back, Fields::from_iter([("a", json!(2)), ("b", json!(3))]));
    }

    #[test]
    fn written_strings_escape_what_serde_escapes() {
        let mut ev: Event = serde_json::from_value(crate::event::filter::tests::sample())
            .expect("the sample is an Event");
        for s in [
            "",
            "plain",
            "quote\"",
            "back\\slash",
            "tab\t",
            "nl\n",
            "\u{1}\u{1f}",
            // Each control byte alone: the check must cover the whole range below 0x20.
            "\u{0}",
            "x\u{10}y",
            "\u{1f}",
            "\u{7f}",
            "é ✓ 😀",
            "</script>",
            "\u{2028}",
        ] {
            ev.id = s.into();
            ev.rec.action = format!("a{s}").into();
            ev.dest.host = s.into();
            ev.on_behalf_of = Some(s.into());
            ev.rec.fields = Some(
                [(format!("k{s}"), json!(s)), (s.to_string(), json!(4900))]
                    .into_iter()
                    .collect(),
            );
            let mut ours = Vec::new();
            write_event(&mut ours, &ev, &mut Repeats::default()).expect("writes");
            assert_eq!(ours, serde_json::to_vec(&ev).expect("serialises"), "{s:?}");
        }
    }

    #[test]
    fn batch_body_is_the_envelope_around_the_filtered_events() {
        let sample = filter::tests::sample();
        let ev: Event = serde_json::from_value(sample.clone()).expect("the sample is an Event");
        let want = validate_and_filter_event(&sample).expect("the sample passes");
        let sensor = SensorInfo {
            version: "0.1.0".into(),
            transport: "stdio".into(),
            health: None,
        };
        let schema = filter::tests::batch_validator();
        let mut body = BatchBody::default();
        let empty = body.take(&sensor, 3).expect("encodes");
        let empty: Value = serde_json::from_slice(&empty).expect("JSON");
        assert_eq!(
            empty,
            json!({"v": 2, "sensor": {"version": "0.1.0", "transport": "stdio"},
                   "dropped": 3, "events": []})
        );
        for n in [1usize, 3, MAX_BATCH_EVENTS] {
            for _ in 0..n {
                let kept = filter_event(ev.clone()).expect("passes L3");
                body.push(&kept).expect("encodes");
            }
            assert_eq!(body.len(), n);
            let bytes = body.take(&sensor, 7).expect("encodes");
            assert!(body.is_empty(), "take empties the body");
            let batch: Value = serde_json::from_slice(&bytes).expect("a batch is JSON");
            assert!(schema.is_valid(&batch), "{batch}");
            assert_eq!(batch["dropped"], json!(7));
            let events = batch["events"].as_array().expect("events");
            assert_eq!(events.len(), n);
            assert!(
                events.iter().all(|e| *e == want),
                "each event as L3 leaves it"
            );
        }
    }

    /// The head goes into the room before the events when it fits (the longest head the sensor
    /// can write does) and is copied in front of them when it does not; both give the same
    /// batch, and the body is reusable after either.
    #[test]
    fn a_batch_is_the_same_whether_its_head_fits_the_room_or_not() {
        let ev: Event =
            serde_json::from_value(filter::tests::sample()).expect("the sample is an Event");
        let kept = filter_event(ev).expect("passes L3");
        let full = health::MAX_HEALTH_COUNT;
        let longest = SensorInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            transport: "stdio".into(),
            health: Some(health::Health {
                stdout_non_json: full,
                oversize_frames: full,
                orphan_responses: full,
                unobserved: full,
                tap_dropped_bytes: full,
            }),
        };
        let head = serde_json::to_vec(&BatchHead {
            v: BATCH_VERSION,
            sensor: &longest,
            dropped: u64::MAX,
        })
        .expect("encodes");
        assert!(
            head.len() - 1 + LEAD.len() <= HEAD_ROOM,
            "the longest head the sensor writes fits the room: {} bytes",
            head.len()
        );
        let too_long = SensorInfo {
            version: "9".repeat(HEAD_ROOM),
            ..longest.clone()
        };
        let mut body = BatchBody::default();
        for sensor in [&longest, &too_long, &longest] {
            for _ in 0..3 {
                body.push(&kept).expect("encodes");
            }
            let bytes = body.take(sensor, u64::MAX).expect("encodes");
            assert!(body.is_empty() && body.events().is_empty());
            let batch: Value = serde_json::from_slice(&bytes).expect("a batch is JSON");
            let want_events = vec![serde_json::to_value(&kept).expect("encodes"); 3];
            assert_eq!(
                batch,
                json!({"v": 2, "sensor": sensor, "dropped": u64::MAX, "events": want_events})
            );
        }
    }

    #[test]
    fn hand_written_timestamps_match_the_time_crate() {
        use std::time::{Duration, UNIX_EPOCH};
        let mut instants = vec![
            0,
            59,
            86_399,
            86_400,
            951_782_400,   // 2000-02-29
            951_868_800,   // 2000-03-01
            4_107_456_000, // 2100-02-28
            SECS_TO_YEAR_10000 - 1,
        ];
        // A deterministic spread over the whole range (an LCG), plus every day of a few years.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..200_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            instants.push((x >> 11) % SECS_TO_YEAR_10000);
        }
        instants.extend((0..4 * 366).map(|d| 1_767_225_600 + d * 86_400 + d * 37 % 86_400));
        for (i, s) in instants.into_iter().enumerate() {
            let nanos = (s.wrapping_mul(2_654_435_761) % 1_000_000_000) as u32;
            let nanos = if i % 3 == 0 { 999_999_999 } else { nanos };
            let t = UNIX_EPOCH + Duration::new(s, nanos);
            assert_eq!(rfc3339_ms(t), rfc3339_ms_time(t), "{s}.{nanos}");
            // The same second again, its text now remembered.
            let again = UNIX_EPOCH + Duration::new(s, nanos / 7);
            assert_eq!(rfc3339_ms(again), rfc3339_ms_time(again), "{s}.{nanos} / 7");
        }
        let past = UNIX_EPOCH - Duration::from_millis(1_500);
        assert_eq!(rfc3339_ms(past), "1969-12-31T23:59:58.500Z");
    }

    /// Instants of one millisecond share one text; the next millisecond, an earlier one and
    /// one before the epoch each get their own, and every text is `rfc3339_ms`'s.
    #[test]
    fn stamps_share_a_millisecond_and_only_that() {
        use std::time::{Duration, UNIX_EPOCH};
        let mut stamps = Stamps::default();
        let t = UNIX_EPOCH + Duration::new(1_764_979_200, 123_000_000);
        let first = stamps.at(t);
        assert_eq!(first.as_str(), rfc3339_ms(t));
        let same_ms = stamps.at(t + Duration::from_micros(999));
        assert!(same_ms.same(&first), "one allocation for the millisecond");
        let next = stamps.at(t + Duration::from_millis(1));
        assert_eq!(next.as_str(), "2025-12-06T00:00:00.124Z");
        assert!(!next.same(&first));
        let back = stamps.at(t);
        assert_eq!(back, first);
        assert!(!back.same(&next), "an earlier millisecond is made anew");
        let past = UNIX_EPOCH - Duration::from_millis(1_500);
        assert_eq!(stamps.at(past).as_str(), "1969-12-31T23:59:58.500Z");
    }

    #[test]
    fn hex_matches_two_digit_format() {
        let b: Vec<u8> = (0..=255).collect();
        let want: String = b.iter().map(|x| format!("{x:02x}")).collect();
        assert_eq!(hex_lower(&b), want);
        let id = new_event_id();
        assert_eq!(id.len(), 32);
        assert!(id
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        assert_ne!(id, new_event_id());
    }

    /// An id held inline and the same text held as a `String` are one id: equal, hashed alike,
    /// written alike, and read back equal.
    #[test]
    fn an_event_id_is_its_text_however_held() {
        use std::hash::BuildHasher;
        let id = new_event_id();
        let text: EventId = id.as_str().to_owned().into();
        assert!(matches!(id.0, IdText::Hex(_)) && matches!(text.0, IdText::Other(_)));
        assert_eq!(id, text);
        assert!(id == *text.as_str());
        let h = std::collections::hash_map::RandomState::new();
        assert_eq!(h.hash_one(&id), h.hash_one(&text));
        let json = serde_json::to_string(&id).expect("serialises");
        assert_eq!(json, format!("\"{}\"", text.as_str()));
        assert_eq!(json, serde_json::to_string(&text).expect("serialises"));
        let back: EventId = serde_json::from_str(&json).expect("deserialises");
        assert_eq!(back, id);
        assert_eq!(
            format!("{id} {id:?}"),
            format!("{} {:?}", text.as_str(), text.as_str())
        );
        assert_ne!(id, EventId::from("0123456789abcdef0123456789abcdef"));
    }

    /// What [`new_event_id`] gives when the OS generator fails: such an event is never sent.
    #[test]
    fn an_event_without_an_id_does_not_pass_l3() {
        let mut ev: Event = serde_json::from_value(filter::tests::sample()).expect("an Event");
        ev.id = String::new().into();
        assert!(filter_event(ev.clone()).is_err());
        let as_json = serde_json::to_value(&ev).expect("serialises");
        assert!(validate_and_filter_event(&as_json).is_err());
    }

    #[test]
    fn pooled_ids_stay_unique_across_refills() {
        let n = 3 * crate::random::POOL_BYTES / 16 + 7;
        let ids: std::collections::HashSet<EventId> = (0..n).map(|_| new_event_id()).collect();
        assert_eq!(ids.len(), n);
    }
}
