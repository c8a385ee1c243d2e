//! A parent `bounded` CLI that mounts the wrapper as `bounded observe mcp …`.
//!
//! Shows the embedding contract: the wrapper's flags are a `clap::Args` struct a parent can
//! flatten into its own subcommand tree, and the library runs from those parsed flags with an
//! environment map the parent controls. Run it as
//! `cargo run --example parent_cli -- observe mcp --ingest file:/tmp/ev.jsonl -- <server-cmd>`.

use std::process::ExitCode;

use bounded_observe_mcp::cli::ObserveArgs;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "bounded", about = "The bounded toolbox")]
struct Bounded {
    #[command(subcommand)]
    command: Top,
}

#[derive(Subcommand)]
enum Top {
    /// Observability sensors.
    Observe {
        #[command(subcommand)]
        sensor: Sensor,
    },
}

#[derive(Subcommand)]
enum Sensor {
    /// Wrap an MCP server and report every tools/call.
    Mcp(ObserveArgs),
}

fn main() -> ExitCode {
    let cli = Bounded::parse();
    let env = std::env::vars()
        .filter(|(k, _)| k.starts_with("BOUNDED_"))
        .collect();
    let code = match cli.command {
        Top::Observe {
            sensor: Sensor::Mcp(args),
        } => bounded_observe_mcp::run_observe_args(&args, &env),
    };
    ExitCode::from((code & 0xff) as u8)
}
