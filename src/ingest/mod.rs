//! The reference ingest (DESIGN §6, §7): the `bounded-ingest` binary, also embeddable.
//!
//! Owns the ingest's life cycle: open the store, load the secrets, bind, serve, shut down.
//! Goes in: an [`IngestConfig`]. Comes out: a [`RunningIngest`] that knows its bound address and
//! admin secret, and stops on [`RunningIngest::shutdown`]. It is apart from the sensor's data
//! path: nothing in the sensor calls into it, and it never reads `std::env` (the binary does).
//!
//! * `conn`: accepting and serving connections (the connection cap, header and idle timeouts).
//! * [`server`]: the HTTP routes and status codes.
//! * [`admission`]: the per-key limit and the shared batch slots, refusals counted per key.
//! * [`batch`]: reading a batch body without building it as a tree.
//! * [`store`]: the [`store::Store`] trait every database keeps, and its implementations:
//!   [`store::sqlite`] (WAL, `synchronous=FULL`, one writer thread with group commit) and
//!   [`store::postgres`] (several replicas over one database, `--db postgres://…`).
//! * [`keys`]: sensor-token signatures and the admin secret, checked in constant time.
//! * [`admin`]: the client `bounded-ingest mint` / `revoke` (and tests, and demos) use.
//! * [`tls`]: HTTPS (`--tls-cert` / `--tls-key`, rustls with ring).
//! * [`web`]: the live view at `/` (sign-in, sessions, the event stream, per-tool figures).
//!
//! Store: SQLite at [`IngestConfig::db_path`], unless [`IngestConfig::postgres`] names a
//! PostgreSQL database that replicas share; then both secrets must be given
//! ([`IngestConfig::signing_secret`], [`IngestConfig::admin_secret`] or
//! [`IngestConfig::admin_secret_file`]) and [`start`] fails with
//! [`IngestError::SharedSecretMissing`] before connecting, never generating one per replica.
//! Given secrets are read, never written, with either store.
//!
//! Files: the database at [`IngestConfig::db_path`] (default [`DEFAULT_DB_PATH`]; its directory
//! is created owner-only (0700) if missing), plus beside it `<db>.signing-key` (the token
//! signing secret; losing it invalidates every token) and, when no admin secret is given,
//! `<db>.admin-secret`. Every one of them is created owner-only (0600), the database's `-wal` and
//! `-shm` too (see [`store::sqlite`]); the secrets are written whole or not at all (see [`keys`]). At
//! start, a store, secret or TLS key file readable by group or others gets one warning each
//! (they are not changed: the operator may have meant it). A database that is not ours, or of a
//! newer schema, is refused before anything is written to it.
//!
//! Off loopback the ingest does not speak plain HTTP: [`start`] refuses a non-loopback
//! [`IngestConfig::listen`] without [`IngestConfig::tls`], unless
//! [`IngestConfig::insecure_plain_http`] says TLS is terminated in front of it.
//!
//! Routes (JSON; errors are `{ "error": "…" }`):
//!
//! | route | auth | answer |
//! |---|---|---|
//! | `POST /v1/events` | sensor token | 200 `{accepted, rejected, duplicates}` after commit; 400 malformed JSON, invalid UTF-8 or batch shape (`dropped` over [`batch::MAX_DROPPED_PER_BATCH`] included); 401 bad/unknown/revoked token; 408 body too slow; 413 body over [`DEFAULT_MAX_BODY_BYTES`] or more than 500 events; 429 the key already has [`DEFAULT_MAX_BATCHES_PER_KEY`] batches in progress, 503 no batch slot free within [`DEFAULT_SLOT_WAIT`] (both with `Retry-After: 1`) |
//! | `POST /v1/admin/keys` `{org, name?}` | admin secret | 201 `{keyId, token, org, name?}` |
//! | `DELETE /v1/admin/keys/{keyId}` | admin secret | 204 (also when already revoked), 404 unknown |
//! | `GET /v1/rollups?org=` | admin secret | `{rollups: [{org, actor, action, class, count, sums}], errorGroups: [{org, fp, tool, kind, code?, count, firstSeen, lastSeen}], catalogs: [{org, host, tools?, bytes, lastSeen}]}`; error groups most frequent first, catalogs (the largest seen per host) largest first, 1000 of each at most |
//! | `GET /v1/tools?org=` | admin secret | `{tools: [{org, host, tool, defs: [{def, firstSeen, lastSeen, sensors}], changed, inconsistent}]}`: `changed`, one sensor saw two hashes; `inconsistent`, two sensors saw different hashes in the same hour |
//! | `GET /v1/events?org&actor&action&class&limit` | admin secret | `{events: [...]}` newest received first; `class` is `action`, `error` or `drift`; `limit` 1-1000, default 100 |
//! | `GET /v1/admin/sensors` | admin secret | `{sensors: [{keyId, batches, accepted, dropped, version, transport, lastSeen, health, refused: {rate, slots}}]}`; `health` sums the sensor's `sensor.health` counts; `refused` counts 429s and 503s since start |
//! | `GET /healthz` | none | 200 |
//! | `GET /`, `/assets/*`, `/ui/*` | see [`web`] | the live view |
//!
//! Connections: at most [`DEFAULT_MAX_CONNECTIONS`] open (one more is closed on accept), a
//! request head within [`DEFAULT_HEADER_READ_TIMEOUT`] of its first byte, idle connections
//! closed after [`DEFAULT_IDLE_TIMEOUT`]. Counters saturate at `i64::MAX`.
//!
//! Both secrets travel as `Authorization: Bearer …`; the admin routes also take a live view
//! session cookie instead (state-changing ones with its CSRF token, see [`web`]). A
//! schema-invalid event is rejected alone and counted; `org` and `sensor` on stored events come
//! from the key; an event id is stored once per org. Bearer secrets cross the wire: off loopback, serve HTTPS ([`IngestConfig::tls`]).
//!
//! Embedding (e.g. a first-run demo):
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use bounded_observe_mcp::ingest::{self, IngestConfig};
//! let dir = std::env::temp_dir().join("bounded-demo");
//! std::fs::create_dir_all(&dir)?;
//! let running = ingest::start(IngestConfig::ephemeral(dir.join("ingest.db"))).await?;
//! let admin = running.admin_client()?;
//! let key = admin.mint("acme", Some("demo")).await?;
//! // … run the sensor with --ingest running.base_url() --token key.token …
//! let rollups = admin.rollups(Some("acme")).await?;
//! running.shutdown().await?;
//! # Ok(()) }
//! ```

pub mod admin;
pub mod admission;
pub mod batch;
mod conn;
pub mod keys;
pub mod server;
pub mod store;
pub mod tls;
pub mod web;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::oneshot;

pub use admin::{AdminClient, AdminError, MintedKey};
pub use keys::AdminSecretSource;

/// Default listen address; also the sensor's default `--ingest` (DESIGN §7).
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_PORT);
/// DESIGN §3 / §7.
pub const DEFAULT_PORT: u16 = 7361;
/// Default database: a file in the working directory, so `bounded-ingest serve` and
/// `bounded-ingest mint` run from the same directory find the same database and admin secret.
pub const DEFAULT_DB_PATH: &str = "bounded-ingest.db";

/// Env: the admin secret (serve, mint, revoke). When unset (and no file is given), `serve` on
/// SQLite generates one beside the DB.
pub const ENV_ADMIN_SECRET: &str = "BOUNDED_INGEST_ADMIN_SECRET";
/// Env: a file holding the admin secret (serve, mint, revoke), as `--admin-secret-file`.
pub const ENV_ADMIN_SECRET_FILE: &str = "BOUNDED_INGEST_ADMIN_SECRET_FILE";
/// Env: the token signing secret for `serve` (32 bytes, base64). When unset (and no file is
/// given), `serve` on SQLite generates one beside the DB; on PostgreSQL it refuses to start.
pub const ENV_SIGNING_SECRET: &str = "BOUNDED_INGEST_SIGNING_SECRET";
/// Env: a file holding the token signing secret, as `--signing-secret-file`.
pub const ENV_SIGNING_SECRET_FILE: &str = "BOUNDED_INGEST_SIGNING_SECRET_FILE";
/// Env: a PEM CA to trust for TLS to PostgreSQL, besides the webpki roots (`--db-ca`).
pub const ENV_DB_CA: &str = "BOUNDED_INGEST_DB_CA";
/// Env: the ingest base URL for `mint` / `revoke` (the same variable the sensor reads).
pub const ENV_INGEST_BASE: &str = "BOUNDED_INGEST_BASE";
/// Env: the database for `serve`, a SQLite path or a `postgres://` URL (and for finding the
/// admin-secret file beside a SQLite database in `mint`/`revoke`).
pub const ENV_DB: &str = "BOUNDED_INGEST_DB";
/// Env: the listen address for `serve`.
pub const ENV_LISTEN: &str = "BOUNDED_INGEST_LISTEN";
/// Env: the most connections `serve` keeps open at once.
pub const ENV_MAX_CONNECTIONS: &str = "BOUNDED_INGEST_MAX_CONNECTIONS";

/// Largest `POST /v1/events` body: [`crate::event::MAX_BATCH_BODY_BYTES`].
pub const DEFAULT_MAX_BODY_BYTES: usize = crate::event::MAX_BATCH_BODY_BYTES;

/// How long a client may take to send a body. A sensor posts a few hundred KB at once; a body
/// trickling in slower than this is holding a batch slot for nothing.
pub const DEFAULT_BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Batches parsed, filtered and written at the same time, over all keys. Bounds memory (each
/// holds its body plus its prepared rows) without costing throughput: past a few, the cores and
/// the single writer are the limit.
pub const DEFAULT_MAX_CONCURRENT_BATCHES: usize = 16;

/// Batches of one key in progress at once, body reading included. A sensor posts one batch at a
/// time; a few keep room for several processes sharing a key, and the limit stops one key
/// holder from taking every slot or holding many bodies in memory.
pub const DEFAULT_MAX_BATCHES_PER_KEY: usize = 4;

/// Longest wait for the key's turn or a shared slot before the batch is refused with
/// `Retry-After` (429 or 503): a sensor retries later rather than holding a connection.
pub const DEFAULT_SLOT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Connections open at once; one more is closed as soon as it is accepted. Each costs a task,
/// a socket and hyper's buffers (tens of KiB): 1024 is far above what the sensors of one team
/// open (one each, kept alive) and far below the default descriptor limit's trouble.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// A request head must arrive within this of its first byte, or the connection is closed
/// (slow-header clients). A real head is a few hundred bytes sent at once.
pub const DEFAULT_HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A connection with no request in progress and no byte moving for this long is closed. Longer
/// than a sensor's gaps between batches under load, so its keep-alive connection is reused.
pub const DEFAULT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// How long shutdown waits for requests in flight before cutting them off.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Request limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Body over this → 413 (checked against `Content-Length` before reading, and while reading).
    pub max_body_bytes: usize,
    /// A batch with more events → 413 (DESIGN §4: batches hold at most 500).
    pub max_batch_events: usize,
    /// A body not fully received within this → 408.
    pub body_read_timeout: std::time::Duration,
    /// Shared batch slots (see [`DEFAULT_MAX_CONCURRENT_BATCHES`]).
    pub max_concurrent_batches: usize,
    /// Batches in progress per key (see [`DEFAULT_MAX_BATCHES_PER_KEY`]); past it → 429.
    pub max_batches_per_key: usize,
    /// Longest wait for the key's turn or a slot (see [`DEFAULT_SLOT_WAIT`]); past it → 429/503.
    pub slot_wait: std::time::Duration,
    /// Connections open at once (see [`DEFAULT_MAX_CONNECTIONS`]).
    pub max_connections: usize,
    /// From a request head's first byte to its end (see [`DEFAULT_HEADER_READ_TIMEOUT`]).
    pub header_read_timeout: std::time::Duration,
    /// Idle connections are closed after this (see [`DEFAULT_IDLE_TIMEOUT`]).
    pub idle_timeout: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_batch_events: crate::event::MAX_BATCH_EVENTS,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            max_concurrent_batches: DEFAULT_MAX_CONCURRENT_BATCHES,
            max_batches_per_key: DEFAULT_MAX_BATCHES_PER_KEY,
            slot_wait: DEFAULT_SLOT_WAIT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// Everything `start` needs.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// Where to listen; port 0 picks a free port (see [`RunningIngest::addr`]).
    pub listen: SocketAddr,
    /// The SQLite file; created with its schema on first start. Unused with [`Self::postgres`].
    pub db_path: PathBuf,
    /// A PostgreSQL database instead of the SQLite file: the store replicas share. It needs both
    /// secrets given ([`Self::signing_secret`] and [`Self::admin_secret`] or
    /// [`Self::admin_secret_file`]): nothing is generated per replica.
    pub postgres: Option<store::postgres::PgConnect>,
    /// The token signing secret; `None` reads or generates `<db>.signing-key` (SQLite only).
    pub signing_secret: Option<keys::SecretSetting>,
    /// The admin secret; `None` reads [`Self::admin_secret_file`], else reads or generates
    /// `<db>.admin-secret` (SQLite only).
    pub admin_secret: Option<String>,
    /// A file holding the admin secret, read and never created.
    pub admin_secret_file: Option<PathBuf>,
    pub limits: Limits,
    /// Serve HTTPS with this certificate and key; `None` serves plain HTTP.
    pub tls: Option<TlsFiles>,
    /// Allow plain HTTP on a non-loopback address (TLS terminated by something in front).
    pub insecure_plain_http: bool,
}

/// PEM files for HTTPS: the certificate chain (leaf first) and its private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl IngestConfig {
    pub fn new(listen: SocketAddr, db_path: impl Into<PathBuf>) -> Self {
        IngestConfig {
            listen,
            db_path: db_path.into(),
            postgres: None,
            signing_secret: None,
            admin_secret: None,
            admin_secret_file: None,
            limits: Limits::default(),
            tls: None,
            insecure_plain_http: false,
        }
    }

    /// On 127.0.0.1 with a free port chosen by the OS: for demos and tests.
    pub fn ephemeral(db_path: impl Into<PathBuf>) -> Self {
        IngestConfig::new(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0), db_path)
    }
}

/// Why the ingest could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    #[error("database {path}: {source}")]
    Store {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("database {path} has schema version {found}, and this build knows only version {known} (made by a newer bounded-ingest?); it was left untouched")]
    SchemaVersion {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error("database {path} is not a bounded-ingest database ({detail}); it was left untouched: give --db a new file")]
    ForeignDatabase { path: PathBuf, detail: String },
    #[error("refusing plain HTTP on {addr}, which is not a loopback address: sensor tokens, the admin secret and every event would cross the network in clear text; give --tls-cert and --tls-key, or --insecure-plain-http when a proxy in front terminates TLS")]
    PlainHttpOffLoopback { addr: SocketAddr },
    #[error("TLS file {path}: {reason}")]
    Tls { path: PathBuf, reason: String },
    #[error("cannot create the database file {path}: {source}")]
    DbFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("secret file {path}: {source}")]
    SecretFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("secret file {path} is malformed; restore it from a backup (a new one would invalidate every token)")]
    SecretMalformed { path: PathBuf },
    #[error("the signing secret from {ENV_SIGNING_SECRET} is not 32 bytes in base64 (make one with `bounded-ingest secret signing`)")]
    SigningSecretMalformed,
    #[error(transparent)]
    Postgres(#[from] store::postgres::PgOpenError),
    #[error("with a PostgreSQL database every replica needs the same {what}, and none was given: {how} (nothing is generated per replica, or replicas would refuse each other's tokens)")]
    SharedSecretMissing {
        what: &'static str,
        how: &'static str,
    },
    #[error(
        "admin secret from {ENV_ADMIN_SECRET} is shorter than {} characters",
        keys::MIN_ADMIN_SECRET_LEN
    )]
    WeakAdminSecret,
    #[error("the system random number generator is unavailable")]
    Rng,
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the store writer thread: {source}")]
    Thread { source: std::io::Error },
    #[error("the server stopped with an error: {0}")]
    Serve(std::io::Error),
}

/// The ingest refuses to mint a key or a secret without the OS generator (see `crate::random`).
impl From<crate::random::Unavailable> for IngestError {
    fn from(_: crate::random::Unavailable) -> Self {
        IngestError::Rng
    }
}

/// A started ingest. Dropping it without [`RunningIngest::shutdown`] leaves the server running
/// on the runtime until the runtime stops.
pub struct RunningIngest {
    addr: SocketAddr,
    tls: bool,
    admin_secret: String,
    admin_source: AdminSecretSource,
    db_path: PathBuf,
    store: Arc<dyn store::Store>,
    web: Arc<web::WebState>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Opens the store, loads (or creates) the secrets, binds and starts serving on the current
/// tokio runtime. Returns once the socket is bound, so `addr()` is ready to use.
pub async fn start(cfg: IngestConfig) -> Result<RunningIngest, IngestError> {
    // Refused before any file is touched.
    if cfg.tls.is_none() && !cfg.insecure_plain_http && !is_loopback(cfg.listen) {
        return Err(IngestError::PlainHttpOffLoopback { addr: cfg.listen });
    }
    let db_path = cfg.db_path.clone();
    let secrets = Secrets {
        signing: cfg.signing_secret.clone(),
        admin: cfg.admin_secret.clone(),
        admin_file: cfg.admin_secret_file.clone(),
    };
    let tls_files = cfg.tls.clone();
    let pg = cfg.postgres.clone();
    // File and SQLite work: off the async threads.
    let opened = tokio::task::spawn_blocking(move || {
        let tls = match &tls_files {
            Some(f) => Some(tls::server_config(&f.cert, &f.key)?),
            None => None,
        };
        if pg.is_some() {
            // Secrets before the database: a replica missing one must not touch it.
            let (signer, admin, source) = secrets.given()?;
            warn_readable_files(None, &secrets, &source, tls_files.as_ref());
            return Ok::<_, IngestError>((signer, admin, source, None, tls));
        }
        if let Some(dir) = db_path.parent().filter(|d| !d.as_os_str().is_empty()) {
            create_data_dir(dir).map_err(|source| IngestError::DataDir {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        // The store first: a database that is not ours is refused before a secret is written
        // beside it.
        let store: Arc<dyn store::Store> = store::SqliteStore::open(&db_path)?;
        let (signer, admin, source) = secrets.beside(&db_path)?;
        warn_readable_files(Some(&db_path), &secrets, &source, tls_files.as_ref());
        Ok::<_, IngestError>((signer, admin, source, Some(store), tls))
    })
    .await
    .map_err(|e| IngestError::Serve(std::io::Error::other(e.to_string())))?;
    let (signer, admin, admin_source, store, tls) = opened?;
    let store: Arc<dyn store::Store> = match (store, &cfg.postgres) {
        (Some(store), _) => store,
        (None, Some(pg)) => store::postgres::PgStore::open(pg).await?,
        // The SQLite store opens above whenever PostgreSQL is not set.
        (None, None) => return Err(IngestError::Serve(std::io::Error::other("no store opened"))),
    };

    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| IngestError::Bind {
            addr: cfg.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| IngestError::Bind {
        addr: cfg.listen,
        source,
    })?;
    let admin_secret = admin.expose().to_string();
    let web = web::WebState::new(tls.is_some());
    let web = Arc::new(match cfg.postgres {
        Some(_) => web.shared_store(),
        None => web,
    });
    let state = Arc::new(server::AppState {
        store: store.clone(),
        signer,
        admin,
        limits: cfg.limits,
        admission: admission::Admission::new(&cfg.limits),
        web: web.clone(),
    });
    let app = server::router(state);
    let listener = tls::IngestListener::new(listener, tls);
    let is_tls = listener.is_tls();
    let (stop, stopped) = oneshot::channel::<()>();
    let limits = cfg.limits;
    let task = tokio::spawn(conn::serve(listener, app, limits, async move {
        let _ = stopped.await;
    }));
    Ok(RunningIngest {
        addr,
        tls: is_tls,
        admin_secret,
        admin_source,
        db_path: cfg.db_path,
        store,
        web,
        stop: Some(stop),
        task,
    })
}

impl RunningIngest {
    /// The bound address (the real port when port 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, or `https://<addr>` with TLS: what to pass as the sensor's `--ingest`.
    pub fn base_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The admin secret in force (given, or read from / generated into the file).
    pub fn admin_secret(&self) -> &str {
        &self.admin_secret
    }

    /// Where the admin secret came from.
    pub fn admin_secret_source(&self) -> &AdminSecretSource {
        &self.admin_source
    }

    pub fn db_path(&self) -> &Path {
        &self.db_path
    }

    /// `<base>/ui/link?t=…`: opens a live view session in the browser that follows it, once,
    /// within [`web::LINK_TTL`]. `None` without the OS random generator.
    pub fn sign_in_link(&self) -> Option<String> {
        let t = self.web.sign_in_link()?;
        Some(format!("{}/ui/link?t={t}", self.base_url()))
    }

    /// An admin client bound to this ingest. With TLS it trusts the default roots only: for a
    /// certificate from a private CA, use [`AdminClient::with_extra_roots`].
    pub fn admin_client(&self) -> Result<AdminClient, AdminError> {
        AdminClient::new(&self.base_url(), &self.admin_secret)
    }

    /// Stops accepting, lets requests in flight finish (their commits included), stops the
    /// writer and closes the database.
    pub async fn shutdown(mut self) -> Result<(), IngestError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Open live view streams would otherwise hold their connections to the grace period.
        self.web.close();
        let served = tokio::time::timeout(SHUTDOWN_GRACE, &mut self.task).await;
        if served.is_err() {
            // A client holding a request open past the grace period: cut it off.
            self.task.abort();
        }
        self.store.close().await;
        match served {
            Ok(Ok(Ok(()))) | Err(_) => Ok(()),
            Ok(Ok(Err(e))) => Err(IngestError::Serve(e)),
            Ok(Err(e)) => Err(IngestError::Serve(std::io::Error::other(e.to_string()))),
        }
    }
}

/// Whether `addr` only accepts connections from this machine (127.0.0.0/8, `::1`, or an
/// IPv4-mapped loopback address). `0.0.0.0` and `::` listen on every interface: not loopback.
fn is_loopback(addr: SocketAddr) -> bool {
    addr.ip().to_canonical().is_loopback()
}

/// Creates the data directory (and any missing parent) owner-only; an existing one is left as
/// it is.
fn create_data_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// The secrets as configured (see [`IngestConfig`]): given ones first, files beside a SQLite
/// database only when none is given.
struct Secrets {
    signing: Option<keys::SecretSetting>,
    admin: Option<String>,
    admin_file: Option<PathBuf>,
}

impl Secrets {
    fn admin_setting(&self) -> Option<keys::SecretSetting> {
        match (&self.admin, &self.admin_file) {
            (Some(v), _) => Some(keys::SecretSetting::Value(v.clone())),
            (None, Some(p)) => Some(keys::SecretSetting::File(p.clone())),
            (None, None) => None,
        }
    }

    /// Both secrets, which must be given (PostgreSQL: shared by every replica).
    fn given(&self) -> Result<(keys::Signer, keys::AdminSecret, AdminSecretSource), IngestError> {
        let signing = self
            .signing
            .as_ref()
            .ok_or(IngestError::SharedSecretMissing {
                what: "token signing secret",
                how: "set BOUNDED_INGEST_SIGNING_SECRET or --signing-secret-file",
            })?;
        let admin = self
            .admin_setting()
            .ok_or(IngestError::SharedSecretMissing {
                what: "admin secret",
                how: "set BOUNDED_INGEST_ADMIN_SECRET or --admin-secret-file",
            })?;
        let signer = keys::Signer::from_setting(signing)?;
        let (admin, source) = keys::AdminSecret::from_setting(&admin)?;
        Ok((signer, admin, source))
    }

    /// The given secrets, else the files beside the SQLite database `db` (created on first
    /// start).
    fn beside(
        &self,
        db: &Path,
    ) -> Result<(keys::Signer, keys::AdminSecret, AdminSecretSource), IngestError> {
        let signer = match &self.signing {
            Some(s) => keys::Signer::from_setting(s)?,
            None => keys::Signer::load_or_create(db)?,
        };
        let (admin, source) = match self.admin_setting() {
            Some(s) => keys::AdminSecret::from_setting(&s)?,
            None => keys::AdminSecret::resolve(None, db)?,
        };
        Ok((signer, admin, source))
    }
}

/// One warning per store, secret or TLS key file that group or others may read. Files are not
/// changed: a group-readable backup setup may be deliberate, but it should be a choice.
fn warn_readable_files(
    db: Option<&Path>,
    secrets: &Secrets,
    admin: &AdminSecretSource,
    tls: Option<&TlsFiles>,
) {
    let mut files: Vec<(PathBuf, &str)> = Vec::new();
    if let Some(db) = db {
        files.extend([
            (db.to_path_buf(), "every stored event"),
            (store::sqlite::sidecar_path(db, "-wal"), "recent events"),
            (
                store::sqlite::sidecar_path(db, "-shm"),
                "the database's shared index",
            ),
        ]);
    }
    match (&secrets.signing, db) {
        (Some(keys::SecretSetting::File(path)), _) => {
            files.push((path.clone(), "the token signing key"))
        }
        (None, Some(db)) => files.push((keys::signing_secret_path(db), "the token signing key")),
        _ => {}
    }
    if let AdminSecretSource::File { path, .. } = admin {
        files.push((path.clone(), "the admin secret"));
    }
    if let Some(t) = tls {
        files.push((t.key.clone(), "the TLS private key"));
    }
    for (path, holds) in files {
        if let Some(mode) = group_or_other_readable(&path) {
            tracing::warn!(
                "{} can be read by group or others (mode {mode:o}) and holds {holds}: chmod 600 it",
                path.display()
            );
        }
    }
}

/// The permission bits of `path` when group or others may read (or write) it; `None` when it
/// is owner-only or does not exist.
#[cfg(unix)]
fn group_or_other_readable(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o066 != 0).then_some(mode)
}

#[cfg(not(unix))]
fn group_or_other_readable(_path: &Path) -> Option<u32> {
    None
}
