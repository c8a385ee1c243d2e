//! Arbitrary byte streams in both directions through the stdio observation path, fed exactly
//! as the relay feeds it: each relay loop offers the chunks it forwarded to its `TapSender`
//! (which passes over the middle of large frames and drops what exceeds the tap's byte budget),
//! and `run_tap_observer` splits, reorders by relay timestamp, peeks and correlates them; then
//! the session ends (call timeouts, end cause).
//!
//! Input: records. `op & 3` = 0 or 1: a chunk for client→server or server→client, read
//! `op >> 2` steps of the clock after the previous one in that direction, then a little-endian
//! `u16` length and that many bytes. `op & 3` = 2: `op >> 2` picks an action: close a direction,
//! or repeat a pattern (one byte length, the pattern, one byte count × 16 KiB) into a large
//! chunk, so frames of megabytes cost a few input bytes. The first byte picks the tap's byte
//! budget, the call timeout and how the session ends.
//!
//! Asserts: no panic; the observer never counts more bytes than were offered; every event it
//! builds passes the sensor's own L3 filter (an event the filter rejects would be lost); with
//! the libFuzzer memory limits, memory stays bounded by the caps.

#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bounded_observe_mcp::event::{filter_event, Event};
use bounded_observe_mcp::observe::{
    run_tap_observer, EndCause, Observer, ObserverConfig, Transport,
};
use bounded_observe_mcp::pace::Pacer;
use bounded_observe_mcp::tap::{tap_with_budget, TAP_BUDGET_BYTES, TAP_CAPACITY};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

/// Most bytes the repeat records may add per input: frames well over every cap, few of them.
const MAX_REPEATED: usize = 4 * 1024 * 1024;

thread_local! {
    static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
}

fn step_ms(n: u8) -> u64 {
    // 0 ms … 62 s: simultaneous reads, the reorder hold (25 ms), the early-response grace
    // (2 s), the call timeout.
    u64::from(n).pow(3) / 4
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, mut rest)) = data.split_first() else {
        return;
    };
    let budget = [TAP_BUDGET_BYTES, 64 * 1024, 2048, 300][usize::from(first & 3)];
    let call_timeout = Duration::from_millis(if first & 4 == 0 { 60_000 } else { 1_500 });
    let cause = [
        EndCause::SessionEnd,
        EndCause::Transport,
        EndCause::ClientClosed,
    ][usize::from(first >> 3) % 3];

    let (c2s, s2c, rx, stats) = tap_with_budget(TAP_CAPACITY, budget);
    let mut senders = [Some(c2s), Some(s2c)];
    let base = Instant::now();
    let mut clock = [0u64; 2];
    let mut repeated = 0usize;
    while let Some((&op, r)) = rest.split_first() {
        rest = r;
        match op & 3 {
            d @ (0 | 1) => {
                let d = usize::from(d);
                let Some((len, r)) = rest.split_first_chunk::<2>() else {
                    break;
                };
                let len = usize::from(u16::from_le_bytes(*len)).min(r.len());
                let (chunk, r) = r.split_at(len);
                rest = r;
                clock[d] += step_ms(op >> 2);
                if let Some(s) = senders[d].as_mut() {
                    let seen = base + Duration::from_millis(clock[d]);
                    s.begin(seen);
                    s.offer(seen, Bytes::copy_from_slice(chunk));
                }
            }
            2 => match (op >> 2) & 3 {
                d @ (0 | 1) => {
                    let d = usize::from(d);
                    if let Some(s) = senders[d].take() {
                        s.close(base + Duration::from_millis(clock[d]));
                    }
                }
                d => {
                    let d = usize::from(d - 2);
                    let Some((&plen, r)) = rest.split_first() else {
                        break;
                    };
                    let plen = usize::from(plen % 16 + 1).min(r.len());
                    let (pattern, r) = r.split_at(plen);
                    let Some((&count, r)) = r.split_first() else {
                        break;
                    };
                    rest = r;
                    let n = (usize::from(count) * 16 * 1024).min(MAX_REPEATED - repeated);
                    repeated += n;
                    if pattern.is_empty() || n == 0 {
                        continue;
                    }
                    // `repeat` copies by doubling, not byte by byte under instrumentation.
                    let big = Bytes::from(pattern.repeat(n.div_ceil(pattern.len()))).slice(..n);
                    if let Some(s) = senders[d].as_mut() {
                        let seen = base + Duration::from_millis(clock[d]);
                        s.begin(seen);
                        s.offer(seen, big);
                    }
                }
            },
            _ => {}
        }
    }
    // The relay's loops end: EOF in both directions.
    for (d, s) in senders.iter_mut().enumerate() {
        if let Some(s) = s.take() {
            s.close(base + Duration::from_millis(clock[d]));
        }
    }

    let cfg = ObserverConfig {
        transport: Transport::Stdio,
        server_name: None,
        actor: "mcp:k_fuzz".into(),
        on_behalf_of: None,
        capture: vec!["order_id".into()],
        capture_text: Vec::new(),
        call_timeout,
    };
    let observer = Observer::new(cfg, Vec::<Event>::new());
    let pacer = Arc::new(Pacer::new(false));
    let mut observer = RT.with(|rt| rt.block_on(run_tap_observer(rx, observer, pacer)));
    let end = base + Duration::from_millis(clock[0].max(clock[1]));
    observer.on_tick(end + call_timeout / 2);
    let (ostats, events) = observer.finish(end + call_timeout, cause);

    use std::sync::atomic::Ordering::Relaxed;
    for d in 0..2 {
        let offered = stats.offered_bytes[d].load(Relaxed);
        assert!(
            ostats.bytes[d] <= offered,
            "observed {} bytes of {offered} offered",
            ostats.bytes[d]
        );
    }
    assert_eq!(ostats.events, events.len() as u64);
    for e in events {
        let shown = format!("{e:?}");
        assert!(
            filter_event(e).is_ok(),
            "the sensor's L3 rejects its own event: {shown}"
        );
    }
});
