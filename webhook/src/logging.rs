//! JSON logs on stdout: audit records and operational logs alike, one object
//! per line, fields at the top level (`flatten_event`) so log pipelines can
//! index them without unwrapping.

use tracing_subscriber::EnvFilter;

/// Installs the JSON subscriber. `RUST_LOG` overrides the default level (info).
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_target(true)
        .with_env_filter(filter)
        .with_writer(std::io::stdout)
        .try_init();
}
