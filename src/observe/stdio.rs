//! The stdio driver: runs an [`Observer`] from the tap until both directions close.
//!
//! Owns the loop ([`run_tap_observer`]): split each direction's chunks into frames, put the two
//! directions back in relay-timestamp order ([`Reorder`]), check call timeouts every [`TICK`],
//! and keep pace with what it shares: the reporter's queue ([`pace_to_sink`]) and the CPU
//! ([`Pacer`]). Each relay thread hands its bytes to the tap after forwarding them, so the two
//! directions can arrive slightly out of order: a frame waits up to [`REORDER_HOLD`] for the
//! other direction, and a response that still comes before its request is held by correlation
//! (see [`super::EARLY_RESPONSE_GRACE`]). It delays observation, never the relay. When it falls
//! more than the tap's budget behind, the tap drops, and a call whose answer may have been
//! dropped makes no event ([`super::ObserverStats::unobserved`]).
//!
//! The end of a session is the session thread's to decide, not the observer's: it tells the
//! observer ([`SessionClose`]) how open calls end and until when it may work; past that instant
//! the observer leaves the rest of the backlog unread, and a call whose answer may be in it
//! makes no event (counted as unobserved, as after a tap drop). [`Progress`] lets that thread
//! see, without the observer's help, whether anything is left to wait for and how much traffic
//! was never read: an observer low in the batch class may not get the CPU again in time.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::event::EventSink;
use crate::pace::Pacer;
use crate::tap::{Arrival, Direction, Drained, TapMsg, TapReceiver};

use super::correlate::opposite;
use super::frame::{FrameSplitter, Gap, Split, DEFAULT_FRAME_CAP};
use super::observer::Observer;
use super::{EndCause, ObserverStats, StreamId, TICK};

/// How a stdio session ended, as its thread tells the observer once the server is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionClose {
    /// How calls still open end.
    pub cause: EndCause,
    /// When the observer stops working through what the tap still holds: the rest is left
    /// unread, and calls whose answers may be in it make no event.
    pub observe_until: Instant,
    /// When what was observed must be delivered (the reporter's deadline); the observer itself
    /// does not use it.
    pub deliver_by: Instant,
}

/// The observer's side of [`SessionClose`]: `None` until the session's thread sends it.
pub type CloseReceiver = watch::Receiver<Option<SessionClose>>;

/// How the stdio observer runs ([`run_tap_observer_with`]).
pub struct StdioOptions {
    /// Large JSON objects are observed from their ends ([`super::summary`]); off, each frame is
    /// read whole up to the frame cap (the benchmark's `summary` switch).
    pub summarize: bool,
    /// When the session ended (see [`SessionClose`]).
    pub close: CloseReceiver,
    /// What the observer has done, for the session's thread.
    pub progress: std::sync::Arc<Progress>,
    /// Ready the tap's queue and the observer's batch for a backlog when one starts (see
    /// [`STOCK_AFTER`]); off in tests and for the benchmark's `prefault` switch.
    pub stock: bool,
}

/// What the stdio observer has done so far, readable from any thread at any time (see the
/// module doc).
#[derive(Debug, Default)]
pub struct Progress {
    /// Tap bytes (skipped middles of large frames not included) the observer has taken in, per
    /// direction.
    taken: [AtomicU64; 2],
    /// The observer's state the last time it ran out of work.
    idle: Mutex<IdleState>,
}

/// The observer's state when it last ran out of work (see [`Progress::idle`]).
#[derive(Debug, Clone, Default)]
pub struct IdleState {
    /// [`Progress::taken`] at that moment.
    pub taken: [u64; 2],
    /// Nothing was held: no part of a frame, nothing in the reorder window, no call open and
    /// no early response. Had the tap closed then, ending the observer would have made no event.
    pub settled: bool,
    /// The observer's counters at that moment.
    pub stats: ObserverStats,
}

impl Progress {
    /// Tap bytes taken in so far, per direction (index 0 client→server).
    pub fn taken(&self) -> [u64; 2] {
        [self.taken[0].load(Relaxed), self.taken[1].load(Relaxed)]
    }

    /// The observer's state the last time it ran out of work (all zero if it never did).
    pub fn idle(&self) -> IdleState {
        crate::lock::lock(&self.idle).clone()
    }

    fn add_taken(&self, dir: Direction, n: usize) {
        self.taken[dir.index()].fetch_add(n as u64, Relaxed);
    }

    fn set_idle(&self, settled: bool, stats: &ObserverStats) {
        let mut s = crate::lock::lock(&self.idle);
        s.taken = self.taken();
        s.settled = settled;
        s.stats.clone_from(stats);
    }
}

/// Whether the session's thread has said observation must stop by now.
fn past_cutoff(close: &CloseReceiver) -> bool {
    let until = close.borrow().map(|c| c.observe_until);
    until.is_some_and(|u| Instant::now() >= u)
}

/// How long a frame waits for the other direction before it is observed. Each relay thread
/// hands its bytes to the tap *after* forwarding them, so a request can reach the channel after
/// the response it caused (or a 2026-07-28 retry before the `input_required` it answers) when a
/// thread is preempted between its write and its hand-off. Frames are observed in the order of
/// their relay timestamps: a frame is released once nothing the other direction may still hand
/// over was read before it, or once the other direction's chunk being forwarded was read this
/// long ago without being handed over (see [`Ahead`]). It delays observation, never the relay.
pub const REORDER_HOLD: Duration = Duration::from_millis(25);

/// What the observer knows of one direction's bytes that it has not split yet, for the frames
/// of the other direction in the reorder window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ahead {
    /// Nothing: every byte the relay read is split.
    Nothing,
    /// Chunks drained from the tap or queued in it, the first of them read at this instant. A
    /// direction's chunks come in the order they were read, so a frame of the other direction
    /// seen no later cannot be overtaken by anything still to come from this one.
    Next(Instant),
    /// Nothing queued, bytes read at this instant being forwarded ([`Arrival::Forwarding`]).
    /// A frame seen no later was read before them and cannot be answered by them; a later one
    /// waits for their hand-over, at most [`REORDER_HOLD`] from when they were read.
    Forwarding(Instant),
}

impl Ahead {
    /// Whether a frame of the other direction seen at `seen` can no longer be overtaken.
    fn passed(self, seen: Instant) -> bool {
        match self {
            Ahead::Nothing => true,
            Ahead::Next(next) | Ahead::Forwarding(next) => seen <= next,
        }
    }
}

/// Both directions, in [`Direction::index`] order.
const DIRS: [Direction; 2] = [Direction::ClientToServer, Direction::ServerToClient];

/// A frame waiting in the reorder window.
struct Held {
    seen: Instant,
    frame: HeldFrame,
}

enum HeldFrame {
    Bytes(bytes::Bytes),
    Summary(bytes::Bytes, u64),
    Oversize(u64),
}

/// Client messages the observer never read, counted as unobserved calls: those the tap dropped
/// the end of, those the splitter threw away resynchronising after a drop, and, past the
/// cut-off, those still unread. A message lost this way cannot be read, so its method is
/// unknown; in a burst that overruns the tap nearly every client message is a `tools/call`, and
/// counting each as one keeps the loss visible as calls where it was visible only as bytes
/// (`tapDroppedBytes`). A lost answer is counted through its call instead
/// ([`Observer::on_gap`]).
#[derive(Default)]
struct LostRequests {
    /// The tap's count of dropped client messages already added.
    dropped: u64,
}

impl LostRequests {
    fn count<S: EventSink>(
        &mut self,
        rx: &TapReceiver,
        splitter: &mut FrameSplitter,
        obs: &mut Observer<S>,
    ) {
        let dropped = rx.dropped_client_messages();
        let new = dropped.saturating_sub(self.dropped) + splitter.take_discarded();
        self.dropped = dropped;
        obs.requests_lost(new);
    }

    /// Past the cut-off: the client messages still in the tap, in the drained batch, held for
    /// reordering or begun in the splitter will never be read.
    fn count_unread<S: EventSink>(
        &mut self,
        rx: &mut TapReceiver,
        batch: &mut VecDeque<TapMsg>,
        splitter: &FrameSplitter,
        reorder: &Reorder,
        obs: &mut Observer<S>,
    ) {
        rx.drain(batch);
        let mut unread = reorder.queues[Direction::ClientToServer.index()].len() as u64;
        let mut open = !splitter.is_empty();
        for msg in batch.drain(..) {
            if let TapMsg::Chunk(c) = msg {
                if c.dir == Direction::ClientToServer && !c.bytes.is_empty() {
                    unread += crate::tap::messages_ended(&c.bytes);
                    open = !c.bytes.ends_with(b"\n");
                }
            }
        }
        obs.requests_lost(unread + u64::from(open));
    }
}

/// Two per-direction queues merged by relay timestamp (see [`REORDER_HOLD`]).
#[derive(Default)]
struct Reorder {
    queues: [std::collections::VecDeque<Held>; 2],
    closed: [bool; 2],
}

impl Reorder {
    /// Takes a frame the splitter completed. When nothing is held and nothing the other
    /// direction may still hand over can come before it ([`Ahead::passed`]), or it closed,
    /// nothing can overtake the frame: it is
    /// observed at once, in place, without a copy. Otherwise it is held: a frame inside the tap
    /// chunk `chunk` (the common case) as a zero-copy slice of it, a frame the splitter assembled
    /// from several chunks as a copy of the splitter's buffer.
    #[allow(clippy::too_many_arguments)]
    fn push<S: EventSink>(
        &mut self,
        obs: &mut Observer<S>,
        dir: Direction,
        seen: Instant,
        chunk: &bytes::Bytes,
        s: Split<'_>,
        other_ahead: Ahead,
    ) {
        let i = dir.index();
        let other = 1 - i;
        let clear = self.queues[i].is_empty() && self.queues[other].is_empty();
        if clear && (other_ahead.passed(seen) || self.closed[other]) {
            match s {
                Split::Frame(f) => obs.on_frame(StreamId(0), dir, seen, f),
                Split::Summary { skeleton, len } => {
                    obs.on_summary_frame(StreamId(0), dir, seen, skeleton, len)
                }
                Split::Oversize(n) => obs.on_oversize_frame(dir, n),
            }
            return;
        }
        let frame = match s {
            Split::Frame(f) => HeldFrame::Bytes(slice_or_copy(chunk, f)),
            Split::Summary { skeleton, len } => {
                HeldFrame::Summary(bytes::Bytes::copy_from_slice(skeleton), len)
            }
            Split::Oversize(n) => HeldFrame::Oversize(n),
        };
        self.queues[i].push_back(Held { seen, frame });
    }

    fn is_empty(&self) -> bool {
        self.queues.iter().all(|q| q.is_empty())
    }

    /// Observes every frame that can no longer be overtaken (`drain`: all), at most `limit` of
    /// them; true if it stopped at the limit with more releasable frames left. `ahead`: per
    /// direction, what it may still hand over: the timestamps of its next chunk decide, however
    /// far behind the relay the observer is. Only a chunk that its relay thread has not handed
    /// over [`REORDER_HOLD`] after reading it (preempted, or blocked writing to a peer that
    /// does not read) lets frames that may answer it go first. The hold used to count from the
    /// waiting frame's own timestamp: an observer working off a burst is far more than the hold
    /// behind, so a burst's answers went before their requests.
    fn release<S: EventSink>(
        &mut self,
        obs: &mut Observer<S>,
        now: Instant,
        drain: bool,
        limit: usize,
        ahead: [Ahead; 2],
        pacer: &Pacer,
    ) -> bool {
        let may_go = |held: Instant, other: usize| {
            drain
                || self.closed[other]
                || ahead[other].passed(held)
                || matches!(ahead[other], Ahead::Forwarding(since)
                    if now.saturating_duration_since(since) >= REORDER_HOLD)
        };
        for _ in 0..limit {
            let heads = [
                self.queues[0].front().map(|h| h.seen),
                self.queues[1].front().map(|h| h.seen),
            ];
            let pick = match heads {
                [Some(a), Some(b)] => Some(if a <= b { 0 } else { 1 }),
                [Some(a), None] => may_go(a, 1).then_some(0),
                [None, Some(b)] => may_go(b, 0).then_some(1),
                [None, None] => None,
            };
            let Some(i) = pick else { return false };
            let Some(h) = self.queues[i].pop_front() else {
                return false;
            };
            match h.frame {
                HeldFrame::Bytes(b) => obs.on_frame(StreamId(0), DIRS[i], h.seen, &b),
                HeldFrame::Summary(b, len) => {
                    obs.on_summary_frame(StreamId(0), DIRS[i], h.seen, &b, len)
                }
                HeldFrame::Oversize(n) => obs.on_oversize_frame(DIRS[i], n),
            }
            pacer.pace();
        }
        !self.is_empty()
    }

    /// When the oldest held frame must be released at the latest.
    fn deadline(&self) -> Option<Instant> {
        self.queues
            .iter()
            .filter_map(|q| q.front().map(|h| h.seen + REORDER_HOLD))
            .min()
    }
}

/// `f` as a zero-copy slice of `chunk` when it points into it, else a copy.
fn slice_or_copy(chunk: &bytes::Bytes, f: &[u8]) -> bytes::Bytes {
    let c = chunk.as_ptr() as usize;
    let p = f.as_ptr() as usize;
    if !f.is_empty() && p >= c && p + f.len() <= c + chunk.len() {
        chunk.slice(p - c..p - c + f.len())
    } else {
        bytes::Bytes::copy_from_slice(f)
    }
}

/// After working off what the tap held, the observer waits this long before looking again
/// instead of asking to be woken: a sender then queues with a lock and a push and no wake-up
/// syscall, and the observer runs once per linger with a batch instead of once per chunk. Only
/// when a look finds nothing, or a look after a linger finds little (see [`SPARSE_LOOK`]), does
/// it sleep until the next offer. Delays observation by at most this much (timestamps are the
/// relay's, so `dur_ms` is unaffected), never the relay; the tap's byte budget covers what
/// arrives meanwhile.
pub const TAP_LINGER: Duration = Duration::from_millis(2);

/// A look that completes at most this many frames, after a linger or after a sleep of at least
/// [`TAP_LINGER`], does not linger: the traffic is sparse (a call at a time), and lingering
/// would only cost a timer wake-up with nothing to take. The observer sleeps until the next
/// offer instead. With calls 5–20 ms apart it woke 2.0–2.2 times a call when every look
/// lingered; 1.8 once a look after a linger stopped; about one, the answer's, once a look after
/// a long sleep stopped too and a request alone stopped waking it (`bench/spaced_calls.py`,
/// `crate::tap::CLIENT_WAKE_BYTES`). A look after a short sleep lingers: calls come densely,
/// and one wake-up per answer would cost more than a linger. Frames, not chunks: in a burst one
/// chunk (one read) holds hundreds of frames, and counted in chunks a burst looked sparse.
pub const SPARSE_LOOK: usize = 2;

/// Messages in one take from the tap past which the observer readies the tap's queue and its own
/// batch for a backlog ([`TapReceiver::stock`]), once a session: it has fallen behind by more
/// than a few calls, and a backlog grows the queue into fresh pages that the relay threads
/// would otherwise fault in, inside calls. A session of calls spread out never gets here, and
/// never holds that memory. `bench/README.md`, "A session's first blocks, faulted in before its
/// first read".
pub const STOCK_AFTER: usize = 64;

/// Most frames observed between two yields to the runtime. The reporter runs on the same
/// worker and takes up to tokio's cooperative budget (128) of events per turn: observing at most
/// this many frames (at most one event each, bar batches) per turn keeps its queue from
/// overflowing while a backlog is worked off.
pub const FRAMES_PER_TURN: usize = 64;

/// How long the observer waits, per stall, for room in the reporter's queue before observing
/// anyway (and letting the queue count the drops). A healthy ingest answers well within it, so
/// a backlog is paced to the reporter instead of overflowing its queue; a black-hole ingest
/// cannot stall observation (and the tap) for longer than this.
pub const SINK_STALL_LIMIT: Duration = Duration::from_millis(250);

/// Room in the reporter's queue the observer waits for before it splits the next tap chunk:
/// one 64 KiB chunk of the smallest `tools/call` responses (~36 bytes) completes ~1,800 calls.
const SINK_ROOM: usize = 2_048;

/// Most events the observer lets wait in the reporter's queue before it waits for the reporter
/// to take some: the batch being delivered and the next one, so delivery never waits for the
/// observer. The queue holds 10,000 (`crate::report::QUEUE_CAPACITY`, for an ingest that hangs),
/// and an observer working off a burst on the CPU the delivery thread shares used to fill it to
/// the [`SINK_ROOM`] mark, about 8,000 events: 4–5 MB of written events in memory faulted in for
/// them, about 1,100 page faults in a 20,000-call burst. `bench/README.md`, "Events written
/// ahead of the reporter".
const SINK_AHEAD: usize = 2 * crate::event::MAX_BATCH_EVENTS;

/// How often the observer re-checks the reporter's queue while it waits for room, when the sink
/// does not say when it takes events ([`EventSink::taken`]) or does not take any.
const SINK_POLL: Duration = Duration::from_millis(1);

/// Waits (bounded, see [`SINK_STALL_LIMIT`], and never past the cut-off) until the sink can take
/// a turn's worth of events and holds no more than [`SINK_AHEAD`].
async fn pace_to_sink<S: EventSink>(
    obs: &Observer<S>,
    stalled_since: &mut Option<Instant>,
    close: &CloseReceiver,
) {
    while obs.sink.room() < SINK_ROOM || obs.sink.queued() > SINK_AHEAD {
        if past_cutoff(close) {
            return;
        }
        let now = Instant::now();
        let since = *stalled_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= SINK_STALL_LIMIT {
            return;
        }
        match obs.sink.taken() {
            Some(taken) => {
                tokio::select! {
                    _ = taken.notified() => {}
                    _ = tokio::time::sleep(SINK_POLL) => {}
                }
            }
            None => tokio::time::sleep(SINK_POLL).await,
        }
    }
    *stalled_since = None;
}

/// The relay timestamps of the chunks drained from the tap and not split yet, per direction, in
/// the order they were read.
type Unsplit = [VecDeque<Instant>; 2];

/// No chunk left unsplit.
const ALL_SPLIT: Unsplit = [VecDeque::new(), VecDeque::new()];

/// What the observer knows of the bytes of `dir` it has not split yet.
fn ahead_of(rx: &TapReceiver, unsplit: &Unsplit, dir: Direction) -> Ahead {
    match unsplit[dir.index()].front() {
        Some(&first) => Ahead::Next(first),
        None => match rx.arrival(dir) {
            Arrival::Settled => Ahead::Nothing,
            Arrival::Queued(first) => Ahead::Next(first),
            Arrival::Forwarding(since) => Ahead::Forwarding(since),
        },
    }
}

/// [`ahead_of`] both directions.
fn ahead(rx: &TapReceiver, unsplit: &Unsplit) -> [Ahead; 2] {
    DIRS.map(|d| ahead_of(rx, unsplit, d))
}

/// How the observer keeps pace with what it shares: the reporter's queue (how long it has been
/// waiting for room, see [`pace_to_sink`]) and the CPU (see [`Pacer`]).
struct Pace<'a> {
    stalled: Option<Instant>,
    pacer: &'a Pacer,
    close: &'a CloseReceiver,
}

/// Releases what the reorder window allows, a turn at a time, yielding between turns; stops at
/// the cut-off.
async fn release_paced<S: EventSink>(
    reorder: &mut Reorder,
    obs: &mut Observer<S>,
    drain: bool,
    rx: &TapReceiver,
    unsplit: &Unsplit,
    pace: &mut Pace<'_>,
) {
    let pacer = pace.pacer;
    loop {
        if past_cutoff(pace.close) {
            return;
        }
        pace_to_sink(obs, &mut pace.stalled, pace.close).await;
        let ahead = ahead(rx, unsplit);
        let now = Instant::now();
        if !reorder.release(obs, now, drain, FRAMES_PER_TURN, ahead, pacer) {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// How far behind the relay the observer is: tap bytes passed to it that it has not taken in.
fn backlog(rx: &TapReceiver, progress: &Progress) -> u64 {
    let taken: u64 = progress.taken().iter().sum();
    rx.passed_bytes().saturating_sub(taken)
}

/// Drives an observer from the stdio tap until both directions close, then returns it (the
/// caller decides the [`super::EndCause`] for calls still in flight): [`run_tap_observer_with`]
/// with summaries on, no cut-off, and progress nobody reads.
pub async fn run_tap_observer<S: EventSink>(
    rx: TapReceiver,
    observer: Observer<S>,
    pacer: std::sync::Arc<Pacer>,
) -> Observer<S> {
    let (_never, close) = watch::channel(None);
    let opts = StdioOptions {
        summarize: true,
        close,
        progress: Default::default(),
        stock: false,
    };
    run_tap_observer_with(rx, observer, pacer, &opts).await
}

/// Drives an observer from the stdio tap until both directions close or the cut-off of
/// [`SessionClose`] passes, then returns it (the caller ends calls still in flight). Splits each
/// direction into frames, stamps each frame with the relay time of the chunk that completed it,
/// observes the frames of both directions in timestamp order (see [`REORDER_HOLD`]), and checks
/// call timeouts every [`TICK`]. Takes everything queued per look and lingers between looks (see
/// [`TAP_LINGER`]); yields every [`FRAMES_PER_TURN`] frames so the reporter keeps up. Tells
/// `pacer` whether traffic flows and how far behind it the observer is, and lets it pace every
/// frame (see [`Pacer`]). Past the cut-off
/// it reads nothing more: calls whose answers may be in what is left are made unobserved (a
/// gap), and what is left is what [`Progress::taken`] does not count.
pub async fn run_tap_observer_with<S: EventSink>(
    mut rx: TapReceiver,
    mut observer: Observer<S>,
    pacer: std::sync::Arc<Pacer>,
    opts: &StdioOptions,
) -> Observer<S> {
    let pacer = &*pacer;
    let close = &opts.close;
    let progress = &*opts.progress;
    let mut pace = Pace {
        stalled: None,
        pacer,
        close,
    };
    // Traffic flows while the relay keeps handing the tap new chunks; not once it is closing.
    let mut offers = rx.offers();
    let mut look = |rx: &TapReceiver, closing: bool| {
        let now = rx.offers();
        if closing {
            pacer.set_closing();
        } else {
            pacer.set_live(now != offers);
        }
        offers = now;
    };
    let splitter = || {
        if opts.summarize {
            FrameSplitter::default()
        } else {
            FrameSplitter::without_summaries(DEFAULT_FRAME_CAP)
        }
    };
    let mut splitters = [splitter(), splitter()];
    let mut last_seen: [Option<Instant>; 2] = [None, None];
    let mut reorder = Reorder::default();
    let mut batch: VecDeque<TapMsg> = VecDeque::new();
    // Whether the tap's queue and `batch` still need readying (see STOCK_AFTER).
    let mut unstocked = opts.stock;
    let mut unsplit = Unsplit::default();
    let mut lost = LostRequests::default();
    let mut next_tick = Instant::now() + TICK;
    let mut closing = false;
    // Whether this look follows a linger (see SPARSE_LOOK).
    let mut lingered = false;
    let cut = 'observe: loop {
        // How long the observer slept before this look, if it slept (see SPARSE_LOOK).
        let mut slept = None;
        let got = match rx.drain(&mut batch) {
            Drained::Empty => {
                let nothing_held = reorder.is_empty()
                    && splitters.iter().all(FrameSplitter::is_empty)
                    && observer.actions.is_empty()
                    && observer.early.is_empty();
                progress.set_idle(nothing_held, &observer.stats);
                let wake_at = reorder.deadline().map_or(next_tick, |h| h.min(next_tick));
                let asleep = Instant::now();
                let got = tokio::select! {
                    got = rx.recv_many(&mut batch) => got,
                    _ = tokio::time::sleep_until(wake_at.into()) => Drained::Empty,
                };
                slept = Some(asleep.elapsed());
                got
            }
            got => got,
        };
        if got == Drained::Closed {
            break false;
        }
        if unstocked && batch.len() >= STOCK_AFTER {
            unstocked = false;
            let mut ready = rx.stock();
            ready.append(&mut batch);
            batch = ready;
        }
        let worked = got == Drained::Some;
        let mut frames = 0usize;
        look(&rx, closing);
        unsplit.iter_mut().for_each(VecDeque::clear);
        for msg in &batch {
            if let TapMsg::Chunk(c) = msg {
                unsplit[c.dir.index()].push_back(c.seen);
            }
        }
        pacer.set_backlog(backlog(&rx, progress));
        while let Some(msg) = batch.pop_front() {
            if past_cutoff(close) {
                // Unread, so counted with the rest: a chunk can hold thousands of calls.
                batch.push_front(msg);
                break 'observe true;
            }
            pace_to_sink(&observer, &mut pace.stalled, close).await;
            match msg {
                TapMsg::Chunk(c) => {
                    let i = c.dir.index();
                    unsplit[i].pop_front();
                    if c.after_gap {
                        observer.on_gap(c.seen);
                    }
                    last_seen[i] = Some(c.seen);
                    let other = ahead_of(&rx, &unsplit, opposite(c.dir));
                    let before = observer.stats.events;
                    let gap = Gap::of(c.after_gap, c.gap_ended_line);
                    splitters[i].push(&c.bytes, gap, c.skipped, |s| {
                        reorder.push(&mut observer, c.dir, c.seen, &c.bytes, s, other);
                        pacer.pace();
                        frames += 1;
                    });
                    progress.add_taken(c.dir, c.bytes.len());
                    pacer.set_backlog(backlog(&rx, progress));
                    look(&rx, closing);
                    if observer.stats.events - before >= FRAMES_PER_TURN as u64 {
                        tokio::task::yield_now().await;
                    }
                }
                TapMsg::Closed {
                    dir,
                    seen,
                    after_gap,
                } => {
                    let at = last_seen[dir.index()].unwrap_or(seen);
                    let other = ahead_of(&rx, &unsplit, opposite(dir));
                    if after_gap {
                        // The end came after a drop: what the splitter holds is damaged, never
                        // a message, and the calls open may have had their answers dropped.
                        observer.on_gap(seen);
                        splitters[dir.index()].lost();
                    }
                    splitters[dir.index()].flush(|s| {
                        reorder.push(&mut observer, dir, at, &bytes::Bytes::new(), s, other)
                    });
                    reorder.closed[dir.index()] = true;
                    // The session is ending: look again at once, the other side follows soon.
                    closing = true;
                }
            }
            release_paced(&mut reorder, &mut observer, false, &rx, &unsplit, &mut pace).await;
        }
        let now = Instant::now();
        if now >= next_tick {
            // Lost requests first: the tick may expire answers held for them as orphans.
            lost.count(&rx, &mut splitters[0], &mut observer);
            observer.on_tick(now);
            observer.sync_health(rx.dropped_bytes());
            next_tick = now + TICK;
        }
        release_paced(
            &mut reorder,
            &mut observer,
            false,
            &rx,
            &ALL_SPLIT,
            &mut pace,
        )
        .await;
        let sparse =
            frames <= SPARSE_LOOK && (lingered || slept.is_some_and(|slept| slept >= TAP_LINGER));
        lingered = worked && !closing && !sparse;
        if lingered {
            // Linger (see TAP_LINGER); a closing sender cuts it short.
            tokio::select! {
                _ = tokio::time::sleep(TAP_LINGER) => {}
                _ = rx.woken() => {}
            }
        }
    };
    if !cut {
        for dir in [Direction::ClientToServer, Direction::ServerToClient] {
            let at = last_seen[dir.index()].unwrap_or_else(Instant::now);
            splitters[dir.index()].flush(|s| {
                reorder.push(
                    &mut observer,
                    dir,
                    at,
                    &bytes::Bytes::new(),
                    s,
                    Ahead::Nothing,
                )
            });
        }
        pacer.set_closing();
        release_paced(
            &mut reorder,
            &mut observer,
            true,
            &rx,
            &ALL_SPLIT,
            &mut pace,
        )
        .await;
    }
    if cut {
        lost.count_unread(&mut rx, &mut batch, &splitters[0], &reorder, &mut observer);
    }
    if cut || !reorder.is_empty() {
        // Past the cut-off: whatever answers are still unread, a call that may be waiting for
        // one of them is unobserved rather than a 504 or 502 the client never saw.
        observer.on_gap(Instant::now());
    }
    lost.count(&rx, &mut splitters[0], &mut observer);
    observer.sync_health(rx.dropped_bytes());
    observer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(s: &str) -> bytes::Bytes {
        bytes::Bytes::copy_from_slice(s.as_bytes())
    }

    /// An observer far behind the relay (here 1 s) holds an answer while the request it
    /// answers may still come before it, whatever the hold's clock says: released on the hold,
    /// a burst's answers went before their requests, each copied aside and read twice. Only a
    /// chunk its relay thread has held [`REORDER_HOLD`] since reading it lets the answer go.
    #[test]
    fn an_answer_waits_for_requests_the_observer_can_see_coming() {
        let pacer = Pacer::new(false);
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let request = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"pay"}}"#;
        let answer = r#"{"jsonrpc":"2.0","id":7,"result":{"content":[]}}"#;
        let cases = [
            (Ahead::Next(t0), ms(1000), 0),
            (Ahead::Forwarding(ms(4)), ms(20), 0),
            (Ahead::Forwarding(ms(4)), ms(1000), 1),
        ];
        for (requests, now, early) in cases {
            let mut obs = Observer::new(crate::observe::tests::cfg(), Vec::new());
            let mut reorder = Reorder::default();
            let (a, r) = (line(answer), line(request));
            reorder.push(&mut obs, DIRS[1], ms(5), &a, Split::Frame(&a), requests);
            let ahead = [requests, Ahead::Nothing];
            assert!(!reorder.release(&mut obs, now, false, 64, ahead, &pacer));
            assert_eq!(reorder.is_empty(), early == 1, "{requests:?}");
            assert_eq!(obs.early.len(), early, "{requests:?}");
            reorder.push(&mut obs, DIRS[0], t0, &r, Split::Frame(&r), Ahead::Nothing);
            let ahead = [Ahead::Nothing, Ahead::Nothing];
            reorder.release(&mut obs, now, false, 64, ahead, &pacer);
            assert!(reorder.is_empty() && obs.early.is_empty(), "{requests:?}");
            let (stats, events) = obs.finish(now, crate::observe::EndCause::SessionEnd);
            assert_eq!(events.len(), 1, "{requests:?}: {stats:?}");
            assert_eq!(events[0].status, 200);
            assert!((events[0].dur_ms - 5.0).abs() < 0.001);
        }
    }

    /// A frame that the other direction's next chunk cannot precede is observed at once, not
    /// held: held, a flood's requests kept the relay's blocks from being reused while an answer
    /// read after them waited its turn in the same look.
    #[test]
    fn a_frame_read_before_the_other_directions_next_chunk_is_not_held() {
        let pacer = Pacer::new(false);
        let t0 = Instant::now();
        let request =
            line(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay"}}"#);
        let mut obs = Observer::new(crate::observe::tests::cfg(), Vec::new());
        let mut reorder = Reorder::default();
        let later = Ahead::Next(t0 + Duration::from_millis(1));
        reorder.push(
            &mut obs,
            DIRS[0],
            t0,
            &request,
            Split::Frame(&request),
            later,
        );
        assert!(reorder.is_empty(), "observed at once");
        assert_eq!(obs.actions.len(), 1);
        let earlier = Ahead::Next(t0);
        let second =
            line(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"pay"}}"#);
        let at = t0 + Duration::from_millis(2);
        reorder.push(
            &mut obs,
            DIRS[0],
            at,
            &second,
            Split::Frame(&second),
            earlier,
        );
        assert!(
            !reorder.is_empty(),
            "an earlier chunk of the other direction may answer first"
        );
        assert!(!reorder.release(&mut obs, at, false, 64, [Ahead::Nothing, earlier], &pacer));
        assert_eq!(obs.actions.len(), 1);
        reorder.release(
            &mut obs,
            at,
            false,
            64,
            [Ahead::Nothing, Ahead::Nothing],
            &pacer,
        );
        assert!(reorder.is_empty());
        assert_eq!(obs.actions.len(), 2);
    }

    use std::sync::Arc;

    /// A sink whose queue length the test sets, and which says when it took events.
    struct Queued {
        queued: Arc<std::sync::atomic::AtomicUsize>,
        taken: Arc<tokio::sync::Notify>,
    }

    impl EventSink for Queued {
        fn emit(&mut self, _: crate::event::Event) {}

        fn queued(&self) -> usize {
            self.queued.load(Relaxed)
        }

        fn taken(&self) -> Option<Arc<tokio::sync::Notify>> {
            Some(self.taken.clone())
        }
    }

    /// Past [`SINK_AHEAD`] queued events the observer waits until the reporter takes some, and
    /// is woken by it: not before, and not only when the stall limit ends the wait.
    #[tokio::test]
    async fn the_observer_waits_for_the_reporter_past_two_batches() {
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(SINK_AHEAD));
        let taken = Arc::new(tokio::sync::Notify::new());
        let sink = Queued {
            queued: queued.clone(),
            taken: taken.clone(),
        };
        let obs = Observer::new(crate::observe::tests::cfg(), sink);
        let (_never, close) = watch::channel(None);
        let mut stalled = None;
        // At the mark: no wait.
        pace_to_sink(&obs, &mut stalled, &close).await;
        assert!(stalled.is_none());

        queued.store(SINK_AHEAD + 1, Relaxed);
        let (q, t) = (queued.clone(), taken.clone());
        let reporter = tokio::spawn(async move {
            // Wake it once with nothing taken: it must go on waiting.
            tokio::time::sleep(Duration::from_millis(20)).await;
            t.notify_one();
            tokio::time::sleep(Duration::from_millis(20)).await;
            q.store(SINK_AHEAD - 500, Relaxed);
            t.notify_one();
        });
        let t0 = Instant::now();
        pace_to_sink(&obs, &mut stalled, &close).await;
        let waited = t0.elapsed();
        assert!(
            queued.load(Relaxed) < SINK_AHEAD,
            "returned before the take"
        );
        assert!(
            waited < SINK_STALL_LIMIT,
            "ended by the stall limit: {waited:?}"
        );
        assert!(stalled.is_none());
        reporter.await.expect("reporter");

        // A reporter that never takes (an ingest that hangs) holds it up once, for the stall
        // limit, and then not again while the queue stays long.
        queued.store(SINK_AHEAD + 1, Relaxed);
        let t0 = Instant::now();
        pace_to_sink(&obs, &mut stalled, &close).await;
        assert!(t0.elapsed() >= SINK_STALL_LIMIT);
        let t1 = Instant::now();
        pace_to_sink(&obs, &mut stalled, &close).await;
        assert!(t1.elapsed() < SINK_STALL_LIMIT);
        assert!(stalled.is_some());
    }
}
