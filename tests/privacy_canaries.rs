//! Canaries: private values planted in what a client sends must never reach what the sensor
//! writes out. Three angles:
//!
//! * a property test over arbitrary `tools/call` arguments (top-level and nested, under innocent,
//!   allow-listed, `--capture`d and PII-shaped keys) through the observer, the L3 filter and
//!   the batch encoding — the sensor's whole path in process;
//! * a property test over hostile events fed straight to `validate_and_filter_event` — the
//!   ingest's path, which cannot trust the sensor;
//! * the real wrapper binary around the rmcp payments fixture with a file sink and `--debug`:
//!   neither the sink file nor stderr may contain a canary.
//!
//! The rule checked: a canary may appear in the output only if it is a scalar, under a
//! top-level allowed key that is not PII-shaped, and is not detectable by the value scrubber
//! (an opaque "bare secret" is indistinguishable from a legitimate reason code; e-mails, card
//! numbers, JWTs and well-known token prefixes are always removed).

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bounded_observe_mcp::event::{
    filter_event, validate_and_filter_event, BatchBody, Event, SensorInfo,
};
use bounded_observe_mcp::observe::frame::{FrameSplitter, Split, DEFAULT_FRAME_CAP};
use bounded_observe_mcp::observe::{EndCause, Observer, ObserverConfig, StreamId, Transport};
use bounded_observe_mcp::tap::Direction;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// A planted value and whether the scrubber can recognise it.
#[derive(Debug, Clone)]
struct Canary {
    /// The exact text that must not leak (searched for in the output).
    needle: String,
    /// The JSON value planted (the needle as a string, inside a sentence, or as a number).
    value: Value,
    /// E-mail, card, JWT or secret with a known prefix: removed under any key.
    detectable: bool,
}

fn luhn_complete(prefix: &str) -> String {
    // Appends the check digit that makes `prefix` Luhn-valid.
    let digits: Vec<u32> = prefix.chars().filter_map(|c| c.to_digit(10)).collect();
    let mut sum = 0;
    for (i, d) in digits.iter().rev().enumerate() {
        let mut v = *d;
        if i % 2 == 0 {
            v *= 2;
            if v > 9 {
                v -= 9;
            }
        }
        sum += v;
    }
    format!("{prefix}{}", (10 - sum % 10) % 10)
}

fn canary() -> impl Strategy<Value = Canary> {
    let email = ("[a-z]{3,8}", "[a-z]{3,8}", 0u8..3).prop_map(|(u, d, wrap)| {
        let needle = format!("{u}.canary@{d}.example");
        let value = match wrap {
            0 => json!(needle),
            1 => json!(format!("refund for {needle} please")),
            _ => json!(format!("<{needle}>")),
        };
        Canary {
            needle,
            value,
            detectable: true,
        }
    });
    let card = (
        prop::sample::select(vec!["4", "51", "37"]),
        "[0-9]{14}",
        0u8..4,
    )
        .prop_map(|(iin, body, style)| {
            let num = luhn_complete(&format!("{iin}{body}")[..15]);
            let grouped = |sep: &str| {
                num.as_bytes()
                    .chunks(4)
                    .map(|c| std::str::from_utf8(c).unwrap_or(""))
                    .collect::<Vec<_>>()
                    .join(sep)
            };
            let (needle, value) = match style {
                0 => (num.clone(), json!(num)),
                1 => (
                    grouped(" "),
                    json!(format!("card {} on file", grouped(" "))),
                ),
                2 => (grouped("-"), json!(grouped("-"))),
                _ => (
                    num.clone(),
                    json!(num.parse::<u64>().unwrap_or(4111111111111111)),
                ),
            };
            Canary {
                needle,
                value,
                detectable: true,
            }
        });
    let jwt = ("[A-Za-z0-9_-]{10,30}", "[A-Za-z0-9_-]{10,40}").prop_map(|(p, s)| {
        let needle = format!("eyJhbGciOiJIUzI1NiJ9.{p}.{s}");
        Canary {
            value: json!(format!("Bearer {needle}")),
            needle,
            detectable: true,
        }
    });
    let marked = (
        prop::sample::select(vec!["sk_live_", "ghp_", "xoxb-"]),
        "[A-Za-z0-9]{16,24}",
    )
        .prop_map(|(m, r)| {
            let needle = format!("{m}{r}");
            Canary {
                value: json!(needle),
                needle,
                detectable: true,
            }
        });
    let bare = "[A-Z]{4}[0-9]{6}".prop_map(|r| {
        let needle = format!("QX{r}");
        Canary {
            value: json!(needle),
            needle,
            detectable: false,
        }
    });
    prop_oneof![email, card, jwt, marked, bare]
}

/// Keys of every kind: allow-listed, extended by `--capture`, innocent but not allowed, and
/// PII-shaped (some of them also passed to `--capture`, which must not help).
const ALLOWED: &[&str] = &[
    "reason",
    "status",
    "currency",
    "amount",
    "amountCents",
    "sku",
];
const NOT_ALLOWED: &[&str] = &["note", "description", "memo", "query", "data"];
const PII: &[&str] = &[
    "customer_email",
    "emailAddress",
    "card_number",
    "api_key",
    "password",
    "billingAddress",
    "authToken",
    "session_id",
    "first_name",
];
const CAPTURE: &[&str] = &["sku", "customer_email", "api_key"];

#[derive(Debug, Clone)]
struct Placement {
    key: String,
    /// Nested one level down (inside an object or an array) instead of top level.
    nested: bool,
    canary: Canary,
}

fn placement() -> impl Strategy<Value = Placement> {
    let all: Vec<&'static str> = ALLOWED
        .iter()
        .chain(NOT_ALLOWED)
        .chain(PII)
        .copied()
        .collect();
    (prop::sample::select(all), any::<bool>(), canary()).prop_map(|(k, nested, canary)| Placement {
        key: k.to_string(),
        nested,
        canary,
    })
}

fn may_leak(p: &Placement) -> bool {
    !p.nested && !p.canary.detectable && ALLOWED.contains(&p.key.as_str())
}

fn observer() -> Observer<Vec<Event>> {
    Observer::new(
        ObserverConfig {
            transport: Transport::Stdio,
            server_name: None,
            actor: "mcp:k".into(),
            on_behalf_of: None,
            capture: CAPTURE.iter().map(|s| s.to_string()).collect(),
            capture_text: vec![],
            call_timeout: Duration::from_secs(60),
        },
        Vec::new(),
    )
}

/// Feeds one message to the observer the way the stdio tap does: through a frame splitter, in
/// 64 KiB reads, so a message over the whole-frame limit is observed as its summary.
fn observe_line(obs: &mut Observer<Vec<Event>>, dir: Direction, at: Instant, msg: &str) {
    let mut split = FrameSplitter::new(DEFAULT_FRAME_CAP);
    let line = format!("{msg}\n");
    for piece in line.as_bytes().chunks(64 * 1024) {
        split.push(piece, false, 0, |s| match s {
            Split::Frame(f) => obs.on_frame(StreamId(0), dir, at, f),
            Split::Summary { skeleton, len } => {
                obs.on_summary_frame(StreamId(0), dir, at, skeleton, len)
            }
            Split::Oversize(n) => panic!("a {n}-byte message was not observed"),
        });
    }
}

/// Runs one call through observer → L3 → batch and returns the serialized batch. With
/// `blob`, the arguments also carry a string of that many bytes (sorted between the planted
/// keys), so request and response are observed from their first and last bytes only.
fn sensor_output(args: &Map<String, Value>, meta: Option<Value>, blob: Option<usize>) -> String {
    let mut obs = observer();
    let t0 = Instant::now();
    let mut args = args.clone();
    if let Some(n) = blob {
        args.insert("m_blob".into(), Value::String("b".repeat(n)));
    }
    let args = &args;
    let mut params = json!({"name": "issue_refund", "arguments": args});
    if let Some(m) = meta {
        params["_meta"] = m;
    }
    let req = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":params}).to_string();
    let resp = json!({"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":
        serde_json::to_string(args).unwrap_or_default()}]}})
    .to_string();
    observe_line(&mut obs, Direction::ClientToServer, t0, &req);
    let at = t0 + Duration::from_millis(3);
    observe_line(&mut obs, Direction::ServerToClient, at, &resp);
    let (stats, events) = obs.finish(t0 + Duration::from_millis(5), EndCause::SessionEnd);
    assert_eq!(events.len(), 1);
    assert_eq!(stats.summarized, if blob.is_some() { 2 } else { 0 });
    assert_eq!(events[0].bytes.req, req.len() as u64);
    assert_eq!(events[0].bytes.resp, resp.len() as u64);
    // The reporter's own path: L3, then the batch body exactly as it is sent.
    let mut body = BatchBody::default();
    for e in events {
        body.push(&filter_event(e).expect("event passes L3"))
            .expect("event encodes");
    }
    let sensor = SensorInfo {
        version: "test".into(),
        transport: "stdio".into(),
    };
    let bytes = body.take(&sensor, 0).expect("batch encodes");
    String::from_utf8(bytes).expect("a batch is UTF-8")
}

/// Plants each canary in a call's arguments (one per key, nested or not) and the on-behalf-of
/// id in `_meta`, runs the call through the sensor (with a large argument too, given `blob`),
/// and fails if any canary that may not leave is in the output.
fn plant_and_check(
    placements: &[Placement],
    obo: &Canary,
    blob: Option<usize>,
) -> Result<(), TestCaseError> {
    let mut args = Map::new();
    let mut planted: Vec<&Placement> = Vec::new();
    for (i, p) in placements.iter().enumerate() {
        if args.contains_key(&p.key) {
            continue; // one value per key
        }
        let v = if p.nested {
            if i % 2 == 0 {
                json!({"inner": p.canary.value})
            } else {
                json!([p.canary.value])
            }
        } else {
            p.canary.value.clone()
        };
        args.insert(p.key.clone(), v);
        planted.push(p);
    }
    // The on-behalf-of id is opaque by contract; an e-mail or card there is still dropped.
    let meta = json!({"bounded/onBehalfOf": obo.value});
    let out = sensor_output(&args, Some(meta), blob);
    prop_assert!(
        !out.contains("bbbbbbbb"),
        "part of the large argument left: {out}"
    );
    for p in &planted {
        if !may_leak(p) {
            // Another planted value may legitimately carry the same needle (vanishingly
            // rare with random canaries); only fail when none may leak.
            let shared = planted
                .iter()
                .any(|q| may_leak(q) && q.canary.needle == p.canary.needle);
            prop_assert!(
                shared || !out.contains(&p.canary.needle),
                "canary {:?} under {:?} (nested: {}) leaked: {out}",
                p.canary.needle,
                p.key,
                p.nested
            );
        }
    }
    if obo.detectable {
        prop_assert!(
            !out.contains(&obo.needle),
            "onBehalfOf canary leaked: {out}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn canaries_in_arguments_never_leave_the_sensor(
        placements in prop::collection::vec(placement(), 1..8),
        obo in canary(),
    ) {
        plant_and_check(&placements, &obo, None)?;
    }

    #[test]
    fn canaries_in_hostile_events_never_pass_the_ingest_filter(
        placements in prop::collection::vec(placement(), 1..8),
        extra in canary(),
    ) {
        let mut fields = Map::new();
        for (i, p) in placements.iter().enumerate() {
            let v = if p.nested { json!({"x": p.canary.value}) } else { p.canary.value.clone() };
            fields.insert(format!("{}{}", p.key, if i == 0 { String::new() } else { i.to_string() }), v);
        }
        let event = json!({
            "v": 2, "id": "0123456789abcdef", "ts": "2026-11-29T19:00:00.000Z", "class": "action",
            "rec": {"rail": "mcp", "action": "t", "registryVersion": null, "fields": fields,
                    "arguments": {"x": extra.value}},
            "dest": {"host": "mcp://s", "pathTemplate": "/t", "method": "POST", "query": extra.value},
            "actor": {"id": "mcp:k", "kind": "agent", "grade": "attested"},
            "onBehalfOf": extra.value,
            "status": 200, "dur_ms": 1.0, "bytes": {"req": 1, "resp": 1},
            "session": {"id": "s", "client": extra.value},
            "request": {"params": {"email": extra.value}},
        });
        let out = match validate_and_filter_event(&event) {
            Ok(v) => v.to_string(),
            // Rejected outright (e.g. a number where a string belongs): nothing leaves either.
            Err(_) => String::new(),
        };
        for p in &placements {
            // The ingest has no allow-set: any non-PII scalar key may pass, so only detectable
            // canaries and PII keys and nested values are checked.
            let key_is_pii = PII.contains(&p.key.as_str());
            if p.canary.detectable || key_is_pii || p.nested {
                let shared = placements.iter().any(|q| {
                    !q.canary.detectable && !q.nested && !PII.contains(&q.key.as_str())
                        && q.canary.needle == p.canary.needle
                });
                prop_assert!(shared || !out.contains(&p.canary.needle),
                    "canary {:?} under {:?} passed the filter: {out}", p.canary.needle, p.key);
            }
        }
        if extra.detectable {
            prop_assert!(!out.contains(&extra.needle), "{out}");
        }
    }
}

proptest! {
    // Each case builds and splits two messages of over a megabyte.
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The same, with the call's request and result too large to read whole: what the
    /// observer builds from their first and last bytes obeys the same rule.
    #[test]
    fn canaries_around_a_large_argument_never_leave_the_sensor(
        placements in prop::collection::vec(placement(), 1..8),
        obo in canary(),
        blob in 1_100_000usize..1_300_000,
    ) {
        plant_and_check(&placements, &obo, Some(blob))?;
    }
}

#[test]
fn customer_email_in_every_corner_never_reaches_the_file_or_stderr() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = dir.path().join("events.jsonl");
    let server = Path::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .parent()
        .expect("target dir")
        .join("examples")
        .join("payments_server");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("BOUNDED_") {
            cmd.env_remove(&k);
        }
    }
    let mut child = cmd
        .arg("--ingest")
        .arg(format!("file:{}", sink.display()))
        .args([
            "--debug",
            "--flush-ms",
            "50",
            "--capture",
            "customer_email",
            "--capture",
            "charge_id",
        ])
        .arg("--")
        .arg(server)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let email = "leaky.canary@victim.example";
    let card = "4111 1111 1111 1111";
    let msgs = [
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18",
            "capabilities":{},"clientInfo":{"name":"canary-client","version":"1"}}}),
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"issue_refund",
            "arguments":{"amount_cents":4900,"currency":"EUR","customer_email":email,
                         "reason":format!("card {card} for {email}")},
            "_meta":{"bounded/onBehalfOf":email}}}),
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"lookup_customer",
            "arguments":{"email":email,"customer_id":email}}}),
        json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"void_charge",
            "arguments":{"charge_id":card}}}),
    ];
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_thread = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stdout.read_to_end(&mut b);
        b
    });
    let err_thread = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stderr.read_to_end(&mut b);
        b
    });
    for m in &msgs {
        stdin.write_all(format!("{m}\n").as_bytes()).expect("write");
    }
    stdin.flush().expect("flush");
    // Wait for the three answers before closing, so every call completes.
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        if std::fs::read_to_string(&sink)
            .map(|s| s.matches("\"action\":\"").count() >= 3)
            .unwrap_or(false)
        {
            break;
        }
    }
    drop(stdin);
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("wrapper did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    let stdout = out_thread.join().unwrap_or_default();
    let stderr = String::from_utf8_lossy(&err_thread.join().unwrap_or_default()).into_owned();
    let file = std::fs::read_to_string(&sink).expect("sink file");
    // The relay is untouched: the server saw and answered with the real values.
    assert!(String::from_utf8_lossy(&stdout).contains(email));
    let events: Vec<Value> = file
        .lines()
        .flat_map(|l| {
            serde_json::from_str::<Value>(l).expect("batch")["events"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(events.len(), 3, "{file}");
    let refund = events
        .iter()
        .find(|e| e["rec"]["action"] == "issue_refund")
        .expect("refund");
    assert_eq!(
        refund["rec"]["fields"],
        json!({"amount_cents": 4900, "currency": "EUR"})
    );
    assert!(refund.get("onBehalfOf").is_none());
    for needle in [email, card, "4111111111111111", "victim.example"] {
        assert!(!file.contains(needle), "{needle} in sink: {file}");
        assert!(!stderr.contains(needle), "{needle} on stderr: {stderr}");
    }
}

#[test]
fn an_opaque_value_under_an_allowed_key_is_captured_so_the_canary_checks_can_fail() {
    let mut args = Map::new();
    args.insert("reason".into(), json!("QXABCD123456"));
    args.insert("note".into(), json!("QXNOTE000001"));
    args.insert("amount_cents".into(), json!(4900));
    for blob in [None, Some(2_000_000)] {
        let out = sensor_output(&args, None, blob);
        assert!(out.contains("QXABCD123456"), "{out}");
        assert!(out.contains(r#""amount_cents":4900"#), "{out}");
        assert!(!out.contains("QXNOTE000001"), "{out}");
    }
}
