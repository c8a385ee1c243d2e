//! The PostgreSQL store (`postgres://…` URLs), for several ingest replicas over one database.
//!
//! Owns connecting (TLS with rustls, certificates always verified) and the versioned schema:
//! the same check as SQLite's, with `bounded_ingest_schema` (application id, version) in place
//! of SQLite's `application_id` and `user_version`. An empty database is initialised and an
//! older one migrated by [`MIGRATIONS`], in one transaction under an advisory lock, so replicas
//! starting together neither race nor half-migrate; a database with tables but no marker of
//! ours, or of a newer schema, is refused and left as it was.
//!
//! It never prints the password: errors and logs name the database by [`PgTarget`] (user, host,
//! port, database), never by its URL. It never falls back to plain TCP when TLS was asked for or
//! left unsaid: only `sslmode=disable` connects without TLS (a downgrade would send every event
//! in the clear).
//!
//! [`PgStore`] is the [`Store`] over this schema: batches arriving together are committed in one
//! transaction ([`write`](mod@write): group commit), each still whole or not at all, de-duplicated on
//! `(org, id)` by the database, so a batch retried against another replica stores nothing twice.
//! `bounded-ingest serve --db postgres://…` selects it.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Number, Value};

use rustls::pki_types::CertificateDer;
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::{Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

mod write;

pub use write::{COMMITTERS, MAX_GROUP_BATCHES};

use super::sqlite::APPLICATION_ID;
use super::{
    BatchOutcome, BatchWrite, CatalogView, ErrorGroup, EventQuery, KeyRecord, RevokeOutcome,
    Rollup, SensorStats, Store, StoreError, StoreFuture, ToolDefSeen, ToolKey, ToolView, ToolViews,
    MAX_ROLLUP_EVIDENCE,
};

/// The version [`MIGRATIONS`] bring a database to.
pub const SCHEMA_VERSION: i32 = 1;

/// `(version reached, statements)`, in order. One that shipped is never edited: a change is a
/// new entry.
pub const MIGRATIONS: [(i32, &str); 1] = [(1, MIGRATION_1)];

/// Version 1: the layout of SQLite's version 2 (keys, events de-duplicated per org, per-sensor
/// counters with health, and the evidence aggregates). Times stay RFC 3339 text, as the server
/// writes them, so both stores order and compare them the same way.
const MIGRATION_1: &str = "
-- Counters saturate at the bigint maximum instead of failing the batch that would overflow
-- them (a sensor may report any count).
CREATE FUNCTION sat_add(a BIGINT, b BIGINT) RETURNS BIGINT LANGUAGE sql IMMUTABLE AS
  'SELECT CASE WHEN a > 9223372036854775807 - b THEN 9223372036854775807 ELSE a + b END';
CREATE TABLE keys (
    key_id     TEXT PRIMARY KEY,
    org        TEXT NOT NULL,
    name       TEXT,
    created_at TEXT NOT NULL,
    revoked_at TEXT
);
CREATE TABLE events (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id          TEXT NOT NULL,
    org         TEXT NOT NULL,
    sensor      TEXT NOT NULL,
    actor       TEXT NOT NULL,
    action      TEXT NOT NULL,
    class       TEXT NOT NULL,
    received_at TEXT NOT NULL,
    body        TEXT NOT NULL
);
-- De-duplication per org, across every replica: the database, not a replica, decides.
CREATE UNIQUE INDEX events_org_id ON events (org, id);
CREATE TABLE sensors (
    key_id            TEXT PRIMARY KEY,
    batches           BIGINT NOT NULL DEFAULT 0,
    accepted          BIGINT NOT NULL DEFAULT 0,
    dropped           BIGINT NOT NULL DEFAULT 0,
    version           TEXT,
    transport         TEXT,
    last_seen         TEXT,
    stdout_non_json   BIGINT NOT NULL DEFAULT 0,
    oversize_frames   BIGINT NOT NULL DEFAULT 0,
    orphan_responses  BIGINT NOT NULL DEFAULT 0,
    unobserved        BIGINT NOT NULL DEFAULT 0,
    tap_dropped_bytes BIGINT NOT NULL DEFAULT 0
);
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
);
CREATE TABLE error_groups (
    org        TEXT NOT NULL,
    fp         TEXT NOT NULL,
    tool       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    code       BIGINT,
    count      BIGINT NOT NULL,
    first_seen TEXT NOT NULL,
    last_seen  TEXT NOT NULL,
    PRIMARY KEY (org, fp, tool)
);
CREATE TABLE catalogs (
    org       TEXT NOT NULL,
    host      TEXT NOT NULL,
    tools     BIGINT,
    bytes     BIGINT NOT NULL,
    last_seen TEXT NOT NULL,
    PRIMARY KEY (org, host)
);
";

/// A failure to open the PostgreSQL store. Never carries the URL or the password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgOpenError {
    #[error("database URL is not a valid postgres:// URL")]
    Url,
    #[error("database CA (sslrootcert): {0}")]
    Ca(#[from] crate::http_client::CaError),
    #[error("connection pool: {0}")]
    Pool(String),
    /// The cause is shown with its source chain and is not a `source` itself: printed once.
    #[error("{target}: {}", super::chain(.cause))]
    Db {
        target: PgTarget,
        cause: tokio_postgres::Error,
    },
    #[error("{target} is not a bounded-ingest database ({reason}); refusing to use it")]
    Foreign { target: PgTarget, reason: String },
    #[error(
        "{target} has schema version {found}, newer than this build's {SCHEMA_VERSION}; \
         run a newer bounded-ingest"
    )]
    Newer { target: PgTarget, found: i32 },
}

/// Which database, for messages: user, hosts, ports and database name; never the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTarget(String);

impl fmt::Display for PgTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PgTarget {
    fn of(config: &Config) -> PgTarget {
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .zip(config.get_ports().iter().chain(std::iter::repeat(&5432)))
            .map(|(h, p)| match h {
                Host::Tcp(h) => format!("{h}:{p}"),
                Host::Unix(path) => format!("{}:{p}", path.display()),
            })
            .collect();
        PgTarget(format!(
            "postgres://{}@{}/{}",
            config.get_user().unwrap_or(""),
            hosts.join(","),
            config.get_dbname().unwrap_or("")
        ))
    }
}

/// How to reach the database: the parsed URL and, unless `sslmode=disable`, the TLS setup.
#[derive(Clone)]
pub struct PgConnect {
    config: Config,
    tls: Option<MakeRustlsConnect>,
    target: PgTarget,
}

impl fmt::Debug for PgConnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConnect")
            .field("target", &self.target)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl PgConnect {
    /// Parses `url` (`postgres://user:password@host:port/db?sslmode=…`). TLS trusts the
    /// webpki roots plus `extra_roots` (a private CA) plus the URL's `sslrootcert` file.
    pub fn new(
        url: &str,
        extra_roots: &[CertificateDer<'static>],
    ) -> Result<PgConnect, PgOpenError> {
        let (url, root_cert) = libpq_params(url);
        // The parser's message may quote the text it choked on, which can be the password.
        let mut config = Config::from_str(&url).map_err(|_| PgOpenError::Url)?;
        let target = PgTarget::of(&config);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        let mut roots = extra_roots.to_vec();
        if let Some(path) = root_cert {
            roots.extend(crate::http_client::load_ca_file(&path)?);
        }
        let extra_roots = &roots[..];
        let tls = match config.get_ssl_mode() {
            SslMode::Disable => None,
            // `prefer` (the default) would fall back to plain TCP if the server declines TLS.
            _ => {
                config.ssl_mode(SslMode::Require);
                Some(MakeRustlsConnect::new(client_tls(extra_roots)))
            }
        };
        Ok(PgConnect {
            config,
            tls,
            target,
        })
    }

    /// A pool manager with the same settings and TLS as [`PgConnect::connect`].
    fn manager(&self) -> deadpool_postgres::Manager {
        let mc = || deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        };
        match &self.tls {
            None => deadpool_postgres::Manager::from_config(self.config.clone(), NoTls, mc()),
            Some(tls) => {
                deadpool_postgres::Manager::from_config(self.config.clone(), tls.clone(), mc())
            }
        }
    }

    /// The database, for messages.
    pub fn target(&self) -> &PgTarget {
        &self.target
    }

    /// One connection; its I/O runs on a task of its own until the client is dropped.
    pub async fn connect(&self) -> Result<Client, PgOpenError> {
        let db = |cause| PgOpenError::Db {
            target: self.target.clone(),
            cause,
        };
        match &self.tls {
            None => {
                let (client, conn) = self.config.connect(NoTls).await.map_err(db)?;
                tokio::spawn(drive(conn, self.target.clone()));
                Ok(client)
            }
            Some(tls) => {
                let (client, conn) = self.config.connect(tls.clone()).await.map_err(db)?;
                tokio::spawn(drive(conn, self.target.clone()));
                Ok(client)
            }
        }
    }
}

/// A connection attempt without `connect_timeout` in the URL gives up after this, rather than
/// after the system's TCP timeout (minutes): a replica that cannot reach the database says so.
const DEFAULT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The URL with what libpq takes and tokio-postgres does not rewritten, and the `sslrootcert`
/// path taken out of it. Certificates are always verified, chain and host name, so
/// `sslmode=verify-full` and `verify-ca` (what managed databases tell clients to use) mean
/// `require` here; `sslrootcert=system` is the default roots.
fn libpq_params(url: &str) -> (String, Option<std::path::PathBuf>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), None);
    };
    let mut root_cert = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match (k, v) {
            ("sslmode", "verify-full" | "verify-ca") => kept.push("sslmode=require".to_string()),
            ("sslrootcert", "system") => {}
            ("sslrootcert", v) => root_cert = Some(std::path::PathBuf::from(percent_decode(v))),
            _ => kept.push(pair.to_string()),
        }
    }
    if kept.is_empty() {
        (base.to_string(), root_cert)
    } else {
        (format!("{base}?{}", kept.join("&")), root_cert)
    }
}

/// `%XX` escapes decoded (a path in a URL query); anything malformed is kept as written.
fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn drive<F>(conn: F, target: PgTarget)
where
    F: std::future::Future<Output = Result<(), tokio_postgres::Error>>,
{
    if let Err(e) = conn.await {
        tracing::warn!(database = %target, error = %super::chain(&e), "PostgreSQL connection ended");
    }
}

fn client_tls(extra_roots: &[CertificateDer<'static>]) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    // Certificates that do not parse are skipped, as the sensor's client does.
    let _ = roots.add_parsable_certificates(
        webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .cloned()
            .chain(extra_roots.iter().cloned()),
    );
    rustls::ClientConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
        // ring supports every default protocol version; this arm is never taken.
        .unwrap_or_else(|_| {
            rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        })
}

/// Connects and brings the schema to [`SCHEMA_VERSION`] (see the module docs). Returns the
/// connection it used, ready for work.
pub async fn open(connect: &PgConnect) -> Result<Client, PgOpenError> {
    let mut client = connect.connect().await?;
    let target = connect.target().clone();
    let db = |cause| PgOpenError::Db {
        target: target.clone(),
        cause,
    };
    let tx = client.transaction().await.map_err(db)?;
    // Replicas starting together: one creates or migrates, the others wait and then find it done.
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&APPLICATION_ID])
        .await
        .map_err(db)?;
    let marked: bool = tx
        .query_one(
            "SELECT to_regclass('bounded_ingest_schema') IS NOT NULL",
            &[],
        )
        .await
        .map_err(db)?
        .get(0);
    let from = if marked {
        let row = tx
            .query_opt(
                "SELECT application_id, version FROM bounded_ingest_schema",
                &[],
            )
            .await
            .map_err(db)?;
        match row {
            Some(r) if r.get::<_, i64>(0) == APPLICATION_ID => r.get::<_, i32>(1),
            _ => {
                return Err(PgOpenError::Foreign {
                    target,
                    reason: "bounded_ingest_schema names another application".into(),
                })
            }
        }
    } else {
        let tables: Vec<String> = tx
            .query(
                "SELECT table_name::text FROM information_schema.tables
                 WHERE table_schema = current_schema() ORDER BY 1",
                &[],
            )
            .await
            .map_err(db)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if !tables.is_empty() {
            return Err(PgOpenError::Foreign {
                target,
                reason: format!(
                    "tables [{}] and no bounded_ingest_schema",
                    tables.join(", ")
                ),
            });
        }
        tx.batch_execute(
            "CREATE TABLE bounded_ingest_schema (
                 application_id BIGINT NOT NULL,
                 version        INTEGER NOT NULL
             )",
        )
        .await
        .map_err(db)?;
        tx.execute(
            "INSERT INTO bounded_ingest_schema (application_id, version) VALUES ($1, 0)",
            &[&APPLICATION_ID],
        )
        .await
        .map_err(db)?;
        0
    };
    if from > SCHEMA_VERSION {
        return Err(PgOpenError::Newer {
            target,
            found: from,
        });
    }
    for (version, sql) in MIGRATIONS {
        if version > from {
            tx.batch_execute(sql).await.map_err(db)?;
        }
    }
    tx.execute(
        "UPDATE bounded_ingest_schema SET version = $1",
        &[&SCHEMA_VERSION],
    )
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(client)
}

/// Connections kept by one replica: requests beyond it wait for one (back-pressure on the
/// handlers, as SQLite's writer queue).
const POOL_SIZE: usize = 8;

/// The PostgreSQL [`Store`]: a pool of connections, and no state of its own.
///
/// Keys are read from the database on every check, never cached: a key minted or revoked
/// through any replica is seen by every other on its next request, with no invalidation to
/// get wrong or lose with a connection (rejected: LISTEN/NOTIFY, which needs a connection per
/// replica and a full cache reset after any lost notification; and a cache with a time limit,
/// which still lets a revoked key through for that long). The check is one primary-key read
/// per batch. A batch is never stored under a revoked key either way: [`Store::write_batch`]
/// reads the key again inside its transaction, so a revocation committing between the check
/// and the batch still wins.
pub struct PgStore {
    pool: deadpool_postgres::Pool,
    /// Batches are written through it, grouped (see [`write`](mod@write)).
    writer: write::GroupWriter,
}

impl PgStore {
    /// Opens the database (see [`open`]).
    pub async fn open(connect: &PgConnect) -> Result<std::sync::Arc<PgStore>, PgOpenError> {
        drop(open(connect).await?);
        let pool = deadpool_postgres::Pool::builder(connect.manager())
            .max_size(POOL_SIZE)
            .build()
            .map_err(|e| PgOpenError::Pool(e.to_string()))?;
        Ok(std::sync::Arc::new(PgStore {
            writer: write::GroupWriter::start(pool.clone()),
            pool,
        }))
    }

    async fn conn(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Pool(super::chain(&e)))
    }

    async fn mint_now(&self, k: KeyRecord) -> Result<(), StoreError> {
        self.conn()
            .await?
            .execute(
                "INSERT INTO keys (key_id, org, name, created_at, revoked_at)
                 VALUES ($1, $2, $3, $4, NULL)",
                &[&k.key_id, &k.org, &k.name, &k.created_at],
            )
            .await?;
        Ok(())
    }

    async fn revoke_now(&self, key_id: String, at: String) -> Result<RevokeOutcome, StoreError> {
        let c = self.conn().await?;
        let updated = c
            .execute(
                "UPDATE keys SET revoked_at = $2 WHERE key_id = $1 AND revoked_at IS NULL",
                &[&key_id, &at],
            )
            .await?;
        if updated == 1 {
            return Ok(RevokeOutcome::Revoked);
        }
        let known = c
            .query_opt("SELECT 1 FROM keys WHERE key_id = $1", &[&key_id])
            .await?;
        Ok(match known {
            Some(_) => RevokeOutcome::AlreadyRevoked,
            None => RevokeOutcome::Unknown,
        })
    }

    async fn bodies(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Value>, StoreError> {
        let rows = self.conn().await?.query(sql, params).await?;
        Ok(rows
            .iter()
            .filter_map(|r| serde_json::from_str(r.get::<_, &str>(0)).ok())
            .collect())
    }

    async fn rollups_now(&self, org: Option<String>) -> Result<Vec<Rollup>, StoreError> {
        type Group = (String, String, String, String);
        let c = self.conn().await?;
        let mut groups: BTreeMap<Group, Rollup> = BTreeMap::new();
        for r in c
            .query(
                "SELECT org, actor, action, class, COUNT(*) FROM events
                 WHERE ($1::text IS NULL OR org = $1) GROUP BY org, actor, action, class",
                &[&org],
            )
            .await?
        {
            let g: Group = (r.get(0), r.get(1), r.get(2), r.get(3));
            groups.insert(
                g.clone(),
                Rollup {
                    org: g.0,
                    actor: g.1,
                    action: g.2,
                    class: g.3,
                    count: r.get::<_, i64>(4).max(0) as u64,
                    sums: Map::new(),
                },
            );
        }
        // Summed as float8, as SQLite's TOTAL(); integer-only totals go back to integers while
        // exact (see `number`).
        for r in c
            .query(
                "SELECT e.org, e.actor, e.action, e.class, f.key,
                        SUM((f.value #>> '{}')::float8),
                        bool_and((f.value #>> '{}') !~ '[.eE]')
                 FROM events e,
                      jsonb_each(CASE WHEN jsonb_typeof(e.body::jsonb #> '{rec,fields}') = 'object'
                                      THEN e.body::jsonb #> '{rec,fields}' END) f
                 WHERE ($1::text IS NULL OR e.org = $1) AND jsonb_typeof(f.value) = 'number'
                 GROUP BY e.org, e.actor, e.action, e.class, f.key",
                &[&org],
            )
            .await?
        {
            let g: Group = (r.get(0), r.get(1), r.get(2), r.get(3));
            if let Some(rollup) = groups.get_mut(&g) {
                rollup
                    .sums
                    .insert(r.get(4), number(r.get(5), r.get::<_, bool>(6)));
            }
        }
        Ok(groups.into_values().collect())
    }

    async fn sensors_now(&self) -> Result<Vec<SensorStats>, StoreError> {
        let rows = self
            .conn()
            .await?
            .query(
                "SELECT key_id, batches, accepted, dropped, version, transport, last_seen,
                        stdout_non_json, oversize_frames, orphan_responses, unobserved,
                        tap_dropped_bytes
                 FROM sensors ORDER BY key_id",
                &[],
            )
            .await?;
        let n = |r: &tokio_postgres::Row, i: usize| r.get::<_, i64>(i).max(0) as u64;
        Ok(rows
            .iter()
            .map(|r| SensorStats {
                key_id: r.get(0),
                batches: n(r, 1),
                accepted: n(r, 2),
                dropped: n(r, 3),
                version: r.get(4),
                transport: r.get(5),
                last_seen: r.get(6),
                health: crate::event::health::Health {
                    stdout_non_json: n(r, 7),
                    oversize_frames: n(r, 8),
                    orphan_responses: n(r, 9),
                    unobserved: n(r, 10),
                    tap_dropped_bytes: n(r, 11),
                },
            })
            .collect())
    }

    async fn tools_now(&self, org: Option<String>) -> Result<Vec<ToolView>, StoreError> {
        let c = self.conn().await?;
        let mut tools = ToolViews::default();
        let key = |r: &tokio_postgres::Row| -> ToolKey { (r.get(0), r.get(1), r.get(2)) };
        for r in c
            .query(
                "SELECT org, host, tool, def, MIN(first_seen), MAX(last_seen),
                        COUNT(DISTINCT sensor)
                 FROM tool_defs WHERE ($1::text IS NULL OR org = $1)
                 GROUP BY org, host, tool, def",
                &[&org],
            )
            .await?
        {
            let seen = ToolDefSeen {
                def: r.get(3),
                first_seen: r.get(4),
                last_seen: r.get(5),
                sensors: r.get::<_, i64>(6).max(0) as u64,
            };
            tools.seen(key(&r), seen);
        }
        // Changed: one sensor saw two hashes. Inconsistent: two sensors, two hashes, one hour.
        for r in c
            .query(
                "SELECT org, host, tool FROM tool_defs WHERE ($1::text IS NULL OR org = $1)
                 GROUP BY org, host, tool, sensor HAVING COUNT(DISTINCT def) > 1",
                &[&org],
            )
            .await?
        {
            tools.changed(&key(&r));
        }
        for r in c
            .query(
                "SELECT DISTINCT a.org, a.host, a.tool FROM tool_defs a JOIN tool_defs b
                   ON a.org = b.org AND a.host = b.host AND a.tool = b.tool AND a.hour = b.hour
                  AND a.sensor <> b.sensor AND a.def <> b.def
                 WHERE ($1::text IS NULL OR a.org = $1)",
                &[&org],
            )
            .await?
        {
            tools.inconsistent(&key(&r));
        }
        Ok(tools.finish())
    }

    async fn evidence_rollups_now(
        &self,
        org: Option<String>,
    ) -> Result<(Vec<ErrorGroup>, Vec<CatalogView>), StoreError> {
        let c = self.conn().await?;
        let limit = i64::from(MAX_ROLLUP_EVIDENCE);
        let groups = c
            .query(
                "SELECT org, fp, tool, kind, code, count, first_seen, last_seen FROM error_groups
                 WHERE ($1::text IS NULL OR org = $1) ORDER BY count DESC, fp LIMIT $2",
                &[&org, &limit],
            )
            .await?
            .iter()
            .map(|r| ErrorGroup {
                org: r.get(0),
                fp: r.get(1),
                tool: r.get(2),
                kind: r.get(3),
                code: r.get(4),
                count: r.get::<_, i64>(5).max(0) as u64,
                first_seen: r.get(6),
                last_seen: r.get(7),
            })
            .collect();
        let catalogs = c
            .query(
                "SELECT org, host, tools, bytes, last_seen FROM catalogs
                 WHERE ($1::text IS NULL OR org = $1) ORDER BY bytes DESC, host LIMIT $2",
                &[&org, &limit],
            )
            .await?
            .iter()
            .map(|r| CatalogView {
                org: r.get(0),
                host: r.get(1),
                tools: r.get::<_, Option<i64>>(2).map(|t| t.max(0) as u64),
                bytes: r.get::<_, i64>(3).max(0) as u64,
                last_seen: r.get(4),
            })
            .collect();
        Ok((groups, catalogs))
    }
}

fn key_record(r: &tokio_postgres::Row) -> KeyRecord {
    KeyRecord {
        key_id: r.get(0),
        org: r.get(1),
        name: r.get(2),
        created_at: r.get(3),
        revoked_at: r.get(4),
    }
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

impl Store for PgStore {
    fn key(&self, key_id: String) -> StoreFuture<'_, Option<KeyRecord>> {
        Box::pin(async move {
            let row = self
                .conn()
                .await?
                .query_opt(
                    "SELECT key_id, org, name, created_at, revoked_at FROM keys WHERE key_id = $1",
                    &[&key_id],
                )
                .await?;
            Ok(row.as_ref().map(key_record))
        })
    }
    fn key_records(&self) -> StoreFuture<'_, Vec<KeyRecord>> {
        Box::pin(async move {
            let rows = self
                .conn()
                .await?
                .query(
                    "SELECT key_id, org, name, created_at, revoked_at FROM keys",
                    &[],
                )
                .await?;
            Ok(rows.iter().map(key_record).collect())
        })
    }
    fn write_batch(&self, batch: BatchWrite) -> StoreFuture<'_, BatchOutcome> {
        Box::pin(self.writer.write(batch))
    }
    fn mint(&self, key: KeyRecord) -> StoreFuture<'_, ()> {
        Box::pin(self.mint_now(key))
    }
    fn revoke(&self, key_id: String, at: String) -> StoreFuture<'_, RevokeOutcome> {
        Box::pin(self.revoke_now(key_id, at))
    }
    fn events(&self, q: EventQuery) -> StoreFuture<'_, Vec<Value>> {
        Box::pin(async move {
            self.bodies(
                "SELECT body FROM events
                 WHERE ($1::text IS NULL OR org = $1) AND ($2::text IS NULL OR actor = $2)
                   AND ($3::text IS NULL OR action = $3) AND ($4::text IS NULL OR class = $4)
                 ORDER BY seq DESC LIMIT $5",
                &[&q.org, &q.actor, &q.action, &q.class, &i64::from(q.limit)],
            )
            .await
        })
    }
    /// Sequence values are handed out at insert, not at commit: a batch still committing can
    /// hold lower ones than a batch that has committed, and a reader following the sequence
    /// (the live view's stream) would move past it for good. So the read first takes the table
    /// in SHARE mode, which waits for every transaction inserting into it to end and holds new
    /// ones off for the few milliseconds of the read: then every value below the highest seen
    /// is committed or never will be.
    fn events_after(&self, after: Option<i64>, limit: u32) -> StoreFuture<'_, Vec<(i64, String)>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let c = conn.transaction().await?;
            // Batches take milliseconds; one stuck longer fails this read (the stream ends and
            // the browser reconnects) rather than holding every writer behind it.
            c.batch_execute("SET LOCAL lock_timeout = '2s'; LOCK TABLE events IN SHARE MODE")
                .await?;
            let limit = i64::from(limit);
            let rows = match after {
                Some(after) => {
                    c.query(
                        "SELECT seq, body FROM events WHERE seq > $1 ORDER BY seq LIMIT $2",
                        &[&after, &limit],
                    )
                    .await?
                }
                None => {
                    c.query(
                        "SELECT seq, body FROM
                           (SELECT seq, body FROM events ORDER BY seq DESC LIMIT $1) AS newest
                         ORDER BY seq",
                        &[&limit],
                    )
                    .await?
                }
            };
            c.commit().await?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }
    fn events_received_since(
        &self,
        since: String,
        org: Option<String>,
        limit: u32,
    ) -> StoreFuture<'_, Vec<Value>> {
        Box::pin(async move {
            self.bodies(
                "SELECT body FROM events WHERE received_at >= $1 AND ($2::text IS NULL OR org = $2)
                 ORDER BY seq DESC LIMIT $3",
                &[&since, &org, &i64::from(limit)],
            )
            .await
        })
    }
    fn rollups(&self, org: Option<String>) -> StoreFuture<'_, Vec<Rollup>> {
        Box::pin(self.rollups_now(org))
    }
    fn sensors(&self) -> StoreFuture<'_, Vec<SensorStats>> {
        Box::pin(self.sensors_now())
    }
    fn tools(&self, org: Option<String>) -> StoreFuture<'_, Vec<ToolView>> {
        Box::pin(self.tools_now(org))
    }
    fn evidence_rollups(
        &self,
        org: Option<String>,
    ) -> StoreFuture<'_, (Vec<ErrorGroup>, Vec<CatalogView>)> {
        Box::pin(self.evidence_rollups_now(org))
    }
    fn close(&self) -> futures_util::future::BoxFuture<'_, ()> {
        // Batches already queued are written (and answered) before the pool closes.
        Box::pin(async move {
            self.writer.close().await;
            self.pool.close()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_only_parameters_are_rewritten_and_the_rest_kept() {
        let (url, ca) = libpq_params(
            "postgres://u:p%40ss@db.example.com:5432/ingest?sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.pem&application_name=a",
        );
        assert_eq!(
            url,
            "postgres://u:p%40ss@db.example.com:5432/ingest?sslmode=require&application_name=a"
        );
        assert_eq!(ca, Some(std::path::PathBuf::from("/etc/ca x.pem")));
        let (url, ca) = libpq_params("postgres://u@h/db?sslrootcert=system&sslmode=verify-ca");
        assert_eq!(url, "postgres://u@h/db?sslmode=require");
        assert_eq!(ca, None);
        assert_eq!(libpq_params("postgres://u@h/db").0, "postgres://u@h/db");
        assert_eq!(
            libpq_params("postgres://u@h/db?sslrootcert=/x").0,
            "postgres://u@h/db"
        );
    }

    #[test]
    fn a_bad_url_error_never_quotes_the_password() {
        let e = PgConnect::new("postgres://u:S3CRETpw@h:notaport/db", &[]).expect_err("bad port");
        assert!(!e.to_string().contains("S3CRETpw"), "{e}");
        let c =
            PgConnect::new("postgres://u:S3CRETpw@h:5433/db?sslmode=disable", &[]).expect("valid");
        assert!(!format!("{c:?} {}", c.target()).contains("S3CRETpw"));
        assert_eq!(c.target().to_string(), "postgres://u@h:5433/db");
    }
}
