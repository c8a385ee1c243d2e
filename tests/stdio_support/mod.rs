//! Shared helpers for the stdio integration tests: run the real wrapper binary around the
//! `stdio_fixture` example over real pipes, with bounded waits and no network (no token, no
//! `BOUNDED_*` variable from the outer environment).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Upper bound for anything a test waits on. Generous: a loaded 2-core machine is slow, and
/// the longest lifecycle path (grace + SIGTERM grace + SIGKILL grace) is 5 s.
pub const WAIT: Duration = Duration::from_secs(60);

pub fn wrapper_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
}

/// A fixture program from `examples/`. Plain `cargo test` builds example binaries;
/// `cargo test --all-targets` alone builds them only as test harnesses, hence the message.
pub fn example(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .parent()
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo test` (which builds examples) or `cargo build --examples` first",
        path.display()
    );
    path
}

pub fn fixture() -> PathBuf {
    example("stdio_fixture")
}

/// The wrapper command with a clean sensor environment (nothing reported, nothing sent).
pub fn wrapper_cmd(flags: &[&str], server: &[&std::ffi::OsStr]) -> Command {
    let mut cmd = Command::new(wrapper_bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("BOUNDED_") {
            cmd.env_remove(&k);
        }
    }
    cmd.args(flags).arg("--").args(server);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// `wrapper [flags] -- stdio_fixture <mode args>`.
pub fn wrap_fixture(flags: &[&str], mode: &[&str]) -> Command {
    let fx = fixture();
    let mut server: Vec<&std::ffi::OsStr> = vec![fx.as_os_str()];
    server.extend(mode.iter().map(std::ffi::OsStr::new));
    wrapper_cmd(flags, &server)
}

/// A stream being read to EOF on its own thread (so a full pipe never deadlocks the test).
pub struct Collected(std::sync::mpsc::Receiver<Vec<u8>>);

impl Collected {
    /// Everything read up to EOF. EOF comes only when every writer is gone, so a leaked
    /// descendant holding the pipe would block forever: fail with that diagnosis instead.
    pub fn get(self) -> Vec<u8> {
        self.0
            .recv_timeout(WAIT)
            .expect("stream not closed within the deadline: a leaked process still holds it")
    }

    pub fn text(self) -> String {
        String::from_utf8_lossy(&self.get()).into_owned()
    }
}

pub fn collect<R: Read + Send + 'static>(mut r: R) -> Collected {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = r.read_to_end(&mut out);
        let _ = tx.send(out);
    });
    Collected(rx)
}

/// Waits for the process with a deadline; on timeout kills it and fails the test.
pub fn wait_for(child: &mut Child, limit: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} did not exit within {limit:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Everything a finished wrapper run produced.
pub struct Run {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Run {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// Runs `cmd`, writes `input` to its stdin in `chunks` (sizes cycled; empty = one write), then
/// closes stdin (unless `keep_stdin_open`), and collects everything.
pub fn run_with(
    mut cmd: Command,
    input: Vec<u8>,
    chunks: Vec<usize>,
    keep_stdin_open: bool,
) -> Run {
    let mut child = cmd.spawn().expect("spawn wrapper");
    let out = collect(child.stdout.take().expect("stdout"));
    let err = collect(child.stderr.take().expect("stderr"));
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || {
        let mut rest = &input[..];
        let mut i = 0;
        while !rest.is_empty() {
            let n = if chunks.is_empty() {
                rest.len()
            } else {
                chunks[i % chunks.len()].clamp(1, rest.len())
            };
            if stdin.write_all(&rest[..n]).is_err() {
                break;
            }
            let _ = stdin.flush();
            rest = &rest[n..];
            i += 1;
        }
        if keep_stdin_open {
            Some(stdin)
        } else {
            None
        }
    });
    let status = wait_for(&mut child, WAIT);
    let held_stdin = writer.join().expect("writer thread");
    drop(held_stdin);
    Run {
        status,
        stdout: out.get(),
        stderr: err.text(),
    }
}

pub fn run(cmd: Command, input: &[u8]) -> Run {
    run_with(cmd, input.to_vec(), Vec::new(), false)
}

/// Reads one line from the child's stdout (the fixture's `ready …` / pid lines).
pub fn read_line(r: &mut BufReader<ChildStdout>) -> String {
    let mut line = String::new();
    r.read_line(&mut line).expect("read line from wrapper");
    line
}

/// Parses `key=N` out of a fixture line.
pub fn field(line: &str, key: &str) -> u32 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// The command name and the fields after it of a `/proc/<pid>/stat` (or
/// `/proc/<pid>/task/<tid>/stat`) text: field 3, the state, first, so field `n` is at `n - 3`.
/// The name is parenthesised and may itself hold spaces and parentheses.
pub fn stat_fields(stat: &str) -> Option<(&str, Vec<&str>)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1;
    Some((comm, rest.split_whitespace().collect()))
}

/// `Some(state)` from /proc/<pid>/stat (`R`, `S`, `Z`, …), `None` if the pid is gone.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_fields(&stat)?.1.first()?.chars().next()
}

/// Waits until `pid` is no longer a running process (gone, or a zombie some init will reap).
/// Returns false if it is still running at the deadline.
pub fn wait_not_running(pid: u32, limit: Duration) -> bool {
    let start = Instant::now();
    loop {
        match proc_state(pid) {
            None | Some('Z') | Some('X') => return true,
            Some(_) if start.elapsed() > limit => return false,
            Some(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Asserts every pid stops running within the deadline; kills the leftovers first so a
/// failing test does not leak them (nor keep an inherited pipe open).
pub fn assert_all_gone(pids: &[u32]) {
    let leftover: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|&pid| !wait_not_running(pid, WAIT / 2))
        .collect();
    for &pid in &leftover {
        kill_quietly(pid);
    }
    assert!(
        leftover.is_empty(),
        "still running: {leftover:?} (of {pids:?})"
    );
}

/// Kills a leftover process so a failing test does not leak it.
pub fn kill_quietly(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

pub fn drain_stderr(err: ChildStderr) -> Collected {
    collect(err)
}

/// A client's `initialize`, `notifications/initialized`, then `calls` `issue_refund` calls
/// (ids 1 to `calls`), one message a line: a burst for the `report_fixture` server.
pub fn refund_burst(calls: usize) -> Vec<u8> {
    let mut out = String::from(
        "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"burst\",\"version\":\"1\"}}}\n\
         {\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n",
    );
    for id in 1..=calls {
        out.push_str(&format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"issue_refund\",\"arguments\":{{\"amount_cents\":{id}}}}}}}\n"
        ));
    }
    out.into_bytes()
}
