//! The reporter against a real loopback ingest that misbehaves in every way the field has seen:
//! 5xx, refused connections, a black hole, 4xx, a revoked key. Each test drives the public
//! reporter API (`report::start_with`) with synthetic events and checks what the ingest
//! received, byte for byte, and what the reporter counted.

mod report_support;

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bounded_observe_mcp::config::{Config, IngestTarget};
use bounded_observe_mcp::event::{Event, EventSink, MAX_BATCH_EVENTS};
use bounded_observe_mcp::report::{
    self, ReportConfig, ReportStats, Tuning, MAX_BATCH_BYTES, QUEUE_CAPACITY,
};
use bounded_observe_mcp::token::SensorToken;
use report_support::*;
use serde_json::{json, Value};

const TOKEN: &str = "obs1.k1.c2lnbmF0dXJl";
/// Generous bound for anything to happen on a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(20);

fn cfg(target: IngestTarget, flush_ms: u64, shutdown_ms: u64) -> ReportConfig {
    ReportConfig {
        target,
        token: Some(SensorToken::parse(TOKEN).expect("token")),
        flush: Duration::from_millis(flush_ms),
        shutdown_flush: Duration::from_millis(shutdown_ms),
        transport: "stdio",
        debug: false,
        ingest_ca: Vec::new(),
        pacer: None,
    }
}

/// [`cfg`] for a `file:` sink at `path`, which needs no token.
fn file_cfg(path: &std::path::Path, flush_ms: u64, shutdown_ms: u64) -> ReportConfig {
    ReportConfig {
        token: None,
        ..cfg(
            IngestTarget::File(path.to_path_buf()),
            flush_ms,
            shutdown_ms,
        )
    }
}

/// Short timeouts so a black hole costs hundreds of milliseconds, not tens of seconds.
fn quick() -> Tuning {
    Tuning {
        connect_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_millis(400),
        retry_delay: Duration::from_millis(20),
        cooldown_min: Duration::from_millis(50),
        cooldown_max: Duration::from_millis(500),
    }
}

/// [`quick`], with a back-off between failing batches long enough to measure: 200 ms, then
/// 400, 800… (each plus up to as much again of jitter), at most 5 s.
fn measured_backoff() -> Tuning {
    Tuning {
        cooldown_min: Duration::from_millis(200),
        cooldown_max: Duration::from_secs(5),
        ..quick()
    }
}

fn emit_n(q: &mut impl EventSink, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let e = event("issue_refund");
            let id = e.id.to_string();
            q.emit(e);
            id
        })
        .collect()
}

/// Every accepted event id, with duplicates kept.
fn accepted_ids(ingest: &TestIngest) -> Vec<String> {
    ingest
        .accepted()
        .iter()
        .flat_map(|r| r.event_ids())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_503_once_then_200_delivers_the_batch_exactly_once() {
    let ingest = TestIngest::start().await;
    ingest.fail_next(&[503]);
    let (mut q, h) =
        report::start_with(cfg(IngestTarget::Http(ingest.base()), 50, 10_000), quick());
    let ids = emit_n(&mut q, 3);
    let stats = h.shutdown().await;

    let reqs = ingest.requests();
    assert_eq!(reqs.len(), 2, "one attempt and one retry");
    assert_eq!(reqs[0].status, 503);
    assert_eq!(
        accepted_ids(&ingest),
        ids,
        "delivered once, in order, no duplicate"
    );
    assert_eq!(stats.delivered, 3);
    assert_eq!(stats.retries, 1);
    assert_eq!(stats.dropped, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_429_once_is_retried_and_delivered() {
    let ingest = TestIngest::start().await;
    ingest.fail_next(&[429]);
    let (mut q, h) =
        report::start_with(cfg(IngestTarget::Http(ingest.base()), 50, 10_000), quick());
    let ids = emit_n(&mut q, 2);
    let stats = h.shutdown().await;
    let statuses: Vec<u16> = ingest.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![429, 200]);
    assert_eq!(accepted_ids(&ingest), ids);
    assert_eq!(stats.retries, 1);
    assert_eq!(stats.dropped, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_always_503_drops_the_batch_after_one_retry_and_reports_it_later() {
    let ingest = TestIngest::start().await;
    ingest.always(Reply::Status(503));
    let (mut q, h) =
        report::start_with(cfg(IngestTarget::Http(ingest.base()), 50, 10_000), quick());
    emit_n(&mut q, 3);
    assert!(
        wait_until(PATIENCE, || h.snapshot().failed_batches == 1).await,
        "batch given up"
    );
    assert_eq!(
        ingest.request_count(),
        2,
        "one attempt plus exactly one retry"
    );

    ingest.always(Reply::Status(200));
    let later = emit_n(&mut q, 2);
    let stats = h.shutdown().await;

    let ok = ingest.accepted();
    assert_eq!(ok.len(), 1);
    assert_eq!(ok[0].event_ids(), later);
    assert_eq!(
        ok[0].dropped(),
        3,
        "the lost batch is reported once the ingest is back"
    );
    assert_eq!(stats.failed, 3);
    assert_eq!(stats.delivered, 2);
    assert_eq!(ingest.request_count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_drop_the_batch_after_one_retry_and_report_it_later() {
    let reserved = closed_port();
    let addr = reserved.local_addr().expect("addr");
    drop(reserved);
    let base = format!("http://{addr}");
    let (mut q, h) = report::start_with(cfg(IngestTarget::Http(base), 50, 10_000), quick());
    assert!(q.reads_events(), "a reporter with a sink reads every event");
    emit_n(&mut q, 3);
    assert!(
        wait_until(PATIENCE, || h.snapshot().failed_batches == 1).await,
        "batch given up"
    );
    let snap = h.snapshot();
    assert_eq!(snap.retries, 1, "one retry on a refused connection");
    assert_eq!(snap.failed, 3);

    // The ingest comes back on the same port.
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.set_reuseaddr(true).expect("reuseaddr");
    sock.bind(addr).expect("rebind the refused port");
    let ingest = TestIngest::on(sock.listen(16).expect("listen"));
    let later = emit_n(&mut q, 2);
    let stats = h.shutdown().await;
    let ok = ingest.accepted();
    assert_eq!(ok.len(), 1);
    assert_eq!(ok[0].event_ids(), later);
    assert_eq!(ok[0].dropped(), 3);
    assert_eq!(stats.dropped, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_hole_ingest_drops_the_batch_after_one_retry_and_reports_it_later() {
    let ingest = TestIngest::start().await;
    ingest.always(Reply::BlackHole);
    let (mut q, h) =
        report::start_with(cfg(IngestTarget::Http(ingest.base()), 50, 10_000), quick());
    emit_n(&mut q, 3);
    assert!(
        wait_until(PATIENCE, || h.snapshot().failed_batches == 1).await,
        "batch given up after the request timeout"
    );
    assert_eq!(h.snapshot().retries, 1);
    assert_eq!(
        ingest.connections(),
        2,
        "one attempt and one retry, no more"
    );
    assert_eq!(ingest.request_count(), 0, "the black hole never answered");

    ingest.always(Reply::Status(200));
    let later = emit_n(&mut q, 2);
    let stats = h.shutdown().await;
    let ok = ingest.accepted();
    assert_eq!(ok.len(), 1);
    assert_eq!(ok[0].event_ids(), later);
    assert_eq!(ok[0].dropped(), 3);
    assert_eq!(stats.delivered, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_hole_ingest_delays_shutdown_by_at_most_the_deadline() {
    let ingest = TestIngest::start().await;
    ingest.always(Reply::BlackHole);
    // Production timeouts (10 s per attempt): only the 1 s shutdown deadline can end this early.
    let (mut q, h) = report::start(cfg(IngestTarget::Http(ingest.base()), 2000, 1000));
    emit_n(&mut q, 3);
    let t = Instant::now();
    let stats = h.shutdown().await;
    let took = t.elapsed();
    // Without the deadline this takes > 20 s (two 10 s attempts); the bound is loose on purpose.
    assert!(took < Duration::from_secs(6), "shutdown took {took:?}");
    assert!(stats.deadline_hit);
    assert_eq!(stats.delivered, 0);
    assert_eq!(stats.dropped, 3);
    assert!(ingest.connections() >= 1, "the batch was attempted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_400_and_413_are_not_retried_and_are_counted() {
    let ingest = TestIngest::start().await;
    ingest.fail_next(&[400, 413]);
    let (mut q, h) =
        report::start_with(cfg(IngestTarget::Http(ingest.base()), 50, 10_000), quick());
    emit_n(&mut q, 3);
    assert!(wait_until(PATIENCE, || h.snapshot().failed_batches == 1).await);
    emit_n(&mut q, 4);
    assert!(wait_until(PATIENCE, || h.snapshot().failed_batches == 2).await);
    let last = emit_n(&mut q, 1);
    let stats = h.shutdown().await;

    let statuses: Vec<u16> = ingest.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![400, 413, 200], "no retry after 400 or 413");
    assert_eq!(stats.retries, 0);
    assert_eq!(stats.failed, 7);
    assert_eq!(stats.failed_batches, 2);
    let ok = ingest.accepted();
    assert_eq!(ok[0].event_ids(), last);
    assert_eq!(ok[0].dropped(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_401_revokes_the_key_and_nothing_more_is_sent() {
    let ingest = TestIngest::start().await;
    ingest.always(Reply::Status(401));
    let (mut q, h) =
        report::start_with(cfg(IngestTarget::Http(ingest.base()), 50, 10_000), quick());
    emit_n(&mut q, 3);
    assert!(wait_until(PATIENCE, || h.snapshot().revoked).await);
    ingest.always(Reply::Status(200));
    emit_n(&mut q, 3);
    assert!(
        wait_until(PATIENCE, || h.snapshot().failed == 6).await,
        "later events are still drained and counted"
    );
    emit_n(&mut q, 2);
    let stats = h.shutdown().await;
    assert_eq!(ingest.request_count(), 1, "no request after the 401");
    assert!(stats.revoked);
    assert_eq!(stats.retries, 0);
    assert_eq!(stats.dropped, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_hundred_events_make_at_least_three_batches_of_at_most_500() {
    let ingest = TestIngest::start().await;
    // A flush interval longer than the test: only the size limit can cut batches.
    let (mut q, h) = report::start_with(
        cfg(IngestTarget::Http(ingest.base()), 600_000, 20_000),
        quick(),
    );
    let ids = emit_n(&mut q, 1200);
    let stats = h.shutdown().await;
    let reqs = ingest.accepted();
    assert!(reqs.len() >= 3, "{} batches", reqs.len());
    for r in &reqs {
        let n = r.event_ids().len();
        assert!(n > 0 && n <= MAX_BATCH_EVENTS, "batch of {n}");
    }
    assert_eq!(accepted_ids(&ingest), ids, "every event once, in order");
    assert_eq!(stats.delivered, 1200);
    assert_eq!(stats.batches as usize, reqs.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_event_session_that_ends_at_once_still_delivers_them() {
    let ingest = TestIngest::start().await;
    let (mut q, h) = report::start(cfg(IngestTarget::Http(ingest.base()), 2000, 2000));
    let ids = emit_n(&mut q, 3);
    drop(q);
    let stats = h.shutdown().await;
    assert_eq!(accepted_ids(&ingest), ids);
    assert_eq!(stats.delivered, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posted_batch_validates_against_the_schema_and_carries_no_org() {
    let ingest = TestIngest::start().await;
    let (mut q, h) = report::start(cfg(IngestTarget::Http(ingest.base()), 2000, 5000));
    let mut e = event("issue_refund");
    e.err = None;
    q.emit(e);
    let mut err = event("charge");
    err.class = bounded_observe_mcp::event::EventClass::Error;
    err.status = 500;
    err.err = Some(bounded_observe_mcp::event::EventErr {
        kind: bounded_observe_mcp::event::ErrKind::Tool,
        code: None,
        fp: None,
    });
    q.emit(err);
    h.shutdown().await;

    let reqs = ingest.requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/v1/events");
    assert_eq!(
        r.authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    assert_eq!(r.content_encoding, None, "bodies are not compressed");
    let body = r.json();
    let validator = batch_validator();
    let errors: Vec<String> = validator
        .iter_errors(&body)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}\n{body}");
    assert_eq!(body["v"], 2);
    assert_eq!(body["sensor"]["transport"], "stdio");
    assert_eq!(body["sensor"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(body["events"].as_array().map(Vec::len), Some(2));
    assert!(!has_key(&body, "org"), "no org anywhere: {body}");
    assert!(body.get("sensor").and_then(|s| s.get("id")).is_none());
    let text = String::from_utf8_lossy(&r.body);
    assert!(
        !text.contains("c2lnbmF0dXJl"),
        "the token never appears in a body"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_or_bad_token_opens_no_socket() {
    let ingest = TestIngest::start().await;
    for argv in [
        vec!["w", "--ingest", &ingest.base(), "--", "srv"],
        vec![
            "w",
            "--ingest",
            &ingest.base(),
            "--token",
            "not-a-token",
            "--",
            "srv",
        ],
    ] {
        let cli = bounded_observe_mcp::cli::parse_argv(
            argv.iter().map(std::ffi::OsString::from).collect(),
        )
        .expect("argv");
        let (c, warnings) = Config::resolve(&cli.args, &Default::default()).expect("resolves");
        assert_eq!(c.ingest, IngestTarget::Off);
        assert_eq!(warnings.len(), 1, "one clear warning: {warnings:?}");
        let (mut q, h) = report::start(ReportConfig {
            target: c.ingest.clone(),
            token: c.token.clone(),
            flush: Duration::from_millis(10),
            shutdown_flush: Duration::from_secs(2),
            transport: "stdio",
            debug: false,
            ingest_ca: Vec::new(),
            pacer: None,
        });
        // A sink beside it (OTLP) takes the events itself and has them counted here.
        assert!(!q.reads_events(), "reporting off reads no event");
        emit_n(&mut q, 600);
        for _ in 0..40 {
            q.count_unread();
        }
        let watch = h.watch();
        assert_eq!(watch.outstanding(), 0, "nothing is left to account for");
        assert_eq!(watch.snapshot().unsent, 640);
        let stats = h.shutdown().await;
        assert_eq!(stats.unsent, 640, "counted, never sent");
        assert_eq!(stats.delivered, 0);
        assert_eq!(stats.dropped, 0, "an unsent event is not a lost one");
    }
    assert_eq!(ingest.connections(), 0, "no socket was ever opened");
}

/// Canaries planted in captured fields, under innocent and PII-shaped keys, top-level and nested.
fn canary_event() -> (Event, Vec<&'static str>) {
    let canaries = vec![
        "jane.canary@example.com",
        "4111 1111 1111 1111",
        "4111-1111-1111-1111",
        "4111111111111111",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnkifQ.c2lnbmF0dXJlY2FuYXJ5",
        "sk_live_CANARYSECRET",
        "hunter2-CANARY-password",
        "CANARY-NESTED-VALUE",
    ];
    let mut e = event("issue_refund");
    let fields = json!({
        "amount_cents": 4900,
        "customer_email": "jane.canary@example.com",
        "reason": "refund for jane.canary@example.com",
        "note": "card 4111 1111 1111 1111",
        "memo": "4111-1111-1111-1111",
        "status": "4111111111111111",
        "currency": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnkifQ.c2lnbmF0dXJlY2FuYXJ5",
        "api_key": "sk_live_CANARYSECRET",
        "password": "hunter2-CANARY-password",
        "session_token": "sk_live_CANARYSECRET",
        "details": {"inner": "CANARY-NESTED-VALUE"},
        "items": ["CANARY-NESTED-VALUE"],
    });
    e.rec.fields = match fields {
        Value::Object(m) => Some(m.into()),
        _ => None,
    };
    (e, canaries)
}

fn assert_no_canary(bytes: &[u8], canaries: &[&str]) {
    let text = String::from_utf8_lossy(bytes);
    assert!(!text.is_empty(), "something was received");
    for c in canaries {
        assert!(!text.contains(c), "canary {c:?} left the process: {text}");
    }
    // The same card number as plain digits must not survive either.
    assert!(!text.contains("4111111111111111"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_values_never_reach_the_ingest() {
    let ingest = TestIngest::start().await;
    let (mut q, h) = report::start(cfg(IngestTarget::Http(ingest.base()), 2000, 5000));
    let (e, canaries) = canary_event();
    q.emit(e);
    let stats = h.shutdown().await;
    assert_eq!(stats.delivered, 1, "the event itself is delivered");
    assert_no_canary(&ingest.all_body_bytes(), &canaries);
    let body = ingest.requests()[0].json();
    assert_eq!(
        body["events"][0]["rec"]["fields"]["amount_cents"], 4900,
        "a safe scalar under an allowed key still arrives"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_values_never_reach_the_file_sink() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("events.jsonl");
    let (mut q, h) = report::start(file_cfg(&path, 2000, 5000));
    let (e, canaries) = canary_event();
    q.emit(e);
    let stats = h.shutdown().await;
    assert_eq!(stats.delivered, 1);
    assert_no_canary(&std::fs::read(&path).expect("file written"), &canaries);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_the_filter_rejects_are_counted_and_never_sent() {
    let ingest = TestIngest::start().await;
    let (mut q, h) = report::start(cfg(IngestTarget::Http(ingest.base()), 2000, 5000));
    let mut bad = event("issue_refund");
    bad.id = "x".into(); // too short for an event id
    bad.dest.path_template = "no-leading-slash".into();
    let good = event("issue_refund");
    let good_id = good.id.to_string();
    q.emit(bad);
    q.emit(good);
    let stats = h.shutdown().await;
    assert_eq!(stats.filtered, 1);
    assert_eq!(stats.delivered, 1);
    let r = &ingest.accepted()[0];
    assert_eq!(r.event_ids(), vec![good_id]);
    assert_eq!(r.dropped(), 1, "a filtered event is reported as dropped");
}

#[test]
fn full_queue_drops_the_newest_events_and_counts_them() {
    // A current-thread runtime: the batcher cannot run while this thread emits, so the queue
    // fills exactly to its capacity.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let ingest = TestIngest::start().await;
        let (mut q, h) = report::start_with(
            cfg(IngestTarget::Http(ingest.base()), 600_000, 60_000),
            quick(),
        );
        let extra = 7;
        let ids = emit_n(&mut q, QUEUE_CAPACITY + extra);
        let stats: ReportStats = h.shutdown().await;
        assert_eq!(stats.queue_full, extra as u64);
        assert_eq!(stats.delivered, QUEUE_CAPACITY as u64);
        assert_eq!(
            accepted_ids(&ingest),
            ids[..QUEUE_CAPACITY].to_vec(),
            "the newest were dropped, the oldest kept"
        );
        assert_eq!(ingest.accepted()[0].dropped(), extra as u64);
    });
}

fn read_lines(path: &PathBuf) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is one JSON batch"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_sink_appends_one_schema_valid_json_line_per_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sub-does-not-matter.jsonl");
    let validator = batch_validator();

    let c = file_cfg(&path, 600_000, 10_000);
    let (mut q, h) = report::start(c.clone());
    let ids = emit_n(&mut q, 1200);
    let stats = h.shutdown().await;
    assert_eq!(stats.delivered, 1200);
    let lines = read_lines(&path);
    assert!(lines.len() >= 3, "{} lines", lines.len());
    let mut seen = Vec::new();
    for l in &lines {
        assert!(validator.is_valid(l), "line fails the schema: {l}");
        assert!(!has_key(l, "org"));
        let evs = l["events"].as_array().expect("events");
        assert!(evs.len() <= MAX_BATCH_EVENTS);
        seen.extend(
            evs.iter()
                .map(|e| e["id"].as_str().expect("id").to_string()),
        );
    }
    assert_eq!(seen, ids);

    // A second session appends; it never truncates.
    let (mut q, h) = report::start(c);
    emit_n(&mut q, 2);
    h.shutdown().await;
    let again = read_lines(&path);
    assert_eq!(again.len(), lines.len() + 1);
    assert_eq!(again[..lines.len()], lines[..]);
    let ids: HashSet<&str> = again
        .iter()
        .flat_map(|l| l["events"].as_array().expect("events").iter())
        .map(|e| e["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids.len(), 1202);
}

/// The queue counts the events waiting for the batcher and wakes a producer waiting on it when
/// the batcher takes some: what the stdio observer paces itself by (`observe::stdio`, at most
/// two batches ahead of the reporter).
#[tokio::test]
async fn the_queue_counts_what_waits_and_says_when_the_batcher_takes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("events.jsonl");
    let (mut q, h) = report::start(file_cfg(&path, 600_000, 10_000));
    let taken = q
        .taken()
        .expect("the reporter's queue says when it takes events");
    // One thread: the batcher cannot run before this test awaits.
    emit_n(&mut q, 2 * MAX_BATCH_EVENTS + 1);
    assert_eq!(q.queued(), 2 * MAX_BATCH_EVENTS + 1);
    tokio::time::timeout(Duration::from_secs(10), taken.notified())
        .await
        .expect("woken when the batcher takes events");
    assert!(q.queued() <= MAX_BATCH_EVENTS + 1, "{} queued", q.queued());
    let deadline = Instant::now() + Duration::from_secs(10);
    while q.queued() > 0 {
        assert!(Instant::now() < deadline, "{} never taken", q.queued());
        tokio::time::timeout(Duration::from_millis(50), taken.notified())
            .await
            .ok();
    }
    let stats = h.shutdown().await;
    assert_eq!(stats.delivered, 2 * MAX_BATCH_EVENTS as u64 + 1);
    assert_eq!(q.queued(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwritable_file_sink_fails_open_and_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A directory cannot be opened for appending.
    let (mut q, h) = report::start(file_cfg(dir.path(), 2000, 2000));
    emit_n(&mut q, 3);
    let stats = h.shutdown().await;
    assert_eq!(stats.delivered, 0);
    assert_eq!(stats.failed, 3);
    assert_eq!(stats.retries, 0, "a local file error is not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_ingest_builds_a_tls_client_and_fails_open_when_unreachable() {
    let reserved = closed_port();
    let addr = reserved.local_addr().expect("addr");
    drop(reserved);
    let (mut q, h) = report::start_with(
        cfg(IngestTarget::Http(format!("https://{addr}")), 50, 5000),
        quick(),
    );
    emit_n(&mut q, 2);
    let stats = h.shutdown().await;
    assert_eq!(stats.delivered, 0);
    assert_eq!(stats.failed, 2);
    assert_eq!(
        stats.retries, 1,
        "a refused TLS connection is a connect error: retried once"
    );
}

#[test]
fn reporter_outside_a_runtime_fails_open() {
    let (mut q, h) = report::start(cfg(IngestTarget::Off, 10, 10));
    emit_n(&mut q, 2);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let stats = rt.block_on(h.shutdown());
    assert_eq!(stats.delivered, 0);
    assert_eq!(stats.dropped, 2, "counted, never a panic");
}

/// An event as wide as capture allows: 32 fields (the most an event keeps) of 128-byte values
/// (the longest kept), under keys `--capture note_00 … note_31` would allow, all of which pass
/// the privacy layers. About 5 KB encoded: 500 of them would be a 2.5 MB body.
fn wide_event() -> Event {
    let mut e = event("issue_refund");
    let value: String = ('a'..='z').cycle().take(128).collect();
    e.rec.fields = Some(
        (0..32)
            .map(|i| (format!("note_{i:02}"), Value::String(value.clone())))
            .collect(),
    );
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_of_wide_events_stay_under_one_mib_and_lose_no_event() {
    let ingest = TestIngest::start().await;
    // A flush interval longer than the test: only the size limits can cut batches.
    let (mut q, h) = report::start_with(
        cfg(IngestTarget::Http(ingest.base()), 600_000, 20_000),
        quick(),
    );
    let n = 1200;
    let mut ids = Vec::new();
    for _ in 0..n {
        let e = wide_event();
        ids.push(e.id.to_string());
        q.emit(e);
    }
    let stats = h.shutdown().await;

    let reqs = ingest.requests();
    let sizes: Vec<usize> = reqs.iter().map(|r| r.body.len()).collect();
    assert!(
        sizes.iter().all(|&b| b <= MAX_BATCH_BYTES),
        "every body within 1 MiB: {sizes:?}"
    );
    assert!(reqs.iter().all(|r| r.status == 200), "none refused");
    for r in &reqs {
        for e in r.json()["events"].as_array().expect("events") {
            assert_eq!(
                e["rec"]["fields"].as_object().map(|f| f.len()),
                Some(32),
                "every captured field arrives"
            );
        }
    }
    assert_eq!(accepted_ids(&ingest), ids, "every event once, in order");
    assert_eq!(stats.delivered, n as u64);
    assert_eq!(stats.dropped, 0);
}

/// The requests of one batch (an attempt and its retry share a body), grouped in order.
fn batches(ingest: &TestIngest) -> Vec<Vec<Instant>> {
    let mut out: Vec<(Vec<u8>, Vec<Instant>)> = Vec::new();
    for r in ingest.requests() {
        match out.last_mut() {
            Some((body, times)) if *body == r.body => times.push(r.at),
            _ => out.push((r.body, vec![r.at])),
        }
    }
    out.into_iter().map(|(_, t)| t).collect()
}

/// From the last request of each batch to the first of the next.
fn gaps(batches: &[Vec<Instant>]) -> Vec<Duration> {
    batches
        .windows(2)
        .map(|w| w[1][0].duration_since(*w[0].last().expect("a request")))
        .collect()
}

async fn retry_after_is_honoured_on(status: u16) {
    let ingest = TestIngest::start().await;
    ingest.reply_next(&[Reply::Throttle(status, "1")]);
    let (mut q, h) =
        report::start_with(cfg(IngestTarget::Http(ingest.base()), 50, 10_000), quick());
    let ids = emit_n(&mut q, 3);
    let stats = h.shutdown().await;

    let reqs = ingest.requests();
    let statuses: Vec<u16> = reqs.iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![status, 200]);
    let waited = reqs[1].at.duration_since(reqs[0].at);
    // The retry delay alone is 20-40 ms: only the header explains a second.
    assert!(
        waited >= Duration::from_secs(1),
        "the retry came {waited:?} after a Retry-After of 1 s"
    );
    assert_eq!(accepted_ids(&ingest), ids);
    assert_eq!(stats.retries, 1);
    assert_eq!(stats.dropped, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_on_503() {
    retry_after_is_honoured_on(503).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_on_429() {
    retry_after_is_honoured_on(429).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_also_spaces_the_next_batch() {
    let ingest = TestIngest::start().await;
    let throttle = Reply::Throttle(503, "1");
    ingest.reply_next(&[throttle, throttle]);
    let (mut q, h) = report::start_with(
        cfg(IngestTarget::Http(ingest.base()), 50, 10_000),
        measured_backoff(),
    );
    emit_n(&mut q, 3);
    assert!(wait_until(PATIENCE, || h.snapshot().failed_batches == 1).await);
    let later = emit_n(&mut q, 2);
    let stats = h.shutdown().await;

    let b = batches(&ingest);
    assert_eq!(b.len(), 2, "{b:?}");
    let gap = gaps(&b)[0];
    // The back-off alone would be 200-400 ms: the ingest asked for a second.
    assert!(gap >= Duration::from_secs(1), "next batch after {gap:?}");
    assert_eq!(accepted_ids(&ingest), later);
    assert_eq!(ingest.accepted()[0].dropped(), 3);
    assert_eq!(stats.delivered, 2);
}

/// Emits `n` events in batches of 500, so that each batch is full and due at once: any space
/// between them is the back-off.
fn emit_full_batches(q: &mut impl EventSink, batches: usize) {
    emit_n(q, batches * MAX_BATCH_EVENTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consecutive_failing_batches_are_spaced_increasingly() {
    let ingest = TestIngest::start().await;
    ingest.always(Reply::Status(503));
    let (mut q, h) = report::start_with(
        cfg(IngestTarget::Http(ingest.base()), 50, 500),
        measured_backoff(),
    );
    emit_full_batches(&mut q, 5);
    assert!(
        wait_until(PATIENCE, || h.snapshot().failed_batches == 4).await,
        "four batches given up"
    );
    let stats = h.shutdown().await;

    let b = batches(&ingest);
    assert!(b.iter().all(|r| r.len() == 2), "attempt and retry: {b:?}");
    let g = gaps(&b);
    // Pause n lies in [200·2ⁿ⁻¹, 400·2ⁿ⁻¹) ms: each at least the doubled floor.
    for (i, floor_ms) in [200u64, 400, 800].into_iter().enumerate() {
        assert!(
            g[i] >= Duration::from_millis(floor_ms),
            "pause {} was {:?}: {g:?}",
            i + 1,
            g[i]
        );
    }
    assert!(g[2] > g[0], "spacing grows: {g:?}");
    // Shutdown came during the fourth pause (1.6 s or more), past its 500 ms deadline: the
    // fifth batch was given up at once, never sent.
    assert_eq!(b.len(), 4, "{g:?}");
    assert_eq!(stats.delivered, 0);
    assert_eq!(stats.dropped, 5 * MAX_BATCH_EVENTS as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_off_resets_after_a_delivered_batch() {
    let ingest = TestIngest::start().await;
    // Three failing batches (attempt and retry each), one delivered, then two failing again.
    let mut plan = vec![503; 6];
    plan.push(200);
    plan.extend([503; 4]);
    ingest.fail_next(&plan);
    let (mut q, h) = report::start_with(
        cfg(IngestTarget::Http(ingest.base()), 50, 10_000),
        measured_backoff(),
    );
    emit_full_batches(&mut q, 7);
    assert!(
        wait_until(PATIENCE, || h.snapshot().batches >= 2).await,
        "delivered again after the second failure spell"
    );
    let stats = h.shutdown().await;

    let b = batches(&ingest);
    let g = gaps(&b);
    assert!(g.len() >= 6, "{g:?}");
    assert!(g[2] >= Duration::from_millis(800), "third pause: {g:?}");
    // Had nothing reset, the next pauses would be 1.6 s or more.
    assert!(
        g[3] < Duration::from_millis(800),
        "no pause after a delivered batch: {g:?}"
    );
    // The first failure after the success starts again from 200-400 ms.
    assert!(
        g[4] >= Duration::from_millis(200) && g[4] < Duration::from_millis(1600),
        "the back-off starts over: {g:?}"
    );
    assert!(
        g[5] >= Duration::from_millis(400),
        "and doubles again: {g:?}"
    );
    assert_eq!(stats.failed, 5 * MAX_BATCH_EVENTS as u64);
    assert_eq!(stats.delivered, 2 * MAX_BATCH_EVENTS as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_a_retry_after_wait_exits_within_shutdown_flush() {
    let ingest = TestIngest::start().await;
    ingest.always(Reply::Throttle(503, "30"));
    let (mut q, h) = report::start_with(cfg(IngestTarget::Http(ingest.base()), 50, 1000), quick());
    emit_n(&mut q, 3);
    assert!(wait_until(PATIENCE, || ingest.request_count() == 1).await);
    let t = Instant::now();
    let stats = h.shutdown().await;
    let took = t.elapsed();
    // The retry would come 30 s later; the 1 s deadline ends it (loose bound, loaded machine).
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    assert_eq!(ingest.request_count(), 1, "the retry was never sent");
    assert!(stats.deadline_hit);
    assert_eq!(stats.dropped, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_a_back_off_exits_within_shutdown_flush() {
    let ingest = TestIngest::start().await;
    ingest.always(Reply::Status(503));
    let tuning = Tuning {
        cooldown_min: Duration::from_secs(20),
        cooldown_max: Duration::from_secs(30),
        ..quick()
    };
    let (mut q, h) = report::start_with(cfg(IngestTarget::Http(ingest.base()), 50, 1000), tuning);
    emit_n(&mut q, 3);
    assert!(wait_until(PATIENCE, || h.snapshot().failed_batches == 1).await);
    emit_n(&mut q, 4);
    let t = Instant::now();
    let stats = h.shutdown().await;
    let took = t.elapsed();
    // The back-off (20 s or more) ends after the 1 s deadline: nothing is sent, nothing waits.
    assert!(took < Duration::from_millis(900), "shutdown took {took:?}");
    assert_eq!(ingest.request_count(), 2, "no batch during the back-off");
    assert!(stats.deadline_hit);
    assert_eq!(stats.dropped, 7);
}

/// What another thread reads while the reporter cannot answer: events the queue took and the
/// totals do not account for yet are outstanding, and if the process stops waiting now they
/// count as lost to the deadline, never as delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_counts_what_is_not_delivered_yet_as_lost_never_as_delivered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("events.jsonl");
    // A long flush interval: the events wait in the batch being filled.
    let (mut q, h) = report::start_with(
        cfg(IngestTarget::File(path.clone()), 60_000, 2_000),
        quick(),
    );
    let watch = h.watch();
    emit_n(&mut q, 3);
    assert_eq!(watch.outstanding(), 3);
    let left = watch.abandoned();
    assert_eq!((left.delivered, left.failed, left.dropped), (0, 3, 3));
    assert!(left.deadline_hit);
    drop(q);
    let stats = h
        .shutdown_by(tokio::time::Instant::now() + Duration::from_secs(2))
        .await;
    assert_eq!(stats.delivered, 3);
    assert_eq!(watch.outstanding(), 0);
    assert_eq!(watch.abandoned(), watch.snapshot());
    assert_eq!(watch.snapshot().delivered, 3);
}
