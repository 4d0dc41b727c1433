//! The collision guard's decision, free of I/O.
//!
//! A pod Create whose name is free in the index is allowed at once. A hit is
//! confirmed by a live read (see [`crate::confirm`]): only a confirmed holder
//! denies, so a stale index never denies a legitimate Create, and a failed read
//! allows, so graceguard never makes things worse than no webhook.

use kube::core::response::{StatusCause, StatusDetails};
use kube::core::Status;

use crate::mode::Mode;
use crate::pod_index::Holder;
use crate::quota_kinds::GroupResource;
use crate::read_error::ReadError;

/// What the live read said about the name.
#[derive(Clone, Debug)]
pub enum Confirmation {
    Held(Holder),
    Free,
    /// The read failed (the Create is allowed).
    Failed(ReadError),
}

/// Why a Create was allowed (the audit record's `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllowReason {
    /// Not a pod Create (another kind, operation or subresource).
    NotPodCreate,
    /// A Create of a kind no quota counts, or not served by this endpoint: not indexed.
    KindNotIndexed,
    /// The kind has more objects than its index may hold: not checked (fail open).
    KindIndexOverCap,
    /// No name to collide on yet.
    NoName,
    NameFree,
    /// The index's watch was not current, so a name it did not hold was
    /// read live, and the read said free.
    NameFreeRead,
    /// The index said held, the live read said free.
    StaleIndex,
    /// The live read failed: fail open.
    ConfirmFailed,
    /// `helm test`'s dry run (see `self_test`): answered with a warning.
    SelfTest,
}

impl AllowReason {
    /// Every allow reason, for the docs' table check.
    pub const ALL: [AllowReason; 9] = [
        AllowReason::NotPodCreate,
        AllowReason::KindNotIndexed,
        AllowReason::KindIndexOverCap,
        AllowReason::NoName,
        AllowReason::NameFree,
        AllowReason::NameFreeRead,
        AllowReason::StaleIndex,
        AllowReason::ConfirmFailed,
        AllowReason::SelfTest,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AllowReason::NotPodCreate => "not_a_pod_create",
            AllowReason::KindNotIndexed => "kind_not_indexed",
            AllowReason::KindIndexOverCap => "kind_index_over_cap",
            AllowReason::NoName => "no_name",
            AllowReason::NameFree => "name_free",
            AllowReason::NameFreeRead => "name_free_read",
            AllowReason::StaleIndex => "stale_index",
            AllowReason::ConfirmFailed => "confirm_failed",
            AllowReason::SelfTest => "self_test",
        }
    }
}

/// Why a Create was denied: its holder is terminating, or live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenyReason {
    Terminating,
    Exists,
}

impl DenyReason {
    /// Every deny reason, for the docs' table check.
    pub const ALL: [DenyReason; 2] = [DenyReason::Terminating, DenyReason::Exists];

    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::Terminating => "terminating",
            DenyReason::Exists => "exists",
        }
    }
}

/// A denial, ready to send.
#[derive(Clone, Debug, PartialEq)]
pub struct Denial {
    pub status: Status,
    /// The audit record's `reason`.
    pub reason: DenyReason,
    pub grace_left_seconds: Option<i64>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Allow(AllowReason),
    Deny(Box<Denial>),
}

/// The numbers of mode `adaptive`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Adaptive {
    /// Denials of one name to one client (per streak, see `livelock`)
    /// answered 409 before 429s begin: a one-off client such as kubectl sees
    /// exactly what the API server would answer.
    pub conflicts_first: usize,
    /// The longest `retryAfterSeconds`. client-go retries a 429 that carries
    /// Retry-After up to 10 times inside the same call, so one call of a
    /// client-go worker is blocked at most 10 × this.
    pub max_retry_after: u32,
    /// The wait for a holder kept only by finalizers (its grace, if any, is
    /// over): nothing says when they finish, so a fixed interval.
    pub finalizer_retry_after: u32,
}

impl Default for Adaptive {
    fn default() -> Self {
        Self {
            conflicts_first: 2,
            max_retry_after: 8,
            finalizer_retry_after: 5,
        }
    }
}

/// How a denial is phrased: the mode and, for `adaptive`, how many times in
/// a row this client has been denied this name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct How {
    pub mode: Mode,
    /// Denials of this name to this client in the current streak, this one
    /// included (1 for a first attempt, and for dry runs, which are not counted).
    pub streak: usize,
    pub adaptive: Adaptive,
}

impl From<Mode> for How {
    fn from(mode: Mode) -> Self {
        Self {
            mode,
            streak: 1,
            adaptive: Adaptive::default(),
        }
    }
}

/// How many times client-go retries a 429 that carries Retry-After inside
/// one call (`maxRetries` in `rest.Request`, default 10) before it returns it.
pub const CLIENT_GO_MAX_RETRIES: usize = 10;

/// How long past its deletion's deadline a pod is expected to go: the
/// kubelet kills what is left at the deadline, waits for its next PLEG
/// relist (up to 1 s, "max 2s"), reports and deletes. `adaptive` asks every
/// second until then.
pub const KILLED_WITHIN_SECONDS: i64 = 4;

/// The longest wait mode `retry` asks for. Its wait is the holder's grace
/// left, and a grace period may be hours: a client told to wait that long
/// holds its worker (or gives up) although the holder may be gone in
/// seconds; capped, it asks again each minute, one Create a minute.
pub const RETRY_MODE_MAX_WAIT_SECONDS: u32 = 60;

/// 409 AlreadyExists, or 429 with this many seconds to wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phrasing {
    Conflict,
    Retry { after_seconds: u32 },
}

/// Which answer a denial of `holder` gets. A live holder will not go away by
/// waiting: 409 in every mode. `retry`: 429 with the grace left. `adaptive`:
/// 409 for the first `conflicts_first` denials, then 429 with waits that
/// follow what graceguard knows of the holder, its deletion's deadline:
///
/// * before it, the time the holder has been terminating, at least 2 s (2,
///   2, 4, 8 s, ..., at most `max_retry_after`): containers often exit long
///   before their grace ends, and every retry is judged against the holder
///   again, so short waits early find the name free soon after it is;
/// * never past the deadline by more than 2 s: the kubelet kills what is
///   left at the deadline and removes the pod 1 to 2 s later (a PLEG
///   relist, its status update, its delete; the deadline itself is known to
///   the second only);
/// * past the deadline, every second for [`KILLED_WITHIN_SECONDS`], then
///   growing again (a kubelet that is slow or gone, a node down).
///
/// A holder that takes its whole 30 s grace costs a client-go caller at most
/// 10 Creates, and the Create that succeeds comes within about a second of
/// the name being free (`a_whole_30_s_grace_costs_at_most_10_creates_and_the_relaunch_follows_within_a_second`,
/// and `scripts/bench --only relaunch_delay` on a real node). After every [`CLIENT_GO_MAX_RETRIES`] 429s in a row one
/// 409 follows, so a client-go call, which returns the answer after its
/// retries are spent, returns the AlreadyExists it would have met without
/// graceguard, never a 429 (Flyte's executor, for one, counts any other
/// Create error as a system failure and fails the task after 3: a holder
/// with a long grace would otherwise fail tasks that mode `conflict` keeps
/// alive).
pub fn phrasing(holder: &Holder, how: How, now_unix: i64) -> Phrasing {
    let Some(d) = holder.held.deletion else {
        return Phrasing::Conflict;
    };
    let left = d.seconds_left(now_unix);
    let seconds = |s: i64| u32::try_from(s.max(1)).unwrap_or(u32::MAX);
    match how.mode {
        Mode::Conflict => Phrasing::Conflict,
        Mode::Retry => Phrasing::Retry {
            after_seconds: seconds(left).min(RETRY_MODE_MAX_WAIT_SECONDS),
        },
        Mode::Adaptive if how.streak <= how.adaptive.conflicts_first => Phrasing::Conflict,
        // The 11th answer of each run of 429s: the one a client-go call returns.
        Mode::Adaptive
            if how
                .streak
                .saturating_sub(how.adaptive.conflicts_first)
                .is_multiple_of(CLIENT_GO_MAX_RETRIES + 1) =>
        {
            Phrasing::Conflict
        }
        Mode::Adaptive => {
            let a = how.adaptive;
            if left == 0 && !holder.finalizers.is_empty() {
                return Phrasing::Retry {
                    after_seconds: a.finalizer_retry_after.max(1),
                };
            }
            const FIRST_WAIT: i64 = 2;
            const PAST_DEADLINE: i64 = 2;
            let wait = if left > 0 {
                let elapsed = now_unix.saturating_sub(d.requested_unix()).max(0);
                elapsed
                    .max(FIRST_WAIT)
                    .min(left.saturating_add(PAST_DEADLINE))
            } else {
                let overdue = now_unix.saturating_sub(d.at_unix).max(0);
                if overdue < KILLED_WITHIN_SECONDS {
                    1
                } else {
                    overdue
                }
            };
            Phrasing::Retry {
                after_seconds: seconds(wait).min(a.max_retry_after.max(1)),
            }
        }
    }
}

/// The verdict for a Create of kind `kind` once the live read has answered.
pub fn decide(
    kind: &GroupResource,
    confirmation: &Confirmation,
    name: &str,
    how: impl Into<How>,
    now_unix: i64,
) -> Verdict {
    match confirmation {
        Confirmation::Free => Verdict::Allow(AllowReason::StaleIndex),
        Confirmation::Failed(_) => Verdict::Allow(AllowReason::ConfirmFailed),
        Confirmation::Held(holder) => {
            let phrase = phrasing(holder, how.into(), now_unix);
            Verdict::Deny(Box::new(denial(kind, name, holder, phrase, now_unix)))
        }
    }
}

fn rfc3339(unix: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(unix)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| unix.to_string())
}

const NO_CHARGE: &str =
    "graceguard denied this Create before ResourceQuota admission, so no quota was charged";

/// What keeps a terminating object from going away, in words: its finalizers
/// (foreground deletion named as such), or its grace period.
fn held_by(finalizers: &[String]) -> Option<String> {
    if finalizers.is_empty() {
        return None;
    }
    let names: Vec<String> = finalizers
        .iter()
        .map(|f| match f.as_str() {
            "foregroundDeletion" => "foreground deletion (waiting for its dependents to go)".into(),
            other => format!("finalizer {other}"),
        })
        .collect();
    Some(names.join(", "))
}

/// The `reason` of the cause a denial of a terminating holder carries, in
/// 409 and 429 alike (graceguard's guard reads it: the shared contract).
pub use graceguard_contract::HOLDER_TERMINATING_CAUSE;

/// The denial for a Create of `name` of kind `kind`, held by `holder`,
/// phrased as [`phrasing`] chose: 409 AlreadyExists, as the API server
/// answers, or 429 TooManyRequests with `retryAfterSeconds`.
pub fn denial(
    kind: &GroupResource,
    name: &str,
    holder: &Holder,
    phrase: Phrasing,
    now_unix: i64,
) -> Denial {
    let mut details = StatusDetails {
        name: name.to_string(),
        group: kind.group.clone(),
        kind: kind.resource.clone(),
        uid: String::new(),
        causes: Vec::new(),
        retry_after_seconds: 0,
    };
    let what = match kind.group.as_str() {
        "" => kind.resource.clone(),
        group => format!("{}.{group}", kind.resource),
    };
    let (message, reason, left) = match holder.held.deletion {
        Some(d) => {
            let left = d.seconds_left(now_unix);
            let holds = match held_by(&holder.finalizers) {
                // Finalizers keep it; its grace period (pods) may be over or not.
                Some(by) if d.grace_seconds > 0 => format!(
                    "deletion requested at {}, {left} s of its {} s grace period left, held by {by}",
                    rfc3339(d.requested_unix()),
                    d.grace_seconds
                ),
                Some(by) => format!("deletion requested at {}, held by {by}", rfc3339(d.requested_unix())),
                None => format!(
                    "deletion requested at {}, {left} s of its {} s grace period left",
                    rfc3339(d.requested_unix()),
                    d.grace_seconds
                ),
            };
            details.causes.push(StatusCause {
                reason: HOLDER_TERMINATING_CAUSE.to_string(),
                message: format!("{what} \"{name}\" is terminating ({holds})"),
                field: "metadata.name".to_string(),
            });
            (
                format!(
                    "{what} \"{name}\" already exists and is terminating ({holds}); {NO_CHARGE}. Create it again once it is gone, or use a new name"
                ),
                DenyReason::Terminating,
                Some(left),
            )
        }
        None => (
            format!("{what} \"{name}\" already exists; {NO_CHARGE}"),
            DenyReason::Exists,
            None,
        ),
    };
    let status = match phrase {
        Phrasing::Retry { after_seconds } => {
            details.retry_after_seconds = after_seconds;
            let message = format!(
                "{message}. Retry in {after_seconds} s: this 429 is graceguard's answer (the holder is still terminating), not the API server's priority-and-fairness throttling"
            );
            Status::failure(&message, "TooManyRequests")
                .with_code(429)
                .with_details(details)
        }
        Phrasing::Conflict => Status::failure(&message, "AlreadyExists")
            .with_code(409)
            .with_details(details),
    };
    Denial {
        status,
        reason,
        grace_left_seconds: left,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod_index::{Deletion, HeldPod};

    const NOW: i64 = 1_700_000_000;

    fn live() -> Holder {
        Holder::from(HeldPod {
            uid: "u1".into(),
            deletion: None,
        })
    }

    #[test]
    fn retry_mode_waits_the_grace_left_but_never_more_than_a_minute() {
        let pods = GroupResource::pods();
        for (left, want) in [(5, 5), (60, 60), (61, 60), (3600, 60), (0, 1)] {
            let d = deny(decide(
                &pods,
                &Confirmation::Held(terminating(left, left.max(30))),
                "p",
                Mode::Retry,
                NOW,
            ));
            assert_eq!(d.status.code, 429, "{left}");
            assert_eq!(
                d.status.details.map(|x| x.retry_after_seconds),
                Some(want),
                "grace left {left}"
            );
        }
    }

    fn terminating(left: i64, grace: i64) -> Holder {
        Holder::from(HeldPod {
            uid: "u1".into(),
            deletion: Some(Deletion {
                at_unix: NOW + left,
                grace_seconds: grace,
            }),
        })
    }

    fn deny(v: Verdict) -> Denial {
        match v {
            Verdict::Deny(d) => *d,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    #[test]
    fn decision_table() {
        // (confirmation, mode, expected: Ok(allow reason) | Err((code, reason, retry_after)))
        type Want = Result<AllowReason, (u16, &'static str, u32)>;
        let cases: Vec<(&str, Confirmation, Mode, Want)> = vec![
            (
                "stale index",
                Confirmation::Free,
                Mode::Conflict,
                Ok(AllowReason::StaleIndex),
            ),
            (
                "stale index, retry",
                Confirmation::Free,
                Mode::Retry,
                Ok(AllowReason::StaleIndex),
            ),
            (
                "GET error",
                Confirmation::Failed(ReadError {
                    resource: "pods".into(),
                    namespace: "ml".into(),
                    name: "train-0".into(),
                    cause: crate::read_error::Cause::TimedOut(std::time::Duration::from_secs(1)),
                }),
                Mode::Conflict,
                Ok(AllowReason::ConfirmFailed),
            ),
            (
                "held, live",
                Confirmation::Held(live()),
                Mode::Conflict,
                Err((409, "AlreadyExists", 0)),
            ),
            (
                "held, live, retry",
                Confirmation::Held(live()),
                Mode::Retry,
                Err((409, "AlreadyExists", 0)),
            ),
            (
                "terminating",
                Confirmation::Held(terminating(40, 60)),
                Mode::Conflict,
                Err((409, "AlreadyExists", 0)),
            ),
            (
                "terminating, retry",
                Confirmation::Held(terminating(40, 60)),
                Mode::Retry,
                Err((429, "TooManyRequests", 40)),
            ),
            (
                "grace over, retry",
                Confirmation::Held(terminating(-5, 30)),
                Mode::Retry,
                Err((429, "TooManyRequests", 1)),
            ),
        ];
        for (what, c, mode, want) in cases {
            let got = decide(&GroupResource::pods(), &c, "train-0", mode, NOW);
            match (got, want) {
                (Verdict::Allow(r), Ok(w)) => assert_eq!(r, w, "{what}"),
                (Verdict::Deny(d), Err((code, reason, retry))) => {
                    assert_eq!(d.status.code, code, "{what}");
                    assert_eq!(d.status.reason, reason, "{what}");
                    let det = d.status.details.clone().expect("details");
                    assert_eq!(det.name, "train-0", "{what}");
                    assert_eq!(det.kind, "pods", "{what}");
                    assert_eq!(det.retry_after_seconds, retry, "{what}");
                    assert!(d.status.message.contains("no quota was charged"), "{what}");
                }
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn terminating_message_says_since_when_and_how_long_is_left() {
        let d = deny(decide(
            &GroupResource::pods(),
            &Confirmation::Held(terminating(40, 60)),
            "train-0",
            Mode::Conflict,
            NOW,
        ));
        let requested = rfc3339(NOW - 20);
        assert!(
            d.status.message.contains(&requested),
            "{}",
            d.status.message
        );
        assert!(
            d.status
                .message
                .contains("40 s of its 60 s grace period left"),
            "{}",
            d.status.message
        );
        assert_eq!(d.reason, DenyReason::Terminating);
        assert_eq!(d.grace_left_seconds, Some(40));
    }

    #[test]
    fn other_kinds_say_what_holds_them() {
        let mut holder = terminating(0, 0);
        holder.finalizers = vec!["kubernetes.io/pvc-protection".into()];
        let pvc = GroupResource::new("", "persistentvolumeclaims");
        let d = deny(decide(
            &pvc,
            &Confirmation::Held(holder),
            "data",
            Mode::Conflict,
            NOW,
        ));
        assert_eq!(d.status.code, 409);
        assert_eq!(d.status.reason, "AlreadyExists");
        let det = d.status.details.clone().expect("details");
        assert_eq!(
            (det.group.as_str(), det.kind.as_str()),
            ("", "persistentvolumeclaims")
        );
        assert!(
            d.status.message.starts_with(&format!(
                "persistentvolumeclaims \"data\" already exists and is terminating (deletion requested at {}, held by finalizer kubernetes.io/pvc-protection);",
                rfc3339(NOW)
            )),
            "{}",
            d.status.message
        );
        let mut job = terminating(0, 0);
        job.finalizers = vec!["foregroundDeletion".into()];
        let jobs = GroupResource::new("batch", "jobs");
        let d = deny(decide(
            &jobs,
            &Confirmation::Held(job),
            "once",
            Mode::Retry,
            NOW,
        ));
        assert!(
            d.status.message.starts_with("jobs.batch \"once\""),
            "{}",
            d.status.message
        );
        assert!(
            d.status.message.contains("foreground deletion"),
            "{}",
            d.status.message
        );
        // No grace to wait out: retry after the minimum.
        assert_eq!(d.status.code, 429);
        assert_eq!(d.status.details.map(|x| x.retry_after_seconds), Some(1));
    }

    #[test]
    fn live_holder_message_says_it_exists() {
        let d = deny(decide(
            &GroupResource::pods(),
            &Confirmation::Held(live()),
            "x",
            Mode::Conflict,
            NOW,
        ));
        assert!(
            d.status.message.starts_with("pods \"x\" already exists;"),
            "{}",
            d.status.message
        );
        assert_eq!(d.reason, DenyReason::Exists);
    }

    /// The denial of `held` to a client on its `streak`th try, in mode adaptive.
    fn adaptive_denial(held: &Confirmation, streak: usize) -> Denial {
        deny(decide(
            &GroupResource::pods(),
            held,
            "t",
            adaptive(streak),
            NOW,
        ))
    }

    fn adaptive(streak: usize) -> How {
        How {
            mode: Mode::Adaptive,
            streak,
            adaptive: Adaptive::default(),
        }
    }

    #[test]
    fn adaptive_answers_409_after_every_ten_429s_so_a_client_go_call_never_returns_one() {
        let held = Confirmation::Held(terminating(28, 600));
        let codes: Vec<u16> = (1..=26)
            .map(|streak| adaptive_denial(&held, streak).status.code)
            .collect();
        let mut want = vec![409, 409];
        for _ in 0..2 {
            want.extend([429; CLIENT_GO_MAX_RETRIES]);
            want.push(409);
        }
        want.extend([429, 429]);
        assert_eq!(codes, want);
        // Every denial of a terminating holder names it as a cause, in 409 and 429 alike.
        for streak in [1, 3] {
            let d = adaptive_denial(&held, streak);
            let causes = d.status.details.map(|x| x.causes).unwrap_or_default();
            assert_eq!(
                causes.iter().map(|c| c.reason.as_str()).collect::<Vec<_>>(),
                [HOLDER_TERMINATING_CAUSE],
                "streak {streak}"
            );
            assert_eq!(causes[0].field, "metadata.name");
        }
    }

    #[test]
    fn adaptive_answers_409_first_then_429_and_never_for_a_live_holder() {
        let held = Confirmation::Held(terminating(28, 30));
        for streak in 1..=2 {
            let d = adaptive_denial(&held, streak);
            assert_eq!(
                (d.status.code, d.status.reason.as_str()),
                (409, "AlreadyExists"),
                "streak {streak}"
            );
        }
        let d = adaptive_denial(&held, 3);
        assert_eq!(
            (d.status.code, d.status.reason.as_str()),
            (429, "TooManyRequests")
        );
        // 2 s into its grace: wait 2 s.
        assert_eq!(
            d.status.details.as_ref().map(|x| x.retry_after_seconds),
            Some(2)
        );
        assert!(
            d.status.message.contains("Retry in 2 s"),
            "{}",
            d.status.message
        );
        assert!(
            d.status
                .message
                .contains("not the API server's priority-and-fairness throttling"),
            "{}",
            d.status.message
        );
        let live = deny(decide(
            &GroupResource::pods(),
            &Confirmation::Held(live()),
            "t",
            adaptive(50),
            NOW,
        ));
        assert_eq!(live.status.code, 409);
    }

    #[test]
    fn adaptive_waits_grow_with_the_time_the_holder_has_taken_and_stop_at_the_cap() {
        let a = Adaptive::default();
        let how = adaptive(3);
        // (seconds since the delete, grace) -> retryAfterSeconds
        for (elapsed, grace, want) in [
            (0, 30, 2),
            (2, 30, 2),
            (4, 30, 4),
            (6, 30, 6),
            (15, 30, 8),
            (24, 30, 8),
            (27, 30, 5),
            (29, 30, 3),
        ] {
            let h = terminating(grace - elapsed, grace);
            assert_eq!(
                phrasing(&h, how, NOW),
                Phrasing::Retry {
                    after_seconds: want
                },
                "{elapsed} s into {grace} s"
            );
        }
        // Past the deadline: the kubelet removes the pod within seconds,
        // asked every second; long past (a slow kubelet, a node gone):
        // growing to the cap.
        for overdue in [0, 1, 3] {
            assert_eq!(
                phrasing(&terminating(-overdue, 30), how, NOW),
                Phrasing::Retry { after_seconds: 1 },
                "{overdue} s past"
            );
        }
        assert_eq!(
            phrasing(&terminating(-5, 30), how, NOW),
            Phrasing::Retry { after_seconds: 5 }
        );
        assert_eq!(
            phrasing(&terminating(-300, 30), how, NOW),
            Phrasing::Retry {
                after_seconds: a.max_retry_after
            }
        );
        // Held by finalizers alone: the fixed delay.
        let mut pvc = terminating(0, 0);
        pvc.finalizers = vec!["kubernetes.io/pvc-protection".into()];
        assert_eq!(
            phrasing(&pvc, how, NOW),
            Phrasing::Retry {
                after_seconds: a.finalizer_retry_after
            }
        );
    }

    /// A client-go caller that re-creates at once on 409 and sleeps
    /// retryAfterSeconds on 429 (each request taking 20 ms), against a holder
    /// of `grace` seconds deleted at `NOW` that is gone `gone_ms` after its
    /// deletion: the Creates it sends, the successful one included, and how
    /// long after the name was free that one came.
    fn client_go_against(grace: i64, gone_ms: i64) -> (u32, i64) {
        let mut t_ms: i64 = 0;
        let mut creates = 0;
        let mut streak = 0;
        while t_ms < gone_ms {
            creates += 1;
            streak += 1;
            // Deleted at NOW: its deadline is NOW + grace.
            let holder = terminating(grace, grace);
            match phrasing(&holder, adaptive(streak), NOW + t_ms / 1000) {
                Phrasing::Conflict => t_ms += 50,
                Phrasing::Retry { after_seconds } => t_ms += i64::from(after_seconds) * 1000 + 20,
            }
        }
        (creates + 1, t_ms - gone_ms)
    }

    #[test]
    fn a_whole_30_s_grace_costs_at_most_10_creates_and_the_relaunch_follows_within_a_second() {
        // The kubelet removes a pod it killed at the deadline 1 to 2.2 s later.
        let mut lates = Vec::new();
        for after_deadline_ms in [1000, 1200, 1400, 1600, 1800, 2000, 2200] {
            let (creates, late_ms) = client_go_against(30, 30_000 + after_deadline_ms);
            assert!(
                creates <= 10,
                "{creates} Creates (gone {after_deadline_ms} ms past the deadline)"
            );
            assert!(
                late_ms <= 1300,
                "the Create came {late_ms} ms after the name was free (gone {after_deadline_ms} ms past the deadline)"
            );
            lates.push(late_ms);
        }
        lates.sort_unstable();
        assert!(
            lates[lates.len() / 2] <= 1000,
            "median {} ms: {lates:?}",
            lates[lates.len() / 2]
        );
    }

    #[test]
    fn a_holder_whose_containers_exit_early_is_followed_within_about_two_seconds() {
        // SIGTERM ends the container at once: gone 2 to 3.5 s after the delete.
        for gone_ms in [2000, 2500, 3000, 3500] {
            let (creates, late_ms) = client_go_against(30, gone_ms);
            assert!(creates <= 5, "{creates} Creates (gone at {gone_ms} ms)");
            assert!(late_ms <= 2200, "{late_ms} ms late (gone at {gone_ms} ms)");
        }
    }
}
