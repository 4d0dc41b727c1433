//! JSON logs on stdout: audit records and operational logs alike, one object
//! per line, fields at the top level (`flatten_event`) so log pipelines can
//! index them without unwrapping.
//!
//! Lines are handed to a writer thread (tracing-appender's non-blocking
//! writer), so the write syscall is off the admission path. The hand-off is
//! bounded and never waits: when stdout stalls (a slow log pipeline, a full
//! pipe) and the buffer is full, records are dropped and counted
//! (`graceguard_audit_records_dropped_total`) rather than stalling every
//! admission request behind them. Admission must not wait on our own logging.

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

/// Lines waiting for the writer thread before new ones are dropped
/// (`GRACEGUARD_LOG_BUFFER_LINES` overrides it; at least 1).
pub const DEFAULT_BUFFER_LINES: usize = 65_536;

/// What [`init`] returns: keep `guard` alive until exit (dropping it flushes
/// the records); `dropped` counts records lost to a stalled stdout.
pub struct Logging {
    pub guard: WorkerGuard,
    pub dropped: ErrorCounter,
}

/// Installs the JSON subscriber. `RUST_LOG` overrides the default level (info).
pub fn init() -> Logging {
    let lines = std::env::var("GRACEGUARD_LOG_BUFFER_LINES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(DEFAULT_BUFFER_LINES)
        .max(1);
    let builder = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(lines)
        .thread_name("graceguard-log");
    let (writer, guard) = builder
        // Buffered: under load the writer thread drains many lines per
        // write; it flushes whenever the channel runs empty.
        .finish(std::io::BufWriter::with_capacity(
            64 * 1024,
            std::io::stdout(),
        ));
    crate::audit::set_sink(writer.clone());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_target(true)
        .with_env_filter(filter)
        .with_writer(writer.clone())
        .try_init();
    Logging {
        guard,
        dropped: writer.error_counter(),
    }
}
