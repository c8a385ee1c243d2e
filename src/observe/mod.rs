//! Observation: turns copies of forwarded JSON-RPC traffic into one [`crate::event::Event`] per
//! `tools/call`.
//!
//! Goes in: copies of the bytes the relay forwarded, with the relay's timestamps — as tap chunks
//! ([`run_tap_observer`], stdio) or as messages ([`Observer::on_split`], HTTP bodies and SSE
//! data, kept by [`frame::MessageBuf`]). Comes out: finished events, handed to an
//! [`crate::event::EventSink`] (the reporter's queue), plus [`ObserverStats`]. It runs on its own
//! task, off the relay path, and must never block or slow the relay, never panic on what it
//! reads, and never put a request or response value into an event except allow-listed scalar
//! arguments that passed the privacy layers.
//!
//! The journey inside, a file each: [`frame`] decides what of a message is kept, whatever frames
//! it, splits stdio chunks into frames (bounded by [`frame::DEFAULT_FRAME_CAP`]) and batches
//! into elements, [`summary`] reads a message too large to hold whole from its ends, [`peek`]
//! reads the few fields needed with borrowed types, `observer.rs` ([`Observer`]) takes each
//! message in and counts what it cannot read, [`correlate`] matches responses to requests by
//! (scope, direction, id) and keeps the actions, [`outcome`] maps how an action ended to status,
//! class and `err`, `assemble.rs` builds the event, [`catalog`] fingerprints `tools/list` (and each
//! listed tool, for `toolDef`, `hints` and `drift`), [`fingerprint`] the shape of an error's text;
//! `stdio.rs` ([`run_tap_observer`]) drives it all from the stdio tap, with its reorder window
//! and its pacing, and [`http`] from the HTTP hand-off.
//!
//! Memory: the tap's byte budget ([`crate::tap::TAP_BUDGET_BYTES`]) of chunks not yet split,
//! one frame per direction up to the cap (64 MiB), a copy of an assembled frame only while it
//! waits in the reorder window (a frame nothing can overtake is observed in place), at most
//! [`EARLY_RESPONSE_BYTES`] of early responses, and per open request a small record; requests
//! other than `tools/call` are forgotten after the call timeout. HTTP: the hand-off's messages
//! ([`crate::tap::http::EXCHANGE_CAPACITY`]), and per open exchange what [`frame::MessageBuf`]
//! keeps of its request and of the answer in progress (a large JSON object: 32 KiB or so).

pub mod catalog;
pub mod correlate;
pub mod fingerprint;
pub mod frame;
pub mod http;
pub mod outcome;
pub mod peek;
pub mod sse;
pub mod summary;

mod assemble;
mod observer;
mod stdio;

use std::time::Duration;

pub use assemble::MAX_TOOL_NAME;
pub use correlate::{EARLY_RESPONSE_BYTES, EARLY_RESPONSE_GRACE, MAX_OPEN_PER_SCOPE, MAX_PENDING};
pub use observer::Observer;
pub use stdio::{
    run_tap_observer, run_tap_observer_with, CloseReceiver, IdleState, Progress, SessionClose,
    StdioOptions, FRAMES_PER_TURN, REORDER_HOLD, SINK_STALL_LIMIT, TAP_LINGER,
};

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
    /// Keys whose string values may be prose (`--capture-text`); each is also allow-listed.
    pub capture_text: Vec<String>,
    pub call_timeout: Duration,
}

/// Why in-flight calls end without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndCause {
    /// The server went away (child exited, upstream unreachable): 502 `transport`.
    Transport,
    /// The session ended normally with the call unanswered: 504 `timeout`.
    SessionEnd,
    /// HTTP: the client closed the response stream the call was to be answered on (in
    /// 2026-07-28 that is the cancellation): 499 `cancelled`.
    ClientClosed,
}

/// Counters printed at exit with `--debug`. Index 0 is client→server, 1 server→client.
#[derive(Debug, Clone, Default)]
pub struct ObserverStats {
    pub frames: [u64; 2],
    pub bytes: [u64; 2],
    pub events: u64,
    /// Frames (or batch elements) that are not JSON.
    pub non_json: u64,
    /// Of those, the ones the server sent (stdio: lines on its stdout): `sensor.health`.
    pub stdout_non_json: u64,
    /// JSON, but not a JSON-RPC message of the expected shape (wrong field types, not an object).
    pub malformed: u64,
    /// Frames that could not be parsed (over the frame cap, or too large and not summarisable):
    /// measured, not parsed.
    pub oversize: u64,
    /// JSON object frames over `frame::WHOLE_FRAME_BYTES`, observed from their first and last
    /// bytes (see [`summary`]).
    pub summarized: u64,
    /// Requests reusing an id still pending in the same scope and direction.
    pub duplicate_ids: u64,
    /// Responses to no pending request (unknown id, or a second response), less those put
    /// down to client messages the observer lost (`Observer::requests_lost`).
    pub orphan_responses: u64,
    /// Chunks that arrived after the tap dropped some: the splitter resynchronised.
    pub gaps: u64,
    /// Calls that ended without an observed answer after the tap (or the HTTP watch channel)
    /// dropped server→client bytes while they were open, or (HTTP) whose answer could not be
    /// read: their answer may have been among the dropped bytes, so no event is made for them
    /// (a 504 or 502 would claim a failure the client may not have seen). Also counted here:
    /// every client message the observer lost whole (stdio, see `stdio::LostRequests`), and
    /// every POST whose request it lost (HTTP).
    pub unobserved: u64,
    /// Requests dropped from tracking at a cap on open requests (`observe::correlate`): the
    /// oldest of a scope past `MAX_OPEN_PER_SCOPE`, or a new one past `MAX_PENDING` in all.
    /// The `tools/call`s among them are in `unobserved` too.
    pub evicted: u64,
    /// Calls whose tool name held a value L4 removes: reported under the name `<redacted>`.
    pub redacted_tools: u64,
    /// String arguments under an allowed key withheld as prose (not a code, and the key not
    /// given to `--capture-text`).
    pub prose_withheld: u64,
}

/// How often [`run_tap_observer`] checks call timeouts. Timeouts are minutes; a second is plenty.
pub const TICK: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests;
