//! The HTTP API of the reference ingest (DESIGN §7): axum routes, auth and request limits.
//!
//! Owns every status code the ingest answers. Goes in: HTTP requests from sensors and from the
//! operator. Comes out: JSON answers, and prepared rows handed to the [`Store`]. Client mistakes
//! (bad token, oversized body, malformed JSON, a schema-invalid event) always get a 4xx with a
//! JSON `{ "error": … }` body and never a 500 or a panic; a 5xx only means the store failed.
//! It never trusts the batch for `org` or `sensor` (both come from the key), never stores an
//! event that did not pass `validate_and_filter_event`, and never runs SQLite or a large parse
//! on an async worker thread. A batch is admitted in two steps ([`super::admission`]): its key's
//! turn before the body is read, a shared slot after; a refusal is a 429 or 503 with
//! `Retry-After`, never a wait longer than a second.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{json, Map, Value};

use super::admission::{Admission, Refusal};
use super::batch::{self, BatchError, MAX_EVENT_BYTES};
use super::keys::{AdminSecret, Signer};
use super::store::{
    BatchOutcome, BatchWrite, EventQuery, EventRow, Evidence, KeyRecord, RevokeOutcome, Store,
    StoreError,
};
use super::Limits;
use crate::event::validate_and_filter_event;
use crate::token::SensorToken;

/// Route of the sensor's batches.
pub const EVENTS_PATH: &str = "/v1/events";
/// Route of key minting; `DELETE {ADMIN_KEYS_PATH}/{keyId}` revokes.
pub const ADMIN_KEYS_PATH: &str = "/v1/admin/keys";
/// Per-sensor counters (batches, accepted events, the sensor's own `dropped`).
pub const ADMIN_SENSORS_PATH: &str = "/v1/admin/sensors";
pub const ROLLUPS_PATH: &str = "/v1/rollups";
/// The fleet view of tool definitions (`changed` and `inconsistent` flags).
pub const TOOLS_PATH: &str = "/v1/tools";
pub const HEALTH_PATH: &str = "/healthz";

/// Events returned by `GET /v1/events` when no `limit` is given.
pub const DEFAULT_EVENTS_LIMIT: u32 = 100;
/// Most events one `GET /v1/events` returns, so one read cannot pull the whole store into memory.
pub const MAX_EVENTS_LIMIT: u32 = 1000;
/// Largest admin request body: `{ org, name }` is tiny.
pub(crate) const MAX_ADMIN_BODY_BYTES: usize = 16 * 1024;
/// Longest org or key name accepted at minting.
pub const MAX_ORG_LEN: usize = 128;
/// Shared batch slots by default; see [`super::Limits::max_concurrent_batches`].
pub const MAX_CONCURRENT_BATCHES: usize = super::DEFAULT_MAX_CONCURRENT_BATCHES;
/// `Retry-After` (seconds) on a batch refused for the key's limit (429) or the slots (503):
/// slots free up as soon as a batch commits, so a second is enough.
const RETRY_AFTER_SECS: &str = "1";

pub(crate) struct AppState {
    pub store: Arc<dyn Store>,
    pub signer: Signer,
    pub admin: AdminSecret,
    pub limits: Limits,
    /// The per-key limit and the shared batch slots, with refusals counted per key.
    pub admission: Admission,
    /// The live view's sessions and commit signal.
    pub web: Arc<super::web::WebState>,
}

type Shared = Arc<AppState>;

pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route(EVENTS_PATH, post(post_events).get(get_events))
        .route(ADMIN_KEYS_PATH, post(mint_key))
        .route(&format!("{ADMIN_KEYS_PATH}/{{key_id}}"), delete(revoke_key))
        .route(ADMIN_SENSORS_PATH, get(get_sensors))
        .route(ROLLUPS_PATH, get(get_rollups))
        .route(TOOLS_PATH, get(get_tools))
        .route(HEALTH_PATH, get(health))
        .merge(super::web::routes())
        .fallback(not_found)
        .with_state(state)
}

/// A refusal: a status and a message for the JSON `{ "error": … }` body.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
    /// Sends `Retry-After` ([`RETRY_AFTER_SECS`]).
    retry_after: bool,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(json!({ "error": self.message }))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.retry_after {
            r.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        r
    }
}

fn error(status: StatusCode, msg: impl Into<String>) -> ApiError {
    ApiError {
        status,
        message: msg.into(),
        retry_after: false,
    }
}

/// A batch not admitted: 429 when its key already has its share in flight, 503 when no slot
/// freed up in time; both ask the sensor to come back after [`RETRY_AFTER_SECS`].
fn refused(why: Refusal) -> ApiError {
    let mut e = match why {
        Refusal::Rate => error(
            StatusCode::TOO_MANY_REQUESTS,
            "too many batches of this key in progress; retry later",
        ),
        Refusal::Slots => error(StatusCode::SERVICE_UNAVAILABLE, "ingest busy; retry later"),
    };
    e.retry_after = true;
    e
}

fn unauthorized(msg: &str) -> ApiError {
    error(StatusCode::UNAUTHORIZED, msg)
}

fn store_failed(e: StoreError) -> ApiError {
    tracing::warn!(error = %e, "Store failed");
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "store unavailable; retry later",
    )
}

type ApiResult = Result<Response, ApiError>;

async fn health() -> Response {
    Json(json!({ "status": "ok" })).into_response()
}

async fn not_found() -> ApiError {
    error(StatusCode::NOT_FOUND, "no such route")
}

/// The credential after `Bearer `, or why there is none.
fn bearer(headers: &HeaderMap) -> Result<&str, &'static str> {
    let v = headers
        .get(header::AUTHORIZATION)
        .ok_or("missing Authorization header; expected `Authorization: Bearer <token>`")?;
    let v = v
        .to_str()
        .map_err(|_| "Authorization header is not ASCII")?;
    let (scheme, cred) = v
        .split_once(' ')
        .ok_or("Authorization scheme must be Bearer")?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err("Authorization scheme must be Bearer");
    }
    let cred = cred.trim();
    if cred.is_empty() {
        return Err("empty bearer credential");
    }
    Ok(cred)
}

/// Checks the sensor token: shape, signature (constant time), key known and not revoked. The
/// store is asked only for a token whose signature is ours.
async fn authenticate_sensor(state: &AppState, headers: &HeaderMap) -> Result<KeyRecord, ApiError> {
    let cred = bearer(headers).map_err(unauthorized)?;
    let token = SensorToken::parse(cred).map_err(|_| unauthorized("malformed sensor token"))?;
    if !state.signer.verify(&token) {
        return Err(unauthorized("invalid sensor token"));
    }
    let key = state
        .store
        .key(token.key_id().to_string())
        .await
        .map_err(store_failed)?
        .ok_or_else(|| unauthorized("invalid sensor token"))?;
    if key.revoked_at.is_some() {
        return Err(unauthorized("sensor key revoked"));
    }
    Ok(key)
}

/// The bearer credential, if the request sends a well-formed one.
pub(crate) fn bearer_credential(headers: &HeaderMap) -> Option<&str> {
    bearer(headers).ok()
}

/// The operator: the admin secret as a bearer credential or, without an `Authorization`
/// header, a live view session cookie.
fn authenticate_admin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    authenticate_admin_for(state, headers, false)
}

/// [`authenticate_admin`] for a state-changing call: a session cookie also needs its CSRF
/// token (see [`super::web`]).
fn authenticate_admin_write(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    authenticate_admin_for(state, headers, true)
}

fn authenticate_admin_for(
    state: &AppState,
    headers: &HeaderMap,
    write: bool,
) -> Result<(), ApiError> {
    if !headers.contains_key(header::AUTHORIZATION) && state.web.admin_session(headers, write) {
        return Ok(());
    }
    let cred = bearer(headers).map_err(unauthorized)?;
    if state.admin.verify(cred) {
        Ok(())
    } else {
        Err(unauthorized("admin secret required"))
    }
}

/// Reads the body up to `limit` bytes. A declared `Content-Length` over the limit is refused
/// before a byte is read; a chunked body is cut off as soon as it passes the limit. Either way
/// the body is never buffered beyond the limit. A body not complete within `timeout` is 408.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<bytes::Bytes, ApiError> {
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is over the {limit}-byte limit"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Ok(Err(_)) => Err(error(
            StatusCode::BAD_REQUEST,
            "request body could not be read",
        )),
        Err(_) => Err(error(
            StatusCode::REQUEST_TIMEOUT,
            format!("request body not received within {timeout:?}"),
        )),
    }
}

fn batch_error(e: BatchError) -> ApiError {
    match e {
        BatchError::Malformed(m) => error(StatusCode::BAD_REQUEST, m),
        BatchError::TooMany { max } => error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("batch has more than {max} events; at most {max} per batch"),
        ),
    }
}

/// Parses a batch (counting and validating while reading, see [`batch`]) and runs every event
/// through the shared filter, stamping `org`, `sensor` and `receivedAt`. Returns the rows to
/// write and how many events were rejected. Only one event at a time becomes a `Value`, and only
/// one of at most [`MAX_EVENT_BYTES`].
pub(crate) fn prepare_batch(
    body: &[u8],
    key: &KeyRecord,
    max_events: usize,
) -> Result<(BatchWrite, u64), BatchError> {
    let raw = batch::parse(body, max_events)?;
    let received_at = crate::event::rfc3339_ms(SystemTime::now());
    let mut rows = Vec::with_capacity(raw.events.len());
    let mut rejected = 0u64;
    for text in raw.events {
        let text = text.get();
        let row = (text.len() <= MAX_EVENT_BYTES)
            .then(|| serde_json::from_str::<Value>(text).ok())
            .flatten()
            .and_then(|ev| validate_and_filter_event(&ev).ok())
            // A sensor `version` / `transport` with a layer-4 hit rejects the whole batch's
            // events, like a hit in an event's own metadata (see `batch::RawBatch`).
            .filter(|_| !raw.sensor_sensitive)
            .and_then(|f| stamp(f, key, &received_at));
        match row {
            Some(row) => rows.push(row),
            None => rejected += 1,
        }
    }
    Ok((
        BatchWrite {
            key_id: key.key_id.clone(),
            org: key.org.clone(),
            received_at,
            rows,
            dropped: raw.dropped,
            health: raw.health,
            sensor_version: raw.sensor_version,
            sensor_transport: raw.sensor_transport,
        },
        rejected,
    ))
}

/// Adds `org`, `sensor` and `receivedAt` from the key (overwriting whatever the sensor sent) and
/// pulls out the indexed columns. `None` if the filtered event lacks one of them.
fn stamp(filtered: Value, key: &KeyRecord, received_at: &str) -> Option<EventRow> {
    let Value::Object(mut m) = filtered else {
        return None;
    };
    let s = |m: &Map<String, Value>, a: &str, b: Option<&str>| -> Option<String> {
        let v = m.get(a)?;
        let v = match b {
            Some(b) => v.get(b)?,
            None => v,
        };
        v.as_str().map(str::to_owned)
    };
    let id = s(&m, "id", None).filter(|id| !id.is_empty())?;
    let actor = s(&m, "actor", Some("id"))?;
    let action = s(&m, "rec", Some("action"))?;
    let class = s(&m, "class", None)?;
    let evidence = evidence_of(&m, received_at);
    m.insert("org".into(), Value::String(key.org.clone()));
    m.insert("sensor".into(), Value::String(key.key_id.clone()));
    m.insert("receivedAt".into(), Value::String(received_at.to_owned()));
    let body = serde_json::to_string(&Value::Object(m)).ok()?;
    Some(EventRow {
        id,
        actor,
        action,
        class,
        body,
        evidence,
    })
}

/// The evidence fields of a filtered event, for the store's aggregates.
fn evidence_of(m: &Map<String, Value>, received_at: &str) -> Evidence {
    let text = |path: &[&str]| {
        let mut v = m.get(path[0]);
        for k in &path[1..] {
            v = v.and_then(|x| x.get(k));
        }
        v.and_then(Value::as_str).map(str::to_owned)
    };
    // The sensor's own `ts` when it is the UTC form it writes (sorts as text); else receipt.
    let seen = text(&["ts"])
        .filter(|t| t.len() == 24 && t.ends_with('Z'))
        .unwrap_or_else(|| received_at.to_owned());
    let tool_defs = [text(&["rec", "toolDef"]), text(&["rec", "prevToolDef"])]
        .into_iter()
        .flatten()
        .collect();
    let error = text(&["err", "fp"]).map(|fp| {
        let err = m.get("err");
        (
            fp,
            err.and_then(|e| e.get("kind"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            err.and_then(|e| e.get("code")).and_then(Value::as_i64),
        )
    });
    let catalog = m
        .get("session")
        .and_then(|s| s.get("catalog"))
        .and_then(|c| {
            Some((
                c.get("tools").and_then(Value::as_u64),
                c.get("bytes")?.as_u64()?,
            ))
        });
    Evidence {
        host: text(&["dest", "host"]).unwrap_or_default(),
        seen,
        tool_defs,
        error,
        catalog,
    }
}

async fn post_events(State(state): State<Shared>, headers: HeaderMap, body: Body) -> ApiResult {
    let key = authenticate_sensor(&state, &headers).await?;
    // The key's turn before its body (bounds what one key holds in memory), the shared slot
    // only once the body is in (a slow body never holds a slot other keys need).
    let _turn = state
        .admission
        .key_turn(&key.key_id)
        .await
        .map_err(refused)?;
    let bytes = read_body(
        &headers,
        body,
        state.limits.max_body_bytes,
        state.limits.body_read_timeout,
    )
    .await?;
    let _slot = state.admission.slot(&key.key_id).await.map_err(refused)?;
    let max_events = state.limits.max_batch_events;
    let prepared =
        tokio::task::spawn_blocking(move || prepare_batch(&bytes, &key, max_events)).await;
    let (write, rejected) = match prepared {
        Ok(p) => p.map_err(batch_error)?,
        Err(e) => {
            tracing::warn!(error = %e, "Batch preparation task failed");
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "batch could not be processed",
            ));
        }
    };
    let (key_id, dropped) = (write.key_id.clone(), write.dropped);
    match state.store.write_batch(write).await.map_err(store_failed)? {
        BatchOutcome::Stored {
            accepted,
            duplicates,
        } => {
            tracing::debug!(key_id = %key_id, accepted, rejected, duplicates, dropped, "Batch stored");
            if accepted > 0 {
                state.web.committed();
            }
            Ok(Json(json!({
                "accepted": accepted,
                "rejected": rejected,
                "duplicates": duplicates,
            }))
            .into_response())
        }
        BatchOutcome::KeyRevoked => Err(unauthorized("sensor key revoked")),
    }
}

/// Checks an org or key name given at minting.
fn valid_label(s: &str) -> bool {
    !s.is_empty() && s.chars().count() <= MAX_ORG_LEN && !s.chars().any(char::is_control)
}

async fn mint_key(State(state): State<Shared>, headers: HeaderMap, body: Body) -> ApiResult {
    authenticate_admin_write(&state, &headers)?;
    let bytes = read_body(
        &headers,
        body,
        MAX_ADMIN_BODY_BYTES,
        state.limits.body_read_timeout,
    )
    .await?;
    let req: Value = serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("body is not valid JSON: {e}"),
        )
    })?;
    let Some(org) = req.get("org").and_then(Value::as_str).map(str::trim) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "`org` (a string) is required",
        ));
    };
    if !valid_label(org) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("`org` must be 1-{MAX_ORG_LEN} characters without control characters"),
        ));
    }
    let name = match req.get("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(n)) if valid_label(n.trim()) => Some(n.trim().to_string()),
        Some(_) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("`name` must be 1-{MAX_ORG_LEN} characters without control characters"),
            ))
        }
    };
    let key_id = super::keys::new_key_id().map_err(|e| {
        tracing::warn!(error = %e, "Cannot mint a key id");
        error(StatusCode::SERVICE_UNAVAILABLE, "cannot mint a key now")
    })?;
    let record = KeyRecord {
        key_id: key_id.clone(),
        org: org.to_string(),
        name: name.clone(),
        created_at: crate::event::rfc3339_ms(SystemTime::now()),
        revoked_at: None,
    };
    state.store.mint(record).await.map_err(store_failed)?;
    let token = state.signer.token_for(&key_id);
    tracing::info!(key_id = %key_id, org = %org, "Key minted");
    let mut out = json!({ "keyId": key_id, "token": token, "org": org });
    if let Some(n) = name {
        out["name"] = Value::String(n);
    }
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

async fn revoke_key(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(key_id): Path<String>,
) -> ApiResult {
    authenticate_admin_write(&state, &headers)?;
    let at = crate::event::rfc3339_ms(SystemTime::now());
    match state
        .store
        .revoke(key_id.clone(), at)
        .await
        .map_err(store_failed)?
    {
        RevokeOutcome::Revoked => {
            tracing::info!(key_id = %key_id, "Key revoked");
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        // Revoking twice is what a retried DELETE does; it is not an error.
        RevokeOutcome::AlreadyRevoked => Ok(StatusCode::NO_CONTENT.into_response()),
        RevokeOutcome::Unknown => Err(error(StatusCode::NOT_FOUND, "no such key")),
    }
}

type QueryParams = Result<Query<HashMap<String, String>>, QueryRejection>;

fn query_params(q: QueryParams) -> Result<HashMap<String, String>, ApiError> {
    q.map(|Query(m)| m)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("bad query string: {e}")))
}

/// A query parameter, treating an empty value as absent.
fn param(q: &HashMap<String, String>, k: &str) -> Option<String> {
    q.get(k).filter(|v| !v.is_empty()).cloned()
}

async fn get_rollups(State(state): State<Shared>, headers: HeaderMap, q: QueryParams) -> ApiResult {
    authenticate_admin(&state, &headers)?;
    let q = query_params(q)?;
    let r = state
        .store
        .rollups(param(&q, "org"))
        .await
        .map_err(store_failed)?;
    let (error_groups, catalogs) = state
        .store
        .evidence_rollups(param(&q, "org"))
        .await
        .map_err(store_failed)?;
    Ok(
        Json(json!({ "rollups": r, "errorGroups": error_groups, "catalogs": catalogs }))
            .into_response(),
    )
}

async fn get_tools(State(state): State<Shared>, headers: HeaderMap, q: QueryParams) -> ApiResult {
    authenticate_admin(&state, &headers)?;
    let q = query_params(q)?;
    let tools = state
        .store
        .tools(param(&q, "org"))
        .await
        .map_err(store_failed)?;
    Ok(Json(json!({ "tools": tools })).into_response())
}

async fn get_events(State(state): State<Shared>, headers: HeaderMap, q: QueryParams) -> ApiResult {
    authenticate_admin(&state, &headers)?;
    let q = query_params(q)?;
    let limit = match q.get("limit").map(|l| l.parse::<u32>()) {
        None => DEFAULT_EVENTS_LIMIT,
        Some(Ok(n)) if (1..=MAX_EVENTS_LIMIT).contains(&n) => n,
        Some(_) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("`limit` must be an integer from 1 to {MAX_EVENTS_LIMIT}"),
            ))
        }
    };
    let class = param(&q, "class");
    if class
        .as_deref()
        .is_some_and(|c| !matches!(c, "action" | "error" | "drift"))
    {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "`class` must be `action`, `error` or `drift`",
        ));
    }
    let query = EventQuery {
        org: param(&q, "org"),
        actor: param(&q, "actor"),
        action: param(&q, "action"),
        class,
        limit,
    };
    let events = state.store.events(query).await.map_err(store_failed)?;
    Ok(Json(json!({ "events": events })).into_response())
}

async fn get_sensors(State(state): State<Shared>, headers: HeaderMap) -> ApiResult {
    authenticate_admin(&state, &headers)?;
    let stored = state.store.sensors().await.map_err(store_failed)?;
    let mut refusals = state.admission.refusals();
    let mut sensors = Vec::with_capacity(stored.len() + refusals.len());
    for s in stored {
        let r = refusals.remove(&s.key_id).unwrap_or_default();
        let mut v = serde_json::to_value(&s).unwrap_or(Value::Null);
        v["refused"] = json!({ "rate": r.rate, "slots": r.slots });
        sensors.push(v);
    }
    // Keys refused before any of their batches was stored.
    let mut rest: Vec<_> = refusals.into_iter().collect();
    rest.sort_by(|a, b| a.0.cmp(&b.0));
    for (key_id, r) in rest {
        sensors.push(json!({
            "keyId": key_id, "batches": 0, "accepted": 0, "dropped": 0,
            "refused": { "rate": r.rate, "slots": r.slots },
        }));
    }
    Ok(Json(json!({ "sensors": sensors })).into_response())
}
