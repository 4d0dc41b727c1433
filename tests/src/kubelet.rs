//! A simulated kubelet for pods bound to a fake node.
//!
//! The bed runs no kubelet, so nothing would ever move a pod out of Pending or
//! finish a graceful deletion. This plays that part the way a kubelet does: it
//! marks bound pods Running, and once a pod has a deletionTimestamp it waits a
//! configurable share of the grace period and then deletes it with grace 0 and a
//! uid precondition (the kubelet's status manager does exactly this).
//! Tests can also end a pod, and set `DisruptionTarget` the scheduler's way
//! (condition before the delete) or the kubelet's way (with the terminal phase).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// The message [`Kubelet::mark_preempted`] sets.
pub const PREEMPTION_MESSAGE: &str = "Preempted by a pod on node node-1";

/// When the simulated kubelet finishes graceful deletions.
#[derive(Clone, Copy, Debug)]
pub enum FinishDeletions {
    /// Only when the test calls [`Kubelet::finish_deletion`].
    Manual,
    /// After this share of the pod's grace period (0.0 = at once).
    AfterShareOfGrace(f64),
}

#[derive(Clone, Debug)]
pub struct KubeletOptions {
    pub node: String,
    /// Move bound Pending pods to Running.
    pub run_pods: bool,
    pub finish_deletions: FinishDeletions,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        Self {
            node: crate::pods::NODE.into(),
            run_pods: true,
            finish_deletions: FinishDeletions::Manual,
        }
    }
}

/// The terminal phases a test can end a pod in.
#[derive(Clone, Copy, Debug)]
pub enum Terminal {
    Succeeded,
    Failed,
}

impl Terminal {
    fn as_str(self) -> &'static str {
        match self {
            Terminal::Succeeded => "Succeeded",
            Terminal::Failed => "Failed",
        }
    }
}

/// A running simulated kubelet; stops when dropped.
pub struct Kubelet {
    client: Client,
    task: tokio::task::JoinHandle<()>,
}

impl Kubelet {
    /// Starts watching pods bound to `opts.node` in every namespace.
    pub fn start(client: Client, opts: KubeletOptions) -> Self {
        let c = client.clone();
        let task = tokio::spawn(async move { run(c, opts).await });
        Self { client, task }
    }

    /// Finishes the graceful deletion of `ns/name` now, as the kubelet does when
    /// the containers have stopped: a delete with grace 0 and a uid precondition.
    pub async fn finish_deletion(&self, ns: &str, name: &str) -> Result<()> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let pod = api
            .get(name)
            .await
            .with_context(|| format!("reading pod {ns}/{name}"))?;
        finish(&api, name, pod.uid()).await
    }

    /// Ends `ns/name` in a terminal phase, as the kubelet reports a container's exit.
    pub async fn end_pod(&self, ns: &str, name: &str, phase: Terminal) -> Result<()> {
        let status = json!({"status": {"phase": phase.as_str()}});
        patch_status(&self.client, ns, name, &status).await
    }

    /// Sets `DisruptionTarget=True` with `reason` the scheduler's way: the
    /// condition alone, before the delete (kube-scheduler, taint manager, Eviction API).
    pub async fn mark_disruption_target(
        &self,
        ns: &str,
        name: &str,
        reason: &str,
        message: &str,
    ) -> Result<()> {
        let status = json!({"status": {"conditions": [disruption_condition(reason, message)]}});
        patch_status(&self.client, ns, name, &status).await
    }

    /// [`Kubelet::mark_disruption_target`] as kube-scheduler does before a
    /// preemption: reason `PreemptionByScheduler`, message [`PREEMPTION_MESSAGE`].
    pub async fn mark_preempted(&self, ns: &str, name: &str) -> Result<()> {
        self.mark_disruption_target(ns, name, "PreemptionByScheduler", PREEMPTION_MESSAGE)
            .await
    }

    /// Sets `DisruptionTarget=True` the kubelet's way: together with the
    /// terminal phase Failed (TerminationByKubelet, DeletionByPodGC).
    pub async fn terminate_with_disruption(
        &self,
        ns: &str,
        name: &str,
        reason: &str,
        message: &str,
    ) -> Result<()> {
        let status = json!({"status": {
            "phase": "Failed",
            "conditions": [disruption_condition(reason, message)],
        }});
        patch_status(&self.client, ns, name, &status).await
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn disruption_condition(reason: &str, message: &str) -> serde_json::Value {
    json!({
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_rfc3339(),
    })
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

async fn patch_status(
    client: &Client,
    ns: &str,
    name: &str,
    status: &serde_json::Value,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    // Strategic merge: conditions merge by type, as the scheduler's and kubelet's patches do.
    api.patch_status(name, &PatchParams::default(), &Patch::Strategic(status))
        .await
        .with_context(|| format!("patching the status of pod {ns}/{name}"))?;
    Ok(())
}

async fn finish(api: &Api<Pod>, name: &str, uid: Option<String>) -> Result<()> {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => Ok(()),
        // Already gone, or replaced by a pod with another uid: nothing to finish.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("finishing the deletion of pod {name}")),
    }
}

async fn run(client: Client, opts: KubeletOptions) {
    let all: Api<Pod> = Api::all(client.clone());
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", opts.node));
    let started: Arc<Mutex<HashSet<String>>> = Arc::default();
    let finishing: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut pods = watcher(all, cfg)
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(ev) = pods.next().await {
        let pod = match ev {
            Ok(p) => p,
            Err(e) => {
                eprintln!("simulated kubelet: watch error (retrying): {e}");
                continue;
            }
        };
        let (Some(ns), name, uid) = (
            pod.namespace(),
            pod.name_any(),
            pod.uid().unwrap_or_default(),
        ) else {
            continue;
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        if pod.metadata.deletion_timestamp.is_some() {
            if let FinishDeletions::AfterShareOfGrace(share) = opts.finish_deletions {
                let first = finishing
                    .lock()
                    .map(|mut s| s.insert(uid.clone()))
                    .unwrap_or(false);
                if first {
                    let grace = pod
                        .metadata
                        .deletion_grace_period_seconds
                        .unwrap_or(0)
                        .max(0) as f64;
                    let wait = Duration::from_secs_f64((grace * share).max(0.0));
                    tokio::spawn(async move {
                        tokio::time::sleep(wait).await;
                        if let Err(e) = finish(&api, &name, Some(uid)).await {
                            eprintln!("simulated kubelet: {e:#}");
                        }
                    });
                }
            }
            continue;
        }
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("Pending");
        if opts.run_pods && phase == "Pending" {
            let first = started.lock().map(|mut s| s.insert(uid)).unwrap_or(false);
            if first {
                // Only a pod that is still Pending: a test may have ended it meanwhile,
                // and a kubelet never resurrects a finished pod.
                let now = now_rfc3339();
                let patch = json!([
                    {"op": "test", "path": "/status/phase", "value": "Pending"},
                    {"op": "replace", "path": "/status/phase", "value": "Running"},
                    {"op": "add", "path": "/status/startTime", "value": now},
                    {"op": "add", "path": "/status/conditions", "value": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": now}
                    ]},
                ]);
                let patch: json_patch::Patch = match serde_json::from_value(patch) {
                    Ok(p) => p,
                    Err(e) => {
                        eprintln!("simulated kubelet: bad patch: {e}");
                        continue;
                    }
                };
                match api
                    .patch_status(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
                    .await
                {
                    Ok(_) => {}
                    // The test op failed (no longer Pending) or the pod is gone.
                    Err(kube::Error::Api(s)) if s.code == 422 || s.code == 404 || s.code == 409 => {
                    }
                    Err(e) => eprintln!("simulated kubelet: marking {ns}/{name} Running: {e}"),
                }
            }
        }
    }
}
