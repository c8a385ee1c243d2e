//! Error fingerprints (`err.fp`): which failures are the same incident, without their text.
//!
//! Goes in: the tool, the error's kind and code, and the error text (a JSON-RPC
//! `error.message`, or the first text content of an `isError` result). Comes out: 16 hex digits
//! of SHA-256 over the tool, kind, code and the text's *shape*: the text cut at
//! [`MAX_SHAPE_INPUT`] bytes, with every quoted string, URL, e-mail address, UUID, hex run of 8
//! or more and number replaced by a placeholder, so that two failures differing only in an id,
//! an amount or a path share a fingerprint. The text and its shape live only for the call to
//! [`error_fp`]; neither is ever kept, logged or sent.

use crate::event::ErrKind;

/// Bytes of the error text that are shaped; the rest is ignored (messages that differ only past
/// it are one incident).
pub const MAX_SHAPE_INPUT: usize = 256;

/// The fingerprint of one error.
pub fn error_fp(tool: &str, kind: ErrKind, code: Option<i64>, text: &str) -> String {
    let kind = match kind {
        ErrKind::Jsonrpc => "jsonrpc",
        ErrKind::Tool => "tool",
        ErrKind::Timeout => "timeout",
        ErrKind::Cancelled => "cancelled",
        ErrKind::Transport => "transport",
    };
    let code = code.map(|c| c.to_string()).unwrap_or_default();
    let shaped = shape(text);
    clear_digest(&[
        tool.as_bytes(),
        kind.as_bytes(),
        code.as_bytes(),
        shaped.as_bytes(),
    ])
}

/// 16 hex digits of SHA-256 over `parts` (each length-prefixed, so no two different lists hash
/// the same input) that L4 does not read as a card number or an IBAN: a digest whose hex
/// happens to be such a digit run (about one in 20,000) is rehashed with a counter, the same
/// way on every sensor, so equal inputs still give equal hashes and the L3 filter, which
/// rejects such a hash, never loses the event.
pub(crate) fn clear_digest(parts: &[&[u8]]) -> String {
    let mut round = 0u32;
    loop {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        for part in parts {
            ctx.update(&(part.len() as u64).to_le_bytes());
            ctx.update(part);
        }
        if round > 0 {
            ctx.update(&round.to_le_bytes());
        }
        let hex = crate::event::hex_lower(&ctx.finish().as_ref()[..8]);
        if !crate::event::privacy::contains_sensitive(&hex) || round >= 64 {
            return hex;
        }
        round += 1;
    }
}

/// The shape of an error text (see the module docs).
pub fn shape(text: &str) -> String {
    let mut end = text.len().min(MAX_SHAPE_INPUT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let text = &text[..end];
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if matches!(c, '"' | '\'' | '`') {
            // A quoted string, when it is closed; an apostrophe in a word is not a quote.
            let opens = c != '\'' || word.is_empty();
            if let Some(close) = text[i + c.len_utf8()..].find(c).filter(|_| opens) {
                flush_word(&mut word, &mut out);
                out.push_str("<str>");
                let stop = i + c.len_utf8() + close;
                while chars.peek().is_some_and(|(j, _)| *j <= stop) {
                    chars.next();
                }
                continue;
            }
        }
        if c.is_whitespace() || matches!(c, '(' | ')' | '[' | ']' | '{' | '}' | ',' | ';') {
            flush_word(&mut word, &mut out);
            out.push(c);
        } else {
            word.push(c);
        }
    }
    flush_word(&mut word, &mut out);
    out
}

/// Shapes one whitespace-delimited word into `out`.
fn flush_word(word: &mut String, out: &mut String) {
    if word.is_empty() {
        return;
    }
    let trimmed = word.trim_end_matches(['.', ':', '!', '?']);
    let suffix = &word[trimmed.len()..];
    if trimmed.contains("://") {
        out.push_str("<url>");
        out.push_str(suffix);
    } else if is_email(trimmed) {
        out.push_str("<email>");
        out.push_str(suffix);
    } else {
        shape_tokens(word, out);
    }
    word.clear();
}

fn is_email(w: &str) -> bool {
    match w.split_once('@') {
        Some((local, domain)) => !local.is_empty() && domain.contains('.') && !domain.contains('@'),
        None => false,
    }
}

/// UUIDs, hex runs of 8 or more (with a digit: an English word is not an id) and numbers in
/// one word.
fn shape_tokens(w: &str, out: &mut String) {
    let b = w.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let at_run_start = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        if at_run_start && is_uuid_at(b, i) {
            out.push_str("<uuid>");
            i += 36;
            continue;
        }
        if at_run_start && b[i].is_ascii_alphanumeric() {
            let run = b[i..]
                .iter()
                .take_while(|x| x.is_ascii_alphanumeric())
                .count();
            let r = &b[i..i + run];
            if run >= 8 && r.iter().all(u8::is_ascii_hexdigit) && r.iter().any(u8::is_ascii_digit) {
                out.push_str("<hex>");
                i += run;
                continue;
            }
        }
        if b[i].is_ascii_digit() {
            let mut j = i;
            while j < b.len()
                && (b[j].is_ascii_digit()
                    || (b[j] == b'.' && j + 1 < b.len() && b[j + 1].is_ascii_digit()))
            {
                j += 1;
            }
            out.push_str("<n>");
            i = j;
            continue;
        }
        // Not ASCII, or a byte of no token: copied as it is, whole characters at a time.
        let len = utf8_len(b[i]);
        out.push_str(&w[i..(i + len).min(w.len())]);
        i += len;
    }
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xf0..=0xff => 4,
        0xe0..=0xef => 3,
        0xc0..=0xdf => 2,
        _ => 1,
    }
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` at `i`, not followed by more of a word.
fn is_uuid_at(b: &[u8], i: usize) -> bool {
    let Some(s) = b.get(i..i + 36) else {
        return false;
    };
    let shape_ok = s.iter().enumerate().all(|(k, c)| match k {
        8 | 13 | 18 | 23 => *c == b'-',
        _ => c.is_ascii_hexdigit(),
    });
    shape_ok && b.get(i + 36).is_none_or(|c| !c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_numbers_and_quoted_values_become_placeholders() {
        let cases = [
            ("Order 12345 not found", "Order <n> not found"),
            (
                "user 'jane.doe' (jane@example.com) missing",
                "user <str> (<email>) missing",
            ),
            (
                "fetch https://api.example.com/v1/x?id=9 failed: 503",
                "fetch <url> failed: <n>",
            ),
            (
                "request 0b9f2c4e-1d2a-4c3b-9e8f-0123456789ab timed out after 3.5s",
                "request <uuid> timed out after <n>s",
            ),
            (
                "hash deadbeef0042 bad; word defaced stays",
                "hash <hex> bad; word defaced stays",
            ),
            ("key \"sk_live_abc\" rejected", "key <str> rejected"),
            ("user42 can't", "user<n> can't"),
        ];
        for (text, want) in cases {
            assert_eq!(shape(text), want, "{text}");
        }
    }

    #[test]
    fn errors_that_differ_only_in_ids_share_a_fingerprint() {
        let a = error_fp(
            "refund",
            ErrKind::Tool,
            None,
            "Payment pi_3NXa1 for order 1001 failed",
        );
        let b = error_fp(
            "refund",
            ErrKind::Tool,
            None,
            "Payment pi_3NXa2 for order 2002 failed",
        );
        assert_eq!(a, b);
        assert_eq!(a.len(), 16);
        let other = error_fp("refund", ErrKind::Tool, None, "Card declined");
        assert_ne!(a, other);
        assert_ne!(
            a,
            error_fp(
                "void",
                ErrKind::Tool,
                None,
                "Payment pi_3NXa1 for order 1001 failed"
            )
        );
        assert_ne!(
            error_fp("t", ErrKind::Jsonrpc, Some(-32602), "x"),
            error_fp("t", ErrKind::Jsonrpc, Some(-32603), "x")
        );
    }

    /// Some inputs hash to hex that L4 reads as a card number (all digits, Luhn-valid): those
    /// are rehashed, the same way each time, and others are left as they are.
    #[test]
    fn a_digest_that_spells_a_card_number_is_rehashed() {
        let raw = |input: &str| {
            let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
            ctx.update(&(input.len() as u64).to_le_bytes());
            ctx.update(input.as_bytes());
            crate::event::hex_lower(&ctx.finish().as_ref()[..8])
        };
        let sensitive = crate::event::privacy::contains_sensitive;
        let hit = (0u32..2_000_000)
            .map(|i| format!("tool-{i}"))
            .find(|s| sensitive(&raw(s)))
            .expect("an input whose digest reads as a card number");
        let fixed = clear_digest(&[hit.as_bytes()]);
        assert!(!sensitive(&fixed), "{fixed}");
        assert_ne!(fixed, raw(&hit));
        assert_eq!(fixed, clear_digest(&[hit.as_bytes()]), "deterministic");
        assert_eq!(
            clear_digest(&[b"plain"]),
            raw("plain"),
            "others are unchanged"
        );
    }

    #[test]
    fn only_the_first_bytes_count_and_any_text_is_safe() {
        let long = "x".repeat(300);
        let longer = format!("{long} and then something else entirely");
        assert_eq!(shape(&long), shape(&longer));
        // Cut inside a multi-byte character, unclosed quotes, lone separators: no panic.
        for t in [
            "é".repeat(200),
            "\"open".into(),
            "'".into(),
            "a@b".into(),
            "9.".into(),
        ] {
            let _ = error_fp("t", ErrKind::Tool, None, &t);
        }
    }
}
