//! Diagnostics: every line the wrapper itself prints goes to stderr, prefixed `[observe-mcp]`.
//!
//! Owns the tracing subscriber setup. Must never write to stdout (invariant 1: stdout carries
//! only the child's bytes).

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::{format::Writer, FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Prefix of every line the wrapper writes (DESIGN §2 invariant 1).
pub const PREFIX: &str = "[observe-mcp]";

struct Prefixed(&'static str);

impl<S, N> FormatEvent<S, N> for Prefixed
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = *event.metadata().level();
        let prefix = self.0;
        if level == Level::INFO {
            write!(writer, "{prefix} ")?;
        } else {
            write!(writer, "{prefix} {}: ", level.as_str().to_ascii_lowercase())?;
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Installs the stderr subscriber. A parent CLI that installed its own keeps it.
pub fn init(debug: bool) {
    init_with_prefix(PREFIX, debug);
}

/// Same as [`init`] with another prefix: the `bounded-ingest` binary writes `[bounded-ingest]`.
pub fn init_with_prefix(prefix: &'static str, debug: bool) {
    let level = if debug { Level::DEBUG } else { Level::INFO };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_ansi(false)
        .event_format(Prefixed(prefix))
        .try_init();
}
