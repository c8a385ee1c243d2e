//! Arbitrary `arguments` objects through the privacy layers, with canaries planted in them.
//!
//! The fuzzer chooses the structure (nesting, arrays, value types), the keys (allow-listed ones
//! in any spelling, keys it adds with `--capture`, or free text) and the values; into keys and
//! values it plants canaries the contract says must never leave (DESIGN §5): e-mail addresses,
//! Luhn-valid card numbers (13–19 digits, bare or with single spaces or dashes, also as JSON
//! numbers), JWTs and well-known secret prefixes, inside arbitrary surrounding text, sometimes
//! written with JSON `\u` escapes. The arguments travel two ways:
//!
//! * the sensor's: a real `initialize` / `tools/call` exchange through the observer (peek, L2,
//!   L4, the capture allow-set), then the sensor's L3 (`filter_event`) and the ingest's L3
//!   (`validate_and_filter_event`) on the event as sent;
//! * the ingest's: a hostile sensor puts the whole object, nested, into `rec.fields`, and
//!   canaries into `onBehalfOf` and `session`, of an otherwise valid envelope.
//!
//! Asserts: the call gives exactly one event, which both L3 functions accept and agree on; no
//! planted canary text occurs anywhere in either filtered event (checked by plain substring
//! search, independent of the crate's detectors) nor in a captured field before L3; the crate's
//! L4 detector finds every planted canary in its context and passes every captured value.

#![no_main]

use std::time::{Duration, Instant};

use arbitrary::{Result, Unstructured};
use bounded_observe_mcp::event::privacy::{
    contains_sensitive, number_is_sensitive, BUILTIN_CAPTURE,
};
use bounded_observe_mcp::event::{filter_event, validate_and_filter_event, Event};
use bounded_observe_mcp::observe::{EndCause, Observer, ObserverConfig, StreamId, Transport};
use bounded_observe_mcp::tap::Direction;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

/// Prefixes of credentials, our own list (not the crate's), as they are written in the wild.
const SECRETS: &[&str] = &[
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "whsec_",
    "ghp_",
    "github_pat_",
    "xoxb-",
    "xoxp-",
    "AKIA",
    "-----BEGIN PRIVATE KEY-----",
    "Bearer ",
    "Basic ",
];

const B64URL: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
const EMAIL_LOCAL: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789._+-";

/// Short texts that sit next to a canary in real arguments, or that try to break it up.
const FILLERS: &[&str] = &[
    "",
    " ",
    "refund for ",
    "card ",
    "-",
    ".",
    "@",
    "4",
    "0 ",
    "x",
    "\u{e9}",
    "\n",
    "mailto:",
    "eyJ",
    "..",
    " - ",
    "\u{200b}",
    "1-",
    "a.b.",
];

struct Gen<'a, 'b> {
    u: &'b mut Unstructured<'a>,
    /// Every canary planted, as it was planted.
    canaries: Vec<String>,
    /// Every canary with the text around it.
    contexts: Vec<String>,
}

fn pick(u: &mut Unstructured<'_>, alphabet: &[u8], min: usize, max: usize) -> Result<String> {
    let n = u.int_in_range(min..=max)?;
    let mut s = String::with_capacity(n);
    for _ in 0..n {
        s.push(char::from(*u.choose(alphabet)?));
    }
    Ok(s)
}

/// Luhn check digit for `body` (our own implementation).
fn luhn_check_digit(body: &[u8]) -> u8 {
    let mut sum = 0u32;
    for (i, d) in body.iter().rev().enumerate() {
        let mut v = u32::from(*d);
        if i % 2 == 0 {
            v *= 2;
            if v > 9 {
                v -= 9;
            }
        }
        sum += v;
    }
    ((10 - sum % 10) % 10) as u8
}

impl Gen<'_, '_> {
    fn card_digits(&mut self) -> Result<Vec<u8>> {
        let n = self.u.int_in_range(13..=19)?;
        let mut d = Vec::with_capacity(n);
        for _ in 0..n - 1 {
            d.push(self.u.int_in_range(0..=9)?);
        }
        d.push(luhn_check_digit(&d));
        Ok(d)
    }

    fn canary(&mut self) -> Result<String> {
        let c = match self.u.int_in_range(0..=3)? {
            0 => {
                let local = pick(self.u, EMAIL_LOCAL, 1, 10)?;
                let mut domain = pick(self.u, ALNUM, 1, 10)?;
                for _ in 0..self.u.int_in_range(1..=2)? {
                    domain.push('.');
                    domain.push_str(&pick(self.u, ALNUM, 1, 6)?);
                }
                format!("{local}@{domain}")
            }
            1 => {
                let digits = self.card_digits()?;
                let style = self.u.int_in_range(0..=3)?;
                let mut s = String::new();
                for (i, d) in digits.iter().enumerate() {
                    if i > 0 {
                        let sep = match style {
                            1 if i % 4 == 0 => Some(' '),
                            2 if i % 4 == 0 => Some('-'),
                            3 => *self.u.choose(&[None, None, Some(' '), Some('-')])?,
                            _ => None,
                        };
                        s.extend(sep);
                    }
                    s.push(char::from(b'0' + d));
                }
                s
            }
            2 => {
                // Header and payload are base64url of JSON objects (`eyJ` is `{"`); every
                // segment of a real token is at least ten characters long.
                let h = pick(self.u, B64URL, 7, 30)?;
                let p = pick(self.u, B64URL, 7, 60)?;
                let s = pick(self.u, B64URL, 10, 43)?;
                format!("eyJ{h}.eyJ{p}.{s}")
            }
            _ => {
                let prefix = *self.u.choose(SECRETS)?;
                let prefix = if self.u.arbitrary()? {
                    prefix.to_ascii_lowercase()
                } else {
                    prefix.to_string()
                };
                format!("{prefix}{}", pick(self.u, B64URL, 8, 24)?)
            }
        };
        self.canaries.push(c.clone());
        Ok(c)
    }

    fn filler(&mut self) -> Result<String> {
        if self.u.int_in_range(0..=3)? == 0 {
            let s: String = self.u.arbitrary()?;
            Ok(s.chars().take(24).collect())
        } else {
            Ok(self.u.choose(FILLERS)?.to_string())
        }
    }

    /// A text, with a canary in it more often than not.
    fn text(&mut self) -> Result<String> {
        let before = self.filler()?;
        if self.u.int_in_range(0..=3)? == 0 {
            return Ok(before);
        }
        let c = self.canary()?;
        let after = self.filler()?;
        let t = format!("{before}{c}{after}");
        self.contexts.push(t.clone());
        Ok(t)
    }

    fn key(&mut self, extra: &[String]) -> Result<String> {
        Ok(match self.u.int_in_range(0..=5)? {
            0..=2 => {
                let k = *self.u.choose(BUILTIN_CAPTURE)?;
                // The allow-set is matched on the normalised key: any spelling of it.
                match self.u.int_in_range(0..=3)? {
                    0 => k.to_string(),
                    1 => k.to_ascii_uppercase(),
                    2 => format!("{k}_"),
                    _ => format!("-{k}"),
                }
            }
            3 if !extra.is_empty() => self.u.choose(extra)?.clone(),
            _ => self.text()?,
        })
    }

    /// A value and its JSON text (`escape`: write some characters as `\u` escapes).
    fn value(&mut self, depth: usize, extra: &[String]) -> Result<(Value, String)> {
        let top = if depth >= 3 { 5 } else { 7 };
        Ok(match self.u.int_in_range(0..=top)? {
            0 | 1 => {
                let t = self.text()?;
                let raw = self.json_string(&t)?;
                (Value::String(t), raw)
            }
            2 => {
                // A card number as a JSON number: integer, or with a fraction or exponent.
                let digits: String = self
                    .card_digits()?
                    .iter()
                    .map(|d| char::from(b'0' + d))
                    .collect();
                let digits = digits.trim_start_matches('0').to_string();
                if digits.len() < 13 {
                    return Ok((Value::Bool(true), "true".into()));
                }
                self.canaries.push(digits.clone());
                self.contexts.push(digits.clone());
                let raw = match self.u.int_in_range(0..=3)? {
                    0 => format!("{digits}.0"),
                    1 => format!("{digits}e0"),
                    2 => format!("-{digits}"),
                    _ => digits,
                };
                let v: Value = serde_json::from_str(&raw).expect("a JSON number");
                (v, raw)
            }
            3 => {
                let n: i64 = self.u.arbitrary()?;
                (Value::from(n), n.to_string())
            }
            4 => {
                let f: f64 = self.u.arbitrary()?;
                match serde_json::Number::from_f64(f) {
                    Some(n) => (Value::Number(n.clone()), n.to_string()),
                    None => (Value::Null, "null".into()),
                }
            }
            5 => {
                let b: bool = self.u.arbitrary()?;
                (Value::Bool(b), b.to_string())
            }
            6 => {
                let n = self.u.int_in_range(0..=4)?;
                let mut vs = Vec::new();
                let mut raws = Vec::new();
                for _ in 0..n {
                    let (v, r) = self.value(depth + 1, extra)?;
                    vs.push(v);
                    raws.push(r);
                }
                (Value::Array(vs), format!("[{}]", raws.join(",")))
            }
            _ => self.object(depth + 1, extra, 6)?,
        })
    }

    fn object(&mut self, depth: usize, extra: &[String], max: usize) -> Result<(Value, String)> {
        let n = self.u.int_in_range(0..=max)?;
        let mut map = serde_json::Map::new();
        let mut raws = Vec::new();
        for _ in 0..n {
            let k = self.key(extra)?;
            let (v, r) = self.value(depth, extra)?;
            raws.push(format!("{}:{r}", self.json_string(&k)?));
            // Duplicate keys: the last one counts, as servers read them.
            map.insert(k, v);
        }
        Ok((Value::Object(map), format!("{{{}}}", raws.join(","))))
    }

    /// `s` as a JSON string, some of its characters (fuzzer's choice) as `\u` escapes.
    fn json_string(&mut self, s: &str) -> Result<String> {
        let escape_some: bool = self.u.arbitrary()?;
        let mask: u64 = if escape_some { self.u.arbitrary()? } else { 0 };
        let mut out = String::from("\"");
        for (i, c) in s.chars().enumerate() {
            let forced = mask & (1 << (i % 64)) != 0;
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 || forced => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
        Ok(out)
    }
}

/// No planted canary text anywhere in `text`.
fn assert_clean(what: &str, text: &str, canaries: &[String]) {
    for c in canaries {
        assert!(
            !text.contains(c.as_str()),
            "{what} leaks the canary {c:?}: {text}"
        );
    }
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let mut g = Gen {
        u,
        canaries: Vec::new(),
        contexts: Vec::new(),
    };
    // `--capture` keys: what an operator might add, canaries included.
    let mut extra = Vec::new();
    for _ in 0..g.u.int_in_range(0..=3)? {
        let k = if g.u.arbitrary()? {
            g.text()?
        } else {
            pick(g.u, ALNUM, 1, 12)?
        };
        extra.push(k);
    }
    let (args, args_raw) = g.object(0, &extra, 12)?;
    let on_behalf_of = if g.u.arbitrary()? {
        Some(g.text()?)
    } else {
        None
    };
    let client = g.text()?;
    let protocol = g.text()?;

    for c in &g.contexts {
        assert!(contains_sensitive(c), "L4 misses a planted canary in {c:?}");
    }

    // The sensor's way: a real exchange through the observer. Half the time the extra keys are
    // opted into prose (`--capture-text`), where only layers 2 and 4 stand between a canary
    // and the wire.
    let capture_text = if g.u.arbitrary()? {
        extra.clone()
    } else {
        Vec::new()
    };
    let cfg = ObserverConfig {
        transport: Transport::Stdio,
        server_name: Some("shop".into()),
        actor: "mcp:k_fuzz".into(),
        on_behalf_of: None,
        capture: extra.clone(),
        capture_text,
        call_timeout: Duration::from_secs(60),
    };
    let mut obs = Observer::new(cfg, Vec::<Event>::new());
    let t0 = Instant::now();
    let meta = match &on_behalf_of {
        Some(o) => format!(r#","_meta":{{"bounded/onBehalfOf":{}}}"#, g.json_string(o)?),
        None => String::new(),
    };
    let frames = [
        (
            Direction::ClientToServer,
            format!(
                r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":{},"capabilities":{{}},"clientInfo":{{"name":{}}}}}}}"#,
                g.json_string(&protocol)?,
                g.json_string(&client)?
            ),
        ),
        (
            Direction::ServerToClient,
            r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","serverInfo":{"name":"shop"}}}"#.to_string(),
        ),
        (
            Direction::ClientToServer,
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"issue_refund","arguments":{args_raw}{meta}}}}}"#
            ),
        ),
        (
            Direction::ServerToClient,
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}"#.to_string(),
        ),
    ];
    for (i, (dir, f)) in frames.iter().enumerate() {
        obs.on_frame(
            StreamId(0),
            *dir,
            t0 + Duration::from_millis(i as u64),
            f.as_bytes(),
        );
    }
    let (stats, events) = obs.finish(t0 + Duration::from_secs(1), EndCause::SessionEnd);
    assert_eq!(events.len(), 1, "one call, one event: {stats:?}");
    let event = events.into_iter().next().expect("one event");

    // Captured by the observer, before L3.
    if let Some(fields) = &event.rec.fields {
        for (k, v) in fields {
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            assert_clean("a captured value", &text, &g.canaries);
            assert_clean("a captured key", k, &g.canaries);
            // A number is held to the number rule (its text through the card detector only:
            // `0.27838654985369` is a fraction, which the phone detector would read as a
            // national number with a dot); a string to all of L4.
            match v {
                Value::Number(n) => {
                    assert!(!number_is_sensitive(n), "L4 passes {text:?} it flags")
                }
                _ => assert!(!contains_sensitive(&text), "L4 passes {text:?} it flags"),
            }
        }
    }

    // The sensor's L3, then the ingest's on the event as sent.
    let sent = filter_event(event.clone()).expect("the sensor's L3 accepts its own event");
    let sent_value = serde_json::to_value(&sent).expect("an event serialises");
    assert_clean("the sent event", &sent_value.to_string(), &g.canaries);
    let as_value = serde_json::to_value(&event).expect("an event serialises");
    let stored = validate_and_filter_event(&as_value).expect("the ingest's L3 accepts it");
    assert_eq!(
        stored, sent_value,
        "the sensor's and the ingest's L3 disagree"
    );
    assert_clean("the stored event", &stored.to_string(), &g.canaries);

    // The ingest's way: a hostile sensor sends the object itself as `rec.fields`.
    let mut hostile = json!({
        "v": 2,
        "id": "0123456789abcdef0123456789abcdef",
        "ts": "2026-01-02T03:04:05.678Z",
        "class": "action",
        "rec": { "rail": "mcp", "action": "issue_refund", "registryVersion": null, "fields": args },
        "dest": { "host": "mcp://shop", "pathTemplate": "/issue_refund", "method": "POST" },
        "actor": { "id": "mcp:k_fuzz", "kind": "agent", "grade": "attested" },
        "status": 200,
        "dur_ms": 1.5,
        "bytes": { "req": 10, "resp": 20 },
    });
    let stored = validate_and_filter_event(&hostile).expect("the envelope itself is valid");
    assert_clean(
        "an event stored from a hostile sensor",
        &stored.to_string(),
        &g.canaries,
    );
    // L3 is idempotent: what it stored passes it unchanged.
    assert!(validate_and_filter_event(&stored).ok().as_ref() == Some(&stored));
    // Canaries in the envelope's free texts: rejected, or stored without them.
    hostile["session"] = json!({ "id": "s1", "protocol": protocol, "client": client });
    if let Some(o) = on_behalf_of {
        hostile["onBehalfOf"] = Value::String(o);
    }
    if let Ok(stored) = validate_and_filter_event(&hostile) {
        assert_clean(
            "an event stored from a hostile sensor",
            &stored.to_string(),
            &g.canaries,
        );
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let _ = run(&mut u);
});
