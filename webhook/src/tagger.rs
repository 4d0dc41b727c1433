//! The disruption tagger: when a `pods/status` update carries
//! `DisruptionTarget=True`, label and annotate the pod with it, so
//! `kubectl get pods -L graceguard.io/disruption` and any executor can see why
//! a pod is going away. Mutating admission runs before the status strategy,
//! which keeps metadata edits, so the tags persist. It never denies.
//!
//! Idempotent: the tags are derived from the condition alone (its reason,
//! message and transition time), and no patch is sent when the pod already
//! carries exactly those tags.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use serde_json::{json, Value};

use crate::disruption::Disruption;
use crate::review::Meta;

pub const LABEL: &str = "graceguard.io/disruption";
pub const MESSAGE_ANNOTATION: &str = "graceguard.io/disruption-message";
pub const TIME_ANNOTATION: &str = "graceguard.io/disruption-time";

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

/// The JSONPatch that tags a pod with metadata `meta` for `d`, or `None` when
/// its tags already say the same.
pub fn patch_for(meta: &Meta, d: &Disruption) -> Option<Patch> {
    let label = label_value(&d.reason);
    let wanted_annotations = [
        (MESSAGE_ANNOTATION, d.message.as_str()),
        (TIME_ANNOTATION, d.time.as_str()),
    ];
    let mut ops = Vec::new();
    match &meta.labels {
        Some(labels) if labels.get(LABEL) == Some(&label) => {}
        Some(_) => ops.push(add(&["metadata", "labels", LABEL], json!(label))),
        None => ops.push(add(&["metadata", "labels"], json!({ LABEL: label }))),
    }
    match &meta.annotations {
        Some(annotations) => {
            for (k, v) in wanted_annotations {
                if annotations.get(k).map(String::as_str) != Some(v) {
                    ops.push(add(&["metadata", "annotations", k], json!(v)));
                }
            }
        }
        None => {
            let all: BTreeMap<&str, &str> = wanted_annotations.into_iter().collect();
            ops.push(add(&["metadata", "annotations"], json!(all)));
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
