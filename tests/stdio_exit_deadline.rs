//! The wrapper's exit after a session is bounded by `--shutdown-flush-ms`, whatever the backlog
//! and the load: with every CPU kept busy by normal-priority loops, the observer (in the batch
//! class, nine nice levels below the wrapper) may never get through a 20,000-call burst, and
//! the exit must not wait for it. What it could not observe makes no event, and no event claims
//! a status it did not see.
//!
//! Its own test binary: the busy loops would slow every other test running beside them.

mod stdio_support;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use stdio_support::{collect, example, refund_burst, wait_for, wrapper_cmd, WAIT};

/// Calls in the burst (the figure).
const CALLS: usize = 20_000;

/// The shutdown flush the wrapper is given.
const FLUSH_MS: u64 = 500;

/// The bound the test holds the exit to: well above the flush, because the kernel may take a
/// while to run a lowered observer thread once more (it must, for the process to end; a few
/// hundred ms measured unprivileged, see README "Exit codes and lifecycle"), and the test
/// machine may be loaded; well below what an exit that waited for the observer took (10–22 s
/// here, never in the run the issue reports).
const EXIT_BOUND: Duration = Duration::from_secs(5);

/// One busy loop per CPU, at normal priority, stopped (and joined) when dropped: a failing test
/// leaves nothing spinning.
struct BusyLoops {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyLoops {
    fn on_every_cpu() -> BusyLoops {
        let n = std::thread::available_parallelism().map_or(2, |n| n.get());
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        BusyLoops { stop, threads }
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// MCP clients run as ordinary users. Run as root, the wrapper could put its observer back at
/// nice 0 once the server is gone (`CAP_SYS_NICE`), which an ordinary user cannot: so a root test
/// run starts it as `nobody`, with the events' directory opened to it.
fn run_as_an_ordinary_user(cmd: &mut std::process::Command, dir: &std::path::Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    const NOBODY: u32 = 65534;
    // /proc/self belongs to the process's effective uid.
    let root = std::fs::metadata("/proc/self").expect("/proc/self").uid() == 0;
    if root {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
            .expect("open the events' directory");
        cmd.uid(NOBODY).gid(NOBODY);
    }
}

/// The number after `key=` in a `--debug` totals line.
fn field(line: &str, key: &str) -> usize {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
}

#[test]
fn exit_is_bounded_by_the_shutdown_flush_under_busy_loops_on_every_cpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events_path = dir.path().join("events.jsonl");
    let server = example("report_fixture");
    let ingest = format!("file:{}", events_path.display());
    let flush = FLUSH_MS.to_string();
    let mut cmd = wrapper_cmd(
        &[
            "--ingest",
            &ingest,
            "--shutdown-flush-ms",
            &flush,
            "--debug",
        ],
        &[server.as_os_str()],
    );
    cmd.stdin(Stdio::piped());
    run_as_an_ordinary_user(&mut cmd, dir.path());

    let busy = BusyLoops::on_every_cpu();
    let mut child = cmd.spawn().expect("spawn wrapper");
    let stderr = collect(child.stderr.take().expect("stderr"));
    let stdout = child.stdout.take().expect("stdout");
    // Every answer read as it comes, so the server never blocks on a full pipe.
    let (answers_tx, answers) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut n = 0usize;
        for line in BufReader::new(stdout).lines() {
            if line.is_err() {
                break;
            }
            n += 1;
            if n == CALLS + 1 {
                let _ = answers_tx.send(());
            }
        }
        n
    });
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(&refund_burst(CALLS))
        .expect("write the burst");
    answers
        .recv_timeout(WAIT)
        .expect("every call answered through the wrapper");

    drop(stdin);
    let closed = Instant::now();
    let status = wait_for(&mut child, EXIT_BOUND);
    let took = closed.elapsed();
    drop(busy);

    assert!(status.success(), "the server's exit code: {status:?}");
    assert!(took < EXIT_BOUND, "exit took {took:?}");
    assert_eq!(
        reader.join().expect("reader"),
        CALLS + 1,
        "every byte relayed"
    );

    // Whatever was observed in time: each event a call that succeeded, reported as such, once.
    let text = std::fs::read_to_string(&events_path).unwrap_or_default();
    let mut ids = std::collections::HashSet::new();
    for line in text.lines() {
        let batch: Value = serde_json::from_str(line).expect("a batch per line");
        for e in batch["events"].as_array().expect("events") {
            assert_eq!(e["status"], 200, "a false status: {e}");
            assert_eq!(e["class"], "action", "{e}");
            assert!(ids.insert(e["id"].as_str().expect("id").to_string()));
        }
    }
    assert!(ids.len() <= CALLS);
    // What was not delivered is counted, never reported delivered.
    let stderr = stderr.text();
    let totals = stderr
        .lines()
        .find(|l| l.contains("Reporter totals"))
        .unwrap_or_else(|| panic!("no totals in stderr:\n{stderr}"));
    assert!(
        field(totals, "delivered") <= ids.len(),
        "delivered counts only what reached the sink: {totals} ({} in the file)",
        ids.len()
    );
    // And every call is an event or counted as unobserved, whatever the observer reached by its
    // cut-off: the calls whose answers it did not read, and those whose requests it never did.
    // (When the observer's thread has not ended by the deadline its totals are unknown, and
    // the wrapper says so instead.)
    let finished = |l: &&str| l.contains("Observer totals") && !l.contains("totals unknown");
    if let Some(observer) = stderr.lines().find(finished) {
        assert_eq!(
            field(observer, "events") + field(observer, "unobserved"),
            CALLS,
            "a call neither an event nor counted: {observer}"
        );
    } else {
        assert!(stderr.contains("Observer totals unknown"), "{stderr}");
    }
}
