//! The wrapped server as a process: spawn, process group, death signal, exit status, kill switch.
//!
//! Owns everything that touches the child's pid: starting it in its own process group with
//! `PR_SET_PDEATHSIG`, signalling the group, noticing its exit without reaping it, reaping it,
//! and turning an exit status or a spawn error into the wrapper's exit code. In: a program and
//! its arguments. Out: a [`ChildGroup`] handle, pipes for the relay, exit codes.
//!
//! The server's environment is ours minus every `BOUNDED_*` variable ([`server_command`]), on
//! every path that starts it: observed, unobserved, and the kill switch's `exec`. The server is
//! often third-party code, and a sensor token in its environment would let it forge events as
//! the token's org (invariant 9). `OTEL_*` and everything else pass unchanged.
//!
//! Signalling the group by pgid is only safe while that pgid cannot name an unrelated process:
//! the child is reaped *last*, after every signal we send, so its pid (= the pgid) stays
//! reserved by the zombie for as long as we may signal it. Must never signal after reaping.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::Pid;

use crate::config::is_sensor_env;
use crate::lock::lock;
use crate::log::PREFIX;

mod launch;

/// Exit code when the server command does not exist (the shell's convention).
pub const EXIT_NOT_FOUND: i32 = 127;
/// Exit code when the server command exists but cannot be executed (permission, not a file).
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit code when our own stdin/stdout cannot be used (closed descriptors): nothing can be relayed.
pub const EXIT_NO_STDIO: i32 = 1;
/// Signal the kernel sends the child if the wrapper dies without cleaning up (SIGKILL'd, crashed).
/// SIGKILL, not SIGTERM: this path only runs when the wrapper had no chance to forward a signal
/// and escalate, and a server that ignores SIGTERM would otherwise outlive it. Every catchable
/// signal the wrapper receives goes through the graceful path instead (forward, grace, escalate).
pub const DEATH_SIGNAL: libc::c_int = libc::SIGKILL;

/// Shell-style exit code for a command that could not be started, with the message to print.
pub fn spawn_error_code(program: &OsString, err: &io::Error) -> (i32, String) {
    let code = match err.kind() {
        io::ErrorKind::NotFound => EXIT_NOT_FOUND,
        _ => EXIT_CANNOT_EXECUTE,
    };
    let what = if code == EXIT_NOT_FOUND {
        "command not found"
    } else {
        "cannot execute"
    };
    (
        code,
        format!(
            "{what}: {} ({err})",
            std::path::Path::new(program).display()
        ),
    )
}

/// Whether `sig` is currently ignored (`SIG_IGN`) in this process, e.g. SIGHUP under `nohup`.
pub fn is_ignored(sig: libc::c_int) -> bool {
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: with a null `act`, sigaction(2) only reads the current disposition into `old`,
    // which points to writable memory of the right type; nothing is changed. Covered by
    // `ignored_sighup_stays_ignored_for_wrapper_and_server` in tests/stdio_lifecycle.rs.
    let rc = unsafe { libc::sigaction(sig, std::ptr::null(), old.as_mut_ptr()) };
    if rc != 0 {
        return false;
    }
    // SAFETY: sigaction succeeded, so it initialised `old`; it was zeroed before in any case.
    let old = unsafe { old.assume_init() };
    old.sa_sigaction == libc::SIG_IGN
}

/// The wrapper's exit code for a child's exit status: its code, or 128+N if killed by signal N.
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        // Neither code nor signal (stopped/continued statuses are not final): treat as failure.
        (None, None) => 1,
    }
}

/// A running server: its pid is the pgid of its own process group.
pub struct ChildGroup {
    pgid: Pid,
    /// Whether the child is still unreaped. Locked while signalling and while reaping, so that a
    /// signal can never be sent after the reap freed the pid (see module docs).
    live: Mutex<bool>,
}

/// What [`spawn`] hands back: the group handle and the two pipes the relay owns.
pub struct Spawned {
    pub group: ChildGroup,
    pub stdin: File,
    pub stdout: File,
}

/// The command that starts the server: `program args…` with the process's environment minus
/// every variable [`crate::config::is_sensor_env`] calls ours.
///
/// Only the process environment is filtered. The map the library is configured from
/// ([`crate::Env`]) is never given to the server, so nothing in it can reach the server except
/// through the process environment, which this filters by prefix: a parent CLI that passes a
/// token only in the map never exposes it, and one that also exported it is covered here.
/// Filtering by the map's names as well would add nothing for `BOUNDED_*` names and would wrongly
/// hide from the server the shared variables a parent may pass in it (`OTEL_*`).
fn server_command(program: &OsString, args: &[OsString]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args).env_clear().envs(server_env());
    cmd
}

/// The server's environment: ours minus every variable [`crate::config::is_sensor_env`] calls
/// ours (see [`server_command`], which the kill switch uses).
fn server_env() -> impl Iterator<Item = (OsString, OsString)> {
    std::env::vars_os().filter(|(name, _)| !is_sensor_env(name))
}

/// Starts the server with piped stdin/stdout, inherited stderr, in its own process group, with
/// a death signal tied to the calling thread ([`launch`]: no copy of the wrapper is made).
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that started the child exits, not the process:
/// call this from a thread that outlives the session (the relay's caller blocks in
/// [`super::StdioProxy::run`] until the child is reaped, so its own thread qualifies; `main`
/// calls it from the main thread). Our descriptors 0 and 1 must be open.
pub fn spawn(program: &OsString, args: &[OsString]) -> io::Result<Spawned> {
    let launched = launch::launch(program, args, server_env(), DEATH_SIGNAL)?;
    Ok(Spawned {
        group: ChildGroup {
            pgid: Pid::from_raw(launched.pid),
            live: Mutex::new(true),
        },
        stdin: launched.stdin,
        stdout: launched.stdout,
    })
}

impl ChildGroup {
    pub fn pid(&self) -> u32 {
        self.pgid.as_raw() as u32
    }

    /// Sends `sig` to the whole process group unless the child was already reaped.
    /// Returns whether the signal was sent.
    pub fn signal(&self, sig: Signal) -> bool {
        let live = lock(&self.live);
        if !*live {
            return false;
        }
        // ESRCH (group already empty) is fine: nothing left to signal.
        killpg(self.pgid, sig).is_ok()
    }

    /// Whether the child was reaped (after which no signal is ever sent to the group).
    pub fn is_reaped(&self) -> bool {
        !*lock(&self.live)
    }

    /// Blocks until the child has exited, WITHOUT reaping it (WNOWAIT), so its pid stays
    /// reserved for group signals. Meant for a dedicated waiter thread.
    pub fn wait_exited(&self) {
        loop {
            match waitid(
                Id::Pid(self.pgid),
                WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
            ) {
                Err(Errno::EINTR) => continue,
                // Ok: exited. ECHILD: already reaped elsewhere (SIGCHLD ignored by our parent):
                // either way it is gone.
                _ => return,
            }
        }
    }

    /// Reaps the child (it must have exited: see [`Self::wait_exited`]) and returns its status.
    /// After this no signal is sent to the group again.
    pub fn reap(&self) -> Option<ExitStatus> {
        let mut live = lock(&self.live);
        if !*live {
            return None;
        }
        *live = false;
        waitpid(self.pgid.as_raw(), 0)
    }

    /// Reaps if the child has exited; leaves it (and the group's signalling) alone otherwise.
    pub fn try_reap(&self) -> Option<ExitStatus> {
        let mut live = lock(&self.live);
        if !*live {
            return None;
        }
        match waitpid(self.pgid.as_raw(), libc::WNOHANG) {
            Some(status) => {
                *live = false;
                Some(status)
            }
            None => None,
        }
    }
}

/// `waitpid(2)` on `pid`, retried on EINTR. `None` when it has not exited (WNOHANG) or cannot be
/// waited for (ECHILD: our parent set SIGCHLD to be ignored, so the kernel reaped it).
fn waitpid(pid: libc::pid_t, flags: libc::c_int) -> Option<ExitStatus> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into a local int and takes no other pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, flags) };
        match rc {
            0 => return None,
            -1 if Errno::last() == Errno::EINTR => continue,
            -1 => return None,
            _ => return Some(ExitStatus::from_raw(status)),
        }
    }
}

/// Kill switch (invariant 7): replaces this process with the server (same pid, same fds, no
/// thread, no tap, no socket; the environment without `BOUNDED_*`, as on every other path).
/// Returns only if exec failed, with 127/126 after one message.
pub fn exec_passthrough(program: &OsString, args: &[OsString]) -> i32 {
    let err = server_command(program, args).exec();
    let (code, msg) = spawn_error_code(program, &err);
    // Logging is deliberately not initialised on this path; plain stderr with our prefix.
    eprintln!("{PREFIX} error: {msg}");
    code
}
