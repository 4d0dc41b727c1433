//! The attempt state machine: rules 1, 2, 3 and 5, free of I/O.
//!
//! The driver ([`crate::driver`]) performs each [`Step`] and feeds back what
//! the API server said; this decides what comes next. Each phase change is
//! queued as a [`Transition`] for the caller.

use std::collections::BTreeMap;

use crate::classify::CreateRefusal;
use crate::naming::{self, ATTEMPT_LABEL, INSTANCE_LABEL, TASK_LABEL};
use crate::phase::{FailureKind, Phase, Transition};

/// One task to run to completion.
#[derive(Clone, Debug)]
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
}

/// What the current attempt's pod looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    pub uid: String,
    /// `status.phase` (Pending when absent).
    pub phase: String,
    /// It has a deletionTimestamp.
    pub deleting: bool,
    /// Its `DisruptionTarget=True` reason, if any.
    pub disruption: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    Pod(PodView),
    /// NotFound, or the name now holds a pod with another uid.
    Gone,
}

/// The pod found holding a name after AlreadyExists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Existing {
    pub uid: String,
    pub labels: BTreeMap<String, String>,
}

/// What the driver does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Create the pod of `attempt`, named `name`.
    Create {
        name: String,
        attempt: u32,
    },
    /// Wait for the namespace's quota backoff, then [`TaskMachine::retry_create`].
    WaitForQuota,
    /// Wait for the transient-error backoff, then [`TaskMachine::retry_create`].
    RetryLater,
    /// Read the pod holding `name`, then [`TaskMachine::on_existing`].
    ReadExisting {
        name: String,
    },
    /// Watch the pod and feed [`TaskMachine::observe`].
    Observe {
        name: String,
        uid: String,
    },
    /// The pod is terminating: wait until it is gone (NotFound or uid
    /// changed), then `observe(Gone)`. No Create happens meanwhile.
    AwaitGone {
        name: String,
        uid: String,
    },
    Done(Outcome),
}

/// How a task ended.
#[derive(Clone, Debug, PartialEq, Eq)]
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
}

/// See the module docs.
#[derive(Debug)]
pub struct TaskMachine {
    spec: TaskSpec,
    attempt: u32,
    user_failures: u32,
    consecutive_system_failures: u32,
    system_failures: u32,
    phase: Phase,
    uid: Option<String>,
    transitions: Vec<Transition>,
}

impl TaskMachine {
    pub fn new(spec: TaskSpec) -> Self {
        Self {
            spec,
            attempt: 0,
            user_failures: 0,
            consecutive_system_failures: 0,
            system_failures: 0,
            phase: Phase::Launching,
            uid: None,
            transitions: Vec::new(),
        }
    }

    pub fn spec(&self) -> &TaskSpec {
        &self.spec
    }

    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// The pod name of the current attempt.
    pub fn pod_name(&self) -> String {
        naming::pod_name(&self.spec.task, self.attempt)
    }

    /// True when phase changes are waiting for [`TaskMachine::take_transitions`].
    pub fn has_transitions(&self) -> bool {
        !self.transitions.is_empty()
    }

    /// Phase changes since the last call.
    pub fn take_transitions(&mut self) -> Vec<Transition> {
        std::mem::take(&mut self.transitions)
    }

    /// Records `phase` as a transition, even if it equals the current one
    /// (a new attempt's Launching).
    fn record(&mut self, phase: Phase) {
        let (reason, failure_kind) = match &phase {
            Phase::ShuttingDown { reason } => (Some(reason.clone()), None),
            Phase::Failed { kind, reason } => (Some(reason.clone()), Some(*kind)),
            _ => (None, None),
        };
        self.transitions.push(Transition {
            task: self.spec.task.clone(),
            attempt: self.attempt,
            pod: self.pod_name(),
            phase: phase.name(),
            reason,
            failure_kind,
        });
        self.phase = phase;
    }

    /// Moves to `phase`, recording it only if it differs.
    fn change(&mut self, phase: Phase) {
        if phase != self.phase {
            self.record(phase);
        }
    }

    fn create(&mut self) -> Step {
        self.uid = None;
        Step::Create {
            name: self.pod_name(),
            attempt: self.attempt,
        }
    }

    /// The first step.
    pub fn start(&mut self) -> Step {
        self.record(Phase::Launching);
        self.create()
    }

    /// After a wait: create the same attempt again.
    pub fn retry_create(&mut self) -> Step {
        self.create()
    }

    /// The Create succeeded.
    pub fn on_created(&mut self, uid: String) -> Step {
        self.uid = Some(uid.clone());
        self.change(Phase::Queued);
        Step::Observe {
            name: self.pod_name(),
            uid,
        }
    }

    /// The Create's outcome is unknown (a timeout, a reset connection): it
    /// may have succeeded. The name is read before anything is created again,
    /// so a pod this attempt made is adopted, never met by a blind re-Create
    /// (which, with a full quota, would wait on its own pod forever).
    pub fn on_create_unknown(&mut self) -> Step {
        Step::ReadExisting {
            name: self.pod_name(),
        }
    }

    /// The Create was refused.
    pub fn on_refused(&mut self, refusal: &CreateRefusal) -> Step {
        match refusal {
            CreateRefusal::QuotaFull => {
                self.change(Phase::WaitingForResources);
                Step::WaitForQuota
            }
            CreateRefusal::ExceedsQuotaLimit { detail } => self.finish_failed(
                FailureKind::User,
                format!("ResourceRequestsExceedLimits: {detail}"),
            ),
            CreateRefusal::NameTaken => Step::ReadExisting {
                name: self.pod_name(),
            },
            CreateRefusal::Transient => Step::RetryLater,
            CreateRefusal::Configuration { message } => {
                self.finish_failed(FailureKind::User, message.clone())
            }
        }
    }

    /// What holds the name after AlreadyExists (`None`: nothing any more).
    pub fn on_existing(&mut self, existing: Option<Existing>) -> Step {
        let Some(e) = existing else {
            // The holder vanished between the 409 and the read (or the 409
            // came from a cache that is a moment behind): back off, then retry.
            return Step::RetryLater;
        };
        let want = [
            (TASK_LABEL, naming::task_label_value(&self.spec.task)),
            (ATTEMPT_LABEL, self.attempt.to_string()),
            (INSTANCE_LABEL, self.spec.instance.clone()),
        ];
        let ours = want.iter().all(|(k, v)| e.labels.get(*k) == Some(v));
        if ours {
            // Our own pod (a retried Create that had in fact succeeded, or a
            // restart of this instance): adopt it.
            self.uid = Some(e.uid.clone());
            self.change(Phase::Queued);
            return Step::Observe {
                name: self.pod_name(),
                uid: e.uid,
            };
        }
        let name = self.pod_name();
        self.system_failures += 1;
        self.finish_failed(
            FailureKind::System,
            format!(
                "NameConflict: pod {name} already exists and is not attempt {} of task {} from instance {}; delete it or choose another task name",
                self.attempt, self.spec.task, self.spec.instance
            ),
        )
    }

    /// The pod as last seen (or gone).
    pub fn observe(&mut self, obs: Observation) -> Step {
        let view = match obs {
            Observation::Pod(v) if Some(&v.uid) == self.uid.as_ref() => v,
            _ => return self.on_gone(),
        };
        match view.phase.as_str() {
            "Succeeded" => self.finish_succeeded(),
            "Failed" => match view.disruption {
                // A kubelet- or PodGC-set disruption ends the pod Failed: not the user's fault.
                Some(reason) => self.system_failure(reason),
                // Deleted (or already shutting down) before it ended: the
                // deletion killed it, so it is a system failure too.
                None if view.deleting || matches!(self.phase, Phase::ShuttingDown { .. }) => {
                    self.system_failure("Deleted".into())
                }
                None => self.user_failure("the pod failed (phase Failed)".into()),
            },
            _ if view.deleting => {
                let reason = view.disruption.unwrap_or_else(|| "Deleted".into());
                self.change(Phase::ShuttingDown { reason });
                Step::AwaitGone {
                    name: self.pod_name(),
                    uid: view.uid,
                }
            }
            "Running" => {
                self.consecutive_system_failures = 0;
                self.change(Phase::Running);
                Step::Observe {
                    name: self.pod_name(),
                    uid: view.uid,
                }
            }
            _ => {
                if self.phase != Phase::Running {
                    self.change(Phase::Queued);
                }
                Step::Observe {
                    name: self.pod_name(),
                    uid: view.uid,
                }
            }
        }
    }

    fn on_gone(&mut self) -> Step {
        let reason = match &self.phase {
            Phase::ShuttingDown { reason } => reason.clone(),
            _ => "Deleted".into(),
        };
        self.system_failure(reason)
    }

    fn system_failure(&mut self, reason: String) -> Step {
        self.system_failures += 1;
        self.consecutive_system_failures += 1;
        if self.consecutive_system_failures >= self.spec.max_system_failures {
            let n = self.consecutive_system_failures;
            return self.finish_failed(
                FailureKind::System,
                format!(
                    "{n} consecutive system failures (last: {reason}) without an attempt reaching Running; max_system_failures is {}",
                    self.spec.max_system_failures
                ),
            );
        }
        self.next_attempt()
    }

    fn user_failure(&mut self, reason: String) -> Step {
        self.user_failures += 1;
        if self.user_failures > self.spec.retries {
            return self.finish_failed(
                FailureKind::User,
                format!("{reason}; {} retries used", self.spec.retries),
            );
        }
        self.next_attempt()
    }

    fn next_attempt(&mut self) -> Step {
        self.attempt += 1;
        self.record(Phase::Launching);
        self.create()
    }

    fn outcome(
        &self,
        succeeded: bool,
        kind: Option<FailureKind>,
        reason: Option<String>,
    ) -> Outcome {
        Outcome {
            succeeded,
            failure_kind: kind,
            reason,
            attempts: self.attempt + 1,
            user_failures: self.user_failures,
            system_failures: self.system_failures,
        }
    }

    fn finish_succeeded(&mut self) -> Step {
        self.change(Phase::Succeeded);
        Step::Done(self.outcome(true, None, None))
    }

    fn finish_failed(&mut self, kind: FailureKind, reason: String) -> Step {
        self.change(Phase::Failed {
            kind,
            reason: reason.clone(),
        });
        Step::Done(self.outcome(false, Some(kind), Some(reason)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phase::FailureKind;

    fn spec(retries: u32, max_system_failures: u32) -> TaskSpec {
        TaskSpec {
            task: "train".into(),
            namespace: "ns".into(),
            instance: "exec-1".into(),
            retries,
            max_system_failures,
        }
    }

    fn pod(uid: &str, phase: &str) -> Observation {
        Observation::Pod(PodView {
            uid: uid.into(),
            phase: phase.into(),
            deleting: false,
            disruption: None,
        })
    }

    fn deleting(uid: &str, disruption: Option<&str>) -> Observation {
        Observation::Pod(PodView {
            uid: uid.into(),
            phase: "Running".into(),
            deleting: true,
            disruption: disruption.map(str::to_string),
        })
    }

    fn phases(m: &mut TaskMachine) -> Vec<String> {
        m.take_transitions()
            .into_iter()
            .map(|t| match t.reason {
                Some(r) => format!(
                    "{}:{}/{}",
                    t.attempt,
                    t.phase,
                    r.split(':').next().unwrap_or("")
                ),
                None => format!("{}:{}", t.attempt, t.phase),
            })
            .collect()
    }

    fn create(name: &str, attempt: u32) -> Step {
        Step::Create {
            name: name.into(),
            attempt,
        }
    }

    #[test]
    fn a_task_that_runs_and_succeeds() {
        let mut m = TaskMachine::new(spec(0, 3));
        assert_eq!(m.start(), create("train-0", 0));
        assert!(matches!(m.on_created("u0".into()), Step::Observe { .. }));
        m.observe(pod("u0", "Pending"));
        m.observe(pod("u0", "Running"));
        m.observe(pod("u0", "Running"));
        let Step::Done(o) = m.observe(pod("u0", "Succeeded")) else {
            panic!("not done")
        };
        assert!(o.succeeded);
        assert_eq!(o.attempts, 1);
        assert_eq!(
            phases(&mut m),
            ["0:Launching", "0:Queued", "0:Running", "0:Succeeded"]
        );
    }

    #[test]
    fn a_preemption_waits_for_the_pod_to_be_gone_then_uses_the_next_name() {
        let mut m = TaskMachine::new(spec(0, 3));
        m.start();
        m.on_created("u0".into());
        m.observe(pod("u0", "Running"));
        let step = m.observe(deleting("u0", Some("PreemptionByScheduler")));
        assert_eq!(
            step,
            Step::AwaitGone {
                name: "train-0".into(),
                uid: "u0".into()
            }
        );
        // Still terminating: nothing new is decided.
        assert!(matches!(
            m.observe(deleting("u0", Some("PreemptionByScheduler"))),
            Step::AwaitGone { .. }
        ));
        assert_eq!(m.observe(Observation::Gone), create("train-1", 1));
        m.on_created("u1".into());
        m.observe(pod("u1", "Running"));
        let Step::Done(o) = m.observe(pod("u1", "Succeeded")) else {
            panic!("not done")
        };
        assert_eq!(
            o.user_failures, 0,
            "a preemption does not spend the user's retries"
        );
        assert_eq!(o.system_failures, 1);
        assert_eq!(
            phases(&mut m),
            [
                "0:Launching",
                "0:Queued",
                "0:Running",
                "0:ShuttingDown/PreemptionByScheduler",
                "1:Launching",
                "1:Queued",
                "1:Running",
                "1:Succeeded"
            ]
        );
    }

    #[test]
    fn an_external_delete_is_shutting_down_deleted() {
        let mut m = TaskMachine::new(spec(0, 3));
        m.start();
        m.on_created("u0".into());
        m.observe(deleting("u0", None));
        assert_eq!(
            m.phase(),
            &Phase::ShuttingDown {
                reason: "Deleted".into()
            }
        );
    }

    #[test]
    fn already_exists_is_never_queued_a_foreign_pod_is_a_name_conflict() {
        let mut m = TaskMachine::new(spec(0, 3));
        m.start();
        let step = m.on_refused(&CreateRefusal::NameTaken);
        assert_eq!(
            step,
            Step::ReadExisting {
                name: "train-0".into()
            }
        );
        let foreign = Existing {
            uid: "x".into(),
            labels: [("app".to_string(), "other".to_string())].into(),
        };
        let Step::Done(o) = m.on_existing(Some(foreign)) else {
            panic!("not done")
        };
        assert_eq!(o.failure_kind, Some(FailureKind::System));
        assert!(o.reason.unwrap_or_default().starts_with("NameConflict"));
        assert_eq!(phases(&mut m), ["0:Launching", "0:Failed/NameConflict"]);
    }

    /// Attempt 0 of task `train`'s pod as this instance (`exec-1`) labels it.
    fn ours_attempt_0() -> Existing {
        Existing {
            uid: "u0".into(),
            labels: [
                (TASK_LABEL.to_string(), "train".to_string()),
                (ATTEMPT_LABEL.to_string(), "0".to_string()),
                (INSTANCE_LABEL.to_string(), "exec-1".to_string()),
            ]
            .into(),
        }
    }

    #[test]
    fn already_exists_on_our_own_pod_adopts_it() {
        let mut m = TaskMachine::new(spec(0, 3));
        m.start();
        m.on_refused(&CreateRefusal::NameTaken);
        let ours = ours_attempt_0();
        assert_eq!(
            m.on_existing(Some(ours)),
            Step::Observe {
                name: "train-0".into(),
                uid: "u0".into()
            }
        );
        // The holder vanished between the 409 and the read: back off, then the same name.
        let mut m = TaskMachine::new(spec(0, 3));
        m.start();
        m.on_refused(&CreateRefusal::NameTaken);
        assert_eq!(m.on_existing(None), Step::RetryLater);
        assert_eq!(m.retry_create(), create("train-0", 0));
    }

    #[test]
    fn an_unknown_create_outcome_reads_the_name_before_creating_again() {
        let mut m = TaskMachine::new(spec(0, 3));
        m.start();
        assert_eq!(
            m.on_create_unknown(),
            Step::ReadExisting {
                name: "train-0".into()
            }
        );
        // It had in fact been created: our labels, so it is adopted, not re-created.
        let ours = ours_attempt_0();
        assert!(matches!(m.on_existing(Some(ours)), Step::Observe { .. }));
    }

    #[test]
    fn a_full_quota_waits_without_spending_attempts() {
        let mut m = TaskMachine::new(spec(0, 3));
        m.start();
        for _ in 0..5 {
            assert_eq!(m.on_refused(&CreateRefusal::QuotaFull), Step::WaitForQuota);
            assert_eq!(m.retry_create(), create("train-0", 0));
        }
        assert_eq!(m.on_refused(&CreateRefusal::Transient), Step::RetryLater);
        m.on_created("u0".into());
        assert_eq!(
            phases(&mut m),
            ["0:Launching", "0:WaitingForResources", "0:Queued"]
        );
    }

    #[test]
    fn a_request_beyond_the_hard_limit_fails_at_once() {
        let mut m = TaskMachine::new(spec(5, 3));
        m.start();
        let Step::Done(o) = m.on_refused(&CreateRefusal::ExceedsQuotaLimit {
            detail: "cpu".into(),
        }) else {
            panic!("not done")
        };
        assert_eq!(o.failure_kind, Some(FailureKind::User));
        assert!(o
            .reason
            .unwrap_or_default()
            .starts_with("ResourceRequestsExceedLimits"));
    }

    #[test]
    fn system_failures_are_bounded_and_only_running_resets_the_count() {
        let mut m = TaskMachine::new(spec(0, 3));
        m.start();
        // Two deletions before Running, with quota waits and Queued in between.
        for (i, uid) in ["u0", "u1"].iter().enumerate() {
            m.on_refused(&CreateRefusal::QuotaFull);
            m.retry_create();
            m.on_created((*uid).into());
            m.observe(pod(uid, "Pending"));
            assert_eq!(
                m.observe(Observation::Gone),
                create(&format!("train-{}", i + 1), i as u32 + 1)
            );
        }
        // Reaching Running resets the count...
        m.on_created("u2".into());
        m.observe(pod("u2", "Running"));
        m.observe(Observation::Gone);
        m.on_created("u3".into());
        m.observe(Observation::Gone);
        // ...so two more are still tolerated, the third in a row is not.
        m.on_created("u4".into());
        let Step::Done(o) = m.observe(Observation::Gone) else {
            panic!("expected the task to fail")
        };
        assert_eq!(o.failure_kind, Some(FailureKind::System));
        assert!(
            o.reason
                .clone()
                .unwrap_or_default()
                .contains("3 consecutive system failures"),
            "{o:?}"
        );
        assert_eq!(o.system_failures, 5);
        assert_eq!(o.user_failures, 0);
    }

    #[test]
    fn container_failures_spend_the_users_retries() {
        let mut m = TaskMachine::new(spec(1, 3));
        m.start();
        m.on_created("u0".into());
        assert_eq!(m.observe(pod("u0", "Failed")), create("train-1", 1));
        m.on_created("u1".into());
        let Step::Done(o) = m.observe(pod("u1", "Failed")) else {
            panic!("not done")
        };
        assert_eq!(o.failure_kind, Some(FailureKind::User));
        assert_eq!(o.user_failures, 2);
    }

    #[test]
    fn a_kubelet_disruption_with_phase_failed_is_a_system_failure() {
        let mut m = TaskMachine::new(spec(0, 3));
        m.start();
        m.on_created("u0".into());
        let failed = Observation::Pod(PodView {
            uid: "u0".into(),
            phase: "Failed".into(),
            deleting: false,
            disruption: Some("TerminationByKubelet".into()),
        });
        assert_eq!(m.observe(failed), create("train-1", 1));
    }

    #[test]
    fn a_deleted_pod_that_ends_failed_is_a_system_failure() {
        let mut m = TaskMachine::new(spec(0, 3));
        m.start();
        m.on_created("u0".into());
        let killed = Observation::Pod(PodView {
            uid: "u0".into(),
            phase: "Failed".into(),
            deleting: true,
            disruption: None,
        });
        assert_eq!(m.observe(killed), create("train-1", 1));
        let Step::Done(o) = ({
            m.on_created("u1".into());
            m.observe(pod("u1", "Succeeded"))
        }) else {
            panic!("not done")
        };
        assert_eq!((o.user_failures, o.system_failures), (0, 1));
    }

    #[test]
    fn a_new_uid_under_the_name_means_ours_is_gone() {
        let mut m = TaskMachine::new(spec(0, 3));
        m.start();
        m.on_created("u0".into());
        assert_eq!(
            m.observe(pod("someone-else", "Running")),
            create("train-1", 1)
        );
    }
}
