//! One filtered event and its call facts → one OTLP span, named and attributed by the
//! OpenTelemetry MCP semantic conventions (`docs/gen-ai/mcp.md` of
//! open-telemetry/semantic-conventions-genai); and the resource every export carries.
//!
//! Takes only what the L3 filter let through (`bounded.field.<key>` are exactly the event's
//! `rec.fields`) and the facts the observer vetted; never a message text (a span with an error
//! has status ERROR and no description: the JSON-RPC error message is content).

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span::SpanKind, status::StatusCode, ResourceSpans, ScopeSpans, Span, Status,
};
use serde_json::Value;

use super::config::Protocol;
use crate::event::call::CallFacts;
use crate::event::{ErrKind, Event};

/// `mcp.method.name` of every span and operation metric point: one per `tools/call`.
pub const METHOD_TOOLS_CALL: &str = "tools/call";
/// Name and version of the instrumentation scope and `telemetry.sdk.*`.
pub const SDK_NAME: &str = "bounded-observe-mcp";
pub const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

/// `Span.flags`: the context-has-is-remote bit and the is-remote bit (OTLP trace.proto).
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
const FLAG_IS_REMOTE: u32 = 0x200;

/// How the sensor reaches the server, for `network.*` and `server.*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    /// `pipe` (stdio) or `tcp` (HTTP).
    pub transport: &'static str,
    /// `http` in HTTP mode.
    pub protocol_name: Option<&'static str>,
    /// The upstream's host and port in HTTP mode.
    pub server: Option<(String, u16)>,
}

impl Network {
    pub fn stdio() -> Network {
        Network {
            transport: "pipe",
            protocol_name: None,
            server: None,
        }
    }

    /// HTTP mode towards `upstream` (a URL; its host and port, the scheme's default port when
    /// none is written).
    pub fn http(upstream: &str) -> Network {
        let server = reqwest::Url::parse(upstream).ok().and_then(|u| {
            let host = u.host_str()?.trim_start_matches('[').trim_end_matches(']');
            Some((host.to_string(), u.port_or_known_default()?))
        });
        Network {
            transport: "tcp",
            protocol_name: Some("http"),
            server,
        }
    }
}

pub fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

pub fn kv_str(key: &str, v: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.to_string()))
}

/// `error.type` of an ended call (the conventions: the JSON-RPC code as a string, `tool_error`
/// for `isError`), or `None` on success.
pub fn error_type(ev: &Event) -> Option<String> {
    let err = ev.err.as_ref()?;
    Some(match err.kind {
        ErrKind::Jsonrpc => err
            .code
            .map_or_else(|| "_OTHER".to_string(), |c| c.to_string()),
        ErrKind::Tool => "tool_error".into(),
        ErrKind::Timeout => "timeout".into(),
        ErrKind::Cancelled => "cancelled".into(),
        ErrKind::Transport => "transport".into(),
    })
}

/// One attribute value, borrowed: what both span encodings take.
#[derive(Debug, Clone, Copy)]
enum Attr<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
    Double(f64),
}

/// Where a span's attributes go: the `Span` message's list ([`span`]) or straight into
/// protobuf bytes ([`encode_span`]). A key is written as `prefix` then `suffix`, so that
/// `bounded.field.<key>` costs no allocation.
trait AttrOut {
    fn put(&mut self, prefix: &str, suffix: &str, v: Attr<'_>);
    fn str(&mut self, key: &str, v: &str) {
        self.put(key, "", Attr::Str(v));
    }
}

impl AttrOut for Vec<KeyValue> {
    fn put(&mut self, prefix: &str, suffix: &str, v: Attr<'_>) {
        let v = match v {
            Attr::Str(s) => any_value::Value::StringValue(s.to_string()),
            Attr::Int(i) => any_value::Value::IntValue(i),
            Attr::Bool(b) => any_value::Value::BoolValue(b),
            Attr::Double(f) => any_value::Value::DoubleValue(f),
        };
        self.push(kv(&format!("{prefix}{suffix}"), v));
    }
}

/// The attributes of one call's span, in order: the one list both encodings write.
fn attributes(ev: &Event, facts: &CallFacts, net: &Network, a: &mut impl AttrOut) {
    a.str("mcp.method.name", METHOD_TOOLS_CALL);
    a.str("gen_ai.tool.name", &ev.rec.action);
    a.str("gen_ai.operation.name", "execute_tool");
    if let Some(id) = &facts.request_id {
        a.str("jsonrpc.request.id", id);
    }
    if let Some(s) = &ev.session {
        a.str("mcp.session.id", &s.id);
        if let Some(p) = &s.protocol {
            a.str("mcp.protocol.version", p);
        }
    }
    a.str("network.transport", net.transport);
    if let Some(p) = net.protocol_name {
        a.str("network.protocol.name", p);
    }
    if let Some((host, port)) = &net.server {
        a.str("server.address", host);
        a.put("server.port", "", Attr::Int(i64::from(*port)));
    }
    if let Some(e) = error_type(ev) {
        a.str("error.type", &e);
    }
    if let Some(err) = ev.err.as_ref().filter(|e| e.kind == ErrKind::Jsonrpc) {
        if let Some(code) = err.code {
            a.str("rpc.response.status_code", &code.to_string());
        }
    }
    a.str("bounded.event.id", &ev.id);
    a.put("bounded.status", "", Attr::Int(i64::from(ev.status)));
    a.str("bounded.actor.id", &ev.actor.id);
    if let Some(o) = &ev.on_behalf_of {
        a.str("bounded.on_behalf_of", o);
    }
    if let Some(r) = &ev.rec.registry_version {
        a.str("bounded.registry_version", r);
    }
    for (k, v) in ev.rec.fields.iter().flatten() {
        let value = match v {
            Value::String(s) => Attr::Str(s),
            Value::Bool(b) => Attr::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => Attr::Int(i),
                (None, Some(f)) => Attr::Double(f),
                (None, None) => continue,
            },
            // L3 keeps scalars only; anything else is not exported.
            _ => continue,
        };
        a.put("bounded.field.", k, value);
    }
}

/// Trace id, parent span id, trace state and flags: the client's context, or a new sampled
/// trace with `trace_id`.
fn lineage<'a>(facts: &'a CallFacts, trace_id: &'a [u8; 16]) -> (&'a [u8], &'a [u8], &'a str, u32) {
    match &facts.trace {
        Some(t) => (
            &t.trace_id,
            &t.parent_span_id,
            t.state.as_deref().unwrap_or_default(),
            u32::from(t.flags) | FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE,
        ),
        // A new trace, sampled: the sensor records every call.
        None => (trace_id, &[], "", 1 | FLAG_HAS_IS_REMOTE),
    }
}

/// The span of one call. `ids` are fresh random ids: a trace id used when the client sent no
/// trace context, and the span's own id.
pub fn span(ev: &Event, facts: &CallFacts, net: &Network, ids: ([u8; 16], [u8; 8])) -> Span {
    let (trace_id, parent, state, flags) = lineage(facts, &ids.0);
    let mut attributes_list = Vec::new();
    attributes(ev, facts, net, &mut attributes_list);
    Span {
        trace_id: trace_id.to_vec(),
        span_id: ids.1.to_vec(),
        trace_state: state.to_string(),
        parent_span_id: parent.to_vec(),
        flags,
        name: format!("{METHOD_TOOLS_CALL} {}", ev.rec.action),
        kind: SpanKind::Server as i32,
        start_time_unix_nano: unix_nanos(facts.start),
        end_time_unix_nano: unix_nanos(facts.end),
        attributes: attributes_list,
        status: Some(status(ev.err.is_some())),
        ..Default::default()
    }
}

/// Status ERROR for a call that ended in an error, else UNSET; never a description (the
/// JSON-RPC error message is content).
fn status(error: bool) -> Status {
    Status {
        code: if error {
            StatusCode::Error as i32
        } else {
            StatusCode::Unset as i32
        },
        message: String::new(),
    }
}

/// Protobuf writing for [`encode_span`]: the wire format's pieces (`prost::encoding`), for the
/// few field kinds a span uses.
mod pb {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};

    pub fn len_field_len(tag: u32, len: usize) -> usize {
        prost::encoding::key_len(tag) + encoded_len_varint(len as u64) + len
    }

    pub fn len_prefix(tag: u32, len: usize, buf: &mut Vec<u8>) {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(len as u64, buf);
    }

    /// A `string` or `bytes` field; skipped when empty, as prost does for a proto3 scalar.
    pub fn bytes(tag: u32, v: &[u8], buf: &mut Vec<u8>) {
        if !v.is_empty() {
            len_prefix(tag, v.len(), buf);
            buf.extend_from_slice(v);
        }
    }

    pub fn varint(tag: u32, v: u64, buf: &mut Vec<u8>) {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(v, buf);
    }

    pub fn fixed64(tag: u32, v: u64, buf: &mut Vec<u8>) {
        if v != 0 {
            encode_key(tag, WireType::SixtyFourBit, buf);
            buf.extend_from_slice(&v.to_le_bytes());
        }
    }

    pub fn fixed32(tag: u32, v: u32, buf: &mut Vec<u8>) {
        if v != 0 {
            encode_key(tag, WireType::ThirtyTwoBit, buf);
            buf.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// Attributes written as `Span.attributes` (field 9) entries: `KeyValue { key: 1, value: 2 }`,
/// `AnyValue { string: 1 | bool: 2 | int: 3 | double: 4 }`.
struct ProtoAttrs<'b>(&'b mut Vec<u8>);

impl AttrOut for ProtoAttrs<'_> {
    fn put(&mut self, prefix: &str, suffix: &str, v: Attr<'_>) {
        use prost::encoding::{encode_key, encoded_len_varint, key_len, WireType};
        let value_len = match v {
            Attr::Str(s) => pb::len_field_len(1, s.len()),
            Attr::Int(i) => key_len(3) + encoded_len_varint(i as u64),
            Attr::Bool(_) => key_len(2) + 1,
            Attr::Double(_) => key_len(4) + 8,
        };
        let key_len_ = prefix.len() + suffix.len();
        let kv_len = pb::len_field_len(1, key_len_) + pb::len_field_len(2, value_len);
        let buf = &mut *self.0;
        pb::len_prefix(9, kv_len, buf);
        pb::len_prefix(1, key_len_, buf);
        buf.extend_from_slice(prefix.as_bytes());
        buf.extend_from_slice(suffix.as_bytes());
        pb::len_prefix(2, value_len, buf);
        // A oneof member is written even when it holds its type's default.
        match v {
            Attr::Str(s) => {
                pb::len_prefix(1, s.len(), buf);
                buf.extend_from_slice(s.as_bytes());
            }
            Attr::Int(i) => pb::varint(3, i as u64, buf),
            Attr::Bool(b) => pb::varint(2, u64::from(b), buf),
            Attr::Double(f) => {
                encode_key(4, WireType::SixtyFourBit, buf);
                buf.extend_from_slice(&f.to_le_bytes());
            }
        }
    }
}

/// [`span`] as protobuf bytes, appended to `buf`, without building the message: the same
/// bytes as `span(…).encode_to_vec()` (a test holds them equal), with no allocation per
/// attribute. Fields in the order prost writes them: by tag.
pub fn encode_span(
    ev: &Event,
    facts: &CallFacts,
    net: &Network,
    ids: ([u8; 16], [u8; 8]),
    buf: &mut Vec<u8>,
) {
    let (trace_id, parent, state, flags) = lineage(facts, &ids.0);
    pb::bytes(1, trace_id, buf);
    pb::bytes(2, &ids.1, buf);
    pb::bytes(3, state.as_bytes(), buf);
    pb::bytes(4, parent, buf);
    let prefix = METHOD_TOOLS_CALL.len() + 1;
    pb::len_prefix(5, prefix + ev.rec.action.len(), buf);
    buf.extend_from_slice(METHOD_TOOLS_CALL.as_bytes());
    buf.push(b' ');
    buf.extend_from_slice(ev.rec.action.as_bytes());
    pb::varint(6, SpanKind::Server as u64, buf);
    pb::fixed64(7, unix_nanos(facts.start), buf);
    pb::fixed64(8, unix_nanos(facts.end), buf);
    attributes(ev, facts, net, &mut ProtoAttrs(buf));
    // `status` is always set, so always written, even when empty (code UNSET).
    prost::encoding::message::encode(15, &status(ev.err.is_some()), buf);
    pb::fixed32(16, flags, buf);
}

/// The spans of the next export request, kept in the configured protocol's form: for
/// http/protobuf, each call's span is written as bytes when the call is taken, so no `Span`
/// message is built or held (building one allocated for each attribute, and holding 512 of them
/// freed thousands of blocks at once at each export); for http/json, the messages themselves.
#[derive(Debug)]
pub enum SpanBatch {
    Protobuf {
        /// `ScopeSpans.spans` entries (field 2), each with its key and length.
        spans: Vec<u8>,
        count: usize,
        /// One span's bytes while its length is not known yet.
        scratch: Vec<u8>,
    },
    Json(Vec<Span>),
}

impl SpanBatch {
    pub fn new(protocol: Protocol) -> SpanBatch {
        match protocol {
            Protocol::Protobuf => SpanBatch::Protobuf {
                spans: Vec::new(),
                count: 0,
                scratch: Vec::new(),
            },
            Protocol::Json => SpanBatch::Json(Vec::new()),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            SpanBatch::Protobuf { count, .. } => *count,
            SpanBatch::Json(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds the span of one call (see [`span`]).
    pub fn push(&mut self, ev: &Event, facts: &CallFacts, net: &Network, ids: ([u8; 16], [u8; 8])) {
        match self {
            SpanBatch::Protobuf {
                spans,
                count,
                scratch,
            } => {
                scratch.clear();
                encode_span(ev, facts, net, ids, scratch);
                pb::len_prefix(2, scratch.len(), spans);
                spans.extend_from_slice(scratch);
                *count += 1;
            }
            SpanBatch::Json(v) => v.push(span(ev, facts, net, ids)),
        }
    }

    /// The export request (`ExportTraceServiceRequest`) carrying the spans under `resource` and
    /// `scope`, in the batch's protocol; empties the batch. The protobuf form is the bytes prost
    /// writes for the same request (a test holds them equal).
    pub fn take(
        &mut self,
        resource: Resource,
        scope: InstrumentationScope,
    ) -> Result<Vec<u8>, serde_json::Error> {
        match self {
            SpanBatch::Protobuf { spans, count, .. } => {
                use prost::encoding::message;
                // ExportTraceServiceRequest { resource_spans: 1 } → ResourceSpans { resource: 1,
                // scope_spans: 2 } → ScopeSpans { scope: 1, spans: 2 }; empty schema URLs are
                // not written.
                let scope_len = message::encoded_len(1, &scope) + spans.len();
                let resource_len =
                    message::encoded_len(1, &resource) + pb::len_field_len(2, scope_len);
                let mut out = Vec::with_capacity(pb::len_field_len(1, resource_len));
                pb::len_prefix(1, resource_len, &mut out);
                message::encode(1, &resource, &mut out);
                pb::len_prefix(2, scope_len, &mut out);
                message::encode(1, &scope, &mut out);
                out.extend_from_slice(spans);
                spans.clear();
                *count = 0;
                Ok(out)
            }
            SpanBatch::Json(v) => serde_json::to_vec(&ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    resource: Some(resource),
                    scope_spans: vec![ScopeSpans {
                        scope: Some(scope),
                        spans: std::mem::take(v),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            }),
        }
    }
}

/// Nanoseconds since the Unix epoch (0 before it).
pub fn unix_nanos(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The resource of every export: `service.name` (configured, else `mcp:<serverName>`),
/// `service.version` from `serverInfo.version`, `telemetry.sdk.*`, plus
/// `OTEL_RESOURCE_ATTRIBUTES`.
pub fn resource(
    service_name: &str,
    service_version: Option<&str>,
    extra: &[(String, String)],
) -> Resource {
    let mut attributes = vec![kv_str("service.name", service_name)];
    if let Some(v) = service_version {
        attributes.push(kv_str("service.version", v));
    }
    attributes.push(kv_str("telemetry.sdk.name", SDK_NAME));
    attributes.push(kv_str("telemetry.sdk.version", SDK_VERSION));
    attributes.push(kv_str("telemetry.sdk.language", "rust"));
    for (k, v) in extra {
        if !attributes.iter().any(|a| a.key == *k) {
            attributes.push(kv_str(k, v));
        }
    }
    Resource {
        attributes,
        ..Default::default()
    }
}

pub fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: SDK_NAME.to_string(),
        version: SDK_VERSION.to_string(),
        ..Default::default()
    }
}

/// `service.name`, as a prefix and the rest (so that it can be compared without being built):
/// the configured name; else `mcp:` and the server's name; else `mcp:` and `dest.host`
/// (`mcp://<name>` in stdio mode, the upstream's `host[:port]` in HTTP mode).
pub fn service_name<'a>(
    configured: Option<&'a str>,
    server_name: Option<&'a str>,
    dest_host: &'a str,
) -> (&'static str, &'a str) {
    match (configured, server_name) {
        (Some(n), _) => ("", n),
        (None, Some(n)) => ("mcp:", n),
        (None, None) => (
            "mcp:",
            dest_host.strip_prefix("mcp://").unwrap_or(dest_host),
        ),
    }
}

/// The default `service.name` when the server's name is not known (see [`service_name`]).
pub fn default_service_name(dest_host: &str) -> String {
    let (prefix, rest) = service_name(None, None, dest_host);
    format!("{prefix}{rest}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::metrics::v1::{ResourceMetrics, ScopeMetrics};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
    use serde_json::{json, Value};

    /// The filter's sample event, and facts of a 3 ms call without trace context.
    fn sample_call() -> (Event, CallFacts) {
        let ev: Event = serde_json::from_value(crate::event::filter::tests::sample())
            .expect("the sample is an Event");
        let start =
            std::time::UNIX_EPOCH + std::time::Duration::from_nanos(1_700_000_000_123_456_789);
        let facts = CallFacts {
            start,
            end: start + std::time::Duration::from_millis(3),
            request_id: Some("7".into()),
            trace: None,
            listed: true,
            server_version: None,
            server_name: None,
        };
        (ev, facts)
    }

    fn sample_span() -> Span {
        let (ev, facts) = sample_call();
        span(
            &ev,
            &facts,
            &Network::http("http://127.0.0.1:8080/mcp"),
            ([0xab; 16], [0xcd; 8]),
        )
    }

    /// The OTLP JSON encoding rules, on what `opentelemetry-proto`'s serde mapping writes: ids
    /// as lower-case hex, enums as integers, 64-bit integers as decimal strings, camelCase.
    #[test]
    fn the_json_mapping_follows_the_otlp_json_rules() {
        let req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(resource("mcp:x", Some("1.0"), &[])),
                scope_spans: vec![ScopeSpans {
                    scope: Some(scope()),
                    spans: vec![sample_span()],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let v: Value = serde_json::to_value(&req).expect("serialises");
        let s = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(s["traceId"], json!("ab".repeat(16)));
        assert_eq!(s["spanId"], json!("cd".repeat(8)));
        assert_eq!(s["kind"], json!(2));
        assert_eq!(s["startTimeUnixNano"], json!("1700000000123456789"));
        assert_eq!(s["endTimeUnixNano"], json!("1700000000126456789"));
        let port = s["attributes"]
            .as_array()
            .expect("attributes")
            .iter()
            .find(|a| a["key"] == json!("server.port"))
            .expect("server.port");
        assert_eq!(port["value"], json!({"intValue": "8080"}));
        // And it reads back as the same message.
        let back: ExportTraceServiceRequest = serde_json::from_value(v).expect("reads back");
        assert_eq!(back, req);

        let mut h = super::super::metrics::Histograms::new("m", "d");
        h.record(&mut [("k", "v")], 0.5, 5);
        let metric = h
            .export(9, super::super::config::Temporality::Cumulative)
            .expect("metric");
        let req = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![metric],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let v: Value = serde_json::to_value(&req).expect("serialises");
        let m = &v["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0];
        let p = &m["histogram"]["dataPoints"][0];
        assert_eq!(m["histogram"]["aggregationTemporality"], json!(2));
        assert_eq!(p["count"], json!("1"));
        assert_eq!(p["timeUnixNano"], json!("9"));
        assert_eq!(p["bucketCounts"][5], json!("1"));
        assert_eq!(p["explicitBounds"][0], json!(0.01));
    }

    /// Events and facts that between them set every attribute and span field the encoder
    /// writes: both trace origins, each error kind, every kind of captured value, a long tool
    /// name (multi-byte lengths), no session, both networks.
    fn varied_calls() -> Vec<(Event, CallFacts, Network)> {
        let (base, mut facts) = sample_call();
        facts.server_version = Some("1.2.3".into());
        facts.server_name = Some("payments".into());
        let mut out = Vec::new();
        out.push((base.clone(), facts.clone(), Network::stdio()));
        out.push((
            base.clone(),
            facts.clone(),
            Network::http("http://127.0.0.1:8080/mcp"),
        ));
        let mut ev = base.clone();
        ev.err = Some(crate::event::EventErr {
            kind: ErrKind::Jsonrpc,
            code: Some(-32601),
            fp: Some("0011223344556677".into()),
        });
        ev.on_behalf_of = Some("user:42".into());
        ev.session = None;
        let mut f = facts.clone();
        f.trace = Some(crate::event::call::TraceContext {
            trace_id: [0x11; 16],
            parent_span_id: [0x22; 8],
            flags: 1,
            state: Some("vendor=abc".into()),
        });
        f.request_id = None;
        out.push((ev, f, Network::stdio()));
        let mut ev = base.clone();
        ev.err = Some(crate::event::EventErr {
            kind: ErrKind::Tool,
            code: None,
            fp: None,
        });
        ev.rec.action = "t".repeat(200).into();
        ev.rec.registry_version = None;
        ev.rec.fields = Some(
            serde_json::from_value(json!({
                "a_str": "", "b_bool": false, "c_true": true, "d_zero": 0, "e_neg": -5,
                "f_float": 2.5, "g_big": 18446744073709551615u64, "h_long": "x".repeat(150)
            }))
            .expect("a map"),
        );
        let mut f = facts.clone();
        f.trace = Some(crate::event::call::TraceContext {
            trace_id: [0x33; 16],
            parent_span_id: [0x44; 8],
            flags: 0,
            state: None,
        });
        out.push((ev, f, Network::http("https://example.test/mcp")));
        let mut ev = base;
        ev.err = Some(crate::event::EventErr {
            kind: ErrKind::Timeout,
            code: None,
            fp: None,
        });
        ev.rec.fields = None;
        let mut f = facts;
        f.start = std::time::UNIX_EPOCH;
        f.end = std::time::UNIX_EPOCH;
        out.push((ev, f, Network::stdio()));
        out
    }

    #[test]
    fn written_spans_are_the_bytes_prost_writes_for_the_same_request() {
        let calls = varied_calls();
        let ids = |i: usize| ([i as u8 + 1; 16], [i as u8 + 0x80; 8]);
        let res = resource(
            "mcp:payments",
            Some("1.2.3"),
            &[("deployment".into(), "x".into())],
        );
        // One span alone, and all of them in one batch (a request far past 127 bytes).
        for n in [1, calls.len()] {
            let mut batch = SpanBatch::new(Protocol::Protobuf);
            let mut spans = Vec::new();
            for (i, (ev, facts, net)) in calls.iter().take(n).enumerate() {
                let mut own = Vec::new();
                encode_span(ev, facts, net, ids(i), &mut own);
                let message = span(ev, facts, net, ids(i));
                assert_eq!(own, prost::Message::encode_to_vec(&message), "call {i}");
                batch.push(ev, facts, net, ids(i));
                spans.push(message);
            }
            assert_eq!(batch.len(), n);
            let req = ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    resource: Some(res.clone()),
                    scope_spans: vec![ScopeSpans {
                        scope: Some(scope()),
                        spans,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            };
            let ours = batch.take(res.clone(), scope()).expect("encodes");
            assert_eq!(ours, prost::Message::encode_to_vec(&req));
            assert!(batch.is_empty());
            // The JSON batch is the request's OTLP JSON.
            let mut batch = SpanBatch::new(Protocol::Json);
            for (i, (ev, facts, net)) in calls.iter().take(n).enumerate() {
                batch.push(ev, facts, net, ids(i));
            }
            let json = batch.take(res.clone(), scope()).expect("encodes");
            assert_eq!(json, serde_json::to_vec(&req).expect("serialises"));
        }
    }

    #[test]
    fn an_error_has_status_error_and_no_message() {
        let mut ev: Event = serde_json::from_value(crate::event::filter::tests::sample())
            .expect("the sample is an Event");
        ev.err = Some(crate::event::EventErr {
            kind: ErrKind::Jsonrpc,
            code: Some(-32601),
            fp: None,
        });
        assert_eq!(error_type(&ev).as_deref(), Some("-32601"));
        ev.err = Some(crate::event::EventErr {
            kind: ErrKind::Tool,
            code: None,
            fp: None,
        });
        assert_eq!(error_type(&ev).as_deref(), Some("tool_error"));
        let s = sample_span();
        assert_eq!(
            s.name,
            format!("tools/call {}", attr(&s, "gen_ai.tool.name"))
        );
        assert_eq!(attr(&s, "network.transport"), "tcp");
        assert_eq!(attr(&s, "server.address"), "127.0.0.1");
    }

    fn attr(s: &Span, k: &str) -> String {
        match s
            .attributes
            .iter()
            .find(|a| a.key == k)
            .and_then(|a| a.value.clone())
            .and_then(|v| v.value)
        {
            Some(any_value::Value::StringValue(v)) => v,
            other => format!("{other:?}"),
        }
    }
}
