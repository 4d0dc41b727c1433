//! `graceguard sidecar` driven by executors in other languages: the Python
//! and Go client packages in `clients/`, against a real
//! kube-apiserver with the simulated kubelet. The sidecar acts as `alice`;
//! her requests are counted from the API server's audit log.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use scenarios::guard_task::{audited_bed, instance_lease, managed_pod, DEAD};
use testbed::audit_log::AuditEvent;
use testbed::kubelet::{Kubelet, KubeletOptions, Terminal};
use testbed::pods::{self, CreateOutcome};
use testbed::sidecar::{ClientRun, Lang, SidecarProcess};
use testbed::{quota, TestBed};

type R = anyhow::Result<()>;

async fn bed() -> anyhow::Result<(TestBed, String, std::path::PathBuf)> {
    let (bed, ns) = audited_bed("sidecar").await?;
    let template = bed.dir().join("template.json");
    std::fs::write(
        &template,
        serde_json::to_string(&pods::task_pod("template", 30))?,
    )?;
    Ok((bed, ns, template))
}

/// Alice's pod Creates in `ns` (refused ones too), by pod name.
fn creates(bed: &TestBed, ns: &str) -> anyhow::Result<Vec<String>> {
    Ok(bed
        .audit_log()?
        .events()?
        .into_iter()
        .filter(|e: &AuditEvent| e.is("create", "pods", ns) && e.user.username == "alice")
        .map(|e| e.name().to_string())
        .collect())
}

/// A task preempted while Running is waited out and re-launched under the
/// next name, with no Create while the old pod exists.
async fn preempted_task_is_relaunched_under_the_next_name(lang: Lang) -> R {
    let (bed, ns, template) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let sidecar = SidecarProcess::start(&bed, "exec-1", &ns).await?;
    let mut run = ClientRun::start(lang, &sidecar.socket, &ns, "train", &template)?;
    run.wait_phase("Running", 0).await?;

    kubelet.mark_preempted(&ns, "train-0").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    pods::delete_gracefully(&api, "train-0", None).await?;
    let down = run
        .wait_for(Duration::from_secs(60), |v| v["phase"] == "ShuttingDown")
        .await?;
    assert_eq!(down["reason"], "PreemptionByScheduler");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(api
        .get("train-0")
        .await?
        .metadata
        .deletion_timestamp
        .is_some());
    assert_eq!(
        creates(&bed, &ns)?,
        ["train-0"],
        "no Create while it exists"
    );

    kubelet.finish_deletion(&ns, "train-0").await?;
    run.wait_phase("Running", 1).await?;
    kubelet.end_pod(&ns, "train-1", Terminal::Succeeded).await?;
    let phases = {
        let p = run.phases();
        let status = run.finish().await?;
        assert_eq!(status["attempt"], 1);
        assert_eq!(status["pod"], "train-1");
        assert_eq!(status["phase"], "Succeeded");
        assert_eq!(status["terminal"], true);
        assert_eq!(status["succeeded"], true);
        assert_eq!(
            status["user_failures"], 0,
            "the user's retries are untouched"
        );
        assert_eq!(status["system_failures"], 1);
        p
    };
    assert_eq!(
        phases,
        [
            "Launching@0",
            "Queued@0",
            "Running@0",
            "ShuttingDown@0",
            "Launching@1",
            "Queued@1",
            "Running@1"
        ]
    );
    assert_eq!(creates(&bed, &ns)?, ["train-0", "train-1"]);
    // The client acknowledged the result: only then is the pod marked done.
    pods::wait_label(&api, "train-1", "graceguard.io/done", "true").await?;
    Ok(())
}

/// A full quota is waited out without spending attempts.
async fn full_quota_waits_without_spending_attempts(lang: Lang) -> R {
    let (bed, ns, template) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    quota::set_pods_quota(&bed, &ns, 1).await?;
    let admin: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    assert_eq!(
        pods::create(&admin, &pods::task_pod("filler", 0)).await?,
        CreateOutcome::Created
    );
    let sidecar = SidecarProcess::start(&bed, "exec-1", &ns).await?;
    let mut run = ClientRun::start(lang, &sidecar.socket, &ns, "wait", &template)?;
    run.wait_phase("WaitingForResources", 0).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (code, status) = sidecar
        .request("GET", &format!("/v1/tasks/{ns}/wait"), None)
        .await?;
    assert_eq!(code, 200);
    assert_eq!(status["phase"], "WaitingForResources");
    assert_eq!(
        (status["attempt"].clone(), status["pod"].clone()),
        (0.into(), "wait-0".into())
    );
    let refused = creates(&bed, &ns)?;
    assert!(
        refused.len() >= 2 && refused.iter().all(|n| n == "wait-0"),
        "refused Creates retry the same name with backoff: {refused:?}"
    );

    kubelet.finish_deletion(&ns, "filler").await?;
    quota::released(&bed, &ns).await?;
    run.wait_phase("Running", 0).await?;
    kubelet.end_pod(&ns, "wait-0", Terminal::Succeeded).await?;
    let status = run.finish().await?;
    assert_eq!(status["attempt"], 0, "no attempt was consumed");
    assert_eq!(status["succeeded"], true);
    assert_eq!(
        (
            status["user_failures"].clone(),
            status["system_failures"].clone()
        ),
        (0.into(), 0.into())
    );
    Ok(())
}

/// The sidecar killed mid-task (SIGKILL: its socket file stays) and
/// restarted resumes the task from its pod, without a second Create.
async fn killed_sidecar_resumes_the_task_without_a_create(lang: Lang) -> R {
    let (bed, ns, template) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let mut sidecar = SidecarProcess::start(&bed, "exec-1", &ns).await?;
    let mut run = ClientRun::start(lang, &sidecar.socket, &ns, "resume", &template)?;
    run.wait_phase("Running", 0).await?;
    sidecar.kill();
    assert!(
        sidecar.socket.exists(),
        "a killed sidecar leaves its socket file"
    );
    drop(run);
    sidecar.restart().await?;

    // The executor submits its task again (PUT is idempotent): resumed.
    let mut run = ClientRun::start(lang, &sidecar.socket, &ns, "resume", &template)?;
    let put = run
        .wait_for(Duration::from_secs(30), |v| v.get("put").is_some())
        .await?;
    assert_eq!(put["put"]["attempt"], 0);
    run.wait_phase("Running", 0).await?;
    kubelet
        .end_pod(&ns, "resume-0", Terminal::Succeeded)
        .await?;
    let status = run.finish().await?;
    assert_eq!(status["succeeded"], true);
    assert_eq!(status["attempt"], 0);
    assert_eq!(
        creates(&bed, &ns)?,
        ["resume-0"],
        "no Create after the restart"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_preempted_task_is_relaunched_under_the_next_name() -> R {
    preempted_task_is_relaunched_under_the_next_name(Lang::Python).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_preempted_task_is_relaunched_under_the_next_name() -> R {
    preempted_task_is_relaunched_under_the_next_name(Lang::Go).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_full_quota_waits_without_spending_attempts() -> R {
    full_quota_waits_without_spending_attempts(Lang::Python).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_full_quota_waits_without_spending_attempts() -> R {
    full_quota_waits_without_spending_attempts(Lang::Go).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_killed_sidecar_resumes_the_task_without_a_create() -> R {
    killed_sidecar_resumes_the_task_without_a_create(Lang::Python).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_killed_sidecar_resumes_the_task_without_a_create() -> R {
    killed_sidecar_resumes_the_task_without_a_create(Lang::Go).await
}

/// The API as published: every route of the committed OpenAPI document is
/// served, a second template for a task is 409, errors are JSON naming the
/// fix, and a TCP listener wants the bearer token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_as_its_openapi_document_says() -> R {
    let (bed, ns, template) = bed().await?;
    let sidecar = SidecarProcess::start(&bed, "exec-1", &ns).await?;
    let (code, doc) = sidecar.request("GET", "/openapi.json", None).await?;
    assert_eq!(code, 200);
    let committed: serde_json::Value =
        serde_json::from_str(include_str!("../../../guard/openapi.json"))?;
    assert_eq!(doc, committed, "the served document is the committed one");

    let tpl: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&template)?)?;
    let path = format!("/v1/tasks/{ns}/api");
    let body = serde_json::json!({"template": tpl, "retries": 1});
    let (code, first) = sidecar.request("PUT", &path, Some(&body)).await?;
    assert_eq!(code, 201, "created: {first}");
    for key in [
        "attempt",
        "pod",
        "phase",
        "reason",
        "failure_kind",
        "user_failures",
        "system_failures",
        "terminal",
    ] {
        assert!(first.get(key).is_some(), "{key} missing in {first}");
    }
    let (code, _) = sidecar.request("PUT", &path, Some(&body)).await?;
    assert_eq!(code, 200, "the same PUT again is idempotent");
    let mut other = tpl.clone();
    other["spec"]["containers"][0]["image"] = "busybox:other".into();
    let (code, err) = sidecar
        .request("PUT", &path, Some(&serde_json::json!({"template": other})))
        .await?;
    assert_eq!(
        (code, err["reason"].as_str()),
        (409, Some("TemplateConflict")),
        "{err}"
    );
    let (code, err) = sidecar
        .request("PUT", &path, Some(&serde_json::json!({"templte": tpl})))
        .await?;
    assert_eq!(code, 400);
    assert!(
        err["message"].as_str().unwrap_or("").contains("template"),
        "{err}"
    );
    let (code, err) = sidecar
        .request("POST", &format!("{path}/retry"), None)
        .await?;
    assert_eq!((code, err["reason"].as_str()), (409, Some("NotEnded")));
    let (code, err) = sidecar
        .request("PUT", "/v1/tasks/elsewhere/api", Some(&body))
        .await?;
    assert_eq!(
        (code, err["reason"].as_str()),
        (400, Some("WrongNamespace")),
        "this sidecar watches {ns} only: {err}"
    );
    let (code, _) = sidecar
        .request("GET", &format!("/v1/tasks/{ns}/nope"), None)
        .await?;
    assert_eq!(code, 404);
    let (code, ev) = sidecar
        .request("GET", "/v1/events?after=0&wait=1", None)
        .await?;
    assert_eq!(code, 200);
    assert!(
        ev["events"].as_array().is_some_and(|e| !e.is_empty()),
        "{ev}"
    );
    let (code, st) = sidecar.request("DELETE", &path, None).await?;
    assert_eq!(code, 200);
    assert_eq!(st["terminal"], true);
    assert!(
        st["reason"].as_str().unwrap_or("").starts_with("Aborted"),
        "{st}"
    );
    // An acknowledgement names the epoch its events were read in; one meant
    // for an earlier sidecar is refused, not applied.
    let (code, err) = sidecar
        .request(
            "POST",
            "/v1/events/ack",
            Some(&serde_json::json!({"epoch": "0123456789abcdef", "seq": 1_000_000})),
        )
        .await?;
    assert_eq!(
        (code, err["reason"].as_str()),
        (409, Some("EpochChanged")),
        "{err}"
    );
    let (code, _) = sidecar
        .request(
            "POST",
            "/v1/events/ack",
            Some(&serde_json::json!({"epoch": ev["epoch"], "seq": 1_000_000})),
        )
        .await?;
    assert_eq!(code, 200);
    // Every documented route answers (none is the fallback's 404 for an
    // unknown endpoint).
    for (method, route) in graceguard::sidecar::ROUTES {
        let p = route.replace("{namespace}", &ns).replace("{task}", "api");
        let (_, body) = sidecar
            .request(
                &method.to_uppercase(),
                &p,
                Some(&serde_json::json!({"seq": 0})),
            )
            .await?;
        assert!(
            !body["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("no such endpoint")),
            "{method} {p}: {body}"
        );
    }
    Ok(())
}

/// The Airflow seed at scale (apache/airflow#68683): 1,000 completed pods of
/// a dead instance, delivered through the sidecar to the Python client in
/// batches of 2 (500 syncs), with the sidecar SIGKILLed once midway. Each
/// result reaches the client exactly once and every pod ends marked done;
/// the PATCHes stay per pod, not per pod and sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn airflow_seed_at_scale_delivers_each_result_once_across_a_kill() -> R {
    use futures::{StreamExt, TryStreamExt};
    use kube::api::{ListParams, PostParams};

    const PODS: usize = 1000;
    let (bed, ns, _) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    instance_lease(&bed, &ns, "dead-exec", DEAD).await?;
    futures::stream::iter(0..PODS)
        .map(|i| {
            let (api, kubelet, ns) = (&api, &kubelet, &ns);
            async move {
                let name = format!("seed-{i}-0");
                api.create(&PostParams::default(), &managed_pod(&name, "dead-exec"))
                    .await?;
                kubelet.end_pod(ns, &name, Terminal::Succeeded).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await?;

    let mut sidecar = SidecarProcess::start_adopting(&bed, "adopter", &ns).await?;
    let (syncs_1, first) = testbed::sidecar::python_adopt(&sidecar.socket, PODS / 2, 2).await?;
    // Killed midway: whatever it had claimed but not delivered is delivered
    // by the restarted sidecar (the claims are its own).
    sidecar.restart().await?;
    let (syncs_2, second) =
        testbed::sidecar::python_adopt(&sidecar.socket, PODS - first.len(), 2).await?;
    let mut all: Vec<String> = first.iter().chain(&second).cloned().collect();
    let delivered = all.len();
    all.sort();
    all.dedup();
    assert_eq!(delivered, PODS, "every result delivered, none twice");
    assert_eq!(all.len(), PODS);
    assert!(
        syncs_1 + syncs_2 >= (PODS / 2) as u64,
        "{syncs_1} + {syncs_2} syncs"
    );

    let done = api
        .list(&ListParams::default().labels("graceguard.io/done=true"))
        .await?;
    assert_eq!(done.items.len(), PODS, "every delivered pod is marked done");
    let patches = bed.audit_log()?.count(|e| {
        e.verb == "patch"
            && e.user.username == "alice"
            && e.object_ref.as_ref().is_some_and(|o| o.resource == "pods")
    })?;
    // A claim and a done-mark per pod, plus a re-claim for each pod claimed
    // before the kill and delivered after it.
    assert!(
        (2 * PODS..=3 * PODS).contains(&patches),
        "{patches} pod PATCHes for {PODS} pods (apache/airflow#68683's loop: one per adopted pod per sync)"
    );
    println!(
        "airflow seed: {PODS} pods, {} syncs, {patches} PATCHes",
        syncs_1 + syncs_2
    );
    Ok(())
}

/// Polls `f` every 200 ms until it holds, up to `within`.
async fn eventually<F, Fut>(within: Duration, what: &str, mut f: F) -> R
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        if f().await? {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "not within {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The first `result` event for `task` (up to 30 s), with its epoch.
async fn result_of(sidecar: &SidecarProcess, task: &str) -> anyhow::Result<serde_json::Value> {
    sidecar.result_of(task, Duration::from_secs(30)).await
}

/// Acknowledges `result` (as [`result_of`] returns it); the answer's body.
async fn ack(
    sidecar: &SidecarProcess,
    result: &serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let body = serde_json::json!({"epoch": result["epoch"], "seqs": [result["seq"]]});
    let (code, acked) = sidecar
        .request("POST", "/v1/events/ack", Some(&body))
        .await?;
    anyhow::ensure!(code == 200, "acknowledging {result}: {code} {acked}");
    Ok(acked)
}

fn holds_result(p: &Pod) -> bool {
    p.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == graceguard::core::naming::RESULT_FINALIZER)
}

/// A result outlives its pod's deletion until it is acknowledged: the
/// `graceguard.io/result` finalizer keeps a Succeeded pod deleted (as a TTL
/// or PodGC would) while the sidecar is down, so the restarted sidecar still
/// finds it, delivers its result without a re-run, and lets it go after the
/// acknowledgement. Without the finalizer the pod is gone before the restart
/// and the task with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_outlives_its_pods_deletion_while_the_sidecar_is_down() -> R {
    let (bed, ns, template) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let tpl: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&template)?)?;
    let body = serde_json::json!({"template": tpl});
    let mut sidecar = SidecarProcess::start(&bed, "exec-f", &ns).await?;
    let (code, st) = sidecar
        .request("PUT", &format!("/v1/tasks/{ns}/kept"), Some(&body))
        .await?;
    assert_eq!(code, 201, "created: {st}");
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    pods::wait_running(&api, "kept-0").await?;
    let pod = api.get("kept-0").await?;
    assert!(holds_result(&pod), "{:?}", pod.metadata.finalizers);
    let uid = pod.metadata.uid.clone().unwrap_or_default();

    sidecar.kill();
    kubelet.end_pod(&ns, "kept-0", Terminal::Succeeded).await?;
    pods::delete_gracefully(&api, "kept-0", Some(0)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = api.get_opt("kept-0").await?;
    assert!(
        held.as_ref()
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        "the deleted pod is kept until its result is acknowledged: {held:?}"
    );

    sidecar.restart().await?;
    let result = result_of(&sidecar, "kept").await?;
    assert_eq!(result["outcome"]["succeeded"], true, "{result}");
    assert_eq!(result["outcome"]["attempts"], 1, "{result}");
    let acked = ack(&sidecar, &result).await?;
    assert_eq!(acked["acked"][0]["marked"], "done", "{acked}");
    pods::wait_gone(&api, "kept-0", &uid).await?;
    assert_eq!(creates(&bed, &ns)?, ["kept-0"], "no re-run");
    Ok(())
}

/// A result nobody acknowledges keeps its deleted pod no longer than
/// `--max-result-hold-seconds`: the finalizer then lets go, with a Warning
/// event `ResultHeldTooLong` on the pod, and the result is still served from
/// the sidecar's log (its acknowledgement no longer finds a pod to mark).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_nobody_acknowledges_keeps_its_deleted_pod_no_longer_than_the_bound() -> R {
    const HOLD: u64 = 6;
    let (bed, ns, template) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let tpl: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&template)?)?;
    let sidecar = SidecarProcess::start_with_args(
        &bed,
        "exec-h",
        &ns,
        &["--max-result-hold-seconds", &HOLD.to_string()],
    )
    .await?;
    let (code, st) = sidecar
        .request(
            "PUT",
            &format!("/v1/tasks/{ns}/held"),
            Some(&serde_json::json!({"template": tpl})),
        )
        .await?;
    assert_eq!(code, 201, "created: {st}");
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    pods::wait_running(&api, "held-0").await?;
    let uid = api.get("held-0").await?.metadata.uid.unwrap_or_default();
    kubelet.end_pod(&ns, "held-0", Terminal::Succeeded).await?;
    let result = result_of(&sidecar, "held").await?;
    // Deleted (a TTL, PodGC) while nobody acknowledges: kept a while...
    pods::delete_gracefully(&api, "held-0", Some(0)).await?;
    let deleted = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kept = api.get_opt("held-0").await?;
    assert!(
        kept.as_ref().is_some_and(holds_result),
        "kept within the bound: {kept:?}"
    );
    // ...then let go: past the bound, within one recheck (10 s) and slack.
    pods::wait_gone(&api, "held-0", &uid).await?;
    let gone_after = deleted.elapsed();
    assert!(
        gone_after >= Duration::from_secs(HOLD),
        "let go after {gone_after:?}, before the {HOLD} s bound"
    );
    pods::wait_warning(
        &bed.client,
        &ns,
        "held-0",
        "ResultHeldTooLong",
        Duration::from_secs(10),
    )
    .await?;
    // The result is still served, and can still be acknowledged.
    let again = result_of(&sidecar, "held").await?;
    assert_eq!(again["seq"], result["seq"], "{again}");
    ack(&sidecar, &again).await?;
    assert_eq!(creates(&bed, &ns)?, ["held-0"], "no re-run");
    Ok(())
}

/// Waits until `ns` is gone (kube-controller-manager's namespace controller
/// deletes its content).
async fn wait_namespace_emptied(bed: &TestBed, ns: &str) -> R {
    use k8s_openapi::api::core::v1::Namespace;
    let namespaces: Api<Namespace> = Api::all(bed.client.clone());
    eventually(Duration::from_secs(90), "the namespace emptied", || async {
        Ok(namespaces.get_opt(ns).await?.is_none())
    })
    .await
}

/// Deletes namespace `ns`; the namespace controller deletes its pods.
async fn delete_namespace(bed: &TestBed, ns: &str) -> R {
    use k8s_openapi::api::core::v1::Namespace;
    let namespaces: Api<Namespace> = Api::all(bed.client.clone());
    namespaces.delete(ns, &Default::default()).await?;
    Ok(())
}

/// A namespace being deleted never waits for results nobody acknowledged:
/// a running sidecar sees its pods deleted, learns the namespace is being
/// deleted, and lets go of their finalizers; for an instance that is gone,
/// `graceguard release-results` does (and until it runs, the pod is held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_deletion_is_not_held_up_by_unacknowledged_results() -> R {
    let (bed, live_ns, template) = bed().await?;
    let gone_ns = bed.namespace("sidecar-gone").await?;
    let kubelet = Kubelet::start(
        &bed,
        KubeletOptions {
            finish_deletions: testbed::kubelet::FinishDeletions::AfterShareOfGrace(0.0),
            ..Default::default()
        },
    )
    .await?;
    let tpl: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&template)?)?;
    let body = serde_json::json!({"template": tpl});
    let live = SidecarProcess::start(&bed, "exec-live", &live_ns).await?;
    let mut gone = SidecarProcess::start(&bed, "exec-gone", &gone_ns).await?;
    for (sidecar, ns) in [(&live, &live_ns), (&gone, &gone_ns)] {
        let (code, st) = sidecar
            .request("PUT", &format!("/v1/tasks/{ns}/left"), Some(&body))
            .await?;
        assert_eq!(code, 201, "created: {st}");
        let api: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
        pods::wait_running(&api, "left-0").await?;
        kubelet.end_pod(ns, "left-0", Terminal::Succeeded).await?;
        // Delivered, never acknowledged.
        let result = result_of(sidecar, "left").await?;
        assert_eq!(result["outcome"]["succeeded"], true, "{result}");
    }

    // The live sidecar lets go once it learns the namespace is being deleted.
    delete_namespace(&bed, &live_ns).await?;
    wait_namespace_emptied(&bed, &live_ns).await?;
    assert!(
        live.log().contains("the namespace is being deleted"),
        "{}",
        live.log()
    );

    // A dead instance's pod is held until the cleanup command runs.
    gone.kill();
    delete_namespace(&bed, &gone_ns).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &gone_ns);
    let held = api.get_opt("left-0").await?;
    assert!(
        held.as_ref().is_some_and(holds_result),
        "held until released: {held:?}"
    );
    let bin = testbed::binaries::workspace_bin("graceguard", "GRACEGUARD_BIN")?;
    let out = tokio::process::Command::new(&bin)
        .args(["release-results", "--namespace", &gone_ns, "--kubeconfig"])
        .arg(bed.kubeconfig_for("alice")?)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(lines.len(), 1, "{stdout}");
    assert_eq!(
        (lines[0]["pod"].as_str(), lines[0]["outcome"].as_str()),
        (Some("left-0"), Some("released")),
        "{stdout}"
    );
    wait_namespace_emptied(&bed, &gone_ns).await?;
    drop(live);
    Ok(())
}

/// Sets the instance Lease's holder (`None`: released), as another process
/// taking it over (or giving it up) would.
async fn set_lease_holder(bed: &TestBed, ns: &str, instance: &str, holder: Option<&str>) -> R {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let api: Api<Lease> = Api::namespaced(bed.client.clone(), ns);
    let name = graceguard::runtime::lease::lease_name(instance);
    let mut lease = api.get(&name).await?;
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = holder.map(str::to_string);
    spec.lease_duration_seconds = Some(3600);
    spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    api.replace(&name, &Default::default(), &lease).await?;
    Ok(())
}

/// One process at a time acts for an instance. A second sidecar of it
/// waits while the first holds the Lease and serves nothing; it takes over
/// once the first is SIGKILLed and its Lease lapses (by the renewals it saw,
/// not by anyone's clock). A sidecar whose Lease is taken from it stops
/// launching and delivering until it holds the Lease again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_of_one_instance_never_both_act() -> R {
    use testbed::sidecar::{http, LEASE_SECONDS};
    let (bed, ns, template) = bed().await?;
    let _kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let tpl: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&template)?)?;
    let body = serde_json::json!({"template": tpl});
    let mut first = SidecarProcess::start(&bed, "exec-f", &ns).await?;
    let (code, st) = first
        .request("PUT", &format!("/v1/tasks/{ns}/one"), Some(&body))
        .await?;
    assert_eq!(code, 201, "created: {st}");
    eventually(Duration::from_secs(30), "one-0 created", || async {
        Ok(creates(&bed, &ns)? == ["one-0"])
    })
    .await?;

    let mut second = SidecarProcess::start_second(&bed, "exec-f", &ns, "exec-f-second")?;
    tokio::time::sleep(Duration::from_secs(3 * LEASE_SECONDS)).await;
    assert!(
        http(&second.socket, "GET", "/healthz", None).await.is_err(),
        "the second serves nothing while the first holds the Lease"
    );
    assert!(
        second.log().contains("held by another process"),
        "it says why it waits: {}",
        second.log()
    );

    // The first is SIGKILLed: its Lease lapses, the second takes it.
    first.kill();
    second
        .wait_healthy(Duration::from_secs(4 * LEASE_SECONDS + 20))
        .await?;
    let (_, health) = second.request("GET", "/healthz", None).await?;
    assert_eq!(health["holds_lease"], true, "{health}");

    // Another process takes the Lease (as after the second's renewals had
    // failed for its duration): the second stops acting.
    set_lease_holder(&bed, &ns, "exec-f", Some("intruder")).await?;
    eventually(
        Duration::from_secs(2 * LEASE_SECONDS + 10),
        "the second notices it lost the Lease",
        || async {
            let (_, h) = second.request("GET", "/healthz", None).await?;
            Ok(h["holds_lease"] == false)
        },
    )
    .await?;
    let (code, err) = second.request("GET", "/v1/events?after=0", None).await?;
    assert_eq!(
        (code, err["reason"].as_str()),
        (503, Some("Fenced")),
        "{err}"
    );
    let (code, st) = second
        .request("PUT", &format!("/v1/tasks/{ns}/two"), Some(&body))
        .await?;
    assert_eq!(code, 201, "accepted, not launched: {st}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        creates(&bed, &ns)?,
        ["one-0"],
        "nothing launched while fenced"
    );

    // Released: the second takes it back and launches what it holds.
    set_lease_holder(&bed, &ns, "exec-f", None).await?;
    eventually(Duration::from_secs(30), "two-0 created", || async {
        Ok(creates(&bed, &ns)?.contains(&"two-0".to_string()))
    })
    .await?;
    let (_, health) = second.request("GET", "/healthz", None).await?;
    assert_eq!(health["holds_lease"], true, "{health}");
    assert_eq!(creates(&bed, &ns)?, ["one-0", "two-0"]);
    Ok(())
}

/// A sidecar SIGKILLed mid-task and restarted knows the task at once, from
/// its pods, before anyone submits it again: GET answers, a deletion is
/// waited out, and the next attempt waits for the template (PUT again with
/// the same body; another body is 409); the result is delivered without
/// the client ever re-submitting a task whose pod simply ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_sidecar_knows_its_tasks_before_they_are_submitted_again() -> R {
    let (bed, ns, template) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let tpl: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&template)?)?;
    let body = serde_json::json!({"template": tpl, "retries": 1});
    let mut sidecar = SidecarProcess::start(&bed, "exec-r", &ns).await?;
    for task in ["keep", "ends"] {
        let (code, st) = sidecar
            .request("PUT", &format!("/v1/tasks/{ns}/{task}"), Some(&body))
            .await?;
        assert_eq!(code, 201, "created: {st}");
    }
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    pods::wait_running(&api, "keep-0").await?;
    pods::wait_running(&api, "ends-0").await?;
    sidecar.kill();
    sidecar.restart().await?;

    // Known at once, from its pod: no PUT since the restart.
    let (code, st) = sidecar
        .request("GET", &format!("/v1/tasks/{ns}/keep"), None)
        .await?;
    assert_eq!(code, 200, "{st}");
    assert_eq!(
        (st["attempt"].as_u64(), st["needs_template"].as_bool()),
        (Some(0), Some(true)),
        "{st}"
    );
    // One task simply ends: its result is delivered without a PUT.
    kubelet.end_pod(&ns, "ends-0", Terminal::Succeeded).await?;
    let result = result_of(&sidecar, "ends").await?;
    assert_eq!(result["outcome"]["succeeded"], true, "{result}");
    let acked = ack(&sidecar, &result).await?;
    assert_eq!(acked["acked"][0]["marked"], "done", "{acked}");

    // The other is deleted (a system failure): waited out; the next
    // attempt waits for its template, nothing is created.
    pods::delete_gracefully(&api, "keep-0", Some(0)).await?;
    eventually(Duration::from_secs(30), "keep at attempt 1", || async {
        let (_, st) = sidecar
            .request("GET", &format!("/v1/tasks/{ns}/keep"), None)
            .await?;
        Ok(st["attempt"] == 1)
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(
        sorted(creates(&bed, &ns)?),
        ["ends-0", "keep-0"],
        "no Create without a template"
    );
    // Another body: 409; the same body: launched.
    let other = serde_json::json!({"template": tpl, "retries": 5});
    let (code, err) = sidecar
        .request("PUT", &format!("/v1/tasks/{ns}/keep"), Some(&other))
        .await?;
    assert_eq!(
        (code, err["reason"].as_str()),
        (409, Some("SpecConflict")),
        "{err}"
    );
    let (code, st) = sidecar
        .request("PUT", &format!("/v1/tasks/{ns}/keep"), Some(&body))
        .await?;
    assert_eq!(code, 200, "{st}");
    assert_eq!(st["needs_template"], false, "{st}");
    pods::wait_running(&api, "keep-1").await?;
    assert_eq!(sorted(creates(&bed, &ns)?), ["ends-0", "keep-0", "keep-1"]);
    Ok(())
}

/// A task begun before 0.2.0, whose long name's pods carry that version's
/// 8-digit hash stem, goes on after the upgrade under that stem: the
/// restarted sidecar finds it by its name, its next attempt is named as its
/// pods are, and nothing is created twice. (Without the index's key from the
/// pod's record, the task is not found and runs again under today's stem.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_begun_under_the_32_bit_stems_keeps_its_pod_names() -> R {
    const TASK: &str = "Nightly_Training.Run_2026_12_06.Shard_0042_of_0128_with_a_long_suffix";
    // 0.1.0's stem (SHA-256's first 4 bytes) and today's (8 bytes).
    const OLD: &str = "nightly-training-run-2026-12-06-shard-0042-cc32d46d";
    assert_eq!(
        graceguard::core::naming::task_stem(TASK),
        "nightly-training-run-2026-12-06-sha-cc32d46d91e48977"
    );
    let (bed, ns, template) = bed().await?;
    let _kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let spec = graceguard::TaskSpec {
        retries: 1,
        ..graceguard::TaskSpec::new(TASK, &ns, "exec-l")
    };
    let record = graceguard::core::pod_record::PodRecord {
        spec: Some(spec.recorded()),
        ..Default::default()
    };
    let mut old = managed_pod(&format!("{OLD}-0"), "exec-l");
    old.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            graceguard::core::pod_record::RECORD_ANNOTATION.into(),
            record.to_annotation(),
        );
    api.create(&Default::default(), &old).await?;
    pods::wait_running(&api, &format!("{OLD}-0")).await?;

    let sidecar = SidecarProcess::start(&bed, "exec-l", &ns).await?;
    let (code, st) = sidecar
        .request("GET", &format!("/v1/tasks/{ns}/{TASK}"), None)
        .await?;
    assert_eq!(code, 200, "known from its pod: {st}");
    assert_eq!(st["pod"], format!("{OLD}-0"), "{st}");
    let tpl: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&template)?)?;
    let body = serde_json::json!({"template": tpl, "retries": 1});
    let (code, st) = sidecar
        .request("PUT", &format!("/v1/tasks/{ns}/{TASK}"), Some(&body))
        .await?;
    assert_eq!(code, 200, "the same task, submitted again: {st}");

    // Its pod is deleted (a system failure): the next attempt keeps the stem.
    pods::delete_gracefully(&api, &format!("{OLD}-0"), Some(0)).await?;
    let next = format!("{OLD}-1");
    pods::wait_running(&api, &next).await?;
    let p = api.get(&next).await?;
    assert_eq!(
        p.labels()
            .get(graceguard::core::naming::TASK_LABEL)
            .map(String::as_str),
        Some(OLD),
        "labelled as its earlier pods"
    );
    let (_, st) = sidecar
        .request("GET", &format!("/v1/tasks/{ns}/{TASK}"), None)
        .await?;
    assert_eq!(
        (st["attempt"].as_u64(), st["pod"].as_str()),
        (Some(1), Some(next.as_str())),
        "{st}"
    );
    assert_eq!(
        creates(&bed, &ns)?,
        [next],
        "one Create, under the old stem"
    );
    Ok(())
}

/// A task taken over from another process counts its deadline from what
/// its pod says it had spent and when the API server created it, never from
/// the other host's clock: here the launching host's clock ran an hour
/// ahead, so its recorded start is an hour late, and the 15 s deadline still
/// ends the task about 15 s after its pod was created (with the recorded
/// start, an hour later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_taken_over_counts_its_deadline_by_the_api_servers_clock() -> R {
    let (bed, ns, _) = bed().await?;
    let _kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let spec = graceguard::TaskSpec {
        bounds: graceguard::Bounds {
            deadline_seconds: Some(15),
            ..Default::default()
        },
        ..graceguard::TaskSpec::new("late", &ns, "exec-d")
    };
    let skewed = k8s_openapi::jiff::Timestamp::now().as_millisecond() + 3_600_000;
    let record = graceguard::core::pod_record::PodRecord {
        started_ms: Some(skewed),
        spent_ms: Some(0),
        spec: Some(spec.recorded()),
        ..Default::default()
    };
    let mut pod = managed_pod("late-0", "exec-d");
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            graceguard::core::pod_record::RECORD_ANNOTATION.into(),
            record.to_annotation(),
        );
    api.create(&Default::default(), &pod).await?;
    let created = std::time::Instant::now();
    pods::wait_running(&api, "late-0").await?;
    let sidecar = SidecarProcess::start(&bed, "exec-d", &ns).await?;
    let result = sidecar.result_of("late", Duration::from_secs(90)).await?;
    let reason = result["outcome"]["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("DeadlineExceeded"), "{result}");
    // The server's timestamps have whole seconds: the pod's creation is
    // truncated (up to 1 s early) and the Date header read at its middle
    // (half a second either way), and `created` is taken after the Create's
    // answer; so the deadline may end up to about 2 s before 15 s by this
    // test's clock, never anything like the hour of skew.
    let after = created.elapsed();
    assert!(
        after >= Duration::from_secs(12),
        "ended {after:?} after its pod was created, well before its 15 s deadline"
    );
    Ok(())
}

/// Memory stays bounded: a task is forgotten once its result was
/// acknowledged and the retention has passed (`--forget-after-seconds`), or
/// at once with `DELETE …?forget=true` once none of its pods runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_and_deleted_tasks_are_forgotten() -> R {
    use testbed::sidecar::http;
    let (bed, ns, template) = bed().await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let tpl: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&template)?)?;
    let body = serde_json::json!({"template": tpl});
    let sidecar =
        SidecarProcess::start_with_args(&bed, "exec-m", &ns, &["--forget-after-seconds", "2"])
            .await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    for task in ["acked", "dropped"] {
        let (code, st) = sidecar
            .request("PUT", &format!("/v1/tasks/{ns}/{task}"), Some(&body))
            .await?;
        assert_eq!(code, 201, "created: {st}");
    }
    pods::wait_running(&api, "acked-0").await?;
    pods::wait_running(&api, "dropped-0").await?;
    // Still running: not forgotten, only aborted.
    let (code, err) = sidecar
        .request(
            "DELETE",
            &format!("/v1/tasks/{ns}/dropped?forget=true"),
            None,
        )
        .await?;
    assert!(
        code == 200 || (code, err["reason"].as_str()) == (409, Some("CleanupPending")),
        "{code} {err}"
    );
    eventually(Duration::from_secs(30), "dropped forgotten", || async {
        let (code, _) = http(
            &sidecar.socket,
            "DELETE",
            &format!("/v1/tasks/{ns}/dropped?forget=true"),
            None,
        )
        .await?;
        Ok(code == 200 || code == 404)
    })
    .await?;
    let (code, _) = sidecar
        .request("GET", &format!("/v1/tasks/{ns}/dropped"), None)
        .await?;
    assert_eq!(code, 404, "forgotten");
    // The other ends; its result is acknowledged; 2 s later it is gone.
    kubelet.end_pod(&ns, "acked-0", Terminal::Succeeded).await?;
    let result = sidecar.result_of("acked", Duration::from_secs(30)).await?;
    let (seq, epoch) = (result["seq"].clone(), result["epoch"].clone());
    let (code, _) = sidecar
        .request("GET", &format!("/v1/tasks/{ns}/acked"), None)
        .await?;
    assert_eq!(code, 200, "kept until acknowledged");
    let (code, acked) = sidecar
        .request(
            "POST",
            "/v1/events/ack",
            Some(&serde_json::json!({"epoch": epoch, "seqs": [seq]})),
        )
        .await?;
    assert_eq!(code, 200, "{acked}");
    eventually(Duration::from_secs(20), "acked forgotten", || async {
        let (code, _) = http(
            &sidecar.socket,
            "GET",
            &format!("/v1/tasks/{ns}/acked"),
            None,
        )
        .await?;
        Ok(code == 404)
    })
    .await?;
    Ok(())
}

/// A restart is not an outage: a sidecar killed and started again in its own
/// container (the same pod uid and container name, from the downward API)
/// takes its Lease over at once, since the kubelet never runs one container
/// of one pod twice, instead of waiting a whole Lease duration (here 30 s).
/// A process in another container still waits for the Lease to lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_restarted_in_its_own_container_takes_its_lease_over_at_once() -> R {
    let (bed, ns, _) = bed().await?;
    let lease = 30;
    let here = ("3f2a9c1e-pod-uid", "graceguard");
    let mut first =
        SidecarProcess::start_in_container(&bed, "exec-r", &ns, "r1", here, lease, true).await?;
    first.kill();
    let restarted = std::time::Instant::now();
    let mut again =
        SidecarProcess::start_in_container(&bed, "exec-r", &ns, "r2", here, lease, false).await?;
    again.wait_healthy(Duration::from_secs(60)).await?;
    let took = restarted.elapsed();
    assert!(
        took < Duration::from_secs(lease / 2),
        "serving {took:?} after the restart: it waited for the Lease"
    );
    assert!(
        again.log().contains("same container of this same pod"),
        "{}",
        again.log()
    );
    let (_, health) = again.request("GET", "/healthz", None).await?;
    assert_eq!(health["holds_lease"], true, "{health}");

    // Another container (another pod's uid) is another process that may be
    // alive: it waits, serving nothing, while the restarted one holds it.
    let mut other = SidecarProcess::start_in_container(
        &bed,
        "exec-r",
        &ns,
        "r3",
        ("another-pod-uid", "graceguard"),
        lease,
        false,
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        other.request("GET", "/healthz", None).await.is_err(),
        "a process in another container acted while the Lease was held: {}",
        other.log()
    );
    other.kill();
    drop(again);
    Ok(())
}

/// A template is created as it was sent. A field newer than graceguard's
/// Pod type (k8s-openapi's, for 1.33) reaches the pod where the server
/// serves it (`spec.hostnameOverride`, 1.35+), and where the server does not
/// know it, the server refuses the Create naming it and the task fails
/// saying so: nothing is dropped on the way. Before, the sidecar parsed the
/// template into that type and the field vanished without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_is_created_whole_and_a_field_the_server_does_not_know_is_refused_by_it() -> R {
    let (bed, ns, template) = bed().await?;
    let sidecar = SidecarProcess::start(&bed, "exec-whole", &ns).await?;
    let mut tpl: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&template)?)?;
    tpl["spec"]["hostnameOverride"] = "trainer".into();
    let path = format!("/v1/tasks/{ns}/whole");
    let (code, st) = sidecar
        .request("PUT", &path, Some(&serde_json::json!({ "template": tpl })))
        .await?;
    assert_eq!(code, 201, "submitted: {st}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    if bed.version.has(testbed::Feature::HostnameOverride) {
        let url = format!("/api/v1/namespaces/{ns}/pods/whole-0");
        let pod: serde_json::Value = loop {
            let req = http::Request::get(url.as_str()).body(Vec::new())?;
            if let Ok(text) = bed.client.request_text(req).await {
                break serde_json::from_str(&text)?;
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "whole-0 was never created: {}",
                sidecar.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(
            pod["spec"]["hostnameOverride"], "trainer",
            "the field reached the pod: {pod}"
        );
    } else {
        let st = loop {
            let (_, st) = sidecar.request("GET", &path, None).await?;
            if st["terminal"] == true {
                break st;
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the task never ended: {st}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let reason = st["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("hostnameOverride"),
            "the server's refusal names the field: {st}"
        );
        let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
        assert!(api.get_opt("whole-0").await?.is_none(), "nothing created");
    }
    Ok(())
}
