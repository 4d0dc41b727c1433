//! What a real kube-apiserver does without graceguard: the failure graceguard
//! exists for. Every number here is read back from the API server.

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use scenarios::scenario::{graceful_delete_collision, POD};
use testbed::kubelet::{Kubelet, KubeletOptions};
use testbed::pods::{self, CreateOutcome};
use testbed::{quota, TestBed};

type R = anyhow::Result<()>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_colliding_create_is_already_exists_and_leaks_one_quota_charge() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("leak").await?;
    let n = 10;
    let r = graceful_delete_collision(&bed, &ns, "bare", n, 100).await?;
    assert_eq!(r.already_exists, n, "{r:?}");
    assert_eq!(r.forbidden + r.other, 0, "{r:?}");
    assert!(r.first_answer.contains("being deleted"), "{r:?}");
    // The charge of every failed Create stays: used grows by exactly n.
    assert_eq!(r.leaked_quota_charges, i64::from(n), "{r:?}");
    assert_eq!(quota::used_pods(&bed.client, &ns).await?, 1 + i64::from(n));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_quota_full_the_colliding_create_is_forbidden_not_already_exists() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("full").await?;
    // hard = 1: the original pod fills the quota.
    let r = graceful_delete_collision(&bed, &ns, "bare", 3, 1).await?;
    assert_eq!(r.forbidden, 3, "{r:?}");
    assert_eq!(r.first_answer_code, 403, "{r:?}");
    assert!(r.first_answer.contains("exceeded quota"), "{r:?}");
    assert_eq!(r.leaked_quota_charges, 0, "{r:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_the_kubelet_finishes_the_deletion_the_name_can_be_created_again() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("reuse").await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let r = graceful_delete_collision(&bed, &ns, "bare", 1, 100).await?;
    assert_eq!(r.already_exists, 1, "{r:?}");

    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let uid = api.get(POD).await?.uid();
    kubelet.finish_deletion(&ns, POD).await?;
    pods::wait_gone(&api, POD, uid.as_deref().unwrap_or("")).await?;
    assert_eq!(
        pods::create(&api, &pods::task_pod(POD, 60)).await?,
        CreateOutcome::Created
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulated_kubelet_runs_pods_and_finishes_deletions_after_a_share_of_grace() -> R {
    use testbed::kubelet::FinishDeletions;
    let bed = TestBed::start().await?;
    let ns = bed.namespace("kubelet").await?;
    let _kubelet = Kubelet::start(
        &bed,
        KubeletOptions {
            finish_deletions: FinishDeletions::AfterShareOfGrace(0.1),
            ..Default::default()
        },
    )
    .await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    assert_eq!(
        pods::create(&api, &pods::task_pod("p", 10)).await?,
        CreateOutcome::Created
    );
    pods::wait_running(&api, "p").await?;
    let uid = api.get("p").await?.uid().unwrap_or_default();
    pods::delete_gracefully(&api, "p", None).await?;
    // Terminating first (grace 10 s, finished after ~1 s)...
    assert!(api.get("p").await?.metadata.deletion_timestamp.is_some());
    // ...then gone, without the test deleting it.
    pods::wait_gone(&api, "p", &uid).await?;
    assert!(api.get_opt("p").await?.is_none());
    Ok(())
}
