//! `bounded-ingest`: the reference ingest. NOT YET BUILT (issue 5).

fn main() -> std::process::ExitCode {
    eprintln!("bounded-ingest: not built yet");
    std::process::ExitCode::from(2)
}
