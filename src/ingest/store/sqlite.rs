//! The embedded store (the default [`Store`]): one SQLite file (WAL) holding keys, events and
//! per-sensor counters.
//!
//! Owns the schema (created on first start), the single writer thread and a small pool of read
//! connections. Goes in: prepared rows (already filtered and stamped by the server), key mints
//! and revocations, and read queries. Comes out: outcomes that are only reported once the
//! transaction holding them has committed.
//!
//! Durability: WAL with `synchronous=FULL`, so a commit is fsynced before it is acknowledged and
//! an accepted event survives a power cut, not only a process crash. The cost (one fsync per
//! commit) is paid once per *group* of batches: the writer drains every job already queued into
//! one transaction (group commit), each batch in its own savepoint so one failure stays local.
//! WAL checkpoints run on their own thread so a checkpoint never stalls a commit.
//!
//! It never runs SQLite on an async worker thread: writes go to the writer thread over a
//! channel, reads run inside `spawn_blocking`.
//!
//! Files at rest: the database file is created by us, owner-only (0600), with `O_CREAT|O_EXCL`
//! before SQLite opens it, so it never exists with wider permissions, not even for an instant
//! (no umask is touched: the umask is per process, and an embedding program's other threads
//! would see it changed). SQLite gives the `-wal` and `-shm` files it creates the database
//! file's permission bits, so they are 0600 too. An existing file keeps its mode (the ingest
//! warns about a wide one at start).
//!
//! Whose database: before any statement that could change the file (the WAL switch included),
//! a read-only connection reads `application_id`, `user_version` and the table names. An empty
//! file is initialised (schema, [`SCHEMA_VERSION`], [`APPLICATION_ID`]) in one transaction; a
//! database of ours at [`SCHEMA_VERSION`] is opened (one from a build before the application id
//! gets it stamped), and one at an older version is first brought up to it by [`MIGRATIONS`],
//! in one transaction; anything else (another program's database, a newer schema, a file that is
//! not SQLite) is refused and left byte for byte as it was.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use serde_json::{Map, Number, Value};
use tokio::sync::{mpsc, oneshot};

use super::{
    BatchOutcome, BatchWrite, CatalogView, ErrorGroup, EventQuery, EventRow, KeyRecord,
    RevokeOutcome, Rollup, SensorStats, Store, StoreError, StoreFuture, ToolDefSeen, ToolKey,
    ToolView, ToolViews, MAX_ROLLUP_EVIDENCE,
};
use crate::ingest::IngestError;
use crate::lock::lock;

/// Jobs waiting for the writer; beyond this, senders wait (back-pressure on the HTTP handlers).
const WRITER_QUEUE: usize = 1024;
/// Most jobs folded into one transaction: bounds the latency of the first job in a group.
const MAX_GROUP_JOBS: usize = 64;
/// How long a connection waits on a lock held by another before failing.
const BUSY_TIMEOUT_MS: u64 = 5_000;
/// Read connections kept open between requests.
const MAX_IDLE_READERS: usize = 4;
/// Writer page cache (KiB, as `PRAGMA cache_size` takes a negative number). Event ids are random,
/// so each batch touches pages all over the de-duplication index; keeping the index hot saves
/// re-reading them.
const WRITER_CACHE_KIB: i64 = 32 * 1024;
/// How often the checkpointer thread copies the WAL back into the database. Checkpoints run
/// there, not in the writer: a checkpoint inside a commit stalled that commit (and every batch
/// waiting on it) for 100+ ms. A passive checkpoint never blocks the writer.
const CHECKPOINT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);
/// Backstop: WAL pages (× 4 KiB = 64 MiB) after which the writer checkpoints by itself, should
/// the checkpointer fall behind (under a sustained full-speed stream it does; this bounds the
/// WAL file). Random index inserts dirty hundreds of pages per batch; with SQLite's default
/// (1000 pages) the writer checkpointed every few batches: ~40% more writer CPU, measured.
const WAL_AUTOCHECKPOINT_PAGES: i64 = 16 * 1024;
/// After a checkpoint, the WAL file is truncated back to at most this size.
const WAL_SIZE_LIMIT_BYTES: i64 = 64 * 1024 * 1024;
/// Schema version in `PRAGMA user_version`: [`SCHEMA`] is version 1, and each of
/// [`MIGRATIONS`] takes the database one version further.
pub const SCHEMA_VERSION: i64 = 2;
/// `PRAGMA application_id` of our databases ("BdIn"): tells our file from another program's
/// SQLite file with a `user_version` that happens to match.
pub const APPLICATION_ID: i64 = 0x4264_496E;
/// The tables of [`SCHEMA`]: a database without an application id is taken as ours (made by a
/// build before the id) only when it has all of them.
const TABLES: [&str; 3] = ["events", "keys", "sensors"];

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS keys (
    key_id     TEXT PRIMARY KEY,
    org        TEXT NOT NULL,
    name       TEXT,
    created_at TEXT NOT NULL,
    revoked_at TEXT
);
CREATE TABLE IF NOT EXISTS events (
    seq         INTEGER PRIMARY KEY,
    id          TEXT NOT NULL,
    org         TEXT NOT NULL,
    sensor      TEXT NOT NULL,
    actor       TEXT NOT NULL,
    action      TEXT NOT NULL,
    class       TEXT NOT NULL,
    received_at TEXT NOT NULL,
    body        TEXT NOT NULL
);
-- De-duplication is per org: another org's sensor cannot suppress our events by replaying ids.
-- It is the only index: every index is paid on each insert, and reads (newest first by seq,
-- filtered by org through this index's prefix) are rare next to writes.
CREATE UNIQUE INDEX IF NOT EXISTS events_org_id ON events(org, id);
CREATE TABLE IF NOT EXISTS sensors (
    key_id    TEXT PRIMARY KEY,
    batches   INTEGER NOT NULL DEFAULT 0,
    accepted  INTEGER NOT NULL DEFAULT 0,
    dropped   INTEGER NOT NULL DEFAULT 0,
    version   TEXT,
    transport TEXT,
    last_seen TEXT
);
";

/// The layout changes after version 1, in order: `(version reached, statements)`. A database of
/// an older version is brought up to [`SCHEMA_VERSION`] on open, in one transaction. One that
/// shipped is never edited: a change is a new entry.
const MIGRATIONS: [(i64, &str); 1] = [(2, MIGRATION_2_EVIDENCE)];

/// Version 2: the fleet view of tool definitions (`GET /v1/tools`), error groups and catalog
/// sizes (`GET /v1/rollups`), and the sensors' health counters (`GET /v1/admin/sensors`).
/// Aggregates kept as events are stored, so reads never scan the events: each table grows with
/// distinct hashes, fingerprints and hosts, not with traffic.
const MIGRATION_2_EVIDENCE: &str = "
-- One row per definition hash a sensor saw for a host's tool in an hour (the hour makes
-- `inconsistent` a lookup, and bounds a row's span).
CREATE TABLE tool_defs (
    org        TEXT NOT NULL,
    host       TEXT NOT NULL,
    tool       TEXT NOT NULL,
    def        TEXT NOT NULL,
    sensor     TEXT NOT NULL,
    hour       TEXT NOT NULL,
    first_seen TEXT NOT NULL,
    last_seen  TEXT NOT NULL,
    PRIMARY KEY (org, host, tool, def, sensor, hour)
) WITHOUT ROWID;
CREATE TABLE error_groups (
    org        TEXT NOT NULL,
    fp         TEXT NOT NULL,
    tool       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    code       INTEGER,
    count      INTEGER NOT NULL,
    first_seen TEXT NOT NULL,
    last_seen  TEXT NOT NULL,
    PRIMARY KEY (org, fp, tool)
) WITHOUT ROWID;
-- The largest catalog seen per host.
CREATE TABLE catalogs (
    org       TEXT NOT NULL,
    host      TEXT NOT NULL,
    tools     INTEGER,
    bytes     INTEGER NOT NULL,
    last_seen TEXT NOT NULL,
    PRIMARY KEY (org, host)
) WITHOUT ROWID;
ALTER TABLE sensors ADD COLUMN stdout_non_json INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sensors ADD COLUMN oversize_frames INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sensors ADD COLUMN orphan_responses INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sensors ADD COLUMN unobserved INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sensors ADD COLUMN tap_dropped_bytes INTEGER NOT NULL DEFAULT 0;
";

/// Brings `conn` from `from` to [`SCHEMA_VERSION`] in one transaction (a crash leaves the old
/// version, whole).
fn migrate(conn: &mut Connection, from: i64) -> Result<(), rusqlite::Error> {
    if from >= SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for (version, sql) in MIGRATIONS {
        if version > from {
            tx.execute_batch(sql)?;
        }
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()
}

enum Job {
    Batch(
        BatchWrite,
        oneshot::Sender<Result<BatchOutcome, StoreError>>,
    ),
    Mint(KeyRecord, oneshot::Sender<Result<(), StoreError>>),
    Revoke(
        String,
        String,
        oneshot::Sender<Result<RevokeOutcome, StoreError>>,
    ),
}

type KeyCache = Arc<RwLock<HashMap<String, KeyRecord>>>;

/// Handle on the store. Cheap to share behind an `Arc`.
pub struct SqliteStore {
    path: PathBuf,
    writer: Mutex<Option<mpsc::Sender<Job>>>,
    writer_thread: Mutex<Option<JoinHandle<()>>>,
    /// Stop signal and handle of the checkpointer thread.
    checkpointer: Mutex<Option<(std::sync::mpsc::Sender<()>, JoinHandle<()>)>>,
    keys: KeyCache,
    readers: Arc<Mutex<Vec<Connection>>>,
}

fn open_conn(path: &Path, read_only: bool) -> Result<Connection, rusqlite::Error> {
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(std::time::Duration::from_millis(BUSY_TIMEOUT_MS))?;
    if !read_only {
        // journal_mode is stored in the file; synchronous is per connection, and only the
        // writer's matters.
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0))?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)?;
        conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
        conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT_BYTES)?;
    }
    Ok(conn)
}

/// `<db><suffix>`: SQLite's `-wal` and `-shm` files beside the database.
pub fn sidecar_path(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// Creates the database file owner-only if it does not exist yet (see the module docs).
fn create_owner_only(path: &Path) -> std::io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    match opts.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// What [`probe`] found in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// No schema at all: ours to initialise.
    Empty,
    /// Ours, at `version` (at most [`SCHEMA_VERSION`]); `stamped` is false for one made before
    /// [`APPLICATION_ID`].
    Current { stamped: bool, version: i64 },
}

/// Reads, without writing anything, whose database `path` is (see the module docs).
fn probe(path: &Path) -> Result<Layout, IngestError> {
    let foreign = |detail: String| IngestError::ForeignDatabase {
        path: path.to_path_buf(),
        detail,
    };
    // SQLite takes an empty file for an empty database.
    if std::fs::metadata(path)
        .map(|m| m.len() == 0)
        .unwrap_or(false)
    {
        return Ok(Layout::Empty);
    }
    let sqlite_err = |e: rusqlite::Error| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => foreign("not an SQLite database".into()),
        _ => IngestError::Store {
            path: path.to_path_buf(),
            source: e,
        },
    };
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite_err)?;
    conn.busy_timeout(std::time::Duration::from_millis(BUSY_TIMEOUT_MS))
        .map_err(sqlite_err)?;
    let app: i64 = conn
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .map_err(sqlite_err)?;
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(sqlite_err)?;
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())
        .map_err(sqlite_err)?;
    drop(conn);
    let ours =
        app == APPLICATION_ID || (app == 0 && TABLES.iter().all(|t| tables.iter().any(|n| n == t)));
    let newer = || IngestError::SchemaVersion {
        path: path.to_path_buf(),
        found: version,
        known: SCHEMA_VERSION,
    };
    match (app, version) {
        (0, 0) if tables.is_empty() => Ok(Layout::Empty),
        // Ours; without the application id it was made by an earlier build (which could stop
        // between creating the tables and setting the version: 0).
        _ if ours && ((1..=SCHEMA_VERSION).contains(&version) || (app == 0 && version == 0)) => {
            Ok(Layout::Current {
                stamped: app == APPLICATION_ID,
                version: version.max(1),
            })
        }
        (APPLICATION_ID, _) => Err(newer()),
        // A newer layout without one of today's tables still names itself by its version.
        (0, v) if v > SCHEMA_VERSION && tables.iter().any(|n| n == "keys") => Err(newer()),
        _ => Err(foreign(format!(
            "application_id {app:#x}, user_version {version}, tables [{}]",
            tables.join(", ")
        ))),
    }
}

impl SqliteStore {
    /// Opens (creating on first start) the database at `path` and starts the writer thread.
    /// A database that is not ours, or of a newer schema, is refused untouched.
    pub fn open(path: &Path) -> Result<Arc<SqliteStore>, IngestError> {
        let open_err = |source| IngestError::Store {
            path: path.to_path_buf(),
            source,
        };
        create_owner_only(path).map_err(|source| IngestError::DbFile {
            path: path.to_path_buf(),
            source,
        })?;
        let layout = probe(path)?;
        let mut conn = open_conn(path, false).map_err(open_err)?;
        match layout {
            Layout::Empty => {
                // One transaction: a crash leaves an empty file, never a half-made schema.
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(open_err)?;
                tx.execute_batch(SCHEMA).map_err(open_err)?;
                for (_, sql) in MIGRATIONS {
                    tx.execute_batch(sql).map_err(open_err)?;
                }
                tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                    .map_err(open_err)?;
                tx.pragma_update(None, "application_id", APPLICATION_ID)
                    .map_err(open_err)?;
                tx.commit().map_err(open_err)?;
            }
            Layout::Current { stamped, version } => {
                if !stamped {
                    conn.pragma_update(None, "user_version", version)
                        .map_err(open_err)?;
                    conn.pragma_update(None, "application_id", APPLICATION_ID)
                        .map_err(open_err)?;
                }
                migrate(&mut conn, version).map_err(open_err)?;
            }
        }
        let keys = load_keys(&conn).map_err(open_err)?;
        let keys: KeyCache = Arc::new(RwLock::new(keys));

        let (tx, rx) = mpsc::channel(WRITER_QUEUE);
        let cache = keys.clone();
        let thread = std::thread::Builder::new()
            .name("ingest-writer".into())
            .spawn(move || writer_loop(conn, rx, cache))
            .map_err(|source| IngestError::Thread { source })?;
        let ckpt_conn = open_conn(path, false).map_err(open_err)?;
        let (stop_tx, stop_rx) = std::sync::mpsc::channel();
        let ckpt = std::thread::Builder::new()
            .name("ingest-checkpoint".into())
            .spawn(move || checkpointer_loop(ckpt_conn, stop_rx))
            .map_err(|source| IngestError::Thread { source })?;
        Ok(Arc::new(SqliteStore {
            path: path.to_path_buf(),
            writer: Mutex::new(Some(tx)),
            writer_thread: Mutex::new(Some(thread)),
            checkpointer: Mutex::new(Some((stop_tx, ckpt))),
            keys,
            readers: Arc::new(Mutex::new(Vec::new())),
        }))
    }

    /// The key as last committed, from memory (kept in step by the writer after each commit).
    pub fn key(&self, key_id: &str) -> Option<KeyRecord> {
        crate::lock::read(&self.keys).get(key_id).cloned()
    }

    fn sender(&self) -> Result<mpsc::Sender<Job>, StoreError> {
        lock(&self.writer).clone().ok_or(StoreError::Closed)
    }

    async fn submit<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Job,
    ) -> Result<T, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.sender()?
            .send(make(tx))
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Stores a batch; resolves after the commit.
    pub async fn write_batch(&self, batch: BatchWrite) -> Result<BatchOutcome, StoreError> {
        self.submit(|tx| Job::Batch(batch, tx)).await
    }

    /// Stores a new key; resolves after the commit.
    pub async fn mint(&self, key: KeyRecord) -> Result<(), StoreError> {
        self.submit(|tx| Job::Mint(key, tx)).await
    }

    /// Revokes a key; resolves after the commit, when no later batch can pass.
    pub async fn revoke(&self, key_id: String, at: String) -> Result<RevokeOutcome, StoreError> {
        self.submit(|tx| Job::Revoke(key_id, at, tx)).await
    }

    /// Runs `f` on a read connection on the blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, rusqlite::Error> + Send + 'static,
    ) -> Result<T, StoreError> {
        let path = self.path.clone();
        let pool = self.readers.clone();
        tokio::task::spawn_blocking(move || {
            let conn = match lock(&pool).pop() {
                Some(c) => c,
                None => open_conn(&path, true)?,
            };
            let out = f(&conn);
            let mut idle = lock(&pool);
            if idle.len() < MAX_IDLE_READERS {
                idle.push(conn);
            }
            Ok(out?)
        })
        .await
        .map_err(|e| StoreError::Join(e.to_string()))?
    }

    /// Stored events matching `q`, newest (most recently received) first.
    pub async fn events(&self, q: EventQuery) -> Result<Vec<Value>, StoreError> {
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT body FROM events
                 WHERE (?1 IS NULL OR org = ?1) AND (?2 IS NULL OR actor = ?2)
                   AND (?3 IS NULL OR action = ?3) AND (?4 IS NULL OR class = ?4)
                 ORDER BY seq DESC LIMIT ?5",
            )?;
            bodies(&mut st, params![q.org, q.actor, q.action, q.class, q.limit])
        })
        .await
    }

    /// Stored events after store sequence `after`, oldest first, at most `limit`, each with its
    /// sequence and its stored text. Without `after`: the newest `limit` events, oldest first
    /// (the live view's backlog before its live ones).
    pub async fn events_after(
        &self,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        self.read(move |c| {
            let mut st = match after {
                Some(_) => c.prepare_cached(
                    "SELECT seq, body FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                )?,
                None => c.prepare_cached(
                    "SELECT seq, body FROM
                       (SELECT seq, body FROM events WHERE ?1 IS NULL ORDER BY seq DESC LIMIT ?2)
                     ORDER BY seq",
                )?,
            };
            let rows = st.query_map(params![after, limit], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect()
        })
        .await
    }

    /// Stored events received at or after `since` (RFC 3339, as `receivedAt` is written), for
    /// `org` or every org, newest first, at most `limit`.
    pub async fn events_received_since(
        &self,
        since: String,
        org: Option<String>,
        limit: u32,
    ) -> Result<Vec<Value>, StoreError> {
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT body FROM events WHERE received_at >= ?1 AND (?2 IS NULL OR org = ?2)
                 ORDER BY seq DESC LIMIT ?3",
            )?;
            bodies(&mut st, params![since, org, limit])
        })
        .await
    }

    /// Every key, revoked ones included (from the in-memory cache the writer keeps current).
    pub fn key_records(&self) -> Vec<KeyRecord> {
        crate::lock::read(&self.keys).values().cloned().collect()
    }

    /// Counts per org/actor/action/class and sums of the numeric `rec.fields`.
    pub async fn rollups(&self, org: Option<String>) -> Result<Vec<Rollup>, StoreError> {
        self.read(move |c| {
            type Group = (String, String, String, String);
            let mut groups: BTreeMap<Group, Rollup> = BTreeMap::new();
            let mut st = c.prepare_cached(
                "SELECT org, actor, action, class, COUNT(*) FROM events
                 WHERE (?1 IS NULL OR org = ?1) GROUP BY org, actor, action, class",
            )?;
            let mut rows = st.query(params![org])?;
            while let Some(r) = rows.next()? {
                let g: Group = (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
                groups.insert(
                    g.clone(),
                    Rollup {
                        org: g.0,
                        actor: g.1,
                        action: g.2,
                        class: g.3,
                        count: r.get::<_, i64>(4)?.max(0) as u64,
                        sums: Map::new(),
                    },
                );
            }
            // TOTAL() is a float sum that cannot overflow (SUM() errors on i64 overflow, which a
            // sensor could trigger on purpose); integer-only totals are turned back into
            // integers below while they are exact.
            let mut st = c.prepare_cached(
                "SELECT e.org, e.actor, e.action, e.class, f.key, TOTAL(f.value),
                        MIN(f.type = 'integer')
                 FROM events e, json_each(e.body, '$.rec.fields') f
                 WHERE (?1 IS NULL OR e.org = ?1) AND f.type IN ('integer', 'real')
                 GROUP BY e.org, e.actor, e.action, e.class, f.key",
            )?;
            let mut rows = st.query(params![org])?;
            while let Some(r) = rows.next()? {
                let g: Group = (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
                let key: String = r.get(4)?;
                let total: f64 = r.get(5)?;
                let all_int: bool = r.get::<_, i64>(6)? == 1;
                if let Some(rollup) = groups.get_mut(&g) {
                    rollup.sums.insert(key, number(total, all_int));
                }
            }
            Ok(groups.into_values().collect())
        })
        .await
    }

    /// Per-sensor counters (batches, accepted events, sensor-reported drops).
    pub async fn sensors(&self) -> Result<Vec<SensorStats>, StoreError> {
        self.read(|c| {
            let mut st = c.prepare_cached(
                "SELECT key_id, batches, accepted, dropped, version, transport, last_seen,
                        stdout_non_json, oversize_frames, orphan_responses, unobserved,
                        tap_dropped_bytes
                 FROM sensors ORDER BY key_id",
            )?;
            let rows = st.query_map([], |r| {
                Ok(SensorStats {
                    key_id: r.get(0)?,
                    batches: counter(r, 1)?,
                    accepted: counter(r, 2)?,
                    dropped: counter(r, 3)?,
                    version: r.get(4)?,
                    transport: r.get(5)?,
                    last_seen: r.get(6)?,
                    health: crate::event::health::Health {
                        stdout_non_json: counter(r, 7)?,
                        oversize_frames: counter(r, 8)?,
                        orphan_responses: counter(r, 9)?,
                        unobserved: counter(r, 10)?,
                        tap_dropped_bytes: counter(r, 11)?,
                    },
                })
            })?;
            rows.collect()
        })
        .await
    }

    /// `GET /v1/tools`: every definition hash seen per host and tool, with the flags.
    pub async fn tools(&self, org: Option<String>) -> Result<Vec<ToolView>, StoreError> {
        self.read(move |c| {
            let mut tools = ToolViews::default();
            let key = |r: &rusqlite::Row| -> rusqlite::Result<ToolKey> {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            };
            let mut st = c.prepare_cached(
                "SELECT org, host, tool, def, MIN(first_seen), MAX(last_seen),
                        COUNT(DISTINCT sensor)
                 FROM tool_defs WHERE (?1 IS NULL OR org = ?1)
                 GROUP BY org, host, tool, def",
            )?;
            let mut rows = st.query(params![org])?;
            while let Some(r) = rows.next()? {
                let seen = ToolDefSeen {
                    def: r.get(3)?,
                    first_seen: r.get(4)?,
                    last_seen: r.get(5)?,
                    sensors: r.get::<_, i64>(6)?.max(0) as u64,
                };
                tools.seen(key(r)?, seen);
            }
            // Changed: one sensor saw two hashes. Inconsistent: two sensors, two hashes, one hour.
            let mut st = c.prepare_cached(
                "SELECT org, host, tool FROM tool_defs WHERE (?1 IS NULL OR org = ?1)
                 GROUP BY org, host, tool, sensor HAVING COUNT(DISTINCT def) > 1",
            )?;
            let mut rows = st.query(params![org])?;
            while let Some(r) = rows.next()? {
                tools.changed(&key(r)?);
            }
            let mut st = c.prepare_cached(
                "SELECT DISTINCT a.org, a.host, a.tool FROM tool_defs a JOIN tool_defs b
                   ON a.org = b.org AND a.host = b.host AND a.tool = b.tool AND a.hour = b.hour
                  AND a.sensor <> b.sensor AND a.def <> b.def
                 WHERE (?1 IS NULL OR a.org = ?1)",
            )?;
            let mut rows = st.query(params![org])?;
            while let Some(r) = rows.next()? {
                tools.inconsistent(&key(r)?);
            }
            Ok(tools.finish())
        })
        .await
    }

    /// Error groups (most frequent first) and the largest catalog per host (largest first).
    pub async fn evidence_rollups(
        &self,
        org: Option<String>,
    ) -> Result<(Vec<ErrorGroup>, Vec<CatalogView>), StoreError> {
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT org, fp, tool, kind, code, count, first_seen, last_seen FROM error_groups
                 WHERE (?1 IS NULL OR org = ?1) ORDER BY count DESC, fp LIMIT ?2",
            )?;
            let groups = st
                .query_map(params![org, MAX_ROLLUP_EVIDENCE], |r| {
                    Ok(ErrorGroup {
                        org: r.get(0)?,
                        fp: r.get(1)?,
                        tool: r.get(2)?,
                        kind: r.get(3)?,
                        code: r.get(4)?,
                        count: counter(r, 5)?,
                        first_seen: r.get(6)?,
                        last_seen: r.get(7)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut st = c.prepare_cached(
                "SELECT org, host, tools, bytes, last_seen FROM catalogs
                 WHERE (?1 IS NULL OR org = ?1) ORDER BY bytes DESC, host LIMIT ?2",
            )?;
            let catalogs = st
                .query_map(params![org, MAX_ROLLUP_EVIDENCE], |r| {
                    Ok(CatalogView {
                        org: r.get(0)?,
                        host: r.get(1)?,
                        tools: r.get::<_, Option<i64>>(2)?.map(|t| t.max(0) as u64),
                        bytes: counter(r, 3)?,
                        last_seen: r.get(4)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok((groups, catalogs))
        })
        .await
    }

    /// Stops the writer after the jobs already queued, and waits for it (the last connection
    /// closing checkpoints the WAL).
    pub async fn close(&self) {
        lock(&self.writer).take();
        let thread = lock(&self.writer_thread).take();
        let ckpt = lock(&self.checkpointer).take();
        lock(&self.readers).clear();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some((stop, t)) = ckpt {
                let _ = stop.send(());
                let _ = t.join();
            }
            if let Some(t) = thread {
                let _ = t.join();
            }
        })
        .await;
    }
}

/// The event bodies a statement selects (its first column), parsed, in its order. Bodies are
/// written by us from serde_json; one that does not parse back is skipped rather than failing
/// the whole read.
fn bodies(
    st: &mut rusqlite::CachedStatement<'_>,
    params: impl rusqlite::Params,
) -> rusqlite::Result<Vec<Value>> {
    let rows = st.query_map(params, |r| r.get::<_, String>(0))?;
    let mut out = Vec::new();
    for body in rows {
        if let Ok(v) = serde_json::from_str(&body?) {
            out.push(v);
        }
    }
    Ok(out)
}

impl Store for SqliteStore {
    // From memory: this process is the only writer of the file, and keeps the map current.
    fn key(&self, key_id: String) -> StoreFuture<'_, Option<KeyRecord>> {
        Box::pin(std::future::ready(Ok(SqliteStore::key(self, &key_id))))
    }
    fn key_records(&self) -> StoreFuture<'_, Vec<KeyRecord>> {
        Box::pin(std::future::ready(Ok(SqliteStore::key_records(self))))
    }
    fn write_batch(&self, batch: BatchWrite) -> StoreFuture<'_, BatchOutcome> {
        Box::pin(SqliteStore::write_batch(self, batch))
    }
    fn mint(&self, key: KeyRecord) -> StoreFuture<'_, ()> {
        Box::pin(SqliteStore::mint(self, key))
    }
    fn revoke(&self, key_id: String, at: String) -> StoreFuture<'_, RevokeOutcome> {
        Box::pin(SqliteStore::revoke(self, key_id, at))
    }
    fn events(&self, q: EventQuery) -> StoreFuture<'_, Vec<Value>> {
        Box::pin(SqliteStore::events(self, q))
    }
    fn events_after(&self, after: Option<i64>, limit: u32) -> StoreFuture<'_, Vec<(i64, String)>> {
        Box::pin(SqliteStore::events_after(self, after, limit))
    }
    fn events_received_since(
        &self,
        since: String,
        org: Option<String>,
        limit: u32,
    ) -> StoreFuture<'_, Vec<Value>> {
        Box::pin(SqliteStore::events_received_since(self, since, org, limit))
    }
    fn rollups(&self, org: Option<String>) -> StoreFuture<'_, Vec<Rollup>> {
        Box::pin(SqliteStore::rollups(self, org))
    }
    fn sensors(&self) -> StoreFuture<'_, Vec<SensorStats>> {
        Box::pin(SqliteStore::sensors(self))
    }
    fn tools(&self, org: Option<String>) -> StoreFuture<'_, Vec<ToolView>> {
        Box::pin(SqliteStore::tools(self, org))
    }
    fn evidence_rollups(
        &self,
        org: Option<String>,
    ) -> StoreFuture<'_, (Vec<ErrorGroup>, Vec<CatalogView>)> {
        Box::pin(SqliteStore::evidence_rollups(self, org))
    }
    fn close(&self) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(SqliteStore::close(self))
    }
}

/// A counter column as a `u64`. Written saturating, so always an integer; a REAL left by a
/// database written before counters saturated is read as its value, capped, so that one row
/// cannot make the whole sensors view fail.
fn counter(r: &rusqlite::Row<'_>, i: usize) -> Result<u64, rusqlite::Error> {
    use rusqlite::types::ValueRef;
    Ok(match r.get_ref(i)? {
        ValueRef::Integer(n) => n.max(0) as u64,
        // `as` saturates (and maps NaN to 0).
        ValueRef::Real(f) => (f as i64).max(0) as u64,
        _ => 0,
    })
}

/// Largest integer an f64 holds exactly.
const MAX_EXACT_INT: f64 = 9_007_199_254_740_992.0;

fn number(total: f64, all_int: bool) -> Value {
    if all_int && total.fract() == 0.0 && total.abs() <= MAX_EXACT_INT {
        Value::Number(Number::from(total as i64))
    } else {
        Number::from_f64(total).map_or(Value::Null, Value::Number)
    }
}

/// Copies committed WAL frames back into the database every [`CHECKPOINT_INTERVAL`] until told
/// to stop (or its `Store` is gone). Passive: it never waits for, or blocks, the writer.
fn checkpointer_loop(conn: Connection, stop: std::sync::mpsc::Receiver<()>) {
    use std::sync::mpsc::RecvTimeoutError;
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(CHECKPOINT_INTERVAL) {
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::debug!(error = %e, "Checkpoint skipped");
        }
    }
}

fn load_keys(conn: &Connection) -> Result<HashMap<String, KeyRecord>, rusqlite::Error> {
    let mut st = conn.prepare("SELECT key_id, org, name, created_at, revoked_at FROM keys")?;
    let rows = st.query_map([], |r| {
        Ok(KeyRecord {
            key_id: r.get(0)?,
            org: r.get(1)?,
            name: r.get(2)?,
            created_at: r.get(3)?,
            revoked_at: r.get(4)?,
        })
    })?;
    rows.map(|r| r.map(|k| (k.key_id.clone(), k))).collect()
}

/// A job's reply, held until the group's transaction has committed.
enum Reply {
    Batch(
        oneshot::Sender<Result<BatchOutcome, StoreError>>,
        Result<BatchOutcome, rusqlite::Error>,
    ),
    Mint(
        oneshot::Sender<Result<(), StoreError>>,
        Result<KeyRecord, rusqlite::Error>,
    ),
    Revoke(
        oneshot::Sender<Result<RevokeOutcome, StoreError>>,
        Result<(RevokeOutcome, String, String), rusqlite::Error>,
    ),
}

fn writer_loop(mut conn: Connection, mut rx: mpsc::Receiver<Job>, keys: KeyCache) {
    while let Some(first) = rx.blocking_recv() {
        let mut jobs = vec![first];
        while jobs.len() < MAX_GROUP_JOBS {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        run_group(&mut conn, jobs, &keys);
    }
}

fn run_group(conn: &mut Connection, jobs: Vec<Job>, keys: &KeyCache) {
    let mut replies = Vec::with_capacity(jobs.len());
    let mut tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            fail_all(jobs, &e);
            return;
        }
    };
    for job in jobs {
        // One savepoint per job: a failing job is rolled back alone and the rest still commit.
        let sp = match tx.savepoint() {
            Ok(sp) => sp,
            Err(e) => {
                fail_all(vec![job], &e);
                continue;
            }
        };
        let reply = match job {
            Job::Batch(b, r) => Reply::Batch(r, apply_batch(&sp, &b)),
            Job::Mint(k, r) => Reply::Mint(r, apply_mint(&sp, k)),
            Job::Revoke(id, at, r) => {
                let out = apply_revoke(&sp, &id).map(|o| (o, id, at.clone()));
                let out = match out {
                    Ok((RevokeOutcome::Revoked, id, at)) => sp
                        .execute(
                            "UPDATE keys SET revoked_at = ?2 WHERE key_id = ?1",
                            params![id, at],
                        )
                        .map(|_| (RevokeOutcome::Revoked, id, at)),
                    other => other,
                };
                Reply::Revoke(r, out)
            }
        };
        let ok = match &reply {
            Reply::Batch(_, r) => r.is_ok(),
            Reply::Mint(_, r) => r.is_ok(),
            Reply::Revoke(_, r) => r.is_ok(),
        };
        let done = if ok { sp.commit() } else { sp.finish() };
        if let Err(e) = done {
            tracing::warn!(error = %e, "Savepoint failed");
        }
        replies.push(reply);
    }
    match tx.commit() {
        Ok(()) => {
            let mut cache = crate::lock::write(keys);
            for reply in replies {
                match reply {
                    Reply::Batch(r, out) => {
                        let _ = r.send(out.map_err(StoreError::from));
                    }
                    Reply::Mint(r, out) => {
                        let _ = r.send(out.map_err(StoreError::from).map(|k| {
                            cache.insert(k.key_id.clone(), k);
                        }));
                    }
                    Reply::Revoke(r, out) => {
                        let _ = r.send(out.map_err(StoreError::from).map(|(o, id, at)| {
                            if o == RevokeOutcome::Revoked {
                                if let Some(k) = cache.get_mut(&id) {
                                    k.revoked_at = Some(at);
                                }
                            }
                            o
                        }));
                    }
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "Commit failed");
            for reply in replies {
                let err = || StoreError::Transaction(format!("commit: {e}"));
                match reply {
                    Reply::Batch(r, _) => drop(r.send(Err(err()))),
                    Reply::Mint(r, _) => drop(r.send(Err(err()))),
                    Reply::Revoke(r, _) => drop(r.send(Err(err()))),
                }
            }
        }
    }
}

fn fail_all(jobs: Vec<Job>, e: &rusqlite::Error) {
    tracing::warn!(error = %e, "Store transaction failed");
    let err = || StoreError::Transaction(e.to_string());
    for job in jobs {
        match job {
            Job::Batch(_, r) => drop(r.send(Err(err()))),
            Job::Mint(_, r) => drop(r.send(Err(err()))),
            Job::Revoke(_, _, r) => drop(r.send(Err(err()))),
        }
    }
}

fn apply_batch(c: &Connection, b: &BatchWrite) -> Result<BatchOutcome, rusqlite::Error> {
    // Checked inside the transaction, in the same thread that applies revocations: a batch that
    // raced a revocation is refused if the revocation committed first.
    let revoked: Option<Option<String>> = c
        .prepare_cached("SELECT revoked_at FROM keys WHERE key_id = ?1")?
        .query_row(params![b.key_id], |r| r.get(0))
        .optional()?;
    if !matches!(revoked, Some(None)) {
        return Ok(BatchOutcome::KeyRevoked);
    }
    let mut insert = c.prepare_cached(
        "INSERT OR IGNORE INTO events (id, org, sensor, actor, action, class, received_at, body)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    let mut accepted = 0u64;
    for row in &b.rows {
        let new = insert.execute(params![
            row.id,
            b.org,
            b.key_id,
            row.actor,
            row.action,
            row.class,
            b.received_at,
            row.body
        ])? as u64;
        if new > 0 {
            apply_evidence(c, b, row)?;
        }
        accepted += new;
    }
    let duplicates = b.rows.len() as u64 - accepted;
    // Every counter saturates at i64::MAX: SQLite would turn an overflowing `+` into a REAL,
    // which no later read as an integer accepts (issue 14: two batches reporting u64::MAX
    // `dropped` broke `GET /v1/admin/sensors` for good).
    c.prepare_cached(
        "INSERT INTO sensors (key_id, batches, accepted, dropped, version, transport, last_seen,
                              stdout_non_json, oversize_frames, orphan_responses, unobserved,
                              tap_dropped_bytes)
         VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
         ON CONFLICT(key_id) DO UPDATE SET
            batches = CASE WHEN batches > 9223372036854775807 - 1 THEN 9223372036854775807 ELSE batches + 1 END,
            accepted = CASE WHEN accepted > 9223372036854775807 - ?2 THEN 9223372036854775807 ELSE accepted + ?2 END,
            dropped = CASE WHEN dropped > 9223372036854775807 - ?3 THEN 9223372036854775807 ELSE dropped + ?3 END,
            version = coalesce(?4, version), transport = coalesce(?5, transport),
            last_seen = ?6,
            stdout_non_json = CASE WHEN stdout_non_json > 9223372036854775807 - ?7 THEN 9223372036854775807 ELSE stdout_non_json + ?7 END,
            oversize_frames = CASE WHEN oversize_frames > 9223372036854775807 - ?8 THEN 9223372036854775807 ELSE oversize_frames + ?8 END,
            orphan_responses = CASE WHEN orphan_responses > 9223372036854775807 - ?9 THEN 9223372036854775807 ELSE orphan_responses + ?9 END,
            unobserved = CASE WHEN unobserved > 9223372036854775807 - ?10 THEN 9223372036854775807 ELSE unobserved + ?10 END,
            tap_dropped_bytes = CASE WHEN tap_dropped_bytes > 9223372036854775807 - ?11 THEN 9223372036854775807 ELSE tap_dropped_bytes + ?11 END",
    )?
    .execute(params![
        b.key_id,
        i64::try_from(accepted).unwrap_or(i64::MAX),
        i64::try_from(b.dropped).unwrap_or(i64::MAX),
        b.sensor_version,
        b.sensor_transport,
        b.received_at,
        i64::try_from(b.health.stdout_non_json).unwrap_or(i64::MAX),
        i64::try_from(b.health.oversize_frames).unwrap_or(i64::MAX),
        i64::try_from(b.health.orphan_responses).unwrap_or(i64::MAX),
        i64::try_from(b.health.unobserved).unwrap_or(i64::MAX),
        i64::try_from(b.health.tap_dropped_bytes).unwrap_or(i64::MAX),
    ])?;
    Ok(BatchOutcome::Stored {
        accepted,
        duplicates,
    })
}

/// The aggregates of one newly stored event (see [`MIGRATION_2_EVIDENCE`]).
fn apply_evidence(c: &Connection, b: &BatchWrite, row: &EventRow) -> Result<(), rusqlite::Error> {
    let e = &row.evidence;
    let hour = e.seen.get(..13).unwrap_or(&e.seen);
    for def in &e.tool_defs {
        c.prepare_cached(
            "INSERT INTO tool_defs (org, host, tool, def, sensor, hour, first_seen, last_seen)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)
             ON CONFLICT DO UPDATE SET first_seen = min(first_seen, ?7),
                                       last_seen = max(last_seen, ?7)",
        )?
        .execute(params![
            b.org, e.host, row.action, def, b.key_id, hour, e.seen
        ])?;
    }
    if let Some((fp, kind, code)) = &e.error {
        c.prepare_cached(
            "INSERT INTO error_groups (org, fp, tool, kind, code, count, first_seen, last_seen)
             VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?6)
             ON CONFLICT DO UPDATE SET
                count = CASE WHEN count >= 9223372036854775807 THEN count ELSE count + 1 END,
                first_seen = min(first_seen, ?6), last_seen = max(last_seen, ?6)",
        )?
        .execute(params![b.org, fp, row.action, kind, code, e.seen])?;
    }
    if let Some((tools, bytes)) = e.catalog {
        let tools = tools.map(|t| i64::try_from(t).unwrap_or(i64::MAX));
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        c.prepare_cached(
            "INSERT INTO catalogs (org, host, tools, bytes, last_seen) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT DO UPDATE SET
                tools = CASE WHEN ?4 >= bytes THEN ?3 ELSE tools END,
                bytes = max(bytes, ?4), last_seen = max(last_seen, ?5)",
        )?
        .execute(params![b.org, e.host, tools, bytes, e.seen])?;
    }
    Ok(())
}

fn apply_mint(c: &Connection, k: KeyRecord) -> Result<KeyRecord, rusqlite::Error> {
    c.execute(
        "INSERT INTO keys (key_id, org, name, created_at, revoked_at) VALUES (?1, ?2, ?3, ?4, NULL)",
        params![k.key_id, k.org, k.name, k.created_at],
    )?;
    Ok(k)
}

fn apply_revoke(c: &Connection, key_id: &str) -> Result<RevokeOutcome, rusqlite::Error> {
    let revoked: Option<Option<String>> = c
        .query_row(
            "SELECT revoked_at FROM keys WHERE key_id = ?1",
            params![key_id],
            |r| r.get(0),
        )
        .optional()?;
    Ok(match revoked {
        None => RevokeOutcome::Unknown,
        Some(Some(_)) => RevokeOutcome::AlreadyRevoked,
        Some(None) => RevokeOutcome::Revoked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(key_id: &str, dropped: u64) -> BatchWrite {
        BatchWrite {
            key_id: key_id.into(),
            org: "acme".into(),
            received_at: "2026-11-30T19:00:00.000Z".into(),
            rows: Vec::new(),
            dropped,
            health: Default::default(),
            sensor_version: None,
            sensor_transport: None,
        }
    }

    async fn open_with_key(dir: &Path) -> Arc<SqliteStore> {
        let store = SqliteStore::open(&dir.join("t.db")).expect("open");
        store
            .mint(KeyRecord {
                key_id: "k_1".into(),
                org: "acme".into(),
                name: None,
                created_at: "2026-11-30T19:00:00.000Z".into(),
                revoked_at: None,
            })
            .await
            .expect("mint");
        store
    }

    #[tokio::test]
    async fn sensor_counters_saturate_instead_of_turning_real() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open_with_key(dir.path()).await;
        for _ in 0..3 {
            store
                .write_batch(batch("k_1", u64::MAX))
                .await
                .expect("batch");
        }
        let s = store.sensors().await.expect("sensors view still reads");
        assert_eq!(s[0].dropped, i64::MAX as u64);
        assert_eq!(s[0].batches, 3);
        let kind: String = Connection::open(dir.path().join("t.db"))
            .and_then(|c| c.query_row("SELECT typeof(dropped) FROM sensors", [], |r| r.get(0)))
            .expect("typeof");
        assert_eq!(kind, "integer");
        store.close().await;
    }

    #[tokio::test]
    async fn a_real_counter_left_by_an_older_build_is_read_and_healed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open_with_key(dir.path()).await;
        store.write_batch(batch("k_1", 1)).await.expect("batch");
        Connection::open(dir.path().join("t.db"))
            .and_then(|c| c.execute("UPDATE sensors SET dropped = 3.6893488147419103e19", []))
            .expect("corrupt");
        let s = store.sensors().await.expect("sensors view reads a REAL");
        assert_eq!(s[0].dropped, i64::MAX as u64);
        store.write_batch(batch("k_1", 1)).await.expect("batch");
        let kind: String = Connection::open(dir.path().join("t.db"))
            .and_then(|c| c.query_row("SELECT typeof(dropped) FROM sensors", [], |r| r.get(0)))
            .expect("typeof");
        assert_eq!(kind, "integer");
        store.close().await;
    }

    fn app_and_version(path: &Path) -> (i64, i64) {
        let c = Connection::open(path).expect("open");
        let app = c
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .expect("application_id");
        let version = c
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .expect("user_version");
        (app, version)
    }

    #[test]
    fn a_new_database_is_stamped_with_our_id_and_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("x.db");
        assert_eq!(probe_after_create(&db), Layout::Empty);
        open_and_close(&db);
        assert_eq!(app_and_version(&db), (APPLICATION_ID, SCHEMA_VERSION));
        assert_eq!(
            probe(&db).expect("ours"),
            Layout::Current {
                stamped: true,
                version: SCHEMA_VERSION
            }
        );
    }

    /// Opens the store on `db` (which adopts or sets it up) and closes it cleanly.
    fn open_and_close(db: &Path) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("rt");
        let store = SqliteStore::open(db).expect("open");
        rt.block_on(store.close());
    }

    /// Our tables and version and no application id, as builds before the id left a database.
    fn unstamped(db: &Path) -> Connection {
        let c = Connection::open(db).expect("open");
        c.execute_batch(SCHEMA).expect("schema");
        c.pragma_update(None, "user_version", 1).expect("version");
        c
    }

    #[test]
    fn a_database_from_a_build_before_the_application_id_is_ours() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("x.db");
        drop(unstamped(&db));
        assert_eq!(
            probe(&db).expect("ours"),
            Layout::Current {
                stamped: false,
                version: 1
            }
        );
        open_and_close(&db);
        assert_eq!(app_and_version(&db), (APPLICATION_ID, SCHEMA_VERSION));
    }

    /// A version-1 database (with a sensor row) is migrated on open: the new tables and
    /// columns exist, the old rows stay, and the version is stamped; opening again is a no-op.
    #[test]
    fn a_version_1_database_is_migrated_in_place() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("x.db");
        let c = unstamped(&db);
        c.pragma_update(None, "application_id", APPLICATION_ID)
            .expect("app id");
        c.execute(
            "INSERT INTO sensors (key_id, batches, accepted, dropped) VALUES ('k_1', 3, 30, 1)",
            [],
        )
        .expect("a v1 row");
        drop(c);
        assert_eq!(
            probe(&db).expect("ours"),
            Layout::Current {
                stamped: true,
                version: 1
            }
        );
        open_and_close(&db);
        assert_eq!(app_and_version(&db), (APPLICATION_ID, SCHEMA_VERSION));
        let c = Connection::open(&db).expect("open");
        let row: (i64, i64) = c
            .query_row(
                "SELECT accepted, stdout_non_json FROM sensors WHERE key_id = 'k_1'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("the old row, with the new column");
        assert_eq!(row, (30, 0));
        for t in ["tool_defs", "error_groups", "catalogs"] {
            c.query_row(&format!("SELECT COUNT(*) FROM {t}"), [], |r| {
                r.get::<_, i64>(0)
            })
            .expect(t);
        }
        drop(c);
        open_and_close(&db);
        assert_eq!(app_and_version(&db), (APPLICATION_ID, SCHEMA_VERSION));
    }

    #[test]
    fn another_application_id_is_foreign_even_with_our_tables() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("x.db");
        unstamped(&db)
            .pragma_update(None, "application_id", 0x1234)
            .expect("app id");
        assert!(matches!(
            probe(&db),
            Err(IngestError::ForeignDatabase { .. })
        ));
    }

    fn probe_after_create(db: &Path) -> Layout {
        create_owner_only(db).expect("create");
        probe(db).expect("probe")
    }
}
