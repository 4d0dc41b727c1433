//! A task's pod template, kept whole: the JSON object it was submitted as.
//!
//! k8s-openapi's `Pod` is built for one Kubernetes version (the workspace's
//! `v1_33`) and drops every field it does not know when it deserialises. A
//! template sent through it loses what a newer server offers
//! (`spec.hostnameOverride`, GA in 1.37, say) without a word, and its hash is
//! taken from what is left, so a changed template may not even conflict. So
//! the template is kept as the JSON it came in, hashed as such, and created
//! as such with `fieldValidation=Strict` ([`crate::runtime::pod_api::create`]): a
//! field the target server does not know is refused by that server, naming
//! it, never dropped here.

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::core::error::TaskError;
use crate::core::naming::{
    ATTEMPT_LABEL, DONE_LABEL, INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL, RESULT_FINALIZER,
    TASK_LABEL,
};
use crate::core::pod_record::template_hash;
use crate::core::reconcile::TaskSpec;

/// A pod template as submitted (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Template(Map<String, Value>, usize);

/// The metadata fields a template may carry that belong to one object, not
/// to a template: dropped from every attempt's pod.
const OBJECT_FIELDS: [&str; 8] = [
    "generateName",
    "resourceVersion",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

impl Template {
    /// A template from its JSON: an object that reads as a pod (what
    /// graceguard's `Pod` type knows is checked, so a mistyped field is a
    /// 400 at submission, not a failed Create later) with at least one
    /// container. Every field is kept, known or not.
    pub fn from_json(value: Value) -> Result<Self, TaskError> {
        if let Err(e) = Pod::deserialize(&value) {
            return Err(TaskError::Template(format!(
                "it does not read as a pod: {e}"
            )));
        }
        let Value::Object(map) = value else {
            return Err(TaskError::Template("it is not a JSON object".into()));
        };
        let has_containers = map
            .get("spec")
            .and_then(|s| s.get("containers"))
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty());
        if !has_containers {
            return Err(TaskError::Template("it has no spec.containers".into()));
        }
        // What it takes written out: what the executor's limit on held
        // templates counts.
        let bytes = serde_json::to_vec(&map).map_or(0, |v| v.len());
        Ok(Self(map, bytes))
    }

    /// Its size as JSON, as submitted.
    pub fn bytes(&self) -> usize {
        self.1
    }

    /// A template from a typed pod (a library caller's): only what that
    /// type holds, by construction.
    pub fn from_pod(pod: &Pod) -> Result<Self, TaskError> {
        let value = serde_json::to_value(pod)
            .map_err(|e| TaskError::Template(format!("it cannot be written as JSON: {e}")))?;
        Self::from_json(value)
    }

    /// The hash pods made from it carry. A template graceguard's Pod type
    /// holds whole hashes as that type writes it — as every release did, so
    /// a task in flight across an upgrade is still the same task; one with
    /// fields that type does not know hashes as sent, all of them counted.
    pub fn hash(&self) -> String {
        let raw = Value::Object(self.0.clone());
        let typed = Pod::deserialize(&raw)
            .ok()
            .and_then(|p| serde_json::to_value(p).ok());
        match typed {
            Some(typed) if holds(&typed, &raw) => template_hash(&typed),
            _ => template_hash(&raw),
        }
    }

    /// Sets annotation `key` on the template itself.
    pub fn annotate(&mut self, key: &str, value: &str) {
        annotate(&mut self.0, key, value);
    }

    /// The attempt's pod: the template under the attempt's name and the
    /// task's namespace, with graceguard's labels and the result finalizer,
    /// no status, and none of one object's own metadata.
    pub fn pod_for(&self, spec: &TaskSpec, name: &str, attempt: u32) -> Map<String, Value> {
        let mut pod = self.0.clone();
        pod.insert("apiVersion".into(), "v1".into());
        pod.insert("kind".into(), "Pod".into());
        pod.remove("status");
        with_object(&mut pod, "metadata", |meta| {
            for field in OBJECT_FIELDS {
                meta.remove(field);
            }
            meta.insert("name".into(), name.into());
            meta.insert("namespace".into(), spec.namespace.clone().into());
            with_object(meta, "labels", |labels| {
                labels.insert(TASK_LABEL.into(), spec.stem().into());
                labels.insert(ATTEMPT_LABEL.into(), attempt.to_string().into());
                labels.insert(INSTANCE_LABEL.into(), spec.instance.clone().into());
                labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
                labels.remove(DONE_LABEL);
            });
            let mut finalizers = match meta.remove("finalizers") {
                Some(Value::Array(f)) => f,
                _ => Vec::new(),
            };
            if !finalizers.iter().any(|f| f == RESULT_FINALIZER) {
                finalizers.push(RESULT_FINALIZER.into());
            }
            meta.insert("finalizers".into(), Value::Array(finalizers));
        });
        pod
    }
}

/// Whether `typed` holds every value of `raw` (a `null` in `raw` is no
/// value): what graceguard's Pod type kept of a template is all of it.
fn holds(typed: &Value, raw: &Value) -> bool {
    match (typed, raw) {
        (_, Value::Null) => true,
        (Value::Object(t), Value::Object(r)) => r
            .iter()
            .all(|(k, v)| v.is_null() || t.get(k).is_some_and(|tv| holds(tv, v))),
        (Value::Array(t), Value::Array(r)) => {
            t.len() == r.len() && t.iter().zip(r).all(|(tv, rv)| holds(tv, rv))
        }
        (t, r) => t == r,
    }
}

/// Sets annotation `key` of the object `obj` (a pod's JSON).
pub fn annotate(obj: &mut Map<String, Value>, key: &str, value: &str) {
    with_object(obj, "metadata", |meta| {
        with_object(meta, "annotations", |a| {
            a.insert(key.into(), value.into());
        })
    });
}

/// Runs `f` on `obj[key]` as an object (a new one if it is missing or not
/// an object), and puts it back.
fn with_object(obj: &mut Map<String, Value>, key: &str, f: impl FnOnce(&mut Map<String, Value>)) {
    let mut inner = match obj.remove(key) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    f(&mut inner);
    obj.insert(key.into(), Value::Object(inner));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> TaskSpec {
        TaskSpec::new("train", "team-a", "flyte")
    }

    /// A field newer than the workspace's k8s-openapi (GA in Kubernetes 1.37).
    fn newer() -> Value {
        json!({
            "metadata": {"name": "x", "uid": "u", "resourceVersion": "9", "labels": {"graceguard.io/done": "true", "app": "a"}},
            "spec": {"hostnameOverride": "trainer", "containers": [{"name": "c", "image": "busybox", "someFutureField": {"a": 1}}]},
            "status": {"phase": "Running"}
        })
    }

    #[test]
    fn a_field_the_pod_type_does_not_know_is_kept_in_the_pod_and_in_the_hash() {
        let t = Template::from_json(newer()).expect("a template");
        let pod = t.pod_for(&spec(), "train-2", 2);
        assert_eq!(pod["spec"]["hostnameOverride"], "trainer");
        assert_eq!(pod["spec"]["containers"][0]["someFutureField"]["a"], 1);
        assert_eq!(pod["metadata"]["name"], "train-2");
        assert_eq!(pod["metadata"]["namespace"], "team-a");
        assert_eq!(pod["metadata"]["labels"]["graceguard.io/attempt"], "2");
        assert_eq!(pod["metadata"]["labels"]["app"], "a");
        assert!(pod["metadata"]["labels"]
            .get("graceguard.io/done")
            .is_none());
        assert!(pod["metadata"].get("uid").is_none() && pod.get("status").is_none());
        assert_eq!(pod["metadata"]["finalizers"], json!([RESULT_FINALIZER]));
        assert_eq!(
            (pod["apiVersion"].as_str(), pod["kind"].as_str()),
            (Some("v1"), Some("Pod"))
        );
        // The typed pod would have dropped it: the hashes tell them apart.
        let mut without = newer();
        without["spec"]
            .as_object_mut()
            .map(|s| s.remove("hostnameOverride"));
        let other = Template::from_json(without).expect("a template");
        assert_ne!(t.hash(), other.hash());
    }

    #[test]
    fn a_template_that_is_no_pod_is_refused_saying_why() {
        for (v, why) in [
            (json!([1]), "does not read as a pod"),
            (json!({"spec": {"containers": []}}), "no spec.containers"),
            (json!({"metadata": {}}), "no spec.containers"),
            (
                json!({"spec": {"containers": [{"name": 5}]}}),
                "does not read as a pod",
            ),
        ] {
            let e = Template::from_json(v.clone()).expect_err("refused");
            assert!(e.to_string().contains(why), "{v}: {e}");
        }
    }

    #[test]
    fn a_template_the_pod_type_holds_whole_hashes_as_before() {
        // What every earlier release hashed: the typed pod, written back.
        let raw = json!({"spec": {"containers": [{"name": "c", "image": "i", "args": null}]}});
        let typed: Pod = serde_json::from_value(raw.clone()).expect("a pod");
        let before = template_hash(&serde_json::to_value(&typed).expect("json"));
        assert_eq!(Template::from_json(raw).expect("a template").hash(), before);
        // One field more than the type knows: all of it counts.
        let newer =
            json!({"spec": {"hostnameOverride": "h", "containers": [{"name": "c", "image": "i"}]}});
        assert_ne!(
            Template::from_json(newer).expect("a template").hash(),
            before
        );
    }

    #[test]
    fn a_typed_pods_template_hashes_as_its_json_does() {
        let pod: Pod =
            serde_json::from_value(json!({"spec": {"containers": [{"name": "c", "image": "i"}]}}))
                .expect("a pod");
        let typed = Template::from_pod(&pod).expect("a template");
        let raw =
            Template::from_json(json!({"spec": {"containers": [{"name": "c", "image": "i"}]}}))
                .expect("a template");
        assert_eq!(typed.hash(), raw.hash());
    }
}
