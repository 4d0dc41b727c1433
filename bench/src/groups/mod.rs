//! One module per group of measurements; each prints its own rows
//! ([`crate::report::emit`]) and its table lines.

pub(crate) mod apiserver_overhead;
pub(crate) mod cluster_churn;
pub(crate) mod executor_storm;
pub(crate) mod guard_recovery;
pub(crate) mod index_memory_scale;
pub(crate) mod kind_index_memory;
pub(crate) mod kind_index_peak;
pub(crate) mod livelock_storm;
pub(crate) mod match_conditions_share;
pub(crate) mod preemption_trace;
pub(crate) mod relaunch_delay;
pub(crate) mod sidecar_rss;
pub(crate) mod sidecar_scale;
pub(crate) mod tag_delay;
pub(crate) mod webhook;
