//! The policy of each admission endpoint, one module each: what it decides
//! for one review and why ([`Reviewed`], with the endpoint's typed `Reason`).
//! [`crate::handlers`] is the shell around them: it parses, times, audits
//! and answers, and decides nothing.

pub mod collision_guard;
pub mod deletion_audit;
pub mod disruption_tagger;
pub mod eviction_audit;
pub mod release_fencing;

use crate::app::App;
use crate::audit::AuditRecord;
use crate::fencing;
use crate::review::{Answer, Request};

/// What an endpoint made of one review: the answer, and the audit record
/// with its reason (the shell adds who sent it, when, and how long it took).
pub struct Reviewed {
    pub answer: Answer,
    pub record: AuditRecord,
}

impl Reviewed {
    /// Allowed, for `reason`, with `record`'s other fields.
    fn allow(reason: &'static str, record: AuditRecord) -> Self {
        Self {
            answer: Answer::allow(),
            record: AuditRecord {
                reason: reason.into(),
                ..record
            },
        }
    }
}

/// Whether a review may change graceguard's state (the eviction attempts,
/// denial streaks, follow-ups, counters), and if not, why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acts {
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
}

/// A write refused because the Lease term it was sent under is over (the
/// collision guard's fencing check, the release check): counted (dry runs
/// too; never a review graceguard knows the API server did not send),
/// recorded and answered.
fn refused_for_term(
    app: &App,
    acts: Acts,
    mut record: AuditRecord,
    reason: fencing::Reason,
    status: Box<kube::core::Status>,
) -> Reviewed {
    if acts != Acts::Unauthenticated {
        app.metrics.collision_guard.fenced_writes_refused.inc();
    }
    record.reason = reason.as_str().into();
    record.fencing = Some(reason.as_str());
    record.code = Some(status.code);
    record.detail = Some(status.message.clone());
    Reviewed {
        answer: Answer {
            allowed: false,
            status: Some(*status),
            ..Answer::allow()
        },
        record,
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// docs/webhook.md's table of audit reasons, one row per endpoint: the
    /// reasons it names in backquotes.
    fn documented() -> Vec<(String, BTreeSet<String>)> {
        let doc = include_str!("../../../docs/webhook.md");
        let start = doc
            .find("<!-- audit-reasons -->")
            .expect("docs/webhook.md has an <!-- audit-reasons --> table");
        doc[start..]
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .filter_map(|row| {
                let cells: Vec<&str> = row.split('|').map(str::trim).collect();
                let endpoint = cells.get(1)?.trim_matches('`').to_string();
                let reasons = cells
                    .get(2)?
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_string)
                    .collect();
                Some((endpoint, reasons))
            })
            .collect()
    }

    #[test]
    fn every_reason_an_endpoint_gives_is_in_the_docs_table_and_no_other() {
        let code: Vec<(&str, BTreeSet<String>)> = vec![
            ("collision_guard", super::collision_guard::Reason::all()),
            ("disruption_tagger", super::disruption_tagger::Reason::all()),
            ("deletion_audit", super::deletion_audit::Reason::all()),
            ("eviction_audit", super::eviction_audit::Reason::all()),
            ("release_fencing", super::release_fencing::Reason::all()),
        ];
        let docs = documented();
        assert_eq!(
            docs.iter().map(|(e, _)| e.as_str()).collect::<Vec<_>>(),
            code.iter().map(|(e, _)| *e).collect::<Vec<_>>(),
            "docs/webhook.md's audit-reasons table has one row per endpoint, in this order"
        );
        for ((endpoint, in_code), (_, in_docs)) in code.iter().zip(&docs) {
            let undocumented: Vec<_> = in_code.difference(in_docs).collect();
            let stale: Vec<_> = in_docs.difference(in_code).collect();
            assert!(
                undocumented.is_empty() && stale.is_empty(),
                "{endpoint}: reasons the code gives but docs/webhook.md does not list: {undocumented:?}; listed but never given: {stale:?}"
            );
        }
    }
}
