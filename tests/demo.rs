//! `bounded-observe-mcp demo` end to end: the real binary starts an in-process ingest, wraps its
//! bundled server with itself, drives a session and reads the evidence back.

use std::process::Command;

#[test]
fn demo_lands_events_captures_amount_and_leaks_no_pii() {
    let out = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .arg("demo")
        .env_remove("BOUNDED_OBSERVE_MCP_DISABLED")
        .env_remove("BOUNDED_SENSOR_TOKEN")
        .output()
        .expect("demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("Evidence (6 events"), "{stdout}");
    // A code in `reason` is captured by default; prose is captured only in the session run with
    // `--capture-text reason`, and there not when it holds a phone number.
    assert!(stdout.contains(r#"reason="duplicate_charge""#), "{stdout}");
    assert_eq!(
        stdout.matches(r#"reason="damaged in transit""#).count(),
        1,
        "{stdout}"
    );
    assert!(stdout.contains("--capture-text reason"), "{stdout}");
    assert!(!stdout.contains("call me on"), "{stdout}");
    assert!(stdout.contains("amount_cents=4900"), "{stdout}");
    assert!(
        stdout.contains(r#""amount_cents":6150"#),
        "rollup sums both refunds: {stdout}"
    );
    assert!(
        stdout.contains("void_payment") && stdout.contains("error  500"),
        "{stdout}"
    );
    assert!(
        stdout.contains("customer_email   never left the process"),
        "{stdout}"
    );
    assert!(
        stdout.contains("card_number      never left the process"),
        "{stdout}"
    );
    for pii in [
        "jane.doe@example.com",
        "4242 4242 4242 4242",
        "+44 20 7946 0958",
    ] {
        assert!(!stdout.contains(pii), "{pii} printed by the demo");
        assert!(!stderr.contains(pii), "{pii} on stderr");
    }
}

/// `demo --keep` leaves its ingest serving the live view: it prints the URL and a one-time
/// sign-in link that opens a session once, and stops cleanly on SIGTERM.
#[test]
fn demo_keep_serves_the_live_view_with_a_one_time_link() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let mut child = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .args(["demo", "--keep"])
        .env_remove("BOUNDED_OBSERVE_MCP_DISABLED")
        .env_remove("BOUNDED_SENSOR_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("demo runs");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut url, mut link) = (None, None);
    while url.is_none() || link.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).expect("demo prints the live view");
        if let Some(u) = line.strip_prefix("Live view: ") {
            url = Some(u.trim().to_string());
        }
        if let Some(l) = line.strip_prefix("Sign in once with: ") {
            link = Some(l.trim().to_string());
        }
    }
    let (url, link) = (url.unwrap(), link.unwrap());
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert!(link.starts_with(&format!("{url}ui/link?t=")), "{link}");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client");
        let page = http.get(&url).send().await.expect("page");
        assert_eq!(page.status(), 200);
        let first = http.get(&link).send().await.expect("link");
        assert_eq!(first.status(), 303);
        let cookie = first.headers()["set-cookie"].to_str().unwrap().to_string();
        let cookie = cookie.split(';').next().unwrap().to_string();
        let events = http
            .get(format!("{url}v1/events?org=demo"))
            .header("cookie", &cookie)
            .send()
            .await
            .expect("events");
        assert_eq!(events.status(), 200);
        let v: serde_json::Value = events.json().await.expect("json");
        assert_eq!(v["events"].as_array().map(Vec::len), Some(6), "{v}");
        let again = http.get(&link).send().await.expect("link again");
        assert_eq!(again.status(), 401, "the link works once");
    });

    // Our own child, not yet waited for: its pid is still its own.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal the demo");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0), "stops cleanly on SIGTERM");
}
