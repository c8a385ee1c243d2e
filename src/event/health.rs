//! `sensor.health`: what the sensor saw go wrong since its previous batch, as counts only.
//!
//! Owns the wire form ([`Health`], in every batch) and the counters behind it
//! ([`HealthCounters`]), which the observer adds to and the reporter takes when it builds a
//! batch. Here, beside the event, because both sides use it and neither may import the other.
//! Only counts: never a message, a line or a byte of what was relayed.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Largest count of one kind a batch may report; the ingest rejects a batch over it (as it does
/// a `dropped` over its own limit), so a sensor saturates its counters here.
pub const MAX_HEALTH_COUNT: u64 = 1_000_000_000_000;

/// The counts since the previous batch (all zero is sent too: a healthy sensor says so).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Server→client messages (stdio: stdout lines) that are not JSON: a server that logs to
    /// stdout corrupts the protocol stream its client reads.
    #[serde(rename = "stdoutNonJson")]
    pub stdout_non_json: u64,
    /// Messages too large to observe (over the frame cap): relayed, measured, not read.
    #[serde(rename = "oversizeFrames")]
    pub oversize_frames: u64,
    /// Responses whose request was never seen (unknown or repeated id).
    #[serde(rename = "orphanResponses")]
    pub orphan_responses: u64,
    /// Calls that made no event because they could not be observed: their answer, or their
    /// request, was lost to the observer (every client message it lost, in HTTP mode every
    /// POST, counts as a call).
    pub unobserved: u64,
    /// Bytes the relay could not hand to the observer (it fell behind).
    #[serde(rename = "tapDroppedBytes")]
    pub tap_dropped_bytes: u64,
}

impl Health {
    /// `self + other`, each count saturating at [`MAX_HEALTH_COUNT`].
    pub fn plus(self, o: Health) -> Health {
        let add = |a: u64, b: u64| a.saturating_add(b).min(MAX_HEALTH_COUNT);
        Health {
            stdout_non_json: add(self.stdout_non_json, o.stdout_non_json),
            oversize_frames: add(self.oversize_frames, o.oversize_frames),
            orphan_responses: add(self.orphan_responses, o.orphan_responses),
            unobserved: add(self.unobserved, o.unobserved),
            tap_dropped_bytes: add(self.tap_dropped_bytes, o.tap_dropped_bytes),
        }
    }
}

/// The counters the observer adds to and the reporter takes (lock-free: the observer never
/// waits on the reporter).
#[derive(Debug, Default)]
pub struct HealthCounters {
    stdout_non_json: AtomicU64,
    oversize_frames: AtomicU64,
    orphan_responses: AtomicU64,
    unobserved: AtomicU64,
    tap_dropped_bytes: AtomicU64,
}

impl HealthCounters {
    pub fn add(&self, h: Health) {
        let add = |a: &AtomicU64, n: u64| {
            if n > 0 {
                a.fetch_add(n, Ordering::Relaxed);
            }
        };
        add(&self.stdout_non_json, h.stdout_non_json);
        add(&self.oversize_frames, h.oversize_frames);
        add(&self.orphan_responses, h.orphan_responses);
        add(&self.unobserved, h.unobserved);
        add(&self.tap_dropped_bytes, h.tap_dropped_bytes);
    }

    /// Everything added since the last take.
    pub fn take(&self) -> Health {
        let take = |a: &AtomicU64| a.swap(0, Ordering::Relaxed).min(MAX_HEALTH_COUNT);
        Health {
            stdout_non_json: take(&self.stdout_non_json),
            oversize_frames: take(&self.oversize_frames),
            orphan_responses: take(&self.orphan_responses),
            unobserved: take(&self.unobserved),
            tap_dropped_bytes: take(&self.tap_dropped_bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_taken_once_and_saturate() {
        let c = HealthCounters::default();
        c.add(Health {
            stdout_non_json: 2,
            unobserved: 1,
            ..Health::default()
        });
        c.add(Health {
            stdout_non_json: 1,
            tap_dropped_bytes: 10,
            ..Health::default()
        });
        let h = c.take();
        assert_eq!(
            (h.stdout_non_json, h.unobserved, h.tap_dropped_bytes),
            (3, 1, 10)
        );
        assert_eq!(c.take(), Health::default());
        let big = Health {
            oversize_frames: u64::MAX,
            ..Health::default()
        };
        assert_eq!(big.plus(big).oversize_frames, MAX_HEALTH_COUNT);
    }
}
