//! One measured session: a target pipeline spawned with piped stdin/stdout, the MCP handshake,
//! the workloads, a /proc snapshot of the target's top process, and the close → exit timing.
//!
//! Every session runs under a watchdog that kills the pipeline's process group when it overruns,
//! so a broken wrapper (one that exits at once, or never answers) is reported, never waited on.
//! The driver's own work (formatting requests, reading lines) is identical for every target.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::roles::ServerMode;
pub use crate::roles::{blob_request, echo_request, INITIALIZE};

/// Driver read buffer: large enough that a 5 MB response costs few syscalls on our side.
const DRIVER_READ_BUF: usize = 64 * 1024;
/// How long one session may take before the watchdog kills it; generous for a loaded machine.
const SESSION_DEADLINE: Duration = Duration::from_secs(180);
/// Env var: run the wrapper with `--debug` (its stderr goes to the session's log file; keep the
/// logs with `BENCH_KEEP_TMP=1`).
pub const ENV_WRAPPER_DEBUG: &str = "BENCH_WRAPPER_DEBUG";
/// A syntactically valid sensor token: the stand-in ingests never verify it.
pub const BENCH_TOKEN: &str = "obs1.bench.c2ln";

/// A mechanism of the wrapper's that a benchmark row can switch off, to show what it buys
/// (issue 20 item 7). The switch is [`ENV_DISABLE`] in the wrapper's environment: a benchmark
/// switch, not a user flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// The observer's pacing rules (slices and yields while the relay is busy).
    Pacer,
    /// The observer's lowered priority (batch class, nice 19): nice 0, normal class.
    Idle,
    /// Head/tail summaries of large messages.
    Summary,
    /// The tap's trimming of large messages.
    Trim,
    /// The relay's faulting in of the blocks a burst takes fresh.
    Prefault,
    /// The relay's `tee(2)` of a large answer's rest.
    Tee,
}

/// The environment variable a `wrap:file-no-<name>` target sets on the wrapper.
pub const ENV_DISABLE: &str = "BOUNDED_BENCH_DISABLE";

impl Mechanism {
    pub const ALL: [Mechanism; 6] = [
        Mechanism::Pacer,
        Mechanism::Idle,
        Mechanism::Summary,
        Mechanism::Trim,
        Mechanism::Prefault,
        Mechanism::Tee,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Pacer => "pacer",
            Mechanism::Idle => "idle",
            Mechanism::Summary => "summary",
            Mechanism::Trim => "trim",
            Mechanism::Prefault => "prefault",
            Mechanism::Tee => "tee",
        }
    }

    pub fn parse(s: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// How the wrapper is configured for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrapMode {
    /// No token: ingest Off, observation on, nothing sent.
    NoIngest,
    /// `--ingest file:<tmp>`: events filtered and appended as JSON lines.
    File,
    /// The same with one mechanism switched off (`BOUNDED_BENCH_DISABLE=<name>`).
    FileWithout(Mechanism),
    /// Token + the in-harness ingest that answers 200.
    Healthy,
    /// Token + a listener that accepts and never answers.
    BlackHole,
    /// No token, OTLP on (http/protobuf) towards an in-harness receiver that answers 200.
    Otlp,
}

impl WrapMode {
    /// Observed with the `file:` sink, with or without an ablation.
    pub fn is_file(self) -> bool {
        matches!(self, WrapMode::File | WrapMode::FileWithout(_))
    }
}

/// What is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Direct,
    Relay,
    Wrap(WrapMode),
}

impl Target {
    /// The targets a run measures unless told otherwise.
    pub const ALL: [Target; 7] = [
        Target::Direct,
        Target::Relay,
        Target::Wrap(WrapMode::NoIngest),
        Target::Wrap(WrapMode::File),
        Target::Wrap(WrapMode::Healthy),
        Target::Wrap(WrapMode::BlackHole),
        Target::Wrap(WrapMode::Otlp),
    ];

    /// Every target there is, in report order: [`Target::ALL`], then the ablations.
    pub fn known() -> impl Iterator<Item = Target> {
        Target::ALL.into_iter().chain(
            Mechanism::ALL
                .into_iter()
                .map(|m| Target::Wrap(WrapMode::FileWithout(m))),
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Relay => "relay",
            Target::Wrap(WrapMode::NoIngest) => "wrap:none",
            Target::Wrap(WrapMode::File) => "wrap:file",
            Target::Wrap(WrapMode::FileWithout(m)) => match m {
                Mechanism::Pacer => "wrap:file-no-pacer",
                Mechanism::Idle => "wrap:file-no-idle",
                Mechanism::Summary => "wrap:file-no-summary",
                Mechanism::Trim => "wrap:file-no-trim",
                Mechanism::Prefault => "wrap:file-no-prefault",
                Mechanism::Tee => "wrap:file-no-tee",
            },
            Target::Wrap(WrapMode::Healthy) => "wrap:healthy",
            Target::Wrap(WrapMode::BlackHole) => "wrap:blackhole",
            Target::Wrap(WrapMode::Otlp) => "wrap:otlp",
        }
    }

    pub fn parse(s: &str) -> Option<Target> {
        Target::known().find(|t| t.name() == s)
    }

    /// Observed with the `file:` sink (`wrap:file` and its ablations).
    pub fn is_file(self) -> bool {
        matches!(self, Target::Wrap(m) if m.is_file())
    }
}

/// What every session needs to know about its environment.
pub struct Ctx {
    pub exe: PathBuf,
    pub wrapper: PathBuf,
    pub tmp: PathBuf,
    pub healthy: Option<SocketAddr>,
    pub black_hole: Option<SocketAddr>,
    /// The OTLP receiver of `wrap:otlp` (a stand-in that answers 200 to every POST).
    pub otlp: Option<SocketAddr>,
    pub serial: u64,
    /// The uid (and gid) the targets run as, when not the harness's own: see
    /// [`Ctx::unprivileged`].
    pub run_as: Option<u32>,
}

/// A snapshot of the target's top process, taken while it is still alive.
#[derive(Debug, Clone, Default)]
pub struct ProcSnap {
    /// VmHWM: peak resident set size so far, KiB.
    pub hwm_kib: u64,
    /// CPU time per thread name (`comm`), milliseconds, summed over live threads.
    pub cpu_ms: BTreeMap<String, f64>,
    /// Minor page faults per thread name, summed over live threads (`minflt`).
    pub faults: BTreeMap<String, f64>,
}

/// What the end of a session looked like.
pub struct Finish {
    pub close_to_exit: Duration,
    pub lines: u64,
    pub bytes: u64,
    /// CPU time, ms, of the target and of every process it reaped (its server), from spawn to
    /// exit: unlike a /proc window around a workload, this includes what an observer running
    /// behind does after the workload's last answer (see [`children_cpu_ms`]).
    pub session_cpu_ms: f64,
    /// The target's VmHWM, KiB, last read before it exited ([`Session::finish_watching_peak`]);
    /// 0 from [`Session::finish`].
    pub peak_hwm_kib: u64,
}

pub struct Session {
    target: Target,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    stderr_path: PathBuf,
    /// Where the `file:` sink writes, for counting events afterwards.
    pub events_file: Option<PathBuf>,
    next_id: u64,
    /// Dropping it stops the watchdog.
    _watchdog: mpsc::Sender<()>,
    /// Reused response buffer.
    line: Vec<u8>,
    /// `tools/call` requests sent so far (the events the observer should produce).
    pub calls: u64,
}

pub fn response_prefix(id: u64) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},")
}

/// The command line a target runs as, around a given server command.
pub struct Launch {
    pub argv: Vec<OsString>,
    /// Set on the target's process, after every variable of the wrapper's own is removed.
    pub env: Vec<(&'static str, &'static str)>,
    /// Where the `file:` sink writes, for counting events afterwards.
    pub events_file: Option<PathBuf>,
    /// Run as this uid and gid (see [`Ctx::run_as`]).
    pub run_as: Option<u32>,
}

impl Launch {
    /// The target, around `server` (a full argv). `label` names its files in the temp dir.
    pub fn new(
        ctx: &Ctx,
        target: Target,
        server: &[OsString],
        label: &str,
    ) -> Result<Launch, String> {
        let mut events_file = None;
        let mut env = Vec::new();
        let argv = match target {
            Target::Direct => server.to_vec(),
            Target::Relay => {
                let mut v: Vec<OsString> = vec![
                    ctx.exe.clone().into(),
                    "--role".into(),
                    "relay".into(),
                    "--".into(),
                ];
                v.extend_from_slice(server);
                v
            }
            Target::Wrap(mode) => {
                let mut v: Vec<OsString> = vec![ctx.wrapper.clone().into()];
                if std::env::var_os(ENV_WRAPPER_DEBUG).is_some() {
                    v.push("--debug".into());
                }
                match mode {
                    WrapMode::NoIngest => {}
                    WrapMode::File | WrapMode::FileWithout(_) => {
                        let path = ctx.tmp.join(format!("{label}.events.jsonl"));
                        v.push("--ingest".into());
                        v.push(format!("file:{}", path.display()).into());
                        events_file = Some(path);
                        if let WrapMode::FileWithout(m) = mode {
                            env.push((ENV_DISABLE, m.name()));
                        }
                    }
                    WrapMode::Healthy | WrapMode::BlackHole => {
                        let addr = if mode == WrapMode::Healthy {
                            ctx.healthy
                        } else {
                            ctx.black_hole
                        }
                        .ok_or("stand-in ingest not running")?;
                        v.extend(["--token", BENCH_TOKEN, "--ingest"].map(OsString::from));
                        v.push(format!("http://{addr}").into());
                    }
                    WrapMode::Otlp => {
                        let addr = ctx.otlp.ok_or("OTLP receiver not running")?;
                        v.push("--otlp-endpoint".into());
                        v.push(format!("http://{addr}").into());
                    }
                }
                v.push("--".into());
                v.extend_from_slice(server);
                v
            }
        };
        Ok(Launch {
            argv,
            env,
            events_file,
            run_as: ctx.run_as,
        })
    }

    /// A `Command` for it, with none of the wrapper's variables inherited from the harness.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..]);
        clean_env(&mut cmd);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if let Some(id) = self.run_as {
            // std drops the supplementary groups too when the parent is root.
            cmd.uid(id).gid(id);
        }
        cmd
    }
}

/// Removes every variable the wrapper reads (and the benchmark's ablation switch) from `cmd`'s
/// environment.
pub fn clean_env(cmd: &mut Command) {
    for name in bounded_observe_mcp::config::ALL_ENV {
        cmd.env_remove(name);
    }
    cmd.env_remove(ENV_DISABLE);
}

impl Ctx {
    /// The mock server's argv: this binary's `--role server`, in `mode`.
    pub fn bench_server(&self, mode: ServerMode) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec![self.exe.clone().into(), "--role".into(), "server".into()];
        v.extend(mode.arg().map(OsString::from));
        v
    }

    /// The uid a user without privileges runs as (`nobody`), when the harness runs as root: what
    /// an MCP client's user is. A root wrapper may move its observer back to the normal class
    /// (`CAP_SYS_NICE`), which hides the cost of its lowered priority at exit. The temp dir is opened
    /// to that user so its `file:` sink can write there. `None` when the harness is not root
    /// (it already runs unprivileged) or the temp dir cannot be opened.
    pub fn unprivileged(&self) -> Option<u32> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        const NOBODY: u32 = 65534;
        // /proc/self belongs to the process's effective uid.
        if std::fs::metadata("/proc/self").ok()?.uid() != 0 {
            return None;
        }
        std::fs::set_permissions(&self.tmp, std::fs::Permissions::from_mode(0o777)).ok()?;
        Some(NOBODY)
    }

    /// A fresh label for one session's files in the temp dir.
    pub fn label(&mut self, target: Target) -> String {
        self.serial += 1;
        format!("{}-{}", target.name().replace(':', "-"), self.serial)
    }
}

impl Session {
    /// Spawns the target around the mock server and completes `initialize`,
    /// `notifications/initialized`, `tools/list`.
    pub fn start(ctx: &mut Ctx, target: Target) -> Result<Session, String> {
        let server = ctx.bench_server(ServerMode::Normal);
        Session::start_with(ctx, target, &server)
    }

    /// The same around any server command (argv) that answers like the mock server.
    pub fn start_with(
        ctx: &mut Ctx,
        target: Target,
        server: &[OsString],
    ) -> Result<Session, String> {
        let label = ctx.label(target);
        let stderr_path = ctx.tmp.join(format!("{label}.stderr"));
        let stderr = File::create(&stderr_path).map_err(|e| format!("stderr log: {e}"))?;
        let launch = Launch::new(ctx, target, server, &label)?;
        let events_file = launch.events_file.clone();
        let mut cmd = launch.command();
        // Own process group, so the watchdog can kill the whole pipeline at once.
        cmd.process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("{}: cannot spawn: {e}", target.name()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("child pipes missing".into());
        };
        let watchdog = start_watchdog(child.id(), SESSION_DEADLINE);
        let mut s = Session {
            target,
            child,
            stdin: Some(stdin),
            stdout: BufReader::with_capacity(DRIVER_READ_BUF, stdout),
            stderr_path,
            events_file,
            next_id: 0,
            _watchdog: watchdog,
            line: Vec::with_capacity(1024),
            calls: 0,
        };
        let list = "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{}}\n";
        let handshake = s
            .send(INITIALIZE.as_bytes())
            .and_then(|()| s.expect_response(0))
            .and_then(|()| s.send(list.as_bytes()))
            .and_then(|()| s.expect_response(1));
        if let Err(e) = handshake {
            return Err(s.abort("initialize handshake", e));
        }
        s.next_id = 2;
        Ok(s)
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self.stdin.as_mut() {
            Some(w) => w.write_all(bytes),
            None => Err(io::Error::other("stdin already closed")),
        }
    }

    fn recv_line(&mut self) -> io::Result<usize> {
        self.line.clear();
        let n = self.stdout.read_until(b'\n', &mut self.line)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "target closed its stdout",
            ));
        }
        Ok(n)
    }

    fn expect_response(&mut self, id: u64) -> io::Result<()> {
        self.recv_line()?;
        if !self.line.starts_with(response_prefix(id).as_bytes()) {
            let shown = String::from_utf8_lossy(&self.line[..self.line.len().min(120)]);
            return Err(io::Error::other(format!(
                "expected the response to id {id}, got {shown:?}"
            )));
        }
        Ok(())
    }

    /// Kills what is left, and describes why the session failed: the I/O error, the target's
    /// exit status if it is gone, and the tail of its stderr.
    pub fn abort(mut self, what: &str, e: io::Error) -> String {
        // A target that died on its own had a moment to do so; then we stop waiting.
        let mut status = None;
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                status = Some(s);
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let status = match status {
            Some(s) => describe(s),
            None => {
                kill_group(self.child.id());
                let _ = self.child.wait();
                "still running (killed)".to_string()
            }
        };
        format!(
            "{}: {what} failed: {e}; target {status}; stderr: {}",
            self.target.name(),
            stderr_tail(&self.stderr_path)
        )
    }

    /// One `tools/call` round trip; returns its latency.
    pub fn echo_call(&mut self) -> io::Result<Duration> {
        let id = self.next_id;
        self.next_id += 1;
        let req = echo_request(id);
        let t0 = Instant::now();
        self.send(req.as_bytes())?;
        self.expect_response(id)?;
        let dt = t0.elapsed();
        self.calls += 1;
        Ok(dt)
    }

    /// Writes `requests` from a second thread while this one reads `count` responses; returns
    /// the elapsed time from the first write to the last response byte, and the bytes read.
    pub fn pipelined(
        &mut self,
        requests: &[u8],
        first_id: u64,
        count: u64,
    ) -> io::Result<(Duration, u64, u64)> {
        let mut stdin = self
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("stdin already closed"))?;
        let t0 = Instant::now();
        let (stdin, read) = thread::scope(|scope| {
            let writer = scope.spawn(move || stdin.write_all(requests).map(|()| stdin));
            let mut total = 0u64;
            let mut largest = 0u64;
            let mut read = Ok(());
            for i in 0..count {
                match self.expect_response(first_id + i) {
                    Ok(()) => {
                        total += self.line.len() as u64;
                        largest = largest.max(self.line.len() as u64);
                    }
                    Err(e) => {
                        read = Err(e);
                        break;
                    }
                }
            }
            let elapsed = t0.elapsed();
            (writer.join(), read.map(|()| (elapsed, total, largest)))
        });
        match stdin {
            Ok(Ok(stdin)) => self.stdin = Some(stdin),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::other("writer thread panicked")),
        }
        self.calls += count;
        read
    }

    /// One `tools/list` round trip (the mute server answers it, so its answer also says every
    /// request written before it has been read by the server).
    pub fn list_tools(&mut self) -> io::Result<()> {
        let id = self.next_id;
        self.next_id += 1;
        let req = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/list\",\"params\":{{}}}}\n"
        );
        self.send(req.as_bytes())?;
        self.expect_response(id)
    }

    /// Reserves `n` request ids for a pipelined batch; returns the first.
    pub fn take_ids(&mut self, n: u64) -> u64 {
        let first = self.next_id;
        self.next_id += n;
        first
    }

    /// Sends requests without reading their answers (they are drained by [`Session::finish`]).
    pub fn send_unanswered(&mut self, bytes: &[u8], calls: u64) -> io::Result<()> {
        self.calls += calls;
        self.send(bytes)
    }

    /// Peak RSS and per-thread CPU of the target's top process, which must still be alive.
    pub fn snapshot(&self) -> ProcSnap {
        proc_snapshot(self.child.id())
    }

    /// Keeps the session open until the target has been nearly idle for [`QUIET`] (under a
    /// twentieth of it on the CPU: an observer working off a burst takes all of it), at most
    /// `limit`, as a client that goes on with its session after a burst does. What the target
    /// does meanwhile counts in the session's figures, as it does for such a client.
    pub fn wait_quiet(&self, limit: Duration) {
        let cpu = || self.snapshot().cpu_ms.values().sum::<f64>();
        let t0 = Instant::now();
        let mut samples = VecDeque::from([(t0, cpu())]);
        while t0.elapsed() < limit {
            thread::sleep(QUIET / 5);
            let now = (Instant::now(), cpu());
            while samples
                .get(1)
                .is_some_and(|s| now.0.duration_since(s.0) >= QUIET)
            {
                samples.pop_front();
            }
            samples.push_back(now);
            let (from, used) = (samples[0], now.1 - samples[0].1);
            if now.0.duration_since(from.0) >= QUIET && used < QUIET.as_secs_f64() * 1e3 / 20.0 {
                return;
            }
        }
    }

    /// Closes our end of the target's stdin, drains its stdout to EOF, and waits for it to exit.
    pub fn finish(self) -> Result<Finish, String> {
        self.finish_inner(false)
    }

    /// [`Session::finish`], with a thread reading the target's VmHWM every [`PEAK_POLL`] until
    /// it exits: an observer working off a backlog after the last answer reaches its peak then,
    /// after any snapshot taken while the session ran, and the target may hold its stdout open
    /// until it exits. Not for the close → exit figure: the reads share the pinned CPU with the
    /// target.
    pub fn finish_watching_peak(self) -> Result<Finish, String> {
        self.finish_inner(true)
    }

    fn finish_inner(mut self, watch_peak: bool) -> Result<Finish, String> {
        let pid = self.child.id();
        // Read once here, before the close: a target with nothing left to do may exit before
        // the watcher's first read. The watcher ends when it has exited (a zombie has no
        // memory lines).
        let watcher = watch_peak.then(|| {
            let mut peak = read_hwm(pid).unwrap_or(0);
            thread::spawn(move || {
                while let Some(h) = read_hwm(pid) {
                    peak = h.max(peak);
                    thread::sleep(PEAK_POLL);
                }
                peak
            })
        });
        let t0 = Instant::now();
        drop(self.stdin.take());
        let mut lines = 0u64;
        let mut bytes = 0u64;
        let mut buf = vec![0u8; DRIVER_READ_BUF];
        loop {
            match self.stdout.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    bytes += n as u64;
                    lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.abort("draining stdout", e)),
            }
        }
        let cpu_before = children_cpu_ms();
        let status = match self.child.wait() {
            Ok(s) => s,
            Err(e) => return Err(self.abort("wait", e)),
        };
        let close_to_exit = t0.elapsed();
        let session_cpu_ms = children_cpu_ms() - cpu_before;
        if !status.success() {
            return Err(format!(
                "{}: exited {} after stdin was closed; stderr: {}",
                self.target.name(),
                describe(status),
                stderr_tail(&self.stderr_path)
            ));
        }
        Ok(Finish {
            close_to_exit,
            lines,
            bytes,
            session_cpu_ms,
            peak_hwm_kib: watcher.and_then(|w| w.join().ok()).unwrap_or(0),
        })
    }
}

/// The end of a session whose exit is watched under a deadline (see [`Session::close_watched`]).
pub struct Watched {
    /// Close → the target's exit; `None` when it had not exited by the deadline (it was killed).
    pub close_to_exit: Option<Duration>,
    /// Close → the exit of the server the target runs (the target itself for `direct`);
    /// `None` when it was not seen to exit.
    pub close_to_server_exit: Option<Duration>,
    /// The target's VmHWM, last read before it exited, KiB.
    pub hwm_kib: u64,
    /// How the target ended, e.g. "exited with code 0", "no exit in 30 s (killed)".
    pub ending: String,
}

/// How often [`Session::close_watched`] looks at the processes.
const WATCH_POLL: Duration = Duration::from_micros(250);

/// How long the target must stay nearly idle for [`Session::wait_quiet`].
const QUIET: Duration = Duration::from_millis(50);

/// How often [`Session::finish_watching_peak`] reads VmHWM: a read costs the pinned CPU
/// 10–20 µs, and a peak is held, not passed, so a read a millisecond later still sees it.
const PEAK_POLL: Duration = Duration::from_millis(1);

impl Session {
    /// The target's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Closes our end of the target's stdin and watches the target and its server exit, while
    /// another thread drains and discards what the target still writes. A target still running
    /// `deadline` after the close is killed with its process group. VmHWM is read on every look,
    /// so a peak reached during the shutdown is seen.
    pub fn close_watched(self, deadline: Duration) -> Watched {
        let Session {
            target,
            mut child,
            stdin,
            mut stdout,
            stderr_path,
            ..
        } = self;
        let pid = child.id();
        let server = if target == Target::Direct {
            None
        } else {
            children_of(pid).first().copied()
        };
        let mut hwm = read_hwm(pid).unwrap_or(0);
        let t0 = Instant::now();
        drop(stdin);
        // Detached: a process that inherited the pipe could keep it open past the target.
        thread::spawn(move || {
            let mut buf = vec![0u8; DRIVER_READ_BUF];
            while matches!(stdout.read(&mut buf), Ok(n) if n > 0) {}
        });
        let mut server_exit = None;
        loop {
            if let (None, Some(sp)) = (server_exit, server) {
                if !alive(sp) {
                    server_exit = Some(t0.elapsed());
                }
            }
            if let Some(h) = read_hwm(pid) {
                hwm = hwm.max(h);
            }
            match child.try_wait() {
                Ok(Some(status)) => {
                    let at = t0.elapsed();
                    let mut ending = describe(status);
                    if !status.success() {
                        ending = format!("{ending}; stderr: {}", stderr_tail(&stderr_path));
                    }
                    return Watched {
                        close_to_exit: Some(at),
                        close_to_server_exit: server_exit.or(server.is_none().then_some(at)),
                        hwm_kib: hwm,
                        ending,
                    };
                }
                Ok(None) => {}
                Err(e) => {
                    kill_group(pid);
                    let _ = child.wait();
                    return Watched {
                        close_to_exit: None,
                        close_to_server_exit: server_exit,
                        hwm_kib: hwm,
                        ending: format!("wait failed: {e} (killed)"),
                    };
                }
            }
            if t0.elapsed() >= deadline {
                kill_group(pid);
                if let Some(sp) = server {
                    kill_pid(sp);
                }
                let _ = child.wait();
                return Watched {
                    close_to_exit: None,
                    close_to_server_exit: server_exit,
                    hwm_kib: hwm,
                    ending: format!("no exit in {} s (killed)", deadline.as_secs()),
                };
            }
            thread::sleep(WATCH_POLL);
        }
    }
}

/// VmHWM of a live process, KiB; `None` once it has exited (a zombie has no memory lines).
pub fn read_hwm(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Whether `pid` is still running: not gone, and not a zombie whose last thread has exited.
/// (A thread-group leader that exits before its other threads shows as a zombie while they
/// run on, with `Threads:` counting them; a process that is really over shows 1.)
pub fn alive(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let zombie = field("State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X'));
    let threads: u32 = field("Threads:").and_then(|t| t.parse().ok()).unwrap_or(1);
    !(zombie && threads <= 1)
}

/// The processes whose parent is `pid`, found by scanning /proc/*/stat (field 4, the ppid).
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut kids: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|st| {
                    let rest = &st[st.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect();
    kids.sort_unstable();
    kids
}

/// SIGKILL to one process, through the `kill` utility (no `unsafe`).
pub fn kill_pid(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

pub fn describe(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => format!("{s}"),
    }
}

pub fn stderr_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(4)..].join(" | ");
    if tail.is_empty() {
        "(empty)".into()
    } else {
        tail
    }
}

/// Kills a process group without `unsafe`: the `kill` utility does the syscall.
pub fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

/// Kills process group `pgid` after `deadline`, unless the returned sender is dropped first.
pub fn start_watchdog(pgid: u32, deadline: Duration) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(deadline) {
            eprintln!("bench: session overran {deadline:?}; killing process group {pgid}");
            kill_group(pgid);
        }
    });
    tx
}

/// User + system CPU, ms, of this process's children that were waited for, and of what they
/// waited for in turn. Read around one `wait`, the difference is that child's whole CPU time,
/// its server included: sessions run one at a time in a phase process, and nothing else of its
/// children is reaped meanwhile.
pub fn children_cpu_ms() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    let ms = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e3 + t.tv_usec() as f64 / 1e3;
    getrusage(UsageWho::RUSAGE_CHILDREN)
        .map(|u| ms(u.user_time()) + ms(u.system_time()))
        .unwrap_or(f64::NAN)
}

/// Reads VmHWM and per-thread CPU time (`se.sum_exec_runtime`, ns precision, from
/// /proc/<pid>/task/<tid>/sched; falls back to utime+stime ticks where that file is absent).
pub fn proc_snapshot(pid: u32) -> ProcSnap {
    let mut snap = ProcSnap::default();
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        for line in status.lines() {
            if let Some(v) = line.strip_prefix("VmHWM:") {
                snap.hwm_kib = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            }
        }
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return snap;
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let comm = std::fs::read_to_string(dir.join("comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        let ms = std::fs::read_to_string(dir.join("sched"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("se.sum_exec_runtime"))
                    .and_then(|l| l.split(':').nth(1))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .or_else(|| ticks_ms(&dir));
        let faults = stat_field(&dir, 10).unwrap_or(0.0);
        *snap.faults.entry(comm.clone()).or_default() += faults;
        *snap.cpu_ms.entry(comm).or_default() += ms.unwrap_or(0.0);
    }
    snap
}

/// Field `n` (1-based, as in proc(5)) of /proc/<pid>/task/<tid>/stat.
fn stat_field(dir: &Path, n: usize) -> Option<f64> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    // Fields after the `(comm)`, which may itself contain spaces, start at field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(n.checked_sub(3)?)?.parse().ok()
}

/// utime + stime from /proc/<pid>/task/<tid>/stat, assuming the usual 100 Hz clock tick.
fn ticks_ms(dir: &Path) -> Option<f64> {
    Some((stat_field(dir, 14)? + stat_field(dir, 15)?) * 10.0)
}

/// Events written by the `file:` sink (one batch per line, `events` an array): (all, status ≠ 200).
pub fn count_file_events(path: &Path) -> (u64, u64) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return (0, 0);
    };
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| count_batch(&v))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// (events, events whose status is not 200) in one batch. Every `tools/call` of the mock server
/// succeeds, so a non-200 event is a mis-correlated call (e.g. a 504 for a call that was answered).
pub fn count_batch(v: &serde_json::Value) -> (u64, u64) {
    let Some(events) = v["events"].as_array() else {
        return (0, 0);
    };
    let bad = events.iter().filter(|e| e["status"] != 200).count();
    (events.len() as u64, bad as u64)
}
