//! The guard's fence end to end, shared by the bed without nodes
//! (`tests/tests/e2e/fencing.rs`) and the bed with a real node
//! (`tests/tests/e2e/real_nodes.rs`): Creates under a Lease term, the webhook's
//! refusal of a stale one, and the stalled-holder scenario.

use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::Api;

use testbed::sidecar::SidecarProcess;
use testbed::stall::HoldingProxy;
use testbed::webhook::{Hook, WebhookProcess};
use testbed::TestBed;

/// A task pod carrying `token` as the guard stamps it.
pub fn pod_under(name: &str, token: &graceguard_contract::fencing::Token) -> Pod {
    let mut pod = testbed::pods::task_pod_on(name, 30, None);
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
pub async fn create(api: &Api<Pod>, pod: &Pod, dry_run: bool) -> Option<kube::core::Status> {
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

/// The first cause's reason of a refusal.
pub fn cause_of(s: &kube::core::Status) -> Option<&str> {
    s.details
        .as_ref()
        .and_then(|d| d.causes.first())
        .map(|c| c.reason.as_str())
}

/// Dry runs a Create under `token` until the webhook's Lease watch has
/// delivered the takeover that makes it stale (the watch's delay, bounded).
pub async fn until_refused(
    api: &Api<Pod>,
    token: &graceguard_contract::fencing::Token,
    webhook: &WebhookProcess,
) -> Result<()> {
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

/// The holder's Lease in the stalled-holder scenario: renewed every 3 s,
/// its fence closing 6 s after a renewal was sent, taken over no sooner
/// than 9 s after another process last saw it renewed.
pub const HELD_LEASE_SECONDS: u64 = 9;

/// What [`stalled_holder`] leaves running: the process that took over, and
/// the webhook (with the other processes, kept alive until dropped).
pub struct StalledHolder {
    pub a: SidecarProcess,
    pub b: SidecarProcess,
    pub webhook: WebhookProcess,
    pub proxy: HoldingProxy,
}

/// A sidecar (A) of instance `instance` reaches the API server through a
/// proxy that then holds every byte, as a paused VM or a stalled network
/// path would. Task `task` PUT to it right after (from `template`) makes it
/// send a Create, in time, under its term; the proxy holds it. A second
/// process (B) takes the Lease once it lapses. Checks that A's fence closes
/// before B can take the Lease (its deadline, not an error, closes it), that
/// A's Create, delivered after the takeover, is refused by graceguard for
/// its term (no pod of A's reaches the store), and that A learns it lost the
/// Lease.
pub async fn stalled_holder(
    bed: &TestBed,
    ns: &str,
    (instance, task): (&str, &str),
    template: serde_json::Value,
) -> Result<StalledHolder> {
    let webhook = WebhookProcess::start(bed, &[]).await?;
    webhook.register(bed, &[Hook::CollisionGuard]).await?;
    let upstream = bed.apiserver_addr()?;
    let proxy = HoldingProxy::start(upstream).await?;
    let a = SidecarProcess::start_via(
        bed,
        (instance, ns, &format!("{instance}-a")),
        bed.kubeconfig_via("alice", &proxy.url())?,
        HELD_LEASE_SECONDS,
    )
    .await?;
    let leases: Api<Lease> = Api::namespaced(bed.client.clone(), ns);
    let lease_name = graceguard::runtime::lease::lease_name(instance);
    let before = leases.get(&lease_name).await?;
    let spec = before.spec.clone().unwrap_or_default();
    let a_term = graceguard_contract::fencing::Token {
        lease_namespace: ns.to_string(),
        lease_name: lease_name.clone(),
        lease_uid: before.metadata.uid.clone().unwrap_or_default(),
        transitions: spec.lease_transitions.map_or(0, i64::from),
    };

    proxy.hold();
    let held_at = Instant::now();
    let (code, st) = a
        .request(
            "PUT",
            &format!("/v1/tasks/{ns}/{task}"),
            Some(&serde_json::json!({ "template": template })),
        )
        .await?;
    anyhow::ensure!(code == 201, "A accepted the task: {code} {st}");

    let mut b = SidecarProcess::start_second(bed, instance, ns, &format!("{instance}-b"))?;
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
    let alice: Api<Pod> = Api::namespaced(bed.client_as("alice").await?, ns);
    until_refused(&alice, &a_term, &webhook).await?;
    proxy.release();
    let late = webhook
        .wait_record(|r| {
            r["endpoint"] == "collision_guard"
                && r["namespace"] == ns
                && r["name"] != "probe"
                && r["dry_run"] == false
        })
        .await?;
    anyhow::ensure!(
        late["decision"] == "deny" && late["reason"] == "fencing_token_superseded",
        "A's late Create was not refused for its term: {late}"
    );
    anyhow::ensure!(late["name"] == format!("{task}-0"), "A's attempt: {late}");
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
    Ok(StalledHolder {
        a,
        b,
        webhook,
        proxy,
    })
}
