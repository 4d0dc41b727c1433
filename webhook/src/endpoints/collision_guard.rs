//! `POST /validate/pods` and `/validate/collision`: the collision guard. A
//! Create whose name a live or terminating object holds is denied before
//! ResourceQuota charges it (the verdict itself: [`crate::collision::decide`]);
//! a pod Create sent under a Lease term that is over is refused first
//! ([`crate::fencing`]).

use std::collections::BTreeSet;
use std::time::Duration;

use super::{object_name, Acts, Reviewed};
use crate::app::App;
use crate::audit::AuditRecord;
use crate::collision::{self, AllowReason, DenyReason, Verdict};
use crate::fencing::{self, Check};
use crate::livelock::Recorded;
use crate::metrics::{Endpoint, ModeLabels};
use crate::quota_kinds::GroupResource;
use crate::review::{Answer, Request};
use crate::self_test;

/// Why the collision guard answered as it did (the audit record's `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Allowed(AllowReason),
    Denied(DenyReason),
    /// Refused by the fencing check (only its refusing reasons).
    Fenced(fencing::Reason),
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Allowed(r) => r.as_str(),
            Reason::Denied(r) => r.as_str(),
            Reason::Fenced(r) => r.as_str(),
        }
    }

    /// Every reason this endpoint can give.
    pub fn all() -> BTreeSet<String> {
        let allowed = AllowReason::ALL.map(Reason::Allowed);
        let denied = DenyReason::ALL.map(Reason::Denied);
        let fenced = fencing::Reason::ALL
            .into_iter()
            .filter(|r| r.refuses())
            .map(Reason::Fenced);
        allowed
            .into_iter()
            .chain(denied)
            .chain(fenced)
            .map(|r| r.as_str().to_string())
            .collect()
    }
}

/// The review: the fencing check, then the collision check.
pub async fn review(app: &App, req: &Request, acts: Acts) -> Reviewed {
    match fence(app, req, acts) {
        Fenced::Refused(refused) => *refused,
        Fenced::Checked { reason, warning } => {
            let mut reviewed = collide(app, req, acts).await;
            reviewed.answer.warnings.extend(warning);
            reviewed.record.fencing = reason.map(fencing::Reason::as_str);
            reviewed
        }
    }
}

/// What the fencing check made of a Create.
enum Fenced {
    /// Sent under a Lease term that is over: refused, before any collision
    /// check.
    Refused(Box<Reviewed>),
    /// Goes on to the collision guard; `reason` is the check's (`None`: no
    /// token, or the check is off).
    Checked {
        reason: Option<fencing::Reason>,
        warning: Option<String>,
    },
}

/// The fencing check of a pod Create that carries a token. A dry run is
/// answered as the real one would be.
fn fence(app: &App, req: &Request, acts: Acts) -> Fenced {
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
            let record = AuditRecord {
                namespace: req.namespace.clone(),
                name: object_name(req),
                ..Default::default()
            };
            Fenced::Refused(Box::new(super::refused_for_term(
                app, acts, record, reason, status,
            )))
        }
    }
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
        app.metrics.collision_guard.livelock_suspected.inc();
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

/// The collision check: the index, a live read to confirm a hit, the verdict.
async fn collide(app: &App, req: &Request, acts: Acts) -> Reviewed {
    let allowed = |reason: AllowReason, record: AuditRecord| {
        Reviewed::allow(Reason::Allowed(reason).as_str(), record)
    };
    if req.operation != "CREATE" || !req.sub_resource.is_empty() {
        return allowed(AllowReason::NotPodCreate, AuditRecord::default());
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
        ..Default::default()
    };
    if name.is_empty() {
        return allowed(AllowReason::NoName, rec);
    }
    if let Some(warning) = self_test::warning(&name, req.dry_run) {
        let mut reviewed = allowed(AllowReason::SelfTest, rec);
        reviewed.answer.warnings.push(warning);
        return reviewed;
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
                return allowed(AllowReason::KindNotIndexed, rec);
            };
            if idx.index.is_over_cap() {
                return allowed(AllowReason::KindIndexOverCap, rec);
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
        None if watch_current => return allowed(AllowReason::NameFree, rec),
        // A miss of an index whose watch is broken or resuming may be stale:
        // read it (one GET per such Create, only while the watch is down).
        None => match confirmer.confirm_unindexed(&namespace, &name).await {
            collision::Confirmation::Free => return allowed(AllowReason::NameFreeRead, rec),
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
        Verdict::Allow(reason) => return allowed(reason, rec),
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
    rec.reason = Reason::Denied(d.reason).as_str().into();
    rec.mode = Some(mode.as_str());
    rec.code = Some(d.status.code);
    rec.detail = Some(d.status.message.clone());
    rec.grace_left_seconds = d.grace_left_seconds;
    if let collision::Confirmation::Held(p) = &confirmation {
        rec.uid = Some(p.held.uid.clone());
    }
    if acts.yes() {
        app.metrics.collision_guard.quota_charges_prevented.inc();
        if d.status.code == 429 {
            app.metrics
                .collision_guard
                .retry_answers
                .get_or_create(&ModeLabels {
                    mode: mode.as_str(),
                })
                .inc();
        }
    }
    Reviewed {
        answer: Answer {
            allowed: false,
            status: Some(d.status),
            ..Answer::allow()
        },
        record: rec,
    }
}
