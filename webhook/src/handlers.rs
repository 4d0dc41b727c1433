//! The admission endpoints: each reads a review, decides, answers, and writes
//! one audit record and its metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::Extension;

use crate::audit::AuditRecord;
use crate::collision::{self, AllowReason, Verdict};
use crate::confirm::Confirmer;
use crate::eviction_outcome::{Attempt, EvictionOutcomes};
use crate::fencing::{Check, LeaseTerms};
use crate::follow_up::{FollowUp, Source};
use crate::kind_index::KindIndexes;
use crate::limits::Peer;
use crate::livelock::{LivelockDetector, Recorded};
use crate::metrics::{reason_labels, Endpoint, ExplainedLabels, Metrics, ModeLabels};
use crate::mode::Mode;
use crate::pod_index::{NamespaceModes, PodIndex};
use crate::quota_kinds::GroupResource;
use crate::review::{self, Answer, Request};
use crate::{deletion_audit, disruption, self_test, tagger};

/// Everything a review needs, shared by all requests.
pub struct App {
    pub pods: Arc<PodIndex>,
    pub namespaces: Arc<NamespaceModes>,
    pub confirmer: Confirmer,
    pub livelock: LivelockDetector,
    pub metrics: Metrics,
    /// Tags what cannot be tagged inside its request (node updates, evictions).
    pub follow_up: FollowUp,
    /// What became of each eviction attempt (tagged once it evicted).
    pub evictions: EvictionOutcomes,
    /// Name indexes of the other kinds quotas count (`None`: pods only).
    pub kinds: Option<Arc<KindIndexes>>,
    /// Records the log writer dropped because stdout stalled.
    pub log_dropped: Option<tracing_appender::non_blocking::ErrorCounter>,
    /// The serving certificate in use (for its expiry metric).
    pub certificate: Option<Arc<graceguard_certs::ReloadingResolver>>,
    /// The install-wide mode; a namespace label overrides it.
    pub mode: Mode,
    /// The numbers of mode `adaptive`.
    pub adaptive: collision::Adaptive,
    /// Whether readiness also requires healthy watches (see [`App::is_ready`]).
    pub readiness_tracks_watch: bool,
    /// Set on SIGTERM: readiness goes false while in-flight reviews finish.
    pub shutting_down: AtomicBool,
    /// Whether graceguard can tell the API server's reviews from anyone
    /// else's (`--trusted-peers` or mutual TLS). Then a review from any other
    /// client is answered and audited as such but changes nothing (no
    /// eviction attempt, denial streak, follow-up or counter): forged
    /// reviews cannot displace what the API server's need.
    pub knows_api_server: bool,
    /// The instance Leases' terms, for the fencing check (`None`: off).
    pub leases: Option<Arc<LeaseTerms>>,
}

impl App {
    /// True when the indexes are synced and the server is not shutting down.
    ///
    /// With `readiness_tracks_watch` (the default, for `failurePolicy: Ignore`)
    /// a broken watch also makes the replica unready, so traffic moves to a
    /// healthy one. Without it (the chart's choice under `Fail`) readiness
    /// only waits for the first sync: an unready webhook under `Fail` refuses
    /// every pod Create in the cluster, while a stale index only ever allows
    /// (a hit is confirmed by a live read), so a watch hiccup must not turn
    /// into an outage.
    pub fn is_ready(&self) -> bool {
        let indexes = if self.readiness_tracks_watch {
            self.pods.is_ready() && self.namespaces.is_ready()
        } else {
            self.pods.is_synced() && self.namespaces.is_synced()
        };
        indexes && !self.shutting_down.load(Ordering::Acquire)
    }

    fn mode_for(&self, namespace: &str) -> Mode {
        self.namespaces.get("", namespace).unwrap_or(self.mode)
    }
}

/// `POST /validate/pods` and `POST /validate/collision`: the collision guard,
/// for pods and for any namespaced kind a quota counts.
pub async fn validate_pods(
    State(app): State<Arc<App>>,
    peer: Option<Extension<Peer>>,
    body: Bytes,
) -> Response {
    handle(&app, Endpoint::collision_guard, peer.map(|p| p.0), &body).await
}

/// `POST /mutate/pods-status`: the disruption tagger.
pub async fn mutate_pods_status(
    State(app): State<Arc<App>>,
    peer: Option<Extension<Peer>>,
    body: Bytes,
) -> Response {
    handle(&app, Endpoint::disruption_tagger, peer.map(|p| p.0), &body).await
}

/// `POST /validate/pods-delete`: the deletion audit.
pub async fn validate_pods_delete(
    State(app): State<Arc<App>>,
    peer: Option<Extension<Peer>>,
    body: Bytes,
) -> Response {
    handle(&app, Endpoint::deletion_audit, peer.map(|p| p.0), &body).await
}

/// `POST /validate/pods-eviction`: the eviction audit.
pub async fn validate_pods_eviction(
    State(app): State<Arc<App>>,
    peer: Option<Extension<Peer>>,
    body: Bytes,
) -> Response {
    handle(&app, Endpoint::eviction_audit, peer.map(|p| p.0), &body).await
}

/// `POST /validate/pods-release`: the fencing check of the guard's
/// result-finalizer releases.
pub async fn validate_pods_release(
    State(app): State<Arc<App>>,
    peer: Option<Extension<Peer>>,
    body: Bytes,
) -> Response {
    handle(&app, Endpoint::release_fencing, peer.map(|p| p.0), &body).await
}

async fn handle(app: &App, endpoint: Endpoint, peer: Option<Peer>, body: &[u8]) -> Response {
    let start = Instant::now();
    let read = match endpoint {
        Endpoint::collision_guard => review::Read::NameOnly,
        _ => review::Read::Pods,
    };
    let req = match review::parse_as(body, read) {
        Ok(r) => r,
        Err(e) => {
            app.metrics.bad_requests.inc();
            tracing::warn!(endpoint = endpoint.as_str(), error = %e, "unreadable admission request");
            return review::unreadable(body, &e);
        }
    };
    // What may change graceguard's state: neither a dry run nor, when
    // graceguard can tell, a review the API server did not send.
    let from_api_server =
        !app.knows_api_server || peer.as_ref().is_some_and(|p| p.trust.is_trusted());
    let acts = if !from_api_server {
        Acts::Unauthenticated
    } else if req.dry_run {
        Acts::DryRun
    } else {
        Acts::Yes
    };
    let (mut answer, mut rec) = match endpoint {
        Endpoint::collision_guard => match fencing(app, &req, acts) {
            Fenced::Refused(refused) => *refused,
            Fenced::Checked { reason, warning } => {
                let (mut answer, mut rec) = collision_guard(app, &req, acts).await;
                answer.warnings.extend(warning);
                rec.fencing = reason;
                (answer, rec)
            }
        },
        Endpoint::disruption_tagger => disruption_tagger(app, &req, acts),
        Endpoint::deletion_audit => deletion_audit(app, &req, acts),
        Endpoint::eviction_audit => eviction_audit(app, &req, acts),
        Endpoint::release_fencing => release_fencing(app, &req, acts),
    };
    let elapsed = start.elapsed();
    let (user, groups) = req.user();
    rec.event = "admission";
    rec.endpoint = endpoint.as_str();
    rec.decision = if answer.allowed { "allow" } else { "deny" };
    rec.request_uid.clone_from(&req.uid);
    if let Some(peer) = peer {
        rec.peer = Some(peer.ip.to_canonical().to_string());
        rec.peer_authenticated = Some(peer.trust.as_str());
        rec.peer_name = peer.certificate_name.map(|n| n.to_string());
    }
    rec.user = user;
    rec.groups = groups;
    rec.dry_run = req.dry_run;
    if rec.namespace.is_empty() {
        rec.namespace.clone_from(&req.namespace);
    }
    if rec.name.is_empty() {
        rec.name.clone_from(&req.name);
    }
    rec.latency_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    let series = app.metrics.review(endpoint);
    match answer.allowed {
        true => series.allowed.inc(),
        false => series.denied.inc(),
    };
    series.seconds.observe(elapsed.as_secs_f64());
    rec.emit();
    // The record is written: its reason moves into the answer, uncopied.
    answer.audit_annotations = vec![
        ("decision", rec.decision.into()),
        ("reason", std::mem::take(&mut rec.reason).into()),
    ];
    review::answer(&req, answer)
}

/// Whether a review may change graceguard's state (the eviction attempts,
/// denial streaks, follow-ups, counters), and if not, why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Acts {
    Yes,
    /// A dry run: answered as the real request would be, counted, no more.
    DryRun,
    /// Not the API server (graceguard can tell): answered, audited, no more.
    Unauthenticated,
}

impl Acts {
    fn yes(self) -> bool {
        self == Acts::Yes
    }

    /// Whether the review counts in the audited-request metrics.
    fn counted(self) -> bool {
        self != Acts::Unauthenticated
    }

    /// Why it changes nothing, for the audit record's reason.
    fn why_not(self) -> Option<&'static str> {
        match self {
            Acts::Yes => None,
            Acts::DryRun => Some("dry_run"),
            Acts::Unauthenticated => Some("unauthenticated_sender"),
        }
    }
}

/// The name a Create will use: by validating admission a `generateName` has
/// been resolved into `metadata.name`.
fn object_name(req: &Request) -> String {
    req.object
        .as_ref()
        .and_then(|o| o.metadata.name.clone())
        .or_else(|| req.object_name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| req.name.clone())
}

fn disruption_tagger(app: &App, req: &Request, acts: Acts) -> (Answer, AuditRecord) {
    let mut rec = AuditRecord {
        reason: "not_a_status_update".into(),
        ..Default::default()
    };
    let Some(pod) = req
        .object
        .as_ref()
        .filter(|_| req.is_pods("UPDATE", "status"))
    else {
        return (Answer::allow(), rec);
    };
    rec.uid.clone_from(&pod.metadata.uid);
    let Some(d) = disruption::of_pod(pod) else {
        rec.reason = "no_disruption_target".into();
        return (Answer::allow(), rec);
    };
    rec.disruption_reason = Some(d.reason.clone());
    let Some(patch) = tagger::patch_for(&pod.metadata, &d) else {
        rec.reason = "already_tagged".into();
        rec.patched = Some(false);
        return (Answer::allow(), rec);
    };
    // Never change a node's request: NodeRestriction would refuse it (the API
    // server re-runs the plugin after a webhook's patch) and the kubelet would
    // retry forever. Never change a running pod: its deletion, a few ms
    // behind this update, would wait a PLEG relist (see
    // `tagger::may_tag_now`). Both are tagged afterwards, under graceguard's
    // own identity, the running pod once its deletion has begun.
    let left = if req.is_from_node() {
        Some(("node_request", Source::NodeStatusUpdate))
    } else if !tagger::may_tag_now(pod) {
        Some(("running_pod", Source::RunningPod))
    } else {
        None
    };
    if let Some((why, source)) = left {
        let left_unchanged = match source {
            Source::NodeStatusUpdate => &app.metrics.node_requests_left_unchanged,
            _ => &app.metrics.running_pods_left_unchanged,
        };
        left_unchanged.inc();
        rec.patched = Some(false);
        let outcome = if let Some(why) = acts.why_not() {
            why
        } else if app.follow_up.request(
            &req.namespace,
            &req.name,
            pod.metadata.uid.as_deref(),
            source,
        ) {
            "follow_up"
        } else if app.follow_up.is_enabled() {
            "follow_up_pending"
        } else {
            "unchanged"
        };
        rec.reason = format!("{why}_{outcome}");
        return (Answer::allow(), rec);
    }
    match serde_json::to_vec(&patch) {
        Ok(bytes) => {
            if acts.counted() {
                app.metrics
                    .disruption_tags
                    .get_or_create(&reason_labels(&d.reason))
                    .inc();
            }
            rec.reason = "tagged".into();
            rec.patched = Some(true);
            let answer = Answer {
                patch: Some(bytes),
                ..Answer::allow()
            };
            (answer, rec)
        }
        Err(e) => {
            // Cannot happen for a patch of strings, but never deny over it.
            tracing::warn!(error = %e, "could not serialize the tag patch; allowing the update untagged");
            rec.reason = "patch_error".into();
            rec.patched = Some(false);
            (Answer::allow(), rec)
        }
    }
}

fn deletion_audit(app: &App, req: &Request, acts: Acts) -> (Answer, AuditRecord) {
    if !req.is_pods("DELETE", "") {
        let rec = AuditRecord {
            reason: "not_a_pod_delete".into(),
            ..Default::default()
        };
        return (Answer::allow(), rec);
    }
    let rec = deletion_audit::record(req);
    // The deletion a disruption announced has begun: now its pod may be
    // tagged (`tagger::may_tag_now`). Asked here too, not only by the status
    // update that carried the condition, so a deletion that comes later than
    // that follow-up's attempts, or after a restart, is still tagged.
    if rec.disruption_reason.is_some() && rec.already_terminating == Some(false) && acts.yes() {
        let untagged = req.old_object.as_ref().is_some_and(|pod| {
            disruption::of_pod(pod).is_some_and(|d| tagger::patch_for(&pod.metadata, &d).is_some())
        });
        if untagged {
            app.follow_up.request(
                &req.namespace,
                &req.name,
                rec.uid.as_deref(),
                Source::Deletion,
            );
        }
    }
    let explained = if rec.disruption_reason.is_some() {
        "yes"
    } else {
        "no"
    };
    if acts.counted() {
        app.metrics
            .deletions_audited
            .get_or_create(&ExplainedLabels { explained })
            .inc();
    }
    (Answer::allow(), rec)
}

/// Evictions delete through the registry, past every DELETE webhook, and write
/// their `DisruptionTarget` outside admission: the `pods/eviction` request is
/// the one place to see them. It runs before the PodDisruptionBudget check,
/// so this records the attempt (one record per request) and
/// [`crate::eviction_outcome`] records what became of it, and asks for the
/// follow-up tag only when the pod was evicted.
fn eviction_audit(app: &App, req: &Request, acts: Acts) -> (Answer, AuditRecord) {
    if !req.is_pods("CREATE", "eviction") {
        let rec = AuditRecord {
            reason: "not_an_eviction".into(),
            ..Default::default()
        };
        return (Answer::allow(), rec);
    }
    if acts.counted() {
        app.metrics.evictions_audited.inc();
    }
    let held = app.pods.get(&req.namespace, &req.name);
    let already_terminating = held.as_ref().map(|p| p.deletion.is_some());
    let uid = held.map(|p| p.uid);
    // A pod already terminating is not evicted again (the Eviction API
    // answers at once); its disruption was recorded when its deletion began.
    if acts.yes() && already_terminating != Some(true) {
        let attempt = Attempt {
            request_uid: req.uid.clone(),
            uid: uid.clone(),
            user: req.user_info.username.clone().unwrap_or_default(),
            at: Instant::now(),
            wall: std::time::SystemTime::now(),
        };
        app.evictions.attempted(&req.namespace, &req.name, attempt);
    }
    let rec = AuditRecord {
        reason: "eviction_attempt".into(),
        uid,
        grace_period_seconds: req.grace_period_seconds,
        already_terminating,
        disruption_reason: Some("EvictionByEvictionAPI".into()),
        ..Default::default()
    };
    (Answer::allow(), rec)
}

/// Counts a denial of `name` to the request's user (the livelock detector),
/// writes the `livelock_suspected` record when it names the client now, and
/// returns what was recorded (the client's streak).
fn record_denial(app: &App, req: &Request, rec: &AuditRecord, name: &str) -> Recorded {
    let user = req.user_info.username.as_deref().unwrap_or("");
    let looped_on = match &rec.resource {
        Some(resource) => format!("{resource}/{name}"),
        None => name.to_string(),
    };
    let recorded = app.livelock.record(&req.namespace, &looped_on, user);
    if let Some(count) = recorded.report {
        app.metrics.livelock_suspected.inc();
        AuditRecord {
            event: "livelock_suspected",
            endpoint: Endpoint::collision_guard.as_str(),
            decision: "deny",
            reason: "livelock_suspected".into(),
            namespace: req.namespace.clone(),
            name: name.to_string(),
            user: user.to_string(),
            request_uid: req.uid.clone(),
            detail: Some(format!(
                "client {user:?} re-created {} \"{name}\" {count} times in {} s while the name was taken; it is probably looping on AlreadyExists",
                rec.resource.as_deref().unwrap_or("pods"),
                app.livelock.window().as_secs()
            )),
            resource: rec.resource.clone(),
            denials_in_window: Some(count as u64),
            window_seconds: Some(app.livelock.window().as_secs()),
            ..Default::default()
        }
        .emit();
    }
    recorded
}

/// What the fencing check made of a Create.
enum Fenced {
    /// Sent under a Lease term that is over: refused, before any collision
    /// check (the answer and its record).
    Refused(Box<(Answer, AuditRecord)>),
    /// Goes on to the collision guard; `reason` is the check's (`None`: no
    /// token, or the check is off).
    Checked {
        reason: Option<&'static str>,
        warning: Option<String>,
    },
}

/// The fencing check of a pod Create that carries a token
/// ([`crate::fencing`]). A dry run is answered as the real one would be.
fn fencing(app: &App, req: &Request, acts: Acts) -> Fenced {
    let (Some(terms), Some(token), true) =
        (&app.leases, &req.fencing_token, req.is_pods("CREATE", ""))
    else {
        return Fenced::Checked {
            reason: None,
            warning: None,
        };
    };
    match terms.check(token) {
        Check::Allow { reason, warning } => Fenced::Checked {
            reason: Some(reason),
            warning,
        },
        Check::Refuse { reason, status } => {
            let rec = AuditRecord {
                namespace: req.namespace.clone(),
                name: object_name(req),
                ..Default::default()
            };
            Fenced::Refused(Box::new(refused_for_term(app, acts, rec, reason, status)))
        }
    }
}

/// A write refused because the term it was sent under is over: counted
/// (dry runs too; never a review graceguard knows the API server did not
/// send), recorded and answered.
fn refused_for_term(
    app: &App,
    acts: Acts,
    mut rec: AuditRecord,
    reason: &'static str,
    status: Box<kube::core::Status>,
) -> (Answer, AuditRecord) {
    if acts != Acts::Unauthenticated {
        app.metrics.fenced_writes_refused.inc();
    }
    rec.reason = reason.into();
    rec.fencing = Some(reason);
    rec.code = Some(status.code);
    rec.detail = Some(status.message.clone());
    let answer = Answer {
        allowed: false,
        status: Some(*status),
        ..Answer::allow()
    };
    (answer, rec)
}

/// The fencing check of a pod update that sets or changes
/// [`graceguard_contract::fencing::RELEASED_UNDER`]: a guard's result-finalizer
/// release, refused when the term it was sent under is over. Any other
/// update (an operator's, a later write) is allowed unchecked; the API
/// server's matchConditions send only releases here.
fn release_fencing(app: &App, req: &Request, acts: Acts) -> (Answer, AuditRecord) {
    use graceguard_contract::fencing::RELEASED_UNDER;
    let annotation = |pod: Option<&review::Pod>| {
        pod.and_then(|p| p.metadata.annotations.as_ref())
            .and_then(|a| a.get(RELEASED_UNDER))
            .cloned()
    };
    let mut rec = AuditRecord {
        namespace: req.namespace.clone(),
        name: req.name.clone(),
        ..Default::default()
    };
    let token = annotation(req.object.as_ref());
    let sets_it = req.is_pods("UPDATE", "")
        && token.is_some()
        && token != annotation(req.old_object.as_ref());
    let (Some(terms), Some(token), true) = (&app.leases, token, sets_it) else {
        rec.reason = match app.leases {
            None => "fencing_off".into(),
            Some(_) => "not_a_release".into(),
        };
        return (Answer::allow(), rec);
    };
    match terms.check(&token) {
        Check::Allow { reason, warning } => {
            rec.reason = reason.into();
            rec.fencing = Some(reason);
            let answer = Answer {
                warnings: warning.into_iter().collect(),
                ..Answer::allow()
            };
            (answer, rec)
        }
        Check::Refuse { reason, status } => refused_for_term(app, acts, rec, reason, status),
    }
}

async fn collision_guard(app: &App, req: &Request, acts: Acts) -> (Answer, AuditRecord) {
    let allow = |reason: AllowReason| AuditRecord {
        reason: reason.as_str().into(),
        ..Default::default()
    };
    if req.operation != "CREATE" || !req.sub_resource.is_empty() {
        return (Answer::allow(), allow(AllowReason::NotPodCreate));
    }
    // Pod Creates, nearly all of them, build no kind: other kinds name theirs.
    let other_kind = (!req.is_pods("CREATE", ""))
        .then(|| GroupResource::new(&req.resource.group, &req.resource.resource));
    let name = object_name(req);
    let namespace = req.namespace.clone();
    let mut rec = AuditRecord {
        namespace: namespace.clone(),
        name: name.clone(),
        resource: other_kind.as_ref().map(ToString::to_string),
        ..allow(AllowReason::NameFree)
    };
    if name.is_empty() {
        rec.reason = AllowReason::NoName.as_str().into();
        return (Answer::allow(), rec);
    }
    if let Some(warning) = self_test::warning(&name, req.dry_run) {
        rec.reason = AllowReason::SelfTest.as_str().into();
        let answer = Answer {
            warnings: vec![warning],
            ..Answer::allow()
        };
        return (answer, rec);
    }
    // Pods: the pod index. Any other kind: its index, when a quota counts it.
    let kind_index;
    let (indexed, confirmer, watch_current) = match &other_kind {
        None => (
            app.pods.get(&namespace, &name),
            &app.confirmer,
            app.pods.is_ready(),
        ),
        Some(kind) => {
            let Some(idx) = app.kinds.as_ref().and_then(|k| k.get(kind)) else {
                rec.reason = AllowReason::KindNotIndexed.as_str().into();
                return (Answer::allow(), rec);
            };
            if idx.index.is_over_cap() {
                rec.reason = AllowReason::KindIndexOverCap.as_str().into();
                return (Answer::allow(), rec);
            }
            kind_index = idx;
            (
                kind_index.index.get(&namespace, &name),
                &kind_index.confirmer,
                kind_index.index.is_ready(),
            )
        }
    };
    let confirmation = match indexed {
        Some(indexed) => {
            confirmer
                .confirm_with(&namespace, &name, &indexed, watch_current)
                .await
        }
        // A miss of an index whose watch is current: the name is free.
        None if watch_current => return (Answer::allow(), rec),
        // A miss of an index whose watch is broken or resuming may be stale:
        // read it (one GET per such Create, only while the watch is down).
        None => match confirmer.confirm_unindexed(&namespace, &name).await {
            collision::Confirmation::Free => {
                rec.reason = AllowReason::NameFreeRead.as_str().into();
                return (Answer::allow(), rec);
            }
            other => other,
        },
    };
    if let collision::Confirmation::Failed(e) = &confirmation {
        tracing::warn!(namespace = %namespace, name = %name, error = %e, "could not confirm an index hit; allowing the Create");
    }
    let mode = app.mode_for(&namespace);
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let kind = other_kind.unwrap_or_else(GroupResource::pods);
    // A confirmed holder means a denial: count it first (dry runs are not
    // counted), since `adaptive` phrases it by the client's streak.
    let recorded = match (&confirmation, acts) {
        (collision::Confirmation::Held(_), Acts::Yes) => Some(record_denial(app, req, &rec, &name)),
        _ => None,
    };
    let how = collision::How {
        mode,
        streak: recorded.as_ref().map_or(1, |r| r.streak),
        adaptive: app.adaptive,
    };
    let d = match collision::decide(&kind, &confirmation, &name, how, now) {
        Verdict::Allow(reason) => {
            rec.reason = reason.as_str().into();
            return (Answer::allow(), rec);
        }
        Verdict::Deny(d) => d,
    };
    let told = d
        .status
        .details
        .as_ref()
        .map_or(0, |details| details.retry_after_seconds);
    if let Some(r) = &recorded {
        r.told(Duration::from_secs(u64::from(told)));
    }
    rec.reason = d.reason.into();
    rec.mode = Some(mode.as_str());
    rec.code = Some(d.status.code);
    rec.detail = Some(d.status.message.clone());
    rec.grace_left_seconds = d.grace_left_seconds;
    if let collision::Confirmation::Held(p) = &confirmation {
        rec.uid = Some(p.held.uid.clone());
    }
    if acts.yes() {
        app.metrics.quota_charges_prevented.inc();
        if d.status.code == 429 {
            app.metrics
                .retry_answers
                .get_or_create(&ModeLabels {
                    mode: mode.as_str(),
                })
                .inc();
        }
    }
    let answer = Answer {
        allowed: false,
        status: Some(d.status),
        ..Answer::allow()
    };
    (answer, rec)
}
