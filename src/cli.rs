//! Raw command line: what the user typed, before any validation.
//!
//! Owns the clap definition of every flag (DESIGN §3). It never reads the process environment:
//! env fallbacks are applied by [`crate::config`] from a map passed in, so a parent CLI can embed
//! us and tests can drive every path without touching `std::env`.
//!
//! [`ObserveArgs`] is `clap::Args`, so a parent `bounded` CLI can `#[command(flatten)]` it under
//! its own `observe mcp` subcommand; [`parse_argv`] also tolerates a leading `observe mcp` so the
//! same argv works whichever way it is mounted.

use std::ffi::OsString;

use clap::{Args, Parser};

/// Exit code for a usage error (unknown flag, missing server command).
pub const EXIT_USAGE: i32 = 2;

/// Every flag the wrapper takes. Env names are listed in the help text; the flag wins.
#[derive(Debug, Clone, Default, Args)]
pub struct ObserveArgs {
    /// Sensor token `obs1.<keyId>.<sig>` used to report events [env: BOUNDED_SENSOR_TOKEN]
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,

    /// Organisation, for logs only; never sent (the ingest stamps it from the key) [env: BOUNDED_ORG]
    #[arg(long, value_name = "ORG")]
    pub org: Option<String>,

    /// Actor id put on every event [env: BOUNDED_ACTOR] [default: mcp:<keyId>]
    // The line above is `--help`'s text, as clap prints it: not a link, not HTML.
    #[allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]
    #[arg(long, value_name = "ID")]
    pub actor: Option<String>,

    /// Server name for `dest.host` [env: BOUNDED_MCP_SERVER_NAME] [default: serverInfo.name, else `mcp`]
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// Ingest base URL, or `file:PATH` to append batches as JSON lines [env: BOUNDED_INGEST_BASE] [default: http://127.0.0.1:7361]
    #[arg(long, value_name = "URL")]
    pub ingest: Option<String>,

    /// PEM file of a private CA to trust for an https:// ingest, besides the system's roots [env: BOUNDED_INGEST_CA]
    #[arg(long, value_name = "PATH")]
    pub ingest_ca: Option<std::path::PathBuf>,

    /// OTLP/HTTP base URL: every tools/call also becomes a span and metric points (/v1/traces, /v1/metrics appended); works with or without a token; request headers (an API key) from BOUNDED_OTLP_HEADERS or OTEL_EXPORTER_OTLP_HEADERS, never logged [env: BOUNDED_OTLP_ENDPOINT, then OTEL_EXPORTER_OTLP_ENDPOINT] [default: off]
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// OTLP encoding: http/protobuf or http/json (grpc is not supported) [env: BOUNDED_OTLP_PROTOCOL, then OTEL_EXPORTER_OTLP_PROTOCOL] [default: http/protobuf]
    #[arg(long, value_name = "PROTOCOL")]
    pub otlp_protocol: Option<String>,

    /// PEM file of a private CA to trust for an https:// OTLP endpoint [env: BOUNDED_OTLP_CA, then OTEL_EXPORTER_OTLP_CERTIFICATE]
    #[arg(long, value_name = "PATH")]
    pub otlp_ca: Option<std::path::PathBuf>,

    /// Extra argument key whose scalar value may be captured (repeatable; a string only if it is a code, see --capture-text; the PII denylist still wins) [env: BOUNDED_CAPTURE_FIELDS=a,b]
    #[arg(long = "capture", value_name = "FIELD")]
    pub capture: Vec<String>,

    /// Argument key whose string value may be prose, not only a code (repeatable; the key is also captured; the PII denylist and the value scrubber still apply; names and street addresses are not detected) [env: BOUNDED_CAPTURE_TEXT=a,b]
    #[arg(long = "capture-text", value_name = "KEY")]
    pub capture_text: Vec<String>,

    /// Opaque end-customer id recorded as `onBehalfOf` [env: BOUNDED_ON_BEHALF_OF]
    #[arg(long, value_name = "ID")]
    pub on_behalf_of: Option<String>,

    /// Streamable HTTP reverse-proxy mode instead of stdio [env: BOUNDED_MCP_HTTP=1]
    #[arg(long)]
    pub http: bool,

    /// Upstream MCP endpoint URL for --http [env: BOUNDED_MCP_UPSTREAM]
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,

    /// Local port for --http, on 127.0.0.1 [env: BOUNDED_MCP_PORT] [default: ephemeral]
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,

    /// A browser origin (`scheme://host[:port]`) that may use the --http listener besides loopback origins and the upstream's own (repeatable) [env: BOUNDED_ALLOW_ORIGINS=a,b]
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origin: Vec<String>,

    /// On SIGINT/SIGTERM in --http mode, how long calls in flight may take to finish, in milliseconds, before they are cut [env: BOUNDED_DRAIN_MS] [default: 5000]
    #[arg(long, value_name = "MS")]
    pub drain_ms: Option<u64>,

    /// Batch flush interval in milliseconds [env: BOUNDED_FLUSH_MS] [default: 2000]
    #[arg(long, value_name = "MS")]
    pub flush_ms: Option<u64>,

    /// A tools/call with no answer after this many milliseconds is reported as 504 [env: BOUNDED_CALL_TIMEOUT_MS] [default: 300000]
    #[arg(long, value_name = "MS")]
    pub call_timeout_ms: Option<u64>,

    /// At exit, how long observing what is left and delivering queued events may take, in milliseconds; stdio: counted from the server's exit [env: BOUNDED_SHUTDOWN_FLUSH_MS] [default: 2000]
    #[arg(long, value_name = "MS")]
    pub shutdown_flush_ms: Option<u64>,

    /// Verbose diagnostics on stderr (never stdout) [env: BOUNDED_DEBUG=1]
    #[arg(long)]
    pub debug: bool,

    /// The MCP server to wrap, after `--`: `bounded-observe-mcp [OPTIONS] -- <server-cmd> [args...]`
    #[arg(last = true, value_name = "SERVER_CMD")]
    pub command: Vec<OsString>,
}

/// The standalone binary's parser.
#[derive(Debug, Parser)]
#[command(
    name = "bounded-observe-mcp",
    version,
    about = "Metadata-only telemetry sensor for MCP servers",
    long_about = "Wraps an MCP server (stdio) or fronts a remote one (--http) and reports every \
tools/call as a metadata-only event to an ingest. The wrapped server behaves exactly as before: \
stdout carries only the server's bytes, and a dead ingest is never felt.\n\n\
Kill switch: BOUNDED_OBSERVE_MCP_DISABLED=1 runs the server as a pure passthrough (exec on Unix).",
    after_help = "Exit codes: the wrapped server's own code; 128+N when it was killed by signal N; \
2 for a usage error; 126 when the command cannot be executed; 127 when it is not found.\n\n\
Try it: `bounded-observe-mcp demo` runs the whole pipeline (sample server, wrapper, reference \
ingest) on this machine and prints the evidence that landed; `demo --keep` then leaves the \
ingest running and prints its live view's URL and a one-time sign-in link. Shell completions: \
`bounded-observe-mcp completions bash` (or zsh, fish, elvish, powershell)."
)]
pub struct Cli {
    #[command(flatten)]
    pub args: ObserveArgs,
}

/// `bounded-observe-mcp completions <bash|zsh|fish|elvish|powershell>`: prints a completion
/// script on stdout. Returns the exit code (2 for an unknown shell, naming the choices).
pub fn print_completions(shell: &std::ffi::OsStr) -> i32 {
    use clap::{CommandFactory, ValueEnum};
    let name = shell.to_string_lossy();
    match clap_complete::Shell::from_str(&name, true) {
        Ok(sh) => {
            clap_complete::generate(
                sh,
                &mut Cli::command(),
                "bounded-observe-mcp",
                &mut std::io::stdout(),
            );
            0
        }
        Err(_) => {
            eprintln!(
                "{} error: unknown shell {name:?} for completions; use one of bash, zsh, fish, elvish, powershell",
                crate::log::PREFIX
            );
            2
        }
    }
}

/// Drops a leading `observe mcp` (after the program name), so `bounded observe mcp …` argv works.
pub fn strip_parent_prefix(mut argv: Vec<OsString>) -> Vec<OsString> {
    if argv.len() >= 3 && argv[1] == "observe" && argv[2] == "mcp" {
        argv.drain(1..3);
    }
    argv
}

/// Parses a full argv (program name first).
pub fn parse_argv(argv: Vec<OsString>) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(strip_parent_prefix(argv))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn leading_observe_mcp_is_tolerated() {
        let cli = parse_argv(os(&[
            "bounded", "observe", "mcp", "--debug", "--", "srv", "-x",
        ]))
        .expect("parses");
        assert!(cli.args.debug);
        assert_eq!(cli.args.command, os(&["srv", "-x"]));
    }

    #[test]
    fn server_args_after_double_dash_are_not_ours() {
        let cli = parse_argv(os(&["w", "--", "srv", "--token", "x", "--help"])).expect("parses");
        assert_eq!(cli.args.token, None);
        assert_eq!(cli.args.command, os(&["srv", "--token", "x", "--help"]));
    }

    #[test]
    fn capture_is_repeatable() {
        let cli =
            parse_argv(os(&["w", "--capture", "a", "--capture", "b", "--", "s"])).expect("ok");
        assert_eq!(cli.args.capture, vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn allow_origin_is_repeatable() {
        let cli = parse_argv(os(&[
            "w",
            "--http",
            "--allow-origin",
            "https://a.example",
            "--allow-origin",
            "https://b.example",
            "--drain-ms",
            "300",
        ]))
        .expect("ok");
        assert_eq!(
            cli.args.allow_origin,
            vec![
                "https://a.example".to_string(),
                "https://b.example".to_string()
            ]
        );
        assert_eq!(cli.args.drain_ms, Some(300));
    }

    #[test]
    fn unknown_flag_is_an_error() {
        assert!(parse_argv(os(&["w", "--nope", "--", "s"])).is_err());
    }
}
