//! The executor's loop: it owns every task's state and the pod index, turns
//! each watch event, command, API answer and timer into a call of the pure
//! core ([`crate::core::reconcile`], [`crate::core::lifecycle`], [`crate::core::answer`],
//! [`crate::core::result_finalizer::plan`]), and carries out what that decided
//! through a [`PodApi`]. Time is tokio's (paused in its tests); each task's
//! timers sit in one delay queue.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::time::{delay_queue, DelayQueue};

use crate::core::answer::{self, AnswerKind, Now, Released, TransientBackoff};
use crate::core::backoff::{NamespaceBackoffs, Probe};
use crate::core::error::TaskError;
use crate::core::lifecycle::Lifecycle;
use crate::core::naming::{INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL};
use crate::core::pod_record::{PodRecord, RECORD_ANNOTATION, TEMPLATE_ANNOTATION};
use crate::core::reconcile::{self, apply, Action, Decision, PodView, TaskSpec, TaskState};
use crate::core::result_finalizer::{self, ReleaseContext};
use crate::core::task::{Submitted, TaskKey, TaskStatus};
use crate::core::template::{annotate, Template};
use crate::runtime::events::{EventBody, EventLog};
use crate::runtime::executor_config::ExecutorConfig;
use crate::runtime::kube_events::Publisher;
use crate::runtime::pod_api::PodApi;
use crate::runtime::pod_index::PodIndex;

/// The pod watch's health, for `/healthz`.
#[derive(Debug, Default)]
pub struct Stats {
    /// The first pod list has been received.
    pub synced: AtomicBool,
    /// The pod watch's last error, until it works again (a 403 here means
    /// the identity may not list pods in the watched scope).
    pub watch_error: std::sync::Mutex<Option<String>>,
    /// Errors the pod watch has returned since the start (`/metrics`).
    pub watch_errors: std::sync::atomic::AtomicU64,
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

/// What a caller asks the loop.
pub(crate) enum Command {
    Submit {
        spec: TaskSpec,
        template: Box<Template>,
        /// Forget an ended task submitted otherwise and run this one anew.
        replace: bool,
        reply: oneshot::Sender<Result<Submitted, TaskError>>,
    },
    /// One page of tasks in key order, after `after`; with whether more follow.
    List {
        namespace: Option<String>,
        after: Option<TaskKey>,
        limit: usize,
        reply: oneshot::Sender<(Vec<TaskStatus>, bool)>,
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
    Forget {
        key: TaskKey,
        reply: oneshot::Sender<Result<(), TaskError>>,
    },
    /// The task's Result was acknowledged.
    Acknowledged { key: TaskKey },
    /// Answered once no result finalizer is being let go of (a process
    /// about to stop waits for its releases).
    Settle { reply: oneshot::Sender<()> },
    /// How many tasks are in each phase (`/metrics`).
    PhaseCounts {
        reply: oneshot::Sender<Vec<(&'static str, usize)>>,
    },
    /// The pod a Result event is about, with its last resourceVersion.
    PodVersion {
        key: TaskKey,
        uid: String,
        reply: oneshot::Sender<Option<crate::runtime::pod_index::Version>>,
    },
}

/// The loop's clock: milliseconds since the epoch as of the loop's start,
/// advanced by tokio's monotonic clock, so a step of the wall clock (NTP)
/// after the start moves no bound, and the loop's tests drive it with paused
/// time. (A task's deadline is counted from its start as recorded on its
/// pod, which a restarted process reads by its own clock.)
#[derive(Clone, Copy, Debug)]
struct Clock {
    start: Instant,
    start_ms: i64,
}

impl Clock {
    fn new() -> Self {
        // The one read of the wall clock: everything after counts from it.
        #[allow(clippy::disallowed_methods)]
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(millis)
            .unwrap_or(0);
        Self {
            start: Instant::now(),
            start_ms: wall,
        }
    }

    fn now_ms(&self) -> i64 {
        self.start_ms.saturating_add(millis(self.start.elapsed()))
    }

    /// Now, in milliseconds and as the shared backoffs count it.
    fn now(&self) -> Now {
        Now {
            ms: self.now_ms(),
            instant: Instant::now().into_std(),
        }
    }

    /// When `at_ms` comes, at most a day ahead (a bound of u64::MAX seconds
    /// must not overflow the clock; a timer cut short is armed again).
    fn deadline(&self, at_ms: i64) -> Instant {
        let left = u64::try_from(at_ms.saturating_sub(self.now_ms()))
            .unwrap_or(0)
            .min(86_400_000);
        Instant::now() + Duration::from_millis(left)
    }
}

/// A task's timers: when to reconcile it again, when to forget it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimerKind {
    Wake,
    Forget,
}

/// A timer armed in the loop's delay queue.
#[derive(Debug)]
struct Timer {
    at_ms: i64,
    key: delay_queue::Key,
}

/// A pod neither being deleted nor ended: a task with one cannot be
/// forgotten or replaced.
fn still_runs(p: &crate::core::reconcile::PodView) -> bool {
    !p.deleting() && !matches!(p.phase.as_str(), "Succeeded" | "Failed")
}

/// An answer from an API call, for the task that asked.
struct Answer {
    key: TaskKey,
    attempt: u32,
    kind: AnswerKind,
}

struct Entry {
    spec: TaskSpec,
    /// `None` for a task taken up from its pods after a restart until it
    /// is submitted again.
    template: Option<Template>,
    template_hash: String,
    /// `None` until the first list is in.
    state: Option<TaskState>,
    life: Lifecycle,
    transient: TransientBackoff,
    /// Reconciled again then (a backoff or a bound ends).
    wake: Option<Timer>,
    /// Its result was acknowledged: forgotten then.
    forget: Option<Timer>,
}

impl Entry {
    /// A task not yet launched nor resumed (that waits for the first list).
    fn new(
        spec: TaskSpec,
        template: Option<Template>,
        hash: String,
        config: &ExecutorConfig,
        replacing: bool,
    ) -> Self {
        Self {
            spec,
            template,
            template_hash: hash,
            state: None,
            life: Lifecycle::new(replacing),
            transient: TransientBackoff::new(config.transient_backoff),
            wake: None,
            forget: None,
        }
    }

    fn timer(&mut self, kind: TimerKind) -> &mut Option<Timer> {
        match kind {
            TimerKind::Wake => &mut self.wake,
            TimerKind::Forget => &mut self.forget,
        }
    }
}

struct Loop<P> {
    api: P,
    clock: Clock,
    config: ExecutorConfig,
    backoffs: NamespaceBackoffs,
    events: Publisher,
    log: Arc<EventLog>,
    stats: Arc<Stats>,
    answers_tx: mpsc::UnboundedSender<Answer>,
    /// Bounds the pod API calls in flight.
    slots: Arc<tokio::sync::Semaphore>,
    tasks: HashMap<TaskKey, Entry>,
    /// Every task's timers ([`Entry::wake`], [`Entry::forget`]).
    timers: DelayQueue<(TaskKey, TimerKind)>,
    index: PodIndex,
    /// The pods are known from a list made while this process held its
    /// Lease: until then nothing is decided. Cleared when the fence closes
    /// (see [`Loop::fence_changed`]).
    synced: bool,
    /// The fence closed since the last list: when it opens, the pods are
    /// listed again before anything is decided.
    relist_on_reopen: bool,
    /// Answers that came while the fence was closed, applied once it opens.
    deferred: Vec<Answer>,
    /// Pods (uids) whose result finalizer is being let go of.
    releasing: HashSet<String>,
    /// Tasks forgotten while pods of theirs still held the finalizer.
    forgotten: HashSet<TaskKey>,
    /// What is known of namespaces where a held pod is being deleted.
    namespaces: HashMap<String, NamespaceSeen>,
    /// Waiting for the releases in flight to end.
    settling: Vec<oneshot::Sender<()>>,
    /// The bytes of the templates the tasks hold (against
    /// [`ExecutorConfig::max_template_bytes`]).
    template_bytes: usize,
}

/// A namespace as asked about ([`crate::runtime::namespace_state`]).
struct NamespaceSeen {
    terminating: bool,
    asked_at: Instant,
    asking: bool,
}

/// How often a namespace where a held pod is being deleted is asked about.
const NAMESPACE_RECHECK: Duration = Duration::from_secs(10);

/// Starts the loop for `config` on the current runtime, acting through
/// `api` and publishing Events through `events`.
pub(crate) fn spawn<P: PodApi>(
    api: P,
    events: Publisher,
    config: ExecutorConfig,
    log: Arc<EventLog>,
    stats: Arc<Stats>,
    commands: mpsc::UnboundedReceiver<Command>,
) {
    let (answers_tx, answers_rx) = mpsc::unbounded_channel();
    let inner = Loop {
        api,
        clock: Clock::new(),
        events,
        backoffs: NamespaceBackoffs::new(config.quota_backoff),
        slots: Arc::new(tokio::sync::Semaphore::new(config.max_in_flight.max(1))),
        config,
        log,
        stats,
        answers_tx,
        tasks: HashMap::new(),
        timers: DelayQueue::new(),
        index: PodIndex::default(),
        synced: false,
        relist_on_reopen: false,
        deferred: Vec::new(),
        releasing: HashSet::new(),
        forgotten: HashSet::new(),
        namespaces: HashMap::new(),
        settling: Vec::new(),
        template_bytes: 0,
    };
    tokio::spawn(inner.run(commands, answers_rx));
}

/// `template` marked with its hash (pods made from it carry it).
fn with_hash(mut template: Template, hash: &str) -> Template {
    template.annotate(TEMPLATE_ANNOTATION, hash);
    template
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl<P: PodApi> Loop<P> {
    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut answers: mpsc::UnboundedReceiver<Answer>,
    ) {
        let selector = format!(
            "{MANAGED_BY_LABEL}={MANAGED_BY},{INSTANCE_LABEL}={}",
            self.config.instance
        );
        // Before the first list: pods taken over count their deadline by it.
        let clock = self.clock;
        let offset = self.api.server_offset_ms(move || clock.now_ms()).await;
        self.index.set_server_offset(offset);
        let mut watch = self.api.watch(&selector);
        let mut fence = self.config.fence.clone();
        loop {
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
                Some(t) = self.timers.next() => self.fired(t),
                _ = fence.changed() => {
                    if self.fence_changed() {
                        // The old stream is dropped with whatever request
                        // it was waiting on (one sent to an API server that
                        // went away can wait for the client's 295 s read
                        // timeout): a new watcher lists the pods now.
                        watch = self.api.watch(&selector);
                    }
                }
            }
        }
    }

    /// Arms task `key`'s timer `kind` for `at_ms`, or disarms it (`None`).
    fn arm(&mut self, key: &TaskKey, kind: TimerKind, at_ms: Option<i64>) {
        let Some(e) = self.tasks.get_mut(key) else {
            return;
        };
        let slot = e.timer(kind);
        if slot.as_ref().map(|t| t.at_ms) == at_ms {
            return;
        }
        if let Some(old) = slot.take() {
            self.timers.try_remove(&old.key);
        }
        if let Some(at_ms) = at_ms {
            let deadline = self.clock.deadline(at_ms);
            let key = self.timers.insert_at((key.clone(), kind), deadline);
            *slot = Some(Timer { at_ms, key });
        }
    }

    /// A timer came due: the task is reconciled, or forgotten.
    fn fired(&mut self, expired: delay_queue::Expired<(TaskKey, TimerKind)>) {
        let queued = expired.key();
        let (key, kind) = expired.into_inner();
        let Some(e) = self.tasks.get_mut(&key) else {
            return;
        };
        let slot = e.timer(kind);
        // Only the timer armed now counts.
        if slot.as_ref().map(|t| t.key) != Some(queued) {
            return;
        }
        let Some(timer) = slot.take() else {
            return;
        };
        if timer.at_ms > self.clock.now_ms() {
            // Cut short at a day: armed again for the rest.
            self.arm(&key, kind, Some(timer.at_ms));
            return;
        }
        match kind {
            TimerKind::Wake => self.reconcile(&key),
            // Run again since, or a pod still running: kept (a later
            // acknowledgement arms it again).
            TimerKind::Forget => {
                if self.forget(&key).is_ok() {
                    tracing::debug!(task = %key.task, namespace = %key.namespace, "forgot a task whose result was acknowledged");
                }
            }
        }
    }

    /// Whether this process may not act now (its Lease is not held).
    fn fenced(&self) -> bool {
        !self.config.fence.holds()
    }

    /// The fence closed or opened; returns whether the pods must be listed
    /// again before anything is decided. While it is closed the pods seen
    /// may miss what another holder did, and the watch itself may be stuck
    /// on a connection to an API server that went away (CI saw one wait out
    /// the API server's restart for minutes): so an open fence after a
    /// closed one acts only on a new list.
    fn fence_changed(&mut self) -> bool {
        if self.fenced() {
            if self.synced {
                self.synced = false;
                self.relist_on_reopen = true;
            }
            return false;
        }
        for a in std::mem::take(&mut self.deferred) {
            self.answer(a);
        }
        if std::mem::take(&mut self.relist_on_reopen) {
            tracing::info!(instance = %self.config.instance, "the fence opened again; listing the pods before acting");
            return true;
        }
        let keys: Vec<TaskKey> = self.tasks.keys().cloned().collect();
        for k in keys {
            self.reconcile(&k);
        }
        for k in self.index.tasks() {
            self.release(&k);
        }
        false
    }

    fn watched(&mut self, ev: Result<Event<Pod>, watcher::Error>) {
        if ev.is_ok() {
            self.stats.set_watch_error(None);
        }
        match ev {
            Ok(Event::Init) => self.index.begin_relist(),
            Ok(Event::InitApply(p)) => self.index.relisted(&p, self.clock.now_ms()),
            Ok(Event::InitDone) => {
                self.index.end_relist();
                self.take_up_unfinished();
                let first = !self.stats.synced.swap(true, Ordering::Relaxed);
                let resumed = !self.synced;
                self.synced = true;
                if first {
                    tracing::info!(instance = %self.config.instance, pods = self.index.len(), "pod watch synced; resuming tasks");
                } else if resumed {
                    tracing::info!(instance = %self.config.instance, pods = self.index.len(), "pods listed again; acting again");
                }
                let keys: Vec<TaskKey> = self.tasks.keys().cloned().collect();
                for k in keys {
                    self.reconcile(&k);
                }
                for k in self.index.tasks() {
                    self.release(&k);
                }
            }
            Ok(Event::Apply(p)) => {
                if let Some(key) = self.index.apply(&p, self.clock.now_ms()) {
                    self.reconcile(&key);
                    self.release(&key);
                }
            }
            Ok(Event::Delete(p)) => {
                if let Some(key) = self.index.delete(&p) {
                    self.reconcile(&key);
                    self.release(&key);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "pod watch failed; the watcher retries with backoff");
                self.stats.set_watch_error(Some(e.to_string()));
                self.stats.watch_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Tasks this instance's pods say are unfinished, not known here (a
    /// restart): known from now on, resumed from their pods, and served.
    fn take_up_unfinished(&mut self) {
        for (key, recorded, hash) in self.index.unfinished() {
            if self.tasks.contains_key(&key) {
                continue;
            }
            let spec = TaskSpec::from_record(&recorded, &key.namespace, &self.config.instance);
            tracing::info!(task = %spec.task, namespace = %key.namespace, "taking up an unfinished task from its pods");
            let entry = Entry::new(spec, None, hash.unwrap_or_default(), &self.config, false);
            self.tasks.insert(key, entry);
        }
    }

    fn pods(&self, key: &TaskKey) -> Vec<PodView> {
        self.index.views(key)
    }

    /// Tasks by phase, every phase present (zero counts included), so a
    /// series never disappears when its last task leaves it.
    fn phase_counts(&self) -> Vec<(&'static str, usize)> {
        let mut counts: Vec<(&'static str, usize)> = crate::core::phase::PHASE_NAMES
            .iter()
            .map(|p| (*p, 0))
            .collect();
        for e in self.tasks.values() {
            let name = e.state.as_ref().map_or("Launching", |s| s.phase.name());
            match counts.iter_mut().find(|(p, _)| *p == name) {
                Some(slot) => slot.1 += 1,
                // A phase PHASE_NAMES lacks is still counted, not dropped.
                None => counts.push((name, 1)),
            }
        }
        counts
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
                reason: e
                    .life
                    .aborted_before_list()
                    .then(|| "Aborted: before the first pod list was in; never launched".into()),
                failure_kind: None,
                user_failures: 0,
                system_failures: 0,
                terminal: false,
                succeeded: None,
                started: false,
                cleanup_pending: e.life.aborted_before_list(),
                needs_template: e.template.is_none(),
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
            needs_template: e.template.is_none(),
        })
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Submit {
                spec,
                template,
                replace,
                reply,
            } => {
                let _ = reply.send(self.submit(spec, *template, replace));
            }
            Command::List {
                namespace,
                after,
                limit,
                reply,
            } => {
                let _ = reply.send(self.list(namespace.as_deref(), after.as_ref(), limit));
            }
            Command::Status { key, reply } => {
                let _ = reply.send(self.status(&key));
            }
            Command::Retry { key, reply } => {
                let _ = reply.send(self.retry(&key));
            }
            Command::Abort { key, reply } => {
                let _ = reply.send(self.abort(&key));
            }
            Command::Forget { key, reply } => {
                let _ = reply.send(self.forget(&key));
            }
            Command::Acknowledged { key } => {
                let at = self
                    .config
                    .forget_after
                    .map(|d| self.clock.now_ms().saturating_add(millis(d)));
                let ended = self
                    .tasks
                    .get(&key)
                    .and_then(|e| e.state.as_ref())
                    .is_some_and(|s| s.outcome.is_some());
                if ended {
                    self.arm(&key, TimerKind::Forget, at);
                }
            }
            Command::PodVersion { key, uid, reply } => {
                let _ = reply.send(self.index.version(&key, &uid));
            }
            Command::PhaseCounts { reply } => {
                let _ = reply.send(self.phase_counts());
            }
            Command::Settle { reply } => match self.releasing.is_empty() {
                true => {
                    let _ = reply.send(());
                }
                false => self.settling.push(reply),
            },
        }
    }

    /// Lets go of the result finalizer on the task's pods that no longer
    /// need it ([`releasable`]); asks whether the namespace is being deleted
    /// when a pod that keeps it is.
    fn release(&mut self, key: &TaskKey) {
        if !self.synced {
            return;
        }
        let held = self.index.holding_result(key);
        if held.is_empty() {
            self.forgotten.remove(key);
            return;
        }
        let pods = self.pods(key);
        let terminating = self
            .namespaces
            .get(&key.namespace)
            .is_some_and(|n| n.terminating);
        let context = ReleaseContext {
            aborted: self
                .tasks
                .get(key)
                .and_then(|e| e.state.as_ref())
                .is_some_and(|s| s.aborted),
            forgotten: self.forgotten.contains(key),
            namespace_terminating: terminating,
            fenced: self.fenced(),
            max_hold_ms: self.config.max_result_hold.map(millis),
            now_ms: self.clock.now_ms(),
        };
        let uids: Vec<&str> = held.iter().map(|v| v.uid.as_str()).collect();
        let plan = result_finalizer::plan(&pods, &uids, &context);
        if plan.ask_namespace {
            self.ask_namespace(key);
        }
        for v in held {
            if !plan.go.contains(&v.uid) || !self.releasing.insert(v.uid.clone()) {
                continue;
            }
            if plan.too_long.contains(&v.uid) {
                let limit = self.config.max_result_hold.unwrap_or_default();
                let message = format!(
                    "ResultHeldTooLong: pod {} was deleted and kept {}s for a result nobody acknowledged; letting it go (the result is still served by this process until it restarts). Make the executor read and acknowledge /v1/events, or raise --max-result-hold-seconds",
                    v.name,
                    limit.as_secs()
                );
                tracing::warn!(namespace = %key.namespace, pod = %v.name, "{message}");
                self.events
                    .warning(&key.namespace, &v.name, "ResultHeldTooLong".into(), message);
            }
            let api = self.api.clone();
            let tx = self.answers_tx.clone();
            let slots = self.slots.clone();
            let fence = self.config.fence.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let _slot = slots.acquire_owned().await;
                // Asked again right before the write (the fence is a
                // deadline), which carries the term it is sent under; not
                // written: looked at again shortly. In a namespace being
                // deleted a process without the Lease releases without a
                // term (the webhook then has nothing to compare).
                let outcome = match (fence.permit(), terminating) {
                    (Some(permit), _) => api.release(&key.namespace, &v, permit.token()).await,
                    (None, true) => api.release(&key.namespace, &v, None).await,
                    (None, false) => Released::Failed,
                };
                let kind = AnswerKind::Released {
                    uid: v.uid,
                    outcome,
                };
                let _ = tx.send(Answer {
                    key,
                    attempt: 0,
                    kind,
                });
            });
        }
    }

    /// Asks whether `key`'s namespace is being deleted (at most every
    /// [`NAMESPACE_RECHECK`]; asked again then while a held pod is deleted).
    fn ask_namespace(&mut self, key: &TaskKey) {
        let now = Instant::now();
        self.namespaces
            .retain(|_, n| n.terminating || n.asking || now - n.asked_at < NAMESPACE_RECHECK * 6);
        if let Some(n) = self.namespaces.get(&key.namespace) {
            if n.terminating || n.asking || now - n.asked_at < NAMESPACE_RECHECK {
                return;
            }
        }
        self.namespaces.insert(
            key.namespace.clone(),
            NamespaceSeen {
                terminating: false,
                asked_at: now,
                asking: true,
            },
        );
        let api = self.api.clone();
        let tx = self.answers_tx.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let answer = api.namespace_terminating(&key.namespace).await;
            let _ = tx.send(Answer {
                key,
                attempt: 0,
                kind: AnswerKind::Namespace(answer),
            });
        });
    }

    /// Answers about result finalizers and namespaces (any task's, also of
    /// tasks not known here): false if `kind` is none of those.
    fn release_answer(&mut self, key: &TaskKey, kind: &AnswerKind) -> bool {
        match kind {
            AnswerKind::Released { uid, outcome } => {
                self.releasing.remove(uid);
                match outcome {
                    Released::Done => {}
                    // The new version may be in the index already.
                    Released::Changed => self.release(key),
                    Released::Failed => self.recheck_later(key, Duration::from_secs(5)),
                }
                if self.releasing.is_empty() {
                    for r in self.settling.drain(..) {
                        let _ = r.send(());
                    }
                }
            }
            AnswerKind::Namespace(answer) => {
                let terminating = *answer == Some(true);
                if let Some(n) = self.namespaces.get_mut(&key.namespace) {
                    n.asking = false;
                    n.terminating = terminating;
                }
                if terminating {
                    tracing::info!(namespace = %key.namespace, "the namespace is being deleted; letting go of the result finalizers of its task pods");
                    for k in self.index.tasks_in(&key.namespace) {
                        self.release(&k);
                    }
                } else {
                    // Asked again while a held pod there is being deleted.
                    self.recheck_later(key, NAMESPACE_RECHECK);
                }
            }
            AnswerKind::Recheck => self.release(key),
            _ => return false,
        }
        true
    }

    fn recheck_later(&self, key: &TaskKey, after: Duration) {
        let tx = self.answers_tx.clone();
        let key = key.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = tx.send(Answer {
                key,
                attempt: 0,
                kind: AnswerKind::Recheck,
            });
        });
    }

    /// Removes an ended task none of whose pods still runs.
    fn forget(&mut self, key: &TaskKey) -> Result<(), TaskError> {
        let Some(e) = self.tasks.get(key) else {
            return Err(TaskError::NotFound(key.task.clone()));
        };
        let Some(s) = e.state.as_ref().filter(|s| s.outcome.is_some()) else {
            return Err(TaskError::NotEnded(key.task.clone()));
        };
        if self.pods(key).iter().any(still_runs) || s.delete_on_sight {
            return Err(TaskError::CleanupPending(key.task.clone()));
        }
        self.arm(key, TimerKind::Wake, None);
        self.arm(key, TimerKind::Forget, None);
        if let Some(t) = self.tasks.remove(key).and_then(|e| e.template) {
            self.template_bytes = self.template_bytes.saturating_sub(t.bytes());
        }
        self.log.forget(&key.namespace, &key.task);
        // Nobody will acknowledge its result now: its pods let go.
        self.forgotten.insert(key.clone());
        self.release(key);
        Ok(())
    }

    fn abort(&mut self, key: &TaskKey) -> Result<TaskStatus, TaskError> {
        let pods = self.pods(key);
        let now = self.clock.now_ms();
        let Some(e) = self.tasks.get_mut(key) else {
            return Err(TaskError::NotFound(key.task.clone()));
        };
        let state = e.state.take();
        // Before the first list: remembered, and carried out then.
        if let Some((s, d)) = e.life.abort(&e.spec, state, &pods, now) {
            self.perform(key, s, d);
        }
        self.status(key)
            .ok_or(TaskError::NotFound(key.task.clone()))
    }

    fn submit(
        &mut self,
        spec: TaskSpec,
        template: Template,
        replace: bool,
    ) -> Result<Submitted, TaskError> {
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
        let hash = template.hash();
        if let Some(e) = self.tasks.get_mut(&key) {
            let known_hash = !e.template_hash.is_empty() || e.template.is_some();
            let conflict = if e.spec.task != spec.task {
                Some(TaskError::StemTaken {
                    task: spec.task.clone(),
                    stem: key.task.clone(),
                    other: e.spec.task.clone(),
                })
            } else if known_hash && e.template_hash != hash {
                Some(TaskError::TemplateConflict(spec.task.clone()))
            } else if !e.spec.same_settings(&spec) {
                Some(TaskError::SpecConflict(spec.task.clone()))
            } else {
                None
            };
            match (conflict, replace) {
                // Replacing is for this task, never another's.
                (Some(e @ TaskError::StemTaken { .. }), _) | (Some(e), false) => return Err(e),
                // Ended and no pod of it left running, or refused.
                (Some(_), true) => self.forget(&key)?,
                (None, _) => {
                    self.take_template(&key, template, hash)?;
                    return self.submitted(&key, false);
                }
            }
        }
        // Pods of another task whose name gives the same stem: never taken
        // for this one's, replaced or not.
        if let Some(other) = self.index.other_task(&key, &spec.task) {
            return Err(TaskError::StemTaken {
                task: spec.task,
                stem: key.task,
                other,
            });
        }
        // Pods of this task made from another template (before a restart).
        if self.index.other_template(&key, &hash) {
            if !replace {
                return Err(TaskError::TemplateConflict(spec.task));
            }
            if self.pods(&key).iter().any(still_runs) {
                return Err(TaskError::CleanupPending(spec.task));
            }
        }
        self.room_for(&key, &template)?;
        let mut spec = spec;
        spec.instance = self.config.instance.clone();
        let template = with_hash(template, &hash);
        self.template_bytes += template.bytes();
        let entry = Entry::new(spec, Some(template), hash, &self.config, replace);
        self.tasks.insert(key.clone(), entry);
        // A task forgotten before under this key lets go of its pods by the
        // new task's rule now (they are not its newest).
        self.forgotten.remove(&key);
        if self.synced {
            self.reconcile(&key);
        }
        self.submitted(&key, true)
    }

    /// Whether a task may be added under `key` with `template` (a task
    /// already known only adds its template): the executor's limits on
    /// tasks and template bytes, so many submissions cannot exhaust its
    /// memory.
    fn room_for(&self, key: &TaskKey, template: &Template) -> Result<(), TaskError> {
        let max = self.config.max_tasks;
        if !self.tasks.contains_key(key) && self.tasks.len() >= max {
            return Err(TaskError::TooManyTasks { max });
        }
        let (held, bytes, max) = (
            self.template_bytes,
            template.bytes(),
            self.config.max_template_bytes,
        );
        if held.saturating_add(bytes) > max {
            return Err(TaskError::TemplatesFull { held, bytes, max });
        }
        Ok(())
    }

    /// A task submitted again with its template: one taken up after a
    /// restart (it had none) can launch again.
    fn take_template(
        &mut self,
        key: &TaskKey,
        template: Template,
        hash: String,
    ) -> Result<(), TaskError> {
        match self.tasks.get(key) {
            Some(e) if e.template.is_none() => self.room_for(key, &template)?,
            _ => return Ok(()),
        }
        let Some(e) = self.tasks.get_mut(key) else {
            return Ok(());
        };
        self.template_bytes += template.bytes();
        e.template = Some(with_hash(template, &hash));
        e.template_hash = hash;
        if e.life.template_came() {
            // The held Create: its outcome is "unknown", so the name
            // is read first, then created.
            let attempt = e.state.as_ref().map_or(0, |s| s.attempt);
            let _ = self.answers_tx.send(Answer {
                key: key.clone(),
                attempt,
                kind: AnswerKind::Unknown,
            });
        }
        Ok(())
    }

    fn submitted(&self, key: &TaskKey, created: bool) -> Result<Submitted, TaskError> {
        let status = self
            .status(key)
            .ok_or_else(|| TaskError::NotFound(key.task.clone()))?;
        Ok(Submitted { status, created })
    }

    /// Up to `limit` tasks after `after` in key order (of `namespace`, if
    /// given), and whether more follow.
    fn list(
        &self,
        namespace: Option<&str>,
        after: Option<&TaskKey>,
        limit: usize,
    ) -> (Vec<TaskStatus>, bool) {
        let mut keys: Vec<&TaskKey> = self
            .tasks
            .keys()
            .filter(|k| namespace.is_none_or(|n| k.namespace == n))
            .filter(|k| after.is_none_or(|a| *k > a))
            .collect();
        keys.sort_unstable();
        let more = keys.len() > limit;
        let page = keys
            .into_iter()
            .take(limit)
            .filter_map(|k| self.status(k))
            .collect();
        (page, more)
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
        let (s, d) = e.life.retry(&spec, s, self.clock.now_ms());
        self.arm(key, TimerKind::Forget, None);
        self.perform(key, s, d);
        self.reconcile(key);
        self.status(key)
            .ok_or(TaskError::NotFound(key.task.clone()))
    }

    fn reconcile(&mut self, key: &TaskKey) {
        // Nothing is decided before the first list, nor while another
        // process may hold the instance's Lease.
        if !self.synced || self.fenced() {
            return;
        }
        let pods = self.pods(key);
        let stem = match self.tasks.get(key) {
            Some(e) if e.state.is_none() => self.index.stem(key),
            _ => None,
        };
        let now = self.clock.now_ms();
        let Some(e) = self.tasks.get_mut(key) else {
            return;
        };
        if e.state.is_none() && !pods.is_empty() && e.life.resumes() {
            tracing::info!(task = %e.spec.task, namespace = %key.namespace, "resuming a task from its pods");
        }
        let state = e.state.take();
        let (state, d) = e.life.reconcile(&mut e.spec, state, &pods, stem, now);
        self.perform(key, state, d);
    }

    fn answer(&mut self, a: Answer) {
        if self.release_answer(&a.key, &a.kind) {
            return;
        }
        if self.fenced() {
            self.deferred.push(a);
            return;
        }
        let pods = self.pods(&a.key);
        let now = self.clock.now();
        let Some(e) = self.tasks.get_mut(&a.key) else {
            return;
        };
        let Some(state) = e.state.take() else {
            return;
        };
        if state.attempt != a.attempt {
            // An answer for an attempt already left behind (its pod, if
            // any, is a stray the reconciler deletes when the watch shows it).
            e.state = Some(state);
            return;
        }
        let Some(input) = answer::input(a.kind, &a.key, &mut e.transient, &self.backoffs, now)
        else {
            e.state = Some(state);
            return;
        };
        let spec = e.spec.clone();
        let (s, d) = apply(&spec, state, input, &pods, now.ms);
        self.perform(&a.key, s, d);
    }

    /// Stores the new state and carries out the decision.
    fn perform(&mut self, key: &TaskKey, state: TaskState, d: Decision) {
        let Some(e) = self.tasks.get_mut(key) else {
            return;
        };
        let outcome = state.outcome.clone();
        let attempt = state.attempt;
        let newly_ended = e.life.report(&state);
        e.state = Some(state);
        let spec = e.spec.clone();
        self.arm(key, TimerKind::Wake, d.wake_at_ms);
        for t in &d.transitions {
            let uid = self.index.live_uid(key, &t.pod);
            self.events.transition(t, &key.namespace, uid.as_deref());
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
        self.release(key);
    }

    fn act(&mut self, key: &TaskKey, spec: &TaskSpec, attempt: u32, action: Action) {
        let api = self.api.clone();
        let tx = self.answers_tx.clone();
        let slots = self.slots.clone();
        let fence = self.config.fence.clone();
        let key = key.clone();
        match action {
            Action::Create {
                name,
                attempt,
                record,
            } => {
                let fenced = self.fenced();
                let Some(e) = self.tasks.get_mut(&key) else {
                    return;
                };
                let Some(template) = &e.template else {
                    // Taken up after a restart and not submitted again:
                    // held until its template comes with a PUT.
                    e.life.hold_create();
                    return;
                };
                if fenced {
                    // Decided just before the fence closed: not sent. Its
                    // outcome is "unknown" (the name is read first once the
                    // fence opens again).
                    self.deferred.push(Answer {
                        key,
                        attempt,
                        kind: AnswerKind::Unknown,
                    });
                    return;
                }
                if let Probe::WaitUntil(until) =
                    self.backoffs
                        .probe(&key.namespace, &key.task, self.clock.now().instant)
                {
                    // The namespace waits for quota and another task probes
                    // it: no Create from this one now.
                    let _ = tx.send(Answer {
                        key,
                        attempt,
                        kind: AnswerKind::Held(until),
                    });
                    return;
                }
                let mut pod = template.pod_for(spec, &name, attempt);
                // What the task has spent, by this process's clock, as sent.
                let now = self.clock.now_ms();
                let spent = record.started_ms.map(|s| now.saturating_sub(s).max(0));
                let record = PodRecord {
                    spent_ms: spent,
                    ..record
                };
                annotate(&mut pod, RECORD_ANNOTATION, &record.to_annotation());
                tokio::spawn(async move {
                    let _slot = slots.acquire_owned().await;
                    // The fence is a deadline: asked again right before the
                    // write, after any wait for a slot, and the Create
                    // carries the term it is sent under (graceguard's
                    // webhook refuses it if it arrives late). Not sent:
                    // "unknown", the name is read first once the fence opens
                    // again.
                    let kind = match fence.permit() {
                        Some(permit) => {
                            if let Some(token) = permit.token() {
                                annotate(
                                    &mut pod,
                                    graceguard_contract::fencing::ANNOTATION,
                                    &token,
                                );
                            }
                            api.create(&key.namespace, &pod).await
                        }
                        None => AnswerKind::Unknown,
                    };
                    let _ = tx.send(Answer { key, attempt, kind });
                });
            }
            Action::Read { name } => {
                tokio::spawn(async move {
                    let _slot = slots.acquire_owned().await;
                    let kind = api.read(&key.namespace, &name).await;
                    let _ = tx.send(Answer { key, attempt, kind });
                });
            }
            Action::Delete { name, uid } => {
                tokio::spawn(async move {
                    let _slot = slots.acquire_owned().await;
                    if !fence.holds() || !api.delete_exact(&key.namespace, &name, &uid).await {
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
                self.events.warning(&key.namespace, &pod, reason, message);
            }
        }
    }
}

#[cfg(test)]
#[path = "executor_loop_tests.rs"]
mod tests;
