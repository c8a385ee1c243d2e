//! Wires one run of the sensor: configuration → reporter → observer → relay, for both
//! transports.
//!
//! Owns the order things start and stop in, the observer's runtime and thread, the translation
//! of what a relay reports into what the observer needs (a stdio session's [`SessionEnd`]
//! becomes an [`EndCause`]), the exit deadline of a stdio session (kept by the main thread, see
//! [`StdioObserver`]), which mechanisms the benchmark switched off
//! ([`crate::config::BenchSwitches`]), and the `--debug` totals printed at exit. Goes in: parsed
//! flags and the environment map. Comes out: the exit code. It is the one module that knows every
//! stage, so that no stage has to know the one after it (a relay knows its tap or hand-off, the
//! observer its sink). It must never do a stage's work itself, never let observation stop the
//! relay (whatever cannot start, the server still runs, unobserved: invariant 8), and never let
//! it hold the exit past the shutdown flush.

use std::ffi::OsString;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::cli::ObserveArgs;
use crate::cli::EXIT_USAGE;
use crate::config::{Config, Env, IngestTarget, Mode};
use crate::log::PREFIX;
use crate::observe::{
    self, CloseReceiver, EndCause, Observer, ObserverConfig, ObserverStats, Progress, SessionClose,
    StdioOptions, Transport,
};
use crate::otlp::{self, CounterSource, Network, OtlpStart, OtlpStats, SensorCounts, WithOtlp};
use crate::pace::Pacer;
use crate::proxy::http::{Listener, Upstream, EXIT_START_FAILED};
use crate::proxy::stdio::{SessionEnd, StdioOutcome, StdioProxy, Tapped};
use crate::report::{self, ReportConfig, ReportStats, ReportWatch};
use crate::tap::{self, TapStats};

/// Runs the sensor from parsed flags to the end of the session: [`crate::run_observe_args`].
pub(crate) fn run(args: &ObserveArgs, env: &Env) -> i32 {
    let (cfg, warnings) = match Config::resolve(args, env) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{PREFIX} error: {e}");
            return EXIT_USAGE;
        }
    };

    if cfg.disabled {
        if let Mode::Stdio { program, args } = &cfg.mode {
            return crate::proxy::stdio::exec_passthrough(program, args);
        }
        // HTTP mode keeps its listener's warnings (refused Hosts and Origins, bad
        // --allow-origin values) with the kill switch: they are security, not observation.
    }

    crate::log::init(cfg.debug);
    for w in &warnings {
        tracing::warn!("{w}");
    }

    match &cfg.mode {
        Mode::Http { .. } => run_http(&cfg),
        Mode::Stdio { .. } => run_stdio(&cfg),
    }
}

fn observer_config(cfg: &Config, transport: Transport) -> ObserverConfig {
    ObserverConfig {
        transport,
        server_name: cfg.server_name.clone(),
        actor: cfg.actor.clone(),
        on_behalf_of: cfg.on_behalf_of.clone(),
        capture: cfg.capture.clone(),
        capture_text: cfg.capture_text.clone(),
        call_timeout: cfg.call_timeout,
    }
}

fn report_config(cfg: &Config, transport: &'static str) -> ReportConfig {
    ReportConfig {
        target: cfg.ingest.clone(),
        token: cfg.token.clone(),
        flush: cfg.flush,
        shutdown_flush: cfg.shutdown_flush,
        transport,
        debug: cfg.debug,
        ingest_ca: cfg.ingest_ca.clone(),
        pacer: None,
    }
}

/// Says (`--debug`) how a stdio session ended, and how the calls still open then are ended: a
/// server that went away is a transport failure, any other end of session a timeout.
fn session_ended(outcome: &StdioOutcome) -> EndCause {
    let cause = match outcome.ended {
        SessionEnd::ServerGone => EndCause::Transport,
        SessionEnd::ByClient => EndCause::SessionEnd,
    };
    tracing::debug!(exit_code = outcome.exit_code, end_cause = ?cause, "Session ended");
    cause
}

/// The stdio relay with no tap, as the kill switch would run it but keeping the wrapper's
/// lifecycle (signals, grace periods, exit codes).
fn relay_unobserved(program: &OsString, args: &[OsString]) -> i32 {
    let outcome = StdioProxy::new(program.clone(), args.to_vec()).run(None, None);
    session_ended(&outcome);
    outcome.exit_code
}

fn run_stdio(cfg: &Config) -> i32 {
    let Mode::Stdio { program, args } = &cfg.mode else {
        return EXIT_USAGE;
    };
    // With nowhere to send events and no --debug totals to print, observing would only cost
    // CPU and memory on the server's path: relay unobserved, exactly as the kill switch would,
    // but keeping the lifecycle (signals, grace periods, exit codes) of the wrapper.
    if cfg.ingest == IngestTarget::Off && !cfg.debug && cfg.otlp.is_none() {
        return relay_unobserved(program, args);
    }
    let (mut c2s, mut s2c, rx, tap_stats) = tap::tap(tap::TAP_CAPACITY);
    c2s.set_trim(cfg.bench.trim);
    s2c.set_trim(cfg.bench.trim);
    // The observer's thread starts before the server: only its creation is on this thread, and
    // its start-up (runtime, ingest client, first look at the tap) then overlaps the server's
    // instead of delaying the exit of a short session.
    let observer = match StdioObserver::start(cfg, rx, tap_stats.clone()) {
        Ok(o) => o,
        Err(e) => {
            // Fail open: relay unobserved.
            tracing::warn!("Cannot start the observer ({e}); running the server unobserved");
            return relay_unobserved(program, args);
        }
    };
    // The relay runs on its own threads; this (main) thread spawns the server and drives the
    // session.
    let proxy = StdioProxy::new(program.clone(), args.clone());
    let (prefault, tee) = (cfg.bench.prefault, cfg.bench.tee);
    let outcome = proxy.run(
        Some(Tapped {
            tx: c2s,
            prefault,
            tee,
        }),
        Some(Tapped {
            tx: s2c,
            prefault,
            tee,
        }),
    );
    let cause = session_ended(&outcome);
    observer.finish(cfg, cause, &tap_stats);
    outcome.exit_code
}

/// Of the shutdown flush (`--shutdown-flush-ms`, counted from the server's exit), the share the
/// observer may spend working through what the tap still holds, in percent; the rest is left
/// to deliver what it made. Events reach the reporter as they are made and full batches go at
/// once, so what is left to deliver at the cut-off is at most a batch and what was queued.
const OBSERVE_SHARE_PERCENT: u32 = 75;

/// Longer than any session's wait; short enough to add to an `Instant` without overflow.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Before the end of the shutdown flush, when the reporter must be done: what the observer's
/// thread needs to hand its totals back after its own deadline.
const HAND_BACK: Duration = Duration::from_millis(5);

/// The stdio observer and reporter: one thread in the batch class nine nice levels below the
/// wrapper (see [`crate::pace`]) with a runtime of its own. The session's (main) thread never
/// waits for it past the shutdown flush: such a thread gets little of a CPU that normal-priority
/// threads keep busy, so the deadline is kept by the session's thread,
/// and what the observer did not get to is counted from what [`Progress`] and [`ReportWatch`]
/// say.
struct StdioObserver {
    close: watch::Sender<Option<SessionClose>>,
    shared: Arc<ObserverShared>,
    done: std::sync::mpsc::Receiver<StdioTotals>,
}

/// What the session's thread can read of the observer's thread at any time.
#[derive(Default)]
struct ObserverShared {
    progress: Arc<Progress>,
    report: OnceLock<ReportWatch>,
    pacer: OnceLock<Arc<Pacer>>,
    /// Threads lowered (see [`ObserverShared::lower_current_thread`]), and
    /// whether the session has ended (then no thread is lowered any more).
    lowered: std::sync::Mutex<(Vec<i32>, bool)>,
    /// The nice value the observer's thread was lowered to, for the threads that work for it.
    level: OnceLock<i32>,
}

impl ObserverShared {
    /// [`crate::pace::lower_current_thread`] while the session lasts, remembering the thread
    /// for [`ObserverShared::restore_threads`].
    fn lower_current_thread(&self) {
        self.lower_with(|| {
            let level = crate::pace::lower_current_thread()?;
            let _ = self.level.set(level);
            Some(level)
        });
    }

    /// A thread of the observer's runtime's blocking pool (the file sink's writes): lowered to
    /// the observer thread's level ([`crate::pace::lower_current_thread_to`]), not below it.
    fn lower_pool_thread(&self) {
        if let Some(&level) = self.level.get() {
            self.lower_with(|| crate::pace::lower_current_thread_to(level));
        }
    }

    /// Runs `lower` on the calling thread unless the session has ended, and remembers the
    /// thread when it lowered it.
    fn lower_with(&self, lower: impl FnOnce() -> Option<i32>) {
        let mut lowered = crate::lock::lock(&self.lowered);
        let (threads, ended) = &mut *lowered;
        if !*ended && lower().is_some() {
            threads.push(nix::unistd::gettid().as_raw());
        }
    }

    /// The session has ended: puts the observer's threads back in the normal class where the
    /// kernel allows it (see [`crate::pace::restore_thread`]), and lowers none from now on.
    fn restore_threads(&self) {
        let mut lowered = crate::lock::lock(&self.lowered);
        lowered.1 = true;
        for &tid in &lowered.0 {
            crate::pace::restore_thread(tid);
        }
    }
}

/// The observer's thread's totals, handed back when it is done.
struct StdioTotals {
    observer: ObserverStats,
    report: ReportStats,
}

impl StdioObserver {
    fn start(
        cfg: &Config,
        rx: tap::TapReceiver,
        tap_stats: Arc<TapStats>,
    ) -> std::io::Result<StdioObserver> {
        let (close, close_rx) = watch::channel(None);
        let shared = Arc::new(ObserverShared::default());
        // The sensor's own counters for OTLP, read when metrics are exported.
        let read = shared.clone();
        let counters: CounterSource = Arc::new(move || SensorCounts {
            ingest_dropped: read.report.get().map_or(0, |r| r.snapshot().dropped),
            calls_unobserved: Some(read.progress.idle().stats.unobserved),
            tap_bytes_dropped: tap_stats.dropped_bytes[0].load(Relaxed)
                + tap_stats.dropped_bytes[1].load(Relaxed),
        });
        let (done_tx, done) = std::sync::mpsc::channel();
        let cfg = cfg.clone();
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("observe-mcp".into())
            .spawn(move || observe_stdio(&cfg, rx, close_rx, thread_shared, done_tx, counters))?;
        Ok(StdioObserver {
            close,
            shared,
            done,
        })
    }

    /// The server is gone (`cause` says how): tells the observer, then waits for its totals at
    /// most until the shutdown flush has passed, counted from now. Returns at once when
    /// nothing is left to observe or deliver.
    fn finish(self, cfg: &Config, cause: EndCause, tap_stats: &TapStats) {
        let now = Instant::now();
        // A flush of centuries (the flag takes any number) is as good as forever.
        let flush = cfg.shutdown_flush.min(FOREVER);
        let by = now + flush;
        let observe_until = now + flush * OBSERVE_SHARE_PERCENT / 100;
        let deliver_by = by.checked_sub(HAND_BACK).unwrap_or(now).max(observe_until);
        let _ = self.close.send(Some(SessionClose {
            cause,
            observe_until,
            deliver_by,
        }));
        // The relay is done: the lowered priority protects nothing any more, and at it the observer's
        // thread may neither finish in time nor, busy at exit, let the process end promptly.
        self.shared.restore_threads();
        let queued = queued_bytes(tap_stats);
        let report = self.shared.report.get();
        let idle = self.shared.progress.idle();
        // Health counts go out with the last batch, or in one of their own when no event is left
        // (`sensor.health`): a session that had any must let the reporter send them. Counted
        // since the start, so a session whose counts already went out waits too, within the
        // deadline: rare, and cheaper than a second ledger.
        let s = &idle.stats;
        let health_to_report = s.non_json + s.oversize + s.orphan_responses + s.unobserved > 0
            || tap_stats.dropped_bytes[0].load(Relaxed) + tap_stats.dropped_bytes[1].load(Relaxed)
                > 0;
        // With OTLP on, the exporter's last spans and metrics are always still to send.
        let nothing_left = cfg.otlp.is_none()
            && !health_to_report
            && (queued == [0, 0]
                || (idle.settled
                    && idle.taken == queued
                    && report.is_none_or(|r| r.outstanding() == 0)));
        let (observer, report, finished) = if nothing_left {
            // Every byte was observed with nothing held, and every event delivered: ending the
            // observer would make nothing more, so the exit does not wait for its thread.
            let report = report.map(ReportWatch::snapshot).unwrap_or_default();
            (Some(idle.stats), report, true)
        } else {
            match self
                .done
                .recv_timeout(by.saturating_duration_since(Instant::now()))
            {
                Ok(t) => (Some(t.observer), t.report, true),
                // Past the deadline, or the thread is gone without totals (it could not start
                // its runtime): what it did not get to is counted, from outside.
                Err(e) => {
                    let report = report.map(ReportWatch::abandoned).unwrap_or_default();
                    (None, report, e == RecvTimeoutError::Disconnected)
                }
            }
        };
        let taken = self.shared.progress.taken();
        let unread = [
            queued[0].saturating_sub(taken[0]),
            queued[1].saturating_sub(taken[1]),
        ];
        if unread != [0, 0] || !finished {
            tracing::warn!(
                unread_bytes_c2s = unread[0],
                unread_bytes_s2c = unread[1],
                dropped = report.dropped,
                "Shutdown flush deadline reached: traffic left unread makes no event, and events not delivered are counted as dropped"
            );
        }
        if cfg.debug {
            debug_totals(
                observer.as_ref(),
                self.shared.pacer.get(),
                tap_stats,
                unread,
                &report,
            );
        }
    }
}

/// Tap bytes queued for the observer so far, per direction: what the relay offered, less what
/// was dropped and the skipped middles of large frames. Once the tap is closed, what the
/// observer took in ([`Progress::taken`]) reaches it when nothing was left unread.
fn queued_bytes(tap: &TapStats) -> [u64; 2] {
    [
        tap.passed_bytes(tap::Direction::ClientToServer),
        tap.passed_bytes(tap::Direction::ServerToClient),
    ]
}

/// The observer's thread: observes until the session ends, ends open calls, delivers, and
/// hands the totals back (unless the session's thread stopped waiting).
fn observe_stdio(
    cfg: &Config,
    rx: tap::TapReceiver,
    mut close: CloseReceiver,
    shared: Arc<ObserverShared>,
    done: std::sync::mpsc::Sender<StdioTotals>,
    counters: CounterSource,
) {
    // Lowered from the first instruction on: nothing this thread does (building the runtime,
    // the ingest client) may take the CPU from the relay or the server starting up.
    let lower = cfg.bench.idle;
    if lower {
        shared.lower_current_thread();
    }
    tap::detect_cpu_features();
    let pool_shared = shared.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("observe-mcp")
        .on_thread_start(move || {
            // The blocking pool (file sink writes) runs below the relay too, beside the
            // observer thread that waits for it.
            if lower {
                pool_shared.lower_pool_thread();
            }
        })
        .build();
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            // Fail open: the relay goes on; the tap drops what it cannot queue.
            tracing::warn!("Cannot start the observer ({e}); the server runs unobserved");
            return;
        }
    };
    let totals = rt.block_on(async {
        let pacer = Arc::new(if cfg.bench.pacer {
            Pacer::default()
        } else {
            // Never rests nor yields: the benchmark's `pacer` switch.
            Pacer::new(false)
        });
        let _ = shared.pacer.set(pacer.clone());
        // Observer, reporter and OTLP exporter share this thread and, on a CPU shared with the
        // relay, one pace.
        let (queue, reporter) = report::start(ReportConfig {
            pacer: Some(pacer.clone()),
            ..report_config(cfg, "stdio")
        });
        let _ = shared.report.set(reporter.watch());
        let (otlp_queue, otlp) =
            start_otlp(cfg, Network::stdio(), Some(counters), Some(pacer.clone()));
        let queue = WithOtlp {
            inner: queue,
            otlp: otlp_queue,
        };
        let observer = Observer::new(observer_config(cfg, Transport::Stdio), queue);
        let opts = StdioOptions {
            summarize: cfg.bench.summary,
            close: close.clone(),
            progress: shared.progress.clone(),
            stock: cfg.bench.prefault,
        };
        let observer = observe::run_tap_observer_with(rx, observer, pacer, &opts).await;
        // The tap closes before the session's thread says how the session ended.
        let end = close
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|c| *c)?;
        let (stats, queue) = observer.finish(Instant::now(), end.cause);
        drop(queue);
        let by = tokio::time::Instant::from_std(end.deliver_by);
        let (report, otlp) = tokio::join!(reporter.shutdown_by(by), shutdown_otlp(otlp, by));
        debug_otlp(cfg, otlp);
        Some(StdioTotals {
            observer: stats,
            report,
        })
    });
    // Nothing here is waited for any more (the file sink's last write has returned). Before the
    // hand-back: once the session's thread has the totals the process may exit, and a thread
    // still to be woken and ended then delays that exit.
    rt.shutdown_background();
    if let Some(totals) = totals {
        let _ = done.send(totals);
    }
}

/// The `--debug` totals of a stdio session. `observer` is `None` when the observer's thread did
/// not hand its totals back by the deadline.
fn debug_totals(
    observer: Option<&ObserverStats>,
    pacer: Option<&Arc<Pacer>>,
    tap_stats: &TapStats,
    unread: [u64; 2],
    report: &ReportStats,
) {
    if let Some(s) = observer {
        tracing::debug!(
            frames_c2s = s.frames[0],
            frames_s2c = s.frames[1],
            bytes_c2s = s.bytes[0],
            bytes_s2c = s.bytes[1],
            events = s.events,
            non_json = s.non_json,
            malformed = s.malformed,
            oversize = s.oversize,
            summarized = s.summarized,
            duplicate_ids = s.duplicate_ids,
            orphan_responses = s.orphan_responses,
            gaps = s.gaps,
            unobserved = s.unobserved,
            evicted_calls = s.evicted,
            redacted_tools = s.redacted_tools,
            prose_withheld = s.prose_withheld,
            shared_cpu = pacer.is_some_and(|p| p.shared_cpu()),
            rests = pacer.map_or(0, |p| p.rests()),
            yields = pacer.map_or(0, |p| p.yields()),
            "Observer totals"
        );
    } else {
        tracing::debug!("Observer totals unknown: the observer did not finish by the deadline");
    }
    tracing::debug!(
        tap_dropped_chunks_c2s = tap_stats.dropped_chunks[0].load(Relaxed),
        tap_dropped_chunks_s2c = tap_stats.dropped_chunks[1].load(Relaxed),
        tap_dropped_bytes_c2s = tap_stats.dropped_bytes[0].load(Relaxed),
        tap_dropped_bytes_s2c = tap_stats.dropped_bytes[1].load(Relaxed),
        tap_skipped_bytes_c2s = tap_stats.skipped_bytes[0].load(Relaxed),
        tap_skipped_bytes_s2c = tap_stats.skipped_bytes[1].load(Relaxed),
        unread_bytes_c2s = unread[0],
        unread_bytes_s2c = unread[1],
        delivered = report.delivered,
        dropped = report.dropped,
        batches = report.batches,
        "Reporter totals"
    );
}

/// Starts the OTLP exporter when it is configured.
fn start_otlp(
    cfg: &Config,
    net: Network,
    counters: Option<CounterSource>,
    pacer: Option<Arc<Pacer>>,
) -> (Option<otlp::OtlpQueue>, Option<otlp::OtlpHandle>) {
    let Some(o) = &cfg.otlp else {
        return (None, None);
    };
    let (q, h) = otlp::start(OtlpStart {
        cfg: o.clone(),
        net,
        flush: cfg.flush,
        debug: cfg.debug,
        counters,
        pacer,
    });
    (Some(q), Some(h))
}

async fn shutdown_otlp(h: Option<otlp::OtlpHandle>, by: tokio::time::Instant) -> Option<OtlpStats> {
    match h {
        Some(h) => Some(h.shutdown_by(by).await),
        None => None,
    }
}

/// The `--debug` totals of the OTLP export.
fn debug_otlp(cfg: &Config, stats: Option<OtlpStats>) {
    if let (true, Some(s)) = (cfg.debug, stats) {
        tracing::debug!(
            spans_sent = s.spans_sent,
            spans_dropped = s.spans_dropped,
            filtered = s.filtered,
            metric_exports = s.metric_exports,
            metric_failures = s.metric_failures,
            "OTLP totals"
        );
    }
}

fn run_http(cfg: &Config) -> i32 {
    let Mode::Http { upstream, port } = &cfg.mode else {
        return EXIT_USAGE;
    };
    // Start-up failures come before anything is observed or printed as listening.
    let started = Upstream::parse(upstream).and_then(|u| Ok((u, Listener::bind(*port)?)));
    let (upstream, listener) = match started {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{PREFIX} error: {e}");
            return EXIT_START_FAILED;
        }
    };

    // Observation and reporting only when not disabled: the kill switch starts neither.
    let mut observing = None;
    let mut handoff = None;
    if !cfg.disabled {
        let (tx, rx) = tap::http::channel();
        match ObserverThread::start(cfg, upstream.host(), rx, tx.stats.clone()) {
            Ok(t) => {
                observing = Some(t);
                handoff = Some(tx);
            }
            // Fail open (invariant 8): relay unobserved.
            Err(e) => tracing::warn!(error = %e, "Cannot start the observer; relaying unobserved"),
        }
    }
    let handoff_stats = handoff.as_ref().map(|h| h.stats.clone());

    let code = listener.serve(upstream, cfg.drain, &cfg.allow_origins, handoff);

    // Every sender is gone with the relay: the observer ends what is in flight and returns.
    if let Some(t) = observing {
        t.join(cfg.shutdown_flush);
    }
    if cfg.debug {
        if let Some(s) = handoff_stats {
            tracing::debug!(
                sent = s.sent.load(Relaxed),
                dropped = s.dropped.load(Relaxed),
                dropped_bytes = s.dropped_bytes.load(Relaxed),
                "Observation channel totals"
            );
        }
    }
    code
}

/// HTTP observation and reporting on a thread and runtime of their own: parsing a 25 MB
/// response or a slow ingest never takes a turn from the relay's worker.
struct ObserverThread {
    done: std::sync::mpsc::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
}

/// On top of the reporter's own flush deadline: the observer's last work and thread exit.
const OBSERVER_EXIT_GRACE: Duration = Duration::from_millis(500);

impl ObserverThread {
    fn start(
        cfg: &Config,
        host: String,
        rx: tap::http::ExchangeReceiver,
        handoff: Arc<tap::http::ExchangeStats>,
    ) -> std::io::Result<ObserverThread> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let cfg = cfg.clone();
        let (done_tx, done) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("observe-mcp-observer".into())
            .spawn(move || {
                rt.block_on(observe_and_report(&cfg, host, rx, handoff));
                let _ = done_tx.send(());
            })?;
        Ok(ObserverThread { done, thread })
    }

    /// Waits for the observer to end what is in flight and the reporter to flush, within the
    /// flush deadline; past it the process exits without them (the events are lost, said once).
    fn join(self, flush: Duration) {
        match self.done.recv_timeout(flush + OBSERVER_EXIT_GRACE) {
            Ok(()) => {
                let _ = self.thread.join();
            }
            Err(_) => tracing::warn!("Shutdown flush timed out; queued events dropped"),
        }
    }
}

/// The observer thread's whole life: runs until every sender of the hand-off is gone.
async fn observe_and_report(
    cfg: &Config,
    host: String,
    rx: tap::http::ExchangeReceiver,
    handoff: Arc<tap::http::ExchangeStats>,
) {
    let (queue, reporter) = report::start(report_config(cfg, "http"));
    let net = match &cfg.mode {
        Mode::Http { upstream, .. } => Network::http(upstream),
        Mode::Stdio { .. } => Network::stdio(),
    };
    // Calls left unobserved are known to the observer alone, at the end: not exported here.
    let watch = reporter.watch();
    let counters: CounterSource = Arc::new(move || SensorCounts {
        ingest_dropped: watch.snapshot().dropped,
        calls_unobserved: None,
        tap_bytes_dropped: handoff.dropped_bytes.load(Relaxed),
    });
    let (otlp_queue, otlp) = start_otlp(cfg, net, Some(counters), None);
    let queue = WithOtlp {
        inner: queue,
        otlp: otlp_queue,
    };
    let observer = Observer::new(observer_config(cfg, Transport::Http { host }), queue);
    let (observer, totals) = observe::http::run(rx, observer).await;
    let (stats, queue) = observer.finish(Instant::now(), EndCause::SessionEnd);
    drop(queue);
    let by = tokio::time::Instant::now() + cfg.shutdown_flush;
    let (report, otlp) = tokio::join!(reporter.shutdown_by(by), shutdown_otlp(otlp, by));
    debug_otlp(cfg, otlp);
    if cfg.debug {
        tracing::debug!(
            frames_c2s = stats.frames[0],
            frames_s2c = stats.frames[1],
            events = stats.events,
            exchanges = totals.exchanges,
            unparsed_bodies = totals.unparsed_bodies,
            compressed_bodies = totals.compressed_bodies,
            evicted_exchanges = totals.evicted,
            oversized_sse_events = totals.oversized_events,
            unobserved = stats.unobserved,
            evicted_calls = stats.evicted,
            delivered = report.delivered,
            dropped = report.dropped,
            "Observer and reporter totals"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_gone_ends_open_calls_as_transport_any_other_end_as_timeout() {
        let end = |ended| {
            session_ended(&StdioOutcome {
                exit_code: 0,
                ended,
            })
        };
        assert_eq!(end(SessionEnd::ServerGone), EndCause::Transport);
        assert_eq!(end(SessionEnd::ByClient), EndCause::SessionEnd);
    }
}
