//! The limits that keep a task from retrying or waiting forever.
//!
//! Every unbounded loop of an executor is a way to burn quota or hide a stuck
//! task: each bound here ends one of them, with a stated default. Times are
//! whole seconds so the settings read the same in the sidecar's JSON, the
//! CLI's flags and the pods' records.

use serde::{Deserialize, Serialize};

/// See the module docs. `None` disables a time bound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "sidecar", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Bounds {
    /// The whole task, from its first Launch, may take this long; then its
    /// pod is deleted and the task fails (`DeadlineExceeded`). Default: none.
    pub deadline_seconds: Option<u64>,
    /// A pod may stay Pending (image pulls, unschedulable) this long from its
    /// creation; then it is deleted and the attempt is a system failure
    /// (`PendingTimeout`). Default: 900 (15 minutes).
    pub pending_timeout_seconds: Option<u64>,
    /// A terminating pod (finalizer, lost node) may outlive its grace period
    /// by this much; then a Warning event is published and the task moves on
    /// to the next pod name, leaving the stuck pod to the cluster.
    /// Default: 300.
    pub terminating_ceiling_seconds: Option<u64>,
    /// System failures in all (preemptions, deletions, timeouts), Running or
    /// not, before the task fails: a task preempted after every start would
    /// otherwise retry forever. Default: 10.
    pub max_total_system_failures: u32,
    /// Transient Create errors (429, 5xx, timeouts, quota write conflicts) in
    /// a row before the attempt is a system failure. Default: 30 (about four
    /// minutes at the transient backoff's 10 s cap).
    pub max_transient_retries: u32,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            deadline_seconds: None,
            pending_timeout_seconds: Some(900),
            terminating_ceiling_seconds: Some(300),
            max_total_system_failures: 10,
            max_transient_retries: 30,
        }
    }
}

/// `start + seconds`, in milliseconds, saturating (the inputs come from
/// requests and API answers).
pub(crate) fn after(start_ms: i64, seconds: u64) -> i64 {
    let ms = i64::try_from(seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
    start_ms.saturating_add(ms)
}
