//! The deletion audit: one record per pod DELETE saying who deleted what,
//! with which grace period, and whether a `DisruptionTarget` condition explains
//! it. It always allows.

use kube::core::admission::AdmissionRequest;
use kube::core::DynamicObject;
use serde_json::Value;

use crate::audit::AuditRecord;
use crate::disruption;

/// The audit record's deletion-specific fields for `req` (a pods DELETE).
pub fn record(req: &AdmissionRequest<DynamicObject>) -> AuditRecord {
    let old = req.old_object.as_ref();
    let meta = old.map(|o| &o.metadata);
    let body = old.map(|o| &o.data);
    let option_grace = req
        .options
        .as_ref()
        .and_then(|o| o.0.get("gracePeriodSeconds"))
        .and_then(Value::as_i64);
    // What the API server will use: the request's, else the deletion already
    // in progress, else the pod's spec.
    let grace = option_grace
        .or_else(|| meta.and_then(|m| m.deletion_grace_period_seconds))
        .or_else(|| {
            body.and_then(|b| b.pointer("/spec/terminationGracePeriodSeconds"))
                .and_then(Value::as_i64)
        });
    let disruption = body.and_then(disruption::of_pod);
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
        phase: body
            .and_then(|b| b.pointer("/status/phase"))
            .and_then(Value::as_str)
            .map(str::to_string),
        ..Default::default()
    }
}
