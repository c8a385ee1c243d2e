//! OTLP export: every observed `tools/call` also becomes a span and metric points over
//! OTLP/HTTP, named by the OpenTelemetry MCP semantic conventions, for the OpenTelemetry
//! pipelines teams already run (a Collector, Tempo, Honeycomb, Jaeger…).
//!
//! A sink beside the reporter (`crate::report`), fed from the same place: [`WithOtlp`] wraps
//! the reporter's queue, so the observer hands each event to both. Goes in: the event and its
//! [`crate::event::call::CallFacts`], through a bounded queue ([`QUEUE_CAPACITY`], `try_send`:
//! the newest is dropped and counted when full). The exporter ([`export`]) runs the same L3
//! filter the reporter runs (`bounded.field.<key>` are exactly the fields that pass), builds
//! spans ([`span`]) and bounded metrics ([`metrics`]), and delivers with the reporter's
//! discipline. It works with the ingest or alone (no token needed), on the observer's runtime
//! and never on a relay thread, and it never changes a relayed byte: trace context is read
//! from `params._meta` (or the `traceparent` header), never injected. It must never export a
//! value the filter did not pass, an error message, a raw session id, or a header of its own
//! configuration in a log line.
//!
//! Settings ([`config`]): `--otlp-endpoint` and the standard `OTEL_EXPORTER_OTLP_*` variables;
//! http/protobuf (default) or http/json, whose JSON is the OTLP JSON mapping of
//! `opentelemetry-proto` (hex ids, integer enums, 64-bit integers as strings; a test holds it
//! to those rules).

pub mod config;
pub mod export;
pub mod metrics;
pub mod span;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::event::call::{CallFacts, SessionFacts};
use crate::event::{Event, EventSink};
use crate::report::Tuning;

pub use config::{OtlpConfig, Protocol, Temporality};
pub use metrics::{CounterSource, SensorCounts};
pub use span::Network;

/// Calls queued for the exporter, as for the reporter (`crate::report::QUEUE_CAPACITY`): enough
/// to ride out a black-holed endpoint's retry cycle at hundreds of calls per second, bounded to
/// a few MB.
pub const QUEUE_CAPACITY: usize = 10_000;

/// Past the deadline, the time the handle gives the task to hand back before aborting it.
const JOIN_GRACE: Duration = Duration::from_millis(100);

/// What travels to the exporter.
pub(crate) enum Item {
    Call(Box<(Event, CallFacts)>),
    Session(SessionFacts),
}

/// The observer's handle on the exporter's queue. Never waits.
#[derive(Clone)]
pub struct OtlpQueue {
    tx: mpsc::Sender<Item>,
    shared: Arc<export::Shared>,
}

impl OtlpQueue {
    fn offer(&self, item: Item) {
        let call = matches!(item, Item::Call(_));
        match (self.tx.try_send(item).is_ok(), call) {
            (true, true) => self.shared.accepted.fetch_add(1, Relaxed),
            (false, true) => self.shared.queue_dropped.fetch_add(1, Relaxed),
            // A lost session point is not a span; the session histogram just misses it.
            (_, false) => 0,
        };
    }
}

/// The reporter's queue (or any sink) plus the OTLP exporter's: each event goes to both.
pub struct WithOtlp<S> {
    pub inner: S,
    pub otlp: Option<OtlpQueue>,
}

impl<S: EventSink> EventSink for WithOtlp<S> {
    fn emit(&mut self, event: Event) {
        self.inner.emit(event);
    }

    /// The inner sink's room only: a slow OTLP endpoint drops and counts, it never slows the
    /// observer.
    fn room(&self) -> usize {
        self.inner.room()
    }

    fn queued(&self) -> usize {
        self.inner.queued()
    }

    fn taken(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.inner.taken()
    }

    fn wants_call_facts(&self) -> bool {
        self.otlp.is_some() || self.inner.wants_call_facts()
    }

    /// `sensor.health` belongs to the batches: the inner sink's counters.
    fn health(&self) -> Option<&crate::event::health::HealthCounters> {
        self.inner.health()
    }

    fn emit_call(&mut self, event: Event, facts: CallFacts) {
        match &self.otlp {
            Some(q) if !self.inner.reads_events() => {
                q.offer(Item::Call(Box::new((event, facts))));
                self.inner.count_unread();
            }
            Some(q) => {
                q.offer(Item::Call(Box::new((event.clone(), facts))));
                self.inner.emit(event);
            }
            None => self.inner.emit_call(event, facts),
        }
    }

    fn session_ended(&mut self, facts: SessionFacts) {
        if let Some(q) = &self.otlp {
            q.offer(Item::Session(facts));
        }
    }
}

/// The exporter's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OtlpStats {
    pub spans_sent: u64,
    /// Spans not delivered: queue full, failed requests, or cut at the deadline.
    pub spans_dropped: u64,
    /// Events the L3 filter rejected (no span).
    pub filtered: u64,
    pub metric_exports: u64,
    pub metric_failures: u64,
}

/// Owns the exporter task; [`OtlpHandle::shutdown_by`] ends it.
pub struct OtlpHandle {
    task: Option<JoinHandle<()>>,
    deadline: watch::Sender<Option<tokio::time::Instant>>,
    shared: Arc<export::Shared>,
}

/// What the exporter is started with besides its settings.
pub struct OtlpStart {
    pub cfg: OtlpConfig,
    pub net: Network,
    /// `--flush-ms`: the longest a span waits in a partial batch.
    pub flush: Duration,
    pub debug: bool,
    pub counters: Option<CounterSource>,
    /// Paces the exporter with the observer and reporter on a CPU shared with the relay
    /// (stdio; see [`crate::pace`]).
    pub pacer: Option<Arc<crate::pace::Pacer>>,
}

/// Starts the exporter on the current tokio runtime. Outside one, or when no client can be
/// built, nothing is started and every call is counted as dropped (fail open).
pub fn start(s: OtlpStart) -> (OtlpQueue, OtlpHandle) {
    start_with(s, Tuning::default())
}

/// [`start`] with explicit timeouts (tests shorten them).
pub fn start_with(s: OtlpStart, tuning: Tuning) -> (OtlpQueue, OtlpHandle) {
    let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
    let shared = Arc::new(export::Shared::default());
    let (deadline_tx, deadline_rx) = watch::channel(None);
    let queue = OtlpQueue {
        tx,
        shared: shared.clone(),
    };
    let mut handle = OtlpHandle {
        task: None,
        deadline: deadline_tx,
        shared: shared.clone(),
    };
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("OTLP exporter started outside a tokio runtime: nothing is exported");
        return (queue, handle);
    };
    let opts = crate::http_client::ClientOptions {
        connect_timeout: tuning.connect_timeout,
        request_timeout: tuning.request_timeout,
        extra_roots: s.cfg.ca.clone(),
        // One request in flight at a time: one idle connection per endpoint is all it reuses.
        max_idle_per_host: 1,
    };
    let plain = [&s.cfg.traces, &s.cfg.metrics]
        .into_iter()
        .flatten()
        .all(|u| u.starts_with("http://"));
    let client = if plain {
        crate::http_client::build_plain(&opts)
    } else {
        crate::http_client::build(&opts)
    };
    let client = match client {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e.0, "Cannot set up OTLP export: nothing is exported");
            return (queue, handle);
        }
    };
    let exporter = export::Exporter {
        rx,
        cfg: s.cfg,
        net: s.net,
        client,
        flush: s.flush,
        debug: s.debug,
        tuning,
        deadline: deadline_rx,
        shared,
        counters: s.counters,
        pacer: s.pacer,
    };
    handle.task = Some(rt.spawn(exporter.run()));
    (queue, handle)
}

impl OtlpHandle {
    /// Flushes what is queued (spans, then the last metrics) by `deadline`, then stops; past
    /// it, what is unsent is counted as dropped. Returns by the deadline however dead the
    /// endpoint is.
    pub async fn shutdown_by(mut self, deadline: tokio::time::Instant) -> OtlpStats {
        let _ = self.deadline.send(Some(deadline));
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout_at(deadline + JOIN_GRACE, &mut task)
                .await
                .is_err()
            {
                task.abort();
                tracing::warn!(
                    "OTLP export did not finish by the shutdown deadline; unsent spans are dropped"
                );
            }
        }
        self.stats()
    }

    /// The totals so far; calls accepted but not accounted for are counted as dropped.
    pub fn stats(&self) -> OtlpStats {
        let s = &self.shared;
        let sent = s.spans_sent.load(Relaxed);
        let filtered = s.filtered.load(Relaxed);
        let failed = s.spans_dropped.load(Relaxed);
        let accepted = s.accepted.load(Relaxed);
        let untraced = s.untraced.load(Relaxed);
        let unaccounted = accepted.saturating_sub(sent + filtered + failed + untraced);
        OtlpStats {
            spans_sent: sent,
            spans_dropped: failed + s.queue_dropped.load(Relaxed) + unaccounted,
            filtered,
            metric_exports: s.metric_exports.load(Relaxed),
            metric_failures: s.metric_failures.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod health_tests {
    use super::*;

    /// The observer adds `sensor.health` through whatever sink it holds: wrapped for OTLP, the
    /// counts must still reach the reporter's queue, which puts them in its batches.
    #[test]
    fn the_wrapped_queue_keeps_its_health_counters() {
        let cfg = crate::report::ReportConfig {
            target: crate::config::IngestTarget::Off,
            token: None,
            flush: std::time::Duration::from_millis(50),
            shutdown_flush: std::time::Duration::from_millis(50),
            transport: "stdio",
            debug: false,
            ingest_ca: Vec::new(),
            pacer: None,
        };
        // Outside a runtime nothing is started; the queue and its counters exist all the same.
        let (queue, _handle) = crate::report::start(cfg);
        let wrapped = WithOtlp {
            inner: queue,
            otlp: None,
        };
        let h = wrapped.health().expect("the queue's counters");
        h.add(crate::event::health::Health {
            stdout_non_json: 2,
            ..Default::default()
        });
        assert_eq!(
            wrapped.inner.health().map(|h| h.take().stdout_non_json),
            Some(2)
        );
        let plain = WithOtlp {
            inner: Vec::<Event>::new(),
            otlp: None,
        };
        assert!(plain.health().is_none());
    }
}
