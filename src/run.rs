//! Wires one run of the sensor: configuration → reporter → observer → relay, for both
//! transports.
//!
//! Owns the order things start and stop in, the observer's runtime and thread, the translation
//! of what a relay reports into what the observer needs (a stdio session's [`SessionEnd`]
//! becomes an [`EndCause`]), and the `--debug` totals printed at exit. Goes in: parsed flags and
//! the environment map. Comes out: the exit code. It is the one module that knows every stage,
//! so that no stage has to know the one after it (a relay knows its tap or hand-off, the observer
//! its sink). It must never do a stage's work itself, and never let observation stop the relay:
//! whatever cannot start, the server still runs, unobserved (invariant 8).

use std::ffi::OsString;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cli::ObserveArgs;
use crate::cli::EXIT_USAGE;
use crate::config::{Config, Env, IngestTarget, Mode};
use crate::log::PREFIX;
use crate::observe::{self, EndCause, Observer, ObserverConfig, Transport};
use crate::proxy::http::{Listener, Upstream, EXIT_START_FAILED};
use crate::proxy::stdio::{SessionEnd, StdioOutcome, StdioProxy};
use crate::report::{self, ReportConfig};
use crate::tap;

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
    if cfg.ingest == IngestTarget::Off && !cfg.debug {
        return relay_unobserved(program, args);
    }
    // One worker: parsing, correlation and reporting are light, and the relay does not run here.
    // Its threads run below the relay's priority (see crate::pace): on a shared CPU the
    // relay always goes first and the observer catches up in the gaps.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("observe-mcp")
        .on_thread_start(|| {
            crate::pace::lower_current_thread();
        })
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            // Fail open: without a runtime we can still relay, unobserved.
            tracing::warn!("Cannot start the observer ({e}); running the server unobserved");
            return relay_unobserved(program, args);
        }
    };
    // Observer and reporter share one thread and, on a CPU shared with the relay, one pace.
    let pacer = Arc::new(crate::pace::Pacer::default());
    let (queue, reporter) = {
        let _guard = rt.enter();
        report::start(ReportConfig {
            pacer: Some(pacer.clone()),
            ..report_config(cfg, "stdio")
        })
    };
    let (c2s, s2c, rx, tap_stats) = tap::tap(tap::TAP_CAPACITY);
    let observer = Observer::new(observer_config(cfg, Transport::Stdio), queue);
    let observing = rt.spawn(observe::run_tap_observer(rx, observer, pacer.clone()));

    let proxy = StdioProxy::new(program.clone(), args.clone());
    // The relay runs on its own threads, not on the runtime: the caller's (main) thread spawns
    // the child and drives the session.
    let outcome = proxy.run(Some(c2s), Some(s2c));

    let cause = session_ended(&outcome);
    let stats = rt.block_on(async move {
        let observer = observing.await.ok()?;
        let (stats, queue) = observer.finish(Instant::now(), cause);
        drop(queue);
        Some(stats)
    });
    let report_stats = rt.block_on(reporter.shutdown());
    if cfg.debug {
        if let Some(s) = &stats {
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
                shared_cpu = pacer.shared_cpu(),
                rests = pacer.rests(),
                yields = pacer.yields(),
                "Observer totals"
            );
        }
        tracing::debug!(
            tap_dropped_chunks_c2s = tap_stats.dropped_chunks[0].load(Relaxed),
            tap_dropped_chunks_s2c = tap_stats.dropped_chunks[1].load(Relaxed),
            tap_dropped_bytes_c2s = tap_stats.dropped_bytes[0].load(Relaxed),
            tap_dropped_bytes_s2c = tap_stats.dropped_bytes[1].load(Relaxed),
            tap_skipped_bytes_c2s = tap_stats.skipped_bytes[0].load(Relaxed),
            tap_skipped_bytes_s2c = tap_stats.skipped_bytes[1].load(Relaxed),
            delivered = report_stats.delivered,
            dropped = report_stats.dropped,
            batches = report_stats.batches,
            "Reporter totals"
        );
    }
    rt.shutdown_timeout(Duration::from_millis(100));
    outcome.exit_code
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
        match ObserverThread::start(cfg, upstream.host(), rx) {
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
    ) -> std::io::Result<ObserverThread> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let cfg = cfg.clone();
        let (done_tx, done) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("observe-mcp-observer".into())
            .spawn(move || {
                rt.block_on(observe_and_report(&cfg, host, rx));
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
async fn observe_and_report(cfg: &Config, host: String, rx: tap::http::ExchangeReceiver) {
    let (queue, reporter) = report::start(report_config(cfg, "http"));
    let observer = Observer::new(observer_config(cfg, Transport::Http { host }), queue);
    let (observer, totals) = observe::http::run(rx, observer).await;
    let (stats, queue) = observer.finish(Instant::now(), EndCause::SessionEnd);
    drop(queue);
    let report = reporter.shutdown().await;
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
