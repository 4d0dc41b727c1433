//! Rule 6: results left by a dead instance are delivered at least once,
//! never to two adopters, and drained.
//!
//! apache/airflow#68683 kept adopted completed pods in a set that was never
//! drained and re-processed it for every result: PATCHes grew as results ×
//! pods. Here a watch on managed pods *not yet marked done* delivers each
//! pod's changes once. A completed pod of another instance is:
//!
//! 1. left alone while its owner's Lease is valid, and looked at again when
//!    that Lease would expire (never dropped);
//! 2. **claimed** with a conditional write (annotation
//!    `graceguard.io/claimed-by`, on the resourceVersion seen): of two
//!    adopters exactly one succeeds, the other gets 409 and moves on;
//! 3. delivered to the caller, who **acknowledges** it ([`Adopter::ack`]);
//!    only then is it marked done (label `graceguard.io/done=true`, again
//!    conditional on the claim's resourceVersion), which takes it out of the
//!    watch's selector and so out of memory.
//!
//! The done-mark also lets go of the pod's result finalizer
//! ([`crate::core::result_finalizer`]), which kept it until then.
//!
//! Adoption goes by task, not by pod: of a dead owner's task only the
//! highest attempt this adopter knows is delivered, once it has ended; an
//! older attempt that ended (superseded: its owner had launched the next) is
//! marked done without being delivered, and its deletion is not reported.
//! A task whose `X-0` failed and `X-1` still runs is one result, `X-1`'s,
//! delivered when it ends ([`standing`]). While a list is in progress no pod
//! is decided, so a later attempt still to come in the list cannot be missed.
//!
//! A crash between claim and acknowledgement loses nothing: the pod is still
//! claimed by this instance and not done, so the restarted instance delivers
//! it again (at least once), and once this instance's Lease has expired,
//! another adopter may take it over. A pod of a dead instance deleted before
//! it was delivered is reported as [`Found::Gone`] with its last phase (not
//! completed: its task has no result).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};

pub use crate::core::naming::CLAIMED_BY_ANNOTATION;
use crate::core::naming::{
    ATTEMPT_LABEL, DONE_LABEL, INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL, TASK_LABEL,
};
use crate::runtime::done_marks::{mark_done, Marked};
use crate::runtime::error::GuardError;
use crate::runtime::lease::{lease_name, Liveness, Observer};
use crate::runtime::pod_index::disruption_reason;

/// A pod of a dead instance, as delivered (and as the sidecar's `adopted`
/// and `gone` events carry it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "sidecar", derive(utoipa::ToSchema))]
pub struct AdoptedPod {
    pub namespace: String,
    #[serde(rename = "pod")]
    pub name: String,
    pub uid: String,
    pub task: String,
    /// Its attempt label, when that is a number.
    pub attempt: Option<u32>,
    pub instance: String,
    /// `Succeeded` or `Failed` (for [`Found::Gone`], its last phase).
    pub phase: String,
    /// Its DisruptionTarget reason, else `Deleted` if it was being deleted:
    /// a `Failed` with a reason is not the user's failure.
    pub reason: Option<String>,
    /// After the claim: what the done-mark is conditional on.
    pub resource_version: String,
    /// Its finalizers after the claim (the done-mark writes them back
    /// without graceguard's result finalizer).
    #[serde(skip)]
    #[cfg_attr(feature = "sidecar", schema(ignore))]
    pub finalizers: Vec<String>,
}

/// What a sync found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// A completed pod, claimed for this instance: deliver, then [`Adopter::ack`].
    Completed(AdoptedPod),
    /// Deleted before it completed: its task has no result.
    Gone(AdoptedPod),
}

/// See the module docs.
pub struct Adopter {
    client: Client,
    pods: Api<Pod>,
    leases: Api<Lease>,
    instance: String,
    events: BoxStream<'static, Result<Event<Pod>, watcher::Error>>,
    /// Claimed and delivered, not yet seen leaving the selector.
    delivered: HashSet<String>,
    /// Completed pods of live owners, by the time (s) their Lease expires.
    waiting: HashMap<String, (Pod, i64)>,
    /// Pods deleted while their owner's Lease looked alive (an owner this
    /// adopter had only just seen), looked at again when it would lapse:
    /// lapsed, they are reported gone; renewed, the owner lives and handles
    /// them itself.
    gone_waiting: HashMap<String, (Pod, i64)>,
    /// Completed pods whose claim failed, tried again at the next sync.
    retry: Vec<Pod>,
    /// The uids of a re-list in progress.
    relisted: Option<HashSet<String>>,
    /// Owners' Leases as seen by this adopter (their expiry is judged from
    /// renewals seen here, never from the owner's clock).
    leases_seen: Observer,
    /// Owners whose Lease was missing, said once each.
    unknown_owners: HashSet<String>,
    /// The attempts of each task (owner instance, task) this adopter knows
    /// of among the pods not yet done: attempt → uid.
    attempts: HashMap<(String, String), BTreeMap<u32, String>>,
}

/// Where an ended pod stands among its task's attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// No later attempt is known: its outcome is the task's.
    Latest,
    /// A later attempt exists: its owner went on; not the task's outcome.
    Superseded,
}

/// The rule: a pod is its task's outcome unless a later attempt of the task
/// is known. A pod without a readable attempt stands alone.
pub fn standing(known: Option<&BTreeMap<u32, String>>, attempt: Option<u32>) -> Standing {
    match (known.and_then(|k| k.keys().next_back()), attempt) {
        (Some(highest), Some(a)) if *highest > a => Standing::Superseded,
        _ => Standing::Latest,
    }
}

/// How often a pod whose owner's Lease is missing is looked at again.
pub const UNKNOWN_OWNER_RECHECK: Duration = Duration::from_secs(60);

impl Adopter {
    /// Watches graceguard's pods in `namespace` for this `instance`; owners'
    /// Leases are read in `lease_namespace`.
    pub fn new(client: Client, namespace: &str, lease_namespace: &str, instance: &str) -> Self {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY},{DONE_LABEL}!=true");
        let events = watcher::watcher(
            pods.clone(),
            crate::runtime::api_timeouts::watch_config(&selector),
        )
        .default_backoff()
        .boxed();
        Self {
            pods,
            leases: Api::namespaced(client.clone(), lease_namespace),
            client,
            instance: instance.to_string(),
            events,
            delivered: HashSet::new(),
            waiting: HashMap::new(),
            gone_waiting: HashMap::new(),
            retry: Vec::new(),
            relisted: None,
            leases_seen: Observer::default(),
            unknown_owners: HashSet::new(),
            attempts: HashMap::new(),
        }
    }

    fn task_of(pod: &Pod) -> (String, String) {
        (label(pod, INSTANCE_LABEL), label(pod, TASK_LABEL))
    }

    fn know(&mut self, pod: &Pod) {
        if let Ok(a) = label(pod, ATTEMPT_LABEL).parse::<u32>() {
            self.attempts
                .entry(Self::task_of(pod))
                .or_default()
                .insert(a, pod.uid().unwrap_or_default());
        }
    }

    fn forget(&mut self, pod: &Pod) {
        let key = Self::task_of(pod);
        if let Some(known) = self.attempts.get_mut(&key) {
            let uid = pod.uid().unwrap_or_default();
            known.retain(|_, u| *u != uid);
            if known.is_empty() {
                self.attempts.remove(&key);
            }
        }
    }

    fn standing_of(&self, pod: &Pod) -> Standing {
        standing(
            self.attempts.get(&Self::task_of(pod)),
            label(pod, ATTEMPT_LABEL).parse().ok(),
        )
    }

    /// Handles the events that arrived since the last call (waiting up to
    /// `wait` for the first), the pods whose owner's Lease has expired since,
    /// and any claim that failed before. Returns what to deliver now.
    pub async fn sync(&mut self, wait: Duration) -> Result<Vec<Found>, GuardError> {
        let mut batch = Vec::new();
        if let Ok(Some(ev)) = tokio::time::timeout(wait, self.events.next()).await {
            batch.push(ev);
            while let Some(Some(ev)) = self.events.next().now_or_never() {
                batch.push(ev);
            }
        }
        let now = Timestamp::now().as_second();
        let mut todo: Vec<Pod> = std::mem::take(&mut self.retry);
        todo.extend(take_due(&mut self.waiting, now));
        let mut found = Vec::new();
        let mut expiry: HashMap<String, Option<i64>> = HashMap::new();
        for p in take_due(&mut self.gone_waiting, now) {
            let owner = label(&p, INSTANCE_LABEL);
            match self.lease_expiry(&owner, &mut expiry, now).await {
                Ok(None) => found.push(Found::Gone(adopted(&p, phase_of(&p)))),
                // Renewed since: the owner lives and sees the deletion itself.
                Ok(Some(_)) => {}
                Err(e) => {
                    tracing::warn!(error = %e, pod = %p.name_any(), "a deleted pod's owner could not be checked; reporting it gone");
                    found.push(Found::Gone(adopted(&p, phase_of(&p))));
                }
            }
        }
        for ev in batch {
            match ev {
                Ok(Event::InitApply(p)) => {
                    if let Some(seen) = self.relisted.as_mut() {
                        seen.insert(p.uid().unwrap_or_default());
                    }
                    self.know(&p);
                    todo.push(p);
                }
                Ok(Event::Apply(p)) => {
                    self.know(&p);
                    todo.push(p);
                }
                Ok(Event::Delete(p)) => {
                    // Handled in order: a pod that completed and was
                    // deleted within one batch is not claimed (404) and lost.
                    let uid = p.uid().unwrap_or_default();
                    todo.retain(|t| t.uid().as_deref() != Some(uid.as_str()));
                    self.waiting.remove(&uid);
                    self.forget(&p);
                    if self.delivered.remove(&uid) {
                        continue;
                    }
                    // A later attempt exists: the task's outcome is that
                    // one's, not this deletion's.
                    if self.standing_of(&p) == Standing::Superseded {
                        continue;
                    }
                    if let Some(gone) = self.gone(&p, &mut expiry).await {
                        found.push(Found::Gone(gone));
                    }
                }
                // A re-list: pods that left the selector meanwhile send no
                // Delete; the list says what is still there.
                Ok(Event::Init) => {
                    self.delivered.clear();
                    self.attempts.clear();
                    self.relisted = Some(HashSet::new());
                }
                Ok(Event::InitDone) => {
                    let Some(seen) = self.relisted.take() else {
                        continue;
                    };
                    // Held pods missing from the new list were deleted
                    // while the watch was down.
                    let missing: Vec<String> = self
                        .waiting
                        .keys()
                        .filter(|uid| !seen.contains(*uid))
                        .cloned()
                        .collect();
                    for uid in missing {
                        if let Some((p, _)) = self.waiting.remove(&uid) {
                            todo.retain(|t| t.uid().as_deref() != Some(uid.as_str()));
                            if self.standing_of(&p) == Standing::Superseded {
                                continue;
                            }
                            if let Some(gone) = self.gone(&p, &mut expiry).await {
                                found.push(Found::Gone(gone));
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "adoption watch failed; the watcher retries with backoff")
                }
            }
        }
        if self.relisted.is_some() {
            // A list in progress: a later attempt of a task may be still to
            // come in it. Decided once it is whole.
            self.retry.extend(todo.iter().map(slim));
            return Ok(found);
        }
        for pod in todo {
            match self.consider(&pod, &mut expiry, now).await {
                Ok(Some(p)) => found.push(Found::Completed(p)),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(pod = %pod.name_any(), error = %e, "claiming a completed pod failed; retrying at the next sync");
                    self.retry.push(slim(&pod));
                }
            }
        }
        Ok(found)
    }

    async fn consider(
        &mut self,
        pod: &Pod,
        cache: &mut HashMap<String, Option<i64>>,
        now: i64,
    ) -> Result<Option<AdoptedPod>, GuardError> {
        let uid = pod.uid().unwrap_or_default();
        let phase = phase_of(pod);
        if !(phase == "Succeeded" || phase == "Failed") || self.delivered.contains(&uid) {
            return Ok(None);
        }
        let owner = label(pod, INSTANCE_LABEL);
        if owner == self.instance {
            // Ours: the instance's own executor reports it.
            return Ok(None);
        }
        if let Some(at) = self.lease_expiry(&owner, cache, now).await? {
            // The owner lives: look again when its Lease would expire.
            self.waiting.insert(uid, (slim(pod), at + 1));
            return Ok(None);
        }
        let claimant = pod
            .annotations()
            .get(CLAIMED_BY_ANNOTATION)
            .cloned()
            .unwrap_or_default();
        if !claimant.is_empty() && claimant != self.instance {
            if let Some(at) = self.lease_expiry(&claimant, cache, now).await? {
                // Another adopter has it; if that one dies, take it over.
                self.waiting.insert(uid, (slim(pod), at + 1));
                return Ok(None);
            }
        }
        let name = pod.name_any();
        let rv = pod.resource_version().unwrap_or_default();
        if self.standing_of(pod) == Standing::Superseded {
            // Its owner launched the next attempt: done, not delivered.
            return match mark_done(
                &self.client,
                &pod.namespace().unwrap_or_default(),
                &name,
                &rv,
                pod.finalizers(),
                &self.instance,
            )
            .await
            {
                Marked::Failed(source) => {
                    Err(GuardError::SupersededNotMarked { pod: name, source })
                }
                _ => {
                    self.delivered.insert(uid);
                    Ok(None)
                }
            };
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": rv, "annotations": {CLAIMED_BY_ANNOTATION: self.instance}}
        });
        let claimed = match self
            .pods
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(p) => p,
            // Changed since it was seen (another adopter's claim, most
            // likely): the watch delivers the new version, decided then.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => return Ok(None),
            Err(e) => return Err(GuardError::api(format!("claiming pod {name}"), e)),
        };
        self.delivered.insert(uid.clone());
        Ok(Some(adopted(&claimed, phase)))
    }

    /// A pod of a dead owner deleted before it was delivered (with its last
    /// phase: completed or not); `None` for pods of this or a live instance.
    async fn gone(
        &mut self,
        pod: &Pod,
        cache: &mut HashMap<String, Option<i64>>,
    ) -> Option<AdoptedPod> {
        let phase = phase_of(pod);
        let owner = label(pod, INSTANCE_LABEL);
        if owner == self.instance {
            return None;
        }
        match self
            .lease_expiry(&owner, cache, Timestamp::now().as_second())
            .await
        {
            Ok(None) => Some(adopted(pod, phase)),
            Ok(Some(at)) => {
                // Alive as far as this adopter can tell (it may have only
                // just seen the owner's Lease): decided when it would lapse.
                let uid = pod.uid().unwrap_or_default();
                self.gone_waiting.insert(uid, (slim(pod), at + 1));
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, pod = %pod.name_any(), "a deleted pod's owner could not be checked; reporting it gone");
                Some(adopted(pod, phase))
            }
        }
    }

    /// The caller has the result: mark the pod done, conditionally on the
    /// claim's resourceVersion.
    pub async fn ack(&self, pod: &AdoptedPod) -> Marked {
        mark_done(
            &self.client,
            &pod.namespace,
            &pod.name,
            &pod.resource_version,
            &pod.finalizers,
            &self.instance,
        )
        .await
    }

    /// Pods delivered whose departure the watch has not confirmed yet.
    pub fn in_flight(&self) -> usize {
        self.delivered.len()
    }

    /// Completed pods held until their owner's Lease expires.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// When `owner`'s Lease expires, by this process's clock (s since the
    /// epoch, `now` being the present); `None`: it has (released, or no
    /// renewal seen for its duration). A *missing* Lease is not a dead owner
    /// (it may live with its Lease in another namespace, or run without
    /// one): its pods are looked at again after [`UNKNOWN_OWNER_RECHECK`],
    /// never adopted on that alone. Answers are cached for one sync.
    async fn lease_expiry(
        &mut self,
        owner: &str,
        cache: &mut HashMap<String, Option<i64>>,
        now: i64,
    ) -> Result<Option<i64>, GuardError> {
        if let Some(e) = cache.get(owner) {
            return Ok(*e);
        }
        let name = lease_name(owner);
        let l =
            self.leases.get_opt(&name).await.map_err(|e| {
                GuardError::api(format!("reading the Lease of instance {owner}"), e)
            })?;
        let at = match (l.is_some(), self.leases_seen.observe(&name, l.as_ref())) {
            (false, _) => {
                if self.unknown_owners.insert(owner.to_string()) {
                    tracing::warn!(instance = %owner, lease = %name, "the Lease of instance {owner} does not exist here, so whether it is alive is unknown: its pods are not adopted on that alone (looked at again every {} s)", UNKNOWN_OWNER_RECHECK.as_secs());
                }
                Some(now.saturating_add(
                    i64::try_from(UNKNOWN_OWNER_RECHECK.as_secs()).unwrap_or(i64::MAX),
                ))
            }
            (true, Liveness::Free) => None,
            (true, Liveness::Held { remaining, .. }) => {
                Some(now.saturating_add(i64::try_from(remaining.as_secs()).unwrap_or(i64::MAX)))
            }
        };
        cache.insert(owner.to_string(), at);
        Ok(at)
    }
}

/// The pods of `held` whose time (s) has come, taken out.
fn take_due(held: &mut HashMap<String, (Pod, i64)>, now: i64) -> Vec<Pod> {
    held.extract_if(|_, (_, at)| *at <= now)
        .map(|(_, (p, _))| p)
        .collect()
}

/// What adoption needs of a pod it holds on to (waiting for its owner's
/// Lease, or for a claim to be tried again): its metadata without the
/// managed fields and other annotations, its phase and DisruptionTarget
/// condition; no spec. Thousands of held pods stay small.
fn slim(pod: &Pod) -> Pod {
    use k8s_openapi::api::core::v1::PodStatus;
    let m = &pod.metadata;
    let claimed = m
        .annotations
        .as_ref()
        .and_then(|a| a.get(CLAIMED_BY_ANNOTATION))
        .map(|c| [(CLAIMED_BY_ANNOTATION.to_string(), c.clone())].into());
    let status = pod.status.as_ref().map(|s| PodStatus {
        phase: s.phase.clone(),
        conditions: s.conditions.as_ref().map(|cs| {
            cs.iter()
                .filter(|c| c.type_ == "DisruptionTarget")
                .cloned()
                .collect()
        }),
        ..Default::default()
    });
    Pod {
        metadata: kube::api::ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            labels: m.labels.clone(),
            annotations: claimed,
            finalizers: m.finalizers.clone(),
            deletion_timestamp: m.deletion_timestamp.clone(),
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            ..Default::default()
        },
        spec: None,
        status,
    }
}

/// Its phase; a pod whose deletion has finished (grace 0) but that the
/// result finalizer keeps, and whose kubelet posted no terminal phase
/// (before Kubernetes 1.22), ended `Failed`: it was stopped before it
/// ended. (Without that finalizer it is about to vanish: reported gone.)
fn phase_of(pod: &Pod) -> String {
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_else(|| "Pending".into());
    let finished = pod.metadata.deletion_timestamp.is_some()
        && pod.metadata.deletion_grace_period_seconds == Some(0)
        && crate::core::result_finalizer::holds(pod.finalizers());
    match (finished, phase.as_str()) {
        (true, p) if p != "Succeeded" && p != "Failed" => "Failed".into(),
        _ => phase,
    }
}

fn label(pod: &Pod, key: &str) -> String {
    pod.labels().get(key).cloned().unwrap_or_default()
}

fn adopted(pod: &Pod, phase: String) -> AdoptedPod {
    AdoptedPod {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
        task: label(pod, TASK_LABEL),
        attempt: label(pod, ATTEMPT_LABEL).parse().ok(),
        instance: label(pod, INSTANCE_LABEL),
        phase,
        reason: disruption_reason(pod).or_else(|| {
            pod.metadata
                .deletion_timestamp
                .as_ref()
                .map(|_| "Deleted".into())
        }),
        resource_version: pod.resource_version().unwrap_or_default(),
        finalizers: pod.finalizers().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_highest_known_attempt_is_a_tasks_outcome() {
        let known: BTreeMap<u32, String> = [(0, "u0".into()), (1, "u1".into())].into();
        assert_eq!(standing(Some(&known), Some(0)), Standing::Superseded);
        assert_eq!(standing(Some(&known), Some(1)), Standing::Latest);
        // An attempt beyond what is known (its pod not seen yet) is the latest.
        assert_eq!(standing(Some(&known), Some(2)), Standing::Latest);
        // Nothing else known, or no readable attempt: it stands alone.
        assert_eq!(standing(None, Some(0)), Standing::Latest);
        assert_eq!(standing(Some(&known), None), Standing::Latest);
    }
}
