//! Correlation state: which requests are waiting for which answers, and what an answer means.
//!
//! Owns the key requests are matched by — (scope, direction the request travelled, id), never the
//! id alone, because a server→client request may reuse an id the client used (DESIGN §2a, §9);
//! ids compare as servers compare them, equal numbers equal however written ([`RpcId`]) —
//! the [`Action`] record of one `tools/call` (which may span several 2026-07-28 `input_required`
//! rounds), and the mapping from an ending to status, class and `err` (DESIGN §4 table). Holds
//! metadata only: tool name, timings, sizes and already-filtered captured fields.

use std::hash::{Hash, Hasher};
use std::time::{Instant, SystemTime};

use serde_json::{Map, Value};

use super::peek::RpcId;
use super::StreamId;
use crate::event::{ErrKind, EventClass, EventErr, Session};
use crate::tap::Direction;

/// A request's identity: the scope it was seen in, the direction it travelled, its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub scope: StreamId,
    pub dir: Direction,
    pub id: RpcId,
}

/// Two writes instead of the derive's four (scope, direction tag, id tag, id): every call hashes
/// its key three times (duplicate check, insert, response), and SipHash pays per write. Equal
/// keys still hash equally; which id variant it is need not go in, `Eq` tells them apart.
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let dir = match self.dir {
            Direction::ClientToServer => 0,
            Direction::ServerToClient => 1,
        };
        state.write_u64(self.scope.0.rotate_left(1) ^ dir);
        match &self.id {
            RpcId::Num(n) => state.write_i128(*n),
            RpcId::Str(s) | RpcId::Dec(s) => state.write(s.as_bytes()),
        }
    }
}

/// What a pending request was, so its response is read the right way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingKind {
    /// A `tools/call` round of the action with this number.
    ToolCall(u64),
    /// `tools/list`; `first_page`: sent without a cursor.
    ToolsList {
        first_page: bool,
    },
    Initialize,
    Discover,
    /// Anything else (including server→client sampling, roots, elicitation): matched so its
    /// response is never mistaken for something else, and otherwise ignored.
    Other,
}

#[derive(Debug, Clone)]
pub struct Pending {
    pub kind: PendingKind,
    pub seen: Instant,
}

/// Where an action stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionState {
    /// A request round is on the wire, waiting for the response to this key.
    InFlight(Key),
    /// The server answered `input_required`; waiting for the client's retry with a new id.
    /// `state`: SHA-256 of the `requestState` to be echoed, if the server sent one (kept as a
    /// digest: the observer has no business holding the server's state).
    AwaitingInput { state: Option<[u8; 32]> },
}

/// One `tools/call` as an action: from the first request to the final result.
#[derive(Debug, Clone)]
pub struct Action {
    /// The scope of the latest round.
    pub scope: StreamId,
    /// False once that scope ended (HTTP): a retry may then come in any scope.
    pub scope_open: bool,
    pub tool: String,
    pub started: Instant,
    pub started_wall: SystemTime,
    /// When the latest round started or ended: the call timeout runs from here.
    pub last_activity: Instant,
    pub fields: Option<Map<String, Value>>,
    pub on_behalf_of: Option<String>,
    pub registry_version: Option<String>,
    pub session: Option<Session>,
    pub bytes_req: u64,
    pub bytes_resp: u64,
    pub rounds: u32,
    pub state: ActionState,
}

/// How an action ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// `result.isError: true`.
    ToolError,
    /// A JSON-RPC error response with this code (`None`: the code was missing or not an integer).
    JsonRpc(Option<i64>),
    Timeout,
    Cancelled,
    Transport,
    /// HTTP: the upstream answered with this non-2xx status.
    HttpStatus(u16),
}

/// JSON-RPC error code → HTTP-ish status (DESIGN §4).
pub fn status_for_jsonrpc_code(code: Option<i64>) -> u16 {
    match code {
        Some(-32700) | Some(-32600) | Some(-32602) => 400,
        Some(-32601) => 404,
        _ => 500,
    }
}

impl Outcome {
    pub fn status(self) -> u16 {
        match self {
            Outcome::Success => 200,
            Outcome::ToolError => 500,
            Outcome::JsonRpc(code) => status_for_jsonrpc_code(code),
            Outcome::Timeout => 504,
            Outcome::Cancelled => 499,
            Outcome::Transport => 502,
            Outcome::HttpStatus(s) => s,
        }
    }

    pub fn class(self) -> EventClass {
        match self {
            Outcome::Success => EventClass::Action,
            _ => EventClass::Error,
        }
    }

    pub fn err(self) -> Option<EventErr> {
        let (kind, code) = match self {
            Outcome::Success => return None,
            Outcome::ToolError => (ErrKind::Tool, None),
            // A code whose digits L4 reads as a card number would get the event rejected by
            // the filter: it is omitted, the kind and status still say what happened.
            Outcome::JsonRpc(code) => (
                ErrKind::Jsonrpc,
                code.filter(|c| !crate::event::privacy::number_is_sensitive(&(*c).into())),
            ),
            Outcome::Timeout => (ErrKind::Timeout, None),
            Outcome::Cancelled => (ErrKind::Cancelled, None),
            Outcome::Transport | Outcome::HttpStatus(_) => (ErrKind::Transport, None),
        };
        Some(EventErr { kind, code })
    }
}

/// SHA-256 of an echoed `requestState`.
pub fn state_digest(state: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, state.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table_matches_the_design() {
        assert_eq!(Outcome::Success.status(), 200);
        assert_eq!(Outcome::ToolError.status(), 500);
        for c in [-32700, -32600, -32602] {
            assert_eq!(Outcome::JsonRpc(Some(c)).status(), 400);
        }
        assert_eq!(Outcome::JsonRpc(Some(-32601)).status(), 404);
        assert_eq!(Outcome::JsonRpc(Some(-32603)).status(), 500);
        assert_eq!(Outcome::JsonRpc(Some(-32042)).status(), 500);
        assert_eq!(Outcome::JsonRpc(None).status(), 500);
        assert_eq!(Outcome::Timeout.status(), 504);
        assert_eq!(Outcome::Cancelled.status(), 499);
        assert_eq!(Outcome::Transport.status(), 502);
        assert_eq!(Outcome::HttpStatus(503).status(), 503);
        assert_eq!(Outcome::Success.class(), EventClass::Action);
        assert!(Outcome::Success.err().is_none());
        assert_eq!(
            Outcome::JsonRpc(Some(-32601)).err(),
            Some(EventErr {
                kind: ErrKind::Jsonrpc,
                code: Some(-32601)
            })
        );
    }
}
