//! Who may post a batch now: the per-key limit and the shared batch slots.
//!
//! Goes in: an authenticated key id. Comes out: a permit, or a refusal the server answers with
//! `Retry-After` (429 when the key already has its share of batches in flight, 503 when no
//! shared slot frees up within [`Limits::slot_wait`]). Every refusal is counted per key and shown
//! by `GET /v1/admin/sensors`, so an operator sees a sensor being throttled.
//!
//! Order matters: a batch takes its key's permit before its body is read (so one key cannot
//! hold more than [`Limits::max_batches_per_key`] bodies in memory), and a shared slot only
//! after the body is in (so slow bodies never hold the slots other keys need). It never waits
//! longer than `slot_wait` for either.
//!
//! The counters live in memory and count since the ingest started: a refusal happens when the
//! ingest is busiest, the one moment not to add a write to the store's queue.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, SemaphorePermit};

use super::Limits;
use crate::lock::lock;

/// Why a batch was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The key already has its share of batches in flight (answered 429).
    Rate,
    /// No shared slot within the wait (answered 503).
    Slots,
}

/// Refusals of one key since the ingest started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refusals {
    pub rate: u64,
    pub slots: u64,
}

struct KeyGate {
    in_flight: Arc<Semaphore>,
    rate: AtomicU64,
    slots: AtomicU64,
}

pub(crate) struct Admission {
    slots: Semaphore,
    per_key: usize,
    wait: std::time::Duration,
    /// One entry per key that posted; keys are minted by the operator, so this stays small.
    keys: Mutex<HashMap<String, Arc<KeyGate>>>,
}

impl Admission {
    pub fn new(limits: &Limits) -> Self {
        Admission {
            slots: Semaphore::new(limits.max_concurrent_batches.max(1)),
            per_key: limits.max_batches_per_key.max(1),
            wait: limits.slot_wait,
            keys: Mutex::new(HashMap::new()),
        }
    }

    fn gate(&self, key_id: &str) -> Arc<KeyGate> {
        let mut keys = lock(&self.keys);
        keys.entry(key_id.to_string())
            .or_insert_with(|| {
                Arc::new(KeyGate {
                    in_flight: Arc::new(Semaphore::new(self.per_key)),
                    rate: AtomicU64::new(0),
                    slots: AtomicU64::new(0),
                })
            })
            .clone()
    }

    fn refuse(&self, key_id: &str, why: Refusal) -> Refusal {
        let gate = self.gate(key_id);
        let n = match why {
            Refusal::Rate => &gate.rate,
            Refusal::Slots => &gate.slots,
        };
        let total = n.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        // The first refusal of a key, then every thousandth: visible, never a flood.
        if total == 1 || total % 1000 == 0 {
            tracing::warn!(key_id = %key_id, reason = ?why, total, "Batch refused; sensor asked to retry later");
        }
        why
    }

    /// One of the key's permits, waiting up to the slot wait for one to free up.
    pub async fn key_turn(&self, key_id: &str) -> Result<OwnedSemaphorePermit, Refusal> {
        let sem = self.gate(key_id).in_flight.clone();
        match tokio::time::timeout(self.wait, sem.acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            // Never closed; treated as busy should that change.
            Ok(Err(_)) | Err(_) => Err(self.refuse(key_id, Refusal::Rate)),
        }
    }

    /// A shared batch slot, waiting up to the slot wait.
    pub async fn slot(&self, key_id: &str) -> Result<SemaphorePermit<'_>, Refusal> {
        match tokio::time::timeout(self.wait, self.slots.acquire()).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(_)) | Err(_) => Err(self.refuse(key_id, Refusal::Slots)),
        }
    }

    /// Refusals per key id, for every key refused at least once.
    pub fn refusals(&self) -> HashMap<String, Refusals> {
        let keys = lock(&self.keys);
        keys.iter()
            .map(|(k, g)| {
                let r = Refusals {
                    rate: g.rate.load(Ordering::Relaxed),
                    slots: g.slots.load(Ordering::Relaxed),
                };
                (k.clone(), r)
            })
            .filter(|(_, r)| r.rate > 0 || r.slots > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits(slots: usize, per_key: usize) -> Limits {
        Limits {
            max_concurrent_batches: slots,
            max_batches_per_key: per_key,
            slot_wait: Duration::from_millis(50),
            ..Limits::default()
        }
    }

    #[tokio::test]
    async fn a_key_past_its_share_is_refused_for_rate_and_counted() {
        let a = Admission::new(&limits(16, 2));
        let _t1 = a.key_turn("k_a").await.expect("first");
        let _t2 = a.key_turn("k_a").await.expect("second");
        assert_eq!(a.key_turn("k_a").await.err(), Some(Refusal::Rate));
        // Another key is not affected.
        let _b = a.key_turn("k_b").await.expect("other key");
        let r = a.refusals();
        assert_eq!(r.get("k_a"), Some(&Refusals { rate: 1, slots: 0 }));
        assert!(!r.contains_key("k_b"));
    }

    #[tokio::test]
    async fn no_slot_within_the_wait_is_refused_for_slots_and_counted() {
        let a = Admission::new(&limits(1, 4));
        let held = a.slot("k_a").await.expect("slot");
        assert_eq!(a.slot("k_b").await.err(), Some(Refusal::Slots));
        drop(held);
        let _s = a.slot("k_b").await.expect("slot freed");
        assert_eq!(
            a.refusals().get("k_b"),
            Some(&Refusals { rate: 0, slots: 1 })
        );
    }
}
