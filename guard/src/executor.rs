//! The executor: every task of one instance, reconciled from one shared pod
//! watch.
//!
//! One label-selected watch (`managed-by=graceguard`, this instance) feeds a
//! per-task index of pods; each change, each answer to an API call and each
//! timer runs [`reconcile`] for the task concerned, and its actions are
//! performed here. No Create is sent before the watch's first list is in, so a
//! restarted instance first sees the pods it made and resumes their tasks
//! ([`restore`]) instead of creating them again. The loop owns all state;
//! callers talk to it through [`Executor`]'s methods.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::ExponentialBackoff;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::backoff::{at_least, BackoffPolicy, NamespaceBackoffs};
use crate::classify::{classify, ApiError, CreateRefusal};
use crate::events::{EventBody, EventLog, Logged};
use crate::naming::{
    self, ATTEMPT_LABEL, DONE_LABEL, INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL, TASK_LABEL,
};
use crate::phase::{FailureKind, Transition};
use crate::pod_record::{template_hash, PodRecord, RECORD_ANNOTATION, TEMPLATE_ANNOTATION};
use crate::reconcile::{
    self, apply, reconcile, restore, Action, Decision, Existing, Input, Outcome, PodView, TaskSpec,
    TaskState,
};

/// How an [`Executor`] behaves.
#[derive(Clone, Debug)]
pub struct ExecutorConfig {
    /// This executor instance's name (pod labels, adoption, its Lease).
    pub instance: String,
    /// Watch this namespace only (`None`: all namespaces, which needs
    /// cluster-wide list and watch on pods).
    pub namespace: Option<String>,
    /// Quota backoff, shared per namespace (default 1 s doubling to 60 s).
    pub quota_backoff: BackoffPolicy,
    /// Backoff for 429s, 5xx and timeouts (default 200 ms doubling to 10 s).
    pub transient_backoff: BackoffPolicy,
    /// Publish each transition as a Kubernetes Event on the pod.
    pub publish_events: bool,
    /// Pod Creates, reads and deletes in flight at once (default 16): a
    /// thousand tasks submitted together queue here instead of meeting the
    /// API server's priority and fairness limits (429) all at once.
    pub max_in_flight: usize,
}

impl ExecutorConfig {
    pub fn new(instance: &str) -> Self {
        Self {
            instance: instance.to_string(),
            namespace: None,
            quota_backoff: BackoffPolicy::default(),
            transient_backoff: BackoffPolicy {
                min: Duration::from_millis(200),
                max: Duration::from_secs(10),
                seed: None,
            },
            publish_events: true,
            max_in_flight: 16,
        }
    }
}

/// A task's identity: its namespace and task label value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskKey {
    pub namespace: String,
    pub task: String,
}

impl TaskKey {
    pub fn new(namespace: &str, task: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            task: naming::task_label_value(task),
        }
    }

    /// Whether task `task` in `namespace` is this one.
    pub fn is(&self, namespace: &str, task: &str) -> bool {
        namespace == self.namespace && naming::task_label_value(task) == self.task
    }
}

/// A task as its caller sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TaskStatus {
    pub namespace: String,
    pub task: String,
    pub attempt: u32,
    pub pod: String,
    /// The current pod's uid, once created.
    pub uid: Option<String>,
    pub phase: &'static str,
    pub reason: Option<String>,
    pub failure_kind: Option<FailureKind>,
    pub user_failures: u32,
    pub system_failures: u32,
    pub terminal: bool,
    pub succeeded: Option<bool>,
    /// False until the instance's first pod list is in (the task is then
    /// resumed from its pods, or launched).
    pub started: bool,
    /// Ended while its pod's uid was unknown: the pod is deleted when it
    /// shows up (see `uid` then).
    pub cleanup_pending: bool,
}

/// Why a request about a task was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TaskError {
    #[error("task {0} is already submitted with a different pod template; use another task name or DELETE it first")]
    TemplateConflict(String),
    #[error("task {0} is not known to this executor; PUT it first")]
    NotFound(String),
    #[error("task {0} has not ended; a retry is for a task that has ended (DELETE aborts it)")]
    NotEnded(String),
    #[error("the pod template is not usable: {0}")]
    Template(String),
    #[error("this executor watches namespace {watched} only, not {asked}; run a sidecar for {asked} or one without --namespace")]
    WrongNamespace { watched: String, asked: String },
    #[error("the executor has stopped")]
    Stopped,
}

/// What a done-mark came to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Marked {
    /// This instance labelled the pod done.
    Done,
    /// Already done, or changed under another claim: another adopter won.
    Lost,
    /// The pod no longer exists.
    Gone,
    /// The API server could not be asked; the event stays acknowledged, the
    /// pod unmarked (it is delivered again after a restart).
    Failed(String),
}

/// The pod watch's health, for `/healthz`.
#[derive(Debug, Default)]
pub struct Stats {
    /// The first pod list has been received.
    pub synced: AtomicBool,
    /// The pod watch's last error, until it works again (a 403 here means
    /// the identity may not list pods in the watched scope).
    pub watch_error: std::sync::Mutex<Option<String>>,
}

impl Stats {
    fn set_watch_error(&self, e: Option<String>) {
        let mut slot = self.watch_error.lock().unwrap_or_else(|p| p.into_inner());
        *slot = e;
    }

    /// The pod watch's last error, if it has not recovered since.
    pub fn watch_error(&self) -> Option<String> {
        self.watch_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

enum Command {
    Submit {
        spec: TaskSpec,
        template: Box<Pod>,
        reply: oneshot::Sender<Result<TaskStatus, TaskError>>,
    },
    Status {
        key: TaskKey,
        reply: oneshot::Sender<Option<TaskStatus>>,
    },
    Retry {
        key: TaskKey,
        reply: oneshot::Sender<Result<TaskStatus, TaskError>>,
    },
    Abort {
        key: TaskKey,
        reply: oneshot::Sender<Result<TaskStatus, TaskError>>,
    },
    /// The pod a Result event is about, with its last resourceVersion.
    PodVersion {
        key: TaskKey,
        uid: String,
        reply: oneshot::Sender<Option<(String, String)>>,
    },
}

/// An answer from an API call, for the task that asked.
struct Answer {
    key: TaskKey,
    attempt: u32,
    kind: AnswerKind,
}

enum AnswerKind {
    Created(String),
    Refused {
        refusal: CreateRefusal,
        retry_after: Option<Duration>,
    },
    Unknown,
    Read(Option<Existing>),
    ReadFailed,
    DeleteFailed,
}

/// A running executor; cheap to clone. Dropping every clone stops it.
#[derive(Clone)]
pub struct Executor {
    tx: mpsc::UnboundedSender<Command>,
    log: Arc<EventLog>,
    stats: Arc<Stats>,
    client: Client,
    instance: String,
}

impl Executor {
    /// Starts the watch and the loop (on the current tokio runtime).
    pub fn start(client: Client, config: ExecutorConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let log = Arc::new(EventLog::default());
        let stats = Arc::new(Stats::default());
        let (answers_tx, answers_rx) = mpsc::unbounded_channel();
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "graceguard".into(),
                instance: Some(config.instance.clone()),
            },
        );
        let inner = Loop {
            client: client.clone(),
            backoffs: NamespaceBackoffs::new(config.quota_backoff),
            config: config.clone(),
            recorder,
            log: log.clone(),
            stats: stats.clone(),
            answers_tx,
            slots: Arc::new(tokio::sync::Semaphore::new(config.max_in_flight.max(1))),
            tasks: HashMap::new(),
            index: HashMap::new(),
            relist: None,
            synced: false,
        };
        tokio::spawn(inner.run(rx, answers_rx));
        Self {
            tx,
            log,
            stats,
            client,
            instance: config.instance,
        }
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).ok()?;
        rx.await.ok()
    }

    /// Submits a task (idempotent: the same task with the same template
    /// returns its status; another template is a [`TaskError::TemplateConflict`]).
    pub async fn submit(&self, spec: TaskSpec, template: Pod) -> Result<TaskStatus, TaskError> {
        if template
            .spec
            .as_ref()
            .is_none_or(|s| s.containers.is_empty())
        {
            return Err(TaskError::Template("it has no spec.containers".into()));
        }
        let template = Box::new(template);
        self.ask(|reply| Command::Submit {
            spec,
            template,
            reply,
        })
        .await
        .unwrap_or(Err(TaskError::Stopped))
    }

    pub async fn status(&self, key: &TaskKey) -> Option<TaskStatus> {
        let key = key.clone();
        self.ask(|reply| Command::Status { key, reply })
            .await
            .flatten()
    }

    /// Starts the next attempt of a task that has ended (the executor's own
    /// retry decision).
    pub async fn retry(&self, key: &TaskKey) -> Result<TaskStatus, TaskError> {
        let key = key.clone();
        self.ask(|reply| Command::Retry { key, reply })
            .await
            .unwrap_or(Err(TaskError::Stopped))
    }

    /// Aborts a task: its current pod is deleted (uid precondition).
    pub async fn abort(&self, key: &TaskKey) -> Result<TaskStatus, TaskError> {
        let key = key.clone();
        self.ask(|reply| Command::Abort { key, reply })
            .await
            .unwrap_or(Err(TaskError::Stopped))
    }

    /// The event log (transitions, results, adoptions).
    pub fn log(&self) -> &Arc<EventLog> {
        &self.log
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Acknowledges every event up to `seq`; the pods of the results among
    /// them are marked done (conditionally on the resourceVersion seen).
    pub async fn ack(&self, seq: u64) -> Vec<(u64, Marked)> {
        self.mark(self.log.ack(seq)).await
    }

    /// Acknowledges exactly the events `seqs` (callers sharing the log).
    pub async fn ack_only(&self, seqs: &[u64]) -> Vec<(u64, Marked)> {
        self.mark(self.log.ack_only(seqs)).await
    }

    async fn mark(&self, acked: Vec<Logged>) -> Vec<(u64, Marked)> {
        let mut marks = Vec::new();
        for e in acked {
            let marked = match &e.body {
                EventBody::Result {
                    namespace,
                    task,
                    outcome,
                } => match &outcome.uid {
                    Some(uid) => {
                        let key = TaskKey::new(namespace, task);
                        let uid = uid.clone();
                        let found = self
                            .ask(|reply| Command::PodVersion { key, uid, reply })
                            .await
                            .flatten();
                        match found {
                            Some((name, rv)) => {
                                mark_done(&self.client, namespace, &name, &rv, &self.instance).await
                            }
                            None => Marked::Gone,
                        }
                    }
                    None => continue,
                },
                EventBody::Adopted { pod } => {
                    mark_done(
                        &self.client,
                        &pod.namespace,
                        &pod.name,
                        &pod.resource_version,
                        &self.instance,
                    )
                    .await
                }
                _ => continue,
            };
            marks.push((e.seq, marked));
        }
        marks
    }

    /// Runs `adopter` in the background: what it finds goes into the event
    /// log as `adopted` and `gone` events; acknowledging an `adopted` event
    /// marks its pod done.
    pub fn adopt_with(&self, mut adopter: crate::adoption::Adopter) -> tokio::task::JoinHandle<()> {
        use crate::adoption::Found;
        let log = self.log.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            while !tx.is_closed() {
                let found = match adopter.sync(Duration::from_secs(5)).await {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::warn!(error = %e, "adoption sync failed; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                for f in found {
                    log.push(match f {
                        Found::Completed(pod) => EventBody::Adopted { pod },
                        Found::Gone(pod) => EventBody::Gone { pod },
                    });
                }
            }
        })
    }

    /// Waits until the task's Result event is logged; returns it (for
    /// callers that run one task and then stop, like `graceguard run`).
    pub async fn wait_result(
        &self,
        key: &TaskKey,
        mut on_transition: impl FnMut(&Transition),
    ) -> Result<Outcome, TaskError> {
        let mut after = 0;
        loop {
            if self.tx.is_closed() {
                return Err(TaskError::Stopped);
            }
            let events = self.log.after(after, 1000, Duration::from_secs(5)).await;
            for Logged { seq, body } in events {
                after = seq;
                match body {
                    EventBody::Transition {
                        namespace,
                        transition,
                    } if key.is(&namespace, &transition.task) => on_transition(&transition),
                    EventBody::Result {
                        namespace,
                        task,
                        outcome,
                    } if key.is(&namespace, &task) => {
                        self.ack_only(&[seq]).await;
                        return Ok(outcome);
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Labels pod `name` done for `instance`, conditionally on resourceVersion
/// `rv`: a pod changed since is re-read, and if another instance has marked
/// or claimed it meanwhile, this one has lost it.
pub async fn mark_done(
    client: &Client,
    namespace: &str,
    name: &str,
    rv: &str,
    instance: &str,
) -> Marked {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut rv = rv.to_string();
    // A conflict from an unrelated change (a status update) is retried on
    // the new version, unless the pod is done by then.
    for _ in 0..3 {
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": rv, "labels": {DONE_LABEL: "true"}}
        });
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Marked::Done,
            Err(kube::Error::Api(s)) if s.code == 404 => return Marked::Gone,
            Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(name).await {
                Ok(Some(p)) if p.labels().get(DONE_LABEL).is_some_and(|v| v == "true") => {
                    return Marked::Lost
                }
                // Claimed by another instance since (this one's Lease
                // lapsed): it delivers the result, not this one.
                Ok(Some(p))
                    if p.annotations()
                        .get(crate::adoption::CLAIMED_BY_ANNOTATION)
                        .is_some_and(|c| c != instance) =>
                {
                    return Marked::Lost
                }
                Ok(Some(p)) => rv = p.resource_version().unwrap_or_default(),
                Ok(None) => return Marked::Gone,
                Err(e) => return Marked::Failed(format!("re-reading pod {name}: {e}")),
            },
            Err(e) => return Marked::Failed(format!("marking pod {name} done: {e}")),
        }
    }
    Marked::Failed(format!("pod {name} kept changing while being marked done"))
}

/// A pod in the index.
struct Indexed {
    view: PodView,
    name: String,
    resource_version: String,
    template_hash: Option<String>,
}

struct Entry {
    spec: TaskSpec,
    template: Pod,
    template_hash: String,
    /// `None` until the first list is in.
    state: Option<TaskState>,
    wake_at_ms: Option<i64>,
    transient: ExponentialBackoff,
    /// The outcome was logged as a Result.
    reported: bool,
    /// Aborted before the first pod list was in: aborted when it is.
    aborted: bool,
}

struct Loop {
    client: Client,
    config: ExecutorConfig,
    backoffs: NamespaceBackoffs,
    recorder: Recorder,
    log: Arc<EventLog>,
    stats: Arc<Stats>,
    answers_tx: mpsc::UnboundedSender<Answer>,
    /// Bounds the pod API calls in flight.
    slots: Arc<tokio::sync::Semaphore>,
    tasks: HashMap<TaskKey, Entry>,
    /// The watch's pods, by task and uid.
    index: HashMap<TaskKey, BTreeMap<String, Indexed>>,
    /// A re-list in progress.
    relist: Option<HashMap<TaskKey, BTreeMap<String, Indexed>>>,
    synced: bool,
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn time_ms(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> i64 {
    t.0.as_millisecond()
}

/// The reason of a pod's `DisruptionTarget=True` condition (preemption,
/// eviction, a kubelet's termination), if it has one.
pub(crate) fn disruption_reason(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        .map(|c| c.reason.clone().unwrap_or_default())
}

/// The pod as the index keeps it; `None` for a pod without valid task labels.
fn indexed(pod: &Pod) -> Option<(TaskKey, Indexed)> {
    let labels = pod.labels();
    let task = labels.get(TASK_LABEL)?;
    let attempt: u32 = labels.get(ATTEMPT_LABEL)?.parse().ok()?;
    let status = pod.status.as_ref();
    let meta = &pod.metadata;
    let view = PodView {
        uid: pod.uid()?,
        attempt,
        phase: status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into()),
        disruption: disruption_reason(pod),
        created_ms: meta.creation_timestamp.as_ref().map_or(0, time_ms),
        deletion_ms: meta.deletion_timestamp.as_ref().map(time_ms),
        done: labels.get(DONE_LABEL).is_some_and(|v| v == "true"),
        record: PodRecord::from_annotations(pod.annotations()),
    };
    let key = TaskKey {
        namespace: pod.namespace()?,
        task: task.clone(),
    };
    Some((
        key,
        Indexed {
            view,
            name: pod.name_any(),
            resource_version: pod.resource_version().unwrap_or_default(),
            template_hash: pod.annotations().get(TEMPLATE_ANNOTATION).cloned(),
        },
    ))
}

/// The attempt's pod: the template under the attempt's name, with
/// graceguard's labels and the task's record.
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
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(TASK_LABEL.into(), naming::task_label_value(&spec.task));
    labels.insert(ATTEMPT_LABEL.into(), attempt.to_string());
    labels.insert(INSTANCE_LABEL.into(), spec.instance.clone());
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    labels.remove(DONE_LABEL);
    pod.status = None;
    pod
}

/// The hash of a template as submitted.
fn hash_of(template: &Pod) -> String {
    template_hash(&serde_json::to_value(template).unwrap_or_default())
}

impl Loop {
    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut answers: mpsc::UnboundedReceiver<Answer>,
    ) {
        let api: Api<Pod> = match &self.config.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let selector = format!(
            "{MANAGED_BY_LABEL}={MANAGED_BY},{INSTANCE_LABEL}={}",
            self.config.instance
        );
        let mut watch = watcher::watcher(api, watcher::Config::default().labels(&selector))
            .default_backoff()
            .boxed();
        loop {
            let wake = self
                .tasks
                .values()
                .filter_map(|e| e.wake_at_ms)
                .min()
                .map(|at| {
                    // At most a day ahead: a bound of u64::MAX seconds must
                    // not overflow the clock (it is re-computed every turn).
                    let left = u64::try_from(at.saturating_sub(now_ms()))
                        .unwrap_or(0)
                        .min(86_400_000);
                    tokio::time::Instant::now() + Duration::from_millis(left)
                });
            tokio::select! {
                c = commands.recv() => match c {
                    Some(c) => self.command(c),
                    // Every handle dropped: stop.
                    None => return,
                },
                Some(a) = answers.recv() => self.answer(a),
                ev = watch.next() => match ev {
                    Some(ev) => self.watched(ev),
                    None => return,
                },
                _ = sleep_until_opt(wake) => self.wake(),
            }
        }
    }

    fn watched(&mut self, ev: Result<Event<Pod>, watcher::Error>) {
        if ev.is_ok() {
            self.stats.set_watch_error(None);
        }
        match ev {
            Ok(Event::Init) => self.relist = Some(HashMap::new()),
            Ok(Event::InitApply(p)) => {
                if let (Some(buf), Some((key, ix))) = (self.relist.as_mut(), indexed(&p)) {
                    buf.entry(key).or_default().insert(ix.view.uid.clone(), ix);
                }
            }
            Ok(Event::InitDone) => {
                if let Some(buf) = self.relist.take() {
                    self.index = buf;
                }
                let first = !self.synced;
                self.synced = true;
                self.stats.synced.store(true, Ordering::Relaxed);
                if first {
                    tracing::info!(instance = %self.config.instance, pods = self.index.values().map(BTreeMap::len).sum::<usize>(), "pod watch synced; resuming tasks");
                }
                let keys: Vec<TaskKey> = self.tasks.keys().cloned().collect();
                for k in keys {
                    self.reconcile(&k);
                }
            }
            Ok(Event::Apply(p)) => {
                if let Some((key, ix)) = indexed(&p) {
                    self.index
                        .entry(key.clone())
                        .or_default()
                        .insert(ix.view.uid.clone(), ix);
                    self.reconcile(&key);
                }
            }
            Ok(Event::Delete(p)) => {
                if let Some((key, ix)) = indexed(&p) {
                    if let Some(m) = self.index.get_mut(&key) {
                        m.remove(&ix.view.uid);
                        if m.is_empty() {
                            self.index.remove(&key);
                        }
                    }
                    self.reconcile(&key);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "pod watch failed; the watcher retries with backoff");
                self.stats.set_watch_error(Some(e.to_string()));
            }
        }
    }

    fn pods(&self, key: &TaskKey) -> Vec<PodView> {
        self.index
            .get(key)
            .map(|m| m.values().map(|i| i.view.clone()).collect())
            .unwrap_or_default()
    }

    fn status(&self, key: &TaskKey) -> Option<TaskStatus> {
        let e = self.tasks.get(key)?;
        let Some(s) = &e.state else {
            return Some(TaskStatus {
                namespace: key.namespace.clone(),
                task: e.spec.task.clone(),
                attempt: 0,
                pod: e.spec.pod_name(0),
                uid: None,
                phase: "Launching",
                reason: None,
                failure_kind: None,
                user_failures: 0,
                system_failures: 0,
                terminal: false,
                succeeded: None,
                started: false,
                cleanup_pending: e.aborted,
            });
        };
        let (reason, failure_kind) = s.phase.reason_and_kind();
        Some(TaskStatus {
            namespace: key.namespace.clone(),
            task: e.spec.task.clone(),
            attempt: s.attempt,
            pod: e.spec.pod_name(s.attempt),
            uid: match &s.pod {
                reconcile::PodTrack::Created { uid, .. } => Some(uid.clone()),
                _ => s.outcome.as_ref().and_then(|o| o.uid.clone()),
            },
            phase: s.phase.name(),
            reason,
            failure_kind,
            user_failures: s.user_failures,
            system_failures: s.system_failures,
            terminal: s.outcome.is_some(),
            succeeded: s.outcome.as_ref().map(|o| o.succeeded),
            started: true,
            cleanup_pending: s.delete_on_sight,
        })
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Submit {
                spec,
                template,
                reply,
            } => {
                let _ = reply.send(self.submit(spec, *template));
            }
            Command::Status { key, reply } => {
                let _ = reply.send(self.status(&key));
            }
            Command::Retry { key, reply } => {
                let _ = reply.send(self.retry(&key));
            }
            Command::Abort { key, reply } => {
                let r = match self.tasks.get_mut(&key) {
                    None => Err(TaskError::NotFound(key.task.clone())),
                    Some(e) => {
                        if let Some(s) = e.state.take() {
                            let spec = e.spec.clone();
                            let pods = self.pods(&key);
                            let (s, d) = apply(&spec, s, Input::Abort, &pods, now_ms());
                            self.perform(&key, s, d);
                        }
                        self.status(&key)
                            .ok_or(TaskError::NotFound(key.task.clone()))
                    }
                };
                let _ = reply.send(r);
            }
            Command::PodVersion { key, uid, reply } => {
                let found = self
                    .index
                    .get(&key)
                    .and_then(|m| m.get(&uid))
                    .map(|i| (i.name.clone(), i.resource_version.clone()));
                let _ = reply.send(found);
            }
        }
    }

    fn submit(&mut self, spec: TaskSpec, template: Pod) -> Result<TaskStatus, TaskError> {
        if let Some(watched) = &self.config.namespace {
            if *watched != spec.namespace {
                // Its pods would never reach the watch.
                return Err(TaskError::WrongNamespace {
                    watched: watched.clone(),
                    asked: spec.namespace,
                });
            }
        }
        let key = TaskKey::new(&spec.namespace, &spec.task);
        let hash = hash_of(&template);
        if let Some(e) = self.tasks.get(&key) {
            if e.template_hash != hash || e.spec.task != spec.task {
                return Err(TaskError::TemplateConflict(spec.task));
            }
            return self.status(&key).ok_or(TaskError::NotFound(spec.task));
        }
        // Pods of this task made from another template (before a restart).
        let other = self.index.get(&key).is_some_and(|m| {
            m.values()
                .any(|i| i.template_hash.as_ref().is_some_and(|h| *h != hash))
        });
        if other {
            return Err(TaskError::TemplateConflict(spec.task));
        }
        let mut spec = spec;
        spec.instance = self.config.instance.clone();
        let mut template = template;
        template
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(TEMPLATE_ANNOTATION.into(), hash.clone());
        self.tasks.insert(
            key.clone(),
            Entry {
                spec,
                template,
                template_hash: hash,
                state: None,
                wake_at_ms: None,
                transient: self.config.transient_backoff.build(),
                reported: false,
                aborted: false,
            },
        );
        if self.synced {
            self.reconcile(&key);
        }
        self.status(&key).ok_or(TaskError::NotFound(key.task))
    }

    fn retry(&mut self, key: &TaskKey) -> Result<TaskStatus, TaskError> {
        let Some(e) = self.tasks.get_mut(key) else {
            return Err(TaskError::NotFound(key.task.clone()));
        };
        let Some(s) = e.state.take() else {
            return Err(TaskError::NotEnded(key.task.clone()));
        };
        if s.outcome.is_none() {
            e.state = Some(s);
            return Err(TaskError::NotEnded(key.task.clone()));
        }
        let spec = e.spec.clone();
        let (s, d) = reconcile::retry(&spec, s, now_ms());
        e.reported = false;
        self.perform(key, s, d);
        self.reconcile(key);
        self.status(key)
            .ok_or(TaskError::NotFound(key.task.clone()))
    }

    fn wake(&mut self) {
        let now = now_ms();
        let due: Vec<TaskKey> = self
            .tasks
            .iter()
            .filter(|(_, e)| e.wake_at_ms.is_some_and(|w| w <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            if let Some(e) = self.tasks.get_mut(&k) {
                e.wake_at_ms = None;
            }
            self.reconcile(&k);
        }
    }

    fn reconcile(&mut self, key: &TaskKey) {
        if !self.synced {
            return;
        }
        let pods = self.pods(key);
        let Some(e) = self.tasks.get_mut(key) else {
            return;
        };
        let now = now_ms();
        let (state, launch) = match e.state.take() {
            Some(s) => (s, Decision::default()),
            None if pods.is_empty() => reconcile::launch(&e.spec, now),
            None => {
                let s = restore(&pods, now);
                tracing::info!(task = %e.spec.task, namespace = %key.namespace, attempt = s.attempt, "resuming a task from its pods");
                (s, Decision::default())
            }
        };
        let spec = e.spec.clone();
        let (state, mut d) = match std::mem::take(&mut e.aborted) {
            true => apply(&spec, state, Input::Abort, &pods, now),
            false => reconcile(&spec, state, &pods, now),
        };
        let mut all = launch;
        all.transitions.append(&mut d.transitions);
        all.actions.append(&mut d.actions);
        all.wake_at_ms = d.wake_at_ms;
        self.perform(key, state, all);
    }

    fn answer(&mut self, a: Answer) {
        let pods = self.pods(&a.key);
        let Some(e) = self.tasks.get_mut(&a.key) else {
            return;
        };
        let Some(state) = e.state.take() else {
            return;
        };
        if state.attempt != a.attempt {
            // An answer for an attempt already left behind.
            e.state = Some(state);
            return;
        }
        let now = now_ms();
        let policy = self.config.transient_backoff;
        let input = match a.kind {
            AnswerKind::Created(uid) => {
                self.backoffs.reset(&a.key.namespace);
                e.transient = policy.build();
                Input::Created { uid }
            }
            AnswerKind::Refused {
                refusal,
                retry_after,
            } => {
                let wait = match refusal {
                    CreateRefusal::QuotaFull => self
                        .backoffs
                        .refused(&a.key.namespace, Instant::now())
                        .saturating_duration_since(Instant::now()),
                    CreateRefusal::HolderTerminating => retry_after.unwrap_or(
                        Duration::from_millis(reconcile::HOLDER_RECHECK_MS.unsigned_abs()),
                    ),
                    _ => at_least(e.transient.next().unwrap_or(policy.max), retry_after),
                };
                Input::Refused {
                    refusal,
                    retry_at_ms: now.saturating_add(millis(wait)),
                }
            }
            AnswerKind::Unknown => Input::CreateUnknown,
            AnswerKind::Read(found) => Input::Read(found),
            AnswerKind::ReadFailed => Input::ReadFailed {
                retry_at_ms: now.saturating_add(millis(e.transient.next().unwrap_or(policy.max))),
            },
            AnswerKind::DeleteFailed => Input::DeleteFailed {
                retry_at_ms: now.saturating_add(millis(e.transient.next().unwrap_or(policy.max))),
            },
        };
        let spec = e.spec.clone();
        let (s, d) = apply(&spec, state, input, &pods, now);
        self.perform(&a.key, s, d);
    }

    /// Stores the new state and carries out the decision.
    fn perform(&mut self, key: &TaskKey, state: TaskState, d: Decision) {
        let Some(e) = self.tasks.get_mut(key) else {
            return;
        };
        let outcome = state.outcome.clone();
        let attempt = state.attempt;
        e.state = Some(state);
        e.wake_at_ms = d.wake_at_ms;
        let spec = e.spec.clone();
        let newly_ended = outcome.is_some() && !e.reported;
        e.reported |= outcome.is_some();
        let uid_of = |name: &str| -> Option<String> {
            self.index.get(key).and_then(|m| {
                m.values()
                    .find(|i| i.name == name && !i.view.deleting())
                    .map(|i| i.view.uid.clone())
            })
        };
        for t in &d.transitions {
            let uid = uid_of(&t.pod);
            self.publish(t, &key.namespace, uid.as_deref());
            self.log.push(EventBody::Transition {
                namespace: key.namespace.clone(),
                transition: t.clone(),
            });
        }
        for a in d.actions {
            self.act(key, &spec, attempt, a);
        }
        if let (true, Some(o)) = (newly_ended, outcome) {
            // Delivered at least once: also when the task is submitted again
            // after a restart (its pod may be labelled done already).
            self.log.push(EventBody::Result {
                namespace: key.namespace.clone(),
                task: spec.task.clone(),
                outcome: o,
            });
        }
    }

    fn act(&mut self, key: &TaskKey, spec: &TaskSpec, attempt: u32, action: Action) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        let tx = self.answers_tx.clone();
        let slots = self.slots.clone();
        let key = key.clone();
        match action {
            Action::Create {
                name,
                attempt,
                record,
            } => {
                let Some(e) = self.tasks.get(&key) else {
                    return;
                };
                let mut pod = pod_for(&e.template, spec, &name, attempt);
                pod.metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(RECORD_ANNOTATION.into(), record.to_annotation());
                tokio::spawn(async move {
                    let _slot = slots.acquire_owned().await;
                    let kind = match api.create(&PostParams::default(), &pod).await {
                        Ok(p) => AnswerKind::Created(p.uid().unwrap_or_default()),
                        Err(kube::Error::Api(s)) => {
                            let e = ApiError {
                                code: s.code,
                                reason: s.reason.clone(),
                                message: s.message.clone(),
                                causes: s
                                    .details
                                    .iter()
                                    .flat_map(|d| d.causes.iter().map(|c| c.reason.clone()))
                                    .collect(),
                            };
                            let refusal = classify(&e);
                            tracing::debug!(pod = %name, ?refusal, message = %e.message, "create refused");
                            AnswerKind::Refused {
                                refusal,
                                // 429 (graceguard's retry mode, API priority
                                // and fairness) says how long to wait.
                                retry_after: s
                                    .details
                                    .as_ref()
                                    .map(|d| Duration::from_secs(d.retry_after_seconds.into()))
                                    .filter(|d| !d.is_zero()),
                            }
                        }
                        Err(e) => {
                            tracing::warn!(pod = %name, error = %e, "create outcome unknown; reading the name before creating again");
                            AnswerKind::Unknown
                        }
                    };
                    let _ = tx.send(Answer { key, attempt, kind });
                });
            }
            Action::Read { name } => {
                tokio::spawn(async move {
                    let _slot = slots.acquire_owned().await;
                    let kind = match api.get_opt(&name).await {
                        Ok(found) => AnswerKind::Read(found.map(|p| Existing {
                            uid: p.uid().unwrap_or_default(),
                            labels: p.labels().clone(),
                            deleting: p.metadata.deletion_timestamp.is_some(),
                        })),
                        Err(e) => {
                            tracing::warn!(pod = %name, error = %e, "reading the pod holding the name failed; retrying");
                            AnswerKind::ReadFailed
                        }
                    };
                    let _ = tx.send(Answer { key, attempt, kind });
                });
            }
            Action::Delete { name, uid } => {
                tokio::spawn(async move {
                    let _slot = slots.acquire_owned().await;
                    if !delete_exact(&api, &name, &uid).await {
                        let kind = AnswerKind::DeleteFailed;
                        let _ = tx.send(Answer { key, attempt, kind });
                    }
                });
            }
            Action::Warn {
                pod,
                reason,
                message,
            } => {
                tracing::warn!(namespace = %key.namespace, %pod, %reason, "{message}");
                self.event(
                    &key.namespace,
                    &pod,
                    None,
                    EventType::Warning,
                    reason,
                    message,
                );
            }
        }
    }

    /// Publishes `t` as an Event on its pod.
    fn publish(&self, t: &Transition, namespace: &str, uid: Option<&str>) {
        let note = match &t.reason {
            Some(r) => format!("task {} attempt {}: {} ({r})", t.task, t.attempt, t.phase),
            None => format!("task {} attempt {}: {}", t.task, t.attempt, t.phase),
        };
        let kind = match t.failure_kind {
            Some(_) => EventType::Warning,
            None => EventType::Normal,
        };
        self.event(namespace, &t.pod, uid, kind, t.phase.to_string(), note);
    }

    /// Publishes an Event on pod `pod` in the background (best effort).
    fn event(
        &self,
        namespace: &str,
        pod: &str,
        uid: Option<&str>,
        type_: EventType,
        reason: String,
        note: String,
    ) {
        if !self.config.publish_events {
            return;
        }
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.to_string()),
            namespace: Some(namespace.to_string()),
            uid: uid.map(str::to_string),
            ..Default::default()
        };
        let ev = KubeEvent {
            type_,
            reason,
            note: Some(note),
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

/// Deletes pod `name` gracefully only if it is still `uid` (a pod of the same
/// name created since is left alone). False if the API server could not be
/// asked (the caller tries again later).
pub async fn delete_exact(api: &Api<Pod>, name: &str, uid: &str) -> bool {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    if let Err(e) = api.delete(name, &dp).await {
        // 404: already gone; 409: the name holds another pod now.
        if !matches!(&e, kube::Error::Api(s) if s.code == 404 || s.code == 409) {
            tracing::warn!(pod = %name, error = %e, "deleting the pod failed; trying again after a backoff");
            return false;
        }
    }
    true
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
