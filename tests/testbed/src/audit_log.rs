//! Reading the apiserver's audit log, to count what clients really sent.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Deserialize;

/// One `ResponseComplete` audit event, reduced to what tests count by.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub stage: String,
    pub verb: String,
    #[serde(default)]
    pub object_ref: Option<ObjectRef>,
    pub user: AuditUser,
    #[serde(default)]
    pub response_status: Option<ResponseStatus>,
    #[serde(default)]
    pub user_agent: Option<String>,
    /// RFC 3339 with microseconds.
    #[serde(default)]
    pub request_received_timestamp: String,
    #[serde(default)]
    pub stage_timestamp: String,
    /// The authorizer's decision and reason (`authorization.k8s.io/...`), and others.
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub subresource: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct AuditUser {
    pub username: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ResponseStatus {
    #[serde(default)]
    pub code: u16,
    #[serde(default)]
    pub message: String,
}

impl AuditEvent {
    /// True when this is a `verb` on `resource` (no subresource) in `namespace`.
    pub fn is(&self, verb: &str, resource: &str, namespace: &str) -> bool {
        self.is_on(verb, resource, "", namespace)
    }

    /// [`Self::is`] for a subresource (`""`: the object itself).
    pub fn is_on(&self, verb: &str, resource: &str, subresource: &str, namespace: &str) -> bool {
        self.verb == verb
            && self.object_ref.as_ref().is_some_and(|o| {
                o.resource == resource && o.namespace == namespace && o.subresource == subresource
            })
    }

    /// When the API server received the request (unix microseconds).
    pub fn received_us(&self) -> Option<i64> {
        micros(&self.request_received_timestamp)
    }

    /// When the API server completed it (unix microseconds).
    pub fn completed_us(&self) -> Option<i64> {
        micros(&self.stage_timestamp)
    }

    pub fn name(&self) -> &str {
        self.object_ref
            .as_ref()
            .map(|o| o.name.as_str())
            .unwrap_or("")
    }
}

/// The audit log file of a [`crate::TestBed`] started with `audit: true`.
pub struct AuditLog {
    path: PathBuf,
}

impl AuditLog {
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    /// Every completed request so far.
    pub fn events(&self) -> Result<Vec<AuditEvent>> {
        self.events_at("ResponseComplete")
    }

    /// Every request that reached `stage` so far: `ResponseStarted` also
    /// lists long-running requests (watches) that have not ended.
    pub fn events_at(&self, stage: &str) -> Result<Vec<AuditEvent>> {
        let text = std::fs::read_to_string(&self.path)
            .with_context(|| format!("reading {}", self.path.display()))?;
        // The API server may be writing a line as we read: only lines it
        // has ended with a newline are whole.
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        let mut out = Vec::new();
        for line in whole.lines().filter(|l| !l.trim().is_empty()) {
            let ev: AuditEvent = serde_json::from_str(line).with_context(|| {
                format!("parsing an audit line of {}: {line}", self.path.display())
            })?;
            if ev.stage == stage {
                out.push(ev);
            }
        }
        Ok(out)
    }

    /// Completed requests written from byte `offset` on, and the offset
    /// after the last whole line: a long run reads only what is new.
    pub fn events_from(&self, offset: u64) -> Result<(Vec<AuditEvent>, u64)> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        f.seek(SeekFrom::Start(offset))?;
        let mut text = String::new();
        f.read_to_string(&mut text)
            .with_context(|| format!("reading {}", self.path.display()))?;
        let whole = text.rfind('\n').map_or("", |end| &text[..=end]);
        let mut out = Vec::new();
        for line in whole.lines().filter(|l| !l.trim().is_empty()) {
            let ev: AuditEvent = serde_json::from_str(line).with_context(|| {
                format!("parsing an audit line of {}: {line}", self.path.display())
            })?;
            if ev.stage == "ResponseComplete" {
                out.push(ev);
            }
        }
        Ok((out, offset + whole.len() as u64))
    }

    /// How many completed requests match `pred`.
    pub fn count(&self, pred: impl Fn(&AuditEvent) -> bool) -> Result<usize> {
        Ok(self.events()?.iter().filter(|e| pred(e)).count())
    }
}

fn micros(ts: &str) -> Option<i64> {
    let t: k8s_openapi::jiff::Timestamp = ts.parse().ok()?;
    Some(t.as_microsecond())
}
