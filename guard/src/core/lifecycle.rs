//! A task's life in the executor beyond the reconciler's state: how its
//! state begins (launched, resumed from its pods, replacing an earlier run,
//! or aborted before the pods were listed), a Create held until a task taken
//! up after a restart gets its template back, and the one report of each
//! run's result. Pure: the loop keeps one per task and asks it.

use crate::core::naming;
use crate::core::reconcile::{self, Decision, Input, PodView, TaskSpec, TaskState};

/// See the module docs.
#[derive(Debug, Default)]
pub struct Lifecycle {
    /// A Create was decided while there was no template: held until it comes.
    awaiting_template: bool,
    /// Aborted before the first pod list was in: never launched, and its
    /// pods (if it had any) deleted once the list is in.
    aborted_before_list: bool,
    /// Submitted with `replace` over an earlier run's pods: it starts under
    /// the name after theirs ([`reconcile::replace`]).
    replacing: bool,
    /// The current run's outcome was reported (logged as a Result).
    reported: bool,
}

impl Lifecycle {
    /// A task submitted (`replacing` an earlier run's pods, or not), or
    /// taken up from its pods.
    pub fn new(replacing: bool) -> Self {
        Self {
            replacing,
            ..Self::default()
        }
    }

    /// One turn of the reconciler for the task with `state` (`None` until
    /// its first turn after the pod list), its `pods`, and the name stem
    /// its pods have (`stem`, for a task taken up from pods named by an
    /// older rule). The first turn decides how the state begins.
    pub fn reconcile(
        &mut self,
        spec: &mut TaskSpec,
        state: Option<TaskState>,
        pods: &[PodView],
        stem: Option<String>,
        now_ms: i64,
    ) -> (TaskState, Decision) {
        let aborted = std::mem::take(&mut self.aborted_before_list);
        if state.is_none() {
            // Names and labels go on as its pods have them (an older stem).
            spec.stem = stem.filter(|s| *s != naming::task_stem(&spec.task));
        }
        let (state, mut first) = match state {
            Some(s) => (s, Decision::default()),
            // Aborted before it was launched: no Create, ever; pods it had
            // from before a restart are deleted by the abort.
            None if aborted => (reconcile::restore(pods, now_ms), Decision::default()),
            None if std::mem::take(&mut self.replacing) => reconcile::replace(spec, pods, now_ms),
            None => reconcile::resume(spec, pods, now_ms),
        };
        let (state, mut d) = match aborted {
            true => reconcile::apply(spec, state, Input::Abort, pods, now_ms),
            false => reconcile::reconcile(spec, state, pods, now_ms),
        };
        first.transitions.append(&mut d.transitions);
        first.actions.append(&mut d.actions);
        first.wake_at_ms = d.wake_at_ms;
        (state, first)
    }

    /// The task is aborted. With a state, the reconciler decides now;
    /// before its first turn (`None`) the abort is remembered and carried
    /// out by that turn, and `None` is returned.
    pub fn abort(
        &mut self,
        spec: &TaskSpec,
        state: Option<TaskState>,
        pods: &[PodView],
        now_ms: i64,
    ) -> Option<(TaskState, Decision)> {
        match state {
            Some(s) => Some(reconcile::apply(spec, s, Input::Abort, pods, now_ms)),
            None => {
                self.aborted_before_list = true;
                None
            }
        }
    }

    /// Its first turn resumes it from its pods (neither a replacement nor
    /// an abort before the list).
    pub fn resumes(&self) -> bool {
        !self.replacing && !self.aborted_before_list
    }

    /// Aborted before the first pod list was in, not yet carried out.
    pub fn aborted_before_list(&self) -> bool {
        self.aborted_before_list
    }

    /// A Create was decided, but the task has no template (taken up after a
    /// restart and not submitted again): it waits for one.
    pub fn hold_create(&mut self) {
        self.awaiting_template = true;
    }

    /// The task's template came: whether a held Create goes on now. Its
    /// outcome then counts as unknown, so the name is read before it is
    /// created.
    pub fn template_came(&mut self) -> bool {
        std::mem::take(&mut self.awaiting_template)
    }

    /// Whether `state`'s outcome is to be reported now: once per run (a
    /// retried task reports its next run's), never before it ended.
    pub fn report(&mut self, state: &TaskState) -> bool {
        let ended = state.outcome.is_some();
        let newly = ended && !self.reported;
        self.reported |= ended;
        newly
    }

    /// An ended task runs again ([`reconcile::retry`]): its next outcome is
    /// reported too.
    pub fn retry(
        &mut self,
        spec: &TaskSpec,
        state: TaskState,
        now_ms: i64,
    ) -> (TaskState, Decision) {
        self.reported = false;
        reconcile::retry(spec, state, now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::reconcile::{Action, Outcome};

    fn spec() -> TaskSpec {
        TaskSpec::new("train", "ns", "exec")
    }

    fn pod(uid: &str, attempt: u32, phase: &str) -> PodView {
        PodView::sample(uid, attempt, phase)
    }

    fn outcome(succeeded: bool) -> Outcome {
        Outcome {
            succeeded,
            failure_kind: None,
            reason: None,
            attempts: 1,
            user_failures: 0,
            system_failures: 0,
            pod: "train-0".into(),
            uid: None,
        }
    }

    fn creates(d: &Decision) -> Vec<(String, u32)> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::Create { name, attempt, .. } => Some((name.clone(), *attempt)),
                _ => None,
            })
            .collect()
    }

    fn deletes(d: &Decision) -> Vec<String> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete { uid, .. } => Some(uid.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_new_task_launches_attempt_zero_and_a_taken_up_one_resumes_from_its_pods() {
        let mut spec = spec();
        let (s, d) = Lifecycle::new(false).reconcile(&mut spec, None, &[], None, 5_000);
        assert_eq!(creates(&d), [(spec.pod_name(0), 0)]);
        assert_eq!(s.attempt, 0);
        let running = [pod("u1", 1, "Running")];
        let (s, d) = Lifecycle::new(false).reconcile(&mut spec, None, &running, None, 5_000);
        assert_eq!(s.attempt, 1, "resumed at its pods' attempt");
        assert!(creates(&d).is_empty(), "{d:?}");
    }

    #[test]
    fn a_replacing_task_starts_under_the_name_after_its_earlier_run_s_once() {
        let mut spec = spec();
        let earlier = [pod("u1", 2, "Failed")];
        let mut life = Lifecycle::new(true);
        let (s, d) = life.reconcile(&mut spec, None, &earlier, None, 5_000);
        assert_eq!(s.attempt, 3);
        assert_eq!(creates(&d), [(spec.pod_name(3), 3)]);
        // Replacing is for the first turn only.
        assert!(!life.replacing);
    }

    #[test]
    fn an_abort_before_the_list_never_launches_and_deletes_the_pods_it_had() {
        let mut spec = spec();
        let mut life = Lifecycle::new(false);
        assert!(life.abort(&spec, None, &[], 5_000).is_none());
        assert!(life.aborted_before_list());
        let running = [pod("u1", 0, "Running")];
        let (s, d) = life.reconcile(&mut spec, None, &running, None, 6_000);
        assert!(creates(&d).is_empty(), "{d:?}");
        assert_eq!(deletes(&d), ["u1"]);
        assert!(s.aborted);
        assert!(!life.aborted_before_list(), "carried out once");
    }

    #[test]
    fn an_abort_with_a_state_is_decided_at_once() {
        let mut spec = spec();
        let mut life = Lifecycle::new(false);
        let running = [pod("u1", 0, "Running")];
        let (s, _) = life.reconcile(&mut spec, None, &running, None, 5_000);
        let (s, d) = life
            .abort(&spec, Some(s), &running, 6_000)
            .unwrap_or_else(|| panic!("decided at once"));
        assert!(s.aborted);
        assert_eq!(deletes(&d), ["u1"]);
        assert!(!life.aborted_before_list());
    }

    #[test]
    fn a_held_create_goes_on_once_when_the_template_comes() {
        let mut life = Lifecycle::new(false);
        assert!(!life.template_came(), "nothing was held");
        life.hold_create();
        assert!(life.template_came());
        assert!(!life.template_came(), "released once");
    }

    #[test]
    fn each_run_s_outcome_is_reported_once() {
        let spec = spec();
        let mut life = Lifecycle::new(false);
        let mut s = reconcile::start(0);
        assert!(!life.report(&s), "not ended");
        s.outcome = Some(outcome(true));
        assert!(life.report(&s));
        assert!(!life.report(&s), "once");
        let (s, _) = life.retry(&spec, s, 1_000);
        assert!(s.outcome.is_none());
        let mut s = s;
        s.outcome = Some(outcome(false));
        assert!(life.report(&s), "the next run's outcome is reported too");
    }

    #[test]
    fn a_task_taken_up_keeps_its_pods_older_stem() {
        let mut spec = spec();
        let own = naming::task_stem(&spec.task);
        Lifecycle::new(false).reconcile(&mut spec, None, &[], Some("old-stem".into()), 0);
        assert_eq!(spec.stem.as_deref(), Some("old-stem"));
        Lifecycle::new(false).reconcile(&mut spec, None, &[], Some(own), 0);
        assert_eq!(spec.stem, None, "its own stem is no exception");
    }
}
