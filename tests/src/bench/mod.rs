//! Measurement tools for `scripts/bench`: a TLS load generator for admission
//! endpoints, a minimal baseline server, latency statistics, and process
//! figures read from /proc, and the API server's latency histograms.

pub mod attack;
pub mod cluster_churn;
pub mod histogram;
pub mod loadgen;
pub mod pin;
pub mod preemption_trace;
pub mod procfs;
pub mod stats;
