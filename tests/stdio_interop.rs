//! Interoperability: the official Rust SDK's client (rmcp, `TokioChildProcess`) talks through
//! the wrapper to an rmcp server (examples/rmcp_echo_server.rs) and to the official
//! `@modelcontextprotocol/server-everything` (Node), in both protocol eras, and sees every
//! response and notification. The wrapper runs with a `file:` ingest, so nothing touches the
//! network.

#![allow(deprecated)] // logging notifications: deprecated in the newest era, still in the field

mod interop_support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientRequest, LoggingMessageNotificationParam,
    ProgressNotificationParam, ProtocolVersion, Request, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::{json, Value};

/// Generous bound for each client step on a loaded machine.
const STEP: Duration = Duration::from_secs(60);

/// Records every notification the client receives.
#[derive(Clone, Default)]
struct Recorder {
    logs: Arc<Mutex<Vec<Value>>>,
    progress: Arc<Mutex<Vec<f64>>>,
}

impl ClientHandler for Recorder {
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.logs.lock().expect("logs").push(params.data);
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress
            .lock()
            .expect("progress")
            .push(params.progress);
    }
}

fn wrapper_command(server: &[&std::ffi::OsStr], ingest: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("BOUNDED_") {
            cmd.env_remove(&k);
        }
    }
    cmd.arg("--ingest")
        .arg(format!("file:{}", ingest.display()))
        .arg("--")
        .args(server);
    cmd
}

async fn connect(
    client: Recorder,
    lifecycle: ClientLifecycleMode,
    cmd: tokio::process::Command,
) -> RunningService<RoleClient, Recorder> {
    let transport = TokioChildProcess::new(cmd).expect("spawn the wrapper");
    tokio::time::timeout(STEP, client.serve_with_lifecycle(transport, lifecycle))
        .await
        .expect("handshake timed out")
        .expect("handshake through the wrapper")
}

fn args(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("arguments must be an object"),
    }
}

/// Calls a tool and returns the first text content.
async fn call_text(service: &RunningService<RoleClient, Recorder>, name: &str, a: Value) -> String {
    let params = CallToolRequestParams::new(name.to_string()).with_arguments(args(a));
    let result = tokio::time::timeout(STEP, service.call_tool(params))
        .await
        .expect("tools/call timed out")
        .unwrap_or_else(|e| panic!("tools/call {name}: {e}"));
    let v = serde_json::to_value(&result).expect("result serialises");
    assert_ne!(v["isError"], json!(true), "{name} failed: {v}");
    v["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{name}: no text content in {v}"))
        .to_string()
}

/// Calls a tool with a progress token and returns the first text content.
async fn call_with_progress(
    service: &RunningService<RoleClient, Recorder>,
    name: &str,
    a: Value,
) -> String {
    let params = CallToolRequestParams::new(name.to_string()).with_arguments(args(a));
    let handle = service
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("send tools/call");
    let response = tokio::time::timeout(STEP, handle.await_response())
        .await
        .expect("tools/call timed out")
        .expect("tools/call response");
    let ServerResult::CallToolResult(result) = response else {
        panic!("unexpected response {response:?}");
    };
    let v = serde_json::to_value(&result).expect("result serialises");
    v["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{name}: no text content in {v}"))
        .to_string()
}

fn sorted(values: &Mutex<Vec<f64>>) -> Vec<f64> {
    let mut v = values.lock().expect("values").clone();
    v.sort_by(f64::total_cmp);
    v
}

/// Waits (bounded) until `f` holds; notifications may be handled just after the response.
async fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + STEP;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "never saw {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One full session; `lifecycle` picks the era, `era` is the version that must be negotiated.
async fn rmcp_session(lifecycle: ClientLifecycleMode, era: ProtocolVersion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = interop_support::rmcp_echo_server();
    let recorder = Recorder::default();
    let logs = recorder.logs.clone();
    let progress = recorder.progress.clone();
    let service = connect(
        recorder,
        lifecycle,
        wrapper_command(&[server.as_os_str()], &dir.path().join("events.jsonl")),
    )
    .await;

    let info = service.peer_info().expect("server info");
    let name = info.server_info.as_ref().map(|i| i.name.clone());
    assert_eq!(name.as_deref(), Some("rmcp-echo"));
    assert_eq!(info.protocol_version, era);

    let tools = tokio::time::timeout(STEP, service.list_all_tools())
        .await
        .expect("tools/list timed out")
        .expect("tools/list");
    let mut names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    names.sort();
    assert_eq!(names, ["big", "echo", "notify", "sum"]);

    let text = "héllo \"quoted\"\nnew line \u{1F600} \\ end";
    assert_eq!(
        call_text(&service, "echo", json!({ "text": text })).await,
        text
    );
    assert_eq!(
        call_text(&service, "sum", json!({ "a": 2, "b": 40 })).await,
        "42"
    );

    // Notifications before the response: every one of them must arrive.
    let answer = call_with_progress(&service, "notify", json!({ "count": 5 })).await;
    assert_eq!(answer, "sent 5");
    eventually("5 logging notifications", || {
        logs.lock().map(|l| l.len() >= 5).unwrap_or(false)
    })
    .await;
    eventually("5 progress notifications", || {
        progress.lock().map(|p| p.len() >= 5).unwrap_or(false)
    })
    .await;
    // The relay keeps wire order (tests/stdio_relay.rs); the SDK may run notification handlers
    // concurrently, so compare as sets: each exactly once.
    let mut steps: Vec<i64> = logs
        .lock()
        .expect("logs")
        .iter()
        .map(|v| v["step"].as_i64().expect("step"))
        .collect();
    steps.sort_unstable();
    assert_eq!(steps, [0, 1, 2, 3, 4]);
    assert_eq!(sorted(&progress), [1.0, 2.0, 3.0, 4.0, 5.0]);

    // A multi-MB response frame.
    let big = call_text(&service, "big", json!({ "bytes": 3_000_000 })).await;
    assert_eq!(big.len(), 3_000_000);
    assert!(
        big == interop_support::stamped_text(3_000_000),
        "the 3 MB answer arrived with its bytes changed, lost, repeated or out of order"
    );

    // Pipelined calls: all in flight at once, every answer matched to its request.
    let calls = (0..40).map(|i| {
        let service = &service;
        async move {
            (
                i,
                call_text(service, "echo", json!({ "text": format!("msg-{i}") })).await,
            )
        }
    });
    for (i, got) in futures_util::future::join_all(calls).await {
        assert_eq!(got, format!("msg-{i}"));
    }

    let _ = tokio::time::timeout(STEP, service.cancel()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_client_and_server_through_the_wrapper_newest_era() {
    rmcp_session(
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
        ProtocolVersion::V_2026_07_28,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_client_and_server_through_the_wrapper_initialize_era() {
    rmcp_session(
        ClientLifecycleMode::Initialize,
        ProtocolVersion::LATEST_WITH_INITIALIZE,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_client_and_official_server_everything_through_the_wrapper() {
    let script = interop_support::everything_script();
    let dir = tempfile::tempdir().expect("tempdir");
    let recorder = Recorder::default();
    let logs = recorder.logs.clone();
    let progress = recorder.progress.clone();
    // Auto: server/discover first, then the `initialize` fallback a 2025-era server needs.
    let lifecycle = ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::LATEST],
        legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
    };
    let service = connect(
        recorder,
        lifecycle,
        wrapper_command(
            &["node".as_ref(), script.as_os_str(), "stdio".as_ref()],
            &dir.path().join("events.jsonl"),
        ),
    )
    .await;

    let info = service.peer_info().expect("server info");
    assert!(
        info.server_info.is_some(),
        "serverInfo missing from the handshake: {info:?}"
    );

    let tools = tokio::time::timeout(STEP, service.list_all_tools())
        .await
        .expect("tools/list timed out")
        .expect("tools/list");
    let names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    for want in [
        "echo",
        "get-sum",
        "trigger-long-running-operation",
        "toggle-simulated-logging",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }

    assert_eq!(
        call_text(
            &service,
            "echo",
            json!({ "message": "through the wrapper ü" })
        )
        .await,
        "Echo: through the wrapper ü"
    );
    assert_eq!(
        call_text(&service, "get-sum", json!({ "a": 2, "b": 40 })).await,
        "The sum of 2 and 40 is 42."
    );

    // Progress notifications during a call (5 steps over half a second).
    let done = call_with_progress(
        &service,
        "trigger-long-running-operation",
        json!({ "duration": 0.5, "steps": 5 }),
    )
    .await;
    assert!(done.contains("completed"), "{done}");
    eventually("5 progress notifications", || {
        progress.lock().map(|p| p.len() >= 5).unwrap_or(false)
    })
    .await;
    assert_eq!(sorted(&progress), [1.0, 2.0, 3.0, 4.0, 5.0]);

    // A logging notification outside any request (sent at once when logging is toggled on).
    call_text(&service, "toggle-simulated-logging", json!({})).await;
    eventually("a logging notification", || {
        logs.lock().map(|l| !l.is_empty()).unwrap_or(false)
    })
    .await;

    let _ = tokio::time::timeout(STEP, service.cancel()).await;
}
