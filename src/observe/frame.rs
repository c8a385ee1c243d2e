//! Frame splitting: turns the tap's chunks of one direction back into newline-delimited frames.
//!
//! Goes in: chunks as the relay read them (any size, any split point, possibly with gaps where
//! the tap dropped chunks). Comes out: whole frames (one JSON-RPC message or batch, without the
//! newline and a trailing `\r`), or, for a frame longer than the cap, only its length. Memory is
//! bounded by the cap: a frame is held only until its newline, a frame over the cap is measured
//! and discarded as it streams past, and a buffer grown for a large frame is released after use.
//! Never parses JSON (apart from [`split_batch`], which only finds element boundaries).

use std::ops::Range;

/// Largest frame held for parsing, in bytes. Large enough that a 50 MB tool result is still
/// correlated; beyond it a frame is counted and measured, not parsed (its call then ends as a
/// timeout). Bounds the observer's buffer per direction.
pub const DEFAULT_FRAME_CAP: usize = 64 * 1024 * 1024;

/// A buffer that grew beyond this for one large frame is given back after that frame, so a
/// single 50 MB response does not pin 50 MB for the rest of the session.
const KEEP_BUFFER_BYTES: usize = 1024 * 1024;

/// One result of splitting.
#[derive(Debug, PartialEq, Eq)]
pub enum Split<'a> {
    /// A complete frame without its line ending (empty for a blank line: still a frame for the
    /// counters, never a message).
    Frame(&'a [u8]),
    /// A frame longer than the cap ended; only its length (without line ending) is known.
    Oversize(u64),
}

/// Per-direction newline splitter.
#[derive(Debug)]
pub struct FrameSplitter {
    buf: Vec<u8>,
    cap: usize,
    /// `Some(n)`: inside an oversize frame, `n` bytes seen so far.
    oversize: Option<u64>,
    /// Skipping the damaged remainder of a frame after a gap, up to the next newline.
    resync: bool,
}

impl Default for FrameSplitter {
    fn default() -> Self {
        FrameSplitter::new(DEFAULT_FRAME_CAP)
    }
}

fn trim_cr(f: &[u8]) -> &[u8] {
    f.strip_suffix(b"\r").unwrap_or(f)
}

impl FrameSplitter {
    pub fn new(cap: usize) -> Self {
        FrameSplitter {
            buf: Vec::new(),
            cap: cap.max(1),
            oversize: None,
            resync: false,
        }
    }

    /// Feeds one chunk; `out` is called for every frame the chunk completes. `after_gap`: chunks
    /// before this one were lost, so whatever is buffered is damaged and this chunk's bytes up to
    /// its first newline belong to a damaged frame: both are discarded.
    pub fn push(&mut self, chunk: &[u8], after_gap: bool, mut out: impl FnMut(Split<'_>)) {
        if after_gap {
            self.buf.clear();
            self.oversize = None;
            self.resync = true;
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
                }
                continue;
            }
            if let Some(n) = self.oversize.as_mut() {
                *n += seg.len() as u64;
                if complete {
                    let total = trimmed_len(*n, seg);
                    self.oversize = None;
                    out(Split::Oversize(total));
                }
                continue;
            }
            if self.buf.len() + seg.len() > self.cap {
                self.oversize = Some((self.buf.len() + seg.len()) as u64);
                self.release();
                if complete {
                    let total = trimmed_len(self.oversize.take().unwrap_or(0), seg);
                    out(Split::Oversize(total));
                }
                continue;
            }
            if !complete {
                self.buf.extend_from_slice(seg);
                continue;
            }
            if self.buf.is_empty() {
                // Common case: the whole frame is inside this chunk; no copy.
                out(Split::Frame(trim_cr(seg)));
            } else {
                self.buf.extend_from_slice(seg);
                out(Split::Frame(trim_cr(&self.buf)));
                self.release();
            }
        }
    }

    /// The direction closed: a last frame without a newline is complete now.
    pub fn flush(&mut self, mut out: impl FnMut(Split<'_>)) {
        if self.resync {
            self.resync = false;
            self.buf.clear();
            return;
        }
        if let Some(n) = self.oversize.take() {
            out(Split::Oversize(n));
            return;
        }
        if !self.buf.is_empty() {
            let f = trim_cr(&self.buf);
            if !f.is_empty() {
                out(Split::Frame(f));
            }
        }
        self.release();
    }

    /// Bytes currently held (for tests of the memory bound).
    pub fn buffered_capacity(&self) -> usize {
        self.buf.capacity()
    }

    fn release(&mut self) {
        self.buf.clear();
        if self.buf.capacity() > KEEP_BUFFER_BYTES {
            self.buf = Vec::new();
        }
    }
}

/// Oversize length without a trailing `\r` (the last segment tells whether it ended in one).
fn trimmed_len(n: u64, last_seg: &[u8]) -> u64 {
    if last_seg.ends_with(b"\r") {
        n.saturating_sub(1)
    } else {
        n
    }
}

/// The next newline. A vectorised search: for a 5 MB frame this scan used to be the largest
/// single cost of observing it (a byte-at-a-time loop, ~40 % of the observer's CPU).
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

    fn run(s: &mut FrameSplitter, chunk: &[u8], gap: bool) -> Vec<Result<Vec<u8>, u64>> {
        let mut v = Vec::new();
        s.push(chunk, gap, |f| match f {
            Split::Frame(b) => v.push(Ok(b.to_vec())),
            Split::Oversize(n) => v.push(Err(n)),
        });
        v
    }

    #[test]
    fn splits_on_newline_and_tolerates_crlf() {
        let mut s = FrameSplitter::new(1024);
        let got = run(&mut s, b"{\"a\":1}\r\n{\"b\"", false);
        assert_eq!(got, vec![Ok(b"{\"a\":1}".to_vec())]);
        let got = run(&mut s, b":2}\n\n", false);
        assert_eq!(got, vec![Ok(b"{\"b\":2}".to_vec()), Ok(vec![])]);
    }

    #[test]
    fn last_frame_without_newline_is_flushed() {
        let mut s = FrameSplitter::new(1024);
        assert!(run(&mut s, b"{\"x\":1}", false).is_empty());
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
        let mut got = run(&mut s, b"0123456789ABC", false);
        assert!(got.is_empty());
        assert!(s.buffered_capacity() <= 16);
        got.extend(run(&mut s, b"DEF\r\nok\n", false));
        assert_eq!(got, vec![Err(16), Ok(b"ok".to_vec())]);
    }

    #[test]
    fn large_buffers_are_released_after_use() {
        let mut s = FrameSplitter::new(DEFAULT_FRAME_CAP);
        let big = vec![b'x'; 3 * KEEP_BUFFER_BYTES];
        assert!(run(&mut s, &big, false).is_empty());
        let got = run(&mut s, b"\n", false);
        assert_eq!(got.len(), 1);
        assert_eq!(s.buffered_capacity(), 0);
    }

    #[test]
    fn gap_resynchronises_at_next_newline() {
        let mut s = FrameSplitter::new(1024);
        assert!(run(&mut s, b"{\"first\":", false).is_empty());
        // The chunk carrying the end of "first" and the start of "second" was dropped.
        let got = run(&mut s, b"nd\":2}\n{\"third\":3}\n", true);
        assert_eq!(got, vec![Ok(b"{\"third\":3}".to_vec())]);
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
                got.extend(run(&mut s, &stream[prev..c], false));
                prev = c;
            }
            let want: Vec<Result<Vec<u8>, u64>> =
                frames.iter().map(|f| Ok(f.as_bytes().to_vec())).collect();
            prop_assert_eq!(got, want);
        }
    }
}
