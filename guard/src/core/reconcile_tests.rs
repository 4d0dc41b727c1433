use super::*;

const T0: i64 = 1_700_000_000_000;

fn spec(retries: u32, max_system_failures: u32) -> TaskSpec {
    TaskSpec {
        retries,
        max_system_failures,
        ..TaskSpec::new("train", "ns", "exec-1")
    }
}

fn pod(uid: &str, attempt: u32, phase: &str) -> PodView {
    PodView {
        uid: uid.into(),
        attempt,
        phase: phase.into(),
        disruption: None,
        created_ms: T0,
        deletion_ms: None,
        done: false,
        finished: false,
        record: None,
        task_started_ms: None,
    }
}

fn deleting(uid: &str, attempt: u32, disruption: Option<&str>, grace_end: i64) -> PodView {
    PodView {
        deletion_ms: Some(grace_end),
        disruption: disruption.map(str::to_string),
        ..pod(uid, attempt, "Running")
    }
}

/// The labels of attempt 0 of task "train" from instance "exec-1".
fn ours_labels() -> std::collections::BTreeMap<String, String> {
    [
        (TASK_LABEL.to_string(), "train".to_string()),
        (ATTEMPT_LABEL.to_string(), "0".to_string()),
        (INSTANCE_LABEL.to_string(), "exec-1".to_string()),
    ]
    .into()
}

/// Drives one task, keeping every transition and action, like the executor.
struct Run {
    spec: TaskSpec,
    state: TaskState,
    now: i64,
    phases: Vec<String>,
    last: Decision,
}

impl Run {
    fn new(spec: TaskSpec) -> Self {
        Self {
            spec,
            state: start(T0),
            now: T0,
            phases: Vec::new(),
            last: Decision::default(),
        }
    }

    fn keep(&mut self, (s, d): (TaskState, Decision)) -> &Decision {
        self.state = s;
        for t in &d.transitions {
            self.phases.push(match &t.reason {
                Some(r) => format!(
                    "{}:{}/{}",
                    t.attempt,
                    t.phase,
                    r.split(':').next().unwrap_or("")
                ),
                None => format!("{}:{}", t.attempt, t.phase),
            });
        }
        self.last = d;
        &self.last
    }

    fn see(&mut self, pods: &[PodView]) -> &Decision {
        let r = reconcile(&self.spec, self.state.clone(), pods, self.now);
        self.keep(r)
    }

    fn give(&mut self, input: Input) -> &Decision {
        self.give_seeing(input, &[])
    }

    /// [`Run::give`] while the watch shows `pods`.
    fn give_seeing(&mut self, input: Input, pods: &[PodView]) -> &Decision {
        let r = apply(&self.spec, self.state.clone(), input, pods, self.now);
        self.keep(r)
    }

    fn creates(&self) -> Vec<String> {
        self.last
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Create { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

    fn outcome(&self) -> Outcome {
        self.state.outcome.clone().expect("the task has ended")
    }
}

#[test]
fn a_task_that_runs_and_succeeds() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    assert_eq!(r.creates(), ["train-0"]);
    // Until the Create answers, the same pods decide nothing new.
    r.see(&[]);
    assert!(r.last.actions.is_empty());
    r.give(Input::Created { uid: "u0".into() });
    r.see(&[pod("u0", 0, "Pending")]);
    r.see(&[pod("u0", 0, "Running")]);
    r.see(&[pod("u0", 0, "Succeeded")]);
    let o = r.outcome();
    assert!(o.succeeded);
    assert_eq!((o.attempts, o.pod.as_str()), (1, "train-0"));
    assert_eq!(r.phases, ["0:Queued", "0:Running", "0:Succeeded"]);
}

#[test]
fn a_preemption_waits_for_the_pod_to_be_gone_then_uses_the_next_name() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    r.give(Input::Created { uid: "u0".into() });
    r.see(&[pod("u0", 0, "Running")]);
    let d = r
        .see(&[deleting(
            "u0",
            0,
            Some("PreemptionByScheduler"),
            T0 + 30_000,
        )])
        .clone();
    assert!(d.actions.is_empty(), "no Create while it exists: {d:?}");
    // The terminating ceiling is the only wake-up it needs.
    assert_eq!(d.wake_at_ms, Some(T0 + 30_000 + 300_000));
    r.now += 10_000;
    r.see(&[deleting(
        "u0",
        0,
        Some("PreemptionByScheduler"),
        T0 + 30_000,
    )]);
    assert!(r.creates().is_empty());
    r.see(&[]);
    assert_eq!(r.creates(), ["train-1"]);
    r.give(Input::Created { uid: "u1".into() });
    r.see(&[pod("u1", 1, "Running")]);
    r.see(&[pod("u1", 1, "Succeeded")]);
    let o = r.outcome();
    assert_eq!((o.user_failures, o.system_failures), (0, 1));
    assert_eq!(
        r.phases,
        [
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
fn a_pod_stuck_terminating_past_the_ceiling_warns_and_moves_to_the_next_name() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    r.give(Input::Created { uid: "u0".into() });
    let stuck = deleting("u0", 0, None, T0 + 30_000);
    r.see(std::slice::from_ref(&stuck));
    r.now = T0 + 30_000 + 300_000;
    let d = r.see(std::slice::from_ref(&stuck)).clone();
    assert!(
        d.actions.iter().any(
            |a| matches!(a, Action::Warn { reason, pod, .. } if reason == "TerminatingTooLong" && pod == "train-0")
        ),
        "{d:?}"
    );
    assert_eq!(r.creates(), ["train-1"]);
    // The stuck pod (attempt 0) no longer matters to attempt 1.
    let d = r.see(&[stuck]).clone();
    assert!(d.actions.is_empty(), "{d:?}");
}

#[test]
fn a_pod_pending_past_the_timeout_is_deleted_and_counted_as_a_system_failure() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    r.give(Input::Created { uid: "u0".into() });
    let d = r.see(&[pod("u0", 0, "Pending")]).clone();
    assert_eq!(d.wake_at_ms, Some(T0 + 900_000));
    r.now = T0 + 900_000;
    let d = r.see(&[pod("u0", 0, "Pending")]).clone();
    assert_eq!(
        d.actions,
        [Action::Delete {
            name: "train-0".into(),
            uid: "u0".into()
        }]
    );
    // Deleted once, not again while the deletion is under way.
    assert!(r.see(&[pod("u0", 0, "Pending")]).actions.is_empty());
    r.see(&[deleting("u0", 0, None, r.now + 30_000)]);
    assert_eq!(
        r.state.phase,
        Phase::ShuttingDown {
            reason: "PendingTimeout: still Pending 900 s after creation (pending_timeout_seconds)"
                .into()
        }
    );
    r.see(&[]);
    assert_eq!(r.creates(), ["train-1"]);
    assert_eq!(r.state.system_failures, 1);
}

#[test]
fn the_task_deadline_deletes_the_pod_and_fails_the_task() {
    let mut s = spec(0, 3);
    s.bounds.deadline_seconds = Some(60);
    let mut r = Run::new(s);
    r.see(&[]);
    r.give(Input::Created { uid: "u0".into() });
    let d = r.see(&[pod("u0", 0, "Running")]).clone();
    assert_eq!(d.wake_at_ms, Some(T0 + 60_000));
    r.now = T0 + 60_000;
    let d = r.see(&[pod("u0", 0, "Running")]).clone();
    assert_eq!(
        d.actions,
        [Action::Delete {
            name: "train-0".into(),
            uid: "u0".into()
        }]
    );
    let o = r.outcome();
    assert_eq!(o.failure_kind, Some(FailureKind::User));
    assert!(o.reason.unwrap_or_default().starts_with("DeadlineExceeded"));
}

#[test]
fn preempted_after_every_start_is_bounded_in_total() {
    let mut s = spec(0, 3);
    s.bounds.max_total_system_failures = 4;
    let mut r = Run::new(s);
    r.see(&[]);
    for i in 0..4u32 {
        let uid = format!("u{i}");
        r.give(Input::Created { uid: uid.clone() });
        // Running resets the consecutive count, never the total.
        r.see(&[pod(&uid, i, "Running")]);
        r.see(&[deleting(&uid, i, Some("PreemptionByScheduler"), T0)]);
        r.see(&[]);
    }
    let o = r.outcome();
    assert_eq!(o.failure_kind, Some(FailureKind::System));
    assert!(
        o.reason
            .clone()
            .unwrap_or_default()
            .contains("4 system failures in all"),
        "{o:?}"
    );
    assert_eq!(o.attempts, 4);
}

#[test]
fn transient_errors_are_bounded_and_retry_at_the_time_given() {
    let mut s = spec(0, 3);
    s.bounds.max_transient_retries = 2;
    let mut r = Run::new(s);
    r.see(&[]);
    for i in 1..=2 {
        let d = r
            .give(Input::Refused {
                refusal: CreateRefusal::Transient,
                retry_at_ms: T0 + i * 1000,
            })
            .clone();
        assert_eq!(d.wake_at_ms, Some(T0 + i * 1000));
        assert!(r.see(&[]).actions.is_empty(), "not before its time");
        r.now = T0 + i * 1000;
        r.see(&[]);
        assert_eq!(r.creates(), ["train-0"], "the same name again");
    }
    r.give(Input::Refused {
        refusal: CreateRefusal::Transient,
        retry_at_ms: r.now + 1000,
    });
    assert_eq!(r.creates(), ["train-1"]);
    assert_eq!(r.state.system_failures, 1);
    assert!(
        r.phases.iter().any(|p| p == "1:Launching"),
        "{:?}",
        r.phases
    );
}

#[test]
fn a_full_quota_waits_without_spending_attempts() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    for i in 1..=5 {
        r.give(Input::Refused {
            refusal: CreateRefusal::QuotaFull,
            retry_at_ms: r.now + 1000,
        });
        r.now += 1000;
        r.see(&[]);
        assert_eq!(r.creates(), ["train-0"], "round {i}");
    }
    r.give(Input::Created { uid: "u0".into() });
    assert_eq!(r.phases, ["0:WaitingForResources", "0:Queued"]);
    assert_eq!((r.state.attempt, r.state.transient_retries), (0, 0));
}

#[test]
fn graceguards_429_for_a_terminating_holder_waits_without_spending_anything() {
    let mut s = spec(0, 3);
    s.bounds.max_transient_retries = 1;
    let mut r = Run::new(s);
    r.see(&[]);
    for i in 1..=5 {
        let d = r
            .give(Input::Refused {
                refusal: CreateRefusal::HolderTerminating,
                retry_at_ms: r.now + 8000,
            })
            .clone();
        assert_eq!(d.wake_at_ms, Some(r.now + 8000));
        assert!(r.see(&[]).actions.is_empty(), "not before its time");
        r.now += 8000;
        r.see(&[]);
        assert_eq!(
            r.creates(),
            ["train-0"],
            "round {i}: the same name, waited for"
        );
    }
    assert_eq!(
        (
            r.state.attempt,
            r.state.transient_retries,
            r.state.system_failures
        ),
        (0, 0, 0)
    );
    r.give(Input::Created { uid: "u0".into() });
    assert!(
        r.phases.iter().all(|p| !p.contains("Failed")),
        "{:?}",
        r.phases
    );
}

#[test]
fn a_terminating_foreign_holder_is_waited_out_not_a_name_conflict() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    for _ in 0..3 {
        r.give(Input::Refused {
            refusal: CreateRefusal::NameTaken,
            retry_at_ms: r.now,
        });
        let d = r
            .give(Input::Read(Some(Existing {
                uid: "x".into(),
                labels: [("app".to_string(), "other".to_string())].into(),
                deleting: true,
            })))
            .clone();
        assert_eq!(d.wake_at_ms, Some(r.now + HOLDER_RECHECK_MS));
        assert!(r.see(&[]).actions.is_empty(), "not before the recheck");
        r.now += HOLDER_RECHECK_MS;
        r.see(&[]);
        assert_eq!(r.creates(), ["train-0"]);
    }
    assert!(r.state.outcome.is_none(), "{:?}", r.state.outcome);
    assert_eq!(r.state.system_failures, 0);
}

#[test]
fn already_exists_on_a_foreign_pod_is_a_name_conflict_and_on_ours_adoption() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    let d = r
        .give(Input::Refused {
            refusal: CreateRefusal::NameTaken,
            retry_at_ms: T0,
        })
        .clone();
    assert_eq!(
        d.actions,
        [Action::Read {
            name: "train-0".into()
        }]
    );
    let mut ours = r.state.clone();
    r.give(Input::Read(Some(Existing {
        uid: "x".into(),
        labels: [("app".to_string(), "other".to_string())].into(),
        deleting: false,
    })));
    let o = r.outcome();
    assert!(o.reason.unwrap_or_default().starts_with("NameConflict"));

    (ours, _) = apply(
        &r.spec,
        ours,
        Input::Read(Some(Existing {
            uid: "u0".into(),
            labels: ours_labels(),
            deleting: false,
        })),
        &[],
        T0,
    );
    assert!(matches!(ours.pod, PodTrack::Created { ref uid, .. } if uid == "u0"));
}

#[test]
fn an_unknown_create_outcome_reads_the_name_before_creating_again() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    let d = r.give(Input::CreateUnknown).clone();
    assert_eq!(
        d.actions,
        [Action::Read {
            name: "train-0".into()
        }]
    );
    // Nothing there: the Create never happened, so it is sent now.
    r.give(Input::Read(None));
    assert_eq!(r.creates(), ["train-0"]);
    // Had the watch shown the pod meanwhile, it is simply adopted.
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    r.give(Input::CreateUnknown);
    r.see(&[pod("u0", 0, "Pending")]);
    assert!(r.creates().is_empty());
    assert!(matches!(r.state.pod, PodTrack::Created { ref uid, seen: true, .. } if uid == "u0"));
}

#[test]
fn a_read_answered_after_the_watch_showed_the_pod_changes_nothing() {
    // The unknown outcome's read is in flight when the watch shows the pod
    // running: the read's late answer (the same pod, or an error) is stale.
    let late = [
        Input::Read(Some(Existing {
            uid: "u0".into(),
            labels: ours_labels(),
            deleting: false,
        })),
        Input::Read(None),
        Input::ReadFailed {
            retry_at_ms: T0 + 2_000,
        },
    ];
    for answer in late {
        let mut r = Run::new(spec(0, 3));
        r.see(&[]);
        assert_eq!(
            r.give(Input::CreateUnknown).actions,
            [Action::Read {
                name: "train-0".into()
            }]
        );
        r.see(&[pod("u0", 0, "Running")]);
        let d = r
            .give_seeing(answer.clone(), &[pod("u0", 0, "Running")])
            .clone();
        assert!(d.actions.is_empty(), "{answer:?}: {d:?}");
        assert_eq!(r.phases, ["0:Queued", "0:Running"], "{answer:?}");
        assert!(
            matches!(r.state.pod, PodTrack::Created { ref uid, seen: true, .. } if uid == "u0"),
            "{answer:?}: {:?}",
            r.state.pod
        );
    }
}

#[test]
fn a_created_pod_the_watch_never_shows_is_read_after_the_lag_bound() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    r.give(Input::Created { uid: "u0".into() });
    let d = r.see(&[]).clone();
    assert!(d.actions.is_empty());
    assert_eq!(d.wake_at_ms, Some(T0 + WATCH_LAG_MS));
    r.now += WATCH_LAG_MS;
    assert_eq!(
        r.see(&[]).actions,
        [Action::Read {
            name: "train-0".into()
        }]
    );
}

#[test]
fn system_failures_in_a_row_are_bounded_and_running_resets_the_count() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    for i in 0..2u32 {
        let uid = format!("u{i}");
        r.give(Input::Created { uid: uid.clone() });
        r.see(&[pod(&uid, i, "Pending")]);
        r.see(&[]);
    }
    r.give(Input::Created { uid: "u2".into() });
    r.see(&[pod("u2", 2, "Running")]);
    r.see(&[]);
    for i in 3..5u32 {
        let uid = format!("u{i}");
        r.give(Input::Created { uid: uid.clone() });
        r.see(&[pod(&uid, i, "Pending")]);
        r.see(&[]);
    }
    let o = r.outcome();
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
    let mut r = Run::new(spec(1, 3));
    r.see(&[]);
    r.give(Input::Created { uid: "u0".into() });
    r.see(&[pod("u0", 0, "Failed")]);
    assert_eq!(r.creates(), ["train-1"]);
    r.give(Input::Created { uid: "u1".into() });
    r.see(&[pod("u0", 0, "Failed"), pod("u1", 1, "Failed")]);
    let o = r.outcome();
    assert_eq!(o.failure_kind, Some(FailureKind::User));
    assert_eq!((o.user_failures, o.pod.as_str()), (2, "train-1"));
}

#[test]
fn a_kubelet_disruption_or_a_deletion_ending_failed_is_a_system_failure() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    r.give(Input::Created { uid: "u0".into() });
    let mut killed = pod("u0", 0, "Failed");
    killed.disruption = Some("TerminationByKubelet".into());
    r.see(&[killed]);
    assert_eq!(r.creates(), ["train-1"]);
    r.give(Input::Created { uid: "u1".into() });
    let mut deleted = pod("u1", 1, "Failed");
    deleted.deletion_ms = Some(T0);
    r.see(&[deleted]);
    assert_eq!(r.creates(), ["train-2"]);
    assert_eq!((r.state.user_failures, r.state.system_failures), (0, 2));
}

#[test]
fn abort_deletes_the_current_pod_and_ends_the_task() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    r.give(Input::Created { uid: "u0".into() });
    let d = r.give(Input::Abort).clone();
    assert_eq!(
        d.actions,
        [Action::Delete {
            name: "train-0".into(),
            uid: "u0".into()
        }]
    );
    assert!(r
        .outcome()
        .reason
        .unwrap_or_default()
        .starts_with("Aborted"));
}

#[test]
fn a_restarted_executor_resumes_from_the_newest_pod_without_a_create() {
    // Before the restart: attempt 0 preempted, attempt 1 running.
    let record = PodRecord {
        user_failures: 0,
        system_failures: 1,
        consecutive_system_failures: 1,
        started_ms: Some(T0 - 5_000),
        spent_ms: None,
        spec: None,
    };
    let old = PodView {
        phase: "Failed".into(),
        disruption: Some("PreemptionByScheduler".into()),
        ..pod("u0", 0, "Failed")
    };
    let newest = PodView {
        record: Some(record),
        ..pod("u1", 1, "Running")
    };
    let pods = [old, newest];
    let state = restore(&pods, T0);
    // The state is plain data: it survives a JSON round trip.
    let text = serde_json::to_string(&state).expect("state serializes");
    let back: TaskState = serde_json::from_str(&text).expect("state parses");
    assert_eq!(back, state);
    let spec = spec(0, 3);
    let (state, d) = reconcile(&spec, back, &pods, T0);
    assert!(d.actions.is_empty(), "no Create on resume: {d:?}");
    assert_eq!(state.attempt, 1);
    assert_eq!(state.system_failures, 1);
    assert_eq!(state.consecutive_system_failures, 0, "Running resets it");
    assert_eq!(state.started_ms, T0 - 5_000);
    assert_eq!(state.phase, Phase::Running);
    // A restored task whose newest pod is terminating waits it out.
    let pods = [deleting(
        "u0",
        0,
        Some("PreemptionByScheduler"),
        T0 + 30_000,
    )];
    let (state, d) = reconcile(&spec, restore(&pods, T0), &pods, T0);
    assert!(d.actions.is_empty());
    let (_, d) = reconcile(&spec, state, &[], T0 + 1_000);
    assert_eq!(
        d.actions
            .iter()
            .filter(|a| matches!(a, Action::Create { .. }))
            .count(),
        1
    );
}

#[test]
fn each_create_carries_the_record_a_restart_needs() {
    let mut r = Run::new(spec(1, 3));
    r.see(&[]);
    r.give(Input::Created { uid: "u0".into() });
    r.see(&[pod("u0", 0, "Failed")]);
    let Some(Action::Create { record, .. }) = r.last.actions.first().cloned() else {
        panic!("expected a Create: {:?}", r.last)
    };
    assert_eq!(
        record,
        PodRecord {
            user_failures: 1,
            system_failures: 0,
            consecutive_system_failures: 0,
            started_ms: Some(T0),
            spent_ms: None,
            spec: Some(r.spec.recorded()),
        }
    );
}

#[test]
fn a_failed_read_waits_for_its_backoff_before_reading_again() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    r.give(Input::CreateUnknown);
    let d = r
        .give(Input::ReadFailed {
            retry_at_ms: T0 + 2_000,
        })
        .clone();
    assert!(d.actions.is_empty(), "no read at once: {d:?}");
    assert_eq!(d.wake_at_ms, Some(T0 + 2_000));
    r.now = T0 + 2_000;
    assert_eq!(
        r.see(&[]).actions,
        [Action::Read {
            name: "train-0".into()
        }]
    );
}

#[test]
fn an_abort_while_the_create_is_in_flight_deletes_the_pod_when_it_appears() {
    // The Create's answer arrives after the abort.
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    let d = r.give(Input::Abort).clone();
    assert!(d.actions.is_empty(), "no uid to delete yet: {d:?}");
    assert!(r.state.delete_on_sight);
    let d = r.give(Input::Created { uid: "u0".into() }).clone();
    assert_eq!(
        d.actions,
        [Action::Delete {
            name: "train-0".into(),
            uid: "u0".into()
        }]
    );
    assert_eq!(r.outcome().uid.as_deref(), Some("u0"));
    // Or the watch shows it first (after an unknown outcome).
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    r.give(Input::CreateUnknown);
    r.give(Input::Abort);
    let d = r.see(&[pod("u0", 0, "Pending")]).clone();
    assert_eq!(d.actions.len(), 1, "{d:?}");
    assert!(!r.state.delete_on_sight);
    // A failed delete is tried again after its backoff.
    let d = r
        .give_seeing(
            Input::DeleteFailed {
                retry_at_ms: T0 + 1_000,
            },
            &[pod("u0", 0, "Pending")],
        )
        .clone();
    assert_eq!(d.wake_at_ms, Some(T0 + 1_000));
    assert!(r.see(&[pod("u0", 0, "Pending")]).actions.is_empty());
    r.now = T0 + 1_000;
    assert_eq!(r.see(&[pod("u0", 0, "Pending")]).actions.len(), 1);
}

#[test]
fn a_failed_pending_timeout_delete_is_sent_again_after_its_backoff() {
    let mut s = spec(0, 3);
    s.bounds.pending_timeout_seconds = Some(10);
    let mut r = Run::new(s);
    r.see(&[]);
    r.give(Input::Created { uid: "u0".into() });
    r.now = T0 + 10_000;
    assert_eq!(r.see(&[pod("u0", 0, "Pending")]).actions.len(), 1);
    r.give_seeing(
        Input::DeleteFailed {
            retry_at_ms: T0 + 11_000,
        },
        &[pod("u0", 0, "Pending")],
    );
    assert!(r.see(&[pod("u0", 0, "Pending")]).actions.is_empty());
    r.now = T0 + 11_000;
    assert_eq!(
        r.see(&[pod("u0", 0, "Pending")]).actions,
        [Action::Delete {
            name: "train-0".into(),
            uid: "u0".into()
        }]
    );
}

#[test]
fn a_pod_that_ended_decides_the_task_even_past_the_deadline() {
    let mut s = spec(0, 3);
    s.bounds.deadline_seconds = Some(60);
    let mut r = Run::new(s);
    r.see(&[]);
    r.give(Input::Created { uid: "u0".into() });
    r.now = T0 + 61_000;
    let d = r.see(&[pod("u0", 0, "Succeeded")]).clone();
    assert!(d.actions.is_empty(), "{d:?}");
    assert!(r.outcome().succeeded);
}

#[test]
fn a_retry_waits_until_the_aborted_pod_is_gone() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    r.give(Input::Created { uid: "u0".into() });
    r.see(&[pod("u0", 0, "Running")]);
    r.give(Input::Abort);
    let (state, _) = retry(&r.spec, r.state.clone(), r.now);
    r.state = state;
    assert_eq!(r.state.attempt, 1);
    let terminating = deleting("u0", 0, None, T0 + 30_000);
    let d = r.see(std::slice::from_ref(&terminating)).clone();
    assert!(
        d.actions.is_empty(),
        "no Create while attempt 0 shuts down: {d:?}"
    );
    assert_eq!(d.wake_at_ms, Some(T0 + 30_000 + 300_000));
    r.see(&[]);
    assert_eq!(r.creates(), ["train-1"]);
}

#[test]
fn an_attempt_label_at_the_end_of_the_range_fails_instead_of_wrapping() {
    let pods = [PodView {
        record: None,
        ..pod("u", MAX_ATTEMPT, "Failed")
    }];
    let spec = spec(5, 3);
    let (state, d) = reconcile(&spec, restore(&pods, T0), &pods, T0);
    assert!(d.actions.is_empty(), "{d:?}");
    let o = state.outcome.expect("ended");
    assert!(o
        .reason
        .unwrap_or_default()
        .starts_with("AttemptsExhausted"));
}

#[test]
fn a_retry_after_an_abort_during_the_create_deletes_the_old_pod_before_creating() {
    // Aborted while attempt 0's Create was in flight, retried at once: the
    // Create's answer is an earlier attempt's now, but the watch shows its
    // pod running, and that pod is deleted (once) before attempt 1 starts.
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    r.give(Input::Abort);
    let (state, _) = retry(&r.spec, r.state.clone(), r.now);
    r.state = state;
    assert_eq!(r.state.attempt, 1);
    let stray = pod("u0", 0, "Running");
    let d = r.see(std::slice::from_ref(&stray)).clone();
    assert_eq!(
        d.actions,
        [Action::Delete {
            name: "train-0".into(),
            uid: "u0".into()
        }],
        "the stray is deleted and attempt 1 waits: {d:?}"
    );
    assert_eq!(d.wake_at_ms, Some(T0 + HOLDER_RECHECK_MS));
    assert!(
        r.see(std::slice::from_ref(&stray)).actions.is_empty(),
        "asked once"
    );
    // Its Delete failed: asked again after the backoff.
    r.give_seeing(
        Input::DeleteFailed {
            retry_at_ms: T0 + 1_000,
        },
        std::slice::from_ref(&stray),
    );
    r.now = T0 + 1_000;
    assert_eq!(r.see(std::slice::from_ref(&stray)).actions.len(), 1);
    // Shutting down, then gone: only then attempt 1.
    let d = r.see(&[deleting("u0", 0, None, T0 + 30_000)]).clone();
    assert!(r.creates().is_empty(), "{d:?}");
    r.see(&[]);
    assert_eq!(r.creates(), ["train-1"]);
    // After the end, too: a stray left by an aborted task is deleted.
    let mut r = Run::new(spec(0, 3));
    r.state.attempt = 2;
    r.give(Input::Abort);
    let d = r.see(&[pod("u1", 1, "Pending"), pod("u0", 0, "Succeeded")]);
    assert_eq!(
        d.actions,
        [Action::Delete {
            name: "train-1".into(),
            uid: "u1".into()
        }],
        "an ended pod is left alone"
    );
}

#[test]
fn a_task_submitted_again_after_its_result_was_acknowledged_is_not_the_old_result_unasked() {
    let done = PodView {
        done: true,
        ..pod("u3", 3, "Succeeded")
    };
    let older = PodView {
        done: true,
        ..pod("u2", 2, "Failed")
    };
    // Not asked to run again: the old result, saying so, and no Create.
    let s = spec(0, 3);
    let (state, d) = resume(&s, &[older.clone(), done.clone()], T0);
    assert!(d.actions.is_empty(), "{d:?}");
    let o = state.outcome.clone().expect("ended");
    assert!(o.succeeded);
    assert!(o.reason.unwrap_or_default().starts_with("AlreadyDone"));
    let (_, d) = reconcile(&s, state, &[older.clone(), done.clone()], T0);
    assert!(d.actions.is_empty(), "{d:?}");
    // Asked (a CronJob's `graceguard run`): a new run under the next name.
    let s = TaskSpec {
        rerun_done: true,
        ..spec(0, 3)
    };
    let (state, d) = resume(&s, &[older.clone(), done.clone()], T0);
    assert_eq!(state.attempt, 4);
    assert_eq!(state.user_failures, 0);
    assert_eq!(d.transitions.len(), 1);
    let (state, d) = reconcile(&s, state, &[older, done.clone()], T0);
    assert!(state.outcome.is_none());
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::Create { name, .. } if name == "train-4")),
        "{d:?}"
    );
    // A finished pod not yet acknowledged is resumed: its result is
    // delivered (again), not run again.
    let unacked = pod("u3", 3, "Succeeded");
    let (state, _) = resume(&s, std::slice::from_ref(&unacked), T0);
    assert_eq!(state.attempt, 3);
    let (state, d) = reconcile(&s, state, &[unacked], T0);
    assert!(d.actions.is_empty());
    assert!(state.outcome.expect("ended").succeeded);
}

#[test]
fn a_5xx_create_reads_the_name_after_its_backoff_instead_of_creating_blind() {
    let mut r = Run::new(spec(0, 3));
    r.see(&[]);
    // A 504 whose write landed: no Create now, a read after the backoff.
    let d = r
        .give(Input::Refused {
            refusal: CreateRefusal::MaybeCreated,
            retry_at_ms: T0 + 500,
        })
        .clone();
    assert!(d.actions.is_empty(), "{d:?}");
    assert_eq!(d.wake_at_ms, Some(T0 + 500));
    r.now = T0 + 500;
    assert_eq!(
        r.see(&[]).actions,
        [Action::Read {
            name: "train-0".into()
        }]
    );
    // The pod is there and ours: adopted, no second Create.
    let d = r
        .give(Input::Read(Some(Existing {
            uid: "u0".into(),
            labels: ours_labels(),
            deleting: false,
        })))
        .clone();
    assert!(r.creates().is_empty(), "{d:?}");
    assert!(matches!(r.state.pod, PodTrack::Created { ref uid, .. } if uid == "u0"));
    // Persistent 5xx are bounded like any transient error.
    let mut s = spec(0, 1);
    s.bounds.max_transient_retries = 2;
    let mut r = Run::new(s);
    r.see(&[]);
    for _ in 0..3 {
        r.give(Input::Refused {
            refusal: CreateRefusal::MaybeCreated,
            retry_at_ms: T0,
        });
        r.give(Input::Read(None));
    }
    assert!(r
        .outcome()
        .reason
        .unwrap_or_default()
        .contains("TransientRetriesExhausted"));
}

#[test]
fn already_exists_with_nothing_holding_the_name_waits_and_is_bounded() {
    let mut s = spec(0, 1);
    s.bounds.max_transient_retries = 3;
    let mut r = Run::new(s);
    r.see(&[]);
    let mut creates = 1;
    for _ in 0..10 {
        if r.state.outcome.is_some() {
            break;
        }
        r.give(Input::Refused {
            refusal: CreateRefusal::NameTaken,
            retry_at_ms: r.now,
        });
        let d = r.give(Input::Read(None)).clone();
        // Never straight back to a Create: a wait first.
        assert!(r.creates().is_empty(), "{d:?}");
        if r.state.outcome.is_none() {
            assert_eq!(d.wake_at_ms, Some(r.now + HOLDER_RECHECK_MS));
            r.now += HOLDER_RECHECK_MS;
            r.see(&[]);
            creates += r.creates().len();
        }
    }
    assert_eq!(creates, 4, "one Create, then one per wait, up to the bound");
    assert!(r
        .outcome()
        .reason
        .unwrap_or_default()
        .contains("TransientRetriesExhausted"));
}

#[test]
fn a_pod_kept_only_by_a_finalizer_after_its_final_delete_counts_as_gone() {
    // Attempt 0 was deleted; the kubelet's final delete (grace 0) came, but
    // the result finalizer keeps the object, still "Running" (a kubelet that
    // posts no terminal phase, as before 1.22): the task must not wait for
    // it to vanish, but count a system failure and launch attempt 1.
    let spec = spec(0, 3);
    let (s, _) = launch(&spec, T0);
    let (s, _) = apply(
        &spec,
        s,
        Input::Created { uid: "u0".into() },
        &[pod("u0", 0, "Running")],
        T0,
    );
    let grace = deleting("u0", 0, None, T0 + 30_000);
    let (s, d) = reconcile(&spec, s, std::slice::from_ref(&grace), T0 + 1_000);
    assert!(d.actions.is_empty(), "{d:?}");
    assert_eq!(s.attempt, 0);
    let finished = PodView {
        finished: true,
        ..grace
    };
    let (s, d) = reconcile(&spec, s, std::slice::from_ref(&finished), T0 + 2_000);
    assert_eq!(s.attempt, 1, "{s:?}");
    assert_eq!(s.system_failures, 1);
    assert!(
        matches!(d.actions.as_slice(), [Action::Create { name, .. }] if name == "train-1"),
        "{d:?}"
    );
    // An earlier attempt's finished pod never holds a later Create back.
    let (s, d) = apply(
        &spec,
        s,
        Input::Refused {
            refusal: CreateRefusal::Transient,
            retry_at_ms: T0 + 3_000,
        },
        std::slice::from_ref(&finished),
        T0 + 2_500,
    );
    assert!(d.actions.is_empty(), "{d:?}");
    let (_, d) = reconcile(&spec, s, &[finished], T0 + 3_000);
    assert!(
        matches!(d.actions.as_slice(), [Action::Create { .. }]),
        "{d:?}"
    );
}

#[test]
fn a_replaced_task_runs_anew_under_the_name_after_its_last_pods() {
    // The earlier run's pods: attempt 2 failed, not marked done (a template
    // changed after a restart), attempt 0 succeeded long ago.
    let pods = [pod("u0", 0, "Succeeded"), pod("u2", 2, "Failed")];
    let (s, d) = replace(&spec(0, 3), &pods, T0);
    assert_eq!((s.attempt, s.outcome.is_none()), (3, true));
    assert_eq!((s.user_failures, s.system_failures), (0, 0));
    let _ = d;
    let (_, d) = reconcile(&spec(0, 3), s, &pods, T0);
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::Create { name, attempt: 3, .. } if name == "train-3")),
        "{:?}",
        d.actions
    );
    // No pods: a plain launch at attempt 0.
    let (s, _) = replace(&spec(0, 3), &[], T0);
    assert_eq!(s.attempt, 0);
}
