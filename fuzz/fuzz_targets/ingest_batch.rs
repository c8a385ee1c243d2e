//! Arbitrary bodies through the ingest's batch parser: what `POST /v1/events` does with a body
//! after authentication and before storage (parse, batch checks, the shared L3 filter on every
//! event, stamping `org`, `sensor` and `receivedAt`).
//!
//! Asserts: no panic; a body that is not UTF-8 or not a JSON object at its top level is refused
//! whole (what is inside an event, such as a lone `\ud800` escape that a full parse refuses, is
//! that event's business: it is rejected alone); a batch taken is taken whole (every event is
//! either a row or counted as rejected) with the `dropped` it declared;
//! every row is the filtered event with the key's `org` and `sensor` stamped over whatever the
//! sensor sent, a fixed point of the filter, and no larger than the event it came from allows
//! (bounded work and storage per input byte).

#![no_main]

use bounded_observe_mcp::event::{validate_and_filter_event, MAX_BATCH_EVENTS};
use bounded_observe_mcp::fuzzing::prepare_batch;
use bounded_observe_mcp::ingest::store::KeyRecord;
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::BTreeMap;

fuzz_target!(|body: &[u8]| {
    let key = KeyRecord {
        key_id: "k_fuzzkey".into(),
        org: "acme".into(),
        name: None,
        created_at: "2026-01-01T00:00:00.000Z".into(),
        revoked_at: None,
    };
    // The top level as the ingest reads it: an object whose values stay raw text (the last of a
    // duplicated key wins, as in any JSON reader).
    let parsed: Option<BTreeMap<String, Box<RawValue>>> = std::str::from_utf8(body)
        .ok()
        .and_then(|b| serde_json::from_str(b).ok());
    let result = prepare_batch(body, &key, MAX_BATCH_EVENTS);
    let Some(batch) = parsed else {
        assert!(
            result.is_err(),
            "a body that is not a JSON object was taken"
        );
        return;
    };
    let Ok((write, rejected)) = result else {
        return;
    };
    let events: Vec<Box<RawValue>> = batch
        .get("events")
        .and_then(|e| serde_json::from_str(e.get()).ok())
        .expect("a batch taken has an events array");
    assert!(events.len() <= MAX_BATCH_EVENTS);
    assert_eq!(write.rows.len() as u64 + rejected, events.len() as u64);
    let declared = batch
        .get("dropped")
        .and_then(|d| serde_json::from_str::<u64>(d.get()).ok())
        .unwrap_or(0);
    assert_eq!(write.dropped, declared);
    assert_eq!(
        (write.org.as_str(), write.key_id.as_str()),
        ("acme", "k_fuzzkey")
    );

    let mut stored_bytes = 0usize;
    for row in &write.rows {
        stored_bytes += row.body.len();
        let Ok(Value::Object(mut m)) = serde_json::from_str::<Value>(&row.body) else {
            panic!("a stored row is not a JSON object: {}", row.body);
        };
        assert_eq!(m.remove("org"), Some(Value::String("acme".into())));
        assert_eq!(m.remove("sensor"), Some(Value::String("k_fuzzkey".into())));
        assert!(m.remove("receivedAt").is_some_and(|v| v.is_string()));
        let event = Value::Object(m);
        assert_eq!(event["id"].as_str(), Some(row.id.as_str()));
        assert!(!row.id.is_empty());
        assert_eq!(event["actor"]["id"].as_str(), Some(row.actor.as_str()));
        assert_eq!(event["rec"]["action"].as_str(), Some(row.action.as_str()));
        assert_eq!(event["class"].as_str(), Some(row.class.as_str()));
        let again = validate_and_filter_event(&event).expect("a stored event passes L3 again");
        assert_eq!(again, event, "L3 is not a fixed point");
    }
    // Numbers may be respelt (`1E0` → `1.0`); every row carries the three stamps.
    assert!(stored_bytes <= 2 * body.len() + 256 * write.rows.len());
});
