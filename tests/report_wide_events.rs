//! Batches stay under the byte cap through the real binary: an MCP client (this test) makes
//! calls whose arguments carry as much as `--capture-text` can let through (32 allow-listed keys,
//! 128-byte values that pass every privacy layer), and a real loopback ingest checks the size
//! of every body and that no event was lost.

mod report_support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bounded_observe_mcp::report::MAX_BATCH_BYTES;
use report_support::*;
use serde_json::{json, Map, Value};

const TOKEN: &str = "obs1.k1.c2lnbmF0dXJl";
/// Bound for the wrapper's exit (loaded 2-core machine).
const WAIT: Duration = Duration::from_secs(60);
/// More calls than one batch holds, so the byte cap (not the count) must cut them.
const CALLS: usize = 600;
/// The most fields an event keeps, each at the longest value kept.
const FIELDS: usize = 32;
const VALUE_LEN: usize = 128;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .parent()
        .expect("target dir")
        .join("examples/report_fixture")
}

fn key(i: usize) -> String {
    format!("note_{i:02}")
}

/// Runs `CALLS` sequential `tools/call`s with maximal captured arguments through the wrapper,
/// then closes its stdin and waits for it to exit.
fn run_wide_session(ingest_base: &str) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("BOUNDED_") {
            cmd.env_remove(&k);
        }
    }
    cmd.args([
        "--token",
        TOKEN,
        "--ingest",
        ingest_base,
        "--flush-ms",
        "600000",
    ]);
    // `--capture-text`: a 128-byte value is longer than a code may be, so only a key opted
    // into prose lets it through.
    for i in 0..FIELDS {
        cmd.args(["--capture-text", &key(i)]);
    }
    cmd.arg("--")
        .arg(fixture())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn wrapper");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut roundtrip = |msg: Value, expect_answer: bool| {
        writeln!(stdin, "{msg}").expect("write request");
        stdin.flush().expect("flush");
        if expect_answer {
            let mut l = String::new();
            stdout.read_line(&mut l).expect("read response");
            let v: Value = serde_json::from_str(&l).expect("response is JSON");
            assert_eq!(v["id"], msg["id"], "responses in order");
        }
    };
    roundtrip(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "wide-events-test", "version": "1"}}}),
        true,
    );
    roundtrip(
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        false,
    );
    let value: String = ('a'..='z').cycle().take(VALUE_LEN).collect();
    let arguments: Map<String, Value> = (0..FIELDS)
        .map(|i| (key(i), Value::String(value.clone())))
        .collect();
    for i in 0..CALLS {
        roundtrip(
            json!({"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call",
                   "params": {"name": "issue_refund", "arguments": arguments}}),
            true,
        );
    }
    drop(stdin);
    let eof = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return;
        }
        if eof.elapsed() > WAIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("wrapper did not exit within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_with_maximal_captured_fields_are_batched_under_one_mib() {
    let ingest = TestIngest::start().await;
    let base = ingest.base();
    tokio::task::spawn_blocking(move || run_wide_session(&base))
        .await
        .expect("session");

    let reqs = ingest.requests();
    let sizes: Vec<usize> = reqs.iter().map(|r| r.body.len()).collect();
    assert!(
        sizes.iter().all(|&b| b <= MAX_BATCH_BYTES),
        "every body within 1 MiB: {sizes:?}"
    );
    assert!(reqs.iter().all(|r| r.status == 200), "none refused");
    let mut ids = std::collections::HashSet::new();
    for r in &reqs {
        let batch = r.json();
        assert_eq!(batch["dropped"], 0, "nothing lost on the way");
        for e in batch["events"].as_array().expect("events") {
            let fields = e["rec"]["fields"].as_object().expect("captured fields");
            assert_eq!(fields.len(), FIELDS, "every allowed field captured: {e}");
            ids.insert(e["id"].as_str().expect("id").to_string());
        }
    }
    assert_eq!(ids.len(), CALLS, "one event per call, none lost: {sizes:?}");
}
