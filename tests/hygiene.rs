//! What of the sensor's own must never escape it, and a setting that must never silence it, with
//! the real binaries and real processes: no `BOUNDED_*` variable in the wrapped server's
//! environment in any mode; no secret of the upstream or ingest URL on stderr, even with
//! `--debug`; one warning for a clear-text ingest off loopback; and an `--actor` the schema
//! filter would reject falls back to the default actor instead of dropping every event.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_bounded-observe-mcp");
const INGEST_BIN: &str = env!("CARGO_BIN_EXE_bounded-ingest");
/// Upper bound for anything a test waits on: the machine is small and shared.
const WAIT: Duration = Duration::from_secs(60);
/// A well-formed token; its keyId makes the default actor `mcp:k1`.
const TOKEN: &str = "obs1.k1.c2lnbmF0dXJl";
const DEFAULT_ACTOR: &str = "mcp:k1";
/// A stdio server that answers one `tools/call` (id 1) and then reads until its stdin closes.
const ONE_CALL_SERVER: &str = r#"read line; printf '%s\n' '{"jsonrpc":"2.0","id":1,"result":{"content":[]}}'; cat >/dev/null"#;
const ONE_CALL: &str =
    r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"lookup","arguments":{}}}"#;

/// The wrapper with no `BOUNDED_*` variable from the outer environment.
fn wrapper() -> Command {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("BOUNDED_") {
            cmd.env_remove(&k);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs `cmd` with `input` on its stdin (then closed) and returns what it produced.
fn run_with_input(mut cmd: Command, input: &str) -> Output {
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn wrapper");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.as_bytes()).expect("write request");
    drop(stdin);
    child.wait_with_output().expect("wrapper output")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A loopback port nobody listens on: a dead ingest or upstream, no network needed.
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn example(name: &str) -> PathBuf {
    let path = Path::new(BIN)
        .parent()
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --examples` first",
        path.display()
    );
    path
}

#[test]
fn bounded_variables_never_reach_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file_ingest = format!("file:{}", dir.path().join("events.jsonl").display());
    let http_ingest = format!("http://127.0.0.1:{}", dead_port());
    let modes: [(&str, Vec<(&str, &str)>); 3] = [
        (
            "observed",
            vec![
                ("BOUNDED_SENSOR_TOKEN", TOKEN),
                ("BOUNDED_INGEST_BASE", &file_ingest),
                ("BOUNDED_DEBUG", "1"),
            ],
        ),
        (
            "unobserved",
            vec![
                ("BOUNDED_SENSOR_TOKEN", "not-a-token"),
                ("BOUNDED_INGEST_BASE", &http_ingest),
            ],
        ),
        (
            "kill switch",
            vec![
                ("BOUNDED_SENSOR_TOKEN", TOKEN),
                ("BOUNDED_INGEST_BASE", &http_ingest),
                ("BOUNDED_OBSERVE_MCP_DISABLED", "1"),
            ],
        ),
    ];
    for (mode, env) in modes {
        let mut cmd = wrapper();
        cmd.envs(env)
            .env("BOUNDED_FOO", "bar")
            .env("OTEL_SERVICE_NAME", "svc-under-test")
            .args(["--", "env"]);
        let out = cmd.output().expect("wrapper runs");
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{mode}: {stderr}");
        let ours: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with("BOUNDED_"))
            .collect();
        assert!(ours.is_empty(), "{mode}: the server saw {ours:?}");
        assert!(
            stdout
                .lines()
                .any(|l| l == "OTEL_SERVICE_NAME=svc-under-test"),
            "{mode}: OTEL_* reaches the server unchanged: {stdout}"
        );
        // Each mode really took its own path.
        match mode {
            "observed" => assert!(stderr.contains("Observer totals"), "{mode}: {stderr}"),
            "unobserved" => assert!(
                stderr.contains("BOUNDED_SENSOR_TOKEN") && !stderr.contains("Observer totals"),
                "{mode}: {stderr}"
            ),
            _ => assert!(stderr.is_empty(), "{mode}: exec prints nothing: {stderr}"),
        }
    }
}

#[test]
fn invalid_actor_warns_once_and_events_keep_the_default_actor() {
    let (stderr, events) = one_observed_call(&["--token", TOKEN, "--actor", "agent\tseven"]);
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("actor")).collect();
    assert_eq!(warnings.len(), 1, "one warning about the actor: {stderr}");
    assert!(
        warnings[0].contains("--actor") && warnings[0].contains(DEFAULT_ACTOR),
        "names the flag and the actor used instead: {stderr}"
    );
    assert!(
        !stderr.contains('\t'),
        "the bad value is not echoed: {stderr}"
    );
    assert_eq!(events[0]["actor"]["id"], DEFAULT_ACTOR);
}

/// A key id with a Luhn-valid run of 13 digits (0801084356246), as an ingest that did not redraw
/// such ids could mint: its default actor would fail the filter on every event.
#[test]
fn a_key_id_that_reads_as_a_card_number_warns_and_events_still_land() {
    let token = "obs1.k_0801084356246c5c60f6.c2lnbmF0dXJl";
    let (stderr, events) = one_observed_call(&["--token", token]);
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("keyId")).collect();
    assert_eq!(warnings.len(), 1, "one warning about the key id: {stderr}");
    assert!(
        warnings[0].contains("--actor") && warnings[0].contains("mcp:unknown"),
        "says what to do and which actor is used: {stderr}"
    );
    assert!(
        !stderr.contains("schema filter"),
        "no event was filtered: {stderr}"
    );
    assert_eq!(events[0]["actor"]["id"], "mcp:unknown");
}

/// One `tools/call` through the observed wrapper (file sink) with `args`: its stderr and the
/// events written, after checking the call was answered and its one event written.
fn one_observed_call(args: &[&str]) -> (String, Vec<Value>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let events_path = dir.path().join("events.jsonl");
    let mut cmd = wrapper();
    cmd.arg("--ingest")
        .arg(format!("file:{}", events_path.display()))
        .args(["--flush-ms", "50"])
        .args(args)
        .args(["--", "sh", "-c", ONE_CALL_SERVER]);
    let out = run_with_input(cmd, &format!("{ONE_CALL}\n"));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        text(&out.stdout).contains(r#""id":1,"result""#),
        "the call was answered"
    );
    let file = std::fs::read_to_string(&events_path).unwrap_or_default();
    let events: Vec<Value> = file
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|b| b["events"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(
        events.len(),
        1,
        "the call's event was not dropped: {file:?} {stderr}"
    );
    assert_eq!(events[0]["status"], 200);
    (stderr, events)
}

/// A process whose stderr is collected line by line while it runs.
struct Watched {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Watched {
    fn start(mut cmd: Command) -> Watched {
        let mut child = cmd.spawn().expect("spawn");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe: ChildStderr = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(pipe);
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 {
                sink.lock().expect("lock").push_str(&line);
                line.clear();
            }
        });
        Watched { child, stderr }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }

    /// Waits until stderr contains `needle`; returns stderr.
    fn wait_for(&self, needle: &str) -> String {
        let start = Instant::now();
        loop {
            let s = self.stderr();
            if s.contains(needle) {
                return s;
            }
            assert!(start.elapsed() < WAIT, "no {needle:?} on stderr: {s}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The proxy's port, from its `listening http://127.0.0.1:<port> → …` line.
    fn port(&self) -> u16 {
        let s = self.wait_for(" → ");
        let rest = s
            .split("listening http://127.0.0.1:")
            .nth(1)
            .expect("listening line");
        rest.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .expect("port")
    }

    /// SIGTERM, then the whole of stderr once the process is gone.
    fn stop(mut self) -> String {
        // SAFETY: kill(2) with a pid we spawned and have not reaped, and a plain signal number.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let start = Instant::now();
        while self.child.try_wait().expect("try_wait").is_none() {
            if start.elapsed() > WAIT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("process did not stop on SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The reader thread sees EOF right after the exit.
        std::thread::sleep(Duration::from_millis(100));
        self.stderr()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `tools/call` POSTed to the proxy; returns the status line and body.
fn post_call(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to proxy");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{ONE_CALL}",
        ONE_CALL.len()
    );
    s.write_all(req.as_bytes()).expect("send");
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp
}

fn proxy(upstream: &str, ingest: &str) -> Watched {
    let mut cmd = wrapper();
    cmd.args(["--http", "--upstream", upstream, "--ingest", ingest])
        .args(["--token", TOKEN, "--debug", "--flush-ms", "50"])
        .args(["--shutdown-flush-ms", "500"]);
    Watched::start(cmd)
}

#[test]
fn url_secrets_never_reach_stderr() {
    let ingest = format!("http://127.0.0.1:{}/?token=SECRETCANARY2", dead_port());

    // HTTP mode, a live upstream: the listening line, --debug lines, the failed delivery.
    let mut fixture = Command::new(example("http_fixture_server"))
        .arg("raw")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn upstream fixture");
    let mut line = String::new();
    BufReader::new(fixture.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("fixture prints its URL");
    let base = line
        .trim()
        .strip_prefix("listening ")
        .expect("fixture URL")
        .to_string();
    let live = proxy(&format!("{base}?api_key=SECRETCANARY"), &ingest);
    let resp = post_call(live.port());
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    live.wait_for("Event delivery failed");
    let live_err = live.stop();
    let _ = fixture.kill();
    let _ = fixture.wait();
    assert!(
        live_err.contains(&format!("→ {base}?<redacted>")),
        "the listening line names the upstream, redacted: {live_err}"
    );
    assert!(
        live_err.contains("/?<redacted>"),
        "the delivery warning names the ingest, redacted: {live_err}"
    );

    // HTTP mode, a dead upstream: the 502 warning names it.
    let dead = proxy(
        &format!("http://127.0.0.1:{}/mcp?api_key=SECRETCANARY", dead_port()),
        &ingest,
    );
    let resp = post_call(dead.port());
    assert!(resp.starts_with("HTTP/1.1 502"), "{resp}");
    dead.wait_for("Upstream unreachable");
    let dead_err = dead.stop();

    // Stdio mode: the ingest in the delivery warning and --debug lines. The warning comes once
    // the retry has failed too, after its back-off: a shutdown flush of 500 ms sometimes ended
    // first (the batch then counts as abandoned, with no warning to check).
    let mut cmd = wrapper();
    cmd.args(["--ingest", &ingest, "--token", TOKEN, "--debug"])
        .args(["--flush-ms", "50", "--shutdown-flush-ms", "5000"])
        .args(["--", "sh", "-c", ONE_CALL_SERVER]);
    let out = run_with_input(cmd, &format!("{ONE_CALL}\n"));
    let stdio_err = text(&out.stderr);
    assert!(
        stdio_err.contains("Event delivery failed"),
        "the ingest site was reached: {stdio_err}"
    );

    // An unusable ingest value is echoed in its warning.
    let mut cmd = wrapper();
    cmd.args(["--ingest", "ftp://u:SECRETCANARY3@h/?k=SECRETCANARY4"])
        .args(["--token", TOKEN, "--", "true"]);
    let bad_err = text(&cmd.output().expect("runs").stderr);
    assert!(bad_err.contains("<redacted>"), "{bad_err}");

    // `bounded-ingest mint --ingest …`: its error names the ingest.
    let out = Command::new(INGEST_BIN)
        .args(["mint", "--org", "acme", "--ingest"])
        .arg(format!(
            "http://u:SECRETCANARY5@127.0.0.1:{}/?k=SECRETCANARY6",
            dead_port()
        ))
        .env("BOUNDED_INGEST_ADMIN_SECRET", "admin-secret-for-test")
        .stdin(Stdio::null())
        .output()
        .expect("bounded-ingest runs");
    assert_eq!(out.status.code(), Some(1));
    let mint_err = text(&out.stderr);
    assert!(mint_err.contains("127.0.0.1"), "{mint_err}");

    for (what, err) in [
        ("live upstream", &live_err),
        ("dead upstream", &dead_err),
        ("stdio", &stdio_err),
        ("bad ingest", &bad_err),
        ("mint", &mint_err),
    ] {
        assert!(
            !err.contains("SECRETCANARY"),
            "{what}: a secret on stderr: {err}"
        );
    }
}

#[test]
fn clear_text_ingest_off_loopback_warns_once() {
    let warned = |ingest: &str| -> usize {
        let mut cmd = wrapper();
        cmd.args(["--ingest", ingest, "--token", TOKEN, "--", "true"]);
        let out = cmd.output().expect("runs");
        assert_eq!(out.status.code(), Some(0));
        text(&out.stderr)
            .lines()
            .filter(|l| l.contains("clear text"))
            .count()
    };
    // No call is made, so the dead (unresolvable) ingest is never contacted: no network needed.
    assert_eq!(warned("http://ingest.example.invalid"), 1);
    for quiet in [
        "http://127.0.0.1:7361",
        "http://localhost:7361",
        "http://[::1]:7361",
        "https://ingest.example.invalid",
    ] {
        assert_eq!(warned(quiet), 0, "{quiet}");
    }
}
