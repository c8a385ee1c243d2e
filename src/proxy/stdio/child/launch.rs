//! Starting the server without copying the wrapper: `clone(CLONE_VM | CLONE_VFORK)`, the way
//! glibc's `posix_spawn` starts a program, plus the one step `posix_spawn` cannot take:
//! `PR_SET_PDEATHSIG`.
//!
//! Owns the few lines that run in the child between `clone` and `execve`. They share the
//! wrapper's memory, so they must never allocate, lock, unwind or write anything but their own
//! stack and `errno`: everything they read (program, argv, envp, descriptors) is built by the
//! parent first ([`Launch`]), and the parent's thread is suspended by the kernel until the child
//! has called `execve` or `_exit`. A step that fails writes its errno to a close-on-exec pipe,
//! as `std` does, not to the shared memory: QEMU's user-mode emulation (how the aarch64 packages
//! are tested) runs `CLONE_VM | CLONE_VFORK` as a plain `fork`, and only the pipe reaches the
//! parent from a copy. `execvpe` reads `PATH` from the process's environment, which the sensor
//! never changes after start (no `set_var` anywhere in it).
//!
//! Why not `std::process::Command` with `pre_exec`: that forces `fork`, which copies the
//! wrapper's page tables and write-protects its memory, and the child's `execve` then tears the
//! copy down, on every session. From the session's start to the server's `execve`, medians of
//! 60 one-shot sessions: 0.29 ms unobserved and 0.40 ms observed with `fork`, 0.21 and 0.24 ms
//! here (bench/README.md, "The server started without a copy").

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// Stack for the child's few calls. `execvpe` keeps its path buffer (`PATH_MAX` + a name) and,
/// for a script without `#!`, a copy of argv on the stack; glibc's `posix_spawn` gives its child
/// 64 KiB plus argv for the same calls.
const CHILD_STACK: usize = 64 * 1024;

/// Highest signal number + 1 (glibc's `_NSIG` on Linux).
const NSIG: libc::c_int = 65;

/// Everything the child reads, prepared by the parent because the child may not allocate.
struct Launch {
    /// NUL-terminated pointers into `strings`; `argv[0]` is the program, as `execvp` takes it.
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    _strings: Vec<CString>,
    /// The ends the child keeps: our pipe's read end becomes its stdin, the write end its stdout.
    stdin: RawFd,
    stdout: RawFd,
    /// Our pid: if the child's parent is another process by the time the death signal is armed,
    /// we died meanwhile and the signal would never fire.
    parent: libc::pid_t,
    death_signal: libc::c_int,
    /// Where a failed step writes its errno (4 bytes); closed by a successful `execve`.
    report: RawFd,
}

/// A started server: its pid (= its process group) and our ends of its stdin and stdout.
pub(super) struct Launched {
    pub pid: libc::pid_t,
    pub stdin: File,
    pub stdout: File,
}

fn c_string(s: &[u8]) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "nul byte in argument"))
}

/// Starts `program args…` (searched in `PATH` as `execvp` does) with `env` as its whole
/// environment, stdin and stdout piped to us, stderr inherited, in a process group of its own,
/// and `death_signal` armed for when the calling thread exits. Our own descriptors 0 and 1 must
/// be open (the caller has duplicated them), so that neither pipe end the child keeps is 0 or 1.
pub(super) fn launch(
    program: &OsString,
    args: &[OsString],
    env: impl Iterator<Item = (OsString, OsString)>,
    death_signal: libc::c_int,
) -> io::Result<Launched> {
    let (child_stdin, our_stdin) = std::io::pipe()?;
    let (our_stdout, child_stdout) = std::io::pipe()?;
    let child_stdin = OwnedFd::from(child_stdin);
    let child_stdout = OwnedFd::from(child_stdout);
    let (mut report_r, report_w) = std::io::pipe()?;

    let mut strings = Vec::with_capacity(args.len() + 1);
    strings.push(c_string(program.as_bytes())?);
    for a in args {
        strings.push(c_string(a.as_bytes())?);
    }
    let argc = strings.len();
    for (k, v) in env {
        let mut kv = Vec::with_capacity(k.len() + v.len() + 1);
        kv.extend_from_slice(k.as_bytes());
        kv.push(b'=');
        kv.extend_from_slice(v.as_bytes());
        strings.push(c_string(&kv)?);
    }
    let pointers = |s: &[CString]| -> Vec<*const libc::c_char> {
        s.iter()
            .map(|c| c.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let plan = Launch {
        argv: pointers(&strings[..argc]),
        envp: pointers(&strings[argc..]),
        _strings: strings,
        stdin: child_stdin.as_raw_fd(),
        stdout: child_stdout.as_raw_fd(),
        parent: std::process::id() as libc::pid_t,
        death_signal,
        report: report_w.as_raw_fd(),
    };
    let mut stack: Vec<u8> = Vec::with_capacity(CHILD_STACK + 8 * (argc + 2));

    // SAFETY (the whole block):
    // * `stack` is a live allocation of at least CHILD_STACK bytes owned by this frame; the
    //   child gets its top, 16-byte aligned, and only uses it as a stack. Its bytes are never
    //   read as Rust values here, so their being uninitialised does not matter.
    // * `plan` lives in this frame. With CLONE_VFORK the kernel suspends this thread until the
    //   child has exec'd or exited, so `plan` and `stack` outlive every use the child makes of
    //   them; other threads never see either.
    //   (Under an emulator that runs this `clone` as a `fork`, the child works on its own copy
    //   of both, and the parent does not wait: `plan.report` tells it the outcome either way.)
    // * The child runs `child_main`, which only reads `plan` and makes async-signal-safe calls
    //   (see there); it never returns into Rust code of ours: it ends in execve or _exit.
    // * Every signal is blocked on this thread across `clone`, so no handler of ours can run in
    //   the child (which shares our memory) before the child has put every caught signal back
    //   to its default; the child gets its own copy of the dispositions (no CLONE_SIGHAND), so
    //   doing that never touches ours. The old mask is restored right after.
    // Covered by this module's tests and, for the death signal, by
    // `wrapper_sigkilled_leaves_no_child_behind` in tests/stdio_lifecycle.rs.
    let pid = unsafe {
        let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigfillset(all.as_mut_ptr());
        let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        let masked = libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr());
        if masked != 0 {
            return Err(io::Error::from_raw_os_error(masked));
        }
        let top = stack.as_mut_ptr().add(stack.capacity());
        let top = top.sub(top as usize % 16);
        let pid = libc::clone(
            child_main,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_ref(&plan).cast_mut().cast(),
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut());
        if pid == -1 {
            return Err(clone_error);
        }
        pid
    };
    drop(stack);
    // Our copy of the write end closed, the read ends at the child's execve (close-on-exec) or
    // holds the errno it wrote before _exit.
    drop(report_w);
    let mut failed = [0u8; 4];
    if report_r.read_exact(&mut failed).is_ok() {
        // The child has called _exit: reap it, never leave a zombie.
        super::waitpid(pid, 0);
        return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(failed)));
    }
    drop(child_stdin);
    drop(child_stdout);
    Ok(Launched {
        pid,
        stdin: File::from(OwnedFd::from(our_stdin)),
        stdout: File::from(OwnedFd::from(our_stdout)),
    })
}

/// errno after a failed call. Reads the calling thread's errno slot; in the child, which runs
/// on the parent thread's TLS, that is the suspended parent thread's slot, which nothing reads
/// until the child is gone (Rust code reads errno only right after a call that failed).
fn errno() -> libc::c_int {
    // SAFETY: __errno_location returns a valid pointer to the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

/// The child, between clone and exec. Only async-signal-safe system calls (sigaction,
/// sigprocmask, setpgid, dup2, fcntl, prctl, getppid, execvpe, write, _exit), no allocation, no
/// lock, no panic path: every step reports an errno instead.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `&Launch` the parent passed to clone, alive and unchanged until
    // this child execs or exits (see the SAFETY comment in `launch`).
    let plan = unsafe { &*arg.cast::<Launch>() };
    let err = prepare_and_exec(plan);
    let err = if err == 0 { libc::EINVAL } else { err };
    // SAFETY: writes 4 bytes from a local to a descriptor of ours; a pipe takes up to PIPE_BUF
    // bytes in one piece, so the parent reads all four or, if this fails, none (and then only
    // sees the exit status).
    unsafe { libc::write(plan.report, std::ptr::from_ref(&err).cast(), 4) };
    // SAFETY: _exit ends this process without running any of the parent's exit handlers.
    unsafe { libc::_exit(127) }
}

/// Returns the errno of the step that failed; returns only on failure.
fn prepare_and_exec(plan: &Launch) -> libc::c_int {
    // SAFETY: every call below is a plain system call wrapper given valid pointers to locals or
    // to `plan`'s NUL-terminated strings and NULL-terminated pointer arrays.
    unsafe {
        // Caught signals back to their default: a handler of ours running here would run on
        // memory we share with the wrapper. Ignored ones stay ignored (nohup), except SIGPIPE,
        // which std ignores for itself and puts back for its children; std does the same.
        for sig in 1..NSIG {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut sa) != 0 {
                continue;
            }
            let caught = sa.sa_sigaction != libc::SIG_DFL && sa.sa_sigaction != libc::SIG_IGN;
            if caught || (sig == libc::SIGPIPE && sa.sa_sigaction == libc::SIG_IGN) {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigemptyset(&mut dfl.sa_mask);
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        // Own process group: signals reach grandchildren (npx, shell wrappers), and a Ctrl-C
        // meant for the client's terminal group does not hit the server behind our back.
        if libc::setpgid(0, 0) != 0 {
            return errno();
        }
        for (from, to) in [(plan.stdin, 0), (plan.stdout, 1)] {
            let rc = if from == to {
                // dup2 onto itself keeps FD_CLOEXEC; the descriptor must survive exec.
                libc::fcntl(from, libc::F_SETFD, 0)
            } else {
                libc::dup2(from, to)
            };
            if rc == -1 {
                return errno();
            }
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, plan.death_signal as libc::c_ulong) != 0 {
            return errno();
        }
        if libc::getppid() != plan.parent {
            // The wrapper died between clone and prctl: the death signal will never fire.
            return libc::ESRCH;
        }
        // The mask std gives its children: none blocked (ours had all blocked across clone).
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::execvpe(plan.argv[0], plan.argv.as_ptr(), plan.envp.as_ptr());
        errno()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Runs `program args` through [`launch`] with `env`, feeds it `input`, and returns its
    /// stdout and exit status.
    fn run(
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
        input: &[u8],
    ) -> (String, std::process::ExitStatus) {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let env = env
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect::<Vec<_>>();
        let mut child =
            launch(&program.into(), &args, env.into_iter(), libc::SIGKILL).expect("launch");
        child.stdin.write_all(input).expect("write stdin");
        drop(child.stdin);
        let mut out = String::new();
        child.stdout.read_to_string(&mut out).expect("read stdout");
        let status =
            super::super::waitpid(child.pid, 0).expect("the launched child is ours to reap");
        (out, status)
    }

    /// One `Name:\tvalue` line of a /proc status text, as a hex mask.
    fn mask(status: &str, name: &str) -> u64 {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} missing in {status}"));
        u64::from_str_radix(line.trim(), 16).expect("hex mask")
    }

    #[test]
    fn the_child_gets_our_pipes_the_path_search_and_exactly_the_environment_given() {
        let (out, status) = run("cat", &[], &[("PATH", "/usr/bin:/bin")], b"relayed\n");
        assert_eq!((out.as_str(), status.code()), ("relayed\n", Some(0)));
        let (out, _) = run("env", &[], &[("ONLY", "this"), ("PATH", "/bin")], b"");
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort_unstable();
        assert_eq!(lines, ["ONLY=this", "PATH=/bin"]);
    }

    /// Covers the mask and SIGPIPE steps of `prepare_and_exec`: this test process has SIGPIPE
    /// ignored (std does it), every signal is blocked across `clone`, and the launching thread
    /// has SIGUSR1 blocked too; the child must start with none blocked and SIGPIPE at its
    /// default. (Caught signals are put back to their default for the moments before `execve`
    /// only: `execve` itself resets them, so no test after it can tell.)
    #[test]
    fn the_child_starts_with_no_signal_blocked_and_sigpipe_at_its_default() {
        // SAFETY: reads the disposition only.
        let ours = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut sa);
            sa.sa_sigaction
        };
        assert_eq!(ours, libc::SIG_IGN, "std ignores SIGPIPE in this process");
        // Block SIGUSR1 on this thread only, as a library of the embedding CLI might.
        // SAFETY: pthread_sigmask with valid local sets.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR1);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        let (status, _) = run("cat", &["/proc/self/status"], &[], b"");
        assert_eq!(mask(&status, "SigBlk:"), 0, "{status}");
        assert_eq!(
            mask(&status, "SigIgn:") & (1 << (libc::SIGPIPE - 1)),
            0,
            "{status}"
        );
    }

    #[test]
    fn the_child_leads_its_own_process_group() {
        let (stat, status) = run("cat", &["/proc/self/stat"], &[], b"");
        assert_eq!(status.code(), Some(0));
        // pid (comm) state ppid pgrp …: comm may hold spaces, so read after the last ')'.
        let pid: i32 = stat
            .split(' ')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("pid");
        let rest: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..]
            .split(' ')
            .collect();
        assert_eq!(
            rest[1].parse::<i32>().ok(),
            Some(std::process::id() as i32),
            "ppid"
        );
        assert_eq!(rest[2].parse::<i32>().ok(), Some(pid), "pgrp");
    }

    #[test]
    fn a_failed_exec_is_reported_with_the_exec_errno() {
        let missing = launch(
            &"/nonexistent/server".into(),
            &[],
            std::iter::empty(),
            libc::SIGKILL,
        );
        let e = missing.err().expect("a missing program fails");
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        let not_exec = launch(
            &"/etc/passwd".into(),
            &[],
            std::iter::empty(),
            libc::SIGKILL,
        );
        assert_eq!(
            not_exec.err().and_then(|e| e.raw_os_error()),
            Some(libc::EACCES)
        );
    }

    #[test]
    fn a_nul_byte_in_an_argument_is_refused_before_any_child_exists() {
        let e = launch(
            &"cat".into(),
            &[OsString::from("a\0b")],
            std::iter::empty(),
            libc::SIGKILL,
        )
        .err()
        .expect("refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
