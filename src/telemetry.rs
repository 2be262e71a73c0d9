//! Tracing set-up: one event per line on stderr, as text (coloured only
//! when stderr is a terminal) or as JSON objects (`[log] format`, SPEC
//! section 8), filtered by `RUST_LOG`.

use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Without `RUST_LOG`: info, but not the database drivers' statements nor
/// actix-server's line per worker (which would bury the demo's banner).
const DEFAULT_FILTER: &str = "info,sqlx=warn,sea_orm=warn,actix_server=warn";

/// The format installed, for [`report_failure`].
static INSTALLED: OnceLock<LogFormat> = OnceLock::new();

/// Installs the global subscriber; a second call (tests) is a no-op.
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        // `message` beside `timestamp`, `level` and `target`; the span the
        // event is in as `span`, and every span it is nested in as `spans`.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
    if installed.is_ok() {
        let _ = INSTALLED.set(format);
    }
}

/// Tells why the command failed: a log event when the log is JSON (so
/// that every line on stderr parses), else a plain line.
pub fn report_failure(error: &anyhow::Error) {
    if INSTALLED.get() == Some(&LogFormat::Json) {
        tracing::error!(error = format!("{error:#}"), "leadrouter stopped");
    } else {
        eprintln!("error: {error:#}");
    }
}
