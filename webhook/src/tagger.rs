//! The disruption tagger: when a pod carries `DisruptionTarget=True`, label
//! and annotate it with the condition, so `kubectl get pods -L
//! graceguard.io/disruption` and any executor can see why a pod went away.
//! Mutating admission runs before the status strategy, which keeps metadata
//! edits, so a tag added in a `pods/status` request persists. It never denies.
//!
//! Only a pod that has stopped running for good is tagged ([`may_tag_now`]):
//! a label or annotation change to a running pod costs its deletion a second.
//!
//! Idempotent: the tags are derived from the condition alone (its reason,
//! message and transition time), and no patch is sent when the pod already
//! carries exactly those tags.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use serde_json::{json, Value};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::disruption::Disruption;
use crate::review::{Meta, Pod};

/// Pods tagged with their `DisruptionTarget` reason: counted where a tag is
/// written, in its request ([`crate::endpoints::disruption_tagger`]) or
/// afterwards ([`crate::follow_up`]).
#[derive(Clone, Default)]
pub struct TagMetrics {
    pub disruption_tags: Family<ReasonLabels, Counter>,
}

impl TagMetrics {
    /// The series, registered (each known reason at 0 from the start).
    pub fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        for reason in KNOWN_REASONS.iter().chain(&["Other"]) {
            let _ = m.disruption_tags.get_or_create(&reason_labels(reason));
        }
        r.register(
            "disruption_tags",
            "Pods tagged with their DisruptionTarget reason, by reason",
            m.disruption_tags.clone(),
        );
        m
    }

    /// One pod tagged for `reason`.
    pub fn tagged(&self, reason: &str) {
        self.disruption_tags
            .get_or_create(&reason_labels(reason))
            .inc();
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// The `DisruptionTarget` reasons Kubernetes writes; any other is counted as
/// `Other`, so a status writer cannot grow the metric without bound.
pub const KNOWN_REASONS: &[&str] = &[
    "PreemptionByScheduler",
    "DeletionByTaintManager",
    "EvictionByEvictionAPI",
    "DeletionByPodGC",
    "TerminationByKubelet",
];

/// The `disruption_tags` labels for `reason`.
pub fn reason_labels(reason: &str) -> ReasonLabels {
    let known = KNOWN_REASONS.iter().find(|r| **r == reason);
    ReasonLabels {
        reason: known.map_or("Other", |r| r).to_string(),
    }
}

pub const LABEL: &str = "graceguard.io/disruption";
pub const MESSAGE_ANNOTATION: &str = "graceguard.io/disruption-message";
pub const TIME_ANNOTATION: &str = "graceguard.io/disruption-time";

/// Whether graceguard may write the tags to `pod` now: only once its
/// deletion has begun or it has ended, never while it runs.
///
/// Why: a label or annotation change is a change the kubelet acts on
/// (`podsDifferSemantically` in its config source): it runs an update sync
/// of the pod. A deletion arriving within a PLEG relist period after that
/// sync then waits for the next relist before the kubelet starts terminating
/// the pod (its pod worker waits for a status cache entry newer than the last
/// sync: `GetNewerThan` in `pod_workers.go`), about 1 s. The scheduler,
/// the taint manager and the Eviction API write `DisruptionTarget` a few
/// milliseconds before they delete, so tagging the running pod in that
/// request made every preemption and eviction about 1 s slower (measured:
/// docs/benchmarks.md, "Preemption trace"). Once the deletion has begun, the
/// kubelet's termination is under way and a metadata change only joins the
/// update it has pending; an ended pod's worker takes no further work.
pub fn may_tag_now(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

/// `reason` as a valid label value: at most 63 characters of
/// `[A-Za-z0-9._-]`, starting and ending alphanumeric; `Unknown` when nothing is left.
pub fn label_value(reason: &str) -> String {
    let mapped: String = reason
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trim = |s: &str| {
        s.trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_string()
    };
    let mut v = trim(&mapped);
    if v.len() > 63 {
        v = trim(&v[..63]);
    }
    if v.is_empty() {
        "Unknown".into()
    } else {
        v
    }
}

fn add(tokens: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(tokens.iter().copied()),
        value,
    })
}

/// Keys and values to set.
pub type Tags = Vec<(&'static str, String)>;

/// The tags a pod with metadata `meta` lacks for `d`: labels and
/// annotations to set; both empty when it carries them already.
pub fn missing_tags(meta: &Meta, d: &Disruption) -> (Tags, Tags) {
    let label = label_value(&d.reason);
    let labels = match &meta.labels {
        Some(l) if l.get(LABEL) == Some(&label) => Vec::new(),
        _ => vec![(LABEL, label)],
    };
    let annotations = [
        (MESSAGE_ANNOTATION, d.message.as_str()),
        (TIME_ANNOTATION, d.time.as_str()),
    ]
    .into_iter()
    .filter(|(k, v)| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(*k))
            .map(String::as_str)
            != Some(*v)
    })
    .map(|(k, v)| (k, v.to_string()))
    .collect();
    (labels, annotations)
}

/// The JSON merge patch a follow-up sends to tag pod `uid` (metadata
/// `meta`) for `d`, or `None` when its tags already say the same. A merge
/// patch sets only graceguard's keys, so labels another writer adds between
/// graceguard's read and its patch are kept (a JSONPatch `add` of a whole
/// map, needed when the map was absent, would replace them). The `uid`
/// guards it: the API server refuses to change a uid (422, immutable), so a
/// pod created under the same name meanwhile is never tagged.
pub fn merge_patch_for(uid: &str, meta: &Meta, d: &Disruption) -> Option<Value> {
    let (labels, annotations) = missing_tags(meta, d);
    if labels.is_empty() && annotations.is_empty() {
        return None;
    }
    let mut m = serde_json::Map::new();
    m.insert("uid".into(), json!(uid));
    for (map, tags) in [("labels", labels), ("annotations", annotations)] {
        if !tags.is_empty() {
            let all: BTreeMap<&str, String> = tags.into_iter().collect();
            m.insert(map.into(), json!(all));
        }
    }
    Some(json!({ "metadata": m }))
}

/// The JSONPatch that tags a pod with metadata `meta` for `d`, or `None` when
/// its tags already say the same: the admission answer's patch, applied by
/// the API server to the object in the request itself (nothing can write
/// it meanwhile, so adding a whole absent map is safe there).
pub fn patch_for(meta: &Meta, d: &Disruption) -> Option<Patch> {
    let (labels, annotations) = missing_tags(meta, d);
    let mut ops = Vec::new();
    for (map, present, tags) in [
        ("labels", meta.labels.is_some(), labels),
        ("annotations", meta.annotations.is_some(), annotations),
    ] {
        match present {
            true => ops.extend(
                tags.into_iter()
                    .map(|(k, v)| add(&["metadata", map, k], json!(v))),
            ),
            false if !tags.is_empty() => {
                let all: BTreeMap<&str, String> = tags.into_iter().collect();
                ops.push(add(&["metadata", map], json!(all)));
            }
            false => {}
        }
    }
    (!ops.is_empty()).then_some(Patch(ops))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(reason: &str) -> Disruption {
        Disruption {
            reason: reason.into(),
            message: "Preempted by a pod on node node-1".into(),
            time: "2026-11-30T11:30:00Z".into(),
        }
    }

    fn meta(labels: Option<&[(&str, &str)]>, annotations: Option<&[(&str, &str)]>) -> Meta {
        let map = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        Meta {
            labels: labels.map(map),
            annotations: annotations.map(map),
            ..Default::default()
        }
    }

    fn ops(p: &Option<Patch>) -> Value {
        serde_json::to_value(p).expect("json")
    }

    const TAGGED: &[(&str, &str)] = &[
        (MESSAGE_ANNOTATION, "Preempted by a pod on node node-1"),
        (TIME_ANNOTATION, "2026-11-30T11:30:00Z"),
    ];

    #[test]
    fn patch_table() {
        let cases: Vec<(&str, Meta, &str, Value)> = vec![
            (
                "no labels or annotations maps: add whole maps",
                meta(None, None),
                "PreemptionByScheduler",
                json!([
                    {"op": "add", "path": "/metadata/labels", "value": {LABEL: "PreemptionByScheduler"}},
                    {"op": "add", "path": "/metadata/annotations", "value": {
                        MESSAGE_ANNOTATION: "Preempted by a pod on node node-1",
                        TIME_ANNOTATION: "2026-11-30T11:30:00Z"}},
                ]),
            ),
            (
                "maps present: add members with / escaped as ~1",
                meta(Some(&[("app", "trainer")]), Some(&[("other", "x")])),
                "PreemptionByScheduler",
                json!([
                    {"op": "add", "path": "/metadata/labels/graceguard.io~1disruption", "value": "PreemptionByScheduler"},
                    {"op": "add", "path": "/metadata/annotations/graceguard.io~1disruption-message", "value": "Preempted by a pod on node node-1"},
                    {"op": "add", "path": "/metadata/annotations/graceguard.io~1disruption-time", "value": "2026-11-30T11:30:00Z"},
                ]),
            ),
            (
                "existing label with another reason: replaced",
                meta(Some(&[(LABEL, "EvictionByEvictionAPI")]), Some(TAGGED)),
                "PreemptionByScheduler",
                json!([{"op": "add", "path": "/metadata/labels/graceguard.io~1disruption", "value": "PreemptionByScheduler"}]),
            ),
            (
                "already tagged the same: no patch",
                meta(Some(&[(LABEL, "PreemptionByScheduler")]), Some(TAGGED)),
                "PreemptionByScheduler",
                Value::Null,
            ),
            (
                "empty reason: Unknown",
                meta(Some(&[]), Some(TAGGED)),
                "",
                json!([{"op": "add", "path": "/metadata/labels/graceguard.io~1disruption", "value": "Unknown"}]),
            ),
        ];
        for (what, m, reason, want) in cases {
            assert_eq!(ops(&patch_for(&m, &d(reason))), want, "{what}");
        }
    }

    #[test]
    fn a_follow_up_merge_patch_sets_only_graceguards_keys_and_the_uid() {
        let p = merge_patch_for("u-1", &meta(None, None), &d("TerminationByKubelet"));
        assert_eq!(
            p,
            Some(json!({"metadata": {"uid": "u-1",
                "labels": {LABEL: "TerminationByKubelet"},
                "annotations": {MESSAGE_ANNOTATION: "Preempted by a pod on node node-1", TIME_ANNOTATION: "2026-11-30T11:30:00Z"}}}))
        );
        let p = merge_patch_for(
            "u-1",
            &meta(Some(&[("app", "x")]), Some(TAGGED)),
            &d("TerminationByKubelet"),
        );
        assert_eq!(
            p,
            Some(json!({"metadata": {"uid": "u-1", "labels": {LABEL: "TerminationByKubelet"}}}))
        );
        let tagged = meta(Some(&[(LABEL, "TerminationByKubelet")]), Some(TAGGED));
        assert_eq!(
            merge_patch_for("u-1", &tagged, &d("TerminationByKubelet")),
            None
        );
    }

    #[test]
    fn only_a_pod_whose_deletion_began_or_that_ended_may_be_tagged() {
        let pod = |v: Value| -> Pod { serde_json::from_value(v).expect("pod") };
        let cases = [
            (json!({}), false),
            (json!({"status": {"phase": "Running"}}), false),
            (json!({"status": {"phase": "Pending"}}), false),
            (
                json!({"metadata": {"deletionTimestamp": "2026-11-30T11:30:01Z"}, "status": {"phase": "Running"}}),
                true,
            ),
            (json!({"status": {"phase": "Failed"}}), true),
            (json!({"status": {"phase": "Succeeded"}}), true),
        ];
        for (v, want) in cases {
            assert_eq!(may_tag_now(&pod(v.clone())), want, "{v}");
        }
    }

    #[test]
    fn label_values_are_valid() {
        assert_eq!(
            label_value("PreemptionByScheduler"),
            "PreemptionByScheduler"
        );
        assert_eq!(
            label_value("Evicted by: admin/ops!"),
            "Evicted-by--admin-ops"
        );
        assert_eq!(label_value("--x--"), "x");
        assert_eq!(label_value("!!!"), "Unknown");
        let long = "A".repeat(70) + "-";
        assert_eq!(label_value(&long).len(), 63);
        assert_eq!(label_value(&("B".repeat(62) + "-x")), "B".repeat(62));
    }
}
