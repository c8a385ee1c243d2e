//! The batcher: the reporter's one task, shaped like a sink pipeline.
//!
//! `queue → filter (L3) → batched(500 events, flush interval) → encode → send with one retry →
//! record outcome (Delivered / Errored / Rejected)`.
//!
//! Goes in: [`Event`]s from the bounded queue the observer fills. Comes out: encoded batches
//! handed to a [`Sink`], and [`ReportStats`]. Every failure on this path is counted and logged
//! once, never propagated: nothing here can reach the relay or the wrapped server.
//!
//! **At most one request is in flight.** The batcher awaits each delivery before it takes the
//! next batch, so batches arrive in order, memory is bounded by the queue plus one batch, and a
//! dead or slow ingest can never pile up sockets or tasks: while it hangs, events wait in the
//! bounded queue and, once that is full, the newest are dropped and counted. One request at a
//! time is also plenty: an ingest stores a 500-event batch in milliseconds.
//!
//! **Drop accounting.** Every event that does not reach the sink (queue full, rejected by the
//! L3 filter, in a failed batch) is added to a pending count that the next batch carries in its
//! `dropped` field; the count resets only when a batch is accepted. So the ingest learns about
//! losses as soon as it is reachable again.
//!
//! It must never block the observer (the queue is `try_send` on the other side), never send an
//! event that did not pass `validate_and_filter_event`, and never put `org` or a sensor id in a
//! batch (the ingest stamps both from the key).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::Retryable;
use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::retry::{backoff, is_retriable, DeliveryError, STATUS_UNAUTHORIZED};
use super::sink::{Sink, Tuning};
use super::stats::{summarise, warn_once, FailureKind, FailureLog, ReportStats};
pub use crate::event::BATCH_VERSION;
use crate::event::{filter_event, BatchBody, Event, SensorInfo, MAX_BATCH_EVENTS};

/// What happened to one batch.
#[derive(Debug)]
enum Outcome {
    /// The sink accepted it.
    Delivered,
    /// A transient failure that the retry did not cure.
    Errored(DeliveryError),
    /// A failure a retry cannot cure (4xx, file error): not retried.
    Rejected(DeliveryError),
    /// The shutdown deadline passed while it was being sent.
    Abandoned,
}

/// Set by the handle at shutdown: the instant by which the batcher must be done.
pub(crate) type Deadline = watch::Receiver<Option<Instant>>;

pub(crate) struct Batcher {
    pub(crate) rx: mpsc::Receiver<Event>,
    /// Incremented by the queue's producers when it is full.
    pub(crate) queue_dropped: Arc<AtomicU64>,
    /// `None`: reporting is off; events are drained and discarded, no socket is ever opened.
    pub(crate) sink: Option<Sink>,
    pub(crate) flush: Duration,
    pub(crate) transport: &'static str,
    pub(crate) debug: bool,
    pub(crate) tuning: Tuning,
    pub(crate) deadline: Deadline,
    /// Where the stats are published after each batch, so the handle can still report them if
    /// it ever has to abort this task.
    pub(crate) published: Arc<Mutex<ReportStats>>,
    /// The batch being filled: its events already filtered and serialised.
    pub(crate) buf: BatchBody,
    /// Rests this thread with the observer's on a shared CPU (see `observe::priority::Pacer`).
    pub(crate) pacer: Option<Arc<crate::observe::priority::Pacer>>,
    /// Events lost since the last accepted batch; carried by the next one.
    pub(crate) pending_dropped: u64,
    pub(crate) stats: ReportStats,
    pub(crate) log: FailureLog,
}

/// What woke the main loop.
// One value at a time, on the stack, moved straight into the batch: boxing the event would
// cost an allocation per event to save nothing.
#[allow(clippy::large_enum_variant)]
enum Wake {
    Event(Event),
    Closed,
    Shutdown,
    FlushDue,
}

impl Batcher {
    /// Runs until the queue closes or shutdown is requested, then flushes what is queued before
    /// the deadline and returns the totals.
    pub(crate) async fn run(mut self) -> ReportStats {
        let mut flush_at: Option<Instant> = None;
        loop {
            let wake = tokio::select! {
                biased;
                _ = shutdown_requested(&mut self.deadline) => Wake::Shutdown,
                ev = self.rx.recv() => match ev {
                    Some(ev) => Wake::Event(ev),
                    None => Wake::Closed,
                },
                _ = sleep_until_opt(flush_at) => Wake::FlushDue,
            };
            match wake {
                Wake::Event(ev) => {
                    self.push(ev);
                    if let Some(p) = &self.pacer {
                        p.pace();
                    }
                    if flush_at.is_none() && !self.buf.is_empty() {
                        // Age-based: no event waits longer than the flush interval.
                        flush_at = Some(Instant::now() + self.flush);
                    }
                    if self.buf.len() >= MAX_BATCH_EVENTS {
                        self.flush().await;
                        flush_at = None;
                    }
                }
                Wake::FlushDue => {
                    self.flush().await;
                    flush_at = None;
                }
                Wake::Closed | Wake::Shutdown => break,
            }
        }
        let shutdown_began = std::time::Instant::now();
        self.drain().await;
        self.finish_stats();
        summarise(&self.stats, &self.log, self.debug, shutdown_began.elapsed());
        self.publish();
        self.stats
    }

    /// Filters one event (L3) into the current batch; a rejected event is counted, never sent.
    fn push(&mut self, ev: Event) {
        // The typed form of `validate_and_filter_event` (proven equal to it over generated
        // events), without building a `Value` of the event first.
        let filtered = filter_event(ev).map_err(|e| e.to_string());
        let added = filtered.and_then(|ev| self.buf.push(&ev).map_err(|e| e.to_string()));
        match added {
            Ok(()) => {}
            Err(e) => {
                self.stats.filtered += 1;
                self.pending_dropped += 1;
                warn_once(&mut self.log, FailureKind::Filter, &"");
                if self.debug {
                    tracing::debug!(error = %e, "Event rejected by the schema filter");
                }
            }
        }
    }

    /// After shutdown: everything still queued goes out in batches until the deadline.
    async fn drain(&mut self) {
        self.rx.close();
        loop {
            while self.buf.len() < MAX_BATCH_EVENTS {
                match self.rx.try_recv() {
                    Ok(ev) => self.push(ev),
                    Err(_) => break,
                }
            }
            if self.buf.is_empty() {
                break;
            }
            if self.deadline_passed() {
                let mut left = self.buf.len() as u64;
                self.buf.clear();
                while self.rx.try_recv().is_ok() {
                    left += 1;
                }
                self.lose(left, None);
                break;
            }
            self.flush().await;
        }
    }

    fn deadline_passed(&self) -> bool {
        matches!(*self.deadline.borrow(), Some(d) if Instant::now() >= d)
    }

    /// Takes the current batch and delivers it (or counts it, when reporting is off or the key
    /// was revoked).
    async fn flush(&mut self) {
        self.flush_inner().await;
        self.publish();
    }

    async fn flush_inner(&mut self) {
        self.take_queue_drops();
        if self.buf.is_empty() {
            return;
        }
        let n = self.buf.len() as u64;
        if self.sink.is_none() {
            self.buf.clear();
            self.stats.unsent += n;
            return;
        }
        if self.stats.revoked {
            self.buf.clear();
            self.lose(n, None);
            return;
        }
        let sensor = SensorInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            transport: self.transport.to_string(),
        };
        let body = match self.buf.take(&sensor, self.pending_dropped) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                self.lose(
                    n,
                    Some(Outcome::Rejected(DeliveryError::Encode(e.to_string()))),
                );
                return;
            }
        };
        let started = std::time::Instant::now();
        let outcome = self.send(&body).await;
        if self.debug {
            tracing::debug!(
                events = n,
                dropped = self.pending_dropped,
                bytes = body.len(),
                ms = started.elapsed().as_millis() as u64,
                outcome = ?outcome,
                "Batch"
            );
        }
        match outcome {
            Outcome::Delivered => {
                self.stats.delivered += n;
                self.stats.batches += 1;
                self.pending_dropped = 0;
            }
            other => self.lose(n, Some(other)),
        }
    }

    /// One delivery: an attempt, one jittered retry if [`is_retriable`] says so, all of it
    /// abandoned if the shutdown deadline passes first.
    async fn send(&mut self, body: &Bytes) -> Outcome {
        let Some(sink) = self.sink.as_ref() else {
            return Outcome::Abandoned;
        };
        let mut retries = 0u64;
        let attempt = (|| sink.send_once(body))
            .retry(backoff(self.tuning.retry_delay))
            .when(is_retriable)
            .notify(|_, _| retries += 1);
        let result = tokio::select! {
            r = attempt => Some(r),
            _ = deadline_reached(&mut self.deadline) => None,
        };
        self.stats.retries += retries;
        match result {
            None => Outcome::Abandoned,
            Some(Ok(())) => Outcome::Delivered,
            Some(Err(e)) if is_retriable(&e) => Outcome::Errored(e),
            Some(Err(e)) => Outcome::Rejected(e),
        }
    }

    /// Counts `n` events as lost, with the reason (logged once per kind).
    fn lose(&mut self, n: u64, why: Option<Outcome>) {
        self.stats.failed += n;
        self.pending_dropped += n;
        let unexplained = why.is_none();
        match why {
            None => {}
            Some(Outcome::Abandoned) => {
                self.stats.failed_batches += 1;
                self.stats.deadline_hit = true;
                warn_once(&mut self.log, FailureKind::Deadline, &"");
            }
            Some(Outcome::Errored(e)) | Some(Outcome::Rejected(e)) => {
                self.stats.failed_batches += 1;
                if e == DeliveryError::Status(STATUS_UNAUTHORIZED) {
                    self.stats.revoked = true;
                }
                let detail = match &self.sink {
                    Some(s) => format!("{e} ({})", s.describe()),
                    None => e.to_string(),
                };
                warn_once(&mut self.log, FailureKind::of(&e), &detail);
            }
            Some(Outcome::Delivered) => {}
        }
        if n > 0 && unexplained && self.deadline_passed() {
            self.stats.deadline_hit = true;
            warn_once(&mut self.log, FailureKind::Deadline, &"");
        }
    }

    /// Moves the queue's full-drops into the pending count and the stats.
    fn take_queue_drops(&mut self) {
        let q = self.queue_dropped.swap(0, Ordering::Relaxed);
        if q > 0 {
            self.stats.queue_full += q;
            self.pending_dropped += q;
            warn_once(&mut self.log, FailureKind::QueueFull, &"");
        }
    }

    fn finish_stats(&mut self) {
        self.take_queue_drops();
        let s = &mut self.stats;
        s.dropped = s.queue_full + s.filtered + s.failed;
    }

    fn publish(&self) {
        if let Ok(mut p) = self.published.lock() {
            let mut s = self.stats.clone();
            s.dropped = s.queue_full + s.filtered + s.failed;
            *p = s;
        }
    }
}

/// Completes once shutdown has been requested (a deadline was set). If the handle is gone
/// without asking, never: the batcher then ends when the queue closes.
async fn shutdown_requested(rx: &mut Deadline) {
    loop {
        if rx.borrow_and_update().is_some() {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Completes when the shutdown deadline has passed (never before shutdown is requested).
async fn deadline_reached(rx: &mut Deadline) {
    loop {
        let current = *rx.borrow_and_update();
        if let Some(d) = current {
            tokio::time::sleep_until(d).await;
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
