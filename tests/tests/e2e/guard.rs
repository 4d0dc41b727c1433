//! The guard against a real kube-apiserver, with the simulated kubelet;
//! requests are counted from the apiserver's audit log. The guard runs as
//! user `alice`, so its requests are told apart from the test's own.

use std::time::{Duration, Instant};

use graceguard::core::template::Template;
use graceguard::runtime::adoption::{Adopter, Found};
use graceguard::FailureKind;
use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use scenarios::guard_task::{
    audited_bed, instance_lease, managed_pod, spec, summary, RunningTask, DEAD, LIVE,
};
use testbed::audit_log::AuditEvent;
use testbed::kubelet::{FinishDeletions, Kubelet, KubeletOptions, Terminal};
use testbed::pods::{self, CreateOutcome};
use testbed::{quota, TestBed};

type R = anyhow::Result<()>;

const MIN: Duration = Duration::from_secs(60);

fn alice_creates(e: &AuditEvent, ns: &str) -> bool {
    e.is("create", "pods", ns) && e.user.username == "alice"
}

async fn bed() -> anyhow::Result<(TestBed, String, kube::Client)> {
    let (bed, ns) = audited_bed("guard").await?;
    let alice = bed.client_as("alice").await?;
    Ok((bed, ns, alice))
}

/// Waits until the audit log has at least `n` events matching `pred`
/// (it is written as requests complete).
async fn audit_count(
    bed: &TestBed,
    n: usize,
    pred: impl Fn(&AuditEvent) -> bool,
) -> anyhow::Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let c = bed.audit_log()?.count(&pred)?;
        if c >= n || Instant::now() > deadline {
            return Ok(c);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_attempt_is_waited_out_then_one_create_under_the_next_name() -> R {
    let (bed, ns, alice) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let mut task = RunningTask::start(alice, spec("train", &ns), pods::task_pod("template", 30));
    task.wait_for(MIN, |t| t.phase == "Running" && t.attempt == 0)
        .await?;

    // kube-scheduler marks the pod, then deletes it gracefully (the flyteorg/flyte#8066 trigger).
    kubelet.mark_preempted(&ns, "train-0").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    pods::delete_gracefully(&api, "train-0", None).await?;
    let t = task.wait_for(MIN, |t| t.phase == "ShuttingDown").await?;
    assert_eq!(t.reason.as_deref(), Some("PreemptionByScheduler"));

    // While the old pod exists (Terminating for up to 30 s), no Create at all.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(api
        .get("train-0")
        .await?
        .metadata
        .deletion_timestamp
        .is_some());
    assert_eq!(
        bed.audit_log()?.count(|e| alice_creates(e, &ns))?,
        1,
        "only attempt 0's Create so far"
    );

    kubelet.finish_deletion(&ns, "train-0").await?;
    task.wait_for(MIN, |t| t.phase == "Running" && t.attempt == 1)
        .await?;
    kubelet.end_pod(&ns, "train-1", Terminal::Succeeded).await?;
    let (outcome, seen) = task.finish(MIN).await?;
    assert!(outcome.succeeded, "{outcome:?}");
    assert_eq!(
        outcome.user_failures, 0,
        "the user's retry budget is untouched"
    );
    assert_eq!(outcome.attempts, 2);
    assert_eq!(
        summary(&seen),
        [
            "Launching@0",
            "Queued@0",
            "Running@0",
            "ShuttingDown/PreemptionByScheduler@0",
            "Launching@1",
            "Queued@1",
            "Running@1",
            "Succeeded@1"
        ]
    );
    // Exactly one Create after the old pod was gone, under the next name.
    let creates: Vec<String> = bed
        .audit_log()?
        .events()?
        .into_iter()
        .filter(|e| alice_creates(e, &ns))
        .map(|e| e.name().to_string())
        .collect();
    assert_eq!(creates, ["train-0", "train-1"]);

    // Each transition is also a Kubernetes Event on the pod.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(bed.client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(10);
    let reasons = loop {
        let reasons: Vec<(String, String)> = events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .map(|e| {
                let pod = e.regarding.and_then(|r| r.name).unwrap_or_default();
                (pod, e.reason.unwrap_or_default())
            })
            .collect();
        let shutting_down = reasons
            .iter()
            .any(|(p, r)| p == "train-0" && r == "ShuttingDown");
        let succeeded = reasons
            .iter()
            .any(|(p, r)| p == "train-1" && r == "Succeeded");
        if (shutting_down && succeeded) || Instant::now() > deadline {
            break reasons;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        reasons.contains(&("train-0".into(), "ShuttingDown".into())),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&("train-1".into(), "Succeeded".into())),
        "{reasons:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_quota_is_waited_out_with_backoff_without_spending_attempts() -> R {
    let (bed, ns, alice) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    // One pod fills the quota (charged by the admission plugin, as any Create).
    quota::set_pods_quota(&bed, &ns, 1).await?;
    let admin: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    assert_eq!(
        pods::create(&admin, &pods::task_pod("filler", 0)).await?,
        CreateOutcome::Created
    );
    let mut task = RunningTask::start(alice, spec("wait", &ns), pods::task_pod("template", 30));
    task.wait_for(MIN, |t| t.phase == "WaitingForResources")
        .await?;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(20)).await;
    // Backoff 1, 2, 4, 8 s (+ jitter up to 2x): about log2(20) Creates, not hundreds.
    let refused = bed.audit_log()?.count(|e| alice_creates(e, &ns))?;
    assert!(
        (3..=7).contains(&refused),
        "{refused} Creates in {:?} of full quota",
        started.elapsed()
    );
    assert!(task.seen.iter().all(|t| t.attempt == 0), "{:?}", task.seen);

    // The filler goes; the quota controller frees its charge.
    kubelet.finish_deletion(&ns, "filler").await?;
    quota::released(&bed, &ns).await?;
    let queued = task
        .wait_for(Duration::from_secs(90), |t| t.phase == "Queued")
        .await?;
    assert_eq!(queued.pod, "wait-0", "no attempt was consumed");
    task.wait_for(MIN, |t| t.phase == "Running").await?;
    kubelet.end_pod(&ns, "wait-0", Terminal::Succeeded).await?;
    let (outcome, seen) = task.finish(MIN).await?;
    assert!(outcome.succeeded);
    assert_eq!(outcome.attempts, 1);
    assert_eq!(
        summary(&seen),
        [
            "Launching@0",
            "WaitingForResources@0",
            "Queued@0",
            "Running@0",
            "Succeeded@0"
        ]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_larger_than_the_hard_limit_fails_at_once() -> R {
    let (bed, ns, alice) = bed().await?;
    quota::set_quota(&bed, &ns, &[("pods", "10"), ("requests.cpu", "1")]).await?;
    let mut template = pods::task_pod("template", 30);
    if let Some(c) = template
        .spec
        .as_mut()
        .and_then(|s| s.containers.first_mut())
    {
        c.resources = Some(ResourceRequirements {
            requests: Some([("cpu".to_string(), Quantity("2".into()))].into()),
            ..Default::default()
        });
    }
    let task = RunningTask::start(alice, spec("big", &ns), template);
    let (outcome, seen) = task.finish(MIN).await?;
    assert!(!outcome.succeeded);
    assert_eq!(outcome.failure_kind, Some(FailureKind::User));
    let reason = outcome.reason.unwrap_or_default();
    assert!(
        reason.starts_with("ResourceRequestsExceedLimits"),
        "{reason}"
    );
    assert!(
        reason.contains("cpu=2") && reason.contains("cpu=1"),
        "{reason}"
    );
    assert_eq!(
        summary(&seen),
        ["Launching@0", "Failed/ResourceRequestsExceedLimits@0"]
    );
    assert_eq!(audit_count(&bed, 1, |e| alice_creates(e, &ns)).await?, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_pod_holding_the_name_is_a_name_conflict_not_queued() -> R {
    let (bed, ns, alice) = bed().await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    assert_eq!(
        pods::create(&api, &pods::task_pod("report-0", 30)).await?,
        CreateOutcome::Created
    );
    let task = RunningTask::start(alice, spec("report", &ns), pods::task_pod("template", 30));
    let (outcome, seen) = task.finish(MIN).await?;
    assert_eq!(outcome.failure_kind, Some(FailureKind::System));
    assert!(
        outcome
            .reason
            .clone()
            .unwrap_or_default()
            .starts_with("NameConflict"),
        "{outcome:?}"
    );
    assert!(seen.iter().all(|t| t.phase != "Queued"), "{seen:?}");
    assert_eq!(summary(&seen), ["Launching@0", "Failed/NameConflict@0"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_deletions_in_a_row_fail_the_task_as_a_system_failure() -> R {
    let (bed, ns, alice) = bed().await?;
    // Pods never reach Running; every deletion finishes at once.
    let _kubelet = Kubelet::start(
        &bed,
        KubeletOptions {
            run_pods: false,
            finish_deletions: FinishDeletions::AfterShareOfGrace(0.0),
            ..Default::default()
        },
    )
    .await?;
    let mut task = RunningTask::start(alice, spec("flaky", &ns), pods::task_pod("template", 30));
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    for attempt in 0..3 {
        let t = task
            .wait_for(MIN, |t| t.phase == "Queued" && t.attempt == attempt)
            .await?;
        pods::delete_gracefully(&api, &t.pod, None).await?;
    }
    let (outcome, seen) = task.finish(MIN).await?;
    assert!(!outcome.succeeded);
    assert_eq!(outcome.failure_kind, Some(FailureKind::System));
    let reason = outcome.reason.unwrap_or_default();
    assert!(reason.contains("3 consecutive system failures"), "{reason}");
    assert_eq!(outcome.user_failures, 0);
    assert_eq!(outcome.system_failures, 3);
    assert_eq!(seen.last().map(|t| t.attempt), Some(2));
    assert_eq!(audit_count(&bed, 3, |e| alice_creates(e, &ns)).await?, 3);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_pods_of_a_dead_instance_are_adopted_exactly_once() -> R {
    let (bed, ns, alice) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    instance_lease(&bed, &ns, "dead-exec", DEAD).await?;
    instance_lease(&bed, &ns, "live-exec", LIVE).await?;
    // Never renewed, for 10 s: it lapses about 10 s after the adopter
    // first sees it.
    instance_lease(&bed, &ns, "dying-exec", 10).await?;
    for i in 0..30 {
        let name = format!("old-{i}-0");
        api.create(&PostParams::default(), &managed_pod(&name, "dead-exec"))
            .await?;
        let phase = if i % 3 == 0 {
            Terminal::Failed
        } else {
            Terminal::Succeeded
        };
        kubelet.end_pod(&ns, &name, phase).await?;
    }
    for i in 0..5 {
        api.create(
            &PostParams::default(),
            &managed_pod(&format!("live-{i}-0"), "live-exec"),
        )
        .await?;
    }
    api.create(
        &PostParams::default(),
        &managed_pod("dying-0", "dying-exec"),
    )
    .await?;
    kubelet.end_pod(&ns, "dying-0", Terminal::Succeeded).await?;
    // A dead instance's pod that never completes: deleted, it is reported gone.
    api.create(&PostParams::default(), &managed_pod("lost-0", "dead-exec"))
        .await?;
    // An instance with no Lease here: whether it lives is unknown, never
    // "dead": its completed pod is not adopted, its deleted one not reported.
    api.create(
        &PostParams::default(),
        &managed_pod("unowned-0", "leaseless-exec"),
    )
    .await?;
    kubelet
        .end_pod(&ns, "unowned-0", Terminal::Succeeded)
        .await?;
    api.create(
        &PostParams::default(),
        &managed_pod("unowned-lost-0", "leaseless-exec"),
    )
    .await?;

    let mut adopter = Adopter::new(alice, &ns, &ns, "me");
    let mut delivered = Vec::new();
    let mut gone = Vec::new();
    let mut dying_seen_at = None;
    let started = Instant::now();
    for round in 0.. {
        if started.elapsed() > Duration::from_secs(45) {
            break;
        }
        // Ongoing events: the live instance's pods keep changing.
        let patch = serde_json::json!({"metadata": {"annotations": {"round": round.to_string()}}});
        api.patch(
            &format!("live-{}-0", round % 5),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        if round == 10 {
            // A live instance's pod completing is its own business.
            kubelet
                .end_pod(&ns, "live-0-0", Terminal::Succeeded)
                .await?;
            pods::delete_gracefully(&api, "lost-0", Some(0)).await?;
            pods::delete_gracefully(&api, "unowned-lost-0", Some(0)).await?;
        }
        for found in adopter.sync(Duration::from_millis(300)).await? {
            match found {
                Found::Completed(p) => {
                    // Delivered; the caller acknowledges, only then is it marked done.
                    let marked = adopter.ack(&p).await;
                    assert!(marked.is_done(), "{p:?}: {marked:?}");
                    if p.name == "dying-0" {
                        dying_seen_at = Some(started.elapsed());
                    }
                    delivered.push(p.name);
                }
                Found::Gone(p) => gone.push(p.name),
            }
        }
        if dying_seen_at.is_some() && delivered.len() >= 31 && round >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut names = delivered.clone();
    names.sort();
    names.dedup();
    assert_eq!(
        delivered.len(),
        31,
        "each completed pod delivered exactly once: {delivered:?}"
    );
    assert_eq!(names.len(), 31);
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("old-") || n == "dying-0"),
        "{names:?}"
    );
    assert!(
        dying_seen_at.is_some(),
        "a pod whose owner's Lease expired later is picked up then"
    );
    assert_eq!(gone, ["lost-0"], "deleted before completing: reported gone");
    let patches = audit_count(&bed, 62, |e| {
        e.verb == "patch"
            && e.user.username == "alice"
            && e.object_ref.as_ref().is_some_and(|o| o.resource == "pods")
    })
    .await?;
    assert_eq!(
        patches, 62,
        "a claim and a done-mark per pod (apache/airflow#68683 would make ~1500)"
    );
    let done = api
        .list(&kube::api::ListParams::default().labels("graceguard.io/done=true"))
        .await?;
    assert_eq!(done.items.len(), 31);
    Ok(())
}

/// Attempt `attempt` of `task` as executor `instance` launched it.
fn managed_attempt(task: &str, attempt: u32, instance: &str) -> Pod {
    let mut p = managed_pod(&format!("{task}-0"), instance);
    p.metadata.name = Some(format!("{task}-{attempt}"));
    if let Some(l) = p.metadata.labels.as_mut() {
        l.insert(
            graceguard::core::naming::ATTEMPT_LABEL.into(),
            attempt.to_string(),
        );
    }
    p
}

/// Adoption goes by task: of a dead instance's task only the latest attempt
/// is delivered, once it has ended; an earlier attempt that ended is marked
/// done without being delivered (its owner had gone on to the next), and
/// an earlier attempt's deletion is not reported gone. Before, each pod was
/// its own result: `x-0` Failed and `x-1` Running made two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instances_task_is_delivered_once_by_its_latest_attempt() -> R {
    let (bed, ns, alice) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    instance_lease(&bed, &ns, "dead-exec", DEAD).await?;
    // x: 0 failed, 1 still runs. y: 0 failed, 1 succeeded. z: 0 succeeded,
    // 1 runs and is deleted before it ends.
    for (task, attempt, end) in [
        ("x", 0, Some(Terminal::Failed)),
        ("x", 1, None),
        ("y", 0, Some(Terminal::Failed)),
        ("y", 1, Some(Terminal::Succeeded)),
        ("z", 0, Some(Terminal::Succeeded)),
        ("z", 1, None),
    ] {
        let pod = managed_attempt(task, attempt, "dead-exec");
        let name = pod.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &pod).await?;
        match end {
            Some(phase) => kubelet.end_pod(&ns, &name, phase).await?,
            None => pods::wait_running(&api, &name).await?,
        }
    }
    let done = || async {
        let l = api
            .list(&kube::api::ListParams::default().labels("graceguard.io/done=true"))
            .await?;
        let mut names: Vec<String> = l
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        names.sort();
        anyhow::Ok(names)
    };
    let mut adopter = Adopter::new(alice, &ns, &ns, "me");
    let (mut delivered, mut gone) = (Vec::new(), Vec::new());
    let mut step = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        for found in adopter.sync(Duration::from_millis(300)).await? {
            match found {
                Found::Completed(p) => {
                    let marked = adopter.ack(&p).await;
                    assert!(marked.is_done(), "{p:?}: {marked:?}");
                    delivered.push(p.name);
                }
                Found::Gone(p) => gone.push(p.name),
            }
        }
        // First: y-1 alone is delivered; x-0, y-0 and z-0 are done unseen.
        if step == 0 && done().await? == ["x-0", "y-0", "y-1", "z-0"] {
            assert_eq!(delivered, ["y-1"], "only the ended latest attempt");
            step = 1;
            kubelet.end_pod(&ns, "x-1", Terminal::Succeeded).await?;
            pods::delete_gracefully(&api, "z-1", Some(0)).await?;
        }
        if step == 1 && delivered.len() == 2 && gone.len() == 1 {
            break;
        }
    }
    assert_eq!(delivered, ["y-1", "x-1"], "one result per task");
    assert_eq!(gone, ["z-1"], "the latest attempt went without a result");
    assert_eq!(done().await?, ["x-0", "x-1", "y-0", "y-1", "z-0"]);
    Ok(())
}

/// A dead instance's pods that the result finalizer keeps after their
/// deletion are still delivered: one that had succeeded, and one stopped
/// before it ended whose kubelet posted no terminal phase (as before 1.22:
/// delivered `Failed`, reason `Deleted`). The done-mark after each
/// acknowledgement lets go, and the pod leaves the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instances_pods_kept_by_the_finalizer_are_delivered_then_let_go() -> R {
    let (bed, ns, alice) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    instance_lease(&bed, &ns, "dead-exec", DEAD).await?;
    let mut uids = Vec::new();
    for name in ["ok-0", "cut-0"] {
        let mut p = managed_pod(name, "dead-exec");
        p.metadata.finalizers = Some(vec![graceguard::core::naming::RESULT_FINALIZER.into()]);
        let made = api.create(&PostParams::default(), &p).await?;
        uids.push(made.metadata.uid.unwrap_or_default());
        pods::wait_running(&api, name).await?;
    }
    kubelet.end_pod(&ns, "ok-0", Terminal::Succeeded).await?;
    for name in ["ok-0", "cut-0"] {
        pods::delete_gracefully(&api, name, Some(0)).await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        api.get_opt("cut-0").await?.is_some(),
        "kept by the finalizer"
    );
    let mut adopter = Adopter::new(alice, &ns, &ns, "me");
    let mut delivered = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while delivered.len() < 2 && Instant::now() < deadline {
        for found in adopter.sync(Duration::from_millis(300)).await? {
            match found {
                Found::Completed(p) => {
                    let marked = adopter.ack(&p).await;
                    assert!(marked.is_done(), "{p:?}: {marked:?}");
                    delivered.push((p.name, p.phase, p.reason));
                }
                Found::Gone(p) => anyhow::bail!("reported gone, not delivered: {p:?}"),
            }
        }
    }
    delivered.sort();
    assert_eq!(
        delivered,
        [
            (
                "cut-0".to_string(),
                "Failed".to_string(),
                Some("Deleted".to_string())
            ),
            (
                "ok-0".to_string(),
                "Succeeded".to_string(),
                Some("Deleted".to_string())
            ),
        ]
    );
    for (name, uid) in ["ok-0", "cut-0"].iter().zip(&uids) {
        pods::wait_gone(&api, name, uid).await?;
    }
    Ok(())
}

/// Two adopters racing for the same completed pods: each pod is claimed by
/// exactly one of them (conditional writes), and marked done once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_adopters_exactly_one_wins_each_pod() -> R {
    let (bed, ns, alice) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    instance_lease(&bed, &ns, "dead-exec", DEAD).await?;
    // Both adopters are alive: a claim by one is respected by the other.
    instance_lease(&bed, &ns, "adopter-a", LIVE).await?;
    instance_lease(&bed, &ns, "adopter-b", LIVE).await?;
    for i in 0..20 {
        let name = format!("old-{i}-0");
        api.create(&PostParams::default(), &managed_pod(&name, "dead-exec"))
            .await?;
        kubelet.end_pod(&ns, &name, Terminal::Succeeded).await?;
    }
    let mut a = Adopter::new(alice.clone(), &ns, &ns, "adopter-a");
    let mut b = Adopter::new(alice, &ns, &ns, "adopter-b");
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    // Until every pod went to one of them (by time: a sync returns at the
    // first event), then a few rounds more for a late second delivery.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut rounds_after = 0;
    while rounds_after < 5 && Instant::now() < deadline {
        if got_a.len() + got_b.len() >= 20 {
            rounds_after += 1;
        }
        let (fa, fb) = tokio::join!(
            a.sync(Duration::from_millis(300)),
            b.sync(Duration::from_millis(300))
        );
        for (found, got, who) in [(fa?, &mut got_a, &a), (fb?, &mut got_b, &b)] {
            for f in found {
                if let Found::Completed(p) = f {
                    let marked = who.ack(&p).await;
                    assert!(marked.is_done(), "{marked:?}");
                    got.push(p.name);
                }
            }
        }
    }
    let mut all: Vec<String> = got_a.iter().chain(&got_b).cloned().collect();
    all.sort();
    let total = all.len();
    all.dedup();
    assert_eq!((total, all.len()), (20, 20), "a: {got_a:?} b: {got_b:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_termination_is_a_system_failure_not_the_users() -> R {
    let (bed, ns, alice) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let mut task = RunningTask::start(alice, spec("evicted", &ns), pods::task_pod("template", 30));
    task.wait_for(MIN, |t| t.phase == "Running" && t.attempt == 0)
        .await?;
    // The kubelet's way: DisruptionTarget together with the terminal phase.
    kubelet
        .terminate_with_disruption(
            &ns,
            "evicted-0",
            "TerminationByKubelet",
            "node memory pressure",
        )
        .await?;
    task.wait_for(MIN, |t| t.phase == "Running" && t.attempt == 1)
        .await?;
    kubelet
        .end_pod(&ns, "evicted-1", Terminal::Succeeded)
        .await?;
    let (outcome, _) = task.finish(MIN).await?;
    assert!(outcome.succeeded, "{outcome:?}");
    assert_eq!((outcome.user_failures, outcome.system_failures), (0, 1));
    Ok(())
}

/// A Create whose answer never arrives (the API server made the pod, the
/// connection dropped the answer), with the watch held back until the guard
/// reads a pod by name: the guard reads the name and adopts its own pod
/// instead of sending the Create again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_create_outcome_adopts_the_pod_without_a_second_create() -> R {
    let (bed, ns, _) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let (client, armed) =
        testbed::faults::client_losing_first_pod_create(&bed.kubeconfig_for("alice")?).await?;
    let mut task = RunningTask::start(client, spec("lost", &ns), pods::task_pod("template", 30));
    task.wait_for(MIN, |t| t.phase == "Running").await?;
    assert!(
        !armed.load(std::sync::atomic::Ordering::SeqCst),
        "the first Create's answer was dropped"
    );
    kubelet.end_pod(&ns, "lost-0", Terminal::Succeeded).await?;
    let (outcome, seen) = task.finish(MIN).await?;
    assert!(outcome.succeeded, "{outcome:?}");
    assert_eq!(outcome.attempts, 1);
    assert_eq!(
        summary(&seen),
        ["Launching@0", "Queued@0", "Running@0", "Succeeded@0"]
    );
    assert_eq!(
        audit_count(&bed, 1, |e| alice_creates(e, &ns)).await?,
        1,
        "no second Create of a pod that exists"
    );
    // The answer was lost while the watch was held back: the guard read the
    // name.
    let reads = bed.audit_log()?.count(|e| {
        e.is("get", "pods", &ns) && e.user.username == "alice" && e.name() == "lost-0"
    })?;
    assert!(reads >= 1, "the name was read after the lost answer");
    Ok(())
}

/// The guard meets graceguard's adaptive answers for a name a foreign pod
/// holds while it terminates (its kubelet has not finished, and a finalizer
/// would keep it past that): two 409s (it reads the holder, sees it
/// deleting, waits), then 429s (it waits the Retry-After).
/// It spends nothing while it waits: with one transient retry allowed, a
/// 429 counted as transient would fail the task. Once the finalizer goes,
/// one Create makes attempt 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminating_holder_is_waited_out_through_graceguards_409s_and_429s_spending_nothing() -> R
{
    use testbed::webhook::{Hook, WebhookProcess};
    let (bed, ns, alice) = bed().await?;
    let webhook = WebhookProcess::start(&bed, &["--mode=adaptive"]).await?;
    webhook.register(&bed, &[Hook::CollisionGuard]).await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let mut holder = pods::task_pod("hold-0", 30);
    holder.metadata.finalizers = Some(vec!["graceguard.test/hold".into()]);
    assert_eq!(pods::create(&api, &holder).await?, CreateOutcome::Created);
    pods::delete_gracefully(&api, "hold-0", Some(30)).await?;

    let mut s = spec("hold", &ns);
    s.bounds.max_transient_retries = 1;
    let mut task = RunningTask::start(alice, s, pods::task_pod("template", 30));
    // Until graceguard has answered 429 three times (waits of 2 s and up).
    let codes = |w: &WebhookProcess| -> anyhow::Result<Vec<i64>> {
        Ok(w.records_for("collision_guard", &ns, "hold-0")?
            .iter()
            .filter(|r| r["decision"] == "deny")
            .filter_map(|r| r["code"].as_i64())
            .collect())
    };
    let deadline = Instant::now() + MIN;
    while codes(&webhook)?.iter().filter(|c| **c == 429).count() < 3 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "graceguard never answered 429 three times: {:?}; the task saw {:?}",
            codes(&webhook)?,
            task.seen
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        &codes(&webhook)?[..3],
        [409, 409, 429],
        "adaptive's answers"
    );
    api.patch(
        "hold-0",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    // Its container has stopped: the kubelet deletes the pod.
    kubelet.finish_deletion(&ns, "hold-0").await?;
    task.wait_for(MIN, |t| t.phase == "Running" && t.attempt == 0)
        .await?;
    assert!(
        task.seen
            .iter()
            .all(|t| t.attempt == 0 && t.phase != "Failed"),
        "the wait cost an attempt or failed the task: {:?}",
        summary(&task.seen)
    );
    let created = audit_count(&bed, 1, |e| {
        alice_creates(e, &ns) && e.response_status.as_ref().map(|r| r.code) == Some(201)
    })
    .await?;
    assert_eq!(created, 1, "one Create made attempt 0");
    task.handle.abort();
    Ok(())
}

/// A Role in `ns` granting `user` `verbs` on pods (and Events), bound.
async fn grant(bed: &TestBed, ns: &str, user: &str, name: &str, verbs: &[&str]) -> R {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": verbs},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        ],
    }))?;
    Api::<Role>::namespaced(bed.client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await?;
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))?;
    Api::<RoleBinding>::namespaced(bed.client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(())
}

/// DELETE before the executor's first pod list is in: the task ends
/// aborted once the list is in, and no pod is ever created for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_aborted_before_the_first_pod_list_is_never_launched() -> R {
    use graceguard::core::task::TaskKey;
    use graceguard::Executor;
    use graceguard::GuardConfig;
    let (bed, ns, _alice) = bed().await?;
    // carol may write pods but not list them yet: the executor's watch
    // cannot sync, as on a slow or briefly unreachable API server.
    grant(
        &bed,
        &ns,
        "carol",
        "carol-write",
        &["create", "get", "delete", "patch"],
    )
    .await?;
    let carol = bed.client_impersonating("carol", &[]).await?;
    let mut config = GuardConfig::new("exec-early");
    config.namespace = Some(ns.clone());
    let executor = Executor::start(carol, config);
    let key = TaskKey::new(&ns, "early");
    let st = executor
        .submit(
            spec("early", &ns),
            Template::from_pod(&pods::task_pod("template", 30))?,
        )
        .await?;
    assert!(!st.started, "{st:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !executor
            .stats()
            .synced
            .load(std::sync::atomic::Ordering::Relaxed),
        "the watch cannot list yet"
    );
    let st = executor.abort(&key).await?;
    assert!(st.cleanup_pending && !st.terminal, "{st:?}");
    // Now it may list: the watcher's retry syncs, and the abort is carried out.
    grant(&bed, &ns, "carol", "carol-read", &["list", "watch"]).await?;
    let outcome =
        tokio::time::timeout(Duration::from_secs(90), executor.wait_result(&key, |_| {})).await??;
    assert!(!outcome.succeeded);
    let reason = outcome.reason.unwrap_or_default();
    assert!(reason.starts_with("Aborted"), "{reason}");
    // Wait out any Create that would have been sent at the sync.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let creates = bed.audit_log()?.count(|e| e.is("create", "pods", &ns))?;
    assert_eq!(creates, 0, "an aborted task is never launched");
    Ok(())
}

/// 200 tasks of one executor waiting on a full quota: after each task's
/// first refused Create, the namespace sends one Create per backoff window
/// (the probe), not one per task, and none of the 200 spends an attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_tasks_waiting_on_a_full_quota_send_one_create_per_window() -> R {
    use graceguard::runtime::events::EventBody;
    use graceguard::Executor;
    use graceguard::GuardConfig;
    const N: usize = 200;
    let (bed, ns, alice) = bed().await?;
    quota::set_pods_quota(&bed, &ns, 1).await?;
    let admin: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    assert_eq!(
        pods::create(&admin, &pods::task_pod("filler", 0)).await?,
        CreateOutcome::Created
    );
    let mut config = GuardConfig::new("exec-herd");
    config.namespace = Some(ns.clone());
    config.publish_events = false;
    let executor = Executor::start(alice, config);
    for i in 0..N {
        executor
            .submit(
                spec(&format!("herd-{i}"), &ns),
                Template::from_pod(&pods::task_pod("template", 30))?,
            )
            .await?;
    }
    // Until every task has been refused once and waits.
    let mut waiting = std::collections::HashSet::new();
    let (mut after, deadline) = (0, Instant::now() + Duration::from_secs(120));
    while waiting.len() < N {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} of {N} tasks waiting after 120 s",
            waiting.len()
        );
        for e in executor
            .log()
            .after(after, 1000, Duration::from_secs(1))
            .await
        {
            after = e.seq;
            if let EventBody::Transition { transition, .. } = &e.body {
                anyhow::ensure!(transition.attempt == 0, "{transition:?}");
                if transition.phase == "WaitingForResources" {
                    waiting.insert(transition.task.clone());
                }
            }
        }
    }
    let mark_us = k8s_openapi::jiff::Timestamp::now().as_microsecond();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let mut probes: Vec<i64> = bed
        .audit_log()?
        .events()?
        .iter()
        .filter(|e| alice_creates(e, &ns))
        .filter_map(|e| e.received_us())
        .filter(|t| *t > mark_us)
        .collect();
    probes.sort();
    // Windows of 1, 2, 4, 8 s (each up to twice that): a handful of
    // Creates in 20 s, where one per task per window would be hundreds.
    assert!(
        (1..=8).contains(&probes.len()),
        "{} Creates in 20 s of full quota with {N} tasks waiting",
        probes.len()
    );
    // One per window: never two close together.
    let gaps: Vec<i64> = probes.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().all(|g| *g >= 900_000),
        "Creates closer than a window apart (µs): {gaps:?}"
    );
    // Nobody spent an attempt.
    for e in executor.log().after(after, 10_000, Duration::ZERO).await {
        if let EventBody::Transition { transition, .. } = &e.body {
            assert_eq!(transition.attempt, 0, "{transition:?}");
        }
    }
    Ok(())
}

/// `graceguard release-results --all-namespaces` goes through every
/// namespace where graceguard's pods hold the result finalizer, judging each
/// owner by its Lease in its pods' namespace: a dead instance's held pods
/// in two namespaces are let go, a live instance's kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_results_for_all_namespaces_lets_go_of_dead_owners_pods_only() -> R {
    let (bed, ns_a, _alice) = bed().await?;
    let ns_b = bed.namespace("guard-b").await?;
    let held = |name: &str, instance: &str| {
        let mut p = managed_pod(name, instance);
        p.metadata.finalizers = Some(vec![graceguard::core::naming::RESULT_FINALIZER.into()]);
        p
    };
    for (ns, name, instance) in [
        (&ns_a, "gone-a-0", "dead-exec"),
        (&ns_b, "gone-b-0", "dead-exec"),
        (&ns_b, "kept-b-0", "live-exec"),
    ] {
        Api::<Pod>::namespaced(bed.client.clone(), ns)
            .create(&PostParams::default(), &held(name, instance))
            .await?;
    }
    instance_lease(&bed, &ns_a, "dead-exec", DEAD).await?;
    instance_lease(&bed, &ns_b, "dead-exec", DEAD).await?;
    instance_lease(&bed, &ns_b, "live-exec", LIVE).await?;
    let bin = testbed::binaries::workspace_bin("graceguard", "GRACEGUARD_BIN")?;
    let out = tokio::process::Command::new(&bin)
        .args([
            "release-results",
            "--all-namespaces",
            "--lease-wait-seconds",
            "5",
            "--kubeconfig",
        ])
        .arg(bed.kubeconfig_for("alice")?)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut got: Vec<(String, String, String)> = stdout
        .lines()
        .map(serde_json::from_str::<serde_json::Value>)
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|l| l["namespace"] == ns_a.as_str() || l["namespace"] == ns_b.as_str())
        .map(|l| {
            let s = |k: &str| l[k].as_str().unwrap_or_default().to_string();
            (s("namespace"), s("pod"), s("outcome"))
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (ns_a.clone(), "gone-a-0".into(), "released".into()),
            (ns_b.clone(), "gone-b-0".into(), "released".into()),
            (ns_b.clone(), "kept-b-0".into(), "kept".into()),
        ],
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "not every pod was released");
    for (ns, name, holds) in [(&ns_a, "gone-a-0", false), (&ns_b, "kept-b-0", true)] {
        let p = Api::<Pod>::namespaced(bed.client.clone(), ns)
            .get(name)
            .await?;
        assert_eq!(
            p.metadata.finalizers.unwrap_or_default().len() == 1,
            holds,
            "{ns}/{name}"
        );
    }
    Ok(())
}
