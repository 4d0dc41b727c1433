//! Reading a pod's `DisruptionTarget` condition.
//!
//! kube-scheduler (PreemptionByScheduler), the taint manager
//! (DeletionByTaintManager) and the Eviction API (EvictionByEvictionAPI) set
//! `DisruptionTarget=True` before they delete a pod; PodGC and the kubelet set
//! it with the terminal phase. It is how anyone can tell "preempted" from
//! "deleted behind my back".

use serde_json::Value;

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

/// The `DisruptionTarget=True` condition of a pod, from the pod's JSON body
/// (the part holding `status`); `None` when absent or not True.
pub fn of_pod(pod: &Value) -> Option<Disruption> {
    let conditions = pod.get("status")?.get("conditions")?.as_array()?;
    let c = conditions
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(CONDITION))?;
    if c.get("status").and_then(Value::as_str) != Some("True") {
        return None;
    }
    let s = |k: &str| {
        c.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    Some(Disruption {
        reason: s("reason"),
        message: s("message"),
        time: s("lastTransitionTime"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_only_a_true_condition() {
        let pod = |status: &str| {
            json!({"status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "DisruptionTarget", "status": status, "reason": "PreemptionByScheduler", "message": "m", "lastTransitionTime": "2026-11-30T11:30:00Z"}
            ]}})
        };
        let d = of_pod(&pod("True")).expect("condition");
        assert_eq!(d.reason, "PreemptionByScheduler");
        assert_eq!(d.time, "2026-11-30T11:30:00Z");
        assert_eq!(of_pod(&pod("False")), None);
        assert_eq!(of_pod(&json!({"status": {}})), None);
        assert_eq!(of_pod(&json!({})), None);
    }
}
