//! The OTLP exporter task: queue → L3 filter → spans and metric points → batches → POST with
//! one retry → counted.
//!
//! The reporter's discipline (`crate::report`): it runs on the observer's runtime, never on a
//! relay thread; one request in flight at a time (so at most one per signal); a failed request
//! is retried once after 250–500 ms (or the endpoint's `Retry-After`, capped), classified by
//! [`crate::report::retry::is_retriable`]; a batch that still fails is dropped and counted, and
//! the next waits out a growing pause ([`crate::report::retry::Cooldown`]), while the bounded
//! queue in front drops the newest and counts. Never logs a header, never a body; each kind of
//! failure is logged once.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::{ResourceMetrics, ScopeMetrics};
use tokio::sync::{mpsc, watch};

use super::config::{OtlpConfig, Protocol};
use super::metrics::{self, CounterSource, Histograms, SensorCounts};
use super::span::{self, Network, SpanBatch};
use super::Item;
use crate::report::retry::{self, DeliveryError};
use crate::report::Tuning;

/// Most spans in one export request: small requests (tens of KB) that any Collector or hosted
/// backend takes, sent as soon as they fill.
pub const MAX_BATCH_SPANS: usize = 512;

/// Totals shared with the handle (readable after the task was abandoned at the deadline).
#[derive(Debug, Default)]
pub struct Shared {
    pub accepted: AtomicU64,
    pub queue_dropped: AtomicU64,
    pub spans_sent: AtomicU64,
    pub spans_dropped: AtomicU64,
    pub filtered: AtomicU64,
    /// Calls taken with no traces endpoint (metrics only): no span to send.
    pub untraced: AtomicU64,
    pub metric_exports: AtomicU64,
    pub metric_failures: AtomicU64,
}

/// What the exporter needs besides its queue.
pub(crate) struct Exporter {
    pub rx: mpsc::Receiver<Item>,
    pub cfg: OtlpConfig,
    pub net: Network,
    pub client: reqwest::Client,
    pub flush: Duration,
    pub debug: bool,
    pub tuning: Tuning,
    pub deadline: watch::Receiver<Option<tokio::time::Instant>>,
    pub shared: Arc<Shared>,
    pub counters: Option<CounterSource>,
    pub pacer: Option<Arc<crate::pace::Pacer>>,
}

struct State {
    spans: SpanBatch,
    /// Resource of the spans in `spans`: (service name, service version).
    resource: Option<(String, Option<String>)>,
    /// The latest resource seen (for metrics).
    current: (String, Option<String>),
    ops: Histograms,
    sessions: Histograms,
    start: u64,
    last_metrics: u64,
    last_counts: SensorCounts,
    cooldown: retry::Cooldown,
    resume_at: Option<tokio::time::Instant>,
    logged: std::collections::HashSet<&'static str>,
}

impl Exporter {
    pub(crate) async fn run(mut self) {
        let now = span::unix_nanos(SystemTime::now());
        let mut st = State {
            spans: SpanBatch::new(self.cfg.protocol),
            resource: None,
            current: (
                self.cfg
                    .service_name
                    .clone()
                    .unwrap_or_else(|| span::default_service_name("mcp://mcp")),
                None,
            ),
            ops: Histograms::new(
                "mcp.server.operation.duration",
                "MCP request duration as observed on the server side.",
            ),
            sessions: Histograms::new(
                "mcp.server.session.duration",
                "The duration of the MCP session as observed on the MCP server.",
            ),
            start: now,
            last_metrics: now,
            last_counts: SensorCounts::default(),
            cooldown: retry::Cooldown::new(self.tuning.cooldown_min, self.tuning.cooldown_max),
            resume_at: None,
            logged: Default::default(),
        };
        let mut span_tick = tokio::time::interval(self.flush);
        let mut metric_tick = tokio::time::interval(self.cfg.metrics_interval);
        span_tick.tick().await;
        metric_tick.tick().await;
        loop {
            let cooling = st
                .resume_at
                .is_some_and(|t| t > tokio::time::Instant::now());
            let room = st.spans.len() < MAX_BATCH_SPANS;
            tokio::select! {
                biased;
                changed = self.deadline.changed() => {
                    if changed.is_err() || self.deadline.borrow().is_some() {
                        break;
                    }
                }
                item = self.rx.recv(), if room => match item {
                    Some(item) => {
                        self.take(&mut st, item);
                        if let Some(p) = &self.pacer {
                            p.pace();
                        }
                        if st.spans.len() >= MAX_BATCH_SPANS && !cooling {
                            self.send_spans(&mut st).await;
                        }
                    }
                    None => break,
                },
                _ = span_tick.tick(), if !cooling => {
                    if !st.spans.is_empty() {
                        self.send_spans(&mut st).await;
                    }
                }
                _ = metric_tick.tick(), if !cooling => self.send_metrics(&mut st).await,
                _ = sleep_until(st.resume_at), if cooling => st.resume_at = None,
            }
        }
        // Final flush: what is queued, then the last spans and metrics, by the deadline (the
        // handle abandons this task at the deadline whatever it is doing).
        while let Ok(item) = self.rx.try_recv() {
            self.take(&mut st, item);
            if st.spans.len() >= MAX_BATCH_SPANS {
                self.send_spans(&mut st).await;
            }
        }
        if !st.spans.is_empty() {
            self.send_spans(&mut st).await;
        }
        self.send_metrics(&mut st).await;
    }

    fn take(&self, st: &mut State, item: Item) {
        match item {
            Item::Call(call) => {
                let (event, facts) = *call;
                let Ok(ev) = crate::event::filter_event(event) else {
                    self.shared.filtered.fetch_add(1, Relaxed);
                    return;
                };
                let (prefix, rest) = span::service_name(
                    self.cfg.service_name.as_deref(),
                    facts.server_name.as_deref(),
                    &ev.dest.host,
                );
                let version = facts.server_version.as_deref();
                let (service, current_version) = &st.current;
                // Most calls name the resource of the last one: compared, not rebuilt.
                let same = service.len() == prefix.len() + rest.len()
                    && service.starts_with(prefix)
                    && service.ends_with(rest)
                    && current_version.as_deref() == version;
                if !same {
                    st.current = (format!("{prefix}{rest}"), version.map(str::to_string));
                }
                if self.cfg.metrics.is_some() {
                    let error = span::error_type(&ev);
                    let mut attrs = [
                        ("mcp.method.name", span::METHOD_TOOLS_CALL),
                        (
                            "gen_ai.tool.name",
                            metrics::tool_attribute(&ev.rec.action, facts.listed),
                        ),
                        ("network.transport", self.net.transport),
                        ("", ""),
                        ("", ""),
                    ];
                    let mut n = 3;
                    if let Some(e) = &error {
                        attrs[n] = ("error.type", e);
                        n += 1;
                    }
                    if let Some(p) = ev.session.as_ref().and_then(|s| s.protocol.as_ref()) {
                        attrs[n] = ("mcp.protocol.version", p);
                        n += 1;
                    }
                    let secs = facts
                        .end
                        .duration_since(facts.start)
                        .unwrap_or_default()
                        .as_secs_f64();
                    st.ops
                        .record(&mut attrs[..n], secs, span::unix_nanos(SystemTime::now()));
                }
                if self.cfg.traces.is_none() {
                    self.shared.untraced.fetch_add(1, Relaxed);
                    return;
                }
                let (Ok(trace), Ok(span_id)) =
                    (crate::random::pooled::<16>(), crate::random::pooled::<8>())
                else {
                    self.shared.spans_dropped.fetch_add(1, Relaxed);
                    return;
                };
                // A batch carries one resource, the latest: the server's name and version are
                // learned at `initialize`, before the calls.
                if st.resource.as_ref() != Some(&st.current) {
                    st.resource = Some(st.current.clone());
                }
                st.spans.push(&ev, &facts, &self.net, (trace, span_id));
            }
            Item::Session(s) => {
                if self.cfg.metrics.is_none() {
                    return;
                }
                let mut attrs = vec![("network.transport", self.net.transport)];
                if let Some(p) = &s.protocol {
                    attrs.push(("mcp.protocol.version", p));
                }
                if let Some(p) = self.net.protocol_name {
                    attrs.push(("network.protocol.name", p));
                }
                if s.transport_failed {
                    attrs.push(("error.type", "transport"));
                }
                let secs = s
                    .end
                    .duration_since(s.start)
                    .unwrap_or_default()
                    .as_secs_f64();
                st.sessions
                    .record(&mut attrs, secs, span::unix_nanos(SystemTime::now()));
            }
        }
    }

    async fn send_spans(&self, st: &mut State) {
        let n = st.spans.len() as u64;
        let (service, version) = st.resource.take().unwrap_or_else(|| st.current.clone());
        let Some(url) = self.cfg.traces.clone() else {
            return;
        };
        let body = st.spans.take(
            span::resource(&service, version.as_deref(), &self.cfg.resource),
            span::scope(),
        );
        let ok = match body {
            Ok(b) => self.deliver(st, &url, Bytes::from(b), "spans").await,
            Err(_) => false,
        };
        if ok {
            self.shared.spans_sent.fetch_add(n, Relaxed);
            if self.debug {
                tracing::debug!(spans = n, "OTLP spans sent");
            }
        } else {
            self.shared.spans_dropped.fetch_add(n, Relaxed);
        }
    }

    async fn send_metrics(&self, st: &mut State) {
        let Some(url) = self.cfg.metrics.clone() else {
            return;
        };
        let now = span::unix_nanos(SystemTime::now());
        let counts = self.counters.as_ref().map(|c| c());
        let t = self.cfg.temporality;
        let mut list: Vec<_> = [st.ops.export(now, t), st.sessions.export(now, t)]
            .into_iter()
            .flatten()
            .collect();
        let dropped_here =
            self.shared.spans_dropped.load(Relaxed) + self.shared.queue_dropped.load(Relaxed);
        let c = counts.unwrap_or_default();
        let before = st.last_counts;
        let window = metrics::Window {
            start: st.start,
            last_export: st.last_metrics,
            now,
            temporality: t,
        };
        list.push(metrics::counter(
            "bounded.sensor.events.dropped",
            "{event}",
            "Events (and their spans) the sensor could not deliver, by sink.",
            &[
                (vec![("bounded.sink", "otlp")], dropped_here, 0),
                (
                    vec![("bounded.sink", "ingest")],
                    c.ingest_dropped,
                    before.ingest_dropped,
                ),
            ],
            window,
        ));
        if self.counters.is_some() {
            if let Some(unobserved) = c.calls_unobserved {
                list.push(metrics::counter(
                    "bounded.sensor.calls.unobserved",
                    "{call}",
                    "Calls that made no event: their answer may have been lost on the way to the observer.",
                    &[(vec![], unobserved, before.calls_unobserved.unwrap_or(0))],
                    window,
                ));
            }
            list.push(metrics::counter(
                "bounded.sensor.tap.bytes_dropped",
                "By",
                "Bytes the relay forwarded but could not hand to the observer.",
                &[(vec![], c.tap_bytes_dropped, before.tap_bytes_dropped)],
                window,
            ));
        }
        let (service, version) = st.current.clone();
        let req = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(span::resource(
                    &service,
                    version.as_deref(),
                    &self.cfg.resource,
                )),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(span::scope()),
                    metrics: list,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let ok = match self.encode(&req) {
            Some(b) => self.deliver(st, &url, b, "metrics").await,
            None => false,
        };
        if ok {
            self.shared.metric_exports.fetch_add(1, Relaxed);
            st.ops.delivered(now, t);
            st.sessions.delivered(now, t);
            st.last_metrics = now;
            st.last_counts = c;
        } else {
            self.shared.metric_failures.fetch_add(1, Relaxed);
        }
    }

    /// One request with its one retry; on failure the cool-down starts. Logs each kind of
    /// failure once (the endpoint redacted, never a header).
    async fn deliver(&self, st: &mut State, url: &str, body: Bytes, what: &'static str) -> bool {
        let mut planned = backon::BackoffBuilder::build(retry::backoff(self.tuning.retry_delay));
        loop {
            match self.post(url, body.clone()).await {
                Ok(()) => {
                    st.cooldown.succeeded();
                    return true;
                }
                Err(e) => {
                    let wait = retry::is_retriable(&e)
                        .then(|| retry::retry_delay(&e, planned.next()))
                        .flatten();
                    if let Some(wait) = wait {
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    let kind = failure_kind(&e);
                    if st.logged.insert(kind) {
                        tracing::warn!(
                            endpoint = %crate::log::redact_url(url),
                            signal = what,
                            error = %describe(&e),
                            "OTLP export failed; what it carried is dropped and counted"
                        );
                    }
                    let pause = st.cooldown.failed(retry::retry_after_of(&e));
                    st.resume_at = Some(tokio::time::Instant::now() + pause);
                    return false;
                }
            }
        }
    }

    /// One export request in the configured protocol; `None` if it cannot be encoded (then
    /// nothing is sent).
    fn encode<M: prost::Message + serde::Serialize>(&self, req: &M) -> Option<Bytes> {
        match self.cfg.protocol {
            Protocol::Protobuf => Some(Bytes::from(req.encode_to_vec())),
            Protocol::Json => serde_json::to_vec(req).ok().map(Bytes::from),
        }
    }

    async fn post(&self, url: &str, body: Bytes) -> Result<(), DeliveryError> {
        let mut req = self
            .client
            .post(url)
            .header(CONTENT_TYPE, self.cfg.protocol.content_type());
        for (k, v) in &self.cfg.headers {
            req = req.header(k.clone(), v.clone());
        }
        let resp = req
            .body(body)
            .send()
            .await
            .map_err(crate::report::sink::classify)?;
        crate::report::sink::outcome(resp).await
    }
}

async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

fn failure_kind(e: &DeliveryError) -> &'static str {
    match e {
        DeliveryError::Connect(_) => "connect",
        DeliveryError::Timeout => "timeout",
        DeliveryError::Transport(_) => "transport",
        DeliveryError::Status(_) | DeliveryError::Throttled { .. } => "status",
        _ => "other",
    }
}

/// The failure in the OTLP endpoint's words (the [`DeliveryError`] texts name the ingest).
fn describe(e: &DeliveryError) -> String {
    match e {
        DeliveryError::Connect(c) => format!("cannot connect: {c}"),
        DeliveryError::Timeout => "no answer in time".into(),
        DeliveryError::Transport(c) => format!("connection failed: {c}"),
        DeliveryError::Status(s) => format!("HTTP {s}"),
        DeliveryError::Throttled { status, .. } => format!("HTTP {status}"),
        other => other.to_string(),
    }
}
