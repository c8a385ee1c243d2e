//! The official Python and TypeScript SDK clients over stdio, each with its own stdio transport
//! (tests/python/mcp_client.py `stdio-transcript`, tests/node/stdio_client.mjs), run one scripted
//! session against examples/rmcp_echo_server.rs directly and through the observed wrapper
//! (`file:` ingest). The client must see the same thing both ways, every `tools/call` must become
//! one event with the status it earned, and the canaries in the arguments must stay out of the
//! events.
//!
//! The session holds a 5,000,000-byte answer whose every 10 bytes carry their offset, so a chunk
//! lost, repeated or moved on the way changes its SHA-256. The two clients reach the relay's two
//! ways of passing a large answer on: the Python SDK gives the server pipes, so the answer goes
//! by `tee(2)`; Node gives a child socket pairs, where `tee` is refused and the relay writes.

mod interop_support;

use std::path::Path;
use std::time::{Duration, Instant};

use interop_support::{
    file_sink_events, require_node_packages, require_python_sdk, rmcp_echo_server,
    run_python_client, run_typescript_stdio_client, stamped_text,
};
use serde_json::{json, Value};

/// A session takes about a second; generous for a loaded machine.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the events may take to reach the file after the client is done.
const EVENTS_TIMEOUT: Duration = Duration::from_secs(30);
const BIG_BYTES: usize = 5_000_000;
const IN_FLIGHT: usize = 20;
/// Canaries for the echoed text, each of a kind the sensor recognises in any value.
const CANARIES: [&str; 3] = [
    "jane.canary@example.com",
    "4111 1111 1111 1111",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnkifQ.c2lnbmF0dXJlLWNhbmFyeQ",
];

fn echo_text() -> String {
    format!(
        "héllo \"quoted\" {} {} {}",
        CANARIES[0], CANARIES[1], CANARIES[2]
    )
}

/// What the scripted session must show the client, whichever way it went.
fn expected() -> Value {
    let big = stamped_text(BIG_BYTES);
    let digest = ring::digest::digest(&ring::digest::SHA256, big.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    json!({
        "tools": ["big", "echo", "notify", "sum"],
        "echo": [echo_text()],
        "sum": ["42"],
        "notify": ["sent 3"],
        "big": { "bytes": BIG_BYTES, "sha256": hex },
        // rmcp answers a tool it does not have with a JSON-RPC error: invalid params.
        "missing": { "code": -32602 },
        "inFlight": (0..IN_FLIGHT).map(|i| json!([format!("msg-{i}")])).collect::<Vec<_>>(),
        "logSteps": [0, 1, 2],
        "progress": [1.0, 2.0, 3.0],
    })
}

/// Progress values as floats: Python prints `1.0` where JavaScript prints `1`.
fn normalized(mut transcript: Value) -> Value {
    if let Some(p) = transcript["progress"].as_array_mut() {
        for v in p {
            *v = json!(v.as_f64().unwrap_or(f64::NAN));
        }
    }
    transcript
}

/// The events in the sink, once at least `want` are there (or the wait is over).
fn events(path: &Path, want: usize) -> Vec<Value> {
    let deadline = Instant::now() + EVENTS_TIMEOUT;
    loop {
        let events = file_sink_events(path);
        if events.len() >= want || Instant::now() > deadline {
            return events;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs the session direct and wrapped with `run`, and checks both and the events.
fn check(client: &str, run: impl Fn(&[&str]) -> Result<Value, String>) {
    let server = rmcp_echo_server().display().to_string();
    let text = echo_text();
    let want = expected();

    let direct = normalized(run(&[&text, &server]).expect("direct session"));
    assert_eq!(
        direct, want,
        "{client}, direct: the session went differently"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let sink = dir.path().join("events.jsonl");
    let ingest = format!("file:{}", sink.display());
    let wrapper = env!("CARGO_BIN_EXE_bounded-observe-mcp");
    let wrapped = normalized(
        run(&[&text, wrapper, "--ingest", &ingest, "--", &server]).expect("wrapped session"),
    );
    assert_eq!(
        wrapped, direct,
        "{client}: through the wrapper the client saw something else"
    );

    // echo, sum, notify, big, the unknown tool, the echoes in flight, the closing sum.
    let calls = 6 + IN_FLIGHT;
    let events = events(&sink, calls);
    let got: Vec<(&str, u64)> = events
        .iter()
        .map(|e| {
            (
                e["rec"]["action"].as_str().unwrap_or(""),
                e["status"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let mut head = vec![
        ("echo", 200),
        ("sum", 200),
        ("notify", 200),
        ("big", 200),
        ("no-such-tool", 400),
    ];
    head.extend(std::iter::repeat_n(("echo", 200), IN_FLIGHT));
    head.push(("sum", 200));
    assert_eq!(got, head, "{client}: the events: {events:?}");
    for e in &events {
        assert_eq!(e["session"]["id"], events[0]["session"]["id"], "{e}");
        assert_eq!(e["session"]["client"], client, "{e}");
    }

    let raw = std::fs::read_to_string(&sink).expect("sink");
    for canary in CANARIES {
        assert!(
            !raw.contains(canary),
            "{client}: canary {canary:?} reached the sink: {raw}"
        );
    }
    assert!(
        !raw.contains("000001230|"),
        "{client}: the large answer's text reached the sink"
    );
}

#[test]
fn python_sdk_stdio_client_sees_the_same_session_through_the_wrapper() {
    require_python_sdk();
    check("python-interop-client", |args| {
        let (text, command) = args.split_first().expect("echo text");
        let mut argv = vec!["stdio-transcript", text, "--"];
        argv.extend_from_slice(command);
        run_python_client(&argv, CLIENT_TIMEOUT)
    });
}

#[test]
fn typescript_sdk_stdio_client_sees_the_same_session_through_the_wrapper() {
    require_node_packages();
    check("typescript-interop-client", |args| {
        let (text, command) = args.split_first().expect("echo text");
        let mut argv = vec![*text, "--"];
        argv.extend_from_slice(command);
        run_typescript_stdio_client(&argv, CLIENT_TIMEOUT)
    });
}
