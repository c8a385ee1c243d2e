//! The admin API client: what `bounded-ingest mint` / `revoke`, the live tests and an embedding
//! demo use to talk to an ingest.
//!
//! Goes in: an ingest base URL and the admin secret. Comes out: minted keys, revocations, rollups
//! and stored events, or an [`AdminError`] that names the ingest and the HTTP status. It never
//! prints the admin secret, and its `Debug` form hides it; the ingest URL is shown only
//! redacted ([`redact_url`]: no query, no `user:password@`).
//!
//! Its HTTP client follows the crate's one policy ([`crate::http_client`]): no proxy from the
//! environment (`HTTP_PROXY` would see the admin secret and every minted token), no redirects (a
//! 3xx is reported as [`AdminError::Redirect`], never followed with the secret), the same
//! timeouts. For an `https://` ingest whose certificate comes from a private CA, give that CA to
//! [`AdminClient::with_extra_roots`] (`bounded-ingest mint --ingest-ca PATH`).

use rustls::pki_types::CertificateDer;
use serde::Deserialize;
use serde_json::Value;

use crate::log::redact_url;

use super::server::{ADMIN_KEYS_PATH, ADMIN_SENSORS_PATH, EVENTS_PATH, ROLLUPS_PATH};

/// A key just minted. `token` is the secret a sensor runs with.
#[derive(Clone, PartialEq, Eq, Deserialize)]
pub struct MintedKey {
    #[serde(rename = "keyId")]
    pub key_id: String,
    pub token: String,
    pub org: String,
    #[serde(default)]
    pub name: Option<String>,
}

impl std::fmt::Debug for MintedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MintedKey")
            .field("key_id", &self.key_id)
            .field("token", &"<redacted>")
            .field("org", &self.org)
            .field("name", &self.name)
            .finish()
    }
}

/// Every `url` here is already redacted, and `source` carries no URL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    #[error("ingest URL {0:?} is not an http(s):// URL")]
    BadUrl(String),
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error("ingest {url}: {source}")]
    Request { url: String, source: reqwest::Error },
    /// A 3xx: not followed, since the request carries the admin secret. `location` is redacted.
    #[error("ingest {url} answered {status} (a redirect to {location}); redirects are not followed, so the admin secret stays with the address given: pass the ingest's own address with --ingest")]
    Redirect {
        url: String,
        status: u16,
        location: String,
    },
    #[error("ingest {url} answered {status}: {message}")]
    Status {
        url: String,
        status: u16,
        message: String,
    },
    #[error("ingest {url} answered with an unexpected body: {detail}")]
    Body { url: String, detail: String },
}

impl AdminError {
    /// The HTTP status the ingest answered, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            AdminError::Status { status, .. } | AdminError::Redirect { status, .. } => {
                Some(*status)
            }
            _ => None,
        }
    }
}

pub struct AdminClient {
    base: reqwest::Url,
    secret: String,
    http: reqwest::Client,
}

impl std::fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AdminClient({}, <redacted>)",
            redact_url(self.base.as_str())
        )
    }
}

impl AdminClient {
    /// `base` is the ingest root, e.g. `http://127.0.0.1:7361`.
    pub fn new(base: &str, admin_secret: &str) -> Result<Self, AdminError> {
        Self::with_extra_roots(base, admin_secret, Vec::new())
    }

    /// As [`AdminClient::new`], trusting `extra_roots` (a private CA, see
    /// [`crate::http_client::load_ca_file`]) besides the default roots for an `https://` ingest.
    pub fn with_extra_roots(
        base: &str,
        admin_secret: &str,
        extra_roots: Vec<CertificateDer<'static>>,
    ) -> Result<Self, AdminError> {
        let trimmed = base.trim_end_matches('/');
        let url = reqwest::Url::parse(&format!("{trimmed}/"))
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| AdminError::BadUrl(redact_url(base)))?;
        let http = crate::http_client::build(&crate::http_client::ClientOptions {
            extra_roots,
            ..Default::default()
        })
        .map_err(|e| AdminError::Client(e.0))?;
        Ok(AdminClient {
            base: url,
            secret: admin_secret.to_string(),
            http,
        })
    }

    fn url(&self, path: &str) -> Result<reqwest::Url, AdminError> {
        self.base
            .join(path.trim_start_matches('/'))
            .map_err(|_| AdminError::BadUrl(redact_url(&format!("{}{path}", self.base))))
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        url: &reqwest::Url,
    ) -> Result<(u16, bytes::Bytes), AdminError> {
        let resp = req
            .bearer_auth(&self.secret)
            .send()
            .await
            .map_err(|source| request_error(url, source))?;
        let status = resp.status().as_u16();
        if resp.status().is_redirection() {
            let location = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(|l| redact_url(l).chars().take(200).collect())
                .unwrap_or_else(|| "nowhere".to_string());
            return Err(AdminError::Redirect {
                url: redact_url(url.as_str()),
                status,
                location,
            });
        }
        let body = resp
            .bytes()
            .await
            .map_err(|source| request_error(url, source))?;
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(200).collect());
            return Err(AdminError::Status {
                url: redact_url(url.as_str()),
                status,
                message,
            });
        }
        Ok((status, body))
    }

    fn parse<T: serde::de::DeserializeOwned>(
        url: &reqwest::Url,
        body: &[u8],
    ) -> Result<T, AdminError> {
        serde_json::from_slice(body).map_err(|e| AdminError::Body {
            url: redact_url(url.as_str()),
            detail: e.to_string(),
        })
    }

    /// `POST /v1/admin/keys`: a new sensor key for `org`.
    pub async fn mint(&self, org: &str, name: Option<&str>) -> Result<MintedKey, AdminError> {
        let url = self.url(ADMIN_KEYS_PATH)?;
        let mut body = serde_json::json!({ "org": org });
        if let Some(n) = name {
            body["name"] = Value::String(n.to_string());
        }
        let req = self
            .http
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        let (_, bytes) = self.send(req, &url).await?;
        Self::parse(&url, &bytes)
    }

    /// `DELETE /v1/admin/keys/{keyId}`: the key's next batch is refused.
    pub async fn revoke(&self, key_id: &str) -> Result<(), AdminError> {
        let mut url = self.url(ADMIN_KEYS_PATH)?;
        url.path_segments_mut()
            .map_err(|_| AdminError::BadUrl(redact_url(self.base.as_str())))?
            .push(key_id);
        self.send(self.http.delete(url.clone()), &url).await?;
        Ok(())
    }

    /// `GET /v1/rollups[?org=]`: the `rollups` array.
    pub async fn rollups(&self, org: Option<&str>) -> Result<Vec<Value>, AdminError> {
        let mut url = self.url(ROLLUPS_PATH)?;
        if let Some(o) = org {
            url.query_pairs_mut().append_pair("org", o);
        }
        let (_, bytes) = self.send(self.http.get(url.clone()), &url).await?;
        let v: Value = Self::parse(&url, &bytes)?;
        array_field(&url, v, "rollups")
    }

    /// `GET /v1/tools[?org=]`: the `tools` array (definition hashes per host and tool, with the
    /// `changed` and `inconsistent` flags).
    pub async fn tools(&self, org: Option<&str>) -> Result<Vec<Value>, AdminError> {
        let mut url = self.url(super::server::TOOLS_PATH)?;
        if let Some(o) = org {
            url.query_pairs_mut().append_pair("org", o);
        }
        let (_, bytes) = self.send(self.http.get(url.clone()), &url).await?;
        let v: Value = Self::parse(&url, &bytes)?;
        array_field(&url, v, "tools")
    }

    /// `GET /v1/events?…`: stored events, newest first. `filters` are `(name, value)` pairs
    /// among `org`, `actor`, `action`, `class`, `limit`.
    pub async fn events(&self, filters: &[(&str, &str)]) -> Result<Vec<Value>, AdminError> {
        let mut url = self.url(EVENTS_PATH)?;
        if !filters.is_empty() {
            let mut q = url.query_pairs_mut();
            for (k, v) in filters {
                q.append_pair(k, v);
            }
        }
        let (_, bytes) = self.send(self.http.get(url.clone()), &url).await?;
        let v: Value = Self::parse(&url, &bytes)?;
        array_field(&url, v, "events")
    }

    /// `GET /v1/admin/sensors`: per-sensor counters.
    pub async fn sensors(&self) -> Result<Vec<Value>, AdminError> {
        let url = self.url(ADMIN_SENSORS_PATH)?;
        let (_, bytes) = self.send(self.http.get(url.clone()), &url).await?;
        let v: Value = Self::parse(&url, &bytes)?;
        array_field(&url, v, "sensors")
    }
}

/// reqwest's error names the full URL; the redacted one is printed beside it instead.
fn request_error(url: &reqwest::Url, source: reqwest::Error) -> AdminError {
    AdminError::Request {
        url: redact_url(url.as_str()),
        source: source.without_url(),
    }
}

fn array_field(url: &reqwest::Url, mut v: Value, field: &str) -> Result<Vec<Value>, AdminError> {
    match v.get_mut(field).map(Value::take) {
        Some(Value::Array(a)) => Ok(a),
        _ => Err(AdminError::Body {
            url: redact_url(url.as_str()),
            detail: format!("no `{field}` array"),
        }),
    }
}
