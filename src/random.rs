//! The crate's one source of randomness: the OS generator, through ring's `SystemRandom`.
//!
//! Owns every random byte the crate uses: event and session ids, key ids, secrets, per-process
//! HMAC keys, temporary names, retry jitter. It must never fall back to anything guessable for
//! what has to be unique or secret. When the OS generator fails (no `getrandom(2)` and no
//! `/dev/urandom`, as in a sandbox that forbids both: in practice from the start, not midway),
//! every call says so with [`Unavailable`] and the caller refuses what it was making: the
//! ingest mints no key and starts with no secret; the sensor sends no event
//! ([`crate::event::new_event_id`]) rather than one under a clock-derived id, which another
//! event could share (the ingest stores an id once) and anyone could predict. The one
//! exception is [`spread_seed`], a jitter seed that only has to differ between processes.
//! Ids made per call (event, span and trace ids) come from a per-thread pool of OS bytes,
//! refilled with one call per 4 KiB ([`pooled`]); keys and secrets are drawn alone.

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// The OS random number generator failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the system random number generator is unavailable")]
pub struct Unavailable;

/// Fills `buf` from the OS generator.
pub fn fill(buf: &mut [u8]) -> Result<(), Unavailable> {
    SystemRandom::new().fill(buf).map_err(|_| Unavailable)
}

/// `N` bytes from the OS generator.
pub fn bytes<const N: usize>() -> Result<[u8; N], Unavailable> {
    let mut b = [0u8; N];
    fill(&mut b)?;
    Ok(b)
}

/// Random bytes fetched from the OS at a time for ids drawn per call (event ids, span and trace
/// ids): one `getrandom` per 4 KiB instead of one per id, where the system call was the single
/// largest kernel cost of observing a call.
pub(crate) const POOL_BYTES: usize = 4096;

thread_local! {
    /// OS random bytes not yet handed out, and how many are used.
    static POOL: std::cell::RefCell<(Box<[u8; POOL_BYTES]>, usize)> =
        std::cell::RefCell::new((Box::new([0u8; POOL_BYTES]), POOL_BYTES));
}

/// `N` bytes from the OS generator, through this thread's pool: each byte is handed out once,
/// and the pool is refilled whole from the OS when it runs short, so an id is as random as one
/// drawn alone. For ids only (`N` ≤ 64); keys and secrets draw with [`bytes`](fn@bytes).
pub fn pooled<const N: usize>() -> Result<[u8; N], Unavailable> {
    const { assert!(N <= 64) };
    let mut b = [0u8; N];
    POOL.with(|pool| {
        let (bytes, used) = &mut *pool.borrow_mut();
        if *used + N > POOL_BYTES {
            fill(&mut bytes[..])?;
            *used = 0;
        }
        b.copy_from_slice(&bytes[*used..*used + N]);
        // Handed-out bytes are not kept: the pool holds only what no id has had.
        bytes[*used..*used + N].fill(0);
        *used += N;
        Ok(b)
    })
}

/// Bytes in an HMAC-SHA256 key: the digest's output length, what `hmac::Key::generate` draws.
pub const HMAC_KEY_BYTES: usize = 32;

/// A fresh HMAC-SHA256 key of [`HMAC_KEY_BYTES`] random bytes, for a key that lives only in
/// this process (never stored, never sent).
pub fn hmac_key() -> Result<hmac::Key, Unavailable> {
    Ok(hmac::Key::new(
        hmac::HMAC_SHA256,
        &bytes::<HMAC_KEY_BYTES>()?,
    ))
}

/// A seed for retry jitter, whose only job is to differ between processes so that sensors that
/// lost the same ingest do not retry in step. Neither secret nor an identity, so without the OS
/// generator the clock and the pid do: refusing to retry would lose events for nothing.
pub fn spread_seed() -> u64 {
    match bytes::<8>() {
        Ok(b) => u64::from_le_bytes(b),
        Err(Unavailable) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or_default();
            t ^ u64::from(std::process::id())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_differ() {
        assert_ne!(bytes::<16>(), bytes::<16>());
        assert_ne!(spread_seed(), spread_seed());
    }

    /// Pooled draws never repeat a byte run, across a refill too, and each is as long as asked.
    #[test]
    fn pooled_draws_differ_across_refills() {
        let draws: Vec<[u8; 16]> = (0..(2 * POOL_BYTES / 16 + 3))
            .map(|_| pooled::<16>().expect("randomness"))
            .collect();
        let distinct: std::collections::HashSet<_> = draws.iter().collect();
        assert_eq!(distinct.len(), draws.len());
        assert!(draws.iter().all(|d| d != &[0u8; 16]));
        assert_ne!(pooled::<8>(), pooled::<8>());
    }

    #[test]
    fn hmac_keys_differ() {
        let (a, b) = (
            hmac_key().expect("randomness"),
            hmac_key().expect("randomness"),
        );
        assert_ne!(hmac::sign(&a, b"x").as_ref(), hmac::sign(&b, b"x").as_ref());
    }
}
