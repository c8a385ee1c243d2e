//! Stand-in ingests for the reporter modes: a healthy one that answers 200 to every
//! `POST /v1/events`, and a black hole that accepts TCP connections and never answers.
//!
//! Both listen on 127.0.0.1:0 only and live on background threads for the whole phase. They
//! count what they saw so the report can show that events really flowed (healthy) or really hung
//! (black hole). They must never be on the measured path of the direct or relay targets.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// Counters of one stand-in ingest.
#[derive(Debug, Default)]
pub struct IngestCounters {
    pub connections: AtomicU64,
    pub requests: AtomicU64,
    /// Events counted in JSON bodies (a compressed body is counted as a request only).
    pub events: AtomicU64,
    /// Of those, events whose status is not 200.
    pub events_not_ok: AtomicU64,
}

pub struct StandIn {
    pub addr: SocketAddr,
    pub counters: Arc<IngestCounters>,
}

/// Largest request body accepted; the sensor's batches are far smaller.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Starts the healthy ingest.
pub fn healthy() -> io::Result<StandIn> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let counters = Arc::new(IngestCounters::default());
    let c = counters.clone();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            c.connections.fetch_add(1, Ordering::Relaxed);
            let c = c.clone();
            thread::spawn(move || {
                let _ = serve_conn(conn, &c);
            });
        }
    });
    Ok(StandIn { addr, counters })
}

/// Starts the black hole: connections are accepted and held open, nothing is ever read or sent.
pub fn black_hole() -> io::Result<StandIn> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let counters = Arc::new(IngestCounters::default());
    let c = counters.clone();
    let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            c.connections.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut h) = held.lock() {
                h.push(conn);
            }
        }
    });
    Ok(StandIn { addr, counters })
}

fn serve_conn(conn: TcpStream, c: &IngestCounters) -> io::Result<()> {
    conn.set_nodelay(true)?;
    let mut writer = conn.try_clone()?;
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    loop {
        // Request line; EOF means the client closed the keep-alive connection.
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut content_length = 0usize;
        let mut chunked = false;
        let mut json = true;
        let mut close = false;
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => content_length = value.parse().unwrap_or(0),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "content-encoding" => json = value.eq_ignore_ascii_case("identity"),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        let body = if chunked {
            read_chunked(&mut reader)?
        } else {
            let mut body = vec![0u8; content_length.min(MAX_BODY)];
            reader.read_exact(&mut body)?;
            body
        };
        c.requests.fetch_add(1, Ordering::Relaxed);
        let mut accepted = 0u64;
        if json {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) {
                let (n, bad) = crate::session::count_batch(&v);
                accepted = n;
                c.events_not_ok.fetch_add(bad, Ordering::Relaxed);
            }
        }
        c.events.fetch_add(accepted, Ordering::Relaxed);
        let answer = format!("{{\"accepted\":{accepted},\"rejected\":0,\"duplicates\":0}}");
        // One write: `write!` on the socket sends each formatted piece as its own segment, and
        // with Nagle's algorithm on, the last one then waits for the client's delayed ACK
        // (40 ms), which a real ingest (hyper, one write, TCP_NODELAY) never costs.
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        writer.write_all(response.as_bytes())?;
        writer.flush()?;
        if close {
            return Ok(());
        }
    }
}

fn read_chunked(reader: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let size_hex = line.trim().split(';').next().unwrap_or("0");
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
        if size == 0 {
            // Trailers end with an empty line.
            loop {
                line.clear();
                if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        if body.len() + size > MAX_BODY {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        line.clear();
        reader.read_line(&mut line)?; // CRLF after the chunk
    }
}
