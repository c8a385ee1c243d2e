//! Summaries of messages too large to hold whole: a small JSON document built from a large
//! message's first and last bytes, which the ordinary peek then reads.
//!
//! Owns the two structural scans (forward over the head, backward over the tail) and the join.
//! A tool result of several megabytes is almost all one or two huge values (a text block, a
//! base64 image); what the observer needs (`id`, `error`, `result.isError`,
//! `result.resultType`, `method`, `params.name`, `params._meta`, small arguments) sits before or
//! after them, in the first or last few kilobytes, whichever order the serializer chose (rmcp
//! and Python's SDK write `id` first, the TypeScript SDK writes it last). Scanning only those
//! bytes keeps the cost of observing a 50 MB message close to that of a small one.
//!
//! Only structure is joined ([`skeleton`]): every value in the skeleton is a byte-exact copy from
//! the message, and everything captured from it still goes through the privacy layers. Must
//! never allocate more than head + tail, and never panic on any input (fuzzed by proptest below).

/// One open container at the cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Level {
    /// `b'{'` or `b'['`.
    kind: u8,
    /// Head: where to cut (after the last complete member, or just after the opening bracket).
    /// Tail: where to start (at the first complete member, or at the closing bracket).
    cut: usize,
    /// A complete member lies between the cut and the bracket.
    members: bool,
}

/// `b'{'` for `b'}'`, `b'['` for `b']'`.
fn opener(close: u8) -> u8 {
    if close == b'}' {
        b'{'
    } else {
        b'['
    }
}

/// The index of the quote closing a string whose content starts at `from`, or `None` if the
/// string runs past the end of `s`.
fn string_end(s: &[u8], mut from: usize) -> Option<usize> {
    loop {
        let i = from + memchr::memchr2(b'"', b'\\', s.get(from..)?)?;
        if s[i] == b'"' {
            return Some(i);
        }
        // An escape: the next byte is escaped, whatever it is.
        from = i + 2;
    }
}

/// The index of the quote opening the string whose closing quote is at `close`: the nearest
/// quote before it preceded by an even run of backslashes. `None` if the string starts before
/// `s` does, or a run of backslashes reaches the start of `s` (its parity is then unknown).
fn string_start(s: &[u8], close: usize) -> Option<usize> {
    let mut end = close;
    loop {
        let q = memchr::memrchr(b'"', &s[..end])?;
        let run = s[..q].iter().rev().take_while(|&&b| b == b'\\').count();
        if run == q {
            return None;
        }
        if run % 2 == 0 {
            return Some(q);
        }
        end = q;
    }
}

/// Scans `head` (the start of a message) and returns its open containers at the end, outermost
/// first. `None` if it is not the start of a JSON container, or closes completely.
fn scan_head(head: &[u8]) -> Option<Vec<Level>> {
    let mut stack: Vec<Level> = Vec::new();
    let mut i = 0;
    while i < head.len() {
        match head[i] {
            b'"' => match string_end(head, i + 1) {
                Some(end) => i = end,
                None => break,
            },
            b @ (b'{' | b'[') => stack.push(Level {
                kind: b,
                cut: i + 1,
                members: false,
            }),
            b @ (b'}' | b']') => {
                let l = stack.pop()?;
                if l.kind != opener(b) || stack.is_empty() {
                    return None;
                }
            }
            b',' => {
                let l = stack.last_mut()?;
                l.cut = i;
                l.members = true;
            }
            b if b.is_ascii_whitespace() => {}
            _ if stack.is_empty() => return None,
            _ => {}
        }
        i += 1;
    }
    (!stack.is_empty()).then_some(stack)
}

/// Scans `tail` (the end of a message) backwards and returns the containers open at its start,
/// outermost first. `None` if it is not the end of a JSON container, or opens completely.
fn scan_tail(tail: &[u8]) -> Option<Vec<Level>> {
    let mut stack: Vec<Level> = Vec::new();
    let mut i = tail.len();
    while i > 0 {
        i -= 1;
        match tail[i] {
            b'"' => match string_start(tail, i) {
                Some(start) => i = start,
                None => break,
            },
            b @ (b'}' | b']') => stack.push(Level {
                kind: opener(b),
                cut: i,
                members: false,
            }),
            b @ (b'{' | b'[') => {
                let l = stack.pop()?;
                if l.kind != b || stack.is_empty() {
                    return None;
                }
            }
            b',' => {
                let l = stack.last_mut()?;
                l.cut = i + 1;
                l.members = true;
            }
            b if b.is_ascii_whitespace() => {}
            _ if stack.is_empty() => return None,
            _ => {}
        }
    }
    (!stack.is_empty()).then_some(stack)
}

/// A skeleton of the message that starts with `head` and ends with `tail` (the bytes between
/// them unknown): valid JSON when both are pieces of one valid JSON object or array, holding
/// the complete members found in either. `None` when no join is possible (not JSON, a top-level
/// scalar, or containers of different kinds already at the top).
///
/// The head is cut after its last complete member at each nesting level, the tail is cut before
/// its first complete member at each level, and the two are joined at the deepest level where
/// the open containers on both sides have the same kinds (object or array). That assumes the
/// open containers at the cut are the same ones on both sides, which holds unless a second large
/// value starts inside the skipped middle; then a member of that value's container can appear as
/// a member of the head's container. A JSON array at the top (a batch) is joined only at the
/// top, so whole elements are never mixed.
pub fn skeleton(head: &[u8], tail: &[u8]) -> Option<Vec<u8>> {
    let h = scan_head(head)?;
    let t = scan_tail(tail)?;
    let depth = if h[0].kind == b'[' {
        1
    } else {
        h.len().min(t.len())
    };
    let shared = h
        .iter()
        .zip(&t)
        .take(depth)
        .take_while(|(a, b)| a.kind == b.kind)
        .count();
    let level = shared.checked_sub(1)?;
    let (hl, tl) = (h[level], t[level]);
    let mut out = Vec::with_capacity(hl.cut + 1 + tail.len() - tl.cut);
    out.extend_from_slice(&head[..hl.cut]);
    if hl.members && tl.members {
        out.push(b',');
    }
    out.extend_from_slice(&tail[tl.cut..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    /// The skeleton of `doc` cut into a head of `h` bytes and a tail of `t` bytes.
    fn sk(doc: &str, h: usize, t: usize) -> Option<Value> {
        let b = doc.as_bytes();
        let s = skeleton(&b[..h], &b[b.len() - t..])?;
        Some(serde_json::from_slice(&s).expect("skeleton is JSON"))
    }

    #[test]
    fn rmcp_order_keeps_id_and_is_error() {
        let big = "x".repeat(10_000);
        let doc = format!(
            r#"{{"jsonrpc":"2.0","id":7,"result":{{"content":[{{"type":"text","text":"{big}"}}],"isError":true}}}}"#
        );
        let v = sk(&doc, 200, 200).expect("joined");
        assert_eq!(v["id"], 7);
        assert_eq!(v["result"]["isError"], true);
        assert_eq!(v["result"]["content"][0]["type"], "text");
        assert!(v.to_string().len() < 200);
    }

    #[test]
    fn typescript_order_finds_id_at_the_end() {
        let big = "y".repeat(10_000);
        let doc = format!(
            r#"{{"result":{{"content":[{{"type":"text","text":"{big}"}}]}},"jsonrpc":"2.0","id":"req-9"}}"#
        );
        let v = sk(&doc, 100, 100).expect("joined");
        assert_eq!(v["id"], "req-9");
        assert_eq!(v["jsonrpc"], "2.0");
        assert!(v["result"].is_object());
    }

    #[test]
    fn large_request_keeps_method_name_and_small_arguments() {
        let big = "z".repeat(50_000);
        let doc = format!(
            r#"{{"method":"tools/call","params":{{"name":"upload","arguments":{{"amount_cents":4900,"blob":"{big}","currency":"EUR"}},"_meta":{{"bounded/onBehalfOf":"u-1"}}}},"jsonrpc":"2.0","id":3}}"#
        );
        let v = sk(&doc, 300, 300).expect("joined");
        assert_eq!(v["method"], "tools/call");
        assert_eq!(v["params"]["name"], "upload");
        assert_eq!(v["params"]["arguments"]["amount_cents"], 4900);
        assert_eq!(v["params"]["arguments"]["currency"], "EUR");
        assert!(v["params"]["arguments"].get("blob").is_none());
        assert_eq!(v["params"]["_meta"]["bounded/onBehalfOf"], "u-1");
        assert_eq!(v["id"], 3);
    }

    #[test]
    fn escaped_quotes_and_backslashes_do_not_confuse_either_scan() {
        let big = r#"a\"b\\"#.repeat(3_000);
        let doc = format!(r#"{{"id":1,"result":{{"text":"{big}","isError":false}}}}"#);
        serde_json::from_str::<Value>(&doc).expect("test doc is JSON");
        for cut in [20, 21, 22, 23, 24, 25, 26] {
            let v = sk(&doc, cut, cut).expect("joined");
            assert_eq!(v["id"], 1);
            assert_eq!(v["result"]["isError"], false);
        }
    }

    #[test]
    fn batches_join_only_whole_elements() {
        let big = "q".repeat(5_000);
        let doc = format!(
            r#"[{{"jsonrpc":"2.0","id":1,"result":{{}}}},{{"id":2,"result":{{"t":"{big}"}}}},{{"jsonrpc":"2.0","id":3,"result":{{}}}}]"#
        );
        let v = sk(&doc, 80, 80).expect("joined");
        let ids: Vec<_> = v
            .as_array()
            .expect("array")
            .iter()
            .map(|e| e["id"].clone())
            .collect();
        assert_eq!(ids, vec![json!(1), json!(3)]);
    }

    #[test]
    fn not_json_or_mismatched_gives_none() {
        assert_eq!(skeleton(b"hello world", b"and more"), None);
        assert_eq!(skeleton(b"{\"a\":\"xx", b"xx\"]"), None);
        assert_eq!(skeleton(b"", b""), None);
        assert_eq!(
            skeleton(b"{\"a\":1}", b"{\"a\":1}"),
            None,
            "complete in the head"
        );
    }

    /// A JSON value with one huge string somewhere, plus small scalars around it.
    fn doc_strategy() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<i64>().prop_map(Value::from),
            any::<bool>().prop_map(Value::from),
            "[a-z\"\\\\{}\\[\\],:]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 40, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{1,6}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Any cut of any JSON text gives either nothing or valid JSON whose every scalar is
        /// present somewhere in the original document's text.
        #[test]
        fn any_cut_yields_valid_json_or_none(
            v in doc_strategy(),
            h in 0usize..400,
            t in 0usize..400,
        ) {
            let text = serde_json::to_string(&v).expect("serialise");
            let b = text.as_bytes();
            let h = h.min(b.len());
            let t = t.min(b.len() - h);
            if let Some(s) = skeleton(&b[..h], &b[b.len() - t..]) {
                let parsed: Value = serde_json::from_slice(&s).expect("skeleton must be JSON");
                prop_assert_eq!(parsed.is_array(), v.is_array());
                prop_assert!(s.len() <= h + t + 1);
            }
        }

        /// Arbitrary bytes never panic.
        #[test]
        fn arbitrary_bytes_never_panic(
            head in prop::collection::vec(any::<u8>(), 0..200),
            tail in prop::collection::vec(any::<u8>(), 0..200),
        ) {
            let _ = skeleton(&head, &tail);
        }
    }
}
