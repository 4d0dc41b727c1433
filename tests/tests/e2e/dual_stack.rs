//! The listeners as the chart runs them on a pod network, `[::]`: the real
//! API server calls graceguard over IPv6 (`https://[::1]:PORT`, the way it
//! reaches a Service on an IPv6 single-stack cluster), while IPv4 clients
//! (the kubelet's probes here, on 127.0.0.1) are served by the same socket.
//! This is loopback; `helm_install`'s `on_an_ipv6_single_stack_cluster_…`
//! runs the chart on an IPv6 pod network.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use testbed::pods::{self, CreateOutcome};
use testbed::webhook::{Hook, WebhookProcess};
use testbed::TestBed;

type R = anyhow::Result<()>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_dual_stack_listener_the_api_server_reviews_over_ipv6_and_ipv4_probes_are_served() -> R
{
    let bed = TestBed::start().await?;
    // Ready means its health port answered over IPv4 (127.0.0.1).
    let webhook = WebhookProcess::start_dual_stack(&bed, &[]).await?;
    anyhow::ensure!(webhook.url.starts_with("https://[::1]:"), "{}", webhook.url);
    webhook.register(&bed, &[Hook::CollisionGuard]).await?;
    let ns = bed.namespace("dual").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let pod = pods::task_pod_on("over-ipv6", 1, None);
    assert_eq!(pods::create(&api, &pod).await?, CreateOutcome::Created);
    let recs = webhook
        .wait_records("collision_guard", &ns, "over-ipv6", 1)
        .await?;
    assert_eq!(recs[0]["decision"], "allow", "{recs:?}");
    assert_eq!(
        recs[0]["peer"], "::1",
        "the API server's review came over IPv6: {recs:?}"
    );
    let metrics = bed.apiserver_metrics().await?;
    let failed_open =
        testbed::load::histogram::sum(&metrics, "apiserver_admission_webhook_fail_open_count", &[]);
    assert_eq!(failed_open, 0.0, "every call over IPv6 answered");
    Ok(())
}
