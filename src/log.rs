//! Diagnostics: every line the wrapper itself prints goes to stderr, prefixed `[observe-mcp]`.
//!
//! Owns the tracing subscriber setup and how a URL is shown in a line ([`redact_url`]). Must
//! never write to stdout (invariant 1: stdout carries only the child's bytes), and never print a
//! configured URL (upstream, ingest) except through [`redact_url`].

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::{format::Writer, FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Prefix of every line the wrapper writes (DESIGN §2 invariant 1).
pub const PREFIX: &str = "[observe-mcp]";

/// What stands in for a redacted part of a URL.
pub const REDACTED: &str = "<redacted>";

/// A URL as it may be printed: the query, the fragment and any `user:password@` replaced by
/// [`REDACTED`]; scheme, host, port and path kept, since they are what an operator needs to
/// tell which endpoint a line is about.
///
/// Why: endpoints are commonly given their credential in the URL (`?api_key=…`, `?token=…`,
/// `user:pass@`), and stderr ends up in client logs, terminals and bug reports. Works on any
/// string, a malformed URL included (those are the ones that get printed in warnings): it looks
/// only for the separators, never parses.
pub fn redact_url(url: &str) -> String {
    // The authority starts after `scheme://` (or at the start of a string without one) and ends
    // at the first `/`, `?` or `#`.
    let auth_start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[auth_start..];
    let auth_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..auth_len];
    let mut out = String::with_capacity(url.len());
    out.push_str(&url[..auth_start]);
    match authority.rfind('@') {
        Some(at) => {
            out.push_str(REDACTED);
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    let tail = &rest[auth_len..];
    let path_len = tail.find(['?', '#']).unwrap_or(tail.len());
    out.push_str(&tail[..path_len]);
    let after = &tail[path_len..];
    if after.starts_with('?') {
        out.push('?');
        out.push_str(REDACTED);
    }
    if after.contains('#') {
        out.push('#');
        out.push_str(REDACTED);
    }
    out
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_query_fragment_and_userinfo_are_redacted() {
        for (url, shown) in [
            (
                "http://127.0.0.1:9/mcp?api_key=SECRET",
                "http://127.0.0.1:9/mcp?<redacted>",
            ),
            (
                "https://u:SECRET@ingest.example.com/base?t=SECRET#SECRET",
                "https://<redacted>@ingest.example.com/base?<redacted>#<redacted>",
            ),
            ("http://h?SECRET", "http://h?<redacted>"),
            ("http://h#SECRET?x", "http://h#<redacted>"),
            // A path that contains `@` is not userinfo.
            ("http://h/a@b", "http://h/a@b"),
            ("http://127.0.0.1:7361", "http://127.0.0.1:7361"),
            // Malformed values, as warnings print them.
            ("ftp:/x?SECRET", "ftp:/x?<redacted>"),
            ("user:SECRET@host/x", "<redacted>@host/x"),
            ("", ""),
            ("http://", "http://"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
