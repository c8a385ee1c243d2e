//! The live view: a small web application the reference ingest serves at `/` for the org's
//! operators (sign-in, live events, per-tool figures, sensors and keys).
//!
//! Owns the browser side of the ingest: the embedded assets, the sign-in and its sessions, the
//! server-sent event stream of committed events and the per-tool figures. The page reads the
//! admin API itself (`/v1/…`) with its session cookie; [`WebState::admin_session`] is how the
//! API's handlers accept that cookie next to the bearer secret.
//!
//! What it must never do, and why:
//! * serve anything from elsewhere, or anything inline: every asset is compiled into the binary
//!   and every page answer carries `Content-Security-Policy: default-src 'self'`, so a string a
//!   sensor sent cannot become script even if the page had a bug (the page also writes every
//!   sensor-supplied string as text, never as markup);
//! * accept a state-changing call on the cookie alone: mint and revoke also need the session's
//!   CSRF token in `X-CSRF-Token` (the cookie is `SameSite=Strict` on top);
//! * keep a session, a sign-in link or a failure record forever: sessions end after
//!   [`SESSION_TTL`], links after [`LINK_TTL`] or their first use, failures after
//!   [`FAILURE_WINDOW`];
//! * hold the store: it reads through the store's read pool like the API does, and the event
//!   stream wakes on commits ([`WebState::committed`]) instead of polling. Commits through
//!   other replicas of a shared database (PostgreSQL) ring no bell here, so there the stream
//!   also reads every [`SHARED_STORE_POLL`].
//!
//! Sessions, sign-in links and failure counts live in this process's memory. Behind a load
//! balancer over several replicas, the live view needs sticky sessions (affinity by client
//! address or by the session cookie): a session made on one replica is unknown to the others,
//! which answer 401 and show the sign-in again. Kept that way on purpose: sessions in the
//! database would add a table, a write per sign-in and a read per request for a page a few
//! operators open, and sign-out would still have to reach every replica.

mod stats;

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, Extensions, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use ring::digest;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::server::AppState;
use crate::lock::lock;

/// How long a session lasts from sign-in.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);
/// Failed sign-ins from one address counted over this window.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Failed sign-ins from one address within [`FAILURE_WINDOW`] after which further tries wait.
pub const MAX_FAILURES: usize = 5;
/// How long a one-time sign-in link ([`WebState::sign_in_link`]) stays valid.
pub const LINK_TTL: Duration = Duration::from_secs(10 * 60);
/// Name of the session cookie.
pub const SESSION_COOKIE: &str = "bounded_session";
/// Header carrying the CSRF token on state-changing calls.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// The policy every page answer carries.
pub const CSP: &str =
    "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";
/// Events the stream sends first, before live ones (and most sent per wake-up).
const STREAM_BACKLOG: u32 = 200;
/// A comment line on a quiet stream, well inside the ingest's idle timeout.
const STREAM_KEEPALIVE: Duration = Duration::from_secs(15);
/// How often the event stream reads a store that other replicas also write: their commits
/// reach the page within this.
pub const SHARED_STORE_POLL: Duration = Duration::from_secs(1);
/// Most sessions kept at once; past it the oldest is dropped (sign-ins need the admin secret,
/// so this only bounds memory).
const MAX_SESSIONS: usize = 1024;
/// Most addresses with failures remembered at once.
const MAX_FAILING_ADDRS: usize = 10_000;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

struct Session {
    csrf: String,
    expires: Instant,
}

/// Sessions, sign-in failures and the commit signal; one per running ingest.
pub(crate) struct WebState {
    /// By SHA-256 of the cookie value: the map never holds a usable cookie.
    sessions: Mutex<HashMap<Vec<u8>, Session>>,
    failures: Mutex<HashMap<IpAddr, VecDeque<Instant>>>,
    /// One-time sign-in links, by SHA-256 of their token.
    links: Mutex<HashMap<Vec<u8>, Instant>>,
    /// Bumped after each commit that stored events.
    committed: watch::Sender<u64>,
    /// Set when the ingest shuts down: open streams end.
    closing: watch::Sender<bool>,
    /// Cookies get `Secure` when the ingest serves TLS.
    secure: bool,
    /// Set when other processes commit to the store too: the stream reads this often.
    poll: Option<Duration>,
}

impl WebState {
    pub(crate) fn new(secure: bool) -> Self {
        Self {
            sessions: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            links: Mutex::new(HashMap::new()),
            committed: watch::channel(0).0,
            closing: watch::channel(false).0,
            secure,
            poll: None,
        }
    }

    /// For a store other replicas write too: streams also read every [`SHARED_STORE_POLL`].
    pub(crate) fn shared_store(mut self) -> Self {
        self.poll = Some(SHARED_STORE_POLL);
        self
    }

    /// Called after a batch committed new events: wakes every open stream.
    pub(crate) fn committed(&self) {
        self.committed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Ends every open stream (ingest shutdown).
    pub(crate) fn close(&self) {
        self.closing.send_replace(true);
    }

    /// A fresh one-time sign-in token, for `/ui/link?t=<token>`; `None` without randomness.
    pub(crate) fn sign_in_link(&self) -> Option<String> {
        let t = random_token()?;
        let now = Instant::now();
        let mut links = lock(&self.links);
        links.retain(|_, exp| *exp > now);
        links.insert(sha256(&t), now + LINK_TTL);
        Some(t)
    }

    /// True when the request carries a live session cookie, and, for a state-changing call
    /// (`write`), that session's CSRF token in [`CSRF_HEADER`].
    pub(crate) fn admin_session(&self, headers: &HeaderMap, write: bool) -> bool {
        let Some(cookie) = session_cookie(headers) else {
            return false;
        };
        let now = Instant::now();
        let sessions = lock(&self.sessions);
        let Some(s) = sessions.get(&sha256(cookie)).filter(|s| s.expires > now) else {
            return false;
        };
        if !write {
            return true;
        }
        headers
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| ct_eq(t.as_bytes(), s.csrf.as_bytes()))
    }

    fn csrf_of(&self, headers: &HeaderMap) -> Option<String> {
        let cookie = session_cookie(headers)?;
        let now = Instant::now();
        let sessions = lock(&self.sessions);
        sessions
            .get(&sha256(cookie))
            .filter(|s| s.expires > now)
            .map(|s| s.csrf.clone())
    }

    /// Opens a session; the cookie value to set.
    fn open_session(&self) -> Option<String> {
        let cookie = random_token()?;
        let csrf = random_token()?;
        let now = Instant::now();
        let mut sessions = lock(&self.sessions);
        sessions.retain(|_, s| s.expires > now);
        if sessions.len() >= MAX_SESSIONS {
            if let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
            {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(
            sha256(&cookie),
            Session {
                csrf,
                expires: now + SESSION_TTL,
            },
        );
        Some(cookie)
    }

    fn end_session(&self, headers: &HeaderMap) {
        if let Some(c) = session_cookie(headers) {
            lock(&self.sessions).remove(&sha256(c));
        }
    }

    /// Seconds until `addr` may try again, when it already failed [`MAX_FAILURES`] times within
    /// [`FAILURE_WINDOW`].
    fn backoff(&self, addr: IpAddr) -> Option<u64> {
        let now = Instant::now();
        let mut failures = lock(&self.failures);
        let q = failures.get_mut(&addr)?;
        while q
            .front()
            .is_some_and(|t| now.duration_since(*t) >= FAILURE_WINDOW)
        {
            q.pop_front();
        }
        if q.len() < MAX_FAILURES {
            return None;
        }
        let oldest = *q.front()?;
        let wait = FAILURE_WINDOW.saturating_sub(now.duration_since(oldest));
        Some(wait.as_secs().max(1))
    }

    fn record_failure(&self, addr: IpAddr) {
        let now = Instant::now();
        let mut failures = lock(&self.failures);
        if failures.len() >= MAX_FAILING_ADDRS && !failures.contains_key(&addr) {
            failures.retain(|_, q| {
                q.back()
                    .is_some_and(|t| now.duration_since(*t) < FAILURE_WINDOW)
            });
            if failures.len() >= MAX_FAILING_ADDRS {
                return;
            }
        }
        let q = failures.entry(addr).or_default();
        q.push_back(now);
        while q.len() > MAX_FAILURES {
            q.pop_front();
        }
    }

    fn session_cookie_header(&self, value: &str, max_age: u64) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let v = format!(
            "{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
        );
        // Token characters are base64url: always a valid header value.
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

fn sha256(s: &str) -> Vec<u8> {
    digest::digest(&digest::SHA256, s.as_bytes())
        .as_ref()
        .to_vec()
}

/// Equal-length comparison whose time does not depend on where the inputs differ.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn random_token() -> Option<String> {
    let b = crate::random::bytes::<32>().ok()?;
    Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b))
}

fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == SESSION_COOKIE)
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
}

/// The peer address the connection layer records on each request.
fn peer(ext: &Extensions) -> IpAddr {
    ext.get::<super::conn::Peer>()
        .map(|p| p.0.ip().to_canonical())
        .unwrap_or(IpAddr::from([0, 0, 0, 0]))
}

type Shared = Arc<AppState>;

/// The live view's routes, merged into the ingest's router.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/", get(index))
        .route("/assets/app.js", get(app_js))
        .route("/assets/app.css", get(app_css))
        .route("/ui/signin", post(sign_in))
        .route("/ui/signout", post(sign_out))
        .route("/ui/session", get(session))
        .route("/ui/link", get(link))
        .route("/ui/stream", get(stream))
        .route("/ui/keys", get(keys))
        .route("/ui/tools", get(tools))
}

/// Headers every answer of the live view carries.
fn hardened(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn asset(ctype: &'static str, body: &'static str) -> Response {
    hardened(
        (
            [(header::CONTENT_TYPE, HeaderValue::from_static(ctype))],
            body,
        )
            .into_response(),
    )
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn app_css() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}

fn json_error(status: StatusCode, msg: &str) -> Response {
    hardened((status, Json(json!({ "error": msg }))).into_response())
}

/// Whether the caller is the operator: the bearer secret or a session cookie.
fn authorized(state: &AppState, headers: &HeaderMap) -> bool {
    if headers.contains_key(header::AUTHORIZATION) {
        super::server::bearer_credential(headers).is_some_and(|c| state.admin.verify(c))
    } else {
        state.web.admin_session(headers, false)
    }
}

/// `POST /ui/signin` `{ "secret": … }` (JSON only, so no other site's form can post it).
async fn sign_in(
    State(state): State<Shared>,
    ext: Extensions,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let addr = peer(&ext);
    if let Some(wait) = state.web.backoff(addr) {
        let mut r = json_error(
            StatusCode::TOO_MANY_REQUESTS,
            "too many failed sign-ins from this address; wait and try again",
        );
        if let Ok(v) = HeaderValue::from_str(&wait.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return r;
    }
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !is_json {
        return json_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "sign-in takes application/json",
        );
    }
    let bytes = match super::server::read_body(
        &headers,
        body,
        super::server::MAX_ADMIN_BODY_BYTES,
        state.limits.body_read_timeout,
    )
    .await
    {
        Ok(b) => b,
        Err(e) => return hardened(e.into_response()),
    };
    let secret = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v.get("secret").and_then(Value::as_str).map(str::to_owned));
    let Some(secret) = secret else {
        return json_error(StatusCode::BAD_REQUEST, "`secret` (a string) is required");
    };
    if !state.admin.verify(&secret) {
        state.web.record_failure(addr);
        tracing::info!(addr = %addr, "Live view sign-in refused");
        return json_error(StatusCode::UNAUTHORIZED, "wrong admin secret");
    }
    signed_in_response(&state, StatusCode::OK, None)
}

fn signed_in_response(state: &AppState, status: StatusCode, location: Option<&str>) -> Response {
    let Some(cookie) = state.web.open_session() else {
        return json_error(StatusCode::SERVICE_UNAVAILABLE, "cannot open a session now");
    };
    let mut r = match location {
        Some(loc) => (
            StatusCode::SEE_OTHER,
            [(
                header::LOCATION,
                HeaderValue::from_str(loc).unwrap_or(HeaderValue::from_static("/")),
            )],
        )
            .into_response(),
        None => (status, Json(json!({ "signedIn": true }))).into_response(),
    };
    r.headers_mut().insert(
        header::SET_COOKIE,
        state
            .web
            .session_cookie_header(&cookie, SESSION_TTL.as_secs()),
    );
    hardened(r)
}

async fn sign_out(State(state): State<Shared>, headers: HeaderMap) -> Response {
    if !state.web.admin_session(&headers, true) {
        return json_error(StatusCode::FORBIDDEN, "no session, or CSRF token missing");
    }
    state.web.end_session(&headers);
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut()
        .insert(header::SET_COOKIE, state.web.session_cookie_header("", 0));
    hardened(r)
}

/// `GET /ui/session`: whether signed in, and the CSRF token the page sends on writes.
async fn session(State(state): State<Shared>, headers: HeaderMap) -> Response {
    match state.web.csrf_of(&headers) {
        Some(csrf) => hardened(Json(json!({ "signedIn": true, "csrf": csrf })).into_response()),
        None => json_error(StatusCode::UNAUTHORIZED, "not signed in"),
    }
}

/// `GET /ui/link?t=<token>`: a one-time sign-in link (the demo prints one).
async fn link(State(state): State<Shared>, q: Query<HashMap<String, String>>) -> Response {
    let Some(t) = q.get("t") else {
        return json_error(StatusCode::BAD_REQUEST, "missing link token");
    };
    let now = Instant::now();
    let valid = {
        let mut links = lock(&state.web.links);
        links.remove(&sha256(t)).is_some_and(|exp| exp > now)
    };
    if !valid {
        return json_error(
            StatusCode::UNAUTHORIZED,
            "sign-in link unknown, used or expired",
        );
    }
    signed_in_response(&state, StatusCode::SEE_OTHER, Some("/"))
}

/// `GET /ui/stream`: server-sent events, one `event: ev` per stored event (its `id:` the store
/// sequence), the last [`STREAM_BACKLOG`] first, then each as it is committed. A reconnecting
/// browser's `Last-Event-ID` resumes after that event.
async fn stream(State(state): State<Shared>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return json_error(StatusCode::UNAUTHORIZED, "sign in first");
    }
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok());
    let committed = state.web.committed.subscribe();
    let closing = state.web.closing.subscribe();
    let st = StreamState {
        app: state,
        after: resume,
        committed,
        closing,
        pending: VecDeque::new(),
        fresh: true,
        last_sent: Instant::now(),
    };
    let body = futures_util::stream::unfold(st, next_chunk);
    let mut r = Response::new(Body::from_stream(body));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    hardened(r)
}

struct StreamState {
    app: Shared,
    /// Last sequence sent; `None` before the backlog.
    after: Option<i64>,
    committed: watch::Receiver<u64>,
    closing: watch::Receiver<bool>,
    pending: VecDeque<bytes::Bytes>,
    /// Read the store before the first wait.
    fresh: bool,
    /// When the last chunk went out, for the keep-alive.
    last_sent: Instant,
}

async fn next_chunk(
    mut st: StreamState,
) -> Option<(Result<bytes::Bytes, Infallible>, StreamState)> {
    loop {
        if *st.closing.borrow() {
            return None;
        }
        if let Some(chunk) = st.pending.pop_front() {
            st.last_sent = Instant::now();
            return Some((Ok(chunk), st));
        }
        if st.fresh {
            st.fresh = false;
            st.committed.mark_unchanged();
            if st.after.is_none() {
                // Tells the page the backlog is coming even when the store is empty.
                st.pending
                    .push_back(bytes::Bytes::from_static(b"retry: 2000\n\n"));
            }
        } else {
            let poll_every = st.app.web.poll;
            let poll = async move {
                match poll_every {
                    Some(every) => tokio::time::sleep(every).await,
                    None => std::future::pending().await,
                }
            };
            let keepalive_at = tokio::time::Instant::from_std(st.last_sent + STREAM_KEEPALIVE);
            tokio::select! {
                changed = st.committed.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
                _ = st.closing.changed() => return None,
                () = poll => {}
                () = tokio::time::sleep_until(keepalive_at) => {
                    st.last_sent = Instant::now();
                    return Some((Ok(bytes::Bytes::from_static(b": keep-alive\n\n")), st));
                }
            }
        }
        // Several commits may have landed: read until caught up.
        loop {
            let rows = match st.app.store.events_after(st.after, STREAM_BACKLOG).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "Live view stream read failed");
                    return None;
                }
            };
            let n = rows.len();
            for (seq, body) in rows {
                st.after = Some(seq);
                st.pending.push_back(bytes::Bytes::from(format!(
                    "id: {seq}\nevent: ev\ndata: {body}\n\n"
                )));
            }
            if st.after.is_none() {
                st.after = Some(0);
            }
            if n < STREAM_BACKLOG as usize || st.pending.len() >= 4 * STREAM_BACKLOG as usize {
                break;
            }
        }
    }
}

/// `GET /ui/keys`: every key (revoked ones too), for the sensors page.
async fn keys(State(state): State<Shared>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return json_error(StatusCode::UNAUTHORIZED, "sign in first");
    }
    let mut keys = match state.store.key_records().await {
        Ok(keys) => keys,
        Err(e) => {
            tracing::warn!(error = %e, "Live view keys read failed");
            return json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store unavailable; retry later",
            );
        }
    };
    keys.sort_by(|a, b| b.created_at.cmp(&a.created_at));
    hardened(Json(json!({ "keys": keys })).into_response())
}

/// `GET /ui/tools?org=`: per tool, over the last hour: calls and errors per minute, error
/// rate, `dur_ms` percentiles, the largest responses, and error groups by `err.fp` when the
/// events carry one.
async fn tools(
    State(state): State<Shared>,
    headers: HeaderMap,
    q: Query<HashMap<String, String>>,
) -> Response {
    if !authorized(&state, &headers) {
        return json_error(StatusCode::UNAUTHORIZED, "sign in first");
    }
    let now = std::time::SystemTime::now();
    let since = crate::event::rfc3339_ms(now - stats::WINDOW);
    let org = q.get("org").filter(|o| !o.is_empty()).cloned();
    match state
        .store
        .events_received_since(since, org, stats::MAX_EVENTS)
        .await
    {
        Ok(events) => hardened(Json(stats::per_tool(&events, now)).into_response()),
        Err(e) => {
            tracing::warn!(error = %e, "Live view tools read failed");
            json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store unavailable; retry later",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csrf_comparison_needs_the_whole_token() {
        assert!(ct_eq(b"abcdef", b"abcdef"));
        assert!(!ct_eq(b"abcdef", b"abcdeg"));
        assert!(!ct_eq(b"abcdef", b"abcde"));
        assert!(!ct_eq(b"", b"a"));
    }

    #[test]
    fn the_sixth_failure_within_a_minute_waits() {
        let w = WebState::new(false);
        let a: IpAddr = [127, 0, 0, 9].into();
        let b: IpAddr = [127, 0, 0, 10].into();
        for _ in 0..MAX_FAILURES {
            assert_eq!(w.backoff(a), None);
            w.record_failure(a);
        }
        let wait = w.backoff(a).expect("sixth try waits");
        assert!((1..=60).contains(&wait), "{wait}");
        assert_eq!(w.backoff(b), None, "another address is not held back");
    }

    #[test]
    fn a_session_needs_its_csrf_token_to_write() {
        let w = WebState::new(false);
        let cookie = w.open_session().expect("rng");
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {SESSION_COOKIE}={cookie}")).unwrap(),
        );
        assert!(w.admin_session(&h, false));
        assert!(!w.admin_session(&h, true));
        let csrf = w.csrf_of(&h).expect("session");
        h.insert(CSRF_HEADER, HeaderValue::from_str("wrong").unwrap());
        assert!(!w.admin_session(&h, true));
        h.insert(CSRF_HEADER, HeaderValue::from_str(&csrf).unwrap());
        assert!(w.admin_session(&h, true));
        w.end_session(&h);
        assert!(!w.admin_session(&h, false));
    }

    #[test]
    fn a_sign_in_link_works_once() {
        let w = WebState::new(false);
        let t = w.sign_in_link().expect("rng");
        assert!(lock(&w.links).remove(&sha256(&t)).is_some());
        assert!(lock(&w.links).remove(&sha256(&t)).is_none());
    }
}
