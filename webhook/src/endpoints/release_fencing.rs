//! `POST /validate/pods-release`: the fencing check of the guard's
//! result-finalizer releases. A pod update that sets or changes
//! [`graceguard_contract::fencing::RELEASED_UNDER`] is refused when the term
//! it was sent under is over ([`crate::fencing`]). Any other update (an
//! operator's, a later write) is allowed unchecked; the API server's
//! matchConditions send only releases here.

use std::collections::BTreeSet;

use super::{Acts, Reviewed};
use crate::app::App;
use crate::audit::AuditRecord;
use crate::fencing::{self, Check};
use crate::review::{self, Answer, Request};

/// Why the release check answered as it did (the audit record's `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// `--fencing=false`: nothing checked.
    FencingOff,
    NotARelease,
    /// The fencing check's reason, allowed or refused.
    Checked(fencing::Reason),
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::FencingOff => "fencing_off",
            Reason::NotARelease => "not_a_release",
            Reason::Checked(r) => r.as_str(),
        }
    }

    /// Every reason this endpoint can give.
    pub fn all() -> BTreeSet<String> {
        [Reason::FencingOff, Reason::NotARelease]
            .into_iter()
            .chain(fencing::Reason::ALL.map(Reason::Checked))
            .map(|r| r.as_str().to_string())
            .collect()
    }
}

pub fn review(app: &App, req: &Request, acts: Acts) -> Reviewed {
    use graceguard_contract::fencing::RELEASED_UNDER;
    let annotation = |pod: Option<&review::Pod>| {
        pod.and_then(|p| p.metadata.annotations.as_ref())
            .and_then(|a| a.get(RELEASED_UNDER))
            .cloned()
    };
    let record = AuditRecord {
        namespace: req.namespace.clone(),
        name: req.name.clone(),
        ..Default::default()
    };
    let token = annotation(req.object.as_ref());
    let sets_it = req.is_pods("UPDATE", "")
        && token.is_some()
        && token != annotation(req.old_object.as_ref());
    let (Some(terms), Some(token), true) = (&app.leases, token, sets_it) else {
        let reason = match app.leases {
            None => Reason::FencingOff,
            Some(_) => Reason::NotARelease,
        };
        return Reviewed::allow(reason.as_str(), record);
    };
    match terms.check(&token) {
        Check::Allow { reason, warning } => {
            let mut reviewed = Reviewed::allow(Reason::Checked(reason).as_str(), record);
            reviewed.record.fencing = Some(reason.as_str());
            reviewed.answer = Answer {
                warnings: warning.into_iter().collect(),
                ..Answer::allow()
            };
            reviewed
        }
        Check::Refuse { reason, status } => {
            super::refused_for_term(app, acts, record, reason, status)
        }
    }
}
