//! Where the messages of evb's crates go. They log through `tracing`; the
//! binary writes each event to stderr as one line holding the message
//! alone (what users and tests read; no time or level: a launcher or a
//! job's log adds its own), at level INFO and above.
//!
//! One event is formatted into a buffer and written with one `write`
//! (tracing-subscriber's fmt layer does so), so the nodes of `evb run`,
//! which share the launcher's stderr, never interleave inside a line:
//! `eprintln!` writes a line in pieces ("evb node 1evb node : drain timed
//! out: 3: ...").

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The message, then any other fields as `key=value`, then the line end.
struct MessageLine;

impl<S, N> FormatEvent<S, N> for MessageLine
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
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Installs the stderr logger for this process (once, before any thread).
pub fn init() {
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .event_format(MessageLine)
        .finish();
    // Only fails if a logger is installed already: keep that one.
    let _ = tracing::subscriber::set_global_default(subscriber);
}
