//! What the ingest stores and the promises every store keeps: the rows the server hands over,
//! the outcomes it gets back, and the [`Store`] trait the server, the admin API and the live
//! view call. [`sqlite`] is the embedded store (the default); [`postgres`] is the store for
//! several replicas over one PostgreSQL database.
//!
//! Every implementation keeps these promises, and the server relies on them without knowing
//! which store runs: an outcome is reported only after the transaction holding it has
//! committed; a batch is committed whole or not at all; an event id is stored once per org
//! (a retried batch counts as duplicates); a batch whose key was revoked before it reached the
//! store stores nothing; [`Store::key`] answers the key as last committed by anyone sharing the
//! database (SQLite, owned by one process, from memory; PostgreSQL from the database, see
//! [`postgres`]); no blocking database call runs on an async worker thread. A store never sees a raw request:
//! rows arrive filtered and stamped by the server.

use std::collections::BTreeMap;

use futures_util::future::BoxFuture;
use serde::Serialize;
use serde_json::{Map, Value};

pub mod postgres;
pub mod sqlite;

pub use sqlite::SqliteStore;

/// What a [`Store`] call returns: a boxed future, so that the server can hold any store behind
/// one `Arc<dyn Store>`.
pub type StoreFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// The ingest's database, whichever it is.
pub trait Store: Send + Sync {
    /// The key as last committed, by this process or any other sharing the database.
    fn key(&self, key_id: String) -> StoreFuture<'_, Option<KeyRecord>>;
    /// Every key, revoked ones included, as last committed.
    fn key_records(&self) -> StoreFuture<'_, Vec<KeyRecord>>;
    /// Stores a batch; resolves after the commit.
    fn write_batch(&self, batch: BatchWrite) -> StoreFuture<'_, BatchOutcome>;
    /// Stores a new key; resolves after the commit.
    fn mint(&self, key: KeyRecord) -> StoreFuture<'_, ()>;
    /// Revokes a key; resolves after the commit, when no later batch can pass.
    fn revoke(&self, key_id: String, at: String) -> StoreFuture<'_, RevokeOutcome>;
    /// Stored events matching `q`, newest (most recently received) first.
    fn events(&self, q: EventQuery) -> StoreFuture<'_, Vec<Value>>;
    /// Stored events after store sequence `after`, oldest first, at most `limit`, each with its
    /// sequence and its stored text; without `after`, the newest `limit`, oldest first.
    fn events_after(&self, after: Option<i64>, limit: u32) -> StoreFuture<'_, Vec<(i64, String)>>;
    /// Stored events received at or after `since` (RFC 3339), for `org` or every org, newest
    /// first, at most `limit`.
    fn events_received_since(
        &self,
        since: String,
        org: Option<String>,
        limit: u32,
    ) -> StoreFuture<'_, Vec<Value>>;
    /// Counts per org/actor/action/class and sums of the numeric `rec.fields`.
    fn rollups(&self, org: Option<String>) -> StoreFuture<'_, Vec<Rollup>>;
    /// Per-sensor counters.
    fn sensors(&self) -> StoreFuture<'_, Vec<SensorStats>>;
    /// Tools per host with the definition hashes seen, drift and inconsistency flags.
    fn tools(&self, org: Option<String>) -> StoreFuture<'_, Vec<ToolView>>;
    /// Error groups (most frequent first) and the largest catalog per host (largest first).
    fn evidence_rollups(
        &self,
        org: Option<String>,
    ) -> StoreFuture<'_, (Vec<ErrorGroup>, Vec<CatalogView>)>;
    /// Finishes the writes already accepted and releases the database.
    fn close(&self) -> BoxFuture<'_, ()>;
}

/// A store failure. Never caused by what a client sent: the server maps it to 503.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Shown with its whole source chain: the driver's own text is only `db error`, the
    /// server's message is in its source.
    #[error("postgres: {}", chain(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("postgres pool: {0}")]
    Pool(String),
    #[error("the store is shut down")]
    Closed,
    #[error("read task failed: {0}")]
    Join(String),
    #[error("transaction failed: {0}")]
    Transaction(String),
}

/// `error: source: source's source…`, one line: what a log needs of an error whose `Display`
/// leaves the cause to its source (tokio-postgres' `db error`, `error connecting to server`).
/// Line breaks within a message (the server's `DETAIL`, `HINT`) become `; `.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        // Some errors repeat their source in their own text.
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = s.source();
    }
    out.replace('\n', "; ")
}

/// A sensor key as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyRecord {
    #[serde(rename = "keyId")]
    pub key_id: String,
    pub org: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(rename = "createdAt")]
    pub created_at: String,
    #[serde(rename = "revokedAt", skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
}

/// One event ready to insert: the stored JSON plus the columns queries filter on.
#[derive(Debug, Clone)]
pub struct EventRow {
    pub id: String,
    pub actor: String,
    pub action: String,
    pub class: String,
    /// The stored event (filtered envelope plus `org`, `sensor`, `receivedAt`), serialised.
    pub body: String,
    /// What the aggregates take from it (applied only when the event is new).
    pub evidence: Evidence,
}

/// The evidence fields of one stored event, for the aggregate tables.
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    pub host: String,
    /// When the sensor saw it (its `ts` in UTC), else when it was received.
    pub seen: String,
    /// `rec.toolDef` and, for drift, `rec.prevToolDef`.
    pub tool_defs: Vec<String>,
    /// `err.fp`, `err.kind`, `err.code`.
    pub error: Option<(String, String, Option<i64>)>,
    /// `session.catalog`: tools, bytes.
    pub catalog: Option<(Option<u64>, u64)>,
}

/// A batch ready for the writer.
#[derive(Debug, Clone)]
pub struct BatchWrite {
    pub key_id: String,
    pub org: String,
    pub received_at: String,
    pub rows: Vec<EventRow>,
    /// The sensor's own `dropped` counter for this batch.
    pub dropped: u64,
    /// The sensor's `health` counts for this batch (zero when it sent none).
    pub health: crate::event::health::Health,
    pub sensor_version: Option<String>,
    pub sensor_transport: Option<String>,
}

/// What the writer did with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Committed: how many rows were new and how many ids were already stored.
    Stored { accepted: u64, duplicates: u64 },
    /// The key was revoked (or removed) before the batch reached the writer; nothing stored.
    KeyRevoked,
}

/// What a revocation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevokeOutcome {
    Revoked,
    AlreadyRevoked,
    Unknown,
}

/// Filters for `GET /v1/events`.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    pub org: Option<String>,
    pub actor: Option<String>,
    pub action: Option<String>,
    pub class: Option<String>,
    pub limit: u32,
}

/// One rollup row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rollup {
    pub org: String,
    pub actor: String,
    pub action: String,
    pub class: String,
    pub count: u64,
    pub sums: Map<String, Value>,
}

/// Per-sensor counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SensorStats {
    #[serde(rename = "keyId")]
    pub key_id: String,
    pub batches: u64,
    pub accepted: u64,
    /// Sum of the `dropped` counters the sensor reported: events it could not deliver.
    pub dropped: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    #[serde(rename = "lastSeen", skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<String>,
    /// Sums of the sensor's `health` counts.
    pub health: crate::event::health::Health,
}

/// `GET /v1/tools`: one definition hash of one host's tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolDefSeen {
    pub def: String,
    #[serde(rename = "firstSeen")]
    pub first_seen: String,
    #[serde(rename = "lastSeen")]
    pub last_seen: String,
    /// Sensors (keys) that saw it.
    pub sensors: u64,
}

/// `GET /v1/tools`: one host's tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolView {
    pub org: String,
    pub host: String,
    pub tool: String,
    /// Oldest first.
    pub defs: Vec<ToolDefSeen>,
    /// A sensor saw the definition replaced over time (two hashes, one after the other).
    pub changed: bool,
    /// Two sensors saw different hashes within the same hour: the server shows different
    /// definitions to different clients.
    pub inconsistent: bool,
}

/// A tool by org, host and name.
pub(crate) type ToolKey = (String, String, String);

/// `GET /v1/tools` put together from the three reads every store makes (each definition seen,
/// the tools a sensor saw change, the tools two sensors saw differently within an hour), so the
/// answer's shape and order are the same whichever database holds the rows.
#[derive(Default)]
pub(crate) struct ToolViews(BTreeMap<ToolKey, ToolView>);

impl ToolViews {
    pub(crate) fn seen(&mut self, key: ToolKey, seen: ToolDefSeen) {
        self.0
            .entry(key)
            .or_insert_with_key(|(org, host, tool)| ToolView {
                org: org.clone(),
                host: host.clone(),
                tool: tool.clone(),
                defs: Vec::new(),
                changed: false,
                inconsistent: false,
            })
            .defs
            .push(seen);
    }

    pub(crate) fn changed(&mut self, key: &ToolKey) {
        if let Some(t) = self.0.get_mut(key) {
            t.changed = true;
        }
    }

    pub(crate) fn inconsistent(&mut self, key: &ToolKey) {
        if let Some(t) = self.0.get_mut(key) {
            t.inconsistent = true;
        }
    }

    /// Tools in key order, each one's definitions oldest first.
    pub(crate) fn finish(self) -> Vec<ToolView> {
        let mut out: Vec<ToolView> = self.0.into_values().collect();
        for t in &mut out {
            t.defs
                .sort_by(|a, b| a.first_seen.cmp(&b.first_seen).then(a.def.cmp(&b.def)));
        }
        out
    }
}

/// `GET /v1/rollups`: one error group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorGroup {
    pub org: String,
    pub fp: String,
    pub tool: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<i64>,
    pub count: u64,
    #[serde(rename = "firstSeen")]
    pub first_seen: String,
    #[serde(rename = "lastSeen")]
    pub last_seen: String,
}

/// `GET /v1/rollups`: the largest catalog seen on one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CatalogView {
    pub org: String,
    pub host: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<u64>,
    pub bytes: u64,
    #[serde(rename = "lastSeen")]
    pub last_seen: String,
}

/// Most error groups and catalogs listed in one rollups answer (largest first).
pub const MAX_ROLLUP_EVIDENCE: u32 = 1000;
