//! Tagging afterwards, under graceguard's own identity.
//!
//! Three kinds of `DisruptionTarget` are not tagged inside the request that
//! carries them:
//! * a node's `pods/status` update (the kubelet's own `TerminationByKubelet`,
//!   or any later status of a pod tagged nowhere yet): NodeRestriction refuses
//!   a node's status update whose labels differ from the stored pod's, and the
//!   API server re-runs it after a mutating webhook changes the object, so a
//!   tag added there fails the kubelet's update, every retry (see
//!   [`crate::handlers`]: node requests are never changed);
//! * the Eviction API's condition, written by the registry outside admission
//!   right after the `pods/eviction` request is admitted;
//! * any condition on a pod still running: its deletion follows within
//!   milliseconds, and a metadata change just before it delays the kubelet's
//!   termination by a PLEG relist ([`crate::tagger::may_tag_now`]).
//!
//! For each, the admission endpoint asks for a follow-up (and the deletion
//! audit asks again when the deletion of a disrupted, untagged pod begins): a
//! worker reads the pod shortly after and, once the pod may be tagged (its
//! deletion has begun, or it has ended), derives the tags from its condition
//! exactly as the inline tagger does ([`crate::tagger::missing_tags`]), and
//! merge-PATCHes only
//! graceguard's keys with the pod's uid, through `pods/status` (whose strategy
//! keeps metadata and resets the spec: graceguard holds no `patch pods`), so a concurrent writer's labels are
//! kept and a replaced pod is never tagged ([`crate::tagger::merge_patch_for`]).
//! Idempotent, bounded
//! (a few retries with backoff, then given up and audited as such), never on
//! an admission request's path: asking never waits, and a full queue drops the
//! request (counted) rather than slow admission down. Each follow-up writes
//! one audit record with its outcome and the delay from request to tag.
//!
//! A pod or namespace labelled `graceguard.io/ignore=true` is never tagged:
//! the audits, which see every deletion and eviction whatever its labels,
//! ask for follow-ups too, and an opted-out pod must get no write from
//! graceguard (counted as `opted_out`; a namespace's label is read from the
//! namespace index before anything is queued, a pod's own once it is read).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use k8s_openapi::api::core::v1::Pod as K8sPod;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::mpsc;

use crate::audit::AuditRecord;
use crate::pod_index::{opts_out, NamespaceModes};
use crate::tagger::TagMetrics;
use crate::{disruption, tagger};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The follow-up queue's series: what each follow-up came to, and requests
/// the full queue turned away. A pod it tags counts in [`TagMetrics`] too.
#[derive(Clone, Default)]
pub struct FollowUpMetrics {
    pub follow_ups: Family<FollowUpLabels, Counter>,
    pub follow_ups_dropped: Counter,
    pub tags: TagMetrics,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FollowUpLabels {
    pub outcome: &'static str,
}

impl FollowUpMetrics {
    /// The series, registered (each outcome at 0 from the start); `tags`
    /// are registered by their owner, [`crate::tagger`].
    pub fn register(r: &mut Registry, tags: TagMetrics) -> Self {
        let m = Self {
            tags,
            ..Self::default()
        };
        for outcome in Outcome::ALL {
            let _ = m.follow_ups.get_or_create(&FollowUpLabels {
                outcome: outcome.as_str(),
            });
        }
        r.register(
            "follow_up_tags",
            "Follow-up tagging under graceguard's own identity, by outcome",
            m.follow_ups.clone(),
        );
        r.register(
            "follow_up_tags_dropped",
            "Follow-up tagging requests dropped because the queue was full",
            m.follow_ups_dropped.clone(),
        );
        m
    }
}

/// Why a follow-up was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A node's status update carried an untagged DisruptionTarget.
    NodeStatusUpdate,
    /// A `pods/eviction` request was admitted.
    Eviction,
    /// A status update carried a DisruptionTarget for a pod still running.
    RunningPod,
    /// The deletion of a disrupted, untagged pod began.
    Deletion,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::NodeStatusUpdate => "node_status_update",
            Source::Eviction => "eviction",
            Source::RunningPod => "running_pod",
            Source::Deletion => "deletion",
        }
    }
}

/// How follow-ups retry.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Reads or patches per follow-up before it is given up.
    pub attempts: usize,
    /// Backoff between attempts: from `min_delay`, doubling, capped at `max_delay`.
    pub min_delay: Duration,
    pub max_delay: Duration,
    /// Follow-ups waiting at once; more are dropped (and counted).
    pub queue: usize,
    /// Follow-ups running at once (each a GET and a PATCH, with retries), so
    /// a drain of many nodes does not turn into a burst on the API server.
    pub concurrency: usize,
    /// How long one read or patch may take. kube-rs's client has no read
    /// timeout short enough for this (its default fits watches), so a
    /// stalled connection would otherwise hold a follow-up slot for minutes;
    /// past it the attempt fails, its connection is dropped, and the next
    /// attempt (after the backoff) opens a new one.
    pub call_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        // The request that asks is still being admitted when the first read
        // happens, so that read usually finds the pod as it was: retry soon,
        // then back off (about 7 s in all before giving up).
        Self {
            attempts: 10,
            min_delay: Duration::from_millis(25),
            max_delay: Duration::from_secs(2),
            queue: 4096,
            concurrency: 16,
            call_timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Clone)]
struct Job {
    namespace: String,
    name: String,
    uid: Option<String>,
    source: Source,
    asked: Instant,
}

/// The handle admission endpoints ask through. Cheap to clone.
#[derive(Clone)]
pub struct FollowUp {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    tx: mpsc::Sender<Job>,
    /// The follow-ups queued or running, by namespace/name: one at a time
    /// per pod; what is left here at shutdown is recorded as dropped.
    pending: Mutex<HashMap<(String, String), Job>>,
    metrics: FollowUpMetrics,
    /// The namespaces' settings: an opted-out namespace's pods are not tagged.
    namespaces: Arc<NamespaceModes>,
}

/// What one follow-up ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Tagged,
    AlreadyTagged,
    /// The pod is gone, or its name now belongs to another pod.
    Gone,
    /// No `DisruptionTarget=True` appeared within the attempts.
    NoDisruptionTarget,
    /// The pod was still running after the attempts: left untagged, since a
    /// running pod is never changed (its deletion, if it comes, asks again).
    StillRunning,
    /// Every attempt failed (the last error is in the audit record).
    GaveUp,
    /// graceguard stopped before the follow-up ended.
    Dropped,
    /// The pod or its namespace carries `graceguard.io/ignore=true`: left
    /// as it is.
    OptedOut,
}

impl Outcome {
    /// Every outcome, each exported from the start at 0: an alert on
    /// `increase()` then sees the first give-up, not only the second.
    pub const ALL: [Outcome; 8] = [
        Outcome::Tagged,
        Outcome::AlreadyTagged,
        Outcome::Gone,
        Outcome::NoDisruptionTarget,
        Outcome::StillRunning,
        Outcome::GaveUp,
        Outcome::Dropped,
        Outcome::OptedOut,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Tagged => "tagged",
            Outcome::AlreadyTagged => "already_tagged",
            Outcome::Gone => "gone",
            Outcome::NoDisruptionTarget => "no_disruption_target",
            Outcome::StillRunning => "still_running",
            Outcome::GaveUp => "gave_up",
            Outcome::Dropped => "dropped",
            Outcome::OptedOut => "opted_out",
        }
    }
}

impl FollowUp {
    /// Follow-ups off (`--follow-up-tagging=false`): asking does nothing.
    pub fn disabled() -> Self {
        Self { inner: None }
    }

    /// Starts the worker, which tags through `client` the pods of
    /// namespaces `namespaces` does not show opted out.
    pub fn spawn(
        client: Client,
        metrics: FollowUpMetrics,
        settings: Settings,
        namespaces: Arc<NamespaceModes>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(settings.queue.max(1));
        let inner = Arc::new(Inner {
            tx,
            pending: Mutex::new(HashMap::new()),
            metrics,
            namespaces,
        });
        tokio::spawn(worker(rx, client, Arc::downgrade(&inner), settings));
        Self { inner: Some(inner) }
    }

    /// graceguard is stopping: records every follow-up still queued or
    /// running as `dropped` (its pod stays untagged). Returns how many.
    pub fn stop(&self) -> usize {
        let Some(inner) = &self.inner else {
            return 0;
        };
        let dropped: Vec<Job> = inner
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, job)| job)
            .collect();
        for job in &dropped {
            inner
                .metrics
                .follow_ups
                .get_or_create(&FollowUpLabels {
                    outcome: Outcome::Dropped.as_str(),
                })
                .inc();
            AuditRecord {
                event: "follow_up",
                endpoint: "disruption_tagger",
                decision: "allow",
                reason: Outcome::Dropped.as_str().into(),
                namespace: job.namespace.clone(),
                name: job.name.clone(),
                uid: job.uid.clone(),
                source: Some(job.source.as_str()),
                patched: Some(false),
                latency_us: u64::try_from(job.asked.elapsed().as_micros()).unwrap_or(u64::MAX),
                detail: Some(
                    "graceguard stopped before this pod was tagged: it stays untagged".into(),
                ),
                ..Default::default()
            }
            .emit();
        }
        dropped.len()
    }

    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Asks for `namespace/name` (`uid` when known) to be tagged shortly.
    /// Never waits; returns whether the request was queued (false: disabled,
    /// the namespace opted out, one already pending for that pod, or the
    /// queue is full).
    pub fn request(&self, namespace: &str, name: &str, uid: Option<&str>, source: Source) -> bool {
        let Some(inner) = &self.inner else {
            return false;
        };
        if inner
            .namespaces
            .get("", namespace)
            .is_some_and(|s| s.opted_out)
        {
            inner
                .metrics
                .follow_ups
                .get_or_create(&FollowUpLabels {
                    outcome: Outcome::OptedOut.as_str(),
                })
                .inc();
            return false;
        }
        let key = (namespace.to_string(), name.to_string());
        let job = Job {
            namespace: key.0.clone(),
            name: key.1.clone(),
            uid: uid.map(str::to_string),
            source,
            asked: Instant::now(),
        };
        {
            let mut pending = inner.pending.lock().unwrap_or_else(|p| p.into_inner());
            if pending.contains_key(&key) {
                return false;
            }
            pending.insert(key.clone(), job.clone());
        }
        if inner.tx.try_send(job).is_err() {
            inner
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
            inner.metrics.follow_ups_dropped.inc();
            tracing::warn!(
                namespace,
                name,
                "follow-up tagging queue full; this pod stays untagged"
            );
            return false;
        }
        true
    }
}

async fn worker(
    mut rx: mpsc::Receiver<Job>,
    client: Client,
    inner: std::sync::Weak<Inner>,
    settings: Settings,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(settings.concurrency.max(1)));
    while let Some(job) = rx.recv().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        // At the limit, jobs wait in the queue (bounded: beyond it they are dropped).
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let client = client.clone();
        // Each follow-up runs on its own: one slow pod must not hold up the rest.
        tokio::spawn(async move {
            let _slot = slot;
            let (outcome, rec) = run(&client, &job, settings).await;
            let still_pending = inner
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&(job.namespace.clone(), job.name.clone()))
                .is_some();
            if !still_pending {
                // Recorded as dropped by the shutdown already.
                return;
            }
            inner
                .metrics
                .follow_ups
                .get_or_create(&FollowUpLabels {
                    outcome: outcome.as_str(),
                })
                .inc();
            if outcome == Outcome::Tagged {
                if let Some(reason) = &rec.disruption_reason {
                    inner.metrics.tags.tagged(reason);
                }
            }
            rec.emit();
        });
    }
}

async fn run(client: &Client, job: &Job, settings: Settings) -> (Outcome, AuditRecord) {
    let api: Api<K8sPod> = Api::namespaced(client.clone(), &job.namespace);
    let mut rec = AuditRecord {
        event: "follow_up",
        endpoint: "disruption_tagger",
        decision: "allow",
        namespace: job.namespace.clone(),
        name: job.name.clone(),
        uid: job.uid.clone(),
        source: Some(job.source.as_str()),
        ..Default::default()
    };
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(settings.min_delay)
        .with_max_delay(settings.max_delay)
        .with_max_times(settings.attempts.saturating_sub(1))
        .with_jitter()
        .build();
    let mut attempts = 0u32;
    let mut last_error = None;
    let mut waiting = Outcome::NoDisruptionTarget;
    let outcome = loop {
        attempts += 1;
        match attempt(&api, job, settings.call_timeout).await {
            Ok(Step::Done(outcome, d)) => {
                rec.disruption_reason = d;
                break outcome;
            }
            Ok(Step::NotYet(why)) => {
                last_error = None;
                waiting = why;
            }
            Err(e) => last_error = Some(e.to_string()),
        }
        match delays.next() {
            Some(d) => tokio::time::sleep(d).await,
            None if last_error.is_some() => break Outcome::GaveUp,
            None => break waiting,
        }
    };
    rec.reason = outcome.as_str().into();
    rec.patched = Some(outcome == Outcome::Tagged);
    rec.attempts = Some(attempts);
    rec.detail = last_error.filter(|_| outcome == Outcome::GaveUp);
    rec.latency_us = u64::try_from(job.asked.elapsed().as_micros()).unwrap_or(u64::MAX);
    (outcome, rec)
}

enum Step {
    Done(Outcome, Option<String>),
    /// Not yet, and the outcome if it stays so: no condition yet (the
    /// Eviction API writes it a moment after admission), or the pod is still
    /// running (its deletion follows the condition by a few milliseconds).
    NotYet(Outcome),
}

/// Why one follow-up attempt on pod `namespace/name` failed (it is retried,
/// then given up and audited).
#[derive(Debug, thiserror::Error)]
#[error("pod {namespace}/{name}: {cause}")]
struct AttemptError {
    namespace: String,
    name: String,
    #[source]
    cause: AttemptCause,
}

#[derive(Debug, thiserror::Error)]
enum AttemptCause {
    #[error("{0}: no answer within {1:?} (the API server is slow or unreachable)")]
    TimedOut(&'static str, Duration),
    #[error("reading it: {0}")]
    Read(#[source] kube::Error),
    #[error("it could not be read as a pod (its status or metadata did not parse)")]
    NotAPod,
    #[error("patching its tags: {0} (graceguard needs RBAC `patch` on pods/status for follow-up tagging: the chart's ClusterRole grants it)")]
    Patch(#[source] kube::Error),
}

async fn attempt(
    api: &Api<K8sPod>,
    job: &Job,
    call_timeout: Duration,
) -> Result<Step, AttemptError> {
    let failed = |cause| AttemptError {
        namespace: job.namespace.clone(),
        name: job.name.clone(),
        cause,
    };
    let read = tokio::time::timeout(call_timeout, api.get_opt(&job.name))
        .await
        .map_err(|_| failed(AttemptCause::TimedOut("reading it", call_timeout)))?
        .map_err(|e| failed(AttemptCause::Read(e)))?;
    let Some(pod) = read else {
        return Ok(Step::Done(Outcome::Gone, None));
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    if job.uid.as_ref().is_some_and(|want| *want != uid) {
        return Ok(Step::Done(Outcome::Gone, None));
    }
    if opts_out(pod.metadata.labels.as_ref()) {
        return Ok(Step::Done(Outcome::OptedOut, None));
    }
    let Some(lean) = crate::review::lean(&pod) else {
        return Err(failed(AttemptCause::NotAPod));
    };
    let Some(d) = disruption::of_pod(&lean) else {
        return Ok(Step::NotYet(Outcome::NoDisruptionTarget));
    };
    if !tagger::may_tag_now(&lean) {
        return Ok(Step::NotYet(Outcome::StillRunning));
    }
    let Some(tags) = tagger::merge_patch_for(&uid, &lean.metadata, &d) else {
        return Ok(Step::Done(Outcome::AlreadyTagged, Some(d.reason)));
    };
    // Through `pods/status`: the only write graceguard's role grants. Its
    // strategy keeps labels and annotations and resets the spec, so this
    // permission cannot change what a pod runs.
    let patched = tokio::time::timeout(
        call_timeout,
        api.patch_status(&job.name, &PatchParams::default(), &Patch::Merge(&tags)),
    )
    .await
    .map_err(|_| failed(AttemptCause::TimedOut("patching its tags", call_timeout)))?;
    match patched {
        Ok(_) => Ok(Step::Done(Outcome::Tagged, Some(d.reason))),
        // The uid would change: the name now belongs to another pod.
        Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("metadata.uid") => {
            Ok(Step::Done(Outcome::Gone, None))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Step::Done(Outcome::Gone, None)),
        Err(e) => Err(failed(AttemptCause::Patch(e))),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A client of an API server that accepts connections and never answers.
    pub(crate) async fn stalled_client() -> (Client, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("addr: {e}"));
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((tcp, _)) = listener.accept().await {
                open.push(tcp);
            }
        });
        let url: http::Uri = format!("http://{addr}")
            .parse()
            .unwrap_or_else(|e| panic!("uri: {e}"));
        let client =
            Client::try_from(kube::Config::new(url)).unwrap_or_else(|e| panic!("client: {e}"));
        (client, held)
    }

    #[tokio::test]
    async fn a_stalled_api_server_ends_a_follow_up_after_its_attempts_not_minutes_later() {
        let (client, held) = stalled_client().await;
        let job = Job {
            namespace: "ns".into(),
            name: "p".into(),
            uid: None,
            source: Source::Eviction,
            asked: Instant::now(),
        };
        let settings = Settings {
            attempts: 3,
            min_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(20),
            call_timeout: Duration::from_millis(200),
            ..Settings::default()
        };
        let started = Instant::now();
        let (outcome, rec) = run(&client, &job, settings).await;
        assert_eq!(outcome, Outcome::GaveUp);
        assert_eq!(rec.attempts, Some(3));
        assert!(
            rec.detail
                .as_deref()
                .is_some_and(|d| d.contains("no answer within")),
            "{:?}",
            rec.detail
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        held.abort();
    }

    #[tokio::test]
    async fn asking_never_waits_and_one_pod_is_pending_once() {
        let metrics = FollowUpMetrics::default();
        let (tx, _rx) = mpsc::channel(1);
        let f = FollowUp {
            inner: Some(Arc::new(Inner {
                tx,
                pending: Mutex::new(HashMap::new()),
                metrics: metrics.clone(),
                namespaces: Arc::new(NamespaceModes::new("namespaces")),
            })),
        };
        assert!(f.request("ns", "a", Some("u"), Source::Eviction));
        // Same pod again while pending: not queued twice.
        assert!(!f.request("ns", "a", Some("u"), Source::NodeStatusUpdate));
        // Queue (capacity 1) full: dropped at once, counted, not pending.
        assert!(!f.request("ns", "b", None, Source::Eviction));
        assert_eq!(metrics.follow_ups_dropped.get(), 1);
        assert!(!FollowUp::disabled().request("ns", "c", None, Source::Eviction));
    }

    #[test]
    fn a_pod_of_an_opted_out_namespace_is_never_queued() {
        use kube::runtime::watcher::Event;
        let metrics = FollowUpMetrics::default();
        let (tx, mut rx) = mpsc::channel(8);
        let namespaces = Arc::new(NamespaceModes::new("namespaces"));
        let ns = |name: &str, ignore: Option<&str>| kube::core::ObjectMeta {
            name: Some(name.into()),
            labels: ignore
                .map(|v| [(crate::pod_index::OPT_OUT_LABEL.to_string(), v.to_string())].into()),
            ..Default::default()
        };
        namespaces.apply(Event::Init, crate::pod_index::namespace_settings);
        for (name, ignore) in [
            ("quiet", Some("true")),
            ("other", Some("false")),
            ("plain", None),
        ] {
            namespaces.apply(
                Event::InitApply(&ns(name, ignore)),
                crate::pod_index::namespace_settings,
            );
        }
        namespaces.apply(Event::InitDone, crate::pod_index::namespace_settings);
        let f = FollowUp {
            inner: Some(Arc::new(Inner {
                tx,
                pending: Mutex::new(HashMap::new()),
                metrics: metrics.clone(),
                namespaces,
            })),
        };
        // The deletion audit and the eviction audit ask for every namespace.
        assert!(!f.request("quiet", "a", Some("u"), Source::Deletion));
        assert!(!f.request("quiet", "b", Some("u"), Source::Eviction));
        assert!(f.request("other", "a", Some("u"), Source::Deletion));
        assert!(f.request("plain", "a", Some("u"), Source::Deletion));
        let queued: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|j| j.namespace)
            .collect();
        assert_eq!(queued, ["other", "plain"]);
        let opted_out = metrics.follow_ups.get_or_create(&FollowUpLabels {
            outcome: Outcome::OptedOut.as_str(),
        });
        assert_eq!(opted_out.get(), 2);
    }
}
