//! The audit log: one JSON line on stdout per admission decision.
//!
//! All three endpoints write the same record, so one schema serves every
//! consumer; fields that do not apply to an endpoint are left out. Pod specs
//! and secrets are never logged. The schema: docs/webhook.md, "The audit log".
//!
//! A record is serialized straight into its line (a serde derive, no
//! formatter walking fields per line) and handed to the same bounded,
//! non-blocking writer as the operational logs (see [`crate::logging`]), so
//! lines never interleave and admission never waits on stdout.

use std::io::Write;
use std::sync::OnceLock;

use serde::Serialize;

/// Where records go: the log writer once [`crate::logging::init`] ran.
static SINK: OnceLock<tracing_appender::non_blocking::NonBlocking> = OnceLock::new();

/// Routes records to `writer` (the first call wins).
pub fn set_sink(writer: tracing_appender::non_blocking::NonBlocking) {
    let _ = SINK.set(writer);
}

/// One audit record. `endpoint`, `decision` and `reason` are always set;
/// fields that are `None` are left out of the line.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AuditRecord {
    /// `admission` for a decision, `livelock_suspected` when a looping client is named.
    pub event: &'static str,
    pub endpoint: &'static str,
    /// `allow` or `deny`.
    pub decision: &'static str,
    pub reason: String,
    pub namespace: String,
    pub name: String,
    /// The kind, `resource[.group]`, when it is not pods (collision guard).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    pub user: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups: Option<String>,
    pub dry_run: bool,
    pub latency_us: u64,
    /// The AdmissionReview request uid, to join with the apiserver's audit log.
    pub request_uid: String,
    /// Who sent the review, as the connection shows it: `user` is only what
    /// the review says. `peer` is the client's address; `peer_authenticated`
    /// is `client_certificate` (mutual TLS verified it; `peer_name` is its
    /// name), `trusted_address` (`--trusted-peers`) or `no` (anyone who can
    /// reach the port could have sent it: see docs/security.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_authenticated: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_name: Option<String>,
    /// Denials: the mode and the HTTP code answered, and the message sent
    /// (`detail`: tracing's own `message` field is the event text, "audit").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_left_seconds: Option<i64>,
    /// A Create carrying a fencing token: what its check said
    /// (`fencing_token_current`, `fencing_token_superseded`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing: Option<&'static str>,
    /// Tagger and deletion audit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disruption_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patched: Option<bool>,
    /// Deletion audit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_period_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub already_terminating: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Deletion audit: the `resourceVersion` of the pod the review showed.
    /// The API server reviews a DELETE again when its write meets a newer
    /// version of the pod, so one deletion can have several records not
    /// yet terminating; only the newest version's can have begun it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Livelock records: denials counted in the window, and its length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub denials_in_window: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_seconds: Option<u64>,
    /// Follow-up tagging: what asked for it, and the reads/patches it took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
}

/// The line around a record: the keys every graceguard log line has.
#[derive(Serialize)]
struct Line<'a> {
    timestamp: String,
    level: &'static str,
    #[serde(flatten)]
    record: &'a AuditRecord,
    message: &'static str,
    target: &'static str,
}

impl AuditRecord {
    /// Writes the record as one JSON line. Never blocks: when the writer's
    /// buffer is full the line is dropped and counted.
    pub fn emit(&self) {
        let line = Line {
            timestamp: k8s_openapi::jiff::Timestamp::now().to_string(),
            level: "INFO",
            record: self,
            message: "audit",
            target: "graceguard::audit",
        };
        let mut buf = Vec::with_capacity(512);
        if serde_json::to_writer(&mut buf, &line).is_err() {
            // Strings and numbers only: cannot fail; never panic over a log line.
            return;
        }
        buf.push(b'\n');
        match SINK.get() {
            Some(w) => {
                let _ = w.clone().write_all(&buf);
            }
            None => {
                let _ = std::io::stdout().lock().write_all(&buf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_one_json_object_without_its_empty_fields() {
        let rec = AuditRecord {
            event: "admission",
            endpoint: "collision_guard",
            decision: "deny",
            reason: "terminating".into(),
            namespace: "team-a".into(),
            name: "train-0".into(),
            code: Some(409),
            ..Default::default()
        };
        let line = Line {
            timestamp: "2026-11-30T00:00:00Z".into(),
            level: "INFO",
            record: &rec,
            message: "audit",
            target: "graceguard::audit",
        };
        let v: serde_json::Value = serde_json::to_value(&line).expect("serializes");
        assert_eq!(v["target"], "graceguard::audit");
        assert_eq!(v["decision"], "deny");
        assert_eq!(v["code"], 409);
        assert!(v.get("uid").is_none(), "None fields are left out: {v}");
        assert_eq!(v["dry_run"], false);
    }
}
