//! Validated configuration: raw flags ([`crate::cli::ObserveArgs`]) plus an environment map.
//!
//! Owns the flag-or-env rule (the flag wins), every default, and the fail-open policy of
//! invariant 8: a bad token, ingest URL, `--ingest-ca` file or `--capture` value never stops the
//! wrapped server; it becomes a [`ConfigWarning`] that the caller prints once, and the affected
//! feature is switched off. It reads one file: the `--ingest-ca` PEM, and only when events would
//! go to an HTTP(S) ingest. Only a missing server command (stdio) or upstream (HTTP) is a hard error, because then
//! there is nothing to run. It never reads `std::env`: the environment is passed in.
//!
//! Every variable of ours starts with [`ENV_PREFIX`], and that prefix is what keeps them from the
//! wrapped server (invariant 9: see [`is_sensor_env`]). [`ENV_BENCH_DISABLE`] exists for the
//! benchmark only: it switches mechanisms off to show what each buys ([`BenchSwitches`]).

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::ObserveArgs;
use crate::event::filter::{check_actor_id, FilterError};
use crate::log::redact_url;
use crate::token::{default_actor, SensorToken};

/// The environment, passed in rather than read, so a parent CLI and the tests control it.
pub type Env = HashMap<String, String>;

/// The prefix of every variable the wrapper reads. No variable with this prefix reaches the
/// wrapped server, known to this build or not: a newer `mcp.json` may carry variables an older
/// wrapper does not read, and they are just as much ours (a token, an ingest address).
pub const ENV_PREFIX: &str = "BOUNDED_";

pub const ENV_TOKEN: &str = "BOUNDED_SENSOR_TOKEN";
pub const ENV_ORG: &str = "BOUNDED_ORG";
pub const ENV_ACTOR: &str = "BOUNDED_ACTOR";
pub const ENV_SERVER_NAME: &str = "BOUNDED_MCP_SERVER_NAME";
pub const ENV_INGEST: &str = "BOUNDED_INGEST_BASE";
pub const ENV_INGEST_CA: &str = "BOUNDED_INGEST_CA";
pub const ENV_CAPTURE: &str = "BOUNDED_CAPTURE_FIELDS";
pub const ENV_CAPTURE_TEXT: &str = "BOUNDED_CAPTURE_TEXT";
pub const ENV_ON_BEHALF_OF: &str = "BOUNDED_ON_BEHALF_OF";
pub const ENV_HTTP: &str = "BOUNDED_MCP_HTTP";
pub const ENV_UPSTREAM: &str = "BOUNDED_MCP_UPSTREAM";
pub const ENV_PORT: &str = "BOUNDED_MCP_PORT";
pub const ENV_FLUSH_MS: &str = "BOUNDED_FLUSH_MS";
pub const ENV_CALL_TIMEOUT_MS: &str = "BOUNDED_CALL_TIMEOUT_MS";
pub const ENV_SHUTDOWN_FLUSH_MS: &str = "BOUNDED_SHUTDOWN_FLUSH_MS";
pub const ENV_DEBUG: &str = "BOUNDED_DEBUG";
pub const ENV_ALLOW_ORIGINS: &str = "BOUNDED_ALLOW_ORIGINS";
pub const ENV_DRAIN_MS: &str = "BOUNDED_DRAIN_MS";
/// The kill switch (invariant 7).
pub const ENV_DISABLED: &str = "BOUNDED_OBSERVE_MCP_DISABLED";
/// Switches mechanisms off for the benchmark's ablation rows ([`BenchSwitches`]); not a user
/// setting, so deliberately absent from [`ALL_ENV`], `--help` and the README (`bench/README.md`
/// documents it).
pub const ENV_BENCH_DISABLE: &str = "BOUNDED_BENCH_DISABLE";

/// Every env var the wrapper reads, for docs and the README consistency test.
pub const ALL_ENV: &[&str] = &[
    ENV_TOKEN,
    ENV_ORG,
    ENV_ACTOR,
    ENV_SERVER_NAME,
    ENV_INGEST,
    ENV_INGEST_CA,
    ENV_CAPTURE,
    ENV_CAPTURE_TEXT,
    ENV_ON_BEHALF_OF,
    ENV_HTTP,
    ENV_UPSTREAM,
    ENV_PORT,
    ENV_FLUSH_MS,
    ENV_CALL_TIMEOUT_MS,
    ENV_SHUTDOWN_FLUSH_MS,
    ENV_DEBUG,
    ENV_ALLOW_ORIGINS,
    ENV_DRAIN_MS,
    ENV_DISABLED,
    crate::otlp::config::ENV_OTLP_ENDPOINT,
    crate::otlp::config::ENV_OTLP_PROTOCOL,
    crate::otlp::config::ENV_OTLP_HEADERS,
    crate::otlp::config::ENV_OTLP_CA,
];

/// The reference ingest's default address (DESIGN §7).
pub const DEFAULT_INGEST: &str = "http://127.0.0.1:7361";
/// DESIGN §3.
pub const DEFAULT_FLUSH: Duration = Duration::from_millis(2000);
/// Longer than the 60 s request timeout of the official SDKs, so a client that gives up first
/// is seen as a cancellation (499), and only a call nobody ever answers becomes a 504.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a dead ingest may delay the wrapper's exit (issue: reporter shutdown ≤ 2 s).
pub const DEFAULT_SHUTDOWN_FLUSH: Duration = Duration::from_millis(2000);
/// Actor when neither `--actor` nor a token's keyId is known (events then go to a `file:` sink).
pub const DEFAULT_ACTOR_NO_TOKEN: &str = "mcp:unknown";
/// How long an HTTP call in flight at SIGTERM may take to finish: longer than most tool calls,
/// short enough for a supervisor's stop timeout (systemd and Kubernetes wait 90 s and 30 s).
pub const DEFAULT_DRAIN: Duration = Duration::from_millis(5000);
/// Fallback server name when neither `--name` nor `serverInfo.name` is known.
pub const DEFAULT_SERVER_NAME: &str = "mcp";

/// Mechanisms the benchmark can switch off ([`ENV_BENCH_DISABLE`], a comma list of the names
/// below) to show what each one buys; each field is `true` when the mechanism runs (the
/// default). Read once, at start. Exists for the benchmark only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchSwitches {
    /// `pacer`: the observer's slices and rests on a CPU shared with the relay (`crate::pace::Pacer`).
    pub pacer: bool,
    /// `idle`: the observer's threads in the batch scheduling class, nine nice levels below the
    /// wrapper's (`crate::pace::lower_current_thread`).
    pub idle: bool,
    /// `summary`: large JSON objects observed from their first and last bytes
    /// (`crate::observe::summary`). The tap's trimming only feeds it, so `summary` switches
    /// `trim` off too.
    pub summary: bool,
    /// `trim`: the tap passes only the head and tail of a large frame (`crate::tap`).
    pub trim: bool,
    /// `prefault`: the relay faults in its first blocks before its first read and the blocks a
    /// burst takes fresh in one call each (`crate::proxy::stdio`, the relay's `START_BLOCKS`
    /// and `PREFAULT_AFTER`), and the observer readies the tap's queue for a backlog
    /// (`crate::tap::STOCK_CHUNKS`).
    pub prefault: bool,
    /// `tee`: the relay forwards the rest of a large answer with `tee(2)` (`crate::proxy::stdio`,
    /// the relay's `TEE_AFTER`). It learns that an answer is large from the tap's trimming, so
    /// `trim` (and `summary`) switch it off too.
    pub tee: bool,
}

impl Default for BenchSwitches {
    fn default() -> Self {
        BenchSwitches {
            pacer: true,
            idle: true,
            summary: true,
            trim: true,
            prefault: true,
            tee: true,
        }
    }
}

impl BenchSwitches {
    /// Parses [`ENV_BENCH_DISABLE`]; unknown names are returned for one warning each.
    pub fn parse(list: &str) -> (BenchSwitches, Vec<String>) {
        let mut on = BenchSwitches::default();
        let mut unknown = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "pacer" => on.pacer = false,
                "idle" => on.idle = false,
                "summary" => {
                    on.summary = false;
                    on.trim = false;
                    on.tee = false;
                }
                "trim" => {
                    on.trim = false;
                    on.tee = false;
                }
                "prefault" => on.prefault = false,
                "tee" => on.tee = false,
                _ => unknown.push(name.to_string()),
            }
        }
        (on, unknown)
    }
}

/// Where events go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IngestTarget {
    /// `http(s)://…` base; batches are POSTed to `<base>/v1/events`.
    Http(String),
    /// `file:PATH`: each filtered batch appended as one JSON line (offline use, tests).
    File(PathBuf),
    /// Nothing is sent anywhere (no usable token, or a bad ingest value): observation may still
    /// run for `--debug` counters, but no socket is opened.
    Off,
}

/// Transport mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Stdio {
        program: OsString,
        args: Vec<OsString>,
    },
    Http {
        upstream: String,
        port: u16,
    },
}

/// Everything the run needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    /// `BOUNDED_OBSERVE_MCP_DISABLED=1`: pure passthrough, no observation, no network.
    pub disabled: bool,
    pub token: Option<SensorToken>,
    /// Logs only; never sent.
    pub org: Option<String>,
    pub actor: String,
    /// `--name`; when `None` the observer uses `serverInfo.name`, else [`DEFAULT_SERVER_NAME`].
    pub server_name: Option<String>,
    pub ingest: IngestTarget,
    /// `--ingest-ca`: certificates of a private CA trusted for the ingest besides the default
    /// roots; empty when none is given or events do not go to an HTTP(S) ingest.
    pub ingest_ca: Vec<rustls::pki_types::CertificateDer<'static>>,
    /// Extra allow-listed argument keys (the PII denylist still overrides them).
    pub capture: Vec<String>,
    /// Keys whose string values may be prose (`--capture-text`); also allow-listed.
    pub capture_text: Vec<String>,
    pub on_behalf_of: Option<String>,
    pub flush: Duration,
    pub call_timeout: Duration,
    pub shutdown_flush: Duration,
    /// HTTP mode: how long exchanges in flight at a signal may take to finish.
    pub drain: Duration,
    /// HTTP mode: browser origins admitted besides loopback and the upstream's own.
    pub allow_origins: Vec<Origin>,
    pub debug: bool,
    /// Mechanisms switched off for the benchmark ([`ENV_BENCH_DISABLE`]); all on otherwise.
    pub bench: BenchSwitches,
    /// OTLP export (`crate::otlp`); `None`: off.
    pub otlp: Option<crate::otlp::OtlpConfig>,
}

/// A misconfiguration that does not stop the server (invariant 8). Printed once on stderr.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigWarning {
    #[error("no sensor token (--token or {ENV_TOKEN}): events will not be reported; set it to the token `bounded-ingest mint` printed")]
    NoToken,
    #[error("sensor token from {origin} is malformed ({err}): events will not be reported; expected obs1.<keyId>.<sig>")]
    BadToken {
        origin: &'static str,
        err: crate::token::TokenError,
    },
    /// `value` is already redacted ([`redact_url`]): a warning never carries a URL's secrets.
    #[error("ingest {value:?} from {origin} is not http(s)://… or file:PATH: events will not be reported")]
    BadIngest { origin: &'static str, value: String },
    /// `--ingest-ca` / `BOUNDED_INGEST_CA` cannot be read or holds no usable certificate:
    /// reporting is off rather than sent to an ingest the operator meant to pin to that CA.
    #[error("ingest CA from {origin} is unusable ({err}): events will not be reported")]
    BadIngestCa {
        origin: &'static str,
        err: crate::http_client::CaError,
    },
    /// A plain `http://` ingest off loopback: the token (and the events) cross the network
    /// unencrypted. Not refused, since a trusted network or a TLS-terminating sidecar may make it
    /// fine, but said once. `ingest` is redacted.
    #[error("ingest {ingest} is plain http:// and not on this machine: the sensor token and events are sent in clear text; use https://")]
    ClearTextIngest { ingest: String },
    #[error("{name} value {value:?} is not a whole number of milliseconds: using the default {default_ms}")]
    BadNumber {
        name: &'static str,
        value: String,
        default_ms: u64,
    },
    #[error("capture field {value:?} is empty or not a plain key name: ignored")]
    BadCapture { value: String },
    #[error("{ENV_PORT} value {value:?} is not a port number: using an ephemeral port")]
    BadPort { value: String },
    /// The actor would fail the L3 filter on every event ([`check_actor_id`]), so every event
    /// would be dropped. The value is not echoed: it may hold control characters. `reason` is the
    /// filter's, e.g. `actor.id: too long`.
    #[error("actor from {origin} would be rejected by the event filter ({reason}): using the default {default}")]
    BadActor {
        origin: &'static str,
        reason: String,
        default: String,
    },
    /// The token's default actor `mcp:<keyId>` would fail the L3 filter on every event: its
    /// key id holds what layer 4 removes (a digit run that reads as a card number). Keys that
    /// `bounded-ingest` mints never do; one minted by an older ingest can.
    #[error("the token's keyId would make the default actor fail the event filter ({reason}): events name the actor {DEFAULT_ACTOR_NO_TOKEN} (the ingest still records the key); set --actor, or mint a new key")]
    KeyIdActor { reason: String },
    #[error(
        "allowed origin {value:?} is not scheme://host[:port] (e.g. https://app.example): ignored"
    )]
    BadOrigin { value: String },
    #[error(
        "{ENV_BENCH_DISABLE} name {value:?} is not one of pacer, idle, summary, trim, prefault, tee: ignored"
    )]
    BadBenchSwitch { value: String },
    /// An OTLP setting (`crate::otlp::config`); the sentence never holds a header value.
    #[error("{0}")]
    Otlp(String),
}

/// A misconfiguration that leaves nothing to run. Exit code 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("missing server command: usage is `bounded-observe-mcp [OPTIONS] -- <server-cmd> [args...]`")]
    MissingCommand,
    #[error(
        "--http needs --upstream URL (or {ENV_UPSTREAM}), e.g. --upstream https://example.com/mcp"
    )]
    MissingUpstream,
    /// Holds the redacted URL ([`redact_url`]).
    #[error("upstream {0:?} must be an http:// or https:// URL")]
    BadUpstream(String),
    #[error("a server command after `--` is not used with --http; drop one of them")]
    CommandWithHttp,
}

/// Whether a variable of the process environment is ours and so must be removed from the wrapped
/// server's (invariant 9). Case-sensitive, as Unix variable names are: `bounded_x` is not ours
/// and passes, like `OTEL_*` and everything else.
pub fn is_sensor_env(name: &std::ffi::OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    name.as_bytes().starts_with(ENV_PREFIX.as_bytes())
}

/// The one host name taken as loopback without resolving it (RFC 6761 reserves it).
const LOCALHOST: &str = "localhost";

/// Whether an ingest base sends the token in clear text to another machine: `http://` with a
/// host other than 127.0.0.0/8, `::1` or `localhost`. The host is read as the HTTP client will
/// read it (WHATWG URL parsing: `127.1` is 127.0.0.1), so the check and the connection agree.
/// A base that does not parse is not called clear text here; the sink reports it when it fails.
fn is_clear_text_off_loopback(base: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(base) else {
        return false;
    };
    if url.scheme() != "http" {
        return false;
    }
    let Some(host) = url.host_str() else {
        return false;
    };
    // The parser has already normalised an IP host (`127.1` → `127.0.0.1`, `[::1]`).
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => !ip.is_loopback(),
        Err(_) => !host.trim_end_matches('.').eq_ignore_ascii_case(LOCALHOST),
    }
}

fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

fn non_empty(v: Option<&String>) -> Option<String> {
    v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

impl Config {
    /// Applies env fallbacks and defaults. `Err` only when there is nothing to run.
    pub fn resolve(
        args: &ObserveArgs,
        env: &Env,
    ) -> Result<(Config, Vec<ConfigWarning>), ConfigError> {
        let mut warnings = Vec::new();
        let pick = |flag: &Option<String>, name: &str| -> Option<(String, &'static str)> {
            if let Some(v) = flag.as_ref().map(|s| s.trim()).filter(|s| !s.is_empty()) {
                return Some((v.to_string(), "flag"));
            }
            non_empty(env.get(name)).map(|v| (v, "env"))
        };

        let disabled = env.get(ENV_DISABLED).is_some_and(|v| truthy(v));
        let http = args.http || env.get(ENV_HTTP).is_some_and(|v| truthy(v));
        let debug = args.debug || env.get(ENV_DEBUG).is_some_and(|v| truthy(v));

        let mode = if http {
            if !args.command.is_empty() {
                return Err(ConfigError::CommandWithHttp);
            }
            let (upstream, _) =
                pick(&args.upstream, ENV_UPSTREAM).ok_or(ConfigError::MissingUpstream)?;
            if !(upstream.starts_with("http://") || upstream.starts_with("https://")) {
                return Err(ConfigError::BadUpstream(redact_url(&upstream)));
            }
            let port = match args.port {
                Some(p) => p,
                None => match non_empty(env.get(ENV_PORT)) {
                    None => 0,
                    Some(v) => v.parse::<u16>().unwrap_or_else(|_| {
                        warnings.push(ConfigWarning::BadPort { value: v.clone() });
                        0
                    }),
                },
            };
            Mode::Http { upstream, port }
        } else {
            let mut cmd = args.command.iter().cloned();
            let program = cmd.next().ok_or(ConfigError::MissingCommand)?;
            Mode::Stdio {
                program,
                args: cmd.collect(),
            }
        };

        let token = match pick(&args.token, ENV_TOKEN) {
            None => {
                if !disabled {
                    warnings.push(ConfigWarning::NoToken);
                }
                None
            }
            Some((raw, source)) => match SensorToken::parse(&raw) {
                Ok(t) => Some(t),
                Err(err) => {
                    let source = if source == "flag" {
                        "--token"
                    } else {
                        ENV_TOKEN
                    };
                    warnings.push(ConfigWarning::BadToken {
                        origin: source,
                        err,
                    });
                    None
                }
            },
        };

        let ingest = match pick(&args.ingest, ENV_INGEST) {
            None => IngestTarget::Http(DEFAULT_INGEST.to_string()),
            Some((v, source)) => {
                let source = if source == "flag" {
                    "--ingest"
                } else {
                    ENV_INGEST
                };
                if let Some(path) = v.strip_prefix("file:") {
                    if path.is_empty() {
                        warnings.push(ConfigWarning::BadIngest {
                            origin: source,
                            value: redact_url(&v),
                        });
                        IngestTarget::Off
                    } else {
                        IngestTarget::File(PathBuf::from(path))
                    }
                } else if v.starts_with("http://") || v.starts_with("https://") {
                    IngestTarget::Http(v.trim_end_matches('/').to_string())
                } else {
                    warnings.push(ConfigWarning::BadIngest {
                        origin: source,
                        value: redact_url(&v),
                    });
                    IngestTarget::Off
                }
            }
        };
        // A file sink needs no token; the network does.
        let mut ingest = match (&ingest, &token) {
            (IngestTarget::Http(_), None) => IngestTarget::Off,
            _ => ingest,
        };
        if matches!(ingest, IngestTarget::File(_)) {
            warnings.retain(|w| *w != ConfigWarning::NoToken);
        }
        // The private CA is read only when it can be used: an HTTP(S) ingest with a token, and
        // no kill switch. A file that cannot be used turns reporting off (invariant 8).
        let mut ingest_ca = Vec::new();
        if let (IngestTarget::Http(_), false) = (&ingest, disabled) {
            let ca = match args
                .ingest_ca
                .as_ref()
                .filter(|p| !p.as_os_str().is_empty())
            {
                Some(p) => Some((p.clone(), "--ingest-ca")),
                None => {
                    non_empty(env.get(ENV_INGEST_CA)).map(|v| (PathBuf::from(v), ENV_INGEST_CA))
                }
            };
            if let Some((path, origin)) = ca {
                match crate::http_client::load_ca_file(&path) {
                    Ok(certs) => ingest_ca = certs,
                    Err(err) => {
                        warnings.push(ConfigWarning::BadIngestCa { origin, err });
                        ingest = IngestTarget::Off;
                    }
                }
            }
        }
        // Only when the token would really be sent: a disabled sensor or one without a usable
        // token (target `Off` above) opens no connection to the ingest.
        if let IngestTarget::Http(base) = &ingest {
            if !disabled && is_clear_text_off_loopback(base) {
                warnings.push(ConfigWarning::ClearTextIngest {
                    ingest: redact_url(base),
                });
            }
        }

        let mut key_list = |flags: &[String], env_name: &str| -> Vec<String> {
            let env_list = env.get(env_name).cloned().unwrap_or_default();
            let env_fields = env_list.split(',').map(str::trim).filter(|s| !s.is_empty());
            // The flags, when given, replace the env list.
            let raw_fields: Vec<String> = if flags.is_empty() {
                env_fields.map(String::from).collect()
            } else {
                flags.to_vec()
            };
            let mut keys = Vec::new();
            for f in raw_fields {
                let f = f.trim().to_string();
                if f.is_empty() || f.len() > 128 || f.chars().any(|c| c.is_control() || c == ',') {
                    warnings.push(ConfigWarning::BadCapture { value: f });
                } else if !keys.contains(&f) {
                    keys.push(f);
                }
            }
            keys
        };
        let capture = key_list(&args.capture, ENV_CAPTURE);
        let capture_text = key_list(&args.capture_text, ENV_CAPTURE_TEXT);

        let mut millis = |flag: Option<u64>, name: &'static str, default: Duration| -> Duration {
            if let Some(ms) = flag {
                return Duration::from_millis(ms);
            }
            match non_empty(env.get(name)) {
                None => default,
                Some(v) => match v.parse::<u64>() {
                    Ok(ms) => Duration::from_millis(ms),
                    Err(_) => {
                        warnings.push(ConfigWarning::BadNumber {
                            name,
                            value: v,
                            default_ms: default.as_millis() as u64,
                        });
                        default
                    }
                },
            }
        };
        let flush =
            millis(args.flush_ms, ENV_FLUSH_MS, DEFAULT_FLUSH).max(Duration::from_millis(1));
        let drain = millis(args.drain_ms, ENV_DRAIN_MS, DEFAULT_DRAIN);
        let call_timeout = millis(
            args.call_timeout_ms,
            ENV_CALL_TIMEOUT_MS,
            DEFAULT_CALL_TIMEOUT,
        );
        let shutdown_flush = millis(
            args.shutdown_flush_ms,
            ENV_SHUTDOWN_FLUSH_MS,
            DEFAULT_SHUTDOWN_FLUSH,
        );

        // As for --capture: the flags, when given, replace the env list.
        let raw_origins: Vec<String> = if args.allow_origin.is_empty() {
            env.get(ENV_ALLOW_ORIGINS)
                .map(|v| v.split(',').map(str::trim).map(String::from).collect())
                .unwrap_or_default()
        } else {
            args.allow_origin
                .iter()
                .map(|o| o.trim().to_string())
                .collect()
        };
        let mut allow_origins = Vec::new();
        for value in raw_origins.into_iter().filter(|o| !o.is_empty()) {
            match Origin::parse(&value) {
                Some(o) if !allow_origins.contains(&o) => allow_origins.push(o),
                Some(_) => {}
                None => warnings.push(ConfigWarning::BadOrigin { value }),
            }
        }

        // Checked with the filter's own rule: an actor it rejects would silently drop every
        // event, so the default is used instead, with one warning. The same holds for the
        // default itself: an ingest that predates `new_key_id`'s check could mint a key id that
        // reads as a card number. The ingest records the key of every event (`sensor`), so
        // `mcp:unknown` loses no evidence.
        let fallback_actor = |warnings: &mut Vec<ConfigWarning>| match &token {
            Some(t) => {
                let a = default_actor(t.key_id());
                match check_actor_id(&a) {
                    Ok(()) => a,
                    Err(FilterError::Invalid(reason)) => {
                        warnings.push(ConfigWarning::KeyIdActor { reason });
                        DEFAULT_ACTOR_NO_TOKEN.to_string()
                    }
                }
            }
            None => DEFAULT_ACTOR_NO_TOKEN.to_string(),
        };
        let actor = match pick(&args.actor, ENV_ACTOR) {
            None => fallback_actor(&mut warnings),
            Some((a, source)) => match check_actor_id(&a) {
                Ok(()) => a,
                Err(FilterError::Invalid(reason)) => {
                    let default = fallback_actor(&mut warnings);
                    warnings.push(ConfigWarning::BadActor {
                        origin: if source == "flag" {
                            "--actor"
                        } else {
                            ENV_ACTOR
                        },
                        reason,
                        default: default.clone(),
                    });
                    default
                }
            },
        };

        let bench = match env.get(ENV_BENCH_DISABLE) {
            None => BenchSwitches::default(),
            Some(list) => {
                let (bench, unknown) = BenchSwitches::parse(list);
                warnings.extend(
                    unknown
                        .into_iter()
                        .map(|value| ConfigWarning::BadBenchSwitch { value }),
                );
                bench
            }
        };

        let (otlp, otlp_warnings) = crate::otlp::config::resolve(args, env, disabled);
        warnings.extend(otlp_warnings.into_iter().map(ConfigWarning::Otlp));
        // OTLP alone is a whole setup: no token needed, so none is missing.
        if otlp.is_some() {
            warnings.retain(|w| *w != ConfigWarning::NoToken);
        }

        let config = Config {
            mode,
            disabled,
            token,
            org: pick(&args.org, ENV_ORG).map(|(v, _)| v),
            actor,
            server_name: pick(&args.name, ENV_SERVER_NAME).map(|(v, _)| v),
            ingest,
            ingest_ca,
            capture,
            capture_text,
            on_behalf_of: pick(&args.on_behalf_of, ENV_ON_BEHALF_OF).map(|(v, _)| v),
            flush,
            call_timeout,
            shutdown_flush,
            drain,
            allow_origins,
            debug,
            bench,
            otlp,
        };
        Ok((config, warnings))
    }
}

/// An origin, `scheme://host[:port]`, normalised for comparison: scheme and host in lower case,
/// the scheme's default port dropped (`https://a.example:443` is `https://a.example`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    scheme: String,
    host: String,
    port: Option<u16>,
}

impl Origin {
    /// Parses `scheme://host[:port]`, as browsers send it in `Origin` (one trailing `/` is
    /// tolerated, for hand-written `--allow-origin` values). `None` for anything else: a path,
    /// a query, credentials, a wildcard, or the opaque origin `null`.
    pub fn parse(s: &str) -> Option<Origin> {
        let (scheme, rest) = s.split_once("://")?;
        let mut chars = scheme.chars();
        let scheme_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !scheme_ok {
            return None;
        }
        let scheme = scheme.to_ascii_lowercase();
        let (host, port) = parse_authority(rest.strip_suffix('/').unwrap_or(rest))?;
        let default = match scheme.as_str() {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        };
        let port = port.filter(|p| Some(*p) != default);
        Some(Origin { scheme, host, port })
    }

    /// The scheme, in lower case.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The host, in lower case (an IPv6 literal in its brackets).
    pub fn host(&self) -> &str {
        &self.host
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}", self.scheme, self.host)?;
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

/// Splits `host[:port]` (`[v6]` literals in brackets); the host in lower case. `None` when it
/// is not a plain authority: empty, credentials, a path, characters no host name has. The
/// listener's `Host` check reads `Host` with it too, so an origin and a host compare alike.
pub(crate) fn parse_authority(s: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if s.starts_with('[') {
        let end = s.find(']')?;
        let literal = &s[1..end];
        if literal.is_empty()
            || !literal
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return None;
        }
        (&s[..=end], &s[end + 1..])
    } else {
        let end = s.find(':').unwrap_or(s.len());
        let host = &s[..end];
        if host.is_empty()
            || !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        {
            return None;
        }
        (host, &s[end..])
    };
    let port = match port {
        "" => None,
        p => {
            let digits = p.strip_prefix(':')?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some(digits.parse::<u16>().ok()?)
        }
    };
    Some((host.to_ascii_lowercase(), port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::parse_argv;

    fn resolve(
        argv: &[&str],
        env: &[(&str, &str)],
    ) -> Result<(Config, Vec<ConfigWarning>), ConfigError> {
        let cli = parse_argv(argv.iter().map(OsString::from).collect()).expect("argv parses");
        let env: Env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::resolve(&cli.args, &env)
    }

    #[test]
    fn bench_switches_come_from_the_env_map_and_summary_takes_trim_with_it() {
        let (c, w) = resolve(&["w", "--", "srv"], &[]).expect("ok");
        assert_eq!(c.bench, BenchSwitches::default());
        assert!(w
            .iter()
            .all(|w| !matches!(w, ConfigWarning::BadBenchSwitch { .. })));
        let (c, w) = resolve(
            &["w", "--", "srv"],
            &[(ENV_BENCH_DISABLE, " pacer, idle,,bogus ")],
        )
        .expect("ok");
        assert_eq!(
            c.bench,
            BenchSwitches {
                pacer: false,
                idle: false,
                ..BenchSwitches::default()
            }
        );
        assert!(w.contains(&ConfigWarning::BadBenchSwitch {
            value: "bogus".into()
        }));
        let (c, _) = resolve(
            &["w", "--", "srv"],
            &[(ENV_BENCH_DISABLE, "summary,pacer,prefault")],
        )
        .expect("ok");
        assert_eq!(
            c.bench,
            BenchSwitches {
                pacer: false,
                summary: false,
                trim: false,
                prefault: false,
                tee: false,
                ..BenchSwitches::default()
            }
        );
        assert!(!ALL_ENV.contains(&ENV_BENCH_DISABLE), "not a user setting");
    }

    #[test]
    fn flag_wins_over_env() {
        let (c, _) = resolve(
            &["w", "--token", "obs1.flag.sig", "--", "srv"],
            &[(ENV_TOKEN, "obs1.env.sig"), (ENV_ACTOR, "agent-7")],
        )
        .expect("ok");
        assert_eq!(c.token.expect("token").key_id(), "flag");
        assert_eq!(c.actor, "agent-7");
    }

    #[test]
    fn env_is_used_when_flag_absent() {
        let (c, w) = resolve(&["w", "--", "srv"], &[(ENV_TOKEN, "obs1.env.sig")]).expect("ok");
        assert_eq!(c.actor, "mcp:env");
        assert_eq!(c.ingest, IngestTarget::Http(DEFAULT_INGEST.into()));
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn malformed_token_fails_open_with_one_warning() {
        let (c, w) = resolve(&["w", "--token", "nope", "--", "srv"], &[]).expect("still runs");
        assert!(c.token.is_none());
        assert_eq!(c.ingest, IngestTarget::Off);
        assert_eq!(w.len(), 1);
        assert!(w[0].to_string().contains("--token"));
        assert!(!w[0].to_string().contains("nope"), "never echo a token");
    }

    #[test]
    fn file_ingest_needs_no_token() {
        let (c, w) =
            resolve(&["w", "--ingest", "file:/tmp/x.jsonl", "--", "srv"], &[]).expect("ok");
        assert_eq!(c.ingest, IngestTarget::File(PathBuf::from("/tmp/x.jsonl")));
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn missing_command_is_an_error() {
        assert_eq!(
            resolve(&["w"], &[]).err(),
            Some(ConfigError::MissingCommand)
        );
    }

    #[test]
    fn http_mode_needs_upstream() {
        assert_eq!(
            resolve(&["w", "--http"], &[]).err(),
            Some(ConfigError::MissingUpstream)
        );
        let (c, _) = resolve(
            &["w"],
            &[(ENV_HTTP, "1"), (ENV_UPSTREAM, "http://127.0.0.1:9/mcp")],
        )
        .expect("ok");
        assert_eq!(
            c.mode,
            Mode::Http {
                upstream: "http://127.0.0.1:9/mcp".into(),
                port: 0
            }
        );
    }

    #[test]
    fn capture_text_flags_replace_the_env_list() {
        let (c, w) = resolve(
            &["w", "--token", "obs1.k.s", "--", "s"],
            &[(ENV_CAPTURE_TEXT, "reason, note,,")],
        )
        .expect("ok");
        assert_eq!(
            c.capture_text,
            vec!["reason".to_string(), "note".to_string()]
        );
        assert!(w.is_empty(), "{w:?}");
        let (c, _) = resolve(
            &[
                "w",
                "--token",
                "obs1.k.s",
                "--capture-text",
                "memo",
                "--capture-text",
                "memo",
                "--",
                "s",
            ],
            &[(ENV_CAPTURE_TEXT, "reason")],
        )
        .expect("ok");
        assert_eq!(c.capture_text, vec!["memo".to_string()]);
        assert!(c.capture.is_empty());
    }

    #[test]
    fn a_key_id_that_reads_as_a_card_number_does_not_become_the_actor() {
        // 0801084356246 is Luhn-valid: `mcp:<keyId>` would fail the filter on every event.
        let token = "obs1.k_0801084356246c5c60f6.s";
        let (c, w) = resolve(&["w", "--token", token, "--", "s"], &[]).expect("ok");
        assert_eq!(c.actor, DEFAULT_ACTOR_NO_TOKEN);
        assert!(check_actor_id(&c.actor).is_ok());
        assert!(
            matches!(w.as_slice(), [ConfigWarning::KeyIdActor { .. }]),
            "{w:?}"
        );
        let text = w[0].to_string();
        assert!(
            text.contains("--actor") && !text.contains("0801084356246"),
            "{text}"
        );

        // A valid --actor is used as given, and the key id is then no concern.
        let (c, w) =
            resolve(&["w", "--token", token, "--actor", "bot-7", "--", "s"], &[]).expect("ok");
        assert_eq!(c.actor, "bot-7");
        assert!(w.is_empty(), "{w:?}");

        // An invalid one falls back past the key id to the placeholder, with both warnings.
        let (c, w) =
            resolve(&["w", "--token", token, "--actor", "a\nb", "--", "s"], &[]).expect("ok");
        assert_eq!(c.actor, DEFAULT_ACTOR_NO_TOKEN);
        assert_eq!(w.len(), 2, "{w:?}");
    }

    #[test]
    fn an_actor_holding_pii_warns_and_the_default_is_used() {
        let (c, w) = resolve(
            &[
                "w",
                "--token",
                "obs1.k1.s",
                "--actor",
                "jane@example.com",
                "--",
                "s",
            ],
            &[],
        )
        .expect("ok");
        assert_eq!(c.actor, "mcp:k1");
        assert!(
            w.iter()
                .any(|w| matches!(w, ConfigWarning::BadActor { .. })),
            "{w:?}"
        );
        assert!(
            !format!("{w:?}").contains("jane"),
            "the value is not echoed"
        );
    }

    #[test]
    fn capture_from_env_list_and_bad_numbers_warn() {
        let (c, w) = resolve(
            &["w", "--", "s"],
            &[
                (ENV_CAPTURE, "sku, qty,,"),
                (ENV_FLUSH_MS, "soon"),
                (ENV_TOKEN, "obs1.k.s"),
            ],
        )
        .expect("ok");
        assert_eq!(c.capture, vec!["sku".to_string(), "qty".to_string()]);
        assert_eq!(c.flush, DEFAULT_FLUSH);
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn allow_origins_flag_wins_and_malformed_ones_warn() {
        let http = ["w", "--http", "--upstream", "http://127.0.0.1:9/mcp"];
        let env = [
            (ENV_ALLOW_ORIGINS, "https://env.example, null,"),
            (ENV_TOKEN, "obs1.k.s"),
        ];
        let (c, w) = resolve(&http, &env).expect("ok");
        assert_eq!(
            c.allow_origins,
            vec![Origin::parse("https://env.example").expect("ok")]
        );
        assert_eq!(
            w,
            vec![ConfigWarning::BadOrigin {
                value: "null".into()
            }]
        );
        let mut argv = http.to_vec();
        argv.extend([
            "--allow-origin",
            "https://flag.example/",
            "--allow-origin",
            "*",
        ]);
        let (c, w) = resolve(&argv, &env).expect("ok");
        assert_eq!(
            c.allow_origins,
            vec![Origin::parse("https://flag.example").expect("ok")]
        );
        assert_eq!(w, vec![ConfigWarning::BadOrigin { value: "*".into() }]);
    }

    #[test]
    fn drain_defaults_to_5_s_and_flag_wins() {
        let http = ["w", "--http", "--upstream", "http://127.0.0.1:9/mcp"];
        let (c, _) = resolve(&http, &[]).expect("ok");
        assert_eq!(c.drain, DEFAULT_DRAIN);
        let (c, _) = resolve(&http, &[(ENV_DRAIN_MS, "250")]).expect("ok");
        assert_eq!(c.drain, Duration::from_millis(250));
        let mut argv = http.to_vec();
        argv.extend(["--drain-ms", "0"]);
        let (c, _) = resolve(&argv, &[(ENV_DRAIN_MS, "250")]).expect("ok");
        assert_eq!(c.drain, Duration::ZERO);
    }

    #[test]
    fn kill_switch_is_read_from_env() {
        let (c, w) = resolve(&["w", "--", "s"], &[(ENV_DISABLED, "1")]).expect("ok");
        assert!(c.disabled);
        assert!(w.is_empty(), "no token warning when disabled: {w:?}");
    }

    #[test]
    fn invalid_actor_warns_once_and_the_default_actor_is_used() {
        let long = "a".repeat(crate::event::filter::MAX_TEXT_LEN + 1);
        for (argv, env, origin) in [
            (
                vec![
                    "w",
                    "--token",
                    "obs1.k1.sig",
                    "--actor",
                    "agent\tseven",
                    "--",
                    "s",
                ],
                vec![],
                "--actor",
            ),
            (
                vec!["w", "--token", "obs1.k1.sig", "--", "s"],
                vec![(ENV_ACTOR, long.as_str())],
                ENV_ACTOR,
            ),
        ] {
            let (c, w) = resolve(&argv, &env).expect("still runs");
            assert_eq!(c.actor, "mcp:k1", "the default actor replaces the bad one");
            assert_eq!(w.len(), 1, "{w:?}");
            let msg = w[0].to_string();
            assert!(msg.contains(origin) && msg.contains("mcp:k1"), "{msg}");
            assert!(
                !msg.contains('\t') && !msg.contains(&long),
                "not echoed: {msg}"
            );
        }
        // Without a token the default is the no-token actor, and events still reach a file.
        let (c, w) = resolve(
            &["w", "--ingest", "file:/tmp/x", "--actor", "a\nb", "--", "s"],
            &[],
        )
        .expect("ok");
        assert_eq!(c.actor, DEFAULT_ACTOR_NO_TOKEN);
        assert_eq!(w.len(), 1, "{w:?}");
    }

    #[test]
    fn valid_actor_is_kept_as_given() {
        let max = "é".repeat(crate::event::filter::MAX_TEXT_LEN / 2);
        for actor in ["agent-7", "svc:billing bot", max.as_str()] {
            let (c, w) = resolve(
                &["w", "--token", "obs1.k.s", "--actor", actor, "--", "s"],
                &[],
            )
            .expect("ok");
            assert_eq!(c.actor, actor);
            assert!(w.is_empty(), "{w:?}");
        }
    }

    #[test]
    fn clear_text_ingest_off_loopback_warns_once() {
        let token = [(ENV_TOKEN, "obs1.k.s")];
        let (_, w) = resolve(
            &[
                "w",
                "--ingest",
                "http://ingest.example.invalid/?t=SECRET",
                "--",
                "s",
            ],
            &token,
        )
        .expect("ok");
        assert_eq!(w.len(), 1, "{w:?}");
        let msg = w[0].to_string();
        assert!(
            msg.contains("clear text") && msg.contains("ingest.example.invalid"),
            "{msg}"
        );
        assert!(!msg.contains("SECRET"), "{msg}");
        for ingest in [
            "http://10.0.0.1:7361",
            "http://[2001:db8::1]/",
            "http://localhost.example",
        ] {
            let (_, w) = resolve(&["w", "--ingest", ingest, "--", "s"], &token).expect("ok");
            assert!(
                matches!(w.as_slice(), [ConfigWarning::ClearTextIngest { .. }]),
                "{ingest}: {w:?}"
            );
        }
    }

    #[test]
    fn loopback_or_tls_ingest_or_nothing_sent_gives_no_clear_text_warning() {
        let token = [(ENV_TOKEN, "obs1.k.s")];
        for ingest in [
            "http://127.0.0.1:7361",
            "http://127.9.9.9",
            "http://127.1:7361",
            "http://localhost:7361/",
            "http://LOCALHOST.:7361",
            "http://[::1]:7361",
            "https://ingest.example.invalid",
        ] {
            let (_, w) = resolve(&["w", "--ingest", ingest, "--", "s"], &token).expect("ok");
            assert!(w.is_empty(), "{ingest}: {w:?}");
        }
        // No token: nothing is sent, so nothing crosses in clear text.
        let (_, w) =
            resolve(&["w", "--ingest", "http://example.invalid", "--", "s"], &[]).expect("ok");
        assert_eq!(w, vec![ConfigWarning::NoToken]);
        // Kill switch: no network at all.
        let (_, w) = resolve(
            &["w", "--ingest", "http://example.invalid", "--", "s"],
            &[(ENV_TOKEN, "obs1.k.s"), (ENV_DISABLED, "1")],
        )
        .expect("ok");
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn urls_in_warnings_and_errors_are_redacted() {
        let (_, w) = resolve(
            &["w", "--ingest", "ftp://u:SECRET1@h/?k=SECRET2", "--", "s"],
            &[(ENV_TOKEN, "obs1.k.s")],
        )
        .expect("ok");
        let msg = w.iter().map(ToString::to_string).collect::<String>();
        assert!(msg.contains("ftp://<redacted>@h/?<redacted>"), "{msg}");
        assert!(!msg.contains("SECRET"), "{msg}");
        let e = resolve(&["w", "--http", "--upstream", "ws://h/mcp?k=SECRET3"], &[])
            .expect_err("refused");
        assert!(!e.to_string().contains("SECRET"), "{e}");
    }

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).expect("ca").pem()
    }

    #[test]
    fn ingest_ca_is_loaded_from_the_flag_or_the_env() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_pem()).expect("write");
        let ca = ca.to_str().expect("utf-8");
        let https = [
            "w",
            "--ingest",
            "https://ingest.example",
            "--token",
            "obs1.k.s",
        ];
        let (c, w) =
            resolve(&[&https[..], &["--ingest-ca", ca, "--", "s"]].concat(), &[]).expect("ok");
        assert_eq!(c.ingest_ca.len(), 1);
        assert!(w.is_empty(), "{w:?}");
        let (c, w) =
            resolve(&[&https[..], &["--", "s"]].concat(), &[(ENV_INGEST_CA, ca)]).expect("ok");
        assert_eq!(c.ingest_ca.len(), 1);
        assert!(w.is_empty(), "{w:?}");
        // Without one, the default roots only.
        let (c, _) = resolve(&[&https[..], &["--", "s"]].concat(), &[]).expect("ok");
        assert!(c.ingest_ca.is_empty());
    }

    #[test]
    fn unusable_ingest_ca_fails_open_with_one_warning_and_reporting_off() {
        let dir = tempfile::tempdir().expect("tempdir");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "SECRET-LOOKING CONTENT\n").expect("write");
        let missing = dir.path().join("missing.pem");
        for (path, origin) in [(&junk, "--ingest-ca"), (&missing, ENV_INGEST_CA)] {
            let p = path.to_str().expect("utf-8");
            let mut argv = vec![
                "w",
                "--ingest",
                "https://ingest.example",
                "--token",
                "obs1.k.s",
            ];
            let env: Vec<(&str, &str)> = if origin == ENV_INGEST_CA {
                vec![(ENV_INGEST_CA, p)]
            } else {
                argv.extend(["--ingest-ca", p]);
                vec![]
            };
            argv.extend(["--", "s"]);
            let (c, w) = resolve(&argv, &env).expect("the server still runs");
            assert_eq!(c.ingest, IngestTarget::Off, "{origin}");
            assert_eq!(w.len(), 1, "{w:?}");
            let msg = w[0].to_string();
            assert!(msg.contains(origin) && msg.contains(p), "{msg}");
            assert!(!msg.contains("SECRET-LOOKING"), "{msg}");
        }
        // Not read at all where it cannot matter: a file sink, or the kill switch.
        let p = missing.to_str().expect("utf-8");
        let (c, w) = resolve(
            &["w", "--ingest", "file:/tmp/x", "--ingest-ca", p, "--", "s"],
            &[],
        )
        .expect("ok");
        assert!(matches!(c.ingest, IngestTarget::File(_)));
        assert!(w.is_empty(), "{w:?}");
        let (_, w) = resolve(
            &["w", "--token", "obs1.k.s", "--ingest-ca", p, "--", "s"],
            &[(ENV_DISABLED, "1")],
        )
        .expect("ok");
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn only_bounded_prefixed_names_are_sensor_variables() {
        for name in [
            ENV_TOKEN,
            ENV_DISABLED,
            "BOUNDED_FUTURE_SETTING",
            "BOUNDED_",
        ] {
            assert!(is_sensor_env(name.as_ref()), "{name}");
        }
        for name in [
            "OTEL_SERVICE_NAME",
            "bounded_sensor_token",
            "XBOUNDED_TOKEN",
            "PATH",
        ] {
            assert!(!is_sensor_env(name.as_ref()), "{name}");
        }
    }

    #[test]
    fn origin_parsing_normalises_and_rejects_non_origins() {
        assert_eq!(
            Origin::parse("HTTPS://App.Example:443/").map(|o| o.to_string()),
            Some("https://app.example".to_string())
        );
        assert_eq!(
            Origin::parse("http://[::1]:8080").map(|o| o.to_string()),
            Some("http://[::1]:8080".to_string())
        );
        assert_eq!(
            Origin::parse("vscode-webview://abc123").map(|o| o.to_string()),
            Some("vscode-webview://abc123".to_string())
        );
        for bad in [
            "null",
            "*",
            "app.example",
            "https://",
            "https://app.example/path",
            "https://app.example?x=1",
            "https://user@app.example",
            "https://*.example",
            "https://app.example:",
            "1http://app.example",
        ] {
            assert_eq!(Origin::parse(bad), None, "{bad}");
        }
    }
}
