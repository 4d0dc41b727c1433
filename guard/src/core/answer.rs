//! How an API call's answer becomes the reconciler's input: which wait each
//! kind of refusal gets, and how the namespace's shared quota backoff
//! ([`crate::core::backoff`]) and the task's own transient backoff advance. Pure:
//! the clock is passed in, so every wait is unit-tested.

use std::time::{Duration, Instant};

use backon::ExponentialBackoff;

use crate::core::backoff::{at_least, BackoffPolicy, NamespaceBackoffs};
use crate::core::classify::CreateRefusal;
use crate::core::reconcile::{Existing, Input, HOLDER_RECHECK_MS};
use crate::core::task::TaskKey;

/// What an API call answered, for the task that asked.
#[derive(Debug)]
pub enum AnswerKind {
    Created(String),
    Refused {
        refusal: CreateRefusal,
        retry_after: Option<Duration>,
    },
    Unknown,
    Read(Option<Existing>),
    ReadFailed,
    DeleteFailed,
    /// Not sent: the namespace waits for quota and another task's Create is
    /// the window's probe ([`crate::core::backoff::NamespaceBackoffs::probe`]);
    /// ask again at this instant.
    Held(Instant),
    /// The result finalizer of pod `uid` was let go of (or not).
    Released {
        uid: String,
        outcome: Released,
    },
    /// Whether the task's namespace is being deleted (`None`: not known).
    Namespace(Option<bool>),
    /// Look at the task's result finalizers again (after a failed release).
    Recheck,
}

/// What letting go of a pod's result finalizer came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// Written, or nothing to write (gone, or no longer holding it).
    Done,
    /// The pod changed since it was seen: its next version is decided again.
    Changed,
    /// The API server could not be asked.
    Failed,
}

/// A task's backoff for what may pass by itself (429, 5xx, failed reads and
/// deletes): its own, reset once a Create lands.
pub struct TransientBackoff {
    policy: BackoffPolicy,
    delays: ExponentialBackoff,
}

impl TransientBackoff {
    pub fn new(policy: BackoffPolicy) -> Self {
        Self {
            policy,
            delays: policy.build(),
        }
    }

    /// The next wait: doubling, jittered, at most the policy's `max`.
    pub fn next_wait(&mut self) -> Duration {
        self.delays.next().unwrap_or(self.policy.max)
    }

    /// Back to the shortest wait.
    pub fn reset(&mut self) {
        self.delays = self.policy.build();
    }
}

/// The moment an answer is read, on the loop's clock: in milliseconds (the
/// reconciler's deadlines) and as an instant (the shared backoffs).
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub ms: i64,
    pub instant: Instant,
}

impl Now {
    /// `wait` from now, in the reconciler's milliseconds.
    fn after(&self, wait: Duration) -> i64 {
        self.ms
            .saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX))
    }
}

/// `kind`, answering a call made for task `key`, as the reconciler's input,
/// with the backoffs advanced as it says. `None` for answers that are not
/// about the task's pod (finalizer releases, namespaces, rechecks).
///
/// The waits: a quota refusal waits for the namespace's window (one backoff
/// shared by every task there, [`NamespaceBackoffs`]); a holder still
/// terminating waits the webhook's Retry-After (or
/// [`HOLDER_RECHECK_MS`]) and spends nothing; anything else that may pass
/// waits the task's transient backoff, never less than a Retry-After.
pub fn input(
    kind: AnswerKind,
    key: &TaskKey,
    transient: &mut TransientBackoff,
    backoffs: &NamespaceBackoffs,
    now: Now,
) -> Option<Input> {
    let (namespace, task) = (key.namespace.as_str(), key.task.as_str());
    Some(match kind {
        AnswerKind::Created(uid) => {
            backoffs.created(namespace, task, now.instant);
            transient.reset();
            Input::Created { uid }
        }
        AnswerKind::Refused {
            refusal,
            retry_after,
        } => {
            let wait = match refusal {
                CreateRefusal::QuotaFull => backoffs
                    .refused(namespace, task, now.instant)
                    .saturating_duration_since(now.instant),
                CreateRefusal::HolderTerminating => {
                    backoffs.settled(namespace, task);
                    retry_after.unwrap_or(Duration::from_millis(HOLDER_RECHECK_MS.unsigned_abs()))
                }
                _ => {
                    backoffs.settled(namespace, task);
                    at_least(transient.next_wait(), retry_after)
                }
            };
            Input::Refused {
                refusal,
                retry_at_ms: now.after(wait),
            }
        }
        AnswerKind::Held(until) => Input::Refused {
            refusal: CreateRefusal::QuotaFull,
            retry_at_ms: now.after(until.saturating_duration_since(now.instant)),
        },
        AnswerKind::Unknown => {
            backoffs.settled(namespace, task);
            Input::CreateUnknown
        }
        AnswerKind::Read(found) => Input::Read(found),
        AnswerKind::ReadFailed => Input::ReadFailed {
            retry_at_ms: now.after(transient.next_wait()),
        },
        AnswerKind::DeleteFailed => Input::DeleteFailed {
            retry_at_ms: now.after(transient.next_wait()),
        },
        AnswerKind::Released { .. } | AnswerKind::Namespace(_) | AnswerKind::Recheck => {
            return None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::backoff::Probe;

    fn policy(min_ms: u64, max_ms: u64) -> BackoffPolicy {
        BackoffPolicy {
            min: Duration::from_millis(min_ms),
            max: Duration::from_millis(max_ms),
            seed: Some(7),
        }
    }

    fn at(t0: Instant, ms: u64) -> Now {
        Now {
            ms: 1_000_000 + i64::try_from(ms).unwrap_or(i64::MAX),
            instant: t0 + Duration::from_millis(ms),
        }
    }

    fn retry_at(input: Option<Input>) -> i64 {
        match input {
            Some(Input::Refused { retry_at_ms, .. })
            | Some(Input::ReadFailed { retry_at_ms })
            | Some(Input::DeleteFailed { retry_at_ms }) => retry_at_ms,
            other => panic!("not a wait: {other:?}"),
        }
    }

    fn refused(refusal: CreateRefusal, retry_after: Option<u64>) -> AnswerKind {
        AnswerKind::Refused {
            refusal,
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    #[test]
    fn a_quota_refusal_waits_for_the_namespace_window_and_spends_no_transient_retry() {
        let t0 = tokio::time::Instant::now().into_std();
        let backoffs = NamespaceBackoffs::new(policy(1_000, 60_000));
        let mut transient = TransientBackoff::new(policy(200, 10_000));
        let key = TaskKey::new("ns", "a");
        let first = retry_at(input(
            refused(CreateRefusal::QuotaFull, None),
            &key,
            &mut transient,
            &backoffs,
            at(t0, 0),
        ));
        // 1 s, jittered up to twice its base, plus the task's own offset
        // (up to a second).
        assert!((1_001_000..=1_003_000).contains(&first), "{first}");
        // Another task of the namespace now waits for the same window: its
        // Create is held, not sent.
        assert!(matches!(
            backoffs.probe("ns", "b", t0 + Duration::from_millis(10)),
            Probe::WaitUntil(_)
        ));
        // The transient backoff was not touched: its first wait is still
        // the shortest.
        let read_failed = retry_at(input(
            AnswerKind::ReadFailed,
            &key,
            &mut transient,
            &backoffs,
            at(t0, 0),
        ));
        assert!(
            (1_000_200..=1_000_400).contains(&read_failed),
            "{read_failed}"
        );
    }

    #[test]
    fn transient_waits_double_honour_retry_after_and_reset_on_a_create() {
        let t0 = tokio::time::Instant::now().into_std();
        let backoffs = NamespaceBackoffs::new(policy(1_000, 60_000));
        let mut transient = TransientBackoff::new(policy(200, 10_000));
        let key = TaskKey::new("ns", "a");
        let mut waits = Vec::new();
        for _ in 0..4 {
            let at_ms = retry_at(input(
                refused(CreateRefusal::Transient, None),
                &key,
                &mut transient,
                &backoffs,
                at(t0, 0),
            ));
            waits.push(at_ms - 1_000_000);
        }
        // 200, 400, 800, 1600 ms, each jittered up to twice its base.
        for (w, base) in waits.iter().zip([200, 400, 800, 1_600]) {
            assert!((base..=2 * base).contains(w), "{waits:?}");
        }
        // A server's Retry-After is a floor.
        let floor = retry_at(input(
            refused(CreateRefusal::Transient, Some(30)),
            &key,
            &mut transient,
            &backoffs,
            at(t0, 0),
        ));
        assert_eq!(floor, 1_030_000);
        // A Create that lands starts the backoff over.
        let created = input(
            AnswerKind::Created("u".into()),
            &key,
            &mut transient,
            &backoffs,
            at(t0, 0),
        );
        assert!(matches!(created, Some(Input::Created { .. })));
        let after = retry_at(input(
            AnswerKind::DeleteFailed,
            &key,
            &mut transient,
            &backoffs,
            at(t0, 0),
        ));
        assert!((1_000_200..=1_000_400).contains(&after), "{after}");
    }

    #[test]
    fn a_terminating_holder_waits_its_retry_after_and_spends_nothing() {
        let t0 = tokio::time::Instant::now().into_std();
        let backoffs = NamespaceBackoffs::new(policy(1_000, 60_000));
        let mut transient = TransientBackoff::new(policy(200, 10_000));
        let key = TaskKey::new("ns", "a");
        let told = retry_at(input(
            refused(CreateRefusal::HolderTerminating, Some(3)),
            &key,
            &mut transient,
            &backoffs,
            at(t0, 0),
        ));
        assert_eq!(told, 1_003_000);
        let untold = retry_at(input(
            refused(CreateRefusal::HolderTerminating, None),
            &key,
            &mut transient,
            &backoffs,
            at(t0, 0),
        ));
        assert_eq!(untold, 1_000_000 + HOLDER_RECHECK_MS);
        // Nothing spent: the transient backoff's next wait is its first.
        let next = retry_at(input(
            AnswerKind::ReadFailed,
            &key,
            &mut transient,
            &backoffs,
            at(t0, 0),
        ));
        assert!((1_000_200..=1_000_400).contains(&next), "{next}");
    }

    #[test]
    fn a_held_create_waits_until_the_probe_s_window_and_answers_about_releases_are_no_input() {
        let t0 = tokio::time::Instant::now().into_std();
        let backoffs = NamespaceBackoffs::new(policy(1_000, 60_000));
        let mut transient = TransientBackoff::new(policy(200, 10_000));
        let key = TaskKey::new("ns", "a");
        let held = retry_at(input(
            AnswerKind::Held(t0 + Duration::from_millis(2_500)),
            &key,
            &mut transient,
            &backoffs,
            at(t0, 500),
        ));
        assert_eq!(held, 1_000_000 + 2_500);
        for kind in [
            AnswerKind::Recheck,
            AnswerKind::Namespace(Some(true)),
            AnswerKind::Released {
                uid: "u".into(),
                outcome: Released::Done,
            },
        ] {
            assert!(input(kind, &key, &mut transient, &backoffs, at(t0, 0)).is_none());
        }
    }
}
