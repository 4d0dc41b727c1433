//! What a task is doing, as its caller sees it.

use serde::{Deserialize, Serialize};

/// Who is to blame for a failure: the user's retries pay for `User`;
/// `System` failures (preemption, external deletion, name conflicts) are
/// bounded separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "sidecar", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum FailureKind {
    User,
    System,
}

/// A task's phase. Each change is reported as a [`Transition`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase")]
pub enum Phase {
    /// A Create is being sent.
    Launching,
    /// The quota is full: waiting with backoff. No attempt is consumed.
    WaitingForResources,
    /// The pod exists and is Pending.
    Queued,
    Running,
    /// The pod has a deletionTimestamp; waiting until it is gone. The reason
    /// is its DisruptionTarget reason, else `Deleted`.
    ShuttingDown {
        reason: String,
    },
    Succeeded,
    Failed {
        kind: FailureKind,
        reason: String,
    },
}

/// Every [`Phase::name`], in the order a task goes through them.
pub const PHASE_NAMES: [&str; 7] = [
    "Launching",
    "WaitingForResources",
    "Queued",
    "Running",
    "ShuttingDown",
    "Succeeded",
    "Failed",
];

impl Phase {
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Launching => "Launching",
            Phase::WaitingForResources => "WaitingForResources",
            Phase::Queued => "Queued",
            Phase::Running => "Running",
            Phase::ShuttingDown { .. } => "ShuttingDown",
            Phase::Succeeded => "Succeeded",
            Phase::Failed { .. } => "Failed",
        }
    }

    /// Its reason and failure kind, as a [`Transition`] and a status show them.
    pub fn reason_and_kind(&self) -> (Option<String>, Option<FailureKind>) {
        match self {
            Phase::ShuttingDown { reason } => (Some(reason.clone()), None),
            Phase::Failed { kind, reason } => (Some(reason.clone()), Some(*kind)),
            _ => (None, None),
        }
    }

    pub fn is_final(&self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed { .. })
    }
}

/// One phase change, as `graceguard run --events json` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "sidecar", derive(utoipa::ToSchema))]
pub struct Transition {
    pub task: String,
    pub attempt: u32,
    pub pod: String,
    /// `Launching`, `Queued`, `WaitingForResources`, `Running`, `ShuttingDown`, `Succeeded` or `Failed`.
    #[cfg_attr(feature = "sidecar", schema(value_type = String))]
    pub phase: &'static str,
    pub reason: Option<String>,
    pub failure_kind: Option<FailureKind>,
}
