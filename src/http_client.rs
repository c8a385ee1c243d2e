//! The one HTTP client policy of the crate: every reqwest client (the sensor's reporter, and the
//! admin client behind `bounded-ingest mint` / `revoke`) is built by [`build`], so no client can
//! drift from it.
//!
//! The policy, for every client:
//!
//! * **No proxy from the environment.** `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` are ignored:
//!   they would hand a bearer token (a sensor token, the admin secret, or a freshly minted token
//!   in the answer) to a third party, in clear text for an `http://` ingest.
//! * **No redirects.** A 3xx is the answer: following one would carry the `Authorization`
//!   header, and the body, to wherever the `Location` points.
//! * **The same timeouts**: [`CONNECT_TIMEOUT`] and [`REQUEST_TIMEOUT`] (the reporter's tests
//!   shorten them through [`ClientOptions`]).
//! * **TLS: rustls with the ring provider** (installed as the process default if none is yet; a
//!   parent that installed its own keeps it). Server certificates are checked against the
//!   operating system's trust store (reqwest's platform verifier); where the system has no CA
//!   certificates at all (minimal containers), the Mozilla roots compiled in through
//!   `webpki-root-certs` are used instead.
//!
//! Goes in: [`ClientOptions`]. Comes out: a `reqwest::Client`. It never opens a socket.

use std::time::Duration;

/// How long to wait for a TCP (+TLS) connection. Loopback and LAN connects take well under a
/// millisecond and WAN ones tens; 3 s covers the first SYN retransmission (1 s) and a slow
/// handshake, and fails a dead host fast enough that its retry still fits in a flush interval.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Whole-request budget (connect, send, answer). An ingest stores 500 events, or mints a key,
/// in milliseconds; 10 s leaves room for a loaded one while bounding how long a black-holed
/// ingest can hold the reporter's single in-flight slot (the queue keeps filling, and drops,
/// meanwhile) or keep an operator's `mint` waiting.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Sent on every request, so an ingest's logs tell our clients apart.
pub const USER_AGENT: &str = concat!("bounded-observe-mcp/", env!("CARGO_PKG_VERSION"));

/// What may differ between clients; everything else is the policy.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    /// Idle connections kept per host (the reporter keeps one).
    pub max_idle_per_host: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: CONNECT_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
            max_idle_per_host: usize::MAX,
        }
    }
}

/// The client could not be built (no TLS configuration at all could be made).
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot build the HTTP client: {0}")]
pub struct ClientError(pub String);

/// Builds a client under the policy (see the module docs).
pub fn build(opts: &ClientOptions) -> Result<reqwest::Client, ClientError> {
    // reqwest is built with `rustls-no-provider`: a provider must be the process default before
    // a client is built, or the build panics. Err only means one is already there.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = || {
        reqwest::Client::builder()
            .connect_timeout(opts.connect_timeout)
            .timeout(opts.request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .pool_max_idle_per_host(opts.max_idle_per_host)
            .user_agent(USER_AGENT)
    };
    match builder().build() {
        Ok(c) => Ok(c),
        // The platform verifier fails when the system has no CA certificates at all.
        Err(_) => {
            let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS
                .iter()
                .filter_map(|der| reqwest::Certificate::from_der(der).ok());
            builder()
                .tls_certs_only(roots)
                .build()
                .map_err(|e| ClientError(e.without_url().to_string()))
        }
    }
}
