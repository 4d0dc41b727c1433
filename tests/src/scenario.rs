//! The graceful-delete collision, replayed the way a looping executor does it.
//!
//! A running task pod is deleted gracefully; while it is Terminating, the
//! executor creates the same name again and again. Each Create is charged to
//! ResourceQuota before the name check fails it (kubernetes/kubernetes#70563),
//! so every lap leaks one pod of quota. `scripts/demo` and the tests run this
//! same code, with and without graceguard in front of the API server.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use crate::disruptions::{most_of_node_cpu, priority_classes, Kubelets, HIGH, LOW};
use testbed::pods::{self, CreateOutcome};
use testbed::quota;
use testbed::TestBed;

/// The high-priority pod that preempts a task in the preemption scenarios.
pub const INTRUDER: &str = "intruder";

/// Name of the pod the scenario collides on.
pub const POD: &str = "train-a0-0";

/// What one run of the scenario did, as `scripts/demo --json` prints it.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct CollisionReport {
    pub scenario: &'static str,
    pub mode: String,
    /// The Kubernetes version the scenario ran on.
    pub kube_version: &'static str,
    /// Colliding Creates issued while the pod was Terminating.
    pub creates: u32,
    pub already_exists: u32,
    pub forbidden: u32,
    /// Answers that were neither (should be none).
    pub other: u32,
    /// Growth of quota `status.used.pods` not matched by a pod that was
    /// actually created: charges for Creates that failed.
    pub leaked_quota_charges: i64,
    /// Creates issued while the old pod was still Terminating.
    pub creates_while_terminating: u32,
    /// Mode `guard` only: the user's retries spent by the recovery.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts_burned: Option<u32>,
    /// HTTP code and message of the first colliding Create's answer.
    pub first_answer_code: u16,
    pub first_answer: String,
    /// Mode `graceguard`: the webhook's audit record of the first denial.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_record: Option<serde_json::Value>,
    /// `real` when real kubelets ran the pods, `simulated` otherwise.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub kubelet: &'static str,
    /// The colliding pod was still Terminating when the last Create was
    /// answered (modes that collide).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub still_terminating_after: Option<bool>,
}

impl CollisionReport {
    /// Who ran its pods: rows that name no kubelet ran on the simulated one.
    pub fn ran_on(&self) -> &'static str {
        if self.kubelet.is_empty() {
            "simulated"
        } else {
            self.kubelet
        }
    }
}

/// Quota charged for pods that do not exist: `status.used.pods` minus the pods
/// the quota controller would count. Read while the old pod is still
/// Terminating, before anything makes the controller recompute the quota
/// (it does once a pod ends or goes, which hides the leak again).
pub async fn leaked_charges(client: &Client, ns: &str) -> Result<i64> {
    Ok(quota::used_pods(client, ns).await? - quota::counted_pods(client, ns).await?)
}

/// Runs the scenario in `ns` (quota `pods` with `hard` pods, none used):
/// creates [`POD`] (grace 60 s), deletes it gracefully, then issues `creates`
/// colliding Creates while it is Terminating. The pod is left Terminating.
pub async fn graceful_delete_collision(
    bed: &testbed::TestBed,
    ns: &str,
    mode: &str,
    creates: u32,
    hard: u32,
) -> Result<CollisionReport> {
    let client = &bed.client;
    quota::set_pods_quota(bed, ns, hard).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = pods::task_pod(POD, 60);
    let first = pods::create(&api, &pod).await?;
    ensure!(
        first == CreateOutcome::Created,
        "creating {ns}/{POD} failed: {first:?}"
    );
    pods::delete_gracefully(&api, POD, None).await?;
    let stored = api.get(POD).await?;
    ensure!(
        stored.metadata.deletion_timestamp.is_some(),
        "{ns}/{POD} is not Terminating after a graceful delete; is it bound to a node?"
    );

    let mut r = CollisionReport {
        scenario: "graceful-delete-collision",
        mode: mode.into(),
        kube_version: bed.version.as_str(),
        ..Default::default()
    };
    collide(&api, &pod, creates, std::time::Duration::ZERO, &mut r).await?;
    r.still_terminating_after = Some(
        api.get_opt(POD)
            .await?
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
    );
    r.leaked_quota_charges = leaked_charges(client, ns).await?;
    Ok(r)
}

/// A looping executor's laps: `creates` Creates of `pod` while its name is
/// held by a Terminating pod, `every` apart, each answer counted into `r`.
pub async fn collide(
    api: &Api<Pod>,
    pod: &Pod,
    creates: u32,
    every: std::time::Duration,
    r: &mut CollisionReport,
) -> Result<()> {
    for i in 0..creates {
        let out = pods::create(api, pod).await?;
        if i == 0 {
            r.first_answer_code = out.code();
            if let CreateOutcome::Refused { message, .. } = &out {
                r.first_answer = message.clone();
            }
        }
        r.creates += 1;
        r.creates_while_terminating += 1;
        if out.is_already_exists() {
            r.already_exists += 1;
        } else if out.is_forbidden() {
            r.forbidden += 1;
        } else {
            r.other += 1;
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// What the preemption scenario shows an operator.
#[derive(Clone, Debug, Serialize)]
pub struct PreemptionReport {
    pub scenario: &'static str,
    pub mode: &'static str,
    pub kube_version: &'static str,
    pub pod: String,
    /// The `graceguard.io/disruption` label on the stored pod.
    pub disruption_label: Option<String>,
    pub disruption_message: Option<String>,
    /// `kubectl get pods -L graceguard.io/disruption`, as printed.
    pub kubectl_get: String,
    /// The webhook's deletion audit record for the pod.
    pub deletion_audit: serde_json::Value,
}

/// A running pod is marked `DisruptionTarget=True/PreemptionByScheduler` the
/// way kube-scheduler does, then deleted by user `alice` with kubectl
/// (`--grace-period=45`); graceguard tags it once the deletion has begun. Needs the tagger and deletion audit registered and
/// a simulated kubelet running.
pub async fn preemption(
    bed: &testbed::TestBed,
    kubelet: &testbed::kubelet::Kubelet,
    webhook: &testbed::webhook::WebhookProcess,
    ns: &str,
) -> Result<PreemptionReport> {
    use std::time::Duration;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let name = "train-b0-0";
    let out = pods::create(&api, &pods::task_pod(name, 60)).await?;
    ensure!(
        out == CreateOutcome::Created,
        "creating {ns}/{name} failed: {out:?}"
    );
    pods::wait_running(&api, name).await?;
    kubelet
        .mark_disruption_target(
            ns,
            name,
            "PreemptionByScheduler",
            "Preempted by a higher-priority pod on node node-1",
        )
        .await?;
    let (ok, _, err) = bed.kubectl(
        "alice",
        &[
            "delete",
            "pod",
            name,
            "-n",
            ns,
            "--grace-period=45",
            "--wait=false",
        ],
    )?;
    ensure!(ok, "kubectl delete failed: {err}");
    // Tagged once its deletion has begun, never while it ran.
    let pod = pods::wait_label(
        &api,
        name,
        "graceguard.io/disruption",
        "PreemptionByScheduler",
    )
    .await?;
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("graceguard.io/disruption").cloned());
    let message = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("graceguard.io/disruption-message").cloned());
    let (ok, get, err) = bed.kubectl(
        "admin",
        &["get", "pods", "-n", ns, "-L", "graceguard.io/disruption"],
    )?;
    ensure!(ok, "kubectl get pods failed: {err}");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let record = loop {
        if let Some(r) = webhook
            .records_for("deletion_audit", ns, name)?
            .into_iter()
            .next()
        {
            break r;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "no deletion audit record for {ns}/{name}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    Ok(PreemptionReport {
        scenario: "preemption",
        mode: "graceguard",
        kube_version: bed.version.as_str(),
        pod: name.into(),
        disruption_label: label,
        disruption_message: message,
        kubectl_get: get,
        deletion_audit: record,
    })
}

/// How the guard's running attempt is disrupted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disruption {
    /// An admin deletes it gracefully (`kubectl delete pod`).
    GracefulDelete,
    /// kube-scheduler preempts it for a higher-priority pod (1.37): the
    /// attempt asks for 3 of the node's 4 CPUs, so does the intruder.
    Preemption,
}

/// The same disruption, with the task launched by graceguard's guard (as user
/// `alice`): the running attempt is deleted gracefully or preempted, stays
/// Terminating (for `terminating` before the simulated kubelet finishes it, or
/// as long as its container takes on a real node), and the guard recovers.
/// Creates are counted from the apiserver's audit log, so the bed must run
/// with `audit: true`.
pub async fn guard_graceful_delete(
    bed: &testbed::TestBed,
    kubelets: &Kubelets<'_>,
    ns: &str,
    terminating: std::time::Duration,
    how: Disruption,
) -> Result<CollisionReport> {
    use crate::guard_task::{spec, RunningTask};
    use std::time::Duration;
    const MIN: Duration = Duration::from_secs(60);
    quota::set_pods_quota(bed, ns, 100).await?;
    let alice = bed.client_as("alice").await?;
    let cpu = most_of_node_cpu(bed, pods::NODE).await?;
    let (scenario, task_name, mut template) = match how {
        Disruption::GracefulDelete => (
            "graceful-delete-collision",
            "train-a0",
            pods::task_pod("template", 60),
        ),
        Disruption::Preemption => {
            priority_classes(bed).await?;
            (
                "flyte-seed",
                "flyte-a0",
                pods::schedulable_pod("template", 30, LOW, &cpu),
            )
        }
    };
    if let Kubelets::Real {
        image,
        terminate_seconds,
    } = kubelets
    {
        // Runs long enough to be disrupted, then succeeds on its own.
        pods::run_in(
            &mut template,
            image,
            &pods::finite_task_script(30, *terminate_seconds),
        );
    }
    let mut task = RunningTask::start(alice.clone(), spec(task_name, ns), template);
    let first = task
        .wait_for(MIN, |t| t.phase == "Running" && t.attempt == 0)
        .await?;
    let audit = bed.audit_log()?;
    let creates = |audit: &testbed::audit_log::AuditLog| -> Result<Vec<u16>> {
        Ok(audit
            .events()?
            .into_iter()
            .filter(|e| e.is("create", "pods", ns) && e.user.username == "alice")
            .map(|e| e.response_status.map_or(0, |s| s.code))
            .collect())
    };
    let before_creates = creates(&audit)?.len();

    let api: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let first_uid = kube::ResourceExt::uid(&api.get(&first.pod).await?).unwrap_or_default();
    match how {
        Disruption::GracefulDelete => pods::delete_gracefully(&api, &first.pod, None).await?,
        Disruption::Preemption => {
            let intruder = kubelets.schedulable_pod(INTRUDER, 0, HIGH, &cpu);
            let out = pods::create(&api, &intruder).await?;
            ensure!(
                out == CreateOutcome::Created,
                "creating the intruder: {out:?}"
            );
        }
    }
    task.wait_for(MIN, |t| t.phase == "ShuttingDown").await?;
    tokio::time::sleep(terminating).await;
    let while_terminating = creates(&audit)?.len() - before_creates;
    let leaked = leaked_charges(&bed.client, ns).await?;
    kubelets.finish(&api, ns, &first.pod, &first_uid).await?;
    if how == Disruption::Preemption {
        // The intruder is done; the next attempt fits on the node again.
        pods::delete_gracefully(&api, INTRUDER, Some(0)).await?;
    }
    let next = task
        .wait_for(MIN, |t| t.phase == "Running" && t.attempt == 1)
        .await?;
    if let Kubelets::Simulated(kubelet) = kubelets {
        kubelet
            .end_pod(ns, &next.pod, testbed::kubelet::Terminal::Succeeded)
            .await?;
    }
    let (outcome, _) = task.finish(Duration::from_secs(120)).await?;
    ensure!(
        outcome.succeeded,
        "the guarded task did not succeed: {outcome:?}"
    );

    let after: Vec<u16> = creates(&audit)?.split_off(before_creates);
    Ok(CollisionReport {
        scenario,
        mode: "guard".into(),
        kube_version: bed.version.as_str(),
        creates: after.len() as u32,
        already_exists: after.iter().filter(|c| **c == 409).count() as u32,
        forbidden: after.iter().filter(|c| **c == 403).count() as u32,
        other: after
            .iter()
            .filter(|c| !matches!(**c, 201 | 409 | 403))
            .count() as u32,
        leaked_quota_charges: leaked,
        creates_while_terminating: while_terminating as u32,
        attempts_burned: Some(outcome.user_failures),
        kubelet: kubelets.name(),
        still_terminating_after: None,
        first_answer_code: after.first().copied().unwrap_or(0),
        first_answer: format!(
            "{} created after {} was gone; task succeeded",
            next.pod, first.pod
        ),
        audit_record: None,
    })
}

/// What the PVC row of the demo shows: a claim held Terminating by
/// `kubernetes.io/pvc-protection` (a pod still uses it), re-created `creates`
/// times (kubernetes/kubernetes#119593).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct PvcReport {
    pub scenario: &'static str,
    pub mode: String,
    pub kube_version: &'static str,
    pub creates: u32,
    pub already_exists: u32,
    /// Growth of the quota's `status.used.persistentvolumeclaims` and
    /// `requests.storage` (in Gi) over the colliding Creates.
    pub leaked_pvcs: i64,
    pub leaked_storage_gi: i64,
}

/// Runs the PVC scenario in `ns` under quota `storage` (10 claims, 20Gi): a
/// 1Gi claim used by a pod is deleted, then created again `creates` times.
pub async fn pvc_collision(
    bed: &testbed::TestBed,
    ns: &str,
    mode: &str,
    creates: u32,
) -> Result<PvcReport> {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use kube::api::{DeleteParams, PostParams};
    quota::set_named_quota(
        bed,
        ns,
        "storage",
        &[
            ("persistentvolumeclaims", "10"),
            ("requests.storage", "20Gi"),
        ],
    )
    .await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(bed.client.clone(), ns);
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))?;
    claims.create(&PostParams::default(), &claim).await?;
    let mut user = pods::task_pod("data-user", 30);
    if let Some(spec) = user.spec.as_mut() {
        spec.volumes = Some(vec![serde_json::from_value(
            serde_json::json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}}),
        )?]);
    }
    let out = pods::create(&Api::namespaced(bed.client.clone(), ns), &user).await?;
    ensure!(
        out == CreateOutcome::Created,
        "creating the claim's user: {out:?}"
    );
    claims.delete("data", &DeleteParams::default()).await?;
    let held = claims.get("data").await?;
    ensure!(
        held.metadata.deletion_timestamp.is_some(),
        "{ns}/data is not Terminating after its delete; is pvc-protection on?"
    );
    let used = |r: &'static str| quota::used(&bed.client, ns, "storage", r);
    let gi = |q: String| -> Result<i64> {
        q.trim_end_matches("Gi")
            .parse()
            .with_context(|| format!("requests.storage {q:?} is not in Gi"))
    };
    let (pvcs0, storage0) = (
        used("persistentvolumeclaims").await?,
        gi(used("requests.storage").await?)?,
    );
    let mut r = PvcReport {
        scenario: "pvc-collision",
        mode: mode.into(),
        kube_version: bed.version.as_str(),
        ..Default::default()
    };
    for _ in 0..creates {
        let out = match claims.create(&PostParams::default(), &claim).await {
            Ok(_) => 201,
            Err(kube::Error::Api(s)) if s.reason == "AlreadyExists" => 409,
            Err(e) => return Err(e).context("re-creating PVC data"),
        };
        r.creates += 1;
        r.already_exists += u32::from(out == 409);
    }
    r.leaked_pvcs = used("persistentvolumeclaims").await?.parse::<i64>()? - pvcs0.parse::<i64>()?;
    r.leaked_storage_gi = gi(used("requests.storage").await?)? - storage0;
    Ok(r)
}

/// flyteorg/flyte#8066 with a real preemption: a naive executor runs task pod
/// `flyte-a0-0` (low priority, three quarters of the node's CPU); kube-scheduler
/// preempts it for a high-priority pod; while it is Terminating, the executor
/// reads it as an unexpected deletion and re-creates the same name `laps`
/// times, every 80 ms (Flyte loops at about 12 Hz). The leak is read from the
/// real quota controller's status. `mode` names the run (`bare`, or
/// `graceguard` with the collision guard registered). Afterwards the preempted
/// pod is finished (or waited out, on real nodes) and the intruder removed, so
/// the node is free again.
pub async fn flyte_seed_naive(
    bed: &TestBed,
    kubelets: &Kubelets<'_>,
    ns: &str,
    mode: &str,
    laps: u32,
) -> Result<CollisionReport> {
    priority_classes(bed).await?;
    testbed::quota::set_pods_quota(bed, ns, 10).await?;
    let cpu = most_of_node_cpu(bed, pods::NODE).await?;
    let executor: Api<Pod> = Api::namespaced(bed.client_as("alice").await?, ns);
    let pod = kubelets.schedulable_pod("flyte-a0-0", 30, LOW, &cpu);
    let out = pods::create(&executor, &pod).await?;
    ensure!(
        out == CreateOutcome::Created,
        "creating flyte-a0-0: {out:?}"
    );
    pods::wait_running(&executor, "flyte-a0-0").await?;
    let uid = executor.get("flyte-a0-0").await?.uid().unwrap_or_default();
    let intruder = kubelets.schedulable_pod(INTRUDER, 0, HIGH, &cpu);
    let out = pods::create(&executor, &intruder).await?;
    ensure!(
        out == CreateOutcome::Created,
        "creating the intruder: {out:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while executor
        .get("flyte-a0-0")
        .await?
        .metadata
        .deletion_timestamp
        .is_none()
    {
        ensure!(
            Instant::now() < deadline,
            "kube-scheduler did not preempt flyte-a0-0 within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut r = CollisionReport {
        scenario: "flyte-seed",
        mode: mode.into(),
        kube_version: bed.version.as_str(),
        kubelet: kubelets.name(),
        ..Default::default()
    };
    collide(&executor, &pod, laps, Duration::from_millis(80), &mut r).await?;
    r.still_terminating_after = Some(
        executor
            .get_opt("flyte-a0-0")
            .await?
            .is_some_and(|p| p.uid().as_deref() == Some(uid.as_str())),
    );
    r.leaked_quota_charges = leaked_charges(&bed.client, ns).await?;
    kubelets.finish(&executor, ns, "flyte-a0-0", &uid).await?;
    pods::delete_gracefully(&executor, INTRUDER, Some(0)).await?;
    Ok(r)
}
