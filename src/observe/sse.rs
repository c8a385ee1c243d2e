//! An incremental Server-Sent Events parser, for HTTP observation ([`super::http`]) only.
//!
//! Owns the `text/event-stream` grammar (WHATWG HTML §9.2): lines end in CRLF, LF or a lone CR
//! (a CRLF split across two chunks is one line end); a line starting with `:` is a comment (the
//! keep-alives servers send); `data:` lines of one event are joined with `\n`; an empty line
//! dispatches the event; an event with no `data` is not dispatched; a leading BOM is skipped; a
//! last event without its blank line is discarded at end of stream, as browsers do.
//! Goes in: the response body's chunks, as the relay forwarded them. Comes out: each event's
//! `data` (one JSON-RPC message for MCP). It never sees the relay path: the proxy forwards the
//! bytes untouched and this parser reads the copy handed off to observation. Memory is bounded:
//! an event whose data exceeds the cap is counted ([`SseStats::oversized`], in the `--debug`
//! totals) and skipped, and an oversized line buffer is released after use.

/// Most bytes of `data` one event may carry before it is skipped (a 25 MB tool result is relayed
/// and must still be observed; anything past this is counted and measured, not parsed).
pub const MAX_EVENT_DATA: usize = 32 * 1024 * 1024;

/// Buffers above this are released once used, so one huge event does not pin its memory for
/// the rest of a long-lived stream (DESIGN §9, unbounded frames).
const KEEP_CAPACITY: usize = 64 * 1024;

/// What the parser has seen, for `--debug` counters and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SseStats {
    pub events: u64,
    pub comments: u64,
    pub oversized: u64,
}

#[derive(Debug, Default)]
pub struct SseParser {
    /// The current line, without its terminator.
    line: Vec<u8>,
    /// `data` of the event being built.
    data: Vec<u8>,
    has_data: bool,
    /// The event's data passed [`MAX_EVENT_DATA`]: skip it whole.
    oversized: bool,
    /// The previous chunk ended in CR: a LF at the start of this one belongs to it.
    after_cr: bool,
    /// Nothing has been read yet: a BOM may come first.
    at_start: bool,
    /// Bytes were lost before this chunk: skip until the next blank line.
    resync: bool,
    pub stats: SseStats,
}

impl SseParser {
    pub fn new() -> Self {
        SseParser {
            at_start: true,
            ..Default::default()
        }
    }

    /// Some bytes of the stream were never seen (the tap dropped them): the event in progress
    /// is unusable, so everything up to the next event boundary is discarded.
    pub fn lost_bytes(&mut self) {
        self.line.clear();
        self.reset_event();
        self.resync = true;
        self.after_cr = false;
    }

    /// Feeds one chunk; calls `on_event` with each complete event's data.
    pub fn feed(&mut self, mut chunk: &[u8], on_event: &mut dyn FnMut(&[u8])) {
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
            match chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
                None => {
                    self.push_line_bytes(chunk);
                    return;
                }
                Some(i) => {
                    self.push_line_bytes(&chunk[..i]);
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

    fn push_line_bytes(&mut self, bytes: &[u8]) {
        if self.resync || self.oversized {
            // Only whether the line is empty matters while skipping.
            if !bytes.is_empty() && self.line.is_empty() {
                self.line.push(b'x');
            }
            return;
        }
        if self.line.len() + bytes.len() > MAX_EVENT_DATA + 16 {
            self.oversized = true;
            self.line.clear();
            self.line.push(b'x');
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    fn end_line(&mut self, on_event: &mut dyn FnMut(&[u8])) {
        if self.line.is_empty() {
            self.dispatch(on_event);
            return;
        }
        if self.resync || self.oversized {
            self.line.clear();
            return;
        }
        let line = std::mem::take(&mut self.line);
        if line[0] == b':' {
            self.stats.comments += 1;
        } else {
            let (name, value) = match line.iter().position(|&b| b == b':') {
                Some(i) => {
                    let v = &line[i + 1..];
                    (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
                }
                None => (&line[..], &b""[..]),
            };
            // `event`, `id` and `retry` do not change which bytes are a JSON-RPC message.
            if name == b"data" {
                if self.data.len() + value.len() + 1 > MAX_EVENT_DATA {
                    self.oversized = true;
                    self.data.clear();
                } else {
                    if self.has_data {
                        self.data.push(b'\n');
                    }
                    self.data.extend_from_slice(value);
                    self.has_data = true;
                }
            }
        }
        self.line = line;
        self.line.clear();
        if self.line.capacity() > KEEP_CAPACITY {
            self.line = Vec::new();
        }
    }

    fn dispatch(&mut self, on_event: &mut dyn FnMut(&[u8])) {
        if self.resync {
            self.resync = false;
        } else if self.oversized {
            self.stats.oversized += 1;
        } else if self.has_data {
            self.stats.events += 1;
            on_event(&self.data);
        }
        self.reset_event();
    }

    fn reset_event(&mut self) {
        self.data.clear();
        if self.data.capacity() > KEEP_CAPACITY {
            self.data = Vec::new();
        }
        self.has_data = false;
        self.oversized = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events_of(chunks: &[&[u8]]) -> (Vec<String>, SseStats) {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut |d| {
                out.push(String::from_utf8_lossy(d).into_owned())
            });
        }
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
        let mut out = Vec::new();
        p.feed(b"data: first-half", &mut |d| out.push(d.to_vec()));
        p.lost_bytes();
        p.feed(b"second-half\n\ndata: ok\n\n", &mut |d| {
            out.push(d.to_vec())
        });
        assert_eq!(out, vec![b"ok".to_vec()]);
    }
}
