//! Load and measurement tools that the bench (`bench/`), the reliability
//! runs and the end-to-end tests share: a TLS load generator for admission
//! endpoints and a minimal baseline server, the port attacker, latency
//! statistics, process figures read from /proc, the API server's latency
//! histograms, CPU pinning.

pub mod attack;
pub mod histogram;
pub mod loadgen;
pub mod pin;
pub mod procfs;
pub mod stats;
