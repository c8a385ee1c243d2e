//! The reference ingest's files at rest: the database, its `-wal` and `-shm`, and the secret
//! files are owner-only from their creation; a store or secret file that group or others can
//! read is warned about at start; a database that is not ours, or of a newer schema, is refused
//! before anything writes to it, and left byte for byte as it was.

mod ingest_support;

use ingest_support::{ingest_command, stderr_lines, without_ingest_vars, INGEST_BIN};

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bounded_observe_mcp::ingest::{self, IngestConfig};

/// Generous: the machine is shared and loaded.
const WAIT: Duration = Duration::from_secs(60);

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    PathBuf::from(format!("{}{suffix}", db.display()))
}

/// `bounded-ingest serve` on 127.0.0.1:0 under the usual umask (022), its stderr collected.
struct Served {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Vec<String>,
}

fn serve(db: &Path) -> Served {
    // The umask is set in a shell in front of the binary: the files' modes must not depend on
    // the umask the test runner happens to have.
    let mut child = without_ingest_vars(&mut Command::new("sh"))
        .arg("-c")
        .arg("umask 022 && exec \"$0\" \"$@\"")
        .arg(INGEST_BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(db)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bounded-ingest");
    let lines = stderr_lines(&mut child);
    let mut served = Served {
        child,
        lines,
        stderr: Vec::new(),
    };
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        match served.lines.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                let up = line.contains("listening http://");
                served.stderr.push(line);
                if up {
                    return served;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = served.child.kill();
    let _ = served.child.wait();
    panic!("bounded-ingest did not start; stderr: {:?}", served.stderr);
}

impl Served {
    /// SIGTERM; returns every stderr line. (Right after its `listening` line the ingest may not
    /// handle SIGTERM yet, so how it ends is not checked here.)
    fn stop(mut self) -> Vec<String> {
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.child.wait();
        self.stderr.extend(self.lines.try_iter());
        self.stderr
    }
}

#[test]
fn database_wal_shm_and_secrets_are_created_owner_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let db = data.join("ingest.db");
    let served = serve(&db);
    // While it runs, the database is in WAL mode: all three SQLite files exist.
    for path in [
        db.clone(),
        sidecar(&db, "-wal"),
        sidecar(&db, "-shm"),
        sidecar(&db, ".signing-key"),
        sidecar(&db, ".admin-secret"),
    ] {
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
    assert_eq!(mode(&data), 0o700, "the data directory it created");
    let stderr = served.stop();
    assert!(
        !stderr.iter().any(|l| l.contains("group or others")),
        "no warning for its own files: {stderr:?}"
    );
}

#[test]
fn store_and_secret_files_open_to_group_or_others_are_warned_about_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("ingest.db");
    serve(&db).stop();
    let admin = sidecar(&db, ".admin-secret");
    let signing = sidecar(&db, ".signing-key");
    for (path, m) in [(&db, 0o644), (&admin, 0o640), (&signing, 0o604)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(m)).expect("chmod");
    }
    let stderr = serve(&db).stop().join("\n");
    for path in [&db, &admin, &signing] {
        let name = path.display().to_string();
        assert!(
            stderr
                .lines()
                .any(|l| l.contains(&name) && l.contains("group or others")),
            "no warning about {name}: {stderr}"
        );
    }
    assert_eq!(mode(&db), 0o644, "warned about, not changed");
}

/// Runs `bounded-ingest serve` on `db`, which must refuse to start; returns its stderr.
fn refused(db: &Path) -> String {
    let mut child = ingest_command()
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(db)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bounded-ingest");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        if line.contains("listening http://") {
            // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let _ = child.wait();
            panic!("{} was opened: {lines:?}", db.display());
        }
        lines.push(line);
    }
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(1), "{lines:?}");
    lines.join("\n")
}

/// Every file in `dir` with its bytes.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| {
            let e = e.expect("entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read"),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn another_programs_database_is_refused_and_left_byte_identical() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("notes.db");
    {
        let c = rusqlite::Connection::open(&db).expect("open");
        c.execute_batch(
            "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);
             INSERT INTO notes (body) VALUES ('keep me');",
        )
        .expect("foreign schema");
    }
    let before = snapshot(dir.path());
    let msg = refused(&db);
    assert!(
        msg.contains("not a bounded-ingest database") && msg.contains("notes"),
        "{msg}"
    );
    assert_eq!(
        snapshot(dir.path()),
        before,
        "the file is untouched and nothing was created beside it"
    );
}

#[test]
fn a_newer_schema_is_refused_and_left_byte_identical() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("ingest.db");
    {
        // A later layout: one version past ours, and a table of today's schema renamed.
        let c = rusqlite::Connection::open(&db).expect("open");
        c.execute_batch(
            "CREATE TABLE keys (key_id TEXT PRIMARY KEY, org TEXT NOT NULL);
             CREATE TABLE events (seq INTEGER PRIMARY KEY, body TEXT NOT NULL);
             CREATE TABLE sensor_stats (key_id TEXT PRIMARY KEY);
             PRAGMA user_version = 3;",
        )
        .expect("newer schema");
    }
    let before = snapshot(dir.path());
    let msg = refused(&db);
    assert!(
        msg.contains("schema version 3") && msg.contains("left untouched"),
        "{msg}"
    );
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn a_file_that_is_not_sqlite_is_refused_and_left_byte_identical() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("ingest.db");
    std::fs::write(
        &db,
        b"this is somebody's spreadsheet, not a database\n".repeat(100),
    )
    .expect("write");
    let before = snapshot(dir.path());
    let msg = refused(&db);
    assert!(msg.contains("not an SQLite database"), "{msg}");
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn our_database_reopens_and_keeps_its_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("ingest.db");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let running = ingest::start(IngestConfig::ephemeral(&db))
            .await
            .expect("first start");
        let key = running
            .admin_client()
            .expect("admin")
            .mint("acme", None)
            .await
            .expect("mint");
        running.shutdown().await.expect("shutdown");
        let running = ingest::start(IngestConfig::ephemeral(&db))
            .await
            .expect("second start");
        let store_key = running
            .admin_client()
            .expect("admin")
            .revoke(&key.key_id)
            .await;
        assert!(store_key.is_ok(), "the key survived: {store_key:?}");
        running.shutdown().await.expect("shutdown");
    });
}
