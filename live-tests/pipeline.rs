//! The whole pipeline, live: mint a key → wrap a real MCP server with that token through the
//! real `bounded-observe-mcp` binary → make tool calls over real pipes → read the rollup deltas
//! and the raw evidence back from the ingest → revoke → the next batch is refused and nothing
//! more is stored → restart the ingest → the evidence is still there.
//!
//! Against a remote ingest when `BOUNDED_INGEST_BASE` and `BOUNDED_INGEST_ADMIN_SECRET` are both
//! set (the restart step is then skipped: a remote ingest is not ours to restart); otherwise
//! against the real `bounded-ingest serve` binary started on 127.0.0.1:0, once on a temp SQLite
//! database (`…::sqlite`) and once on a fresh database of a real PostgreSQL cluster
//! (`…::postgres`, tests/store_support). Each run uses its own fresh org, so deltas on a shared
//! ingest are this run's alone.
//!
//! Run: `cargo test --test live` (part of `.ci/run`).

#[path = "../tests/ingest_support/mod.rs"]
mod ingest_support;
#[path = "../tests/pg_support/mod.rs"]
mod pg_support;
#[path = "../tests/store_support/mod.rs"]
mod store_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bounded_observe_mcp::ingest::AdminClient;
use ingest_support::stderr_lines;
use serde_json::{json, Value};
use store_support::{StoreKind, TestDb};

/// Upper bound for anything the test waits on (a loaded 2-core machine is slow).
const WAIT: Duration = Duration::from_secs(60);
/// Canaries: if any of these reaches the ingest's store, privacy failed somewhere.
const CANARY_EMAIL: &str = "live-canary-5e1d@example.com";
const CANARY_CUSTOMER: &str = "cus_live_canary_5e1d";
const CANARY_REASON: &str = "refund for live-canary-5e1d@example.com";

fn example(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"))
        .parent()
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "fixture {} is missing: build it with `cargo build --examples` (scripts/test.sh does)",
        path.display()
    );
    path
}

// ---- the ingest under test ----

enum Target {
    Remote,
    Local {
        /// `None` only while restarting.
        child: Option<Child>,
        db: TestDb,
    },
}

struct Ingest {
    base: String,
    admin_secret: String,
    target: Target,
}

/// A random admin secret for the local ingest (the test passes it by env, as an operator would).
fn random_hex(bytes: usize) -> String {
    use ring::rand::SecureRandom;
    let mut b = vec![0u8; bytes];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .expect("system rng");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Starts `bounded-ingest serve --listen 127.0.0.1:0` and returns it with its bound base URL.
/// On SQLite the admin secret goes in by env, as an operator would pass it; on PostgreSQL it is
/// the file every replica is given.
fn serve_local(db: &TestDb, admin_secret: &str) -> (Child, String) {
    let mut cmd = db.serve_command();
    if db.kind == StoreKind::Sqlite {
        cmd.env("BOUNDED_INGEST_ADMIN_SECRET", admin_secret);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bounded-ingest");
    let rx = stderr_lines(&mut child);
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                if let Some(i) = line.find("listening http://") {
                    let base = line[i + "listening ".len()..].trim().to_string();
                    return (child, base);
                }
                seen.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("bounded-ingest did not report its address; stderr: {seen:?}");
}

fn stop_local(mut child: Child) -> ExitStatus {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let st = child.wait().expect("wait");
            panic!("bounded-ingest ignored SIGTERM ({st:?})");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Ingest {
    fn start(store: StoreKind) -> Option<Ingest> {
        let base = std::env::var("BOUNDED_INGEST_BASE")
            .ok()
            .filter(|s| !s.is_empty());
        let secret = std::env::var("BOUNDED_INGEST_ADMIN_SECRET")
            .ok()
            .filter(|s| !s.is_empty());
        if let (Some(base), Some(admin_secret)) = (base, secret) {
            if store != StoreKind::Sqlite {
                // One run against a remote ingest is enough: its store is its own.
                eprintln!("live: remote ingest given, the {store:?} run is skipped");
                return None;
            }
            eprintln!("live: against the remote ingest {base}");
            return Some(Ingest {
                base,
                admin_secret,
                target: Target::Remote,
            });
        }
        let db = TestDb::new(store);
        let admin_secret = match store {
            StoreKind::Sqlite => format!("live-{}", random_hex(24)),
            StoreKind::Postgres => std::fs::read_to_string(db.admin_secret_file())
                .expect("admin secret")
                .trim()
                .to_string(),
        };
        let (child, base) = serve_local(&db, &admin_secret);
        eprintln!("live: against a local bounded-ingest on {store:?} at {base}");
        Some(Ingest {
            base,
            admin_secret,
            target: Target::Local {
                child: Some(child),
                db,
            },
        })
    }

    fn admin(&self) -> AdminClient {
        AdminClient::new(&self.base, &self.admin_secret).expect("admin client")
    }

    /// Stops and restarts a local ingest on the same database. `false` for a remote one.
    fn restart(&mut self) -> bool {
        let Target::Local { child, db, .. } = &mut self.target else {
            return false;
        };
        if let Some(old) = child.take() {
            let status = stop_local(old);
            assert!(status.success(), "ingest exit on SIGTERM: {status:?}");
        }
        let (new_child, base) = serve_local(db, &self.admin_secret);
        *child = Some(new_child);
        self.base = base;
        true
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        if let Target::Local {
            child: Some(child), ..
        } = &mut self.target
        {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

// ---- an MCP client driving the real wrapper over real pipes ----

struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Value>,
    stdout_thread: Option<JoinHandle<()>>,
    stderr_thread: Option<JoinHandle<Vec<u8>>>,
}

impl Session {
    /// `bounded-observe-mcp --token T --ingest BASE -- payments_server`.
    fn start(base: &str, token: &str) -> Session {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_bounded-observe-mcp"));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("BOUNDED_") {
                cmd.env_remove(&k);
            }
        }
        cmd.args(["--token", token, "--ingest", base, "--flush-ms", "100"])
            .arg("--")
            .arg(example("payments_server"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn wrapper");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        let stdout_thread = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        let stderr_thread = std::thread::spawn(move || {
            let mut b = Vec::new();
            let mut r = stderr;
            let _ = r.read_to_end(&mut b);
            b
        });
        Session {
            child,
            stdin,
            lines,
            stdout_thread: Some(stdout_thread),
            stderr_thread: Some(stderr_thread),
        }
    }

    fn send(&mut self, v: Value) {
        let mut line = v.to_string();
        line.push('\n');
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).expect("write");
        stdin.flush().expect("flush");
    }

    fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}));
        let v = self
            .lines
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("no answer to {method} (id {id})"));
        assert_eq!(v["id"], id, "unexpected message {v}");
        v
    }

    fn initialize(&mut self) {
        let v = self.request(
            0,
            "initialize",
            json!({"protocolVersion":"2025-06-18","capabilities":{},
                   "clientInfo":{"name":"live-pipeline","version":"1.0"}}),
        );
        assert_eq!(v["result"]["serverInfo"]["name"], "payments", "{v}");
        self.send(json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
        let v = self.request(1, "tools/list", json!({}));
        assert!(v["result"]["tools"].is_array(), "{v}");
    }

    fn call(&mut self, id: i64, tool: &str, args: Value) -> Value {
        self.request(id, "tools/call", json!({"name": tool, "arguments": args}))
    }

    /// Closes the client side; the wrapper flushes its reporter and exits. Returns its status
    /// and stderr.
    fn end(mut self) -> (ExitStatus, String) {
        drop(self.stdin.take());
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            if start.elapsed() > WAIT {
                let _ = self.child.kill();
                let s = self.child.wait().expect("wait");
                panic!("wrapper did not exit within {WAIT:?} ({s})");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(t) = self.stdout_thread.take() {
            let _ = t.join();
        }
        let stderr = self
            .stderr_thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        (status, String::from_utf8_lossy(&stderr).into_owned())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---- reading back ----

fn rollup<'a>(rollups: &'a [Value], action: &str, class: &str) -> Option<&'a Value> {
    rollups
        .iter()
        .find(|r| r["action"] == action && r["class"] == class)
}

fn count(rollups: &[Value], action: &str, class: &str) -> u64 {
    rollup(rollups, action, class)
        .and_then(|r| r["count"].as_u64())
        .unwrap_or(0)
}

fn errors(rollups: &[Value]) -> u64 {
    rollups
        .iter()
        .filter(|r| r["class"] == "error")
        .filter_map(|r| r["count"].as_u64())
        .sum()
}

fn amount_sum(rollups: &[Value]) -> i64 {
    rollup(rollups, "issue_refund", "action")
        .and_then(|r| r["sums"]["amount_cents"].as_i64())
        .unwrap_or(0)
}

/// Polls the stored events of `org` until there are at least `n` (bounded by [`WAIT`]).
async fn events_at_least(admin: &AdminClient, org: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let events = admin
            .events(&[("org", org), ("limit", "1000")])
            .await
            .expect("read events");
        if events.len() >= n || Instant::now() > deadline {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

both_stores!(live_pipeline_mint_wrap_call_read_back_revoke_restart);
async fn live_pipeline_mint_wrap_call_read_back_revoke_restart(store: StoreKind) {
    // reqwest is built without a bundled TLS provider; a remote ingest may be https.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(mut ingest) = Ingest::start(store) else {
        return;
    };
    let admin = ingest.admin();
    let org = format!("live-{}", random_hex(6));

    // 1. Mint.
    let key = admin.mint(&org, Some("live-pipeline")).await.expect("mint");
    let before = admin.rollups(Some(&org)).await.expect("rollups before");

    // 2. Wrap the payments server with that token and make the calls.
    let mut s = Session::start(&ingest.base, &key.token);
    s.initialize();
    let r = s.call(
        2,
        "issue_refund",
        json!({"amount_cents": 4900, "currency": "EUR",
               "customer_email": CANARY_EMAIL, "reason": CANARY_REASON}),
    );
    assert!(r["result"].is_object(), "{r}");
    let r = s.call(3, "void_charge", json!({"charge_id": "ch_123"}));
    assert_eq!(r["result"]["isError"], true, "{r}");
    let r = s.call(
        4,
        "lookup_customer",
        json!({"email": CANARY_EMAIL, "customer_id": CANARY_CUSTOMER}),
    );
    assert!(r["result"].is_object(), "{r}");
    let (status, stderr) = s.end();
    assert!(
        status.success(),
        "wrapper exit {status:?}; stderr: {stderr}"
    );

    // 3. Read back: the raw evidence, then the rollup deltas.
    let events = events_at_least(&admin, &org, 3).await;
    assert_eq!(
        events.len(),
        3,
        "expected 3 stored events; wrapper stderr: {stderr}; got {events:?}"
    );
    let refund = events
        .iter()
        .find(|e| e["rec"]["action"] == "issue_refund")
        .expect("issue_refund event stored");
    assert_eq!(refund["actor"]["id"], format!("mcp:{}", key.key_id));
    assert_eq!(refund["actor"]["grade"], "attested");
    assert_eq!(refund["actor"]["kind"], "agent");
    assert_eq!(refund["rec"]["fields"]["amount_cents"], 4900);
    assert_eq!(refund["class"], "action");
    assert_eq!(refund["status"], 200);
    assert_eq!(refund["org"], org.as_str());
    assert_eq!(refund["sensor"], key.key_id.as_str());
    assert!(refund["receivedAt"].is_string());
    let void = events
        .iter()
        .find(|e| e["rec"]["action"] == "void_charge")
        .expect("void_charge event stored");
    assert_eq!(void["class"], "error");
    assert_eq!(void["err"]["kind"], "tool");
    let stored = serde_json::to_string(&events).expect("json");
    for canary in [
        CANARY_EMAIL,
        CANARY_CUSTOMER,
        CANARY_REASON,
        "live-canary-5e1d",
    ] {
        assert!(
            !stored.contains(canary),
            "PII {canary:?} reached the store: {stored}"
        );
    }

    let after = admin.rollups(Some(&org)).await.expect("rollups after");
    assert_eq!(
        count(&after, "issue_refund", "action") - count(&before, "issue_refund", "action"),
        1,
        "{after:?}"
    );
    assert_eq!(amount_sum(&after) - amount_sum(&before), 4900, "{after:?}");
    assert_eq!(errors(&after) - errors(&before), 1, "{after:?}");

    // 4. Revoke: the next batch is refused and nothing more is stored.
    admin.revoke(&key.key_id).await.expect("revoke");
    let mut s = Session::start(&ingest.base, &key.token);
    s.initialize();
    let r = s.call(
        2,
        "issue_refund",
        json!({"amount_cents": 1, "currency": "EUR", "customer_email": CANARY_EMAIL, "reason": "x"}),
    );
    assert!(
        r["result"].is_object(),
        "the server keeps working after revocation: {r}"
    );
    let (status, stderr_revoked) = s.end();
    // The sensor did send its batch, and the ingest refused it.
    assert!(
        stderr_revoked.contains("401"),
        "the revoked key's batch was not refused: {stderr_revoked}"
    );
    assert!(status.success(), "wrapper exit after revocation {status:?}");
    // The same token posted directly: 401.
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/events", ingest.base))
        .bearer_auth(&key.token)
        .body(
            json!({"v":2,"sensor":{"version":"live","transport":"stdio"},"dropped":0,"events":[]})
                .to_string(),
        )
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status().as_u16(), 401);
    let events_now = admin
        .events(&[("org", &org), ("limit", "1000")])
        .await
        .expect("events");
    assert_eq!(
        events_now.len(),
        3,
        "nothing stored after revocation; wrapper stderr: {stderr_revoked}"
    );
    let rollups_now = admin.rollups(Some(&org)).await.expect("rollups");
    assert_eq!(amount_sum(&rollups_now), amount_sum(&after));

    // 5. Restart the ingest: the evidence is still there, the key still revoked.
    if ingest.restart() {
        let admin = ingest.admin();
        let events = admin
            .events(&[("org", &org), ("limit", "1000")])
            .await
            .expect("events after restart");
        assert_eq!(events.len(), 3);
        let refund = events
            .iter()
            .find(|e| e["rec"]["action"] == "issue_refund")
            .expect("refund survives a restart");
        assert_eq!(refund["rec"]["fields"]["amount_cents"], 4900);
        let rollups = admin.rollups(Some(&org)).await.expect("rollups");
        assert_eq!(amount_sum(&rollups), amount_sum(&after));
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/events", ingest.base))
            .bearer_auth(&key.token)
            .body(json!({"v":2,"sensor":{"version":"live","transport":"stdio"},"dropped":0,"events":[]}).to_string())
            .send()
            .await
            .expect("post");
        assert_eq!(resp.status().as_u16(), 401, "revocation survives a restart");
    } else {
        eprintln!("live: remote ingest, restart step skipped");
    }
}
