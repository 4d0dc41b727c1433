//! What a task had spent, written on each pod it creates.
//!
//! An executor's memory dies with it; the pods do not. Each attempt's pod
//! carries the task's counters as they were when it was created (annotation
//! `graceguard.io/record`), and the template's hash, so a restarted executor
//! rebuilds the task from its newest pod ([`crate::core::reconcile::restore`]) and
//! refuses a different template for the same task. The task's settings are
//! recorded too ([`RecordedSpec`]), so a restarted executor knows its tasks
//! before anyone submits them again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::core::bounds::Bounds;

/// Annotation: the [`PodRecord`] as JSON.
pub const RECORD_ANNOTATION: &str = "graceguard.io/record";
/// Annotation: the hash of the task's pod template ([`template_hash`]).
pub const TEMPLATE_ANNOTATION: &str = "graceguard.io/template-hash";

/// The task's counters when a pod was created.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodRecord {
    pub user_failures: u32,
    pub system_failures: u32,
    pub consecutive_system_failures: u32,
    /// When the task was first launched (ms since the epoch), by the clock
    /// of the process that launched it: another host's clock for a
    /// process that takes the task over, so only a fallback
    /// ([`Self::spent_ms`]).
    pub started_ms: Option<i64>,
    /// How long the task had run when this pod's Create was sent, by the
    /// sending process's monotonic clock. With the pod's creationTimestamp
    /// and the API server's clock (both the server's), a process that takes
    /// the task over counts its deadline without reading another host's
    /// clock ([`crate::runtime::pod_index`]). Absent on pods before 0.2.0.
    pub spent_ms: Option<i64>,
    /// The task as submitted (absent on pods of older versions).
    pub spec: Option<RecordedSpec>,
}

/// A task's settings as submitted, less its namespace and instance (the
/// pod's own).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecordedSpec {
    /// The task name as given (its label holds the normalized form).
    pub task: String,
    pub retries: u32,
    pub max_system_failures: u32,
    pub bounds: Bounds,
    pub rerun_done: bool,
}

impl PodRecord {
    /// The record in `annotations`; `None` if absent or unreadable (a pod
    /// edited by hand must not stop the task: it resumes with zero counters).
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Option<Self> {
        let text = annotations.get(RECORD_ANNOTATION)?;
        match serde_json::from_str(text) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(annotation = RECORD_ANNOTATION, error = %e, "unreadable task record on a pod; resuming with zero counters");
                None
            }
        }
    }

    /// The record as the annotation's value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A stable hash of a pod template (its JSON), to tell "the same task
/// submitted again" from "another task under a name in use".
pub fn template_hash(template: &impl serde::Serialize) -> String {
    // JSON of strings, numbers and maps cannot fail to write.
    let json = serde_json::to_string(template).unwrap_or_default();
    let digest = Sha256::digest(json.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_its_annotation_and_a_bad_one_is_none() {
        let r = PodRecord {
            user_failures: 1,
            system_failures: 2,
            consecutive_system_failures: 1,
            started_ms: Some(1_700_000_000_000),
            spent_ms: Some(42_000),
            spec: Some(RecordedSpec {
                task: "Train_A".into(),
                retries: 2,
                ..Default::default()
            }),
        };
        let mut a = BTreeMap::new();
        a.insert(RECORD_ANNOTATION.to_string(), r.to_annotation());
        assert_eq!(PodRecord::from_annotations(&a), Some(r));
        a.insert(RECORD_ANNOTATION.to_string(), "{not json".into());
        assert_eq!(PodRecord::from_annotations(&a), None);
        assert_eq!(PodRecord::from_annotations(&BTreeMap::new()), None);
    }

    #[test]
    fn template_hashes_tell_templates_apart() {
        let a = serde_json::json!({"spec": {"containers": [{"name": "a", "image": "x"}]}});
        let b = serde_json::json!({"spec": {"containers": [{"name": "a", "image": "y"}]}});
        assert_eq!(template_hash(&a), template_hash(&a.clone()));
        assert_ne!(template_hash(&a), template_hash(&b));
        assert_eq!(template_hash(&a).len(), 16);
    }
}
