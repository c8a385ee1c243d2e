//! Arbitrary byte streams, cut at arbitrary points, through the two framers of the observer's
//! input: the newline splitter (stdio, `observe::frame`) and the SSE parser (HTTP,
//! `observe::sse`); every frame they yield goes through `split_batch` and the peek.
//!
//! Input: `data[0] % 64` control bytes follow `data[0]`, the rest is the stream. The first
//! control byte picks the limits (the real ones, or small ones so every path is reachable with
//! short inputs); the others, in pairs, give the chunk sizes (cycled) and, rarely, a gap (the
//! tap dropped chunks) or a skip (the tap passed over the middle of a large frame).
//!
//! Asserts: no panic; a whole frame is never longer than the cap; a summary skeleton is no
//! longer than the head and tail it is built from; the splitter's memory stays within its
//! bounds after every chunk; and without gaps, the splitter yields exactly one result per line,
//! with the line's exact length (skipped bytes included, line ending excluded), the line's own
//! bytes for a whole frame, and a whole frame for every line within the summary threshold.

#![no_main]

use bounded_observe_mcp::observe::frame::{
    split_batch, FrameSplitter, Gap, Split, Summarize, DEFAULT_FRAME_CAP, SUMMARIZE,
};
use bounded_observe_mcp::observe::peek::peek;
use bounded_observe_mcp::observe::sse::{SseParser, MAX_EVENT_DATA};
use libfuzzer_sys::fuzz_target;

/// One result of the splitter, owned.
#[derive(Debug, PartialEq)]
enum Out {
    Frame(Vec<u8>),
    Summary(usize, u64),
    Oversize(u64),
}

/// A line of the stream as the reference model sees it.
#[derive(Debug, Default)]
struct Line {
    /// The bytes seen (skipped ones are not).
    real: Vec<u8>,
    /// Length including skipped bytes.
    len: u64,
    skipped: bool,
    /// The line's last byte so far is a `\r` that was seen (not skipped).
    ends_cr: bool,
}

impl Line {
    /// The length without a trailing `\r`.
    fn trimmed_len(&self) -> u64 {
        self.len - u64::from(self.ends_cr)
    }
}

struct Config {
    cap: usize,
    head: usize,
    tail: usize,
    whole: usize,
    limits: Summarize,
}

fn config(c: u8, extra: &[u8]) -> Config {
    let get = |i: usize| extra.get(i).copied().unwrap_or(0) as usize;
    let (cap, limits) = if c & 1 == 0 {
        (DEFAULT_FRAME_CAP, SUMMARIZE)
    } else {
        let limits = Summarize {
            whole: get(0) * 16,
            catalog: get(1) * 32,
            head: get(2),
            tail: get(3),
        };
        (1 + (c as usize >> 1) * 64, limits)
    };
    // The clamping `FrameSplitter::with_limits` documents.
    let head = limits.head.max(1);
    let tail = limits.tail.max(1);
    let whole = limits.whole.clamp(head + tail, cap.max(head + tail));
    Config {
        cap,
        head,
        tail,
        whole,
        limits,
    }
}

fn check_frame(f: &[u8]) {
    if let Some(ranges) = split_batch(f) {
        let mut prev = 0;
        for r in ranges {
            assert!(r.start >= prev && r.start < r.end && r.end <= f.len());
            prev = r.end;
            let _ = peek(&f[r]);
        }
    }
    let _ = peek(f);
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = (n as usize % 64).min(rest.len());
    let (control, stream) = rest.split_at(n);
    let (cfg_byte, specs) = control.split_first().map_or((0, &[][..]), |(c, s)| (*c, s));
    let cfg = config(cfg_byte, specs);
    let specs: Vec<(u8, u8)> = specs.chunks_exact(2).map(|p| (p[0], p[1])).collect();

    let mut splitter = FrameSplitter::with_limits(cfg.cap, cfg.limits);
    let mut sse = SseParser::new();
    let mut model_ok = true;
    let mut line = Line::default();
    let mut at = 0usize;
    let mut i = 0usize;
    while at < stream.len() {
        let (s, f) = specs
            .get(i % specs.len().max(1))
            .copied()
            .unwrap_or((0xff, 0));
        i += 1;
        let len = if s & 0x80 == 0 {
            (s as usize & 0x7f) + 1
        } else {
            ((s as usize & 0x7f) + 1) * 256
        };
        let chunk = &stream[at..stream.len().min(at + len)];
        at += chunk.len();
        let gap = f == 0xff;
        let skipped = if (0xf0..0xff).contains(&f) {
            u64::from(f - 0xef) * 1000
        } else {
            0
        };

        // The reference: the lines this chunk completes.
        let mut expected: Vec<Line> = Vec::new();
        if gap {
            model_ok = false;
        }
        if model_ok {
            if skipped > 0 {
                line.len += skipped;
                line.skipped = true;
                line.ends_cr = false;
            }
            for &b in chunk {
                if b == b'\n' {
                    expected.push(std::mem::take(&mut line));
                } else {
                    line.real.push(b);
                    line.len += 1;
                    line.ends_cr = b == b'\r';
                }
            }
        }

        let mut got = Vec::new();
        splitter.push(chunk, Gap::of(gap, false), skipped, |s| {
            got.push(owned(&cfg, s))
        });
        let bound = 2 * cfg.cap.min(2 * stream.len() + 64) + 2 * cfg.head + 4 * cfg.tail + 64;
        assert!(
            splitter.buffered_capacity() <= bound,
            "splitter holds {} bytes, bound {bound}",
            splitter.buffered_capacity()
        );
        if model_ok {
            compare(&cfg, &expected, &got, false);
        }

        if gap {
            sse.lost_bytes();
        }
        sse.feed(chunk, &mut |ev| match ev {
            Split::Frame(data) => {
                assert!(data.len() <= MAX_EVENT_DATA);
                check_frame(data);
            }
            Split::Summary { skeleton, .. } => {
                assert!(skeleton.len() <= SUMMARIZE.head + SUMMARIZE.tail + 1);
                check_frame(skeleton);
            }
            Split::Oversize(_) => {}
        });
    }
    let mut got = Vec::new();
    splitter.flush(|s| got.push(owned(&cfg, s)));
    if model_ok {
        let last = std::mem::take(&mut line);
        let expected: Vec<Line> = if last.skipped || last.trimmed_len() > 0 {
            vec![last]
        } else {
            vec![]
        };
        compare(&cfg, &expected, &got, true);
    }
    // A buffer is kept for the next frame only up to 1 MiB (`KEEP_BUFFER_BYTES`).
    assert!(
        splitter.buffered_capacity() <= 1024 * 1024,
        "{} bytes held after flush",
        splitter.buffered_capacity()
    );
});

fn owned(cfg: &Config, s: Split<'_>) -> Out {
    match s {
        Split::Frame(f) => {
            assert!(
                f.len() <= cfg.cap,
                "frame of {} bytes over cap {}",
                f.len(),
                cfg.cap
            );
            assert!(!f.contains(&b'\n'));
            check_frame(f);
            Out::Frame(f.to_vec())
        }
        Split::Summary { skeleton, len } => {
            assert!(skeleton.len() <= cfg.head + cfg.tail + 1);
            check_frame(skeleton);
            Out::Summary(skeleton.len(), len)
        }
        Split::Oversize(n) => Out::Oversize(n),
    }
}

fn compare(cfg: &Config, expected: &[Line], got: &[Out], flushed: bool) {
    assert_eq!(
        expected.len(),
        got.len(),
        "lines {:?} gave {got:?} (flush: {flushed})",
        expected.iter().map(|l| l.len).collect::<Vec<_>>()
    );
    for (want, got) in expected.iter().zip(got) {
        let len = want.trimmed_len();
        match got {
            Out::Frame(f) => {
                assert!(!want.skipped, "a line with skipped bytes came out whole");
                let real = want.real.strip_suffix(b"\r").unwrap_or(&want.real);
                assert_eq!(f.as_slice(), real);
            }
            Out::Summary(_, n) | Out::Oversize(n) => {
                assert_eq!(*n, len, "length of a {got:?} line (flush: {flushed})");
                let untrimmed = want.len as usize;
                assert!(
                    want.skipped || untrimmed > cfg.whole.min(cfg.cap),
                    "a line of {untrimmed} bytes (whole {}, cap {}) was not passed whole",
                    cfg.whole,
                    cfg.cap
                );
            }
        }
    }
}
