//! The stdio benchmark: the same MCP workloads run directly against a mock server, through a
//! minimal two-thread byte relay, and through `bounded-observe-mcp` in each of its reporting
//! modes, in one run, pinned to one CPU and unpinned. See bench/README.md for what each number
//! means and how to run it.
//!
//! One self-contained binary: it re-invokes itself (`--role server|relay|phase`) for the mock
//! server, the relay and each measured phase (the pinned phase runs under `taskset -c 0`, so the
//! driver, the relay or wrapper, the server and the stand-in ingests all share CPU 0). The
//! wrapper measured is the real binary cargo built next to this one. After the phases, the
//! scenario rows (bench/stdio/scenarios.rs: a typical session driven by the Python, TypeScript
//! and Rust SDK clients, one-shot start-up, CPU contention, a flood of unanswered calls) run from
//! this process, unpinned.
//!
//! It measures and reports; it never fails on a missed target (benchmarks do not gate). It exits
//! non-zero only when the harness itself cannot run (the direct or relay target fails).

#[path = "stdio/ingest.rs"]
mod ingest;
#[path = "../tests/interop_support/mod.rs"]
mod interop_support;
#[path = "stdio/report.rs"]
mod report;
#[path = "stdio/roles.rs"]
mod roles;
#[path = "stdio/scenarios.rs"]
mod scenarios;
#[path = "stdio/session.rs"]
mod session;
#[path = "stdio/typical.rs"]
mod typical;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use session::{Ctx, Mechanism, Session, Target, WrapMode};

/// The wrapper under test, built by cargo for this bench (release profile under `cargo bench`).
const WRAPPER: &str = env!("CARGO_BIN_EXE_bounded-observe-mcp");
/// Where raw results are kept (ignored by git).
const OUT_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/out");

/// Workload sizes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    pub runs: u32,
    /// Sequential calls before measuring (connection and cache warm-up; not timed).
    pub warmup: u64,
    pub seq_calls: u64,
    pub pipe_calls: u64,
    pub bw_count: u64,
    pub bw_bytes: usize,
    /// Fresh sessions per run for the close → exit timing.
    pub close_samples: u32,
    /// Answers still in flight when stdin is closed: this many `echo` calls plus one blob.
    pub close_echoes: u64,
    pub close_blob: usize,
    pub targets: Vec<String>,
}

impl Settings {
    /// Issue 2 item 6: 2,000 sequential calls, 20,000 pipelined, 20 × 5 MB, medians of 3.
    fn full() -> Self {
        Settings {
            runs: 3,
            warmup: 200,
            seq_calls: 2_000,
            pipe_calls: 20_000,
            bw_count: 20,
            bw_bytes: 5 * 1024 * 1024,
            close_samples: 3,
            close_echoes: 10,
            close_blob: 256 * 1024,
            targets: Target::ALL.iter().map(|t| t.name().to_string()).collect(),
        }
    }

    fn quick() -> Self {
        Settings {
            runs: 1,
            warmup: 50,
            seq_calls: 300,
            pipe_calls: 3_000,
            bw_count: 3,
            close_samples: 1,
            ..Settings::full()
        }
    }

    /// What `cargo test --all-targets` runs: about a second, harness plumbing only.
    fn smoke() -> Self {
        Settings {
            runs: 1,
            warmup: 5,
            seq_calls: 50,
            pipe_calls: 300,
            bw_count: 1,
            bw_bytes: 1024 * 1024,
            close_samples: 1,
            targets: ["direct", "relay", "wrap:none", "wrap:file", "wrap:otlp"]
                .map(String::from)
                .to_vec(),
            ..Settings::full()
        }
    }
}

/// One target's results for one run. Every metric is optional: a failed workload leaves it out.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Record {
    pub phase: String,
    pub run: u32,
    pub target: String,
    pub error: Option<String>,
    pub seq_p50_us: Option<f64>,
    pub seq_p99_us: Option<f64>,
    pub pipe_calls_per_s: Option<f64>,
    pub bw_mb_per_s: Option<f64>,
    /// Largest response frame in the bandwidth workload, bytes.
    pub bw_frame_bytes: Option<f64>,
    /// Median over the run's close → exit samples, ms.
    pub close_ms: Option<f64>,
    /// Peak VmHWM of the small-message sessions (sequential and pipelined), through their exit,
    /// KiB.
    pub rss_small_kib: Option<f64>,
    /// Peak VmHWM of the 5 MB session, through its exit, KiB.
    pub rss_big_kib: Option<f64>,
    /// CPU of the target's top process per call, µs, by thread name.
    /// Measured calls only (warm-up, handshake and start-up excluded).
    pub cpu_seq_us: BTreeMap<String, f64>,
    pub cpu_pipe_us: BTreeMap<String, f64>,
    /// Minor page faults of the target's top process per 1,000 pipelined calls, by thread name
    /// (same window as `cpu_pipe_us`). A first-touched page costs ~1.5 µs on the VMs we use.
    #[serde(default)]
    pub faults_pipe_k: BTreeMap<String, f64>,
    /// The same per MB of 5 MB responses.
    #[serde(default)]
    pub faults_bw_per_mb: BTreeMap<String, f64>,
    /// Whole-session CPU per `tools/call`, µs: the target and its server from spawn to exit
    /// (start-up, handshake and warm-up included), divided by the session's calls. Unlike the
    /// windows above, it counts what the observer does after the last answer, when it runs
    /// behind. Sequential and pipelined sessions.
    #[serde(default)]
    pub seq_session_cpu_us: Option<f64>,
    #[serde(default)]
    pub pipe_session_cpu_us: Option<f64>,
    /// CPU of the target's top process per MB relayed in the 5 MB workload, µs, by thread name.
    pub cpu_bw_us_per_mb: BTreeMap<String, f64>,
    /// Slowest sequential call, µs.
    pub seq_max_us: Option<f64>,
    pub calls: u64,
    /// Per workload: (events the file sink or the healthy ingest received, tools/call made,
    /// events with a status other than 200 — every mock call succeeds).
    pub events: BTreeMap<String, (u64, u64, u64)>,
    pub ingest_requests: Option<u64>,
    pub ingest_connections: Option<u64>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--role") {
        let code = match args.get(1).map(String::as_str) {
            Some("server") => roles::server_main(&args[2..]),
            Some("relay") => roles::relay_main(&args[2..]),
            Some("phase") => phase_main(&args[2..]),
            Some("rmcp-client") => typical::rmcp_client_main(&args[2..]),
            other => {
                eprintln!("bench: unknown role {other:?}");
                2
            }
        };
        std::process::exit(code);
    }
    std::process::exit(driver_main(&args));
}

fn arg_value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// The top-level process: picks the settings, runs each phase as a child, prints the report.
fn driver_main(args: &[String]) -> i32 {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` does not, and gets the smoke run.
    let benching = args.iter().any(|a| a == "--bench");
    let mut settings = if args.iter().any(|a| a == "--quick") {
        Settings::quick()
    } else if benching {
        Settings::full()
    } else {
        Settings::smoke()
    };
    if let Some(n) = arg_value(args, "--runs").and_then(|v| v.parse().ok()) {
        settings.runs = n;
    }
    let quick = args.iter().any(|a| a == "--quick");
    if let Some(list) = arg_value(args, "--targets") {
        settings.targets = list.split(',').map(|s| s.trim().to_string()).collect();
        if let Some(bad) = settings.targets.iter().find(|t| Target::parse(t).is_none()) {
            eprintln!(
                "bench: unknown target {bad:?}; known: {}",
                Target::known()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return 2;
        }
    }
    let smoke = !benching && !quick;
    // Ablations: `wrap:file` with one mechanism switched off, in the main table and wherever the
    // scenarios run `wrap:file`.
    let ablate = arg_value(args, "--ablate")
        .map(String::from)
        .or_else(|| std::env::var(ENV_ABLATE).ok())
        .unwrap_or_default();
    let mut ablations = Vec::new();
    for name in ablate.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let Some(m) = Mechanism::parse(name) else {
            eprintln!(
                "bench: unknown ablation {name:?}; known: {}",
                Mechanism::ALL.map(|m| m.name()).join(", ")
            );
            return 2;
        };
        let t = Target::Wrap(WrapMode::FileWithout(m));
        if !ablations.contains(&t) {
            ablations.push(t);
        }
        if !settings.targets.iter().any(|n| n == t.name()) {
            settings.targets.push(t.name().to_string());
        }
    }
    let mut plan = if smoke {
        scenarios::Plan::smoke(ablations)
    } else if quick {
        scenarios::Plan::quick(ablations)
    } else {
        scenarios::Plan::full(ablations)
    };
    if let Some(list) = arg_value(args, "--scenarios") {
        plan.which = list
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty() && s != "none")
            .collect();
        if let Some(bad) = plan
            .which
            .iter()
            .find(|w| !scenarios::NAMES.contains(&w.as_str()))
        {
            eprintln!(
                "bench: unknown scenario {bad:?}; known: {}",
                scenarios::NAMES.join(", ")
            );
            return 2;
        }
    }
    plan.contended_own_user = args.iter().any(|a| a == "--contended-own-user");
    if let Some(n) = arg_value(args, "--scenario-runs").and_then(|v| v.parse().ok()) {
        plan.typical_runs = n;
        plan.contended_runs = n;
    }
    let main_table = !args.iter().any(|a| a == "--scenarios-only");
    let mut phases: Vec<&str> = Vec::new();
    if main_table && !args.iter().any(|a| a == "--unpinned-only") && !smoke {
        if taskset_works() {
            phases.push("pinned");
        } else {
            eprintln!("bench: `taskset -c 0` is not usable here; the pinned phase is skipped");
        }
    }
    if main_table && !args.iter().any(|a| a == "--pinned-only") {
        phases.push("unpinned");
    }

    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench: cannot find own executable: {e}");
            return 1;
        }
    };
    let settings_json = match serde_json::to_string(&settings) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench: {e}");
            return 1;
        }
    };
    eprintln!(
        "bench: wrapper {WRAPPER}\nbench: {} run(s) × {} target(s) × phases {phases:?}",
        settings.runs,
        settings.targets.len()
    );
    let mut records = Vec::new();
    for phase in &phases {
        let mut cmd = if *phase == "pinned" {
            let mut c = Command::new("taskset");
            c.args(["-c", "0"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        cmd.args(["--role", "phase", phase, &settings_json])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("bench: cannot start the {phase} phase: {e}");
                return 1;
            }
        };
        if let Some(out) = child.stdout.take() {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                match serde_json::from_str::<Record>(&line) {
                    Ok(r) => records.push(r),
                    Err(e) => eprintln!("bench: unreadable phase output ({e}): {line}"),
                }
            }
        }
        match child.wait() {
            Ok(s) if s.success() => {}
            Ok(s) => eprintln!("bench: {phase} phase ended with {s}"),
            Err(e) => eprintln!("bench: {phase} phase: {e}"),
        }
    }

    if main_table && std::fs::create_dir_all(OUT_DIR).is_ok() {
        let path = PathBuf::from(OUT_DIR).join("stdio-last.jsonl");
        if let Ok(mut f) = std::fs::File::create(&path) {
            for r in &records {
                if let Ok(line) = serde_json::to_string(r) {
                    let _ = writeln!(f, "{line}");
                }
            }
            eprintln!("bench: raw results in {}", path.display());
        }
    }

    if main_table {
        let text = report::render(&settings, &phases, &records);
        print!("{text}");
    }
    let mut scenarios_broken = false;
    if !plan.which.is_empty() {
        let (text, broken) = run_scenarios(&exe, &plan);
        print!("{text}");
        scenarios_broken = broken;
    }
    // The harness itself must work: without direct and relay numbers nothing above means anything.
    let harness_broken = records
        .iter()
        .any(|r| (r.target == "direct" || r.target == "relay") && r.error.is_some());
    if harness_broken || scenarios_broken || (main_table && records.is_empty()) {
        eprintln!("bench: the harness's own targets failed (see above)");
        return 1;
    }
    0
}

/// Env var: the same as `--ablate` (a comma-separated list of mechanisms to switch off).
const ENV_ABLATE: &str = "BENCH_ABLATE";

/// Runs the scenario rows in this process; returns their report and whether one of the
/// harness's own targets (direct, relay) failed in them.
fn run_scenarios(exe: &std::path::Path, plan: &scenarios::Plan) -> (String, bool) {
    let tmp = match tempfile::tempdir() {
        Ok(t) => t,
        Err(e) => return (format!("\nscenarios not run: temp dir: {e}\n"), true),
    };
    // The OTLP receiver of `wrap:otlp` (answers 200 to every POST, counts requests).
    let otlp = ingest::healthy().ok();
    let mut ctx = Ctx {
        exe: exe.to_path_buf(),
        wrapper: PathBuf::from(WRAPPER),
        tmp: tmp.path().to_path_buf(),
        healthy: None,
        black_hole: None,
        otlp: otlp.as_ref().map(|o| o.addr),
        serial: 0,
        run_as: None,
    };
    let _tmp = if std::env::var_os(ENV_KEEP_TMP).is_some() {
        eprintln!("bench: keeping scenario logs in {}", tmp.path().display());
        let _ = tmp.keep();
        None
    } else {
        Some(tmp)
    };
    let res = scenarios::run(&mut ctx, plan);
    if std::fs::create_dir_all(OUT_DIR).is_ok() {
        let path = PathBuf::from(OUT_DIR).join("stdio-scenarios.json");
        if let Ok(text) = serde_json::to_string_pretty(&res) {
            if std::fs::write(&path, text).is_ok() {
                eprintln!("bench: scenario results in {}", path.display());
            }
        }
    }
    let own = |t: &str| t == "direct" || t == "relay";
    let broken = res
        .typical
        .iter()
        .any(|r| own(&r.target) && r.error.is_some())
        || res
            .oneshot
            .iter()
            .any(|r| own(&r.target) && !r.errors.is_empty())
        || res
            .contended
            .iter()
            .any(|r| own(&r.target) && !r.errors.is_empty())
        || res
            .flood
            .iter()
            .any(|r| own(&r.target) && r.error.is_some());
    (scenarios::render(plan, &res), broken)
}

fn taskset_works() -> bool {
    Command::new("taskset")
        .args(["-c", "0", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// One phase (pinned or not): every run, every target, one JSON record per line on stdout.
fn phase_main(args: &[String]) -> i32 {
    let (Some(phase), Some(settings)) = (args.first(), args.get(1)) else {
        eprintln!("bench: phase needs a name and settings");
        return 2;
    };
    let settings: Settings = match serde_json::from_str(settings) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench: bad phase settings: {e}");
            return 2;
        }
    };
    let targets: Vec<Target> = settings
        .targets
        .iter()
        .filter_map(|t| Target::parse(t))
        .collect();
    let tmp = match tempfile::tempdir() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("bench: temp dir: {e}");
            return 1;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench: {e}");
            return 1;
        }
    };
    let healthy = ingest::healthy().ok();
    let black_hole = ingest::black_hole().ok();
    let otlp = ingest::healthy().ok();
    let mut ctx = Ctx {
        exe,
        wrapper: PathBuf::from(WRAPPER),
        tmp: tmp.path().to_path_buf(),
        healthy: healthy.as_ref().map(|h| h.addr),
        black_hole: black_hole.as_ref().map(|h| h.addr),
        otlp: otlp.as_ref().map(|o| o.addr),
        serial: 0,
        run_as: None,
    };
    let tmp_path = tmp.path().to_path_buf();
    let _tmp = if std::env::var_os(ENV_KEEP_TMP).is_some() {
        eprintln!("bench: keeping session logs in {}", tmp_path.display());
        let _ = tmp.keep();
        None
    } else {
        Some(tmp)
    };
    let stdout = std::io::stdout();
    // Targets are interleaved within each run, so load from other processes on the machine
    // spreads over all of them instead of landing on one.
    for run in 1..=settings.runs {
        for &target in &targets {
            eprintln!(
                "bench: [{phase}] run {run}/{} {}",
                settings.runs,
                target.name()
            );
            let mut rec = Record {
                phase: phase.clone(),
                run,
                target: target.name().to_string(),
                ..Record::default()
            };
            let stand_in = match target {
                Target::Wrap(WrapMode::Healthy) => healthy.as_ref(),
                Target::Wrap(WrapMode::BlackHole) => black_hole.as_ref(),
                Target::Wrap(WrapMode::Otlp) => otlp.as_ref(),
                _ => None,
            };
            let before = stand_in.map(counters);
            if let Err(e) = run_target(&mut ctx, &settings, target, &mut rec, healthy.as_ref()) {
                eprintln!("bench: {e}");
                rec.error = Some(e);
            }
            if let (Some(s), Some(b)) = (stand_in, before) {
                let a = counters(s);
                rec.ingest_connections = Some(a.0 - b.0);
                rec.ingest_requests = Some(a.1 - b.1);
            }
            if let Ok(line) = serde_json::to_string(&rec) {
                let mut out = stdout.lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
        }
    }
    0
}

fn counters(s: &ingest::StandIn) -> (u64, u64, u64, u64) {
    (
        s.counters.connections.load(Ordering::Relaxed),
        s.counters.requests.load(Ordering::Relaxed),
        s.counters.events.load(Ordering::Relaxed),
        s.counters.events_not_ok.load(Ordering::Relaxed),
    )
}

/// Env var: keep the phase's temp dir (session stderr logs, `file:` sink output).
const ENV_KEEP_TMP: &str = "BENCH_KEEP_TMP";

/// Env var: print every sequential call slower than this many µs (call index and start offset),
/// to tell periodic stalls from random ones.
const ENV_TRACE_SLOW_US: &str = "BENCH_TRACE_SLOW_US";

fn trace_slow(target: Target, start: std::time::Instant, lat: &[Duration]) {
    let Some(limit) = std::env::var(ENV_TRACE_SLOW_US)
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    else {
        return;
    };
    let mut offset = Duration::ZERO;
    for (i, d) in lat.iter().enumerate() {
        if d.as_secs_f64() * 1e6 > limit {
            eprintln!(
                "bench: slow {} call #{i} at +{:.3} ms: {:.0} µs",
                target.name(),
                offset.as_secs_f64() * 1e3,
                d.as_secs_f64() * 1e6
            );
        }
        offset += *d;
    }
    let _ = start;
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1e6
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// CPU µs per unit by thread name between two snapshots of the same process, plus `(total)`.
fn cpu_delta(
    before: &session::ProcSnap,
    after: &session::ProcSnap,
    units: f64,
) -> BTreeMap<String, f64> {
    per_thread_delta(&before.cpu_ms, &after.cpu_ms, 1000.0 / units.max(1.0))
}

/// `(after − before) × scale` per thread name, with a `(total)` entry.
fn per_thread_delta(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    scale: f64,
) -> BTreeMap<String, f64> {
    let mut m: BTreeMap<String, f64> = after
        .iter()
        .map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (k.clone(), d.max(0.0) * scale)
        })
        .collect();
    let total = m.values().sum();
    m.insert("(total)".into(), total);
    m
}

/// Counts the events the target delivered: from its `file:` sink, or from the healthy ingest.
struct EventCount<'a> {
    ingest: Option<&'a ingest::StandIn>,
}

impl EventCount<'_> {
    fn before(&self) -> (u64, u64) {
        self.ingest.map_or((0, 0), |s| {
            let c = counters(s);
            (c.2, c.3)
        })
    }
    fn after(&self, before: (u64, u64), file: Option<PathBuf>) -> Option<(u64, u64)> {
        match (self.ingest, file) {
            (Some(s), _) => {
                let c = counters(s);
                Some((c.2 - before.0, c.3 - before.1))
            }
            (None, Some(p)) => Some(session::count_file_events(&p)),
            (None, None) => None,
        }
    }
}

/// Longest the pipelined session stays open after its burst for the target to go quiet
/// ([`session::Session::wait_quiet`]): an observer works off a 20,000-call burst in 30–60 ms.
const QUIET_LIMIT: Duration = Duration::from_secs(5);

/// Runs every workload for one target, each in a fresh session, filling `rec`.
fn run_target(
    ctx: &mut Ctx,
    s: &Settings,
    target: Target,
    rec: &mut Record,
    healthy: Option<&ingest::StandIn>,
) -> Result<(), String> {
    let ev = EventCount {
        ingest: if target == Target::Wrap(WrapMode::Healthy) {
            healthy
        } else {
            None
        },
    };
    let note_events = |rec: &mut Record, workload: &str, calls: u64, seen: Option<(u64, u64)>| {
        if let Some((seen, not_ok)) = seen {
            let e = rec.events.entry(workload.to_string()).or_default();
            e.0 += seen;
            e.1 += calls;
            e.2 += not_ok;
        }
    };

    // 1. Sequential latency.
    let b = ev.before();
    let mut sess = Session::start(ctx, target)?;
    for _ in 0..s.warmup {
        if let Err(e) = sess.echo_call() {
            return Err(sess.abort("warm-up call", e));
        }
    }
    let snap0 = sess.snapshot();
    let mut lat = Vec::with_capacity(s.seq_calls as usize);
    let t_seq = std::time::Instant::now();
    for _ in 0..s.seq_calls {
        match sess.echo_call() {
            Ok(d) => lat.push(d),
            Err(e) => return Err(sess.abort("sequential call", e)),
        }
    }
    let snap1 = sess.snapshot();
    trace_slow(target, t_seq, &lat);
    lat.sort();
    rec.seq_p50_us = Some(percentile(&lat, 50.0));
    rec.seq_p99_us = Some(percentile(&lat, 99.0));
    rec.seq_max_us = lat.last().map(|d| d.as_secs_f64() * 1e6);
    rec.cpu_seq_us = cpu_delta(&snap0, &snap1, s.seq_calls as f64);
    let mut rss_small = snap1.hwm_kib;
    let calls = sess.calls;
    rec.calls += calls;
    let file = sess.events_file.clone();
    let fin = sess.finish_watching_peak()?;
    rss_small = rss_small.max(fin.peak_hwm_kib);
    rec.seq_session_cpu_us = Some(fin.session_cpu_ms * 1e3 / (calls as f64).max(1.0));
    note_events(rec, "sequential", calls, ev.after(b, file));

    // 2. Pipelined throughput.
    let b = ev.before();
    let mut sess = Session::start(ctx, target)?;
    let first = sess.take_ids(s.pipe_calls);
    let mut reqs = Vec::with_capacity(s.pipe_calls as usize * 128);
    for id in first..first + s.pipe_calls {
        reqs.extend_from_slice(session::echo_request(id).as_bytes());
    }
    let snap0 = sess.snapshot();
    match sess.pipelined(&reqs, first, s.pipe_calls) {
        Ok((dt, _, _)) => rec.pipe_calls_per_s = Some(s.pipe_calls as f64 / dt.as_secs_f64()),
        Err(e) => return Err(sess.abort("pipelined calls", e)),
    }
    let snap1 = sess.snapshot();
    rec.cpu_pipe_us = cpu_delta(&snap0, &snap1, s.pipe_calls as f64);
    rec.faults_pipe_k = per_thread_delta(
        &snap0.faults,
        &snap1.faults,
        1000.0 / (s.pipe_calls as f64).max(1.0),
    );
    // The burst's last answer is in, and the observer is still well behind: a client that goes
    // on with its session gives it the time to catch up, not a close (which closing at once
    // measured alone, and which leaves the session's end to another workload).
    sess.wait_quiet(QUIET_LIMIT);
    let calls = sess.calls;
    rec.calls += calls;
    let file = sess.events_file.clone();
    let fin = sess.finish_watching_peak()?;
    rec.rss_small_kib = Some(rss_small.max(fin.peak_hwm_kib) as f64);
    rec.pipe_session_cpu_us = Some(fin.session_cpu_ms * 1e3 / (calls as f64).max(1.0));
    note_events(rec, "pipelined", calls, ev.after(b, file));

    // 3. Bandwidth: large responses, requests pipelined so the pipe never idles.
    let b = ev.before();
    let mut sess = Session::start(ctx, target)?;
    let first = sess.take_ids(s.bw_count);
    let mut reqs = Vec::new();
    for id in first..first + s.bw_count {
        reqs.extend_from_slice(session::blob_request(id, s.bw_bytes).as_bytes());
    }
    let snap0 = sess.snapshot();
    match sess.pipelined(&reqs, first, s.bw_count) {
        Ok((dt, bytes, largest)) => {
            rec.bw_mb_per_s = Some(bytes as f64 / 1e6 / dt.as_secs_f64());
            rec.bw_frame_bytes = Some(largest as f64);
            let snap1 = sess.snapshot();
            rec.cpu_bw_us_per_mb = cpu_delta(&snap0, &snap1, bytes as f64 / 1e6);
            rec.faults_bw_per_mb =
                per_thread_delta(&snap0.faults, &snap1.faults, 1e6 / (bytes as f64).max(1.0));
            rec.rss_big_kib = Some(snap1.hwm_kib as f64);
        }
        Err(e) => return Err(sess.abort("large responses", e)),
    }
    let calls = sess.calls;
    rec.calls += calls;
    let file = sess.events_file.clone();
    let fin = sess.finish_watching_peak()?;
    rec.rss_big_kib = rec.rss_big_kib.map(|r| r.max(fin.peak_hwm_kib as f64));
    note_events(rec, "5MB", calls, ev.after(b, file));

    // 4. Close → exit with answers still in flight; every byte must arrive.
    let mut closes = Vec::new();
    for _ in 0..s.close_samples {
        let b = ev.before();
        let mut sess = Session::start(ctx, target)?;
        let first = sess.take_ids(s.close_echoes + 1);
        let mut reqs = Vec::new();
        for id in first..first + s.close_echoes {
            reqs.extend_from_slice(session::echo_request(id).as_bytes());
        }
        reqs.extend_from_slice(
            session::blob_request(first + s.close_echoes, s.close_blob).as_bytes(),
        );
        if let Err(e) = sess.send_unanswered(&reqs, s.close_echoes + 1) {
            return Err(sess.abort("requests before close", e));
        }
        let calls = sess.calls;
        rec.calls += calls;
        let file = sess.events_file.clone();
        let fin = sess.finish()?;
        note_events(rec, "close", calls, ev.after(b, file));
        if fin.lines != s.close_echoes + 1 || fin.bytes < s.close_blob as u64 {
            return Err(format!(
                "{}: after close only {} of {} answers ({} bytes) arrived",
                target.name(),
                fin.lines,
                s.close_echoes + 1,
                fin.bytes
            ));
        }
        closes.push(fin.close_to_exit.as_secs_f64() * 1e3);
    }
    rec.close_ms = median(closes);
    Ok(())
}
