//! The guard's bounds against a real kube-apiserver, with the simulated
//! kubelet: a pod stuck Pending, a pod stuck Terminating, the task deadline
//! and the total system-failure bound. The guard acts as `alice`; her
//! requests are counted from the API server's audit log.

use std::time::{Duration, Instant};

use graceguard::{FailureKind, TaskSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use scenarios::guard_task::{audited_bed, summary, RunningTask};
use testbed::audit_log::AuditEvent;
use testbed::kubelet::{FinishDeletions, Kubelet, KubeletOptions};
use testbed::{pods, TestBed};

type R = anyhow::Result<()>;

const MIN: Duration = Duration::from_secs(60);

async fn bed() -> anyhow::Result<(TestBed, String, kube::Client)> {
    let (bed, ns) = audited_bed("bounds").await?;
    let alice = bed.client_as("alice").await?;
    Ok((bed, ns, alice))
}

fn alice(e: &AuditEvent, verb: &str, ns: &str) -> bool {
    e.is(verb, "pods", ns) && e.user.username == "alice"
}

fn spec(task: &str, ns: &str) -> TaskSpec {
    TaskSpec {
        retries: 0,
        max_system_failures: 2,
        ..TaskSpec::new(task, ns, "exec-1")
    }
}

/// A pod that stays Pending (its kubelet never starts it) is deleted after
/// the pending timeout; its deletion never completes (no kubelet confirms
/// it), so past its grace period plus the terminating ceiling a Warning event
/// is published and the task moves on to the next name while the stuck pod
/// still exists. Two such system failures in a row end the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_pending_then_stuck_terminating_are_bounded() -> R {
    let (bed, ns, alice_client) = bed().await?;
    let _kubelet = Kubelet::start(
        &bed,
        KubeletOptions {
            run_pods: false,
            finish_deletions: FinishDeletions::Manual,
            ..Default::default()
        },
    )
    .await?;
    let mut s = spec("stuck", &ns);
    s.bounds.pending_timeout_seconds = Some(2);
    s.bounds.terminating_ceiling_seconds = Some(2);
    let task = RunningTask::start(alice_client, s, pods::task_pod("template", 1));
    let (outcome, seen) = task.finish(Duration::from_secs(120)).await?;
    assert_eq!(
        outcome.failure_kind,
        Some(FailureKind::System),
        "{outcome:?}"
    );
    let reason = outcome.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("2 consecutive system failures") && reason.contains("TerminatingTooLong"),
        "{reason}"
    );
    assert_eq!(
        summary(&seen),
        [
            "Launching@0",
            "Queued@0",
            "ShuttingDown/PendingTimeout@0",
            "Launching@1",
            "Queued@1",
            "ShuttingDown/PendingTimeout@1",
            "Failed/2 consecutive system failures (last@1"
        ]
    );
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    // Attempt 1 was created while attempt 0 was still terminating.
    assert!(api
        .get("stuck-0")
        .await?
        .metadata
        .deletion_timestamp
        .is_some());
    let log = bed.audit_log()?;
    assert_eq!(log.count(|e| alice(e, "create", &ns))?, 2);
    assert_eq!(
        log.count(|e| alice(e, "delete", &ns))?,
        2,
        "one delete per timed-out pod"
    );
    // The Warning event on the stuck pod says what happened.
    pods::wait_warning(
        &bed.client,
        &ns,
        "stuck-0",
        "TerminatingTooLong",
        Duration::from_secs(10),
    )
    .await?;
    Ok(())
}

/// Past the task deadline the running pod is deleted (uid precondition) and
/// the task fails `DeadlineExceeded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_deadline_deletes_the_pod_and_fails_the_task() -> R {
    let (bed, ns, alice_client) = bed().await?;
    let _kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let mut s = spec("slow", &ns);
    // Long enough for the simulated kubelet to start the pod on a busy machine.
    s.bounds.deadline_seconds = Some(10);
    let mut task = RunningTask::start(alice_client, s, pods::task_pod("template", 30));
    task.wait_for(MIN, |t| t.phase == "Running").await?;
    let (outcome, _) = task.finish(MIN).await?;
    assert!(!outcome.succeeded);
    assert!(
        outcome
            .reason
            .clone()
            .unwrap_or_default()
            .starts_with("DeadlineExceeded"),
        "{outcome:?}"
    );
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(10);
    while api
        .get("slow-0")
        .await?
        .metadata
        .deletion_timestamp
        .is_none()
    {
        assert!(Instant::now() < deadline, "the pod was not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(bed.audit_log()?.count(|e| alice(e, "delete", &ns))?, 1);
    Ok(())
}

/// A task preempted after every start: Running resets the consecutive count,
/// but the total bound ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempted_after_every_start_is_bounded_in_total() -> R {
    let (bed, ns, alice_client) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let mut s = spec("again", &ns);
    s.max_system_failures = 5;
    s.bounds.max_total_system_failures = 2;
    let mut task = RunningTask::start(alice_client, s, pods::task_pod("template", 30));
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    for attempt in 0..2u32 {
        let name = format!("again-{attempt}");
        task.wait_for(MIN, |t| t.phase == "Running" && t.attempt == attempt)
            .await?;
        kubelet.mark_preempted(&ns, &name).await?;
        pods::delete_gracefully(&api, &name, None).await?;
        task.wait_for(MIN, |t| t.phase == "ShuttingDown" && t.attempt == attempt)
            .await?;
        kubelet.finish_deletion(&ns, &name).await?;
    }
    let (outcome, _) = task.finish(MIN).await?;
    assert_eq!(outcome.failure_kind, Some(FailureKind::System));
    assert!(
        outcome
            .reason
            .clone()
            .unwrap_or_default()
            .contains("2 system failures in all"),
        "{outcome:?}"
    );
    assert_eq!(
        bed.audit_log()?.count(|e| alice(e, "create", &ns))?,
        2,
        "no third attempt"
    );
    Ok(())
}
