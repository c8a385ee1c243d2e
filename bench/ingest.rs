//! Ingest throughput: events/s accepted and POST latency, 4 concurrent senders posting 500-event
//! batches to the real server (in process, on 127.0.0.1) backed by a real SQLite file on disk.
//!
//! Honest by construction: the store runs WAL with `synchronous=FULL` (every acknowledged batch
//! is fsynced, group commit shares the fsync between batches that arrive together); the
//! database lives under `CARGO_TARGET_TMPDIR` (a real disk, not tmpfs); events are realistic
//! (captured fields, session, sizes) and every one passes the same filter the ingest runs in
//! production; and after the run the ingest is shut down, the file is re-opened and the rows are
//! counted: the run fails unless every accepted event is there.
//!
//! `cargo bench --bench ingest`. Knobs: `INGEST_BENCH_BATCHES` (per sender, default 60),
//! `INGEST_BENCH_SENDERS` (default 4).
//!
//! `cargo bench --bench ingest -- --hostile` measures memory instead: the real `bounded-ingest`
//! binary, 16 keys each posting one 4 MiB hostile body at once (one row per shape: `[0,0,…]` in
//! `events`, deep nesting, one long string, an object with many keys), and the ingest's peak
//! RSS (`VmHWM`) per row, a fresh process each. Results are in bench/README.md.

use std::time::{Duration, Instant};

use bounded_observe_mcp::ingest::{self, IngestConfig};
use serde_json::json;

/// DESIGN §4: the sensor's batch size (full batches: a busy sensor). `INGEST_BENCH_EVENTS`
/// sets another (a quiet sensor flushes fewer on its interval).
fn batch_events() -> usize {
    env_usize("INGEST_BENCH_EVENTS", 500).min(500)
}
const DEFAULT_SENDERS: usize = 4;
const DEFAULT_BATCHES_PER_SENDER: usize = 60;
/// Batches per sender when run by `cargo test` rather than `cargo bench`.
const SMOKE_BATCHES_PER_SENDER: usize = 2;
/// Batches per sender before timing starts (connection setup, page cache, SQLite warm-up).
const WARMUP_BATCHES: usize = 2;
/// The issue's target.
const TARGET_EVENTS_PER_SEC: f64 = 50_000.0;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// A session id shaped like the sensor's (16 hex digits of a keyed hash): `{sender:016x}`, all
/// digits, would read as a card or phone number to layer 4, and the ingest rejects an event with
/// such a value in any stored string.
fn session_id(sender: usize) -> String {
    format!("4dbc62b09ea053e{:x}", sender % 16)
}

fn batch_body(sender: usize, batch: usize) -> Vec<u8> {
    let events: Vec<_> = (0..batch_events())
        .map(|i| {
            let n = ((sender as u128) << 96) | ((batch as u128) << 32) | i as u128;
            let refund = i % 3 == 0;
            let failed = i % 17 == 0;
            let mut e = json!({
                "v": 2,
                "id": format!("{n:032x}"),
                "ts": "2026-11-29T19:00:00.123Z",
                "class": if failed { "error" } else { "action" },
                "rec": {
                    "rail": "mcp",
                    "action": if refund { "issue_refund" } else { "lookup_order" },
                    "registryVersion": "3f9a1c2b7d4e5f60",
                    "toolDef": if refund { "9c1e5a7b3d2f4e60" } else { "5b7d9f1a3c2e4d68" },
                    "fields": if refund {
                        json!({ "amount_cents": 4900 + i as u64, "currency": "EUR", "reason": "damaged" })
                    } else {
                        json!({ "status": "shipped", "quantity": 2 })
                    },
                },
                "dest": { "host": "mcp://payments", "pathTemplate": if refund { "/issue_refund" } else { "/lookup_order" }, "method": "POST" },
                "actor": { "id": format!("mcp:k_bench{sender}"), "kind": "agent", "grade": "attested" },
                "status": if failed { 500 } else { 200 },
                "dur_ms": 12.375,
                "bytes": { "req": 412, "resp": 1290 },
                "session": { "id": session_id(sender), "protocol": "2025-06-18", "client": "claude-code" },
            });
            if failed {
                e["err"] = json!({ "kind": "tool", "fp": "7e3a9c1b5d2f4a60" });
            }
            e
        })
        .collect();
    let b = json!({ "v": 2, "sensor": { "version": "0.1.0", "transport": "stdio" }, "dropped": 0, "events": events });
    serde_json::to_vec(&b).unwrap_or_default()
}

/// CPU time used so far by this whole process (server and senders), from `/proc/self/stat`
/// (utime + stime, in USER_HZ ticks, which Linux fixes at 100 per second for this file).
/// `None` off Linux.
fn process_cpu() -> Option<Duration> {
    const USER_HZ: u64 = 100;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the `(comm)`, which may itself contain spaces.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after `)`.
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 1000 / USER_HZ))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn main() {
    let senders = env_usize("INGEST_BENCH_SENDERS", DEFAULT_SENDERS);
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it,
    // and then a short smoke run (same code, same checks) keeps the test suite fast.
    let measuring = std::env::args().any(|a| a == "--bench");
    let batches = if measuring {
        env_usize("INGEST_BENCH_BATCHES", DEFAULT_BATCHES_PER_SENDER)
    } else {
        SMOKE_BATCHES_PER_SENDER
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ingest bench: cannot start a runtime: {e}");
            std::process::exit(1);
        }
    };
    if std::env::args().any(|a| a == "--hostile") {
        if let Err(e) = rt.block_on(hostile::run()) {
            eprintln!("ingest bench: FAILED: {e}");
            std::process::exit(1);
        }
        return;
    }
    if std::env::args().any(|a| a == "--pg") {
        let runs = env_usize("INGEST_BENCH_RUNS", if measuring { 3 } else { 1 });
        if let Err(e) = rt.block_on(pg::http(senders, batches, runs, measuring)) {
            eprintln!("ingest bench: FAILED: {e}");
            std::process::exit(1);
        }
        return;
    }
    if std::env::args().any(|a| a == "--pg-store") {
        if let Err(e) = rt.block_on(pg::store_level(senders, batches)) {
            eprintln!("ingest bench: FAILED: {e}");
            std::process::exit(1);
        }
        return;
    }
    if let Err(e) = rt.block_on(run(senders, batches, measuring)) {
        eprintln!("ingest bench: FAILED: {e}");
        std::process::exit(1);
    }
}

/// What [`send_all`] measured.
struct Sent {
    /// Every timed POST (request written → answer read), sorted.
    latencies: Vec<Duration>,
    accepted: u64,
    /// First timed POST sent → last answer read.
    wall: Duration,
    /// CPU used by this process meanwhile (the senders, and the server when it runs in here).
    own_cpu: Option<Duration>,
}

/// One task per `(url, token, bodies)`, each posting its bodies one after the other (as a
/// sensor does: one request in flight); the first [`WARMUP_BATCHES`] untimed, then all senders
/// start the timed ones together. `at_start` runs just as the clock starts (to read other
/// processes' CPU).
async fn send_all(
    work: Vec<(String, String, Vec<Vec<u8>>)>,
    at_start: impl FnOnce(),
) -> Result<Sent, String> {
    let start_gate = std::sync::Arc::new(tokio::sync::Barrier::new(work.len() + 1));
    let mut tasks = Vec::new();
    for (url, token, bodies) in work {
        let gate = start_gate.clone();
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let post = |body: Vec<u8>| {
                http.post(&url)
                    .bearer_auth(&token)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
            };
            let mut bodies = bodies.into_iter();
            let mut warm = Ok(());
            for body in bodies.by_ref().take(WARMUP_BATCHES) {
                match post(body).await {
                    Ok(resp) if resp.status().is_success() => {}
                    Ok(resp) => warm = Err(format!("warm-up batch answered {}", resp.status())),
                    Err(e) => warm = Err(e.to_string()),
                }
            }
            // Every sender reaches the gate, failed or not: the others wait for it there.
            gate.wait().await;
            warm?;
            let mut lat = Vec::new();
            let mut accepted = 0u64;
            for body in bodies {
                let t = Instant::now();
                let resp = post(body).await.map_err(|e| e.to_string())?;
                let status = resp.status();
                let v: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
                lat.push(t.elapsed());
                if !status.is_success() {
                    return Err(format!("batch answered {status}: {v}"));
                }
                accepted += v["accepted"].as_u64().unwrap_or(0);
            }
            Ok::<_, String>((lat, accepted))
        }));
    }
    start_gate.wait().await;
    let t0 = Instant::now();
    let cpu0 = process_cpu();
    at_start();
    let (latencies, accepted) = gather(tasks).await?;
    let wall = t0.elapsed();
    let own_cpu = process_cpu().zip(cpu0).map(|(a, b)| a.saturating_sub(b));
    Ok(Sent {
        latencies,
        accepted,
        wall,
        own_cpu,
    })
}

/// What one sender measured: each timed batch's latency, and the events accepted.
type SenderResult = Result<(Vec<Duration>, u64), String>;

/// Waits for every sender: all their latencies, sorted, and the events accepted in all.
async fn gather(tasks: Vec<tokio::task::JoinHandle<SenderResult>>) -> SenderResult {
    let mut latencies = Vec::new();
    let mut accepted = 0u64;
    for t in tasks {
        let (l, a) = t.await.map_err(|e| e.to_string())??;
        latencies.extend(l);
        accepted += a;
    }
    latencies.sort();
    Ok((latencies, accepted))
}

async fn run(senders: usize, batches: usize, measuring: bool) -> Result<(), String> {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).map_err(|e| e.to_string())?;
    let db = dir.path().join("bench.db");
    let running = ingest::start(IngestConfig::ephemeral(&db))
        .await
        .map_err(|e| e.to_string())?;
    let admin = running.admin_client().map_err(|e| e.to_string())?;
    let url = format!("{}/v1/events", running.base_url());

    // Bodies are built before the clock starts: the sensor's serialisation is not ours to time.
    let mut work = Vec::new();
    for s in 0..senders {
        let key = admin
            .mint("bench", Some(&format!("sender-{s}")))
            .await
            .map_err(|e| e.to_string())?;
        let bodies: Vec<Vec<u8>> = (0..WARMUP_BATCHES + batches)
            .map(|b| batch_body(s, b))
            .collect();
        work.push((key.token, bodies));
    }
    let body_bytes = work.first().and_then(|w| w.1.first()).map_or(0, Vec::len);

    let work = work
        .into_iter()
        .map(|(token, bodies)| (url.clone(), token, bodies))
        .collect();
    let sent = send_all(work, || {}).await?;
    let (lat, accepted, wall) = (sent.latencies, sent.accepted, sent.wall);
    let cpu = sent.own_cpu;

    running.shutdown().await.map_err(|e| e.to_string())?;
    // Count what is on disk after a clean close: every accepted event must be there.
    let expected_rows = accepted + (senders * WARMUP_BATCHES * batch_events()) as u64;
    let rows: u64 = {
        let c = rusqlite::Connection::open(&db).map_err(|e| e.to_string())?;
        c.query_row("SELECT COUNT(*) FROM events", [], |r| r.get::<_, i64>(0))
            .map_err(|e| e.to_string())?
            .max(0) as u64
    };
    let sync: String = {
        let c = rusqlite::Connection::open(&db).map_err(|e| e.to_string())?;
        c.query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .map_err(|e| e.to_string())?
    };

    let eps = accepted as f64 / wall.as_secs_f64();
    // Other work on the machine shares the cores with this run: say how much there was.
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().next().unwrap_or("?").to_string();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "ingest bench ({} cores, 1-min load average {load}, db on {}, journal_mode={sync}, synchronous=FULL, group commit)",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        env!("CARGO_TARGET_TMPDIR")
    );
    println!(
        "  {senders} senders x {batches} batches x {} events ({body_bytes} bytes/batch), {} POSTs timed",
        batch_events(),
        lat.len()
    );
    println!(
        "  accepted: {accepted} events in {:.2} s = {eps:.0} events/s",
        wall.as_secs_f64()
    );
    println!(
        "  POST latency: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ms(percentile(&lat, 0.50)),
        ms(percentile(&lat, 0.90)),
        ms(percentile(&lat, 0.99)),
        ms(percentile(&lat, 1.0))
    );
    if let Some(cpu) = cpu {
        println!(
            "  CPU (server and senders together): {:.2} s busy over {:.2} s wall = {:.1} us per event",
            cpu.as_secs_f64(),
            wall.as_secs_f64(),
            cpu.as_secs_f64() * 1e6 / accepted.max(1) as f64
        );
    }
    println!("  durable: {rows} rows on disk after shutdown (expected {expected_rows})");
    let verdict = if !measuring {
        "not measured (smoke run under `cargo test`; use `cargo bench --bench ingest`)"
    } else if eps >= TARGET_EVENTS_PER_SEC {
        "MET"
    } else {
        "NOT MET"
    };
    println!("  target >= {TARGET_EVENTS_PER_SEC:.0} events/s: {verdict}");
    if rows != expected_rows {
        return Err(format!("{rows} rows stored, {expected_rows} accepted"));
    }
    Ok(())
}

#[path = "../tests/pg_support/mod.rs"]
mod pg_support;

/// The PostgreSQL rows: a durable cluster made as the tests make theirs (tests/pg_support), with
/// `fsync=on` and `synchronous_commit=on`.
mod pg {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use bounded_observe_mcp::ingest::store::postgres::{PgConnect, PgStore};
    use bounded_observe_mcp::ingest::store::{
        BatchOutcome, BatchWrite, EventRow, Evidence, KeyRecord, Store,
    };

    use super::pg_support::PgCluster;
    use super::{
        batch_body, batch_events, load, percentile, TARGET_EVENTS_PER_SEC as TARGET, WARMUP_BATCHES,
    };

    /// The rows the server would hand the store for [`batch_body`]: each event with `org`,
    /// `sensor` and `receivedAt` added, and its evidence fields.
    fn batch_write(sender: usize, batch: usize, key_id: &str) -> Result<BatchWrite, String> {
        let body: serde_json::Value =
            serde_json::from_slice(&batch_body(sender, batch)).map_err(|e| e.to_string())?;
        let received_at = "2026-12-01T02:00:00.000Z".to_string();
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
        let rows = body["events"]
            .as_array()
            .ok_or("no events")?
            .iter()
            .map(|e| {
                let mut m = e.clone();
                m["org"] = "bench".into();
                m["sensor"] = key_id.into();
                m["receivedAt"] = received_at.clone().into();
                EventRow {
                    id: text(&e["id"]),
                    actor: text(&e["actor"]["id"]),
                    action: text(&e["rec"]["action"]),
                    class: text(&e["class"]),
                    body: m.to_string(),
                    evidence: Evidence {
                        host: text(&e["dest"]["host"]),
                        seen: text(&e["ts"]),
                        tool_defs: vec![text(&e["rec"]["toolDef"])],
                        error: e["err"]["fp"]
                            .as_str()
                            .map(|fp| (fp.to_owned(), "tool".to_owned(), None)),
                        catalog: None,
                    },
                }
            })
            .collect();
        Ok(BatchWrite {
            key_id: key_id.into(),
            org: "bench".into(),
            received_at,
            rows,
            dropped: 0,
            health: Default::default(),
            sensor_version: Some("0.1.0".into()),
            sensor_transport: Some("stdio".into()),
        })
    }

    /// Store level (no HTTP, no parsing): `senders` writers per store, one and two stores
    /// (replicas) over one durable database.
    pub async fn store_level(senders: usize, batches: usize) -> Result<(), String> {
        let pg = tokio::task::spawn_blocking(PgCluster::start_durable)
            .await
            .map_err(|e| e.to_string())?;
        for replicas in [1usize, 2] {
            let name = format!("store_{replicas}");
            let url = {
                let pg = &pg;
                pg.create_database(&name)
            };
            let connect = PgConnect::new(&url, &[]).map_err(|e| e.to_string())?;
            let mut stores: Vec<Arc<PgStore>> = Vec::new();
            for _ in 0..replicas {
                stores.push(PgStore::open(&connect).await.map_err(|e| e.to_string())?);
            }
            let mut work = Vec::new();
            for s in 0..senders * replicas {
                let key_id = format!("k_bench{s}");
                stores[0]
                    .mint(KeyRecord {
                        key_id: key_id.clone(),
                        org: "bench".into(),
                        name: None,
                        created_at: "2026-12-01T00:00:00.000Z".into(),
                        revoked_at: None,
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                let writes = (0..WARMUP_BATCHES + batches)
                    .map(|b| batch_write(s, b, &key_id))
                    .collect::<Result<Vec<_>, _>>()?;
                work.push((stores[s % replicas].clone(), writes));
            }
            let gate = Arc::new(tokio::sync::Barrier::new(work.len() + 1));
            let tasks: Vec<_> = work
                .into_iter()
                .map(|(store, writes)| {
                    let gate = gate.clone();
                    tokio::spawn(async move {
                        let mut writes = writes.into_iter();
                        for w in writes.by_ref().take(WARMUP_BATCHES) {
                            store.write_batch(w).await.map_err(|e| e.to_string())?;
                        }
                        gate.wait().await;
                        let mut lat = Vec::new();
                        let mut accepted = 0;
                        for w in writes {
                            let t = Instant::now();
                            match store.write_batch(w).await.map_err(|e| e.to_string())? {
                                BatchOutcome::Stored { accepted: a, .. } => accepted += a,
                                BatchOutcome::KeyRevoked => return Err("revoked".to_string()),
                            }
                            lat.push(t.elapsed());
                        }
                        Ok::<_, String>((lat, accepted))
                    })
                })
                .collect();
            let postmaster = pg.postmaster_pid();
            gate.wait().await;
            let t0 = Instant::now();
            let (own0, pg0) = (super::process_cpu(), super::server_cpu(postmaster));
            let (lat, accepted) = super::gather(tasks).await?;
            let wall = t0.elapsed();
            let own = super::process_cpu()
                .zip(own0)
                .map_or(Duration::ZERO, |(a, b)| a.saturating_sub(b));
            let server = super::server_cpu(postmaster).saturating_sub(pg0);
            for s in &stores {
                s.close().await;
            }
            let rows = pg.psql(&name, "SELECT count(*) FROM events");
            println!(
                "  pg store level, {replicas} replica(s) x {senders} writers x {batches} batches x {}: \
                 {:.0} events/s, write p50 {:.1} ms p99 {:.1} ms, {rows} rows, load {}; \
                 CPU per event: store {:.1} us, PostgreSQL {:.1} us",
                batch_events(),
                accepted as f64 / wall.as_secs_f64(),
                percentile(&lat, 0.5).as_secs_f64() * 1e3,
                percentile(&lat, 0.99).as_secs_f64() * 1e3,
                load(),
                own.as_secs_f64() * 1e6 / accepted.max(1) as f64,
                server.as_secs_f64() * 1e6 / accepted.max(1) as f64,
            );
        }
        Ok(())
    }

    /// One row of the HTTP table.
    pub struct Row {
        pub label: String,
        pub eps: f64,
        pub p50: Duration,
        pub p99: Duration,
        /// CPU per accepted event, µs: the ingest processes, PostgreSQL, this process (senders).
        pub cpu_ingest: f64,
        pub cpu_pg: f64,
        pub cpu_senders: f64,
        pub load: String,
    }

    /// `replicas` real `bounded-ingest serve` processes over `db` (a PostgreSQL URL, or a
    /// SQLite path for one replica), `senders` per replica, each posting `batches` batches to
    /// its replica. Fails unless every accepted event is in the database afterwards.
    pub async fn http_row(
        label: &str,
        db: &str,
        replicas: usize,
        senders: usize,
        batches: usize,
        pg: Option<&PgCluster>,
        count_rows: impl FnOnce() -> Result<u64, String>,
    ) -> Result<Row, String> {
        let admin_secret = "bench-admin-secret-0123456789abcdef";
        let signing = bounded_observe_mcp::ingest::keys::new_signing_secret_text()
            .map_err(|e| e.to_string())?;
        let env = [
            ("BOUNDED_INGEST_ADMIN_SECRET", admin_secret),
            ("BOUNDED_INGEST_SIGNING_SECRET", signing.as_str()),
        ];
        // The keys are minted through the first replica before the others start, so that
        // every replica knows them from its start, whatever it learns of later mints.
        let mut served = vec![super::serve(db, &env)?];
        let admin = bounded_observe_mcp::ingest::AdminClient::new(&served[0].base, admin_secret)
            .map_err(|e| e.to_string())?;
        let mut tokens = Vec::new();
        for s in 0..senders * replicas {
            let key = admin
                .mint("bench", Some(&format!("sender-{s}")))
                .await
                .map_err(|e| e.to_string())?;
            tokens.push(key.token);
        }
        for _ in 1..replicas {
            served.push(super::serve(db, &env)?);
        }
        let mut work = Vec::new();
        for (s, token) in tokens.into_iter().enumerate() {
            let bodies: Vec<Vec<u8>> = (0..WARMUP_BATCHES + batches)
                .map(|b| batch_body(s, b))
                .collect();
            let url = format!("{}/v1/events", served[s % replicas].base);
            work.push((url, token, bodies));
        }
        let pids: Vec<u32> = served.iter().map(|s| s.child.id()).collect();
        let postmaster = pg.map(PgCluster::postmaster_pid);
        let ingest_cpu =
            |pids: &[u32]| -> Duration { pids.iter().filter_map(|p| super::pid_cpu(*p)).sum() };
        let before = std::sync::Mutex::new((Duration::ZERO, Duration::ZERO));
        let sent = super::send_all(work, || {
            if let Ok(mut b) = before.lock() {
                *b = (
                    ingest_cpu(&pids),
                    postmaster.map_or(Duration::ZERO, super::server_cpu),
                );
            }
        })
        .await?;
        let (ingest0, pg0) = before.lock().map(|b| *b).unwrap_or_default();
        let ingest = ingest_cpu(&pids).saturating_sub(ingest0);
        let server = postmaster
            .map_or(Duration::ZERO, super::server_cpu)
            .saturating_sub(pg0);
        let load = load();
        drop(served);
        let rows = count_rows()?;
        let expected =
            sent.accepted + (senders * replicas * WARMUP_BATCHES * batch_events()) as u64;
        if rows != expected {
            return Err(format!("{label}: {rows} rows stored, {expected} accepted"));
        }
        let per = |d: Duration| d.as_secs_f64() * 1e6 / sent.accepted.max(1) as f64;
        Ok(Row {
            label: label.to_string(),
            eps: sent.accepted as f64 / sent.wall.as_secs_f64(),
            p50: percentile(&sent.latencies, 0.5),
            p99: percentile(&sent.latencies, 0.99),
            cpu_ingest: per(ingest),
            cpu_pg: per(server),
            cpu_senders: sent.own_cpu.map_or(0.0, per),
            load,
        })
    }

    /// The table: SQLite (one replica) and PostgreSQL (one and two replicas), `senders` per
    /// replica, `runs` rounds interleaved, each row's median.
    pub async fn http(
        senders: usize,
        batches: usize,
        runs: usize,
        measuring: bool,
    ) -> Result<(), String> {
        let pg = tokio::task::spawn_blocking(PgCluster::start_durable)
            .await
            .map_err(|e| e.to_string())?;
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).map_err(|e| e.to_string())?;
        println!(
            "ingest over HTTP, real bounded-ingest processes ({} cores): {senders} senders per replica x {batches} batches x {} events, {runs} interleaved runs; SQLite WAL synchronous=FULL, PostgreSQL fsync=on synchronous_commit=on",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            batch_events(),
        );
        let mut rows: Vec<Vec<Row>> = vec![Vec::new(), Vec::new(), Vec::new()];
        for run in 0..runs {
            let file = dir.path().join(format!("bench-{run}.db"));
            let file_text = file.display().to_string();
            let r = http_row(
                "sqlite, 1 replica",
                &file_text,
                1,
                senders,
                batches,
                None,
                || {
                    let c = rusqlite::Connection::open(&file).map_err(|e| e.to_string())?;
                    c.query_row("SELECT COUNT(*) FROM events", [], |r| r.get::<_, i64>(0))
                        .map(|n| n.max(0) as u64)
                        .map_err(|e| e.to_string())
                },
            )
            .await?;
            print_row(&r);
            rows[0].push(r);
            for (i, replicas) in [1usize, 2].into_iter().enumerate() {
                let name = format!("http_{run}_{replicas}");
                let url = pg.create_database(&name);
                let label = format!(
                    "postgres, {replicas} replica{}",
                    if replicas > 1 { "s" } else { "" }
                );
                let r = http_row(&label, &url, replicas, senders, batches, Some(&pg), || {
                    pg.psql(&name, "SELECT count(*) FROM events")
                        .parse::<u64>()
                        .map_err(|e| e.to_string())
                })
                .await?;
                print_row(&r);
                rows[i + 1].push(r);
            }
        }
        println!("medians of {runs}:");
        for mut r in rows {
            let med = |v: &mut Vec<f64>| {
                v.sort_by(|a, b| a.total_cmp(b));
                v[v.len() / 2]
            };
            let mut eps: Vec<f64> = r.iter().map(|x| x.eps).collect();
            let mut p50: Vec<f64> = r.iter().map(|x| x.p50.as_secs_f64() * 1e3).collect();
            let mut p99: Vec<f64> = r.iter().map(|x| x.p99.as_secs_f64() * 1e3).collect();
            let mut ci: Vec<f64> = r.iter().map(|x| x.cpu_ingest).collect();
            let mut cp: Vec<f64> = r.iter().map(|x| x.cpu_pg).collect();
            let mut cs: Vec<f64> = r.iter().map(|x| x.cpu_senders).collect();
            let (lo, hi) = (
                eps.iter().copied().fold(f64::MAX, f64::min),
                eps.iter().copied().fold(0.0, f64::max),
            );
            let label = r.remove(0).label;
            println!(
                "  {label:<22} {:>7.0} events/s (range {lo:.0}-{hi:.0}), POST p50 {:.1} ms p99 {:.1} ms; CPU/event: ingest {:.1} us, postgres {:.1} us, senders {:.1} us; target >= {TARGET:.0}: {}",
                med(&mut eps),
                med(&mut p50),
                med(&mut p99),
                med(&mut ci),
                med(&mut cp),
                med(&mut cs),
                if !measuring {
                    "not measured (smoke run under `cargo test`)"
                } else if med(&mut eps) >= TARGET {
                    "MET"
                } else {
                    "NOT MET"
                }
            );
        }
        Ok(())
    }

    fn print_row(r: &Row) {
        println!(
            "  {:<22} {:>7.0} events/s, POST p50 {:.1} ms p99 {:.1} ms; CPU/event: ingest {:.1} us, postgres {:.1} us, senders {:.1} us; load {}",
            r.label,
            r.eps,
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            r.cpu_ingest,
            r.cpu_pg,
            r.cpu_senders,
            r.load
        );
    }
}

/// The real `bounded-ingest` binary, serving until dropped.
struct Served {
    child: std::process::Child,
    base: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `bounded-ingest serve` on a free loopback port with `--db db` and `env`; returns once
/// it says where it listens.
fn serve(db: &str, env: &[(&str, &str)]) -> Result<Served, String> {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    // `INGEST_BENCH_BIN` runs another build of the binary (an A/B of two versions).
    let bin = std::env::var_os("INGEST_BENCH_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_bounded-ingest").into());
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--db", db]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn bounded-ingest: {e}"))?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let mut said = String::new();
    let base = loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(i) = line.find("listening http://") {
                    break line[i + "listening ".len()..].trim().to_string();
                }
                said.push_str(&line);
                said.push('\n');
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("bounded-ingest exited before listening:\n{said}"));
            }
        }
    };
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok(Served { child, base })
}

/// The fields of `/proc/<pid>/stat` after the command name (`state` first, so `utime` is 11).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(rest.split_whitespace().map(String::from).collect())
}

/// The clock ticks in `fields` of a stat line, as time; `None` if one is missing.
fn ticks(f: &[String], fields: std::ops::Range<usize>) -> Option<Duration> {
    const USER_HZ: u64 = 100;
    let mut sum = 0u64;
    for i in fields {
        sum += f.get(i)?.parse::<u64>().ok()?;
    }
    Some(Duration::from_millis(sum * 1000 / USER_HZ))
}

/// CPU time used so far by process `pid` (utime + stime), from `/proc/<pid>/stat`.
fn pid_cpu(pid: u32) -> Option<Duration> {
    ticks(&stat_fields(pid)?, 11..13)
}

/// CPU time used so far by the PostgreSQL server whose postmaster is `postmaster` and by its
/// backends, including the ones that have exited (`cutime`/`cstime` of the postmaster).
fn server_cpu(postmaster: u32) -> Duration {
    let mut total = Duration::ZERO;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return total;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let Some(f) = stat_fields(pid) else {
            continue;
        };
        let ppid = f.get(1).and_then(|p| p.parse::<u32>().ok());
        if pid != postmaster && ppid != Some(postmaster) {
            continue;
        }
        // utime, stime, and for the postmaster its reaped children's cutime, cstime.
        let fields = if pid == postmaster { 11..15 } else { 11..13 };
        total += ticks(&f, fields).unwrap_or_default();
    }
    total
}

/// The 1-minute load average (other work on the machine shares the cores with a run).
fn load() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace().next().unwrap_or("?").to_string()
}

/// Peak memory of the ingest under hostile bodies (issue 14): what one key holder can make it
/// hold by sending bodies that are small on the wire and large once parsed.
mod hostile {
    use std::time::{Duration, Instant};

    use bounded_observe_mcp::ingest::AdminClient;

    /// Concurrent bodies: one per key, so the per-key limit is not what is measured.
    const SENDERS: usize = 16;
    /// Just under the ingest's 4 MiB body limit.
    const BODY_BYTES: usize = 4 * 1024 * 1024 - 4096;
    const ADMIN_SECRET: &str = "hostile-bench-admin-secret-0123456789";
    /// The issue's target.
    const TARGET_MIB: f64 = 256.0;

    /// `{"v":2,"dropped":0,"events":[` + items until the body is full + `]}`.
    fn fill(item: &str) -> Vec<u8> {
        let head = r#"{"v":2,"dropped":0,"events":["#;
        let mut b = head.as_bytes().to_vec();
        let mut first = true;
        while b.len() + item.len() + 3 < BODY_BYTES {
            if !first {
                b.push(b',');
            }
            b.extend_from_slice(item.as_bytes());
            first = false;
        }
        b.extend_from_slice(b"]}");
        b
    }

    fn shapes() -> Vec<(&'static str, Vec<u8>)> {
        // Nesting just inside serde_json's recursion limit (128), so it parses.
        let deep = format!("{}0{}", "[".repeat(120), "]".repeat(120));
        let long = {
            let mut b = br#"{"v":2,"dropped":0,"events":[{"v":2,"id":""#.to_vec();
            b.resize(BODY_BYTES - 8, b'x');
            b.extend_from_slice(br#""}]}"#);
            b
        };
        let many_keys = {
            let mut b = br#"{"v":2,"dropped":0,"events":[{"#.to_vec();
            let mut i = 0u64;
            while b.len() + 32 < BODY_BYTES {
                if i > 0 {
                    b.push(b',');
                }
                b.extend_from_slice(format!(r#""k{i}":0"#).as_bytes());
                i += 1;
            }
            b.extend_from_slice(b"}]}");
            b
        };
        vec![
            ("zeros: events [0,0,0,...]", fill("0")),
            ("deep: events of 120-deep arrays", fill(&deep)),
            ("long: one 4 MiB string", long),
            ("keys: one object, ~400k keys", many_keys),
        ]
    }

    /// `VmHWM` (peak resident set) of `pid`, in MiB.
    fn peak_rss_mib(pid: u32) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    }

    pub async fn run() -> Result<(), String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).map_err(|e| e.to_string())?;
        println!(
            "ingest hostile bodies ({} cores): {SENDERS} keys x one {} KiB body at once, peak RSS of bounded-ingest",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            BODY_BYTES / 1024
        );
        let mut worst: f64 = 0.0;
        for (i, (name, body)) in shapes().into_iter().enumerate() {
            let db = dir.path().join(format!("hostile-{i}.db"));
            let db = db.to_str().ok_or("temporary path is not UTF-8")?;
            let served = super::serve(db, &[("BOUNDED_INGEST_ADMIN_SECRET", ADMIN_SECRET)])?;
            let admin = AdminClient::new(&served.base, ADMIN_SECRET).map_err(|e| e.to_string())?;
            let mut tokens = Vec::new();
            for s in 0..SENDERS {
                let k = admin
                    .mint("hostile", Some(&format!("k{s}")))
                    .await
                    .map_err(|e| e.to_string())?;
                tokens.push(k.token);
            }
            let idle = peak_rss_mib(served.child.id()).unwrap_or(0.0);
            let url = format!("{}/v1/events", served.base);
            let body = bytes::Bytes::from(body);
            let gate = std::sync::Arc::new(tokio::sync::Barrier::new(SENDERS));
            let t0 = Instant::now();
            let mut tasks = Vec::new();
            for token in tokens {
                let (url, body, gate) = (url.clone(), body.clone(), gate.clone());
                tasks.push(tokio::spawn(async move {
                    let http = reqwest::Client::builder()
                        .timeout(Duration::from_secs(120))
                        .build()
                        .map_err(|e| e.to_string())?;
                    gate.wait().await;
                    let resp = http
                        .post(&url)
                        .bearer_auth(&token)
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok::<u16, String>(resp.status().as_u16())
                }));
            }
            let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
            for t in tasks {
                let st = t.await.map_err(|e| e.to_string())??;
                *statuses.entry(st).or_default() += 1;
            }
            let wall = t0.elapsed();
            let peak = peak_rss_mib(served.child.id()).unwrap_or(0.0);
            worst = worst.max(peak);
            let statuses: Vec<String> = statuses.iter().map(|(s, n)| format!("{n}x{s}")).collect();
            println!(
                "  {name:<34} peak RSS {peak:7.1} MiB (idle {idle:.1}), answers {}, {:.2} s",
                statuses.join(" "),
                wall.as_secs_f64()
            );
        }
        let verdict = if worst <= TARGET_MIB {
            "MET"
        } else {
            "NOT MET"
        };
        println!("  target peak RSS <= {TARGET_MIB:.0} MiB: {verdict}");
        Ok(())
    }
}
