//! The observer end to end: the real wrapper binary around real MCP servers (the rmcp
//! `payments_server` fixture and the hand-written 2026-07-28 `era2026_server`), driven over real
//! pipes by a JSON-RPC client written here (so the test controls ids, answers server→client
//! requests and measures latency itself), with events written by `--ingest file:PATH`.
//!
//! What is asserted: exactly one event per `tools/call`, with the right class, status, tool,
//! `err` and captured fields; nothing private in the file; `dur_ms` consistent with what the
//! client measured; every batch valid against `schema/batch.v2.schema.json`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Upper bound for anything a test waits on (a loaded 2-core machine is slow).
const WAIT: Duration = Duration::from_secs(60);

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .parent()
        .expect("target dir")
        .join("examples")
        .join(name)
}

/// One wrapped server and a client talking to it.
struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<(Instant, Value)>,
    stdout_thread: Option<JoinHandle<()>>,
    stderr_thread: Option<JoinHandle<Vec<u8>>>,
    events_path: PathBuf,
    _dir: tempfile::TempDir,
}

struct Ended {
    status: ExitStatus,
    /// Every event of every batch, in file order.
    events: Vec<Value>,
    /// The raw sink file.
    file: String,
    stderr: String,
}

impl Session {
    fn start(server: &str, flags: &[&str], env: &[(&str, &str)]) -> Session {
        let dir = tempfile::tempdir().expect("tempdir");
        let events_path = dir.path().join("events.jsonl");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("BOUNDED_") {
                cmd.env_remove(&k);
            }
        }
        cmd.envs(env.iter().copied());
        cmd.arg("--ingest")
            .arg(format!("file:{}", events_path.display()))
            .args(["--flush-ms", "50", "--actor", "agent-under-test"])
            .args(flags)
            .arg("--")
            .arg(example(server))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn wrapper");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        let stdout_thread = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let at = Instant::now();
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if tx.send((at, v)).is_err() {
                        break;
                    }
                }
            }
        });
        let stderr_thread = std::thread::spawn(move || {
            let mut b = Vec::new();
            let mut r = stderr;
            let _ = r.read_to_end(&mut b);
            b
        });
        Session {
            child,
            stdin,
            lines,
            stdout_thread: Some(stdout_thread),
            stderr_thread: Some(stderr_thread),
            events_path,
            _dir: dir,
        }
    }

    /// Writes one message; returns the instant just before the write.
    fn send(&mut self, v: Value) -> Instant {
        let mut line = v.to_string();
        line.push('\n');
        let at = Instant::now();
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).expect("write");
        stdin.flush().expect("flush");
        at
    }

    /// The next message from the server.
    fn recv(&mut self, what: &str) -> (Instant, Value) {
        self.lines
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("no message from the server while waiting for {what}"))
    }

    /// Waits for the response to `id`, answering nothing else (fails on anything unexpected).
    fn response(&mut self, id: &Value) -> (Instant, Value) {
        let (at, v) = self.recv(&format!("response {id}"));
        assert_eq!(&v["id"], id, "unexpected message {v}");
        assert!(v.get("method").is_none(), "expected a response, got {v}");
        (at, v)
    }

    fn request(&mut self, id: Value, method: &str, params: Value) -> (Duration, Value) {
        let sent = self.send(json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}));
        let (at, v) = self.response(&id);
        (at.duration_since(sent), v)
    }

    fn initialize(&mut self) {
        let (_, v) = self.request(
            json!(0),
            "initialize",
            json!({"protocolVersion":"2025-06-18",
                   "capabilities":{"elicitation":{},"sampling":{}},
                   "clientInfo":{"name":"observe-test-client","version":"1.0"}}),
        );
        assert_eq!(v["result"]["serverInfo"]["name"], "payments");
        self.send(json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
    }

    fn call(&mut self, id: i64, tool: &str, args: Value) -> (Duration, Value) {
        self.request(
            json!(id),
            "tools/call",
            json!({"name": tool, "arguments": args}),
        )
    }

    /// Closes the client side and waits for the wrapper to exit (killing it after [`WAIT`]).
    fn end(mut self) -> Ended {
        drop(self.stdin.take());
        self.wait_exit()
    }

    /// Waits for the wrapper to exit on its own, client side still open.
    fn wait_exit(mut self) -> Ended {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            if start.elapsed() > WAIT {
                let _ = self.child.kill();
                let s = self.child.wait().expect("wait");
                panic!("wrapper did not exit within {WAIT:?} ({s})");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(t) = self.stdout_thread.take() {
            let _ = t.join();
        }
        let stderr = self
            .stderr_thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let file = std::fs::read_to_string(&self.events_path).unwrap_or_default();
        let validator = batch_validator();
        let mut events = Vec::new();
        for line in file.lines() {
            let batch: Value = serde_json::from_str(line).expect("batch line is JSON");
            let errors: Vec<String> = validator
                .iter_errors(&batch)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "batch invalid: {errors:?}\n{batch}");
            events.extend(batch["events"].as_array().cloned().unwrap_or_default());
        }
        Ended {
            status,
            events,
            file,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn batch_validator() -> jsonschema::Validator {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema");
    let read = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(root.join(f)).expect("schema file"))
            .expect("schema JSON")
    };
    let event = read("event.v2.schema.json");
    let batch = read("batch.v2.schema.json");
    let id = event["$id"].as_str().expect("$id").to_string();
    let registry = jsonschema::Registry::new()
        .add(id, event)
        .expect("add")
        .prepare()
        .expect("registry");
    jsonschema::options()
        .with_registry(&registry)
        .build(&batch)
        .expect("batch schema compiles")
}

fn by_action(events: &[Value]) -> HashMap<String, Vec<Value>> {
    let mut m: HashMap<String, Vec<Value>> = HashMap::new();
    for e in events {
        m.entry(e["rec"]["action"].as_str().unwrap_or("").to_string())
            .or_default()
            .push(e.clone());
    }
    m
}

fn one<'a>(m: &'a HashMap<String, Vec<Value>>, tool: &str) -> &'a Value {
    let v = m.get(tool).unwrap_or_else(|| panic!("no event for {tool}"));
    assert_eq!(v.len(), 1, "exactly one event for {tool}: {v:?}");
    &v[0]
}

#[test]
fn refund_is_one_action_event_with_amount_and_without_email() {
    let mut s = Session::start("payments_server", &[], &[]);
    s.initialize();
    let (_, list) = s.request(json!("list-1"), "tools/list", json!({}));
    assert!(list["result"]["tools"].is_array());
    let (_, r) = s.call(
        1,
        "issue_refund",
        json!({"amount_cents": 4900, "currency": "EUR",
               "customer_email": "jane.doe@example.com", "reason": "duplicate_charge"}),
    );
    assert_eq!(r["result"]["isError"], false);
    let (_, r) = s.call(
        2,
        "lookup_customer",
        json!({"email": "jane.doe@example.com", "customer_id": "cus_9f8e7d"}),
    );
    assert!(r.get("result").is_some());
    let end = s.end();
    assert!(end.status.success(), "stderr: {}", end.stderr);
    assert_eq!(
        end.events.len(),
        2,
        "one event per tools/call only: {:?}",
        end.events
    );
    let m = by_action(&end.events);
    let refund = one(&m, "issue_refund");
    assert_eq!(refund["class"], "action");
    assert_eq!(refund["status"], 200);
    assert_eq!(refund["rec"]["rail"], "mcp");
    assert_eq!(refund["rec"]["fields"]["amount_cents"], 4900);
    assert_eq!(refund["rec"]["fields"]["currency"], "EUR");
    assert_eq!(refund["rec"]["fields"]["reason"], "duplicate_charge");
    assert!(refund["rec"]["fields"].get("customer_email").is_none());
    assert_eq!(
        refund["rec"]["registryVersion"].as_str().map(str::len),
        Some(16),
        "the tools/list before the call fixes the registry version"
    );
    assert_eq!(refund["dest"]["host"], "mcp://payments");
    assert_eq!(refund["dest"]["pathTemplate"], "/issue_refund");
    assert_eq!(refund["dest"]["method"], "POST");
    assert_eq!(
        refund["actor"],
        json!({"id":"agent-under-test","kind":"agent","grade":"attested"})
    );
    assert_eq!(refund["session"]["protocol"], "2025-06-18");
    assert_eq!(refund["session"]["client"], "observe-test-client");
    assert!(refund["bytes"]["req"].as_u64().unwrap_or(0) > 100);
    assert!(refund["bytes"]["resp"].as_u64().unwrap_or(0) > 20);
    assert!(refund.get("err").is_none());
    let lookup = one(&m, "lookup_customer");
    assert!(
        lookup["rec"].get("fields").is_none(),
        "PII-only arguments capture nothing: {lookup}"
    );
    assert_eq!(
        lookup["session"]["id"], refund["session"]["id"],
        "one random session id per wrapper process"
    );
    assert!(!end.file.contains("jane.doe@example.com"));
    assert!(!end.file.contains("cus_9f8e7d"));
    assert!(
        !end.file.contains("refunded"),
        "response contents never leave"
    );
}

#[test]
fn tool_errors_and_jsonrpc_errors_map_to_status_and_err() {
    let mut s = Session::start("payments_server", &[], &[]);
    s.initialize();
    let (_, r) = s.call(1, "void_charge", json!({"charge_id": "ch_1"}));
    assert_eq!(r["result"]["isError"], true);
    let (_, r) = s.call(2, "explode", json!({}));
    assert_eq!(r["error"]["code"], -32603);
    let (_, r) = s.call(3, "no_such_tool", json!({}));
    let unknown_code = r["error"]["code"]
        .as_i64()
        .expect("JSON-RPC error for an unknown tool");
    let end = s.end();
    assert_eq!(end.events.len(), 3, "{:?}", end.events);
    let m = by_action(&end.events);
    let void = one(&m, "void_charge");
    assert_eq!(void["class"], "error");
    assert_eq!(void["status"], 500);
    assert_eq!(err_kind(&void["err"]), json!({"kind": "tool"}));
    let boom = one(&m, "explode");
    assert_eq!(boom["class"], "error");
    assert_eq!(boom["status"], 500);
    assert_eq!(
        err_kind(&boom["err"]),
        json!({"kind": "jsonrpc", "code": -32603})
    );
    let unknown = one(&m, "no_such_tool");
    let want = match unknown_code {
        -32700 | -32600 | -32602 => 400,
        -32601 => 404,
        _ => 500,
    };
    assert_eq!(unknown["status"], want);
    assert_eq!(unknown["err"]["code"], unknown_code);
}

#[test]
fn cancelled_slow_call_is_one_499_event() {
    let mut s = Session::start("payments_server", &[], &[]);
    s.initialize();
    s.send(json!({"jsonrpc":"2.0","id":"slow-1","method":"tools/call",
                  "params":{"name":"slow","arguments":{"ms": 3000}}}));
    std::thread::sleep(Duration::from_millis(100));
    s.send(json!({"jsonrpc":"2.0","method":"notifications/cancelled",
                  "params":{"requestId":"slow-1","reason":"user pressed stop"}}));
    // A later call proves the session goes on.
    let (_, r) = s.call(
        2,
        "issue_refund",
        json!({"amount_cents": 1, "currency": "EUR",
        "customer_email": "a@b.example", "reason": "x"}),
    );
    assert!(r.get("result").is_some());
    let end = s.end();
    let m = by_action(&end.events);
    let slow = one(&m, "slow");
    assert_eq!(slow["status"], 499);
    assert_eq!(slow["class"], "error");
    assert_eq!(err_kind(&slow["err"]), json!({"kind": "cancelled"}));
    assert!(slow["dur_ms"].as_f64().unwrap_or(0.0) < 3000.0);
    assert_eq!(one(&m, "issue_refund")["status"], 200);
    assert_eq!(end.events.len(), 2);
}

#[test]
fn elicitation_and_sampling_mid_call_are_not_taken_for_tool_results() {
    let mut s = Session::start("payments_server", &[], &[]);
    s.initialize();
    // Elicitation: the server asks the client mid-call. rmcp numbers its own requests from 0,
    // the same id the client used for initialize: correlation must keep directions apart.
    s.send(json!({"jsonrpc":"2.0","id":10,"method":"tools/call",
                  "params":{"name":"confirm_refund","arguments":{"amount_cents": 700}}}));
    let (_, ask) = s.recv("elicitation request");
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    // The answer looks like a tool result (it even says isError), and travels client→server.
    s.send(json!({"jsonrpc":"2.0","id":ask["id"].clone(),
                  "result":{"action":"accept","content":{"confirm":true},"isError":true}}));
    let (_, done) = s.response(&json!(10));
    assert_eq!(done["result"]["content"][0]["text"], "refund confirmed");

    s.send(json!({"jsonrpc":"2.0","id":11,"method":"tools/call",
                  "params":{"name":"summarize","arguments":{"text":"long text"}}}));
    let (_, ask) = s.recv("sampling request");
    assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
    s.send(json!({"jsonrpc":"2.0","id":ask["id"].clone(),"result":{
        "role":"assistant","content":{"type":"text","text":"short"},"model":"test-model"}}));
    let (_, done) = s.response(&json!(11));
    assert_eq!(
        done["result"]["content"][0]["text"],
        "summary from test-model"
    );
    let end = s.end();
    assert_eq!(end.events.len(), 2, "{:?}", end.events);
    let m = by_action(&end.events);
    let confirm = one(&m, "confirm_refund");
    assert_eq!(confirm["status"], 200);
    assert_eq!(confirm["class"], "action");
    assert_eq!(confirm["rec"]["fields"]["amount_cents"], 700);
    assert_eq!(one(&m, "summarize")["status"], 200);
    assert!(
        !end.stderr.contains("matches no pending request"),
        "{}",
        end.stderr
    );
}

#[test]
fn era2026_input_required_rounds_are_one_event() {
    let mut s = Session::start("era2026_server", &[], &[]);
    let meta = json!({"io.modelcontextprotocol/protocolVersion":"2026-07-28",
                      "io.modelcontextprotocol/clientInfo":{"name":"modern-client","version":"2"}});
    let (_, d) = s.request(json!("d"), "server/discover", json!({"_meta": meta}));
    assert_eq!(d["result"]["serverInfo"]["name"], "era2026");
    let (_, _) = s.request(json!("l"), "tools/list", json!({"_meta": meta}));

    // Two input rounds, then the result: ids 1, 2, 3.
    let args = json!({"party_size": 4, "quantity": 4, "guest_name": "Jane Doe", "rounds": 2});
    let first = s.send(json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
        "params":{"name":"book_table","arguments":args,"_meta":meta}}));
    let (_, r1) = s.response(&json!(1));
    assert_eq!(r1["result"]["resultType"], "input_required");
    s.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
        "params":{"name":"book_table","arguments":args,"_meta":meta,
                  "inputResponses":{"confirm":{"action":"accept","content":{"ok":true}}},
                  "requestState":r1["result"]["requestState"].clone()}}));
    let (_, r2) = s.response(&json!(2));
    assert_eq!(r2["result"]["resultType"], "input_required");
    s.send(json!({"jsonrpc":"2.0","id":3,"method":"tools/call",
        "params":{"name":"book_table","arguments":args,"_meta":meta,
                  "inputResponses":{"confirm":{"action":"accept","content":{"ok":true}}},
                  "requestState":r2["result"]["requestState"].clone()}}));
    let (last, r3) = s.response(&json!(3));
    assert_eq!(r3["result"]["resultType"], "complete");
    let client_ms = last.duration_since(first).as_secs_f64() * 1000.0;

    // A call that asks for input and is abandoned: ends at session end as 504.
    s.send(json!({"jsonrpc":"2.0","id":4,"method":"tools/call",
        "params":{"name":"book_table","arguments":{"party_size":2},"_meta":meta}}));
    let (_, r4) = s.response(&json!(4));
    assert_eq!(r4["result"]["resultType"], "input_required");
    let end = s.end();
    assert!(end.status.success(), "stderr: {}", end.stderr);
    assert_eq!(end.events.len(), 2, "{:?}", end.events);
    let done = end
        .events
        .iter()
        .find(|e| e["status"] == 200)
        .expect("the completed booking");
    assert_eq!(done["rec"]["action"], "book_table");
    assert_eq!(done["dest"]["host"], "mcp://era2026");
    assert_eq!(done["session"]["protocol"], "2026-07-28");
    assert_eq!(done["session"]["client"], "modern-client");
    assert_eq!(done["rec"]["fields"]["quantity"], 4);
    assert!(done["rec"]["fields"].get("guest_name").is_none());
    let dur = done["dur_ms"].as_f64().expect("dur_ms");
    assert!(
        dur <= client_ms + 1.0 && client_ms - dur < 50.0,
        "one event spans all three rounds: dur_ms {dur} vs client {client_ms}"
    );
    let abandoned = end
        .events
        .iter()
        .find(|e| e["status"] != 200)
        .expect("abandoned");
    assert_eq!(abandoned["status"], 504);
    assert_eq!(abandoned["err"]["kind"], "timeout");
    assert!(!end.file.contains("Jane Doe"));
}

#[test]
fn dur_ms_is_close_to_what_the_client_measured() {
    let mut s = Session::start("payments_server", &[], &[]);
    s.initialize();
    let mut measured = Vec::new();
    for (i, ms) in [0u64, 20, 150].into_iter().enumerate() {
        let (took, r) = s.call(100 + i as i64, "slow", json!({"ms": ms}));
        assert!(r.get("result").is_some());
        measured.push(took.as_secs_f64() * 1000.0);
    }
    let end = s.end();
    assert_eq!(end.events.len(), 3);
    for (e, client_ms) in end.events.iter().zip(&measured) {
        let dur = e["dur_ms"].as_f64().expect("dur_ms");
        let delta = client_ms - dur;
        eprintln!("dur_ms {dur:.3} client {client_ms:.3} delta {delta:.3} ms");
        // The wrapper sees the request after the client wrote it and the response before the
        // client reads it: its span is inside the client's. Loose bound for a loaded machine.
        assert!(dur <= client_ms + 1.0, "dur_ms {dur} > client {client_ms}");
        assert!(delta < 50.0, "dur_ms {dur} far below client {client_ms}");
    }
    let slowest = end.events[2]["dur_ms"].as_f64().unwrap_or(0.0);
    assert!(slowest >= 150.0, "the 150 ms tool took {slowest} ms");
}

#[test]
fn unanswered_call_times_out_as_504_then_the_late_answer_is_ignored() {
    let mut s = Session::start(
        "payments_server",
        &[],
        &[("BOUNDED_CALL_TIMEOUT_MS", "300")],
    );
    s.initialize();
    let (_, r) = s.call(1, "slow", json!({"ms": 2500}));
    assert!(
        r.get("result").is_some(),
        "the relay is unaffected by the timeout"
    );
    let end = s.end();
    assert_eq!(end.events.len(), 1, "{:?}", end.events);
    assert_eq!(end.events[0]["status"], 504);
    assert_eq!(end.events[0]["err"]["kind"], "timeout");
    let d = end.events[0]["dur_ms"].as_f64().unwrap_or(0.0);
    assert!((300.0..2500.0).contains(&d), "timed out after {d} ms");
}

#[test]
fn server_name_flag_overrides_server_info() {
    let mut s = Session::start("payments_server", &["--name", "billing"], &[]);
    s.initialize();
    s.call(1, "void_charge", json!({"charge_id": "c"}));
    let end = s.end();
    assert_eq!(end.events.len(), 1);
    assert_eq!(end.events[0]["dest"]["host"], "mcp://billing");
}

#[test]
fn server_exiting_mid_call_is_502_and_the_exit_code_propagates() {
    let mut s = Session::start("era2026_server", &[], &[]);
    let (_, d) = s.request(json!(1), "server/discover", json!({}));
    assert_eq!(d["result"]["serverInfo"]["name"], "era2026");
    s.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
                  "params":{"name":"crash","arguments":{}}}));
    let end = s.wait_exit();
    assert_eq!(end.status.code(), Some(3), "stderr: {}", end.stderr);
    assert_eq!(end.events.len(), 1, "{:?}", end.events);
    assert_eq!(end.events[0]["rec"]["action"], "crash");
    assert_eq!(end.events[0]["status"], 502);
    assert_eq!(
        err_kind(&end.events[0]["err"]),
        json!({"kind": "transport"})
    );
}

#[test]
fn large_results_are_observed_from_their_ends() {
    // 5 MB and 3 MB results with `id` and `isError` after the text (the TypeScript SDK's
    // order): the observer reads only their first and last bytes, and still gets status and
    // size right; the client gets every byte.
    let mut s = Session::start("era2026_server", &["--debug"], &[]);
    let (_, d) = s.request(json!(1), "server/discover", json!({}));
    assert_eq!(d["result"]["serverInfo"]["name"], "era2026");
    let sizes = [(5_000_000u64, true), (3_000_000, false), (1_000, true)];
    for (i, (n, is_error)) in sizes.into_iter().enumerate() {
        let args = json!({"bytes": n, "is_error": is_error});
        let (_, r) = s.call(10 + i as i64, "export", args);
        let text = r["result"]["content"][0]["text"].as_str().unwrap_or("");
        assert_eq!(text.len() as u64, n);
        assert_eq!(r["result"]["isError"], is_error);
    }
    let end = s.end();
    assert_eq!(end.events.len(), 3, "{:?}", end.events);
    for (e, (n, is_error)) in end.events.iter().zip(sizes) {
        assert_eq!(e["rec"]["action"], "export");
        assert_eq!(e["status"], if is_error { 500 } else { 200 }, "{e}");
        let resp = e["bytes"]["resp"].as_u64().unwrap_or(0);
        assert!((n..n + 200).contains(&resp), "bytes.resp {resp} for {n}");
    }
    assert!(end.stderr.contains("summarized=2"), "{}", end.stderr);
    let skipped = end
        .stderr
        .split("tap_skipped_bytes_s2c=")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|d| d.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        skipped > 7_000_000,
        "the tap passed the middles on: {}",
        end.stderr
    );
}

mod rmcp_client {
    //! The same wrapper and server, driven by the official Rust SDK's client: its framing, id
    //! allocation and answers to sampling and elicitation are what a real agent sends.
    #![allow(deprecated)] // sampling is deprecated in the 2026-07-28 era; this is a 2025 client

    use super::*;
    use rmcp::model::{
        CallToolRequestParams, ClientCapabilities, CreateMessageRequestParams, CreateMessageResult,
        ElicitRequestParams, ElicitResult, ElicitationAction, Implementation,
        InitializeRequestParams, SamplingMessage,
    };
    use rmcp::service::RequestContext;
    use rmcp::transport::TokioChildProcess;
    use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};

    #[derive(Clone)]
    struct Agent;

    impl ClientHandler for Agent {
        fn get_info(&self) -> InitializeRequestParams {
            let caps: ClientCapabilities =
                serde_json::from_value(json!({"sampling": {}, "elicitation": {}}))
                    .expect("capabilities");
            InitializeRequestParams::new(caps, Implementation::new("rmcp-agent", "1.0"))
        }

        async fn create_message(
            &self,
            _params: CreateMessageRequestParams,
            _context: RequestContext<RoleClient>,
        ) -> Result<CreateMessageResult, ErrorData> {
            Ok(CreateMessageResult::new(
                SamplingMessage::assistant_text("short"),
                "agent-model".into(),
            ))
        }

        async fn create_elicitation(
            &self,
            _request: ElicitRequestParams,
            _context: RequestContext<RoleClient>,
        ) -> Result<ElicitResult, ErrorData> {
            Ok(ElicitResult::new(ElicitationAction::Accept).with_content(json!({"confirm": true})))
        }
    }

    fn args(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rmcp_client_session_yields_one_event_per_tools_call() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = dir.path().join("events.jsonl");
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("BOUNDED_") {
                cmd.env_remove(&k);
            }
        }
        cmd.arg("--ingest")
            .arg(format!("file:{}", sink.display()))
            .args(["--flush-ms", "50", "--"])
            .arg(example("payments_server"));
        let transport = TokioChildProcess::new(cmd).expect("spawn wrapper");
        let client = tokio::time::timeout(WAIT, Agent.serve(transport))
            .await
            .expect("initialize in time")
            .expect("initialize");
        assert_eq!(
            client
                .peer_info()
                .and_then(|i| i.server_info.as_ref().map(|s| s.name.clone())),
            Some("payments".to_string())
        );
        let tools = client.list_all_tools().await.expect("tools/list");
        assert!(tools.iter().any(|t| t.name == "issue_refund"));
        let calls = [
            (
                "issue_refund",
                json!({"amount_cents": 4900, "currency": "EUR",
                       "customer_email": "rmcp.canary@example.com", "reason": "late delivery"}),
            ),
            ("void_charge", json!({"charge_id": "ch_2"})),
            ("confirm_refund", json!({"amount_cents": 100})),
            ("summarize", json!({"text": "a long text"})),
        ];
        for (tool, a) in &calls {
            let r = tokio::time::timeout(
                WAIT,
                client.call_tool(CallToolRequestParams::new(*tool).with_arguments(args(a.clone()))),
            )
            .await
            .expect("answer in time");
            assert!(r.is_ok(), "{tool}: {r:?}");
        }
        let _ = tokio::time::timeout(WAIT, client.cancel()).await;
        // The wrapper exits after its child; wait for the sink to hold every event.
        let deadline = Instant::now() + WAIT;
        let events: Vec<Value> = loop {
            let file = std::fs::read_to_string(&sink).unwrap_or_default();
            let events: Vec<Value> = file
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .flat_map(|b| b["events"].as_array().cloned().unwrap_or_default())
                .collect();
            if events.len() >= calls.len() || Instant::now() > deadline {
                assert!(!file.contains("rmcp.canary@example.com"));
                break events;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(events.len(), calls.len(), "{events:?}");
        let m = by_action(&events);
        let refund = one(&m, "issue_refund");
        assert_eq!(refund["status"], 200);
        assert_eq!(refund["rec"]["fields"]["amount_cents"], 4900);
        assert!(refund["rec"]["fields"].get("customer_email").is_none());
        assert_eq!(refund["session"]["client"], "rmcp-agent");
        assert!(refund["rec"]["registryVersion"].is_string());
        assert_eq!(one(&m, "void_charge")["status"], 500);
        assert_eq!(one(&m, "confirm_refund")["status"], 200);
        assert_eq!(one(&m, "summarize")["status"], 200);
    }
}

#[test]
fn bad_input_is_counted_with_at_most_one_warning_each_and_relayed_unchanged() {
    // The stdio fixture's `cat` mode echoes every line, so each message is seen in both
    // directions: twice the counts, still one warning per kind.
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = dir.path().join("events.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("BOUNDED_") {
            cmd.env_remove(&k);
        }
    }
    let mut child = cmd
        .arg("--ingest")
        .arg(format!("file:{}", sink.display()))
        .arg("--debug")
        .arg("--")
        .arg(example("stdio_fixture"))
        .arg("cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut input = Vec::new();
    for i in 0..3 {
        input.extend_from_slice(format!("not json {i}\n").as_bytes());
        input.extend_from_slice(
            format!("{{\"jsonrpc\":\"2.0\",\"id\":{{\"x\":{i}}},\"method\":\"tools/call\"}}\n")
                .as_bytes(),
        );
        input.extend_from_slice(
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{}}}}\n",
                900 + i
            )
            .as_bytes(),
        );
    }
    input.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ping\"}\n");
    input.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ping\"}\n");
    input.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":6,\"result\":{}}");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stdout.read_to_end(&mut b);
        b
    });
    let err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stderr.read_to_end(&mut b);
        b
    });
    stdin.write_all(&input).expect("write");
    drop(stdin);
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if started.elapsed() > WAIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("wrapper did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    assert_eq!(out.join().unwrap_or_default(), input, "relay unchanged");
    let stderr = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
    for (needle, n) in [
        ("A frame is not JSON", 1),
        ("fields of unexpected types", 1),
        ("matches no pending request", 1),
        ("reuses the id of a request still pending", 1),
    ] {
        assert_eq!(
            stderr.matches(needle).count(),
            n,
            "{needle:?} in stderr:\n{stderr}"
        );
    }
    // Per direction: 3 non-JSON lines, 3 wrong-typed ids; 3 + 1 unknown-id responses seen as
    // answers to nothing in each direction (the echo of a response is a response too).
    for want in [
        "non_json=6",
        "malformed=6",
        "orphan_responses=8",
        "duplicate_ids=2",
    ] {
        assert!(stderr.contains(want), "{want} in stderr:\n{stderr}");
    }
    // No event; the sink holds only what went wrong, as counts (`sensor.health`): the server's
    // three non-JSON lines and the eight orphan responses.
    let sink = std::fs::read_to_string(&sink).unwrap_or_default();
    let batches: Vec<Value> = sink
        .lines()
        .map(|l| serde_json::from_str(l).expect("a batch"))
        .collect();
    assert!(batches.iter().all(|b| b["events"] == json!([])), "{sink}");
    let sum = |k: &str| -> u64 {
        batches
            .iter()
            .map(|b| b["sensor"]["health"][k].as_u64().unwrap_or(0))
            .sum()
    };
    assert_eq!(
        (sum("stdoutNonJson"), sum("orphanResponses")),
        (3, 8),
        "{sink}"
    );
}

/// Correctness under load: a burst far larger than any queue's slot count (the tap once held 64
/// chunks and lost ~600 requests per dropped chunk) must still yield one 200 event per call. The
/// server reads the whole burst before it answers, so every call is open at once: the burst
/// stays under the observer's cap on open requests (`observe::MAX_OPEN_PER_SCOPE`), past which
/// the oldest go unobserved by design.
#[test]
fn burst_of_4000_pipelined_calls_yields_4000_ok_events() {
    const CALLS: i64 = 4_000;
    let mut s = Session::start("payments_server", &[], &[]);
    s.initialize();
    // Every request in one write stream, before reading any answer: the client pipelines.
    let mut burst = String::new();
    for id in 1..=CALLS {
        let req = json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
                         "params":{"name":"issue_refund",
                                   "arguments":{"amount_cents": id, "currency": "EUR",
                                                "customer_email": "burst@example.com",
                                                "reason": "burst"}}});
        burst.push_str(&req.to_string());
        burst.push('\n');
    }
    let mut stdin = s.stdin.take().expect("stdin open");
    let writer = std::thread::spawn(move || {
        stdin.write_all(burst.as_bytes()).expect("write burst");
        stdin.flush().expect("flush");
        stdin
    });
    let mut answered = std::collections::HashSet::new();
    while answered.len() < CALLS as usize {
        let (_, v) = s.recv("a burst response");
        assert_eq!(v["result"]["isError"], false, "every refund succeeds: {v}");
        answered.insert(v["id"].as_i64().expect("numeric id"));
    }
    s.stdin = Some(writer.join().expect("writer thread"));
    let end = s.end();
    assert!(end.status.success(), "stderr: {}", end.stderr);
    assert_eq!(end.events.len(), CALLS as usize, "stderr: {}", end.stderr);
    let not_ok: Vec<&Value> = end.events.iter().filter(|e| e["status"] != 200).collect();
    assert!(
        not_ok.is_empty(),
        "all answered: {:?}",
        &not_ok[..not_ok.len().min(3)]
    );
    let mut amounts: Vec<i64> = end
        .events
        .iter()
        .filter_map(|e| e["rec"]["fields"]["amount_cents"].as_i64())
        .collect();
    amounts.sort_unstable();
    assert_eq!(
        amounts,
        (1..=CALLS).collect::<Vec<_>>(),
        "each call exactly once"
    );
}

/// `err` without its fingerprint, which is checked to be one (16 hex digits): the tests name the
/// kind and code; `tests/evidence.rs` checks what the fingerprints group.
fn err_kind(err: &Value) -> Value {
    let mut e = err.clone();
    let fp = e.as_object_mut().and_then(|m| m.remove("fp"));
    assert!(
        fp.as_ref()
            .and_then(Value::as_str)
            .is_some_and(|f| f.len() == 16 && f.bytes().all(|b| b.is_ascii_hexdigit())),
        "every error carries err.fp: {err}"
    );
    e
}
