//! On real nodes (Kubernetes 1.37): a real kubelet per node acting as
//! `system:node:<name>` under NodeRestriction, containerd, runc and the CNI
//! plugins running real containers of the bed's busybox image. Graceful
//! deletions are carried out by the kubelet (SIGTERM, the container's own
//! exit or SIGKILL at the end of the grace period, the final status update,
//! its delete with grace 0), on every supported minor.

use std::time::{Duration, Instant};

use anyhow::Context;
use graceguard::FailureKind;
use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{Api, ResourceExt};
use scenarios::disruptions::{drain_node, Kubelets, LabelWatch};
use scenarios::guard_task::{spec, summary, RunningTask};
use scenarios::scenario::flyte_seed_naive;
use scenarios::scenario::{guard_graceful_delete, Disruption};
use testbed::audit_log::AuditEvent;
use testbed::containers::{EndWatch, PhaseLog};
use testbed::node::kubelet_log::KubeletLog;
use testbed::pods::{self, CreateOutcome};
use testbed::webhook::{Hook, WebhookProcess, ALL_HOOKS};
use testbed::{TestBed, TestBedOptions};

type R = anyhow::Result<()>;

const MIN: Duration = Duration::from_secs(60);

/// A bed with `nodes` real nodes and the audit log on, and a namespace.
async fn bed(prefix: &str, nodes: u8) -> anyhow::Result<(TestBed, String)> {
    let bed = TestBed::start_with(TestBedOptions {
        audit: true,
        real_nodes: nodes,
        ..Default::default()
    })
    .await?;
    let ns = bed.namespace(prefix).await?;
    Ok((bed, ns))
}

/// A pod on node-1 running `script` in the task image.
fn container_pod(bed: &TestBed, name: &str, grace: i64, script: &str) -> anyhow::Result<Pod> {
    let mut pod = pods::task_pod(name, grace);
    pods::run_in(&mut pod, &bed.task_image()?, script);
    Ok(pod)
}

/// Waits until the container has printed `line` (read through the kubelet,
/// as `kubectl logs` does): its SIGTERM trap is then in place.
async fn wait_log(api: &Api<Pod>, name: &str, line: &str) -> R {
    let deadline = Instant::now() + MIN;
    loop {
        if let Ok(logs) = api.logs(name, &Default::default()).await {
            if logs.lines().any(|l| l == line) {
                return Ok(());
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "pod {name} did not log {line:?} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Requests a node's kubelet sent about pods of `ns`.
fn kubelet_requests(bed: &TestBed, ns: &str, node: &str) -> anyhow::Result<Vec<AuditEvent>> {
    let user = format!("system:node:{node}");
    Ok(bed
        .audit_log()?
        .events()?
        .into_iter()
        .filter(|e| {
            e.user.username == user
                && e.object_ref
                    .as_ref()
                    .is_some_and(|o| o.resource == "pods" && o.namespace == ns)
        })
        .collect())
}

fn code(e: &AuditEvent) -> u16 {
    e.response_status.as_ref().map(|s| s.code).unwrap_or(0)
}

/// What node-1's kubelet sent about pods of `ns`: (status updates, deletes
/// answered 200); fails unless every write was answered < 400 (the Node
/// authorizer, NodeRestriction and any webhook let each one through). A read
/// may be refused once: the Node authorizer learns of a pod's binding from
/// its own watch, and a kubelet that sees the pod first gets 403 on its GET
/// until then (no webhook sees reads); a later read of that pod must succeed.
///
/// Waits (up to 30 s) for the final delete's record: the API server writes a
/// request's `ResponseComplete` event after it has answered, so a watcher can
/// see the pod gone before its delete is in the log.
async fn kubelet_traffic(bed: &TestBed, ns: &str) -> anyhow::Result<(usize, usize)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut reqs = kubelet_requests(bed, ns, "node-1")?;
    while !reqs.iter().any(|e| e.verb == "delete") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        reqs = kubelet_requests(bed, ns, "node-1")?;
    }
    let read = |e: &AuditEvent| e.verb == "get" || e.verb == "list" || e.verb == "watch";
    anyhow::ensure!(
        reqs.iter().filter(|e| !read(e)).all(|e| code(e) < 400),
        "{reqs:?}"
    );
    for (i, e) in reqs.iter().enumerate() {
        let refused_read = read(e) && code(e) == 403;
        anyhow::ensure!(
            !refused_read
                || reqs[i + 1..].iter().any(|later| read(later)
                    && later.object_ref == e.object_ref
                    && code(later) < 400),
            "a read refused and never answered later: {reqs:?}"
        );
        anyhow::ensure!(!read(e) || code(e) < 400 || code(e) == 403, "{reqs:?}");
    }
    let status = reqs
        .iter()
        .filter(|e| {
            e.object_ref
                .as_ref()
                .is_some_and(|o| o.subresource == "status")
        })
        .count();
    let deletes = reqs
        .iter()
        .filter(|e| e.verb == "delete" && code(e) == 200)
        .count();
    Ok((status, deletes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_that_traps_sigterm_exits_by_itself_and_the_kubelet_deletes_its_pod() -> R {
    let (bed, ns) = bed("graceful", 1).await?;
    let api: Api<Pod> = Api::namespaced(bed.client_as("alice").await?, &ns);
    let ends = EndWatch::start(bed.client.clone(), &ns);
    let pod = container_pod(&bed, "graceful", 30, &pods::graceful_script(3, 0))?;
    assert_eq!(pods::create(&api, &pod).await?, CreateOutcome::Created);
    pods::wait_running(&api, "graceful").await?;
    wait_log(&api, "graceful", "started").await?;
    let uid = api.get("graceful").await?.uid().unwrap_or_default();

    let deleted = Instant::now();
    pods::delete_gracefully(&api, "graceful", None).await?;
    // Terminating while the container runs its trap...
    tokio::time::sleep(Duration::from_secs(1)).await;
    let p = api.get("graceful").await?;
    assert!(p.metadata.deletion_timestamp.is_some(), "{:?}", p.metadata);
    pods::wait_gone(&api, "graceful", &uid).await?;
    let took = deleted.elapsed();

    // ...which exited 0 on its own (not SIGKILLed at the end of the 30 s).
    let end = ends.get("graceful").expect("the kubelet's final status");
    assert_eq!(end.exit_code, 0, "{end:?}");
    assert!(took >= Duration::from_secs(3), "gone after {took:?}");
    // The kubelet's own requests, as system:node:node-1: status updates,
    // then the final delete; NodeRestriction let every one through.
    let (status_updates, deletes) = kubelet_traffic(&bed, &ns).await?;
    assert!(status_updates >= 2, "{status_updates} status updates");
    assert_eq!(deletes, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_that_ignores_sigterm_is_killed_at_the_end_of_its_grace_period() -> R {
    let (bed, ns) = bed("stubborn", 1).await?;
    let api: Api<Pod> = Api::namespaced(bed.client_as("alice").await?, &ns);
    let ends = EndWatch::start(bed.client.clone(), &ns);
    let script = "trap '' TERM; echo started; while true; do sleep 1; done";
    let pod = container_pod(&bed, "stubborn", 4, script)?;
    assert_eq!(pods::create(&api, &pod).await?, CreateOutcome::Created);
    pods::wait_running(&api, "stubborn").await?;
    wait_log(&api, "stubborn", "started").await?;
    let uid = api.get("stubborn").await?.uid().unwrap_or_default();
    let deleted = Instant::now();
    pods::delete_gracefully(&api, "stubborn", None).await?;
    pods::wait_gone(&api, "stubborn", &uid).await?;
    let took = deleted.elapsed();
    let end = ends.get("stubborn").expect("the kubelet's final status");
    // SIGKILL: 128 + 9.
    assert_eq!(end.exit_code, 137, "{end:?}");
    assert!(took >= Duration::from_secs(4), "gone after {took:?}");
    Ok(())
}

/// A guard task template on node-1 running `script`, with `memory` as its limit.
fn guard_template(bed: &TestBed, script: &str, memory: Option<&str>) -> anyhow::Result<Pod> {
    let mut pod = container_pod(bed, "template", 5, script)?;
    if let (Some(m), Some(c)) = (
        memory,
        pod.spec.as_mut().and_then(|s| s.containers.first_mut()),
    ) {
        let q = [("memory".to_string(), Quantity(m.into()))];
        c.resources = Some(ResourceRequirements {
            limits: Some(q.clone().into()),
            requests: Some(q.into()),
            ..Default::default()
        });
    }
    Ok(pod)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_tasks_end_as_their_containers_exit_0_1_or_are_oom_killed() -> R {
    let (bed, ns) = bed("exits", 1).await?;
    let alice = bed.client_as("alice").await?;
    let ends = EndWatch::start(bed.client.clone(), &ns);
    let no_retries = |task: &str| graceguard::TaskSpec {
        retries: 0,
        ..spec(task, &ns)
    };
    let ok = RunningTask::start(
        alice.clone(),
        no_retries("ok"),
        guard_template(&bed, "echo done; exit 0", None)?,
    );
    let fails = RunningTask::start(
        alice.clone(),
        no_retries("fails"),
        guard_template(&bed, "echo failing; exit 1", None)?,
    );
    // `tail` buffers a line that never ends: memory grows until the cgroup's
    // limit, and the kernel's OOM killer ends the container.
    let oom = RunningTask::start(
        alice.clone(),
        no_retries("oom"),
        guard_template(&bed, "tail /dev/zero", Some("32Mi"))?,
    );
    let (ok, _) = ok.finish(Duration::from_secs(120)).await?;
    assert!(ok.succeeded, "{ok:?}");
    assert_eq!(
        (ok.attempts, ok.user_failures, ok.system_failures),
        (1, 0, 0)
    );

    let (failed, ts) = fails.finish(Duration::from_secs(120)).await?;
    assert!(!failed.succeeded, "{failed:?}");
    assert_eq!(
        failed.failure_kind,
        Some(FailureKind::User),
        "{:?}",
        summary(&ts)
    );
    assert_eq!((failed.user_failures, failed.system_failures), (1, 0));
    assert_eq!(ends.get("fails-0").map(|e| e.exit_code), Some(1));

    // The rule: a container killed for exceeding its own memory limit is the
    // task's failure (a user failure, retried within `retries`); a node under
    // memory pressure evicting it would be a system failure (the kubelet sets
    // DisruptionTarget TerminationByKubelet).
    let (oomed, ts) = oom.finish(Duration::from_secs(120)).await?;
    assert!(!oomed.succeeded, "{oomed:?}");
    assert_eq!(
        oomed.failure_kind,
        Some(FailureKind::User),
        "{:?}",
        summary(&ts)
    );
    let end = ends
        .get("oom-0")
        .expect("the OOM-killed container's status");
    assert_eq!(
        (end.reason.as_str(), end.exit_code),
        ("OOMKilled", 137),
        "{end:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_kubelet_s_status_updates_of_a_disrupted_pod_go_through_graceguard() -> R {
    let (bed, ns) = bed("kubelet-status", 1).await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, ALL_HOOKS).await?;
    let api: Api<Pod> = Api::namespaced(bed.client_as("alice").await?, &ns);
    let labels = LabelWatch::start(bed.client.clone(), &ns);
    let pod = container_pod(&bed, "evicted", 30, &pods::graceful_script(3, 0))?;
    assert_eq!(pods::create(&api, &pod).await?, CreateOutcome::Created);
    pods::wait_running(&api, "evicted").await?;
    wait_log(&api, "evicted", "started").await?;
    let uid = api.get("evicted").await?.uid().unwrap_or_default();
    // The Eviction API sets DisruptionTarget, then deletes gracefully.
    let out = pods::evict(&bed.client_as("alice").await?, &ns, "evicted", None, false).await?;
    assert_eq!(out, CreateOutcome::Created, "the eviction");
    pods::wait_gone(&api, "evicted", &uid).await?;
    // Tagged, and every request the kubelet sent (status updates while the
    // pod ran, terminated and ended; its final delete) was answered < 400.
    assert_eq!(
        labels.label("evicted").as_deref(),
        Some("EvictionByEvictionAPI")
    );
    let (status_updates, deletes) = kubelet_traffic(&bed, &ns).await?;
    assert!(status_updates >= 2, "{status_updates} status updates");
    assert_eq!(deletes, 1);
    // The webhook saw the kubelet's updates and let them through: its
    // status-update records are all "allow".
    let records = webhook.audit_records()?;
    assert!(
        records.iter().all(|r| r["decision"] != "deny"),
        "{records:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_kubectl_drain_of_a_real_node_completes_every_pod_tagged_and_audited_once() -> R {
    let (bed, ns) = bed("drain", 1).await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, ALL_HOOKS).await?;
    let pods: Vec<Pod> = (0..3)
        .map(|i| {
            container_pod(
                &bed,
                &format!("drained-{i}"),
                30,
                &pods::graceful_script(2, 0),
            )
        })
        .collect::<anyhow::Result<_>>()?;
    let r = drain_node(&bed, &webhook, &ns, "node-1", &pods).await?;
    assert!(r.drain_completed, "{r:?}");
    assert_eq!(r.pods, 3);
    assert_eq!(r.audited_once, 3, "{r:?}");
    assert_eq!(r.eviction_audit_records, 3, "{r:?}");
    assert_eq!(r.tagged, 3, "{r:?}");
    // Every pod is gone: the real kubelet finished each deletion.
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    assert!(api.list(&Default::default()).await?.items.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flyte_seed_on_real_nodes_bare_leaks_graceguard_does_not_guard_creates_once() -> R {
    let (bed, _) = bed("flyte", 1).await?;
    let image = bed.task_image()?;
    // The preempted pod traps SIGTERM and takes 15 s to exit: the real
    // kubelet keeps it Terminating that long while the executor loops.
    let kubelets = Kubelets::Real {
        image: &image,
        terminate_seconds: 15,
    };

    let ns = bed.namespace("flyte-bare").await?;
    let bare = flyte_seed_naive(&bed, &kubelets, &ns, "bare", 20).await?;
    assert_eq!(bare.still_terminating_after, Some(true), "{bare:?}");
    // Each 409 charged a pod of quota (10) until it was full; then 403s.
    assert_eq!(bare.already_exists + bare.forbidden, 20, "{bare:?}");
    assert!(bare.leaked_quota_charges > 0, "{bare:?}");
    assert!(bare.forbidden > 0, "the quota filled: {bare:?}");

    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, &[Hook::CollisionGuard]).await?;
    let ns = bed.namespace("flyte-graceguard").await?;
    let guarded = flyte_seed_naive(&bed, &kubelets, &ns, "graceguard", 20).await?;
    assert_eq!(guarded.still_terminating_after, Some(true), "{guarded:?}");
    assert_eq!(guarded.already_exists, 20, "{guarded:?}");
    assert_eq!(guarded.leaked_quota_charges, 0, "{guarded:?}");

    // The guard: preempted while Running, no Create while the old pod
    // exists (3 s into its 15 s shutdown), then one Create under the next
    // name, and the task succeeds on it.
    let ns = bed.namespace("flyte-guard").await?;
    let phases = PhaseLog::start(bed.client.clone(), &ns);
    let guard = guard_graceful_delete(
        &bed,
        &kubelets,
        &ns,
        Duration::from_secs(3),
        Disruption::Preemption,
    )
    .await?;
    assert_eq!(guard.kubelet, "real");
    assert_eq!(guard.creates_while_terminating, 0, "{guard:?}");
    assert_eq!(guard.creates, 1, "{guard:?}");
    assert_eq!(guard.attempts_burned, Some(0), "{guard:?}");
    assert_eq!(guard.leaked_quota_charges, 0, "{guard:?}");
    // Attempt 1 was created only once attempt 0 was terminal (every
    // container stopped: it holds no quota and no node resources; the guard
    // does not wait for the object to go). resourceVersions are etcd
    // revisions, so they order the two pods' versions.
    let terminal = phases
        .first("flyte-a0-0", |p| p == "Failed" || p == "Succeeded")
        .expect("flyte-a0-0 seen terminal");
    let created = phases
        .first("flyte-a0-1", |_| true)
        .expect("flyte-a0-1 seen");
    assert!(
        terminal < created,
        "flyte-a0-1 (rv {created}) before flyte-a0-0 was terminal (rv {terminal})"
    );
    Ok(())
}

/// `guard_chaos` on a real node, quick form (the full one is
/// `scripts/reliability --only guard_chaos_real_nodes`): tasks whose
/// containers run 3 s and exit by themselves, through one sidecar while it
/// is SIGKILLed, the API server restarts, and running pods are deleted and
/// evicted, the real kubelet carrying out each termination. Every result
/// arrives, no name is created twice, nothing is left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_chaos_on_a_real_node() -> R {
    use scenarios::guard_chaos::{run, ChaosOptions};
    let (mut bed, ns) = bed("chaos", 1).await?;
    let opts = ChaosOptions {
        tasks: 12,
        sidecar_kills: 2,
        apiserver_restarts: 1,
        disrupt_every: 3,
        deadline: Duration::from_secs(420),
        real_nodes: true,
    };
    let report = run(&mut bed, &ns, &opts).await?;
    eprintln!("{}", serde_json::to_string(&report)?);
    report.assert_held(&opts);
    Ok(())
}

/// A real preemption (kube-scheduler, a real kubelet, containerd, runc) with
/// graceguard registered as the chart registers it (every webhook, with its
/// matchConditions): no write of graceguard's reaches the victim while it
/// runs (a metadata change there makes the kubelet's termination wait a PLEG
/// relist, about 1 s a preemption), and the victim is still tagged before it
/// is gone and its deletion audited once, by the scheduler. Every version of
/// the victim the watch delivered is checked, so this holds whatever the
/// timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceguard_never_changes_a_running_victim_and_tags_it_once_its_deletion_begins() -> R {
    use scenarios::disruptions::{most_of_node_cpu, priority_classes};
    use scenarios::preemption_trace::{preempt_once, Timeline};
    let bed = TestBed::start_with(TestBedOptions {
        audit: true,
        real_nodes: 1,
        // The kubelet's pod worker steps, read below.
        kubelet_verbosity: Some(4),
        ..Default::default()
    })
    .await?;
    let ns = bed.namespace("preempt-trace").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register_as_the_chart_does(&bed).await?;
    priority_classes(&bed).await?;
    let cpu = most_of_node_cpu(&bed, pods::NODE).await?;
    let api: Api<Pod> = Api::namespaced(bed.client_as("alice").await?, &ns);
    let timeline = Timeline::start(bed.client.clone(), &ns);
    let image = bed.task_image()?;
    let kubelets = Kubelets::Real {
        image: &image,
        terminate_seconds: 0,
    };
    for i in 0..2 {
        // Preempted as soon as it runs, when the kubelet is likeliest to be
        // busy with it.
        let t = preempt_once(&api, &timeline, &kubelets, i, &cpu, Duration::ZERO).await?;
        assert!(
            t.tagged_while_running().is_empty(),
            "graceguard changed the running victim {}: {:?}",
            t.victim,
            t.victim_versions
        );
        assert!(
            t.tagged_before_gone(),
            "victim {} was never seen tagged: {:?}",
            t.victim,
            t.victim_versions
        );
        assert!(
            t.victim_versions.iter().any(|v| v.deleting),
            "{:?}",
            t.victim_versions
        );
        // Its deletion audited once, as the scheduler's; its tag written once.
        // The API server may review the DELETE twice (its write met the
        // scheduler's status patch: CI saw it on 1.37); one review began it.
        let records = webhook.records_for("deletion_audit", &ns, &t.victim)?;
        let began = testbed::webhook::deletion_beginnings(&records);
        assert_eq!(began.len(), 1, "{records:?}");
        assert_eq!(began[0]["user"], "system:kube-scheduler", "{records:?}");
        assert_eq!(began[0]["disruption_reason"], "PreemptionByScheduler");
        webhook
            .wait_record(|r| r["event"] == "follow_up" && r["name"] == t.victim.as_str())
            .await?;
        let tags: Vec<serde_json::Value> = webhook
            .records_for("disruption_tagger", &ns, &t.victim)?
            .into_iter()
            .filter(|r| r["patched"] == true)
            .collect();
        assert_eq!(tags.len(), 1, "{tags:?}");
        assert_eq!(tags[0]["event"], "follow_up", "{tags:?}");
        // The kubelet ended it as it ends a pod nobody writes to: no update
        // of the running pod to sync (the relist graceguard once cost each
        // preemption), the deletion's two passes of the pod's worker
        // (terminating, terminated) and none for graceguard's tag, which,
        // written during the termination, joins the update the worker has
        // pending.
        let log = bed.kubelet_log(pods::NODE)?;
        let k = KubeletLog::parse(&log)
            .termination(&ns, &t.victim, &t.victim_uid)
            .with_context(|| {
                format!(
                    "the kubelet's log (--v=4) shows no termination of {}",
                    t.victim
                )
            })?;
        assert_eq!(
            k.updates_before_deletion, 0,
            "the kubelet received an update of the running victim {} (a write it syncs, and the termination then waits a relist): {k:?}",
            t.victim
        );
        assert_eq!(
            k.passes, 2,
            "the kubelet's pod worker ran {} passes to end {} (2 without any write): {k:?}",
            k.passes, t.victim
        );
    }
    Ok(())
}

/// The fence on a real node (kubelet, containerd, runc): the stalled-holder
/// scenario ([`scenarios::fencing::stalled_holder`]) with a task that runs a
/// container. A's Create, sent in time and delivered after B took the
/// Lease, is refused; B, given the task, runs it on the node to its end:
/// one pod stored, one container run, one result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_on_a_real_node_never_runs_its_task_twice() -> R {
    let (bed, ns) = bed("fence", 1).await?;
    let template = serde_json::to_value(container_pod(&bed, "template", 30, "echo ran")?)?;
    let held =
        scenarios::fencing::stalled_holder(&bed, &ns, ("fence", "work"), template.clone()).await?;
    let (code, st) = held
        .b
        .request(
            "PUT",
            &format!("/v1/tasks/{ns}/work"),
            Some(&serde_json::json!({ "template": template })),
        )
        .await?;
    anyhow::ensure!(code == 201, "B accepted the task: {code} {st}");
    let result = held.b.result_of("work", 2 * MIN).await?;
    assert_eq!(result["outcome"]["succeeded"], true, "{result}");
    assert_eq!(result["outcome"]["attempts"], 1, "{result}");
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    assert_eq!(api.logs("work-0", &Default::default()).await?.trim(), "ran");
    let stored = bed.audit_log()?.count(|e: &AuditEvent| {
        e.is("create", "pods", &ns)
            && e.user.username == "alice"
            && e.response_status.as_ref().is_some_and(|s| s.code == 201)
    })?;
    assert_eq!(stored, 1, "one pod of the task reached the store (B's)");
    Ok(())
}

/// `failurePolicy: Fail` with every replica lost cannot keep a node from
/// joining (the pattern of kyverno#2869). graceguard is installed by its
/// chart with the collision guard on Fail and its replicas never running
/// (no node matches their selector): an ordinary pod in a covered namespace
/// is refused. Then node-2 joins, a real kubelet acting as
/// `system:node:node-2` under NodeRestriction: it registers and turns Ready,
/// the mirror pods of its static pods (one in kube-system, one in the
/// covered namespace) are created and run, and a kube-system DaemonSet's
/// pod starts on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_fail_with_every_replica_lost_a_node_joins_and_runs_its_system_pods() -> R {
    let mut bed = TestBed::start_with(TestBedOptions {
        real_nodes: 1,
        ..Default::default()
    })
    .await?;
    let helm = testbed::helm::Helm::for_bed(&bed)?;
    let chart = testbed::helm::chart_dir().display().to_string();
    helm.ok(&[
        "install",
        "graceguard",
        &chart,
        "-n",
        "graceguard",
        "--create-namespace",
        "--set",
        "webhooks.collisionGuard.failurePolicy=Fail",
        "--set",
        "nodeSelector.graceguard\\.io/never=scheduled",
    ])?;
    let ns = bed.namespace("team").await?;
    let team: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let plain = pods::task_pod_on("plain", 1, None);
    let refusal = pods::wait_refused(&team, &plain, Duration::from_secs(30)).await?;
    assert!(
        refusal.contains("collision-guard.graceguard.io"),
        "{refusal}"
    );

    let image = bed.task_image()?;
    let agent = |name: &str, namespace: &str| -> anyhow::Result<Pod> {
        let mut pod = pods::task_pod_on(name, 1, None);
        pods::run_in(&mut pod, &image, "sleep 3600");
        pod.metadata.namespace = Some(namespace.to_string());
        if let Some(spec) = pod.spec.as_mut() {
            spec.restart_policy = Some("Always".into());
        }
        Ok(pod)
    };
    let mut template = agent("node-agent", "kube-system")?;
    template.metadata = kube::api::ObjectMeta {
        labels: Some([("app".to_string(), "node-agent".to_string())].into()),
        ..Default::default()
    };
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-agent", "namespace": "kube-system"},
        "spec": {
            "selector": {"matchLabels": {"app": "node-agent"}},
            "template": {"metadata": template.metadata, "spec": template.spec},
        },
    }))?;
    Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(bed.client.clone(), "kube-system")
        .create(&Default::default(), &ds)
        .await?;
    let node = bed
        .join_node(&[
            agent("static-system", "kube-system")?,
            agent("static-team", &ns)?,
        ])
        .await?;
    anyhow::ensure!(node == "node-2", "the joining node is {node}");

    let running_on = |api: Api<Pod>, what: String| async move {
        let deadline = Instant::now() + 2 * MIN;
        loop {
            let found = api
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .find(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("node-2")
                        && p.name_any().starts_with(&what)
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                });
            if let Some(p) = found {
                return anyhow::Ok(p.name_any());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no {what} pod Running on node-2 within 2 min under Fail with no replica"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let system: Api<Pod> = Api::namespaced(bed.client.clone(), "kube-system");
    running_on(system.clone(), "node-agent-".into()).await?;
    let mirror = running_on(system, "static-system-node-2".into()).await?;
    assert_eq!(mirror, "static-system-node-2");
    let mirror = running_on(team.clone(), "static-team-node-2".into()).await?;
    assert_eq!(mirror, "static-team-node-2");
    // Still in force for everyone else.
    let again = pods::admitted(&team, &pods::task_pod_on("plain-again", 1, None)).await?;
    assert!(
        again
            .as_ref()
            .is_err_and(|why| why.contains("collision-guard.graceguard.io")),
        "{again:?}"
    );
    Ok(())
}
