//! `POST /validate/pods-delete`: the deletion audit. One record per pod
//! DELETE saying who deleted what, with which grace period, and whether a
//! `DisruptionTarget` condition explains it. It always allows; a disrupted
//! pod's deletion is where the tag a running pod could not get in its
//! status update is asked for.

use std::collections::BTreeSet;

use super::{Acts, Reviewed};
use crate::app::App;
use crate::audit::AuditRecord;
use crate::disruption;
use crate::follow_up::Source;
use crate::metrics::ExplainedLabels;
use crate::review::Request;
use crate::tagger;

/// Why the deletion audit recorded what it did (the audit record's `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    NotAPodDelete,
    /// A `DisruptionTarget` condition explains the deletion.
    Disruption,
    Unexplained,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotAPodDelete => "not_a_pod_delete",
            Reason::Disruption => "disruption",
            Reason::Unexplained => "unexplained",
        }
    }

    /// Every reason this endpoint can give.
    pub fn all() -> BTreeSet<String> {
        [
            Reason::NotAPodDelete,
            Reason::Disruption,
            Reason::Unexplained,
        ]
        .map(|r| r.as_str().to_string())
        .into()
    }
}

pub fn review(app: &App, req: &Request, acts: Acts) -> Reviewed {
    if !req.is_pods("DELETE", "") {
        return Reviewed::allow(Reason::NotAPodDelete.as_str(), AuditRecord::default());
    }
    let record = record(req);
    // The deletion a disruption announced has begun: now its pod may be
    // tagged (`tagger::may_tag_now`). Asked here too, not only by the status
    // update that carried the condition, so a deletion that comes later than
    // that follow-up's attempts, or after a restart, is still tagged.
    let explained = record.disruption_reason.is_some();
    if explained && record.already_terminating == Some(false) && acts.yes() {
        let untagged = req.old_object.as_ref().is_some_and(|pod| {
            disruption::of_pod(pod).is_some_and(|d| tagger::patch_for(&pod.metadata, &d).is_some())
        });
        if untagged {
            app.follow_up.request(
                &req.namespace,
                &req.name,
                record.uid.as_deref(),
                Source::Deletion,
            );
        }
    }
    if acts.counted() {
        let explained = if explained { "yes" } else { "no" };
        app.metrics
            .audits
            .deletions_audited
            .get_or_create(&ExplainedLabels { explained })
            .inc();
    }
    Reviewed {
        answer: crate::review::Answer::allow(),
        record,
    }
}

/// The grace period the API server will use for a pod DELETE (its pod
/// strategy and the generic store's rules):
/// * a deletion already in progress (`in_progress`: its grace) can only be
///   shortened, by a request asking for less;
/// * otherwise the request's grace, else the pod's
///   `terminationGracePeriodSeconds`, except that a pod never scheduled to a
///   node, or one that already ended, is deleted at once (0).
pub fn effective_grace(
    requested: Option<i64>,
    spec: Option<i64>,
    node_name: Option<&str>,
    phase: Option<&str>,
    in_progress: Option<i64>,
) -> i64 {
    if let Some(existing) = in_progress {
        return match requested {
            Some(r) if r < existing => r,
            _ => existing,
        };
    }
    let unscheduled = node_name.is_none_or(str::is_empty);
    let ended = matches!(phase, Some("Succeeded" | "Failed"));
    if unscheduled || ended {
        0
    } else {
        requested.or(spec).unwrap_or(0)
    }
}

/// The audit record's deletion-specific fields for `req` (a pods DELETE).
pub fn record(req: &Request) -> AuditRecord {
    let old = req.old_object.as_ref();
    let meta = old.map(|o| &o.metadata);
    let spec = old.and_then(|o| o.spec.as_ref());
    let grace = effective_grace(
        req.grace_period_seconds,
        spec.and_then(|s| s.termination_grace_period_seconds),
        spec.and_then(|s| s.node_name.as_deref()),
        old.and_then(|o| o.status.as_ref()?.phase.as_deref()),
        meta.and_then(|m| {
            m.deletion_timestamp
                .as_ref()
                .map(|_| m.deletion_grace_period_seconds.unwrap_or(0))
        }),
    );
    let disruption = old.and_then(disruption::of_pod);
    AuditRecord {
        reason: if disruption.is_some() {
            Reason::Disruption
        } else {
            Reason::Unexplained
        }
        .as_str()
        .into(),
        uid: meta.and_then(|m| m.uid.clone()),
        grace_period_seconds: Some(grace),
        already_terminating: Some(meta.is_some_and(|m| m.deletion_timestamp.is_some())),
        disruption_reason: disruption.map(|d| d.reason),
        phase: old.and_then(|o| o.status.as_ref()?.phase.clone()),
        resource_version: meta.and_then(|m| m.resource_version.clone()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::effective_grace;

    #[test]
    fn the_api_server_s_grace_rules() {
        let running = (Some("node-1"), Some("Running"));
        // (requested, spec, node, phase, in progress) -> grace
        let cases = [
            (
                "request wins",
                Some(45),
                Some(30),
                running.0,
                running.1,
                None,
                45,
            ),
            (
                "else the pod's",
                None,
                Some(30),
                running.0,
                running.1,
                None,
                30,
            ),
            (
                "unscheduled: at once",
                Some(45),
                Some(30),
                None,
                Some("Pending"),
                None,
                0,
            ),
            (
                "empty node name: at once",
                None,
                Some(30),
                Some(""),
                Some("Pending"),
                None,
                0,
            ),
            (
                "succeeded: at once",
                Some(45),
                Some(30),
                running.0,
                Some("Succeeded"),
                None,
                0,
            ),
            (
                "failed: at once",
                None,
                Some(30),
                running.0,
                Some("Failed"),
                None,
                0,
            ),
            (
                "in progress, shorter request",
                Some(10),
                Some(30),
                running.0,
                running.1,
                Some(30),
                10,
            ),
            (
                "in progress, longer request",
                Some(60),
                Some(30),
                running.0,
                running.1,
                Some(30),
                30,
            ),
            (
                "in progress, no request",
                None,
                Some(90),
                running.0,
                running.1,
                Some(45),
                45,
            ),
        ];
        for (what, req, spec, node, phase, in_progress, want) in cases {
            assert_eq!(
                effective_grace(req, spec, node, phase, in_progress),
                want,
                "{what}"
            );
        }
    }
}
