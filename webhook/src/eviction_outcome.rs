//! What became of each eviction attempt.
//!
//! The eviction audit runs at admission, before the Eviction API checks the
//! pod's PodDisruptionBudgets, so it cannot know whether the pod will be
//! evicted: a refused attempt (429) looks the same there as a granted one,
//! and `kubectl drain` retries a refused one every 5 s. So admission records
//! the *attempt*, and the outcome is recorded once, later, from the pod watch:
//! `evicted` when the pod's deletion begins after the attempt (the Eviction
//! API deletes it inside the granted request, so the watch sees it at once),
//! `not_evicted` when no deletion began within [`OUTCOME_BOUND`], or when a
//! later attempt on the same pod is the one that evicted it. A pod evicted
//! once has one `evicted` record and one follow-up tag, however many attempts
//! a budget refused first.
//!
//! [`Attempts`] holds the pending attempts and decides (no I/O);
//! [`EvictionOutcomes`] feeds it from admission and the pod watch, writes
//! the records and asks for the follow-up tag.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PartialObjectMeta;
use kube::runtime::watcher::Event;

use crate::audit::AuditRecord;
use crate::follow_up::{FollowUp, Source};
use crate::metrics::{Metrics, OutcomeLabels};

/// How long after an attempt a pod's deletion may begin and still count as
/// its outcome: longer than the pod watch's worst lag behind a silent
/// connection ([`crate::meta_index::WATCH_TIMEOUT_SECS`] + 5 s).
pub const OUTCOME_BOUND: Duration = Duration::from_secs(60);

/// Attempts pending at once, over all pods; past it an attempt's outcome is
/// not tracked (its record says so) and its follow-up is asked at once.
pub const MAX_PENDING: usize = 10_000;

/// One admitted eviction request, as its admission record named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub request_uid: String,
    /// The pod's uid from the index at admission, if it had the pod.
    pub uid: Option<String>,
    pub user: String,
    pub at: Instant,
}

/// What became of an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The pod's deletion began after it.
    Evicted,
    /// No deletion began within the bound, or a later attempt evicted the pod.
    NotEvicted,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Evicted => "evicted",
            Outcome::NotEvicted => "not_evicted",
        }
    }
}

/// An attempt and what became of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub namespace: String,
    pub name: String,
    pub attempt: Attempt,
    pub outcome: Outcome,
    /// From the attempt to the outcome's being known.
    pub after: Duration,
}

/// The attempts whose outcome is not known yet, per pod (namespace, name).
#[derive(Debug, Default)]
pub struct Attempts {
    pending: HashMap<(String, String), Vec<Attempt>>,
    count: usize,
}

impl Attempts {
    /// Notes an attempt; false (nothing noted) when [`MAX_PENDING`] are pending.
    pub fn attempt(&mut self, namespace: &str, name: &str, attempt: Attempt) -> bool {
        if self.count >= MAX_PENDING {
            return false;
        }
        self.pending
            .entry((namespace.to_string(), name.to_string()))
            .or_default()
            .push(attempt);
        self.count += 1;
        true
    }

    /// The watch saw the deletion of pod `uid` under this name begin (or the
    /// pod gone) at `now`: the latest attempt on that pod is what evicted it,
    /// the earlier ones did not. Attempts on another pod of that name (an
    /// older one, replaced) stay pending.
    pub fn deletion_began(
        &mut self,
        namespace: &str,
        name: &str,
        uid: &str,
        now: Instant,
    ) -> Vec<Resolved> {
        let key = (namespace.to_string(), name.to_string());
        let Some(list) = self.pending.get_mut(&key) else {
            return Vec::new();
        };
        let (ours, others): (Vec<Attempt>, Vec<Attempt>) = list
            .drain(..)
            .partition(|a| a.uid.as_deref().is_none_or(|u| u == uid));
        *list = others;
        if list.is_empty() {
            self.pending.remove(&key);
        }
        self.count -= ours.len();
        let last = ours.len().saturating_sub(1);
        ours.into_iter()
            .enumerate()
            .map(|(i, attempt)| Resolved {
                namespace: key.0.clone(),
                name: key.1.clone(),
                outcome: if i == last {
                    Outcome::Evicted
                } else {
                    Outcome::NotEvicted
                },
                after: now.saturating_duration_since(attempt.at),
                attempt,
            })
            .collect()
    }

    /// The attempts older than `bound` at `now`: no deletion followed them.
    pub fn expire(&mut self, now: Instant, bound: Duration) -> Vec<Resolved> {
        let mut out = Vec::new();
        self.pending.retain(|(namespace, name), list| {
            list.retain(|a| {
                let after = now.saturating_duration_since(a.at);
                if after < bound {
                    return true;
                }
                out.push(Resolved {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    attempt: a.clone(),
                    outcome: Outcome::NotEvicted,
                    after,
                });
                false
            });
            !list.is_empty()
        });
        self.count -= out.len();
        out
    }

    /// Attempts pending now.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// The outcome record of `r`.
pub fn record(r: &Resolved) -> AuditRecord {
    let detail = match r.outcome {
        Outcome::Evicted => format!(
            "the pod's deletion began {:.1} s after this attempt",
            r.after.as_secs_f64()
        ),
        Outcome::NotEvicted => format!(
            "no deletion of the pod began within {} s of this attempt, or a later attempt evicted it: refused (a PodDisruptionBudget answers 429) or failed",
            OUTCOME_BOUND.as_secs()
        ),
    };
    AuditRecord {
        event: "eviction_outcome",
        endpoint: "eviction_audit",
        decision: "allow",
        reason: r.outcome.as_str().into(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        uid: r.attempt.uid.clone(),
        user: r.attempt.user.clone(),
        request_uid: r.attempt.request_uid.clone(),
        disruption_reason: (r.outcome == Outcome::Evicted).then(|| "EvictionByEvictionAPI".into()),
        latency_us: u64::try_from(r.after.as_micros()).unwrap_or(u64::MAX),
        detail: Some(detail),
        ..Default::default()
    }
}

/// Feeds [`Attempts`] from admission and the pod watch. Cheap to clone.
#[derive(Clone)]
pub struct EvictionOutcomes {
    attempts: Arc<Mutex<Attempts>>,
    follow_up: FollowUp,
    metrics: Metrics,
}

impl EvictionOutcomes {
    pub fn new(follow_up: FollowUp, metrics: Metrics) -> Self {
        // Every outcome exported from the start at 0, so `increase()` sees
        // the first one.
        for outcome in ["evicted", "not_evicted", "untracked"] {
            let _ = metrics
                .eviction_outcomes
                .get_or_create(&OutcomeLabels { outcome });
        }
        Self {
            attempts: Arc::new(Mutex::new(Attempts::default())),
            follow_up,
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Attempts> {
        self.attempts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An admitted, non-dry-run eviction of a pod not yet terminating.
    /// False when it could not be tracked ([`MAX_PENDING`]): its follow-up
    /// is then asked at once, as if it were granted.
    pub fn attempted(&self, namespace: &str, name: &str, attempt: Attempt) -> bool {
        let uid = attempt.uid.clone();
        let noted = self.lock().attempt(namespace, name, attempt);
        if !noted {
            self.metrics
                .eviction_outcomes
                .get_or_create(&OutcomeLabels {
                    outcome: "untracked",
                })
                .inc();
            self.follow_up
                .request(namespace, name, uid.as_deref(), Source::Eviction);
        }
        noted
    }

    fn resolved(&self, all: Vec<Resolved>) {
        for r in all {
            self.metrics
                .eviction_outcomes
                .get_or_create(&OutcomeLabels {
                    outcome: r.outcome.as_str(),
                })
                .inc();
            if r.outcome == Outcome::Evicted {
                self.follow_up.request(
                    &r.namespace,
                    &r.name,
                    r.attempt.uid.as_deref(),
                    Source::Eviction,
                );
            }
            record(&r).emit();
        }
    }

    /// `events` (the pod watch), resolving the attempts on each pod whose
    /// deletion the watch sees begin or finish.
    pub fn observing<E>(
        &self,
        events: impl Stream<Item = Result<Event<PartialObjectMeta<Pod>>, E>>,
    ) -> impl Stream<Item = Result<Event<PartialObjectMeta<Pod>>, E>> {
        let this = self.clone();
        events.inspect(move |ev| {
            let m = match ev {
                Ok(Event::Apply(o) | Event::InitApply(o))
                    if o.metadata.deletion_timestamp.is_some() =>
                {
                    &o.metadata
                }
                Ok(Event::Delete(o)) => &o.metadata,
                _ => return,
            };
            let (Some(namespace), Some(name)) = (m.namespace.as_deref(), m.name.as_deref()) else {
                return;
            };
            let uid = m.uid.as_deref().unwrap_or("");
            let all = {
                let mut attempts = this.lock();
                if attempts.is_empty() {
                    return;
                }
                attempts.deletion_began(namespace, name, uid, Instant::now())
            };
            this.resolved(all);
        })
    }

    /// Every second, records the attempts no deletion followed within
    /// [`OUTCOME_BOUND`].
    pub fn spawn_sweeper(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let all = this.lock().expire(Instant::now(), OUTCOME_BOUND);
                this.resolved(all);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(uid: Option<&str>, request: &str, at: Instant) -> Attempt {
        Attempt {
            request_uid: request.into(),
            uid: uid.map(str::to_string),
            user: "system:serviceaccount:kube-system:drain".into(),
            at,
        }
    }

    #[test]
    fn refused_attempts_then_one_granted_give_one_evicted_outcome() {
        let t0 = Instant::now();
        let mut a = Attempts::default();
        for (i, s) in [0u64, 5, 10].iter().enumerate() {
            assert!(a.attempt(
                "ns",
                "p",
                attempt(Some("u1"), &format!("r{i}"), t0 + Duration::from_secs(*s))
            ));
        }
        // The first one is a minute old before the pod goes: refused.
        let expired = a.expire(t0 + Duration::from_secs(61), OUTCOME_BOUND);
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].attempt.request_uid, "r0");
        assert_eq!(expired[0].outcome, Outcome::NotEvicted);
        let out = a.deletion_began("ns", "p", "u1", t0 + Duration::from_secs(62));
        let got: Vec<_> = out
            .iter()
            .map(|r| (r.attempt.request_uid.as_str(), r.outcome))
            .collect();
        assert_eq!(got, [("r1", Outcome::NotEvicted), ("r2", Outcome::Evicted)]);
        assert_eq!(out[1].after, Duration::from_secs(52));
        assert!(a.is_empty());
        // The watch sees the same deletion again (each later update): nothing more.
        assert!(a
            .deletion_began("ns", "p", "u1", t0 + Duration::from_secs(63))
            .is_empty());
    }

    #[test]
    fn a_replaced_pod_s_deletion_is_not_an_older_attempt_s_outcome() {
        let t0 = Instant::now();
        let mut a = Attempts::default();
        a.attempt("ns", "p", attempt(Some("old"), "r0", t0));
        a.attempt("ns", "p", attempt(None, "r1", t0));
        let out = a.deletion_began("ns", "p", "new", t0);
        // The attempt on an unknown uid counts for whatever pod goes.
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].attempt.request_uid, "r1");
        assert_eq!(a.len(), 1);
        let later = a.expire(t0 + OUTCOME_BOUND, OUTCOME_BOUND);
        assert_eq!(later[0].attempt.request_uid, "r0");
        assert_eq!(later[0].outcome, Outcome::NotEvicted);
        assert!(a.is_empty());
    }

    #[test]
    fn past_the_cap_nothing_is_noted() {
        let t0 = Instant::now();
        let mut a = Attempts::default();
        for i in 0..MAX_PENDING {
            assert!(a.attempt("ns", &format!("p{i}"), attempt(None, "r", t0)));
        }
        assert!(!a.attempt("ns", "one-more", attempt(None, "r", t0)));
        assert_eq!(a.len(), MAX_PENDING);
        assert_eq!(
            a.expire(t0 + OUTCOME_BOUND, OUTCOME_BOUND).len(),
            MAX_PENDING
        );
        assert!(a.is_empty());
    }

    #[test]
    fn the_outcome_record_names_the_attempt() {
        let t0 = Instant::now();
        let r = Resolved {
            namespace: "ns".into(),
            name: "p".into(),
            attempt: attempt(Some("u1"), "req-1", t0),
            outcome: Outcome::Evicted,
            after: Duration::from_millis(120),
        };
        let rec = serde_json::to_value(record(&r)).expect("json");
        assert_eq!(rec["event"], "eviction_outcome");
        assert_eq!(rec["reason"], "evicted");
        assert_eq!(rec["request_uid"], "req-1");
        assert_eq!(rec["uid"], "u1");
        assert_eq!(rec["disruption_reason"], "EvictionByEvictionAPI");
    }
}
