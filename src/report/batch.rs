//! The batcher: the reporter's one task, shaped like a sink pipeline.
//!
//! `queue → batched(500 events, 1 MiB, flush interval) → encode → send with one retry → record
//! outcome (Delivered / Errored / Rejected) → back off while the ingest fails`.
//!
//! Goes in: [`Written`] events (filtered and written by the queue, `super::EventQueue`) from
//! the bounded queue the observer fills, and the count of those the filter refused. Comes out:
//! encoded batches handed to a `Sink`, and [`ReportStats`]; an event that does not reach the
//! sink is counted in a later batch's `dropped`. Every failure on this path is counted and
//! logged once, never propagated: nothing here can reach the relay or the wrapped server. It
//! must never block the observer (the queue is `try_send` on the other side), never send an
//! event that did not pass the L3 filter (only a [`Written`] goes into a batch, and only the
//! filter's writer makes one), and never put `org` or a sensor id in a batch (the ingest
//! stamps both from the key).
//!
//! **At most one request is in flight.** The batcher awaits each delivery before it takes the
//! next batch, so batches arrive in order, memory is bounded by the queue plus one batch, and a
//! dead or slow ingest can never pile up sockets or tasks: while it hangs, events wait in the
//! bounded queue and, once that is full, the newest are dropped and counted. One request at a
//! time is also plenty: an ingest stores a 500-event batch in milliseconds. While the ingest
//! keeps failing, batches are spaced out ([`Cooldown`]), never past the shutdown deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::Retryable;
use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::retry::{
    backoff, is_retriable, retry_after_of, retry_delay, Cooldown, DeliveryError,
    STATUS_UNAUTHORIZED,
};
use super::sink::{Sink, Tuning};
use super::stats::{summarise, warn_once, FailureKind, FailureLog, ReportStats};
pub use crate::event::BATCH_VERSION;
use crate::event::{BatchBody, SensorInfo, Written, MAX_BATCH_EVENTS};

/// Largest body the batcher posts: a batch is sent before the next event would take it past
/// this. 1 MiB is a quarter of the reference ingest's 4 MiB limit and the default body limit of
/// common reverse proxies (nginx's `client_max_body_size`), so a batch is never refused (413)
/// for its size on the way; it also bounds what one batch holds in memory and what its retry
/// sends again. Ordinary events (a few hundred bytes) fill 500 in well under this, so the count
/// closes most batches; this cap is met by events carrying many long captured fields.
///
/// A batch is sent when it holds [`MAX_BATCH_EVENTS`] events, when the next event would take its
/// body past this (that event opens the next batch), or when its oldest event has waited the
/// flush interval. No single event can pass the cap: the L3 filter bounds every field (32
/// captured fields of at most 64 + 128 bytes, text of at most 256), so the largest event it lets
/// through is about 33 KB, a thirtieth of the cap (a test builds it). Were one ever larger, it
/// would travel alone, never split or stalled.
pub const MAX_BATCH_BYTES: usize = 1024 * 1024;

/// Room kept in [`MAX_BATCH_BYTES`] for the envelope around the events
/// (`{"v":2,"sensor":{…},"dropped":N,"events":[` … `]}`): under 100 bytes plus the sensor
/// version and transport. It is reserved rather than measured because `dropped` is only known
/// when the batch is sent; 512 covers a 20-digit count with room to spare.
const ENVELOPE_RESERVE: usize = 512;

const _: () = assert!(MAX_BATCH_BYTES <= crate::event::MAX_BATCH_BODY_BYTES);

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
    pub(crate) rx: mpsc::Receiver<Written>,
    /// Incremented by the queue's producers when it is full.
    pub(crate) queue_dropped: Arc<AtomicU64>,
    /// Incremented by the queue's producers for each event the L3 filter refused.
    pub(crate) filtered: Arc<AtomicU64>,
    /// `None`: reporting is off and no socket is ever opened. The queue then counts events
    /// itself and sends none here (`EventQueue`); one that arrives anyway is counted as unsent.
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
    /// Rests this thread with the observer's on a shared CPU (see [`crate::pace::Pacer`]).
    pub(crate) pacer: Option<Arc<crate::pace::Pacer>>,
    /// Notified after each take from the queue, for an observer waiting for it to shorten
    /// (`crate::event::EventSink::taken`).
    pub(crate) taken: Arc<tokio::sync::Notify>,
    /// A filtered event that would have taken the batch past [`MAX_BATCH_BYTES`]: the batch is
    /// sent first, and this event opens the next one.
    pub(crate) overflow: Option<Written>,
    /// Events lost since the last accepted batch (queue full, rejected by the L3 filter, in a
    /// failed batch); carried in the next batch's `dropped` and reset only when a batch is
    /// accepted, so the ingest learns about losses as soon as it is reachable again.
    pub(crate) pending_dropped: u64,
    /// `sensor.health` counts the observer adds (see [`crate::event::health`]).
    pub(crate) health: Arc<crate::event::health::HealthCounters>,
    /// Health counts taken but not yet in a delivered batch: carried like `pending_dropped`.
    pub(crate) pending_health: crate::event::health::Health,
    /// The pause between batches while the ingest keeps failing: a batch whose delivery failed
    /// for a reason [`is_retriable`] accepts (its one retry included) makes the next wait, from
    /// 1 s doubling per failed batch, with jitter, up to 30 s, and never below the ingest's
    /// `Retry-After` (at most 60 s); a delivered batch resets it. Meanwhile events fill the
    /// current batch, then wait in the bounded queue, then are dropped and counted like any
    /// queue overflow. The pause never delays shutdown: if it would end after the shutdown
    /// deadline, what is left is counted as dropped at once.
    pub(crate) cooldown: Cooldown,
    /// No batch is sent before this instant (set after a failed batch, cleared by a delivered
    /// one).
    pub(crate) resume_at: Option<Instant>,
    pub(crate) stats: ReportStats,
    pub(crate) log: FailureLog,
}

/// What woke the main loop.
enum Wake {
    Event(Written),
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
            let full = self.is_full();
            // A full batch goes at once, a partial one when its oldest event has waited the
            // flush interval; either only once a pending back-off is over.
            let due = if full { Some(Instant::now()) } else { flush_at };
            let due = due.map(|d| self.resume_at.map_or(d, |r| r.max(d)));
            let wake = tokio::select! {
                biased;
                _ = shutdown_requested(&mut self.deadline) => Wake::Shutdown,
                // A full batch takes no more: later events wait in the bounded queue.
                ev = self.rx.recv(), if !full => match ev {
                    Some(ev) => Wake::Event(ev),
                    None => Wake::Closed,
                },
                _ = sleep_until_opt(due) => Wake::FlushDue,
            };
            match wake {
                Wake::Event(ev) => {
                    self.push_paced(ev);
                    if flush_at.is_none() && !self.buf.is_empty() {
                        // Age-based: no event waits longer than the flush interval.
                        flush_at = Some(Instant::now() + self.flush);
                    }
                    // What else is queued joins this batch without another turn of the
                    // `select!`, which builds its shutdown, receive and timer futures anew each
                    // time. At most a batch's worth: the shutdown is looked at again after it.
                    while let Some(ev) = self.next_queued() {
                        self.push_paced(ev);
                    }
                    self.taken.notify_one();
                    if self.is_full() && !self.backing_off() {
                        self.flush().await;
                        flush_at = self.next_flush_at();
                    }
                }
                Wake::FlushDue => {
                    self.flush().await;
                    flush_at = self.next_flush_at();
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

    /// The batch must be sent before it takes another event: it holds [`MAX_BATCH_EVENTS`], or
    /// the next event did not fit under [`MAX_BATCH_BYTES`].
    fn is_full(&self) -> bool {
        self.buf.len() >= MAX_BATCH_EVENTS || self.overflow.is_some()
    }

    /// A failed batch's back-off is still running.
    fn backing_off(&self) -> bool {
        self.resume_at.is_some_and(|r| r > Instant::now())
    }

    /// When the batch left after a flush (the event that overflowed the last one) is due.
    fn next_flush_at(&self) -> Option<Instant> {
        (!self.buf.is_empty()).then(|| Instant::now() + self.flush)
    }

    /// The next event already queued, if the batch has room for it.
    fn next_queued(&mut self) -> Option<Written> {
        if self.is_full() {
            return None;
        }
        self.rx.try_recv().ok()
    }

    /// [`Batcher::push`] for an event taken from the queue, then the pacer's turn.
    fn push_paced(&mut self, ev: Written) {
        self.push(ev);
        if let Some(p) = &self.pacer {
            p.pace();
        }
    }

    /// Adds a written event to the batch, or holds it for the next one if it would take this
    /// one past [`MAX_BATCH_BYTES`]. Called only when the batch is not full.
    fn push(&mut self, ev: Written) {
        if !self
            .buf
            .push_written(&ev, MAX_BATCH_BYTES - ENVELOPE_RESERVE)
        {
            self.overflow = Some(ev);
        }
    }

    /// After shutdown: everything still queued goes out in batches until the deadline.
    async fn drain(&mut self) {
        self.rx.close();
        loop {
            while let Some(ev) = self.next_queued() {
                self.push(ev);
            }
            if self.buf.is_empty() {
                // Health counts with no event left to travel with go alone, once, if the
                // ingest is not being waited out (see `flush_inner`).
                self.pending_health = self.pending_health.plus(self.health.take());
                let health = self.pending_health != Default::default();
                if health && !self.deadline_passed() && !self.backing_off() {
                    self.flush().await;
                }
                break;
            }
            if self.deadline_passed() || !self.wait_out_backoff().await {
                self.abandon_rest();
                break;
            }
            self.flush().await;
        }
    }

    /// Waits for a pending back-off to end; `false`, at once, when it would end after the
    /// shutdown deadline: waiting would only hold the exit for a batch that cannot be sent.
    async fn wait_out_backoff(&mut self) -> bool {
        let Some(resume) = self.resume_at else {
            return true;
        };
        loop {
            if matches!(*self.deadline.borrow_and_update(), Some(d) if resume >= d) {
                return false;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(resume) => return true,
                changed = self.deadline.changed() => {
                    if changed.is_err() {
                        // The handle is gone: no deadline can come any more.
                        tokio::time::sleep_until(resume).await;
                        return true;
                    }
                }
            }
        }
    }

    /// Counts everything not yet sent (the batch, its overflow, the queue) as lost to the
    /// shutdown deadline.
    fn abandon_rest(&mut self) {
        let mut left = self.buf.len() as u64 + u64::from(self.overflow.is_some());
        self.buf.clear();
        self.overflow = None;
        while self.rx.try_recv().is_ok() {
            left += 1;
        }
        self.lose(left, None);
        if left > 0 {
            self.stats.deadline_hit = true;
            warn_once(&mut self.log, FailureKind::Deadline, &"");
        }
    }

    fn deadline_passed(&self) -> bool {
        matches!(*self.deadline.borrow(), Some(d) if Instant::now() >= d)
    }

    /// Takes the current batch and delivers it (or counts it, when reporting is off or the key
    /// was revoked).
    async fn flush(&mut self) {
        self.flush_inner().await;
        if let Some(ev) = self.overflow.take() {
            // The batch is empty now, and an empty batch takes any event.
            self.push(ev);
        }
        self.publish();
    }

    async fn flush_inner(&mut self) {
        self.take_queue_drops();
        // Health counts travel with events, and alone when there are none: a server that
        // corrupts its stdout may never complete a call.
        self.pending_health = self.pending_health.plus(self.health.take());
        if self.buf.is_empty() && self.pending_health == Default::default() {
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
            health: Some(self.pending_health),
        };
        let body = match self.buf.take(&sensor, self.pending_dropped) {
            Ok(b) => b,
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
                self.pending_health = Default::default();
                self.cooldown.succeeded();
                self.resume_at = None;
            }
            Outcome::Errored(e) => {
                // The ingest is failing: the next batch waits (never less than it asked).
                let pause = self.cooldown.failed(retry_after_of(&e));
                self.resume_at = Some(Instant::now() + pause);
                if self.debug {
                    tracing::debug!(
                        pause_ms = pause.as_millis() as u64,
                        "Backing off before the next batch"
                    );
                }
                self.lose(n, Some(Outcome::Errored(e)));
            }
            other => self.lose(n, Some(other)),
        }
    }

    /// One delivery: an attempt, one jittered retry if [`is_retriable`] says so (no sooner than
    /// the ingest's `Retry-After`), all of it abandoned if the shutdown deadline passes first.
    async fn send(&mut self, body: &Bytes) -> Outcome {
        let Some(sink) = self.sink.as_ref() else {
            return Outcome::Abandoned;
        };
        let mut retries = 0u64;
        let attempt = (|| sink.send_once(body))
            .retry(backoff(self.tuning.retry_delay))
            .when(is_retriable)
            .adjust(retry_delay)
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

    /// Moves the queue's full-drops and the events the filter refused into the pending count
    /// and the stats.
    fn take_queue_drops(&mut self) {
        let q = self.queue_dropped.swap(0, Ordering::Relaxed);
        if q > 0 {
            self.stats.queue_full += q;
            self.pending_dropped += q;
            warn_once(&mut self.log, FailureKind::QueueFull, &"");
        }
        let f = self.filtered.swap(0, Ordering::Relaxed);
        if f > 0 {
            self.stats.filtered += f;
            self.pending_dropped += f;
            warn_once(&mut self.log, FailureKind::Filter, &"");
        }
    }

    fn finish_stats(&mut self) {
        self.take_queue_drops();
        let s = &mut self.stats;
        s.dropped = s.queue_full + s.filtered + s.failed;
    }

    fn publish(&self) {
        let mut s = self.stats.clone();
        s.dropped = s.queue_full + s.filtered + s.failed;
        *crate::lock::lock(&self.published) = s;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::privacy::{MAX_FIELDS, MAX_KEY_LEN, MAX_VALUE_LEN};
    use crate::event::{
        filter::MAX_TEXT_LEN, new_event_id, rfc3339_ms, Actor, ByteSizes, Dest, ErrKind, Event,
        EventClass, EventErr, Rec, Session,
    };
    use crate::report::sink::FileSink;
    use serde_json::{Map, Value};

    /// An event whose every field is as long as the L3 filter allows, in the characters JSON
    /// escapes the most: `"` (two bytes) in text, control characters (six bytes: `\u0001`) in
    /// captured values.
    fn largest_event() -> Event {
        let text = |n: usize| "\"".repeat(n);
        let mut fields = Map::new();
        for i in 0..MAX_FIELDS {
            let key = format!("{i:02}{}", "\"".repeat(MAX_KEY_LEN - 2));
            fields.insert(key, Value::String("\u{1}".repeat(MAX_VALUE_LEN)));
        }
        Event {
            v: 2,
            id: "f".repeat(64).into(),
            ts: rfc3339_ms(std::time::SystemTime::now()).into(),
            class: EventClass::Error,
            rec: Rec {
                rail: "mcp".into(),
                action: text(MAX_TEXT_LEN).into(),
                registry_version: Some("a".repeat(64).into()),
                fields: Some(fields.into()),
                tool_def: Some("b".repeat(64).into()),
                listed: Some(false),
                hints: vec![
                    crate::event::Hint::ReadOnly,
                    crate::event::Hint::Destructive,
                    crate::event::Hint::Idempotent,
                    crate::event::Hint::OpenWorld,
                ],
                change: None,
                prev_tool_def: Some("c".repeat(64).into()),
            },
            dest: Dest {
                host: text(MAX_TEXT_LEN).into(),
                path_template: format!("/{}", text(MAX_TEXT_LEN - 1)).into(),
                method: "POST".into(),
            },
            actor: Actor {
                id: text(MAX_TEXT_LEN).into(),
                kind: "agent".into(),
                grade: "attested".into(),
            },
            on_behalf_of: Some(text(MAX_TEXT_LEN)),
            status: 599,
            dur_ms: f64::MAX,
            bytes: ByteSizes {
                req: u64::MAX,
                resp: u64::MAX,
            },
            session: Some(Session {
                id: text(MAX_TEXT_LEN).into(),
                protocol: Some(text(MAX_TEXT_LEN).into()),
                client: Some(text(MAX_TEXT_LEN).into()),
                // The longest counts without a Luhn-valid digit run (L4 rejects those).
                catalog: Some(crate::event::CatalogSize {
                    tools: Some(9_999_999_999_999_999_999),
                    bytes: 9_999_999_999_999_999_999,
                }),
            }),
            err: Some(EventErr {
                kind: ErrKind::Transport,
                // As long as an i64's text gets (20 bytes) without a Luhn-valid digit run,
                // which L4 would reject as a card number.
                code: Some(-9_017_486_899_579_404_580),
                fp: Some("d".repeat(64)),
            }),
        }
    }

    /// An ordinary-looking event with 32 captured fields of 128 bytes each (about 5 KB
    /// encoded): 500 of them would make a 2.5 MB body.
    fn wide_event() -> Event {
        let mut ev = largest_event();
        ev.id = new_event_id();
        ev.rec.action = "issue_refund".into();
        ev.dest.host = "mcp://payments".into();
        ev.dest.path_template = "/issue_refund".into();
        ev.actor.id = "mcp:k1".into();
        ev.on_behalf_of = None;
        ev.session = None;
        let value: String = ('a'..='z').cycle().take(MAX_VALUE_LEN).collect();
        ev.rec.fields = Some(
            (0..MAX_FIELDS)
                .map(|i| (format!("note_{i:02}"), Value::String(value.clone())))
                .collect(),
        );
        ev
    }

    #[test]
    fn largest_event_the_filter_admits_is_far_below_the_byte_cap() {
        let kept =
            crate::event::filter_event(largest_event()).expect("every field is within its bound");
        assert_eq!(
            kept.rec.fields.as_ref().map(crate::event::Fields::len),
            Some(MAX_FIELDS),
            "every captured field passed, so the bound below is the real worst case"
        );
        let size = serde_json::to_vec(&kept).expect("encodes").len();
        assert!(
            size * 16 < MAX_BATCH_BYTES - ENVELOPE_RESERVE,
            "an event of {size} bytes must not come near the cap"
        );
        let mut body = BatchBody::default();
        let max = crate::event::health::MAX_HEALTH_COUNT;
        let sensor = SensorInfo {
            version: "0".repeat(64),
            transport: "stdio".into(),
            health: Some(crate::event::health::Health {
                stdout_non_json: max,
                oversize_frames: max,
                orphan_responses: max,
                unobserved: max,
                tap_dropped_bytes: max,
            }),
        };
        body.push(&kept).expect("encodes");
        let batch = body.take(&sensor, u64::MAX).expect("encodes");
        assert!(
            batch.len() - size <= ENVELOPE_RESERVE,
            "the envelope fits its reserve"
        );
    }

    /// `ev` as the queue hands it over.
    fn written(mut ev: Event) -> Written {
        crate::event::EventWriter::default()
            .write(&mut ev)
            .expect("passes L3")
    }

    fn batcher(sink: Option<Sink>, rx: mpsc::Receiver<Written>, deadline: Deadline) -> Batcher {
        let tuning = Tuning::default();
        Batcher {
            rx,
            queue_dropped: Arc::default(),
            filtered: Arc::default(),
            sink,
            flush: Duration::from_secs(600),
            transport: "stdio",
            debug: false,
            tuning,
            deadline,
            published: Arc::default(),
            buf: BatchBody::default(),
            pacer: None,
            taken: Arc::default(),
            overflow: None,
            pending_dropped: 0,
            health: Default::default(),
            pending_health: Default::default(),
            cooldown: Cooldown::new(tuning.cooldown_min, tuning.cooldown_max),
            resume_at: None,
            stats: ReportStats::default(),
            log: FailureLog::default(),
        }
    }

    #[tokio::test]
    async fn batches_close_before_the_byte_cap_and_lose_no_event() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("events.jsonl");
        let n = 1200;
        let (tx, rx) = mpsc::channel(n);
        let mut ids = Vec::new();
        for _ in 0..n {
            let ev = wide_event();
            ids.push(ev.id.to_string());
            tx.try_send(written(ev)).expect("room");
        }
        drop(tx);
        let (_deadline_tx, deadline) = watch::channel(None);
        let sink = Sink::File(FileSink::new(path.clone()));
        let stats = batcher(Some(sink), rx, deadline).run().await;

        let text = std::fs::read_to_string(&path).expect("batches written");
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        for line in text.lines() {
            sizes.push(line.len());
            let batch: Value = serde_json::from_str(line).expect("a batch is JSON");
            for e in batch["events"].as_array().expect("events") {
                assert_eq!(e["rec"]["fields"].as_object().map(Map::len), Some(32));
                got.push(e["id"].as_str().expect("id").to_string());
            }
        }
        assert!(
            sizes.iter().all(|&s| s <= MAX_BATCH_BYTES),
            "batch sizes {sizes:?}"
        );
        assert!(
            sizes.len() >= 6,
            "1200 wide events need 6+ batches: {sizes:?}"
        );
        assert_eq!(got, ids, "every event once, in order");
        assert_eq!(stats.delivered, n as u64);
        assert_eq!(stats.dropped, 0);
    }

    // Real time, not `tokio::time::pause()`: that needs tokio's `test-util` feature, which this
    // crate does not build; the waits here are short and the bounds loose.
    #[tokio::test]
    async fn shutdown_during_a_back_off_past_the_deadline_gives_up_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (tx, rx) = mpsc::channel(16);
        for _ in 0..3 {
            tx.try_send(written(wide_event())).expect("room");
        }
        let start = Instant::now();
        let (deadline_tx, deadline) = watch::channel(Some(start + Duration::from_secs(2)));
        let sink = Sink::File(FileSink::new(dir.path().join("events.jsonl")));
        let mut b = batcher(Some(sink), rx, deadline);
        b.resume_at = Some(start + COOLDOWN_WAIT);
        let stats = b.run().await;
        drop(deadline_tx);
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "gave up at once, took {took:?}"
        );
        assert_eq!(stats.delivered, 0);
        assert_eq!(stats.dropped, 3);
        assert!(stats.deadline_hit);
    }

    #[tokio::test]
    async fn shutdown_waits_out_a_back_off_that_ends_before_the_deadline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("events.jsonl");
        let (tx, rx) = mpsc::channel(16);
        for _ in 0..3 {
            tx.try_send(written(wide_event())).expect("room");
        }
        let start = Instant::now();
        let (_deadline_tx, deadline) = watch::channel(Some(start + Duration::from_secs(10)));
        let mut b = batcher(Some(Sink::File(FileSink::new(path))), rx, deadline);
        b.resume_at = Some(start + Duration::from_millis(300));
        let stats = b.run().await;
        assert!(
            start.elapsed() >= Duration::from_millis(300),
            "the back-off held"
        );
        assert_eq!(stats.delivered, 3);
        assert!(!stats.deadline_hit);
    }

    /// A back-off far longer than any shutdown deadline.
    const COOLDOWN_WAIT: Duration = Duration::from_secs(30);
}
