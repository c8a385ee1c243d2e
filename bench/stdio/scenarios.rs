//! The rows of issue 20 that are whole scenarios rather than workloads of the main table: a
//! typical session driven by each official SDK client (Python, TypeScript, Rust), a one-shot
//! start-up, the sequential latency and the exit after a burst with every CPU kept busy, and a
//! flood of calls the server never answers. They run after the main phases, unpinned, each target in its own
//! fresh sessions, targets interleaved run by run. `wrap:file-no-<name>` targets (`--ablate`)
//! run wherever `wrap:file` does.
//!
//! Like the rest of the bench they measure and report; a miss is printed, never failed on.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::roles::ServerMode;
use crate::session::{self, Ctx, Launch, Session, Target, WrapMode};
use crate::typical::{self, TypicalRec};
use crate::{median, percentile};

/// The scenario names `--scenarios` takes, in the order they run.
pub const NAMES: [&str; 4] = ["typical", "oneshot", "contended", "flood"];

/// Issue 20 targets.
const TYPICAL_RSS_MAX_MIB: f64 = 6.0;
const TYPICAL_CLOSE_MAX_MS: f64 = 5.0;
const ONESHOT_ADDED_MAX_MS: f64 = 2.0;
const CONTENDED_P99_MAX: f64 = 1.3;
/// The wrapper's default `--shutdown-flush-ms`: it must exit within this of its server.
const SHUTDOWN_FLUSH_MS: f64 = 2000.0;
const FLOOD_RSS_MAX_MIB: f64 = 32.0;
/// A target still running this long after stdin was closed is killed and reported so.
const EXIT_DEADLINE: Duration = Duration::from_secs(30);

const MIB: f64 = 1024.0;

/// Where the contended row also reads the sequential calls' latency: of the full run's 1,000
/// calls p99 is the tenth slowest, and the percentiles around it show whether a miss is a band
/// of calls that got slower or a few stalls.
const TAIL_PERCENTILES: [f64; 4] = [90.0, 95.0, 99.0, 99.5];

/// What the scenarios run, and how much of it.
#[derive(Debug, Clone)]
pub struct Plan {
    pub which: Vec<String>,
    pub typical_runs: u32,
    pub typical_calls: u32,
    pub oneshot_samples: u32,
    pub contended_runs: u32,
    pub contended_warmup: u64,
    pub contended_seq: u64,
    pub contended_burst: u64,
    /// Smoke runs measure the relay only under contention: a wrapper that does not exit would
    /// hold `cargo test` for the whole exit deadline.
    pub contended_relay_only: bool,
    /// Run the contended targets as the harness's own user even when it is root
    /// (`--contended-own-user`; by default root drops to `nobody` for them, see
    /// `Ctx::unprivileged`).
    pub contended_own_user: bool,
    pub flood_calls: u64,
    /// How long the wrapper's peak RSS must stay put after the flood before stdin is closed.
    pub flood_settle: Duration,
    /// `wrap:file` with one mechanism switched off, run wherever `wrap:file` runs.
    pub ablations: Vec<Target>,
    /// Set when the typical session is skipped (smoke run).
    pub typical_skip: Option<String>,
}

impl Plan {
    pub fn full(ablations: Vec<Target>) -> Plan {
        Plan {
            which: NAMES.map(String::from).to_vec(),
            typical_runs: 5,
            typical_calls: 50,
            oneshot_samples: 20,
            contended_runs: 3,
            contended_warmup: 100,
            contended_seq: 1_000,
            contended_burst: 20_000,
            contended_relay_only: false,
            contended_own_user: false,
            flood_calls: 300_000,
            flood_settle: Duration::from_secs(1),
            ablations,
            typical_skip: None,
        }
    }

    pub fn quick(ablations: Vec<Target>) -> Plan {
        Plan {
            typical_runs: 1,
            contended_runs: 1,
            contended_warmup: 50,
            contended_seq: 300,
            ..Plan::full(ablations)
        }
    }

    /// A second or two: every scenario's plumbing, no meaningful figures.
    pub fn smoke(ablations: Vec<Target>) -> Plan {
        Plan {
            typical_runs: 1,
            oneshot_samples: 3,
            contended_runs: 1,
            contended_warmup: 5,
            contended_seq: 30,
            contended_burst: 300,
            contended_relay_only: true,
            contended_own_user: false,
            flood_calls: 3_000,
            flood_settle: Duration::from_millis(100),
            typical_skip: Some(
                "skipped in the smoke run (node and the Python SDK take seconds to start); \
                 `cargo bench --bench stdio -- --quick` runs it"
                    .into(),
            ),
            ..Plan::full(ablations)
        }
    }

    fn with_ablations(&self, base: &[Target]) -> Vec<Target> {
        let mut v = base.to_vec();
        if base.contains(&Target::Wrap(WrapMode::File)) {
            v.extend(self.ablations.iter().copied());
        }
        v
    }

    fn runs(&self, name: &str) -> bool {
        self.which.iter().any(|w| w == name)
    }
}

/// Every scenario's records, for the report and bench/out/stdio-scenarios.json.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Results {
    pub typical: Vec<TypicalRec>,
    pub typical_skipped: Option<String>,
    pub oneshot: Vec<OneShotRec>,
    pub contended: Vec<ContendedRec>,
    pub spinners: usize,
    /// The uid the contended targets ran as, when the harness dropped root for them.
    #[serde(default)]
    pub contended_uid: Option<u32>,
    pub flood: Vec<FloodRec>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OneShotRec {
    pub target: String,
    /// Wall time of each session, ms.
    pub wall_ms: Vec<f64>,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ContendedRec {
    pub target: String,
    pub run: u32,
    /// The session (driver, target, server) was pinned to one CPU, beside that CPU's busy loop
    /// (see [`Placement`]).
    #[serde(default)]
    pub pinned: bool,
    pub errors: Vec<String>,
    pub seq_p50_us: Option<f64>,
    pub seq_p99_us: Option<f64>,
    /// The sequential calls at [`TAIL_PERCENTILES`], µs.
    #[serde(default)]
    pub seq_tail_us: Option<[f64; TAIL_PERCENTILES.len()]>,
    pub burst_calls_per_s: Option<f64>,
    /// Close → the server's exit, after the burst, ms.
    pub burst_server_exit_ms: Option<f64>,
    /// Close → the target's exit, after the burst, ms; `None` when it was killed.
    pub burst_exit_ms: Option<f64>,
    /// How the target ended after the burst.
    pub burst_ending: Option<String>,
    /// Events in the `file:` sink after the burst session, and the burst's `tools/call`s.
    pub burst_events: Option<(u64, u64)>,
    /// Close → exit of the sequential session, ms (`None`: killed).
    pub seq_exit_ms: Option<f64>,
    pub seq_ending: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FloodRec {
    pub target: String,
    pub error: Option<String>,
    /// Writing the calls until the server had read them all, s.
    pub write_s: Option<f64>,
    /// VmHWM when the server had read every call, KiB.
    pub hwm_written_kib: Option<f64>,
    /// VmHWM once it stopped growing, and the last read before the exit, KiB.
    pub hwm_settled_kib: Option<f64>,
    pub hwm_final_kib: Option<f64>,
    pub exit_ms: Option<f64>,
    pub ending: Option<String>,
    pub events: Option<u64>,
}

/// Runs the scenarios of `plan`, printing progress on stderr.
pub fn run(ctx: &mut Ctx, plan: &Plan) -> Results {
    let mut res = Results::default();
    if plan.runs("typical") {
        match (&plan.typical_skip, typical::available()) {
            (Some(why), _) => res.typical_skipped = Some(why.clone()),
            (None, Err(why)) => {
                res.typical_skipped = Some(format!("left out: {why}; run scripts/test-deps.sh"))
            }
            (None, Ok(())) => {
                let targets = plan.with_ablations(&[
                    Target::Direct,
                    Target::Relay,
                    Target::Wrap(WrapMode::NoIngest),
                    Target::Wrap(WrapMode::File),
                    Target::Wrap(WrapMode::Otlp),
                ]);
                for run in 1..=plan.typical_runs {
                    for client in typical::Client::ALL {
                        for (k, _) in targets.iter().enumerate() {
                            // Rotating order, so no target always follows the same one.
                            let t = targets[(k + run as usize - 1) % targets.len()];
                            eprintln!(
                                "bench: [typical] run {run}/{} {} client, {}",
                                plan.typical_runs,
                                client.name(),
                                t.name()
                            );
                            let rec = typical::run(ctx, client, t, run, plan.typical_calls);
                            if let Some(e) = &rec.error {
                                eprintln!("bench: {e}");
                            }
                            res.typical.push(rec);
                        }
                    }
                }
            }
        }
    }
    if plan.runs("oneshot") {
        res.oneshot = oneshot(ctx, plan);
    }
    if plan.runs("contended") {
        let (spinners, uid, recs) = contended(ctx, plan);
        res.contended_uid = uid;
        res.spinners = spinners;
        res.contended = recs;
    }
    if plan.runs("flood") {
        let targets = plan.with_ablations(&[Target::Relay, Target::Wrap(WrapMode::File)]);
        for t in targets {
            eprintln!(
                "bench: [flood] {} × {} unanswered calls",
                t.name(),
                plan.flood_calls
            );
            res.flood.push(flood(ctx, t, plan));
        }
    }
    res
}

// ---- one-shot start-up -------------------------------------------------------------------

fn oneshot(ctx: &mut Ctx, plan: &Plan) -> Vec<OneShotRec> {
    let targets = plan.with_ablations(&[
        Target::Direct,
        Target::Relay,
        Target::Wrap(WrapMode::NoIngest),
        Target::Wrap(WrapMode::File),
        Target::Wrap(WrapMode::Otlp),
    ]);
    eprintln!(
        "bench: [oneshot] {} sessions per target, interleaved",
        plan.oneshot_samples
    );
    let mut recs: Vec<OneShotRec> = targets
        .iter()
        .map(|t| OneShotRec {
            target: t.name().into(),
            ..OneShotRec::default()
        })
        .collect();
    for i in 0..plan.oneshot_samples as usize {
        for k in 0..targets.len() {
            let k = (k + i) % targets.len();
            match oneshot_session(ctx, targets[k]) {
                Ok(d) => recs[k].wall_ms.push(d.as_secs_f64() * 1e3),
                Err(e) => recs[k].errors.push(e),
            }
        }
    }
    recs
}

/// Spawn → `initialize` answered → stdin closed → the target exited and its stdout ended.
fn oneshot_session(ctx: &mut Ctx, target: Target) -> Result<Duration, String> {
    let label = ctx.label(target);
    let server = ctx.bench_server(ServerMode::OneShot);
    let launch = Launch::new(ctx, target, &server, &label)?;
    let stderr_path = ctx.tmp.join(format!("{label}.stderr"));
    let stderr = std::fs::File::create(&stderr_path).map_err(|e| format!("stderr log: {e}"))?;
    let mut cmd = launch.command();
    cmd.process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr));
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{}: cannot spawn: {e}", target.name()))?;
    let _watchdog = session::start_watchdog(child.id(), EXIT_DEADLINE);
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        session::kill_group(child.id());
        let _ = child.wait();
        return Err("child pipes missing".into());
    };
    let mut out = BufReader::new(stdout);
    let mut line = String::new();
    let answered = stdin
        .write_all(session::INITIALIZE.as_bytes())
        .and_then(|()| out.read_line(&mut line));
    drop(stdin);
    let mut rest = Vec::new();
    let _ = out.read_to_end(&mut rest);
    let status = child.wait().map_err(|e| format!("wait: {e}"))?;
    let wall = t0.elapsed();
    let fail = |what: String| {
        format!(
            "{}: {what}; stderr: {}",
            target.name(),
            session::stderr_tail(&stderr_path)
        )
    };
    match answered {
        Ok(_) if line.starts_with(&session::response_prefix(0)) => {}
        Ok(_) => return Err(fail(format!("no answer to initialize (got {line:?})"))),
        Err(e) => return Err(fail(format!("initialize: {e}"))),
    }
    if !status.success() {
        return Err(fail(session::describe(status)));
    }
    Ok(wall)
}

// ---- contended ---------------------------------------------------------------------------

/// Busy loops, one thread per online CPU, until dropped. They run in the normal scheduling
/// class at the harness's own niceness, which the wrapper's normal threads share. Each is pinned
/// to its CPU, so every CPU keeps exactly one busy loop whatever the session does.
struct Spinners {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Spinners {
    fn start(cpus: &[usize]) -> Spinners {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = cpus
            .iter()
            .filter_map(|&cpu| {
                let stop = stop.clone();
                thread::Builder::new()
                    .name(format!("bench-spin-{cpu}"))
                    .spawn(move || {
                        let _ = pin_current_thread(&[cpu]);
                        while !stop.load(Ordering::Relaxed) {
                            std::hint::spin_loop();
                        }
                    })
                    .ok()
            })
            .collect();
        Spinners { stop, threads }
    }
}

/// Restricts the calling thread (and what it spawns from now on: threads, the target and its
/// server) to `cpus`; returns the affinity it had, to restore.
fn pin_current_thread(cpus: &[usize]) -> Result<CpuSet, String> {
    let me = Pid::from_raw(0);
    let before = sched_getaffinity(me).map_err(|e| format!("sched_getaffinity: {e}"))?;
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c).map_err(|e| format!("cpu {c}: {e}"))?;
    }
    sched_setaffinity(me, &set).map_err(|e| format!("sched_setaffinity: {e}"))?;
    Ok(before)
}

/// Where the contended row's sessions run. On a VM a wake-up across CPUs costs far more than
/// one on the same CPU (a pipe ping-pong on the 2-core machine of 2026-12-01: 4.7 µs per round
/// trip on one CPU, 37 µs across two; with a busy loop on each CPU 5.3 and 25 µs, p99 11 µs and
/// 2.9 ms), so unpinned, a sequential call's cost depends on where the scheduler happened to put
/// the driver, the target's threads and the server: some runs of any target (the minimal relay's
/// equal, `wrap:none`, too) took ~35 µs per call. Pinned, the session shares one CPU with that
/// CPU's busy loop, every wrapper thread competes on it, and placement is no longer a variable:
/// the issue targets apply there; the unpinned row is kept for reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    Pinned,
    Unpinned,
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The online CPUs (/sys/devices/system/cpu/online, e.g. `0-1,4`); `0..n` for the usable count
/// if unreadable.
fn online_cpus() -> Vec<usize> {
    let listed: Vec<usize> = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .map(|s| {
            s.trim()
                .split(',')
                .flat_map(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    match (a.parse::<usize>(), b.parse::<usize>()) {
                        (Ok(a), Ok(b)) if a <= b => (a..=b).collect(),
                        _ => Vec::new(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    if listed.is_empty() {
        (0..thread::available_parallelism().map_or(1, |n| n.get())).collect()
    } else {
        listed
    }
}

fn contended(ctx: &mut Ctx, plan: &Plan) -> (usize, Option<u32>, Vec<ContendedRec>) {
    let targets = if plan.contended_relay_only {
        vec![Target::Relay]
    } else {
        plan.with_ablations(&[
            Target::Relay,
            Target::Wrap(WrapMode::NoIngest),
            Target::Wrap(WrapMode::File),
        ])
    };
    let cpus = online_cpus();
    let n = cpus.len();
    ctx.run_as = if plan.contended_own_user {
        None
    } else {
        ctx.unprivileged()
    };
    eprintln!(
        "bench: [contended] {n} busy loop(s) running; targets run as {}",
        ctx.run_as
            .map_or_else(|| "the harness's user".to_string(), |u| format!("uid {u}"))
    );
    let spinners = Spinners::start(&cpus);
    let mut recs = Vec::new();
    for run in 1..=plan.contended_runs {
        for placement in [Placement::Pinned, Placement::Unpinned] {
            for &t in &targets {
                let pinned = placement == Placement::Pinned;
                eprintln!(
                    "bench: [contended] run {run}/{} {} {}",
                    plan.contended_runs,
                    if pinned { "pinned" } else { "unpinned" },
                    t.name()
                );
                let mut rec = ContendedRec {
                    target: t.name().into(),
                    run,
                    pinned,
                    ..ContendedRec::default()
                };
                let restore = if pinned {
                    match pin_current_thread(&cpus[..1]) {
                        Ok(before) => Some(before),
                        Err(e) => {
                            rec.errors.push(format!("pinning the session: {e}"));
                            recs.push(rec);
                            continue;
                        }
                    }
                } else {
                    None
                };
                if let Err(e) = contended_seq(ctx, t, plan, &mut rec) {
                    rec.errors.push(e);
                }
                if let Err(e) = contended_burst(ctx, t, plan, &mut rec) {
                    rec.errors.push(e);
                }
                if let Some(before) = restore {
                    let _ = sched_setaffinity(Pid::from_raw(0), &before);
                }
                for e in &rec.errors {
                    eprintln!("bench: {e}");
                }
                recs.push(rec);
            }
        }
    }
    drop(spinners);
    let uid = ctx.run_as.take();
    (n, uid, recs)
}

fn contended_seq(
    ctx: &mut Ctx,
    t: Target,
    plan: &Plan,
    rec: &mut ContendedRec,
) -> Result<(), String> {
    let mut sess = Session::start(ctx, t)?;
    for _ in 0..plan.contended_warmup {
        if let Err(e) = sess.echo_call() {
            return Err(sess.abort("warm-up call", e));
        }
    }
    let mut lat = Vec::with_capacity(plan.contended_seq as usize);
    for _ in 0..plan.contended_seq {
        match sess.echo_call() {
            Ok(d) => lat.push(d),
            Err(e) => return Err(sess.abort("sequential call", e)),
        }
    }
    lat.sort();
    rec.seq_p50_us = Some(percentile(&lat, 50.0));
    rec.seq_p99_us = Some(percentile(&lat, 99.0));
    rec.seq_tail_us = Some(TAIL_PERCENTILES.map(|p| percentile(&lat, p)));
    let w = sess.close_watched(EXIT_DEADLINE);
    rec.seq_exit_ms = w.close_to_exit.map(|d| d.as_secs_f64() * 1e3);
    rec.seq_ending = Some(w.ending);
    Ok(())
}

fn contended_burst(
    ctx: &mut Ctx,
    t: Target,
    plan: &Plan,
    rec: &mut ContendedRec,
) -> Result<(), String> {
    let mut sess = Session::start(ctx, t)?;
    let n = plan.contended_burst;
    let first = sess.take_ids(n);
    let mut reqs = Vec::with_capacity(n as usize * 128);
    for id in first..first + n {
        reqs.extend_from_slice(session::echo_request(id).as_bytes());
    }
    match sess.pipelined(&reqs, first, n) {
        Ok((dt, _, _)) => rec.burst_calls_per_s = Some(n as f64 / dt.as_secs_f64()),
        Err(e) => return Err(sess.abort("burst", e)),
    }
    let file = sess.events_file.clone();
    let w = sess.close_watched(EXIT_DEADLINE);
    rec.burst_exit_ms = w.close_to_exit.map(|d| d.as_secs_f64() * 1e3);
    rec.burst_server_exit_ms = w.close_to_server_exit.map(|d| d.as_secs_f64() * 1e3);
    rec.burst_ending = Some(w.ending);
    if let Some(f) = file {
        rec.burst_events = Some((session::count_file_events(&f).0, n));
    }
    Ok(())
}

// ---- flood of unanswered calls -------------------------------------------------------------

/// Calls per write while flooding.
const FLOOD_CHUNK: u64 = 10_000;

fn flood(ctx: &mut Ctx, t: Target, plan: &Plan) -> FloodRec {
    let mut rec = FloodRec {
        target: t.name().into(),
        ..FloodRec::default()
    };
    if let Err(e) = flood_into(ctx, t, plan, &mut rec) {
        eprintln!("bench: {e}");
        rec.error = Some(e);
    }
    rec
}

fn flood_into(ctx: &mut Ctx, t: Target, plan: &Plan, rec: &mut FloodRec) -> Result<(), String> {
    let calls = plan.flood_calls;
    let server = ctx.bench_server(ServerMode::Mute);
    let mut sess = Session::start_with(ctx, t, &server)?;
    let pid = sess.pid();
    let t0 = Instant::now();
    let mut sent = 0;
    let mut buf = Vec::with_capacity(FLOOD_CHUNK as usize * 128);
    while sent < calls {
        let n = FLOOD_CHUNK.min(calls - sent);
        let first = sess.take_ids(n);
        buf.clear();
        for id in first..first + n {
            buf.extend_from_slice(session::echo_request(id).as_bytes());
        }
        if let Err(e) = sess.send_unanswered(&buf, n) {
            return Err(sess.abort("flood", e));
        }
        sent += n;
    }
    // The mute server answers tools/list: once it has, it has read every call before it.
    if let Err(e) = sess.list_tools() {
        return Err(sess.abort("tools/list after the flood", e));
    }
    rec.write_s = Some(t0.elapsed().as_secs_f64());
    let written = session::read_hwm(pid).unwrap_or(0);
    rec.hwm_written_kib = Some(written as f64);
    // The observer may still be working through what the relay handed it: wait until the peak
    // has not moved for `flood_settle` (at most 20 s).
    let mut last = written;
    let mut still_since = Instant::now();
    let settle_start = Instant::now();
    while still_since.elapsed() < plan.flood_settle
        && settle_start.elapsed() < Duration::from_secs(20)
    {
        thread::sleep(Duration::from_millis(50));
        let h = session::read_hwm(pid).unwrap_or(last);
        if h != last {
            last = h;
            still_since = Instant::now();
        }
    }
    rec.hwm_settled_kib = Some(last as f64);
    let file = sess.events_file.clone();
    let w = sess.close_watched(EXIT_DEADLINE);
    rec.hwm_final_kib = Some(w.hwm_kib.max(last) as f64);
    rec.exit_ms = w.close_to_exit.map(|d| d.as_secs_f64() * 1e3);
    rec.ending = Some(w.ending);
    rec.events = file.map(|f| session::count_file_events(&f).0);
    Ok(())
}

// ---- report --------------------------------------------------------------------------------

fn f(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.decimals$}"),
        _ => "-".into(),
    }
}

fn verdict(v: Option<f64>, ok: impl Fn(f64) -> bool) -> &'static str {
    match v {
        Some(x) if x.is_finite() => {
            if ok(x) {
                "PASS"
            } else {
                "MISS"
            }
        }
        _ => "n/a",
    }
}

fn observed(name: &str) -> bool {
    Target::parse(name).is_some_and(Target::is_file)
}

fn is_wrapper(name: &str) -> bool {
    matches!(Target::parse(name), Some(Target::Wrap(_)))
}

/// Target names in first-seen order.
fn names<'a>(it: impl Iterator<Item = &'a String>) -> Vec<&'a String> {
    let mut v: Vec<&String> = Vec::new();
    for n in it {
        if !v.contains(&n) {
            v.push(n);
        }
    }
    v
}

pub fn render(plan: &Plan, res: &Results) -> String {
    let mut o = String::new();
    if plan.runs("typical") {
        render_typical(&mut o, plan, res);
    }
    if plan.runs("oneshot") {
        render_oneshot(&mut o, plan, res);
    }
    if plan.runs("contended") {
        render_contended(&mut o, plan, res);
    }
    if plan.runs("flood") {
        render_flood(&mut o, plan, res);
    }
    o
}

fn render_typical(o: &mut String, plan: &Plan, res: &Results) {
    if let Some(why) = &res.typical_skipped {
        let _ = writeln!(
            o,
            "\n== typical session: official SDK clients → server-everything over stdio\n\ntypical session {why}"
        );
        return;
    }
    for client in typical::Client::ALL {
        let recs: Vec<TypicalRec> = res
            .typical
            .iter()
            .filter(|r| r.client == client.name())
            .cloned()
            .collect();
        render_typical_client(o, plan, client, &recs);
    }
}

fn render_typical_client(o: &mut String, plan: &Plan, client: typical::Client, typ: &[TypicalRec]) {
    let _ = writeln!(
        o,
        "\n== typical session: official {} client → server-everything over stdio, {} tools/call (echo); \
         medians of {} interleaved run(s), unpinned\n",
        client.name(),
        plan.typical_calls,
        plan.typical_runs
    );
    let _ = writeln!(
        o,
        "{:<22} {:>18} {:>14} {:>14} {:>18} {:>12} {:>12} {:>10}",
        "target",
        "peak RSS MiB",
        "server exit",
        "close→exit",
        "after server",
        "SDK sees",
        "calls ms",
        "events"
    );
    let _ = writeln!(
        o,
        "{:<22} {:>18} {:>14} {:>14} {:>18}",
        "",
        format!("obs. ≤ {TYPICAL_RSS_MAX_MIB:.0}"),
        "ms",
        "ms",
        format!("ms, wrap ≤ {TYPICAL_CLOSE_MAX_MS:.0}")
    );
    for name in names(typ.iter().map(|r| &r.target)) {
        let recs: Vec<&TypicalRec> = typ.iter().filter(|r| &r.target == name).collect();
        let m =
            |g: fn(&TypicalRec) -> Option<f64>| median(recs.iter().filter_map(|r| g(r)).collect());
        let rss = m(|r| r.hwm_kib).map(|k| k / MIB);
        let after = m(|r| Some(r.close_to_exit_ms? - r.close_to_server_exit_ms?));
        let rss_cell = if observed(name) {
            format!(
                "{} {}",
                f(rss, 1),
                verdict(rss, |x| x <= TYPICAL_RSS_MAX_MIB)
            )
        } else {
            f(rss, 1)
        };
        let after_cell = if is_wrapper(name) {
            format!(
                "{} {}",
                f(after, 2),
                verdict(after, |x| x <= TYPICAL_CLOSE_MAX_MS)
            )
        } else {
            f(after, 2)
        };
        let (seen, made) = recs
            .iter()
            .filter_map(|r| r.events)
            .fold((0, 0), |a, e| (a.0 + e.0, a.1 + e.1));
        let label = if name == "direct" {
            "direct (node itself)".to_string()
        } else {
            name.clone()
        };
        let _ = writeln!(
            o,
            "{label:<22} {rss_cell:>18} {:>14} {:>14} {after_cell:>18} {:>12} {:>12} {:>10}",
            f(m(|r| r.close_to_server_exit_ms), 1),
            f(m(|r| r.close_to_exit_ms), 1),
            f(m(|r| r.close_to_context_exit_ms), 1),
            f(m(|r| r.calls_ms), 1),
            if made > 0 {
                format!("{seen}/{made}")
            } else {
                "-".into()
            },
        );
        let errors: Vec<&String> = recs.iter().filter_map(|r| r.error.as_ref()).collect();
        if let Some(e) = errors.first() {
            let _ = writeln!(
                o,
                "  {name} FAILED in {} of {} run(s): {e}",
                errors.len(),
                recs.len()
            );
        }
    }
    let _ = writeln!(
        o,
        "(peak RSS = VmHWM of the process the SDK spawned, last read before it exited; from the SDK closing \
         (Python, Rust) or shutting down (TypeScript) its stdin, noted by the client: server exit = → node exited, \
         close→exit = → that process exited (/proc polled every 0.25 ms), after server = their difference, \
         what the wrapper adds to the exit; SDK sees = → the client was done with the session (the Python \
         SDK polls every 10 ms); events = file sink events / calls, summed)"
    );
}

fn render_oneshot(o: &mut String, plan: &Plan, res: &Results) {
    let _ = writeln!(
        o,
        "\n== one-shot start-up: spawn → initialize answered → stdin closed → exited, the server answering one \
         initialize and exiting; median of {} session(s) per target, interleaved, unpinned\n",
        plan.oneshot_samples
    );
    let _ = writeln!(
        o,
        "{:<22} {:>10} {:>24}",
        "target",
        "wall ms",
        format!("over direct (obs. ≤ {ONESHOT_ADDED_MAX_MS:.0})")
    );
    let direct = res
        .oneshot
        .iter()
        .find(|r| r.target == "direct")
        .and_then(|r| median(r.wall_ms.clone()));
    for r in &res.oneshot {
        let wall = median(r.wall_ms.clone());
        let added = match (wall, direct) {
            (Some(w), Some(d)) if r.target != "direct" => Some(w - d),
            _ => None,
        };
        let cell = if observed(&r.target) {
            format!(
                "{} {}",
                f(added, 2),
                verdict(added, |x| x <= ONESHOT_ADDED_MAX_MS)
            )
        } else {
            f(added, 2)
        };
        let _ = writeln!(o, "{:<22} {:>10} {:>24}", r.target, f(wall, 2), cell);
        if let Some(e) = r.errors.first() {
            let _ = writeln!(
                o,
                "  {} FAILED in {} of {} session(s): {e}",
                r.target,
                r.errors.len(),
                r.errors.len() + r.wall_ms.len()
            );
        }
    }
}

fn render_contended(o: &mut String, plan: &Plan, res: &Results) {
    let _ = writeln!(
        o,
        "\n== contended: {} busy loop(s) (one per online CPU, normal class, the harness's niceness) throughout; {} sequential calls \
         (after {} warm-up), then in a fresh session a burst of {} pipelined calls and stdin closed; \
         medians of {} run(s); targets run as {}\n",
        res.spinners,
        plan.contended_seq,
        plan.contended_warmup,
        plan.contended_burst,
        plan.contended_runs,
        res.contended_uid
            .map_or_else(|| "the harness's user".to_string(), |u| format!("uid {u} (unprivileged)"))
    );
    if plan.contended_relay_only {
        let _ = writeln!(
            o,
            "(smoke run: the relay only; a wrapper that does not exit would hold the test run for {} s)",
            EXIT_DEADLINE.as_secs()
        );
    }
    for pinned in [true, false] {
        let recs_here: Vec<&ContendedRec> = res
            .contended
            .iter()
            .filter(|r| r.pinned == pinned)
            .collect();
        if recs_here.is_empty() {
            continue;
        }
        let _ = writeln!(
            o,
            "{}",
            if pinned {
                "-- pinned: driver, target and server on the first online CPU, beside its busy loop; the issue targets apply here"
            } else {
                "-- unpinned, for reference: where the scheduler places the session's threads decides the cost of a call"
            }
        );
        let _ = writeln!(
            o,
            "{:<22} {:>8} {:>8} {:>16} {:>10} {:>14} {:>32} {:>22} {:>15} {:>16}",
            "target",
            "p50 µs",
            "p99 µs",
            format!("p99×relay ≤ {CONTENDED_P99_MAX}"),
            "burst/s",
            "server exit ms",
            "close→exit ms",
            format!("after server ≤ {SHUTDOWN_FLUSH_MS:.0}"),
            "burst events",
            "seq close→exit"
        );
        let relay_p99 = median(
            recs_here
                .iter()
                .filter(|r| r.target == "relay")
                .filter_map(|r| r.seq_p99_us)
                .collect(),
        );
        for name in names(recs_here.iter().map(|r| &r.target)) {
            let recs: Vec<&ContendedRec> = recs_here
                .iter()
                .copied()
                .filter(|r| &r.target == name)
                .collect();
            let m = |g: fn(&ContendedRec) -> Option<f64>| {
                median(recs.iter().filter_map(|r| g(r)).collect())
            };
            let p99 = m(|r| r.seq_p99_us);
            let p99_ratio = match (p99, relay_p99) {
                (Some(p), Some(r)) if r > 0.0 && name != "relay" => Some(p / r),
                _ => None,
            };
            let ratio_cell = if name == "relay" {
                "-".to_string()
            } else {
                format!(
                    "{} {}",
                    f(p99_ratio, 2),
                    verdict(p99_ratio, |x| x <= CONTENDED_P99_MAX)
                )
            };
            let killed = |g: fn(&ContendedRec) -> Option<&String>| {
                recs.iter()
                    .filter(|r| g(r).is_some_and(|e| e.contains("killed")))
                    .count()
            };
            let burst_killed = killed(|r| r.burst_ending.as_ref());
            let exit = m(|r| r.burst_exit_ms);
            let exit_cell = if burst_killed > 0 {
                format!(
                    "no exit in {} s (killed) {burst_killed}/{}",
                    EXIT_DEADLINE.as_secs(),
                    recs.len()
                )
            } else {
                f(exit, 2)
            };
            let after = m(|r| Some(r.burst_exit_ms? - r.burst_server_exit_ms?));
            let after_cell = if burst_killed > 0 {
                "MISS".to_string()
            } else if is_wrapper(name) {
                format!(
                    "{} {}",
                    f(after, 2),
                    verdict(after, |x| x <= SHUTDOWN_FLUSH_MS)
                )
            } else {
                f(after, 2)
            };
            let (seen, made) = recs
                .iter()
                .filter_map(|r| r.burst_events)
                .fold((0, 0), |a, e| (a.0 + e.0, a.1 + e.1));
            let seq_killed = killed(|r| r.seq_ending.as_ref());
            let seq_cell = if seq_killed > 0 {
                format!("killed {seq_killed}/{}", recs.len())
            } else {
                f(m(|r| r.seq_exit_ms), 2)
            };
            let _ = writeln!(
                o,
                "{name:<22} {:>8} {:>8} {ratio_cell:>16} {:>10} {:>14} {exit_cell:>32} {after_cell:>22} {:>15} {seq_cell:>16}",
                f(m(|r| r.seq_p50_us), 0),
                f(p99, 0),
                f(m(|r| r.burst_calls_per_s), 0),
                f(m(|r| r.burst_server_exit_ms), 2),
                if made > 0 { format!("{seen}/{made}") } else { "-".into() },
            );
            for r in &recs {
                for e in &r.errors {
                    let _ = writeln!(o, "  {name} run {}: {e}", r.run);
                }
                for ending in [&r.burst_ending, &r.seq_ending].into_iter().flatten() {
                    if !ending.starts_with("exited with code 0") {
                        let _ = writeln!(o, "  {name} run {}: {ending}", r.run);
                    }
                }
            }
        }
        let _ = writeln!(
            o,
            "  sequential calls at {}, µs (medians):",
            TAIL_PERCENTILES.map(|p| format!("p{p}")).join(" / ")
        );
        for name in names(recs_here.iter().map(|r| &r.target)) {
            let tails: Vec<[f64; TAIL_PERCENTILES.len()]> = recs_here
                .iter()
                .filter(|r| &r.target == name)
                .filter_map(|r| r.seq_tail_us)
                .collect();
            let cols: Vec<String> = (0..TAIL_PERCENTILES.len())
                .map(|k| f(median(tails.iter().map(|t| t[k]).collect()), 1))
                .collect();
            let _ = writeln!(o, "  {name:<20} {}", cols.join(" / "));
        }
    }
    let _ = writeln!(
        o,
        "(server exit / close→exit: from our close of the target's stdin after the burst (every answer read) to the \
         server's exit and to the target's; after server = their difference, target within the wrapper's \
         --shutdown-flush-ms; burst events = file sink events of the burst session / its calls, summed; \
         seq close→exit = the same close → exit for the sequential session)"
    );
}

fn render_flood(o: &mut String, plan: &Plan, res: &Results) {
    let _ = writeln!(
        o,
        "\n== flood: {} tools/call the server reads and never answers, written back to back; then tools/list \
         answered, RSS left to settle, stdin closed; one run, unpinned\n",
        plan.flood_calls
    );
    let _ = writeln!(
        o,
        "{:<22} {:>20} {:>10} {:>12} {:>12} {:>14} {:>10}",
        "target",
        format!("peak RSS MiB obs.≤{FLOOD_RSS_MAX_MIB:.0}"),
        "write s",
        "written MiB",
        "settled MiB",
        "close→exit ms",
        "events"
    );
    for r in &res.flood {
        let peak = r.hwm_final_kib.map(|k| k / MIB);
        let cell = if observed(&r.target) {
            format!(
                "{} {}",
                f(peak, 1),
                verdict(peak, |x| x <= FLOOD_RSS_MAX_MIB)
            )
        } else {
            f(peak, 1)
        };
        let exit = match (&r.ending, r.exit_ms) {
            (Some(e), None) => e.clone(),
            (_, v) => f(v, 1),
        };
        let _ = writeln!(
            o,
            "{:<22} {cell:>20} {:>10} {:>12} {:>12} {exit:>14} {:>10}",
            r.target,
            f(r.write_s, 2),
            f(r.hwm_written_kib.map(|k| k / MIB), 1),
            f(r.hwm_settled_kib.map(|k| k / MIB), 1),
            r.events.map_or("-".into(), |e| e.to_string()),
        );
        if let Some(e) = &r.error {
            let _ = writeln!(o, "  {} FAILED: {e}", r.target);
        }
        if let Some(e) = r
            .ending
            .as_ref()
            .filter(|e| !e.starts_with("exited with code 0"))
        {
            if r.exit_ms.is_some() {
                let _ = writeln!(o, "  {}: {e}", r.target);
            }
        }
    }
    let _ = writeln!(
        o,
        "(peak RSS = VmHWM of the target's process, last read before it exited; written = when the server had read \
         every call; settled = once it stopped growing for {} ms)",
        plan.flood_settle.as_millis()
    );
}
