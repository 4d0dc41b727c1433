//! The reconcile core: rules 1, 2, 3 and 5 and the bounds, free of I/O and
//! of clocks.
//!
//! [`reconcile`] takes a task's state, the pods of the task as the shared
//! watch sees them, and the time, and returns the next state and what to do.
//! The answers to those actions (a Create's result, a read of a name) come
//! back through [`apply`]. The state is plain data ([`TaskState`] is serde):
//! everything that must survive a restart is also written on each pod the
//! task creates ([`crate::core::pod_record`]), so [`restore`] rebuilds it from the
//! cluster and a restarted executor resumes a task instead of starting it
//! over (and meeting its own pod with a Create).

use serde::{Deserialize, Serialize};

use crate::core::bounds::{after, Bounds};
use crate::core::classify::CreateRefusal;
use crate::core::naming::{self, ATTEMPT_LABEL, INSTANCE_LABEL, TASK_LABEL};
use crate::core::phase::{FailureKind, Phase, Transition};
use crate::core::pod_record::{PodRecord, RecordedSpec};

/// How long a created pod may be missing from the watch before its name is
/// read directly (the watch is normally a few milliseconds behind).
pub const WATCH_LAG_MS: i64 = 30_000;

/// The highest attempt number (attempt labels come from pods anyone with
/// write access may edit; counting past this would wrap to used names).
pub const MAX_ATTEMPT: u32 = u32::MAX - 1;

/// One task to run to completion.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    pub task: String,
    pub namespace: String,
    /// The executor instance launching it (labels, adoption, leases).
    pub instance: String,
    /// User failures (container exits) retried before the task fails.
    pub retries: u32,
    /// Consecutive system failures (preemptions, external deletions) before
    /// the task fails; reset only when an attempt reaches Running.
    pub max_system_failures: u32,
    #[serde(default)]
    pub bounds: Bounds,
    /// Submitted again after its last run's result was delivered and
    /// acknowledged (its pod is marked done), the task runs again under its
    /// next pod name; false: that result is reported again (see [`resume`]).
    #[serde(default)]
    pub rerun_done: bool,
    /// The stem of the task's pod names and its task label when its pods
    /// already use one other than [`naming::task_stem`] gives today (pods
    /// made before 0.2.0, whose hashes were 8 digits): the executor sets it
    /// from those pods, so a task resumed across the upgrade keeps one name
    /// scheme and every action finds its pods. `None`: `task_stem(task)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stem: Option<String>,
}

impl TaskSpec {
    /// A spec with the default bounds.
    pub fn new(task: &str, namespace: &str, instance: &str) -> Self {
        Self {
            task: task.into(),
            namespace: namespace.into(),
            instance: instance.into(),
            retries: 0,
            max_system_failures: 3,
            bounds: Bounds::default(),
            rerun_done: false,
            stem: None,
        }
    }

    /// The stem of its pod names and the value of its task label.
    pub fn stem(&self) -> String {
        self.stem
            .clone()
            .unwrap_or_else(|| naming::task_stem(&self.task))
    }

    /// The pod name of `attempt`.
    pub fn pod_name(&self, attempt: u32) -> String {
        naming::pod_name_from_stem(&self.stem(), attempt)
    }

    /// What a pod records of this spec.
    pub fn recorded(&self) -> RecordedSpec {
        RecordedSpec {
            task: self.task.clone(),
            retries: self.retries,
            max_system_failures: self.max_system_failures,
            bounds: self.bounds.clone(),
            rerun_done: self.rerun_done,
        }
    }

    /// The spec a pod of `namespace` and `instance` recorded.
    pub fn from_record(r: &RecordedSpec, namespace: &str, instance: &str) -> Self {
        Self {
            task: r.task.clone(),
            namespace: namespace.to_string(),
            instance: instance.to_string(),
            retries: r.retries,
            max_system_failures: r.max_system_failures.max(1),
            bounds: r.bounds.clone(),
            rerun_done: r.rerun_done,
            stem: None,
        }
    }

    /// Whether `other` asks for the same task (the instance aside).
    pub fn same_settings(&self, other: &TaskSpec) -> bool {
        self.recorded() == other.recorded() && self.namespace == other.namespace
    }
}

/// A pod of the task, as the watch last saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    pub uid: String,
    /// Its attempt label.
    pub attempt: u32,
    /// `status.phase` (Pending when absent).
    pub phase: String,
    /// Its `DisruptionTarget=True` reason, if any.
    pub disruption: Option<String>,
    /// `metadata.creationTimestamp`, ms since the epoch.
    pub created_ms: i64,
    /// `metadata.deletionTimestamp` (the end of its grace period), ms.
    pub deletion_ms: Option<i64>,
    /// Labelled done: its result was delivered and acknowledged.
    pub done: bool,
    /// Deleted with no grace left (the kubelet's final delete, a force
    /// delete, a pod that never reached a node): it would be gone but for a
    /// finalizer (graceguard's result finalizer keeps it until its result is
    /// acknowledged), so it counts as gone.
    pub finished: bool,
    /// What the task had spent when this pod was created.
    pub record: Option<PodRecord>,
    /// When the task started, by this process's clock, from what the pod
    /// says the task had spent and when the API server created it (by the
    /// API server's clock, whose offset from this process's clock was
    /// measured): `None` where either is unknown.
    pub task_started_ms: Option<i64>,
}

impl PodView {
    pub fn deleting(&self) -> bool {
        self.deletion_ms.is_some()
    }

    /// A pod of attempt `attempt` in `phase`, created at 1,000 ms plus its
    /// attempt, not deleted: the decision modules' unit tests start here.
    #[cfg(test)]
    pub(crate) fn sample(uid: &str, attempt: u32, phase: &str) -> Self {
        Self {
            uid: uid.into(),
            attempt,
            phase: phase.into(),
            disruption: None,
            created_ms: 1_000 + i64::from(attempt),
            deletion_ms: None,
            done: false,
            finished: false,
            record: None,
            task_started_ms: None,
        }
    }
}

/// The pod found holding a name after AlreadyExists or an unknown outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Existing {
    pub uid: String,
    pub labels: std::collections::BTreeMap<String, String>,
    /// It has a deletionTimestamp: the name frees itself.
    pub deleting: bool,
}

/// How long to wait before creating again when a terminating pod that is
/// not ours holds the name (graceguard's webhook answered 409, or no webhook
/// runs): short, as most containers exit long before their grace ends.
pub const HOLDER_RECHECK_MS: i64 = 2_000;

/// Where the current attempt's pod stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PodTrack {
    /// To be created (when `not_before` allows).
    ToCreate,
    /// A Create is in flight.
    Creating,
    /// A Create's outcome is unknown: the name is read before anything else.
    Unknown,
    /// A read of the name is in flight.
    Reading,
    /// Created with this uid; `seen` once the watch has shown it.
    Created { uid: String, seen: bool, at_ms: i64 },
}

/// How a task ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "sidecar", derive(utoipa::ToSchema))]
pub struct Outcome {
    pub succeeded: bool,
    pub failure_kind: Option<FailureKind>,
    pub reason: Option<String>,
    /// Attempts started (pod names used).
    pub attempts: u32,
    /// User failures (the user's retry budget spent).
    pub user_failures: u32,
    /// System failures in all.
    pub system_failures: u32,
    /// The pod whose end decided it.
    pub pod: String,
    /// That pod's uid, when it existed.
    pub uid: Option<String>,
}

/// A task's whole state: serializable, and rebuilt by [`restore`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskState {
    pub attempt: u32,
    pub user_failures: u32,
    pub system_failures: u32,
    pub consecutive_system_failures: u32,
    pub transient_retries: u32,
    pub phase: Phase,
    /// When the task was first launched (the deadline counts from here).
    pub started_ms: i64,
    pub pod: PodTrack,
    /// No Create before this (a quota or transient backoff).
    pub not_before_ms: Option<i64>,
    /// Why graceguard itself asked for the current pod's deletion.
    pub deleting_for: Option<String>,
    pub outcome: Option<Outcome>,
    /// The task ended (aborted, past its deadline) while its pod's uid was
    /// not known yet (a Create in flight, an unknown outcome): the attempt's
    /// pod is deleted as soon as it shows up.
    #[serde(default)]
    pub delete_on_sight: bool,
    /// Pods of earlier attempts still running (an attempt aborted while its
    /// Create was in flight, then retried) whose deletion was asked for.
    #[serde(default)]
    pub stray_deletes: Vec<String>,
    /// A Delete failed: those deletions are asked again at this time.
    #[serde(default)]
    pub stray_retry_ms: Option<i64>,
    /// The read in flight follows an AlreadyExists.
    #[serde(default)]
    pub name_taken: bool,
    /// Ended by an abort: no result to keep, so its pods let go of the
    /// result finalizer ([`crate::core::result_finalizer`]).
    #[serde(default)]
    pub aborted: bool,
}

/// One thing for the I/O layer to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create attempt `attempt`'s pod under `name`, with `record` on it.
    Create {
        name: String,
        attempt: u32,
        record: PodRecord,
    },
    /// Read the pod holding `name`, then [`Input::Read`].
    Read { name: String },
    /// Delete pod `name` gracefully with a uid precondition.
    Delete { name: String, uid: String },
    /// Publish a Warning event on pod `pod`.
    Warn {
        pod: String,
        reason: String,
        message: String,
    },
}

/// What [`reconcile`] and [`apply`] decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    pub actions: Vec<Action>,
    pub transitions: Vec<Transition>,
    /// Call [`reconcile`] again at this time (a backoff or a bound ends).
    pub wake_at_ms: Option<i64>,
}

/// An answer to an [`Action`], or the executor's own word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    Created {
        uid: String,
    },
    /// A refused Create; `retry_at_ms` is when its backoff ends.
    Refused {
        refusal: CreateRefusal,
        retry_at_ms: i64,
    },
    /// No answer to a Create (timeout, reset connection).
    CreateUnknown,
    /// What holds the name (`None`: nothing).
    Read(Option<Existing>),
    /// The read failed; try again at `retry_at_ms`.
    ReadFailed {
        retry_at_ms: i64,
    },
    /// A Delete the decision asked for failed; try again at `retry_at_ms`.
    DeleteFailed {
        retry_at_ms: i64,
    },
    /// The executor gives up on the task: its pod is deleted.
    Abort,
}

/// A fresh task, launched at `now_ms` (no transition recorded).
pub fn start(now_ms: i64) -> TaskState {
    TaskState {
        attempt: 0,
        user_failures: 0,
        system_failures: 0,
        consecutive_system_failures: 0,
        transient_retries: 0,
        phase: Phase::Launching,
        started_ms: now_ms,
        pod: PodTrack::ToCreate,
        not_before_ms: None,
        deleting_for: None,
        outcome: None,
        delete_on_sight: false,
        stray_deletes: Vec::new(),
        stray_retry_ms: None,
        name_taken: false,
        aborted: false,
    }
}

/// A fresh task, launched at `now_ms`, with its Launching transition.
pub fn launch(spec: &TaskSpec, now_ms: i64) -> (TaskState, Decision) {
    let mut t = Task::new(spec, start(now_ms));
    t.record(Phase::Launching);
    t.finish()
}

/// The executor decided to run an ended task again: the next attempt under
/// the next name. Counters are kept (the consecutive count restarts).
pub fn retry(spec: &TaskSpec, state: TaskState, _now_ms: i64) -> (TaskState, Decision) {
    let mut t = Task::new(spec, state);
    if t.s.outcome.is_some() && t.s.attempt < MAX_ATTEMPT {
        t.s.outcome = None;
        t.s.delete_on_sight = false;
        t.s.attempt += 1;
        t.s.consecutive_system_failures = 0;
        t.s.transient_retries = 0;
        t.s.deleting_for = None;
        t.s.not_before_ms = None;
        t.s.aborted = false;
        t.s.pod = PodTrack::ToCreate;
        t.record(Phase::Launching);
    }
    t.finish()
}

/// The state of a task whose pods are `pods`, as a restarted executor finds
/// them: the newest attempt's pod, with what its record says had been spent.
/// No pods: a fresh task.
pub fn restore(pods: &[PodView], now_ms: i64) -> TaskState {
    let Some(newest) = pods.iter().max_by_key(|p| (p.attempt, p.created_ms)) else {
        return start(now_ms);
    };
    let r = newest.record.clone().unwrap_or_default();
    TaskState {
        attempt: newest.attempt,
        user_failures: r.user_failures,
        system_failures: r.system_failures,
        consecutive_system_failures: r.consecutive_system_failures,
        transient_retries: 0,
        phase: Phase::Queued,
        // By this process's clock where the pod says enough; else the
        // launching process's record (another host's clock, after a
        // failover), else when this process first saw the pod.
        started_ms: newest
            .task_started_ms
            .or(r.started_ms)
            .unwrap_or(newest.created_ms),
        pod: PodTrack::Created {
            uid: newest.uid.clone(),
            seen: true,
            at_ms: now_ms,
        },
        not_before_ms: None,
        deleting_for: None,
        outcome: None,
        delete_on_sight: false,
        stray_deletes: Vec::new(),
        stray_retry_ms: None,
        name_taken: false,
        aborted: false,
    }
}

/// How a restarted executor takes up a task submitted again whose `pods`
/// it finds: none, a fresh launch; the newest pod marked done (its result was
/// delivered and acknowledged: a finished run, such as a CronJob's last), a
/// new run under the next name when the spec asks for it
/// ([`TaskSpec::rerun_done`]), else that run's result again, saying so;
/// otherwise the run is resumed ([`restore`]).
pub fn resume(spec: &TaskSpec, pods: &[PodView], now_ms: i64) -> (TaskState, Decision) {
    let Some(newest) = pods.iter().max_by_key(|p| (p.attempt, p.created_ms)) else {
        return launch(spec, now_ms);
    };
    let finished = newest.done && matches!(newest.phase.as_str(), "Succeeded" | "Failed");
    if !finished {
        return (restore(pods, now_ms), Decision::default());
    }
    if spec.rerun_done && newest.attempt < MAX_ATTEMPT {
        return next_run(spec, newest.attempt, now_ms);
    }
    let mut t = Task::new(spec, start(now_ms));
    t.s.attempt = newest.attempt;
    let succeeded = newest.phase == "Succeeded";
    let reason = format!(
        "AlreadyDone: pod {} (attempt {}) ended {} and its result was delivered and acknowledged before this submission; submit the task with rerun_done to run it again",
        spec.pod_name(newest.attempt),
        newest.attempt,
        newest.phase
    );
    let kind = (!succeeded).then_some(FailureKind::User);
    t.s.outcome = Some(Outcome {
        succeeded,
        failure_kind: kind,
        reason: Some(reason.clone()),
        attempts: newest.attempt.saturating_add(1),
        user_failures: 0,
        system_failures: 0,
        pod: spec.pod_name(newest.attempt),
        uid: Some(newest.uid.clone()),
    });
    match kind {
        None => t.record(Phase::Succeeded),
        Some(kind) => t.record(Phase::Failed { kind, reason }),
    }
    t.finish()
}

/// A new run after the pods of an earlier one: its own counters, the pod
/// name after `last_attempt`'s.
fn next_run(spec: &TaskSpec, last_attempt: u32, now_ms: i64) -> (TaskState, Decision) {
    let mut t = Task::new(spec, start(now_ms));
    t.s.attempt = last_attempt + 1;
    t.record(Phase::Launching);
    t.finish()
}

/// A task submitted with `replace` over an earlier run's `pods` (another
/// template or settings, none of them running): a new run under the name
/// after the newest of them, so no name is ever reused. With no name left,
/// it is taken up like any resubmission ([`resume`]).
pub fn replace(spec: &TaskSpec, pods: &[PodView], now_ms: i64) -> (TaskState, Decision) {
    match pods.iter().map(|p| p.attempt).max() {
        None => launch(spec, now_ms),
        Some(a) if a < MAX_ATTEMPT => next_run(spec, a, now_ms),
        Some(_) => resume(spec, pods, now_ms),
    }
}

/// Decides the next step of `state` given the task's `pods` at `now_ms`.
pub fn reconcile(
    spec: &TaskSpec,
    state: TaskState,
    pods: &[PodView],
    now_ms: i64,
) -> (TaskState, Decision) {
    let mut t = Task::new(spec, state);
    t.reconcile(pods, now_ms);
    t.finish()
}

/// Feeds an answer (or the executor's word) into `state`, then reconciles
/// with the task's `pods` as the watch shows them now.
pub fn apply(
    spec: &TaskSpec,
    state: TaskState,
    input: Input,
    pods: &[PodView],
    now_ms: i64,
) -> (TaskState, Decision) {
    let mut t = Task::new(spec, state);
    t.apply(input, now_ms);
    t.reconcile(pods, now_ms);
    t.finish()
}

/// The task being decided on: its spec, state and the decision so far.
struct Task<'a> {
    spec: &'a TaskSpec,
    s: TaskState,
    d: Decision,
}

impl<'a> Task<'a> {
    fn new(spec: &'a TaskSpec, s: TaskState) -> Self {
        Self {
            spec,
            s,
            d: Decision::default(),
        }
    }

    fn finish(self) -> (TaskState, Decision) {
        (self.s, self.d)
    }

    fn pod_name(&self) -> String {
        self.spec.pod_name(self.s.attempt)
    }

    fn wake_at(&mut self, at: i64) {
        self.d.wake_at_ms = Some(self.d.wake_at_ms.map_or(at, |w| w.min(at)));
    }

    /// No Create before `at`, and a wake-up then.
    fn hold_until(&mut self, at: i64) {
        self.s.not_before_ms = Some(at);
        self.wake_at(at);
    }

    /// Records `phase` as a transition, even if it equals the current one
    /// (a new attempt's Launching).
    fn record(&mut self, phase: Phase) {
        let (reason, failure_kind) = phase.reason_and_kind();
        self.d.transitions.push(Transition {
            task: self.spec.task.clone(),
            attempt: self.s.attempt,
            pod: self.pod_name(),
            phase: phase.name(),
            reason,
            failure_kind,
        });
        self.s.phase = phase;
    }

    /// Moves to `phase`, recording it only if it differs.
    fn change(&mut self, phase: Phase) {
        if phase != self.s.phase {
            self.record(phase);
        }
    }

    fn current_uid(&self) -> Option<String> {
        match &self.s.pod {
            PodTrack::Created { uid, .. } => Some(uid.clone()),
            _ => None,
        }
    }

    fn reconcile(&mut self, pods: &[PodView], now: i64) {
        self.delete_strays(pods, now);
        if self.s.outcome.is_some() {
            return self.clean_up(pods, now);
        }
        let attempt = self.s.attempt;
        let cur = pods.iter().find(|p| p.attempt == attempt);
        // A pod that has ended decides the task, even past the deadline.
        let ended = cur.is_some_and(|p| matches!(p.phase.as_str(), "Succeeded" | "Failed"));
        if let (Some(secs), false) = (self.spec.bounds.deadline_seconds, ended) {
            let due = after(self.s.started_ms, secs);
            if now >= due {
                return self.deadline_exceeded(pods, secs);
            }
            self.wake_at(due);
        }
        match self.s.pod.clone() {
            PodTrack::ToCreate | PodTrack::Creating | PodTrack::Unknown | PodTrack::Reading
                if cur.is_some() =>
            {
                // The watch shows this attempt's pod: whatever was pending
                // (a Create answer, a read), the pod itself is the answer.
                if let Some(p) = cur {
                    self.adopt(p.uid.clone(), now);
                    self.s.pod = PodTrack::Created {
                        uid: p.uid.clone(),
                        seen: true,
                        at_ms: now,
                    };
                    self.seen(p, now);
                }
            }
            PodTrack::ToCreate => match self.s.not_before_ms {
                Some(nb) if nb > now => self.wake_at(nb),
                _ => match self.earlier_pod_terminating(pods, now) {
                    // Rule 2 across attempts (a retry right after an abort):
                    // no Create while an earlier pod is still shutting down.
                    Some(until) => self.wake_at(until),
                    None => self.create(),
                },
            },
            PodTrack::Creating | PodTrack::Reading => {}
            PodTrack::Unknown => match self.s.not_before_ms {
                Some(nb) if nb > now => self.wake_at(nb),
                _ => {
                    self.s.pod = PodTrack::Reading;
                    let name = self.pod_name();
                    self.d.actions.push(Action::Read { name });
                }
            },
            PodTrack::Created { uid, seen, at_ms } => match cur {
                Some(p) if p.uid == uid => {
                    self.s.pod = PodTrack::Created {
                        uid,
                        seen: true,
                        at_ms,
                    };
                    self.seen(p, now);
                }
                // Another pod under our attempt's labels: ours is gone.
                Some(_) => self.gone(),
                None if seen => self.gone(),
                None if now - at_ms >= WATCH_LAG_MS => {
                    // Created but never shown by the watch: ask the API server.
                    self.s.pod = PodTrack::Reading;
                    let name = self.pod_name();
                    self.d.actions.push(Action::Read { name });
                }
                None => self.wake_at(at_ms.saturating_add(WATCH_LAG_MS)),
            },
        }
    }

    /// Pods of earlier attempts that still run (not ended, not deleting):
    /// left by an attempt that ended while its Create was in flight (an
    /// abort, then a retry). Deleted (uid precondition), each asked once
    /// until a Delete fails.
    fn delete_strays(&mut self, pods: &[PodView], now: i64) {
        let attempt = self.s.attempt;
        match self.s.stray_retry_ms {
            Some(at) if at > now => self.wake_at(at),
            Some(_) => {
                self.s.stray_retry_ms = None;
                self.s.stray_deletes.clear();
            }
            None => {}
        }
        self.s
            .stray_deletes
            .retain(|uid| pods.iter().any(|p| p.uid == *uid && !p.deleting()));
        for p in pods.iter().filter(|p| p.attempt < attempt && is_live(p)) {
            if !p.deleting() && !self.s.stray_deletes.contains(&p.uid) {
                self.s.stray_deletes.push(p.uid.clone());
                self.d.actions.push(Action::Delete {
                    name: self.spec.pod_name(p.attempt),
                    uid: p.uid.clone(),
                });
            }
        }
    }

    /// An earlier attempt's pod still running or shutting down within its
    /// ceiling: until when to wait for it (rule 2 across attempts).
    fn earlier_pod_terminating(&self, pods: &[PodView], now: i64) -> Option<i64> {
        let attempt = self.s.attempt;
        let ceiling = self.spec.bounds.terminating_ceiling_seconds;
        pods.iter()
            .filter(|p| p.attempt < attempt && is_live(p))
            .map(|p| match p.deletion_ms {
                Some(d) => ceiling.map_or(i64::MAX, |c| after(d, c)),
                // A stray being deleted: looked at again shortly (its
                // deletion shows up in the watch first).
                None => now.saturating_add(HOLDER_RECHECK_MS),
            })
            .filter(|until| *until > now)
            .min()
    }

    /// After the end: delete the attempt's pod if the end came while its uid
    /// was unknown (see [`TaskState::delete_on_sight`]).
    fn clean_up(&mut self, pods: &[PodView], now: i64) {
        if !self.s.delete_on_sight {
            return;
        }
        let attempt = self.s.attempt;
        let Some(p) = pods.iter().find(|p| p.attempt == attempt) else {
            return;
        };
        if p.deleting() || matches!(p.phase.as_str(), "Succeeded" | "Failed") {
            self.s.delete_on_sight = false;
            return;
        }
        if let Some(nb) = self.s.not_before_ms.filter(|nb| *nb > now) {
            return self.wake_at(nb);
        }
        self.delete_found(p.uid.clone());
    }

    fn delete_found(&mut self, uid: String) {
        self.s.delete_on_sight = false;
        if let Some(o) = self.s.outcome.as_mut() {
            o.uid = Some(uid.clone());
        }
        let name = self.pod_name();
        self.d.actions.push(Action::Delete { name, uid });
    }

    /// Answers that still matter once the task has ended.
    fn apply_after_end(&mut self, input: Input) {
        match input {
            Input::Created { uid } if self.s.delete_on_sight => self.delete_found(uid),
            // The Create did not happen: nothing to clean up (a name taken
            // may be this attempt's own pod: the watch shows it then).
            Input::Refused { refusal, .. } if refusal != CreateRefusal::NameTaken => {
                self.s.delete_on_sight = false;
            }
            Input::Read(None) => self.s.delete_on_sight = false,
            Input::Read(Some(e)) if self.s.delete_on_sight && self.is_ours(&e) => {
                self.delete_found(e.uid)
            }
            Input::DeleteFailed { retry_at_ms } => {
                self.s.delete_on_sight = true;
                self.s.stray_retry_ms = Some(retry_at_ms);
                self.hold_until(retry_at_ms);
            }
            _ => {}
        }
    }

    fn apply(&mut self, input: Input, now: i64) {
        if self.s.outcome.is_some() {
            return self.apply_after_end(input);
        }
        match input {
            Input::Created { uid } => {
                self.s.transient_retries = 0;
                self.s.not_before_ms = None;
                if matches!(self.s.pod, PodTrack::Creating | PodTrack::ToCreate) {
                    self.adopt(uid, now);
                }
            }
            Input::Refused {
                refusal,
                retry_at_ms,
            } => self.refused(refusal, retry_at_ms),
            Input::CreateUnknown => {
                // Only if nothing answered meanwhile (the watch may have
                // shown the pod already: it is then adopted).
                if self.s.pod == PodTrack::Creating {
                    self.s.pod = PodTrack::Unknown;
                }
            }
            // A read answered after the watch showed the pod (and it was
            // adopted) is stale: the pod itself is the newer answer.
            Input::Read(_) | Input::ReadFailed { .. } if self.s.pod != PodTrack::Reading => {
                self.s.name_taken = false;
            }
            Input::Read(existing) => self.on_existing(existing, now),
            Input::ReadFailed { retry_at_ms } => {
                self.s.pod = PodTrack::Unknown;
                self.s.not_before_ms = Some(retry_at_ms);
            }
            Input::DeleteFailed { retry_at_ms } => {
                // The pending-timeout delete (and any stray's) is decided
                // again then.
                self.s.deleting_for = None;
                self.s.stray_retry_ms = Some(retry_at_ms);
                self.hold_until(retry_at_ms);
            }
            Input::Abort => {
                self.s.aborted = true;
                self.delete_current();
                self.fail(
                    FailureKind::User,
                    "Aborted: the executor aborted the task; its pod is deleted".into(),
                );
            }
        }
    }

    fn create(&mut self) {
        self.s.pod = PodTrack::Creating;
        let record = PodRecord {
            user_failures: self.s.user_failures,
            system_failures: self.s.system_failures,
            consecutive_system_failures: self.s.consecutive_system_failures,
            started_ms: Some(self.s.started_ms),
            // Stamped by the executor when it sends the Create.
            spent_ms: None,
            spec: Some(self.spec.recorded()),
        };
        self.d.actions.push(Action::Create {
            name: self.pod_name(),
            attempt: self.s.attempt,
            record,
        });
    }

    fn adopt(&mut self, uid: String, now: i64) {
        self.s.pod = PodTrack::Created {
            uid,
            seen: false,
            at_ms: now,
        };
        self.change(Phase::Queued);
    }

    fn refused(&mut self, refusal: CreateRefusal, retry_at: i64) {
        self.s.pod = PodTrack::ToCreate;
        match refusal {
            CreateRefusal::QuotaFull => {
                // Waiting for room is not a failure: no attempt, no retry spent.
                self.change(Phase::WaitingForResources);
                self.hold_until(retry_at);
            }
            CreateRefusal::ExceedsQuotaLimit { detail } => self.fail(
                FailureKind::User,
                format!("ResourceRequestsExceedLimits: {detail}"),
            ),
            CreateRefusal::NameTaken => {
                self.s.name_taken = true;
                self.s.pod = PodTrack::Reading;
                let name = self.pod_name();
                self.d.actions.push(Action::Read { name });
            }
            CreateRefusal::HolderTerminating => {
                // The name frees itself: waiting is no failure (no attempt,
                // no transient retry spent).
                self.hold_until(retry_at);
            }
            CreateRefusal::Transient => {
                if self.spend_transient_retry() {
                    self.hold_until(retry_at);
                }
            }
            CreateRefusal::MaybeCreated => {
                if self.spend_transient_retry() {
                    // Read the name (after the backoff) before any Create.
                    self.s.pod = PodTrack::Unknown;
                    self.hold_until(retry_at);
                }
            }
            CreateRefusal::Configuration { message } => self.fail(FailureKind::User, message),
        }
    }

    /// Counts one transient error; past `max_transient_retries` in a row the
    /// attempt is a system failure (false: nothing more to do now).
    fn spend_transient_retry(&mut self) -> bool {
        self.s.transient_retries = self.s.transient_retries.saturating_add(1);
        let max = self.spec.bounds.max_transient_retries;
        if self.s.transient_retries > max {
            self.s.transient_retries = 0;
            self.system_failure(format!(
                "TransientRetriesExhausted: {max} transient Create errors in a row (max_transient_retries)"
            ));
            return false;
        }
        true
    }

    /// `e` carries this attempt's labels (task, attempt, instance).
    fn is_ours(&self, e: &Existing) -> bool {
        let want = [
            (TASK_LABEL, self.spec.stem()),
            (ATTEMPT_LABEL, self.s.attempt.to_string()),
            (INSTANCE_LABEL, self.spec.instance.clone()),
        ];
        want.iter().all(|(k, v)| e.labels.get(*k) == Some(v))
    }

    fn on_existing(&mut self, existing: Option<Existing>, now: i64) {
        let name_taken = std::mem::take(&mut self.s.name_taken);
        let Some(e) = existing else {
            // The name is free (the holder vanished, or an unknown Create
            // never happened): create it (when the backoff allows).
            self.s.pod = PodTrack::ToCreate;
            if name_taken {
                // AlreadyExists, yet nothing holds the name: a holder that
                // just went, or a webhook and a read that disagree. Bounded,
                // and never at API speed.
                if self.spend_transient_retry() {
                    self.hold_until(now.saturating_add(HOLDER_RECHECK_MS));
                }
            }
            return;
        };
        if self.is_ours(&e) {
            // Our own pod (a Create that had in fact succeeded, or one made
            // before a restart): adopt it; the watch reports the rest.
            return self.adopt(e.uid, now);
        }
        if e.deleting {
            // Not ours, but on its way out: wait for the name, then create.
            self.s.pod = PodTrack::ToCreate;
            return self.hold_until(now.saturating_add(HOLDER_RECHECK_MS));
        }
        let name = self.pod_name();
        self.s.system_failures = self.s.system_failures.saturating_add(1);
        self.fail(
            FailureKind::System,
            format!(
                "NameConflict: pod {name} already exists and is not attempt {} of task {} from instance {}; delete it or choose another task name",
                self.s.attempt, self.spec.task, self.spec.instance
            ),
        );
    }

    /// The current attempt's pod as the watch shows it: a finished pod that
    /// had not ended is gone (only a finalizer keeps it), else observed.
    fn seen(&mut self, p: &PodView, now: i64) {
        if p.finished && !matches!(p.phase.as_str(), "Succeeded" | "Failed") {
            return self.gone();
        }
        self.observe(p, now);
    }

    fn observe(&mut self, p: &PodView, now: i64) {
        match p.phase.as_str() {
            "Succeeded" => return self.succeed(p),
            "Failed" => {
                return match p.disruption.clone() {
                    // A kubelet- or PodGC-set disruption: not the user's fault.
                    Some(reason) => self.system_failure(reason),
                    // Deleted before it ended: the deletion killed it.
                    None if p.deleting() || matches!(self.s.phase, Phase::ShuttingDown { .. }) => {
                        let reason = self.deletion_reason(p);
                        self.system_failure(reason)
                    }
                    None => self.user_failure("the pod failed (phase Failed)".into(), p),
                };
            }
            _ => {}
        }
        if let Some(deadline) = p.deletion_ms {
            let reason = self.deletion_reason(p);
            self.change(Phase::ShuttingDown { reason });
            // Rule 2: no Create while it exists, up to the ceiling.
            if let Some(ceiling) = self.spec.bounds.terminating_ceiling_seconds {
                let stuck_at = after(deadline, ceiling);
                if now >= stuck_at {
                    return self.stuck_terminating(p, ceiling);
                }
                self.wake_at(stuck_at);
            }
            return;
        }
        if p.phase == "Running" {
            self.s.consecutive_system_failures = 0;
            return self.change(Phase::Running);
        }
        if self.s.phase != Phase::Running {
            self.change(Phase::Queued);
        }
        if let Some(secs) = self.spec.bounds.pending_timeout_seconds {
            let due = after(p.created_ms, secs);
            let retry_at = self.s.not_before_ms.filter(|nb| *nb > now);
            if let (true, Some(nb)) = (now >= due, retry_at) {
                self.wake_at(nb);
            } else if now >= due {
                if self.s.deleting_for.is_none() {
                    self.s.deleting_for = Some(format!(
                        "PendingTimeout: still Pending {secs} s after creation (pending_timeout_seconds)"
                    ));
                    let name = self.pod_name();
                    self.d.actions.push(Action::Delete {
                        name,
                        uid: p.uid.clone(),
                    });
                }
            } else {
                self.wake_at(due);
            }
        }
    }

    fn deletion_reason(&self, p: &PodView) -> String {
        p.disruption
            .clone()
            .or_else(|| match &self.s.phase {
                Phase::ShuttingDown { reason } => Some(reason.clone()),
                _ => None,
            })
            .or_else(|| self.s.deleting_for.clone())
            .unwrap_or_else(|| "Deleted".into())
    }

    fn stuck_terminating(&mut self, p: &PodView, ceiling: u64) {
        let pod = self.pod_name();
        self.d.actions.push(Action::Warn {
            pod: pod.clone(),
            reason: "TerminatingTooLong".into(),
            message: format!(
                "pod {pod} (uid {}) is still terminating {ceiling} s after its grace period (a finalizer or a lost node?); task {} moves on to its next pod name and leaves this pod to the cluster",
                p.uid, self.spec.task
            ),
        });
        self.system_failure(format!(
            "TerminatingTooLong: pod {pod} outlived its grace period by {ceiling} s"
        ));
    }

    /// Deletes the current attempt's pod: now if its uid is known, else as
    /// soon as it shows up.
    fn delete_current(&mut self) {
        match (self.current_uid(), &self.s.pod) {
            (Some(uid), _) => {
                let name = self.pod_name();
                self.d.actions.push(Action::Delete { name, uid });
            }
            (None, PodTrack::Creating | PodTrack::Unknown | PodTrack::Reading) => {
                self.s.delete_on_sight = true;
            }
            (None, _) => {}
        }
    }

    fn deadline_exceeded(&mut self, pods: &[PodView], secs: u64) {
        let attempt = self.s.attempt;
        match pods.iter().find(|p| p.attempt == attempt) {
            Some(p) if p.deleting() => {}
            Some(p) => {
                let name = self.pod_name();
                self.d.actions.push(Action::Delete {
                    name,
                    uid: p.uid.clone(),
                });
            }
            None => self.delete_current(),
        }
        self.fail(
            FailureKind::User,
            format!("DeadlineExceeded: the task ran longer than {secs} s (deadline_seconds)"),
        );
    }

    /// The current attempt's pod is gone (NotFound, or replaced).
    fn gone(&mut self) {
        let reason = match &self.s.phase {
            Phase::ShuttingDown { reason } => reason.clone(),
            _ => self
                .s
                .deleting_for
                .clone()
                .unwrap_or_else(|| "Deleted".into()),
        };
        self.system_failure(reason);
    }

    fn system_failure(&mut self, reason: String) {
        self.s.system_failures = self.s.system_failures.saturating_add(1);
        self.s.consecutive_system_failures = self.s.consecutive_system_failures.saturating_add(1);
        let max = self.spec.max_system_failures;
        if self.s.consecutive_system_failures >= max {
            let n = self.s.consecutive_system_failures;
            return self.fail(
                FailureKind::System,
                format!(
                    "{n} consecutive system failures (last: {reason}) without an attempt reaching Running; max_system_failures is {max}"
                ),
            );
        }
        let total_max = self.spec.bounds.max_total_system_failures;
        if self.s.system_failures >= total_max {
            let n = self.s.system_failures;
            return self.fail(
                FailureKind::System,
                format!(
                    "{n} system failures in all (last: {reason}); max_total_system_failures is {total_max}"
                ),
            );
        }
        self.next_attempt();
    }

    fn user_failure(&mut self, reason: String, p: &PodView) {
        self.s.user_failures = self.s.user_failures.saturating_add(1);
        if self.s.user_failures > self.spec.retries {
            let kind = FailureKind::User;
            let reason = format!("{reason}; {} retries used", self.spec.retries);
            self.s.outcome = Some(self.outcome(false, Some(kind), Some(reason.clone()), p));
            return self.change(Phase::Failed { kind, reason });
        }
        self.next_attempt();
    }

    fn next_attempt(&mut self) {
        if self.s.attempt >= MAX_ATTEMPT {
            return self.fail(
                FailureKind::System,
                format!(
                    "AttemptsExhausted: attempt {} is the last pod name this task can use (an edited attempt label?)",
                    self.s.attempt
                ),
            );
        }
        self.s.attempt += 1;
        self.s.deleting_for = None;
        self.s.not_before_ms = None;
        self.s.pod = PodTrack::ToCreate;
        self.record(Phase::Launching);
        self.create();
    }

    fn outcome(
        &self,
        succeeded: bool,
        kind: Option<FailureKind>,
        reason: Option<String>,
        p: &PodView,
    ) -> Outcome {
        Outcome {
            succeeded,
            failure_kind: kind,
            reason,
            attempts: self.s.attempt.saturating_add(1),
            user_failures: self.s.user_failures,
            system_failures: self.s.system_failures,
            pod: self.pod_name(),
            uid: Some(p.uid.clone()),
        }
    }

    fn succeed(&mut self, p: &PodView) {
        self.s.outcome = Some(self.outcome(true, None, None, p));
        self.change(Phase::Succeeded);
    }

    /// Ends the task failed without a pod result (bounds, conflicts, aborts).
    fn fail(&mut self, kind: FailureKind, reason: String) {
        self.s.outcome = Some(Outcome {
            succeeded: false,
            failure_kind: Some(kind),
            reason: Some(reason.clone()),
            attempts: self.s.attempt.saturating_add(1),
            user_failures: self.s.user_failures,
            system_failures: self.s.system_failures,
            pod: self.pod_name(),
            uid: self.current_uid(),
        });
        self.s.pod = PodTrack::ToCreate;
        self.change(Phase::Failed { kind, reason });
    }
}

/// A pod that has not ended, is not finished and is not marked done.
fn is_live(p: &PodView) -> bool {
    !p.done && !p.finished && !matches!(p.phase.as_str(), "Succeeded" | "Failed")
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;
