//! What of the sensor's own must never escape it, and a setting that must never silence it, with
//! the real binary and real processes: no `BOUNDED_*` variable in the wrapped server's
//! environment, in any mode; and an `--actor` the schema filter would reject falls back to the
//! default actor instead of dropping every event.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_bounded-observe-mcp");
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
    let dir = tempfile::tempdir().expect("tempdir");
    let events_path = dir.path().join("events.jsonl");
    let mut cmd = wrapper();
    cmd.arg("--ingest")
        .arg(format!("file:{}", events_path.display()))
        .args(["--token", TOKEN, "--flush-ms", "50"])
        .args(["--actor", "agent\tseven"])
        .args(["--", "sh", "-c", ONE_CALL_SERVER]);
    let out = run_with_input(cmd, &format!("{ONE_CALL}\n"));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        text(&out.stdout).contains(r#""id":1,"result""#),
        "the call was answered"
    );

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

    let file = std::fs::read_to_string(&events_path).unwrap_or_default();
    let events: Vec<Value> = file
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|b| b["events"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(
        events.len(),
        1,
        "the call's event was not dropped: {file:?}"
    );
    assert_eq!(events[0]["actor"]["id"], DEFAULT_ACTOR);
    assert_eq!(events[0]["status"], 200);
}
