//! The embedding example (`examples/parent_cli.rs`): a parent `bounded` CLI mounting the wrapper
//! as `bounded observe mcp …` through the library, run end to end.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn parent_cli() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_bounded-observe-mcp"));
    let p = bin
        .parent()
        .expect("target dir")
        .join("examples")
        .join("parent_cli");
    assert!(
        p.exists(),
        "examples/parent_cli is built by cargo test: {}",
        p.display()
    );
    p
}

#[test]
fn parent_cli_relays_bytes_and_propagates_exit_code() {
    let mut child = Command::new(parent_cli())
        .args(["observe", "mcp", "--", "sh", "-c", "cat; exit 3"])
        .env_remove("BOUNDED_SENSOR_TOKEN")
        .env_remove("BOUNDED_OBSERVE_MCP_DISABLED")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn parent_cli");
    let msg = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n";
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(msg)
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.stdout, msg, "the server's bytes, unchanged");
    assert_eq!(out.status.code(), Some(3), "the server's exit code");
}

#[test]
fn parent_cli_help_shows_the_wrapper_flags() {
    let out = Command::new(parent_cli())
        .args(["observe", "mcp", "--help"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--token", "--ingest", "--capture", "--upstream"] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}
