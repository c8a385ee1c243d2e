//! Who may reach the upstream through the listener: the `Host` and `Origin` checks that stop
//! DNS rebinding (DESIGN invariant 9; the MCP transports specification asks a local server to
//! validate `Origin`).
//!
//! A web page whose own name is rebound to 127.0.0.1 can make the browser send requests to the
//! listener; they carry the page's name in `Host` and its origin in `Origin`. The proxy rewrites
//! `Host` for the upstream, so without these checks such a page would reach the upstream as if
//! it were the local client, past the upstream's own `Host` check.
//!
//! Owns the accepted `Host`s (`127.0.0.1`, `localhost`, `[::1]`, each with the bound port), the
//! accepted `Origin`s (any loopback origin, the upstream's own, and `--allow-origin`), and the
//! one warning per kind of refusal; [`Origin`] itself, as configuration validates it, is
//! [`crate::config`]'s. Goes in: a request's head. Comes out: admitted, or the
//! [`Refusal`] to answer with. It must never read a body, reach the upstream, or log per request.

use std::sync::atomic::{AtomicBool, Ordering};

use http::header::{self, HeaderMap, HeaderValue};
use http::{StatusCode, Uri};

use crate::config::{parse_authority, Origin};

/// The names a loopback client may put in `Host` (lower case): the listener binds 127.0.0.1,
/// and `localhost` and `[::1]` are how clients name the same machine. A DNS name an attacker
/// controls can never be one of them.
const LOOPBACK_HOSTS: &[&str] = &["127.0.0.1", "localhost", "[::1]"];

/// Schemes of the loopback origins admitted without configuration: a page served from this
/// machine (a local web UI, an inspector) over either.
const LOOPBACK_ORIGIN_SCHEMES: &[&str] = &["http", "https"];

/// The port a `Host` without one means (RFC 9110 §4.2.1: the listener speaks plain HTTP).
const DEFAULT_HTTP_PORT: u16 = 80;

/// Longest refused value quoted in the warning: enough to recognise it, too short to flood.
const MAX_LOGGED_VALUE: usize = 100;

/// A page served from this machine, over either scheme and on any port.
fn is_loopback(origin: &Origin) -> bool {
    LOOPBACK_ORIGIN_SCHEMES.contains(&origin.scheme()) && LOOPBACK_HOSTS.contains(&origin.host())
}

/// Why a request was refused; each kind is warned about once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Host`, more than one, or one that is not an authority: a malformed HTTP/1.1 request
    /// (RFC 9112 §3.2 asks for a 400).
    MalformedHost,
    /// A well-formed `Host` (or absolute request target) that is not this listener.
    ForeignHost,
    /// An `Origin` that is neither loopback, the upstream's, nor allowed by `--allow-origin`
    /// (more than one `Origin`, or `null`, counts as foreign).
    ForeignOrigin,
}

impl Refusal {
    pub fn status(self) -> StatusCode {
        match self {
            Refusal::MalformedHost => StatusCode::BAD_REQUEST,
            Refusal::ForeignHost | Refusal::ForeignOrigin => StatusCode::FORBIDDEN,
        }
    }

    /// The body of the refusal: says what to fix, names nothing of the upstream.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::MalformedHost => "Bad Request: one Host header is required\n",
            Refusal::ForeignHost => {
                "Forbidden: Host must be 127.0.0.1, localhost or [::1] with this listener's port\n"
            }
            Refusal::ForeignOrigin => {
                "Forbidden: Origin is not loopback, the upstream's, or allowed by --allow-origin\n"
            }
        }
    }
}

/// The listener's admission policy, shared by every connection.
#[derive(Debug)]
pub struct Admission {
    /// The port the listener is bound to: a `Host` naming another port was meant for another
    /// server.
    port: u16,
    /// The upstream's own origin and every `--allow-origin`, normalised.
    origins: Vec<Origin>,
    warned_host: AtomicBool,
    warned_origin: AtomicBool,
}

impl Admission {
    /// `upstream_origin` is `scheme://authority` of the upstream URL; `allowed` comes from
    /// `--allow-origin` / `BOUNDED_ALLOW_ORIGINS`, already validated.
    pub fn new(port: u16, upstream_origin: &str, allowed: &[Origin]) -> Admission {
        let origins = Origin::parse(upstream_origin)
            .into_iter()
            .chain(allowed.iter().cloned())
            .collect();
        Admission {
            port,
            origins,
            warned_host: AtomicBool::new(false),
            warned_origin: AtomicBool::new(false),
        }
    }

    /// Admits a request by its head, or says why not (warning once per kind).
    pub fn check(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), Refusal> {
        let verdict = self.check_host(uri, headers).and_then(|()| {
            self.check_origin(headers)
                .map_err(|value| (Refusal::ForeignOrigin, value))
        });
        verdict.map_err(|(refusal, value)| {
            self.warn_once(refusal, &value);
            refusal
        })
    }

    fn check_host(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), (Refusal, String)> {
        let mut hosts = headers.get_all(header::HOST).iter();
        let (Some(host), None) = (hosts.next(), hosts.next()) else {
            return Err((Refusal::MalformedHost, String::new()));
        };
        let Some((name, port)) = host.to_str().ok().and_then(parse_authority) else {
            return Err((Refusal::MalformedHost, shown(host)));
        };
        if !self.is_ours(&name, port) {
            return Err((Refusal::ForeignHost, shown(host)));
        }
        // An absolute request target (`POST http://name/ HTTP/1.1`) names the server too, and
        // RFC 9112 §3.2.2 makes it win over `Host`: it must be ours as well.
        if let Some(authority) = uri.authority() {
            match parse_authority(authority.as_str()) {
                Some((name, port)) if self.is_ours(&name, port) => {}
                _ => return Err((Refusal::ForeignHost, authority.as_str().to_string())),
            }
        }
        Ok(())
    }

    fn is_ours(&self, name: &str, port: Option<u16>) -> bool {
        LOOPBACK_HOSTS.contains(&name) && port.unwrap_or(DEFAULT_HTTP_PORT) == self.port
    }

    fn check_origin(&self, headers: &HeaderMap) -> Result<(), String> {
        let mut values = headers.get_all(header::ORIGIN).iter();
        let Some(value) = values.next() else {
            // Not a browser's request (browsers send `Origin` on every cross-origin request and
            // on every POST): the `Host` check is what applies.
            return Ok(());
        };
        if values.next().is_some() {
            return Err(shown(value));
        }
        match value.to_str().ok().and_then(Origin::parse) {
            Some(o) if is_loopback(&o) || self.origins.contains(&o) => Ok(()),
            _ => Err(shown(value)),
        }
    }

    fn warn_once(&self, refusal: Refusal, value: &str) {
        let flag = match refusal {
            Refusal::MalformedHost | Refusal::ForeignHost => &self.warned_host,
            Refusal::ForeignOrigin => &self.warned_origin,
        };
        if flag.swap(true, Ordering::Relaxed) {
            return;
        }
        let status = refusal.status().as_u16();
        match refusal {
            Refusal::MalformedHost | Refusal::ForeignHost => tracing::warn!(
                host = ?value,
                status,
                port = self.port,
                "Refused a request for another Host (DNS rebinding protection: only 127.0.0.1, \
                 localhost or [::1] with this port); further ones are not logged"
            ),
            Refusal::ForeignOrigin => tracing::warn!(
                origin = ?value,
                status,
                "Refused a request from a foreign Origin (DNS rebinding protection: loopback, the \
                 upstream's and --allow-origin ones only); further ones are not logged"
            ),
        }
    }
}

/// A header value as the warning quotes it: lossy, cut to [`MAX_LOGGED_VALUE`] characters
/// (the `{:?}` formatting then escapes control characters).
fn shown(v: &HeaderValue) -> String {
    String::from_utf8_lossy(v.as_bytes())
        .chars()
        .take(MAX_LOGGED_VALUE)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(allowed: &[&str]) -> Admission {
        let allowed: Vec<Origin> = allowed
            .iter()
            .map(|a| Origin::parse(a).expect("valid origin"))
            .collect();
        Admission::new(8931, "https://mcp.example.com", &allowed)
    }

    fn head(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).expect("header value"));
        }
        h
    }

    fn root() -> Uri {
        Uri::from_static("/mcp")
    }

    #[test]
    fn loopback_hosts_with_the_bound_port_are_admitted() {
        let a = admission(&[]);
        for host in [
            "127.0.0.1:8931",
            "localhost:8931",
            "LocalHost:8931",
            "[::1]:8931",
        ] {
            assert_eq!(a.check(&root(), &head(&[("host", host)])), Ok(()), "{host}");
        }
    }

    #[test]
    fn other_names_and_ports_are_foreign() {
        let a = admission(&[]);
        for host in [
            "attacker.example:8931",
            "127.0.0.1:8932",
            "localhost",
            "127.0.0.2:8931",
            "localhost.:8931",
            "mcp.example.com",
        ] {
            assert_eq!(
                a.check(&root(), &head(&[("host", host)])),
                Err(Refusal::ForeignHost),
                "{host}"
            );
        }
    }

    #[test]
    fn missing_repeated_or_garbled_host_is_malformed() {
        let a = admission(&[]);
        assert_eq!(a.check(&root(), &head(&[])), Err(Refusal::MalformedHost));
        assert_eq!(
            a.check(
                &root(),
                &head(&[("host", "127.0.0.1:8931"), ("host", "127.0.0.1:8931")])
            ),
            Err(Refusal::MalformedHost)
        );
        for host in [
            "",
            "user@127.0.0.1:8931",
            "127.0.0.1:",
            "127.0.0.1:99999",
            "a b",
        ] {
            assert_eq!(
                a.check(&root(), &head(&[("host", host)])),
                Err(Refusal::MalformedHost),
                "{host:?}"
            );
        }
    }

    #[test]
    fn absolute_target_must_name_the_listener_too() {
        let a = admission(&[]);
        let h = head(&[("host", "127.0.0.1:8931")]);
        let foreign = Uri::from_static("http://attacker.example:8931/mcp");
        assert_eq!(a.check(&foreign, &h), Err(Refusal::ForeignHost));
        let ours = Uri::from_static("http://localhost:8931/mcp");
        assert_eq!(a.check(&ours, &h), Ok(()));
    }

    #[test]
    fn host_without_port_means_port_80() {
        let a = Admission::new(80, "https://mcp.example.com", &[]);
        assert_eq!(a.check(&root(), &head(&[("host", "localhost")])), Ok(()));
    }

    #[test]
    fn origins_admitted_are_loopback_upstream_and_allowed() {
        let a = admission(&["https://app.example"]);
        for origin in [
            "http://localhost:3000",
            "http://127.0.0.1",
            "https://[::1]:8443",
            "https://mcp.example.com",
            "https://MCP.example.com:443",
            "https://app.example",
        ] {
            let h = head(&[("host", "127.0.0.1:8931"), ("origin", origin)]);
            assert_eq!(a.check(&root(), &h), Ok(()), "{origin}");
        }
    }

    #[test]
    fn foreign_null_and_repeated_origins_are_refused() {
        let a = admission(&["https://app.example"]);
        for origins in [
            &["https://attacker.example"][..],
            &["null"],
            &["http://mcp.example.com"],
            &["https://app.example:8443"],
            &["file://localhost"],
            &["http://localhost:3000", "https://attacker.example"],
        ] {
            let mut pairs = vec![("host", "127.0.0.1:8931")];
            pairs.extend(origins.iter().map(|o| ("origin", *o)));
            assert_eq!(
                a.check(&root(), &head(&pairs)),
                Err(Refusal::ForeignOrigin),
                "{origins:?}"
            );
        }
    }
}
