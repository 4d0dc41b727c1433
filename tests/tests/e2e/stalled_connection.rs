//! The webhook reaches the API server through a proxy whose open connections
//! go silent at once ([`StallingProxy`]), as when a load balancer or a NAT
//! entry drops them without a reset: nothing errors, bytes just stop. Every
//! call graceguard makes has its own bound, so each recovers over a new
//! connection: confirmation reads (1 s, then the Create is allowed), follow-up
//! reads and patches (5 s each, retried), and the watches behind the indexes
//! (re-opened every `WATCH_TIMEOUT_SECS`, abandoned 5 s past it when silent).
//! The guard's sidecar likewise sees its pods again while it keeps its
//! Lease (`graceguard::runtime`'s API timeouts). Both Kubernetes versions.

use std::time::{Duration, Instant};

use graceguard_webhook::meta_index::WATCH_TIMEOUT_SECS;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use scenarios::guard_task::audited_bed;
use testbed::kubelet::{Kubelet, KubeletOptions, Terminal};
use testbed::pods::{self, CreateOutcome};
use testbed::sidecar::SidecarProcess;
use testbed::stall::StallingProxy;
use testbed::webhook::{WebhookProcess, ALL_HOOKS};
use testbed::TestBed;

type R = anyhow::Result<()>;

const LABEL: &str = "graceguard.io/disruption";

/// Creates `name` until graceguard answers it (its 409 says no quota was
/// charged) or `within` passes; every other answer must be storage's
/// AlreadyExists (graceguard failed open). How many Creates it took.
async fn until_graceguard_denies(
    api: &Api<Pod>,
    name: &str,
    within: Duration,
) -> anyhow::Result<usize> {
    let deadline = Instant::now() + within;
    let mut n = 0;
    loop {
        n += 1;
        let out = pods::create(api, &pods::task_pod(name, 120)).await?;
        match &out {
            CreateOutcome::Refused {
                code: 409, message, ..
            } if message.contains("no quota was charged") => return Ok(n),
            CreateOutcome::Refused { code: 409, .. } => {}
            other => anyhow::bail!("Create {n} of {name}: expected 409, got {other:?}"),
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "graceguard did not deny the Create of {name} again within {within:?} ({n} Creates)"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_its_connections_go_silent_graceguard_denies_tags_and_indexes_again() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("stall").await?;
    let upstream = bed.apiserver_addr()?;
    let proxy = StallingProxy::start(upstream).await?;
    let kubeconfig = format!(
        "--kubeconfig={}",
        bed.kubeconfig_via("graceguard", &proxy.url())?.display()
    );
    let webhook = WebhookProcess::start(&bed, &[&kubeconfig]).await?;
    webhook.register(&bed, ALL_HOOKS).await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    for name in ["holder", "victim"] {
        assert_eq!(
            pods::create(&api, &pods::task_pod(name, 120)).await?,
            CreateOutcome::Created
        );
        pods::wait_running(&api, name).await?;
    }
    // A holder that stays terminating (nothing ends it): each colliding
    // Create needs a confirmation read, which leaves a connection in the pool.
    pods::delete_gracefully(&api, "holder", None).await?;
    assert_eq!(
        until_graceguard_denies(&api, "holder", Duration::from_secs(10)).await?,
        1
    );

    let frozen = proxy.stall().await;
    let stalled = Instant::now();
    // The pod and namespace watches at least, and the pooled connection.
    assert!(frozen >= 3, "only {frozen} connections were open to freeze");

    // Denials: a read on a silent connection times out (the Create fails
    // open), a later one goes over a new connection.
    until_graceguard_denies(&api, "holder", Duration::from_secs(30)).await?;

    // Tagging: the kubelet reports its own disruption; the follow-up reads
    // and patches through the proxy, retrying past silent connections.
    pods::delete_gracefully(&api, "victim", None).await?;
    kubelet
        .terminate_with_disruption(&ns, "victim", "TerminationByKubelet", "node shutting down")
        .await?;
    pods::wait_label(&api, "victim", LABEL, "TerminationByKubelet").await?;
    let tagged = webhook
        .wait_record(|r| r["event"] == "follow_up" && r["name"] == "victim")
        .await?;
    assert_eq!(tagged["reason"], "tagged", "{tagged}");

    // The index: a pod created after the stall is known once the silent pod
    // watch is given up and re-opened; then a Create colliding with it is
    // graceguard's 409 again (before, storage's: the index missed it).
    assert_eq!(
        pods::create(&api, &pods::task_pod("newcomer", 120)).await?,
        CreateOutcome::Created
    );
    pods::delete_gracefully(&api, "newcomer", None).await?;
    let bound = Duration::from_secs(u64::from(WATCH_TIMEOUT_SECS) + 5);
    // kube's default (290 s + 5 s) would keep the index stale past this.
    let left = (bound + Duration::from_secs(40)).saturating_sub(stalled.elapsed());
    until_graceguard_denies(&api, "newcomer", left.max(Duration::from_secs(5))).await?;
    Ok(())
}

/// The guard's sidecar reaches the API server through the proxy, and its
/// connections go silent while its Lease (600 s) cannot lapse, so its fence
/// stays open and nothing else makes it list again: the end of its task's
/// pod must reach it over a new connection within the guard's own bounds
/// (`api_timeouts`: a silent watch given up 20 s in, a call on a silent
/// pooled connection 25 s after it was sent), not kube's 295 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_whose_connections_go_silent_sees_its_pods_again_while_it_holds_its_lease() -> R {
    use graceguard::runtime::{READ_TIMEOUT, WATCH_TIMEOUT_SECS as GUARD_WATCH_SECS};
    let (bed, ns) = audited_bed("silent").await?;
    let upstream = bed.apiserver_addr()?;
    let proxy = StallingProxy::start(upstream).await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let sidecar = SidecarProcess::start_via(
        &bed,
        ("silent", &ns, "silent"),
        bed.kubeconfig_via("alice", &proxy.url())?,
        600,
    )
    .await?;
    let template = serde_json::to_value(pods::task_pod("template", 30))?;
    let task = format!("/v1/tasks/{ns}/t");
    let (code, st) = sidecar
        .request(
            "PUT",
            &task,
            Some(&serde_json::json!({ "template": template })),
        )
        .await?;
    anyhow::ensure!(code == 201, "PUT: {code} {st}");
    let phase = || async {
        let (_, st) = sidecar.request("GET", &task, None).await?;
        anyhow::Ok(st["phase"].as_str().unwrap_or_default().to_string())
    };
    let started = Instant::now();
    while phase().await? != "Running" {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the task never ran; the sidecar's log: {}",
            sidecar.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let frozen = proxy.stall().await;
    let stalled = Instant::now();
    assert!(
        frozen >= 1,
        "no connection was open to freeze (the pod watch at least)"
    );
    kubelet.end_pod(&ns, "t-0", Terminal::Succeeded).await?;
    // The watch given up, then a few silent pooled connections at one read
    // timeout each, and room for a loaded machine; kube's defaults take
    // 295 s before the first retry.
    let bound = Duration::from_secs(u64::from(GUARD_WATCH_SECS) + 5) + READ_TIMEOUT * 4;
    while phase().await? != "Succeeded" {
        anyhow::ensure!(
            stalled.elapsed() < bound,
            "the sidecar did not see its pod end within {bound:?} of its connections going silent ({frozen} frozen); its log: {}",
            sidecar.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let seen = stalled.elapsed();
    let (_, health) = sidecar.request("GET", "/healthz", None).await?;
    assert_eq!(
        health["holds_lease"], true,
        "it recovered by its own bounds, not by losing its Lease and listing again: {health}"
    );
    println!("the pod's end reached the sidecar {seen:?} after {frozen} connections went silent");
    Ok(())
}
