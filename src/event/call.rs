//! What a sink that exports more than the envelope (OTLP, `crate::otlp`) learns of a call
//! besides its [`super::Event`]: exact start and end, the JSON-RPC id, the W3C trace context the
//! client propagated, whether the tool is in the observed catalog, the server's version.
//!
//! Owns [`CallFacts`], [`SessionFacts`] and the W3C `traceparent` / `tracestate` parser
//! ([`TraceContext::parse`]). Every string here is metadata the observer vetted like the
//! event's own strings (single line, bounded, nothing the L4 scrubber removes); the trace ids are
//! hex the client chose. Never holds a request or response value. Never sent to the ingest: the
//! envelope (schema/event.v2) does not change.

use std::time::SystemTime;

use super::SharedStr;

/// Longest `tracestate` kept: the W3C limit is 32 list members; 512 bytes is what most
/// implementations propagate (the W3C recommendation), longer ones are dropped, not cut.
pub const MAX_TRACESTATE: usize = 512;

/// Longest JSON-RPC id exported as `jsonrpc.request.id`; a longer one is left out.
pub const MAX_REQUEST_ID: usize = 128;

/// A W3C trace context the client sent with the call (`params._meta.traceparent`, SEP-414, or
/// in HTTP mode the `traceparent` header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    /// The client's span: the parent of ours.
    pub parent_span_id: [u8; 8],
    pub flags: u8,
    /// Carried as is when it is printable ASCII within [`MAX_TRACESTATE`] and holds nothing the
    /// L4 scrubber removes; else left out.
    pub state: Option<String>,
}

impl TraceContext {
    /// A `traceparent` of version `00` (or a later version, read as `00` as the W3C spec says:
    /// the first four fields, more after a `-` ignored); `None` for anything else, an all-zero
    /// trace or span id included.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let t = traceparent.trim_matches(|c| c == ' ' || c == '\t');
        let b = t.as_bytes();
        if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let version = hex_array::<1>(&t[0..2])?[0];
        if version == 0xff || (version == 0 && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
            return None;
        }
        let trace_id = hex_array::<16>(&t[3..35])?;
        let parent_span_id = hex_array::<8>(&t[36..52])?;
        let flags = hex_array::<1>(&t[53..55])?[0];
        if trace_id == [0; 16] || parent_span_id == [0; 8] {
            return None;
        }
        let state = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE)
            .filter(|s| s.bytes().all(|c| (0x20..0x7f).contains(&c)))
            .filter(|s| !super::privacy::contains_sensitive(s))
            .map(str::to_string);
        Some(TraceContext {
            trace_id,
            parent_span_id,
            flags,
            state,
        })
    }
}

/// Lower-case or upper-case hex of exactly `N` bytes. The W3C spec asks for lower case;
/// upper case is refused, as the spec's parsers do.
fn hex_array<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != 2 * N {
        return None;
    }
    let nib = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (nib(b[2 * i])? << 4) | nib(b[2 * i + 1])?;
    }
    Some(out)
}

/// One observed `tools/call`, beyond its event.
#[derive(Debug, Clone, PartialEq)]
pub struct CallFacts {
    /// When the relay saw the request (the event's `ts`, to the nanosecond).
    pub start: SystemTime,
    /// `start` plus the event's `dur_ms`, on the relay's monotonic clock.
    pub end: SystemTime,
    /// The JSON-RPC id of the call's first round, as text; `None` when it is too long or holds
    /// something the L4 scrubber removes.
    pub request_id: Option<String>,
    /// The client's trace context, if it sent a valid one.
    pub trace: Option<TraceContext>,
    /// The tool is in the last `tools/list` the observer saw.
    pub listed: bool,
    /// `serverInfo.version`, when the server gave one the envelope could carry.
    pub server_version: Option<SharedStr>,
    /// `--name`, else `serverInfo.name` (in HTTP mode `dest.host` is the upstream's address).
    pub server_name: Option<SharedStr>,
}

/// One MCP session that ended (stdio: the wrapper's; HTTP: an `Mcp-Session-Id`).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionFacts {
    pub start: SystemTime,
    pub end: SystemTime,
    pub protocol: Option<SharedStr>,
    /// The server went away with calls open (stdio) or the session ended on a transport failure.
    pub transport_failed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_read_with_its_tracestate() {
        let t = TraceContext::parse(TP, Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"))
            .expect("valid");
        assert_eq!(t.trace_id[0], 0x4b);
        assert_eq!(t.trace_id[15], 0x36);
        assert_eq!(
            t.parent_span_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_eq!(t.flags, 1);
        assert_eq!(
            t.state.as_deref(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        // A later version with more fields reads its first four.
        assert!(TraceContext::parse(&format!("01{}-extra", &TP[2..]), None).is_some());
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad, None), None, "{bad:?}");
        }
    }

    #[test]
    fn a_tracestate_holding_pii_or_control_bytes_is_left_out() {
        for bad in ["vendor=jane@example.com", "a=b\nc", &"k=v,".repeat(200)] {
            let t = TraceContext::parse(TP, Some(bad)).expect("the parent stays");
            assert_eq!(t.state, None, "{bad:?}");
        }
    }
}
