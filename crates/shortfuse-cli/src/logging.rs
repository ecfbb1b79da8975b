//! Where the library's `tracing` events go: stderr (the daemon's log in
//! the background), one line each with a UTC timestamp, level and module.
//! `RUST_LOG` chooses what is shown (default `info`); `-o debug` or `-d`
//! adds every request and reply (target `shortfuse::requests`).

use tracing_subscriber::EnvFilter;

/// Whether the mount options ask for `debug`.
pub fn asks_debug(options: &[String]) -> bool {
    options.iter().flat_map(|o| o.split(',')).any(|o| o == "debug")
}

pub fn init(debug: bool) {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if debug {
        if let Ok(d) = format!("{}=debug", shortfuse::dispatch::REQUESTS).parse() {
            filter = filter.add_directive(d);
        }
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
