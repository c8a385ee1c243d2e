//! The observer: turns forwarded JSON-RPC traffic into one [`Event`] per `tools/call`.
//!
//! NOT YET BUILT (issue 3). The interface below is the contract the proxies call.

use std::time::{Duration, Instant};

use crate::event::{Event, EventSink};
use crate::tap::{Direction, TapReceiver};

/// A correlation scope: messages whose ids are matched together (keyed by scope, direction, id).
/// Stdio has one scope (0). HTTP: one per `Mcp-Session-Id` (all POSTs and the GET stream of that
/// session share it), or one per POST exchange when there is no session (2026-07-28, stateless).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

/// How a transport reaches the server: decides `dest.host` and `sensor.transport`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Stdio,
    /// `host[:port]` of the upstream.
    Http {
        host: String,
    },
}

/// What the observer needs to know from the configuration.
#[derive(Debug, Clone)]
pub struct ObserverConfig {
    pub transport: Transport,
    /// `--name`; overrides `serverInfo.name`.
    pub server_name: Option<String>,
    pub actor: String,
    pub on_behalf_of: Option<String>,
    /// Extra allow-listed argument keys (`--capture`).
    pub capture: Vec<String>,
    pub call_timeout: Duration,
}

/// Why in-flight calls end without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndCause {
    /// The server went away (child exited, upstream unreachable): 502 `transport`.
    Transport,
    /// The session ended normally with the call unanswered: 504 `timeout`.
    SessionEnd,
}

/// Counters printed at exit with `--debug`.
#[derive(Debug, Clone, Default)]
pub struct ObserverStats {
    pub frames: [u64; 2],
    pub bytes: [u64; 2],
    pub events: u64,
}

pub struct Observer<S: EventSink> {
    #[allow(dead_code)]
    cfg: ObserverConfig,
    #[allow(dead_code)]
    sink: S,
    stats: ObserverStats,
}

impl<S: EventSink> Observer<S> {
    pub fn new(cfg: ObserverConfig, sink: S) -> Self {
        Observer {
            cfg,
            sink,
            stats: ObserverStats::default(),
        }
    }

    /// One complete frame (one JSON-RPC message or batch, without its newline).
    pub fn on_frame(&mut self, _stream: StreamId, dir: Direction, _seen: Instant, frame: &[u8]) {
        self.stats.frames[dir.index()] += 1;
        self.stats.bytes[dir.index()] += frame.len() as u64;
    }

    /// HTTP: the upstream answered the POST carrying `request_body` with a non-2xx status, or
    /// could not be reached (the proxy passes 502): every `tools/call` request in that body that
    /// has no response yet ends with `status`.
    pub fn on_http_failure(
        &mut self,
        _scope: StreamId,
        _request_body: &[u8],
        _status: u16,
        _seen: Instant,
    ) {
    }

    /// HTTP: events in `scope` carry `session.id = session_hash` (a hash, never the raw id).
    pub fn set_scope_session(&mut self, _scope: StreamId, _session_hash: String) {}

    /// HTTP: the scope is over (DELETE, session gone, or a stateless POST finished, or the
    /// client disconnected): calls still in flight in it end with `cause`.
    pub fn end_scope(&mut self, _scope: StreamId, _seen: Instant, _cause: EndCause) {}

    /// Expires calls older than the call timeout (504).
    pub fn on_tick(&mut self, _now: Instant) {}

    /// Ends every call still in flight with `cause`, returns the counters.
    pub fn finish(self, _now: Instant, _cause: EndCause) -> (ObserverStats, S) {
        (self.stats, self.sink)
    }
}

/// Drives an observer from the stdio tap until both directions close, then returns it
/// (the caller decides the [`EndCause`] for calls still in flight).
///
/// Splits each direction's chunks into `\n`-terminated frames; a last frame without a newline
/// is delivered when its direction closes; after a tap gap the partial frame is discarded so
/// halves of different messages are never glued together.
pub async fn run_tap_observer<S: EventSink>(
    mut rx: TapReceiver,
    mut observer: Observer<S>,
) -> Observer<S> {
    let mut partial: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    while let Some(msg) = rx.recv().await {
        match msg {
            crate::tap::TapMsg::Chunk(c) => {
                let buf = &mut partial[c.dir.index()];
                if c.after_gap {
                    buf.clear();
                }
                let mut rest = &c.bytes[..];
                while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
                    if buf.is_empty() {
                        observer.on_frame(StreamId(0), c.dir, c.seen, &rest[..nl]);
                    } else {
                        buf.extend_from_slice(&rest[..nl]);
                        observer.on_frame(StreamId(0), c.dir, c.seen, buf);
                        buf.clear();
                    }
                    rest = &rest[nl + 1..];
                }
                buf.extend_from_slice(rest);
                // Release a buffer grown by one huge frame (DESIGN §9, unbounded frames).
                if buf.is_empty() && buf.capacity() > crate::proxy::stdio::READ_BUF {
                    *buf = Vec::new();
                }
            }
            crate::tap::TapMsg::Closed { dir, seen } => {
                let buf = std::mem::take(&mut partial[dir.index()]);
                if !buf.is_empty() {
                    observer.on_frame(StreamId(0), dir, seen, &buf);
                }
            }
        }
    }
    observer
}

#[allow(dead_code)]
fn _assert_event_is_used(_e: Event) {}
