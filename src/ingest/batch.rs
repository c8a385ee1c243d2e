//! Reading a `POST /v1/events` body (DESIGN §4 batch) without building it as a tree.
//!
//! Goes in: the body bytes and the limits. Comes out: the batch header (`v`, `dropped`, the
//! sensor's `version` / `transport`) and each event as its raw JSON text, or why the batch is
//! refused as a whole. Counting and validation happen while deserialising: the `events` array
//! stops at the first event past the limit, unknown fields are skipped without being built, and
//! an event is only ever parsed into a `serde_json::Value` by the caller, one at a time, when its
//! text is at most [`MAX_EVENT_BYTES`]. It never builds a `Value` of the whole body: `[0,0,…]`
//! in 4 MiB was a 60+ MiB tree before the 500-event check (numbers in bench/README.md).

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// Largest event, as JSON text, that is parsed and filtered; a larger one is rejected alone and
/// counted. A real event is under 2 KiB (a dozen metadata strings of at most
/// [`crate::event::filter::MAX_TEXT_LEN`] bytes plus a few captured scalars); 64 KiB leaves room for
/// fields the filter drops, while bounding the `Value` one event becomes (about 16× its text).
pub const MAX_EVENT_BYTES: usize = 64 * 1024;

/// Largest `dropped` one batch may report. A sensor drops at most what it saw between two
/// batches; a billion is far past any real session and keeps the per-sensor sum meaningful.
pub const MAX_DROPPED_PER_BATCH: u64 = 1_000_000_000;

/// Highest batch envelope version understood (DESIGN §4).
pub const MAX_BATCH_VERSION: u64 = 2;

/// Longest sensor `version` / `transport` string recorded per sensor (longer ones are cut).
pub const MAX_SENSOR_INFO_LEN: usize = 64;

/// A batch as read: the header, and every event still as text (borrowed from the body).
#[derive(Debug)]
pub struct RawBatch<'a> {
    pub dropped: u64,
    pub sensor_version: Option<String>,
    pub sensor_transport: Option<String>,
    /// The sensor's `version` or `transport` held a value layer 4 removes (checked in full,
    /// before the cut to [`MAX_SENSOR_INFO_LEN`] could split it): both are left out
    /// (`None` above), and the caller rejects every event of the batch, as for a hit in an
    /// event's own metadata.
    pub sensor_sensitive: bool,
    /// `sensor.health`, when it is well formed (else zero: it is skipped, like any other
    /// malformed part of `sensor`).
    pub health: crate::event::health::Health,
    pub events: Vec<&'a RawValue>,
}

/// Why a batch is refused as a whole.
#[derive(Debug, PartialEq, Eq)]
pub enum BatchError {
    /// Not JSON, or not a batch; the message says which field, never its value.
    Malformed(String),
    /// More than `max` events (counting stopped at the first one past it).
    TooMany { max: usize },
}

/// Reads a batch of at most `max_events` events.
pub fn parse(body: &[u8], max_events: usize) -> Result<RawBatch<'_>, BatchError> {
    // Checked whole, first: fields that are skipped rather than read (an unknown `org`) are not
    // checked for UTF-8 by the parser, and a body with invalid UTF-8 anywhere is malformed (400),
    // as it was when the whole body became a `Value`.
    let body = std::str::from_utf8(body)
        .map_err(|e| BatchError::Malformed(format!("body is not valid UTF-8: {e}")))?;
    let mut de = serde_json::Deserializer::from_str(body);
    let mut too_many = false;
    let fields = BatchSeed {
        max_events,
        too_many: &mut too_many,
    }
    .deserialize(&mut de)
    .and_then(|f| de.end().map(|()| f));
    let fields = match fields {
        Ok(f) => f,
        Err(_) if too_many => return Err(BatchError::TooMany { max: max_events }),
        Err(e) if e.is_data() => return Err(BatchError::Malformed(e.to_string())),
        Err(e) => {
            return Err(BatchError::Malformed(format!(
                "body is not valid JSON: {e}"
            )))
        }
    };
    match fields.v {
        Some(Num::Uint(v)) if (1..=MAX_BATCH_VERSION).contains(&v) => {}
        _ => {
            return Err(BatchError::Malformed(format!(
                "batch `v` must be an integer from 1 to {MAX_BATCH_VERSION}"
            )))
        }
    }
    let dropped = match fields.dropped {
        None | Some(Num::Null) => 0,
        Some(Num::Uint(n)) if n <= MAX_DROPPED_PER_BATCH => n,
        Some(_) => {
            return Err(BatchError::Malformed(format!(
                "batch `dropped` must be an integer from 0 to {MAX_DROPPED_PER_BATCH}"
            )))
        }
    };
    let events = fields
        .events
        .ok_or_else(|| BatchError::Malformed("batch `events` must be an array".into()))?;
    Ok(RawBatch {
        dropped,
        sensor_version: fields.sensor_version,
        sensor_transport: fields.sensor_transport,
        sensor_sensitive: fields.sensor_sensitive,
        health: fields.health,
        events,
    })
}

/// The top-level fields, as seen (duplicate keys: the last one wins, as for any JSON reader).
#[derive(Default)]
struct Fields<'a> {
    v: Option<Num>,
    dropped: Option<Num>,
    sensor_version: Option<String>,
    sensor_transport: Option<String>,
    sensor_sensitive: bool,
    health: crate::event::health::Health,
    events: Option<Vec<&'a RawValue>>,
}

struct BatchSeed<'f> {
    max_events: usize,
    too_many: &'f mut bool,
}

impl<'de> DeserializeSeed<'de> for BatchSeed<'_> {
    type Value = Fields<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BatchSeed<'_> {
    type Value = Fields<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a batch object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Fields::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "v" => out.v = Some(map.next_value()?),
                "dropped" => out.dropped = Some(map.next_value()?),
                "sensor" => {
                    let s: Sensor = map.next_value()?;
                    out.sensor_sensitive = s.sensitive;
                    out.health = s.health;
                    (out.sensor_version, out.sensor_transport) = if s.sensitive {
                        (None, None)
                    } else {
                        (s.version, s.transport)
                    };
                }
                "events" => {
                    out.events = map.next_value_seed(EventsSeed {
                        max: self.max_events,
                        too_many: &mut *self.too_many,
                    })?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

/// `events`: `Some(texts)` for an array of at most `max`, `None` for anything but an array.
struct EventsSeed<'f> {
    max: usize,
    too_many: &'f mut bool,
}

impl<'de> DeserializeSeed<'de> for EventsSeed<'_> {
    type Value = Option<Vec<&'de RawValue>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for EventsSeed<'_> {
    type Value = Option<Vec<&'de RawValue>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of events")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut events = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.max));
        while let Some(ev) = seq.next_element::<&'de RawValue>()? {
            if events.len() == self.max {
                *self.too_many = true;
                return Err(de::Error::custom("too many events"));
            }
            events.push(ev);
        }
        Ok(Some(events))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_map(map).map(|_| None)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// A scalar header field: a non-negative integer, null, or something else (never built).
enum Num {
    Uint(u64),
    Null,
    Other,
}

impl<'de> de::Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Num;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Num, E> {
                Ok(Num::Uint(n))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Num, E> {
                Ok(u64::try_from(n).map_or(Num::Other, Num::Uint))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Num, E> {
                Ok(Num::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Num, E> {
                Ok(Num::Other)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Num, E> {
                Ok(Num::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Num, E> {
                Ok(Num::Null)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Num, A::Error> {
                IgnoredAny.visit_seq(seq).map(|_| Num::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Num, A::Error> {
                IgnoredAny.visit_map(map).map(|_| Num::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// `sensor`: its `version` and `transport` when they are strings (cut to
/// [`MAX_SENSOR_INFO_LEN`] characters); anything else in it, or a `sensor` that is not an
/// object, is skipped.
#[derive(Default)]
struct Sensor {
    version: Option<String>,
    transport: Option<String>,
    /// Either string held a value layer 4 removes.
    sensitive: bool,
    health: crate::event::health::Health,
}

/// Longest `sensor.health` text read: five counts and their names are under 200 bytes.
const MAX_HEALTH_TEXT: usize = 1024;

/// `sensor.health` from its text: five counts, each at most
/// [`crate::event::health::MAX_HEALTH_COUNT`]; anything else is zero (skipped).
fn health_of(raw: &RawValue) -> crate::event::health::Health {
    use crate::event::health::{Health, MAX_HEALTH_COUNT};
    if raw.get().len() > MAX_HEALTH_TEXT {
        return Health::default();
    }
    match serde_json::from_str::<Health>(raw.get()) {
        Ok(h)
            if [
                h.stdout_non_json,
                h.oversize_frames,
                h.orphan_responses,
                h.unobserved,
                h.tap_dropped_bytes,
            ]
            .iter()
            .all(|n| *n <= MAX_HEALTH_COUNT) =>
        {
            h
        }
        _ => Health::default(),
    }
}

impl<'de> de::Deserialize<'de> for Sensor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Sensor;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Sensor, A::Error> {
                let mut s = Sensor::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        "version" => {
                            let v = map.next_value::<ShortStr>()?;
                            s.sensitive |= v.sensitive;
                            s.version = v.text;
                        }
                        "transport" => {
                            let v = map.next_value::<ShortStr>()?;
                            s.sensitive |= v.sensitive;
                            s.transport = v.text;
                        }
                        "health" => {
                            let raw = map.next_value::<&'de RawValue>()?;
                            s.health = health_of(raw);
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(s)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Sensor, A::Error> {
                IgnoredAny.visit_seq(seq).map(|_| Sensor::default())
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Sensor, E> {
                Ok(Sensor::default())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Sensor, E> {
                Ok(Sensor::default())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Sensor, E> {
                Ok(Sensor::default())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Sensor, E> {
                Ok(Sensor::default())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Sensor, E> {
                Ok(Sensor::default())
            }
            fn visit_unit<E: de::Error>(self) -> Result<Sensor, E> {
                Ok(Sensor::default())
            }
        }
        d.deserialize_any(V)
    }
}

/// A string cut to [`MAX_SENSOR_INFO_LEN`] characters (`text`; `None` for any other value,
/// skipped), and whether the whole string held a value layer 4 removes.
#[derive(Default)]
struct ShortStr {
    text: Option<String>,
    sensitive: bool,
}

impl<'de> de::Deserialize<'de> for ShortStr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ShortStr;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<ShortStr, E> {
                Ok(ShortStr {
                    text: Some(s.chars().take(MAX_SENSOR_INFO_LEN).collect()),
                    sensitive: crate::event::privacy::contains_sensitive(s),
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<ShortStr, A::Error> {
                IgnoredAny.visit_seq(seq).map(|_| ShortStr::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ShortStr, A::Error> {
                IgnoredAny.visit_map(map).map(|_| ShortStr::default())
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<ShortStr, E> {
                Ok(ShortStr::default())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<ShortStr, E> {
                Ok(ShortStr::default())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<ShortStr, E> {
                Ok(ShortStr::default())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<ShortStr, E> {
                Ok(ShortStr::default())
            }
            fn visit_unit<E: de::Error>(self) -> Result<ShortStr, E> {
                Ok(ShortStr::default())
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_stops_at_the_first_event_past_the_limit() {
        // The tail is not even valid JSON: reading stopped before it.
        let body = br#"{"v":2,"events":[1,2,3,4 !!! not json"#;
        assert_eq!(parse(body, 3).unwrap_err(), BatchError::TooMany { max: 3 });
        let ok = parse(
            br#"{"events":[{},{}],"v":2,"sensor":{"version":"0.1","x":[1]}}"#,
            3,
        )
        .expect("batch");
        assert_eq!(ok.events.len(), 2);
        assert_eq!(ok.sensor_version.as_deref(), Some("0.1"));
    }

    /// Found by the `ingest_batch` fuzz target: invalid UTF-8 in a field the parser skips was
    /// taken, though the batch is malformed.
    #[test]
    fn invalid_utf8_anywhere_is_malformed() {
        let body = b"{\"v\":2,\"org\":\"e\xff\xffvil\",\"events\":[]}";
        match parse(body, 3) {
            Err(BatchError::Malformed(m)) => assert!(m.contains("UTF-8"), "{m}"),
            other => panic!("taken: {other:?}"),
        }
    }

    #[test]
    fn header_fields_are_checked() {
        for (body, what) in [
            (&br#"{"v":2,"events":{}}"#[..], "events"),
            (br#"{"v":2}"#, "events"),
            (br#"{"v":3,"events":[]}"#, "`v`"),
            (br#"{"v":"2","events":[]}"#, "`v`"),
            (br#"{"v":2,"dropped":-1,"events":[]}"#, "dropped"),
            (br#"{"v":2,"dropped":1000000001,"events":[]}"#, "dropped"),
            (
                br#"{"v":2,"dropped":18446744073709551615,"events":[]}"#,
                "dropped",
            ),
            (br#"[]"#, "batch"),
            (br#"{"v":2,"events":[]} x"#, "JSON"),
        ] {
            match parse(body, 500) {
                Err(BatchError::Malformed(m)) => assert!(m.contains(what), "{m}"),
                other => panic!("{}: {other:?}", String::from_utf8_lossy(body)),
            }
        }
        let b = parse(br#"{"v":1,"dropped":1000000000,"events":[]}"#, 500).expect("batch");
        assert_eq!(b.dropped, MAX_DROPPED_PER_BATCH);
    }
}
