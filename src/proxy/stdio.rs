//! Stdio proxy: child process, two relay loops, lifecycle (DESIGN §2 invariants 1–3, 6, 7).
//!
//! NOT YET BUILT (issue 2).

/// Size of one relay read.
pub const READ_BUF: usize = 64 * 1024;

use std::ffi::OsString;

use crate::observe::EndCause;
use crate::tap::TapSender;

/// What the session's end looked like.
#[derive(Debug, Clone, Copy)]
pub struct StdioOutcome {
    /// The child's exit code, or 128+N if killed by signal N; 126/127 if it could not start.
    pub exit_code: i32,
    /// `Transport` if the child went away while the client was still connected.
    pub end_cause: EndCause,
}

pub struct StdioProxy {
    program: OsString,
    args: Vec<OsString>,
}

impl StdioProxy {
    pub fn new(program: OsString, args: Vec<OsString>) -> Self {
        StdioProxy { program, args }
    }

    /// Relays without observation; returns the exit code.
    pub fn run(self, _c2s: Option<TapSender>, _s2c: Option<TapSender>) -> i32 {
        let _ = (&self.program, &self.args);
        127
    }

    /// Relays with both directions tapped; blocks until the session is over.
    pub fn run_observed(
        self,
        c2s: TapSender,
        s2c: TapSender,
        _rt: tokio::runtime::Handle,
    ) -> StdioOutcome {
        StdioOutcome {
            exit_code: self.run(Some(c2s), Some(s2c)),
            end_cause: EndCause::SessionEnd,
        }
    }
}

/// Kill switch: replaces this process with the server. Returns only if exec failed (126/127).
pub fn exec_passthrough(_program: &OsString, _args: &[OsString]) -> i32 {
    127
}
