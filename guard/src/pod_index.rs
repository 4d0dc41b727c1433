//! The executor's index of its pods, fed by its one pod watch: per task, by
//! uid, only what the reconciler and the done-marks need (not whole Pods).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::naming::{ATTEMPT_LABEL, DONE_LABEL, TASK_LABEL};
use crate::pod_record::{PodRecord, RecordedSpec, TEMPLATE_ANNOTATION};
use crate::reconcile::PodView;
use crate::task::TaskKey;

/// A pod in the index.
struct Indexed {
    view: PodView,
    name: String,
    resource_version: String,
    template_hash: Option<String>,
}

type ByTask = HashMap<TaskKey, BTreeMap<String, Indexed>>;

/// See the module docs.
#[derive(Default)]
pub struct PodIndex {
    pods: ByTask,
    /// A re-list in progress: replaces `pods` when it is complete.
    relist: Option<ByTask>,
}

fn time_ms(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> i64 {
    t.0.as_millisecond()
}

/// The reason of a pod's `DisruptionTarget=True` condition (preemption,
/// eviction, a kubelet's termination), if it has one.
pub fn disruption_reason(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        .map(|c| c.reason.clone().unwrap_or_default())
}

/// The pod as the index keeps it; `None` for a pod without valid task labels.
fn indexed(pod: &Pod) -> Option<(TaskKey, Indexed)> {
    let labels = pod.labels();
    let task = labels.get(TASK_LABEL)?;
    let attempt: u32 = labels.get(ATTEMPT_LABEL)?.parse().ok()?;
    let status = pod.status.as_ref();
    let meta = &pod.metadata;
    let view = PodView {
        uid: pod.uid()?,
        attempt,
        phase: status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into()),
        disruption: disruption_reason(pod),
        created_ms: meta.creation_timestamp.as_ref().map_or(0, time_ms),
        deletion_ms: meta.deletion_timestamp.as_ref().map(time_ms),
        done: labels.get(DONE_LABEL).is_some_and(|v| v == "true"),
        record: PodRecord::from_annotations(pod.annotations()),
    };
    let key = TaskKey {
        namespace: pod.namespace()?,
        task: task.clone(),
    };
    Some((
        key,
        Indexed {
            view,
            name: pod.name_any(),
            resource_version: pod.resource_version().unwrap_or_default(),
            template_hash: pod.annotations().get(TEMPLATE_ANNOTATION).cloned(),
        },
    ))
}

impl PodIndex {
    /// A re-list begins: its pods are gathered apart.
    pub fn begin_relist(&mut self) {
        self.relist = Some(HashMap::new());
    }

    /// A pod of the re-list.
    pub fn relisted(&mut self, pod: &Pod) {
        if let (Some(buf), Some((key, ix))) = (self.relist.as_mut(), indexed(pod)) {
            buf.entry(key).or_default().insert(ix.view.uid.clone(), ix);
        }
    }

    /// The re-list is complete: it replaces the index.
    pub fn end_relist(&mut self) {
        if let Some(buf) = self.relist.take() {
            self.pods = buf;
        }
    }

    /// A pod was added or changed; its task, if it is a task pod.
    pub fn apply(&mut self, pod: &Pod) -> Option<TaskKey> {
        let (key, ix) = indexed(pod)?;
        self.pods
            .entry(key.clone())
            .or_default()
            .insert(ix.view.uid.clone(), ix);
        Some(key)
    }

    /// A pod was deleted; its task, if it is a task pod.
    pub fn delete(&mut self, pod: &Pod) -> Option<TaskKey> {
        let (key, ix) = indexed(pod)?;
        if let Some(m) = self.pods.get_mut(&key) {
            m.remove(&ix.view.uid);
            if m.is_empty() {
                self.pods.remove(&key);
            }
        }
        Some(key)
    }

    /// The task's pods, as the reconciler sees them.
    pub fn views(&self, key: &TaskKey) -> Vec<PodView> {
        self.pods
            .get(key)
            .map(|m| m.values().map(|i| i.view.clone()).collect())
            .unwrap_or_default()
    }

    /// The name and last resourceVersion of the task's pod `uid`.
    pub fn version(&self, key: &TaskKey, uid: &str) -> Option<(String, String)> {
        let i = self.pods.get(key)?.get(uid)?;
        Some((i.name.clone(), i.resource_version.clone()))
    }

    /// The uid of the task's pod named `name` that is not being deleted.
    pub fn live_uid(&self, key: &TaskKey, name: &str) -> Option<String> {
        self.pods.get(key).and_then(|m| {
            m.values()
                .find(|i| i.name == name && !i.view.deleting())
                .map(|i| i.view.uid.clone())
        })
    }

    /// Whether the task has pods made from a template other than `hash`.
    pub fn other_template(&self, key: &TaskKey, hash: &str) -> bool {
        self.pods.get(key).is_some_and(|m| {
            m.values()
                .any(|i| i.template_hash.as_ref().is_some_and(|h| h != hash))
        })
    }

    /// Tasks whose newest pod records its spec and is not marked done (its
    /// result not yet delivered): what a restarted executor takes up before
    /// anyone submits them again. With the template hash that pod carries.
    pub fn unfinished(&self) -> Vec<(TaskKey, RecordedSpec, Option<String>)> {
        self.pods
            .iter()
            .filter_map(|(key, m)| {
                let newest = m
                    .values()
                    .max_by_key(|i| (i.view.attempt, i.view.created_ms))?;
                let spec = newest.view.record.as_ref()?.spec.clone()?;
                (!newest.view.done).then(|| (key.clone(), spec, newest.template_hash.clone()))
            })
            .collect()
    }

    /// Pods indexed.
    pub fn len(&self) -> usize {
        self.pods.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}
