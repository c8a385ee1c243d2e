//! An incremental Server-Sent Events parser, for HTTP observation ([`super::http`]) only.
//!
//! Owns the `text/event-stream` grammar (WHATWG HTML §9.2): lines end in CRLF, LF or a lone CR
//! (a CRLF split across two chunks is one line end); a line starting with `:` is a comment (the
//! keep-alives servers send); `data:` lines of one event are joined with `\n`; an empty line
//! dispatches the event; an event with no `data` is not dispatched; a leading BOM is skipped; a
//! last event without its blank line is discarded at end of stream, as browsers do.
//! Goes in: the response body's chunks, as the relay forwarded them. Comes out: what the
//! observer reads of each event's `data` (one JSON-RPC message for MCP), as a [`Split`]. It
//! never sees the relay path: the proxy forwards the bytes untouched and this parser reads the
//! copy handed off to observation. Memory is bounded: no line is held, only the few bytes that
//! name its field; an event's data streams into a [`MessageBuf`], which keeps a large JSON
//! object's first and last bytes only (as for a stdio line) and measures without holding any
//! other data past [`MAX_EVENT_DATA`] ([`SseStats::oversized`], in the `--debug` totals).

use super::frame::{MessageBuf, Split, Summarize, SUMMARIZE};

/// Most bytes of `data` held for an event that is not a JSON object (a batch): past it the
/// event is measured, not parsed. A JSON object of any size is read from its ends.
pub const MAX_EVENT_DATA: usize = 32 * 1024 * 1024;

/// The data buffer is given back after an event that grew it past this, so one large event
/// does not pin its memory for the rest of a long-lived stream (DESIGN §9, unbounded frames).
const KEEP_CAPACITY: usize = 64 * 1024;

/// The only field that carries a message; `event`, `id` and `retry` do not change which bytes
/// are a JSON-RPC message.
const DATA: &[u8] = b"data";

/// What the parser has seen, for `--debug` counters and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SseStats {
    pub events: u64,
    pub comments: u64,
    /// Events whose data could not be read: over [`MAX_EVENT_DATA`] and not a JSON object, or
    /// an object whose ends do not join (measured, not parsed).
    pub oversized: u64,
}

/// Where the parser is within the current line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// Nothing of the line yet: a line end here is a blank line.
    #[default]
    Start,
    /// The field name so far matches the first `n` bytes of [`DATA`].
    Name(usize),
    /// Just after `data:`: one leading space is not part of the value.
    ValueStart,
    /// Inside a `data` value: its bytes are the event's.
    Value,
    /// A comment, another field, or a damaged line: ignored up to its end.
    Skip,
}

#[derive(Debug)]
pub struct SseParser {
    line: Line,
    /// `data` of the event being built.
    data: MessageBuf,
    has_data: bool,
    /// The previous chunk ended in CR: a LF at the start of this one belongs to it.
    after_cr: bool,
    /// Nothing has been read yet: a BOM may come first.
    at_start: bool,
    /// Bytes were lost before this chunk: skip until the next blank line.
    resync: bool,
    pub stats: SseStats,
}

impl Default for SseParser {
    fn default() -> Self {
        SseParser::new()
    }
}

impl SseParser {
    pub fn new() -> Self {
        SseParser::with_limits(MAX_EVENT_DATA, SUMMARIZE)
    }

    /// [`SseParser::new`] with other limits (tests use small ones).
    pub(crate) fn with_limits(cap: usize, limits: Summarize) -> Self {
        SseParser {
            line: Line::Start,
            data: MessageBuf::new(cap, limits).keep_at_most(KEEP_CAPACITY),
            has_data: false,
            after_cr: false,
            at_start: true,
            resync: false,
            stats: SseStats::default(),
        }
    }

    /// Some bytes of the stream were never seen (the tap dropped them): the event in progress
    /// is unusable, and so is the line the next chunk starts in (a line end right after the
    /// loss ends a damaged line, not a blank one): everything up to the next blank line after
    /// it is discarded.
    pub fn lost_bytes(&mut self) {
        self.data.discard();
        self.has_data = false;
        self.resync = true;
        self.line = Line::Skip;
        self.after_cr = false;
    }

    /// Feeds one chunk; calls `on_event` with what is read of each complete event's data.
    pub fn feed(&mut self, mut chunk: &[u8], on_event: &mut dyn FnMut(Split<'_>)) {
        if self.at_start && !chunk.is_empty() {
            // The BOM is only stripped at the very start; a partial BOM split across chunks is
            // treated as data (no MCP server sends one).
            if let Some(rest) = chunk.strip_prefix(b"\xEF\xBB\xBF") {
                chunk = rest;
            }
            self.at_start = false;
        }
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
        }
        while !chunk.is_empty() {
            match memchr::memchr2(b'\n', b'\r', chunk) {
                None => {
                    self.line_bytes(chunk);
                    return;
                }
                Some(i) => {
                    self.line_bytes(&chunk[..i]);
                    let cr = chunk[i] == b'\r';
                    chunk = &chunk[i + 1..];
                    if cr {
                        match chunk.first() {
                            Some(b'\n') => chunk = &chunk[1..],
                            Some(_) => {}
                            None => self.after_cr = true,
                        }
                    }
                    self.end_line(on_event);
                }
            }
        }
    }

    /// Bytes of the current line (no line end among them).
    fn line_bytes(&mut self, mut bytes: &[u8]) {
        while let Some(&b) = bytes.first() {
            match self.line {
                Line::Start if self.resync => {
                    self.line = Line::Skip;
                    return;
                }
                Line::Start if b == b':' => {
                    self.stats.comments += 1;
                    self.line = Line::Skip;
                    return;
                }
                Line::Start => self.line = Line::Name(0),
                Line::Name(n) => {
                    bytes = &bytes[1..];
                    self.line = if b == b':' && n == DATA.len() {
                        self.begin_value();
                        Line::ValueStart
                    } else if DATA.get(n) == Some(&b) {
                        Line::Name(n + 1)
                    } else {
                        Line::Skip
                    };
                }
                Line::ValueStart => {
                    if b == b' ' {
                        bytes = &bytes[1..];
                    }
                    self.line = Line::Value;
                }
                Line::Value => {
                    self.data.push(bytes);
                    return;
                }
                Line::Skip => return,
            }
        }
    }

    /// Bytes held for the event in progress: for tests of the memory bound.
    #[cfg(test)]
    pub(crate) fn buffered_capacity(&self) -> usize {
        self.data.buffered_capacity()
    }

    fn end_line(&mut self, on_event: &mut dyn FnMut(Split<'_>)) {
        match self.line {
            Line::Start => self.dispatch(on_event),
            // A line that is only a field name has an empty value.
            Line::Name(n) if n == DATA.len() => self.begin_value(),
            _ => {}
        }
        self.line = Line::Start;
    }

    /// A `data` field starts: its value follows the data so far after a `\n`.
    fn begin_value(&mut self) {
        if self.has_data {
            self.data.push(b"\n");
        }
        self.has_data = true;
    }

    fn dispatch(&mut self, on_event: &mut dyn FnMut(Split<'_>)) {
        if self.resync {
            self.resync = false;
            self.data.discard();
        } else if self.has_data {
            self.stats.events += 1;
            let oversized = &mut self.stats.oversized;
            self.data.end(&[], false, &mut |s| {
                if matches!(s, Split::Oversize(_)) {
                    *oversized += 1;
                }
                on_event(s)
            });
        }
        self.has_data = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event as a string: its data, or `summary <len> <skeleton>`, or `oversize <len>`.
    fn shown(s: Split<'_>) -> String {
        match s {
            Split::Frame(d) => String::from_utf8_lossy(d).into_owned(),
            Split::Summary { skeleton, len } => {
                format!("summary {len} {}", String::from_utf8_lossy(skeleton))
            }
            Split::Oversize(n) => format!("oversize {n}"),
        }
    }

    fn events_with(p: &mut SseParser, chunks: &[&[u8]]) -> Vec<String> {
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut |s| out.push(shown(s)));
        }
        out
    }

    fn events_of(chunks: &[&[u8]]) -> (Vec<String>, SseStats) {
        let mut p = SseParser::new();
        let out = events_with(&mut p, chunks);
        (out, p.stats)
    }

    #[test]
    fn multi_line_data_is_joined_with_newline() {
        let (ev, _) = events_of(&[b"data: {\"a\":\ndata: 1}\n\n"]);
        assert_eq!(ev, vec!["{\"a\":\n1}"]);
    }

    #[test]
    fn comments_and_keep_alives_are_not_events() {
        let (ev, st) = events_of(&[b": ping\n\n:\n\ndata: x\n\n"]);
        assert_eq!(ev, vec!["x"]);
        assert_eq!(st.comments, 2);
    }

    #[test]
    fn crlf_and_lone_cr_end_lines_even_split_across_chunks() {
        let (ev, _) = events_of(&[b"data: a\r", b"\n\r", b"\ndata: b\r\rdata:c\n", b"\n"]);
        assert_eq!(ev, vec!["a", "b", "c"]);
    }

    #[test]
    fn byte_at_a_time_feeding_gives_the_same_events() {
        let stream =
            b"\xEF\xBB\xBFid: 1\r\nevent: message\r\ndata: {\"x\": 1}\r\n\r\n: keep\n\ndata:y\n\n";
        let chunks: Vec<&[u8]> = stream.chunks(1).collect();
        let (ev, _) = events_of(&chunks);
        assert_eq!(ev, vec!["{\"x\": 1}", "y"]);
    }

    #[test]
    fn event_without_data_and_unterminated_last_event_are_not_dispatched() {
        let (ev, _) = events_of(&[b"id: 7\nretry: 10\n\ndata: tail"]);
        assert!(ev.is_empty(), "{ev:?}");
    }

    #[test]
    fn only_one_space_after_colon_is_stripped() {
        let (ev, _) = events_of(&[b"data:  two\n\n"]);
        assert_eq!(ev, vec![" two"]);
    }

    #[test]
    fn lost_bytes_skip_to_next_event() {
        let mut p = SseParser::new();
        let mut out = events_with(&mut p, &[b"data: first-half"]);
        p.lost_bytes();
        out.extend(events_with(&mut p, &[b"second-half\n\ndata: ok\n\n"]));
        assert_eq!(out, vec!["ok"]);
        // A line end right after the loss ends a damaged line; the blank line after it ends
        // the damaged event.
        p.lost_bytes();
        let out = events_with(&mut p, &[b"\ndata: rest\n\ndata: next\n\n"]);
        assert_eq!(out, vec!["next"]);
    }

    #[test]
    fn only_the_data_field_carries_the_message() {
        let (ev, _) = events_of(&[
            b"dat: a\ndatum: b\nDATA: c\ndata\nevent: data\nid:data\n\n",
            b"data\ndata\n\n",
        ]);
        assert_eq!(ev, vec!["", "\n"]);
    }

    const SMALL: Summarize = Summarize {
        whole: 1024,
        catalog: 1024,
        head: 128,
        tail: 128,
    };

    /// A `tools/call` result of `n` bytes of text, the TypeScript SDK's field order (`id` last),
    /// as the data of one event over several `data` lines.
    fn big_event(n: usize, line_end: &str) -> (Vec<u8>, String) {
        let text = "t".repeat(n);
        let data = format!(
            "{{\"result\":{{\"content\":[{{\"type\":\"text\",\n\"text\":\"{text}\"}}],\n\"isError\":true}},\"jsonrpc\":\"2.0\",\"id\":\"r-7\"}}"
        );
        let lines: Vec<String> = data.split('\n').map(|l| format!("data: {l}")).collect();
        let event = format!(
            ": ping{e}event: message{e}{}{e}{e}",
            lines.join(line_end),
            e = line_end
        );
        (event.into_bytes(), data)
    }

    #[test]
    fn a_large_json_event_is_read_from_its_ends_in_bounded_memory() {
        for line_end in ["\n", "\r\n", "\r"] {
            let (stream, data) = big_event(100_000, line_end);
            for read in [1usize, 7, 1000, 65_536] {
                let mut p = SseParser::with_limits(4096, SMALL);
                let mut out = Vec::new();
                for c in stream.chunks(read) {
                    p.feed(c, &mut |s| out.push(shown(s)));
                    assert!(p.data.buffered_capacity() <= 2 * 1024 + 6 * 128 + read);
                }
                assert_eq!(out.len(), 1, "{line_end:?} {read}");
                let (len, skeleton) = out[0]
                    .strip_prefix("summary ")
                    .and_then(|r| r.split_once(' '))
                    .unwrap_or_else(|| panic!("a summary: {}", &out[0][..40]));
                assert_eq!(len, data.len().to_string(), "{line_end:?} {read}");
                let v: serde_json::Value = serde_json::from_str(skeleton).expect("JSON");
                assert_eq!(v["id"], "r-7");
                assert_eq!(v["result"]["isError"], true);
                assert_eq!(p.stats.oversized, 0);
            }
        }
    }

    #[test]
    fn a_large_event_that_is_not_an_object_is_measured_not_held() {
        let mut p = SseParser::with_limits(4096, SMALL);
        let batch = format!("[{}1]", "1,".repeat(5000));
        let stream = format!("data: {batch}\n\ndata: {{\"id\":1}}\n\n");
        let out = events_with(&mut p, &[stream.as_bytes()]);
        assert_eq!(
            out,
            vec![
                format!("oversize {}", batch.len()),
                "{\"id\":1}".to_string()
            ]
        );
        assert_eq!(p.stats.oversized, 1);
        assert!(p.data.buffered_capacity() <= KEEP_CAPACITY);
    }
}
