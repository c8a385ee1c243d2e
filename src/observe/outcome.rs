//! How an action ended, and what that means on the wire: answer → [`Outcome`] → `status`,
//! `class` and `err` (the DESIGN §4 table), all in this file.
//!
//! Goes in: the peeked `error` / `result` of a response to a `tools/call` round, or why a call
//! ended unanswered ([`EndCause`], a timeout, a cancellation, an HTTP failure). Comes out: an
//! [`Outcome`] and the envelope fields it decides. Pure: it never touches correlation state and
//! reads nothing of an answer but the error code, `isError`, `resultType` and `requestState`.

use crate::event::{ErrKind, EventClass, EventErr};

use super::peek::{lenient_str, Lenient, Peek};
use super::EndCause;

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
    /// HTTP: the upstream answered a POST with this non-2xx status, or could not be reached
    /// (the proxy passes 502, which is a transport failure).
    pub fn http_failure(status: u16) -> Outcome {
        if status == 502 {
            Outcome::Transport
        } else {
            Outcome::HttpStatus(status)
        }
    }

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
        Some(EventErr {
            kind,
            code,
            fp: None,
        })
    }
}

/// What a response to a `tools/call` round says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer<'a> {
    /// The action is over.
    Final(Outcome),
    /// A 2026-07-28 result with `resultType` `"input_required"` (or the draft's `"incomplete"`):
    /// the action waits for the client's retry, which may echo `request_state`.
    InputRequired { request_state: Option<&'a str> },
    /// Neither a usable `result` nor an `error`.
    Unreadable,
}

impl<'a> Answer<'a> {
    pub fn of(p: &'a Peek<'_>) -> Answer<'a> {
        if let Lenient::Ok(e) = &p.error {
            Answer::Final(Outcome::JsonRpc(e.code.ok().copied()))
        } else if let Lenient::Ok(r) = &p.result {
            let rt = lenient_str(&r.result_type);
            if matches!(rt, Some("input_required") | Some("incomplete")) {
                return Answer::InputRequired {
                    request_state: lenient_str(&r.request_state),
                };
            }
            if r.is_error == Lenient::Ok(true) {
                Answer::Final(Outcome::ToolError)
            } else {
                Answer::Final(Outcome::Success)
            }
        } else {
            Answer::Unreadable
        }
    }
}

impl EndCause {
    pub(super) fn outcome(self) -> Outcome {
        match self {
            EndCause::Transport => Outcome::Transport,
            EndCause::SessionEnd => Outcome::Timeout,
            EndCause::ClientClosed => Outcome::Cancelled,
        }
    }
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
                code: Some(-32601),
                fp: None,
            })
        );
    }
}
