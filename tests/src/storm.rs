//! The storm scenario: the client-go executor (`testbed::executor`, a model of
//! Flyte's v2 pod plugin) runs its tasks once per mode, each mode in a
//! namespace whose `graceguard.io/mode` label picks it, on a bed with a real
//! node and graceguard's collision guard registered; every task's pod is then
//! deleted gracefully at once, the executor launches its unrelated tasks 3 s
//! after the first sight of that, and its requests are counted until every task
//! runs again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::PostParams;
use kube::Api;
use serde::Serialize;

use graceguard_webhook::collision::CLIENT_GO_MAX_RETRIES;

use crate::disruptions;
use testbed::executor::{Executor, ExecutorReport, Load};
use testbed::webhook::{Hook, WebhookProcess};
use testbed::{pods, quota, TestBed, TestBedOptions};

/// The modes compared, in the order they are reported.
pub const MODES: [&str; 3] = ["conflict", "retry", "adaptive"];

/// The most Create requests mode `adaptive` (default settings) takes to
/// relaunch a task whose holder is gone within one client-go call of 429s:
/// the first two answers 409 (each one lap of the executor's loop), then at
/// most [`CLIENT_GO_MAX_RETRIES`] 429s retried inside one call, then the 201.
/// How many 429s there are depends on how long the holder outlives its
/// grace (a loaded node deletes it later), so this is the bound to assert,
/// not today's usual count (two 409s, six 429s, the 201).
pub const ADAPTIVE_RELAUNCH_MAX: u64 = 2 + CLIENT_GO_MAX_RETRIES as u64 + 1;

/// One mode's figures.
#[derive(Clone, Debug, Serialize)]
pub struct StormRow {
    pub scenario: &'static str,
    pub kube_version: &'static str,
    pub mode: &'static str,
    /// Pods the namespace's quota counts once the task runs again.
    pub quota_used: i64,
    /// Pod Creates the executor sent (each of client-go's retries counts),
    /// the first, which made the task's first pod, included.
    pub pod_creates_sent: u64,
    /// Create requests from the disruption to the Create that made the
    /// successor pod, that one included.
    pub relaunch_pod_creates: u64,
    /// Every request, by "VERB resource code".
    pub requests: BTreeMap<String, u64>,
    /// The most system failures in a row (Flyte fails a task past 3).
    pub system_failures_charged: u64,
    /// Every system failure counted (each a status write and an event).
    pub system_failures_recorded: u64,
    pub attempts: u64,
    pub running_again_after_ms: Option<u64>,
    /// From each disrupted task's old pod gone to its successor's Create
    /// returning: the median and the slowest over the tasks (negative when
    /// the Create beat the informer's deletion event).
    pub relaunched_after_gone_ms_median: Option<i64>,
    pub relaunched_after_gone_ms_max: Option<i64>,
    pub longest_create_call_ms: u64,
    pub grace_seconds: u32,
    /// Tasks disrupted at once, unrelated tasks launched 3 s later, workers.
    pub load: Load,
    /// The unrelated tasks: the slowest and the median from launch to their
    /// Create returning 201 (what blocked workers would delay), and the
    /// slowest to Running.
    pub unrelated_created_ms_max: Option<u64>,
    pub unrelated_created_ms_median: Option<u64>,
    pub unrelated_running_ms_max: Option<u64>,
    #[serde(skip)]
    pub report: ExecutorReport,
}

/// A namespace whose `graceguard.io/mode` label picks the mode, with a pods
/// quota of 10 per task (old and new pod of each, with room to spare), once
/// its default ServiceAccount exists.
async fn namespace(bed: &TestBed, prefix: &str, mode: &str, load: Load) -> Result<String> {
    let name = format!("{prefix}-{mode}");
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"graceguard.io/mode": mode}},
    }))?;
    Api::<Namespace>::all(bed.client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let sas: Api<ServiceAccount> = Api::namespaced(bed.client.clone(), &name);
    let deadline = Instant::now() + Duration::from_secs(60);
    while sas.get_opt("default").await?.is_none() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "no default ServiceAccount in {name} after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    quota::set_pods_quota(bed, &name, 10 * (load.tasks + load.unrelated)).await?;
    Ok(name)
}

/// A bed with one real node and graceguard's collision guard registered,
/// started with `args` (each namespace's `graceguard.io/mode` label then
/// picks its own mode; the webhook watches namespaces for it).
pub async fn bed_with_guard(args: &[&str]) -> Result<(TestBed, WebhookProcess)> {
    let bed = TestBed::start_with(TestBedOptions {
        real_nodes: 1,
        ..Default::default()
    })
    .await?;
    let webhook = WebhookProcess::start(&bed, args).await?;
    webhook.register(&bed, &[Hook::CollisionGuard]).await?;
    Ok((bed, webhook))
}

/// The codes graceguard answered Creates of `ns/name` with while its holder
/// terminated, in order.
pub fn terminating_codes(webhook: &WebhookProcess, ns: &str, name: &str) -> Result<Vec<i64>> {
    Ok(webhook
        .records_for("collision_guard", ns, name)?
        .iter()
        .filter(|r| r["reason"] == "terminating")
        .filter_map(|r| r["code"].as_i64())
        .collect())
}

/// Waits until kube-scheduler has preempted `ns/name`: deleting, with
/// DisruptionTarget reason PreemptionByScheduler.
async fn preempted(bed: &TestBed, ns: &str, name: &str) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let by_scheduler = kube::runtime::wait::await_condition(api, name, |p: Option<&Pod>| {
        p.is_some_and(|p| {
            p.metadata.deletion_timestamp.is_some()
                && p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c.type_ == "DisruptionTarget"
                                && c.reason.as_deref() == Some("PreemptionByScheduler")
                        })
                    })
        })
    });
    match tokio::time::timeout(Duration::from_secs(60), by_scheduler).await {
        Ok(r) => r
            .map(|_| ())
            .with_context(|| format!("watching {ns}/{name}")),
        Err(_) => anyhow::bail!("kube-scheduler did not preempt {ns}/{name} within 60 s"),
    }
}

/// kube-scheduler preempts every task pod of `namespaces` (`tasks` each) for
/// one high-priority pod asking for `node_cpu`, which runs 2 s and ends; it
/// is deleted then, which requeues the pending new task pods in the
/// scheduler at once.
async fn preempt_all(
    bed: &TestBed,
    prefix: &str,
    image: &str,
    node_cpu: &str,
    namespaces: &[&str],
    tasks: u32,
) -> Result<()> {
    let ns = bed.namespace(&format!("{prefix}-preemptor")).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let mut p = pods::schedulable_pod("preemptor", 1, disruptions::HIGH, node_cpu);
    pods::run_in(&mut p, image, "sleep 2");
    api.create(&PostParams::default(), &p).await?;
    for victim_ns in namespaces {
        for k in 0..tasks {
            preempted(bed, victim_ns, &format!("task-{k}")).await?;
        }
    }
    tokio::spawn(async move {
        let ended =
            kube::runtime::wait::await_condition(api.clone(), "preemptor", |p: Option<&Pod>| {
                matches!(
                    p.and_then(|p| p.status.as_ref()?.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
            });
        let _ = tokio::time::timeout(Duration::from_secs(120), ended).await;
        let _ = api
            .delete("preemptor", &kube::api::DeleteParams::default())
            .await;
    });
    Ok(())
}

/// The slowest and the median of `v`, if any.
fn max_and_median<T: Ord + Copy>(mut v: Vec<T>) -> (Option<T>, Option<T>) {
    v.sort_unstable();
    (v.last().copied(), v.get(v.len() / 2).copied())
}

/// Runs the three modes at once (namespaces `<prefix>-<mode>`), one task
/// each; each task pod has `grace` seconds of grace, which the task takes
/// in full.
pub async fn run(bed: &TestBed, prefix: &str, grace: u32) -> Result<Vec<StormRow>> {
    run_with(bed, prefix, grace, Load::default(), &MODES).await
}

/// [`run`] with `load` (its tasks disrupted at once, its unrelated tasks
/// launched 3 s later), for `modes`.
pub async fn run_with(
    bed: &TestBed,
    prefix: &str,
    grace: u32,
    load: Load,
    modes: &[&'static str],
) -> Result<Vec<StormRow>> {
    let image = bed.task_image()?;
    // For a preemption: the task pods, low priority, share three quarters of
    // the node's CPU; the preemptor asks for all of it, so every one goes.
    let (node_cpu, mut extra) = match load.preempt {
        false => (String::new(), Vec::new()),
        true => {
            disruptions::priority_classes(bed).await?;
            let milli = disruptions::node_cpu_milli(bed, pods::NODE).await?;
            let pods_at_once = u64::try_from(modes.len())? * u64::from(load.tasks + load.unrelated);
            let each = milli * 3 / 4 / pods_at_once.max(1);
            (
                format!("{milli}m"),
                vec![
                    format!("--cpu-request={each}m"),
                    format!("--priority-class={}", disruptions::LOW),
                ],
            )
        }
    };
    if let Some(s) = load.stop_after {
        extra.push(format!("--stop-after={s}"));
    }
    let mut runs = Vec::new();
    for &mode in modes {
        let ns = namespace(bed, prefix, mode, load).await?;
        let ex = Executor::start(
            bed,
            &ns,
            load,
            &image,
            grace,
            Duration::from_secs(150),
            &extra,
        )?;
        runs.push((mode, ns, ex));
    }
    for (_, _, ex) in &mut runs {
        ex.wait_running(Duration::from_secs(120)).await?;
    }
    if load.preempt {
        let namespaces: Vec<&str> = runs.iter().map(|(_, ns, _)| ns.as_str()).collect();
        preempt_all(bed, prefix, &image, &node_cpu, &namespaces, load.tasks).await?;
    } else {
        for (_, ns, _) in &runs {
            let api: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
            for k in 0..load.tasks {
                pods::delete_gracefully(&api, &format!("task-{k}"), None).await?;
            }
        }
    }
    let mut rows = Vec::new();
    for (mode, ns, ex) in runs {
        let r = ex.finish().await?;
        quota::recalculate(bed, &ns).await?;
        let (created_max, created_median) = max_and_median(
            r.unrelated
                .iter()
                .filter_map(|t| t.created_after_ms)
                .collect(),
        );
        let (running_max, _) = max_and_median(
            r.unrelated
                .iter()
                .filter_map(|t| t.running_after_ms)
                .collect(),
        );
        let (gone_max, gone_median) = max_and_median(
            r.tasks
                .iter()
                .filter_map(|t| t.relaunched_after_gone_ms)
                .collect(),
        );
        rows.push(StormRow {
            scenario: "flyte-seed-client-go",
            kube_version: bed.version.as_str(),
            mode,
            quota_used: quota::used_pods(&bed.client, &ns).await?,
            pod_creates_sent: r.sent("POST pods"),
            relaunch_pod_creates: r.relaunch_pod_creates,
            requests: r.requests.clone(),
            system_failures_charged: r.max_system_failures_seen,
            system_failures_recorded: r.system_failures_recorded,
            attempts: r.attempts,
            running_again_after_ms: r.running_again_after_ms,
            relaunched_after_gone_ms_median: gone_median,
            relaunched_after_gone_ms_max: gone_max,
            longest_create_call_ms: r.longest_create_call_ms,
            grace_seconds: grace,
            load,
            unrelated_created_ms_max: created_max,
            unrelated_created_ms_median: created_median,
            unrelated_running_ms_max: running_max,
            report: r,
        });
    }
    Ok(rows)
}
