//! `bounded-observe-mcp demo`: the whole pipeline on one machine, in seconds, with nothing to set up.
//!
//! Owns the first-run story: an in-process reference ingest on an ephemeral loopback port with a
//! temporary database, a freshly minted sensor key, the bundled sample payments server
//! ([`server`]) wrapped by this very binary (the real wrapper code path, as a child process), a
//! scripted agent session over real pipes, and a readable report of what landed. It prints
//! argument *key names* to show what was captured and what never left; it never prints an
//! argument value that the privacy layers withheld.

pub mod server;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config::Env;

/// Hidden argument that makes the binary act as the sample server.
pub const DEMO_SERVER_ARG: &str = "__demo-server";

/// Org the demo mints its key for.
const DEMO_ORG: &str = "demo";

/// How long the demo waits for its events to land before giving up.
const LAND_TIMEOUT: Duration = Duration::from_secs(15);

/// Actor of the first session (default capture) and of the second (`--capture-text reason`).
const ACTOR_DEFAULT: &str = "agent:demo-refunds-bot";
const ACTOR_TEXT: &str = "agent:demo-capture-text";

/// The scripted agent's calls: (tool, arguments). Values under PII-shaped keys are there to show
/// they never leave; the free-text `reason` to show prose is withheld by default, while a code
/// (`duplicate_charge`) is captured.
fn script() -> Vec<(&'static str, Value)> {
    vec![
        (
            "issue_refund",
            json!({"amount_cents": 4900, "currency": "EUR",
                   "customer_email": "jane.doe@example.com",
                   "reason": "damaged in transit"}),
        ),
        (
            "lookup_customer",
            json!({"email": "jane.doe@example.com", "customer_id": "cus_123",
                   "phone": "+44 20 7946 0958"}),
        ),
        (
            "issue_refund",
            json!({"amount_cents": 1250, "currency": "EUR",
                   "reason": "duplicate_charge"}),
        ),
        (
            "void_payment",
            json!({"payment_id": "pay_9", "card_number": "4242 4242 4242 4242"}),
        ),
    ]
}

/// The second session, run with `--capture-text reason`: prose in `reason` is captured now, but
/// the value scrubber still withholds one that holds a phone number.
fn script_text() -> Vec<(&'static str, Value)> {
    vec![
        (
            "issue_refund",
            json!({"amount_cents": 700, "currency": "EUR",
                   "reason": "damaged in transit"}),
        ),
        (
            "issue_refund",
            json!({"amount_cents": 300, "currency": "EUR",
                   "reason": "duplicate charge, call me on +44 20 7946 0958"}),
        ),
    ]
}

/// Values planted in the script that must never appear in stored evidence.
const CANARIES: &[&str] = &[
    "jane.doe@example.com",
    "+44 20 7946 0958",
    "4242 4242 4242 4242",
];

fn step(msg: impl std::fmt::Display) {
    println!("▸ {msg}");
    let _ = std::io::stdout().flush();
}

/// Runs the demo; returns the exit code (0 when every check passed). With `keep` the ingest
/// stays up after the report, its live view's URL and a one-time sign-in link printed, until
/// the process is interrupted (Ctrl-C or SIGTERM).
pub fn run(_env: &Env, keep: bool) -> i32 {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!(
                "{} error: cannot start the runtime: {e}",
                crate::log::PREFIX
            );
            return 1;
        }
    };
    match rt.block_on(run_async(keep)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{} error: demo failed: {e:#}", crate::log::PREFIX);
            1
        }
    }
}

/// 128 random bits in hex: a name no other demo picks, an admin secret no one guesses.
fn random_hex() -> anyhow::Result<String> {
    Ok(crate::event::hex_lower(&crate::random::bytes::<16>()?))
}

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<Self> {
        let p = std::env::temp_dir().join(format!("bounded-demo-{}", random_hex()?));
        std::fs::create_dir_all(&p)?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn run_async(keep: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = TempDir::new()?;
    let mut icfg = crate::ingest::IngestConfig::ephemeral(dir.0.join("demo.db"));
    icfg.admin_secret = Some(format!("demo-admin-{}", random_hex()?));
    let ingest = crate::ingest::start(icfg).await?;
    let base = ingest.base_url();
    step(format!(
        "Reference ingest listening on {base} (temporary database)"
    ));

    let admin = ingest.admin_client()?;
    let minted = admin.mint(DEMO_ORG, Some("demo sensor")).await?;
    step(format!(
        "Minted sensor key {} for org \"{DEMO_ORG}\"",
        minted.key_id
    ));

    let exe = std::env::current_exe()?;
    let mut calls = 0;
    for (actor, extra, script) in [
        (ACTOR_DEFAULT, &[][..], script()),
        (ACTOR_TEXT, &["--capture-text", "reason"][..], script_text()),
    ] {
        let session = tokio::task::spawn_blocking({
            let (exe, base, token) = (exe.clone(), base.clone(), minted.token.clone());
            move || agent_session(&exe, &base, &token, actor, extra, &script)
        })
        .await??;
        step(format!(
            "Agent session done: {} tool calls, wrapper exited with {}",
            session.calls, session.exit_code
        ));
        calls += session.calls;
    }

    step("Waiting for the events to land …");
    let deadline = Instant::now() + LAND_TIMEOUT;
    let events = loop {
        let events = admin.events(&[("org", DEMO_ORG), ("limit", "100")]).await?;
        if events.len() >= calls || Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    anyhow::ensure!(
        events.len() == calls,
        "{} of {} events landed",
        events.len(),
        calls
    );

    println!("\nEvidence ({} events, oldest first):", events.len());
    println!(
        "  {:<24}  {:<16} {:<6} {:>6} {:>9}  {:<22} captured fields",
        "ts", "tool", "class", "status", "dur_ms", "actor"
    );
    for e in events.iter().rev() {
        let fields = e["rec"]["fields"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        println!(
            "  {:<24}  {:<16} {:<6} {:>6} {:>9.3}  {:<22} {}",
            e["ts"].as_str().unwrap_or(""),
            e["rec"]["action"].as_str().unwrap_or(""),
            e["class"].as_str().unwrap_or(""),
            e["status"],
            e["dur_ms"].as_f64().unwrap_or(0.0),
            e["actor"]["id"].as_str().unwrap_or(""),
            fields
        );
    }

    println!("\nRollup (org {DEMO_ORG}):");
    for r in admin.rollups(Some(DEMO_ORG)).await? {
        println!(
            "  {:<24} {:<16} {:<6} count={:<3} sums={}",
            r["actor"].as_str().unwrap_or(""),
            r["action"].as_str().unwrap_or(""),
            r["class"].as_str().unwrap_or(""),
            r["count"],
            r["sums"]
        );
    }

    let stored = serde_json::to_string(&events)?;
    let of = |actor: &str| -> Vec<Value> {
        events
            .iter()
            .filter(|e| e["actor"]["id"] == actor)
            .cloned()
            .collect()
    };
    println!("\nPrivacy, default capture (argument keys the agent sent, by name):");
    for line in privacy_summary(&script(), &of(ACTOR_DEFAULT)) {
        println!("  {line}");
    }
    println!(
        "  reason: only codes (like duplicate_charge) are captured by default; the free-text \
         reason was withheld, because prose can name a person or an address, which no pattern \
         can recognise"
    );
    println!("\nPrivacy with --capture-text reason (the key opted into prose):");
    for line in privacy_summary(&script_text(), &of(ACTOR_TEXT)) {
        println!("  {line}");
    }
    println!(
        "  reason: the free-text reason is captured now; the one holding a phone number was \
         still withheld by the value scrubber"
    );
    let leaked: Vec<&str> = CANARIES
        .iter()
        .copied()
        .filter(|c| stored.contains(c))
        .collect();
    anyhow::ensure!(leaked.is_empty(), "PII reached the ingest: {leaked:?}");
    println!(
        "  checked: none of the {} planted PII values is in the stored evidence",
        CANARIES.len()
    );

    println!("\nDone in {:.1} s.", started.elapsed().as_secs_f64());
    if keep {
        keep_serving(&ingest).await;
    }
    ingest.shutdown().await?;
    Ok(())
}

/// Leaves the ingest serving its live view until Ctrl-C or SIGTERM.
async fn keep_serving(ingest: &crate::ingest::RunningIngest) {
    println!("\nLive view: {}/", ingest.base_url());
    match ingest.sign_in_link() {
        Some(link) => println!("Sign in once with: {link}"),
        None => println!("Sign in with the admin secret (no sign-in link: no random source)"),
    }
    println!("The ingest keeps running; stop it with Ctrl-C.");
    let _ = std::io::stdout().flush();
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

/// One line per argument key the script sent: in how many of the calls that carried it its
/// value reached the evidence (counted over all stored events, so no pairing of calls to events
/// is assumed).
fn privacy_summary(script: &[(&str, Value)], events: &[Value]) -> Vec<String> {
    let mut sent: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (_, args) in script {
        for key in args.as_object().map(|m| m.keys()).into_iter().flatten() {
            sent.entry(key.clone()).or_default().0 += 1;
        }
    }
    for event in events {
        for key in event["rec"]["fields"]
            .as_object()
            .map(|m| m.keys())
            .into_iter()
            .flatten()
        {
            if let Some(entry) = sent.get_mut(key) {
                entry.1 += 1;
            }
        }
    }
    sent.into_iter()
        .map(|(key, (calls, kept))| match kept {
            0 => format!("{key:<16} never left the process"),
            k if k == calls => format!("{key:<16} captured (allow-listed, passed the PII checks)"),
            k => format!(
                "{key:<16} captured in {k} of {calls} calls (withheld where the value was prose \
                 or held PII)"
            ),
        })
        .collect()
}

struct SessionReport {
    calls: usize,
    exit_code: i32,
}

/// The scripted agent: talks MCP over real pipes to this binary acting as the wrapper, which in
/// turn runs this binary as the sample server.
fn agent_session(
    exe: &Path,
    ingest: &str,
    token: &str,
    actor: &str,
    extra: &[&str],
    script: &[(&str, Value)],
) -> anyhow::Result<SessionReport> {
    step(format!(
        "Starting: bounded-observe-mcp --ingest {ingest} --token obs1.… --actor {actor}{}{} -- \
         <sample payments server>",
        if extra.is_empty() { "" } else { " " },
        extra.join(" ")
    ));
    let mut child = Command::new(exe)
        .arg("--ingest")
        .arg(ingest)
        .arg("--flush-ms")
        .arg("200")
        .arg("--actor")
        .arg(actor)
        .args(extra)
        .arg("--")
        .arg(exe)
        .arg(DEMO_SERVER_ARG)
        .env(crate::config::ENV_TOKEN, token)
        .env_remove(crate::config::ENV_DISABLED)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdin"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let mut next_id = 0u64;
    let mut rpc = |method: &str, params: Value| -> anyhow::Result<Value> {
        next_id += 1;
        let msg = json!({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params});
        writeln!(stdin, "{msg}")?;
        stdin.flush()?;
        let line = lines
            .next()
            .ok_or_else(|| anyhow::anyhow!("the server closed its output"))??;
        Ok(serde_json::from_str(&line)?)
    };

    let init = rpc(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "demo-agent", "version": "1"}}),
    )?;
    step(format!(
        "Agent: initialize → {}",
        init["result"]["serverInfo"]["name"].as_str().unwrap_or("?")
    ));
    let tools = rpc("tools/list", json!({}))?;
    step(format!(
        "Agent: tools/list → {} tools",
        tools["result"]["tools"].as_array().map_or(0, Vec::len)
    ));
    let mut calls = 0;
    for (name, args) in script {
        let keys: Vec<String> = args
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        let r = rpc("tools/call", json!({"name": name, "arguments": args}))?;
        calls += 1;
        let text = r["result"]["content"][0]["text"].as_str().unwrap_or("");
        let failed = r["result"]["isError"].as_bool().unwrap_or(false) || r.get("error").is_some();
        step(format!(
            "Agent: tools/call {name} {{{}}} → {}{}",
            keys.join(", "),
            if failed { "FAILED: " } else { "" },
            text
        ));
    }
    drop(stdin);
    let status = child.wait()?;
    Ok(SessionReport {
        calls,
        exit_code: status.code().unwrap_or(-1),
    })
}
