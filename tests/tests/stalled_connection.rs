//! The webhook reaches the API server through a proxy whose open connections
//! go silent at once ([`StallingProxy`]), as when a load balancer or a NAT
//! entry drops them without a reset: nothing errors, bytes just stop. Every
//! call graceguard makes has its own bound, so each recovers over a new
//! connection: confirmation reads (1 s, then the Create is allowed), follow-up
//! reads and patches (5 s each, retried), and the watches behind the indexes
//! (re-opened every `WATCH_TIMEOUT_SECS`, abandoned 5 s past it when silent).
//! Both Kubernetes versions.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use graceguard_webhook::meta_index::WATCH_TIMEOUT_SECS;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use testbed::kubelet::{Kubelet, KubeletOptions};
use testbed::pods::{self, CreateOutcome};
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
    let upstream: SocketAddr = bed
        .url
        .strip_prefix("https://")
        .unwrap_or(&bed.url)
        .parse()
        .context("the bed's API server address")?;
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
