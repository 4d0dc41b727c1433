//! The disruption tagger and the deletion audit against a real kube-apiserver,
//! both registered by URL.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::Value;
use testbed::kubelet::{Kubelet, KubeletOptions};
use testbed::pods::{self, CreateOutcome};
use testbed::webhook::{Hook, WebhookProcess};
use testbed::TestBed;

type R = anyhow::Result<()>;

const ALL: &[Hook] = &[
    Hook::CollisionGuard,
    Hook::DisruptionTagger,
    Hook::DeletionAudit,
];

/// A running pod marked `DisruptionTarget` (as kube-scheduler marks a victim
/// a few ms before it deletes it) is left unchanged while it runs (a metadata
/// change would make its kubelet's termination wait a PLEG relist); once its
/// deletion begins graceguard tags it, under its own identity, and audits the
/// deletion once with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_pod_is_tagged_once_its_deletion_begins_and_audited_with_the_reason() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("disrupt").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, ALL).await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    assert_eq!(
        pods::create(&api, &pods::task_pod("train-0", 60)).await?,
        CreateOutcome::Created
    );
    pods::wait_running(&api, "train-0").await?;

    // kube-scheduler sets DisruptionTarget through pods/status before preempting.
    kubelet.mark_preempted(&ns, "train-0").await?;
    let running = api.get("train-0").await?;
    assert_eq!(
        pods::disruption_label(&running),
        None,
        "a running pod was tagged: {:?}",
        running.metadata
    );
    webhook
        .wait_record(|r| r["reason"] == "running_pod_follow_up" && r["name"] == "train-0")
        .await?;

    // An operator deletes it with kubectl, as a known user, with a grace period.
    let (ok, _, err) = bed.kubectl(
        "alice",
        &[
            "delete",
            "pod",
            "train-0",
            "-n",
            &ns,
            "--grace-period=45",
            "--wait=false",
        ],
    )?;
    assert!(ok, "kubectl delete failed: {err}");
    let deletions = webhook
        .wait_records("deletion_audit", &ns, "train-0", 1)
        .await?;
    assert_eq!(deletions.len(), 1, "{deletions:?}");
    let d = &deletions[0];
    assert_eq!(d["user"], "alice");
    assert_eq!(d["grace_period_seconds"], 45);
    assert_eq!(d["disruption_reason"], "PreemptionByScheduler");
    assert_eq!(d["reason"], "disruption");
    assert_eq!(d["already_terminating"], false);
    assert_eq!(d["phase"], "Running");
    assert_eq!(d["decision"], "allow");
    assert_eq!(
        d["uid"],
        running
            .metadata
            .uid
            .as_deref()
            .unwrap_or("")
            .to_string()
            .as_str()
    );
    assert!(
        d["groups"].as_str().unwrap_or("").contains("testbed:users"),
        "{d}"
    );
    // The delete was allowed: the pod is Terminating with the requested grace.
    let terminating = api.get("train-0").await?;
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(45));

    // Now graceguard tags it: the follow-up's record, then the tags.
    let follow_up = webhook
        .wait_record(|r| r["event"] == "follow_up" && r["name"] == "train-0")
        .await?;
    assert_eq!(follow_up["reason"], "tagged", "{follow_up}");
    assert_eq!(follow_up["disruption_reason"], "PreemptionByScheduler");
    let pod = api.get("train-0").await?;
    assert!(pod.metadata.deletion_timestamp.is_some());
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        labels.get("graceguard.io/disruption").map(String::as_str),
        Some("PreemptionByScheduler")
    );
    assert_eq!(
        labels.get("app").map(String::as_str),
        Some("task"),
        "existing labels are kept"
    );
    assert_eq!(
        annotations
            .get("graceguard.io/disruption-message")
            .map(String::as_str),
        Some("Preempted by a pod on node node-1")
    );
    assert!(annotations.contains_key("graceguard.io/disruption-time"));

    // The same status update again: the tags already say it, so no patch.
    kubelet.repeat_disruption_target(&ns, "train-0").await?;
    webhook
        .wait_record(|r| r["reason"] == "already_tagged" && r["name"] == "train-0")
        .await?;
    let tagger = webhook.records_for("disruption_tagger", &ns, "train-0")?;
    // The kubelet's Running update, the first DisruptionTarget, the repeat;
    // the follow-up's record last. (Under load the API server re-runs a patch
    // after a write conflict, and admission with it: a request may leave the
    // same record twice.)
    let mut reasons: Vec<&str> = tagger.iter().filter_map(|r| r["reason"].as_str()).collect();
    reasons.retain(|r| *r != "tagged");
    reasons.dedup();
    assert_eq!(
        reasons,
        vec![
            "no_disruption_target",
            "running_pod_follow_up",
            "already_tagged"
        ],
        "{tagger:?}"
    );
    let tagged: Vec<&Value> = tagger.iter().filter(|r| r["reason"] == "tagged").collect();
    assert_eq!(tagged.len(), 1, "one tag, by the follow-up: {tagger:?}");
    assert_eq!(tagged[0]["event"], "follow_up");
    assert_eq!(tagged[0]["patched"], true);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_without_a_disruption_is_audited_as_unexplained() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("delete").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, &[Hook::DeletionAudit]).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    assert_eq!(
        pods::create(&api, &pods::task_pod("worker", 30)).await?,
        CreateOutcome::Created
    );
    let bob: Api<Pod> = Api::namespaced(bed.client_as("bob").await?, &ns);
    pods::delete_gracefully(&bob, "worker", None).await?;
    // Deleting it again while it is terminating is audited as such.
    pods::delete_gracefully(&bob, "worker", Some(10)).await?;
    let recs = webhook
        .wait_records("deletion_audit", &ns, "worker", 2)
        .await?;
    assert_eq!(recs.len(), 2, "{recs:?}");
    assert_eq!(recs[0]["user"], "bob");
    assert_eq!(recs[0]["reason"], "unexplained");
    assert_eq!(
        recs[0]["grace_period_seconds"], 30,
        "the pod's own grace period"
    );
    assert!(
        recs[0].get("disruption_reason").is_none_or(Value::is_null),
        "{:?}",
        recs[0]
    );
    assert_eq!(recs[1]["already_terminating"], true);
    assert_eq!(recs[1]["grace_period_seconds"], 10);
    Ok(())
}

/// A follow-up tag (graceguard reads the pod, derives its tags, patches
/// later) keeps the labels another writer added in between, though the pod
/// had no labels map when graceguard read it: its merge patch sets only
/// graceguard's keys. And the same patch, sent after the pod was replaced
/// under its name, is refused (its uid would change): the new pod is never
/// tagged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_tag_keeps_a_concurrent_writers_labels_and_never_tags_a_replaced_pod() -> R {
    use graceguard_webhook::disruption::Disruption;
    use graceguard_webhook::review::Meta;
    use graceguard_webhook::tagger;
    use kube::api::{Patch, PatchParams};
    let bed = TestBed::start().await?;
    let ns = bed.namespace("race").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let mut pod = pods::task_pod("racer", 30);
    pod.metadata.labels = None;
    pod.metadata.annotations = None;
    assert_eq!(pods::create(&api, &pod).await?, CreateOutcome::Created);

    // graceguard's read: no labels, no annotations.
    let seen = api.get("racer").await?;
    let meta: Meta = serde_json::from_value(serde_json::to_value(&seen.metadata)?)?;
    assert!(
        meta.labels.is_none() && meta.annotations.is_none(),
        "{meta:?}"
    );
    let uid = meta.uid.clone().unwrap_or_default();
    let d = Disruption {
        reason: "TerminationByKubelet".into(),
        message: "the kubelet is terminating it".into(),
        time: "2026-12-02T00:00:00Z".into(),
    };
    let tags = tagger::merge_patch_for(&uid, &meta, &d)
        .ok_or_else(|| anyhow::anyhow!("no tags for an untagged pod"))?;
    // Another writer (a ReplicaSet's selector label, a user) before graceguard's patch lands.
    api.patch(
        "racer",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await?;
    api.patch("racer", &PatchParams::default(), &Patch::Merge(&tags))
        .await?;
    let labels = api.get("racer").await?.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("app").map(String::as_str),
        Some("web"),
        "the concurrent writer's label was lost: {labels:?}"
    );
    assert_eq!(
        labels.get(tagger::LABEL).map(String::as_str),
        Some("TerminationByKubelet"),
        "{labels:?}"
    );

    // The pod replaced under its name: the old patch must not tag the new one.
    pods::delete_gracefully(&api, "racer", Some(0)).await?;
    pods::wait_gone(&api, "racer", &uid).await?;
    assert_eq!(pods::create(&api, &pod).await?, CreateOutcome::Created);
    match api
        .patch("racer", &PatchParams::default(), &Patch::Merge(&tags))
        .await
    {
        Err(kube::Error::Api(s)) => assert!(
            s.code == 422 && s.message.contains("metadata.uid"),
            "the uid guard answered {} {}: {}",
            s.code,
            s.reason,
            s.message
        ),
        other => anyhow::bail!("a patch for the old pod's uid was not refused: {other:?}"),
    }
    let fresh = api.get("racer").await?.metadata.labels.unwrap_or_default();
    assert!(
        !fresh.contains_key(tagger::LABEL),
        "the replaced pod was tagged: {fresh:?}"
    );
    Ok(())
}

/// The opt-out label cannot hide a deletion: a pod labelled
/// `graceguard.io/ignore=true`, in a namespace labelled the same, is still
/// audited when it is deleted and when it is evicted, while the collision
/// guard honours the label (its Creates never reach graceguard) and nothing
/// is written to such a pod: an evicted one, still terminating on its node,
/// gets no follow-up tag though the audits saw its disruption.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_opt_out_label_never_hides_a_deletion_from_the_audit() -> R {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Patch, PatchParams};
    let bed = TestBed::start().await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register_as_the_chart_does(&bed).await?;
    let ns = bed.namespace("quiet").await?;
    let opt_out = serde_json::json!({"metadata": {"labels": {"graceguard.io/ignore": "true"}}});
    Api::<Namespace>::all(bed.client.clone())
        .patch(&ns, &PatchParams::default(), &Patch::Merge(&opt_out))
        .await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    for name in ["deleted", "evicted", "disrupted"] {
        // "disrupted" is bound to the node: it stays terminating after its
        // eviction (no kubelet confirms it), where a follow-up would tag it.
        let node = (name == "disrupted").then_some(pods::NODE);
        let mut pod = pods::task_pod_on(name, 30, node);
        if let Some(labels) = pod.metadata.labels.as_mut() {
            labels.insert("graceguard.io/ignore".into(), "true".into());
        }
        assert_eq!(pods::create(&api, &pod).await?, CreateOutcome::Created);
    }
    let uid = api.get("deleted").await?.metadata.uid.unwrap_or_default();
    api.delete("deleted", &Default::default()).await?;
    api.evict("evicted", &Default::default()).await?;
    let deleted = webhook
        .wait_records("deletion_audit", &ns, "deleted", 1)
        .await?;
    // At least one review, all of this pod's one DELETE: the API server runs
    // validating admission again each time its delete meets a newer version
    // of the object (the scheduler writing the unschedulable pod's status at
    // that moment; k8s.io/apiserver's etcd3 store, conditionalDelete), so
    // one DELETE can be reviewed, and audited, more than once.
    assert!(
        !deleted.is_empty(),
        "the labelled pod's deletion is audited"
    );
    assert!(
        deleted
            .iter()
            .all(|r| r["uid"] == uid.as_str() && r["user"] == "admin"),
        "{deleted:?}"
    );
    let evicted = webhook
        .wait_records("eviction_audit", &ns, "evicted", 1)
        .await?;
    // The attempt's record (its outcome is a record of its own).
    assert_eq!(
        evicted.iter().filter(|r| r["event"] == "admission").count(),
        1,
        "the labelled pod's eviction is audited: {evicted:?}"
    );
    // The collision guard honours the label: no Create reached it.
    assert!(webhook
        .audit_records()?
        .iter()
        .all(|r| !(r["endpoint"] == "collision_guard" && r["namespace"] == ns.as_str())));
    // The audits see the disrupted pod's eviction and deletion and would ask
    // for its tag; the follow-up leaves an opted-out pod alone.
    let opted_out = "graceguard_follow_up_tags_total{outcome=\"opted_out\"}";
    let before = webhook.metric(opted_out)?.unwrap_or(0.0);
    api.evict("disrupted", &Default::default()).await?;
    webhook
        .wait_records("eviction_audit", &ns, "disrupted", 1)
        .await?;
    webhook
        .wait_metric(opted_out, before + 1.0, Duration::from_secs(30))
        .await?;
    let pod = api.get("disrupted").await?;
    assert!(
        pod.metadata.deletion_timestamp.is_some(),
        "the evicted pod is still terminating on its node"
    );
    assert_eq!(
        pods::disruption_label(&pod),
        None,
        "{:?}",
        pod.metadata.labels
    );
    assert!(
        webhook
            .audit_records()?
            .iter()
            .all(|r| !(r["event"] == "follow_up" && r["namespace"] == ns.as_str())),
        "no follow-up ran for the opted-out namespace"
    );
    Ok(())
}
