//! OTLP settings: the `--otlp-*` flags, our `BOUNDED_OTLP_*` variables and the standard
//! `OTEL_*` ones, resolved into an [`OtlpConfig`] (or none: export off).
//!
//! Precedence is the flag, then `BOUNDED_OTLP_*`, then the standard variable: the `OTEL_*`
//! variables are shared with the wrapped server (they reach it unchanged), so ours let the
//! sensor be pointed elsewhere than the server's own SDK. Fails open like the rest of the
//! configuration: a bad value gives one warning and OTLP is off (or the one setting ignored);
//! the wrapped server runs whatever happens here. Never puts a header value in a warning, a
//! log line or `Debug` output: headers carry API keys.

use std::time::Duration;

use http::{HeaderName, HeaderValue};
use rustls::pki_types::CertificateDer;

use crate::cli::ObserveArgs;
use crate::config::Env;
use crate::log::redact_url;

pub const ENV_OTLP_ENDPOINT: &str = "BOUNDED_OTLP_ENDPOINT";
pub const ENV_OTLP_PROTOCOL: &str = "BOUNDED_OTLP_PROTOCOL";
pub const ENV_OTLP_HEADERS: &str = "BOUNDED_OTLP_HEADERS";
pub const ENV_OTLP_CA: &str = "BOUNDED_OTLP_CA";

pub const OTEL_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const OTEL_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
pub const OTEL_METRICS_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT";
pub const OTEL_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
pub const OTEL_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
pub const OTEL_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CERTIFICATE";
pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
pub const OTEL_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
pub const OTEL_SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
pub const OTEL_TEMPORALITY: &str = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE";

/// Our OTLP variables (all under `BOUNDED_`, so never passed to the server).
pub const ALL_OTLP_ENV: &[&str] = &[
    ENV_OTLP_ENDPOINT,
    ENV_OTLP_PROTOCOL,
    ENV_OTLP_HEADERS,
    ENV_OTLP_CA,
];

/// Paths appended to a base endpoint (OTLP/HTTP specification).
pub const TRACES_PATH: &str = "/v1/traces";
pub const METRICS_PATH: &str = "/v1/metrics";

/// How the export requests are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `http/protobuf`, the default of the OTLP specification.
    Protobuf,
    /// `http/json`, with the OTLP JSON rules (hex ids, integer enums, 64-bit integers as strings).
    Json,
}

impl Protocol {
    pub fn content_type(self) -> &'static str {
        match self {
            Protocol::Protobuf => "application/x-protobuf",
            Protocol::Json => "application/json",
        }
    }
}

/// Aggregation temporality of the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Temporality {
    Cumulative,
    Delta,
}

/// Resolved OTLP settings. `Debug` names the header keys only.
#[derive(Clone)]
pub struct OtlpConfig {
    /// Full URL spans are posted to; `None`: no spans.
    pub traces: Option<String>,
    /// Full URL metrics are posted to; `None`: no metrics.
    pub metrics: Option<String>,
    pub protocol: Protocol,
    /// Sent with every export request; values are marked sensitive and never printed.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// A private CA trusted besides the default roots (`--otlp-ca`).
    pub ca: Vec<CertificateDer<'static>>,
    /// `OTEL_SERVICE_NAME`, else `service.name` of `OTEL_RESOURCE_ATTRIBUTES`; `None`: the
    /// exporter uses `mcp:<serverName>`.
    pub service_name: Option<String>,
    /// `OTEL_RESOURCE_ATTRIBUTES`, `service.name` taken out.
    pub resource: Vec<(String, String)>,
    pub temporality: Temporality,
    /// How often metrics are exported (spans go with the batch interval, `--flush-ms`).
    pub metrics_interval: Duration,
}

impl std::fmt::Debug for OtlpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("OtlpConfig")
            .field("traces", &self.traces.as_deref().map(redact_url))
            .field("metrics", &self.metrics.as_deref().map(redact_url))
            .field("protocol", &self.protocol)
            .field("headers", &header_names)
            .field("ca", &self.ca.len())
            .field("service_name", &self.service_name)
            .field("resource", &self.resource)
            .field("temporality", &self.temporality)
            .finish()
    }
}

/// Metrics are exported this often (the OTel SDKs' default is 60 s; a sensor's sessions are
/// often short, and the final export at exit covers what is left).
pub const METRICS_INTERVAL: Duration = Duration::from_secs(10);

fn non_empty(v: Option<&String>) -> Option<String> {
    v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// The flag, then ours, then the standard variable; with where it came from.
fn pick(
    flag: Option<&str>,
    flag_name: &'static str,
    env: &Env,
    ours: &'static str,
    standard: &'static str,
) -> Option<(String, &'static str)> {
    if let Some(v) = flag.map(str::trim).filter(|s| !s.is_empty()) {
        return Some((v.to_string(), flag_name));
    }
    if let Some(v) = non_empty(env.get(ours)) {
        return Some((v, ours));
    }
    non_empty(env.get(standard)).map(|v| (v, standard))
}

/// An endpoint URL the client can use: http(s) with a host.
fn check_url(url: &str) -> bool {
    reqwest::Url::parse(url)
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
}

/// `base` with `path` appended as the OTLP/HTTP specification says (one `/` between them).
pub fn signal_url(base: &str, path: &str) -> String {
    format!("{}{path}", base.trim_end_matches('/'))
}

/// W3C-baggage-shaped `key=value,key=value` lists (`OTEL_EXPORTER_OTLP_HEADERS`,
/// `OTEL_RESOURCE_ATTRIBUTES`): values percent-decoded. An entry without `=` or an empty key
/// is skipped and reported by its position only (its text may be a secret).
fn parse_list(s: &str) -> (Vec<(String, String)>, Vec<usize>) {
    let mut out = Vec::new();
    let mut bad = Vec::new();
    for (i, item) in s.split(',').enumerate() {
        if item.trim().is_empty() {
            continue;
        }
        match item.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                out.push((k.trim().to_string(), percent_decode(v.trim())))
            }
            _ => bad.push(i + 1),
        }
    }
    (out, bad)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                // Two hex digits are below 256.
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Resolves the OTLP settings; `None` when export is off. Warnings are plain sentences for
/// [`crate::config::ConfigWarning::Otlp`]; none holds a header value.
pub fn resolve(args: &ObserveArgs, env: &Env, disabled: bool) -> (Option<OtlpConfig>, Vec<String>) {
    let mut warnings = Vec::new();
    let base = pick(
        args.otlp_endpoint.as_deref(),
        "--otlp-endpoint",
        env,
        ENV_OTLP_ENDPOINT,
        OTEL_ENDPOINT,
    );
    // A base given by the flag or our variable is used for both signals; otherwise the standard
    // per-signal variables win over the standard base, as the OTel specification says.
    let (mut traces, mut metrics) = match &base {
        Some((b, origin)) if *origin != OTEL_ENDPOINT => (
            Some((signal_url(b, TRACES_PATH), *origin)),
            Some((signal_url(b, METRICS_PATH), *origin)),
        ),
        _ => {
            let from_base = |path| base.as_ref().map(|(b, o)| (signal_url(b, path), *o));
            (
                non_empty(env.get(OTEL_TRACES_ENDPOINT))
                    .map(|u| (u, OTEL_TRACES_ENDPOINT))
                    .or_else(|| from_base(TRACES_PATH)),
                non_empty(env.get(OTEL_METRICS_ENDPOINT))
                    .map(|u| (u, OTEL_METRICS_ENDPOINT))
                    .or_else(|| from_base(METRICS_PATH)),
            )
        }
    };
    if traces.is_none() && metrics.is_none() {
        return (None, warnings);
    }
    if disabled {
        return (None, warnings);
    }
    if non_empty(env.get(OTEL_SDK_DISABLED)).is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        warnings.push(format!(
            "{OTEL_SDK_DISABLED}=true: OTLP export is off (events still go to the ingest)"
        ));
        return (None, warnings);
    }
    let mut warned: Vec<&str> = Vec::new();
    for slot in [&mut traces, &mut metrics] {
        if let Some((url, origin)) = slot.take() {
            if check_url(&url) {
                *slot = Some((url, origin));
            } else if !warned.contains(&origin) {
                // One base makes both signals' URLs: one warning for it.
                warned.push(origin);
                warnings.push(format!(
                    "OTLP endpoint {:?} from {origin} is not an http(s):// URL: not exported there",
                    redact_url(&url)
                ));
            }
        }
    }
    if traces.is_none() && metrics.is_none() {
        return (None, warnings);
    }

    let protocol = match pick(
        args.otlp_protocol.as_deref(),
        "--otlp-protocol",
        env,
        ENV_OTLP_PROTOCOL,
        OTEL_PROTOCOL,
    ) {
        None => Protocol::Protobuf,
        Some((p, origin)) => match p.as_str() {
            "http/protobuf" => Protocol::Protobuf,
            "http/json" => Protocol::Json,
            other => {
                // gRPC would need an HTTP/2 client and a tonic stack for a few requests a
                // minute; sending http/protobuf to a gRPC port (4317) would only fail. Off,
                // said once, is clearer than a guess.
                warnings.push(format!(
                    "OTLP protocol {other:?} from {origin} is not supported (use http/protobuf or \
                     http/json, usually on port 4318): OTLP export is off"
                ));
                return (None, warnings);
            }
        },
    };

    let mut headers = Vec::new();
    let header_src = non_empty(env.get(ENV_OTLP_HEADERS))
        .map(|h| (h, ENV_OTLP_HEADERS))
        .or_else(|| non_empty(env.get(OTEL_HEADERS)).map(|h| (h, OTEL_HEADERS)));
    if let Some((raw, origin)) = header_src {
        let (list, bad) = parse_list(&raw);
        for (i, (k, v)) in list.into_iter().enumerate() {
            let name = HeaderName::from_bytes(k.as_bytes());
            let value = HeaderValue::from_str(&v);
            match (name, value) {
                (Ok(name), Ok(mut value)) => {
                    value.set_sensitive(true);
                    headers.push((name, value));
                }
                _ => warnings.push(format!(
                    "OTLP header number {} from {origin} is not a valid HTTP header: ignored",
                    i + 1
                )),
            }
        }
        for n in bad {
            warnings.push(format!(
                "OTLP header entry number {n} from {origin} is not key=value: ignored"
            ));
        }
    }

    let mut ca = Vec::new();
    let ca_src = args
        .otlp_ca
        .as_ref()
        .filter(|p| !p.as_os_str().is_empty())
        .map(|p| (p.clone(), "--otlp-ca"))
        .or_else(|| non_empty(env.get(ENV_OTLP_CA)).map(|v| (v.into(), ENV_OTLP_CA)))
        .or_else(|| non_empty(env.get(OTEL_CERTIFICATE)).map(|v| (v.into(), OTEL_CERTIFICATE)));
    if let Some((path, origin)) = ca_src {
        match crate::http_client::load_ca_file(&path) {
            Ok(certs) => ca = certs,
            Err(err) => {
                // As for the ingest: not sent to an endpoint the operator meant to pin.
                warnings.push(format!(
                    "OTLP CA from {origin} is unusable ({err}): OTLP export is off"
                ));
                return (None, warnings);
            }
        }
    }

    let mut resource = Vec::new();
    let mut service_name = None;
    if let Some(raw) = non_empty(env.get(OTEL_RESOURCE_ATTRIBUTES)) {
        let (list, bad) = parse_list(&raw);
        for (k, v) in list {
            if k == "service.name" {
                service_name = Some(v);
            } else {
                resource.push((k, v));
            }
        }
        if !bad.is_empty() {
            warnings.push(format!(
                "{OTEL_RESOURCE_ATTRIBUTES} has {} entries that are not key=value: ignored",
                bad.len()
            ));
        }
    }
    if let Some(n) = non_empty(env.get(OTEL_SERVICE_NAME)) {
        service_name = Some(n);
    }
    let temporality = match non_empty(env.get(OTEL_TEMPORALITY))
        .map(|v| v.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("cumulative") => Temporality::Cumulative,
        // `lowmemory` asks for delta on synchronous counters and histograms: all we have.
        Some("delta") | Some("lowmemory") => Temporality::Delta,
        Some(other) => {
            warnings.push(format!(
                "{OTEL_TEMPORALITY} value {other:?} is not cumulative, delta or lowmemory: using cumulative"
            ));
            Temporality::Cumulative
        }
    };

    (
        Some(OtlpConfig {
            traces: traces.map(|t| t.0),
            metrics: metrics.map(|m| m.0),
            protocol,
            headers,
            ca,
            service_name,
            resource,
            temporality,
            metrics_interval: METRICS_INTERVAL,
        }),
        warnings,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn resolve_with(argv: &[&str], env: &[(&str, &str)]) -> (Option<OtlpConfig>, Vec<String>) {
        let mut full = vec!["bounded-observe-mcp"];
        full.extend_from_slice(argv);
        full.extend_from_slice(&["--", "server"]);
        let cli = crate::cli::Cli::try_parse_from(full).expect("parses");
        let env: Env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        resolve(&cli.args, &env, false)
    }

    #[test]
    fn off_without_an_endpoint() {
        assert!(resolve_with(&[], &[]).0.is_none());
    }

    #[test]
    fn flag_wins_over_ours_which_wins_over_the_standard_variable() {
        let env = [
            (ENV_OTLP_ENDPOINT, "http://ours:4318"),
            (OTEL_ENDPOINT, "http://std:4318"),
            (OTEL_TRACES_ENDPOINT, "http://std-traces:4318/custom"),
        ];
        let (c, _) = resolve_with(&["--otlp-endpoint", "http://flag:4318/"], &env);
        let c = c.expect("on");
        assert_eq!(c.traces.as_deref(), Some("http://flag:4318/v1/traces"));
        assert_eq!(c.metrics.as_deref(), Some("http://flag:4318/v1/metrics"));
        let c = resolve_with(&[], &env).0.expect("on");
        assert_eq!(c.traces.as_deref(), Some("http://ours:4318/v1/traces"));
        let c = resolve_with(&[], &env[1..]).0.expect("on");
        // The standard per-signal variable is used as is, and wins over the standard base.
        assert_eq!(c.traces.as_deref(), Some("http://std-traces:4318/custom"));
        assert_eq!(c.metrics.as_deref(), Some("http://std:4318/v1/metrics"));
    }

    #[test]
    fn protocol_headers_resource_and_temporality_are_read() {
        let (c, w) = resolve_with(
            &["--otlp-protocol", "http/json"],
            &[
                (OTEL_ENDPOINT, "http://127.0.0.1:4318"),
                (OTEL_PROTOCOL, "grpc"),
                (OTEL_HEADERS, "x-honeycomb-team=sekr%3Dt,broken,x-b=2"),
                (
                    OTEL_RESOURCE_ATTRIBUTES,
                    "service.name=svc,deployment.environment=prod",
                ),
                (OTEL_SERVICE_NAME, "payments"),
                (OTEL_TEMPORALITY, "Delta"),
            ],
        );
        let c = c.expect("on");
        assert_eq!(c.protocol, Protocol::Json);
        assert_eq!(c.headers.len(), 2);
        assert_eq!(c.headers[0].1.as_bytes(), b"sekr=t");
        assert!(c.headers[0].1.is_sensitive());
        assert_eq!(c.service_name.as_deref(), Some("payments"));
        assert_eq!(
            c.resource,
            vec![("deployment.environment".to_string(), "prod".to_string())]
        );
        assert_eq!(c.temporality, Temporality::Delta);
        assert_eq!(w.len(), 1, "{w:?}");
        let shown = format!("{c:?} {w:?}");
        assert!(!shown.contains("sekr"), "{shown}");
    }

    #[test]
    fn grpc_and_sdk_disabled_turn_export_off_with_one_warning() {
        let (c, w) = resolve_with(
            &[],
            &[
                (OTEL_ENDPOINT, "http://127.0.0.1:4317"),
                (OTEL_PROTOCOL, "grpc"),
            ],
        );
        assert!(c.is_none());
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("grpc"), "{w:?}");
        let (c, w) = resolve_with(
            &["--otlp-endpoint", "http://127.0.0.1:4318"],
            &[(OTEL_SDK_DISABLED, "true")],
        );
        assert!(c.is_none());
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn an_unusable_ca_turns_export_off_with_one_warning() {
        let (c, w) = resolve_with(
            &["--otlp-endpoint", "https://collector.example:4318"],
            &[(OTEL_CERTIFICATE, "/nonexistent/ca.pem")],
        );
        assert!(c.is_none());
        assert_eq!(w.len(), 1);
        assert!(w[0].contains(OTEL_CERTIFICATE), "{w:?}");
    }

    #[test]
    fn a_bad_endpoint_warns_and_its_url_is_redacted() {
        let (c, w) = resolve_with(&["--otlp-endpoint", "ftp://h/?key=sekret"], &[]);
        assert!(c.is_none());
        assert_eq!(w.len(), 1);
        assert!(!w[0].contains("sekret"), "{w:?}");
    }
}
