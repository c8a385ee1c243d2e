//! What of the sensor's own must never escape it, with the real binary and real processes: no
//! `BOUNDED_*` variable in the wrapped server's environment, in any mode.

use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_bounded-observe-mcp");
/// A well-formed token; its keyId makes the default actor `mcp:k1`.
const TOKEN: &str = "obs1.k1.c2lnbmF0dXJl";

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
