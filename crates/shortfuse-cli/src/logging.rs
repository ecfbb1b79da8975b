//! Where the library's `tracing` events go: stderr (the daemon's log in
//! the background), one line each with a UTC timestamp, level and module.
//! `RUST_LOG` chooses what is shown (default `info`); `-o debug` or `-d`
//! adds every request and reply (target `shortfuse::requests`).
//!
//! `shortfuse run` is different: its stderr is the program's, so its own
//! messages (an sftp host key added on first use, say) are plain lines
//! marked `shortfuse run:`, as its other notes are, telling them apart from
//! what the program writes.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Whether the mount options ask for `debug`.
pub fn asks_debug(options: &[String]) -> bool {
    options.iter().flat_map(|o| o.split(',')).any(|o| o == "debug")
}

fn filter(debug: bool) -> EnvFilter {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if debug {
        if let Ok(d) = format!("{}=debug", shortfuse::dispatch::REQUESTS).parse() {
            filter = filter.add_directive(d);
        }
    }
    filter
}

/// The daemons' and tools' format: timestamp, level, module, message.
pub fn init(debug: bool) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter(debug))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

/// `shortfuse run`'s format: `shortfuse run: MESSAGE`.
pub fn init_run() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter(false))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(RunLine)
        .try_init();
}

struct RunLine;

impl<S, N> FormatEvent<S, N> for RunLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        w.write_str("shortfuse run: ")?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}
