//! The crate's one HTTP client policy, seen from the admin CLI (`bounded-ingest mint` /
//! `revoke`), which carries the admin secret out and a fresh sensor token back: a proxy named in
//! the environment never sees a connection, and a redirect is reported, never followed.

mod ingest_support;

use ingest_support::{ingest_command, stderr_lines};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Generous: the machine is shared and loaded.
const WAIT: Duration = Duration::from_secs(60);
const ADMIN_SECRET: &str = "adm_client_policy_test_secret";

/// A loopback listener that counts the connections it gets. `answer`, if any, is written to
/// each connection after its request head has been read; then the connection is closed.
struct Recorder {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

fn recorder(answer: Option<String>) -> Recorder {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            if let Some(answer) = &answer {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let _ = stream.write_all(answer.as_bytes());
            }
        }
    });
    Recorder { addr, connections }
}

impl Recorder {
    fn seen(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// The ingest with no proxy exemption inherited either: these tests set the proxy variables.
fn ingest_bin() -> Command {
    let mut c = ingest_command();
    c.env_remove("NO_PROXY").env_remove("no_proxy");
    c
}

/// `bounded-ingest serve` on 127.0.0.1:0; returns it and its base URL.
fn serve(db: &Path) -> (Child, String) {
    let mut child = ingest_bin()
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(db)
        .env("BOUNDED_INGEST_ADMIN_SECRET", ADMIN_SECRET)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bounded-ingest");
    let rx = stderr_lines(&mut child);
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            if let Some(i) = line.find("listening http://") {
                return (child, line[i + "listening ".len()..].trim().to_string());
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("bounded-ingest did not start");
}

fn stop(mut child: Child) {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let _ = child.wait();
}

/// Runs an admin subcommand against `base` with every proxy variable pointing at `proxy`.
fn admin(args: &[&str], base: &str, proxy: Option<SocketAddr>) -> Output {
    let mut c = ingest_bin();
    c.args(args)
        .args(["--ingest", base])
        .env("BOUNDED_INGEST_ADMIN_SECRET", ADMIN_SECRET);
    if let Some(p) = proxy {
        let url = format!("http://{p}");
        for v in [
            "HTTP_PROXY",
            "http_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            c.env(v, &url);
        }
    }
    c.output().expect("run bounded-ingest")
}

#[test]
fn mint_and_revoke_never_use_a_proxy_from_the_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (child, base) = serve(&dir.path().join("ingest.db"));
    let proxy = recorder(None);

    let out = admin(
        &["mint", "--org", "acme", "--json"],
        &base,
        Some(proxy.addr),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let key_id = key["keyId"].as_str().expect("keyId");
    let out = admin(&["revoke", key_id], &base, Some(proxy.addr));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    assert_eq!(
        proxy.seen(),
        0,
        "the proxy saw the admin secret and a fresh token"
    );
    stop(child);
}

#[test]
fn mint_and_revoke_report_a_redirect_and_do_not_follow_it() {
    let elsewhere = recorder(Some(
        "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
            .to_string(),
    ));
    let redirector = recorder(Some(format!(
        "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://{}/v1/admin/keys?t=SECRET_IN_LOCATION\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        elsewhere.addr
    )));
    let base = format!("http://{}", redirector.addr);
    for args in [
        &["mint", "--org", "acme"][..],
        &["revoke", "k_0123456789"][..],
    ] {
        let out = admin(args, &base, None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("307") && err.contains("redirect") && err.contains("not followed"),
            "a clear error: {err}"
        );
        assert!(
            err.contains(&elsewhere.addr.to_string()),
            "names the target: {err}"
        );
        assert!(
            !err.contains(ADMIN_SECRET) && !err.contains("SECRET_IN_LOCATION"),
            "{err}"
        );
    }
    assert_eq!(redirector.seen(), 2);
    assert_eq!(
        elsewhere.seen(),
        0,
        "the redirect was followed with the admin secret"
    );
}
