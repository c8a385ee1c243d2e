//! A throwaway PostgreSQL cluster for tests: `initdb` into a temporary directory, `pg_ctl start`
//! on a free loopback port, and stop-and-remove when the [`PgCluster`] is dropped (also while a
//! failing test unwinds), so no test leaves a server or a data directory behind.
//!
//! The server runs as an unprivileged user (`nobody`) when the tests run as root: `postgres`
//! refuses to start as root, and a test must not need a privileged server anyway. It listens on
//! 127.0.0.1 only, with password (SCRAM) authentication for TCP, so the ingest under test logs
//! in the way it would against a real database; its Unix socket lives inside the temporary
//! directory and trusts local logins, for the harness's own `psql`.
//!
//! It never touches a system cluster (`/var/run/postgresql`, port 5432) and never reads the
//! caller's `PG*` variables: each would point a command at some other server.
//!
//! Needs Debian's `postgresql` (scripts/test-deps.sh installs it); `BOUNDED_PG_BINDIR` names
//! another directory holding `initdb`, `pg_ctl` and `psql`.

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The superuser `initdb` creates; the ingest under test logs in as this role.
pub const PG_USER: &str = "bounded";
/// Who runs the server when the tests run as root.
const UNPRIVILEGED_USER: &str = "nobody";
/// How long a start may take before the test fails (initdb plus start is ~1 s here; a loaded CI
/// machine is slower).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts at starting on a fresh port: the port is picked by binding port 0 and releasing it,
/// and another process may take it in between.
const START_ATTEMPTS: usize = 3;
/// Variables libpq and the PostgreSQL tools read; the harness sets what it needs explicitly.
const PG_VARS: &[&str] = &[
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGUSER",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGDATABASE",
    "PGSERVICE",
    "PGSERVICEFILE",
    "PGSSLMODE",
    "PGOPTIONS",
    "PGDATA",
];

/// A running cluster, stopped and deleted on drop.
pub struct PgCluster {
    /// Holds the data directory, the socket and the server log; removed after the server stops.
    dir: tempfile::TempDir,
    bindir: PathBuf,
    /// `Some((uid, gid))` when the server runs as another user than the tests.
    run_as: Option<(u32, u32)>,
    port: u16,
    password: String,
    /// fsync and synchronous commit on (benchmarks); off for tests.
    durable: bool,
}

impl PgCluster {
    /// Creates and starts a cluster; panics (failing the test) with the server log if it cannot.
    pub fn start() -> PgCluster {
        PgCluster::start_with(false)
    }

    /// A cluster that flushes every commit to disk (`fsync=on`, `synchronous_commit=on`), as a
    /// production server does: for benchmarks, where the cost of durability is what is measured.
    pub fn start_durable() -> PgCluster {
        PgCluster::start_with(true)
    }

    fn start_with(durable: bool) -> PgCluster {
        let bindir = bindir();
        let run_as = unprivileged_ids();
        let dir = tempfile::Builder::new()
            .prefix("bounded-pg-")
            .tempdir()
            .expect("temporary directory");
        if let Some((uid, gid)) = run_as {
            // The server's user must own everything it writes: the directory itself (socket,
            // log) and, through initdb, the data directory inside it.
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown temp dir");
        }
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod temp dir");
        let password = random_password();
        let mut cluster = PgCluster {
            dir,
            bindir,
            run_as,
            port: 0,
            password,
            durable,
        };
        cluster.initdb();
        let mut last_log = String::new();
        for _ in 0..START_ATTEMPTS {
            cluster.port = free_port();
            if cluster.pg_ctl_start() {
                cluster.wait_accepting();
                return cluster;
            }
            last_log = cluster.server_log();
        }
        panic!("PostgreSQL did not start in {START_ATTEMPTS} attempts; server log:\n{last_log}");
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Turns TLS on with this certificate chain and key (PEM), as a managed database serves
    /// it: written into the data directory for the server's user, then a configuration reload.
    /// Plain connections stay allowed; `sslmode` decides.
    pub fn enable_tls(&self, cert_pem: &str, key_pem: &str) {
        for (name, pem) in [("server.crt", cert_pem), ("server.key", key_pem)] {
            let path = self.data_dir().join(name);
            std::fs::write(&path, pem).expect("write TLS file");
            // The server refuses a key that others can read.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .expect("chmod TLS file");
            if let Some((uid, gid)) = self.run_as {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown TLS file");
            }
        }
        // Two calls: ALTER SYSTEM refuses to run inside the one transaction of a multi-statement
        // string.
        self.psql("postgres", "ALTER SYSTEM SET ssl = on");
        self.psql("postgres", "SELECT pg_reload_conf()");
        let deadline = Instant::now() + START_TIMEOUT;
        while self.psql("postgres", "SHOW ssl") != "on" {
            assert!(
                Instant::now() < deadline,
                "TLS did not come on; server log:\n{}",
                self.server_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The temporary directory holding the cluster (gone once the cluster is dropped).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The password of [`PG_USER`] (random per cluster).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// A connection URL for `database` over TCP with password authentication, as the ingest
    /// takes it in `--db`. `sslmode=disable`: the test cluster has no certificate, and the
    /// ingest otherwise insists on TLS.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{PG_USER}:{}@127.0.0.1:{}/{database}?sslmode=disable",
            self.password, self.port
        )
    }

    /// Creates an empty database and returns its URL: one per test keeps tests that share a
    /// cluster apart.
    pub fn create_database(&self, name: &str) -> String {
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "database names here are plain identifiers: {name}"
        );
        self.psql("postgres", &format!("CREATE DATABASE {name}"));
        self.url(name)
    }

    /// Runs `sql` in `database` as [`PG_USER`] over the cluster's Unix socket and returns what
    /// `psql` printed (unaligned, tuples only); panics if `psql` fails.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let out = self.psql_output(database, sql);
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// `psql` over the Unix socket, its output as it came.
    pub fn psql_output(&self, database: &str, sql: &str) -> Output {
        let mut c = self.tool("psql");
        c.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .arg("-h")
            .arg(self.dir.path())
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-U", PG_USER, "-d", database, "-c", sql]);
        c.output().expect("run psql")
    }

    /// A PostgreSQL tool from the server's bindir, as the server's user, with none of the
    /// caller's `PG*` variables.
    pub fn tool(&self, name: &str) -> Command {
        let mut c = Command::new(self.bindir.join(name));
        for v in PG_VARS {
            c.env_remove(v);
        }
        // The tools resolve the current directory; the caller's may be closed to `nobody`.
        c.current_dir(self.dir.path());
        if let Some((uid, gid)) = self.run_as {
            // From root, std also drops the supplementary groups when it sets the uid.
            c.uid(uid).gid(gid);
        }
        c.stdin(Stdio::null());
        c
    }

    /// The server's main process (its backends are its children), from `postmaster.pid`.
    pub fn postmaster_pid(&self) -> u32 {
        let pid = std::fs::read_to_string(self.data_dir().join("postmaster.pid"))
            .expect("read postmaster.pid");
        pid.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("a pid in postmaster.pid")
    }

    /// What the server wrote to its log so far (for failure messages).
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn initdb(&self) {
        let pwfile = self.dir.path().join("pwfile");
        std::fs::write(&pwfile, format!("{}\n", self.password)).expect("write pwfile");
        if let Some((uid, gid)) = self.run_as {
            std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid)).expect("chown pwfile");
        }
        let out = self
            .tool("initdb")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", PG_USER, "-E", "UTF8", "--locale=C"])
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
            .arg(format!("--pwfile={}", pwfile.display()))
            // A test cluster is thrown away after the test; syncing its files buys nothing.
            .arg("--no-sync")
            .output()
            .expect("run initdb");
        let _ = std::fs::remove_file(&pwfile);
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `pg_ctl start -w`; false if the server did not come up (e.g. the port was taken).
    fn pg_ctl_start(&self) -> bool {
        // Loopback only; the socket in our directory, never the system's; fsync off unless
        // durable, because a test cluster never outlives a power cut (process kills, which the
        // tests do, lose nothing committed either way).
        let sync = if self.durable {
            "-c fsync=on -c synchronous_commit=on"
        } else {
            "-c fsync=off"
        };
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} {sync} -c max_connections=100",
            self.port,
            self.dir.path().display()
        );
        let status = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.log_path())
            .args(["-o", &options, "-w", "-t"])
            .arg(START_TIMEOUT.as_secs().to_string())
            .arg("start")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run pg_ctl start");
        status.success()
    }

    /// Waits until a TCP login succeeds: `pg_ctl -w` checks the socket, the ingest uses TCP.
    fn wait_accepting(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let out = self
                .tool("pg_isready")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    PG_USER,
                ])
                .output()
                .expect("run pg_isready");
            if out.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "PostgreSQL not accepting on 127.0.0.1:{}; server log:\n{}",
                self.port,
                self.server_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // Immediate: the cluster is about to be deleted, so there is nothing to flush. The
        // temporary directory goes when `dir` drops, after the server has exited.
        let _ = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The cluster this test binary's tests share, started by the first test that asks and
/// stopped when the last one holding it is done: `initdb` costs about a second, a database
/// per test almost nothing. Only a weak reference stays here, because statics are never
/// dropped and a strong one would leave the server running after the tests.
pub fn shared() -> std::sync::Arc<PgCluster> {
    use std::sync::{Arc, Mutex, Weak};
    static SHARED: Mutex<Weak<PgCluster>> = Mutex::new(Weak::new());
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(cluster) = slot.upgrade() {
        return cluster;
    }
    let cluster = Arc::new(PgCluster::start());
    *slot = Arc::downgrade(&cluster);
    cluster
}

impl PgCluster {
    /// A new empty database with a name no other test of this process uses; its URL.
    pub fn fresh_database(&self) -> String {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        self.create_database(&format!("t{}_{n}", std::process::id()))
    }
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_accepts(port: u16) -> bool {
    TcpStream::connect_timeout(
        &SocketAddrV4::new(Ipv4Addr::LOCALHOST, port).into(),
        Duration::from_millis(500),
    )
    .is_ok()
}

/// The directory with `initdb`, `pg_ctl`, `pg_isready` and `psql`: `BOUNDED_PG_BINDIR`, else the
/// newest Debian `/usr/lib/postgresql/<major>/bin`.
fn bindir() -> PathBuf {
    if let Some(d) = std::env::var_os("BOUNDED_PG_BINDIR") {
        return PathBuf::from(d);
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let major: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((major, bin))
        })
        .max_by_key(|(major, _)| *major);
    match newest {
        Some((_, bin)) => bin,
        None => panic!(
            "PostgreSQL server binaries are needed (apt-get install postgresql, or \
             scripts/test-deps.sh; BOUNDED_PG_BINDIR names another directory)"
        ),
    }
}

/// `nobody`'s uid and gid when the tests run as root (from /etc/passwd: no user database
/// library for one lookup); `None` otherwise, and the server runs as the tests' own user.
fn unprivileged_ids() -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    // The owner of a file we just created is our effective uid.
    let probe = tempfile::NamedTempFile::new().expect("probe file");
    if probe.as_file().metadata().expect("probe metadata").uid() != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    let ids = passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 4 && f[0] == UNPRIVILEGED_USER)
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    });
    match ids {
        Some(ids) => Some(ids),
        None => panic!("running as root and no {UNPRIVILEGED_USER} user to run PostgreSQL as"),
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// 32 hex characters from the kernel's random source: a per-cluster password nobody can guess
/// and no test hard-codes.
fn random_password() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("read /dev/urandom");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
