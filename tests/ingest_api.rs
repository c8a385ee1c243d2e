//! The reference ingest's HTTP API against a real server on 127.0.0.1:0, each API case on both
//! stores (`name::sqlite`: a real SQLite file in a temp dir; `name::postgres`: a database of its
//! own on a real PostgreSQL cluster that this binary's tests share, tests/store_support): the
//! in-process server (`ingest::start`) for the API cases, the real `bounded-ingest` binary for
//! the CLI, restart and crash cases. Every bad-input and attack case of issue 5 is a test here,
//! and each one also checks that nothing leaked into the store. Connection handling (header and
//! idle timeouts, the connection cap) happens before any store and runs on SQLite only.

mod ingest_support;
mod pg_support;
mod store_support;

use ingest_support::{ingest_command, stderr_lines, INGEST_BIN};
use store_support::{StoreKind, TestDb};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bounded_observe_mcp::ingest::{self, keys::Signer, AdminClient, IngestConfig, RunningIngest};
use serde_json::{json, Value};
use store_support::Served as ServedOn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TS: &str = "2026-11-29T19:00:00.000Z";
/// Generous: the machine is shared and loaded.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

struct Ingest {
    running: Option<RunningIngest>,
    db: TestDb,
    admin: AdminClient,
    http: reqwest::Client,
    base: String,
}

/// reqwest is built without a bundled TLS provider and panics building a client without one.
fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn db_in(dir: &Path) -> PathBuf {
    dir.join("ingest.db")
}

async fn start_in(db: TestDb) -> Ingest {
    install_tls_provider();
    let running = ingest::start(db.config()).await.expect("ingest starts");
    let admin = running.admin_client().expect("admin client");
    let base = running.base_url();
    Ingest {
        running: Some(running),
        db,
        admin,
        http: reqwest::Client::builder()
            .timeout(IO_TIMEOUT)
            .build()
            .expect("client"),
        base,
    }
}

async fn start(store: StoreKind) -> Ingest {
    start_in(TestDb::new(store)).await
}

impl Ingest {
    async fn stop(mut self) -> TestDb {
        if let Some(r) = self.running.take() {
            r.shutdown().await.expect("clean shutdown");
        }
        self.db
    }

    fn admin_secret(&self) -> String {
        self.running
            .as_ref()
            .expect("running")
            .admin_secret()
            .to_string()
    }

    /// POSTs `body` to /v1/events with an optional raw Authorization header value.
    async fn post_raw(&self, auth: Option<&str>, body: Vec<u8>) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{}/v1/events", self.base))
            .header("content-type", "application/json")
            .body(body);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.expect("body");
        let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        assert!(status < 500, "client mistake answered {status}: {v}");
        (status, v)
    }

    async fn post(&self, token: &str, batch: &Value) -> (u16, Value) {
        self.post_raw(
            Some(&format!("Bearer {token}")),
            serde_json::to_vec(batch).expect("json"),
        )
        .await
    }

    async fn get(&self, path: &str, bearer: &str) -> (u16, Value) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(bearer)
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        let v = resp.json::<Value>().await.unwrap_or(Value::Null);
        (status, v)
    }

    async fn all_events(&self) -> Vec<Value> {
        self.admin
            .events(&[("limit", "1000")])
            .await
            .expect("events")
    }
}

fn event_id(n: u64) -> String {
    format!("{n:032x}")
}

fn event(id: &str, action: &str, class: &str, fields: Value) -> Value {
    let mut e = json!({
        "v": 2,
        "id": id,
        "ts": TS,
        "class": class,
        "rec": { "rail": "mcp", "action": action, "registryVersion": null, "fields": fields },
        "dest": { "host": "mcp://payments", "pathTemplate": format!("/{action}"), "method": "POST" },
        "actor": { "id": "mcp:sensor", "kind": "agent", "grade": "attested" },
        "status": if class == "error" { 500 } else { 200 },
        "dur_ms": 1.25,
        "bytes": { "req": 120, "resp": 300 },
    });
    if class == "error" {
        e["err"] = json!({ "kind": "tool" });
    }
    e
}

fn batch(events: Vec<Value>) -> Value {
    json!({ "v": 2, "sensor": { "version": "0.1.0", "transport": "stdio" }, "dropped": 0, "events": events })
}

fn refund(n: u64, cents: u64) -> Value {
    event(
        &event_id(n),
        "issue_refund",
        "action",
        json!({ "amount_cents": cents }),
    )
}

both_stores!(healthz_is_200_without_auth);
async fn healthz_is_200_without_auth(store: StoreKind) {
    let ing = start(store).await;
    let resp = ing
        .http
        .get(format!("{}/healthz", ing.base))
        .send()
        .await
        .expect("healthz");
    assert_eq!(resp.status().as_u16(), 200);
    ing.stop().await;
}

both_stores!(valid_batch_is_accepted_and_stored_with_org_sensor_and_received_at);
async fn valid_batch_is_accepted_and_stored_with_org_sensor_and_received_at(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", Some("laptop")).await.expect("mint");
    assert_eq!(key.org, "acme");
    assert!(key.token.starts_with(&format!("obs1.{}.", key.key_id)));
    let (status, body) = ing.post(&key.token, &batch(vec![refund(1, 4900)])).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({ "accepted": 1, "rejected": 0, "duplicates": 0 })
    );
    let events = ing.all_events().await;
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(e["org"], "acme");
    assert_eq!(e["sensor"], key.key_id.as_str());
    assert!(e["receivedAt"].as_str().is_some_and(|s| s.ends_with('Z')));
    assert_eq!(e["rec"]["fields"]["amount_cents"], 4900);
    assert_eq!(e["id"], event_id(1).as_str());
    ing.stop().await;
}

both_stores!(bad_credentials_are_401_with_a_json_error_and_store_nothing);
async fn bad_credentials_are_401_with_a_json_error_and_store_nothing(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    let body = serde_json::to_vec(&batch(vec![refund(1, 1)])).expect("json");

    // A correctly signed token for a key id that was never minted.
    let signer = ing.db.signer();
    let unknown = signer.token_for("k_00000000000000000000");
    // The real key id with a signature made with another secret.
    let forged = Signer::from_secret(&[42u8; 32]).token_for(&key.key_id);
    // The real signature with its last character changed.
    let mut tampered = key.token.clone();
    let last = tampered.pop().expect("non-empty");
    tampered.push(if last == 'A' { 'B' } else { 'A' });
    let admin_secret = ing.admin_secret();

    let cases: Vec<(&str, Option<String>)> = vec![
        ("missing header", None),
        ("wrong scheme", Some(format!("Basic {}", key.token))),
        ("scheme only", Some("Bearer".into())),
        ("token without scheme", Some(key.token.clone())),
        ("malformed token", Some("Bearer obs1.only-two".into())),
        (
            "wrong prefix",
            Some(format!("Bearer obs2{}", &key.token[4..])),
        ),
        ("garbage", Some("Bearer \u{1}\u{2}".into())),
        ("forged signature", Some(format!("Bearer {forged}"))),
        ("tampered signature", Some(format!("Bearer {tampered}"))),
        ("unknown key", Some(format!("Bearer {unknown}"))),
        (
            "admin secret as sensor token",
            Some(format!("Bearer {admin_secret}")),
        ),
    ];
    for (what, auth) in cases {
        let resp = {
            let mut req = ing
                .http
                .post(format!("{}/v1/events", ing.base))
                .body(body.clone());
            if let Some(a) = &auth {
                req = match reqwest::header::HeaderValue::from_bytes(a.as_bytes()) {
                    Ok(v) => req.header("authorization", v),
                    Err(_) => req,
                };
            }
            req.send().await.expect("request")
        };
        assert_eq!(resp.status().as_u16(), 401, "{what}");
        assert_eq!(
            resp.headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok()),
            Some("Bearer"),
            "{what}"
        );
        let v: Value = resp.json().await.expect("json error body");
        assert!(
            v["error"].as_str().is_some_and(|s| !s.is_empty()),
            "{what}: {v}"
        );
    }
    assert!(ing.all_events().await.is_empty());
    // The genuine token still works after all that.
    assert_eq!(
        ing.post(&key.token, &batch(vec![refund(1, 1)])).await.0,
        200
    );
    ing.stop().await;
}

both_stores!(revoked_key_is_refused_on_its_next_batch_and_nothing_more_is_stored);
async fn revoked_key_is_refused_on_its_next_batch_and_nothing_more_is_stored(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    let other = ing.admin.mint("acme", None).await.expect("mint");
    assert_eq!(
        ing.post(&key.token, &batch(vec![refund(1, 100)])).await.0,
        200
    );
    ing.admin.revoke(&key.key_id).await.expect("revoke");
    let (status, body) = ing.post(&key.token, &batch(vec![refund(2, 200)])).await;
    assert_eq!(status, 401, "{body}");
    assert!(body["error"]
        .as_str()
        .is_some_and(|e| e.contains("revoked")));
    let events = ing.all_events().await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["id"], event_id(1).as_str());
    // Revoking again is idempotent; an unknown key is 404; other keys are unaffected.
    ing.admin.revoke(&key.key_id).await.expect("revoke twice");
    let unknown = ing.admin.revoke("k_ffffffffffffffffffff").await;
    assert_eq!(unknown.err().and_then(|e| e.status()), Some(404));
    assert_eq!(
        ing.post(&other.token, &batch(vec![refund(3, 1)])).await.0,
        200
    );
    ing.stop().await;
}

both_stores!(sensor_token_is_refused_on_every_admin_route);
async fn sensor_token_is_refused_on_every_admin_route(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    let sensor_admin = AdminClient::new(&ing.base, &key.token).expect("client");
    let mint = sensor_admin.mint("evil", None).await;
    assert_eq!(mint.err().and_then(|e| e.status()), Some(401));
    let revoke = sensor_admin.revoke(&key.key_id).await;
    assert_eq!(revoke.err().and_then(|e| e.status()), Some(401));
    for path in [
        "/v1/rollups",
        "/v1/rollups?org=acme",
        "/v1/events",
        "/v1/events?org=acme",
        "/v1/admin/sensors",
    ] {
        let (status, body) = ing.get(path, &key.token).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert!(body["error"].is_string(), "{path}: {body}");
    }
    // No admin header at all.
    let resp = ing
        .http
        .get(format!("{}/v1/rollups", ing.base))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status().as_u16(), 401);
    // The key was not revoked by the refused call and can still send.
    assert_eq!(
        ing.post(&key.token, &batch(vec![refund(1, 1)])).await.0,
        200
    );
    ing.stop().await;
}

both_stores!(org_and_sensor_sent_in_the_body_are_overwritten_from_the_key);
async fn org_and_sensor_sent_in_the_body_are_overwritten_from_the_key(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    let mut e = refund(1, 4900);
    e["org"] = json!("victim-org");
    e["sensor"] = json!("k_spoofed");
    e["receivedAt"] = json!("1999-01-01T00:00:00.000Z");
    let mut b = batch(vec![e]);
    b["org"] = json!("victim-org");
    b["sensor"] =
        json!({ "id": "k_spoofed", "org": "victim-org", "version": "x", "transport": "stdio" });
    let (status, body) = ing.post(&key.token, &b).await;
    assert_eq!((status, body["accepted"].clone()), (200, json!(1)));
    let events = ing.all_events().await;
    assert_eq!(events[0]["org"], "acme");
    assert_eq!(events[0]["sensor"], key.key_id.as_str());
    assert_ne!(events[0]["receivedAt"], "1999-01-01T00:00:00.000Z");
    let victim = ing
        .admin
        .events(&[("org", "victim-org")])
        .await
        .expect("events");
    assert!(victim.is_empty());
    let rollups = ing
        .admin
        .rollups(Some("victim-org"))
        .await
        .expect("rollups");
    assert!(rollups.is_empty());
    ing.stop().await;
}

both_stores!(batch_over_500_events_is_413_with_a_clear_error_and_stores_nothing);
async fn batch_over_500_events_is_413_with_a_clear_error_and_stores_nothing(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    for n in [501u64, 10_000] {
        let events = (0..n).map(|i| refund(i + 1, 1)).collect();
        let (status, body) = ing.post(&key.token, &batch(events)).await;
        assert_eq!(status, 413, "{n} events: {body}");
        let msg = body["error"].as_str().unwrap_or_default().to_string();
        assert!(msg.contains("500"), "{n} events: {msg}");
    }
    assert!(ing.all_events().await.is_empty());
    // Exactly 500 is fine.
    let events = (0..500).map(|i| refund(i + 1, 1)).collect();
    let (status, body) = ing.post(&key.token, &batch(events)).await;
    assert_eq!((status, body["accepted"].clone()), (200, json!(500)));
    ing.stop().await;
}

/// Sends a request head, then streams up to `total` body bytes while reading the answer; returns
/// the status line and how many body bytes were written before the server stopped reading.
async fn stream_body(base: &str, head: String, total: usize) -> (String, usize) {
    let addr = base.trim_start_matches("http://").to_string();
    let stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    wr.write_all(head.as_bytes()).await.expect("head");
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let writer = tokio::spawn(async move {
        let chunk = vec![b'x'; 64 * 1024];
        let mut sent = 0usize;
        while sent < total {
            let res = if chunked {
                let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
                framed.extend_from_slice(&chunk);
                framed.extend_from_slice(b"\r\n");
                wr.write_all(&framed).await
            } else {
                wr.write_all(&chunk).await
            };
            if res.is_err() {
                break;
            }
            sent += chunk.len();
        }
        sent
    });
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let read = tokio::time::timeout(IO_TIMEOUT, async {
        loop {
            match rd.read(&mut tmp).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.extend_from_slice(&tmp[..n]);
                    if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within {IO_TIMEOUT:?}");
    drop(rd);
    let sent = tokio::time::timeout(IO_TIMEOUT, writer)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0);
    let text = String::from_utf8_lossy(&buf);
    (text.lines().next().unwrap_or_default().to_string(), sent)
}

both_stores!(fifty_megabyte_body_is_413_without_being_read);
async fn fifty_megabyte_body_is_413_without_being_read(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    const FIFTY_MB: usize = 50 * 1024 * 1024;
    let auth = format!("Authorization: Bearer {}\r\n", key.token);

    // Declared length: refused on the headers, before the body.
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {FIFTY_MB}\r\n\r\n"
    );
    let (status, sent) = stream_body(&ing.base, head, FIFTY_MB).await;
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
    assert!(sent < FIFTY_MB, "the whole body was read ({sent} bytes)");

    // Chunked, no length: cut off once past the limit.
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let (status, sent) = stream_body(&ing.base, head, FIFTY_MB).await;
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
    assert!(sent < FIFTY_MB, "the whole body was read ({sent} bytes)");

    // Without a token, refused before the body too.
    let head = format!("POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: {FIFTY_MB}\r\n\r\n");
    let (status, _) = stream_body(&ing.base, head, FIFTY_MB).await;
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");

    assert!(ing.all_events().await.is_empty());
    // Still serving.
    assert_eq!(
        ing.post(&key.token, &batch(vec![refund(1, 1)])).await.0,
        200
    );
    ing.stop().await;
}

both_stores!(a_body_that_never_finishes_is_408_and_the_server_keeps_serving);
async fn a_body_that_never_finishes_is_408_and_the_server_keeps_serving(store: StoreKind) {
    let db = TestDb::new(store);
    let mut cfg = db.config();
    cfg.limits.body_read_timeout = Duration::from_millis(500);
    let running = ingest::start(cfg).await.expect("start");
    let admin = running.admin_client().expect("admin");
    let key = admin.mint("acme", None).await.expect("mint");
    let addr = running.addr();
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: 1000\r\n\r\n{{\"v\":2",
        key.token
    );
    s.write_all(head.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(IO_TIMEOUT, s.read(&mut buf))
        .await
        .expect("answered before the test timeout")
        .expect("read");
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(admin.events(&[]).await.expect("events").is_empty());
    running.shutdown().await.expect("shutdown");
}

both_stores!(malformed_bodies_are_400_never_500);
async fn malformed_bodies_are_400_never_500(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    let auth = format!("Bearer {}", key.token);
    let mut invalid_utf8 = br#"{"v":2,"dropped":0,"events":[{"v":2,"id":""#.to_vec();
    invalid_utf8.extend_from_slice(&[0xff, 0xfe, 0xc3]);
    invalid_utf8.extend_from_slice(br#""}]}"#);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("invalid UTF-8", invalid_utf8),
        ("not JSON", b"this is not json".to_vec()),
        ("truncated JSON", br#"{"v":2,"events":[{"#.to_vec()),
        ("empty body", Vec::new()),
        ("array instead of batch", b"[]".to_vec()),
        (
            "events not an array",
            br#"{"v":2,"dropped":0,"events":{}}"#.to_vec(),
        ),
        ("events missing", br#"{"v":2,"dropped":0}"#.to_vec()),
        (
            "unknown batch version",
            br#"{"v":3,"dropped":0,"events":[]}"#.to_vec(),
        ),
        (
            "negative dropped",
            br#"{"v":2,"dropped":-1,"events":[]}"#.to_vec(),
        ),
        (
            "deep nesting",
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
        ),
    ];
    for (what, body) in cases {
        let (status, v) = ing.post_raw(Some(&auth), body).await;
        assert_eq!(status, 400, "{what}: {v}");
        assert!(v["error"].is_string(), "{what}: {v}");
    }
    assert!(ing.all_events().await.is_empty());
    ing.stop().await;
}

both_stores!(schema_invalid_events_are_rejected_alone_and_counted);
async fn schema_invalid_events_are_rejected_alone_and_counted(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    let mut no_id = refund(10, 1);
    no_id.as_object_mut().expect("object").remove("id");
    let mut bad_class = refund(11, 1);
    bad_class["class"] = json!("weird");
    let mut bad_status = refund(12, 1);
    bad_status["status"] = json!("two hundred");
    let events = vec![
        refund(1, 100),
        no_id,
        json!("not an object"),
        bad_class,
        refund(2, 200),
        bad_status,
        json!(null),
    ];
    let (status, body) = ing.post(&key.token, &batch(events)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({ "accepted": 2, "rejected": 5, "duplicates": 0 })
    );
    let mut ids: Vec<String> = ing
        .all_events()
        .await
        .iter()
        .filter_map(|e| e["id"].as_str().map(str::to_owned))
        .collect();
    ids.sort();
    assert_eq!(ids, vec![event_id(1), event_id(2)]);
    ing.stop().await;
}

both_stores!(the_same_batch_sent_twice_is_stored_once);
async fn the_same_batch_sent_twice_is_stored_once(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    let b = batch((1..=20).map(|i| refund(i, 10)).collect());
    let (_, first) = ing.post(&key.token, &b).await;
    assert_eq!(
        first,
        json!({ "accepted": 20, "rejected": 0, "duplicates": 0 })
    );
    let (_, second) = ing.post(&key.token, &b).await;
    assert_eq!(
        second,
        json!({ "accepted": 0, "rejected": 0, "duplicates": 20 })
    );
    // A repeated id inside one batch is a duplicate too.
    let (_, within) = ing
        .post(&key.token, &batch(vec![refund(99, 1), refund(99, 1)]))
        .await;
    assert_eq!(
        within,
        json!({ "accepted": 1, "rejected": 0, "duplicates": 1 })
    );
    assert_eq!(ing.all_events().await.len(), 21);
    let rollups = ing.admin.rollups(Some("acme")).await.expect("rollups");
    assert_eq!(rollups.len(), 1);
    assert_eq!(rollups[0]["count"], 21);
    assert_eq!(rollups[0]["sums"]["amount_cents"], 201);
    ing.stop().await;
}

both_stores!(an_event_id_from_another_org_does_not_suppress_ours);
async fn an_event_id_from_another_org_does_not_suppress_ours(store: StoreKind) {
    let ing = start(store).await;
    let ours = ing.admin.mint("acme", None).await.expect("mint");
    let theirs = ing.admin.mint("evil", None).await.expect("mint");
    assert_eq!(
        ing.post(&theirs.token, &batch(vec![refund(7, 1)])).await.1["accepted"],
        1
    );
    assert_eq!(
        ing.post(&ours.token, &batch(vec![refund(7, 1)])).await.1["accepted"],
        1
    );
    assert_eq!(
        ing.admin
            .events(&[("org", "acme")])
            .await
            .expect("events")
            .len(),
        1
    );
    ing.stop().await;
}

both_stores!(concurrent_senders_all_land_exactly_once, 4);
async fn concurrent_senders_all_land_exactly_once(store: StoreKind) {
    let ing = start(store).await;
    const SENDERS: u64 = 6;
    const BATCHES: u64 = 8;
    const PER_BATCH: u64 = 50;
    let mut keys = Vec::new();
    for i in 0..SENDERS {
        // Two senders share each key, as two wrapper processes with one token would.
        if i % 2 == 0 {
            keys.push(ing.admin.mint("acme", None).await.expect("mint"));
        }
    }
    let mut tasks = Vec::new();
    for s in 0..SENDERS {
        let token = keys[(s / 2) as usize].token.clone();
        let http = ing.http.clone();
        let url = format!("{}/v1/events", ing.base);
        tasks.push(tokio::spawn(async move {
            let mut accepted = 0u64;
            for b in 0..BATCHES {
                let events = (0..PER_BATCH)
                    .map(|i| refund(1 + s * 1_000_000 + b * 1_000 + i, 1))
                    .collect();
                let resp = http
                    .post(&url)
                    .bearer_auth(&token)
                    .body(serde_json::to_vec(&batch(events)).expect("json"))
                    .send()
                    .await
                    .expect("post");
                assert_eq!(resp.status().as_u16(), 200);
                let v: Value = resp.json().await.expect("json");
                accepted += v["accepted"].as_u64().unwrap_or(0);
            }
            accepted
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("sender");
    }
    let expected = SENDERS * BATCHES * PER_BATCH;
    assert_eq!(total, expected);
    let rollups = ing.admin.rollups(Some("acme")).await.expect("rollups");
    let count: u64 = rollups.iter().filter_map(|r| r["count"].as_u64()).sum();
    assert_eq!(count, expected);
    let sum: u64 = rollups
        .iter()
        .filter_map(|r| r["sums"]["amount_cents"].as_u64())
        .sum();
    assert_eq!(sum, expected);
    ing.stop().await;
}

both_stores!(rollups_count_per_group_and_sum_numeric_fields);
async fn rollups_count_per_group_and_sum_numeric_fields(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    let other = ing.admin.mint("globex", None).await.expect("mint");
    let events = vec![
        refund(1, 4900),
        refund(2, 100),
        event(
            &event_id(3),
            "issue_refund",
            "error",
            json!({ "amount_cents": 7 }),
        ),
        event(
            &event_id(4),
            "lookup",
            "action",
            json!({ "currency": "EUR", "quantity": 2.5 }),
        ),
    ];
    assert_eq!(ing.post(&key.token, &batch(events)).await.1["accepted"], 4);
    assert_eq!(
        ing.post(&other.token, &batch(vec![refund(5, 1)])).await.1["accepted"],
        1
    );

    let rollups = ing.admin.rollups(Some("acme")).await.expect("rollups");
    let find = |action: &str, class: &str| {
        rollups
            .iter()
            .find(|r| r["action"] == action && r["class"] == class)
            .cloned()
            .unwrap_or(Value::Null)
    };
    let refunds = find("issue_refund", "action");
    assert_eq!(refunds["org"], "acme");
    assert_eq!(refunds["actor"], "mcp:sensor");
    assert_eq!(refunds["count"], 2);
    assert_eq!(refunds["sums"], json!({ "amount_cents": 5000 }));
    let errors = find("issue_refund", "error");
    assert_eq!(errors["count"], 1);
    let lookup = find("lookup", "action");
    assert_eq!(
        lookup["sums"],
        json!({ "quantity": 2.5 }),
        "strings are not summed"
    );
    assert_eq!(rollups.len(), 3, "org filter keeps globex out: {rollups:?}");
    let all = ing.admin.rollups(None).await.expect("rollups");
    assert_eq!(all.len(), 4);
    ing.stop().await;
}

both_stores!(rollups_survive_sums_past_the_integer_range);
async fn rollups_survive_sums_past_the_integer_range(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    // Two amounts whose integer sum overflows i64 (SQL SUM() would fail on it), chosen so that
    // no run of their digits is Luhn-valid: the privacy layer would scrub those as card numbers.
    let huge: i64 = 9_040_112_794_022_449_183;
    let check = event(&event_id(1), "a", "action", json!({ "amount_cents": huge }));
    let kept = bounded_observe_mcp::event::validate_and_filter_event(&check).expect("valid");
    assert_eq!(kept["rec"]["fields"]["amount_cents"], json!(huge));
    let events = (1..=2)
        .map(|i| {
            event(
                &event_id(i),
                "issue_refund",
                "action",
                json!({ "amount_cents": huge }),
            )
        })
        .collect();
    let (status, body) = ing.post(&key.token, &batch(events)).await;
    assert_eq!(
        (status, body["accepted"].clone()),
        (200, json!(2)),
        "{body}"
    );
    let (status, body) = ing.get("/v1/rollups?org=acme", &ing.admin_secret()).await;
    assert_eq!(status, 200, "{body}");
    let sum = body["rollups"][0]["sums"]["amount_cents"]
        .as_f64()
        .unwrap_or(0.0);
    assert!(sum > 1.8e19, "{huge}: {body}");
    ing.stop().await;
}

both_stores!(events_read_back_newest_first_filtered_and_limited);
async fn events_read_back_newest_first_filtered_and_limited(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    for i in 1..=3 {
        ing.post(&key.token, &batch(vec![refund(i, i)])).await;
    }
    let err = event(&event_id(4), "issue_refund", "error", json!({}));
    ing.post(&key.token, &batch(vec![err])).await;
    let all = ing.admin.events(&[("org", "acme")]).await.expect("events");
    let ids: Vec<&str> = all.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(
        ids,
        vec![
            event_id(4).as_str(),
            event_id(3).as_str(),
            event_id(2).as_str(),
            event_id(1).as_str()
        ]
    );
    let limited = ing
        .admin
        .events(&[("org", "acme"), ("limit", "2")])
        .await
        .expect("events");
    assert_eq!(limited.len(), 2);
    assert_eq!(limited[0]["id"], event_id(4).as_str());
    let errors = ing
        .admin
        .events(&[("class", "error")])
        .await
        .expect("events");
    assert_eq!(errors.len(), 1);
    let by_actor = ing
        .admin
        .events(&[("actor", "mcp:sensor"), ("action", "issue_refund")])
        .await
        .expect("events");
    assert_eq!(by_actor.len(), 4);
    let none = ing
        .admin
        .events(&[("action", "nope")])
        .await
        .expect("events");
    assert!(none.is_empty());
    for bad in [
        "/v1/events?limit=0",
        "/v1/events?limit=abc",
        "/v1/events?limit=100000",
        "/v1/events?class=other",
    ] {
        let (status, body) = ing.get(bad, &ing.admin_secret()).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    ing.stop().await;
}

both_stores!(pii_reaching_the_ingest_is_removed_before_storage);
async fn pii_reaching_the_ingest_is_removed_before_storage(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    // A sensor that skipped its own filter: the ingest re-applies L2-L4.
    let e = event(
        &event_id(1),
        "issue_refund",
        "action",
        json!({
            "amount_cents": 4900,
            "customer_email": "canary-7f3a@example.com",
            "reason": "refund for canary-7f3a@example.com",
            "note": "card 4111 1111 1111 1111",
            "password": "canary-pass-7f3a",
            "nested": { "amount": 1 },
        }),
    );
    let (status, body) = ing.post(&key.token, &batch(vec![e])).await;
    assert_eq!((status, body["accepted"].clone()), (200, json!(1)));
    let stored = ing.all_events().await;
    let text = serde_json::to_string(&stored).expect("json");
    for canary in [
        "canary-7f3a",
        "4111",
        "customer_email",
        "password",
        "nested",
    ] {
        assert!(!text.contains(canary), "{canary} was stored: {text}");
    }
    assert_eq!(stored[0]["rec"]["fields"]["amount_cents"], 4900);
    ing.stop().await;
}

both_stores!(the_sensors_dropped_counter_is_recorded_per_sensor);
async fn the_sensors_dropped_counter_is_recorded_per_sensor(store: StoreKind) {
    let ing = start(store).await;
    let a = ing.admin.mint("acme", None).await.expect("mint");
    let b = ing.admin.mint("acme", None).await.expect("mint");
    let mut one = batch(vec![refund(1, 1)]);
    one["dropped"] = json!(7);
    ing.post(&a.token, &one).await;
    let mut two = batch(vec![]);
    two["dropped"] = json!(5);
    assert_eq!(ing.post(&a.token, &two).await.0, 200);
    ing.post(&b.token, &batch(vec![refund(2, 1)])).await;
    let sensors = ing.admin.sensors().await.expect("sensors");
    let get = |id: &str| {
        sensors
            .iter()
            .find(|s| s["keyId"] == id)
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(get(&a.key_id)["dropped"], 12);
    assert_eq!(get(&a.key_id)["batches"], 2);
    assert_eq!(get(&a.key_id)["accepted"], 1);
    assert_eq!(get(&a.key_id)["transport"], "stdio");
    assert!(get(&a.key_id)["lastSeen"].is_string());
    assert_eq!(get(&b.key_id)["dropped"], 0);
    ing.stop().await;
}

both_stores!(admin_input_mistakes_are_4xx);
async fn admin_input_mistakes_are_4xx(store: StoreKind) {
    let ing = start(store).await;
    let secret = ing.admin_secret();
    for body in [
        "not json",
        "{}",
        r#"{"org": ""}"#,
        r#"{"org": 5}"#,
        r#"{"org": "a\u0000b"}"#,
        r#"{"org": "acme", "name": 7}"#,
    ] {
        let resp = ing
            .http
            .post(format!("{}/v1/admin/keys", ing.base))
            .bearer_auth(&secret)
            .body(body)
            .send()
            .await
            .expect("request");
        assert_eq!(resp.status().as_u16(), 400, "{body}");
    }
    let long_org = "o".repeat(200);
    assert_eq!(
        ing.admin
            .mint(&long_org, None)
            .await
            .err()
            .and_then(|e| e.status()),
        Some(400)
    );
    let (status, body) = ing.get("/v1/nothing", &secret).await;
    assert_eq!(status, 404, "{body}");
    ing.stop().await;
}

both_stores!(restart_keeps_events_keys_and_the_admin_secret);
async fn restart_keeps_events_keys_and_the_admin_secret(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    let revoked = ing.admin.mint("acme", None).await.expect("mint");
    assert_eq!(
        ing.post(&key.token, &batch(vec![refund(1, 4900)])).await.0,
        200
    );
    ing.admin.revoke(&revoked.key_id).await.expect("revoke");
    let secret = ing.admin_secret();
    let db = ing.stop().await;

    let ing = start_in(db).await;
    assert_eq!(ing.admin_secret(), secret);
    let events = ing.all_events().await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["rec"]["fields"]["amount_cents"], 4900);
    // Tokens minted before the restart still verify; the revoked one stays revoked.
    let (status, body) = ing.post(&key.token, &batch(vec![refund(2, 1)])).await;
    assert_eq!((status, body["accepted"].clone()), (200, json!(1)));
    assert_eq!(
        ing.post(&revoked.token, &batch(vec![refund(3, 1)])).await.0,
        401
    );
    ing.stop().await;
}

// ---- the real binary ----

struct Served {
    child: Child,
    base: String,
    /// The stderr reader keeps draining into this, so the child never blocks on a full pipe.
    _stderr: mpsc::Receiver<String>,
}

/// Starts `bounded-ingest serve` on an ephemeral port and waits for its `listening` line.
fn serve(db: &Path) -> Served {
    let mut child = ingest_command()
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(db)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bounded-ingest");
    let rx = stderr_lines(&mut child);
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                if let Some(i) = line.find("listening http://") {
                    let base = line[i + "listening ".len()..].trim().to_string();
                    return Served {
                        child,
                        base,
                        _stderr: rx,
                    };
                }
                seen.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("bounded-ingest did not report its address; stderr: {seen:?}");
}

impl Served {
    /// SIGTERM, then the exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + IO_TIMEOUT;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let st = self.child.wait().expect("wait");
                panic!("bounded-ingest ignored SIGTERM ({st:?})");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn cli(args: &[&str], db: &Path, base: &str) -> std::process::Output {
    Command::new(INGEST_BIN)
        .args(args)
        .args(["--ingest", base, "--db"])
        .arg(db)
        .env_remove("BOUNDED_INGEST_ADMIN_SECRET")
        .env_remove("BOUNDED_INGEST_BASE")
        .output()
        .expect("run bounded-ingest")
}

#[test]
fn binary_serves_mints_revokes_and_keeps_evidence_across_a_restart() {
    install_tls_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    // A data directory that does not exist yet is created.
    let db = dir.path().join("data").join("evidence.db");
    let served = serve(&db);
    assert!(db.exists(), "database created on first start");
    let secret_file = ingest::keys::admin_secret_path(&db);
    let secret =
        std::fs::read_to_string(&secret_file).expect("admin secret generated beside the db");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&secret_file)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "admin secret file is owner-only");
    }

    // mint through the CLI, reading the admin secret from the file beside the database.
    let out = cli(
        &["mint", "--org", "acme", "--name", "ci"],
        &db,
        &served.base,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout)
        .expect("utf8")
        .trim()
        .to_string();
    assert!(token.starts_with("obs1.k_"), "{token}");
    let key_id = token.split('.').nth(1).expect("key id").to_string();

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let post = |base: &str, id: u64| {
        rt.block_on(async {
            let http = reqwest::Client::new();
            let resp = http
                .post(format!("{base}/v1/events"))
                .bearer_auth(&token)
                .body(serde_json::to_vec(&batch(vec![refund(id, 4900)])).expect("json"))
                .send()
                .await
                .expect("post");
            resp.status().as_u16()
        })
    };
    assert_eq!(post(&served.base, 1), 200);

    let out = cli(&["revoke", &key_id], &db, &served.base);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(post(&served.base, 2), 401);

    // A wrong admin secret: exit 1 with the ingest's answer, no token printed.
    let out = Command::new(INGEST_BIN)
        .args(["mint", "--org", "acme", "--ingest", &served.base])
        .env("BOUNDED_INGEST_ADMIN_SECRET", "wrong-secret-0123456789")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));

    let status = served.stop();
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");

    let served = serve(&db);
    let admin_secret = std::fs::read_to_string(&secret_file).expect("secret");
    assert_eq!(admin_secret, secret, "admin secret kept across restarts");
    let events = rt.block_on(async {
        AdminClient::new(&served.base, admin_secret.trim())
            .expect("client")
            .events(&[("org", "acme")])
            .await
            .expect("events")
    });
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["id"], event_id(1).as_str());
    assert_eq!(post(&served.base, 3), 401, "revocation survives a restart");
    assert!(served.stop().success());
}

#[test]
fn usage_errors_exit_2() {
    let out = Command::new(INGEST_BIN)
        .args(["mint"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(INGEST_BIN)
        .args(["serve", "--listen", "not-an-address"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
}

both_stores!(accepted_events_survive_a_sigkill_of_the_ingest);
async fn accepted_events_survive_a_sigkill_of_the_ingest(store: StoreKind) {
    install_tls_provider();
    let db = TestDb::new(store);
    let mut served = ServedOn::start(db.serve_command());
    let secret = match store {
        StoreKind::Sqlite => {
            std::fs::read_to_string(ingest::keys::admin_secret_path(&db.sqlite_path()))
        }
        StoreKind::Postgres => std::fs::read_to_string(db.admin_secret_file()),
    }
    .expect("secret");
    let admin = AdminClient::new(&served.base, secret.trim()).expect("client");
    let key = admin.mint("acme", None).await.expect("mint");
    let http = reqwest::Client::new();
    let mut answers = Vec::new();
    for b in 0..5u64 {
        let events = (0..100).map(|i| refund(b * 1000 + i + 1, 1)).collect();
        let resp = http
            .post(format!("{}/v1/events", served.base))
            .bearer_auth(&key.token)
            .body(serde_json::to_vec(&batch(events)).expect("json"))
            .send()
            .await
            .expect("post");
        assert_eq!(resp.status().as_u16(), 200);
        answers.push(resp.json::<Value>().await.expect("json"));
    }
    let accepted: u64 = answers.iter().filter_map(|a| a["accepted"].as_u64()).sum();
    assert_eq!(accepted, 500);
    // No graceful shutdown: the process dies with whatever it had not written.
    served.kill();

    let mut served = ServedOn::start(db.serve_command());
    let admin = AdminClient::new(&served.base, secret.trim()).expect("client");
    let events = admin
        .events(&[("org", "acme"), ("limit", "1000")])
        .await
        .expect("events");
    let status = http
        .post(format!("{}/v1/events", served.base))
        .bearer_auth(&key.token)
        .body(serde_json::to_vec(&batch(vec![refund(9_999_999, 1)])).expect("json"))
        .send()
        .await
        .expect("post")
        .status()
        .as_u16();
    assert_eq!(events.len(), 500, "every acknowledged event is stored");
    assert_eq!(status, 200, "the token minted before the crash still works");
    assert!(served.stop().success());
}

// ---- Issue 14: one key holder must not break or starve the ingest ----

both_stores!(dropped_past_a_billion_is_400_and_the_sensors_view_keeps_answering);
async fn dropped_past_a_billion_is_400_and_the_sensors_view_keeps_answering(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    // Two batches of u64::MAX used to turn the SQLite counter into a REAL, and every later
    // sensors view into a 503.
    for _ in 0..2 {
        let mut b = batch(vec![]);
        b["dropped"] = json!(u64::MAX);
        let (status, body) = ing.post(&key.token, &b).await;
        assert_eq!(status, 400, "{body}");
        assert!(body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("dropped"));
    }
    let (status, body) = ing.get("/v1/admin/sensors", &ing.admin_secret()).await;
    assert_eq!(status, 200, "{body}");
    // The largest allowed value still adds up, as an integer.
    for _ in 0..2 {
        let mut b = batch(vec![]);
        b["dropped"] = json!(1_000_000_000u64);
        assert_eq!(ing.post(&key.token, &b).await.0, 200);
    }
    let (status, body) = ing.get("/v1/admin/sensors", &ing.admin_secret()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["sensors"][0]["dropped"], 2_000_000_000u64);
    ing.stop().await;
}

/// Opens a connection that sends a batch's head and the first bytes of a 1000-byte body, then
/// nothing more.
async fn slow_body(addr: std::net::SocketAddr, token: &str) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"v\":2"
    );
    s.write_all(head.as_bytes()).await.expect("write");
    s
}

/// The answer's head on `s`, or "" if none came within `within`.
async fn answer_head(s: &mut tokio::net::TcpStream, within: Duration) -> String {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let _ = tokio::time::timeout(within, async {
        loop {
            match s.read(&mut tmp).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.extend_from_slice(&tmp[..n]);
                    if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&buf).to_ascii_lowercase()
}

both_stores!(slow_bodies_of_one_key_do_not_starve_another_key);
async fn slow_bodies_of_one_key_do_not_starve_another_key(store: StoreKind) {
    let ing = start(store).await;
    let a = ing.admin.mint("acme", Some("a")).await.expect("mint");
    let b = ing.admin.mint("acme", Some("b")).await.expect("mint");
    let addr = ing.running.as_ref().expect("running").addr();
    let mut slow = Vec::new();
    for _ in 0..20 {
        slow.push(slow_body(addr, &a.token).await);
    }
    // Let the server take them all in before B posts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = std::time::Instant::now();
    let answered = tokio::time::timeout(
        Duration::from_secs(10),
        ing.post(&b.token, &batch(vec![refund(1, 1)])),
    )
    .await;
    let took = t.elapsed();
    // The target is 1 s; the margin is for a loaded machine (before the fix: ~30 s).
    let (status, body) = answered.expect("B answered while A's bodies trickle");
    assert_eq!(status, 200, "{body}");
    assert!(took < Duration::from_secs(5), "B waited {took:?}");

    // A's batches past its per-key limit were told to come back later, not held. Read all
    // at once: the refused answer within about a second, the admitted ones not at all.
    let heads = futures_util::future::join_all(
        slow.iter_mut()
            .map(|s| answer_head(s, Duration::from_secs(5))),
    )
    .await;
    let mut refused = 0;
    for head in heads {
        if head.starts_with("http/1.1 429") {
            assert!(head.contains("retry-after: 1"), "{head}");
            refused += 1;
        }
    }
    assert!(
        refused >= 20 - ingest::DEFAULT_MAX_BATCHES_PER_KEY,
        "{refused} refused"
    );

    // And an operator sees it.
    let sensors = ing.admin.sensors().await.expect("sensors");
    let of = |id: &str| {
        sensors
            .iter()
            .find(|s| s["keyId"] == id)
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(
        of(&a.key_id)["refused"]["rate"],
        json!(refused),
        "{sensors:?}"
    );
    assert_eq!(of(&a.key_id)["refused"]["slots"], 0);
    assert_eq!(of(&b.key_id)["refused"], json!({ "rate": 0, "slots": 0 }));
    assert_eq!(of(&b.key_id)["accepted"], 1);
    drop(slow);
    ing.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_header_is_closed_within_twelve_seconds() {
    let ing = start(StoreKind::Sqlite).await;
    let addr = ing.running.as_ref().expect("running").addr();
    let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = s.into_split();
    let t = std::time::Instant::now();
    // Slowloris: a byte a second, never the blank line that ends the head.
    let trickle = tokio::spawn(async move {
        for b in b"POST /v1/events HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaa" {
            if wr.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        wr
    });
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(12), async {
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    let took = t.elapsed();
    assert!(closed.is_ok(), "connection still open after {took:?}");
    assert!(
        took >= Duration::from_secs(9),
        "closed early, after {took:?}"
    );
    trickle.abort();
    // Still serving.
    let resp = ing.http.get(format!("{}/healthz", ing.base)).send().await;
    assert_eq!(resp.expect("healthz").status().as_u16(), 200);
    ing.stop().await;
}

/// Sends `GET /healthz` on an open connection and returns the status line ("" if none).
async fn healthz_on(s: &mut tokio::net::TcpStream) -> String {
    if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .is_err()
    {
        return String::new();
    }
    let mut buf = Vec::new();
    let mut tmp = [0u8; 1024];
    let _ = tokio::time::timeout(IO_TIMEOUT, async {
        loop {
            match s.read(&mut tmp).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.extend_from_slice(&tmp[..n]);
                    // The body is `{"status":"ok"}`.
                    if buf.ends_with(b"}") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&buf)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Whether the server closes `s` within `within` (EOF or reset), sending nothing.
async fn closes_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let mut tmp = [0u8; 64];
    matches!(
        tokio::time::timeout(within, s.read(&mut tmp)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_the_cap_is_closed_and_the_others_keep_working() {
    install_tls_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = IngestConfig::ephemeral(db_in(dir.path()));
    cfg.limits.max_connections = 2;
    let running = ingest::start(cfg).await.expect("start");
    let addr = running.addr();
    let mut c1 = tokio::net::TcpStream::connect(addr).await.expect("c1");
    let mut c2 = tokio::net::TcpStream::connect(addr).await.expect("c2");
    assert!(healthz_on(&mut c1).await.contains("200"));
    assert!(healthz_on(&mut c2).await.contains("200"));
    let mut c3 = tokio::net::TcpStream::connect(addr).await.expect("c3");
    assert!(
        closes_within(&mut c3, Duration::from_secs(10)).await,
        "a third connection was kept"
    );
    // The two within the cap still work.
    assert!(healthz_on(&mut c1).await.contains("200"));
    assert!(healthz_on(&mut c2).await.contains("200"));
    // Once one closes, a new connection is served again.
    drop(c1);
    let served = tokio::time::timeout(IO_TIMEOUT, async {
        loop {
            let mut c = tokio::net::TcpStream::connect(addr).await.expect("c4");
            if healthz_on(&mut c).await.contains("200") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "no connection served after one closed");
    running.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_after_the_idle_timeout_not_the_header_timeout() {
    install_tls_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = IngestConfig::ephemeral(db_in(dir.path()));
    cfg.limits.header_read_timeout = Duration::from_secs(1);
    cfg.limits.idle_timeout = Duration::from_secs(4);
    let running = ingest::start(cfg).await.expect("start");
    let mut c = tokio::net::TcpStream::connect(running.addr())
        .await
        .expect("connect");
    assert!(healthz_on(&mut c).await.contains("200"));
    // Idle for twice the header timeout: kept alive, and reused.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(healthz_on(&mut c).await.contains("200"));
    let t = std::time::Instant::now();
    assert!(
        closes_within(&mut c, Duration::from_secs(12)).await,
        "idle connection kept past the idle timeout"
    );
    assert!(
        t.elapsed() >= Duration::from_secs(3),
        "closed after {:?}",
        t.elapsed()
    );
    running.shutdown().await.expect("shutdown");
}

both_stores!(events_are_counted_while_reading_and_oversized_events_are_rejected_alone);
async fn events_are_counted_while_reading_and_oversized_events_are_rejected_alone(
    store: StoreKind,
) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    let auth = format!("Bearer {}", key.token);
    // 501 events then bytes that are not JSON: counting stops at the 501st, before them.
    let mut body = br#"{"v":2,"dropped":0,"events":["#.to_vec();
    for i in 0..501u64 {
        body.extend_from_slice(&serde_json::to_vec(&refund(i + 1, 1)).expect("json"));
        body.push(b',');
    }
    body.extend_from_slice(b"this is not json");
    let (status, v) = ing.post_raw(Some(&auth), body).await;
    assert_eq!(status, 413, "{v}");
    assert!(
        v["error"].as_str().unwrap_or_default().contains("500"),
        "{v}"
    );

    // An event past the per-event size is rejected alone, never parsed; the others land.
    let mut big = refund(2, 1);
    big["padding"] = json!("x".repeat(ingest::batch::MAX_EVENT_BYTES));
    let (status, v) = ing.post(&key.token, &batch(vec![refund(1, 1), big])).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v, json!({ "accepted": 1, "rejected": 1, "duplicates": 0 }));
    ing.stop().await;
}

both_stores!(encoding_faults_refuse_the_body_or_the_event_they_sit_in);
/// Found by fuzzing the streaming batch reader. Invalid UTF-8 in a field it skips still makes
/// the body malformed (400), as it was when the whole body was parsed; a lone surrogate escape,
/// grammatical JSON that a full parse refuses, inside one event gets that event rejected alone.
async fn encoding_faults_refuse_the_body_or_the_event_they_sit_in(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    let auth = format!("Bearer {}", key.token);
    let good = serde_json::to_string(&refund(1, 1)).expect("json");
    let body = format!(r#"{{"v":2,"org":"eXXvil","events":[{good}]}}"#)
        .into_bytes()
        .into_iter()
        .map(|b| if b == b'X' { 0xff } else { b })
        .collect::<Vec<u8>>();
    let (status, v) = ing.post_raw(Some(&auth), body).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"].as_str().unwrap_or_default().contains("UTF-8"),
        "{v}"
    );

    let mut odd = serde_json::to_string(&refund(2, 1)).expect("json");
    odd.insert_str(1, r#""\ud800":1,"#);
    let body = format!(r#"{{"v":2,"events":[{good},{odd}]}}"#);
    let (status, v) = ing.post_raw(Some(&auth), body.into_bytes()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v, json!({ "accepted": 1, "rejected": 1, "duplicates": 0 }));
    ing.stop().await;
}

/// Peak resident set (`VmHWM`) of a process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn a_four_megabyte_array_of_zeros_is_never_built_as_a_tree() {
    install_tls_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = db_in(dir.path());
    let served = serve(&db);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let secret = std::fs::read_to_string(ingest::keys::admin_secret_path(&db)).expect("secret");
    let admin = AdminClient::new(&served.base, secret.trim()).expect("admin");
    let key = rt.block_on(admin.mint("acme", None)).expect("mint");
    let before = peak_rss_kib(served.child.id());
    // `[0,0,…]` just under the 4 MiB limit: two million elements, once a 64+ MiB `Value` tree.
    let mut body = br#"{"v":2,"dropped":0,"events":[0"#.to_vec();
    while body.len() < 4 * 1024 * 1024 - 16 {
        body.extend_from_slice(b",0");
    }
    body.extend_from_slice(b"]}");
    let status = rt.block_on(async {
        reqwest::Client::new()
            .post(format!("{}/v1/events", served.base))
            .bearer_auth(&key.token)
            .body(body)
            .send()
            .await
            .expect("post")
            .status()
            .as_u16()
    });
    assert_eq!(status, 413);
    let grew_mib = peak_rss_kib(served.child.id()).saturating_sub(before) / 1024;
    // The body itself, read and copied: ~8 MiB; a tree of it: 60+ MiB.
    assert!(grew_mib < 32, "peak RSS grew by {grew_mib} MiB");
    served.stop();
}

/// Values L4 removes, as a sensor that skipped its own filter might post them: phones in US,
/// UK, German, French and E.164 forms, an SSN, public IPv4 and IPv6 addresses, IBANs from
/// outside Germany, a date of birth and a passport number next to their words, an e-mail
/// address and a card number. The second item is what must never be stored.
const L4_CANARIES: &[(&str, &str)] = &[
    ("call +1 (415) 555-0142", "555-0142"),
    ("ring 020 7946 0958", "7946 0958"),
    ("tel 030 98765432", "98765432"),
    ("appel 01 23 45 67 89", "45 67 89"),
    ("+14155550142", "4155550142"),
    ("SSN 078-05-1120", "078-05-1120"),
    ("from 81.2.69.160", "81.2.69.160"),
    ("from 2a00:1450:4001:82b::200e", "2a00:1450:4001:82b::200e"),
    ("GB82WEST12345698765432", "GB82WEST12345698765432"),
    ("FR14 2004 1010 0505 0001 3M02 606", "3M02 606"),
    ("dob:1984-03-07", "1984-03-07"),
    ("passport C01X00T47", "C01X00T47"),
    ("jane.canary@example.com", "jane.canary"),
    ("4111 1111 1111 1111", "4111 1111"),
];

/// Every metadata string the ingest stores (besides `rec.fields`), as a path into the event.
const STORED_STRINGS: &[&[&str]] = &[
    &["rec", "action"],
    &["dest", "host"],
    &["dest", "pathTemplate"],
    &["actor", "id"],
    &["onBehalfOf"],
    &["session", "id"],
    &["session", "client"],
    &["session", "protocol"],
];

both_stores!(pii_in_any_metadata_string_gets_the_event_rejected_and_counted);
async fn pii_in_any_metadata_string_gets_the_event_rejected_and_counted(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    let mut events = vec![refund(0, 4900)];
    let mut n = 1;
    for (value, _) in L4_CANARIES {
        for path in STORED_STRINGS {
            let mut e = refund(n, 1);
            n += 1;
            e["session"] = json!({ "id": "s1", "client": "c", "protocol": "2025-06-18" });
            let mut slot = &mut e;
            for k in *path {
                slot = &mut slot[*k];
            }
            *slot = if *path == ["dest", "pathTemplate"] {
                json!(format!("/{value}"))
            } else {
                json!(value)
            };
            events.push(e);
        }
    }
    // err.code is a number: a card number is what its digits can hold.
    let mut e = event(&event_id(n), "issue_refund", "error", json!({}));
    e["err"] = json!({ "kind": "jsonrpc", "code": 4111111111111111i64 });
    events.push(e);
    let total = events.len() as u64;
    let (status, body) = ing.post(&key.token, &batch(events)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({ "accepted": 1, "rejected": total - 1, "duplicates": 0 })
    );
    let text = serde_json::to_string(&ing.all_events().await).expect("json");
    for (_, needle) in L4_CANARIES {
        assert!(!text.contains(needle), "{needle} was stored: {text}");
    }
    assert!(!text.contains("4111111111111111"), "{text}");
    ing.stop().await;
}

both_stores!(pii_in_the_sensor_version_or_transport_rejects_the_batch_s_events);
async fn pii_in_the_sensor_version_or_transport_rejects_the_batch_s_events(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    for (i, (value, needle)) in L4_CANARIES.iter().enumerate() {
        for field in ["version", "transport"] {
            let mut b = batch(vec![refund(
                2 * i as u64 + u64::from(field == "version"),
                1,
            )]);
            b["sensor"][field] = json!(value);
            let (status, body) = ing.post(&key.token, &b).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["rejected"], 1, "{value} in sensor.{field}: {body}");
            let sensors =
                serde_json::to_string(&ing.admin.sensors().await.expect("sensors")).expect("json");
            assert!(!sensors.contains(needle), "{needle} recorded: {sensors}");
        }
    }
    assert!(ing.all_events().await.is_empty());
    ing.stop().await;
}

both_stores!(pii_in_captured_fields_is_removed_and_codes_are_kept);
async fn pii_in_captured_fields_is_removed_and_codes_are_kept(store: StoreKind) {
    let ing = start(store).await;
    let key = ing.admin.mint("acme", None).await.expect("mint");
    let mut fields = serde_json::Map::new();
    for (i, (value, _)) in L4_CANARIES.iter().enumerate() {
        fields.insert(format!("reason{i}"), json!(value));
    }
    fields.insert("amount_cents".into(), json!(4900));
    fields.insert("currency".into(), json!("EUR"));
    fields.insert("reason".into(), json!("requested_by_customer"));
    fields.insert("order".into(), json!("ord_12345678"));
    fields.insert("shipped".into(), json!("2026-11-29"));
    let e = event(
        &event_id(1),
        "issue_refund",
        "action",
        Value::Object(fields),
    );
    let (status, body) = ing.post(&key.token, &batch(vec![e])).await;
    assert_eq!((status, body["accepted"].clone()), (200, json!(1)));
    let stored = ing.all_events().await;
    let text = serde_json::to_string(&stored).expect("json");
    for (_, needle) in L4_CANARIES {
        assert!(!text.contains(needle), "{needle} was stored: {text}");
    }
    assert_eq!(
        stored[0]["rec"]["fields"],
        json!({ "amount_cents": 4900, "currency": "EUR", "reason": "requested_by_customer",
                "order": "ord_12345678", "shipped": "2026-11-29" })
    );
    ing.stop().await;
}
