//! Frame splitting: turns the tap's chunks of one direction back into newline-delimited frames,
//! and decides for every transport what of one message is kept.
//!
//! [`MessageBuf`] takes one message's bytes as they arrive, whoever frames it (stdio lines here,
//! HTTP bodies and SSE events in `super::http` and `super::sse`), and gives what the observer
//! reads ([`Split`]): the whole message; for a JSON object over [`WHOLE_FRAME_BYTES`], a small
//! skeleton built from its first and last bytes; for anything else over the cap, only its
//! length. [`FrameSplitter`] ends a message at each newline: goes in, chunks as the relay read
//! them (any size, any split point, possibly with gaps where the tap dropped chunks); comes out,
//! one [`Split`] per line, without the newline and a trailing `\r`. Memory is bounded: a frame
//! is held only until its newline, a large object keeps only its head and tail, a frame over the
//! cap is measured and discarded as it streams past, and a buffer grown for a large frame is
//! released after use. Never parses JSON (apart from [`split_batch`], which only finds element
//! boundaries).

use std::ops::Range;

/// Largest frame held for parsing when it is not a JSON object (a batch, or not JSON at all).
/// Beyond it a frame is counted and measured, not parsed. Bounds the observer's buffer per
/// direction.
pub const DEFAULT_FRAME_CAP: usize = 64 * 1024 * 1024;

use crate::tap::large::head_has_mark;
pub use crate::tap::large::{
    Summarize, CATALOG_FRAME_BYTES, CATALOG_MARK, SUMMARIZE, SUMMARY_HEAD, SUMMARY_TAIL,
    WHOLE_FRAME_BYTES,
};

/// A buffer that grew beyond this for one large frame is given back after that frame, so a
/// single large message does not pin its size for the rest of the session.
const KEEP_BUFFER_BYTES: usize = 1024 * 1024;

/// One result of splitting.
#[derive(Debug, PartialEq, Eq)]
pub enum Split<'a> {
    /// A complete frame without its line ending (empty for a blank line: still a frame for the
    /// counters, never a message).
    Frame(&'a [u8]),
    /// A JSON object frame larger than [`WHOLE_FRAME_BYTES`] ended: a skeleton built from its
    /// first and last bytes (see [`super::summary::skeleton`]) and its length.
    Summary { skeleton: &'a [u8], len: u64 },
    /// A frame that could not be parsed ended (over the cap, or too large and not joinable):
    /// only its length (without line ending) is known.
    Oversize(u64),
}

impl Split<'_> {
    /// The same, owning its bytes.
    pub fn to_message(&self) -> Message {
        match *self {
            Split::Frame(f) => Message::Frame(f.to_vec()),
            Split::Summary { skeleton, len } => Message::Summary {
                skeleton: skeleton.to_vec(),
                len,
            },
            Split::Oversize(n) => Message::Oversize(n),
        }
    }
}

/// A [`Split`] that owns its bytes: for a message observed later than it ended (HTTP: an
/// answer that came before its request could be handed over, or a request waiting for its
/// scope).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Frame(Vec<u8>),
    Summary { skeleton: Vec<u8>, len: u64 },
    Oversize(u64),
}

impl Message {
    pub fn as_split(&self) -> Split<'_> {
        match self {
            Message::Frame(f) => Split::Frame(f),
            Message::Summary { skeleton, len } => Split::Summary {
                skeleton,
                len: *len,
            },
            Message::Oversize(n) => Split::Oversize(*n),
        }
    }

    /// Bytes it holds.
    pub fn held_bytes(&self) -> usize {
        match self {
            Message::Frame(f) => f.len(),
            Message::Summary { skeleton, .. } => skeleton.len(),
            Message::Oversize(_) => 0,
        }
    }
}

/// The first and last bytes of a frame too large to hold whole.
#[derive(Debug)]
struct Large {
    limits: Summarize,
    head: Vec<u8>,
    /// The head is still being filled: every byte of the frame so far is in it.
    head_open: bool,
    /// The latest bytes, contiguous up to the newest one; at least `limits.tail` of them once
    /// that many went past since the head or the last skip.
    tail: Vec<u8>,
    len: u64,
}

impl Large {
    /// Starts from the frame's bytes so far, `a` then `b`.
    fn start(limits: Summarize, a: &[u8], b: &[u8]) -> Large {
        let mut l = Large {
            limits,
            head: Vec::new(),
            head_open: true,
            tail: Vec::new(),
            len: 0,
        };
        l.more(a);
        l.more(b);
        l
    }

    /// `n` bytes of the frame went past unseen: the tail starts again after them.
    fn skip(&mut self, n: u64) {
        self.len += n;
        self.head_open = false;
        self.tail.clear();
    }

    fn more(&mut self, mut seg: &[u8]) {
        self.len += seg.len() as u64;
        if self.head_open {
            let take = seg.len().min(self.limits.head - self.head.len());
            self.head.extend_from_slice(&seg[..take]);
            seg = &seg[take..];
            self.head_open = self.head.len() < self.limits.head;
        }
        let tail = self.limits.tail;
        let seg = &seg[seg.len().saturating_sub(tail)..];
        if self.tail.len() + seg.len() > 2 * tail {
            let keep = tail.saturating_sub(seg.len()).min(self.tail.len());
            self.tail.drain(..self.tail.len() - keep);
        }
        self.tail.extend_from_slice(seg);
    }

    /// `line`: the message is a line, whose trailing `\r` (of a CRLF) is not part of it.
    fn finish(self, line: bool, out: &mut impl FnMut(Split<'_>)) {
        let (len, tail) = if line {
            (trimmed_len(self.len, &self.tail), trim_cr(&self.tail))
        } else {
            (self.len, &self.tail[..])
        };
        // Exactly the last `tail` bytes, however the frame was chunked, so the skeleton does not
        // depend on read sizes.
        let tail = &tail[tail.len().saturating_sub(self.limits.tail)..];
        match super::summary::skeleton(&self.head, tail) {
            Some(s) => out(Split::Summary { skeleton: &s, len }),
            None => out(Split::Oversize(len)),
        }
    }
}

/// What a [`MessageBuf`] keeps of the message in progress.
#[derive(Debug)]
enum Held {
    /// Every byte so far, in [`MessageBuf::buf`].
    Whole,
    /// A JSON object over the summary threshold: its first and last bytes.
    Ends(Large),
    /// Over the cap and not a JSON object: only its length.
    Measured(u64),
}

/// How a message is to be kept, from its bytes so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    Whole,
    Ends,
    Measured,
}

/// One message's bytes as they arrive, kept as the observer will read it: whole while it may
/// still be read whole; from its first [`SUMMARY_HEAD`] and last [`SUMMARY_TAIL`] bytes once it
/// is a JSON object over [`WHOLE_FRAME_BYTES`] (or over [`CATALOG_FRAME_BYTES`] when its head
/// holds [`CATALOG_MARK`]); by its length alone past the cap. Shared by every framing: where a
/// message ends is the caller's business (a newline for stdio, [`FrameSplitter`]; the end of an
/// HTTP body, `super::http`; the end of an SSE event, `super::sse`), what is kept of it is
/// decided here, the same for all. Holds at most the largest whole message allowed (the catalog
/// limit for objects, the cap for anything else) plus head and tail; never parses JSON.
#[derive(Debug)]
pub struct MessageBuf {
    buf: Vec<u8>,
    held: Held,
    cap: usize,
    limits: Summarize,
    /// A buffer grown beyond this for one message is given back after it.
    keep: usize,
    /// The latest byte seen is a `\r`: not counted in a line's length (see [`MessageBuf::end`]).
    last_cr: bool,
}

impl MessageBuf {
    /// Holds at most `cap` bytes of a message that is not a JSON object; objects are read from
    /// their ends past `limits.whole` (at least `head + tail`, at most `max(cap, head + tail)`)
    /// or `limits.catalog` (clamped the same way, at least `whole`).
    pub fn new(cap: usize, limits: Summarize) -> Self {
        let cap = cap.max(1);
        let head = limits.head.max(1);
        let tail = limits.tail.max(1);
        let whole = limits.whole.clamp(head + tail, cap.max(head + tail));
        MessageBuf {
            buf: Vec::new(),
            held: Held::Whole,
            cap,
            limits: Summarize {
                whole,
                catalog: limits.catalog.clamp(whole, cap.max(whole)),
                head,
                tail,
            },
            keep: KEEP_BUFFER_BYTES,
            last_cr: false,
        }
    }

    /// Gives the buffer back after a message that grew it past `keep` bytes (default 1 MiB):
    /// for a buffer that lives as long as a stream of mostly small messages.
    pub fn keep_at_most(mut self, keep: usize) -> Self {
        self.keep = keep;
        self
    }

    /// Some of a message has arrived (or gone past unseen).
    pub fn started(&self) -> bool {
        !matches!(self.held, Held::Whole) || !self.buf.is_empty()
    }

    /// More bytes of the message.
    pub fn push(&mut self, seg: &[u8]) {
        let Some(&last) = seg.last() else {
            return;
        };
        self.last_cr = last == b'\r';
        match &mut self.held {
            Held::Whole => match self.keep_as(&self.buf, seg) {
                Keep::Whole => self.buf.extend_from_slice(seg),
                Keep::Ends => {
                    self.held = Held::Ends(Large::start(self.limits, &self.buf, seg));
                    self.release();
                }
                Keep::Measured => {
                    self.held = Held::Measured((self.buf.len() + seg.len()) as u64);
                    self.release();
                }
            },
            Held::Ends(l) => l.more(seg),
            Held::Measured(n) => *n += seg.len() as u64,
        }
    }

    /// `n` bytes of the message went past unseen (the stdio tap passes over the middle of a
    /// large frame, see `crate::tap`): what is kept so far is its head.
    pub fn skip(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        self.last_cr = false;
        match &mut self.held {
            Held::Measured(m) => *m += n,
            Held::Ends(l) => l.skip(n),
            Held::Whole => {
                let mut l = Large::start(self.limits, &self.buf, &[]);
                l.skip(n);
                self.held = Held::Ends(l);
                self.release();
            }
        }
    }

    /// The message ends with `last` (possibly empty): `out` gets what the observer reads of
    /// it, and the buffer is ready for the next one. `line`: the message is a line, so a
    /// trailing `\r` (of a CRLF) is not part of it.
    pub fn end(&mut self, last: &[u8], line: bool, out: &mut impl FnMut(Split<'_>)) {
        if !self.started() {
            // Common case: the whole message is in `last`; no copy.
            match self.keep_as(&[], last) {
                Keep::Whole => out(Split::Frame(if line { trim_cr(last) } else { last })),
                Keep::Ends => Large::start(self.limits, &[], last).finish(line, out),
                Keep::Measured => {
                    let cr = line && last.ends_with(b"\r");
                    out(Split::Oversize(last.len() as u64 - u64::from(cr)))
                }
            }
            return;
        }
        self.push(last);
        self.finish(line, out);
    }

    /// The stream closed: a message in progress ends here. Returns whether there was one; a
    /// `line` that is empty (or only a `\r`) is none.
    pub fn flush(&mut self, line: bool, out: &mut impl FnMut(Split<'_>)) -> bool {
        let blank = matches!(self.held, Held::Whole) && (line && trim_cr(&self.buf).is_empty());
        if !self.started() || blank {
            self.discard();
            return false;
        }
        self.finish(line, out);
        true
    }

    /// [`MessageBuf::flush`] for a message observed later: the result owned, a whole message's
    /// buffer handed over rather than copied. Not a line: every byte counts.
    pub fn take(&mut self) -> Option<Message> {
        if !self.started() {
            return None;
        }
        let m = match std::mem::replace(&mut self.held, Held::Whole) {
            Held::Whole => Message::Frame(std::mem::take(&mut self.buf)),
            Held::Ends(l) => {
                let mut m = Message::Oversize(l.len);
                l.finish(false, &mut |s| m = s.to_message());
                m
            }
            Held::Measured(n) => Message::Oversize(n),
        };
        self.last_cr = false;
        Some(m)
    }

    /// Forgets the message in progress (some of it was lost).
    pub fn discard(&mut self) {
        self.held = Held::Whole;
        self.last_cr = false;
        self.release();
    }

    /// Bytes currently held: for the tests and the fuzz target that check the memory bound.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn buffered_capacity(&self) -> usize {
        self.buf.capacity()
            + match &self.held {
                Held::Ends(l) => l.head.capacity() + l.tail.capacity(),
                Held::Whole | Held::Measured(_) => 0,
            }
    }

    /// How a message made of `a` then `b` (its bytes so far) is kept.
    fn keep_as(&self, a: &[u8], b: &[u8]) -> Keep {
        let total = a.len() + b.len();
        let l = &self.limits;
        if total > l.whole
            && starts_object(a, b)
            && (total > l.catalog || !head_has_mark(a, b, l.head))
        {
            Keep::Ends
        } else if total > self.cap {
            Keep::Measured
        } else {
            Keep::Whole
        }
    }

    fn finish(&mut self, line: bool, out: &mut impl FnMut(Split<'_>)) {
        match std::mem::replace(&mut self.held, Held::Whole) {
            Held::Whole => out(Split::Frame(if line {
                trim_cr(&self.buf)
            } else {
                &self.buf
            })),
            Held::Ends(l) => l.finish(line, out),
            Held::Measured(n) => out(Split::Oversize(n - u64::from(line && self.last_cr))),
        }
        self.last_cr = false;
        self.release();
    }

    fn release(&mut self) {
        self.buf.clear();
        if self.buf.capacity() > self.keep {
            self.buf = Vec::new();
        }
    }
}

/// What was lost right before a chunk handed to [`FrameSplitter::push`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gap {
    /// Nothing: the chunk continues the stream.
    None,
    /// Bytes were lost that ended inside a message: what is held is damaged, and so are the
    /// chunk's bytes up to its first newline; both are discarded.
    InsideLine,
    /// Bytes were lost, the last of them a newline: what is held ended inside them, and the
    /// chunk starts a message.
    AtLineEnd,
}

impl Gap {
    /// The gap before a chunk: whether bytes were lost, and whether the last of them was a
    /// newline (a tap chunk's `after_gap` and `gap_ended_line`).
    pub fn of(lost: bool, ended_line: bool) -> Gap {
        match (lost, ended_line) {
            (false, _) => Gap::None,
            (true, false) => Gap::InsideLine,
            (true, true) => Gap::AtLineEnd,
        }
    }
}

/// Per-direction newline splitter: a [`MessageBuf`] ended at each newline.
#[derive(Debug)]
pub struct FrameSplitter {
    msg: MessageBuf,
    /// Skipping the damaged remainder of a frame after a gap, up to the next newline.
    resync: bool,
    /// Bytes were skipped since the current resync began.
    resync_skipped: bool,
    /// Messages thrown away while resynchronising (see [`Self::take_discarded`]).
    discarded: u64,
}

impl Default for FrameSplitter {
    fn default() -> Self {
        FrameSplitter::new(DEFAULT_FRAME_CAP)
    }
}

fn trim_cr(f: &[u8]) -> &[u8] {
    f.strip_suffix(b"\r").unwrap_or(f)
}

/// The frame made of `a` then `b` starts with `{` (after whitespace).
fn starts_object(a: &[u8], b: &[u8]) -> bool {
    a.iter().chain(b).find(|c| !c.is_ascii_whitespace()) == Some(&b'{')
}

impl FrameSplitter {
    /// A splitter holding at most `cap` bytes of a frame; JSON objects over
    /// [`WHOLE_FRAME_BYTES`] (or `cap`, if smaller) are summarised.
    pub fn new(cap: usize) -> Self {
        FrameSplitter::with_limits(cap, SUMMARIZE)
    }

    /// [`FrameSplitter::new`] with explicit summary limits (tests use small ones), clamped as
    /// [`MessageBuf::new`] says: `whole` is at least `head + tail`, so the two never overlap.
    pub fn with_limits(cap: usize, limits: Summarize) -> Self {
        FrameSplitter {
            msg: MessageBuf::new(cap, limits),
            resync: false,
            resync_skipped: false,
            discarded: 0,
        }
    }

    /// A splitter that never summarises: every frame up to `cap` is handed over whole (the
    /// benchmark's `summary` switch, `crate::config::BenchSwitches`). Only for a tap that passes
    /// every byte (no trimming): a frame whose middle was skipped is still summarised.
    pub fn without_summaries(cap: usize) -> Self {
        let mut s = FrameSplitter::new(cap);
        s.msg.limits.whole = usize::MAX;
        s.msg.limits.catalog = usize::MAX;
        s
    }

    /// Holds no part of a frame: flushing it now would hand over nothing.
    pub fn is_empty(&self) -> bool {
        !self.msg.started()
    }

    /// Feeds one chunk; `out` is called for every frame the chunk completes. `gap`: what was
    /// lost right before it (see [`Gap`]). `skipped`: the tap passed over this many bytes of the
    /// current frame right before this chunk (the middle of a large frame, see `crate::tap`).
    pub fn push(&mut self, chunk: &[u8], gap: Gap, skipped: u64, mut out: impl FnMut(Split<'_>)) {
        match gap {
            Gap::None => {}
            // A chunk that continues a trimmed frame cannot follow a drop that ended a line;
            // were it to, it is read as any other gap.
            Gap::AtLineEnd if skipped == 0 => self.lost_to_line_end(),
            Gap::InsideLine | Gap::AtLineEnd => self.lost(),
        }
        if !self.resync {
            self.msg.skip(skipped);
        }
        let mut rest = chunk;
        while !rest.is_empty() {
            let nl = memchr(rest);
            let (seg, complete) = match nl {
                Some(i) => (&rest[..i], true),
                None => (rest, false),
            };
            rest = match nl {
                Some(i) => &rest[i + 1..],
                None => &[],
            };
            if self.resync {
                if complete {
                    self.resync = false;
                    self.discarded += 1;
                } else {
                    self.resync_skipped = true;
                }
                continue;
            }
            if complete {
                self.msg.end(seg, true, &mut out);
            } else {
                self.msg.push(seg);
            }
        }
    }

    /// Bytes were lost here ([`Gap::InsideLine`]; also at a direction's end after a drop): what
    /// is held is damaged, and whatever comes next up to a newline belongs to it.
    pub fn lost(&mut self) {
        self.msg.discard();
        self.resync = true;
        self.resync_skipped = false;
    }

    /// [`Gap::AtLineEnd`]: what is held (and any resynchronisation under way) ended inside the
    /// lost bytes, and the next byte starts a message. The message they ended is not counted
    /// here: its newline is in the dropped bytes, which the tap counts
    /// (`crate::tap::messages_ended`).
    fn lost_to_line_end(&mut self) {
        self.msg.discard();
        self.resync = false;
        self.resync_skipped = false;
    }

    /// The direction closed: a last frame without a newline is complete now.
    pub fn flush(&mut self, mut out: impl FnMut(Split<'_>)) {
        if std::mem::take(&mut self.resync) {
            if std::mem::take(&mut self.resync_skipped) {
                self.discarded += 1;
            }
            self.msg.discard();
            return;
        }
        self.msg.flush(true, &mut out);
    }

    /// Messages whose end a resynchronisation skipped since the last call: after a gap the bytes
    /// up to the next newline are thrown away, and they end a message that the tap's count of
    /// newlines in dropped bytes does not (its newline came after them). With that count, every
    /// message lost to a gap is counted once.
    pub fn take_discarded(&mut self) -> u64 {
        std::mem::take(&mut self.discarded)
    }

    /// Bytes currently held: for the tests and the fuzz target that check the memory bound.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn buffered_capacity(&self) -> usize {
        self.msg.buffered_capacity()
    }
}

/// A summarised frame's length without a trailing `\r` (`last_seg`: its latest bytes).
fn trimmed_len(n: u64, last_seg: &[u8]) -> u64 {
    if last_seg.ends_with(b"\r") {
        n.saturating_sub(1)
    } else {
        n
    }
}

/// The next newline. Vectorised, because for a large frame this scan is the largest single cost
/// of observing it (`bench/README.md`, "Large messages").
fn memchr(s: &[u8]) -> Option<usize> {
    memchr::memchr(b'\n', s)
}

/// If `frame` is a JSON array (a JSON-RPC batch), the byte ranges of its top-level elements;
/// `None` if it is not an array or is not well nested. Only tracks strings and nesting depth,
/// so each element can then be peeked (and sized) on its own.
pub fn split_batch(frame: &[u8]) -> Option<Vec<Range<usize>>> {
    let start = frame.iter().position(|b| !b.is_ascii_whitespace())?;
    if frame[start] != b'[' {
        return None;
    }
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut in_str = false;
    let mut escaped = false;
    let mut elem_start: Option<usize> = None;
    for (i, &b) in frame.iter().enumerate().skip(start + 1) {
        if in_str {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_str = false;
            }
            continue;
        }
        match b {
            b'"' => {
                in_str = true;
                elem_start.get_or_insert(i);
            }
            b'{' | b'[' => {
                depth += 1;
                elem_start.get_or_insert(i);
            }
            b'}' | b']' if depth > 0 => depth -= 1,
            b']' => {
                if let Some(s) = elem_start.take() {
                    out.push(s..trim_end(frame, i));
                }
                let tail = &frame[i + 1..];
                return tail.iter().all(u8::is_ascii_whitespace).then_some(out);
            }
            b',' if depth == 0 => {
                let s = elem_start.take()?;
                out.push(s..trim_end(frame, i));
            }
            _ if b.is_ascii_whitespace() => {}
            _ => {
                elem_start.get_or_insert(i);
            }
        }
    }
    None
}

fn trim_end(frame: &[u8], end: usize) -> usize {
    let mut e = end;
    while e > 0 && frame[e - 1].is_ascii_whitespace() {
        e -= 1;
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(s: &mut FrameSplitter, chunk: &[u8], gap: Gap) -> Vec<Result<Vec<u8>, u64>> {
        let mut v = Vec::new();
        s.push(chunk, gap, 0, |f| match f {
            Split::Frame(b) => v.push(Ok(b.to_vec())),
            Split::Summary { skeleton, len } => {
                let mut b = format!("summary:{len}:").into_bytes();
                b.extend_from_slice(skeleton);
                v.push(Ok(b))
            }
            Split::Oversize(n) => v.push(Err(n)),
        });
        v
    }

    /// A `tools/call` result of `n` bytes of text, rmcp's field order.
    fn big_result(id: u64, n: usize, is_error: bool) -> Vec<u8> {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{}"}}],"isError":{is_error}}}}}"#,
            "x".repeat(n)
        )
        .into_bytes()
    }

    #[test]
    fn large_objects_are_summarised_from_head_and_tail() {
        let limits = Summarize {
            whole: 4096,
            catalog: 4096,
            head: 256,
            tail: 256,
        };
        let mut s = FrameSplitter::with_limits(DEFAULT_FRAME_CAP, limits);
        let mut stream = big_result(9, 20_000, true);
        stream.extend_from_slice(b"\r\n{\"jsonrpc\":\"2.0\",\"id\":10,\"result\":{}}\n");
        let mut got = Vec::new();
        for piece in stream.chunks(1000) {
            got.extend(run(&mut s, piece, Gap::None));
            assert!(s.buffered_capacity() <= 4096 + 1000 + 2 * 256 + 1000);
        }
        assert_eq!(got.len(), 2);
        let first = String::from_utf8(got[0].clone().expect("summary")).expect("utf8");
        let want_len = big_result(9, 20_000, true).len();
        let (prefix, skeleton) = first.split_at(format!("summary:{want_len}:").len());
        assert_eq!(prefix, format!("summary:{want_len}:"));
        let v: serde_json::Value = serde_json::from_str(skeleton).expect("skeleton is JSON");
        assert_eq!(v["id"], 9);
        assert_eq!(v["result"]["isError"], true);
        assert!(skeleton.len() <= 512);
        assert_eq!(
            got[1],
            Ok(b"{\"jsonrpc\":\"2.0\",\"id\":10,\"result\":{}}".to_vec())
        );
    }

    /// Framed by something else than a newline (an HTTP body, an SSE event): every byte is the
    /// message's, a trailing `\r\n` included, and a large object is still read from its ends.
    #[test]
    fn a_message_not_ended_by_a_newline_keeps_every_byte() {
        let limits = Summarize {
            whole: 1024,
            catalog: 1024,
            head: 128,
            tail: 128,
        };
        let mut m = MessageBuf::new(DEFAULT_FRAME_CAP, limits);
        assert_eq!(m.take(), None, "nothing started");
        m.push(b"{\"id\":1}");
        m.push(b"\r\n");
        assert_eq!(m.take(), Some(Message::Frame(b"{\"id\":1}\r\n".to_vec())));
        let mut big = big_result(4, 5000, true);
        big.extend_from_slice(b"\r\n");
        for piece in big.chunks(100) {
            m.push(piece);
        }
        let Some(Message::Summary { skeleton, len }) = m.take() else {
            panic!("a summary");
        };
        assert_eq!(len, big.len() as u64);
        let v: serde_json::Value = serde_json::from_slice(&skeleton).expect("JSON");
        assert_eq!(
            (v["id"].as_u64(), v["result"]["isError"].as_bool()),
            (Some(4), Some(true))
        );
        assert_eq!(m.take(), None, "ready for the next message");
    }

    #[test]
    fn a_frame_marked_as_a_catalog_is_held_whole_up_to_the_catalog_limit() {
        let limits = Summarize {
            whole: 1024,
            catalog: 4096,
            head: 64,
            tail: 64,
        };
        let page = |n: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"tools":[{{"name":"a","description":"{}"}}]}}}}"#,
                "d".repeat(n)
            )
            .into_bytes()
        };
        let late_mark = |n: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"_meta":{{"x":"{}"}},"tools":[]}}}}"#,
                "d".repeat(n)
            )
            .into_bytes()
        };
        for (frame, whole) in [
            (page(2000), true),                  // marked, between the two limits: whole
            (page(5000), false),                 // marked, over the catalog limit: summarised
            (late_mark(2000), false),            // mark past the head: summarised
            (big_result(3, 2000, false), false), // not marked: summarised
        ] {
            for read in [7usize, 64, 1000, 10_000] {
                let mut s = FrameSplitter::with_limits(DEFAULT_FRAME_CAP, limits);
                let mut stream = frame.clone();
                stream.push(b'\n');
                let mut got = Vec::new();
                for piece in stream.chunks(read) {
                    got.extend(run(&mut s, piece, Gap::None));
                }
                assert_eq!(got.len(), 1);
                let first = got[0].clone().expect("a frame");
                assert_eq!(
                    first == frame,
                    whole,
                    "read {read}: {}",
                    String::from_utf8_lossy(&first[..40])
                );
            }
        }
    }

    #[test]
    fn large_batches_and_non_json_lines_are_not_summarised() {
        let limits = Summarize {
            whole: 1024,
            catalog: 1024,
            head: 256,
            tail: 256,
        };
        let mut s = FrameSplitter::with_limits(8192, limits);
        let batch = format!("[{}]\n", "1,".repeat(1000) + "1");
        let got = run(&mut s, batch.as_bytes(), Gap::None);
        assert_eq!(got, vec![Ok(batch.trim_end().as_bytes().to_vec())]);
        let line = format!("{}\n", "y".repeat(3000));
        assert_eq!(
            run(&mut s, line.as_bytes(), Gap::None),
            vec![Ok(vec![b'y'; 3000])]
        );
        let junk = format!("{{{}\n", "y".repeat(3000));
        assert_eq!(run(&mut s, junk.as_bytes(), Gap::None), vec![Err(3001)]);
    }

    #[test]
    fn splits_on_newline_and_tolerates_crlf() {
        let mut s = FrameSplitter::new(1024);
        let got = run(&mut s, b"{\"a\":1}\r\n{\"b\"", Gap::None);
        assert_eq!(got, vec![Ok(b"{\"a\":1}".to_vec())]);
        let got = run(&mut s, b":2}\n\n", Gap::None);
        assert_eq!(got, vec![Ok(b"{\"b\":2}".to_vec()), Ok(vec![])]);
    }

    #[test]
    fn last_frame_without_newline_is_flushed() {
        let mut s = FrameSplitter::new(1024);
        assert!(run(&mut s, b"{\"x\":1}", Gap::None).is_empty());
        let mut got = Vec::new();
        s.flush(|f| {
            if let Split::Frame(b) = f {
                got.push(b.to_vec())
            }
        });
        assert_eq!(got, vec![b"{\"x\":1}".to_vec()]);
    }

    #[test]
    fn oversize_frames_are_measured_not_held() {
        let mut s = FrameSplitter::new(10);
        let mut got = run(&mut s, b"0123456789ABC", Gap::None);
        assert!(got.is_empty());
        assert!(s.buffered_capacity() <= 16);
        got.extend(run(&mut s, b"DEF\r\nok\n", Gap::None));
        assert_eq!(got, vec![Err(16), Ok(b"ok".to_vec())]);
    }

    /// Found by the `frames` fuzz target: a CRLF split across two chunks was counted in the
    /// length of an oversize frame (`]\r` then `\n`, cap 1, 2 instead of 1).
    #[test]
    fn oversize_length_excludes_a_line_ending_split_across_chunks() {
        let limits = Summarize {
            whole: 0,
            catalog: 0,
            head: 0,
            tail: 0,
        };
        let mut s = FrameSplitter::with_limits(1, limits);
        let mut got = Vec::new();
        for chunk in [&b"]"[..], b"\r", b"\n"] {
            got.extend(run(&mut s, chunk, Gap::None));
        }
        assert_eq!(got, vec![Err(1)]);
        // The same at the end of the stream, and when the `\r` came after the cap was passed.
        let mut s = FrameSplitter::new(2);
        assert!(run(&mut s, b"abc", Gap::None).is_empty());
        assert!(run(&mut s, b"\r", Gap::None).is_empty());
        let mut last = Vec::new();
        s.flush(|f| {
            if let Split::Oversize(n) = f {
                last.push(n)
            }
        });
        assert_eq!(last, vec![3]);
    }

    #[test]
    fn large_buffers_are_released_after_use() {
        let mut s = FrameSplitter::new(DEFAULT_FRAME_CAP);
        // Not an object, so held whole up to the cap.
        let big = vec![b'x'; 3 * KEEP_BUFFER_BYTES];
        assert!(run(&mut s, &big, Gap::None).is_empty());
        let got = run(&mut s, b"\n", Gap::None);
        assert_eq!(got.len(), 1);
        assert_eq!(s.buffered_capacity(), 0);
    }

    #[test]
    fn gap_resynchronises_at_next_newline() {
        let mut s = FrameSplitter::new(1024);
        assert!(run(&mut s, b"{\"first\":", Gap::None).is_empty());
        // The chunk carrying the end of "first" and the start of "second" was dropped.
        let got = run(&mut s, b"nd\":2}\n{\"third\":3}\n", Gap::InsideLine);
        assert_eq!(got, vec![Ok(b"{\"third\":3}".to_vec())]);
        assert_eq!(
            s.take_discarded(),
            1,
            "the second is lost, its newline was not dropped"
        );
        assert_eq!(s.take_discarded(), 0);
        // A gap, then the session ends inside the message it damaged: lost too.
        assert!(run(&mut s, b"{\"fourth\":", Gap::InsideLine).is_empty());
        s.flush(|_| panic!("a damaged message is never handed on"));
        assert_eq!(s.take_discarded(), 1);
        // A gap with nothing after it before the end: nothing more is lost.
        s.lost();
        s.flush(|_| panic!("nothing to hand on"));
        assert_eq!(s.take_discarded(), 0);
    }

    #[test]
    fn batch_elements_are_found() {
        let f = br#" [ {"a":"x,]"} , {"b":[1,2]},3 ] "#;
        let r = split_batch(f).expect("array");
        let parts: Vec<&[u8]> = r.iter().map(|r| &f[r.clone()]).collect();
        assert_eq!(
            parts,
            vec![&br#"{"a":"x,]"}"#[..], &br#"{"b":[1,2]}"#[..], &b"3"[..]]
        );
        assert_eq!(split_batch(b"[]"), Some(vec![]));
        assert_eq!(split_batch(b"{\"a\":1}"), None);
        assert_eq!(split_batch(b"[1,2"), None);
        assert_eq!(split_batch(b"[1,,2]"), None);
    }

    proptest! {
        /// The mark is found wherever the two pieces are cut, and only within the head.
        #[test]
        fn head_mark_is_found_across_the_seam(
            pre in "[a-z\"{}:,]{0,40}",
            post in "[a-z\"{}:,]{0,40}",
            cut in 0usize..100,
            head in 0usize..100,
        ) {
            let text = format!("{pre}\"tools\"{post}");
            let b = text.as_bytes();
            let cut = cut.min(b.len());
            let (x, y) = b.split_at(cut);
            let want = memchr::memmem::find(&b[..b.len().min(head)], CATALOG_MARK).is_some();
            prop_assert_eq!(head_has_mark(x, y, head), want);
        }

        #[test]
        fn any_chunking_yields_the_same_frames(
            frames in prop::collection::vec("[a-z{}\":,]{1,40}", 0..20),
            cuts in prop::collection::vec(0usize..2000, 0..10),
        ) {
            let mut stream = Vec::new();
            for f in &frames {
                stream.extend_from_slice(f.as_bytes());
                stream.push(b'\n');
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (stream.len() + 1)).collect();
            cuts.sort_unstable();
            let mut s = FrameSplitter::new(1024);
            let mut got = Vec::new();
            let mut prev = 0;
            for c in cuts.into_iter().chain(std::iter::once(stream.len())) {
                got.extend(run(&mut s, &stream[prev..c], Gap::None));
                prev = c;
            }
            let want: Vec<Result<Vec<u8>, u64>> =
                frames.iter().map(|f| Ok(f.as_bytes().to_vec())).collect();
            prop_assert_eq!(got, want);
        }

        /// Chunks lost as the tap loses them (a drop marks the next chunk, or the end, as after
        /// a gap; with `line_ends`, a drop that ended with a newline is passed on as such, as
        /// the stdio observer does): every frame handed on is one that was sent, whole, and
        /// every frame sent is handed on or counted lost once, by the newlines in the dropped
        /// chunks or by the splitter's resynchronisation.
        #[test]
        fn every_frame_is_handed_on_whole_or_counted_lost(
            n in 0usize..30,
            cuts in prop::collection::vec(0usize..4000, 0..16),
            dropped in prop::collection::vec(any::<bool>(), 17),
            line_ends in any::<bool>(),
        ) {
            let frames: Vec<Vec<u8>> =
                (0..n).map(|i| format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(i % 7)).into_bytes()).collect();
            let mut stream = Vec::new();
            for f in &frames {
                stream.extend_from_slice(f);
                stream.push(b'\n');
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (stream.len() + 1)).collect();
            cuts.push(stream.len());
            cuts.sort_unstable();
            let mut s = FrameSplitter::new(1024);
            let (mut handed, mut lost_newlines, mut gap, mut prev) = (Vec::new(), 0usize, false, 0);
            let mut gap_ended_line = false;
            for (k, c) in cuts.into_iter().enumerate() {
                let chunk = &stream[prev..c];
                prev = c;
                if chunk.is_empty() {
                    continue;
                }
                if dropped[k] {
                    lost_newlines += chunk.iter().filter(|&&b| b == b'\n').count();
                    gap = true;
                    gap_ended_line = chunk.ends_with(b"\n");
                } else {
                    let gap = Gap::of(std::mem::take(&mut gap), line_ends && gap_ended_line);
                    handed.extend(run(&mut s, chunk, gap));
                }
            }
            if gap {
                s.lost();
            }
            s.flush(|f| match f {
                Split::Frame(b) => handed.push(Ok(b.to_vec())),
                _ => handed.push(Err(0)),
            });
            for f in &handed {
                prop_assert!(matches!(f, Ok(b) if frames.contains(b)), "a damaged frame: {:?}", f);
            }
            prop_assert_eq!(handed.len() + lost_newlines + s.take_discarded() as usize, n);
        }
    }

    /// After a drop that ended a line, the chunk starts a message and what was held is gone;
    /// a chunk that continues a trimmed frame (bytes skipped right before it) cannot follow such
    /// a drop, and were it to, its bytes up to the first newline are discarded as after any gap.
    #[test]
    fn a_gap_at_a_line_end_keeps_the_chunk_unless_it_continues_a_trimmed_frame() {
        for (skipped, want, discarded) in [
            (0, vec![&b"{\"a\":1}"[..], b"{\"b\":2}"], 0),
            (9, vec![b"{\"b\":2}"], 1),
        ] {
            let mut s = FrameSplitter::new(1024);
            assert!(run(&mut s, b"{\"held\":", Gap::None).is_empty());
            let mut got = Vec::new();
            s.push(
                b"{\"a\":1}\n{\"b\":2}\n",
                Gap::AtLineEnd,
                skipped,
                |f| match f {
                    Split::Frame(b) => got.push(b.to_vec()),
                    other => panic!("{other:?}"),
                },
            );
            assert_eq!(got, want, "skipped {skipped}");
            assert_eq!(s.take_discarded(), discarded, "skipped {skipped}");
            assert!(s.is_empty());
        }
    }

    #[test]
    fn without_summaries_a_large_object_is_one_whole_frame_and_the_splitter_empties() {
        let mut s = FrameSplitter::without_summaries(DEFAULT_FRAME_CAP);
        let mut frame = big_result(7, 2 * WHOLE_FRAME_BYTES, false);
        frame.push(b'\n');
        let (a, b) = frame.split_at(1000);
        assert!(run(&mut s, a, Gap::None).is_empty());
        assert!(!s.is_empty(), "part of a frame held");
        let got = run(&mut s, b, Gap::None);
        assert_eq!(got, vec![Ok(frame[..frame.len() - 1].to_vec())]);
        assert!(s.is_empty());
    }
}
