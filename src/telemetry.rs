//! Tracing set-up: one event per line on stderr, as text (coloured only
//! when stderr is a terminal) or as JSON objects (`[log] format`, SPEC
//! section 8), filtered by `RUST_LOG`. The lead and attempt spans carry ids
//! and names, never personal data.

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::time::Duration;

use tracing::Span;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;
use crate::domain::CallOutcome;

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
        if format == LogFormat::Json {
            std::panic::set_hook(Box::new(log_panic));
        }
    }
}

/// A panic as a log event instead of the default hook's plain lines (an
/// actor's panic is caught and the actor restarted: the log goes on).
fn log_panic(info: &std::panic::PanicHookInfo<'_>) {
    let location = info.location().map(ToString::to_string);
    let message = info.payload_as_str().unwrap_or("(no message)");
    tracing::error!(panic = message, location, "panicked");
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

/// Everything done for one lead: its id and source (never a field's value).
/// Values are `Display`ed (`source=website`, as the text format shows them).
pub fn lead_span(lead_id: &str, source: &str) -> Span {
    tracing::info_span!("lead", lead_id = %lead_id, source = %source)
}

/// One attempt of the lead whose span is `lead`: a ping, a post or a skip
/// of a buyer, or a delivery to a notify channel or event sink (whose id
/// is the attempt's `buyer_id`, as in its row). `attempt_id` is recorded
/// once its row is written, `outcome` and `latency_ms` once it is answered
/// ([`record_answer`]).
pub fn attempt_span(lead: &Span, buyer_id: &str, kind: &str) -> Span {
    tracing::info_span!(
        parent: lead,
        "attempt",
        buyer_id = %buyer_id,
        kind = %kind,
        attempt_id = tracing::field::Empty,
        outcome = tracing::field::Empty,
        latency_ms = tracing::field::Empty
    )
}

/// Fills in the current attempt span's row id.
pub fn record_attempt_id(attempt_id: &str) {
    Span::current().record("attempt_id", tracing::field::display(attempt_id));
}

/// Fills in the current attempt span's answer.
pub fn record_answer(outcome: CallOutcome, took: Duration) {
    let span = Span::current();
    span.record("outcome", tracing::field::display(outcome.as_str()));
    span.record("latency_ms", took.as_millis() as u64);
}
