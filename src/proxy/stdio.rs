//! Stdio proxy: the wrapped server as a child, two relay loops, and the session's lifecycle
//! (DESIGN §2 invariants 1–3, 6, 7; §8; §9).
//!
//! In: a server command, optionally a [`Tapped`] (tap sender) per direction.
//! Out: the server's bytes on our stdout and the client's on its stdin, unchanged and in order;
//! each chunk read also handed to the tap (the same bytes, not a copy); a [`StdioOutcome`]: the
//! exit code to use and who ended the session ([`SessionEnd`], which the wiring turns into how
//! open calls end). It never writes anything of its own to stdout, never parses, never imports
//! the observer, and never lets the observer slow or stop a byte.
//!
//! Threads: the caller's thread spawns the child (so `PR_SET_PDEATHSIG` stays armed: see
//! [`child::spawn`]) and then runs the session loop below; one thread per relay direction
//! ([`relay`]); one waiter that notices the child's exit without reaping it; one signal
//! forwarder. Plain std threads, not tokio's `stdin()`/`stdout()`, which hop through the
//! blocking pool on every call (§8) and whose stdin read can hold a runtime open at exit (§9).
//!
//! Lifecycle (invariant 6), in the order things happen:
//! * Client closes our stdin → we close the child's stdin, wait [`STDIN_CLOSE_GRACE`], then
//!   SIGTERM the child's process group, wait [`TERM_GRACE`], then SIGKILL it (the same
//!   sequence, and the same values, as the official TypeScript SDK's stdio client).
//! * Our stdout breaks (EPIPE: the client is gone) → the child's stdout is closed, so the server
//!   sees the broken pipe it would see unwrapped, and the same grace/SIGTERM/SIGKILL follows.
//! * The session ends when the child has exited AND its stdout reached EOF with every byte
//!   written to ours (§9 "losing the last response"). If the child exits but a descendant
//!   keeps its stdout open, we wait [`DRAIN_GRACE`], then SIGTERM/SIGKILL the group, then stop
//!   waiting after [`KILL_GRACE`].
//! * SIGINT/SIGTERM/SIGHUP sent to the wrapper are forwarded to the child's process group, and
//!   the wrapper keeps relaying until the child exits (a server that traps SIGTERM to finish
//!   its last response gets to do so). The forwarder is a plain thread ([`signal_hook`]'s
//!   self-pipe iterator) rather than `tokio::signal`, so forwarding works the same whether or
//!   not a runtime exists (the unobserved fallback and the observed path share one code path).
//!   Once the child is reaped there is nobody to forward to: the same signals then take their
//!   default effect (terminate), so a client's SIGTERM during the final event flush still ends
//!   the wrapper at once. A parent CLI embedding this keeps that disposition afterwards.
//! * At the end, leftover members of the group (background grandchildren) get one SIGTERM,
//!   then the child is reaped (never a zombie) and the caller gets its exit code: the child's
//!   own, or 128+N if it was killed by signal N. The stdin reader may still be blocked in a read
//!   that never returns; nothing joins it, so returning (and `main` exiting) is never delayed.
//!
//! Exit codes of the wrapper itself: 127 when the server command is not found, 126 when it
//! cannot be executed, 1 when our own stdin/stdout are unusable; otherwise the child's.

mod child;
mod relay;

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

pub use child::{exit_code, EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_NO_STDIO};
use relay::{Note, TapSlot};

use crate::tap::TapSender;

/// Size of one relay read. 64 KiB is the Linux pipe capacity: one read can empty a full pipe.
/// (The tap's memory is bounded in bytes, `crate::tap::TAP_BUDGET_BYTES`, whatever the reads.)
pub const READ_BUF: usize = 64 * 1024;

/// After the client closed our stdin (and we closed the child's), how long the server may take
/// to exit on its own before its group gets SIGTERM. Matches the official TypeScript SDK's
/// stdio client, so a wrapped server gets the same time it would get unwrapped.
pub const STDIN_CLOSE_GRACE: Duration = Duration::from_secs(2);
/// After SIGTERM, how long before SIGKILL (same as the TypeScript SDK).
pub const TERM_GRACE: Duration = Duration::from_secs(2);
/// After the child exited, how long a descendant that inherited its stdout may keep it open
/// (we keep draining meanwhile) before the group is signalled.
pub const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// After SIGKILL, how long to wait for the exit and the drain before returning regardless: a
/// process stuck in the kernel, or one that left our group while holding the stdout pipe,
/// must not keep the wrapper alive forever.
pub const KILL_GRACE: Duration = Duration::from_secs(1);

/// One observed direction, as the relay takes it: where its chunks go.
pub struct Tapped {
    pub tx: TapSender,
    /// Fault in the loop's first blocks before its first read, and the blocks a burst takes
    /// fresh, in one call each (on, except for the benchmark's `prefault` switch; see
    /// `relay::START_BLOCKS` and `relay::PREFAULT_AFTER`).
    pub prefault: bool,
    /// Forward the rest of a large answer with `tee(2)` (on, except for the benchmark's `tee`
    /// switch; see `relay::TEE_AFTER`).
    pub tee: bool,
}

/// Signals forwarded to the child's process group (invariant 6).
const FORWARDED_SIGNALS: [libc::c_int; 3] = [SIGINT, SIGTERM, SIGHUP];

/// What the session's end looked like.
#[derive(Debug, Clone, Copy)]
pub struct StdioOutcome {
    /// The child's exit code, or 128+N if killed by signal N; 126/127 if it could not start.
    pub exit_code: i32,
    pub ended: SessionEnd,
}

/// Who ended the session: what calls still unanswered at the end are put down to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// The client finished first (closed our stdin, or went away), or the server was never
    /// seen going away on its own.
    ByClient,
    /// The server went away while the client was still connected, or never ran.
    ServerGone,
}

/// The wrapped server and how to run it. See the module docs for the lifecycle.
pub struct StdioProxy {
    program: OsString,
    args: Vec<OsString>,
}

/// The next step if the current deadline passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escalation {
    Term,
    Kill,
    GiveUp,
}

impl StdioProxy {
    pub fn new(program: OsString, args: Vec<OsString>) -> Self {
        StdioProxy { program, args }
    }

    /// Runs the session, optionally tapped, and says how it ended. Blocks until the child is
    /// gone. Call it from a thread that lives as long as the session (see [`child::spawn`]).
    pub fn run(self, c2s: Option<Tapped>, s2c: Option<Tapped>) -> StdioOutcome {
        let fail = |exit_code| StdioOutcome {
            exit_code,
            ended: SessionEnd::ServerGone,
        };
        // Our own stdin/stdout as unbuffered files: `io::stdout()` is line-buffered and would
        // hold a partial last line; duplicates leave the process's fds 0/1 untouched.
        let (our_in, our_out) = match (
            dup_file(io::stdin().as_fd()),
            dup_file(io::stdout().as_fd()),
        ) {
            (Ok(i), Ok(o)) => (i, o),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!("Cannot use stdin/stdout ({e}); not starting the server");
                return fail(EXIT_NO_STDIO);
            }
        };

        // Registered before the child exists, so a signal arriving during spawn is queued and
        // forwarded once the forwarder runs instead of killing the wrapper.
        // A signal our parent set to "ignore" (nohup, a background job) stays ignored, for us and
        // for the server that inherits the disposition through exec, exactly as unwrapped.
        let forwarded: Vec<libc::c_int> = FORWARDED_SIGNALS
            .into_iter()
            .filter(|&sig| !child::is_ignored(sig))
            .collect();
        let signals = match Signals::new(forwarded) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(
                    "Cannot install signal handlers ({e}); signals will not be forwarded"
                );
                None
            }
        };

        let spawned = match child::spawn(&self.program, &self.args) {
            Ok(s) => s,
            Err(e) => {
                let (code, msg) = child::spawn_error_code(&self.program, &e);
                tracing::error!("{msg}");
                return fail(code);
            }
        };
        let group = Arc::new(spawned.group);
        let c2s = c2s.map(|t| TapSlot::new(t.tx, t.prefault, t.tee));
        let s2c = s2c.map(|t| TapSlot::new(t.tx, t.prefault, t.tee));
        let (tx, rx) = mpsc::channel();

        if let Some(mut signals) = signals {
            let group = group.clone();
            let forwarder = thread::Builder::new()
                .name("observe-mcp-signals".into())
                .spawn(move || {
                    for sig in signals.forever() {
                        let Ok(signal) = Signal::try_from(sig) else {
                            continue;
                        };
                        if group.signal(signal) {
                            tracing::debug!(signal = %signal, "Forwarded signal to the server's process group");
                        } else if group.is_reaped() {
                            // The session is over (the caller may still be flushing events):
                            // the signal gets its default effect, as if we had no handler.
                            let _ = signal_hook::low_level::emulate_default_handler(sig);
                        }
                    }
                });
            if let Err(e) = forwarder {
                tracing::warn!(
                    "Cannot start the signal forwarder ({e}); signals will not be forwarded"
                );
            }
        }

        let started = start_threads(
            our_in,
            our_out,
            spawned.stdin,
            spawned.stdout,
            c2s.clone(),
            s2c.clone(),
            group.clone(),
            &tx,
        );
        drop(tx);
        let outcome = match started {
            Ok(()) => drive(&group, &rx),
            Err(e) => {
                tracing::error!("Cannot start the relay ({e}); stopping the server");
                group.signal(Signal::SIGKILL);
                Drive {
                    exited: true,
                    ended: SessionEnd::ServerGone,
                }
            }
        };

        // Leftover group members (a grandchild that detached from stdout) must not outlive the
        // session. Sent before reaping: the zombie still reserves the pgid.
        if outcome.exited {
            group.signal(Signal::SIGTERM);
        }
        // The observer finishes only when every tap sender is gone, including the one owned by
        // a stdin reader that may never return.
        let now = Instant::now();
        for slot in [&c2s, &s2c].into_iter().flatten() {
            slot.close(now);
        }
        let status = if outcome.exited {
            group.reap()
        } else {
            group.try_reap()
        };
        let exit_code = match status {
            Some(status) => child::exit_code(status),
            None => {
                tracing::warn!(
                    pid = group.pid(),
                    "The server did not exit after SIGKILL; leaving it behind"
                );
                128 + libc::SIGKILL
            }
        };
        StdioOutcome {
            exit_code,
            ended: outcome.ended,
        }
    }
}

fn dup_file(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<File> {
    Ok(File::from(fd.try_clone_to_owned()?))
}

/// Starts the two relay loops and the exit waiter. None of them is ever joined: each reports
/// through `tx`, and the stdin reader may block forever in a read nobody can cancel.
#[allow(clippy::too_many_arguments)]
fn start_threads(
    our_in: File,
    our_out: File,
    child_in: File,
    child_out: File,
    c2s: Option<Arc<TapSlot>>,
    s2c: Option<Arc<TapSlot>>,
    group: Arc<child::ChildGroup>,
    tx: &mpsc::Sender<Note>,
) -> io::Result<()> {
    let notes = tx.clone();
    thread::Builder::new()
        .name("observe-mcp-c2s".into())
        .spawn(move || relay::client_to_server(our_in, child_in, c2s, notes))?;
    let notes = tx.clone();
    thread::Builder::new()
        .name("observe-mcp-s2c".into())
        .spawn(move || relay::server_to_client(child_out, our_out, s2c, notes))?;
    let notes = tx.clone();
    thread::Builder::new()
        .name("observe-mcp-wait".into())
        .spawn(move || {
            group.wait_exited();
            let _ = notes.send(Note::ChildExited);
        })?;
    Ok(())
}

/// How the session loop ended.
struct Drive {
    /// The child has exited (and can be reaped without blocking).
    exited: bool,
    ended: SessionEnd,
}

/// The session loop: reacts to relay/waiter notes and escalates on deadlines until the child
/// has exited and its stdout is drained, or the last grace period ran out.
fn drive(group: &child::ChildGroup, rx: &mpsc::Receiver<Note>) -> Drive {
    let mut client_done = false;
    let mut server_eof = false;
    let mut exited = false;
    let mut ended = SessionEnd::ByClient;
    let mut deadline: Option<(Instant, Escalation)> = None;

    while !(exited && server_eof) {
        let note = match deadline {
            Some((at, _)) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match note {
            Ok(Note::ClientEof) | Ok(Note::ClientGone) => {
                if note == Ok(Note::ClientGone) {
                    // Nothing more can reach the client; stop waiting for the child's stdout.
                    server_eof = true;
                }
                client_done = true;
                if !exited && deadline.is_none() {
                    deadline = Some((Instant::now() + STDIN_CLOSE_GRACE, Escalation::Term));
                }
            }
            Ok(Note::ServerEof) => server_eof = true,
            Ok(Note::ChildExited) => {
                exited = true;
                if !client_done {
                    ended = SessionEnd::ServerGone;
                }
                if !server_eof && deadline.is_none() {
                    deadline = Some((Instant::now() + DRAIN_GRACE, Escalation::Term));
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let Some((_, step)) = deadline else { continue };
                match step {
                    Escalation::Term => {
                        tracing::warn!(
                            pid = group.pid(),
                            "The server did not finish within {} s; sending SIGTERM to its process group",
                            if exited { DRAIN_GRACE } else { STDIN_CLOSE_GRACE }.as_secs()
                        );
                        group.signal(Signal::SIGTERM);
                        deadline = Some((Instant::now() + TERM_GRACE, Escalation::Kill));
                    }
                    Escalation::Kill => {
                        tracing::warn!(
                            pid = group.pid(),
                            "The server ignored SIGTERM for {} s; sending SIGKILL to its process group",
                            TERM_GRACE.as_secs()
                        );
                        group.signal(Signal::SIGKILL);
                        deadline = Some((Instant::now() + KILL_GRACE, Escalation::GiveUp));
                    }
                    Escalation::GiveUp => break,
                }
            }
            // Every sender gone without the notes we wait for: cannot happen (the waiter always
            // reports), but never spin or hang on it.
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    Drive { exited, ended }
}

/// Kill switch (invariant 7): replaces this process with the server. Returns only if exec
/// failed (126/127, after one message on stderr).
pub fn exec_passthrough(program: &OsString, args: &[OsString]) -> i32 {
    child::exec_passthrough(program, args)
}
