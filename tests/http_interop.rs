//! Interoperability with the official MCP TypeScript SDK: `@modelcontextprotocol/server-everything`
//! in streamableHttp mode, driven by the SDK's own Streamable HTTP client (tests/node/
//! http_client.mjs), once directly and once through the proxy. The client must see the same
//! messages, the same HTTP statuses and content types, and the session id the upstream issued.
//!
//! The node packages are pinned in tests/node/package-lock.json and installed by
//! scripts/test-deps.sh; when they are missing this test fails and says so (it never skips).

mod interop_support;

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use interop_support::{node_dir, require_node_packages, start_everything, start_proxy};
use serde_json::Value;

const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

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
    let (_proxy, port) = start_proxy(&upstream, &[]);

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
