//! The PostgreSQL test cluster itself (tests/pg_support): it accepts a password login on
//! loopback, runs unprivileged when the tests run as root, refuses a wrong password, and is
//! stopped and deleted when dropped, also when the test holding it panics. The ingest's
//! PostgreSQL tests rely on each of these.

mod pg_support;

use std::os::unix::fs::MetadataExt;
use std::process::Stdio;

use pg_support::{port_accepts, PgCluster, PG_USER};

/// `psql` over TCP to 127.0.0.1 with `password`: the path the ingest takes.
fn tcp_login(pg: &PgCluster, password: &str) -> std::process::Output {
    pg.tool("psql")
        .args(["-X", "-A", "-t", "-w", "-h", "127.0.0.1", "-p"])
        .arg(pg.port().to_string())
        .args(["-U", PG_USER, "-d", "postgres", "-c", "SELECT current_user"])
        .env("PGPASSWORD", password)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run psql")
}

#[test]
fn cluster_accepts_a_password_login_on_loopback_and_refuses_a_wrong_one() {
    let pg = PgCluster::start();
    let ok = tcp_login(&pg, pg.password());
    assert!(
        ok.status.success(),
        "login failed: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), PG_USER);

    let bad = tcp_login(&pg, "not-the-password");
    assert!(!bad.status.success(), "a wrong password was accepted");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("password authentication failed"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    // Loopback only.
    assert_eq!(pg.psql("postgres", "SHOW listen_addresses"), "127.0.0.1");
}

#[test]
fn cluster_runs_unprivileged_when_the_tests_run_as_root() {
    let pg = PgCluster::start();
    // The postmaster, not a backend: a backend ends with the connection that asked for its pid.
    let pid = pg.postmaster_pid();
    let server_uid = std::fs::metadata(format!("/proc/{pid}"))
        .expect("postmaster process")
        .uid();
    let our_uid = tempfile::NamedTempFile::new()
        .expect("probe")
        .as_file()
        .metadata()
        .expect("probe metadata")
        .uid();
    if our_uid == 0 {
        assert_ne!(server_uid, 0, "the server runs as root");
    } else {
        assert_eq!(server_uid, our_uid);
    }
    assert_eq!(
        std::fs::metadata(pg.dir().join("data"))
            .expect("data dir")
            .uid(),
        server_uid,
        "the data directory belongs to the server's user"
    );
}

#[test]
fn cluster_is_stopped_and_removed_on_drop() {
    let pg = PgCluster::start();
    let (dir, port) = (pg.dir().to_path_buf(), pg.port());
    assert!(dir.exists() && port_accepts(port));
    drop(pg);
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(!port_accepts(port), "a server still listens on {port}");
}

#[test]
fn cluster_is_stopped_and_removed_when_the_test_panics() {
    let seen = std::sync::Mutex::new(None);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let pg = PgCluster::start();
        *seen.lock().expect("lock") = Some((pg.dir().to_path_buf(), pg.port()));
        panic!("a failing test");
    }));
    assert!(outcome.is_err());
    let (dir, port) = seen.lock().expect("lock").take().expect("cluster started");
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(!port_accepts(port), "a server still listens on {port}");
}

#[test]
fn create_database_gives_a_url_the_server_accepts() {
    let pg = PgCluster::start();
    let url = pg.create_database("ingest_one");
    assert!(url.starts_with("postgres://bounded:") && url.contains("/ingest_one?"));
    assert_eq!(
        pg.psql("ingest_one", "SELECT current_database()"),
        "ingest_one"
    );
}
