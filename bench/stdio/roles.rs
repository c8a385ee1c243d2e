//! The two helper processes the harness re-invokes itself as: the mock MCP server (in one of its
//! [`ServerMode`]s) and the minimal byte relay.
//!
//! Both use the raw stdin/stdout file descriptors (duplicated into `File`s) so that std's
//! buffered `Stdout` never adds a copy or a delayed flush: every response is one `write_all`.
//! They must never print anything but protocol bytes on stdout; they are measured, not observed.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::thread;

/// One relay read, the same size as the wrapper's own relay buffer, so the comparison is fair.
const RELAY_BUF: usize = 64 * 1024;
/// Reader buffer of the mock server; requests are small, this only saves syscalls when pipelined.
const SERVER_READ_BUF: usize = 64 * 1024;
/// The protocol revision the mock server answers `initialize` with.
const PROTOCOL_VERSION: &str = "2025-06-18";

fn raw_stdin() -> io::Result<File> {
    Ok(File::from(io::stdin().as_fd().try_clone_to_owned()?))
}

fn raw_stdout() -> io::Result<File> {
    Ok(File::from(io::stdout().as_fd().try_clone_to_owned()?))
}

/// The driver's `tools/call` of `echo` (a small answer), as one line.
pub fn echo_request(id: u64) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"echo\",\"arguments\":{{\"amount_cents\":4900,\"currency\":\"EUR\"}}}}}}\n"
    )
}

/// The driver's `tools/call` of `blob` (an answer of `bytes` bytes of text), as one line.
pub fn blob_request(id: u64, bytes: usize) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"blob\",\"arguments\":{{\"bytes\":{bytes}}}}}}}\n"
    )
}

/// The driver's `initialize` request (id 0).
pub const INITIALIZE: &str = "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"bench-driver\",\"version\":\"1.0.0\"}}}\n";

/// The numeric `"id":N` of a request line the harness wrote, or `None` for a notification.
fn request_id(line: &[u8]) -> Option<&[u8]> {
    let at = find(line, b"\"id\":")? + 5;
    let rest = &line[at..];
    let end = rest
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `"bytes":N` in a `blob` call's arguments.
fn blob_size(line: &[u8]) -> usize {
    let Some(at) = find(line, b"\"bytes\":") else {
        return 0;
    };
    line[at + 8..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0usize, |n, b| n * 10 + usize::from(b - b'0'))
}

/// How the mock server behaves; the argument after `--role server` (none: [`ServerMode::Normal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerMode {
    /// Answers everything, exits at stdin EOF.
    Normal,
    /// `oneshot`: answers the first `initialize` and exits at once (a per-session server that
    /// is spawned, asked one thing and gone: the start-up row).
    OneShot,
    /// `mute`: reads and discards every `tools/call`, answering only `initialize` and
    /// `tools/list` (the flood of unanswered calls).
    Mute,
}

impl ServerMode {
    /// The argument that selects the mode after `--role server`.
    pub fn arg(self) -> Option<&'static str> {
        match self {
            ServerMode::Normal => None,
            ServerMode::OneShot => Some("oneshot"),
            ServerMode::Mute => Some("mute"),
        }
    }

    fn parse(arg: Option<&str>) -> Option<ServerMode> {
        [ServerMode::Normal, ServerMode::OneShot, ServerMode::Mute]
            .into_iter()
            .find(|m| m.arg() == arg)
    }
}

/// A fast mock MCP stdio server: `initialize`, `tools/list`, and `tools/call` for `echo`
/// (a small result) and `blob` (a text result of `arguments.bytes` bytes). Exits 0 at stdin EOF
/// (in the normal mode; see [`ServerMode`]). `args` are the arguments after `--role server`.
pub fn server_main(args: &[String]) -> i32 {
    let Some(mode) = ServerMode::parse(args.first().map(String::as_str)) else {
        eprintln!("bench server: unknown mode {:?}", args.first());
        return 2;
    };
    match serve(mode) {
        Ok(()) => 0,
        // The client went away mid-write: the end of the session, not a failure.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("bench server: {e}");
            1
        }
    }
}

fn serve(mode: ServerMode) -> io::Result<()> {
    let mut input = BufReader::with_capacity(SERVER_READ_BUF, raw_stdin()?);
    let mut out = raw_stdout()?;
    let mut line = Vec::with_capacity(1024);
    let mut resp: Vec<u8> = Vec::with_capacity(1024);
    let mut payload: Vec<u8> = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        if mode == ServerMode::Mute && find(&line, b"\"method\":\"tools/call\"").is_some() {
            continue;
        }
        if !answer(&line, &mut resp, &mut payload) {
            continue; // notifications get no answer
        }
        out.write_all(&resp)?;
        if mode == ServerMode::OneShot && find(&line, b"\"method\":\"initialize\"").is_some() {
            return Ok(());
        }
    }
}

/// The mock server's answer to one request line, in `resp` (a line, emptied first); false for
/// a notification, which gets none. `payload`: the `blob` answers' text, kept between calls.
pub fn answer(line: &[u8], resp: &mut Vec<u8>, payload: &mut Vec<u8>) -> bool {
    let Some(id) = request_id(line) else {
        return false;
    };
    resp.clear();
    resp.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    resp.extend_from_slice(id);
    if find(line, b"\"method\":\"tools/call\"").is_some() {
        if find(line, b"\"name\":\"blob\"").is_some() {
            let n = blob_size(line);
            if payload.len() < n {
                payload.resize(n, b'a');
            }
            resp.extend_from_slice(b",\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"");
            resp.extend_from_slice(&payload[..n]);
            resp.extend_from_slice(b"\"}],\"isError\":false}}\n");
        } else {
            resp.extend_from_slice(
                b",\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}],\"isError\":false}}\n",
            );
        }
    } else if find(line, b"\"method\":\"initialize\"").is_some() {
        resp.extend_from_slice(b",\"result\":{\"protocolVersion\":\"");
        resp.extend_from_slice(PROTOCOL_VERSION.as_bytes());
        resp.extend_from_slice(
            b"\",\"capabilities\":{\"tools\":{}},\"serverInfo\":{\"name\":\"bench-server\",\"version\":\"1.0.0\"}}}\n",
        );
    } else if find(line, b"\"method\":\"tools/list\"").is_some() {
        resp.extend_from_slice(
            b",\"result\":{\"tools\":[{\"name\":\"echo\",\"description\":\"Answers ok\",\"inputSchema\":{\"type\":\"object\",\"properties\":{\"amount_cents\":{\"type\":\"integer\"},\"currency\":{\"type\":\"string\"}}}},{\"name\":\"blob\",\"description\":\"Answers N bytes\",\"inputSchema\":{\"type\":\"object\",\"properties\":{\"bytes\":{\"type\":\"integer\"}}}}]}}\n",
        );
    } else {
        resp.extend_from_slice(b",\"error\":{\"code\":-32601,\"message\":\"Method not found\"}}\n");
    }
    true
}

/// The minimal byte relay the wrapper is compared with: spawn the server, copy stdin → child and
/// child → stdout on two plain threads, exit with the child's code. Nothing else. `args` are the
/// arguments after `--role relay`: `-- <command> [args…]` relays to that command instead of this
/// binary's own `--role server`.
pub fn relay_main(args: &[String]) -> i32 {
    match relay(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bench relay: {e}");
            1
        }
    }
}

fn relay(args: &[String]) -> io::Result<i32> {
    let mut cmd = match args {
        [dashes, program, rest @ ..] if dashes == "--" => {
            let mut c = Command::new(program);
            c.args(rest);
            c
        }
        _ => {
            let mut c = Command::new(std::env::current_exe()?);
            c.args(["--role", "server"]);
            c
        }
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let (Some(child_in), Some(child_out)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(io::Error::other("child pipes missing"));
    };
    let stdin = raw_stdin()?;
    let stdout = raw_stdout()?;
    // Upstream: at our stdin EOF the thread ends and drops `child_in`, closing the child's stdin.
    thread::spawn(move || copy(stdin, child_in));
    let down = thread::spawn(move || copy(child_out, stdout));
    let _ = down.join();
    let status = child.wait()?;
    // The upstream thread may still sit in read(); exiting the process ends it.
    Ok(status.code().unwrap_or(1))
}

fn copy(mut from: impl Read, mut to: impl Write) -> io::Result<()> {
    let mut buf = vec![0u8; RELAY_BUF];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
    }
}
