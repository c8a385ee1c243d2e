//! bounded-observe-mcp: a metadata-only telemetry sensor for MCP servers.
//!
//! The crate reads top to bottom as the journey of one message:
//!
//! * [`cli`] → [`config`]: argv and an environment map become a validated [`config::Config`].
//! * [`proxy::stdio`] / [`proxy::http`]: forward every byte unchanged (the relay) and hand a
//!   cheap copy of it to the [`tap`], never waiting on it.
//! * [`observe`]: splits the copies into frames, peeks at the JSON-RPC fields it needs,
//!   correlates requests with responses per (stream, direction, id) and builds one
//!   [`event::Event`] per `tools/call`.
//! * [`event`]: the envelope v2, the privacy layers and `validate_and_filter_event` (L3), shared
//!   with the ingest.
//! * [`report`]: batches filtered events and posts them fire-and-forget, counting what it drops.
//! * [`ingest`]: the reference ingest (`bounded-ingest`), apart from the sensor's data path.
//! * [`http_client`]: the one HTTP client policy (no proxy variables, no redirects, the same
//!   timeouts, rustls + ring) every client of the crate is built with.
//!
//! [`run_mcp_observe`] is the whole sensor behind one call, for `main` and for a parent CLI.

#![forbid(unsafe_op_in_unsafe_fn)]

pub mod cli;
pub mod config;
pub mod demo;
pub mod event;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod http_client;
pub mod ingest;
pub(crate) mod lock;
pub mod log;
pub mod observe;
pub mod proxy;
pub(crate) mod random;
pub mod report;
pub mod tap;
pub mod token;

use std::ffi::OsString;
use std::time::Instant;

pub use config::Env;

/// Exit code for a usage error (unknown flag, missing server command).
pub const EXIT_USAGE: i32 = 2;

/// Runs the sensor: parses `argv` (program name first; a leading `observe mcp` is tolerated),
/// reads configuration from `env` (never from the process), runs the wrapped server to the end
/// and returns the exit code to use — the server's own. `env` is configuration only: the server
/// gets the process's environment minus every `BOUNDED_*` variable, never this map.
pub fn run_mcp_observe<I, T>(argv: I, env: Env) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    // `demo` and the demo's bundled server are words, not flags: the wrapper's own flags never
    // take a bare first argument (the server command always follows `--`), so they cannot clash.
    match argv.get(1).and_then(|a| a.to_str()) {
        Some("demo") if argv.len() == 2 => return demo::run(&env),
        Some(demo::DEMO_SERVER_ARG) => return demo::server::run(),
        Some("completions") if argv.len() == 3 => return cli::print_completions(&argv[2]),
        _ => {}
    }
    let cli = match cli::parse_argv(argv) {
        Ok(cli) => cli,
        Err(e) => {
            // --help/--version go to stdout as every CLI does; usage errors to stderr. No child
            // exists yet, so stdout is not the server's here.
            let _ = e.print();
            return if e.use_stderr() { EXIT_USAGE } else { 0 };
        }
    };
    run_observe_args(&cli.args, &env)
}

/// Runs the sensor from already-parsed flags: the entry point for a parent CLI that flattens
/// [`cli::ObserveArgs`] into its own `observe mcp` subcommand. Same behaviour and exit codes as
/// [`run_mcp_observe`].
pub fn run_observe_args(args: &cli::ObserveArgs, env: &Env) -> i32 {
    let (cfg, warnings) = match config::Config::resolve(args, env) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{} error: {e}", log::PREFIX);
            return EXIT_USAGE;
        }
    };

    if cfg.disabled {
        if let config::Mode::Stdio { program, args } = &cfg.mode {
            return proxy::stdio::exec_passthrough(program, args);
        }
        // HTTP mode keeps its listener's warnings (refused Hosts and Origins, bad
        // --allow-origin values) with the kill switch: they are security, not observation.
    }

    log::init(cfg.debug);
    for w in &warnings {
        tracing::warn!("{w}");
    }

    match &cfg.mode {
        config::Mode::Http { .. } => proxy::http::run(&cfg),
        config::Mode::Stdio { .. } => run_stdio(&cfg),
    }
}

pub(crate) fn observer_config(
    cfg: &config::Config,
    transport: observe::Transport,
) -> observe::ObserverConfig {
    observe::ObserverConfig {
        transport,
        server_name: cfg.server_name.clone(),
        actor: cfg.actor.clone(),
        on_behalf_of: cfg.on_behalf_of.clone(),
        capture: cfg.capture.clone(),
        capture_text: cfg.capture_text.clone(),
        call_timeout: cfg.call_timeout,
    }
}

pub(crate) fn report_config(cfg: &config::Config, transport: &'static str) -> report::ReportConfig {
    report::ReportConfig {
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

fn run_stdio(cfg: &config::Config) -> i32 {
    let config::Mode::Stdio { program, args } = &cfg.mode else {
        return EXIT_USAGE;
    };
    // With nowhere to send events and no --debug totals to print, observing would only cost
    // CPU and memory on the server's path: relay unobserved, exactly as the kill switch would,
    // but keeping the lifecycle (signals, grace periods, exit codes) of the wrapper.
    if cfg.ingest == config::IngestTarget::Off && !cfg.debug {
        return proxy::stdio::StdioProxy::new(program.clone(), args.clone()).run(None, None);
    }
    // One worker: parsing, correlation and reporting are light, and the relay does not run here.
    // Its threads run below the relay's priority (see observe::priority): on a shared CPU the
    // relay always goes first and the observer catches up in the gaps.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("observe-mcp")
        .on_thread_start(|| {
            observe::priority::lower_current_thread();
        })
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            // Fail open: without a runtime we can still relay, unobserved.
            tracing::warn!("Cannot start the observer ({e}); running the server unobserved");
            return proxy::stdio::StdioProxy::new(program.clone(), args.clone()).run(None, None);
        }
    };
    // Observer and reporter share one thread and, on a CPU shared with the relay, one pace.
    let pacer = std::sync::Arc::new(observe::priority::Pacer::default());
    let (queue, reporter) = {
        let _guard = rt.enter();
        report::start(report::ReportConfig {
            pacer: Some(pacer.clone()),
            ..report_config(cfg, "stdio")
        })
    };
    let (c2s, s2c, rx, tap_stats) = tap::tap(tap::TAP_CAPACITY);
    let observer = observe::Observer::new(observer_config(cfg, observe::Transport::Stdio), queue);
    let observing = rt.spawn(observe::run_tap_observer(rx, observer, pacer.clone()));

    let proxy = proxy::stdio::StdioProxy::new(program.clone(), args.clone());
    // The relay runs on its own threads, not on the runtime: the caller's (main) thread spawns
    // the child and drives the session.
    let outcome = proxy.run_observed(c2s, s2c);

    let cause = outcome.end_cause;
    let stats = rt.block_on(async move {
        let observer = observing.await.ok()?;
        let (stats, queue) = observer.finish(Instant::now(), cause);
        drop(queue);
        Some(stats)
    });
    let report_stats = rt.block_on(reporter.shutdown());
    if cfg.debug {
        use std::sync::atomic::Ordering::Relaxed;
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
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    outcome.exit_code
}
