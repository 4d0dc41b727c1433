//! The cluster enforces the guard's fence: a pod Create sent under an
//! instance Lease term that is over is refused by graceguard's webhook
//! before it reaches the store, whoever delivers it late. The Lease is taken
//! and taken over by the guard's own `InstanceLease` through the real API
//! server, as `alice` (an executor's account, not system:masters); the
//! Creates carry the tokens the guard's `Permit` stamps. Both Kubernetes
//! versions.
//!
//! And end to end with real processes: a sidecar whose whole path to the API
//! server stalls stops acting before its Lease can be taken over, and the
//! Create it sent in time but that arrives after the takeover is refused.

use std::time::Duration;

use graceguard::runtime::lease::InstanceLease;
use graceguard::runtime::pod_api::{self, AnswerKind};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use scenarios::fencing::{cause_of, create, pod_under, stalled_holder, until_refused};
use scenarios::guard_task::audited_bed;
use testbed::pods;
use testbed::webhook::{Hook, Registration, WebhookProcess};
use testbed::TestBed;

type R = anyhow::Result<()>;

const INSTANCE: &str = "fenced";
const DURATION: Duration = Duration::from_secs(3);

async fn take(client: &Client, ns: &str) -> anyhow::Result<InstanceLease> {
    Ok(InstanceLease::acquire(
        client.clone(),
        ns,
        INSTANCE,
        DURATION,
        Duration::from_secs(60),
        None,
    )
    .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_sent_under_a_lease_term_that_is_over_never_reaches_the_store() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("fencing").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook
        .register_with(
            &bed,
            &[Hook::CollisionGuard, Hook::ReleaseFencing],
            Registration {
                match_conditions: true,
                ..Default::default()
            },
        )
        .await?;
    let alice = bed.client_as("alice").await?;
    let api: Api<Pod> = Api::namespaced(alice.clone(), &ns);

    // A holds the Lease, then stops renewing without giving it up (a process
    // whose connection stalled); B waits for it to lapse and takes it over.
    let a = take(&alice, &ns).await?.token();
    let b_lease = take(&alice, &ns).await?;
    let b = b_lease.token();
    anyhow::ensure!(
        b.lease_uid == a.lease_uid && b.transitions == a.transitions + 1,
        "a takeover is a new term of the same Lease: A {a}, B {b}"
    );
    until_refused(&api, &a, &webhook).await?;

    // A's late Create: refused with the cause the guard reads, nothing stored.
    let refused = create(&api, &pod_under("task-a-0", &a), false)
        .await
        .ok_or_else(|| anyhow::anyhow!("the Create under A's superseded term {a} was created"))?;
    anyhow::ensure!(
        refused.code == 409
            && cause_of(&refused) == Some(graceguard_contract::fencing::STALE_CAUSE),
        "expected 409 with cause {}, got {refused:?}",
        graceguard_contract::fencing::STALE_CAUSE
    );
    anyhow::ensure!(
        refused.message.contains(&format!("term {}", a.transitions)),
        "the refusal names the term: {}",
        refused.message
    );
    anyhow::ensure!(
        api.get_opt("task-a-0").await?.is_none(),
        "the refused Create reached the store"
    );
    // The guard's own Create path reads that answer as "not created, not
    // known": it reads the name first if it ever acts again.
    let pod = serde_json::to_value(pod_under("task-a-1", &a))?;
    let pod = pod.as_object().cloned().unwrap_or_default();
    let kind = pod_api::create(&alice, &ns, &pod).await;
    anyhow::ensure!(
        matches!(kind, AnswerKind::Unknown),
        "the guard's create() of a fenced-out write: {kind:?}"
    );

    // B's Create, and a pod without a token (anyone else's), go through.
    for pod in [
        pod_under("task-b-0", &b),
        pods::task_pod_on("plain", 30, None),
    ] {
        let name = pod.metadata.name.clone().unwrap_or_default();
        if let Some(s) = create(&api, &pod, false).await {
            anyhow::bail!("{name} was refused: {s:?}");
        }
    }

    // Audited as refused for its term, and counted.
    // Records are written off the request path: waited for.
    let recs = webhook
        .wait_records("collision_guard", &ns, "task-a-0", 1)
        .await?;
    anyhow::ensure!(
        recs.iter().any(|r| r["decision"] == "deny"
            && r["reason"] == "fencing_token_superseded"
            && r["fencing"] == "fencing_token_superseded"),
        "no audit record of the refusal: {recs:?}"
    );
    let b_recs = webhook
        .wait_records("collision_guard", &ns, "task-b-0", 1)
        .await?;
    anyhow::ensure!(
        b_recs
            .iter()
            .any(|r| r["decision"] == "allow" && r["fencing"] == "fencing_token_current"),
        "B's Create not audited as current: {b_recs:?}"
    );
    let refused_count = webhook
        .metric("graceguard_fenced_writes_refused_total")?
        .unwrap_or(0.0);
    anyhow::ensure!(
        refused_count >= 2.0,
        "graceguard_fenced_writes_refused_total {refused_count}, expected the dry runs' and A's ≥ 2"
    );

    // Result-finalizer releases: A's, sent under its term, is refused and
    // the finalizer stays; B's goes through. An operator's release (no
    // released-under) of a pod whose creator's term is over is never
    // checked: the matchConditions do not send it.
    for name in ["kept-0", "kept-1", "kept-2"] {
        let mut pod = pod_under(name, &b);
        pod.metadata.finalizers = Some(vec![graceguard::core::naming::RESULT_FINALIZER.into()]);
        api.create(&PostParams::default(), &pod).await?;
    }
    let version = |p: &Pod| graceguard::runtime::Version {
        name: p.metadata.name.clone().unwrap_or_default(),
        uid: p.metadata.uid.clone().unwrap_or_default(),
        resource_version: p.metadata.resource_version.clone().unwrap_or_default(),
        finalizers: p.metadata.finalizers.clone().unwrap_or_default(),
    };
    let kept = api.get("kept-0").await?;
    let out = pod_api::release(&api, &version(&kept), Some(a.to_string())).await;
    anyhow::ensure!(
        out == pod_api::Released::Failed,
        "A's late release: {out:?}"
    );
    let still = api.get("kept-0").await?;
    anyhow::ensure!(
        still
            .metadata
            .finalizers
            .as_deref()
            .unwrap_or_default()
            .len()
            == 1,
        "the finalizer was let go by a refused release: {:?}",
        still.metadata.finalizers
    );
    let out = pod_api::release(&api, &version(&still), Some(b.to_string())).await;
    anyhow::ensure!(out == pod_api::Released::Done, "B's release: {out:?}");
    anyhow::ensure!(
        api.get("kept-0")
            .await?
            .metadata
            .finalizers
            .unwrap_or_default()
            .is_empty(),
        "B's release let go"
    );
    let recs = webhook
        .wait_records("release_fencing", &ns, "kept-0", 2)
        .await?;
    let reasons: Vec<&str> = recs.iter().filter_map(|r| r["reason"].as_str()).collect();
    anyhow::ensure!(
        reasons == ["fencing_token_superseded", "fencing_token_current"],
        "the two releases as checked: {reasons:?}"
    );
    let stale_creator = serde_json::json!({"metadata": {"annotations": {graceguard_contract::fencing::ANNOTATION: a.to_string()}}});
    api.patch(
        "kept-1",
        &Default::default(),
        &kube::api::Patch::Merge(&stale_creator),
    )
    .await?;
    let by_hand = serde_json::json!({"metadata": {"finalizers": null}});
    api.patch(
        "kept-1",
        &Default::default(),
        &kube::api::Patch::Merge(&by_hand),
    )
    .await?;
    anyhow::ensure!(
        api.get("kept-1")
            .await?
            .metadata
            .finalizers
            .unwrap_or_default()
            .is_empty(),
        "an operator's release is never refused"
    );
    // A release the check does see, after them: once its record is written,
    // any record of theirs would be too (one writer, in order).
    let marker = api.get("kept-2").await?;
    let out = pod_api::release(&api, &version(&marker), Some(b.to_string())).await;
    anyhow::ensure!(
        out == pod_api::Released::Done,
        "B's release of kept-2: {out:?}"
    );
    webhook
        .wait_records("release_fencing", &ns, "kept-2", 1)
        .await?;
    anyhow::ensure!(
        webhook
            .records_for("release_fencing", &ns, "kept-1")?
            .is_empty(),
        "an operator's edits never reach the release check"
    );

    // The Lease deleted and created again (a new uid): every term of the old
    // one is over, B's too.
    let leases: Api<Lease> = Api::namespaced(alice.clone(), &ns);
    let name = graceguard::runtime::lease::lease_name(INSTANCE);
    leases.delete(&name, &DeleteParams::default()).await?;
    drop(b_lease);
    let c = take(&alice, &ns).await?.token();
    anyhow::ensure!(
        c.lease_uid != b.lease_uid,
        "a re-created Lease has a new uid"
    );
    until_refused(&api, &b, &webhook).await?;
    let out = create(&api, &pod_under("task-b-1", &b), false).await;
    anyhow::ensure!(
        out.as_ref()
            .is_some_and(|s| s.code == 409 && s.message.contains("deleted and created again")),
        "a Create under the deleted Lease's term: {out:?}"
    );
    let recs = webhook
        .wait_records("collision_guard", &ns, "task-b-1", 1)
        .await?;
    anyhow::ensure!(
        recs.iter()
            .any(|r| r["decision"] == "deny" && r["reason"] == "fencing_token_lease_replaced"),
        "no record of the replaced Lease: {recs:?}"
    );
    Ok(())
}

/// The stalled-holder scenario ([`scenarios::fencing::stalled_holder`]) with
/// a task whose pod never reaches a node: the Create A sent in time is
/// refused after the takeover and no pod of it reaches the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_stops_before_its_lease_is_taken_and_its_late_create_is_refused() -> R {
    let (bed, ns) = audited_bed("held").await?;
    let template = serde_json::to_value(pods::task_pod_on("template", 30, None))?;
    stalled_holder(&bed, &ns, ("held", "late"), template).await?;
    Ok(())
}
