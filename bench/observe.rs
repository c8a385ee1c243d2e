//! What the observer's work costs per call, in-process: the stdio benchmark's small
//! `tools/call` (the driver's requests and the mock server's answers, from
//! `bench/stdio/roles.rs`) fed straight to an [`Observer`], each event it makes checked by the
//! L3 filter and written into a batch body, as the reporter does. No relay, no threads, no tap,
//! no scheduler: one thread doing only the observer's and the batcher's work, so the figure
//! moves with that work and little else.
//!
//! Reports, per call: CPU time (the thread's own clock; median of the rounds, with min and max)
//! and heap allocations (counted by the allocator below, the same in every round: a figure that
//! does not depend on the machine's noise). Two shapes: one call in flight at a time
//! (sequential) and a thousand (pipelined), each over 50,000 calls a round.
//!
//! `cargo bench --bench observe [-- --rounds N] [--only sequential|pipelined]`. It measures and
//! reports; it never fails on a figure. See bench/README.md ("The observer alone"), and
//! `bench/instructions.sh` for the same work counted in instructions.

// The stdio benchmark's driver requests and mock server, whose bytes this feeds the observer.
// Only the request builders and `answer` are used here.
#[allow(dead_code)]
#[path = "stdio/roles.rs"]
mod roles;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bounded_observe_mcp::event::{BatchBody, Event, EventSink, EventWriter, SensorInfo};
use bounded_observe_mcp::observe::{EndCause, Observer, ObserverConfig, StreamId, Transport};
use bounded_observe_mcp::tap::Direction;

/// The system allocator, counting the allocations it is asked for.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method hands its arguments unchanged to `System`, whose `GlobalAlloc` contract
// is the same as the one the caller of these methods keeps; counting touches only an atomic.
// `main` checks the count moves with a known allocation before it measures anything.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Events per batch body before it is taken, as a full batch is.
const BATCH: usize = 500;

/// Calls per round.
const CALLS: usize = 50_000;

/// Calls in the one round `cargo test --benches` runs (no `--bench` flag): it checks that the
/// harness works, in a test build, in well under a second.
const SMOKE_CALLS: usize = 2_000;

/// What the reporter does with each event: L3 and written where it is made (the queue's
/// `EventWriter`), then into the batch body; a full body is taken (the bytes a sink would send)
/// and dropped.
struct Reporter {
    writer: EventWriter,
    body: BatchBody,
    sensor: SensorInfo,
    events: u64,
    bytes: u64,
}

impl EventSink for Reporter {
    fn emit(&mut self, mut event: Event) {
        let Ok(written) = self.writer.write(&mut event) else {
            return;
        };
        drop(event);
        self.body.push_written(&written, usize::MAX);
        self.events += 1;
        if self.body.len() >= BATCH {
            if let Ok(b) = self.body.take(&self.sensor, 0) {
                self.bytes += b.len() as u64;
            }
        }
    }
}

fn config() -> ObserverConfig {
    ObserverConfig {
        transport: Transport::Stdio,
        server_name: None,
        actor: "mcp:bench".into(),
        on_behalf_of: None,
        capture: vec![],
        capture_text: vec![],
        call_timeout: Duration::from_secs(300),
    }
}

/// A request line as the stdio benchmark's driver writes it, and the mock server's answer,
/// each without its newline (one frame, as the splitter hands it over).
fn exchange(request: &str) -> (Vec<u8>, Vec<u8>) {
    let req = request.trim_end().as_bytes().to_vec();
    let (mut resp, mut payload) = (Vec::new(), Vec::new());
    assert!(
        roles::answer(&req, &mut resp, &mut payload),
        "a request is answered"
    );
    resp.pop();
    (req, resp)
}

/// The frames of `n` `echo` calls, ids from `first`.
fn frames(first: u64, n: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    (first..first + n as u64)
        .map(|id| exchange(&roles::echo_request(id)))
        .collect()
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

struct Round {
    cpu_per_call: Duration,
    allocations_per_call: f64,
    bytes_per_call: f64,
    events: u64,
}

/// One round: a fresh observer through `initialize` and `tools/list`, then `calls` calls,
/// `depth` requests at a time followed by their answers.
fn round(calls: usize, depth: usize) -> Round {
    let reporter = Reporter {
        writer: EventWriter::default(),
        body: BatchBody::default(),
        sensor: SensorInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            transport: "stdio".into(),
            health: None,
        },
        events: 0,
        bytes: 0,
    };
    let mut obs = Observer::new(config(), reporter);
    let at = Instant::now();
    let (c2s, s2c) = (Direction::ClientToServer, Direction::ServerToClient);
    let s = StreamId(0);
    let tools_list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    for (req, resp) in [exchange(roles::INITIALIZE), exchange(tools_list)] {
        obs.on_frame(s, c2s, at, &req);
        obs.on_frame(s, s2c, at, &resp);
    }
    let frames = frames(2, calls);

    let (cpu0, allocs0) = (thread_cpu(), ALLOCATIONS.load(Ordering::Relaxed));
    for chunk in frames.chunks(depth) {
        // Stamped fresh, as the relay stamps its reads: the observer reads the wall clock
        // anew for a stamp far from where it last did (`WallClock`), and a stamp fixed at the
        // start made every call of a long round do so (under callgrind, every call).
        let at = Instant::now();
        for (req, _) in chunk {
            obs.on_frame(s, c2s, at, req);
        }
        for (_, resp) in chunk {
            obs.on_frame(s, s2c, at, resp);
        }
    }
    let (cpu1, allocs1) = (thread_cpu(), ALLOCATIONS.load(Ordering::Relaxed));

    let (_, reporter) = obs.finish(Instant::now(), EndCause::SessionEnd);
    let n = calls as f64;
    Round {
        cpu_per_call: (cpu1 - cpu0).div_f64(n),
        allocations_per_call: (allocs1 - allocs0) as f64 / n,
        bytes_per_call: reporter.bytes as f64 / n,
        events: reporter.events,
    }
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let (mut rounds, calls) = if benching {
        (9, CALLS)
    } else {
        (1, SMOKE_CALLS)
    };
    // `--only sequential|pipelined`: one shape, for `bench/instructions.sh`, which counts the
    // instructions of every round it runs.
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--rounds" {
            rounds = args
                .next()
                .and_then(|r| r.parse().ok())
                .unwrap_or(rounds)
                .max(1);
        } else if a == "--only" {
            only = args.next();
        }
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let probe = std::hint::black_box(Box::new(1u64));
    assert!(
        ALLOCATIONS.load(Ordering::Relaxed) > before,
        "the counting allocator counts"
    );
    drop(probe);

    println!("observer alone: {calls} small tools/call per round, {rounds} round(s), one thread");
    if !benching {
        println!("(smoke run, test build: run `cargo bench --bench observe` to measure)");
    }
    println!(
        "{:<22} {:>16} {:>16} {:>18} {:>14}",
        "shape", "CPU µs/call", "(min – max)", "allocations/call", "bytes/call"
    );
    for (name, depth) in [("sequential", 1usize), ("pipelined (1,000)", 1000)] {
        if only.as_deref().is_some_and(|o| !name.starts_with(o)) {
            continue;
        }
        // One round to warm the allocator and the caches, not counted.
        round(calls, depth);
        let mut all: Vec<Round> = (0..rounds).map(|_| round(calls, depth)).collect();
        all.sort_by_key(|r| r.cpu_per_call);
        let mid = &all[all.len() / 2];
        assert!(
            all.iter().all(|r| r.events == calls as u64),
            "every call made an event"
        );
        println!(
            "{:<22} {:>16.2} {:>16} {:>18.2} {:>14.0}",
            name,
            mid.cpu_per_call.as_secs_f64() * 1e6,
            format!(
                "{:.2} – {:.2}",
                all[0].cpu_per_call.as_secs_f64() * 1e6,
                all[all.len() - 1].cpu_per_call.as_secs_f64() * 1e6
            ),
            mid.allocations_per_call,
            mid.bytes_per_call,
        );
    }
}
