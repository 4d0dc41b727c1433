//! Measurement tools for `scripts/bench`: a TLS load generator for admission
//! endpoints, a minimal baseline server, latency statistics, and process
//! figures read from /proc.

pub mod attack;
pub mod loadgen;
pub mod pin;
pub mod procfs;
pub mod stats;
