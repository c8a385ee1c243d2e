//! One typical session: an official MCP SDK client launches a target around
//! `@modelcontextprotocol/server-everything` over stdio (tests/node) and makes sequential
//! `tools/call`s of `echo`. Three clients: the Python SDK (tests/python/mcp_client.py
//! `stdio-session`, in the venv scripts/test-deps.sh builds) and the TypeScript SDK
//! (tests/node/stdio_client.mjs `session`), each with its own stdio transport, and the Rust SDK
//! (`rmcp`'s client in this binary, `--role rmcp-client`, see [`rmcp_client_main`]). Python and
//! Rust give the server pipes; Node gives it socket pairs.
//!
//! The client prints the pid of the process the SDK spawned (the wrapper, the relay, or node
//! for `direct`) once its calls are done, and waits for our go before closing the session. We
//! read that process's VmHWM, send the go, and poll /proc/<pid>/status until the process is
//! gone or a zombie with no thread left, noting CLOCK_MONOTONIC when we see it; the client notes
//! the same clock when the SDK has closed (Python, Rust) or shut down (Node) the server's stdin.
//! The SDKs themselves only poll or wait for the exit coarsely (Python every 10 ms), so their
//! own timing could not tell 1 ms from 9.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::interop_support::{node_dir, python_dir, venv_python};
use crate::session::{self, Ctx, Launch, Target};

/// How long the client may take to start (Python imports, node start-up) and make its calls.
const CALLS_DEADLINE: Duration = Duration::from_secs(120);
/// How long the spawned process may take to exit after the go; then it is killed.
const EXIT_DEADLINE: Duration = Duration::from_secs(30);
/// How often the spawned process is looked at after the go.
const POLL: Duration = Duration::from_micros(250);

/// The official SDK client that drives a typical session.
pub use crate::interop_support::SdkClient as Client;

impl Client {
    /// The driver of a typical session, up to its mode's arguments.
    fn command(self) -> Command {
        match self {
            Client::Python => {
                let mut cmd = Command::new(venv_python());
                cmd.current_dir(python_dir())
                    .args(["mcp_client.py", "stdio-session"]);
                cmd
            }
            Client::TypeScript => {
                let mut cmd = Command::new(which("node").unwrap_or_else(|| "node".into()));
                cmd.current_dir(node_dir())
                    .args(["stdio_client.mjs", "session"]);
                cmd
            }
            Client::Rust => {
                let me = std::env::current_exe().unwrap_or_else(|_| "stdio-bench".into());
                let mut cmd = Command::new(me);
                cmd.args(["--role", "rmcp-client"]);
                cmd
            }
        }
    }
}

/// `--role rmcp-client <calls> [--env NAME=VALUE]... -- <command> [args...]`: the session the
/// Python and TypeScript drivers run, with the official Rust SDK's client. rmcp's
/// `TokioChildProcess` closes the server's stdin and waits for the exit inside one call, so the
/// close could not be timed apart from the wait: this spawns the server itself, with piped
/// stdin and stdout and the environment inherited plus each `--env`, as `TokioChildProcess`
/// does, and gives rmcp the two pipes (its async read/write transport, the one
/// `TokioChildProcess` wraps). Cancelling the service drops the stdin; then it waits for the exit.
pub fn rmcp_client_main(args: &[String]) -> i32 {
    let Some((calls, env, argv)) = parse_session_args(args) else {
        eprintln!("usage: --role rmcp-client <calls> [--env NAME=VALUE]... -- <command> [args...]");
        return 2;
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rmcp-client: runtime: {e}");
            return 1;
        }
    };
    match rt.block_on(rmcp_session(calls, env, argv)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rmcp-client: {e}");
            1
        }
    }
}

type SessionArgs<'a> = (u32, Vec<(&'a str, &'a str)>, &'a [String]);

fn parse_session_args(args: &[String]) -> Option<SessionArgs<'_>> {
    let dashes = args.iter().position(|a| a == "--")?;
    let (head, argv) = (&args[..dashes], &args[dashes + 1..]);
    let calls = head.first()?.parse().ok()?;
    let mut env = Vec::new();
    for pair in head[1..].chunks(2) {
        match pair {
            [flag, kv] if flag == "--env" => env.push(kv.split_once('=')?),
            _ => return None,
        }
    }
    (!argv.is_empty()).then_some((calls, env, argv))
}

async fn rmcp_session(calls: u32, env: Vec<(&str, &str)>, argv: &[String]) -> Result<(), String> {
    use rmcp::ServiceExt;
    use tokio::io::AsyncBufReadExt;

    let mut child = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", argv[0]))?;
    let pid = child.id();
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("the server's pipes are missing".into());
    };
    let service = ().serve((stdout, stdin)).await.map_err(|e| format!("initialize: {e}"))?;
    let t = Instant::now();
    for i in 0..calls {
        crate::interop_support::rmcp_echo(&service, format!("call {i}")).await?;
    }
    let seconds = t.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({ "pid": pid, "calls": calls, "seconds": seconds })
    );
    let mut go = String::new();
    tokio::io::BufReader::new(tokio::io::stdin())
        .read_line(&mut go)
        .await
        .map_err(|e| format!("waiting for the go: {e}"))?;
    let _ = service.cancel().await;
    let close_ns = monotonic_ns();
    child
        .wait()
        .await
        .map_err(|e| format!("waiting for the server: {e}"))?;
    println!(
        "{}",
        serde_json::json!({ "close_ns": close_ns as i64, "context_exit_ns": monotonic_ns() as i64 })
    );
    Ok(())
}

/// One typical session's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TypicalRec {
    /// [`Client::name`].
    pub client: String,
    pub target: String,
    pub run: u32,
    pub error: Option<String>,
    /// VmHWM of the process the SDK spawned, last read before it exited, KiB.
    pub hwm_kib: Option<f64>,
    /// The SDK closing that process's stdin → the process gone (or a zombie), ms.
    pub close_to_exit_ms: Option<f64>,
    /// The same close → the exit of the server it runs (node, the process's child), ms; for
    /// `direct` the process itself.
    pub close_to_server_exit_ms: Option<f64>,
    /// The same close → the client's session context exited (the SDK polls every 10 ms), ms.
    pub close_to_context_exit_ms: Option<f64>,
    /// The calls, sequential, ms.
    pub calls_ms: Option<f64>,
    /// Events in the `file:` sink, and `tools/call` made.
    pub events: Option<(u64, u64)>,
}

/// Whether the client and the server are installed; `Err` says what is missing.
pub fn available() -> Result<(), String> {
    use crate::interop_support::{node_packages_installed, python_sdk_installed};
    if !node_packages_installed() {
        return Err("server-everything (tests/node) or node is not installed".into());
    }
    if !python_sdk_installed() {
        return Err("the Python SDK venv (tests/python/.venv) is not installed".into());
    }
    if which("node").is_none() {
        return Err("node is not on PATH".into());
    }
    Ok(())
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

/// `node <server-everything> stdio`.
fn everything_argv() -> Vec<OsString> {
    vec![
        which("node").unwrap_or_else(|| "node".into()).into(),
        node_dir()
            .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
            .into(),
        "stdio".into(),
    ]
}

/// CLOCK_MONOTONIC in ns, the clock Python's `time.monotonic_ns()` and Node's
/// `process.hrtime` read on Linux.
fn monotonic_ns() -> i128 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec()))
        .unwrap_or(0)
}

/// One session of `client` through `target`; `calls` echo calls.
pub fn run(ctx: &mut Ctx, client: Client, target: Target, run: u32, calls: u32) -> TypicalRec {
    let mut rec = TypicalRec {
        client: client.name().into(),
        target: target.name().into(),
        run,
        ..TypicalRec::default()
    };
    if let Err(e) = session_into(ctx, client, target, calls, &mut rec) {
        rec.error = Some(format!("{} client, {}: {e}", client.name(), target.name()));
    }
    rec
}

fn session_into(
    ctx: &mut Ctx,
    client: Client,
    target: Target,
    calls: u32,
    rec: &mut TypicalRec,
) -> Result<(), String> {
    let label = ctx.label(target);
    let launch = Launch::new(ctx, target, &everything_argv(), &label)?;
    let log_path = ctx.tmp.join(format!("{label}.client.stderr"));
    let log = File::create(&log_path).map_err(|e| format!("client log: {e}"))?;
    let mut cmd = client.command();
    cmd.arg(calls.to_string());
    for (k, v) in &launch.env {
        cmd.arg("--env").arg(format!("{k}={v}"));
    }
    cmd.arg("--").args(&launch.argv);
    session::clean_env(&mut cmd);
    cmd.process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log));
    let program = cmd.get_program().to_owned();
    let mut client = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    let _watchdog = session::start_watchdog(client.id(), CALLS_DEADLINE + EXIT_DEADLINE);
    let (Some(mut to_client), Some(from_client)) = (client.stdin.take(), client.stdout.take())
    else {
        session::kill_group(client.id());
        let _ = client.wait();
        return Err("client pipes missing".into());
    };
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(from_client).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let fail = |client: &mut std::process::Child, what: String| {
        session::kill_group(client.id());
        let _ = client.wait();
        format!("{what}; client stderr: {}", session::stderr_tail(&log_path))
    };

    let first: serde_json::Value = match rx.recv_timeout(CALLS_DEADLINE) {
        Ok(line) => serde_json::from_str(&line)
            .map_err(|e| fail(&mut client, format!("client printed {line:?} ({e})")))?,
        Err(_) => {
            return Err(fail(
                &mut client,
                "the client made no report of its calls".into(),
            ))
        }
    };
    let Some(pid) = first["pid"].as_u64().and_then(|p| u32::try_from(p).ok()) else {
        return Err(fail(&mut client, format!("no pid in {first}")));
    };
    rec.calls_ms = first["seconds"].as_f64().map(|s| s * 1e3);
    let mut hwm = session::read_hwm(pid);
    let server = if target == Target::Direct {
        None
    } else {
        session::children_of(pid).first().copied()
    };
    let mut server_exit_ns = None;

    // Go: the client leaves its session context, and the SDK closes the server's stdin.
    let go = to_client
        .write_all(b"go\n")
        .and_then(|()| to_client.flush());
    if let Err(e) = go {
        return Err(fail(
            &mut client,
            format!("cannot tell the client to close: {e}"),
        ));
    }
    let t0 = Instant::now();
    let exit_ns = loop {
        if let (None, Some(sp)) = (server_exit_ns, server) {
            if !session::alive(sp) {
                server_exit_ns = Some(monotonic_ns());
            }
        }
        if let Some(h) = session::read_hwm(pid) {
            hwm = Some(hwm.map_or(h, |o: u64| o.max(h)));
        }
        if !session::alive(pid) {
            break Some(monotonic_ns());
        }
        if t0.elapsed() > EXIT_DEADLINE {
            session::kill_pid(pid);
            break None;
        }
        thread::sleep(POLL);
    };
    rec.hwm_kib = hwm.map(|h| h as f64);
    let second: Option<serde_json::Value> = rx
        .recv_timeout(EXIT_DEADLINE)
        .ok()
        .and_then(|l| serde_json::from_str(&l).ok());
    let status = client.wait().map_err(|e| format!("client wait: {e}"))?;
    let Some(exit_ns) = exit_ns else {
        return Err(format!(
            "no exit in {} s after the client closed the session (killed)",
            EXIT_DEADLINE.as_secs()
        ));
    };
    let close_ns = second
        .as_ref()
        .and_then(|v| v["close_ns"].as_i64())
        .map(i128::from);
    let context_ns = second
        .as_ref()
        .and_then(|v| v["context_exit_ns"].as_i64())
        .map(i128::from);
    if !status.success() {
        return Err(format!(
            "client {}; stderr: {}",
            session::describe(status),
            session::stderr_tail(&log_path)
        ));
    }
    let Some(close_ns) = close_ns else {
        return Err("the client did not report when it closed the server's stdin".into());
    };
    rec.close_to_exit_ms = Some((exit_ns - close_ns) as f64 / 1e6);
    rec.close_to_server_exit_ms = match (server, server_exit_ns) {
        (None, _) => rec.close_to_exit_ms,
        (Some(_), Some(s)) => Some((s - close_ns) as f64 / 1e6),
        (Some(_), None) => None,
    };
    rec.close_to_context_exit_ms = context_ns.map(|c| (c - close_ns) as f64 / 1e6);
    if let Some(file) = &launch.events_file {
        rec.events = Some((session::count_file_events(file).0, u64::from(calls)));
    }
    Ok(())
}
