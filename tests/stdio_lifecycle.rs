//! The wrapped server's fate is the wrapper's fate (DESIGN §2 invariants 6–7, §9 pitfalls):
//! exit codes, signal forwarding, shutdown on client EOF, no orphan, the last response drained,
//! EPIPE, the death signal, and the kill switch, through the real binary over real pipes.

mod stdio_support;

use std::io::{BufReader, Read, Write};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use stdio_support::*;

fn signal(pid: u32, sig: Signal) {
    kill(Pid::from_raw(pid as i32), sig).expect("signal the wrapper");
}

/// `cmd` with SIGHUP, SIGINT and SIGTERM at their default actions. Run under `nohup` or as a
/// background job of a non-interactive shell, the tests inherit SIGHUP and SIGINT ignored, which
/// the wrapper rightly keeps ignored for itself and its server
/// (`ignored_sighup_stays_ignored_for_wrapper_and_server`); a test of forwarding needs them
/// caught, or it would wait forever for a signal nobody handles.
fn with_default_signals(mut cmd: std::process::Command) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the forked child before exec, where only async-signal-safe calls are
    // allowed: signal(2) is one, takes no pointer, and touches nothing shared with the parent's
    // other threads.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    cmd
}

#[test]
fn child_exit_code_is_propagated() {
    for code in [0, 3, 77] {
        let r = run(wrap_fixture(&[], &["exit", &code.to_string()]), b"");
        assert_eq!(r.code(), Some(code), "stderr: {}", r.stderr);
        assert!(r.stdout.is_empty());
    }
}

#[test]
fn child_killed_by_signal_exits_128_plus_signal() {
    for (sig, code) in [(9, 137), (15, 143)] {
        let r = run(wrap_fixture(&[], &["kill-self", &sig.to_string()]), b"");
        assert_eq!(r.code(), Some(code), "signal {sig}; stderr: {}", r.stderr);
    }
}

#[test]
fn command_not_found_exits_127_with_message() {
    let r = run(
        wrapper_cmd(&[], &["/nonexistent/definitely-not-a-server".as_ref()]),
        b"",
    );
    assert_eq!(r.code(), Some(127), "stderr: {}", r.stderr);
    assert!(r.stdout.is_empty());
    assert!(
        r.stderr.contains(
            "[observe-mcp] error: command not found: /nonexistent/definitely-not-a-server"
        ),
        "stderr: {}",
        r.stderr
    );
    let r = run(
        wrapper_cmd(&[], &["definitely-not-a-server-on-path".as_ref()]),
        b"",
    );
    assert_eq!(r.code(), Some(127), "stderr: {}", r.stderr);
}

#[test]
fn not_executable_exits_126_with_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("server.sh");
    std::fs::write(&file, "#!/bin/sh\necho hi\n").expect("write");
    // A file without the execute bit, and a directory.
    for target in [file.as_path(), dir.path()] {
        let r = run(wrapper_cmd(&[], &[target.as_os_str()]), b"");
        assert_eq!(r.code(), Some(126), "{target:?}; stderr: {}", r.stderr);
        assert!(
            r.stderr.contains("[observe-mcp] error: cannot execute"),
            "stderr: {}",
            r.stderr
        );
        assert!(r.stdout.is_empty());
    }
}

#[test]
fn signals_to_the_wrapper_are_forwarded_to_the_child() {
    for (sig, num) in [
        (Signal::SIGTERM, 15),
        (Signal::SIGINT, 2),
        (Signal::SIGHUP, 1),
    ] {
        let mut child = with_default_signals(wrap_fixture(&[], &["trap", &num.to_string(), "42"]))
            .spawn()
            .expect("spawn");
        let err = drain_stderr(child.stderr.take().expect("stderr"));
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let ready = read_line(&mut out);
        assert!(ready.starts_with("ready"), "{ready:?}");
        signal(child.id(), sig);
        // The child traps the signal, reports it through the relay and exits 42.
        let got = read_line(&mut out);
        assert_eq!(got, format!("got {num}\n"), "{sig}");
        let status = wait_for(&mut child, WAIT);
        assert_eq!(status.code(), Some(42), "{sig}; stderr: {}", err.text());
    }
}

#[test]
fn ignored_sighup_stays_ignored_for_wrapper_and_server() {
    // Under `nohup` SIGHUP is ignored: the wrapper must neither catch it nor forward it, and
    // the server inherits "ignored" as it would unwrapped.
    let fx = fixture();
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg("trap '' HUP; exec \"$0\" -- \"$1\" pids")
        .arg(wrapper_bin())
        .arg(&fx);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("BOUNDED_") {
            cmd.env_remove(&k);
        }
    }
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let err = drain_stderr(child.stderr.take().expect("stderr"));
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let line = read_line(&mut out);
    assert_eq!(field(&line, "ppid"), child.id(), "sh exec'd the wrapper");
    signal(child.id(), Signal::SIGHUP);
    // Give a wrongly forwarded SIGHUP time to land before checking both are still alive.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"still here\n").expect("write");
    assert_eq!(read_line(&mut out), "still here\n");
    drop(stdin);
    let status = wait_for(&mut child, WAIT);
    assert_eq!(status.code(), Some(0), "stderr: {}", err.text());
}

#[test]
fn sigterm_to_wrapper_ends_a_default_child_with_143() {
    let mut child = wrap_fixture(&[], &["pids"]).spawn().expect("spawn");
    let err = drain_stderr(child.stderr.take().expect("stderr"));
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let line = read_line(&mut out);
    let pid = field(&line, "pid");
    // The child runs in its own process group, led by itself.
    assert_eq!(field(&line, "pgid"), pid);
    assert_eq!(field(&line, "ppid"), child.id());
    signal(child.id(), Signal::SIGTERM);
    let status = wait_for(&mut child, WAIT);
    assert_eq!(status.code(), Some(143), "stderr: {}", err.text());
    assert!(wait_not_running(pid, WAIT), "child {pid} still running");
}

#[test]
fn client_eof_with_server_ignoring_eof_terminates_it_after_grace() {
    let mut child = wrap_fixture(&[], &["ignore-eof"]).spawn().expect("spawn");
    let err = drain_stderr(child.stderr.take().expect("stderr"));
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let pid = field(&read_line(&mut out), "pid");
    drop(child.stdin.take());
    let status = wait_for(&mut child, WAIT);
    let stderr = err.text();
    // Closed stdin, waited, then SIGTERM to the group: the fixture dies of it.
    assert_eq!(status.code(), Some(143), "stderr: {stderr}");
    assert!(stderr.contains("sending SIGTERM"), "stderr: {stderr}");
    // No orphan: the wrapper reaped its child before exiting, so the pid is gone (at most a
    // zombie some other init must reap, which would mean we did not).
    assert_eq!(proc_state(pid), None, "child {pid} left behind");
}

#[test]
fn server_ignoring_sigterm_is_killed_after_second_grace() {
    let mut child = wrap_fixture(&[], &["ignore-term"]).spawn().expect("spawn");
    let err = drain_stderr(child.stderr.take().expect("stderr"));
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let pid = field(&read_line(&mut out), "pid");
    drop(child.stdin.take());
    let status = wait_for(&mut child, WAIT);
    let stderr = err.text();
    assert_eq!(status.code(), Some(137), "stderr: {stderr}");
    assert!(stderr.contains("sending SIGKILL"), "stderr: {stderr}");
    assert_eq!(proc_state(pid), None, "child {pid} left behind");
}

#[test]
fn grandchild_ignoring_eof_is_terminated_with_the_group() {
    // The child does not read stdin; its grandchild does and ignores EOF: both are in the
    // child's process group and both must go (an `npx`/shell-wrapper server).
    let mut child = wrap_fixture(&[], &["grandchild", "ignore-eof"])
        .spawn()
        .expect("spawn");
    let err = drain_stderr(child.stderr.take().expect("stderr"));
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut pids = Vec::new();
    for _ in 0..2 {
        let line = read_line(&mut out);
        if line.starts_with("child=") {
            pids.push(field(&line, "child"));
            pids.push(field(&line, "grandchild"));
        }
    }
    assert_eq!(pids.len(), 2, "pid line missing");
    drop(child.stdin.take());
    let status = wait_for(&mut child, WAIT);
    // Checked before reading stderr: a leaked process would hold the inherited stderr open.
    assert_all_gone(&pids);
    let stderr = err.text();
    assert_eq!(status.code(), Some(143), "stderr: {stderr}");
}

#[test]
fn background_grandchild_does_not_outlive_the_session() {
    let mut child = wrap_fixture(&[], &["background"]).spawn().expect("spawn");
    let err = drain_stderr(child.stderr.take().expect("stderr"));
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let line = read_line(&mut out);
    let grandchild = field(&line, "grandchild");
    drop(child.stdin.take());
    let status = wait_for(&mut child, WAIT);
    assert_all_gone(&[grandchild]);
    assert_eq!(status.code(), Some(0), "stderr: {}", err.text());
}

#[test]
fn descendant_holding_stdout_does_not_keep_the_wrapper_alive() {
    // The child exits at once; its grandchild keeps the stdout pipe open and sleeps.
    let mut child = wrap_fixture(&[], &["hold-stdout"]).spawn().expect("spawn");
    let err = drain_stderr(child.stderr.take().expect("stderr"));
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let line = read_line(&mut out);
    let grandchild = field(&line, "grandchild");
    let status = wait_for(&mut child, WAIT);
    assert_all_gone(&[grandchild]);
    let stderr = err.text();
    assert_eq!(
        status.code(),
        Some(0),
        "the child's own code; stderr: {stderr}"
    );
}

#[test]
fn last_one_mb_response_before_server_exit_arrives_whole() {
    // §9: exiting when the child exits instead of at stdout EOF loses the tail of the pipe.
    const MB: usize = 1024 * 1024;
    for round in 0..10 {
        let r = run_with(
            wrap_fixture(&[], &["final-response", &MB.to_string()]),
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\"}\n".to_vec(),
            Vec::new(),
            true,
        );
        assert_eq!(r.code(), Some(0), "round {round}; stderr: {}", r.stderr);
        assert_eq!(r.stdout.len(), MB, "round {round}: response truncated");
        assert_eq!(r.stdout.last(), Some(&b'\n'));
        assert!(r.stdout[..MB - 1].iter().all(|&b| b == b'x'));
    }
}

#[test]
fn final_response_survives_a_client_that_reads_late() {
    // The client reads nothing until well after the server has exited, so most of the response
    // sits in pipes when the child is gone: only a wrapper that drains to EOF delivers it. (The
    // pause provokes the race; nothing here depends on how long anything takes.)
    // Less than the pipes and the relay buffer hold (3 × 64 KiB), so the server can finish.
    const SIZE: usize = 100_000;
    for round in 0..3 {
        let mut child = wrap_fixture(&[], &["final-response", &SIZE.to_string()])
            .spawn()
            .expect("spawn");
        let err = drain_stderr(child.stderr.take().expect("stderr"));
        let mut stdout = child.stdout.take().expect("stdout");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"{\"id\":1}\n").expect("request");
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let mut got = Vec::new();
        stdout.read_to_end(&mut got).expect("read");
        let status = wait_for(&mut child, WAIT);
        drop(stdin);
        assert_eq!(status.code(), Some(0), "stderr: {}", err.text());
        assert_eq!(got.len(), SIZE, "round {round}: response truncated");
    }
}

#[test]
fn end_cause_distinguishes_server_exit_from_client_close() {
    // Child exits while the client is still connected: the transport failed.
    let r = run_with(
        wrap_fixture(&["--debug"], &["exit", "0"]),
        Vec::new(),
        Vec::new(),
        true,
    );
    assert!(
        r.stderr.contains("end_cause=Transport"),
        "stderr: {}",
        r.stderr
    );
    // Client closes first, child exits on EOF: a normal end of session.
    let r = run(wrap_fixture(&["--debug"], &["cat"]), b"x\n");
    assert!(
        r.stderr.contains("end_cause=SessionEnd"),
        "stderr: {}",
        r.stderr
    );
}

#[test]
fn client_gone_epipe_shuts_the_child_down_without_a_crash() {
    let mut child = wrap_fixture(&[], &["flood"]).spawn().expect("spawn");
    let err = drain_stderr(child.stderr.take().expect("stderr"));
    let mut out = child.stdout.take().expect("stdout");
    let mut buf = [0u8; 4096];
    out.read_exact(&mut buf).expect("some output first");
    // The client stops reading: our stdout breaks while our stdin stays open.
    drop(out);
    let status = wait_for(&mut child, WAIT);
    let stderr = err.text();
    // The child sees the broken pipe itself and exits 141 (the fixture's EPIPE code).
    assert_eq!(status.code(), Some(141), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    drop(child.stdin.take());
}

#[test]
fn server_closing_its_stdin_does_not_block_the_client() {
    // The server stops reading (closes stdin) but keeps running. The client's writes must not
    // pile up behind a pipe nobody drains: a single-threaded client blocked on a write could
    // never read the server's answers.
    let mut child = wrap_fixture(&[], &["close-stdin"]).spawn().expect("spawn");
    let err = drain_stderr(child.stderr.take().expect("stderr"));
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    assert_eq!(read_line(&mut out), "closed\n");
    let mut stdin = child.stdin.take().expect("stdin");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let writer = std::thread::spawn(move || {
        // Far more than the pipes between client and server can hold.
        let chunk = vec![b'z'; 64 * 1024];
        let result = (0..64).try_for_each(|_| stdin.write_all(&chunk));
        let _ = done_tx.send(result.map_err(|e| e.to_string()));
        stdin
    });
    let result = done_rx.recv_timeout(WAIT);
    if result.is_err() {
        let _ = child.kill();
    }
    // Every write accepted: not blocked, and not refused (EPIPE) by a wrapper that gave up.
    assert_eq!(
        result,
        Ok(Ok(())),
        "client writes after the server closed its stdin"
    );
    // The writes went through because the wrapper drains, not because it gave up: the session
    // (and the server) are still alive while the client is connected.
    let early_exit = child.try_wait().expect("try_wait");
    assert!(
        early_exit.is_none(),
        "wrapper ended the session early: {early_exit:?}"
    );
    drop(writer.join().expect("writer"));
    let status = wait_for(&mut child, WAIT);
    // Client EOF, grace, SIGTERM: the server that ignored everything dies of it.
    assert_eq!(status.code(), Some(143), "stderr: {}", err.text());
}

#[test]
fn wrapper_sigkilled_leaves_no_child_behind() {
    // The wrapper cannot clean up after SIGKILL: the child's PR_SET_PDEATHSIG kills it, and the
    // grandchild (which reads stdin, like a server started by npx) sees stdin EOF and exits.
    let mut child = wrap_fixture(&[], &["grandchild", "cat"])
        .spawn()
        .expect("spawn");
    let err = drain_stderr(child.stderr.take().expect("stderr"));
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let line = read_line(&mut out);
    let pids = [field(&line, "child"), field(&line, "grandchild")];
    signal(child.id(), Signal::SIGKILL);
    let status = wait_for(&mut child, WAIT);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    drop(err);
    assert_all_gone(&pids);
}

#[test]
fn kill_switch_execs_the_server_in_place() {
    let mut cmd = wrap_fixture(&[], &["pids"]);
    cmd.env("BOUNDED_OBSERVE_MCP_DISABLED", "1");
    let mut child = cmd.spawn().expect("spawn");
    let err = drain_stderr(child.stderr.take().expect("stderr"));
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let line = read_line(&mut out);
    // Same pid as the process we started: the wrapper became the server (exec, not spawn).
    assert_eq!(field(&line, "pid"), child.id(), "{line:?}");
    assert_eq!(field(&line, "ppid"), std::process::id(), "{line:?}");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"echo\n").expect("write");
    drop(stdin);
    let mut rest = Vec::new();
    out.read_to_end(&mut rest).expect("read");
    assert_eq!(rest, b"echo\n");
    let status = wait_for(&mut child, WAIT);
    assert_eq!(status.code(), Some(0));
    // No observation at all: not even the missing-token warning.
    assert_eq!(err.text(), "");
}

#[test]
fn kill_switch_reports_a_missing_command_with_127() {
    let mut cmd = wrapper_cmd(&[], &["/nonexistent/server".as_ref()]);
    cmd.env("BOUNDED_OBSERVE_MCP_DISABLED", "1");
    let r = run(cmd, b"");
    assert_eq!(r.code(), Some(127));
    assert!(
        r.stderr
            .contains("[observe-mcp] error: command not found: /nonexistent/server"),
        "stderr: {}",
        r.stderr
    );
}

/// `(comm, nice, policy)` of each thread of `pid`, from /proc/<pid>/task/*/stat.
fn thread_priorities(pid: u32) -> Vec<(String, i64, i64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("task dir")
        .flatten()
    {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (comm, f) = stat_fields(&stat).expect("stat has (comm)");
        // Nice is field 19, policy field 41.
        let num = |n: usize| f[n - 3].parse::<i64>().expect("number");
        out.push((comm.to_string(), num(19), num(41)));
    }
    out
}

/// The observer's threads run in the batch class nine nice levels below the wrapper, the file
/// sink's writer among them, and the relay's at the wrapper's. The writer starts from the
/// observer's thread, already lowered: lowered again relative to that, it ran eighteen levels
/// down, and the observer outran the writes it waits for.
#[test]
fn the_observers_threads_run_nine_levels_below_the_wrapper_and_no_further() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = dir.path().join("events.jsonl");
    let ingest = format!("file:{}", events.display());
    let server = example("report_fixture");
    let mut child = wrapper_cmd(&["--ingest", &ingest], &[server.as_os_str()])
        .spawn()
        .expect("spawn wrapper");
    let pid = child.id();
    let mut stdin = child.stdin.take().expect("stdin");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let err = drain_stderr(child.stderr.take().expect("stderr"));
    // A full batch (500 events) goes to the file at once: the writer thread then exists.
    let calls = 600;
    let input = refund_burst(calls);
    let writer = std::thread::spawn(move || {
        stdin.write_all(&input).expect("write calls");
        stdin
    });
    for _ in 0..=calls {
        read_line(&mut out);
    }
    let stdin = writer.join().expect("writer");
    let deadline = std::time::Instant::now() + WAIT;
    while std::fs::metadata(&events).map_or(true, |m| m.len() == 0) {
        assert!(std::time::Instant::now() < deadline, "no batch written");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let threads = thread_priorities(pid);
    drop(stdin);
    let status = wait_for(&mut child, WAIT);
    assert!(status.success(), "stderr: {}", err.text());

    let wrapper = threads
        .iter()
        .find(|t| !t.0.starts_with("observe-mcp"))
        .map(|t| t.1)
        .expect("the wrapper's own thread");
    let observer: Vec<_> = threads.iter().filter(|t| t.0 == "observe-mcp").collect();
    assert!(
        observer.len() >= 2,
        "the observer's thread and the sink's writer: {threads:?}"
    );
    let level = (wrapper + 9).min(19);
    for t in &observer {
        assert_eq!(
            (t.1, t.2),
            (level, 3),
            "SCHED_BATCH at nice {level}: {threads:?}"
        );
    }
    for relay in ["observe-mcp-c2s", "observe-mcp-s2c"] {
        let t = threads.iter().find(|t| t.0 == relay).expect(relay);
        assert_eq!(t.1, wrapper, "{threads:?}");
    }
}
