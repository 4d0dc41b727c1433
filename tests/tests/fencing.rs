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

use std::time::{Duration, Instant};

use graceguard::lease::InstanceLease;
use graceguard::pod_api::{self, AnswerKind};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use testbed::guard_task::audited_bed;
use testbed::pods;
use testbed::sidecar::SidecarProcess;
use testbed::stall::HoldingProxy;
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

/// A task pod carrying `token` as the guard stamps it.
fn pod_under(name: &str, token: &graceguard_contract::fencing::Token) -> Pod {
    let mut pod = pods::task_pod_on(name, 30, None);
    pod.metadata.annotations = Some(
        [(
            graceguard_contract::fencing::ANNOTATION.to_string(),
            token.to_string(),
        )]
        .into(),
    );
    pod
}

/// The refusal of creating `pod` (None: created).
async fn create(api: &Api<Pod>, pod: &Pod, dry_run: bool) -> Option<kube::core::Status> {
    let pp = PostParams {
        dry_run,
        ..Default::default()
    };
    match api.create(&pp, pod).await {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(*s),
        Err(e) => Some(kube::core::Status::failure(&e.to_string(), "ClientError")),
    }
}

fn cause_of(s: &kube::core::Status) -> Option<&str> {
    s.details
        .as_ref()
        .and_then(|d| d.causes.first())
        .map(|c| c.reason.as_str())
}

/// Dry runs a Create under `token` until the webhook's Lease watch has
/// delivered the takeover that makes it stale (the watch's delay, bounded).
async fn until_refused(
    api: &Api<Pod>,
    token: &graceguard_contract::fencing::Token,
    webhook: &WebhookProcess,
) -> R {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = create(api, &pod_under("probe", token), true).await;
        if out.as_ref().and_then(cause_of) == Some(graceguard_contract::fencing::STALE_CAUSE) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the webhook never refused a Create under the superseded term {token}; last answer {out:?}; its records of it: {:?}; its log of the Lease watch: {}",
            webhook.records_for("collision_guard", api.namespace().unwrap_or_default(), "probe")?.last(),
            webhook.log_lines_with("instance Leases")?
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
        pod.metadata.finalizers = Some(vec![graceguard::naming::RESULT_FINALIZER.into()]);
        api.create(&PostParams::default(), &pod).await?;
    }
    let version = |p: &Pod| graceguard::pod_index::Version {
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
    let name = graceguard::lease::lease_name(INSTANCE);
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

/// The holder's Lease in the stalled-holder test: renewed every 3 s, its
/// fence closing 6 s after a renewal was sent, taken over no sooner than
/// 9 s after another process last saw it renewed.
const HELD_LEASE_SECONDS: u64 = 9;

/// A sidecar (A) reaches the API server through a proxy that then holds
/// every byte, as a paused VM or a stalled network path would. A task PUT
/// to it right after makes it send a Create, in time, under its term; the
/// proxy holds it. A second process (B) takes the Lease once it lapses. A's
/// fence closes before B can take the Lease (its deadline, not an error,
/// closes it). Then the proxy delivers what it held: A's Create reaches the
/// API server after the takeover and graceguard refuses it, so no pod of
/// A's reaches the store, and A learns it lost the Lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_stops_before_its_lease_is_taken_and_its_late_create_is_refused() -> R {
    let (bed, ns) = audited_bed("held").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, &[Hook::CollisionGuard]).await?;
    let upstream: std::net::SocketAddr = bed
        .url
        .strip_prefix("https://")
        .unwrap_or(&bed.url)
        .parse()?;
    let proxy = HoldingProxy::start(upstream).await?;
    let a = SidecarProcess::start_via(
        &bed,
        ("held", &ns, "held-a"),
        bed.kubeconfig_via("alice", &proxy.url())?,
        HELD_LEASE_SECONDS,
    )
    .await?;
    let leases: Api<Lease> = Api::namespaced(bed.client.clone(), &ns);
    let lease_name = graceguard::lease::lease_name("held");
    let before = leases.get(&lease_name).await?;
    let spec = before.spec.clone().unwrap_or_default();
    let a_term = graceguard_contract::fencing::Token {
        lease_namespace: ns.clone(),
        lease_name: lease_name.clone(),
        lease_uid: before.metadata.uid.clone().unwrap_or_default(),
        transitions: spec.lease_transitions.map_or(0, i64::from),
    };

    proxy.hold();
    let held_at = Instant::now();
    let template = serde_json::to_value(pods::task_pod_on("template", 30, None))?;
    let (code, st) = a
        .request(
            "PUT",
            &format!("/v1/tasks/{ns}/late"),
            Some(&serde_json::json!({ "template": template })),
        )
        .await?;
    anyhow::ensure!(code == 201, "A accepted the task: {code} {st}");

    let mut b = SidecarProcess::start_second(&bed, "held", &ns, "held-b")?;
    let mut a_stopped = None;
    let taken = loop {
        if a_stopped.is_none() {
            let (_, h) = a.request("GET", "/healthz", None).await?;
            if h["holds_lease"] == false {
                a_stopped = Some(held_at.elapsed());
            }
        }
        let now = leases.get(&lease_name).await?;
        let holder = now.spec.as_ref().and_then(|s| s.holder_identity.clone());
        if holder != spec.holder_identity {
            break held_at.elapsed();
        }
        anyhow::ensure!(
            held_at.elapsed() < Duration::from_secs(90),
            "B never took the Lease over (A stopped acting after {a_stopped:?}); B's log: {}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let a_stopped = a_stopped.ok_or_else(|| {
        anyhow::anyhow!(
            "the Lease was taken over {taken:?} into the stall while A still said it held it"
        )
    })?;
    anyhow::ensure!(
        a_stopped < taken,
        "A stopped acting {a_stopped:?} into the stall, after B took the Lease ({taken:?})"
    );
    b.wait_healthy(Duration::from_secs(60)).await?;

    // The webhook has seen B's term; then the held bytes go through.
    let alice: Api<Pod> = Api::namespaced(bed.client_as("alice").await?, &ns);
    until_refused(&alice, &a_term, &webhook).await?;
    proxy.release();
    let late = webhook
        .wait_record(|r| {
            r["endpoint"] == "collision_guard"
                && r["namespace"] == ns.as_str()
                && r["name"] != "probe"
                && r["dry_run"] == false
        })
        .await?;
    anyhow::ensure!(
        late["decision"] == "deny" && late["reason"] == "fencing_token_superseded",
        "A's late Create was not refused for its term: {late}"
    );
    anyhow::ensure!(late["name"] == "late-0", "A's attempt: {late}");
    let stored = alice.list(&Default::default()).await?;
    anyhow::ensure!(
        stored.items.is_empty(),
        "a pod reached the store: {:?}",
        stored
            .items
            .iter()
            .map(|p| p.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    // A's renewal, delivered late too, tells it another process holds it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !a.log().contains("another process took the instance Lease") {
        anyhow::ensure!(
            Instant::now() < deadline,
            "A never learned it lost the Lease: {}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
