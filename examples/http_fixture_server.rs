//! Upstream MCP servers for the HTTP proxy tests, on 127.0.0.1 only.
//!
//! `http_fixture_server <mode>` prints `listening http://127.0.0.1:<port>/mcp` on stdout once it
//! accepts, and serves until its stdin closes (so a test that dies leaves no server behind).
//!
//! Modes:
//! * `rmcp` — the official Rust SDK's Streamable HTTP server with sessions: the legacy era
//!   (`initialize`, `Mcp-Session-Id`, GET stream, DELETE) and, for clients that ask, the
//!   stateless 2026-07-28 era (`server/discover`), SSE responses.
//! * `rmcp-json` — the same server without sessions, answering with `application/json`.
//! * `raw` — a hand-written server for what an SDK will not do on demand: a 2026-07-28-style
//!   stateless endpoint whose `slow` tool sends an SSE event, waits 1 s, then the result; a
//!   `delay` tool that answers in JSON after `arguments.ms` (default 1000); a `hang` tool whose
//!   stream never ends (and counts when its reader goes away); a GET stream on `/mcp` that
//!   never ends either (counted the same way); 25 MB bodies both ways; a gzip body; a
//!   body-less 202; 404 for an unknown session; a non-2xx answer; a 33 MiB result (`huge`),
//!   which the proxy reads from its ends; answers the proxy cannot read (no content type,
//!   `text/plain`, a batch over its 32 MiB cap); header echo. `GET /stats` reports
//!   what it observed. It reads JSON as a JavaScript server does: a duplicated key keeps its
//!   last value, and a numeric id comes back as the number it parsed to (`"id": 1.0` is
//!   answered with `"id": 1`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::{any, get, post};
use axum::Router;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler};
use serde_json::{json, Value};

/// Size of the large bodies: the proxy must relay 25 MB.
const BIG: usize = 25 * 1024 * 1024;

/// Size of the `huge` and `huge_batch` answers: over the proxy's 32 MiB cap on a body it holds
/// whole (a batch; a single result is read from its ends).
const HUGE: usize = 33 * 1024 * 1024;

/// The pause between the first SSE event and the result in the `slow` tool.
const SLOW_PAUSE: Duration = Duration::from_secs(1);

/// How long the `delay` tool waits when the call does not say (`arguments.ms`).
const DEFAULT_DELAY_MS: u64 = 1000;

/// `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"compressed"}]}}`,
/// gzip-compressed: relayed as is, never decoded by the proxy.
const GZIP_BODY: &[u8] = &[
    31, 139, 8, 0, 0, 0, 0, 0, 2, 3, 29, 202, 187, 10, 128, 48, 12, 70, 225, 119, 249, 231, 34,
    234, 152, 87, 17, 167, 54, 131, 98, 47, 52, 17, 148, 208, 119, 55, 56, 157, 51, 124, 134, 83,
    106, 233, 45, 130, 176, 78, 51, 2, 142, 4, 90, 2, 58, 203, 125, 41, 200, 16, 107, 81, 46, 190,
    155, 65, 223, 198, 46, 149, 31, 117, 250, 135, 28, 228, 230, 92, 56, 97, 236, 99, 124, 194, 80,
    195, 33, 83, 0, 0, 0,
];

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    text: String,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct AddArgs {
    a: i64,
    b: i64,
}

#[derive(Debug, Clone)]
struct Fixture {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Fixture {
    #[tool(description = "Echo the text back")]
    fn echo(&self, Parameters(EchoArgs { text }): Parameters<EchoArgs>) -> String {
        text
    }

    #[tool(description = "Add two integers")]
    fn add(&self, Parameters(AddArgs { a, b }): Parameters<AddArgs>) -> String {
        (a + b).to_string()
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[derive(Default)]
struct Stats {
    /// `hang` and GET streams whose reader went away.
    closed_streams: AtomicU64,
    /// `/slow-upload` bodies that ended in an error (the sender went away mid-body).
    aborted_uploads: AtomicU64,
    /// Requests that reached the `raw` endpoint (POST and GET `/mcp`).
    requests: AtomicU64,
}

fn rpc_result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": js_id(id), "result": result})
}

/// The id as `JSON.stringify(JSON.parse(...))` writes it back: a number with an integral value
/// loses its fraction and exponent (`1.0`, `1e0` → `1`).
fn js_id(id: &Value) -> Value {
    match id.as_f64() {
        Some(f) if id.is_f64() && f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => {
            json!(f as i64)
        }
        _ => id.clone(),
    }
}

/// A 200 whose body is a JSON-RPC result but whose content type (if any) is not JSON.
fn typed_response(content_type: Option<&'static str>, id: &Value) -> Response {
    let body = rpc_result(id, json!({"content": [{"type": "text", "text": "ok"}]}));
    let mut r = Response::new(Body::from(body.to_string()));
    if let Some(ct) = content_type {
        r.headers_mut()
            .insert("content-type", HeaderValue::from_static(ct));
    }
    r
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}

fn sse_event(v: &Value) -> Bytes {
    Bytes::from(format!("event: message\ndata: {v}\n\n"))
}

fn sse_response(body: Body) -> Response {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-cache"));
    r
}

/// Counts a stream's reader going away when dropped before its end.
struct DropCounter(Arc<Stats>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.closed_streams.fetch_add(1, Ordering::SeqCst);
    }
}

async fn raw_mcp(State(stats): State<Arc<Stats>>, headers: HeaderMap, body: Bytes) -> Response {
    stats.requests.fetch_add(1, Ordering::SeqCst);
    if headers
        .get("mcp-session-id")
        .is_some_and(|v| v.as_bytes() == b"unknown-session")
    {
        return json_response(
            StatusCode::NOT_FOUND,
            br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}"#
                .to_vec(),
        );
    }
    let Ok(msg) = serde_json::from_slice::<Value>(&body) else {
        return json_response(StatusCode::BAD_REQUEST, b"{}".to_vec());
    };
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
    if id.is_null() {
        // A notification: 202, no body, no content type.
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::ACCEPTED;
        return r;
    }
    match method {
        "server/discover" => json_response(
            StatusCode::OK,
            rpc_result(
                &id,
                json!({
                    "supportedVersions": ["2026-07-28"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "raw-fixture", "version": "1.0.0"}
                }),
            )
            .to_string()
            .into_bytes(),
        ),
        "tools/call" => {
            let name = msg
                .pointer("/params/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            match name {
                "slow" => {
                    let first = sse_event(&json!({
                        "jsonrpc": "2.0", "method": "notifications/message",
                        "params": {"level": "info", "data": "first event"}
                    }));
                    let last = sse_event(&rpc_result(
                        &id,
                        json!({"content": [{"type": "text", "text": "done"}]}),
                    ));
                    let stream = futures_util::stream::iter([Ok::<_, std::io::Error>(first)])
                        .chain(futures_util::stream::once(async move {
                            tokio::time::sleep(SLOW_PAUSE).await;
                            Ok(last)
                        }));
                    sse_response(Body::from_stream(stream))
                }
                "hang" => {
                    let guard = DropCounter(stats.clone());
                    let first = sse_event(&json!({
                        "jsonrpc": "2.0", "method": "notifications/message",
                        "params": {"level": "info", "data": "hanging"}
                    }));
                    let stream = futures_util::stream::iter([Ok::<_, std::io::Error>(first)])
                        .chain(futures_util::stream::once(async move {
                            let _guard = guard;
                            std::future::pending::<()>().await;
                            Ok(Bytes::new())
                        }));
                    sse_response(Body::from_stream(stream))
                }
                "big" => {
                    let text = "x".repeat(BIG);
                    json_response(
                        StatusCode::OK,
                        rpc_result(&id, json!({"content": [{"type": "text", "text": text}]}))
                            .to_string()
                            .into_bytes(),
                    )
                }
                "huge" => {
                    let text = "x".repeat(HUGE);
                    json_response(
                        StatusCode::OK,
                        rpc_result(&id, json!({"content": [{"type": "text", "text": text}]}))
                            .to_string()
                            .into_bytes(),
                    )
                }
                "huge_batch" => {
                    let text = "x".repeat(HUGE);
                    let result =
                        rpc_result(&id, json!({"content": [{"type": "text", "text": text}]}));
                    json_response(StatusCode::OK, json!([result]).to_string().into_bytes())
                }
                "untyped" => typed_response(None, &id),
                "plain" => typed_response(Some("text/plain"), &id),
                "delay" => {
                    let ms = msg
                        .pointer("/params/arguments/ms")
                        .and_then(Value::as_u64)
                        .unwrap_or(DEFAULT_DELAY_MS);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    json_response(
                        StatusCode::OK,
                        rpc_result(
                            &id,
                            json!({"content": [{"type": "text", "text": format!("delayed {ms} ms")}]}),
                        )
                        .to_string()
                        .into_bytes(),
                    )
                }
                "gzip" => raw_gzip_response(),
                "fail" => json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    br#"{"error":"overloaded"}"#.to_vec(),
                ),
                _ => json_response(
                    StatusCode::OK,
                    rpc_result(&id, json!({"content": [{"type": "text", "text": "ok"}]}))
                        .to_string()
                        .into_bytes(),
                ),
            }
        }
        _ => json_response(
            StatusCode::OK,
            rpc_result(&id, json!({})).to_string().into_bytes(),
        ),
    }
}

/// The server→client stream of a session: one event, then open until the reader goes away.
async fn raw_stream(State(stats): State<Arc<Stats>>) -> Response {
    stats.requests.fetch_add(1, Ordering::SeqCst);
    let guard = DropCounter(stats.clone());
    let first = sse_event(&json!({
        "jsonrpc": "2.0", "method": "notifications/message",
        "params": {"level": "info", "data": "stream open"}
    }));
    let stream = futures_util::stream::iter([Ok::<_, std::io::Error>(first)]).chain(
        futures_util::stream::once(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            Ok(Bytes::new())
        }),
    );
    sse_response(Body::from_stream(stream))
}

/// Echoes the request's headers as JSON and answers with end-to-end and hop-by-hop headers of
/// its own, so a test can see which crossed the proxy.
async fn raw_headers(headers: HeaderMap) -> Response {
    let mut seen = serde_json::Map::new();
    for (k, v) in &headers {
        seen.insert(
            k.as_str().to_string(),
            Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()),
        );
    }
    let mut r = json_response(
        StatusCode::UNAUTHORIZED,
        Value::Object(seen).to_string().into_bytes(),
    );
    let h = r.headers_mut();
    h.insert(
        "www-authenticate",
        HeaderValue::from_static(
            r#"Bearer resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource""#,
        ),
    );
    h.insert(
        "mcp-session-id",
        HeaderValue::from_static("sess-from-upstream"),
    );
    h.insert("x-end-to-end", HeaderValue::from_static("kept"));
    h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
    r
}

async fn raw_upload(body: Bytes) -> Response {
    let sum: u64 = body.iter().map(|&b| u64::from(b)).sum();
    json_response(
        StatusCode::OK,
        json!({"bytes": body.len(), "sum": sum})
            .to_string()
            .into_bytes(),
    )
}

async fn raw_slow_upload(State(stats): State<Arc<Stats>>, req: Request) -> Response {
    let mut body = req.into_body();
    let mut n = 0usize;
    loop {
        match body.frame().await {
            Some(Ok(f)) => n += f.data_ref().map_or(0, |d| d.len()),
            Some(Err(_)) => {
                stats.aborted_uploads.fetch_add(1, Ordering::SeqCst);
                return json_response(StatusCode::BAD_REQUEST, b"{}".to_vec());
            }
            None => break,
        }
    }
    json_response(StatusCode::OK, json!({"bytes": n}).to_string().into_bytes())
}

async fn raw_gzip() -> Response {
    raw_gzip_response()
}

fn raw_gzip_response() -> Response {
    let mut r = json_response(StatusCode::OK, GZIP_BODY.to_vec());
    r.headers_mut()
        .insert("content-encoding", HeaderValue::from_static("gzip"));
    r
}

async fn raw_big_download() -> Response {
    // Streamed in 64 KiB pieces, without a length: the proxy must relay it chunked as it came.
    let piece = Bytes::from(vec![b'y'; 64 * 1024]);
    let stream = futures_util::stream::iter(
        (0..BIG / piece.len()).map(move |_| Ok::<_, std::io::Error>(piece.clone())),
    );
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/octet-stream"),
    );
    r
}

async fn raw_stats(State(stats): State<Arc<Stats>>) -> Response {
    json_response(
        StatusCode::OK,
        json!({
            "closed_streams": stats.closed_streams.load(Ordering::SeqCst),
            "aborted_uploads": stats.aborted_uploads.load(Ordering::SeqCst),
            "requests": stats.requests.load(Ordering::SeqCst),
        })
        .to_string()
        .into_bytes(),
    )
}

fn raw_router() -> Router {
    let stats = Arc::new(Stats::default());
    Router::new()
        .route("/mcp", post(raw_mcp).get(raw_stream))
        .route("/headers", any(raw_headers))
        .route(
            "/upload",
            post(raw_upload).layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024)),
        )
        .route("/slow-upload", post(raw_slow_upload))
        .route("/gzip", get(raw_gzip))
        .route("/big", get(raw_big_download))
        .route("/stats", get(raw_stats))
        .with_state(stats)
}

fn rmcp_router(sessions: bool) -> Router {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(sessions)
        .with_json_response(!sessions);
    let service: StreamableHttpService<Fixture, LocalSessionManager> = StreamableHttpService::new(
        || {
            Ok(Fixture {
                tool_router: Fixture::tool_router(),
            })
        },
        Default::default(),
        config,
    );
    Router::new().nest_service("/mcp", service)
}

#[tokio::main]
async fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "rmcp".into());
    let router = match mode.as_str() {
        "rmcp" => rmcp_router(true),
        "rmcp-json" => rmcp_router(false),
        "raw" => raw_router(),
        other => {
            eprintln!("unknown mode {other:?}: rmcp | rmcp-json | raw");
            std::process::exit(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("bind failed: {e}");
            std::process::exit(1);
        }
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    println!("listening http://127.0.0.1:{port}/mcp");
    // Exit when the test closes our stdin (or dies): no orphaned fixture.
    std::thread::spawn(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        std::process::exit(0);
    });
    if let Err(e) = axum::serve(listener, router).await {
        eprintln!("serve failed: {e}");
        std::process::exit(1);
    }
}
