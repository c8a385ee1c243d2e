//! `bounded-observe-mcp`: thin entry point. All logic lives in the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    let env = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let code = bounded_observe_mcp::run_mcp_observe(std::env::args_os(), env);
    // Exit codes are 0..=255 on Unix; anything else is squeezed into the byte the OS keeps.
    ExitCode::from((code & 0xff) as u8)
}
