//! bounded-observe-mcp: a metadata-only telemetry sensor for MCP servers.
//!
//! The crate reads top to bottom as the journey of one message:
//!
//! * [`cli`] → [`config`]: argv and an environment map become a validated [`config::Config`].
//! * `run`: wires one run (config → reporter → observer → relay) for either transport; the
//!   only module that knows every stage.
//! * [`proxy::stdio`] / [`proxy::http`]: forward every byte unchanged (the relay) and hand a
//!   cheap copy of it on, never waiting: to the [`tap`] (stdio) or to its HTTP hand-off
//!   [`tap::http`] (body chunks with their exchange's method, status and content type).
//! * [`observe`]: splits the copies into frames (SSE events for HTTP, [`observe::sse`]), peeks
//!   at the JSON-RPC fields it needs, correlates requests with responses per (scope,
//!   direction, id) and builds one [`event::Event`] per `tools/call`; HTTP exchanges are turned
//!   into the same observer calls by [`observe::http`].
//! * [`event`]: the envelope v2, the privacy layers and `validate_and_filter_event` (L3), shared
//!   with the ingest.
//! * [`report`]: batches filtered events and posts them fire-and-forget, counting what it drops.
//! * [`otlp`]: beside the reporter, the same events as OTLP spans and metrics (MCP semantic
//!   conventions), with the same discipline.
//! * [`pace`]: how the observer and the reporter share a CPU with the relay; owned by neither.
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
pub mod otlp;
pub mod pace;
pub mod proxy;
pub(crate) mod random;
pub mod report;
mod run;
pub mod tap;
pub(crate) mod text;
pub mod token;

use std::ffi::OsString;

pub use config::Env;

pub use cli::EXIT_USAGE;

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
        Some("demo") if argv.len() == 2 => return demo::run(&env, false),
        Some("demo") if argv.len() == 3 && argv[2] == "--keep" => return demo::run(&env, true),
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
    run::run(args, env)
}
