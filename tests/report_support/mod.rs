//! A real loopback ingest for reporter tests: an HTTP/1.1 server on 127.0.0.1:0 that records
//! every request and connection, and can be scripted to fail: answer a status for the next N
//! requests, answer a status always (either with a `Retry-After`), or black-hole (accept TCP,
//! never read or answer). It notes when each request arrived.
//! Also: synthetic events, the batch schema validator, and bounded waiting.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bounded_observe_mcp::event::{
    new_event_id, rfc3339_ms, Actor, ByteSizes, Dest, Event, EventClass, Rec,
};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Map, Value};
use tokio::net::{TcpListener, TcpStream};

/// How a connection or request is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Status(u16),
    /// A status with a `Retry-After` header of this value.
    Throttle(u16, &'static str),
    /// Accept the TCP connection, never read from it, never answer, never close it.
    BlackHole,
}

/// One request the ingest received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub body: Vec<u8>,
    /// The status this server answered.
    pub status: u16,
    /// When its body had been read (before it was answered).
    pub at: Instant,
}

impl Received {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("body is JSON")
    }
    pub fn event_ids(&self) -> Vec<String> {
        self.json()["events"]
            .as_array()
            .expect("events array")
            .iter()
            .map(|e| e["id"].as_str().expect("id").to_string())
            .collect()
    }
    pub fn dropped(&self) -> u64 {
        self.json()["dropped"].as_u64().expect("dropped")
    }
}

#[derive(Default)]
struct State {
    /// Replies for the next requests, in order; then `default`.
    plan: Mutex<VecDeque<Reply>>,
    default: Mutex<Option<Reply>>,
    requests: Mutex<Vec<Received>>,
    connections: AtomicUsize,
    /// Black-holed sockets are kept here so they stay open.
    held: Mutex<Vec<TcpStream>>,
}

pub struct TestIngest {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl TestIngest {
    /// A healthy ingest (200) on a fresh loopback port.
    pub async fn start() -> TestIngest {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::on(listener)
    }

    /// Serves on an existing listener (to come back on a port that refused before).
    pub fn on(listener: TcpListener) -> TestIngest {
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(State::default());
        *state.default.lock().unwrap() = Some(Reply::Status(200));
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                st.connections.fetch_add(1, Ordering::SeqCst);
                let mode = st.default.lock().unwrap().unwrap_or(Reply::Status(200));
                if mode == Reply::BlackHole {
                    st.held.lock().unwrap().push(stream);
                    continue;
                }
                let st = st.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let st = st.clone();
                        async move { Ok::<_, hyper::Error>(answer(&st, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        TestIngest { addr, state, task }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
    /// The next `statuses.len()` requests get these statuses, in order.
    pub fn fail_next(&self, statuses: &[u16]) {
        let replies = statuses.iter().map(|&s| Reply::Status(s));
        self.state.plan.lock().unwrap().extend(replies);
    }
    /// The next `replies.len()` requests get these replies, in order.
    pub fn reply_next(&self, replies: &[Reply]) {
        self.state.plan.lock().unwrap().extend(replies);
    }
    /// From now on, every request gets `reply` (a black hole applies to new connections).
    pub fn always(&self, reply: Reply) {
        *self.state.default.lock().unwrap() = Some(reply);
    }
    pub fn requests(&self) -> Vec<Received> {
        self.state.requests.lock().unwrap().clone()
    }
    pub fn request_count(&self) -> usize {
        self.state.requests.lock().unwrap().len()
    }
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }
    /// Bodies of requests that were answered 2xx.
    pub fn accepted(&self) -> Vec<Received> {
        self.requests()
            .into_iter()
            .filter(|r| (200..300).contains(&r.status))
            .collect()
    }
    /// Every byte of every request body, concatenated (for canary searches).
    pub fn all_body_bytes(&self) -> Vec<u8> {
        self.requests().into_iter().flat_map(|r| r.body).collect()
    }
}

impl Drop for TestIngest {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(st: &State, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let h = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    let (method, path) = (req.method().to_string(), req.uri().path().to_string());
    let (authorization, content_type, content_encoding) =
        (h("authorization"), h("content-type"), h("content-encoding"));
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let at = Instant::now();
    let planned = st.plan.lock().unwrap().pop_front();
    let reply = planned.unwrap_or_else(|| st.default.lock().unwrap().unwrap_or(Reply::Status(200)));
    let (status, retry_after) = match reply {
        Reply::Status(s) => (s, None),
        Reply::Throttle(s, after) => (s, Some(after)),
        Reply::BlackHole => (200, None),
    };
    let n = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["events"].as_array().map(Vec::len))
        .unwrap_or(0);
    st.requests.lock().unwrap().push(Received {
        method,
        path,
        authorization,
        content_type,
        content_encoding,
        body,
        status,
        at,
    });
    let answer = json!({"accepted": n, "rejected": 0, "duplicates": 0}).to_string();
    let mut resp = Response::builder()
        .status(status)
        .header("content-type", "application/json");
    if let Some(after) = retry_after {
        resp = resp.header("retry-after", after);
    }
    resp.body(Full::new(Bytes::from(answer))).expect("response")
}

/// A port nothing listens on: bound, then released.
pub fn closed_port() -> std::net::TcpListener {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind")
}

/// Polls `cond` every 20 ms for at most `limit`; true if it held.
pub async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

/// A valid, synthetic `tools/call` event with one allowed captured field.
pub fn event(tool: &str) -> Event {
    let mut fields = Map::new();
    fields.insert("amount_cents".into(), json!(4900));
    Event {
        v: 2,
        id: new_event_id(),
        ts: rfc3339_ms(std::time::SystemTime::now()).into(),
        class: EventClass::Action,
        rec: Rec {
            rail: "mcp".into(),
            action: tool.into(),
            registry_version: Some("a1b2c3d4e5f60718".into()),
            fields: Some(fields.into()),
            tool_def: None,
            listed: None,
            hints: Vec::new(),
            change: None,
            prev_tool_def: None,
        },
        dest: Dest {
            host: "mcp://payments".into(),
            path_template: format!("/{tool}").into(),
            method: "POST".into(),
        },
        actor: Actor {
            id: "mcp:k1".into(),
            kind: "agent".into(),
            grade: "attested".into(),
        },
        on_behalf_of: None,
        status: 200,
        dur_ms: 1.25,
        bytes: ByteSizes { req: 120, resp: 80 },
        session: None,
        err: None,
    }
}

/// The batch schema with the event schema registered for its `$ref`.
pub fn batch_validator() -> jsonschema::Validator {
    use bounded_observe_mcp::event::filter::{BATCH_SCHEMA_JSON, EVENT_SCHEMA_JSON};
    let event: Value = serde_json::from_str(EVENT_SCHEMA_JSON).expect("event schema");
    let batch: Value = serde_json::from_str(BATCH_SCHEMA_JSON).expect("batch schema");
    let id = event["$id"].as_str().expect("event $id").to_string();
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

/// True if any object anywhere in `v` has a key named `key`.
pub fn has_key(v: &Value, key: &str) -> bool {
    match v {
        Value::Object(m) => m.contains_key(key) || m.values().any(|x| has_key(x, key)),
        Value::Array(a) => a.iter().any(|x| has_key(x, key)),
        _ => false,
    }
}
