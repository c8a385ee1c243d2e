//! The observer's CPU priority: the threads that observe and report run below the relay.
//!
//! Owns one call, made on each of the observer runtime's threads as it starts. On a CPU the
//! relay shares with the observer (one core, or a pinned session), the scheduler then always
//! gives the CPU to a relay thread that has bytes to forward, and the observer works off its
//! backlog in the gaps; the tap's byte budget (`crate::tap::TAP_BUDGET_BYTES`) is how far
//! behind it may fall. Timestamps are the relay's, so observing later changes no `dur_ms`.
//! Must never fail the session: if the priority cannot be lowered the observer runs as before.
//!
//! The class is `SCHED_IDLE` (with nice 19 underneath, which is what remains if the idle class
//! is refused). A nice-19 thread that wakes up may still preempt a relay thread and run out its
//! time slice first: in the benchmark that showed as sequential calls stalled for 2–5 ms, and
//! as the observer taking CPU inside a pipelined burst. An idle-class thread never preempts a
//! normal one; it runs when the relay, the client and the server are all waiting, which is
//! when its work costs nobody anything. The price: on a CPU kept busy without pause by other
//! work it gets only a sliver (weight 3 against 1024), so a long enough burst can outrun it;
//! then the tap's byte budget bounds the backlog, and the calls it drops are counted as
//! unobserved, never given a false status. Unprivileged threads cannot leave the idle class
//! again, so this is decided once, at thread start. Known cost: the observer holds the tap's
//! lock for a queue swap; preempted inside it while other work keeps the CPU busy, it makes a
//! relay thread that needs the lock wait up to a scheduling slice (a few ms). Measured, that is
//! rarer and shorter than the nice-19 wake-up preemptions it replaces; a lock-free tap would
//! remove it.

/// How far below the default (0) the observer's threads run. See the module doc for the choice.
pub const OBSERVER_NICE: i32 = 19;

/// Puts the calling thread in the idle scheduling class, at [`OBSERVER_NICE`]. On Linux both
/// calls apply to that thread only (threads are scheduled entities there); elsewhere they would
/// change the whole process, relay included, so it does nothing. Returns whether either was set.
pub fn lower_current_thread() -> bool {
    #[cfg(target_os = "linux")]
    {
        let tid = nix::unistd::gettid().as_raw();
        let Ok(who) = libc::id_t::try_from(tid) else {
            return false;
        };
        // SAFETY: setpriority takes three integers and touches no memory of ours; any value is
        // sound (an invalid `who` or a refused change only returns -1 with errno set).
        let niced = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, OBSERVER_NICE) } == 0;
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid sched_param that outlives the call, which only reads it;
        // pid 0 is the calling thread. A refusal only returns -1 with errno set.
        let idle = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0;
        niced || idle
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field `n` (1-based, as in proc(5)) of one thread's stat line; fields from 3 on follow
    /// the `(comm)` field, which may itself contain spaces.
    fn stat_field(tid: i32, n: usize) -> Option<i64> {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        rest.split(' ').nth(n - 3)?.parse().ok()
    }

    fn thread_nice(tid: i32) -> Option<i64> {
        stat_field(tid, 19)
    }

    fn thread_policy(tid: i32) -> Option<i64> {
        stat_field(tid, 41)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn lowers_only_the_calling_thread() {
        let main_tid = nix::unistd::gettid().as_raw();
        let before = thread_nice(main_tid).expect("own nice");
        let policy_before = thread_policy(main_tid).expect("own policy");
        let worker = std::thread::spawn(|| {
            let tid = nix::unistd::gettid().as_raw();
            (lower_current_thread(), thread_nice(tid), thread_policy(tid))
        });
        let (ok, nice, policy) = worker.join().expect("worker thread");
        assert!(ok, "raising one's own nice value is always allowed");
        assert_eq!(nice, Some(i64::from(OBSERVER_NICE)));
        assert_eq!(policy, Some(i64::from(libc::SCHED_IDLE)));
        assert_eq!(
            (thread_nice(main_tid), thread_policy(main_tid)),
            (Some(before), Some(policy_before)),
            "other threads keep theirs"
        );
    }
}
