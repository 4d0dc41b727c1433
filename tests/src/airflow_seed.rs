//! The Airflow seed (apache/airflow#68683) side by side: completed pods of a
//! dead executor instance, adopted by a naive loop that never drains its
//! adopted set (every sync PATCHes every pod it ever adopted) and by
//! graceguard's adopter (a claim and a done-mark per pod). PATCHes are read
//! from the API server's audit log.

use std::time::Duration;

use anyhow::Result;
use graceguard::core::naming::INSTANCE_LABEL;
use graceguard::runtime::adoption::{Adopter, Found};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde::Serialize;

use crate::guard_task::managed_pod;
use testbed::control_plane::TestBed;
use testbed::kubelet::{Kubelet, Terminal};

const DEAD: &str = "dead-scheduler";

/// One side's figures.
#[derive(Debug, Serialize)]
pub struct AirflowReport {
    pub scenario: &'static str,
    /// `naive` or `guard`.
    pub mode: &'static str,
    pub kube_version: &'static str,
    pub completed_pods: usize,
    pub syncs: usize,
    /// The adopter's pod PATCHes (audit log).
    pub patches: usize,
    pub patches_per_pod: f64,
    /// Results handed to the caller, and how many distinct.
    pub delivered: usize,
    pub delivered_distinct: usize,
}

/// `pods` pods of a dead instance complete, `pods / syncs` between syncs;
/// the `mode` adopter (as `alice`) syncs after each batch.
pub async fn airflow_seed(
    bed: &TestBed,
    kubelet: &Kubelet,
    ns: &str,
    mode: &'static str,
    pods: usize,
    syncs: usize,
) -> Result<AirflowReport> {
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    crate::guard_task::instance_lease(bed, ns, DEAD, crate::guard_task::DEAD).await?;
    for i in 0..pods {
        let name = format!("task-{i}-0");
        api.create(&PostParams::default(), &managed_pod(&name, DEAD))
            .await?;
    }
    let alice = bed.client_as("alice").await?;
    let per_sync = pods.div_ceil(syncs.max(1));
    let mut delivered: Vec<String> = Vec::new();
    let mut adopter = (mode == "guard").then(|| Adopter::new(alice.clone(), ns, ns, "scheduler-2"));
    let mut adopted_set: Vec<String> = Vec::new();
    let alice_pods: Api<Pod> = Api::namespaced(alice, ns);
    let mut ended = 0;
    for _ in 0..syncs {
        for _ in 0..per_sync {
            if ended < pods {
                kubelet
                    .end_pod(ns, &format!("task-{ended}-0"), Terminal::Succeeded)
                    .await?;
                ended += 1;
            }
        }
        match adopter.as_mut() {
            Some(a) => {
                // Let the watch see this batch before the sync.
                tokio::time::sleep(Duration::from_millis(100)).await;
                for f in a.sync(Duration::from_millis(500)).await? {
                    if let Found::Completed(p) = f {
                        a.ack(&p).await;
                        delivered.push(p.name);
                    }
                }
            }
            None => {
                // apache/airflow#68683: completed pods are added to the
                // adopted set, which is never drained; every sync patches
                // every pod in it again.
                let list = alice_pods
                    .list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={DEAD}")))
                    .await?;
                for p in list.items {
                    let done =
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded");
                    let name = p.name_any();
                    if done && !adopted_set.contains(&name) {
                        adopted_set.push(name.clone());
                        delivered.push(name);
                    }
                }
                for name in &adopted_set {
                    let patch = serde_json::json!({"metadata": {"labels": {"airflow-worker": "scheduler-2"}}});
                    alice_pods
                        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                }
            }
        }
    }
    // The guard's last results may still be on their way through the watch.
    // Bounded by time, not by syncs: a sync returns at the first event, and
    // on a busy machine the done-marks' own events can use up any count.
    if let Some(a) = adopter.as_mut() {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while delivered.len() < pods && tokio::time::Instant::now() < deadline {
            for f in a.sync(Duration::from_millis(500)).await? {
                if let Found::Completed(p) = f {
                    a.ack(&p).await;
                    delivered.push(p.name);
                }
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let patches = bed.audit_log()?.count(|e| {
        e.verb == "patch"
            && e.user.username == "alice"
            && e.object_ref
                .as_ref()
                .is_some_and(|o| o.resource == "pods" && o.namespace == ns)
    })?;
    let mut distinct = delivered.clone();
    distinct.sort();
    distinct.dedup();
    Ok(AirflowReport {
        scenario: "airflow-seed",
        mode,
        kube_version: bed.version.as_str(),
        completed_pods: pods,
        syncs,
        patches,
        patches_per_pod: (patches as f64 / pods as f64 * 100.0).round() / 100.0,
        delivered: delivered.len(),
        delivered_distinct: distinct.len(),
    })
}
