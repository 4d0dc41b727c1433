//! Pods as an executor would create them, and what the API server answers.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::Api;

/// The fake node the simulated kubelet serves.
pub const NODE: &str = "node-1";

/// A task pod named `name`, already bound to [`NODE`] (so it stays Terminating
/// after a graceful delete until the simulated kubelet confirms it), with
/// `grace` seconds of termination grace.
pub fn task_pod(name: &str, grace: i64) -> Pod {
    task_pod_on(name, grace, Some(NODE))
}

/// A task pod left for kube-scheduler to place (1.37), with `priority_class`
/// and `cpu` requested, so a node fills up and a higher priority preempts.
pub fn schedulable_pod(name: &str, grace: i64, priority_class: &str, cpu: &str) -> Pod {
    let mut pod = task_pod_on(name, grace, None);
    if let Some(spec) = pod.spec.as_mut() {
        spec.priority_class_name = Some(priority_class.into());
        if let Some(c) = spec.containers.first_mut() {
            c.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
                requests: Some(
                    [(
                        "cpu".to_string(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity(cpu.into()),
                    )]
                    .into(),
                ),
                ..Default::default()
            });
        }
    }
    pod
}

/// Makes `pod`'s container run `script` with `sh -c` in `image` (a real
/// node's task image), never pulled: the bed imports its images.
pub fn run_in(pod: &mut Pod, image: &str, script: &str) {
    if let Some(c) = pod.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.image = Some(image.into());
        c.image_pull_policy = Some("IfNotPresent".into());
        c.command = Some(vec!["sh".into(), "-c".into(), script.into()]);
    }
}

/// A container script that runs until SIGTERM, then exits with `code`
/// after `seconds`: a task that takes that long to shut down (143 = 128 +
/// SIGTERM is what a process that SIGTERM ended reports). A shell that is
/// PID 1 ignores SIGTERM unless it traps it; this one does, first. It
/// waits on its `sleep` with `wait`, which a trapped signal interrupts, so
/// the trap runs at once: a shell in `sleep 1` itself would act on SIGTERM
/// only when that ends, up to a second later, which made a kill take 0–1 s
/// by where the loop stood.
pub fn graceful_script(seconds: u32, code: u8) -> String {
    format!("trap 'echo got SIGTERM; sleep {seconds}; exit {code}' TERM; echo started; while true; do sleep 1 & wait $!; done")
}

/// A task that runs `run_seconds`, then exits 0; on SIGTERM it exits 143
/// after `terminate_seconds`, as [`graceful_script`].
pub fn finite_task_script(run_seconds: u32, terminate_seconds: u32) -> String {
    format!("trap 'echo got SIGTERM; sleep {terminate_seconds}; exit 143' TERM; echo started; i=0; while [ $i -lt {run_seconds} ]; do sleep 1 & wait $!; i=$((i+1)); done; echo done")
}

/// [`task_pod`] bound to `node`, or unbound (`None`) for the scheduler to place.
pub fn task_pod_on(name: &str, grace: i64, node: Option<&str>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("app".to_string(), "task".to_string())].into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: node.map(str::to_string),
            termination_grace_period_seconds: Some(grace),
            restart_policy: Some("Never".into()),
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox:1.36".into()),
                command: Some(vec!["sleep".into(), "3600".into()]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// How the API server answered one Create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    Created,
    /// HTTP status code, reason and message of a refusal.
    Refused {
        code: u16,
        reason: String,
        message: String,
        /// `details.retryAfterSeconds`, 0 when absent.
        retry_after_seconds: u32,
    },
}

impl CreateOutcome {
    /// What client-go's `IsAlreadyExists` says.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Self::Refused { reason, .. } if reason == "AlreadyExists")
    }

    pub fn is_forbidden(&self) -> bool {
        matches!(self, Self::Refused { code: 403, .. })
    }

    pub fn code(&self) -> u16 {
        match self {
            Self::Created => 201,
            Self::Refused { code, .. } => *code,
        }
    }
}

/// Creates `pod`; a refusal by the API server is an outcome, not an error.
pub async fn create(api: &Api<Pod>, pod: &Pod) -> anyhow::Result<CreateOutcome> {
    outcome(api.create(&PostParams::default(), pod).await)
}

/// A write's result as an outcome: the API server's refusal is one, not an error.
pub fn outcome<T>(res: Result<T, kube::Error>) -> anyhow::Result<CreateOutcome> {
    match res {
        Ok(_) => Ok(CreateOutcome::Created),
        Err(kube::Error::Api(s)) => Ok(CreateOutcome::Refused {
            code: s.code,
            reason: s.reason.clone(),
            message: s.message.clone(),
            retry_after_seconds: s.details.as_ref().map_or(0, |d| d.retry_after_seconds),
        }),
        Err(e) => Err(e.into()),
    }
}

/// A graceful delete, as `kubectl delete pod` or a drain sends it.
pub async fn delete_gracefully(
    api: &Api<Pod>,
    name: &str,
    grace: Option<u32>,
) -> anyhow::Result<()> {
    let dp = DeleteParams {
        grace_period_seconds: grace,
        ..Default::default()
    };
    api.delete(name, &dp).await?;
    Ok(())
}

/// Evicts `ns/name` through the Eviction API (`pods/eviction` CREATE), as
/// `kubectl drain` and the cluster-autoscaler do (`policy/v1`). A refusal
/// (429 for a PodDisruptionBudget, 404) is an outcome, not an error.
pub async fn evict(
    client: &kube::Client,
    ns: &str,
    name: &str,
    grace: Option<i64>,
    dry_run: bool,
) -> anyhow::Result<CreateOutcome> {
    let mut options = serde_json::json!({});
    if let Some(g) = grace {
        options["gracePeriodSeconds"] = g.into();
    }
    if dry_run {
        options["dryRun"] = serde_json::json!(["All"]);
    }
    let body = serde_json::json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": ns},
        "deleteOptions": options,
    });
    let req = http::Request::post(format!("/api/v1/namespaces/{ns}/pods/{name}/eviction"))
        .header("Content-Type", "application/json")
        .body(serde_json::to_vec(&body)?)?;
    outcome(client.request_text(req).await)
}

/// How long the wait helpers below wait before failing the test.
const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Waits until pod `name` is Running (the simulated kubelet moves bound pods there).
pub async fn wait_running(api: &Api<Pod>, name: &str) -> anyhow::Result<()> {
    let running = kube::runtime::wait::await_condition(api.clone(), name, |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()?.phase.as_deref()) == Some("Running")
    });
    if tokio::time::timeout(WAIT, running).await.is_err() {
        let status = api.get_opt(name).await?.and_then(|p| p.status);
        let phase = status.as_ref().and_then(|s| s.phase.clone());
        let conditions: Vec<String> = status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .map(|c| format!("{}={} {}", c.type_, c.status, c.message.unwrap_or_default()))
            .collect();
        anyhow::bail!("pod {name} was not Running within {WAIT:?} (phase {phase:?}, conditions {conditions:?})");
    }
    Ok(())
}

/// Waits until the pod `name` with `uid` is gone (NotFound or replaced).
pub async fn wait_gone(api: &Api<Pod>, name: &str, uid: &str) -> anyhow::Result<()> {
    let gone = kube::runtime::wait::await_condition(
        api.clone(),
        name,
        kube::runtime::wait::conditions::is_deleted(uid),
    );
    tokio::time::timeout(WAIT, gone)
        .await
        .map_err(|_| anyhow::anyhow!("pod {name} was still there after {WAIT:?}"))??;
    Ok(())
}

/// Waits until pod `name` carries label `key` = `value`; returns the pod.
pub async fn wait_label(api: &Api<Pod>, name: &str, key: &str, value: &str) -> anyhow::Result<Pod> {
    let labelled = kube::runtime::wait::await_condition(api.clone(), name, |p: Option<&Pod>| {
        p.and_then(|p| p.metadata.labels.as_ref()?.get(key))
            .is_some_and(|v| v == value)
    });
    match tokio::time::timeout(WAIT, labelled).await {
        Ok(Ok(Some(pod))) => Ok(pod),
        Ok(Ok(None)) => anyhow::bail!("pod {name} is gone before it got label {key}={value}"),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => {
            let now = api.get_opt(name).await?.and_then(|p| p.metadata.labels);
            anyhow::bail!(
                "pod {name} did not get label {key}={value} within {WAIT:?}; its labels: {now:?}"
            )
        }
    }
}

/// The `graceguard.io/disruption` label of a stored pod.
pub fn disruption_label(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get("graceguard.io/disruption")
        .map(String::as_str)
}

/// A Create as `api` sends it, dry run (nothing stored): `Ok` when admitted,
/// else the API server's message (`<code> <message>`).
pub async fn admitted(api: &Api<Pod>, pod: &Pod) -> anyhow::Result<Result<(), String>> {
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match api.create(&dry, pod).await {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) => Ok(Err(format!("{} {}", s.code, s.message))),
        Err(e) => Err(e.into()),
    }
}

/// Dry-runs `pod`'s Create until it is refused (a webhook configuration
/// just written takes the API server a moment); the refusal's message.
pub async fn wait_refused(
    api: &Api<Pod>,
    pod: &Pod,
    within: std::time::Duration,
) -> anyhow::Result<String> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Err(why) = admitted(api, pod).await? {
            return Ok(why);
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "pod {} was still admitted {within:?} after the test expected a refusal",
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Waits up to `within` for a Warning event (events.k8s.io) of `reason` on
/// pod `pod` in `namespace`.
pub async fn wait_warning(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    reason: &str,
    within: std::time::Duration,
) -> anyhow::Result<()> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), namespace);
    let deadline = std::time::Instant::now() + within;
    loop {
        let warned = events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .any(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.type_.as_deref() == Some("Warning")
                    && e.regarding.and_then(|r| r.name).as_deref() == Some(pod)
            });
        if warned {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "no {reason} Warning event on {namespace}/{pod} within {within:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
