//! Delivery accounting and the reporter's stderr discipline.
//!
//! Owns [`ReportStats`] (what was delivered, what was lost and why) and [`FailureLog`], which
//! lets each kind of failure reach stderr once per process and then summarises the counts at
//! shutdown. Goes in: outcomes from the batcher. Comes out: counters and at most a handful of
//! stderr lines. It must never log per event or per batch above debug level, never log a token,
//! and never write to stdout.

use std::time::Duration;

use super::retry::{DeliveryError, STATUS_UNAUTHORIZED};

/// Totals of one reporter's life, returned by [`super::ReporterHandle::shutdown`].
///
/// `dropped` is every event the observer produced that did not reach the sink, whatever the
/// reason; the other counters say why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportStats {
    /// Events in batches the sink accepted.
    pub delivered: u64,
    /// Events that never reached the sink: `queue_full + filtered + failed`.
    pub dropped: u64,
    /// Batches the sink accepted.
    pub batches: u64,
    /// Events dropped because the queue between observer and batcher was full (newest dropped).
    pub queue_full: u64,
    /// Events the L3 filter (`validate_and_filter_event`) rejected; never sent.
    pub filtered: u64,
    /// Events in batches that failed (after the retry, or not retriable), that were still queued
    /// when the shutdown deadline passed, or that came after the key was revoked.
    pub failed: u64,
    /// Batches that failed (their events are in `failed`).
    pub failed_batches: u64,
    /// Retry attempts made.
    pub retries: u64,
    /// The ingest answered 401: the key is treated as revoked and nothing more was sent.
    pub revoked: bool,
    /// The shutdown deadline passed before everything queued was flushed.
    pub deadline_hit: bool,
    /// Events discarded because reporting is off (no token, bad ingest): not counted as
    /// dropped, since nothing was ever meant to be sent.
    pub unsent: u64,
}

/// The kinds of failure that are worth one line on stderr each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureKind {
    Connect,
    Timeout,
    Transport,
    ServerError,
    RateLimited,
    Rejected,
    Revoked,
    File,
    Encode,
    Filter,
    QueueFull,
    Deadline,
}

impl FailureKind {
    pub(crate) fn of(err: &DeliveryError) -> Self {
        match err {
            DeliveryError::Connect(_) => FailureKind::Connect,
            DeliveryError::Timeout => FailureKind::Timeout,
            DeliveryError::Transport(_) => FailureKind::Transport,
            DeliveryError::Status(STATUS_UNAUTHORIZED) => FailureKind::Revoked,
            DeliveryError::Status(429) => FailureKind::RateLimited,
            DeliveryError::Status(s) if *s >= 500 => FailureKind::ServerError,
            DeliveryError::Status(_) => FailureKind::Rejected,
            DeliveryError::Throttled { status: 429, .. } => FailureKind::RateLimited,
            DeliveryError::Throttled { .. } => FailureKind::ServerError,
            DeliveryError::File(_) => FailureKind::File,
            DeliveryError::Encode(_) => FailureKind::Encode,
        }
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// Remembers which kinds of failure were already reported.
#[derive(Debug, Default)]
pub(crate) struct FailureLog {
    seen: u32,
}

impl FailureLog {
    /// True the first time `kind` is seen in this process: the caller logs it then, and only then.
    pub(crate) fn first(&mut self, kind: FailureKind) -> bool {
        let new = self.seen & kind.bit() == 0;
        self.seen |= kind.bit();
        new
    }

    pub(crate) fn any(&self) -> bool {
        self.seen != 0
    }
}

/// One line per failure kind, the first time it happens. Never includes the token or an event.
pub(crate) fn warn_once(log: &mut FailureLog, kind: FailureKind, detail: &dyn std::fmt::Display) {
    if !log.first(kind) {
        return;
    }
    match kind {
        FailureKind::Revoked => tracing::warn!(
            "The ingest rejected the sensor token (HTTP 401): treating the key as revoked; no more events will be sent by this process"
        ),
        FailureKind::QueueFull => tracing::warn!(
            "Event queue full: newer events are being dropped and counted (the ingest is slower than the traffic)"
        ),
        FailureKind::Filter => tracing::warn!(
            "An event failed the schema filter and was not sent (counted)"
        ),
        FailureKind::Deadline => tracing::warn!(
            "Shutdown deadline reached with events still unsent: they are counted as dropped"
        ),
        _ => tracing::warn!(
            "Event delivery failed: {detail}; the batch is dropped and counted, later failures of this kind are only counted"
        ),
    }
}

/// The shutdown summary: printed when anything went wrong, or always with `--debug`.
pub(crate) fn summarise(stats: &ReportStats, log: &FailureLog, debug: bool, took: Duration) {
    let troubled = log.any() || stats.dropped > 0;
    if !(troubled || debug) {
        return;
    }
    let took_ms = took.as_millis() as u64;
    if troubled {
        tracing::warn!(
            delivered = stats.delivered,
            batches = stats.batches,
            dropped = stats.dropped,
            queue_full = stats.queue_full,
            filtered = stats.filtered,
            failed = stats.failed,
            failed_batches = stats.failed_batches,
            retries = stats.retries,
            revoked = stats.revoked,
            shutdown_ms = took_ms,
            "Reporter summary"
        );
    } else {
        tracing::debug!(
            delivered = stats.delivered,
            batches = stats.batches,
            unsent = stats.unsent,
            shutdown_ms = took_ms,
            "Reporter summary"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_kind_is_reported_once() {
        let mut log = FailureLog::default();
        assert!(!log.any());
        assert!(log.first(FailureKind::Timeout));
        assert!(!log.first(FailureKind::Timeout));
        assert!(log.first(FailureKind::Connect));
        assert!(log.any());
    }

    #[test]
    fn statuses_map_to_kinds() {
        assert_eq!(
            FailureKind::of(&DeliveryError::Status(401)),
            FailureKind::Revoked
        );
        assert_eq!(
            FailureKind::of(&DeliveryError::Status(413)),
            FailureKind::Rejected
        );
        assert_eq!(
            FailureKind::of(&DeliveryError::Status(503)),
            FailureKind::ServerError
        );
        assert_eq!(
            FailureKind::of(&DeliveryError::Status(429)),
            FailureKind::RateLimited
        );
        let throttled = |status| DeliveryError::Throttled {
            status,
            retry_after: std::time::Duration::from_secs(1),
        };
        assert_eq!(FailureKind::of(&throttled(429)), FailureKind::RateLimited);
        assert_eq!(FailureKind::of(&throttled(503)), FailureKind::ServerError);
    }
}
