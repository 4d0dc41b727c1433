//! Scenarios only real components produce, with the bed's kube-scheduler and
//! kube-controller-manager: a preemption, a drain, pods made by controllers,
//! and a Job held by the garbage collector's foreground deletion.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::{Api, Client, ResourceExt};
use scenarios::disruptions::{drain, scheduler_preemption};
use scenarios::objects;
use serde_json::json;
use testbed::kubelet::{FinishDeletions, Kubelet, KubeletOptions, Terminal};
use testbed::pods::{self, CreateOutcome};
use testbed::webhook::{WebhookProcess, ALL_HOOKS};
use testbed::{quota, TestBed};

type R = anyhow::Result<()>;

async fn bed_in(prefix: &str) -> anyhow::Result<(TestBed, String)> {
    let bed = TestBed::start().await?;
    let ns = bed.namespace(prefix).await?;
    Ok((bed, ns))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_s_preemption_is_tagged_and_its_delete_audited_once() -> R {
    let (bed, ns) = bed_in("preempt").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, ALL_HOOKS).await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let r = scheduler_preemption(&bed, &webhook, &kubelet, &ns).await?;
    assert!(r.tagged, "{r:?}");
    assert_eq!(r.disruption_label.as_deref(), Some("PreemptionByScheduler"));
    // At least once, and as the scheduler (see demo.rs: a loaded run saw two).
    assert!(r.delete_audit_records >= 1, "{r:?}");
    assert_eq!(r.deleted_by, "system:kube-scheduler", "{r:?}");
    assert_eq!(r.preemptor_node.as_deref(), Some(pods::NODE), "{r:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_kubectl_drain_completes_with_every_pod_tagged_and_audited_once() -> R {
    let (bed, ns) = bed_in("drain").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, ALL_HOOKS).await?;
    let r = drain(&bed, &webhook, &ns, 3).await?;
    assert!(r.drain_completed, "{r:?}");
    assert_eq!(r.pods, 3);
    assert_eq!(r.audited_once, 3, "{r:?}");
    assert_eq!(r.eviction_audit_records, 3, "{r:?}");
    assert_eq!(r.tagged, 3, "{r:?}");
    // No eviction reached the DELETE webhook as a deletion of a running pod.
    for i in 0..3 {
        let deletes = webhook.records_for("deletion_audit", &ns, &format!("drained-{i}"))?;
        assert!(
            deletes.iter().all(|d| d["already_terminating"] == true),
            "{deletes:?}"
        );
    }
    Ok(())
}

/// Waits until `check` (reading the cluster) is true.
async fn eventually<F, Fut>(what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + Duration::from_secs(90);
    while !check().await? {
        anyhow::ensure!(Instant::now() < deadline, "{what}: not within 90 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

fn workload_pod_template(app: &str) -> serde_json::Value {
    json!({
        "metadata": {"labels": {"app": app}},
        "spec": {
            "terminationGracePeriodSeconds": 20,
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"]}],
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_real_controllers_are_never_denied_and_a_statefulset_pod_returns_once_gone() -> R {
    let (bed, ns) = bed_in("controllers").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, ALL_HOOKS).await?;
    let kubelet = Kubelet::start(
        &bed,
        KubeletOptions {
            finish_deletions: FinishDeletions::AfterShareOfGrace(0.1),
            ..Default::default()
        },
    )
    .await?;
    let alice = bed.client_as("alice").await?;
    let pp = PostParams::default();

    // A Deployment, rolled out once: ReplicaSets create and delete pods.
    let deployments: Api<Deployment> = Api::namespaced(alice.clone(), &ns);
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": workload_pod_template("web")},
    }))?;
    deployments.create(&pp, &d).await?;
    let rolled = |generation: i64| {
        let deployments = deployments.clone();
        move || {
            let deployments = deployments.clone();
            async move {
                let d = deployments.get("web").await?;
                let s = d.status.unwrap_or_default();
                Ok(s.observed_generation >= Some(generation)
                    && s.updated_replicas == Some(2)
                    && s.available_replicas == Some(2)
                    && s.replicas == Some(2))
            }
        }
    };
    eventually("Deployment web available", rolled(1)).await?;
    let restart = json!({"spec": {"template": {"metadata": {"annotations": {"rollout": "2"}}}}});
    deployments
        .patch("web", &PatchParams::default(), &Patch::Merge(&restart))
        .await?;
    eventually("Deployment web rolled out", rolled(2)).await?;

    // A Job to completion.
    let jobs: Api<Job> = Api::namespaced(alice.clone(), &ns);
    let mut template = workload_pod_template("once");
    template["spec"]["restartPolicy"] = "Never".into();
    let j: Job = serde_json::from_value(json!({
        "metadata": {"name": "once"},
        "spec": {"completions": 1, "backoffLimit": 0, "template": template},
    }))?;
    jobs.create(&pp, &j).await?;
    let pods_api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let job_pod = {
        let pods_api = pods_api.clone();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let list = pods_api
                .list(&ListParams::default().labels("job-name=once"))
                .await?;
            let running = list
                .items
                .into_iter()
                .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
            if let Some(p) = running {
                break p.name_any();
            }
            anyhow::ensure!(Instant::now() < deadline, "the Job's pod never ran");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    kubelet.end_pod(&ns, &job_pod, Terminal::Succeeded).await?;
    eventually("Job once succeeded", || {
        let jobs = jobs.clone();
        async move { Ok(jobs.get("once").await?.status.and_then(|s| s.succeeded) == Some(1)) }
    })
    .await?;

    // A StatefulSet: its pods have fixed names.
    let sets: Api<StatefulSet> = Api::namespaced(alice.clone(), &ns);
    let s: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                 "template": workload_pod_template("db")},
    }))?;
    sets.create(&pp, &s).await?;
    eventually("StatefulSet db ready", || {
        let sets = sets.clone();
        async move { Ok(sets.get("db").await?.status.and_then(|s| s.ready_replicas) == Some(2)) }
    })
    .await?;
    let old = pods_api.get("db-0").await?;
    let old_uid = old.uid().unwrap_or_default();
    pods::delete_gracefully(&pods_api, "db-0", None).await?;
    pods::wait_gone(&pods_api, "db-0", &old_uid).await?;
    eventually("db-0 re-created", || {
        let pods_api = pods_api.clone();
        let old_uid = old_uid.clone();
        async move {
            Ok(pods_api
                .get_opt("db-0")
                .await?
                .is_some_and(|p| p.uid().as_deref() != Some(old_uid.as_str())))
        }
    })
    .await?;

    let decisions = webhook.audit_records()?;
    let guard: Vec<_> = decisions
        .iter()
        .filter(|r| r["endpoint"] == "collision_guard" && r["namespace"] == ns.as_str())
        .collect();
    let denied: Vec<_> = guard.iter().filter(|r| r["decision"] == "deny").collect();
    assert!(denied.is_empty(), "controllers' pods denied: {denied:?}");
    // Every controller's Create reached the guard: 2 + 2 Deployment pods, the
    // Job's, db-0, db-1 and db-0 again, and only once db-0 was gone.
    assert!(
        guard.len() >= 8,
        "{} collision guard calls: {guard:?}",
        guard.len()
    );
    let db0: Vec<_> = guard.iter().filter(|r| r["name"] == "db-0").collect();
    assert_eq!(
        db0.len(),
        2,
        "db-0 created twice, never while it was terminating: {db0:?}"
    );
    // Allowed from the index, or (when the watch had not yet seen the old
    // db-0 go) after a live read found the name free.
    assert!(
        db0.iter().all(|r| r["decision"] == "allow"
            && (r["reason"] == "name_free" || r["reason"] == "stale_index")),
        "{db0:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_match_conditions_ordinary_status_updates_generated_names_and_final_deletes_never_call_graceguard(
) -> R {
    let (bed, ns) = bed_in("match").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register_as_the_chart_does(&bed).await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    // Five named pods: five Creates the guard must see; their kubelet status
    // updates (Running) are ordinary traffic the tagger must not see.
    for i in 0..5 {
        pods::create(&api, &pods::task_pod(&format!("named-{i}"), 30)).await?;
    }
    // Five pods named by the API server from generateName.
    for _ in 0..5 {
        let mut p = pods::task_pod("", 30);
        p.metadata.name = None;
        p.metadata.generate_name = Some("gen-".into());
        api.create(&PostParams::default(), &p).await?;
    }
    for i in 0..5 {
        pods::wait_running(&api, &format!("named-{i}")).await?;
    }
    let list = api.list(&ListParams::default()).await?;
    for p in &list.items {
        pods::wait_running(&api, &p.name_any()).await?;
    }
    // One real disruption: it reaches the tagger, which leaves the running
    // pod alone; the preemption's delete follows and the pod is tagged then.
    kubelet.mark_preempted(&ns, "named-0").await?;
    api.delete("named-0", &DeleteParams::default()).await?;
    pods::wait_label(
        &api,
        "named-0",
        "graceguard.io/disruption",
        "PreemptionByScheduler",
    )
    .await?;
    // The same update again: already tagged, filtered out by the API server.
    kubelet.repeat_disruption_target(&ns, "named-0").await?;
    // A reason that is no valid label value (the label holds it sanitized):
    // once tagged, its repeats are filtered out too, as the match condition
    // compares what the tags copy verbatim (message and transition time).
    kubelet
        .mark_disruption_target(&ns, "named-3", "Preempted: team-b", "by a team-b job")
        .await?;
    api.delete("named-3", &DeleteParams::default()).await?;
    pods::wait_label(
        &api,
        "named-3",
        "graceguard.io/disruption",
        "Preempted--team-b",
    )
    .await?;
    kubelet.repeat_disruption_target(&ns, "named-3").await?;
    kubelet.repeat_disruption_target(&ns, "named-0").await?;
    // The audit log is written in order: a record after the repeats means
    // any record of theirs would be in.
    api.delete("named-4", &DeleteParams::default()).await?;
    webhook
        .wait_records("deletion_audit", &ns, "named-4", 1)
        .await?;

    let recs: Vec<_> = webhook
        .audit_records()?
        .into_iter()
        .filter(|r| r["namespace"] == ns.as_str() && r["event"] == "admission")
        .collect();
    let count = |endpoint: &str| recs.iter().filter(|r| r["endpoint"] == endpoint).count();
    assert_eq!(
        count("collision_guard"),
        5,
        "only the named Creates: {recs:?}"
    );
    assert!(
        recs.iter()
            .filter(|r| r["endpoint"] == "collision_guard")
            .all(|r| r["name"].as_str().is_some_and(|n| n.starts_with("named-"))),
        "{recs:?}"
    );
    // 10 pods went Running (10 kubelet status updates): none reached the
    // tagger; of the disruptions, only each pod's first update did.
    assert_eq!(
        count("disruption_tagger"),
        2,
        "only the first DisruptionTarget update of each: {recs:?}"
    );

    // A user's graceful delete is audited; the kubelet's final delete (grace
    // 0, as system:node:node-1) completes it and never calls graceguard.
    let uid = api.get("named-1").await?.uid().unwrap_or_default();
    api.delete("named-1", &DeleteParams::default()).await?;
    kubelet.finish_deletion(&ns, "named-1").await?;
    pods::wait_gone(&api, "named-1", &uid).await?;
    // The audit log is written in order: a later record means named-1's are in.
    api.delete("named-2", &DeleteParams::default()).await?;
    webhook
        .wait_records("deletion_audit", &ns, "named-2", 1)
        .await?;
    let deletes = webhook.records_for("deletion_audit", &ns, "named-1")?;
    assert!(
        deletes.iter().all(|d| d["already_terminating"] == false),
        "only the user's delete: {deletes:?}"
    );
    let began = testbed::webhook::deletion_beginnings(&deletes);
    assert_eq!(began.len(), 1, "one review began it: {deletes:?}");
    assert_ne!(began[0]["user"], "system:node:node-1", "{deletes:?}");
    Ok(())
}

async fn job_pod(client: &Client, ns: &str) -> anyhow::Result<String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = api
            .list(&kube::api::ListParams::default().labels("job-name=once"))
            .await?;
        if let Some(p) = list
            .items
            .iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        {
            return Ok(p.name_any());
        }
        anyhow::ensure!(Instant::now() < deadline, "the Job's pod never ran");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_held_by_foreground_deletion_is_denied_and_count_jobs_never_charged() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("job").await?;
    let webhook = scenarios::objects::guarding_kinds(&bed).await?;
    quota::set_named_quota(&bed, &ns, "jobs", &[("count/jobs.batch", "5")]).await?;
    webhook.wait_kind_indexed("jobs.batch").await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Job> = Api::namespaced(bed.client.clone(), &ns);
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "once"},
        "spec": {"completions": 1, "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 60,
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}}},
    }))?;
    assert_eq!(objects::create(&api, &job).await?, CreateOutcome::Created);
    let pod = job_pod(&bed.client, &ns).await?;
    // Foreground: the Job stays until the garbage collector has deleted its
    // pod, and the pod stays Terminating until its kubelet finishes it.
    let fg = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        ..Default::default()
    };
    api.delete("once", &fg).await?;
    let held = objects::wait_terminating(&api, "once").await?;
    objects::wait_indexed(&api, &job, "foreground deletion").await?;
    assert!(
        held.finalizers().iter().any(|f| f == "foregroundDeletion"),
        "{held:?}"
    );
    let count = quota::used(&bed.client, &ns, "jobs", "count/jobs.batch").await?;
    objects::denied_n_times(&api, &job, 3, "foreground deletion").await?;
    assert_eq!(
        quota::used(&bed.client, &ns, "jobs", "count/jobs.batch").await?,
        count
    );

    // Once the pod is gone the collector removes the Job: the name is free.
    let pods_api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    objects::wait_terminating(&pods_api, &pod).await?;
    kubelet.finish_deletion(&ns, &pod).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while api.get_opt("once").await?.is_some() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the garbage collector kept Job once"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    objects::create_once_free(&api, &job).await?;
    Ok(())
}
