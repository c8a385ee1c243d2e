//! One filtered event and its call facts → one OTLP span, named and attributed by the
//! OpenTelemetry MCP semantic conventions (`docs/gen-ai/mcp.md` of
//! open-telemetry/semantic-conventions-genai); and the resource every export carries.
//!
//! Takes only what the L3 filter let through (`bounded.field.<key>` are exactly the event's
//! `rec.fields`) and the facts the observer vetted; never a message text (a span with an error
//! has status ERROR and no description: the JSON-RPC error message is content).

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, Span, Status};
use serde_json::Value;

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

/// The span of one call. `ids` are fresh random ids: a trace id used when the client sent no
/// trace context, and the span's own id.
pub fn span(ev: &Event, facts: &CallFacts, net: &Network, ids: ([u8; 16], [u8; 8])) -> Span {
    let (trace_id, parent, state, flags) = match &facts.trace {
        Some(t) => (
            t.trace_id.to_vec(),
            t.parent_span_id.to_vec(),
            t.state.clone().unwrap_or_default(),
            u32::from(t.flags) | FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE,
        ),
        // A new trace, sampled: the sensor records every call.
        None => (
            ids.0.to_vec(),
            Vec::new(),
            String::new(),
            1 | FLAG_HAS_IS_REMOTE,
        ),
    };
    let tool = ev.rec.action.as_str();
    let mut a = vec![
        kv_str("mcp.method.name", METHOD_TOOLS_CALL),
        kv_str("gen_ai.tool.name", tool),
        kv_str("gen_ai.operation.name", "execute_tool"),
    ];
    if let Some(id) = &facts.request_id {
        a.push(kv_str("jsonrpc.request.id", id));
    }
    if let Some(s) = &ev.session {
        a.push(kv_str("mcp.session.id", &s.id));
        if let Some(p) = &s.protocol {
            a.push(kv_str("mcp.protocol.version", p));
        }
    }
    a.push(kv_str("network.transport", net.transport));
    if let Some(p) = net.protocol_name {
        a.push(kv_str("network.protocol.name", p));
    }
    if let Some((host, port)) = &net.server {
        a.push(kv_str("server.address", host));
        a.push(kv(
            "server.port",
            any_value::Value::IntValue(i64::from(*port)),
        ));
    }
    let error = error_type(ev);
    if let Some(e) = &error {
        a.push(kv_str("error.type", e));
    }
    if let (Some(err), true) = (
        &ev.err,
        matches!(ev.err.as_ref().map(|e| e.kind), Some(ErrKind::Jsonrpc)),
    ) {
        if let Some(code) = err.code {
            a.push(kv_str("rpc.response.status_code", &code.to_string()));
        }
    }
    a.push(kv_str("bounded.event.id", &ev.id));
    a.push(kv(
        "bounded.status",
        any_value::Value::IntValue(i64::from(ev.status)),
    ));
    a.push(kv_str("bounded.actor.id", &ev.actor.id));
    if let Some(o) = &ev.on_behalf_of {
        a.push(kv_str("bounded.on_behalf_of", o));
    }
    if let Some(r) = &ev.rec.registry_version {
        a.push(kv_str("bounded.registry_version", r));
    }
    if let Some(fields) = &ev.rec.fields {
        for (k, v) in fields {
            let value = match v {
                Value::String(s) => any_value::Value::StringValue(s.clone()),
                Value::Bool(b) => any_value::Value::BoolValue(*b),
                Value::Number(n) => match n.as_i64() {
                    Some(i) => any_value::Value::IntValue(i),
                    None => match n.as_f64() {
                        Some(f) => any_value::Value::DoubleValue(f),
                        None => continue,
                    },
                },
                // L3 keeps scalars only; anything else is not exported.
                _ => continue,
            };
            a.push(kv(&format!("bounded.field.{k}"), value));
        }
    }
    let status = Status {
        code: if error.is_some() {
            StatusCode::Error as i32
        } else {
            StatusCode::Unset as i32
        },
        // Never the JSON-RPC error message: it is content.
        message: String::new(),
    };
    Span {
        trace_id,
        span_id: ids.1.to_vec(),
        trace_state: state,
        parent_span_id: parent,
        flags,
        name: format!("{METHOD_TOOLS_CALL} {tool}"),
        kind: SpanKind::Server as i32,
        start_time_unix_nano: unix_nanos(facts.start),
        end_time_unix_nano: unix_nanos(facts.end),
        attributes: a,
        status: Some(status),
        ..Default::default()
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

/// The default `service.name` when the server's name is not known: `mcp:` and `dest.host`
/// (`mcp://<name>` in stdio mode, the upstream's `host[:port]` in HTTP mode).
pub fn default_service_name(dest_host: &str) -> String {
    format!(
        "mcp:{}",
        dest_host.strip_prefix("mcp://").unwrap_or(dest_host)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::metrics::v1::{ResourceMetrics, ScopeMetrics};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
    use serde_json::{json, Value};

    fn sample_span() -> Span {
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
        h.record(vec![("k", "v".into())], 0.5, 5);
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
