//! Arbitrary HTTP exchanges through the Streamable HTTP observation path, fed as the reverse
//! proxy feeds it: request heads, response heads (status, `Mcp-Session-Id`, content type and
//! encoding), body chunks in both directions cut anywhere (JSON bodies, SSE streams parsed
//! incrementally), body ends of every kind and unreachable upstreams, for up to eight exchanges
//! at once in any order; the HTTP observation task (`observe::http`) splits them into messages,
//! assigns session scopes and the observer correlates them; then the calls still open time out
//! or end with the process.
//!
//! Input: records, `op % 8` the kind, `op / 8` its detail (exchange, method, status, content
//! type, how a body ended, a clock step); a request head and a response head carry one more
//! byte (session, status, content type), chunks a little-endian `u16` length and that many
//! bytes. At most [`MAX_MESSAGES`] records, the hand-off's capacity: all are queued before the
//! observation task runs.
//!
//! Asserts: no panic; every event built passes the sensor's own L3 filter and names the
//! upstream as `dest.host`; with the libFuzzer memory limits, memory stays bounded by the caps.

#![no_main]

use std::time::{Duration, Instant};

use bounded_observe_mcp::event::{filter_event, Event};
use bounded_observe_mcp::observe::{self, EndCause, Observer, ObserverConfig, Transport};
use bounded_observe_mcp::tap::http::{
    self as handoff, BodyEnd, ExchangeMsg, ReqKind, EXCHANGE_CAPACITY,
};
use bounded_observe_mcp::tap::Direction;
use bytes::Bytes;
use http::HeaderValue;
use libfuzzer_sys::fuzz_target;

const MAX_MESSAGES: usize = EXCHANGE_CAPACITY;

thread_local! {
    static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
}

const STATUSES: [u16; 8] = [200, 202, 204, 400, 404, 429, 500, 502];
const CONTENT_TYPES: [Option<&str>; 6] = [
    Some("application/json"),
    Some("text/event-stream"),
    Some("application/json; charset=utf-8"),
    Some("TEXT/EVENT-STREAM;charset=utf-8"),
    Some("text/plain"),
    None,
];
const ENCODINGS: [Option<&str>; 3] = [None, Some("identity"), Some("gzip")];
/// The request's `traceparent` header, as a client may send it: absent, valid, malformed, or
/// with bytes that are not ASCII (a header value may carry them; the observer must not trust it).
const TRACEPARENTS: [Option<&[u8]>; 4] = [
    None,
    Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    Some(b"00-zz-00f067aa0ba902b7-01"),
    Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-\xff\xfe-01"),
];
const KINDS: [ReqKind; 4] = [ReqKind::Post, ReqKind::Post, ReqKind::Get, ReqKind::Delete];
const ENDS: [BodyEnd; 4] = [
    BodyEnd::Complete,
    BodyEnd::Complete,
    BodyEnd::SourceFailed,
    BodyEnd::ReaderGone,
];

fn session(n: u8) -> Option<HeaderValue> {
    (n % 4 != 0).then(|| HeaderValue::from_str(&format!("sess-{}", n % 4)).expect("a header"))
}

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    let base = Instant::now();
    let mut clock = Duration::ZERO;
    let mut msgs = Vec::new();
    while let Some((&op, r)) = rest.split_first() {
        rest = r;
        if msgs.len() >= MAX_MESSAGES {
            break;
        }
        let detail = op >> 3;
        let ex = u64::from(detail & 7);
        let seen = base + clock;
        let msg = match op % 8 {
            0 => {
                let Some((&b, r)) = rest.split_first() else {
                    break;
                };
                rest = r;
                ExchangeMsg::Request {
                    ex,
                    kind: KINDS[usize::from(detail >> 3)],
                    session: session(b),
                    traceparent: TRACEPARENTS[usize::from(b >> 6)]
                        .and_then(|v| HeaderValue::from_bytes(v).ok()),
                }
            }
            1 => {
                let Some((&b, r)) = rest.split_first() else {
                    break;
                };
                rest = r;
                ExchangeMsg::Response {
                    ex,
                    status: STATUSES[usize::from(b & 7)],
                    session: session(b >> 3),
                    content_type: CONTENT_TYPES[usize::from(b >> 5) % 6]
                        .map(HeaderValue::from_static),
                    content_encoding: ENCODINGS[usize::from(detail >> 3) % 3]
                        .map(HeaderValue::from_static),
                    seen,
                }
            }
            k @ (2 | 3) => {
                let Some((len, r)) = rest.split_first_chunk::<2>() else {
                    break;
                };
                let len = usize::from(u16::from_le_bytes(*len)).min(r.len());
                let (chunk, r) = r.split_at(len);
                rest = r;
                ExchangeMsg::Chunk {
                    ex,
                    dir: if k == 2 {
                        Direction::ClientToServer
                    } else {
                        Direction::ServerToClient
                    },
                    seen,
                    bytes: Bytes::copy_from_slice(chunk),
                    after_gap: detail >> 3 == 3,
                }
            }
            k @ (4 | 5) => ExchangeMsg::End {
                ex,
                dir: if k == 4 {
                    Direction::ClientToServer
                } else {
                    Direction::ServerToClient
                },
                seen,
                how: ENDS[usize::from(detail >> 3)],
            },
            6 => ExchangeMsg::Unreachable { ex, seen },
            _ => {
                clock += Duration::from_millis(u64::from(detail).pow(3) / 4);
                continue;
            }
        };
        msgs.push(msg);
    }

    let cfg = ObserverConfig {
        transport: Transport::Http {
            host: "127.0.0.1:9999".into(),
        },
        server_name: None,
        actor: "mcp:k_fuzz".into(),
        on_behalf_of: None,
        capture: Vec::new(),
        capture_text: Vec::new(),
        call_timeout: Duration::from_secs(30),
    };
    let observer = Observer::new(cfg, Vec::<Event>::new());
    let (tx, rx) = handoff::channel();
    for m in msgs {
        assert!(tx.offer(m), "the channel holds every message queued");
    }
    drop(tx);
    let (mut observer, _totals) = RT.with(|rt| rt.block_on(observe::http::run(rx, observer)));
    observer.on_tick(base + clock + Duration::from_secs(31));
    let (stats, events) =
        observer.finish(base + clock + Duration::from_secs(40), EndCause::SessionEnd);
    assert_eq!(stats.events, events.len() as u64);
    for e in events {
        assert_eq!(e.dest.host.as_str(), "127.0.0.1:9999");
        let shown = format!("{e:?}");
        assert!(
            filter_event(e).is_ok(),
            "the sensor's L3 rejects its own event: {shown}"
        );
    }
});
