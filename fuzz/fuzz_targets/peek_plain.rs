//! Arbitrary messages through both readings of the peek (`observe/peek.rs`): serde's, and the
//! plain path's one pass (`observe/peek/plain.rs`), which must give up wherever serde has to
//! decide.
//!
//! Input: the bytes as a message when they are UTF-8 (the plain path only ever sees UTF-8 text);
//! otherwise their lossy UTF-8 reading, so that every input reaches both readings.
//!
//! Asserts: no panic; whenever the plain path reads a message, serde reads it too, into the same
//! peek; and `peek` answers as serde does.

#![no_main]

use bounded_observe_mcp::observe::peek::{both_readings, peek};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (serde, plain) = both_readings(&text);
    if let Some(p) = plain {
        assert_eq!(Ok(p), serde, "{text}");
    }
    let first = text.bytes().find(|b| !b.is_ascii_whitespace());
    if first == Some(b'{') {
        assert_eq!(peek(text.as_bytes()), serde, "{text}");
    }
});
