//! OTLP export end to end: the real wrapper around the `outcomes` fixture server, exporting to
//! an OTLP receiver on loopback in this test (axum), decoded with `opentelemetry-proto` — for
//! both protocols. Spans (names, kind, attributes, parentage, status), metrics (the tool name
//! only from the catalog), canaries in no OTLP byte, a dead or black-holed endpoint that leaves
//! the relay as it was, and the wrapped server still seeing the `OTEL_*` variables.

mod stdio_support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{json, Value};
use stdio_support::{run, wrap_fixture, Run};

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    content_type: String,
    auth: Option<String>,
    body: Bytes,
}

type Log = Arc<Mutex<Vec<Received>>>;

async fn receive(State(log): State<Log>, uri: Uri, headers: HeaderMap, body: Bytes) -> StatusCode {
    let get = |h: &str| {
        headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    log.lock().expect("log").push(Received {
        path: uri.path().to_string(),
        content_type: get("content-type").unwrap_or_default(),
        auth: get("x-api-key"),
        body,
    });
    StatusCode::OK
}

/// An OTLP/HTTP receiver on 127.0.0.1, on its own thread and runtime.
fn receiver() -> (SocketAddr, Log) {
    let log: Log = Arc::default();
    let app = Router::new()
        .route("/v1/traces", post(receive))
        .route("/v1/metrics", post(receive))
        .with_state(log.clone());
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let addr = std_listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
            axum::serve(listener, app).await.expect("serve");
        });
    });
    (addr, log)
}

/// An `Mcp-Session-Id` the client sends: only its keyed hash may leave.
const RAW_SESSION: &str = "mcp-session-raw-canary-8812";

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// Canaries planted in the session: none may appear in any OTLP byte.
const CANARIES: &[&str] = &[
    "jane.doe@example.com",
    "4111 1111 1111 1111",
    "4111111111111111",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlLXZhbHVl",
    "sk_live_51Hcanarysecret",
    "innocent-looking-secret-value",
    "rpc-leak@example.com",
    "tracestate-leak@example.com",
    "mcp-session-raw",
];

fn session_input(extra_calls: &[Value]) -> Vec<u8> {
    let mut msgs = vec![
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},
            "clientInfo":{"name":"otlp-test","version":"1"}}}),
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}),
        json!({"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"ok",
            "arguments":{"amount_cents":4900,"currency":"EUR",
                "customer_email":"jane.doe@example.com",
                "reason":"refund for jane.doe@example.com",
                "card":"4111 1111 1111 1111",
                "note":"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlLXZhbHVl",
                "api_key":"sk_live_51Hcanarysecret",
                "status":"innocent-looking-secret-value-but-it-is-long-prose with spaces"},
            "_meta":{"traceparent":format!("00-{TRACE_ID}-{PARENT}-01"),
                     "tracestate":"vendor=tracestate-leak@example.com",
                     "bounded/onBehalfOf":"cust_42"}}}),
        json!({"jsonrpc":"2.0","id":"req-11","method":"tools/call","params":{"name":"tool_error","arguments":{}}}),
        json!({"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"rpc_error","arguments":{}}}),
        json!({"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"slow_cancelled","arguments":{}}}),
        json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":13}}),
        json!({"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":"slow_open","arguments":{}}}),
        json!({"jsonrpc":"2.0","id":"jane.doe@example.com","method":"tools/call","params":{"name":"unlisted_tool","arguments":{}}}),
    ];
    msgs.extend_from_slice(extra_calls);
    let mut out = Vec::new();
    for m in msgs {
        out.extend_from_slice(m.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

/// Removes the `OTEL_*` variables this test process inherited: the runs set their own.
fn clean_otel(cmd: &mut std::process::Command) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("OTEL_") {
            cmd.env_remove(&k);
        }
    }
}

fn wrapper_run(protocol: &str, endpoint: &str, input: &[u8], extra_env: &[(&str, &str)]) -> Run {
    let mut cmd = wrap_fixture(
        &[
            "--otlp-endpoint",
            endpoint,
            "--otlp-protocol",
            protocol,
            "--flush-ms",
            "100",
            "--shutdown-flush-ms",
            "3000",
            "--debug",
        ],
        &["outcomes"],
    );
    clean_otel(&mut cmd);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    run(cmd, input)
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Any> {
    attrs
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn attr_str<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(attrs, key) {
        Some(Any::StringValue(s)) => Some(s),
        _ => None,
    }
}

/// Decodes what the receiver got: spans with their resource's attributes, and metrics.
fn decode(
    log: &[Received],
    protocol: &str,
) -> (Vec<(Vec<KeyValue>, Span)>, Vec<ExportMetricsServiceRequest>) {
    let mut spans = Vec::new();
    let mut metrics = Vec::new();
    for r in log {
        let json = protocol == "http/json";
        assert_eq!(
            r.content_type,
            if json {
                "application/json"
            } else {
                "application/x-protobuf"
            }
        );
        if r.path == "/v1/traces" {
            let req: ExportTraceServiceRequest = if json {
                check_otlp_json_rules(&r.body);
                serde_json::from_slice(&r.body).expect("OTLP JSON traces")
            } else {
                ExportTraceServiceRequest::decode(r.body.clone()).expect("OTLP protobuf traces")
            };
            for rs in req.resource_spans {
                let res = rs.resource.map(|r| r.attributes).unwrap_or_default();
                for ss in rs.scope_spans {
                    for s in ss.spans {
                        spans.push((res.clone(), s));
                    }
                }
            }
        } else {
            assert_eq!(r.path, "/v1/metrics");
            metrics.push(if json {
                serde_json::from_slice(&r.body).expect("OTLP JSON metrics")
            } else {
                ExportMetricsServiceRequest::decode(r.body.clone()).expect("OTLP protobuf metrics")
            });
        }
    }
    (spans, metrics)
}

/// The OTLP JSON rules the crate's mapping must follow: ids in hex, enums as integers, 64-bit
/// integers as strings, lowerCamelCase names.
fn check_otlp_json_rules(body: &[u8]) {
    let v: Value = serde_json::from_slice(body).expect("JSON");
    let span = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
    let trace_id = span["traceId"].as_str().expect("traceId is a string");
    assert_eq!(trace_id.len(), 32);
    assert!(
        trace_id.bytes().all(|c| c.is_ascii_hexdigit()),
        "{trace_id}"
    );
    assert_eq!(span["spanId"].as_str().map(str::len), Some(16));
    assert_eq!(span["kind"], json!(2), "SPAN_KIND_SERVER as an integer");
    assert!(span["startTimeUnixNano"].is_string(), "{span}");
    assert!(span["endTimeUnixNano"].is_string(), "{span}");
}

#[test]
fn spans_and_metrics_follow_the_mcp_conventions_in_both_protocols() {
    for protocol in ["http/protobuf", "http/json"] {
        let (addr, log) = receiver();
        let input = session_input(&[]);
        let out = wrapper_run(
            protocol,
            &format!("http://{addr}"),
            &input,
            &[
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=hdr-sekret-value"),
                ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test"),
            ],
        );
        assert_eq!(out.code(), Some(0), "{}", out.stderr);
        assert!(
            !out.stderr.contains("hdr-sekret-value"),
            "headers never logged: {}",
            out.stderr
        );
        let log = log.lock().expect("log").clone();
        assert!(log
            .iter()
            .all(|r| r.auth.as_deref() == Some("hdr-sekret-value")));
        let (spans, metrics) = decode(&log, protocol);
        let by_tool = |t: &str| {
            spans
                .iter()
                .find(|(_, s)| attr_str(&s.attributes, "gen_ai.tool.name") == Some(t))
                .unwrap_or_else(|| panic!("{protocol}: a span for {t}: {spans:?}"))
        };
        assert_eq!(spans.len(), 6, "{protocol}: {spans:#?}");
        for (res, s) in &spans {
            assert_eq!(s.kind, 2, "SERVER");
            let tool = attr_str(&s.attributes, "gen_ai.tool.name").expect("tool");
            assert_eq!(s.name, format!("tools/call {tool}"));
            assert_eq!(
                attr_str(&s.attributes, "mcp.method.name"),
                Some("tools/call")
            );
            assert_eq!(
                attr_str(&s.attributes, "gen_ai.operation.name"),
                Some("execute_tool")
            );
            assert_eq!(attr_str(&s.attributes, "network.transport"), Some("pipe"));
            assert_eq!(
                attr_str(&s.attributes, "mcp.protocol.version"),
                Some("2025-06-18")
            );
            assert!(attr_str(&s.attributes, "mcp.session.id").is_some());
            assert!(s.end_time_unix_nano >= s.start_time_unix_nano);
            assert_eq!(attr_str(res, "service.name"), Some("mcp:outcomes"));
            assert_eq!(attr_str(res, "service.version"), Some("2.1.0"));
            assert_eq!(
                attr_str(res, "telemetry.sdk.name"),
                Some("bounded-observe-mcp")
            );
            assert_eq!(attr_str(res, "deployment.environment"), Some("test"));
            let status = s.status.clone().unwrap_or_default();
            assert!(status.message.is_empty(), "no error text: {status:?}");
        }
        // Success, joined to the client's trace.
        let (_, ok) = by_tool("ok");
        assert_eq!(hex(&ok.trace_id), TRACE_ID);
        assert_eq!(hex(&ok.parent_span_id), PARENT);
        assert_eq!(
            ok.trace_state, "",
            "a tracestate holding an e-mail is left out"
        );
        assert_eq!(attr_str(&ok.attributes, "jsonrpc.request.id"), Some("10"));
        assert_eq!(attr(&ok.attributes, "error.type"), None);
        assert_eq!(ok.status.clone().unwrap_or_default().code, 0);
        assert_eq!(
            attr(&ok.attributes, "bounded.field.amount_cents"),
            Some(&Any::IntValue(4900))
        );
        assert_eq!(
            attr_str(&ok.attributes, "bounded.field.currency"),
            Some("EUR")
        );
        let fields: Vec<&str> = ok
            .attributes
            .iter()
            .filter_map(|a| a.key.strip_prefix("bounded.field."))
            .collect();
        assert_eq!(fields.len(), 2, "only what passed the filter: {fields:?}");
        assert_eq!(
            attr_str(&ok.attributes, "bounded.on_behalf_of"),
            Some("cust_42")
        );
        assert_eq!(
            attr_str(&ok.attributes, "bounded.actor.id"),
            Some("mcp:unknown")
        );
        // The others: a new trace each, and an error.type each.
        let (_, tool_error) = by_tool("tool_error");
        assert!(tool_error.parent_span_id.is_empty());
        assert_eq!(
            attr_str(&tool_error.attributes, "jsonrpc.request.id"),
            Some("req-11")
        );
        assert_eq!(
            attr_str(&tool_error.attributes, "error.type"),
            Some("tool_error")
        );
        assert_eq!(tool_error.status.clone().unwrap_or_default().code, 2);
        let (_, rpc) = by_tool("rpc_error");
        assert_eq!(attr_str(&rpc.attributes, "error.type"), Some("-32602"));
        assert_eq!(
            attr_str(&rpc.attributes, "rpc.response.status_code"),
            Some("-32602")
        );
        let (_, cancelled) = by_tool("slow_cancelled");
        assert_eq!(
            attr_str(&cancelled.attributes, "error.type"),
            Some("cancelled")
        );
        let (_, open) = by_tool("slow_open");
        let open_err = attr_str(&open.attributes, "error.type");
        assert!(
            matches!(open_err, Some("timeout") | Some("transport")),
            "{open_err:?}"
        );
        let (_, unlisted) = by_tool("unlisted_tool");
        assert_eq!(
            attr_str(&unlisted.attributes, "jsonrpc.request.id"),
            None,
            "an id holding an e-mail is left out"
        );

        // Metrics: the tool name only from the catalog.
        let last = metrics.last().expect("metrics were exported");
        let ms = &last.resource_metrics[0].scope_metrics[0].metrics;
        let op = ms
            .iter()
            .find(|m| m.name == "mcp.server.operation.duration")
            .expect("operation duration");
        assert_eq!(op.unit, "s");
        let Some(Data::Histogram(h)) = &op.data else {
            panic!("a histogram")
        };
        let tools: std::collections::BTreeSet<&str> = h
            .data_points
            .iter()
            .filter_map(|p| attr_str(&p.attributes, "gen_ai.tool.name"))
            .collect();
        assert_eq!(
            tools.into_iter().collect::<Vec<_>>(),
            vec!["_OTHER", "ok", "rpc_error", "tool_error"]
        );
        assert_eq!(h.data_points.iter().map(|p| p.count).sum::<u64>(), 6);
        assert_eq!(
            h.data_points[0].explicit_bounds,
            vec![0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]
        );
        assert!(ms.iter().any(|m| m.name == "mcp.server.session.duration"));
        assert!(ms.iter().any(|m| m.name == "bounded.sensor.events.dropped"));

        // No canary in any byte sent.
        for r in &log {
            for c in CANARIES {
                assert!(
                    !contains(&r.body, c.as_bytes()),
                    "{protocol}: canary {c:?} in an OTLP {} body",
                    r.path
                );
            }
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn ten_thousand_unlisted_tool_names_keep_the_metric_series_bounded() {
    let (addr, log) = receiver();
    let calls: Vec<Value> = (0..10_000)
        .map(|i| {
            json!({"jsonrpc":"2.0","id":1000 + i,"method":"tools/call",
                   "params":{"name":format!("made_up_{i}"),"arguments":{}}})
        })
        .collect();
    let out = wrapper_run(
        "http/protobuf",
        &format!("http://{addr}"),
        &session_input(&calls),
        &[],
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let log = log.lock().expect("log").clone();
    let (_, metrics) = decode(&log, "http/protobuf");
    let last = metrics.last().expect("metrics");
    let op = last.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .find(|m| m.name == "mcp.server.operation.duration")
        .expect("operation duration");
    let Some(Data::Histogram(h)) = &op.data else {
        panic!("a histogram")
    };
    assert!(h.data_points.len() <= 8, "{}", h.data_points.len());
    let other: u64 = h
        .data_points
        .iter()
        .filter(|p| attr_str(&p.attributes, "gen_ai.tool.name") == Some("_OTHER"))
        .map(|p| p.count)
        .sum();
    assert!(other >= 10_000, "{other}");
}

/// The relay's output with OTLP on towards `endpoint`, and how long the run took.
fn relay_with(endpoint: &str) -> (Run, Duration) {
    let started = Instant::now();
    let out = wrapper_run("http/protobuf", endpoint, &session_input(&[]), &[]);
    (out, started.elapsed())
}

#[test]
fn a_dead_or_black_holed_endpoint_does_not_change_the_relay() {
    let (addr, _log) = receiver();
    let (healthy, _) = relay_with(&format!("http://{addr}"));
    assert_eq!(healthy.code(), Some(0));
    // Refused: a port with nothing listening.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead = closed.local_addr().expect("addr");
    drop(closed);
    // Black hole: accepts and never answers.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hole_addr = hole.local_addr().expect("addr");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in hole.incoming().flatten() {
            held.push(c);
        }
    });
    for endpoint in [format!("http://{dead}"), format!("http://{hole_addr}")] {
        let (out, took) = relay_with(&endpoint);
        assert_eq!(out.code(), Some(0), "{endpoint}: {}", out.stderr);
        assert_eq!(
            out.stdout, healthy.stdout,
            "{endpoint}: the client gets the same bytes"
        );
        // The shutdown flush (3 s) bounds the wait for a dead endpoint, plus process start-up.
        assert!(took < Duration::from_secs(8), "{endpoint}: {took:?}");
        assert!(
            out.stderr.contains("OTLP export failed")
                || out.stderr.contains("Shutdown flush deadline reached"),
            "{endpoint}: {}",
            out.stderr
        );
    }
}

#[test]
fn the_server_gets_the_otel_variables_unchanged_and_none_of_ours() {
    let (addr, _log) = receiver();
    let mut cmd = stdio_support::wrapper_cmd(&[], &[std::ffi::OsStr::new("env")]);
    clean_otel(&mut cmd);
    cmd.env("BOUNDED_OTLP_ENDPOINT", format!("http://{addr}"))
        .env("BOUNDED_OTLP_HEADERS", "x-api-key=ours")
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://collector.example:4318",
        )
        .env("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=theirs")
        .env("OTEL_SERVICE_NAME", "their-server");
    let out = run(cmd, b"");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let env = String::from_utf8_lossy(&out.stdout);
    assert!(!env.lines().any(|l| l.starts_with("BOUNDED_")), "{env}");
    for want in [
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://collector.example:4318",
        "OTEL_EXPORTER_OTLP_HEADERS=x-api-key=theirs",
        "OTEL_SERVICE_NAME=their-server",
    ] {
        assert!(env.lines().any(|l| l == want), "{want}: {env}");
    }
}

/// An `http_fixture_server` upstream; killed on drop.
struct Upstream {
    child: std::process::Child,
    url: String,
}

impl Upstream {
    fn start(mode: &str) -> Upstream {
        use std::io::BufRead;
        let mut child = std::process::Command::new(stdio_support::example("http_fixture_server"))
            .arg(mode)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("spawn the fixture (cargo build --examples)");
        let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("fixture prints its URL");
        let url = line
            .trim()
            .strip_prefix("listening ")
            .expect("listening line")
            .to_string();
        Upstream { child, url }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The wrapper in HTTP mode in front of `upstream`, exporting to `otlp`; returns it and its
/// port once it listens.
fn http_proxy(upstream: &str, otlp: &str, protocol: &str) -> (std::process::Child, u16) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(stdio_support::wrapper_bin())
        .env_clear()
        .args(["--http", "--upstream", upstream, "--otlp-endpoint", otlp])
        .args(["--otlp-protocol", protocol])
        .args(["--flush-ms", "100", "--shutdown-flush-ms", "3000"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the proxy");
    let mut err = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    let port = loop {
        line.clear();
        assert!(
            err.read_line(&mut line).expect("stderr") > 0,
            "no listening line"
        );
        if let Some(rest) = line.strip_prefix("[observe-mcp] listening http://127.0.0.1:") {
            let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
            break port.parse().expect("port");
        }
    };
    std::thread::spawn(move || {
        let mut sink = String::new();
        while err.read_line(&mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    });
    (child, port)
}

fn stop(mut child: std::process::Child) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the proxy did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_mode_spans_carry_the_upstream_and_the_traceparent_header_protobuf() {
    http_mode("http/protobuf").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_mode_spans_carry_the_upstream_and_the_traceparent_header_json() {
    http_mode("http/json").await;
}

async fn http_mode(protocol: &str) {
    let (addr, log) = receiver();
    let upstream = Upstream::start("raw");
    let (proxy, port) = http_proxy(&upstream.url, &format!("http://{addr}"), protocol);
    let url = format!("http://127.0.0.1:{port}/mcp");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let post = |body: Value, traceparent: Option<&str>| {
        let mut req = client
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .body(body.to_string());
        if let Some(t) = traceparent {
            // The traced calls also run in a session (the others must not: a client that
            // closes a session's stream has not cancelled, it may resume).
            req = req
                .header("traceparent", t)
                .header("mcp-session-id", RAW_SESSION);
        }
        req.send()
    };
    let header_tp = format!("00-{TRACE_ID}-{PARENT}-01");
    let meta_trace = "0af7651916cd43dd8448eb211c80319c";
    let meta_tp = format!("00-{meta_trace}-b7ad6b7169203331-01");
    post(
        json!({"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}),
        None,
    )
    .await
    .expect("discover");
    let r = post(
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
               "params":{"name":"delay","arguments":{"ms":5}}}),
        Some(&header_tp),
    )
    .await
    .expect("delay");
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    let r = post(
        json!({"jsonrpc":"2.0","id":3,"method":"tools/call",
               "params":{"name":"other","arguments":{},"_meta":{"traceparent":meta_tp}}}),
        Some(&header_tp),
    )
    .await
    .expect("other");
    let _ = r.bytes().await;
    let r = post(
        json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"fail","arguments":{}}}),
        None,
    )
    .await
    .expect("fail");
    assert_eq!(r.status(), 503);
    let _ = r.bytes().await;
    // The client gives up on a call that never ends: a cancellation.
    let hang = tokio::time::timeout(
        Duration::from_millis(500),
        post(
            json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"hang","arguments":{}}}),
            None,
        )
        .and_then_bytes(),
    )
    .await;
    assert!(hang.is_err(), "hang never ends");
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::spawn_blocking(move || stop(proxy))
        .await
        .expect("stopped");

    // An upstream that is not there: a transport failure.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let gone = format!("http://{}/mcp", closed.local_addr().expect("addr"));
    drop(closed);
    let (proxy, port) = http_proxy(&gone, &format!("http://{addr}"), protocol);
    let r = client
        .post(format!("http://127.0.0.1:{port}/mcp"))
        .header("content-type", "application/json")
        .body(json!({"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"gone","arguments":{}}}).to_string())
        .send()
        .await
        .expect("proxy answers");
    assert_eq!(r.status(), 502);
    tokio::task::spawn_blocking(move || stop(proxy))
        .await
        .expect("stopped");

    let log = log.lock().expect("log").clone();
    let (spans, metrics) = decode(&log, protocol);
    // The session of the traced calls ended with the proxy: its duration was recorded.
    let sessions: Vec<_> = metrics
        .iter()
        .flat_map(|m| &m.resource_metrics)
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .filter(|m| m.name == "mcp.server.session.duration")
        .collect();
    assert!(
        sessions
            .iter()
            .any(|m| matches!(&m.data, Some(Data::Histogram(h))
            if h.data_points.iter().any(|p| p.count > 0
                && attr_str(&p.attributes, "network.protocol.name") == Some("http")))),
        "{protocol}: {sessions:#?}"
    );
    let by_tool = |t: &str| {
        spans
            .iter()
            .find(|(_, s)| attr_str(&s.attributes, "gen_ai.tool.name") == Some(t))
            .unwrap_or_else(|| panic!("a span for {t}: {spans:#?}"))
    };
    let upstream_port = i64::from(
        reqwest::Url::parse(&upstream.url)
            .expect("url")
            .port()
            .expect("port"),
    );
    let (res, delay) = by_tool("delay");
    assert_eq!(hex(&delay.trace_id), TRACE_ID, "the traceparent header");
    assert_eq!(hex(&delay.parent_span_id), PARENT);
    assert_eq!(
        attr_str(&delay.attributes, "network.transport"),
        Some("tcp")
    );
    assert_eq!(
        attr_str(&delay.attributes, "network.protocol.name"),
        Some("http")
    );
    assert_eq!(
        attr_str(&delay.attributes, "server.address"),
        Some("127.0.0.1")
    );
    assert_eq!(
        attr(&delay.attributes, "server.port"),
        Some(&Any::IntValue(upstream_port))
    );
    assert_eq!(attr(&delay.attributes, "error.type"), None);
    assert_eq!(attr_str(res, "service.version"), Some("1.0.0"));
    assert_eq!(attr_str(res, "service.name"), Some("mcp:raw-fixture"));
    let (_, other) = by_tool("other");
    assert_eq!(
        hex(&other.trace_id),
        meta_trace,
        "_meta wins over the header"
    );
    let (_, fail) = by_tool("fail");
    assert_eq!(attr_str(&fail.attributes, "error.type"), Some("transport"));
    assert_eq!(
        attr(&fail.attributes, "bounded.status"),
        Some(&Any::IntValue(503))
    );
    let (_, hang) = by_tool("hang");
    assert_eq!(attr_str(&hang.attributes, "error.type"), Some("cancelled"));
    let (_, gone) = by_tool("gone");
    assert_eq!(attr_str(&gone.attributes, "error.type"), Some("transport"));
    let session = attr_str(&delay.attributes, "mcp.session.id").expect("a session id");
    assert_eq!(session.len(), 16, "the keyed hash, not {RAW_SESSION}");
    for r in &log {
        assert!(
            !contains(&r.body, RAW_SESSION.as_bytes()),
            "{protocol}: the raw Mcp-Session-Id in an OTLP {} body",
            r.path
        );
    }
    for (_, s) in &spans {
        assert_eq!(s.kind, 2);
    }
}

/// `send()` and then read the whole body: the future a client awaits for a whole answer.
trait AndThenBytes {
    fn and_then_bytes(self) -> impl std::future::Future<Output = ()>;
}

impl<F: std::future::Future<Output = reqwest::Result<reqwest::Response>>> AndThenBytes for F {
    async fn and_then_bytes(self) {
        if let Ok(r) = self.await {
            let _ = r.bytes().await;
        }
    }
}

/// A receiver that answers `statuses` in turn (then 200), recording what it got.
fn failing_receiver(statuses: Vec<u16>) -> (SocketAddr, Log) {
    let log: Log = Arc::default();
    let queue = Arc::new(Mutex::new(std::collections::VecDeque::from(statuses)));
    let handler = {
        let log = log.clone();
        move |uri: Uri, headers: HeaderMap, body: Bytes| {
            let log = log.clone();
            let queue = queue.clone();
            async move {
                let status = queue.lock().expect("queue").pop_front().unwrap_or(200);
                if status == 200 {
                    receive(State(log), uri, headers, body).await
                } else {
                    StatusCode::from_u16(status).expect("status")
                }
            }
        }
    };
    let app = Router::new()
        .route("/v1/traces", post(handler.clone()))
        .route("/v1/metrics", post(handler));
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let addr = std_listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
            axum::serve(listener, app).await.expect("serve");
        });
    });
    (addr, log)
}

#[test]
fn a_503_is_retried_once_and_a_400_is_dropped_and_counted() {
    // The first request fails with 503: its one retry delivers it.
    let (addr, log) = failing_receiver(vec![503]);
    let out = wrapper_run(
        "http/protobuf",
        &format!("http://{addr}"),
        &session_input(&[]),
        &[],
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let (spans, _) = decode(&log.lock().expect("log"), "http/protobuf");
    assert_eq!(spans.len(), 6, "{}", out.stderr);
    assert!(out.stderr.contains("spans_dropped=0"), "{}", out.stderr);

    // 400 is not retried: the spans are dropped, counted and said once; the relay is the same.
    let (addr, log) = failing_receiver(vec![400, 400, 400, 400]);
    let out2 = wrapper_run(
        "http/protobuf",
        &format!("http://{addr}"),
        &session_input(&[]),
        &[],
    );
    assert_eq!(out2.code(), Some(0), "{}", out2.stderr);
    assert_eq!(out2.stdout, out.stdout);
    let (spans, _) = decode(&log.lock().expect("log"), "http/protobuf");
    assert!(spans.is_empty(), "{spans:?}");
    assert!(out2.stderr.contains("spans_dropped=6"), "{}", out2.stderr);
    assert_eq!(
        out2.stderr.matches("OTLP export failed").count(),
        1,
        "{}",
        out2.stderr
    );
}

#[test]
fn beside_the_ingest_each_event_is_also_a_span_with_its_id() {
    let (addr, log) = receiver();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("events.jsonl");
    let mut cmd = wrap_fixture(
        &[
            "--otlp-endpoint",
            &format!("http://{addr}"),
            "--ingest",
            &format!("file:{}", file.display()),
            "--flush-ms",
            "100",
        ],
        &["outcomes"],
    );
    clean_otel(&mut cmd);
    let out = run(cmd, &session_input(&[]));
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let mut ids: Vec<String> = std::fs::read_to_string(&file)
        .expect("the file sink")
        .lines()
        .flat_map(|l| {
            let batch: Value = serde_json::from_str(l).expect("a batch");
            batch["events"]
                .as_array()
                .expect("events")
                .iter()
                .map(|e| e["id"].as_str().expect("id").to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    let (spans, _) = decode(&log.lock().expect("log"), "http/protobuf");
    let mut span_ids: Vec<String> = spans
        .iter()
        .map(|(_, s)| {
            attr_str(&s.attributes, "bounded.event.id")
                .expect("event id")
                .to_string()
        })
        .collect();
    ids.sort();
    span_ids.sort();
    assert_eq!(ids.len(), 6);
    assert_eq!(ids, span_ids);
}
