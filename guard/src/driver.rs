//! The thin async driver: performs the [`TaskMachine`]'s steps against the API
//! server with kube-rs, watch-driven (no polling), and publishes each
//! transition to the caller and as a Kubernetes Event on the pod.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};

use crate::attempt::{Existing, Observation, Outcome, PodView, Step, TaskMachine, TaskSpec};
use crate::backoff::{at_least, BackoffPolicy, NamespaceBackoffs};
use crate::classify::{classify, ApiError};
use crate::naming::{
    self, ATTEMPT_LABEL, DONE_LABEL, INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL, TASK_LABEL,
};
use crate::phase::Transition;

/// How a [`Guard`] behaves.
#[derive(Clone, Debug)]
pub struct GuardConfig {
    /// This executor instance's name (pod labels, adoption, its Lease).
    pub instance: String,
    /// Quota backoff, shared per namespace (default 1 s doubling to 60 s).
    pub quota_backoff: BackoffPolicy,
    /// Backoff for 429s, 5xx and timeouts (default 200 ms doubling to 10 s).
    pub transient_backoff: BackoffPolicy,
    /// Publish each transition as a Kubernetes Event on the pod.
    pub publish_events: bool,
}

impl GuardConfig {
    pub fn new(instance: &str) -> Self {
        Self {
            instance: instance.to_string(),
            quota_backoff: BackoffPolicy::default(),
            transient_backoff: BackoffPolicy {
                min: Duration::from_millis(200),
                max: Duration::from_secs(10),
                seed: None,
            },
            publish_events: true,
        }
    }
}

/// A failure of the guard itself (not of the task: that is an [`Outcome`]).
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("the pod template is not usable: {0}")]
    Template(String),
    #[error("Kubernetes API: {0}")]
    Api(String),
}

/// The pod an attempt is using now, for callers that must clean up (Ctrl-C).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// Shared slot holding the current attempt's pod.
pub type CurrentPod = Arc<Mutex<Option<PodRef>>>;

/// Runs tasks by graceguard's rules. One per executor instance; cheap to share.
pub struct Guard {
    client: Client,
    config: GuardConfig,
    backoffs: Arc<NamespaceBackoffs>,
    recorder: Recorder,
}

impl Guard {
    pub fn new(client: Client, config: GuardConfig) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "graceguard".into(),
                instance: Some(config.instance.clone()),
            },
        );
        Self {
            backoffs: Arc::new(NamespaceBackoffs::new(config.quota_backoff)),
            client,
            config,
            recorder,
        }
    }

    /// Runs one task to completion from `template` (a Pod; its name is
    /// replaced by the attempt's). `on_transition` sees every phase change.
    pub async fn run(
        &self,
        spec: TaskSpec,
        template: Pod,
        on_transition: impl FnMut(&Transition),
    ) -> Result<Outcome, GuardError> {
        self.run_tracked(spec, template, on_transition, CurrentPod::default())
            .await
    }

    /// [`Guard::run`], keeping `current` set to the attempt's pod.
    pub async fn run_tracked(
        &self,
        spec: TaskSpec,
        template: Pod,
        mut on_transition: impl FnMut(&Transition),
        current: CurrentPod,
    ) -> Result<Outcome, GuardError> {
        if template.spec.is_none() {
            return Err(GuardError::Template("it has no spec".into()));
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &spec.namespace);
        let transient = self.config.transient_backoff;
        let mut retry = transient.build();
        let mut m = TaskMachine::new(spec.clone());
        let mut step = m.start();
        let mut uid = String::new();
        let mut watch: Option<PodWatch> = None;
        let mut retry_after: Option<Duration> = None;
        loop {
            for t in m.take_transitions() {
                on_transition(&t);
                self.publish(&t, &spec.namespace, &uid);
            }
            step = match step {
                Step::Create { name, attempt } => {
                    uid.clear();
                    let pod = pod_for(&template, &spec, &name, attempt);
                    match api.create(&PostParams::default(), &pod).await {
                        Ok(p) => {
                            self.backoffs.reset(&spec.namespace);
                            retry = transient.build();
                            uid = p.uid().unwrap_or_default();
                            set(&current, &spec.namespace, &name, &uid);
                            m.on_created(uid.clone())
                        }
                        Err(kube::Error::Api(s)) => {
                            let e = ApiError {
                                code: s.code,
                                reason: s.reason.clone(),
                                message: s.message.clone(),
                            };
                            let refusal = classify(&e);
                            // 429 (graceguard's retry mode, API priority and
                            // fairness) says how long to wait: at least that.
                            retry_after = s
                                .details
                                .as_ref()
                                .map(|d| Duration::from_secs(d.retry_after_seconds.into()))
                                .filter(|d| !d.is_zero());
                            tracing::debug!(pod = %name, ?refusal, message = %e.message, "create refused");
                            m.on_refused(&refusal)
                        }
                        Err(e) => {
                            tracing::warn!(pod = %name, error = %e, "create outcome unknown; reading the name before creating again");
                            m.on_create_unknown()
                        }
                    }
                }
                Step::WaitForQuota => {
                    let until = self.backoffs.refused(&spec.namespace, Instant::now());
                    tokio::time::sleep_until(until.into()).await;
                    m.retry_create()
                }
                Step::RetryLater => {
                    let backoff = retry.next().unwrap_or(transient.max);
                    tokio::time::sleep(at_least(backoff, retry_after.take())).await;
                    m.retry_create()
                }
                Step::ReadExisting { name } => match api.get_opt(&name).await {
                    Ok(found) => m.on_existing(found.map(|p| Existing {
                        uid: p.uid().unwrap_or_default(),
                        labels: p.labels().clone(),
                    })),
                    Err(e) => {
                        tracing::warn!(pod = %name, error = %e, "reading the pod holding the name failed; retrying");
                        tokio::time::sleep(retry.next().unwrap_or(transient.max)).await;
                        Step::ReadExisting { name }
                    }
                },
                Step::Observe { name, uid: u } => {
                    uid = u;
                    set(&current, &spec.namespace, &name, &uid);
                    observe(&api, &name, &mut m, &mut watch).await
                }
                Step::AwaitGone { name, uid: u } => {
                    // Rule 2: no Create while it exists; watch (not poll) for
                    // NotFound or a uid change.
                    loop {
                        match await_condition(api.clone(), &name, conditions::is_deleted(&u)).await
                        {
                            Ok(_) => break,
                            Err(e) => {
                                tracing::warn!(pod = %name, error = %e, "watching the deletion failed; retrying");
                                tokio::time::sleep(retry.next().unwrap_or(transient.max)).await;
                            }
                        }
                    }
                    clear(&current);
                    m.observe(Observation::Gone)
                }
                Step::Done(outcome) => {
                    clear(&current);
                    return Ok(outcome);
                }
            };
        }
    }

    /// Publishes `t` as an Event on its pod, in the background (best effort).
    fn publish(&self, t: &Transition, namespace: &str, uid: &str) {
        if !self.config.publish_events {
            return;
        }
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(t.pod.clone()),
            namespace: Some(namespace.to_string()),
            uid: (!uid.is_empty()).then(|| uid.to_string()),
            ..Default::default()
        };
        let failed = t.failure_kind.is_some();
        let ev = KubeEvent {
            type_: if failed {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: t.phase.to_string(),
            note: Some(match &t.reason {
                Some(r) => format!("task {} attempt {}: {} ({r})", t.task, t.attempt, t.phase),
                None => format!("task {} attempt {}: {}", t.task, t.attempt, t.phase),
            }),
            action: "Launch".into(),
            secondary: None,
        };
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&ev, &reference).await {
                tracing::debug!(error = %e, "publishing an event failed");
            }
        });
    }
}

fn set(current: &CurrentPod, namespace: &str, name: &str, uid: &str) {
    let mut c = current.lock().unwrap_or_else(|p| p.into_inner());
    *c = Some(PodRef {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    });
}

fn clear(current: &CurrentPod) {
    let mut c = current.lock().unwrap_or_else(|p| p.into_inner());
    *c = None;
}

/// The attempt's pod: the template under the attempt's name, with graceguard's labels.
pub fn pod_for(template: &Pod, spec: &TaskSpec, name: &str, attempt: u32) -> Pod {
    let mut pod = template.clone();
    let meta = &mut pod.metadata;
    meta.name = Some(name.to_string());
    meta.generate_name = None;
    meta.namespace = Some(spec.namespace.clone());
    meta.resource_version = None;
    meta.uid = None;
    meta.creation_timestamp = None;
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.managed_fields = None;
    let labels: &mut BTreeMap<String, String> = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(TASK_LABEL.into(), naming::task_label_value(&spec.task));
    labels.insert(ATTEMPT_LABEL.into(), attempt.to_string());
    labels.insert(INSTANCE_LABEL.into(), spec.instance.clone());
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    pod.status = None;
    pod
}

/// Labels a completed attempt's pod `graceguard.io/done=true` (best effort:
/// a pod already gone needs no label).
async fn mark_done(api: &Api<Pod>, name: &str) {
    let patch = serde_json::json!({"metadata": {"labels": {DONE_LABEL: "true"}}});
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            tracing::warn!(pod = %name, error = %e, "could not mark the completed pod done; an adopter may report it again")
        }
    }
}

/// The view the state machine needs of a pod.
pub fn view_of(pod: &Pod) -> PodView {
    let status = pod.status.as_ref();
    PodView {
        uid: pod.uid().unwrap_or_default(),
        phase: status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into()),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        disruption: status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
            })
            .map(|c| c.reason.clone().unwrap_or_default()),
    }
}

/// A watch of one attempt's pod, kept across phase changes.
struct PodWatch {
    name: String,
    events: BoxStream<'static, Result<Event<Pod>, watcher::Error>>,
    /// The current (re-)list included the pod.
    listed: bool,
}

/// Watches pod `name` (reusing `watch` when it is for that pod) and feeds the
/// machine until it wants something else or has a phase change to report.
async fn observe(
    api: &Api<Pod>,
    name: &str,
    m: &mut TaskMachine,
    watch: &mut Option<PodWatch>,
) -> Step {
    if watch.as_ref().is_none_or(|w| w.name != name) {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        *watch = Some(PodWatch {
            name: name.to_string(),
            events: watcher::watcher(api.clone(), cfg).default_backoff().boxed(),
            listed: false,
        });
    }
    let Some(w) = watch.as_mut() else {
        return m.observe(Observation::Gone);
    };
    while let Some(ev) = w.events.next().await {
        let step = match ev {
            Ok(Event::Init) => {
                w.listed = false;
                continue;
            }
            Ok(Event::InitApply(p)) | Ok(Event::Apply(p)) => {
                w.listed = true;
                let view = view_of(&p);
                let terminal = matches!(view.phase.as_str(), "Succeeded" | "Failed");
                let step = m.observe(Observation::Pod(view));
                if terminal && !matches!(step, Step::Observe { .. }) {
                    // Its result is reported by this run: no adopter may report it again.
                    mark_done(api, name).await;
                }
                step
            }
            Ok(Event::InitDone) if w.listed => continue,
            Ok(Event::InitDone) | Ok(Event::Delete(_)) => m.observe(Observation::Gone),
            Err(e) => {
                tracing::warn!(pod = %name, error = %e, "pod watch failed; the watcher retries with backoff");
                continue;
            }
        };
        if !matches!(step, Step::Observe { .. }) || m.has_transitions() {
            return step;
        }
    }
    // The watcher never ends by itself; if it did, the pod's state is unknown.
    m.observe(Observation::Gone)
}
