//! What may be retried, and how long to wait before the one retry.
//!
//! Owns [`DeliveryError`] (every way one delivery attempt can fail) and [`is_retriable`], the
//! ONE place that decides whether a failure is worth a second attempt. Goes in: the error of
//! one attempt. Comes out: a yes/no, and the backoff policy the batcher hands to `backon`.
//! It must never decide anything else (what to count, what to log): that is the batcher's job.

use std::time::Duration;

use backon::ConstantBuilder;

/// Base delay before the single retry. Long enough for an ingest that is restarting or briefly
/// overloaded to recover, short enough that a retry fits well inside the 2 s shutdown deadline.
pub const RETRY_DELAY: Duration = Duration::from_millis(250);

/// Retries per batch: exactly one (DESIGN §2 invariant 4). A second retry would hold the single
/// in-flight slot longer while the queue behind it fills; the ingest's de-duplication on event id
/// makes one retry safe even when the first attempt did arrive.
pub const MAX_RETRIES: usize = 1;

/// Why one delivery attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryError {
    /// No TCP (or TLS) connection could be made: refused, unreachable, DNS, handshake.
    #[error("cannot connect to the ingest: {0}")]
    Connect(String),
    /// Connect or request timeout: the ingest accepted the connection but did not answer in time.
    #[error("the ingest did not answer in time")]
    Timeout,
    /// The connection broke mid-request (reset, closed early).
    #[error("the connection to the ingest failed: {0}")]
    Transport(String),
    /// The ingest answered with a non-2xx status.
    #[error("the ingest answered HTTP {0}")]
    Status(u16),
    /// Writing to a `file:` sink failed.
    #[error("cannot append to the event file: {0}")]
    File(String),
    /// The batch could not be encoded (a bug, never expected).
    #[error("cannot encode the batch: {0}")]
    Encode(String),
}

/// HTTP status that means the key was revoked or is unknown (DESIGN §6): stop sending.
pub const STATUS_UNAUTHORIZED: u16 = 401;
/// HTTP status for "slow down": retried like a 5xx.
pub const STATUS_TOO_MANY_REQUESTS: u16 = 429;

/// The one retry classification: connect errors, timeouts, broken connections, 5xx and 429 are
/// retried (once); every other status (400, 401, 413, 3xx…) and local errors are not, because
/// sending the same bytes again would get the same answer.
///
/// A broken connection is retried although the request may have arrived: the ingest
/// de-duplicates on event id, so a duplicate delivery is harmless while a lost batch is not.
pub fn is_retriable(err: &DeliveryError) -> bool {
    match err {
        DeliveryError::Connect(_) | DeliveryError::Timeout | DeliveryError::Transport(_) => true,
        DeliveryError::Status(s) => *s >= 500 || *s == STATUS_TOO_MANY_REQUESTS,
        DeliveryError::File(_) | DeliveryError::Encode(_) => false,
    }
}

/// The backoff for one batch: [`MAX_RETRIES`] retry after `delay` plus up to `delay` of jitter
/// (so `[delay, 2·delay)`), so that many sensors that lost the same ingest do not all come back
/// in the same millisecond. The jitter seed comes from the OS RNG: `backon` without its `std`
/// feature would otherwise use the same fixed seed in every process.
pub fn backoff(delay: Duration) -> ConstantBuilder {
    ConstantBuilder::new()
        .with_delay(delay)
        .with_max_times(MAX_RETRIES)
        .with_jitter()
        .with_jitter_seed(random_seed())
}

fn random_seed() -> u64 {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut b = [0u8; 8];
    if SystemRandom::new().fill(&mut b).is_err() {
        // No OS RNG: any per-process value still spreads sensors apart.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default();
        return t ^ u64::from(std::process::id());
    }
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use backon::BackoffBuilder;

    #[test]
    fn transient_failures_are_retriable() {
        for e in [
            DeliveryError::Connect("refused".into()),
            DeliveryError::Timeout,
            DeliveryError::Transport("reset".into()),
            DeliveryError::Status(500),
            DeliveryError::Status(502),
            DeliveryError::Status(503),
            DeliveryError::Status(504),
            DeliveryError::Status(429),
        ] {
            assert!(is_retriable(&e), "{e:?} should be retried");
        }
    }

    #[test]
    fn client_errors_and_local_failures_are_not_retriable() {
        for e in [
            DeliveryError::Status(400),
            DeliveryError::Status(401),
            DeliveryError::Status(403),
            DeliveryError::Status(404),
            DeliveryError::Status(413),
            DeliveryError::Status(301),
            DeliveryError::File("disk full".into()),
            DeliveryError::Encode("bug".into()),
        ] {
            assert!(!is_retriable(&e), "{e:?} should not be retried");
        }
    }

    #[test]
    fn backoff_yields_one_jittered_delay() {
        let delay = Duration::from_millis(100);
        let delays: Vec<Duration> = backoff(delay).build().collect();
        assert_eq!(delays.len(), MAX_RETRIES);
        assert!(delays[0] >= delay && delays[0] < delay * 2, "{delays:?}");
    }
}
