//! JSON logs on stdout: audit records and operational logs alike, one object
//! per line, fields at the top level (`flatten_event`) so log pipelines can
//! index them without unwrapping.
//!
//! Lines are handed to a writer thread (tracing-appender's non-blocking
//! writer, lossless: it applies backpressure rather than dropping records), so
//! the write syscall is off the admission path.

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

/// Installs the JSON subscriber. `RUST_LOG` overrides the default level (info).
/// Keep the returned guard alive until exit: dropping it flushes the records.
pub fn init() -> WorkerGuard {
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("graceguard-log")
        // Buffered: under load the writer thread drains many lines per
        // write; it flushes whenever the channel runs empty.
        .finish(std::io::BufWriter::with_capacity(
            64 * 1024,
            std::io::stdout(),
        ));
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_target(true)
        .with_env_filter(filter)
        .with_writer(writer)
        .try_init();
    guard
}
