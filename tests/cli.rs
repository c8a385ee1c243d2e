//! The command line as a user meets it: usage errors, --help, --version, and README/--help
//! consistency. Runs the real binary.

use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_bounded-observe-mcp");

fn run(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env_remove("BOUNDED_OBSERVE_MCP_DISABLED")
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs")
}

#[test]
fn unknown_flag_exits_2_with_a_message_and_spawns_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("spawned");
    let script = format!("touch {}", marker.display());
    let out = run(&["--no-such-flag", "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--no-such-flag"),
        "stderr names the flag: {err}"
    );
    assert!(out.stdout.is_empty(), "nothing on stdout");
    assert!(!marker.exists(), "the server must not have been spawned");
}

#[test]
fn missing_server_command_exits_2_with_usage() {
    let out = run(&["--debug"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing server command"), "{err}");
    assert!(
        err.contains("-- <server-cmd>"),
        "the message shows the fix: {err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn http_without_upstream_exits_2_naming_flag_and_env() {
    let out = run(&["--http"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--upstream") && err.contains("BOUNDED_MCP_UPSTREAM"),
        "{err}"
    );
}

#[test]
fn version_prints_the_package_version() {
    let out = run(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}

fn help_text() -> String {
    let out = run(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Flags (`--x`) and env vars (`BOUNDED_X`) named in `text`.
fn names(text: &str) -> (Vec<String>, Vec<String>) {
    let mut flags = Vec::new();
    let mut envs = Vec::new();
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_')) {
        if let Some(f) = word.strip_prefix("--") {
            if !f.is_empty() && f.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
                flags.push(format!("--{f}"));
            }
        } else if word.starts_with("BOUNDED_") && word.len() > "BOUNDED_".len() {
            envs.push(word.to_string());
        }
    }
    flags.sort();
    flags.dedup();
    envs.sort();
    envs.dedup();
    (flags, envs)
}

#[test]
fn help_lists_every_env_var_the_config_reads() {
    let help = help_text();
    for env in bounded_observe_mcp::config::ALL_ENV {
        assert!(help.contains(env), "--help must mention {env}");
    }
}

#[test]
fn readme_config_table_covers_every_flag_and_env_in_help() {
    let help = help_text();
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let (flags, envs) = names(&help);
    assert!(
        flags.len() >= 10,
        "help parsing found too few flags: {flags:?}"
    );
    let table: String = readme
        .lines()
        .filter(|l| l.trim_start().starts_with('|'))
        .collect::<Vec<_>>()
        .join("\n");
    for f in flags
        .iter()
        .filter(|f| !["--help", "--version"].contains(&f.as_str()))
    {
        assert!(
            table.contains(f.as_str()),
            "README's configuration table lacks {f}"
        );
    }
    for e in &envs {
        assert!(
            table.contains(e.as_str()),
            "README's configuration table lacks {e}"
        );
    }
}

#[test]
fn completions_are_generated_for_known_shells_and_unknown_ones_exit_2() {
    let out = run(&["completions", "bash"]);
    assert_eq!(out.status.code(), Some(0));
    let script = String::from_utf8_lossy(&out.stdout);
    assert!(
        script.contains("--token") && script.contains("--upstream"),
        "{script}"
    );
    let out = run(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bash, zsh, fish"));
}

#[test]
fn bad_env_values_warn_naming_the_variable_and_the_server_still_runs() {
    let out = Command::new(BIN)
        .args(["--", "sh", "-c", "exit 5"])
        .env("BOUNDED_SENSOR_TOKEN", "not-a-token")
        .env("BOUNDED_FLUSH_MS", "soon")
        .env_remove("BOUNDED_OBSERVE_MCP_DISABLED")
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert_eq!(
        out.status.code(),
        Some(5),
        "the server ran and its code came back"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("BOUNDED_SENSOR_TOKEN"), "{err}");
    assert!(
        err.contains("obs1.<keyId>.<sig>"),
        "the fix is suggested: {err}"
    );
    assert!(
        !err.contains("not-a-token"),
        "a token is never echoed: {err}"
    );
    assert!(err.contains("BOUNDED_FLUSH_MS"), "{err}");
    assert!(out.stdout.is_empty());
}
