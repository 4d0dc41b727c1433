//! Rule 6: completed pods left by a dead instance are reported once and drained.
//!
//! apache/airflow#68683 kept adopted completed pods in a set that was never
//! drained and re-processed it for every result: PATCHes grew as results ×
//! pods. Here a watch on managed pods *not yet marked done* delivers each pod's
//! changes once; a completed pod whose instance's Lease has expired is
//! reported, marked done (label `graceguard.io/done=true`, or deleted), and
//! leaves the watch's selector, which drops it from memory. Each sync handles
//! only the events that arrived since the last one.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};

use crate::driver::GuardError;
use crate::lease::{self, lease_name};
use crate::naming::{
    ATTEMPT_LABEL, DONE_LABEL, INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL, TASK_LABEL,
};

/// What happens to a completed pod once it has been reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DoneAction {
    /// Label it `graceguard.io/done=true` (keeps logs for inspection).
    Label,
    Delete,
}

/// A completed pod of a dead instance, reported once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletedPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub task: String,
    pub attempt: String,
    pub instance: String,
    /// `Succeeded` or `Failed`.
    pub phase: String,
}

/// See the module docs.
pub struct Adopter {
    pods: Api<Pod>,
    leases: Api<Lease>,
    instance: String,
    done: DoneAction,
    events: BoxStream<'static, Result<Event<Pod>, watcher::Error>>,
    /// Marked done, not yet seen leaving the selector.
    in_flight: HashSet<String>,
    /// Completed pods whose adoption failed, tried again at the next sync.
    retry: Vec<Pod>,
}

impl Adopter {
    /// Watches graceguard's pods in `namespace` for this `instance`.
    pub fn new(client: Client, namespace: &str, instance: &str, done: DoneAction) -> Self {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY},{DONE_LABEL}!=true");
        let events = watcher::watcher(pods.clone(), watcher::Config::default().labels(&selector))
            .default_backoff()
            .boxed();
        Self {
            pods,
            leases: Api::namespaced(client, namespace),
            instance: instance.to_string(),
            done,
            events,
            in_flight: HashSet::new(),
            retry: Vec::new(),
        }
    }

    /// Handles the events that arrived since the last call (and any left over
    /// from a failed attempt), waiting up to `wait` for the first. Returns the
    /// completed pods reported now. A pod whose Lease read or PATCH fails is
    /// kept and tried again at the next sync; nothing is dropped.
    pub async fn sync(&mut self, wait: Duration) -> Result<Vec<CompletedPod>, GuardError> {
        let mut batch = Vec::new();
        if let Ok(Some(ev)) = tokio::time::timeout(wait, self.events.next()).await {
            batch.push(ev);
            while let Some(Some(ev)) = self.events.next().now_or_never() {
                batch.push(ev);
            }
        }
        // Lease answers are valid for one sync.
        let mut expired: HashMap<String, bool> = HashMap::new();
        let mut reported = Vec::new();
        let mut todo: Vec<Pod> = std::mem::take(&mut self.retry);
        for ev in batch {
            match ev {
                Ok(Event::InitApply(p)) | Ok(Event::Apply(p)) => todo.push(p),
                Ok(Event::Delete(p)) => {
                    if let Some(uid) = p.uid() {
                        self.in_flight.remove(&uid);
                    }
                }
                // A re-list: pods that left the selector meanwhile send no
                // Delete, so forget what was in flight; the list says the rest.
                Ok(Event::Init) => self.in_flight.clear(),
                Ok(Event::InitDone) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "adoption watch failed; the watcher retries with backoff")
                }
            }
        }
        for pod in todo {
            match self.consider(&pod, &mut expired).await {
                Ok(Some(done)) => reported.push(done),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(pod = %pod.name_any(), error = %e, "adoption of a completed pod failed; retrying at the next sync");
                    self.retry.push(pod);
                }
            }
        }
        Ok(reported)
    }

    async fn consider(
        &mut self,
        pod: &Pod,
        expired: &mut HashMap<String, bool>,
    ) -> Result<Option<CompletedPod>, GuardError> {
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        let uid = pod.uid().unwrap_or_default();
        if !(phase == "Succeeded" || phase == "Failed") || self.in_flight.contains(&uid) {
            return Ok(None);
        }
        let labels = pod.labels();
        let label = |k: &str| labels.get(k).cloned().unwrap_or_default();
        let owner = label(INSTANCE_LABEL);
        if owner == self.instance {
            // Ours: the instance's own run loop reports it.
            return Ok(None);
        }
        let dead = match expired.get(&owner) {
            Some(d) => *d,
            None => {
                let l = self
                    .leases
                    .get_opt(&lease_name(&owner))
                    .await
                    .map_err(|e| {
                        GuardError::Api(format!("reading the Lease of instance {owner}: {e}"))
                    })?;
                let d = lease::expired(l.as_ref(), Timestamp::now());
                expired.insert(owner.clone(), d);
                d
            }
        };
        if !dead {
            return Ok(None);
        }
        let name = pod.name_any();
        match self.done {
            DoneAction::Label => {
                let patch = serde_json::json!({"metadata": {"labels": {DONE_LABEL: "true"}}});
                match self
                    .pods
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(GuardError::Api(format!("marking pod {name} done: {e}"))),
                }
            }
            DoneAction::Delete => {
                if let Err(e) = self.pods.delete(&name, &DeleteParams::default()).await {
                    if !matches!(&e, kube::Error::Api(s) if s.code == 404) {
                        return Err(GuardError::Api(format!(
                            "deleting completed pod {name}: {e}"
                        )));
                    }
                }
            }
        }
        self.in_flight.insert(uid.clone());
        Ok(Some(CompletedPod {
            namespace: pod.namespace().unwrap_or_default(),
            name,
            uid,
            task: label(TASK_LABEL),
            attempt: label(ATTEMPT_LABEL),
            instance: owner,
            phase,
        }))
    }

    /// Pods marked done whose departure the watch has not confirmed yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}
