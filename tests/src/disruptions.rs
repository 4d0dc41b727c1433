//! Disruptions only real components produce (Kubernetes 1.37): kube-scheduler
//! preempting a pod, and `kubectl drain` evicting a node's pods through the
//! Eviction API. `scripts/demo` prints these reports and the end-to-end tests
//! assert on them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use testbed::containers::PodRecorder;
use testbed::kubelet::{FinishDeletions, Kubelet, KubeletOptions};
use testbed::pods::{self, CreateOutcome};
use testbed::webhook::WebhookProcess;
use testbed::TestBed;

/// The label the tagger writes.
pub const LABEL: &str = "graceguard.io/disruption";

/// PriorityClasses for preemption: victims run at [`LOW`], preemptors at [`HIGH`].
pub const LOW: &str = "graceguard-test-low";
pub const HIGH: &str = "graceguard-test-high";

/// How long the `i`-th disrupted pod of a bench runs before it is preempted
/// or evicted: 2 s and a fraction of a second that differs from one to the
/// next.
/// * 2 s: the kubelet's passes after a pod's start run on for up to a
///   second, and a deletion that finds one queued waits for it and then
///   for a PLEG relist after it ([`testbed::node::kubelet_log`]): up to 1 s
///   more in every phase alike, which decided the benches' slowest
///   preemptions. A cluster's victims have mostly run for long.
/// * the fraction (0–1 s, evenly spread over any run of `i`s): the
///   kubelet relists every second, and a schedule at a fixed offset from a
///   pod's start (itself set by a relist) meets the relist at the same
///   point every time, so a path a few milliseconds longer can cross one
///   and wait up to a second more every time. Spread, every phase meets
///   every point of the relist alike, as pods deleted at any moment do.
pub fn victim_settle(i: usize) -> std::time::Duration {
    // The golden ratio's fractional parts: evenly spread, never repeating.
    let spread = (i as f64 * 0.618_033_988_749_895).fract();
    std::time::Duration::from_secs(2) + std::time::Duration::from_secs_f64(spread)
}

/// Creates [`LOW`] and [`HIGH`] unless they exist (cluster-scoped: once per bed).
pub async fn priority_classes(bed: &TestBed) -> Result<()> {
    let api: Api<PriorityClass> = Api::all(bed.client.clone());
    for (name, value) in [(LOW, 100), (HIGH, 1_000_000)] {
        if api.get_opt(name).await?.is_some() {
            continue;
        }
        let pc = PriorityClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            value,
            preemption_policy: Some("PreemptLowerPriority".into()),
            ..Default::default()
        };
        api.create(&PostParams::default(), &pc)
            .await
            .with_context(|| format!("creating PriorityClass {name}"))?;
    }
    Ok(())
}

/// The `graceguard.io/disruption` label of every pod of a namespace, as last
/// seen by a watch: a pod's tag stays known after the pod is gone.
pub struct LabelWatch(PodRecorder<HashMap<String, String>>);

impl LabelWatch {
    pub fn start(client: Client, ns: &str) -> Self {
        Self(PodRecorder::start(
            client,
            ns,
            |m: &mut HashMap<String, String>, pod| {
                if let Some(v) = pods::disruption_label(pod) {
                    m.insert(pod.name_any(), v.to_string());
                }
            },
        ))
    }

    /// The label last seen on pod `name`.
    pub fn label(&self, name: &str) -> Option<String> {
        self.0.read(|m| m.get(name).cloned()).flatten()
    }
}

/// What the scheduler-preemption scenario shows.
#[derive(Clone, Debug, Serialize)]
pub struct SchedulerPreemptionReport {
    pub scenario: &'static str,
    pub kube_version: &'static str,
    pub victim: String,
    pub preemptor: String,
    /// The victim carried `graceguard.io/disruption=PreemptionByScheduler`.
    pub tagged: bool,
    pub disruption_label: Option<String>,
    /// The webhook's deletion audit records for the victim while it was
    /// running (the scheduler's delete; the kubelet's final delete of the
    /// terminating pod is not counted).
    pub delete_audit_records: usize,
    /// Who deleted the victim, by the audit record.
    pub deleted_by: String,
    /// The node the preemptor ended up Running on.
    pub preemptor_node: Option<String>,
}

/// kube-scheduler preempts a running low-priority pod for a high-priority one
/// on a full node. Needs the tagger and deletion audit registered; the
/// victim's node is [`testbed::pods::NODE`], run by `kubelet`.
pub async fn scheduler_preemption(
    bed: &TestBed,
    webhook: &WebhookProcess,
    kubelet: &Kubelet,
    ns: &str,
) -> Result<SchedulerPreemptionReport> {
    priority_classes(bed).await?;
    let alice: Api<Pod> = Api::namespaced(bed.client_as("alice").await?, ns);
    let watch = LabelWatch::start(bed.client.clone(), ns);
    // The node has 4 CPUs: 3 for the victim leave no room for the preemptor's 3.
    let out = pods::create(&alice, &pods::schedulable_pod("victim", 30, LOW, "3")).await?;
    ensure!(
        out == CreateOutcome::Created,
        "creating the victim: {out:?}"
    );
    pods::wait_running(&alice, "victim").await?;
    let victim_uid = alice.get("victim").await?.uid().unwrap_or_default();
    let out = pods::create(&alice, &pods::schedulable_pod("preemptor", 30, HIGH, "3")).await?;
    ensure!(
        out == CreateOutcome::Created,
        "creating the preemptor: {out:?}"
    );

    // The scheduler writes DisruptionTarget, then deletes the victim gracefully.
    let deadline = Instant::now() + Duration::from_secs(60);
    let victim = loop {
        let p = alice.get("victim").await?;
        if p.metadata.deletion_timestamp.is_some() {
            break p;
        }
        ensure!(
            Instant::now() < deadline,
            "kube-scheduler did not preempt the victim within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let label = pods::disruption_label(&victim).map(str::to_string);
    let records = webhook
        .wait_records("deletion_audit", ns, "victim", 1)
        .await?;
    let by_scheduler: Vec<_> = records
        .iter()
        .filter(|r| r["already_terminating"] == false)
        .collect();
    let deleted_by = by_scheduler
        .first()
        .and_then(|r| r["user"].as_str())
        .unwrap_or_default()
        .to_string();
    // graceguard tags the victim once its deletion has begun (never while
    // it ran); a real kubelet takes a PLEG relist (about 1 s) at least to
    // finish it, this one waits for the tag (or the wait's end) instead.
    let label = match label {
        Some(l) => Some(l),
        None => pods::wait_label(&alice, "victim", LABEL, "PreemptionByScheduler")
            .await
            .ok()
            .and_then(|p| pods::disruption_label(&p).map(str::to_string)),
    };
    // The kubelet finishes the victim; the preemptor takes its place.
    kubelet.finish_deletion(ns, "victim").await?;
    pods::wait_gone(&alice, "victim", &victim_uid).await?;
    pods::wait_running(&alice, "preemptor").await?;
    let preemptor_node = alice.get("preemptor").await?.spec.and_then(|s| s.node_name);
    let label = label.or_else(|| watch.label("victim"));
    // Free the node for whatever runs next.
    pods::delete_gracefully(&alice, "preemptor", Some(0)).await?;
    Ok(SchedulerPreemptionReport {
        scenario: "scheduler-preemption",
        kube_version: bed.version.as_str(),
        victim: "victim".into(),
        preemptor: "preemptor".into(),
        tagged: label.as_deref() == Some("PreemptionByScheduler"),
        disruption_label: label,
        delete_audit_records: by_scheduler.len(),
        deleted_by,
        preemptor_node,
    })
}

/// What the drain scenario shows.
#[derive(Clone, Debug, Serialize)]
pub struct DrainReport {
    pub scenario: &'static str,
    pub kube_version: &'static str,
    pub node: String,
    pub pods: usize,
    /// Pods seen with `graceguard.io/disruption=EvictionByEvictionAPI`.
    pub tagged: usize,
    /// Eviction attempts recorded at admission.
    pub eviction_audit_records: usize,
    /// Pods with exactly one attempt, and its outcome `evicted`.
    pub audited_once: usize,
    /// `kubectl drain` exited 0.
    pub drain_completed: bool,
    pub drain_seconds: f64,
}

/// `kubectl drain` of a node running `n` task pods (real Eviction API, real
/// kubectl 1.37). The node's kubelet finishes each deletion after a fifth of
/// its 30 s grace. Needs the eviction audit registered (and the tagger's
/// follow-up on, which is the default).
pub async fn drain(
    bed: &TestBed,
    webhook: &WebhookProcess,
    ns: &str,
    n: usize,
) -> Result<DrainReport> {
    const NODE: &str = "node-2";
    bed.register_node(NODE).await?;
    let _kubelet = Kubelet::start(
        bed,
        KubeletOptions {
            node: NODE.into(),
            finish_deletions: FinishDeletions::AfterShareOfGrace(0.2),
            ..Default::default()
        },
    )
    .await?;
    let pods: Vec<Pod> = (0..n)
        .map(|i| pods::task_pod_on(&format!("drained-{i}"), 30, Some(NODE)))
        .collect();
    drain_node(bed, webhook, ns, NODE, &pods).await
}

/// `kubectl drain NODE` while `pods` (bound to it) run; whichever kubelet
/// serves the node finishes their deletions.
pub async fn drain_node(
    bed: &TestBed,
    webhook: &WebhookProcess,
    ns: &str,
    node: &str,
    pods: &[Pod],
) -> Result<DrainReport> {
    let watch = LabelWatch::start(bed.client.clone(), ns);
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    for pod in pods {
        let out = pods::create(&api, pod).await?;
        ensure!(
            out == CreateOutcome::Created,
            "creating {}: {out:?}",
            pod.name_any()
        );
    }
    for name in &names {
        pods::wait_running(&api, name).await?;
    }
    let started = Instant::now();
    let (ok, _, err) = bed.kubectl(
        "admin",
        &[
            "drain",
            node,
            "--force",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=120s",
        ],
    )?;
    let drain_seconds = started.elapsed().as_secs_f64();
    if !ok {
        eprintln!("kubectl drain {node} failed: {err}");
    }
    let mut eviction_audit_records = 0;
    let mut audited_once = 0;
    for name in &names {
        // The attempt is recorded at admission, its outcome once the pod
        // watch saw the deletion begin.
        webhook
            .wait_record(|r| {
                r["event"] == "eviction_outcome"
                    && r["name"] == name.as_str()
                    && r["reason"] == "evicted"
            })
            .await?;
        let recs = webhook.records_for("eviction_audit", ns, name)?;
        let attempts = recs
            .iter()
            .filter(|r| r["event"] == "admission" && r["dry_run"] == false)
            .count();
        let evicted = recs
            .iter()
            .filter(|r| r["event"] == "eviction_outcome" && r["reason"] == "evicted")
            .count();
        eviction_audit_records += attempts;
        audited_once += usize::from(attempts == 1 && evicted == 1);
    }
    let tagged = names
        .iter()
        .filter(|name| watch.label(name).as_deref() == Some("EvictionByEvictionAPI"))
        .count();
    Ok(DrainReport {
        scenario: "drain",
        kube_version: bed.version.as_str(),
        node: node.into(),
        pods: names.len(),
        tagged,
        eviction_audit_records,
        audited_once,
        drain_completed: ok,
        drain_seconds,
    })
}

/// Who finishes the graceful deletions of a scenario's pods.
pub enum Kubelets<'a> {
    /// The simulated kubelet, when the scenario says so.
    Simulated(&'a Kubelet),
    /// The bed's real kubelets: pods run the task image, trap SIGTERM and
    /// exit 143 (as SIGTERM would end them) `terminate_seconds` after it, so
    /// they stay Terminating that long.
    Real {
        image: &'a str,
        terminate_seconds: u32,
    },
}

impl Kubelets<'_> {
    /// `real` or `simulated`, as reports name it.
    pub fn name(&self) -> &'static str {
        match self {
            Kubelets::Simulated(_) => "simulated",
            Kubelets::Real { .. } => "real",
        }
    }

    /// A pod for kube-scheduler to place, taking `cpu` of the node.
    pub fn schedulable_pod(&self, name: &str, grace: i64, priority_class: &str, cpu: &str) -> Pod {
        let mut pod = pods::schedulable_pod(name, grace, priority_class, cpu);
        if let Kubelets::Real {
            image,
            terminate_seconds,
        } = self
        {
            pods::run_in(
                &mut pod,
                image,
                &pods::graceful_script(*terminate_seconds, 143),
            );
        }
        pod
    }

    /// Finishes (simulated) or waits out (real) the deletion of `name`.
    pub async fn finish(&self, api: &Api<Pod>, ns: &str, name: &str, uid: &str) -> Result<()> {
        if let Kubelets::Simulated(k) = self {
            k.finish_deletion(ns, name).await?;
        }
        pods::wait_gone(api, name, uid).await
    }
}

/// Three quarters of `node`'s allocatable CPU, in millicores: two such pods
/// never fit on it, so a second one at a higher priority preempts the first.
pub async fn most_of_node_cpu(bed: &TestBed, node: &str) -> Result<String> {
    Ok(format!("{}m", node_cpu_milli(bed, node).await? * 3 / 4))
}

/// `node`'s allocatable CPU, in millicores.
pub async fn node_cpu_milli(bed: &TestBed, node: &str) -> Result<u64> {
    let n = Api::<k8s_openapi::api::core::v1::Node>::all(bed.client.clone())
        .get(node)
        .await
        .with_context(|| format!("reading Node {node}"))?;
    let cpu = n
        .status
        .and_then(|s| s.allocatable)
        .and_then(|a| a.get("cpu").cloned())
        .with_context(|| format!("Node {node} reports no allocatable CPU"))?;
    Ok(match cpu.0.strip_suffix('m') {
        Some(m) => m.parse::<u64>()?,
        None => cpu.0.parse::<u64>()? * 1000,
    })
}

#[cfg(test)]
mod tests {
    use super::victim_settle;
    use std::time::Duration;

    #[test]
    fn settles_are_two_to_three_seconds_and_spread_over_every_tenth() {
        let s: Vec<Duration> = (0..36).map(victim_settle).collect();
        assert!(s
            .iter()
            .all(|d| *d >= Duration::from_secs(2) && *d < Duration::from_secs(3)));
        for tenth in 0..10 {
            let (lo, hi) = (2.0 + f64::from(tenth) / 10.0, 2.1 + f64::from(tenth) / 10.0);
            assert!(
                s.iter().any(|d| (lo..hi).contains(&d.as_secs_f64())),
                "no settle in [{lo}, {hi}) s: {s:?}"
            );
        }
    }
}
