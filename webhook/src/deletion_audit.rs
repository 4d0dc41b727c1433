//! The deletion audit: one record per pod DELETE saying who deleted what,
//! with which grace period, and whether a `DisruptionTarget` condition explains
//! it. It always allows.

use crate::audit::AuditRecord;
use crate::disruption;
use crate::review::Request;

/// The audit record's deletion-specific fields for `req` (a pods DELETE).
pub fn record(req: &Request) -> AuditRecord {
    let old = req.old_object.as_ref();
    let meta = old.map(|o| &o.metadata);
    // What the API server will use: the request's, else the deletion already
    // in progress, else the pod's spec.
    let grace = req
        .grace_period_seconds
        .or_else(|| meta.and_then(|m| m.deletion_grace_period_seconds))
        .or_else(|| old.and_then(|o| o.spec.as_ref()?.termination_grace_period_seconds));
    let disruption = old.and_then(disruption::of_pod);
    AuditRecord {
        reason: if disruption.is_some() {
            "disruption"
        } else {
            "unexplained"
        }
        .into(),
        uid: meta.and_then(|m| m.uid.clone()),
        grace_period_seconds: grace,
        already_terminating: Some(meta.is_some_and(|m| m.deletion_timestamp.is_some())),
        disruption_reason: disruption.map(|d| d.reason),
        phase: old.and_then(|o| o.status.as_ref()?.phase.clone()),
        ..Default::default()
    }
}
