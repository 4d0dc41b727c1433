//! What a kubelet sends goes through unchanged with graceguard installed, with
//! the Node authorizer and NodeRestriction on (every supported minor), and
//! every DisruptionTarget still ends up tagged; evictions, which no DELETE
//! webhook sees, are audited once each.

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use testbed::kubelet::{Kubelet, KubeletOptions, Terminal};
use testbed::pods::{self, disruption_label, CreateOutcome};
use testbed::webhook::{WebhookProcess, ALL_HOOKS};
use testbed::TestBed;

type R = anyhow::Result<()>;

const LABEL: &str = "graceguard.io/disruption";

async fn running_pod(bed: &TestBed, ns: &str, name: &str, grace: i64) -> anyhow::Result<Api<Pod>> {
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    assert_eq!(
        pods::create(&api, &pods::task_pod(name, grace)).await?,
        CreateOutcome::Created
    );
    pods::wait_running(&api, name).await?;
    Ok(api)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_s_own_disruption_is_allowed_unchanged_then_tagged_and_its_pod_finishes() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("kubelet-disruption").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, ALL_HOOKS).await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api = running_pod(&bed, &ns, "k1", 30).await?;
    let uid = api.get("k1").await?.uid().unwrap_or_default();
    // Being deleted (say the node is shutting down), so the kubelet ends it
    // and then removes it.
    pods::delete_gracefully(&api, "k1", None).await?;

    // The kubelet reports its own disruption with the terminal phase, as the node.
    // Changing it would make NodeRestriction answer 403 "cannot update labels
    // through pod status", and the kubelet would retry forever.
    kubelet
        .terminate_with_disruption(&ns, "k1", "TerminationByKubelet", "node shutting down")
        .await?;
    let tagged = pods::wait_label(&api, "k1", LABEL, "TerminationByKubelet").await?;
    assert_eq!(
        tagged
            .annotations()
            .get("graceguard.io/disruption-message")
            .map(String::as_str),
        Some("node shutting down")
    );
    // The follow-up's record is written once the tag is (the audit log lags a
    // moment behind); under load the API server may also re-run the node's
    // patch after a write conflict, so records are matched, not counted.
    webhook
        .wait_record(|r| r["event"] == "follow_up" && r["name"] == "k1")
        .await?;
    let recs = webhook.records_for("disruption_tagger", &ns, "k1")?;
    let node_updates: Vec<_> = recs
        .iter()
        .filter(|r| {
            r["user"] == "system:node:node-1" && r["disruption_reason"] == "TerminationByKubelet"
        })
        .collect();
    assert!(!node_updates.is_empty(), "{recs:?}");
    assert!(
        node_updates.iter().all(|r| r["patched"] == false),
        "a node's update is never patched: {recs:?}"
    );
    assert_eq!(
        node_updates[0]["reason"], "node_request_follow_up",
        "{recs:?}"
    );
    let follow_up: Vec<_> = recs.iter().filter(|r| r["event"] == "follow_up").collect();
    assert_eq!(follow_up.len(), 1, "{recs:?}");
    assert_eq!(follow_up[0]["reason"], "tagged");
    assert_eq!(follow_up[0]["source"], "node_status_update");
    assert_eq!(
        follow_up[0]["user"], "",
        "a follow-up is no request of anyone's"
    );

    // The node's next status update and its final delete (grace 0) go through.
    kubelet.end_pod(&ns, "k1", Terminal::Failed).await?;
    kubelet.finish_deletion(&ns, "k1").await?;
    pods::wait_gone(&api, "k1", &uid).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_written_before_graceguard_saw_it_is_tagged_after_the_node_s_next_update() -> R
{
    let bed = TestBed::start().await?;
    let ns = bed.namespace("late-tag").await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api = running_pod(&bed, &ns, "p1", 30).await?;
    // Written while graceguard is not installed (or by the Eviction API,
    // outside admission): nothing tags it.
    kubelet.mark_preempted(&ns, "p1").await?;
    pods::delete_gracefully(&api, "p1", None).await?;
    assert_eq!(disruption_label(&api.get("p1").await?), None);

    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, ALL_HOOKS).await?;
    // The kubelet's final status update carries the untagged condition.
    kubelet.end_pod(&ns, "p1", Terminal::Failed).await?;
    let pod = pods::wait_label(&api, "p1", LABEL, "PreemptionByScheduler").await?;
    assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some("Failed"));
    let uid = pod.metadata.uid.unwrap_or_default();
    // Its final delete, grace 0, as the node.
    kubelet.finish_deletion(&ns, "p1").await?;
    pods::wait_gone(&api, "p1", &uid).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_eviction_is_audited_exactly_once_and_tagged_where_the_api_writes_its_condition() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("evict").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, ALL_HOOKS).await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api = running_pod(&bed, &ns, "e1", 30).await?;
    let alice = bed.client_as("alice").await?;

    // A dry run first: audited as one, the pod left alone.
    let dry = pods::evict(&alice, &ns, "e1", Some(20), true).await?;
    assert_eq!(dry, CreateOutcome::Created, "{dry:?}");
    let out = pods::evict(&alice, &ns, "e1", Some(20), false).await?;
    assert_eq!(out, CreateOutcome::Created, "{out:?}");
    let pod = api.get("e1").await?;
    assert!(
        pod.metadata.deletion_timestamp.is_some(),
        "evicted: Terminating"
    );
    assert_eq!(pod.metadata.deletion_grace_period_seconds, Some(20));

    // The attempt at admission, then its outcome from the pod watch (a dry
    // run has none).
    let outcome = webhook
        .wait_record(|r| r["event"] == "eviction_outcome" && r["name"] == "e1")
        .await?;
    let all = webhook.records_for("eviction_audit", &ns, "e1")?;
    let recs: Vec<_> = all.iter().filter(|r| r["event"] == "admission").collect();
    assert_eq!(recs.len(), 2, "{all:?}");
    assert_eq!(recs[0]["dry_run"], true);
    let rec = recs[1];
    assert_eq!(rec["user"], "alice");
    assert_eq!(rec["dry_run"], false);
    assert_eq!(rec["grace_period_seconds"], 20);
    assert_eq!(rec["reason"], "eviction_attempt");
    assert_eq!(outcome["reason"], "evicted", "{outcome}");
    assert_eq!(outcome["request_uid"], rec["request_uid"], "{outcome}");
    assert_eq!(outcome["user"], "alice");
    assert_eq!(rec["disruption_reason"], "EvictionByEvictionAPI");
    assert_eq!(rec["uid"], pod.uid().unwrap_or_default().as_str());
    // The eviction deleted it through the registry: no DELETE webhook call.
    assert!(webhook.records_for("deletion_audit", &ns, "e1")?.is_empty());

    // The Eviction API writes DisruptionTarget outside admission; graceguard
    // tags it afterwards.
    pods::wait_label(&api, "e1", LABEL, "EvictionByEvictionAPI").await?;
    // The kubelet finishes the deletion as the node: final status, delete grace 0.
    kubelet.finish_deletion(&ns, "e1").await?;
    pods::wait_gone(&api, "e1", &pod.uid().unwrap_or_default()).await?;
    let recs = webhook.records_for("eviction_audit", &ns, "e1")?;
    assert_eq!(
        recs.len(),
        3,
        "still one record per eviction request and one outcome: {recs:?}"
    );
    let deletes = webhook.records_for("deletion_audit", &ns, "e1")?;
    assert!(
        deletes
            .iter()
            .all(|d| d["already_terminating"] == true && d["user"] == "system:node:node-1"),
        "the only DELETE is the kubelet's final one: {deletes:?}"
    );
    Ok(())
}

/// `kubectl drain` of a pod whose PodDisruptionBudget refuses its eviction
/// for a while: kubectl retries every 5 s, each attempt is recorded at
/// admission (which runs before the budget is checked), and each attempt
/// gets one outcome record: `not_evicted` for the refused ones, `evicted`
/// for the one that evicted the pod, so the pod has one eviction and (where
/// the Eviction API writes its DisruptionTarget, 1.26+) one follow-up tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_a_budget_refuses_for_a_while_records_each_attempt_and_one_eviction() -> R {
    use testbed::kubelet::FinishDeletions;
    let bed = TestBed::start().await?;
    let ns = bed.namespace("budget").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, ALL_HOOKS).await?;
    let _kubelet = Kubelet::start(
        &bed,
        KubeletOptions {
            finish_deletions: FinishDeletions::AfterShareOfGrace(0.2),
            ..Default::default()
        },
    )
    .await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let mut pod = pods::task_pod("guarded", 30);
    pod.metadata.labels = Some([("app".to_string(), "guarded".to_string())].into());
    assert_eq!(pods::create(&api, &pod).await?, CreateOutcome::Created);
    pods::wait_running(&api, "guarded").await?;
    // No disruption allowed.
    let policy = "policy/v1";
    let pdb = bed.dir().join("pdb.yaml");
    std::fs::write(
        &pdb,
        format!(
            "apiVersion: {policy}\nkind: PodDisruptionBudget\nmetadata:\n  name: guarded\n  namespace: {ns}\nspec:\n  maxUnavailable: 0\n  selector:\n    matchLabels:\n      app: guarded\n"
        ),
    )?;
    let pdb_arg = pdb.display().to_string();
    let (ok, _, err) = bed.kubectl("admin", &["apply", "-f", &pdb_arg])?;
    assert!(ok, "creating the budget: {err}");

    let kubeconfig = bed.kubeconfig_for("admin")?;
    let kubectl = bed.kubectl_path().to_path_buf();
    let drain = tokio::task::spawn_blocking(move || {
        std::process::Command::new(kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args([
                "drain",
                testbed::control_plane::NODE,
                "--pod-selector=app=guarded",
            ])
            .args([
                "--force",
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=120s",
            ])
            .output()
    });
    // Three refused attempts (about 10 s of kubectl's retries).
    let attempts = |recs: &[serde_json::Value]| {
        recs.iter()
            .filter(|r| r["event"] == "admission" && r["dry_run"] == false)
            .count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while attempts(&webhook.records_for("eviction_audit", &ns, "guarded")?) < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "kubectl drain did not retry 3 times"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let before = api.get("guarded").await?;
    assert!(
        before.metadata.deletion_timestamp.is_none(),
        "the budget refused: still running"
    );
    let (ok, _, err) = bed.kubectl("admin", &["delete", "-f", &pdb_arg])?;
    assert!(ok, "deleting the budget: {err}");
    let out = drain.await??;
    assert!(
        out.status.success(),
        "kubectl drain: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let evicted = webhook
        .wait_record(|r| {
            r["event"] == "eviction_outcome" && r["name"] == "guarded" && r["reason"] == "evicted"
        })
        .await?;
    let recs = webhook.records_for("eviction_audit", &ns, "guarded")?;
    let tried: Vec<&serde_json::Value> = recs
        .iter()
        .filter(|r| r["event"] == "admission" && r["dry_run"] == false)
        .collect();
    assert!(tried.len() >= 4, "3 refused, 1 granted: {recs:?}");
    assert!(
        tried.iter().all(|r| r["reason"] == "eviction_attempt"),
        "{recs:?}"
    );
    let outcomes: Vec<&serde_json::Value> = recs
        .iter()
        .filter(|r| r["event"] == "eviction_outcome")
        .collect();
    // One outcome per attempt, named by its request uid; the last one evicted.
    let mut asked: Vec<&str> = tried
        .iter()
        .filter_map(|r| r["request_uid"].as_str())
        .collect();
    let mut answered: Vec<&str> = outcomes
        .iter()
        .filter_map(|r| r["request_uid"].as_str())
        .collect();
    asked.sort_unstable();
    answered.sort_unstable();
    assert_eq!(asked, answered, "{recs:?}");
    let granted: Vec<_> = outcomes
        .iter()
        .filter(|r| r["reason"] == "evicted")
        .collect();
    assert_eq!(granted.len(), 1, "the pod was evicted once: {recs:?}");
    assert_eq!(
        evicted["request_uid"],
        tried[tried.len() - 1]["request_uid"],
        "{recs:?}"
    );
    assert_eq!(evicted["uid"], before.uid().unwrap_or_default().as_str());
    assert_eq!(
        outcomes.len() - 1,
        tried.len() - 1,
        "the others not evicted: {recs:?}"
    );
    assert!(outcomes
        .iter()
        .filter(|r| r["reason"] != "evicted")
        .all(|r| r["reason"] == "not_evicted"));
    assert_eq!(
        webhook.metric("graceguard_eviction_outcomes_total{outcome=\"evicted\"}")?,
        Some(1.0)
    );

    // One follow-up, for the eviction that happened.
    webhook
        .wait_record(|r| r["event"] == "follow_up" && r["name"] == "guarded")
        .await?;
    let follow_ups: Vec<_> = webhook
        .records_for("disruption_tagger", &ns, "guarded")?
        .into_iter()
        .filter(|r| r["event"] == "follow_up")
        .collect();
    assert_eq!(follow_ups.len(), 1, "{follow_ups:?}");
    assert_eq!(follow_ups[0]["reason"], "tagged", "{follow_ups:?}");
    Ok(())
}

/// An eviction's outcome comes from the pod's own evidence, never from
/// timing alone: a plain DELETE seconds after a refused attempt is not that
/// attempt's eviction (it was, when any deletion within 60 s counted), and
/// an attempt still pending when graceguard stops is recorded `dropped`
/// instead of vanishing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_after_a_refused_eviction_is_not_its_outcome_and_a_stop_records_what_is_pending(
) -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("evidence").await?;
    let mut webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, ALL_HOOKS).await?;
    let _kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    for name in ["deleted", "pending"] {
        let mut pod = pods::task_pod(name, 30);
        pod.metadata.labels = Some([("app".to_string(), "guarded".to_string())].into());
        assert_eq!(pods::create(&api, &pod).await?, CreateOutcome::Created);
        pods::wait_running(&api, name).await?;
    }
    // No disruption allowed: every eviction is refused (429).
    let pdb = bed.dir().join("pdb.yaml");
    std::fs::write(
        &pdb,
        format!(
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: guarded\n  namespace: {ns}\nspec:\n  maxUnavailable: 0\n  selector:\n    matchLabels:\n      app: guarded\n"
        ),
    )?;
    let (ok, _, err) = bed.kubectl("admin", &["apply", "-f", &pdb.display().to_string()])?;
    assert!(ok, "creating the budget: {err}");
    let alice = bed.client_as("alice").await?;
    // The budget's status is written by the disruption controller: until
    // then the Eviction API refuses too, so any refusal will do.
    for name in ["deleted", "pending"] {
        let out = pods::evict(&alice, &ns, name, None, false).await?;
        assert!(
            matches!(
                out,
                CreateOutcome::Refused {
                    code: 429 | 500,
                    ..
                }
            ),
            "the budget refuses the eviction of {name}: {out:?}"
        );
    }
    let attempt = |name: &'static str| {
        let webhook = &webhook;
        let ns = ns.clone();
        async move {
            webhook
                .wait_record(|r| {
                    r["event"] == "admission"
                        && r["endpoint"] == "eviction_audit"
                        && r["namespace"] == ns.as_str()
                        && r["name"] == name
                })
                .await
        }
    };
    let refused = attempt("deleted").await?;
    attempt("pending").await?;

    // A plain DELETE by bob, seconds later.
    pods::delete_gracefully(&api, "deleted", None).await?;
    let outcome = webhook
        .wait_record(|r| r["event"] == "eviction_outcome" && r["name"] == "deleted")
        .await?;
    assert_eq!(outcome["request_uid"], refused["request_uid"], "{outcome}");
    assert_eq!(
        outcome["reason"], "not_evicted",
        "a DELETE is not the refused attempt's eviction: {outcome}"
    );
    assert!(
        outcome["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no DisruptionTarget")),
        "{outcome}"
    );
    assert_eq!(
        webhook.metric("graceguard_eviction_outcomes_total{outcome=\"evicted\"}")?,
        Some(0.0)
    );

    // graceguard stops with the other attempt pending: recorded as dropped.
    assert!(
        webhook.terminate().is_some(),
        "the webhook stops on SIGTERM"
    );
    let dropped: Vec<_> = webhook
        .records_for("eviction_audit", &ns, "pending")?
        .into_iter()
        .filter(|r| r["event"] == "eviction_outcome")
        .collect();
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert_eq!(dropped[0]["reason"], "dropped", "{dropped:?}");
    assert!(
        api.get("pending")
            .await?
            .metadata
            .deletion_timestamp
            .is_none(),
        "the refused pod still runs"
    );
    Ok(())
}
