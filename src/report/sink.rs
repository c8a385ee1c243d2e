//! Where an encoded batch goes: the ingest over HTTP(S), or a local JSON-lines file.
//!
//! Owns one delivery attempt: [`Sink::send_once`] takes the bytes of one batch and returns `Ok`
//! or a [`DeliveryError`] (which carries the ingest's `Retry-After` on a 429 or 503, parsed by
//! [`super::retry::status_error`]). Retrying, waiting, counting and logging belong to the batcher
//! ([`super::batch`]). It must never log or echo the token and never open a socket before the
//! first batch is sent; its client follows the crate's one HTTP client policy
//! ([`crate::http_client`]: no redirect, no proxy from the environment, fixed timeouts).
//!
//! **HTTP**: `POST <base>/v1/events`, `Authorization: Bearer <token>`,
//! `Content-Type: application/json`, HTTP/1.1 with keep-alive (one idle connection kept).
//! Bodies are **not gzipped**: a batch is at most 500 metadata-only events and 1 MiB (usually
//! tens of KB), the default ingest is on loopback where compression only costs CPU on the host
//! we must not disturb, and an uncompressed body keeps the ingest free of decompression-bomb
//! handling and its body limit (413) meaningful.
//!
//! **TLS**: rustls with the `ring` provider, the operating system's roots (else the Mozilla
//! roots compiled in), plus the private CA of `--ingest-ca` / `BOUNDED_INGEST_CA` when given
//! (see [`crate::http_client`]).
//!
//! **File** (`--ingest file:PATH`): each batch is appended as one line (the batch JSON plus
//! `\n`) with a single `write` on a file opened with `O_APPEND`, created if missing, so
//! concurrent writers never interleave inside a line.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};

use rustls::pki_types::CertificateDer;

use super::retry::{status_error, DeliveryError};
use crate::http_client::ClientOptions;
use crate::token::SensorToken;

/// Path the batches are posted to, under the ingest base (DESIGN §4).
pub const EVENTS_PATH: &str = "/v1/events";

pub use crate::http_client::{CONNECT_TIMEOUT, REQUEST_TIMEOUT};

/// Most bytes of an ingest answer that are read (to let the connection be reused); the answer
/// is a tiny `{accepted, rejected, duplicates}` object and nothing in it changes what we do.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// Idle connections kept to the ingest: one, since at most one request is ever in flight.
const POOL_IDLE_PER_HOST: usize = 1;

/// Timeouts and waits of delivery; [`Default`] is what the wrapper uses. Tests shorten them so
/// that a black-holed or failing ingest can be exercised in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    /// Base delay before the single retry (jitter adds up to the same again).
    pub retry_delay: Duration,
    /// First pause between batches after one failed (see [`super::retry::Cooldown`]).
    pub cooldown_min: Duration,
    /// Longest pause between batches, jitter included.
    pub cooldown_max: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            connect_timeout: CONNECT_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
            retry_delay: super::retry::RETRY_DELAY,
            cooldown_min: super::retry::COOLDOWN_MIN,
            cooldown_max: super::retry::COOLDOWN_MAX,
        }
    }
}

/// A destination for encoded batches.
pub(crate) enum Sink {
    Http(HttpSink),
    File(FileSink),
}

impl Sink {
    /// One attempt to deliver one encoded batch.
    pub(crate) async fn send_once(&self, body: &Bytes) -> Result<(), DeliveryError> {
        match self {
            Sink::Http(s) => s.send_once(body).await,
            Sink::File(f) => f.append(body).await,
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Sink::Http(s) => crate::log::redact_url(&s.url),
            Sink::File(f) => format!("file:{}", f.path.display()),
        }
    }
}

pub(crate) struct HttpSink {
    client: reqwest::Client,
    url: String,
    auth: HeaderValue,
}

impl HttpSink {
    /// Builds the client (no socket is opened until the first send); `extra_roots` is the
    /// private CA of `--ingest-ca`, if any. `Err` only when no TLS configuration at all can be
    /// built or the token cannot be a header value; the caller then reports nothing (fail open).
    pub(crate) fn new(
        base: &str,
        token: &SensorToken,
        tuning: &Tuning,
        extra_roots: &[CertificateDer<'static>],
    ) -> Result<HttpSink, DeliveryError> {
        let client = crate::http_client::build(&ClientOptions {
            connect_timeout: tuning.connect_timeout,
            request_timeout: tuning.request_timeout,
            extra_roots: extra_roots.to_vec(),
            max_idle_per_host: POOL_IDLE_PER_HOST,
        })
        .map_err(|e| DeliveryError::Connect(e.0))?;
        let mut auth = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
            .map_err(|_| DeliveryError::Encode("token is not a valid header value".into()))?;
        auth.set_sensitive(true);
        Ok(HttpSink {
            client,
            url: format!("{}{EVENTS_PATH}", base.trim_end_matches('/')),
            auth,
        })
    }

    async fn send_once(&self, body: &Bytes) -> Result<(), DeliveryError> {
        let resp = self
            .client
            .post(&self.url)
            .header(AUTHORIZATION, self.auth.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(body.clone())
            .send()
            .await
            .map_err(classify)?;
        outcome(resp).await
    }
}

/// What a delivery's answer means: success, or the retry classification of its status (with
/// its `Retry-After`). Shared by every HTTP delivery of ours (the ingest's, OTLP's).
pub(crate) async fn outcome(mut resp: reqwest::Response) -> Result<(), DeliveryError> {
    let status = resp.status();
    // Outside input: a header that is not visible ASCII is treated as absent.
    let retry_after = resp
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Read (a bounded amount of) the answer so the connection can be reused; a failure here
    // does not change the outcome the status already decided.
    let mut read = 0usize;
    while read < MAX_RESPONSE_BYTES {
        match resp.chunk().await {
            Ok(Some(c)) => read += c.len(),
            Ok(None) | Err(_) => break,
        }
    }
    if status.is_success() {
        Ok(())
    } else {
        Err(status_error(
            status.as_u16(),
            retry_after.as_deref(),
            std::time::SystemTime::now(),
        ))
    }
}

/// Maps a reqwest error onto the retry classification's vocabulary. The URL is stripped: it is
/// the configured ingest and adds nothing to a log line.
pub(crate) fn classify(e: reqwest::Error) -> DeliveryError {
    if e.is_timeout() {
        DeliveryError::Timeout
    } else if e.is_connect() {
        DeliveryError::Connect(root_cause(&e))
    } else if e.is_builder() {
        DeliveryError::Encode(root_cause(&e))
    } else {
        DeliveryError::Transport(root_cause(&e))
    }
}

/// The innermost cause ("Connection refused (os error 111)"), which is what an operator needs.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

pub(crate) struct FileSink {
    path: PathBuf,
    /// Opened on the first batch, kept open; `None` again after a write error so the next batch
    /// reopens it (the file may have been rotated or its disk remounted).
    file: std::sync::Mutex<Option<std::fs::File>>,
}

impl FileSink {
    pub(crate) fn new(path: PathBuf) -> FileSink {
        FileSink {
            path,
            file: std::sync::Mutex::new(None),
        }
    }

    async fn append(&self, body: &Bytes) -> Result<(), DeliveryError> {
        let body = body.clone();
        let path = self.path.clone();
        // Only one batch is ever in flight, so the lock is never contended. A panic mid-write
        // loses the handle with the blocking task, and the next batch reopens the file.
        let file = crate::lock::lock(&self.file).take();
        // File I/O blocks: it runs on the blocking pool, never on the runtime's worker.
        let res = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
            use std::io::{IoSlice, Write};
            let mut f = match file {
                Some(f) => f,
                None => std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)?,
            };
            // The batch and its newline in one `writev` on an O_APPEND file: appended whole,
            // as one `write` of the line would be, without copying the batch to add a byte.
            let parts = [IoSlice::new(&body), IoSlice::new(b"\n")];
            let done = loop {
                match f.write_vectored(&parts) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    r => break r?,
                }
            };
            // A short write (a full disk, a signal) goes on as `write_all` would have.
            if done < body.len() {
                f.write_all(&body[done..])?;
            }
            if done <= body.len() {
                f.write_all(b"\n")?;
            }
            Ok(f)
        })
        .await;
        match res {
            Ok(Ok(f)) => {
                *crate::lock::lock(&self.file) = Some(f);
                Ok(())
            }
            Ok(Err(e)) => Err(DeliveryError::File(e.to_string())),
            Err(e) => Err(DeliveryError::File(e.to_string())),
        }
    }
}
