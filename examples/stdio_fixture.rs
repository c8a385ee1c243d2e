//! A byte-level stand-in for an MCP stdio server, used by the stdio tests (not an MCP server).
//!
//! `stdio_fixture MODE [ARGS]`; every write goes straight to fd 1 (no buffering), so what the
//! tests see is exactly what the mode wrote. Modes:
//!
//! * `cat` — copy stdin to stdout until EOF, exit 0.
//! * `exit N` — exit with code N at once.
//! * `kill-self SIG` — kill itself with signal number SIG.
//! * `pattern N` — write the N-byte deterministic pattern ([`pattern_byte`]), which contains
//!   newlines and invalid UTF-8 and does not end in a newline, then exit 0.
//! * `final-response N` — wait for one line on stdin, write N bytes ending in `\n`, exit 0 at
//!   once (the last response is still in the pipe when the process is gone).
//! * `ignore-eof` — print `ready pid=P\n`, read stdin to EOF, then sleep forever.
//! * `ignore-term` — like `ignore-eof`, but SIGTERM is caught and ignored.
//! * `trap SIG CODE` — print `ready pid=P\n`, copy stdin to stdout; on signal SIG print `got SIG\n`
//!   and exit CODE.
//! * `pids` — print `pid=P ppid=Q pgid=G\n`, then `cat`.
//! * `grandchild MODE [ARGS]` — start this program as a grandchild in MODE with inherited
//!   stdio, print `child=P grandchild=Q\n`, then sleep forever without reading stdin.
//! * `background` — start a `sleep` grandchild whose stdio is /dev/null, print
//!   `child=P grandchild=Q\n`, then `cat` and exit 0 (the grandchild is left behind).
//! * `hold-stdout` — start a `sleep` grandchild that inherits stdout, print
//!   `child=P grandchild=Q\n`, exit 0 at once (stdout stays open in the grandchild).
//! * `close-stdin` — close stdin, print `closed\n`, then sleep forever.
//! * `sleep` — sleep forever, reading nothing.
//! * `stderr TEXT` — write TEXT and a newline to stderr, then `cat`.
//! * `flood` — write numbered lines to stdout until a write fails, then exit 141 (EPIPE).
//! * `answer-only TOOL` — a minimal MCP server that answers `initialize`, `tools/list` and
//!   `tools/call` of TOOL, reads every other line and never answers it (a server that leaves
//!   calls open), until EOF.
//! * `outcomes` — a minimal MCP server whose tools end every way a call can: `ok` succeeds,
//!   `tool_error` answers `isError: true`, `rpc_error` a JSON-RPC error (-32602) whose message
//!   holds an e-mail address, a tool whose name starts with `slow` is never answered, any other
//!   succeeds (unlisted). `tools/list` lists `ok`, `tool_error`, `rpc_error`.

use std::fs::File;
use std::io::{self, BufRead, Read, Write};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Byte `i` of the `pattern` mode. Tests carry an identical copy of this function.
fn pattern_byte(i: usize) -> u8 {
    // Mixes newlines (i % 97 == 0), bytes ≥ 0x80 (invalid UTF-8) and NULs.
    if i % 97 == 96 {
        b'\n'
    } else {
        (i.wrapping_mul(2_654_435_761) >> 13) as u8
    }
}

fn stdout() -> File {
    let fd = io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .expect("fixture: dup stdout");
    File::from(fd)
}

fn stdin() -> File {
    let fd = io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .expect("fixture: dup stdin");
    File::from(fd)
}

fn say(text: &str) {
    let _ = stdout().write_all(text.as_bytes());
}

fn cat() {
    let mut input = stdin();
    let mut output = stdout();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match input.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if output.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn drain_stdin() {
    let mut input = stdin();
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = input.read(&mut buf) {
        if n == 0 {
            return;
        }
    }
}

/// The `answer-only` mode: one response line for the requests it answers, `None` for the rest.
/// Other tools' calls are skipped before parsing: the tests flood hundreds of thousands of them.
fn answer_only(line: &str, tool: &str) -> Option<String> {
    if line.contains("\"tools/call\"") && !line.contains(&format!("\"name\":\"{tool}\"")) {
        return None;
    }
    let msg: serde_json::Value = serde_json::from_str(line).ok()?;
    let id = msg.get("id")?.clone();
    let result = match msg.get("method")?.as_str()? {
        "initialize" => serde_json::json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "answer-only", "version": "1"}
        }),
        "tools/list" => serde_json::json!({"tools": [
            {"name": tool, "inputSchema": {"type": "object"}},
            {"name": "never_answered", "inputSchema": {"type": "object"}}
        ]}),
        "tools/call" => serde_json::json!({"content": [{"type": "text", "text": "done"}]}),
        _ => return None,
    };
    Some(format!(
        "{}\n",
        serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result})
    ))
}

/// The `outcomes` mode: one response line for the requests it answers.
fn outcomes(line: &str) -> Option<String> {
    let msg: serde_json::Value = serde_json::from_str(line).ok()?;
    let id = msg.get("id")?.clone();
    let result = match msg.get("method")?.as_str()? {
        "initialize" => serde_json::json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "outcomes", "version": "2.1.0"}
        }),
        "tools/list" => serde_json::json!({"tools": [
            {"name": "ok", "inputSchema": {"type": "object"}},
            {"name": "tool_error", "inputSchema": {"type": "object"}},
            {"name": "rpc_error", "inputSchema": {"type": "object"}}
        ]}),
        "tools/call" => match msg["params"]["name"].as_str().unwrap_or("") {
            "tool_error" => serde_json::json!({"content": [], "isError": true}),
            "rpc_error" => {
                return Some(format!(
                    "{}\n",
                    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {
                        "code": -32602, "message": "unknown customer rpc-leak@example.com"}})
                ))
            }
            n if n.starts_with("slow") => return None,
            _ => serde_json::json!({"content": [{"type": "text", "text": "done"}]}),
        },
        _ => return None,
    };
    Some(format!(
        "{}\n",
        serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result})
    ))
}

fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn spawn_self(args: &[&str], inherit_stdout: bool) -> u32 {
    let exe = std::env::current_exe().expect("fixture: current_exe");
    let mut cmd = Command::new(exe);
    cmd.args(args);
    if !inherit_stdout {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    }
    cmd.spawn().expect("fixture: spawn grandchild").id()
}

fn num<T: std::str::FromStr>(args: &[String], i: usize) -> T {
    args.get(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("fixture: argument {i} must be a number: {args:?}"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("cat");
    match mode {
        "cat" => cat(),
        "exit" => std::process::exit(num(&args, 1)),
        "kill-self" => {
            let sig: i32 = num(&args, 1);
            let sig = nix::sys::signal::Signal::try_from(sig).expect("fixture: signal number");
            let _ = nix::sys::signal::raise(sig);
            sleep_forever();
        }
        "pattern" => {
            let n: usize = num(&args, 1);
            let data: Vec<u8> = (0..n).map(pattern_byte).collect();
            stdout().write_all(&data).expect("fixture: write pattern");
        }
        "final-response" => {
            let n: usize = num(&args, 1);
            let mut input = stdin();
            let mut byte = [0u8; 1];
            while input.read(&mut byte).map(|k| k == 1).unwrap_or(false) && byte[0] != b'\n' {}
            let mut data = vec![b'x'; n];
            if let Some(last) = data.last_mut() {
                *last = b'\n';
            }
            let _ = stdout().write_all(&data);
            std::process::exit(0);
        }
        "ignore-eof" => {
            say(&format!("ready pid={}\n", std::process::id()));
            drain_stdin();
            sleep_forever();
        }
        "ignore-term" => {
            let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            signal_hook::flag::register(signal_hook::consts::SIGTERM, flag)
                .expect("fixture: catch SIGTERM");
            say(&format!("ready pid={}\n", std::process::id()));
            drain_stdin();
            sleep_forever();
        }
        "trap" => {
            let sig: i32 = num(&args, 1);
            let code: i32 = num(&args, 2);
            let mut signals =
                signal_hook::iterator::Signals::new([sig]).expect("fixture: trap signal");
            std::thread::spawn(move || {
                if let Some(got) = signals.forever().next() {
                    say(&format!("got {got}\n"));
                    std::process::exit(code);
                }
            });
            say(&format!("ready pid={}\n", std::process::id()));
            cat();
            sleep_forever();
        }
        "pids" => {
            say(&format!(
                "pid={} ppid={} pgid={}\n",
                std::process::id(),
                nix::unistd::getppid(),
                nix::unistd::getpgrp()
            ));
            cat();
        }
        "grandchild" => {
            let rest: Vec<&str> = args[1..].iter().map(String::as_str).collect();
            let gc = spawn_self(&rest, true);
            say(&format!("child={} grandchild={gc}\n", std::process::id()));
            sleep_forever();
        }
        "background" => {
            let gc = spawn_self(&["sleep"], false);
            say(&format!("child={} grandchild={gc}\n", std::process::id()));
            cat();
        }
        "hold-stdout" => {
            let gc = spawn_self(&["sleep"], true);
            say(&format!("child={} grandchild={gc}\n", std::process::id()));
            std::process::exit(0);
        }
        "close-stdin" => {
            // SAFETY: fd 0 is the inherited stdin pipe, open at start; this program never uses
            // fd 0 (or std's stdin) again, so taking ownership and closing it is sound.
            drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(0) });
            say("closed\n");
            sleep_forever();
        }
        "sleep" => sleep_forever(),
        "stderr" => {
            let text = args.get(1).cloned().unwrap_or_default();
            let _ = writeln!(io::stderr(), "{text}");
            cat();
        }
        "flood" => {
            let mut out = stdout();
            for i in 0u64.. {
                if out.write_all(format!("line {i}\n").as_bytes()).is_err() {
                    std::process::exit(141);
                }
            }
        }
        "outcomes" => {
            let mut out = stdout();
            for line in io::BufReader::new(stdin()).lines() {
                let Ok(line) = line else { break };
                if let Some(resp) = outcomes(&line) {
                    if out.write_all(resp.as_bytes()).is_err() {
                        break;
                    }
                }
            }
        }
        "answer-only" => {
            let tool = args.get(1).cloned().unwrap_or_default();
            let mut out = stdout();
            for line in io::BufReader::new(stdin()).lines() {
                let Ok(line) = line else { return };
                if let Some(answer) = answer_only(&line, &tool) {
                    if out.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            }
        }
        other => {
            eprintln!("fixture: unknown mode {other:?}");
            std::process::exit(64);
        }
    }
}
