//! The content-free evidence of issue 17, end to end: tool definition hashes (`rec.toolDef`),
//! `rec.listed: false`, `rec.hints`, `drift` events, error fingerprints (`err.fp`), the catalog's
//! size (`session.catalog`) and `sensor.health`, through the real wrapper around a real fixture
//! server whose catalog changes mid-session (`examples/drift_server.rs`), over stdio (file
//! sink) and HTTP (a real ingest); the ingest's `GET /v1/tools` flags with two sensors; and the
//! canaries planted in descriptions, error messages and `isError` texts, which must appear in
//! no byte sent, stored, or answered by the ingest's API.

mod ingest_support;
mod interop_support;
mod pg_support;
mod store_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bounded_observe_mcp::ingest::{self, AdminClient, RunningIngest};
use serde_json::{json, Value};
use store_support::{StoreKind, TestDb};

/// Generous: the machine is shared and loaded.
const STEP: Duration = Duration::from_secs(60);

/// Planted by the fixture in descriptions and error texts (see `examples/drift_server.rs`).
const CANARIES: [&str; 10] = [
    "jane.canary",
    "victim.example",
    "4111 1111 1111 1111",
    "4111111111111111",
    "eyJhbGciOiJIUzI1NiJ9",
    "sk_live_CANARY",
    "exfil.canary",
    "Refunds a charge",
    "Inventory service",
    "declined",
];

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .parent()
        .expect("target dir")
        .join("examples")
        .join(name)
}

fn wrapper() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("BOUNDED_") {
            cmd.env_remove(&k);
        }
    }
    cmd
}

fn assert_no_canary(what: &str, text: &str) {
    for c in CANARIES {
        assert!(!text.contains(c), "canary {c:?} in {what}: {text}");
    }
}

fn call(id: u64, tool: &str, args: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":args}})
}

/// One session: the catalog, calls to listed and unlisted tools, errors that differ only in
/// ids and one that differs, a non-JSON line on the server's stdout (stdio), then the catalog
/// changes (`mutate` sends `list_changed`), the client lists again and calls again.
fn script() -> Vec<Value> {
    vec![
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18",
            "capabilities":{},"clientInfo":{"name":"evidence-client","version":"1"}}}),
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}),
        call(2, "refund", json!({"amount_cents": 4900})),
        call(3, "lookup", json!({})),
        call(4, "fail", json!({"n": 1001})),
        call(5, "fail", json!({"n": 2002})),
        call(6, "other_fail", json!({})),
        call(7, "boom", json!({"n": 7})),
        call(8, "boom", json!({"n": 88})),
        call(9, "ghost", json!({})),
        call(10, "noise", json!({})),
        call(11, "mutate", json!({})),
        json!({"jsonrpc":"2.0","id":12,"method":"tools/list"}),
        call(13, "refund", json!({"amount_cents": 100})),
        call(14, "lookup", json!({})),
        call(15, "void", json!({})),
    ]
}

/// The calls (`tools/call` events) and drift events of one session.
fn check_session(events: &[Value]) {
    let of = |tool: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["rec"]["action"] == tool && e["class"] != "drift")
            .collect()
    };
    let drift: Vec<&Value> = events.iter().filter(|e| e["class"] == "drift").collect();
    let changes: Vec<(String, String)> = drift
        .iter()
        .map(|e| {
            (
                e["rec"]["action"].as_str().unwrap_or("").to_string(),
                e["rec"]["change"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let mut sorted = changes.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            ("lookup".to_string(), "removed".to_string()),
            ("refund".into(), "changed".into()),
            ("void".into(), "added".into())
        ],
        "one drift event per changed tool, none for the baseline"
    );
    let drift_of = |tool: &str| {
        *drift
            .iter()
            .find(|e| e["rec"]["action"] == tool)
            .expect("drift event")
    };
    let (refund, lookup) = (of("refund"), of("lookup"));
    assert_eq!((refund.len(), lookup.len()), (2, 2));
    assert_eq!(
        refund[0]["rec"]["hints"],
        json!(["destructive", "idempotent"])
    );
    assert_eq!(lookup[0]["rec"]["hints"], json!(["readOnly", "openWorld"]));
    let def = |e: &Value| e["rec"]["toolDef"].as_str().map(str::to_string);
    assert_eq!(def(refund[0]).map(|d| d.len()), Some(16));
    assert_eq!(refund[0]["rec"].get("listed"), None);
    assert_eq!(
        def(refund[0]),
        drift_of("refund")["rec"]["prevToolDef"]
            .as_str()
            .map(str::to_string)
    );
    assert_eq!(def(refund[1]), def(drift_of("refund")));
    assert_ne!(def(refund[0]), def(refund[1]));
    assert_eq!(
        drift_of("lookup")["rec"]["prevToolDef"].as_str(),
        def(lookup[0]).as_deref()
    );
    assert_eq!(def(of("void")[0]), def(drift_of("void")));
    // A tool the client was never shown, and one no longer listed.
    for e in [of("ghost")[0], lookup[1]] {
        assert_eq!(e["rec"]["listed"], json!(false), "{e}");
        assert!(e["rec"].get("toolDef").is_none(), "{e}");
    }
    // Failures that differ only in ids share a fingerprint; other failures do not.
    let fp = |e: &Value| e["err"]["fp"].as_str().expect("err.fp").to_string();
    let (fail, boom) = (of("fail"), of("boom"));
    assert_eq!(fp(fail[0]), fp(fail[1]));
    assert_eq!(fp(boom[0]), fp(boom[1]));
    assert_eq!(boom[0]["err"]["kind"], "jsonrpc");
    assert_eq!(boom[0]["err"]["code"], -32000);
    let other = fp(of("other_fail")[0]);
    assert!(other != fp(fail[0]) && other != fp(boom[0]) && fp(fail[0]) != fp(boom[0]));
    // The catalog's size, from the last list: seven tools either way.
    for e in [refund[0], refund[1]] {
        assert_eq!(e["session"]["catalog"]["tools"], 7, "{e}");
        assert!(
            e["session"]["catalog"]["bytes"].as_u64().unwrap_or(0) > 500,
            "{e}"
        );
    }
}

struct StdioSession {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: std::thread::JoinHandle<String>,
    seen: Vec<String>,
}

impl StdioSession {
    fn start(sink: &Path, server: &[&str]) -> StdioSession {
        let mut child = wrapper()
            .arg("--ingest")
            .arg(format!("file:{}", sink.display()))
            .args(["--debug", "--flush-ms", "50", "--"])
            .args(server)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the wrapper");
        let stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        StdioSession {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
            seen: Vec::new(),
        }
    }

    /// Sends `msg`; for a request, waits for its answer (other lines are kept in `seen`).
    fn exchange(&mut self, msg: &Value) -> Option<Value> {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{msg}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .expect("write");
        let id = msg.get("id")?;
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).expect("an answer in time");
            self.seen.push(line.clone());
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if v.get("id") == Some(id) && v.get("method").is_none() {
                    return Some(v);
                }
            }
        }
    }

    /// Waits until a line holding `needle` was read (true), or `within` passed.
    fn wait_for(&mut self, needle: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.seen.iter().any(|l| l.contains(needle)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => return false,
            }
        }
        true
    }

    /// Closes the client side and waits for the wrapper: (everything the client read, stderr,
    /// whether it exited 0).
    fn close(mut self) -> (String, String, bool) {
        drop(self.stdin.take());
        let deadline = Instant::now() + STEP;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("the wrapper did not exit");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(l);
        }
        let stderr = self.stderr.join().unwrap_or_default();
        (self.seen.join("\n"), stderr, status.success())
    }
}

/// The events and summed `sensor.health` of every batch in a `file:` sink.
fn read_sink(sink: &Path) -> (Vec<Value>, Value, String) {
    let text = std::fs::read_to_string(sink).unwrap_or_default();
    let mut events = Vec::new();
    let mut health = json!({});
    for line in text.lines() {
        let b: Value = serde_json::from_str(line).expect("a batch per line");
        events.extend(b["events"].as_array().cloned().unwrap_or_default());
        if let Some(h) = b["sensor"]["health"].as_object() {
            for (k, v) in h {
                let sum = health[k].as_u64().unwrap_or(0) + v.as_u64().unwrap_or(0);
                health[k] = json!(sum);
            }
        }
    }
    (events, health, text)
}

#[test]
fn stdio_session_reports_definitions_hints_drift_fingerprints_and_health() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = dir.path().join("events.jsonl");
    let server = example("drift_server");
    let mut s = StdioSession::start(&sink, &[server.to_str().expect("utf-8 path")]);
    for msg in script() {
        let answer = s.exchange(&msg);
        if msg["params"]["name"] == "mutate" {
            assert!(
                s.seen
                    .iter()
                    .any(|l| l.contains("notifications/tools/list_changed")),
                "the server announced the change"
            );
        }
        if let Some(a) = answer {
            assert!(a.get("result").is_some() || a.get("error").is_some(), "{a}");
        }
    }
    let (client_read, stderr, ok) = s.close();
    assert!(ok, "the server's exit code: {stderr}");
    // The relay is untouched: the client was shown the canaries the server sent.
    assert!(client_read.contains("jane.canary@victim.example"));
    let (events, health, file) = read_sink(&sink);
    assert_eq!(
        events.iter().filter(|e| e["class"] != "drift").count(),
        13,
        "{file}"
    );
    check_session(&events);
    assert_eq!(events[0]["dest"]["host"], "mcp://drift");
    assert_eq!(health["stdoutNonJson"], 1, "the noise line: {file}");
    assert_eq!(health["unobserved"], 0);
    assert_no_canary("the sink", &file);
    assert_no_canary("stderr", &stderr);
}

/// Health counts reach the sink even when the session makes no event: a server that only
/// corrupts its stdout is still seen.
#[test]
fn health_counts_without_any_event_go_in_a_batch_of_their_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = dir.path().join("events.jsonl");
    let server = example("drift_server");
    let mut s = StdioSession::start(
        &sink,
        &[server.to_str().expect("utf-8 path"), "--noisy-start"],
    );
    s.exchange(&script()[0]);
    let (_, stderr, ok) = s.close();
    assert!(ok, "{stderr}");
    let (events, health, file) = read_sink(&sink);
    assert!(events.is_empty(), "{file}");
    assert_eq!(health["stdoutNonJson"], 1, "{file}");
}

/// A started `bounded-ingest` (in process) with one org's admin client.
struct TestIngest {
    running: RunningIngest,
    admin: AdminClient,
    http: reqwest::Client,
    base: String,
    _dir: TestDb,
}

impl TestIngest {
    async fn start(store: StoreKind) -> TestIngest {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = TestDb::new(store);
        let running = ingest::start(dir.config()).await.expect("ingest starts");
        TestIngest {
            admin: running.admin_client().expect("admin client"),
            base: running.base_url(),
            http: reqwest::Client::builder()
                .timeout(STEP)
                .build()
                .expect("client"),
            running,
            _dir: dir,
        }
    }

    /// Every read the API offers, as the text it answers.
    async fn api_text(&self, org: &str) -> (Value, Value, Value, Value, String) {
        let secret = self.running.admin_secret().to_string();
        let mut all = String::new();
        let mut out = Vec::new();
        for path in [
            format!("/v1/events?org={org}&limit=1000"),
            format!("/v1/rollups?org={org}"),
            format!("/v1/tools?org={org}"),
            "/v1/admin/sensors".to_string(),
        ] {
            let resp = self
                .http
                .get(format!("{}{path}", self.base))
                .bearer_auth(&secret)
                .send()
                .await
                .expect("request");
            assert_eq!(resp.status().as_u16(), 200, "{path}");
            let text = resp.text().await.expect("body");
            all.push_str(&text);
            out.push(serde_json::from_str::<Value>(&text).expect("JSON"));
        }
        let mut it = out.into_iter();
        let mut next = || it.next().unwrap_or(Value::Null);
        (next(), next(), next(), next(), all)
    }

    async fn post(&self, token: &str, batch: &Value) -> Value {
        let resp = self
            .http
            .post(format!("{}/v1/events", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(batch.to_string())
            .send()
            .await
            .expect("post");
        assert_eq!(resp.status().as_u16(), 200);
        resp.json().await.expect("JSON")
    }
}

both_stores!(http_session_through_a_real_ingest_leaves_no_canary_in_the_api);
async fn http_session_through_a_real_ingest_leaves_no_canary_in_the_api(store: StoreKind) {
    let ingest = TestIngest::start(store).await;
    let key = ingest.admin.mint("acme", Some("http")).await.expect("mint");
    let mut upstream = Command::new(example("drift_server"))
        .arg("--http")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the fixture");
    let mut first = String::new();
    BufReader::new(upstream.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("listening line");
    let url = first
        .trim()
        .strip_prefix("listening ")
        .expect("listening line")
        .to_string();
    let mut proxy = wrapper()
        .args(["--http", "--upstream", &url, "--flush-ms", "50", "--debug"])
        .args(["--ingest", &ingest.base, "--token", &key.token])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the proxy");
    let stderr = proxy.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let listen = loop {
        let line = rx.recv_timeout(STEP).expect("the proxy's listening line");
        if let Some(rest) = line.split("listening ").nth(1) {
            break rest.split_whitespace().next().unwrap_or("").to_string();
        }
    };
    let client = reqwest::Client::builder()
        .timeout(STEP)
        .build()
        .expect("client");
    let mut read = String::new();
    let mut session: Option<String> = None;
    for msg in script() {
        if msg["params"]["name"] == "noise" {
            continue;
        }
        let mut req = client
            .post(format!("{listen}/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(s) = &session {
            req = req.header("mcp-session-id", s);
        }
        let resp = req
            .body(msg.to_string())
            .send()
            .await
            .expect("post through the proxy");
        if let Some(s) = resp.headers().get("mcp-session-id") {
            session = s.to_str().ok().map(str::to_string);
        }
        read.push_str(&resp.text().await.expect("answer"));
    }
    assert!(session.is_some(), "the fixture names a session");
    assert!(read.contains("notifications/tools/list_changed"));
    assert!(
        read.contains("jane.canary@victim.example"),
        "relayed unchanged"
    );
    // 12 calls (no `noise` over HTTP) and 3 drift events.
    let deadline = Instant::now() + STEP;
    let events = loop {
        let ev = ingest
            .admin
            .events(&[("limit", "1000")])
            .await
            .expect("events");
        if ev.len() >= 15 || Instant::now() > deadline {
            break ev;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Stops cleanly (SIGTERM): the last batch, with the health counts, is flushed.
    let pid = nix::unistd::Pid::from_raw(proxy.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let _ = proxy.wait();
    drop(upstream.stdin.take());
    let _ = upstream.wait();
    let mut proxy_stderr = String::new();
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
        proxy_stderr.push_str(&l);
    }
    let mut events = events;
    events.reverse(); // oldest first, as sent
    assert_eq!(events.len(), 15, "12 calls and 3 drift events: {events:?}");
    check_session(&events);
    let (_, rollups, tools, sensors, all) = ingest.api_text("acme").await;
    assert_no_canary("the ingest's API", &all);
    assert_no_canary("the proxy's stderr", &proxy_stderr);

    let refund = tools["tools"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["tool"] == "refund"))
        .expect("refund in /v1/tools");
    assert_eq!(refund["defs"].as_array().map(Vec::len), Some(2), "{refund}");
    assert_eq!(refund["changed"], true, "{refund}");
    assert_eq!(refund["inconsistent"], false, "{refund}");
    let groups = rollups["errorGroups"].as_array().expect("errorGroups");
    let count_of = |tool: &str| {
        groups
            .iter()
            .filter(|g| g["tool"] == tool)
            .map(|g| g["count"].as_u64().unwrap_or(0))
            .collect::<Vec<_>>()
    };
    assert_eq!(count_of("fail"), [2], "one group of two: {rollups}");
    assert_eq!(count_of("boom"), [2], "{rollups}");
    assert_eq!(count_of("other_fail"), [1], "{rollups}");
    let catalogs = rollups["catalogs"].as_array().expect("catalogs");
    assert_eq!(catalogs.len(), 1, "{rollups}");
    assert_eq!(catalogs[0]["tools"], 7);
    let mine = sensors["sensors"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["keyId"] == key.key_id.as_str()))
        .expect("the key's sensor row");
    assert_eq!(mine["health"]["unobserved"], 0, "{mine}");
    assert!(mine["health"].get("stdoutNonJson").is_some(), "{mine}");
    ingest.running.shutdown().await.expect("shutdown");
}

fn fleet_event(n: u64, tool: &str, class: &str, rec: Value, ts: &str) -> Value {
    let mut r = json!({"rail": "mcp", "action": tool, "registryVersion": null});
    if let (Some(r), Some(extra)) = (r.as_object_mut(), rec.as_object()) {
        r.extend(extra.clone());
    }
    json!({
        "v": 2, "id": format!("{n:032x}"), "ts": ts, "class": class, "rec": r,
        "dest": {"host": "mcp://docs", "pathTemplate": format!("/{tool}"), "method": "POST"},
        "actor": {"id": "mcp:x", "kind": "agent", "grade": "attested"},
        "status": 200, "dur_ms": 1.0, "bytes": {"req": 1, "resp": 1},
        "session": {"id": "s1", "catalog": {"tools": 3, "bytes": 2048 + n}}
    })
}

fn fleet_batch(events: Vec<Value>, health: Value) -> Value {
    json!({"v": 2, "sensor": {"version": "0.1.0", "transport": "stdio", "health": health},
           "dropped": 0, "events": events})
}

both_stores!(tools_view_flags_changed_and_inconsistent_definitions_across_sensors);
async fn tools_view_flags_changed_and_inconsistent_definitions_across_sensors(store: StoreKind) {
    let ingest = TestIngest::start(store).await;
    let a = ingest.admin.mint("acme", Some("a")).await.expect("mint");
    let b = ingest.admin.mint("acme", Some("b")).await.expect("mint");
    let now = bounded_observe_mcp::event::rfc3339_ms(std::time::SystemTime::now());
    let (h1, h2, h3) = ("aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", "cccccccccccccccc");
    let health = json!({"stdoutNonJson": 3, "oversizeFrames": 1, "orphanResponses": 2,
                        "unobserved": 4, "tapDroppedBytes": 100});
    let got = ingest
        .post(
            &a.token,
            &fleet_batch(
                vec![
                    // `search`: A sees h1, B sees h2 in the same hour.
                    fleet_event(1, "search", "action", json!({"toolDef": h1}), &now),
                    // `fetch`: A sees h1, then the definition changes to h3 (a drift event).
                    fleet_event(
                        2,
                        "fetch",
                        "action",
                        json!({"toolDef": h1}),
                        "2026-11-29T10:00:00.000Z",
                    ),
                    fleet_event(
                        3,
                        "fetch",
                        "drift",
                        json!({"change": "changed", "toolDef": h3,
                        "prevToolDef": h1}),
                        "2026-11-29T10:05:00.000Z",
                    ),
                    // `stable`: both see h2.
                    fleet_event(4, "stable", "action", json!({"toolDef": h2}), &now),
                    // A hostile sensor: text where a hash, a hint or a count belongs.
                    fleet_event(
                        5,
                        "bad",
                        "action",
                        json!({"toolDef": "jane.canary@victim.example"}),
                        &now,
                    ),
                    fleet_event(
                        6,
                        "bad",
                        "action",
                        json!({"hints": ["jane.canary@victim.example"]}),
                        &now,
                    ),
                    fleet_event(
                        7,
                        "bad",
                        "drift",
                        json!({"change": "sk_live_CANARY0123456789"}),
                        &now,
                    ),
                ],
                health.clone(),
            ),
        )
        .await;
    assert_eq!(got["accepted"], 4, "{got}");
    assert_eq!(got["rejected"], 3, "{got}");
    let mut err = fleet_event(8, "bad", "error", json!({}), &now);
    err["status"] = json!(500);
    err["err"] = json!({"kind": "tool", "fp": "Declined: 4111 1111 1111 1111"});
    let got = ingest
        .post(
            &b.token,
            &fleet_batch(
                vec![
                    fleet_event(11, "search", "action", json!({"toolDef": h2}), &now),
                    fleet_event(12, "stable", "action", json!({"toolDef": h2}), &now),
                    err,
                ],
                json!({"stdoutNonJson": "jane.canary@victim.example"}),
            ),
        )
        .await;
    assert_eq!(
        (got["accepted"].clone(), got["rejected"].clone()),
        (json!(2), json!(1)),
        "{got}"
    );

    let (_, rollups, tools, sensors, all) = ingest.api_text("acme").await;
    assert_no_canary("the ingest's API", &all);
    let tool = |name: &str| {
        tools["tools"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["tool"] == name))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let flags = |t: &Value| (t["changed"].clone(), t["inconsistent"].clone());
    assert_eq!(
        flags(&tool("search")),
        (json!(false), json!(true)),
        "{tools}"
    );
    assert_eq!(
        flags(&tool("fetch")),
        (json!(true), json!(false)),
        "{tools}"
    );
    assert_eq!(
        flags(&tool("stable")),
        (json!(false), json!(false)),
        "{tools}"
    );
    assert_eq!(tool("bad"), Value::Null);
    let listed = ingest
        .admin
        .tools(Some("acme"))
        .await
        .expect("admin client reads tools");
    assert_eq!(Some(&listed), tools["tools"].as_array());
    assert_eq!(listed.len(), 3);
    let stable = tool("stable");
    assert_eq!(stable["defs"][0]["sensors"], 2, "{stable}");
    assert_eq!(stable["host"], "mcp://docs");
    let search = tool("search");
    let defs: Vec<&str> = search["defs"]
        .as_array()
        .map(|d| d.iter().filter_map(|x| x["def"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(defs.len(), 2, "{search}");
    assert!(defs.contains(&h1) && defs.contains(&h2));
    // The largest catalog per host.
    assert_eq!(rollups["catalogs"][0]["host"], "mcp://docs", "{rollups}");
    assert_eq!(rollups["catalogs"][0]["bytes"], 2048 + 12, "{rollups}");
    // Health per key: A's counts as sent; B's malformed health is skipped, not stored.
    let row = |k: &str| {
        sensors["sensors"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["keyId"] == k))
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(row(&a.key_id)["health"], health, "{sensors}");
    assert_eq!(row(&b.key_id)["health"]["stdoutNonJson"], 0, "{sensors}");
    ingest.running.shutdown().await.expect("shutdown");
}

/// The official server-everything registers the tools that depend on the client's
/// capabilities once the client says `notifications/initialized`, and announces them with
/// `notifications/tools/list_changed`: a client that listed before then and lists again sees
/// tools added, and the sensor reports each as a `drift` event; a call to a tool it never
/// listed is `listed: false`. No description of its catalog reaches the sink.
#[test]
fn server_everything_list_changed_mid_session_becomes_drift_events() {
    let script = interop_support::everything_script();
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = dir.path().join("events.jsonl");
    let mut s = StdioSession::start(
        &sink,
        &["node", script.to_str().expect("utf-8 path"), "stdio"],
    );
    s.exchange(
        &json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-06-18",
        "capabilities":{"roots":{"listChanged":true},"sampling":{},"elicitation":{}},
        "clientInfo":{"name":"evidence-client","version":"1"}}}),
    );
    let before = s
        .exchange(&json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}))
        .expect("tools/list answer");
    s.exchange(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
    assert!(
        s.wait_for("notifications/tools/list_changed", STEP),
        "server-everything announces its conditional tools"
    );
    let after = s
        .exchange(&json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}))
        .expect("tools/list answer");
    let names = |v: &Value| -> Vec<String> {
        v["result"]["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let added: Vec<String> = names(&after)
        .into_iter()
        .filter(|n| !names(&before).contains(n))
        .collect();
    assert!(!added.is_empty(), "{after}");
    s.exchange(&call(3, "get-sum", json!({"a": 2, "b": 40})));
    s.exchange(&call(4, "no-such-tool", json!({})));
    // server-everything does not exit when its stdin closes: the wrapper stops it (143).
    let (_, stderr, _) = s.close();
    let (events, _, file) = read_sink(&sink);
    let mut drift: Vec<String> = events
        .iter()
        .filter(|e| e["class"] == "drift")
        .map(|e| {
            assert_eq!(e["rec"]["change"], "added", "{e}");
            assert!(
                e["rec"]["toolDef"].as_str().is_some_and(|d| d.len() == 16),
                "{e}"
            );
            assert!(e["rec"].get("prevToolDef").is_none(), "{e}");
            e["rec"]["action"].as_str().unwrap_or("").to_string()
        })
        .collect();
    drift.sort();
    let mut want = added.clone();
    want.sort();
    assert_eq!(drift, want, "one drift event per added tool: {file}");
    let by = |tool: &str| {
        events
            .iter()
            .find(|e| e["rec"]["action"] == tool && e["class"] != "drift")
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert!(by("get-sum")["rec"]["toolDef"].as_str().is_some(), "{file}");
    let unlisted = by("no-such-tool");
    assert_eq!(unlisted["rec"]["listed"], false, "{file}");
    assert!(unlisted["err"]["fp"].as_str().is_some(), "{file}");
    let tools_listed = after["result"]["tools"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0) as u64;
    assert_eq!(by("get-sum")["session"]["catalog"]["tools"], tools_listed);
    // Not a word of any listed description.
    for t in after["result"]["tools"].as_array().into_iter().flatten() {
        if let Some(d) = t["description"].as_str().filter(|d| d.len() >= 24) {
            let head: String = d.chars().take(24).collect();
            assert!(!file.contains(&head), "{head:?} in the sink");
            assert!(!stderr.contains(&head), "{head:?} on stderr");
        }
    }
}
