//! Pacing: how observation yields the CPU to the relay. Used by the observer and the reporter
//! (they share one runtime thread), owned by neither.
//!
//! Owns [`lower_current_thread`], called on the observer's thread as it starts (batch
//! scheduling class, [`OBSERVER_NICE_BELOW`] levels below the wrapper's own priority; the
//! threads its runtime starts go to the same level, [`lower_current_thread_to`]),
//! and [`Pacer`]: on a CPU shared with the relay while traffic flows and the observer is at
//! least [`PACE_BEHIND`] but less than [`PACE_UNTIL`] behind it, the observer works in slices
//! of at most [`PACE_SLICE`] of CPU and rests [`PACE_REST`] after each; within [`PACE_RECENT`]
//! of new chunks it yields instead of resting; past that, once the session is closing, less
//! than [`PACE_BEHIND`] behind, or so far behind that the tap nears its byte budget, it works
//! flat out. So in a burst the relay goes first and the observer catches up in the gaps; the
//! tap's byte budget (`crate::tap::TAP_BUDGET_BYTES`) bounds how far behind it may fall, and
//! calls lost to tap drops are counted as unobserved, never given a false status. Timestamps
//! are the relay's, so observing later changes no `dur_ms`. Must never fail the session (if the
//! priority cannot be lowered the observer runs as before) and never slow the relay.
//!
//! Why the batch class plus pacing, the scheduler traces and the rejected variants (nice alone,
//! the idle class, sleeping instead of yielding): `bench/README.md`, "Pacing the observer".

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// While it may pace, [`Pacer::pace`] reads the clock on one call in this many. A call comes per
/// frame and per event, each a microsecond or less of work, so a slice runs over by a few
/// microseconds at most; reading the clock on every call cost about 20 ns each, three times per
/// `tools/call` (`bench/README.md`, "Clock reads per call").
pub const PACE_STRIDE: u32 = 8;

/// How many nice levels below the wrapper's own the observer's threads run (at most to 19, the
/// kernel's lowest). Relative, not a fixed nice 19: what decides how much of a shared CPU the
/// observer gets is its weight against the relay's threads, which run at the wrapper's nice.
/// Nine levels is a weight about 7.5 times lower (nice 0 weighs 1,024, nice 9 137), the
/// balance the benchmark measures (it runs under `nice`: relay at 10, observer at 19, 110
/// against 15). A fixed 19 gave a wrapper at nice 0, as MCP clients start it, a weight 68
/// times lower: on one busy CPU the observer fell behind a session of back-to-back calls until
/// the tap dropped, and 3,000 to 22,000 of 50,000 sequential calls went unobserved
/// (`bench/README.md`, "The observer's priority, relative to the wrapper's").
pub const OBSERVER_NICE_BELOW: i32 = 9;

/// The kernel's lowest priority (highest nice value).
const NICE_MAX: i32 = 19;

/// The calling thread's nice value, if the kernel tells it.
#[cfg(target_os = "linux")]
fn own_nice() -> Option<i32> {
    let who = libc::id_t::try_from(nix::unistd::gettid().as_raw()).ok()?;
    // -1 is both a nice value and the error return: only errno tells them apart.
    nix::errno::Errno::clear();
    // SAFETY: getpriority takes two integers and touches no memory of ours; an invalid `who`
    // only returns -1 with errno set.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, who) };
    (nice != -1 || nix::errno::Errno::last_raw() == 0).then_some(nice)
}

/// Puts the calling thread in the batch scheduling class, [`OBSERVER_NICE_BELOW`] nice levels
/// below its own (a thread starts with its creator's, so the wrapper's). On Linux both
/// calls apply to that thread only (threads are scheduled entities there); elsewhere they would
/// change the whole process, relay included, so it does nothing. Returns the nice value it put
/// the thread at (at most the kernel's lowest) when either call took effect, `None` when
/// neither did. Call it once, at thread start: an unprivileged thread cannot take back a lower
/// priority.
///
/// Batch, not idle: a thread in the batch class never preempts on waking, and the relay's
/// threads preempt it as they would an idle-class one, but it keeps a small share of a CPU that
/// normal threads keep busy. In the idle class an unprivileged observer got so little that the
/// process could not end (every thread must run once to exit) until seconds after the session's
/// deadline (`bench/README.md`, "What the switches showed").
pub fn lower_current_thread() -> Option<i32> {
    #[cfg(target_os = "linux")]
    {
        lower_current_thread_to(own_nice().unwrap_or(0) + OBSERVER_NICE_BELOW)
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Puts the calling thread in the batch scheduling class at nice `nice` (at most the kernel's
/// lowest), as [`lower_current_thread`] does, for a thread that works for an observer thread
/// lowered to `nice`: the file sink's writer, which starts from the observer's thread and so
/// already runs at its nice. Lowered relative to that it went another nine levels down, to a
/// weight of 18 against the observer's 137, and the writes the observer waits for waited for
/// the observer's slices to end (`bench/README.md`, "Events written ahead of the reporter").
/// Returns the nice value it put the thread at when either call took effect, as
/// [`lower_current_thread`] does.
pub fn lower_current_thread_to(nice: i32) -> Option<i32> {
    #[cfg(target_os = "linux")]
    {
        let tid = nix::unistd::gettid().as_raw();
        let who = libc::id_t::try_from(tid).ok()?;
        let nice = nice.min(NICE_MAX);
        // SAFETY: setpriority takes three integers and touches no memory of ours; any value is
        // sound (an invalid `who` or a refused change only returns -1 with errno set).
        let niced = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, nice) } == 0;
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid sched_param that outlives the call, which only reads it;
        // pid 0 is the calling thread. A refusal only returns -1 with errno set.
        let batch = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } == 0;
        (niced || batch).then_some(nice)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = nice;
        None
    }
}

/// Puts thread `tid` of this process back at the calling thread's nice (the wrapper's) in the
/// normal class, undoing [`lower_current_thread`]; returns whether it did. The kernel allows it
/// only to a privileged process (`CAP_SYS_NICE`) or under a `RLIMIT_NICE` that permits it (0 by
/// default): elsewhere it returns false and changes nothing. For a thread that must still finish
/// work while every CPU is kept busy: nine levels down it gets about 12 % of a CPU shared with
/// one thread at the wrapper's priority.
pub fn restore_thread(tid: i32) -> bool {
    #[cfg(target_os = "linux")]
    {
        let Ok(who) = libc::id_t::try_from(tid) else {
            return false;
        };
        let nice = own_nice().unwrap_or(0);
        // SAFETY: setpriority takes three integers and touches no memory of ours; an unknown or
        // foreign `tid` or a refused change only returns -1 with errno set.
        let niced = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, nice) } == 0;
        if niced {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: `param` is a valid sched_param that outlives the call, which only reads
            // it; a refused change only returns -1 with errno set.
            unsafe { libc::sched_setscheduler(tid, libc::SCHED_OTHER, &param) };
        }
        niced
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = tid;
        false
    }
}

/// Most CPU time the observer's thread spends in one stretch, on a CPU it shares with the relay
/// while traffic flows, before it rests. A relay thread that becomes runnable while the observer
/// has the CPU waits at most about this long. Each stretch may delay one sequential call, so
/// the share of calls delayed is about the observer's CPU per call over this slice: at 50 µs
/// and ~0.8 µs per call more than 1 % were, and sequential p99 was the slice itself
/// (`bench/README.md`, "Pacing the observer").
pub const PACE_SLICE: Duration = Duration::from_micros(200);

/// How long the observer's thread rests after a full slice while traffic flows. With
/// [`PACE_SLICE`] it bounds the observer to about a sixth of a busy shared CPU.
pub const PACE_REST: Duration = Duration::from_millis(1);

/// How long after the observer last saw the relay hand over new chunks it still yields after
/// each full slice (see the module doc).
pub const PACE_RECENT: Duration = Duration::from_millis(5);

/// How far behind the relay the observer must be (tap bytes passed to it and not yet read,
/// whether taken at its last look or still queued) before it paces at all. Below it the
/// observer finishes its work in one stretch: between sequential calls that is one linger's
/// worth (`observe::stdio::TAP_LINGER`, 2 ms, of calls: 65–77 KB at the benchmark's 6–7 µs and
/// 219 bytes a call), and cutting it into slices only spreads the same work over more
/// calls, so that more of them wait for it (a slice ends in a yield, and each resumed slice
/// holds up another call). About twice that, so a sequential session seldom reaches it (the
/// benchmark's pinned 2,200 calls: 11 yields, 0–4 at 256 KiB, and the same p99); a pipelined
/// burst passes it within about 600 calls and puts megabytes behind it, and there pacing lets
/// the relay go first. Every byte below the threshold is a burst's start worked flat out: at
/// 256 KiB that was about 1,200 calls of observing inside a 20,000-call pinned burst, and the
/// burst ran at 0.91 × the minimal relay's rate; at 128 KiB, 0.97, with added p99 and the
/// contended row unchanged (`bench/README.md`, "The pace starts at 128 KiB behind").
pub const PACE_BEHIND: u64 = 128 * 1024;

/// How far behind the relay the observer may fall before it stops pacing and works flat out
/// again: half the tap's budget ([`crate::tap::TAP_BUDGET_BYTES`]). Pacing lets the relay go
/// first while falling behind costs nothing; near the budget, the tap would start dropping
/// calls, which then go unobserved. When calls came back to back on one busy CPU for longer
/// than a burst (50,000 sequential calls, the wrapper at nice 0), an observer paced up to the
/// budget lost up to 7,203 of them (11 sessions); stopping at half of it, none in 11 of 12
/// sessions and 560 in one (`bench/README.md`, "The observer's priority, relative to the
/// wrapper's").
pub const PACE_UNTIL: u64 = crate::tap::TAP_BUDGET_BYTES as u64 / 2;

/// Paces the observer's thread on a CPU it shares with the relay (see the module doc).
///
/// Called often ([`Pacer::pace`], per frame and per event) from the observer's one runtime
/// thread, where the observer and the reporter both run; the rest is a blocking sleep, so it
/// rests both. Cheap when it has nothing to do: at most three relaxed loads when the CPU is not
/// shared, the observer is not far behind or no traffic flows; otherwise a monotonic clock read
/// on one call in [`PACE_STRIDE`], and the thread's CPU clock (a system call) only once a slice
/// of wall time has passed.
#[derive(Debug)]
pub struct Pacer {
    /// The process may run on one CPU only (affinity, cgroup quota): observer and relay share it.
    shared_cpu: bool,
    /// The relay handed the tap new chunks between the observer's last two looks.
    live: AtomicBool,
    /// Start of the current stretch: wall clock (ns since `origin`) and the thread's CPU clock (ns).
    mark_wall: AtomicU64,
    mark_cpu: AtomicU64,
    origin: Instant,
    /// When (ns since `origin`, never 0) the observer last saw new chunks; 0: never, or the
    /// session is closing.
    live_at: AtomicU64,
    /// How far behind the relay the observer is, in tap bytes (see [`Pacer::set_backlog`]).
    backlog: AtomicU64,
    /// Calls of [`Pacer::pace`] left before it reads the clock again (see [`PACE_STRIDE`]). Only
    /// the observer's thread paces, so a load and a store suffice.
    skip: AtomicU32,
    /// Rests and yields taken (for `--debug` totals and tests).
    rests: AtomicU64,
    yields: AtomicU64,
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer::new(std::thread::available_parallelism().is_ok_and(|n| n.get() == 1))
    }
}

impl Pacer {
    /// `shared_cpu`: whether the observer shares its only CPU with the relay (the default
    /// asks `available_parallelism`, which counts the affinity mask and cgroup CPU quota).
    pub fn new(shared_cpu: bool) -> Pacer {
        Pacer {
            shared_cpu,
            live: AtomicBool::new(false),
            mark_wall: AtomicU64::new(0),
            mark_cpu: AtomicU64::new(0),
            origin: Instant::now(),
            live_at: AtomicU64::new(0),
            backlog: AtomicU64::new(0),
            skip: AtomicU32::new(0),
            rests: AtomicU64::new(0),
            yields: AtomicU64::new(0),
        }
    }

    pub fn shared_cpu(&self) -> bool {
        self.shared_cpu
    }

    /// Rests taken so far.
    pub fn rests(&self) -> u64 {
        self.rests.load(Ordering::Relaxed)
    }

    /// Yields taken so far.
    pub fn yields(&self) -> u64 {
        self.yields.load(Ordering::Relaxed)
    }

    /// Whether the relay handed the tap new chunks since the observer's previous look (the
    /// observer decides, from the tap's offer count, at each look).
    pub fn set_live(&self, live: bool) {
        self.live.store(live, Ordering::Relaxed);
        if live {
            self.live_at.store(self.wall_ns().max(1), Ordering::Relaxed);
        }
    }

    /// How many tap bytes the relay has passed to the observer that it has not read yet
    /// (taken at its last look or still queued): it paces only while that is at least
    /// [`PACE_BEHIND`] and less than [`PACE_UNTIL`].
    pub fn set_backlog(&self, bytes: u64) {
        self.backlog.store(bytes, Ordering::Relaxed);
    }

    /// The session is closing: from now on the observer works flat out.
    pub fn set_closing(&self) {
        self.live.store(false, Ordering::Relaxed);
        self.live_at.store(0, Ordering::Relaxed);
    }

    /// Rests the calling thread for [`PACE_REST`] if it has had the CPU for a [`PACE_SLICE`] of
    /// a stretch in which it held the CPU more than half the time, on a shared CPU, while it and
    /// the relay take turns ([`Pacer::set_live`]) and the observer is behind by at least
    /// [`PACE_BEHIND`] and less than [`PACE_UNTIL`] ([`Pacer::set_backlog`]); yields instead
    /// within [`PACE_RECENT`] after that. Returns whether it rested or yielded. A stretch in
    /// which the thread mostly waited (it ran in the gaps, taking nothing from anybody) just
    /// starts over.
    pub fn pace(&self) -> bool {
        let backlog = self.backlog.load(Ordering::Relaxed);
        if !self.shared_cpu || !(PACE_BEHIND..PACE_UNTIL).contains(&backlog) {
            return false;
        }
        let live = self.live.load(Ordering::Relaxed);
        let live_at = self.live_at.load(Ordering::Relaxed);
        if !live && live_at == 0 {
            return false;
        }
        let skip = self.skip.load(Ordering::Relaxed);
        if skip > 0 {
            self.skip.store(skip - 1, Ordering::Relaxed);
            return false;
        }
        self.skip.store(PACE_STRIDE - 1, Ordering::Relaxed);
        let wall = self.wall_ns();
        if !live && wall.saturating_sub(live_at) >= PACE_RECENT.as_nanos() as u64 {
            return false;
        }
        let mark_wall = self.mark_wall.load(Ordering::Relaxed);
        let slice = PACE_SLICE.as_nanos() as u64;
        let elapsed = wall.saturating_sub(mark_wall);
        // CPU time never exceeds wall time: no slice can be full yet.
        if mark_wall != 0 && elapsed < slice {
            return false;
        }
        let Some(cpu) = thread_cpu_ns() else {
            return false;
        };
        let used = cpu.saturating_sub(self.mark_cpu.load(Ordering::Relaxed));
        if mark_wall != 0 && used < slice {
            if elapsed >= 4 * slice {
                self.mark(wall, cpu);
            }
            return false;
        }
        let rest = mark_wall != 0 && used.saturating_mul(2) > elapsed;
        if rest && live {
            std::thread::sleep(PACE_REST);
            self.rests.fetch_add(1, Ordering::Relaxed);
        } else if rest {
            std::thread::yield_now();
            self.yields.fetch_add(1, Ordering::Relaxed);
        }
        self.mark(self.wall_ns(), cpu);
        rest
    }

    fn mark(&self, wall: u64, cpu: u64) {
        // Never 0: 0 means no stretch has started.
        self.mark_wall.store(wall.max(1), Ordering::Relaxed);
        self.mark_cpu.store(cpu, Ordering::Relaxed);
    }

    fn wall_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The calling thread's CPU time, in ns.
fn thread_cpu_ns() -> Option<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).ok()?;
    let secs = u64::try_from(t.tv_sec()).ok()?;
    let nanos = u64::try_from(t.tv_nsec()).ok()?;
    Some(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`PACE_STRIDE`] calls of `pace`, as the observer makes them in a row: exactly one of them
    /// reads the clock and decides.
    fn look(p: &Pacer) -> bool {
        (0..PACE_STRIDE).fold(false, |paced, _| p.pace() | paced)
    }

    fn spin(d: Duration) {
        let until = thread_cpu_ns().expect("thread clock") + d.as_nanos() as u64;
        while thread_cpu_ns().expect("thread clock") < until {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn rests_only_a_thread_that_works_flat_out_while_traffic_flows() {
        let p = Pacer::new(true);
        // No traffic: never rests, however long it works.
        spin(PACE_SLICE * 3);
        assert!(!look(&p));
        // Traffic, but less than the threshold behind: finishes it in one stretch.
        p.set_live(true);
        p.set_backlog(PACE_BEHIND - 1);
        assert!(!look(&p));
        for _ in 0..4 {
            spin(PACE_SLICE * 2);
            assert!(!look(&p), "nothing to pace below the backlog threshold");
        }
        assert_eq!(p.rests() + p.yields(), 0);
        p.set_backlog(PACE_BEHIND);
        p.set_live(true);
        assert!(!look(&p), "the first call only starts a stretch");
        // A full slice of CPU in a stretch it held the CPU for. (Retried: a test thread
        // preempted mid-spin has, rightly, not held the CPU.)
        let t0 = Instant::now();
        let rested = (0..50).any(|_| {
            spin(PACE_SLICE * 2);
            look(&p)
        });
        assert!(rested, "a thread working flat out rests");
        assert!(t0.elapsed() >= PACE_REST, "it slept");
        // A stretch spent mostly waiting (running in the gaps) is no reason to rest.
        std::thread::sleep(PACE_SLICE * 10);
        spin(PACE_SLICE + PACE_SLICE / 2);
        assert!(!look(&p));
        // Nothing new at the last look, but chunks came recently: it yields, it does not sleep.
        p.set_live(true);
        p.set_live(false);
        let rests = p.rests();
        let yielded = (0..50).any(|_| {
            spin(PACE_SLICE * 2);
            look(&p)
        });
        assert!(
            yielded && p.yields() > 0,
            "a thread working flat out yields"
        );
        assert_eq!(p.rests(), rests, "no sleep without new chunks");
        // So far behind that the tap nears its budget: flat out, traffic or not.
        p.set_backlog(PACE_UNTIL);
        p.set_live(true);
        let paced = (p.rests(), p.yields());
        for _ in 0..4 {
            spin(PACE_SLICE * 2);
            assert!(!look(&p), "no pacing past PACE_UNTIL");
        }
        assert_eq!((p.rests(), p.yields()), paced);
        p.set_backlog(PACE_BEHIND);
        p.set_live(false);
        // Nothing new for a while: flat out again.
        std::thread::sleep(PACE_RECENT);
        spin(PACE_SLICE * 2);
        assert!(!look(&p));
        // Nor once the session is closing, however recent the chunks.
        p.set_live(true);
        p.set_closing();
        spin(PACE_SLICE * 2);
        assert!(!look(&p));
        spin(PACE_SLICE * 2);
        assert!(!look(&p));
    }

    /// Between two looks at the clock, calls only count down: a thread that used a full slice
    /// rests on the call that looks, not before.
    #[test]
    fn decides_on_one_call_in_a_stride() {
        let p = Pacer::new(true);
        p.set_backlog(PACE_BEHIND);
        p.set_live(true);
        assert!(!p.pace(), "a new pacer looks at once: the stretch starts");
        let rested = (0..50).any(|_| {
            spin(PACE_SLICE * 2);
            for _ in 1..PACE_STRIDE {
                assert!(!p.pace(), "no look between strides");
            }
            p.pace()
        });
        assert!(rested, "a thread working flat out rests");
    }

    #[test]
    fn never_rests_on_a_cpu_of_its_own() {
        let p = Pacer::new(false);
        p.set_live(true);
        assert!(!look(&p));
        spin(PACE_SLICE * 3);
        assert!(!look(&p));
        p.set_live(false);
        spin(PACE_SLICE * 3);
        assert!(!look(&p));
        assert_eq!((p.rests(), p.yields()), (0, 0));
        assert!(!p.shared_cpu());
    }

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

    /// Where `lower_current_thread` puts a thread that starts at `nice`.
    fn lowered_from(nice: i64) -> i64 {
        (nice + i64::from(OBSERVER_NICE_BELOW)).min(i64::from(NICE_MAX))
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn lowers_only_the_calling_thread_relative_to_its_own_priority() {
        let main_tid = nix::unistd::gettid().as_raw();
        let before = thread_nice(main_tid).expect("own nice");
        assert_eq!(own_nice().map(i64::from), Some(before));
        let policy_before = thread_policy(main_tid).expect("own policy");
        let worker = std::thread::spawn(|| {
            let tid = nix::unistd::gettid().as_raw();
            (lower_current_thread(), thread_nice(tid), thread_policy(tid))
        });
        let (lowered, nice, policy) = worker.join().expect("worker thread");
        let lowered = lowered.expect("raising one's own nice value is always allowed");
        assert_eq!(nice, Some(lowered_from(before)));
        assert_eq!(
            Some(i64::from(lowered)),
            nice,
            "it says where it put the thread"
        );
        assert_eq!(policy, Some(i64::from(libc::SCHED_BATCH)));
        assert_eq!(
            (thread_nice(main_tid), thread_policy(main_tid)),
            (Some(before), Some(policy_before)),
            "other threads keep theirs"
        );
    }

    /// A thread started from a lowered one starts at its nice and class; lowered to that
    /// thread's level (the file sink's writer, started from the observer's thread), it stays
    /// there, where lowered relative to itself it would go nine levels further.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_lowered_to_the_observers_level_goes_no_further() {
        let base = own_nice().expect("own nice");
        let (observer, pool) = std::thread::spawn(|| {
            let level = lower_current_thread().expect("lowered");
            let tid = nix::unistd::gettid().as_raw();
            let pool = std::thread::spawn(move || {
                let tid = nix::unistd::gettid().as_raw();
                let inherited = thread_nice(tid);
                assert_eq!(lower_current_thread_to(level), Some(level));
                (inherited, thread_nice(tid), thread_policy(tid))
            })
            .join()
            .expect("pool thread");
            ((level, thread_nice(tid)), pool)
        })
        .join()
        .expect("observer thread");
        let level = i64::from(observer.0);
        assert_eq!(level, lowered_from(i64::from(base)));
        assert_eq!(observer.1, Some(level));
        assert_eq!(
            pool.0,
            Some(level),
            "a new thread starts at its creator's nice"
        );
        assert_eq!(
            (pool.1, pool.2),
            (Some(level), Some(i64::from(libc::SCHED_BATCH)))
        );
    }

    /// Covers `own_nice` and the arithmetic: a thread that starts at 4 goes to 13, one at 15 to
    /// the kernel's lowest, 19, not past it.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_is_lowered_from_where_it_starts_and_no_further_than_19() {
        for (start, lowered) in [(4, 13), (15, 19), (19, 19)] {
            let got = std::thread::spawn(move || {
                let tid = nix::unistd::gettid().as_raw();
                let who = libc::id_t::try_from(tid).expect("tid");
                // SAFETY: setpriority takes three integers and touches no memory; raising the
                // calling thread's own nice value is always allowed.
                let set = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, start) };
                // Skipped where the test already runs above `start`: going back down needs
                // privilege (CI runs at 0).
                if set != 0 || own_nice() != Some(start) {
                    return None;
                }
                assert!(lower_current_thread().is_some());
                thread_nice(tid)
            })
            .join()
            .expect("worker thread");
            if let Some(nice) = got {
                assert_eq!(nice, lowered, "from {start}");
            }
        }
    }

    /// Covers the `unsafe` in [`restore_thread`]: where the kernel allows it (a privileged
    /// test run) the lowered thread is back at the normal class and the restorer's nice; where
    /// it does not, nothing changed and it says so.
    #[cfg(target_os = "linux")]
    #[test]
    fn restoring_a_lowered_thread_is_all_or_reported() {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            let tid = nix::unistd::gettid().as_raw();
            assert!(lower_current_thread().is_some());
            tid_tx.send(tid).expect("send tid");
            let _ = go_rx.recv();
            (thread_nice(tid), thread_policy(tid))
        });
        let tid = tid_rx.recv().expect("worker tid");
        let base = thread_nice(nix::unistd::gettid().as_raw()).expect("own nice");
        let restored = restore_thread(tid);
        go_tx.send(()).expect("release worker");
        let (nice, policy) = worker.join().expect("worker thread");
        if restored {
            assert_eq!(
                (nice, policy),
                (Some(base), Some(i64::from(libc::SCHED_OTHER))),
                "back at the restoring thread's own priority"
            );
        } else {
            assert_eq!(
                (nice, policy),
                (Some(lowered_from(base)), Some(i64::from(libc::SCHED_BATCH)))
            );
        }
        assert!(!restore_thread(-1), "no such thread");
    }
}
