//! Starting the real `bounded-ingest` binary in tests: the command with none of the caller's
//! `BOUNDED_INGEST_*` variables (a developer's shell may export them, and each would change what
//! the test starts), and a reader that keeps draining the child's stderr so it never blocks on a
//! full pipe. Shared by the ingest, TLS, file, client-policy and live pipeline tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command};
use std::sync::mpsc;

/// Every variable `bounded-ingest` reads.
const INGEST_VARS: &[&str] = &[
    "BOUNDED_INGEST_ADMIN_SECRET",
    "BOUNDED_INGEST_ADMIN_SECRET_FILE",
    "BOUNDED_INGEST_SIGNING_SECRET",
    "BOUNDED_INGEST_SIGNING_SECRET_FILE",
    "BOUNDED_INGEST_DB",
    "BOUNDED_INGEST_DB_CA",
    "BOUNDED_INGEST_MAX_CONNECTIONS",
    "BOUNDED_INGEST_LISTEN",
    "BOUNDED_INGEST_BASE",
    "BOUNDED_INGEST_CA",
];

/// The path of the `bounded-ingest` binary cargo built for these tests.
pub const INGEST_BIN: &str = env!("CARGO_BIN_EXE_bounded-ingest");

/// `bounded-ingest`, with none of the variables it reads inherited.
pub fn ingest_command() -> Command {
    let mut c = Command::new(INGEST_BIN);
    without_ingest_vars(&mut c);
    c
}

/// Removes every variable `bounded-ingest` reads from what `c` passes on (for a command that
/// starts the ingest through a shell).
pub fn without_ingest_vars(c: &mut Command) -> &mut Command {
    for v in INGEST_VARS {
        c.env_remove(v);
    }
    c
}

/// The child's stderr, line by line, read on a thread for the life of the child. Panics if
/// stderr was not piped.
pub fn stderr_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}
