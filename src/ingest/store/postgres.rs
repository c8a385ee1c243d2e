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
//! Not a [`super::Store`] yet: keys, batches and reads over this schema come next.

use std::fmt;
use std::str::FromStr;

use rustls::pki_types::CertificateDer;
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::{Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::sqlite::APPLICATION_ID;

/// The version [`MIGRATIONS`] bring a database to.
pub const SCHEMA_VERSION: i32 = 1;

/// `(version reached, statements)`, in order. One that shipped is never edited: a change is a
/// new entry.
pub const MIGRATIONS: [(i32, &str); 1] = [(1, MIGRATION_1)];

/// Version 1: the layout of SQLite's version 2 (keys, events de-duplicated per org, per-sensor
/// counters with health, and the evidence aggregates). Times stay RFC 3339 text, as the server
/// writes them, so both stores order and compare them the same way.
const MIGRATION_1: &str = "
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
    #[error("{target}: {source}")]
    Db {
        target: PgTarget,
        #[source]
        source: tokio_postgres::Error,
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
    /// webpki roots plus `extra_roots` (a private CA).
    pub fn new(
        url: &str,
        extra_roots: &[CertificateDer<'static>],
    ) -> Result<PgConnect, PgOpenError> {
        // The parser's message may quote the text it choked on, which can be the password.
        let mut config = Config::from_str(url).map_err(|_| PgOpenError::Url)?;
        let target = PgTarget::of(&config);
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

    /// The database, for messages.
    pub fn target(&self) -> &PgTarget {
        &self.target
    }

    /// One connection; its I/O runs on a task of its own until the client is dropped.
    pub async fn connect(&self) -> Result<Client, PgOpenError> {
        let db = |source| PgOpenError::Db {
            target: self.target.clone(),
            source,
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

async fn drive<F>(conn: F, target: PgTarget)
where
    F: std::future::Future<Output = Result<(), tokio_postgres::Error>>,
{
    if let Err(e) = conn.await {
        tracing::warn!(database = %target, error = %e, "PostgreSQL connection ended");
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
    let db = |source| PgOpenError::Db {
        target: target.clone(),
        source,
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
