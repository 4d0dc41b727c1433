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
