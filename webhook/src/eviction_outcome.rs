//! What became of each eviction attempt, from the pod's own evidence.
//!
//! The eviction audit runs at admission, before the Eviction API checks the
//! pod's PodDisruptionBudgets, so it cannot know whether the pod will be
//! evicted: a refused attempt (429) looks the same there as a granted one,
//! and `kubectl drain` retries a refused one every 5 s. So admission records
//! the *attempt*, and its outcome is recorded once, later, from what the pod
//! itself shows, never from timing alone:
//!
//! * when the pod watch sees a pod with pending attempts begin its deletion,
//!   graceguard reads the pod. A granted eviction writes `DisruptionTarget`
//!   with reason `EvictionByEvictionAPI` before it deletes: then the latest
//!   attempt at or before that condition's time (the API server's clock) is
//!   `evicted` and the earlier ones `not_evicted` (refused, a later one
//!   evicted the pod). A deletion with another reason, or none (a plain
//!   DELETE, a preemption), makes every attempt `not_evicted`, its record
//!   naming what deleted the pod;
//! * an attempt [`OUTCOME_BOUND`] old is settled by reading the pod too: still
//!   running is `not_evicted`; deleting is decided as above (the watch may
//!   have missed the deletion in a gap);
//! * a pod gone before it could be read (a pod that had not started is
//!   deleted at once), or replaced by another under its name, is `unverified`:
//!   the record says so, and the API server's audit log holds the eviction's
//!   answer for the same request uid;
//! * attempts pending when graceguard stops are recorded `dropped`. They live
//!   in one replica's memory: a replica killed without its shutdown loses
//!   them unrecorded (the admission record of each attempt stays).
//!
//! A pod evicted once has one `evicted` record and one follow-up tag, however
//! many attempts a budget refused first.
//!
//! [`Attempts`] holds the pending attempts and decides from [`Evidence`] (no
//! I/O); [`EvictionOutcomes`] feeds it from admission and the pod watch,
//! reads the pods, writes the records and asks for the follow-up tag.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod as K8sPod;
use kube::api::PartialObjectMeta;
use kube::runtime::watcher::Event;
use kube::{Api, Client};

use crate::audit::AuditRecord;
use crate::disruption::{self, Disruption};
use crate::follow_up::{FollowUp, Source};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Eviction attempts by what became of them.
#[derive(Clone, Default)]
pub struct OutcomeMetrics {
    pub outcomes: Family<OutcomeLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

impl OutcomeMetrics {
    /// The series, registered, every outcome at 0 from the start so
    /// `increase()` sees the first one.
    pub fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        for outcome in Outcome::ALL.iter().map(|o| o.as_str()).chain(["untracked"]) {
            let _ = m.outcomes.get_or_create(&OutcomeLabels { outcome });
        }
        r.register(
            "eviction_outcomes",
            "Eviction attempts by what became of them: evicted (the pod's deletion began), not_evicted (refused or failed), untracked (too many pending)",
            m.outcomes.clone(),
        );
        m
    }

    fn count(&self, outcome: &'static str) {
        self.outcomes
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }
}

/// How long an attempt waits for its pod's deletion before graceguard reads
/// the pod to settle it: longer than the pod watch's worst lag behind a
/// silent connection ([`crate::meta_index::WATCH_TIMEOUT_SECS`] + 5 s).
pub const OUTCOME_BOUND: Duration = Duration::from_secs(60);

/// Attempts pending at once, over all pods; past it an attempt's outcome is
/// not tracked (counted `untracked`) and its follow-up is asked at once.
pub const MAX_PENDING: usize = 10_000;

/// The `DisruptionTarget` reason a granted eviction writes.
pub const EVICTION_REASON: &str = "EvictionByEvictionAPI";

/// Reads of pods at once (each a GET, off every admission path).
const READS_AT_ONCE: usize = 4;

/// How long one read of a pod may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// One admitted eviction request, as its admission record named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub request_uid: String,
    /// The pod's uid from the index at admission, if it had the pod.
    pub uid: Option<String>,
    pub user: String,
    pub at: Instant,
    /// The wall clock at admission, to compare with the condition's time.
    pub wall: SystemTime,
}

/// What became of an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The pod shows this attempt's eviction (`EvictionByEvictionAPI`).
    Evicted,
    /// The pod still ran after [`OUTCOME_BOUND`], another attempt evicted it,
    /// or something else deleted it.
    NotEvicted,
    /// The pod was gone or replaced before graceguard could read it.
    Unverified,
    /// graceguard stopped first.
    Dropped,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [
        Outcome::Evicted,
        Outcome::NotEvicted,
        Outcome::Unverified,
        Outcome::Dropped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Evicted => "evicted",
            Outcome::NotEvicted => "not_evicted",
            Outcome::Unverified => "unverified",
            Outcome::Dropped => "dropped",
        }
    }
}

/// What a read of the pod showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// Pod `uid`, its deletion begun, with its `DisruptionTarget` if any.
    Deleting {
        uid: String,
        disruption: Option<Disruption>,
    },
    /// Pod `uid`, no deletion begun.
    Running { uid: String },
    /// No pod of that name.
    Gone,
    /// The read failed (why).
    Unreadable(String),
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
    /// What showed it, for the record.
    pub why: String,
}

type Key = (String, String);

/// The attempts whose outcome is not known yet, per pod (namespace, name).
#[derive(Debug, Default)]
pub struct Attempts {
    pending: HashMap<Key, Vec<Attempt>>,
    /// Pods being read: one read at a time per pod.
    reading: HashSet<Key>,
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
    /// pod gone): true when attempts may be about that pod and no read of it
    /// is under way. The pod is then marked as being read: the caller reads
    /// it and calls [`Attempts::settle`].
    pub fn deletion_seen(&mut self, namespace: &str, name: &str, uid: &str) -> bool {
        let key = (namespace.to_string(), name.to_string());
        let about_it = self.pending.get(&key).is_some_and(|list| {
            list.iter()
                .any(|a| a.uid.as_deref().is_none_or(|u| u == uid))
        });
        about_it && self.reading.insert(key)
    }

    /// The pods with an attempt at least `bound` old at `now` and no read
    /// under way, each marked as being read: the caller reads each and calls
    /// [`Attempts::settle`].
    pub fn due(&mut self, now: Instant, bound: Duration) -> Vec<(String, String)> {
        let due: Vec<Key> = self
            .pending
            .iter()
            .filter(|(key, list)| {
                !self.reading.contains(*key)
                    && list
                        .iter()
                        .any(|a| now.saturating_duration_since(a.at) >= bound)
            })
            .map(|(key, _)| key.clone())
            .collect();
        self.reading.extend(due.iter().cloned());
        due
    }

    /// Settles the attempts on pod `namespace/name` from what a read of it
    /// at `now` showed; an attempt younger than `bound` that the evidence
    /// does not decide stays pending.
    pub fn settle(
        &mut self,
        namespace: &str,
        name: &str,
        evidence: &Evidence,
        now: Instant,
        bound: Duration,
    ) -> Vec<Resolved> {
        let key = (namespace.to_string(), name.to_string());
        self.reading.remove(&key);
        let Some(list) = self.pending.remove(&key) else {
            return Vec::new();
        };
        let mut keep = Vec::new();
        let mut out = Vec::new();
        for (attempt, decided) in decide(list, evidence, now, bound) {
            match decided {
                None => keep.push(attempt),
                Some((outcome, why)) => out.push(Resolved {
                    namespace: key.0.clone(),
                    name: key.1.clone(),
                    after: now.saturating_duration_since(attempt.at),
                    attempt,
                    outcome,
                    why,
                }),
            }
        }
        self.count -= out.len();
        if !keep.is_empty() {
            self.pending.insert(key, keep);
        }
        out
    }

    /// Every pending attempt, `dropped` (graceguard is stopping).
    pub fn drain(&mut self, now: Instant) -> Vec<Resolved> {
        self.reading.clear();
        self.count = 0;
        self.pending
            .drain()
            .flat_map(|((namespace, name), list)| {
                list.into_iter().map(move |attempt| Resolved {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    after: now.saturating_duration_since(attempt.at),
                    attempt,
                    outcome: Outcome::Dropped,
                    why: "graceguard stopped before this attempt's outcome was known: the API server's audit log has the eviction's answer for this request uid".into(),
                })
            })
            .collect()
    }

    /// Attempts pending now.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// What `evidence` says of each attempt on one pod (in the order noted):
/// an outcome and why, or `None` to keep waiting.
fn decide(
    attempts: Vec<Attempt>,
    evidence: &Evidence,
    now: Instant,
    bound: Duration,
) -> Vec<(Attempt, Option<(Outcome, String)>)> {
    let old = |a: &Attempt| now.saturating_duration_since(a.at) >= bound;
    let replaced = |a: &Attempt, uid: &str| a.uid.as_deref().is_some_and(|u| u != uid);
    let replaced_why = |uid: &str| {
        (
            Outcome::Unverified,
            format!("the pod it named was replaced by another of the same name (uid {uid}) before graceguard could read it: the API server's audit log has the eviction's answer for this request uid"),
        )
    };
    match evidence {
        Evidence::Gone => attempts
            .into_iter()
            .map(|a| {
                (a, Some((Outcome::Unverified, "the pod was gone before graceguard could read it (a pod not yet started is deleted at once): the API server's audit log has the eviction's answer for this request uid".to_string())))
            })
            .collect(),
        Evidence::Unreadable(why) => attempts
            .into_iter()
            .map(|a| {
                let decided = old(&a).then(|| {
                    (
                        Outcome::Unverified,
                        format!("the pod could not be read: {why}"),
                    )
                });
                (a, decided)
            })
            .collect(),
        Evidence::Running { uid } => attempts
            .into_iter()
            .map(|a| {
                let decided = if replaced(&a, uid) {
                    Some(replaced_why(uid))
                } else {
                    old(&a).then(|| {
                        (
                            Outcome::NotEvicted,
                            format!(
                                "the pod still ran {} s after this attempt: refused (a PodDisruptionBudget answers 429) or failed",
                                now.saturating_duration_since(a.at).as_secs()
                            ),
                        )
                    })
                };
                (a, decided)
            })
            .collect(),
        Evidence::Deleting { uid, disruption } => {
            let evicted_at = disruption
                .as_ref()
                .filter(|d| d.reason == EVICTION_REASON)
                .map(|d| parse_time(&d.time));
            // The attempt the eviction answered: the latest one at or before
            // the condition's time (whole seconds, the API server's clock;
            // the latest of all when the clocks disagree).
            let ours: Vec<usize> = attempts
                .iter()
                .enumerate()
                .filter(|(_, a)| !replaced(a, uid))
                .map(|(i, _)| i)
                .collect();
            let granted = evicted_at.and_then(|at| {
                let by_time = at.and_then(|t| {
                    let t = t + Duration::from_secs(1);
                    ours.iter().rev().copied().find(|&i| attempts[i].wall <= t)
                });
                by_time.or_else(|| ours.last().copied())
            });
            let granted_request = granted.map(|i| attempts[i].request_uid.clone());
            let time = disruption.as_ref().map(|d| d.time.as_str()).unwrap_or("");
            let elsewhere = match disruption {
                Some(d) if d.reason != EVICTION_REASON => format!(
                    "the pod's deletion came from elsewhere: its DisruptionTarget says {}",
                    d.reason
                ),
                _ => "the pod's deletion came from elsewhere: it carries no DisruptionTarget (a DELETE: see the deletion audit's record)".into(),
            };
            attempts
                .into_iter()
                .enumerate()
                .map(|(i, a)| {
                    let decided = if replaced(&a, uid) {
                        replaced_why(uid)
                    } else if Some(i) == granted {
                        (
                            Outcome::Evicted,
                            format!("the pod's DisruptionTarget says {EVICTION_REASON} at {time}, and its deletion began"),
                        )
                    } else if let Some(request) = &granted_request {
                        (
                            Outcome::NotEvicted,
                            format!("refused (a PodDisruptionBudget answers 429) or failed: request {request} evicted the pod"),
                        )
                    } else {
                        (Outcome::NotEvicted, elsewhere.clone())
                    };
                    (a, Some(decided))
                })
                .collect()
        }
    }
}

/// A condition's `lastTransitionTime` (RFC 3339) as a wall-clock time.
fn parse_time(s: &str) -> Option<SystemTime> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(SystemTime::from)
}

/// What `pod` shows about an eviction.
pub fn evidence_of(pod: &K8sPod) -> Evidence {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_none() {
        return Evidence::Running { uid };
    }
    Evidence::Deleting {
        uid,
        disruption: crate::review::lean(pod)
            .as_ref()
            .and_then(disruption::of_pod),
    }
}

/// The outcome record of `r`.
pub fn record(r: &Resolved) -> AuditRecord {
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
        disruption_reason: (r.outcome == Outcome::Evicted).then(|| EVICTION_REASON.into()),
        latency_us: u64::try_from(r.after.as_micros()).unwrap_or(u64::MAX),
        detail: Some(r.why.clone()),
        ..Default::default()
    }
}

/// Feeds [`Attempts`] from admission and the pod watch, and reads pods to
/// settle them. Cheap to clone.
#[derive(Clone)]
pub struct EvictionOutcomes {
    attempts: Arc<Mutex<Attempts>>,
    /// Reads pods; none in tests that never settle by evidence.
    client: Option<Client>,
    reads: Arc<tokio::sync::Semaphore>,
    follow_up: FollowUp,
    metrics: OutcomeMetrics,
}

impl EvictionOutcomes {
    /// `client` reads the pods whose attempts are to be settled (RBAC `get`
    /// on pods); without one every read is unreadable.
    pub fn new(client: Option<Client>, follow_up: FollowUp, metrics: OutcomeMetrics) -> Self {
        Self {
            attempts: Arc::new(Mutex::new(Attempts::default())),
            client,
            reads: Arc::new(tokio::sync::Semaphore::new(READS_AT_ONCE)),
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
            self.metrics.count("untracked");
            self.follow_up
                .request(namespace, name, uid.as_deref(), Source::Eviction);
        }
        noted
    }

    fn resolved(&self, all: Vec<Resolved>) {
        for r in all {
            self.metrics.count(r.outcome.as_str());
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

    /// Reads pod `namespace/name` (marked as being read) off the caller's
    /// path and settles its attempts.
    fn read_and_settle(&self, namespace: String, name: String) {
        let this = self.clone();
        tokio::spawn(async move {
            let evidence = match Arc::clone(&this.reads).acquire_owned().await {
                Ok(_slot) => read(this.client.as_ref(), &namespace, &name).await,
                Err(_) => Evidence::Unreadable("graceguard is stopping".into()),
            };
            let all =
                this.lock()
                    .settle(&namespace, &name, &evidence, Instant::now(), OUTCOME_BOUND);
            this.resolved(all);
        });
    }

    /// `events` (the pod watch), settling the attempts on each pod whose
    /// deletion the watch sees begin or finish.
    pub fn observing<E>(
        &self,
        events: impl Stream<Item = Result<Event<PartialObjectMeta<K8sPod>>, E>>,
    ) -> impl Stream<Item = Result<Event<PartialObjectMeta<K8sPod>>, E>> {
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
            let read = {
                let mut attempts = this.lock();
                !attempts.is_empty() && attempts.deletion_seen(namespace, name, uid)
            };
            if read {
                this.read_and_settle(namespace.to_string(), name.to_string());
            }
        })
    }

    /// Every second, reads the pods whose attempts no deletion followed
    /// within [`OUTCOME_BOUND`], to settle them.
    pub fn spawn_sweeper(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let due = this.lock().due(Instant::now(), OUTCOME_BOUND);
                for (namespace, name) in due {
                    this.read_and_settle(namespace, name);
                }
            }
        })
    }

    /// graceguard is stopping: records every pending attempt as `dropped`.
    /// Returns how many.
    pub fn stop(&self) -> usize {
        let all = self.lock().drain(Instant::now());
        let n = all.len();
        self.resolved(all);
        n
    }
}

/// One read of pod `namespace/name`.
async fn read(client: Option<&Client>, namespace: &str, name: &str) -> Evidence {
    let Some(client) = client else {
        return Evidence::Unreadable("graceguard has no API client here".into());
    };
    let api: Api<K8sPod> = Api::namespaced(client.clone(), namespace);
    match tokio::time::timeout(READ_TIMEOUT, api.get_opt(name)).await {
        Err(_) => Evidence::Unreadable(format!(
            "no answer within {READ_TIMEOUT:?} (the API server is slow or unreachable)"
        )),
        Ok(Err(e)) => Evidence::Unreadable(format!(
            "{e} (graceguard needs RBAC get on pods: the chart's ClusterRole grants it)"
        )),
        Ok(Ok(None)) => Evidence::Gone,
        Ok(Ok(Some(pod))) => evidence_of(&pod),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: &str = "2026-12-05T10:00:00Z";

    fn wall(offset: u64) -> SystemTime {
        parse_time(T0).expect("time") + Duration::from_secs(offset)
    }

    fn attempt(uid: Option<&str>, request: &str, at: Instant, offset: u64) -> Attempt {
        Attempt {
            request_uid: request.into(),
            uid: uid.map(str::to_string),
            user: "system:serviceaccount:kube-system:drain".into(),
            at,
            wall: wall(offset),
        }
    }

    fn deleting(uid: &str, reason: Option<&str>, offset: u64) -> Evidence {
        Evidence::Deleting {
            uid: uid.into(),
            disruption: reason.map(|r| Disruption {
                reason: r.into(),
                message: String::new(),
                time: time::OffsetDateTime::from(wall(offset))
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default(),
            }),
        }
    }

    fn got(out: &[Resolved]) -> Vec<(&str, Outcome)> {
        out.iter()
            .map(|r| (r.attempt.request_uid.as_str(), r.outcome))
            .collect()
    }

    #[test]
    fn refused_attempts_then_one_granted_give_one_evicted_outcome() {
        let t0 = Instant::now();
        let mut a = Attempts::default();
        for (i, s) in [0u64, 5, 10].iter().enumerate() {
            let at = t0 + Duration::from_secs(*s);
            assert!(a.attempt("ns", "p", attempt(Some("u1"), &format!("r{i}"), at, *s)));
        }
        assert!(a.deletion_seen("ns", "p", "u1"));
        // One read at a time per pod: the next watch event reads nothing.
        assert!(!a.deletion_seen("ns", "p", "u1"));
        let now = t0 + Duration::from_secs(11);
        let out = a.settle(
            "ns",
            "p",
            &deleting("u1", Some(EVICTION_REASON), 10),
            now,
            OUTCOME_BOUND,
        );
        assert_eq!(
            got(&out),
            [
                ("r0", Outcome::NotEvicted),
                ("r1", Outcome::NotEvicted),
                ("r2", Outcome::Evicted)
            ]
        );
        assert!(
            out[0].why.contains("request r2 evicted the pod"),
            "{}",
            out[0].why
        );
        assert!(a.is_empty());
        assert!(!a.deletion_seen("ns", "p", "u1"));
    }

    #[test]
    fn the_attempt_credited_is_the_one_before_the_condition_not_the_latest() {
        // A second evictor's attempt arrives after the eviction was granted
        // (the pod not yet terminating in graceguard's index).
        let t0 = Instant::now();
        let mut a = Attempts::default();
        a.attempt("ns", "p", attempt(Some("u1"), "granted", t0, 0));
        a.attempt(
            "ns",
            "p",
            attempt(Some("u1"), "late", t0 + Duration::from_secs(3), 3),
        );
        assert!(a.deletion_seen("ns", "p", "u1"));
        let out = a.settle(
            "ns",
            "p",
            &deleting("u1", Some(EVICTION_REASON), 0),
            t0,
            OUTCOME_BOUND,
        );
        assert_eq!(
            got(&out),
            [("granted", Outcome::Evicted), ("late", Outcome::NotEvicted)]
        );
    }

    #[test]
    fn a_deletion_that_is_no_eviction_is_never_credited_to_an_attempt() {
        // Before: any deletion within 60 s of an attempt counted as its eviction.
        let t0 = Instant::now();
        let mut a = Attempts::default();
        a.attempt("ns", "p", attempt(Some("u1"), "r0", t0, 0));
        a.attempt("ns", "q", attempt(Some("u2"), "r1", t0, 0));
        assert!(a.deletion_seen("ns", "p", "u1"));
        let out = a.settle("ns", "p", &deleting("u1", None, 2), t0, OUTCOME_BOUND);
        assert_eq!(got(&out), [("r0", Outcome::NotEvicted)]);
        assert!(out[0].why.contains("no DisruptionTarget"), "{}", out[0].why);
        assert!(a.deletion_seen("ns", "q", "u2"));
        let out = a.settle(
            "ns",
            "q",
            &deleting("u2", Some("PreemptionByScheduler"), 2),
            t0,
            OUTCOME_BOUND,
        );
        assert_eq!(got(&out), [("r1", Outcome::NotEvicted)]);
        assert!(
            out[0].why.contains("PreemptionByScheduler"),
            "{}",
            out[0].why
        );
    }

    #[test]
    fn an_attempt_due_is_settled_by_reading_the_pod() {
        let t0 = Instant::now();
        let mut a = Attempts::default();
        a.attempt("ns", "p", attempt(Some("u1"), "old", t0, 0));
        a.attempt(
            "ns",
            "p",
            attempt(Some("u1"), "young", t0 + Duration::from_secs(30), 30),
        );
        assert!(a
            .due(t0 + Duration::from_secs(59), OUTCOME_BOUND)
            .is_empty());
        let now = t0 + OUTCOME_BOUND;
        assert_eq!(
            a.due(now, OUTCOME_BOUND),
            [("ns".to_string(), "p".to_string())]
        );
        // Marked as being read: not due twice.
        assert!(a.due(now, OUTCOME_BOUND).is_empty());
        // Still running: the old attempt was refused; the young one waits.
        let out = a.settle(
            "ns",
            "p",
            &Evidence::Running { uid: "u1".into() },
            now,
            OUTCOME_BOUND,
        );
        assert_eq!(got(&out), [("old", Outcome::NotEvicted)]);
        assert_eq!(a.len(), 1);
        // The watch missed the deletion (a gap): the read finds it evicted.
        let later = t0 + Duration::from_secs(90);
        assert_eq!(a.due(later, OUTCOME_BOUND).len(), 1);
        let out = a.settle(
            "ns",
            "p",
            &deleting("u1", Some(EVICTION_REASON), 31),
            later,
            OUTCOME_BOUND,
        );
        assert_eq!(got(&out), [("young", Outcome::Evicted)]);
        assert!(a.is_empty());
    }

    #[test]
    fn a_pod_gone_or_replaced_before_its_read_is_unverified() {
        let t0 = Instant::now();
        let mut a = Attempts::default();
        a.attempt("ns", "p", attempt(Some("old"), "r0", t0, 0));
        a.attempt("ns", "p", attempt(None, "r1", t0, 0));
        // The watch sees another pod of that name deleted: r1 may be about it.
        assert!(a.deletion_seen("ns", "p", "new"));
        let out = a.settle(
            "ns",
            "p",
            &deleting("new", Some(EVICTION_REASON), 0),
            t0,
            OUTCOME_BOUND,
        );
        assert_eq!(
            got(&out),
            [("r0", Outcome::Unverified), ("r1", Outcome::Evicted)]
        );
        a.attempt("ns", "g", attempt(Some("u"), "r2", t0, 0));
        let out = a.settle("ns", "g", &Evidence::Gone, t0, OUTCOME_BOUND);
        assert_eq!(got(&out), [("r2", Outcome::Unverified)]);
        assert!(out[0].why.contains("audit log"), "{}", out[0].why);
        assert!(a.is_empty());
    }

    #[test]
    fn an_unreadable_pod_settles_only_attempts_past_the_bound() {
        let t0 = Instant::now();
        let mut a = Attempts::default();
        a.attempt("ns", "p", attempt(Some("u1"), "r0", t0, 0));
        let why = Evidence::Unreadable("no answer within 5s".into());
        assert!(a.settle("ns", "p", &why, t0, OUTCOME_BOUND).is_empty());
        assert_eq!(a.len(), 1);
        let out = a.settle("ns", "p", &why, t0 + OUTCOME_BOUND, OUTCOME_BOUND);
        assert_eq!(got(&out), [("r0", Outcome::Unverified)]);
        assert!(out[0].why.contains("no answer within 5s"));
    }

    #[test]
    fn stopping_records_every_pending_attempt_as_dropped() {
        let t0 = Instant::now();
        let mut a = Attempts::default();
        a.attempt("ns", "p", attempt(Some("u1"), "r0", t0, 0));
        a.attempt("ns", "q", attempt(None, "r1", t0, 0));
        let mut out = a.drain(t0);
        out.sort_by(|x, y| x.attempt.request_uid.cmp(&y.attempt.request_uid));
        assert_eq!(
            got(&out),
            [("r0", Outcome::Dropped), ("r1", Outcome::Dropped)]
        );
        assert!(a.is_empty());
    }

    #[test]
    fn past_the_cap_nothing_is_noted() {
        let t0 = Instant::now();
        let mut a = Attempts::default();
        for i in 0..MAX_PENDING {
            assert!(a.attempt("ns", &format!("p{i}"), attempt(None, "r", t0, 0)));
        }
        assert!(!a.attempt("ns", "one-more", attempt(None, "r", t0, 0)));
        assert_eq!(a.len(), MAX_PENDING);
        assert_eq!(a.due(t0 + OUTCOME_BOUND, OUTCOME_BOUND).len(), MAX_PENDING);
    }

    #[test]
    fn the_outcome_record_names_the_attempt_and_its_evidence() {
        let t0 = Instant::now();
        let r = Resolved {
            namespace: "ns".into(),
            name: "p".into(),
            attempt: attempt(Some("u1"), "req-1", t0, 0),
            outcome: Outcome::Evicted,
            after: Duration::from_millis(120),
            why: "the pod's DisruptionTarget says EvictionByEvictionAPI".into(),
        };
        let rec = serde_json::to_value(record(&r)).expect("json");
        assert_eq!(rec["event"], "eviction_outcome");
        assert_eq!(rec["reason"], "evicted");
        assert_eq!(rec["request_uid"], "req-1");
        assert_eq!(rec["uid"], "u1");
        assert_eq!(rec["disruption_reason"], EVICTION_REASON);
        assert_eq!(rec["detail"], r.why);
    }
}
