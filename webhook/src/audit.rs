//! The audit log: one JSON line on stdout per admission decision.
//!
//! All three endpoints write the same record, so one schema serves every
//! consumer; fields that do not apply to an endpoint are left out. Pod specs
//! and secrets are never logged. See the README for the schema.

/// One audit record. `endpoint`, `decision` and `reason` are always set.
#[derive(Clone, Debug, Default)]
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
    pub resource: Option<String>,
    pub uid: Option<String>,
    pub user: String,
    pub groups: Option<String>,
    pub dry_run: bool,
    pub latency_us: u64,
    /// The AdmissionReview request uid, to join with the apiserver's audit log.
    pub request_uid: String,
    /// Denials: the mode and the HTTP code answered, and the message sent
    /// (`detail`: tracing's own `message` field is the event text, "audit").
    pub mode: Option<&'static str>,
    pub code: Option<u16>,
    pub detail: Option<String>,
    pub grace_left_seconds: Option<i64>,
    /// Tagger and deletion audit.
    pub disruption_reason: Option<String>,
    pub patched: Option<bool>,
    /// Deletion audit.
    pub grace_period_seconds: Option<i64>,
    pub already_terminating: Option<bool>,
    pub phase: Option<String>,
    /// Livelock records: denials counted in the window, and its length.
    pub denials_in_window: Option<u64>,
    pub window_seconds: Option<u64>,
    /// Follow-up tagging: what asked for it, and the reads/patches it took.
    pub source: Option<&'static str>,
    pub attempts: Option<u32>,
}

impl AuditRecord {
    /// Writes the record as one JSON line (through the JSON tracing subscriber).
    pub fn emit(&self) {
        tracing::info!(
            target: "graceguard::audit",
            event = self.event,
            endpoint = self.endpoint,
            decision = self.decision,
            reason = %self.reason,
            namespace = %self.namespace,
            name = %self.name,
            resource = self.resource.as_deref(),
            uid = self.uid.as_deref(),
            user = %self.user,
            groups = self.groups.as_deref(),
            dry_run = self.dry_run,
            latency_us = self.latency_us,
            request_uid = %self.request_uid,
            mode = self.mode,
            code = self.code,
            detail = self.detail.as_deref(),
            grace_left_seconds = self.grace_left_seconds,
            disruption_reason = self.disruption_reason.as_deref(),
            patched = self.patched,
            grace_period_seconds = self.grace_period_seconds,
            already_terminating = self.already_terminating,
            phase = self.phase.as_deref(),
            denials_in_window = self.denials_in_window,
            window_seconds = self.window_seconds,
            source = self.source,
            attempts = self.attempts,
            "audit"
        );
    }
}
