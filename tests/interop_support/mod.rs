//! Shared by the interop tests and the HTTP benchmark: the official reference server
//! `@modelcontextprotocol/server-everything` in streamableHttp mode on loopback (tests/node), the
//! official MCP Python SDK client (tests/python/mcp_client.py in tests/python/.venv) and the
//! official TypeScript SDK's stdio client (tests/node/stdio_client.mjs).
//!
//! All are pinned and installed by scripts/test-deps.sh. Tests call the `require_*` functions,
//! which fail (never skip) with what to run; the benchmark asks the `*_installed` functions and
//! says what it left out.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

/// How long server-everything may take to print its port: node starting cold on a loaded
/// 2-core machine takes seconds.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

pub fn node_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node")
}

pub fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python")
}

/// The interpreter of the virtualenv scripts/test-deps.sh builds from tests/python/requirements.txt.
pub fn venv_python() -> PathBuf {
    python_dir().join(".venv/bin/python")
}

pub fn node_packages_installed() -> bool {
    let sdk = node_dir().join("node_modules/@modelcontextprotocol/sdk/package.json");
    let everything =
        node_dir().join("node_modules/@modelcontextprotocol/server-everything/package.json");
    sdk.exists()
        && everything.exists()
        && Command::new("node")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
}

/// Fails (never skips) when the pinned node packages or node itself are missing.
pub fn require_node_packages() {
    assert!(
        node_packages_installed(),
        "the interop packages are not installed, or node is not on PATH: run scripts/test-deps.sh \
         (needs node and npm)"
    );
}

/// server-everything's entry script, for `node` to run over stdio. Fails (never skips) when the
/// pinned packages, the script or node itself are missing.
pub fn everything_script() -> PathBuf {
    require_node_packages();
    let path =
        node_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        path.is_file(),
        "{} is missing: run `bash scripts/test-deps.sh` to install the pinned interop packages",
        path.display()
    );
    path
}

/// True when the venv can import the SDK (a venv left half-built by an interrupted install
/// has the interpreter but not the package).
pub fn python_sdk_installed() -> bool {
    Command::new(venv_python())
        .args(["-c", "import mcp"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Fails (never skips) when the Python SDK's venv is missing.
pub fn require_python_sdk() {
    assert!(
        python_sdk_installed(),
        "the MCP Python SDK is not installed in {}: run scripts/test-deps.sh (needs python3 with venv)",
        venv_python().display()
    );
}

/// A child killed and reaped on drop.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// server-everything on 127.0.0.1:<ephemeral>; its stdout log is kept (it names the sessions).
pub struct Everything {
    _child: Reaped,
    pub port: u16,
    pub log: Arc<Mutex<String>>,
}

impl Everything {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

pub fn start_everything() -> Everything {
    let mut child = Command::new("node")
        .current_dir(node_dir())
        .args(["http_client.mjs", "serve-everything"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn node");
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    let child = Reaped(child);
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel();
    let kept = log.clone();
    // Drains stdout for the server's whole life, so its log can never fill the pipe.
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if let Some(p) = line.strip_prefix("LISTENING ") {
                let _ = tx.send(p.trim().to_string());
            }
            let mut l = kept.lock().expect("lock");
            l.push_str(&line);
            l.push('\n');
        }
    });
    let port = rx
        .recv_timeout(START_TIMEOUT)
        .expect("server-everything printed its port")
        .parse()
        .expect("port");
    Everything {
        _child: child,
        port,
        log,
    }
}

/// The proxy binary in front of `upstream`, with `extra` arguments; returns it with its port.
pub fn start_proxy(upstream: &str, extra: &[&str]) -> (Reaped, u16) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .env_clear()
        .args(["--http", "--upstream", upstream])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn proxy");
    let err = BufReader::new(child.stderr.take().expect("stderr"));
    let child = Reaped(child);
    let (tx, rx) = mpsc::channel();
    // Drains stderr for the proxy's whole life, so it never blocks on it.
    std::thread::spawn(move || {
        for line in err.lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("[observe-mcp] listening http://127.0.0.1:") {
                let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                let _ = tx.send(port);
            }
        }
    });
    let port = rx
        .recv_timeout(START_TIMEOUT)
        .expect("proxy printed its listening line")
        .parse()
        .expect("port");
    (child, port)
}

/// Runs tests/python/mcp_client.py with `args` in the venv and returns the one JSON line it
/// prints; the client is killed if it has not finished within `timeout`.
pub fn run_python_client(args: &[&str], timeout: Duration) -> Result<Value, String> {
    let mut cmd = Command::new(venv_python());
    cmd.current_dir(python_dir())
        .arg("mcp_client.py")
        .args(args);
    run_client(cmd, "the Python SDK client", timeout)
}

/// Runs tests/node/stdio_client.mjs's `transcript` with `args` and returns the one JSON line it
/// prints; the client is killed if it has not finished within `timeout`.
pub fn run_typescript_stdio_client(args: &[&str], timeout: Duration) -> Result<Value, String> {
    require_node_packages();
    let mut argv = vec!["stdio_client.mjs", "transcript"];
    argv.extend_from_slice(args);
    run_node_driver(&argv, timeout)
}

/// Runs `node <script> <args...>` in tests/node and returns the one JSON line it prints; the
/// driver is killed if it has not finished within `timeout`.
pub fn run_node_driver(script_and_args: &[&str], timeout: Duration) -> Result<Value, String> {
    let mut cmd = Command::new("node");
    cmd.current_dir(node_dir()).args(script_and_args);
    run_client(cmd, "the TypeScript SDK client", timeout)
}

/// Runs a client driver that prints one JSON line and exits.
fn run_client(mut cmd: Command, what: &str, timeout: Duration) -> Result<Value, String> {
    let args: Vec<_> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {what} ({:?}): {e}", cmd.get_program()))?;
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(timeout) {
        Ok(out) => out.map_err(|e| format!("client output: {e}"))?,
        Err(_) => {
            // SAFETY: kill(2) on our own child, still unreaped (the waiting thread owns it).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            return Err(format!(
                "{what} ({args:?}) did not finish within {timeout:?}"
            ));
        }
    };
    if !out.status.success() {
        return Err(format!(
            "{what} ({args:?}) failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "{what} ({args:?}) printed no JSON line ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// An official MCP SDK client, as the benchmarks name it in their tables; each benchmark knows
/// how to drive it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SdkClient {
    Python,
    TypeScript,
    Rust,
}

impl SdkClient {
    pub const ALL: [SdkClient; 3] = [SdkClient::Python, SdkClient::TypeScript, SdkClient::Rust];

    pub fn name(self) -> &'static str {
        match self {
            SdkClient::Python => "Python SDK",
            SdkClient::TypeScript => "TypeScript SDK",
            SdkClient::Rust => "Rust SDK (rmcp)",
        }
    }
}

/// Every event in a `file:` sink so far, in order (one batch per line; none before the file
/// exists).
pub fn file_sink_events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .flat_map(|l| {
            let batch: Value = serde_json::from_str(l).expect("a batch per line");
            batch["events"].as_array().expect("events").clone()
        })
        .collect()
}

/// examples/rmcp_echo_server.rs, built next to the wrapper. Fails (never skips) when it is missing.
pub fn rmcp_echo_server() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .parent()
        .expect("target dir")
        .join("examples/rmcp_echo_server");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo test` (which builds examples) or `cargo build --examples` first",
        path.display()
    );
    path
}

/// The text examples/rmcp_echo_server.rs's `big` tool answers with: every 10 bytes say where
/// they stand, so a chunk lost, repeated or moved shows. Written here again rather than shared,
/// so that what the tests expect does not come from the code they check.
pub fn stamped_text(bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 10);
    let mut at = 0;
    while text.len() < bytes {
        text.push_str(&format!("{at:09}|"));
        at += 10;
    }
    text.truncate(bytes);
    text
}

/// One `tools/call` of server-everything's `echo` with `message`, by the official Rust SDK's
/// client: an error, or a result with `isError`, is the caller's error. The benchmarks' unit of
/// work for that client, over stdio and over HTTP.
pub async fn rmcp_echo(
    client: &rmcp::service::Peer<rmcp::RoleClient>,
    message: String,
) -> Result<(), String> {
    let mut arguments = serde_json::Map::new();
    arguments.insert("message".into(), message.clone().into());
    let params = rmcp::model::CallToolRequestParams::new("echo").with_arguments(arguments);
    let r = client
        .call_tool(params)
        .await
        .map_err(|e| format!("echo {message:?}: {e}"))?;
    if r.is_error == Some(true) {
        return Err(format!("echo {message:?} failed: {r:?}"));
    }
    Ok(())
}
