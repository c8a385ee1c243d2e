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
//!   `webpki-root-certs` are used instead. A private CA ([`load_ca_file`], from `--ingest-ca` /
//!   `BOUNDED_INGEST_CA`) is added to those roots, never in place of them.
//!
//! Goes in: [`ClientOptions`]. Comes out: a `reqwest::Client`. It never opens a socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

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

/// Largest CA file read: a bundle of a few hundred certificates is well under this.
const MAX_CA_FILE_BYTES: u64 = 1024 * 1024;

/// What may differ between clients; everything else is the policy.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    /// Certificates of a private CA, trusted besides the default roots.
    pub extra_roots: Vec<CertificateDer<'static>>,
    /// Idle connections kept per host (the reporter keeps one).
    pub max_idle_per_host: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: CONNECT_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
            extra_roots: Vec::new(),
            max_idle_per_host: usize::MAX,
        }
    }
}

/// The client could not be built (no TLS configuration at all could be made).
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot build the HTTP client: {0}")]
pub struct ClientError(pub String);

/// A private CA file that cannot be used. Names the file, never its contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaError {
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path} is larger than {MAX_CA_FILE_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    NoCertificate { path: PathBuf },
    #[error("{path} is not valid PEM: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("{path}: certificate {index} cannot be a trust anchor: {reason}")]
    Certificate {
        path: PathBuf,
        index: usize,
        reason: String,
    },
}

/// Reads the PEM certificates of a private CA (one or more `CERTIFICATE` blocks; other blocks
/// are skipped) and checks that each can be a trust anchor.
pub fn load_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, CaError> {
    use std::io::Read;
    let read_err = |e: std::io::Error| CaError::Read {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(read_err)?
        .take(MAX_CA_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_CA_FILE_BYTES {
        return Err(CaError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CaError::Pem {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(CaError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    let mut store = rustls::RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        store.add(cert.clone()).map_err(|e| CaError::Certificate {
            path: path.to_path_buf(),
            index: i + 1,
            reason: e.to_string(),
        })?;
    }
    Ok(certs)
}

/// Builds a client under the policy (see the module docs).
pub fn build(opts: &ClientOptions) -> Result<reqwest::Client, ClientError> {
    // reqwest is built with `rustls-no-provider`: a provider must be the process default before
    // a client is built, or the build panics. Err only means one is already there.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let extra = || {
        opts.extra_roots
            .iter()
            .filter_map(|der| reqwest::Certificate::from_der(der).ok())
    };
    let builder = || policy(opts).tls_certs_merge(extra());
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

/// The policy every client shares (see the module docs), TLS roots aside.
fn policy(opts: &ClientOptions) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .connect_timeout(opts.connect_timeout)
        .timeout(opts.request_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .pool_max_idle_per_host(opts.max_idle_per_host)
        .user_agent(USER_AGENT)
}

/// [`build`] for a client that only ever talks plain `http://` (an OTLP Collector on
/// loopback): no root store is loaded, which costs tens of milliseconds at start, on the
/// path to the exit of a short session. An `https://` URL then fails to verify.
pub fn build_plain(opts: &ClientOptions) -> Result<reqwest::Client, ClientError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    policy(opts)
        .tls_certs_only(std::iter::empty())
        .build()
        .map_err(|e| ClientError(e.without_url().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_ca_file_names_the_file_and_the_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing.pem");
        assert!(matches!(load_ca_file(&missing), Err(CaError::Read { .. })));
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let e = load_ca_file(&empty).expect_err("no certificate");
        assert!(matches!(e, CaError::NoCertificate { .. }), "{e}");
        assert!(e.to_string().contains("empty.pem"), "{e}");
        let junk = dir.path().join("junk.pem");
        std::fs::write(
            &junk,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .expect("write");
        let e = load_ca_file(&junk).expect_err("not a certificate");
        assert!(matches!(e, CaError::Certificate { index: 1, .. }), "{e}");
    }

    #[test]
    fn a_ca_certificate_loads_and_a_client_builds_with_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).expect("ca");
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, ca.pem()).expect("write");
        let roots = load_ca_file(&path).expect("loads");
        assert_eq!(roots.len(), 1);
        build(&ClientOptions {
            extra_roots: roots,
            ..ClientOptions::default()
        })
        .expect("client");
    }
}
