//! The tap: how forwarded bytes reach the observer without slowing the relay.
//!
//! Owns [`Direction`], [`TapChunk`] and the bounded queue between a relay loop and the
//! observer. A relay loop calls [`TapSender::offer`] *after* it has written the chunk onward;
//! `offer` never waits on the observer and allocates nothing beyond the `Bytes` it is given (the
//! queue's storage is swapped back and forth with the observer's, so it is reused): when the
//! queue holds [`TAP_BUDGET_BYTES`] the chunk is counted as dropped and the next chunk that does
//! get through is marked `after_gap`, so the frame splitter can resynchronise at the next newline
//! instead of gluing two halves of different messages together (at once, when the dropped bytes
//! ended with one: [`TapChunk::gap_ended_line`]). The bound is in bytes, not chunks, so a burst
//! of thousands of small messages is absorbed while memory stays bounded.
//! A sender wakes the observer only when it is asleep with nothing to do, and the client's
//! sender only past a backlog ([`CLIENT_WAKE_BYTES`]); while it is busy or lingering (see
//! `observe::run_tap_observer`) offers cost a lock and a push, no syscall.
//! The sender also finds newlines (only newlines) so that of a frame too large for the
//! observer to read whole only the head and tail cross (see [`Trim`]).
//! Must never block, never parse JSON, never log per chunk.

pub mod http;
pub mod large;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::Notify;

use crate::lock::lock;
use large::{head_has_mark, Summarize, CATALOG_MARK, SUMMARIZE};
#[cfg(doc)]
use large::{CATALOG_FRAME_BYTES, SUMMARY_HEAD, SUMMARY_TAIL, WHOLE_FRAME_BYTES};

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
    /// With `after_gap`: the last byte dropped was a newline, so this chunk starts a message,
    /// and none of its bytes belong to the one the drop damaged.
    pub gap_ended_line: bool,
    /// Bytes of the current frame passed over right before this chunk: the middle of a frame
    /// too large for the observer to read whole (see [`Trim`]). Not a gap: nothing was lost
    /// that the observer needs, and the frame's length stays exact.
    pub skipped: u64,
}

/// What travels through the tap channel.
#[derive(Debug, Clone)]
pub enum TapMsg {
    Chunk(TapChunk),
    /// The direction reached EOF (lets the splitter flush a last line with no newline).
    /// `after_gap`: chunks were dropped since the last one queued, so what the splitter holds
    /// is damaged, and answers may have been lost, as after a gap in [`TapChunk::after_gap`].
    Closed {
        dir: Direction,
        seen: Instant,
        after_gap: bool,
    },
}

/// Where the bytes a relay loop has read stand, for the observer ([`TapReceiver::arrival`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Every byte read has been handed over by [`TapReceiver::drain`]: a frame of the other
    /// direction cannot be overtaken by one of this direction that it caused or answered.
    Settled,
    /// Chunks are queued, the first of them read at this instant: the observer's next look
    /// takes them, and a direction's chunks come in the order they were read.
    Queued(Instant),
    /// Nothing is queued, but bytes read at this instant are being forwarded (see
    /// [`TapSender::begin`]): the relay thread may be preempted or blocked before it offers
    /// them, so this is the only state in which the observer must wait without knowing for how
    /// long.
    Forwarding(Instant),
}

/// Counters shared by both senders; read at exit for `--debug`.
#[derive(Debug, Default)]
pub struct TapStats {
    pub offered_chunks: [AtomicU64; 2],
    pub offered_bytes: [AtomicU64; 2],
    pub dropped_chunks: [AtomicU64; 2],
    pub dropped_bytes: [AtomicU64; 2],
    /// Newlines in the dropped client→server bytes: each ends a client message the observer
    /// never reads whole. (A lost answer is accounted through its call, so the other direction
    /// is not counted.)
    pub dropped_client_messages: AtomicU64,
    /// Middles of large frames not passed on (see [`Trim`]).
    pub skipped_bytes: [AtomicU64; 2],
}

impl TapStats {
    /// Bytes the relay has handed the tap so far in `dir`, less those dropped and the skipped
    /// middles of large frames (see [`TapReceiver::passed_bytes`]).
    pub fn passed_bytes(&self, dir: Direction) -> u64 {
        let i = dir.index();
        self.offered_bytes[i]
            .load(Ordering::Relaxed)
            .saturating_sub(self.dropped_bytes[i].load(Ordering::Relaxed))
            .saturating_sub(self.skipped_bytes[i].load(Ordering::Relaxed))
    }
}

/// Most chunks queued at once. Only a backstop against a flood of tiny reads: the byte budget
/// ([`TAP_BUDGET_BYTES`]) is the real bound, and it must be the one that trips, so a burst of
/// small messages queued while the observer runs behind the relay is absorbed, not dropped.
pub const TAP_CAPACITY: usize = 65_536;

/// Most bytes queued at once (chunk bytes plus [`CHUNK_OVERHEAD`] per chunk). The observer runs
/// at a lower CPU priority than the relay (see `crate::pace`), so on a busy CPU it
/// falls behind during a burst and catches up in the gaps; this is how far behind it may fall.
/// 8 MiB holds a 20,000-call pipelined burst of small `tools/call` messages (~6 MB) and more than
/// one 5 MB frame; it is also the most the tap can ever add to the wrapper's memory.
pub const TAP_BUDGET_BYTES: usize = 8 * 1024 * 1024;

/// Bytes queued (as [`TAP_BUDGET_BYTES`] counts them) past which a client's chunk wakes a
/// sleeping observer; below it only the server's chunks do. A request needs observing no sooner
/// than its answer: the answer's chunk wakes the observer, which then takes both, so a call
/// that comes alone costs one wake-up instead of two (`bench/README.md`, "One wake-up a
/// call"). Timestamps are the relay's, so no `dur_ms` changes. What else a client sends alone
/// (a notification, its answer to a server's request) is observed at the next server chunk,
/// the observer's next timeout check (once a second) or the session's end; a client that sends
/// much while the server is silent (a flood of calls it never answers) wakes the observer at
/// this backlog, far below the budget.
pub const CLIENT_WAKE_BYTES: usize = 256 * 1024;

/// What one queued chunk costs beyond its bytes (queue slot, `Bytes` header, allocator
/// rounding): charged against the budget so a flood of tiny chunks is bounded too.
pub const CHUNK_OVERHEAD: usize = 64;

/// The queue shared by both senders and the observer.
struct Shared {
    state: Mutex<Queue>,
    /// Wakes the observer: only when it said it is waiting, when a sender closes, or goes away.
    wake: Notify,
    stats: Arc<TapStats>,
    max_chunks: usize,
    max_bytes: usize,
    /// Per direction: the relay has read bytes it has not offered yet (see
    /// [`TapSender::begin`]).
    active: [AtomicBool; 2],
    /// Per direction: when those bytes were read, in nanoseconds after `epoch`.
    active_since: [AtomicU64; 2],
    epoch: Instant,
}

struct Queue {
    msgs: VecDeque<TapMsg>,
    /// Bytes charged for what `msgs` holds (chunk bytes plus [`CHUNK_OVERHEAD`] each).
    bytes: usize,
    chunks: usize,
    /// When the first chunk queued per direction was read (see [`Arrival::Queued`]).
    first_seen: [Option<Instant>; 2],
    senders: usize,
    /// The observer found the queue empty and is about to sleep until woken.
    waiting: bool,
}

/// One direction's sending half, owned by that direction's relay loop.
pub struct TapSender {
    shared: Arc<Shared>,
    dir: Direction,
    /// Chunks were dropped since the last one queued: `Some(true)` when the last of them ended
    /// with a newline.
    gap: Option<bool>,
    /// `None`: every chunk passes whole (switched off for the benchmark, see
    /// [`TapSender::set_trim`]).
    trim: Option<Trim>,
}

/// The sender's view of frame boundaries, so that only what the observer reads of a large
/// message crosses the tap. Every frame's first [`SUMMARY_HEAD`] bytes are passed at once. Beyond
/// that a JSON object frame's chunks are held (zero-copy, they are the relay's own read
/// buffers) until its newline: a frame that ends within [`WHOLE_FRAME_BYTES`] (or
/// [`CATALOG_FRAME_BYTES`] when its head holds [`CATALOG_MARK`], the same rule the observer's
/// splitter applies) is then passed whole, a longer one only with its last [`SUMMARY_TAIL`] or
/// more bytes, the middle counted in [`TapChunk::skipped`]. A 50 MB tool result thus costs the
/// observer (and the tap's budget) what a message of a few hundred KiB does. Frames that are not JSON objects (batches,
/// non-JSON lines) pass whole as before. Costs the relay thread one newline search per chunk
/// (~9 µs per MB), on bytes it just read and that are still in cache.
#[derive(Debug)]
struct Trim {
    limits: Summarize,
    /// Bytes of the current frame read so far.
    frame_len: u64,
    /// The current frame's first non-blank byte, once seen.
    first: Option<u8>,
    held: VecDeque<(Instant, Bytes)>,
    held_bytes: usize,
    /// Bytes of the current frame dropped from the front of `held`.
    skipped: u64,
    /// The current frame's head holds [`CATALOG_MARK`].
    marked: bool,
    /// The last bytes of the current frame's head seen so far, in case the mark straddles two
    /// reads.
    carry: [u8; CARRY],
    carry_len: usize,
}

/// Bytes of a head kept between reads: one less than the mark, so a straddling mark is found.
const CARRY: usize = CATALOG_MARK.len() - 1;

impl Default for Trim {
    fn default() -> Self {
        Trim::new(SUMMARIZE)
    }
}

impl Trim {
    fn new(limits: Summarize) -> Trim {
        Trim {
            limits,
            frame_len: 0,
            first: None,
            held: VecDeque::new(),
            held_bytes: 0,
            skipped: 0,
            marked: false,
            carry: [0; CARRY],
            carry_len: 0,
        }
    }

    /// Largest the current frame may grow and still be passed whole.
    fn limit(&self) -> u64 {
        if self.marked {
            self.limits.catalog as u64
        } else {
            self.limits.whole as u64
        }
    }

    /// Looks for [`CATALOG_MARK`] in `piece`, the current frame's bytes from offset `at`, as far
    /// as they lie within its head.
    fn scan_head(&mut self, at: u64, piece: &[u8]) {
        let head = self.limits.head as u64;
        // An empty piece (a chunk ending with its frame's newline, the usual read) changes
        // nothing: the carry alone is shorter than the mark. Returning here spares the relay
        // thread three empty substring searches per chunk (bench/README.md).
        if self.marked || at >= head || piece.is_empty() {
            return;
        }
        let piece = &piece[..piece.len().min((head - at) as usize)];
        let carried = &self.carry[..self.carry_len];
        self.marked = head_has_mark(carried, piece, carried.len() + piece.len());
        if piece.len() >= CARRY {
            self.carry.copy_from_slice(&piece[piece.len() - CARRY..]);
            self.carry_len = CARRY;
        } else {
            let mut joined = [0u8; 2 * CARRY];
            let n = self.carry_len + piece.len();
            joined[..self.carry_len].copy_from_slice(&self.carry[..self.carry_len]);
            joined[self.carry_len..n].copy_from_slice(piece);
            let keep = n.min(CARRY);
            self.carry[..keep].copy_from_slice(&joined[n - keep..n]);
            self.carry_len = keep;
        }
    }

    /// Takes one chunk as read; calls `pass` for every chunk (with the bytes skipped right
    /// before it) the observer should get now, in order.
    fn accept(&mut self, seen: Instant, bytes: Bytes, mut pass: impl FnMut(Instant, Bytes, u64)) {
        // Only the last newline matters (where the next frame starts), and a backward search
        // is also the faster one on this hot path.
        let Some(last_nl) = memchr::memrchr(b'\n', &bytes) else {
            self.note_start(&bytes);
            let before = self.frame_len;
            self.scan_head(before, &bytes);
            self.frame_len += bytes.len() as u64;
            // The chunk reaching past the head is passed too: the observer's head is then
            // complete whatever the read sizes.
            if before < self.limits.head as u64 || self.first != Some(b'{') {
                pass(seen, bytes, 0);
                return;
            }
            self.held_bytes += bytes.len();
            self.held.push_back((seen, bytes));
            if self.frame_len > self.limit() {
                while let Some((_, front)) = self.held.front() {
                    if self.held_bytes - front.len() < self.limits.tail {
                        break;
                    }
                    self.held_bytes -= front.len();
                    self.skipped += front.len() as u64;
                    self.held.pop_front();
                }
            }
            return;
        };
        let skipped = self.release(&mut pass);
        let next = &bytes[last_nl + 1..];
        self.frame_len = next.len() as u64;
        self.first = None;
        self.marked = false;
        self.carry_len = 0;
        self.note_start(next);
        self.scan_head(0, next);
        pass(seen, bytes, skipped);
    }

    /// Passes every held chunk, the first with the bytes skipped before it; returns the skipped
    /// count if nothing was held to carry it.
    fn release(&mut self, pass: &mut impl FnMut(Instant, Bytes, u64)) -> u64 {
        let mut skipped = std::mem::take(&mut self.skipped);
        // Most chunks end a frame that held nothing back; an empty drain still costs its setup
        // and drop on the relay thread.
        if !self.held.is_empty() {
            for (at, b) in self.held.drain(..) {
                pass(at, b, std::mem::take(&mut skipped));
            }
        }
        self.held_bytes = 0;
        skipped
    }

    fn note_start(&mut self, b: &[u8]) {
        if self.first.is_none() {
            self.first = b.iter().copied().find(|c| !c.is_ascii_whitespace());
        }
    }

    /// Everything still held (the direction ended inside a frame).
    fn finish(&mut self, mut pass: impl FnMut(Instant, Bytes, u64)) {
        self.release(&mut pass);
    }
}

/// The observer's receiving half.
pub struct TapReceiver {
    shared: Arc<Shared>,
}

/// What [`TapReceiver::drain`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Messages were moved into the caller's buffer.
    Some,
    /// Nothing queued; senders remain.
    Empty,
    /// Nothing queued and every sender is gone: the tap is finished.
    Closed,
}

/// Messages the tap's queue and the observer's batch each hold before their memory grows, once
/// [`TapReceiver::stock`] has readied them (when the observer first falls behind): the chunks of
/// 2,000 back-to-back calls, more than the observer falls behind in the contended row (about
/// 1,500). A queue that grows does so into fresh pages, each faulted in by the relay thread
/// whose offer first writes it (a µs, inside a call), and copies what it holds on a doubling.
/// With the relay's first blocks faulted in (`proxy::stdio::relay::START_BLOCKS`), contended
/// p99 was 1.41 × the relay's without this and 1.20 with it (18 runs each). About 2 × 256 KiB
/// (a message is 64 bytes), held only by a session that has fallen behind. `bench/README.md`,
/// "A session's first blocks, faulted in before its first read".
pub const STOCK_CHUNKS: usize = 4096;

// What the memory figure for STOCK_CHUNKS assumes.
const _: () = assert!(std::mem::size_of::<TapMsg>() <= 64);

/// An empty queue with room for `n` messages, its memory written once so that filling it up to
/// `n` faults in no page.
fn written_queue(n: usize) -> VecDeque<TapMsg> {
    let filler = TapMsg::Closed {
        dir: Direction::ClientToServer,
        seen: Instant::now(),
        after_gap: false,
    };
    let mut q = VecDeque::with_capacity(n);
    q.extend(std::iter::repeat_n(filler, n));
    q.clear();
    q
}

/// How many messages end in `bytes`: its newlines (a vectorised count).
pub fn messages_ended(bytes: &[u8]) -> u64 {
    memchr::memchr_iter(b'\n', bytes).count() as u64
}

/// Runs `memchr`'s one-time CPU feature detection: about ten `cpuid`s, each a trap to the
/// hypervisor on a VM (6.65 µs each on the benchmark's). Called at the observer thread's start,
/// so that it overlaps the server's start-up instead of running on a relay thread at its first
/// chunk, where the tap's first `memrchr` would run it (bench/README.md, "The server started
/// without a copy").
pub fn detect_cpu_features() {
    std::hint::black_box(memchr::memrchr(b'\n', std::hint::black_box(b"\n")));
}

/// Builds the tap with the default byte budget: a sender per direction and the observer's
/// receiver. `capacity` bounds the number of queued chunks (see [`TAP_CAPACITY`]).
pub fn tap(capacity: usize) -> (TapSender, TapSender, TapReceiver, Arc<TapStats>) {
    tap_with_budget(capacity, TAP_BUDGET_BYTES)
}

/// [`tap`] with an explicit byte budget (tests use a small one to exercise the drop path).
pub fn tap_with_budget(
    capacity: usize,
    budget_bytes: usize,
) -> (TapSender, TapSender, TapReceiver, Arc<TapStats>) {
    let stats = Arc::new(TapStats::default());
    let shared = Arc::new(Shared {
        state: Mutex::new(Queue {
            msgs: VecDeque::new(),
            bytes: 0,
            chunks: 0,
            first_seen: [None, None],
            senders: 2,
            waiting: false,
        }),
        wake: Notify::new(),
        stats: stats.clone(),
        max_chunks: capacity.max(1),
        max_bytes: budget_bytes,
        active: [AtomicBool::new(false), AtomicBool::new(false)],
        active_since: [AtomicU64::new(0), AtomicU64::new(0)],
        epoch: Instant::now(),
    });
    let c2s = TapSender {
        shared: shared.clone(),
        dir: Direction::ClientToServer,
        gap: None,
        trim: Some(Trim::default()),
    };
    let s2c = TapSender {
        shared: shared.clone(),
        dir: Direction::ServerToClient,
        gap: None,
        trim: Some(Trim::default()),
    };
    (c2s, s2c, TapReceiver { shared }, stats)
}

impl TapSender {
    /// Whether only the head and tail of a large frame cross (see [`Trim`]); on by default.
    /// Off, every chunk passes whole (the benchmark's `trim` switch, `crate::config::BenchSwitches`).
    pub fn set_trim(&mut self, on: bool) {
        self.trim = on.then(Trim::default);
    }

    /// The relay read bytes at `seen` and is about to forward them: until
    /// [`TapSender::offer`] (or [`TapSender::settle`]) the observer must assume a frame of this
    /// direction stamped `seen` may still come. Called after the read, *before* the write, so
    /// nothing the other side sends in answer to these bytes can be observed first.
    pub fn begin(&self, seen: Instant) {
        let i = self.dir.index();
        let since = seen.saturating_duration_since(self.shared.epoch).as_nanos();
        // Before `active`: whoever sees `active` set reads this chunk's time or a later one's.
        self.shared.active_since[i].store(since as u64, Ordering::SeqCst);
        self.shared.active[i].store(true, Ordering::SeqCst);
    }

    /// The bytes announced by [`TapSender::begin`] will not be offered (the write failed).
    pub fn settle(&self) {
        self.shared.active[self.dir.index()].store(false, Ordering::SeqCst);
    }

    /// Hands forwarded bytes to the observer (the relay's own buffer, no copy). Never blocks on
    /// the observer (the lock is held only for queue pushes) and wakes it only if it is asleep
    /// waiting for work (a client's chunk only past [`CLIENT_WAKE_BYTES`]); counts a drop when
    /// the chunk or byte bound is reached. The middle of a large frame is held back and skipped
    /// (see [`Trim`]). Returns the bytes read so far of the frame still open after this chunk
    /// (0 with trimming off): how the relay tells a large message in progress.
    pub fn offer(&mut self, seen: Instant, bytes: Bytes) -> u64 {
        let i = self.dir.index();
        let stats = &self.shared.stats;
        stats.offered_chunks[i].fetch_add(1, Ordering::Relaxed);
        stats.offered_bytes[i].fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let (shared, dir, gap) = (&*self.shared, self.dir, &mut self.gap);
        let open = match &mut self.trim {
            Some(trim) => {
                trim.accept(seen, bytes, |at, b, skipped| {
                    Self::enqueue(shared, dir, gap, at, b, skipped)
                });
                trim.frame_len
            }
            None => {
                Self::enqueue(shared, dir, gap, seen, bytes, 0);
                0
            }
        };
        // After the pushes (or drops): whoever sees `active` false finds the chunks queued.
        self.settle();
        open
    }

    /// Queues one chunk for `dir`, or counts it as dropped and marks the next one `after_gap`.
    /// An associated function over the sender's fields, so `offer` can call it from inside
    /// [`Trim::accept`] while the trim state is borrowed.
    fn enqueue(
        shared: &Shared,
        dir: Direction,
        gap: &mut Option<bool>,
        seen: Instant,
        bytes: Bytes,
        skipped: u64,
    ) {
        let i = dir.index();
        let len = bytes.len();
        let stats = &shared.stats;
        if skipped > 0 {
            stats.skipped_bytes[i].fetch_add(skipped, Ordering::Relaxed);
        }
        let charge = len + CHUNK_OVERHEAD;
        let wake = {
            let mut q = lock(&shared.state);
            if q.chunks >= shared.max_chunks || q.bytes + charge > shared.max_bytes {
                Err(bytes)
            } else {
                q.msgs.push_back(TapMsg::Chunk(TapChunk {
                    dir,
                    seen,
                    bytes,
                    after_gap: gap.is_some(),
                    gap_ended_line: *gap == Some(true),
                    skipped,
                }));
                q.bytes += charge;
                q.chunks += 1;
                q.first_seen[i].get_or_insert(seen);
                // A client's message alone waits for the server's next bytes (see
                // CLIENT_WAKE_BYTES): only those, or a backlog, wake a sleeping observer.
                let wake =
                    q.waiting && (dir == Direction::ServerToClient || q.bytes >= CLIENT_WAKE_BYTES);
                if wake {
                    q.waiting = false;
                }
                Ok(wake)
            }
        };
        match wake {
            Ok(wake) => {
                *gap = None;
                if wake {
                    shared.wake.notify_one();
                }
            }
            Err(bytes) => {
                *gap = Some(bytes.last() == Some(&b'\n'));
                stats.dropped_chunks[i].fetch_add(1, Ordering::Relaxed);
                stats.dropped_bytes[i].fetch_add(len as u64, Ordering::Relaxed);
                // Only when the observer is already a budget behind: a vectorised count over
                // bytes the relay has just written, so that the calls lost with them are counted
                // as calls, not only as bytes.
                if dir == Direction::ClientToServer {
                    stats
                        .dropped_client_messages
                        .fetch_add(messages_ended(&bytes), Ordering::Relaxed);
                }
            }
        }
    }

    /// Signals EOF for this direction (never dropped: the marker is not charged against the
    /// bounds) and wakes the observer so the session's end is observed at once.
    pub fn close(mut self, seen: Instant) {
        let (shared, dir, gap) = (&*self.shared, self.dir, &mut self.gap);
        if let Some(trim) = &mut self.trim {
            trim.finish(|at, b, skipped| Self::enqueue(shared, dir, gap, at, b, skipped));
        }
        lock(&self.shared.state).msgs.push_back(TapMsg::Closed {
            dir: self.dir,
            seen,
            after_gap: self.gap.is_some(),
        });
        self.settle();
        // Drop wakes the observer.
    }
}

impl Drop for TapSender {
    fn drop(&mut self) {
        lock(&self.shared.state).senders -= 1;
        self.shared.wake.notify_one();
    }
}

impl Queue {
    /// Moves every queued message to the end of `out` (into an empty `out` by swapping
    /// allocations, so `out`'s is reused) and resets the budget counters; false when nothing was
    /// queued. The one place both receive paths empty the queue, so the byte budget can never be
    /// left charged for taken messages.
    fn take_all(&mut self, out: &mut VecDeque<TapMsg>) -> bool {
        if self.msgs.is_empty() {
            return false;
        }
        if out.is_empty() {
            std::mem::swap(&mut self.msgs, out);
        } else {
            // A swap would leave what `out` held in the queue, where nothing reads it again: the
            // observer's count of unread messages at its cut-off drains into a batch it has not
            // finished, and lost those messages uncounted.
            out.append(&mut self.msgs);
        }
        self.bytes = 0;
        self.chunks = 0;
        self.first_seen = [None, None];
        true
    }
}

impl TapReceiver {
    /// Chunks the relay has offered so far, both directions, dropped ones included: the
    /// observer tells from it whether traffic is flowing.
    pub fn offers(&self) -> u64 {
        let offered = &self.shared.stats.offered_chunks;
        offered[0].load(Ordering::Relaxed) + offered[1].load(Ordering::Relaxed)
    }

    /// Bytes the relay has handed the tap so far, both directions, less those dropped and the
    /// skipped middles of large frames: what the observer will have taken in once the tap is
    /// empty (the trim's held-back bytes included until it passes or skips them).
    pub fn passed_bytes(&self) -> u64 {
        let s = &self.shared.stats;
        s.passed_bytes(Direction::ClientToServer) + s.passed_bytes(Direction::ServerToClient)
    }

    /// Bytes dropped so far, both directions (for `sensor.health`).
    pub fn dropped_bytes(&self) -> u64 {
        let dropped = &self.shared.stats.dropped_bytes;
        dropped[0].load(Ordering::Relaxed) + dropped[1].load(Ordering::Relaxed)
    }

    /// Client messages the tap dropped the end of so far (newlines in its dropped bytes).
    pub fn dropped_client_messages(&self) -> u64 {
        self.shared
            .stats
            .dropped_client_messages
            .load(Ordering::Relaxed)
    }

    /// Gives the tap's queue room for [`STOCK_CHUNKS`] messages in memory already written, and
    /// returns an empty batch with the same, for the observer to drain into: the two swap
    /// allocations at every drain, so both must be ready. Called once, from the observer's
    /// thread: it writes 2 × [`STOCK_CHUNKS`] messages' worth of memory off the relay's threads,
    /// which then only wait for the lock while it swaps the queue's in (anything queued
    /// meanwhile moves along, in order).
    pub fn stock(&self) -> VecDeque<TapMsg> {
        let batch = written_queue(STOCK_CHUNKS);
        let mut ready = written_queue(STOCK_CHUNKS);
        {
            let mut q = lock(&self.shared.state);
            if q.msgs.capacity() < STOCK_CHUNKS {
                ready.append(&mut q.msgs);
                std::mem::swap(&mut q.msgs, &mut ready);
            }
        }
        batch
    }

    /// Moves everything queued to the end of `out` (an empty `out`'s allocation is reused).
    pub fn drain(&mut self, out: &mut VecDeque<TapMsg>) -> Drained {
        let mut q = lock(&self.shared.state);
        // Whoever drains is awake: a sleep that a timer ended, not an offer, leaves the flag set.
        q.waiting = false;
        if q.take_all(out) {
            return Drained::Some;
        }
        if q.senders == 0 {
            Drained::Closed
        } else {
            Drained::Empty
        }
    }

    /// Like [`TapReceiver::drain`], but when nothing is queued it sleeps until a sender offers,
    /// closes or goes away. Returns [`Drained::Closed`] once the tap is finished.
    pub async fn recv_many(&mut self, out: &mut VecDeque<TapMsg>) -> Drained {
        loop {
            {
                let mut q = lock(&self.shared.state);
                if q.take_all(out) {
                    q.waiting = false;
                    return Drained::Some;
                }
                if q.senders == 0 {
                    return Drained::Closed;
                }
                q.waiting = true;
            }
            // A notify_one between the unlock and this await leaves a permit: nothing is missed.
            self.shared.wake.notified().await;
        }
    }

    /// Waits until a sender closes or goes away, or (if the observer asked to be woken) offers.
    /// May return spuriously; callers re-check with [`TapReceiver::drain`].
    pub async fn woken(&self) {
        self.shared.wake.notified().await;
    }

    /// Where the bytes the relay has read in `dir` so far stand (see [`Arrival`]).
    pub fn arrival(&self, dir: Direction) -> Arrival {
        // `active` first: an offer pushes under the lock before it clears `active`.
        let i = dir.index();
        let active = self.shared.active[i].load(Ordering::SeqCst);
        let since = self.shared.active_since[i].load(Ordering::SeqCst);
        if let Some(first) = lock(&self.shared.state).first_seen[i] {
            Arrival::Queued(first)
        } else if active {
            // Read after `active`: this chunk's time, or a later chunk's if the relay has moved
            // on, whose earlier chunk is then queued (found above) or already drained.
            Arrival::Forwarding(self.shared.epoch + std::time::Duration::from_nanos(since))
        } else {
            Arrival::Settled
        }
    }

    /// One queued message, if any: the tests' view of the queue, one message at a time.
    #[cfg(test)]
    fn try_recv(&mut self) -> Option<TapMsg> {
        let mut q = lock(&self.shared.state);
        let msg = q.msgs.pop_front()?;
        if let TapMsg::Chunk(c) = &msg {
            q.bytes = q.bytes.saturating_sub(c.bytes.len() + CHUNK_OVERHEAD);
            q.chunks = q.chunks.saturating_sub(1);
            let d = c.dir;
            q.first_seen[d.index()] = q.msgs.iter().find_map(|m| match m {
                TapMsg::Chunk(n) if n.dir == d => Some(n.seen),
                _ => None,
            });
        }
        Some(msg)
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
        c2s.offer(now, Bytes::from_static(b"b\nb\n\n"));
        assert_eq!(stats.dropped_chunks[0].load(Ordering::Relaxed), 1);
        assert_eq!(stats.dropped_bytes[0].load(Ordering::Relaxed), 5);
        assert_eq!(rx.dropped_client_messages(), 3);
        let Some(TapMsg::Chunk(first)) = rx.try_recv() else {
            panic!("first chunk must arrive")
        };
        assert!(!first.after_gap);
        c2s.offer(now, Bytes::from_static(b"c"));
        let Some(TapMsg::Chunk(third)) = rx.try_recv() else {
            panic!("third chunk must arrive")
        };
        assert!(third.after_gap, "chunk after a drop is marked");
        assert!(
            third.gap_ended_line,
            "the dropped bytes ended with a newline"
        );
        assert_eq!(&third.bytes[..], b"c");
        // Dropped bytes that end inside a message: the next chunk starts inside it too.
        c2s.offer(now, Bytes::from_static(b"d"));
        c2s.offer(now, Bytes::from_static(b"\ne"));
        let Some(TapMsg::Chunk(fourth)) = rx.try_recv() else {
            panic!("fourth chunk must arrive")
        };
        c2s.offer(now, Bytes::from_static(b"f"));
        let Some(TapMsg::Chunk(fifth)) = rx.try_recv() else {
            panic!("fifth chunk must arrive")
        };
        assert!(!fourth.after_gap);
        assert!(fifth.after_gap && !fifth.gap_ended_line);
        // A drop right before the end marks the end.
        c2s.offer(now, Bytes::from_static(b"d"));
        c2s.offer(now, Bytes::from_static(b"ee"));
        let Some(TapMsg::Chunk(_)) = rx.try_recv() else {
            panic!("sixth chunk must arrive")
        };
        c2s.close(now);
        assert!(matches!(
            rx.try_recv(),
            Some(TapMsg::Closed {
                after_gap: true,
                ..
            })
        ));
    }

    /// Readying the queue for a backlog keeps what was queued, in order and counted, and leaves
    /// both the queue and the observer's batch with room for [`STOCK_CHUNKS`], so that neither
    /// grows (and none of its memory is fresh) while a backlog that size builds and drains.
    #[test]
    fn a_stocked_queue_keeps_what_it_held_and_holds_a_backlog_without_growing() {
        let (mut c2s, mut s2c, mut rx, _stats) = tap(TAP_CAPACITY);
        let now = Instant::now();
        c2s.offer(now, Bytes::from_static(b"a\n"));
        s2c.offer(now, Bytes::from_static(b"b\n"));
        let mut batch = rx.stock();
        assert!(batch.is_empty() && batch.capacity() >= STOCK_CHUNKS);
        let queue_capacity = |rx: &TapReceiver| lock(&rx.shared.state).msgs.capacity();
        assert!(queue_capacity(&rx) >= STOCK_CHUNKS);
        assert_eq!(rx.arrival(Direction::ClientToServer), Arrival::Queued(now));
        // A second call finds the queue ready and leaves it as it is.
        let ready = queue_capacity(&rx);
        let again = rx.stock();
        assert!(again.capacity() >= STOCK_CHUNKS);
        assert_eq!(queue_capacity(&rx), ready);
        let capacities = |rx: &TapReceiver, batch: &VecDeque<TapMsg>| {
            let mut v = [queue_capacity(rx), batch.capacity()];
            v.sort_unstable();
            v
        };
        for round in 0..3 {
            for i in 0..STOCK_CHUNKS / 2 - 1 {
                c2s.offer(now, Bytes::from(format!("{round}.{i}\n")));
                s2c.offer(now, Bytes::from_static(b"r\n"));
            }
            let before = capacities(&rx, &batch);
            assert_eq!(rx.drain(&mut batch), Drained::Some);
            let expected = if round == 0 {
                STOCK_CHUNKS
            } else {
                STOCK_CHUNKS - 2
            };
            assert_eq!(batch.len(), expected);
            // The two allocations swapped places; neither grew.
            assert_eq!(capacities(&rx, &batch), before, "round {round}");
            let first = batch.iter().find_map(|m| match m {
                TapMsg::Chunk(c) if c.dir == Direction::ClientToServer => Some(c.bytes.clone()),
                _ => None,
            });
            let want = if round == 0 {
                "a\n".to_string()
            } else {
                format!("{round}.0\n")
            };
            assert_eq!(first.as_deref(), Some(want.as_bytes()));
            batch.clear();
        }
    }

    /// A drain into a batch not yet finished keeps the batch and adds to its end: the observer
    /// counts what it left unread at its cut-off that way, and a swap once left the batch's rest
    /// in the queue, read by no one and counted nowhere.
    #[test]
    fn a_drain_into_a_batch_keeps_what_it_held() {
        let (mut c2s, mut s2c, mut rx, _stats) = tap(8);
        let now = Instant::now();
        c2s.offer(now, Bytes::from_static(b"a\n"));
        let mut out = VecDeque::new();
        assert_eq!(rx.drain(&mut out), Drained::Some);
        c2s.offer(now, Bytes::from_static(b"b\n"));
        s2c.offer(now, Bytes::from_static(b"c\n"));
        assert_eq!(rx.drain(&mut out), Drained::Some);
        let bytes: Vec<&[u8]> = out
            .iter()
            .map(|m| match m {
                TapMsg::Chunk(c) => &c.bytes[..],
                TapMsg::Closed { .. } => b"closed",
            })
            .collect();
        assert_eq!(bytes, [&b"a\n"[..], b"b\n", b"c\n"]);
        assert_eq!(rx.drain(&mut out), Drained::Empty);
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn byte_budget_bounds_queue_and_drain_frees_it() {
        // Room for two 100-byte chunks with their overhead, not three.
        let budget = 2 * (100 + CHUNK_OVERHEAD) + 10;
        let (mut c2s, mut s2c, mut rx, stats) = tap_with_budget(TAP_CAPACITY, budget);
        let now = Instant::now();
        let chunk = Bytes::from(vec![b'x'; 100]);
        c2s.offer(now, chunk.clone());
        s2c.offer(now, chunk.clone());
        c2s.offer(now, chunk.clone());
        assert_eq!(stats.dropped_chunks[0].load(Ordering::Relaxed), 1);
        assert_eq!(stats.dropped_chunks[1].load(Ordering::Relaxed), 0);
        let mut out = VecDeque::new();
        assert_eq!(rx.drain(&mut out), Drained::Some);
        assert_eq!(out.len(), 2);
        out.clear();
        // The drain gave the budget back: the next chunk is queued, marked after the gap.
        c2s.offer(now, chunk);
        assert_eq!(rx.drain(&mut out), Drained::Some);
        let Some(TapMsg::Chunk(c)) = out.pop_front() else {
            panic!("chunk after drain must be queued")
        };
        assert!(c.after_gap);
        out.clear();
        c2s.close(now);
        drop(s2c);
        assert_eq!(
            rx.drain(&mut out),
            Drained::Some,
            "the EOF marker is queued"
        );
        out.clear();
        assert_eq!(rx.drain(&mut out), Drained::Closed);
    }

    #[test]
    fn direction_is_settled_only_when_nothing_read_is_unhanded() {
        use std::time::Duration;
        let (mut c2s, _s2c, mut rx, _stats) = tap(TAP_CAPACITY);
        let d = Direction::ClientToServer;
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(rx.arrival(d), Arrival::Settled, "nothing read yet");
        c2s.begin(at(1));
        assert_eq!(
            rx.arrival(d),
            Arrival::Forwarding(at(1)),
            "read, being forwarded"
        );
        c2s.offer(at(1), Bytes::from_static(b"x"));
        assert_eq!(
            rx.arrival(d),
            Arrival::Queued(at(1)),
            "offered, still queued"
        );
        c2s.begin(at(2));
        c2s.offer(at(2), Bytes::from_static(b"y"));
        c2s.begin(at(3));
        assert_eq!(
            rx.arrival(d),
            Arrival::Queued(at(1)),
            "queued and read more: the first queued chunk's time"
        );
        let mut out = VecDeque::new();
        assert_eq!(rx.drain(&mut out), Drained::Some);
        assert_eq!(
            rx.arrival(d),
            Arrival::Forwarding(at(3)),
            "drained, the next read being forwarded"
        );
        c2s.settle();
        assert_eq!(
            rx.arrival(d),
            Arrival::Settled,
            "a failed write announces nothing"
        );
        assert_eq!(rx.arrival(Direction::ServerToClient), Arrival::Settled);
    }

    use crate::observe::frame::{FrameSplitter, Gap, Split, DEFAULT_FRAME_CAP};
    use proptest::prelude::*;

    const SMALL: Summarize = Summarize {
        whole: 1024,
        catalog: 4096,
        head: 128,
        tail: 128,
    };

    fn collect(out: &mut Vec<String>) -> impl FnMut(Split<'_>) + '_ {
        |s| {
            out.push(match s {
                Split::Frame(f) => format!("frame {}", String::from_utf8_lossy(f)),
                Split::Summary { skeleton, len } => {
                    format!("summary {len} {}", String::from_utf8_lossy(skeleton))
                }
                Split::Oversize(n) => format!("oversize {n}"),
            })
        }
    }

    /// What the observer's splitter makes of `chunks` when they pass through a sender's
    /// [`Trim`], and how many bytes crossed.
    fn via_trim(chunks: &[&[u8]]) -> (Vec<String>, usize) {
        let mut trim = Trim::new(SMALL);
        let mut split = FrameSplitter::with_limits(DEFAULT_FRAME_CAP, SMALL);
        let mut out = Vec::new();
        let mut crossed = 0;
        let now = Instant::now();
        for c in chunks {
            trim.accept(now, Bytes::copy_from_slice(c), |_, b, skipped| {
                crossed += b.len();
                split.push(&b, Gap::None, skipped, collect(&mut out));
            });
        }
        trim.finish(|_, b, skipped| {
            crossed += b.len();
            split.push(&b, Gap::None, skipped, collect(&mut out));
        });
        split.flush(collect(&mut out));
        (out, crossed)
    }

    /// The same `chunks` fed to the splitter directly.
    fn direct(chunks: &[&[u8]]) -> Vec<String> {
        let mut split = FrameSplitter::with_limits(DEFAULT_FRAME_CAP, SMALL);
        let mut out = Vec::new();
        for c in chunks {
            split.push(c, Gap::None, 0, collect(&mut out));
        }
        split.flush(collect(&mut out));
        out
    }

    #[test]
    fn passed_bytes_are_what_the_observer_takes_in_once_the_tap_is_empty() {
        // Room for the large frame's head and tail, not for every small chunk after it.
        let (mut c2s, mut s2c, mut rx, stats) = tap_with_budget(TAP_CAPACITY, 96 * 1024);
        let now = Instant::now();
        let big = format!("{{\"id\":1,\"r\":\"{}\"}}\n", "b".repeat(1 << 20));
        for piece in big.as_bytes().chunks(16 * 1024) {
            s2c.offer(now, Bytes::copy_from_slice(piece));
        }
        for _ in 0..400 {
            c2s.offer(now, Bytes::from_static(&[b'x'; 300]));
        }
        let skipped = stats.skipped_bytes[1].load(Ordering::Relaxed);
        let dropped = rx.dropped_bytes();
        assert!(
            skipped > 0 && dropped > 0,
            "skipped {skipped}, dropped {dropped}"
        );
        let offered: u64 = (0..2)
            .map(|i| stats.offered_bytes[i].load(Ordering::Relaxed))
            .sum();
        assert_eq!(rx.passed_bytes(), offered - skipped - dropped);
        c2s.close(now);
        s2c.close(now);
        let mut out = VecDeque::new();
        let mut taken = 0u64;
        while rx.drain(&mut out) == Drained::Some {
            for m in out.drain(..) {
                if let TapMsg::Chunk(c) = m {
                    taken += c.bytes.len() as u64;
                }
            }
        }
        assert_eq!(rx.passed_bytes(), taken);
    }

    #[test]
    fn trim_passes_head_and_tail_of_a_large_frame_only() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{{\"text\":\"{}\",\"isError\":false}}}}\n",
            "b".repeat(50_000)
        );
        let chunks: Vec<&[u8]> = big.as_bytes().chunks(100).collect();
        let (got, crossed) = via_trim(&chunks);
        assert_eq!(got, direct(&chunks));
        assert_eq!(got.len(), 1);
        assert!(
            got[0].starts_with(&format!("summary {} ", big.len() - 1)),
            "{}",
            got[0]
        );
        assert!(got[0].contains("\"id\":4") && got[0].contains("\"isError\":false"));
        // The head (plus the chunk reaching past it), the tail (plus the chunk reaching into it),
        // and the chunk with the newline.
        assert!(
            crossed <= SMALL.head + SMALL.tail + 3 * 100,
            "{crossed} bytes crossed"
        );
    }

    #[test]
    fn trim_passes_mid_sized_frames_and_batches_whole() {
        let mid = format!("{{\"id\":1,\"t\":\"{}\"}}\n", "m".repeat(600));
        let batch = format!("[{}1]\n", "1,".repeat(3000));
        let stream = format!("{mid}{batch}");
        let chunks: Vec<&[u8]> = stream.as_bytes().chunks(64).collect();
        let (got, crossed) = via_trim(&chunks);
        assert_eq!(crossed, stream.len());
        assert_eq!(got, direct(&chunks));
        assert!(got[0].starts_with("frame {"));
        assert!(got[1].starts_with("frame ["));
    }

    /// One frame of a generated stream.
    fn frame_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            (0usize..3000, any::<bool>()).prop_map(|(n, e)| format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{n},\"result\":{{\"t\":\"{}\",\"isError\":{e}}}}}",
                "q\\\"".repeat(n / 3)
            )),
            (0usize..1500).prop_map(|n| format!("[{}0]", "0,".repeat(n))),
            "[a-z {}\":,]{0,40}",
            (0usize..3000).prop_map(|n| format!("  {{\"id\":1,\"x\":\"{}", "w".repeat(n))),
            // Catalog pages: the mark early (held whole up to `catalog`) or past the head.
            (0usize..5000, 0usize..200).prop_map(|(n, pad)| format!(
                "{{\"id\":{pad},\"result\":{{\"p\":\"{}\",\"tools\":[{{\"d\":\"{}\"}}]}}}}",
                "p".repeat(pad),
                "t".repeat(n)
            )),
        ]
    }

    proptest! {
        /// Whatever the frames and however they are read, the observer's splitter makes the
        /// same frames and summaries of what crosses the tap as of the whole stream.
        #[test]
        fn trim_never_changes_what_the_observer_sees(
            frames in prop::collection::vec(frame_strategy(), 0..12),
            crlf in any::<bool>(),
            open_end in any::<bool>(),
            cuts in prop::collection::vec(0usize..40_000, 0..40),
        ) {
            let mut stream = Vec::new();
            for f in &frames {
                stream.extend_from_slice(f.as_bytes());
                stream.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
            }
            if open_end {
                stream.extend_from_slice(b"{\"id\":2,\"y\":\"");
                stream.extend(std::iter::repeat_n(b'z', 2000));
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (stream.len() + 1)).collect();
            cuts.push(stream.len());
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut prev = 0;
            for c in cuts {
                chunks.push(&stream[prev..c]);
                prev = c;
            }
            let chunks: Vec<&[u8]> = chunks.into_iter().filter(|c| !c.is_empty()).collect();
            let (got, _) = via_trim(&chunks);
            prop_assert_eq!(got, direct(&chunks));
        }
    }

    /// Two relay threads offering at full speed while the observer drains: every chunk is
    /// either received or counted as dropped, in order per direction, and the bounds are all
    /// given back at the end.
    #[test]
    fn concurrent_offers_are_received_or_counted_and_the_budget_comes_back() {
        let budget = 64 * 1024;
        let (c2s, s2c, mut rx, stats) = tap_with_budget(256, budget);
        let spawn = |mut tx: TapSender, tag: u8| {
            std::thread::spawn(move || {
                for n in 0..20_000u32 {
                    let mut b = vec![tag; 1 + (n as usize % 300)];
                    b.extend_from_slice(&n.to_le_bytes());
                    tx.offer(Instant::now(), Bytes::from(b));
                }
                tx.close(Instant::now());
            })
        };
        let a = spawn(c2s, b'a');
        let b = spawn(s2c, b'b');
        let mut out = VecDeque::new();
        let mut got = [0u64; 2];
        let mut last = [None::<u32>; 2];
        let mut closed = 0;
        loop {
            match rx.drain(&mut out) {
                Drained::Closed => break,
                Drained::Empty => std::thread::yield_now(),
                Drained::Some => {}
            }
            for msg in out.drain(..) {
                match msg {
                    TapMsg::Chunk(c) => {
                        let i = c.dir.index();
                        let tail: [u8; 4] = c.bytes[c.bytes.len() - 4..].try_into().expect("4");
                        let n = u32::from_le_bytes(tail);
                        assert!(last[i].is_none_or(|l| l < n), "out of order");
                        last[i] = Some(n);
                        got[i] += 1;
                    }
                    TapMsg::Closed { .. } => closed += 1,
                }
            }
        }
        a.join().expect("sender a");
        b.join().expect("sender b");
        assert_eq!(closed, 2);
        for (i, got) in got.iter().enumerate() {
            let dropped = stats.dropped_chunks[i].load(Ordering::Relaxed);
            assert_eq!(got + dropped, 20_000, "direction {i}");
        }
        let q = lock(&rx.shared.state);
        assert_eq!((q.bytes, q.chunks, q.first_seen), (0, 0, [None, None]));
    }

    #[tokio::test]
    async fn sleeping_receiver_is_woken_by_offer_and_by_last_sender() {
        let (c2s, mut s2c, mut rx, _stats) = tap(TAP_CAPACITY);
        let offer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            s2c.offer(Instant::now(), Bytes::from_static(b"a\n"));
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(c2s);
            drop(s2c);
        });
        let mut out = VecDeque::new();
        let limit = std::time::Duration::from_secs(30);
        let got = tokio::time::timeout(limit, rx.recv_many(&mut out)).await;
        assert_eq!(got.ok(), Some(Drained::Some));
        assert_eq!(out.len(), 1);
        out.clear();
        let got = tokio::time::timeout(limit, rx.recv_many(&mut out)).await;
        assert_eq!(got.ok(), Some(Drained::Closed));
        offer.join().expect("offer thread");
    }

    /// Whether the receiver has been woken (a wake-up is kept until taken, so a missed one shows).
    async fn woken(rx: &TapReceiver) -> bool {
        let short = std::time::Duration::from_millis(50);
        tokio::time::timeout(short, rx.woken()).await.is_ok()
    }

    #[tokio::test]
    async fn a_receiver_that_drains_is_awake() {
        let (c2s, mut s2c, mut rx, _stats) = tap(TAP_CAPACITY);
        let mut out = VecDeque::new();
        // Asleep, then woken by its timer (a deadline), not by an offer: it drains.
        assert_eq!(rx.drain(&mut out), Drained::Empty);
        lock(&rx.shared.state).waiting = true;
        assert_eq!(rx.drain(&mut out), Drained::Empty);
        s2c.offer(Instant::now(), Bytes::from_static(b"{\"id\":1}\n"));
        assert!(!woken(&rx).await, "an awake receiver is not woken");
        drop(c2s);
        drop(s2c);
    }

    #[tokio::test]
    async fn a_client_chunk_wakes_a_sleeping_receiver_only_past_a_backlog() {
        let (mut c2s, mut s2c, mut rx, _stats) = tap(TAP_CAPACITY);
        let mut out = VecDeque::new();
        let asleep = |rx: &mut TapReceiver, out: &mut VecDeque<TapMsg>| {
            assert_eq!(rx.drain(out), Drained::Empty);
            // Goes to sleep as the observer does: finds nothing and says it waits.
            lock(&rx.shared.state).waiting = true;
        };
        asleep(&mut rx, &mut out);
        c2s.offer(Instant::now(), Bytes::from_static(b"{\"id\":1}\n"));
        assert!(!woken(&rx).await, "a request alone waits for its answer");
        s2c.offer(Instant::now(), Bytes::from_static(b"{\"id\":1}\n"));
        assert!(woken(&rx).await, "the answer wakes the receiver");
        assert_eq!(rx.drain(&mut out), Drained::Some);
        assert_eq!(out.len(), 2, "the request waited and comes with its answer");
        out.clear();

        asleep(&mut rx, &mut out);
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        let mut offered = 0;
        while offered + chunk.len() + CHUNK_OVERHEAD < CLIENT_WAKE_BYTES {
            c2s.offer(Instant::now(), chunk.clone());
            offered += chunk.len() + CHUNK_OVERHEAD;
        }
        assert!(
            offered > 0 && !woken(&rx).await,
            "below the backlog: still asleep"
        );
        c2s.offer(Instant::now(), chunk.clone());
        assert!(
            woken(&rx).await,
            "a backlog of client bytes wakes the receiver"
        );
        drop(c2s);
        drop(s2c);
    }
}
