//! The executor's index of its pods, fed by its one pod watch: per task, by
//! uid, only what the reconciler and the done-marks need (not whole Pods).
//!
//! Times are this process's: a pod's `created_ms` is when the watch first
//! showed it here, its `deletion_ms` when its deletion was first seen here
//! plus the grace period it had then. No server timestamp is compared with
//! the local clock, so skew between the API server's and this host's
//! clocks (or a step of either) moves no bound.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::core::naming::{ATTEMPT_LABEL, DONE_LABEL, TASK_LABEL};
use crate::core::pod_record::{PodRecord, RecordedSpec, TEMPLATE_ANNOTATION};
use crate::core::reconcile::PodView;
use crate::core::result_finalizer;
use crate::core::task::TaskKey;

/// A pod in the index.
struct Indexed {
    view: PodView,
    name: String,
    /// Its task label: the stem its task's names use.
    stem: String,
    resource_version: String,
    template_hash: Option<String>,
    /// Its finalizers (a release and a done-mark write them back without
    /// graceguard's).
    finalizers: Vec<String>,
}

/// What a write to a pod is conditional on: the version the index last
/// saw, and the finalizers it had then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub finalizers: Vec<String>,
}

type ByTask = HashMap<TaskKey, BTreeMap<String, Indexed>>;

/// See the module docs.
#[derive(Default)]
pub struct PodIndex {
    pods: ByTask,
    /// The API server's clock minus this process's
    /// ([`crate::runtime::server_clock`]), once measured.
    server_offset_ms: Option<i64>,
    /// A re-list in progress: replaces `pods` when it is complete.
    relist: Option<ByTask>,
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

/// The task a pod belongs to: the task its record names when it has one
/// (so pods whose label holds an older stem of the same name, made before
/// 0.2.0, are found under the task's key today, and two names whose stems
/// collide are told apart), else its task label.
fn key_of(pod: &Pod, record: Option<&PodRecord>) -> Option<TaskKey> {
    let namespace = pod.namespace()?;
    match record.and_then(|r| r.spec.as_ref()) {
        Some(spec) if !spec.task.is_empty() => Some(TaskKey::new(&namespace, &spec.task)),
        _ => Some(TaskKey {
            namespace,
            task: pod.labels().get(TASK_LABEL)?.clone(),
        }),
    }
}

/// The pod as the index keeps it, seen at `now_ms` (local), with its record
/// (read once by the caller); `before` is what the index had of it; `None`
/// for a pod without valid task labels.
fn indexed(
    pod: &Pod,
    record: Option<PodRecord>,
    before: Option<&Indexed>,
    now_ms: i64,
    server_offset_ms: Option<i64>,
) -> Option<Indexed> {
    let labels = pod.labels();
    let stem = labels.get(TASK_LABEL)?.clone();
    let attempt: u32 = labels.get(ATTEMPT_LABEL)?.parse().ok()?;
    let status = pod.status.as_ref();
    let meta = &pod.metadata;
    let before = before.map(|b| &b.view);
    // The grace period left, counted from now; a later delete with a
    // shorter one (the kubelet's final 0) brings the end nearer, never later.
    let deletion_ms = meta.deletion_timestamp.as_ref().map(|_| {
        let grace = meta.deletion_grace_period_seconds.unwrap_or(0).max(0);
        let end = now_ms.saturating_add(grace.saturating_mul(1000));
        before
            .and_then(|b| b.deletion_ms)
            .map_or(end, |was| was.min(end))
    });
    // The task's start by this process's clock: what it had spent at the
    // Create, before the API server created the pod (server's clock,
    // turned into this process's by the measured offset).
    let task_started_ms = match (&record, &meta.creation_timestamp, server_offset_ms) {
        (
            Some(PodRecord {
                spent_ms: Some(spent),
                ..
            }),
            Some(created),
            Some(offset),
        ) => Some(
            created
                .0
                .as_millisecond()
                .saturating_sub(offset)
                .saturating_sub(*spent),
        ),
        _ => None,
    };
    let view = PodView {
        uid: pod.uid()?,
        attempt,
        phase: status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into()),
        disruption: disruption_reason(pod),
        created_ms: before.map_or(now_ms, |b| b.created_ms),
        deletion_ms,
        finished: meta.deletion_timestamp.is_some()
            && meta.deletion_grace_period_seconds == Some(0),
        done: labels.get(DONE_LABEL).is_some_and(|v| v == "true"),
        record,
        task_started_ms,
    };
    Some(Indexed {
        view,
        name: pod.name_any(),
        stem,
        resource_version: pod.resource_version().unwrap_or_default(),
        template_hash: pod.annotations().get(TEMPLATE_ANNOTATION).cloned(),
        finalizers: pod.finalizers().to_vec(),
    })
}

impl Indexed {
    fn version(&self) -> Version {
        Version {
            name: self.name.clone(),
            uid: self.view.uid.clone(),
            resource_version: self.resource_version.clone(),
            finalizers: self.finalizers.clone(),
        }
    }
}

impl PodIndex {
    /// The API server's clock minus this process's, measured.
    pub fn set_server_offset(&mut self, offset_ms: Option<i64>) {
        self.server_offset_ms = offset_ms;
    }

    /// A re-list begins: its pods are gathered apart.
    pub fn begin_relist(&mut self) {
        self.relist = Some(HashMap::new());
    }

    /// `pod` as the index keeps it, seen at `now_ms`, with what the index
    /// had of it (its record read once: it names the task).
    fn index(&self, pod: &Pod, now_ms: i64) -> Option<(TaskKey, Indexed)> {
        let record = PodRecord::from_annotations(pod.annotations());
        let key = key_of(pod, record.as_ref())?;
        let before = self.pods.get(&key).and_then(|m| m.get(pod.uid()?.as_str()));
        let ix = indexed(pod, record, before, now_ms, self.server_offset_ms)?;
        Some((key, ix))
    }

    /// A pod of the re-list, seen at `now_ms`.
    pub fn relisted(&mut self, pod: &Pod, now_ms: i64) {
        let Some((key, ix)) = self.index(pod, now_ms) else {
            return;
        };
        if let Some(buf) = self.relist.as_mut() {
            buf.entry(key).or_default().insert(ix.view.uid.clone(), ix);
        }
    }

    /// The re-list is complete: it replaces the index.
    pub fn end_relist(&mut self) {
        if let Some(buf) = self.relist.take() {
            self.pods = buf;
        }
    }

    /// A pod was added or changed (seen at `now_ms`); its task, if it is a
    /// task pod.
    pub fn apply(&mut self, pod: &Pod, now_ms: i64) -> Option<TaskKey> {
        let (key, ix) = self.index(pod, now_ms)?;
        self.pods
            .entry(key.clone())
            .or_default()
            .insert(ix.view.uid.clone(), ix);
        Some(key)
    }

    /// A pod was deleted; its task, if it is a task pod.
    pub fn delete(&mut self, pod: &Pod) -> Option<TaskKey> {
        pod.labels().get(ATTEMPT_LABEL)?.parse::<u32>().ok()?;
        let record = PodRecord::from_annotations(pod.annotations());
        let key = key_of(pod, record.as_ref())?;
        let uid = pod.uid()?;
        if let Some(m) = self.pods.get_mut(&key) {
            m.remove(&uid);
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

    /// The task's pod `uid` as last seen (what a write is conditional on).
    pub fn version(&self, key: &TaskKey, uid: &str) -> Option<Version> {
        self.pods.get(key)?.get(uid).map(Indexed::version)
    }

    /// The task's pods that hold graceguard's result finalizer.
    pub fn holding_result(&self, key: &TaskKey) -> Vec<Version> {
        self.pods
            .get(key)
            .map(|m| {
                m.values()
                    .filter(|i| result_finalizer::holds(&i.finalizers))
                    .map(Indexed::version)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The tasks in `namespace` that have pods.
    pub fn tasks_in(&self, namespace: &str) -> Vec<TaskKey> {
        self.pods
            .keys()
            .filter(|k| k.namespace == namespace)
            .cloned()
            .collect()
    }

    /// Every task that has pods.
    pub fn tasks(&self) -> Vec<TaskKey> {
        self.pods.keys().cloned().collect()
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

    /// The task, other than `task`, that pods under `key` record: another
    /// task whose name gives the same stem, whose pods must not be taken
    /// for this one's.
    pub fn other_task(&self, key: &TaskKey, task: &str) -> Option<String> {
        self.pods.get(key)?.values().find_map(|i| {
            let recorded = &i.view.record.as_ref()?.spec.as_ref()?.task;
            (recorded != task).then(|| recorded.clone())
        })
    }

    /// The stem the task's newest pod is labelled with (see
    /// [`crate::TaskSpec::stem`]).
    pub fn stem(&self, key: &TaskKey) -> Option<String> {
        let m = self.pods.get(key)?;
        let newest = m
            .values()
            .max_by_key(|i| (i.view.attempt, i.view.created_ms))?;
        Some(newest.stem.clone())
    }

    /// Tasks whose newest pod records its spec and is not marked done (its
    /// result not yet delivered): what a restarted executor takes up before
    /// anyone submits them again. With the template hash that pod carries.
    /// A newest pod being deleted that no longer holds the result finalizer
    /// was let go of (its task aborted or forgotten, its namespace being
    /// deleted): not taken up.
    pub fn unfinished(&self) -> Vec<(TaskKey, RecordedSpec, Option<String>)> {
        self.pods
            .iter()
            .filter_map(|(key, m)| {
                let newest = m
                    .values()
                    .max_by_key(|i| (i.view.attempt, i.view.created_ms))?;
                let spec = newest.view.record.as_ref()?.spec.clone()?;
                let let_go = newest.view.deleting() && !result_finalizer::holds(&newest.finalizers);
                (!newest.view.done && !let_go)
                    .then(|| (key.clone(), spec, newest.template_hash.clone()))
            })
            .collect()
    }

    /// Pods indexed.
    pub fn len(&self) -> usize {
        self.pods.values().map(BTreeMap::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(deleting: Option<i64>) -> Pod {
        let record = PodRecord {
            spec: Some(crate::core::reconcile::TaskSpec::new("t", "ns", "i").recorded()),
            ..Default::default()
        };
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "t-0", "namespace": "ns", "uid": "u",
                "labels": {TASK_LABEL: "t", ATTEMPT_LABEL: "0"},
                "annotations": {crate::core::pod_record::RECORD_ANNOTATION: record.to_annotation()},
                "finalizers": [crate::core::naming::RESULT_FINALIZER],
                // An hour ahead of this host's clock: never compared with it.
                "creationTimestamp": "2099-01-01T00:00:00Z",
            },
            "status": {"phase": "Running"},
        }))
        .unwrap_or_default();
        if let Some(grace) = deleting {
            p.metadata.deletion_timestamp = p.metadata.creation_timestamp.clone();
            p.metadata.deletion_grace_period_seconds = Some(grace);
        }
        p
    }

    #[test]
    fn bounds_count_from_what_this_process_saw_not_from_server_timestamps() {
        let mut ix = PodIndex::default();
        let key = ix.apply(&pod(None), 1_000);
        let key = key.unwrap_or_else(|| TaskKey::new("ns", "t"));
        assert_eq!(ix.views(&key)[0].created_ms, 1_000);
        // Seen again later: still first seen at 1 000.
        ix.apply(&pod(None), 5_000);
        assert_eq!(ix.views(&key)[0].created_ms, 1_000);
        // Deleted with 30 s of grace, seen at 6 000: ends at 36 000.
        ix.apply(&pod(Some(30)), 6_000);
        assert_eq!(ix.views(&key)[0].deletion_ms, Some(36_000));
        // The same deletion seen again: unchanged; the final one (grace 0)
        // brings it to now.
        ix.apply(&pod(Some(30)), 9_000);
        assert_eq!(ix.views(&key)[0].deletion_ms, Some(36_000));
        ix.apply(&pod(Some(0)), 10_000);
        let v = &ix.views(&key)[0];
        assert_eq!((v.deletion_ms, v.finished), (Some(10_000), true));
        // A re-list keeps what was seen.
        ix.begin_relist();
        ix.relisted(&pod(Some(0)), 20_000);
        ix.end_relist();
        assert_eq!(ix.views(&key)[0].created_ms, 1_000);
    }

    #[test]
    fn a_restart_takes_up_a_deleted_task_pod_unless_it_was_let_go_of() {
        let mut ix = PodIndex::default();
        ix.apply(&pod(Some(30)), 1_000);
        assert_eq!(ix.unfinished().len(), 1, "deleted, its result kept");
        let mut released = pod(Some(30));
        released.metadata.finalizers = None;
        ix.apply(&released, 2_000);
        assert!(ix.unfinished().is_empty(), "aborted or forgotten: let go");
        released.metadata.deletion_timestamp = None;
        ix.apply(&released, 3_000);
        assert_eq!(ix.unfinished().len(), 1, "not deleted: taken up");
    }

    /// A pod of `task` as 0.1.0 made it: labelled with the stem of that
    /// time (8 hash digits), its record naming the task.
    fn recorded_pod(task: &str, stem: &str, uid: &str) -> Pod {
        let mut p = pod(None);
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(format!("{stem}-0"));
        let record = PodRecord {
            spec: Some(crate::core::reconcile::TaskSpec::new(task, "ns", "i").recorded()),
            ..Default::default()
        };
        let meta = &mut p.metadata;
        meta.labels
            .get_or_insert_with(Default::default)
            .insert(TASK_LABEL.into(), stem.into());
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(
                crate::core::pod_record::RECORD_ANNOTATION.into(),
                record.to_annotation(),
            );
        p
    }

    #[test]
    fn a_pod_is_the_task_its_record_names_whatever_stem_its_label_holds() {
        let task = "Nightly_Training.Run_2026_12_06.Shard_0042_of_0128_with_a_long_suffix";
        let old = "nightly-training-run-2026-12-06-shard-0042-cc32d46d";
        let mut ix = PodIndex::default();
        let key = ix.apply(&recorded_pod(task, old, "u1"), 1_000);
        assert_eq!(key, Some(TaskKey::new("ns", task)));
        let key = TaskKey::new("ns", task);
        assert_ne!(key.task, old, "today's stem is another");
        assert_eq!(ix.views(&key).len(), 1);
        // The task goes on under the stem its pods have.
        assert_eq!(ix.stem(&key).as_deref(), Some(old));
        assert_eq!(ix.other_task(&key, task), None);
        // Its deletion is found under the same key.
        assert_eq!(ix.delete(&recorded_pod(task, old, "u1")), Some(key.clone()));
        assert!(ix.views(&key).is_empty());
        // Pods recording another task under this key are that task's.
        ix.apply(&recorded_pod("other", old, "u2"), 2_000);
        let other = TaskKey::new("ns", "other");
        assert_eq!(ix.other_task(&other, task).as_deref(), Some("other"));
    }

    #[test]
    fn a_taken_over_task_starts_by_this_processs_clock_never_another_hosts() {
        // The launching host's clock was an hour ahead: its recorded start
        // is an hour late. The pod says the task had spent 30 s when its
        // Create was sent; the API server created it at 2099-01-01T00:00Z
        // by its clock, which runs 2 s ahead of this process's.
        let created = k8s_openapi::jiff::Timestamp::from_second(4_070_908_800)
            .map(|t| t.as_millisecond())
            .unwrap_or_default();
        let record = PodRecord {
            started_ms: Some(created - 30_000 + 3_600_000),
            spent_ms: Some(30_000),
            spec: Some(crate::core::reconcile::TaskSpec::new("t", "ns", "i").recorded()),
            ..Default::default()
        };
        let mut p = pod(None);
        p.metadata.annotations = Some(
            [(
                crate::core::pod_record::RECORD_ANNOTATION.to_string(),
                record.to_annotation(),
            )]
            .into(),
        );
        let mut ix = PodIndex::default();
        ix.set_server_offset(Some(2_000));
        let key = ix.apply(&p, 0).unwrap_or_else(|| TaskKey::new("ns", "t"));
        let view = &ix.views(&key)[0];
        assert_eq!(view.task_started_ms, Some(created - 2_000 - 30_000));
        let state = crate::core::reconcile::restore(&ix.views(&key), 0);
        assert_eq!(
            state.started_ms,
            created - 32_000,
            "not the recorded, skewed start"
        );
        // Unmeasured: the record's start is all there is.
        let mut ix = PodIndex::default();
        ix.apply(&p, 0);
        assert_eq!(ix.views(&key)[0].task_started_ms, None);
        let state = crate::core::reconcile::restore(&ix.views(&key), 0);
        assert_eq!(state.started_ms, created - 30_000 + 3_600_000);
    }
}
