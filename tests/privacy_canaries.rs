//! Canaries: private values planted in what a client sends must never reach what the sensor
//! writes out. Three angles:
//!
//! * a property test over arbitrary `tools/call` arguments (top-level and nested, under innocent,
//!   allow-listed, `--capture`d and PII-shaped keys) through the observer, the L3 filter and
//!   the batch encoding — the sensor's whole path in process;
//! * a property test over hostile events fed straight to `validate_and_filter_event` — the
//!   ingest's path, which cannot trust the sensor;
//! * the real wrapper binary around the rmcp payments fixture with a file sink and `--debug`:
//!   neither the sink file nor stderr may contain a canary;
//! * a property test over what a *server* says: canaries in tool descriptions, titles, schemas
//!   and annotations, in JSON-RPC error messages and `isError` texts, through the observer
//!   (tool definition hashes, drift events, error fingerprints), L3 and the batch encoding: none
//!   may leave, whatever the canary (the sensor only hashes that text). The same through the
//!   real wrapper and a real ingest is in `tests/evidence.rs`.
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
use bounded_observe_mcp::observe::frame::{FrameSplitter, Gap, Split, DEFAULT_FRAME_CAP};
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
    /// E-mail, card, JWT, secret with a known prefix, phone, SSN, IP address, IBAN, date of
    /// birth or passport number: removed under any key.
    detectable: bool,
}

/// The codes-only rule, restated: a string that is not at most 64 bytes of letters, digits and
/// `_ - . : /` is prose, withheld under an allowed key unless the key is in `--capture-text`
/// ([`TEXT`]). Names and street addresses are caught only this way: L4 cannot see them.
fn is_prose(v: &Value) -> bool {
    v.as_str().is_some_and(|s| {
        s.len() > 64
            || s.chars()
                .any(|c| !(c.is_alphanumeric() || "_-.:/".contains(c)))
    })
}

/// Computes check digits for an IBAN from its country and BBAN (ISO 13616).
fn iban(country: &str, bban: &str) -> String {
    let mut r = 0u32;
    for c in format!("{bban}{country}00").chars() {
        r = match c.to_digit(36) {
            Some(v) if v < 10 => (r * 10 + v) % 97,
            Some(v) => (r * 100 + v) % 97,
            None => r,
        };
    }
    format!("{country}{:02}{bban}", 98 - r)
}

fn detectable(needle: String, value: Value) -> Canary {
    Canary {
        needle,
        value,
        detectable: true,
    }
}

/// Phone numbers in US, UK, German, French and bare E.164 forms, alone or in a sentence.
fn phone() -> impl Strategy<Value = Canary> {
    (
        0u8..12,
        "[2-9][0-9]{2}",
        "[0-9]{4}",
        "[0-9]{6}",
        "[1-9][0-9]{9,12}",
        any::<bool>(),
    )
        .prop_map(|(style, a, four, six, e164, wrap)| {
            let needle = match style {
                0 => format!("+1 ({a}) 555-{four}"),
                1 => format!("({a}) 555-{four}"),
                2 => format!("{a}.555.{four}"),
                3 => format!("{a}-555-{four}"),
                4 => format!("+44 20 7946 {}", &six[..4]),
                5 => format!("020 7946 {}", &six[..4]),
                6 => format!("07700 {six}"),
                7 => format!("+49 30 {six}{}", &four[..2]),
                8 => format!("030 {six}{}", &four[..2]),
                9 => format!(
                    "+33 1 {} {} {} {}",
                    &six[..2],
                    &six[2..4],
                    &six[4..],
                    &four[..2]
                ),
                10 => format!(
                    "01.{}.{}.{}.{}",
                    &six[..2],
                    &six[2..4],
                    &six[4..],
                    &four[..2]
                ),
                _ => format!("+{e164}"),
            };
            let value = if wrap {
                json!(format!("call Jane at {needle} today"))
            } else {
                json!(needle)
            };
            detectable(needle, value)
        })
}

fn ssn() -> impl Strategy<Value = Canary> {
    (
        1u32..666,
        1u32..100,
        1u32..10000,
        prop::sample::select(vec!["-", " "]),
        any::<bool>(),
    )
        .prop_map(|(area, group, serial, sep, wrap)| {
            let needle = format!("{area:03}{sep}{group:02}{sep}{serial:04}");
            let value = if wrap {
                json!(format!("SSN {needle}"))
            } else {
                json!(needle)
            };
            detectable(needle, value)
        })
}

fn ip() -> impl Strategy<Value = Canary> {
    (
        prop::sample::select(vec![8u8, 23, 45, 81, 93, 151, 185, 203]),
        any::<[u8; 3]>(),
        any::<[u16; 3]>(),
        0u8..3,
    )
        .prop_map(|(first, rest, six, style)| {
            let needle = match style {
                0 => format!("{first}.{}.{}.{}", rest[0], rest[1], rest[2]),
                1 => format!("2a00:1450:{:x}:{:x}::{:x}", six[0], six[1], six[2]),
                _ => format!("2001:db8:{:x}:{:x}:{:x}:0:0:1", six[0], six[1], six[2]),
            };
            let value = json!(format!("from {needle}"));
            detectable(needle, value)
        })
}

/// IBANs from several countries other than Germany, compact or in groups of four.
fn iban_canary() -> impl Strategy<Value = Canary> {
    (0u8..6, "[0-9]{22}", "[A-Z]{4}", any::<bool>()).prop_map(|(c, digits, bank, grouped)| {
        let compact = match c {
            0 => iban("GB", &format!("{bank}{}", &digits[..14])),
            1 => iban("FR", &format!("{}M{}", &digits[..12], &digits[12..22])),
            2 => iban("NL", &format!("{bank}{}", &digits[..10])),
            3 => iban("BE", &digits[..12]),
            4 => iban("ES", &digits[..20]),
            _ => iban("CH", &digits[..17]),
        };
        let needle = if grouped {
            compact
                .as_bytes()
                .chunks(4)
                .map(|g| std::str::from_utf8(g).unwrap_or(""))
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            compact
        };
        detectable(needle.clone(), json!(needle))
    })
}

/// A numeric date next to a birth word, as a code (`dob:1984-03-07`) or in a sentence.
fn birth_date() -> impl Strategy<Value = Canary> {
    (1930u32..2010, 1u32..13, 1u32..29, 0u8..4, 0u8..3).prop_map(|(y, m, d, form, word)| {
        let needle = match form {
            0 => format!("{y}-{m:02}-{d:02}"),
            1 => format!("{d:02}/{m:02}/{y}"),
            2 => format!("{d:02}.{m:02}.{y}"),
            _ => format!("{m:02}/{d:02}/{y}"),
        };
        let value = match word {
            0 => format!("dob:{needle}"),
            1 => format!("born {needle}"),
            _ => format!("date of birth {needle}"),
        };
        detectable(needle, json!(value))
    })
}

/// A passport-like code next to a passport word.
fn passport() -> impl Strategy<Value = Canary> {
    (
        "[0-9]{9}",
        "[A-Z]",
        "[0-9]{2}[A-Z]{2}[0-9]{5}",
        0u8..3,
        any::<bool>(),
    )
        .prop_map(|(nine, letter, fr, form, spaced)| {
            let needle = match form {
                0 => nine,
                1 => format!("{letter}{}", &nine[..8]),
                _ => fr,
            };
            let value = if spaced {
                format!("passport no. {needle}")
            } else {
                format!("passport:{needle}")
            };
            detectable(needle, json!(value))
        })
}

/// Street addresses and person names: no pattern L4 could use, so only the codes-only rule
/// keeps them in (they are prose).
fn name_or_address() -> impl Strategy<Value = Canary> {
    ("[A-Z][a-z]{3,8}", "[A-Z][a-z]{4,9}", 1u32..300, 0u8..4).prop_map(|(first, last, n, form)| {
        let needle = match form {
            0 => format!("{first} {last}"),
            1 => format!("{n} {last} Street"),
            2 => format!("{last}str. {n}, 10115 Berlin"),
            _ => format!("{n} rue {last}"),
        };
        let value = if form == 0 {
            json!(format!("call {needle} back"))
        } else {
            json!(format!("ship to {needle}"))
        };
        Canary {
            needle,
            value,
            detectable: false,
        }
    })
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
    prop_oneof![
        email,
        card,
        jwt,
        marked,
        bare,
        phone(),
        ssn(),
        ip(),
        iban_canary(),
        birth_date(),
        passport(),
        name_or_address(),
    ]
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
/// `--capture-text` keys: prose may leave under these (and only these) allowed keys; the other
/// allowed keys are captured as codes only.
const TEXT: &[&str] = &["reason", "sku"];

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
    !p.nested
        && !p.canary.detectable
        && ALLOWED.contains(&p.key.as_str())
        && (!is_prose(&p.canary.value) || TEXT.contains(&p.key.as_str()))
}

fn observer() -> Observer<Vec<Event>> {
    Observer::new(
        ObserverConfig {
            transport: Transport::Stdio,
            server_name: None,
            actor: "mcp:k".into(),
            on_behalf_of: None,
            capture: CAPTURE.iter().map(|s| s.to_string()).collect(),
            capture_text: TEXT.iter().map(|s| s.to_string()).collect(),
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
        split.push(piece, Gap::None, 0, |s| match s {
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
        health: None,
    };
    let bytes = body.take(&sensor, 0).expect("batch encodes");
    String::from_utf8(bytes.to_vec()).expect("a batch is UTF-8")
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

/// One session of a server whose catalog and failures carry `canaries` (as text, in sentences)
/// through observer → L3 → batch: the bytes the sensor would send.
fn server_text_output(canaries: &[Canary]) -> String {
    let text = |i: usize| format!("Contact {} now", canaries[i % canaries.len()].needle);
    let mut obs = observer();
    let t0 = Instant::now();
    let mut ms = 0u64;
    let mut line = |obs: &mut Observer<Vec<Event>>, dir: Direction, msg: Value| {
        ms += 1;
        observe_line(obs, dir, t0 + Duration::from_millis(ms), &msg.to_string());
    };
    let refund = |desc: String| {
        json!({"name": "issue_refund", "title": text(1), "description": desc,
            "inputSchema": {"type": "object", "properties": {"reason": {"type": "string",
                "description": text(2), "default": text(3), "enum": [text(4)]}}},
            "outputSchema": {"type": "object", "description": text(5)},
            "annotations": {"title": text(6), "destructiveHint": true}})
    };
    let (c2s, s2c) = (Direction::ClientToServer, Direction::ServerToClient);
    let list = json!({"jsonrpc":"2.0","id":1,"method":"tools/list"});
    line(&mut obs, c2s, list);
    line(
        &mut obs,
        s2c,
        json!({"jsonrpc":"2.0","id":1,"result":{"tools":[refund(text(0))]}}),
    );
    let call = |id: u64, tool: &str| json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":{}}});
    line(&mut obs, c2s, call(2, "issue_refund"));
    line(
        &mut obs,
        s2c,
        json!({"jsonrpc":"2.0","id":2,"result":{"isError":true,
        "content":[{"type":"text","text":text(7)},{"type":"text","text":text(8)}]}}),
    );
    line(&mut obs, c2s, call(3, "issue_refund"));
    line(
        &mut obs,
        s2c,
        json!({"jsonrpc":"2.0","id":3,"error":{"code":-32000,"message":text(9),
        "data":{"detail":text(10)}}}),
    );
    line(
        &mut obs,
        s2c,
        json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}),
    );
    line(
        &mut obs,
        c2s,
        json!({"jsonrpc":"2.0","id":4,"method":"tools/list"}),
    );
    line(
        &mut obs,
        s2c,
        json!({"jsonrpc":"2.0","id":4,"result":{"tools":[refund(format!("{} (v2)", text(11))),
        {"name":"void","description":text(12),"inputSchema":{"type":"object"}}]}}),
    );
    line(&mut obs, c2s, call(5, "ghost"));
    line(
        &mut obs,
        s2c,
        json!({"jsonrpc":"2.0","id":5,"result":{"isError":true,
        "content":[{"type":"text","text":text(13)}]}}),
    );
    let (_, events) = obs.finish(t0 + Duration::from_secs(1), EndCause::SessionEnd);
    use bounded_observe_mcp::event::EventClass;
    let count = |c: EventClass| events.iter().filter(|e| e.class == c).count();
    assert_eq!(
        (count(EventClass::Error), count(EventClass::Drift)),
        (3, 2),
        "three failed calls; `issue_refund` changed, `void` added"
    );
    let mut body = BatchBody::default();
    for e in events {
        body.push(&filter_event(e).expect("event passes L3"))
            .expect("encodes");
    }
    let sensor = SensorInfo {
        version: "test".into(),
        transport: "stdio".into(),
        health: Some(Default::default()),
    };
    String::from_utf8(body.take(&sensor, 0).expect("batch encodes").to_vec()).expect("UTF-8")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn canaries_in_descriptions_and_error_texts_never_leave_the_sensor(
        canaries in prop::collection::vec(canary(), 1..6),
    ) {
        let out = server_text_output(&canaries);
        prop_assert!(out.contains("\"toolDef\""), "the evidence is there: {}", out);
        prop_assert!(out.contains("\"fp\""), "{}", out);
        for c in &canaries {
            prop_assert!(!out.contains(&c.needle), "canary {:?} left: {}", c.needle, out);
        }
        prop_assert!(!out.contains("Contact"), "{}", out);
    }

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

/// Every string of an event the ingest stores, besides `rec.fields`, as a path into the event.
const METADATA: &[&[&str]] = &[
    &["rec", "action"],
    &["dest", "host"],
    &["dest", "pathTemplate"],
    &["actor", "id"],
    &["onBehalfOf"],
    &["session", "id"],
    &["session", "client"],
    &["session", "protocol"],
];

/// A well-formed event, with `value` planted at `path`.
fn event_with(path: &[&str], value: &str) -> Value {
    let mut e = json!({
        "v": 2, "id": "0123456789abcdef", "ts": "2026-11-29T19:00:00.000Z", "class": "action",
        "rec": {"rail": "mcp", "action": "t", "registryVersion": null},
        "dest": {"host": "mcp://s", "pathTemplate": "/t", "method": "POST"},
        "actor": {"id": "mcp:k", "kind": "agent", "grade": "attested"},
        "status": 200, "dur_ms": 1.0, "bytes": {"req": 1, "resp": 1},
        "session": {"id": "s", "client": "c", "protocol": "2025-06-18"},
    });
    let mut slot = &mut e;
    for k in path {
        slot = &mut slot[*k];
    }
    *slot = if path == ["dest", "pathTemplate"] {
        json!(format!("/{value}"))
    } else {
        json!(value)
    };
    e
}

fn observer_without_text() -> Observer<Vec<Event>> {
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The ingest's re-filter runs L4 on every stored string: a detectable canary in any of
    /// them gets the whole event rejected, by the value filter and the sensor's typed one.
    #[test]
    fn canaries_in_any_metadata_string_reject_the_event(c in canary(), i in 0..METADATA.len()) {
        prop_assume!(c.detectable);
        let text = match &c.value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let event = event_with(METADATA[i], &text);
        prop_assert!(validate_and_filter_event(&event).is_err(), "{event}");
        let typed: Event = serde_json::from_value(event).expect("an event");
        prop_assert!(filter_event(typed).is_err());
    }

    /// Without `--capture-text`, no captured string holds whitespace, whatever the client sends
    /// under allowed keys.
    #[test]
    fn no_string_captured_without_capture_text_holds_whitespace(
        values in prop::collection::vec("(\\PC|[ \t\u{a0}\u{3000}]|[a-z0-9_.:/-]{1,6}){0,12}", 1..6),
    ) {
        let mut obs = observer_without_text();
        let t0 = Instant::now();
        let args: Map<String, Value> = ALLOWED
            .iter()
            .zip(&values)
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let req = json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
            "params":{"name":"issue_refund","arguments":args}}).to_string();
        observe_line(&mut obs, Direction::ClientToServer, t0, &req);
        observe_line(&mut obs, Direction::ServerToClient, t0,
            &json!({"jsonrpc":"2.0","id":1,"result":{}}).to_string());
        let (_, events) = obs.finish(t0 + Duration::from_millis(5), EndCause::SessionEnd);
        for e in events {
            for v in e.rec.fields.iter().flat_map(|f| f.values()) {
                if let Value::String(s) = v {
                    prop_assert!(!s.chars().any(char::is_whitespace), "{s:?} was captured");
                }
            }
        }
    }
}

#[test]
fn codes_amounts_and_plain_dates_in_metadata_strings_are_kept() {
    for path in METADATA {
        for ok in [
            "ord_12345678",
            "2026-11-29",
            "EUR",
            "requested_by_customer",
            "1764528000",
        ] {
            let event = event_with(path, ok);
            assert!(
                validate_and_filter_event(&event).is_ok(),
                "{ok} in {path:?} was rejected"
            );
        }
    }
}

#[test]
fn codes_and_amounts_under_allowed_keys_are_captured() {
    let mut args = Map::new();
    args.insert("reason".into(), json!("requested_by_customer"));
    args.insert("currency".into(), json!("EUR"));
    args.insert("status".into(), json!("2026-11-29"));
    args.insert("sku".into(), json!("ord_12345678"));
    args.insert("amount".into(), json!(1234567.89));
    args.insert("amountCents".into(), json!(123456789012u64));
    let out = sensor_output(&args, None, None);
    for want in [
        r#""reason":"requested_by_customer""#,
        r#""currency":"EUR""#,
        r#""status":"2026-11-29""#,
        r#""sku":"ord_12345678""#,
        r#""amount":1234567.89"#,
        r#""amountCents":123456789012"#,
    ] {
        assert!(out.contains(want), "{want} missing: {out}");
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
    // The client's name is in every event's session block, which the writer copies from the
    // bytes it wrote for the event before; the `tools/list` between the calls changes that
    // block (its catalog) mid-session.
    let msgs = [
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18",
            "capabilities":{},"clientInfo":{"name":format!("assistant of {email}"),"version":"1"}}}),
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"issue_refund",
            "arguments":{"amount_cents":4900,"currency":"EUR","customer_email":email,
                         "reason":format!("card {card} for {email}")},
            "_meta":{"bounded/onBehalfOf":email}}}),
        json!({"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}}),
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
    let session = &events[0]["session"]["id"];
    assert!(session.is_string(), "{file}");
    assert!(
        events.iter().all(|e| &e["session"]["id"] == session),
        "{file}"
    );
    // A client name that holds a private value is left out, not sent scrubbed.
    assert!(
        events.iter().all(|e| e["session"].get("client").is_none()),
        "{file}"
    );
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The evidence fields hold hashes, flags, counts and enums: a canary put in any of them by
    /// a hostile sensor is refused, never stored.
    #[test]
    fn canaries_in_evidence_fields_never_pass_the_ingest_filter(c in canary(), at in 0usize..8) {
        let mut event = json!({
            "v": 2, "id": "0123456789abcdef", "ts": "2026-11-29T19:00:00.000Z", "class": "error",
            "rec": {"rail": "mcp", "action": "t", "registryVersion": null},
            "dest": {"host": "mcp://s", "pathTemplate": "/t", "method": "POST"},
            "actor": {"id": "mcp:k", "kind": "agent", "grade": "attested"},
            "status": 500, "dur_ms": 1.0, "bytes": {"req": 1, "resp": 1},
            "session": {"id": "s", "catalog": {"tools": 1, "bytes": 10}},
            "err": {"kind": "tool"},
        });
        let v = c.value.clone();
        match at {
            0 => event["rec"]["toolDef"] = v,
            1 => event["rec"]["prevToolDef"] = v,
            2 => event["rec"]["hints"] = json!([v]),
            3 => event["rec"]["listed"] = v,
            4 => { event["class"] = json!("drift"); event["rec"]["change"] = v; event.as_object_mut().map(|m| m.remove("err")); }
            5 => event["err"]["fp"] = v,
            6 => event["session"]["catalog"]["tools"] = v,
            _ => event["session"]["catalog"]["bytes"] = v,
        }
        if let Ok(out) = validate_and_filter_event(&event) {
            prop_assert!(!out.to_string().contains(&c.needle), "{:?} passed at {}: {}", c.needle, at, out);
        }
    }
}
