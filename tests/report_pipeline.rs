//! The whole sensor pipeline through the real binary: an MCP client (this test) talks over real
//! pipes to `bounded-observe-mcp -- report_fixture`, and the events land in a real loopback
//! ingest or a `file:` sink. Also: a black-holed ingest leaves tool calls untouched and delays
//! exit by at most the shutdown deadline, and failures reach stderr once per kind.

mod report_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use report_support::*;
use serde_json::{json, Value};

const TOKEN: &str = "obs1.k1.c2lnbmF0dXJl";
const CANARY_EMAIL: &str = "pipeline.canary@example.com";
/// Bound for anything the test waits on (loaded 2-core machine).
const WAIT: Duration = Duration::from_secs(60);

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .parent()
        .expect("target dir")
        .join("examples/report_fixture")
}

/// What one session through the wrapper produced.
struct Session {
    /// Every stdout line, in order.
    responses: Vec<Value>,
    stdout_raw: Vec<u8>,
    stderr: String,
    status: ExitStatus,
    /// From closing the wrapper's stdin to its exit.
    exit_after_eof: Duration,
}

/// Runs `wrapper FLAGS -- report_fixture`, performs initialize + tools/list + `calls`
/// sequential `tools/call`s (each answered before the next is sent, `pace` apart), then closes
/// stdin.
fn run_session(flags: &[&str], calls: usize, pace: Duration) -> Session {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("BOUNDED_") {
            cmd.env_remove(&k);
        }
    }
    cmd.args(flags)
        .arg("--")
        .arg(fixture())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn wrapper");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut stderr = child.stderr.take().expect("stderr");
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    let mut raw = Vec::new();
    let mut responses = Vec::new();
    let mut roundtrip = |msg: Value, expect_answer: bool| {
        let line = format!("{msg}\n");
        stdin.write_all(line.as_bytes()).expect("write request");
        stdin.flush().expect("flush");
        if expect_answer {
            let mut l = String::new();
            stdout.read_line(&mut l).expect("read response");
            raw.extend_from_slice(l.as_bytes());
            let v: Value = serde_json::from_str(&l).expect("response is JSON");
            assert_eq!(v["id"], msg["id"], "responses in order");
            responses.push(v);
        }
    };
    roundtrip(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "pipeline-test", "version": "1"}}}),
        true,
    );
    roundtrip(
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        false,
    );
    roundtrip(
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        true,
    );
    for i in 0..calls {
        std::thread::sleep(pace);
        roundtrip(
            json!({"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call", "params": {
                "name": "issue_refund",
                "arguments": {"amount_cents": 4900, "currency": "EUR",
                              "customer_email": CANARY_EMAIL,
                              "reason": format!("refund for {CANARY_EMAIL}")}}}),
            true,
        );
    }
    drop(stdin);
    let eof = Instant::now();
    let mut rest = Vec::new();
    let _ = stdout.read_to_end(&mut rest);
    raw.extend_from_slice(&rest);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if eof.elapsed() > WAIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("wrapper did not exit within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let exit_after_eof = eof.elapsed();
    Session {
        responses,
        stdout_raw: raw,
        stderr: err_thread.join().unwrap_or_default(),
        status,
        exit_after_eof,
    }
}

/// Every call answered 200 must arrive as one successful event. `stderr` is the wrapper's, to
/// tell an observer-side mismatch (a response seen before its request) from a reporter fault.
fn check_events(events: &[Value], calls: usize, stderr: &str) {
    assert_eq!(events.len(), calls, "one event per tools/call: {events:?}");
    for e in events {
        assert_eq!(e["rec"]["action"], "issue_refund");
        assert_eq!(e["dest"]["pathTemplate"], "/issue_refund");
        assert_eq!(e["actor"]["id"], "mcp:k1");
        assert_eq!(e["rec"]["fields"]["amount_cents"], 4900);
        assert_eq!(e["rec"]["fields"]["currency"], "EUR");
        assert!(e["rec"]["fields"].get("customer_email").is_none());
        assert!(
            e["rec"]["fields"].get("reason").is_none(),
            "the e-mail in reason is scrubbed"
        );
    }
    for e in events {
        assert!(
            e["class"] == "action" && e["status"] == 200 && e["dest"]["host"] == "mcp://payments",
            "every call was answered with success, yet: {e}\nwrapper stderr: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_through_the_real_binary_land_in_a_loopback_ingest() {
    let ingest = TestIngest::start().await;
    let base = ingest.base();
    let calls = 5;
    let s = tokio::task::spawn_blocking(move || {
        run_session(
            &["--token", TOKEN, "--ingest", &base],
            calls,
            Duration::ZERO,
        )
    })
    .await
    .expect("session");
    assert_eq!(s.status.code(), Some(0), "stderr: {}", s.stderr);
    assert_eq!(s.responses.len(), calls + 2);

    let reqs = ingest.accepted();
    assert!(
        !reqs.is_empty(),
        "nothing reached the ingest; stderr: {}",
        s.stderr
    );
    let validator = batch_validator();
    let mut events = Vec::new();
    for r in &reqs {
        assert_eq!(
            r.authorization.as_deref(),
            Some(format!("Bearer {TOKEN}").as_str())
        );
        let body = r.json();
        assert!(validator.is_valid(&body), "schema: {body}");
        assert!(!has_key(&body, "org"));
        events.extend(body["events"].as_array().expect("events").iter().cloned());
    }
    check_events(&events, calls, &s.stderr);
    let bytes = String::from_utf8_lossy(&ingest.all_body_bytes()).to_string();
    assert!(
        !bytes.contains(CANARY_EMAIL),
        "canary left the process: {bytes}"
    );
    assert!(
        !bytes.contains("pipeline.canary"),
        "canary left the process"
    );
}

#[test]
fn tool_calls_through_the_real_binary_land_in_a_file_sink() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("events.jsonl");
    let target = format!("file:{}", path.display());
    let calls = 4;
    // No token: a file sink needs none, and the actor is then given explicitly.
    let s = run_session(
        &["--ingest", &target, "--actor", "mcp:k1"],
        calls,
        Duration::ZERO,
    );
    assert_eq!(s.status.code(), Some(0), "stderr: {}", s.stderr);
    let text = std::fs::read_to_string(&path).expect("file sink written");
    assert!(!text.contains("pipeline.canary"), "canary left the process");
    let validator = batch_validator();
    let mut events = Vec::new();
    for line in text.lines() {
        let batch: Value = serde_json::from_str(line).expect("one JSON batch per line");
        assert!(validator.is_valid(&batch), "schema: {batch}");
        events.extend(batch["events"].as_array().expect("events").iter().cloned());
    }
    check_events(&events, calls, &s.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_hole_ingest_leaves_tool_calls_untouched_and_exit_bounded() {
    let ingest = TestIngest::start().await;
    ingest.always(Reply::BlackHole);
    let base = ingest.base();
    let calls = 40;
    // A 50 ms flush makes batches go out (into the black hole) while calls are still running.
    let s = tokio::task::spawn_blocking(move || {
        run_session(
            &[
                "--token",
                TOKEN,
                "--ingest",
                &base,
                "--flush-ms",
                "50",
                "--shutdown-flush-ms",
                "1000",
            ],
            calls,
            Duration::ZERO,
        )
    })
    .await
    .expect("session");
    assert_eq!(s.status.code(), Some(0), "stderr: {}", s.stderr);
    assert_eq!(s.responses.len(), calls + 2, "every response arrived");
    for (i, r) in s.responses[2..].iter().enumerate() {
        assert_eq!(r["id"], json!(100 + i));
        assert_eq!(r["result"]["content"][0]["text"], "done: issue_refund");
    }
    // stdout carried the server's bytes only.
    let lines = s
        .stdout_raw
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    assert_eq!(lines, calls + 2);
    // One request attempt takes 10 s against a black hole; only the 1 s deadline explains a
    // quick exit. The bound is loose on purpose (loaded machine).
    assert!(
        s.exit_after_eof < Duration::from_secs(8),
        "exit took {:?}; stderr: {}",
        s.exit_after_eof,
        s.stderr
    );
    assert!(ingest.connections() >= 1, "the ingest was tried");
    assert_eq!(ingest.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_of_delivery_failure_reaches_stderr_once_then_a_summary() {
    let ingest = TestIngest::start().await;
    ingest.always(Reply::Status(503));
    let base = ingest.base();
    let calls = 30;
    // Calls 100 ms apart with a 1 ms flush: several batches go out and fail while the session runs.
    let s = tokio::task::spawn_blocking(move || {
        run_session(
            &["--token", TOKEN, "--ingest", &base, "--flush-ms", "1"],
            calls,
            Duration::from_millis(100),
        )
    })
    .await
    .expect("session");
    assert_eq!(s.status.code(), Some(0), "stderr: {}", s.stderr);
    assert!(
        ingest.request_count() >= 4,
        "several batches failed ({} requests)",
        ingest.request_count()
    );
    let failures = s
        .stderr
        .lines()
        .filter(|l| l.contains("Event delivery failed"))
        .count();
    assert_eq!(failures, 1, "stderr: {}", s.stderr);
    assert!(s.stderr.contains("503"), "the cause is named: {}", s.stderr);
    let summaries = s
        .stderr
        .lines()
        .filter(|l| l.contains("Reporter summary"))
        .count();
    assert_eq!(summaries, 1, "stderr: {}", s.stderr);
    assert!(
        s.stderr.lines().all(|l| l.starts_with("[observe-mcp]")),
        "{}",
        s.stderr
    );
    assert!(
        !s.stderr.contains("c2lnbmF0dXJl"),
        "the token is never logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_shows_per_batch_detail_and_a_quiet_run_prints_nothing_without_it() {
    let ingest = TestIngest::start().await;
    let base = ingest.base();
    let quiet = tokio::task::spawn_blocking(move || {
        run_session(&["--token", TOKEN, "--ingest", &base], 3, Duration::ZERO)
    })
    .await
    .expect("session");
    assert_eq!(quiet.status.code(), Some(0));
    assert!(
        !quiet.stderr.contains("Batch") && !quiet.stderr.contains("Reporter summary"),
        "a healthy run is quiet: {}",
        quiet.stderr
    );

    let base = ingest.base();
    let loud = tokio::task::spawn_blocking(move || {
        run_session(
            &["--token", TOKEN, "--ingest", &base, "--debug"],
            3,
            Duration::ZERO,
        )
    })
    .await
    .expect("session");
    assert_eq!(loud.status.code(), Some(0));
    let batch_lines: Vec<&str> = loud
        .stderr
        .lines()
        .filter(|l| l.contains("Batch") && l.contains("events="))
        .collect();
    assert!(!batch_lines.is_empty(), "stderr: {}", loud.stderr);
    assert!(
        batch_lines.iter().all(|l| l.contains("Delivered")),
        "{batch_lines:?}"
    );
    assert!(
        !loud.stderr.contains("c2lnbmF0dXJl"),
        "the token is never logged"
    );
    assert!(
        !loud.stderr.contains("pipeline.canary"),
        "no argument value is logged"
    );
    assert_eq!(ingest.accepted().len(), 2, "one batch per session");
}
