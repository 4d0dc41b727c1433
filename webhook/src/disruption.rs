//! Reading a pod's `DisruptionTarget` condition.
//!
//! kube-scheduler (PreemptionByScheduler), the taint manager
//! (DeletionByTaintManager) and the Eviction API (EvictionByEvictionAPI) set
//! `DisruptionTarget=True` before they delete a pod; PodGC and the kubelet set
//! it with the terminal phase. It is how anyone can tell "preempted" from
//! "deleted behind my back".

use crate::review::Pod;

/// The condition type.
pub const CONDITION: &str = "DisruptionTarget";

/// A `DisruptionTarget=True` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disruption {
    pub reason: String,
    pub message: String,
    /// `lastTransitionTime`, as the pod has it (empty when absent).
    pub time: String,
}

/// The `DisruptionTarget=True` condition of `pod`; `None` when absent or not True.
pub fn of_pod(pod: &Pod) -> Option<Disruption> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION)?;
    if c.status != "True" {
        return None;
    }
    Some(Disruption {
        reason: c.reason.clone().unwrap_or_default(),
        message: c.message.clone().unwrap_or_default(),
        time: c.last_transition_time.clone().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn reads_only_a_true_condition() {
        let with = |status: &str| {
            pod(json!({"status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "DisruptionTarget", "status": status, "reason": "PreemptionByScheduler", "message": "m", "lastTransitionTime": "2026-11-30T11:30:00Z"}
            ]}}))
        };
        let d = of_pod(&with("True")).expect("condition");
        assert_eq!(d.reason, "PreemptionByScheduler");
        assert_eq!(d.time, "2026-11-30T11:30:00Z");
        assert_eq!(of_pod(&with("False")), None);
        assert_eq!(of_pod(&pod(json!({"status": {}}))), None);
        assert_eq!(of_pod(&pod(json!({}))), None);
    }
}
