//! `bounded-ingest`: the reference ingest (DESIGN §7).
//!
//! * `serve [--listen 127.0.0.1:7361] [--db bounded-ingest.db | --db postgres://…]
//!   [--tls-cert PEM --tls-key PEM] [--max-connections 1024]` runs the ingest until SIGINT or
//!   SIGTERM. It prints `[bounded-ingest] listening http://<addr>` (`https://` with TLS) on
//!   stderr once bound (with `--listen 127.0.0.1:0`, that line tells the chosen port). On a
//!   non-loopback `--listen` it refuses plain HTTP (exit 2) unless `--insecure-plain-http` is
//!   given. A `postgres://` (or `postgresql://`) `--db` selects the PostgreSQL store, which
//!   replicas share; anything else is a SQLite file.
//! * `mint --org ORG [--name N]` prints the new sensor token on stdout (key id on stderr), or
//!   the whole answer as JSON with `--json`.
//! * `revoke KEY_ID` revokes a key.
//! * `secret signing|admin` prints a fresh secret, for replicas that must be given theirs.
//!
//! Secrets: each one is `--<name>-file`, else `BOUNDED_INGEST_<NAME>`, else
//! `BOUNDED_INGEST_<NAME>_FILE`, else (SQLite only) the file beside the database, generated on
//! first start. With PostgreSQL, `serve` refuses to start without both: replicas must share
//! them, and a secret generated per replica would make them refuse each other's tokens.
//!
//! `mint` and `revoke` are thin clients of the admin API at `--ingest` / `BOUNDED_INGEST_BASE`,
//! authenticated with the admin secret found as above (beside a SQLite `--db` /
//! `BOUNDED_INGEST_DB`; they never open the database). An `https://` ingest with a certificate
//! from a private CA needs `--ingest-ca` / `BOUNDED_INGEST_CA` (the same option as the
//! sensor's). They never use a proxy from the environment and never follow a redirect (see
//! `http_client`).
//!
//! A database URL's password is never printed: not in `--help`, errors, logs or `Debug`.
//!
//! Exit codes: 0 success, 1 failure (cannot start, ingest unreachable or refused), 2 usage
//! (including plain HTTP asked for off loopback).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use bounded_observe_mcp::config::ENV_INGEST_CA;
use bounded_observe_mcp::ingest::keys::SecretSetting;
use bounded_observe_mcp::ingest::store::postgres::PgConnect;
use bounded_observe_mcp::ingest::{
    self, keys, AdminClient, AdminSecretSource, IngestConfig, IngestError, TlsFiles,
    DEFAULT_DB_PATH, DEFAULT_LISTEN, ENV_ADMIN_SECRET, ENV_ADMIN_SECRET_FILE, ENV_DB, ENV_DB_CA,
    ENV_INGEST_BASE, ENV_LISTEN, ENV_MAX_CONNECTIONS, ENV_SIGNING_SECRET, ENV_SIGNING_SECRET_FILE,
};

/// Prefix of every diagnostic line.
const PREFIX: &str = "[bounded-ingest]";
/// Default ingest for `mint` / `revoke`, the same as the sensor's.
const DEFAULT_INGEST_BASE: &str = bounded_observe_mcp::config::DEFAULT_INGEST;

#[derive(Debug, Parser)]
#[command(
    name = "bounded-ingest",
    version,
    about = "Reference ingest for bounded-observe-mcp: sensor keys, an embedded store, rollups and evidence read-back"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the ingest
    Serve {
        /// Address to listen on; port 0 picks a free port (printed on stderr). Off loopback it needs --tls-cert and --tls-key, or --insecure-plain-http [env: BOUNDED_INGEST_LISTEN] [default: 127.0.0.1:7361]
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Serve HTTPS with this PEM certificate chain (leaf first); needs --tls-key
        #[arg(long, value_name = "PEM", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The PEM private key of --tls-cert (keep it 0600)
        #[arg(long, value_name = "PEM", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Serve plain HTTP on a non-loopback --listen: only when a proxy in front terminates TLS (tokens, the admin secret and events cross the network otherwise in clear text)
        #[arg(long, conflicts_with = "tls_cert")]
        insecure_plain_http: bool,
        /// SQLite database file, created on first start, with the secrets generated beside it; or a postgres://user:password@host/db URL (sslmode, sslrootcert), shared by replicas, which then need both secrets given. Prefer the environment variable for a URL: a command line is visible to every local user [env: BOUNDED_INGEST_DB] [default: bounded-ingest.db]
        #[arg(long, value_name = "PATH|URL", value_parser = parse_db)]
        db: Option<DbArg>,
        /// PEM file of a private CA to trust for TLS to PostgreSQL, besides the webpki roots (as sslrootcert in the URL) [env: BOUNDED_INGEST_DB_CA]
        #[arg(long, value_name = "PEM")]
        db_ca: Option<PathBuf>,
        /// File holding the token signing secret (32 bytes, base64; `bounded-ingest secret signing` makes one), shared by every replica; read, never created [env: BOUNDED_INGEST_SIGNING_SECRET, or a file in BOUNDED_INGEST_SIGNING_SECRET_FILE] [default with SQLite: <db>.signing-key, generated]
        // The line above is `--help`'s text, as clap prints it: not HTML.
        #[allow(rustdoc::invalid_html_tags)]
        #[arg(long, value_name = "PATH")]
        signing_secret_file: Option<PathBuf>,
        /// File holding the admin secret (16 characters or more), shared by every replica; read, never created [env: BOUNDED_INGEST_ADMIN_SECRET, or a file in BOUNDED_INGEST_ADMIN_SECRET_FILE] [default with SQLite: <db>.admin-secret, generated]
        // The line above is `--help`'s text, as clap prints it: not HTML.
        #[allow(rustdoc::invalid_html_tags)]
        #[arg(long, value_name = "PATH")]
        admin_secret_file: Option<PathBuf>,
        /// Most connections open at once; one more is closed as soon as it is accepted [env: BOUNDED_INGEST_MAX_CONNECTIONS] [default: 1024]
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        max_connections: Option<u32>,
        /// Log every stored batch (key, accepted, rejected, duplicates, dropped)
        #[arg(long)]
        debug: bool,
    },
    /// Mint a sensor key for an org and print its token
    Mint {
        /// Organisation the key's events are stamped with
        #[arg(long)]
        org: String,
        /// Human-readable key name
        #[arg(long)]
        name: Option<String>,
        /// Print `{keyId, token, org, name}` as JSON instead of the bare token
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Revoke a sensor key: its next batch is refused
    Revoke {
        /// The key id (`k_…`), as printed by `mint`
        key_id: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Print a fresh secret on stdout, to give every replica of a PostgreSQL deployment
    Secret {
        /// Which secret: `signing` (32 random bytes, base64url) or `admin` (`adm_…`)
        #[arg(value_enum)]
        kind: SecretKind,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SecretKind {
    Signing,
    Admin,
}

/// `--db`: a SQLite file or a PostgreSQL URL. The URL's `Debug` hides it (it holds the password).
#[derive(Clone)]
enum DbArg {
    Sqlite(PathBuf),
    Postgres(String),
}

impl std::fmt::Debug for DbArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DbArg::Sqlite(p) => f.debug_tuple("Sqlite").field(p).finish(),
            DbArg::Postgres(_) => f.write_str("Postgres(<redacted>)"),
        }
    }
}

/// Never fails: clap quotes the value of a failed parse, and this value may hold a password.
fn parse_db(s: &str) -> Result<DbArg, std::convert::Infallible> {
    let lower = s.get(..13).unwrap_or(s).to_ascii_lowercase();
    Ok(
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            DbArg::Postgres(s.to_string())
        } else {
            DbArg::Sqlite(PathBuf::from(s))
        },
    )
}

#[derive(Debug, clap::Args)]
struct AdminArgs {
    /// Ingest base URL [env: BOUNDED_INGEST_BASE] [default: http://127.0.0.1:7361]
    #[arg(long, value_name = "URL")]
    ingest: Option<String>,
    /// File holding the admin secret [env: BOUNDED_INGEST_ADMIN_SECRET, or a file in BOUNDED_INGEST_ADMIN_SECRET_FILE]
    #[arg(long, value_name = "PATH")]
    admin_secret_file: Option<PathBuf>,
    /// SQLite database whose `<db>.admin-secret` file is read when no admin secret is given (never opened; with a postgres:// URL the secret must be given) [env: BOUNDED_INGEST_DB] [default: bounded-ingest.db]
    #[arg(long, value_name = "PATH|URL", value_parser = parse_db)]
    db: Option<DbArg>,
    /// PEM file of a private CA to trust for an https:// ingest, besides the system's roots [env: BOUNDED_INGEST_CA]
    #[arg(long, value_name = "PATH")]
    ingest_ca: Option<PathBuf>,
}

/// The flag, else the environment variable, else the default.
fn flag_or_env(flag: Option<String>, env: &str, default: &str) -> String {
    flag.or_else(|| std::env::var(env).ok().filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| default.to_string())
}

fn db_arg(flag: Option<DbArg>) -> DbArg {
    flag.unwrap_or_else(
        || match parse_db(&flag_or_env(None, ENV_DB, DEFAULT_DB_PATH)) {
            Ok(db) => db,
            Err(never) => match never {},
        },
    )
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A secret as the operator gave it: the `--…-file` flag, else the variable holding its value,
/// else the variable naming its file.
fn secret_setting(flag: Option<PathBuf>, value_env: &str, file_env: &str) -> Option<SecretSetting> {
    flag.map(SecretSetting::File)
        .or_else(|| env_nonempty(value_env).map(SecretSetting::Value))
        .or_else(|| env_nonempty(file_env).map(|p| SecretSetting::File(PathBuf::from(p))))
}

impl AdminArgs {
    fn client(&self) -> anyhow::Result<AdminClient> {
        let base = flag_or_env(self.ingest.clone(), ENV_INGEST_BASE, DEFAULT_INGEST_BASE);
        let given = secret_setting(
            self.admin_secret_file.clone(),
            ENV_ADMIN_SECRET,
            ENV_ADMIN_SECRET_FILE,
        );
        let secret = match (given, db_arg(self.db.clone())) {
            (Some(SecretSetting::Value(v)), _) => v.trim().to_string(),
            (Some(SecretSetting::File(path)), _) => std::fs::read_to_string(&path)
                .map(|s| s.trim().to_string())
                .with_context(|| format!("admin secret file {}", path.display()))?,
            (None, DbArg::Sqlite(db)) => {
                let path = keys::admin_secret_path(&db);
                std::fs::read_to_string(&path)
                    .map(|s| s.trim().to_string())
                    .with_context(|| {
                        format!(
                            "no admin secret: set {ENV_ADMIN_SECRET} or --admin-secret-file, or run from where `serve` keeps {}",
                            path.display()
                        )
                    })?
            }
            (None, DbArg::Postgres(_)) => anyhow::bail!(
                "no admin secret: with a PostgreSQL database, set {ENV_ADMIN_SECRET} or --admin-secret-file (the one the replicas are given)"
            ),
        };
        let ca = self.ingest_ca.clone().or_else(|| {
            std::env::var_os(ENV_INGEST_CA)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        let roots = match ca {
            Some(path) => bounded_observe_mcp::http_client::load_ca_file(&path)
                .context("ingest CA (--ingest-ca / BOUNDED_INGEST_CA)")?,
            None => Vec::new(),
        };
        Ok(AdminClient::with_extra_roots(&base, &secret, roots)?)
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let debug = matches!(cli.command, Command::Serve { debug: true, .. });
    bounded_observe_mcp::log::init_with_prefix(PREFIX, debug);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("bounded-ingest")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{PREFIX} error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{PREFIX} error: {e:#}");
            // Plain HTTP off loopback is a usage error: the command line asked for it.
            match e.downcast_ref::<IngestError>() {
                Some(IngestError::PlainHttpOffLoopback { .. }) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

async fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Serve {
            listen,
            db,
            db_ca,
            signing_secret_file,
            admin_secret_file,
            max_connections,
            tls_cert,
            tls_key,
            insecure_plain_http,
            ..
        } => {
            let listen = match listen {
                Some(l) => l,
                None => match std::env::var(ENV_LISTEN) {
                    Ok(v) if !v.trim().is_empty() => v.trim().parse().with_context(|| {
                        format!("{ENV_LISTEN}={v:?} is not an address like 127.0.0.1:7361")
                    })?,
                    _ => DEFAULT_LISTEN,
                },
            };
            let max_connections = match max_connections {
                Some(n) => n as usize,
                None => match std::env::var(ENV_MAX_CONNECTIONS) {
                    Ok(v) if !v.trim().is_empty() => v
                        .trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|n| *n > 0)
                        .with_context(|| {
                            format!("{ENV_MAX_CONNECTIONS}={v:?} is not a positive integer")
                        })?,
                    _ => ingest::DEFAULT_MAX_CONNECTIONS,
                },
            };
            let tls = match (tls_cert, tls_key) {
                (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
                _ => None,
            };
            let mut cfg = match db_arg(db) {
                DbArg::Sqlite(path) => IngestConfig::new(listen, path),
                DbArg::Postgres(url) => {
                    let ca = db_ca.or_else(|| env_nonempty(ENV_DB_CA).map(PathBuf::from));
                    let roots = match ca {
                        Some(path) => bounded_observe_mcp::http_client::load_ca_file(&path)
                            .context("database CA (--db-ca / BOUNDED_INGEST_DB_CA)")?,
                        None => Vec::new(),
                    };
                    let mut cfg = IngestConfig::new(listen, PathBuf::new());
                    cfg.postgres = Some(PgConnect::new(&url, &roots)?);
                    cfg
                }
            };
            cfg.tls = tls;
            cfg.insecure_plain_http = insecure_plain_http;
            cfg.limits.max_connections = max_connections;
            cfg.signing_secret = secret_setting(
                signing_secret_file,
                ENV_SIGNING_SECRET,
                ENV_SIGNING_SECRET_FILE,
            );
            match secret_setting(admin_secret_file, ENV_ADMIN_SECRET, ENV_ADMIN_SECRET_FILE) {
                Some(SecretSetting::Value(v)) => cfg.admin_secret = Some(v),
                Some(SecretSetting::File(p)) => cfg.admin_secret_file = Some(p),
                None => {}
            }
            serve(cfg).await
        }
        Command::Mint {
            org,
            name,
            json,
            admin,
        } => {
            let key = admin.client()?.mint(&org, name.as_deref()).await?;
            if json {
                let mut v =
                    serde_json::json!({ "keyId": key.key_id, "token": key.token, "org": key.org });
                if let Some(n) = &key.name {
                    v["name"] = serde_json::Value::String(n.clone());
                }
                println!("{v}");
            } else {
                eprintln!("{PREFIX} minted key {} for org {}", key.key_id, key.org);
                println!("{}", key.token);
            }
            Ok(())
        }
        Command::Revoke { key_id, admin } => {
            admin.client()?.revoke(&key_id).await?;
            eprintln!("{PREFIX} revoked key {key_id}");
            Ok(())
        }
        Command::Secret { kind } => {
            let secret = match kind {
                SecretKind::Signing => keys::new_signing_secret_text()?,
                SecretKind::Admin => keys::new_admin_secret_text()?,
            };
            println!("{secret}");
            Ok(())
        }
    }
}

async fn serve(cfg: IngestConfig) -> anyhow::Result<()> {
    let db = cfg.db_path.clone();
    let store = match &cfg.postgres {
        Some(pg) => format!("Database {} (PostgreSQL)", pg.target()),
        None => format!("Database {} (WAL, synchronous=FULL)", db.display()),
    };
    let signing = match &cfg.signing_secret {
        Some(SecretSetting::File(p)) => format!("signing key from {}", p.display()),
        Some(SecretSetting::Value(_)) => format!("signing key from {ENV_SIGNING_SECRET}"),
        None => format!("signing key {}", keys::signing_secret_path(&db).display()),
    };
    let admin_file_given = cfg.admin_secret_file.is_some() && cfg.admin_secret.is_none();
    let running = ingest::start(cfg).await?;
    match running.admin_secret_source() {
        AdminSecretSource::Provided => {
            tracing::info!("Admin secret given");
        }
        AdminSecretSource::File { path, .. } if admin_file_given => {
            tracing::info!("Admin secret read from {}", path.display());
        }
        AdminSecretSource::File { path, created } => {
            let verb = if *created {
                "generated into"
            } else {
                "read from"
            };
            tracing::info!(
                "Admin secret {verb} {} (set {ENV_ADMIN_SECRET} to choose one)",
                path.display()
            );
        }
    }
    tracing::info!("{store}; {signing}");
    // The handlers go in before the line scripts and tests wait for (keep its shape): a SIGTERM
    // sent as soon as it shows must stop the ingest cleanly, not kill it outright.
    let stop = stop_signal();
    tracing::info!("listening {}", running.base_url());
    stop.await;
    tracing::info!("Shutting down");
    running.shutdown().await?;
    Ok(())
}

/// SIGINT or SIGTERM, with both handlers installed before this returns (`ctrl_c()` would
/// install its own only when first polled).
fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let int = signal(SignalKind::interrupt());
        let term = signal(SignalKind::terminate());
        async move {
            match (int, term) {
                (Ok(mut int), Ok(mut term)) => {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
