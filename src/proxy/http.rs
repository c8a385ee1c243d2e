//! Streamable HTTP reverse proxy (DESIGN §1, §2a).
//!
//! NOT YET BUILT (issue 6).

use crate::config::Config;

/// Runs the HTTP proxy until a shutdown signal; returns the process exit code.
pub fn run(_cfg: &Config) -> i32 {
    eprintln!("[observe-mcp] --http mode is not built yet");
    2
}
