//! What may be retried, and how long to wait: before the one retry of a batch, and between
//! batches while the ingest keeps failing.
//!
//! Owns [`DeliveryError`] (every way one delivery attempt can fail), [`is_retriable`], the ONE
//! place that decides whether a failure is worth a second attempt, and the waits: the one
//! retry's delay ([`backoff`], stretched to the ingest's `Retry-After` by [`retry_delay`]),
//! `Retry-After` itself ([`parse_retry_after`], capped at [`MAX_RETRY_AFTER`]) and
//! [`Cooldown`], the back-off between batches. Goes in: the error of one attempt. Comes out: a
//! yes/no and durations. It never sleeps itself and never decides anything else (what to
//! count, what to log): that is the batcher's job.

use std::time::{Duration, SystemTime};

use backon::{BackoffBuilder, ConstantBuilder, ExponentialBuilder};

use crate::random::spread_seed;

/// Base delay before the single retry. Long enough for an ingest that is restarting or briefly
/// overloaded to recover, short enough that a retry fits well inside the 2 s shutdown deadline.
pub const RETRY_DELAY: Duration = Duration::from_millis(250);

/// Retries per batch: exactly one (DESIGN §2 invariant 4). A second retry would hold the single
/// in-flight slot longer while the queue behind it fills; the ingest's de-duplication on event id
/// makes one retry safe even when the first attempt did arrive.
pub const MAX_RETRIES: usize = 1;

/// Longest `Retry-After` obeyed. An ingest asking for more is still given a minute of quiet,
/// but no more: the queue (10,000 events) is full after 20 s at 500 calls per second anyway,
/// and a wrong or hostile header (`Retry-After: 86400`) must not silence the sensor for a day.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// First pause between batches after a batch failed (its retry included). Four times the retry
/// delay: a blip (an ingest restarting) costs the next batch a second, not more.
pub const COOLDOWN_MIN: Duration = Duration::from_secs(1);

/// Longest pause between batches (jitter included) while the ingest keeps failing. The pause
/// doubles per failed batch and reaches this after about five (a minute of outage): a dead
/// ingest then sees two requests per 30 s per sensor, and a recovered one is found within 30 s.
pub const COOLDOWN_MAX: Duration = Duration::from_secs(30);

/// Growth of the pause per failed batch.
const COOLDOWN_FACTOR: f32 = 2.0;

/// Statuses whose `Retry-After` is obeyed: "too many requests" and "unavailable" are the two
/// that RFC 9110 and RFC 6585 pair with it. On any other status it is ignored.
pub const RETRY_AFTER_STATUSES: [u16; 2] = [STATUS_TOO_MANY_REQUESTS, STATUS_UNAVAILABLE];

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
    /// The ingest answered with a non-2xx status (and no `Retry-After` that is obeyed).
    #[error("the ingest answered HTTP {0}")]
    Status(u16),
    /// The ingest answered 429 or 503 and asked, with `Retry-After`, to be left alone this long
    /// (already capped at [`MAX_RETRY_AFTER`]).
    #[error("the ingest answered HTTP {status} (retry after {}s)", retry_after.as_secs())]
    Throttled { status: u16, retry_after: Duration },
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
/// HTTP status for "unavailable": retried like any 5xx, and its `Retry-After` obeyed.
pub const STATUS_UNAVAILABLE: u16 = 503;

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
        DeliveryError::Throttled { .. } => true,
        DeliveryError::File(_) | DeliveryError::Encode(_) => false,
    }
}

/// The error for a non-2xx answer: [`DeliveryError::Throttled`] when the status is one of
/// [`RETRY_AFTER_STATUSES`] and its `Retry-After` (outside input: any text) parses, else
/// [`DeliveryError::Status`].
pub fn status_error(status: u16, retry_after: Option<&str>, now: SystemTime) -> DeliveryError {
    let wait = if RETRY_AFTER_STATUSES.contains(&status) {
        retry_after.and_then(|v| parse_retry_after(v, now))
    } else {
        None
    };
    match wait {
        Some(retry_after) => DeliveryError::Throttled {
            status,
            retry_after,
        },
        None => DeliveryError::Status(status),
    }
}

/// A `Retry-After` value (RFC 9110 §10.2.3) as a wait from `now`, capped at
/// [`MAX_RETRY_AFTER`]: delay-seconds (`120`) or an HTTP date
/// (`Wed, 21 Oct 2026 07:28:00 GMT`, the IMF-fixdate form every sender must use). A date in the
/// past is a wait of zero; anything else (empty, negative, a fraction, the obsolete date forms)
/// is `None`, as if there were no header.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Digits only, so the one possible error is overflow: a wait longer than any cap.
        Duration::from_secs(value.parse::<u64>().unwrap_or(u64::MAX))
    } else {
        let at = parse_http_date(value)?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form RFC 9110 requires senders to use.
fn parse_http_date(value: &str) -> Option<SystemTime> {
    use time::macros::format_description;
    let fmt = format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    let at = time::PrimitiveDateTime::parse(value, &fmt)
        .ok()?
        .assume_utc();
    Some(SystemTime::from(at))
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
        .with_jitter_seed(spread_seed())
}

/// The wait before the retry of an attempt that failed with `err`, given the `planned` one of
/// [`backoff`]: at least the ingest's `Retry-After` when it sent one. `None` (no retry left)
/// stays `None`: `Retry-After` stretches the one retry, it never adds one.
pub fn retry_delay(err: &DeliveryError, planned: Option<Duration>) -> Option<Duration> {
    let planned = planned?;
    Some(match retry_after_of(err) {
        Some(asked) => planned.max(asked),
        None => planned,
    })
}

/// The `Retry-After` an error carries, if any.
pub fn retry_after_of(err: &DeliveryError) -> Option<Duration> {
    match err {
        DeliveryError::Throttled { retry_after, .. } => Some(*retry_after),
        _ => None,
    }
}

/// The back-off between batches while the ingest keeps failing: after each failed batch the
/// next waits `min` · 2ⁿ plus up to as much again of jitter, never more than `max` (jitter
/// included), and never less than the `Retry-After` the ingest last sent. A delivered batch
/// resets it.
#[derive(Debug)]
pub struct Cooldown {
    min: Duration,
    max: Duration,
    /// `None` until a batch fails, and again after one is delivered.
    current: Option<<ExponentialBuilder as BackoffBuilder>::Backoff>,
}

impl Cooldown {
    pub fn new(min: Duration, max: Duration) -> Cooldown {
        Cooldown {
            min,
            max,
            current: None,
        }
    }

    /// A batch failed (its retry included): how long the next one must wait. `asked` is the
    /// ingest's `Retry-After` (already capped at [`MAX_RETRY_AFTER`], which may exceed `max`).
    pub fn failed(&mut self, asked: Option<Duration>) -> Duration {
        let (min, max) = (self.min, self.max);
        let steps = self.current.get_or_insert_with(|| {
            // The doubling stops at half the cap, so that the jitter (up to as much again)
            // still spreads sensors apart once they are all at the cap.
            ExponentialBuilder::new()
                .with_min_delay(min)
                .with_max_delay(max / 2)
                .with_factor(COOLDOWN_FACTOR)
                .without_max_times()
                .with_jitter()
                .with_jitter_seed(spread_seed())
                .build()
        });
        let pause = steps.next().unwrap_or(max).min(max);
        asked.map_or(pause, |asked| pause.max(asked))
    }

    /// A batch was delivered: the next failure starts again from `min`.
    pub fn succeeded(&mut self) {
        self.current = None;
    }
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
    fn throttled_answers_are_retriable() {
        for status in RETRY_AFTER_STATUSES {
            let e = DeliveryError::Throttled {
                status,
                retry_after: Duration::from_secs(1),
            };
            assert!(is_retriable(&e), "{e:?} should be retried");
        }
    }

    #[test]
    fn retry_after_delay_seconds_is_the_wait() {
        let now = SystemTime::now();
        assert_eq!(parse_retry_after("1", now), Some(Duration::from_secs(1)));
        assert_eq!(parse_retry_after(" 5 ", now), Some(Duration::from_secs(5)));
        assert_eq!(parse_retry_after("0", now), Some(Duration::ZERO));
    }

    #[test]
    fn retry_after_of_an_hour_is_capped_at_sixty_seconds() {
        let now = SystemTime::now();
        assert_eq!(parse_retry_after("3600", now), Some(MAX_RETRY_AFTER));
        assert_eq!(MAX_RETRY_AFTER, Duration::from_secs(60));
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(MAX_RETRY_AFTER),
            "an overflowing number is a very long wait, capped"
        );
        let e = status_error(503, Some("3600"), now);
        assert_eq!(retry_after_of(&e), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn retry_after_http_date_is_a_wait_from_now() {
        // Sun, 06 Nov 1994 08:49:37 GMT is 784111777 s after the epoch.
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        let ten_before = at - Duration::from_secs(10);
        assert_eq!(
            parse_retry_after(date, ten_before),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after(date, at + Duration::from_secs(5)),
            Some(Duration::ZERO),
            "a date in the past: retry now"
        );
        assert_eq!(
            parse_retry_after(date, at - Duration::from_secs(7200)),
            Some(MAX_RETRY_AFTER),
            "a date two hours ahead is capped too"
        );
    }

    #[test]
    fn malformed_retry_after_is_ignored() {
        let now = SystemTime::now();
        for v in [
            "",
            " ",
            "-1",
            "1.5",
            "soon",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 PST",
            "\u{0}",
        ] {
            assert_eq!(parse_retry_after(v, now), None, "{v:?}");
        }
        assert_eq!(
            status_error(503, Some("soon"), now),
            DeliveryError::Status(503)
        );
    }

    #[test]
    fn retry_after_is_obeyed_only_on_429_and_503() {
        let now = SystemTime::now();
        for status in [429, 503] {
            assert_eq!(
                status_error(status, Some("2"), now),
                DeliveryError::Throttled {
                    status,
                    retry_after: Duration::from_secs(2)
                }
            );
        }
        for status in [500, 502, 413, 400] {
            assert_eq!(
                status_error(status, Some("2"), now),
                DeliveryError::Status(status)
            );
        }
        assert_eq!(status_error(503, None, now), DeliveryError::Status(503));
    }

    #[test]
    fn retry_after_stretches_the_one_retry_but_never_adds_one() {
        let planned = Some(Duration::from_millis(300));
        let asked = DeliveryError::Throttled {
            status: 503,
            retry_after: Duration::from_secs(2),
        };
        assert_eq!(retry_delay(&asked, planned), Some(Duration::from_secs(2)));
        let brief = DeliveryError::Throttled {
            status: 429,
            retry_after: Duration::ZERO,
        };
        assert_eq!(retry_delay(&brief, planned), planned, "never shorter");
        assert_eq!(retry_delay(&DeliveryError::Status(503), planned), planned);
        assert_eq!(retry_delay(&asked, None), None);
    }

    #[test]
    fn cooldown_doubles_with_jitter_up_to_its_cap_and_resets_on_success() {
        let s = Duration::from_secs;
        let mut c = Cooldown::new(COOLDOWN_MIN, COOLDOWN_MAX);
        // [min·2ⁿ, 2·min·2ⁿ) until the doubling reaches half the cap; then [cap/2, cap].
        let ranges = [
            (1, 2),
            (2, 4),
            (4, 8),
            (8, 16),
            (15, 30),
            (15, 30),
            (15, 30),
        ];
        for (i, (lo, hi)) in ranges.into_iter().enumerate() {
            let d = c.failed(None);
            assert!(d >= s(lo) && d <= s(hi), "failure {}: {d:?}", i + 1);
        }
        for _ in 0..50 {
            assert!(c.failed(None) <= COOLDOWN_MAX);
        }
        c.succeeded();
        let d = c.failed(None);
        assert!(
            d >= s(1) && d < s(2),
            "after a success it starts over: {d:?}"
        );
    }

    #[test]
    fn cooldown_never_undercuts_retry_after() {
        let mut c = Cooldown::new(COOLDOWN_MIN, COOLDOWN_MAX);
        assert_eq!(c.failed(Some(MAX_RETRY_AFTER)), MAX_RETRY_AFTER);
        let d = c.failed(Some(Duration::from_millis(10)));
        assert!(d >= Duration::from_secs(2), "the doubling goes on: {d:?}");
    }

    #[test]
    fn backoff_yields_one_jittered_delay() {
        let delay = Duration::from_millis(100);
        let delays: Vec<Duration> = backoff(delay).build().collect();
        assert_eq!(delays.len(), MAX_RETRIES);
        assert!(delays[0] >= delay && delays[0] < delay * 2, "{delays:?}");
    }
}
