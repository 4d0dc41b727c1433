//! A task's identity and its status as a caller sees it.

use serde::Serialize;

use crate::core::naming;
use crate::core::phase::FailureKind;

/// A task's identity: its namespace and task label value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskKey {
    pub namespace: String,
    pub task: String,
}

impl TaskKey {
    pub fn new(namespace: &str, task: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            task: naming::task_label_value(task),
        }
    }

    /// Whether task `task` in `namespace` is this one.
    pub fn is(&self, namespace: &str, task: &str) -> bool {
        namespace == self.namespace && naming::task_label_value(task) == self.task
    }
}

/// A task as its caller sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "sidecar", derive(utoipa::ToSchema))]
pub struct TaskStatus {
    pub namespace: String,
    pub task: String,
    pub attempt: u32,
    pub pod: String,
    /// The current pod's uid, once created.
    pub uid: Option<String>,
    /// `Launching`, `Queued`, `WaitingForResources`, `Running`, `ShuttingDown`, `Succeeded` or `Failed`.
    #[cfg_attr(feature = "sidecar", schema(value_type = String))]
    pub phase: &'static str,
    pub reason: Option<String>,
    pub failure_kind: Option<FailureKind>,
    pub user_failures: u32,
    pub system_failures: u32,
    pub terminal: bool,
    pub succeeded: Option<bool>,
    /// False until the instance's first pod list is in (the task is then
    /// resumed from its pods, or launched).
    pub started: bool,
    /// Ended while its pod's uid was unknown: the pod is deleted when it
    /// shows up (see `uid` then).
    pub cleanup_pending: bool,
    /// Taken up from its pods after a restart, never submitted to this
    /// process: it is waited out and its result delivered, but a new attempt
    /// needs its template: PUT the task again (the same body).
    pub needs_template: bool,
}

/// What a submission came to: the task's status, and whether this
/// submission created it (else it was there, with the same body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitted {
    pub status: TaskStatus,
    pub created: bool,
}
