//! The tap: how forwarded bytes reach the observer without slowing the relay.
//!
//! Owns [`Direction`], [`TapChunk`] and the bounded channel between a relay loop and the
//! observer. A relay loop calls [`TapSender::offer`] *after* it has written the chunk onward;
//! `offer` never blocks and never allocates beyond the `Bytes` it is given: when the channel is
//! full the chunk is counted as dropped and the next chunk that does get through is marked
//! `after_gap`, so the frame splitter can resynchronise at the next newline instead of gluing
//! two halves of different messages together. Must never block, never parse, never log per chunk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::mpsc;

/// Which way a message travels. Correlation is keyed by direction and id (DESIGN §2a).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// Agent → server (our stdin → child's stdin; HTTP request bodies).
    ClientToServer,
    /// Server → agent (child's stdout → our stdout; HTTP response bodies and GET streams).
    ServerToClient,
}

impl Direction {
    pub fn index(self) -> usize {
        match self {
            Direction::ClientToServer => 0,
            Direction::ServerToClient => 1,
        }
    }
    pub fn label(self) -> &'static str {
        match self {
            Direction::ClientToServer => "client→server",
            Direction::ServerToClient => "server→client",
        }
    }
}

/// One read's worth of forwarded bytes, stamped on the relay thread right after the read.
#[derive(Debug, Clone)]
pub struct TapChunk {
    pub dir: Direction,
    /// Monotonic time the bytes were read, taken on the relay thread (not when observed).
    pub seen: Instant,
    pub bytes: Bytes,
    /// One or more chunks before this one in the same direction were dropped.
    pub after_gap: bool,
}

/// What travels through the tap channel.
#[derive(Debug, Clone)]
pub enum TapMsg {
    Chunk(TapChunk),
    /// The direction reached EOF (lets the splitter flush a last line with no newline).
    Closed {
        dir: Direction,
        seen: Instant,
    },
}

/// Counters shared by both senders; read at exit for `--debug`.
#[derive(Debug, Default)]
pub struct TapStats {
    pub offered_chunks: [AtomicU64; 2],
    pub offered_bytes: [AtomicU64; 2],
    pub dropped_chunks: [AtomicU64; 2],
    pub dropped_bytes: [AtomicU64; 2],
}

/// Capacity of the tap channel in chunks. A relay read is at most [`crate::proxy::stdio::READ_BUF`]
/// bytes, so this bounds queued memory at 64 × 64 KiB = 4 MiB when the observer lags; small
/// messages queue far less.
pub const TAP_CAPACITY: usize = 64;

/// One direction's sending half, owned by that direction's relay loop.
pub struct TapSender {
    tx: mpsc::Sender<TapMsg>,
    dir: Direction,
    gap: bool,
    stats: Arc<TapStats>,
}

pub type TapReceiver = mpsc::Receiver<TapMsg>;

/// Builds the tap: a sender per direction and the observer's receiver.
pub fn tap(capacity: usize) -> (TapSender, TapSender, TapReceiver, Arc<TapStats>) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let stats = Arc::new(TapStats::default());
    let c2s = TapSender {
        tx: tx.clone(),
        dir: Direction::ClientToServer,
        gap: false,
        stats: stats.clone(),
    };
    let s2c = TapSender {
        tx,
        dir: Direction::ServerToClient,
        gap: false,
        stats: stats.clone(),
    };
    (c2s, s2c, rx, stats)
}

impl TapSender {
    /// Hands a copy of forwarded bytes to the observer. Never blocks; counts a drop when full.
    pub fn offer(&mut self, seen: Instant, bytes: Bytes) {
        let i = self.dir.index();
        let len = bytes.len() as u64;
        self.stats.offered_chunks[i].fetch_add(1, Ordering::Relaxed);
        self.stats.offered_bytes[i].fetch_add(len, Ordering::Relaxed);
        let msg = TapMsg::Chunk(TapChunk {
            dir: self.dir,
            seen,
            bytes,
            after_gap: self.gap,
        });
        match self.tx.try_send(msg) {
            Ok(()) => self.gap = false,
            Err(_) => {
                self.gap = true;
                self.stats.dropped_chunks[i].fetch_add(1, Ordering::Relaxed);
                self.stats.dropped_bytes[i].fetch_add(len, Ordering::Relaxed);
            }
        }
    }

    /// Signals EOF for this direction. Best effort: if the channel is full the observer still
    /// learns of the end when the channel closes.
    pub fn close(self, seen: Instant) {
        let _ = self.tx.try_send(TapMsg::Closed {
            dir: self.dir,
            seen,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_channel_counts_drop_and_marks_gap() {
        let (mut c2s, _s2c, mut rx, stats) = tap(1);
        let now = Instant::now();
        c2s.offer(now, Bytes::from_static(b"a"));
        c2s.offer(now, Bytes::from_static(b"bb"));
        assert_eq!(stats.dropped_chunks[0].load(Ordering::Relaxed), 1);
        assert_eq!(stats.dropped_bytes[0].load(Ordering::Relaxed), 2);
        let Some(TapMsg::Chunk(first)) = rx.try_recv().ok() else {
            panic!("first chunk must arrive")
        };
        assert!(!first.after_gap);
        c2s.offer(now, Bytes::from_static(b"c"));
        let Some(TapMsg::Chunk(third)) = rx.try_recv().ok() else {
            panic!("third chunk must arrive")
        };
        assert!(third.after_gap, "chunk after a drop is marked");
        assert_eq!(&third.bytes[..], b"c");
    }
}
