//! The ingest on either store, for the tests that run against both: a SQLite file in a
//! temporary directory, or a fresh database on this test binary's shared PostgreSQL cluster
//! (tests/pg_support) with both secrets given in files, as every replica is given them.
//! [`both_stores!`] turns one test body into a test per store.
//!
//! A test binary using it declares `mod pg_support;` and `mod ingest_support;` beside it.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use bounded_observe_mcp::ingest::keys::{self, SecretSetting};
use bounded_observe_mcp::ingest::store::postgres::PgConnect;
use bounded_observe_mcp::ingest::IngestConfig;

use super::ingest_support::ingest_command;
use super::pg_support::{self, PgCluster};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    Sqlite,
    Postgres,
}

/// One test's database, and the secrets a PostgreSQL replica is given.
pub struct TestDb {
    pub kind: StoreKind,
    /// The SQLite file and its secrets, or the PostgreSQL secret files.
    pub dir: tempfile::TempDir,
    cluster: Option<Arc<PgCluster>>,
    url: Option<String>,
}

const SIGNING_FILE: &str = "signing.secret";
const ADMIN_FILE: &str = "admin.secret";

impl TestDb {
    pub fn new(kind: StoreKind) -> TestDb {
        TestDb::in_dir(kind, tempfile::tempdir().expect("tempdir"))
    }

    /// In `dir` (kept by the caller across restarts).
    pub fn in_dir(kind: StoreKind, dir: tempfile::TempDir) -> TestDb {
        let (cluster, url) = match kind {
            StoreKind::Sqlite => (None, None),
            StoreKind::Postgres => {
                let cluster = pg_support::shared();
                let url = cluster.fresh_database();
                for (name, secret) in [
                    (SIGNING_FILE, keys::new_signing_secret_text().expect("rng")),
                    (ADMIN_FILE, keys::new_admin_secret_text().expect("rng")),
                ] {
                    let path = dir.path().join(name);
                    if !path.exists() {
                        std::fs::write(path, format!("{secret}\n")).expect("write secret");
                    }
                }
                (Some(cluster), Some(url))
            }
        };
        TestDb {
            kind,
            dir,
            cluster,
            url,
        }
    }

    /// The SQLite file (unused with PostgreSQL).
    pub fn sqlite_path(&self) -> PathBuf {
        self.dir.path().join("ingest.db")
    }

    /// The PostgreSQL URL (password included).
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    pub fn cluster(&self) -> Option<&PgCluster> {
        self.cluster.as_deref()
    }

    /// The database name on the cluster.
    pub fn pg_database(&self) -> Option<String> {
        let url = self.url.as_deref()?;
        let after_host = url.rsplit_once('/')?.1;
        Some(
            after_host
                .split('?')
                .next()
                .unwrap_or(after_host)
                .to_string(),
        )
    }

    pub fn signing_secret_file(&self) -> PathBuf {
        self.dir.path().join(SIGNING_FILE)
    }

    pub fn admin_secret_file(&self) -> PathBuf {
        self.dir.path().join(ADMIN_FILE)
    }

    /// `--db` for the binary: the SQLite path or the URL.
    pub fn db_arg(&self) -> std::ffi::OsString {
        match &self.url {
            Some(u) => u.into(),
            None => self.sqlite_path().into_os_string(),
        }
    }

    /// The token signer the ingest uses, to make tokens it did not mint.
    pub fn signer(&self) -> keys::Signer {
        match &self.url {
            None => keys::Signer::load_or_create(&self.sqlite_path()).expect("signing key"),
            Some(_) => keys::Signer::from_setting(&SecretSetting::File(self.signing_secret_file()))
                .expect("signing key"),
        }
    }

    /// An in-process ingest on 127.0.0.1:0 over this database.
    pub fn config(&self) -> IngestConfig {
        let mut cfg = IngestConfig::ephemeral(self.sqlite_path());
        if let Some(url) = &self.url {
            cfg.postgres = Some(PgConnect::new(url, &[]).expect("test URL"));
            cfg.signing_secret = Some(SecretSetting::File(self.signing_secret_file()));
            cfg.admin_secret_file = Some(self.admin_secret_file());
        }
        cfg
    }

    /// `bounded-ingest serve --listen 127.0.0.1:0` over this database: the SQLite path in
    /// `--db`, or the URL in `BOUNDED_INGEST_DB` (the way the docs say to pass a password) and
    /// the secrets as files.
    pub fn serve_command(&self) -> Command {
        let mut c = ingest_command();
        c.args(["serve", "--listen", "127.0.0.1:0"]);
        match &self.url {
            None => {
                c.arg("--db").arg(self.sqlite_path());
            }
            Some(url) => {
                c.env("BOUNDED_INGEST_DB", url)
                    .arg("--signing-secret-file")
                    .arg(self.signing_secret_file())
                    .arg("--admin-secret-file")
                    .arg(self.admin_secret_file());
            }
        }
        c
    }

    /// `mint` / `revoke` flags finding the admin secret: `--db` beside SQLite, the file with
    /// PostgreSQL.
    pub fn admin_args(&self) -> Vec<std::ffi::OsString> {
        match &self.url {
            None => vec!["--db".into(), self.sqlite_path().into()],
            Some(_) => vec![
                "--admin-secret-file".into(),
                self.admin_secret_file().into(),
            ],
        }
    }

    /// `SELECT count(*) FROM events` on either store.
    pub fn stored_events(&self) -> u64 {
        match (&self.cluster, self.pg_database()) {
            (Some(c), Some(db)) => c
                .psql(&db, "SELECT count(*) FROM events")
                .parse()
                .expect("count"),
            _ => {
                let conn = rusqlite::Connection::open(self.sqlite_path()).expect("open sqlite");
                conn.query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0))
                    .expect("count") as u64
            }
        }
    }
}

/// Runs `async fn name(store: StoreKind)` once per store: `both_stores!(name)` (or
/// `both_stores!(name, threads)`) makes the tests `name::sqlite` and `name::postgres`, each on a
/// multi-threaded tokio runtime.
#[macro_export]
macro_rules! both_stores {
    ($name:ident) => {
        $crate::both_stores!($name, 2);
    };
    ($name:ident, $threads:literal) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
            async fn sqlite() {
                super::$name($crate::store_support::StoreKind::Sqlite).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
            async fn postgres() {
                super::$name($crate::store_support::StoreKind::Postgres).await
            }
        }
    };
}

/// How long a started `bounded-ingest` may take to say where it listens (a loaded machine).
const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A running `bounded-ingest serve`: its base URL, and every stderr line so far.
pub struct Served {
    pub child: std::process::Child,
    pub base: String,
    lines: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Served {
    /// Spawns `cmd` (a `serve` command) and waits for its `listening` line; panics with what it
    /// printed if it exits or stays silent.
    pub fn start(mut cmd: Command) -> Served {
        use std::io::BufRead;
        let mut child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn bounded-ingest");
        let stderr = child.stderr.take().expect("stderr piped");
        let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let keep = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                keep.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(line.clone());
                let _ = tx.send(line);
            }
        });
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        while std::time::Instant::now() < deadline {
            match rx.recv_timeout(std::time::Duration::from_millis(200)) {
                Ok(line) => {
                    if let Some(i) = line.find("listening http") {
                        let base = line[i + "listening ".len()..].trim().to_string();
                        return Served { child, base, lines };
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "bounded-ingest did not report its address; stderr: {:?}",
            lines.lock().unwrap_or_else(|e| e.into_inner())
        );
    }

    /// Everything it printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }

    /// SIGTERM, then the exit status (SIGKILL and a panic past the timeout).
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let st = self.child.wait();
                panic!("bounded-ingest ignored SIGTERM ({st:?})");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// SIGKILL: no shutdown, no flush, as a crash or an OOM kill.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
