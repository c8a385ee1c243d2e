//! TLS end to end, on the real binaries: `bounded-ingest serve --tls-cert --tls-key` with a
//! certificate for 127.0.0.1/localhost issued by a private CA made here; the sensor trusts it
//! only through `--ingest-ca`, and so do `bounded-ingest mint` / `revoke`. Off loopback, plain
//! HTTP is refused unless `--insecure-plain-http` is given.

mod ingest_support;
mod pki_support;

use ingest_support::{ingest_command as ingest_bin, stderr_lines};

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bounded_observe_mcp::ingest::AdminClient;
use serde_json::{json, Value};

/// Generous: the machine is shared and loaded.
const WAIT: Duration = Duration::from_secs(60);

/// A private CA and a server certificate it issued for 127.0.0.1 and localhost, as PEM files.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn make_pki(dir: &Path) -> Pki {
    let issued = pki_support::issue("bounded test CA", "bounded-ingest");
    let pki = Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("ingest.crt"),
        key: dir.join("ingest.key"),
    };
    std::fs::write(&pki.ca, &issued.ca_pem).expect("write ca");
    std::fs::write(&pki.cert, &issued.cert_pem).expect("write cert");
    std::fs::write(&pki.key, &issued.key_pem).expect("write key");
    std::fs::set_permissions(&pki.key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    pki
}

/// How a `serve` ended up: listening (at this base URL) or exited.
enum Start {
    Listening {
        child: Child,
        base: String,
        _stderr: mpsc::Receiver<String>,
    },
    Exited {
        status: ExitStatus,
        stderr: String,
    },
}

fn start_serve(args: &[&std::ffi::OsStr]) -> Start {
    let mut child = ingest_bin()
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bounded-ingest");
    let rx = stderr_lines(&mut child);
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                if let Some(i) = line.find("listening ") {
                    let base = line[i + "listening ".len()..].trim().to_string();
                    return Start::Listening {
                        child,
                        base,
                        _stderr: rx,
                    };
                }
                seen.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().expect("wait");
                return Start::Exited {
                    status,
                    stderr: seen.join("\n"),
                };
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("bounded-ingest neither listened nor exited; stderr: {seen:?}");
}

fn stop(mut child: Child) -> ExitStatus {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    child.wait().expect("wait")
}

fn os<S: AsRef<std::ffi::OsStr> + ?Sized>(s: &S) -> &std::ffi::OsStr {
    s.as_ref()
}

#[test]
fn plain_http_off_loopback_is_refused_unless_insecure_plain_http() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("ingest.db");
    match start_serve(&[os("--listen"), os("0.0.0.0:0"), os("--db"), db.as_os_str()]) {
        Start::Exited { status, stderr } => {
            assert_eq!(status.code(), Some(2), "a usage error: {stderr}");
            assert!(
                stderr.contains("0.0.0.0")
                    && stderr.contains("--tls-cert")
                    && stderr.contains("--insecure-plain-http"),
                "a clear error: {stderr}"
            );
        }
        Start::Listening { child, base, .. } => {
            stop(child);
            panic!("served plain HTTP off loopback at {base}");
        }
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("dir").count(),
        0,
        "refused before creating any file"
    );
    // Loopback stays plain HTTP by default; off loopback, only when asked for.
    match start_serve(&[
        os("--listen"),
        os("0.0.0.0:0"),
        os("--db"),
        db.as_os_str(),
        os("--insecure-plain-http"),
    ]) {
        Start::Listening { child, base, .. } => {
            assert!(base.starts_with("http://0.0.0.0:"), "{base}");
            // Right after its `listening` line it may not handle SIGTERM yet: how it ends is
            // not what this test is about.
            stop(child);
        }
        Start::Exited { status, stderr } => panic!("{status:?}: {stderr}"),
    }
    // Half a TLS configuration is a usage error too.
    let out = ingest_bin()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            "x.pem",
            "--db",
        ])
        .arg(&db)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-key"));
}

fn admin_cli(args: &[&str], db: &Path, base: &str, ca: Option<&Path>) -> Output {
    let mut c = ingest_bin();
    c.args(args).args(["--ingest", base, "--db"]).arg(db);
    if let Some(ca) = ca {
        c.arg("--ingest-ca").arg(ca);
    }
    c.output().expect("run bounded-ingest")
}

fn report_fixture() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .parent()
        .expect("target dir")
        .join("examples/report_fixture")
}

/// One MCP session through the real wrapper (initialize, tools/list, one tools/call) with
/// `flags`; returns the tool call's answer, the exit status and the wrapper's stderr.
fn wrapped_session(flags: &[&std::ffi::OsStr]) -> (Value, ExitStatus, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("BOUNDED_") {
            cmd.env_remove(&k);
        }
    }
    let mut child = cmd
        .args(flags)
        .args(["--flush-ms", "50", "--"])
        .arg(report_fixture())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn wrapper");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut err = child.stderr.take().expect("stderr");
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let requests = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "tls-test", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "issue_refund", "arguments": {"amount_cents": 4900}}}),
    ];
    let mut last = Value::Null;
    for req in requests {
        stdin
            .write_all(format!("{req}\n").as_bytes())
            .expect("write request");
        stdin.flush().expect("flush");
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read answer");
        last = serde_json::from_str(&line).expect("answer is JSON");
        assert_eq!(last["id"], req["id"]);
    }
    drop(stdin);
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        assert!(Instant::now() < deadline, "wrapper did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    (last, status, err_thread.join().expect("stderr"))
}

fn stored_events(base: &str, secret: &str, ca: &Path) -> Vec<Value> {
    let roots = bounded_observe_mcp::http_client::load_ca_file(ca).expect("ca");
    let admin = AdminClient::with_extra_roots(base, secret, roots).expect("admin client");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(admin.events(&[("org", "acme")]))
        .expect("read back")
}

#[test]
fn sensor_and_admin_cli_reach_an_https_ingest_only_through_its_private_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = make_pki(dir.path());
    let db = dir.path().join("ingest.db");
    let (child, base) = match start_serve(&[
        os("--listen"),
        os("127.0.0.1:0"),
        os("--db"),
        db.as_os_str(),
        os("--tls-cert"),
        pki.cert.as_os_str(),
        os("--tls-key"),
        pki.key.as_os_str(),
    ]) {
        Start::Listening { child, base, .. } => (child, base),
        Start::Exited { status, stderr } => panic!("{status:?}: {stderr}"),
    };
    assert!(base.starts_with("https://127.0.0.1:"), "{base}");
    let secret = std::fs::read_to_string(dir.path().join("ingest.db.admin-secret"))
        .expect("admin secret")
        .trim()
        .to_string();

    // A client that connects and never sends a ClientHello holds up nobody else.
    let silent = std::net::TcpStream::connect(base.trim_start_matches("https://")).expect("tcp");

    // The admin CLI: untrusted without the CA, fine with it.
    let out = admin_cli(&["mint", "--org", "acme"], &db, &base, None);
    assert_eq!(out.status.code(), Some(1), "untrusted certificate");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    let out = admin_cli(&["mint", "--org", "acme"], &db, &base, Some(&pki.ca));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_string();
    assert!(token.starts_with("obs1."), "{token}");

    // The sensor without the CA: the server runs and answers, nothing lands.
    let (answer, status, stderr) =
        wrapped_session(&[os("--ingest"), os(&base), os("--token"), os(&token)]);
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(
        stored_events(&base, &secret, &pki.ca).is_empty(),
        "an untrusted ingest got events"
    );

    // With the CA (flag, then env): the events land.
    let (_, status, stderr) = wrapped_session(&[
        os("--ingest"),
        os(&base),
        os("--token"),
        os(&token),
        os("--ingest-ca"),
        pki.ca.as_os_str(),
    ]);
    assert!(status.success(), "{status:?}: {stderr}");
    let events = stored_events(&base, &secret, &pki.ca);
    assert_eq!(events.len(), 1, "{events:?}; wrapper stderr: {stderr}");
    assert_eq!(events[0]["rec"]["action"], "issue_refund");
    assert_eq!(events[0]["rec"]["fields"]["amount_cents"], 4900);

    // A bad CA file: one warning, the server still runs, nothing is sent.
    let missing = dir.path().join("missing-ca.pem");
    let (answer, status, stderr) = wrapped_session(&[
        os("--ingest"),
        os(&base),
        os("--token"),
        os(&token),
        os("--ingest-ca"),
        missing.as_os_str(),
    ]);
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert!(status.success(), "{status:?}");
    assert_eq!(
        stderr.matches("missing-ca.pem").count(),
        1,
        "one warning: {stderr}"
    );
    assert_eq!(stored_events(&base, &secret, &pki.ca).len(), 1);

    // revoke over HTTPS with the CA from the environment.
    let key_id = token.split('.').nth(1).expect("key id").to_string();
    let out = ingest_bin()
        .args(["revoke", &key_id, "--ingest", &base, "--db"])
        .arg(&db)
        .env("BOUNDED_INGEST_CA", &pki.ca)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The live view's session cookie is `Secure` when the ingest serves TLS.
    let set_cookie = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let opts = bounded_observe_mcp::http_client::ClientOptions {
                extra_roots: bounded_observe_mcp::http_client::load_ca_file(&pki.ca).expect("ca"),
                ..Default::default()
            };
            let http = bounded_observe_mcp::http_client::build(&opts).expect("client");
            let r = http
                .post(format!("{base}/ui/signin"))
                .json(&serde_json::json!({ "secret": secret }))
                .send()
                .await
                .expect("sign in over TLS");
            assert_eq!(r.status(), 200);
            r.headers()["set-cookie"]
                .to_str()
                .expect("ascii")
                .to_string()
        });
    assert!(
        set_cookie.contains("; Secure") && set_cookie.contains("HttpOnly"),
        "{set_cookie}"
    );

    drop(silent);
    assert!(stop(child).success());
}
