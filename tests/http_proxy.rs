//! The HTTP proxy (`--http --upstream URL`) against real upstreams on loopback: the rmcp
//! Streamable HTTP server (both eras, with and without sessions) driven by the rmcp client, and
//! a raw fixture for delayed SSE, hanging streams, 25 MB bodies, gzip, 202s and header echo.
//! Each test starts its own fixture and proxy and reaps both.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

/// Generous: the machine is small and shared.
const START_TIMEOUT: Duration = Duration::from_secs(30);
const IO_TIMEOUT: Duration = Duration::from_secs(60);

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_bounded-observe-mcp")
}

fn example(name: &str) -> PathBuf {
    Path::new(bin())
        .parent()
        .expect("bin dir")
        .join("examples")
        .join(name)
}

/// A fixture upstream; killed and reaped on drop (it also exits when its stdin closes).
struct Fixture {
    child: Child,
    _stdin: ChildStdin,
    url: String,
}

impl Fixture {
    fn start(mode: &str) -> Fixture {
        let mut child = Command::new(example("http_fixture_server"))
            .arg(mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn fixture (built by cargo test as an example)");
        let stdin = child.stdin.take().expect("stdin");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("fixture prints its URL");
        let url = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("unexpected fixture line {line:?}"))
            .to_string();
        Fixture {
            child,
            _stdin: stdin,
            url,
        }
    }

    /// `http://127.0.0.1:<port>`
    fn origin(&self) -> String {
        self.url.trim_end_matches("/mcp").to_string()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The proxy under test; killed and reaped on drop. Its stderr is collected for assertions.
struct Proxy {
    child: Child,
    port: u16,
    stderr: Arc<Mutex<String>>,
}

impl Proxy {
    fn start(upstream: &str, env: &[(&str, &str)], extra: &[&str]) -> Proxy {
        let mut cmd = Command::new(bin());
        cmd.env_clear()
            .args(["--http", "--upstream", upstream])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn proxy");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let mut err = BufReader::new(child.stderr.take().expect("stderr"));
        let collected = stderr.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            let mut sent = false;
            while err.read_line(&mut line).unwrap_or(0) > 0 {
                if !sent {
                    if let Some(rest) =
                        line.strip_prefix("[observe-mcp] listening http://127.0.0.1:")
                    {
                        let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                        let _ = tx.send((port, line.clone()));
                        sent = true;
                    }
                }
                collected.lock().expect("lock").push_str(&line);
                line.clear();
            }
        });
        let (port, line) = rx
            .recv_timeout(START_TIMEOUT)
            .unwrap_or_else(|_| panic!("proxy never printed its listening line"));
        assert_eq!(
            line.trim_end(),
            format!("[observe-mcp] listening http://127.0.0.1:{port} → {upstream}"),
            "the listening line is exactly this shape"
        );
        Proxy {
            child,
            port: port.parse().expect("port"),
            stderr,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn signal(&mut self, sig: libc::c_int) -> i32 {
        self.send_signal(sig);
        self.wait_exit()
    }

    fn send_signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
        unsafe { libc::kill(pid, sig) };
    }

    fn wait_exit(&mut self) -> i32 {
        let deadline = Instant::now() + IO_TIMEOUT;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st.code().expect("exited, not killed");
            }
            assert!(Instant::now() < deadline, "proxy did not exit on signal");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type TestClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

async fn send(
    c: &TestClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body.into())).expect("request");
    let resp = tokio::time::timeout(IO_TIMEOUT, c.request(req))
        .await
        .expect("answered in time")
        .expect("request succeeds");
    let (parts, body) = resp.into_parts();
    let body = tokio::time::timeout(IO_TIMEOUT, body.collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

const JSON_POST: &[(&str, &str)] = &[
    ("content-type", "application/json"),
    ("accept", "application/json, text/event-stream"),
];

/// Headers as a comparable map, minus those that differ per response by nature.
fn comparable(h: &HeaderMap) -> BTreeMap<String, String> {
    h.iter()
        .filter(|(k, _)| !matches!(k.as_str(), "date" | "mcp-session-id"))
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

fn call(id: u64, tool: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": {}}})
    .to_string()
}

// ---------------------------------------------------------------- the rmcp SDK, both eras

mod rmcp_client {
    use super::*;
    use rmcp::model::{CallToolRequestParams, ClientConfig, ProtocolVersion};
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::{ClientLifecycleMode, ClientServiceExt};

    /// Runs a fixed conversation and returns what the client saw, as JSON.
    pub async fn conversation(url: &str, lifecycle: ClientLifecycleMode) -> Value {
        // reqwest is built without a default TLS provider; install the one the crate uses.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let transport = StreamableHttpClientTransport::from_uri(url.to_string());
        let client = tokio::time::timeout(
            IO_TIMEOUT,
            ClientConfig::default().serve_with_lifecycle(transport, lifecycle),
        )
        .await
        .expect("handshake in time")
        .expect("handshake succeeds");
        let mut tools: Vec<String> = client
            .list_all_tools()
            .await
            .expect("tools/list")
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        tools.sort();
        let echo = client
            .call_tool(
                CallToolRequestParams::new("echo").with_arguments(
                    json!({"text": "hello through the proxy"})
                        .as_object()
                        .cloned()
                        .expect("object"),
                ),
            )
            .await
            .expect("echo");
        let add = client
            .call_tool(
                CallToolRequestParams::new("add").with_arguments(
                    json!({"a": 40, "b": 2})
                        .as_object()
                        .cloned()
                        .expect("object"),
                ),
            )
            .await
            .expect("add");
        let missing = client
            .call_tool(CallToolRequestParams::new("no_such_tool"))
            .await
            .is_err();
        let _ = client.cancel().await;
        json!({
            "tools": tools,
            "echo": serde_json::to_value(&echo).expect("json"),
            "add": serde_json::to_value(&add).expect("json"),
            "missing_tool_is_error": missing,
        })
    }

    pub fn legacy() -> ClientLifecycleMode {
        ClientLifecycleMode::Initialize
    }

    pub fn stateless() -> ClientLifecycleMode {
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_legacy_session_client_sees_the_same_through_the_proxy() {
    let fx = Fixture::start("rmcp");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let direct = rmcp_client::conversation(&fx.url, rmcp_client::legacy()).await;
    let proxied = rmcp_client::conversation(&proxy.url("/mcp"), rmcp_client::legacy()).await;
    assert_eq!(direct["add"]["content"][0]["text"], "42");
    assert_eq!(direct, proxied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_stateless_2026_client_sees_the_same_through_the_proxy() {
    let fx = Fixture::start("rmcp");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let direct = rmcp_client::conversation(&fx.url, rmcp_client::stateless()).await;
    // The local root reaches the upstream's /mcp as well.
    let proxied = rmcp_client::conversation(&proxy.url("/"), rmcp_client::stateless()).await;
    assert_eq!(
        direct["echo"]["content"][0]["text"],
        "hello through the proxy"
    );
    assert_eq!(direct, proxied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_json_response_server_sees_the_same_through_the_proxy() {
    let fx = Fixture::start("rmcp-json");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let direct = rmcp_client::conversation(&fx.url, rmcp_client::legacy()).await;
    let proxied = rmcp_client::conversation(&proxy.url("/mcp"), rmcp_client::legacy()).await;
    assert_eq!(direct["add"]["content"][0]["text"], "42");
    assert_eq!(direct, proxied);
}

/// The legacy session lifecycle at the HTTP level: the session id from `initialize`, the GET
/// stream, and DELETE — each status and content type as the upstream gave it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_get_stream_and_delete_pass_through() {
    let fx = Fixture::start("rmcp");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let c = client();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "proxy-test", "version": "1"}}})
    .to_string();
    let a = send(&c, Method::POST, &proxy.url("/mcp"), JSON_POST, init).await;
    assert_eq!(a.status, StatusCode::OK);
    let sid = a
        .headers
        .get("mcp-session-id")
        .expect("the upstream's session id reaches the client")
        .to_str()
        .expect("ascii")
        .to_string();
    assert!(String::from_utf8_lossy(&a.body).contains("serverInfo"));

    let with_sid: Vec<(&str, &str)> = JSON_POST
        .iter()
        .copied()
        .chain([
            ("mcp-session-id", sid.as_str()),
            ("mcp-protocol-version", "2025-11-25"),
        ])
        .collect();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
    let a = send(&c, Method::POST, &proxy.url("/mcp"), &with_sid, initialized).await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
    assert!(a.body.is_empty());

    // The GET stream opens and stays open: read its head only.
    let get = Request::get(proxy.url("/mcp"))
        .header("accept", "text/event-stream")
        .header("mcp-session-id", sid.as_str())
        .header("mcp-protocol-version", "2025-11-25")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let stream = tokio::time::timeout(IO_TIMEOUT, c.request(get))
        .await
        .expect("GET in time")
        .expect("GET");
    assert_eq!(stream.status(), StatusCode::OK);
    assert_eq!(
        stream.headers().get("content-type").map(|v| v.as_bytes()),
        Some(&b"text/event-stream"[..])
    );
    assert!(
        stream.headers().get("content-length").is_none(),
        "no length invented on a stream"
    );
    drop(stream);

    let a = send(
        &c,
        Method::POST,
        &proxy.url("/mcp"),
        &with_sid,
        call(2, "add"),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);

    let a = send(&c, Method::DELETE, &proxy.url("/mcp"), &with_sid, "").await;
    assert!(a.status.is_success(), "DELETE: {}", a.status);
    // The session is gone upstream: the upstream's own answer comes back, not ours.
    let direct = send(&c, Method::POST, &fx.url, &with_sid, call(3, "add")).await;
    let proxied = send(
        &c,
        Method::POST,
        &proxy.url("/mcp"),
        &with_sid,
        call(3, "add"),
    )
    .await;
    assert_eq!(proxied.status, direct.status);
    assert_eq!(proxied.status, StatusCode::NOT_FOUND);
}

// ---------------------------------------------------------------- streaming

/// An SSE event reaches the client as soon as the upstream sends it, not with the response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_event_reaches_the_client_before_the_delayed_response() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let c = client();
    for (label, url) in [("direct", fx.url.clone()), ("proxy", proxy.url("/mcp"))] {
        let mut req = Request::post(url.as_str());
        for (k, v) in JSON_POST {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::from(call(7, "slow"))))
            .expect("request");
        let resp = tokio::time::timeout(IO_TIMEOUT, c.request(req))
            .await
            .expect("head in time")
            .expect("head");
        assert!(resp.headers().get("content-length").is_none());
        let mut body = resp.into_body();
        let mut text = String::new();
        let mut first_event_at = None;
        let mut response_at = None;
        while let Some(frame) = tokio::time::timeout(IO_TIMEOUT, body.frame())
            .await
            .expect("frame in time")
        {
            let frame = frame.expect("frame");
            if let Some(d) = frame.data_ref() {
                text.push_str(&String::from_utf8_lossy(d));
                if first_event_at.is_none() && text.contains("first event") {
                    first_event_at = Some(Instant::now());
                }
                if response_at.is_none() && text.contains("\"done\"") {
                    response_at = Some(Instant::now());
                }
            }
        }
        let first = first_event_at.expect("first event seen");
        let last = response_at.expect("response seen");
        let gap = last.duration_since(first);
        eprintln!("{label}: first SSE event arrived {gap:?} before the response");
        // The upstream pauses 1 s between the two; a buffering proxy would deliver them together.
        assert!(
            gap >= Duration::from_millis(500),
            "{label}: first event only {gap:?} before the response: buffered"
        );
    }
}

/// A client that goes away mid-stream closes the upstream request at once (in 2026-07-28 that
/// is the cancellation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_mid_stream_closes_the_upstream_stream() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let c = client();
    let mut req = Request::post(proxy.url("/mcp"));
    for (k, v) in JSON_POST {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(call(9, "hang"))))
        .expect("request");
    let resp = tokio::time::timeout(IO_TIMEOUT, c.request(req))
        .await
        .expect("head in time")
        .expect("head");
    let mut body = resp.into_body();
    let frame = tokio::time::timeout(IO_TIMEOUT, body.frame())
        .await
        .expect("first event in time")
        .expect("a frame")
        .expect("ok frame");
    assert!(String::from_utf8_lossy(frame.data_ref().expect("data")).contains("hanging"));
    let stats = send(&c, Method::GET, &format!("{}/stats", fx.origin()), &[], "").await;
    let v: Value = serde_json::from_slice(&stats.body).expect("stats");
    assert_eq!(v["closed_streams"], 0, "stream still open while read");

    drop(body);
    drop(c);
    let c = client();
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let stats = send(&c, Method::GET, &format!("{}/stats", fx.origin()), &[], "").await;
        let v: Value = serde_json::from_slice(&stats.body).expect("stats");
        if v["closed_streams"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "upstream stream still open after the client left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client that goes away mid-upload ends the upstream's request body with an error, not a
/// silently truncated success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_mid_upload_reaches_the_upstream() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let mut s = TcpStream::connect(("127.0.0.1", proxy.port)).expect("connect");
    write!(
        s,
        "POST /slow-upload HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n",
        proxy.port
    )
    .expect("head");
    s.write_all(&[b' '; 4096]).expect("part of the body");
    s.flush().expect("flush");
    std::thread::sleep(Duration::from_millis(300));
    drop(s);
    let c = client();
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let stats = send(&c, Method::GET, &format!("{}/stats", fx.origin()), &[], "").await;
        let v: Value = serde_json::from_slice(&stats.body).expect("stats");
        if v["aborted_uploads"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "upstream never saw the upload cut"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_of_25_mb_are_relayed_both_ways() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let c = client();
    let big: Vec<u8> = (0..25 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    let sum: u64 = big.iter().map(|&b| u64::from(b)).sum();
    let a = send(
        &c,
        Method::POST,
        &proxy.url("/upload"),
        &[("content-type", "application/octet-stream")],
        big,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&a.body).expect("json");
    assert_eq!(v["bytes"], 25 * 1024 * 1024);
    assert_eq!(v["sum"], sum);

    let a = send(&c, Method::GET, &proxy.url("/big"), &[], "").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body.len(), 25 * 1024 * 1024);
    assert!(a.body.iter().all(|&b| b == b'y'));

    let a = send(
        &c,
        Method::POST,
        &proxy.url("/mcp"),
        JSON_POST,
        call(5, "big"),
    )
    .await;
    let direct = send(&c, Method::POST, &fx.url, JSON_POST, call(5, "big")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.body.len() > 25 * 1024 * 1024);
    assert!(a.body == direct.body, "25 MB JSON result differs");
}

// ---------------------------------------------------------------- headers and statuses

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_headers_pass_and_hop_by_hop_headers_stop() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let c = client();
    let sent: &[(&str, &str)] = &[
        ("authorization", "Bearer canary-token"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-session-id", "sess-1"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "echo"),
        ("mcp-param-region", "eu"),
        ("last-event-id", "42"),
        ("x-custom", "kept"),
        ("connection", "x-conn-private"),
        ("x-conn-private", "dropped"),
        ("proxy-authorization", "Basic dropped"),
        ("te", "trailers"),
    ];
    let a = send(&c, Method::GET, &proxy.url("/headers"), sent, "").await;
    let direct = send(
        &c,
        Method::GET,
        &format!("{}/headers", fx.origin()),
        &[],
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "upstream status passes");
    let seen: Value = serde_json::from_slice(&a.body).expect("echo");
    for (k, v) in sent.iter().take(9) {
        assert_eq!(seen[*k], *v, "{k} reaches the upstream unchanged");
    }
    for k in ["connection", "x-conn-private", "proxy-authorization", "te"] {
        assert!(seen.get(k).is_none(), "{k} must not reach the upstream");
    }
    assert_eq!(
        seen["host"],
        fx.origin().trim_start_matches("http://"),
        "Host is the upstream's"
    );
    for k in ["x-forwarded-for", "via", "forwarded"] {
        assert!(seen.get(k).is_none(), "{k} invented");
    }
    // Response: end-to-end kept (incl. WWW-Authenticate and Mcp-Session-Id), Keep-Alive dropped.
    assert_eq!(
        a.headers["www-authenticate"],
        direct.headers["www-authenticate"]
    );
    assert_eq!(a.headers["mcp-session-id"], "sess-from-upstream");
    assert_eq!(a.headers["x-end-to-end"], "kept");
    assert!(a.headers.get("keep-alive").is_none());
    let mut d = comparable(&direct.headers);
    d.remove("keep-alive");
    d.remove("content-length");
    let mut p = comparable(&a.headers);
    p.remove("content-length");
    assert_eq!(p, d, "response headers are the upstream's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodyless_202_stays_bodyless_and_typeless() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let c = client();
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
    let direct = send(&c, Method::POST, &fx.url, JSON_POST, note.clone()).await;
    let a = send(&c, Method::POST, &proxy.url("/mcp"), JSON_POST, note).await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
    assert!(a.body.is_empty());
    assert!(
        a.headers.get("content-type").is_none(),
        "content type invented"
    );
    assert_eq!(comparable(&a.headers), comparable(&direct.headers));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_statuses_pass_through_unchanged() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let c = client();
    let unknown: Vec<(&str, &str)> = JSON_POST
        .iter()
        .copied()
        .chain([("mcp-session-id", "unknown-session")])
        .collect();
    let a = send(
        &c,
        Method::POST,
        &proxy.url("/mcp"),
        &unknown,
        call(1, "echo"),
    )
    .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "unknown session stays 404");
    let a = send(
        &c,
        Method::POST,
        &proxy.url("/mcp"),
        JSON_POST,
        call(2, "fail"),
    )
    .await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(&a.body[..], br#"{"error":"overloaded"}"#);
    let a = send(&c, Method::GET, &proxy.url("/nowhere"), &[], "").await;
    assert_eq!(
        a.status,
        StatusCode::NOT_FOUND,
        "other paths reach the upstream origin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_body_is_relayed_byte_for_byte() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let c = client();
    let gz = &[("accept-encoding", "gzip")];
    let direct = send(&c, Method::GET, &format!("{}/gzip", fx.origin()), gz, "").await;
    let a = send(&c, Method::GET, &proxy.url("/gzip"), gz, "").await;
    assert_eq!(a.headers["content-encoding"], "gzip");
    assert_eq!(&a.body[..2], &[0x1f, 0x8b], "still gzip");
    assert_eq!(a.body, direct.body);
}

// ---------------------------------------------------------------- failures and lifecycle

/// A loopback port that refuses connections while the returned socket lives: bound, never
/// listening, so no other test can take it. A port found free and let go could be bound
/// meanwhile by another test's listener that accepts and never answers (the black-hole ingest
/// of the kill-switch test), and a request to the "unreachable" upstream then hung.
fn refusing_port() -> (tokio::net::TcpSocket, u16) {
    let s = tokio::net::TcpSocket::new_v4().expect("socket");
    s.bind(([127, 0, 0, 1], 0).into()).expect("bind");
    let port = s.local_addr().expect("addr").port();
    (s, port)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_answers_502() {
    let (_refusing, port) = refusing_port();
    let upstream = format!("http://127.0.0.1:{port}/mcp");
    let proxy = Proxy::start(&upstream, &[], &[]);
    let c = client();
    let a = send(
        &c,
        Method::POST,
        &proxy.url("/mcp"),
        JSON_POST,
        call(1, "echo"),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    // The proxy stays up for the next request.
    let a = send(&c, Method::GET, &proxy.url("/mcp"), &[], "").await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    // The warning reaches the pipe after the answer: read until it is there.
    stderr_with(&proxy, "502");
}

/// With the kill switch the proxy still relays, and nothing connects to the ingest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_switch_is_a_pure_proxy_with_no_network_to_the_ingest() {
    let fx = Fixture::start("raw");
    let ingest = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    ingest.set_nonblocking(true).expect("nonblocking");
    let ingest_url = format!("http://{}", ingest.local_addr().expect("addr"));
    let dir = tempfile::tempdir().expect("tempdir");
    let env = [
        ("BOUNDED_OBSERVE_MCP_DISABLED", "1"),
        ("BOUNDED_SENSOR_TOKEN", "obs1.killswitch.c2ln"),
        ("BOUNDED_INGEST_BASE", ingest_url.as_str()),
        ("BOUNDED_FLUSH_MS", "10"),
    ];
    let mut proxy = Proxy::start(&fx.url, &env, &[]);
    let c = client();
    let a = send(
        &c,
        Method::POST,
        &proxy.url("/mcp"),
        JSON_POST,
        call(1, "echo"),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&a.body).contains("\"ok\""));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(proxy.signal(libc::SIGTERM), 128 + libc::SIGTERM);
    match ingest.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the disabled proxy connected to the ingest: {other:?}"),
    }
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_and_sigterm_shut_down_with_128_plus_signal() {
    let fx = Fixture::start("raw");
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let mut proxy = Proxy::start(
            &fx.url,
            &[
                ("BOUNDED_SHUTDOWN_FLUSH_MS", "200"),
                ("BOUNDED_DRAIN_MS", "300"),
            ],
            &[],
        );
        // A call that never ends holds the shutdown no longer than the drain deadline.
        let c = client();
        let mut req = Request::post(proxy.url("/mcp"));
        for (k, v) in JSON_POST {
            req = req.header(*k, *v);
        }
        let resp = c
            .request(
                req.body(Full::new(Bytes::from(call(9, "hang"))))
                    .expect("request"),
            )
            .await
            .expect("head");
        let started = Instant::now();
        assert_eq!(proxy.signal(sig), 128 + sig);
        assert!(started.elapsed() < Duration::from_secs(20));
        drop(resp);
    }
}

#[test]
fn unusable_port_fails_to_start_with_exit_1() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = held.local_addr().expect("addr").port().to_string();
    let out = Command::new(bin())
        .env_clear()
        .args([
            "--http",
            "--upstream",
            "http://127.0.0.1:9/mcp",
            "--port",
            &port,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let mut err = String::new();
    out.stderr
        .as_slice()
        .read_to_string(&mut err)
        .expect("utf8");
    assert!(err.contains("cannot listen"), "{err}");
}

// ---------------------------------------------------------------- observation (file sink)

/// Runs the proxy with a `file:` sink, lets `drive` talk through it, stops it with SIGTERM
/// and returns every event it wrote, the raw sink text (for canary checks) and its stderr.
async fn observed<F, Fut>(upstream: &str, drive: F) -> (Vec<Value>, String, String)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    observed_with(upstream, &[], drive).await
}

/// [`observed`] with more command-line arguments for the proxy.
async fn observed_with<F, Fut>(
    upstream: &str,
    extra: &[&str],
    drive: F,
) -> (Vec<Value>, String, String)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = dir.path().join("events.jsonl");
    let ingest = format!("file:{}", sink.display());
    let mut args = vec!["--ingest", &ingest];
    args.extend_from_slice(extra);
    let mut proxy = Proxy::start(upstream, &[("BOUNDED_FLUSH_MS", "20")], &args);
    drive(proxy.url("/mcp")).await;
    assert_eq!(proxy.signal(libc::SIGTERM), 128 + libc::SIGTERM);
    let stderr = proxy.stderr.lock().expect("lock").clone();
    let text = std::fs::read_to_string(&sink).unwrap_or_default();
    let events = text
        .lines()
        .flat_map(|l| {
            let batch: Value = serde_json::from_str(l).expect("one batch per line");
            batch["events"].as_array().cloned().unwrap_or_default()
        })
        .collect();
    (events, text, stderr)
}

fn by_action<'a>(events: &'a [Value], action: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["rec"]["action"] == action)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_through_the_proxy_become_events_in_both_eras() {
    let fx = Fixture::start("rmcp");
    let host = fx.origin().trim_start_matches("http://").to_string();
    let (events, _, _) = observed(&fx.url, |url| async move {
        rmcp_client::conversation(&url, rmcp_client::legacy()).await;
        rmcp_client::conversation(&url, rmcp_client::stateless()).await;
    })
    .await;
    let echo = by_action(&events, "echo");
    let add = by_action(&events, "add");
    assert_eq!(echo.len(), 2, "one echo per era: {events:?}");
    assert_eq!(add.len(), 2, "one add per era: {events:?}");
    for e in echo.iter().chain(add.iter()) {
        assert_eq!(e["status"], 200, "{e}");
        assert_eq!(e["class"], "action");
        assert_eq!(e["dest"]["host"], host.as_str());
    }
    // The legacy-era calls carry the session, hashed; the stateless ones have none.
    let with_session: Vec<&&Value> = echo
        .iter()
        .filter(|e| e["session"]["id"].is_string())
        .collect();
    assert_eq!(with_session.len(), 1, "{echo:?}");
    let sid = with_session[0]["session"]["id"].as_str().expect("id");
    assert_eq!(sid.len(), 16);
    assert!(sid.chars().all(|c| c.is_ascii_hexdigit()));
    let missing = by_action(&events, "no_such_tool");
    assert_eq!(missing.len(), 2);
    assert!(missing.iter().all(|e| e["class"] == "error"));
    assert!(
        by_action(&events, "tools/list").is_empty() && events.len() == 6,
        "only tools/call become events: {events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_id_is_hashed_and_never_written() {
    let fx = Fixture::start("raw");
    let (events, text, _) = observed(&fx.url, |url| async move {
        let c = client();
        let h: Vec<(&str, &str)> = JSON_POST
            .iter()
            .copied()
            .chain([("mcp-session-id", "canary-session-5d1e")])
            .collect();
        let a = send(&c, Method::POST, &url, &h, call(1, "echo")).await;
        assert_eq!(a.status, StatusCode::OK);
    })
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    let sid = events[0]["session"]["id"].as_str().expect("session id");
    assert_eq!(sid.len(), 16);
    assert!(!text.contains("canary-session"), "raw session id leaked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_reports_a_502_transport_event() {
    let (_refusing, port) = refusing_port();
    let upstream = format!("http://127.0.0.1:{port}/mcp");
    let (events, _, _) = observed(&upstream, |url| async move {
        let c = client();
        let a = send(&c, Method::POST, &url, JSON_POST, call(1, "echo")).await;
        assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    })
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["status"], 502);
    assert_eq!(events[0]["class"], "error");
    assert_eq!(events[0]["err"]["kind"], "transport");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_2xx_status_and_client_disconnect_are_the_calls_outcome() {
    let fx = Fixture::start("raw");
    let (events, _, _) = observed(&fx.url, |url| async move {
        let c = client();
        let a = send(&c, Method::POST, &url, JSON_POST, call(1, "fail")).await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
        // Read the first event of a stream that never ends, then walk away.
        let mut req = Request::post(url.as_str());
        for (k, v) in JSON_POST {
            req = req.header(*k, *v);
        }
        let resp = c
            .request(
                req.body(Full::new(Bytes::from(call(2, "hang"))))
                    .expect("request"),
            )
            .await
            .expect("head");
        let mut body = resp.into_body();
        let _ = tokio::time::timeout(IO_TIMEOUT, body.frame()).await;
        drop(body);
        tokio::time::sleep(Duration::from_millis(300)).await;
    })
    .await;
    let fail = by_action(&events, "fail");
    assert_eq!(fail.len(), 1, "{events:?}");
    assert_eq!(fail[0]["status"], 503);
    let hang = by_action(&events, "hang");
    assert_eq!(hang.len(), 1, "{events:?}");
    assert_eq!(
        hang[0]["status"], 499,
        "closing the stream cancels: {}",
        hang[0]
    );
    assert_eq!(hang[0]["err"]["kind"], "cancelled");
}

/// An `https://` upstream is spoken to over TLS: pointed at a plain-HTTP server, the handshake
/// fails and the client gets a 502 (a proxy that ignored the scheme would get the server's 200).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstream_is_reached_over_tls() {
    let fx = Fixture::start("raw");
    let tls_url = fx.url.replacen("http://", "https://", 1);
    let proxy = Proxy::start(&tls_url, &[], &[]);
    let c = client();
    let a = send(
        &c,
        Method::POST,
        &proxy.url("/mcp"),
        JSON_POST,
        call(1, "echo"),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    let direct = send(&c, Method::POST, &fx.url, JSON_POST, call(1, "echo")).await;
    assert_eq!(
        direct.status,
        StatusCode::OK,
        "the fixture itself answers over plain HTTP"
    );
}

/// A compressed MCP response is relayed as is and its call is not reported (reporting it would
/// invent a timeout); the operator is told once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_mcp_response_is_relayed_and_its_call_not_reported() {
    let fx = Fixture::start("raw");
    let (events, _, stderr) = observed(&fx.url, |url| async move {
        let c = client();
        let h: Vec<(&str, &str)> = JSON_POST
            .iter()
            .copied()
            .chain([("accept-encoding", "gzip")])
            .collect();
        let a = send(&c, Method::POST, &url, &h, call(1, "gzip")).await;
        assert_eq!(a.headers["content-encoding"], "gzip");
        assert_eq!(&a.body[..2], &[0x1f, 0x8b]);
        let a = send(&c, Method::POST, &url, JSON_POST, call(2, "echo")).await;
        assert_eq!(a.status, StatusCode::OK);
    })
    .await;
    assert_eq!(by_action(&events, "echo").len(), 1, "{events:?}");
    assert!(by_action(&events, "gzip").is_empty(), "{events:?}");
    assert_eq!(
        stderr.matches("compresses MCP responses").count(),
        1,
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_flag_and_env_choose_the_listening_port() {
    let fx = Fixture::start("raw");
    let port = free_port();
    let proxy = Proxy::start(&fx.url, &[], &["--port", &port.to_string()]);
    assert_eq!(proxy.port, port);
    let c = client();
    let a = send(
        &c,
        Method::POST,
        &proxy.url("/"),
        JSON_POST,
        call(1, "echo"),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    drop(proxy);
    let port = free_port();
    let proxy = Proxy::start(&fx.url, &[("BOUNDED_MCP_PORT", &port.to_string())], &[]);
    assert_eq!(proxy.port, port);
}

/// The value of `name=<n>` in the `--debug` exit totals on stderr.
fn debug_total(stderr: &str, name: &str) -> Option<u64> {
    let key = format!(" {name}=");
    stderr
        .lines()
        .filter(|l| l.contains("totals"))
        .find_map(|l| {
            let rest = &l[l.find(&key)? + key.len()..];
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
}

/// Short against the fixture's answers, long enough that a call left open would be reported as
/// a 504 while the test still runs.
const SHORT_CALL_TIMEOUT_MS: &str = "300";

/// Answers the proxy cannot read — no content type, another content type, compressed —
/// succeeded for the client: their calls make no event (a 504 would be a false failure) and are
/// counted as unobserved, with and without a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_response_is_unobserved_not_a_timeout() {
    let fx = Fixture::start("raw");
    let tools = ["untyped", "plain", "gzip"];
    let extra = ["--call-timeout-ms", SHORT_CALL_TIMEOUT_MS, "--debug"];
    let (events, _, stderr) = observed_with(&fx.url, &extra, |url| async move {
        let c = client();
        let in_session: Vec<(&str, &str)> = JSON_POST
            .iter()
            .copied()
            .chain([("mcp-session-id", "unreadable-session")])
            .collect();
        let mut id = 0;
        for headers in [JSON_POST, in_session.as_slice()] {
            for tool in tools {
                id += 1;
                let a = send(&c, Method::POST, &url, headers, call(id, tool)).await;
                assert_eq!(a.status, StatusCode::OK, "{tool}");
            }
        }
        let a = send(&c, Method::POST, &url, JSON_POST, call(100, "echo")).await;
        assert_eq!(a.status, StatusCode::OK);
        // Past the call timeout and the observer's once-a-second check.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
    })
    .await;
    assert!(
        events.iter().all(|e| e["status"] != 504),
        "no false timeouts: {events:?}"
    );
    assert_eq!(events.len(), 1, "only the readable call: {events:?}");
    assert_eq!(events[0]["rec"]["action"], "echo");
    assert_eq!(
        debug_total(&stderr, "unobserved"),
        Some(2 * tools.len() as u64),
        "{stderr}"
    );
}

/// A batch over the observed-body cap is relayed whole and cannot be read: its call is
/// unobserved, not a 504 when its exchange ends. A single result as large is read from its
/// ends: its call is reported, with the result's exact size. (The default call timeout:
/// relaying 33 MiB through a debug build on a shared machine takes longer than a short one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_response_is_unobserved_not_a_timeout() {
    let fx = Fixture::start("raw");
    let huge_len = Arc::new(Mutex::new(0));
    let len = huge_len.clone();
    let (events, _, stderr) = observed_with(&fx.url, &["--debug"], |url| async move {
        let c = client();
        let a = send(&c, Method::POST, &url, JSON_POST, call(1, "huge_batch")).await;
        assert_eq!(a.status, StatusCode::OK);
        assert!(a.body.len() > 33 * 1024 * 1024);
        let a = send(&c, Method::POST, &url, JSON_POST, call(2, "huge")).await;
        assert_eq!(a.status, StatusCode::OK);
        *len.lock().expect("lock") = a.body.len();
        let a = send(&c, Method::POST, &url, JSON_POST, call(3, "echo")).await;
        assert_eq!(a.status, StatusCode::OK);
    })
    .await;
    assert!(by_action(&events, "huge_batch").is_empty(), "{events:?}");
    let huge = by_action(&events, "huge");
    assert_eq!(huge.len(), 1, "{events:?}");
    assert_eq!(huge[0]["status"], 200, "{}", huge[0]);
    let len = *huge_len.lock().expect("lock");
    assert_eq!(huge[0]["bytes"]["resp"], len, "{}", huge[0]);
    assert_eq!(by_action(&events, "echo").len(), 1, "{events:?}");
    assert_eq!(debug_total(&stderr, "unobserved"), Some(1), "{stderr}");
}

/// The proxy observes what a server executes: a duplicated key keeps its last value, and a
/// request with `"id": 1.0` is answered by the server's `"id": 1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_keys_and_equal_numeric_ids_are_read_as_the_server_reads_them() {
    let fx = Fixture::start("raw");
    let extra = ["--call-timeout-ms", SHORT_CALL_TIMEOUT_MS];
    let (events, _, _) = observed_with(&fx.url, &extra, |url| async move {
        let c = client();
        let duplicated = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"decoy","arguments":{"amount_cents":1,"amount_cents":4900},"name":"issue_refund"}}"#;
        let a = send(&c, Method::POST, &url, JSON_POST, duplicated).await;
        assert_eq!(a.status, StatusCode::OK);
        let float_id = r#"{"jsonrpc":"2.0","id":2.0,"method":"tools/call","params":{"name":"float_id","arguments":{}}}"#;
        let a = send(&c, Method::POST, &url, JSON_POST, float_id).await;
        assert_eq!(a.status, StatusCode::OK);
        assert!(
            String::from_utf8_lossy(&a.body).contains(r#""id":2,"#),
            "the fixture answers as a JavaScript server would"
        );
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    })
    .await;
    assert!(by_action(&events, "decoy").is_empty(), "{events:?}");
    let refund = by_action(&events, "issue_refund");
    assert_eq!(refund.len(), 1, "{events:?}");
    assert_eq!(refund[0]["status"], 200);
    assert_eq!(refund[0]["rec"]["fields"]["amount_cents"], 4900);
    let float = by_action(&events, "float_id");
    assert_eq!(float.len(), 1, "{events:?}");
    assert_eq!(float[0]["status"], 200, "one answered call, not a 504");
    assert_eq!(events.len(), 2, "{events:?}");
}

/// `session.id` is keyed per process: the same `Mcp-Session-Id` seen by two proxies gives two
/// unrelated ids (no linking across sensors, no dictionary attack on low-entropy ids), and one
/// proxy gives it one stable id. Neither the raw id nor its plain SHA-256 is ever written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_id_is_keyed_per_process_and_stable_within_one() {
    const RAW: &str = "canary-session-5d1e";
    let fx = Fixture::start("raw");
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (events, text, _) = observed(&fx.url, |url| async move {
            let c = client();
            let h: Vec<(&str, &str)> = JSON_POST
                .iter()
                .copied()
                .chain([("mcp-session-id", RAW)])
                .collect();
            for id in 1..=2 {
                let a = send(&c, Method::POST, &url, &h, call(id, "echo")).await;
                assert_eq!(a.status, StatusCode::OK);
            }
        })
        .await;
        assert_eq!(events.len(), 2, "{events:?}");
        let sid = events[0]["session"]["id"].as_str().expect("session id");
        assert_eq!(events[1]["session"]["id"], sid, "stable within a process");
        assert_eq!(sid.len(), 16);
        let plain = ring::digest::digest(&ring::digest::SHA256, RAW.as_bytes());
        let plain_hex: String = plain.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert!(!text.contains(RAW), "raw session id leaked");
        assert!(
            !text.contains(&plain_hex[..8]),
            "the unkeyed SHA-256 of the session id leaked"
        );
        ids.push(sid.to_string());
    }
    assert_ne!(
        ids[0], ids[1],
        "two processes must not link the same session"
    );
}

// ---------------------------------------------------------------- who may use the listener

/// Sends one request on a fresh connection, exactly as written (the `Host` is the caller's),
/// and returns the status and the whole answer.
fn raw_exchange(port: u16, head: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    write!(
        s,
        "{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("read");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"));
    (status, answer)
}

/// A JSON-RPC POST to `/mcp` with the given `Host` line (none when `host` is `None`).
fn post_with_host(port: u16, version: &str, host: Option<&str>, body: &str) -> (u16, String) {
    let host = host.map_or_else(String::new, |h| format!("Host: {h}\r\n"));
    raw_exchange(
        port,
        &format!(
            "POST /mcp {version}\r\n{host}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        ),
        body,
    )
}

/// How many requests the raw fixture's `/mcp` received.
async fn upstream_requests(fx: &Fixture) -> u64 {
    let stats = send(
        &client(),
        Method::GET,
        &format!("{}/stats", fx.origin()),
        &[],
        "",
    )
    .await;
    let v: Value = serde_json::from_slice(&stats.body).expect("stats");
    v["requests"].as_u64().expect("count")
}

/// The proxy's stderr once `needle` is in it (and a moment more, for any line that follows).
fn stderr_with(proxy: &Proxy, needle: &str) -> String {
    let deadline = Instant::now() + IO_TIMEOUT;
    while !proxy.stderr.lock().expect("lock").contains(needle) {
        assert!(
            Instant::now() < deadline,
            "stderr never said {needle:?}: {}",
            proxy.stderr.lock().expect("lock")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    proxy.stderr.lock().expect("lock").clone()
}

const HOST_REFUSED: &str = "Refused a request for another Host";
const ORIGIN_REFUSED: &str = "Refused a request from a foreign Origin";

/// A page rebound to 127.0.0.1 sends its own name in `Host`: refused, and the upstream never
/// hears of it; the operator is told once, not per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebound_host_is_refused_without_reaching_upstream() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let other_port = if proxy.port == 1 { 2 } else { proxy.port - 1 };
    for host in [
        format!("attacker.example:{}", proxy.port),
        "attacker.example".to_string(),
        format!("127.0.0.1:{other_port}"),
        format!("localhost.:{}", proxy.port),
    ] {
        let (status, answer) =
            post_with_host(proxy.port, "HTTP/1.1", Some(&host), &call(1, "echo"));
        assert_eq!(status, 403, "{host}: {answer}");
        assert!(
            !answer.contains("jsonrpc"),
            "{host}: upstream answered: {answer}"
        );
    }
    assert_eq!(
        upstream_requests(&fx).await,
        0,
        "a refused request reached the upstream"
    );
    let stderr = stderr_with(&proxy, HOST_REFUSED);
    assert_eq!(stderr.matches(HOST_REFUSED).count(), 1, "{stderr}");
    assert!(stderr.contains("attacker.example"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_host_names_with_the_listener_port_are_admitted() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let hosts = [
        format!("127.0.0.1:{}", proxy.port),
        format!("localhost:{}", proxy.port),
        format!("LocalHost:{}", proxy.port),
        format!("[::1]:{}", proxy.port),
    ];
    for host in &hosts {
        let (status, answer) = post_with_host(proxy.port, "HTTP/1.1", Some(host), &call(1, "echo"));
        assert_eq!(status, 200, "{host}: {answer}");
        assert!(answer.contains("\"ok\""), "{host}: {answer}");
    }
    assert_eq!(upstream_requests(&fx).await, hosts.len() as u64);
    assert!(!proxy.stderr.lock().expect("lock").contains(HOST_REFUSED));
}

/// HTTP/1.1 requires one `Host` (RFC 9112 §3.2): without it the request is malformed (400),
/// and cannot be told apart from a rebound page's, so it never reaches the upstream. An
/// HTTP/1.0 request without `Host` is refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_without_host_is_a_bad_request() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    for version in ["HTTP/1.1", "HTTP/1.0"] {
        let (status, answer) = post_with_host(proxy.port, version, None, &call(1, "echo"));
        assert_eq!(status, 400, "{version}: {answer}");
    }
    assert_eq!(upstream_requests(&fx).await, 0);
    let stderr = stderr_with(&proxy, HOST_REFUSED);
    assert_eq!(stderr.matches(HOST_REFUSED).count(), 1, "{stderr}");
}

/// A browser names the page that sent a request in `Origin`: a foreign page is refused even
/// with a correct `Host` (the MCP transports specification asks for this 403).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_origin_is_refused_without_reaching_upstream() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let c = client();
    for origin in [
        "https://attacker.example",
        "null",
        "http://127.0.0.1.attacker.example",
    ] {
        let h: Vec<(&str, &str)> = JSON_POST
            .iter()
            .copied()
            .chain([("origin", origin)])
            .collect();
        let a = send(&c, Method::POST, &proxy.url("/mcp"), &h, call(1, "echo")).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{origin}");
    }
    assert_eq!(
        upstream_requests(&fx).await,
        0,
        "a refused request reached the upstream"
    );
    let stderr = stderr_with(&proxy, ORIGIN_REFUSED);
    assert_eq!(stderr.matches(ORIGIN_REFUSED).count(), 1, "{stderr}");
}

/// Local pages (an inspector on another loopback port) and the upstream's own origin are
/// admitted without configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_and_upstream_origins_are_admitted() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[], &[]);
    let c = client();
    let upstream_origin = fx.origin();
    let origins = [
        "http://localhost:6274",
        "http://127.0.0.1:3000",
        "https://[::1]",
        upstream_origin.as_str(),
    ];
    for origin in origins {
        let h: Vec<(&str, &str)> = JSON_POST
            .iter()
            .copied()
            .chain([("origin", origin)])
            .collect();
        let a = send(&c, Method::POST, &proxy.url("/mcp"), &h, call(1, "echo")).await;
        assert_eq!(a.status, StatusCode::OK, "{origin}");
    }
    assert_eq!(upstream_requests(&fx).await, origins.len() as u64);
}

/// `--allow-origin` admits more origins (and replaces `BOUNDED_ALLOW_ORIGINS`); a malformed
/// value is one warning and is ignored, and the proxy runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_origin_admits_more_origins() {
    let fx = Fixture::start("raw");
    let c = client();
    let with_origin = |origin: &'static str| -> Vec<(&'static str, &'static str)> {
        JSON_POST
            .iter()
            .copied()
            .chain([("origin", origin)])
            .collect()
    };
    let proxy = Proxy::start(
        &fx.url,
        &[("BOUNDED_ALLOW_ORIGINS", "https://env.example")],
        &[
            "--allow-origin",
            "https://app.example",
            "--allow-origin",
            "not an origin",
        ],
    );
    let url = proxy.url("/mcp");
    let a = send(
        &c,
        Method::POST,
        &url,
        &with_origin("https://app.example"),
        call(1, "echo"),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    for refused in ["https://env.example", "https://other.example"] {
        let a = send(
            &c,
            Method::POST,
            &url,
            &with_origin(refused),
            call(2, "echo"),
        )
        .await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{refused}");
    }
    let stderr = stderr_with(&proxy, "not an origin");
    assert_eq!(stderr.matches("not an origin").count(), 1, "{stderr}");
    drop(proxy);

    let proxy = Proxy::start(
        &fx.url,
        &[(
            "BOUNDED_ALLOW_ORIGINS",
            "https://env.example,https://two.example",
        )],
        &[],
    );
    let url = proxy.url("/mcp");
    for admitted in ["https://env.example", "https://two.example"] {
        let a = send(
            &c,
            Method::POST,
            &url,
            &with_origin(admitted),
            call(3, "echo"),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{admitted}");
    }
}

/// The checks protect the upstream, not the observation: the kill switch keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_switch_keeps_the_host_and_origin_checks() {
    let fx = Fixture::start("raw");
    let proxy = Proxy::start(&fx.url, &[("BOUNDED_OBSERVE_MCP_DISABLED", "1")], &[]);
    let (status, _) = post_with_host(
        proxy.port,
        "HTTP/1.1",
        Some(&format!("attacker.example:{}", proxy.port)),
        &call(1, "echo"),
    );
    assert_eq!(status, 403);
    let c = client();
    let h: Vec<(&str, &str)> = JSON_POST
        .iter()
        .copied()
        .chain([("origin", "https://attacker.example")])
        .collect();
    let a = send(&c, Method::POST, &proxy.url("/mcp"), &h, call(2, "echo")).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(upstream_requests(&fx).await, 0);
    let a = send(
        &c,
        Method::POST,
        &proxy.url("/mcp"),
        JSON_POST,
        call(3, "echo"),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let stderr = stderr_with(&proxy, ORIGIN_REFUSED);
    assert_eq!(stderr.matches(HOST_REFUSED).count(), 1, "{stderr}");
}

// ---------------------------------------------------------------- draining at shutdown

fn delay_call(id: u64, ms: u64) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "delay", "arguments": {"ms": ms}}})
    .to_string()
}

fn post(url: &str, body: String) -> Request<Full<Bytes>> {
    let mut req = Request::post(url);
    for (k, v) in JSON_POST {
        req = req.header(*k, *v);
    }
    req.body(Full::new(Bytes::from(body))).expect("request")
}

/// Waits until the raw fixture has received `n` requests (the calls are in flight upstream).
async fn upstream_saw(fx: &Fixture, n: u64) {
    let deadline = Instant::now() + IO_TIMEOUT;
    while upstream_requests(fx).await < n {
        assert!(Instant::now() < deadline, "upstream never saw {n} requests");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// SIGTERM while calls are in flight: the clients get their whole answers (a JSON response
/// and an SSE response), new connections are refused meanwhile, the calls are reported as
/// successes, and the process then exits with 143.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_at_sigterm_finish_before_exit() {
    let fx = Fixture::start("raw");
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = dir.path().join("events.jsonl");
    let ingest = format!("file:{}", sink.display());
    let mut proxy = Proxy::start(
        &fx.url,
        &[("BOUNDED_FLUSH_MS", "20")],
        &["--ingest", &ingest],
    );
    let url = proxy.url("/mcp");
    let c = client();

    // An SSE response: first event now, the result 1 s later. Read up to the first event.
    let resp = tokio::time::timeout(IO_TIMEOUT, c.request(post(&url, call(1, "slow"))))
        .await
        .expect("head in time")
        .expect("head");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut sse = resp.into_body();
    let mut sse_text = String::new();
    while !sse_text.contains("first event") {
        let frame = tokio::time::timeout(IO_TIMEOUT, sse.frame())
            .await
            .expect("first event in time")
            .expect("a frame")
            .expect("ok frame");
        if let Some(d) = frame.data_ref() {
            sse_text.push_str(&String::from_utf8_lossy(d));
        }
    }
    // A JSON response after 2 s.
    let c2 = client();
    let json_url = url.clone();
    let json_call = tokio::spawn(async move {
        send(&c2, Method::POST, &json_url, JSON_POST, delay_call(2, 2000)).await
    });
    upstream_saw(&fx, 2).await;

    proxy.send_signal(libc::SIGTERM);
    // The listener stops accepting while the calls finish.
    let port = proxy.port;
    let refused = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < deadline {
            match TcpStream::connect(("127.0.0.1", port)) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return true,
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        false
    });

    while let Some(frame) = tokio::time::timeout(IO_TIMEOUT, sse.frame())
        .await
        .expect("SSE frame in time")
    {
        let frame = frame.expect("the SSE response is not cut");
        if let Some(d) = frame.data_ref() {
            sse_text.push_str(&String::from_utf8_lossy(d));
        }
    }
    assert!(
        sse_text.contains("\"done\""),
        "SSE result missing: {sse_text}"
    );
    let a = json_call.await.expect("JSON call task");
    assert_eq!(a.status, StatusCode::OK);
    assert!(
        String::from_utf8_lossy(&a.body).contains("delayed 2000 ms"),
        "{:?}",
        a.body
    );
    assert!(
        refused.await.expect("connect task"),
        "new connections were still accepted while draining"
    );
    let code = tokio::task::spawn_blocking(move || proxy.wait_exit())
        .await
        .expect("wait");
    assert_eq!(code, 128 + libc::SIGTERM);

    let text = std::fs::read_to_string(&sink).unwrap_or_default();
    let events: Vec<Value> = text
        .lines()
        .flat_map(|l| {
            let batch: Value = serde_json::from_str(l).expect("one batch per line");
            batch["events"].as_array().cloned().unwrap_or_default()
        })
        .collect();
    for tool in ["slow", "delay"] {
        let e = by_action(&events, tool);
        assert_eq!(e.len(), 1, "{tool}: {events:?}");
        assert_eq!(
            e[0]["status"], 200,
            "{tool} finished, and is reported so: {}",
            e[0]
        );
    }
}

/// A call slower than `--drain-ms` is cut at the deadline, and the process exits soon after
/// (it does not wait for the call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_slower_than_the_drain_deadline_is_cut() {
    const DRAIN: Duration = Duration::from_millis(300);
    let fx = Fixture::start("raw");
    let mut proxy = Proxy::start(
        &fx.url,
        &[
            ("BOUNDED_DRAIN_MS", "300"),
            ("BOUNDED_SHUTDOWN_FLUSH_MS", "200"),
        ],
        &[],
    );
    let url = proxy.url("/mcp");
    let in_flight = tokio::spawn(async move {
        let c = client();
        tokio::time::timeout(IO_TIMEOUT, c.request(post(&url, delay_call(1, 20_000))))
            .await
            .expect("the call ends in time")
            .map(|r| r.status())
    });
    upstream_saw(&fx, 1).await;
    let signalled = Instant::now();
    proxy.send_signal(libc::SIGTERM);
    let code = tokio::task::spawn_blocking(move || proxy.wait_exit())
        .await
        .expect("wait");
    let took = signalled.elapsed();
    assert_eq!(code, 128 + libc::SIGTERM);
    assert!(
        took >= DRAIN,
        "exited after {took:?}, before the drain deadline"
    );
    assert!(
        took < Duration::from_secs(10),
        "exited after {took:?}: waited for the call instead of cutting it"
    );
    let outcome = in_flight.await.expect("call task");
    assert!(outcome.is_err(), "the cut call got an answer: {outcome:?}");
}

/// A GET event stream is the session's channel, not a call: it ends at once on SIGTERM (and
/// the upstream's stream is closed) instead of holding the shutdown until the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_stream_ends_at_once_on_sigterm() {
    let fx = Fixture::start("raw");
    let mut proxy = Proxy::start(
        &fx.url,
        &[
            ("BOUNDED_DRAIN_MS", "30000"),
            ("BOUNDED_SHUTDOWN_FLUSH_MS", "200"),
        ],
        &[],
    );
    let c = client();
    let get = Request::get(proxy.url("/mcp"))
        .header("accept", "text/event-stream")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = tokio::time::timeout(IO_TIMEOUT, c.request(get))
        .await
        .expect("head in time")
        .expect("head");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = tokio::time::timeout(IO_TIMEOUT, body.frame())
        .await
        .expect("first event in time")
        .expect("a frame")
        .expect("ok frame");
    assert!(String::from_utf8_lossy(first.data_ref().expect("data")).contains("stream open"));

    let signalled = Instant::now();
    proxy.send_signal(libc::SIGTERM);
    let end = tokio::time::timeout(IO_TIMEOUT, body.frame())
        .await
        .expect("the stream ends in time");
    assert!(end.is_none(), "the stream ends cleanly, not cut: {end:?}");
    let code = tokio::task::spawn_blocking(move || proxy.wait_exit())
        .await
        .expect("wait");
    assert_eq!(code, 128 + libc::SIGTERM);
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "a GET stream held the shutdown for {took:?}"
    );
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let stats = send(&c, Method::GET, &format!("{}/stats", fx.origin()), &[], "").await;
        let v: Value = serde_json::from_slice(&stats.body).expect("stats");
        if v["closed_streams"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "upstream stream still open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
