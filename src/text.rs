//! Bytes read as text, with ASCII checked in bulk before UTF-8's byte-by-byte rules.
//!
//! Owns [`utf8`], the conversion of bytes to text on a call's path (the observer's peek of each
//! message, an event's timestamp, the privacy checks' normalised keys and numbers). It answers
//! exactly as `std::str::from_utf8` would, only sooner for bytes that are all ASCII, which an
//! ordinary message is: one OR over all the bytes, which the compiler checks 16 at a time, where
//! the standard validator took ~150 instructions for a small message (`bench/README.md`). Must
//! never hand out text for bytes it has not proved valid UTF-8: anything with a byte of 0x80 or
//! more goes to the standard validator.

/// True if every byte of `b` is below 0x80. An OR of all of them, with no branch per byte, so
/// that the compiler vectorises it (16 bytes to a word by hand measured no better).
#[inline]
fn all_ascii(b: &[u8]) -> bool {
    b.iter().fold(0u8, |acc, &x| acc | x) < 0x80
}

/// `b` as text if it is UTF-8, as `std::str::from_utf8(b).ok()` answers.
#[inline]
pub fn utf8(b: &[u8]) -> Option<&str> {
    if all_ascii(b) {
        // SAFETY: every byte of `b` is below 0x80 (checked just above), so each is a whole
        // one-byte UTF-8 sequence: `b` is valid UTF-8, which is all `from_utf8_unchecked`
        // requires.
        return Some(unsafe { std::str::from_utf8_unchecked(b) });
    }
    std::str::from_utf8(b).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ascii_other_utf8_and_invalid_bytes() {
        let long_ascii = "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\"}".repeat(5);
        let cases: [&[u8]; 9] = [
            b"",
            b"a",
            long_ascii.as_bytes(),
            "caf\u{e9} \u{2713}".as_bytes(),
            b"\x7f\x00\x01",
            b"\x80",
            b"abc\xff",
            // A lone continuation byte at the end of a long ASCII run: past the first 16.
            b"0123456789abcdef0123456789abcdef\x9f",
            // A truncated two-byte sequence.
            b"\xc3",
        ];
        for b in cases {
            assert_eq!(utf8(b), std::str::from_utf8(b).ok(), "{b:?}");
        }
        assert_eq!(utf8(long_ascii.as_bytes()), Some(long_ascii.as_str()));
        assert_eq!(utf8(b"\x80"), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// Any bytes: the answer of the standard validator.
        #[test]
        fn agrees_with_the_standard_validator(b in prop::collection::vec(any::<u8>(), 0..80)) {
            prop_assert_eq!(utf8(&b), std::str::from_utf8(&b).ok());
        }

        /// Any text, mostly ASCII with the odd wider character anywhere.
        #[test]
        fn any_text_reads_as_itself(s in "[ -~]{0,60}[\u{80}-\u{10ffff}]?[ -~]{0,60}") {
            prop_assert_eq!(utf8(s.as_bytes()), Some(s.as_str()));
        }
    }
}
