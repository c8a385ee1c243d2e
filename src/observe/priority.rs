//! The observer's CPU priority: the threads that observe and report run below the relay.
//!
//! Owns one call, made on each of the observer runtime's threads as it starts. On a CPU the
//! relay shares with the observer (one core, or a pinned session), the scheduler then always
//! gives the CPU to a relay thread that has bytes to forward, and the observer works off its
//! backlog in the gaps; the tap's byte budget (`crate::tap::TAP_BUDGET_BYTES`) is how far
//! behind it may fall. Timestamps are the relay's, so observing later changes no `dur_ms`.
//! Must never fail the session: if the priority cannot be lowered the observer runs as before.
//!
//! Why `nice` and not `SCHED_IDLE`: an idle-class thread only runs when nothing else on its CPU
//! wants to, so under a sustained load that keeps the CPU busy (a long pipelined burst, a stream
//! of 5 MB responses) it would fall behind without bound and the tap would drop; a niced thread
//! still gets a small guaranteed share (nice 19 weighs 15 against 1024 for nice 0, ~1.5 %), and
//! the kernel's wake-up preemption rarely lets it take the CPU from a nice-0 relay thread.

/// How far below the default (0) the observer's threads run. See the module doc for the choice.
pub const OBSERVER_NICE: i32 = 19;

/// Lowers the calling thread's CPU priority to [`OBSERVER_NICE`]. On Linux `setpriority` with a
/// thread id applies to that thread only (threads are scheduled entities there); elsewhere it
/// would renice the whole process, relay included, so it does nothing. Returns whether the
/// priority was set.
pub fn lower_current_thread() -> bool {
    #[cfg(target_os = "linux")]
    {
        let tid = nix::unistd::gettid().as_raw();
        let Ok(who) = libc::id_t::try_from(tid) else {
            return false;
        };
        // SAFETY: setpriority takes three integers and touches no memory of ours; any value is
        // sound (an invalid `who` or a refused change only returns -1 with errno set).
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, OBSERVER_NICE) };
        rc == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nice value of one thread, from /proc (field 19 of stat, after the `(comm)` field).
    fn thread_nice(tid: i32) -> Option<i64> {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        rest.split(' ').nth(16)?.parse().ok()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn lowers_only_the_calling_thread() {
        let main_tid = nix::unistd::gettid().as_raw();
        let before = thread_nice(main_tid).expect("own nice");
        let worker = std::thread::spawn(|| {
            let tid = nix::unistd::gettid().as_raw();
            (lower_current_thread(), thread_nice(tid))
        });
        let (ok, nice) = worker.join().expect("worker thread");
        assert!(ok, "raising one's own nice value is always allowed");
        assert_eq!(nice, Some(i64::from(OBSERVER_NICE)));
        assert_eq!(
            thread_nice(main_tid),
            Some(before),
            "other threads keep theirs"
        );
    }
}
