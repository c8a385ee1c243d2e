//! Streamable HTTP mode: a transparent reverse proxy in front of a remote MCP endpoint
//! (DESIGN §1, §2a, §9).
//!
//! Owns the [`Listener`], the upstream connector (and one upstream client per client
//! connection), the relay's runtime, signal handling and shutdown.
//! Goes in: the parsed [`Upstream`], the port, the drain deadline, the allowed origins and,
//! when observed, the hand-off's sender, all given by the wiring (`crate::run`). Comes out: an
//! exit code. Each accepted connection is served by [`forward`] on a one-worker relay runtime;
//! copies of what it forwards go to the hand-off ([`crate::tap::http`]), read by the observer
//! on a thread of its own.
//! It must never change what the client or the upstream see: bodies are streamed frame by
//! frame (an SSE event is relayed as soon as it arrives), only hop-by-hop headers are dropped,
//! nothing is added (not even `Date`), and observation never makes the relay wait. It knows no
//! JSON-RPC, builds no event and reaches no ingest: it imports nothing from `observe`, `event`
//! or `report`.
//!
//! Decisions a user sees (README):
//! * **Listener**: `127.0.0.1` only, on `--port` or an ephemeral port; once it accepts it
//!   prints `[observe-mcp] listening http://127.0.0.1:<port> → <upstream>` on stderr, the
//!   upstream's query (often its credential, `?api_key=…`) shown as `?<redacted>`, as in every
//!   line that names it.
//! * **Who may use it** ([`admit`], DNS rebinding): only requests whose `Host` is
//!   `127.0.0.1`, `localhost` or `[::1]` with the bound port, and whose `Origin`, when there is
//!   one, is a loopback origin (`http(s)://127.0.0.1|localhost|[::1]`, any port), the upstream's
//!   own, or one given with `--allow-origin`. Anything else gets a 403 (a 400 when `Host` is
//!   missing or repeated: a malformed HTTP/1.1 request) and never reaches the upstream; each
//!   kind is warned about once. The kill switch keeps these checks.
//! * **Paths**: the local root (`/`) and the upstream's own path (e.g. `/mcp`) both reach the
//!   upstream endpoint; any other path is forwarded unchanged to the upstream's origin, so
//!   OAuth discovery (`/.well-known/…`) keeps working. A query on `/` is appended to the
//!   upstream URL's own query.
//! * **Compression**: bodies are forwarded exactly as the upstream encodes them (the client's
//!   `Accept-Encoding` is passed on unchanged). Only identity-encoded bodies are observed; a
//!   compressed JSON or SSE body is relayed and counted, and its calls are not reported.
//!   Trade-off: asking the upstream for identity would observe everything but change what the
//!   client negotiated and cost bandwidth; transparency wins.
//! * **Protocol**: the listener speaks HTTP/1.1 (no HTTP/2); the upstream is reached over
//!   HTTP/1.1, `https://` through rustls with the Mozilla (webpki) root set, so an upstream
//!   certificate from a private CA is not trusted (the client gets a 502). An upstream URL
//!   carrying `user:password@` is refused at start.
//! * **Kill switch** (`BOUNDED_OBSERVE_MCP_DISABLED=1`): the same proxy with no observation
//!   task, no reporter and no socket to any ingest.
//! * **Shutdown**: SIGINT or SIGTERM stops accepting and closes idle connections; exchanges in
//!   flight (POST responses, SSE ones included, and any other request already being answered)
//!   may finish for up to `--drain-ms` (default 5 s), so a client is not invited to retry a
//!   call whose side effect already happened; what is still open at the deadline is cut. GET
//!   event streams are not calls and would never finish: they end at once. Then the observer
//!   ends what is in flight and the reporter flushes within `--shutdown-flush-ms`; the exit code
//!   is 128 + the signal (130 for SIGINT, 143 for SIGTERM), as in stdio mode, where the
//!   wrapper's code follows a signalled server. A listener that cannot bind, or an upstream URL
//!   that cannot be used, exits 1.

pub mod admit;
mod forward;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::Uri;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::config::Origin;
use crate::log::{redact_url, PREFIX};
use crate::tap::http::ExchangeSender;

pub use forward::{strip_hop_by_hop, HEADER_SESSION_ID};

/// Exit code when the proxy cannot start (bind failure, unusable upstream URL, no runtime).
pub const EXIT_START_FAILED: i32 = 1;

/// Idle pooled upstream connections are closed after this; long enough to keep a busy
/// session's connection warm, short enough not to hold sockets an upstream has forgotten.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Read buffer for upstream connections. Each read becomes one body frame handed from the
/// upstream connection's task to the client's; larger reads mean fewer hand-offs on big bodies,
/// while a small SSE event is still relayed as soon as it is read.
const UPSTREAM_READ_BUF: usize = 64 * 1024;

/// Relay worker threads. One: the relay's work per request is a few header copies and
/// hand-offs, and on one thread the hand-off between the upstream connection's task and the
/// client's is not a cross-thread wake-up (measured: lower added latency than two workers on a
/// 2-core machine). Observation and reporting run on a thread of their own (`crate::run`).
const WORKER_THREADS: usize = 1;

/// The upstream endpoint, parsed once.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub scheme: Scheme,
    pub authority: Authority,
    pub path_and_query: PathAndQuery,
    /// As given on the command line with its query redacted ([`redact_url`]), for logs: the
    /// only form of the URL any line prints.
    pub display: String,
}

impl Upstream {
    pub fn parse(url: &str) -> Result<Upstream, String> {
        let shown = redact_url(url);
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("upstream {shown:?} is not a URL: {e}"))?;
        let scheme = uri
            .scheme()
            .filter(|s| **s == Scheme::HTTP || **s == Scheme::HTTPS)
            .cloned()
            .ok_or_else(|| format!("upstream {shown:?} must be http:// or https://"))?;
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("upstream {shown:?} has no host"))?;
        if authority.as_str().contains('@') {
            // The URL is not echoed: it holds a secret.
            return Err(
                "the upstream URL carries credentials (user:password@); pass them as headers from the client"
                    .to_string(),
            );
        }
        let path_and_query = uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        Ok(Upstream {
            scheme,
            authority,
            path_and_query,
            display: shown,
        })
    }

    /// `host[:port]`, as events name the destination.
    pub fn host(&self) -> String {
        self.authority.as_str().to_string()
    }
}

/// The relay's listener, bound, with its runtime and upstream connector: the proxy between
/// start-up (whose failures stop the process before anything is served) and serving.
pub struct Listener {
    listener: TcpListener,
    connector: forward::UpstreamConnector,
    port: u16,
    rt: tokio::runtime::Runtime,
}

impl Listener {
    /// Starts the relay's runtime and upstream connector and binds `127.0.0.1:port` (`0`: an
    /// ephemeral port). An error is the line to print before exiting with [`EXIT_START_FAILED`].
    pub fn bind(port: u16) -> Result<Listener, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKER_THREADS)
            .thread_name("observe-mcp-http")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the runtime: {e}"))?;
        let connector = upstream_connector()?;
        let listener = rt
            .block_on(TcpListener::bind(SocketAddr::from((
                Ipv4Addr::LOCALHOST,
                port,
            ))))
            .map_err(|e| format!("cannot listen on 127.0.0.1:{port}: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("cannot read the listening address: {e}"))?
            .port();
        Ok(Listener {
            listener,
            connector,
            port,
            rt,
        })
    }

    /// Prints the `listening` line and relays to `upstream` until SIGINT/SIGTERM, then drains
    /// for up to `drain`. Copies of what it forwards go to `handoff` (`None`: unobserved).
    /// Returns the exit code (128 + the signal) once every connection is closed and the relay's
    /// runtime is down, so no copy of `handoff` is left and the observation task can finish.
    pub fn serve(
        self,
        upstream: Upstream,
        drain: Duration,
        allow_origins: &[Origin],
        handoff: Option<ExchangeSender>,
    ) -> i32 {
        let Listener {
            listener,
            connector,
            port,
            rt,
        } = self;
        let admission = admit::Admission::new(
            port,
            &format!("{}://{}", upstream.scheme, upstream.authority),
            allow_origins,
        );
        let code = rt.block_on(serve(
            listener, port, connector, upstream, admission, drain, handoff,
        ));
        rt.shutdown_timeout(Duration::from_millis(100));
        code
    }
}

/// The listener's side of shutdown: started once by a signal, seen by every connection (which
/// then finishes the exchange in hand and closes) and every GET event stream (which ends).
struct Shutdown {
    tx: tokio::sync::watch::Sender<bool>,
}

impl Shutdown {
    fn new() -> Shutdown {
        Shutdown {
            tx: tokio::sync::watch::Sender::new(false),
        }
    }

    fn stopping(&self) -> Stopping {
        Stopping(self.tx.subscribe())
    }

    fn begin(&self) {
        self.tx.send_replace(true);
    }
}

/// A view of [`Shutdown`] that connections and streams hold.
#[derive(Clone)]
pub(crate) struct Stopping(tokio::sync::watch::Receiver<bool>);

impl Stopping {
    /// Resolves once shutdown has begun (or the listener is gone, which is the same).
    pub(crate) async fn stopped(mut self) {
        let _ = self.0.wait_for(|stopping| *stopping).await;
    }
}

/// Serves one client connection until it closes, or, once shutdown begins, until the exchange
/// in hand is answered (hyper's graceful shutdown: no further request is read).
async fn serve_connection(stream: tokio::net::TcpStream, fwd: Arc<forward::Forwarder>) {
    let stopping = fwd.stopping();
    // One upstream client, so one pool, per client connection: the proxy opens, reuses and
    // closes upstream connections as this client does its own. With one pool shared by all
    // clients, a request on a new client connection could take an idle upstream connection
    // while a request sent before it on another new connection waited for a fresh one, and
    // reach the upstream first (the official Python SDK's GET stream overtook its POST of
    // `notifications/initialized` that way, and the server answered differently).
    let client = connection_client(fwd.connector.clone());
    let service = service_fn(move |req| forward::forward(fwd.clone(), client.clone(), req));
    let conn = hyper::server::conn::http1::Builder::new()
        .auto_date_header(false)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let served = tokio::select! {
        served = conn.as_mut() => served,
        () = stopping.stopped() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = served {
        tracing::debug!(error = %e, "Client connection ended with an error");
    }
}

/// Resolves when SIGINT or SIGTERM arrives, with the signal number. If the handlers cannot be
/// installed the proxy still runs, stoppable only by SIGKILL; that is said once.
async fn shutdown_signal() -> i32 {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => libc::SIGINT,
                _ = term.recv() => libc::SIGTERM,
            }
        }
        _ => {
            eprintln!("{PREFIX} warning: cannot install signal handlers");
            std::future::pending().await
        }
    }
}

fn upstream_connector() -> Result<forward::UpstreamConnector, String> {
    let mut tcp = hyper_util::client::legacy::connect::HttpConnector::new();
    // The request head and each body chunk go upstream as separate writes, as the client sent
    // them: with Nagle's algorithm on, every body waited for the upstream's delayed ACK of the
    // head (~40 ms a call, and a POST overtaken by the client's next request).
    tcp.set_nodelay(true);
    // The TLS layer above decides which schemes are allowed.
    tcp.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
        .map_err(|e| format!("TLS setup failed: {e}"))?
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp);
    Ok(https)
}

/// The upstream client of one client connection (see [`serve_connection`]).
fn connection_client(connector: forward::UpstreamConnector) -> forward::UpstreamClient {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        // A request that could not be sent on a stale pooled connection is retried once by
        // the client itself, before any of its body was read.
        .retry_canceled_requests(true)
        .set_host(true)
        .http1_read_buf_exact_size(UPSTREAM_READ_BUF)
        .build(connector)
}

async fn serve(
    listener: TcpListener,
    local_port: u16,
    connector: forward::UpstreamConnector,
    upstream: Upstream,
    admission: admit::Admission,
    drain: Duration,
    handoff: Option<ExchangeSender>,
) -> i32 {
    let display = upstream.display.clone();
    let shutdown = Shutdown::new();
    let fwd = Arc::new(forward::Forwarder::new(
        upstream,
        connector,
        handoff,
        admission,
        shutdown.stopping(),
    ));

    eprintln!("{PREFIX} listening http://127.0.0.1:{local_port} → {display}");

    let mut conns = JoinSet::new();
    let signal = shutdown_signal();
    tokio::pin!(signal);
    let signo = loop {
        tokio::select! {
            signo = &mut signal => break signo,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    conns.spawn(serve_connection(stream, fwd.clone()));
                }
                Err(e) => {
                    // Out of descriptors and the like: say so, pause, keep serving.
                    tracing::warn!(error = %e, "Accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    };
    // New connections are refused from here on; idle ones close, GET streams end, and the
    // exchanges in flight have until the drain deadline.
    drop(listener);
    shutdown.begin();
    let drained =
        tokio::time::timeout(drain, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            connections = conns.len(),
            drain_ms = drain.as_millis() as u64,
            "Drain deadline passed; closing exchanges still in flight"
        );
    }
    // What is left is cut: its bodies end, which the observer sees, and the upstream sees each
    // of its requests closed.
    conns.shutdown().await;
    drop(fwd);
    128 + signo
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_parse_keeps_scheme_authority_and_path() {
        let u = Upstream::parse("https://mcp.example.com:8443/v1/mcp?x=1").expect("valid");
        assert_eq!(u.scheme, Scheme::HTTPS);
        assert_eq!(u.host(), "mcp.example.com:8443");
        assert_eq!(u.path_and_query.as_str(), "/v1/mcp?x=1");
        assert_eq!(u.display, "https://mcp.example.com:8443/v1/mcp?<redacted>");
        assert_eq!(
            Upstream::parse("http://127.0.0.1:9")
                .expect("valid")
                .path_and_query
                .as_str(),
            "/"
        );
    }

    #[test]
    fn upstream_parse_rejects_other_schemes_and_credentials() {
        assert!(Upstream::parse("ftp://example.com/mcp").is_err());
        assert!(Upstream::parse("/mcp").is_err());
        let e = Upstream::parse("https://user:secret@example.com/mcp").expect_err("refused");
        assert!(e.contains("credentials") && !e.contains("secret"), "{e}");
        for bad in [
            "ftp://example.com/mcp?k=secret",
            "http:///mcp?k=secret",
            "http://a b?k=secret",
        ] {
            let e = Upstream::parse(bad).expect_err("refused");
            assert!(!e.contains("secret"), "{e}");
        }
    }
}
