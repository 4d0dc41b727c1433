//! A simulated kubelet that is a node.
//!
//! The bed runs no kubelet, so nothing would ever move a pod out of Pending or
//! finish a graceful deletion. This plays that part with the node's own
//! identity (`system:node:<name>`, so the Node authorizer and NodeRestriction
//! judge every request as they judge a kubelet's), never as admin:
//! * a bound Pending pod becomes Running through a status patch that, like the
//!   kubelet's status manager, merges conditions by type and so keeps the ones
//!   other components wrote (`DisruptionTarget` among them);
//! * once a pod has a deletionTimestamp it waits a configurable share of the
//!   grace period and then finishes the deletion as a kubelet does: a final
//!   status update (phase Failed, containers terminated), then a delete with
//!   grace 0 and a uid precondition.
//!
//! Tests can also end a pod, report the kubelet's own `TerminationByKubelet`
//! disruption, and, with kube-scheduler's identity, set `DisruptionTarget` the
//! way the scheduler does before a preemption (where a test needs it without
//! a scheduler's decision).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};

use crate::control_plane::{TestBed, NODE};

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
    /// The node it is; its identity is the bed's identity of that name.
    pub node: String,
    /// Move bound Pending pods to Running.
    pub run_pods: bool,
    pub finish_deletions: FinishDeletions,
    /// End each pod this long after it started Running, as its container's
    /// exit: in the phase its annotation [`END_ANNOTATION`] names
    /// (`Succeeded`, the default, or `Failed`; `never` keeps it running).
    /// A pod being deleted by then is left to its deletion.
    pub end_after: Option<Duration>,
}

/// The pod annotation that says how [`KubeletOptions::end_after`] ends it.
pub const END_ANNOTATION: &str = "testbed.graceguard.io/end";

impl Default for KubeletOptions {
    fn default() -> Self {
        Self {
            node: NODE.into(),
            run_pods: true,
            finish_deletions: FinishDeletions::Manual,
            end_after: None,
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

    fn exit_code(self) -> i32 {
        match self {
            Terminal::Succeeded => 0,
            // What `sleep` answers to the SIGTERM of a graceful deletion.
            Terminal::Failed => 143,
        }
    }
}

/// A running simulated kubelet; stops when dropped.
pub struct Kubelet {
    /// Authenticated as the node.
    node: Client,
    /// Authenticated as kube-scheduler, for [`Kubelet::mark_disruption_target`].
    scheduler: Client,
    task: tokio::task::JoinHandle<()>,
}

impl Kubelet {
    /// Starts watching the pods bound to `opts.node` (which must be registered:
    /// the bed registers [`NODE`]), with that node's identity.
    pub async fn start(bed: &TestBed, opts: KubeletOptions) -> Result<Self> {
        let node = bed.client_as(&opts.node).await?;
        let scheduler = bed.client_as("scheduler").await?;
        let c = node.clone();
        let task = tokio::spawn(async move { run(c, opts).await });
        Ok(Self {
            node,
            scheduler,
            task,
        })
    }

    /// Finishes the graceful deletion of `ns/name` now, as the kubelet does when
    /// the containers have stopped: final status, then delete with grace 0.
    pub async fn finish_deletion(&self, ns: &str, name: &str) -> Result<()> {
        let api: Api<Pod> = Api::namespaced(self.node.clone(), ns);
        let pod = api
            .get(name)
            .await
            .with_context(|| format!("reading pod {ns}/{name} as its node"))?;
        finish(&api, &pod).await
    }

    /// Ends `ns/name` in a terminal phase, as the kubelet reports a container's exit.
    pub async fn end_pod(&self, ns: &str, name: &str, phase: Terminal) -> Result<()> {
        let status = terminal_status(phase, None);
        patch_status(&self.node, ns, name, &status).await
    }

    /// Sets `DisruptionTarget=True` with `reason` the scheduler's way: the
    /// condition alone, before the delete, sent as `system:kube-scheduler`.
    pub async fn mark_disruption_target(
        &self,
        ns: &str,
        name: &str,
        reason: &str,
        message: &str,
    ) -> Result<()> {
        let status = json!({"status": {"conditions": [disruption_condition(reason, message)]}});
        patch_status(&self.scheduler, ns, name, &status).await
    }

    /// Sends the pod's current `DisruptionTarget` condition again, unchanged
    /// (same reason, message and transition time), as kube-scheduler.
    pub async fn repeat_disruption_target(&self, ns: &str, name: &str) -> Result<()> {
        let pod = Api::<Pod>::namespaced(self.scheduler.clone(), ns)
            .get(name)
            .await
            .with_context(|| format!("reading pod {ns}/{name}"))?;
        let condition = pod
            .status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "DisruptionTarget"))
            .with_context(|| {
                format!("pod {ns}/{name} has no DisruptionTarget condition to repeat")
            })?;
        let status = json!({"status": {"conditions": [condition]}});
        patch_status(&self.scheduler, ns, name, &status).await
    }

    /// [`Kubelet::mark_disruption_target`] as kube-scheduler does before a
    /// preemption: reason `PreemptionByScheduler`, message [`PREEMPTION_MESSAGE`].
    pub async fn mark_preempted(&self, ns: &str, name: &str) -> Result<()> {
        self.mark_disruption_target(ns, name, "PreemptionByScheduler", PREEMPTION_MESSAGE)
            .await
    }

    /// The kubelet's own disruption (node pressure, shutdown): `DisruptionTarget=True`
    /// together with the terminal phase Failed, sent as the node.
    pub async fn terminate_with_disruption(
        &self,
        ns: &str,
        name: &str,
        reason: &str,
        message: &str,
    ) -> Result<()> {
        let status = terminal_status(
            Terminal::Failed,
            Some(disruption_condition(reason, message)),
        );
        patch_status(&self.node, ns, name, &status).await
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn disruption_condition(reason: &str, message: &str) -> Value {
    json!({
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_rfc3339(),
    })
}

pub use crate::clock::now_rfc3339;

/// The status a kubelet reports when a pod's containers have ended: the
/// phase, not-ready conditions, terminated containers; `extra` is one more
/// condition (the kubelet's own DisruptionTarget).
fn terminal_status(phase: Terminal, extra: Option<Value>) -> Value {
    let now = now_rfc3339();
    let mut conditions = vec![
        json!({"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}),
        json!({"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}),
    ];
    conditions.extend(extra);
    json!({"status": {
        "phase": phase.as_str(),
        "conditions": conditions,
        "containerStatuses": [{
            "name": "main", "image": "busybox:1.36", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": phase.exit_code(), "reason": if phase.exit_code() == 0 { "Completed" } else { "Error" }, "finishedAt": now}},
        }],
    }})
}

async fn patch_status(client: &Client, ns: &str, name: &str, status: &Value) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    // Strategic merge: conditions merge by type, as the scheduler's and kubelet's patches do.
    api.patch_status(name, &PatchParams::default(), &Patch::Strategic(status))
        .await
        .with_context(|| format!("patching the status of pod {ns}/{name}"))?;
    Ok(())
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// A kubelet's end of a graceful deletion: the final status (unless the pod
/// already ended), then the delete with grace 0 and the pod's uid as precondition.
async fn finish(api: &Api<Pod>, pod: &Pod) -> Result<()> {
    let name = pod.name_any();
    if !is_terminal(pod) {
        match api
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Strategic(terminal_status(Terminal::Failed, None)),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => {
                return Err(e).with_context(|| format!("posting the final status of pod {name}"))
            }
        }
    }
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => Ok(()),
        // Already gone, or replaced by a pod with another uid: nothing to finish.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("finishing the deletion of pod {name}")),
    }
}

/// The status update that starts a pod: phase Running, the kubelet's own
/// conditions (merged by type, so others stay), a running container. It carries
/// the pod's resourceVersion, so it fails rather than resurrect a pod that
/// ended meanwhile.
fn running_status(resource_version: &str) -> Value {
    let now = now_rfc3339();
    json!({
        "metadata": {"resourceVersion": resource_version},
        "status": {
            "phase": "Running",
            "startTime": now,
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
            ],
            "containerStatuses": [{
                "name": "main", "image": "busybox:1.36", "imageID": "", "ready": true, "restartCount": 0, "started": true,
                "state": {"running": {"startedAt": now}},
            }],
        },
    })
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
                        // As a kubelet does, it keeps trying until the pod is
                        // gone (an API server down a while included).
                        for _ in 0..UNANSWERED_RETRIES {
                            // The pod as it is now: a test may have ended it meanwhile.
                            let current = match api.get_opt(&name).await {
                                Ok(Some(p)) if p.uid().as_deref() == Some(uid.as_str()) => p,
                                Ok(_) => return,
                                Err(e) => {
                                    eprintln!("simulated kubelet: reading {name}: {e}");
                                    tokio::time::sleep(Duration::from_secs(1)).await;
                                    continue;
                                }
                            };
                            match finish(&api, &current).await {
                                Ok(()) => return,
                                Err(e) => eprintln!("simulated kubelet: {e:#}; retrying"),
                            }
                            tokio::time::sleep(Duration::from_secs(1)).await;
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
            let first = started
                .lock()
                .map(|mut s| s.insert(uid.clone()))
                .unwrap_or(false);
            if first {
                let (started, end_after) = (started.clone(), opts.end_after);
                tokio::spawn(async move {
                    let rv = pod.resource_version().unwrap_or_default();
                    let running = Patch::Strategic(running_status(&rv));
                    let pp = PatchParams::default();
                    let what = format!("marking {ns}/{name} Running");
                    match until_answered(&what, || api.patch_status(&name, &pp, &running)).await {
                        Ok(_) => {
                            if let Some(after) = end_after {
                                end_later(api, pod, after).await;
                            }
                        }
                        // Changed meanwhile (a conflict) or gone: a kubelet
                        // never resurrects a finished pod; the next event
                        // decides (so does a write that never got through).
                        Err(e) => {
                            if !matches!(&e, kube::Error::Api(s) if s.code == 404 || s.code == 409)
                            {
                                eprintln!("simulated kubelet: {what}: {e}");
                            }
                            if let Ok(mut set) = started.lock() {
                                set.remove(&uid);
                            }
                        }
                    }
                });
            }
        }
    }
}

/// How long the simulated kubelet keeps trying a write the API server did not
/// answer (down, restarting): as long as a test's API server restart lasts.
const UNANSWERED_RETRIES: u32 = 120;

/// `call`, again every second while the API server gives no answer (a
/// refused or reset connection), as a kubelet's status manager keeps trying;
/// the API server's own answer (an error status included) is final.
async fn until_answered<T, F, Fut>(what: &str, mut call: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut tries = 0;
    loop {
        match call().await {
            Err(e) if !matches!(e, kube::Error::Api(_)) && tries < UNANSWERED_RETRIES => {
                eprintln!("simulated kubelet: {what}: {e}; retrying");
                tries += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            other => return other,
        }
    }
}

/// [`KubeletOptions::end_after`] for one pod.
async fn end_later(api: Api<Pod>, pod: Pod, after: Duration) {
    let phase = match pod.annotations().get(END_ANNOTATION).map(String::as_str) {
        Some("never") => return,
        Some("Failed") => Terminal::Failed,
        _ => Terminal::Succeeded,
    };
    tokio::time::sleep(after).await;
    let name = pod.name_any();
    let what = format!("reading {name} to end it");
    match until_answered(&what, || api.get_opt(&name)).await {
        Ok(Some(p)) if p.uid() == pod.uid() && p.metadata.deletion_timestamp.is_none() => {}
        Ok(_) => return,
        Err(e) => {
            eprintln!("simulated kubelet: {what}: {e}");
            return;
        }
    }
    let status = Patch::Strategic(terminal_status(phase, None));
    let pp = PatchParams::default();
    let what = format!("ending {name}");
    if let Err(e) = until_answered(&what, || api.patch_status(&name, &pp, &status)).await {
        eprintln!("simulated kubelet: {what}: {e}");
    }
}
