//! `POST /validate/pods-eviction`: the eviction audit. Evictions delete
//! through the registry, past every DELETE webhook, and write their
//! `DisruptionTarget` outside admission: the `pods/eviction` request is the
//! one place to see them. It runs before the PodDisruptionBudget check, so
//! this records the attempt (one record per request) and
//! [`crate::eviction_outcome`] records what became of it, and asks for the
//! follow-up tag only when the pod was evicted.

use std::collections::BTreeSet;
use std::time::Instant;

use super::{Acts, Reviewed};
use crate::app::App;
use crate::audit::AuditRecord;
use crate::eviction_outcome::Attempt;
use crate::review::Request;

/// Why the eviction audit recorded what it did (the audit record's `reason`;
/// the outcomes are [`crate::eviction_outcome`]'s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    NotAnEviction,
    EvictionAttempt,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotAnEviction => "not_an_eviction",
            Reason::EvictionAttempt => "eviction_attempt",
        }
    }

    /// Every reason this endpoint can give.
    pub fn all() -> BTreeSet<String> {
        [Reason::NotAnEviction, Reason::EvictionAttempt]
            .map(|r| r.as_str().to_string())
            .into()
    }
}

pub fn review(app: &App, req: &Request, acts: Acts) -> Reviewed {
    if !req.is_pods("CREATE", "eviction") {
        return Reviewed::allow(Reason::NotAnEviction.as_str(), AuditRecord::default());
    }
    if acts.counted() {
        app.metrics.audits.evictions_audited.inc();
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
    let record = AuditRecord {
        uid,
        grace_period_seconds: req.grace_period_seconds,
        already_terminating,
        disruption_reason: Some("EvictionByEvictionAPI".into()),
        ..Default::default()
    };
    Reviewed::allow(Reason::EvictionAttempt.as_str(), record)
}
