//! Interoperability with the official MCP TypeScript SDK: `@modelcontextprotocol/server-everything`
//! in streamableHttp mode, driven by the SDK's own Streamable HTTP client (tests/node/
//! http_client.mjs), once directly and once through the proxy. The client must see the same
//! messages, the same HTTP statuses and content types, and the session id the upstream issued.
//!
//! The node packages are pinned in tests/node/package-lock.json and installed by
//! scripts/test-deps.sh; when they are missing this test fails and says so (it never skips).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

const START_TIMEOUT: Duration = Duration::from_secs(60);
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

fn node_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node")
}

/// Fails (never skips) when the pinned packages are not installed.
fn require_node_packages() {
    let sdk = node_dir().join("node_modules/@modelcontextprotocol/sdk/package.json");
    let everything =
        node_dir().join("node_modules/@modelcontextprotocol/server-everything/package.json");
    assert!(
        sdk.exists() && everything.exists(),
        "the interop packages are not installed: run scripts/test-deps.sh (needs node and npm)"
    );
    let v = Command::new("node").arg("--version").output();
    assert!(
        v.is_ok_and(|o| o.status.success()),
        "node is not on PATH: install nodejs, then run scripts/test-deps.sh"
    );
}

/// A child killed and reaped on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// server-everything on 127.0.0.1:<ephemeral>; its stdout log is kept (it names the sessions).
struct Everything {
    _child: Reaped,
    port: u16,
    log: Arc<Mutex<String>>,
}

fn start_everything() -> Everything {
    let mut child = Command::new("node")
        .current_dir(node_dir())
        .args(["http_client.mjs", "serve-everything"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn node");
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    let child = Reaped(child);
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel();
    let kept = log.clone();
    // Drains stdout for the server's whole life, so its log can never fill the pipe.
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if let Some(p) = line.strip_prefix("LISTENING ") {
                let _ = tx.send(p.trim().to_string());
            }
            let mut l = kept.lock().expect("lock");
            l.push_str(&line);
            l.push('\n');
        }
    });
    let port = rx
        .recv_timeout(START_TIMEOUT)
        .expect("server-everything printed its port")
        .parse()
        .expect("port");
    Everything {
        _child: child,
        port,
        log,
    }
}

/// The proxy binary in front of `upstream`; returns it with its local port.
fn start_proxy(upstream: &str) -> (Reaped, u16) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .env_clear()
        .args(["--http", "--upstream", upstream])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn proxy");
    let err = BufReader::new(child.stderr.take().expect("stderr"));
    let child = Reaped(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in err.lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("[observe-mcp] listening http://127.0.0.1:") {
                let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                let _ = tx.send(port);
            }
        }
    });
    let port = rx
        .recv_timeout(START_TIMEOUT)
        .expect("proxy printed its listening line")
        .parse()
        .expect("port");
    (child, port)
}

/// Runs the SDK client's conversation against `url`; returns its JSON report.
fn run_client(url: &str) -> Value {
    let child = Command::new("node")
        .current_dir(node_dir())
        .args(["http_client.mjs", "client", url])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn node client");
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(CLIENT_TIMEOUT) {
        Ok(out) => out.expect("client output"),
        Err(_) => {
            // SAFETY: kill(2) on our own child, still unreaped (the waiting thread owns it).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("the SDK client did not finish within {CLIENT_TIMEOUT:?}");
        }
    };
    assert!(
        out.status.success(),
        "SDK client against {url} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("client prints one JSON line")
}

#[test]
fn official_sdk_client_sees_the_same_through_the_proxy() {
    require_node_packages();
    let server = start_everything();
    let upstream = format!("http://127.0.0.1:{}/mcp", server.port);
    let (_proxy, port) = start_proxy(&upstream);

    let mut direct = run_client(&upstream);
    let mut proxied = run_client(&format!("http://127.0.0.1:{port}/mcp"));

    // Each run has its own session: the one the client got through the proxy must be the one
    // the upstream issued (server-everything logs every session it creates).
    let sid = proxied["sessionId"]
        .as_str()
        .expect("a session id through the proxy")
        .to_string();
    assert!(
        server
            .log
            .lock()
            .expect("lock")
            .contains(&format!("Session initialized with ID: {sid}")),
        "session id {sid} was not issued by the upstream"
    );
    assert_ne!(direct["sessionId"], proxied["sessionId"]);
    direct["sessionId"] = Value::Null;
    proxied["sessionId"] = Value::Null;

    assert_eq!(
        direct["sum"]["content"][0]["text"],
        "The sum of 40 and 2 is 42."
    );
    assert!(direct["progressNotifications"].as_u64() > Some(0));
    // Messages, statuses, content types and session headers: all the same.
    assert_eq!(direct, proxied);
    let trace = proxied["trace"].as_array().expect("trace");
    assert!(
        trace
            .iter()
            .any(|t| t["method"] == "GET" && t["contentType"] == "text/event-stream"),
        "the GET stream went through the proxy: {trace:?}"
    );
    assert!(
        trace
            .iter()
            .any(|t| t["status"] == 202 && t["contentType"] == ""),
        "the 202 for a notification stayed type-less: {trace:?}"
    );
}
