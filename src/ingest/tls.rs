//! HTTPS for the reference ingest: `--tls-cert` / `--tls-key` (PEM), rustls with the ring
//! provider, HTTP/1.1 only (the server speaks nothing else).
//!
//! Goes in: the bound TCP listener and, when TLS is on, the certificate chain and private key.
//! Comes out: an [`IngestListener`] that the HTTP server accepts from; with TLS, each accepted
//! stream is an [`IngestStream`] whose handshake runs on that connection's own task, on its
//! first read or write, so a client that never finishes a handshake holds up no other client
//! (and is cut after [`HANDSHAKE_TIMEOUT`]). Without TLS the TCP stream is passed through as is.
//! It never logs a failed handshake above debug level: scanners and untrusting clients make many.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use super::IngestError;

/// How long a client has to complete the TLS handshake. A handshake is two round trips and a
/// few KB; 10 s covers a slow or distant client, and a connection that has not finished by
/// then is holding a socket and a task for nothing.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// ALPN: the ingest serves HTTP/1.1 only.
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Builds the TLS server configuration from PEM files: `cert` holds the certificate chain (leaf
/// first), `key` the private key (PKCS#8, PKCS#1 or SEC1).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, IngestError> {
    let bad = |path: &Path, reason: String| IngestError::Tls {
        path: path.to_path_buf(),
        reason,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad(cert, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(bad(
            cert,
            "no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(key, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(cert, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| bad(key, format!("does not go with the certificate: {e}")))?;
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(Arc::new(config))
}

/// The ingest's listener: plain TCP, or TCP whose streams are wrapped in TLS.
pub struct IngestListener {
    tcp: TcpListener,
    tls: Option<TlsAcceptor>,
}

impl IngestListener {
    pub fn new(tcp: TcpListener, tls: Option<Arc<rustls::ServerConfig>>) -> Self {
        IngestListener {
            tcp,
            tls: tls.map(TlsAcceptor::from),
        }
    }

    /// Whether accepted streams speak TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Wraps one accepted TCP stream: as is, or in a TLS handshake that runs on first use.
    pub fn wrap(&self, tcp: TcpStream) -> IngestStream {
        match &self.tls {
            None => IngestStream(Inner::Plain(tcp)),
            Some(acceptor) => IngestStream(Inner::Handshake {
                accept: Box::new(acceptor.accept(tcp)),
                deadline: Box::pin(tokio::time::sleep(HANDSHAKE_TIMEOUT)),
            }),
        }
    }
}

impl axum::serve::Listener for IngestListener {
    type Io = IngestStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // TcpListener's own impl retries (and backs off on) accept errors.
        let (tcp, addr) = axum::serve::Listener::accept(&mut self.tcp).await;
        (self.wrap(tcp), addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// One accepted connection, plain or TLS.
pub struct IngestStream(Inner);

enum Inner {
    Plain(TcpStream),
    Handshake {
        /// Boxed: the handshake state is over a KB, the other variants a pointer or two.
        accept: Box<tokio_rustls::Accept<TcpStream>>,
        deadline: Pin<Box<tokio::time::Sleep>>,
    },
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// The handshake failed or timed out; the socket is closed.
    Failed,
}

impl IngestStream {
    /// Drives the handshake, if one is pending; `Ready(Ok)` once the stream can carry data.
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Inner::Handshake { accept, deadline } = &mut self.0 else {
            return Poll::Ready(match self.0 {
                Inner::Failed => Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "TLS handshake failed",
                )),
                _ => Ok(()),
            });
        };
        let res = match Pin::new(&mut **accept).poll(cx) {
            Poll::Ready(res) => res,
            Poll::Pending => match deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "TLS handshake timed out",
                )),
                Poll::Pending => return Poll::Pending,
            },
        };
        match res {
            Ok(stream) => {
                self.0 = Inner::Tls(Box::new(stream));
                Poll::Ready(Ok(()))
            }
            Err(e) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                self.0 = Inner::Failed;
                Poll::Ready(Err(e))
            }
        }
    }
}

impl AsyncRead for IngestStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_handshake(cx))?;
        match &mut this.0 {
            Inner::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Inner::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
            Inner::Handshake { .. } | Inner::Failed => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncWrite for IngestStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_handshake(cx))?;
        match &mut this.0 {
            Inner::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Inner::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
            Inner::Handshake { .. } | Inner::Failed => Poll::Ready(Ok(0)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_handshake(cx))?;
        match &mut this.0 {
            Inner::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Inner::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
            Inner::Handshake { .. } | Inner::Failed => Poll::Ready(Ok(0)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.0 {
            Inner::Plain(s) => s.is_write_vectored(),
            Inner::Tls(s) => s.is_write_vectored(),
            Inner::Handshake { .. } | Inner::Failed => false,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match &mut this.0 {
            Inner::Plain(s) => Pin::new(s).poll_flush(cx),
            Inner::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
            // Nothing of ours has been written before the handshake completes.
            Inner::Handshake { .. } | Inner::Failed => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match &mut this.0 {
            Inner::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Inner::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
            // Dropping the stream closes the socket; there is no TLS session to close.
            Inner::Handshake { .. } | Inner::Failed => Poll::Ready(Ok(())),
        }
    }
}
