//! Interoperability with the official MCP Python SDK client (PyPI `mcp`, pinned in
//! tests/python/requirements.txt) against `@modelcontextprotocol/server-everything` over
//! Streamable HTTP: the same scripted session (connect, list tools, call echo, get-sum, a tool
//! that streams progress notifications, an unknown tool, close) run directly and through the
//! observed proxy must give the client the same messages, in the same order, and every
//! `tools/call` must become an event in the proxy's `file:` sink.
//!
//! The messages hold no session id and no timestamp, and server-everything answers this script
//! the same way every time, with one exception. Session ids, which do differ, travel in headers;
//! the transcript keeps only whether one came back. The client's timing is the SDK's own: it
//! opens its GET stream concurrently with the POST of `notifications/initialized`, each on a new
//! connection, as it does against any server. server-everything registers more tools when that
//! POST arrives and announces them with `notifications/tools/list_changed` on the GET stream if
//! the stream is already open, so whether a session receives that one notification is a race
//! inside the SDK and the server, direct as well as proxied (on a loaded machine about one
//! session in 30 received it; a run compares six sessions). The transcripts are therefore
//! compared without it, and how often each side received it is checked on its own, below.
//!
//! A regression test for the proxy's upstream connections running with Nagle's algorithm: the
//! proxy forwards a request's head and body as separate writes, so each body waited for the
//! upstream's delayed ACK (~40 ms), and the POST of `notifications/initialized` reached the
//! upstream after the client's GET stream. server-everything then sent the
//! `notifications/tools/list_changed` of its post-initialisation tool registrations on that
//! stream, which a direct client never receives. Before the fix, 10 of 10 runs of this test
//! failed (10 of the 13 proxied sessions they ran had the extra notification); after it, 10 of
//! 10 passed (50 sessions) only while the script held its GET back by 20 ms.
//!
//! And for the proxy's one upstream connection pool shared by all client connections: without
//! that hold-back the GET, read first, took the idle pooled upstream connection while the POST
//! sent before it waited for a new one, and reached the upstream second (2 of 3 runs failed).
//! With a pool per client connection, the proxy connects upstream as the client connects to it,
//! and 6 of 6 runs (30 proxied sessions) passed.
//!
//! Those regressions showed as the extra `list_changed` in most proxied sessions (10 of 13). The
//! test fails when at least four of its five proxied sessions receive it and the direct session
//! did not: a proxy that reorders like that is caught in about two runs of three, while the race
//! alone (a few per cent a session) trips it about once in a hundred thousand runs.
//!
//! The venv is built by scripts/test-deps.sh; when it is missing this test fails and says so.

mod interop_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use interop_support::{
    file_sink_events, require_node_packages, require_python_sdk, run_python_client,
    start_everything, start_proxy,
};
use serde_json::Value;

/// One scripted session takes ~2 s (one tool runs for 1 s); generous for a loaded machine.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// Proxied sessions per run. The reordering this test guards against depends on timing (before
/// the fix it showed in 10 of 13 single sessions); with five, a proxy that reorders is all but
/// certain to be caught.
const PROXIED_SESSIONS: usize = 5;
/// The proxy's flush interval: short, so the events are in the file soon after the calls.
const FLUSH_MS: &str = "50";
/// How long the events may take to reach the file sink after the last session.
const EVENTS_TIMEOUT: Duration = Duration::from_secs(30);
/// The `tools/call`s the script makes, with the status each event must carry (the unknown
/// tool is answered with `isError: true`, a 500).
const SCRIPTED_CALLS: [(&str, u64); 4] = [
    ("echo", 200),
    ("get-sum", 200),
    ("trigger-long-running-operation", 200),
    ("no-such-tool", 500),
];

fn transcript(url: &str) -> Value {
    run_python_client(&["transcript", url], CLIENT_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
}

/// The one message whose presence is a race in the SDK and the server (see the module docs).
const RACY_NOTIFICATION: &str = "notifications/tools/list_changed";
/// Proxied sessions out of [`PROXIED_SESSIONS`] that may receive [`RACY_NOTIFICATION`] when the
/// direct session did not, before the proxy is taken to be reordering the client's requests.
const MAX_PROXIED_WITH_RACY: usize = 3;

/// The transcript without [`RACY_NOTIFICATION`], and whether it had one.
fn without_racy(t: &Value) -> (Value, bool) {
    let mut t = t.clone();
    let mut had = false;
    if let Some(messages) = t["messages"].as_array_mut() {
        messages.retain(|m| {
            let racy = m["received"]["method"] == RACY_NOTIFICATION;
            had |= racy;
            !racy
        });
    }
    (t, had)
}

/// One line per message, `sent`/`received` and the method or id: what a failure prints first.
fn outline(t: &Value) -> Vec<String> {
    t["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            let (dir, msg) = m
                .as_object()
                .and_then(|o| o.iter().next())
                .expect("one direction");
            match msg.get("method") {
                Some(method) => format!("{dir} {}", method.as_str().unwrap_or("?")),
                None => format!("{dir} response id={}", msg["id"]),
            }
        })
        .collect()
}

/// The events in the file sink (one batch per line), grouped by session.
fn events_by_session(path: &Path) -> BTreeMap<String, Vec<Value>> {
    let mut sessions: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for e in file_sink_events(path) {
        let sid = e["session"]["id"].as_str().unwrap_or("").to_string();
        sessions.entry(sid).or_default().push(e);
    }
    sessions
}

#[test]
fn python_sdk_transcript_is_identical_through_the_proxy() {
    require_node_packages();
    require_python_sdk();
    let server = start_everything();
    let dir = tempfile::tempdir().expect("tempdir");
    let events = dir.path().join("events.jsonl");
    let sink = format!("file:{}", events.display());
    let (_proxy, port) = start_proxy(&server.url(), &["--ingest", &sink, "--flush-ms", FLUSH_MS]);

    let (direct, direct_racy) = without_racy(&transcript(&server.url()));
    // The script ran as written: the sum, three progress notifications before the result.
    let text = direct.to_string();
    assert!(text.contains("The sum of 40 and 2 is 42."), "{direct}");
    assert_eq!(direct["progress"], serde_json::json!([1.0, 2.0, 3.0]));

    let mut proxied_racy = 0;
    for session in 0..PROXIED_SESSIONS {
        let (proxied, racy) = without_racy(&transcript(&format!("http://127.0.0.1:{port}/mcp")));
        proxied_racy += usize::from(racy);
        // The outline first: a reordered or extra message is readable there.
        assert_eq!(
            outline(&direct),
            outline(&proxied),
            "proxied session {session}: the messages differ from the direct session's"
        );
        assert_eq!(
            direct, proxied,
            "proxied session {session}: the transcript differs from the direct one"
        );
    }
    assert!(
        direct_racy || proxied_racy <= MAX_PROXIED_WITH_RACY,
        "{proxied_racy} of {PROXIED_SESSIONS} proxied sessions received {RACY_NOTIFICATION} and \
         the direct one did not: the proxy let the client's GET stream reach the server before \
         its POST of notifications/initialized"
    );

    // Every tools/call of every proxied session is one event, with the status it earned, in
    // the order the client made them.
    let deadline = Instant::now() + EVENTS_TIMEOUT;
    let sessions = loop {
        let sessions = events_by_session(&events);
        let total: usize = sessions.values().map(Vec::len).sum();
        if total >= PROXIED_SESSIONS * SCRIPTED_CALLS.len() || Instant::now() > deadline {
            break sessions;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        sessions.len(),
        PROXIED_SESSIONS,
        "one session per proxied run: {sessions:?}"
    );
    for (sid, evs) in &sessions {
        let got: Vec<(&str, u64)> = evs
            .iter()
            .map(|e| {
                (
                    e["rec"]["action"].as_str().unwrap_or(""),
                    e["status"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        assert_eq!(got, SCRIPTED_CALLS, "session {sid}: {evs:?}");
        for e in evs {
            assert_eq!(e["session"]["client"], "python-interop-client", "{e}");
            assert_eq!(e["dest"]["host"], format!("127.0.0.1:{}", server.port));
        }
    }
}
