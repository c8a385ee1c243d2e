//! The reporter: batches filtered events and delivers them without ever blocking the relay.
//!
//! Goes in: [`Event`]s, through the [`EventQueue`] the observer holds ([`EventSink::emit`]
//! filters and writes the event on the observer's thread, then a `try_send`: it never waits).
//! Comes out: batches (DESIGN §4) posted to `<ingest>/v1/events` or appended to a `file:`
//! sink, and [`ReportStats`] at shutdown. It must never block or slow the observer or the
//! relay, never send an event that did not pass the L3 filter, never send `org` or a sensor
//! id, never write to stdout, and never open a socket when reporting is off (no token, bad
//! ingest value).
//!
//! The pieces, in the order an event meets them:
//!
//! * [`EventQueue`]: filters each event (L3) and writes it where it is made
//!   ([`crate::event::EventWriter`]), then queues its bytes: bounded ([`QUEUE_CAPACITY`]
//!   events); when full the newest event is dropped and counted, and the count travels in the
//!   next batch's `dropped`, as does the count of events the filter refused. With reporting off
//!   it queues nothing and counts each event as unsent itself, so that the OTLP exporter beside
//!   it takes the event instead of a copy ([`EventSink::reads_events`]).
//! * [`batch`]: the batcher task: batches of ≤ 500 written events and ≤ 1 MiB
//!   ([`MAX_BATCH_BYTES`]) or whatever is queued after the flush interval → send with one
//!   retry → Delivered / Errored / Rejected → back off while the ingest keeps failing. At most
//!   one request in flight (why: see [`batch`]).
//! * [`retry`]: [`retry::is_retriable`], the one classification of what is worth a retry, and
//!   the waits: the retry's delay, the ingest's `Retry-After` (capped at 60 s) and the back-off
//!   between failing batches (1 s doubling to at most 30 s).
//! * [`sink`]: the HTTP(S) and `file:` sinks, timeouts, TLS (a private CA with `--ingest-ca`),
//!   no gzip (why: see [`sink`]).
//! * [`stats`]: counters and the stderr discipline (each kind of failure once, then a summary).
//!
//! Shutdown is explicit: [`ReporterHandle::shutdown`] sets a deadline (`shutdown_flush`,
//! default 2 s, or the session's own with [`ReporterHandle::shutdown_by`]); the batcher flushes
//! what is queued until then, and whatever is still unsent
//! (including a request in flight to a dead ingest, or a retry waiting out `Retry-After`) is
//! abandoned and counted; a back-off between batches that would outlast the deadline is not
//! waited for at all. A dead ingest can therefore delay the wrapper's exit by at most that
//! deadline. A thread that cannot wait for the reporter's own answer (its thread may not get
//! the CPU in time) reads the totals through a [`ReportWatch`] instead.

pub mod batch;
pub mod retry;
pub mod sink;
pub mod stats;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::IngestTarget;
use crate::event::{Event, EventSink, EventWriter, Written};
use crate::token::SensorToken;

pub use batch::MAX_BATCH_BYTES;
pub use sink::{Tuning, CONNECT_TIMEOUT, EVENTS_PATH, REQUEST_TIMEOUT};
pub use stats::ReportStats;

/// Events queued between observer and batcher; when full the newest is dropped and counted.
///
/// 10,000 events is 20 full batches: enough to ride out a black-holed ingest holding the single
/// in-flight request for a whole retry cycle (2 × [`REQUEST_TIMEOUT`] + backoff ≈ 20 s) at
/// 500 tool calls per second without losing one, while bounding the memory a dead ingest can
/// cost to a few MB (an event is a few hundred bytes of metadata). A longer outage, with its
/// back-off between batches (up to 30 s, or a `Retry-After` up to 60 s), drops the newest
/// events and counts them.
pub const QUEUE_CAPACITY: usize = 10_000;

/// Extra time the handle gives the batcher past the deadline to hand back its totals before
/// aborting it. The batcher itself abandons everything at the deadline; this only guards
/// against a bug there.
const JOIN_GRACE: Duration = Duration::from_millis(200);

#[derive(Debug, Clone)]
pub struct ReportConfig {
    pub target: IngestTarget,
    pub token: Option<SensorToken>,
    /// Longest an event waits in a partial batch (`--flush-ms`).
    pub flush: Duration,
    /// How long shutdown may spend flushing (and so delay the wrapper's exit).
    pub shutdown_flush: Duration,
    /// `"stdio"` or `"http"`.
    pub transport: &'static str,
    /// Per-batch detail on stderr.
    pub debug: bool,
    /// A private CA trusted for the ingest besides the default roots (`--ingest-ca`).
    pub ingest_ca: Vec<rustls::pki_types::CertificateDer<'static>>,
    /// Paces the reporter with the observer when both run on a CPU shared with the relay
    /// (stdio); `None` where there is no tap to tell whether traffic flows (HTTP).
    pub pacer: Option<Arc<crate::pace::Pacer>>,
}

/// The observer's handle on the queue.
pub struct EventQueue {
    /// Written events, not events: see [`EventWriter`]. An item is a slice of a block (32
    /// bytes), so the channel's blocks of 32 slots stay near 1 KiB, where 32 unboxed events
    /// made a 16 KiB allocation that makes glibc consolidate its fast bins.
    tx: mpsc::Sender<Written>,
    writer: EventWriter,
    dropped: Arc<AtomicU64>,
    /// Events the L3 filter refused, for the batcher to count and carry in `dropped`.
    filtered: Arc<AtomicU64>,
    /// Events the queue took (see [`ReportWatch`]).
    accepted: Arc<AtomicU64>,
    /// `sensor.health` counts the observer adds and the batcher sends.
    health: Arc<crate::event::health::HealthCounters>,
    /// Notified by the batcher each time it takes events (see [`EventSink::taken`]).
    taken: Arc<tokio::sync::Notify>,
    /// Set when reporting is off: events are counted here as unsent instead of being queued
    /// for a batcher that could only count them.
    unread: Option<Arc<AtomicU64>>,
}

impl EventSink for EventQueue {
    fn emit(&mut self, mut event: Event) {
        if self.unread.is_some() {
            drop(event);
            self.count_unread();
            return;
        }
        if self.tx.capacity() == 0 {
            // Full: not worth filtering and writing an event that cannot be queued.
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let written = self.writer.write(&mut event);
        drop(event);
        match written {
            Ok(w) => {
                let counter = match self.tx.try_send(w) {
                    Ok(()) => &self.accepted,
                    Err(_) => &self.dropped,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                // Taken, and accounted for as filtered by the batcher with its next batch
                // (see `ReportWatch::outstanding`).
                self.accepted.fetch_add(1, Ordering::Relaxed);
                self.filtered.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "Event rejected by the schema filter");
            }
        }
    }

    fn room(&self) -> usize {
        self.tx.capacity()
    }

    fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    fn taken(&self) -> Option<Arc<tokio::sync::Notify>> {
        Some(self.taken.clone())
    }

    fn health(&self) -> Option<&crate::event::health::HealthCounters> {
        Some(&self.health)
    }

    fn reads_events(&self) -> bool {
        self.unread.is_none()
    }

    fn count_unread(&mut self) {
        match &self.unread {
            Some(unread) => {
                self.accepted.fetch_add(1, Ordering::Relaxed);
                unread.fetch_add(1, Ordering::Relaxed);
            }
            // Reporting is on: an event was due here; counted as a queue drop, never lost
            // silently.
            None => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Owns the batcher task; [`ReporterHandle::shutdown`] is the only way to end it early.
pub struct ReporterHandle {
    task: Option<JoinHandle<ReportStats>>,
    deadline: watch::Sender<Option<tokio::time::Instant>>,
    shutdown_flush: Duration,
    watch: ReportWatch,
}

/// The reporter's totals as any thread can read them, without the reporter's help: what it
/// published after its last batch, and what the queue took or refused since.
#[derive(Clone)]
pub struct ReportWatch {
    published: Arc<Mutex<ReportStats>>,
    queue_dropped: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    /// Events counted as unsent by the queue itself (reporting off), never by the batcher.
    unread: Arc<AtomicU64>,
    /// Events are meant to go somewhere (else they are `unsent`, not lost).
    sink: bool,
}

/// Starts the reporter on the current tokio runtime, with the default timeouts.
pub fn start(cfg: ReportConfig) -> (EventQueue, ReporterHandle) {
    start_with(cfg, Tuning::default())
}

/// [`start`] with explicit timeouts (tests shorten them). Outside a tokio runtime nothing is
/// started: every event is counted as dropped (fail open, never a panic).
pub fn start_with(cfg: ReportConfig, tuning: Tuning) -> (EventQueue, ReporterHandle) {
    let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
    let queue_dropped = Arc::new(AtomicU64::new(0));
    let filtered = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let (deadline_tx, deadline_rx) = watch::channel(None);
    let published = Arc::new(Mutex::new(ReportStats::default()));
    let health = Arc::new(crate::event::health::HealthCounters::default());
    let taken = Arc::new(tokio::sync::Notify::new());
    let queue = EventQueue {
        tx,
        writer: EventWriter::default(),
        dropped: queue_dropped.clone(),
        filtered: filtered.clone(),
        accepted: accepted.clone(),
        health: health.clone(),
        taken: taken.clone(),
        unread: None,
    };
    let unread = Arc::new(AtomicU64::new(0));
    let mut handle = ReporterHandle {
        task: None,
        deadline: deadline_tx,
        shutdown_flush: cfg.shutdown_flush,
        watch: ReportWatch {
            published: published.clone(),
            queue_dropped: queue_dropped.clone(),
            accepted,
            unread: unread.clone(),
            sink: false,
        },
    };
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("Reporter started outside a tokio runtime: events will not be reported");
        return (queue, handle);
    };
    let mut queue = queue;

    let sink = match (&cfg.target, &cfg.token) {
        (IngestTarget::Http(base), Some(token)) => {
            match sink::HttpSink::new(base, token, &tuning, &cfg.ingest_ca) {
                Ok(s) => Some(sink::Sink::Http(s)),
                Err(e) => {
                    tracing::warn!(
                        "Cannot set up delivery to the ingest ({e}): events will not be reported"
                    );
                    None
                }
            }
        }
        // A network sink without a token never exists (config fails open to Off; guarded here too).
        (IngestTarget::Http(_), None) | (IngestTarget::Off, _) => None,
        (IngestTarget::File(path), _) => Some(sink::Sink::File(sink::FileSink::new(path.clone()))),
    };
    handle.watch.sink = sink.is_some();
    if sink.is_none() {
        // Reporting is off: the batcher could only count each event as unsent, after a copy of
        // it (with OTLP on), a trip through the queue, the filter and a batch nobody reads. The
        // queue counts it instead, and the batcher gets none.
        queue.unread = Some(unread);
    }
    let batcher = batch::Batcher {
        rx,
        queue_dropped,
        filtered,
        sink,
        flush: cfg.flush,
        transport: cfg.transport,
        debug: cfg.debug,
        tuning,
        deadline: deadline_rx,
        published,
        buf: Default::default(),
        pacer: cfg.pacer.clone(),
        taken,
        overflow: None,
        pending_dropped: 0,
        health,
        pending_health: Default::default(),
        cooldown: retry::Cooldown::new(tuning.cooldown_min, tuning.cooldown_max),
        resume_at: None,
        stats: ReportStats::default(),
        log: stats::FailureLog::default(),
    };
    handle.task = Some(rt.spawn(batcher.run()));
    (queue, handle)
}

impl ReporterHandle {
    /// The totals so far, as of the last batch the batcher finished (for `--debug` and tests).
    pub fn snapshot(&self) -> ReportStats {
        self.watch.snapshot()
    }

    /// A view of the totals that outlives this handle and can be read from any thread.
    pub fn watch(&self) -> ReportWatch {
        self.watch.clone()
    }

    /// Flushes what is queued within the shutdown deadline and stops. Returns promptly (by the
    /// deadline) however dead the ingest is.
    pub async fn shutdown(self) -> ReportStats {
        let deadline = tokio::time::Instant::now() + self.shutdown_flush;
        self.shutdown_by(deadline).await
    }

    /// [`ReporterHandle::shutdown`] by a deadline the caller sets (a stdio session's is counted
    /// from the server's exit, not from when the observer is done).
    pub async fn shutdown_by(mut self, deadline: tokio::time::Instant) -> ReportStats {
        let _ = self.deadline.send(Some(deadline));
        let Some(mut task) = self.task.take() else {
            let dropped = self.watch.queue_dropped.load(Ordering::Relaxed);
            return ReportStats {
                dropped,
                queue_full: dropped,
                ..Default::default()
            };
        };
        match tokio::time::timeout_at(deadline + JOIN_GRACE, &mut task).await {
            Ok(Ok(mut stats)) => {
                stats.unsent += self.watch.unread.load(Ordering::Relaxed);
                stats
            }
            _ => {
                task.abort();
                tracing::warn!("Reporter did not stop by its deadline; unsent events are lost");
                let mut s = self.watch.snapshot();
                s.deadline_hit = true;
                s
            }
        }
    }
}

impl ReportWatch {
    /// The totals as of the last batch the batcher finished, plus the queue's drops since.
    pub fn snapshot(&self) -> ReportStats {
        self.with_queue_drops(crate::lock::lock(&self.published).clone())
    }

    /// Events the queue took that the totals do not account for yet: queued, in the batch being
    /// filled, in flight, or rejected by the filter since the last batch.
    pub fn outstanding(&self) -> u64 {
        self.outstanding_after(&crate::lock::lock(&self.published))
    }

    fn with_queue_drops(&self, mut s: ReportStats) -> ReportStats {
        let q = self.queue_dropped.load(Ordering::Relaxed);
        s.queue_full += q;
        s.dropped += q;
        s.unsent += self.unread.load(Ordering::Relaxed);
        s
    }

    /// [`ReportWatch::outstanding`] against the published totals `s`.
    fn outstanding_after(&self, s: &ReportStats) -> u64 {
        let accounted =
            s.delivered + s.filtered + s.failed + s.unsent + self.unread.load(Ordering::Relaxed);
        self.accepted
            .load(Ordering::Relaxed)
            .saturating_sub(accounted)
    }

    /// The totals when the process stops waiting for the reporter now: every event not yet
    /// accounted for ([`ReportWatch::outstanding`]) is counted as lost to the deadline (or as
    /// unsent when events were going nowhere). An event in a batch that was being written at
    /// that moment may still arrive: it is counted as lost, never as delivered.
    pub fn abandoned(&self) -> ReportStats {
        // One reading of the published totals for both, so a batch published in between
        // cannot count its events neither as delivered nor as lost.
        let published = crate::lock::lock(&self.published).clone();
        let left = self.outstanding_after(&published);
        let mut s = self.with_queue_drops(published);
        if self.sink {
            s.failed += left;
            s.dropped += left;
            if left > 0 {
                s.deadline_hit = true;
            }
        } else {
            s.unsent += left;
        }
        s
    }
}
